// Statistics and the unique family (lib/ops/statistics.cpp, lib/ops/unique.cpp, cdist in
// lib/ops/distances.cpp): cdist's GEMM expansion as a flop rate (a fraction of the sgemm peak of
// BM_Limit_GemmPeak in eager_bench.cpp); quantile and unique against a sort of the same 16M floats
// measured here (BM_Sort16M: both are a sort plus linear passes); histc and bincount as bytes/s
// of their input (a fraction of BM_Limit_Triad16M's bandwidth).
#include <benchmark/benchmark.h>

#include "kiln/kiln.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
using kiln::bench::set_bytes;
using kiln::bench::set_flops;

constexpr int64_t k16M = int64_t{1} << 24;

// cdist of 2048 rows against 2048 rows of 64 floats (p = 2, over 25 rows: torch's GEMM expansion,
// a [2048, 66] x [66, 2048] product): 2 * 2048^2 * 66 flops.
void BM_Cdist2048x64(benchmark::State& state) {
  const Tensor a = kiln::rand({2048, 64}), b = kiln::rand({2048, 64});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::cdist(a, b).data_ptr<float>());
  set_flops(state, 2.0 * 2048 * 2048 * 66);
}
BENCHMARK(BM_Cdist2048x64)->Unit(benchmark::kMillisecond)->UseRealTime();

// 16M float32 values with 1024 distinct ones, the data of the three benchmarks below.
Tensor tied16M() {
  return (kiln::rand({k16M}) * 1024.0).floor();
}

void BM_Sort16M(benchmark::State& state) {
  const Tensor x = tied16M();
  for (auto _ : state) benchmark::DoNotOptimize(std::get<0>(kiln::sort(x)).data_ptr<float>());
  set_bytes(state, 4.0 * k16M);
}
BENCHMARK(BM_Sort16M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Quantile16M(benchmark::State& state) {
  const Tensor x = tied16M();
  for (auto _ : state) benchmark::DoNotOptimize(kiln::quantile(x, 0.25).item<float>());
  set_bytes(state, 4.0 * k16M);
}
BENCHMARK(BM_Quantile16M)->Unit(benchmark::kMillisecond)->UseRealTime();

// unique with the inverse and the counts.
void BM_Unique16M(benchmark::State& state) {
  const Tensor x = tied16M();
  for (auto _ : state) {
    auto [values, inverse, counts] = kiln::unique(x, true, true, true);
    benchmark::DoNotOptimize(inverse.data_ptr<int64_t>());
  }
  set_bytes(state, 4.0 * k16M);
}
BENCHMARK(BM_Unique16M)->Unit(benchmark::kMillisecond)->UseRealTime();

// histc of 16M float32 values into 100 bins over [0.1, 0.9] (a fifth of them outside).
void BM_Histc16M(benchmark::State& state) {
  const Tensor x = kiln::rand({k16M});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::histc(x, 100, 0.1, 0.9).data_ptr<float>());
  set_bytes(state, 4.0 * k16M);
}
BENCHMARK(BM_Histc16M)->Unit(benchmark::kMillisecond)->UseRealTime();

// bincount of 16M int64 values in [0, 1000).
void BM_Bincount16M(benchmark::State& state) {
  const Tensor x = kiln::randint(1000, {k16M});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::bincount(x).data_ptr<int64_t>());
  set_bytes(state, 8.0 * k16M);
}
BENCHMARK(BM_Bincount16M)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
