// The forward fuser: segments a graph into groups of elementwise nodes and reductions, each run as
// one kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "fuser/kernel.h"
#include "jit/ir.h"

namespace kiln::fuser {

// The type an elementwise node computes in when its operands are the node's own (see
// compute_type in lib/elementwise.h), or nullopt when it can't run straight into its output
// (OpDef::map_into, the executor's direct steps): no map_into, off the CPU, or an operand that
// needs a conversion at run time. Constants of another type are allowed (`convert` marks them;
// the caller converts them once).
std::optional<DType> elementwise_compute_type(const jit::Node& n, std::vector<bool>& convert);

// Whether `n` can join a fusion group: a unary, binary or ternary (where) op with a formula, on
// the CPU. Unlike direct steps, a kernel converts operands of other types itself (int32 * float32,
// a comparison of float32 with float64), as the op's entry point converts them.
bool is_fusible(const jit::Node& n);

// Whether a device computes n by a kernel of its own outside fusion groups: GEMMs through cuBLAS
// (lib/ops/linalg.cpp), cat and stack as copies into their slices by the copy kernel, views as
// views of device memory (a reshape that must copy copies on the device), slice_scatter and
// as_strided_scatter as device copies, index_select, gather and embedding by the gather kernel,
// index_add and scatter_add by the scatter-add kernel (with fusion off: through the host), the conv
// passes and pools by lib/ops/conv_cuda.cpp's kernels. A device runs other unfused nodes through
// the host (other nn ops, argmax and friends never reach it: they record compositions of fusible
// ops).
bool has_device_kernel(const jit::Node& n);

// The trailing dims a reduction folds when it can join a group (all of them for an empty list of
// dims), or nullopt: another op, other dims, off the CPU, or a conversion first (sum's dtype).
std::optional<int> fused_reduction_dims(const jit::Node& n);

// Whether n is a reduction over leading dims that a group can end in (a column exit): a reduction
// whose formula folds once (sum, mean, amax, amin) over dims 0 .. lead - 1 of an input of rank
// above lead, on the CPU; returns lead.
std::optional<int> fused_column_dims(const jit::Node& n);

struct FusionGroup {
  std::vector<const jit::Node*> nodes;  // in graph order
  // The group runs where this node is: its last node, or where the group it merged into runs
  // (column exits run with the group computing their operands, earlier than their own place).
  const jit::Node* anchor = nullptr;
  std::vector<const jit::Value*> inputs;  // tensor values read from outside, one per input
  // Members' values read after the group or returned, then the joins' values.
  std::vector<const jit::Value*> outputs;
  // The cats or stacks whose pieces the group writes (join exits): the group allocates each one's
  // output (the last of `outputs`, in this order) and the kernel's outputs after the other
  // outputs' are their pieces, join after join, each written into its slice (cat) or index
  // (stack) along the join's `dim`. A second join is another exit whose pieces the group computes
  // too (a GRU backward's two gate-gradient cats).
  struct Join {
    const jit::Node* node = nullptr;
    int64_t dim = 0;
  };
  std::vector<Join> joins;
  // The iteration shape: every elementwise member's output shape (without reductions), or the
  // shape whose rows the kernel walks (with them).
  Shape shape;
  // A rows kernel: a row is the last `reduced_dims` dims of `shape`.
  bool rows = false;
  int reduced_dims = 0;
  // Rows only, per input: broadcast against the kept dims (shape without the last reduced_dims),
  // as a row-level value without keepdim is; else against `shape`.
  std::vector<bool> input_outer;
  Kernel kernel;                  // inputs and outputs in the orders above
  std::vector<uint64_t> scalars;  // the kernel scalars' values, as their bytes
};

// Whether n is a cat or stack that a group can end in: pieces of one shape and of its dtype, on
// the CPU.
bool is_join_exit(const jit::Node& n);

// Groups of at least two fusible nodes. Producers merge into consumers in reverse graph order: a
// producer joins when every use of it outside the group comes after the group's last node (so the
// group can run there, and the producer's value becomes an output), repeated until no producer
// joins. Elementwise members share one shape; a group may end in reductions over its trailing
// dims or over all of them and read a row reduction's result broadcast back (keepdim), which
// makes it a rows kernel; or (without other reductions) in a cat or stack of pieces of its shape.
// Reductions over the leading dims (column exits: bias and layer_norm weight gradients) then move
// into the group whose values they read, which folds them as it computes those values. Linear in
// the graph for bounded fan-in; iterative.
std::vector<FusionGroup> find_groups(const jit::Graph& graph);

// KILN_FUSE=0 turns fusion off (nodes then run one by one through the reference kernels).
bool fusion_enabled();
// Overrides KILN_FUSE for plans built from now on (tests, benchmarks); returns the previous state.
bool set_fusion_enabled(bool on);

// Sets fusion on or off for a scope.
class FusionGuard {
 public:
  explicit FusionGuard(bool on) : was_(set_fusion_enabled(on)) {}
  ~FusionGuard() { set_fusion_enabled(was_); }
  FusionGuard(const FusionGuard&) = delete;
  FusionGuard& operator=(const FusionGuard&) = delete;

 private:
  bool was_;
};

}  // namespace kiln::fuser
