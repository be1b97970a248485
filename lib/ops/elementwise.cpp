// Elementwise ops: each op's one definition (name, dtype rule, scalar formula) and its public
// entry.
#include <cmath>
#include <limits>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/elementwise.h"
#include "lib/fastmath.h"
#include "lib/int_math.h"
#include "lib/op_registry.h"

namespace kiln {

using detail::DTypeRule;
using detail::OpKind;
using detail::wrap_scalar;

namespace {
template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

using detail::wrap_add;
using detail::wrap_mul;
using detail::wrap_neg;
using detail::wrap_sub;

template <typename T>
T multiply(T x, T y) {
  if constexpr (std::is_same_v<T, bool>)
    return x && y;
  else
    return wrap_mul(x, y);
}

// Transcendentals and special functions: lib/math's single definitions (the code generators
// instantiate the same) for float32 and float64, plain or in lib/math/lanes.h's blocks (Lanewise
// formulas); other types compute in float64. Always inlined, so that the multiversioned loops of
// lib/loops.h compile them with FMA.
#define KILN_MATH_VALUE(f)                                          \
  template <typename T>                                             \
  KILN_MATH_INLINE T f##_value(T x) {                               \
    if constexpr (std::is_same_v<math::ScalarOf<T>, float>)         \
      return math::f##_f32(x);                                      \
    else if constexpr (std::is_same_v<math::ScalarOf<T>, double>)   \
      return math::f##_f64(x);                                      \
    else                                                            \
      return static_cast<T>(math::f##_f64(static_cast<double>(x))); \
  }
KILN_MATH_VALUE(exp)
KILN_MATH_VALUE(log)
KILN_MATH_VALUE(log1p)
KILN_MATH_VALUE(expm1)
KILN_MATH_VALUE(sin)
KILN_MATH_VALUE(cos)
KILN_MATH_VALUE(tanh)
KILN_MATH_VALUE(erf)
KILN_MATH_VALUE(tan)
KILN_MATH_VALUE(atan)
KILN_MATH_VALUE(asin)
KILN_MATH_VALUE(acos)
KILN_MATH_VALUE(sinh)
KILN_MATH_VALUE(cosh)
KILN_MATH_VALUE(asinh)
KILN_MATH_VALUE(acosh)
KILN_MATH_VALUE(atanh)
KILN_MATH_VALUE(exp2)
KILN_MATH_VALUE(log2)
KILN_MATH_VALUE(log10)
KILN_MATH_VALUE(erfc)
KILN_MATH_VALUE(erfinv)
KILN_MATH_VALUE(lgamma)
KILN_MATH_VALUE(digamma)
KILN_MATH_VALUE(trigamma)
#undef KILN_MATH_VALUE
template <typename T>
KILN_MATH_INLINE T atan2_value(T y, T x) {
  if constexpr (std::is_same_v<math::ScalarOf<T>, float>)
    return math::atan2_f32(y, x);
  else if constexpr (std::is_same_v<math::ScalarOf<T>, double>)
    return math::atan2_f64(y, x);
  else
    return std::atan2(y, x);
}

// hypot's formula (lib/ops/binary_ops.inc), step for step.
template <typename T>
T hypot_value(T x, T y) {
  const T ax = x < T(0) ? T(-x) : x, ay = y < T(0) ? T(-y) : y;
  const T m = ax > ay ? ax : ay;
  const T r = T((ax > ay ? ay : ax) / m);
  const auto is_inf = [](T v) { return v == v && T(v - v) != T(0); };
  if (is_inf(ax)) return ax;
  if (is_inf(ay)) return ay;
  // m is 0 where the smaller is a zero and the other a zero or NaN (which a comparison skips).
  return m == T(0) ? (ax != ax ? ax : T(0)) : T(m * T(std::sqrt(T(T(1) + T(r * r)))));
}

// pow's primitive, lib/math/primitives.h's single definition (the fused kernels instantiate the
// same): pow_float for floats; pow_int for integers, wrapping, computed over the unsigned type of
// their width (the caller rejects negative exponents).
template <typename T>
T pow_value(T x, T y) {
  if constexpr (kIsFloat<T>) {
    return math::pow_float(x, y);
  } else if constexpr (std::is_same_v<T, bool>) {
    return x || !y;
  } else {
    using U = std::conditional_t<sizeof(T) <= 4, uint32_t, uint64_t>;
    return static_cast<T>(math::pow_int(static_cast<U>(x), static_cast<U>(y)));
  }
}

// floor, ceil and round apply to floats and are the identity on integers (a detour through double
// loses int64 bits). nearbyint rounds half to even in the default rounding mode, as torch.round
// does.
// torch.signbit: a float's sign bit (-0.0 and NaNs with it set count); x < 0 for integers.
template <typename T>
bool sign_bit(T x) {
  if constexpr (kIsFloat<T>)
    return std::signbit(x);
  else
    return x < T(0);
}
template <typename T, typename F>
T on_floats(T x, F f) {
  if constexpr (kIsFloat<T>)
    return f(x);
  else
    return x;
}

const detail::OpDef& def_op(const char* name, OpKind kind, int arity, DTypeRule rule,
                            bool supports_bool, detail::Invoke invoke,
                            std::vector<std::string> attr_names = {},
                            detail::MapInto map_into = nullptr, const char* formula = nullptr,
                            bool checks_integer_values = false) {
  return detail::register_op({name, kind, arity, rule, supports_bool, invoke, std::move(attr_names),
                              map_into, formula, checks_integer_values});
}

using Inputs = std::vector<Tensor>;
using detail::Attrs;

// a is the dividend: an empty result divides nothing (as torch, which then does not raise).
void check_no_zero_divisor(const char* op, const Tensor& a, const Tensor& b, DType compute) {
  if (!is_integral(compute)) return;  // bool operands are rejected with a clearer message later
  if (detail::shape_numel(detail::broadcast_shapes(a.sizes(), b.sizes(), op)) == 0) return;
  // The divisor as the kernel reads it, in the result's dtype: a 0-dim int64 divisor of an int32
  // tensor wraps (INT64_MIN becomes 0), as in torch.
  KILN_CHECK(!kiln::eq(b.to(compute), 0).any().item<bool>(), op,
             ": integer division by zero (divisor ", detail::describe(b), " as ",
             dtype_name(compute), ")");
}
}  // namespace

// ------------------------------------------------------------------------------------- unary ops
namespace {
// Which tensors a gradient formula reads: the input x, the output y, both or neither.
enum class Saves { None, X, Y, XY };

std::vector<Tensor> saved_for(Saves saves, const Tensor& x, const Tensor& y) {
  bool sx = saves == Saves::X || saves == Saves::XY, sy = saves == Saves::Y || saves == Saves::XY;
  return {sx ? x : Tensor(), sy ? y : Tensor()};
}
}  // namespace

namespace {
// trigamma's gradient would be polygamma(2, x), which kiln does not compute.
Tensor trigamma_gradient(const Tensor& x) {
  KILN_FAIL("trigamma (polygamma(1, x)) of ", detail::describe(x),
            ": its gradient, polygamma(2, x), is not implemented (kiln's polygamma has orders 0 "
            "and 1)");
}
// torch's sinc_backward: g (pi x cos(pi x) - sin(pi x)) / (pi x^2), 0 where pi x^2 is 0.
Tensor sinc_gradient(const Tensor& g, const Tensor& x) {
  const Tensor pi_x = x * 3.141592653589793, pi_x2 = x * x * 3.141592653589793;
  return where(ne(pi_x2, 0), g * (pi_x * cos(pi_x) - sin(pi_x)) / pi_x2, 0.0);
}
}  // namespace

// KILN_UNARY(name, rule, supports_bool, scalar expression of x of type T, saves, gradient
// expression in the tensors g (output gradient), x (input) and y (output); Tensor() for none).
// KILN_UNARY_MATH: the same, for an expression that also computes lib/math/lanes.h's blocks (T a
// Lanes of float or double lanes; see detail::Lanewise).
#define KILN_UNARY(NAME, RULE, BOOL_OK, EXPR, FORMULA, SAVES, GRAD) \
  KILN_UNARY_OP(NAME, RULE, BOOL_OK, EXPR, FORMULA, SAVES, GRAD, )
#define KILN_UNARY_MATH(NAME, RULE, BOOL_OK, EXPR, FORMULA, SAVES, GRAD) \
  KILN_UNARY_OP(NAME, RULE, BOOL_OK, EXPR, FORMULA, SAVES, GRAD, detail::lanewise)
#define KILN_UNARY_OP(NAME, RULE, BOOL_OK, EXPR, FORMULA, SAVES, GRAD, WRAP)         \
  static const auto NAME##_fn = WRAP([](auto x) {                                    \
    using T = decltype(x);                                                           \
    (void)sizeof(T);                                                                 \
    return EXPR;                                                                     \
  });                                                                                \
  static detail::OpHandle NAME##_def;                                                \
  Tensor NAME(const Tensor& input) {                                                 \
    Tensor out = detail::unary_op<RULE>(NAME##_def, input, NAME##_fn);               \
    if (detail::needs_grad(input))                                                   \
      detail::record(#NAME, {input}, {out}, saved_for(Saves::SAVES, input, out),     \
                     [](const detail::BackwardContext& c) {                          \
                       const Tensor &g = c.grad(), &x = c.saved(0), &y = c.saved(1); \
                       (void)g, (void)x, (void)y;                                    \
                       return std::vector<Tensor>{GRAD};                             \
                     });                                                             \
    return out;                                                                      \
  }
// The largest special functions' eager kernels in blocks of lanes take the sanitizer builds over
// 20 minutes to instrument, for register arithmetic the sanitizers have nothing to check in:
// there they run element by element (the same definition, lib/math/special.h).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KILN_UNARY_SPECIAL KILN_UNARY
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KILN_UNARY_SPECIAL KILN_UNARY
#endif
#endif
#ifndef KILN_UNARY_SPECIAL
#define KILN_UNARY_SPECIAL KILN_UNARY_MATH
#endif

#include "lib/ops/unary_ops.inc"
#undef KILN_UNARY
#undef KILN_UNARY_MATH
#undef KILN_UNARY_OP

static detail::OpHandle gelu_def;
static void register_gelu() {
  gelu_def.bind(def_op(
      "gelu", OpKind::Unary, 1, DTypeRule::Float, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{gelu(in[0], detail::attr_string(a.at(0)))};
      },
      {"approximate"}, nullptr,
      // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) or 0.5 x (1 + erf(x / sqrt(2))).
      "(if-attr a0 tanh"
      " (mul (mul 0.5 x) (add 1 (tanh (mul 0.7978845608028654"
      "  (add x (mul (mul (mul 0.044715 x) x) x))))))"
      " (mul (mul 0.5 x) (add 1 (erf (mul x 0.7071067811865476)))))"));
}
Tensor gelu(const Tensor& input, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "gelu: approximate must be 'none' or 'tanh', got '", approximate, "'");
  const bool tanh_form = approximate == "tanh";
  Tensor out =
      tanh_form ? detail::unary_op<DTypeRule::Float>(
                      gelu_def, input, detail::lanewise([](auto x) {
                        using T = decltype(x);
                        const T k = T(0.7978845608028654);
                        return T(0.5) * x * (T(1) + tanh_value(k * (x + T(0.044715) * x * x * x)));
                      }),
                      {approximate})
                : detail::unary_op<DTypeRule::Float>(
                      gelu_def, input, detail::lanewise([](auto x) {
                        using T = decltype(x);
                        return T(0.5) * x * (T(1) + erf_value(x * T(0.7071067811865476)));
                      }),
                      {approximate});
  if (detail::needs_grad(input))
    detail::record("gelu", {input}, {out}, {input}, [tanh_form](const detail::BackwardContext& c) {
      const Tensor &g = c.grad(), &x = c.saved(0);
      if (tanh_form) {
        const double k = 0.7978845608028654;  // sqrt(2 / pi)
        Tensor t = tanh((x + x * x * x * 0.044715) * k);
        Tensor inner_grad = (x * x * (3 * 0.044715) + 1) * k;
        return std::vector<Tensor>{g * ((t + 1) * 0.5 + x * 0.5 * (1 - t * t) * inner_grad)};
      }
      // Phi(x) + x phi(x): the normal CDF and density.
      Tensor cdf = (erf(x * 0.7071067811865476) + 1) * 0.5;
      Tensor pdf = exp(x * x * -0.5) * 0.3989422804014327;  // 1 / sqrt(2 pi)
      return std::vector<Tensor>{g * (cdf + x * pdf)};
    });
  return out;
}

static detail::OpHandle softplus_def;
static void register_softplus() {
  softplus_def.bind(def_op(
      "softplus", OpKind::Unary, 1, DTypeRule::Float, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{softplus(in[0], detail::attr_double(a.at(0)), detail::attr_double(a.at(1)))};
      },
      {"beta", "threshold"}, nullptr,
      "(let bx (mul a0 x) (select (gt bx a1) x (div (log1p (exp bx)) a0)))"));
}
Tensor softplus(const Tensor& input, double beta, double threshold) {
  Tensor out = detail::unary_op<DTypeRule::Float>(
      softplus_def, input,
      [beta, threshold](auto x) {
        using T = decltype(x);
        T bx = T(beta) * x;
        return bx > T(threshold) ? x : T(log1p_value(exp_value(bx)) / T(beta));
      },
      {beta, threshold});
  if (detail::needs_grad(input))
    detail::record("softplus", {input}, {out}, {input},
                   [beta, threshold](const detail::BackwardContext& c) {
                     const Tensor &g = c.grad(), &x = c.saved(0);
                     Tensor bx = x * beta;
                     return std::vector<Tensor>{where(gt(bx, threshold), g, g * sigmoid(bx))};
                   });
  return out;
}

// ------------------------------------------------------------------------------------ binary ops
namespace {
// The operands a binary op's node saves: those that the gradients of the operands requiring grad
// read (grad_a_reads and grad_b_reads name a as X and b as Y), as torch saves them. An operand
// saved for nothing could not be written in place before the backward.
std::vector<Tensor> saved_for(Saves grad_a_reads, Saves grad_b_reads, const Tensor& a,
                              const Tensor& b) {
  const bool ga = detail::requires_grad(a), gb = detail::requires_grad(b);
  auto reads = [](Saves s, Saves which) { return s == which || s == Saves::XY; };
  bool sa = (ga && reads(grad_a_reads, Saves::X)) || (gb && reads(grad_b_reads, Saves::X));
  bool sb = (ga && reads(grad_a_reads, Saves::Y)) || (gb && reads(grad_b_reads, Saves::Y));
  return {sa ? a : Tensor(), sb ? b : Tensor()};
}
}  // namespace

// KILN_BINARY(name, rule, supports_bool, scalar expression of x and y of type T, gradient
// expressions for a and b in the tensors g, a and b (Tensor() for none), each with the operands
// it reads: X for a, Y for b)
// KILN_BINARY_MATH: the same, for an expression that also computes blocks of lanes (see
// KILN_UNARY_MATH).
#define KILN_BINARY(NAME, RULE, BOOL_OK, EXPR, FORMULA, GRAD_A, A_READS, GRAD_B, B_READS) \
  KILN_BINARY_OP(NAME, RULE, BOOL_OK, EXPR, FORMULA, GRAD_A, A_READS, GRAD_B, B_READS, )
#define KILN_BINARY_MATH(NAME, RULE, BOOL_OK, EXPR, FORMULA, GRAD_A, A_READS, GRAD_B, B_READS) \
  KILN_BINARY_OP(NAME, RULE, BOOL_OK, EXPR, FORMULA, GRAD_A, A_READS, GRAD_B, B_READS,         \
                 detail::lanewise)
#define KILN_BINARY_OP(NAME, RULE, BOOL_OK, EXPR, FORMULA, GRAD_A, A_READS, GRAD_B, B_READS, WRAP) \
  static const auto NAME##_fn = WRAP([](auto x, auto y) {                                          \
    using T = decltype(x);                                                                         \
    (void)sizeof(T);                                                                               \
    return EXPR;                                                                                   \
  });                                                                                              \
  static detail::OpHandle NAME##_def;                                                              \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                                  \
    Tensor out = detail::binary_op<RULE>(NAME##_def, a, b, NAME##_fn);                             \
    if (detail::needs_grad(a, b))                                                                  \
      detail::record(#NAME, {a, b}, {out}, saved_for(Saves::A_READS, Saves::B_READS, a, b),        \
                     [](const detail::BackwardContext& c) {                                        \
                       const Tensor &g = c.grad(), &a = c.saved(0), &b = c.saved(1);               \
                       (void)g, (void)a, (void)b;                                                  \
                       return std::vector<Tensor>{c.needs_grad(0) ? Tensor(GRAD_A) : Tensor(),     \
                                                  c.needs_grad(1) ? Tensor(GRAD_B) : Tensor()};    \
                     });                                                                           \
    return out;                                                                                    \
  }                                                                                                \
  Tensor NAME(const Tensor& a, const Scalar& b) {                                                  \
    return NAME(a, wrap_scalar(b));                                                                \
  }

namespace {
// The gradient of maximum/minimum that goes to one operand, as torch's: exactly 0 where it loses
// (even where g is inf or NaN), half of g where they tie, all of g otherwise, so where either
// operand is NaN (the result is NaN, neither loses nor ties) both get all of it.
Tensor share(const Tensor& g, const Tensor& loses, const Tensor& a, const Tensor& b) {
  return where(logical_not(loses), where(eq(a, b), g * 0.5, g), 0.0);
}
}  // namespace

#include "lib/ops/binary_ops.inc"
#undef KILN_BINARY
#undef KILN_BINARY_MATH
#undef KILN_BINARY_OP

namespace {
// Calls use(f) with the scalar formula of a + alpha * b (of a - alpha * b for sub).
template <typename Use>
decltype(auto) with_add_formula(bool is_sub, const Scalar& alpha, const Use& use) {
  // Integers wrap; on bool, wrap_add is plain + (or) and wrap_mul plain * (and).
  if (alpha.to_double() == 1.0 && alpha.to_int() == 1) {
    if (is_sub) return use([](auto x, auto y) { return wrap_sub(x, y); });
    return use([](auto x, auto y) { return wrap_add(x, y); });
  }
  double ad = is_sub ? -alpha.to_double() : alpha.to_double();
  int64_t ai = is_sub ? wrap_neg(alpha.to_int()) : alpha.to_int();
  return use([ad, ai](auto x, auto y) {
    using T = decltype(x);
    if constexpr (kIsFloat<T>)
      return T(x + T(ad) * y);
    else
      return wrap_add(x, wrap_mul(static_cast<T>(ai), y));
  });
}

template <bool IsSub>
void add_into(const Tensor& out, const Tensor* in, const Attrs& attrs);
}  // namespace

// add and sub carry alpha: a + alpha * b.
static detail::OpHandle add_def;
static void register_add() {
  add_def.bind(def_op(
      "add", OpKind::Binary, 2, DTypeRule::Same, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{add(in[0], in[1], detail::attr_scalar(a.at(0)))};
      },
      {"alpha"}, add_into<false>, "(add x (mul a0 y))"));
}
static detail::OpHandle sub_def;
static void register_sub() {
  sub_def.bind(def_op(
      "sub", OpKind::Binary, 2, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{sub(in[0], in[1], detail::attr_scalar(a.at(0)))};
      },
      // With the default alpha (1) the kernel subtracts y itself (1 * y is y, bit for bit), so
      // that x minus its row's max is seen as such (its exp is the primitive for arguments at
      // most 0: fuser/kernel.cpp).
      {"alpha"}, add_into<true>, "(if-attr a0 1 (sub x y) (sub x (mul a0 y)))"));
}

namespace {
template <bool IsSub>
void add_into(const Tensor& out, const Tensor* in, const Attrs& attrs) {
  with_add_formula(IsSub, detail::attr_scalar(attrs.at(0)), [&](const auto& f) {
    detail::binary_into<DTypeRule::Same>(IsSub ? sub_def : add_def, f, out, in[0], in[1]);
  });
}

Tensor add_impl(const detail::OpDef& def, const Tensor& a, const Tensor& b, const Scalar& alpha,
                Tensor* inplace) {
  detail::check_defined(a, def.name.c_str());
  detail::check_defined(b, def.name.c_str(), "other");
  DType common = detail::result_type(a, b);
  KILN_CHECK(!(is_integral(common, true) && alpha.is_floating_point()), def.name,
             ": for integral inputs, alpha must not be a floating-point number (got ", alpha,
             " with ", detail::describe(a), " and ", detail::describe(b), ")");
  Attrs attrs{detail::scalar_attr(alpha)};
  return with_add_formula(&def == &sub_def.get(), alpha, [&](const auto& f) {
    return detail::binary_op<DTypeRule::Same>(def, a, b, f, inplace, attrs);
  });
}
}  // namespace

// d(a + alpha b) = (g, alpha g); sub negates alpha.
Tensor add_with_grad(const detail::OpDef& def, const Tensor& a, const Tensor& b,
                     const Scalar& alpha) {
  Tensor out = add_impl(def, a, b, alpha, nullptr);
  if (detail::needs_grad(a, b)) {
    double scale = (&def == &sub_def.get() ? -1.0 : 1.0) * alpha.to_double();
    detail::record(def.name.c_str(), {a, b}, {out}, {}, [scale](const detail::BackwardContext& c) {
      const Tensor& g = c.grad();
      return std::vector<Tensor>{g, c.needs_grad(1) ? (scale == 1.0 ? g : g * scale) : Tensor()};
    });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  return add_with_grad(add_def, a, b, alpha);
}
Tensor add(const Tensor& a, const Scalar& b) {
  return add(a, wrap_scalar(b));
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  return add_with_grad(sub_def, a, b, alpha);
}
Tensor sub(const Tensor& a, const Scalar& b) {
  return sub(a, wrap_scalar(b));
}

namespace {
// C's fmod for floats, % for integers (0 for a divisor of -1: the lowest integer % -1 would
// overflow, and trap).
template <typename T>
T fmod_value(T x, T y) {
  if constexpr (kIsFloat<T>)
    return std::fmod(x, y);
  else
    return T(x % (y == T(-1) ? T(1) : y));
}
// remainder and fmod, a - div(a, b, rounding) * b: b's gradient is -g div(a, b, rounding).
template <typename F>
Tensor remainder_op(const detail::OpHandle& def, const char* name, const char* rounding,
                    const Tensor& a, const Tensor& b, F fn) {
  detail::check_defined(a, name);
  detail::check_defined(b, name, "other");
  check_no_zero_divisor(name, a, b, detail::result_type({a, b}));
  Tensor out = detail::binary_op<DTypeRule::Same>(def, a, b, fn);
  if (detail::needs_grad(a, b))
    detail::record(name, {a, b}, {out}, saved_for(Saves::None, Saves::XY, a, b),
                   [rounding](const detail::BackwardContext& c) {
                     const Tensor& g = c.grad();
                     return std::vector<Tensor>{g, c.needs_grad(1)
                                                       ? -g * div(c.saved(0), c.saved(1), rounding)
                                                       : Tensor()};
                   });
  return out;
}
}  // namespace

// remainder: Python's modulo, with the divisor's sign.
static detail::OpHandle remainder_def;
static void register_remainder() {
  remainder_def.bind(def_op(
      "remainder", OpKind::Binary, 2, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs&) { return Inputs{remainder(in[0], in[1])}; }, {}, nullptr,
      // rem: fmod for floats, % for integers (0 for a divisor of -1). Integer divisors are checked
      // for zeros by the entry point, so only floating remainders fuse.
      "(let r (rem x y) (select (and (ne r 0) (ne (lt r 0) (lt y 0))) (add r y) r))",
      /*checks_integer_values=*/true));
}
Tensor remainder(const Tensor& a, const Tensor& b) {
  return remainder_op(remainder_def, "remainder", "floor", a, b, [](auto x, auto y) {
    using T = decltype(x);
    const T r = fmod_value(x, y);
    return r != T(0) && ((r < T(0)) != (y < T(0))) ? T(r + y) : r;
  });
}
Tensor remainder(const Tensor& a, const Scalar& b) {
  return remainder(a, wrap_scalar(b));
}

// fmod: C's remainder, with the dividend's sign.
static detail::OpHandle fmod_def;
static void register_fmod() {
  fmod_def.bind(def_op(
      "fmod", OpKind::Binary, 2, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs&) { return Inputs{fmod(in[0], in[1])}; }, {}, nullptr,
      "(rem x y)", /*checks_integer_values=*/true));
}
Tensor fmod(const Tensor& a, const Tensor& b) {
  return remainder_op(fmod_def, "fmod", "trunc", a, b,
                      [](auto x, auto y) { return fmod_value(x, y); });
}
Tensor fmod(const Tensor& a, const Scalar& b) {
  return fmod(a, wrap_scalar(b));
}

// ------------------------------------------------------------------ division with a rounding mode
namespace {
// The quotient rounded toward zero. An integer divisor of -1 negates with wraparound (the lowest
// integer / -1 would overflow, and trap).
template <typename T>
T truncated_quotient(T x, T y) {
  if constexpr (kIsFloat<T>)
    return std::trunc(x / y);
  else
    return y == T(-1) ? detail::wrap_neg(x) : T(x / y);
}
// The quotient rounded toward -inf: Python's //, consistent with remainder (a == (a // b) * b +
// remainder(a, b) up to rounding). Floats divide a - fmod(a, b), a multiple of b, so the rounding
// of a / b cannot move the result past an integer; a zero b gives a / b; a zero quotient takes the
// sign of a / b (0 * (a / b): a / b is finite there).
template <typename T>
T floored_quotient(T x, T y) {
  if constexpr (kIsFloat<T>) {
    if (y == T(0)) return x / y;
    const T m = std::fmod(x, y);
    T d = (x - m) / y;
    if (m != T(0) && ((m < T(0)) != (y < T(0)))) d = d - T(1);
    if (d == T(0)) return T(0) * (x / y);
    const T f = std::floor(d);
    return d - f > T(0.5) ? T(f + T(1)) : f;
  } else {
    const T q = truncated_quotient(x, y);
    const bool inexact = y != T(-1) && x % y != T(0);
    return inexact && ((x < T(0)) != (y < T(0))) ? T(q - T(1)) : q;
  }
}
}  // namespace

static detail::OpHandle div_trunc_def, div_floor_def;
static void register_rounded_div() {
  div_trunc_def.bind(def_op(
      "div_trunc", OpKind::Binary, 2, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs&) { return Inputs{div(in[0], in[1], "trunc")}; }, {},
      nullptr, "(let q (div x y) (select (lt q 0) (ceil q) (floor q)))",
      /*checks_integer_values=*/true));
  div_floor_def.bind(def_op(
      "div_floor", OpKind::Binary, 2, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs&) { return Inputs{div(in[0], in[1], "floor")}; }, {},
      nullptr,
      "(select (eq y 0) (div x y)"
      " (let m (rem x y)"
      "  (let e (div (sub x m) y)"
      "   (let d (select (and (ne m 0) (ne (lt m 0) (lt y 0))) (sub e 1) e)"
      "    (let f (floor d)"
      "     (select (eq d 0) (mul 0 (div x y)) (select (gt (sub d f) 0.5) (add f 1) f)))))))",
      /*checks_integer_values=*/true));
}
namespace {
// The quotient of `name`'s operands rounded by `fn`; a piecewise constant, so its gradient is 0.
template <typename F>
Tensor rounded_div(const detail::OpHandle& def, const char* name, const Tensor& a, const Tensor& b,
                   F fn) {
  check_no_zero_divisor(name, a, b, detail::result_type({a, b}));
  Tensor out = detail::binary_op<DTypeRule::Same>(def, a, b, fn);
  if (detail::needs_grad(a, b))
    detail::record(name, {a, b}, {out}, saved_for(Saves::None, Saves::None, a, b),
                   [](const detail::BackwardContext& c) {
                     Tensor zero = zeros_like(c.grad());
                     return std::vector<Tensor>{c.needs_grad(0) ? zero : Tensor(),
                                                c.needs_grad(1) ? zero : Tensor()};
                   });
  return out;
}
}  // namespace
Tensor div(const Tensor& a, const Tensor& b, std::optional<std::string_view> rounding_mode) {
  detail::check_defined(a, "div");
  detail::check_defined(b, "div", "other");
  if (!rounding_mode) return div(a, b);
  if (*rounding_mode == "trunc")
    return rounded_div(div_trunc_def, "div_trunc", a, b,
                       [](auto x, auto y) { return truncated_quotient(x, y); });
  KILN_CHECK(*rounding_mode == "floor",
             "div: rounding_mode must be \"trunc\", \"floor\" or std::nullopt, got \"",
             *rounding_mode, "\" (a ", detail::describe(a), ", b ", detail::describe(b), ")");
  return rounded_div(div_floor_def, "div_floor", a, b,
                     [](auto x, auto y) { return floored_quotient(x, y); });
}
Tensor div(const Tensor& a, const Scalar& b, std::optional<std::string_view> rounding_mode) {
  return div(a, wrap_scalar(b), rounding_mode);
}
Tensor floor_divide(const Tensor& a, const Tensor& b) {
  return div(a, b, "floor");
}
Tensor floor_divide(const Tensor& a, const Scalar& b) {
  return floor_divide(a, wrap_scalar(b));
}

static detail::OpHandle pow_def;
static void register_pow() {
  pow_def.bind(def_op(
      "pow", OpKind::Binary, 2, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs&) { return Inputs{pow(in[0], in[1])}; }, {}, nullptr,
      "(pow x y)",  // the primitive is pow_value above
      /*checks_integer_values=*/true));
}
Tensor pow(const Tensor& base, const Tensor& exponent) {
  detail::check_defined(base, "pow");
  detail::check_defined(exponent, "pow", "exponent");
  DType common = detail::result_type({base, exponent});
  if (is_integral(common) && exponent.dtype() != kBool) {
    KILN_CHECK(!kiln::lt(exponent, 0).any().item<bool>(),
               "pow: integers to negative integer powers are not allowed (base ",
               detail::describe(base), ", exponent ", detail::describe(exponent), ")");
  }
  Tensor out = detail::binary_op<DTypeRule::Same>(pow_def, base, exponent,
                                                  [](auto x, auto y) { return pow_value(x, y); });
  // d/da = b a^(b-1) (0 where b = 0); d/db = a^b log(a) (0 where a = 0 and b >= 0: a NaN b is
  // not, so its gradient is NaN), as torch,
  // whose exponent gradient multiplies g by the masked derivative (an infinite g gives NaN where
  // the mask gives 0), and whose base gradient masks g's product. log(a) is taken in the result's
  // dtype: an integral base (pow(3, x)) would take it in float32.
  // The base's gradient multiplies g last, as torch's: b a^(b-1) may overflow where g b a^(b-1)
  // would not. The output is saved only for the exponent's gradient: x ** 2 may then be written
  // in place.
  if (detail::needs_grad(base, exponent))
    detail::record("pow", {base, exponent}, {out},
                   {base, exponent, detail::requires_grad(exponent) ? out : Tensor()},
                   [](const detail::BackwardContext& c) {
                     const Tensor &g = c.grad(), &a = c.saved(0), &b = c.saved(1), &y = c.saved(2);
                     std::vector<Tensor> grads(2);
                     if (c.needs_grad(0)) grads[0] = where(ne(b, 0), g * (b * pow(a, b - 1)), 0.0);
                     if (c.needs_grad(1))
                       grads[1] = g * where(logical_not(logical_and(eq(a, 0), ge(b, 0))),
                                            y * log(a.to(y.dtype())), 0.0);
                     return grads;
                   });
  return out;
}
Tensor pow(const Tensor& base, const Scalar& exponent) {
  return pow(base, wrap_scalar(exponent));
}
Tensor pow(const Scalar& base, const Tensor& exponent) {
  return pow(wrap_scalar(base), exponent);
}

// ----------------------------------------------------------------------------------- where, clamp
static detail::OpHandle where_def;
static void register_where() {
  where_def.bind(def_op(
      "where", OpKind::Ternary, 3, DTypeRule::Custom, true,
      [](const Inputs& in, const Attrs&) { return Inputs{where(in[0], in[1], in[2])}; }, {},
      nullptr, "(select x y z)"));
}
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&condition, &a, &b})
    detail::check_elementwise_input(where_def, *t, "input");
  KILN_CHECK(condition.dtype() == kBool, "where: expected condition to be a bool tensor, got ",
             detail::describe(condition));
  Shape shape = detail::broadcast_shapes(
      detail::broadcast_shapes(condition.sizes(), a.sizes(), "where"), b.sizes(), "where");
  DType common = detail::result_type({a, b});
  Tensor out;
  if (detail::should_record({condition, a, b})) {
    out = detail::lazy_record1(where_def, {condition, a, b}, {}, {shape, common});
  } else {
    Tensor ta = a.to(common), tb = b.to(common);
    out = detail::make_empty(shape, common);
    detail::dispatch_all(common, [&](auto tag) {
      using T = KILN_TYPE(tag);
      detail::map_kernel<T, bool, T, T>([](bool c, T x, T y) { return c ? x : y; }, out, condition,
                                        ta, tb);
    });
  }
  if (detail::needs_grad(a, b))
    detail::record(
        "where", {condition, a, b}, {out}, {condition}, [](const detail::BackwardContext& c) {
          const Tensor &g = c.grad(), &cond = c.saved(0);
          return std::vector<Tensor>{Tensor(), c.needs_grad(1) ? where(cond, g, 0.0) : Tensor(),
                                     c.needs_grad(2) ? where(logical_not(cond), g, 0.0) : Tensor()};
        });
  return out;
}
Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b) {
  return where(condition, a, wrap_scalar(b));
}

namespace {
std::optional<Scalar> optional_scalar(const detail::AttrValue& a) {
  if (std::holds_alternative<std::monostate>(a)) return std::nullopt;
  return detail::attr_scalar(a);
}
detail::AttrValue optional_attr(const std::optional<Scalar>& s) {
  return s ? detail::scalar_attr(*s) : detail::AttrValue{};
}
}  // namespace

static detail::OpHandle clamp_def;
static void register_clamp() {
  clamp_def.bind(def_op(
      "clamp", OpKind::Unary, 1, DTypeRule::Same, false,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{clamp(in[0], optional_scalar(a.at(0)), optional_scalar(a.at(1)))};
      },
      {"min", "max"}, nullptr,
      // An absent bound (none) leaves the value as it is; a NaN bound makes every result NaN.
      "(let lo (if-attr a0 none x (select (or (lt x a0) (ne a0 a0)) a0 x))"
      " (if-attr a1 none lo (select (or (gt lo a1) (ne a1 a1)) a1 lo)))"));
}
namespace detail {
void check_value_fits(const char* op, const Scalar& value, DType dtype, const Tensor& t) {
  if (!is_integral(dtype)) return;
  const double lowest = dtype == kInt32 ? -2147483648.0 : -9223372036854775808.0;
  bool fits;
  if (value.is_floating_point()) {
    const double v = value.to_double();
    fits = v >= lowest && v < -lowest;  // false for NaN
  } else {
    const int64_t v = value.to_int();
    fits = dtype == kInt64 ||
           (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max());
  }
  KILN_CHECK(fits, op, ": value ",
             value.is_floating_point() ? std::to_string(value.to_double())
                                       : std::to_string(value.to_int()),
             " cannot be converted to ", dtype, " without overflow (", describe(t), ")");
}
}  // namespace detail

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  detail::check_elementwise_input(clamp_def, x, "input");
  KILN_CHECK(min || max, "clamp: at least one of 'min' or 'max' must be given");
  std::vector<Tensor> operands{x};
  if (min) operands.push_back(wrap_scalar(*min));
  if (max) operands.push_back(wrap_scalar(*max));
  DType common = detail::result_type(operands);
  for (const auto& bound : {min, max})
    if (bound) detail::check_value_fits("clamp", *bound, common, x);
  Tensor out;
  if (detail::should_record(x))
    out = detail::lazy_record1(clamp_def, {x}, {optional_attr(min), optional_attr(max)},
                               {x.sizes(), common});
  else
    out = detail::make_empty(x.sizes(), common);
  if (!detail::is_pending(out))
    detail::dispatch_numeric(common, "clamp", [&](auto tag) {
      using T = KILN_TYPE(tag);
      T lo = min ? min->to<T>() : std::numeric_limits<T>::lowest();
      T hi = max ? max->to<T>() : std::numeric_limits<T>::max();
      bool has_lo = min.has_value(), has_hi = max.has_value();
      detail::map_kernel<T, T>(
          // A NaN value passes through (it compares false); a NaN bound is the result, as
          // torch's clamp fills the result with NaN when either bound is NaN.
          [=](T v) {
            if (has_lo && (v < lo || lo != lo)) v = lo;
            if (has_hi && (v > hi || hi != hi)) v = hi;
            return v;
          },
          out, x.to(common));
    });
  // The gradient passes where x lies within the bounds (NaN does not).
  if (detail::needs_grad(x))
    detail::record("clamp", {x}, {out}, {x}, [min, max](const detail::BackwardContext& c) {
      const Tensor& x = c.saved(0);
      Tensor inside = min ? ge(x, *min) : ones_like(x).to(kBool);
      if (max) inside = logical_and(inside, le(x, *max));
      return std::vector<Tensor>{where(inside, c.grad(), 0.0)};
    });
  return out;
}

// ---------------------------------------------------------------------------------- in-place ops
// Without autograd each writes straight into self; with it, see detail::apply_inplace.
Tensor& Tensor::add_(const Tensor& other, const Scalar& alpha) {
  detail::apply_inplace(
      *this, "add_", {&other}, false, [&] { add_impl(add_def, *this, other, alpha, this); },
      [&](const Tensor& self) { return kiln::add(self, other, alpha); });
  return *this;
}
Tensor& Tensor::add_(const Scalar& other) {
  return add_(wrap_scalar(other));
}
Tensor& Tensor::sub_(const Tensor& other, const Scalar& alpha) {
  detail::apply_inplace(
      *this, "sub_", {&other}, false, [&] { add_impl(sub_def, *this, other, alpha, this); },
      [&](const Tensor& self) { return kiln::sub(self, other, alpha); });
  return *this;
}
Tensor& Tensor::sub_(const Scalar& other) {
  return sub_(wrap_scalar(other));
}
Tensor& Tensor::mul_(const Tensor& other) {
  detail::apply_inplace(
      *this, "mul_", {&other}, true,
      [&] { detail::binary_op<DTypeRule::Same>(mul_def, *this, other, mul_fn, this); },
      [&](const Tensor& self) { return kiln::mul(self, other); });
  return *this;
}
Tensor& Tensor::mul_(const Scalar& other) {
  return mul_(wrap_scalar(other));
}
Tensor& Tensor::div_(const Tensor& other) {
  detail::apply_inplace(
      *this, "div_", {&other}, true,
      [&] { detail::binary_op<DTypeRule::Float>(div_def, *this, other, div_fn, this); },
      [&](const Tensor& self) { return kiln::div(self, other); });
  return *this;
}
Tensor& Tensor::div_(const Scalar& other) {
  return div_(wrap_scalar(other));
}
Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  detail::apply_inplace(
      *this, "clamp_", {}, true,
      [&] { detail::finish_inplace(clamp_def, *this, kiln::clamp(*this, min, max)); },
      [&](const Tensor& self) { return kiln::clamp(self, min, max); });
  return *this;
}

// The table entries of every op above: the rows of unary_ops.inc and binary_ops.inc (whose public
// functions KILN_UNARY and KILN_BINARY defined above), then the ops defined one by one.
void registration::register_elementwise_ops() {
#define KILN_UNARY(NAME, RULE, BOOL_OK, EXPR, FORMULA, SAVES, GRAD)           \
  NAME##_def.bind(def_op(                                                     \
      #NAME, OpKind::Unary, 1, RULE, BOOL_OK,                                 \
      [](const Inputs& in, const Attrs&) { return Inputs{NAME(in[0])}; }, {}, \
      [](const Tensor& out, const Tensor* in, const Attrs&) {                 \
        detail::unary_into<RULE>(NAME##_def, NAME##_fn, out, in[0]);          \
      },                                                                      \
      FORMULA));
#define KILN_UNARY_MATH KILN_UNARY
#include "lib/ops/unary_ops.inc"
#undef KILN_UNARY
#undef KILN_UNARY_MATH
#undef KILN_UNARY_SPECIAL
#define KILN_BINARY(NAME, RULE, BOOL_OK, EXPR, FORMULA, GRAD_A, A_READS, GRAD_B, B_READS) \
  NAME##_def.bind(def_op(                                                                 \
      #NAME, OpKind::Binary, 2, RULE, BOOL_OK,                                            \
      [](const Inputs& in, const Attrs&) { return Inputs{NAME(in[0], in[1])}; }, {},      \
      [](const Tensor& out, const Tensor* in, const Attrs&) {                             \
        detail::binary_into<RULE>(NAME##_def, NAME##_fn, out, in[0], in[1]);              \
      },                                                                                  \
      FORMULA));
#define KILN_BINARY_MATH KILN_BINARY
#include "lib/ops/binary_ops.inc"
#undef KILN_BINARY
#undef KILN_BINARY_MATH
  register_gelu();
  register_softplus();
  register_add();
  register_sub();
  register_remainder();
  register_fmod();
  register_rounded_div();
  register_pow();
  register_where();
  register_clamp();
}

}  // namespace kiln
