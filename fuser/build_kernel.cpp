// A group's kernel built from its members' op-table formulas: loads, scalars, each member's
// instructions in graph order, and the outputs the group writes.
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/formula.h"
#include "fuser/grouping.h"
#include "fuser/members.h"
#include "jit/constant_value.h"
#include "kiln/error.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using jit::Node;
using jit::Value;

namespace {

// An attribute as a kernel scalar of type t, converted as Scalar::to<T> (what the reference
// kernels do with them).
uint64_t scalar_bits(const Scalar& s, DType t) {
  uint64_t bits = 0;
  auto put = [&bits](auto v) { std::memcpy(&bits, &v, sizeof v); };
  switch (t) {
    case kBool:
      put(s.to<bool>());
      break;
    case kInt32:
      put(s.to<int32_t>());
      break;
    case kInt64:
      put(s.to<int64_t>());
      break;
    case kFloat32:
      put(s.to<float>());
      break;
    case kFloat64:
      put(s.to<double>());
      break;
  }
  return bits;
}

uint64_t value_bits(const Tensor& t) {
  uint64_t bits = 0;
  std::memcpy(&bits, t.impl()->data(), element_size(t.dtype()));
  return bits;
}

// The kernel's symbol names its first ops, up to about 48 characters, and always its join.
void append_op_name(Kernel& k, const std::string& name, bool always = false) {
  if (k.ops.size() >= 48 && !always) return;
  if (!k.ops.empty()) k.ops += "_";
  k.ops += name;
}

// The join of g whose value `v` is, or null.
const Node* join_of(const FusionGroup& g, const Value* v) {
  for (const FusionGroup::Join& j : g.joins)
    if (j.node->output() == v) return j.node;
  return nullptr;
}

// How a member reads inputs from outside: per element, or (for row-level members and a global
// reduction of row-level values) once per row, broadcast against the kept dims when the member
// drops the reduced ones (outer).
struct ReadMode {
  bool per_row = false;
  bool outer = false;
};

// Appends a group's members to its kernel, remembering where each value already is in the body.
class KernelBuilder {
 public:
  KernelBuilder(FusionGroup& g, const absl::flat_hash_map<const Node*, Role>& roles)
      : g_(g), k_(g.kernel), roles_(roles) {}

  void add_member(const Node& n);
  void add_outputs();
  void add_joins();

 private:
  int32_t cast(int32_t v, DType to);
  int32_t scalar(DType type, uint64_t bits);
  int32_t operand(const Value* in, const ReadMode& mode);
  MemberTypes types_of(const Node& n, bool folds) const;
  ReadMode read_mode(const Node& n, Role role, bool reduction) const;
  FormulaArgs::Attr attr_of(const Node& n, bool folds, DType compute);
  std::function<int32_t()> count_of(const Node& n, Role role);
  int32_t parse_member(const Node& n, Role role, const Node* summed_join, FormulaArgs& args,
                       const MemberTypes& types);

  FusionGroup& g_;
  Kernel& k_;
  const absl::flat_hash_map<const Node*, Role>& roles_;
  absl::flat_hash_map<const Value*, int32_t> value_instr_;   // members' results
  absl::flat_hash_map<const Value*, int32_t> scalar_instr_;  // constants, as read
  // Loads by (value, per row, against the kept dims only).
  absl::flat_hash_map<std::tuple<const Value*, bool, bool>, int32_t> loads_;
};

int32_t KernelBuilder::cast(int32_t v, DType to) {
  if (k_.body[static_cast<size_t>(v)].type == to) return v;
  Instr c{Prim::Cast, to};
  c.a = v;
  return k_.add(c);
}

int32_t KernelBuilder::scalar(DType type, uint64_t bits) {
  Instr s{Prim::Scalar, type};
  s.index = static_cast<int32_t>(k_.scalar_types.size());
  k_.scalar_types.push_back(type);
  g_.scalars.push_back(bits);
  return k_.add(s);
}

// The instruction giving `in` to a member: its result, a constant's scalar, or a load.
int32_t KernelBuilder::operand(const Value* in, const ReadMode& mode) {
  if (auto it = value_instr_.find(in); it != value_instr_.end()) return it->second;
  if (in->node()->is_constant()) {
    auto s = scalar_instr_.find(in);
    if (s == scalar_instr_.end()) {
      const Tensor c = jit::constant_value(*in->node());
      s = scalar_instr_.emplace(in, scalar(c.dtype(), value_bits(c))).first;
    }
    return s->second;
  }
  auto key = std::make_tuple(in, mode.per_row, mode.outer);
  auto l = loads_.find(key);
  if (l == loads_.end()) {
    Instr load{Prim::Load, in->type().dtype};
    load.index = static_cast<int32_t>(g_.inputs.size());
    load.per_row = mode.per_row;
    g_.inputs.push_back(in);
    g_.input_outer.push_back(mode.outer);
    k_.input_types.push_back(in->type().dtype);
    l = loads_.emplace(key, k_.add(load)).first;
  }
  return l->second;
}

// The types a member computes in: a fold's (reduction or row-wise op) formula type for every
// operand, else the elementwise member's.
MemberTypes KernelBuilder::types_of(const Node& n, bool folds) const {
  if (!folds) return *member_types(n);
  const DType compute = reduction_compute_type(n);
  return {compute, std::vector<DType>(n.num_inputs(), compute)};
}

ReadMode KernelBuilder::read_mode(const Node& n, Role role, bool reduction) const {
  const Shape& shape = reduction ? n.input(0)->type().sizes : n.output()->type().sizes;
  ReadMode mode;
  mode.per_row = g_.rows && role != Role::kElement && role != Role::kColumn &&
                 !(reduction && role == Role::kRow) && shape != g_.shape;
  mode.outer = mode.per_row && shape == dropped_shape(g_.shape, g_.reduced_dims) &&
               shape != kept_shape(g_.shape, g_.reduced_dims);
  return mode;
}

// The formula's aN. A fold's attributes as they are (var's correction). Other ops' numeric
// attributes (add's alpha, clamp's bounds, softplus's beta): kernel scalars of the compute type,
// passed per call and converted as the reference kernel converts them (Scalar::to), made when the
// formula first reads them. An absent one (none) has no value: formulas test for it with if-attr.
FormulaArgs::Attr KernelBuilder::attr_of(const Node& n, bool folds, DType compute) {
  if (folds)
    return [this, &n](int i) {
      return reduction_attr(n, i, [this](DType t, uint64_t bits) { return scalar(t, bits); });
    };
  if (n.attrs().empty()) return nullptr;
  return [this, &n, compute,
          made = std::vector<int32_t>(n.attrs().size(), -1)](int i) mutable -> int32_t {
    if (i < 0 || static_cast<size_t>(i) >= made.size()) return -1;
    const detail::AttrValue& a = n.attr(static_cast<size_t>(i));
    if (std::holds_alternative<std::monostate>(a)) return -1;
    int32_t& m = made[static_cast<size_t>(i)];
    if (m < 0) m = scalar(compute, scalar_bits(detail::attr_scalar(a), compute));
    return m;
  };
}

// A fold's n: the number of elements it folds (every element for a global reduction, the rows
// for a column one, a row's otherwise), as a float64 scalar.
std::function<int32_t()> KernelBuilder::count_of(const Node& n, Role role) {
  return [this, &n, role] {
    const Shape& in_shape = n.input(0)->type().sizes;
    const int r = g_.reduced_dims;
    const int64_t folded = role == Role::kGlobal ? detail::shape_numel(in_shape)
                           : role == Role::kColumn
                               ? detail::shape_numel(Shape(in_shape.begin(), in_shape.end() - r))
                               : detail::shape_numel(Shape(in_shape.end() - r, in_shape.end()));
    const double d = static_cast<double>(folded);
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof d);
    return scalar(kFloat64, bits);
  };
}

// Parses the member's formula, once per part: a column sum of the group's join (cat along the
// row's dim) folds each piece into its part of the column slot (the cat's element (i, p * R + j)
// is piece p's (i, j)). Parts after the first only fold: what follows their reduction is the
// first part's (the columns function computes it for every position of the slot).
int32_t KernelBuilder::parse_member(const Node& n, Role role, const Node* summed_join,
                                    FormulaArgs& args, const MemberTypes& types) {
  const size_t parts = summed_join ? summed_join->num_inputs() : 1;
  args.global = role == Role::kGlobal;
  args.column_slot = role == Role::kColumn ? k_.num_columns() : -1;
  if (role == Role::kColumn) k_.column_parts.push_back(static_cast<int32_t>(parts));
  int32_t result = -1;
  for (size_t part = 0; part < parts; ++part) {
    if (summed_join)
      args.operands[0] = cast(operand(summed_join->input(part), {}), types.operands[0]);
    args.part = static_cast<int32_t>(part);
    const int32_t r = parse_formula(k_, n.op().formula, args);
    if (part == 0) result = r;
  }
  return result;
}

void KernelBuilder::add_member(const Node& n) {
  const Role role = roles_.at(&n);
  const bool reduction = n.op().kind == detail::OpKind::Reduction;
  const bool folds = reduction || is_row_wise(n);
  const MemberTypes types = types_of(n, folds);
  const ReadMode mode = read_mode(n, role, reduction);
  const Node* summed_join = role == Role::kColumn ? join_of(g_, n.input(0)) : nullptr;
  FormulaArgs args;
  args.type = types.compute;
  args.out_type = n.output()->type().dtype;
  for (const Value* in : n.inputs())
    args.operands.push_back(
        summed_join ? -1 : cast(operand(in, mode), types.operands[args.operands.size()]));
  args.attr = attr_of(n, folds, types.compute);
  if (folds) args.count = count_of(n, role);
  args.attr_text = [&n](int i) { return attr_text_of(n, i); };
  const int32_t result = parse_member(n, role, summed_join, args, types);
  const DType got = k_.body[static_cast<size_t>(result)].type;
  KILN_CHECK(got == n.output()->type().dtype, "fuser: the formula of ", n.op().name, " gives ",
             dtype_name(got), ", the node is ", dtype_name(n.output()->type().dtype));
  value_instr_[n.output()] = result;
  append_op_name(k_, n.op().name);
}

// Outputs: members whose value is read outside the group or returned.
void KernelBuilder::add_outputs() {
  for (const Node* n : g_.nodes) {
    if (join_of(g_, n->output())) continue;
    const Value* v = n->output();
    bool outside = n->owning_graph()->is_output(v);
    for (const jit::Use& u : v->uses()) outside |= !roles_.contains(u.user);
    if (!outside) continue;
    g_.outputs.push_back(v);
    k_.outputs.push_back(value_instr_.at(v));
    k_.output_types.push_back(v->type().dtype);
    k_.output_per_element.push_back(g_.rows && v->type().sizes == g_.shape &&
                                    roles_.at(n) != Role::kColumn);
  }
}

// Then the joins' pieces, each written into its slice of the join's output.
void KernelBuilder::add_joins() {
  for (FusionGroup::Join& join : g_.joins) {
    const Value* whole = join.node->output();
    for (const Value* piece : join.node->inputs()) {
      k_.outputs.push_back(operand(piece, {}));
      k_.output_types.push_back(whole->type().dtype);
      k_.output_per_element.push_back(false);
    }
    g_.outputs.push_back(whole);
    join.dim = join_dim(*join.node);
    append_op_name(k_, join.node->op().name, /*always=*/true);
  }
}

}  // namespace

void build_kernel(FusionGroup& g, const absl::flat_hash_map<const Node*, Role>& roles) {
  KernelBuilder b(g, roles);
  for (const Node* n : g.nodes)
    if (!join_of(g, n->output())) b.add_member(*n);  // joins: written as the kernel's last outputs
  b.add_outputs();
  b.add_joins();
}

}  // namespace kiln::fuser
