// The steps of a Plan: one struct per kind of step, a std::variant over them, the arena of small
// values, and the interface through which a fused kernel step reaches its device's kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "fuser/fuse.h"
#include "jit/ir.h"
#include "kiln/tensor.h"
#include "lib/distributed/collective_op.h"
#include "lib/op_table.h"

namespace kiln::detail {
struct Storage;
}  // namespace kiln::detail

namespace kiln::jit {

class FusedGraphDump;

// One launch of a fused group's kernel: its layout says whether it is flat, strided or rows.
struct KernelCall {
  const fuser::FusionGroup& group;
  const fuser::Layout& layout;
  int64_t n;               // the elements it computes (rows: rows times the row length)
  const int64_t* sizes;    // strided: the group's shape; rows: the outer sizes, then the row length
  const int64_t* strides;  // strided and rows: per pointer (see fuser::KernelFn)
  char* const* ptrs;       // the inputs' first elements, then the outputs'
};

// A fused group's kernels on one device, found by layout (compiled or loaded on its first use)
// and launched, so that running a kernel step is the same on every device.
class KernelDevice {
 public:
  virtual ~KernelDevice() = default;
  // Runs `call` (compiling or loading its kernel first when it is new); returns the kernel's
  // symbol, for the profiler.
  virtual const char* launch(const KernelCall& call) const = 0;
};

// The CPU's kernels of `group` (group number `index` of the plan, for the KILN_DUMP graph).
std::unique_ptr<KernelDevice> cpu_kernels(const fuser::FusionGroup& group, size_t index,
                                          FusedGraphDump* dump);
// The kernels of `group` on CUDA device `device` (without the toolkit, launching one raises);
// index and dump as for the CPU's.
std::unique_ptr<KernelDevice> cuda_kernels(const fuser::FusionGroup& group, int device,
                                           size_t index, FusedGraphDump* dump);

// Outputs a step allocates itself (direct and kernel steps), per output: its value in the plan's
// arena, or -1; and the graph input whose buffer it may be computed in, or -1
// (Plan::plan_in_place).
struct OwnOutputs {
  std::vector<int64_t> arena;
  std::vector<int64_t> in_place;
};

// A node run through its op's public entry (a library call such as a GEMM, a view, a node no
// fused kernel computes). `through_host`: on a CUDA device that no kernel of the device computes
// unfused, run on copies on the host.
struct InvokeStep {
  bool through_host = false;
};

// An elementwise node whose operands already have the op's compute type, run straight into its
// output (OpDef::map_into).
struct DirectStep {
  detail::MapInto map_into;
  OwnOutputs own;
};

// A fusion group, run as one compiled kernel on its device.
struct KernelStep {
  const fuser::FusionGroup* group;
  size_t index;                             // the group's number in the plan
  std::vector<fuser::Level> output_levels;  // rows groups: where each output varies
  std::unique_ptr<KernelDevice> kernels;
  OwnOutputs own;
};

// A collective (lib/distributed/collective_op.h), started by the step and waited for by the
// first step that reads its result.
struct CollectiveStep {
  detail::StartCollective start;
};

using StepKind = std::variant<InvokeStep, DirectStep, KernelStep, CollectiveStep>;

struct PlanStep {
  const Node* node;              // the node it runs (a fusion group's anchor)
  std::vector<int64_t> inputs;   // slot per input, -1 for an absent optional input
  std::vector<int64_t> outputs;  // slot per output
  std::vector<int64_t> release;  // slots whose last reader is this step
  std::vector<size_t> wait_for;  // collectives (their steps) to finish before it
  int cuda_device = -1;          // the CUDA device it computes on, or -1 (CPU)
  StepKind kind;

  const fuser::FusionGroup* group() const {
    const KernelStep* k = std::get_if<KernelStep>(&kind);
    return k ? k->group : nullptr;
  }
  bool direct() const { return std::holds_alternative<DirectStep>(kind); }
  // Null for steps whose outputs their op allocates.
  const OwnOutputs* own() const {
    if (const KernelStep* k = std::get_if<KernelStep>(&kind)) return &k->own;
    if (const DirectStep* d = std::get_if<DirectStep>(&kind)) return &d->own;
    return nullptr;
  }
  OwnOutputs* own() { return const_cast<OwnOutputs*>(static_cast<const PlanStep*>(this)->own()); }
};

// A value of at most kArenaValueMaxBytes that only direct and kernel steps read, in its slot's
// region of the arena.
struct ArenaValue {
  int64_t slot;
  size_t byte_offset;
  const ValueType* type;
};

// The arena's storage and a tensor over each arena value's region of it.
struct PlanArena {
  std::shared_ptr<detail::Storage> storage;
  std::vector<Tensor> values;
};
std::unique_ptr<PlanArena> make_arena(const std::vector<ArenaValue>& values, size_t bytes);

}  // namespace kiln::jit
