// Lazy recording: pending tensors, the live list of uncomputed nodes, and the hooks that turn
// pending tensors concrete (see lib/lazy.h for the model).
#include "lib/lazy.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include <absl/container/flat_hash_set.h>

#include "kiln/error.h"
#include "lib/env.h"
#include "lib/int_math.h"
#include "lib/lazy_saved.h"
#include "lib/pool.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

namespace {
// Constant-initialized, initial-exec thread-locals: every op reads them, and a dynamic initializer
// or the general TLS model would put a call on that path.
const bool g_default_lazy = env_bool("KILN_LAZY", OnBad::Warn);
#define KILN_FAST_TLS __attribute__((tls_model("initial-exec"))) thread_local
KILN_FAST_TLS signed char t_lazy = -1;  // -1: not yet set on this thread (KILN_LAZY decides)
KILN_FAST_TLS TraceState* t_trace = nullptr;

inline bool lazy_on() {
  if (t_lazy < 0) t_lazy = g_default_lazy;
  return t_lazy != 0;
}
// Set while the evaluator runs a graph: kernels then see only concrete tensors, and a flush
// (from an in-place kernel on an input that pending nodes read) would re-enter the evaluation.
KILN_FAST_TLS int t_evaluating = 0;
KILN_FAST_TLS const char* t_reason = "";
KILN_FAST_TLS const char* t_cause = nullptr;         // the MaterializeCause in scope
KILN_FAST_TLS const char* t_reason_cause = nullptr;  // t_cause when the evaluator was called

KILN_FAST_TLS int t_inferring = 0;
KILN_FAST_TLS int t_lock_depth = 0;  // the lazy lock's re-entry depth on this thread

}  // namespace

// A thread's uncomputed nodes, oldest first (under the lazy lock). When the thread ends, what is
// left moves to the orphans' list: its pending tensors may live on in other threads.
struct LiveList {
  LazyNode* head = nullptr;
  LazyNode* tail = nullptr;
  // Written under the lock; atomic because the owner thread reads it without the lock after each
  // recording (KILN_MAX_PENDING), while another thread may free one of its nodes.
  std::atomic<int64_t> count{0};
  // While the owner thread runs jit::trace: the serial of the trace's first node. Nodes from it on
  // are the trace being recorded, not pending work: other threads' flushes leave them alone.
  uint64_t tracing_from = 0;
};

namespace {
// Lazy recording's process-wide state. Never destroyed: threads may end (and hand their lists to
// the orphans) after static destruction began.
struct LazyState {
  // The lazy lock (see lib/lazy.h): taken once per recording and per hand-over, re-entrant through
  // the per-thread t_lock_depth so that freeing nodes under it (which frees their producers) works.
  std::mutex mutex;
  std::condition_variable_any evaluation_done;  // waited on with mutex held once
  uint64_t serial = 0;                          // under mutex: the last recorded node's number
  LiveList orphans;                             // under mutex: the lists of threads that ended
  // Under mutex: every thread's list and the orphans', what a write to a storage that another
  // thread's pending work reads must flush.
  std::vector<LiveList*> lists{&orphans};
  // atomic: the pending nodes a thread may hold before they are evaluated (KILN_MAX_PENDING).
  std::atomic<int64_t> max_pending{env_int("KILN_MAX_PENDING", OnBad::Warn)};
  Evaluator evaluator = nullptr;  // set once at start (exec/init.cpp), then read-only
  // Under mutex: the serials (never reused, unlike addresses of pooled nodes) of the uncomputed
  // nodes whose values autograd saved (lib/lazy_saved.h).
  absl::flat_hash_set<uint64_t> saved_for_backward;
};
LazyState& lazy_state() {
  static auto* s = new LazyState();
  return *s;
}
std::vector<LiveList*>& all_lists() {
  return lazy_state().lists;
}

void call_evaluator(const std::vector<LazyRef>& requests, const char* reason) {
  if (t_inferring > 0) throw NeedsData{};
  t_reason = reason;
  t_reason_cause = t_cause;
  lazy_state().evaluator(requests);
}

void splice_into(LiveList& from, LiveList& to) {
  for (LazyNode* n = from.head; n; n = n->live_next) n->live_list = &to;
  if (!from.head) return;
  if (to.tail) {
    to.tail->live_next = from.head;
    from.head->live_prev = to.tail;
  } else {
    to.head = from.head;
  }
  to.tail = from.tail;
  to.count.fetch_add(from.count.load(std::memory_order_relaxed), std::memory_order_relaxed);
  from.head = from.tail = nullptr;
  from.count.store(0, std::memory_order_relaxed);
}

// This thread's list, made at its first recording and handed to the orphans at its end. A plain
// pointer read on the hot path; the owner object only runs the hand-over.
KILN_FAST_TLS LiveList* t_live = nullptr;
struct LiveListOwner {
  LiveList list;
  LiveListOwner() { all_lists().push_back(&list); }
  ~LiveListOwner() {
    LazyLock lock;
    splice_into(list, lazy_state().orphans);
    std::vector<LiveList*>& lists = all_lists();
    lists.erase(std::find(lists.begin(), lists.end(), &list));
    t_live = nullptr;
  }
};
// Under the lock.
LiveList& this_thread_list() {
  if (!t_live) {
    static thread_local LiveListOwner owner;
    t_live = &owner.list;
  }
  return *t_live;
}

// Under the lock.
void live_insert(LazyNode* n) {
  n->serial = ++lazy_state().serial;
  // Type inference (jit/infer.cpp; KILN_VERIFY runs it after each pass) records an op on
  // placeholders whose producer never runs, on the thread that builds a plan, while other threads
  // run. Those nodes stay off every live list: a write to a value recorded on another thread (also
  // the mutable data_ptr()) flushes all the lists (flush_all_threads), and one that took them
  // evaluated a placeholder, an undefined graph input: hand_over raised "sizes: called on an
  // undefined tensor" in that thread, and the value it was reading was computed a second time.
  // Nothing needs them listed: inference never reads data (NeedsData) nor flushes.
  if (t_inferring > 0) return;
  LiveList& l = this_thread_list();
  n->live_list = &l;
  n->live_prev = l.tail;
  n->live_next = nullptr;
  if (l.tail)
    l.tail->live_next = n;
  else
    l.head = n;
  l.tail = n;
  l.count.fetch_add(1, std::memory_order_relaxed);
}

void live_remove(LazyNode* n) {
  LiveList* l = n->live_list;
  if (!l) return;
  if (n->live_prev)
    n->live_prev->live_next = n->live_next;
  else
    l->head = n->live_next;
  if (n->live_next)
    n->live_next->live_prev = n->live_prev;
  else
    l->tail = n->live_prev;
  n->live_list = nullptr;
  l->count.fetch_sub(1, std::memory_order_relaxed);
}

// A computed node whose last consumer went: its result storages stop counting as read.
void release_reader_storages(LazyNode& n) {
  for (const auto& s : n.reader_storages) s->lazy_readers.fetch_sub(1, std::memory_order_relaxed);
  n.reader_storages.clear();
}

// Releasing a node's inputs can release a long chain of producers; they are queued here and
// freed one at a time instead of recursively.
struct ReleaseQueue {
  std::vector<std::shared_ptr<LazyNode>> nodes;
  std::vector<Tensor> tensors;
};
thread_local ReleaseQueue t_release;
KILN_FAST_TLS bool t_releasing = false;

void release_inputs(absl::InlinedVector<LazyInput, 3>& inputs) {
  // Most releases free nothing (the producers are still held): only touch the queue when
  // something is the last reference.
  bool queued = false;
  for (LazyInput& in : inputs) {
    if (in.ref.node && --in.ref.node->consumers == 0) release_reader_storages(*in.ref.node);
    if (in.ref.node && in.ref.node.use_count() == 1) {
      t_release.nodes.push_back(std::move(in.ref.node));
      queued = true;
    }
    if (in.tensor.defined()) {
      if (!in.tensor.impl()->wrapped_number)
        in.tensor.impl()->storage->lazy_readers.fetch_sub(1, std::memory_order_relaxed);
      if (in.tensor.impl_ptr().use_count() == 1) {
        t_release.tensors.push_back(std::move(in.tensor));
        queued = true;
      }
    }
  }
  inputs.clear();
  if (!queued || t_releasing) return;
  t_releasing = true;
  ReleaseQueue& q = t_release;
  while (!q.nodes.empty() || !q.tensors.empty()) {
    if (!q.nodes.empty()) {
      std::shared_ptr<LazyNode> n = std::move(q.nodes.back());
      q.nodes.pop_back();
      n.reset();
    } else {
      Tensor t = std::move(q.tensors.back());
      q.tensors.pop_back();
    }
  }
  t_releasing = false;
}

std::shared_ptr<TensorImpl> pending_impl(const LazyRef& ref, const LazyType& type) {
  auto storage = make_pooled<Storage>();
  const char* op = ref.node->op ? ref.node->op->name.c_str() : "lazy";
  storage->nbytes = checked_nbytes(shape_numel(type.sizes), type.dtype, op, type.sizes);
  storage->device = type.device;
  set_storage_lazy(*storage, ref, false);
  auto impl = make_pooled<TensorImpl>();
  impl->sizes = type.sizes;
  impl->strides = contiguous_strides(type.sizes);
  impl->dtype = type.dtype;
  impl->lazy = ref;
  ref.node->storages[ref.index] = storage;
  impl->storage = std::move(storage);
  return impl;
}

bool covers_root(const TensorImpl& impl, const LazyNode& node, uint32_t index) {
  const LazyType& root = node.outputs[index];
  return impl.offset == 0 && impl.dtype == root.dtype && impl.sizes == root.sizes &&
         is_contiguous_layout(impl.sizes, impl.strides);
}
}  // namespace

LazyNode::~LazyNode() {
  LazyLock lock;
  forget_saved_for_backward(*this);
  live_remove(this);
  release_reader_storages(*this);
  release_inputs(inputs);
}

void LazyNode::mark_computed(std::vector<Tensor> values) {
  results = std::move(values);
  computed = true;
  forget_saved_for_backward(*this);
  live_remove(this);
  release_inputs(inputs);
}

void mark_saved_for_backward(const Tensor& t) {
  if (!is_pending(t)) return;
  LazyLock lock;
  const LazyRef& ref = t.impl()->storage->lazy;
  if (ref && !ref.node->computed) lazy_state().saved_for_backward.insert(ref.node->serial);
}
bool saved_for_backward(const LazyNode& n) {
  return lazy_state().saved_for_backward.contains(n.serial);
}
void forget_saved_for_backward(const LazyNode& n) {
  auto& saved = lazy_state().saved_for_backward;
  if (!saved.empty()) saved.erase(n.serial);
}

void LazyLock::lock() {
  if (t_lock_depth++ == 0) lazy_state().mutex.lock();
  held_ = true;
}
void LazyLock::unlock() {
  held_ = false;
  if (--t_lock_depth == 0) lazy_state().mutex.unlock();
}
void LazyLock::wait_for_evaluations() {
  KILN_CHECK(held_ && t_lock_depth == 1, "lazy: waiting for an evaluation inside a nested lock");
  lazy_state().evaluation_done.wait(lazy_state().mutex);
}
void notify_evaluations() {
  lazy_state().evaluation_done.notify_all();
}

void set_storage_lazy(Storage& s, LazyRef ref, bool bump) {
  const bool pending = static_cast<bool>(ref);
  s.lazy = std::move(ref);
  if (bump) ++s.lazy_generation;
  s.pending.store(pending, std::memory_order_release);
}

void note_computed_storage(LazyNode& n, const std::shared_ptr<Storage>& s) {
  if (n.consumers == 0) return;
  s->lazy_readers.fetch_add(1, std::memory_order_relaxed);
  n.reader_storages.push_back(s);
}

bool lazy_mode() {
  return lazy_on();
}
bool trace_mode() {
  return t_trace != nullptr;
}
TraceState* trace_state() {
  return t_trace;
}

namespace {
// The trace running on this thread: the serial of its first node, and its placeholders (held, so
// that a freed one's address cannot come back as another node's).
KILN_FAST_TLS uint64_t t_trace_first_serial = 0;
thread_local std::vector<std::shared_ptr<LazyNode>> t_trace_placeholders;

// When a trace ends (returned or failed), nodes it recorded that read a placeholder can never be
// computed; one still alive (held by a value the function stored outside, or by a history a
// failure left) comes off this thread's live list, so that later flushes, which compute the whole
// list, do not fail on it. Reading such a value still raises, naming the trace. One pass in
// recording order: a node's producers come before it.
void detach_placeholder_readers() {
  LazyLock lock;
  absl::flat_hash_set<const LazyNode*> reads;
  for (const auto& p : t_trace_placeholders) reads.insert(p.get());
  for (LazyNode* n = t_live ? t_live->head : nullptr; n;) {
    LazyNode* next = n->live_next;
    bool reads_placeholder = n->serial >= t_trace_first_serial && reads.contains(n);
    if (n->serial >= t_trace_first_serial)
      for (const LazyInput& in : n->inputs)
        reads_placeholder = reads_placeholder || reads.contains(in.ref.node.get());
    if (reads_placeholder) {
      reads.insert(n);
      live_remove(n);
    }
    n = next;
  }
  t_trace_placeholders.clear();
  if (t_live) t_live->tracing_from = 0;  // what is left of the trace is pending work now
}
}  // namespace

void set_trace_state(TraceState* state) {
  if (state) {
    LazyLock lock;
    t_trace_first_serial = lazy_state().serial + 1;
    this_thread_list().tracing_from = t_trace_first_serial;
  }
  const bool ending = t_trace && !state;
  t_trace = state;
  if (ending) detach_placeholder_readers();
}

Tensor flat_storage_tensor(const std::shared_ptr<Storage>& storage, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->sizes = {static_cast<int64_t>(storage->nbytes / element_size(dtype))};
  impl->strides = {1};
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor trace_placeholder(const OpDef& input_op, int64_t index, const Tensor& t) {
  Tensor p = lazy_record1(input_op, {}, {index}, {t.sizes(), t.dtype(), t.device()});
  if (t_trace) t_trace_placeholders.push_back(p.impl()->lazy.node);
  return p;
}

void trace_assign(const Tensor& self, const Tensor& value) {
  static const OpDef* as_strided_scatter = find_op("as_strided_scatter");
  static const OpDef* reshape = find_op("reshape");
  KILN_CHECK(as_strided_scatter && as_strided_scatter->invoke && reshape,
             "jit::trace: in-place writes need as_strided_scatter in the op table");
  std::shared_ptr<Storage> storage = self.impl()->storage;
  TensorImpl* impl = self.impl();
  Tensor v = value.dtype() == self.dtype() ? value : value.to(self.dtype());
  if (v.sizes() != self.sizes()) v = v.expand(self.sizes());
  // The storage's current value as one tensor: its pending root, or the whole concrete storage.
  LazyRef current;
  {
    LazyLock lock;
    current = storage->lazy;
  }
  const bool first_write = !current;
  Tensor root;
  if (first_write) {
    root = flat_storage_tensor(storage, self.dtype());
  } else {
    const LazyType& rt = current.node->outputs[current.index];
    root = Tensor(std::make_shared<TensorImpl>());
    root.impl()->storage = storage;
    root.impl()->sizes = rt.sizes;
    root.impl()->strides = contiguous_strides(rt.sizes);
    root.impl()->dtype = rt.dtype;
  }
  const bool whole = impl->offset == 0 && is_contiguous_layout(impl->sizes, impl->strides) &&
                     self.numel() == root.numel();
  Tensor updated = whole ? v.reshape(root.sizes())
                         : lazy_record1(*as_strided_scatter, {root, v},
                                        {impl->sizes, impl->strides, int64_t{impl->offset}},
                                        {root.sizes(), root.dtype()});
  // The storage's value: a node output of its own (`updated` may be a view of another value, or a
  // leaf), which fills this storage when a read inside the trace computes it (the identity
  // reshape goes in the passes).
  const Tensor written =
      lazy_record1(*reshape, {updated}, {root.sizes()}, {root.sizes(), root.dtype()});
  const LazyRef ref = lazy_input(written).ref;
  if (first_write) {
    t_trace->written.push_back(storage);
    t_trace->written_versions.push_back(storage->version.load());
  }
  LazyLock lock;
  ref.node->storages[ref.index] = storage;
  // A read inside the trace may have filled the storage with its earlier value (a speculative
  // one: a captured storage's data is the user's and stays): dropped, so that the next read
  // computes the written value.
  const bool captured = std::find(t_trace->written.begin(), t_trace->written.end(), storage) !=
                        t_trace->written.end();
  if (!captured && storage->data) {
    if (storage->deleter) storage->deleter(storage->data);
    storage->data = nullptr;
    storage->deleter = nullptr;
    storage->owns_allocation = false;
  }
  set_storage_lazy(*storage, ref, true);
}

namespace {
KILN_FAST_TLS int t_value_checks = 0;
}  // namespace
ValueCheckScope::ValueCheckScope() {
  ++t_value_checks;
}
ValueCheckScope::~ValueCheckScope() {
  --t_value_checks;
}

void trace_warn_value_read(const Tensor& t, const char* what) {
  if (!t_trace || t_value_checks > 0) return;
  std::string msg = std::string("jit::trace: ") + what + " read the value of a " +
                    shape_str(t.sizes()) +
                    " tensor inside the traced function; the trace is specialized to that value "
                    "and will not follow it when the inputs change (data-dependent control flow "
                    "cannot be traced)";
  for (const std::string& w : t_trace->warnings)
    if (w == msg) return;
  t_trace->warnings.push_back(msg);
}
void set_lazy_mode(bool on) {
  t_lazy = on ? 1 : 0;
}

bool in_evaluation() {
  return t_evaluating > 0;
}

// CUDA tensors have no elementwise reference kernels: their ops are always recorded, and run as
// (one-node) groups compiled for the device, also with KILN_LAZY=0. Inside the evaluator (which
// calls GEMMs and copies on device tensors directly) they are not.
inline bool records_cuda(const Tensor& t) {
  return t.defined() && t.device().is_cuda() && t_evaluating == 0;
}
bool should_record(const Tensor& a) {
  return lazy_on() || records_cuda(a);
}
bool should_record(const Tensor& a, const Tensor& b) {
  return lazy_on() || records_cuda(a) || records_cuda(b);
}
bool should_record(const std::vector<Tensor>& inputs) {
  if (lazy_on()) return true;
  for (const Tensor& t : inputs)
    if (records_cuda(t)) return true;
  return false;
}

LazyInput lazy_input(const Tensor& t) {
  LazyInput in;
  if (!t.defined()) return in;
  LazyLock lock;
  TensorImpl* impl = t.impl();
  Storage& storage = *impl->storage;
  if (!storage.lazy) {
    // Wrapped numbers are never written in place: they need no reader count.
    if (!impl->wrapped_number) storage.lazy_readers.fetch_add(1, std::memory_order_relaxed);
    in.tensor = t;
    return in;
  }
  if (impl->lazy && impl->lazy_generation == storage.lazy_generation) {
    in.ref = impl->lazy;
    return in;
  }
  const LazyRef& root = storage.lazy;
  if (covers_root(*impl, *root.node, root.index)) {
    in.ref = root;
  } else {
    // A view whose cached node is missing or stale: re-derive it from the storage's value.
    static const OpDef* as_strided = find_op("as_strided");
    Tensor base(std::make_shared<TensorImpl>());
    base.impl()->storage = impl->storage;
    const LazyType& rt = root.node->outputs[root.index];
    base.impl()->sizes = rt.sizes;
    base.impl()->strides = contiguous_strides(rt.sizes);
    base.impl()->dtype = rt.dtype;
    base.impl()->lazy = root;
    base.impl()->lazy_generation = storage.lazy_generation;
    in.ref = lazy_record(*as_strided, {base}, {impl->sizes, impl->strides, int64_t{impl->offset}},
                         {{impl->sizes, impl->dtype}})[0]
                 .impl()
                 ->lazy;
  }
  // Cached for views of a pending storage only. A storage with data is one a trace wrote
  // (trace_assign): its value node reads the written tensors themselves, so caching it in their
  // TensorImpl would make a cycle (impl -> node -> impl) that outlives the trace.
  if (!storage.data) {
    impl->lazy = in.ref;
    impl->lazy_generation = storage.lazy_generation;
  }
  return in;
}

namespace {
// Under the lock.
void add_input(LazyNode& node, LazyInput in) {
  if (in.ref) ++in.ref.node->consumers;
  node.inputs.push_back(std::move(in));
}

std::shared_ptr<LazyNode> new_node(const OpDef& def, const Tensor* inputs, size_t count,
                                   Attrs&& attrs) {
  auto node = make_pooled<LazyNode>();
  node->op = &def;
  node->attrs = std::move(attrs);
  for (size_t i = 0; i < count; ++i) add_input(*node, lazy_input(inputs[i]));
  return node;
}

// The device an op's outputs live on: its inputs'. A 0-dim CPU tensor (a number) may join tensors
// of any device, as in torch; other mixes raise, naming the op and the devices. An op without
// tensor inputs (a trace's input placeholder) keeps the device its caller gave.
void set_output_devices(const OpDef& def, const Tensor* inputs, size_t count, LazyType* outputs,
                        size_t num_outputs) {
  if (def.kind == OpKind::Transfer) return;  // states its output's device itself
  const Tensor* first = nullptr;
  const Tensor* number = nullptr;
  for (size_t i = 0; i < count; ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (t.device().is_cpu() && t.dim() == 0) {
      number = &t;
      continue;
    }
    if (!first) {
      first = &t;
    } else {
      KILN_CHECK(t.device() == first->device(), def.name,
                 ": expected all tensors on one device, got ", describe(*first), " on ",
                 first->device(), " and ", describe(t), " on ", t.device());
    }
  }
  if (!first && !number) return;
  const Device d = first ? first->device() : kCPU;
  for (size_t i = 0; i < num_outputs; ++i) outputs[i].device = d;
}

// A flush evaluates, which must not happen under the lock (a recording nested in one, such as a
// view re-derived by lazy_input): the next recording outside it flushes instead.
void after_record() {
  if (t_lock_depth == 0 && t_live &&
      t_live->count.load(std::memory_order_relaxed) >
          lazy_state().max_pending.load(std::memory_order_relaxed))
    flush_pending("the pending trace passed KILN_MAX_PENDING");
}
}  // namespace

std::vector<Tensor> lazy_record(const OpDef& def, std::vector<Tensor> inputs, Attrs attrs,
                                std::vector<LazyType> outputs) {
  set_output_devices(def, inputs.data(), inputs.size(), outputs.data(), outputs.size());
  std::vector<Tensor> result;
  {
    LazyLock lock;
    std::shared_ptr<LazyNode> node = new_node(def, inputs.data(), inputs.size(), std::move(attrs));
    node->storages.resize(outputs.size());
    node->outputs.assign(std::make_move_iterator(outputs.begin()),
                         std::make_move_iterator(outputs.end()));
    live_insert(node.get());
    result.reserve(node->outputs.size());
    for (uint32_t i = 0; i < node->outputs.size(); ++i)
      result.emplace_back(pending_impl(LazyRef{node, i}, node->outputs[i]));
  }
  after_record();
  return result;
}

Tensor lazy_record1(const OpDef& def, std::initializer_list<Tensor> inputs, Attrs attrs,
                    LazyType output) {
  return lazy_record1(def, inputs.begin(), inputs.size(), std::move(attrs), std::move(output));
}

Tensor lazy_record1(const OpDef& def, const std::vector<Tensor>& inputs, Attrs attrs,
                    LazyType output) {
  return lazy_record1(def, inputs.data(), inputs.size(), std::move(attrs), std::move(output));
}

Tensor lazy_record1(const OpDef& def, const Tensor* inputs, size_t count, Attrs attrs,
                    LazyType output) {
  set_output_devices(def, inputs, count, &output, 1);
  Tensor result;
  {
    LazyLock lock;
    std::shared_ptr<LazyNode> node = new_node(def, inputs, count, std::move(attrs));
    node->storages.resize(1);
    node->outputs.push_back(std::move(output));
    live_insert(node.get());
    result = Tensor(pending_impl(LazyRef{node, 0}, node->outputs[0]));
  }
  after_record();
  return result;
}

void lazy_record_view(const OpDef& def, const Tensor& input, Attrs attrs, const Tensor& view) {
  if (!is_pending(input)) return;
  TensorImpl* impl = view.impl();
  LazyLock lock;
  auto node = make_pooled<LazyNode>();
  node->op = &def;
  node->attrs = std::move(attrs);
  add_input(*node, lazy_input(input));
  node->outputs.push_back({impl->sizes, impl->dtype, impl->storage->device});
  node->storages.resize(1);  // a view fills no storage of its own
  live_insert(node.get());
  impl->lazy = LazyRef{std::move(node), 0};
  impl->lazy_generation = impl->storage->lazy_generation;
}

void set_evaluator(Evaluator e) {
  lazy_state().evaluator = e;
}

void materialize(const std::vector<Tensor>& tensors, const char* reason) {
  std::vector<LazyRef> requests;
  {
    LazyLock lock;
    for (const Tensor& t : tensors)
      if (t.defined() && t.impl()->storage->lazy) requests.push_back(t.impl()->storage->lazy);
  }
  if (requests.empty()) return;
  KILN_CHECK(lazy_state().evaluator, "lazy: no evaluator is registered (is the jit linked in?)");
  call_evaluator(requests, reason);
}

void materialize_storage(TensorImpl& impl) {
  KILN_CHECK(lazy_state().evaluator, "lazy: no evaluator is registered (is the jit linked in?)");
  if (t_trace) {
    // Inside a trace the value is computed from the example inputs and the storage stays
    // symbolic; data the function wrote into a captured tensor cannot be read back.
    for (const auto& w : t_trace->written)
      KILN_CHECK(w != impl.storage, "jit::trace: reading the data of a ", shape_str(impl.sizes),
                 " tensor that the traced function wrote in place is not supported; use tensor "
                 "ops instead of reading values");
    Tensor t(std::shared_ptr<TensorImpl>(std::shared_ptr<TensorImpl>(), &impl));
    trace_warn_value_read(t, "data access (item(), data_ptr(), printing)");
    LazyRef ref;
    {
      LazyLock lock;
      if (!impl.storage->data) ref = impl.storage->lazy;
    }
    if (ref) call_evaluator({ref}, "a value read inside a trace");
    return;
  }
  LazyRef ref;
  {
    LazyLock lock;
    ref = impl.storage->lazy;
  }
  if (!ref) return;  // another thread computed it meanwhile
  call_evaluator({ref}, "data access");
  KILN_CHECK(!impl.storage->pending.load(std::memory_order_acquire), "lazy: materializing a ",
             shape_str(impl.sizes), " tensor left it pending");
}

InferenceScope::InferenceScope() {
  ++t_inferring;
}
InferenceScope::~InferenceScope() {
  --t_inferring;
}
EvaluationScope::EvaluationScope() {
  ++t_evaluating;
}
EvaluationScope::~EvaluationScope() {
  --t_evaluating;
}

// The outermost cause wins: printing reads through item(), to_vector() through data_ptr().
MaterializeCause::MaterializeCause(const char* what) noexcept : previous_(t_cause) {
  if (!t_cause) t_cause = what;
}
MaterializeCause::~MaterializeCause() {
  t_cause = previous_;
}

std::string evaluation_reason() {
  if (!t_reason_cause) return t_reason;
  return std::string(t_reason_cause) + " (" + t_reason + ")";
}

namespace {
// The storages the nodes of `l` fill, as requests (under the lock). A trace that another thread
// is recording is left out: its nodes read placeholders of the traced function's arguments, so
// evaluating them here raised in this thread.
void add_requests(const LiveList& l, std::vector<LazyRef>& requests) {
  for (LazyNode* n = l.head; n; n = n->live_next) {
    if (l.tracing_from != 0 && n->serial >= l.tracing_from) continue;
    for (uint32_t i = 0; i < n->outputs.size(); ++i) {
      std::shared_ptr<Storage> s = n->storages[i].lock();
      if (s && s->lazy.node.get() == n && s->lazy.index == i) requests.push_back(s->lazy);
    }
  }
}

bool flush_allowed() {
  // Inside a trace nothing runs: its nodes are the trace, whatever their number.
  return lazy_state().evaluator && t_evaluating == 0 && !t_trace;
}

// Every thread's pending work: what a write to a storage that other threads' nodes read needs.
void flush_all_threads(const char* reason) {
  if (!flush_allowed()) return;
  std::vector<LazyRef> requests;
  {
    LazyLock lock;
    for (const LiveList* l : all_lists()) add_requests(*l, requests);
  }
  if (!requests.empty()) call_evaluator(requests, reason);
}

bool written_storage_is_read(Storage& s) {
  return s.pending.load(std::memory_order_acquire) ||
         s.lazy_readers.load(std::memory_order_acquire) > 0;
}
}  // namespace

void flush_pending(const char* reason) {
  // Only this thread adds to its list: a count of 0 read without the lock means nothing to flush.
  if (!flush_allowed() || !t_live || t_live->count.load(std::memory_order_relaxed) == 0) return;
  std::vector<LazyRef> requests;
  {
    LazyLock lock;
    add_requests(*t_live, requests);
  }
  if (!requests.empty()) call_evaluator(requests, reason);
}

void prepare_write(const Tensor& t) {
  Storage& s = *t.impl()->storage;
  if (!written_storage_is_read(s)) return;
  static constexpr const char* kWhy =
      "an in-place write to a tensor that pending work reads or fills";
  flush_pending(kWhy);
  // What is left belongs to other threads (a tensor shared between them) or to nobody's list.
  if (written_storage_is_read(s)) flush_all_threads(kWhy);
}

int64_t pending_count() {
  LazyLock lock;
  return t_live ? t_live->count.load(std::memory_order_relaxed) : 0;
}
int64_t max_pending() {
  return lazy_state().max_pending.load();
}
void set_max_pending(int64_t n) {
  KILN_CHECK(n > 0, "set_max_pending: expected a positive limit, got ", n);
  lazy_state().max_pending = n;
}

}  // namespace kiln::detail
