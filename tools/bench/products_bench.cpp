// Products and LU (lib/ops/products.cpp, lib/ops/matrix_functions.cpp): baddbmm's scaling against
// the plain bmm of the same batches measured here (the scaling is one fused elementwise pass);
// linalg::multi_dot of an uneven chain against the left-to-right product of the same matrices
// (the order it avoids); lu_factor and lu_solve as flop rates beside linalg::solve of the same
// systems (getrf plus getrs).
#include <benchmark/benchmark.h>

#include "kiln/kiln.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
using kiln::bench::set_flops;

// 32 products of [256, 256] by [256, 256] float32.
constexpr double kBatchFlops = 2.0 * 32 * 256 * 256 * 256;

void BM_Bmm32x256(benchmark::State& state) {
  const Tensor a = kiln::rand({32, 256, 256}), b = kiln::rand({32, 256, 256});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::bmm(a, b).data_ptr<float>());
  set_flops(state, kBatchFlops);
}
BENCHMARK(BM_Bmm32x256)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Baddbmm32x256(benchmark::State& state) {
  const Tensor a = kiln::rand({32, 256, 256}), b = kiln::rand({32, 256, 256});
  const Tensor self = kiln::rand({256});
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::baddbmm(self, a, b, 0.5, 2).data_ptr<float>());
  set_flops(state, kBatchFlops);
}
BENCHMARK(BM_Baddbmm32x256)->Unit(benchmark::kMillisecond)->UseRealTime();

// [2048, 8] x [8, 2048] x [2048, 8]: left to right makes a 2048 x 2048 intermediate (2 * 2 *
// 2048^2 * 8 flops); multi_dot multiplies the last two first (an 8 x 8 one, 2 * 2 * 2048 * 64).
Tensor chain(int64_t i) {
  static const Tensor matrices[] = {kiln::rand({2048, 8}), kiln::rand({8, 2048}),
                                    kiln::rand({2048, 8})};
  return matrices[i];
}

void BM_ChainLeftToRight(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::mm(kiln::mm(chain(0), chain(1)), chain(2)).data_ptr<float>());
}
BENCHMARK(BM_ChainLeftToRight)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MultiDot(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(
        kiln::linalg::multi_dot({chain(0), chain(1), chain(2)}).data_ptr<float>());
}
BENCHMARK(BM_MultiDot)->Unit(benchmark::kMillisecond)->UseRealTime();

// 16 systems of 512 x 512 float64 with 64 right-hand sides: getrf is 2/3 n^3 flops, getrs
// 2 n^2 k.
constexpr int64_t kN = 512, kRhs = 64, kSystems = 16;
constexpr double kGetrf = 2.0 / 3.0 * kN * kN * kN * kSystems;
constexpr double kGetrs = 2.0 * kN * kN * kRhs * kSystems;

Tensor systems() {
  return kiln::rand({kSystems, kN, kN}, kiln::kFloat64) +
         kiln::eye(kN, kiln::TensorOptions(kiln::kFloat64)) * double(kN);
}

void BM_LuFactor512(benchmark::State& state) {
  const Tensor a = systems();
  for (auto _ : state)
    benchmark::DoNotOptimize(std::get<0>(kiln::linalg::lu_factor(a)).data_ptr<double>());
  set_flops(state, kGetrf);
}
BENCHMARK(BM_LuFactor512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LuSolve512(benchmark::State& state) {
  const Tensor a = systems(), b = kiln::rand({kSystems, kN, kRhs}, kiln::kFloat64);
  const auto [lu, pivots] = kiln::linalg::lu_factor(a);
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::linalg::lu_solve(lu, pivots, b).data_ptr<double>());
  set_flops(state, kGetrs);
}
BENCHMARK(BM_LuSolve512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Solve512(benchmark::State& state) {
  const Tensor a = systems(), b = kiln::rand({kSystems, kN, kRhs}, kiln::kFloat64);
  for (auto _ : state) benchmark::DoNotOptimize(kiln::linalg::solve(a, b).data_ptr<double>());
  set_flops(state, kGetrf + kGetrs);
}
BENCHMARK(BM_Solve512)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
