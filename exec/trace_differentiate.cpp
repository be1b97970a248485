// jit::differentiate: a graph's gradient graphs, made by tracing an op-by-op run of the graph
// with autograd on (the same recording of gradient formulas a differentiable trace uses).
#include "absl/container/flat_hash_map.h"
#include "exec/specialization.h"
#include "jit/differentiate.h"
#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/jit.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Runs g's nodes through their ops' entry points, so that in trace mode each records its node and,
// with autograd on, its gradient formula. A tensor constant becomes its number converted by `to`
// (a recorded op), so the trace captures nothing and every graph input stays an argument.
std::vector<Tensor> interpret(const Graph& g, const std::vector<Tensor>& inputs) {
  absl::flat_hash_map<const Value*, Tensor> values;
  for (size_t i = 0; i < g.inputs().size(); ++i) values[g.inputs()[i]] = inputs[i];
  for (Node* n = g.first(); n; n = n->next()) {
    if (n->is_input()) continue;
    if (n->is_constant()) {
      const ValueType& t = n->output()->type();
      Tensor number = detail::wrap_scalar(detail::attr_scalar(n->attr(0)));
      values[n->output()] =
          t.wrapped_number && t.dtype == number.dtype() ? number : number.to(t.dtype);
      continue;
    }
    std::vector<Tensor> operands;
    for (const Value* v : n->inputs()) operands.push_back(v ? values.at(v) : Tensor());
    std::vector<Tensor> results = n->op().invoke(operands, n->attrs());
    for (size_t k = 0; k < results.size(); ++k) values[n->output(k)] = results[k];
  }
  std::vector<Tensor> outputs;
  for (const Value* v : g.outputs()) outputs.push_back(values.at(v));
  return outputs;
}
}  // namespace

GraphGradient differentiate(const Graph& g, std::vector<bool> wrt) {
  if (wrt.empty())
    for (const Value* v : g.inputs()) wrt.push_back(is_floating_point(v->type().dtype));
  KILN_CHECK(wrt.size() == g.inputs().size(), "jit::differentiate: ", wrt.size(),
             " flags for a graph of ", g.inputs().size(), " inputs");
  std::vector<Tensor> examples;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ValueType& t = g.inputs()[i]->type();
    KILN_CHECK(!wrt[i] || is_floating_point(t.dtype), "jit::differentiate: input ", i, " (",
               t.str(), ") is not of a floating type and has no gradient");
    Tensor e = zeros(t.sizes, t.dtype);
    if (wrt[i]) e.requires_grad_(true);
    examples.push_back(e);
  }
  for (Node* n = g.first(); n; n = n->next())
    KILN_CHECK(!n->subgraph() && (n->is_input() || n->is_constant() || n->op().invoke),
               "jit::differentiate: node ", n->kind(),
               " cannot be run op by op (differentiate a graph before fusion)");
  FunctionImpl impl;
  impl.fn = [&g](const std::vector<Tensor>& in) { return interpret(g, in); };
  std::unique_ptr<Specialization> spec;
  {
    AutoGradMode grad_on(true);
    spec = impl.specialize(examples, /*plan=*/false);
  }
  GraphGradient result;
  auto constant = [&result](const Tensor& t) {
    for (size_t k = 0; k < result.constants.size(); ++k)
      if (result.constants[k].is_same(t)) return GraphGradient::Source{GraphGradient::kConstant, k};
    result.constants.push_back(t);
    return GraphGradient::Source{GraphGradient::kConstant, result.constants.size() - 1};
  };
  for (size_t k = 0; k < spec->arguments.size(); ++k) {
    const int64_t a = spec->arguments[k];
    result.forward_inputs.push_back(
        a >= 0 ? GraphGradient::Source{GraphGradient::kInput, static_cast<size_t>(a)}
               : constant(spec->captures[k]));
  }
  for (OutputKind k : spec->kinds) result.num_saved += k == OutputKind::Saved;
  result.forward = std::move(spec->graph);
  if (spec->backward) {
    if (spec->backward->error) std::rethrow_exception(spec->backward->error);
    auto& b = const_cast<Backward&>(*spec->backward);
    for (const BackwardSource& src : b.sources) {
      switch (src.kind) {
        case BackwardSource::kOutputGrad:
          result.backward_inputs.push_back({GraphGradient::kOutputGrad, b.outputs[src.index]});
          break;
        case BackwardSource::kArgument:
          result.backward_inputs.push_back({GraphGradient::kInput, src.index});
          break;
        case BackwardSource::kSaved:
          result.backward_inputs.push_back({GraphGradient::kSaved, src.index});
          break;
        case BackwardSource::kCapture:
          result.backward_inputs.push_back(constant(src.capture));
          break;
      }
    }
    for (size_t w : b.gradient_of) {
      KILN_CHECK(b.wrt_arguments[w] >= 0, "jit::differentiate: a gradient of a captured tensor");
      result.gradient_of.push_back(static_cast<size_t>(b.wrt_arguments[w]));
    }
    result.differentiated_outputs = b.outputs;
    result.backward = std::move(b.graph);
  }
  return result;
}

}  // namespace kiln::jit
