// Sliding windows: Tensor::unfold (a view of every window along one dim), unfold and fold
// (torch.nn.functional's im2col and col2im: an index_select and an index_add at the windows'
// positions in the padded image, so each is the other's gradient), and the 1-D poolings (the 2-D
// ones over a height of 1, adaptive ones too).
#include <string>
#include <tuple>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;

Tensor Tensor::unfold(int64_t dimension, int64_t size, int64_t step) const {
  const char* op = "unfold";
  detail::check_defined(*this, op);
  KILN_CHECK(step > 0 && size >= 0, op, ": expected size >= 0 and step > 0, got size ", size,
             " and step ", step, " for ", describe(*this));
  if (dim() == 0) {  // torch treats a 0-dim tensor as one element along dim 0
    detail::wrap_dim(dimension, 1, op, this);
    KILN_CHECK(size <= 1, op, ": size ", size, " exceeds the one element of ", describe(*this));
    return kiln::as_strided(*this, {size}, {1});
  }
  const int64_t d = detail::wrap_dim(dimension, dim(), op, this);
  KILN_CHECK(size <= this->size(d), op, ": size ", size, " exceeds dim ", d, " of ",
             describe(*this));
  Shape sizes = this->sizes(), strides = this->strides();
  sizes[d] = (this->size(d) - size) / step + 1;
  // One window needs no stride (and a hostile step times the stride could overflow).
  if (sizes[d] > 1) strides[d] *= step;
  sizes.push_back(size);
  strides.push_back(this->stride(d));
  return kiln::as_strided(*this, sizes, strides);
}

namespace {

// The checked geometry of an im2col over [N, C, H, W] (or its columns).
struct Windows {
  Shape kernel, dilation, padding, stride;
  int64_t padded_h = 0, padded_w = 0, out_h = 0, out_w = 0;
};

Shape two_values(const char* op, const char* name, const Shape& v, int64_t min) {
  KILN_CHECK(v.size() == 1 || v.size() == 2, op, ": expected ", name,
             " to have 1 or 2 values, got ", shape_str(v));
  const Shape out = v.size() == 1 ? Shape(2, v[0]) : v;
  for (int64_t x : out)
    KILN_CHECK(x >= min && x <= (int64_t{1} << 31), op, ": expected ", name, " values in [", min,
               ", 2^31], got ", shape_str(v));
  return out;
}

Windows windows(const char* op, int64_t height, int64_t width, const Shape& kernel_size,
                const Shape& dilation, const Shape& padding, const Shape& stride) {
  Windows w;
  w.kernel = two_values(op, "kernel_size", kernel_size, 1);
  w.dilation = two_values(op, "dilation", dilation, 1);
  w.padding = two_values(op, "padding", padding, 0);
  w.stride = two_values(op, "stride", stride, 1);
  const int64_t image[2] = {height, width};
  int64_t padded[2], out[2];
  for (int i = 0; i < 2; ++i) {
    padded[i] = image[i] + 2 * w.padding[i];
    const int64_t extent = w.dilation[i] * (w.kernel[i] - 1) + 1;
    out[i] = padded[i] >= extent ? (padded[i] - extent) / w.stride[i] + 1 : 0;
    KILN_CHECK(out[i] > 0, op, ": the (dilated) kernel ", shape_str(w.kernel), " does not fit the ",
               height, " x ", width, " image padded by ", shape_str(w.padding));
  }
  w.padded_h = padded[0], w.padded_w = padded[1], w.out_h = out[0], w.out_w = out[1];
  return w;
}

// The position in the padded H * W plane that column element (i, j, p, q) reads: kernel offset
// (i, j) of the window at output position (p, q); int64 [kH * kW * oH * oW], row-major.
Tensor window_positions(const Windows& w, Device device) {
  const TensorOptions i64 = TensorOptions(kInt64).device(device);
  const Tensor rows = (arange(w.kernel[0], i64) * w.dilation[0]).view({-1, 1, 1, 1}) +
                      (arange(w.out_h, i64) * w.stride[0]).view({1, 1, -1, 1});
  const Tensor cols = (arange(w.kernel[1], i64) * w.dilation[1]).view({1, -1, 1, 1}) +
                      (arange(w.out_w, i64) * w.stride[1]).view({1, 1, 1, -1});
  return (rows * w.padded_w + cols).reshape({-1});
}

void check_image(const char* op, const Tensor& x, int64_t batched, const char* what) {
  detail::check_defined(x, op, "input");
  KILN_CHECK(x.dim() == batched || x.dim() == batched - 1, op, ": expected ", what,
             " (unbatched) or ", batched, "-D (batched) input, got ", describe(x));
}

}  // namespace

Tensor unfold(const Tensor& input, const Shape& kernel_size, const Shape& dilation,
              const Shape& padding, const Shape& stride) {
  const char* op = "unfold";
  check_image(op, input, 4, "a 3-D");
  if (input.dim() == 3)
    return unfold(input.unsqueeze(0), kernel_size, dilation, padding, stride).squeeze(0);
  const Windows w =
      windows(op, input.size(2), input.size(3), kernel_size, dilation, padding, stride);
  const int64_t n = input.size(0), c = input.size(1);
  const Tensor padded = pad(input, {w.padding[1], w.padding[1], w.padding[0], w.padding[0]});
  const Tensor columns = index_select(padded.reshape({n, c, w.padded_h * w.padded_w}), 2,
                                      window_positions(w, input.device()));
  return columns.reshape({n, c * w.kernel[0] * w.kernel[1], w.out_h * w.out_w});
}

Tensor fold(const Tensor& input, const Shape& output_size, const Shape& kernel_size,
            const Shape& dilation, const Shape& padding, const Shape& stride) {
  const char* op = "fold";
  check_image(op, input, 3, "a 2-D");
  if (input.dim() == 2)
    return fold(input.unsqueeze(0), output_size, kernel_size, dilation, padding, stride).squeeze(0);
  const Shape size = two_values(op, "output_size", output_size, 1);
  const Windows w = windows(op, size[0], size[1], kernel_size, dilation, padding, stride);
  const int64_t per_channel = w.kernel[0] * w.kernel[1], blocks = w.out_h * w.out_w;
  KILN_CHECK(input.size(1) % per_channel == 0 && input.size(2) == blocks, op, ": expected ",
             describe(input), " to hold C * ", per_channel, " rows (the kernel ",
             shape_str(w.kernel), ") of ", blocks, " blocks (", w.out_h, " x ", w.out_w,
             " for output size ", shape_str(size), ")");
  const int64_t n = input.size(0), c = input.size(1) / per_channel;
  const Tensor columns = input.reshape({n, c, per_channel * blocks});
  Tensor image = index_add(
      zeros({n, c, w.padded_h * w.padded_w}, TensorOptions(input.dtype()).device(input.device())),
      2, window_positions(w, input.device()), columns);
  image = image.view({n, c, w.padded_h, w.padded_w});
  return image.narrow(2, w.padding[0], size[0]).narrow(3, w.padding[1], size[1]);
}

// ---------------------------------------------------------------- 1-D poolings

namespace {

// One value of a 1-D pooling's argument (torch's int or 1-tuple).
int64_t one_value(const char* op, const char* name, const Shape& v, int64_t min) {
  KILN_CHECK(v.size() == 1 && v[0] >= min, op, ": expected ", name, " to be one value >= ", min,
             ", got ", shape_str(v));
  return v[0];
}

// The 2-D arguments of a 1-D pooling over [N, C, L] or [C, L] (a height of 1), checked here so
// that errors name the 1-D op.
struct Pool1d {
  Shape kernel, stride, padding, dilation;
};
Pool1d pool1d_args(const char* op, const Tensor& input, const Shape& kernel_size,
                   const Shape& stride, const Shape& padding, const Shape& dilation) {
  check_image(op, input, 3, "a 2-D");
  const int64_t k = one_value(op, "kernel_size", kernel_size, 1);
  const int64_t s = stride.empty() ? k : one_value(op, "stride", stride, 1);
  const int64_t p = one_value(op, "padding", padding, 0);
  const int64_t d = one_value(op, "dilation", dilation, 1);
  const int64_t extent = d * (k - 1) + 1, length = input.size(-1);
  KILN_CHECK(2 * p <= extent, op, ": padding ", p,
             " should be at most half of the (dilated) kernel size ", k);
  KILN_CHECK(length + 2 * p >= extent, op, ": the (dilated) kernel ", k, " does not fit ",
             describe(input), " padded by ", p);
  return {{1, k}, {1, s}, {0, p}, {1, d}};
}

}  // namespace

std::tuple<Tensor, Tensor> max_pool1d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                   const Shape& stride, const Shape& padding,
                                                   const Shape& dilation, bool ceil_mode) {
  const Pool1d a = pool1d_args("max_pool1d", input, kernel_size, stride, padding, dilation);
  auto [values, indices] = max_pool2d_with_indices(input.unsqueeze(-2), a.kernel, a.stride,
                                                   a.padding, a.dilation, ceil_mode);
  return {values.squeeze(-2), indices.squeeze(-2)};  // a 1 x L plane's index is the position
}

Tensor max_pool1d(const Tensor& input, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, const Shape& dilation, bool ceil_mode) {
  return std::get<0>(
      max_pool1d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode));
}

Tensor avg_pool1d(const Tensor& input, const Shape& kernel_size, const Shape& stride,
                  const Shape& padding, bool ceil_mode, bool count_include_pad) {
  const Pool1d a = pool1d_args("avg_pool1d", input, kernel_size, stride, padding, {1});
  return avg_pool2d(input.unsqueeze(-2), a.kernel, a.stride, a.padding, ceil_mode,
                    count_include_pad)
      .squeeze(-2);
}

Tensor adaptive_avg_pool1d(const Tensor& input, const Shape& output_size) {
  const char* op = "adaptive_avg_pool1d";
  check_image(op, input, 3, "a 2-D");
  const int64_t out = one_value(op, "output_size", output_size, 1);
  KILN_CHECK(input.size(-1) > 0, op, ": expected a non-empty input, got ", describe(input));
  return adaptive_avg_pool2d(input.unsqueeze(-2), {1, out}).squeeze(-2);
}

std::tuple<Tensor, Tensor> adaptive_max_pool1d_with_indices(const Tensor& input,
                                                            const Shape& output_size) {
  const char* op = "adaptive_max_pool1d";
  check_image(op, input, 3, "a 2-D");
  const int64_t out = one_value(op, "output_size", output_size, 1);
  KILN_CHECK(input.size(-1) > 0, op, ": expected a non-empty input, got ", describe(input));
  auto [values, indices] = adaptive_max_pool2d_with_indices(input.unsqueeze(-2), {1, out});
  return {values.squeeze(-2), indices.squeeze(-2)};
}

Tensor adaptive_max_pool1d(const Tensor& input, const Shape& output_size) {
  return std::get<0>(adaptive_max_pool1d_with_indices(input, output_size));
}

}  // namespace kiln
