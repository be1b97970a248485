// The evaluator behind lazy mode: builds a Graph from the pending nodes a request needs, optimizes
// and runs it, and hands the results back to the waiting storages.
#include "exec/lazy_eval.h"

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "exec/exec_state.h"
#include "exec/executor.h"
#include "exec/lazy_recipe.h"
#include "jit/dump.h"
#include "jit/hash.h"
#include "jit/infer.h"
#include "jit/ir.h"
#include "jit/log.h"
#include "jit/passes/passes.h"
#include "jit/wire.h"
#include "kiln/error.h"
#include "kiln/jit.h"
#include "lib/cuda_tensor.h"
#include "lib/profiler.h"
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

using detail::LazyNode;
using detail::LazyRef;

namespace {
// Optimized plans by the key of the recipe their graph is built from (which covers ops,
// attributes and constants, value types with sizes, wiring, and input and output order): a
// training loop records the same graph every step, and finds its passes, fusion and kernels done
// without building the graph again. Least recently used plans go past kMaxPlans.
constexpr size_t kMaxPlans = 256;

std::shared_ptr<PlanCacheEntry> find_plan(const GraphHash& h) {
  ExecState& st = exec_state();
  std::lock_guard<std::mutex> lock(st.plan_cache_mutex);
  auto it = st.plan_cache.find(h);
  if (it == st.plan_cache.end()) return nullptr;
  it->second->last_use = ++st.plan_cache_clock;
  return it->second;
}

void add_plan(const GraphHash& h, std::shared_ptr<PlanCacheEntry> e) {
  ExecState& st = exec_state();
  std::lock_guard<std::mutex> lock(st.plan_cache_mutex);
  e->last_use = ++st.plan_cache_clock;
  st.plan_cache[h] = std::move(e);
  if (st.plan_cache.size() <= kMaxPlans) return;
  auto oldest = st.plan_cache.begin();
  for (auto it = st.plan_cache.begin(); it != st.plan_cache.end(); ++it)
    if (it->second->last_use < oldest->second->last_use) oldest = it;
  st.plan_cache.erase(oldest);
}

// Moves r's buffer into the storage that waits for it, or copies when r cannot give it up: when
// someone else holds its storage, or it is one of the graph's inputs (a user's tensor).
}  // namespace

ResultHolders::ResultHolders(const std::vector<Tensor>& graph_inputs,
                             const std::vector<Tensor>& graph_results) {
  for (const Tensor& t : graph_results)
    if (t.defined()) ++results[t.impl()->storage.get()];
  for (const Tensor& t : graph_inputs)
    if (t.defined()) inputs.insert(t.impl()->storage.get());
}

bool ResultHolders::can_give_up(const Tensor& r, size_t nbytes) const {
  const detail::Storage* rs = r.impl()->storage.get();
  if (r.impl()->storage.use_count() != 1 || r.storage_offset() != 0 || !r.is_contiguous() ||
      rs->nbytes != nbytes || rs->lazy || !rs->owns_allocation || inputs.contains(rs))
    return false;
  auto held = results.find(rs);
  return held == results.end() || held->second <= 1;
}

void swap_buffers(detail::Storage& a, detail::Storage& b) {
  std::swap(a.data, b.data);
  std::swap(a.deleter, b.deleter);
  std::swap(a.owns_allocation, b.owns_allocation);
}

namespace {
// Moves r's buffer into the storage that waits for it, or copies when r cannot give it up.
void fill_storage(detail::Storage& s, const Tensor& r, const detail::LazyType& type,
                  const ResultHolders& holders) {
  Tensor src = r;
  if (!holders.can_give_up(src, s.nbytes)) {
    src = detail::make_empty_on(type.sizes, type.dtype, type.device);
    detail::copy_kernel(src, r);
  }
  swap_buffers(s, *src.impl()->storage);
}

Tensor over_storage(const std::shared_ptr<detail::Storage>& s, const detail::LazyType& type) {
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = s;
  impl->sizes = type.sizes;
  impl->strides = detail::contiguous_strides(type.sizes);
  impl->dtype = type.dtype;
  return Tensor(std::move(impl));
}
}  // namespace

std::unique_ptr<Graph> build_graph(const std::vector<LazyRef>& requests, LazyGraphBinding* binding,
                                   bool keep_referenced,
                                   const std::vector<Tensor>* placeholder_values) {
  detail::LazyLock lock;
  return make_graph(collect(requests, binding, keep_referenced, placeholder_values));
}

namespace {
// Claims an evaluation's nodes (under the lazy lock) and releases them when it ends, computed or
// failed, waking the threads that wait for them.
class Claim {
 public:
  explicit Claim(const std::vector<std::shared_ptr<LazyNode>>& nodes) : nodes_(nodes) {
    for (const auto& n : nodes_) n->in_flight = true;
  }
  ~Claim() {
    detail::LazyLock lock;
    for (const auto& n : nodes_) n->in_flight = false;
    detail::notify_evaluations();
  }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

 private:
  const std::vector<std::shared_ptr<LazyNode>>& nodes_;
};

// Inside jit::trace: computes the requested values from the example inputs into their storages,
// which stay symbolic (their nodes are the trace's, not computed ones).
void evaluate_speculatively(const std::vector<LazyRef>& requests, detail::TraceState& trace) {
  detail::ProfileSpan span("trace.evaluate");
  LazyGraphBinding binding;
  std::unique_ptr<Graph> graph = build_graph(requests, &binding, false, &trace.examples);
  name_graph(*graph, [] { return "inside a trace: " + detail::evaluation_reason(); });
  std::vector<Tensor> results = Plan(*graph).run(binding.inputs);
  const ResultHolders holders(binding.inputs, results);
  detail::LazyLock lock;
  for (size_t k = 0; k < results.size(); ++k) {
    const LazyRef& ref = binding.outputs[k];
    std::shared_ptr<detail::Storage> s = ref.node->storages[ref.index].lock();
    if (s && !s->data) fill_storage(*s, results[k], ref.node->outputs[ref.index], holders);
  }
}
}  // namespace

namespace {
// The recipe of what `requests` need, collected again after waiting whenever another thread's
// evaluation has claimed a node it needs. Under `lock`.
Recipe collect_unclaimed(const std::vector<LazyRef>& requests, LazyGraphBinding& binding,
                         detail::LazyLock& lock) {
  for (;;) {
    Recipe recipe;
    {
      detail::ProfileSpan collecting("lazy.collect");
      recipe = collect(requests, &binding, true, nullptr);
    }
    if (!recipe.busy) return recipe;
    binding = LazyGraphBinding{};
    lock.wait_for_evaluations();
  }
}

// The optimized plan of the recipe's graph: found in the plan cache, or built (passes, fusion,
// plan) and cached.
std::shared_ptr<PlanCacheEntry> optimized_plan(const Recipe& recipe, size_t graph_nodes) {
  const GraphHash key = recipe_key(recipe);
  std::shared_ptr<PlanCacheEntry> entry = find_plan(key);
  log("cache", "plan cache ", entry ? "hit" : "miss", " for a graph of ", graph_nodes, " nodes");
  if (entry) {
    exec_state().plan_cache_hits.fetch_add(1, std::memory_order_relaxed);
    return entry;
  }
  std::unique_ptr<Graph> graph;
  {
    detail::ProfileSpan building("lazy.graph");
    graph = make_graph(recipe);
  }
  name_graph(*graph, [] {
    return "lazy flush #" + std::to_string(exec_state().evaluations.load()) + ": " +
           detail::evaluation_reason();
  });
  run_passes(*graph);
  if (verify_passes()) verify_types(*graph);
  entry = std::make_shared<PlanCacheEntry>();
  entry->plan = std::make_unique<Plan>(*graph);
  entry->graph = std::move(graph);
  add_plan(key, entry);
  return entry;
}

// Hands the results over (under the lazy lock): fills the storages waiting for them, then turns
// each node into a computed one.
void hand_over(LazyGraphBinding& binding, std::vector<Tensor>& results,
               const ResultHolders& holders) {
  absl::flat_hash_map<LazyNode*, std::vector<Tensor>> computed;
  for (size_t k = 0; k < results.size(); ++k) {
    const LazyRef& ref = binding.outputs[k];
    const detail::LazyType& type = ref.node->outputs[ref.index];
    Tensor r = results[k];
    KILN_CHECK(r.sizes() == type.sizes && r.dtype() == type.dtype, "jit: ", ref.node->op->name,
               " produced ", detail::describe(r), " where recording promised ",
               dtype_name(type.dtype), detail::shape_str(type.sizes));
    std::shared_ptr<detail::Storage> s = ref.node->storages[ref.index].lock();
    if (s && s->lazy.node == ref.node && s->lazy.index == ref.index) {
      fill_storage(*s, r, type, holders);
      detail::set_storage_lazy(*s, LazyRef{}, true);
      detail::note_computed_storage(*ref.node, s);
      r = over_storage(s, type);
    }
    auto& slot = computed[ref.node.get()];
    slot.resize(ref.node->outputs.size());
    slot[ref.index] = std::move(r);
  }
  results.clear();
  binding.inputs.clear();
  for (const LazyRef& ref : binding.outputs) {
    auto it = computed.find(ref.node.get());
    if (it == computed.end()) continue;
    ref.node->mark_computed(std::move(it->second));
    computed.erase(it);
  }
}
}  // namespace

void evaluate(const std::vector<LazyRef>& requests) {
  if (detail::TraceState* trace = detail::trace_state())
    return evaluate_speculatively(requests, *trace);
  detail::ProfileSpan span("lazy.evaluate");
  detail::LazyLock lock;
  LazyGraphBinding binding;
  const Recipe recipe = collect_unclaimed(requests, binding, lock);
  if (recipe.outputs.empty()) return;
  for (int64_t arg : binding.arguments)
    KILN_CHECK(arg < 0, "jit: a value computed inside jit::trace from its argument ", arg,
               " was used outside the trace; return it from the traced function instead");
  const Claim claim(recipe.order);
  lock.unlock();
  exec_state().evaluations.fetch_add(1, std::memory_order_relaxed);
  const size_t graph_nodes = recipe.input_types.size() + recipe.order.size() + recipe.num_constants;
  if (log_enabled("lazy"))
    log("lazy", "materializing ", requests.size(), " value(s), ", graph_nodes,
        " nodes, because of ", detail::evaluation_reason());
  if (recipe.kept_as_recipes > 0)
    log("lazy", "left ", recipe.kept_as_recipes,
        " value(s) held elsewhere as recipes, recomputed where they are read");
  exec_state().nodes_recorded_in_graphs.fetch_add(static_cast<int64_t>(graph_nodes),
                                                  std::memory_order_relaxed);
  const std::shared_ptr<PlanCacheEntry> entry = optimized_plan(recipe, graph_nodes);
  const Plan& plan = *entry->plan;
  exec_state().nodes_executed.fetch_add(static_cast<int64_t>(plan.num_nodes()),
                                        std::memory_order_relaxed);
  std::vector<Tensor> results = plan.run(binding.inputs);
  const ResultHolders holders(binding.inputs, results);
  lock.lock();
  hand_over(binding, results, holders);
}

bool plan_cached(const std::vector<LazyRef>& requests) {
  LazyGraphBinding binding;
  detail::LazyLock lock;
  const Recipe recipe = collect(requests, &binding, true, nullptr);
  return find_plan(recipe_key(recipe)) != nullptr;
}

LazyStats lazy_stats() {
  const ExecState& st = exec_state();
  return {st.evaluations.load(), st.nodes_executed.load(), st.nodes_recorded_in_graphs.load(),
          detail::pending_count(), st.plan_cache_hits.load()};
}

}  // namespace jit
}  // namespace kiln
