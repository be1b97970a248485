// Forward/backward splitting of a joint graph (see differentiate.h).
//
// The joint graph comes from recording a function and then its gradients with the ops' own
// gradient formulas (the ones eager autograd runs), on pending placeholders: the gradients of the
// function's outputs are placeholders too, so every node that depends on one of them is backward
// work and every other node forward work. The backward reads forward values; each is either saved
// (the forward returns it as well) or recomputed by the backward from what is saved. Recomputing
// an elementwise chain costs nothing but arithmetic once the backward's kernels fuse it, while
// saving it costs a write in the forward and a read in the backward per value; GEMMs and
// reductions are saved, since recomputing them would cost their whole input again. An elementwise
// value that a GEMM reads on both sides (a layer's activation: the next layer's input in the
// forward, the weight gradient's operand in the backward) is saved too: the forward writes it out
// for its GEMM anyway, and recomputing it would be a kernel of its own in the backward, writing
// the same values out again for the backward's GEMM.
#include "jit/differentiate.h"

#include "jit/log.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/passes/rewriter.h"
#include "kiln/error.h"

namespace kiln::jit {

bool cheap_to_recompute(const OpDef& op) {
  if (passes::is_nondeterministic(op)) return false;
  if (op.kind == detail::OpKind::View) return true;
  return (op.kind == detail::OpKind::Unary || op.kind == detail::OpKind::Binary) &&
         op.formula != nullptr;
}

bool recompute_in_backward(const Node& n) {
  return n.is_constant() || cheap_to_recompute(n.op());
}

std::unique_ptr<Graph> extract(const Graph& g, const std::vector<const Value*>& outputs,
                               const std::vector<const Value*>& cut,
                               std::vector<int64_t>* input_origin) {
  absl::flat_hash_map<const Value*, size_t> cut_index;
  for (size_t k = 0; k < cut.size(); ++k) cut_index.emplace(cut[k], k);
  absl::flat_hash_set<const Node*> needed;
  std::vector<const Node*> stack;
  auto visit = [&](const Value* v) {
    if (!v || cut_index.contains(v)) return;
    if (needed.insert(v->node()).second) stack.push_back(v->node());
  };
  for (const Value* v : outputs) visit(v);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Value* in : n->inputs()) visit(in);
  }
  auto out = std::make_unique<Graph>();
  absl::flat_hash_map<const Value*, Value*> map;
  input_origin->clear();
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Value* in = g.inputs()[i];
    if (!needed.contains(in->node())) continue;
    map[in] = out->add_input(in->type());
    input_origin->push_back(static_cast<int64_t>(i));
  }
  for (size_t k = 0; k < cut.size(); ++k) {
    map[cut[k]] = out->add_input(cut[k]->type());
    input_origin->push_back(-1 - static_cast<int64_t>(k));
  }
  std::vector<Value*> inputs;
  for (const Node* n = g.first(); n; n = n->next()) {
    if (!needed.contains(n) || n->is_input()) continue;
    KILN_CHECK(!n->subgraph(), "jit: cannot split a graph that holds fusion groups");
    inputs.clear();
    for (const Value* in : n->inputs()) inputs.push_back(in ? map.at(in) : nullptr);
    std::vector<ValueType> types;
    for (const auto& v : n->outputs()) types.push_back(v->type());
    Node* copy = out->create(n->op(), inputs, n->attrs(), std::move(types));
    for (size_t i = 0; i < n->num_outputs(); ++i) map.try_emplace(n->output(i), copy->output(i));
  }
  for (const Value* v : outputs) out->add_output(map.at(v));
  return out;
}

Differentiated split_forward_backward(const Graph& joint, size_t num_forward_outputs,
                                      const std::vector<bool>& is_grad_input) {
  KILN_CHECK(is_grad_input.size() == joint.inputs().size(),
             "jit: split_forward_backward needs a flag per graph input");
  KILN_CHECK(num_forward_outputs <= joint.outputs().size(),
             "jit: more forward outputs than graph outputs");
  // Backward nodes: those that depend on an output gradient.
  absl::flat_hash_set<const Node*> backward;
  for (size_t i = 0; i < joint.inputs().size(); ++i)
    if (is_grad_input[i]) backward.insert(joint.inputs()[i]->node());
  for (const Node* n = joint.first(); n; n = n->next()) {
    if (n->is_input()) continue;
    for (const Value* in : n->inputs())
      if (in && backward.contains(in->node())) {
        backward.insert(n);
        break;
      }
  }
  // Whether a GEMM on the forward (backward) side reads v, directly or through views.
  auto read_by_gemm = [&](const Value* v, bool backward_side) {
    std::vector<const Value*> views{v};
    while (!views.empty()) {
      const Value* x = views.back();
      views.pop_back();
      for (const Use& u : x->uses()) {
        const detail::OpKind kind = u.user->op().kind;
        if (kind == detail::OpKind::Linalg && backward.contains(u.user) == backward_side)
          return true;
        if (kind == detail::OpKind::View && u.user->num_outputs() == 1)
          views.push_back(u.user->output());
      }
    }
    return false;
  };
  // Forward values the backward reads: through recomputable nodes down to saved values, graph
  // inputs and constants.
  std::vector<const Value*> saved;
  absl::flat_hash_set<const Value*> seen;
  std::vector<const Value*> work;
  int64_t recomputed = 0;
  for (const Node* n = joint.first(); n; n = n->next()) {
    if (!backward.contains(n) || n->is_input()) continue;
    for (const Value* in : n->inputs())
      if (in && !backward.contains(in->node())) work.push_back(in);
  }
  // Gradients that do not depend on any output gradient (a zero, a constant) are read as well.
  for (size_t k = num_forward_outputs; k < joint.outputs().size(); ++k)
    if (!backward.contains(joint.outputs()[k]->node())) work.push_back(joint.outputs()[k]);
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    if (!seen.insert(v).second) continue;
    const Node* p = v->node();
    if (p->is_input() || p->is_constant()) continue;
    const bool materialized = p->op().kind != detail::OpKind::View && !p->is_constant() &&
                              read_by_gemm(v, false) && read_by_gemm(v, true);
    if (recompute_in_backward(*p) && !materialized) {
      ++recomputed;
      for (const Value* in : p->inputs())
        if (in) work.push_back(in);
    } else {
      saved.push_back(v);
      if (log_enabled("fuser"))
        log("fuser", "backward: saves %", v->id(), " ", v->type().str(), " = ", p->kind(),
            materialized
                ? " (written out for a GEMM in the forward, read by one in the backward)"
                : " (not recomputable in a fused kernel: a GEMM, reduction or random draw)");
    }
  }
  log("fuser", "backward: ", saved.size(), " forward value(s) saved, ", recomputed,
      " elementwise/view value(s) recomputed inside the backward instead of saved");
  Differentiated d;
  d.num_saved = saved.size();
  std::vector<const Value*> forward_outputs(joint.outputs().begin(),
                                            joint.outputs().begin() + num_forward_outputs);
  forward_outputs.insert(forward_outputs.end(), saved.begin(), saved.end());
  d.forward = extract(joint, forward_outputs, {}, &d.forward_inputs);
  const std::vector<const Value*> gradients(joint.outputs().begin() + num_forward_outputs,
                                            joint.outputs().end());
  d.backward = extract(joint, gradients, saved, &d.backward_inputs);
  return d;
}

}  // namespace kiln::jit
