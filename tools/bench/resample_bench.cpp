// Resampling and padding (lib/ops/interpolate.cpp, lib/ops/padding.cpp) as bytes/s of their
// output, a fraction of BM_Limit_Triad16M's bandwidth measured in the same run (eager_bench.cpp):
// bilinear 2x upsampling and nearest 2x upsampling of [8, 64, 128, 128] float32, and reflect
// padding of the same by 2 on each side of both spatial dims.
#include <benchmark/benchmark.h>

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

}  // namespace
