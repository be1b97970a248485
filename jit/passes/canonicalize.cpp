// Canonicalization: algebraic rewrites that are exact in IEEE arithmetic, applied to a fixpoint.
//
// Every rule replaces a value by one that is equal element for element, bit for bit, and has the
// same type (dtype, sizes, device, wrapped flag; the driver re-checks it). That rules out x + 0
// (-0 + 0 is +0) and x - x (inf - inf is NaN); x * 1, x / 1 and neg(neg(x)) are exact. Views
// compose: a chain of permutations is one permutation, a chain of reshapes one reshape, and a view
// that leaves its input's shape unchanged is the input itself. pow with a small integer exponent
// becomes multiplication by squaring in the one order that the eager kernel also uses, so the two
// agree bit for bit; pow(x, +-0.5) becomes sqrt / rsqrt as torch does (they differ from C's pow
// only at -0 and -inf).
#include <cmath>
#include <numeric>

#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {

using passes::Rewriter;

struct Ops {
  const OpDef* mul = detail::find_op("mul");
  const OpDef* div = detail::find_op("div");
  const OpDef* neg = detail::find_op("neg");
  const OpDef* pow = detail::find_op("pow");
  const OpDef* sqrt = detail::find_op("sqrt");
  const OpDef* rsqrt = detail::find_op("rsqrt");
  const OpDef* reciprocal = detail::find_op("reciprocal");
  const OpDef* transpose = detail::find_op("transpose");
  const OpDef* permute = detail::find_op("permute");
  const OpDef* reshape = detail::find_op("reshape");
  const OpDef* view = detail::find_op("view");
  const OpDef* expand = detail::find_op("expand");
  const OpDef* squeeze = detail::find_op("squeeze");
  const OpDef* unsqueeze = detail::find_op("unsqueeze");
  const OpDef* slice = detail::find_op("slice");
  const OpDef* as_strided = detail::find_op("as_strided");
};

const Ops& ops() {
  static const Ops o;
  return o;
}

Value* input(const Node* n, size_t i) {
  return i < n->num_inputs() ? n->input(i) : nullptr;
}

// ---------------------------------------------------------------------------------- arithmetic
Value* mul_by_one(Node* n, const char** rule) {
  Value* a = input(n, 0);
  Value* b = input(n, 1);
  if (!a || !b) return nullptr;
  const ValueType& t = n->output()->type();
  *rule = "mul_by_one";
  if (passes::is_constant_one(b) && a->type() == t) return a;
  if (passes::is_constant_one(a) && b->type() == t) return b;
  return nullptr;
}

Value* div_by_one(Node* n, const char** rule) {
  Value* a = input(n, 0);
  if (!a || !passes::is_constant_one(input(n, 1)) || a->type() != n->output()->type())
    return nullptr;
  *rule = "div_by_one";
  return a;
}

Value* double_neg(Node* n, const char** rule) {
  Node* inner = passes::producer(input(n, 0), ops().neg);
  if (!inner || !input(inner, 0)) return nullptr;
  *rule = "double_neg";
  return inner->input(0);
}

// x ** c for a constant c. Integer exponents: 1 <= |c| <= 64 by squaring, exactly this sequence
// (the eager pow kernel runs the same one, so both round identically):
//   result = none; base = x; m = |c|
//   while m: if m & 1: result = result ? result * base : base
//            m >>= 1; if m: base = base * base
//   c < 0: reciprocal(result)
Value* pow_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  Value* x = input(n, 0);
  const AttrValue* c = passes::constant_value(input(n, 1));
  const ValueType& t = n->output()->type();
  if (!x || !c || !is_floating_point(x->type().dtype) || x->type() != t) return nullptr;
  std::optional<int64_t> integer;
  double e = 0;
  if (const int64_t* i = std::get_if<int64_t>(c)) {
    integer = *i;
    e = static_cast<double>(*i);
  } else if (const double* d = std::get_if<double>(c)) {
    e = *d;
    if (std::fabs(e) <= 64 && e == std::floor(e)) integer = static_cast<int64_t>(e);
  } else {
    return nullptr;  // a bool exponent: leave it to the kernel
  }
  if (integer && *integer != 0 && *integer >= -64 && *integer <= 64) {
    if (*integer == 1) {
      *rule = "pow_one";
      return x;
    }
    if (!op.mul || !op.reciprocal) return nullptr;
    Value* result = nullptr;
    Value* base = x;
    uint64_t m = static_cast<uint64_t>(*integer < 0 ? -*integer : *integer);
    while (m) {
      if (m & 1) result = result ? rw.create(*op.mul, {result, base}, {}, t, n) : base;
      m >>= 1;
      if (m) base = rw.create(*op.mul, {base, base}, {}, t, n);
    }
    if (*integer < 0) result = rw.create(*op.reciprocal, {result}, {}, t, n);
    *rule = "pow_by_squaring";
    return result;
  }
  if (e == 0.5 && op.sqrt) {
    *rule = "pow_half_to_sqrt";
    return rw.create(*op.sqrt, {x}, {}, t, n);
  }
  if (e == -0.5 && op.rsqrt) {
    *rule = "pow_neg_half_to_rsqrt";
    return rw.create(*op.rsqrt, {x}, {}, t, n);
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------- views
// The permutation a transpose or permute applies (output dim i reads input dim p[i]), or nothing
// when the attributes do not describe one of `rank` dims.
std::optional<std::vector<int64_t>> permutation(const Node* n, size_t rank) {
  const Ops& op = ops();
  const int64_t r = static_cast<int64_t>(rank);
  std::vector<int64_t> p(rank);
  if (&n->op() == op.transpose) {
    std::optional<int64_t> a = passes::int_attr(n, 0), b = passes::int_attr(n, 1);
    if (!a || !b) return std::nullopt;
    int64_t d0 = *a < 0 ? *a + r : *a, d1 = *b < 0 ? *b + r : *b;
    if (d0 < 0 || d0 >= r || d1 < 0 || d1 >= r) return std::nullopt;
    std::iota(p.begin(), p.end(), int64_t{0});
    std::swap(p[static_cast<size_t>(d0)], p[static_cast<size_t>(d1)]);
    return p;
  }
  if (&n->op() != op.permute) return std::nullopt;
  const std::vector<int64_t>* dims = passes::ints_attr(n, 0);
  if (!dims || dims->size() != rank) return std::nullopt;
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < rank; ++i) {
    int64_t d = (*dims)[i] < 0 ? (*dims)[i] + r : (*dims)[i];
    if (d < 0 || d >= r || seen[static_cast<size_t>(d)]) return std::nullopt;
    seen[static_cast<size_t>(d)] = true;
    p[i] = d;
  }
  return p;
}

bool is_identity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// permute(permute(x, p), q) reads x's dim p[q[i]] at output dim i; transposes are permutations
// that swap two dims.
Value* permutation_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  Value* x = input(n, 0);
  if (!x) return nullptr;
  const size_t rank = n->output()->type().sizes.size();
  std::optional<std::vector<int64_t>> q = permutation(n, rank);
  if (!q) return nullptr;
  if (is_identity(*q)) {
    *rule = "identity_view";
    return x;
  }
  Node* inner = x->node();
  if (&inner->op() != op.transpose && &inner->op() != op.permute) return nullptr;
  Value* y = input(inner, 0);
  std::optional<std::vector<int64_t>> p = permutation(inner, rank);
  if (!y || !p || !op.permute) return nullptr;
  std::vector<int64_t> composed(rank);
  for (size_t i = 0; i < rank; ++i) composed[i] = (*p)[static_cast<size_t>((*q)[i])];
  const bool transposes = &n->op() == op.transpose && &inner->op() == op.transpose;
  if (is_identity(composed)) {
    *rule = transposes ? "transpose_of_transpose" : "permute_chain";
    return y;
  }
  *rule = "permute_chain";
  return rw.create(*op.permute, {y}, {composed}, n->output()->type(), n);
}

// A reshape-like view whose output type is its input's changes nothing: same sizes means the same
// elements in the same row-major order (for slice, the only slice of a dim that keeps its size is
// the whole dim).
Value* identity_view(Node* n, const char** rule) {
  Value* x = input(n, 0);
  if (!x || x->type() != n->output()->type()) return nullptr;
  *rule = "identity_view";
  return x;
}

Value* reshape_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  if (Value* x = identity_view(n, rule)) return x;
  Value* x = input(n, 0);
  Node* inner = x ? x->node() : nullptr;
  if (!inner || (&inner->op() != op.reshape && &inner->op() != op.view) || !input(inner, 0))
    return nullptr;
  // view promises no copy; only a chain of views keeps that promise for certain.
  const OpDef* kind = &n->op() == op.view && &inner->op() == op.view ? op.view : op.reshape;
  if (!kind) return nullptr;
  *rule = "reshape_chain";
  return rw.create(*kind, {inner->input(0)}, n->attrs(), n->output()->type(), n);
}

Value* expand_rule(Rewriter& rw, Node* n, const char** rule) {
  if (Value* x = identity_view(n, rule)) return x;
  Node* inner = passes::producer(input(n, 0), ops().expand);
  if (!inner || !input(inner, 0)) return nullptr;
  *rule = "expand_chain";
  return rw.create(*ops().expand, {inner->input(0)}, n->attrs(), n->output()->type(), n);
}

// Inserting and removing size-1 dims never reorders elements: when the result has the original
// type, it is the original.
Value* squeeze_rule(Node* n, const char** rule) {
  if (Value* x = identity_view(n, rule)) return x;
  Node* inner = passes::producer(input(n, 0), ops().unsqueeze);
  Value* y = inner ? input(inner, 0) : nullptr;
  if (!y || y->type() != n->output()->type()) return nullptr;
  *rule = "squeeze_of_unsqueeze";
  return y;
}

// as_strided with row-major strides, no offset and every element of its input reads the input in
// order: it is a reshape (which the reshape rules then merge or drop). A trace makes these when a
// tensor is updated in place: the new value is written into the storage viewed flat, and read
// back through as_strided.
Value* as_strided_rule(Rewriter& rw, Node* n, const char** rule) {
  Value* x = input(n, 0);
  if (!x || n->attrs().size() != 3) return nullptr;
  const std::vector<int64_t>& sizes = detail::attr_ints(n->attr(0));
  const std::vector<int64_t>& strides = detail::attr_ints(n->attr(1));
  if (detail::attr_int(n->attr(2)) != 0 || Shape(strides) != detail::contiguous_strides(sizes) ||
      detail::shape_numel(sizes) != detail::shape_numel(x->type().sizes))
    return nullptr;
  *rule = "as_strided_is_reshape";
  return rw.create(*ops().reshape, {x}, {sizes}, n->output()->type(), n);
}

Value* canonical_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  const OpDef* k = &n->op();
  if (k == op.mul) return mul_by_one(n, rule);
  if (k == op.div) return div_by_one(n, rule);
  if (k == op.neg) return double_neg(n, rule);
  if (k == op.pow) return pow_rule(rw, n, rule);
  if (k == op.transpose || k == op.permute) return permutation_rule(rw, n, rule);
  if (k == op.reshape || k == op.view) return reshape_rule(rw, n, rule);
  if (k == op.expand) return expand_rule(rw, n, rule);
  if (k == op.squeeze) return squeeze_rule(n, rule);
  if (k == op.slice) return identity_view(n, rule);
  if (k == op.as_strided) return as_strided_rule(rw, n, rule);
  return nullptr;
}

}  // namespace

bool canonicalize(Graph& g, PassContext& ctx) {
  Rewriter rw(g, ctx);
  return rw.run(&canonical_rule);
}

}  // namespace kiln::jit
