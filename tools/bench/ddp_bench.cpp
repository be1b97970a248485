// Data-parallel benchmarks: train_bench.cpp's MLP step (784-1024-1024-10, global batch 256, Adam)
// under DistributedDataParallel, the global batch split over the ranks, run eagerly and as a
// jit::trace'd step (whose graph holds the gradient buckets' all-reduces), and the averaging
// all-reduce of its 1.86M float32 gradients alone (the communication every step adds).
// World size 1: run kiln_bench as usual. World size N: every rank must run the same benchmarks the
// same number of times, so these have fixed iteration counts:
//   tools/kiln-run -n 2 build/tools/bench/kiln_bench --benchmark_filter=DDP
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "kiln/distributed.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "tools/bench/counters.h"

namespace {

namespace dist = kiln::distributed;
using kiln::Tensor;

constexpr int64_t kGlobalBatch = 256, kD = 784, kH = 1024, kC = 10;
constexpr int kIterations = 30;

// The store directory of a group of one, removed at exit (after the group, made later).
struct StoreDir {
  std::string path;
  ~StoreDir() {
    if (!path.empty()) std::filesystem::remove_all(path);
  }
};

// The ranks kiln-run started, or a group of one.
std::shared_ptr<dist::ProcessGroup> group() {
  static StoreDir dir;
  static std::shared_ptr<dist::ProcessGroup> g = [] {
    if (!dist::is_initialized()) {
      if (std::getenv("WORLD_SIZE")) {
        dist::init_process_group("gloo");
      } else {
        char tmpl[] = "/tmp/kiln_ddp_bench_XXXXXX";
        dir.path = mkdtemp(tmpl);
        dist::init_process_group("gloo", 0, 1, std::make_shared<dist::FileStore>(dir.path));
      }
    }
    return dist::default_group();
  }();
  return g;
}

// The MLP under DDP with Adam, and this rank's share of the global batch.
struct MLPStep {
  std::shared_ptr<dist::ProcessGroup> g = group();
  std::shared_ptr<kiln::nn::Sequential> model;
  std::unique_ptr<kiln::nn::parallel::DistributedDataParallel> ddp;
  std::unique_ptr<kiln::optim::Adam> adam;
  Tensor x, y;

  MLPStep() {
    const int64_t batch = kGlobalBatch / g->size();
    kiln::manual_seed(0);
    model = std::make_shared<kiln::nn::Sequential>(
        std::initializer_list<std::shared_ptr<kiln::nn::Module>>{
            std::make_shared<kiln::nn::Linear>(kD, kH), std::make_shared<kiln::nn::ReLU>(),
            std::make_shared<kiln::nn::Linear>(kH, kH), std::make_shared<kiln::nn::ReLU>(),
            std::make_shared<kiln::nn::Linear>(kH, kC)});
    ddp = std::make_unique<kiln::nn::parallel::DistributedDataParallel>(model, g);
    adam = std::make_unique<kiln::optim::Adam>(model->parameters(), kiln::optim::AdamOptions{1e-3});
    kiln::manual_seed(1 + g->rank());
    x = kiln::randn({batch, kD});
    y = kiln::randint(kC, {batch});
  }

  Tensor step(const Tensor& input, const Tensor& target) {
    adam->zero_grad();
    Tensor loss = kiln::cross_entropy((*ddp)(input), target);
    loss.backward();
    adam->step();
    return loss;
  }

  void report(benchmark::State& state) const {
    state.counters["world"] = g->size();
    state.counters["buckets"] = static_cast<double>(ddp->bucket_indices().size());
    state.SetItemsProcessed(state.iterations() * kGlobalBatch);  // samples of the whole job
  }
};

// Both variants run one step before timing, so that neither times its kernels' compilation.
void BM_DDPMLPTrainStep(benchmark::State& state) {
  MLPStep s;
  s.step(s.x, s.y).item<float>();
  for (auto _ : state) benchmark::DoNotOptimize(s.step(s.x, s.y).item<float>());
  s.report(state);
}
BENCHMARK(BM_DDPMLPTrainStep)
    ->Iterations(kIterations)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same step traced once: each call replays its plan, the all-reduces included.
void BM_DDPMLPTracedTrainStep(benchmark::State& state) {
  MLPStep s;
  kiln::jit::Function step = kiln::jit::trace(
      [&s](const std::vector<Tensor>& in) { return std::vector<Tensor>{s.step(in[0], in[1])}; },
      {s.x, s.y});
  step({s.x, s.y})[0].item<float>();
  for (auto _ : state) benchmark::DoNotOptimize(step({s.x, s.y})[0].item<float>());
  s.report(state);
}
BENCHMARK(BM_DDPMLPTracedTrainStep)
    ->Iterations(kIterations)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_DDPAllReduceGradients(benchmark::State& state) {
  auto g = group();
  const int64_t n = kD * kH + kH + kH * kH + kH + kH * kC + kC;
  Tensor t = kiln::zeros({n});
  for (auto _ : state) g->allreduce(t, dist::ReduceOp::AVG)->wait();
  state.counters["world"] = g->size();
  kiln::bench::set_bytes(state, static_cast<double>(n) * 4);
}
BENCHMARK(BM_DDPAllReduceGradients)
    ->Iterations(kIterations)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
