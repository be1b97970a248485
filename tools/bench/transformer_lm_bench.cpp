// The transformer language model's training step (tools/examples/transformer_lm.cpp: embedding,
// positions, a 2-layer causal TransformerEncoder, decoder, cross-entropy, backward, gradient
// clipping, Adam) at d_model 256 (ff 1024) and 512 (ff 2048), 8 heads, 35 tokens of context,
// batch 20: time per step eager (KILN_LAZY=0), lazy, and traced (the whole step traced once and
// replayed).
//   step_s: median wall time of the steps after the first two (tracing and compilation excluded);
//   vs_eager: eager's step time / this one's (above 1: faster).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <vector>

#include "kiln/kiln.h"
#include "tools/examples/transformer_lm.h"

namespace {

std::map<int64_t, double>& eager_step_seconds() {
  static std::map<int64_t, double> m;
  return m;
}

enum class Mode { Eager, Lazy, Traced };

void BM_TransformerLmTrainStep(benchmark::State& state, Mode mode) {
  const int64_t d = state.range(0);
  kiln::examples::TransformerLmConfig c;
  c.d_model = d;
  c.nhead = 8;
  c.num_layers = 2;
  c.dim_feedforward = 4 * d;
  c.bptt = 35;
  c.batch_size = 20;
  c.dropout = 0.1;
  c.epochs = 1;
  c.max_steps_per_epoch = 10;
  c.train_tokens = c.batch_size * (c.bptt * c.max_steps_per_epoch + 1) + 1000;
  c.valid_tokens = 20;
  c.log_every = 0;
  c.trace = mode == Mode::Traced;
  kiln::LazyGuard lazy(mode != Mode::Eager);
  double step = 0;
  for (auto _ : state) {
    kiln::examples::TransformerLmResult r = kiln::examples::train_transformer_lm(c);
    std::vector<double> t(r.step_seconds.begin() + 2, r.step_seconds.end());
    std::sort(t.begin(), t.end());
    step = t[t.size() / 2];
    state.SetIterationTime(step);
  }
  state.counters["step_s"] = step;
  if (mode == Mode::Eager) {
    eager_step_seconds()[d] = step;
  } else if (auto it = eager_step_seconds().find(d); it != eager_step_seconds().end()) {
    state.counters["vs_eager"] = it->second / step;
  }
}
BENCHMARK_CAPTURE(BM_TransformerLmTrainStep, eager, Mode::Eager)
    ->Arg(256)
    ->Arg(512)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerLmTrainStep, lazy, Mode::Lazy)
    ->Arg(256)
    ->Arg(512)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerLmTrainStep, traced, Mode::Traced)
    ->Arg(256)
    ->Arg(512)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
