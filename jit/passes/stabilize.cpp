// Numerical stabilization: rewrites formulas that lose precision or overflow in floating point
// into the ops that compute the same function stably.
//
//   log(x + 1)                      -> log1p(x)        (x tiny: 1 + x rounds to 1)
//   exp(x) - 1                      -> expm1(x)        (x tiny: cancellation)
//   log(softmax(x, d))              -> log_softmax(x, d)
//   log(sigmoid(x))                 -> -softplus(-x)   (x very negative: sigmoid underflows to 0)
//   log(sum(exp(x), dims))          -> logsumexp(x, dims)   (x large: exp overflows)
//   exp(x) / sum(exp(x), d, keepdim) -> softmax(x, d)
//   softmax(x - amax(x, d, keepdim), d) -> softmax(x, d)   (and log_softmax: they shift by the
//                                                            row's max themselves)
//
// These are not exact rewrites (the stable forms round differently, and better), so they live
// apart from canonicalize. Each fires only for floating x and only when the new value's type is
// the replaced value's type. They run on the same worklist driver as canonicalize, so a rewrite
// that exposes another (exp(x) / sum(exp(x)) inside a log) is applied too.
#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"

namespace kiln::jit {

namespace {

using passes::Rewriter;

struct Ops {
  const OpDef* log = detail::find_op("log");
  const OpDef* exp = detail::find_op("exp");
  const OpDef* add = detail::find_op("add");
  const OpDef* sub = detail::find_op("sub");
  const OpDef* div = detail::find_op("div");
  const OpDef* neg = detail::find_op("neg");
  const OpDef* sum = detail::find_op("sum");
  const OpDef* sigmoid = detail::find_op("sigmoid");
  const OpDef* softplus = detail::find_op("softplus");
  const OpDef* softmax = detail::find_op("softmax");
  const OpDef* amax = detail::find_op("amax");
  const OpDef* log_softmax = detail::find_op("log_softmax");
  const OpDef* log1p = detail::find_op("log1p");
  const OpDef* expm1 = detail::find_op("expm1");
  const OpDef* logsumexp = detail::find_op("logsumexp");
};

const Ops& ops() {
  static const Ops o;
  return o;
}

Value* input(const Node* n, size_t i) {
  return i < n->num_inputs() ? n->input(i) : nullptr;
}

// x is floating and has exactly the type `t` of the value being replaced.
bool same_float(const Value* x, const ValueType& t) {
  return x && is_floating_point(x->type().dtype) && x->type() == t;
}

bool alpha_is_one(const Node* n) {
  std::optional<double> alpha = passes::number_attr(n, 0);
  return alpha && *alpha == 1.0;
}

// log(add(x, 1)) and log(add(1, x)), alpha 1.
Value* log1p_rule(Rewriter& rw, Node* n, Node* add, const char** rule) {
  if (!ops().log1p || !alpha_is_one(add)) return nullptr;
  Value* x = nullptr;
  if (passes::is_constant_one(input(add, 1)))
    x = input(add, 0);
  else if (passes::is_constant_one(input(add, 0)))
    x = input(add, 1);
  const ValueType& t = n->output()->type();
  if (!same_float(x, t)) return nullptr;
  *rule = "log1p";
  return rw.create(*ops().log1p, {x}, {}, t, n);
}

// The reduced dims of sum(x, dims): normalized, the empty list meaning all of them; nothing for
// malformed attributes or a 0-dim x (logsumexp needs at least one dim).
std::optional<std::vector<int64_t>> reduced_dims(const Node* sum, size_t rank) {
  const std::vector<int64_t>* dims = passes::ints_attr(sum, 0);
  if (!dims || rank == 0) return std::nullopt;
  const int64_t r = static_cast<int64_t>(rank);
  std::vector<int64_t> out;
  if (dims->empty()) {
    for (int64_t d = 0; d < r; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : *dims) {
    d = d < 0 ? d + r : d;
    if (d < 0 || d >= r) return std::nullopt;
    out.push_back(d);
  }
  return out;
}

// sum(exp(x), dims, keepdim, dtype=none): returns the sum node, with x.
Node* sum_of_exp(const Value* v, Value** x) {
  const Ops& op = ops();
  Node* sum = passes::producer(v, op.sum);
  if (!sum || sum->attrs().size() < 2) return nullptr;
  if (sum->attrs().size() > 2 && !std::holds_alternative<std::monostate>(sum->attrs()[2]))
    return nullptr;  // an explicit accumulation dtype changes what is computed
  Node* e = passes::producer(input(sum, 0), op.exp);
  if (!e || !input(e, 0) || e->output()->type() != e->input(0)->type()) return nullptr;
  *x = e->input(0);
  return sum;
}

Value* logsumexp_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  Value* x = nullptr;
  Node* sum = sum_of_exp(input(n, 0), &x);
  if (!sum || !op.logsumexp || !is_floating_point(x->type().dtype)) return nullptr;
  std::optional<bool> keepdim = passes::bool_attr(sum, 1);
  std::optional<std::vector<int64_t>> dims = reduced_dims(sum, x->type().sizes.size());
  const ValueType& t = n->output()->type();
  const ValueType& xt = x->type();
  if (!keepdim || !dims || t.dtype != xt.dtype || t.device != xt.device || t.wrapped_number ||
      sum->output()->type() != t)
    return nullptr;
  *rule = "logsumexp";
  return rw.create(*op.logsumexp, {x}, {*dims, *keepdim}, t, n);
}

Value* log_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  Value* a = input(n, 0);
  if (!a) return nullptr;
  const Node* p = a->node();
  const ValueType& t = n->output()->type();
  if (&p->op() == op.add) return log1p_rule(rw, n, a->node(), rule);
  if (&p->op() == op.softmax) {
    Value* x = input(p, 0);
    if (!op.log_softmax || !same_float(x, t)) return nullptr;
    *rule = "log_softmax";
    return rw.create(*op.log_softmax, {x}, p->attrs(), t, n);
  }
  if (&p->op() == op.sigmoid) {
    // log(sigmoid(x)) = -log(1 + exp(-x)) = -softplus(-x); softplus returns its input past the
    // threshold, so very negative x gives exactly x.
    Value* x = input(p, 0);
    if (!op.neg || !op.softplus || !same_float(x, t)) return nullptr;
    Value* nx = rw.create(*op.neg, {x}, {}, t, n);
    Value* sp = rw.create(*op.softplus, {nx}, {1.0, 20.0}, t, n);
    *rule = "log_sigmoid";
    return rw.create(*op.neg, {sp}, {}, t, n);
  }
  if (&p->op() == op.sum) return logsumexp_rule(rw, n, rule);
  return nullptr;
}

// sub(exp(x), 1), alpha 1.
Value* expm1_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  Node* e = passes::producer(input(n, 0), op.exp);
  if (!e || !op.expm1 || !alpha_is_one(n) || !passes::is_constant_one(input(n, 1))) return nullptr;
  Value* x = input(e, 0);
  const ValueType& t = n->output()->type();
  if (!same_float(x, t)) return nullptr;
  *rule = "expm1";
  return rw.create(*op.expm1, {x}, {}, t, n);
}

// y for x = y - amax(y, [d], keepdim=true) (alpha 1), else x: what softmax along d computes from.
Value* unshifted(Value* x, int64_t d) {
  const Ops& op = ops();
  Node* sub = passes::producer(x, op.sub);
  if (!sub || !alpha_is_one(sub)) return x;
  Node* max = passes::producer(input(sub, 1), op.amax);
  if (!max || input(max, 0) != input(sub, 0)) return x;
  std::optional<bool> keepdim = passes::bool_attr(max, 1);
  const std::vector<int64_t>* dims = passes::ints_attr(max, 0);
  if (!keepdim || !*keepdim || !dims || dims->size() != 1 || (*dims)[0] != d) return x;
  return input(sub, 0);
}

// div(exp(x), sum(exp(x), [d], keepdim=true)); the two exps are one node after CSE, but equal
// ones are accepted too.
Value* softmax_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  Node* e = passes::producer(input(n, 0), op.exp);
  Value* x = nullptr;
  Node* sum = sum_of_exp(input(n, 1), &x);
  if (!e || !sum || !op.softmax || input(e, 0) != x) return nullptr;
  const ValueType& t = n->output()->type();
  std::optional<bool> keepdim = passes::bool_attr(sum, 1);
  std::optional<std::vector<int64_t>> dims = reduced_dims(sum, x->type().sizes.size());
  if (!same_float(x, t) || !keepdim || !*keepdim || !dims || dims->size() != 1) return nullptr;
  *rule = "softmax";
  return rw.create(*op.softmax, {unshifted(x, (*dims)[0])}, {(*dims)[0]}, t, n);
}

Value* stable_rule(Rewriter& rw, Node* n, const char** rule) {
  const Ops& op = ops();
  const OpDef* k = &n->op();
  if (k == op.log) return log_rule(rw, n, rule);
  if (k == op.sub) return expm1_rule(rw, n, rule);
  if (k == op.div) return softmax_rule(rw, n, rule);
  return nullptr;
}

}  // namespace

bool stabilize(Graph& g, PassContext& ctx) {
  Rewriter rw(g, ctx);
  return rw.run(&stable_rule);
}

}  // namespace kiln::jit
