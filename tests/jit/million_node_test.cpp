// Scale test: 1,000,000-node chain and wide graphs through record, passes, hash, print, serialize.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "exec/lazy_eval.h"
#include "jit/hash.h"
#include "jit/ir.h"
#include "jit/passes/passes.h"
#include "jit/serialize.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/scale.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Prints the time since the last lap (timings are reported, never asserted).
class Timer {
 public:
  explicit Timer(std::string label) : label_(std::move(label)) {}
  double lap(const std::string& what) {
    auto now = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    std::printf("[ %s ] %-44s %7.3f s   (rss %s)\n", label_.c_str(), what.c_str(), s,
                memory().c_str());
    std::fflush(stdout);
    return s;
  }

 private:
  // Current and peak resident memory, from /proc (Linux).
  static std::string memory() {
    std::ifstream status("/proc/self/status");
    std::string line, rss = "?", peak = "?";
    auto value = [](const std::string& l) {
      size_t b = l.find_first_of("0123456789");
      long long kb = b == std::string::npos ? 0 : std::stoll(l.substr(b));
      return std::to_string(kb / 1024) + " MiB";
    };
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) rss = value(line);
      if (line.rfind("VmHWM:", 0) == 0) peak = value(line);
    }
    return rss + ", peak " + peak;
  }
  std::string label_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Lets the pending trace grow past the test's size without a flush, for the scope.
class NoFlushScope {
 public:
  explicit NoFlushScope(int64_t limit) : previous_(detail::max_pending()) {
    detail::set_max_pending(limit);
  }
  ~NoFlushScope() { detail::set_max_pending(previous_); }
  NoFlushScope(const NoFlushScope&) = delete;
  NoFlushScope& operator=(const NoFlushScope&) = delete;

 private:
  int64_t previous_;
};

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("kiln_million_" + name + "_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<detail::LazyRef> requests_of(const std::vector<Tensor>& tensors) {
  std::vector<detail::LazyRef> refs;
  refs.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    EXPECT_TRUE(detail::is_pending(t));
    refs.push_back(t.impl()->storage->lazy);
  }
  return refs;
}

size_t count_lines(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<char> buf(1 << 20);
  size_t lines = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) lines += buf[static_cast<size_t>(i)] == '\n';
  }
  return lines;
}

// What the passes' own profile says (since the last reset_pass_profile).
void print_pass_profile() {
  std::printf("      pass profile (verification %s):", jit::verify_passes() ? "on" : "off");
  for (const jit::PassProfileEntry& e : jit::pass_profile())
    if (e.runs > 0)
      std::printf(" %s %.3f s x%lld;", e.pass.c_str(), e.seconds, static_cast<long long>(e.runs));
  std::printf("\n");
}

// Every stage on the graph of the pending values `requests`: building it, hashing, printing to a
// file, serializing and loading back, verifying, each pass in run_passes' order, and run_passes
// on a fresh build. `min_nodes`: the least the built graph must hold.
void run_graph_stages(const std::vector<detail::LazyRef>& requests, size_t min_nodes,
                      bool passes_change_it, const fs::path& dir, Timer& timer) {
  jit::LazyGraphBinding binding;
  std::unique_ptr<jit::Graph> g = jit::build_graph(requests, &binding, /*keep_referenced=*/false);
  timer.lap("build_graph (" + std::to_string(g->size()) + " nodes)");
  ASSERT_GE(g->size(), min_nodes);
  EXPECT_EQ(g->outputs().size(), requests.size());
  EXPECT_EQ(binding.outputs.size(), requests.size());
  EXPECT_EQ(binding.inputs.size(), g->inputs().size());

  const jit::GraphHash raw = jit::graph_hash(*g);
  timer.lap("graph_hash");

  const fs::path file = dir / "graph.txt";
  {
    std::ofstream out(file);
    g->print(out);
    ASSERT_TRUE(out.good());
  }
  timer.lap("print to " + file.filename().string());
  // A header, a line per node (graph inputs are in the header) and the return line.
  EXPECT_EQ(count_lines(file), g->size() - g->inputs().size() + 2);
  std::printf("      printed %.1f MiB\n", static_cast<double>(fs::file_size(file)) / (1 << 20));
  timer.lap("count printed lines");

  std::string bytes = jit::serialize_graph(*g, {}, "million");
  timer.lap("serialize_graph (" + std::to_string(bytes.size() >> 20) + " MiB)");
  {
    jit::LoadedGraph loaded = jit::deserialize_graph(bytes, "million");
    timer.lap("deserialize_graph");
    EXPECT_EQ(loaded.metadata, "million");
    EXPECT_EQ(loaded.graph->size(), g->size());
    EXPECT_EQ(jit::graph_hash(*loaded.graph), raw);
    timer.lap("graph_hash of the loaded graph");
    loaded.graph.reset();
    timer.lap("destroy the loaded graph");
  }
  bytes = std::string();

  g->verify();
  timer.lap("verify");

  for (const jit::PassInfo& pass : jit::all_passes()) {
    jit::PassContext ctx;
    const size_t before = g->size();
    pass.fn(*g, ctx);
    int64_t rewrites = 0;
    for (const auto& [rule, n] : ctx.rewrites) rewrites += n;
    timer.lap(std::string("pass ") + pass.name + " (" + std::to_string(before) + " -> " +
              std::to_string(g->size()) + ", " + std::to_string(rewrites) + " rewrites)");
  }
  g->verify();
  timer.lap("verify");
  const jit::GraphHash optimized = jit::graph_hash(*g);
  timer.lap("graph_hash");
  EXPECT_EQ(optimized != raw, passes_change_it);
  bytes = jit::serialize_graph(*g, {}, "");
  EXPECT_EQ(jit::graph_hash(*jit::deserialize_graph(bytes, "optimized").graph), optimized);
  bytes = std::string();
  timer.lap("serialize + deserialize + hash (optimized)");
  g.reset();
  binding = jit::LazyGraphBinding();
  timer.lap("destroy the graph");

  // The same through run_passes, on a fresh build: the build is deterministic and run_passes is
  // the passes above in that order.
  jit::LazyGraphBinding binding2;
  std::unique_ptr<jit::Graph> g2 = jit::build_graph(requests, &binding2, false);
  timer.lap("build_graph again");
  EXPECT_EQ(jit::graph_hash(*g2), raw);
  timer.lap("graph_hash");
  jit::reset_pass_profile();
  jit::run_passes(*g2);
  timer.lap("run_passes (" + std::to_string(g2->size()) + " nodes after)");
  print_pass_profile();
  EXPECT_EQ(jit::graph_hash(*g2), optimized);
  g2.reset();
  timer.lap("graph_hash + destroy");
}

const int64_t kNodes = kiln::testing::scaled(1000000);

TEST(MillionNodes, Chain) {
  LazyGuard lazy(true);
  NoFlushScope no_flush(3 * kNodes);
  TempDir dir("chain");
  Timer timer("chain");
  const double kMul = 1.000001, kAdd = 1e-6;
  Tensor x0 = [] {
    LazyGuard eager(false);
    return full({1}, 0.75, kFloat64);
  }();
  const int64_t pending0 = detail::pending_count();
  Tensor x = x0;
  for (int64_t i = 0; i < kNodes / 2; ++i) x = x * kMul + kAdd;
  timer.lap("record " + std::to_string(kNodes) + " ops");
  EXPECT_EQ(detail::pending_count() - pending0, kNodes);
  ASSERT_TRUE(detail::is_pending(x));
  EXPECT_EQ(x.sizes(), Shape({1}));

  // The passes change the chain: cse merges its million repeated constants.
  run_graph_stages(requests_of({x}), static_cast<size_t>(kNodes), true, dir.path(), timer);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(detail::is_pending(x)) << "building graphs computed something";

  const int64_t e0 = jit::stats().evaluations;
  jit::reset_pass_profile();
  kiln::eval(x);
  timer.lap("kiln::eval (build + passes + run)");
  print_pass_profile();
  EXPECT_EQ(jit::stats().evaluations, e0 + 1);
  EXPECT_FALSE(detail::is_pending(x));
  EXPECT_EQ(detail::pending_count(), pending0);
  double want = 0.75;
  for (int64_t i = 0; i < kNodes / 2; ++i) want = want * kMul + kAdd;
  const double got = x.item<double>();
  EXPECT_NEAR(got, want, 1e-12 * std::abs(want));
  std::printf("      value %.17g, float64 loop %.17g\n", got, want);
  x = Tensor();
  timer.lap("check + drop");

  // An unmaterialized million-node chain, dropped: freed without recursion.
  Tensor y = x0;
  for (int64_t i = 0; i < kNodes; ++i) y = i % 2 ? y * kMul : sin(y);
  timer.lap("record another chain");
  EXPECT_EQ(detail::pending_count() - pending0, kNodes);
  y = Tensor();
  timer.lap("drop it unevaluated");
  EXPECT_EQ(detail::pending_count(), pending0);
}

TEST(MillionNodes, Wide) {
  LazyGuard lazy(true);
  NoFlushScope no_flush(3 * kNodes);
  TempDir dir("wide");
  Timer timer("wide");
  Tensor x = [] {
    LazyGuard eager(false);
    return full({1}, 0.5, kFloat64);
  }();
  auto offset = [](int64_t i) { return static_cast<double>(i) * 1e-6; };
  // exp(x + c_i): two nodes each, all reading x, the exp results kept alive.
  const int64_t width = kNodes / 2;
  const int64_t pending0 = detail::pending_count();
  std::vector<Tensor> outs;
  outs.reserve(static_cast<size_t>(width));
  for (int64_t i = 0; i < width; ++i) outs.push_back(exp(x + offset(i)));
  timer.lap("record " + std::to_string(kNodes) + " ops");
  EXPECT_EQ(detail::pending_count() - pending0, kNodes);

  // No pass changes the wide graph: its constants differ and nothing simplifies.
  run_graph_stages(requests_of(outs), static_cast<size_t>(kNodes), false, dir.path(), timer);
  if (::testing::Test::HasFatalFailure()) return;

  const int64_t e0 = jit::stats().evaluations;
  jit::reset_pass_profile();
  kiln::eval(outs);
  timer.lap("kiln::eval (build + passes + run)");
  print_pass_profile();
  EXPECT_EQ(jit::stats().evaluations, e0 + 1);
  EXPECT_EQ(detail::pending_count(), pending0);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{12345}, width / 2, width - 1}) {
    const Tensor& t = outs[static_cast<size_t>(i)];
    EXPECT_FALSE(detail::is_pending(t));
    EXPECT_NEAR(t.item<double>(), std::exp(0.5 + offset(i)), 1e-14) << "output " << i;
  }
  outs.clear();
  outs.shrink_to_fit();
  timer.lap("check + drop");
}

}  // namespace
}  // namespace kiln
