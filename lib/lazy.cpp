// Lazy recording: pending tensors, the live list of uncomputed nodes, and the hooks that turn
// pending tensors concrete (see lib/lazy.h for the model).
#include "lib/lazy.h"

#include <cstdlib>
#include <mutex>

#include "kiln/error.h"
#include "lib/int_math.h"
#include "lib/pool.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

namespace {
bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  std::string s(v);
  return !(s == "0" || s == "false" || s == "off" || s == "no");
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  KILN_CHECK(end && *end == '\0' && n > 0, name, " must be a positive integer, got '", v, "'");
  return n;
}

// Constant-initialized, initial-exec thread-locals: every op reads them, and a dynamic initializer
// or the general TLS model would put a call on that path.
const bool g_default_lazy = env_flag("KILN_LAZY", true);
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

std::atomic<int64_t> g_max_pending{env_int("KILN_MAX_PENDING", 10000)};
Evaluator g_evaluator = nullptr;

KILN_FAST_TLS int t_inferring = 0;

void call_evaluator(const std::vector<LazyRef>& requests, const char* reason) {
  if (t_inferring > 0) throw NeedsData{};
  t_reason = reason;
  t_reason_cause = t_cause;
  g_evaluator(requests);
}

// The live list: every uncomputed node, oldest first. One list for the process (a pending tensor
// may be handed to another thread); recording on one thread at a time is the common case.
// A spin lock: held for a few pointer updates, and uncontended in the common case, where a mutex
// would cost more than the update.
struct SpinLock {
  std::atomic_flag flag = ATOMIC_FLAG_INIT;
  void lock() {
    while (flag.test_and_set(std::memory_order_acquire)) {
    }
  }
  void unlock() { flag.clear(std::memory_order_release); }
};
SpinLock g_live_mutex;
LazyNode* g_live_head = nullptr;
LazyNode* g_live_tail = nullptr;
int64_t g_live_count = 0;
uint64_t g_serial = 0;

void live_insert(LazyNode* n) {
  std::lock_guard<SpinLock> lock(g_live_mutex);
  n->serial = ++g_serial;
  n->live_prev = g_live_tail;
  n->live_next = nullptr;
  if (g_live_tail)
    g_live_tail->live_next = n;
  else
    g_live_head = n;
  g_live_tail = n;
  n->in_live_list = true;
  ++g_live_count;
}

void live_remove(LazyNode* n) {
  std::lock_guard<SpinLock> lock(g_live_mutex);
  if (!n->in_live_list) return;
  if (n->live_prev)
    n->live_prev->live_next = n->live_next;
  else
    g_live_head = n->live_next;
  if (n->live_next)
    n->live_next->live_prev = n->live_prev;
  else
    g_live_tail = n->live_prev;
  n->in_live_list = false;
  --g_live_count;
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
  storage->lazy = ref;
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
  if (in_live_list) live_remove(this);
  release_inputs(inputs);
}

void LazyNode::mark_computed(std::vector<Tensor> values) {
  results = std::move(values);
  computed = true;
  live_remove(this);
  release_inputs(inputs);
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
void set_trace_state(TraceState* state) {
  t_trace = state;
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
  return lazy_record1(input_op, {}, {index}, {t.sizes(), t.dtype(), t.device()});
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
  const bool first_write = !storage->lazy;
  Tensor root;
  if (first_write) {
    root = flat_storage_tensor(storage, self.dtype());
  } else {
    const LazyType& rt = storage->lazy.node->outputs[storage->lazy.index];
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
  // `updated` may be a view or a leaf; the storage's value must be a node output of its own.
  LazyInput in = lazy_input(updated);
  if (!in.ref)
    in =
        lazy_input(lazy_record1(*reshape, {updated}, {root.sizes()}, {root.sizes(), root.dtype()}));
  if (first_write) t_trace->written.push_back(storage);
  storage->lazy = in.ref;
  ++storage->lazy_generation;
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
  impl->lazy = in.ref;
  impl->lazy_generation = storage.lazy_generation;
  return in;
}

namespace {
std::shared_ptr<LazyNode> new_node(const OpDef& def, const Tensor* inputs, size_t count,
                                   Attrs&& attrs) {
  auto node = make_pooled<LazyNode>();
  node->op = &def;
  node->attrs = std::move(attrs);
  for (size_t i = 0; i < count; ++i) node->inputs.push_back(lazy_input(inputs[i]));
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

void after_record() {
  if (g_live_count > g_max_pending.load(std::memory_order_relaxed))
    flush_pending("the pending trace passed KILN_MAX_PENDING");
}
}  // namespace

std::vector<Tensor> lazy_record(const OpDef& def, std::vector<Tensor> inputs, Attrs attrs,
                                std::vector<LazyType> outputs) {
  set_output_devices(def, inputs.data(), inputs.size(), outputs.data(), outputs.size());
  std::shared_ptr<LazyNode> node = new_node(def, inputs.data(), inputs.size(), std::move(attrs));
  node->storages.resize(outputs.size());
  node->outputs.assign(std::make_move_iterator(outputs.begin()),
                       std::make_move_iterator(outputs.end()));
  live_insert(node.get());
  std::vector<Tensor> result;
  result.reserve(node->outputs.size());
  for (uint32_t i = 0; i < node->outputs.size(); ++i)
    result.emplace_back(pending_impl(LazyRef{node, i}, node->outputs[i]));
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
  std::shared_ptr<LazyNode> node = new_node(def, inputs, count, std::move(attrs));
  node->storages.resize(1);
  node->outputs.push_back(std::move(output));
  live_insert(node.get());
  Tensor result(pending_impl(LazyRef{node, 0}, node->outputs[0]));
  node.reset();
  after_record();
  return result;
}

void lazy_record_view(const OpDef& def, const Tensor& input, Attrs attrs, const Tensor& view) {
  if (!is_pending(input)) return;
  TensorImpl* impl = view.impl();
  auto node = make_pooled<LazyNode>();
  node->op = &def;
  node->attrs = std::move(attrs);
  node->inputs.push_back(lazy_input(input));
  node->outputs.push_back({impl->sizes, impl->dtype, impl->storage->device});
  node->storages.resize(1);  // a view fills no storage of its own
  live_insert(node.get());
  impl->lazy = LazyRef{std::move(node), 0};
  impl->lazy_generation = impl->storage->lazy_generation;
}

void set_evaluator(Evaluator e) {
  g_evaluator = e;
}

void materialize(const std::vector<Tensor>& tensors, const char* reason) {
  std::vector<LazyRef> requests;
  for (const Tensor& t : tensors)
    if (is_pending(t)) requests.push_back(t.impl()->storage->lazy);
  if (requests.empty()) return;
  KILN_CHECK(g_evaluator, "lazy: no evaluator is registered (is the jit linked in?)");
  call_evaluator(requests, reason);
}

void materialize_storage(TensorImpl& impl) {
  KILN_CHECK(g_evaluator, "lazy: no evaluator is registered (is the jit linked in?)");
  if (t_trace) {
    // Inside a trace the value is computed from the example inputs and the storage stays
    // symbolic; data the function wrote into a captured tensor cannot be read back.
    for (const auto& w : t_trace->written)
      KILN_CHECK(w != impl.storage, "jit::trace: reading the data of a ", shape_str(impl.sizes),
                 " tensor that the traced function wrote in place is not supported; use tensor "
                 "ops instead of reading values");
    Tensor t(std::shared_ptr<TensorImpl>(std::shared_ptr<TensorImpl>(), &impl));
    trace_warn_value_read(t, "data access (item(), data_ptr(), printing)");
    if (!impl.storage->data) call_evaluator({impl.storage->lazy}, "a value read inside a trace");
    return;
  }
  LazyRef ref = impl.storage->lazy;
  call_evaluator({ref}, "data access");
  KILN_CHECK(!impl.storage->lazy, "lazy: materializing a ", shape_str(impl.sizes),
             " tensor left it pending");
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

void flush_pending(const char* reason) {
  // Inside a trace nothing runs: its nodes are the trace, whatever their number.
  if (!g_evaluator || g_live_count == 0 || t_evaluating > 0 || t_trace) return;
  std::vector<LazyRef> requests;
  {
    std::lock_guard<SpinLock> lock(g_live_mutex);
    for (LazyNode* n = g_live_head; n; n = n->live_next)
      for (uint32_t i = 0; i < n->outputs.size(); ++i) {
        std::shared_ptr<Storage> s = n->storages[i].lock();
        if (s && s->lazy.node.get() == n && s->lazy.index == i) requests.push_back(s->lazy);
      }
  }
  if (!requests.empty()) call_evaluator(requests, reason);
}

void prepare_write(const Tensor& t) {
  Storage& s = *t.impl()->storage;
  if (s.lazy || s.lazy_readers.load(std::memory_order_relaxed) > 0)
    flush_pending("an in-place write to a tensor that pending work reads or fills");
}

int64_t pending_count() {
  std::lock_guard<SpinLock> lock(g_live_mutex);
  return g_live_count;
}
int64_t max_pending() {
  return g_max_pending.load();
}
void set_max_pending(int64_t n) {
  KILN_CHECK(n > 0, "set_max_pending: expected a positive limit, got ", n);
  g_max_pending = n;
}

}  // namespace kiln::detail
