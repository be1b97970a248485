// GPU benchmarks, each a ratio against a limit measured in the same run; on a machine without a
// GPU every BM_Cuda* benchmark but the compile ones reports "no CUDA device" and skips.
// tools/bench/gpu_peers.py runs the same workloads (same definitions) with torch eager,
// torch.compile and jax.jit; tools/gpu-check runs both.
// Device throughput: each timed iteration queues kCalls calls back to back and synchronizes once,
// so that the host's work of one call overlaps the device's work of the one before (as in a
// training loop); per_call_ms is the time of one call.
//   BM_CudaCopyFloor64M: device-to-device copy of 64M float32 (cuMemcpyDtoD): the floor. It runs
//     first (registration order); later rows print of_copy = their bytes/s / the floor's.
//   BM_CudaGelu64M: GELU (tanh form) from primitives on 64M float32, one fused kernel; bytes = read
//     x + write y. Target: of_copy >= 0.85.
//   BM_CudaSoftmax8192, BM_CudaLayerNorm8192: softmax and layer_norm written from primitives on
//     8192 x 8192 float32 along dim 1; bytes = read x + write y. Target: of_copy >= 0.80.
//   BM_CudaSoftmaxBackward8192, BM_CudaLayerNormBackward8192: their gradients (of x; layer_norm's
//     of w and b too) by autograd from an upstream gradient, the forward evaluated once; bytes =
//     read x and the upstream gradient, write x's gradient. Target: of_copy >= 0.70.
//   BM_CudaRowsPolicy/workload:W/threads:T/K:K/vec:V/cache_kib:C: the four row workloads above
//     (W 0-3) under another launch shape: blocks of T threads (256, 512), per_thread variant K (0:
//     the strided loop), 16-byte quad accesses (V 1, the vec variant) or one element per access
//     (V 0), and the strided loop's row caches within C KiB of shared memory a block (96: every
//     row several passes read; 32: one row of 8192 float32, as before).
//   BM_CudaLstmCell/{gemms,eager,traced}: an LSTM cell step (batch 64, input and hidden 1500)
//     forward and backward (gradients of the weights and bias by autograd::grad), eager kiln and
//     as a jit::trace; gemms: the step's six GEMMs alone (two forward, four backward).
//     vs_gemms = step / GEMMs (target for the traced step <= 1.1).
//   BM_CudaGemm/{cublas,kiln}: 4096^3 float32 through cuBLAS alone and through kiln's matmul;
//     vs_cublas on kiln's row (target <= 1/0.95).
//   BM_CudaReplay10Ops/{queued,synchronized}: a traced function of ten elementwise ops on one-
//     element device tensors (jit_bench's ten_ops), per call: queued back to back, and waiting
//     for each result; launches_per_call counts kiln's kernel launches. Target: <= 15 us.
//   BM_CudaMlpTrainStep/traced: a traced training step (784-1024-1024-10 MLP, batch 128, Adam)
//     whose parameters and batch live on the device; h2d_bytes and d2h_bytes per step (target 0).
//   BM_CudaNvrtcCompile: NVRTC compiling a new 10-op elementwise kernel (its 32-bit, 4-wide
//     variant) to a cubin for sm_90 (runs without a GPU; target <= 100 ms);
//     BM_CudaNvrtcCompileSoftmax: the same for a new softmax rows kernel;
//     BM_CudaNvrtcFirstBinary{,Softmax}: the same kernels' time to a runnable binary with tiered
//     compiles (the stand-in's compile; the wanted binary compiles in the background);
//     BM_CudaDiskCacheLoad: reading the 10-op cubin from the disk cache.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/cuda_blas.h"
#include "lib/cuda_driver.h"
#include "tools/bench/counters.h"

#ifdef KILN_HAS_CUDA
#include "fuser/cache.h"
#include "fuser/codegen/cuda/cuda_kernel.h"
#include "fuser/fuse.h"
#include "jit/ir.h"
#endif

namespace kiln::bench {
namespace {

constexpr int kCalls = 10;      // calls queued per timed iteration
double g_copy_bytes_per_s = 0;  // set by BM_CudaCopyFloor64M

bool skip_without_gpu(benchmark::State& state) {
  if (cuda::is_available()) return false;
  state.SkipWithError(("no CUDA device: " + detail::cuda::unavailable_reason()).c_str());
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Waits for the kernels compiling in the background, so that what is timed is what runs once
// they are ready (their stand-ins are the first calls' only).
void settle_compiles() {
#ifdef KILN_HAS_CUDA
  fuser::cuda::wait_for_background_compiles();
#endif
}

// Runs `call` kCalls times per iteration without waiting, then waits for the device; returns the
// seconds of one call and prints per_call_ms, bytes/s and of_copy (bytes: one call's).
template <typename F>
double queued(benchmark::State& state, double bytes, F&& call) {
  call();  // compiles (stand-ins first: fuser/codegen/cuda/cuda_kernel.h), warms the allocator
  settle_compiles();
  call();  // the compiled kernels replace their stand-ins
  cuda::synchronize(0);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) call();
    cuda::synchronize(0);
    total += seconds_since(t0);
  }
  const double per_call = total / static_cast<double>(state.iterations() * kCalls);
  state.counters["per_call_ms"] = per_call * 1e3;
  if (bytes > 0) {
    state.counters["bytes/s"] = bytes / per_call;
    if (g_copy_bytes_per_s > 0) state.counters["of_copy"] = bytes / per_call / g_copy_bytes_per_s;
  }
  return per_call;
}

constexpr int64_t k64M = int64_t{64} << 20;

// A normal random tensor on cuda:0, made once per process for each shape and tag (drawing 64M
// numbers on the host takes longer than a benchmark's measurement).
Tensor device_randn(const Shape& shape, int tag = 0) {
  static std::map<std::pair<Shape, int>, Tensor> made;
  auto [at, fresh] = made.try_emplace({shape, tag});
  if (fresh) at->second = randn(shape).to(kCUDA);
  return at->second.detach();
}

void BM_CudaCopyFloor64M(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor a = device_randn({k64M}), b = empty({k64M}, kCUDA);
  void* src = a.raw_data_ptr();
  void* dst = b.raw_data_ptr();
  const double bytes = 2.0 * static_cast<double>(k64M) * 4;
  const double per_call = queued(state, bytes, [&] {
    detail::cuda::copy_on_device(0, dst, src, static_cast<size_t>(k64M) * 4);
  });
  g_copy_bytes_per_s = bytes / per_call;
}
BENCHMARK(BM_CudaCopyFloor64M)->Unit(benchmark::kMillisecond)->UseRealTime();

Tensor gelu_from_primitives(const Tensor& x) {
  return 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
}

Tensor softmax_from_primitives(const Tensor& x) {
  Tensor e = exp(x - x.amax({1}, true));
  return e / e.sum({1}, true);
}

Tensor layer_norm_from_primitives(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor d = x - x.mean({1}, true);
  return d * rsqrt((d * d).mean({1}, true) + 1e-5) * w + b;
}

void BM_CudaGelu64M(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = device_randn({k64M});
  queued(state, 2.0 * static_cast<double>(k64M) * 4, [&] { eval(gelu_from_primitives(x)); });
}
BENCHMARK(BM_CudaGelu64M)->Unit(benchmark::kMillisecond)->UseRealTime();

constexpr int64_t kRows = 8192;
constexpr double kRowBytes = 2.0 * kRows * kRows * 4;  // read x, write y

void BM_CudaSoftmax8192(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = device_randn({kRows, kRows});
  queued(state, kRowBytes, [&] { eval(softmax_from_primitives(x)); });
}
BENCHMARK(BM_CudaSoftmax8192)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CudaLayerNorm8192(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = device_randn({kRows, kRows});
  Tensor w = device_randn({kRows}, 1), b = device_randn({kRows}, 2);
  queued(state, kRowBytes, [&] { eval(layer_norm_from_primitives(x, w, b)); });
}
BENCHMARK(BM_CudaLayerNorm8192)->Unit(benchmark::kMillisecond)->UseRealTime();

// The gradients of `y` (evaluated once, its graph kept) with respect to `wrt`, from `g`.
void backward_rows(benchmark::State& state, const Tensor& y, const std::vector<Tensor>& wrt,
                   const Tensor& g) {
  eval(y);
  queued(state, 1.5 * kRowBytes, [&] { eval(autograd::grad({y}, wrt, {g}, true)); });
}

void BM_CudaSoftmaxBackward8192(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = device_randn({kRows, kRows}).requires_grad_(true);
  backward_rows(state, softmax_from_primitives(x), {x}, device_randn({kRows, kRows}, 1));
}
BENCHMARK(BM_CudaSoftmaxBackward8192)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CudaLayerNormBackward8192(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = device_randn({kRows, kRows}).requires_grad_(true);
  Tensor w = device_randn({kRows}, 1).requires_grad_(true);
  Tensor b = device_randn({kRows}, 2).requires_grad_(true);
  backward_rows(state, layer_norm_from_primitives(x, w, b), {x, w, b},
                device_randn({kRows, kRows}, 1));
}
BENCHMARK(BM_CudaLayerNormBackward8192)->Unit(benchmark::kMillisecond)->UseRealTime();

#ifdef KILN_HAS_CUDA
// The four row workloads above under other launch shapes (fuser::cuda::CudaRowsPolicy): a block
// of max_threads threads, with the per_thread variant's least K that covers a row (8192 /
// max_threads positions in registers; arg K 64), or the generic strided loop (K 0); each with the
// vec variant (16-byte loads and stores of a row's quads) or the scalar one, and the strided
// loop's row caches within cache_kib KiB (32 KiB: x's row only). Picks the default;
// figures in tools/bench/RESULTS.md. 128 and 1024 threads lost on every workload there (second
// session on the H100), so the sweep leaves them out to stay near a minute with the vec axis.
void BM_CudaRowsPolicy(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int64_t workload = state.range(0);
  fuser::cuda::CudaRowsPolicy policy;
  policy.max_threads = static_cast<int>(state.range(1));
  policy.max_per_thread = static_cast<int>(state.range(2));
  policy.registers_without_columns = true;
  policy.vec = state.range(3) != 0;
  policy.row_cache_bytes = state.range(4) * 1024;
  const fuser::cuda::CudaRowsPolicy before = fuser::cuda::cuda_rows_policy();
  fuser::cuda::set_cuda_rows_policy(policy);
  Tensor x = device_randn({kRows, kRows}).requires_grad_(workload >= 2);
  Tensor w = device_randn({kRows}, 1).requires_grad_(workload == 3);
  Tensor b = device_randn({kRows}, 2).requires_grad_(workload == 3);
  if (workload == 0) queued(state, kRowBytes, [&] { eval(softmax_from_primitives(x)); });
  if (workload == 1) queued(state, kRowBytes, [&] { eval(layer_norm_from_primitives(x, w, b)); });
  if (workload == 2)
    backward_rows(state, softmax_from_primitives(x), {x}, device_randn({kRows, kRows}, 1));
  if (workload == 3)
    backward_rows(state, layer_norm_from_primitives(x, w, b), {x, w, b},
                  device_randn({kRows, kRows}, 1));
  fuser::cuda::set_cuda_rows_policy(before);
}
BENCHMARK(BM_CudaRowsPolicy)
    ->ArgNames({"workload", "threads", "K", "vec", "cache_kib"})
    ->ArgsProduct({{0, 1, 2, 3}, {256, 512}, {0, 64}, {0, 1}, {96}})
    ->ArgsProduct({{0, 1, 2, 3}, {256, 512}, {0}, {0, 1}, {32}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#endif

std::vector<Tensor> lstm_step(const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &h = in[1], &c = in[2], &wx = in[3], &wh = in[4], &b = in[5];
  std::vector<Tensor> gates = (x.matmul(wx) + h.matmul(wh) + b).chunk(4, 1);
  Tensor i = sigmoid(gates[0]), f = sigmoid(gates[1]), g = tanh(gates[2]), o = sigmoid(gates[3]);
  Tensor c2 = f * c + i * g;
  Tensor h2 = o * tanh(c2);
  return {h2, c2};
}

enum class LstmMode { Gemms, Eager, Traced };
double g_lstm_gemms_s = 0;

void BM_CudaLstmCell(benchmark::State& state, LstmMode mode) {
  if (skip_without_gpu(state)) return;
  const int64_t B = 64, H = 1500;
  Tensor x = randn({B, H}).to(kCUDA), h = randn({B, H}).to(kCUDA), c = randn({B, H}).to(kCUDA);
  Tensor wx = (randn({H, 4 * H}) * 0.02).to(kCUDA).requires_grad_(true);
  Tensor wh = (randn({H, 4 * H}) * 0.02).to(kCUDA).requires_grad_(true);
  Tensor b = zeros({4 * H}, kCUDA).requires_grad_(true);
  const std::vector<Tensor> inputs{x, h, c, wx, wh, b};
  jit::Function f;
  if (mode == LstmMode::Traced) f = jit::trace(lstm_step, inputs);
  const Tensor dgates = randn({B, 4 * H}).to(kCUDA);
  auto step = [&] {
    if (mode == LstmMode::Gemms) {  // forward x.wx, h.wh; backward of both operands of each
      eval({x.matmul(wx.detach()), h.matmul(wh.detach()), dgates.matmul(wx.detach().t()),
            dgates.matmul(wh.detach().t()), x.t().matmul(dgates), h.t().matmul(dgates)});
      return;
    }
    std::vector<Tensor> out = mode == LstmMode::Traced ? f(inputs) : lstm_step(inputs);
    eval(autograd::grad({out[0].sum() + out[1].sum()}, {wx, wh, b}));
  };
  const double per = queued(state, 0, step);
  if (mode == LstmMode::Gemms) g_lstm_gemms_s = per;
  if (mode != LstmMode::Gemms && g_lstm_gemms_s > 0)
    state.counters["vs_gemms"] = per / g_lstm_gemms_s;
}
BENCHMARK_CAPTURE(BM_CudaLstmCell, gemms, LstmMode::Gemms)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CudaLstmCell, eager, LstmMode::Eager)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CudaLstmCell, traced, LstmMode::Traced)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

double g_cublas_s = 0;

void BM_CudaGemm(benchmark::State& state, bool through_kiln) {
  if (skip_without_gpu(state)) return;
  const int64_t n = 4096;
  Tensor a = device_randn({n, n}), b = device_randn({n, n}, 1), c = empty({n, n}, kCUDA);
  const double per = queued(state, 0, [&] {
    if (through_kiln) {
      eval(a.matmul(b));
    } else {
      detail::cuda::gemm(0, kFloat32, 'N', 'N', n, n, n, 1.0, a.raw_data_ptr(), n, 0,
                         b.raw_data_ptr(), n, 0, 0.0, c.raw_data_ptr(), n, 0, 1);
    }
  });
  state.counters["flop/s"] = 2.0 * n * n * n / per;
  if (!through_kiln) g_cublas_s = per;
  if (through_kiln && g_cublas_s > 0) state.counters["vs_cublas"] = per / g_cublas_s;
}
BENCHMARK_CAPTURE(BM_CudaGemm, cublas, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CudaGemm, kiln, true)->Unit(benchmark::kMillisecond)->UseRealTime();

// jit_bench's ten_ops: scalars, unary ops and the input itself.
std::vector<Tensor> ten_ops(const std::vector<Tensor>& in) {
  const Tensor& x = in[0];
  Tensor y = tanh(x * 1.5 + 0.25) * 2.0 - 0.5;
  y = -(sigmoid(y) * x + x);
  return {exp(y)};
}

void BM_CudaReplay10Ops(benchmark::State& state, bool wait_each) {
  if (skip_without_gpu(state)) return;
  const Tensor x = randn({1}).to(kCUDA);
  jit::Function f = jit::trace(ten_ops, {x});
  eval(f({x}));
  settle_compiles();
  eval(f({x}));
  cuda::synchronize(0);
  const int64_t launches = detail::cuda::launch_count();
  const detail::cuda::TransferCounts moved = detail::cuda::transfer_counts();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    Tensor y = f({x})[0];
    eval(y);
    if (wait_each) cuda::synchronize(0);
  }
  cuda::synchronize(0);
  const double calls = static_cast<double>(state.iterations());
  state.counters["us_per_call"] = seconds_since(t0) * 1e6 / calls;
  state.counters["launches_per_call"] =
      static_cast<double>(detail::cuda::launch_count() - launches) / calls;
  state.counters["h2d_bytes_per_call"] =
      static_cast<double>(detail::cuda::transfer_counts().host_to_device - moved.host_to_device) /
      calls;
}
BENCHMARK_CAPTURE(BM_CudaReplay10Ops, queued, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaReplay10Ops, synchronized, true)->Unit(benchmark::kMicrosecond);

// A traced MLP training step on the device: nothing moves between host and device per step.
void BM_CudaMlpTrainStep(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  manual_seed(0);
  nn::Sequential model({std::make_shared<nn::Linear>(784, 1024), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(1024, 1024), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(1024, 10)});
  model.to(kCUDA);
  optim::Adam adam(model.parameters(), optim::AdamOptions{1e-3});
  const Tensor x = randn({128, 784}).to(kCUDA), y = randint(10, {128}).to(kCUDA);
  jit::Function step = jit::trace(
      [&](const std::vector<Tensor>& in) {
        adam.zero_grad();
        Tensor loss = cross_entropy(model.forward(in[0]), in[1]);
        loss.backward();
        adam.step();
        return std::vector<Tensor>{loss.detach()};
      },
      {x, y});
  for (int i = 0; i < 3; ++i) eval(step({x, y}));  // traces, compiles, settles the allocator
  cuda::synchronize(0);
  const detail::cuda::TransferCounts before = detail::cuda::transfer_counts();
  const double per = queued(state, 0, [&] { eval(step({x, y})); });
  const detail::cuda::TransferCounts after = detail::cuda::transfer_counts();
  const double steps = static_cast<double>(state.iterations() * kCalls + 1);
  state.counters["step_ms"] = per * 1e3;
  state.counters["h2d_bytes"] =
      static_cast<double>(after.host_to_device - before.host_to_device) / steps;
  state.counters["d2h_bytes"] =
      static_cast<double>(after.device_to_host - before.device_to_host) / steps;
}
BENCHMARK(BM_CudaMlpTrainStep)->Unit(benchmark::kMillisecond)->UseRealTime();

#ifdef KILN_HAS_CUDA
// A 10-op elementwise kernel whose structure differs per `variant` (the op order rotates and a
// literal's position moves), so each call is a cache miss.
fuser::FusionGroup ten_op_group(int64_t variant) {
  static const char* ops[] = {"exp", "tanh", "neg", "sigmoid", "sin", "abs", "sqrt", "cos"};
  jit::Graph g;
  const jit::ValueType type{kFloat32, {1024}};
  jit::Value* v = g.add_input(type);
  jit::Value* w = g.add_input(type);
  for (int64_t k = 0; k < 10; ++k) {
    const int64_t pick = (variant >> (k % 8)) + k;
    if (pick % 3 == 0)
      v = g.create("add", {v, w}, {int64_t{1}}, {type})->output();
    else
      v = g.create(ops[pick % 8], {v}, {}, {type})->output();
  }
  v = g.create("mul", {v, g.constant(static_cast<double>(variant), kFloat32)}, {}, {type})
          ->output();
  g.add_output(v);
  return fuser::find_groups(g).at(0);
}

// Variants start from the clock, so that no earlier run left them in the disk cache.
std::atomic<int64_t> g_variant{
    static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() & 0xffffff) +
    1};

void BM_CudaNvrtcCompile(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    const fuser::FusionGroup group = ten_op_group(g_variant++);
    fuser::Layout layout;
    layout.single_element.assign(group.kernel.input_types.size(), false);
    state.ResumeTiming();
    // The variant of an aligned call under 2^31 elements: what a model meets.
    benchmark::DoNotOptimize(fuser::cuda::cuda_binary(group.kernel, layout, {true, true}, 90));
  }
}
BENCHMARK(BM_CudaNvrtcCompile)->Unit(benchmark::kMillisecond)->Iterations(20);

// A softmax along rows of [64, 1024] float32 (amax, exp, sum, div: one rows kernel), after 16
// neg or abs picked by the bits of `variant`, so that each call is a cache miss at the cost of
// the softmax alone.
fuser::FusionGroup softmax_group(int64_t variant) {
  jit::Graph g;
  const jit::ValueType type{kFloat32, {64, 1024}}, row{kFloat32, {64, 1}};
  jit::Value* v = g.add_input(type);
  for (int k = 0; k < 16; ++k)
    v = g.create((variant >> k) & 1 ? "neg" : "abs", {v}, {}, {type})->output();
  jit::Value* m = g.create("amax", {v}, {std::vector<int64_t>{1}, true}, {row})->output();
  jit::Value* d = g.create("sub", {v, m}, {int64_t{1}}, {type})->output();
  jit::Value* e = g.create("exp", {d}, {}, {type})->output();
  jit::Value* s =
      g.create("sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, {row})->output();
  g.add_output(g.create("div", {e, s}, {}, {type})->output());
  for (fuser::FusionGroup& group : fuser::find_groups(g))
    if (group.rows) return group;
  KILN_FAIL("bench: the softmax has no rows group");
}

fuser::Layout rows_layout(const fuser::FusionGroup& group) {
  fuser::Layout layout;
  layout.flat = false;
  layout.rows = true;
  layout.rank = 1;
  layout.inner.assign(group.kernel.input_types.size() + group.kernel.outputs.size(),
                      fuser::Layout::kUnit);
  return layout;
}

void BM_CudaNvrtcCompileSoftmax(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    const fuser::FusionGroup group = softmax_group(g_variant++);
    const fuser::Layout layout = rows_layout(group);
    state.ResumeTiming();
    benchmark::DoNotOptimize(fuser::cuda::cuda_binary(group.kernel, layout, {true, false}, 90));
  }
}
BENCHMARK(BM_CudaNvrtcCompileSoftmax)->Unit(benchmark::kMillisecond)->Iterations(10);

// What a launch of a new kernel waits for with tiered compiles (on by default): the stand-in's
// compile, while the wanted binary compiles on a background thread (waited for untimed, so that
// iterations do not share the cores). stand_ins counts the stand-ins served (one per iteration).
void first_binary(benchmark::State& state, bool rows) {
  fuser::cuda::set_cuda_tiered_compile(true);
  const int64_t before = fuser::cuda::cuda_compile_stats().stand_ins;
  for (auto _ : state) {
    state.PauseTiming();
    fuser::cuda::wait_for_background_compiles();
    const fuser::FusionGroup group = rows ? softmax_group(g_variant++) : ten_op_group(g_variant++);
    fuser::Layout layout = rows ? rows_layout(group) : fuser::Layout{};
    if (!rows) layout.single_element.assign(group.kernel.input_types.size(), false);
    state.ResumeTiming();
    benchmark::DoNotOptimize(fuser::cuda::cuda_binary_now(group.kernel, layout, {true, !rows}, 90));
  }
  fuser::cuda::wait_for_background_compiles();
  state.counters["stand_ins"] =
      static_cast<double>(fuser::cuda::cuda_compile_stats().stand_ins - before);
}
void BM_CudaNvrtcFirstBinary(benchmark::State& state) {
  first_binary(state, false);
}
BENCHMARK(BM_CudaNvrtcFirstBinary)->Unit(benchmark::kMillisecond)->Iterations(20);
void BM_CudaNvrtcFirstBinarySoftmax(benchmark::State& state) {
  first_binary(state, true);
}
BENCHMARK(BM_CudaNvrtcFirstBinarySoftmax)->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_CudaDiskCacheLoad(benchmark::State& state) {
  const fuser::FusionGroup group = ten_op_group(g_variant++);
  fuser::Layout layout;
  layout.single_element.assign(group.kernel.input_types.size(), false);
  fuser::cuda::cuda_binary(group.kernel, layout, {true, true}, 90);  // compiles and stores it
  // The disk files a binary under its source (cuda_kernel.h).
  const std::string symbol =
      fuser::kernel_symbol(fuser::kernel_key(group.kernel, layout), group.kernel);
  const std::string key = fuser::cuda::cuda_disk_key(
      fuser::cuda::cuda_source(group.kernel, layout, symbol, {true, true}), 90, false);
  if (!fuser::DiskCache::instance().load(key, fuser::kCudaBinary)) {
    state.SkipWithError("the disk cache is off (KILN_CACHE=0 or an unwritable directory)");
    return;
  }
  for (auto _ : state)
    benchmark::DoNotOptimize(fuser::DiskCache::instance().load(key, fuser::kCudaBinary));
}
BENCHMARK(BM_CudaDiskCacheLoad)->Unit(benchmark::kMicrosecond);
#endif

}  // namespace
}  // namespace kiln::bench
