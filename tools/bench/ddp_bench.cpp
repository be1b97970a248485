// Data-parallel benchmarks: train_bench.cpp's MLP step (784-1024-1024-10, global batch 256, Adam)
// under DistributedDataParallel, the global batch split over the ranks, and the averaging
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

void BM_DDPMLPTrainStep(benchmark::State& state) {
  auto g = group();
  const int64_t batch = kGlobalBatch / g->size();
  kiln::manual_seed(0);
  auto model = std::make_shared<kiln::nn::Sequential>(
      std::initializer_list<std::shared_ptr<kiln::nn::Module>>{
          std::make_shared<kiln::nn::Linear>(kD, kH), std::make_shared<kiln::nn::ReLU>(),
          std::make_shared<kiln::nn::Linear>(kH, kH), std::make_shared<kiln::nn::ReLU>(),
          std::make_shared<kiln::nn::Linear>(kH, kC)});
  kiln::nn::parallel::DistributedDataParallel ddp(model, g);
  kiln::optim::Adam adam(model->parameters(), kiln::optim::AdamOptions{1e-3});
  kiln::manual_seed(1 + g->rank());
  Tensor x = kiln::randn({batch, kD});
  Tensor y = kiln::randint(kC, {batch});
  for (auto _ : state) {
    adam.zero_grad();
    Tensor loss = kiln::cross_entropy(ddp(x), y);
    loss.backward();
    adam.step();
    benchmark::DoNotOptimize(loss.item<float>());
  }
  state.counters["world"] = g->size();
  state.counters["buckets"] = static_cast<double>(ddp.bucket_indices().size());
  state.SetItemsProcessed(state.iterations() * kGlobalBatch);  // samples of the whole job
}
BENCHMARK(BM_DDPMLPTrainStep)
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
