// Statistics with libtorch's names and semantics: quantile and nanquantile (from a sort), cov and
// corrcoef, histc and bincount (counts added with index_add), trapezoid and cumulative_trapezoid.
// Composed of sorts, gathers, reductions and elementwise ops in torch's order of operations, so
// that they record lazily, trace, differentiate through their parts and round as torch does.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

// ------------------------------------------------------------------------------------ quantiles
namespace {
enum class Interpolation { Linear, Lower, Higher, Midpoint, Nearest };

Interpolation parse_interpolation(std::string_view name, const char* op) {
  if (name == "linear") return Interpolation::Linear;
  if (name == "lower") return Interpolation::Lower;
  if (name == "higher") return Interpolation::Higher;
  if (name == "midpoint") return Interpolation::Midpoint;
  KILN_CHECK(name == "nearest", op,
             ": interpolation must be one of linear, lower, higher, midpoint or nearest, got \"",
             std::string(name), "\"");
  return Interpolation::Nearest;
}

void check_quantile_inputs(const Tensor& x, const Tensor& q, const char* op) {
  detail::check_defined(x, op);
  detail::check_defined(q, op, "q");
  KILN_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, op,
             ": expected a float32 or float64 input, got ", describe(x));
  KILN_CHECK(q.dtype() == x.dtype(), op, ": q must have the input's dtype, got q ", describe(q),
             " for input ", describe(x));
  KILN_CHECK(q.device() == x.device(), op, ": q and the input must be on one device, got ",
             q.device().str(), " and ", x.device().str());
  KILN_CHECK(q.dim() <= 1, op, ": q must be a number, 0-dim or 1-D, got ", describe(q));
  KILN_CHECK(x.numel() > 0, op, ": the input must not be empty, got ", describe(x));
  KILN_CHECK(logical_and(ge(q, 0), le(q, 1)).all().item<bool>(), op,
             ": q values must be in [0, 1], got ", describe(q));
}

// The positions in each sorted line [..., n] (NaN last) of the q-quantiles: [..., q values].
Tensor quantile_ranks(const Tensor& sorted, const Tensor& q, bool ignore_nan) {
  const Tensor nan = isnan(sorted);
  if (ignore_nan) {
    const Tensor ranks = q * (logical_not(nan).sum(-1, true) - 1);
    return where(ge(ranks, 0), ranks, 0.0);  // a line of only NaN reads its first NaN
  }
  const int64_t last = sorted.size(-1) - 1;
  return where(logical_not(nan.any(-1, true)), q * last, static_cast<double>(last));
}

// The quantiles of each sorted line: [..., q values].
Tensor quantiles_of_sorted(const Tensor& sorted, const Tensor& q, Interpolation interpolation,
                           bool ignore_nan) {
  Tensor ranks = quantile_ranks(sorted, q.reshape({-1}), ignore_nan);
  if (interpolation == Interpolation::Lower) ranks = floor(ranks);
  if (interpolation == Interpolation::Higher) ranks = ceil(ranks);
  if (interpolation == Interpolation::Nearest) ranks = round(ranks);
  const Tensor below_index = ranks.to(kInt64);
  const Tensor below = gather(sorted, -1, below_index);
  if (interpolation != Interpolation::Linear && interpolation != Interpolation::Midpoint)
    return below;
  const Tensor above = gather(sorted, -1, ceil(ranks).to(kInt64));
  const Tensor weights = interpolation == Interpolation::Midpoint
                             ? full_like(ranks, 0.5)
                             : ranks - below_index.to(ranks.dtype());
  return lerp(below, above, weights);
}

Tensor quantile_impl(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                     std::string_view interpolation, bool ignore_nan, const char* op) {
  check_quantile_inputs(x, q, op);
  const Interpolation how = parse_interpolation(interpolation, op);
  const int64_t d = dim ? detail::wrap_dim(*dim, std::max<int64_t>(x.dim(), 1), op, &x) : 0;
  // The lines to sort: x's elements as one, or x's lines along dim.
  const Tensor lines = dim ? (x.dim() == 0 ? x.reshape({1}) : x.movedim(d, -1)) : x.reshape({-1});
  const Tensor sorted = std::get<0>(sort(lines, -1));
  // [q values, the lines' shape]: q's dim first, as torch.
  Tensor out = quantiles_of_sorted(sorted, q, how, ignore_nan).movedim(-1, 0);
  if (keepdim) {
    if (dim) {
      if (x.dim() > 0) out = out.unsqueeze(d + 1);
    } else {
      Shape shape(static_cast<size_t>(x.dim()), 1);
      shape.insert(shape.begin(), out.size(0));
      out = out.reshape(shape);
    }
  }
  return q.dim() == 0 ? out.squeeze(0) : out;
}

Tensor q_tensor(const Tensor& x, double q, const char* op) {
  detail::check_defined(x, op);
  return scalar_tensor(q, TensorOptions(x.dtype()).device(x.device()));
}
}  // namespace

Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                std::string_view interpolation) {
  return quantile_impl(x, q, dim, keepdim, interpolation, false, "quantile");
}
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim,
                std::string_view interpolation) {
  return quantile(x, q_tensor(x, q, "quantile"), dim, keepdim, interpolation);
}
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return quantile_impl(x, q, dim, keepdim, interpolation, true, "nanquantile");
}
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return nanquantile(x, q_tensor(x, q, "nanquantile"), dim, keepdim, interpolation);
}

// ----------------------------------------------------------------------------------- covariance
namespace {
void check_observation_weights(const Tensor& w, const Tensor& x, int64_t observations,
                               bool integral, const char* name) {
  const char* op = "cov";
  if (!w.defined()) return;
  KILN_CHECK(w.dim() == 1 && w.numel() == observations, op, ": ", name,
             " must be 1-D with one weight per observation (", observations, "), got ", describe(w),
             " for input ", describe(x));
  KILN_CHECK(integral ? is_integral(w.dtype()) : w.is_floating_point(), op, ": ", name, " must be ",
             integral ? "integers" : "floating-point", ", got ", describe(w));
  KILN_CHECK(w.device() == x.device(), op, ": ", name, " must be on the input's device, got ",
             w.device().str(), " and ", x.device().str());
  KILN_CHECK(!lt(w, 0).any().item<bool>(), op, ": ", name, " cannot be negative");
}
}  // namespace

Tensor cov(const Tensor& x, int64_t correction, const Tensor& fweights, const Tensor& aweights) {
  const char* op = "cov";
  detail::check_defined(x, op);
  KILN_CHECK(x.dim() <= 2, op, ": expected an input of at most 2 dims, got ", describe(x));
  const Tensor in = x.dim() < 2 ? x.reshape({1, -1}) : x;
  const int64_t observations = in.size(1);
  check_observation_weights(fweights, x, observations, true, "fweights");
  check_observation_weights(aweights, x, observations, false, "aweights");
  Tensor w = fweights;
  if (aweights.defined()) w = w.defined() ? w * aweights : aweights;
  const Tensor w_sum =
      w.defined() ? w.sum() : scalar_tensor(observations, TensorOptions(kInt64).device(x.device()));
  const Tensor avg = (w.defined() ? in * w : in).sum(1) / w_sum;
  // The normalization: w_sum - correction, less its aweights-weighted form when both are given.
  Tensor norm_factor = w.defined() && aweights.defined() && correction != 0
                           ? w_sum - (w * aweights).sum() * correction / w_sum
                           : w_sum - correction;
  norm_factor = where(gt(norm_factor, 0), norm_factor, 0);  // torch warns and divides by 0
  const Tensor centered = in - avg.unsqueeze(1);
  const Tensor c = mm(centered, (w.defined() ? centered * w : centered).t());
  return div(c, norm_factor).squeeze();
}

Tensor corrcoef(const Tensor& x) {
  detail::check_defined(x, "corrcoef");
  KILN_CHECK(x.dim() <= 2, "corrcoef: expected an input of at most 2 dims, got ", describe(x));
  const Tensor c = cov(x);
  if (c.dim() == 0) return c / c;  // one variable: 1, or NaN without variance
  const Tensor stddev = sqrt(c.diagonal());
  return clamp(c / stddev.reshape({-1, 1}) / stddev.reshape({1, -1}), -1, 1);
}

// ---------------------------------------------------------------------------------- histograms
namespace {
// x's smallest and largest elements as a 2-element host tensor of x's dtype: one read of both.
Tensor extremes(const Tensor& x) {
  return stack({amin(x), amax(x)}).to(kCPU);
}
}  // namespace

Tensor histc(const Tensor& x, int64_t bins, const Scalar& min, const Scalar& max) {
  const char* op = "histc";
  detail::check_defined(x, op);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", describe(x));
  KILN_CHECK(bins > 0, op, ": bins must be positive, got ", bins);
  double lo = min.to_double(), hi = max.to_double();
  KILN_CHECK(lo <= hi, op, ": max must be at least min, got min ", lo, " and max ", hi);
  if (lo == hi && x.numel() > 0) {
    const std::vector<double> ends = extremes(x).to(kFloat64).to_vector<double>();
    lo = ends[0], hi = ends[1];
  }
  if (lo == hi) lo -= 1, hi += 1;
  KILN_CHECK(std::isfinite(lo) && std::isfinite(hi), op, ": range of [", lo, ", ", hi,
             "] is not finite (input ", describe(x), ")");
  // In x's dtype, as torch's kernel: bin (x - lo) * bins / (hi - lo), max into the last bin.
  // Elements outside [lo, hi] (and NaN) go to a spare bin past the end, dropped after counting.
  const TensorOptions options = TensorOptions(x.dtype()).device(x.device());
  const Tensor lo_t = scalar_tensor(lo, options), hi_t = scalar_tensor(hi, options);
  const Tensor flat = x.detach().reshape({-1});
  const Tensor in_range = logical_and(ge(flat, lo_t), le(flat, hi_t));
  const Tensor position =
      where(in_range, (flat - lo_t) * bins / (hi_t - lo_t), double(bins + 1)).to(kInt64);
  const Tensor bin = where(ne(position, bins), position, bins - 1);
  return index_add(zeros({bins + 2}, options), 0, bin, ones_like(flat)).narrow(0, 0, bins);
}

Tensor bincount(const Tensor& x, const Tensor& weights, int64_t minlength) {
  const char* op = "bincount";
  detail::check_defined(x, op);
  KILN_CHECK(x.dim() == 1 && is_integral(x.dtype()) && x.dtype() != kBool, op,
             ": expected a 1-D tensor of integers, got ", describe(x));
  KILN_CHECK(minlength >= 0, op, ": minlength must be non-negative, got ", minlength);
  KILN_CHECK(!weights.defined() || (weights.dim() == 1 && weights.numel() == x.numel()), op,
             ": weights must be 1-D with one weight per element, got ", describe(weights),
             " for input ", describe(x));
  KILN_CHECK(!weights.defined() || weights.device() == x.device(), op,
             ": weights must be on the input's device, got ", weights.device().str(), " and ",
             x.device().str());
  int64_t length = minlength;
  if (x.numel() > 0) {
    const std::vector<int64_t> ends = extremes(x).to(kInt64).to_vector<int64_t>();
    KILN_CHECK(ends[0] >= 0, op, ": the input must be non-negative, got ", describe(x));
    length = std::max(length, ends[1] + 1);
  }
  const DType dtype = !weights.defined()            ? kInt64
                      : weights.dtype() == kFloat32 ? kFloat32
                                                    : kFloat64;
  const TensorOptions options = TensorOptions(dtype).device(x.device());
  const Tensor counts = weights.defined() ? weights.detach().to(dtype) : ones({x.numel()}, options);
  Tensor bins;
  try {
    bins = zeros({length}, options);
  } catch (const Error& e) {  // a hostile value asks for petabytes: say whose bins they are
    KILN_FAIL(op, ": ", length, " bins for the largest value of ", describe(x), ": ", e.what());
  }
  return index_add(bins, 0, x.to(kInt64), counts);
}

// --------------------------------------------------------------------------------- integration
namespace {
// y's shape without dim, in y's dtype: the integral over no samples, as torch's.
Tensor zeros_without(const Tensor& y, int64_t dim) {
  Shape shape = y.sizes();
  shape.erase(shape.begin() + dim);
  return zeros(shape, TensorOptions(y.dtype()).device(y.device()));
}

// The spacings of the sample points x along dim, shaped to broadcast with y's.
Tensor spacings(const Tensor& y, const Tensor& x, int64_t dim, const char* op) {
  detail::check_defined(x, op, "x");
  KILN_CHECK(x.dtype() != kBool, op, ": bool sample points are not supported, got ", describe(x));
  Tensor points = x;
  if (x.dim() == 1) {
    KILN_CHECK(x.size(0) == y.size(dim), op, ": there must be one x value per sample, got ",
               describe(x), " for y ", describe(y), " along dim ", dim);
    Shape shape(static_cast<size_t>(y.dim()), 1);
    shape[dim] = x.size(0);
    points = x.reshape(shape);
  } else if (x.dim() < y.dim()) {
    Shape shape(static_cast<size_t>(y.dim() - x.dim()), 1);
    shape.insert(shape.end(), x.sizes().begin(), x.sizes().end());
    points = x.reshape(shape);
  }
  const int64_t n = points.size(dim), m = std::max<int64_t>(n - 1, 0);
  return points.narrow(dim, std::min<int64_t>(n, 1), m) - points.narrow(dim, 0, m);
}

int64_t integration_dim(const Tensor& y, int64_t dim, const char* op) {
  detail::check_defined(y, op, "y");
  KILN_CHECK(y.dtype() != kBool, op, ": bool samples are not supported, got ", describe(y));
  KILN_CHECK(y.dim() >= 1, op, ": expected samples of at least 1 dim, got ", describe(y));
  return detail::wrap_dim(dim, y.dim(), op, &y);
}

// The sums of neighbouring samples along dim: y[:-1] + y[1:] (empty for no samples).
Tensor neighbour_sums(const Tensor& y, int64_t dim) {
  const int64_t n = y.size(dim), m = std::max<int64_t>(n - 1, 0);
  return y.narrow(dim, 0, m) + y.narrow(dim, std::min<int64_t>(n, 1), m);
}
}  // namespace

Tensor trapezoid(const Tensor& y, const Tensor& x, int64_t dim) {
  const int64_t d = integration_dim(y, dim, "trapezoid");
  if (y.size(d) == 0) return zeros_without(y, d);
  return (neighbour_sums(y, d) * spacings(y, x, d, "trapezoid")).sum(d) / 2.0;
}

Tensor trapezoid(const Tensor& y, const Scalar& dx, int64_t dim) {
  const int64_t d = integration_dim(y, dim, "trapezoid");
  if (y.size(d) == 0) return zeros_without(y, d);
  return (y.sum(d) - (y.select(d, 0) + y.select(d, -1)) * 0.5) * dx.to_double();
}

Tensor cumulative_trapezoid(const Tensor& y, const Tensor& x, int64_t dim) {
  const char* op = "cumulative_trapezoid";
  const int64_t d = integration_dim(y, dim, op);
  return (neighbour_sums(y, d) * spacings(y, x, d, op)).cumsum(d) / 2.0;
}

Tensor cumulative_trapezoid(const Tensor& y, const Scalar& dx, int64_t dim) {
  const int64_t d = integration_dim(y, dim, "cumulative_trapezoid");
  return (neighbour_sums(y, d) * (dx.to_double() / 2.0)).cumsum(d);
}

}  // namespace kiln
