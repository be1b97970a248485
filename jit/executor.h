// Runs a Graph: each node through its op's reference kernel (the fused kernels of #5 replace
// groups of them), over buffer slots released at their last use.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "jit/ir.h"
#include "kiln/tensor.h"

namespace kiln::jit {

// A compiled schedule for one graph: the order of steps and, for each value, the step after which
// nothing reads it any more (its slot is then released for reuse by the allocator).
class Plan {
 public:
  explicit Plan(const Graph& graph);
  // Binds graph inputs to `inputs` (in order) and runs every step; returns the graph outputs.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;
  size_t num_steps() const { return steps_.size(); }
  size_t num_slots() const { return num_slots_; }

 private:
  struct Step {
    const Node* node;
    std::vector<int64_t> inputs;   // slot per input, -1 for an absent optional input
    std::vector<int64_t> outputs;  // slot per output
    std::vector<int64_t> release;  // slots whose last reader is this step
  };
  const Graph& graph_;
  std::vector<Step> steps_;
  std::vector<int64_t> input_slots_;
  std::vector<int64_t> output_slots_;
  std::vector<std::pair<int64_t, Tensor>> constants_;  // (slot, value), bound before the steps
  absl::flat_hash_set<const void*> constant_storages_;
  size_t num_slots_ = 0;
};

// Plan(graph).run(inputs).
std::vector<Tensor> run_graph(const Graph& graph, const std::vector<Tensor>& inputs);

// Runs one node's reference kernel on concrete inputs, with recording and autograd off.
std::vector<Tensor> invoke_node(const Node& node, const std::vector<Tensor>& inputs);

}  // namespace kiln::jit
