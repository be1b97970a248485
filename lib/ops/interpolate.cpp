// torch.nn.functional.interpolate over the spatial dims of [N, C, ...] inputs: "nearest",
// "nearest-exact", and "linear"/"bilinear"/"trilinear" (with align_corners). Each spatial dim is
// resampled in turn, innermost first, by index_select at source indices (and, for the linear
// modes, a weighted sum of the two neighbours), with torch's index and weight arithmetic, so
// that the result is torch's term for term; the gradient is index_select's (index_add).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {

// torch's area_pixel_compute_scale: the source step per output element, in the compute type.
template <typename T>
T source_scale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  if (align_corners) return out > 1 ? T(in - 1) / T(out - 1) : T(0);
  return scale && *scale > 0 ? T(1.0 / *scale) : T(in) / T(out);
}

// The source indices of one dim for the nearest modes (torch's nearest_idx and
// nearest_neighbor_exact_compute_source_index, in float as torch's).
Tensor nearest_indices(int64_t in, int64_t out, std::optional<double> scale, bool exact,
                       const Device& device) {
  std::vector<int64_t> index(static_cast<size_t>(out));
  const float s = source_scale<float>(in, out, false, scale);
  for (int64_t o = 0; o < out; ++o) {
    int64_t i;
    if (!exact && out == in)
      i = o;
    else if (!exact && out == 2 * in)
      i = o >> 1;
    else
      i = static_cast<int64_t>(exact ? std::floor(float((double(o) + 0.5) * double(s)))
                                     : std::floor(float(o) * s));
    index[static_cast<size_t>(o)] = std::min(i, in - 1);
  }
  return from_vector(index).to(device);
}

// One dim resampled linearly: out[o] = l0 x[i0] + l1 x[i1], torch's source index and weights.
template <typename T>
Tensor linear_along(const Tensor& x, int64_t d, int64_t out, bool align_corners,
                    std::optional<double> scale) {
  const int64_t in = x.size(d);
  const T s = source_scale<T>(in, out, align_corners, scale);
  std::vector<int64_t> first(static_cast<size_t>(out)), second(first.size());
  std::vector<T> w0(first.size()), w1(first.size());
  for (int64_t o = 0; o < out; ++o) {
    if (out == in) {  // a copy, whatever the scale (torch's)
      first[static_cast<size_t>(o)] = second[static_cast<size_t>(o)] = o;
      w0[static_cast<size_t>(o)] = T(1);
      w1[static_cast<size_t>(o)] = T(0);
      continue;
    }
    const T src = align_corners ? s * T(o) : std::max(s * (T(o) + T(0.5)) - T(0.5), T(0));
    const auto i = std::min(static_cast<int64_t>(src), in - 1);
    const size_t k = static_cast<size_t>(o);
    first[k] = i;
    second[k] = i + (i < in - 1 ? 1 : 0);
    w1[k] = std::min(std::max(src - T(i), T(0)), T(1));
    w0[k] = T(1) - w1[k];
  }
  Shape along(static_cast<size_t>(x.dim()), 1);
  along[static_cast<size_t>(d)] = out;
  const Device device = x.device();
  const Tensor l0 = from_vector(w0).reshape(along).to(device);
  const Tensor l1 = from_vector(w1).reshape(along).to(device);
  return index_select(x, d, from_vector(first).to(device)) * l0 +
         index_select(x, d, from_vector(second).to(device)) * l1;
}

}  // namespace

Tensor interpolate(const Tensor& x, const std::vector<int64_t>& size,
                   const std::vector<double>& scale_factor, std::string_view mode,
                   std::optional<bool> align_corners, std::optional<bool> recompute_scale_factor) {
  const char* op = "interpolate";
  detail::check_defined(x, op);
  const int64_t spatial = x.dim() - 2;
  KILN_CHECK(spatial >= 1 && spatial <= 3, op,
             ": expected a [N, C, ...] input with 1 to 3 spatial dims, got ", describe(x));
  const bool nearest = mode == "nearest" || mode == "nearest-exact";
  const std::string_view linear_mode = spatial == 1   ? "linear"
                                       : spatial == 2 ? "bilinear"
                                                      : "trilinear";
  KILN_CHECK(nearest || mode == linear_mode, op, ": mode \"", std::string(mode), "\" for ",
             describe(x), " must be \"nearest\", \"nearest-exact\" or \"", std::string(linear_mode),
             "\"");
  KILN_CHECK(!(nearest && align_corners.value_or(false)), op,
             ": align_corners applies to the linear modes only");
  KILN_CHECK(size.empty() != scale_factor.empty(), op,
             ": give either size or scale_factor, not both nor neither");
  const size_t given = size.empty() ? scale_factor.size() : size.size();
  KILN_CHECK(given == 1 || given == static_cast<size_t>(spatial), op, ": expected 1 or ", spatial,
             " sizes or scale factors for ", describe(x), ", got ", given);
  KILN_CHECK(nearest || x.is_floating_point(), op,
             ": linear modes need a floating-point input, got ", describe(x));
  Tensor out = x;
  // Innermost dim first: torch's bilinear sums along W inside its sum along H.
  for (int64_t k = spatial - 1; k >= 0; --k) {
    const size_t at = given == 1 ? 0 : static_cast<size_t>(k);
    const int64_t d = 2 + k, in = x.size(d);
    std::optional<double> scale;
    int64_t out_size;
    if (!size.empty()) {
      out_size = size[at];
    } else {
      const double f = scale_factor[at];
      KILN_CHECK(f > 0 && std::isfinite(f), op, ": scale factors must be positive, got ", f);
      out_size = static_cast<int64_t>(std::floor(double(in) * f));
      if (!recompute_scale_factor.value_or(false)) scale = f;
    }
    KILN_CHECK(out_size > 0 && in > 0, op, ": input and output sizes must be positive, got ", in,
               " -> ", out_size, " for dim ", d, " of ", describe(x));
    if (nearest) {
      out = index_select(out, d,
                         nearest_indices(in, out_size, scale, mode != "nearest", out.device()));
    } else if (out.dtype() == kFloat64) {
      out = linear_along<double>(out, d, out_size, align_corners.value_or(false), scale);
    } else {
      out = linear_along<float>(out, d, out_size, align_corners.value_or(false), scale);
    }
  }
  return out;
}

}  // namespace kiln
