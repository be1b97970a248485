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
#include "exec/executor.h"
#include "jit/dump.h"
#include "jit/hash.h"
#include "jit/infer.h"
#include "jit/ir.h"
#include "jit/log.h"
#include "jit/passes/passes.h"
#include "jit/wire.h"
#include "kiln/error.h"
#include "lib/cuda_tensor.h"
#include "lib/profiler.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

using detail::LazyNode;
using detail::LazyRef;

namespace {
std::atomic<int64_t> g_evaluations{0};
std::atomic<int64_t> g_nodes_executed{0};
std::atomic<int64_t> g_nodes_recorded_in_graphs{0};
std::atomic<int64_t> g_plan_cache_hits{0};

// Optimized plans by the key of the recipe their graph is built from (which covers ops,
// attributes and constants, value types with sizes, wiring, and input and output order): a
// training loop records the same graph every step, and finds its passes, fusion and kernels done
// without building the graph again.
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

namespace {

// Where a graph node's input comes from.
struct Source {
  enum Kind : uint8_t { kNone, kNode, kInput, kConstant };
  Kind kind = kNone;
  uint32_t output = 0;  // kNode: which output of the producer
  size_t index = 0;     // kNode: the producer's place in the order; kInput: the graph input
  const Tensor* number = nullptr;  // kConstant: the wrapped number
};

// What the graph of a request is made from, in the order build_graph makes it: graph inputs
// (tensors first, trace placeholders after them), then the nodes, their inputs' sources, and the
// outputs. Evaluation keys its plan cache by this recipe, so a cache hit builds no Graph.
struct Recipe {
  std::vector<std::shared_ptr<LazyNode>> order;
  std::vector<ValueType> input_types;
  std::vector<int64_t> placeholder_input;  // per node: its graph input, or -1 (a computation)
  std::vector<Source> sources;             // the nodes' inputs, one after the other
  std::vector<std::pair<size_t, uint32_t>> outputs;  // (node, output)
  size_t num_constants = 0;
  // A node it needs is claimed by an evaluation on another thread: wait for it, then collect again.
  bool busy = false;
};

// Under the lazy lock.
Recipe collect(const std::vector<LazyRef>& requests, LazyGraphBinding* binding,
               bool keep_referenced, const std::vector<Tensor>* placeholder_values) {
  Recipe r;
  // 1. The uncomputed nodes the requests need, in topological order (iterative post-order DFS).
  // Per node: its place in `order` and the references to it from inside the graph.
  struct Info {
    size_t index = 0;
    int64_t internal_refs = 0;
  };
  absl::flat_hash_map<const LazyNode*, Info> info;
  std::vector<std::shared_ptr<LazyNode>>& order = r.order;
  {
    struct Frame {
      std::shared_ptr<LazyNode> node;
      size_t next_input;
    };
    std::vector<Frame> stack;
    for (const LazyRef& req : requests) {
      if (req.node->computed || !info.try_emplace(req.node.get()).second) continue;
      if (req.node->in_flight) {
        r.busy = true;
        return r;
      }
      stack.push_back({req.node, 0});
      while (!stack.empty()) {
        Frame& f = stack.back();
        if (f.next_input < f.node->inputs.size()) {
          const LazyRef& in = f.node->inputs[f.next_input++].ref;
          if (!in.node || in.node->computed) continue;
          if (in.node->in_flight) {
            r.busy = true;
            return r;
          }
          auto [it, fresh] = info.try_emplace(in.node.get());
          ++it->second.internal_refs;
          if (fresh) stack.push_back({in.node, 0});
          continue;
        }
        info[f.node.get()].index = order.size();
        order.push_back(std::move(f.node));
        stack.pop_back();
      }
    }
  }

  // 2. Concrete leaves and computed values become graph inputs, wrapped scalars constants.
  absl::flat_hash_map<const void*, size_t> leaf_input;  // by TensorImpl
  auto bind_input = [&](const Tensor& t) -> size_t {
    auto [it, inserted] = leaf_input.try_emplace(t.impl(), r.input_types.size());
    if (!inserted) return it->second;
    r.input_types.push_back(type_of(t));
    binding->inputs.push_back(t);
    binding->arguments.push_back(-1);
    return it->second;
  };
  // Tensors first, in one pass: the graph keeps its inputs ahead of every other node.
  for (const auto& n : order) {
    if (n->op == &input_op()) continue;
    for (const detail::LazyInput& in : n->inputs) {
      if (in.ref.node && in.ref.node->computed)
        bind_input(in.ref.node->results.at(in.ref.index));
      else if (!in.ref.node && in.tensor.defined() && !in.tensor.impl()->wrapped_number)
        bind_input(in.tensor);
    }
  }
  r.placeholder_input.reserve(order.size());
  for (const auto& n : order) {
    if (n->op == &input_op()) {
      // A trace placeholder: the traced function's argument.
      int64_t arg = detail::attr_int(n->attrs.at(0));
      const detail::LazyType& t = n->outputs[0];
      r.placeholder_input.push_back(static_cast<int64_t>(r.input_types.size()));
      r.input_types.push_back(ValueType{t.dtype, t.sizes, t.device});
      if (placeholder_values) {
        KILN_CHECK(arg >= 0 && static_cast<size_t>(arg) < placeholder_values->size(),
                   "jit: a value computed inside jit::trace from its argument ", arg,
                   " was used outside the trace");
        binding->inputs.push_back((*placeholder_values)[static_cast<size_t>(arg)]);
      } else {
        binding->inputs.push_back(Tensor());
      }
      binding->arguments.push_back(arg);
      continue;
    }
    r.placeholder_input.push_back(-1);
    for (const detail::LazyInput& in : n->inputs) {
      Source src;
      if (in.ref.node) {
        if (in.ref.node->computed) {
          src.kind = Source::kInput;
          src.index = leaf_input.at(in.ref.node->results.at(in.ref.index).impl());
        } else {
          src.kind = Source::kNode;
          src.index = info.at(in.ref.node.get()).index;
          src.output = in.ref.index;
        }
      } else if (in.tensor.defined()) {
        if (in.tensor.impl()->wrapped_number) {
          src.kind = Source::kConstant;
          src.number = &in.tensor;
          ++r.num_constants;
        } else {
          src.kind = Source::kInput;
          src.index = leaf_input.at(in.tensor.impl());
        }
      }
      r.sources.push_back(src);
    }
  }

  // 3. Outputs: what was requested, and every node someone outside this graph still holds (a
  // pending tensor, a view, a later node): computing it now saves computing it again.
  std::vector<bool> is_output(order.size(), false);
  auto add_output_node = [&](const std::shared_ptr<LazyNode>& n) {
    const size_t at = info.at(n.get()).index;
    if (is_output[at]) return;
    is_output[at] = true;
    for (uint32_t i = 0; i < n->outputs.size(); ++i) {
      r.outputs.emplace_back(at, i);
      binding->outputs.push_back(LazyRef{n, i});
    }
  };
  for (const LazyRef& req : requests)
    if (!req.node->computed) add_output_node(req.node);
  for (const auto& n : order) {
    if (!keep_referenced) break;
    if (n.use_count() > info.at(n.get()).internal_refs + 1) add_output_node(n);
  }
  return r;
}

std::unique_ptr<Graph> make_graph(const Recipe& r) {
  auto graph = std::make_unique<Graph>();
  std::vector<Value*> inputs;
  inputs.reserve(r.input_types.size());
  for (const ValueType& t : r.input_types) inputs.push_back(graph->add_input(t));
  std::vector<Node*> node_of(r.order.size(), nullptr);
  const Source* src = r.sources.data();
  std::vector<Value*> operands;
  for (size_t i = 0; i < r.order.size(); ++i) {
    const LazyNode& n = *r.order[i];
    if (r.placeholder_input[i] >= 0) {
      node_of[i] = inputs[static_cast<size_t>(r.placeholder_input[i])]->node();
      continue;
    }
    operands.clear();
    for (size_t k = 0; k < n.inputs.size(); ++k, ++src) {
      switch (src->kind) {
        case Source::kNode:
          operands.push_back(node_of[src->index]->output(src->output));
          break;
        case Source::kInput:
          operands.push_back(inputs[src->index]);
          break;
        case Source::kConstant:
          operands.push_back(graph->constant(detail::scalar_attr(src->number->item()),
                                             src->number->dtype(), true));
          break;
        case Source::kNone:
          operands.push_back(nullptr);
          break;
      }
    }
    std::vector<ValueType> types;
    for (const detail::LazyType& t : n.outputs)
      types.push_back(ValueType{t.dtype, t.sizes, t.device});
    node_of[i] = graph->create(*n.op, operands, n.attrs, std::move(types));
  }
  for (const auto& [at, output] : r.outputs) graph->add_output(node_of[at]->output(output));
  return graph;
}

// Appends to a buffer that keeps its capacity between keys: a key is a few bytes at a time.
struct KeyOut {
  std::vector<unsigned char>& buf;
  size_t used = 0;
  void write(const void* data, size_t n) {
    if (used + n > buf.size()) buf.resize(std::max(buf.size() * 2, used + n + 256));
    std::memcpy(buf.data() + used, data, n);
    used += n;
  }
};

// Everything make_graph builds the graph from, hashed: equal keys, equal graphs. Op definitions
// are keyed by address (the plan cache lives in this process).
GraphHash recipe_key(const Recipe& r) {
  using namespace wire;
  thread_local std::vector<unsigned char> bytes;
  KeyOut out{bytes};
  put_count(out, r.input_types.size());
  for (const ValueType& t : r.input_types) put_type(out, t);
  put_count(out, r.order.size());
  const Source* src = r.sources.data();
  for (size_t i = 0; i < r.order.size(); ++i) {
    const LazyNode& n = *r.order[i];
    if (r.placeholder_input[i] >= 0) {
      put_u8(out, 1);
      put_u64(out, static_cast<uint64_t>(r.placeholder_input[i]));
      continue;
    }
    put_u8(out, 0);
    put_u64(out, reinterpret_cast<uintptr_t>(n.op));
    put_attrs(out, n.attrs);
    put_count(out, n.inputs.size());
    for (size_t k = 0; k < n.inputs.size(); ++k, ++src) {
      put_u8(out, src->kind);
      if (src->kind == Source::kConstant) {
        const Tensor& t = *src->number;
        put_u8(out, dtype_code(t.dtype()));
        uint64_t value = 0;
        std::memcpy(&value, t.impl()->data(), element_size(t.dtype()));
        put_u64(out, value);
      } else {
        put_u64(out, src->index);
        put_u32(out, src->output);
      }
    }
    put_count(out, n.outputs.size());
    for (const detail::LazyType& t : n.outputs)
      put_type(out, ValueType{t.dtype, t.sizes, t.device});
  }
  put_count(out, r.outputs.size());
  for (const auto& [at, output] : r.outputs) {
    put_u64(out, at);
    put_u32(out, output);
  }
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), out.used);
  return GraphHash{h.low64, h.high64};
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

void evaluate(const std::vector<LazyRef>& requests) {
  if (detail::TraceState* trace = detail::trace_state())
    return evaluate_speculatively(requests, *trace);
  detail::ProfileSpan span("lazy.evaluate");
  detail::LazyLock lock;
  LazyGraphBinding binding;
  Recipe recipe;
  for (;;) {
    {
      detail::ProfileSpan collecting("lazy.collect");
      recipe = collect(requests, &binding, true, nullptr);
    }
    if (!recipe.busy) break;
    binding = LazyGraphBinding{};
    lock.wait_for_evaluations();
  }
  if (recipe.outputs.empty()) return;
  for (int64_t arg : binding.arguments)
    KILN_CHECK(arg < 0, "jit: a value computed inside jit::trace from its argument ", arg,
               " was used outside the trace; return it from the traced function instead");
  const Claim claim(recipe.order);
  lock.unlock();
  g_evaluations.fetch_add(1, std::memory_order_relaxed);
  const size_t graph_nodes = recipe.input_types.size() + recipe.order.size() + recipe.num_constants;
  if (log_enabled("lazy"))
    log("lazy", "materializing ", requests.size(), " value(s), ", graph_nodes,
        " nodes, because of ", detail::evaluation_reason());
  g_nodes_recorded_in_graphs.fetch_add(static_cast<int64_t>(graph_nodes),
                                       std::memory_order_relaxed);
  const GraphHash key = recipe_key(recipe);
  std::shared_ptr<PlanCache::Entry> entry = plan_cache().find(key);
  log("cache", "plan cache ", entry ? "hit" : "miss", " for a graph of ", graph_nodes, " nodes");
  if (entry) {
    g_plan_cache_hits.fetch_add(1, std::memory_order_relaxed);
  } else {
    std::unique_ptr<Graph> graph;
    {
      detail::ProfileSpan building("lazy.graph");
      graph = make_graph(recipe);
    }
    name_graph(*graph, [] {
      return "lazy flush #" + std::to_string(g_evaluations.load()) + ": " +
             detail::evaluation_reason();
    });
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
  lock.lock();
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

bool plan_cached(const std::vector<LazyRef>& requests) {
  LazyGraphBinding binding;
  detail::LazyLock lock;
  const Recipe recipe = collect(requests, &binding, true, nullptr);
  return plan_cache().find(recipe_key(recipe)) != nullptr;
}

LazyStats lazy_stats() {
  return {g_evaluations.load(), g_nodes_executed.load(), g_nodes_recorded_in_graphs.load(),
          detail::pending_count(), g_plan_cache_hits.load()};
}

}  // namespace kiln::jit
