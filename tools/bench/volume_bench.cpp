// The 3-D convolution (lib/ops/conv.cpp's conv3d: one conv2d over gathered depth slices) on a
// [4, 16, 16, 32, 32] float32 volume with 32 3x3x3 kernels, valid, eager; vs_gemm: its time over
// one GEMM of the same shape ([32, 432] x [432, 4 * 14 * 30 * 30]) measured in the same run, the
// floor a GEMM-based convolution can reach.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "kiln/kiln.h"

namespace {

using kiln::Tensor;

double seconds_of(const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void BM_Conv3dForward(benchmark::State& state) {
  kiln::LazyGuard eager(false);
  const Tensor x = kiln::randn({4, 16, 16, 32, 32}), w = kiln::randn({32, 16, 3, 3, 3});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::conv3d(x, w).data_ptr<float>());
  const Tensor a = kiln::randn({32, 432}), b = kiln::randn({432, 4 * 14 * 30 * 30});
  const double gemm = seconds_of([&] { benchmark::DoNotOptimize(a.matmul(b).data_ptr<float>()); });
  const double flops = 2.0 * 32 * 432 * 4 * 14 * 30 * 30;
  state.counters["gflops"] =
      benchmark::Counter(flops * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["gemm_ms"] = gemm * 1e3;
  // elapsed / (iterations * gemm): the time per convolution over the GEMM's.
  state.counters["vs_gemm"] = benchmark::Counter(
      double(state.iterations()) * gemm, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Conv3dForward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
