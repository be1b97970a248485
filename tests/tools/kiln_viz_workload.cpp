// Workloads whose KILN_DUMP output tests/tools/kiln_viz_test.py renders with tools/kiln-viz:
//   kiln_viz_workload lstm        a traced LSTM cell, forward and backward, run three times
//   kiln_viz_workload wide N      a lazily recorded graph of N nodes or more, passed and planned
//                                 (fused), not run: its dump is the plan's graph without kernels
//   kiln_viz_workload word_lm     tools/examples/word_lm's traced training step (a two-layer LSTM
//                                 over 20 time steps: about 2,000 nodes in some 90 groups, many
//                                 sharing a kernel), a few steps on a small corpus
// Dumping and profiling come from the environment (KILN_DUMP, KILN_PROFILE).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "jit/dump.h"
#include "jit/passes/passes.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "word_lm.h"

namespace {

using kiln::Tensor;

int lstm() {
  kiln::manual_seed(0);
  const int64_t batch = 8, input = 24, hidden = 32;
  kiln::nn::LSTMCell cell(input, hidden);
  Tensor x = kiln::randn({batch, input});
  Tensor h = kiln::randn({batch, hidden}).requires_grad_(true);
  Tensor c = kiln::randn({batch, hidden}).requires_grad_(true);
  Tensor grad_h = kiln::randn({batch, hidden}), grad_c = kiln::randn({batch, hidden});
  kiln::jit::Function step = kiln::jit::trace(
      [&cell](const std::vector<Tensor>& in) {
        kiln::nn::LSTMState s = cell.forward(in[0], kiln::nn::LSTMState{in[1], in[2]});
        return std::vector<Tensor>{s.h, s.c};
      },
      {x, h, c});
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> out = step({x, h, c});
    kiln::autograd::backward({out[0], out[1]}, {grad_h, grad_c});
    kiln::eval(cell.weight.grad(), h.grad());
  }
  std::printf("lstm: %zu specialization(s) traced\n", step.num_specializations());
  return 0;
}

// A random program over a pool of live values: each step replaces one of them by an op of it and
// another (so every value is read), mostly elementwise (which fuses), with a GEMM or a row
// reduction now and then (which ends groups).
int wide(int64_t target) {
  kiln::detail::set_max_pending(int64_t{1} << 40);
  std::mt19937 rng(7);
  const int64_t n = 12;
  std::vector<Tensor> inputs, live;
  {
    kiln::LazyGuard eager(false);
    for (int i = 0; i < 48; ++i) inputs.push_back(kiln::randn({n, n}));
  }
  kiln::LazyGuard lazy(true);
  live = inputs;
  // Recorded nodes plus the graph's inputs; constants come on top.
  while (kiln::detail::pending_count() + static_cast<int64_t>(inputs.size()) < target) {
    const size_t j = rng() % live.size(), k = rng() % live.size();
    const Tensor& a = live[j];
    const Tensor& b = live[k];
    Tensor r;
    switch (rng() % 12) {
      case 0:
        r = kiln::tanh(a);
        break;
      case 1:
        r = kiln::sigmoid(a) * b;
        break;
      case 2:
        r = a * b;
        break;
      case 3:
        r = a + b;
        break;
      case 4:
        r = kiln::exp(a * 0.25) - b;
        break;
      case 5:
        r = kiln::relu(a) + b;
        break;
      case 6:
        r = kiln::where(kiln::gt(a, b), a, b);
        break;
      case 7:
        r = a.matmul(b) * 0.1;
        break;
      case 8:
        r = a - a.sum({1}, true) * (1.0 / n);
        break;
      case 9:
        r = kiln::maximum(a, b);
        break;
      case 10:
        r = a.t() + b;
        break;
      default:
        r = kiln::tanh(a) * kiln::sigmoid(b);
        break;
    }
    live[j] = r;
  }
  std::vector<kiln::detail::LazyRef> requests;
  for (const Tensor& t : live)
    if (kiln::detail::is_pending(t)) requests.push_back(t.impl()->storage->lazy);
  kiln::jit::LazyGraphBinding binding;
  std::unique_ptr<kiln::jit::Graph> graph = kiln::jit::build_graph(requests, &binding, false);
  kiln::jit::run_passes(*graph);
  kiln::jit::Plan plan(*graph);
  std::printf("wide: %zu nodes, %zu fused kernels planned\n", graph->size(),
              plan.num_kernel_steps());
  return 0;
}

// The word_lm example as its user ran it (traced, two layers, 20 time steps), made small in
// everything but the graph: a short corpus, narrow layers, one epoch of a few steps.
int word_lm() {
  kiln::examples::WordLmConfig c;
  c.train_tokens = 4000;
  c.valid_tokens = 400;
  c.embedding_dim = 16;
  c.hidden_size = 32;
  c.epochs = 1;
  c.max_steps_per_epoch = 4;
  c.trace = true;
  const kiln::examples::WordLmResult r = kiln::examples::train_word_lm(c);
  std::printf("word_lm: %lld steps, last loss %.3f\n", static_cast<long long>(r.steps),
              r.step_losses.empty() ? 0.0 : r.step_losses.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!kiln::jit::dump_enabled())
    std::fprintf(stderr, "kiln_viz_workload: KILN_DUMP is not set; nothing is dumped\n");
  if (mode == "lstm") return lstm();
  if (mode == "wide" && argc > 2) return wide(std::atoll(argv[2]));
  if (mode == "word_lm") return word_lm();
  std::fprintf(stderr, "usage: kiln_viz_workload lstm | wide N | word_lm\n");
  return 2;
}
