// How kiln degrades on a busy machine: the MLP example's training (tools/examples/mlp_train) on
// a quiet machine and beside a process that spins on one core, under kiln's OpenMP wait policy
// and under libgomp's default one (a long spin), each run as a child process since the policy is
// fixed when the OpenMP runtime starts.
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// The example next to this binary: build/tools/bench/kiln_bench -> build/tools/examples/.
std::string mlp_train_path() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string path(exe, n > 0 ? static_cast<size_t>(n) : 0);
  path = path.substr(0, path.rfind('/'));
  return path.substr(0, path.rfind('/')) + "/examples/mlp_train";
}

// Seconds for `mlp_train --steps 100` with `env` (empty: kiln's policy), -1 on failure.
double train_seconds(const std::string& env) {
  const std::string cmd = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " + env + " '" +
                          mlp_train_path() + "' --steps 100 > /dev/null 2>&1";
  const auto start = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rc == 0 ? s : -1.0;
}

// A competing process: one thread spinning until it is killed.
class Spinner {
 public:
  Spinner() {
    pid_ = fork();
    if (pid_ == 0) {
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
  }
  ~Spinner() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_;
};

// Arg 0: kiln's wait policy; 1: libgomp's default (GOMP_SPINCOUNT=300000, what kiln ran with
// before it chose its own). Reports the quiet and busy times and their ratio.
void BM_MlpTrainUnderContention(benchmark::State& state) {
  const std::string env = state.range(0) == 0 ? "" : "GOMP_SPINCOUNT=300000";
  double quiet = 0, busy = 0;
  for (auto _ : state) {
    const double q = train_seconds(env);
    double b = 0;
    {
      Spinner competitor;
      b = train_seconds(env);
    }
    if (q < 0 || b < 0) {
      state.SkipWithError("mlp_train failed (is tools/examples built?)");
      return;
    }
    quiet += q;
    busy += b;
    state.SetIterationTime(b);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["quiet_s"] = quiet / n;
  state.counters["busy_s"] = busy / n;
  state.counters["slowdown"] = busy / quiet;
  state.SetLabel(state.range(0) == 0 ? "kiln's wait policy" : "libgomp's default spin");
}
BENCHMARK(BM_MlpTrainUnderContention)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace
