// The execution plan of a graph: its steps (exec/plan_step.h) over buffer slots released at
// their last use, built once (plan_build.cpp, plan_in_place.cpp) and run many times (plan_run.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "fuser/fuse.h"
#include "jit/ir.h"
#include "kiln/tensor.h"
#include "lib/distributed/collective_op.h"
#include "lib/op_table.h"

namespace kiln::jit {

class FusedGraphDump;
struct PlanStep;
struct PlanArena;
struct ArenaValue;

// A compiled schedule for one graph: the order of steps and, for each value, the step after which
// nothing reads it any more (its slot is then released for reuse by the allocator).
//
// Elementwise nodes whose operands already have the op's compute type (constants are converted
// once, here) run their formula straight into their output (OpDef::map_into), skipping the public
// entry's validation, conversion and autograd: the graph's types were checked when it was built.
// Small values that only such steps read live in a per-plan arena, laid out by the same liveness
// slots and reused by every run, so a replay of small tensors allocates only what it returns.
//
// In-place outputs: `in_place_inputs` gives, per graph output, the graph input whose buffer it may
// be computed in (a trace's write-back into a captured tensor: an optimizer's parameter and
// state), or -1. The plan takes it when the output comes from a kernel or direct step (through
// views) after which nothing reads the input's old value and no step may raise on the values it
// reads (OpDef::checks_integer_values: an index out of range) or runs a collective (a peer may be
// gone), so a failed run leaves the input as it was; and from its second run on (the first compiles
// the kernels). Each run checks the layouts again: the step must read every alias of the input at
// the element it writes. The output is then a view of the input.
//
// Collectives (lib/distributed/collective_op.h) run asynchronously: a collective's step starts it,
// and the first step that reads its result waits for it first (the end of the run waits for any
// whose result no step reads), so communication overlaps the steps in between, as eager DDP's
// bucket reductions overlap the rest of the backward. A collective fails where it is waited for,
// so such a wait counts as a step that may fail for the in-place outputs above.
class Plan {
 public:
  explicit Plan(const Graph& graph, const std::vector<int64_t>& in_place_inputs = {});
  ~Plan();
  // Binds graph inputs to `inputs` (in order) and runs every step; returns the graph outputs.
  // Safe to call from several threads at once (a run that finds the arena in use makes its own).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;
  size_t num_steps() const;
  // Graph nodes the steps run (a fused group's step runs all of its nodes).
  size_t num_nodes() const;
  size_t num_slots() const { return num_slots_; }
  // Steps that run an elementwise formula straight into their output, and the bytes of the arena.
  size_t num_direct_steps() const;
  size_t arena_bytes() const { return arena_bytes_; }
  // Steps that run a fused group's compiled kernel, and those among them that end in a cat or
  // stack.
  size_t num_kernel_steps() const;
  size_t num_join_kernel_steps() const;
  // Outputs that may be computed in their graph input's buffer (see above).
  size_t num_in_place_outputs() const;

 private:
  friend class PlanBuilder;
  // The graph outputs from a finished run's slots.
  std::vector<Tensor> results(const std::vector<Tensor>& slots) const;
  // Sets the step that waits for each collective step's result.
  void plan_collectives();
  // Picks in-place outputs among the steps (see the class comment); logs why not under fuser.
  void plan_in_place(const Graph& graph, const std::vector<int64_t>& in_place_inputs);

  std::vector<fuser::FusionGroup> groups_;
  int64_t graph_ = -1;  // the graph's number (jit/dump.h), which its steps' profile records carry
  std::vector<PlanStep> steps_;  // exec/plan_step.h
  std::vector<int64_t> input_slots_;
  std::vector<int64_t> output_slots_;
  std::vector<std::pair<int64_t, Tensor>> constants_;  // (slot, value), bound before the steps
  absl::flat_hash_set<const void*> constant_storages_;
  size_t num_slots_ = 0;
  std::vector<ArenaValue> arena_values_;
  size_t arena_bytes_ = 0;
  mutable std::unique_ptr<PlanArena> arena_;  // made by the first run
  mutable std::atomic<bool> arena_busy_{false};
  // Set after the first run that finished: its kernels are compiled, so in-place writes may start.
  mutable std::atomic<bool> warm_{false};
  // KILN_DUMP: the graph with its groups, rewritten as their kernels compile; null when off.
  std::unique_ptr<FusedGraphDump> dump_;
};

// Bytes held now by every plan's arenas.
int64_t plan_arena_bytes();
// Steps run by every plan so far: fused kernels, and other steps that compute (not views).
struct PlanRunCounts {
  int64_t fused_kernels = 0;
  int64_t unfused_steps = 0;
  int64_t in_place_writes = 0;
};
PlanRunCounts plan_run_counts();

// Plan(graph).run(inputs).
std::vector<Tensor> run_graph(const Graph& graph, const std::vector<Tensor>& inputs);

// Runs one node's reference kernel on concrete inputs, with recording and autograd off.
std::vector<Tensor> invoke_node(const Node& node, const std::vector<Tensor>& inputs);

}  // namespace kiln::jit
