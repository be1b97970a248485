// Pooling (max_pool2d and adaptive_max_pool2d with indices, avg_pool2d, adaptive_avg_pool2d) and
// normalization over channels (batch_norm, instance_norm, group_norm, local_response_norm), NCHW
// on the CPU.
//
// Pooling runs dedicated kernels, one task per (n, c) plane (on a CUDA device,
// lib/ops/conv_cuda.cpp's NVRTC kernels, one thread per output element). Every pooling op visits
// the same windows in its forward and its backward: window (oh, ow) covers rows [h0, h1) and
// columns [w0, w1) of the plane, clipped to it, as torch computes them (pool_window). max_pool2d
// records the position of each window's maximum (the first one; a NaN counts as the maximum), and
// its backward adds each gradient at its position; the gradient of that backward is a gather at the
// same positions. The average pools are linear, so each one's backward is its adjoint op and the
// adjoint's gradient is the forward op again.
//
// batch_norm and group_norm are compositions of reductions and elementwise ops, which lazy mode
// fuses like any other expression; autograd differentiates group_norm (twice, too) through its
// ops, and training batch_norm through a formula of its own whose ops differentiate again
// (normalize), written so that its statistics and its backward's sums are one kernel each.
// instance_norm is batch_norm of [1, N C, ...] (torch's construction), its running statistics the
// mean over N of the repeated ones batch_norm updated; local_response_norm divides by an average
// pool of the squares over neighbouring channels.
// Eval batch_norm is a per-channel affine, which jit/passes/conv_fold.cpp folds into a
// preceding convolution. batch_norm in training updates the running statistics in place with no
// gradient, as torch: running = (1 - momentum) * running + momentum * batch statistic, the variance
// unbiased.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/ops/conv.h"
#include "lib/ops/conv_cuda.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::attr_bool;
using detail::attr_ints;
using detail::Attrs;
using detail::describe;
using detail::shape_str;

namespace {

using Inputs = std::vector<Tensor>;

// The geometry of a 2-D pooling of an [N, C, H, W] input into [N, C, oH, oW].
struct PoolGeom {
  int64_t N = 0, C = 0, H = 0, W = 0, oH = 0, oW = 0;
  Shape kernel{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  bool ceil_mode = false, count_include_pad = true;
  bool adaptive =
      false;  // adaptive_avg_pool2d's windows: [floor(o * H / oH), ceil((o + 1) * H / oH))
};

struct Window {
  int64_t h0, h1, w0, w1;
  double divisor;  // the average pools' divisor
};

// torch's windows: for the fixed-size pools the window starts at o * stride - padding, ends a
// kernel later but not past the padded input, is then clipped to the input, and divides by the
// padded size (count_include_pad) or the clipped one.
Window pool_window(const PoolGeom& g, int64_t oh, int64_t ow) {
  Window w{};
  if (g.adaptive) {
    w.h0 = oh * g.H / g.oH;
    w.h1 = ((oh + 1) * g.H + g.oH - 1) / g.oH;
    w.w0 = ow * g.W / g.oW;
    w.w1 = ((ow + 1) * g.W + g.oW - 1) / g.oW;
    w.divisor = static_cast<double>((w.h1 - w.h0) * (w.w1 - w.w0));
    return w;
  }
  const int64_t h0 = oh * g.stride[0] - g.padding[0], w0 = ow * g.stride[1] - g.padding[1];
  const int64_t h1 = std::min(h0 + (g.kernel[0] - 1) * g.dilation[0] + 1, g.H + g.padding[0]);
  const int64_t w1 = std::min(w0 + (g.kernel[1] - 1) * g.dilation[1] + 1, g.W + g.padding[1]);
  const double padded = static_cast<double>((h1 - h0) * (w1 - w0));
  w.h0 = std::max<int64_t>(h0, 0);
  w.w0 = std::max<int64_t>(w0, 0);
  w.h1 = std::min(h1, g.H);
  w.w1 = std::min(w1, g.W);
  w.divisor = g.count_include_pad ? padded : static_cast<double>((w.h1 - w.h0) * (w.w1 - w.w0));
  return w;
}

void check_pool_input(const char* op, const Tensor& x) {
  detail::check_defined(x, op, "input");
  KILN_CHECK(x.dim() == 4, op, ": expected a 3-D (unbatched) or 4-D (batched) input, got ",
             describe(x));
  KILN_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, op,
             ": expected a float32 or float64 input, got ", describe(x));
  KILN_CHECK(x.size(2) > 0 && x.size(3) > 0, op, ": expected a non-empty image, got ", describe(x));
}

// The checked geometry of a fixed-size pooling.
PoolGeom fixed_geom(const char* op, const Tensor& x, const Shape& kernel, const Shape& stride,
                    const Shape& padding, const Shape& dilation, bool ceil_mode,
                    bool count_include_pad) {
  check_pool_input(op, x);
  PoolGeom g;
  g.N = x.size(0);
  g.C = x.size(1);
  g.H = x.size(2);
  g.W = x.size(3);
  g.kernel = detail::spatial_arg(op, "kernel_size", kernel, 2, 1);
  g.stride = stride.empty() ? g.kernel : detail::spatial_arg(op, "stride", stride, 2, 1);
  g.padding = detail::spatial_arg(op, "padding", padding, 2, 0);
  g.dilation = detail::spatial_arg(op, "dilation", dilation, 2, 1);
  g.ceil_mode = ceil_mode;
  g.count_include_pad = count_include_pad;
  for (int i = 0; i < 2; ++i) {
    const int64_t extent = (g.kernel[i] - 1) * g.dilation[i] + 1;
    KILN_CHECK(2 * g.padding[i] <= extent, op, ": padding ", shape_str(g.padding),
               " should be at most half of the (dilated) kernel size ", shape_str(g.kernel),
               " for input ", describe(x));
    const int64_t in = x.size(2 + i);
    KILN_CHECK(in + 2 * g.padding[i] >= extent, op, ": the (dilated) kernel ", shape_str(g.kernel),
               " is larger than the padded input of input ", describe(x));
    (i == 0 ? g.oH : g.oW) = detail::pool_output_size(in, g.kernel[i], g.stride[i], g.padding[i],
                                                      g.dilation[i], ceil_mode);
  }
  return g;
}

// The checked geometry of an adaptive pooling of batched x to output_size (1 or 2 values).
PoolGeom adaptive_geom(const char* op, const Tensor& x, const Shape& output_size) {
  check_pool_input(op, x);
  const Shape out = detail::spatial_arg(op, "output_size", output_size, 2, 1);
  PoolGeom g;
  g.N = x.size(0);
  g.C = x.size(1);
  g.H = x.size(2);
  g.W = x.size(3);
  g.oH = out[0];
  g.oW = out[1];
  g.adaptive = true;
  return g;
}

// The geometry as the CUDA kernels take it.
detail::cuda_conv::PoolShape cuda_shape(const PoolGeom& g) {
  return {g.N,          g.C,          g.H,           g.W,           g.oH,
          g.oW,         g.kernel[0],  g.kernel[1],   g.stride[0],   g.stride[1],
          g.padding[0], g.padding[1], g.dilation[0], g.dilation[1], g.count_include_pad,
          g.adaptive};
}

// Runs f(plane index, input plane offset, output plane offset) over the N * C planes in parallel.
template <typename F>
void for_planes(const PoolGeom& g, const F& f) {
  const int64_t work = std::max<int64_t>(1, g.H * g.W + g.oH * g.oW);
  detail::parallel_for(g.N * g.C, std::max<int64_t>(1, detail::kParallelGrain / work),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t p = begin; p < end; ++p) f(p * g.H * g.W, p * g.oH * g.oW);
                       });
}

// ---------------------------------------------------------------------------------- max_pool2d

// The rows (axis 0) or columns (axis 1) the max pools read for output o: `count` positions from
// `start`, `step` apart, those in the padding skipped; an adaptive window is contiguous.
struct MaxSpan {
  int64_t start, count, step;
};
MaxSpan max_span(const PoolGeom& g, int axis, int64_t o) {
  if (g.adaptive) {
    const int64_t in = axis == 0 ? g.H : g.W, out = axis == 0 ? g.oH : g.oW;
    const int64_t start = o * in / out;
    return {start, ((o + 1) * in + out - 1) / out - start, 1};
  }
  return {o * g.stride[axis] - g.padding[axis], g.kernel[axis], g.dilation[axis]};
}

std::pair<Tensor, Tensor> max_pool_kernel(const Tensor& input, const PoolGeom& g) {
  if (input.device().is_cuda()) return detail::cuda_conv::max_pool(input, cuda_shape(g));
  const Tensor x = input.contiguous();
  Tensor out = detail::make_empty({g.N, g.C, g.oH, g.oW}, x.dtype());
  Tensor idx = detail::make_empty({g.N, g.C, g.oH, g.oW}, kInt64);
  detail::dispatch_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* xp = std::as_const(x).data_ptr<T>();
    T* op = out.data_ptr<T>();
    int64_t* ip = idx.data_ptr<int64_t>();
    for_planes(g, [&](int64_t in_off, int64_t out_off) {
      for (int64_t oh = 0; oh < g.oH; ++oh)
        for (int64_t ow = 0; ow < g.oW; ++ow) {
          const MaxSpan rows = max_span(g, 0, oh), cols = max_span(g, 1, ow);
          T best = -std::numeric_limits<T>::infinity();
          int64_t at = -1;
          for (int64_t i = 0; i < rows.count; ++i) {
            const int64_t h = rows.start + i * rows.step;
            if (h < 0 || h >= g.H) continue;
            for (int64_t j = 0; j < cols.count; ++j) {
              const int64_t w = cols.start + j * cols.step;
              if (w < 0 || w >= g.W) continue;
              const T v = xp[in_off + h * g.W + w];
              if (at < 0 || v > best || std::isnan(v)) {  // as torch: the last NaN wins
                best = v;
                at = h * g.W + w;
              }
            }
          }
          op[out_off + oh * g.oW + ow] = best;
          ip[out_off + oh * g.oW + ow] = at;
        }
    });
  });
  return {out, idx};
}

// gx [input_size] = gy added at the positions `indices` holds in each plane.
Tensor max_pool_backward_kernel(const Tensor& grad_output, const Tensor& indices,
                                const Shape& input_size) {
  PoolGeom g;
  g.N = input_size[0];
  g.C = input_size[1];
  g.H = input_size[2];
  g.W = input_size[3];
  g.oH = indices.size(2);
  g.oW = indices.size(3);
  if (grad_output.device().is_cuda())
    return detail::cuda_conv::max_pool_backward(grad_output, indices, cuda_shape(g));
  const Tensor gy = grad_output.contiguous(), ix = indices.contiguous();
  Tensor gx = detail::make_empty(input_size, gy.dtype());
  detail::dispatch_floating(gy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* gp = std::as_const(gy).data_ptr<T>();
    const int64_t* ip = std::as_const(ix).data_ptr<int64_t>();
    T* xp = gx.data_ptr<T>();
    for_planes(g, [&](int64_t in_off, int64_t out_off) {
      std::fill(xp + in_off, xp + in_off + g.H * g.W, T(0));
      for (int64_t o = 0; o < g.oH * g.oW; ++o) xp[in_off + ip[out_off + o]] += gp[out_off + o];
    });
  });
  return gx;
}

Tensor max_pool2d_backward(const Tensor& grad_output, const Tensor& indices,
                           const Shape& input_size);

detail::OpHandle max_pool_def;
detail::OpHandle adaptive_max_pool_def;
detail::OpHandle max_pool_backward_def;

// Inputs (x); outputs (values, indices).
void register_max_pools() {
  max_pool_def.bind(
      detail::register_op({"max_pool2d_with_indices",
                           detail::OpKind::NN,
                           1,
                           detail::DTypeRule::Custom,
                           false,
                           [](const Inputs& in, const Attrs& a) {
                             auto [values, indices] = max_pool2d_with_indices(
                                 in[0], attr_ints(a.at(0)), attr_ints(a.at(1)), attr_ints(a.at(2)),
                                 attr_ints(a.at(3)), attr_bool(a.at(4)));
                             return Inputs{values, indices};
                           },
                           {"kernel_size", "stride", "padding", "dilation", "ceil_mode"}}));
  adaptive_max_pool_def.bind(detail::register_op({"adaptive_max_pool2d",
                                                  detail::OpKind::NN,
                                                  1,
                                                  detail::DTypeRule::Custom,
                                                  false,
                                                  [](const Inputs& in, const Attrs& a) {
                                                    auto [values, indices] =
                                                        adaptive_max_pool2d_with_indices(
                                                            in[0], attr_ints(a.at(0)));
                                                    return Inputs{values, indices};
                                                  },
                                                  {"output_size"}}));
  // Inputs (grad_output, indices).
  max_pool_backward_def.bind(
      detail::register_op({"max_pool2d_backward",
                           detail::OpKind::NN,
                           2,
                           detail::DTypeRule::Custom,
                           false,
                           [](const Inputs& in, const Attrs& a) {
                             return Inputs{max_pool2d_backward(in[0], in[1], attr_ints(a.at(0)))};
                           },
                           {"input_size"}}));
}

Tensor max_pool2d_backward(const Tensor& grad_output, const Tensor& indices,
                           const Shape& input_size) {
  Tensor out;
  if (detail::should_record(grad_output, indices)) {
    out = detail::lazy_record1(max_pool_backward_def, {grad_output, indices}, {input_size},
                               {input_size, grad_output.dtype()});
  } else {
    AutoGradMode kernel_only(false);
    out = max_pool_backward_kernel(grad_output, indices, input_size);
  }
  // Its gradient reads gg at the same positions.
  if (detail::needs_grad(grad_output))
    detail::record("max_pool2d_backward", {grad_output}, {out}, {indices},
                   [](const detail::BackwardContext& c) {
                     const Tensor& ix = c.saved(0);
                     return std::vector<Tensor>{
                         gather(c.grad().flatten(2), 2, ix.flatten(2)).view(ix.sizes())};
                   });
  return out;
}

// ------------------------------------------------------------------------------ average pools

// The average pools' forward (out = window sums / divisor) and adjoint (each gradient spread
// over its window), on contiguous data.
Tensor avg_pool_kernel(const Tensor& input, const PoolGeom& g, bool adjoint) {
  if (input.device().is_cuda()) return detail::cuda_conv::avg_pool(input, cuda_shape(g), adjoint);
  const Tensor x = input.contiguous();
  Tensor out = detail::make_empty(adjoint ? Shape{g.N, g.C, g.H, g.W} : Shape{g.N, g.C, g.oH, g.oW},
                                  x.dtype());
  detail::dispatch_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* xp = std::as_const(x).data_ptr<T>();
    T* op = out.data_ptr<T>();
    for_planes(g, [&](int64_t in_off, int64_t out_off) {
      if (adjoint) std::fill(op + in_off, op + in_off + g.H * g.W, T(0));
      for (int64_t oh = 0; oh < g.oH; ++oh)
        for (int64_t ow = 0; ow < g.oW; ++ow) {
          const Window w = pool_window(g, oh, ow);
          if (adjoint) {
            const T v = T(xp[out_off + oh * g.oW + ow] / w.divisor);
            for (int64_t h = w.h0; h < w.h1; ++h)
              for (int64_t c = w.w0; c < w.w1; ++c) op[in_off + h * g.W + c] += v;
          } else {
            double s = 0;
            for (int64_t h = w.h0; h < w.h1; ++h)
              for (int64_t c = w.w0; c < w.w1; ++c) s += xp[in_off + h * g.W + c];
            op[out_off + oh * g.oW + ow] = T(s / w.divisor);
          }
        }
    });
  });
  return out;
}

Attrs pool_attrs(const PoolGeom& g) {
  return {Shape{g.N, g.C, g.H, g.W}, Shape{g.oH, g.oW}, g.kernel, g.stride, g.padding, g.ceil_mode,
          g.count_include_pad,       g.adaptive};
}
PoolGeom attrs_pool(const Attrs& a) {
  PoolGeom g;
  const Shape& in = attr_ints(a.at(0));
  const Shape& out = attr_ints(a.at(1));
  g.N = in[0];
  g.C = in[1];
  g.H = in[2];
  g.W = in[3];
  g.oH = out[0];
  g.oW = out[1];
  g.kernel = attr_ints(a.at(2));
  g.stride = attr_ints(a.at(3));
  g.padding = attr_ints(a.at(4));
  g.ceil_mode = attr_bool(a.at(5));
  g.count_include_pad = attr_bool(a.at(6));
  g.adaptive = attr_bool(a.at(7));
  return g;
}

Tensor avg_pool(const Tensor& x, const PoolGeom& g, bool adjoint);

detail::OpHandle avg_pool_def;
detail::OpHandle avg_pool_backward_def;

// Both directions of both average pools: the geometry (input and output sizes, the window rule)
// is the attributes, so one op serves avg_pool2d, adaptive_avg_pool2d and their gradients.
void register_avg_pools() {
  const std::vector<std::string> attr_names{
      "input_size", "output_size", "kernel_size",       "stride",
      "padding",    "ceil_mode",   "count_include_pad", "adaptive"};
  avg_pool_def.bind(
      detail::register_op({"avg_pool2d", detail::OpKind::NN, 1, detail::DTypeRule::Same, false,
                           [](const Inputs& in, const Attrs& a) {
                             return Inputs{avg_pool(in[0], attrs_pool(a), false)};
                           },
                           attr_names}));
  avg_pool_backward_def.bind(detail::register_op(
      {"avg_pool2d_backward", detail::OpKind::NN, 1, detail::DTypeRule::Same, false,
       [](const Inputs& in, const Attrs& a) {
         return Inputs{avg_pool(in[0], attrs_pool(a), true)};
       },
       attr_names}));
}

Tensor avg_pool(const Tensor& x, const PoolGeom& g, bool adjoint) {
  const Shape out_shape = adjoint ? Shape{g.N, g.C, g.H, g.W} : Shape{g.N, g.C, g.oH, g.oW};
  Tensor out;
  if (detail::should_record(x)) {
    out = detail::lazy_record1(adjoint ? avg_pool_backward_def : avg_pool_def, {x}, pool_attrs(g),
                               {out_shape, x.dtype()});
  } else {
    AutoGradMode kernel_only(false);
    out = avg_pool_kernel(x, g, adjoint);
  }
  if (detail::needs_grad(x))
    detail::record(adjoint ? "avg_pool2d_backward" : "avg_pool2d", {x}, {out}, {},
                   [g, adjoint](const detail::BackwardContext& c) {
                     return std::vector<Tensor>{avg_pool(c.grad(), g, !adjoint)};
                   });
  return out;
}

// An unbatched [C, H, W] input runs as a batch of one.
template <typename F>
Tensor batched(const Tensor& x, const F& f) {
  if (x.defined() && x.dim() == 3) return f(x.unsqueeze(0)).squeeze(0);
  return f(x);
}

// ------------------------------------------------------------------------------- normalization

void check_channel_param(const char* op, const Tensor& p, const char* name, const Tensor& x) {
  if (!p.defined()) return;
  KILN_CHECK(p.dim() == 1 && p.size(0) == x.size(1), op, ": expected ", name, " of shape [",
             x.size(1), "] (the input's channels), got ", describe(p), " for input ", describe(x));
  KILN_CHECK(p.device() == x.device(), op, ": expected ", name, " on ", x.device().str(), ", got ",
             p.device().str());
}

// p [C] viewed to broadcast over the channels of an input of rank `rank`.
Tensor per_channel(const Tensor& p, int64_t rank) {
  Shape s(static_cast<size_t>(rank), 1);
  s[1] = p.size(0);
  return p.reshape(s);
}

void check_norm_input(const char* op, const Tensor& x) {
  detail::check_defined(x, op, "input");
  KILN_CHECK(x.dim() >= 2, op, ": expected an input of at least 2 dims [N, C, ...], got ",
             describe(x));
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", describe(x));
}

// Dims 1.. of a tensor of rank `rank`: every dim but the channels of a channels-first view.
std::vector<int64_t> trailing_dims(int64_t rank) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < rank; ++d) dims.push_back(d);
  return dims;
}

// The number of values per channel of an [N, C, ...] input.
double per_channel_count(const Tensor& x) {
  return static_cast<double>(x.numel() / std::max<int64_t>(1, x.size(1)));
}

// Every dim but the channels (1) of a tensor of rank `rank`.
std::vector<int64_t> non_channel_dims(int64_t rank) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(d);
  return dims;
}

// Training batch_norm's statistics and the 1 / sqrt(var + eps) that normalizes.
//
// Recorded (lazy mode, traces), both fold every dim but the channels on the channels-first view
// [C, N, H, W] of the input, where they are row reductions over the trailing dims, which the
// fuser folds in one kernel reading each channel's values once: the sum and the sum of squares,
// accumulated in double (the input widened inside the kernel). The variance is taken about the
// mean rounded to the input's dtype, m: E[(x - m)^2] = E[x^2] - 2 m E[x] + m^2 exceeds the
// variance by (E[x] - m)^2, a relative 2^-48 of E[x]^2, and cancels in double, not in float.
// Computing it through m also makes the fused kernel one chain ending at invstd (its last node),
// so the mean, the variance and invstd are all outputs of that one kernel; a variance computed
// beside the mean would leave the mean's rounding to a kernel of its own. Eager mode runs the
// reference reductions over dims (0, 2, ...) in place instead (mean, and var's two passes):
// widened copies of the input would only cost it time. float64 has no wider type: recorded, its
// squares overflow past 1e154 (an open difference, docs/torch-differences.md).
struct BatchStats {
  Tensor mean, var, invstd;  // [C], of the input's dtype; var biased
};
BatchStats batch_stats(const Tensor& input, double eps) {
  BatchStats st;
  if (!detail::should_record(input)) {
    const std::vector<int64_t> dims = non_channel_dims(input.dim());
    st.mean = mean(input, dims);
    st.var = kiln::var(input, dims, 0);
  } else {
    const std::vector<int64_t> dims = trailing_dims(input.dim());
    const double n = per_channel_count(input);
    const Tensor xt = input.transpose(0, 1).to(kFloat64);
    const Tensor mean64 = xt.sum(dims) / n;
    st.mean = mean64.to(input.dtype());
    const Tensor m = st.mean.to(kFloat64);
    st.var = clamp((xt * xt).sum(dims) / n - m * (mean64 * 2.0 - m), 0.0).to(input.dtype());
  }
  st.invstd = rsqrt(st.var + eps);
  return st;
}

// (input - mean) * invstd * weight + bias, the per-channel [C] values broadcast over the
// channels; the weight and bias may be undefined.
Tensor normalize_kernel(const Tensor& input, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias) {
  const int64_t rank = input.dim();
  // invstd first: graphs list a node's operands in order, and the mean's view after the node that
  // computes invstd from it lets the kernel computing both finish before any reader of the mean.
  Tensor y = per_channel(invstd, rank) * (input - per_channel(mean, rank));
  if (weight.defined()) y = y * per_channel(weight, rank);
  if (bias.defined()) y = y + per_channel(bias, rank);
  return y;
}

// batch_norm's gradients from the output's gradient g, the input x and the batch's mean and
// invstd: {input, weight, bias}, each only when needed.
//   xhat = (x - mean) * invstd, A = invstd * weight
//   d bias = sum(g), d weight = sum(g * xhat), both over every dim but the channels
//   d x = A * (g - (q * (x - mean) + sum(g) / n)),  q = invstd * sum(g * xhat) / n
// Recorded, the two sums are row reductions of the channels-first views of g and x, in double
// (eager mode: the reference reductions, as in batch_stats), folded by one kernel, which also
// computes q (its last node: sum(g * xhat) = (sum(g * x) - mean * sum(g))
// * invstd is computed from sum(g) rounded to the input's dtype, a relative 2^-24 |mean| / std
// of it at most, so that every output of the kernel is on one chain); d x is one elementwise pass.
std::vector<Tensor> normalize_backward(const detail::BackwardContext& c) {
  const Tensor &g = c.grad(), &x = c.saved(0), &mean = c.saved(1), &invstd = c.saved(2),
               &w = c.saved(3);
  const int64_t rank = x.dim();
  const std::vector<int64_t> dims = trailing_dims(rank);
  const double n = per_channel_count(x);
  Tensor sum_g, sum_gxhat;
  if (!detail::should_record(g, x)) {
    // Eager: the reference reductions over dims (0, 2, ...), as in batch_stats, of products
    // formed in double as the recorded kernel's are (float32's overflow where the recorded sums do
    // not).
    const std::vector<int64_t> over = non_channel_dims(rank);
    sum_g = g.sum(over);
    const Tensor centered = x.to(kFloat64) - per_channel(mean, rank).to(kFloat64);
    sum_gxhat = ((g.to(kFloat64) * centered).sum(over) * invstd.to(kFloat64)).to(x.dtype());
  } else {
    const Tensor gt = g.transpose(0, 1).to(kFloat64), xt = x.transpose(0, 1).to(kFloat64);
    sum_g = gt.sum(dims).to(x.dtype());
    const Tensor sum_gx = (gt * xt).sum(dims);
    sum_gxhat =
        ((sum_gx - mean.to(kFloat64) * sum_g.to(kFloat64)) * invstd.to(kFloat64)).to(x.dtype());
  }
  std::vector<Tensor> grads(3);
  if (c.needs_grad(0)) {
    // Recorded, d x reads g and x through a view, g.unsqueeze(0) (computed in [1, N, C, ...] and
    // squeezed back: the same memory), as the sums read them through the transpose: when every
    // use of g is a view, push_views moves g's elementwise producer (the ReLU gradient of the
    // layer before) into both kernels rather than writing g out for them.
    const bool recorded = detail::should_record(g, x);
    auto view = [recorded](const Tensor& t) { return recorded ? t.unsqueeze(0) : t; };
    auto channel = [&](const Tensor& p) { return view(per_channel(p, rank)); };
    // The correction through q first, for the order of the graph (as in normalize_kernel).
    const Tensor q = invstd * sum_gxhat / n;
    const Tensor a_c = w.defined() ? channel(invstd) * channel(w) : channel(invstd);
    const Tensor dx =
        a_c * (view(g) - (channel(q) * (view(x) - channel(mean)) + channel(sum_g) / n));
    grads[0] = recorded ? dx.squeeze(0) : dx;
  }
  if (c.needs_grad(1)) grads[1] = sum_gxhat;
  if (c.needs_grad(2)) grads[2] = sum_g;
  return grads;
}

// Training batch_norm's normalization with its own gradient formula: autograd through the
// composition would sum the gradients of the [1, C, 1, 1] statistics over dims (0, 2, 3), which
// no fused kernel folds (see normalize_backward). mean and invstd keep their own history (from
// the input), so the formula's ops differentiate again through them (double backward).
Tensor normalize(const Tensor& input, const Tensor& mean, const Tensor& invstd,
                 const Tensor& weight, const Tensor& bias) {
  Tensor y;
  {
    AutoGradMode no_history(false);
    y = normalize_kernel(input, mean, invstd, weight, bias);
  }
  if (detail::needs_grad(input, weight, bias, mean, invstd))
    detail::record("batch_norm", {input, weight, bias}, {y}, {input, mean, invstd, weight},
                   &normalize_backward);
  return y;
}

// A max pool of batched input with geometry g: recorded as `def` with `attrs` in lazy mode.
std::tuple<Tensor, Tensor> max_pool(const Tensor& input, const PoolGeom& g,
                                    const detail::OpHandle& def, Attrs attrs) {
  Tensor values, indices;
  if (detail::should_record(input)) {
    auto out = detail::lazy_record(
        def, {input}, std::move(attrs),
        {{{g.N, g.C, g.oH, g.oW}, input.dtype()}, {{g.N, g.C, g.oH, g.oW}, kInt64}});
    values = out[0];
    indices = out[1];
  } else {
    AutoGradMode kernel_only(false);
    std::tie(values, indices) = max_pool_kernel(input, g);
  }
  if (detail::needs_grad(input))
    detail::record("max_pool2d", {input}, {values}, {indices},
                   [in_size = input.sizes()](const detail::BackwardContext& c) {
                     return std::vector<Tensor>{max_pool2d_backward(c.grad(), c.saved(0), in_size)};
                   });
  return {values, indices};
}

}  // namespace

int64_t detail::pool_output_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                                 bool ceil_mode) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (span + (ceil_mode ? s - 1 : 0)) / s + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

void registration::register_pool_ops() {
  register_max_pools();
  register_avg_pools();
}

std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                   const Shape& stride, const Shape& padding,
                                                   const Shape& dilation, bool ceil_mode) {
  const char* op = "max_pool2d";
  detail::check_defined(input, op, "input");
  if (input.dim() == 3) {
    auto [v, i] = max_pool2d_with_indices(input.unsqueeze(0), kernel_size, stride, padding,
                                          dilation, ceil_mode);
    return {v.squeeze(0), i.squeeze(0)};
  }
  const PoolGeom g = fixed_geom(op, input, kernel_size, stride, padding, dilation, ceil_mode, true);
  return max_pool(input, g, max_pool_def, {g.kernel, g.stride, g.padding, g.dilation, ceil_mode});
}

std::tuple<Tensor, Tensor> adaptive_max_pool2d_with_indices(const Tensor& input,
                                                            const Shape& output_size) {
  const char* op = "adaptive_max_pool2d";
  detail::check_defined(input, op, "input");
  if (input.dim() == 3) {
    auto [v, i] = adaptive_max_pool2d_with_indices(input.unsqueeze(0), output_size);
    return {v.squeeze(0), i.squeeze(0)};
  }
  const PoolGeom g = adaptive_geom(op, input, output_size);
  return max_pool(input, g, adaptive_max_pool_def, {Shape{g.oH, g.oW}});
}

Tensor adaptive_max_pool2d(const Tensor& input, const Shape& output_size) {
  return std::get<0>(adaptive_max_pool2d_with_indices(input, output_size));
}

Tensor max_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, const Shape& dilation, bool ceil_mode) {
  return std::get<0>(
      max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, bool ceil_mode, bool count_include_pad) {
  return batched(input, [&](const Tensor& x) {
    return avg_pool(x,
                    fixed_geom("avg_pool2d", x, kernel_size, stride, padding, {1}, ceil_mode,
                               count_include_pad),
                    false);
  });
}

Tensor adaptive_avg_pool2d(const Tensor& input, const Shape& output_size) {
  const char* op = "adaptive_avg_pool2d";
  return batched(input, [&](const Tensor& x) {
    return avg_pool(x, adaptive_geom(op, x, output_size), false);
  });
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  const char* op = "batch_norm";
  check_norm_input(op, input);
  check_channel_param(op, running_mean, "running_mean", input);
  check_channel_param(op, running_var, "running_var", input);
  check_channel_param(op, weight, "weight", input);
  check_channel_param(op, bias, "bias", input);
  KILN_CHECK(running_mean.defined() == running_var.defined(), op,
             ": running_mean and running_var must be both given or both undefined");
  const int64_t count = input.numel() / std::max<int64_t>(1, input.size(1));
  const int64_t rank = input.dim();
  if (!training && running_mean.defined()) {
    // Eval: a per-channel affine of the input (as torch's CPU kernel), which a graph pass folds
    // into a preceding convolution (jit/passes/conv_fold.cpp).
    Tensor scale = rsqrt(running_var + eps);
    if (weight.defined()) scale = scale * weight;
    Tensor shift = -running_mean * scale;
    if (bias.defined()) shift = shift + bias;
    return input * per_channel(scale, rank) + per_channel(shift, rank);
  }
  KILN_CHECK(count > 1, op, ": expected more than 1 value per channel when training, got input ",
             describe(input));
  const BatchStats st = batch_stats(input, eps);
  if (training && running_mean.defined()) {
    NoGradGuard no_grad;
    const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
    Tensor rm = running_mean, rv = running_var;  // handles: the buffers update in place
    rm.mul_(1.0 - momentum).add_(st.mean * momentum);
    rv.mul_(1.0 - momentum).add_(st.var * (momentum * unbias));
  }
  return normalize(input, st.mean, st.invstd, weight, bias);
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const char* op = "group_norm";
  check_norm_input(op, input);
  KILN_CHECK(num_groups > 0 && input.size(1) % num_groups == 0, op,
             ": expected the input's channels to be divisible by num_groups (", num_groups,
             "), got input ", describe(input));
  check_channel_param(op, weight, "weight", input);
  check_channel_param(op, bias, "bias", input);
  const int64_t N = input.size(0);
  const int64_t per_group = input.numel() / std::max<int64_t>(1, N * num_groups);
  Tensor y = input;
  if (input.numel() > 0) {
    Tensor g = input.reshape({N, num_groups, per_group});
    Tensor mu = mean(g, {2}, true);
    y = ((g - mu) * rsqrt(kiln::var(g, {2}, 0, true) + eps)).reshape(input.sizes());
  }
  if (weight.defined()) y = y * per_channel(weight, input.dim());
  if (bias.defined()) y = y + per_channel(bias, input.dim());
  return y;
}

Tensor instance_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight, const Tensor& bias, bool use_input_stats,
                     double momentum, double eps) {
  const char* op = "instance_norm";
  check_norm_input(op, input);
  for (auto [p, name] : {std::pair{&running_mean, "running_mean"},
                         {&running_var, "running_var"},
                         {&weight, "weight"},
                         {&bias, "bias"}})
    check_channel_param(op, *p, name, input);
  KILN_CHECK(running_mean.defined() == running_var.defined(), op,
             ": running_mean and running_var must be both given or both undefined");
  KILN_CHECK(use_input_stats || running_mean.defined(), op,
             ": expected running_mean and running_var when use_input_stats is false");
  const int64_t N = input.size(0), C = input.size(1);
  KILN_CHECK(!use_input_stats || input.numel() == 0 || input.numel() / (N * C) > 1, op,
             ": expected more than 1 spatial element when training, got input ", describe(input));
  // Each (sample, channel) is a channel of one sample: batch_norm of [1, N C, ...] with the
  // per-channel parameters repeated N times.
  auto repeated = [N](const Tensor& t) { return t.defined() ? t.repeat({N}) : t; };
  Shape folded = input.sizes();
  folded.erase(folded.begin());
  folded[0] = N * C;
  folded.insert(folded.begin(), 1);
  const Tensor rm = repeated(running_mean), rv = repeated(running_var);
  const Tensor y = batch_norm(input.reshape(folded), rm, rv, repeated(weight), repeated(bias),
                              use_input_stats, momentum, eps);
  if (use_input_stats && running_mean.defined()) {
    NoGradGuard no_grad;
    Tensor mean_out = running_mean, var_out = running_var;  // handles: the buffers update in place
    mean_out.copy_(mean(rm.view({N, C}), {0}));
    var_out.copy_(mean(rv.view({N, C}), {0}));
  }
  return y.view(input.sizes());
}

Tensor local_response_norm(const Tensor& x, int64_t size, double alpha, double beta, double k) {
  const char* op = "local_response_norm";
  detail::check_defined(x, op, "input");
  KILN_CHECK(x.dim() >= 3, op, ": expected an input of 3 or more dims [N, C, ...], got ",
             describe(x));
  KILN_CHECK(size > 0, op, ": expected a positive size, got ", size);
  if (x.numel() == 0) return x * 1.0;
  // The mean of x^2 over each zero-padded window of `size` channels: an average pool over the
  // channels of [N, 1, C, rest].
  const int64_t N = x.size(0), C = x.size(1);
  const Tensor squares = (x * x).reshape({N, 1, C, -1});
  const Tensor padded = pad(squares, {0, 0, size / 2, (size - 1) / 2});
  const Tensor window_mean = avg_pool2d(padded, {size, 1}, {1, 1}).view(x.sizes());
  return x / pow(window_mean * alpha + k, beta);
}

}  // namespace kiln
