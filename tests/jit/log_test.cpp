// KILN_LOG: the lines each topic prints for its decisions (why the fuser left a producer out of a
// group, why lazy mode materialized, which pass rule fired, cache hits and misses), parsed.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "jit/dump.h"
#include "jit/log.h"
#include "kiln/kiln.h"
#include "lib/lazy.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/jit/log_capture.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::Fn;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

using testing::logged;

std::vector<std::string> lines_of(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  return lines;
}

// "%7 mul": the label the fuser's log gives the first node of `op` in the graph (the
// `nth` one, counting from 0).
std::string label(const jit::Graph& g, const std::string& op, int nth = 0) {
  for (const jit::Node* n = g.first(); n; n = n->next())
    if (n->op().name == op && nth-- == 0) return "%" + std::to_string(n->output()->id()) + " " + op;
  ADD_FAILURE() << "no " << op << " node in\n" << g.str();
  return "";
}

int count_of(const std::vector<std::string>& lines, const std::string& text) {
  int n = 0;
  for (const std::string& l : lines) n += l.find(text) != std::string::npos;
  return n;
}

// ------------------------------------------------------------------------------------- fuser
TEST(Log, FuserSaysAProducerReadByAnEarlierGemmIsNotMerged) {
  const Tensor x = testing::input({6, 10}), w = testing::input({10, 10});
  Planned p;
  const std::string out = logged("fuser", [&] {
    p = plan_of(
        [](const Inputs& in) {
          Tensor a = in[0] * 2.0;
          Tensor m = mm(a, in[1]);  // reads a before the group that computes exp(a) + 1
          Tensor b = exp(a) + 1.0;
          return Inputs{m, b};
        },
        {x, w});
  });
  const std::vector<std::string> lines = lines_of(out, "[kiln fuser] ");
  const std::string refusal = "[kiln fuser] " + label(*p.graph, "mul") +
                              " not merged into the group at " + label(*p.graph, "add") +
                              ": it is also read by " + label(*p.graph, "mm") +
                              ", outside the group and before the group's last node";
  EXPECT_EQ(count_of(lines, refusal), 1) << out;
  // The group it names is the one the fuser made (exp and add), and its line names it alike.
  EXPECT_EQ(count_of(lines, "[kiln fuser] group at " + label(*p.graph, "add") + " of 2 nodes"), 1)
      << out;
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  // One line per decision: the mul's and nothing about nodes that joined.
  EXPECT_EQ(count_of(lines, "not merged"), 1) << out;
}

TEST(Log, FuserSaysWhyANodeIsNotFusible) {
  const Tensor x = testing::input({7, 11}), w = testing::input({11, 5});
  Planned p;
  const std::string out = logged("fuser", [&] {
    p = plan_of(
        [](const Inputs& in) {
          Tensor reduced = in[0].sum({0});  // [11]: over a leading dim, so no group exit
          return Inputs{tanh(mm(in[0], in[1])) * 3.0, exp(reduced) * 2.0};
        },
        {x, w});
  });
  const std::vector<std::string> lines = lines_of(out, "[kiln fuser] ");
  EXPECT_EQ(
      count_of(lines, label(*p.graph, "mm") + " not merged into the group at " +
                          label(*p.graph, "mul") + ": not fusible: a GEMM (a oneDNN library call)"),
      1)
      << out;
  EXPECT_EQ(
      count_of(lines, label(*p.graph, "sum") + " not merged into the group at " +
                          label(*p.graph, "mul", 1) +
                          ": not fusible: a reduction over dims that are not the trailing ones"),
      1)
      << out;
}

TEST(Log, FuserSaysABroadcastingProducerReadElsewhereIsNotMerged) {
  const Tensor x = testing::input({13}), y = testing::input({6, 13});
  Planned p;
  const std::string out = logged("fuser", [&] {
    p = plan_of(
        [](const Inputs& in) {
          Tensor a = exp(in[0]);
          Tensor b = in[1] + a;  // a broadcasts here
          return Inputs{b, a.sum()};
        },
        {x, y});
  });
  const std::vector<std::string> lines = lines_of(out, "[kiln fuser] ");
  EXPECT_EQ(count_of(lines, label(*p.graph, "exp") + " not merged into the group at " +
                                label(*p.graph, "add") +
                                ": it broadcasts from [13] to the group's [6, 13] and would be "
                                "recomputed per element, but it is also read by " +
                                label(*p.graph, "sum")),
            1)
      << out;
}

TEST(Log, FuserSaysWhenAGroupIsFull) {
  const Tensor x = testing::input({9});
  constexpr int kChain = 130;
  Planned p;
  const std::string out = logged("fuser", [&] {
    p = plan_of(
        [](const Inputs& in) {
          Tensor y = in[0];
          for (int i = 0; i < kChain; ++i) y = y * 1.001;
          return Inputs{y};
        },
        {x});
  });
  const std::vector<std::string> lines = lines_of(out, "[kiln fuser] ");
  // The last 128 multiplications are one group; the one before them is refused once.
  const std::string refusal =
      "[kiln fuser] " + label(*p.graph, "mul", kChain - 129) + " not merged into the group at " +
      label(*p.graph, "mul", kChain - 1) + ": the group has reached 128 nodes";
  EXPECT_EQ(count_of(lines, refusal), 1) << out;
  EXPECT_EQ(count_of(lines, "not merged"), 1) << out;
  EXPECT_EQ(count_of(lines, "[kiln fuser] group at " + label(*p.graph, "mul", kChain - 1) +
                                " of 128 nodes"),
            1)
      << out;
}

TEST(Log, FuserOffPrintsNothing) {
  const Tensor x = testing::input({6, 10}), w = testing::input({10, 10});
  const std::string out = logged("", [&] {
    plan_of(
        [](const Inputs& in) {
          Tensor a = in[0] * 2.0;
          return Inputs{mm(a, in[1]), exp(a) + 1.0};
        },
        {x, w});
  });
  EXPECT_EQ(out, "");
}

// -------------------------------------------------------------------------------------- lazy
// The reason of the first "[kiln lazy] materializing" line `body` prints (of `expected` lines).
std::string materialization_reason(const std::function<void()>& body, size_t expected = 1) {
  LazyGuard lazy(true);
  const std::string out = logged("lazy", body);
  const std::vector<std::string> lines = lines_of(out, "[kiln lazy] ");
  static const std::regex line(
      R"(\[kiln lazy\] materializing \d+ value\(s\), \d+ nodes, because of (.*))");
  std::smatch m;
  if (lines.size() != expected || !std::regex_match(lines[0], m, line)) {
    ADD_FAILURE() << "expected " << expected << " materialization line(s), got:\n" << out;
    return "";
  }
  return m[1];
}

TEST(Log, LazySaysWhyItMaterialized) {
  const Tensor x = testing::input({5, 3});
  EXPECT_EQ(materialization_reason([&] { (x * 3.0).sum().item<float>(); }), "item() (data access)");
  EXPECT_EQ(materialization_reason([&] {
              std::ostringstream os;
              os << x + 4.0;
            }),
            "printing (data access)");
  EXPECT_EQ(materialization_reason([&] {
              const Tensor y = x - 1.0;
              y.data_ptr<float>();
            }),
            "data_ptr() (data access)");
  EXPECT_EQ(materialization_reason([&] { eval(exp(x)); }), "kiln::eval");
  // The pending index is computed at the call (its bounds are checked), the rest at eval.
  EXPECT_EQ(materialization_reason(
                [&] {
                  const Tensor index = ones({2}, kInt64) * 2;
                  eval(index_select(x, 0, index));
                },
                2),
            "index_select (an op that checks its operand's values)");
}

TEST(Log, LazySaysItFlushedAtTheSizeLimit) {
  const Tensor x = testing::input({4});
  const int64_t limit = detail::max_pending();
  detail::set_max_pending(3);
  std::vector<Tensor> kept;
  const std::string reason = materialization_reason([&] {
    Tensor y = x;
    for (int i = 0; i < 4; ++i) kept.push_back(y = y + 1.0);  // the fourth passes the limit
  });
  detail::set_max_pending(limit);
  EXPECT_EQ(reason, "the pending trace passed KILN_MAX_PENDING");
}

// ---------------------------------------------------------------------------- passes, cache
TEST(Log, PassesSayWhichRuleFired) {
  const Tensor x = testing::input({17}, kFloat32, 0.0, 1.0);
  LazyGuard lazy(true);
  const std::string out = logged("passes", [&] { eval(log(x + 1.0)); });
  const std::vector<std::string> lines = lines_of(out, "[kiln passes] ");
  static const std::regex line(R"(\[kiln passes\] stabilize: \d+ -> \d+ nodes \(.*log1p x1.*\))");
  int matched = 0;
  for (const std::string& l : lines) matched += std::regex_match(l, line);
  EXPECT_EQ(matched, 1) << out;
}

TEST(Log, CacheSaysPlanAndKernelHitsAndMisses) {
  const Tensor x = testing::input({19, 3});
  LazyGuard lazy(true);
  auto run = [&] { eval(sin(x) * cos(x) - 0.25); };
  const std::string first = logged("cache", run);
  const std::string second = logged("cache", run);
  EXPECT_EQ(count_of(lines_of(first, "[kiln cache] "), "[kiln cache] plan cache miss"), 1) << first;
  EXPECT_EQ(count_of(lines_of(second, "[kiln cache] "), "[kiln cache] plan cache hit"), 1)
      << second;
  // Plans built twice from one function: the second finds the first's kernel in memory.
  const Fn fn = [](const Inputs& in) { return Inputs{sin(in[0]) * cos(in[0]) * 0.5}; };
  auto plan_and_run = [&] {
    Planned p = plan_of(fn, {x});
    p.plan->run(p.binding.inputs);
  };
  logged("cache", plan_and_run);
  const std::string again = logged("cache", plan_and_run);
  static const std::regex hit(R"(\[kiln cache\] memory hit kiln_\w+_[0-9a-f]{8})");
  int hits = 0;
  for (const std::string& l : lines_of(again, "[kiln cache] ")) hits += std::regex_match(l, hit);
  EXPECT_EQ(hits, 1) << again;
}

// While dumping, kernels are compiled rather than read from the disk cache: a kernel new to this
// process is compiled, and codegen says so with its phase times.
TEST(Log, CodegenSaysWhatItCompiledAndHowLong) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "kiln_log_codegen_dump";
  std::filesystem::remove_all(dir);
  jit::set_dump_dir(dir.string());
  const Tensor x = testing::input({21, 5});
  const std::string out = logged("codegen", [&] {
    Planned p =
        plan_of([](const Inputs& in) { return Inputs{expm1(in[0]) * cos(in[0]) - 3.5}; }, {x});
    p.plan->run(p.binding.inputs);
  });
  jit::set_dump_dir("");
  std::filesystem::remove_all(dir);
  static const std::regex compiled(
      R"(\[kiln codegen\] compiled (kiln_\w+_[0-9a-f]{8}) in [0-9.]+ ms: IR [0-9.]+, optimization [0-9.]+, object code [0-9.]+, disk cache [0-9.]+, linking [0-9.]+)");
  std::vector<std::string> symbols;
  for (const std::string& l : lines_of(out, "[kiln codegen] ")) {
    std::smatch m;
    if (std::regex_match(l, m, compiled)) symbols.push_back(m[1]);
  }
  ASSERT_EQ(symbols.size(), 1u) << out;
  EXPECT_NE(symbols[0].find("expm1"), std::string::npos) << symbols[0];
  EXPECT_NE(out.find("[kiln codegen] compiling " + symbols[0]), std::string::npos) << out;
}

}  // namespace
}  // namespace kiln
