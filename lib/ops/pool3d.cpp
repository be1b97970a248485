// The volumetric (3-D) poolings over [N, C, D, H, W], composed of the 2-D ones over depth slices.
// Output depth od's window reads kD slices of the depth-padded input; the slices kernel depth kd
// reads for every od go side by side as the channels of one 2-D pool. The max pools then choose,
// per output, the depth torch's (d, h, w) scan keeps among the 2-D results (the first maximum, or
// the last NaN) and read the input at that position, so the gradient goes to exactly the element
// the index names; avg_pool3d adds the 2-D averages and divides by the window's depth count
// (torch's divisor is a product of per-dim counts, so that is its average), differentiated through
// its parts. The adaptive pools reduce each output depth's window of slices.
#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/ops/conv.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;
using detail::spatial_arg;

namespace {

void check_volume(const char* op, const Tensor& x) {
  detail::check_defined(x, op, "input");
  KILN_CHECK(x.dim() == 5, op, ": expected a 4-D (unbatched) or 5-D (batched) input, got ",
             describe(x));
  KILN_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, op,
             ": expected a float32 or float64 input, got ", describe(x));
  KILN_CHECK(x.size(2) > 0 && x.size(3) > 0 && x.size(4) > 0, op,
             ": expected a non-empty volume, got ", describe(x));
}

// An unbatched [C, D, H, W] input runs as a batch of one.
template <typename F>
auto batched(const Tensor& x, const F& f) {
  if (x.defined() && x.dim() == 4) {
    if constexpr (std::is_same_v<decltype(f(x)), Tensor>) {
      return f(x.unsqueeze(0)).squeeze(0);
    } else {
      auto [values, indices] = f(x.unsqueeze(0));
      return std::tuple<Tensor, Tensor>{values.squeeze(0), indices.squeeze(0)};
    }
  }
  return f(x);
}

// The checked geometry of a fixed-size 3-D pooling of batched x.
struct Geometry {
  Shape kernel, stride, padding, dilation, out;
  // Slices of padding after the input, so that every window lies in the padded depth (ceil mode
  // reaches past the padding).
  int64_t depth_after = 0;
};

Geometry geometry(const char* op, const Tensor& x, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, const Shape& dilation, bool ceil_mode) {
  check_volume(op, x);
  Geometry g;
  g.kernel = spatial_arg(op, "kernel_size", kernel_size, 3, 1);
  g.stride = stride.empty() ? g.kernel : spatial_arg(op, "stride", stride, 3, 1);
  g.padding = spatial_arg(op, "padding", padding, 3, 0);
  g.dilation = spatial_arg(op, "dilation", dilation, 3, 1);
  for (size_t i = 0; i < 3; ++i) {
    const int64_t extent = (g.kernel[i] - 1) * g.dilation[i] + 1, in = x.size(2 + int64_t(i));
    KILN_CHECK(2 * g.padding[i] <= extent, op, ": padding ", shape_str(g.padding),
               " should be at most half of the (dilated) kernel size ", shape_str(g.kernel));
    KILN_CHECK(in + 2 * g.padding[i] >= extent, op, ": the (dilated) kernel ", shape_str(g.kernel),
               " is larger than the padded input of input ", describe(x));
    g.out.push_back(detail::pool_output_size(in, g.kernel[i], g.stride[i], g.padding[i],
                                             g.dilation[i], ceil_mode));
  }
  const int64_t span = (g.out[0] - 1) * g.stride[0] + (g.kernel[0] - 1) * g.dilation[0] + 1;
  g.depth_after = std::max<int64_t>(0, span - x.size(2) - g.padding[0]);
  return g;
}

// The first depth (in the unpadded input) of output depth od's window.
int64_t window_start(const Geometry& g, int64_t od) {
  return od * g.stride[0] - g.padding[0];
}

// The slices kernel depth kd reads for every output depth, of x padded in depth: [N, C oD, H, W].
Tensor depth_slices(const Tensor& padded, const Geometry& g, int64_t kd) {
  const TensorOptions i64 = TensorOptions(kInt64).device(padded.device());
  const Tensor depths = arange(g.out[0], i64) * g.stride[0] + kd * g.dilation[0];
  const Tensor slices = index_select(padded, 2, depths);
  return slices.reshape({padded.size(0), -1, padded.size(3), padded.size(4)});
}

// A [oD] tensor of host values of dtype `dtype` on x's device, viewed to broadcast over
// [N, C, oD, oH, oW].
template <typename T>
Tensor per_depth(const std::vector<T>& v, const Tensor& x, DType dtype) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v).to(dtype).to(x.device()).view({1, 1, n, 1, 1});
}

// The position along dim 0 of candidates [K, ...] that torch's (d, h, w) scan keeps when the K
// are successive depths: the last NaN (each NaN replaces the maximum), else the first maximum.
Tensor scan_winner(const Tensor& candidates) {
  Shape along(static_cast<size_t>(candidates.dim()), 1);
  along[0] = candidates.size(0);
  const Tensor k = arange(candidates.size(0), TensorOptions(kInt64).device(candidates.device()));
  const Tensor last_nan = amax(where(isnan(candidates), k.view(along), -1), {0});
  return where(ge(last_nan, 0), last_nan, std::get<1>(max(candidates, 0)));
}

// x's values [N, C, oD, oH, oW] at `index`, positions in each D * H * W volume: the gradient goes
// to exactly the element each index names, as torch's max pools' backward.
Tensor values_at(const Tensor& x, const Tensor& index) {
  return gather(x.flatten(2), 2, index.flatten(2)).view(index.sizes());
}

}  // namespace

std::tuple<Tensor, Tensor> max_pool3d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                   const Shape& stride, const Shape& padding,
                                                   const Shape& dilation, bool ceil_mode) {
  return batched(input, [&](const Tensor& x) {
    const char* op = "max_pool3d";
    const Geometry g = geometry(op, x, kernel_size, stride, padding, dilation, ceil_mode);
    const int64_t N = x.size(0), C = x.size(1), plane = x.size(3) * x.size(4);
    const Shape out{N, C, g.out[0], g.out[1], g.out[2]};
    // The candidates come from the values alone; the result reads x at the chosen positions.
    const Tensor padded = pad(x.detach(), {0, 0, 0, 0, g.padding[0], g.depth_after}, "constant",
                              -std::numeric_limits<double>::infinity());
    std::vector<Tensor> values, indices;
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      auto [v, i] = max_pool2d_with_indices(
          depth_slices(padded, g, kd), {g.kernel[1], g.kernel[2]}, {g.stride[1], g.stride[2]},
          {g.padding[1], g.padding[2]}, {g.dilation[1], g.dilation[2]}, ceil_mode);
      std::vector<int64_t> offset;  // of the slice each output depth reads, in the volume
      for (int64_t od = 0; od < g.out[0]; ++od)
        offset.push_back((window_start(g, od) + kd * g.dilation[0]) * plane);
      values.push_back(v.view(out));
      indices.push_back(i.view(out) + per_depth(offset, x, kInt64));
    }
    const Tensor candidates = stack(values);
    // A window whose every value is -inf keeps torch's first position inside the input (padding
    // slices read -inf too).
    std::vector<int64_t> first_inside;
    for (int64_t od = 0; od < g.out[0]; ++od) {
      const int64_t start = window_start(g, od);
      int64_t kd = 0;
      while (start + kd * g.dilation[0] < 0) ++kd;
      first_inside.push_back(kd);
    }
    const Tensor which = where(eq(amax(candidates, {0}), -std::numeric_limits<double>::infinity()),
                               per_depth(first_inside, x, kInt64), scan_winner(candidates));
    const Tensor index = gather(stack(indices), 0, which.unsqueeze(0)).squeeze(0);
    const Tensor best = values_at(x, index);
    return std::tuple<Tensor, Tensor>{best, index};
  });
}

Tensor max_pool3d(const Tensor& input, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, const Shape& dilation, bool ceil_mode) {
  return std::get<0>(
      max_pool3d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool3d(const Tensor& input, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, bool ceil_mode, bool count_include_pad) {
  return batched(input, [&](const Tensor& x) {
    const Geometry g = geometry("avg_pool3d", x, kernel_size, stride, padding, {1}, ceil_mode);
    const int64_t N = x.size(0), C = x.size(1), D = x.size(2);
    const Tensor padded = pad(x, {0, 0, 0, 0, g.padding[0], g.depth_after});
    Tensor sum;
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      const Tensor part = avg_pool2d(depth_slices(padded, g, kd), {g.kernel[1], g.kernel[2]},
                                     {g.stride[1], g.stride[2]}, {g.padding[1], g.padding[2]},
                                     ceil_mode, count_include_pad);
      sum = sum.defined() ? sum + part : part;
    }
    // The window's depth count: up to the padded input's end, or inside the input only.
    std::vector<double> count;
    for (int64_t od = 0; od < g.out[0]; ++od) {
      const int64_t start = window_start(g, od);
      const int64_t end = std::min(start + g.kernel[0], D + g.padding[0]);
      count.push_back(static_cast<double>(
          count_include_pad ? end - start : std::min(end, D) - std::max<int64_t>(start, 0)));
    }
    return sum.view({N, C, g.out[0], g.out[1], g.out[2]}) / per_depth(count, x, x.dtype());
  });
}

Tensor adaptive_avg_pool3d(const Tensor& input, const Shape& output_size) {
  const char* op = "adaptive_avg_pool3d";
  return batched(input, [&](const Tensor& x) {
    check_volume(op, x);
    const Shape out = spatial_arg(op, "output_size", output_size, 3, 1);
    const int64_t D = x.size(2);
    // Each output depth's window of slices averaged, then pooled in 2-D (both linear).
    std::vector<Tensor> depths;
    for (int64_t od = 0; od < out[0]; ++od) {
      const int64_t start = od * D / out[0], end = ((od + 1) * D + out[0] - 1) / out[0];
      depths.push_back(
          adaptive_avg_pool2d(mean(x.narrow(2, start, end - start), {2}), {out[1], out[2]}));
    }
    return stack(depths, 2);
  });
}

Tensor adaptive_max_pool3d(const Tensor& input, const Shape& output_size) {
  const char* op = "adaptive_max_pool3d";
  return batched(input, [&](const Tensor& x) {
    check_volume(op, x);
    const Shape out = spatial_arg(op, "output_size", output_size, 3, 1);
    const int64_t N = x.size(0), C = x.size(1), D = x.size(2), H = x.size(3), W = x.size(4);
    // Every depth slice pooled in 2-D, then each output depth's window of them reduced as torch's
    // scan; the result reads x at the chosen positions.
    auto [v, i] =
        adaptive_max_pool2d_with_indices(x.detach().reshape({N, C * D, H, W}), {out[1], out[2]});
    const Tensor slice_max = v.view({N, C, D, out[1], out[2]}).movedim(2, 0);
    const Tensor slice_index = i.view({N, C, D, out[1], out[2]}).movedim(2, 0);
    std::vector<Tensor> index;
    for (int64_t od = 0; od < out[0]; ++od) {
      const int64_t start = od * D / out[0], end = ((od + 1) * D + out[0] - 1) / out[0];
      const Tensor which = scan_winner(slice_max.narrow(0, start, end - start));
      const Tensor at = gather(slice_index.narrow(0, start, end - start), 0, which.unsqueeze(0));
      index.push_back(at.squeeze(0) + (which + start) * (H * W));
    }
    return values_at(x, stack(index, 2));
  });
}

}  // namespace kiln
