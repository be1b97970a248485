// A traced function's specializations: the guard key, graphs, plans and write-back targets of
// each, and the Function's state (what exec/trace_record.cpp makes, exec/trace_replay.cpp runs and
// exec/trace_io.cpp saves and loads).
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "jit/ir.h"
#include "kiln/jit.h"
#include "lib/autograd.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

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

inline InputKey key_of(const Tensor& t) {
  KILN_CHECK(t.defined(), "jit::trace: an input is an undefined tensor");
  return {t.dtype(), t.sizes(), t.device(), t.requires_grad()};
}

// Whether the inputs match a specialization's key, read in place (a replay builds no key).
inline bool key_matches(const std::vector<InputKey>& key, const std::vector<Tensor>& inputs) {
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

inline std::string key_str(const InputKey& k) {
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
  // Per graph output that is a returned value: whether the function computed it, rather than an
  // argument, a captured tensor or a view of one. The optimized graph may return such a value as
  // the very input it equals (x * 1 is x; a value folded to a captured constant): the call then
  // returns a copy, a new tensor as in eager mode, which the caller may write into.
  std::vector<bool> fresh_returns;
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

// A Function's state.
struct FunctionImpl {
  TracedFn fn;                  // set once at start, then read-only
  int max_specializations = 8;  // set once at start, then read-only
  // Guards specs, last, said_fallback and warnings; held while tracing.
  std::mutex mutex;
  // Replays that write captured tensors or .grads (a training step) hold it exclusively, as does
  // tracing (which makes captured storages symbolic while it runs); pure replays share it, so they
  // run concurrently. Taken after `mutex`, never before it.
  std::shared_mutex replay_mutex;
  std::vector<std::unique_ptr<Specialization>> specs;  // under mutex (and replay_mutex to add)
  const Specialization* last = nullptr;                // under mutex
  // The specialization the last call under `mutex` chose, when it was the newest and reads no
  // .grads (else null); set under mutex. A call it still serves takes it without the mutex
  // (find_specialization would choose it too, as the last that matches). Specializations are
  // never removed.
  std::atomic<const Specialization*> hot{nullptr};
  bool said_fallback = false;         // under mutex
  std::vector<std::string> warnings;  // under mutex

  // Traces fn on inputs' placeholders; `plan`: also plan the graphs (jit::differentiate does not).
  std::unique_ptr<Specialization> specialize(const std::vector<Tensor>& inputs, bool plan = true);
  std::vector<Tensor> replay(const Specialization& s, const std::vector<Tensor>& inputs) const;
};

// Per graph output of a specialization: the graph input (a captured tensor covering the whole
// storage a write-back targets, the only input over that storage) whose buffer the plan may
// compute the write-back in, or -1.
std::vector<int64_t> in_place_inputs(const Specialization& s);

}  // namespace kiln::jit
