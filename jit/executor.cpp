// The unfused executor: runs a graph node by node through the reference kernels, releasing each
// value's slot after its last reader so the allocator can reuse the memory.
#include "jit/executor.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Recording off and autograd off while reference kernels run; restored on exit.
struct EagerScope {
  bool lazy = detail::lazy_mode();
  NoGradGuard no_grad;
  detail::EvaluationScope evaluating;
  EagerScope() { detail::set_lazy_mode(false); }
  ~EagerScope() { detail::set_lazy_mode(lazy); }
};

Tensor constant_tensor(const Node& n) {
  const ValueType& t = n.output()->type();
  Scalar value = detail::attr_scalar(n.attr(0));
  Tensor out = t.wrapped_number && t.dtype == value.kind() ? detail::wrap_scalar(value)
                                                           : scalar_tensor(value, t.dtype);
  out.impl()->wrapped_number = t.wrapped_number;
  return out;
}
}  // namespace

namespace {
// invoke_node without setting up the eager scope (the caller holds one).
std::vector<Tensor> invoke_in_scope(const Node& node, const std::vector<Tensor>& inputs) {
  if (node.is_constant()) return {constant_tensor(node)};
  const OpDef& op = node.op();
  KILN_CHECK(op.invoke, "jit: op '", op.name, "' has no reference kernel to run");
  std::vector<Tensor> out = op.invoke(inputs, node.attrs());
  KILN_CHECK(out.size() == node.num_outputs(), "jit: ", op.name, " returned ", out.size(),
             " values for ", node.num_outputs(), " outputs");
  return out;
}
}  // namespace

std::vector<Tensor> invoke_node(const Node& node, const std::vector<Tensor>& inputs) {
  EagerScope eager;
  return invoke_in_scope(node, inputs);
}

Plan::Plan(const Graph& graph) : graph_(graph) {
  // Slot assignment by liveness: a value takes a free slot when defined and frees it after its
  // last reader; graph outputs are never freed.
  std::vector<int64_t> free_slots;
  auto take_slot = [&]() -> int64_t {
    if (!free_slots.empty()) {
      int64_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return static_cast<int64_t>(num_slots_++);
  };
  std::vector<const Node*> order;
  for (const Node* n = graph.first(); n; n = n->next()) order.push_back(n);
  // Last step reading each value.
  absl::flat_hash_map<const Value*, size_t> last_use;
  for (size_t i = 0; i < order.size(); ++i)
    for (const Value* in : order[i]->inputs())
      if (in) last_use[in] = i;
  absl::flat_hash_map<const Value*, int64_t> slot_of;
  absl::flat_hash_set<int64_t> constant_slots;
  absl::flat_hash_set<const Value*> output_set(graph.outputs().begin(), graph.outputs().end());
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i];
    Step step{n, {}, {}, {}};
    for (const Value* in : n->inputs()) step.inputs.push_back(in ? slot_of.at(in) : -1);
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      const Value* v = n->output(k);
      // Constants are bound before the steps run, so their slots are never shared.
      int64_t s = n->is_constant() ? static_cast<int64_t>(num_slots_++) : take_slot();
      slot_of[v] = s;
      step.outputs.push_back(s);
      if (n->is_input()) input_slots_.push_back(s);
      // A value nobody reads (and no output) is released right away.
      if (!last_use.count(v) && !output_set.count(v)) step.release.push_back(s);
    }
    for (const Value* in : n->inputs()) {
      if (!in || output_set.count(in)) continue;
      auto it = last_use.find(in);
      if (it != last_use.end() && it->second == i) {
        int64_t s = slot_of.at(in);
        bool already = false;
        for (int64_t r : step.release) already |= r == s;
        if (!already) step.release.push_back(s);
      }
    }
    if (n->is_constant()) {
      // Made once with the plan, bound before the steps: its slot is never shared.
      constants_.push_back({step.outputs[0], constant_tensor(*n)});
      constant_storages_.insert(constants_.back().second.impl()->storage.get());
      constant_slots.insert(step.outputs[0]);
    }
    for (int64_t s : step.release)
      if (!constant_slots.contains(s)) free_slots.push_back(s);
    if (!n->is_input() && !n->is_constant()) steps_.push_back(std::move(step));
  }
  for (const Value* o : graph.outputs()) output_slots_.push_back(slot_of.at(o));
  // Input slots in graph-input order.
  input_slots_.clear();
  for (const Value* in : graph.inputs()) input_slots_.push_back(slot_of.at(in));
}

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(inputs.size() == input_slots_.size(), "jit: the graph takes ", input_slots_.size(),
             " inputs, got ", inputs.size());
  std::vector<Tensor> slots(num_slots_);
  for (size_t i = 0; i < inputs.size(); ++i)
    slots[static_cast<size_t>(input_slots_[i])] = inputs[i];
  for (const auto& [slot, value] : constants_) slots[static_cast<size_t>(slot)] = value;
  EagerScope eager;
  std::vector<Tensor> args;
  for (const Step& step : steps_) {
    args.clear();
    for (int64_t s : step.inputs) args.push_back(s < 0 ? Tensor() : slots[static_cast<size_t>(s)]);
    std::vector<Tensor> out = invoke_in_scope(*step.node, args);
    for (int64_t s : step.release) slots[static_cast<size_t>(s)] = Tensor();
    for (size_t k = 0; k < out.size(); ++k) {
      bool released = false;
      for (int64_t r : step.release) released |= r == step.outputs[k];
      if (!released) slots[static_cast<size_t>(step.outputs[k])] = std::move(out[k]);
    }
  }
  std::vector<Tensor> result;
  result.reserve(output_slots_.size());
  for (int64_t s : output_slots_) {
    Tensor t = slots[static_cast<size_t>(s)];
    // A plan's constants are reused by every run: callers get their own copy.
    if (t.defined() && constant_storages_.contains(t.impl()->storage.get())) t = t.clone();
    result.push_back(std::move(t));
  }
  return result;
}

std::vector<Tensor> run_graph(const Graph& graph, const std::vector<Tensor>& inputs) {
  return Plan(graph).run(inputs);
}

}  // namespace kiln::jit
