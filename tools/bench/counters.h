// Rate counters shared by the benchmarks: work per iteration reported per second.
#pragma once

#include <benchmark/benchmark.h>

namespace kiln::bench {

inline void set_bytes(benchmark::State& state, double bytes) {
  state.counters["bytes/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
inline void set_flops(benchmark::State& state, double flops) {
  state.counters["flop/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace kiln::bench
