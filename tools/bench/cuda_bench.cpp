// GPU benchmarks (issue 8), each a ratio against a limit measured in the same run; on a machine
// without a GPU every BM_Cuda* benchmark but the compile ones reports "no CUDA device" and skips.
//   BM_CudaCopyFloor64M: device-to-device copy of 64M float32 (cuMemcpyDtoD): the floor. It runs
//     first (registration order); later rows print of_copy = their bytes/s / the floor's.
//   BM_CudaGelu64M: GELU (tanh form) from primitives on 64M float32, one fused kernel; bytes = read
//     x + write y. Target: of_copy >= 0.85.
//   BM_CudaSoftmax8192, BM_CudaLayerNorm8192: 8192 x 8192 float32 along dim 1; bytes = read x +
//     write y. Target: time within 1.3x of the copy floor (of_copy >= 0.77).
//   BM_CudaLstmCell/{eager,traced}: an LSTM cell step (batch 64, input and hidden 1500) forward and
//     backward, eager kiln against the same step as a jit::trace; vs_eager on the traced row.
//   BM_CudaGemm/{cublas,kiln}: 4096^3 float32 through cuBLAS alone and through kiln's matmul;
//     vs_cublas on kiln's row.
//   BM_CudaNvrtcCompile: NVRTC compiling a new 10-op elementwise kernel (its 32-bit, 4-wide
//     variant) to a cubin for sm_90 (runs without a GPU); BM_CudaNvrtcCompileSoftmax: the same
//     for a new softmax rows kernel; BM_CudaDiskCacheLoad: finding the 10-op cubin in the disk
//     cache.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
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

double g_copy_bytes_per_s = 0;  // set by BM_CudaCopyFloor64M

bool skip_without_gpu(benchmark::State& state) {
  if (cuda::is_available()) return false;
  state.SkipWithError(("no CUDA device: " + detail::cuda::unavailable_reason()).c_str());
  return true;
}

// Evaluates t and waits for the device.
void finish(const Tensor& t) {
  eval(t);
  cuda::synchronize(t.device().index);
}

// Times the loop by wall clock (the device runs asynchronously; each iteration ends synchronized)
// and prints bytes/s and of_copy.
template <typename F>
void timed(benchmark::State& state, double bytes, F&& body) {
  double best = 1e30, total = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
    ++n;
  }
  set_bytes(state, bytes);
  const double rate = bytes * static_cast<double>(n) / total;
  if (g_copy_bytes_per_s > 0) state.counters["of_copy"] = rate / g_copy_bytes_per_s;
  state.counters["best_ms"] = best * 1e3;
}

void BM_CudaCopyFloor64M(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int64_t n = int64_t{64} << 20;
  Tensor a = randn({n}).to(kCUDA), b = empty({n}, kCUDA);
  void* src = a.raw_data_ptr();
  void* dst = b.raw_data_ptr();
  const double bytes = 2.0 * static_cast<double>(n) * 4;
  double total = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    detail::cuda::copy_on_device(0, dst, src, static_cast<size_t>(n) * 4);
    cuda::synchronize(0);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
  }
  set_bytes(state, bytes);
  g_copy_bytes_per_s = bytes * static_cast<double>(iters) / total;
}
BENCHMARK(BM_CudaCopyFloor64M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CudaGelu64M(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int64_t n = int64_t{64} << 20;
  Tensor x = randn({n}).to(kCUDA);
  timed(state, 2.0 * static_cast<double>(n) * 4, [&] {
    Tensor y = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
    finish(y);
  });
}
BENCHMARK(BM_CudaGelu64M)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CudaSoftmax8192(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = randn({8192, 8192}).to(kCUDA);
  timed(state, 2.0 * 8192 * 8192 * 4, [&] { finish(softmax(x, 1)); });
}
BENCHMARK(BM_CudaSoftmax8192)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CudaLayerNorm8192(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  Tensor x = randn({8192, 8192}).to(kCUDA);
  Tensor w = randn({8192}).to(kCUDA), b = randn({8192}).to(kCUDA);
  timed(state, 2.0 * 8192 * 8192 * 4, [&] { finish(layer_norm(x, {8192}, w, b)); });
}
BENCHMARK(BM_CudaLayerNorm8192)->Unit(benchmark::kMillisecond)->UseRealTime();

double g_lstm_eager_s = 0;

std::vector<Tensor> lstm_step(const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &h = in[1], &c = in[2], &wx = in[3], &wh = in[4], &b = in[5];
  std::vector<Tensor> gates = (x.matmul(wx) + h.matmul(wh) + b).chunk(4, 1);
  Tensor i = sigmoid(gates[0]), f = sigmoid(gates[1]), g = tanh(gates[2]), o = sigmoid(gates[3]);
  Tensor c2 = f * c + i * g;
  Tensor h2 = o * tanh(c2);
  return {h2, c2};
}

void BM_CudaLstmCell(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const bool traced = state.range(0) == 1;
  const int64_t B = 64, H = 1500;
  Tensor x = randn({B, H}).to(kCUDA), h = randn({B, H}).to(kCUDA), c = randn({B, H}).to(kCUDA);
  Tensor wx = (randn({H, 4 * H}) * 0.02).to(kCUDA).requires_grad_(true);
  Tensor wh = (randn({H, 4 * H}) * 0.02).to(kCUDA).requires_grad_(true);
  Tensor b = zeros({4 * H}, kCUDA).requires_grad_(true);
  std::vector<Tensor> inputs{x, h, c, wx, wh, b};
  jit::Function f;
  if (traced) f = jit::trace(lstm_step, inputs);
  double total = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> out = traced ? f(inputs) : lstm_step(inputs);
    Tensor loss = out[0].sum() + out[1].sum();
    loss.backward();
    finish(wx.grad());
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++n;
    wx.mutable_grad().zero_();
    wh.mutable_grad().zero_();
    b.mutable_grad().zero_();
  }
  const double per = total / static_cast<double>(n);
  if (!traced) g_lstm_eager_s = per;
  if (traced && g_lstm_eager_s > 0) state.counters["vs_eager"] = per / g_lstm_eager_s;
}
BENCHMARK(BM_CudaLstmCell)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("traced")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

double g_cublas_s = 0;

void BM_CudaGemm(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const bool through_kiln = state.range(0) == 1;
  const int64_t n = 4096;
  Tensor a = randn({n, n}).to(kCUDA), b = randn({n, n}).to(kCUDA), c = empty({n, n}, kCUDA);
  double total = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    if (through_kiln) {
      finish(a.matmul(b));
    } else {
      detail::cuda::gemm(0, kFloat32, 'N', 'N', n, n, n, 1.0, a.raw_data_ptr(), n, 0,
                         b.raw_data_ptr(), n, 0, 0.0, c.raw_data_ptr(), n, 0, 1);
      cuda::synchronize(0);
    }
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
  }
  const double per = total / static_cast<double>(iters);
  set_flops(state, 2.0 * n * n * n);
  if (!through_kiln) g_cublas_s = per;
  if (through_kiln && g_cublas_s > 0) state.counters["vs_cublas"] = per / g_cublas_s;
}
BENCHMARK(BM_CudaGemm)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("kiln")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

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

void BM_CudaNvrtcCompileSoftmax(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    const fuser::FusionGroup group = softmax_group(g_variant++);
    fuser::Layout layout;
    layout.flat = false;
    layout.rows = true;
    layout.rank = 1;
    layout.inner.assign(group.kernel.input_types.size() + group.kernel.outputs.size(),
                        fuser::Layout::kUnit);
    state.ResumeTiming();
    benchmark::DoNotOptimize(fuser::cuda::cuda_binary(group.kernel, layout, {true, false}, 90));
  }
}
BENCHMARK(BM_CudaNvrtcCompileSoftmax)->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_CudaDiskCacheLoad(benchmark::State& state) {
  const fuser::FusionGroup group = ten_op_group(g_variant++);
  fuser::Layout layout;
  layout.single_element.assign(group.kernel.input_types.size(), false);
  fuser::cuda::cuda_binary(group.kernel, layout, {true, true}, 90);  // compiles and stores it
  const std::string key = fuser::cuda::cuda_binary_key(group.kernel, layout, {true, true}, 90);
  if (!fuser::DiskCache::instance().enabled()) {
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
