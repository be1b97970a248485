// The word language model's training step (tools/examples/word_lm.cpp: embedding, 2-layer LSTM,
// decoder, cross-entropy, backward, gradient clipping, Adam) in torch's medium and large sizes
// (hidden 650 and 1500, 35 time steps, batch 20): time per step and peak memory, eager
// (KILN_LAZY=0), lazy, and traced (--trace: the whole step traced once and replayed).
//   step_s: median wall time of the steps after the first two (tracing and compilation excluded);
//   vs_eager: eager's step time / this one's (above 1: faster);
//   peak_MB: the most bytes live tensors held during those steps (parameters and Adam's state
//     included); step_MB: that peak less what was held at the start of the steps (activations,
//     saved values, gradients); step_mem_vs_eager: step_MB / eager's.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "lib/allocator.h"
#include "tools/examples/word_lm.h"

namespace {

struct Measured {
  double step_seconds = 0;
  double step_bytes = 0;
};
std::map<int64_t, Measured>& eager_reference() {
  static std::map<int64_t, Measured> m;
  return m;
}

enum class Mode { Eager, Lazy, Traced };

void BM_WordLmTrainStep(benchmark::State& state, Mode mode) {
  const int64_t hidden = state.range(0);
  kiln::examples::WordLmConfig c;
  c.embedding_dim = hidden;
  c.hidden_size = hidden;
  c.num_layers = 2;
  c.bptt = 35;
  c.batch_size = 20;
  c.dropout = 0.5;
  c.epochs = 1;
  c.max_steps_per_epoch = hidden >= 1500 ? 5 : 8;
  c.train_tokens = c.batch_size * (c.bptt * c.max_steps_per_epoch + 1) + 1000;
  c.valid_tokens = 20;
  c.log_every = 0;
  c.trace = mode == Mode::Traced;
  int64_t step = 0;
  size_t held_at_start = 0;
  c.after_step = [&] {
    if (++step == 2) {  // from here on: steady state
      held_at_start = kiln::detail::cpu_allocated_bytes();
      kiln::detail::cpu_reset_peak();
    }
  };
  kiln::LazyGuard lazy(mode != Mode::Eager);
  Measured m;
  double peak = 0;
  for (auto _ : state) {
    step = 0;
    kiln::examples::WordLmResult r = kiln::examples::train_word_lm(c);
    std::vector<double> t(r.step_seconds.begin() + 2, r.step_seconds.end());
    std::sort(t.begin(), t.end());
    m.step_seconds = t[t.size() / 2];
    peak = static_cast<double>(kiln::detail::cpu_peak_allocated_bytes());
    m.step_bytes = peak - static_cast<double>(held_at_start);
    state.SetIterationTime(m.step_seconds);
  }
  state.counters["step_s"] = m.step_seconds;
  state.counters["peak_MB"] = peak / 1e6;
  state.counters["step_MB"] = m.step_bytes / 1e6;
  if (mode == Mode::Eager) {
    eager_reference()[hidden] = m;
  } else if (auto it = eager_reference().find(hidden); it != eager_reference().end()) {
    state.counters["vs_eager"] = it->second.step_seconds / m.step_seconds;
    state.counters["step_mem_vs_eager"] = m.step_bytes / it->second.step_bytes;
  }
}
BENCHMARK_CAPTURE(BM_WordLmTrainStep, eager, Mode::Eager)
    ->Arg(650)
    ->Arg(1500)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_WordLmTrainStep, lazy, Mode::Lazy)
    ->Arg(650)
    ->Arg(1500)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_WordLmTrainStep, traced, Mode::Traced)
    ->Arg(650)
    ->Arg(1500)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
