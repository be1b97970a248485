// The autograd engine: grad mode, per-tensor autograd state, recording, in-place history
// rewriting, and the backward pass.
#include "lib/autograd.h"
#include "lib/autograd_hooks.h"
#include "lib/lazy_saved.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <limits>
#include <queue>

#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {
// lib/ops/views.cpp: the gradient of as_strided, summed where view elements share a location.
Tensor as_strided_backward(const Tensor& g, const Shape& in_sizes, const Shape& in_strides,
                           const Shape& sizes, const Shape& strides, int64_t rel);
namespace detail {

namespace {
__attribute__((tls_model("initial-exec"))) thread_local bool t_grad_mode = true;
// The autograd graph's counters.
struct AutogradState {
  std::atomic<uint64_t> next_sequence_nr{0};  // atomic: numbers nodes in creation order
  std::atomic<int64_t> live_nodes{0};         // atomic: nodes alive now
};
AutogradState& autograd_state() {
  static AutogradState s;  // constant-initialized: no guard, usable from any initializer
  return s;
}

// Nodes whose last owner went away, waiting to be destroyed by the outermost ~Node (see there).
thread_local std::vector<std::shared_ptr<Node>> t_release_stack;
thread_local bool t_releasing = false;

void defer_release(std::shared_ptr<Node>&& node) {
  if (node && node.use_count() == 1) t_release_stack.push_back(std::move(node));
  node.reset();
}

Tensor alias(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  const TensorImpl* src = t.impl();
  impl->storage = src->storage;
  impl->offset = src->offset;
  impl->sizes = src->sizes;
  impl->strides = src->strides;
  impl->dtype = src->dtype;
  impl->wrapped_number = src->wrapped_number;
  impl->lazy = src->lazy;
  impl->lazy_generation = src->lazy_generation;
  return Tensor(std::move(impl));
}

uint64_t version_of(const Tensor& t) {
  return t.impl()->storage->version.load(std::memory_order_relaxed);
}

// A node that runs an op's gradient formula over its saved tensors.
struct FormulaNode final : Node {
  FormulaNode(std::string n, GradFormula f) : Node(std::move(n)), formula(std::move(f)) {}
  ~FormulaNode() override {
    for (SavedTensor& s : saved) s.release();
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads, const std::vector<bool>& needs) override {
    BackwardContext c;
    auto self = shared_from_this();
    c.saved_.reserve(saved.size());
    for (const SavedTensor& s : saved) c.saved_.push_back(s.unpack(self, name));
    c.grads_ = std::move(grads);
    c.needs_ = needs;
    return formula(c);
  }
  void release_saved() override {
    for (SavedTensor& s : saved) s.release();
  }

  GradFormula formula;
  std::vector<SavedTensor> saved;
};

// ------------------------------------------------------------------------- .grad in a trace

// What the trace running on this thread did to leaves' .grad, one record per leaf (traces do not
// nest), and the first node it recorded: older nodes are histories from before the trace.
thread_local std::vector<TracedGrad> t_traced_grads;
thread_local std::vector<Tensor> t_traced_grad_arguments;  // the placeholder of each argument
thread_local uint64_t t_trace_first_node = 0;
// The nodes from before the trace that a backward inside it would have freed (traced_frees).
thread_local std::vector<std::weak_ptr<Node>> t_traced_frees;

// The record of leaf's .grad, made at the leaf's first touch: its .grad before the trace, and in
// its place a placeholder read at each call (the argument's .grad for an argument's placeholder).
TracedGrad& traced_grad_record(const std::shared_ptr<TensorImpl>& leaf) {
  for (TracedGrad& r : t_traced_grads)
    if (r.leaf == leaf) return r;
  TracedGrad r;
  r.leaf = leaf;
  AutogradMeta& m = ensure_autograd_meta(Tensor(leaf));
  r.before = m.grad;
  Tensor now = m.grad;
  TraceState& trace = *trace_state();
  for (size_t i = 0; i < t_traced_grad_arguments.size(); ++i) {
    if (t_traced_grad_arguments[i].impl() != leaf.get()) continue;
    r.argument = static_cast<int64_t>(i);
    const AutogradMeta* am = autograd_meta(trace.examples.at(i));
    now = am ? am->grad : Tensor();
  }
  if (now.defined()) {
    static const OpDef* input = find_op("input");
    KILN_CHECK(input, "jit::trace: the graph input op is not registered");
    r.input = static_cast<int64_t>(trace.examples.size());
    trace.examples.push_back(now);
    r.initial = trace_placeholder(*input, r.input, now);
  }
  m.grad = r.initial;
  t_traced_grads.push_back(std::move(r));
  return t_traced_grads.back();
}

// The function reads leaf's .grad (`grad`, its value now): when that is still the value it found,
// the trace depends on the .grad at each call.
void note_traced_grad_read(TracedGrad& r, const Tensor& grad) {
  if (r.initial.defined() ? grad.is_same(r.initial) : !r.assigned && !grad.defined())
    r.observed = true;
}

// An in-place op under autograd inside a trace on a tensor whose history (or whose base's) dates
// from before the trace: a replay writes the new value back, but cannot give the tensor the
// history eager mode would, so its later gradients would flow into the old one.
void check_traced_write_history(const Tensor& self, const char* op) {
  for (const TensorImpl* t = self.impl(); t; t = t->view_base.get()) {
    const AutogradMeta* m = t->autograd.get();
    if (!m || !m->grad_fn || m->grad_fn->sequence_nr >= t_trace_first_node) continue;
    KILN_FAIL(op, ": jit::trace: the traced function writes in place, with autograd on, ",
              describe(self), ", which has autograd history from before the trace (made by ",
              m->grad_fn->name,
              "); a replay could not give it its new history, so gradients through it would be "
              "wrong. Detach or clone it before the trace, write it under kiln::NoGradGuard, or "
              "compute it inside the traced function");
  }
}

// The sink for a leaf's gradient: accumulates into leaf.grad(). It holds the leaf weakly: a .grad
// computed with create_graph has a history that leads back here, and a strong reference would
// make leaf -> .grad -> its nodes -> this node -> leaf a cycle that is never freed. A leaf that
// is gone has no .grad anyone could read.
struct AccumulateGrad final : Node {
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& l) : Node("AccumulateGrad"), leaf(l) {
    sequence_nr = std::numeric_limits<uint64_t>::max();  // run as soon as ready
  }
  bool is_accumulator() const override { return true; }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads, const std::vector<bool>&) override {
    Tensor g = std::move(grads[0]);
    std::shared_ptr<TensorImpl> leaf = this->leaf.lock();
    if (!g.defined() || !leaf) return {};
    AutogradMeta& m = *leaf->autograd;
    if (trace_state()) {
      // Accumulating reads the .grad: jit::trace replays add to the .grad of each call.
      TracedGrad& r = traced_grad_record(leaf);
      note_traced_grad_read(r, m.grad);
      r.assigned = true;
    }
    if (!m.grad.defined()) {
      // A gradient nobody else holds can become .grad without a copy.
      bool unique = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 &&
                    !g.impl()->view_base && g.is_contiguous() && !requires_grad(g);
      m.grad = (unique && !grad_mode()) ? std::move(g) : g.clone();
    } else if (!grad_mode()) {
      m.grad.add_(g);
    } else {
      m.grad = m.grad + g;
    }
    if (!post_hooks.empty()) {
      Tensor t(std::move(leaf));
      for (const auto& hook : post_hooks) hook(t);
    }
    return {};
  }

  std::weak_ptr<TensorImpl> leaf;
  std::vector<std::function<void(const Tensor&)>> post_hooks;  // lib/autograd_hooks.h
};

struct Geometry {
  Shape sizes, strides;
  int64_t offset = 0;
};
Geometry geometry_of(const Tensor& t) {
  return {t.sizes(), t.strides(), t.storage_offset()};
}

std::vector<Tensor> one(Tensor t) {
  std::vector<Tensor> v;
  v.push_back(std::move(t));
  return v;
}

// The history of a view rebuilt from its base's: the view's elements of the base. An expanded
// view's elements share memory locations: their gradients add up there (as_strided's backward).
std::shared_ptr<Node> view_of_base_node(const Tensor& base, const Tensor& view) {
  Geometry b = geometry_of(base), v = geometry_of(view);
  auto node = std::make_shared<FormulaNode>("as_strided", [b, v](const BackwardContext& c) {
    return one(
        as_strided_backward(c.grad(), b.sizes, b.strides, v.sizes, v.strides, v.offset - b.offset));
  });
  node->next_edges.push_back(gradient_edge(base));
  node->input_meta.push_back({base.sizes(), base.dtype(), true});
  return node;
}

// The autograd history of a tensor, as a trace found it before changing it.
struct SavedHistory {
  std::weak_ptr<TensorImpl> impl;  // weak: the trace counts who holds its tensors
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  bool view_tracks_base = false;
  uint64_t view_version = 0;
};
// In trace mode, the histories that in-place ops (and the views' histories rebuilt after them)
// replaced, oldest first: the new ones reach the trace's placeholders, so jit::trace puts the old
// ones back (restore_traced_histories). Traces do not nest: one list per thread.
thread_local std::vector<SavedHistory> t_traced_histories;

// Called before t's history changes; remembers it when the change is a trace's.
void note_history_change(const std::shared_ptr<TensorImpl>& impl) {
  if (!trace_mode()) return;
  const AutogradMeta* m = impl->autograd.get();
  t_traced_histories.push_back({impl, m ? m->grad_fn : nullptr, m ? m->output_nr : 0,
                                impl->view_tracks_base, impl->view_version});
}

void maybe_rebuild_view_history(const Tensor& t) {
  TensorImpl* impl = t.impl();
  if (!impl->view_base || !impl->view_tracks_base) return;
  uint64_t v = version_of(t);
  if (v == impl->view_version) return;
  Tensor base(impl->view_base);
  const bool rebuilds = requires_grad(base);
  if (rebuilds) note_history_change(t.impl_ptr());
  impl->view_version = v;
  if (!rebuilds) return;
  AutogradMeta& m = ensure_autograd_meta(t);
  m.grad_fn = view_of_base_node(base, t);
  m.output_nr = 0;
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& m = ensure_autograd_meta(leaf);
  if (auto acc = m.grad_accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
  m.grad_accumulator = acc;
  return acc;
}
}  // namespace

std::shared_ptr<Node> add_post_accumulate_grad_hook(const Tensor& leaf,
                                                    std::function<void(const Tensor&)> hook) {
  KILN_CHECK(leaf.requires_grad() && leaf.is_leaf(),
             "add_post_accumulate_grad_hook: the tensor must be a leaf that requires grad");
  std::shared_ptr<Node> acc = grad_accumulator(leaf);
  static_cast<AccumulateGrad&>(*acc).post_hooks.push_back(std::move(hook));
  return acc;
}

// ------------------------------------------------------------------------------------ nodes

Node::Node(std::string n) : name(std::move(n)), sequence_nr(autograd_state().next_sequence_nr++) {
  autograd_state().live_nodes.fetch_add(1, std::memory_order_relaxed);
}

Node::~Node() {
  autograd_state().live_nodes.fetch_sub(1, std::memory_order_relaxed);
  for (Edge& e : next_edges) defer_release(std::move(e.node));
  if (t_releasing) return;
  t_releasing = true;
  while (!t_release_stack.empty()) {
    std::shared_ptr<Node> n = std::move(t_release_stack.back());
    t_release_stack.pop_back();
    n.reset();  // its destructor pushes its own children instead of recursing
  }
  t_releasing = false;
}

SavedTensor::SavedTensor(const Tensor& t, bool is_output, uint32_t output_nr) {
  if (!t.defined()) return;
  defined_ = true;
  is_output_ = is_output;
  version_ = version_of(t);
  mark_saved_for_backward(t);
  AutogradMeta* m = autograd_meta(t);
  if (!is_output && (!m || !m->grad_fn)) {
    is_leaf_ = true;  // a leaf or a constant: no history to cut
    if (m && m->requires_grad) {
      // A leaf is held through its accumulator, weakly: a graph made by backward(create_graph)
      // is the leaf's own .grad history, and holding the leaf from it would be a cycle.
      data_ = alias(t);
      grad_fn_ = grad_accumulator(t);
    } else {
      data_ = t;
    }
    return;
  }
  data_ = alias(t);
  if (is_output) {
    output_nr_ = output_nr;
    output_differentiable_ = is_floating_point(t.dtype());
  } else {
    grad_fn_ = m->grad_fn;
    output_nr_ = m->output_nr;
  }
}

Tensor SavedTensor::unpack(const std::shared_ptr<Node>& owner, const std::string& op) const {
  KILN_CHECK(!released_, op,
             ": trying to run backward through the graph a second time (or to read its saved "
             "tensors after they were freed); pass retain_graph=true to the first backward "
             "call if you need to");
  if (!defined_) return Tensor();
  uint64_t now = version_of(data_);
  KILN_CHECK(now == version_, "one of the tensors needed for gradient computation has been ",
             "modified by an in-place operation: ", describe(data_), ", saved by ", op,
             ", is at version ", now, "; expected version ", version_,
             " instead. Use an out-of-place op (or clone() it) before modifying it.");
  if (is_leaf_) {
    if (!grad_fn_) return data_;
    // The leaf itself while it lives (its gradient flows to it); once it is gone nobody can read
    // its gradient, and its values remain.
    std::shared_ptr<TensorImpl> leaf = static_cast<const AccumulateGrad&>(*grad_fn_).leaf.lock();
    return leaf ? Tensor(std::move(leaf)) : data_;
  }
  Tensor out = alias(data_);
  std::shared_ptr<Node> fn = is_output_ ? (output_differentiable_ ? owner : nullptr) : grad_fn_;
  if (fn) {
    AutogradMeta& m = ensure_autograd_meta(out);
    m.grad_fn = std::move(fn);
    m.output_nr = output_nr_;
  }
  return out;
}

void SavedTensor::release() {
  data_ = Tensor();
  defer_release(std::move(grad_fn_));
  released_ = true;
}

int64_t live_autograd_nodes() {
  return autograd_state().live_nodes.load(std::memory_order_relaxed);
}

// ------------------------------------------------------------------------------- per tensor

bool grad_mode() {
  return t_grad_mode;
}

AutogradMeta* autograd_meta(const Tensor& t) {
  return t.impl()->autograd.get();
}

AutogradMeta& ensure_autograd_meta(const Tensor& t) {
  auto& slot = t.impl()->autograd;
  if (!slot) slot = std::make_shared<AutogradMeta>();
  return *slot;
}

bool requires_grad(const Tensor& t) {
  if (!t.defined()) return false;
  maybe_rebuild_view_history(t);
  const AutogradMeta* m = autograd_meta(t);
  return m && (m->requires_grad || m->grad_fn);
}

bool any_needs_grad(const std::vector<Tensor>& ts) {
  if (!grad_mode()) return false;
  for (const Tensor& t : ts)
    if (requires_grad(t)) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  maybe_rebuild_view_history(t);
  AutogradMeta* m = autograd_meta(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (m->requires_grad) return {grad_accumulator(t), 0};
  return {};
}

void begin_traced_grads(const std::vector<Tensor>& argument_placeholders) {
  t_traced_grads.clear();
  t_traced_frees.clear();
  t_traced_grad_arguments = argument_placeholders;
  t_trace_first_node = autograd_state().next_sequence_nr.load();
}

const std::vector<TracedGrad>& traced_grads() {
  return t_traced_grads;
}

void end_traced_grads() {
  std::vector<TracedGrad> records = std::move(t_traced_grads);
  t_traced_grads.clear();
  t_traced_grad_arguments.clear();
  t_traced_frees.clear();
  t_trace_first_node = 0;
  for (TracedGrad& r : records) r.leaf->autograd->grad = std::move(r.before);
}

std::vector<std::shared_ptr<TensorImpl>> tensors_given_traced_history() {
  std::vector<std::shared_ptr<TensorImpl>> given;
  absl::flat_hash_set<const TensorImpl*> seen;
  for (const SavedHistory& h : t_traced_histories) {
    std::shared_ptr<TensorImpl> impl = h.impl.lock();
    if (!impl || !seen.insert(impl.get()).second) continue;
    const AutogradMeta* m = impl->autograd.get();
    if (m && m->grad_fn && m->grad_fn->sequence_nr >= t_trace_first_node)
      given.push_back(std::move(impl));
  }
  return given;
}

std::vector<std::weak_ptr<Node>> traced_frees() {
  return t_traced_frees;
}

void free_as_traced(const std::vector<std::weak_ptr<Node>>& nodes) {
  std::vector<std::shared_ptr<Node>> alive;
  for (const std::weak_ptr<Node>& w : nodes)
    if (std::shared_ptr<Node> n = w.lock()) alive.push_back(std::move(n));
  for (const std::shared_ptr<Node>& n : alive)
    if (const auto* f = dynamic_cast<const FormulaNode*>(n.get()))
      for (const SavedTensor& s : f->saved) s.unpack(n, n->name);
  for (const std::shared_ptr<Node>& n : alive) n->release_saved();
}

void restore_traced_histories() {
  std::vector<SavedHistory> saved = std::move(t_traced_histories);
  t_traced_histories.clear();
  // Newest first, so each tensor ends with the history it had before its first change.
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    const std::shared_ptr<TensorImpl> held = it->impl.lock();
    if (!held) continue;
    TensorImpl& impl = *held;
    if (impl.autograd || it->grad_fn) {
      if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
      impl.autograd->grad_fn = std::move(it->grad_fn);
      impl.autograd->output_nr = it->output_nr;
    }
    impl.view_tracks_base = it->view_tracks_base;
    impl.view_version = it->view_version;
  }
}

// Counted by run_backward (below).
thread_local BackwardPasses t_backward_passes;

BackwardPasses backward_passes() {
  return t_backward_passes;
}

void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            const std::vector<Tensor>& saved, GradFormula formula) {
  bool differentiable = false;
  for (const Tensor& out : outputs)
    differentiable = differentiable || (out.defined() && is_floating_point(out.dtype()));
  if (!differentiable) return;
  // An op that handed back one of its inputs (to() to the same dtype, contiguous() of a
  // contiguous tensor) is the identity: the input's history already describes the result.
  for (const Tensor& out : outputs)
    for (const Tensor& in : inputs)
      if (out.defined() && out.is_same(in)) return;
  auto node = std::make_shared<FormulaNode>(op, std::move(formula));
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  node->next_edges.reserve(inputs.size());
  node->input_meta.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    node->next_edges.push_back(gradient_edge(in));
    if (in.defined())
      node->input_meta.push_back({in.sizes(), in.dtype(), true});
    else
      node->input_meta.push_back({});
  }
  node->saved.reserve(saved.size());
  for (const Tensor& s : saved) {
    // A saved output unpacks with this node as its grad_fn, at its own output number.
    size_t j = 0;
    while (j < outputs.size() && !(s.defined() && s.is_same(outputs[j]))) ++j;
    node->saved.emplace_back(s, j < outputs.size(), static_cast<uint32_t>(j));
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    const Tensor& out = outputs[j];
    if (!out.defined() || !is_floating_point(out.dtype())) continue;
    AutogradMeta& m = ensure_autograd_meta(out);
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(j);
    if (out.impl()->view_base) {
      out.impl()->view_tracks_base = true;
      out.impl()->view_version = version_of(out);
    }
  }
}

// ---------------------------------------------------------------------------------- in place

namespace {
// Makes `r` (already copied into self) self's history; for a view, the base's history becomes
// "the old base with the view's elements replaced by r" and the view's a slice of that.
void rebase_history(const Tensor& self, const Tensor& r) {
  Edge e = gradient_edge(r);
  TensorImpl* impl = self.impl();
  note_history_change(self.impl_ptr());
  if (impl->view_base) note_history_change(impl->view_base);
  if (!impl->view_base) {
    AutogradMeta& m = ensure_autograd_meta(self);
    m.grad_fn = e.node;
    m.output_nr = e.input_nr;
    return;
  }
  Tensor base(impl->view_base);
  Geometry b = geometry_of(base), v = geometry_of(self);
  auto node = std::make_shared<FormulaNode>("copy_slices", [b, v](const BackwardContext& c) {
    int64_t origin = 0;
    Tensor g = with_layout(c.grad(), b.strides, &origin);
    int64_t offset = origin + v.offset - b.offset;
    std::vector<Tensor> grads(2);
    if (c.needs_grad(0))
      grads[0] = as_strided_scatter(g, zeros(v.sizes, g.dtype()), v.sizes, v.strides, offset);
    if (c.needs_grad(1)) grads[1] = as_strided(g, v.sizes, v.strides, offset);
    return grads;
  });
  node->next_edges = {gradient_edge(base), e};
  node->input_meta = {{base.sizes(), base.dtype(), true}, {self.sizes(), self.dtype(), true}};
  AutogradMeta& bm = ensure_autograd_meta(base);
  bm.grad_fn = node;
  bm.output_nr = 0;
  AutogradMeta& vm = ensure_autograd_meta(self);
  vm.grad_fn = view_of_base_node(base, self);
  vm.output_nr = 0;
  impl->view_tracks_base = true;
  impl->view_version = version_of(self);
}

bool is_leaf_requiring_grad(const Tensor& t) {
  const AutogradMeta* m = autograd_meta(t);
  return m && m->requires_grad && !m->grad_fn;
}
}  // namespace

void apply_inplace(Tensor& self, const char* op, std::initializer_list<const Tensor*> others,
                   bool saves_self, const std::function<void()>& direct,
                   const std::function<Tensor(const Tensor& old_self)>& out_of_place) {
  check_defined(self, op, "self");
  // In trace mode every write is recorded functionally (trace_assign), never performed; otherwise
  // pending work that reads self's storage (or fills it) runs before the write.
  const bool tracing = trace_mode();
  if (!tracing) prepare_write(self);
  bool recording = grad_mode() && requires_grad(self);
  for (const Tensor* o : others) recording = recording || (grad_mode() && requires_grad(*o));
  // An integral or bool tensor has no gradient (as torch's), whatever is written into it.
  recording = recording && is_floating_point(self.dtype());
  // A device tensor has no reference kernels to write it directly: its new value is computed out of
  // place (recorded, then fused and run on the device) and copied in on the device.
  if (!recording && !tracing && !self.device().is_cuda()) {
    direct();
    return;
  }
  KILN_CHECK(!recording || !is_leaf_requiring_grad(self), op,
             ": a leaf tensor that requires grad (", describe(self),
             ") cannot be modified in place; do it under kiln::NoGradGuard, or use an "
             "out-of-place op");
  if (recording && self.impl()->view_base) {
    Tensor base(self.impl()->view_base);
    KILN_CHECK(!is_leaf_requiring_grad(base), op, ": a view of a leaf tensor that requires grad (",
               describe(base),
               ") cannot be modified in place; do it under kiln::NoGradGuard, or use an "
               "out-of-place op");
  }
  if (tracing && recording) check_traced_write_history(self, op);
  Tensor r = out_of_place(saves_self ? self.clone() : self);
  KILN_CHECK(can_cast(r.dtype(), self.dtype()), op, ": result type ", r.dtype(),
             " can't be cast to the desired output type ", self.dtype(), " of ", describe(self));
  KILN_CHECK(r.sizes() == self.sizes(), op, ": output with shape ", shape_str(self.sizes()),
             " doesn't match the broadcast shape ", shape_str(r.sizes()));
  if (r.dtype() != self.dtype()) r = r.to(self.dtype());
  // A new value that does not depend on self's history (fill_, zero_, copy_ from a constant)
  // still makes self this op's result, as in torch: self keeps requiring grad, and its old
  // history receives a zero gradient. detach: r may be the caller's own source tensor.
  if (recording && !requires_grad(r)) {
    r = r.detach();
    record(op, {self}, {r}, {}, [](const BackwardContext& c) { return one(zeros_like(c.grad())); });
  }
  // A leaf (or self) handed back unchanged has no node of its own to become self's history.
  if (recording && requires_grad(r) && (!autograd_meta(r)->grad_fn || r.is_same(self)))
    r = r.clone();
  {
    AutoGradMode off(false);
    if (tracing) {
      // The node that becomes self's storage's value holds r without its history: that history
      // may save self's storage (amin saves its output), and storage and node would hold each
      // other past the trace's end.
      trace_assign(self, r.detach());
    } else {
      materialize({r}, "an in-place op under autograd");
      prepare_write(self);
      copy_kernel(self, may_overlap(self, r) ? r.clone() : r);
    }
    bump_version(self);
  }
  if (recording) rebase_history(self, r);
}

// ---------------------------------------------------------------------------------- backward

namespace {
void validate_gradient(Tensor& g, const InputMeta& meta, const Node& node, size_t i) {
  if (g.sizes() != meta.sizes) {
    bool expandable = g.dim() >= static_cast<int64_t>(meta.sizes.size());
    for (size_t k = 0; expandable && k < meta.sizes.size(); ++k) {
      int64_t ms = meta.sizes[meta.sizes.size() - 1 - k], gs = g.size(g.dim() - 1 - k);
      expandable = ms == gs || ms == 1;
    }
    KILN_CHECK(expandable, "autograd: the gradient formula of ", node.name,
               " returned a gradient of shape ", shape_str(g.sizes()), " for input ", i,
               ", which does not reduce to its shape ", shape_str(meta.sizes));
    g = sum_to_size(g, meta.sizes);
  }
  if (g.dtype() != meta.dtype) g = g.to(meta.dtype);
}

void accumulate(Tensor& slot, Tensor g) {
  slot = slot.defined() ? add(slot, g) : std::move(g);
}

// Computes the .grad values that a backward pass with create_graph left pending in lazy mode. A
// pending value's node holds its inputs, the leaf among them, and the leaf holds its .grad: left
// pending, leaf, .grad and the values its history saved would form a cycle that is never freed.
// Computing .grad computes every value its history saved (they are its inputs, transitively), and
// computed nodes let go of their inputs. Inside a trace, .grad is restored when the trace ends.
void compute_leaf_gradients(const std::vector<std::shared_ptr<Node>>& accumulators) {
  if (trace_mode()) return;
  std::vector<Tensor> grads;
  for (const auto& node : accumulators)
    if (auto leaf = static_cast<const AccumulateGrad&>(*node).leaf.lock())
      if (is_pending(leaf->autograd->grad)) grads.push_back(leaf->autograd->grad);
  if (!grads.empty()) materialize(grads, "backward with create_graph");
}

// Frees a node's saved tensors after a backward pass ran it. A trace frees none from before it
// (tracing has no side effects): it lists them, and each call of the traced function frees them.
void release_after_pass(const std::shared_ptr<Node>& node) {
  if (trace_mode() && node->sequence_nr < t_trace_first_node)
    t_traced_frees.push_back(node);
  else
    node->release_saved();
}

struct ReadyOrder {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr < b->sequence_nr;  // latest created first
  }
};

// Runs one backward pass. With `inputs`, returns their gradients instead of accumulating into
// leaves (and runs only the part of the graph that leads to them).
std::vector<Tensor> run_backward(const std::vector<Tensor>& outputs,
                                 const std::vector<Tensor>& grad_outputs, bool keep_graph,
                                 bool create_graph, const std::vector<Tensor>* inputs,
                                 bool allow_unused) {
  ++t_backward_passes.started;
  if (!keep_graph) ++t_backward_passes.freed_graph;
  const char* api = inputs ? "autograd::grad" : "backward";
  KILN_CHECK(!outputs.empty(), api, ": no outputs given");
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), api, ": got ",
             grad_outputs.size(), " gradients for ", outputs.size(), " outputs");
  std::vector<Edge> roots;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    KILN_CHECK(out.defined(), api, ": output ", i, " is undefined");
    KILN_CHECK(requires_grad(out), api, ": element ", i, " of the outputs (", describe(out),
               ") does not require grad and has no grad_fn");
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      KILN_CHECK(out.numel() == 1, api,
                 ": a gradient can be implicitly created only for scalar outputs, but output ", i,
                 " is ", describe(out), "; pass its gradient");
      g = ones_like(out);
    } else {
      KILN_CHECK(g.sizes() == out.sizes(), api, ": gradient ", i, " has shape ",
                 shape_str(g.sizes()), " but output ", i, " has shape ", shape_str(out.sizes()),
                 " (", describe(g), " for ", describe(out), ")");
      KILN_CHECK(g.is_floating_point(), api, ": gradient ", i, " must be floating point, got ",
                 describe(g));
      if (g.dtype() != out.dtype()) g = g.to(out.dtype());
    }
    roots.push_back(gradient_edge(out));
    root_grads.push_back(g);
  }

  // Capture slots for autograd::grad: (node, output slot) -> indices of inputs.
  absl::flat_hash_map<std::pair<Node*, uint32_t>, std::vector<size_t>> captures;
  std::vector<Edge> input_edges;
  if (inputs) {
    for (size_t i = 0; i < inputs->size(); ++i) {
      const Tensor& in = (*inputs)[i];
      KILN_CHECK(in.defined(), api, ": input ", i, " is undefined");
      KILN_CHECK(requires_grad(in), api, ": input ", i, " (", describe(in),
                 ") does not require grad");
      input_edges.push_back(gradient_edge(in));
      captures[{input_edges.back().node.get(), input_edges.back().input_nr}].push_back(i);
    }
  }

  // Discover the graph: dependency counts, and (for grad) the nodes that lead to an input.
  absl::flat_hash_map<Node*, int64_t> deps;
  absl::flat_hash_map<Node*, std::vector<Node*>> parents;
  absl::flat_hash_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& r : roots)
    if (seen.insert(r.node.get()).second) stack.push_back(r.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      ++deps[e.node.get()];
      if (inputs) parents[e.node.get()].push_back(n);
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  absl::flat_hash_set<Node*> needed;
  if (inputs) {
    for (const Edge& e : input_edges)
      if (seen.contains(e.node.get()) && needed.insert(e.node.get()).second)
        stack.push_back(e.node.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (Node* p : parents[n])
        if (needed.insert(p).second) stack.push_back(p);
    }
  }
  auto is_needed = [&](Node* n) { return !inputs || needed.contains(n); };

  AutoGradMode mode(create_graph);
  absl::flat_hash_map<Node*, std::vector<Tensor>> buffers;
  auto slot = [&](const Edge& e) -> Tensor& {
    auto& buf = buffers[e.node.get()];
    if (buf.size() < e.node->num_outputs) buf.resize(e.node->num_outputs);
    return buf[e.input_nr];
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, ReadyOrder> ready;
  for (size_t i = 0; i < roots.size(); ++i) accumulate(slot(roots[i]), root_grads[i]);
  absl::flat_hash_set<Node*> started;
  for (const Edge& r : roots)
    if (deps[r.node.get()] == 0 && started.insert(r.node.get()).second) ready.push(r.node);

  std::vector<Tensor> captured(inputs ? inputs->size() : 0);
  std::vector<std::shared_ptr<Node>> accumulated;  // the leaves' sinks that ran (create_graph)
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads.resize(node->num_outputs);
    if (inputs) {
      for (uint32_t s = 0; s < node->num_outputs; ++s) {
        auto it = captures.find({node.get(), s});
        if (it == captures.end()) continue;
        for (size_t i : it->second) captured[i] = grads[s];
      }
    }
    for (auto& [s, weak] : node->retained) {
      auto impl = weak.lock();
      if (!impl || !grads[s].defined()) continue;
      Tensor& g = impl->autograd->grad;
      AutoGradMode off(false);
      g = g.defined() ? add(g, grads[s]) : grads[s].clone();
    }
    if (!is_needed(node.get()) || (inputs && node->is_accumulator())) continue;

    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> results;
    if (any) {
      std::vector<bool> needs(node->next_edges.size());
      for (size_t i = 0; i < needs.size(); ++i)
        needs[i] = node->next_edges[i].valid() && is_needed(node->next_edges[i].node.get());
      results = node->apply(std::move(grads), needs);
      if (create_graph && node->is_accumulator()) accumulated.push_back(node);
      KILN_CHECK(node->is_accumulator() || results.size() == node->next_edges.size(),
                 "autograd: the gradient formula of ", node->name, " returned ", results.size(),
                 " gradients for ", node->next_edges.size(), " inputs");
    }
    if (!keep_graph) release_after_pass(node);
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      if (i < results.size() && results[i].defined()) {
        validate_gradient(results[i], node->input_meta[i], *node, i);
        accumulate(slot(e), std::move(results[i]));
      }
      if (--deps[e.node.get()] == 0) ready.push(e.node);
    }
  }

  if (!accumulated.empty()) compute_leaf_gradients(accumulated);
  if (!inputs) return {};
  for (size_t i = 0; i < captured.size(); ++i) {
    if (captured[i].defined()) continue;
    bool reachable = seen.contains(input_edges[i].node.get());
    KILN_CHECK(reachable || allow_unused, api, ": input ", i, " (", describe((*inputs)[i]),
               ") was not used to compute the outputs; pass allow_unused=true if that is "
               "intended");
    if (reachable) captured[i] = zeros_like((*inputs)[i]);
  }
  return captured;
}
}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------------- public API

bool is_grad_enabled() {
  return detail::t_grad_mode;
}
void set_grad_enabled(bool enabled) {
  detail::t_grad_mode = enabled;
}

namespace autograd {
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph,
                         bool create_graph, bool allow_unused) {
  KILN_CHECK(!inputs.empty(), "autograd::grad: no inputs given");
  return detail::run_backward(outputs, grad_outputs, retain_graph.value_or(create_graph),
                              create_graph, &inputs, allow_unused);
}

void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors,
              std::optional<bool> retain_graph, bool create_graph) {
  detail::run_backward(tensors, grad_tensors, retain_graph.value_or(create_graph), create_graph,
                       nullptr, false);
}
}  // namespace autograd

Tensor& Tensor::requires_grad_(bool requires_grad) {
  detail::check_defined(*this, "requires_grad_");
  KILN_CHECK(!requires_grad || is_floating_point(),
             "requires_grad_: only floating-point tensors can require gradients, got ",
             detail::describe(*this));
  KILN_CHECK(is_leaf() || requires_grad, "requires_grad_: ", detail::describe(*this),
             " is not a leaf (it was computed by ", grad_fn_name(),
             "); use detach() to get a tensor that does not require grad");
  if (is_leaf()) detail::ensure_autograd_meta(*this).requires_grad = requires_grad;
  return *this;
}

bool Tensor::requires_grad() const {
  return detail::requires_grad(*this);
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  if (defined() && detail::trace_mode()) {
    detail::TracedGrad& r = detail::traced_grad_record(impl_ptr());
    detail::note_traced_grad_read(r, r.leaf->autograd->grad);
    return r.leaf->autograd->grad;
  }
  const detail::AutogradMeta* m = defined() ? detail::autograd_meta(*this) : nullptr;
  return m ? m->grad : kUndefined;
}

Tensor& Tensor::mutable_grad() {
  detail::check_defined(*this, "mutable_grad");
  if (detail::trace_mode()) {
    // Taken to be written (zero_grad assigns it): a read through it is not guarded on.
    detail::TracedGrad& r = detail::traced_grad_record(impl_ptr());
    r.assigned = true;
    return r.leaf->autograd->grad;
  }
  return detail::ensure_autograd_meta(*this).grad;
}

void Tensor::backward(const Tensor& gradient, std::optional<bool> retain_graph,
                      bool create_graph) const {
  autograd::backward({*this},
                     gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{},
                     retain_graph, create_graph);
}

Tensor Tensor::detach() const {
  detail::check_defined(*this, "detach");
  return detail::alias(*this);
}

bool Tensor::is_leaf() const {
  if (!defined()) return true;
  detail::requires_grad(*this);  // brings a view's history up to date
  const detail::AutogradMeta* m = detail::autograd_meta(*this);
  return !m || !m->grad_fn;
}

std::string Tensor::grad_fn_name() const {
  if (!defined() || is_leaf()) return "";
  return detail::autograd_meta(*this)->grad_fn->name;
}

void Tensor::retain_grad() const {
  detail::check_defined(*this, "retain_grad");
  KILN_CHECK(requires_grad(), "retain_grad: ", detail::describe(*this), " does not require grad");
  if (is_leaf()) return;
  detail::AutogradMeta& m = detail::ensure_autograd_meta(*this);
  if (m.retains_grad) return;
  m.retains_grad = true;
  m.grad_fn->retained.emplace_back(m.output_nr, impl_ptr());
}

uint64_t Tensor::version() const {
  detail::check_defined(*this, "version");
  return detail::version_of(*this);
}

}  // namespace kiln
