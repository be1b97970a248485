// kiln::Tensor: a cheap, shared handle to typed, strided memory on a device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/scalar.h"

namespace kiln {

namespace detail {
struct TensorImpl;
}

using Shape = std::vector<int64_t>;
// Prints [2, 3], as libtorch prints sizes(). Shape is a std::vector, so this is found where kiln's
// names are visible (inside namespace kiln or after `using namespace kiln`).
std::ostream& operator<<(std::ostream& os, const Shape& shape);

class Tensor;
namespace indexing {
class TensorIndex;
}
namespace detail {
// An integral dim for the single-dim overloads of the reductions (x.sum(1)). A template so that a
// braced list, even an empty one ({} means every dim), always picks the list overload.
template <typename I>
using if_dim = std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int>;
}  // namespace detail

// What a factory makes: dtype (defaulting per factory, float32 for most) and device.
struct TensorOptions {
  std::optional<DType> dtype_;
  Device device_ = kCPU;

  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d) {}
  TensorOptions(Device d) : device_(d) {}
  TensorOptions dtype(DType d) const {
    auto o = *this;
    o.dtype_ = d;
    return o;
  }
  TensorOptions device(Device d) const {
    auto o = *this;
    o.device_ = d;
    return o;
  }
  DType dtype_or(DType fallback) const { return dtype_.value_or(fallback); }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  int64_t storage_offset() const;
  size_t element_size() const { return kiln::element_size(dtype()); }
  bool is_floating_point() const { return kiln::is_floating_point(dtype()); }
  // True when both handles refer to the same tensor object (not merely equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  detail::TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<detail::TensorImpl>& impl_ptr() const { return impl_; }

  // --- autograd (see kiln/autograd.h)
  // Marks a floating-point leaf as a parameter whose gradient backward() accumulates in grad().
  Tensor& requires_grad_(bool requires_grad = true);
  bool requires_grad() const;
  // The accumulated gradient of a leaf; undefined until a backward pass reaches it.
  const Tensor& grad() const;
  Tensor& mutable_grad();
  // Accumulates d(this)/d(leaf) into every leaf's grad(); `gradient` may be omitted for a scalar.
  void backward(const Tensor& gradient = {}, std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false) const;
  // The same data with no history: never requires grad.
  Tensor detach() const;
  // True for tensors created by the user rather than by an op that recorded a gradient.
  bool is_leaf() const;
  // The name of the op whose backward produces this tensor's gradient, e.g. "mul"; empty for
  // leaves.
  std::string grad_fn_name() const;
  // Keeps grad() for a non-leaf after backward.
  void retain_grad() const;
  // Bumped by every in-place write to the storage this tensor shares.
  uint64_t version() const;

  // --- data access
  template <typename T>
  T item() const;
  Scalar item() const;
  template <typename T>
  T* data_ptr();
  template <typename T>
  const T* data_ptr() const;
  void* raw_data_ptr() const;
  // A copy of the elements in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  // --- conversions
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor cpu() const { return to(kCPU); }
  Tensor cuda() const { return to(kCUDA); }
  Tensor contiguous() const;
  Tensor clone() const;

  // --- views (share storage with this tensor)
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start = std::nullopt,
               std::optional<int64_t> end = std::nullopt, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor swapaxes(int64_t axis0, int64_t axis1) const;
  Tensor swapdims(int64_t dim0, int64_t dim1) const;
  Tensor movedim(const std::vector<int64_t>& source, const std::vector<int64_t>& destination) const;
  Tensor movedim(int64_t source, int64_t destination) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& split_sizes, int64_t dim = 0) const;
  std::vector<Tensor> unbind(int64_t dim = 0) const;

  // --- in-place (the source broadcasts to this tensor's shape)
  Tensor& add_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& add_(const Scalar& other);
  Tensor& sub_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& sub_(const Scalar& other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(const Scalar& other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(const Scalar& other);
  Tensor& zero_();
  Tensor& fill_(const Scalar& value);
  Tensor& copy_(const Tensor& src);
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt);

  // --- common ops as methods (each forwards to the free function in kiln/ops.h)
  Tensor add(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor sub(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor add(const Scalar& other) const;
  Tensor sub(const Scalar& other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(const Scalar& other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(const Scalar& other) const;
  Tensor div(const Tensor& other, std::optional<std::string_view> rounding_mode) const;
  Tensor div(const Scalar& other, std::optional<std::string_view> rounding_mode) const;
  Tensor floor_divide(const Tensor& other) const;
  Tensor floor_divide(const Scalar& other) const;
  Tensor fmod(const Tensor& other) const;
  Tensor fmod(const Scalar& other) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(const Scalar& exponent) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt) const;
  Tensor eq(const Tensor& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor lt(const Tensor& other) const;
  Tensor le(const Tensor& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor ge(const Tensor& other) const;

  Tensor sum(std::optional<DType> dtype = std::nullopt) const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false,
             std::optional<DType> dtype = std::nullopt) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor prod() const;
  Tensor prod(int64_t dim, bool keepdim = false) const;
  Tensor max() const;
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  Tensor min() const;
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor amax(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor amin(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor var(const std::vector<int64_t>& dims = {}, int64_t correction = 1,
             bool keepdim = false) const;
  Tensor std(const std::vector<int64_t>& dims = {}, int64_t correction = 1,
             bool keepdim = false) const;
  Tensor logsumexp(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor all() const;
  Tensor any() const;
  Tensor norm(const Scalar& p = 2) const;
  Tensor norm(const Scalar& p, const std::vector<int64_t>& dims, bool keepdim = false) const;

  // Single-dim reductions: x.sum(1), x.mean(-1, true).
  template <typename I, detail::if_dim<I> = 0>
  Tensor sum(I dim, bool keepdim = false, std::optional<DType> dtype = std::nullopt) const {
    return sum(Shape{static_cast<int64_t>(dim)}, keepdim, dtype);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor mean(I dim, bool keepdim = false) const {
    return mean(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor amax(I dim, bool keepdim = false) const {
    return amax(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor amin(I dim, bool keepdim = false) const {
    return amin(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor var(I dim, int64_t correction = 1, bool keepdim = false) const {
    return var(Shape{static_cast<int64_t>(dim)}, correction, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor std(I dim, int64_t correction = 1, bool keepdim = false) const {
    return std(Shape{static_cast<int64_t>(dim)}, correction, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor logsumexp(I dim, bool keepdim = false) const {
    return logsumexp(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor norm(const Scalar& p, I dim, bool keepdim = false) const {
    return norm(p, Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  Tensor all(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor any(const std::vector<int64_t>& dims, bool keepdim = false) const;
  template <typename I, detail::if_dim<I> = 0>
  Tensor all(I dim, bool keepdim = false) const {
    return all(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor any(I dim, bool keepdim = false) const {
    return any(Shape{static_cast<int64_t>(dim)}, keepdim);
  }

  // --- more elementwise methods (each forwards to the free function of the same name)
  Tensor sign() const;
  Tensor log1p() const;
  Tensor log2() const;
  Tensor log10() const;
  Tensor sinc() const;
  Tensor exp2() const;
  Tensor expm1() const;
  Tensor rsqrt() const;
  Tensor reciprocal() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tan() const;
  Tensor atan() const;
  Tensor asin() const;
  Tensor acos() const;
  Tensor sinh() const;
  Tensor cosh() const;
  Tensor asinh() const;
  Tensor acosh() const;
  Tensor atanh() const;
  Tensor erf() const;
  Tensor erfc() const;
  Tensor erfinv() const;
  Tensor lgamma() const;
  Tensor digamma() const;
  Tensor polygamma(int64_t n) const;  // orders 0 and 1
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;
  Tensor trunc() const;
  Tensor frac() const;
  Tensor fix() const;
  Tensor signbit() const;
  Tensor square() const;
  Tensor logical_not() const;
  Tensor isnan() const;
  Tensor isfinite() const;
  Tensor isinf() const;
  Tensor isposinf() const;
  Tensor isneginf() const;
  Tensor nan_to_num(std::optional<double> nan = 0.0, std::optional<double> posinf = std::nullopt,
                    std::optional<double> neginf = std::nullopt) const;
  Tensor sgn() const;
  Tensor xlogy(const Tensor& other) const;
  Tensor xlogy(const Scalar& other) const;
  Tensor logical_xor(const Tensor& other) const;
  Tensor remainder(const Tensor& other) const;
  Tensor remainder(const Scalar& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor maximum(const Tensor& other) const;
  Tensor atan2(const Tensor& other) const;
  Tensor eq(const Scalar& other) const;
  Tensor ne(const Scalar& other) const;
  Tensor lt(const Scalar& other) const;
  Tensor le(const Scalar& other) const;
  Tensor gt(const Scalar& other) const;
  Tensor ge(const Scalar& other) const;
  Tensor logical_and(const Tensor& other) const;
  Tensor logical_or(const Tensor& other) const;
  Tensor bitwise_and(const Tensor& other) const;
  Tensor bitwise_or(const Tensor& other) const;
  Tensor bitwise_xor(const Tensor& other) const;
  Tensor bitwise_not() const;
  // torch's x.where(condition, other): x where condition holds, else other.
  Tensor where(const Tensor& condition, const Tensor& other) const;
  // Tensor bounds; an undefined one (or std::nullopt for min) leaves that side open.
  Tensor clamp(const Tensor& min, const Tensor& max = {}) const;
  Tensor clamp(std::nullopt_t, const Tensor& max) const;
  Tensor clip(std::optional<Scalar> min, std::optional<Scalar> max = std::nullopt) const;
  Tensor clip(const Tensor& min, const Tensor& max = {}) const;
  Tensor clamp_min(const Scalar& min) const;
  Tensor clamp_min(const Tensor& min) const;
  Tensor clamp_max(const Scalar& max) const;
  Tensor clamp_max(const Tensor& max) const;
  Tensor lerp(const Tensor& end, const Scalar& weight) const;
  Tensor lerp(const Tensor& end, const Tensor& weight) const;
  Tensor addcmul(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1) const;
  Tensor addcdiv(const Tensor& tensor1, const Tensor& tensor2, const Scalar& value = 1) const;
  Tensor bmm(const Tensor& other) const;

  // --- indexing (libtorch's: x.index({Slice(1, None), 0, "...", None, mask}); see
  // kiln::indexing below)
  Tensor index(const std::vector<indexing::TensorIndex>& indices) const;
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& value);
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, const Scalar& value);
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor index_add(int64_t dim, const Tensor& index, const Tensor& source) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor scatter(int64_t dim, const Tensor& index, const Scalar& value) const;
  Tensor scatter_reduce(int64_t dim, const Tensor& index, const Tensor& src,
                        const std::string& reduce, bool include_self = true) const;
  Tensor index_copy(int64_t dim, const Tensor& index, const Tensor& source) const;
  Tensor index_fill(int64_t dim, const Tensor& index, const Scalar& value) const;
  Tensor index_fill(int64_t dim, const Tensor& index, const Tensor& value) const;
  Tensor masked_scatter(const Tensor& mask, const Tensor& source) const;
  Tensor take(const Tensor& index) const;
  Tensor take_along_dim(const Tensor& indices, std::optional<int64_t> dim = std::nullopt) const;
  Tensor select_scatter(const Tensor& src, int64_t dim, int64_t index) const;
  Tensor diagonal_scatter(const Tensor& src, int64_t offset = 0, int64_t dim1 = 0,
                          int64_t dim2 = 1) const;
  // In place: self becomes the out-of-place op's result (checked before anything is written).
  Tensor& index_add_(int64_t dim, const Tensor& index, const Tensor& source);
  Tensor& scatter_add_(int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& scatter_(int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& scatter_(int64_t dim, const Tensor& index, const Scalar& value);
  Tensor& scatter_reduce_(int64_t dim, const Tensor& index, const Tensor& src,
                          const std::string& reduce, bool include_self = true);
  Tensor& index_copy_(int64_t dim, const Tensor& index, const Tensor& source);
  Tensor& index_fill_(int64_t dim, const Tensor& index, const Scalar& value);
  Tensor& index_fill_(int64_t dim, const Tensor& index, const Tensor& value);
  Tensor& masked_scatter_(const Tensor& mask, const Tensor& source);
  Tensor slice_scatter(const Tensor& src, int64_t dim = 0,
                       std::optional<int64_t> start = std::nullopt,
                       std::optional<int64_t> end = std::nullopt, int64_t step = 1) const;
  // A view of every window of `size` elements along `dimension`, `step` apart: that dim becomes
  // the windows' count and a last dim of `size` is added (torch's Tensor.unfold).
  Tensor unfold(int64_t dimension, int64_t size, int64_t step) const;
  Tensor as_strided(const Shape& sizes, const Shape& strides,
                    std::optional<int64_t> storage_offset = std::nullopt) const;
  Tensor sum_to_size(const Shape& shape) const;
  Tensor addmm(const Tensor& mat1, const Tensor& mat2, const Scalar& beta = 1,
               const Scalar& alpha = 1) const;
  Tensor baddbmm(const Tensor& batch1, const Tensor& batch2, const Scalar& beta = 1,
                 const Scalar& alpha = 1) const;
  Tensor addbmm(const Tensor& batch1, const Tensor& batch2, const Scalar& beta = 1,
                const Scalar& alpha = 1) const;
  Tensor addmv(const Tensor& mat, const Tensor& vec, const Scalar& beta = 1,
               const Scalar& alpha = 1) const;
  Tensor addr(const Tensor& vec1, const Tensor& vec2, const Scalar& beta = 1,
              const Scalar& alpha = 1) const;
  Tensor masked_fill(const Tensor& mask, const Scalar& value) const;
  Tensor masked_fill(const Tensor& mask, const Tensor& value) const;
  Tensor& masked_fill_(const Tensor& mask, const Scalar& value);
  Tensor& masked_fill_(const Tensor& mask, const Tensor& value);
  Tensor masked_select(const Tensor& mask) const;
  Tensor nonzero() const;
  Tensor argwhere() const;

  // --- sorting, scans and rearrangements
  std::tuple<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true,
                                  bool sorted = true) const;
  std::tuple<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  Tensor cumsum(int64_t dim, std::optional<DType> dtype = std::nullopt) const;
  Tensor cumprod(int64_t dim, std::optional<DType> dtype = std::nullopt) const;
  std::tuple<Tensor, Tensor> cummax(int64_t dim) const;
  std::tuple<Tensor, Tensor> cummin(int64_t dim) const;
  Tensor logcumsumexp(int64_t dim) const;
  Tensor msort() const;
  Tensor diff(int64_t n = 1, int64_t dim = -1, const Tensor& prepend = {},
              const Tensor& append = {}) const;
  Tensor rot90(int64_t k = 1, const std::vector<int64_t>& dims = {0, 1}) const;
  Tensor hypot(const Tensor& other) const;
  Tensor heaviside(const Tensor& values) const;
  Tensor copysign(const Tensor& other) const;
  Tensor copysign(const Scalar& other) const;
  Tensor fmax(const Tensor& other) const;
  Tensor fmin(const Tensor& other) const;
  Tensor float_power(const Tensor& exponent) const;
  Tensor float_power(const Scalar& exponent) const;
  Tensor true_divide(const Tensor& other) const;
  Tensor true_divide(const Scalar& other) const;
  std::tuple<Tensor, Tensor> aminmax(std::optional<int64_t> dim = std::nullopt,
                                     bool keepdim = false) const;
  Tensor dist(const Tensor& other, const Scalar& p = 2) const;
  Tensor renorm(const Scalar& p, int64_t dim, const Scalar& maxnorm) const;
  Tensor quantile(double q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                  std::string_view interpolation = "linear") const;
  Tensor nanquantile(double q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                     std::string_view interpolation = "linear") const;
  Tensor histc(int64_t bins = 100, const Scalar& min = 0, const Scalar& max = 0) const;
  Tensor bincount(const Tensor& weights = {}, int64_t minlength = 0) const;
  Tensor cov(int64_t correction = 1, const Tensor& fweights = {},
             const Tensor& aweights = {}) const;
  Tensor corrcoef() const;
  Tensor flip(const std::vector<int64_t>& dims) const;
  Tensor roll(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {}) const;
  Tensor repeat(const std::vector<int64_t>& repeats) const;
  Tensor tile(const std::vector<int64_t>& dims) const;
  Tensor repeat_interleave(int64_t repeats, std::optional<int64_t> dim = std::nullopt) const;
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;
  Tensor diag(int64_t k = 0) const;
  Tensor trace() const;
  // Matrix functions (kiln/ops.h).
  Tensor inverse() const;
  Tensor det() const;
  Tensor logdet() const;
  std::tuple<Tensor, Tensor> slogdet() const;
  Tensor cholesky(bool upper = false) const;
  Tensor cholesky_solve(const Tensor& L, bool upper = false) const;
  Tensor matrix_power(int64_t n) const;
  Tensor nansum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor nanmean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  template <typename I, detail::if_dim<I> = 0>
  Tensor nansum(I dim, bool keepdim = false) const {
    return nansum(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  template <typename I, detail::if_dim<I> = 0>
  Tensor nanmean(I dim, bool keepdim = false) const {
    return nanmean(Shape{static_cast<int64_t>(dim)}, keepdim);
  }
  Tensor median() const;
  std::tuple<Tensor, Tensor> median(int64_t dim, bool keepdim = false) const;
  Tensor nanmedian() const;
  std::tuple<Tensor, Tensor> nanmedian(int64_t dim, bool keepdim = false) const;
  std::tuple<Tensor, Tensor> kthvalue(int64_t k, int64_t dim = -1, bool keepdim = false) const;
  Tensor logit(std::optional<double> eps = std::nullopt) const;
  Tensor deg2rad() const;
  Tensor rad2deg() const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;

  Tensor matmul(const Tensor& other) const;
  Tensor mm(const Tensor& other) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

// Printed like torch: tensor([[1.0000, 2.0000], ...], dtype=float64).
std::ostream& operator<<(std::ostream& os, const Tensor& t);

Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator/(const Tensor& a, const Scalar& b);
Tensor operator+(const Scalar& a, const Tensor& b);
Tensor operator-(const Scalar& a, const Tensor& b);
Tensor operator*(const Scalar& a, const Tensor& b);
Tensor operator/(const Scalar& a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Scalar& b);
Tensor& operator-=(Tensor& a, const Scalar& b);
Tensor& operator*=(Tensor& a, const Scalar& b);
Tensor& operator/=(Tensor& a, const Scalar& b);

// Comparisons give bool tensors, as libtorch's (not a bool: use equal() or allclose() for that).
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, const Scalar& b);
Tensor operator!=(const Tensor& a, const Scalar& b);
Tensor operator<(const Tensor& a, const Scalar& b);
Tensor operator<=(const Tensor& a, const Scalar& b);
Tensor operator>(const Tensor& a, const Scalar& b);
Tensor operator>=(const Tensor& a, const Scalar& b);
Tensor operator==(const Scalar& a, const Tensor& b);
Tensor operator!=(const Scalar& a, const Tensor& b);
Tensor operator<(const Scalar& a, const Tensor& b);
Tensor operator<=(const Scalar& a, const Tensor& b);
Tensor operator>(const Scalar& a, const Tensor& b);
Tensor operator>=(const Scalar& a, const Tensor& b);
// Bitwise, on bool and integer tensors only (floating-point operands raise, as torch).
Tensor operator&(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Tensor& b);
Tensor operator^(const Tensor& a, const Tensor& b);
Tensor operator&(const Tensor& a, const Scalar& b);
Tensor operator|(const Tensor& a, const Scalar& b);
Tensor operator^(const Tensor& a, const Scalar& b);
Tensor operator&(const Scalar& a, const Tensor& b);
Tensor operator|(const Scalar& a, const Tensor& b);
Tensor operator^(const Scalar& a, const Tensor& b);
Tensor operator~(const Tensor& a);

// libtorch's tensor indices: `using namespace kiln::indexing;` then
// x.index({Slice(1, None, 2), 0, Ellipsis, None, mask, index_tensor}).
namespace indexing {
constexpr std::nullopt_t None = std::nullopt;
struct EllipsisIndexType {
  constexpr EllipsisIndexType() = default;
};
constexpr EllipsisIndexType Ellipsis{};

// start:stop:step; an absent bound means the whole dim from that end, an absent step 1.
struct Slice {
  Slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
        std::optional<int64_t> step = std::nullopt)
      : start(start), stop(stop), step(step.value_or(1)) {}
  std::optional<int64_t> start, stop;
  int64_t step;
};

class TensorIndex {
 public:
  enum class Kind { None, Ellipsis, Integer, Boolean, Slice, Tensor };
  TensorIndex(std::nullopt_t) : kind_(Kind::None) {}
  TensorIndex(EllipsisIndexType) : kind_(Kind::Ellipsis) {}
  TensorIndex(const char* text);  // "..." only, as libtorch's
  TensorIndex(int64_t i) : kind_(Kind::Integer), integer_(i) {}
  TensorIndex(int i) : TensorIndex(static_cast<int64_t>(i)) {}
  // Exactly bool (a template, as libtorch's): pointers and other types don't convert to it.
  template <typename B, std::enable_if_t<std::is_same_v<B, bool>, int> = 0>
  TensorIndex(B b) : kind_(Kind::Boolean), boolean_(b) {}
  TensorIndex(Slice s) : kind_(Kind::Slice), slice_(s) {}
  TensorIndex(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}

  Kind kind() const { return kind_; }
  int64_t integer() const { return integer_; }
  bool boolean() const { return boolean_; }
  const Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }

 private:
  Kind kind_;
  int64_t integer_ = 0;
  bool boolean_ = false;
  Slice slice_;
  Tensor tensor_;
};
}  // namespace indexing

}  // namespace kiln
