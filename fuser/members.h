// Which nodes a fusion group can hold (elementwise members, row-wise ops, reductions and joins as
// its exits), the types they compute in, and how their attributes reach their formulas.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fuser/fuse.h"
#include "jit/ir.h"

namespace kiln::fuser {

// How a member of a fused group computes: in `compute`, each operand converted in the kernel to its
// entry in `operands`, as the op's entry point converts it (lib/elementwise.h: binary_op's
// a.to(compute), where's condition kept bool).
struct MemberTypes {
  DType compute;
  std::vector<DType> operands;
};

// How an elementwise node computes as a member, or nullopt when it is none (is_fusible); `why`,
// when given, is then set to the reason (KILN_LOG=fuser).
std::optional<MemberTypes> member_types(const jit::Node& n, const char** why = nullptr);

// A view with a formula (expand) to the same rank: read broadcast, like an elementwise operand.
bool is_broadcast_view(const jit::Node& n);

// Ops that compute each element from its whole row along a dim (softmax): with the dim the last,
// they join groups as elementwise members that fold rows.
bool is_row_wise(const jit::Node& n);

// Why a node can join no group at all (KILN_LOG=fuser).
std::string unfusible_reason(const jit::Node& n);

// The index of the op's attribute `name`, or -1.
int attr_index(const jit::Node& n, const char* name);

// The type a reduction's formula computes in: its output type for float-producing ones
// (logsumexp of integers), else its input's.
DType reduction_compute_type(const jit::Node& n);

// A reduction node's attribute i as a kernel scalar of its own kind (a float64 or an int64, as
// var's correction), made by `scalar`; -1 when there is no attribute i.
int32_t reduction_attr(const jit::Node& n, int i,
                       const std::function<int32_t(DType, uint64_t)>& scalar);

// The text of a node's attribute i as formulas' if-attr reads it.
std::optional<std::string> attr_text_of(const jit::Node& n, int i);

// Whether a reduction node's formula folds exactly once, counted on the parsed kernel (operands
// as loads, attributes and the element count as kernel scalars), so that every reduction
// primitive counts and an if-attr branch not taken does not.
bool folds_once(const jit::Node& n);

// The dim a cat or stack joins along, counted from the front.
int64_t join_dim(const jit::Node& join);

}  // namespace kiln::fuser
