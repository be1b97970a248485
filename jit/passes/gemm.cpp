// GEMM bias folding: add(mm(a, b), bias) -> addmm(bias, a, b) (beta = 1), so that the GEMM call
// writes its product onto the bias instead of a separate pass reading the product back.
//
// Not an exact rewrite: the GEMM library adds the bias into its accumulation (where it splits
// the K dimension, the bias is in the sum from the first block on), so the result may round
// differently from the separate add; like stabilize, it lives apart from canonicalize.
#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"

namespace kiln::jit {

namespace {

using passes::Rewriter;

struct GemmOps {
  const OpDef* add = detail::find_op("add");
  const OpDef* mm = detail::find_op("mm");
  const OpDef* matmul = detail::find_op("matmul");
  const OpDef* addmm = detail::find_op("addmm");
};

const GemmOps& gemm_ops() {
  static const GemmOps o;
  return o;
}

// A 2-D product read by nothing but the add being rewritten.
Node* product(Value* v) {
  if (!v || v->uses().size() != 1 || v->node()->owning_graph()->is_output(v)) return nullptr;
  Node* p = v->node();
  const GemmOps& op = gemm_ops();
  if (&p->op() != op.mm && &p->op() != op.matmul) return nullptr;
  if (p->num_inputs() != 2 || !p->input(0) || !p->input(1)) return nullptr;
  if (p->input(0)->type().sizes.size() != 2 || p->input(1)->type().sizes.size() != 2)
    return nullptr;
  return p;
}

// The bias broadcasts to the product's [M, N] (as addmm's does) and has its type.
bool fits(const Value* bias, const ValueType& out) {
  if (!bias || bias->type().dtype != out.dtype || bias->type().device != out.device) return false;
  const Shape& b = bias->type().sizes;
  if (b.size() > 2) return false;
  for (size_t i = 0; i < b.size(); ++i) {
    const int64_t have = b[b.size() - 1 - i], want = out.sizes[out.sizes.size() - 1 - i];
    if (have != want && have != 1) return false;
  }
  return true;
}

Value* bias_rule(Rewriter& rw, Node* n, const char** rule) {
  const GemmOps& op = gemm_ops();
  if (&n->op() != op.add || !op.addmm || n->num_inputs() != 2) return nullptr;
  std::optional<double> alpha = passes::number_attr(n, 0);
  if (!alpha || *alpha != 1.0) return nullptr;
  const ValueType& t = n->output()->type();
  if (!is_floating_point(t.dtype) || t.sizes.size() != 2) return nullptr;
  for (size_t side = 0; side < 2; ++side) {
    Node* p = product(n->input(side));
    Value* bias = n->input(1 - side);
    if (!p || p->output()->type() != t || !fits(bias, t)) continue;
    *rule = "bias folded into the GEMM";
    return rw.create(*op.addmm, {bias, p->input(0), p->input(1)}, {1.0, 1.0}, t, n);
  }
  return nullptr;
}

}  // namespace

bool fold_gemm_bias(Graph& g, PassContext& ctx) {
  Rewriter rw(g, ctx);
  return rw.run(&bias_rule);
}

}  // namespace kiln::jit
