// The evaluator behind lazy mode: builds a Graph from the pending nodes a request needs, optimizes
// and runs it, and hands the results back to the waiting storages.
#include "jit/lazy_eval.h"

#include <chrono>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/executor.h"
#include "jit/hash.h"
#include "jit/infer.h"
#include "jit/ir.h"
#include "jit/log.h"
#include "jit/passes/passes.h"
#include "kiln/error.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

using detail::LazyNode;
using detail::LazyRef;

namespace {
std::atomic<int64_t> g_evaluations{0};
std::atomic<int64_t> g_nodes_executed{0};
std::atomic<int64_t> g_nodes_recorded_in_graphs{0};
std::atomic<int64_t> g_plan_cache_hits{0};

// Optimized plans by the structural hash of the graph they were built from (which covers ops,
// attributes and constants, value types with sizes, wiring, and input and output order): a
// training loop builds the same graph every step, and finds its passes, fusion and kernels done.
// Least recently used plans go past kMaxPlans.
class PlanCache {
 public:
  struct Entry {
    std::unique_ptr<Graph> graph;  // optimized; the plan refers to it
    std::unique_ptr<Plan> plan;
    uint64_t last_use = 0;
  };
  std::shared_ptr<Entry> find(const GraphHash& h) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(h);
    if (it == entries_.end()) return nullptr;
    it->second->last_use = ++clock_;
    return it->second;
  }
  void add(const GraphHash& h, std::shared_ptr<Entry> e) {
    std::lock_guard<std::mutex> lock(mutex_);
    e->last_use = ++clock_;
    entries_[h] = std::move(e);
    if (entries_.size() <= kMaxPlans) return;
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second->last_use < oldest->second->last_use) oldest = it;
    entries_.erase(oldest);
  }

 private:
  static constexpr size_t kMaxPlans = 256;
  struct HashOf {
    size_t operator()(const GraphHash& h) const { return static_cast<size_t>(h.lo ^ h.hi); }
  };
  std::mutex mutex_;
  uint64_t clock_ = 0;
  absl::flat_hash_map<GraphHash, std::shared_ptr<Entry>, HashOf> entries_;
};

PlanCache& plan_cache() {
  static auto* cache = new PlanCache();  // never destroyed: evaluations may run during exit
  return *cache;
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
    src = detail::make_empty(type.sizes, type.dtype);
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
  // 1. The uncomputed nodes the requests need, in topological order (iterative post-order DFS).
  absl::flat_hash_map<const LazyNode*, size_t> index_of;  // into `order`
  std::vector<std::shared_ptr<LazyNode>> order;
  absl::flat_hash_map<const LazyNode*, int64_t> internal_refs;
  {
    struct Frame {
      std::shared_ptr<LazyNode> node;
      size_t next_input;
    };
    absl::flat_hash_map<const LazyNode*, bool> seen;
    std::vector<Frame> stack;
    for (const LazyRef& r : requests) {
      if (r.node->computed || seen.contains(r.node.get())) continue;
      seen[r.node.get()] = true;
      stack.push_back({r.node, 0});
      while (!stack.empty()) {
        Frame& f = stack.back();
        if (f.next_input < f.node->inputs.size()) {
          const LazyRef& in = f.node->inputs[f.next_input++].ref;
          if (!in.node || in.node->computed) continue;
          if (seen.contains(in.node.get())) continue;
          seen[in.node.get()] = true;
          stack.push_back({in.node, 0});
          continue;
        }
        index_of[f.node.get()] = order.size();
        order.push_back(std::move(f.node));
        stack.pop_back();
      }
    }
    for (const auto& n : order)
      for (const detail::LazyInput& in : n->inputs)
        if (in.ref.node && !in.ref.node->computed) ++internal_refs[in.ref.node.get()];
  }

  // 2. The graph: concrete leaves and computed values become inputs, wrapped scalars constants.
  auto graph = std::make_unique<Graph>();
  absl::flat_hash_map<const LazyNode*, Node*> node_of;
  absl::flat_hash_map<const void*, Value*> leaf_value;  // by TensorImpl / (node, index)
  auto bind_input = [&](const void* key, const Tensor& t) -> Value* {
    auto it = leaf_value.find(key);
    if (it != leaf_value.end()) return it->second;
    Value* v = graph->add_input(type_of(t));
    binding->inputs.push_back(t);
    binding->arguments.push_back(-1);
    leaf_value[key] = v;
    return v;
  };
  // Inputs first, in one pass: the graph keeps its inputs ahead of every other node, and adding
  // them between computations would keep splitting the same gap in the node order.
  for (const auto& n : order) {
    if (n->op == &input_op()) continue;
    for (const detail::LazyInput& in : n->inputs) {
      if (in.ref.node && in.ref.node->computed) {
        const Tensor& t = in.ref.node->results.at(in.ref.index);
        bind_input(t.impl(), t);
      } else if (!in.ref.node && in.tensor.defined() && !in.tensor.impl()->wrapped_number) {
        bind_input(in.tensor.impl(), in.tensor);
      }
    }
  }
  for (const auto& n : order) {
    if (n->op == &input_op()) {
      // A trace placeholder: the traced function's argument.
      int64_t arg = detail::attr_int(n->attrs.at(0));
      const detail::LazyType& t = n->outputs[0];
      Value* v = graph->add_input(ValueType{t.dtype, t.sizes});
      if (placeholder_values) {
        KILN_CHECK(arg >= 0 && static_cast<size_t>(arg) < placeholder_values->size(),
                   "jit: a value computed inside jit::trace from its argument ", arg,
                   " was used outside the trace");
        binding->inputs.push_back((*placeholder_values)[static_cast<size_t>(arg)]);
      } else {
        binding->inputs.push_back(Tensor());
      }
      binding->arguments.push_back(arg);
      node_of[n.get()] = v->node();
      continue;
    }
    std::vector<Value*> inputs;
    inputs.reserve(n->inputs.size());
    for (const detail::LazyInput& in : n->inputs) {
      if (in.ref.node) {
        if (in.ref.node->computed) {
          const Tensor& t = in.ref.node->results.at(in.ref.index);
          inputs.push_back(bind_input(t.impl(), t));
        } else {
          inputs.push_back(node_of.at(in.ref.node.get())->output(in.ref.index));
        }
      } else if (in.tensor.defined()) {
        const Tensor& t = in.tensor;
        if (t.impl()->wrapped_number) {
          Scalar s = t.item();
          inputs.push_back(graph->constant(detail::scalar_attr(s), t.dtype(), true));
        } else {
          inputs.push_back(bind_input(t.impl(), t));
        }
      } else {
        inputs.push_back(nullptr);
      }
    }
    std::vector<ValueType> types;
    for (const detail::LazyType& t : n->outputs) types.push_back(ValueType{t.dtype, t.sizes});
    node_of[n.get()] = graph->create(*n->op, inputs, n->attrs, std::move(types));
  }

  // 3. Outputs: what was requested, and every node someone outside this graph still holds (a
  // pending tensor, a view, a later node): computing it now saves computing it again.
  absl::flat_hash_map<const LazyNode*, bool> is_output;
  auto add_output_node = [&](const std::shared_ptr<LazyNode>& n) {
    if (is_output[n.get()]) return;
    is_output[n.get()] = true;
    Node* gn = node_of.at(n.get());
    for (uint32_t i = 0; i < n->outputs.size(); ++i) {
      graph->add_output(gn->output(i));
      binding->outputs.push_back(LazyRef{n, i});
    }
  };
  for (const LazyRef& r : requests)
    if (!r.node->computed) add_output_node(r.node);
  for (const auto& n : order) {
    if (!keep_referenced) break;
    auto it = internal_refs.find(n.get());
    int64_t internal = it == internal_refs.end() ? 0 : it->second;
    if (n.use_count() > internal + 1) add_output_node(n);
  }
  return graph;
}

namespace {
// Inside jit::trace: computes the requested values from the example inputs into their storages,
// which stay symbolic (their nodes are the trace's, not computed ones).
void evaluate_speculatively(const std::vector<LazyRef>& requests, detail::TraceState& trace) {
  LazyGraphBinding binding;
  std::unique_ptr<Graph> graph = build_graph(requests, &binding, false, &trace.examples);
  std::vector<Tensor> results = Plan(*graph).run(binding.inputs);
  const ResultHolders holders(binding.inputs, results);
  for (size_t k = 0; k < results.size(); ++k) {
    const LazyRef& ref = binding.outputs[k];
    std::shared_ptr<detail::Storage> s = ref.node->storages[ref.index].lock();
    if (s && !s->data) fill_storage(*s, results[k], ref.node->outputs[ref.index], holders);
  }
}
}  // namespace

void evaluate(const std::vector<LazyRef>& requests) {
  if (detail::TraceState* trace = detail::trace_state())
    return evaluate_speculatively(requests, *trace);
  LazyGraphBinding binding;
  std::unique_ptr<Graph> graph = build_graph(requests, &binding);
  if (graph->outputs().empty()) return;
  for (int64_t arg : binding.arguments)
    KILN_CHECK(arg < 0, "jit: a value computed inside jit::trace from its argument ", arg,
               " was used outside the trace; return it from the traced function instead");
  g_evaluations.fetch_add(1, std::memory_order_relaxed);
  log("lazy", "materializing ", requests.size(), " value(s), ", graph->size(),
      " nodes, because of ", detail::evaluation_reason());
  g_nodes_recorded_in_graphs.fetch_add(static_cast<int64_t>(graph->size()),
                                       std::memory_order_relaxed);
  const GraphHash key = graph_hash(*graph);
  std::shared_ptr<PlanCache::Entry> entry = plan_cache().find(key);
  if (entry) {
    g_plan_cache_hits.fetch_add(1, std::memory_order_relaxed);
  } else {
    run_passes(*graph);
    if (verify_passes()) verify_types(*graph);
    entry = std::make_shared<PlanCache::Entry>();
    entry->plan = std::make_unique<Plan>(*graph);
    entry->graph = std::move(graph);
    plan_cache().add(key, entry);
  }
  const Plan& plan = *entry->plan;
  g_nodes_executed.fetch_add(static_cast<int64_t>(plan.num_nodes()), std::memory_order_relaxed);
  std::vector<Tensor> results = plan.run(binding.inputs);
  const ResultHolders holders(binding.inputs, results);

  // Hand results over: fill waiting storages, then turn each node into a computed one.
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
      s->lazy = LazyRef{};
      ++s->lazy_generation;
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

bool plan_cached(const GraphHash& key) {
  return plan_cache().find(key) != nullptr;
}

LazyStats lazy_stats() {
  return {g_evaluations.load(), g_nodes_executed.load(), g_nodes_recorded_in_graphs.load(),
          detail::pending_count(), g_plan_cache_hits.load()};
}

namespace {
// Registered at load time: lib/ reaches the evaluator only through this pointer.
const bool kRegistered = [] {
  detail::set_evaluator(&evaluate);
  return true;
}();
}  // namespace

}  // namespace kiln::jit
