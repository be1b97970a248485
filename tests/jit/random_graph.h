// Random IR graphs for the hash and serialization tests, buildable in any topological order.
//
// A logical description that can be built in any valid order, with ids shifted, and mutated one
// field at a time.
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "jit/ir.h"

namespace kiln::testing {

struct GraphSpec {
  struct NodeSpec {
    std::string op;
    detail::Attrs attrs;
    std::vector<int> inputs;  // value numbers; -1 for an absent optional input
    std::vector<jit::ValueType> outputs;
  };
  // Values are numbered: graph inputs first, then each node's outputs in node order.
  std::vector<jit::ValueType> inputs;
  std::vector<NodeSpec> nodes;
  std::vector<int> outputs;

  int num_values() const {
    int n = static_cast<int>(inputs.size());
    for (const NodeSpec& s : nodes) n += static_cast<int>(s.outputs.size());
    return n;
  }
  // The node defining each value (-1 for graph inputs) and the first value of each node.
  std::vector<int> producers() const {
    std::vector<int> p(inputs.size(), -1);
    for (size_t i = 0; i < nodes.size(); ++i)
      for (size_t k = 0; k < nodes[i].outputs.size(); ++k) p.push_back(static_cast<int>(i));
    return p;
  }
  std::vector<int> first_values() const {
    std::vector<int> f;
    int v = static_cast<int>(inputs.size());
    for (const NodeSpec& s : nodes) {
      f.push_back(v);
      v += static_cast<int>(s.outputs.size());
    }
    return f;
  }
  std::vector<int> use_counts() const {
    std::vector<int> uses(static_cast<size_t>(num_values()), 0);
    for (const NodeSpec& s : nodes)
      for (int in : s.inputs)
        if (in >= 0) ++uses[static_cast<size_t>(in)];
    for (int o : outputs) ++uses[static_cast<size_t>(o)];
    return uses;
  }

  // A random valid topological order of the nodes (Kahn's algorithm, random ready node).
  std::vector<int> random_order(std::mt19937_64& rng) const {
    std::vector<int> prod = producers();
    std::vector<int> pending(nodes.size(), 0);
    std::vector<std::vector<int>> users(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i)
      for (int in : nodes[i].inputs)
        if (in >= 0 && prod[static_cast<size_t>(in)] >= 0) {
          ++pending[i];
          users[static_cast<size_t>(prod[static_cast<size_t>(in)])].push_back(static_cast<int>(i));
        }
    std::vector<int> ready, order;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!pending[i]) ready.push_back(static_cast<int>(i));
    while (!ready.empty()) {
      size_t pick = std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng);
      int n = ready[pick];
      ready[pick] = ready.back();
      ready.pop_back();
      order.push_back(n);
      for (int u : users[static_cast<size_t>(n)])
        if (--pending[static_cast<size_t>(u)] == 0) ready.push_back(u);
    }
    return order;
  }
  std::vector<int> list_order() const {
    std::vector<int> order(nodes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    return order;
  }

  // Builds the graph with nodes inserted in `order`; `junk` throwaway nodes are created and
  // destroyed first so that value ids (and allocation addresses) differ.
  std::unique_ptr<jit::Graph> build(const std::vector<int>& order, int junk = 0) const {
    auto g = std::make_unique<jit::Graph>();
    std::vector<jit::Node*> throwaway;
    for (int i = 0; i < junk; ++i)
      throwaway.push_back(g->create("exp", {}, {}, {jit::ValueType{}}));
    for (jit::Node* n : throwaway) g->destroy(n);
    std::vector<jit::Value*> values(static_cast<size_t>(num_values()), nullptr);
    for (size_t i = 0; i < inputs.size(); ++i) values[i] = g->add_input(inputs[i]);
    std::vector<int> first = first_values();
    for (int idx : order) {
      const NodeSpec& s = nodes[static_cast<size_t>(idx)];
      std::vector<jit::Value*> ins;
      for (int in : s.inputs) ins.push_back(in < 0 ? nullptr : values[static_cast<size_t>(in)]);
      jit::Node* n = g->create(s.op, ins, s.attrs, s.outputs);
      for (size_t k = 0; k < s.outputs.size(); ++k)
        values[static_cast<size_t>(first[static_cast<size_t>(idx)]) + k] = n->output(k);
    }
    for (int o : outputs) g->add_output(values[static_cast<size_t>(o)]);
    return g;
  }
  std::unique_ptr<jit::Graph> build() const { return build(list_order()); }

  // The same graph with `v` as its only output and only the nodes it needs.
  GraphSpec cone(int v) const {
    std::vector<int> prod = producers(), first = first_values();
    std::vector<char> keep(nodes.size(), 0);
    std::vector<int> work{v};
    while (!work.empty()) {
      int x = work.back();
      work.pop_back();
      int p = x < 0 ? -1 : prod[static_cast<size_t>(x)];
      if (p < 0 || keep[static_cast<size_t>(p)]) continue;
      keep[static_cast<size_t>(p)] = 1;
      for (int in : nodes[static_cast<size_t>(p)].inputs) work.push_back(in);
    }
    GraphSpec out;
    out.inputs = inputs;
    std::vector<int> remap(static_cast<size_t>(num_values()), -1);
    for (size_t i = 0; i < inputs.size(); ++i) remap[i] = static_cast<int>(i);
    int next = static_cast<int>(inputs.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!keep[i]) continue;
      NodeSpec s = nodes[i];
      for (int& in : s.inputs) in = in < 0 ? -1 : remap[static_cast<size_t>(in)];
      for (size_t k = 0; k < s.outputs.size(); ++k)
        remap[static_cast<size_t>(first[i]) + k] = next++;
      out.nodes.push_back(std::move(s));
    }
    out.outputs = {remap[static_cast<size_t>(v)]};
    return out;
  }
};

inline jit::ValueType random_type(std::mt19937_64& rng) {
  static const DType kTypes[] = {kFloat32, kFloat64, kInt64, kInt32, kBool};
  jit::ValueType t;
  t.dtype = kTypes[std::uniform_int_distribution<int>(0, 4)(rng)];
  int rank = std::uniform_int_distribution<int>(0, 3)(rng);
  for (int i = 0; i < rank; ++i)
    t.sizes.push_back(std::uniform_int_distribution<int64_t>(1, 8)(rng));
  return t;
}

// A random DAG of elementwise and reduction ops over a few inputs and scalar constants. Every
// value nothing uses is a graph output (in value order), so there is no dead code.
inline GraphSpec random_graph_spec(std::mt19937_64& rng, int min_nodes = 3, int max_nodes = 24) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  GraphSpec s;
  int num_inputs = pick(1, 3);
  for (int i = 0; i < num_inputs; ++i) s.inputs.push_back(random_type(rng));
  int num_nodes = pick(min_nodes, max_nodes);
  int values = num_inputs;
  auto operand = [&] { return pick(0, values - 1); };
  for (int i = 0; i < num_nodes; ++i) {
    GraphSpec::NodeSpec n;
    int kind = pick(0, 9);
    jit::ValueType t = random_type(rng);
    if (kind == 0) {  // scalar constant
      n.op = "constant";
      DType dt = pick(0, 1) ? kInt64 : kFloat64;
      n.attrs = {dt == kInt64 ? detail::AttrValue(int64_t(pick(-3, 3)))
                              : detail::AttrValue(pick(-30, 30) / 4.0),
                 dt};
      n.outputs = {jit::ValueType{dt, {}, kCPU, true}};
    } else if (kind <= 3) {
      static const char* kUnary[] = {"exp", "tanh", "neg", "log", "sigmoid"};
      n.op = kUnary[pick(0, 4)];
      n.inputs = {operand()};
      n.outputs = {t};
    } else if (kind <= 6) {
      static const char* kBinary[] = {"add", "sub", "mul", "div", "pow"};
      n.op = kBinary[pick(0, 4)];
      n.inputs = {operand(), operand()};
      if (n.op == "add" || n.op == "sub")
        n.attrs = {pick(0, 1) ? detail::AttrValue(int64_t(pick(1, 3)))
                              : detail::AttrValue(pick(1, 12) / 4.0)};
      n.outputs = {t};
    } else if (kind == 7) {
      n.op = "sum";
      std::vector<int64_t> dims;
      for (int d = pick(0, 2); d > 0; --d) dims.push_back(pick(-2, 2));
      n.attrs = {dims, bool(pick(0, 1)),
                 pick(0, 1) ? detail::AttrValue(std::monostate{}) : detail::AttrValue(kFloat64)};
      n.inputs = {operand()};
      n.outputs = {t};
    } else if (kind == 8) {  // two outputs: values and indices
      n.op = "max";
      n.attrs = {int64_t(pick(-1, 1)), bool(pick(0, 1))};
      n.inputs = {operand()};
      n.outputs = {t, jit::ValueType{kInt64, t.sizes}};
    } else {  // optional inputs, some absent
      n.op = "layer_norm";
      n.attrs = {std::vector<int64_t>{pick(1, 8)}, 1e-5};
      n.inputs = {operand(), pick(0, 1) ? operand() : -1, pick(0, 1) ? operand() : -1};
      n.outputs = {t};
    }
    values += static_cast<int>(n.outputs.size());
    s.nodes.push_back(std::move(n));
  }
  std::vector<int> uses = s.use_counts();
  for (int v = num_inputs; v < values; ++v)
    if (!uses[static_cast<size_t>(v)]) s.outputs.push_back(v);
  return s;
}

}  // namespace kiln::testing
