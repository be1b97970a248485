// Lazy mode's evaluator: turns the pending nodes a request needs into a Graph and runs it.
#pragma once

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/ir.h"
#include "lib/lazy.h"

namespace kiln::jit {

// What a graph built from pending nodes is bound to: concrete tensors for its inputs, and the
// node output each graph output computes.
struct LazyGraphBinding {
  std::vector<Tensor> inputs;      // the tensor bound to each graph input (captured by reference)
  std::vector<int64_t> arguments;  // per graph input: the traced function's argument, or -1
  std::vector<detail::LazyRef> outputs;
};

// The graph of every uncomputed node the requests need. Its outputs are the requested values and,
// when `keep_referenced`, every value still referenced from outside it. Trace placeholders become
// graph inputs bound to `arguments` (their tensors: `placeholder_values`, when given).
std::unique_ptr<Graph> build_graph(const std::vector<detail::LazyRef>& requests,
                                   LazyGraphBinding* binding, bool keep_referenced = true,
                                   const std::vector<Tensor>* placeholder_values = nullptr);

// Materializes the requested values (lib/lazy.h's evaluator).
void evaluate(const std::vector<detail::LazyRef>& requests);

// Whether evaluating `requests` now would find its optimized plan cached: what an evaluation does
// before it runs anything (collect the pending nodes, key them, look the key up). Benchmarks time
// it.
bool plan_cached(const std::vector<detail::LazyRef>& requests);

// Which storages a graph run's results share, and which are its inputs: a result's buffer can be
// handed to another storage (instead of copied) when only that result holds it.
struct ResultHolders {
  ResultHolders(const std::vector<Tensor>& graph_inputs, const std::vector<Tensor>& graph_results);
  bool can_give_up(const Tensor& r, size_t nbytes) const;
  absl::flat_hash_map<const detail::Storage*, int> results;
  absl::flat_hash_set<const detail::Storage*> inputs;
};
// Exchanges two storages' buffers (the Storage objects, and so every view, stay put).
void swap_buffers(detail::Storage& a, detail::Storage& b);

struct LazyStats {
  int64_t evaluations = 0;     // graphs built and run
  int64_t nodes_executed = 0;  // nodes run by those graphs (fused ones included)
  int64_t nodes_in_graphs = 0;
  int64_t pending = 0;          // uncomputed nodes alive now
  int64_t plan_cache_hits = 0;  // evaluations that reused an optimized plan
};
LazyStats lazy_stats();

}  // namespace kiln::jit
