// The recipe of a lazy evaluation's graph: the pending nodes a request needs, collected in
// topological order with their inputs' sources; made into a Graph, or hashed into the key of its
// cached plan without building the graph.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "exec/lazy_eval.h"
#include "jit/hash.h"
#include "jit/ir.h"
#include "lib/lazy.h"

namespace kiln::jit {

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
  std::vector<std::shared_ptr<detail::LazyNode>> order;
  std::vector<ValueType> input_types;
  std::vector<int64_t> placeholder_input;  // per node: its graph input, or -1 (a computation)
  std::vector<Source> sources;             // the nodes' inputs, one after the other
  std::vector<std::pair<size_t, uint32_t>> outputs;  // (node, output)
  size_t num_constants = 0;
  // Values held outside the evaluation that it leaves uncomputed, to be recomputed where they are
  // read (see Collector::stays_recipe in exec/lazy_recipe.cpp).
  size_t kept_as_recipes = 0;
  // A node it needs is claimed by an evaluation on another thread: wait for it, then collect again.
  bool busy = false;
};

// The recipe of the graph `requests` need (see build_graph for the other arguments), filling
// `binding`. Under the lazy lock.
Recipe collect(const std::vector<detail::LazyRef>& requests, LazyGraphBinding* binding,
               bool keep_referenced, const std::vector<Tensor>* placeholder_values);

std::unique_ptr<Graph> make_graph(const Recipe& r);

// Everything make_graph builds the graph from, hashed: equal keys, equal graphs.
GraphHash recipe_key(const Recipe& r);

}  // namespace kiln::jit
