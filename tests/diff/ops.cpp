// The op table of the differential tester (see ops.h): picks and expressions.
#include "tests/diff/ops.h"

#include <cmath>

namespace kiln_diff {
namespace {

using Kind = Params::ScalarKind;

template <typename S>
S make_scalar(const Params& p, size_t k) {
  double v = p.scalars.at(k);
  switch (p.scalar_kind) {
    case Kind::Int:
      return S(kiln::detail::float_to_int<int64_t>(v));  // defined for any double
    case Kind::Bool:
      return S(v != 0);
    case Kind::Float:
      break;
  }
  return S(v);
}

Shape sizes(const torch::Tensor& t) {
  return t.sizes().vec();
}
int64_t rank(const torch::Tensor& t) {
  return t.dim();
}
bool is_float(const torch::Tensor& t) {
  return t.is_floating_point();
}
bool broadcasts(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}
// The dim `d` of a rank-r tensor counted from 0.
int64_t wrap(int64_t d, int64_t r) {
  return d < 0 ? d + std::max<int64_t>(r, 1) : d;
}

const torch::Tensor& arg(Gen& g, const Step& s, size_t k) {
  for (size_t i = 0; i < g.ids.size(); ++i)
    if (g.ids[i] == s.args[k]) return g.values[i];
  throw std::logic_error("unknown value");
}
bool any(const torch::Tensor&) {
  return true;
}
bool one_value(Gen& g, Step& s, bool (*pred)(const torch::Tensor&)) {
  int a = g.pick(pred);
  if (a < 0) return false;
  s.args = {g.id(a)};
  return true;
}
bool unary(Gen& g, Step& s) {
  return one_value(g, s, any);
}
// Activations of floating inputs (libtorch's raise for integers, as kiln's do).
bool float_unary(Gen& g, Step& s) {
  return one_value(g, s, is_float);
}
// Nor, for elu, selu and hardswish, an operand holding NaN (deliberate difference): libtorch's
// gradient there is NaN in its vectorized loop and finite in its scalar one (the tail of a row),
// kiln's always NaN.
bool float_unary_no_nan(Gen& g, Step& s) {
  return float_unary(g, s) && !torch::isnan(arg(g, s, 0)).any().item<bool>();
}
// Also for hardtanh, relu6, softshrink and hardshrink (deliberate difference): at NaN libtorch's
// gradient is g in its scalar loop and 0 in its vectorized one, kiln's g; libtorch 1.13's
// softshrink of NaN is 0, kiln's NaN (as libtorch 2's).
// Nor, for elu and selu, -0 (deliberate difference): kiln's is expm1(-0) = -0, as libtorch's
// vectorized loop gives; its scalar loop computes exp(x) - 1 = +0, whose sign rsqrt reads.
bool holds_negative_zero(const torch::Tensor& x) {
  return is_float(x) && torch::logical_and(x == 0, torch::signbit(x)).any().item<bool>();
}
bool elu_pick(Gen& g, Step& s) {
  return float_unary_no_nan(g, s) && !holds_negative_zero(arg(g, s, 0));
}
// Nor logit of -0 (deliberate difference): libtorch 1.13's gradient there is g * inf in its
// scalar loop (its formula's case for 0) and g / (x (1 - x)) = -g * inf in its vectorized one;
// kiln's is g * inf.
// Nor, after inexact steps, values within 1e-3 of 0 or 1 (ill-conditioned, not a difference):
// logit's condition number there is past 1000, so an ulp of a layer_norm before it moves the
// result by 0.02% (seed 7602422491815490781).
bool inexact_so_far(const Gen& g);
bool logit_conditioned(const Gen& g, const torch::Tensor& x) {
  if (!is_float(x) || !inexact_so_far(g) || x.numel() == 0) return true;
  const torch::Tensor v = x.detach().to(torch::kFloat64);
  return !torch::logical_or(v.abs() < 1e-3, (1 - v).abs() < 1e-3).any().item<bool>();
}
bool logit_pick(Gen& g, Step& s) {
  return unary(g, s) && !holds_negative_zero(arg(g, s, 0)) && logit_conditioned(g, arg(g, s, 0));
}
// Nor, with eps, NaN (deliberate difference): libtorch 1.13's gradient there is NaN in its scalar
// loop and 0 in its vectorized one; kiln's NaN.
bool logit_eps_pick(Gen& g, Step& s) {
  return unary(g, s) &&
         !(is_float(arg(g, s, 0)) && torch::isnan(arg(g, s, 0)).any().item<bool>()) &&
         logit_conditioned(g, arg(g, s, 0));
}
// A second operand for a: itself, another value that broadcasts with it (rarely one that does
// not), or a new input of a broadcastable shape.
ValueId partner(Gen& g, int a) {
  const Shape shape = sizes(g.value(a));
  int64_t r = g.uniform(0, 99);
  if (r < 10) return g.id(a);
  if (r < 55 || g.inputs_full()) {
    bool any_shape = r < 57;
    return g.id(
        g.pick([&](const torch::Tensor& t) { return any_shape || broadcasts(shape, sizes(t)); }));
  }
  const Shape other = g.broadcastable(shape);
  return g.new_input(other, g.random_dtype());
}
bool binary(Gen& g, Step& s) {
  int a = g.pick(any);
  s.args = {g.id(a), partner(g, a)};
  if (g.coin(0.5)) std::swap(s.args[0], s.args[1]);
  return true;
}
// pow: an integral base to an integral tensor power is skipped, since libtorch rejects negative
// integral exponents only when it meets them in the data.
// Nor a base holding -inf or -0 with an exponent of +-0.5 (deliberate difference): kiln's pow
// takes the square root there (as libtorch's pow with a scalar exponent does), libtorch's pow with
// a tensor exponent calls std::pow (sqrt(-inf) is NaN, pow(-inf, 0.5) inf; the sign of a zero).
double max_finite_abs(const torch::Tensor& t);
double largest(torch::ScalarType t);
bool inexact_so_far(const Gen& g);
bool pow_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto &x = arg(g, s, 0), &y = arg(g, s, 1);
  if (!is_float(x) && !is_float(y)) return false;
  // An integral base to a float64 power (deliberate difference): libtorch's exponent gradient
  // takes the base's log in float32, kiln's in float64.
  if (!is_float(x) && y.scalar_type() == torch::kFloat64) return false;
  if (!is_float(x) || x.numel() == 0 || y.numel() == 0) return true;
  // Nor a base near the largest float to a power from inexact steps: an ulp of the exponent
  // decides between the largest float and inf (seed 16257965877058240451: pow(DBL_MAX, exp(0))).
  if (inexact_so_far(g) && max_finite_abs(x) > largest(x.scalar_type()) / 16) return false;
  const bool negative_zero_or_inf =
      torch::logical_and(torch::signbit(x), torch::logical_or(x == 0, torch::isinf(x)))
          .any()
          .item<bool>();
  return !negative_zero_or_inf || !(torch::abs(y.to(torch::kFloat64)) == 0.5).any().item<bool>();
}
bool with_scalar(Gen& g, Step& s) {
  unary(g, s);
  g.scalar(s.p);
  return true;
}
bool binary_scalar(Gen& g, Step& s) {
  binary(g, s);
  g.scalar(s.p);
  return true;
}

// ---------------------------------------------------------------- deliberate differences
// Operands on which kiln and libtorch deliberately differ (docs/torch-differences.md) are not
// picked: the difference would spread through the rest of the program.

// The largest finite magnitude of a floating tensor (0 when it has none).
double max_finite_abs(const torch::Tensor& t) {
  if (!is_float(t) || t.numel() == 0) return 0;
  torch::Tensor a = t.detach().to(torch::kFloat64).abs();
  return torch::where(torch::isfinite(a), a, torch::zeros_like(a)).max().item<double>();
}
double largest(torch::ScalarType t) {
  return t == torch::kFloat32 ? std::numeric_limits<float>::max()
                              : std::numeric_limits<double>::max();
}
// relu of -0 (deliberate difference): kiln's is +0 (0 is the larger, as in amax), libtorch's
// vectorized clamp returns -0, whose sign a later op (reciprocal) may read.
bool relu_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  return !is_float(x) || !torch::logical_and(x == 0, torch::signbit(x)).any().item<bool>();
}
bool inexact_so_far(const Gen& g);

// sign of a value within rounding of 0 after inexact steps (deliberate difference): a GEMM's or
// a transcendental's ulps may give it either sign (sign(gelu(bmm(...))) of a value that cancels).
bool sign_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  if (!is_float(x) || !inexact_so_far(g) || x.numel() == 0) return true;
  torch::Tensor v = x.detach().to(torch::kFloat64).abs();
  return !torch::logical_and(v > 0, v <= 1e-5 * std::max(1.0, max_finite_abs(x)))
              .any()
              .item<bool>();
}
// A reciprocal (reciprocal, rsqrt, a divisor) of a value within 1e-2 of 0 (relative to the
// tensor's largest magnitude, at least 1) after inexact steps (deliberate difference): such a
// value may be what is left of a cancellation (a GEMM's sum, remainder), whose ulps are the
// operands' and so a large part of it, and the reciprocal is compared relative to itself.
bool near_zero_after_inexact(const Gen& g, const torch::Tensor& x) {
  if (!is_float(x) || !inexact_so_far(g) || x.numel() == 0) return false;
  torch::Tensor v = x.detach().to(torch::kFloat64).abs();
  return torch::logical_and(v > 0, v < 1e-2 * std::max(1.0, max_finite_abs(x))).any().item<bool>();
}
bool reciprocal_pick(Gen& g, Step& s) {
  unary(g, s);
  return !near_zero_after_inexact(g, arg(g, s, 0));
}
bool div_pick(Gen& g, Step& s) {
  binary(g, s);
  return !near_zero_after_inexact(g, arg(g, s, 1));
}
// log of a softmax that underflowed to 0 (deliberate difference): a trace's stabilize pass
// computes log(softmax(x)) as log_softmax(x), finite where eager mode and libtorch give -inf.
bool log_pick(Gen& g, Step& s) {
  unary(g, s);
  // log's gradient is a reciprocal: the rule above (seed 10526324450683679873: log(gelu(bmm(...)))
  // of a gelu near 0.04, gradients 1e-12 apart in float64).
  if (near_zero_after_inexact(g, arg(g, s, 0))) return false;
  const ValueId id = s.args[0];
  if (id < 0 ||
      std::string(
          op_table()[static_cast<size_t>(g.program->steps[static_cast<size_t>(id)].op)].name) !=
          "softmax")
    return true;
  return !(arg(g, s, 0) == 0).any().item<bool>();
}
// Whether x holds a nonzero subnormal value.
bool has_subnormal(const torch::Tensor& x) {
  if (!is_float(x)) return false;
  const double smallest = x.scalar_type() == torch::kFloat32 ? std::numeric_limits<float>::min()
                                                             : std::numeric_limits<double>::min();
  torch::Tensor a = x.detach().abs().to(torch::kFloat64);
  return torch::logical_and(a > 0, a < smallest).any().item<bool>();
}
// sin/cos of values beyond 64 in magnitude after inexact steps (deliberate difference): their
// ulps, which the steps before may have moved (pow magnifies a GEMM's), are past the tolerance of
// a result within [-1, 1] (cos(pow(v, v)) of an addmm result near 6: 46656 +- ulps of 0.004).
bool periodic_pick(Gen& g, Step& s) {
  unary(g, s);
  return !inexact_so_far(g) || max_finite_abs(arg(g, s, 0)) <= 64;
}
// tan of values within 0.05 of a pole (|cos| < 0.05) or beyond 64 in magnitude after inexact
// steps: as for sin and cos, the steps' ulps move the result past the tolerance near a pole. Nor
// a float64 subnormal: libtorch's tan of one is off by ulps, and of the smallest 0, whose sign a
// later op reads (seed 10649857699325035168: clamp(tan(x), max=0)).
bool tan_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  if (x.scalar_type() == torch::kFloat64 && has_subnormal(x)) return false;
  if (!inexact_so_far(g) || !is_float(x) || x.numel() == 0) return true;
  return max_finite_abs(x) <= 64 &&
         !(torch::cos(x.detach().to(torch::kFloat64)).abs() < 0.05).any().item<bool>();
}
// asin, acos, acosh and atanh of values within 1e-2 of +-1 after inexact steps: their gradients
// (1 / sqrt(1 - x^2), ...) are poles there, where the steps' ulps move them past the tolerance.
bool near_one_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  if (!inexact_so_far(g) || !is_float(x) || x.numel() == 0) return true;
  torch::Tensor d = (x.detach().to(torch::kFloat64).abs() - 1).abs();
  return !(d < 1e-2).any().item<bool>();
}
// atan2 of an operand within 1e-2 of 0 after inexact steps: a y that is what is left of a
// cancellation may have either sign (+-pi for a negative x), an x's sign picks the half plane.
bool atan2_pick(Gen& g, Step& s) {
  binary(g, s);
  return !near_zero_after_inexact(g, arg(g, s, 0)) && !near_zero_after_inexact(g, arg(g, s, 1));
}
// gelu of -0 in float32 (deliberate difference): kiln's is -0 (x Phi(x)), as libtorch's scalar
// loop and float64 kernels give; libtorch's float32 vector loop gives +0, whose sign rsqrt reads.
bool gelu_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  return x.scalar_type() != torch::kFloat32 ||
         !torch::logical_and(x == 0, torch::signbit(x)).any().item<bool>();
}
// maximum/minimum where zeros of both signs meet (deliberate difference): kiln's +0 is the greater
// whichever operand holds it (as in amax and relu); libtorch keeps the first operand in its scalar
// loop and the second in its vector loop.
bool extremum_binary_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto &x = arg(g, s, 0), &y = arg(g, s, 1);
  if (!is_float(x) && !is_float(y)) return true;
  if (!broadcasts(sizes(x), sizes(y))) return true;
  torch::Tensor a = x.detach().to(torch::kFloat64), b = y.detach().to(torch::kFloat64);
  return !torch::logical_and(torch::logical_and(a == 0, b == 0),
                             torch::signbit(a) != torch::signbit(b))
              .any()
              .item<bool>();
}
// lgamma and digamma of the non-positive integers (deliberate difference: digamma's gradient
// there, trigamma at a pole, is inf in kiln and a large finite number in libtorch 1.13), and of
// values below 0.05 after inexact steps: their poles and their negative zeros, where the
// reflection formula's cancellation leaves each implementation its own ulps.
bool gamma_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  if (!is_float(x) || x.numel() == 0) return true;
  const torch::Tensor v = x.detach().to(torch::kFloat64);
  if (torch::logical_and(v <= 0, v == torch::trunc(v)).any().item<bool>()) return false;
  return !inexact_so_far(g) || !(v < 0.05).any().item<bool>();
}
// digamma as gamma_pick, not of float64 (deliberate difference): its gradient, libtorch 1.13's
// float64 trigamma, is off by up to about 1e-9 relative (polygamma(1, 0.54835309830223933) is
// 4.2219834048975953; exactly 4.2219834034662288, kiln's within 5 ulps).
// Nor near a pole (deliberate difference): there libtorch's float32 trigamma is off by about 1e-3
// relative (at -2.9998293 its trigamma is 34360988, kiln's 34315776; exactly 34315774.3).
bool digamma_pick(Gen& g, Step& s) {
  if (!gamma_pick(g, s) || arg(g, s, 0).scalar_type() == torch::kFloat64) return false;
  const torch::Tensor v = arg(g, s, 0).detach().to(torch::kFloat64);
  return !torch::logical_and(v < 0.5, (v - torch::round(v)).abs() < 0.01).any().item<bool>();
}
// Whether a step so far computes transcendentals, GEMMs or reductions: its float32 values are
// within ulps of libtorch's, not equal.
bool inexact_so_far(const Gen& g) {
  for (const Step& before : g.program->steps)
    if (op_table()[static_cast<size_t>(before.op)].flags & kInexact) return true;
  return false;
}
// Whether a step so far normalizes (layer_norm): an infinite gradient that comes back to it makes
// its input's gradient NaN in libtorch and infinite in kiln (deliberate difference).
bool normalized_so_far(const Gen& g) {
  for (const Step& before : g.program->steps)
    if (std::string(op_table()[static_cast<size_t>(before.op)].name).rfind("layer_norm", 0) == 0)
      return true;
  return false;
}
bool holds_inf(const torch::Tensor& t) {
  return is_float(t) && torch::isinf(t.detach()).any().item<bool>();
}
// The largest finite magnitude of a tensor of any dtype (0 when it has none or is empty).
double max_magnitude(const torch::Tensor& t) {
  if (t.numel() == 0) return 0;
  torch::Tensor a = t.detach().to(torch::kFloat64).abs();
  return torch::where(torch::isfinite(a), a, torch::zeros_like(a)).max().item<double>();
}
double min_nonzero_abs(const torch::Tensor& t) {
  if (t.numel() == 0) return INFINITY;
  torch::Tensor a = t.detach().to(torch::kFloat64).abs();
  return torch::where(torch::logical_and(a > 0, torch::isfinite(a)), a,
                      torch::full_like(a, INFINITY))
      .min()
      .item<double>();
}
// remainder, fmod and div with a rounding mode. No floating remainder whose quotient overflows
// (deliberate difference): kiln's is exact (fmod), libtorch's vectorized kernel (8 elements or
// more) divides first and gives NaN (remainder(3.4e38f, -0.75f) is 0). A zero or NaN divisor
// gives NaN in both. Nor the lowest integer over -1: libtorch's integral kernels divide it and
// trap (SIGFPE), which would end the run; kiln's remainder is 0, its quotient wraps.
bool traps_in_torch(const torch::Tensor& x, bool divisor_minus_one, torch::ScalarType t) {
  if (!divisor_minus_one || c10::isFloatingType(t) || t == torch::kBool) return false;
  torch::Tensor wide = x.detach().to(torch::kInt64);
  const int64_t lowest = t == torch::kInt32 ? std::numeric_limits<int32_t>::min()
                                            : std::numeric_limits<int64_t>::min();
  return (wide == lowest).any().item<bool>();
}
bool quotient_fits(double dividend, double divisor, torch::ScalarType t) {
  return !c10::isFloatingType(t) || divisor == 0 || !(dividend > largest(t) / 2 * divisor);
}
bool near_integers(const torch::Tensor& x, double offset, bool zero = false);
// Nor a computed dividend within rounding of a multiple of the divisor, 0 included (deliberate
// difference): an ulp either side is 0 or nearly the divisor (remainder(sum(softmax(x)), 1.0)).
bool near_multiple(const torch::Tensor& x, const torch::Tensor& divisor) {
  return near_integers(x.detach().to(torch::kFloat64) / divisor, 0, true);
}
// Nor a dividend far larger than a computed floating divisor (deliberate difference): the divisor
// is within ulps of libtorch's (erf), and fmod magnifies that ulp by the quotient into any value
// in [0, divisor).
bool remainder_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto &x = arg(g, s, 0), &y = arg(g, s, 1);
  const torch::ScalarType t = torch::result_type(x, y);
  if (!quotient_fits(max_magnitude(x), min_nonzero_abs(y), t)) return false;
  if (y.numel() > 0 && traps_in_torch(x, (y.detach() == -1).any().item<bool>(), t)) return false;
  if (!inexact_so_far(g) || !is_float(y) || x.numel() == 0 || y.numel() == 0) return true;
  if (broadcasts(sizes(x), sizes(y)) && near_multiple(x, y.detach().to(torch::kFloat64)))
    return false;
  torch::Tensor ratio = x.detach().to(torch::kFloat64).abs().max() /
                        torch::clamp_min(y.detach().to(torch::kFloat64).abs().min(), 1e-300);
  return !(ratio > 64).item<bool>();
}
// The same for a scalar divisor.
bool remainder_scalar_pick(Gen& g, Step& s) {
  with_scalar(g, s);
  const auto& x = arg(g, s, 0);
  const torch::ScalarType t = torch::result_type(x, T::scalar(s.p, 0));
  if (!quotient_fits(max_magnitude(x), std::abs(s.p.scalars[0]), t)) return false;
  if (traps_in_torch(x, s.p.scalars[0] == -1, t)) return false;
  if (!inexact_so_far(g) || !is_float(x) || x.numel() == 0) return true;
  if (near_multiple(x, torch::tensor(s.p.scalars[0], torch::kFloat64))) return false;
  return max_finite_abs(x) <= 64 * std::abs(s.p.scalars[0]);
}
// A negative base to a computed floating power (deliberate difference): the result is NaN
// unless the power is an integer, which the power's ulps of difference decide. Nor a base of -inf
// or -0 with an exponent of +-0.5 (deliberate difference, as in pow_pick; seed
// 8176622970164757372: pow(-inf, softsign(-1))).
bool scalar_pow_pick(Gen& g, Step& s) {
  with_scalar(g, s);
  const double base = s.p.scalars[0];
  const auto& y = arg(g, s, 0);
  if (base < 0 && is_float(y) && inexact_so_far(g)) return false;
  const bool negative_zero_or_inf = std::signbit(base) && (base == 0 || std::isinf(base));
  return !negative_zero_or_inf || y.numel() == 0 ||
         !(torch::abs(y.to(torch::kFloat64)) == 0.5).any().item<bool>();
}
// log1p near the largest float: libtorch's vectorized log1p overflows to inf there. Nor a float32
// subnormal: kiln's log1p returns it (right), libtorch's 0, whose log a later op takes. Nor
// computed float32 values within 0.01 of -1 (erf of a large negative value): log1p's condition
// number 1 / (1 + x) there turns kiln's ulps of difference into -16.6 vs -inf, or past the
// tolerance.
bool log1p_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  if (max_finite_abs(x) > largest(x.scalar_type()) / 16) return false;
  if (!is_float(x)) return true;
  // Nor a float64 subnormal (libtorch's float64 log1p of one is 0 too).
  if (has_subnormal(x)) return false;
  return x.scalar_type() != torch::kFloat32 || !inexact_so_far(g) ||
         !(x.detach() + 1).abs().le(1e-2).any().item<bool>();
}
// add with alpha: libtorch computes a + alpha * b in one FMA, kiln in two roundings, so where
// alpha * b alone overflows, kiln's sum is infinite and libtorch's may not be.
bool add_alpha_pick(Gen& g, Step& s) {
  binary_scalar(g, s);
  const auto& a = arg(g, s, 0);
  const auto& b = arg(g, s, 1);
  const torch::ScalarType out = torch::result_type(a, b);
  if (!c10::isFloatingType(out)) return true;
  return max_finite_abs(b) * std::abs(s.p.scalars[0]) <= largest(out) / 2;
}
bool where_pick(Gen& g, Step& s) {
  int a = g.pick(any);
  const Shape shape = sizes(g.value(a));
  int c = g.pick([&](const torch::Tensor& t) {
    return t.scalar_type() == torch::kBool && broadcasts(shape, sizes(t));
  });
  ValueId cond = c >= 0 ? g.id(c) : g.new_input(g.broadcastable(shape), kiln::kBool);
  s.args = {cond, g.id(a), partner(g, a)};
  return true;
}
bool where_scalar(Gen& g, Step& s) {
  where_pick(g, s);
  s.args.pop_back();
  g.scalar(s.p);
  return true;
}
bool clamp_pick(Gen& g, Step& s) {
  unary(g, s);
  g.scalar(s.p);
  g.scalar(s.p);
  s.p.scalar_kind = g.coin(0.5) ? Kind::Int : Kind::Float;
  // Integral bounds are finite (converting NaN or inf to an integer is undefined).
  if (s.p.scalar_kind == Kind::Int)
    for (double& v : s.p.scalars)
      if (!std::isfinite(v)) v = 0;
  return true;
}
// One NaN bound (deliberate difference): kiln's result is NaN, libtorch 1.13's the input.
bool clamp_min_pick(Gen& g, Step& s) {
  return clamp_pick(g, s) && !std::isnan(s.p.scalars[0]);
}
bool clamp_max_pick(Gen& g, Step& s) {
  return clamp_pick(g, s) && !std::isnan(s.p.scalars[1]);
}

// ---------------------------------------------------------------- views
bool transpose_pick(Gen& g, Step& s) {
  unary(g, s);
  int64_t r = rank(arg(g, s, 0));
  s.p.i = {g.dim(r), g.dim(r)};
  return true;
}
bool permute_pick(Gen& g, Step& s) {
  unary(g, s);
  int64_t r = rank(arg(g, s, 0));
  s.p.list.resize(static_cast<size_t>(r));
  std::iota(s.p.list.begin(), s.p.list.end(), 0);
  std::shuffle(s.p.list.begin(), s.p.list.end(), g.rng);
  for (auto& d : s.p.list)
    if (g.coin(0.3)) d -= r;
  return true;
}
Shape reshape_target(Gen& g, int64_t n) {
  if (n == 0) return {g.uniform(1, 3), 0};
  if (g.coin(0.25)) return {-1};
  Shape out;
  int64_t rest = n;
  for (int64_t k = g.uniform(0, 2); k > 0; --k) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= rest; ++d)
      if (rest % d == 0) divisors.push_back(d);
    int64_t d = divisors[static_cast<size_t>(g.uniform(0, divisors.size() - 1))];
    out.push_back(d);
    rest /= d;
  }
  out.push_back(rest);
  if (g.coin(0.3)) out[static_cast<size_t>(g.uniform(0, out.size() - 1))] = -1;
  return out;
}
bool reshape_pick(Gen& g, Step& s) {
  unary(g, s);
  s.p.list = reshape_target(g, arg(g, s, 0).numel());
  return true;
}
bool expand_pick(Gen& g, Step& s) {
  unary(g, s);
  Shape shape = sizes(arg(g, s, 0));
  for (auto& d : shape) d = d == 1 ? g.uniform(0, 3) : (g.coin(0.3) ? -1 : d);
  for (int64_t k = g.uniform(0, 1); k > 0; --k) shape.insert(shape.begin(), g.uniform(1, 3));
  s.p.list = shape;
  return true;
}
bool slice_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  int64_t n = rank(x) ? x.size(d) : 0;
  s.p.i = {d, g.uniform(-n - 1, n + 1), g.uniform(-n - 1, n + 1), g.uniform(1, 3)};
  return true;
}
bool select_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; })) return false;
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  int64_t n = x.size(d);
  // Rarely out of range: both must reject it.
  s.p.i = {d, g.coin(0.03) || n == 0 ? n : g.uniform(-n, n - 1)};
  return true;
}
bool narrow_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; })) return false;
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  int64_t n = x.size(d);
  int64_t start = g.uniform(0, n);
  s.p.i = {d, start, g.uniform(0, n - start)};
  return true;
}
bool chunk_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; })) return false;
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  int64_t chunks = g.uniform(1, 3);
  int64_t made = static_cast<int64_t>(x.chunk(chunks, d).size());
  s.p.i = {chunks, d, g.uniform(0, made - 1)};
  return true;
}
bool dim_pick(Gen& g, Step& s) {
  unary(g, s);
  s.p.i = {g.dim(rank(arg(g, s, 0)))};
  return true;
}
bool unsqueeze_pick(Gen& g, Step& s) {
  unary(g, s);
  int64_t r = rank(arg(g, s, 0));
  s.p.i = {g.uniform(-r - 1, r)};
  return true;
}
bool flatten_pick(Gen& g, Step& s) {
  unary(g, s);
  int64_t r = rank(arg(g, s, 0));
  int64_t a = g.dim(r), b = g.dim(r);
  if (wrap(a, r) > wrap(b, r)) std::swap(a, b);
  s.p.i = {a, b};
  return true;
}
bool matrix_pick(Gen& g, Step& s) {
  return one_value(g, s, [](const torch::Tensor& t) { return t.dim() <= 2; });
}

// ---------------------------------------------------------------- in-place writes through views
// Whether elements of t share memory (an expanded value).
bool overlaps_itself(const torch::Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) return true;
  return false;
}
// The written value is computed by the program (never an input or a view of one, which are
// leaves of the gradient), and the write goes through a slice of it. Not a value whose elements
// share memory (open difference): libtorch refuses the write, and kiln's eager and traced modes
// disagree on it.
bool inplace_target(Gen& g, Step& s) {
  std::vector<torch::Tensor> inputs;
  for (size_t i = 0; i < g.ids.size(); ++i)
    if (g.ids[i] < 0) inputs.push_back(g.values[i]);
  std::vector<int> found;
  for (size_t i = 0; i < g.ids.size(); ++i) {
    if (g.ids[i] < 0 || g.values[i].dim() == 0 || overlaps_itself(g.values[i])) continue;
    bool aliased = std::any_of(inputs.begin(), inputs.end(), [&](const torch::Tensor& in) {
      return g.values[i].is_alias_of(in);
    });
    if (!aliased) found.push_back(static_cast<int>(i));
  }
  if (found.empty()) return false;
  int a = found[static_cast<size_t>(g.uniform(0, found.size() - 1))];
  const auto& x = g.value(a);
  int64_t d = g.dim(x.dim());
  int64_t n = x.size(d);
  int64_t start = g.uniform(0, n);
  s.args = {g.id(a)};
  s.p.i = {d, start, g.uniform(start, n), g.uniform(1, 2)};
  return true;
}
bool inplace_scalar(Gen& g, Step& s) {
  if (!inplace_target(g, s)) return false;
  g.scalar(s.p);
  return true;
}
bool inplace_tensor(Gen& g, Step& s) {
  if (g.inputs_full() || !inplace_target(g, s)) return false;
  const auto& x = arg(g, s, 0);
  const Shape region = g.broadcastable(sizes(x.slice(s.p.i[0], s.p.i[1], s.p.i[2], s.p.i[3])));
  s.args.push_back(g.new_input(region, g.random_dtype()));
  return true;
}

// ---------------------------------------------------------------- reductions
void reduce_dims(Gen& g, Step& s) {
  int64_t r = rank(arg(g, s, 0));
  std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(r, 1)));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), g.rng);
  all.resize(static_cast<size_t>(g.uniform(1, static_cast<int64_t>(all.size()))));
  for (auto& d : all)
    if (g.coin(0.3)) d -= std::max<int64_t>(r, 1);
  s.p.list = all;
}
bool reduce_list(Gen& g, Step& s) {
  unary(g, s);
  reduce_dims(g, s);
  s.p.i = {g.uniform(0, 1), g.uniform(0, 1)};  // keepdim; correction (var, std)
  return true;
}
// A float32 value whose sum overflows float32 (deliberate difference): kiln's float sums accumulate
// in float64, so its mean, var and std are finite where libtorch's are inf or NaN. Nor a float64
// value whose partial sums may overflow: the result depends on the order of the steps, which
// differs between libtorch and kiln (-inf in one, NaN where the other meets inf - inf).
bool sum_fits(const torch::Tensor& x) {
  return !is_float(x) ||
         max_finite_abs(x) * static_cast<double>(x.numel()) <= largest(x.scalar_type()) / 2;
}
// Nor a float32 sum whose terms cancel to under 1/64 of their magnitudes (at least 1) along its
// dims (deliberate difference): kiln accumulates float32 sums in float64, libtorch in float32,
// whose rounding of the large terms is then most of the result (seed 14330047239256856414:
// sum(to_float([2, INT32_MAX, 1, INT32_MIN])) is 3 in kiln, 0 in libtorch). `dims`: all if empty.
bool sum_cancels(const torch::Tensor& x, const std::vector<int64_t>& dims) {
  if (x.scalar_type() != torch::kFloat32 || x.numel() == 0) return false;
  torch::Tensor d = x.detach().to(torch::kFloat64);
  d = torch::where(torch::isfinite(d), d, torch::zeros_like(d));
  const torch::Tensor magnitude = dims.empty() ? d.abs().sum() : d.abs().sum(dims);
  const torch::Tensor net = (dims.empty() ? d.sum() : d.sum(dims)).abs();
  return (magnitude > 64 * torch::clamp_min(net, 1)).any().item<bool>();
}
bool sum_pick(Gen& g, Step& s) {
  return reduce_list(g, s) && sum_fits(arg(g, s, 0)) && !sum_cancels(arg(g, s, 0), s.p.list);
}
bool mean_pick(Gen& g, Step& s) {
  return sum_pick(g, s);
}
bool whole_sum_pick(Gen& g, Step& s) {
  return unary(g, s) && sum_fits(arg(g, s, 0)) && !sum_cancels(arg(g, s, 0), {});
}
// var/std over the dim of a 0-dim tensor with correction 1 (deliberate difference): both are
// NaN, and libtorch's gradient is inf where kiln's is NaN.
// OPEN: values whose squares overflow (kiln's compensated two-pass formula gives NaN for inf).
bool var_pick(Gen& g, Step& s) {
  if (!reduce_list(g, s)) return false;
  const auto& x = arg(g, s, 0);
  return !(rank(x) == 0 && s.p.i[1] == 1) && sum_fits(x) && !sum_cancels(x, s.p.list) &&
         (!is_float(x) || max_finite_abs(x) <= std::sqrt(largest(x.scalar_type())) / 16);
}
// Nor std of values equal, or nearly, along its dims (an expanded tensor): its gradient
// (x - mean) / (n std) is then rounding noise over rounding noise, different in every
// implementation. "Nearly" is within 1e-6 of the values' magnitude, or 1e-2 for float32 values
// from inexact steps, whose ulps then move the gradient past the tolerance (seed
// 13183812084889596584: std over rows of layer_norm(sin(x)) of two elements, about +-0.9998 and
// +-0.99998 each, whose spread is 1e-4 of them).
bool std_pick(Gen& g, Step& s) {
  if (!var_pick(g, s)) return false;
  const auto& x = arg(g, s, 0);
  if (!is_float(x) || x.numel() == 0) return true;
  const torch::Tensor d = x.detach().to(torch::kFloat64);
  const torch::Tensor spread =
      at::std(d, at::OptionalIntArrayRef(s.p.list), c10::optional<int64_t>(0), true);
  if (spread.numel() == 0 || d.numel() / spread.numel() <= 1) return true;
  const torch::Tensor scale = torch::where(torch::isfinite(d), d.abs(), torch::zeros_like(d)).max();
  const double nearly = x.scalar_type() == torch::kFloat32 && inexact_so_far(g) ? 1e-2 : 1e-6;
  return !(spread <= scale * nearly).any().item<bool>();
}
// Nor zeros of both signs under amax/amin/max/min (deliberate difference): kiln's +0 is the
// greater, whichever comes first; libtorch keeps the first of equal values (per lane where it
// vectorizes), and a later op (div, reciprocal) reads the sign.
bool zeros_of_both_signs(const torch::Tensor& x) {
  if (!is_float(x)) return false;
  torch::Tensor zero = x.detach() == 0, negative = torch::signbit(x.detach());
  return torch::logical_and(zero, negative).any().item<bool>() &&
         torch::logical_and(zero, torch::logical_not(negative)).any().item<bool>();
}
bool extremum_pick(Gen& g, Step& s) {
  return unary(g, s) && !zeros_of_both_signs(arg(g, s, 0));
}
bool extremum_list_pick(Gen& g, Step& s) {
  return reduce_list(g, s) && !zeros_of_both_signs(arg(g, s, 0));
}
bool reduce_one(Gen& g, Step& s) {
  unary(g, s);
  s.p.i = {g.dim(rank(arg(g, s, 0))), g.uniform(0, 1)};
  return true;
}
// argmax or argmin along a dim whose two extreme values are within 1e-5 of each other (relative
// to the tensor's largest magnitude, at least 1) after inexact steps (deliberate difference): an
// ulp of either side picks the index, and libtorch's vector and scalar loops may round equal
// inputs apart (seed 803950422483397999: argmin of rsqrt of a clamp's ties, equal in kiln).
bool arg_extremum_pick(Gen& g, Step& s, bool largest_first) {
  reduce_one(g, s);
  const auto& x = arg(g, s, 0);
  if (!is_float(x) || !inexact_so_far(g) || x.dim() == 0) return true;
  const int64_t dim = s.p.i[0];
  if (x.size(dim) < 2) return true;
  torch::Tensor top = std::get<0>(x.detach().to(torch::kFloat64).topk(2, dim, largest_first));
  torch::Tensor gap = (top.select(dim, 0) - top.select(dim, 1)).abs();
  return !(gap <= 1e-5 * std::max(1.0, max_finite_abs(x))).any().item<bool>();
}
bool argmax_pick(Gen& g, Step& s) {
  return arg_extremum_pick(g, s, true);
}
bool argmin_pick(Gen& g, Step& s) {
  return arg_extremum_pick(g, s, false);
}
// Nor a prod whose partial products may overflow (the product of the finite magnitudes above 1
// passes half the largest float; deliberate difference): the result then depends on the order of
// the steps, which differs between libtorch, kiln's eager kernel (4 lanes) and its fused ones:
// inf, finite (kiln's float32 product accumulates in float64: {3.4e38, 1.03, -0.24} is -8.6e37
// in kiln, -inf in libtorch), or NaN where inf meets a zero (the gradient's products of the
// others: {1.8e308, 2.8, 1.43, 0}).
// Nor a prod of tiny nonzero values (float32 below 1e-20, float64 below 1e-290): kiln's float32
// product rounds once, libtorch's each step, so a product that underflows may be -0 in kiln and a
// subnormal in libtorch; in float64 the steps' orders differ and a subnormal product keeps few
// bits; the gradient y / x reads either.
bool prod_pick(Gen& g, Step& s) {
  reduce_one(g, s);
  const auto& x = arg(g, s, 0);
  if (!is_float(x)) return true;
  torch::Tensor a = x.detach().abs().to(torch::kFloat64);
  torch::Tensor growth =
      torch::where(torch::isfinite(a), torch::clamp_min(a, 1), torch::ones_like(a));
  if (torch::log(growth).sum().item<double>() > std::log(largest(x.scalar_type()) / 2))
    return false;
  const double tiny = x.scalar_type() == torch::kFloat32 ? 1e-20 : 1e-290;
  return !torch::logical_and(a > 0, a < tiny).any().item<bool>();
}

// ---------------------------------------------------------------- GEMMs
// A floating value of the given rank (rarely any value of it), or a new input.
int gemm_operand(Gen& g, int64_t lo, int64_t hi) {
  bool any_dtype = g.coin(0.05);
  int a = g.pick([&](const torch::Tensor& t) {
    return t.dim() >= lo && t.dim() <= hi && (any_dtype || is_float(t));
  });
  if (a >= 0 || g.inputs_full()) return a;
  Shape shape(static_cast<size_t>(g.uniform(lo, hi)));
  for (auto& d : shape) d = g.uniform(g.coin(0.1) ? 0 : 1, 4);
  g.new_input(shape, g.random_float_dtype());
  return static_cast<int>(g.values.size()) - 1;
}
// Operands whose products may overflow are not multiplied (deliberate difference): oneDNN
// accumulates with FMAs, where a product past the largest float joins the sum unrounded, and
// libtorch's GEMM rounds it to inf first (inf vs NaN, finite vs inf).
// Nor are an empty operand and one of another dtype (deliberate difference): libtorch skips the
// promotion and returns the first operand's dtype.
bool products_fit(const torch::Tensor& a, const torch::Tensor& b) {
  if ((a.numel() == 0 || b.numel() == 0) && a.scalar_type() != b.scalar_type()) return false;
  const torch::ScalarType t = torch::result_type(a, b);
  if (!c10::isFloatingType(t)) return true;
  const double k = static_cast<double>(std::max<int64_t>(1, a.dim() ? a.size(-1) : 1));
  return max_finite_abs(a) * max_finite_abs(b) * k <= largest(t) / 4;
}
kiln::DType partner_dtype(Gen& g, const torch::Tensor& t) {
  return g.coin(0.9) ? to_kiln(t.scalar_type()) : g.random_dtype();
}
bool mm_pick(Gen& g, Step& s) {
  int a = gemm_operand(g, 2, 2);
  if (a < 0 || g.inputs_full()) return false;
  const auto& x = g.value(a);
  const Shape other = {x.size(1), g.uniform(0, 4)};
  s.args = {g.id(a), g.new_input(other, partner_dtype(g, x))};
  return products_fit(arg(g, s, 0), arg(g, s, 1));
}
bool bmm_pick(Gen& g, Step& s) {
  int a = gemm_operand(g, 3, 3);
  if (a < 0 || g.inputs_full()) return false;
  const auto& x = g.value(a);
  const Shape other = {x.size(0), x.size(2), g.uniform(0, 4)};
  s.args = {g.id(a), g.new_input(other, partner_dtype(g, x))};
  return products_fit(arg(g, s, 0), arg(g, s, 1));
}
bool matmul_pick(Gen& g, Step& s) {
  int a = gemm_operand(g, 1, 4);
  if (a < 0 || g.inputs_full()) return false;
  const auto& x = g.value(a);
  int64_t k = x.size(-1);
  Shape other;
  switch (g.uniform(0, 2)) {
    case 0:
      other = {k};
      break;
    case 1:
      other = {k, g.uniform(1, 3)};
      break;
    default: {
      Shape batch = x.dim() > 2 ? Shape(x.sizes().begin(), x.sizes().end() - 2) : Shape{2};
      other = g.broadcastable(batch);
      other.push_back(k);
      other.push_back(g.uniform(1, 3));
    }
  }
  s.args = {g.id(a), g.new_input(other, partner_dtype(g, x))};
  return products_fit(arg(g, s, 0), arg(g, s, 1));
}
bool linear_pick(Gen& g, Step& s) {
  int a = gemm_operand(g, 1, 3);
  if (a < 0 || g.program->inputs.size() + 2 > g.max_inputs) return false;
  const auto& x = g.value(a);
  int64_t out = g.uniform(1, 4);
  kiln::DType dt = partner_dtype(g, x);
  s.args = {g.id(a), g.new_input({out, x.size(-1)}, dt), g.new_input({out}, dt)};
  // Nor, after a layer_norm, an infinite weight or bias (deliberate difference, see
  // normalized_so_far): the gradient coming back to the input is infinite.
  if (normalized_so_far(g) && (holds_inf(arg(g, s, 1)) || holds_inf(arg(g, s, 2)))) return false;
  return products_fit(arg(g, s, 0), arg(g, s, 1)) &&
         max_finite_abs(arg(g, s, 2)) <= largest(torch::kFloat32) / 4;
}
bool addmm_pick(Gen& g, Step& s) {
  if (!mm_pick(g, s) || g.inputs_full()) return false;
  Shape out = {arg(g, s, 0).size(0), arg(g, s, 1).size(1)};
  s.args.insert(s.args.begin(),
                g.new_input(g.broadcastable(out), to_kiln(arg(g, s, 0).scalar_type())));
  return max_finite_abs(arg(g, s, 0)) <= largest(torch::kFloat32) / 4;
}

// ---------------------------------------------------------------- indexing and joining
// A new floating input of [min_rows..max_rows, 1..max_cols].
ValueId new_matrix(Gen& g, int64_t min_rows, int64_t max_rows, int64_t max_cols) {
  const Shape shape = {g.uniform(min_rows, max_rows), g.uniform(1, max_cols)};
  return g.new_input(shape, g.random_float_dtype());
}
kiln::DType index_dtype(Gen& g) {
  return g.coin(0.8) ? kiln::kInt64 : kiln::kInt32;
}
bool index_select_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; }))
    return false;
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  int64_t n = x.size(d);
  s.p.i = {d};
  const Shape index_shape = {n ? g.uniform(0, 4) : 0};
  s.args.push_back(g.new_input(index_shape, index_dtype(g), 0, n));
  return true;
}
bool gather_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; }))
    return false;
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  int64_t n = x.size(d);
  Shape shape = sizes(x);
  for (int64_t k = 0; k < x.dim(); ++k)
    shape[k] = k == wrap(d, x.dim()) ? (n ? g.uniform(0, 3) : 0) : g.uniform(0, shape[k]);
  s.p.i = {d};
  s.args.push_back(g.new_input(shape, kiln::kInt64, 0, n));
  return true;
}
bool embedding_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs) return false;
  int w = g.pick([](const torch::Tensor& t) {
    return t.dim() == 2 && t.size(0) > 0 && t.is_floating_point();
  });
  ValueId wid = w >= 0 ? g.id(w) : new_matrix(g, 1, 5, 3);
  int64_t rows = arg(g, Step{0, {wid}, {}}, 0).size(0);
  s.args = {wid, g.new_input(g.random_shape(2), kiln::kInt64, 0, rows)};
  return true;
}
bool cat_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  unary(g, s);
  const auto& x = arg(g, s, 0);
  int64_t d = g.dim(rank(x));
  Shape shape = sizes(x);
  if (!shape.empty()) shape[wrap(d, x.dim())] = g.uniform(0, 3);
  s.p.i = {d};
  s.args.push_back(g.new_input(shape, g.coin(0.7) ? to_kiln(x.scalar_type()) : g.random_dtype()));
  return true;
}
bool stack_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  unary(g, s);
  const auto& x = arg(g, s, 0);
  s.p.i = {g.uniform(-x.dim() - 1, x.dim())};
  s.args.push_back(g.new_input(sizes(x), to_kiln(x.scalar_type())));
  return true;
}

// ---------------------------------------------------------------- scatters
// A value x of rank >= 1 (a copy: new inputs move the values) and a random dim d of it (p.i[0]),
// with room for two more inputs.
bool value_and_dim(Gen& g, Step& s, torch::Tensor& x, int64_t& d) {
  if (g.program->inputs.size() + 2 > g.max_inputs ||
      !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; }))
    return false;
  x = arg(g, s, 0);
  d = g.dim(rank(x));
  s.p.i = {d};
  return true;
}
// x and an index into it along d: no larger than x outside d, values in range. Sets index_shape.
bool scatter_index(Gen& g, Step& s, Shape& index_shape) {
  torch::Tensor x;
  int64_t d = 0;
  if (!value_and_dim(g, s, x, d)) return false;
  const int64_t n = x.size(d);
  index_shape = sizes(x);
  for (int64_t k = 0; k < x.dim(); ++k)
    index_shape[k] =
        k == wrap(d, x.dim()) ? (n ? g.uniform(0, 3) : 0) : g.uniform(0, index_shape[k]);
  s.args.push_back(g.new_input(index_shape, kiln::kInt64, 0, n));
  return true;
}
// And a src of x's dtype and the index's shape. Not larger than the index (deliberate
// difference): libtorch 1.13's backward then raises or gives the elements that are not scattered a
// gradient; kiln's gives them 0 (tests/lib/scatter_test.cpp checks it by finite differences).
bool scatter_pick(Gen& g, Step& s) {
  Shape shape;
  if (!scatter_index(g, s, shape)) return false;
  const kiln::DType dtype = to_kiln(arg(g, s, 0).scalar_type());
  s.args.push_back(g.new_input(shape, dtype));
  return true;
}
// A scalar that x's dtype holds (the conversion of others is not what the op tests).
void scalar_for(Gen& g, Step& s, const torch::Tensor& x) {
  g.scalar(s.p);
  if (is_float(x)) return;
  const bool boolean = x.scalar_type() == torch::kBool;
  s.p.scalar_kind = boolean ? Params::ScalarKind::Bool : Params::ScalarKind::Int;
  s.p.scalars.back() = static_cast<double>(boolean ? g.uniform(0, 1) : g.uniform(-3, 3));
}
bool scatter_value_pick(Gen& g, Step& s) {
  Shape shape;
  if (!scatter_index(g, s, shape)) return false;
  scalar_for(g, s, arg(g, s, 0));
  return true;
}
// p.i[1]: the reduction (kScatterReduce), p.i[2]: include_self. Nor mean of bool (kiln raises).
const char* const kScatterReduce[] = {"sum", "prod", "mean", "amax", "amin"};
bool scatter_reduce_pick(Gen& g, Step& s) {
  if (!scatter_pick(g, s)) return false;
  s.p.i.push_back(g.uniform(0, 4));
  s.p.i.push_back(g.coin(0.5));
  return !(s.p.i[1] == 2 && arg(g, s, 0).scalar_type() == torch::kBool);
}
// A 1-D index along a random dim (p.i[0]) of x (rank >= 1); index_copy's positions are distinct
// (libtorch leaves repeated ones unspecified) and its source has x's shape with the index's size
// along the dim.
bool index_along_pick(Gen& g, Step& s, bool copy) {
  torch::Tensor x;
  int64_t d = 0;
  if (!value_and_dim(g, s, x, d)) return false;
  const int64_t n = x.size(d);
  const int64_t k = n ? g.uniform(0, std::min<int64_t>(n, 3)) : 0;
  s.args.push_back(g.new_input({k}, kiln::kInt64, 0, n));
  if (!copy) return true;
  const torch::Tensor& index = arg(g, s, 1);
  if (std::get<0>(torch::_unique(index)).numel() != index.numel()) return false;
  Shape shape = sizes(x);
  shape[wrap(d, x.dim())] = k;
  const kiln::DType dtype = to_kiln(x.scalar_type());
  s.args.push_back(g.new_input(shape, dtype));
  return true;
}
bool index_copy_pick(Gen& g, Step& s) {
  return index_along_pick(g, s, true);
}
bool index_fill_pick(Gen& g, Step& s) {
  if (!index_along_pick(g, s, false)) return false;
  scalar_for(g, s, arg(g, s, 0));
  return true;
}
bool index_fill_tensor_pick(Gen& g, Step& s) {
  if (!index_along_pick(g, s, false) || g.inputs_full()) return false;
  const kiln::DType dtype = to_kiln(arg(g, s, 0).scalar_type());
  s.args.push_back(g.new_input({}, dtype));
  return true;
}
// A bool mask that broadcasts with x and a 1-D source of x's dtype with enough elements.
bool masked_scatter_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs) return false;
  unary(g, s);
  const torch::Tensor x = arg(g, s, 0);  // a copy: new inputs move the values
  const Shape mask_shape = g.broadcastable(sizes(x));
  s.args.push_back(g.new_input(mask_shape, kiln::kBool));
  const int64_t count = x.numel() + g.uniform(0, 2);
  const kiln::DType dtype = to_kiln(x.scalar_type());
  s.args.push_back(g.new_input({count}, dtype));
  return true;
}
bool take_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, [](const torch::Tensor& t) { return t.numel() > 0; }))
    return false;
  const int64_t n = arg(g, s, 0).numel();
  const Shape shape = g.random_shape(2);
  s.args.push_back(g.new_input(shape, kiln::kInt64, 0, n));
  return true;
}

// ---------------------------------------------------------------- neural-network ops
// Not picked (deliberate differences): values whose square overflows (kiln's float32 statistics
// are float64, libtorch's overflow to NaN), and rows of one element or of (nearly) equal values
// (kiln's result is exactly 0, libtorch's a rounding error whose sign a later op may read).
bool layer_norm_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs ||
      !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0 && is_float(t); }))
    return false;
  const auto& x = arg(g, s, 0);
  int64_t k = x.dim() >= 2 && g.coin(0.3) ? 2 : 1;
  s.p.list = Shape(x.sizes().end() - k, x.sizes().end());
  const int64_t n =
      std::accumulate(s.p.list.begin(), s.p.list.end(), int64_t{1}, std::multiplies<>());
  if (max_finite_abs(x) > std::sqrt(largest(x.scalar_type())) / 16 || n == 1) return false;
  if (x.numel() > 0 && n > 0) {
    torch::Tensor rows = x.detach().reshape({-1, n});
    // Nearly equal rows too (a subnormal and -0): their normalized values are rounding errors.
    torch::Tensor range = (std::get<0>(rows.max(1)) - std::get<0>(rows.min(1))).to(torch::kFloat64);
    if ((range.abs() < 1e-20).any().item<bool>()) return false;
    // So is the normalized value of an element within rounding of its row's mean ({-3.75,
    // -1.75, 0.25}: 0 in kiln, about -1e-7 in libtorch, whose floor is -1).
    torch::Tensor wide = rows.to(torch::kFloat64);
    torch::Tensor peak = std::get<0>(wide.abs().max(1, true));
    if (((wide - wide.mean(1, true)).abs() <= 1e-5 * peak).any().item<bool>()) return false;
  }
  kiln::DType dt = to_kiln(x.scalar_type());
  s.args.push_back(g.new_input(s.p.list, dt));
  s.args.push_back(g.new_input(s.p.list, dt));
  const double limit = std::sqrt(largest(to_torch(dt))) / 16;  // x may have moved: use dt
  // Nor an infinite weight or bias (deliberate difference): with an infinite weight, or an
  // infinite gradient coming back through an infinite output, the input's gradient is NaN in
  // libtorch's formula, infinite in kiln's where no infinities meet.
  return max_finite_abs(arg(g, s, 1)) <= limit && max_finite_abs(arg(g, s, 2)) <= limit &&
         !torch::isinf(arg(g, s, 1)).any().item<bool>() &&
         !torch::isinf(arg(g, s, 2)).any().item<bool>();
}
bool layer_norm_plain_pick(Gen& g, Step& s) {
  if (!layer_norm_pick(g, s)) return false;
  s.args.resize(1);  // the weight and bias inputs stay unused
  return true;
}
bool cross_entropy_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs) return false;
  int a = g.pick([](const torch::Tensor& t) {
    return t.dim() == 2 && t.size(1) > 0 && t.is_floating_point();
  });
  ValueId logits = a >= 0 ? g.id(a) : new_matrix(g, 0, 4, 5);
  const auto& x = arg(g, Step{0, {logits}, {}}, 0);
  int64_t n = x.size(0), c = x.size(1);
  s.args = {logits, g.new_input({n}, kiln::kInt64, 0, c)};
  s.p.i = {g.uniform(0, 2)};
  return true;
}
// l1_loss, huber_loss and smooth_l1_loss of operands of different shapes broadcast them first in
// libtorch (as torch.nn.functional does): at::smooth_l1_loss's backward normalizes a mean by the
// input's own size.
// cross_entropy with a class weight (detached: libtorch's nll_loss has no weight gradient), an
// ignore_index (-100, or a class: p.i[1]) and label smoothing (p.i[2] tenths).
bool cross_entropy_options_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 3 > g.max_inputs) return false;
  if (!cross_entropy_pick(g, s)) return false;
  const int64_t c = arg(g, s, 0).size(1);
  s.args.push_back(g.new_input({c}, to_kiln(arg(g, s, 0).scalar_type()), 0.5, 2));
  s.p.i = {g.uniform(0, 2), g.coin(0.3) ? -100 : g.uniform(0, c - 1), g.uniform(0, 3)};
  return true;
}
// Operands whose difference doubled overflows are not picked (deliberate difference): kiln's
// gradient scales g first (2 g / N times the difference), libtorch's doubles the difference.
bool mse_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, is_float)) return false;
  const auto& x = arg(g, s, 0);
  s.args.push_back(g.new_input(sizes(x), to_kiln(x.scalar_type())));
  s.p.i = {g.uniform(0, 2)};
  const auto& a = arg(g, s, 0);
  // Nor, after a layer_norm, an infinite operand (see normalized_so_far): the other's gradient is
  // infinite.
  if (normalized_so_far(g) && (holds_inf(a) || holds_inf(arg(g, s, 1)))) return false;
  return max_finite_abs(a) + max_finite_abs(arg(g, s, 1)) <= largest(a.scalar_type()) / 4;
}
// Nor an empty integral or bool operand (deliberate difference): libtorch returns its dtype, kiln
// float32, and the dtype spreads (cat, mean, an in-place add_ of a float).
bool softmax_pick(Gen& g, Step& s) {
  if (!dim_pick(g, s)) return false;
  const auto& x = arg(g, s, 0);
  return is_float(x) || x.numel() > 0;
}
// Nor a cast to an integral or bool dtype of floats that an inexact op computed and that lie
// within float32 rounding of an integer (deliberate difference): kiln's float32 transcendentals
// are within a few ulps of libtorch's (erf(3.96f) is 1 - 2^-24 in kiln, 1 in libtorch), and the
// cast truncates that ulp into a whole unit.
// Whether x holds a value within float32 rounding of k + offset for an integer k (0 itself only
// with `zero`).
bool near_integers(const torch::Tensor& x, double offset, bool zero) {
  torch::Tensor v = x.detach().to(torch::kFloat64);
  torch::Tensor w = v - offset;
  torch::Tensor near = (w - w.round()).abs() <= 1e-5 * torch::clamp_min(v.abs(), 1);
  return torch::logical_and(near, zero ? v == v : v != 0).any().item<bool>();
}
bool cast_pick(Gen& g, Step& s) {
  unary(g, s);
  s.p.i = {static_cast<int64_t>(g.random_dtype())};
  const auto& x = arg(g, s, 0);
  if (!is_float(x) || kiln::is_floating_point(static_cast<kiln::DType>(s.p.i[0]))) return true;
  return !inexact_so_far(g) || x.numel() == 0 || !near_integers(x, 0);
}
// The same for floor and ceil, 0 included (ceil(abs(erf(x))) of float32 is 2 in kiln where kiln's
// erf is an ulp above 1, docs/torch-differences.md; floor(logsumexp(log_softmax(x))) of 1 - 1e-8
// is -1), and for round near a half-integer.
bool floor_ceil_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  return !is_float(x) || !inexact_so_far(g) || x.numel() == 0 || !near_integers(x, 0, true);
}
// Nor a truth value (logical ops, all, any) of floats within rounding of 0, 0 included, after
// inexact steps: a rounding error of either library (a layer_norm row's sum, gelu of a large
// negative value) is true where the other's 0 is false.
bool truth_of(const Gen& g, const torch::Tensor& x) {
  return !is_float(x) || !inexact_so_far(g) || x.numel() == 0 ||
         !torch::le(x.detach().to(torch::kFloat64).abs(), 1e-5 * std::max(1.0, max_finite_abs(x)))
              .any()
              .item<bool>();
}
bool truth_pick(Gen& g, Step& s) {
  unary(g, s);
  return truth_of(g, arg(g, s, 0));
}
bool truth_binary_pick(Gen& g, Step& s) {
  binary(g, s);
  return truth_of(g, arg(g, s, 0)) && truth_of(g, arg(g, s, 1));
}
bool round_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  return !is_float(x) || !inexact_so_far(g) || x.numel() == 0 || !near_integers(x, 0.5);
}

// ---------------------------------------------------------------- order statistics, shapes,
// activations and distances
// Whether x's values along dim (every value when dim is -1 of the flattened x) are apart, NaN
// aside: an index chosen among equal values is libtorch's nth_element's (unspecified), and after
// inexact steps values within 1e-5 of the largest magnitude (at least 1) may be equal in one
// library only. Exact ties are allowed where nothing depends on an index (the whole-tensor
// median, whose gradient is shared among the equal values).
bool separated(const Gen& g, const torch::Tensor& x, int64_t dim, bool exact_ties) {
  if (x.dim() == 0 || x.numel() == 0 || x.size(dim) < 2) return true;
  const torch::Tensor v = std::get<0>(x.detach().to(torch::kFloat64).sort(dim));
  const int64_t n = v.size(dim);
  const torch::Tensor lo = v.narrow(dim, 0, n - 1), hi = v.narrow(dim, 1, n - 1);
  const double tol =
      is_float(x) && inexact_so_far(g) ? 1e-5 * std::max(1.0, max_finite_abs(x)) : 0.0;
  torch::Tensor ties =
      torch::logical_not(torch::isnan(lo) | torch::isnan(hi)) & torch::logical_not((hi - lo) > tol);
  if (exact_ties) ties = ties & torch::logical_not(hi == lo);
  return !ties.any().item<bool>();
}
// Nor an empty integer tensor (deliberate difference): kiln raises, libtorch gives NaN cast to
// the integer type.
bool median_all_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  return (x.numel() > 0 || is_float(x)) && separated(g, x.reshape({-1}), 0, true);
}
// kthvalue: at most one NaN per line (which of several NaN libtorch's selection returns is
// unspecified).
bool kth_pick(Gen& g, Step& s) {
  reduce_one(g, s);
  const auto& x = arg(g, s, 0);
  const int64_t d = rank(x) == 0 ? 0 : wrap(s.p.i[0], x.dim());
  s.p.i.push_back(g.uniform(0, (rank(x) == 0 ? 1 : x.size(d)) + 1));  // k, sometimes out of range
  return separated(g, x, d, false) && (rank(x) == 0 || x.numel() == 0 || !is_float(x) ||
                                       torch::isnan(x).sum(d).max().item<int64_t>() <= 1);
}
bool median_dim_pick(Gen& g, Step& s) {
  reduce_one(g, s);
  const auto& x = arg(g, s, 0);
  return separated(g, x, rank(x) == 0 ? 0 : wrap(s.p.i[0], x.dim()), false);
}
// nanmedian along a dim without a line of only NaN (whose index, and so the gradient's place, is
// each library's choice).
bool nanmedian_dim_pick(Gen& g, Step& s) {
  if (!median_dim_pick(g, s)) return false;
  const auto& x = arg(g, s, 0);
  return rank(x) == 0 || x.numel() == 0 || !is_float(x) ||
         !torch::isnan(x).all(wrap(s.p.i[0], x.dim())).any().item<bool>();
}
bool diagonal_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() >= 2 || t.dim() == 1; }))
    return false;
  const int64_t r = rank(arg(g, s, 0));
  s.p.i = {g.uniform(-3, 3), g.dim(r), g.dim(r)};
  return true;
}
// Nor a matrix whose diagonal k lies wholly outside it (deliberate difference): libtorch 1.13's
// diag computes a negative length and raises ("numel: integer multiplication overflow"); kiln's
// is empty, as diagonal's.
// Nor trace of a matrix with more rows than columns (deliberate difference): libtorch 1.13's
// gradient then also reaches elements off the diagonal (every (columns + 1)-th element: [1, 0, 1,
// 0] for a [4, 1] matrix); kiln's is the diagonal's.
bool trace_pick(Gen& g, Step& s) {
  if (!matrix_pick(g, s)) return false;
  const auto& x = arg(g, s, 0);
  return x.dim() != 2 || x.size(0) <= x.size(1);
}
bool diag_pick(Gen& g, Step& s) {
  if (!matrix_pick(g, s)) return false;
  const int64_t k = g.uniform(-2, 2);
  s.p.i = {k};
  const auto& x = arg(g, s, 0);
  return x.dim() != 2 || (k >= 0 ? x.size(1) >= k : x.size(0) >= -k);
}
bool tile_pick(Gen& g, Step& s) {
  unary(g, s);
  s.p.list.resize(static_cast<size_t>(g.uniform(0, 3)));
  for (auto& d : s.p.list) d = g.uniform(0, 2);
  return true;
}
bool repeat_interleave_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() >= 1; })) return false;
  s.p.i = {g.uniform(0, 2), g.dim(rank(arg(g, s, 0)))};
  return true;
}
bool glu_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return is_float(t) && t.dim() >= 1; }))
    return false;
  s.p.i = {g.dim(rank(arg(g, s, 0)))};
  return true;
}
// Nor operands whose squares may overflow (deliberate difference): kiln's norms accumulate float32
// in float64 and stay finite where libtorch's are inf.
bool squares_fit(const torch::Tensor& x) {
  return max_finite_abs(x) <= std::sqrt(largest(x.scalar_type())) / 16;
}
bool normalize_pick(Gen& g, Step& s) {
  return glu_pick(g, s) && squares_fit(arg(g, s, 0));
}
// One slope, or one per channel (dim 1), of the input's dtype: a new input.
bool prelu_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !float_unary(g, s)) return false;
  const auto& x = arg(g, s, 0);
  const int64_t channels = x.dim() >= 2 ? x.size(1) : 1;
  const Shape shape = {g.coin(0.5) ? channels : 1};
  const kiln::DType dtype = to_kiln(x.scalar_type());
  s.args.push_back(g.new_input(shape, dtype));
  return true;
}
// Two floating operands of one dtype whose broadcast shape has a dim to reduce.
bool distance_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto& a = arg(g, s, 0);
  const auto& b = arg(g, s, 1);
  if (!is_float(a) || a.scalar_type() != b.scalar_type() || !broadcasts(sizes(a), sizes(b)))
    return false;
  const int64_t r = std::max(rank(a), rank(b));
  if (r == 0) return false;
  s.p.i = {g.dim(r), g.uniform(0, 1)};
  return squares_fit(a) && squares_fit(b);
}

// ---------------------------------------------------------------- matrix functions
// A new floating input of square matrices [batch..., n, n], values in [0, 1) (no special values):
// the expressions make them well conditioned (conditioned, gram), as results of LAPACK's kind
// differ between libraries by about the condition number times an ulp.
bool square_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  Shape shape = g.random_shape(2);
  const int64_t n = g.coin(0.05) ? 0 : g.uniform(1, 4);
  shape.push_back(n);
  shape.push_back(n);
  const kiln::DType dtype = g.random_float_dtype();
  s.args = {g.new_input(shape, dtype, 0, 1)};
  return true;
}
// And a right-hand side [batch'..., n, k] (values in [0, 1)), its batch broadcasting with A's;
// p.i: upper, left and unitriangular for solve_triangular.
bool square_system_pick(Gen& g, Step& s) {
  if (!square_pick(g, s) || g.inputs_full()) return false;
  const torch::Tensor a = arg(g, s, 0);
  Shape b = g.broadcastable(Shape(a.sizes().begin(), a.sizes().end() - 2));
  b.push_back(a.size(-1));
  b.push_back(g.uniform(0, 3));
  // No special values in B either: a solution near the float range overflows in one library's
  // order of operations and not in the other's (products_fit's reason).
  s.args.push_back(g.new_input(b, to_kiln(a.scalar_type()), 0, 1));
  s.p.i = {g.uniform(0, 1), g.uniform(0, 1), g.uniform(0, 1)};
  return true;
}

// x (values in [0, 1)) shifted to [-1, 1), plus n on the diagonal: diagonally dominant, with a
// positive determinant.
kiln::Tensor conditioned(const kiln::Tensor& x) {
  return x * 2.0 - 1.0 + kiln::eye(x.size(-1), x.dtype()) * static_cast<double>(x.size(-1));
}
torch::Tensor conditioned(const torch::Tensor& x) {
  return x * 2.0 - 1.0 + torch::eye(x.size(-1), x.options()) * static_cast<double>(x.size(-1));
}
// A well-conditioned symmetric positive-definite matrix made from x.
template <typename Tensor>
Tensor gram(const Tensor& x) {
  const Tensor c = conditioned(x);
  return c.matmul(c.transpose(-2, -1));
}

// And p.i[0] in [-2, 3]: matrix_power's exponent (a negative one inverts).
bool matrix_power_pick(Gen& g, Step& s) {
  if (!square_pick(g, s)) return false;
  s.p.i = {g.uniform(-2, 3)};
  return true;
}
// A matrix [batch..., m, n] (m, n in [1, 4]) with values in [0, 1), for the singular values.
bool rectangular_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  Shape shape = g.random_shape(1);
  shape.push_back(g.uniform(1, 4));
  shape.push_back(g.uniform(1, 4));
  s.args = {g.new_input(shape, g.random_float_dtype(), 0, 1)};
  return true;
}
// ---------------------------------------------------------------- scans and searches
// cummax and cummin of exact values only (deliberate difference otherwise): after inexact steps an
// ulp decides which of two near values leads, and with it the index the gradient goes to.
bool cum_extreme_pick(Gen& g, Step& s) {
  return reduce_one(g, s) && !inexact_so_far(g);
}
bool float_reduce_one(Gen& g, Step& s) {
  return reduce_one(g, s) && is_float(arg(g, s, 0));
}
// searchsorted of the values of b into the sorted values of a (one dtype): exact values without
// NaN (deliberate difference: kiln sorts NaN as the largest value, libtorch's binary search
// compares with it as unordered); p.i[0]: right.
bool searchsorted_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto& a = arg(g, s, 0);
  const auto& b = arg(g, s, 1);
  s.p.i = {g.uniform(0, 1)};
  auto holds_nan = [](const torch::Tensor& t) {
    return is_float(t) && torch::isnan(t.detach()).any().item<bool>();
  };
  return a.scalar_type() == b.scalar_type() && a.scalar_type() != torch::kBool && rank(a) > 0 &&
         !inexact_so_far(g) && !holds_nan(a) && !holds_nan(b);
}

// ---------------------------------------------------------------- statistics and grids
// sinc of no nonzero integer (deliberate difference): there it is sin's rounding error over pi x,
// about 1e-8, whose ulps a later cancelling op reads (x - tanh(x): libtorch's float32 tanh of
// such a value is an ulp off, kiln's exact; seed 16810036597216414421).
bool sinc_pick(Gen& g, Step& s) {
  if (!periodic_pick(g, s)) return false;
  const torch::Tensor x = arg(g, s, 0).detach().to(torch::kFloat64);
  return !torch::logical_and(x != 0, x == torch::round(x)).any().item<bool>();
}

// hypot of floating operands (libtorch's has no integer kernel).
bool hypot_pick(Gen& g, Step& s) {
  binary(g, s);
  return is_float(arg(g, s, 0)) && is_float(arg(g, s, 1));
}
// heaviside of one non-bool dtype (libtorch's rejects two; kiln promotes them).
bool heaviside_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto& x = arg(g, s, 0);
  return x.scalar_type() == arg(g, s, 1).scalar_type() && x.scalar_type() != torch::kBool;
}
// lerp of one floating dtype with a scalar weight in [-0.5, 1.5] (p.scalars[0]).
bool lerp_pick(Gen& g, Step& s) {
  binary(g, s);
  const auto& x = arg(g, s, 0);
  s.p.scalars = {double(g.uniform(-2, 6)) / 4};
  s.p.scalar_kind = Params::ScalarKind::Float;
  return is_float(x) && x.scalar_type() == arg(g, s, 1).scalar_type();
}
// quantile along p.i[0] (keepdim p.i[1]) of q = p.i[2] / 8 with interpolation p.i[3], of exact
// non-empty floating values only (deliberate difference otherwise: after inexact steps an ulp
// orders two near values, and with them the element the gradient goes to).
const char* const kInterpolations[] = {"linear", "lower", "higher", "midpoint", "nearest"};
bool quantile_pick(Gen& g, Step& s) {
  reduce_one(g, s);
  const auto& x = arg(g, s, 0);
  s.p.i.push_back(g.uniform(0, 8));
  s.p.i.push_back(g.uniform(0, 4));
  return is_float(x) && x.numel() > 0 && !inexact_so_far(g);
}
// diff of order p.i[1] in [0, 3] along p.i[0], of a tensor with dims.
bool diff_pick(Gen& g, Step& s) {
  reduce_one(g, s);
  s.p.i[1] = g.uniform(0, 3);
  return rank(arg(g, s, 0)) > 0;
}
// trapezoid along p.i[0] of non-bool samples with dims.
bool trapezoid_pick(Gen& g, Step& s) {
  reduce_one(g, s);
  const auto& x = arg(g, s, 0);
  return rank(x) > 0 && x.scalar_type() != torch::kBool;
}
// cov of floating variables [vars, observations] or [observations], at least 2 observations
// (fewer divide by 0 in both libraries; libtorch warns each time).
// Nor values whose products overflow (libtorch's and kiln's orders of operations overflow
// differently: inf against NaN).
bool cov_pick(Gen& g, Step& s) {
  unary(g, s);
  const auto& x = arg(g, s, 0);
  return is_float(x) && rank(x) >= 1 && rank(x) <= 2 && x.size(-1) >= 2 &&
         max_finite_abs(x) <= std::sqrt(largest(x.scalar_type())) / 64;
}
// rot90 by p.i[0] quarter turns in the plane of the first two dims.
bool rot90_pick(Gen& g, Step& s) {
  unary(g, s);
  s.p.i = {g.uniform(-1, 4)};
  return rank(arg(g, s, 0)) >= 2;
}
// block_diag of two tensors of at most 2 dims, neither an empty 1-D one (deliberate difference:
// both place it as a 1 x 0 block, a row of zeros, but libtorch 1.13's backward skips it without
// counting its row, so the blocks after it get the gradient of the row above; seed
// 17861914602744155609).
bool block_diag_pick(Gen& g, Step& s) {
  binary(g, s);
  for (int k : {0, 1}) {
    const auto& t = arg(g, s, k);
    if (rank(t) > 2 || (rank(t) == 1 && t.numel() == 0)) return false;
  }
  return true;
}
// cdist of new row sets x1 [batch..., P, M] and x2 [R, M] (values in [0, 1)), with
// p = {0, 1, 2, 3}[p.i[0]]: the direct algorithm in both libraries (P, R <= 4).
bool cdist_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const int64_t m = g.uniform(1, 4);
  Shape first = g.random_shape(1);
  first.push_back(g.uniform(1, 4));
  first.push_back(m);
  const kiln::DType dtype = g.random_float_dtype();
  s.args = {g.new_input(first, dtype, 0, 1)};
  if (g.inputs_full()) return false;
  s.args.push_back(g.new_input(Shape{g.uniform(1, 4), m}, dtype, 0, 1));
  s.p.i = {g.uniform(0, 3)};
  return true;
}
// tensordot of new tensors a [..., k] and b [k, ...] (values in [0, 1)) over their one shared
// dim.
bool tensordot_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const int64_t k = g.uniform(1, 4);
  Shape a = g.random_shape(1), b{k};
  a.push_back(k);
  for (int64_t d : g.random_shape(1)) b.push_back(d);
  const kiln::DType dtype = g.random_float_dtype();
  s.args = {g.new_input(a, dtype, 0, 1)};
  if (g.inputs_full()) return false;
  s.args.push_back(g.new_input(b, dtype, 0, 1));
  return true;
}

// ---------------------------------------------------------------- products, LU and sign rows
// New float inputs (values in [0, 1)) of one dtype for a scaled product: self of `self_shape`
// (which broadcasts to the product's shape) and the two factors; p.i[0] picks (beta, alpha) from
// kScalings.
const double kScalings[][2] = {{1, 1}, {0.5, 2}, {0, 1}, {2, -1}};
bool scaled_product_inputs(Gen& g, Step& s, const Shape& self_shape, const Shape& a,
                           const Shape& b) {
  if (g.program->inputs.size() + 3 > g.max_inputs) return false;
  const kiln::DType dtype = g.random_float_dtype();
  s.args = {g.new_input(self_shape, dtype, 0, 1), g.new_input(a, dtype, 0, 1),
            g.new_input(b, dtype, 0, 1)};
  s.p.i = {g.uniform(0, 3)};
  return true;
}
// self: the product's shape, its trailing dims, or size-1 dims. With beta 0 the expressions
// detach self (deliberate difference: kiln's gradient for an ignored self is 0, libtorch's
// g * 0, NaN where g is).
Shape addend_of(Gen& g, Shape shape) {
  const int64_t r = g.uniform(0, 2);
  if (r == 0) return shape;
  if (r == 1) return Shape(shape.begin() + 1, shape.end());
  for (int64_t& d : shape) d = g.coin(0.5) ? 1 : d;
  return shape;
}
// An empty matrix gets a self of the result's shape (deliberate difference: libtorch 1.13's addmv
// then returns beta * self unbroadcast, whose backward raises).
bool addmv_pick(Gen& g, Step& s) {
  const int64_t n = g.uniform(0, 4), m = g.uniform(0, 4);
  return scaled_product_inputs(g, s, n * m == 0 ? Shape{n} : addend_of(g, {n}), {n, m}, {m});
}
bool addr_pick(Gen& g, Step& s) {
  const int64_t n = g.uniform(0, 4), m = g.uniform(0, 4);
  return scaled_product_inputs(g, s, addend_of(g, {n, m}), {n}, {m});
}
// The batched forms without beta 0 (deliberate difference: libtorch 1.13's baddbmm with beta 0
// sometimes returns NaN, reading its uninitialized output; seed 16374765354050072079 does not
// replay it).
bool without_beta_zero(Gen& g, Step& s) {
  if (s.p.i[0] == 2) s.p.i[0] = g.coin(0.5) ? 0 : 3;
  return true;
}
bool baddbmm_pick(Gen& g, Step& s) {
  const int64_t b = g.uniform(0, 3), n = g.uniform(0, 3), m = g.uniform(0, 3), q = g.uniform(1, 3);
  return scaled_product_inputs(g, s, addend_of(g, {b, n, q}), {b, n, m}, {b, m, q}) &&
         without_beta_zero(g, s);
}
bool addbmm_pick(Gen& g, Step& s) {
  const int64_t b = g.uniform(0, 3), n = g.uniform(0, 3), m = g.uniform(0, 3), q = g.uniform(1, 3);
  return scaled_product_inputs(g, s, addend_of(g, {n, q}), {b, n, m}, {b, m, q}) &&
         without_beta_zero(g, s);
}
// Three new matrices [a, b], [b, c], [c, d] of one float dtype (values in [0, 1)).
bool multi_dot_pick(Gen& g, Step& s) {
  const int64_t a = g.uniform(1, 4), b = g.uniform(0, 4), c = g.uniform(1, 4), d = g.uniform(1, 4);
  return scaled_product_inputs(g, s, {a, b}, {b, c}, {c, d});
}
// vecdot of two floating tensors of one dtype and shape, at least 1-D.
bool vecdot_pick(Gen& g, Step& s) {
  return mse_pick(g, s) && rank(arg(g, s, 0)) >= 1;
}
// aminmax along a dim, without zeros of both signs (which one is the extreme is unspecified),
// of at least 1-D tensors (deliberate difference: libtorch 1.13's aminmax of a 0-dim tensor with
// keepdim gives shape [1], kiln's keeps [] as amin and amax do).
bool aminmax_pick(Gen& g, Step& s) {
  return reduce_one(g, s) && !zeros_of_both_signs(arg(g, s, 0)) && rank(arg(g, s, 0)) > 0;
}
// isin of non-bool operands (deliberate difference: libtorch raises for bool, kiln compares
// them as 0 and 1), without NaN among the elements (libtorch 1.13's brute-force loop found a NaN
// element in a set holding NaN, seed 8612181697502200931; kiln's NaN is in nothing, as ==).
bool isin_pick(Gen& g, Step& s) {
  if (!binary(g, s)) return false;
  const auto &x = arg(g, s, 0), &set = arg(g, s, 1);
  // Exact membership of floating values after inexact steps is ill-conditioned (an ulp apart is
  // out), as the casts' and floor's operands above: hardswish(x) = x * 6 / 6 of a GEMM's x >= 3
  // is x in one library and an ulp off in the other.
  if (inexact_so_far(g) && (is_float(x) || is_float(set))) return false;
  return x.scalar_type() != torch::kBool && set.scalar_type() != torch::kBool &&
         !torch::isnan(x).any().item<bool>();
}
// take_along_dim along p.i[0] with new int64 indices whose other dims are x's or 1.
bool take_along_dim_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; }))
    return false;
  const auto& x = arg(g, s, 0);
  const int64_t d = g.dim(rank(x)), n = x.size(d);
  Shape shape = sizes(x);
  for (int64_t k = 0; k < x.dim(); ++k)
    shape[k] = k == wrap(d, x.dim()) ? (n ? g.uniform(0, 3) : 0) : (g.coin(0.3) ? 1 : shape[k]);
  s.p.i = {d};
  s.args.push_back(g.new_input(shape, kiln::kInt64, 0, n));
  return true;
}
// select_scatter into x (at least 1-D, a nonempty dim p.i[0]) at index p.i[1] of a new src.
bool select_scatter_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; }))
    return false;
  const auto& x = arg(g, s, 0);
  const int64_t d = g.dim(rank(x)), n = x.size(d);
  if (n == 0) return false;
  Shape shape = sizes(x);
  shape.erase(shape.begin() + wrap(d, x.dim()));
  s.p.i = {d, g.uniform(-n, n - 1)};
  s.args.push_back(g.new_input(shape, to_kiln(x.scalar_type())));
  return true;
}
// diagonal_scatter into x (at least 2-D) along diagonal p.i[0] of dims 0 and 1, a new src.
bool diagonal_scatter_pick(Gen& g, Step& s) {
  if (g.inputs_full() || !one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 1; }))
    return false;
  const auto& x = arg(g, s, 0);
  const int64_t offset = g.uniform(-2, 2);
  s.p.i = {offset};
  s.args.push_back(g.new_input(sizes(x.diagonal(offset, 0, 1)), to_kiln(x.scalar_type())));
  return true;
}
// renorm of a floating tensor of at least 2 dims along p.i[0], without NaN or infinities
// (deliberate difference: a slice whose norm is NaN gets a NaN gradient in kiln, which
// differentiates the norm; libtorch's backward passes g through it unscaled).
bool renorm_pick(Gen& g, Step& s) {
  return float_reduce_one(g, s) && rank(arg(g, s, 0)) >= 2 &&
         torch::isfinite(arg(g, s, 0)).all().item<bool>();
}
// signbit and copysign's sign operand without NaN (deliberate difference): the sign of a NaN
// depends on the instruction that made it, which the two libraries choose differently.
bool sign_source_pick(Gen& g, Step& s) {
  return unary(g, s) && !torch::isnan(arg(g, s, 0)).any().item<bool>();
}
bool copysign_pick(Gen& g, Step& s) {
  return binary(g, s) && !torch::isnan(arg(g, s, 1)).any().item<bool>();
}
// fmax and fmin without zeros of both signs (which one a tie keeps is each loop's choice in
// libtorch).
bool fmax_pick(Gen& g, Step& s) {
  return binary(g, s) && !zeros_of_both_signs(arg(g, s, 0)) && !zeros_of_both_signs(arg(g, s, 1)) &&
         !(torch::eq(arg(g, s, 0), 0).any().item<bool>() &&
           torch::eq(arg(g, s, 1), 0).any().item<bool>());
}

// ---------------------------------------------------------------- padding and pixel shuffles
// pad of the last dim of x (at least 1-D) by p.i[0] and p.i[1] in [0, 2].
bool pad_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; })) return false;
  s.p.i = {g.uniform(0, 2), g.uniform(0, 2)};
  return true;
}
// reflect, replicate and circular padding of the last dim of a floating [C, W] or [N, C, W]
// tensor (W >= 1), each pad below W (reflect: W - 1).
// Not empty (deliberate difference: libtorch 1.13 rejects empty channel dims, kiln pads them).
bool border_pad_pick(Gen& g, Step& s, int64_t shrink) {
  if (!one_value(g, s, [](const torch::Tensor& t) {
        return is_float(t) && (t.dim() == 2 || t.dim() == 3) && t.size(-1) > 1 && t.numel() > 0;
      }))
    return false;
  const int64_t w = arg(g, s, 0).size(-1);
  s.p.i = {g.uniform(0, w - shrink), g.uniform(0, w - shrink)};
  return true;
}
bool reflect_pad_pick(Gen& g, Step& s) {
  return border_pad_pick(g, s, 1);
}
bool replicate_pad_pick(Gen& g, Step& s) {
  return border_pad_pick(g, s, 0);
}
// circular padding of batched [N, C, W] inputs only (deliberate difference: libtorch 1.13 pads
// no unbatched input circularly, kiln does as libtorch 2 does).
bool circular_pad_pick(Gen& g, Step& s) {
  return border_pad_pick(g, s, 0) && rank(arg(g, s, 0)) == 3;
}
// pixel_shuffle by 2 of a new [N..., 4 C, H, W] input, not empty (deliberate difference:
// libtorch 1.13's backward of an empty input returns a gradient of the wrong shape and raises).
bool pixel_shuffle_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  Shape shape = g.random_shape(1);
  for (int64_t d : {4 * g.uniform(1, 2), g.uniform(1, 3), g.uniform(1, 3)}) shape.push_back(d);
  for (int64_t d : shape)
    if (d == 0) return false;
  s.args = {g.new_input(shape, g.random_dtype())};
  return true;
}
// interpolate of a new floating [N, C, H, W] input (values in [0, 1)) to [p.i[0], p.i[1]]
// (1 to 6 each); p.i[2]: align_corners for bilinear.
bool interpolate_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const Shape shape{g.uniform(1, 2), g.uniform(1, 2), g.uniform(1, 4), g.uniform(1, 4)};
  s.args = {g.new_input(shape, g.random_float_dtype(), 0, 1)};
  s.p.i = {g.uniform(1, 6), g.uniform(1, 6), g.uniform(0, 1)};
  return true;
}

// Tensor::unfold of a value of rank >= 1: dim p.i[0], window size p.i[1] (0 to the dim's size),
// step p.i[2] (1 to 3).
bool tensor_unfold_pick(Gen& g, Step& s) {
  if (!one_value(g, s, [](const torch::Tensor& t) { return t.dim() > 0; })) return false;
  const auto& x = arg(g, s, 0);
  const int64_t d = g.dim(rank(x));
  s.p.i = {d, g.uniform(0, x.size(d)), g.uniform(1, 3)};
  return true;
}
// The 1-D poolings of a new floating [N, C, L] input: kernel p.i[0] (at most L), stride p.i[1],
// padding p.i[2] (at most half the kernel).
bool pool1d_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const Shape shape{g.uniform(1, 2), g.uniform(1, 3), g.uniform(1, 7)};
  s.args = {g.new_input(shape, g.random_float_dtype())};
  const int64_t k = g.uniform(1, shape[2]);
  s.p.i = {k, g.uniform(1, 3), g.uniform(0, k / 2)};
  return true;
}
// unfold (im2col) of a new floating [N, C, H, W] input: kernel p.i[0] x p.i[1] (fitting the
// image), padding p.i[2] (0 or 1), stride p.i[3] (1 to 2).
bool im2col_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const Shape shape{g.uniform(1, 2), g.uniform(1, 2), g.uniform(1, 4), g.uniform(1, 4)};
  s.args = {g.new_input(shape, g.random_float_dtype())};
  s.p.i = {g.uniform(1, shape[2]), g.uniform(1, shape[3]), g.uniform(0, 1), g.uniform(1, 2)};
  return true;
}

// adaptive_max_pool2d of a new floating [N, C, H, W] input to p.i[0] x p.i[1] (1 to 5 each, so
// larger than the input too).
bool adaptive_pool_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const Shape shape{g.uniform(1, 2), g.uniform(1, 2), g.uniform(1, 4), g.uniform(1, 4)};
  s.args = {g.new_input(shape, g.random_float_dtype())};
  s.p.i = {g.uniform(1, 5), g.uniform(1, 5)};
  return true;
}
// conv3d of a new [N, C, D, H, W] input by a new [O, C, kD, kH, kW] weight, values in [0, 3)
// (shifted by the rows, as conv_transpose1d_pick): stride p.i[0] (1 to 2), padding p.i[1] (0 to
// 1); the kernel fits the padded input.
bool conv3d_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs) return false;
  const kiln::DType dtype = g.random_float_dtype();
  const int64_t c = g.uniform(1, 2);
  const Shape input{g.uniform(1, 2), c, g.uniform(1, 3), g.uniform(1, 3), g.uniform(1, 3)};
  const Shape weight{g.uniform(1, 2), c, g.uniform(1, 2), g.uniform(1, 2), g.uniform(1, 2)};
  s.p.i = {g.uniform(1, 2), g.uniform(0, 1)};
  for (size_t i = 2; i < 5; ++i)
    if (input[i] + 2 * s.p.i[1] < weight[i]) return false;
  s.args = {g.new_input(input, dtype, 0, 3), g.new_input(weight, dtype, 0, 3)};
  return true;
}
// The 3-D poolings of a new floating [N, C, D, H, W] input: kernel p.i[0] (fitting every dim),
// stride p.i[1], padding p.i[2] (at most half the kernel), ceil_mode p.i[3]; the adaptive ones to
// p.i[4] per dim. The average pools' input has no special values (avg_pool3d_pick): which of inf
// and NaN a window of both and of overflowing values gives depends on the order of the sums.
bool pool3d_geometry(Gen& g, Step& s, double lo) {
  if (g.inputs_full()) return false;
  const Shape shape{g.uniform(1, 2), g.uniform(1, 2), g.uniform(1, 4), g.uniform(1, 4),
                    g.uniform(1, 4)};
  s.args = {g.new_input(shape, g.random_float_dtype(), lo, 3)};
  const int64_t k = g.uniform(1, std::min({shape[2], shape[3], shape[4]}));
  s.p.i = {k, g.uniform(1, 2), g.uniform(0, k / 2), g.uniform(0, 1), g.uniform(1, 4)};
  return true;
}
bool pool3d_pick(Gen& g, Step& s) {
  return pool3d_geometry(g, s, -3);
}
bool avg_pool3d_pick(Gen& g, Step& s) {
  return pool3d_geometry(g, s, 0);
}
// instance_norm of a new floating [N, C, L] input in [0, 3), centred by the row (L >= 3, so that
// no instance is nearly constant; centred, since recorded batch_norm's one-pass sums lose
// relative |mean| / std to cancellation; no special values: libtorch's backward gives NaN where an
// infinite deviation meets a zero invstd, kiln's 0) with new weight and bias [C] in [0, 2) (never
// huge: libtorch's x alpha + beta, alpha = invstd weight, overflows to NaN where kiln's (x - mean)
// invstd weight + bias does not; docs/torch-differences.md).
bool instance_norm_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 3 > g.max_inputs) return false;
  const kiln::DType dtype = g.random_float_dtype();
  const int64_t c = g.uniform(1, 3);
  s.args = {g.new_input({g.uniform(1, 2), c, g.uniform(3, 6)}, dtype, 0, 3),
            g.new_input({c}, dtype, 0, 2), g.new_input({c}, dtype, 0, 2)};
  return true;
}
// local_response_norm of a new floating [N, C, L] input of values in [0, 2) (no special values:
// libtorch's backward multiplies a zero by an infinite term, giving NaN where kiln's gives 0)
// over p.i[0] (1 to 4) channels.
bool local_response_norm_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  s.args = {g.new_input({g.uniform(1, 2), g.uniform(1, 5), g.uniform(1, 3)}, g.random_float_dtype(),
                        0, 2)};
  s.p.i = {g.uniform(1, 4)};
  return true;
}
// conv_transpose1d of a new [N, C, L] input by a new [C, O, k] weight, both of values in [0, 3)
// (shifted to [-1.5, 1.5) by the rows: no special values, whose sums' order decides between inf
// and NaN in either library's GEMM): stride p.i[0] (1 to 2), padding p.i[1] (0 to 1),
// output_padding p.i[2] (below the stride); the output is non-empty.
bool conv_transpose1d_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs) return false;
  const kiln::DType dtype = g.random_float_dtype();
  const int64_t c = g.uniform(1, 3), l = g.uniform(1, 4), k = g.uniform(1, 3);
  s.p.i = {g.uniform(1, 2), g.uniform(0, 1), 0};
  s.p.i[2] = g.uniform(0, s.p.i[0] - 1);
  if ((l - 1) * s.p.i[0] - 2 * s.p.i[1] + k + s.p.i[2] <= 0) return false;
  s.args = {g.new_input({g.uniform(1, 2), c, l}, dtype, 0, 3),
            g.new_input({c, g.uniform(1, 3), k}, dtype, 0, 3)};
  return true;
}
// multi_margin_loss of a floating [N, C] value (C > 0) and new class targets: reduction p.i[0],
// p = p.i[1] (1 or 2). Never an empty input: libtorch 1.13 then sums uninitialized memory.
bool multi_margin_pick(Gen& g, Step& s) {
  if (!cross_entropy_pick(g, s) || arg(g, s, 0).size(0) == 0) return false;
  s.p.i.push_back(g.uniform(1, 2));
  return true;
}
// grid_sample of a new floating [N, C, H, W] input at a new grid [N, oH, oW, 2] of points in
// [0, 2.4) (shifted to [-1.2, 1.2) by the rows): mode p.i[0] (bilinear, nearest), padding p.i[1]
// (zeros, border, reflection), align_corners p.i[2]. Never a non-finite grid point (libtorch
// 1.13's reflection then reads out of bounds and crashes) nor input value (libtorch's grid
// gradient multiplies a clip's zero by it: NaN where kiln's chain rule passes 0); the input's
// values lie in [0, 3).
bool grid_sample_pick(Gen& g, Step& s) {
  if (g.program->inputs.size() + 2 > g.max_inputs) return false;
  const kiln::DType dtype = g.random_float_dtype();
  const int64_t n = g.uniform(1, 2);
  s.args = {g.new_input({n, g.uniform(1, 2), g.uniform(1, 4), g.uniform(1, 4)}, dtype, 0, 3),
            g.new_input({n, g.uniform(1, 3), g.uniform(1, 3), 2}, dtype, 0, 2.4)};
  s.p.i = {g.uniform(0, 1), g.uniform(0, 2), g.uniform(0, 1)};
  return true;
}
// affine_grid of new theta [N, 2, 3] of values in [0, 3) (shifted to [-1.5, 1.5) by the rows:
// no special values, as conv_transpose1d_pick) for an output [N, 1, p.i[0], p.i[1]] (1 to 4
// each); align_corners p.i[2].
bool affine_grid_pick(Gen& g, Step& s) {
  if (g.inputs_full()) return false;
  const int64_t n = g.uniform(1, 2);
  s.args = {g.new_input({n, 2, 3}, g.random_float_dtype(), 0, 3)};
  s.p.i = {n, g.uniform(1, 4), g.uniform(1, 4), g.uniform(0, 1)};
  return true;
}
// embedding_bag of a floating matrix (the weight) at new indices [L] cut into three bags at
// offsets {0, p.i[1], p.i[2]}: mode p.i[0] (sum, mean, max), padding_idx p.i[3] (-1: none).
bool embedding_bag_pick(Gen& g, Step& s) {
  if (!embedding_pick(g, s)) return false;
  const torch::Tensor weight = arg(g, s, 0);  // a handle: new_input may move g's values
  const int64_t count = g.uniform(0, 6), rows = weight.size(0);
  s.args[1] = g.new_input({count}, kiln::kInt64, 0, rows);
  const int64_t cut1 = g.uniform(0, count), cut2 = g.uniform(cut1, count);
  s.p.i = {g.uniform(0, 2), cut1, cut2, g.coin(0.3) ? g.uniform(0, rows - 1) : -1};
  // Never a NaN in a "max" bag (a deliberate difference: libtorch keeps it only from the bag's
  // first row).
  return s.p.i[0] != 2 || !torch::isnan(weight).any().item<bool>();
}
// kiln's padding_idx from embedding_bag_pick's p.i[3].
std::optional<int64_t> padding_index(int64_t i) {
  return i < 0 ? std::nullopt : std::optional<int64_t>(i);
}

// A fresh row-major copy (the result of a matrix function that libtorch lays out column-major):
// both libraries' later views and in-place writes then alias alike.
kiln::Tensor row_major(const kiln::Tensor& t) {
  return t.clone();
}
torch::Tensor row_major(const torch::Tensor& t) {
  return t.clone(at::MemoryFormat::Contiguous);
}

kiln::Reduction kiln_reduction(int64_t r) {
  return static_cast<kiln::Reduction>(r);  // None, Mean, Sum
}
int64_t torch_reduction(int64_t r) {
  return r == 0 ? at::Reduction::None : r == 1 ? at::Reduction::Mean : at::Reduction::Sum;
}

}  // namespace

kiln::Scalar K::scalar(const Params& p, size_t k) {
  return make_scalar<kiln::Scalar>(p, k);
}
c10::Scalar T::scalar(const Params& p, size_t k) {
  return make_scalar<c10::Scalar>(p, k);
}

// One expression for both libraries (DIFF_OP), or one for each (DIFF_OP2: the first is kiln's).
#define DIFF_OP2(name, flags, pick, kiln_expr, torch_expr)                          \
  Op {                                                                              \
    name, flags, pick,                                                              \
        [](const std::vector<kiln::Tensor>& a, const Params& p) -> kiln::Tensor {   \
          using B [[maybe_unused]] = K;                                             \
          using namespace kiln;                                                     \
          (void)a;                                                                  \
          (void)p;                                                                  \
          return kiln_expr;                                                         \
        },                                                                          \
        [](const std::vector<torch::Tensor>& a, const Params& p) -> torch::Tensor { \
          using B [[maybe_unused]] = T;                                             \
          using namespace torch;                                                    \
          (void)a;                                                                  \
          (void)p;                                                                  \
          return torch_expr;                                                        \
        },                                                                          \
        #kiln_expr                                                                  \
  }
#define DIFF_OP(name, flags, pick, expr) DIFF_OP2(name, flags, pick, expr, expr)

const std::vector<Op>& op_table() {
  static const std::vector<Op> table = {
      // ------------------------------------------------ unary
      DIFF_OP("neg", 0, unary, neg(a[0])),
      DIFF_OP("abs", 0, unary, abs(a[0])),
      DIFF_OP("sign", 0, sign_pick, sign(a[0])),
      DIFF_OP("isinf", 0, unary, isinf(a[0])),
      DIFF_OP("count_nonzero", 0, unary, count_nonzero(a[0])),
      DIFF_OP("isposinf", 0, unary, isposinf(a[0])),
      DIFF_OP("isneginf", 0, unary, isneginf(a[0])),
      DIFF_OP("nan_to_num", 0, unary, nan_to_num(a[0])),
      DIFF_OP("nan_to_num_values", 0, unary, nan_to_num(a[0], 1.5, 1e4, -2.0)),
      DIFF_OP("exp", kInexact, unary, exp(a[0])),
      DIFF_OP("log", kInexact, log_pick, log(a[0])),
      DIFF_OP("log1p", kInexact, log1p_pick, log1p(a[0])),
      DIFF_OP("expm1", kInexact, unary, expm1(a[0])),
      DIFF_OP("sqrt", kInexact, unary, sqrt(a[0])),
      DIFF_OP("rsqrt", kInexact, reciprocal_pick, rsqrt(a[0])),
      DIFF_OP("reciprocal", 0, reciprocal_pick, reciprocal(a[0])),
      DIFF_OP("sin", kInexact, periodic_pick, sin(a[0])),
      DIFF_OP("cos", kInexact, periodic_pick, cos(a[0])),
      DIFF_OP("tanh", kInexact, unary, tanh(a[0])),
      DIFF_OP("tan", kInexact, tan_pick, tan(a[0])),
      DIFF_OP("atan", kInexact, unary, atan(a[0])),
      DIFF_OP("asin", kInexact, near_one_pick, asin(a[0])),
      DIFF_OP("acos", kInexact, near_one_pick, acos(a[0])),
      DIFF_OP("sinh", kInexact, unary, sinh(a[0])),
      DIFF_OP("cosh", kInexact, unary, cosh(a[0])),
      DIFF_OP("asinh", kInexact, unary, asinh(a[0])),
      DIFF_OP("acosh", kInexact, near_one_pick, acosh(a[0])),
      DIFF_OP("atanh", kInexact, near_one_pick, atanh(a[0])),
      DIFF_OP("exp2", kInexact, unary, exp2(a[0])),
      DIFF_OP("log2", kInexact, log_pick, log2(a[0])),
      DIFF_OP("log10", kInexact, log_pick, log10(a[0])),
      DIFF_OP("sinc", kInexact, sinc_pick, sinc(a[0])),

      DIFF_OP("sigmoid", kInexact, unary, sigmoid(a[0])),
      DIFF_OP("relu", 0, relu_pick, relu(a[0])),
      DIFF_OP("gelu", kInexact, gelu_pick, gelu(a[0])),
      DIFF_OP("gelu_tanh", kInexact, unary, gelu(a[0], "tanh")),
      DIFF_OP("silu", kInexact, unary, silu(a[0])),
      DIFF_OP("softplus", kInexact, unary, softplus(a[0])),
      DIFF_OP("leaky_relu", 0, float_unary, leaky_relu(a[0], 0.25)),
      DIFF_OP("elu", kInexact, elu_pick, elu(a[0], 0.5)),
      DIFF_OP("selu", kInexact, elu_pick, selu(a[0])),
      DIFF_OP("hardswish", 0, float_unary_no_nan, hardswish(a[0])),
      DIFF_OP("mish", kInexact, float_unary, mish(a[0])),
      DIFF_OP("log_sigmoid", kInexact, float_unary, log_sigmoid(a[0])),
      DIFF_OP2("softsign", 0, float_unary, softsign(a[0]), a[0] / (a[0].abs() + 1)),
      DIFF_OP("hardtanh", 0, float_unary_no_nan, hardtanh(a[0], -0.5, 2.0)),
      DIFF_OP2("relu6", 0, float_unary_no_nan, relu6(a[0]), hardtanh(a[0], 0, 6)),
      DIFF_OP("celu", kInexact, elu_pick, celu(a[0], 0.5)),
      DIFF_OP("softshrink", 0, float_unary_no_nan, softshrink(a[0], 0.5)),
      DIFF_OP("hardshrink", 0, float_unary_no_nan, hardshrink(a[0], 0.5)),
      DIFF_OP2("tanhshrink", kInexact, float_unary, tanhshrink(a[0]), a[0] - a[0].tanh()),
      DIFF_OP("glu", kInexact, glu_pick, glu(a[0], p.i[0])),
      DIFF_OP("prelu", 0, prelu_pick, prelu(a[0], a[1])),
      DIFF_OP("logit", kInexact, logit_pick, logit(a[0])),
      DIFF_OP("logit_eps", kInexact, logit_eps_pick, logit(a[0], 0.25)),
      DIFF_OP("deg2rad", 0, unary, deg2rad(a[0])),
      DIFF_OP("rad2deg", 0, unary, rad2deg(a[0])),
      DIFF_OP2("normalize", kInexact, normalize_pick, normalize(a[0], 2.0, p.i[0]),
               nn::functional::normalize(
                   a[0], nn::functional::NormalizeFuncOptions().p(2.0).dim(p.i[0]))),
      DIFF_OP("cosine_similarity", kInexact, distance_pick,
              cosine_similarity(a[0], a[1], p.i[0], 1e-8)),
      DIFF_OP("pairwise_distance", kInexact, distance_pick,
              pairwise_distance(a[0], a[1], 2.0, 1e-6, p.i[1] != 0)),
      DIFF_OP("erf", kInexact, unary, erf(a[0])),
      DIFF_OP("erfc", kInexact, unary, erfc(a[0])),
      DIFF_OP("erfinv", kInexact, near_one_pick, erfinv(a[0])),
      DIFF_OP("lgamma", kInexact, gamma_pick, lgamma(a[0])),
      DIFF_OP("digamma", kInexact, digamma_pick, digamma(a[0])),
      DIFF_OP("floor", 0, floor_ceil_pick, floor(a[0])),
      DIFF_OP("ceil", 0, floor_ceil_pick, ceil(a[0])),
      DIFF_OP("round", 0, round_pick, round(a[0])),
      DIFF_OP("trunc", 0, floor_ceil_pick, trunc(a[0])),
      DIFF_OP("frac", 0, floor_ceil_pick, frac(a[0])),  // near integers: as floor
      DIFF_OP("square", 0, unary, square(a[0])),
      DIFF_OP("clamp_min", 0, with_scalar, clamp_min(a[0], B::scalar(p, 0))),
      DIFF_OP("clamp_max", 0, with_scalar, clamp_max(a[0], B::scalar(p, 0))),
      DIFF_OP("logical_not", 0, truth_pick, logical_not(a[0])),
      DIFF_OP("isnan", 0, unary, isnan(a[0])),
      DIFF_OP("isfinite", 0, unary, isfinite(a[0])),
      DIFF_OP("clone", 0, unary, a[0].clone()),
      DIFF_OP("contiguous", 0, unary, a[0].contiguous()),
      DIFF_OP("cast", 0, cast_pick, a[0].to(B::dtype(p.i[0]))),
      // ------------------------------------------------ binary, tensors and scalars
      DIFF_OP("add", 0, binary, add(a[0], a[1])),
      DIFF_OP("add_alpha", 0, add_alpha_pick, add(a[0], a[1], B::scalar(p, 0))),
      DIFF_OP("sub", 0, binary, sub(a[0], a[1])),
      DIFF_OP("mul", 0, binary, mul(a[0], a[1])),
      DIFF_OP("div", 0, div_pick, div(a[0], a[1])),
      DIFF_OP("pow", kInexact, pow_pick, pow(a[0], a[1])),
      DIFF_OP("remainder", 0, remainder_pick, remainder(a[0], a[1])),
      DIFF_OP("fmod", 0, remainder_pick, fmod(a[0], a[1])),
      DIFF_OP("xlogy", kInexact, binary, xlogy(a[0], a[1])),
      DIFF_OP("logaddexp", kInexact, binary, logaddexp(a[0], a[1])),
      DIFF_OP("rsub", 0, binary, rsub(a[0], a[1])),
      DIFF_OP("logical_xor", 0, truth_binary_pick, logical_xor(a[0], a[1])),
      DIFF_OP("div_trunc", 0, remainder_pick, div(a[0], a[1], "trunc")),
      DIFF_OP("div_floor", 0, remainder_pick, div(a[0], a[1], "floor")),
      DIFF_OP("floor_divide", 0, remainder_pick, floor_divide(a[0], a[1])),
      DIFF_OP("atan2", kInexact, atan2_pick, atan2(a[0], a[1])),
      DIFF_OP("hypot", kInexact, hypot_pick, hypot(a[0], a[1])),
      // Detached: libtorch's heaviside has no derivative (its backward raises), kiln's is 0.
      DIFF_OP("heaviside", 0, heaviside_pick, heaviside(a[0].detach(), a[1].detach())),
      DIFF_OP("lerp", kInexact, lerp_pick, lerp(a[0], a[1], B::scalar(p, 0))),
      DIFF_OP("minimum", 0, extremum_binary_pick, minimum(a[0], a[1])),
      DIFF_OP("maximum", 0, extremum_binary_pick, maximum(a[0], a[1])),
      DIFF_OP("eq", 0, binary, eq(a[0], a[1])),
      DIFF_OP("ne", 0, binary, ne(a[0], a[1])),
      DIFF_OP("lt", 0, binary, lt(a[0], a[1])),
      DIFF_OP("le", 0, binary, le(a[0], a[1])),
      DIFF_OP("gt", 0, binary, gt(a[0], a[1])),
      DIFF_OP("ge", 0, binary, ge(a[0], a[1])),
      DIFF_OP("logical_and", 0, truth_binary_pick, logical_and(a[0], a[1])),
      DIFF_OP("logical_or", 0, truth_binary_pick, logical_or(a[0], a[1])),
      DIFF_OP("add_scalar", 0, with_scalar, add(a[0], B::scalar(p, 0))),
      DIFF_OP("sub_scalar", 0, with_scalar, sub(a[0], B::scalar(p, 0))),
      DIFF_OP("mul_scalar", 0, with_scalar, mul(a[0], B::scalar(p, 0))),
      DIFF_OP("div_scalar", 0, with_scalar, div(a[0], B::scalar(p, 0))),
      DIFF_OP("pow_scalar", kInexact, with_scalar, pow(a[0], B::scalar(p, 0))),
      DIFF_OP("scalar_pow", kInexact, scalar_pow_pick, pow(B::scalar(p, 0), a[0])),
      DIFF_OP("remainder_scalar", 0, remainder_scalar_pick, remainder(a[0], B::scalar(p, 0))),
      DIFF_OP("fmod_scalar", 0, remainder_scalar_pick, fmod(a[0], B::scalar(p, 0))),
      DIFF_OP("div_floor_scalar", 0, remainder_scalar_pick, div(a[0], B::scalar(p, 0), "floor")),
      DIFF_OP("eq_scalar", 0, with_scalar, eq(a[0], B::scalar(p, 0))),
      DIFF_OP("lt_scalar", 0, with_scalar, lt(a[0], B::scalar(p, 0))),
      DIFF_OP("ge_scalar", 0, with_scalar, ge(a[0], B::scalar(p, 0))),
      // ------------------------------------------------ ternary
      DIFF_OP("where", 0, where_pick, where(a[0], a[1], a[2])),
      DIFF_OP("where_scalar", 0, where_scalar, where(a[0], a[1], B::scalar(p, 0))),
      DIFF_OP("clamp", 0, clamp_pick, clamp(a[0], B::scalar(p, 0), B::scalar(p, 1))),
      DIFF_OP("clamp_min", 0, clamp_min_pick, clamp(a[0], B::scalar(p, 0))),
      DIFF_OP("clamp_max", 0, clamp_max_pick, clamp(a[0], B::none(), B::scalar(p, 1))),
      DIFF_OP("clip", 0, clamp_pick, clip(a[0], B::scalar(p, 0), B::scalar(p, 1))),
      // ------------------------------------------------ views
      DIFF_OP("view", 0, reshape_pick, a[0].view(p.list)),
      DIFF_OP("reshape", 0, reshape_pick, a[0].reshape(p.list)),
      DIFF_OP("transpose", 0, transpose_pick, a[0].transpose(p.i[0], p.i[1])),
      DIFF_OP("permute", 0, permute_pick, a[0].permute(p.list)),
      DIFF_OP("expand", 0, expand_pick, a[0].expand(p.list)),
      DIFF_OP("slice", 0, slice_pick, a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3])),
      DIFF_OP("select", 0, select_pick, a[0].select(p.i[0], p.i[1])),
      DIFF_OP("narrow", 0, narrow_pick, a[0].narrow(p.i[0], p.i[1], p.i[2])),
      DIFF_OP("chunk", 0, chunk_pick, a[0].chunk(p.i[0], p.i[1]).at(p.i[2])),
      DIFF_OP("squeeze", 0, unary, a[0].squeeze()),
      DIFF_OP("squeeze_dim", 0, dim_pick, a[0].squeeze(p.i[0])),
      DIFF_OP("unsqueeze", 0, unsqueeze_pick, a[0].unsqueeze(p.i[0])),
      DIFF_OP("flatten", 0, flatten_pick, a[0].flatten(p.i[0], p.i[1])),
      DIFF_OP("t", 0, matrix_pick, a[0].t()),
      DIFF_OP("diagonal", 0, diagonal_pick, a[0].diagonal(p.i[0], p.i[1], p.i[2])),
      DIFF_OP("diag", 0, diag_pick, diag(a[0], p.i[0])),
      DIFF_OP("tile", 0, tile_pick, a[0].tile(p.list)),
      DIFF_OP("repeat_interleave", 0, repeat_interleave_pick, repeat_interleave(a[0], p.i[0])),
      DIFF_OP("repeat_interleave_dim", 0, repeat_interleave_pick,
              repeat_interleave(a[0], p.i[0], p.i[1])),
      // ------------------------------------------------ in-place writes through a slice
      DIFF_OP("slice_add_", 0, inplace_scalar,
              (a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3]).add_(B::scalar(p, 0)), a[0])),
      DIFF_OP("slice_mul_", 0, inplace_scalar,
              (a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3]).mul_(B::scalar(p, 0)), a[0])),
      DIFF_OP("slice_fill_", 0, inplace_scalar,
              (a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3]).fill_(B::scalar(p, 0)), a[0])),
      DIFF_OP("slice_zero_", 0, inplace_scalar,
              (a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3]).zero_(), a[0])),
      DIFF_OP("slice_add_tensor_", 0, inplace_tensor,
              (a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3]).add_(a[1]), a[0])),
      DIFF_OP("slice_copy_", 0, inplace_tensor,
              (a[0].slice(p.i[0], p.i[1], p.i[2], p.i[3]).copy_(a[1]), a[0])),
      // ------------------------------------------------ reductions
      DIFF_OP("sum", kInexact, sum_pick, a[0].sum(p.list, p.i[0] != 0)),
      DIFF_OP("sum_all", kInexact, whole_sum_pick, a[0].sum()),
      DIFF_OP("mean", kInexact, mean_pick, a[0].mean(p.list, p.i[0] != 0)),
      DIFF_OP("mean_all", kInexact, whole_sum_pick, a[0].mean()),
      DIFF_OP("prod", kInexact, prod_pick, a[0].prod(p.i[0], p.i[1] != 0)),
      DIFF_OP("amax", 0, extremum_list_pick, a[0].amax(p.list, p.i[0] != 0)),
      DIFF_OP("amin", 0, extremum_list_pick, a[0].amin(p.list, p.i[0] != 0)),
      DIFF_OP("max_all", 0, extremum_pick, a[0].max()),
      DIFF_OP("min_all", 0, extremum_pick, a[0].min()),
      DIFF_OP("max_dim", 0, reduce_one, std::get<0>(a[0].max(p.i[0], p.i[1] != 0))),
      DIFF_OP("argmax", 0, argmax_pick, a[0].argmax(p.i[0], p.i[1] != 0)),
      DIFF_OP("argmin", 0, argmin_pick, a[0].argmin(p.i[0], p.i[1] != 0)),
      DIFF_OP2("var", kInexact, var_pick, a[0].var(p.list, p.i[1], p.i[0] != 0),
               at::var(a[0], at::OptionalIntArrayRef(p.list), c10::optional<int64_t>(p.i[1]),
                       p.i[0] != 0)),
      DIFF_OP2("std", kInexact, std_pick, a[0].std(p.list, p.i[1], p.i[0] != 0),
               at::std(a[0], at::OptionalIntArrayRef(p.list), c10::optional<int64_t>(p.i[1]),
                       p.i[0] != 0)),
      DIFF_OP("logsumexp", kInexact, reduce_list, a[0].logsumexp(p.list, p.i[0] != 0)),
      DIFF_OP("nansum", kInexact, sum_pick, a[0].nansum(p.list, p.i[0] != 0)),
      DIFF_OP("nanmean", kInexact, mean_pick, a[0].nanmean(p.list, p.i[0] != 0)),
      DIFF_OP("median_all", 0, median_all_pick, a[0].median()),
      DIFF_OP("median_dim", 0, median_dim_pick, std::get<0>(a[0].median(p.i[0], p.i[1] != 0))),
      DIFF_OP("median_index", 0, median_dim_pick, std::get<1>(a[0].median(p.i[0], p.i[1] != 0))),
      DIFF_OP("nanmedian_all", 0, median_all_pick, a[0].nanmedian()),
      DIFF_OP("nanmedian_dim", 0, nanmedian_dim_pick,
              std::get<0>(a[0].nanmedian(p.i[0], p.i[1] != 0))),
      DIFF_OP("kthvalue", 0, kth_pick, std::get<0>(a[0].kthvalue(p.i[2], p.i[0], p.i[1] != 0))),
      DIFF_OP("kthvalue_index", 0, kth_pick,
              std::get<1>(a[0].kthvalue(p.i[2], p.i[0], p.i[1] != 0))),
      DIFF_OP("trace", kInexact, trace_pick, trace(a[0])),
      DIFF_OP("all", 0, truth_pick, a[0].all()),
      DIFF_OP("any", 0, truth_pick, a[0].any()),
      // ------------------------------------------------ GEMMs
      DIFF_OP("mm", kInexact, mm_pick, mm(a[0], a[1])),
      DIFF_OP("bmm", kInexact, bmm_pick, bmm(a[0], a[1])),
      DIFF_OP("matmul", kInexact, matmul_pick, matmul(a[0], a[1])),
      DIFF_OP("linear", kInexact, linear_pick, linear(a[0], a[1], a[2])),
      DIFF_OP("addmm", kInexact, addmm_pick, addmm(a[0], a[1], a[2])),
      // ------------------------------------------------ matrix functions
      // Copied row-major where libtorch's result is column-major and kiln's row-major (deliberate
      // difference, docs/torch-differences.md): a reshape of it would be a copy in one library
      // and a view in the other, which a later in-place write tells apart (seeds
      // 10712278279345906917, 2009014446644838271).
      DIFF_OP("linalg_solve", kInexact, square_system_pick,
              row_major(linalg::solve(conditioned(a[0]), a[1], true))),
      DIFF_OP("linalg_solve_triangular", kInexact, square_system_pick,
              row_major(linalg::solve_triangular(conditioned(a[0]),
                                                 p.i[1] != 0 ? a[1] : a[1].transpose(-2, -1),
                                                 p.i[0] != 0, p.i[1] != 0, p.i[2] != 0))),
      DIFF_OP("linalg_inv", kInexact, square_pick, row_major(linalg::inv(conditioned(a[0])))),
      DIFF_OP("linalg_det", kInexact, square_pick, linalg::det(conditioned(a[0]))),
      DIFF_OP("linalg_slogdet", kInexact, square_pick,
              std::get<1>(linalg::slogdet(conditioned(a[0])))),
      DIFF_OP("logdet", kInexact, square_pick, logdet(gram(a[0]))),
      DIFF_OP("linalg_cholesky", kInexact, square_pick, row_major(linalg::cholesky(gram(a[0])))),
      // p.i[0]: the factor as U = L^T (upper).
      DIFF_OP("cholesky_solve", kInexact, square_system_pick,
              row_major(cholesky_solve(a[1],
                                       p.i[0] != 0 ? linalg::cholesky(gram(a[0])).transpose(-2, -1)
                                                   : linalg::cholesky(gram(a[0])),
                                       p.i[0] != 0))),
      DIFF_OP("linalg_eigvalsh", kInexact, square_pick, linalg::eigvalsh(gram(a[0]), "L")),
      // |R|: the signs of Householder's R are LAPACK's choice.
      DIFF_OP("linalg_qr_r", kInexact, square_pick,
              row_major(std::get<1>(linalg::qr(conditioned(a[0]), "reduced")).abs())),
      DIFF_OP2("linalg_svdvals", kInexact, rectangular_pick, linalg::svdvals(a[0]),
               torch::linalg::svdvals(a[0], c10::nullopt)),
      DIFF_OP2("linalg_pinv", kInexact, square_pick, linalg::pinv(conditioned(a[0])),
               torch::linalg_pinv(conditioned(a[0]), c10::optional<double>(),
                                  c10::optional<double>(), false)),
      DIFF_OP("linalg_matrix_power", kInexact, matrix_power_pick,
              linalg::matrix_power(conditioned(a[0]), p.i[0])),
      DIFF_OP2("linalg_matrix_norm_nuc", kInexact, rectangular_pick,
               linalg::matrix_norm(a[0], "nuc"),
               torch::linalg::matrix_norm(a[0], "nuc", {-2, -1}, false, c10::nullopt)),
      DIFF_OP2(
          "linalg_vector_norm", kInexact, float_reduce_one,
          linalg::vector_norm(a[0], 3, {p.i[0]}, p.i[1] != 0),
          torch::linalg::vector_norm(a[0], 3, at::IntArrayRef{p.i[0]}, p.i[1] != 0, c10::nullopt)),
      // ------------------------------------------------ scans and searches
      DIFF_OP("cummax", 0, cum_extreme_pick, std::get<0>(a[0].cummax(p.i[0]))),
      DIFF_OP("cummin_index", 0, cum_extreme_pick, std::get<1>(a[0].cummin(p.i[0]))),
      DIFF_OP("logcumsumexp", kInexact, float_reduce_one, a[0].logcumsumexp(p.i[0])),
      DIFF_OP("searchsorted", 0, searchsorted_pick,
              searchsorted(std::get<0>(sort(a[0].flatten())), a[1], false, p.i[0] != 0)),
      // ------------------------------------------------ statistics and grids
      DIFF_OP("quantile", kInexact, quantile_pick,
              quantile(a[0], double(p.i[2]) / 8, p.i[0], p.i[1] != 0, kInterpolations[p.i[3]])),
      DIFF_OP("nanquantile", kInexact, quantile_pick,
              nanquantile(a[0], double(p.i[2]) / 8, p.i[0], p.i[1] != 0, kInterpolations[p.i[3]])),
      DIFF_OP("diff", 0, diff_pick, diff(a[0], p.i[1], p.i[0])),
      DIFF_OP("trapezoid", kInexact, trapezoid_pick, trapezoid(a[0], 0.5, p.i[0])),
      DIFF_OP("cumulative_trapezoid", kInexact, trapezoid_pick,
              cumulative_trapezoid(a[0], 1, p.i[0])),
      DIFF_OP("cov", kInexact, cov_pick, cov(a[0])),
      DIFF_OP("corrcoef", kInexact, cov_pick, corrcoef(a[0])),
      DIFF_OP("rot90", 0, rot90_pick, rot90(a[0], p.i[0], {0, 1})),
      DIFF_OP("block_diag", 0, block_diag_pick, block_diag({a[0], a[1]})),
      DIFF_OP("cdist", kInexact, cdist_pick, cdist(a[0], a[1], double(p.i[0]))),
      DIFF_OP("tensordot", kInexact, tensordot_pick, tensordot(a[0], a[1], {-1}, {0})),
      // ------------------------------------------------ products, LU and sign rows
      DIFF_OP("addmv", kInexact, addmv_pick,
              addmv(kScalings[p.i[0]][0] == 0 ? a[0].detach() : a[0], a[1], a[2],
                    kScalings[p.i[0]][0], kScalings[p.i[0]][1])),
      DIFF_OP("addr", kInexact, addr_pick,
              addr(kScalings[p.i[0]][0] == 0 ? a[0].detach() : a[0], a[1], a[2],
                   kScalings[p.i[0]][0], kScalings[p.i[0]][1])),
      DIFF_OP("baddbmm", kInexact, baddbmm_pick,
              baddbmm(kScalings[p.i[0]][0] == 0 ? a[0].detach() : a[0], a[1], a[2],
                      kScalings[p.i[0]][0], kScalings[p.i[0]][1])),
      DIFF_OP("addbmm", kInexact, addbmm_pick,
              addbmm(kScalings[p.i[0]][0] == 0 ? a[0].detach() : a[0], a[1], a[2],
                     kScalings[p.i[0]][0], kScalings[p.i[0]][1])),
      DIFF_OP("multi_dot", kInexact, multi_dot_pick, linalg::multi_dot({a[0], a[1], a[2]})),
      DIFF_OP2("vecdot", kInexact, vecdot_pick, linalg::vecdot(a[0], a[1]),
               torch::linalg_vecdot(a[0], a[1])),
      // Detached: libtorch's aminmax has no derivative (its backward raises), kiln's is amin's and
      // amax's.
      DIFF_OP("aminmax_min", 0, aminmax_pick,
              std::get<0>(aminmax(a[0].detach(), p.i[0], p.i[1] != 0))),
      DIFF_OP("aminmax_max", 0, aminmax_pick,
              std::get<1>(aminmax(a[0].detach(), p.i[0], p.i[1] != 0))),
      DIFF_OP("take_along_dim", 0, take_along_dim_pick, take_along_dim(a[0], a[1], p.i[0])),
      DIFF_OP("isin", 0, isin_pick, isin(a[0], a[1])),
      DIFF_OP("select_scatter", 0, select_scatter_pick, select_scatter(a[0], a[1], p.i[0], p.i[1])),
      DIFF_OP("diagonal_scatter", 0, diagonal_scatter_pick, diagonal_scatter(a[0], a[1], p.i[0])),
      DIFF_OP("dist", kInexact, mse_pick, dist(a[0], a[1], double(p.i[0] + 1))),
      DIFF_OP("renorm", kInexact, renorm_pick, renorm(a[0], 2, p.i[0], 1.0)),
      DIFF_OP("signbit", 0, sign_source_pick, signbit(a[0])),
      DIFF_OP("copysign", 0, copysign_pick, copysign(a[0], a[1])),
      DIFF_OP("fmax", 0, fmax_pick, fmax(a[0], a[1])),
      DIFF_OP("fmin", 0, fmax_pick, fmin(a[0], a[1])),
      DIFF_OP("float_power", kInexact, pow_pick, float_power(a[0], a[1])),
      // L's strict lower and U's upper triangle (deliberate difference: kiln's gradient ignores
      // the other entries, which are 0 or 1 by construction; libtorch's multiplies an infinite
      // gradient there by 0 and gets NaN).
      DIFF_OP("linalg_lu_l", kInexact, square_pick,
              row_major(tril(std::get<1>(linalg::lu(conditioned(a[0]))), -1))),
      DIFF_OP("linalg_lu_u", kInexact, square_pick,
              row_major(triu(std::get<2>(linalg::lu(conditioned(a[0])))))),
      DIFF_OP("linalg_lu_factor", kInexact, square_pick,
              row_major(std::get<0>(linalg::lu_factor(conditioned(a[0]))))),
      // p.i[0]: adjoint; p.i[1]: left (B transposed for X A = B).
      DIFF_OP2("linalg_lu_solve", kInexact, square_system_pick,
               row_major(linalg::lu_solve(std::get<0>(linalg::lu_factor(conditioned(a[0]))),
                                          std::get<1>(linalg::lu_factor(conditioned(a[0]))),
                                          p.i[1] != 0 ? a[1] : a[1].transpose(-2, -1), p.i[1] != 0,
                                          p.i[0] != 0)),
               row_major(torch::linalg_lu_solve(
                   std::get<0>(torch::linalg::lu_factor(conditioned(a[0]))),
                   std::get<1>(torch::linalg::lu_factor(conditioned(a[0]))),
                   p.i[1] != 0 ? a[1] : a[1].transpose(-2, -1), p.i[1] != 0, p.i[0] != 0))),
      // ------------------------------------------------ padding, pixel shuffles, margin losses
      DIFF_OP2("pad_constant", 0, pad_pick, pad(a[0], {p.i[0], p.i[1]}, "constant", 1.5),
               torch::constant_pad_nd(a[0], {p.i[0], p.i[1]}, 1.5)),
      DIFF_OP2("pad_reflect", 0, reflect_pad_pick, pad(a[0], {p.i[0], p.i[1]}, "reflect"),
               torch::reflection_pad1d(a[0], {p.i[0], p.i[1]})),
      DIFF_OP2("pad_replicate", 0, replicate_pad_pick, pad(a[0], {p.i[0], p.i[1]}, "replicate"),
               torch::replication_pad1d(a[0], {p.i[0], p.i[1]})),
      DIFF_OP2("pad_circular", 0, circular_pad_pick, pad(a[0], {p.i[0], p.i[1]}, "circular"),
               torch::nn::functional::pad(
                   a[0],
                   torch::nn::functional::PadFuncOptions({p.i[0], p.i[1]}).mode(torch::kCircular))),
      DIFF_OP("pixel_shuffle", 0, pixel_shuffle_pick, pixel_shuffle(a[0], 2)),
      DIFF_OP("tensor_unfold", 0, tensor_unfold_pick, a[0].unfold(p.i[0], p.i[1], p.i[2])),
      DIFF_OP2("max_pool1d", 0, pool1d_pick, max_pool1d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]}),
               torch::max_pool1d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]})),
      DIFF_OP2("avg_pool1d", kInexact, pool1d_pick, avg_pool1d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]}),
               torch::avg_pool1d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]})),
      DIFF_OP2("im2col", 0, im2col_pick, unfold(a[0], {p.i[0], p.i[1]}, {1}, {p.i[2]}, {p.i[3]}),
               torch::nn::functional::unfold(
                   a[0], torch::nn::functional::UnfoldFuncOptions({p.i[0], p.i[1]})
                             .padding(p.i[2])
                             .stride(p.i[3]))),
      DIFF_OP2("adaptive_max_pool2d", 0, adaptive_pool_pick,
               adaptive_max_pool2d(a[0], {p.i[0], p.i[1]}),
               std::get<0>(torch::adaptive_max_pool2d(a[0], {p.i[0], p.i[1]}))),
      DIFF_OP2("conv3d", kInexact, conv3d_pick,
               conv3d(a[0] - 1.5, a[1] - 1.5, {}, {p.i[0]}, {p.i[1]}),
               torch::conv3d(a[0] - 1.5, a[1] - 1.5, {}, {p.i[0]}, {p.i[1]})),
      DIFF_OP("max_pool3d", 0, pool3d_pick,
              max_pool3d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]}, {1}, p.i[3] != 0)),
      DIFF_OP2("avg_pool3d", kInexact, avg_pool3d_pick,
               avg_pool3d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]}, p.i[3] != 0),
               torch::avg_pool3d(a[0], {p.i[0]}, {p.i[1]}, {p.i[2]}, p.i[3] != 0)),
      DIFF_OP2("adaptive_avg_pool3d", kInexact, avg_pool3d_pick,
               adaptive_avg_pool3d(a[0], {p.i[4], p.i[4], p.i[4]}),
               torch::adaptive_avg_pool3d(a[0], {p.i[4], p.i[4], p.i[4]})),
      DIFF_OP2("adaptive_max_pool3d", 0, pool3d_pick,
               adaptive_max_pool3d(a[0], {p.i[4], p.i[4], p.i[4]}),
               std::get<0>(torch::adaptive_max_pool3d(a[0], {p.i[4], p.i[4], p.i[4]}))),
      DIFF_OP2("conv_transpose1d", kInexact, conv_transpose1d_pick,
               conv_transpose1d(a[0] - 1.5, a[1] - 1.5, {}, {p.i[0]}, {p.i[1]}, {p.i[2]}),
               torch::conv_transpose1d(a[0] - 1.5, a[1] - 1.5, {}, {p.i[0]}, {p.i[1]}, {p.i[2]})),
      DIFF_OP2("instance_norm", kInexact | kLast, instance_norm_pick,
               instance_norm(a[0] - 1.5, {}, {}, a[1], a[2], true, 0.1, 1e-3),
               torch::instance_norm(a[0] - 1.5, a[1], a[2], {}, {}, true, 0.1, 1e-3, false)),
      DIFF_OP2(
          "local_response_norm", kInexact | kLast, local_response_norm_pick,
          local_response_norm(a[0], p.i[0], 0.5, 0.75, 2.0),
          torch::nn::functional::local_response_norm(
              a[0],
              torch::nn::functional::LocalResponseNormFuncOptions(p.i[0]).alpha(0.5).beta(0.75).k(
                  2.0))),
      DIFF_OP2("grid_sample", kInexact | kLast, grid_sample_pick,
               grid_sample(
                   a[0], a[1] - 1.2, p.i[0] ? "nearest" : "bilinear",
                   std::vector<std::string_view>{"zeros", "border", "reflection"}[size_t(p.i[1])],
                   p.i[2] != 0),
               torch::grid_sampler(a[0], a[1] - 1.2, p.i[0], p.i[1], p.i[2] != 0)),
      DIFF_OP2("affine_grid", kInexact, affine_grid_pick,
               affine_grid(a[0] - 1.5, {p.i[0], 1, p.i[1], p.i[2]}, p.i[3] != 0),
               torch::affine_grid_generator(a[0] - 1.5, {p.i[0], 1, p.i[1], p.i[2]}, p.i[3] != 0)),
      DIFF_OP2(
          "interpolate_nearest", 0, interpolate_pick,
          interpolate(a[0], {p.i[0], p.i[1]}, {}, "nearest"),
          torch::nn::functional::interpolate(a[0], torch::nn::functional::InterpolateFuncOptions()
                                                       .size(std::vector<int64_t>{p.i[0], p.i[1]})
                                                       .mode(torch::kNearest))),
      DIFF_OP2(
          "interpolate_bilinear", kInexact, interpolate_pick,
          interpolate(a[0], {p.i[0], p.i[1]}, {}, "bilinear", p.i[2] != 0),
          torch::nn::functional::interpolate(a[0], torch::nn::functional::InterpolateFuncOptions()
                                                       .size(std::vector<int64_t>{p.i[0], p.i[1]})
                                                       .mode(torch::kBilinear)
                                                       .align_corners(p.i[2] != 0))),
      DIFF_OP2(
          "margin_ranking_loss", kInexact, mse_pick,
          margin_ranking_loss(a[0], a[1], a[1].sign(), 0.25, kiln_diff::kiln_reduction(p.i[0])),
          torch::margin_ranking_loss(a[0], a[1], a[1].sign(), 0.25,
                                     kiln_diff::torch_reduction(p.i[0]))),
      DIFF_OP2(
          "soft_margin_loss", kInexact, mse_pick,
          // Detached: libtorch's soft_margin_loss raises for a target that requires grad.
          soft_margin_loss(a[0], a[1].sign().detach(), kiln_diff::kiln_reduction(p.i[0])),
          torch::soft_margin_loss(a[0], a[1].sign().detach(), kiln_diff::torch_reduction(p.i[0]))),
      DIFF_OP2(
          "hinge_embedding_loss", kInexact, mse_pick,
          hinge_embedding_loss(a[0], a[1].sign(), 0.75, kiln_diff::kiln_reduction(p.i[0])),
          torch::hinge_embedding_loss(a[0], a[1].sign(), 0.75, kiln_diff::torch_reduction(p.i[0]))),
      DIFF_OP2("multi_margin_loss", kInexact | kLast, multi_margin_pick,
               multi_margin_loss(a[0], a[1], p.i[1], 0.75, {}, kiln_diff::kiln_reduction(p.i[0])),
               torch::multi_margin_loss(a[0], a[1], p.i[1], 0.75, {},
                                        kiln_diff::torch_reduction(p.i[0]))),
      DIFF_OP2(
          "poisson_nll_loss", kInexact, mse_pick,
          poisson_nll_loss(a[0], a[1].abs(), true, true, 1e-8, kiln_diff::kiln_reduction(p.i[0])),
          torch::poisson_nll_loss(a[0], a[1].abs(), true, true, 1e-8,
                                  kiln_diff::torch_reduction(p.i[0]))),
      // ------------------------------------------------ indexing and joining
      DIFF_OP("index_select", 0, index_select_pick, index_select(a[0], p.i[0], a[1])),
      DIFF_OP("gather", 0, gather_pick, gather(a[0], p.i[0], a[1])),
      DIFF_OP("embedding", 0, embedding_pick, embedding(a[0], a[1])),
      DIFF_OP2("embedding_bag", kInexact, embedding_bag_pick,
               embedding_bag(a[1], a[0], from_vector<int64_t>({0, p.i[1], p.i[2]}),
                             std::vector<std::string_view>{"sum", "mean", "max"}[size_t(p.i[0])],
                             {}, false, kiln_diff::padding_index(p.i[3])),
               std::get<0>(torch::embedding_bag(
                   a[0], a[1], torch::tensor({0L, p.i[1], p.i[2]}), false, p.i[0], false, {}, false,
                   p.i[3] < 0 ? c10::nullopt : c10::optional<int64_t>(p.i[3])))),
      DIFF_OP("cat", 0, cat_pick, cat({a[0], a[1]}, p.i[0])),
      DIFF_OP("stack", 0, stack_pick, stack({a[0], a[1]}, p.i[0])),
      DIFF_OP("scatter", 0, scatter_pick, scatter(a[0], p.i[0], a[1], a[2])),
      DIFF_OP("scatter_value", 0, scatter_value_pick, scatter(a[0], p.i[0], a[1], B::scalar(p, 0))),
      DIFF_OP("scatter_add", 0, scatter_pick, scatter_add(a[0], p.i[0], a[1], a[2])),
      DIFF_OP("scatter_reduce", 0, scatter_reduce_pick,
              scatter_reduce(a[0], p.i[0], a[1], a[2], kScatterReduce[p.i[1]], p.i[2] != 0)),
      DIFF_OP("index_copy", 0, index_copy_pick, index_copy(a[0], p.i[0], a[1], a[2])),
      DIFF_OP("index_fill", 0, index_fill_pick, index_fill(a[0], p.i[0], a[1], B::scalar(p, 0))),
      DIFF_OP("index_fill_tensor", 0, index_fill_tensor_pick, index_fill(a[0], p.i[0], a[1], a[2])),
      DIFF_OP("masked_scatter", 0, masked_scatter_pick, masked_scatter(a[0], a[1], a[2])),
      DIFF_OP("take", 0, take_pick, take(a[0], a[1])),
      // ------------------------------------------------ neural-network ops
      DIFF_OP("softmax", kInexact, softmax_pick, softmax(a[0], p.i[0])),
      DIFF_OP("log_softmax", kInexact, softmax_pick, log_softmax(a[0], p.i[0])),
      DIFF_OP("layer_norm", kInexact, layer_norm_pick, layer_norm(a[0], p.list, a[1], a[2])),
      DIFF_OP("layer_norm_plain", kInexact, layer_norm_plain_pick, layer_norm(a[0], p.list)),
      DIFF_OP2("cross_entropy", kInexact, cross_entropy_pick,
               cross_entropy(a[0], a[1], kiln_diff::kiln_reduction(p.i[0])),
               at::cross_entropy_loss(a[0], a[1], {}, kiln_diff::torch_reduction(p.i[0]))),
      DIFF_OP2("cross_entropy_options", kInexact, cross_entropy_options_pick,
               cross_entropy(a[0], a[1], a[2].detach(), kiln_diff::kiln_reduction(p.i[0]), p.i[1],
                             p.i[2] * 0.1),
               at::cross_entropy_loss(a[0], a[1], a[2].detach(), kiln_diff::torch_reduction(p.i[0]),
                                      p.i[1], p.i[2] * 0.1)),
      DIFF_OP2("l1_loss", kInexact, mse_pick,
               l1_loss(a[0], a[1], kiln_diff::kiln_reduction(p.i[0])),
               at::l1_loss(broadcast_tensors({a[0], a[1]})[0], broadcast_tensors({a[0], a[1]})[1],
                           kiln_diff::torch_reduction(p.i[0]))),
      DIFF_OP2(
          "huber_loss", kInexact, mse_pick,
          huber_loss(a[0], a[1], kiln_diff::kiln_reduction(p.i[0]), 0.5),
          at::huber_loss(broadcast_tensors({a[0], a[1]})[0], broadcast_tensors({a[0], a[1]})[1],
                         kiln_diff::torch_reduction(p.i[0]), 0.5)),
      DIFF_OP2(
          "smooth_l1_loss", kInexact, mse_pick,
          smooth_l1_loss(a[0], a[1], kiln_diff::kiln_reduction(p.i[0]), 2.0),
          at::smooth_l1_loss(broadcast_tensors({a[0], a[1]})[0], broadcast_tensors({a[0], a[1]})[1],
                             kiln_diff::torch_reduction(p.i[0]), 2.0)),
      DIFF_OP2("mse_loss", kInexact, mse_pick,
               mse_loss(a[0], a[1], kiln_diff::kiln_reduction(p.i[0])),
               at::mse_loss(a[0], a[1], kiln_diff::torch_reduction(p.i[0]))),
  };
  return table;
}

}  // namespace kiln_diff
