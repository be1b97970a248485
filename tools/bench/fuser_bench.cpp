// Fuser benchmarks (issue 5): fused kernels against eager kiln and against the memory
// bandwidth measured in the same run (eager_bench.cpp's table prints every bytes/s figure over
// the 16M triad), and the cost of compiling and finding kernels.
//   BM_FuseGelu16M/{eager,lazy}: GELU (tanh form) written from primitives on 16M float32; bytes
//     counted are the minimum (read x, write y). Target: lazy within 1.25x of the triad.
//   BM_FuseLog16M/{eager,lazy}, BM_FuseSin16M/{eager,lazy}: log(x) * 2 (x = |randn| + 0.001) and
//     sin(x) * 2 (x = randn * 10) on 16M float32: transcendentals inlined as vector polynomials
//     (lib/math/primitives.h) rather than libm calls. Bytes: read x, write y.
//   BM_FuseTanhF64_4M/{eager,lazy}, BM_FuseSinF64_4M/{eager,lazy}: tanh(x) * 2 and sin(x) + 1
//     (x = randn * 10) on 4M float64: the float64 polynomials of lib/math/primitives.h
//     (tanh_f64, sin_f64). Bytes: read x, write y.
//   BM_FuseLstmCellPointwise/{eager,lazy}: the pointwise part of an LSTM cell (batch 64, hidden
//     1500) after the gate GEMM: one kernel in lazy mode.
//   BM_FuseCompileCold: generating and compiling a new 10-op kernel (each iteration a kernel of
//     another structure). Target: median under 10 ms.
//   BM_FuseEval100Cached: recording a 100-op elementwise chain on a [16] tensor and evaluating it
//     with its kernels already compiled (graph, passes, fusion, key, cache hit, run).
//   BM_FuseHashAndHit100: the part of that a repeated trace pays before running (target < 20 us):
//     the pending chain's nodes collected and hashed, and its plan found in the memory cache.
//   BM_FuseEval100Recorded: the chain's evaluation alone (recording untimed): collect, key, memory
//     hit, run. Target 15 us.
//   BM_FuseNewProcess: a new process's first evaluation of a 10-op kernel, with an empty kernel
//     cache (cold, target 8 ms) and with the kernel on disk (warm, target: within 0.3 ms of the
//     steady-state call); wall and process CPU time.
//   BM_FuseMillionOps: a million recorded elementwise ops under the default KILN_MAX_PENDING,
//     end to end. Target 2 s.
//
// Reduction fusion (softmax, layer_norm and cross entropy written from primitives, one kernel each
// in lazy mode), against the memory floor measured in the same run:
//   BM_FuseMemoryFloor4096/{copy,read}: a plain OpenMP loop over 4096 x 4096 float32 in kiln's
//     own buffers: y[i] = x[i] * 1.0001f (read x, write y: 2 x 64 MiB) and the sum of x (read
//     only: 64 MiB). They run first (registration order) and keep their fastest pass (best_ms);
//     later benchmarks print x_floor = their time per iteration / that floor.
//   BM_FuseSoftmax4096/{eager,lazy}, BM_FuseLayerNorm4096/{eager,lazy}: bytes = read x + write y
//     (weights of 16 KiB not counted), floor = copy.
//   BM_FuseCrossEntropy4096/{eager,lazy}: (logsumexp(x, 1) - (x * onehot).sum(1)).mean() with the
//     one-hot matrix made inside the expression from the class indices (eq of a [1, C] arange
//     and the [B, 1] targets): nothing but x is [B, C], so bytes = read x once, floor = read.
//     (A one-hot float matrix as an input would double the traffic and hide half the work.)
//   vs_eager on lazy rows: lazy time / the eager row's time measured just before.
//   BM_GemmAlone, BM_FuseLinearBias/{eager,lazy}: y = m.matmul(x) + b, m and x 1000 x 1000,
//     b [1000] (a bias per column, as a linear layer adds it), 50 iterations; vs_gemm = time /
//     the bare GEMM's time. Target (lazy): within 1.05x of the GEMM alone.
//   BM_LstmGemmsOnly/{forward,backward}, BM_LstmCellStep/{eager,lazy},
//   BM_LstmCellStepBackward/{eager,lazy}: an LSTM cell step from primitives, batch 64, input and
//     hidden 1500: gates = x.matmul(Wx) + h.matmul(Wh) + b ([64, 6000]), chunk(4), sigmoid and
//     tanh gates, c' = f*c + i*g, h' = o*tanh(c'); the backward step makes the weights require
//     grad and runs loss = h'.sum() + c'.sum(), backward(). GemmsOnly runs the same GEMMs alone
//     (2 forward; 2 more for the weight gradients), and the step rows print
//     non_gemm = (step - GEMMs) / step. BM_LstmCellStepBackwardTraced: the same step as a
//     differentiable jit::trace of the forward (issue 6), called and differentiated each iteration.
//   BM_FuseLayerNormBackward4096, BM_FuseSoftmaxXentBackward4096: see "backward row models".
//   BM_Math16M/<op>_<f32|f64>_{lazy,eager}: each math function on 16M values, against the copy
//     floor (x_floor); eager rows also against the lazy row (x_lazy).
#include <benchmark/benchmark.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "exec/lazy_eval.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/tensor_impl.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
using kiln::bench::set_bytes;
using Clock = std::chrono::steady_clock;

constexpr int64_t k16M = 16 * 1024 * 1024;

Tensor gelu_tanh_from_primitives(const Tensor& x) {
  return x * 0.5 * (kiln::tanh((x + x * x * x * 0.044715) * 0.7978845608028654) + 1.0);
}

void BM_FuseGelu16M(benchmark::State& state, bool lazy) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({k16M});
  }
  kiln::LazyGuard mode(lazy);
  // One call first: it compiles the kernel and warms the allocator's block cache (fresh 64 MiB
  // buffers cost page faults that a steady-state loop never pays).
  benchmark::DoNotOptimize(gelu_tanh_from_primitives(x).raw_data_ptr());
  for (auto _ : state) {
    Tensor y = gelu_tanh_from_primitives(x);
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  set_bytes(state, 2.0 * k16M * 4);
}
BENCHMARK_CAPTURE(BM_FuseGelu16M, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseGelu16M, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_FuseUnary16M(benchmark::State& state, bool lazy, Tensor (*op)(const Tensor&),
                     bool positive) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = positive ? kiln::abs(kiln::randn({k16M})) + 0.001 : kiln::randn({k16M}) * 10.0;
  }
  kiln::LazyGuard mode(lazy);
  benchmark::DoNotOptimize((op(x) * 2.0).raw_data_ptr());  // compile, warm the allocator
  for (auto _ : state) {
    Tensor y = op(x) * 2.0;
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  set_bytes(state, 2.0 * k16M * 4);
}
void BM_FuseLog16M(benchmark::State& state, bool lazy) {
  BM_FuseUnary16M(
      state, lazy, [](const Tensor& t) { return kiln::log(t); }, true);
}
void BM_FuseSin16M(benchmark::State& state, bool lazy) {
  BM_FuseUnary16M(
      state, lazy, [](const Tensor& t) { return kiln::sin(t); }, false);
}
BENCHMARK_CAPTURE(BM_FuseLog16M, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseLog16M, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseSin16M, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseSin16M, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();

constexpr int64_t k4M = 4 * 1024 * 1024;

void BM_FuseUnaryF64_4M(benchmark::State& state, bool lazy, Tensor (*f)(const Tensor&)) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({k4M}).to(kiln::kFloat64) * 10.0;
  }
  kiln::LazyGuard mode(lazy);
  benchmark::DoNotOptimize(f(x).raw_data_ptr());  // compile, warm the allocator
  for (auto _ : state) {
    Tensor y = f(x);
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  set_bytes(state, 2.0 * k4M * 8);
}
void BM_FuseTanhF64_4M(benchmark::State& state, bool lazy) {
  BM_FuseUnaryF64_4M(state, lazy, [](const Tensor& t) { return kiln::tanh(t) * 2.0; });
}
void BM_FuseSinF64_4M(benchmark::State& state, bool lazy) {
  BM_FuseUnaryF64_4M(state, lazy, [](const Tensor& t) { return kiln::sin(t) + 1.0; });
}
BENCHMARK_CAPTURE(BM_FuseTanhF64_4M, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseTanhF64_4M, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseSinF64_4M, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseSinF64_4M, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_FuseLstmCellPointwise(benchmark::State& state, bool lazy) {
  const int64_t batch = 64, hidden = 1500;
  Tensor gates, c;
  {
    kiln::LazyGuard eager(false);
    gates = kiln::randn({batch, 4 * hidden});
    c = kiln::randn({batch, hidden});
  }
  kiln::LazyGuard mode(lazy);
  for (auto _ : state) {
    std::vector<Tensor> g = gates.chunk(4, 1);
    Tensor c2 = kiln::sigmoid(g[1]) * c + kiln::sigmoid(g[0]) * kiln::tanh(g[2]);
    Tensor h2 = kiln::sigmoid(g[3]) * kiln::tanh(c2);
    kiln::eval(h2, c2);
    benchmark::DoNotOptimize(h2.raw_data_ptr());
  }
  // Read the gates and c, write h and c.
  set_bytes(state, (4.0 + 1 + 2) * batch * hidden * 4);
}
BENCHMARK_CAPTURE(BM_FuseLstmCellPointwise, eager, false)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseLstmCellPointwise, lazy, true)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_FuseCompileCold(benchmark::State& state) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({64});
  }
  kiln::LazyGuard lazy(true);
  static int64_t counter = 0;  // a structure no earlier iteration (or run in this process) used
  double compile_s = 0;
  int64_t kernels = 0;
  for (auto _ : state) {
    int64_t code = counter++;
    Tensor y = x;
    for (int i = 0; i < 10; ++i) {
      switch (code % 3) {
        case 0:
          y = y * 1.5;
          break;
        case 1:
          y = kiln::tanh(y);
          break;
        default:
          y = y + x;
          break;
      }
      code /= 3;
    }
    const kiln::jit::Stats before = kiln::jit::stats();
    kiln::eval(y);
    const kiln::jit::Stats after = kiln::jit::stats();
    compile_s += after.compile_seconds - before.compile_seconds;
    kernels += after.kernels_compiled - before.kernels_compiled;
  }
  state.counters["kernels"] = static_cast<double>(kernels);
  if (kernels > 0)
    state.counters["ms_per_compile"] = compile_s * 1e3 / static_cast<double>(kernels);
  state.counters["vs_target"] = kernels > 0 ? compile_s * 1e3 / kernels / 10.0 : 0;
}
BENCHMARK(BM_FuseCompileCold)->Unit(benchmark::kMillisecond)->Iterations(40);

// A 100-op elementwise chain on a [16] tensor, recorded in the current mode.
Tensor chain100(const Tensor& x) {
  Tensor y = x;
  for (int i = 0; i < 100; ++i) y = i % 2 ? y * 0.999 : y + 0.001;
  return y;
}
Tensor small_input() {
  kiln::LazyGuard eager(false);
  return kiln::randn({16});
}

void BM_FuseEval100Cached(benchmark::State& state) {
  const Tensor x = small_input();
  kiln::LazyGuard lazy(true);
  auto chain = [&] { return chain100(x); };
  kiln::eval(chain());  // compiles the kernels once
  const int64_t compiled = kiln::jit::stats().kernels_compiled;
  for (auto _ : state) {
    Tensor y = chain();
    kiln::eval(y);
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  if (kiln::jit::stats().kernels_compiled != compiled)
    state.SkipWithError("a cached evaluation compiled a kernel");
}
BENCHMARK(BM_FuseEval100Cached)->Unit(benchmark::kMicrosecond);

// What a repeated trace costs before anything runs: collecting the pending nodes of a 100-op
// chain, hashing them and finding the optimized plan (kernels included) in the memory cache.
void BM_FuseHashAndHit100(benchmark::State& state) {
  const Tensor x = small_input();
  kiln::LazyGuard lazy(true);
  kiln::eval(chain100(x));  // plans and compiles once
  Tensor pending = chain100(x);
  const std::vector<kiln::detail::LazyRef> requests{pending.impl()->storage->lazy};
  for (auto _ : state) {
    const bool hit = kiln::jit::plan_cached(requests);
    if (!hit) state.SkipWithError("the chain's plan is not cached");
    benchmark::DoNotOptimize(hit);
  }
}
BENCHMARK(BM_FuseHashAndHit100)->Unit(benchmark::kMicrosecond);

// The memory hit end to end without the recording: a recorded 100-op chain evaluated (collect,
// key, plan found in the memory cache with its kernel, run) and read. Recording is not timed
// (the timer is paused around it). Target: 15 us.
void BM_FuseEval100Recorded(benchmark::State& state) {
  const Tensor x = small_input();
  kiln::LazyGuard lazy(true);
  kiln::eval(chain100(x));  // plans and compiles once
  const int64_t compiled = kiln::jit::stats().kernels_compiled;
  const int64_t hits = kiln::jit::stats().plan_cache_hits;
  double seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Tensor y = chain100(x);
    state.ResumeTiming();
    const Clock::time_point start = Clock::now();
    kiln::eval(y);
    benchmark::DoNotOptimize(y.raw_data_ptr());
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  if (kiln::jit::stats().kernels_compiled != compiled ||
      kiln::jit::stats().plan_cache_hits - hits != static_cast<int64_t>(state.iterations()))
    state.SkipWithError("an evaluation missed the plan cache");
  const double us = seconds * 1e6 / static_cast<double>(state.iterations());
  state.counters["us_per_eval"] = us;
  state.counters["vs_target"] = us / 15.0;
}
BENCHMARK(BM_FuseEval100Recorded)->Unit(benchmark::kMicrosecond);

// ------------------------------------------------------------------------- process start
// A 10-op kernel of a fixed structure (three tanh, four multiplications by a number, three adds)
// on [64] float32, recorded and evaluated.
// `swapped`: the multiplications and adds trade places (the same ops, another kernel).
Tensor ten_op_kernel(const Tensor& x, bool swapped = false) {
  Tensor y = x;
  for (int i = 0; i < 10; ++i) {
    const int kind = i % 3 == 0 ? 0 : (i % 3 == 1) != swapped ? 1 : 2;
    y = kind == 0 ? kiln::tanh(y) : kind == 1 ? y * 1.5 : y + x;
  }
  return y;
}

// CPU time of the whole process: steadier than wall time on a loaded machine.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Child mode of kiln_bench (`kiln_bench --first-call`, see main): in a fresh process, times the
// first evaluation of ten_op_kernel (everything kiln starts on first use: LLVM, the disk cache,
// the compile or the load) and then its steady state (median of 200 calls), and prints
// then the first evaluation of the swapped kernel (a second kernel in a process that has made
// one), and prints "first_ms steady_ms compile_ms kernels_compiled first_cpu_ms second_cpu_ms".
// The input is made before the clock starts.
int first_call_main() {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({64});
  }
  kiln::LazyGuard lazy(true);
  const double cpu_start = process_cpu_seconds();
  const Clock::time_point start = Clock::now();
  Tensor y = ten_op_kernel(x);
  kiln::eval(y);
  const double first = std::chrono::duration<double>(Clock::now() - start).count();
  const double first_cpu = process_cpu_seconds() - cpu_start;
  std::vector<double> steady;
  for (int i = 0; i < 200; ++i) {
    const Clock::time_point t = Clock::now();
    Tensor z = ten_op_kernel(x);
    kiln::eval(z);
    steady.push_back(std::chrono::duration<double>(Clock::now() - t).count());
  }
  std::nth_element(steady.begin(), steady.begin() + 100, steady.end());
  const double second_start = process_cpu_seconds();
  Tensor w = ten_op_kernel(x, true);
  kiln::eval(w);
  const double second_cpu = process_cpu_seconds() - second_start;
  const kiln::jit::Stats s = kiln::jit::stats();
  std::printf("%.6f %.6f %.6f %lld %.6f %.6f\n", first * 1e3, steady[100] * 1e3,
              s.compile_seconds * 1e3, static_cast<long long>(s.kernels_compiled), first_cpu * 1e3,
              second_cpu * 1e3);
  return 0;
}

// One child run (see first_call_main) with the kernel cache in `dir`: false on failure.
struct FirstCall {
  double first_ms = 0, steady_ms = 0, compile_ms = 0, first_cpu_ms = 0, second_cpu_ms = 0;
  long long compiled = 0;
};
bool run_first_call(const std::string& dir, FirstCall* r) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return false;
  const std::string cmd = "KILN_CACHE=1 KILN_CACHE_DIR='" + dir + "' '" +
                          std::string(exe, static_cast<size_t>(n)) + "' --first-call";
  FILE* out = popen(cmd.c_str(), "r");
  if (!out) return false;
  const int got = std::fscanf(out, "%lf %lf %lf %lld %lf %lf", &r->first_ms, &r->steady_ms,
                              &r->compile_ms, &r->compiled, &r->first_cpu_ms, &r->second_cpu_ms);
  return pclose(out) == 0 && got == 6;
}

// A new process compiling ten_op_kernel with an empty kernel cache (cold), then another finding
// it on disk (warm); each then evaluates the swapped kernel too (compiled, then loaded). Targets:
// cold first call <= 8 ms; warm first call within 0.3 ms of the steady-state call. Medians over the
// iterations.
void BM_FuseNewProcess(benchmark::State& state) {
  std::vector<double> cold, cold_cpu, warm, warm_cpu, steady, compile, cold_second, warm_second;
  int64_t run = 0;
  for (auto _ : state) {
    const std::string dir =
        "/tmp/kiln_bench_start_" + std::to_string(::getpid()) + "_" + std::to_string(run++);
    FirstCall c, w;
    const bool ok =
        run_first_call(dir, &c) && c.compiled == 2 && run_first_call(dir, &w) && w.compiled == 0;
    std::system(("rm -rf '" + dir + "'").c_str());
    if (!ok) {
      state.SkipWithError("a child process failed (or compiled where it should not)");
      return;
    }
    cold.push_back(c.first_ms);
    cold_cpu.push_back(c.first_cpu_ms);
    compile.push_back(c.compile_ms);
    warm.push_back(w.first_ms);
    warm_cpu.push_back(w.first_cpu_ms);
    steady.push_back(w.steady_ms);
    cold_second.push_back(c.second_cpu_ms);
    warm_second.push_back(w.second_cpu_ms);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  state.counters["cold_first_ms"] = median(cold);
  state.counters["cold_first_cpu_ms"] = median(cold_cpu);
  state.counters["cold_compile_ms"] = median(compile);
  state.counters["warm_first_ms"] = median(warm);
  state.counters["warm_first_cpu_ms"] = median(warm_cpu);
  state.counters["steady_ms"] = median(steady);
  // The second kernel of a process that has compiled (cold) or loaded (warm) one: what the first
  // call pays for kiln and LLVM starting is the difference.
  state.counters["cold_second_cpu_ms"] = median(cold_second);
  state.counters["warm_second_cpu_ms"] = median(warm_second);
  state.counters["cold_vs_target"] = median(cold) / 8.0;
  state.counters["warm_vs_target"] = (median(warm) - median(steady)) / 0.3;
}
BENCHMARK(BM_FuseNewProcess)->Unit(benchmark::kMillisecond)->Iterations(11)->UseRealTime();

// A million recorded elementwise ops (x = x * a + b on a [1] float64 tensor, 500k times) under the
// default KILN_MAX_PENDING, each flush evaluating what has been recorded so far, then the result
// read. Target: 2 s end to end.
void BM_FuseMillionOps(benchmark::State& state) {
  const Tensor x0 = [] {
    kiln::LazyGuard eager(false);
    return kiln::full({1}, 0.75, kiln::kFloat64);
  }();
  kiln::LazyGuard lazy(true);
  const kiln::jit::Stats before = kiln::jit::stats();
  double seconds = 0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    Tensor x = x0;
    for (int i = 0; i < 500000; ++i) x = x * 1.000001 + 1e-6;
    benchmark::DoNotOptimize(x.item<double>());
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const kiln::jit::Stats after = kiln::jit::stats();
  const double runs = static_cast<double>(state.iterations());
  state.counters["s_per_million"] = seconds / runs;
  state.counters["vs_target"] = seconds / runs / 2.0;
  state.counters["evaluations"] =
      static_cast<double>(after.evaluations - before.evaluations) / runs;
  state.counters["kernels_compiled"] =
      static_cast<double>(after.kernels_compiled - before.kernels_compiled);
  state.counters["compile_s"] = after.compile_seconds - before.compile_seconds;
  state.counters["plan_cache_hits"] =
      static_cast<double>(after.plan_cache_hits - before.plan_cache_hits) / runs;
}
BENCHMARK(BM_FuseMillionOps)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

// ------------------------------------------------------------------------- reduction fusion
// Times per iteration measured earlier in this run, by key, for the ratios of later benchmarks.
std::map<std::string, double>& references() {
  static std::map<std::string, double> refs;
  return refs;
}
// Sets counter `name` to value / the reference `key`, when that reference was measured.
void set_ratio(benchmark::State& state, const char* name, double value, const std::string& key) {
  auto it = references().find(key);
  if (it != references().end() && it->second > 0) state.counters[name] = value / it->second;
}
double seconds_per_iteration(Clock::time_point start, const benchmark::State& state) {
  return std::chrono::duration<double>(Clock::now() - start).count() /
         static_cast<double>(state.iterations());
}

constexpr int64_t kRows = 4096, kCols = 4096, kElems = kRows * kCols;
constexpr double kFloorCopyBytes = 2.0 * kElems * 4, kFloorReadBytes = 1.0 * kElems * 4;

// The 4096 x 4096 inputs, made once (eagerly) and shared by the benchmarks below.
struct RowInputs {
  Tensor x, w, b, target, classes;
  RowInputs() {
    kiln::LazyGuard eager(false);
    kiln::manual_seed(0);
    x = kiln::randn({kRows, kCols});
    w = kiln::randn({kCols});
    b = kiln::randn({kCols});
    target = kiln::randint(kCols, {kRows, 1});
    classes = kiln::arange(kCols).reshape({1, kCols});
  }
};
const RowInputs& row_inputs() {
  static const RowInputs in;
  return in;
}

void BM_FuseMemoryFloor4096(benchmark::State& state, bool read_only) {
  const RowInputs& in = row_inputs();
  Tensor y;
  {
    kiln::LazyGuard eager(false);
    y = kiln::empty({kRows, kCols});
  }
  const float* px = in.x.data_ptr<float>();
  float* py = y.data_ptr<float>();
  double sum = 0;
  auto pass = [&] {
    if (!read_only) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < kElems; ++i) py[i] = px[i] * 1.0001f;
      return;
    }
    // Independent lanes so that the adds vectorize and keep up with memory.
    constexpr int64_t kLanes = 16;
    double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (int64_t r = 0; r < kRows; ++r) {
      const float* row = px + r * kCols;
      float lanes[kLanes] = {};
      for (int64_t j = 0; j < kCols; j += kLanes)
        for (int64_t k = 0; k < kLanes; ++k) lanes[k] += row[j + k];
      float t = 0;
      for (int64_t k = 0; k < kLanes; ++k) t += lanes[k];
      s += t;
    }
    sum += s;
  };
  pass();  // first touch of y
  double best = 1e30;
  for (auto _ : state) {
    const auto start = Clock::now();
    pass();
    benchmark::DoNotOptimize(py);
    benchmark::DoNotOptimize(sum);
    benchmark::ClobberMemory();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  // The floor is the fastest pass: a pass slowed by another process would flatter the ratios.
  references()[read_only ? "floor/read" : "floor/copy"] = best;
  state.counters["best_ms"] = best * 1e3;
  set_bytes(state, read_only ? kFloorReadBytes : kFloorCopyBytes);
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK_CAPTURE(BM_FuseMemoryFloor4096, copy, false)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseMemoryFloor4096, read, true)->Unit(benchmark::kMillisecond)->UseRealTime();

// Each math function on 16M float32 (float32 computed through float64 for the inverse
// trigonometric, the hyperbolic and the special functions) or float64 values: x = randn / 2
// (1 + |x| for acosh, 20 randn for exp, 10 randn for sin, tanh of it for erfinv, 8 |x| + 0.01 for
// lgamma and digamma), lazy (one kernel), then eager (lib/math/lanes.h's
// blocks). x_floor = time / the copy floor of 16M float32 measured in this run (float64 moves
// twice the bytes); eager rows: x_lazy = time / the lazy row's.
void BM_Math16M(benchmark::State& state, const std::string& name, kiln::DType dtype, bool lazy) {
  using Unary = Tensor (*)(const Tensor&);
  static const std::map<std::string, Unary> ops = {
      {"exp", kiln::exp},         {"log", kiln::log},        {"tanh", kiln::tanh},
      {"erf", kiln::erf},         {"sin", kiln::sin},        {"tan", kiln::tan},
      {"atan", kiln::atan},       {"asin", kiln::asin},      {"sinh", kiln::sinh},
      {"cosh", kiln::cosh},       {"asinh", kiln::asinh},    {"acosh", kiln::acosh},
      {"atanh", kiln::atanh},     {"exp2", kiln::exp2},      {"log2", kiln::log2},
      {"sigmoid", kiln::sigmoid}, {"erfc", kiln::erfc},      {"erfinv", kiln::erfinv},
      {"lgamma", kiln::lgamma},   {"digamma", kiln::digamma}};
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({k16M}) * 0.5;
    if (name == "acosh" || name == "log" || name == "log2") x = kiln::abs(x) + 1.0;
    if (name == "exp" || name == "sin") x = x * 20.0;
    if (name == "erfinv") x = kiln::tanh(x);
    if (name == "lgamma" || name == "digamma") x = kiln::abs(x) * 8.0 + 0.01;
    x = x.to(dtype);
  }
  const Unary op = ops.at(name);
  kiln::LazyGuard mode(lazy);
  benchmark::DoNotOptimize(op(x).raw_data_ptr());  // compile, warm the allocator
  const auto start = Clock::now();
  for (auto _ : state) {
    Tensor y = op(x);
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  const double t = seconds_per_iteration(start, state);
  set_bytes(state, kFloorCopyBytes * (dtype == kiln::kFloat64 ? 2 : 1));
  set_ratio(state, "x_floor", t, "floor/copy");
  const std::string key = "math/" + name + "/" + kiln::dtype_name(dtype);
  if (lazy)
    references()[key] = t;
  else
    set_ratio(state, "x_lazy", t, key);
}
#define KILN_MATH_BENCH(op, dtype, type)                                      \
  BENCHMARK_CAPTURE(BM_Math16M, op##_##type##_lazy, #op, kiln::dtype, true)   \
      ->Unit(benchmark::kMillisecond)                                         \
      ->UseRealTime();                                                        \
  BENCHMARK_CAPTURE(BM_Math16M, op##_##type##_eager, #op, kiln::dtype, false) \
      ->Unit(benchmark::kMillisecond)                                         \
      ->UseRealTime();
KILN_MATH_BENCH(exp, kFloat32, f32)
KILN_MATH_BENCH(log, kFloat32, f32)
KILN_MATH_BENCH(tanh, kFloat32, f32)
KILN_MATH_BENCH(sigmoid, kFloat32, f32)
KILN_MATH_BENCH(erf, kFloat32, f32)
KILN_MATH_BENCH(sin, kFloat32, f32)
KILN_MATH_BENCH(tan, kFloat32, f32)
KILN_MATH_BENCH(atan, kFloat32, f32)
KILN_MATH_BENCH(asin, kFloat32, f32)
KILN_MATH_BENCH(sinh, kFloat32, f32)
KILN_MATH_BENCH(cosh, kFloat32, f32)
KILN_MATH_BENCH(acosh, kFloat32, f32)
KILN_MATH_BENCH(atanh, kFloat32, f32)
KILN_MATH_BENCH(exp2, kFloat32, f32)
KILN_MATH_BENCH(erfc, kFloat32, f32)
KILN_MATH_BENCH(erfinv, kFloat32, f32)
KILN_MATH_BENCH(lgamma, kFloat32, f32)
KILN_MATH_BENCH(digamma, kFloat32, f32)
KILN_MATH_BENCH(log2, kFloat32, f32)
KILN_MATH_BENCH(exp, kFloat64, f64)
KILN_MATH_BENCH(log, kFloat64, f64)
KILN_MATH_BENCH(sin, kFloat64, f64)
KILN_MATH_BENCH(tanh, kFloat64, f64)
KILN_MATH_BENCH(atan, kFloat64, f64)
KILN_MATH_BENCH(asinh, kFloat64, f64)
#undef KILN_MATH_BENCH

Tensor softmax_from_primitives(const Tensor& x) {
  Tensor m = x.amax({-1}, true);
  Tensor e = (x - m).exp();
  return e / e.sum({-1}, true);
}

Tensor layer_norm_from_primitives(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor mean = x.mean({-1}, true);
  Tensor xc = x - mean;
  Tensor var = (xc * xc).mean({-1}, true);
  return xc / kiln::sqrt(var + 1e-5) * w + b;
}

// The one-hot matrix is eq(classes [1, C], target [B, 1]): made inside the expression.
Tensor cross_entropy_from_primitives(const Tensor& x, const Tensor& target, const Tensor& classes) {
  Tensor onehot = kiln::eq(classes, target).to(kiln::kFloat32);
  return (kiln::logsumexp(x, {1}) - (x * onehot).sum({1})).mean();
}

enum class RowModel { Softmax, LayerNorm, CrossEntropy };

// One row model, eager or lazy; its x_floor is against the copy floor (softmax, layer_norm) or
// the read floor (cross entropy, which writes one number).
void row_model(benchmark::State& state, RowModel model, bool lazy, const std::string& key) {
  const RowInputs& in = row_inputs();
  kiln::LazyGuard mode(lazy);
  auto run = [&] {
    switch (model) {
      case RowModel::Softmax:
        return softmax_from_primitives(in.x);
      case RowModel::LayerNorm:
        return layer_norm_from_primitives(in.x, in.w, in.b);
      default:
        return cross_entropy_from_primitives(in.x, in.target, in.classes);
    }
  };
  // One call first: it compiles the kernels and warms the allocator's block cache.
  benchmark::DoNotOptimize(run().raw_data_ptr());
  const auto start = Clock::now();
  for (auto _ : state) {
    Tensor y = run();
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  const double t = seconds_per_iteration(start, state);
  const bool read_only = model == RowModel::CrossEntropy;
  const double bytes = read_only ? kFloorReadBytes : kFloorCopyBytes;
  set_bytes(state, bytes);
  set_ratio(state, "x_floor", t, read_only ? "floor/read" : "floor/copy");
  if (lazy)
    set_ratio(state, "vs_eager", t, key + "/eager");
  else
    references()[key + "/eager"] = t;
}
void BM_FuseSoftmax4096(benchmark::State& state, bool lazy) {
  row_model(state, RowModel::Softmax, lazy, "softmax");
}
void BM_FuseLayerNorm4096(benchmark::State& state, bool lazy) {
  row_model(state, RowModel::LayerNorm, lazy, "layer_norm");
}
void BM_FuseCrossEntropy4096(benchmark::State& state, bool lazy) {
  row_model(state, RowModel::CrossEntropy, lazy, "cross_entropy");
}
BENCHMARK_CAPTURE(BM_FuseSoftmax4096, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseSoftmax4096, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseLayerNorm4096, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseLayerNorm4096, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseCrossEntropy4096, eager, false)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseCrossEntropy4096, lazy, true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ------------------------------------------------------------ backward row models (issue 6)
// Gradients of a 4096 x 4096 row model by autograd from an upstream gradient, the forward computed
// while the timer is paused (eagerly, evaluated in lazy mode, or the traced forward's replay), so
// that only the backward is timed.
//   BM_FuseLayerNormBackward4096/{eager,lazy,traced}: kiln::layer_norm(x, {4096}, w, b) and the
//     gradients of x, w and b from g (forward_ms: the forward, timed apart). Lazy and traced run
//     one kernel: the input gradient and the weight's and bias's sums over the batch (column
//     exits). Bytes: read x and g, write the input gradient (3 x 64 MiB); floor = 1.5 x the copy
//     floor.
//   BM_FuseSoftmaxXentBackward4096/{eager,lazy}: cross entropy from primitives (logsumexp minus
//     the target's logit, the one-hot made in the expression, mean over the batch) and the
//     gradient of its logits, softmax(x) - onehot over B: one rows kernel in lazy mode. Bytes:
//     read x, write the gradient; floor = copy.
//   BM_FuseCrossEntropyOp4096/{eager,lazy,traced}: kiln::cross_entropy(x, target) (mean) and the
//     gradient of its logits, forward and backward timed together (forward_ms, backward_ms: each
//     apart). The forward reads x (logsumexp and the target's logit), the backward reads x and
//     writes the gradient: floor = the read floor + the copy floor.
enum class BackwardMode { Eager, Lazy, Traced };

void layer_norm_backward(benchmark::State& state, BackwardMode mode) {
  const RowInputs& in = row_inputs();
  Tensor x, w, b, g;
  {
    kiln::LazyGuard eager(false);
    x = in.x.clone().requires_grad_(true);
    w = in.w.clone().requires_grad_(true);
    b = in.b.clone().requires_grad_(true);
    g = kiln::randn({kRows, kCols});
  }
  kiln::LazyGuard lazy(mode != BackwardMode::Eager);
  auto forward = [&](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{kiln::layer_norm(a[0], {kCols}, w, b, 1e-5)};
  };
  kiln::jit::Function traced;
  if (mode == BackwardMode::Traced) traced = kiln::jit::trace(forward, {x});
  double seconds = 0, forward_seconds = 0;
  auto run = [&](bool timed) {
    if (timed) state.PauseTiming();
    const auto forward_start = Clock::now();
    Tensor y = mode == BackwardMode::Traced ? traced({x})[0] : forward({x})[0];
    kiln::eval(y);
    forward_seconds += std::chrono::duration<double>(Clock::now() - forward_start).count();
    if (timed) state.ResumeTiming();
    const auto start = Clock::now();
    std::vector<Tensor> grads = kiln::autograd::grad({y}, {x, w, b}, {g});
    kiln::eval(grads);
    for (const Tensor& t : grads) benchmark::DoNotOptimize(t.raw_data_ptr());
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  };
  run(false);  // compiles, warms the allocator
  seconds = forward_seconds = 0;
  for (auto _ : state) run(true);
  const double t = seconds / static_cast<double>(state.iterations());
  set_bytes(state, 1.5 * kFloorCopyBytes);
  auto floor = references().find("floor/copy");
  if (floor != references().end()) state.counters["x_floor"] = t / (1.5 * floor->second);
  if (mode == BackwardMode::Eager)
    references()["layer_norm_backward/eager"] = t;
  else
    set_ratio(state, "vs_eager", t, "layer_norm_backward/eager");
  state.counters["backward_ms"] = t * 1e3;
  // The forward, untimed by the benchmark: kiln::layer_norm with what its backward saves.
  state.counters["forward_ms"] = forward_seconds / static_cast<double>(state.iterations()) * 1e3;
}
void BM_FuseLayerNormBackward4096(benchmark::State& state, BackwardMode mode) {
  layer_norm_backward(state, mode);
}
BENCHMARK_CAPTURE(BM_FuseLayerNormBackward4096, eager, BackwardMode::Eager)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseLayerNormBackward4096, lazy, BackwardMode::Lazy)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseLayerNormBackward4096, traced, BackwardMode::Traced)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_FuseCrossEntropyOp4096(benchmark::State& state, BackwardMode mode) {
  const RowInputs& in = row_inputs();
  Tensor x, target;
  {
    kiln::LazyGuard eager(false);
    x = in.x.clone().requires_grad_(true);
    target = in.target.view({kRows});
  }
  kiln::LazyGuard lazy(mode != BackwardMode::Eager);
  auto step = [&](const std::vector<Tensor>& a) {
    Tensor loss = kiln::cross_entropy(a[0], target);
    return std::vector<Tensor>{loss, kiln::autograd::grad({loss}, {a[0]})[0]};
  };
  kiln::jit::Function traced;
  if (mode == BackwardMode::Traced) traced = kiln::jit::trace(step, {x});
  double forward_seconds = 0, backward_seconds = 0;
  auto run = [&] {
    if (mode == BackwardMode::Traced) {
      std::vector<Tensor> out = traced({x});
      kiln::eval(out);
      benchmark::DoNotOptimize(out[1].raw_data_ptr());
      return;
    }
    const auto start = Clock::now();
    Tensor loss = kiln::cross_entropy(x, target);
    kiln::eval(loss);
    const auto forward_done = Clock::now();
    std::vector<Tensor> grads = kiln::autograd::grad({loss}, {x});
    kiln::eval(grads);
    benchmark::DoNotOptimize(grads[0].raw_data_ptr());
    forward_seconds += std::chrono::duration<double>(forward_done - start).count();
    backward_seconds += std::chrono::duration<double>(Clock::now() - forward_done).count();
  };
  run();  // compiles, warms the allocator
  forward_seconds = backward_seconds = 0;
  const auto start = Clock::now();
  for (auto _ : state) run();
  const double t = seconds_per_iteration(start, state);
  set_bytes(state, kFloorReadBytes + kFloorCopyBytes);
  auto read = references().find("floor/read"), copy = references().find("floor/copy");
  if (read != references().end() && copy != references().end())
    state.counters["x_floor"] = t / (read->second + copy->second);
  if (mode == BackwardMode::Eager)
    references()["cross_entropy_op/eager"] = t;
  else
    set_ratio(state, "vs_eager", t, "cross_entropy_op/eager");
  if (mode == BackwardMode::Traced) return;
  const double n = static_cast<double>(state.iterations());
  state.counters["forward_ms"] = forward_seconds / n * 1e3;
  state.counters["backward_ms"] = backward_seconds / n * 1e3;
}
BENCHMARK_CAPTURE(BM_FuseCrossEntropyOp4096, eager, BackwardMode::Eager)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseCrossEntropyOp4096, lazy, BackwardMode::Lazy)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseCrossEntropyOp4096, traced, BackwardMode::Traced)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_FuseSoftmaxXentBackward4096(benchmark::State& state, BackwardMode mode) {
  const RowInputs& in = row_inputs();
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = in.x.clone().requires_grad_(true);
  }
  kiln::LazyGuard lazy(mode != BackwardMode::Eager);
  double seconds = 0;
  auto run = [&](bool timed) {
    if (timed) state.PauseTiming();
    Tensor loss = cross_entropy_from_primitives(x, in.target, in.classes);
    kiln::eval(loss);
    if (timed) state.ResumeTiming();
    const auto start = Clock::now();
    std::vector<Tensor> grads = kiln::autograd::grad({loss}, {x});
    kiln::eval(grads);
    benchmark::DoNotOptimize(grads[0].raw_data_ptr());
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  };
  run(false);
  seconds = 0;
  for (auto _ : state) run(true);
  const double t = seconds / static_cast<double>(state.iterations());
  set_bytes(state, kFloorCopyBytes);
  set_ratio(state, "x_floor", t, "floor/copy");
  if (mode == BackwardMode::Eager)
    references()["xent_backward/eager"] = t;
  else
    set_ratio(state, "vs_eager", t, "xent_backward/eager");
  state.counters["backward_ms"] = t * 1e3;
}
BENCHMARK_CAPTURE(BM_FuseSoftmaxXentBackward4096, eager, BackwardMode::Eager)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_FuseSoftmaxXentBackward4096, lazy, BackwardMode::Lazy)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ----------------------------------------------------------------- GEMM with a bias, LSTM step
struct LinearInputs {
  Tensor m, x, b;
  LinearInputs() {
    kiln::LazyGuard eager(false);
    kiln::manual_seed(1);
    m = kiln::randn({1000, 1000});
    x = kiln::randn({1000, 1000});
    b = kiln::randn({1000});
  }
};
const LinearInputs& linear_inputs() {
  static const LinearInputs in;
  return in;
}

void BM_GemmAlone(benchmark::State& state) {
  const LinearInputs& in = linear_inputs();
  kiln::LazyGuard eager(false);
  benchmark::DoNotOptimize(in.m.matmul(in.x).raw_data_ptr());
  const auto start = Clock::now();
  for (auto _ : state) {
    Tensor y = in.m.matmul(in.x);
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  references()["gemm1000"] = seconds_per_iteration(start, state);
  kiln::bench::set_flops(state, 2.0 * 1000 * 1000 * 1000);
}
BENCHMARK(BM_GemmAlone)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(50);

void BM_FuseLinearBias(benchmark::State& state, bool lazy) {
  const LinearInputs& in = linear_inputs();
  kiln::LazyGuard mode(lazy);
  benchmark::DoNotOptimize((in.m.matmul(in.x) + in.b).raw_data_ptr());
  const auto start = Clock::now();
  for (auto _ : state) {
    Tensor y = in.m.matmul(in.x) + in.b;
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  set_ratio(state, "vs_gemm", seconds_per_iteration(start, state), "gemm1000");
  kiln::bench::set_flops(state, 2.0 * 1000 * 1000 * 1000);
}
BENCHMARK_CAPTURE(BM_FuseLinearBias, eager, false)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(50);
BENCHMARK_CAPTURE(BM_FuseLinearBias, lazy, true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(50);

constexpr int64_t kLstmBatch = 64, kLstmInput = 1500, kLstmHidden = 1500;

struct LstmInputs {
  Tensor x, h, c, wx, wh, b, grad_gates;
  LstmInputs() {
    kiln::LazyGuard eager(false);
    kiln::manual_seed(2);
    x = kiln::randn({kLstmBatch, kLstmInput});
    h = kiln::randn({kLstmBatch, kLstmHidden});
    c = kiln::randn({kLstmBatch, kLstmHidden});
    wx = kiln::randn({kLstmInput, 4 * kLstmHidden}) * 0.02;
    wh = kiln::randn({kLstmHidden, 4 * kLstmHidden}) * 0.02;
    b = kiln::randn({4 * kLstmHidden}) * 0.1;
    grad_gates = kiln::randn({kLstmBatch, 4 * kLstmHidden});
  }
};

const LstmInputs& lstm_inputs() {
  static const LstmInputs in;
  return in;
}

struct LstmState {
  Tensor h, c;
};
LstmState lstm_step(const LstmInputs& in, const Tensor& wx, const Tensor& wh, const Tensor& b) {
  Tensor gates = in.x.matmul(wx) + in.h.matmul(wh) + b;
  std::vector<Tensor> g = gates.chunk(4, 1);
  Tensor i = kiln::sigmoid(g[0]), f = kiln::sigmoid(g[1]), cell = kiln::tanh(g[2]),
         o = kiln::sigmoid(g[3]);
  Tensor c2 = f * in.c + i * cell;
  return {o * kiln::tanh(c2), c2};
}

// The step's GEMMs alone, eager: x @ Wx and h @ Wh, and for the backward also the weight
// gradients x^T @ dgates and h^T @ dgates.
void BM_LstmGemmsOnly(benchmark::State& state, bool backward) {
  const LstmInputs& in = lstm_inputs();
  kiln::LazyGuard eager(false);
  auto run = [&] {
    Tensor a = in.x.matmul(in.wx), b = in.h.matmul(in.wh);
    benchmark::DoNotOptimize(a.raw_data_ptr());
    benchmark::DoNotOptimize(b.raw_data_ptr());
    if (backward) {
      Tensor gx = in.x.t().matmul(in.grad_gates), gh = in.h.t().matmul(in.grad_gates);
      benchmark::DoNotOptimize(gx.raw_data_ptr());
      benchmark::DoNotOptimize(gh.raw_data_ptr());
    }
  };
  run();
  const auto start = Clock::now();
  for (auto _ : state) run();
  references()[backward ? "lstm_gemms/backward" : "lstm_gemms/forward"] =
      seconds_per_iteration(start, state);
  const double gemm = 2.0 * kLstmBatch * kLstmInput * 4 * kLstmHidden;
  kiln::bench::set_flops(state, (backward ? 4 : 2) * gemm);
}
BENCHMARK_CAPTURE(BM_LstmGemmsOnly, forward, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_LstmGemmsOnly, backward, true)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LstmCellStep(benchmark::State& state, bool lazy) {
  const LstmInputs& in = lstm_inputs();
  kiln::LazyGuard mode(lazy);
  auto run = [&] {
    LstmState s = lstm_step(in, in.wx, in.wh, in.b);
    kiln::eval(s.h, s.c);
    benchmark::DoNotOptimize(s.h.raw_data_ptr());
    benchmark::DoNotOptimize(s.c.raw_data_ptr());
  };
  run();
  const auto start = Clock::now();
  for (auto _ : state) run();
  const double t = seconds_per_iteration(start, state);
  auto it = references().find("lstm_gemms/forward");
  if (it != references().end()) state.counters["non_gemm"] = (t - it->second) / t;
  if (lazy)
    set_ratio(state, "vs_eager", t, "lstm_step/eager");
  else
    references()["lstm_step/eager"] = t;
}
BENCHMARK_CAPTURE(BM_LstmCellStep, eager, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_LstmCellStep, lazy, true)->Unit(benchmark::kMillisecond)->UseRealTime();

// Times forward + backward of an LSTM step whose h and c `forward` computes from weights that
// require grad, and prints non_gemm against the GEMMs alone; returns the time per step.
template <typename Forward>
double time_lstm_backward(benchmark::State& state, Tensor& wx, Tensor& wh, Tensor& b,
                          const Forward& forward) {
  auto run = [&] {
    for (Tensor* t : {&wx, &wh, &b}) t->mutable_grad() = Tensor();
    LstmState s = forward();
    Tensor loss = s.h.sum() + s.c.sum();
    loss.backward();
    kiln::eval(wx.grad(), wh.grad(), b.grad());
    benchmark::DoNotOptimize(wx.grad().raw_data_ptr());
    benchmark::DoNotOptimize(wh.grad().raw_data_ptr());
    benchmark::DoNotOptimize(b.grad().raw_data_ptr());
  };
  run();
  const auto start = Clock::now();
  for (auto _ : state) run();
  const double t = seconds_per_iteration(start, state);
  auto it = references().find("lstm_gemms/backward");
  if (it != references().end()) state.counters["non_gemm"] = (t - it->second) / t;
  return t;
}

struct LstmGradWeights {
  Tensor wx, wh, b;
  explicit LstmGradWeights(const LstmInputs& in)
      : wx(in.wx.clone().requires_grad_()),
        wh(in.wh.clone().requires_grad_()),
        b(in.b.clone().requires_grad_()) {}
};

void BM_LstmCellStepBackward(benchmark::State& state, bool lazy) {
  const LstmInputs& in = lstm_inputs();
  LstmGradWeights w(in);
  kiln::LazyGuard mode(lazy);
  const double t =
      time_lstm_backward(state, w.wx, w.wh, w.b, [&] { return lstm_step(in, w.wx, w.wh, w.b); });
  if (lazy)
    set_ratio(state, "vs_eager", t, "lstm_step_backward/eager");
  else
    references()["lstm_step_backward/eager"] = t;
}
BENCHMARK_CAPTURE(BM_LstmCellStepBackward, eager, false)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_LstmCellStepBackward, lazy, true)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same step as a differentiable traced function (issue 6): the forward traced once with the
// weights captured, its backward traced from the ops' gradient formulas and fused; each iteration
// calls it and runs loss.backward() through it.
void BM_LstmCellStepBackwardTraced(benchmark::State& state) {
  const LstmInputs& in = lstm_inputs();
  LstmGradWeights w(in);
  kiln::jit::Function step = kiln::jit::trace(
      [&](const std::vector<Tensor>&) {
        LstmState s = lstm_step(in, w.wx, w.wh, w.b);
        return std::vector<Tensor>{s.h, s.c};
      },
      {});
  const double t = time_lstm_backward(state, w.wx, w.wh, w.b, [&] {
    std::vector<Tensor> out = step({});
    return LstmState{out[0], out[1]};
  });
  set_ratio(state, "vs_eager", t, "lstm_step_backward/eager");
}
BENCHMARK(BM_LstmCellStepBackwardTraced)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

// kiln_bench --first-call (main): BM_FuseNewProcess's child.
int kiln_bench_first_call_main() {
  return first_call_main();
}
