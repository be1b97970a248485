// Type inference for IR nodes: the op's own code computes the output types, by recording a call on
// pending placeholders of the input types (nothing runs), so there is one source of truth.
#include "jit/infer.h"

#include "kiln/autograd.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Ops that record every call lazily, so inferring their types never needs data.
bool infers_without_data(const Node& n) {
  using detail::OpKind;
  const OpKind k = n.op().kind;
  return n.op().invoke && (k == OpKind::Unary || k == OpKind::Binary || k == OpKind::Ternary ||
                           k == OpKind::Reduction || k == OpKind::View);
}

// A pending tensor of type t whose producer can never run (inference never reads data).
Tensor placeholder(const ValueType& t) {
  Tensor p = detail::lazy_record1(input_op(), {}, {int64_t{-1}}, {t.sizes, t.dtype});
  p.impl()->wrapped_number = t.wrapped_number;
  return p;
}
}  // namespace

std::optional<std::vector<ValueType>> infer_output_types(const Node& n) {
  if (!infers_without_data(n)) return std::nullopt;
  for (const Value* in : n.inputs())
    if (!in || !in->type().device.is_cpu()) return std::nullopt;
  // Recording on, autograd off, and no flush may run while a graph is being checked.
  const bool lazy = detail::lazy_mode();
  detail::set_lazy_mode(true);
  NoGradGuard no_grad;
  detail::EvaluationScope no_flush;
  std::vector<ValueType> out;
  try {
    detail::InferenceScope inferring;
    std::vector<Tensor> inputs;
    for (const Value* in : n.inputs()) inputs.push_back(placeholder(in->type()));
    for (const Tensor& t : n.op().invoke(inputs, n.attrs()))
      out.push_back(ValueType{t.dtype(), t.sizes(), t.device(), false});
  } catch (const detail::NeedsData&) {
    // A check that reads values (integer division by zero): the types cannot be inferred here.
    detail::set_lazy_mode(lazy);
    return std::nullopt;
  } catch (...) {
    detail::set_lazy_mode(lazy);
    throw;
  }
  detail::set_lazy_mode(lazy);
  return out;
}

void verify_types(const Graph& g) {
  for (const Node* n = g.first(); n; n = n->next()) {
    auto inferred = infer_output_types(*n);
    if (!inferred) continue;
    KILN_CHECK(inferred->size() == n->num_outputs(), "jit verify: ", n->kind(), " has ",
               n->num_outputs(), " outputs but its op gives ", inferred->size());
    for (size_t i = 0; i < inferred->size(); ++i) {
      const ValueType& have = n->output(i)->type();
      const ValueType& want = (*inferred)[i];
      KILN_CHECK(have.dtype == want.dtype && have.sizes == want.sizes, "jit verify: %",
                 n->output(i)->id(), " = ", n->kind(), "(...) is typed ", have.str(),
                 " but the op gives ", want.str(), " for its inputs");
    }
  }
}

}  // namespace kiln::jit
