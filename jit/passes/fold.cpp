// Constant folding: a node computing a 0-dim value from scalar constants becomes the constant it
// computes, evaluated by the op's own reference kernel so the result is what running it would give.
#include <exception>

#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {

// Folding runs kernels for real: not recorded into the pending trace, and not differentiated.
class EagerGuard {
 public:
  EagerGuard() : lazy_(detail::lazy_mode()) { detail::set_lazy_mode(false); }
  ~EagerGuard() { detail::set_lazy_mode(lazy_); }
  EagerGuard(const EagerGuard&) = delete;
  EagerGuard& operator=(const EagerGuard&) = delete;

 private:
  NoGradGuard no_grad_;
  bool lazy_;
};

Tensor constant_tensor(const Node* c) {
  Scalar s = detail::attr_scalar(c->attr(0));
  DType dtype = detail::attr_dtype(c->attr(1));
  bool wrapped = c->output()->type().wrapped_number;
  if (wrapped && s.kind() == dtype) return detail::wrap_scalar(s);
  Tensor t = scalar_tensor(s, dtype);
  t.impl()->wrapped_number = wrapped;
  return t;
}

// The constant attribute for a 0-dim tensor's value, in the representation its dtype uses.
AttrValue value_attr(const Tensor& t) {
  Scalar s = t.item();
  switch (t.dtype()) {
    case DType::Bool:
      return s.to<bool>();
    case DType::Int32:
    case DType::Int64:
      return s.to<int64_t>();
    case DType::Float32:
    case DType::Float64:
      return s.to<double>();
  }
  return std::monostate{};
}

bool foldable(const Node* n) {
  if (n->is_input() || n->is_constant() || n->subgraph() || !n->op().invoke ||
      passes::is_nondeterministic(n->op()) || n->num_outputs() != 1 || n->num_inputs() == 0)
    return false;
  const ValueType& out = n->output()->type();
  if (!out.sizes.empty() || out.device != kCPU) return false;
  for (const Value* in : n->inputs())
    if (!in || !in->node()->is_constant()) return false;
  return true;
}

}  // namespace

// One walk in graph order: a folded node's readers come later and then see a constant input, so
// chains of constant arithmetic fold in the same walk. The new constant takes the folded node's
// place; at the end the folded nodes go, with the constants nothing reads any more.
bool fold_constants(Graph& g, PassContext& ctx) {
  int64_t folded = 0;
  std::vector<Node*> replaced;
  for (Node* n = g.first(); n;) {
    if (!foldable(n)) {
      n = n->next();
      continue;
    }
    const ValueType type = n->output()->type();
    AttrValue value;
    try {
      EagerGuard eager;
      std::vector<Tensor> inputs;
      inputs.reserve(n->num_inputs());
      for (const Value* in : n->inputs()) inputs.push_back(constant_tensor(in->node()));
      std::vector<Tensor> out = n->op().invoke(inputs, n->attrs());
      // Anything but the recorded 0-dim type means the kernel disagrees with the graph: keep the
      // node rather than guess.
      if (out.size() != 1 || !out[0].defined() || !out[0].sizes().empty() ||
          out[0].dtype() != type.dtype) {
        n = n->next();
        continue;
      }
      value = value_attr(out[0]);
    } catch (const std::exception&) {
      n = n->next();
      continue;
    }
    Value* c = g.constant(value, type.dtype, type.wrapped_number, n);
    n->output()->replace_all_uses_with(c);
    replaced.push_back(n);
    ++folded;
    n = n->next();
  }
  passes::remove_dead_nodes(g, replaced);
  if (folded) ctx.count("constant_fold", folded);
  return folded > 0;
}

}  // namespace kiln::jit
