// A GRU cell step (nn::GRUCell, batch 64, input and hidden 1500) forward and backward, against its
// GEMMs alone.
//   BM_GruGemmsOnly: the step's GEMMs, eager: x W_ih^T and h W_hh^T ([64, 4500] each), and for the
//     backward the weight gradients dgates_i^T x and dgates_h^T h. The reference of the rows below.
//   BM_GruCellStep/{lazy,traced}: the cell's forward and the weights' and biases' gradients of
//     loss = h'.sum() by autograd, recorded lazily and as a jit::trace of the forward; non_gemm =
//     (step - GEMMs) / step (target for the traced step: under 0.10).
#include <benchmark/benchmark.h>

#include <chrono>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "tools/bench/counters.h"

namespace {

using kiln::Tensor;
constexpr int64_t kBatch = 64, kSize = 1500;

struct GruInputs {
  Tensor x, h, grad_gates;
  std::shared_ptr<kiln::nn::GRUCell> cell;
  GruInputs() {
    kiln::LazyGuard eager(false);
    kiln::manual_seed(4);
    x = kiln::randn({kBatch, kSize});
    h = kiln::randn({kBatch, kSize});
    grad_gates = kiln::randn({kBatch, 3 * kSize});
    cell = std::make_shared<kiln::nn::GRUCell>(kSize, kSize);
  }
};

const GruInputs& gru_inputs() {
  static const GruInputs in;
  return in;
}

double g_gemm_seconds = 0;

template <typename F>
double seconds_per_call(benchmark::State& state, const F& run) {
  run();  // compiles, warms the allocator
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(state.iterations());
}

void BM_GruGemmsOnly(benchmark::State& state) {
  const GruInputs& in = gru_inputs();
  kiln::LazyGuard eager(false);
  const Tensor wih = in.cell->weight_ih.detach(), whh = in.cell->weight_hh.detach();
  g_gemm_seconds = seconds_per_call(state, [&] {
    Tensor a = in.x.matmul(wih.t()), b = in.h.matmul(whh.t());
    Tensor gi = in.grad_gates.t().matmul(in.x), gh = in.grad_gates.t().matmul(in.h);
    for (const Tensor* t : {&a, &b, &gi, &gh}) benchmark::DoNotOptimize(t->raw_data_ptr());
  });
  kiln::bench::set_flops(state, 4 * 2.0 * kBatch * kSize * 3 * kSize);
}
BENCHMARK(BM_GruGemmsOnly)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GruCellStep(benchmark::State& state, bool traced) {
  const GruInputs& in = gru_inputs();
  kiln::nn::GRUCell& cell = *in.cell;
  const std::vector<Tensor> params = cell.parameters();
  auto forward = [&cell](const std::vector<Tensor>& a) {
    return std::vector<Tensor>{cell.forward(a[0], a[1])};
  };
  kiln::jit::Function f;
  if (traced) f = kiln::jit::trace(forward, {in.x, in.h});
  const double t = seconds_per_call(state, [&] {
    const Tensor h2 = (traced ? f({in.x, in.h}) : forward({in.x, in.h}))[0];
    std::vector<Tensor> grads = kiln::autograd::grad({h2.sum()}, params);
    kiln::eval(grads);
    for (const Tensor& g : grads) benchmark::DoNotOptimize(g.raw_data_ptr());
  });
  if (g_gemm_seconds > 0) state.counters["non_gemm"] = (t - g_gemm_seconds) / t;
  state.counters["step_ms"] = t * 1e3;
}
BENCHMARK_CAPTURE(BM_GruCellStep, lazy, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GruCellStep, traced, true)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
