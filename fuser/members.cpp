// Which nodes a fusion group can hold (elementwise members, row-wise ops, reductions and joins as
// its exits), the types they compute in, and how their attributes reach their formulas.
#include "fuser/members.h"

#include <algorithm>
#include <cstring>
#include <variant>

#include "fuser/formula.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using jit::Node;
using jit::Value;

std::optional<DType> elementwise_compute_type(const Node& n, std::vector<bool>& convert) {
  const detail::OpDef& op = n.op();
  if (!op.map_into || (op.kind != detail::OpKind::Unary && op.kind != detail::OpKind::Binary))
    return std::nullopt;
  if (n.num_outputs() != 1 || n.output()->type().device != kCPU) return std::nullopt;
  DType compute;
  switch (op.dtype_rule) {
    case detail::DTypeRule::Same:
    case detail::DTypeRule::Float:
      compute = n.output()->type().dtype;
      break;
    case detail::DTypeRule::Logical:
      compute = kBool;
      break;
    case detail::DTypeRule::Custom:
      // A conversion (to): it reads its operand as it is.
      if (!n.input(0)) return std::nullopt;
      compute = n.input(0)->type().dtype;
      break;
    case detail::DTypeRule::Predicate:
      // Promotion between differing operands is left to the op's entry point.
      if (!n.input(0)) return std::nullopt;
      compute = n.input(0)->type().dtype;
      break;
    default:
      return std::nullopt;
  }
  convert.assign(n.num_inputs(), false);
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* in = n.input(i);
    if (!in || in->type().device != kCPU) return std::nullopt;
    if (in->type().dtype == compute) continue;
    if (!in->node()->is_constant() || op.dtype_rule == detail::DTypeRule::Predicate ||
        op.dtype_rule == detail::DTypeRule::Custom)
      return std::nullopt;
    convert[i] = true;
  }
  return compute;
}

namespace {
// A group computes on one device: its members' operands are on the device of their results,
// except 0-dim host values (numbers), which any device's kernel takes.
bool on_device_of(const jit::ValueType& operand, Device device) {
  return operand.device == device || (operand.device.is_cpu() && operand.sizes.empty());
}

// A reduction of one operand by a formula on its device, converting nothing first (sum's dtype
// converts first: left to the op), or null; returns its operand.
const Value* plain_reduction_input(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::Reduction || !op.formula || n.num_outputs() != 1 ||
      n.num_inputs() != 1)
    return nullptr;
  const Value* in = n.input(0);
  if (!in || in->type().device != n.output()->type().device) return nullptr;
  if (int d = attr_index(n, "dtype");
      d >= 0 && !std::holds_alternative<std::monostate>(n.attr(static_cast<size_t>(d))))
    return nullptr;
  return in;
}

// The convolution passes and pools, which run lib/ops/conv_cuda.cpp's kernels on a device.
bool is_conv_or_pool(const std::string& name) {
  return name == "conv2d" || name == "conv2d_grad_input" || name == "conv2d_grad_weight" ||
         name == "max_pool2d_with_indices" || name == "adaptive_max_pool2d" ||
         name == "max_pool2d_backward" || name == "avg_pool2d" || name == "avg_pool2d_backward";
}
}  // namespace

// A view with a formula (expand) to the same rank: read broadcast, like an elementwise operand.
bool is_broadcast_view(const Node& n) {
  return n.op().kind == detail::OpKind::View && n.op().formula && n.num_inputs() == 1 &&
         n.num_outputs() == 1 && n.input(0) &&
         n.input(0)->type().sizes.size() == n.output()->type().sizes.size();
}

std::optional<MemberTypes> member_types(const Node& n, const char** why) {
  auto refuse = [why](const char* reason) -> std::optional<MemberTypes> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const detail::OpDef& op = n.op();
  const bool ternary = op.kind == detail::OpKind::Ternary;
  if (op.kind != detail::OpKind::Unary && op.kind != detail::OpKind::Binary && !ternary &&
      !is_broadcast_view(n))
    return refuse("not an elementwise op");
  if (!op.formula) return refuse("the op has no formula in the op table");
  if (n.num_outputs() != 1 || n.num_inputs() == 0) return refuse("not one output over operands");
  const Device device = n.output()->type().device;
  std::vector<detail::PromotionOperand> facts;
  for (const Value* in : n.inputs()) {
    if (!in) return refuse("an operand is absent");
    if (!on_device_of(in->type(), device)) return refuse("an operand is on another device");
    facts.push_back({in->type().dtype, in->type().sizes.empty(), in->type().wrapped_number});
  }
  MemberTypes t;
  switch (op.dtype_rule) {
    case detail::DTypeRule::Same:
    case detail::DTypeRule::Float:
      // The promoted operands' type (and clamp's bounds'), made floating by
      // Float: the output's.
      t.compute = n.output()->type().dtype;
      break;
    case detail::DTypeRule::Logical:
      t.compute = kBool;
      break;
    case detail::DTypeRule::Predicate:
      // Compared in the promoted type (unary ones: the operand's own).
      t.compute =
          facts.size() == 1 ? facts[0].dtype : detail::result_type(facts.data(), facts.size());
      break;
    case detail::DTypeRule::Custom:
      // where: a bool condition selecting between operands promoted to the output's type; a
      // conversion (to) reads its operand as it is.
      t.compute = ternary ? n.output()->type().dtype : facts[0].dtype;
      break;
    default:
      return refuse("its dtype rule is not one a kernel computes");
  }
  if (op.checks_integer_values && !is_floating_point(t.compute))
    return refuse("on integers it checks its operands' values (division by zero): its kernel runs");
  t.operands.assign(n.num_inputs(), t.compute);
  if (ternary) {
    if (facts[0].dtype != kBool)
      return refuse("its condition is not bool (a conversion left to the op)");
    t.operands[0] = kBool;
  }
  return t;
}

bool is_fusible(const Node& n) {
  return member_types(n).has_value();
}

bool has_device_kernel(const Node& n) {
  if (n.num_outputs() == 0) return false;
  const DType t = n.output(0)->type().dtype;
  const detail::OpKind kind = n.op().kind;
  const std::string& name = n.op().name;
  return (kind == detail::OpKind::Linalg && (t == kFloat32 || t == kFloat64)) ||
         kind == detail::OpKind::Join || kind == detail::OpKind::View || name == "index_select" ||
         name == "gather" || name == "embedding" || name == "index_add" || name == "scatter_add" ||
         name == "slice_scatter" || name == "as_strided_scatter" || is_conv_or_pool(name);
}

int attr_index(const Node& n, const char* name) {
  const auto& names = n.op().attr_names;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

// The type a reduction's formula computes in: its output type for float-producing ones
// (logsumexp of integers), else its input's.
DType reduction_compute_type(const Node& n) {
  return n.op().dtype_rule == detail::DTypeRule::Float ? n.output()->type().dtype
                                                       : n.input(0)->type().dtype;
}

// A reduction node's attribute i as a kernel scalar of its own kind (a float64 or an int64, as
// var's correction), made by `scalar`; -1 when there is no attribute i.
int32_t reduction_attr(const Node& n, int i,
                       const std::function<int32_t(DType, uint64_t)>& scalar) {
  if (i < 0 || static_cast<size_t>(i) >= n.attrs().size()) return -1;
  const Scalar a = detail::attr_scalar(n.attr(static_cast<size_t>(i)));
  uint64_t bits;
  if (a.is_floating_point()) {
    const double d = a.to_double();
    std::memcpy(&bits, &d, sizeof d);
    return scalar(kFloat64, bits);
  }
  const int64_t v = a.to_int();
  std::memcpy(&bits, &v, sizeof v);
  return scalar(kInt64, bits);
}

// The text of a node's attribute i as formulas' if-attr reads it.
std::optional<std::string> attr_text_of(const Node& n, int i) {
  if (i < 0 || static_cast<size_t>(i) >= n.attrs().size()) return std::nullopt;
  const detail::AttrValue& a = n.attr(static_cast<size_t>(i));
  if (const auto* text = std::get_if<std::string>(&a)) return *text;
  return detail::attr_str(a);
}

// Whether a reduction node's formula folds exactly once, counted on the parsed kernel (operands
// as loads, attributes and the element count as kernel scalars), so that every reduction
// primitive counts and an if-attr branch not taken does not.
bool folds_once(const Node& n) {
  Kernel k;
  const DType compute = reduction_compute_type(n);
  FormulaArgs args;
  args.type = compute;
  args.out_type = n.output()->type().dtype;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    Instr load{Prim::Load, compute};
    load.index = static_cast<int32_t>(i);
    k.input_types.push_back(compute);
    args.operands.push_back(k.add(load));
  }
  auto scalar = [&k](DType type, uint64_t) {
    Instr s{Prim::Scalar, type};
    s.index = static_cast<int32_t>(k.scalar_types.size());
    k.scalar_types.push_back(type);
    return k.add(s);
  };
  args.attr = [&](int i) { return reduction_attr(n, i, scalar); };
  args.attr_text = [&n](int i) { return attr_text_of(n, i); };
  args.count = [&] { return scalar(kFloat64, 0); };
  parse_formula(k, n.op().formula, args);
  return std::count_if(k.body.begin(), k.body.end(),
                       [](const Instr& in) { return is_reduction(in.prim); }) == 1;
}

// Ops that compute each element from its whole row along a dim (softmax): with the dim the last,
// they join groups as elementwise members that fold rows.
bool is_row_wise(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::NN || !op.formula || n.num_inputs() != 1 || n.num_outputs() != 1 ||
      n.attrs().size() != 1 || !n.input(0))
    return false;
  const jit::ValueType& in = n.input(0)->type();
  const jit::ValueType& out = n.output()->type();
  if (in.device != out.device || in.sizes.empty() || in.sizes != out.sizes) return false;
  const int d = attr_index(n, "dim");
  return d == 0 && detail::attr_int(n.attr(0)) == static_cast<int64_t>(in.sizes.size()) - 1;
}

// The dim a cat or stack joins along, counted from the front.
int64_t join_dim(const Node& join) {
  const auto rank = static_cast<int64_t>(join.output()->type().sizes.size());
  const int64_t d = detail::attr_int(join.attr(0));
  return d < 0 ? d + rank : d;
}

std::optional<int> fused_reduction_dims(const Node& n) {
  const Value* in = plain_reduction_input(n);
  if (!in) return std::nullopt;
  const int rank = static_cast<int>(in->type().sizes.size());
  if (rank == 0) return std::nullopt;
  const int d = attr_index(n, "dims");
  if (d < 0) return rank;
  const std::vector<int64_t>& dims = detail::attr_ints(n.attr(static_cast<size_t>(d)));
  if (dims.empty()) return rank;
  const int k = static_cast<int>(dims.size());
  for (int i = 0; i < k; ++i)
    if (dims[static_cast<size_t>(i)] != rank - k + i) return std::nullopt;
  return k;
}

std::optional<int> fused_column_dims(const Node& n) {
  const Value* in = plain_reduction_input(n);
  if (!in) return std::nullopt;
  const int rank = static_cast<int>(in->type().sizes.size());
  const int d = attr_index(n, "dims");
  if (d < 0) return std::nullopt;
  const std::vector<int64_t>& dims = detail::attr_ints(n.attr(static_cast<size_t>(d)));
  const int lead = static_cast<int>(dims.size());
  if (lead == 0 || lead >= rank) return std::nullopt;
  for (int i = 0; i < lead; ++i)
    if (dims[static_cast<size_t>(i)] != i) return std::nullopt;
  if (!folds_once(n)) return std::nullopt;
  return lead;
}

bool is_join_exit(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::Join || (op.name != "cat" && op.name != "stack") ||
      n.num_outputs() != 1 || n.num_inputs() == 0 || n.attrs().size() != 1 || !n.input(0))
    return false;
  const jit::ValueType& out = n.output()->type();
  const Shape& piece = n.input(0)->type().sizes;
  if (op.name == "cat" && piece.empty()) return false;
  for (const Value* in : n.inputs())
    if (!in || in->type().sizes != piece || in->type().dtype != out.dtype ||
        in->type().device != out.device)
      return false;
  return true;
}

// Why a node can join no group at all (KILN_LOG=fuser).
std::string unfusible_reason(const Node& n) {
  const detail::OpDef& op = n.op();
  switch (op.kind) {
    case detail::OpKind::Unary:
    case detail::OpKind::Binary:
    case detail::OpKind::Ternary: {
      const char* why = "";
      member_types(n, &why);
      return why;
    }
    case detail::OpKind::View:
      return is_broadcast_view(n) ? "an expand whose operand is on another device"
                                  : "a view other than an expand to the same rank stays a view";
    case detail::OpKind::Linalg:
      return op.name == "mm" || op.name == "bmm" || op.name == "matmul" || op.name == "addmm" ||
                     op.name == "linear"
                 ? "a GEMM (a oneDNN library call)"
                 : "a linear-algebra library call";
    case detail::OpKind::Reduction: {
      if (!op.formula) return "a reduction with no formula in the op table";
      if (n.num_inputs() != 1 || n.num_outputs() != 1 || !n.input(0))
        return "a reduction of several operands or results";
      if (n.input(0)->type().device != n.output()->type().device)
        return "a reduction whose result is on another device";
      if (n.input(0)->type().sizes.empty()) return "a reduction of a 0-dim value";
      if (int d = attr_index(n, "dtype");
          d >= 0 && !std::holds_alternative<std::monostate>(n.attr(static_cast<size_t>(d))))
        return "a reduction converting to another dtype first";
      return "a reduction over dims that are not the trailing ones";
    }
    case detail::OpKind::Join:
      return is_join_exit(n) ? "a cat or stack only ends a group (its exit), never feeds one"
                             : "a cat or stack whose pieces differ in shape, dtype or device";
    case detail::OpKind::NN:
      if (!op.formula) return "the op has no formula in the op table (its own kernel runs)";
      return is_row_wise(n) ? "a row-wise op" : "a row-wise op not over its last dim";
    default:
      return "the op has no formula in the op table (its own kernel runs)";
  }
}

}  // namespace kiln::fuser
