// torch.nn.functional's affine_grid and grid_sample (2-D), composed of kiln's ops: the grid is a
// matmul of the output's pixel coordinates by theta, and sampling selects the (up to four)
// neighbouring pixels' channel rows of each grid point from the channels-last input and adds them
// with the bilinear weights. Autograd differentiates both through their ops: the input's gradient
// is the selections' index_add, the grid's flows through the weights (floor and round pass none,
// as torch's).
// Coordinates follow torch's grid sampler term for term: unnormalized, then clipped (border) or
// reflected and clipped (reflection), each clip passing gradient only strictly inside the image.
#include <string>
#include <string_view>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;

namespace {

// torch's linspace_from_neg_one: `steps` points from -1 to 1 (one point is 0), scaled by
// (steps - 1) / steps without align_corners so that they are the pixel centres.
Tensor normalized_positions(int64_t steps, bool align_corners, TensorOptions options) {
  if (steps <= 1) return zeros({steps}, options);
  const Tensor points = linspace(-1, 1, steps, options);
  if (align_corners) return points;
  return points * static_cast<double>(steps - 1) / static_cast<double>(steps);
}

enum class Padding { Zeros, Border, Reflection };

Padding padding_named(std::string_view name) {
  if (name == "zeros") return Padding::Zeros;
  if (name == "border") return Padding::Border;
  KILN_CHECK(name == "reflection", "grid_sample: padding_mode must be \"zeros\", \"border\" or ",
             "\"reflection\", got \"", std::string(name), "\"");
  return Padding::Reflection;
}

// c clipped to [0, size - 1], its gradient passed only strictly inside (torch's).
Tensor clip(const Tensor& c, int64_t size) {
  const double high = static_cast<double>(size - 1);
  return where(gt(c, 0), where(lt(c, high), c, high), 0);
}

// c reflected into [twice_low / 2, twice_high / 2] (torch's reflect_coordinates).
Tensor reflect(const Tensor& c, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return zeros_like(c);
  const double low = static_cast<double>(twice_low) / 2;
  const double span = static_cast<double>(twice_high - twice_low) / 2;
  const Tensor distance = abs(c - low);
  const Tensor extra = fmod(distance, span);
  const Tensor even = eq(fmod(floor(distance / span), 2), 0);
  return where(even, extra + low, span - extra + low);
}

// The pixel coordinate along a dim of `size` pixels that normalized coordinate c names.
Tensor source_coordinate(const Tensor& c, int64_t size, Padding padding, bool align_corners) {
  const double n = static_cast<double>(size);
  Tensor pixel = align_corners ? (c + 1) / 2 * (n - 1) : ((c + 1) * n - 1) / 2;
  if (padding == Padding::Border) return clip(pixel, size);
  if (padding == Padding::Reflection) {
    pixel = align_corners ? reflect(pixel, 0, 2 * (size - 1)) : reflect(pixel, -1, 2 * size - 1);
    return clip(pixel, size);
  }
  return pixel;
}

// The input's channels [N oH oW, C] at integral pixel coordinates (x, y) [N, oH, oW], rows of
// `pixels`, the channels-last [N H W, C] view of the input; zero where (x, y) lies outside the
// image. One index_select of whole channel rows (and an index_add of them for the gradient).
Tensor pixels_at(const Tensor& pixels, int64_t height, int64_t width, const Tensor& x,
                 const Tensor& y) {
  const int64_t N = x.size(0), points = x.size(1) * x.size(2);
  const Tensor inside = logical_and(logical_and(ge(x, 0), le(x, static_cast<double>(width - 1))),
                                    logical_and(ge(y, 0), le(y, static_cast<double>(height - 1))))
                            .reshape({N * points, 1});
  // Outside points read their image's pixel 0 (never a NaN or huge coordinate cast to an
  // integer); the row is computed in integers, exact for any image size.
  auto integral = [&](const Tensor& c) {
    return where(inside, c.reshape({N * points, 1}), 0).to(kInt64);
  };
  const TensorOptions i64 = TensorOptions(kInt64).device(x.device());
  const Tensor image = (arange(N, i64) * (height * width)).view({N, 1}).expand({N, points});
  const Tensor row = image.reshape({N * points, 1}) + integral(y) * width + integral(x);
  return where(inside, index_select(pixels, 0, row.view({-1})), 0);
}

void check_grid_sample(const Tensor& input, const Tensor& grid) {
  const char* op = "grid_sample";
  detail::check_defined(input, op, "input");
  detail::check_defined(grid, op, "grid");
  const std::string what = describe(input) + " and grid " + describe(grid);
  KILN_CHECK(input.dim() == 4 && grid.dim() == 4 && grid.size(3) == 2, op,
             ": expected a 4-D input [N, C, H, W] and a grid [N, oH, oW, 2] (kiln samples 2-D "
             "images only), got input ",
             what);
  KILN_CHECK(input.is_floating_point() && input.dtype() == grid.dtype(), op,
             ": expected a floating-point input and grid of one dtype, got input ", what);
  KILN_CHECK(input.device() == grid.device(), op,
             ": expected input and grid on one device, got input ", what);
  KILN_CHECK(input.size(0) == grid.size(0), op,
             ": expected input and grid of one batch size, got input ", what);
  KILN_CHECK(input.size(2) > 0 && input.size(3) > 0, op,
             ": expected an input with non-empty spatial dims, got input ", what);
}

}  // namespace

Tensor affine_grid(const Tensor& theta, const Shape& size, bool align_corners) {
  const char* op = "affine_grid";
  detail::check_defined(theta, op, "theta");
  KILN_CHECK(theta.is_floating_point(), op, ": expected a floating-point theta, got ",
             describe(theta));
  const int64_t spatial = static_cast<int64_t>(size.size()) - 2;
  KILN_CHECK(spatial == 2 || spatial == 3, op,
             ": expected size [N, C, H, W] or [N, C, D, H, W], got ", shape_str(size));
  for (int64_t s : size)
    KILN_CHECK(s > 0, op, ": expected a positive output size, got ", shape_str(size));
  KILN_CHECK(theta.dim() == 3 && theta.size(0) == size[0] && theta.size(1) == spatial &&
                 theta.size(2) == spatial + 1,
             op, ": expected theta [", size[0], ", ", spatial, ", ", spatial + 1, "] for size ",
             shape_str(size), ", got ", describe(theta));
  const TensorOptions options = TensorOptions(theta.dtype()).device(theta.device());
  // The homogeneous coordinates (x, y[, z], 1) of every output point, x fastest.
  Shape points(size.begin() + 2, size.end());
  std::vector<Tensor> columns;
  for (int64_t d = spatial - 1; d >= 0; --d) {
    Shape along(spatial, 1);
    along[d] = points[d];
    columns.push_back(
        normalized_positions(points[d], align_corners, options).view(along).expand(points));
  }
  columns.push_back(ones(points, options));
  const Tensor base = stack(columns, -1).view({-1, spatial + 1});
  Shape out{size[0]};
  out.insert(out.end(), points.begin(), points.end());
  out.push_back(spatial);
  return matmul(base, theta.transpose(1, 2)).view(out);
}

Tensor grid_sample(const Tensor& input, const Tensor& grid, std::string_view mode,
                   std::string_view padding_mode, bool align_corners) {
  KILN_CHECK(mode == "bilinear" || mode == "nearest", "grid_sample: mode must be \"bilinear\" or ",
             "\"nearest\" (kiln has no \"bicubic\"), got \"", std::string(mode), "\"");
  const Padding padding = padding_named(padding_mode);
  check_grid_sample(input, grid);
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const Tensor pixels = input.permute({0, 2, 3, 1}).reshape({N * H * W, C});
  const Tensor x = source_coordinate(grid.select(3, 0), W, padding, align_corners);
  const Tensor y = source_coordinate(grid.select(3, 1), H, padding, align_corners);
  const int64_t points = grid.size(1) * grid.size(2);
  auto per_point = [&](const Tensor& t) { return t.reshape({N * points, 1}); };
  // [N oH oW, C] back to [N, C, oH, oW].
  auto image = [&](const Tensor& t) {
    return t.view({N, grid.size(1), grid.size(2), C}).permute({0, 3, 1, 2}).contiguous();
  };
  if (mode == "nearest") {
    const Tensor nearest_x = round(x), nearest_y = round(y);
    // Times 1 tied to the grid through round's zero gradient, so that the grid's gradient is
    // zeros (as torch's) rather than absent; exactly 1 for any coordinate, NaN too.
    const Tensor one = where(isfinite(nearest_x), nearest_x * 0, 0) + 1;
    return image(pixels_at(pixels, H, W, nearest_x, nearest_y) * per_point(one));
  }
  const Tensor x0 = floor(x), y0 = floor(y), x1 = x0 + 1, y1 = y0 + 1;
  const Tensor west = x1 - x, east = x - x0, north = y1 - y, south = y - y0;  // the weights' parts
  // A NaN coordinate's weights are NaN, and so is its value (as torch's).
  return image(pixels_at(pixels, H, W, x0, y0) * per_point(west * north) +
               pixels_at(pixels, H, W, x1, y0) * per_point(east * north) +
               pixels_at(pixels, H, W, x0, y1) * per_point(west * south) +
               pixels_at(pixels, H, W, x1, y1) * per_point(east * south));
}

}  // namespace kiln
