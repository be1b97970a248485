// Property tests of the structural graph hash: order- and id-independent, sensitive to any change.
//
// Equal for the same structure however it was built, different after any single change, and the
// same in another process.
#include "jit/hash.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "tests/jit/random_graph.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using jit::Graph;
using jit::graph_hash;
using jit::GraphHash;
using jit::Node;
using jit::Value;
using jit::ValueType;
using testing::GraphSpec;

const ValueType kF32x4{kFloat32, {4}};

GraphHash hash_of(const GraphSpec& s, std::mt19937_64& rng) {
  return graph_hash(*s.build(s.random_order(rng)));
}

TEST(GraphHash, OpsUsedByTheGeneratorExist) {
  for (const char* op : {"exp", "tanh", "neg", "log", "sigmoid", "add", "sub", "mul", "div", "pow",
                         "sum", "max", "layer_norm", "constant", "input"})
    EXPECT_NE(detail::find_op(op), nullptr) << op;
}

TEST(GraphHash, HexIs32LowercaseDigits) {
  GraphHash h{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(h.hex(), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(GraphHash{}.hex(), std::string(32, '0'));
  EXPECT_TRUE(GraphHash({1, 0}) < GraphHash({0, 1}));
  EXPECT_NE(GraphHash({1, 0}), GraphHash({0, 1}));
}

TEST(GraphHash, IndependentOfInsertionOrderAndIds) {
  auto& rng = testing::rng();
  for (int trial = 0; trial < 300; ++trial) {
    GraphSpec s = testing::random_graph_spec(rng);
    auto base = s.build();
    base->verify();
    GraphHash h = graph_hash(*base);
    EXPECT_EQ(graph_hash(*base), h) << "not deterministic";
    for (int k = 0; k < 3; ++k) {
      auto g = s.build(s.random_order(rng), std::uniform_int_distribution<int>(1, 40)(rng));
      g->verify();
      ASSERT_EQ(graph_hash(*g), h) << "trial " << trial << "\n" << *base << "\nvs\n" << *g;
    }
  }
}

// One mutation of the spec; returns false when it does not apply to this graph.
using Mutation = bool (*)(GraphSpec&, std::mt19937_64&, const std::vector<GraphHash>& cones);

template <typename T>
T pick_from(const std::vector<T>& v, std::mt19937_64& rng) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

// Every value's type, through one reference, so mutations can change any of them.
std::vector<ValueType*> all_types(GraphSpec& s) {
  std::vector<ValueType*> out;
  for (auto& t : s.inputs) out.push_back(&t);
  for (auto& n : s.nodes)
    for (auto& t : n.outputs) out.push_back(&t);
  return out;
}

bool change_op(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  std::vector<size_t> cands;
  for (size_t i = 0; i < s.nodes.size(); ++i)
    if (s.nodes[i].op != "constant") cands.push_back(i);
  if (cands.empty()) return false;
  auto& n = s.nodes[pick_from(cands, rng)];
  n.op = n.op == "tanh" ? "exp" : "tanh";
  return true;
}

bool change_attr_value(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  std::vector<size_t> cands;
  for (size_t i = 0; i < s.nodes.size(); ++i)
    if (!s.nodes[i].attrs.empty()) cands.push_back(i);
  if (cands.empty()) return false;
  auto& attrs = s.nodes[pick_from(cands, rng)].attrs;
  auto& a = attrs[std::uniform_int_distribution<size_t>(0, attrs.size() - 1)(rng)];
  if (auto* i = std::get_if<int64_t>(&a))
    *i += 1;
  else if (auto* d = std::get_if<double>(&a))
    *d = std::nextafter(*d, 1e300);
  else if (auto* b = std::get_if<bool>(&a))
    *b = !*b;
  else if (auto* v = std::get_if<std::vector<int64_t>>(&a))
    v->push_back(0);
  else if (auto* t = std::get_if<DType>(&a))
    *t = *t == kFloat64 ? kFloat32 : kFloat64;
  else
    a = kFloat32;  // none -> a dtype
  return true;
}

bool change_attr_type(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  std::vector<std::pair<size_t, size_t>> cands;
  for (size_t i = 0; i < s.nodes.size(); ++i)
    for (size_t k = 0; k < s.nodes[i].attrs.size(); ++k) {
      const auto& a = s.nodes[i].attrs[k];
      if (std::holds_alternative<int64_t>(a) || std::holds_alternative<bool>(a) ||
          (std::holds_alternative<double>(a) &&
           std::get<double>(a) == std::floor(std::get<double>(a))))
        cands.push_back({i, k});
    }
  if (cands.empty()) return false;
  auto [i, k] = pick_from(cands, rng);
  auto& a = s.nodes[i].attrs[k];
  if (auto* x = std::get_if<int64_t>(&a))
    a = double(*x);  // 1 -> 1.0
  else if (auto* b = std::get_if<bool>(&a))
    a = int64_t(*b);  // true -> 1
  else
    a = int64_t(std::get<double>(a));  // 2.0 -> 2
  return true;
}

bool change_dtype(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  ValueType* t = pick_from(all_types(s), rng);
  t->dtype = t->dtype == kFloat32 ? kFloat64 : kFloat32;
  return true;
}

bool change_size(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  std::vector<ValueType*> cands;
  for (ValueType* t : all_types(s))
    if (!t->sizes.empty()) cands.push_back(t);
  if (cands.empty()) return false;
  ValueType* t = pick_from(cands, rng);
  t->sizes[std::uniform_int_distribution<size_t>(0, t->sizes.size() - 1)(rng)] += 1;
  return true;
}

bool change_rank(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  ValueType* t = pick_from(all_types(s), rng);
  t->sizes.push_back(1);
  return true;
}

bool change_wrapped_or_device(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  ValueType* t = pick_from(all_types(s), rng);
  if (std::uniform_int_distribution<int>(0, 1)(rng))
    t->wrapped_number = !t->wrapped_number;
  else
    t->device = t->device.is_cpu() ? kCUDA : kCPU;
  return true;
}

bool swap_operands(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>& cones) {
  std::vector<size_t> cands;
  for (size_t i = 0; i < s.nodes.size(); ++i) {
    const auto& n = s.nodes[i];
    if ((n.op == "sub" || n.op == "div" || n.op == "pow") &&
        cones[static_cast<size_t>(n.inputs[0])] != cones[static_cast<size_t>(n.inputs[1])])
      cands.push_back(i);
  }
  if (cands.empty()) return false;
  auto& in = s.nodes[pick_from(cands, rng)].inputs;
  std::swap(in[0], in[1]);
  return true;
}

bool rewire_input(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>& cones) {
  std::vector<int> first = s.first_values();
  std::vector<std::pair<size_t, size_t>> cands;
  for (size_t i = 0; i < s.nodes.size(); ++i)
    for (size_t k = 0; k < s.nodes[i].inputs.size(); ++k) cands.push_back({i, k});
  std::shuffle(cands.begin(), cands.end(), rng);
  for (auto [i, k] : cands) {
    int old = s.nodes[i].inputs[k];
    // Any value defined before the node whose structure differs from the old operand's.
    std::vector<int> targets;
    for (int v = 0; v < first[i]; ++v)
      if (old < 0 || cones[static_cast<size_t>(v)] != cones[static_cast<size_t>(old)])
        targets.push_back(v);
    if (targets.empty()) continue;
    s.nodes[i].inputs[k] = pick_from(targets, rng);
    return true;
  }
  return false;
}

// A value used twice by one node is recomputed by a copy of its node for one of the uses.
bool duplicate_shared(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  std::vector<int> uses = s.use_counts(), prod = s.producers(), first = s.first_values();
  std::vector<int> cands;
  for (int v = 0; v < s.num_values(); ++v)
    if (prod[static_cast<size_t>(v)] >= 0 && uses[static_cast<size_t>(v)] >= 2) cands.push_back(v);
  if (cands.empty()) return false;
  int v = pick_from(cands, rng);
  size_t p = static_cast<size_t>(prod[static_cast<size_t>(v)]);
  int copy_first = s.num_values();
  s.nodes.push_back(s.nodes[p]);
  int copy = copy_first + (v - first[p]);
  // Redirect the last use (a node input or a graph output) to the copy.
  for (size_t i = s.nodes.size() - 1; i-- > 0;)
    for (int& in : s.nodes[i].inputs)
      if (in == v) {
        in = copy;
        return true;
      }
  for (int& o : s.outputs)
    if (o == v) {
      o = copy;
      return true;
    }
  return false;
}

bool add_output(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  s.outputs.push_back(std::uniform_int_distribution<int>(0, s.num_values() - 1)(rng));
  return true;
}

bool reorder_outputs(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>& cones) {
  for (size_t i = 0; i < s.outputs.size(); ++i)
    for (size_t j = i + 1; j < s.outputs.size(); ++j)
      if (cones[static_cast<size_t>(s.outputs[i])] != cones[static_cast<size_t>(s.outputs[j])]) {
        std::swap(s.outputs[i], s.outputs[j]);
        return true;
      }
  return false;
}

bool add_dead_node(GraphSpec& s, std::mt19937_64& rng, const std::vector<GraphHash>&) {
  int v = std::uniform_int_distribution<int>(0, s.num_values() - 1)(rng);
  s.nodes.push_back({"exp", {}, {v}, {kF32x4}});
  return true;
}

TEST(GraphHash, EveryMutationChangesTheHash) {
  const std::vector<std::pair<const char*, Mutation>> mutations = {
      {"op", change_op},
      {"attribute value", change_attr_value},
      {"attribute type", change_attr_type},
      {"dtype", change_dtype},
      {"size", change_size},
      {"rank", change_rank},
      {"wrapped/device", change_wrapped_or_device},
      {"swap operands", swap_operands},
      {"rewire", rewire_input},
      {"sharing -> duplication", duplicate_shared},
      {"extra output", add_output},
      {"reorder outputs", reorder_outputs},
      {"dead node", add_dead_node},
  };
  auto& rng = testing::rng();
  std::map<std::string, int> applied;
  for (int trial = 0; trial < 300; ++trial) {
    GraphSpec s = testing::random_graph_spec(rng);
    GraphHash h = hash_of(s, rng);
    // The structure of each value on its own, to avoid swaps between identical sub-expressions.
    std::vector<GraphHash> cones;
    for (int v = 0; v < s.num_values(); ++v) cones.push_back(graph_hash(*s.cone(v).build()));
    for (const auto& [name, mutate] : mutations) {
      GraphSpec m = s;
      if (!mutate(m, rng, cones)) continue;
      ++applied[name];
      // Not verified: a mutated constant is malformed, and hashing must not care.
      auto g = m.build(m.random_order(rng));
      GraphHash hm = graph_hash(*g);
      ASSERT_NE(hm, h) << "mutation '" << name << "' kept the hash\n"
                       << *s.build() << "\nmutated:\n"
                       << *g;
      // The mutated graph is itself order-independent.
      ASSERT_EQ(hash_of(m, rng), hm) << name;
    }
  }
  for (const auto& [name, mutate] : mutations)
    EXPECT_GT(applied[name], 20) << "mutation '" << name << "' rarely applied";
}

TEST(GraphHash, SharingDiffersFromDuplication) {
  auto build = [](bool shared) {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_input(kF32x4);
    Value* y = g->add_input(kF32x4);
    Value* m1 = g->create("mul", {x, y}, {}, {kF32x4})->output();
    Value* m2 = shared ? m1 : g->create("mul", {x, y}, {}, {kF32x4})->output();
    g->add_output(g->create("add", {m1, m2}, {int64_t(1)}, {kF32x4})->output());
    return g;
  };
  EXPECT_NE(graph_hash(*build(true)), graph_hash(*build(false)));

  // Two equal sub-expressions used by two outputs: which output pairs share an operand matters,
  // even though every node computes the same expression and every value has the same use count.
  auto build2 = [](bool cross) {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_input(kF32x4);
    Value* a1 = g->create("exp", {x}, {}, {kF32x4})->output();
    Value* a2 = g->create("exp", {x}, {}, {kF32x4})->output();
    Value* g1 = g->create("tanh", {a1}, {}, {kF32x4})->output();
    Value* g2 = g->create("tanh", {a2}, {}, {kF32x4})->output();
    Value* h1 = g->create("neg", {cross ? a2 : a1}, {}, {kF32x4})->output();
    Value* h2 = g->create("neg", {cross ? a1 : a2}, {}, {kF32x4})->output();
    for (Value* o : {g1, h1, g2, h2}) g->add_output(o);
    return g;
  };
  EXPECT_NE(graph_hash(*build2(true)), graph_hash(*build2(false)));
}

TEST(GraphHash, AttributeTypesAreDistinguished) {
  auto with_alpha = [](detail::AttrValue alpha) {
    Graph g;
    Value* x = g.add_input(kF32x4);
    g.add_output(g.create("add", {x, x}, {alpha}, {kF32x4})->output());
    return graph_hash(g);
  };
  std::set<GraphHash> seen;
  for (const detail::AttrValue& a :
       {detail::AttrValue(int64_t(1)), detail::AttrValue(1.0), detail::AttrValue(true),
        detail::AttrValue(std::monostate{}), detail::AttrValue(std::string("1")),
        detail::AttrValue(std::vector<int64_t>{1}), detail::AttrValue(kInt32),
        detail::AttrValue(std::vector<int64_t>{}), detail::AttrValue(std::string()),
        detail::AttrValue(0.0), detail::AttrValue(-0.0), detail::AttrValue(int64_t(0))})
    EXPECT_TRUE(seen.insert(with_alpha(a)).second) << detail::attr_str(a);
}

TEST(GraphHash, NullInputsAndInputOrder) {
  auto build = [](bool weight, bool swap_inputs) {
    Graph g;
    Value* x = g.add_input(kF32x4);
    Value* w = g.add_input(kF32x4);
    Value* a = swap_inputs ? w : x;
    Value* b = swap_inputs ? x : w;
    g.add_output(g.create("layer_norm", {a, weight ? b : nullptr, nullptr},
                          {std::vector<int64_t>{4}, 1e-5}, {kF32x4})
                     ->output());
    return graph_hash(g);
  };
  std::set<GraphHash> seen;
  for (bool w : {false, true})
    for (bool s : {false, true}) EXPECT_TRUE(seen.insert(build(w, s)).second) << w << s;
}

// Dead nodes (reaching no output) count as a multiset: list order still does not matter, their
// presence and their sharing do.
TEST(GraphHash, DeadCode) {
  auto& rng = testing::rng();
  for (int trial = 0; trial < 100; ++trial) {
    GraphSpec s = testing::random_graph_spec(rng);
    s.outputs.resize(std::uniform_int_distribution<size_t>(0, s.outputs.size())(rng));
    GraphHash h = hash_of(s, rng);
    for (int k = 0; k < 3; ++k) ASSERT_EQ(hash_of(s, rng), h) << *s.build();
    GraphSpec more = s;
    add_dead_node(more, rng, {});
    ASSERT_NE(hash_of(more, rng), h);
  }
  auto build = [](bool shared) {
    Graph g;
    Value* x = g.add_input(kF32x4);
    Value* e1 = g.create("exp", {x}, {}, {kF32x4})->output();
    Value* e2 = shared ? e1 : g.create("exp", {x}, {}, {kF32x4})->output();
    g.create("tanh", {e1}, {}, {kF32x4});
    g.create("tanh", {e2}, {}, {kF32x4});
    g.add_output(x);
    return graph_hash(g);
  };
  EXPECT_NE(build(true), build(false));
}

// A group node owning a subgraph: x -> group{ block(a): exp(a) * c } -> output.
std::unique_ptr<Graph> grouped(const char* inner_op, bool inner_first, double c) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input(kF32x4);
  Value* y = g->add_input(kF32x4);
  Value* t = g->create("tanh", {y}, {}, {kF32x4})->output();
  auto sub = std::make_unique<Graph>();
  Value* a = sub->add_input(kF32x4);
  Value* k;
  Value* e;
  if (inner_first) {
    e = sub->create(inner_op, {a}, {}, {kF32x4})->output();
    k = sub->constant(c, kFloat64);
  } else {
    k = sub->constant(c, kFloat64);
    e = sub->create(inner_op, {a}, {}, {kF32x4})->output();
  }
  sub->add_output(sub->create("mul", {e, k}, {}, {kF32x4})->output());
  Node* group = g->create("exp", {x}, {}, {kF32x4});  // any op; the subgraph is what matters
  group->set_subgraph(std::move(sub));
  g->add_output(g->create("add", {group->output(), t}, {int64_t(1)}, {kF32x4})->output());
  return g;
}

TEST(GraphHash, Subgraphs) {
  GraphHash h = graph_hash(*grouped("exp", true, 2.0));
  EXPECT_EQ(graph_hash(*grouped("exp", false, 2.0)), h);
  EXPECT_NE(graph_hash(*grouped("tanh", true, 2.0)), h);
  EXPECT_NE(graph_hash(*grouped("exp", true, 3.0)), h);
  auto plain = grouped("exp", true, 2.0);
  for (Node* n : plain->nodes())
    if (n->subgraph()) n->set_subgraph(nullptr);
  EXPECT_NE(graph_hash(*plain), h);
}

// Deeply nested subgraphs and a million-node chain hash without recursion.
TEST(GraphHash, DeepNestingIsIterative) {
  auto nest = [](int depth, const char* innermost) {
    auto root = std::make_unique<Graph>();
    Graph* g = root.get();
    for (int d = 0; d < depth; ++d) {
      Value* x = g->add_input(kF32x4);
      Node* n = g->create("exp", {x}, {}, {kF32x4});
      g->add_output(n->output());
      auto sub = std::make_unique<Graph>();
      Graph* next = sub.get();
      n->set_subgraph(std::move(sub));
      g = next;
    }
    Value* x = g->add_input(kF32x4);
    g->add_output(g->create(innermost, {x}, {}, {kF32x4})->output());
    return root;
  };
  auto a = nest(200000, "exp");
  GraphHash h = graph_hash(*a);
  EXPECT_EQ(graph_hash(*nest(200000, "exp")), h);
  EXPECT_NE(graph_hash(*nest(200000, "tanh")), h);
}

std::unique_ptr<Graph> chain(int64_t n, const char* last_op = "exp") {
  auto g = std::make_unique<Graph>();
  Value* v = g->add_input(kF32x4);
  for (int64_t i = 0; i + 1 < n; ++i) v = g->create("exp", {v}, {}, {kF32x4})->output();
  g->add_output(g->create(last_op, {v}, {}, {kF32x4})->output());
  return g;
}

TEST(GraphHash, MillionNodeChain) {
  auto g = chain(kiln::testing::scaled(1000000));
  auto t0 = std::chrono::steady_clock::now();
  GraphHash h = graph_hash(*g);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("graph_hash of %zu nodes: %.1f ms (%s)\n", g->size(), ms, h.hex().c_str());
  EXPECT_NE(graph_hash(*chain(kiln::testing::scaled(1000000), "tanh")), h);
}

// A fixed small graph touching every field: inputs, constants of both kinds, attributes of every
// type, two outputs per node, an absent input, a subgraph.
std::unique_ptr<Graph> golden_graph() {
  auto g = grouped("exp", true, 0.5);
  Value* x = g->inputs()[0];
  Value* c = g->constant(int64_t(3), kInt64);
  Value* s =
      g->create("sum", {x}, {std::vector<int64_t>{0}, false, kFloat64}, {ValueType{kFloat64, {}}})
          ->output();
  Node* mx =
      g->create("max", {x}, {int64_t(0), true}, {ValueType{kFloat32, {1}}, ValueType{kInt64, {1}}});
  Value* ln =
      g->create("layer_norm", {x, nullptr, nullptr}, {std::vector<int64_t>{4}, 1e-5}, {kF32x4})
          ->output();
  Value* p = g->create("pow", {s, c}, {}, {ValueType{kFloat64, {}}})->output();
  for (Value* o : {p, mx->output(1), ln}) g->add_output(o);
  return g;
}

// The golden value pins the canonical byte form: a change to it must be deliberate (it
// invalidates on-disk cache keys), so update this constant together with kHashFormat.
constexpr const char* kGoldenHex = "8c09f3d338eca82fa76e2f08145ec319";

TEST(GraphHashChild, PrintsGoldenHashWhenAsked) {
  if (!std::getenv("KILN_HASH_TEST_CHILD")) GTEST_SKIP() << "runs as the child of StableAcross";
  // Unrelated allocations first, so that node addresses differ from the parent's.
  std::vector<std::unique_ptr<Graph>> junk;
  for (int i = 0; i < 17; ++i) junk.push_back(chain(i + 1));
  std::printf("KILN_GRAPH_HASH=%s\n", graph_hash(*golden_graph()).hex().c_str());
}

TEST(GraphHash, StableAcrossProcessesAndBuilds) {
  std::string hex = graph_hash(*golden_graph()).hex();
  EXPECT_EQ(hex, kGoldenHex);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  std::string cmd = std::string("KILN_HASH_TEST_CHILD=1 '") + exe +
                    "' --gtest_filter=GraphHashChild.PrintsGoldenHashWhenAsked 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe)) out += buf;
  int status = pclose(pipe);
  EXPECT_EQ(status, 0) << out;
  auto pos = out.find("KILN_GRAPH_HASH=");
  ASSERT_NE(pos, std::string::npos) << out;
  EXPECT_EQ(out.substr(pos + 16, 32), hex) << out;
}

}  // namespace
}  // namespace kiln
