// Graph files: exact round trips, and a reader that rejects every damaged file with kiln::Error.
#include "jit/serialize.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "jit/hash.h"
#include "tests/jit/random_graph.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using jit::Graph;
using jit::graph_hash;
using jit::LoadedGraph;
using jit::Node;
using jit::Value;
using jit::ValueType;
using testing::GraphSpec;

const ValueType kF32x4{kFloat32, {4}};
constexpr size_t kHeader = 32;

// Raw bytes of a tensor's elements in row-major order.
std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  return n ? std::string(static_cast<const char*>(c.raw_data_ptr()), n) : std::string();
}

void expect_same_constants(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << i;
    if (!a[i].defined()) continue;
    EXPECT_EQ(a[i].dtype(), b[i].dtype()) << i;
    EXPECT_EQ(a[i].sizes(), b[i].sizes()) << i;
    EXPECT_TRUE(bytes_of(a[i]) == bytes_of(b[i])) << "constant " << i << " differs bitwise";
  }
}

std::vector<Tensor> some_constants(std::mt19937_64& rng) {
  std::vector<Tensor> c;
  c.push_back(testing::random_tensor({3, 4}, kFloat32));
  c.push_back(testing::random_tensor({2, 3}, kFloat64).t());  // not contiguous
  c.push_back(testing::random_tensor({5}, kInt64, -100, 100));
  c.push_back(testing::random_tensor({2, 2}, kInt32, -100, 100));
  c.push_back(testing::random_tensor({7}, kBool));
  c.push_back(Tensor());                       // an undefined slot
  c.push_back(kiln::empty({0, 3}));            // no elements
  c.push_back(kiln::full({}, 2.5, kFloat64));  // 0-dim
  std::shuffle(c.begin(), c.end(), rng);
  return c;
}

// Metadata is opaque: embedded NULs and arbitrary bytes survive.
std::string some_metadata(std::mt19937_64& rng) {
  std::string m = "{\"model\": \"demo\"}";
  m.push_back('\0');
  for (int i = 0; i < 40; ++i) m.push_back(static_cast<char>(rng() & 0xff));
  return m;
}

TEST(GraphSerialize, RoundTripRandomGraphs) {
  auto& rng = testing::rng();
  for (int trial = 0; trial < 200; ++trial) {
    GraphSpec s = testing::random_graph_spec(rng);
    auto g = s.build();
    auto constants = some_constants(rng);
    std::string meta = trial % 3 ? some_metadata(rng) : std::string();
    std::string bytes = jit::serialize_graph(*g, constants, meta);
    LoadedGraph l = jit::deserialize_graph(bytes, "trial.kiln");
    ASSERT_TRUE(l.graph);
    EXPECT_EQ(graph_hash(*l.graph), graph_hash(*g)) << *g << "\nloaded:\n" << *l.graph;
    EXPECT_EQ(l.graph->str(), g->str());  // same list order, and here even the same ids
    EXPECT_EQ(l.metadata, meta);
    expect_same_constants(l.constants, constants);
    // Serializing the loaded graph again gives the same bytes.
    EXPECT_TRUE(jit::serialize_graph(*l.graph, l.constants, l.metadata) ==
                jit::serialize_graph(*g, constants, meta));
  }
}

TEST(GraphSerialize, AttributesOfEveryTypeRoundTrip) {
  Graph g;
  Value* x = g.add_input(ValueType{kFloat64, {2, 3}, kCPU, false});
  Value* w = g.add_input(ValueType{kFloat32, {}, kCUDA, true});
  for (const detail::AttrValue& a :
       {detail::AttrValue(std::monostate{}), detail::AttrValue(true), detail::AttrValue(false),
        detail::AttrValue(int64_t(-7)), detail::AttrValue(INT64_MIN), detail::AttrValue(-0.0),
        detail::AttrValue(std::nan("")), detail::AttrValue(1e308), detail::AttrValue(1.0),
        detail::AttrValue(std::string("tanh\0x", 6)), detail::AttrValue(std::string()),
        detail::AttrValue(std::vector<int64_t>{}), detail::AttrValue(std::vector<int64_t>{1, -2}),
        detail::AttrValue(kBool), detail::AttrValue(kFloat64)})
    g.add_output(g.create("add", {x, w}, {a}, {kF32x4})->output());
  g.add_output(g.constant(int64_t(-3), kInt64));
  g.add_output(g.constant(0.25, kFloat32, /*wrapped=*/false));
  LoadedGraph l = jit::deserialize_graph(jit::serialize_graph(g, {}, ""), "attrs");
  EXPECT_EQ(graph_hash(*l.graph), graph_hash(g));
  auto a = g.nodes(), b = l.graph->nodes();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]->attrs().size(), b[i]->attrs().size());
    for (size_t k = 0; k < a[i]->attrs().size(); ++k) {
      const auto &p = a[i]->attrs()[k], &q = b[i]->attrs()[k];
      ASSERT_EQ(p.index(), q.index());
      if (auto* d = std::get_if<double>(&p)) {
        EXPECT_EQ(std::memcmp(d, &std::get<double>(q), sizeof(double)), 0);  // bit pattern
      } else {
        EXPECT_TRUE(p == q) << detail::attr_str(p);
      }
    }
    for (size_t k = 0; k < a[i]->num_outputs(); ++k)
      EXPECT_EQ(a[i]->output(k)->type(), b[i]->output(k)->type());
  }
}

std::unique_ptr<Graph> grouped() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_input(kF32x4);
  auto sub = std::make_unique<Graph>();
  Value* a = sub->add_input(kF32x4);
  Value* e = sub->create("exp", {a}, {}, {kF32x4})->output();
  Value* k = sub->constant(2.0, kFloat64);
  // A nested group inside the group.
  auto inner = std::make_unique<Graph>();
  Value* b = inner->add_input(kF32x4);
  inner->add_output(inner->create("neg", {b}, {}, {kF32x4})->output());
  Node* ig = sub->create("neg", {e}, {}, {kF32x4});
  ig->set_subgraph(std::move(inner));
  sub->add_output(sub->create("mul", {ig->output(), k}, {}, {kF32x4})->output());
  Node* group = g->create("exp", {x}, {}, {kF32x4});
  group->set_subgraph(std::move(sub));
  g->add_output(g->create("tanh", {group->output()}, {}, {kF32x4})->output());
  return g;
}

TEST(GraphSerialize, SubgraphsRoundTrip) {
  auto g = grouped();
  LoadedGraph l = jit::deserialize_graph(jit::serialize_graph(*g, {}, "m"), "grouped");
  EXPECT_EQ(graph_hash(*l.graph), graph_hash(*g));
  EXPECT_EQ(l.graph->str(), g->str());
}

TEST(GraphSerialize, DeepNestingIsIterative) {
  auto root = std::make_unique<Graph>();
  Graph* g = root.get();
  for (int64_t d = 0, depth = kiln::testing::scaled(100000); d < depth; ++d) {
    Node* n = g->create("exp", {g->add_input(kF32x4)}, {}, {kF32x4});
    g->add_output(n->output());
    auto sub = std::make_unique<Graph>();
    Graph* next = sub.get();
    n->set_subgraph(std::move(sub));
    g = next;
  }
  std::string bytes = jit::serialize_graph(*root, {}, "");
  LoadedGraph l = jit::deserialize_graph(bytes, "deep");
  EXPECT_EQ(graph_hash(*l.graph), graph_hash(*root));
}

std::string temp_dir() {
  auto dir = std::filesystem::temp_directory_path() /
             ("kiln_serialize_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(GraphSerialize, SaveAndLoadFiles) {
  std::string dir = temp_dir();
  std::string path = dir + "/model.kiln";
  auto g = grouped();
  std::vector<Tensor> constants = {testing::random_tensor({4, 4})};
  jit::save_graph(path, *g, constants, "first");
  jit::save_graph(path, *g, constants, "second");  // replaces the file
  LoadedGraph l = jit::load_graph(path);
  EXPECT_EQ(l.metadata, "second");
  EXPECT_EQ(graph_hash(*l.graph), graph_hash(*g));
  expect_same_constants(l.constants, constants);
  // Only the file itself is left: the temporary was renamed into place.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  testing::expect_error([&] { jit::load_graph(dir + "/missing.kiln"); },
                        {"kiln::jit::load", "missing.kiln", "cannot open: no such file"});
  testing::expect_error([&] { jit::load_graph(dir); }, {"kiln::jit::load", "not a regular file"});
  testing::expect_error([&] { jit::save_graph(dir + "/no/such/dir/x.kiln", *g, {}, ""); },
                        {"kiln::jit::save", "x.kiln"});
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------------------------ damaged files
std::string sample_bytes() {
  auto g = grouped();
  Value* y = g->add_input(ValueType{kInt64, {2, 2}});
  g->add_output(g->create("sum", {y}, {std::vector<int64_t>{0}, true, kFloat64},
                          {ValueType{kFloat64, {1, 2}}})
                    ->output());
  return jit::serialize_graph(*g, {testing::random_tensor({2, 3}), Tensor()}, "meta");
}

// Loads `bytes`; returns false when it threw kiln::Error. Any other outcome fails the test.
bool loads(const std::string& bytes, const char* what) {
  try {
    LoadedGraph l = jit::deserialize_graph(bytes, "fuzz.kiln");
    l.graph->verify();
    (void)l.graph->str();
    (void)graph_hash(*l.graph);
    return true;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fuzz.kiln"), std::string::npos) << e.what();
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-kiln exception: " << e.what();
    return false;
  }
}

TEST(GraphSerialize, EveryTruncationThrows) {
  std::string bytes = sample_bytes();
  ASSERT_TRUE(loads(bytes, "intact"));
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(loads(bytes.substr(0, n), "truncated")) << "length " << n;
    // Also with a header that agrees with the shorter payload: the parser itself must notice.
    if (n >= kHeader) {
      std::string cut = bytes.substr(0, n);
      jit::reseal_for_testing(cut);
      EXPECT_FALSE(loads(cut, "truncated and resealed")) << "length " << n;
    }
  }
  testing::expect_error([&] { jit::deserialize_graph(bytes.substr(0, 100), "model.kiln"); },
                        {"kiln::jit::load: model.kiln: truncated at byte"});
  std::string cut = bytes.substr(0, 60);
  jit::reseal_for_testing(cut);
  testing::expect_error([&] { jit::deserialize_graph(cut, "model.kiln"); },
                        {"model.kiln: truncated at byte 60 (reading"});
}

TEST(GraphSerialize, ByteFlipsAndRandomBytesThrow) {
  auto& rng = testing::rng();
  std::string bytes = sample_bytes();
  for (int trial = 0; trial < 3000; ++trial) {
    std::string b = bytes;
    int flips = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int i = 0; i < flips; ++i)
      b[std::uniform_int_distribution<size_t>(0, b.size() - 1)(rng)] ^=
          static_cast<char>(1 << std::uniform_int_distribution<int>(0, 7)(rng));
    if (b == bytes) continue;
    EXPECT_FALSE(loads(b, "flipped")) << "trial " << trial;
  }
  for (int trial = 0; trial < 300; ++trial) {
    std::string b(std::uniform_int_distribution<size_t>(0, 400)(rng), '\0');
    for (char& c : b) c = static_cast<char>(rng() & 0xff);
    if (trial % 2 && b.size() >= 8) std::memcpy(&b[0], "KILNGRPH", 8);
    EXPECT_FALSE(loads(b, "random"));
  }
}

TEST(GraphSerialize, HeaderErrorsAreNamed) {
  std::string bytes = sample_bytes();
  std::string b = bytes;
  b[0] = 'X';
  testing::expect_error([&] { jit::deserialize_graph(b, "m.kiln"); }, {"m.kiln", "bad magic"});
  b = bytes;
  b[8] = 2;
  testing::expect_error([&] { jit::deserialize_graph(b, "m.kiln"); },
                        {"m.kiln", "unsupported format version 2"});
  b = bytes;
  b[kHeader + 3] ^= 1;
  testing::expect_error([&] { jit::deserialize_graph(b, "m.kiln"); }, {"m.kiln", "checksum"});
  testing::expect_error([&] { jit::deserialize_graph(bytes + "x", "m.kiln"); },
                        {"m.kiln", "trailing data"});
  b = bytes;
  auto pos = b.find("tanh");
  ASSERT_NE(pos, std::string::npos);
  b[pos + 3] = 'q';
  jit::reseal_for_testing(b);
  testing::expect_error([&] { jit::deserialize_graph(b, "m.kiln"); },
                        {"m.kiln", "unknown op 'tanq'", "(reading node", "op name"});
}

// Hand-made payloads for the consistency checks the checksum cannot catch.
struct Payload {
  std::string b = std::string(kHeader, '\0');
  Payload& u8(uint8_t v) { return raw(&v, 1); }
  Payload& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Payload& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Payload& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    return raw(s.data(), s.size());
  }
  // dtype f32 on the CPU, not wrapped, of the given sizes
  Payload& type(std::vector<int64_t> sizes, uint8_t dtype = 3) {
    u8(dtype).u8(0).u32(0).u8(0).u32(static_cast<uint32_t>(sizes.size()));
    for (int64_t s : sizes) u64(static_cast<uint64_t>(s));
    return *this;
  }
  Payload& raw(const void* p, size_t n) {
    b.append(static_cast<const char*>(p), n);
    return *this;
  }
  // No constants, empty metadata.
  std::string sealed() {
    u32(0).u64(0);
    std::memcpy(&b[0], "KILNGRPH", 8);
    b[8] = 1;
    jit::reseal_for_testing(b);
    return b;
  }
};

// One input x : f32[4]; one node `exp` whose single input is `ref`; output `out`.
std::string one_node(uint64_t ref, uint64_t out = 2, std::vector<int64_t> sizes = {4}) {
  return Payload()
      .u32(1)
      .type({4})
      .u64(1)
      .str("exp")
      .u32(0)
      .u32(1)
      .u64(ref)
      .u32(1)
      .type(sizes)
      .u8(0)
      .u32(1)
      .u64(out)
      .sealed();
}

TEST(GraphSerialize, InconsistentPayloadsThrow) {
  ASSERT_TRUE(loads(one_node(1), "valid"));
  EXPECT_EQ(graph_hash(*jit::deserialize_graph(one_node(1), "x").graph), [] {
    Graph g;
    g.add_output(g.create("exp", {g.add_input(kF32x4)}, {}, {kF32x4})->output());
    return graph_hash(g);
  }());
  auto err = [](const std::string& bytes, std::vector<std::string> parts) {
    parts.insert(parts.begin(), "kiln::jit::load: h.kiln: ");
    testing::expect_error([&] { jit::deserialize_graph(bytes, "h.kiln"); }, parts);
  };
  err(one_node(2), {"reference to value 2", "(reading node 0 inputs)"});  // its own output
  err(one_node(99), {"reference to value 99"});
  err(one_node(1, 0), {"a graph output is absent"});
  err(one_node(1, 3), {"reference to value 3", "graph outputs"});
  err(one_node(1, 2, {-1}), {"negative size -1", "output types"});
  err(one_node(1, 2, {INT64_MAX, 4}), {"overflow"});
  err(one_node(1, 2, {0, INT64_MAX, 4}), {"overflow"});
  // Bad tags.
  err(Payload().u32(1).type({4}, 9).u64(0).u32(0).sealed(), {"bad dtype tag 9"});
  err(Payload().u32(0).u64(1).str("exp").u32(1).u8(7).sealed(),
      {"attribute tag 7 out of range", "node 0 attributes"});
  err(Payload().u32(0).u64(1).str("exp").u32(1).u8(1).u8(2).sealed(), {"bad boolean byte 2"});
  err(Payload().u32(0).u64(1).str("input").u32(0).u32(0).u32(1).type({}).u8(0).u32(0).sealed(),
      {"an input node among the computations"});
  // Huge counts are rejected before anything is allocated for them.
  err(Payload().u32(0xffffffff).sealed(), {"truncated", "a count of 4294967295"});
  err(Payload().u32(0).u64(UINT64_MAX).sealed(), {"truncated", "graph node count"});
  err(Payload().u32(0).u64(1).str("exp").u32(0x7fffffff).sealed(), {"truncated", "attributes"});
  err(Payload()
          .u32(0)
          .u64(0)
          .u32(0)
          .u32(1)
          .u8(1)
          .u8(3)
          .u8(0)
          .u32(0)
          .u32(1)
          .u64(uint64_t(1) << 30)
          .u64(uint64_t(4) << 30)
          .sealed(),
      {"truncated", "constant 0"});
  err(Payload().u32(0).u64(0).u32(0).u32(1).u8(1).u8(3).u8(0).u32(0).u32(1).u64(3).u64(11).sealed(),
      {"data of 11 bytes for float32[3]"});
  // A well-formed file whose graph is not valid: verify() runs on load.
  err(Payload()
          .u32(0)
          .u64(1)
          .str("constant")
          .u32(2)
          .u8(2)
          .u64(1)
          .u8(6)
          .u8(4)
          .u32(0)
          .u32(1)
          .type({3})
          .u8(0)
          .u32(0)
          .sealed(),
      {"the loaded graph is invalid", "malformed constant"});
  // Values of a closed subgraph are out of reach.
  std::string closed = Payload()
                           .u32(1)
                           .type({4})
                           .u64(2)
                           // node 0: exp(x) with a subgraph that defines value 3
                           .str("exp")
                           .u32(0)
                           .u32(1)
                           .u64(1)
                           .u32(1)
                           .type({4})
                           .u8(1)
                           .u32(1)
                           .type({4})
                           .u64(0)
                           .u32(1)
                           .u64(3)
                           // node 1: tanh(value 3)
                           .str("tanh")
                           .u32(0)
                           .u32(1)
                           .u64(3)
                           .u32(1)
                           .type({4})
                           .u8(0)
                           .u32(0)
                           .sealed();
  err(closed, {"reference to value 3, which belongs to a subgraph that is already closed"});
}

// With the checksum recomputed, random damage reaches the parser: it must throw kiln::Error or
// produce a graph that verifies, never crash or allocate without bound.
TEST(GraphSerialize, ResealedCorruptionsThrowOrVerify) {
  auto& rng = testing::rng();
  std::vector<std::string> samples = {sample_bytes(), one_node(1)};
  for (int i = 0; i < 3; ++i) {
    GraphSpec s = testing::random_graph_spec(rng, 3, 10);
    samples.push_back(jit::serialize_graph(*s.build(), {testing::random_tensor({2})}, "m"));
  }
  auto any = [&](size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  static const uint64_t kInteresting[] = {
      0, 1, 2, 3, 7, 0x7f, 0xff, 0x7fffffff, 0xffffffff, INT64_MAX, UINT64_MAX, uint64_t(-2)};
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < 30000; ++trial) {
    std::string b = samples[any(0, samples.size() - 1)];
    int edits = static_cast<int>(any(1, 3));
    for (int e = 0; e < edits && b.size() > kHeader + 8; ++e) {
      size_t pos = any(kHeader, b.size() - 1);
      switch (any(0, 5)) {
        case 0:
          b[pos] ^= static_cast<char>(1 << any(0, 7));
          break;
        case 1:
          b[pos] = static_cast<char>(rng() & 0xff);
          break;
        case 2: {  // an interesting 1, 4 or 8 byte value
          uint64_t v = kInteresting[any(0, std::size(kInteresting) - 1)];
          size_t width = std::min<size_t>(size_t(1) << any(0, 3), b.size() - pos);
          for (size_t k = 0; k < width; ++k) b[pos + k] = static_cast<char>(v >> (8 * k));
          break;
        }
        case 3:
          b.erase(pos, any(1, 8));
          break;
        case 4:
          b.insert(pos, b.substr(any(kHeader, b.size() - 1), any(1, 16)));
          break;
        default:
          b.resize(pos);
          break;
      }
    }
    jit::reseal_for_testing(b);
    (loads(b, "resealed corruption") ? loaded : rejected)++;
  }
  std::printf("resealed corruptions: %d loaded and verified, %d rejected\n", loaded, rejected);
  EXPECT_GT(rejected, 0);
}

TEST(GraphSerialize, MillionNodeChainRoundTrips) {
  auto g = std::make_unique<Graph>();
  Value* v = g->add_input(kF32x4);
  for (int64_t i = 0, n = kiln::testing::scaled(1000000); i < n; ++i)
    v = g->create("exp", {v}, {}, {kF32x4})->output();
  g->add_output(v);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a) {
    return std::chrono::duration<double, std::milli>(clock::now() - a).count();
  };
  auto t0 = clock::now();
  std::string bytes = jit::serialize_graph(*g, {}, "");
  double save_ms = ms(t0);
  t0 = clock::now();
  LoadedGraph l = jit::deserialize_graph(bytes, "chain");
  double load_ms = ms(t0);
  std::printf("1,000,001 nodes: %zu bytes, serialize %.0f ms, deserialize+verify %.0f ms\n",
              bytes.size(), save_ms, load_ms);
  EXPECT_EQ(l.graph->size(), g->size());
  EXPECT_EQ(graph_hash(*l.graph), graph_hash(*g));
}

}  // namespace
}  // namespace kiln
