// Matrix functions (lib/ops/matrix_functions.cpp, LAPACK through LAPACKE): flop rates printed as a
// fraction of the sgemm peak that eager_bench.cpp measures in the same run (BM_Limit_GemmPeak).
// Their flop counts are the factorizations' classic ones: LU 2/3 n^3, each triangular solve with
// k right-hand sides n^2 k, Cholesky 1/3 n^3, the bidiagonal reduction of the singular values
// 8/3 n^3. The scans (lib/ops/sort_scan.cpp) report bytes/s, printed as a fraction of the DRAM
// bandwidth of BM_Limit_Triad16M.
#include <benchmark/benchmark.h>

#include "kiln/kiln.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
using kiln::bench::set_flops;

// Well-conditioned float32 matrices [batch..., n, n]: uniform entries plus n on the diagonal.
Tensor well_conditioned(const kiln::Shape& shape) {
  const int64_t n = shape.back();
  return kiln::rand(shape) + kiln::eye(n) * static_cast<double>(n);
}

// linalg::solve(A, B), A and B 512 x 512: an LU and two triangular solves with 512 right-hand
// sides, 8/3 n^3.
void BM_LinalgSolve512(benchmark::State& state) {
  const int64_t n = 512;
  const Tensor a = well_conditioned({n, n}), b = kiln::rand({n, n});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::linalg::solve(a, b).data_ptr<float>());
  set_flops(state, 8.0 / 3.0 * n * n * n);
}
BENCHMARK(BM_LinalgSolve512)->Unit(benchmark::kMillisecond)->UseRealTime();

// linalg::cholesky of a 512 x 512 positive-definite matrix: n^3 / 3.
void BM_LinalgCholesky512(benchmark::State& state) {
  const int64_t n = 512;
  const Tensor x = kiln::rand({n, n});
  const Tensor a = x.matmul(x.t()) + kiln::eye(n) * static_cast<double>(n);
  for (auto _ : state) benchmark::DoNotOptimize(kiln::linalg::cholesky(a).data_ptr<float>());
  set_flops(state, 1.0 / 3.0 * n * n * n);
}
BENCHMARK(BM_LinalgCholesky512)->Unit(benchmark::kMillisecond)->UseRealTime();

// linalg::det of 4096 matrices of 8 x 8: per-matrix overhead (copies, LAPACKE's layout
// transposes) against 2/3 n^3 of work each.
void BM_LinalgDetBatch4096x8(benchmark::State& state) {
  const int64_t batch = 4096, n = 8;
  const Tensor a = well_conditioned({batch, n, n});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::linalg::det(a).data_ptr<float>());
  set_flops(state, 2.0 / 3.0 * n * n * n * batch);
}
BENCHMARK(BM_LinalgDetBatch4096x8)->Unit(benchmark::kMillisecond)->UseRealTime();

// linalg::svdvals of a 256 x 256 matrix (gesdd without vectors): 8/3 n^3.
void BM_LinalgSvdvals256(benchmark::State& state) {
  const int64_t n = 256;
  const Tensor a = kiln::rand({n, n});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::linalg::svdvals(a).data_ptr<float>());
  set_flops(state, 8.0 / 3.0 * n * n * n);
}
BENCHMARK(BM_LinalgSvdvals256)->Unit(benchmark::kMillisecond)->UseRealTime();

// cummax along the rows of a 4096 x 4096 float32 matrix: reads 4 bytes and writes 4 (the value)
// and 8 (the int64 index) per element.
void BM_Cummax16M(benchmark::State& state) {
  const int64_t n = 4096;
  const Tensor x = kiln::rand({n, n});
  for (auto _ : state) {
    auto [values, indices] = kiln::cummax(x, 1);
    benchmark::DoNotOptimize(indices.data_ptr<int64_t>());
  }
  kiln::bench::set_bytes(state, 16.0 * n * n);
}
BENCHMARK(BM_Cummax16M)->Unit(benchmark::kMillisecond)->UseRealTime();

// logcumsumexp along the rows of a 4096 x 4096 float32 matrix: 4 bytes read and 4 written per
// element, and an exp and a log1p (in double).
void BM_Logcumsumexp16M(benchmark::State& state) {
  const int64_t n = 4096;
  const Tensor x = kiln::rand({n, n});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::logcumsumexp(x, 1).data_ptr<float>());
  kiln::bench::set_bytes(state, 8.0 * n * n);
}
BENCHMARK(BM_Logcumsumexp16M)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
