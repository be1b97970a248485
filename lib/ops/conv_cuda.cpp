// Convolutions and pools on a CUDA device (see conv_cuda.h): the layouts and GEMMs of conv.cpp's
// im2col formulation, with the data movement as hand-written CUDA C kernels that NVRTC compiles
// (through the CUDA code generator's cache: DeviceKernels::source_kernel) and the GEMMs on cuBLAS.
//
// Layouts, as on the CPU: cols [G, K, N * L] (row (c, i, j) of channel c and kernel tap (i, j),
// column (n, oh, ow)), so each pass is one GEMM strided-batched over the groups with the whole
// batch in its N dimension; the output gradient enters the GEMMs regrouped as [G, O / G, N * L]
// (the group kernel) and the forward GEMM's result leaves as [N, O, oH, oW] (the ungroup kernel);
// with one image both layouts are the same bytes and neither kernel runs. Layout::PerImage reads
// the same cols per image instead (leading dimension N * L, batch stride L), so that its GEMMs
// write y and read gy in NCHW and neither kernel runs (see conv_cuda.h).
//
// Every kernel is a grid-stride loop over its outputs, one thread an element (im2col: a column of a
// band of rows), with no shared memory or block synchronization: col2im and the average pools'
// backward gather (each input pixel sums the columns or windows that read it, in the CPU kernels'
// order, so without atomics and bit for bit as the CPU computes them); only max_pool2d's backward
// scatters with atomic adds, since its op carries the positions but not the windows. The same
// source compiles as host C++ (KILN_HOST_LAUNCH), which is how the tests run the kernels without a
// GPU.
#include "lib/ops/conv_cuda.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/error.h"
#include "lib/cuda_blas.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/tensor_impl.h"

namespace kiln::detail::cuda_conv {

namespace {

// ------------------------------------------------------------------------------ kernel sources

// The geometry every kernel takes (one by-value parameter): a convolution's or a pooling's sizes,
// flags (1: count_include_pad, 2: adaptive windows), the strides of the strided operand (im2col's
// input, the pools' input, the group kernel's output gradient) in elements, and whether index
// arithmetic needs 64 bits (wide). Each kernel's body is a template over its index type I: int
// where every offset and the grid-stride loop's last step fit (64-bit division and modulo cost
// GPUs many instructions), else long long; the geometry reaches the body as KilnGeomT<I>.
constexpr const char* kPrelude = R"(// kiln: lib/ops/conv_cuda.cpp
struct KilnGeom {
  long long N, C, H, W, oH, oW, kH, kW, sH, sW, pH, pW, dH, dW, G, flags;
  long long xs[4];
  long long wide;
  long long rows;  // im2col: the rows of cols one thread writes
};
#ifdef KILN_HOST_LAUNCH
#define __global__
#define KILN_DEVICE
struct kiln_dim3 { unsigned x; };
static kiln_dim3 blockIdx{0}, blockDim{1}, gridDim{1}, threadIdx{0};
template <typename V> static V atomicAdd(V* p, V v) { V old = *p; *p = old + v; return old; }
#else
#define KILN_DEVICE __device__
#endif
template <typename I> struct KilnGeomT {
  I N, C, H, W, oH, oW, kH, kW, sH, sW, pH, pW, dH, dW, G, flags;
  I xs[4];
  I rows;
};
template <typename I> static KILN_DEVICE KilnGeomT<I> kiln_geom(const KilnGeom& g) {
  const KilnGeomT<I> r = {(I)g.N,  (I)g.C,  (I)g.H,  (I)g.W,  (I)g.oH, (I)g.oW,
                          (I)g.kH, (I)g.kW, (I)g.sH, (I)g.sW, (I)g.pH, (I)g.pW,
                          (I)g.dH, (I)g.dW, (I)g.G,  (I)g.flags,
                          {(I)g.xs[0], (I)g.xs[1], (I)g.xs[2], (I)g.xs[3]}, (I)g.rows};
  return r;
}
#define KILN_FOR_EACH(e, n) \
  for (I e = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; e < (n); \
       e += (I)blockDim.x * (I)gridDim.x)
)";

struct KernelText {
  const char* base;                 // the name without its dtype and version
  std::vector<const char*> params;  // "type name", T being the value type
  const char* body;
};

// im2col: cols[r, q] for row r = (c * kH + i) * kW + j and column q = n * L + oh * oW + ow. Item e
// is column q = e % NL of the band of g.rows rows e / NL: the thread divides once for its column
// and its first row, then steps (c, i, j) row by row (integer division is what costs a GPU here),
// while neighbouring threads write neighbouring columns.
const KernelText kIm2col{"im2col",
                         {"long long n", "KilnGeom g", "const T* x", "T* cols"},
                         R"(  const I L = g.oH * g.oW, NL = g.N * L, RT = g.C * g.kH * g.kW;
  KILN_FOR_EACH(e, n) {
    const I band = e / NL, q = e % NL, img = q / L, l = q % L;
    const I h0 = l / g.oW * g.sH - g.pH, w0 = l % g.oW * g.sW - g.pW;
    const I r0 = band * g.rows, r1 = RT - r0 < g.rows ? RT : r0 + g.rows;
    I c = r0 / (g.kH * g.kW), i = r0 / g.kW % g.kH, j = r0 % g.kW;
    const T* const xn = x + img * g.xs[0];
    for (I r = r0; r < r1; ++r) {
      const I ih = h0 + i * g.dH, iw = w0 + j * g.dW;
      cols[r * NL + q] = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W
                             ? xn[c * g.xs[1] + ih * g.xs[2] + iw * g.xs[3]]
                             : (T)0;
      if (++j == g.kW) {
        j = 0;
        if (++i == g.kH) {
          i = 0;
          ++c;
        }
      }
    }
  }
)"};

// col2im: x[n, c, h, w] = the sum over kernel taps (i, j), in that order, of the column entry
// that read the pixel.
const KernelText kCol2im{"col2im",
                         {"long long n", "KilnGeom g", "const T* cols", "T* x"},
                         R"(  const I L = g.oH * g.oW, NL = g.N * L;
  KILN_FOR_EACH(e, n) {
    const I w = e % g.W, h = e / g.W % g.H, c = e / (g.W * g.H) % g.C;
    const I img = e / (g.W * g.H * g.C);
    T s = (T)0;
    // Unit strides (most convolutions) take no division; the test is the same for every thread.
    const bool unit = g.sH == 1 && g.sW == 1;
    for (I i = 0; i < g.kH; ++i) {
      const I hs = h + g.pH - i * g.dH;
      if (hs < 0 || (!unit && hs % g.sH != 0)) continue;
      const I oh = unit ? hs : hs / g.sH;
      if (oh >= g.oH) continue;
      for (I j = 0; j < g.kW; ++j) {
        const I ws = w + g.pW - j * g.dW;
        if (ws < 0 || (!unit && ws % g.sW != 0)) continue;
        const I ow = unit ? ws : ws / g.sW;
        if (ow >= g.oW) continue;
        s += cols[((c * g.kH + i) * g.kW + j) * NL + img * L + oh * g.oW + ow];
      }
    }
    x[e] = s;
  }
)"};

// group: out [G * O / G, N, L] from gy [N, O, oH, oW] at strides xs (C holds O here).
const KernelText kGroup{"conv_group",
                        {"long long n", "KilnGeom g", "const T* gy", "T* out"},
                        R"(  const I L = g.oH * g.oW;
  KILN_FOR_EACH(e, n) {
    const I l = e % L, img = e / L % g.N, o = e / (L * g.N);
    out[e] = gy[img * g.xs[0] + o * g.xs[1] + l / g.oW * g.xs[2] + l % g.oW * g.xs[3]];
  }
)"};

// ungroup: y [N, O, L] from the GEMM's [O, N, L] (C holds O here).
const KernelText kUngroup{"conv_ungroup",
                          {"long long n", "KilnGeom g", "const T* yg", "T* y"},
                          R"(  const I L = g.oH * g.oW;
  KILN_FOR_EACH(e, n) {
    const I l = e % L, o = e / L % g.C, img = e / (L * g.C);
    y[e] = yg[(o * g.N + img) * L + l];
  }
)"};

// The bias: y [N, O, L] += b[o] (b at stride xs[0]; C holds O here).
const KernelText kBias{"conv_bias",
                       {"long long n", "KilnGeom g", "const T* b", "T* y"},
                       R"(  KILN_FOR_EACH(e, n) {
    y[e] += b[e / (g.oH * g.oW) % g.C * g.xs[0]];
  }
)"};

// max_pool2d and adaptive_max_pool2d (flags & 2): the CPU kernel's loop per output element over
// the rows and columns pool_norm.cpp's max_span gives.
const KernelText kMaxPool{"max_pool2d",
                          {"long long n", "KilnGeom g", "const T* x", "T* out", "long long* index"},
                          R"(  KILN_FOR_EACH(e, n) {
    const I ow = e % g.oW, oh = e / g.oW % g.oH, plane = e / (g.oW * g.oH);
    const T* xp = x + plane / g.C * g.xs[0] + plane % g.C * g.xs[1];
    I h0 = oh * g.sH - g.pH, w0 = ow * g.sW - g.pW, kh = g.kH, kw = g.kW, dh = g.dH, dw = g.dW;
    if (g.flags & 2) {
      h0 = oh * g.H / g.oH;
      w0 = ow * g.W / g.oW;
      kh = ((oh + 1) * g.H + g.oH - 1) / g.oH - h0;
      kw = ((ow + 1) * g.W + g.oW - 1) / g.oW - w0;
      dh = dw = 1;
    }
    T best = -(T)1 / (T)0;
    I at = -1;
    for (I i = 0; i < kh; ++i) {
      const I h = h0 + i * dh;
      if (h < 0 || h >= g.H) continue;
      for (I j = 0; j < kw; ++j) {
        const I w = w0 + j * dw;
        if (w < 0 || w >= g.W) continue;
        const T v = xp[h * g.xs[2] + w * g.xs[3]];
        if (at < 0 || v > best || v != v) {
          best = v;
          at = h * g.W + w;
        }
      }
    }
    out[e] = best;
    index[e] = at;
  }
)"};

// max_pool2d's backward: gx (zeroed) += gy at each output's recorded position.
const KernelText kMaxPoolBackward{
    "max_pool2d_backward",
    {"long long n", "KilnGeom g", "const T* gy", "const long long* index", "T* gx"},
    R"(  KILN_FOR_EACH(e, n) {
    atomicAdd(gx + e / (g.oH * g.oW) * g.H * g.W + index[e], gy[e]);
  }
)"};

// The window of output (oh, ow) as pool_norm.cpp's pool_window computes it.
constexpr const char* kWindow = R"(
template <typename I> struct KilnWindow {
  I h0, h1, w0, w1;
  double divisor;
};
template <typename I>
static KILN_DEVICE KilnWindow<I> kiln_window(const KilnGeomT<I>& g, I oh, I ow) {
  KilnWindow<I> w;
  if (g.flags & 2) {
    w.h0 = oh * g.H / g.oH;
    w.h1 = ((oh + 1) * g.H + g.oH - 1) / g.oH;
    w.w0 = ow * g.W / g.oW;
    w.w1 = ((ow + 1) * g.W + g.oW - 1) / g.oW;
    w.divisor = (double)((w.h1 - w.h0) * (w.w1 - w.w0));
    return w;
  }
  const I h0 = oh * g.sH - g.pH, w0 = ow * g.sW - g.pW;
  I h1 = h0 + (g.kH - 1) * g.dH + 1, w1 = w0 + (g.kW - 1) * g.dW + 1;
  if (h1 > g.H + g.pH) h1 = g.H + g.pH;
  if (w1 > g.W + g.pW) w1 = g.W + g.pW;
  const double padded = (double)((h1 - h0) * (w1 - w0));
  w.h0 = h0 < 0 ? 0 : h0;
  w.w0 = w0 < 0 ? 0 : w0;
  w.h1 = h1 < g.H ? h1 : g.H;
  w.w1 = w1 < g.W ? w1 : g.W;
  w.divisor = (g.flags & 1) ? padded : (double)((w.h1 - w.h0) * (w.w1 - w.w0));
  return w;
}
)";

// avg_pool2d and adaptive_avg_pool2d: window sums in double over the divisor.
const KernelText kAvgPool{"avg_pool2d",
                          {"long long n", "KilnGeom g", "const T* x", "T* out"},
                          R"(  KILN_FOR_EACH(e, n) {
    const I ow = e % g.oW, oh = e / g.oW % g.oH, plane = e / (g.oW * g.oH);
    const T* xp = x + plane / g.C * g.xs[0] + plane % g.C * g.xs[1];
    const KilnWindow<I> w = kiln_window(g, oh, ow);
    double s = 0;
    for (I h = w.h0; h < w.h1; ++h)
      for (I c = w.w0; c < w.w1; ++c) s += xp[h * g.xs[2] + c * g.xs[3]];
    out[e] = (T)(s / w.divisor);
  }
)"};

// Their backward: gx[n, c, h, w] sums gy / divisor over the windows holding (h, w), in increasing
// (oh, ow) order as the CPU kernel adds them. Candidate rows: adaptive windows
// [floor(h * oH / H), ceil((h + 1) * oH / H)), fixed ones from the last window starting at or
// before h back to the first that still reaches it; each is checked against its window.
const KernelText kAvgPoolBackward{"avg_pool2d_backward",
                                  {"long long n", "KilnGeom g", "const T* gy", "T* gx"},
                                  R"(  KILN_FOR_EACH(e, n) {
    const I w = e % g.W, h = e / g.W % g.H, plane = e / (g.W * g.H);
    const T* gp = gy + plane / g.C * g.xs[0] + plane % g.C * g.xs[1];
    I oh0, oh1, ow0, ow1;  // candidate ranges, inclusive
    if (g.flags & 2) {
      oh0 = h * g.oH / g.H;
      oh1 = ((h + 1) * g.oH + g.H - 1) / g.H - 1;
      ow0 = w * g.oW / g.W;
      ow1 = ((w + 1) * g.oW + g.W - 1) / g.W - 1;
    } else {
      const I hr = h + g.pH - (g.kH - 1) * g.dH, wr = w + g.pW - (g.kW - 1) * g.dW;
      oh0 = hr <= 0 ? 0 : (hr + g.sH - 1) / g.sH;
      ow0 = wr <= 0 ? 0 : (wr + g.sW - 1) / g.sW;
      oh1 = (h + g.pH) / g.sH;
      ow1 = (w + g.pW) / g.sW;
    }
    if (oh1 > g.oH - 1) oh1 = g.oH - 1;
    if (ow1 > g.oW - 1) ow1 = g.oW - 1;
    T s = (T)0;
    for (I oh = oh0; oh <= oh1; ++oh)
      for (I ow = ow0; ow <= ow1; ++ow) {
        const KilnWindow<I> win = kiln_window(g, oh, ow);
        if (h < win.h0 || h >= win.h1 || w < win.w0 || w >= win.w1) continue;
        s += (T)(gp[oh * g.xs[2] + ow * g.xs[3]] / win.divisor);
      }
    gx[e] = s;
  }
)"};

const KernelText* const kKernels[] = {&kIm2col,          &kCol2im,  &kGroup,
                                      &kUngroup,         &kBias,    &kMaxPool,
                                      &kMaxPoolBackward, &kAvgPool, &kAvgPoolBackward};

std::string kernel_name(const KernelText& k, DType dtype) {
  // The version suffix changes with the source, so a cached binary never outlives its text.
  return std::string("kiln_") + k.base + "_" + dtype_name(dtype) + "_v2";
}

// The parameter's type (all of "type name" but the name) and name.
std::string param_type(const char* param) {
  const std::string p(param);
  return p.substr(0, p.rfind(' '));
}
std::string param_name(const char* param) {
  const std::string p(param);
  return p.substr(p.rfind(' ') + 1);
}

std::string kernel_source(const KernelText& k, DType dtype) {
  const std::string name = kernel_name(k, dtype);
  std::string s =
      std::string(kPrelude) + "typedef " + (dtype == kFloat64 ? "double" : "float") + " T;\n";
  if (&k == &kAvgPool || &k == &kAvgPoolBackward) s += kWindow;
  // The body over index type I, then the kernel (parameters n, g, then the pointers) picking I.
  std::string params, pointers, host_args;
  for (size_t i = 0; i < k.params.size(); ++i) {
    params += (i ? ", " : "") + std::string(k.params[i]);
    if (i >= 2) pointers += ", " + param_name(k.params[i]);
    host_args +=
        (i ? ", *(" : "*(") + param_type(k.params[i]) + "*)args[" + std::to_string(i) + "]";
  }
  s += "template <typename I>\nstatic KILN_DEVICE void kiln_body(I n, const KilnGeomT<I>& g";
  for (size_t i = 2; i < k.params.size(); ++i) s += ", " + std::string(k.params[i]);
  s += ") {\n" + std::string(k.body) + "}\n";
  s += "extern \"C\" __global__ void " + name + "(" + params + ") {\n";
  s += "  if (g.wide)\n    kiln_body<long long>(n, kiln_geom<long long>(g)" + pointers + ");\n";
  s += "  else\n    kiln_body<int>((int)n, kiln_geom<int>(g)" + pointers + ");\n}\n";
  s += "#ifdef KILN_HOST_LAUNCH\nextern \"C\" void " + name + "_host(void** args) {\n  " + name +
       "(" + host_args + ");\n}\n#endif\n";
  return s;
}

// ------------------------------------------------------------------------------------ launches

// The process-wide state of the CUDA convolution kernels.
struct CudaConvState {
  std::mutex mu;
  std::map<std::pair<std::string, int>, void*> loaded;  // guarded by mu: (name, device) -> kernel
  std::atomic<bool> force_wide{false};                  // atomic: set_wide_indices
  std::atomic<int64_t> max_cols_bytes{int64_t{256} << 20};  // atomic: set_max_cols_bytes
  std::atomic<int64_t> l2_chunk_bytes{0};                   // atomic: set_l2_chunk_bytes
};
CudaConvState& state() {
  static auto* s = new CudaConvState();  // never destroyed: kernels may launch during exit
  return *s;
}

// The loaded kernel of `k` for dtype on device, compiled once per process (and cached on disk by
// the code generator).
void* kernel_function(const KernelText& k, DType dtype, int device) {
  CudaConvState& st = state();
  const std::string name = kernel_name(k, dtype);
  {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.loaded.find({name, device});
    if (it != st.loaded.end()) return it->second;
  }
  auto* compile = device_kernels().source_kernel;
  KILN_CHECK(compile, "CUDA: ", name,
             " needs the CUDA code generator (NVRTC), which this build lacks");
  void* fn = compile(name, kernel_source(k, dtype), device);
  std::lock_guard<std::mutex> lock(st.mu);
  return st.loaded.emplace(std::make_pair(name, device), fn).first->second;
}

struct KilnGeom {
  long long N, C, H, W, oH, oW, kH, kW, sH, sW, pH, pW, dH, dW, G, flags;
  long long xs[4];
  long long wide;  // set by launch
  long long rows;  // im2col: the rows of cols one thread writes
};

KilnGeom conv_geom(const ConvGeom& g) {
  return {g.N,  g.C,  g.H,  g.W,  g.oH,     g.oW, g.kH,         g.kW, g.sH, g.sW,
          g.pH, g.pW, g.dH, g.dW, g.groups, 0,    {0, 0, 0, 0}, 0,    0};
}

KilnGeom pool_geom(const PoolShape& p) {
  return {p.N,          p.C,  p.H,  p.W,
          p.oH,         p.oW, p.kH, p.kW,
          p.sH,         p.sW, p.pH, p.pW,
          p.dH,         p.dW, 1,    (p.count_include_pad ? 1 : 0) | (p.adaptive ? 2 : 0),
          {0, 0, 0, 0}, 0,    0};
}

// The geometry with the strides of 4-D tensor t.
KilnGeom with_strides(KilnGeom g, const Tensor& t) {
  for (int k = 0; k < 4; ++k) g.xs[k] = t.stride(k);
  return g;
}

void* ptr(const Tensor& t) {
  return t.impl()->data();
}

// The elements from t's first to one past its last (its offsets span).
int64_t span(const Tensor& t) {
  int64_t s = 1;
  for (int64_t d = 0; d < t.dim(); ++d) s += (t.size(d) - 1) * std::abs(t.stride(d));
  return t.numel() == 0 ? 0 : s;
}

// Launches k over n elements of its output with its operands (pointer parameters, in order):
// 256 threads a block, at most 32 blocks a multiprocessor (the grid-stride loop covers the rest);
// 32-bit indices unless an operand's offsets or the loop's last step could pass 2^31 - 1.
void launch(const KernelText& k, int64_t n, KilnGeom g, const std::vector<Tensor>& operands) {
  if (n == 0) return;
  const int device = operands.at(0).device().index;
  constexpr int64_t kThreads = 256;
  const int64_t sms = cuda::device_info(device).multiprocessors;
  const int64_t blocks = std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, sms * 32));
  int64_t extent = n;
  for (const Tensor& t : operands) extent = std::max(extent, span(t));
  g.wide = state().force_wide.load() || extent + blocks * kThreads > int64_t{INT32_MAX};
  const long long count = n;
  std::vector<void*> pointers, args{const_cast<long long*>(&count), &g};
  for (const Tensor& t : operands) pointers.push_back(ptr(t));
  for (void*& p : pointers) args.push_back(&p);
  const DType dtype = operands.at(0).dtype();
  void* fn = kernel_function(k, dtype, device);
  cuda::launch(device, fn, {static_cast<unsigned>(blocks), static_cast<unsigned>(kThreads), 0},
               args.data(), kernel_name(k, dtype).c_str());
}

Tensor empty_like_on(const Tensor& like, const Shape& shape) {
  return make_empty_on(shape, like.dtype(), like.device());
}

// im2col of x into cols [G, K, N * L].
void im2col_into(const Tensor& x, const ConvGeom& g, const Tensor& cols) {
  if (cols.numel() == 0) return;
  // Bands of rows so that the columns times the bands about fill the device (2048 threads a
  // multiprocessor), each thread writing its column of a band.
  const int64_t rows = g.groups * g.K(), NL = g.N * g.L();
  const int64_t threads = cuda::device_info(x.device().index).multiprocessors * 2048;
  const int64_t bands = std::clamp<int64_t>((threads + NL - 1) / NL, 1, rows);
  KilnGeom k = with_strides(conv_geom(g), x);
  k.rows = (rows + bands - 1) / bands;
  launch(kIm2col, (rows + k.rows - 1) / k.rows * NL, k, {x, cols});
}

// gy [N, O, oH, oW] as the GEMMs read it, [G, O / G, N * L]: gy itself for one contiguous image.
Tensor grouped(const Tensor& gy, const ConvGeom& g) {
  if (g.N == 1 && gy.is_contiguous()) return gy;
  Tensor out = empty_like_on(gy, {g.groups, g.Og(), g.N * g.L()});
  KilnGeom k = with_strides(conv_geom(g), gy);
  k.C = g.O;
  launch(kGroup, out.numel(), k, {gy, out});
  return out;
}

// One [rows, L] matrix per image, as Layout::PerImage's GEMMs read and write them: element
// (r, l) of image n at element n * image + r * ld + l of t's data (the groups' rows one after
// another).
struct Planes {
  Tensor t;
  int64_t image, ld;
};

Planes column_planes(const Tensor& cols, const ConvGeom& g) {
  return {cols, g.L(), g.N * g.L()};
}

// A contiguous y [N, O, oH, oW].
Planes output_planes(const Tensor& y, const ConvGeom& g) {
  return {y, g.O * g.L(), g.L()};
}

// gy [N, O, oH, oW] in place when each image's channels are rows of L contiguous elements at one
// stride that cuBLAS takes (at least L, within int), any image stride; else regrouped (a copy).
Planes grad_output_planes(const Tensor& t, const ConvGeom& g) {
  const int64_t L = g.L();
  const bool rows = (t.size(3) == 1 || t.stride(3) == 1) && (t.size(2) == 1 || t.stride(2) == g.oW);
  const int64_t ld = t.size(1) == 1 ? L : t.stride(1);
  if (rows && ld >= L && ld <= INT32_MAX) return {t, t.stride(0), ld};
  return {grouped(t, g), L, g.N * L};
}

const void* at(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(ptr(t)) +
         elements * static_cast<int64_t>(element_size(t.dtype()));
}

// Layout::PerImage's forward (out y, in cols: y[n] = w[group] @ cols[n]) and input-gradient (out
// cols, in gy: cols[n] = w[group]^T @ gy[n]) GEMMs, one a group strided-batched over the images.
void per_image_gemm(ConvPass pass, const ConvGeom& g, const Tensor& w, const Planes& in,
                    const Planes& out) {
  const bool forward = pass == ConvPass::Forward;
  const int64_t Og = g.Og(), K = g.K(), in_rows = forward ? K : Og, out_rows = forward ? Og : K;
  for (int64_t group = 0; group < g.groups; ++group)
    cuda::gemm(w.device().index, w.dtype(), forward ? 'N' : 'T', 'N', out_rows, g.L(), in_rows, 1,
               at(w, group * Og * K), K, 0, at(in.t, group * in_rows * in.ld), in.ld, in.image, 0,
               const_cast<void*>(at(out.t, group * out_rows * out.ld)), out.ld, out.image, g.N);
}

}  // namespace

// ---------------------------------------------------------------------------------- the passes

void pass_gemm(ConvPass pass, const ConvGeom& g, DType dtype, int device, const void* a,
               const void* b, void* c, double beta) {
  const int64_t Og = g.Og(), K = g.K(), NL = g.N * g.L();
  switch (pass) {
    case ConvPass::Forward:  // [Og, K] @ [K, NL]
      cuda::gemm(device, dtype, 'N', 'N', Og, NL, K, 1, a, K, Og * K, b, NL, K * NL, beta, c, NL,
                 Og * NL, g.groups);
      break;
    case ConvPass::GradInput:  // [Og, K]^T @ [Og, NL]
      cuda::gemm(device, dtype, 'T', 'N', K, NL, Og, 1, a, K, Og * K, b, NL, Og * NL, beta, c, NL,
                 K * NL, g.groups);
      break;
    case ConvPass::GradWeight:  // [Og, NL] @ [K, NL]^T
      cuda::gemm(device, dtype, 'N', 'T', Og, K, NL, 1, a, NL, Og * NL, b, NL, K * NL, beta, c, K,
                 Og * K, g.groups);
      break;
  }
}

int64_t chunk_images(const ConvGeom& g, DType dtype, int device, Layout layout) {
  int64_t budget = state().max_cols_bytes.load();
  if (layout == Layout::PerImage) {
    // Half the L2: the rest holds the GEMM's other operands' tiles.
    const int64_t set = state().l2_chunk_bytes.load(),
                  l2 = cuda::device_info(device).l2_cache_bytes;
    budget = set > 0 ? set : l2 > 0 ? l2 / 2 : budget;
  }
  const int64_t per_image =
      std::max<int64_t>(1, g.groups * g.K() * g.L() * static_cast<int64_t>(element_size(dtype)));
  return std::clamp<int64_t>(budget / per_image, 1, std::max<int64_t>(1, g.N));
}

namespace {
// Runs f(first image, geometry of the chunk, its columns [G, K, chunk's N * L]) over the batch in
// chunks of chunk_images images, so a large batch never needs all its columns at once. The column
// buffer is allocated once and every chunk reuses it (on a GPU, lines that are in L2 already).
template <typename F>
void for_chunks(const Tensor& like, const ConvGeom& g, Layout layout, const F& f) {
  const int64_t step = chunk_images(g, like.dtype(), like.device().index, layout);
  const int64_t per_image = g.groups * g.K() * g.L();
  const Tensor buffer = empty_like_on(like, {step * per_image});
  for (int64_t n0 = 0; n0 < g.N; n0 += step) {
    ConvGeom c = g;
    c.N = std::min(step, g.N - n0);
    f(n0, c, buffer.narrow(0, 0, c.N * per_image).view({g.groups, g.K(), c.N * g.L()}));
  }
}

// The forward GEMM of a chunk, grouped, into y (its images of the output, contiguous).
void grouped_forward_gemm(const Tensor& cols, const Tensor& w, const ConvGeom& g, const Tensor& y) {
  const int device = y.device().index;
  if (g.N == 1) {  // [G, O / G, L] is y's layout already
    pass_gemm(ConvPass::Forward, g, y.dtype(), device, ptr(w), ptr(cols), ptr(y));
    return;
  }
  Tensor yg = empty_like_on(y, {g.groups, g.Og(), g.N * g.L()});
  pass_gemm(ConvPass::Forward, g, y.dtype(), device, ptr(w), ptr(cols), ptr(yg));
  KilnGeom k = conv_geom(g);
  k.C = g.O;
  launch(kUngroup, y.numel(), k, {yg, y});
}
}  // namespace

Tensor forward(const Tensor& x, const Tensor& w, const ConvGeom& g, Layout layout) {
  Tensor y = empty_like_on(x, {g.N, g.O, g.oH, g.oW});
  for_chunks(x, g, layout, [&](int64_t n0, const ConvGeom& c, const Tensor& cols) {
    im2col_into(x.narrow(0, n0, c.N), c, cols);
    const Tensor yc = y.narrow(0, n0, c.N);
    if (layout == Layout::PerImage)
      per_image_gemm(ConvPass::Forward, c, w, column_planes(cols, c), output_planes(yc, c));
    else
      grouped_forward_gemm(cols, w, c, yc);
  });
  return y;
}

void add_bias(const Tensor& y, const Tensor& bias) {
  KilnGeom k{};
  k.C = y.size(1);
  k.oH = y.size(2);
  k.oW = y.size(3);
  k.xs[0] = bias.stride(0);
  launch(kBias, y.numel(), k, {bias, y});
}

Tensor grad_input(const Tensor& gy, const Tensor& w, const ConvGeom& g, Layout layout) {
  Tensor gx = empty_like_on(gy, {g.N, g.C, g.H, g.W});
  for_chunks(gy, g, layout, [&](int64_t n0, const ConvGeom& c, const Tensor& cols) {
    const Tensor gyc = gy.narrow(0, n0, c.N);
    if (layout == Layout::PerImage)
      per_image_gemm(ConvPass::GradInput, c, w, grad_output_planes(gyc, c), column_planes(cols, c));
    else
      pass_gemm(ConvPass::GradInput, c, gy.dtype(), gy.device().index, ptr(w), ptr(grouped(gyc, c)),
                ptr(cols));
    launch(kCol2im, c.N * g.C * g.H * g.W, conv_geom(c), {cols, gx.narrow(0, n0, c.N)});
  });
  return gx;
}

// The chunks' weight gradients add up in gw (the GEMM's beta). Both layouts run the grouped GEMM
// (see Layout::PerImage); theirs differ in the chunks' size.
Tensor grad_weight(const Tensor& gy, const Tensor& x, const ConvGeom& g, Layout layout) {
  Tensor gw = empty_like_on(gy, {g.O, g.Cg(), g.kH, g.kW});
  for_chunks(gy, g, layout, [&](int64_t n0, const ConvGeom& c, const Tensor& cols) {
    im2col_into(x.narrow(0, n0, c.N), c, cols);
    pass_gemm(ConvPass::GradWeight, c, gy.dtype(), gy.device().index,
              ptr(grouped(gy.narrow(0, n0, c.N), c)), ptr(cols), ptr(gw), n0 == 0 ? 0 : 1);
  });
  return gw;
}

// ----------------------------------------------------------------------------------- the pools

std::pair<Tensor, Tensor> max_pool(const Tensor& x, const PoolShape& p) {
  Tensor out = empty_like_on(x, {p.N, p.C, p.oH, p.oW});
  Tensor index = make_empty_on(out.sizes(), kInt64, x.device());
  launch(kMaxPool, out.numel(), with_strides(pool_geom(p), x), {x, out, index});
  return {out, index};
}

Tensor max_pool_backward(const Tensor& gy, const Tensor& indices, const PoolShape& p) {
  const int device = gy.device().index;
  const Tensor g = gy.contiguous(), ix = indices.contiguous();
  Tensor gx = empty_like_on(gy, {p.N, p.C, p.H, p.W});
  cuda::memset_on_device(device, ptr(gx), 0,
                         static_cast<size_t>(gx.numel()) * element_size(gx.dtype()));
  launch(kMaxPoolBackward, g.numel(), pool_geom(p), {g, ix, gx});
  return gx;
}

Tensor avg_pool(const Tensor& x, const PoolShape& p, bool adjoint) {
  Tensor out = empty_like_on(x, adjoint ? Shape{p.N, p.C, p.H, p.W} : Shape{p.N, p.C, p.oH, p.oW});
  launch(adjoint ? kAvgPoolBackward : kAvgPool, out.numel(), with_strides(pool_geom(p), x),
         {x, out});
  return out;
}

void set_max_cols_bytes(int64_t bytes) {
  state().max_cols_bytes.store(bytes);
}

void set_l2_chunk_bytes(int64_t bytes) {
  state().l2_chunk_bytes.store(bytes);
}

void set_wide_indices(bool on) {
  state().force_wide.store(on);
}

std::vector<std::pair<std::string, std::string>> kernel_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  for (DType t : {kFloat32, kFloat64})
    for (const KernelText* k : kKernels) out.emplace_back(kernel_name(*k, t), kernel_source(*k, t));
  return out;
}

}  // namespace kiln::detail::cuda_conv
