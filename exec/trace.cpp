// kiln::jit::trace and Function: record a function once on pending placeholders, optimize the
// recorded graph into a plan, and replay it on later calls behind a guard on the input types.
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
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <sstream>

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "jit/differentiate.h"
#include "jit/dump.h"
#include "jit/infer.h"
#include "jit/log.h"
#include "jit/passes/passes.h"
#include "jit/serialize.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/profiler.h"
#include "lib/stats_registry.h"
#include "lib/tensor_impl.h"

namespace kiln {

bool is_lazy_enabled() {
  return detail::lazy_mode();
}
void set_lazy_enabled(bool enabled) {
  detail::set_lazy_mode(enabled);
}
LazyGuard::LazyGuard(bool enabled) : previous_(detail::lazy_mode()) {
  detail::set_lazy_mode(enabled);
}
LazyGuard::~LazyGuard() {
  detail::set_lazy_mode(previous_);
}

void eval(const std::vector<Tensor>& tensors) {
  detail::materialize(tensors, "kiln::eval");
}

namespace jit {

namespace {
std::atomic<int64_t> g_traces{0}, g_replays{0}, g_guard_failures{0};

struct InputKey {
  DType dtype;
  Shape sizes;
  Device device;
  bool requires_grad;
  bool operator==(const InputKey& o) const {
    return dtype == o.dtype && sizes == o.sizes && device == o.device &&
           requires_grad == o.requires_grad;
  }
};

InputKey key_of(const Tensor& t) {
  KILN_CHECK(t.defined(), "jit::trace: an input is an undefined tensor");
  return {t.dtype(), t.sizes(), t.device(), t.requires_grad()};
}

// Whether the inputs match a specialization's key, read in place (a replay builds no key).
bool key_matches(const std::vector<InputKey>& key, const std::vector<Tensor>& inputs) {
  if (key.size() != inputs.size()) return false;
  for (size_t i = 0; i < key.size(); ++i) {
    const InputKey& k = key[i];
    const Tensor& t = inputs[i];
    if (!(k.dtype == t.dtype() && k.sizes == t.sizes() && k.device == t.device() &&
          k.requires_grad == t.requires_grad()))
      return false;
  }
  return true;
}

std::string key_str(const InputKey& k) {
  std::string s = std::string(dtype_name(k.dtype)) + detail::shape_str(k.sizes);
  if (!k.device.is_cpu()) s += " on " + k.device.str();
  if (k.requires_grad) s += " requires_grad";
  return s;
}

// What each graph output is for. Saved: a value the backward of a differentiable function reads.
enum class OutputKind : int64_t { Return = 0, WriteBack = 1, Grad = 2, Saved = 3 };

// Where an input of a differentiable function's backward graph comes from.
struct BackwardSource {
  enum Kind : uint8_t { kOutputGrad, kArgument, kCapture, kSaved } kind;
  size_t index;  // the returned output, call argument or saved value (captures: `capture`)
  Tensor capture;
};

// The backward of a differentiable specialization: shared with the autograd nodes of its calls,
// which may outlive the Function.
struct Backward {
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Plan> plan;
  std::vector<BackwardSource> sources;  // per backward graph input
  std::vector<size_t> outputs;          // returned outputs that get a gradient
  std::vector<int64_t> wrt_arguments;   // per differentiated input: call argument, or -1
  std::vector<Tensor> wrt_captures;     // per differentiated input: the captured tensor
  // Per backward graph output: its differentiated input w, or past them (w >= wrt_arguments'
  // size) the retained output retained[w - wrt_arguments.size()].
  std::vector<size_t> gradient_of;
  // Returned outputs the function called retain_grad() on: each call's get in their .grad the
  // whole gradient that reaches them, as eager mode's (through the other outputs too).
  std::vector<size_t> retained;
  // What differentiating the function raised (a saved value written in place, say), and where:
  // fails[j][w] when the gradient of returned output outputs[j] for differentiated input w raised.
  // As in eager mode, the forward works and a backward raises it only when it needs one of those
  // gradients; the graph computes the others (none: no graph).
  std::exception_ptr error;
  std::vector<std::vector<bool>> fails;

  // Raises the error when the backward of a call (its output gradients and needs) reaches a part
  // that could not be differentiated.
  void check_reached(const detail::BackwardContext& c) const {
    for (size_t j = 0; j < fails.size() && j < c.num_grads(); ++j)
      for (size_t w = 0; w < wrt_arguments.size(); ++w)
        if (fails[j][w] && c.grad(j).defined() && c.needs_grad(w)) std::rethrow_exception(error);
  }
};

// A leaf whose .grad the traced function read or wrote (detail::TracedGrad): a captured tensor or
// a call argument. Each call reads its .grad (when the plan does) and writes it as the function
// did: assigns a new tensor (zero_grad, then backward), writes the .grad it found in place (a
// backward accumulating into it, clip_grad_norm_), or clears it (zero_grad at the end).
struct GradSlot {
  enum class Write : uint8_t { kNone, kAssign, kInPlace, kClear };
  std::shared_ptr<detail::TensorImpl> leaf;  // null for a call argument
  int64_t argument = -1;
  int64_t input = -1;  // where arguments_of puts its .grad at each call, or -1
  Write write = Write::kNone;
  bool guarded = false;            // the trace depends on the .grad: calls must find it as traced
  std::optional<InputKey> traced;  // the .grad at trace time, or none when undefined

  Tensor owner(const std::vector<Tensor>& inputs) const {
    return leaf ? Tensor(leaf) : inputs[static_cast<size_t>(argument)];
  }
  // The .grad itself: inside a trace, Tensor::grad would count as the traced function's read.
  Tensor& grad(const std::vector<Tensor>& inputs) const {
    return detail::ensure_autograd_meta(owner(inputs)).grad;
  }
  // Why a call with these inputs cannot use the plan, or "".
  std::string mismatch(const std::vector<Tensor>& inputs) const {
    if (!guarded) return "";
    const Tensor& g = grad(inputs);
    std::optional<InputKey> now;
    if (g.defined()) now = InputKey{g.dtype(), g.sizes(), g.device(), false};
    if (now == traced) return "";
    const Tensor t = owner(inputs);
    const std::string who = leaf ? "a captured " + std::string(dtype_name(t.dtype())) +
                                       detail::shape_str(t.sizes()) + " tensor"
                                 : "input " + std::to_string(argument);
    return "the .grad of " + who + " is " + (now ? key_str(*now) : "undefined") + ", traced as " +
           (traced ? key_str(*traced) : "undefined");
  }
};
}  // namespace

struct Specialization {
  std::vector<InputKey> key;
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Plan> plan;
  // Per graph input: the call argument, or -1 for a captured tensor (captures[k]); past the call's
  // arguments, the hyperparameter scalars[a - key.size()] read at each call.
  std::vector<int64_t> arguments;
  std::vector<Tensor> captures;
  // Per graph output: what it is for, and for write-backs the storage (as a flat tensor) and for
  // grads the index of the .grad in grad_slots.
  std::vector<OutputKind> kinds;
  std::vector<Tensor> write_targets;
  std::vector<size_t> grad_slot_of;
  std::vector<GradSlot> grad_slots;
  // Traced with autograd on, and (when its returned outputs require grad) its backward. A
  // specialization traced with autograd on that has no backward, and whose function runs no
  // backward of its own, serves calls in either mode, as a loaded one does.
  bool grad_mode = false;
  bool runs_backward = false;
  // The nodes from before the trace whose saved tensors the function's own backward frees
  // (detail::traced_frees): each call frees them, as eager mode's backward does.
  std::vector<std::weak_ptr<detail::Node>> frees;
  std::shared_ptr<const Backward> backward;
  // Values read from outside the tensors (detail::traced_scalar, traced_flag): hyperparameters,
  // graph inputs read at each call, and modes, which must read as traced for this plan to serve.
  std::vector<detail::TraceRead> scalars, flags;
  // Why this specialization cannot serve the call's modes, or "" when it can.
  std::string flag_mismatch() const {
    for (const detail::TraceRead& f : flags)
      if (const double now = f.read(); now != f.value)
        return f.what + " is " + (now != 0 ? "true" : "false") + ", traced as " +
               (f.value != 0 ? "true" : "false");
    return {};
  }
  // Why the .grads the call finds do not match the trace's, or "".
  std::string grad_mismatch(const std::vector<Tensor>& inputs) const {
    for (const GradSlot& g : grad_slots)
      if (std::string m = g.mismatch(inputs); !m.empty()) return m;
    return {};
  }
  // The call's arguments followed by the values read at each call, in the order the trace read
  // them: hyperparameters and .grads (what `arguments` indexes).
  std::vector<Tensor> arguments_of(const std::vector<Tensor>& inputs) const {
    std::vector<Tensor> all = inputs;
    all.resize(inputs.size() + scalars.size() + grad_inputs());
    for (const detail::TraceRead& r : scalars)
      all.at(static_cast<size_t>(r.argument)) = detail::wrap_scalar(r.read());
    for (const GradSlot& g : grad_slots)
      if (g.input >= 0) all.at(static_cast<size_t>(g.input)) = g.grad(inputs);
    return all;
  }
  size_t grad_inputs() const {
    size_t n = 0;
    for (const GradSlot& g : grad_slots) n += g.input >= 0;
    return n;
  }
  bool serves(bool call_grad_mode) const {
    return grad_mode == call_grad_mode || (grad_mode && !backward && !runs_backward);
  }
  // Whether every output is a returned value (a plain function).
  bool returns_only() const {
    for (OutputKind k : kinds)
      if (k != OutputKind::Return) return false;
    return true;
  }
  // Whether a replay writes state shared between calls: captured tensors or .grads.
  bool writes_captures() const {
    for (OutputKind k : kinds)
      if (k == OutputKind::WriteBack) return true;
    return !grad_slots.empty() || !frees.empty();
  }
};

struct FunctionImpl {
  TracedFn fn;
  int max_specializations = 8;
  // Guards specs, last, said_fallback and warnings; held while tracing.
  std::mutex mutex;
  // Replays that write captured tensors or .grads (a training step) hold it exclusively, as does
  // tracing (which makes captured storages symbolic while it runs); pure replays share it, so they
  // run concurrently. Taken after `mutex`, never before it.
  std::shared_mutex replay_mutex;
  std::vector<std::unique_ptr<Specialization>> specs;
  const Specialization* last = nullptr;
  bool said_fallback = false;
  std::vector<std::string> warnings;

  // Traces fn on inputs' placeholders; `plan`: also plan the graphs (jit::differentiate does not).
  std::unique_ptr<Specialization> specialize(const std::vector<Tensor>& inputs, bool plan = true);
  std::vector<Tensor> replay(const Specialization& s, const std::vector<Tensor>& inputs) const;
};

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

// Per graph output of a specialization: the graph input (a captured tensor covering the whole
// storage a write-back targets, the only input over that storage) whose buffer the plan may
// compute the write-back in, or -1.
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

std::unique_ptr<Specialization> FunctionImpl::specialize(const std::vector<Tensor>& inputs,
                                                         bool plan) {
  // Pending work from before belongs to nobody's trace: run it first.
  detail::flush_pending();
  eval(inputs);
  auto spec = std::make_unique<Specialization>();
  for (const Tensor& t : inputs) spec->key.push_back(key_of(t));
  std::vector<detail::LazyRef> requests;
  auto backward = std::make_shared<Backward>();
  {
    TraceScope scope;
    scope.state.examples = inputs;
    std::vector<Tensor> placeholders;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor p = detail::trace_placeholder(input_op(), static_cast<int64_t>(i), inputs[i]);
      if (inputs[i].requires_grad()) p.requires_grad_(true);
      placeholders.push_back(p);
    }
    detail::begin_traced_grads(placeholders);
    const detail::BackwardPasses before = detail::backward_passes();
    std::vector<Tensor> outputs = fn(placeholders);
    // A function that runs a backward of its own (backward(), autograd::grad) needs autograd on
    // for it, as in eager mode: its specialization serves calls in its own mode only. One whose
    // backward freed the graph its loss came from returns plain values, as torch.compile's does;
    // one whose backward kept it (create_graph, retain_graph) is differentiated like any other.
    const detail::BackwardPasses after = detail::backward_passes();
    spec->runs_backward = after.started != before.started;
    const bool graph_freed = after.freed_graph != before.freed_graph;
    const absl::flat_hash_set<const detail::Storage*> local = local_storages(scope.state, outputs);
    check_written_histories(scope.state);
    spec->frees = detail::traced_frees();
    for (const Tensor& t : outputs) {
      KILN_CHECK(t.defined(), "jit::trace: the traced function returned an undefined tensor");
      requests.push_back(value_ref(t));
      spec->kinds.push_back(OutputKind::Return);
      spec->write_targets.emplace_back();
      spec->grad_slot_of.emplace_back();
    }
    for (const auto& storage : scope.state.written) {
      if (local.contains(storage.get())) continue;
      requests.push_back(storage->lazy);
      spec->kinds.push_back(OutputKind::WriteBack);
      const detail::LazyType& t = storage->lazy.node->outputs[storage->lazy.index];
      spec->write_targets.push_back(detail::flat_storage_tensor(storage, t.dtype));
      spec->grad_slot_of.emplace_back();
    }
    for (const detail::TracedGrad& r : detail::traced_grads()) {
      GradSlot slot = grad_slot(r);
      if (slot.write == GradSlot::Write::kAssign || slot.write == GradSlot::Write::kInPlace) {
        requests.push_back(value_ref(r.leaf->autograd->grad));
        spec->kinds.push_back(OutputKind::Grad);
        spec->write_targets.emplace_back();
        spec->grad_slot_of.push_back(spec->grad_slots.size());
      }
      spec->grad_slots.push_back(std::move(slot));
    }
    // A function whose returned values require grad (and whose own backward, if any, kept its
    // graph) is differentiable: its gradients are recorded now, from output-gradient placeholders,
    // with the ops' own gradient formulas, and become the backward graph.
    spec->grad_mode = detail::grad_mode();
    const size_t num_forward = requests.size();
    std::vector<Tensor> wrt;
    if (spec->grad_mode && !graph_freed) {
      for (size_t i = 0; i < outputs.size(); ++i)
        if (outputs[i].requires_grad() && is_floating_point(outputs[i].dtype()))
          backward->outputs.push_back(i);
      if (!backward->outputs.empty()) {
        for (size_t i = 0; i < placeholders.size(); ++i) {
          if (!placeholders[i].requires_grad()) continue;
          wrt.push_back(placeholders[i]);
          backward->wrt_arguments.push_back(static_cast<int64_t>(i));
          backward->wrt_captures.emplace_back();
        }
        // Captured tensors that require grad (parameters): the inputs of the returned values'
        // graph that no argument binds.
        std::vector<detail::LazyRef> returned(
            requests.begin(), requests.begin() + static_cast<int64_t>(outputs.size()));
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
          backward->wrt_arguments.push_back(-1);
          backward->wrt_captures.push_back(t);
        }
        for (size_t i : backward->outputs)
          if (const detail::AutogradMeta* m = detail::autograd_meta(outputs[i]);
              m && m->retains_grad)
            backward->retained.push_back(i);
      }
    }
    std::vector<size_t> gradient_request_of;  // per gradient request: its differentiated input
    // Placeholders past the call's arguments: the hyperparameters and .grads read, then output
    // gradients.
    const size_t num_arguments = scope.state.examples.size();
    spec->scalars = scope.state.scalars;
    spec->flags = scope.state.flags;
    if (!wrt.empty()) {
      std::vector<Tensor> diff_outputs, output_grads;
      for (size_t j = 0; j < backward->outputs.size(); ++j) {
        const Tensor& out = outputs[backward->outputs[j]];
        diff_outputs.push_back(out);
        scope.state.examples.push_back(
            zeros(out.sizes(), TensorOptions(out.dtype()).device(out.device())));
        output_grads.push_back(detail::trace_placeholder(
            input_op(), static_cast<int64_t>(num_arguments + j), scope.state.examples.back()));
      }
      // The retained outputs' gradients are taken as those of inputs: all that reaches them.
      for (size_t i : backward->retained) wrt.push_back(outputs[i]);
      std::vector<Tensor> grads;
      try {
        grads = autograd::grad(diff_outputs, wrt, output_grads,
                               /*retain_graph=*/true, /*create_graph=*/false,
                               /*allow_unused=*/true);
      } catch (const Error&) {
        backward->error = std::current_exception();
        grads = gradients_around_failures(diff_outputs, wrt, output_grads, backward->fails);
      }
      for (size_t w = 0; w < grads.size(); ++w) {
        if (!grads[w].defined()) continue;
        requests.push_back(value_ref(grads[w]));
        gradient_request_of.push_back(w);
      }
    }
    warnings.insert(warnings.end(), scope.state.warnings.begin(), scope.state.warnings.end());
    for (const std::string& w : scope.state.warnings) std::cerr << "kiln warning: " << w << '\n';

    // The graph, built while the trace's values are still in place.
    LazyGraphBinding binding;
    spec->graph = build_graph(requests, &binding, false, nullptr);
    // Graph outputs in request order (build_graph lists each node's outputs once).
    std::vector<Value*> by_request;
    for (const detail::LazyRef& r : requests) {
      Value* found = nullptr;
      for (size_t k = 0; k < binding.outputs.size() && !found; ++k)
        if (binding.outputs[k].node == r.node && binding.outputs[k].index == r.index)
          found = spec->graph->outputs()[k];
      KILN_CHECK(found, "jit::trace: an output of the traced function was not recorded");
      by_request.push_back(found);
    }
    spec->graph->clear_outputs();
    for (Value* v : by_request) spec->graph->add_output(v);
    // A tensor the function allocated is held without the autograd history an in-place op gave
    // it inside (fill_ makes its constant value self's history): that history reaches the
    // trace's placeholders, which must not outlive it. Detached here, before the captures of
    // the forward and of the backward are taken from the binding.
    for (Tensor& c : binding.inputs)
      if (c.defined() && scope.state.created.count(c.impl()->storage.get())) c = c.detach();
    spec->arguments = binding.arguments;
    spec->captures = binding.inputs;
    // A .grad the graph reads must be there at each call, as it was when traced.
    for (GradSlot& g : spec->grad_slots)
      for (int64_t a : binding.arguments) g.guarded = g.guarded || (g.input >= 0 && a == g.input);
    if (!gradient_request_of.empty()) {
      // Split the graph of the function and its gradients into an augmented forward and a
      // backward.
      std::vector<bool> is_output_grad;
      for (int64_t a : binding.arguments)
        is_output_grad.push_back(a >= static_cast<int64_t>(num_arguments));
      Differentiated d = split_forward_backward(*spec->graph, num_forward, is_output_grad);
      spec->graph = std::move(d.forward);
      spec->arguments.clear();
      spec->captures.clear();
      for (int64_t origin : d.forward_inputs) {
        spec->arguments.push_back(binding.arguments[static_cast<size_t>(origin)]);
        spec->captures.push_back(binding.inputs[static_cast<size_t>(origin)]);
      }
      for (size_t k = 0; k < d.num_saved; ++k) {
        spec->kinds.push_back(OutputKind::Saved);
        spec->write_targets.emplace_back();
        spec->grad_slot_of.emplace_back();
      }
      for (int64_t origin : d.backward_inputs) {
        BackwardSource src{BackwardSource::kSaved, 0, Tensor()};
        if (origin < 0) {
          src.index = static_cast<size_t>(-1 - origin);
        } else {
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
        }
        backward->sources.push_back(std::move(src));
      }
      backward->gradient_of = gradient_request_of;
      backward->graph = std::move(d.backward);
      log("fuser", "differentiable trace: ", d.num_saved, " value(s) saved for the backward, ",
          backward->graph->size(), " backward nodes (elementwise forward values recomputed)");
    }
  }
  // What the graphs are, for KILN_DUMP and the profile: "trace f()::lambda#1: forward".
  auto trace_graph_name = [&](const char* part) {
    std::string name = "trace " + callable_name(fn.target_type());
    if (!specs.empty()) name += " (specialization " + std::to_string(specs.size() + 1) + ")";
    return name + ": " + part;
  };
  if (backward->graph) {
    name_graph(*backward->graph, [&] { return trace_graph_name("backward"); });
    run_passes(*backward->graph);
    if (verify_passes()) verify_types(*backward->graph);
    if (plan) backward->plan = std::make_unique<Plan>(*backward->graph);
  }
  if (backward->graph || backward->error) spec->backward = std::move(backward);
  name_graph(*spec->graph, [&] {
    std::string name = trace_graph_name(spec->runs_backward ? "forward+backward" : "forward");
    const auto writes = std::count(spec->kinds.begin(), spec->kinds.end(), OutputKind::WriteBack);
    if (writes) name += ", writes " + std::to_string(writes) + " captured tensor(s) in place";
    return name;
  });
  run_passes(*spec->graph);
  if (verify_passes()) verify_types(*spec->graph);
  if (plan) spec->plan = std::make_unique<Plan>(*spec->graph, in_place_inputs(*spec));
  g_traces.fetch_add(1);
  return spec;
}

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
}  // namespace

std::vector<Tensor> FunctionImpl::replay(const Specialization& s,
                                         const std::vector<Tensor>& inputs) const {
  const bool grad_mode = detail::grad_mode();
  detail::flush_pending();
  detail::free_as_traced(s.frees);
  // The inputs themselves when the trace read nothing else (no copy of the vector).
  std::vector<Tensor> extended;
  if (!s.scalars.empty() || s.grad_inputs() > 0) extended = s.arguments_of(inputs);
  const std::vector<Tensor>& arguments = extended.empty() ? inputs : extended;
  std::vector<Tensor> args(s.arguments.size());
  for (size_t k = 0; k < s.arguments.size(); ++k)
    args[k] = s.arguments[k] >= 0 ? arguments[static_cast<size_t>(s.arguments[k])] : s.captures[k];
  eval(args);
  // A .grad the function replaces without reading it (zero_grad, then backward) is dropped before
  // the run, as eager mode drops it at zero_grad: the old and the new gradients are never held
  // together.
  absl::flat_hash_set<const detail::Storage*> read;  // filled at the first such .grad only
  for (const GradSlot& g : s.grad_slots) {
    if (g.write != GradSlot::Write::kAssign && g.write != GradSlot::Write::kClear) continue;
    if (read.empty())
      for (const Tensor& a : args)
        if (a.defined()) read.insert(a.impl()->storage.get());
    Tensor& old = g.grad(inputs);
    if (old.defined() && !read.contains(old.impl()->storage.get())) old = Tensor();
  }
  std::vector<Tensor> results = s.plan->run(args);
  std::optional<ResultHolders> holders;  // made at the first write-back, which alone reads it
  auto is_argument = [&inputs](const Tensor& t) {
    for (const Tensor& in : inputs)
      if (t.is_same(in)) return true;
    return false;
  };
  std::vector<Tensor> returned, saved;
  {
    NoGradGuard no_grad;
    LazyGuard eager(false);
    const bool returns_only = s.returns_only();
    if (returns_only) {
      // A plain function: its results are what it returns (no second vector).
      for (Tensor& r : results)
        if (is_argument(r)) r = r.detach();
      returned = std::move(results);
    }
    for (size_t k = 0; k < s.kinds.size() && !returns_only; ++k) {
      switch (s.kinds[k]) {
        case OutputKind::Return:
          // A returned argument (a view or a same-type to() of it, folded away) becomes an alias
          // of its own: autograd would take the argument itself for the identity and drop the
          // call's node, and with it the other outputs' gradients.
          returned.push_back(is_argument(results[k]) ? results[k].detach() : results[k]);
          break;
        case OutputKind::Saved:
          // Without its history: a saved value may be a returned one too, whose history is the
          // call's node, and the node holding it would be a cycle that is never freed.
          saved.push_back(results[k].detach());
          break;
        case OutputKind::WriteBack: {
          // The new value's buffer becomes the captured storage's when nothing else holds it (the
          // Storage object, and so every view of it, stays); otherwise it is copied in.
          const Tensor& dst = s.write_targets[k];
          const Tensor& src = results[k];
          detail::Storage& storage = *dst.impl()->storage;
          if (src.impl()->storage.get() == &storage && src.storage_offset() == 0 &&
              src.is_contiguous() && src.numel() == dst.numel()) {
            // The plan computed it in place.
          } else if (storage.owns_allocation &&
                     (holders ? *holders : holders.emplace(args, results))
                         .can_give_up(src, storage.nbytes))
            swap_buffers(storage, *src.impl()->storage);
          else
            detail::copy_kernel(dst, detail::may_overlap(dst, src) ? src.clone() : src);
          detail::bump_version(dst);
          break;
        }
        case OutputKind::Grad: {
          const GradSlot& g = s.grad_slots[s.grad_slot_of[k]];
          Tensor& grad = g.grad(inputs);
          if (g.write == GradSlot::Write::kAssign) {
            grad = results[k];
          } else {
            // Written in place, as eager mode's backward adds into the .grad it finds: whoever
            // holds that tensor sees the new value.
            eval({grad});
            detail::copy_kernel(
                grad, detail::may_overlap(grad, results[k]) ? results[k].clone() : results[k]);
            detail::bump_version(grad);
          }
          break;
        }
      }
    }
    for (const GradSlot& g : s.grad_slots)
      if (g.write == GradSlot::Write::kClear) g.grad(inputs) = Tensor();
  }
  if (s.backward && grad_mode) {
    // The returned values get one autograd node whose backward runs the traced backward plan.
    const std::shared_ptr<const Backward> b = s.backward;
    std::vector<Tensor> wrt;
    for (size_t w = 0; w < b->wrt_arguments.size(); ++w)
      wrt.push_back(b->wrt_arguments[w] >= 0 ? inputs[static_cast<size_t>(b->wrt_arguments[w])]
                                             : b->wrt_captures[w]);
    if (detail::any_needs_grad(wrt)) {
      // Outputs the graph merged into one value (CSE: sqrt(x) returned twice; a piece of
      // chunk(1, d), which is its whole input) come back as one tensor; each takes its own alias,
      // as in eager mode: the backward reads one gradient per differentiated output, and an output
      // that is not differentiated must not take the node as its history.
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
  }
  return returned;
}

std::vector<Tensor> Function::operator()(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(impl_, "jit::Function: called on an empty Function");
  FunctionImpl& f = *impl_;
  for (const Tensor& t : inputs)
    KILN_CHECK(t.defined(), "jit::trace: an input is an undefined tensor");
  const Specialization* match = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mutex);
    // Every specialization takes as many arguments as the first: the function was written for
    // that many (called with fewer, it would read past its input vector).
    KILN_CHECK(f.specs.empty() || inputs.size() == f.specs[0]->key.size(),
               "jit::Function: called with ", inputs.size(),
               " inputs, but the function was traced with ", f.specs[0]->key.size());
    const bool grad_mode = detail::grad_mode();
    std::string mode_changed;  // a specialization for these inputs whose modes read otherwise now
    for (const auto& s : f.specs) {
      if (!(key_matches(s->key, inputs) && s->serves(grad_mode))) continue;
      std::string mismatch = s->flag_mismatch();
      if (mismatch.empty()) mismatch = s->grad_mismatch(inputs);
      if (mismatch.empty())
        match = s.get();
      else
        mode_changed = std::move(mismatch);
    }
    if (!match) {
      g_guard_failures.fetch_add(1);
      std::vector<InputKey> key;
      for (const Tensor& t : inputs) key.push_back(key_of(t));
      // The reason, against the most recent specialization.
      std::string reason = "no specialization yet";
      if (!mode_changed.empty()) {
        reason = mode_changed;
      } else if (!f.specs.empty()) {
        const auto& prev = f.specs.back()->key;
        if (prev.size() != key.size()) {
          reason = "called with " + std::to_string(key.size()) + " inputs, traced with " +
                   std::to_string(prev.size());
        } else {
          for (size_t i = 0; i < key.size(); ++i)
            if (!(key[i] == prev[i])) {
              reason = "input " + std::to_string(i) + " is " + key_str(key[i]) + ", traced as " +
                       key_str(prev[i]);
              break;
            }
        }
      }
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
        match = f.specs.back().get();
      } else {
        KILN_CHECK(f.fn,
                   "jit::Function: loaded function called with inputs it was not traced "
                   "for (",
                   reason, ")");
        if (!f.said_fallback) {
          f.said_fallback = true;
          std::cerr << "kiln: jit::Function reached its limit of " << f.max_specializations
                    << " specializations (" << reason
                    << "); further mismatching calls run in plain lazy mode\n";
        }
        log("guard", "guard failed (", reason, "): running in plain lazy mode");
      }
    }
    if (match) f.last = match;
  }
  if (!match) return f.fn(inputs);
  g_replays.fetch_add(1);
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

// Function files: the graph and its captured tensors (serialize.h), and as metadata a line-based
// description of how the graph is called:
//   kiln-function 1
//   inputs <n> then per call argument: dtype code, requires_grad, rank, sizes (the guard)
//   bindings <k> then per graph input: the call argument, or -1 for a captured tensor
//   outputs <m> then per graph output: kind (0 return, 1 write-back, 2 grad, 3 saved for a
//   backward: ignored by load) and the graph input whose captured tensor it writes (-1 for returns)
void Function::save(const std::string& path) const {
  KILN_CHECK(impl_, "jit::Function::save: empty Function");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Specialization* s = impl_->last ? impl_->last : impl_->specs.at(0).get();
  std::ostringstream meta;
  meta << "kiln-function 1\ninputs " << s->key.size() << '\n';
  for (const InputKey& k : s->key) {
    meta << static_cast<int>(k.dtype) << ' ' << k.requires_grad << ' ' << k.sizes.size();
    for (int64_t d : k.sizes) meta << ' ' << d;
    meta << '\n';
  }
  // A hyperparameter read at each call is saved as its value now: a captured constant. The file
  // has no way to say that a call reads a .grad, or writes one other than by assigning a captured
  // leaf's.
  for (const GradSlot& g : s->grad_slots)
    KILN_CHECK(g.input < 0 && (g.write == GradSlot::Write::kNone ||
                               (g.write == GradSlot::Write::kAssign && g.leaf)),
               "jit::Function::save: the function reads the .grad of a tensor at each call, "
               "writes it in place, clears it or assigns an argument's; such a function cannot be "
               "saved");
  auto is_scalar = [s](int64_t a) { return a >= static_cast<int64_t>(s->key.size()); };
  meta << "bindings " << s->arguments.size() << '\n';
  for (int64_t a : s->arguments) meta << (is_scalar(a) ? -1 : a) << '\n';
  meta << "outputs " << s->kinds.size() << '\n';
  for (size_t k = 0; k < s->kinds.size(); ++k) {
    int64_t target = -1;
    const bool targets = s->kinds[k] == OutputKind::WriteBack || s->kinds[k] == OutputKind::Grad;
    for (size_t i = 0; i < s->captures.size() && targets; ++i) {
      if (!s->captures[i].defined()) continue;
      const Tensor& cap = s->captures[i];
      if (s->kinds[k] == OutputKind::WriteBack &&
          cap.impl()->storage == s->write_targets[k].impl()->storage &&
          cap.numel() == s->write_targets[k].numel() && cap.is_contiguous() &&
          cap.storage_offset() == 0)
        target = static_cast<int64_t>(i);
      if (s->kinds[k] == OutputKind::Grad &&
          s->captures[i].impl_ptr() == s->grad_slots[s->grad_slot_of[k]].leaf)
        target = static_cast<int64_t>(i);
    }
    KILN_CHECK(!targets || target >= 0, "jit::Function::save: output ", k,
               " writes a tensor the function never reads; such a function cannot be saved");
    meta << static_cast<int64_t>(s->kinds[k]) << ' ' << target << '\n';
  }
  std::vector<Tensor> constants;
  for (size_t i = 0; i < s->captures.size(); ++i) {
    const int64_t a = s->arguments[i];
    if (is_scalar(a))
      constants.push_back(
          s->arguments_of(std::vector<Tensor>(s->key.size())).at(static_cast<size_t>(a)));
    else
      constants.push_back(a >= 0 ? Tensor() : s->captures[i].detach());
  }
  save_graph(path, *s->graph, constants, meta.str());
}

Function load(const std::string& path) {
  LoadedGraph loaded = load_graph(path);
  std::istringstream meta(loaded.metadata);
  auto fail = [&](const std::string& what) {
    KILN_FAIL("kiln::jit::load: ", path, ": bad function description (", what, ")");
  };
  auto read_int = [&](const char* what) {
    int64_t v;
    if (!(meta >> v)) fail(std::string("reading ") + what);
    return v;
  };
  auto expect_word = [&](const char* word) {
    std::string w;
    if (!(meta >> w) || w != word) fail(std::string("expected '") + word + "'");
  };
  expect_word("kiln-function");
  if (read_int("version") != 1) fail("unknown version");
  auto spec = std::make_unique<Specialization>();
  expect_word("inputs");
  int64_t n = read_int("input count");
  if (n < 0 || n > 1 << 20) fail("input count");
  for (int64_t i = 0; i < n; ++i) {
    int64_t dtype = read_int("dtype"), rg = read_int("requires_grad"), rank = read_int("rank");
    if (dtype < 0 || dtype > static_cast<int64_t>(DType::Float64) || rank < 0 || rank > 64)
      fail("input type");
    InputKey k{static_cast<DType>(dtype), {}, kCPU, rg != 0};
    for (int64_t d = 0; d < rank; ++d) k.sizes.push_back(read_int("size"));
    spec->key.push_back(k);
  }
  expect_word("bindings");
  const Graph& g = *loaded.graph;
  if (read_int("binding count") != static_cast<int64_t>(g.inputs().size()) ||
      loaded.constants.size() != g.inputs().size())
    fail("bindings do not match the graph's inputs");
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    int64_t a = read_int("binding");
    if (a < -1 || a >= n) fail("binding out of range");
    if (a < 0 && !loaded.constants[i].defined()) fail("a captured tensor is missing");
    spec->arguments.push_back(a);
    spec->captures.push_back(loaded.constants[i]);
  }
  expect_word("outputs");
  if (read_int("output count") != static_cast<int64_t>(g.outputs().size()))
    fail("outputs do not match the graph's");
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    int64_t kind = read_int("output kind"), target = read_int("output target");
    if (kind < 0 || kind > 3) fail("output kind");
    spec->kinds.push_back(static_cast<OutputKind>(kind));
    spec->write_targets.emplace_back();
    spec->grad_slot_of.emplace_back();
    if (kind == 0 || kind == 3) continue;
    if (target < 0 || target >= static_cast<int64_t>(spec->captures.size()) ||
        spec->arguments[static_cast<size_t>(target)] >= 0)
      fail("output target");
    Tensor& cap = spec->captures[static_cast<size_t>(target)];
    if (kind == 1) {
      spec->write_targets.back() = detail::flat_storage_tensor(cap.impl()->storage, cap.dtype());
    } else {
      if (!cap.requires_grad()) cap.requires_grad_(true);
      GradSlot slot;
      slot.leaf = cap.impl_ptr();
      slot.write = GradSlot::Write::kAssign;
      spec->grad_slot_of.back() = spec->grad_slots.size();
      spec->grad_slots.push_back(std::move(slot));
    }
  }
  spec->graph = std::move(loaded.graph);
  spec->plan = std::make_unique<Plan>(*spec->graph, in_place_inputs(*spec));
  spec->grad_mode = true;  // no backward: serves calls with autograd on or off
  Function f;
  f.impl_ = std::make_shared<FunctionImpl>();
  f.impl_->max_specializations = 1;
  f.impl_->specs.push_back(std::move(spec));
  return f;
}

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

Stats stats() {
  LazyStats l = lazy_stats();
  // The CPU code generator's counters (fuser/codegen/llvm/cpu_codegen.cpp publishes them).
  const detail::StatValues c = detail::read_stats("cpu_codegen");
  auto count = [&c](const char* name) { return static_cast<int64_t>(detail::stat(c, name)); };
  Stats st;
  st.evaluations = l.evaluations;
  st.plan_cache_hits = l.plan_cache_hits;
  st.nodes_executed = l.nodes_executed;
  st.pending_nodes = l.pending;
  st.traces = g_traces.load();
  st.replays = g_replays.load();
  st.guard_failures = g_guard_failures.load();
  st.arena_bytes = plan_arena_bytes();
  st.kernels_compiled = count("compiled");
  st.kernel_memory_hits = count("memory_hits");
  st.kernel_disk_hits = count("disk_hits");
  st.kernels_evicted = count("evicted");
  st.compile_seconds = detail::stat(c, "compile_seconds");
  const PlanRunCounts runs = plan_run_counts();
  st.fused_kernels_run = runs.fused_kernels;
  st.unfused_steps_run = runs.unfused_steps;
  st.in_place_writes = runs.in_place_writes;
  return st;
}

}  // namespace jit
}  // namespace kiln
