// Resampling and padding (lib/ops/interpolate.cpp, lib/ops/padding.cpp) as bytes/s of their
// output, a fraction of BM_Limit_Triad16M's bandwidth measured in the same run (eager_bench.cpp):
// bilinear 2x upsampling and nearest 2x upsampling of [8, 64, 128, 128] float32, reflect
// padding of the same by 2 on each side of both spatial dims, grid_sample of it at a rotated
// grid of the same size, and embedding_bag sums of 65536 rows of a [100000, 128] table in 1024
// bags.
#include <benchmark/benchmark.h>

#include <cmath>

#include "kiln/kiln.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
using kiln::bench::set_bytes;

Tensor images() {
  static const Tensor x = kiln::rand({8, 64, 128, 128});
  return x;
}

void BM_InterpolateBilinear2x(benchmark::State& state) {
  const Tensor x = images();
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::interpolate(x, {256, 256}, {}, "bilinear").data_ptr<float>());
  set_bytes(state, 4.0 * 8 * 64 * 256 * 256);
}
BENCHMARK(BM_InterpolateBilinear2x)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_InterpolateNearest2x(benchmark::State& state) {
  const Tensor x = images();
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::interpolate(x, {}, {2.0, 2.0}).data_ptr<float>());
  set_bytes(state, 4.0 * 8 * 64 * 256 * 256);
}
BENCHMARK(BM_InterpolateNearest2x)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_PadReflect2(benchmark::State& state) {
  const Tensor x = images();
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::pad(x, {2, 2, 2, 2}, "reflect").data_ptr<float>());
  set_bytes(state, 4.0 * 8 * 64 * 132 * 132);
}
BENCHMARK(BM_PadReflect2)->Unit(benchmark::kMillisecond)->UseRealTime();

// A grid rotating the image by 0.3 radians about its centre (a quarter of its points outside).
Tensor rotated_grid() {
  static const Tensor grid = [] {
    const double c = std::cos(0.3), s = std::sin(0.3);
    const Tensor theta =
        kiln::from_vector<float>({float(c), float(-s), 0, float(s), float(c), 0}, {1, 2, 3})
            .expand({8, 2, 3});
    return kiln::affine_grid(theta, {8, 64, 128, 128}).contiguous();
  }();
  return grid;
}

void BM_GridSampleBilinear(benchmark::State& state) {
  const Tensor x = images(), grid = rotated_grid();
  for (auto _ : state) benchmark::DoNotOptimize(kiln::grid_sample(x, grid).data_ptr<float>());
  set_bytes(state, 4.0 * 8 * 64 * 128 * 128);
}
BENCHMARK(BM_GridSampleBilinear)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_EmbeddingBagSum(benchmark::State& state) {
  static const Tensor table = kiln::randn({100000, 128});
  static const Tensor indices = kiln::randint(0, 100000, {65536});
  static const Tensor offsets = kiln::arange(0, 65536, 64);
  for (auto _ : state)
    benchmark::DoNotOptimize(kiln::embedding_bag(indices, table, offsets, "sum").data_ptr<float>());
  set_bytes(state, 4.0 * 65536 * 128);  // the rows read
}
BENCHMARK(BM_EmbeddingBagSum)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
