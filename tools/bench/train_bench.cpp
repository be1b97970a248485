// Training benchmarks: an LSTM cell step (forward, forward + backward), one MLP training step, and
// the Adam update alone. GEMM-bound figures report flop/s of their GEMMs and the optimizer reports
// bytes/s, so eager_bench.cpp's reporter prints each against the sgemm peak or the triad bandwidth
// measured in the same run.
#include <benchmark/benchmark.h>
#include <chrono>
#include "tools/bench/counters.h"

#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

namespace {

using kiln::Tensor;

using kiln::bench::set_bytes;
using kiln::bench::set_flops;

// The sizes of torch's classic LSTM benchmark (a large word-LM layer).
constexpr int64_t kBatch = 64, kInput = 1500, kHidden = 1500;
// One gates GEMM: [B, I + H] @ [I + H, 4H].
constexpr double kGatesFlops = 2.0 * kBatch * (kInput + kHidden) * 4 * kHidden;

struct CellInputs {
  kiln::nn::LSTMCell cell{kInput, kHidden};
  Tensor x = kiln::randn({kBatch, kInput});
  Tensor h = kiln::randn({kBatch, kHidden});
  Tensor c = kiln::randn({kBatch, kHidden});
};

// Inference: no graph is recorded.
void BM_LSTMCellForward(benchmark::State& state) {
  kiln::manual_seed(0);
  CellInputs in;
  kiln::NoGradGuard no_grad;
  for (auto _ : state) {
    kiln::nn::LSTMState s = in.cell.forward(in.x, kiln::nn::LSTMState{in.h, in.c});
    benchmark::DoNotOptimize(s.h.raw_data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  set_flops(state, kGatesFlops);
}

// Forward with the graph recorded, then backward from random gradients of h' and c'. The input and
// state require grad, as inside an unrolled sequence, so backward runs three GEMMs: the weight
// gradient and the gradient of [x, h], plus the forward's.
void BM_LSTMCellForwardBackward(benchmark::State& state) {
  kiln::manual_seed(0);
  CellInputs in;
  in.x.requires_grad_();
  in.h.requires_grad_();
  in.c.requires_grad_();
  Tensor grad_h = kiln::randn({kBatch, kHidden}), grad_c = kiln::randn({kBatch, kHidden});
  std::vector<Tensor> leaves = in.cell.parameters();
  leaves.insert(leaves.end(), {in.x, in.h, in.c});
  for (auto _ : state) {
    for (Tensor& t : leaves) t.mutable_grad() = Tensor();
    kiln::nn::LSTMState s = in.cell.forward(in.x, kiln::nn::LSTMState{in.h, in.c});
    kiln::autograd::backward({s.h, s.c}, {grad_h, grad_c});
    benchmark::DoNotOptimize(in.cell.weight.grad().raw_data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  set_flops(state, 3 * kGatesFlops);
}

// One step of MNIST-sized MLP training: forward, cross entropy, backward, Adam; run eagerly
// (the reference), in lazy mode, and as a jit::trace replay. The later variants report their time
// against the eager run's (registered first, so it runs first).
enum class StepMode { Eager, Lazy, Traced };
double g_eager_step_seconds = 0;

void mlp_train_step(benchmark::State& state, StepMode mode) {
  constexpr int64_t B = 256, D = 784, H = 1024, C = 10;
  kiln::manual_seed(0);
  kiln::nn::Sequential model{
      std::make_shared<kiln::nn::Linear>(D, H), std::make_shared<kiln::nn::ReLU>(),
      std::make_shared<kiln::nn::Linear>(H, H), std::make_shared<kiln::nn::ReLU>(),
      std::make_shared<kiln::nn::Linear>(H, C)};
  kiln::optim::Adam adam(model.parameters(), kiln::optim::AdamOptions{1e-3});
  Tensor x = kiln::randn({B, D});
  Tensor y = kiln::randint(C, {B});
  kiln::LazyGuard lazy(mode != StepMode::Eager);
  auto step = [&](const std::vector<Tensor>& in) {
    adam.zero_grad();
    Tensor loss = kiln::cross_entropy(model.forward(in[0]), in[1]);
    loss.backward();
    adam.step();
    return std::vector<Tensor>{loss};
  };
  kiln::jit::Function traced;
  if (mode == StepMode::Traced) traced = kiln::jit::trace(step, {x, y});
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    Tensor loss = mode == StepMode::Traced ? traced({x, y})[0] : step({x, y})[0];
    benchmark::DoNotOptimize(loss.item<float>());
  }
  double per_step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  if (mode == StepMode::Eager) g_eager_step_seconds = per_step;
  if (mode != StepMode::Eager && g_eager_step_seconds > 0)
    state.counters["vs_eager"] = per_step / g_eager_step_seconds;
  state.SetItemsProcessed(state.iterations() * B);
  // Forward GEMMs, the same again for the weight gradients, and the input gradients of every
  // layer but the first (x does not require grad).
  const double forward = 2.0 * B * (D * H + H * H + H * C);
  set_flops(state, 2 * forward + 2.0 * B * (H * H + H * C));
}
void BM_MLPTrainStep(benchmark::State& state) {
  mlp_train_step(state, StepMode::Eager);
}
void BM_MLPTrainStepLazy(benchmark::State& state) {
  mlp_train_step(state, StepMode::Lazy);
}
void BM_MLPTrainStepTraced(benchmark::State& state) {
  mlp_train_step(state, StepMode::Traced);
}

// The Adam update of the MLP's 1.86M parameters alone: 4 arrays read (p, grad, m, v) and 3 written.
void adam_step(benchmark::State& state, bool contiguous) {
  constexpr int64_t n = 784 * 1024 + 1024 * 1024 + 1024 * 10;
  constexpr int64_t rows = 2, cols = n / rows;
  kiln::manual_seed(0);
  Tensor p;
  if (contiguous) {
    p = kiln::randn({rows, cols});
  } else {  // column-major: takes the fallback made of in-place ops
    p = kiln::randn({cols, rows}).t().contiguous().t();
    p = kiln::from_blob(p.raw_data_ptr(), kiln::Shape{rows, cols}, kiln::Shape{1, rows},
                        kiln::kFloat32, [keep = p](void*) mutable { keep = Tensor(); });
  }
  Tensor grad = kiln::randn({rows, cols});
  p.mutable_grad() = contiguous ? grad : grad.t().contiguous().t();
  kiln::optim::Adam adam({p}, kiln::optim::AdamOptions{1e-3});
  for (auto _ : state) {
    adam.step();
    benchmark::DoNotOptimize(p.raw_data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * n);
  set_bytes(state, 7.0 * n * sizeof(float));
}
void BM_AdamStep(benchmark::State& state) {
  adam_step(state, true);
}
void BM_AdamStepStridedFallback(benchmark::State& state) {
  adam_step(state, false);
}

BENCHMARK(BM_LSTMCellForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LSTMCellForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MLPTrainStep)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MLPTrainStepLazy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MLPTrainStepTraced)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AdamStep)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AdamStepStridedFallback)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
