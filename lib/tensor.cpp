// Tensor's metadata, data access, conversions and copies; its op methods forward to kiln/ops.h.
#include <cmath>
#include <functional>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/dispatch.h"
#include "lib/elementwise.h"
#include "lib/loops.h"
#include "lib/op_registry.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {
const detail::TensorImpl& impl_of(const Tensor& t, const char* what) {
  KILN_CHECK(t.defined(), what, ": called on an undefined tensor");
  return *t.impl();
}
}  // namespace

const Shape& Tensor::sizes() const {
  return impl_of(*this, "sizes").sizes;
}
const Shape& Tensor::strides() const {
  return impl_of(*this, "strides").strides;
}
int64_t Tensor::size(int64_t d) const {
  return sizes()[detail::wrap_dim(d, dim(), "size", this)];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[detail::wrap_dim(d, dim(), "stride", this)];
}
int64_t Tensor::dim() const {
  return static_cast<int64_t>(sizes().size());
}
int64_t Tensor::numel() const {
  return impl_of(*this, "numel").numel();
}
DType Tensor::dtype() const {
  return impl_of(*this, "dtype").dtype;
}
Device Tensor::device() const {
  return impl_of(*this, "device").device();
}
int64_t Tensor::storage_offset() const {
  return impl_of(*this, "storage_offset").offset;
}
bool Tensor::is_contiguous() const {
  return detail::is_contiguous_layout(sizes(), impl_of(*this, "is_contiguous").strides);
}
void* Tensor::raw_data_ptr() const {
  KILN_CHECK(defined(), "data_ptr: called on an undefined tensor");
  detail::MaterializeCause cause("data_ptr()");
  void* p = impl_->data();
  detail::synchronize_device(*this);  // the device pointer's data is complete when handed out
  return p;
}

// The mutable accessor may be written through: pending work that reads this storage runs first.
template <typename T>
T* Tensor::data_ptr() {
  KILN_CHECK(dtype() == dtype_of<T>, "data_ptr: requested ", dtype_of<T>, " data from a tensor of ",
             describe(*this));
  detail::MaterializeCause cause("data_ptr()");
  detail::prepare_write(*this);
  T* p = reinterpret_cast<T*>(impl_->data());
  detail::synchronize_device(*this);
  return p;
}
template <typename T>
const T* Tensor::data_ptr() const {
  KILN_CHECK(dtype() == dtype_of<T>, "data_ptr: requested ", dtype_of<T>, " data from a tensor of ",
             describe(*this));
  detail::MaterializeCause cause("data_ptr()");
  const T* p = reinterpret_cast<const T*>(impl_->data());
  detail::synchronize_device(*this);
  return p;
}

Scalar Tensor::item() const {
  KILN_CHECK(numel() == 1, "item: a tensor with ", numel(), " elements cannot be converted to a ",
             "scalar (", describe(*this), ")");
  if (device().is_cuda()) return to(kCPU).item();
  detail::MaterializeCause cause("item()");
  return detail::dispatch_all(dtype(), [&](auto tag) -> Scalar {
    using T = KILN_TYPE(tag);
    return Scalar(*reinterpret_cast<const T*>(impl_->data()));
  });
}
template <typename T>
T Tensor::item() const {
  return item().to<T>();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  detail::MaterializeCause cause("to_vector()");
  const Tensor c = to(kCPU).to(dtype_of<T>).contiguous();
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}
template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  detail::MaterializeCause cause("to_vector()");
  const Tensor c = to(kCPU).to(kBool).contiguous();
  const bool* p = c.data_ptr<bool>();
  return std::vector<bool>(p, p + c.numel());
}

#define KILN_INSTANTIATE_ACCESSORS(T)            \
  template T* Tensor::data_ptr<T>();             \
  template const T* Tensor::data_ptr<T>() const; \
  template T Tensor::item<T>() const;
KILN_INSTANTIATE_ACCESSORS(bool)
KILN_INSTANTIATE_ACCESSORS(int32_t)
KILN_INSTANTIATE_ACCESSORS(int64_t)
KILN_INSTANTIATE_ACCESSORS(float)
KILN_INSTANTIATE_ACCESSORS(double)
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;

namespace detail {
// dst[i] = src[i] converted, src broadcast to dst's shape. The caller handles overlap.
void copy_kernel(const Tensor& dst, const Tensor& src) {
  if (!dst.device().is_cpu() || !src.device().is_cpu()) {
    // A copy on or to a device, run eagerly (a trace's write-back, the evaluator's GEMM operands):
    // within a device when the layouts allow a plain copy, else through the host.
    if (dst.device() == src.device() && dst.dtype() == src.dtype() && dst.sizes() == src.sizes() &&
        dst.is_contiguous() && src.is_contiguous()) {
      const size_t n = static_cast<size_t>(dst.numel()) * element_size(dst.dtype());
      cuda::copy_on_device(dst.device().index, dst.impl()->data(), src.impl()->data(), n);
      return;
    }
    const auto device_copy = device_kernels().copy;
    if (dst.device() == src.device() && device_copy && device_copy(dst, src)) return;
    copy_into(dst, src.device().is_cpu() ? src : copy_to_device(src, kCPU));
    return;
  }
  dispatch_all(dst.dtype(), [&](auto dtag) {
    using D = KILN_TYPE(dtag);
    dispatch_all(src.dtype(), [&](auto stag) {
      using S = KILN_TYPE(stag);
      if constexpr (std::is_same_v<D, bool>) {
        map_kernel<D, S>([](S v) { return v != S(0); }, dst, src);
      } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
        // NaN and out-of-range values are undefined behaviour in C++; pin them like x86 does.
        map_kernel<D, S>([](S v) { return float_to_int<D>(v); }, dst, src);
      } else {
        map_kernel<D, S>([](S v) { return static_cast<D>(v); }, dst, src);
      }
    });
  });
}
}  // namespace detail

namespace {
detail::OpHandle to_def;
detail::OpHandle to_device_def;
detail::OpHandle clone_def;
}  // namespace

// The entries of the Tensor methods that are ops: to (a dtype), to_device, clone.
void registration::register_tensor_ops() {
  to_def.bind(
      detail::register_op({"to",
                           detail::OpKind::Unary,
                           1,
                           detail::DTypeRule::Custom,
                           true,
                           [](const std::vector<Tensor>& in, const detail::Attrs& a) {
                             return std::vector<Tensor>{in[0].to(detail::attr_dtype(a.at(0)))};
                           },
                           {"dtype"},
                           [](const Tensor& out, const Tensor* in, const detail::Attrs&) {
                             detail::copy_kernel(out, in[0]);
                           },
                           // As static_cast: to bool is != 0; float to integer truncates, and
                           // gives the lowest integer where it doesn't fit (x86's behaviour).
                           "(cast x)"}));
  // A copy to another device. Eager calls copy at once (lib/cuda_tensor.h); inside jit::trace the
  // copy is a node, so that a replay repeats it and the transfer passes can see it.
  to_device_def.bind(
      detail::register_op({"to_device",
                           detail::OpKind::Transfer,
                           1,
                           detail::DTypeRule::Same,
                           true,
                           [](const std::vector<Tensor>& in, const detail::Attrs& a) {
                             return std::vector<Tensor>{detail::copy_to_device(
                                 in[0], Device::parse(detail::attr_string(a.at(0))))};
                           },
                           {"device"}}));
  clone_def.bind(
      detail::register_op({"clone",
                           detail::OpKind::Unary,
                           1,
                           detail::DTypeRule::Same,
                           true,
                           [](const std::vector<Tensor>& in, const detail::Attrs&) {
                             return std::vector<Tensor>{in[0].clone()};
                           },
                           {},
                           nullptr,
                           "x"}));  // in a fused kernel, the value written to a new output
}

Tensor Tensor::to(DType dtype) const {
  detail::check_defined(*this, "to");
  if (dtype == this->dtype()) return *this;
  Tensor out;
  if (detail::should_record(*this)) {
    out = detail::lazy_record1(to_def, {*this}, {dtype}, {sizes(), dtype});
  } else {
    out = detail::make_empty_on(sizes(), dtype, device());
    detail::copy_kernel(out, *this);
  }
  if (detail::needs_grad(*this))
    detail::record("to", {*this}, {out}, {},
                   [from = this->dtype()](const detail::BackwardContext& c) {
                     return std::vector<Tensor>{c.grad().to(from)};
                   });
  return out;
}

Tensor Tensor::to(Device device) const {
  detail::check_defined(*this, "to");
  if (device == this->device()) return *this;
  Tensor out =
      detail::should_record(*this) && detail::trace_mode()
          ? detail::lazy_record1(to_device_def, {*this}, {device.str()}, {sizes(), dtype(), device})
          : detail::copy_to_device(*this, device);
  if (detail::needs_grad(*this))
    detail::record("to", {*this}, {out}, {},
                   [from = this->device()](const detail::BackwardContext& c) {
                     return std::vector<Tensor>{c.grad().to(from)};
                   });
  return out;
}

Tensor Tensor::contiguous() const {
  detail::check_defined(*this, "contiguous");
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  detail::check_defined(*this, "clone");
  Tensor out;
  if (detail::should_record(*this)) {
    out = detail::lazy_record1(clone_def, {*this}, {}, {sizes(), dtype()});
  } else {
    out = detail::make_empty_on(sizes(), dtype(), device());
    detail::copy_kernel(out, *this);
  }
  if (detail::needs_grad(*this))
    detail::record("clone", {*this}, {out}, {},
                   [](const detail::BackwardContext& c) { return std::vector<Tensor>{c.grad()}; });
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  detail::check_defined(*this, "copy_", "self");
  detail::check_defined(src, "copy_", "src");
  Shape b = detail::broadcast_shapes(sizes(), src.sizes(), "copy_");
  KILN_CHECK(b == sizes(), "copy_: source ", describe(src), " cannot be broadcast to destination ",
             describe(*this));
  detail::apply_inplace(
      *this, "copy_", {&src}, false,
      [&] {
        detail::copy_kernel(*this, detail::may_overlap(*this, src) ? src.clone() : src);
        detail::bump_version(*this);
      },
      [&](const Tensor&) { return src.to(dtype()).expand(sizes()); });
  return *this;
}

Tensor& Tensor::zero_() {
  return fill_(0);
}

Tensor& Tensor::fill_(const Scalar& value) {
  detail::check_defined(*this, "fill_");
  detail::check_value_fits("fill_", value, dtype(), *this);
  detail::apply_inplace(
      *this, "fill_", {}, false,
      [&] {
        detail::copy_kernel(*this, detail::wrap_scalar(value));
        detail::bump_version(*this);
      },
      [&](const Tensor&) { return full(sizes(), value, dtype()); });
  return *this;
}

// --- method forwards
Tensor Tensor::add(const Tensor& o, const Scalar& alpha) const {
  return kiln::add(*this, o, alpha);
}
Tensor Tensor::sub(const Tensor& o, const Scalar& alpha) const {
  return kiln::sub(*this, o, alpha);
}
Tensor Tensor::add(const Scalar& o) const {
  return kiln::add(*this, o);
}
Tensor Tensor::sub(const Scalar& o) const {
  return kiln::sub(*this, o);
}
Tensor Tensor::mul(const Scalar& o) const {
  return kiln::mul(*this, o);
}
Tensor Tensor::div(const Scalar& o) const {
  return kiln::div(*this, o);
}
Tensor Tensor::mul(const Tensor& o) const {
  return kiln::mul(*this, o);
}
Tensor Tensor::div(const Tensor& o) const {
  return kiln::div(*this, o);
}
Tensor Tensor::div(const Tensor& o, std::optional<std::string_view> rounding_mode) const {
  return kiln::div(*this, o, rounding_mode);
}
Tensor Tensor::div(const Scalar& o, std::optional<std::string_view> rounding_mode) const {
  return kiln::div(*this, o, rounding_mode);
}
Tensor Tensor::pow(const Tensor& e) const {
  return kiln::pow(*this, e);
}
Tensor Tensor::pow(const Scalar& e) const {
  return kiln::pow(*this, e);
}
Tensor Tensor::neg() const {
  return kiln::neg(*this);
}
Tensor Tensor::abs() const {
  return kiln::abs(*this);
}
Tensor Tensor::exp() const {
  return kiln::exp(*this);
}
Tensor Tensor::log() const {
  return kiln::log(*this);
}
Tensor Tensor::sqrt() const {
  return kiln::sqrt(*this);
}
Tensor Tensor::tanh() const {
  return kiln::tanh(*this);
}
Tensor Tensor::sigmoid() const {
  return kiln::sigmoid(*this);
}
Tensor Tensor::relu() const {
  return kiln::relu(*this);
}
Tensor Tensor::clamp(std::optional<Scalar> min, std::optional<Scalar> max) const {
  return kiln::clamp(*this, min, max);
}
Tensor Tensor::eq(const Tensor& o) const {
  return kiln::eq(*this, o);
}
Tensor Tensor::ne(const Tensor& o) const {
  return kiln::ne(*this, o);
}
Tensor Tensor::lt(const Tensor& o) const {
  return kiln::lt(*this, o);
}
Tensor Tensor::le(const Tensor& o) const {
  return kiln::le(*this, o);
}
Tensor Tensor::gt(const Tensor& o) const {
  return kiln::gt(*this, o);
}
Tensor Tensor::ge(const Tensor& o) const {
  return kiln::ge(*this, o);
}
Tensor Tensor::sum(std::optional<DType> dtype) const {
  return kiln::sum(*this, {}, false, dtype);
}
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim,
                   std::optional<DType> dtype) const {
  return kiln::sum(*this, dims, keepdim, dtype);
}
Tensor Tensor::mean() const {
  return kiln::mean(*this);
}
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::mean(*this, dims, keepdim);
}
Tensor Tensor::prod() const {
  return kiln::prod(*this);
}
Tensor Tensor::prod(int64_t dim, bool keepdim) const {
  return kiln::prod(*this, {dim}, keepdim);
}
Tensor Tensor::max() const {
  return kiln::max(*this);
}
std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const {
  return kiln::max(*this, dim, keepdim);
}
Tensor Tensor::min() const {
  return kiln::min(*this);
}
std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const {
  return kiln::min(*this, dim, keepdim);
}
Tensor Tensor::amax(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::amax(*this, dims, keepdim);
}
Tensor Tensor::amin(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::amin(*this, dims, keepdim);
}
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const {
  return kiln::argmax(*this, dim, keepdim);
}
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim) const {
  return kiln::argmin(*this, dim, keepdim);
}
Tensor Tensor::var(const std::vector<int64_t>& dims, int64_t correction, bool keepdim) const {
  return kiln::var(*this, dims, correction, keepdim);
}
Tensor Tensor::std(const std::vector<int64_t>& dims, int64_t correction, bool keepdim) const {
  return kiln::std(*this, dims, correction, keepdim);
}
Tensor Tensor::logsumexp(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::logsumexp(*this, dims, keepdim);
}
Tensor Tensor::all() const {
  return kiln::all(*this);
}
Tensor Tensor::any() const {
  return kiln::any(*this);
}
Tensor Tensor::matmul(const Tensor& o) const {
  return kiln::matmul(*this, o);
}
Tensor Tensor::mm(const Tensor& o) const {
  return kiln::mm(*this, o);
}
Tensor Tensor::softmax(int64_t dim) const {
  return kiln::softmax(*this, dim);
}
Tensor Tensor::log_softmax(int64_t dim) const {
  return kiln::log_softmax(*this, dim);
}

// --- operators
Tensor operator-(const Tensor& a) {
  return neg(a);
}
Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator+(const Tensor& a, const Scalar& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Scalar& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Scalar& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Scalar& b) {
  return div(a, b);
}
Tensor operator+(const Scalar& a, const Tensor& b) {
  return add(detail::wrap_scalar(a), b);
}
Tensor operator-(const Scalar& a, const Tensor& b) {
  return sub(detail::wrap_scalar(a), b);
}
Tensor operator*(const Scalar& a, const Tensor& b) {
  return mul(detail::wrap_scalar(a), b);
}
Tensor operator/(const Scalar& a, const Tensor& b) {
  return div(detail::wrap_scalar(a), b);
}
Tensor& operator+=(Tensor& a, const Tensor& b) {
  return a.add_(b);
}
Tensor& operator-=(Tensor& a, const Tensor& b) {
  return a.sub_(b);
}
Tensor& operator*=(Tensor& a, const Tensor& b) {
  return a.mul_(b);
}
Tensor& operator/=(Tensor& a, const Tensor& b) {
  return a.div_(b);
}
Tensor& operator+=(Tensor& a, const Scalar& b) {
  return a.add_(b);
}
Tensor& operator-=(Tensor& a, const Scalar& b) {
  return a.sub_(b);
}
Tensor& operator*=(Tensor& a, const Scalar& b) {
  return a.mul_(b);
}
Tensor& operator/=(Tensor& a, const Scalar& b) {
  return a.div_(b);
}

}  // namespace kiln

// --- more method forwards
namespace kiln {

std::ostream& operator<<(std::ostream& os, const Shape& shape) {
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  return os << ']';
}

Tensor Tensor::norm(const Scalar& p) const {
  return kiln::norm(*this, p);
}
Tensor Tensor::norm(const Scalar& p, const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::norm(*this, p, dims, keepdim);
}
Tensor Tensor::all(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::all(*this, dims, keepdim);
}
Tensor Tensor::any(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::any(*this, dims, keepdim);
}

#define KILN_UNARY_METHOD(NAME) \
  Tensor Tensor::NAME() const { \
    return kiln::NAME(*this);   \
  }
KILN_UNARY_METHOD(sign)
KILN_UNARY_METHOD(log1p)
KILN_UNARY_METHOD(log2)
KILN_UNARY_METHOD(log10)
KILN_UNARY_METHOD(sinc)
KILN_UNARY_METHOD(exp2)
KILN_UNARY_METHOD(expm1)
KILN_UNARY_METHOD(rsqrt)
KILN_UNARY_METHOD(reciprocal)
KILN_UNARY_METHOD(sin)
KILN_UNARY_METHOD(cos)
KILN_UNARY_METHOD(tan)
KILN_UNARY_METHOD(atan)
KILN_UNARY_METHOD(asin)
KILN_UNARY_METHOD(acos)
KILN_UNARY_METHOD(sinh)
KILN_UNARY_METHOD(cosh)
KILN_UNARY_METHOD(asinh)
KILN_UNARY_METHOD(acosh)
KILN_UNARY_METHOD(atanh)
KILN_UNARY_METHOD(erf)
KILN_UNARY_METHOD(erfc)
KILN_UNARY_METHOD(erfinv)
KILN_UNARY_METHOD(lgamma)
KILN_UNARY_METHOD(digamma)
KILN_UNARY_METHOD(floor)
KILN_UNARY_METHOD(ceil)
KILN_UNARY_METHOD(round)
KILN_UNARY_METHOD(trunc)
KILN_UNARY_METHOD(fix)
KILN_UNARY_METHOD(signbit)
KILN_UNARY_METHOD(frac)
KILN_UNARY_METHOD(square)
KILN_UNARY_METHOD(logical_not)
KILN_UNARY_METHOD(isnan)
KILN_UNARY_METHOD(isfinite)
KILN_UNARY_METHOD(isinf)
KILN_UNARY_METHOD(isposinf)
KILN_UNARY_METHOD(isneginf)
KILN_UNARY_METHOD(sgn)
KILN_UNARY_METHOD(bitwise_not)
KILN_UNARY_METHOD(nonzero)
#undef KILN_UNARY_METHOD

#define KILN_BINARY_METHOD(NAME, OTHER)       \
  Tensor Tensor::NAME(const OTHER& o) const { \
    return kiln::NAME(*this, o);              \
  }
KILN_BINARY_METHOD(remainder, Tensor)
KILN_BINARY_METHOD(remainder, Scalar)
KILN_BINARY_METHOD(fmod, Tensor)
KILN_BINARY_METHOD(fmod, Scalar)
KILN_BINARY_METHOD(floor_divide, Tensor)
KILN_BINARY_METHOD(floor_divide, Scalar)
KILN_BINARY_METHOD(minimum, Tensor)
KILN_BINARY_METHOD(maximum, Tensor)
KILN_BINARY_METHOD(atan2, Tensor)
KILN_BINARY_METHOD(clamp_min, Scalar)
KILN_BINARY_METHOD(clamp_min, Tensor)
KILN_BINARY_METHOD(clamp_max, Scalar)
KILN_BINARY_METHOD(clamp_max, Tensor)
KILN_BINARY_METHOD(eq, Scalar)
KILN_BINARY_METHOD(ne, Scalar)
KILN_BINARY_METHOD(lt, Scalar)
KILN_BINARY_METHOD(le, Scalar)
KILN_BINARY_METHOD(gt, Scalar)
KILN_BINARY_METHOD(ge, Scalar)
KILN_BINARY_METHOD(logical_and, Tensor)
KILN_BINARY_METHOD(logical_or, Tensor)
KILN_BINARY_METHOD(logical_xor, Tensor)
KILN_BINARY_METHOD(xlogy, Tensor)
KILN_BINARY_METHOD(xlogy, Scalar)
KILN_BINARY_METHOD(bitwise_and, Tensor)
KILN_BINARY_METHOD(bitwise_or, Tensor)
KILN_BINARY_METHOD(bitwise_xor, Tensor)
KILN_BINARY_METHOD(bmm, Tensor)
KILN_BINARY_METHOD(masked_select, Tensor)
KILN_BINARY_METHOD(flip, std::vector<int64_t>)
KILN_BINARY_METHOD(repeat, std::vector<int64_t>)
#undef KILN_BINARY_METHOD

Tensor Tensor::where(const Tensor& condition, const Tensor& other) const {
  return kiln::where(condition, *this, other);
}
Tensor Tensor::clip(std::optional<Scalar> min, std::optional<Scalar> max) const {
  return kiln::clip(*this, min, max);
}
Tensor Tensor::clip(const Tensor& min, const Tensor& max) const {
  return kiln::clip(*this, min, max);
}
Tensor Tensor::nan_to_num(std::optional<double> nan, std::optional<double> posinf,
                          std::optional<double> neginf) const {
  return kiln::nan_to_num(*this, nan, posinf, neginf);
}
Tensor Tensor::clamp(const Tensor& min, const Tensor& max) const {
  return kiln::clamp(*this, min, max);
}
Tensor Tensor::clamp(std::nullopt_t, const Tensor& max) const {
  return kiln::clamp(*this, Tensor(), max);
}
Tensor Tensor::lerp(const Tensor& end, const Scalar& weight) const {
  return kiln::lerp(*this, end, weight);
}
Tensor Tensor::lerp(const Tensor& end, const Tensor& weight) const {
  return kiln::lerp(*this, end, weight);
}
Tensor Tensor::addcmul(const Tensor& t1, const Tensor& t2, const Scalar& value) const {
  return kiln::addcmul(*this, t1, t2, value);
}
Tensor Tensor::addcdiv(const Tensor& t1, const Tensor& t2, const Scalar& value) const {
  return kiln::addcdiv(*this, t1, t2, value);
}
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const {
  return kiln::index_select(*this, dim, index);
}
Tensor Tensor::gather(int64_t dim, const Tensor& index) const {
  return kiln::gather(*this, dim, index);
}
Tensor Tensor::index_add(int64_t dim, const Tensor& index, const Tensor& source) const {
  return kiln::index_add(*this, dim, index, source);
}
Tensor Tensor::scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const {
  return kiln::scatter_add(*this, dim, index, src);
}
Tensor Tensor::scatter(int64_t dim, const Tensor& index, const Tensor& src) const {
  return kiln::scatter(*this, dim, index, src);
}
Tensor Tensor::scatter(int64_t dim, const Tensor& index, const Scalar& value) const {
  return kiln::scatter(*this, dim, index, value);
}
Tensor Tensor::scatter_reduce(int64_t dim, const Tensor& index, const Tensor& src,
                              const std::string& reduce, bool include_self) const {
  return kiln::scatter_reduce(*this, dim, index, src, reduce, include_self);
}
Tensor Tensor::index_copy(int64_t dim, const Tensor& index, const Tensor& source) const {
  return kiln::index_copy(*this, dim, index, source);
}
Tensor Tensor::index_fill(int64_t dim, const Tensor& index, const Scalar& value) const {
  return kiln::index_fill(*this, dim, index, value);
}
Tensor Tensor::index_fill(int64_t dim, const Tensor& index, const Tensor& value) const {
  return kiln::index_fill(*this, dim, index, value);
}
Tensor Tensor::masked_scatter(const Tensor& mask, const Tensor& source) const {
  return kiln::masked_scatter(*this, mask, source);
}
Tensor Tensor::take(const Tensor& index) const {
  return kiln::take(*this, index);
}

namespace {
// self becomes f(self) (see detail::apply_inplace); `others` are the operands that may need a
// gradient, and saves_self says whether f's gradient reads self's old value.
Tensor& write_in_place(Tensor& self, const char* op, std::initializer_list<const Tensor*> others,
                       bool saves_self, const std::function<Tensor(const Tensor&)>& f) {
  detail::apply_inplace(
      self, op, others, saves_self, [&] { self.copy_(f(self)); }, f);
  return self;
}
}  // namespace

Tensor& Tensor::index_add_(int64_t dim, const Tensor& index, const Tensor& source) {
  return write_in_place(*this, "index_add_", {&source}, false, [&](const Tensor& self) {
    return kiln::index_add(self, dim, index, source);
  });
}
Tensor& Tensor::scatter_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  return write_in_place(*this, "scatter_add_", {&src}, false, [&](const Tensor& self) {
    return kiln::scatter_add(self, dim, index, src);
  });
}
Tensor& Tensor::scatter_(int64_t dim, const Tensor& index, const Tensor& src) {
  return write_in_place(*this, "scatter_", {&src}, false,
                        [&](const Tensor& self) { return kiln::scatter(self, dim, index, src); });
}
Tensor& Tensor::scatter_(int64_t dim, const Tensor& index, const Scalar& value) {
  return write_in_place(*this, "scatter_", {}, false,
                        [&](const Tensor& self) { return kiln::scatter(self, dim, index, value); });
}
Tensor& Tensor::scatter_reduce_(int64_t dim, const Tensor& index, const Tensor& src,
                                const std::string& reduce, bool include_self) {
  return write_in_place(*this, "scatter_reduce_", {&src}, true, [&](const Tensor& self) {
    return kiln::scatter_reduce(self, dim, index, src, reduce, include_self);
  });
}
Tensor& Tensor::index_copy_(int64_t dim, const Tensor& index, const Tensor& source) {
  return write_in_place(*this, "index_copy_", {&source}, false, [&](const Tensor& self) {
    return kiln::index_copy(self, dim, index, source);
  });
}
Tensor& Tensor::index_fill_(int64_t dim, const Tensor& index, const Scalar& value) {
  return write_in_place(*this, "index_fill_", {}, false, [&](const Tensor& self) {
    return kiln::index_fill(self, dim, index, value);
  });
}
Tensor& Tensor::index_fill_(int64_t dim, const Tensor& index, const Tensor& value) {
  return write_in_place(*this, "index_fill_", {&value}, false, [&](const Tensor& self) {
    return kiln::index_fill(self, dim, index, value);
  });
}
Tensor& Tensor::masked_scatter_(const Tensor& mask, const Tensor& source) {
  return write_in_place(*this, "masked_scatter_", {&source}, false, [&](const Tensor& self) {
    return kiln::masked_scatter(self, mask, source);
  });
}

Tensor Tensor::slice_scatter(const Tensor& src, int64_t dim, std::optional<int64_t> start,
                             std::optional<int64_t> end, int64_t step) const {
  return kiln::slice_scatter(*this, src, dim, start, end, step);
}
Tensor Tensor::as_strided(const Shape& sizes, const Shape& strides,
                          std::optional<int64_t> storage_offset) const {
  return kiln::as_strided(*this, sizes, strides, storage_offset);
}
Tensor Tensor::sum_to_size(const Shape& shape) const {
  return kiln::sum_to_size(*this, shape);
}
Tensor Tensor::addmm(const Tensor& mat1, const Tensor& mat2, const Scalar& beta,
                     const Scalar& alpha) const {
  return kiln::addmm(*this, mat1, mat2, beta, alpha);
}
Tensor Tensor::masked_fill(const Tensor& mask, const Scalar& value) const {
  return kiln::masked_fill(*this, mask, value);
}
Tensor Tensor::masked_fill(const Tensor& mask, const Tensor& value) const {
  return kiln::masked_fill(*this, mask, value);
}
Tensor& Tensor::masked_fill_(const Tensor& mask, const Scalar& value) {
  return copy_(kiln::masked_fill(*this, mask, value));
}
Tensor& Tensor::masked_fill_(const Tensor& mask, const Tensor& value) {
  return copy_(kiln::masked_fill(*this, mask, value));
}
std::tuple<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
  return kiln::topk(*this, k, dim, largest, sorted);
}
std::tuple<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending) const {
  return kiln::sort(*this, dim, descending);
}
Tensor Tensor::argsort(int64_t dim, bool descending) const {
  return kiln::argsort(*this, dim, descending);
}
Tensor Tensor::cumsum(int64_t dim, std::optional<DType> dtype) const {
  return kiln::cumsum(*this, dim, dtype);
}
Tensor Tensor::cumprod(int64_t dim, std::optional<DType> dtype) const {
  return kiln::cumprod(*this, dim, dtype);
}
std::tuple<Tensor, Tensor> Tensor::cummax(int64_t dim) const {
  return kiln::cummax(*this, dim);
}
std::tuple<Tensor, Tensor> Tensor::cummin(int64_t dim) const {
  return kiln::cummin(*this, dim);
}
Tensor Tensor::logcumsumexp(int64_t dim) const {
  return kiln::logcumsumexp(*this, dim);
}
Tensor Tensor::msort() const {
  return kiln::msort(*this);
}
Tensor Tensor::diff(int64_t n, int64_t dim, const Tensor& prepend, const Tensor& append) const {
  return kiln::diff(*this, n, dim, prepend, append);
}
Tensor Tensor::rot90(int64_t k, const std::vector<int64_t>& dims) const {
  return kiln::rot90(*this, k, dims);
}
Tensor Tensor::hypot(const Tensor& other) const {
  return kiln::hypot(*this, other);
}
Tensor Tensor::heaviside(const Tensor& values) const {
  return kiln::heaviside(*this, values);
}
Tensor Tensor::quantile(double q, std::optional<int64_t> dim, bool keepdim,
                        std::string_view interpolation) const {
  return kiln::quantile(*this, q, dim, keepdim, interpolation);
}
Tensor Tensor::nanquantile(double q, std::optional<int64_t> dim, bool keepdim,
                           std::string_view interpolation) const {
  return kiln::nanquantile(*this, q, dim, keepdim, interpolation);
}
Tensor Tensor::histc(int64_t bins, const Scalar& min, const Scalar& max) const {
  return kiln::histc(*this, bins, min, max);
}
Tensor Tensor::bincount(const Tensor& weights, int64_t minlength) const {
  return kiln::bincount(*this, weights, minlength);
}
Tensor Tensor::cov(int64_t correction, const Tensor& fweights, const Tensor& aweights) const {
  return kiln::cov(*this, correction, fweights, aweights);
}
Tensor Tensor::corrcoef() const {
  return kiln::corrcoef(*this);
}
Tensor Tensor::roll(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) const {
  return kiln::roll(*this, shifts, dims);
}
Tensor Tensor::tile(const std::vector<int64_t>& dims) const {
  return kiln::tile(*this, dims);
}
Tensor Tensor::repeat_interleave(int64_t repeats, std::optional<int64_t> dim) const {
  return kiln::repeat_interleave(*this, repeats, dim);
}
Tensor Tensor::diagonal(int64_t offset, int64_t dim1, int64_t dim2) const {
  return kiln::diagonal(*this, offset, dim1, dim2);
}
Tensor Tensor::diag(int64_t k) const {
  return kiln::diag(*this, k);
}
Tensor Tensor::trace() const {
  return kiln::trace(*this);
}
Tensor Tensor::inverse() const {
  return kiln::inverse(*this);
}
Tensor Tensor::det() const {
  return kiln::det(*this);
}
Tensor Tensor::logdet() const {
  return kiln::logdet(*this);
}
std::tuple<Tensor, Tensor> Tensor::slogdet() const {
  return kiln::slogdet(*this);
}
Tensor Tensor::cholesky(bool upper) const {
  return kiln::cholesky(*this, upper);
}
Tensor Tensor::cholesky_solve(const Tensor& L, bool upper) const {
  return kiln::cholesky_solve(*this, L, upper);
}
Tensor Tensor::matrix_power(int64_t n) const {
  return kiln::linalg::matrix_power(*this, n);
}
Tensor Tensor::nansum(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::nansum(*this, dims, keepdim);
}
Tensor Tensor::nanmean(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::nanmean(*this, dims, keepdim);
}
Tensor Tensor::median() const {
  return kiln::median(*this);
}
std::tuple<Tensor, Tensor> Tensor::median(int64_t dim, bool keepdim) const {
  return kiln::median(*this, dim, keepdim);
}
Tensor Tensor::nanmedian() const {
  return kiln::nanmedian(*this);
}
std::tuple<Tensor, Tensor> Tensor::nanmedian(int64_t dim, bool keepdim) const {
  return kiln::nanmedian(*this, dim, keepdim);
}
std::tuple<Tensor, Tensor> Tensor::kthvalue(int64_t k, int64_t dim, bool keepdim) const {
  return kiln::kthvalue(*this, k, dim, keepdim);
}
Tensor Tensor::logit(std::optional<double> eps) const {
  return kiln::logit(*this, eps);
}
Tensor Tensor::deg2rad() const {
  return kiln::deg2rad(*this);
}
Tensor Tensor::rad2deg() const {
  return kiln::rad2deg(*this);
}
Tensor Tensor::tril(int64_t diagonal) const {
  return kiln::tril(*this, diagonal);
}
Tensor Tensor::triu(int64_t diagonal) const {
  return kiln::triu(*this, diagonal);
}

// --- comparison and bitwise operators
#define KILN_OPERATOR(OP, FN)                            \
  Tensor operator OP(const Tensor& a, const Tensor& b) { \
    return FN(a, b);                                     \
  }                                                      \
  Tensor operator OP(const Tensor& a, const Scalar& b) { \
    return FN(a, b);                                     \
  }                                                      \
  Tensor operator OP(const Scalar& a, const Tensor& b) { \
    return FN(detail::wrap_scalar(a), b);                \
  }
KILN_OPERATOR(==, eq)
KILN_OPERATOR(!=, ne)
KILN_OPERATOR(<, lt)
KILN_OPERATOR(<=, le)
KILN_OPERATOR(>, gt)
KILN_OPERATOR(>=, ge)
KILN_OPERATOR(&, bitwise_and)
KILN_OPERATOR(|, bitwise_or)
KILN_OPERATOR(^, bitwise_xor)
#undef KILN_OPERATOR
Tensor operator~(const Tensor& a) {
  return bitwise_not(a);
}

Tensor Tensor::take_along_dim(const Tensor& indices, std::optional<int64_t> dim) const {
  return kiln::take_along_dim(*this, indices, dim);
}
Tensor Tensor::select_scatter(const Tensor& src, int64_t dim, int64_t index) const {
  return kiln::select_scatter(*this, src, dim, index);
}
Tensor Tensor::diagonal_scatter(const Tensor& src, int64_t offset, int64_t dim1,
                                int64_t dim2) const {
  return kiln::diagonal_scatter(*this, src, offset, dim1, dim2);
}
Tensor Tensor::baddbmm(const Tensor& batch1, const Tensor& batch2, const Scalar& beta,
                       const Scalar& alpha) const {
  return kiln::baddbmm(*this, batch1, batch2, beta, alpha);
}
Tensor Tensor::addbmm(const Tensor& batch1, const Tensor& batch2, const Scalar& beta,
                      const Scalar& alpha) const {
  return kiln::addbmm(*this, batch1, batch2, beta, alpha);
}
Tensor Tensor::addmv(const Tensor& mat, const Tensor& vec, const Scalar& beta,
                     const Scalar& alpha) const {
  return kiln::addmv(*this, mat, vec, beta, alpha);
}
Tensor Tensor::addr(const Tensor& vec1, const Tensor& vec2, const Scalar& beta,
                    const Scalar& alpha) const {
  return kiln::addr(*this, vec1, vec2, beta, alpha);
}
Tensor Tensor::argwhere() const {
  return kiln::argwhere(*this);
}
Tensor Tensor::copysign(const Tensor& other) const {
  return kiln::copysign(*this, other);
}
Tensor Tensor::copysign(const Scalar& other) const {
  return kiln::copysign(*this, other);
}
Tensor Tensor::fmax(const Tensor& other) const {
  return kiln::fmax(*this, other);
}
Tensor Tensor::fmin(const Tensor& other) const {
  return kiln::fmin(*this, other);
}
Tensor Tensor::float_power(const Tensor& exponent) const {
  return kiln::float_power(*this, exponent);
}
Tensor Tensor::float_power(const Scalar& exponent) const {
  return kiln::float_power(*this, exponent);
}
Tensor Tensor::true_divide(const Tensor& other) const {
  return kiln::true_divide(*this, other);
}
Tensor Tensor::true_divide(const Scalar& other) const {
  return kiln::true_divide(*this, other);
}
std::tuple<Tensor, Tensor> Tensor::aminmax(std::optional<int64_t> dim, bool keepdim) const {
  return kiln::aminmax(*this, dim, keepdim);
}
Tensor Tensor::dist(const Tensor& other, const Scalar& p) const {
  return kiln::dist(*this, other, p);
}
Tensor Tensor::renorm(const Scalar& p, int64_t dim, const Scalar& maxnorm) const {
  return kiln::renorm(*this, p, dim, maxnorm);
}
}  // namespace kiln
