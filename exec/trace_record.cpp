// Tracing: records a function once on pending placeholders (with, for a differentiable one, its
// gradients), and optimizes and plans the recorded graphs into a Specialization.
//
// Tracing is abstract: the function runs on placeholders in trace mode, where every op records a
// node and nothing is computed or written. In-place writes are recorded functionally
// (lib/lazy.cpp, trace_assign): a written storage's value becomes a node, and the trace's graph
// outputs that value so each replay writes it back into the captured tensor. A leaf's .grad that
// the function reads or a backward adds to is a graph input read at each call (detail::TracedGrad),
// and what the function leaves in it an output that each call assigns or writes in place. When the
// trace ends, every captured tensor and .grad is restored to what it was before the trace, so
// tracing has no side effects.
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <iostream>
#include <optional>

#include "exec/exec_state.h"
#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "exec/specialization.h"
#include "jit/differentiate.h"
#include "jit/dump.h"
#include "jit/infer.h"
#include "jit/log.h"
#include "jit/passes/passes.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/profiler.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Leaves trace mode and undoes what tracing did to captured tensors, also on an exception.
struct TraceScope {
  detail::TraceState state;
  bool lazy = detail::lazy_mode();
  TraceScope() {
    KILN_CHECK(!detail::trace_mode(), "jit::trace: traces cannot be nested");
    detail::set_lazy_mode(true);
    detail::set_trace_state(&state);
  }
  ~TraceScope() {
    detail::set_trace_state(nullptr);
    detail::set_lazy_mode(lazy);
    detail::LazyLock lock;
    for (size_t k = 0; k < state.written.size(); ++k) {
      detail::Storage& s = *state.written[k];
      detail::set_storage_lazy(s, detail::LazyRef{}, true);
      s.version.store(state.written_versions[k]);
    }
    detail::end_traced_grads();
    // The autograd history in-place ops gave tensors inside reaches the placeholders: a tensor
    // that outlives the trace (a capture, a constant the plan holds) must not keep it.
    detail::restore_traced_histories();
  }
};

// The storages among those the traced function wrote that it allocated itself and that nothing
// outside the trace holds when it returns (a zeros buffer it fills in place): their writes are the
// function's own, not state to write back, so each replay starts again from the factory's value.
// Inside the trace, tensors over such a storage are held only by recorded nodes' inputs and by the
// returned values; any other reference (an optimizer's state, a variable the function assigned)
// means the storage escapes and is written back. An autograd node that saved such a tensor also
// counts as outside: conservative, the write is then kept.
absl::flat_hash_set<const detail::Storage*> local_storages(const detail::TraceState& state,
                                                           const std::vector<Tensor>& returned) {
  absl::flat_hash_set<const detail::Storage*> candidates;
  for (const auto& storage : state.written)
    if (state.created.count(storage.get())) candidates.insert(storage.get());
  if (candidates.empty()) return candidates;
  struct Held {
    int64_t inside = 0;  // references from nodes and returned values
    int64_t total = 0;   // all references
  };
  absl::flat_hash_map<const detail::TensorImpl*, Held> held;
  auto note = [&](const Tensor& t) {
    if (!t.defined() || !candidates.contains(t.impl()->storage.get())) return;
    Held& h = held[t.impl()];
    ++h.inside;
    h.total = t.impl_ptr().use_count();
  };
  std::vector<const detail::LazyNode*> stack;
  absl::flat_hash_set<const detail::LazyNode*> seen;
  auto visit = [&](const detail::LazyRef& r) {
    if (r.node && seen.insert(r.node.get()).second) stack.push_back(r.node.get());
  };
  for (const Tensor& t : returned) {
    note(t);
    if (t.defined()) visit(t.impl()->storage->lazy);
  }
  for (const auto& storage : state.written) visit(storage->lazy);
  while (!stack.empty()) {
    const detail::LazyNode* n = stack.back();
    stack.pop_back();
    for (const detail::LazyInput& in : n->inputs) {
      note(in.tensor);
      visit(in.ref);
    }
  }
  // A view held inside holds its base: that reference is inside too.
  std::vector<const detail::TensorImpl*> views;
  for (const auto& [impl, h] : held)
    if (impl->view_base) views.push_back(impl);
  for (const detail::TensorImpl* v : views)
    for (; v->view_base; v = v->view_base.get()) {
      Held& h = held[v->view_base.get()];
      ++h.inside;
      h.total = v->view_base.use_count();
    }
  for (const auto& storage : state.written) {
    if (!candidates.contains(storage.get())) continue;
    int64_t impls = 0;
    bool outside = false;
    for (const auto& [impl, h] : held) {
      if (impl->storage.get() != storage.get()) continue;
      ++impls;
      outside = outside || h.total != h.inside;
    }
    // One reference is state.written's own.
    if (outside || storage.use_count() != 1 + impls) candidates.erase(storage.get());
  }
  return candidates;
}

// A captured tensor written in place with autograd on: eager mode gives it a history that reaches
// the function's inputs, and a replay, which writes back its value, could not, so gradients
// through it would be lost. (A tensor the function allocated gets its history inside the graph.)
void check_written_histories(const detail::TraceState& state) {
  for (const std::shared_ptr<detail::TensorImpl>& impl : detail::tensors_given_traced_history()) {
    const detail::Storage* storage = impl->storage.get();
    bool written = false;
    for (const auto& w : state.written) written = written || w.get() == storage;
    KILN_CHECK(!written || state.created.count(storage),
               "jit::trace: the traced function writes, with autograd on, a value that requires "
               "grad into ",
               detail::describe(Tensor(impl)),
               ", a tensor it captured; a replay writes the value back but could not give the "
               "tensor the autograd history eager mode does, so gradients through it would be "
               "lost. Write it under kiln::NoGradGuard, or return the value instead");
  }
}

// How a call replays what the traced function did to one leaf's .grad (read while still tracing).
GradSlot grad_slot(const detail::TracedGrad& r) {
  GradSlot slot;
  if (r.argument < 0) slot.leaf = r.leaf;
  slot.argument = r.argument;
  slot.input = r.input;
  if (r.initial.defined())
    slot.traced = InputKey{r.initial.dtype(), r.initial.sizes(), r.initial.device(), false};
  const Tensor& now = r.leaf->autograd->grad;
  if (now.defined() && now.is_same(r.initial)) {
    // The .grad it found, written in place when its value is no longer the placeholder's.
    if (detail::lazy_input(now).ref.node->op != &input_op()) slot.write = GradSlot::Write::kInPlace;
  } else if (now.defined()) {
    slot.write = GradSlot::Write::kAssign;
  } else if (r.assigned) {
    slot.write = GradSlot::Write::kClear;
  }
  slot.guarded = r.observed || slot.write == GradSlot::Write::kInPlace;
  return slot;
}

// The gradients of `outputs` for each of `wrt` (from `output_grads`) when differentiating them
// all at once raised: each output and input alone tells which gradients raise (fails[j][w]), and
// each input's gradient is then taken from the outputs whose gradient for it does not.
std::vector<Tensor> gradients_around_failures(const std::vector<Tensor>& outputs,
                                              const std::vector<Tensor>& wrt,
                                              const std::vector<Tensor>& output_grads,
                                              std::vector<std::vector<bool>>& fails) {
  auto differentiates = [](const std::vector<Tensor>& outs, const Tensor& w,
                           const std::vector<Tensor>& grads) -> std::optional<Tensor> {
    try {
      return autograd::grad(outs, {w}, grads, /*retain_graph=*/true, /*create_graph=*/false,
                            /*allow_unused=*/true)[0];
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  fails.assign(outputs.size(), std::vector<bool>(wrt.size(), false));
  std::vector<Tensor> gradients(wrt.size());
  for (size_t w = 0; w < wrt.size(); ++w) {
    std::vector<Tensor> outs, grads;
    for (size_t j = 0; j < outputs.size(); ++j) {
      fails[j][w] = !differentiates({outputs[j]}, wrt[w], {output_grads[j]});
      if (fails[j][w]) continue;
      outs.push_back(outputs[j]);
      grads.push_back(output_grads[j]);
    }
    if (outs.empty()) continue;
    std::optional<Tensor> g = differentiates(outs, wrt[w], grads);
    KILN_CHECK(g,
               "jit::trace: differentiating the returned values together raised where each "
               "alone did not");
    gradients[w] = *g;
  }
  return gradients;
}

// The node output that holds t's value, recording a copy when t is a concrete tensor (a capture
// returned as is) so that every output is computed by the graph.
detail::LazyRef value_ref(const Tensor& t) {
  detail::LazyInput in = detail::lazy_input(t);
  if (in.ref) return in.ref;
  return detail::lazy_input(t.clone()).ref;
}
}  // namespace

std::vector<int64_t> in_place_inputs(const Specialization& s) {
  std::vector<int64_t> in_place(s.kinds.size(), -1);
  for (size_t k = 0; k < s.kinds.size(); ++k) {
    if (s.kinds[k] != OutputKind::WriteBack) continue;
    const detail::Storage* storage = s.write_targets[k].impl()->storage.get();
    int64_t found = -1, sharing = 0;
    for (size_t j = 0; j < s.captures.size(); ++j) {
      const Tensor& c = s.captures[j];
      if (!c.defined() || c.impl()->storage.get() != storage) continue;
      ++sharing;
      if (s.arguments[j] < 0 && c.is_contiguous() && c.storage_offset() == 0 &&
          c.dtype() == s.write_targets[k].dtype() && c.numel() == s.write_targets[k].numel())
        found = static_cast<int64_t>(j);
    }
    if (sharing == 1) in_place[k] = found;
  }
  return in_place;
}

namespace {
// One trace of a function on its example inputs (FunctionImpl::specialize), in named steps:
// record the function inside a TraceScope, then optimize and plan its graphs.
class Tracer {
 public:
  Tracer(FunctionImpl& f, const std::vector<Tensor>& inputs)
      : f_(f), spec_(std::make_unique<Specialization>()), backward_(std::make_shared<Backward>()) {
    for (const Tensor& t : inputs) spec_->key.push_back(key_of(t));
  }

  // Runs the function on placeholders and builds the graph of what it returned, wrote and left
  // in .grads (and, differentiable, of its gradients), split into a forward and a backward.
  void record(const std::vector<Tensor>& inputs) {
    TraceScope scope;
    scope.state.examples = inputs;
    const std::vector<Tensor> placeholders = make_placeholders(inputs);
    detail::begin_traced_grads(placeholders);
    const detail::BackwardPasses before = detail::backward_passes();
    std::vector<Tensor> outputs = f_.fn(placeholders);
    // A function that runs a backward of its own (backward(), autograd::grad) needs autograd on
    // for it, as in eager mode: its specialization serves calls in its own mode only. One whose
    // backward freed the graph its loss came from returns plain values, as torch.compile's does;
    // one whose backward kept it (create_graph, retain_graph) is differentiated like any other.
    const detail::BackwardPasses after = detail::backward_passes();
    spec_->runs_backward = after.started != before.started;
    const bool graph_freed = after.freed_graph != before.freed_graph;
    const absl::flat_hash_set<const detail::Storage*> local = local_storages(scope.state, outputs);
    check_written_histories(scope.state);
    spec_->frees = detail::traced_frees();
    request_forward(scope.state, outputs, local);
    // A function whose returned values require grad (and whose own backward, if any, kept its
    // graph) is differentiable: its gradients are recorded now, from output-gradient placeholders,
    // with the ops' own gradient formulas, and become the backward graph.
    spec_->grad_mode = detail::grad_mode();
    const size_t num_forward = requests_.size();
    std::vector<Tensor> wrt;
    if (spec_->grad_mode && !graph_freed) wrt = differentiated_inputs(scope, outputs, placeholders);
    // Placeholders past the call's arguments: the hyperparameters and .grads read, then output
    // gradients.
    const size_t num_arguments = scope.state.examples.size();
    spec_->scalars = scope.state.scalars;
    spec_->flags = scope.state.flags;
    if (!wrt.empty()) request_gradients(scope.state, outputs, wrt, num_arguments);
    f_.warnings.insert(f_.warnings.end(), scope.state.warnings.begin(), scope.state.warnings.end());
    for (const std::string& w : scope.state.warnings) std::cerr << "kiln warning: " << w << '\n';
    // The graph, built while the trace's values are still in place.
    const LazyGraphBinding binding = build_traced_graph(scope.state);
    mark_fresh_returns(outputs, placeholders, binding, scope.state);
    if (!gradient_request_of_.empty()) split_backward(binding, num_forward, num_arguments);
  }

  // Which returned values the function computed (Specialization::fresh_returns): those over a
  // storage that is neither an argument's nor that of a tensor from before the trace.
  void mark_fresh_returns(const std::vector<Tensor>& outputs,
                          const std::vector<Tensor>& placeholders, const LazyGraphBinding& binding,
                          const detail::TraceState& state) {
    absl::flat_hash_set<const detail::Storage*> outside;
    for (const Tensor& p : placeholders) outside.insert(p.impl()->storage.get());
    for (const Tensor& c : binding.inputs)
      if (c.defined() && !state.created.count(c.impl()->storage.get()))
        outside.insert(c.impl()->storage.get());
    for (const Tensor& t : outputs)
      spec_->fresh_returns.push_back(!outside.contains(t.impl()->storage.get()));
  }

  // Optimizes the recorded graphs and, when `plan`, plans them.
  std::unique_ptr<Specialization> finish(bool plan) {
    if (backward_->graph) {
      name_graph(*backward_->graph, [&] { return graph_name("backward"); });
      run_passes(*backward_->graph);
      if (verify_passes()) verify_types(*backward_->graph);
      if (plan) backward_->plan = std::make_unique<Plan>(*backward_->graph);
    }
    if (backward_->graph || backward_->error) spec_->backward = std::move(backward_);
    name_graph(*spec_->graph, [&] {
      std::string name = graph_name(spec_->runs_backward ? "forward+backward" : "forward");
      const auto writes =
          std::count(spec_->kinds.begin(), spec_->kinds.end(), OutputKind::WriteBack);
      if (writes) name += ", writes " + std::to_string(writes) + " captured tensor(s) in place";
      return name;
    });
    run_passes(*spec_->graph);
    if (verify_passes()) verify_types(*spec_->graph);
    if (plan) spec_->plan = std::make_unique<Plan>(*spec_->graph, in_place_inputs(*spec_));
    exec_state().traces.fetch_add(1);
    return std::move(spec_);
  }

 private:
  static std::vector<Tensor> make_placeholders(const std::vector<Tensor>& inputs) {
    std::vector<Tensor> placeholders;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor p = detail::trace_placeholder(input_op(), static_cast<int64_t>(i), inputs[i]);
      if (inputs[i].requires_grad()) p.requires_grad_(true);
      placeholders.push_back(p);
    }
    return placeholders;
  }

  // What a call's run must compute: the returned values, the final value of each written storage
  // that is not the function's own, and each .grad the function assigned or wrote in place.
  void request_forward(const detail::TraceState& state, const std::vector<Tensor>& outputs,
                       const absl::flat_hash_set<const detail::Storage*>& local) {
    for (const Tensor& t : outputs) {
      KILN_CHECK(t.defined(), "jit::trace: the traced function returned an undefined tensor");
      add_request(value_ref(t), OutputKind::Return);
    }
    for (const auto& storage : state.written) {
      if (local.contains(storage.get())) continue;
      add_request(storage->lazy, OutputKind::WriteBack);
      const detail::LazyType& t = storage->lazy.node->outputs[storage->lazy.index];
      spec_->write_targets.back() = detail::flat_storage_tensor(storage, t.dtype);
    }
    for (const detail::TracedGrad& r : detail::traced_grads()) {
      GradSlot slot = grad_slot(r);
      if (slot.write == GradSlot::Write::kAssign || slot.write == GradSlot::Write::kInPlace) {
        add_request(value_ref(r.leaf->autograd->grad), OutputKind::Grad);
        spec_->grad_slot_of.back() = spec_->grad_slots.size();
      }
      spec_->grad_slots.push_back(std::move(slot));
    }
  }

  void add_request(detail::LazyRef ref, OutputKind kind) {
    requests_.push_back(std::move(ref));
    spec_->kinds.push_back(kind);
    spec_->write_targets.emplace_back();
    spec_->grad_slot_of.emplace_back();
  }

  // The differentiated outputs (returned values that require grad), and the inputs they are
  // differentiated for: the arguments that require grad, then the captured tensors that do
  // (parameters: the inputs of the returned values' graph that no argument binds).
  std::vector<Tensor> differentiated_inputs(const TraceScope& scope,
                                            const std::vector<Tensor>& outputs,
                                            const std::vector<Tensor>& placeholders) {
    std::vector<Tensor> wrt;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && is_floating_point(outputs[i].dtype()))
        backward_->outputs.push_back(i);
    if (backward_->outputs.empty()) return wrt;
    for (size_t i = 0; i < placeholders.size(); ++i) {
      if (!placeholders[i].requires_grad()) continue;
      wrt.push_back(placeholders[i]);
      backward_->wrt_arguments.push_back(static_cast<int64_t>(i));
      backward_->wrt_captures.emplace_back();
    }
    std::vector<detail::LazyRef> returned(requests_.begin(),
                                          requests_.begin() + static_cast<int64_t>(outputs.size()));
    LazyGraphBinding returned_binding;
    build_graph(returned, &returned_binding, false, nullptr);
    for (size_t k = 0; k < returned_binding.inputs.size(); ++k) {
      const Tensor& t = returned_binding.inputs[k];
      if (returned_binding.arguments[k] >= 0 || !t.requires_grad()) continue;
      // A tensor the function allocated is a constant of the trace: the history it got from
      // an in-place op inside (c = full_like(a, 1); c.sub_(b)) is the trace's own, recorded
      // through its other inputs, and ends with the trace (TraceScope).
      if (scope.state.created.count(t.impl()->storage.get())) continue;
      wrt.push_back(t);
      backward_->wrt_arguments.push_back(-1);
      backward_->wrt_captures.push_back(t);
    }
    for (size_t i : backward_->outputs)
      if (const detail::AutogradMeta* m = detail::autograd_meta(outputs[i]); m && m->retains_grad)
        backward_->retained.push_back(i);
    return wrt;
  }

  // Records the gradients of the differentiated outputs for `wrt`, from output-gradient
  // placeholders (graph inputs after the call's `num_arguments`), and requests each.
  void request_gradients(detail::TraceState& state, const std::vector<Tensor>& outputs,
                         std::vector<Tensor> wrt, size_t num_arguments) {
    std::vector<Tensor> diff_outputs, output_grads;
    for (size_t j = 0; j < backward_->outputs.size(); ++j) {
      const Tensor& out = outputs[backward_->outputs[j]];
      diff_outputs.push_back(out);
      state.examples.push_back(zeros(out.sizes(), TensorOptions(out.dtype()).device(out.device())));
      output_grads.push_back(detail::trace_placeholder(
          input_op(), static_cast<int64_t>(num_arguments + j), state.examples.back()));
    }
    // The retained outputs' gradients are taken as those of inputs: all that reaches them.
    for (size_t i : backward_->retained) wrt.push_back(outputs[i]);
    std::vector<Tensor> grads;
    try {
      grads = autograd::grad(diff_outputs, wrt, output_grads,
                             /*retain_graph=*/true, /*create_graph=*/false,
                             /*allow_unused=*/true);
    } catch (const Error&) {
      backward_->error = std::current_exception();
      grads = gradients_around_failures(diff_outputs, wrt, output_grads, backward_->fails);
    }
    for (size_t w = 0; w < grads.size(); ++w) {
      if (!grads[w].defined()) continue;
      requests_.push_back(value_ref(grads[w]));
      gradient_request_of_.push_back(w);
    }
  }

  // The graph of every request, its outputs in request order, and what its inputs are bound to.
  LazyGraphBinding build_traced_graph(const detail::TraceState& state) {
    LazyGraphBinding binding;
    spec_->graph = build_graph(requests_, &binding, false, nullptr);
    // Graph outputs in request order (build_graph lists each node's outputs once).
    std::vector<Value*> by_request;
    for (const detail::LazyRef& r : requests_) {
      Value* found = nullptr;
      for (size_t k = 0; k < binding.outputs.size() && !found; ++k)
        if (binding.outputs[k].node == r.node && binding.outputs[k].index == r.index)
          found = spec_->graph->outputs()[k];
      KILN_CHECK(found, "jit::trace: an output of the traced function was not recorded");
      by_request.push_back(found);
    }
    spec_->graph->clear_outputs();
    for (Value* v : by_request) spec_->graph->add_output(v);
    // A tensor the function allocated is held without the autograd history an in-place op gave
    // it inside (fill_ makes its constant value self's history): that history reaches the
    // trace's placeholders, which must not outlive it. Detached here, before the captures of
    // the forward and of the backward are taken from the binding.
    for (Tensor& c : binding.inputs)
      if (c.defined() && state.created.count(c.impl()->storage.get())) c = c.detach();
    spec_->arguments = binding.arguments;
    spec_->captures = binding.inputs;
    // A .grad the graph reads must be there at each call, as it was when traced.
    for (GradSlot& g : spec_->grad_slots)
      for (int64_t a : binding.arguments) g.guarded = g.guarded || (g.input >= 0 && a == g.input);
    return binding;
  }

  // Splits the graph of the function and its gradients into an augmented forward and a backward.
  void split_backward(const LazyGraphBinding& binding, size_t num_forward, size_t num_arguments) {
    std::vector<bool> is_output_grad;
    for (int64_t a : binding.arguments)
      is_output_grad.push_back(a >= static_cast<int64_t>(num_arguments));
    Differentiated d = split_forward_backward(*spec_->graph, num_forward, is_output_grad);
    spec_->graph = std::move(d.forward);
    spec_->arguments.clear();
    spec_->captures.clear();
    for (int64_t origin : d.forward_inputs) {
      spec_->arguments.push_back(binding.arguments[static_cast<size_t>(origin)]);
      spec_->captures.push_back(binding.inputs[static_cast<size_t>(origin)]);
    }
    for (size_t k = 0; k < d.num_saved; ++k) {
      spec_->kinds.push_back(OutputKind::Saved);
      spec_->write_targets.emplace_back();
      spec_->grad_slot_of.emplace_back();
    }
    for (int64_t origin : d.backward_inputs)
      backward_->sources.push_back(backward_source(binding, origin, num_arguments));
    backward_->gradient_of = gradient_request_of_;
    backward_->graph = std::move(d.backward);
    log("fuser", "differentiable trace: ", d.num_saved, " value(s) saved for the backward, ",
        backward_->graph->size(), " backward nodes (elementwise forward values recomputed)");
  }

  // Where backward graph input `origin` (split_forward_backward's: a saved value when negative)
  // comes from at each call.
  static BackwardSource backward_source(const LazyGraphBinding& binding, int64_t origin,
                                        size_t num_arguments) {
    BackwardSource src{BackwardSource::kSaved, 0, Tensor()};
    if (origin < 0) {
      src.index = static_cast<size_t>(-1 - origin);
      return src;
    }
    const int64_t a = binding.arguments[static_cast<size_t>(origin)];
    if (a >= static_cast<int64_t>(num_arguments)) {
      src.kind = BackwardSource::kOutputGrad;
      src.index = static_cast<size_t>(a) - num_arguments;
    } else if (a >= 0) {
      src.kind = BackwardSource::kArgument;
      src.index = static_cast<size_t>(a);
    } else {
      src.kind = BackwardSource::kCapture;
      src.capture = binding.inputs[static_cast<size_t>(origin)];
    }
    return src;
  }

  // What the graphs are, for KILN_DUMP and the profile: "trace f()::lambda#1: forward".
  std::string graph_name(const char* part) const {
    std::string name = "trace " + callable_name(f_.fn.target_type());
    if (!f_.specs.empty()) name += " (specialization " + std::to_string(f_.specs.size() + 1) + ")";
    return name + ": " + part;
  }

  FunctionImpl& f_;
  std::unique_ptr<Specialization> spec_;
  std::shared_ptr<Backward> backward_;
  std::vector<detail::LazyRef> requests_;    // per graph output before the split
  std::vector<size_t> gradient_request_of_;  // per gradient request: its differentiated input
};
}  // namespace

std::unique_ptr<Specialization> FunctionImpl::specialize(const std::vector<Tensor>& inputs,
                                                         bool plan) {
  // Pending work from before belongs to nobody's trace: run it first.
  detail::flush_pending();
  eval(inputs);
  Tracer tracer(*this, inputs);
  tracer.record(inputs);
  return tracer.finish(plan);
}

Function trace(TracedFn fn, const std::vector<Tensor>& example_inputs, int max_specializations) {
  KILN_CHECK(fn, "jit::trace: no function given");
  KILN_CHECK(max_specializations >= 1, "jit::trace: max_specializations must be at least 1, got ",
             max_specializations);
  Function f;
  f.impl_ = std::make_shared<FunctionImpl>();
  f.impl_->fn = std::move(fn);
  f.impl_->max_specializations = max_specializations;
  f.impl_->specs.push_back(f.impl_->specialize(example_inputs));
  return f;
}

}  // namespace kiln::jit
