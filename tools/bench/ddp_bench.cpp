// Data-parallel benchmarks: train_bench.cpp's MLP step (784-1024-1024-10, global batch 256, Adam)
// under DistributedDataParallel, the global batch split over the ranks, run eagerly and as a
// jit::trace'd step (whose graph holds the gradient buckets' all-reduces), and the averaging
// all-reduce of its 1.86M float32 gradients alone (the communication every step adds); and the
// word_lm example's training step (tools/examples/word_lm.cpp, --ddp), eager and traced.
// Each step benchmark reports how its collectives overlapped the rest of the step
// (distributed::comm_times over the timed steps): comm_ms, the time per step collectives were in
// flight (issued to completed on the group's thread); overlap_ms, the CPU time the issuing thread
// computed meanwhile (the backward that ran while communication was in flight); waited_ms, the
// time it was blocked waiting for them; overlap = overlap_ms / comm_ms. CPU time, not wall time:
// on a loaded machine a thread that was descheduled did not compute (with one rank a collective
// has no peer and completes at once).
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kiln/distributed.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "tools/bench/counters.h"
#include "tools/examples/word_lm.h"

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

// The collectives' times over `steps` timed steps (see the top of the file).
void report_overlap(benchmark::State& state, int64_t steps) {
  const dist::CommTimes t = dist::comm_times();
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  state.counters["comm_ms"] = t.in_flight_seconds / n * 1e3;
  state.counters["overlap_ms"] = t.computed_seconds / n * 1e3;
  state.counters["waited_ms"] = t.waited_seconds / n * 1e3;
  state.counters["overlap"] =
      t.in_flight_seconds > 0 ? t.computed_seconds / t.in_flight_seconds : 0;
}

// Both variants run one step before timing, so that neither times its kernels' compilation.
void BM_DDPMLPTrainStep(benchmark::State& state) {
  MLPStep s;
  s.step(s.x, s.y).item<float>();
  dist::reset_comm_times();
  for (auto _ : state) benchmark::DoNotOptimize(s.step(s.x, s.y).item<float>());
  report_overlap(state, state.iterations());
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
  dist::reset_comm_times();
  for (auto _ : state) benchmark::DoNotOptimize(step({s.x, s.y})[0].item<float>());
  report_overlap(state, state.iterations());
  s.report(state);
}
BENCHMARK(BM_DDPMLPTracedTrainStep)
    ->Iterations(kIterations)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// word_lm's training step (embedding 64, 2-layer LSTM 128, batch 20 split over the ranks, 20
// time steps, Adam, clipping) under DDP: one training run of kWordLmSteps steps per iteration,
// the median of the steps after the first two (tracing and compilation excluded). The example
// also all-reduces each step's loss for its log (a small collective waited for at once), which
// the overlap figures include.
constexpr int64_t kWordLmSteps = 12;

void BM_DDPWordLmTrainStep(benchmark::State& state, bool traced) {
  group();  // the default group the example's DDP uses
  kiln::examples::WordLmConfig c;
  c.epochs = 1;
  c.dropout = 0;
  c.max_steps_per_epoch = kWordLmSteps;
  c.train_tokens = c.batch_size * (c.bptt * kWordLmSteps + 1) + 1000;
  c.valid_tokens = 20;
  c.log_every = 0;
  c.trace = traced;
  c.ddp = true;
  int64_t step = 0;
  c.after_step = [&] {
    if (++step == 2) dist::reset_comm_times();  // from here on: steady state
  };
  for (auto _ : state) {
    step = 0;
    kiln::examples::WordLmResult r = kiln::examples::train_word_lm(c);
    std::vector<double> t(r.step_seconds.begin() + 2, r.step_seconds.end());
    std::sort(t.begin(), t.end());
    state.SetIterationTime(t[t.size() / 2]);
    report_overlap(state, static_cast<int64_t>(t.size()));
  }
  state.counters["world"] = group()->size();
}
BENCHMARK_CAPTURE(BM_DDPWordLmTrainStep, eager, false)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_DDPWordLmTrainStep, traced, true)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

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
