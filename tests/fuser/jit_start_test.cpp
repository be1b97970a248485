// LLVM's JIT starting on a background thread as kiln loads (fuser::start_cpu_jit_early): raced by
// evaluations from several threads at once, a process that exits or forks while it runs, and the
// switches that keep it from starting. Each case runs this binary again as a child process whose
// static initializer (below) acts before main, microseconds after kiln's own initializer started
// the thread, so the child meets the start in flight.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tests/testing.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 4;

// y = tanh(y * 1.5) + x, `depth` times from y = x, on 64 float32 values, evaluated lazily (one
// fused kernel per depth), checked against float64.
bool evaluates_correctly(int depth) {
  Tensor x;
  {
    LazyGuard eager(false);
    x = arange(0, 64, 1, kFloat32) * 0.05 - 1.6;
  }
  LazyGuard lazy(true);
  Tensor y = x;
  for (int d = 0; d < depth; ++d) y = tanh(y * 1.5) + x;
  const std::vector<double> xs = x.to_vector<double>();
  const std::vector<double> ys = y.to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    double want = xs[i];
    for (int d = 0; d < depth; ++d) want = std::tanh(want * 1.5) + xs[i];
    if (std::fabs(ys[i] - want) > 1e-5 * std::fabs(want) + 1e-6) {
      std::printf("depth %d, element %zu: %.9g, want %.9g\n", depth, i, ys[i], want);
      return false;
    }
  }
  return true;
}

// Child "race": kThreads threads evaluate a kernel each at once (distinct kernels: each is
// compiled or loaded while the others are) and print what the JIT did.
int race_child() {
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 0);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &ok] { ok[t] = evaluates_correctly(t + 1); });
  for (std::thread& t : threads) t.join();
  int good = 0;
  for (int v : ok) good += v;
  const jit::Stats s = jit::stats();
  std::printf("KILN_START_CHILD good=%d compiled=%lld disk=%lld\n", good,
              static_cast<long long>(s.kernels_compiled),
              static_cast<long long>(s.kernel_disk_hits));
  return good == kThreads ? 0 : 1;
}

// Child "fork": forks at once, while the JIT is starting; the forked process must be able to
// start its own and evaluate (a half-started JIT inherited from the parent would hang it).
int fork_child() {
  const pid_t pid = fork();
  if (pid == 0) {
    std::fflush(stdout);
    _exit(evaluates_correctly(2) ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 2;
  const bool good = WIFEXITED(status) && WEXITSTATUS(status) == 0 && evaluates_correctly(3);
  std::printf("KILN_START_CHILD forked=%d\n", good ? 1 : 0);
  return good ? 0 : 1;
}

// The child modes act in a static initializer, before main: kiln's own initializer (in
// libkiln.so, initialized before this binary) has just started the JIT's thread.
[[maybe_unused]] const bool kChildRan = [] {
  const char* mode = std::getenv("KILN_JIT_START_CHILD");
  if (!mode) return false;
  const std::string m = mode;
  std::fflush(stdout);
  if (m == "race") std::exit(race_child());
  if (m == "fork") std::exit(fork_child());
  if (m == "eager") return true;  // runs as a test (below), after static initialization
  if (m == "exit") std::exit(0);  // a program that never evaluates
  std::exit(3);
}();

// Child "eager": eager work only, as a KILN_LAZY=0 program does. It runs from main, not from the
// static initializer: there, the first op would read lazy mode's default from another library's
// initialized global, which AddressSanitizer's strict initialization order check reports.
TEST(JitEarlyStartChild, EagerWork) {
  const char* mode = std::getenv("KILN_JIT_START_CHILD");
  if (!mode || std::string(mode) != "eager")
    GTEST_SKIP() << "runs as the child of JitEarlyStart.EagerModeStartsNoJit";
  const Tensor y = tanh(arange(0, 8, 1, kFloat32)) + 1.0;
  std::printf("KILN_START_CHILD sum=%.4f\n", y.sum().item<double>());
}

struct Child {
  int status = -1;
  std::string output;
  int count(const std::string& s) const {
    int n = 0;
    for (size_t p = output.find(s); p != std::string::npos; p = output.find(s, p + 1)) ++n;
    return n;
  }
};

// Runs this binary as a child in `mode` with KILN_LOG=codegen and the extra environment (and
// gtest's arguments, for a child that runs as a test).
Child run_child(const std::string& mode, const std::string& env, const std::string& args = "") {
  // The watchdog kills a child that hangs (a fork that inherited a half-started JIT): it fails.
  const testing::ChildRun run = testing::run_this_binary(
      "KILN_JIT_START_CHILD=" + mode + " KILN_LOG=codegen KILN_FUSE=1 " + env, args);
  return {run.status, run.output};
}

constexpr const char* kEarly = "LLVM JIT started on a background thread";
constexpr const char* kStarted = "LLVM JIT started in";

TEST(JitEarlyStart, ThreadsEvaluatingAsKilnLoadsShareOneStartAndAreCorrect) {
  const Child c = run_child("race", "KILN_LAZY=1 KILN_CACHE=0");
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_EQ(c.count("KILN_START_CHILD good=4 compiled=4 disk=0"), 1) << c.output;
  EXPECT_EQ(c.count(kEarly), 1) << c.output;
  EXPECT_EQ(c.count(kStarted), 1) << c.output;  // one engine for the early start and the threads
}

TEST(JitEarlyStart, ThreadsLoadingFromTheDiskCacheAsKilnLoadsAreCorrect) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("kiln-jit-start-test-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string env = "KILN_LAZY=1 KILN_CACHE=1 KILN_CACHE_DIR='" + dir.string() + "'";
  const Child first = run_child("race", env);
  EXPECT_EQ(first.count("KILN_START_CHILD good=4 compiled=4 disk=0"), 1) << first.output;
  const Child second = run_child("race", env);  // the same kernels' keys: all found on disk
  EXPECT_EQ(second.status, 0) << second.output;
  EXPECT_EQ(second.count("KILN_START_CHILD good=4 compiled=0 disk=4"), 1) << second.output;
  EXPECT_EQ(second.count(kEarly), 1) << second.output;
  fs::remove_all(dir);
}

// The process exits while the JIT is starting: exit waits for the thread (its log line is
// printed) and the process exits cleanly, before LLVM's static destructors run under it.
TEST(JitEarlyStart, AProgramThatNeverEvaluatesExitsCleanly) {
  const Child c = run_child("exit", "KILN_LAZY=1");
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_EQ(c.count(kEarly), 1) << c.output;
}

TEST(JitEarlyStart, AProcessForkedWhileItStartsEvaluatesInBothProcesses) {
  const Child c = run_child("fork", "KILN_LAZY=1 KILN_CACHE=0");
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_EQ(c.count("KILN_START_CHILD forked=1"), 1) << c.output;
}

TEST(JitEarlyStart, EagerModeStartsNoJit) {
  const Child c = run_child("eager", "KILN_LAZY=0", "--gtest_filter=JitEarlyStartChild.EagerWork");
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_EQ(c.count("KILN_START_CHILD sum="), 1) << c.output;
  EXPECT_EQ(c.count(kStarted), 0) << c.output;
  EXPECT_EQ(c.count(kEarly), 0) << c.output;
}

TEST(JitEarlyStart, TheEnvironmentTurnsItOffAndTheFirstKernelStartsTheJit) {
  const Child c = run_child("race", "KILN_LAZY=1 KILN_CACHE=0 KILN_JIT_EARLY_START=0");
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_EQ(c.count("KILN_START_CHILD good=4 compiled=4 disk=0"), 1) << c.output;
  EXPECT_EQ(c.count(kEarly), 0) << c.output;
  EXPECT_EQ(c.count(kStarted), 1) << c.output;
}

}  // namespace
}  // namespace kiln
