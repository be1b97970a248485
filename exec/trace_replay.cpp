// Calling a traced Function: the guard that finds the specialization serving a call (tracing a
// new one on a miss), and the replay of its plan: write-backs, .grads, and the autograd node of a
// differentiable function.
#include <absl/container/flat_hash_set.h>

#include <iostream>
#include <optional>

#include "exec/exec_state.h"
#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "exec/scratch.h"
#include "exec/specialization.h"
#include "jit/log.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/profiler.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Runs a differentiable function's backward graph for one call: the gradients of its
// differentiated inputs from the gradients of its returned outputs.
// `returned`: the sizes and dtype of each differentiated output (an absent gradient is zeros);
// not the outputs themselves, which hold this backward as their grad_fn.
// `retained`: the call's retained outputs (Backward::retained), whose .grad gets their gradient.
std::vector<Tensor> run_backward(const Backward& b, const std::vector<Tensor>& arguments,
                                 const std::vector<Tensor>& saved,
                                 const std::vector<std::pair<Shape, TensorOptions>>& returned,
                                 const std::vector<std::weak_ptr<detail::TensorImpl>>& retained,
                                 const detail::BackwardContext& c) {
  if (b.error) b.check_reached(c);
  std::vector<Tensor> grads(b.wrt_arguments.size());
  if (!b.graph) return grads;
  std::vector<Tensor> args;
  for (const BackwardSource& src : b.sources) {
    switch (src.kind) {
      case BackwardSource::kOutputGrad: {
        const Tensor& g = src.index < c.num_grads() ? c.grad(src.index) : Tensor();
        const auto& [sizes, options] = returned[src.index];
        args.push_back(g.defined() ? g : zeros(sizes, options));
        break;
      }
      case BackwardSource::kArgument:
        args.push_back(arguments[src.index]);
        break;
      case BackwardSource::kCapture:
        args.push_back(src.capture);
        break;
      case BackwardSource::kSaved:
        args.push_back(saved[src.index]);
        break;
    }
  }
  eval(args);
  std::vector<Tensor> results = b.plan->run(args);
  for (size_t k = 0; k < results.size(); ++k) {
    const size_t w = b.gradient_of[k];
    if (w < grads.size()) {
      grads[w] = results[k];
    } else if (auto impl = retained[w - grads.size()].lock()) {
      NoGradGuard no_grad;
      Tensor& g = impl->autograd->grad;
      g = g.defined() ? g + results[k] : results[k];
    }
  }
  return grads;
}

// The plan's inputs for a call: per graph input, its call argument (`arguments`: the call's and
// the values read at each call) or its captured tensor.
void bind_plan_inputs(const Specialization& s, const std::vector<Tensor>& arguments,
                      std::vector<Tensor>& args) {
  args.resize(s.arguments.size());
  for (size_t k = 0; k < s.arguments.size(); ++k)
    args[k] = s.arguments[k] >= 0 ? arguments[static_cast<size_t>(s.arguments[k])] : s.captures[k];
}

// Whether the plan's inputs are the call's `num_arguments` arguments, in order (no captures).
bool takes_arguments_in_order(const Specialization& s, size_t num_arguments) {
  if (s.arguments.size() != num_arguments) return false;
  for (size_t k = 0; k < num_arguments; ++k)
    if (s.arguments[k] != static_cast<int64_t>(k)) return false;
  return true;
}

// A .grad the function replaces without reading it (zero_grad, then backward) is dropped before
// the run, as eager mode drops it at zero_grad: the old and the new gradients are never held
// together.
void drop_replaced_grads(const Specialization& s, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& args) {
  absl::flat_hash_set<const detail::Storage*> read;  // filled at the first such .grad only
  for (const GradSlot& g : s.grad_slots) {
    if (g.write != GradSlot::Write::kAssign && g.write != GradSlot::Write::kClear) continue;
    if (read.empty())
      for (const Tensor& a : args)
        if (a.defined()) read.insert(a.impl()->storage.get());
    Tensor& old = g.grad(inputs);
    if (old.defined() && !read.contains(old.impl()->storage.get())) old = Tensor();
  }
}

// Whether a tensor is still to be computed; read without the lazy lock (Storage::pending), so
// that a replay on concrete inputs takes no lock to find so.
bool any_pending(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors)
    if (t.defined() && t.impl()->storage->pending.load(std::memory_order_acquire)) return true;
  return false;
}

bool is_argument(const Tensor& t, const std::vector<Tensor>& inputs) {
  for (const Tensor& in : inputs)
    if (t.is_same(in)) return true;
  return false;
}

// Returned value k as the call returns it. One the function computed but the plan gives back
// over an input's storage (the input itself, or a view of it) is copied: eager mode would have
// made a new tensor, and writing into it must change neither the input nor later calls.
// A returned argument is an alias of its own: autograd would take the argument itself for the
// identity and drop the call's node, and with it the other outputs' gradients.
Tensor returned_value(const Specialization& s, size_t k, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& args, Tensor&& r) {
  if (!r.defined()) return std::move(r);
  if (s.fresh_returns.size() > k && s.fresh_returns[k]) {
    for (const Tensor& a : args)
      if (a.defined() && a.impl()->storage == r.impl()->storage) return r.clone();
    return std::move(r);
  }
  return is_argument(r, inputs) ? r.detach() : std::move(r);
}

// The new value's buffer becomes the captured storage's when nothing else holds it (the Storage
// object, and so every view of it, stays); otherwise it is copied in. `holders` is made at the
// first write-back, which alone reads it.
void write_back(const Tensor& dst, const Tensor& src, std::optional<ResultHolders>& holders,
                const std::vector<Tensor>& args, const std::vector<Tensor>& results) {
  detail::Storage& storage = *dst.impl()->storage;
  if (src.impl()->storage.get() == &storage && src.storage_offset() == 0 && src.is_contiguous() &&
      src.numel() == dst.numel()) {
    // The plan computed it in place.
  } else if (storage.owns_allocation && (holders ? *holders : holders.emplace(args, results))
                                            .can_give_up(src, storage.nbytes)) {
    swap_buffers(storage, *src.impl()->storage);
  } else {
    detail::copy_kernel(dst, detail::may_overlap(dst, src) ? src.clone() : src);
  }
  detail::bump_version(dst);
}

void write_grad(const GradSlot& g, const std::vector<Tensor>& inputs, const Tensor& result) {
  Tensor& grad = g.grad(inputs);
  if (g.write == GradSlot::Write::kAssign) {
    grad = result;
    return;
  }
  // Written in place, as eager mode's backward adds into the .grad it finds: whoever holds that
  // tensor sees the new value.
  eval({grad});
  detail::copy_kernel(grad, detail::may_overlap(grad, result) ? result.clone() : result);
  detail::bump_version(grad);
}

// Each graph output to what it is for: the returned values and the values saved for the
// backward out, write-backs and .grads written.
void take_results(const Specialization& s, const std::vector<Tensor>& inputs,
                  const std::vector<Tensor>& args, std::vector<Tensor>& results,
                  std::vector<Tensor>& returned, std::vector<Tensor>& saved) {
  NoGradGuard no_grad;
  LazyGuard eager(false);
  if (s.returns_only()) {
    // A plain function: its results are what it returns (no second vector).
    for (size_t k = 0; k < results.size(); ++k)
      results[k] = returned_value(s, k, inputs, args, std::move(results[k]));
    returned = std::move(results);
    return;
  }
  std::optional<ResultHolders> holders;
  for (size_t k = 0; k < s.kinds.size(); ++k) {
    switch (s.kinds[k]) {
      case OutputKind::Return:
        returned.push_back(returned_value(s, k, inputs, args, Tensor(results[k])));
        break;
      case OutputKind::Saved:
        // Without its history: a saved value may be a returned one too, whose history is the
        // call's node, and the node holding it would be a cycle that is never freed.
        saved.push_back(results[k].detach());
        break;
      case OutputKind::WriteBack:
        write_back(s.write_targets[k], results[k], holders, args, results);
        break;
      case OutputKind::Grad:
        write_grad(s.grad_slots[s.grad_slot_of[k]], inputs, results[k]);
        break;
    }
  }
  for (const GradSlot& g : s.grad_slots)
    if (g.write == GradSlot::Write::kClear) g.grad(inputs) = Tensor();
}

// The returned values get one autograd node whose backward runs the traced backward plan.
void attach_backward(const std::shared_ptr<const Backward>& b, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& arguments, std::vector<Tensor>& returned,
                     const std::vector<Tensor>& saved) {
  std::vector<Tensor> wrt;
  for (size_t w = 0; w < b->wrt_arguments.size(); ++w)
    wrt.push_back(b->wrt_arguments[w] >= 0 ? inputs[static_cast<size_t>(b->wrt_arguments[w])]
                                           : b->wrt_captures[w]);
  if (!detail::any_needs_grad(wrt)) return;
  // Outputs the graph merged into one value (CSE: sqrt(x) returned twice; a piece of chunk(1, d),
  // which is its whole input) come back as one tensor; each takes its own alias, as in eager
  // mode: the backward reads one gradient per differentiated output, and an output that is not
  // differentiated must not take the node as its history.
  for (size_t i = 1; i < returned.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (returned[j].is_same(returned[i])) {
        returned[i] = returned[i].detach();
        break;
      }
  std::vector<Tensor> outs;
  std::vector<std::pair<Shape, TensorOptions>> types;  // on the output's device
  for (size_t i : b->outputs) {
    outs.push_back(returned[i]);
    types.emplace_back(returned[i].sizes(),
                       TensorOptions(returned[i].dtype()).device(returned[i].device()));
  }
  // Held weakly, as the engine holds a retained tensor: the tensor holds this node.
  std::vector<std::weak_ptr<detail::TensorImpl>> retained;
  for (size_t i : b->retained) retained.push_back(returned[i].impl_ptr());
  detail::record("traced_function", wrt, outs, {},
                 [b, arguments, saved, types, retained](const detail::BackwardContext& c) {
                   return run_backward(*b, arguments, saved, types, retained, c);
                 });
  for (size_t i : b->retained) detail::ensure_autograd_meta(returned[i]).retains_grad = true;
}
}  // namespace

std::vector<Tensor> FunctionImpl::replay(const Specialization& s,
                                         const std::vector<Tensor>& inputs) const {
  const bool grad_mode = detail::grad_mode();
  detail::flush_pending();
  if (!s.frees.empty()) detail::free_as_traced(s.frees);
  // The inputs themselves when the trace read nothing else (no copy of the vector).
  std::vector<Tensor> extended;
  if (!s.scalars.empty() || s.grad_inputs() > 0) extended = s.arguments_of(inputs);
  const std::vector<Tensor>& arguments = extended.empty() ? inputs : extended;
  // The plan's inputs: the arguments themselves when it takes them in order (no handle copied,
  // each copy being two atomic count updates once the process has a second thread), else the
  // thread's spare vector (no allocation).
  ScratchTensors args_scratch;
  const bool in_order = takes_arguments_in_order(s, arguments.size());
  if (!in_order) bind_plan_inputs(s, arguments, *args_scratch);
  const std::vector<Tensor>& args = in_order ? arguments : *args_scratch;
  if (any_pending(args)) eval(args);
  if (!s.grad_slots.empty()) drop_replaced_grads(s, inputs, args);
  std::vector<Tensor> results = s.plan->run(args);
  std::vector<Tensor> returned, saved;
  take_results(s, inputs, args, results, returned, saved);
  if (s.backward && grad_mode) attach_backward(s.backward, inputs, arguments, returned, saved);
  return returned;
}

namespace {
// Whether `s` serves a call with `inputs`; when its key matches but its modes do not, says why in
// `mode_changed`.
bool serves_call(const Specialization& s, const std::vector<Tensor>& inputs, bool grad_mode,
                 std::string& mode_changed) {
  if (!(key_matches(s.key, inputs) && s.serves(grad_mode))) return false;
  if (s.flags.empty() && s.grad_slots.empty()) return true;  // no modes to check
  std::string mismatch = s.flag_mismatch();
  if (mismatch.empty()) mismatch = s.grad_mismatch(inputs);
  if (mismatch.empty()) return true;
  mode_changed = std::move(mismatch);
  return false;
}

// The specialization serving a call with `inputs`, or null; `mode_changed` says why one for these
// inputs does not serve the call's modes (.grads, flags), if one does not. Under f.mutex.
const Specialization* find_specialization(const FunctionImpl& f, const std::vector<Tensor>& inputs,
                                          std::string& mode_changed) {
  const bool grad_mode = detail::grad_mode();
  const Specialization* match = nullptr;
  for (const auto& s : f.specs)
    if (serves_call(*s, inputs, grad_mode, mode_changed)) match = s.get();
  return match;
}

// The specialization of the last call, when it serves this one too (FunctionImpl::hot), or null.
const Specialization* hot_specialization(const FunctionImpl& f, const std::vector<Tensor>& inputs) {
  const Specialization* s = f.hot.load(std::memory_order_acquire);
  std::string mode_changed;
  return s && serves_call(*s, inputs, detail::grad_mode(), mode_changed) ? s : nullptr;
}

// Why no specialization served the call: its modes, or its inputs against the most recent one's.
std::string guard_failure_reason(const FunctionImpl& f, const std::vector<Tensor>& inputs,
                                 const std::string& mode_changed) {
  if (!mode_changed.empty()) return mode_changed;
  if (f.specs.empty()) return "no specialization yet";
  std::vector<InputKey> key;
  for (const Tensor& t : inputs) key.push_back(key_of(t));
  const auto& prev = f.specs.back()->key;
  if (prev.size() != key.size())
    return "called with " + std::to_string(key.size()) + " inputs, traced with " +
           std::to_string(prev.size());
  for (size_t i = 0; i < key.size(); ++i)
    if (!(key[i] == prev[i]))
      return "input " + std::to_string(i) + " is " + key_str(key[i]) + ", traced as " +
             key_str(prev[i]);
  return "no specialization yet";
}

// A call no specialization serves: traces a new one, or past the limit says (once) that such
// calls run in plain lazy mode and returns null. Under f.mutex.
const Specialization* on_guard_failure(FunctionImpl& f, const std::vector<Tensor>& inputs,
                                       const std::string& mode_changed) {
  exec_state().guard_failures.fetch_add(1);
  const std::string reason = guard_failure_reason(f, inputs, mode_changed);
  if (detail::profiling()) {
    profiler::Record r;
    r.name = "guard failure";
    r.shape = reason;
    detail::profile_event(std::move(r));
  }
  if (static_cast<int>(f.specs.size()) < f.max_specializations && f.fn) {
    detail::ProfileSpan tracing("trace");
    log("guard", "guard failed (", reason, "): tracing specialization ", f.specs.size() + 1,
        " of at most ", f.max_specializations);
    std::unique_lock<std::shared_mutex> no_replays(f.replay_mutex);
    f.specs.push_back(f.specialize(inputs));
    return f.specs.back().get();
  }
  KILN_CHECK(f.fn, "jit::Function: loaded function called with inputs it was not traced for (",
             reason, ")");
  if (!f.said_fallback) {
    f.said_fallback = true;
    std::cerr << "kiln: jit::Function reached its limit of " << f.max_specializations
              << " specializations (" << reason
              << "); further mismatching calls run in plain lazy mode\n";
  }
  log("guard", "guard failed (", reason, "): running in plain lazy mode");
  return nullptr;
}
}  // namespace

std::vector<Tensor> Function::operator()(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(impl_, "jit::Function: called on an empty Function");
  FunctionImpl& f = *impl_;
  for (const Tensor& t : inputs)
    KILN_CHECK(t.defined(), "jit::trace: an input is an undefined tensor");
  const Specialization* match = hot_specialization(f, inputs);
  if (!match) {
    std::lock_guard<std::mutex> lock(f.mutex);
    // Every specialization takes as many arguments as the first: the function was written for
    // that many (called with fewer, it would read past its input vector).
    KILN_CHECK(f.specs.empty() || inputs.size() == f.specs[0]->key.size(),
               "jit::Function: called with ", inputs.size(),
               " inputs, but the function was traced with ", f.specs[0]->key.size());
    std::string mode_changed;
    match = find_specialization(f, inputs, mode_changed);
    if (!match) match = on_guard_failure(f, inputs, mode_changed);
    if (match) f.last = match;
    // Not one that guards .grads: reading them may make a captured leaf's autograd metadata,
    // which the mutex serializes.
    const bool hot = match && match == f.specs.back().get() && match->grad_slots.empty();
    f.hot.store(hot ? match : nullptr, std::memory_order_release);
  }
  if (!match) return f.fn(inputs);
  exec_state().replays.fetch_add(1);
  detail::ProfileSpan span("replay");
  if (match->writes_captures()) {
    std::unique_lock<std::shared_mutex> serial(f.replay_mutex);
    return f.replay(*match, inputs);
  }
  std::shared_lock<std::shared_mutex> shared(f.replay_mutex);
  return f.replay(*match, inputs);
}

std::string Function::backward_graph_str() const {
  KILN_CHECK(impl_, "jit::Function: empty Function");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Specialization* s =
      impl_->last ? impl_->last : (impl_->specs.empty() ? nullptr : impl_->specs[0].get());
  return s && s->backward ? s->backward->graph->str() : std::string();
}

std::string Function::graph_str() const {
  KILN_CHECK(impl_, "jit::Function: empty Function");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Specialization* s =
      impl_->last ? impl_->last : (impl_->specs.empty() ? nullptr : impl_->specs[0].get());
  return s ? s->graph->str() : std::string();
}

size_t Function::num_specializations() const {
  return impl_ ? impl_->specs.size() : 0;
}

std::vector<std::string> Function::warnings() const {
  return impl_ ? impl_->warnings : std::vector<std::string>{};
}

}  // namespace kiln::jit
