// Elementwise ops: each op's one definition (name, dtype rule, scalar formula) and its public
// entry.
#include <cmath>
#include <limits>

#include "kiln/ops.h"
#include "lib/elementwise.h"

namespace kiln {

using detail::DTypeRule;
using detail::OpKind;
using detail::wrap_scalar;

namespace {
template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

template <typename T>
T multiply(T x, T y) {
  if constexpr (std::is_same_v<T, bool>)
    return x && y;
  else
    return x * y;
}

// erf for float32 as a rational polynomial on [-4, 4] (erf is +-1 to float precision beyond), which
// vectorizes where libm's erff does not; within 5e-7 of the exact value everywhere. float64 uses
// libm.
template <typename T>
T erf_value(T x) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr float a[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f,  -2.10102402082508e-06f,
                            -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                            -1.60960333262415e-02f};
    constexpr float b[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                            -7.37332916720468e-03f, -1.42647390514189e-02f};
    x = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);  // NaN compares false and passes through
    float x2 = x * x;
    float p = a[0];
    for (float c : {a[1], a[2], a[3], a[4], a[5], a[6]}) p = p * x2 + c;
    float q = b[0];
    for (float c : {b[1], b[2], b[3], b[4]}) q = q * x2 + c;
    return x * p / q;
  } else {
    return std::erf(x);
  }
}

// Integer power by squaring; the caller rejects negative exponents.
template <typename T>
T int_pow(T base, T exp) {
  if constexpr (std::is_same_v<T, bool>) {
    return base || !exp;
  } else {
    T result = 1;
    while (exp > 0) {
      if (exp & 1) result *= base;
      base *= base;
      exp >>= 1;
    }
    return result;
  }
}

// floor, ceil and round apply to floats and are the identity on integers (a detour through double
// loses int64 bits). nearbyint rounds half to even in the default rounding mode, as torch.round
// does.
template <typename T, typename F>
T on_floats(T x, F f) {
  if constexpr (kIsFloat<T>)
    return f(x);
  else
    return x;
}

const detail::OpDef& def_op(const char* name, OpKind kind, int arity, DTypeRule rule,
                            bool supports_bool = true) {
  return detail::register_op({name, kind, arity, rule, supports_bool});
}

void check_no_zero_divisor(const char* op, const Tensor& b, DType compute) {
  if (!is_integral(compute)) return;  // bool operands are rejected with a clearer message later
  KILN_CHECK(!kiln::eq(b, 0).any().item<bool>(), op, ": integer division by zero (divisor ",
             detail::describe(b), ")");
}
}  // namespace

// ------------------------------------------------------------------------------------- unary ops
// KILN_UNARY(name, rule, supports_bool, expression of x of type T)
#define KILN_UNARY(NAME, RULE, BOOL_OK, EXPR)                                              \
  static const detail::OpDef& NAME##_def = def_op(#NAME, OpKind::Unary, 1, RULE, BOOL_OK); \
  Tensor NAME(const Tensor& input) {                                                       \
    return detail::unary_op<RULE>(NAME##_def, input, [](auto x) {                          \
      using T = decltype(x);                                                               \
      (void)sizeof(T);                                                                     \
      return EXPR;                                                                         \
    });                                                                                    \
  }

KILN_UNARY(neg, DTypeRule::Same, false, T(-x))
KILN_UNARY(abs, DTypeRule::Same, true, T(x < T(0) ? T(-x) : x))
KILN_UNARY(sign, DTypeRule::Same, true, T((T(0) < x) - (x < T(0))))
KILN_UNARY(exp, DTypeRule::Float, true, std::exp(x))
KILN_UNARY(log, DTypeRule::Float, true, std::log(x))
KILN_UNARY(log1p, DTypeRule::Float, true, std::log1p(x))
KILN_UNARY(expm1, DTypeRule::Float, true, std::expm1(x))
KILN_UNARY(sqrt, DTypeRule::Float, true, std::sqrt(x))
KILN_UNARY(rsqrt, DTypeRule::Float, true, T(1) / std::sqrt(x))
KILN_UNARY(reciprocal, DTypeRule::Float, true, T(1) / x)
KILN_UNARY(sin, DTypeRule::Float, true, std::sin(x))
KILN_UNARY(cos, DTypeRule::Float, true, std::cos(x))
KILN_UNARY(tanh, DTypeRule::Float, true, std::tanh(x))
KILN_UNARY(sigmoid, DTypeRule::Float, true, T(1) / (T(1) + std::exp(-x)))
// NaN passes through, as torch's relu (clamp_min(x, 0)) does.
KILN_UNARY(relu, DTypeRule::Same, false, T(x > T(0) || x != x ? x : T(0)))
KILN_UNARY(silu, DTypeRule::Float, true, x / (T(1) + std::exp(-x)))
KILN_UNARY(erf, DTypeRule::Float, true, erf_value(x))
KILN_UNARY(floor, DTypeRule::Same, true, on_floats(x, [](auto v) { return std::floor(v); }))
KILN_UNARY(ceil, DTypeRule::Same, true, on_floats(x, [](auto v) { return std::ceil(v); }))
KILN_UNARY(round, DTypeRule::Same, true, on_floats(x, [](auto v) { return std::nearbyint(v); }))
KILN_UNARY(logical_not, DTypeRule::Logical, true, !x)
KILN_UNARY(isnan, DTypeRule::Predicate, true, x != x)
KILN_UNARY(isfinite, DTypeRule::Predicate, true,
           kIsFloat<T> ? (x == x && std::abs(double(x)) != std::numeric_limits<double>::infinity())
                       : true)
#undef KILN_UNARY

static const detail::OpDef& gelu_def = def_op("gelu", OpKind::Unary, 1, DTypeRule::Float);
Tensor gelu(const Tensor& input, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "gelu: approximate must be 'none' or 'tanh', got '", approximate, "'");
  if (approximate == "tanh") {
    return detail::unary_op<DTypeRule::Float>(gelu_def, input, [](auto x) {
      using T = decltype(x);
      const T k = T(0.7978845608028654);  // sqrt(2 / pi)
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    });
  }
  return detail::unary_op<DTypeRule::Float>(gelu_def, input, [](auto x) {
    using T = decltype(x);
    return T(0.5) * x * (T(1) + erf_value(x * T(0.7071067811865476)));
  });
}

static const detail::OpDef& softplus_def = def_op("softplus", OpKind::Unary, 1, DTypeRule::Float);
Tensor softplus(const Tensor& input, double beta, double threshold) {
  return detail::unary_op<DTypeRule::Float>(softplus_def, input, [beta, threshold](auto x) {
    using T = decltype(x);
    T bx = T(beta) * x;
    return bx > T(threshold) ? x : T(std::log1p(std::exp(bx)) / T(beta));
  });
}

// ------------------------------------------------------------------------------------ binary ops
// KILN_BINARY(name, rule, supports_bool, expression of x and y of type T)
#define KILN_BINARY(NAME, RULE, BOOL_OK, EXPR)                                              \
  static const detail::OpDef& NAME##_def = def_op(#NAME, OpKind::Binary, 2, RULE, BOOL_OK); \
  static const auto NAME##_fn = [](auto x, auto y) {                                        \
    using T = decltype(x);                                                                  \
    (void)sizeof(T);                                                                        \
    return EXPR;                                                                            \
  };                                                                                        \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                           \
    return detail::binary_op<RULE>(NAME##_def, a, b, NAME##_fn);                            \
  }                                                                                         \
  Tensor NAME(const Tensor& a, const Scalar& b) {                                           \
    return NAME(a, wrap_scalar(b));                                                         \
  }

KILN_BINARY(mul, DTypeRule::Same, true, multiply(x, y))
KILN_BINARY(div, DTypeRule::Float, true, x / y)
// NaN propagates from either side, as in torch.minimum/maximum.
KILN_BINARY(minimum, DTypeRule::Same, true, T((x != x || x < y) ? x : y))
KILN_BINARY(maximum, DTypeRule::Same, true, T((x != x || x > y) ? x : y))
KILN_BINARY(eq, DTypeRule::Predicate, true, x == y)
KILN_BINARY(ne, DTypeRule::Predicate, true, x != y)
KILN_BINARY(lt, DTypeRule::Predicate, true, x < y)
KILN_BINARY(le, DTypeRule::Predicate, true, x <= y)
KILN_BINARY(gt, DTypeRule::Predicate, true, x > y)
KILN_BINARY(ge, DTypeRule::Predicate, true, x >= y)
KILN_BINARY(logical_and, DTypeRule::Logical, true, x&& y)
KILN_BINARY(logical_or, DTypeRule::Logical, true, x || y)
#undef KILN_BINARY

// add and sub carry alpha: a + alpha * b.
static const detail::OpDef& add_def = def_op("add", OpKind::Binary, 2, DTypeRule::Same);
static const detail::OpDef& sub_def = def_op("sub", OpKind::Binary, 2, DTypeRule::Same, false);

namespace {
Tensor add_impl(const detail::OpDef& def, const Tensor& a, const Tensor& b, const Scalar& alpha,
                Tensor* inplace) {
  detail::check_defined(a, def.name.c_str());
  detail::check_defined(b, def.name.c_str(), "other");
  DType common = detail::result_type({a, b});
  KILN_CHECK(!(is_integral(common, true) && alpha.is_floating_point()), def.name,
             ": for integral inputs, alpha must not be a floating-point number (got ", alpha,
             " with ", detail::describe(a), " and ", detail::describe(b), ")");
  bool is_sub = &def == &sub_def;
  if (alpha.to_double() == 1.0 && alpha.to_int() == 1) {
    if (is_sub)
      return detail::binary_op<DTypeRule::Same>(
          def, a, b, [](auto x, auto y) { return decltype(x)(x - y); }, inplace);
    return detail::binary_op<DTypeRule::Same>(
        def, a, b, [](auto x, auto y) { return decltype(x)(x + y); }, inplace);
  }
  double ad = is_sub ? -alpha.to_double() : alpha.to_double();
  int64_t ai = is_sub ? -alpha.to_int() : alpha.to_int();
  return detail::binary_op<DTypeRule::Same>(
      def, a, b,
      [ad, ai](auto x, auto y) {
        using T = decltype(x);
        if constexpr (kIsFloat<T>)
          return T(x + T(ad) * y);
        else
          return T(x + T(ai) * y);
      },
      inplace);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  return add_impl(add_def, a, b, alpha, nullptr);
}
Tensor add(const Tensor& a, const Scalar& b) {
  return add(a, wrap_scalar(b));
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  return add_impl(sub_def, a, b, alpha, nullptr);
}
Tensor sub(const Tensor& a, const Scalar& b) {
  return sub(a, wrap_scalar(b));
}

static const detail::OpDef& remainder_def =
    def_op("remainder", OpKind::Binary, 2, DTypeRule::Same, false);
Tensor remainder(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "remainder");
  detail::check_defined(b, "remainder", "other");
  check_no_zero_divisor("remainder", b, detail::result_type({a, b}));
  return detail::binary_op<DTypeRule::Same>(remainder_def, a, b, [](auto x, auto y) {
    using T = decltype(x);
    T r;
    if constexpr (kIsFloat<T>)
      r = std::fmod(x, y);
    else
      r = T(x % y);
    if (r != T(0) && ((r < T(0)) != (y < T(0)))) r = T(r + y);
    return r;
  });
}
Tensor remainder(const Tensor& a, const Scalar& b) {
  return remainder(a, wrap_scalar(b));
}

static const detail::OpDef& pow_def = def_op("pow", OpKind::Binary, 2, DTypeRule::Same, false);
Tensor pow(const Tensor& base, const Tensor& exponent) {
  detail::check_defined(base, "pow");
  detail::check_defined(exponent, "pow", "exponent");
  DType common = detail::result_type({base, exponent});
  if (is_integral(common) && exponent.dtype() != kBool) {
    KILN_CHECK(!kiln::lt(exponent, 0).any().item<bool>(),
               "pow: integers to negative integer powers are not allowed (base ",
               detail::describe(base), ", exponent ", detail::describe(exponent), ")");
  }
  return detail::binary_op<DTypeRule::Same>(pow_def, base, exponent, [](auto x, auto y) {
    using T = decltype(x);
    if constexpr (kIsFloat<T>)
      return T(std::pow(x, y));
    else
      return T(int_pow(x, y));
  });
}
Tensor pow(const Tensor& base, const Scalar& exponent) {
  return pow(base, wrap_scalar(exponent));
}
Tensor pow(const Scalar& base, const Tensor& exponent) {
  return pow(wrap_scalar(base), exponent);
}

// ----------------------------------------------------------------------------------- where, clamp
static const detail::OpDef& where_def = def_op("where", OpKind::Ternary, 3, DTypeRule::Custom);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&condition, &a, &b})
    detail::check_elementwise_input(where_def, *t, "input");
  KILN_CHECK(condition.dtype() == kBool, "where: expected condition to be a bool tensor, got ",
             detail::describe(condition));
  Shape shape = detail::broadcast_shapes(
      detail::broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  DType common = detail::result_type({a, b});
  Tensor ta = a.to(common), tb = b.to(common);
  Tensor out = detail::make_empty(shape, common);
  detail::dispatch_all(common, [&](auto tag) {
    using T = KILN_TYPE(tag);
    detail::map_kernel<T, bool, T, T>([](bool c, T x, T y) { return c ? x : y; }, out, condition,
                                      ta, tb);
  });
  return out;
}
Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b) {
  return where(condition, a, wrap_scalar(b));
}

static const detail::OpDef& clamp_def = def_op("clamp", OpKind::Unary, 1, DTypeRule::Same, false);
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  detail::check_elementwise_input(clamp_def, x, "input");
  KILN_CHECK(min || max, "clamp: at least one of 'min' or 'max' must be given");
  std::vector<Tensor> operands{x};
  if (min) operands.push_back(wrap_scalar(*min));
  if (max) operands.push_back(wrap_scalar(*max));
  DType common = detail::result_type(operands);
  Tensor in = x.to(common);
  Tensor out = detail::make_empty(x.sizes(), common);
  detail::dispatch_numeric(common, "clamp", [&](auto tag) {
    using T = KILN_TYPE(tag);
    T lo = min ? min->to<T>() : std::numeric_limits<T>::lowest();
    T hi = max ? max->to<T>() : std::numeric_limits<T>::max();
    bool has_lo = min.has_value(), has_hi = max.has_value();
    detail::map_kernel<T, T>(
        [=](T v) {
          if (has_lo && v < lo) v = lo;  // NaN compares false and passes through
          if (has_hi && v > hi) v = hi;
          return v;
        },
        out, in);
  });
  return out;
}

// ---------------------------------------------------------------------------------- in-place ops
Tensor& Tensor::add_(const Tensor& other, const Scalar& alpha) {
  add_impl(add_def, *this, other, alpha, this);
  return *this;
}
Tensor& Tensor::add_(const Scalar& other) {
  return add_(wrap_scalar(other));
}
Tensor& Tensor::sub_(const Tensor& other, const Scalar& alpha) {
  add_impl(sub_def, *this, other, alpha, this);
  return *this;
}
Tensor& Tensor::sub_(const Scalar& other) {
  return sub_(wrap_scalar(other));
}
Tensor& Tensor::mul_(const Tensor& other) {
  detail::binary_op<DTypeRule::Same>(mul_def, *this, other, mul_fn, this);
  return *this;
}
Tensor& Tensor::mul_(const Scalar& other) {
  return mul_(wrap_scalar(other));
}
Tensor& Tensor::div_(const Tensor& other) {
  detail::binary_op<DTypeRule::Float>(div_def, *this, other, div_fn, this);
  return *this;
}
Tensor& Tensor::div_(const Scalar& other) {
  return div_(wrap_scalar(other));
}
Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  Tensor result = kiln::clamp(*this, min, max);
  detail::finish_inplace(clamp_def, *this, result);
  return *this;
}

}  // namespace kiln
