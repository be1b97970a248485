// Every kiln op as a free function: factories, elementwise, reductions, indexing and NN ops.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// ---------------------------------------------------------------- factories
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
// The dtype defaults to the value's kind (bool, int64 or float32), as torch.full.
Tensor full(const Shape& shape, const Scalar& value, TensorOptions options = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
// A 0-dim tensor holding `value`.
Tensor scalar_tensor(const Scalar& value, TensorOptions options = {});
// int64 when start, end and step are all integral, else float32.
Tensor arange(const Scalar& end, TensorOptions options = {});
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1,
              TensorOptions options = {});
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
Tensor eye(int64_t n, TensorOptions options = {});
Tensor eye(int64_t n, int64_t m, TensorOptions options = {});
// The [2, N] int64 (row, column) indices of the lower (upper) triangle of a row x col matrix,
// on and below (above) the diagonal `offset`, row by row.
Tensor tril_indices(int64_t row, int64_t col, int64_t offset = 0,
                    TensorOptions options = TensorOptions(kInt64));
Tensor triu_indices(int64_t row, int64_t col, int64_t offset = 0,
                    TensorOptions options = TensorOptions(kInt64));

// Random factories draw from one process-wide generator; manual_seed makes them reproducible.
void manual_seed(uint64_t seed);
Tensor rand(const Shape& shape, TensorOptions options = {});   // uniform [0, 1)
Tensor randn(const Shape& shape, TensorOptions options = {});  // standard normal
// Uniform integers in [low, high); int64 unless options say otherwise.
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = {});
Tensor randint(int64_t high, const Shape& shape, TensorOptions options = {});
// A random permutation of 0 .. n-1 (int64 unless told).
Tensor randperm(int64_t n, TensorOptions options = kInt64);
// 1 with probability p (each element of p, or the number p for every element of x), else 0, in
// p's (x's) dtype.
Tensor bernoulli(const Tensor& p);
Tensor bernoulli(const Tensor& x, double p);
// Normal draws with the given means and standard deviations (broadcast); the tensor forms
// differentiate to mean and std (mean + std z).
Tensor normal(const Tensor& mean, const Tensor& std);
Tensor normal(const Tensor& mean, double std = 1.0);
Tensor normal(double mean, const Tensor& std);
Tensor normal(double mean, double std, const Shape& size, TensorOptions options = {});
// num_samples category indices (int64) per row of probs (1-D or 2-D, non-negative, not all 0;
// need not sum to 1), with or without replacement.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);

namespace detail {
Tensor from_buffer(const void* data, int64_t count, DType dtype, const Shape& shape);
}
// Copies `data` into a new tensor of the given shape (1-D when no shape is given).
template <typename T>
Tensor from_vector(const std::vector<T>& data, std::optional<Shape> shape = std::nullopt) {
  return detail::from_buffer(data.data(), static_cast<int64_t>(data.size()), dtype_of<T>,
                             shape.value_or(Shape{static_cast<int64_t>(data.size())}));
}
Tensor from_vector(const std::vector<bool>& data, std::optional<Shape> shape = std::nullopt);
// from_vector(data, {2, 3}): a braced list does not convert to std::optional<Shape>.
template <typename T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape) {
  return from_vector(data, std::optional<Shape>(shape));
}

// The values of kiln::tensor: a number or a (nested) braced list of them.
class TensorData {
 public:
  TensorData(bool v) : kind_(kBool), values_{v ? 1.0 : 0.0} {}
  TensorData(int v) : TensorData(static_cast<int64_t>(v)) {}
  TensorData(int64_t v) : kind_(kInt64), ints_{v} {}
  TensorData(float v) : TensorData(static_cast<double>(v)) {}
  TensorData(double v) : kind_(kFloat64), values_{v} {}
  TensorData(std::initializer_list<TensorData> list);

  // Row-major elements: integers in ints(), others in values().
  const Shape& shape() const { return shape_; }
  DType kind() const { return kind_; }  // bool, int64 or float64, the widest element's kind
  const std::vector<int64_t>& ints() const { return ints_; }
  const std::vector<double>& values() const { return values_; }

 private:
  Shape shape_;
  DType kind_ = kBool;
  std::vector<int64_t> ints_;
  std::vector<double> values_;
};
// torch::tensor: kiln::tensor({{1, 2}, {3, 4}}) is int64, kiln::tensor({1.5, 2.}) float32 (the
// default dtype), kiln::tensor({true, false}) bool; options give another dtype or device.
Tensor tensor(const TensorData& data, TensorOptions options = {});
// Wraps user memory without copying. The memory must outlive the tensor and its views unless a
// deleter is given, which kiln calls when the last of them goes away.
Tensor from_blob(void* data, const Shape& shape, TensorOptions options = {},
                 std::function<void(void*)> deleter = nullptr);
Tensor from_blob(void* data, const Shape& shape, const Shape& strides, TensorOptions options = {},
                 std::function<void(void*)> deleter = nullptr);

// ---------------------------------------------------------------- elementwise, unary
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor log2(const Tensor& x);
// log(x) / ln(10).
Tensor log10(const Tensor& x);
Tensor exp2(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor tan(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate: "none" (the erf form) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor silu(const Tensor& x);
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
Tensor erf(const Tensor& x);
// The special functions (lib/math/special.h; accuracy in docs/numerics.md): erfc = 1 - erf without
// its cancellation; erfinv (+-inf at +-1, NaN beyond); lgamma = log|Gamma(x)| (+inf at 0 and the
// negative integers); digamma = Gamma'/Gamma (-inf at +0, +inf at -0, NaN at the negative
// integers); trigamma = polygamma(1, x) (kiln's name; +inf at the poles, no gradient).
Tensor erfc(const Tensor& x);
Tensor erfinv(const Tensor& x);
Tensor lgamma(const Tensor& x);
Tensor digamma(const Tensor& x);
Tensor trigamma(const Tensor& x);
// The n-th derivative of digamma, for n = 0 (digamma) and 1 (trigamma); other orders raise.
Tensor polygamma(int64_t n, const Tensor& x);
// The multivariate log-gamma of dimension p: sum_j lgamma(x - j/2) over j < p, plus
// p (p - 1) / 4 log(pi); raises unless every element exceeds (p - 1) / 2.
Tensor mvlgamma(const Tensor& x, int64_t p);
// sin(pi x) / (pi x), 1 at 0.
Tensor sinc(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);  // half to even, as torch
Tensor trunc(const Tensor& x);
Tensor frac(const Tensor& x);  // x - trunc(x), floats only
// trunc's other name.
Tensor fix(const Tensor& x);
// Whether the sign bit is set (bool): true for -0.0 and for NaNs with the sign bit, false for
// unsigned and bool values.
Tensor signbit(const Tensor& x);
Tensor square(const Tensor& x);
Tensor logical_not(const Tensor& x);
Tensor isnan(const Tensor& x);
Tensor isfinite(const Tensor& x);
Tensor isinf(const Tensor& x);
Tensor isposinf(const Tensor& x);
Tensor isneginf(const Tensor& x);
// NaN, inf and -inf replaced by `nan` (default 0), `posinf` and `neginf` (default the dtype's
// largest and lowest finite values); integer and bool tensors are copied.
Tensor nan_to_num(const Tensor& x, std::optional<double> nan = 0.0,
                  std::optional<double> posinf = std::nullopt,
                  std::optional<double> neginf = std::nullopt);
// sign, for real tensors.
Tensor sgn(const Tensor& x);
// x * pi / 180 and x * 180 / pi; integer and bool tensors give float32, as torch's.
Tensor deg2rad(const Tensor& x);
Tensor rad2deg(const Tensor& x);
// log(z / (1 - z)) with z = x clamped to [eps, 1 - eps] when eps is given; integer tensors give
// float32. The gradient is torch's (0 outside the clamp's range).
Tensor logit(const Tensor& x, std::optional<double> eps = std::nullopt);

// ---------------------------------------------------------------- elementwise, binary
// (broadcasting)
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor add(const Tensor& a, const Scalar& b);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Scalar& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Scalar& b);
// True division: integer inputs give float32.
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Scalar& b);
Tensor pow(const Tensor& base, const Tensor& exponent);
Tensor pow(const Tensor& base, const Scalar& exponent);
Tensor pow(const Scalar& base, const Tensor& exponent);
// Division rounded by `rounding_mode`: "trunc" toward zero, "floor" toward -inf (Python's //,
// consistent with remainder); std::nullopt is true division. With a mode, integers stay integers
// (an integer divisor of 0 raises) and the gradient is 0.
Tensor div(const Tensor& a, const Tensor& b, std::optional<std::string_view> rounding_mode);
Tensor div(const Tensor& a, const Scalar& b, std::optional<std::string_view> rounding_mode);
// div(a, b, "floor").
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor floor_divide(const Tensor& a, const Scalar& b);
// Python's modulo: the result has the sign of the divisor.
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, const Scalar& b);
// log(e^a + e^b), without overflow; integer inputs give float32.
Tensor logaddexp(const Tensor& a, const Tensor& b);
Tensor logaddexp(const Tensor& a, const Scalar& b);
// b - alpha a.
Tensor rsub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor rsub(const Tensor& a, const Scalar& b, const Scalar& alpha = 1);
// a log(b), 0 where a is 0 and b is not NaN; integer inputs give float32.
Tensor xlogy(const Tensor& a, const Tensor& b);
Tensor xlogy(const Tensor& a, const Scalar& b);
// C's fmod: the result has the sign of the dividend.
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& a, const Scalar& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Scalar& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Scalar& b);
// atan2(a, b): the angle of the point (b, a), in (-pi, pi]; integer inputs give float32.
Tensor atan2(const Tensor& a, const Tensor& b);
Tensor atan2(const Tensor& a, const Scalar& b);
// sqrt(a^2 + b^2) without overflow or underflow in between; inf where either is infinite.
Tensor hypot(const Tensor& a, const Tensor& b);
Tensor hypot(const Tensor& a, const Scalar& b);
// 0 where a < 0, 1 where a > 0, b where a == 0 (and 0 for a NaN a, as torch). Piecewise
// constant: zero gradients.
Tensor heaviside(const Tensor& a, const Tensor& b);
Tensor heaviside(const Tensor& a, const Scalar& b);
// |a| with the sign bit of b (-0.0 and signed NaNs count); integer inputs give float32.
// torch's gradient: g copysign(a, b) / a for a, 0 where a is 0; none for b.
Tensor copysign(const Tensor& a, const Tensor& b);
Tensor copysign(const Tensor& a, const Scalar& b);
// maximum and minimum ignoring NaN: the other operand where one is NaN (NaN only where both are).
// Ties go to a, gradient and all (torch's).
Tensor fmax(const Tensor& a, const Tensor& b);
Tensor fmax(const Tensor& a, const Scalar& b);
Tensor fmin(const Tensor& a, const Tensor& b);
Tensor fmin(const Tensor& a, const Scalar& b);
// pow in float64 (both operands converted first).
Tensor float_power(const Tensor& a, const Tensor& b);
Tensor float_power(const Tensor& a, const Scalar& b);
Tensor float_power(const Scalar& a, const Tensor& b);
// div's other name.
Tensor true_divide(const Tensor& a, const Tensor& b);
Tensor true_divide(const Tensor& a, const Scalar& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Scalar& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Scalar& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Scalar& b);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b);
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt);
// Tensor bounds (broadcasting); an undefined one (or std::nullopt for min) leaves that side open.
// Not libtorch's std::optional<Tensor>: that would make clamp(x, std::nullopt, std::nullopt)
// ambiguous with the overload above.
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max = {});
Tensor clamp(const Tensor& x, std::nullopt_t, const Tensor& max);
// clamp's other name.
Tensor clip(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt);
Tensor clip(const Tensor& x, const Tensor& min, const Tensor& max = {});
Tensor clamp_min(const Tensor& x, const Scalar& min);
Tensor clamp_min(const Tensor& x, const Tensor& min);
Tensor clamp_max(const Tensor& x, const Scalar& max);
Tensor clamp_max(const Tensor& x, const Tensor& max);
// Bitwise ops on bool and integer tensors; floating-point operands raise, as torch.
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_and(const Tensor& a, const Scalar& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Scalar& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Scalar& b);
Tensor bitwise_not(const Tensor& x);
// start + weight * (end - start)
Tensor lerp(const Tensor& start, const Tensor& end, const Scalar& weight);
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
// self + value * tensor1 * tensor2 and self + value * tensor1 / tensor2
Tensor addcmul(const Tensor& self, const Tensor& tensor1, const Tensor& tensor2,
               const Scalar& value = 1);
Tensor addcdiv(const Tensor& self, const Tensor& tensor1, const Tensor& tensor2,
               const Scalar& value = 1);

// ---------------------------------------------------------------- reductions
// An empty `dims` reduces over every dimension. Negative dims count from the end.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x);
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& x);
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// (amin, amax) of every element, or along dim.
std::tuple<Tensor, Tensor> aminmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt,
                                   bool keepdim = false);
// Without a dim: the index into the flattened tensor.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Sums x down to `shape`, which x's shape must broadcast from (the gradient of expand).
Tensor sum_to_size(const Tensor& x, const Shape& shape);
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// The vector p-norm over dims (every dim when empty): p = 1, 2, any other positive number, or
// infinity (the largest |x|).
Tensor norm(const Tensor& x, const Scalar& p = 2, const std::vector<int64_t>& dims = {},
            bool keepdim = false);

// sum and mean skipping NaN (nanmean of only NaN is NaN; nanmean takes floating tensors).
Tensor nansum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor nanmean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// The lower median (of the elements of x, or along dim with its int64 index), and the k-th
// smallest value (k from 1) along dim with its index. NaN sorts as the largest value; a slice
// holding one has median NaN at the first NaN's index. Among equal values the index is that of the
// one at the position in a stable sort (libtorch leaves it unspecified). The median of an empty
// floating tensor is NaN; the median of all elements shares its gradient evenly among the elements
// equal to it, as torch's.
Tensor median(const Tensor& x);
std::tuple<Tensor, Tensor> median(const Tensor& x, int64_t dim, bool keepdim = false);
// median skipping NaN: the lower median of the other elements (NaN where there are none, at the
// first NaN's index along dim).
Tensor nanmedian(const Tensor& x);
std::tuple<Tensor, Tensor> nanmedian(const Tensor& x, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> kthvalue(const Tensor& x, int64_t k, int64_t dim = -1,
                                    bool keepdim = false);
// The sum of a matrix's main diagonal (integers sum in int64).
Tensor trace(const Tensor& x);
// The q-quantiles (q in [0, 1]: a number, or a 0-dim or 1-D tensor of x's dtype) of x's elements,
// or along dim, from a sort: "linear" interpolates between the neighbouring order statistics
// (torch's lerp), "lower", "higher", "nearest" (half to even) and "midpoint" pick or average them.
// A tensor q puts its dim first. quantile of a slice holding NaN is NaN; nanquantile skips NaN
// (NaN when a slice holds only NaN). The gradient flows to the picked elements.
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim = std::nullopt,
                bool keepdim = false, std::string_view interpolation = "linear");
Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = std::nullopt,
                bool keepdim = false, std::string_view interpolation = "linear");
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim = std::nullopt,
                   bool keepdim = false, std::string_view interpolation = "linear");
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = std::nullopt,
                   bool keepdim = false, std::string_view interpolation = "linear");
// The covariance matrix of the variables in x's rows (observations in its columns; a 1-D x is one
// variable), torch's: fweights (integer counts) and aweights (floating weights) weight the
// observations, correction 1 is Bessel's. corrcoef: the Pearson correlation coefficients, clipped
// to [-1, 1].
Tensor cov(const Tensor& x, int64_t correction = 1, const Tensor& fweights = {},
           const Tensor& aweights = {});
Tensor corrcoef(const Tensor& x);
// The histogram of x's elements in `bins` equal bins over [min, max] (x's own range when both are
// 0; one wider each way when that range is a point); elements outside it and NaN are not counted,
// max falls in the last bin. x's floating dtype; no gradient.
Tensor histc(const Tensor& x, int64_t bins = 100, const Scalar& min = 0, const Scalar& max = 0);
// The count (or sum of weights) of each value of a 1-D tensor of non-negative integers, over
// max(x.max() + 1, minlength) bins: int64 counts; weights of float32 give float32, others
// float64, as torch.
Tensor bincount(const Tensor& x, const Tensor& weights = {}, int64_t minlength = 0);
// The trapezoidal rule along dim: samples y at the points x (broadcasting with y, or 1-D along
// dim) or spaced dx apart; cumulative_trapezoid gives the running integrals (one fewer along dim).
Tensor trapezoid(const Tensor& y, const Tensor& x, int64_t dim = -1);
Tensor trapezoid(const Tensor& y, const Scalar& dx = 1, int64_t dim = -1);
Tensor cumulative_trapezoid(const Tensor& y, const Tensor& x, int64_t dim = -1);
Tensor cumulative_trapezoid(const Tensor& y, const Scalar& dx = 1, int64_t dim = -1);
// The n-th forward difference along dim (logical_xor for bool), after joining prepend and append
// to x along it.
Tensor diff(const Tensor& x, int64_t n = 1, int64_t dim = -1, const Tensor& prepend = {},
            const Tensor& append = {});

// Single-dim overloads: sum(x, 1), mean(x, -1, true). Templates so that a braced list, even an
// empty one ({} means every dim), always picks the list overload above.
template <typename I, detail::if_dim<I> = 0>
Tensor sum(const Tensor& x, I dim, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt) {
  return sum(x, Shape{static_cast<int64_t>(dim)}, keepdim, dtype);
}
template <typename I, detail::if_dim<I> = 0>
Tensor mean(const Tensor& x, I dim, bool keepdim = false) {
  return mean(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor prod(const Tensor& x, I dim, bool keepdim = false) {
  return prod(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor nansum(const Tensor& x, I dim, bool keepdim = false) {
  return nansum(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor nanmean(const Tensor& x, I dim, bool keepdim = false) {
  return nanmean(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor amax(const Tensor& x, I dim, bool keepdim = false) {
  return amax(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor amin(const Tensor& x, I dim, bool keepdim = false) {
  return amin(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor var(const Tensor& x, I dim, int64_t correction = 1, bool keepdim = false) {
  return var(x, Shape{static_cast<int64_t>(dim)}, correction, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor std(const Tensor& x, I dim, int64_t correction = 1, bool keepdim = false) {
  return std(x, Shape{static_cast<int64_t>(dim)}, correction, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor logsumexp(const Tensor& x, I dim, bool keepdim = false) {
  return logsumexp(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor all(const Tensor& x, I dim, bool keepdim = false) {
  return all(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor any(const Tensor& x, I dim, bool keepdim = false) {
  return any(x, Shape{static_cast<int64_t>(dim)}, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor norm(const Tensor& x, const Scalar& p, I dim, bool keepdim = false) {
  return norm(x, p, Shape{static_cast<int64_t>(dim)}, keepdim);
}

// (var, mean) and (std, mean) over `dims`.
std::tuple<Tensor, Tensor> var_mean(const Tensor& x, const std::vector<int64_t>& dims = {},
                                    int64_t correction = 1, bool keepdim = false);
std::tuple<Tensor, Tensor> std_mean(const Tensor& x, const std::vector<int64_t>& dims = {},
                                    int64_t correction = 1, bool keepdim = false);
// The number of nonzero elements over `dims` (all when empty), as int64.
Tensor count_nonzero(const Tensor& x, const std::vector<int64_t>& dims = {});
template <typename I, detail::if_dim<I> = 0>
std::tuple<Tensor, Tensor> var_mean(const Tensor& x, I dim, int64_t correction = 1,
                                    bool keepdim = false) {
  return var_mean(x, Shape{static_cast<int64_t>(dim)}, correction, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
std::tuple<Tensor, Tensor> std_mean(const Tensor& x, I dim, int64_t correction = 1,
                                    bool keepdim = false) {
  return std_mean(x, Shape{static_cast<int64_t>(dim)}, correction, keepdim);
}
template <typename I, detail::if_dim<I> = 0>
Tensor count_nonzero(const Tensor& x, I dim) {
  return count_nonzero(x, Shape{static_cast<int64_t>(dim)});
}

// ---------------------------------------------------------------- sorting and scans
// The k largest (smallest when !largest) along dim, in order, and their int64 indices.
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                bool sorted = true);
// Stable; NaN sorts as the largest value, as torch.
std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
// sort along dim 0, values only.
Tensor msort(const Tensor& x);
// (values, inverse, counts): the distinct elements of x in ascending order (slices along dim when
// given, compared lexicographically), where each element (slice) of x went among them (x's shape,
// or [x.size(dim)]; empty unless return_inverse) and how often each occurs (empty unless
// return_counts). NaNs are all distinct, as torch's. Always sorted (sorted = false is allowed,
// as torch's CPU unique also sorts). The results carry no gradient.
std::tuple<Tensor, Tensor, Tensor> unique(const Tensor& x, bool sorted = true,
                                          bool return_inverse = false, bool return_counts = false,
                                          std::optional<int64_t> dim = std::nullopt);
std::tuple<Tensor, Tensor, Tensor> unique_dim(const Tensor& x, int64_t dim, bool sorted = true,
                                              bool return_inverse = false,
                                              bool return_counts = false);
// unique of runs: each run of equal consecutive elements (slices) once, in x's order.
std::tuple<Tensor, Tensor, Tensor> unique_consecutive(const Tensor& x, bool return_inverse = false,
                                                      bool return_counts = false,
                                                      std::optional<int64_t> dim = std::nullopt);
// Integer and bool inputs accumulate in int64 unless dtype says otherwise, as torch.
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
// The running maximum (minimum) along dim and the int64 index where it was reached: of equal
// values the last, as torch; from a NaN on, NaN at that NaN's index.
std::tuple<Tensor, Tensor> cummax(const Tensor& x, int64_t dim);
std::tuple<Tensor, Tensor> cummin(const Tensor& x, int64_t dim);
// log(cumsum(exp(x))) along dim, without overflow (floating tensors).
Tensor logcumsumexp(const Tensor& x, int64_t dim);
// Where each value would be inserted into the innermost dim of a sorted sequence to keep it
// sorted: the first such index, or the last with right (or side "right"); sorter, when defined,
// holds the int64 indices that sort an unsorted sequence. A 1-D sequence serves every value;
// otherwise its leading dims match the values'. NaN sorts as the largest value. int64 indices,
// int32 with out_int32. bucketize is the same with a 1-D boundaries sequence.
Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool out_int32 = false,
                    bool right = false, std::optional<std::string_view> side = std::nullopt,
                    const Tensor& sorter = {});
Tensor searchsorted(const Tensor& sorted_sequence, const Scalar& value, bool out_int32 = false,
                    bool right = false, std::optional<std::string_view> side = std::nullopt,
                    const Tensor& sorter = {});
Tensor bucketize(const Tensor& values, const Tensor& boundaries, bool out_int32 = false,
                 bool right = false);
Tensor bucketize(const Scalar& value, const Tensor& boundaries, bool out_int32 = false,
                 bool right = false);

// ---------------------------------------------------------------- views (free-function forms)
// libtorch's free functions of the Tensor view methods, plus swapaxes/swapdims (transpose) and
// movedim (a permute that moves `source` dims to `destination`, the rest keeping their order).
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor swapaxes(const Tensor& x, int64_t axis0, int64_t axis1);
Tensor swapdims(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor movedim(const Tensor& x, const std::vector<int64_t>& source,
               const std::vector<int64_t>& destination);
Tensor movedim(const Tensor& x, int64_t source, int64_t destination);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes,
                          int64_t dim = 0);
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);
// x expanded to `shape`, and the tensors expanded to their broadcast shape (views).
Tensor broadcast_to(const Tensor& x, const Shape& shape);
std::vector<Tensor> broadcast_tensors(const std::vector<Tensor>& tensors);
// The diagonal `offset` (above the main one when positive) of the plane of dims dim1 and dim2, as
// a view whose last dim runs along it.
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);

// ---------------------------------------------------------------- linear algebra (oneDNN GEMM)
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// torch.matmul: 1-D/2-D products and batched products with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// x @ weight^T + bias; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// beta * self + alpha * (m1 @ m2)
Tensor addmm(const Tensor& self, const Tensor& m1, const Tensor& m2, const Scalar& beta = 1,
             const Scalar& alpha = 1);
// The same for batches [b, n, m] @ [b, m, p]: baddbmm keeps the batch (self broadcasts to
// [b, n, p]), addbmm sums it (self broadcasts to [n, p]); addmv multiplies a matrix [n, m] by a
// vector [m] (self broadcasts to [n]); addr adds the outer product of two vectors. With beta 0,
// self is ignored (its NaN and infinities do not propagate), as torch's.
Tensor baddbmm(const Tensor& self, const Tensor& batch1, const Tensor& batch2,
               const Scalar& beta = 1, const Scalar& alpha = 1);
Tensor addbmm(const Tensor& self, const Tensor& batch1, const Tensor& batch2,
              const Scalar& beta = 1, const Scalar& alpha = 1);
Tensor addmv(const Tensor& self, const Tensor& mat, const Tensor& vec, const Scalar& beta = 1,
             const Scalar& alpha = 1);
Tensor addr(const Tensor& self, const Tensor& vec1, const Tensor& vec2, const Scalar& beta = 1,
            const Scalar& alpha = 1);
// torch's deprecated chain_matmul: linalg::multi_dot of 2-D matrices only (one gives a copy).
Tensor chain_matmul(const std::vector<Tensor>& matrices);

// a b^T of two 1-D tensors; the sum of products of two 1-D tensors of one dtype (a 0-dim result).
Tensor outer(const Tensor& a, const Tensor& b);
Tensor dot(const Tensor& a, const Tensor& b);
// The p-norm of a - b (broadcast) over every element.
Tensor dist(const Tensor& a, const Tensor& b, const Scalar& p = 2);
// x with each slice along dim (x.select(dim, i)) whose p-norm exceeds maxnorm scaled down to
// maxnorm (times 1 / (norm + 1e-7), as torch).
Tensor renorm(const Tensor& x, const Scalar& p, int64_t dim, const Scalar& maxnorm);

// Einstein summation over one to three operands, lowered to permutes, sums and batched GEMMs:
// "ij,jk->ik", "bij,bjk->bik", "i,i->", "ij->ji", "bhqd,bhkd->bhqk", implicit outputs ("ij,jk").
// Ellipses and repeated letters within one operand (diagonals) raise.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);
// Sums the products of a's dims_a with b's dims_b (pairwise): the result has a's other dims, then
// b's. The number form contracts a's last `dims` dims with b's first.
Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<int64_t>& dims_a,
                 const std::vector<int64_t>& dims_b);
Tensor tensordot(const Tensor& a, const Tensor& b, int64_t dims = 2);
// The p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M] (batch dims
// broadcast): [..., P, R]. For p = 2 compute_mode chooses torch's algorithm: 0 (default) the GEMM
// expansion when P or R exceeds 25, 1 always, 2 never (direct differences, more accurate).
Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2,
             std::optional<int64_t> compute_mode = std::nullopt);

// ---------------------------------------------------------------- indexing and joining
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Coordinate grids of 0-D or 1-D tensors: each output has every input's length as a dim (views).
// indexing "ij" (matrix) or "xy" (Cartesian: the first two dims swapped).
std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing = "ij");
// Every combination of the 1-D tensors' elements, [N, k] (one tensor: itself).
Tensor cartesian_prod(const std::vector<Tensor>& tensors);
// The block-diagonal matrix of the tensors (0-D as 1 x 1, 1-D as one row, 2-D), dtype promoted.
Tensor block_diag(const std::vector<Tensor>& tensors);
// x rotated k quarter turns in the plane of dims, from the first dim toward the second.
Tensor rot90(const Tensor& x, int64_t k = 1, const std::vector<int64_t>& dims = {0, 1});
// A copy of self with src added at the given indices: out[..., index[i], ...] += src[..., i, ...]
// along dim (the gradient of index_select and embedding).
Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// A copy of self with out[index[i][j]][j] += src[i][j] along dim (for dim 0; the gradient of
// gather).
// gather). src may be larger than index in any dim: only its part of index's shape is scattered.
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// A copy of self with out[index[i][j]][j] = src[i][j] along dim (for dim 0), or = value. Where
// index repeats a position, the last write in index's row-major order wins (torch leaves it
// unspecified).
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value);
// A copy of self with src's values combined into each position along dim by reduce ("sum",
// "prod", "mean", "amax" or "amin"), self's own value included or not. mean divides by how many
// values a position took, rounding down for integers.
Tensor scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const std::string& reduce, bool include_self = true);
// A copy of self with source's slices written at index (1-D) along dim: out.select(dim, index[i])
// = source.select(dim, i).
Tensor index_copy(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source);
// A copy of self with the slices at index along dim set to value (a number or a 0-dim tensor).
Tensor index_fill(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value);
Tensor index_fill(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& value);
// self (broadcast with mask) with the elements where mask holds replaced, in row-major order, by
// source's first elements (source needs at least as many elements as the mask selects).
Tensor masked_scatter(const Tensor& self, const Tensor& mask, const Tensor& source);
// The elements of self, viewed as 1-D, at index (any shape; negative positions count from the
// end): the result has index's shape.
Tensor take(const Tensor& self, const Tensor& index);
// gather along dim with self and indices broadcast to each other but along dim; without a dim,
// the flattened self at the flattened indices.
Tensor take_along_dim(const Tensor& self, const Tensor& indices,
                      std::optional<int64_t> dim = std::nullopt);
// Whether each element of elements is among test_elements (bool, elements' shape; dtypes
// promoted; NaN is in nothing). invert negates. assume_unique is accepted and changes nothing.
Tensor isin(const Tensor& elements, const Tensor& test_elements, bool assume_unique = false,
            bool invert = false);
Tensor isin(const Tensor& elements, const Scalar& test_element, bool assume_unique = false,
            bool invert = false);
Tensor isin(const Scalar& element, const Tensor& test_elements, bool assume_unique = false,
            bool invert = false);
// A copy of self with src written into self.select(dim, index), or into its diagonal.
Tensor select_scatter(const Tensor& self, const Tensor& src, int64_t dim, int64_t index);
Tensor diagonal_scatter(const Tensor& self, const Tensor& src, int64_t offset = 0, int64_t dim1 = 0,
                        int64_t dim2 = 1);
// A copy of self with src written into self.slice(dim, start, end, step) (the gradient of slice).
Tensor slice_scatter(const Tensor& self, const Tensor& src, int64_t dim = 0,
                     std::optional<int64_t> start = std::nullopt,
                     std::optional<int64_t> end = std::nullopt, int64_t step = 1);
// x with the elements where mask (broadcast to x) holds replaced by value (a number or a 0-dim
// tensor); x's dtype.
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value);
// The elements of x (broadcast with mask) where mask holds, as a 1-D tensor.
Tensor masked_select(const Tensor& x, const Tensor& mask);
// The indices of the nonzero elements, int64 [count, x.dim()].
Tensor nonzero(const Tensor& x);
// nonzero's other name.
Tensor argwhere(const Tensor& x);
// Copies: flip reverses the given dims; roll shifts elements along dims (the flattened tensor when
// dims is empty), wrapping around; repeat tiles x (torch's Tensor.repeat); tril/triu keep the
// elements on and below (above) the given diagonal of the last two dims and zero the rest.
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts,
            const std::vector<int64_t>& dims = {});
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
// diag of a 1-D x: the square matrix with x on diagonal k; of a 2-D x: a copy of its diagonal k.
Tensor diag(const Tensor& x, int64_t k = 0);
// x's last dim on diagonal `offset` of dims dim1 and dim2 of a new tensor with one more dim, zeros
// elsewhere: diagonal(diag_embed(x, o, d1, d2), o, d1, d2) is x.
Tensor diag_embed(const Tensor& x, int64_t offset = 0, int64_t dim1 = -2, int64_t dim2 = -1);
// The Kronecker product: each element of a times b, of shape a.sizes() * b.sizes() elementwise
// (the shorter shape padded with leading 1s).
Tensor kron(const Tensor& a, const Tensor& b);
// repeat with dims padded with leading 1s to x's dims (torch.tile).
Tensor tile(const Tensor& x, const std::vector<int64_t>& dims);
// Each element `repeats` times in a row along dim (of the flattened x without a dim); a tensor of
// repeats (int, one count or one per element of dim) gives each element's count.
Tensor repeat_interleave(const Tensor& x, int64_t repeats,
                         std::optional<int64_t> dim = std::nullopt);
Tensor repeat_interleave(const Tensor& x, const Tensor& repeats,
                         std::optional<int64_t> dim = std::nullopt);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
// A view of self's storage with the given geometry; storage_offset is absolute, as in torch.
Tensor as_strided(const Tensor& self, const Shape& sizes, const Shape& strides,
                  std::optional<int64_t> storage_offset = std::nullopt);
// A copy of self (same strides) with src written where as_strided(self, ...) would look.
Tensor as_strided_scatter(const Tensor& self, const Tensor& src, const Shape& sizes,
                          const Shape& strides,
                          std::optional<int64_t> storage_offset = std::nullopt);

// ---------------------------------------------------------------- neural-network ops
enum class Reduction { None, Mean, Sum };

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Normalizes over the trailing dims given by normalized_shape; weight and bias may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// logits [N, C] (or [C]) and int64 class indices [N] (or []).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when !train.
Tensor dropout(const Tensor& x, double p, bool train = true);

// ---------------------------------------------------------------- convolution and pooling (NCHW)
// Spatial arguments (stride, padding, dilation, kernel_size, ...) give one value per spatial dim;
// a single value applies to every spatial dim, as torch's ints do.
// A padding mode by name ("same" or "valid"). It is built only from strings, so that a braced
// list of numbers passed as padding always means padding sizes.
struct PaddingMode {
  template <typename S, typename = std::enable_if_t<std::is_convertible_v<const S&, std::string>>>
  PaddingMode(const S& s) : name(s) {}  // NOLINT: implicit, as torch's padding="same"
  std::string name;
};
// conv2d: input [N, C, H, W] (or unbatched [C, H, W]), weight [O, C / groups, kH, kW], bias [O]
// or undefined. float32 and float64. padding "same" (stride 1) or "valid" in the string overload.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Shape& stride = {1}, const Shape& padding = {0}, const Shape& dilation = {1},
              int64_t groups = 1);
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              PaddingMode padding, const Shape& dilation = {1}, int64_t groups = 1);
// conv1d: input [N, C, L] (or [C, L]), weight [O, C / groups, k]: conv2d with H = 1.
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Shape& stride = {1}, const Shape& padding = {0}, const Shape& dilation = {1},
              int64_t groups = 1);
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              PaddingMode padding, const Shape& dilation = {1}, int64_t groups = 1);
// conv3d: input [N, C, D, H, W] (or [C, D, H, W]), weight [O, C / groups, kD, kH, kW]; one
// conv2d of the depth slices each output depth reads, gathered as channels.
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Shape& stride = {1}, const Shape& padding = {0}, const Shape& dilation = {1},
              int64_t groups = 1);
Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              PaddingMode padding, const Shape& dilation = {1}, int64_t groups = 1);
// The gradients of conv2d (batched, 4-D): the input's, of shape input_size, from grad_output
// [N, O, oH, oW] and weight; and the weight's, of shape weight_size, from grad_output and input.
Tensor conv2d_grad_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_size,
                         const Shape& stride, const Shape& padding, const Shape& dilation,
                         int64_t groups);
Tensor conv2d_grad_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_size,
                          const Shape& stride, const Shape& padding, const Shape& dilation,
                          int64_t groups);
// The transposed convolution (conv2d_grad_input with a bias): input [N, C, H, W], weight
// [C, O / groups, kH, kW], torch's argument order.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        const Shape& stride = {1}, const Shape& padding = {0},
                        const Shape& output_padding = {0}, int64_t groups = 1,
                        const Shape& dilation = {1});
// conv_transpose1d: input [N, C, L] (or [C, L]), weight [C, O / groups, k]: conv_transpose2d
// with H = 1; each argument is one value.
Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        const Shape& stride = {1}, const Shape& padding = {0},
                        const Shape& output_padding = {0}, int64_t groups = 1,
                        const Shape& dilation = {1});
// Max pooling over [N, C, H, W] (or [C, H, W]); an empty stride means kernel_size. Indices are
// int64 positions in each H * W plane, as torch's.
std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                   const Shape& stride = {},
                                                   const Shape& padding = {0},
                                                   const Shape& dilation = {1},
                                                   bool ceil_mode = false);
Tensor max_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0}, const Shape& dilation = {1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0}, bool ceil_mode = false,
                  bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& input, const Shape& output_size);
// The 1-D poolings over [N, C, L] (or [C, L]): the 2-D ones over a height of 1; each argument is
// one value. max_pool1d's indices are positions along L.
std::tuple<Tensor, Tensor> max_pool1d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                   const Shape& stride = {},
                                                   const Shape& padding = {0},
                                                   const Shape& dilation = {1},
                                                   bool ceil_mode = false);
Tensor max_pool1d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0}, const Shape& dilation = {1}, bool ceil_mode = false);
Tensor avg_pool1d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0}, bool ceil_mode = false,
                  bool count_include_pad = true);
Tensor adaptive_avg_pool1d(const Tensor& input, const Shape& output_size);
// Adaptive max pooling: output o along a dim of size n takes the max over
// [floor(o n / out), ceil((o + 1) n / out)), as torch; indices as max_pool2d's (max_pool1d's).
std::tuple<Tensor, Tensor> adaptive_max_pool2d_with_indices(const Tensor& input,
                                                            const Shape& output_size);
Tensor adaptive_max_pool2d(const Tensor& input, const Shape& output_size);
std::tuple<Tensor, Tensor> adaptive_max_pool1d_with_indices(const Tensor& input,
                                                            const Shape& output_size);
Tensor adaptive_max_pool1d(const Tensor& input, const Shape& output_size);
// The 3-D poolings over [N, C, D, H, W] (or [C, D, H, W]), torch's windows and divisors, composed
// of the 2-D ones over depth slices (1 or 3 values per argument). max_pool3d's indices are
// positions in each D * H * W volume; a window's first maximum in (d, h, w) order wins.
std::tuple<Tensor, Tensor> max_pool3d_with_indices(const Tensor& input, const Shape& kernel_size,
                                                   const Shape& stride = {},
                                                   const Shape& padding = {0},
                                                   const Shape& dilation = {1},
                                                   bool ceil_mode = false);
Tensor max_pool3d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0}, const Shape& dilation = {1}, bool ceil_mode = false);
Tensor avg_pool3d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0}, bool ceil_mode = false,
                  bool count_include_pad = true);
Tensor adaptive_avg_pool3d(const Tensor& input, const Shape& output_size);
Tensor adaptive_max_pool3d(const Tensor& input, const Shape& output_size);

// ---------------------------------------------------------------- normalization over channels
// input [N, C, ...]. Training: normalizes with the batch statistics over every dim but C and, when
// running_mean/running_var are defined, updates them in place (momentum, unbiased variance, as
// torch); eval: normalizes with the running statistics. weight/bias [C] may be undefined.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = {}, const Tensor& bias = {}, bool training = false,
                  double momentum = 0.1, double eps = 1e-5);
// torch.nn.functional.instance_norm: input [N, C, ...] normalized per sample and channel over the
// spatial dims (batch_norm of [1, N C, ...], as torch). With use_input_stats the running
// statistics (when defined) move toward the batch's mean over N of each instance's mean and
// unbiased variance; without it they normalize (eval).
Tensor instance_norm(const Tensor& input, const Tensor& running_mean = {},
                     const Tensor& running_var = {}, const Tensor& weight = {},
                     const Tensor& bias = {}, bool use_input_stats = true, double momentum = 0.1,
                     double eps = 1e-5);
// input [N, C, ...] normalized over each of num_groups groups of C / num_groups channels.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

// ---------------------------------------------------------------- matrix functions
// Over the last two dims (square matrices, float32 or float64), batched over the leading ones,
// which broadcast between A and B. LAPACK runs them (a CUDA tensor's matrices go through the
// host). A singular matrix (solve, inv) or one that is not positive-definite (cholesky) raises;
// det of a singular matrix is 0 and its gradient the cofactor matrix, as for any other.
// torch::special's names for kiln's special functions; ndtr is the standard normal's distribution
// function, erfc(-x / sqrt(2)) / 2.
namespace special {
Tensor erf(const Tensor& x);
Tensor erfc(const Tensor& x);
Tensor erfinv(const Tensor& x);
Tensor gammaln(const Tensor& x);
Tensor digamma(const Tensor& x);
Tensor psi(const Tensor& x);
Tensor polygamma(int64_t n, const Tensor& x);
Tensor multigammaln(const Tensor& x, int64_t p);
Tensor ndtr(const Tensor& x);
}  // namespace special

namespace linalg {
// X with A X = B (left) or X A = B. B is a vector when it has one dim, or A's shape without its
// last dim.
Tensor solve(const Tensor& A, const Tensor& B, bool left = true);
// X with A X = B (left) or X A = B for a triangular A, of which only that triangle is read (and
// not the diagonal when unitriangular: ones). A zero on the diagonal gives infinities or NaN.
Tensor solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left = true,
                        bool unitriangular = false);
Tensor inv(const Tensor& A);
Tensor det(const Tensor& A);
// (sign, log|det|): sign 0 and log|det| -inf for a singular matrix; only log|det| has a gradient.
std::tuple<Tensor, Tensor> slogdet(const Tensor& A);
// L with A = L L^T, read from A's lower triangle; with upper, U with A = U^T U from the upper.
Tensor cholesky(const Tensor& A, bool upper = false);
// (eigenvalues ascending, eigenvectors as columns) of symmetric matrices read from the lower
// ("L") or upper ("U") triangle. A triangle holding an infinity or NaN gives NaN; the gradient
// divides by eigenvalue gaps (infinite at a repeated eigenvalue, as torch's).
std::tuple<Tensor, Tensor> eigh(const Tensor& A, const std::string& UPLO = "L");
Tensor eigvalsh(const Tensor& A, const std::string& UPLO = "L");
// (Q, R) with A = Q R: mode "reduced" (Q m x k, R k x n, k = min(m, n)), "complete" (Q m x m) or
// "r" (R alone; Q empty). Householder's: R's diagonal may be negative, as torch's.
std::tuple<Tensor, Tensor> qr(const Tensor& A, const std::string& mode = "reduced");
// (U, S, Vh) with A = U diag(S) Vh, S descending; full_matrices gives square U and Vh (m x m and
// n x n), otherwise k = min(m, n) columns of U and rows of Vh. A's matrices may be rectangular.
// The gradient through U or Vh divides by singular-value gaps (infinite at a repeated one, as
// torch's); through S alone it is always defined.
std::tuple<Tensor, Tensor, Tensor> svd(const Tensor& A, bool full_matrices = true);
Tensor svdvals(const Tensor& A);
// The Moore-Penrose pseudo-inverse, from the SVD: singular values at most
// max(atol, rtol * largest) are dropped. rtol defaults to max(m, n) * eps of A's dtype when atol
// is not given, otherwise to 0, as torch. hermitian: A is symmetric, read from its lower triangle
// (through eigh).
Tensor pinv(const Tensor& A, std::optional<double> atol = std::nullopt,
            std::optional<double> rtol = std::nullopt, bool hermitian = false);
// (solution, residuals, rank, singular_values) of min |A X - B| for each matrix, from A's SVD
// (singular values at most rcond * largest are dropped; rcond defaults to max(m, n) * eps). B is
// a matrix (or a vector when it has one dim less than A). residuals: the squared residual norm of
// each column of B when m > n and every A has full rank, otherwise empty; rank int64. driver is
// checked ("gelsy", "gelsd", "gelss", "gels") but every one computes all four.
std::tuple<Tensor, Tensor, Tensor, Tensor> lstsq(
    const Tensor& A, const Tensor& B, std::optional<double> rcond = std::nullopt,
    std::optional<std::string_view> driver = std::nullopt);
// A^n by repeated squaring; a negative n inverts first; n = 0 gives the identity.
Tensor matrix_power(const Tensor& A, int64_t n);
// The vector ord-norm over dims (every dim when empty): any real ord, 0 counting the nonzeros,
// +-infinity the largest (smallest) |x|. dtype converts x first.
Tensor vector_norm(const Tensor& x, const Scalar& ord = 2, const std::vector<int64_t>& dims = {},
                   bool keepdim = false, std::optional<DType> dtype = std::nullopt);
// The matrix norm over two dims: "fro", "nuc" (sum of singular values), or ord 1, -1 (max, min
// column sum of |A|), inf, -inf (row sums), 2, -2 (largest, smallest singular value).
Tensor matrix_norm(const Tensor& A, const std::string& ord = "fro",
                   const std::vector<int64_t>& dims = {-2, -1}, bool keepdim = false);
Tensor matrix_norm(const Tensor& A, double ord, const std::vector<int64_t>& dims = {-2, -1},
                   bool keepdim = false);
// The cross product of 3-vectors along dim (of size 3), broadcasting a and b.
Tensor cross(const Tensor& a, const Tensor& b, int64_t dim = -1);
// torch's linalg.norm: a string ord, or two dims, or a 2-D A with an ord and no dims, is
// matrix_norm; otherwise vector_norm (of every element without dims; ord 2 when absent). No dims
// (empty) is torch's dim=None.
Tensor norm(const Tensor& A, std::optional<Scalar> ord = std::nullopt,
            const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor norm(const Tensor& A, const std::string& ord, const std::vector<int64_t>& dims = {},
            bool keepdim = false);
// The number of singular values (absolute eigenvalues, hermitian) above max(atol, rtol * the
// largest), int64, with pinv's defaults.
Tensor matrix_rank(const Tensor& A, std::optional<double> atol = std::nullopt,
                   std::optional<double> rtol = std::nullopt, bool hermitian = false);
// The sum of x * y along dim (broadcast), floating dtypes only.
Tensor vecdot(const Tensor& x, const Tensor& y, int64_t dim = -1);
// The product of the matrices in the order of fewest multiplications (the first and the last may
// be vectors, their dims dropped from the result).
Tensor multi_dot(const std::vector<Tensor>& tensors);
// (LU, pivots) with A = P L U for m x n matrices by partial pivoting: L (unit diagonal, not stored)
// below LU's diagonal, U on and above it; pivots int32 [..., min(m, n)], LAPACK's 1-based row
// interchanges. A matrix whose U has a zero on its diagonal raises (as torch; linalg::lu does
// not). pivot = false raises: kiln has no unpivoted LU (nor has torch on the CPU).
std::tuple<Tensor, Tensor> lu_factor(const Tensor& A, bool pivot = true);
// (P, L, U) with A = P L U: L m x k unit lower triangular, U k x n, k = min(m, n). torch's
// gradient (through L and U).
std::tuple<Tensor, Tensor, Tensor> lu(const Tensor& A, bool pivot = true);
// X with A X = B (left) or X A = B, A^T in place of A with adjoint, from lu_factor's LU and
// pivots; batch dims broadcast.
Tensor lu_solve(const Tensor& LU, const Tensor& pivots, const Tensor& B, bool left = true,
                bool adjoint = false);
}  // namespace linalg
// torch's older names: inverse is linalg::inv; logdet is log(det), NaN for a negative det.
Tensor inverse(const Tensor& A);
Tensor det(const Tensor& A);
Tensor logdet(const Tensor& A);
std::tuple<Tensor, Tensor> slogdet(const Tensor& A);
Tensor cholesky(const Tensor& A, bool upper = false);
// X with A X = B for A = L L^T given its Cholesky factor L (or A = U^T U, upper): two triangular
// solves reading only L's triangle; batch dims broadcast. torch's argument order (B first).
Tensor cholesky_solve(const Tensor& B, const Tensor& L, bool upper = false);
// (P, L, U) from lu_factor's LU and pivots (as linalg::lu gives them); without unpack_data L and U
// are empty, without unpack_pivots P is.
std::tuple<Tensor, Tensor, Tensor> lu_unpack(const Tensor& LU, const Tensor& pivots,
                                             bool unpack_data = true, bool unpack_pivots = true);

// ---------------------------------------------------------------- comparison helpers
// Same shape and every |a - b| <= atol + rtol * |b| (NaNs equal when equal_nan).
// Elementwise closeness (bool): a == b, or both NaN with equal_nan, or |a - b| <= atol + |rtol b|
// where finite; a and b must have one dtype.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
               bool equal_nan = false);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);
// Same shape, dtype and values.
bool equal(const Tensor& a, const Tensor& b);

// ---------------------------------------------------------------- threads
// One thread pool (OpenMP's, shared with oneDNN) for the whole library.
void set_num_threads(int n);
int get_num_threads();

}  // namespace kiln
