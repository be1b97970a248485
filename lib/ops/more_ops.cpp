// Everyday ops that libtorch users expect, most of them compositions of table ops (so that they
// record lazily, fuse and trace, and differentiate through their parts): bitwise ops, lerp,
// addcmul/addcdiv, clamp with tensor bounds, norm, flip, roll, repeat, tril/triu, kiln::tensor
// and einsum (lowered to permutes, sums and one batched GEMM per pair of operands).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/elementwise.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::DTypeRule;
using detail::OpKind;
using detail::shape_str;

// ------------------------------------------------------------------------------------ bitwise ops
namespace {
using Inputs = std::vector<Tensor>;

void check_bitwise(const char* op, const Tensor& t) {
  detail::check_defined(t, op);
  KILN_CHECK(!t.is_floating_point(), op, ": only bool and integer tensors are supported, got ",
             describe(t));
}
}  // namespace

// FORMULA is the same operation on the fuser's bitwise primitives (fuser/kernel.h), so chains of
// these fuse with comparisons, where and arithmetic; floating operands raise before recording.
#define KILN_BITWISE(NAME, EXPR, FORMULA)                                                   \
  static const auto NAME##_fn = [](auto x, auto y) {                                        \
    using T = decltype(x);                                                                  \
    if constexpr (std::is_integral_v<T>)                                                    \
      return T(EXPR);                                                                       \
    else                                                                                    \
      return x; /* unreachable: floating operands raise first */                            \
  };                                                                                        \
  static detail::OpHandle NAME##_def;                                                       \
  static void register_##NAME() {                                                           \
    NAME##_def.bind(detail::register_op(                                                    \
        {#NAME,                                                                             \
         OpKind::Binary,                                                                    \
         2,                                                                                 \
         DTypeRule::Same,                                                                   \
         true,                                                                              \
         [](const Inputs& in, const detail::Attrs&) { return Inputs{NAME(in[0], in[1])}; }, \
         {},                                                                                \
         [](const Tensor& out, const Tensor* in, const detail::Attrs&) {                    \
           detail::binary_into<DTypeRule::Same>(NAME##_def, NAME##_fn, out, in[0], in[1]);  \
         },                                                                                 \
         FORMULA}));                                                                        \
  }                                                                                         \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                           \
    check_bitwise(#NAME, a);                                                                \
    check_bitwise(#NAME, b);                                                                \
    return detail::binary_op<DTypeRule::Same>(NAME##_def, a, b, NAME##_fn);                 \
  }                                                                                         \
  Tensor NAME(const Tensor& a, const Scalar& b) {                                           \
    KILN_CHECK(!b.is_floating_point(), #NAME, ": a floating-point operand ", b,             \
               " is not supported (with ", describe(a), ")");                               \
    return NAME(a, detail::wrap_scalar(b));                                                 \
  }
KILN_BITWISE(bitwise_and, x& y, "(band x y)")
KILN_BITWISE(bitwise_or, x | y, "(bor x y)")
KILN_BITWISE(bitwise_xor, x ^ y, "(bxor x y)")
#undef KILN_BITWISE

void registration::register_bitwise_ops() {
  register_bitwise_and();
  register_bitwise_or();
  register_bitwise_xor();
}

// ~x: logical not on bool, two's complement not on integers.
Tensor bitwise_not(const Tensor& x) {
  check_bitwise("bitwise_not", x);
  if (x.dtype() == kBool) return logical_not(x);
  return bitwise_xor(x, -1);
}

// ------------------------------------------------------------------- compositions of elementwise
Tensor lerp(const Tensor& start, const Tensor& end, const Scalar& weight) {
  return lerp(start, end, detail::wrap_scalar(weight));
}
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  detail::check_defined(start, "lerp", "start");
  detail::check_defined(end, "lerp", "end");
  detail::check_defined(weight, "lerp", "weight");
  KILN_CHECK(start.is_floating_point() && end.is_floating_point(),
             "lerp: expected floating-point start and end, got ", describe(start), " and ",
             describe(end));
  // torch's two forms: from start for |weight| < 0.5, from end otherwise (exact at weight 1).
  const Tensor difference = end - start;
  return where(lt(abs(weight), 0.5), start + weight * difference, end - difference * (1 - weight));
}

Tensor addcmul(const Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value) {
  detail::check_defined(self, "addcmul", "self");
  return self + t1 * t2 * value;
}
Tensor addcdiv(const Tensor& self, const Tensor& t1, const Tensor& t2, const Scalar& value) {
  detail::check_defined(self, "addcdiv", "self");
  detail::check_defined(t1, "addcdiv", "tensor1");
  detail::check_defined(t2, "addcdiv", "tensor2");
  KILN_CHECK(t1.is_floating_point() || t2.is_floating_point(), "addcdiv: integer division of ",
             describe(t1), " by ", describe(t2), " is not supported, as in torch");
  return self + t1 / t2 * value;
}

// The result is x's promoted with the bounds' type, as torch's; a NaN anywhere gives NaN.
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max) {
  detail::check_defined(x, "clamp");
  KILN_CHECK(min.defined() || max.defined(),
             "clamp: at least one of 'min' or 'max' must be given (input ", describe(x), ")");
  Tensor out = x;
  if (min.defined()) out = maximum(out, min);
  if (max.defined()) out = minimum(out, max);
  return out;
}
Tensor clamp(const Tensor& x, std::nullopt_t, const Tensor& max) {
  return clamp(x, Tensor(), max);
}

Tensor clamp_min(const Tensor& x, const Scalar& min) {
  return clamp(x, min, std::nullopt);
}
Tensor clamp_min(const Tensor& x, const Tensor& min) {
  return clamp(x, min, Tensor());
}
Tensor clamp_max(const Tensor& x, const Scalar& max) {
  return clamp(x, std::nullopt, max);
}
Tensor clamp_max(const Tensor& x, const Tensor& max) {
  return clamp(x, std::nullopt, max);
}

Tensor clip(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  return clamp(x, min, max);
}
Tensor clip(const Tensor& x, const Tensor& min, const Tensor& max) {
  return clamp(x, min, max);
}
Tensor sgn(const Tensor& x) {
  return sign(x);
}
// b - alpha a, with sub's dtype rules and checks.
Tensor rsub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  detail::check_defined(a, "rsub");
  detail::check_defined(b, "rsub", "other");
  return sub(b, a, alpha);
}
Tensor rsub(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  return rsub(a, detail::wrap_scalar(b), alpha);
}

// Infinity tests: false for integers and bools, which hold none.
namespace {
Tensor equals_infinity(const Tensor& x, const char* op, bool positive, bool negative) {
  detail::check_defined(x, op);
  if (!x.is_floating_point())
    return zeros(x.sizes(), TensorOptions().dtype(kBool).device(x.device()));
  const double inf = std::numeric_limits<double>::infinity();
  if (positive && negative) return eq(abs(x), inf);
  return eq(x, positive ? inf : -inf);
}
}  // namespace
Tensor isinf(const Tensor& x) {
  return equals_infinity(x, "isinf", true, true);
}
Tensor isposinf(const Tensor& x) {
  return equals_infinity(x, "isposinf", true, false);
}
Tensor isneginf(const Tensor& x) {
  return equals_infinity(x, "isneginf", false, true);
}

// NaN, inf and -inf replaced (by 0 and the dtype's largest and lowest finite values unless given);
// integers and bools are copied. The gradient is torch's g * isfinite(x): 0 where x was replaced,
// unless g is infinite or NaN there.
Tensor nan_to_num(const Tensor& x, std::optional<double> nan, std::optional<double> posinf,
                  std::optional<double> neginf) {
  detail::check_defined(x, "nan_to_num");
  if (!x.is_floating_point()) return x.clone();
  const double largest = x.dtype() == kFloat32 ? std::numeric_limits<float>::max()
                                               : std::numeric_limits<double>::max();
  const double inf = std::numeric_limits<double>::infinity();
  Tensor out;
  {
    AutoGradMode no_grad(false);
    out = where(ne(x, -inf), x, neginf.value_or(-largest));
    out = where(ne(x, inf), out, posinf.value_or(largest));
    out = where(eq(x, x), out, nan.value_or(0.0));
  }
  if (detail::needs_grad(x))
    detail::record("nan_to_num", {x}, {out}, {x}, [](const detail::BackwardContext& c) {
      return std::vector<Tensor>{c.grad() * isfinite(c.saved(0))};
    });
  return out;
}

// Where a and b are equal (or both NaN, with equal_nan), or their finite difference is within
// atol + |rtol b|, computed in their dtype (integers in float32), as torch's.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  detail::check_defined(a, "isclose");
  detail::check_defined(b, "isclose", "other");
  KILN_CHECK(a.dtype() == b.dtype(), "isclose: expected both tensors to have the same dtype, got ",
             describe(a), " and ", describe(b));
  KILN_CHECK(rtol >= 0 && atol >= 0, "isclose: rtol (", rtol, ") and atol (", atol,
             ") must not be negative (", describe(a), ", ", describe(b), ")");
  Tensor close = eq(a, b);
  if (equal_nan) close = logical_or(close, logical_and(isnan(a), isnan(b)));
  if (rtol == 0 && atol == 0) return close;
  const DType t = a.is_floating_point() ? a.dtype() : kFloat32;
  Tensor x = a.to(t), y = b.to(t);
  Tensor error = abs(x - y);
  return logical_or(close, logical_and(isfinite(error), le(error, abs(y * rtol) + atol)));
}

// ------------------------------------------------------------------ small products and counts
Tensor outer(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "outer");
  detail::check_defined(b, "outer", "vec2");
  KILN_CHECK(a.dim() == 1 && b.dim() == 1, "outer: expected two 1-D tensors, got ", describe(a),
             " and ", describe(b));
  return a.unsqueeze(1) * b;
}
Tensor dot(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "dot");
  detail::check_defined(b, "dot", "other");
  KILN_CHECK(a.dim() == 1 && b.dim() == 1 && a.size(0) == b.size(0) && a.dtype() == b.dtype() &&
                 a.dtype() != kBool,
             "dot: expected two 1-D tensors of the same size and (non-bool) dtype, got ",
             describe(a), " and ", describe(b));
  return (a * b).sum().to(a.dtype());
}
Tensor dist(const Tensor& a, const Tensor& b, const Scalar& p) {
  detail::check_defined(a, "dist");
  detail::check_defined(b, "dist", "other");
  KILN_CHECK(a.is_floating_point() && b.is_floating_point(),
             "dist: expected floating-point inputs, got ", describe(a), " and ", describe(b));
  return linalg::vector_norm(a - b, p);
}
// torch's renorm: the factor min(1, maxnorm / (norm + 1e-7)) per slice, differentiated through the
// norm (torch's renorm_backward is this composition's gradient).
Tensor renorm(const Tensor& x, const Scalar& p, int64_t dim, const Scalar& maxnorm) {
  const char* op = "renorm";
  detail::check_defined(x, op);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", describe(x));
  KILN_CHECK(x.dim() > 1, op, ": input needs at least 2 dimensions, got ", describe(x));
  KILN_CHECK(p.to_double() > 0, op, ": non-positive norm not supported, got p = ", p);
  KILN_CHECK(maxnorm.to_double() >= 0, op, ": expected maxnorm to be >= 0, got ", maxnorm);
  const int64_t kept = detail::wrap_dim(dim, x.dim(), op, &x);
  std::vector<int64_t> others;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != kept) others.push_back(d);
  const Tensor norm = linalg::vector_norm(x, p, others, true);
  const double limit = maxnorm.to_double();
  return x * where(gt(norm, limit), limit / (norm + 1e-7), 1.0);
}
Tensor count_nonzero(const Tensor& x, const std::vector<int64_t>& dims) {
  detail::check_defined(x, "count_nonzero");
  return ne(x, 0).sum(dims);
}
std::tuple<Tensor, Tensor> var_mean(const Tensor& x, const std::vector<int64_t>& dims,
                                    int64_t correction, bool keepdim) {
  return {var(x, dims, correction, keepdim), mean(x, dims, keepdim)};
}
std::tuple<Tensor, Tensor> std_mean(const Tensor& x, const std::vector<int64_t>& dims,
                                    int64_t correction, bool keepdim) {
  return {std(x, dims, correction, keepdim), mean(x, dims, keepdim)};
}

// x - trunc(x) (exact), floats only, as torch's.
Tensor frac(const Tensor& x) {
  detail::check_defined(x, "frac");
  KILN_CHECK(x.is_floating_point(), "frac: expected a floating-point input, got ", describe(x));
  return x - trunc(x);
}
// x * x, as torch's pow(x, 2) (bools square as int64).
Tensor square(const Tensor& x) {
  detail::check_defined(x, "square");
  return pow(x.dtype() == kBool ? x.to(kInt64) : x, 2);
}

// torch's other names: fix is trunc, true_divide div, argwhere nonzero.
Tensor fix(const Tensor& x) {
  return trunc(x);
}
Tensor true_divide(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor true_divide(const Tensor& a, const Scalar& b) {
  return div(a, b);
}
Tensor argwhere(const Tensor& x) {
  return nonzero(x);
}

// pow with both operands in float64 (torch's float_power); the gradient converts back.
Tensor float_power(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "float_power");
  detail::check_defined(b, "float_power", "exponent");
  return pow(a.to(kFloat64), b.to(kFloat64));
}
Tensor float_power(const Tensor& a, const Scalar& b) {
  detail::check_defined(a, "float_power");
  return pow(a.to(kFloat64), b.to_double());
}
Tensor float_power(const Scalar& a, const Tensor& b) {
  detail::check_defined(b, "float_power", "exponent");
  return pow(a.to_double(), b.to(kFloat64));
}

std::tuple<Tensor, Tensor> aminmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  detail::check_defined(x, "aminmax");
  const std::vector<int64_t> dims = dim ? std::vector<int64_t>{*dim} : std::vector<int64_t>{};
  KILN_CHECK(dim ? x.dim() == 0 || x.size(detail::wrap_dim(*dim, x.dim(), "aminmax", &x)) > 0
                 : x.numel() > 0,
             "aminmax: cannot compute the extremes of an empty ", dim ? "dimension" : "tensor",
             " (no identity), got ", describe(x));
  return {amin(x, dims, keepdim), amax(x, dims, keepdim)};
}

// ------------------------------------------------------------------------------------------ norm
namespace {
// x's shape with the reduced dims (checked) kept as size 1, for the gradient; the count of
// elements each output reduces.
Shape kept_shape(const Tensor& x, const std::vector<int64_t>& dims, const char* op,
                 int64_t* reduced = nullptr) {
  Shape kept = x.sizes();
  for (int64_t d = 0; d < x.dim(); ++d)
    if (dims.empty()) kept[d] = 1;
  for (int64_t d : dims)
    if (x.dim() > 0) kept[detail::wrap_dim(d, x.dim(), op, &x)] = 1;
  if (reduced) {
    *reduced = 1;
    for (int64_t d = 0; d < x.dim(); ++d)  // a kept dim of size 1 multiplies by 1
      if (kept[d] == 1) *reduced *= x.size(d);
  }
  return kept;
}

// The q-norm for a finite q other than 0 and 1 (negative too), with torch's gradient
// x |x|^(q-2) / norm^(q-1), 0 where the norm (or x, for q < 2) is 0: the composition's would be
// NaN there.
Tensor p_norm(const Tensor& x, double q, const std::vector<int64_t>& dims, bool keepdim,
              const char* op) {
  const Shape kept = kept_shape(x, dims, op);
  Tensor out;
  {
    NoGradGuard no_grad;
    out =
        q == 2 ? sqrt(sum(x * x, dims, keepdim)) : pow(sum(pow(abs(x), q), dims, keepdim), 1.0 / q);
  }
  if (detail::needs_grad(x))
    detail::record(op, {x}, {out}, {x, out}, [q, kept](const detail::BackwardContext& c) {
      const Tensor &x = c.saved(0), y = c.saved(1).reshape(kept), g = c.grad().reshape(kept);
      const Tensor scale = q == 2 ? x / y : x * pow(abs(x), q - 2) / pow(y, q - 1);
      const Tensor zero = q < 2 ? logical_or(eq(y, 0), eq(x, 0)) : eq(y, 0);
      return std::vector<Tensor>{where(zero, zeros({}, x.dtype()), g * scale)};
    });
  return out;
}
}  // namespace

Tensor norm(const Tensor& x, const Scalar& p, const std::vector<int64_t>& dims, bool keepdim) {
  detail::check_defined(x, "norm");
  KILN_CHECK(x.is_floating_point(), "norm: expected a floating-point input, got ", describe(x));
  const double q = p.to_double();
  KILN_CHECK(q > 0, "norm: p must be positive (1, 2, any other or infinity), got ", p, " for ",
             describe(x));
  kept_shape(x, dims, "norm");  // checks the dims
  if (std::isinf(q)) return amax(abs(x), dims, keepdim);
  if (q == 1) return sum(abs(x), dims, keepdim);
  return p_norm(x, q, dims, keepdim, "norm");
}

Tensor linalg::vector_norm(const Tensor& x_in, const Scalar& ord, const std::vector<int64_t>& dims,
                           bool keepdim, std::optional<DType> dtype) {
  const char* op = "linalg.vector_norm";
  detail::check_defined(x_in, op);
  KILN_CHECK(x_in.is_floating_point(), op, ": expected a floating-point input, got ",
             describe(x_in));
  KILN_CHECK(!dtype || is_floating_point(*dtype), op, ": dtype must be floating, got ", *dtype);
  const Tensor x = dtype ? x_in.to(*dtype) : x_in;
  const double q = ord.to_double();
  KILN_CHECK(q == q, op, ": ord must be a number, got NaN");
  int64_t reduced = 0;
  kept_shape(x, dims, op, &reduced);
  // The largest |x| and negative orders have no value over no elements.
  KILN_CHECK(reduced > 0 || (q >= 0 && q != INFINITY), op, ": cannot compute the ", ord,
             "-norm of ", describe(x), " over no elements (the operation has no identity)");
  if (q == INFINITY) return amax(abs(x), dims, keepdim);
  if (q == -INFINITY) return amin(abs(x), dims, keepdim);
  if (q == 1) return sum(abs(x), dims, keepdim);
  if (q != 0) return p_norm(x, q, dims, keepdim, op);
  // The count of nonzeros: its gradient is 0, as torch's.
  Tensor out;
  {
    NoGradGuard no_grad;
    out = sum(ne(x, 0), dims, keepdim).to(x.dtype());
  }
  if (detail::needs_grad(x))
    detail::record(
        op, {x}, {out}, {},
        [shape = x.sizes(), dtype = x.dtype()](const detail::BackwardContext& c) {
          return std::vector<Tensor>{zeros(shape, TensorOptions(dtype).device(c.grad().device()))};
        });
  return out;
}

// ------------------------------------------------------------------------------ rearrangements
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  detail::check_defined(x, "flip");
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  Tensor out = x;
  for (int64_t dim : dims) {
    const int64_t d = detail::wrap_dim(dim, x.dim(), "flip", &x);
    KILN_CHECK(!seen[d], "flip: dim ", d, " appears more than once in the dims of ", describe(x));
    seen[d] = true;
    const int64_t n = x.size(d);
    out = index_select(out, d, arange(n - 1, -1, -1, x.device()));
  }
  return dims.empty() ? x.clone() : out;
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  detail::check_defined(x, "roll");
  if (dims.empty()) {
    KILN_CHECK(shifts.size() == 1, "roll: without dims, exactly one shift is expected, got ",
               shifts.size(), " for ", describe(x));
    return roll(x.flatten(), shifts, {0}).view(x.sizes());
  }
  KILN_CHECK(shifts.size() == dims.size(), "roll: ", shifts.size(), " shifts and ", dims.size(),
             " dims do not match (input ", describe(x), ")");
  Tensor out = x;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = detail::wrap_dim(dims[i], x.dim(), "roll", &x);
    const int64_t n = x.size(d);
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    out = cat({out.narrow(d, n - s, s), out.narrow(d, 0, n - s)}, d);
  }
  return out.is_same(x) ? x.clone() : out;
}

// x viewed with a size-1 dim before each of its dims, expanded to the repeats and merged.
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  detail::check_defined(x, "repeat");
  const int64_t n = static_cast<int64_t>(repeats.size());
  KILN_CHECK(n >= x.dim(), "repeat: the number of repeats (", n,
             ") cannot be smaller than the number of dims of ", describe(x));
  for (int64_t r : repeats)
    KILN_CHECK(r >= 0, "repeat: repeats must be non-negative, got ", shape_str(repeats), " for ",
               describe(x));
  Shape padded(static_cast<size_t>(n - x.dim()), 1);
  padded.insert(padded.end(), x.sizes().begin(), x.sizes().end());
  Shape interleaved, expanded, result;
  for (int64_t i = 0; i < n; ++i) {
    interleaved.insert(interleaved.end(), {1, padded[i]});
    expanded.insert(expanded.end(), {repeats[i], padded[i]});
    result.push_back(repeats[i] * padded[i]);
  }
  Tensor out = x.reshape(interleaved).expand(expanded).reshape(result);
  // Where the reshape could view x (repeats of one, or no elements): a copy all the same, as
  // torch's.
  return out.impl()->storage == x.impl()->storage ? out.clone() : out;
}

namespace {
// x, or x converted to float32 when it holds integers or bools (torch's promotion for math).
Tensor as_floating(const Tensor& x, const char* op) {
  detail::check_defined(x, op);
  return x.is_floating_point() ? x : x.to(kFloat32);
}
}  // namespace

Tensor deg2rad(const Tensor& x) {
  return as_floating(x, "deg2rad") * 0.017453292519943295;  // pi / 180
}
Tensor rad2deg(const Tensor& x) {
  return as_floating(x, "rad2deg") * 57.295779513082320876798154814105;  // 180 / pi
}

namespace {
// True where column - row <= diagonal (lower) or >= diagonal (upper), over x's last two dims.
Tensor triangle_mask(const Tensor& x, int64_t diagonal, bool lower, const char* op) {
  detail::check_defined(x, op);
  KILN_CHECK(x.dim() >= 2, op, ": expected a tensor of at least 2 dims, got ", describe(x));
  Tensor rows = arange(x.size(-2), x.device()).unsqueeze(1);
  Tensor cols = arange(x.size(-1), x.device()).unsqueeze(0);
  Tensor offset = cols - rows;
  return lower ? le(offset, diagonal) : ge(offset, diagonal);
}
}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) {
  Tensor mask = triangle_mask(x, diagonal, true, "tril");
  return where(mask, x, zeros({}, x.dtype()));
}
Tensor triu(const Tensor& x, int64_t diagonal) {
  Tensor mask = triangle_mask(x, diagonal, false, "triu");
  return where(mask, x, zeros({}, x.dtype()));
}

// ------------------------------------------------------------------------------------ kiln::tensor
TensorData::TensorData(std::initializer_list<TensorData> list) {
  const TensorData* first = list.size() ? list.begin() : nullptr;
  shape_ = {static_cast<int64_t>(list.size())};
  if (!first) kind_ = kFloat64;  // tensor({}) is float32, as torch's
  if (first) shape_.insert(shape_.end(), first->shape_.begin(), first->shape_.end());
  for (const TensorData& e : list) {
    KILN_CHECK(e.shape_ == first->shape_, "tensor: nested lists must have equal lengths, got ",
               shape_str(first->shape_), " and ", shape_str(e.shape_));
    if (e.kind_ == kFloat64 || (e.kind_ == kInt64 && kind_ == kBool)) kind_ = e.kind_;
  }
  // Every element in the widest kind: integers stay exact in ints_ unless a float appears.
  for (const TensorData& e : list) {
    if (kind_ == kInt64) {
      if (e.kind_ == kInt64)
        ints_.insert(ints_.end(), e.ints_.begin(), e.ints_.end());
      else
        for (double v : e.values_) ints_.push_back(static_cast<int64_t>(v));
    } else {
      values_.insert(values_.end(), e.values_.begin(), e.values_.end());
      for (int64_t v : e.ints_) values_.push_back(static_cast<double>(v));
    }
  }
}

Tensor tensor(const TensorData& data, TensorOptions options) {
  const DType inferred = data.kind() == kFloat64 ? kFloat32 : data.kind();
  const DType dtype = options.dtype_or(inferred);
  Tensor out = data.kind() == kInt64 ? from_vector(data.ints(), data.shape())
                                     : from_vector(data.values(), data.shape());
  if (data.kind() == kBool) out = out.to(kBool);
  return out.to(dtype).to(options.device_);
}

// ------------------------------------------------------------------------------------------ einsum
namespace {
std::vector<std::string> split_terms(const std::string& lhs) {
  std::vector<std::string> terms(1);
  for (char c : lhs) {
    if (c == ',')
      terms.emplace_back();
    else if (c != ' ')
      terms.back() += c;
  }
  return terms;
}

// The operand summed over the letters that neither `keep` nor any other operand needs.
Tensor sum_unneeded(const Tensor& t, std::string& letters, const std::string& keep) {
  std::vector<int64_t> dims;
  std::string kept;
  for (size_t i = 0; i < letters.size(); ++i) {
    if (keep.find(letters[i]) == std::string::npos)
      dims.push_back(static_cast<int64_t>(i));
    else
      kept += letters[i];
  }
  letters = kept;
  return dims.empty() ? t : sum(t, dims);
}

Tensor permuted(const Tensor& t, const std::string& from, const std::string& to) {
  std::vector<int64_t> order;
  for (char c : to) order.push_back(static_cast<int64_t>(from.find(c)));
  return t.permute(order);
}

int64_t product(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// Contracts a (letters la) with b (letters lb) into letters `out`, whose letters all appear in a
// or b: batch letters (in a, b and out), a's own, b's own and the contracted ones (in both, not in
// out) become one bmm of [batch, a's, contracted] by [batch, contracted, b's].
Tensor contract(Tensor a, std::string la, Tensor b, std::string lb, const std::string& out,
                const std::string& equation) {
  std::string batch, left, right, inner;
  for (char c : la) {
    const bool in_b = lb.find(c) != std::string::npos, in_out = out.find(c) != std::string::npos;
    (in_b ? (in_out ? batch : inner) : left) += c;
  }
  for (char c : lb)
    if (la.find(c) == std::string::npos) right += c;
  auto size_of = [&](char c, const Tensor& t, const std::string& l) {
    return t.size(static_cast<int64_t>(l.find(c)));
  };
  Shape batch_shape, left_shape, right_shape, inner_shape;
  Shape a_shape = a.sizes(), b_shape = b.sizes();
  for (char c : batch) {
    int64_t sa = size_of(c, a, la), sb = size_of(c, b, lb);
    KILN_CHECK(sa == sb || sa == 1 || sb == 1, "einsum: '", equation, "': letter '", c,
               "' has sizes ", sa, " and ", sb, " in operands ", describe(a), " and ", describe(b));
    batch_shape.push_back(std::max(sa, sb));
  }
  for (char c : inner) {
    int64_t sa = size_of(c, a, la), sb = size_of(c, b, lb);
    KILN_CHECK(sa == sb, "einsum: '", equation, "': contracted letter '", c, "' has sizes ", sa,
               " and ", sb, " in operands ", describe(a), " and ", describe(b));
    inner_shape.push_back(sa);
  }
  for (char c : left) left_shape.push_back(size_of(c, a, la));
  for (char c : right) right_shape.push_back(size_of(c, b, lb));
  // Batch letters of size 1 on one side broadcast.
  Tensor pa = permuted(a, la, batch + left + inner), pb = permuted(b, lb, batch + inner + right);
  Shape ea = batch_shape, eb = batch_shape;
  ea.insert(ea.end(), pa.sizes().begin() + batch.size(), pa.sizes().end());
  eb.insert(eb.end(), pb.sizes().begin() + batch.size(), pb.sizes().end());
  pa = pa.expand(ea);
  pb = pb.expand(eb);
  const int64_t nb = product(batch_shape), nl = product(left_shape), nr = product(right_shape),
                nk = product(inner_shape);
  Tensor r = bmm(pa.reshape({nb, nl, nk}), pb.reshape({nb, nk, nr}));
  Shape r_shape = batch_shape;
  r_shape.insert(r_shape.end(), left_shape.begin(), left_shape.end());
  r_shape.insert(r_shape.end(), right_shape.begin(), right_shape.end());
  return permuted(r.reshape(r_shape), batch + left + right, out);
}
}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  const size_t arrow = equation.find("->");
  std::vector<std::string> terms = split_terms(equation.substr(0, arrow));
  std::string shapes;
  for (const Tensor& t : operands) shapes += (shapes.empty() ? "" : ", ") + describe(t);
  KILN_CHECK(terms.size() == operands.size(), "einsum: '", equation, "' names ", terms.size(),
             " operands, got ", operands.size(), " (", shapes, ")");
  KILN_CHECK(!operands.empty() && operands.size() <= 3, "einsum: '", equation,
             "': one to three operands are supported, got ", operands.size());
  KILN_CHECK(equation.find("...") == std::string::npos, "einsum: '", equation,
             "': ellipses are not supported");
  std::map<char, int> count;
  for (size_t i = 0; i < terms.size(); ++i) {
    detail::check_defined(operands[i], "einsum");
    KILN_CHECK(static_cast<int64_t>(terms[i].size()) == operands[i].dim(), "einsum: '", equation,
               "': operand ", i, " has ", terms[i].size(), " letters for ", describe(operands[i]));
    for (char c : terms[i]) {
      KILN_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: '", equation,
                 "': unexpected character '", c, "'");
      KILN_CHECK(std::count(terms[i].begin(), terms[i].end(), c) == 1, "einsum: '", equation,
                 "': letter '", c, "' repeats in operand ", i,
                 " (diagonals are not supported; operands ", shapes, ")");
      ++count[c];
    }
  }
  std::string out;
  if (arrow == std::string::npos) {
    for (const auto& [c, n] : count)  // implicit form: the letters seen once, alphabetically
      if (n == 1) out += c;
  } else {
    for (char c : equation.substr(arrow + 2)) {
      if (c == ' ') continue;
      KILN_CHECK(count.count(c) && std::count(out.begin(), out.end(), c) == 0, "einsum: '",
                 equation, "': output letter '", c, "' is repeated or in no operand");
      out += c;
    }
  }
  // Contract left to right, each step keeping what the output or a later operand needs.
  std::string letters = terms[0];
  std::string later;
  for (size_t i = 1; i < terms.size(); ++i) later += terms[i];
  Tensor acc = sum_unneeded(operands[0], letters, out + later);
  for (size_t i = 1; i < terms.size(); ++i) {
    later = "";
    for (size_t j = i + 1; j < terms.size(); ++j) later += terms[j];
    std::string lb = terms[i];
    Tensor b = sum_unneeded(operands[i], lb, out + letters + later);
    std::string next;
    for (char c : letters + lb)
      if ((out + later).find(c) != std::string::npos && next.find(c) == std::string::npos)
        next += c;
    acc = contract(acc, letters, b, lb, next, equation);
    letters = next;
  }
  return permuted(acc, letters, out).contiguous();
}

}  // namespace kiln
