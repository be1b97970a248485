// The profiler: spans of a lazy MLP's steps and the JIT's phases, the report's tables and tips,
// the Chrome trace, and KILN_PROFILE in a child process.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/profiler.h"
#include "tests/jit/graph_names.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using profiler::Category;
using profiler::Record;

constexpr int64_t kM = 64, kK = 128, kN = 256;

Tensor concrete_random(const Shape& shape) {
  LazyGuard eager(false);
  return testing::random_tensor(shape, kFloat32, -1.0, 1.0);
}

// GELU (tanh form) written with primitives, so that it fuses into one kernel.
Tensor gelu_from_primitives(const Tensor& x) {
  return x * 0.5 * (tanh((x + x * x * x * 0.044715) * 0.7978845608) + 1.0);
}

// One lazy MLP layer: a GEMM with bias, then the fused GELU.
Tensor mlp_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  LazyGuard lazy(true);
  Tensor y = gelu_from_primitives(x.matmul(w) + b);
  eval(y);
  return y;
}

// Runs the MLP `calls` times under a ProfileGuard, with m rows (a size no other test uses, so
// that its plan is built, not found in the plan cache).
std::vector<Record> run_profiled(int calls, int64_t m) {
  const Tensor x = concrete_random({m, kK}), w = concrete_random({kK, kN}),
               b = concrete_random({kN});
  profiler::reset();
  {
    profiler::ProfileGuard guard;
    for (int i = 0; i < calls; ++i) mlp_forward(x, w, b);
  }
  return profiler::records();
}

bool is_gemm(const std::string& name) {
  return name == "mm" || name == "addmm" || name == "matmul" || name == "linear";
}

TEST(Profiler, RecordsTheFusedKernelTheGemmAndTheJitPhases) {
  EXPECT_FALSE(profiler::enabled());
  const std::vector<Record> rs = run_profiled(1, kM);
  EXPECT_FALSE(profiler::enabled());  // the guard restored the previous state
  const Record* kernel = nullptr;
  const Record* gemm = nullptr;
  const Record* evaluate = nullptr;
  bool pass = false, plan_build = false, fusion = false;
  for (const Record& r : rs) {
    EXPECT_GE(r.duration_ns, 0) << r.name;
    EXPECT_GE(r.start_ns, 0) << r.name;
    EXPECT_GE(r.thread, 1u);
    if (r.category == Category::kKernel && r.name.find("tanh") != std::string::npos) kernel = &r;
    if (r.category == Category::kLibrary && is_gemm(r.name)) gemm = &r;
    if (r.name == "lazy.evaluate") evaluate = &r;
    pass |= r.name.rfind("pass:", 0) == 0;
    plan_build |= r.name == "plan.build";
    fusion |= r.name == "fusion";
  }
  ASSERT_NE(kernel, nullptr) << profiler::report();
  ASSERT_NE(gemm, nullptr) << profiler::report();
  ASSERT_NE(evaluate, nullptr);
  EXPECT_TRUE(pass);
  EXPECT_TRUE(plan_build);
  EXPECT_TRUE(fusion);
  // The kernel's name lists the fused ops, its shape is the GEMM's output.
  EXPECT_NE(kernel->name.find("fused:"), std::string::npos);
  EXPECT_NE(kernel->name.find("mul"), std::string::npos);
  EXPECT_EQ(kernel->shape, std::to_string(kM) + "x" + std::to_string(kN));
  // And it carries the kernel's symbol, kiln_<ops>_<hash8>; other steps have none.
  EXPECT_EQ(kernel->kernel.rfind("kiln_" + kernel->name.substr(6) + "_", 0), 0u) << kernel->kernel;
  EXPECT_EQ(kernel->kernel.size(), kernel->name.size() - 6 + 14) << kernel->kernel;
  EXPECT_EQ(gemm->kernel, "");
  EXPECT_GT(kernel->bytes, 0);
  EXPECT_EQ(kernel->flops, 0);
  EXPECT_EQ(gemm->flops, 2 * kM * kN * kK);
  // At least x, w and the output.
  EXPECT_GE(gemm->bytes, (kM * kK + kK * kN + kM * kN) * 4);
  // The steps nest inside the evaluation, one level deeper, on its thread, GEMM before GELU.
  for (const Record* step : {kernel, gemm}) {
    EXPECT_EQ(step->thread, evaluate->thread);
    EXPECT_GT(step->depth, evaluate->depth);
    EXPECT_GE(step->start_ns, evaluate->start_ns);
    EXPECT_LE(step->start_ns + step->duration_ns, evaluate->start_ns + evaluate->duration_ns);
  }
  EXPECT_LE(gemm->start_ns + gemm->duration_ns, kernel->start_ns);
}

TEST(Profiler, OffRecordsNothingAndResetClears) {
  run_profiled(1, 16);
  EXPECT_FALSE(profiler::records().empty());
  profiler::reset();
  EXPECT_TRUE(profiler::records().empty());
  const Tensor x = concrete_random({kM, kK}), w = concrete_random({kK, kN}),
               b = concrete_random({kN});
  mlp_forward(x, w, b);
  EXPECT_TRUE(profiler::records().empty());
  {
    profiler::ProfileGuard on;
    profiler::ProfileGuard off(false);
    mlp_forward(x, w, b);
    EXPECT_FALSE(profiler::enabled());
  }
  EXPECT_TRUE(profiler::records().empty());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::istringstream is(line);
  std::vector<std::string> out;
  for (std::string f; is >> f;) out.push_back(f);
  return out;
}

// The rows of the table whose header follows the line starting with `title`.
std::vector<std::vector<std::string>> table_rows(const std::vector<std::string>& lines,
                                                 const std::string& title) {
  size_t i = 0;
  while (i < lines.size() && lines[i].rfind(title, 0) != 0) ++i;
  EXPECT_LT(i + 1, lines.size()) << "no table " << title;
  if (i + 1 >= lines.size()) return {};
  const std::string& header = lines[i + 1];
  for (const char* col :
       {"% time", "cum %", "total ms", "per call us", "calls", "GB/s", "GFLOP/s", "name"})
    EXPECT_NE(header.find(col), std::string::npos) << col << " in " << header;
  std::vector<std::vector<std::string>> rows;
  for (size_t k = i + 2; k < lines.size() && !lines[k].empty(); ++k)
    rows.push_back(fields(lines[k]));
  return rows;
}

TEST(Profiler, ReportTablesParse) {
  run_profiled(3, 32);
  const std::string report = profiler::report();
  const std::vector<std::string> lines = lines_of(report);
  for (const char* title : {"Kernels and library calls", "Per op type"}) {
    const auto rows = table_rows(lines, title);
    ASSERT_GE(rows.size(), 2u) << report;
    double sum = 0, last_cum = 0;
    bool gemm_row = false, kernel_row = false;
    for (const auto& row : rows) {
      ASSERT_GE(row.size(), 8u) << report;
      ASSERT_EQ(row[0].back(), '%');
      sum += std::stod(row[0]);
      last_cum = std::stod(row[1]);
      EXPECT_GE(std::stod(row[2]), 0);   // total ms
      EXPECT_GE(std::stod(row[3]), 0);   // per call
      EXPECT_GE(std::stoll(row[4]), 3);  // calls: every step ran 3 times
      if (is_gemm(row[7])) {
        gemm_row = true;
        EXPECT_GT(std::stod(row[6]), 0) << "GFLOP/s of the GEMM row";
        // Printed to two decimals: a small GEMM slowed by a loaded machine rounds to 0.00 (the
        // bytes behind it are checked on the records above).
        EXPECT_GE(std::stod(row[5]), 0) << "GB/s of the GEMM row";
      }
      if (row[7].rfind("fused:", 0) == 0) {
        kernel_row = true;
        EXPECT_EQ(row[6], "-");
        EXPECT_GT(std::stod(row[5]), 0);
      }
    }
    EXPECT_NEAR(sum, 100.0, 0.5) << report;
    EXPECT_NEAR(last_cum, 100.0, 0.05) << report;
    EXPECT_TRUE(gemm_row) << report;
    EXPECT_TRUE(kernel_row) << report;
  }
  // The JIT's section: counters, phases and passes with their node counts.
  for (const char* text :
       {"JIT:", "lazy evaluations 3", "plan cache hits", "kernels: compiled", "memory cache hits",
        "disk cache hits", "lazy.evaluate", "pass:dce", "nodes in->out", "Tips:"})
    EXPECT_NE(report.find(text), std::string::npos) << text << "\n" << report;
}

TEST(Profiler, TipsNameARepeatedGuardFailure) {
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(in[0]) * 2}; };
  jit::Function f = jit::trace(fn, {concrete_random({4})});
  (void)f({concrete_random({4})});
  profiler::reset();
  {
    profiler::ProfileGuard guard;
    for (int64_t n : {5, 6, 7}) (void)f({concrete_random({n})});
  }
  const std::string report = profiler::report();
  EXPECT_NE(report.find("guard failed 3x on input 0 (latest: input 0 is float32[7]"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("a traced function's guard failed 3 times on input 0"), std::string::npos)
      << report;
  bool trace = false, replay = false;
  for (const Record& r : profiler::records()) {
    trace |= r.name == "trace";
    replay |= r.name == "replay";
  }
  EXPECT_TRUE(trace);
  EXPECT_TRUE(replay);
}

// A small JSON checker: true when `s` from `i` holds one valid JSON value (and only it).
struct Json {
  const std::string& s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool lit(const char* w) {
    const size_t n = std::string(w).size();
    if (s.compare(i, n, w) != 0) return false;
    i += n;
    return true;
  }
  bool str() {
    if (s[i] != '"') return false;
    for (++i; i < s.size(); ++i) {
      if (s[i] == '\\') {
        ++i;
      } else if (s[i] == '"') {
        ++i;
        return true;
      } else if (static_cast<unsigned char>(s[i]) < 0x20) {
        return false;
      }
    }
    return false;
  }
  bool num() {
    const char* begin = s.c_str() + i;
    char* end = nullptr;
    std::strtod(begin, &end);
    if (end == begin) return false;
    i += static_cast<size_t>(end - begin);
    return true;
  }
  bool value() {
    ws();
    if (i >= s.size()) return false;
    bool ok;
    if (s[i] == '{') {
      ++i;
      ws();
      if (s[i] == '}') {
        ++i;
        return true;
      }
      do {
        ws();
        if (!str()) return false;
        ws();
        if (s[i++] != ':') return false;
        if (!value()) return false;
        ws();
      } while (s[i] == ',' && ++i);
      ok = s[i++] == '}';
    } else if (s[i] == '[') {
      ++i;
      ws();
      if (s[i] == ']') {
        ++i;
        return true;
      }
      do {
        if (!value()) return false;
        ws();
      } while (s[i] == ',' && ++i);
      ok = s[i++] == ']';
    } else if (s[i] == '"') {
      ok = str();
    } else {
      ok = lit("true") || lit("false") || lit("null") || num();
    }
    return ok;
  }
  bool document() {
    const bool ok = value();
    ws();
    return ok && i == s.size();
  }
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// A kernel no other test here uses: its plan's first run looks it up (a miss), loads it from the
// disk cache or compiles it, then runs it; a plan of another size finds it in memory.
TEST(Profiler, KernelLookupsAreCacheSpansAndCompilationIsNotKernelTime) {
  auto run = [](const Shape& shape) {
    const Tensor x = concrete_random(shape);
    LazyGuard lazy(true);
    eval(expm1(x) * sin(x) + 0.75);
  };
  profiler::reset();
  {
    profiler::ProfileGuard guard;
    run({23, 29});
    run({31, 29});
  }
  const std::vector<Record> rs = profiler::records();
  std::vector<const Record*> kernels, lookups, loads;
  for (const Record& r : rs) {
    if (r.category == Category::kKernel && r.name.find("expm1") != std::string::npos)
      kernels.push_back(&r);
    if (r.name == "kernel.lookup") lookups.push_back(&r);
    if (r.name == "compile" || r.name == "kernel.disk_load") loads.push_back(&r);
  }
  ASSERT_EQ(kernels.size(), 2u) << profiler::report();
  ASSERT_EQ(lookups.size(), 2u) << profiler::report();
  ASSERT_EQ(loads.size(), 1u) << profiler::report();
  const std::string& symbol = kernels[0]->kernel;
  EXPECT_EQ(kernels[1]->kernel, symbol);
  // Look-ups are the cache's spans, named by the kernel and what they found.
  EXPECT_EQ(lookups[0]->category, Category::kCache);
  EXPECT_EQ(lookups[0]->shape, symbol + " (miss)");
  EXPECT_EQ(lookups[1]->category, Category::kCache);
  EXPECT_EQ(lookups[1]->shape, symbol + " (hit)");
  const Record& load = *loads[0];
  EXPECT_EQ(load.shape, symbol);
  EXPECT_EQ(load.category, load.name == "compile" ? Category::kJit : Category::kCache);
  // The first call's JIT work ends before its kernel's span begins, at the same depth: the
  // kernel's time (and its row in the report) is the kernel's run alone.
  for (const Record* jit_work : {lookups[0], &load}) {
    EXPECT_EQ(jit_work->thread, kernels[0]->thread);
    EXPECT_EQ(jit_work->depth, kernels[0]->depth) << jit_work->name;
    EXPECT_LE(jit_work->start_ns + jit_work->duration_ns, kernels[0]->start_ns) << jit_work->name;
  }
  EXPECT_LE(lookups[0]->start_ns + lookups[0]->duration_ns, load.start_ns);
  EXPECT_LE(lookups[1]->start_ns + lookups[1]->duration_ns, kernels[1]->start_ns);
  const std::string report = profiler::report();
  EXPECT_NE(report.find("kernel.lookup"), std::string::npos) << report;
  EXPECT_EQ(count(profiler::chrome_trace(), "\"cat\":\"cache\""),
            load.name == "kernel.disk_load" ? 3u : 2u);
}

TEST(Profiler, ChromeTraceIsJsonWithOneEventPerSpan) {
  const std::vector<Record> rs = run_profiled(2, 48);
  const std::string trace = profiler::chrome_trace();
  Json json{trace};
  EXPECT_TRUE(json.document()) << "invalid JSON near offset " << json.i;
  EXPECT_EQ(count(trace, "\"ph\":\"X\""), rs.size());
  EXPECT_GE(count(trace, "\"cat\":\"kernel\""), 2u);
  EXPECT_EQ(count(trace, "\"kernel\":\"kiln_"), count(trace, "\"cat\":\"kernel\""));
  EXPECT_NE(trace.find("\"flops\":" + std::to_string(2 * 48 * kN * kK)), std::string::npos);
  // Python's json module agrees, where there is a python3.
  const std::string path = ::testing::TempDir() + "kiln_profiler_trace.json";
  profiler::write_chrome_trace(path);
  if (std::system("python3 -c 'pass' >/dev/null 2>&1") == 0) {
    const std::string cmd =
        "python3 -c 'import json,sys; e=json.load(open(sys.argv[1])); "
        "e=[x for x in e if x[\"ph\"]!=\"M\"]; "
        "assert all(x[\"ph\"]==\"X\" and x[\"dur\"]>=0 and \"tid\" in x for x in e); "
        "sys.exit(0 if len(e)==" +
        std::to_string(rs.size()) + " else 3)' " + path;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  std::remove(path.c_str());
}

// Four groups that compile to one kernel (the same ops on the same layout): graph A's one group
// runs three times, graph B's three groups once each. Each launch is timed for its own graph and
// group, so the groups' times sum to the kernel's total and their launches differ.
TEST(Profiler, AKernelTwoGroupsShareIsTimedPerGroup) {
  const Tensor x = concrete_random({37, 29}), y = concrete_random({37, 29}),
               w = concrete_random({37, 29});
  profiler::reset();
  {
    profiler::ProfileGuard guard;
    LazyGuard lazy(true);
    for (int i = 0; i < 3; ++i) eval(tanh(x * y));
    eval(tanh(x * y), tanh(w * y), tanh(x * y * y));
  }
  const std::vector<Record> rs = profiler::records();
  std::string kernel;
  for (const Record& r : rs)
    if (r.category == Category::kKernel && r.name == "fused:mul_tanh") kernel = r.kernel;
  ASSERT_FALSE(kernel.empty());
  // Per (graph, group): launches and time; and the kernel's total.
  std::map<std::pair<int64_t, int64_t>, std::pair<int, int64_t>> per_group;
  int64_t total_ns = 0;
  std::set<int64_t> graphs;
  for (const Record& r : rs) {
    if (r.category == Category::kKernel || r.category == Category::kLibrary) {
      EXPECT_GE(r.graph, 0) << r.name;
      graphs.insert(r.graph);
    }
    if (r.category == Category::kKernel) EXPECT_GE(r.group, 0) << r.name;
    if (r.category == Category::kLibrary) EXPECT_EQ(r.group, -1) << r.name;
    if (r.kernel != kernel) continue;
    auto& g = per_group[{r.graph, r.group}];
    ++g.first;
    g.second += r.duration_ns;
    total_ns += r.duration_ns;
  }
  // Graph A's group ran three times, graph B's three groups once each.
  ASSERT_EQ(per_group.size(), 4u);
  EXPECT_EQ(graphs.size(), 2u);
  const int64_t graph_a = per_group.begin()->first.first;
  int64_t sum_ns = 0;
  for (const auto& [key, g] : per_group) {
    EXPECT_EQ(g.first, key.first == graph_a ? 3 : 1) << key.first << "/" << key.second;
    sum_ns += g.second;
  }
  EXPECT_EQ(sum_ns, total_ns);
  // The trace carries both ids with each launch, and the graphs' names.
  const std::string trace = profiler::chrome_trace();
  EXPECT_EQ(count(trace, "\"kernel\":\"" + kernel + "\",\"graph\":"), 6u) << trace;
  std::map<int64_t, std::string> names;
  for (const profiler::GraphName& g : profiler::graph_names()) names[g.graph] = g.name;
  for (int64_t g : graphs) {
    EXPECT_EQ(names[g].rfind("lazy flush #", 0), 0u) << g << ": " << names[g];
    EXPECT_NE(trace.find("\"name\":\"kiln_graph\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{"
                         "\"graph\":" +
                         std::to_string(g) + ","),
              std::string::npos);
  }
  // The report's per-graph table names them too.
  const std::string report = profiler::report();
  EXPECT_NE(report.find("Per graph"), std::string::npos) << report;
  EXPECT_NE(report.find("graph " + std::to_string(*graphs.begin()) + ": lazy flush #"),
            std::string::npos)
      << report;
}

// A traced function's graphs are named after it and after their part.
std::vector<Tensor> traced_loss_step(const Tensor& x, Tensor& w) {
  jit::Function f = jit::trace(
      [&w](const std::vector<Tensor>& in) { return std::vector<Tensor>{(tanh(in[0] * w)).sum()}; },
      {x});
  return f({x});
}

TEST(Profiler, TracedGraphsAreNamedByFunctionAndPart) {
  const Tensor x = concrete_random({13, 17});
  Tensor w = concrete_random({13, 17}).requires_grad_(true);
  profiler::reset();
  profiler::ProfileGuard guard;
  std::vector<Tensor> out = traced_loss_step(x, w);
  out[0].backward();
  eval(w.grad());
  std::set<std::string> names;
  for (const profiler::GraphName& g : profiler::graph_names()) names.insert(g.name);
  // The lambda's number is GCC's count in its function, clang's in its file.
  const std::string prefix = R"(trace kiln::traced_loss_step\(\)::lambda#[0-9]+: )";
  EXPECT_EQ(testing::count_matching(names, prefix + "forward"), 1u)
      << ::testing::PrintToString(names);
  EXPECT_EQ(testing::count_matching(names, prefix + "backward"), 1u)
      << ::testing::PrintToString(names);
}

// What the child process runs under KILN_PROFILE (and, standing alone, a quick workload).
TEST(ProfilerChild, Workload) {
  const Tensor x = concrete_random({kM, kK}), w = concrete_random({kK, kN}),
               b = concrete_random({kN});
  for (int i = 0; i < 2; ++i) mlp_forward(x, w, b);
}

// This test binary's workload run again with KILN_PROFILE set; returns its stderr.
std::string run_child(const std::string& profile_value) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  EXPECT_GT(n, 0);
  if (n <= 0) return "";
  self[n] = '\0';
  const std::string cmd = "KILN_PROFILE='" + profile_value + "' '" + self +
                          "' --gtest_filter=ProfilerChild.Workload 2>&1 >/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  if (!pipe) return "";
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << out;
  return out;
}

TEST(Profiler, EnvironmentPrintsTheReportAtExit) {
  const std::string err = run_child("1");
  EXPECT_NE(err.find("=== kiln profile:"), std::string::npos) << err;
  const auto rows = table_rows(lines_of(err), "Kernels and library calls");
  ASSERT_GE(rows.size(), 2u) << err;
  bool kernel = false;
  for (const auto& row : rows) kernel |= row.size() >= 8 && row[7].rfind("fused:", 0) == 0;
  EXPECT_TRUE(kernel) << err;
  EXPECT_NE(err.find("Tips:"), std::string::npos) << err;
}

TEST(Profiler, EnvironmentWritesTheChromeTraceAtExit) {
  const std::string path = ::testing::TempDir() + "kiln_profiler_child.json";
  std::remove(path.c_str());
  const std::string err = run_child(path);
  EXPECT_NE(err.find("written to " + path), std::string::npos) << err;
  EXPECT_EQ(err.find("=== kiln profile:"), std::string::npos) << err;
  std::ifstream f(path);
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string trace = ss.str();
  Json json{trace};
  EXPECT_TRUE(json.document());
  EXPECT_GE(count(trace, "\"cat\":\"kernel\""), 2u) << trace;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kiln
