// Convolution benchmarks, float32 on the CPU (and on a CUDA device), eager.
//   BM_Conv/<problem>/<pass>/<algorithm>: one pass of the GpuCorrMM benchmark configurations
//     (input 64x32x32 with 128 5x5 kernels, valid; 384x13x13 with 384 3x3 kernels, padding 1;
//     batch 32) computed by one algorithm, forced with set_conv_algo (lib/ops/conv.h).
//   BM_Conv/<problem>/<pass>/auto: the chooser's pick (its measuring call excluded), registered
//     after the forced rows of its pass; the label names the pick, and <algorithm>_vs_fastest
//     prints each row's time over the fastest forced time of the pass in this run
//     (chosen_vs_fastest: the pick's own time; target <= 1.1).
//   BM_CudaConv/<problem>/<pass>: the same passes on cuda:0 (the chooser's pick, its measuring
//     call excluded; the label names it), synchronized; gemm_ms: its cuBLAS GEMM alone on buffers
//     of the same shapes (lib/ops/conv_cuda.h's pass_gemm), vs_gemms: the pass's time over it
//     (target <= 1.2). BM_CudaConv/<problem>/<pass>/<algorithm>, registered before it: the pass
//     computed by each CUDA algorithm, forced (im2col, weight-grad, im2col_l2), for comparing
//     them directly. BM_CudaConv also runs ResNet-18's 3x3 stride-1 convolutions (resnet18_*).
//   BM_ResNet18TrainStep/<mode>: one training step (forward, cross entropy, backward, Adam) of
//     ResNet-18 (tools/examples/resnet.h) on a batch of 32 3x64x64 images, eager (the reference,
//     registered first), lazy, and as a jit::trace replay; vs_eager = eager's step time / this
//     one's (above 1: faster; target for the traced step >= 1.3); cpu_step_s and cpu_vs_eager
//     the same from the CPU time of all the process's threads. BM_CudaResNet18TrainStep/<mode>:
//     the same step with the model and batch on cuda:0 (eager and traced).
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/profiler.h"
#include "lib/ops/conv.h"
#include "lib/ops/conv_cuda.h"
#include "tools/bench/counters.h"
#include "tools/examples/resnet.h"

namespace {

using kiln::Shape;
using kiln::Tensor;
using kiln::detail::ConvAlgo;

struct ConvProblem {
  const char* name;
  int64_t N, C, H, W, O, k, pad;
  int64_t out_h() const { return H + 2 * pad - k + 1; }
  int64_t out_w() const { return W + 2 * pad - k + 1; }
  double flops() const { return 2.0 * static_cast<double>(N * O * C * k * k * out_h() * out_w()); }
};
constexpr int64_t kConvBatch = 32;
const ConvProblem kProblems[] = {
    {"64x32x32_k5x5x128", kConvBatch, 64, 32, 32, 128, 5, 0},
    {"384x13x13_k3x3x384_pad1", kConvBatch, 384, 13, 13, 384, 3, 1},
};
// ResNet-18's 3x3 stride-1 convolutions on BM_ResNet18TrainStep's batch (32 images of 64x64): the
// bulk of its convolution time, measured on the device against their GEMMs.
const ConvProblem kResNetProblems[] = {
    {"resnet18_64x16x16_k3x3x64_pad1", kConvBatch, 64, 16, 16, 64, 3, 1},
    {"resnet18_128x8x8_k3x3x128_pad1", kConvBatch, 128, 8, 8, 128, 3, 1},
    {"resnet18_256x4x4_k3x3x256_pad1", kConvBatch, 256, 4, 4, 256, 3, 1},
    {"resnet18_512x2x2_k3x3x512_pad1", kConvBatch, 512, 2, 2, 512, 3, 1},
};

enum class Pass { Forward, GradInput, GradWeight };
const char* pass_name(Pass p) {
  return p == Pass::Forward ? "forward" : p == Pass::GradInput ? "grad_input" : "grad_weight";
}
// The algorithms lib/ops/conv.cpp can run each pass with (the weight-gradient formulation is a
// forward algorithm only).
std::vector<ConvAlgo> algorithms(Pass p) {
  if (p == Pass::Forward) return {ConvAlgo::Im2col, ConvAlgo::WeightGrad, ConvAlgo::OneDNN};
  return {ConvAlgo::Im2col, ConvAlgo::OneDNN};
}

// Seconds per call of each forced algorithm, by "<problem>/<pass>", filled as the rows run.
std::map<std::string, std::map<ConvAlgo, double>>& forced_seconds() {
  static std::map<std::string, std::map<ConvAlgo, double>> m;
  return m;
}

struct ConvOperands {
  Tensor x, w, gy;
  explicit ConvOperands(const ConvProblem& p)
      : x(kiln::randn({p.N, p.C, p.H, p.W})),
        w(kiln::randn({p.O, p.C, p.k, p.k})),
        gy(kiln::randn({p.N, p.O, p.out_h(), p.out_w()})) {}
};

Tensor run_pass(Pass pass, const ConvProblem& p, const ConvOperands& in) {
  const Shape stride{1, 1}, padding{p.pad, p.pad}, dilation{1, 1};
  switch (pass) {
    case Pass::Forward:
      return kiln::conv2d(in.x, in.w, Tensor(), stride, padding, dilation, 1);
    case Pass::GradInput:
      return kiln::conv2d_grad_input(in.gy, in.w, in.x.sizes(), stride, padding, dilation, 1);
    default:
      return kiln::conv2d_grad_weight(in.gy, in.x, in.w.sizes(), stride, padding, dilation, 1);
  }
}

// Restores the chooser (measure, then remember) when a row ends.
struct ForcedAlgo {
  explicit ForcedAlgo(ConvAlgo a) { kiln::detail::set_conv_algo(a); }
  ~ForcedAlgo() { kiln::detail::set_conv_algo(ConvAlgo::Auto); }
};

// `algo` Auto: the chooser's pick, after a first call that measures and remembers it.
void BM_Conv(benchmark::State& state, const ConvProblem& p, Pass pass, ConvAlgo algo) {
  kiln::manual_seed(0);
  kiln::LazyGuard eager(false);
  ConvOperands in(p);
  ForcedAlgo forced(algo);
  if (algo == ConvAlgo::Auto) kiln::detail::clear_conv_choices();
  run_pass(pass, p, in);  // warm-up: oneDNN's kernel generation, the chooser's measurements
  const ConvAlgo ran = kiln::detail::last_conv_algo();
  if (algo != ConvAlgo::Auto && ran != algo) {
    state.SkipWithError("the forced algorithm cannot run this problem");
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(run_pass(pass, p, in).raw_data_ptr());
  const double per_call =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  kiln::bench::set_flops(state, p.flops());
  const std::string key = std::string(p.name) + "/" + pass_name(pass);
  if (algo != ConvAlgo::Auto) {
    forced_seconds()[key][algo] = per_call;
    return;
  }
  const std::map<ConvAlgo, double>& times = forced_seconds()[key];
  if (times.empty()) return;  // the forced rows were filtered out
  double fastest = times.begin()->second;
  for (const auto& [a, s] : times) fastest = std::min(fastest, s);
  for (const auto& [a, s] : times)
    state.counters[std::string(kiln::detail::conv_algo_name(a)) + "_vs_fastest"] = s / fastest;
  state.counters["chosen_vs_fastest"] = per_call / fastest;
  state.SetLabel(std::string("chose ") + kiln::detail::conv_algo_name(ran));
}

const bool kConvRegistered = [] {
  for (const ConvProblem& p : kProblems) {
    for (Pass pass : {Pass::Forward, Pass::GradInput, Pass::GradWeight}) {
      std::vector<ConvAlgo> algos = algorithms(pass);
      algos.push_back(ConvAlgo::Auto);  // last: it reads the forced rows' times
      for (ConvAlgo a : algos) {
        const std::string name = std::string("BM_Conv/") + p.name + "/" + pass_name(pass) + "/" +
                                 (a == ConvAlgo::Auto ? "auto" : kiln::detail::conv_algo_name(a));
        benchmark::RegisterBenchmark(name.c_str(), BM_Conv, p, pass, a)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
  return true;
}();

// ------------------------------------------------------------------------------------ CUDA

// Seconds per call of f, called `reps` times after one untimed call, the device synchronized.
template <typename F>
double device_seconds(int reps, const F& f) {
  f();
  kiln::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  kiln::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
}

// The algorithms lib/ops/conv.cpp can run each pass with on a CUDA device.
std::vector<ConvAlgo> cuda_algorithms(Pass p) {
  if (p == Pass::Forward) return {ConvAlgo::Im2col, ConvAlgo::WeightGrad, ConvAlgo::Im2colL2};
  return {ConvAlgo::Im2col, ConvAlgo::Im2colL2};
}

// `algo` Auto: the chooser's pick, after a first call that measures and remembers it.
void BM_CudaConv(benchmark::State& state, const ConvProblem& p, Pass pass, ConvAlgo algo) {
  if (!kiln::cuda::is_available()) {
    state.SkipWithError("no usable CUDA device");
    return;
  }
  kiln::manual_seed(0);
  kiln::LazyGuard eager(false);
  ConvOperands in(p);
  in.x = in.x.to(kiln::kCUDA);
  in.w = in.w.to(kiln::kCUDA);
  in.gy = in.gy.to(kiln::kCUDA);
  ForcedAlgo forced(algo);
  if (algo == ConvAlgo::Auto) kiln::detail::clear_conv_choices();
  // Device ops record (even eagerly); eval runs them. First: the chooser's measurements, kernel
  // loading.
  kiln::eval({run_pass(pass, p, in)});
  const ConvAlgo ran = kiln::detail::last_conv_algo();
  if (algo != ConvAlgo::Auto && ran != algo) {
    state.SkipWithError("the forced algorithm cannot run this problem");
    return;
  }
  kiln::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) kiln::eval({run_pass(pass, p, in)});  // launches; no per-call sync
  kiln::cuda::synchronize();
  const double per_call =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(state.iterations());
  // The pass's GEMM alone: operands of its shapes (values do not matter to its time).
  const kiln::detail::ConvGeom g{p.N,       p.C, p.H, p.W,   p.O,   p.k, p.k, p.out_h(),
                                 p.out_w(), 1,   1,   p.pad, p.pad, 1,   1,   1};
  const int64_t K = g.K(), NL = g.N * g.L();
  using kiln::detail::cuda_conv::ConvPass;
  const ConvPass cp = pass == Pass::Forward     ? ConvPass::Forward
                      : pass == Pass::GradInput ? ConvPass::GradInput
                                                : ConvPass::GradWeight;
  const Shape a = pass == Pass::GradWeight ? Shape{p.O, NL} : Shape{p.O, K};
  const Shape b = pass == Pass::Forward     ? Shape{K, NL}
                  : pass == Pass::GradInput ? Shape{p.O, NL}
                                            : Shape{K, NL};
  const Shape c = pass == Pass::Forward     ? Shape{p.O, NL}
                  : pass == Pass::GradInput ? Shape{K, NL}
                                            : Shape{p.O, K};
  const Tensor ta = kiln::zeros(a, kiln::kCUDA), tb = kiln::zeros(b, kiln::kCUDA);
  Tensor tc = kiln::zeros(c, kiln::kCUDA);
  const void *pa = ta.raw_data_ptr(), *pb = tb.raw_data_ptr();
  void* pc = tc.raw_data_ptr();
  const double gemm = device_seconds(
      10, [&] { kiln::detail::cuda_conv::pass_gemm(cp, g, kiln::kFloat32, 0, pa, pb, pc); });
  kiln::bench::set_flops(state, p.flops());
  state.counters["gemm_ms"] = gemm * 1e3;
  state.counters["vs_gemms"] = per_call / gemm;
  state.SetLabel(std::string(algo == ConvAlgo::Auto ? "chose " : "forced ") +
                 kiln::detail::conv_algo_name(ran));
}

const bool kCudaConvRegistered = [] {
  auto add = [](const ConvProblem& p) {
    for (Pass pass : {Pass::Forward, Pass::GradInput, Pass::GradWeight}) {
      std::vector<ConvAlgo> algos = cuda_algorithms(pass);
      algos.push_back(ConvAlgo::Auto);
      for (ConvAlgo a : algos) {
        std::string name = std::string("BM_CudaConv/") + p.name + "/" + pass_name(pass);
        if (a != ConvAlgo::Auto) name += std::string("/") + kiln::detail::conv_algo_name(a);
        benchmark::RegisterBenchmark(name.c_str(), BM_CudaConv, p, pass, a)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  };
  for (const ConvProblem& p : kProblems) add(p);
  for (const ConvProblem& p : kResNetProblems) add(p);
  return true;
}();

// ----------------------------------------------------------------- ResNet-18 training step

enum class StepMode { Eager, Lazy, Traced };
// The eager step's wall and CPU seconds, per device type (the reference of the later rows).
std::map<kiln::DeviceType, std::pair<double, double>> g_resnet_eager_seconds;

// CPU seconds of every thread of the process (user and system): on the shared, loaded dev VM the
// wall time mostly measures the other processes; the work done shows here.
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

void resnet18_train_step(benchmark::State& state, StepMode mode, kiln::Device device) {
  constexpr int64_t B = 32, S = 64, kClasses = 200;  // Tiny ImageNet's size and classes
  if (device.is_cuda() && !kiln::cuda::is_available()) {
    state.SkipWithError("no usable CUDA device");
    return;
  }
  kiln::manual_seed(0);
  std::shared_ptr<kiln::nn::Module> model =
      kiln::examples::make_resnet(kiln::examples::resnet18_arch(kClasses));
  model->to(device);
  kiln::optim::Adam adam(model->parameters(), kiln::optim::AdamOptions{1e-3});
  Tensor x = kiln::randn({B, 3, S, S}).to(device);
  Tensor y = kiln::randint(kClasses, {B}).to(device);
  kiln::LazyGuard lazy(mode != StepMode::Eager);
  auto step = [&](const std::vector<Tensor>& in) {
    adam.zero_grad();
    Tensor loss = kiln::cross_entropy(model->forward(in[0]), in[1]);
    loss.backward();
    adam.step();
    return std::vector<Tensor>{loss.detach()};
  };
  kiln::jit::Function traced;
  if (mode == StepMode::Traced) traced = kiln::jit::trace(step, {x, y});
  auto run = [&] {
    return (mode == StepMode::Traced ? traced({x, y}) : step({x, y}))[0].item<float>();
  };
  // Two untimed steps: kernel compilation, the convolution chooser's measurements, first touches.
  run();
  run();
  // Under KILN_PROFILE the report then covers the timed steps alone.
  if (kiln::profiler::enabled()) kiln::profiler::reset();
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds();
  for (auto _ : state) benchmark::DoNotOptimize(run());
  const double steps = static_cast<double>(state.iterations());
  const double per_step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
  const double cpu_per_step = (process_cpu_seconds() - cpu_start) / steps;
  state.counters["step_s"] = per_step;
  state.counters["cpu_step_s"] = cpu_per_step;
  if (mode == StepMode::Eager) g_resnet_eager_seconds[device.type] = {per_step, cpu_per_step};
  auto eager = g_resnet_eager_seconds.find(device.type);
  if (mode != StepMode::Eager && eager != g_resnet_eager_seconds.end()) {
    state.counters["vs_eager"] = eager->second.first / per_step;
    state.counters["cpu_vs_eager"] = eager->second.second / cpu_per_step;
  }
  state.SetItemsProcessed(state.iterations() * B);
}
void BM_ResNet18TrainStep(benchmark::State& state, StepMode mode) {
  resnet18_train_step(state, mode, kiln::kCPU);
}
void BM_CudaResNet18TrainStep(benchmark::State& state, StepMode mode) {
  resnet18_train_step(state, mode, kiln::kCUDA);
}
BENCHMARK_CAPTURE(BM_ResNet18TrainStep, eager, StepMode::Eager)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ResNet18TrainStep, lazy, StepMode::Lazy)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ResNet18TrainStep, traced, StepMode::Traced)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CudaResNet18TrainStep, eager, StepMode::Eager)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CudaResNet18TrainStep, traced, StepMode::Traced)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
