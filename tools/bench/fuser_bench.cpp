// Fuser benchmarks (issue 5): fused elementwise kernels against eager kiln and against the memory
// bandwidth measured in the same run (eager_bench.cpp's table prints every bytes/s figure over
// the 16M triad), and the cost of compiling and finding kernels.
//   BM_FuseGelu16M/{eager,lazy}: GELU (tanh form) written from primitives on 16M float32; bytes
//     counted are the minimum (read x, write y). Target: lazy within 1.25x of the triad.
//   BM_FuseLstmCellPointwise/{eager,lazy}: the pointwise part of an LSTM cell (batch 64, hidden
//     1500) after the gate GEMM: one kernel in lazy mode.
//   BM_FuseCompileCold: generating and compiling a new 10-op kernel (each iteration a kernel of
//     another structure). Target: median under 10 ms.
//   BM_FuseEval100Cached: recording a 100-op elementwise chain on a [16] tensor and evaluating it
//     with its kernels already compiled (graph, passes, fusion, key, cache hit, run).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
using kiln::bench::set_bytes;

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

void BM_FuseEval100Cached(benchmark::State& state) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({16});
  }
  kiln::LazyGuard lazy(true);
  auto chain = [&] {
    Tensor y = x;
    for (int i = 0; i < 100; ++i) y = i % 2 ? y * 0.999 : y + 0.001;
    return y;
  };
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

}  // namespace
