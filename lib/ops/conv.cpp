// Convolution ops (NCHW, float32 and float64): conv2d, conv1d, conv3d, conv2d_grad_input,
// conv2d_grad_weight, conv_transpose2d and conv_transpose1d, lowered to GEMMs as Theano's GpuCorrMM
// and caffe do (conv1d and conv3d through conv2d: a height of 1, or the depth slices each output
// depth reads gathered as channels).
//
// Each pass is its own op with its own gradient, so double backward never flips a kernel:
//   forward      y  = conv2d(x, w)                       [N, O, oH, oW]
//   grad input   gx = conv2d_grad_input(gy, w)            the "full" convolution (also the
//                                                         transposed convolution)
//   grad weight  gw = conv2d_grad_weight(gy, x)
// The three are bilinear and adjoint to each other: <gx', grad_input(gy, w)> = <conv2d(gx', w), gy>
// and <gw', grad_weight(gy, x)> = <conv2d(x, gw'), gy>, which gives every gradient formula below.
//
// Algorithms (lib/ops/conv.h). im2col lays each input patch out as a column: cols [groups, K,
// N * oH * oW], K = C / groups * kH * kW, so the forward pass is one GEMM per group with the whole
// batch folded into its N dimension, W[g] [O / groups, K] @ cols[g]; the input gradient is the GEMM
// W[g]^T @ gy[g] followed by col2im (scatter-adding the columns back into the image), and the
// weight gradient gy[g] @ cols[g]^T. The GEMMs run through kiln's GEMM driver (oneDNN's sgemm for
// float32, lib/ops/gemm.h). The weight-gradient formulation computes a forward pass as the weight
// gradient of a convolution over the transposed input (channels as images): when the kernel is
// large next to the output its columns are the smaller ones. oneDNN's own convolution primitives
// run float32.
//
// The chooser starts from Theano's measured rule (the forward formulation when
// N * kH * kW < C * oH * oW, else the weight-gradient one) to order the candidates, then times each
// (the faster of two runs) the first time it meets a problem (pass, shapes, strides, padding,
// dilation, groups, dtype, device), keeps the fastest's result and remembers the choice in memory
// and in the kernel cache's directory (ConvChoiceStore, keyed by the problem, the device's name and
// the candidate set), where a later process reads it back instead of measuring (a damaged or stale
// entry is ignored). KILN_CONV_ALGO=im2col|im2col_l2|onednn forces one (im2col: the GEMM
// formulation Theano's rule picks); KILN_LOG=conv (or all) prints each choice with the times
// measured, or "from cache".
//
// On a CUDA device the im2col formulation runs lib/ops/conv_cuda.cpp's kernels and cuBLAS (the
// weight-gradient one is built of it); oneDNN is CPU only. A device has one more candidate,
// im2col_l2 (conv_cuda.h's Layout::PerImage): the same kernels in chunks of images sized to half
// the device's L2, with per-image GEMMs that read and write NCHW images in place instead of
// regrouping them; listed last, it replaces the others only where it measures faster (both
// remove traffic, the L2-sized chunks make smaller GEMMs).
//
// conv2d_epilogue is conv2d with a bias, a residual add and an activation computed by the
// convolution (oneDNN post-ops); only the graph pass jit/passes/conv_fold.cpp makes it.
//
// In lazy mode each op records one node once its checks and output shape are done; the node runs
// the op itself (a library call, like a GEMM).
#include "lib/ops/conv.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/env.h"
#include "lib/op_registry.h"
#include "lib/ops/conv_cuda.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/op_table.h"
#include "lib/ops/gemm.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::Attrs;
using detail::ConvAlgo;
using detail::ConvGeom;
using detail::describe;
using detail::shape_str;
using detail::spatial_arg;

namespace {

using Inputs = std::vector<Tensor>;

const detail::OpDef& def_conv(const char* name, int arity, detail::Invoke invoke,
                              std::vector<std::string> attr_names) {
  return detail::register_op({name, detail::OpKind::NN, arity, detail::DTypeRule::Same, false,
                              invoke, std::move(attr_names)});
}
using detail::attr_int;
using detail::attr_ints;
// Inputs (input, weight, bias, residual), the last two optional: activation(conv2d(input,
// weight) + bias + residual), the bias and residual add and the activation ("none", "relu",
// "gelu", "gelu_tanh", "silu") computed as the convolution's epilogue (oneDNN post-ops). Only the
// graph pass jit/passes/conv_fold.cpp makes it, from graphs already differentiated: it has no
// gradient formula.
Tensor conv2d_epilogue_kernel(const Inputs& in, const Attrs& a);
detail::OpHandle conv2d_def;
detail::OpHandle grad_input_def;
detail::OpHandle grad_weight_def;
detail::OpHandle conv2d_epilogue_def;
}  // namespace

// The convolution passes' entries.
void registration::register_conv_ops() {
  // Inputs (input, weight, bias); the bias may be absent.
  conv2d_def.bind(def_conv("conv2d", 3,
                           [](const Inputs& in, const Attrs& a) {
                             return Inputs{conv2d(in[0], in[1], in[2], attr_ints(a.at(0)),
                                                  attr_ints(a.at(1)), attr_ints(a.at(2)),
                                                  attr_int(a.at(3)))};
                           },
                           {"stride", "padding", "dilation", "groups"}));
  // Inputs (grad_output, weight).
  grad_input_def.bind(def_conv("conv2d_grad_input", 2,
                               [](const Inputs& in, const Attrs& a) {
                                 return Inputs{conv2d_grad_input(
                                     in[0], in[1], attr_ints(a.at(0)), attr_ints(a.at(1)),
                                     attr_ints(a.at(2)), attr_ints(a.at(3)), attr_int(a.at(4)))};
                               },
                               {"input_size", "stride", "padding", "dilation", "groups"}));
  // Inputs (grad_output, input).
  grad_weight_def.bind(def_conv("conv2d_grad_weight", 2,
                                [](const Inputs& in, const Attrs& a) {
                                  return Inputs{conv2d_grad_weight(
                                      in[0], in[1], attr_ints(a.at(0)), attr_ints(a.at(1)),
                                      attr_ints(a.at(2)), attr_ints(a.at(3)), attr_int(a.at(4)))};
                                },
                                {"weight_size", "stride", "padding", "dilation", "groups"}));
  conv2d_epilogue_def.bind(def_conv(
      "conv2d_epilogue", 4,
      [](const Inputs& in, const Attrs& a) { return Inputs{conv2d_epilogue_kernel(in, a)}; },
      {"stride", "padding", "dilation", "groups", "activation"}));
}

namespace {

// ------------------------------------------------------------------------------------ geometry

// Stride, padding and dilation of a 2-D convolution, checked.
struct ConvArgs {
  Shape stride, padding, dilation;
  int64_t groups;
};
ConvArgs conv_args(const char* op, const Shape& stride, const Shape& padding, const Shape& dilation,
                   int64_t groups) {
  KILN_CHECK(groups > 0, op, ": expected groups > 0, got ", groups);
  return {spatial_arg(op, "stride", stride, 2, 1), spatial_arg(op, "padding", padding, 2, 0),
          spatial_arg(op, "dilation", dilation, 2, 1), groups};
}

void check_operand(const char* op, const Tensor& t, const char* arg, int64_t rank) {
  detail::check_defined(t, op, arg);
  KILN_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64, op,
             ": expected float32 or float64 tensors, got ", arg, " ", describe(t));
  KILN_CHECK(t.dim() == rank, op, ": expected ", arg, " to be ", rank, "-D, got ", describe(t));
}

void check_same_dtype(const char* op, const Tensor& a, const char* an, const Tensor& b,
                      const char* bn) {
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected ", an, " and ", bn, " of the same dtype, got ",
             describe(a), " and ", describe(b));
  KILN_CHECK(a.device() == b.device(), op, ": expected ", an, " and ", bn,
             " on the same device, got ", describe(a), " on ", a.device().str(), " and ",
             describe(b), " on ", b.device().str());
}

// The geometry of a convolution of an input of `in` sizes with a weight of `w` sizes, checked:
// channels, groups and a kernel that fits the padded input. `what` describes the operands.
ConvGeom make_geom(const char* op, const Shape& in, const Shape& w, const ConvArgs& a,
                   const std::string& what) {
  ConvGeom g{in[0],
             in[1],
             in[2],
             in[3],
             w[0],
             w[2],
             w[3],
             0,
             0,
             a.stride[0],
             a.stride[1],
             a.padding[0],
             a.padding[1],
             a.dilation[0],
             a.dilation[1],
             a.groups};
  KILN_CHECK(g.C % g.groups == 0, op, ": groups (", g.groups, ") must divide the input channels (",
             g.C, "): ", what);
  KILN_CHECK(g.O % g.groups == 0, op, ": groups (", g.groups, ") must divide the output channels (",
             g.O, "): ", what);
  KILN_CHECK(w[1] * g.groups == g.C, op, ": expected input with ", w[1] * g.groups,
             " channels (weight's ", w[1], " per group times groups ", g.groups, "), got ", g.C,
             " channels: ", what);
  const int64_t eh = g.dH * (g.kH - 1) + 1, ew = g.dW * (g.kW - 1) + 1;  // dilated kernel
  KILN_CHECK(g.H + 2 * g.pH >= eh && g.W + 2 * g.pW >= ew, op, ": kernel size ", eh, "x", ew,
             " (dilated) is larger than the padded input size ", g.H + 2 * g.pH, "x",
             g.W + 2 * g.pW, ": ", what);
  g.oH = (g.H + 2 * g.pH - eh) / g.sH + 1;
  g.oW = (g.W + 2 * g.pW - ew) / g.sW + 1;
  return g;
}

std::string operands(const char* a, const Tensor& x, const char* b, const Tensor& y) {
  return std::string(a) + " " + describe(x) + ", " + b + " " + describe(y);
}

// ------------------------------------------------------------------------------ im2col kernels

// cols [groups, K, N * L]: row (c, i, j), c a global channel, holds for every image and output
// position the input pixel that kernel tap (i, j) reads there (0 in the padding). Group-major
// rows are channel-major overall, so the row of (c, i, j) is (c * kH + i) * kW + j.
template <typename T>
void im2col(const T* x, const ConvGeom& g, T* cols) {
  const int64_t taps = g.kH * g.kW, L = g.L(), NL = g.N * L;
  detail::parallel_for(g.C * taps, std::max<int64_t>(1, detail::kParallelGrain / NL),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t r = begin; r < end; ++r) {
                           const int64_t c = r / taps, i = r % taps / g.kW, j = r % g.kW;
                           for (int64_t n = 0; n < g.N; ++n) {
                             const T* plane = x + (n * g.C + c) * g.H * g.W;
                             T* dst = cols + r * NL + n * L;
                             for (int64_t oh = 0; oh < g.oH; ++oh, dst += g.oW) {
                               const int64_t ih = oh * g.sH - g.pH + i * g.dH;
                               if (ih < 0 || ih >= g.H) {
                                 std::fill(dst, dst + g.oW, T(0));
                                 continue;
                               }
                               const T* src = plane + ih * g.W;
                               for (int64_t ow = 0; ow < g.oW; ++ow) {
                                 const int64_t iw = ow * g.sW - g.pW + j * g.dW;
                                 dst[ow] = iw >= 0 && iw < g.W ? src[iw] : T(0);
                               }
                             }
                           }
                         }
                       });
}

// The adjoint of im2col: x [N, C, H, W] = the sum of every column entry into the pixel it was
// read from. Each task owns whole (n, c) planes, so the sums need no atomics and run in a fixed
// order.
template <typename T>
void col2im(const T* cols, const ConvGeom& g, T* x) {
  const int64_t taps = g.kH * g.kW, L = g.L(), NL = g.N * L, HW = g.H * g.W;
  detail::parallel_for(
      g.N * g.C, std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(1, taps * L)),
      [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const int64_t n = p / g.C, c = p % g.C;
          T* plane = x + p * HW;
          std::fill(plane, plane + HW, T(0));
          for (int64_t i = 0; i < g.kH; ++i)
            for (int64_t j = 0; j < g.kW; ++j) {
              const T* src = cols + ((c * g.kH + i) * g.kW + j) * NL + n * L;
              for (int64_t oh = 0; oh < g.oH; ++oh, src += g.oW) {
                const int64_t ih = oh * g.sH - g.pH + i * g.dH;
                if (ih < 0 || ih >= g.H) continue;
                T* row = plane + ih * g.W;
                for (int64_t ow = 0; ow < g.oW; ++ow) {
                  const int64_t iw = ow * g.sW - g.pW + j * g.dW;
                  if (iw >= 0 && iw < g.W) row[iw] += src[ow];
                }
              }
            }
        }
      });
}

Tensor make_cols(const Tensor& x, const ConvGeom& g) {
  Tensor cols = detail::make_empty({g.groups, g.K(), g.N * g.L()}, x.dtype());
  detail::dispatch_floating(x.dtype(), "conv2d", [&](auto tag) {
    using T = KILN_TYPE(tag);
    im2col<T>(std::as_const(x).data_ptr<T>(), g, cols.data_ptr<T>());
  });
  return cols;
}

// gy [N, O, oH, oW] regrouped as [groups, O / groups, N * L], the GEMM operand of the gradients.
Tensor grouped_grad_output(const Tensor& gy, const ConvGeom& g) {
  Tensor out = detail::make_empty({g.groups, g.Og(), g.N * g.L()}, gy.dtype());
  detail::copy_kernel(out.view({g.groups, g.Og(), g.N, g.L()}),
                      gy.view({g.N, g.groups, g.Og(), g.L()}).permute({1, 2, 0, 3}));
  return out;
}

// The device layout of an im2col algorithm (Im2colL2 runs only on a device).
detail::cuda_conv::Layout device_layout(ConvAlgo a) {
  return a == ConvAlgo::Im2colL2 ? detail::cuda_conv::Layout::PerImage
                                 : detail::cuda_conv::Layout::Grouped;
}

// Inputs of these are contiguous (on a device only the weight need be) and of one dtype; autograd
// is off. `a`: Im2col, or Im2colL2 on a device.
Tensor forward_im2col(const Tensor& x, const Tensor& w, const ConvGeom& g,
                      ConvAlgo a = ConvAlgo::Im2col) {
  if (x.device().is_cuda()) return detail::cuda_conv::forward(x, w, g, device_layout(a));
  const DType dt = x.dtype();
  Tensor cols = make_cols(x, g);
  Tensor yg = detail::make_empty({g.groups, g.Og(), g.N * g.L()}, dt);
  detail::gemm_into("conv2d", yg, w.view({g.groups, g.Og(), g.K()}), cols, {g.groups}, dt, 1, 0);
  Tensor y = detail::make_empty({g.N, g.O, g.oH, g.oW}, dt);
  detail::copy_kernel(y.view({g.N, g.groups, g.Og(), g.L()}),
                      yg.view({g.groups, g.Og(), g.N, g.L()}).permute({2, 0, 1, 3}));
  return y;
}

Tensor grad_input_im2col(const Tensor& gy, const Tensor& w, const ConvGeom& g,
                         ConvAlgo a = ConvAlgo::Im2col) {
  if (gy.device().is_cuda()) return detail::cuda_conv::grad_input(gy, w, g, device_layout(a));
  const DType dt = gy.dtype();
  Tensor cols = detail::make_empty({g.groups, g.K(), g.N * g.L()}, dt);
  detail::gemm_into("conv2d_grad_input", cols, w.view({g.groups, g.Og(), g.K()}).transpose(1, 2),
                    grouped_grad_output(gy, g), {g.groups}, dt, 1, 0);
  Tensor gx = detail::make_empty({g.N, g.C, g.H, g.W}, dt);
  detail::dispatch_floating(dt, "conv2d_grad_input", [&](auto tag) {
    using T = KILN_TYPE(tag);
    col2im<T>(std::as_const(cols).data_ptr<T>(), g, gx.data_ptr<T>());
  });
  return gx;
}

Tensor grad_weight_im2col(const Tensor& gy, const Tensor& x, const ConvGeom& g,
                          ConvAlgo a = ConvAlgo::Im2col) {
  if (gy.device().is_cuda()) return detail::cuda_conv::grad_weight(gy, x, g, device_layout(a));
  const DType dt = gy.dtype();
  Tensor gw = detail::make_empty({g.groups, g.Og(), g.K()}, dt);
  detail::gemm_into("conv2d_grad_weight", gw, grouped_grad_output(gy, g),
                    make_cols(x, g).transpose(1, 2), {g.groups}, dt, 1, 0);
  return gw.view({g.O, g.Cg(), g.kH, g.kW});
}

// The forward pass as a weight gradient (groups == 1): y[n, o] = sum_c x[n, c] * w[o, c] is the
// weight gradient of a convolution whose images are x's channels (x^T [C, N, H, W]), whose output
// gradient is w^T [C, O, kH, kW] and whose kernel taps are y's positions; stride and dilation
// trade places. The result comes out as y^T [O, N, oH, oW].
Tensor forward_weight_grad(const Tensor& x, const Tensor& w, const ConvGeom& g) {
  const ConvGeom t{g.C,  g.N,  g.H,  g.W,  g.O,  g.oH, g.oW, g.kH,
                   g.kW, g.dH, g.dW, g.pH, g.pW, g.sH, g.sW, 1};
  Tensor yt = grad_weight_im2col(w.transpose(0, 1).contiguous(), x.transpose(0, 1).contiguous(), t);
  return yt.transpose(0, 1).contiguous();
}

// ------------------------------------------------------------------------------------- oneDNN

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN's descriptors of a convolution: plain NCHW data and (g)oihw weights, dilation counted
// from 0, and the bottom/right padding that makes the output size exact.
struct DnnlConv {
  dnnl::memory::desc src, weights, dst;
  dnnl::memory::dims strides, dilates, pad_l, pad_r;

  explicit DnnlConv(const ConvGeom& g) {
    using dnnl::memory;
    const auto f32 = memory::data_type::f32;
    src = memory::desc({g.N, g.C, g.H, g.W}, f32, memory::format_tag::nchw);
    dst = memory::desc({g.N, g.O, g.oH, g.oW}, f32, memory::format_tag::nchw);
    weights = g.groups == 1 ? memory::desc({g.O, g.C, g.kH, g.kW}, f32, memory::format_tag::oihw)
                            : memory::desc({g.groups, g.Og(), g.Cg(), g.kH, g.kW}, f32,
                                           memory::format_tag::goihw);
    strides = {g.sH, g.sW};
    dilates = {g.dH - 1, g.dW - 1};
    pad_l = {g.pH, g.pW};
    pad_r = {bottom_pad(g), right_pad(g)};
  }
  static int64_t bottom_pad(const ConvGeom& g) {
    return (g.oH - 1) * g.sH + (g.kH - 1) * g.dH + 1 - g.H - g.pH;
  }
  static int64_t right_pad(const ConvGeom& g) {
    return (g.oW - 1) * g.sW + (g.kW - 1) * g.dW + 1 - g.W - g.pW;
  }
  // The same shape in the layout oneDNN's fastest kernel for the problem chooses (channels in
  // blocks of 16 on AVX-512): on plain NCHW memory oneDNN offers only its GEMM-based
  // convolution. Layouts converts between the two.
  static dnnl::memory::desc any(const dnnl::memory::desc& d) {
    return {d.dims(), d.data_type(), dnnl::memory::format_tag::any};
  }
  dnnl::convolution_forward::primitive_desc forward() const {
    return {{dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, any(src),
             any(weights), any(dst), strides, dilates, pad_l, pad_r},
            dnnl_engine()};
  }
  dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t) const {
    return dnnl::memory(d, dnnl_engine(), const_cast<void*>(t.raw_data_ptr()));
  }
};

// Reorders between kiln's plain tensors and the layouts a primitive chose, on one stream (in
// order): inputs before the primitive runs, outputs (finish) after it.
class Layouts {
 public:
  explicit Layouts(dnnl::stream& s) : s_(s) {}
  // `plain` as the primitive reads it.
  dnnl::memory in(const dnnl::memory::desc& want, dnnl::memory plain) {
    if (want == plain.get_desc()) return plain;
    dnnl::memory m(want, dnnl_engine());
    dnnl::reorder(plain, m).execute(s_, plain, m);
    return m;
  }
  // Where the primitive writes what finish() copies to `plain`; `accumulate`: it adds to what is
  // there (a sum post-op), so the plain values go in first.
  dnnl::memory out(const dnnl::memory::desc& want, dnnl::memory plain, bool accumulate = false) {
    if (want == plain.get_desc()) return plain;
    dnnl::memory m = accumulate ? in(want, plain) : dnnl::memory(want, dnnl_engine());
    outputs_.emplace_back(m, plain);
    return m;
  }
  void finish() {
    for (auto& [m, plain] : outputs_) dnnl::reorder(m, plain).execute(s_, m, plain);
  }

 private:
  dnnl::stream& s_;
  std::vector<std::pair<dnnl::memory, dnnl::memory>> outputs_;
};

// Runs one oneDNN primitive; its failures become kiln::Errors naming the pass.
template <typename Run>
void dnnl_run(const char* op, const ConvGeom& g, Run run) {
  try {
    dnnl::stream stream(dnnl_engine());
    run(stream);
    stream.wait();
  } catch (const dnnl::error& e) {
    KILN_FAIL(op, ": oneDNN convolution failed (", e.what(), ") for input [", g.N, ", ", g.C, ", ",
              g.H, ", ", g.W, "], weight [", g.O, ", ", g.Cg(), ", ", g.kH, ", ", g.kW, "]");
  }
}

// What a convolution adds after its sums (conv2d_epilogue): a bias [O], a residual of the
// output's shape, an activation; undefined or "none" where absent.
struct Epilogue {
  Tensor bias, residual;
  std::string activation = "none";
};

// The oneDNN eltwise algorithm computing an activation as kiln does (SiLU is swish with alpha 1).
dnnl::algorithm dnnl_activation(const std::string& act) {
  if (act == "relu") return dnnl::algorithm::eltwise_relu;
  if (act == "gelu") return dnnl::algorithm::eltwise_gelu_erf;
  if (act == "gelu_tanh") return dnnl::algorithm::eltwise_gelu_tanh;
  KILN_CHECK(act == "silu", "conv2d_epilogue: unknown activation '", act, "'");
  return dnnl::algorithm::eltwise_swish;
}

// The forward convolution; with an epilogue, its bias is the primitive's bias and the residual
// and activation are post-ops (a sum onto the output, which starts as a copy of the residual,
// then the eltwise), so the output is written once.
Tensor forward_onednn(const Tensor& x, const Tensor& w, const ConvGeom& g, const Epilogue& e = {}) {
  Tensor y = e.residual.defined() ? e.residual.contiguous().clone()
                                  : detail::make_empty({g.N, g.O, g.oH, g.oW}, kFloat32);
  DnnlConv d(g);
  dnnl::post_ops post;
  if (e.residual.defined()) post.append_sum(1.f);
  if (e.activation != "none")
    post.append_eltwise(1.f, dnnl_activation(e.activation), e.activation == "silu" ? 1.f : 0.f,
                        0.f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(post);
  const dnnl::memory::desc bias_desc({g.O}, dnnl::memory::data_type::f32,
                                     dnnl::memory::format_tag::x);
  dnnl_run("conv2d", g, [&](dnnl::stream& s) {
    const dnnl::convolution_forward::primitive_desc pd =
        e.bias.defined()
            ? dnnl::convolution_forward::primitive_desc(
                  {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                   DnnlConv::any(d.src), DnnlConv::any(d.weights), bias_desc, DnnlConv::any(d.dst),
                   d.strides, d.dilates, d.pad_l, d.pad_r},
                  attr, dnnl_engine())
            : dnnl::convolution_forward::primitive_desc(
                  {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                   DnnlConv::any(d.src), DnnlConv::any(d.weights), DnnlConv::any(d.dst), d.strides,
                   d.dilates, d.pad_l, d.pad_r},
                  attr, dnnl_engine());
    Layouts layouts(s);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, layouts.in(pd.src_desc(), d.mem(d.src, x))},
        {DNNL_ARG_WEIGHTS, layouts.in(pd.weights_desc(), d.mem(d.weights, w))},
        {DNNL_ARG_DST, layouts.out(pd.dst_desc(), d.mem(d.dst, y), e.residual.defined())}};
    if (e.bias.defined()) args.emplace(DNNL_ARG_BIAS, d.mem(bias_desc, e.bias));
    dnnl::convolution_forward(pd).execute(s, args);
    layouts.finish();
  });
  return y;
}

Tensor grad_input_onednn(const Tensor& gy, const Tensor& w, const ConvGeom& g) {
  Tensor gx = detail::make_empty({g.N, g.C, g.H, g.W}, kFloat32);
  DnnlConv d(g);
  dnnl_run("conv2d_grad_input", g, [&](dnnl::stream& s) {
    dnnl::convolution_backward_data::primitive_desc pd(
        {dnnl::algorithm::convolution_direct, DnnlConv::any(d.src), DnnlConv::any(d.weights),
         DnnlConv::any(d.dst), d.strides, d.dilates, d.pad_l, d.pad_r},
        dnnl_engine(), d.forward());
    Layouts layouts(s);
    dnnl::convolution_backward_data(pd).execute(
        s, {{DNNL_ARG_DIFF_DST, layouts.in(pd.diff_dst_desc(), d.mem(d.dst, gy))},
            {DNNL_ARG_WEIGHTS, layouts.in(pd.weights_desc(), d.mem(d.weights, w))},
            {DNNL_ARG_DIFF_SRC, layouts.out(pd.diff_src_desc(), d.mem(d.src, gx))}});
    layouts.finish();
  });
  return gx;
}

Tensor grad_weight_onednn(const Tensor& gy, const Tensor& x, const ConvGeom& g) {
  Tensor gw = detail::make_empty({g.O, g.Cg(), g.kH, g.kW}, kFloat32);
  DnnlConv d(g);
  dnnl_run("conv2d_grad_weight", g, [&](dnnl::stream& s) {
    dnnl::convolution_backward_weights::primitive_desc pd(
        {dnnl::algorithm::convolution_direct, DnnlConv::any(d.src), DnnlConv::any(d.weights),
         DnnlConv::any(d.dst), d.strides, d.dilates, d.pad_l, d.pad_r},
        dnnl_engine(), d.forward());
    Layouts layouts(s);
    dnnl::convolution_backward_weights(pd).execute(
        s, {{DNNL_ARG_DIFF_DST, layouts.in(pd.diff_dst_desc(), d.mem(d.dst, gy))},
            {DNNL_ARG_SRC, layouts.in(pd.src_desc(), d.mem(d.src, x))},
            {DNNL_ARG_DIFF_WEIGHTS, layouts.out(pd.diff_weights_desc(), d.mem(d.weights, gw))}});
    layouts.finish();
  });
  return gw;
}

// ------------------------------------------------------------------------------------ chooser

enum class Pass { Forward, GradInput, GradWeight };
const char* pass_name(Pass p) {
  return p == Pass::Forward     ? "conv2d"
         : p == Pass::GradInput ? "conv2d_grad_input"
                                : "conv2d_grad_weight";
}

// Theano's rule (GpuCorrMM): the forward formulation while the batch's kernel taps are fewer
// than the input's channel-positions, else the weight-gradient one.
bool theano_prefers_forward(const ConvGeom& g) {
  return g.N * g.kH * g.kW < g.C * g.oH * g.oW;
}

// The algorithms that can compute a pass, the GEMM formulations in the order Theano's rule
// prefers. oneDNN: float32 on the CPU with a non-negative bottom/right padding (a stride that
// skips the last rows would need a negative one). Im2colL2: on a device, last (ties keep the
// established ones).
std::vector<ConvAlgo> candidates(Pass p, const ConvGeom& g, DType dt, Device device) {
  std::vector<ConvAlgo> out{ConvAlgo::Im2col};
  if (p == Pass::Forward && g.groups == 1) {
    out.push_back(ConvAlgo::WeightGrad);
    if (!theano_prefers_forward(g)) std::swap(out[0], out[1]);
  }
  if (dt == kFloat32 && !device.is_cuda() && DnnlConv::bottom_pad(g) >= 0 &&
      DnnlConv::right_pad(g) >= 0)
    out.push_back(ConvAlgo::OneDNN);
  if (device.is_cuda()) out.push_back(ConvAlgo::Im2colL2);
  return out;
}

struct ChooserState {
  std::mutex mutex;
  std::map<std::string, ConvAlgo> choices;  // guarded by mutex
  std::atomic<int> forced{-1};              // a ConvAlgo set by set_conv_algo; -1: none
  std::atomic<bool> on_disk{true};          // set_conv_choices_on_disk
};
ChooserState& chooser() {
  static ChooserState* s = new ChooserState;  // never destroyed: ops may run at exit
  return *s;
}
thread_local ConvAlgo t_last_algo = ConvAlgo::Auto;

// KILN_CONV_ALGO, read on each forced check (choices are rare: once per problem).
ConvAlgo forced_algo() {
  const int f = chooser().forced.load(std::memory_order_relaxed);
  if (f >= 0) return static_cast<ConvAlgo>(f);
  const std::vector<std::string> v = detail::env_list("KILN_CONV_ALGO");
  KILN_CHECK(v.size() <= 1,
             "KILN_CONV_ALGO: expected one algorithm (auto, im2col, im2col_l2, onednn)");
  if (v.empty() || v[0] == "auto") return ConvAlgo::Auto;
  if (v[0] == "im2col_l2") return ConvAlgo::Im2colL2;
  return v[0] == "im2col" ? ConvAlgo::Gemm : ConvAlgo::OneDNN;
}

// KILN_LOG names conv or all. lib/ cannot use the JIT's logger (jit/log.h), so the variable is read
// here the same way, on each choice.
bool log_conv() {
  for (const std::string& topic : detail::env_list("KILN_LOG"))
    if (topic == "conv" || topic == "all") return true;
  return false;
}

std::string problem_str(Pass p, const ConvGeom& g, DType dt, Device device) {
  std::ostringstream os;
  os << pass_name(p) << " " << device.str() << " " << dtype_name(dt) << " input [" << g.N << ", "
     << g.C << ", " << g.H << ", " << g.W << "] weight [" << g.O << ", " << g.Cg() << ", " << g.kH
     << ", " << g.kW << "] output " << g.oH << "x" << g.oW << " stride " << g.sH << "x" << g.sW
     << " padding " << g.pH << "x" << g.pW << " dilation " << g.dH << "x" << g.dW << " groups "
     << g.groups;
  return os.str();
}

using Runner = std::function<Tensor(ConvAlgo)>;

// The disk key of a problem's choice: the problem, the device's model (choices measured on one
// GPU do not carry to another) and the candidates measured.
std::string choice_key(const std::string& problem, Device device,
                       const std::vector<ConvAlgo>& cands) {
  std::string key = "conv choice v1|" + problem + "|" +
                    (device.is_cuda() ? detail::cuda::device_info(device.index).name : "cpu") +
                    "|candidates";
  for (ConvAlgo a : cands) key += std::string(" ") + conv_algo_name(a);
  return key;
}

// The choice stored on disk for key, if it names one of the candidates (anything else is ignored).
std::optional<ConvAlgo> stored_choice(const std::string& key, const std::vector<ConvAlgo>& cands) {
  const detail::ConvChoiceStore& store = detail::conv_choice_store();
  if (!store.load || !chooser().on_disk.load()) return std::nullopt;
  const std::string name = store.load(key);
  for (ConvAlgo a : cands)
    if (name == conv_algo_name(a)) return a;
  return std::nullopt;
}

// Runs pass p by the forced, remembered or fastest measured algorithm.
Tensor run_pass(Pass p, const ConvGeom& g, DType dt, Device device, const Runner& run) {
  const std::vector<ConvAlgo> cands = candidates(p, g, dt, device);
  auto use = [&](ConvAlgo a) {
    t_last_algo = a;
    return run(a);
  };
  const ConvAlgo forced = forced_algo();
  if (forced != ConvAlgo::Auto) {
    // A forced algorithm that cannot run this problem gives way to the preferred GEMM one.
    const bool ok = std::find(cands.begin(), cands.end(), forced) != cands.end();
    return use(ok ? forced : cands[0]);
  }
  const std::string key = problem_str(p, g, dt, device);
  {
    std::lock_guard<std::mutex> lock(chooser().mutex);
    auto it = chooser().choices.find(key);
    if (it != chooser().choices.end()) return use(it->second);
  }
  const std::string disk_key = choice_key(key, device, cands);
  if (const std::optional<ConvAlgo> stored = stored_choice(disk_key, cands)) {
    {
      std::lock_guard<std::mutex> lock(chooser().mutex);
      chooser().choices.emplace(key, *stored);
    }
    if (log_conv())
      std::cerr << "[kiln conv] " << key << ": " << conv_algo_name(*stored) << " (from cache)\n";
    return use(*stored);
  }
  // Measure each candidate on the real operands, twice: the first run also pays one-time costs
  // (oneDNN generating its kernel, first touches of fresh buffers), so the faster run counts. The
  // fastest candidate's result is kept; ties go to the earlier one, the one Theano's rule
  // prefers.
  Tensor best;
  ConvAlgo best_algo = cands[0];
  double best_ms = 0;
  std::ostringstream times;
  for (ConvAlgo a : cands) {
    Tensor r;
    double ms = 0;
    for (int run_index = 0; run_index < 2; ++run_index) {
      const auto t0 = std::chrono::steady_clock::now();
      r = run(a);
      detail::synchronize_device(r);  // a device pass is done when its kernels are
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ms = run_index == 0 ? t : std::min(ms, t);
    }
    times << (best.defined() ? ", " : "") << conv_algo_name(a) << " " << ms << " ms";
    if (!best.defined() || ms < best_ms) {
      best = r;
      best_algo = a;
      best_ms = ms;
    }
  }
  {
    std::lock_guard<std::mutex> lock(chooser().mutex);
    chooser().choices.emplace(key, best_algo);
  }
  if (detail::conv_choice_store().store && chooser().on_disk.load())
    detail::conv_choice_store().store(disk_key, conv_algo_name(best_algo));
  t_last_algo = best_algo;
  if (log_conv())
    std::cerr << "[kiln conv] " << key << ": " << conv_algo_name(best_algo) << " (measured "
              << times.str() << "; Theano's rule prefers "
              << (theano_prefers_forward(g) ? "the forward" : "the weight-gradient")
              << " formulation)\n";
  return best;
}

// ---------------------------------------------------------------------------------- the passes

// A problem with no images or channels: every sum is empty, so every result is zero (a GEMM over
// none would divide work by zero).
bool empty_problem(const ConvGeom& g) {
  return g.N == 0 || g.C == 0 || g.O == 0;
}
// An input or output gradient as a pass reads it: the device's im2col and group kernels read any
// strides, the CPU's kernels want contiguous data.
Tensor data_layout(const Tensor& t) {
  return t.device().is_cuda() ? t : t.contiguous();
}
TensorOptions options_of(const Tensor& t) {
  return TensorOptions(t.dtype()).device(t.device());
}

Tensor forward_kernel(const Tensor& input, const Tensor& weight, const Tensor& bias,
                      const ConvGeom& g) {
  AutoGradMode kernel_only(false);
  const Tensor x = data_layout(input), w = weight.contiguous();
  Tensor y = empty_problem(g) ? zeros({g.N, g.O, g.oH, g.oW}, options_of(x))
                              : run_pass(Pass::Forward, g, x.dtype(), x.device(), [&](ConvAlgo a) {
                                  if (a == ConvAlgo::OneDNN) return forward_onednn(x, w, g);
                                  if (a == ConvAlgo::WeightGrad)
                                    return forward_weight_grad(x, w, g);
                                  return forward_im2col(x, w, g, a);
                                });
  if (bias.defined() && y.device().is_cuda()) {
    detail::cuda_conv::add_bias(y, bias);  // the evaluator runs no composite op on a device
  } else if (bias.defined()) {
    y.add_(bias.reshape({1, g.O, 1, 1}));
  }
  return y;
}

// The epilogue computed by kiln's ops on a convolution's output y (in place), for the algorithms
// without post-ops: as many passes over y as there are parts.
Tensor apply_epilogue(Tensor y, const Epilogue& e) {
  if (e.bias.defined()) y.add_(e.bias.reshape({1, e.bias.size(0), 1, 1}));
  if (e.residual.defined()) y.add_(e.residual);
  if (e.activation == "relu") return relu(y);
  if (e.activation == "gelu") return gelu(y, "none");
  if (e.activation == "gelu_tanh") return gelu(y, "tanh");
  if (e.activation == "silu") return silu(y);
  return y;
}

Tensor conv2d_epilogue_kernel(const Inputs& in, const Attrs& a) {
  const char* op = "conv2d_epilogue";
  const ConvArgs args =
      conv_args(op, attr_ints(a.at(0)), attr_ints(a.at(1)), attr_ints(a.at(2)), attr_int(a.at(3)));
  const ConvGeom g =
      make_geom(op, in[0].sizes(), in[1].sizes(), args, operands("input", in[0], "weight", in[1]));
  Epilogue e{in[2], in[3], detail::attr_string(a.at(4))};
  KILN_CHECK(!e.bias.defined() || e.bias.sizes() == Shape{g.O}, op, ": expected bias of shape [",
             g.O, "], got ", describe(e.bias));
  KILN_CHECK(!e.residual.defined() || e.residual.sizes() == Shape({g.N, g.O, g.oH, g.oW}), op,
             ": expected a residual of the output's shape ", shape_str({g.N, g.O, g.oH, g.oW}),
             ", got ", describe(e.residual));
  AutoGradMode kernel_only(false);
  const Tensor x = in[0].contiguous(), w = in[1].contiguous();
  if (e.bias.defined()) e.bias = e.bias.contiguous();
  if (empty_problem(g))
    return apply_epilogue(zeros({g.N, g.O, g.oH, g.oW}, TensorOptions(x.dtype())), e);
  return run_pass(Pass::Forward, g, x.dtype(), x.device(), [&](ConvAlgo algo) {
    if (algo == ConvAlgo::OneDNN) return forward_onednn(x, w, g, e);
    return apply_epilogue(
        algo == ConvAlgo::WeightGrad ? forward_weight_grad(x, w, g) : forward_im2col(x, w, g, algo),
        e);
  });
}

Tensor grad_input_kernel(const Tensor& grad_output, const Tensor& weight, const ConvGeom& g) {
  AutoGradMode kernel_only(false);
  const Tensor gy = data_layout(grad_output), w = weight.contiguous();
  if (empty_problem(g)) return zeros({g.N, g.C, g.H, g.W}, options_of(gy));
  return run_pass(Pass::GradInput, g, gy.dtype(), gy.device(), [&](ConvAlgo a) {
    return a == ConvAlgo::OneDNN ? grad_input_onednn(gy, w, g) : grad_input_im2col(gy, w, g, a);
  });
}

Tensor grad_weight_kernel(const Tensor& grad_output, const Tensor& input, const ConvGeom& g) {
  AutoGradMode kernel_only(false);
  const Tensor gy = data_layout(grad_output), x = data_layout(input);
  if (empty_problem(g)) return zeros({g.O, g.Cg(), g.kH, g.kW}, options_of(gy));
  return run_pass(Pass::GradWeight, g, gy.dtype(), gy.device(), [&](ConvAlgo a) {
    return a == ConvAlgo::OneDNN ? grad_weight_onednn(gy, x, g) : grad_weight_im2col(gy, x, g, a);
  });
}

Tensor saved_if(bool needed, const Tensor& t) {
  return needed ? t : Tensor();
}

// conv2d on a batched 4-D input, under the name `op` (conv2d, conv1d) for errors.
Tensor conv2d_batched(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                      const ConvArgs& a, const std::string& what) {
  const ConvGeom g = make_geom(op, x.sizes(), w.sizes(), a, what);
  if (b.defined())
    KILN_CHECK(b.dim() == 1 && b.size(0) == g.O, op, ": expected bias of shape [", g.O,
               "] (the output channels), got ", describe(b), " (", what, ")");
  Tensor out;
  if (detail::should_record({x, w, b})) {
    out = detail::lazy_record1(conv2d_def, {x, w, b}, {a.stride, a.padding, a.dilation, a.groups},
                               {{g.N, g.O, g.oH, g.oW}, x.dtype()});
  } else {
    out = forward_kernel(x, w, b, g);
  }
  if (detail::needs_grad(x, w, b))
    detail::record(
        "conv2d", {x, w, b}, {out},
        {saved_if(detail::requires_grad(w), x), saved_if(detail::requires_grad(x), w)},
        [a, xs = x.sizes(), ws = w.sizes()](const detail::BackwardContext& c) {
          const Tensor &gy = c.grad(), &x = c.saved(0), &w = c.saved(1);
          std::vector<Tensor> grads(3);
          if (c.needs_grad(0))
            grads[0] = conv2d_grad_input(gy, w, xs, a.stride, a.padding, a.dilation, a.groups);
          if (c.needs_grad(1))
            grads[1] = conv2d_grad_weight(gy, x, ws, a.stride, a.padding, a.dilation, a.groups);
          if (c.needs_grad(2)) grads[2] = sum(gy, {0, 2, 3});
          return grads;
        });
  return out;
}

// conv3d of batched x [N, C, D, H, W] by w [O, C / groups, kD, kH, kW] over its depth: the kD
// depth slices each output depth reads, gathered side by side as the channels of one conv2d over
// [N oD, (group, kd, c), H, W] whose weight is the [O, kD C / groups, kH, kW] view of w's, so the
// whole volume is one GEMM; autograd differentiates through the gather and the conv2d.
Tensor conv3d_over_depth(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias,
                         const Shape& s, const Shape& p, const Shape& d, int64_t groups,
                         const std::string& what) {
  KILN_CHECK(groups > 0, op, ": expected groups > 0, got ", groups);
  const int64_t N = x.size(0), O = w.size(0), Cg = w.size(1), kD = w.size(2);
  KILN_CHECK(x.size(1) == Cg * groups, op, ": expected input with ", Cg * groups,
             " channels (weight's ", Cg, " per group times ", groups, " groups): ", what);
  KILN_CHECK(O % groups == 0, op, ": groups (", groups, ") must divide the output channels (", O,
             "): ", what);
  for (int64_t i = 0; i < 3; ++i)
    KILN_CHECK(x.size(2 + i) + 2 * p[i] >= d[i] * (w.size(2 + i) - 1) + 1, op,
               ": the (dilated) kernel does not fit the padded input: ", what);
  if (bias.defined())
    KILN_CHECK(bias.size(0) == O, op, ": expected bias of shape [", O, "], got ", describe(bias));
  const int64_t oD = (x.size(2) + 2 * p[0] - d[0] * (kD - 1) - 1) / s[0] + 1;
  const Tensor padded = p[0] > 0 ? pad(x, {0, 0, 0, 0, p[0], p[0]}) : x;
  const TensorOptions i64 = TensorOptions(kInt64).device(x.device());
  const Tensor depths =
      (arange(oD, i64) * s[0]).view({-1, 1}) + (arange(kD, i64) * d[0]).view({1, -1});
  const int64_t H = x.size(3), W = x.size(4);
  const Tensor slabs = index_select(padded, 2, depths.reshape({-1}))
                           .view({N, groups, Cg, oD, kD, H, W})
                           .permute({0, 3, 1, 4, 2, 5, 6})
                           .reshape({N * oD, groups * kD * Cg, H, W});
  const Tensor w2 = w.permute({0, 2, 1, 3, 4}).reshape({O, kD * Cg, w.size(3), w.size(4)});
  const Tensor y = conv2d_batched(
      op, slabs, w2, {}, conv_args(op, {s[1], s[2]}, {p[1], p[2]}, {d[1], d[2]}, groups), what);
  const Tensor out = y.view({N, oD, O, y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
  return bias.defined() ? out + bias.view({1, O, 1, 1, 1}) : out.contiguous();
}

// conv2d, conv1d (spatial = 1: a 2-D convolution with H = 1) or conv3d with explicit padding.
Tensor conv_nd(const char* op, int64_t spatial, const Tensor& input, const Tensor& weight,
               const Tensor& bias, const Shape& stride, const Shape& padding, const Shape& dilation,
               int64_t groups) {
  detail::check_defined(input, op, "input");
  const int64_t rank = input.dim() == spatial + 1 ? spatial + 1 : spatial + 2;
  KILN_CHECK(input.dim() == spatial + 1 || input.dim() == spatial + 2, op, ": expected a ",
             spatial + 1, "-D (unbatched) or ", spatial + 2, "-D (batched) input, got ",
             describe(input));
  check_operand(op, input, "input", rank);
  check_operand(op, weight, "weight", spatial + 2);
  check_same_dtype(op, input, "input", weight, "weight");
  if (bias.defined()) {
    check_operand(op, bias, "bias", 1);
    check_same_dtype(op, input, "input", bias, "bias");
  }
  const std::string what = operands("input", input, "weight", weight);
  const Shape s = spatial_arg(op, "stride", stride, spatial, 1);
  const Shape p = spatial_arg(op, "padding", padding, spatial, 0);
  const Shape d = spatial_arg(op, "dilation", dilation, spatial, 1);
  Tensor x = rank == spatial + 1 ? input.unsqueeze(0) : input, w = weight;
  if (spatial == 3) {
    const Tensor y = conv3d_over_depth(op, x, w, bias, s, p, d, groups, what);
    return rank == spatial + 1 ? y.squeeze(0) : y;
  }
  if (spatial == 1) {  // H = 1: the 1-D arguments are the W ones
    x = x.unsqueeze(2);
    w = w.unsqueeze(2);
  }
  const ConvArgs a = spatial == 1 ? conv_args(op, {1, s[0]}, {0, p[0]}, {1, d[0]}, groups)
                                  : conv_args(op, s, p, d, groups);
  Tensor y = conv2d_batched(op, x, w, bias, a, what);
  if (spatial == 1) y = y.squeeze(2);
  return rank == spatial + 1 ? y.squeeze(0) : y;
}

// "same" (stride 1: the output keeps the input's size; an odd total padding puts the extra row
// or column at the bottom/right, as torch) or "valid" (no padding).
Tensor conv_nd_mode(const char* op, int64_t spatial, const Tensor& input, const Tensor& weight,
                    const Tensor& bias, const Shape& stride, const std::string& mode,
                    const Shape& dilation, int64_t groups) {
  KILN_CHECK(mode == "same" || mode == "valid", op,
             ": padding must be \"same\" or \"valid\", got \"", mode, "\"");
  if (mode == "valid")
    return conv_nd(op, spatial, input, weight, bias, stride, {0}, dilation, groups);
  const Shape s = spatial_arg(op, "stride", stride, spatial, 1);
  KILN_CHECK(std::all_of(s.begin(), s.end(), [](int64_t v) { return v == 1; }), op,
             ": padding=\"same\" is not supported for strided convolutions (stride ",
             shape_str(stride), ")");
  detail::check_defined(weight, op, "weight");
  KILN_CHECK(weight.dim() == spatial + 2, op, ": expected weight to be ", spatial + 2, "-D, got ",
             describe(weight));
  const Shape d = spatial_arg(op, "dilation", dilation, spatial, 1);
  Shape pad(spatial);
  Tensor x = input;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t total = d[i] * (weight.size(2 + i) - 1);
    pad[i] = total / 2;
    if (total % 2 == 1) {  // one more zero row/column at the end
      Shape zs = x.sizes();
      const int64_t dim = x.dim() - spatial + i;
      zs[dim] = 1;
      x = cat({x, zeros(zs, options_of(x))}, dim);
    }
  }
  return conv_nd(op, spatial, x, weight, bias, stride, pad, dilation, groups);
}

// The geometry of a gradient pass, checked against the grad_output it receives.
ConvGeom grad_geom(const char* op, const Tensor& gy, const Shape& in, const Shape& w,
                   const ConvArgs& a, const std::string& what) {
  const ConvGeom g = make_geom(op, in, w, a, what);
  KILN_CHECK(gy.sizes() == Shape({g.N, g.O, g.oH, g.oW}), op, ": expected grad_output of shape ",
             shape_str({g.N, g.O, g.oH, g.oW}), " for input ", shape_str(in), " and weight ",
             shape_str(w), ", got ", describe(gy));
  return g;
}

void check_size_arg(const char* op, const char* name, const Shape& s) {
  KILN_CHECK(s.size() == 4 && std::all_of(s.begin(), s.end(), [](int64_t v) { return v > 0; }), op,
             ": expected ", name, " to be 4 positive sizes, got ", shape_str(s));
}

}  // namespace

// ----------------------------------------------------------------------------------- public ops

namespace detail {
const char* conv_algo_name(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::Auto:
      return "auto";
    case ConvAlgo::Gemm:
      return "gemm";
    case ConvAlgo::Im2col:
      return "im2col";
    case ConvAlgo::WeightGrad:
      return "weight-grad";
    case ConvAlgo::OneDNN:
      return "onednn";
    case ConvAlgo::Im2colL2:
      return "im2col_l2";
  }
  return "?";
}
void set_conv_algo(ConvAlgo a) {
  chooser().forced.store(a == ConvAlgo::Auto ? -1 : static_cast<int>(a));
}
void clear_conv_choices() {
  std::lock_guard<std::mutex> lock(chooser().mutex);
  chooser().choices.clear();
}
ConvAlgo last_conv_algo() {
  return t_last_algo;
}
void set_conv_choices_on_disk(bool on) {
  chooser().on_disk.store(on);
}
ConvChoiceStore& conv_choice_store() {
  static ConvChoiceStore store;  // set once by exec/init.cpp at load, before any op runs
  return store;
}
}  // namespace detail

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              const Shape& padding, const Shape& dilation, int64_t groups) {
  return conv_nd("conv2d", 2, input, weight, bias, stride, padding, dilation, groups);
}
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              PaddingMode padding, const Shape& dilation, int64_t groups) {
  return conv_nd_mode("conv2d", 2, input, weight, bias, stride, padding.name, dilation, groups);
}
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              const Shape& padding, const Shape& dilation, int64_t groups) {
  return conv_nd("conv1d", 1, input, weight, bias, stride, padding, dilation, groups);
}
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              const Shape& padding, const Shape& dilation, int64_t groups) {
  return conv_nd("conv3d", 3, input, weight, bias, stride, padding, dilation, groups);
}
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              PaddingMode padding, const Shape& dilation, int64_t groups) {
  return conv_nd_mode("conv3d", 3, input, weight, bias, stride, padding.name, dilation, groups);
}
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              PaddingMode padding, const Shape& dilation, int64_t groups) {
  return conv_nd_mode("conv1d", 1, input, weight, bias, stride, padding.name, dilation, groups);
}

Tensor conv2d_grad_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_size,
                         const Shape& stride, const Shape& padding, const Shape& dilation,
                         int64_t groups) {
  const char* op = "conv2d_grad_input";
  check_operand(op, grad_output, "grad_output", 4);
  check_operand(op, weight, "weight", 4);
  check_same_dtype(op, grad_output, "grad_output", weight, "weight");
  check_size_arg(op, "input_size", input_size);
  const ConvArgs a = conv_args(op, stride, padding, dilation, groups);
  const ConvGeom g = grad_geom(op, grad_output, input_size, weight.sizes(), a,
                               operands("grad_output", grad_output, "weight", weight));
  Tensor out;
  if (detail::should_record(grad_output, weight)) {
    out = detail::lazy_record1(grad_input_def, {grad_output, weight},
                               {input_size, a.stride, a.padding, a.dilation, a.groups},
                               {input_size, grad_output.dtype()});
  } else {
    out = grad_input_kernel(grad_output, weight, g);
  }
  if (detail::needs_grad(grad_output, weight))
    detail::record(op, {grad_output, weight}, {out},
                   {saved_if(detail::requires_grad(weight), grad_output),
                    saved_if(detail::requires_grad(grad_output), weight)},
                   [a, ws = weight.sizes()](const detail::BackwardContext& c) {
                     const Tensor &gg = c.grad(), &gy = c.saved(0), &w = c.saved(1);
                     std::vector<Tensor> grads(2);
                     if (c.needs_grad(0))
                       grads[0] = conv2d(gg, w, {}, a.stride, a.padding, a.dilation, a.groups);
                     if (c.needs_grad(1))
                       grads[1] = conv2d_grad_weight(gy, gg, ws, a.stride, a.padding, a.dilation,
                                                     a.groups);
                     return grads;
                   });
  return out;
}

Tensor conv2d_grad_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_size,
                          const Shape& stride, const Shape& padding, const Shape& dilation,
                          int64_t groups) {
  const char* op = "conv2d_grad_weight";
  check_operand(op, grad_output, "grad_output", 4);
  check_operand(op, input, "input", 4);
  check_same_dtype(op, grad_output, "grad_output", input, "input");
  check_size_arg(op, "weight_size", weight_size);
  const ConvArgs a = conv_args(op, stride, padding, dilation, groups);
  const ConvGeom g = grad_geom(op, grad_output, input.sizes(), weight_size, a,
                               operands("grad_output", grad_output, "input", input));
  Tensor out;
  if (detail::should_record(grad_output, input)) {
    out = detail::lazy_record1(grad_weight_def, {grad_output, input},
                               {weight_size, a.stride, a.padding, a.dilation, a.groups},
                               {weight_size, grad_output.dtype()});
  } else {
    out = grad_weight_kernel(grad_output, input, g);
  }
  if (detail::needs_grad(grad_output, input))
    detail::record(op, {grad_output, input}, {out},
                   {saved_if(detail::requires_grad(input), grad_output),
                    saved_if(detail::requires_grad(grad_output), input)},
                   [a, xs = input.sizes()](const detail::BackwardContext& c) {
                     const Tensor &gg = c.grad(), &gy = c.saved(0), &x = c.saved(1);
                     std::vector<Tensor> grads(2);
                     if (c.needs_grad(0))
                       grads[0] = conv2d(x, gg, {}, a.stride, a.padding, a.dilation, a.groups);
                     if (c.needs_grad(1))
                       grads[1] =
                           conv2d_grad_input(gy, gg, xs, a.stride, a.padding, a.dilation, a.groups);
                     return grads;
                   });
  return out;
}

// The input gradient of the convolution whose output this input would be: its size is
// (H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const Shape& stride, const Shape& padding, const Shape& output_padding,
                        int64_t groups, const Shape& dilation) {
  const char* op = "conv_transpose2d";
  detail::check_defined(input, op, "input");
  KILN_CHECK(input.dim() == 3 || input.dim() == 4, op,
             ": expected a 3-D (unbatched) or 4-D (batched) input, got ", describe(input));
  if (input.dim() == 3)
    return conv_transpose2d(input.unsqueeze(0), weight, bias, stride, padding, output_padding,
                            groups, dilation)
        .squeeze(0);
  check_operand(op, input, "input", 4);
  check_operand(op, weight, "weight", 4);
  check_same_dtype(op, input, "input", weight, "weight");
  const std::string what = operands("input", input, "weight", weight);
  const ConvArgs a = conv_args(op, stride, padding, dilation, groups);
  const Shape op_pad = spatial_arg(op, "output_padding", output_padding, 2, 0);
  KILN_CHECK(input.size(1) == weight.size(0), op, ": expected input with ", weight.size(0),
             " channels (weight's first dim), got ", input.size(1), ": ", what);
  KILN_CHECK(weight.size(0) % groups == 0, op, ": groups (", groups,
             ") must divide the input channels (", weight.size(0), "): ", what);
  const int64_t C_out = weight.size(1) * groups;
  Shape out_size{input.size(0), C_out, 0, 0};
  for (int i = 0; i < 2; ++i) {
    KILN_CHECK(op_pad[i] < a.stride[i], op, ": output_padding (", shape_str(op_pad),
               ") must be smaller than stride (", shape_str(a.stride), ")");
    out_size[2 + i] = (input.size(2 + i) - 1) * a.stride[i] - 2 * a.padding[i] +
                      a.dilation[i] * (weight.size(2 + i) - 1) + op_pad[i] + 1;
    KILN_CHECK(out_size[2 + i] > 0, op, ": the output size ", shape_str(out_size),
               " would be empty for ", what);
  }
  if (bias.defined()) {
    check_operand(op, bias, "bias", 1);
    check_same_dtype(op, input, "input", bias, "bias");
    KILN_CHECK(bias.size(0) == C_out, op, ": expected bias of shape [", C_out, "], got ",
               describe(bias));
  }
  Tensor y = conv2d_grad_input(input, weight, out_size, a.stride, a.padding, a.dilation, groups);
  return bias.defined() ? y + bias.reshape({1, C_out, 1, 1}) : y;
}

Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const Shape& stride, const Shape& padding, const Shape& output_padding,
                        int64_t groups, const Shape& dilation) {
  const char* op = "conv_transpose1d";
  detail::check_defined(input, op, "input");
  detail::check_defined(weight, op, "weight");
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, op,
             ": expected a 2-D (unbatched) or 3-D (batched) input, got ", describe(input));
  KILN_CHECK(weight.dim() == 3, op, ": expected a 3-D weight [C, O / groups, k], got ",
             describe(weight));
  const Shape s = spatial_arg(op, "stride", stride, 1, 1);
  const Shape p = spatial_arg(op, "padding", padding, 1, 0);
  const Shape o = spatial_arg(op, "output_padding", output_padding, 1, 0);
  const Shape d = spatial_arg(op, "dilation", dilation, 1, 1);
  KILN_CHECK(o[0] < s[0], op, ": output_padding (", o[0], ") must be smaller than stride (", s[0],
             ")");
  // H = 1: the 1-D arguments are the W ones.
  return conv_transpose2d(input.unsqueeze(-2), weight.unsqueeze(2), bias, {1, s[0]}, {0, p[0]},
                          {0, o[0]}, groups, {1, d[0]})
      .squeeze(-2);
}

Shape detail::spatial_arg(const char* op, const char* name, const Shape& v, size_t dims,
                          int64_t min) {
  KILN_CHECK(v.size() == 1 || v.size() == dims, op, ": expected ", name, " to have 1 or ", dims,
             " values, got ", shape_str(v));
  Shape out = v.size() == 1 ? Shape(dims, v[0]) : v;
  for (int64_t x : out)
    KILN_CHECK(x >= min, op, ": expected ", name, " values >= ", min, ", got ", shape_str(v));
  return out;
}

}  // namespace kiln
