// kiln's tan, inverse trigonometric and hyperbolic primitives, each defined once over
// lib/math/primitives.h's value families (whose rules they follow: branch-free, no contraction
// but fmadd, libm's special values): tan, atan, atan2, asin, acos, sinh, cosh, asinh, acosh,
// atanh, exp2, log2 and log10. float64 follows fdlibm's algorithms; float32 evaluates the float64
// function of the (exactly) widened argument and rounds once (tan: sin_f32's reduction and
// polynomials in double, then one rounding). Bounds: kUlpBounds, measured by
// tests/lib/ulp_test.cpp.
#pragma once

#include <cstdint>

#include "lib/math/primitives.h"

namespace kiln::math {

// f(x) of a float32 family value by the float64 definition f: one rounding at the end.
template <typename F, typename G>
KILN_MATH_INLINE F through_f64(F x, G f) {
  return convert<float>(f(convert<double>(x)));
}
template <typename F, typename G>
KILN_MATH_INLINE F through_f64(F y, F x, G f) {
  return convert<float>(f(convert<double>(y), convert<double>(x)));
}

// Whether x's sign bit is set (-0 and negative NaNs included).
template <typename F>
KILN_MATH_INLINE auto sign_bit_f64(F x) {
  using U = Like<F, uint64_t>;
  return (bitcast<uint64_t>(x) >> 63) != U(0);
}

struct TrigF64 {
  static constexpr double kPi = 3.1415926535897931160e+00;  // pi as a double-double
  static constexpr double kPiLo = 1.2246467991473531772e-16;
  static constexpr double kPio2 = 1.5707963267948965580e+00;
  static constexpr double kPio4 = 7.8539816339744827900e-01;
  static constexpr double kTiny = 0x1p-27;  // below: atan(x) and asin(x) round to x
  static constexpr uint64_t kNaN = 0x7ff8000000000000u;
};

// ---- tan ----

// tan(x) = sin r / cos r for an even quadrant of x = n pi/2 + r, -cos r / sin r for an odd one:
// sin_f64's reduction and kernels, one division.
template <typename F>
KILN_MATH_INLINE F tan_f64(F x) {
  using U = Like<F, uint32_t>;
  using U64 = Like<F, uint64_t>;
  F hi, lo;
  const U q = reduce_pio2_f64(x, &hi, &lo);
  const F s = kernel_sin_f64(hi, lo), c = kernel_cos_f64(hi, lo);
  const auto odd = (q & U(1)) != U(0);
  F v = select(odd, -c, s) / select(odd, s, c);
  v = select(x == F(0.0), x, v);                                                   // tan(-0) = -0
  return select(abs_of(x) < bitcast<double>(U64(0x7ff0000000000000u)), v, x - x);  // inf, NaN
}

// ---- atan, atan2, asin, acos ----

struct AtanF64 {
  // fdlibm's s_atan.c: atan(c) for c = 0.5, 1, 1.5 and inf as double-doubles, and the odd
  // polynomial's coefficients of even and of odd index.
  static constexpr double kHi[4] = {4.63647609000806093515e-01, 7.85398163397448278999e-01,
                                    9.82793723247329054082e-01, 1.57079632679489655800e+00};
  static constexpr double kLo[4] = {2.26987774529616870924e-17, 3.06161699786838301793e-17,
                                    1.39033110312309984516e-17, 6.12323399573676603587e-17};
  static constexpr double kEven[6] = {3.33333333333329318027e-01, 1.42857142725034663711e-01,
                                      9.09088713343650656196e-02, 6.66107313738753120669e-02,
                                      4.97687799461593236017e-02, 1.62858201153657823623e-02};
  static constexpr double kOdd[5] = {-1.99999999998764832476e-01, -1.11111104054623557880e-01,
                                     -7.69187620504482999495e-02, -5.83357013379057348645e-02,
                                     -3.65315727442169155270e-02};
  // The intervals' lower ends: 7/16, 11/16, 19/16 and 39/16.
  static constexpr double kEnds[4] = {0.4375, 0.6875, 1.1875, 2.4375};
};

// atan(a) for a >= 0 or NaN (fdlibm's s_atan.c): atan(a) = atan(c) + atan(t) with c picked by
// a's interval and t = (a - c) / (1 + c a) in forms exact there ((2a - 1) / (2 + a), ...; -1/a
// from 39/16 on, c = inf), and atan(t) = t - t (s1 + s2), an odd polynomial in t^2.
template <typename F>
KILN_MATH_INLINE F atan_nonneg_f64(F a) {
  using C = AtanF64;
  const auto i0 = a >= F(C::kEnds[0]), i1 = a >= F(C::kEnds[1]), i2 = a >= F(C::kEnds[2]),
             i3 = a >= F(C::kEnds[3]);
  auto pick = [&](F below, F e0, F e1, F e2, F e3) KILN_MATH_LAMBDA_INLINE {
    return select(i3, e3, select(i2, e2, select(i1, e1, select(i0, e0, below))));
  };
  const F one(1.0), two(2.0), three_halves(1.5);
  const F num = pick(a, two * a - one, a - one, a - three_halves, F(-1.0));
  const F den = pick(one, two + a, a + one, one + three_halves * a, a);
  const F t = num / den;
  const F hi = pick(F(0.0), F(C::kHi[0]), F(C::kHi[1]), F(C::kHi[2]), F(C::kHi[3]));
  const F lo = pick(F(0.0), F(C::kLo[0]), F(C::kLo[1]), F(C::kLo[2]), F(C::kLo[3]));
  const F z = t * t, w = z * z;
  const F s = z * horner_up(w, C::kEven) + w * horner_up(w, C::kOdd);
  return hi - ((t * s - lo) - t);
}

template <typename F>
KILN_MATH_INLINE F atan_f64(F x) {
  const F ax = abs_of(x);
  const F r = atan_nonneg_f64(ax);
  return select(ax < F(TrigF64::kTiny), x, select(x < F(0.0), -r, r));  // +-0 kept
}

// atan2(y, x) (fdlibm's e_atan2.c): z = atan(|y| / |x|), pi - z where x's sign bit is set, y's
// sign. The quotient's 0/0 and inf/inf take their limits (0, pi/4); a result of exactly +-pi/2
// (x = +-0 or y = +-inf alone) is that constant, not pi minus a rounded pi/2.
template <typename F>
KILN_MATH_INLINE F atan2_f64(F y, F x) {
  using C = TrigF64;
  using U = Like<F, uint64_t>;
  const auto y_negative = sign_bit_f64(y), x_negative = sign_bit_f64(x);
  const F ay = select(y_negative, -y, y), ax = select(x_negative, -x, x);  // +0 for -0
  const F inf = bitcast<double>(U(0x7ff0000000000000u));
  F z = atan_nonneg_f64(ay / ax);
  z = select((ay == inf) & (ax == inf), F(C::kPio4), z);
  z = select(ay == F(0.0), F(0.0), z);
  F r = select(x_negative, F(C::kPi) - (z - F(C::kPiLo)), z);
  r = select(((ax == F(0.0)) & (ay != F(0.0))) | ((ay == inf) & (ax != inf)), F(C::kPio2), r);
  r = select(y_negative, -r, r);
  return select((x != x) | (y != y), x + y, r);
}

// asin(x) = atan2(x, sqrt(1 - x^2)) and acos(x) = atan2(sqrt(1 - x^2), x), 1 - x^2 rounded once
// (fmadd); |x| > 1 gives a NaN root.
template <typename F>
KILN_MATH_INLINE F asin_f64(F x) {
  return atan2_f64(x, sqrt_of(fmadd(-x, x, F(1.0))));
}
template <typename F>
KILN_MATH_INLINE F acos_f64(F x) {
  return atan2_f64(sqrt_of(fmadd(-x, x, F(1.0))), x);
}

// ---- sinh, cosh, asinh, acosh, atanh ----

struct HyperbolicF64 {
  static constexpr double kTiny = 0x1p-28;   // below: sinh, asinh and atanh round to x
  static constexpr double kHuge = 0x1p28;    // above: asinh(x) = log(2x) to the last bit
  static constexpr double kExpm1Max = 22.0;  // below: sinh and cosh from expm1's or exp's terms
  static constexpr double kExpMax = 7.09782712893383973096e+02;  // log(DBL_MAX)
  static constexpr double kHalfLn2 = 3.46573590279972654709e-01;
  static constexpr double kLn2 = 6.93147180559945286227e-01;
};

// e^|x| / 2, by exp(|x|/2)^2 / 2 above log(DBL_MAX) so that it overflows only where the result
// does (fdlibm's sinh and cosh).
template <typename F>
KILN_MATH_INLINE F half_exp_f64(F ax) {
  const auto huge = ax > F(HyperbolicF64::kExpMax);
  const F e = exp_f64(select(huge, F(0.5) * ax, ax));
  return select(huge, (F(0.5) * e) * e, F(0.5) * e);
}

// sinh(x) (fdlibm's e_sinh.c): t = expm1(|x|), (2t - t^2 / (t + 1)) / 2 below 1, (t + t / (t + 1))
// / 2 below 22, e^|x| / 2 above; x's sign.
template <typename F>
KILN_MATH_INLINE F sinh_f64(F x) {
  using C = HyperbolicF64;
  const F ax = abs_of(x);
  const F t = expm1_f64(ax);
  const F u = t / (t + F(1.0));
  const F near = F(0.5) * select(ax < F(1.0), F(2.0) * t - t * u, t + u);
  const F r = select(ax < F(C::kExpm1Max), near, half_exp_f64(ax));
  return select(ax < F(C::kTiny), x, select(x < F(0.0), -r, r));  // +-0 kept
}

// cosh(x) (fdlibm's e_cosh.c): 1 + t^2 / (2 (1 + t)) with t = expm1(|x|) below ln2 / 2,
// (e^|x| + e^-|x|) / 2 below 22, e^|x| / 2 above.
template <typename F>
KILN_MATH_INLINE F cosh_f64(F x) {
  using C = HyperbolicF64;
  const F ax = abs_of(x);
  const F t = expm1_f64(ax);
  const F w = F(1.0) + t;
  const F small = F(1.0) + (t * t) / (w + w);
  const F e = exp_f64(ax);
  const F mid = F(0.5) * e + F(0.5) / e;
  return select(ax < F(C::kHalfLn2), small, select(ax < F(C::kExpm1Max), mid, half_exp_f64(ax)));
}

// asinh(x) (fdlibm's s_asinh.c) on |x|: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) up to 2,
// log(2|x| + 1 / (sqrt(x^2 + 1) + |x|)) above, log(|x|) + ln 2 above 2^28; x's sign.
template <typename F>
KILN_MATH_INLINE F asinh_f64(F x) {
  using C = HyperbolicF64;
  const F ax = abs_of(x), t = x * x;
  const auto huge = ax > F(C::kHuge);
  const F far_arg = select(huge, ax, F(2.0) * ax + F(1.0) / (sqrt_of(t + F(1.0)) + ax));
  const F far = log_f64(far_arg) + select(huge, F(C::kLn2), F(0.0));
  const F near = log1p_f64(ax + t / (F(1.0) + sqrt_of(F(1.0) + t)));
  const F r = select(ax > F(2.0), far, near);
  return select(ax < F(C::kTiny), x, select(x < F(0.0), -r, r));  // +-0 kept
}

// acosh(x) (fdlibm's e_acosh.c): log1p(u + sqrt(2u + u^2)) with u = x - 1 up to 2,
// log(2x - 1 / (x + sqrt(x^2 - 1))) above, log(x) + ln 2 above 2^28; NaN below 1.
template <typename F>
KILN_MATH_INLINE F acosh_f64(F x) {
  using C = HyperbolicF64;
  using U = Like<F, uint64_t>;
  const auto huge = x > F(C::kHuge);
  const F far_arg = select(huge, x, F(2.0) * x - F(1.0) / (x + sqrt_of(x * x - F(1.0))));
  const F far = log_f64(far_arg) + select(huge, F(C::kLn2), F(0.0));
  const F u = x - F(1.0);
  const F near = log1p_f64(u + sqrt_of(F(2.0) * u + u * u));
  const F r = select(x > F(2.0), far, near);
  return select(x < F(1.0), bitcast<double>(U(TrigF64::kNaN)), r);
}

// atanh(x) (fdlibm's e_atanh.c) on |x|: log1p(2|x| + 2|x| |x| / (1 - |x|)) / 2 below 1/2,
// log1p(2|x| / (1 - |x|)) / 2 from there (+inf at 1, NaN beyond); x's sign.
template <typename F>
KILN_MATH_INLINE F atanh_f64(F x) {
  const F ax = abs_of(x), d = F(1.0) - ax, t = F(2.0) * ax;
  const F r = F(0.5) * log1p_f64(select(ax < F(0.5), t + (t * ax) / d, t / d));
  return select(ax < F(HyperbolicF64::kTiny), x, select(x < F(0.0), -r, r));  // +-0 kept
}

// a (b + b_lo) as a double-double: the rounded product, its error (Dekker's, through fmadd) plus
// a b_lo in *lo.
template <typename F>
KILN_MATH_INLINE F times_double_double(F a, double b, double b_lo, F* lo) {
  const F hi = a * F(b);
  *lo = fmadd(a, F(b), -hi) + a * F(b_lo);
  return hi;
}

// ---- exp2, log2 ----

struct Exp2Log2F64 {
  static constexpr double kLn2 = 6.93147180559945286227e-01;  // ln 2 and 1/ln 2 as double-doubles
  static constexpr double kLn2Lo = 2.31904681384629955842e-17;
  static constexpr double kInvLn2 = 1.44269504088896338700e+00;
  static constexpr double kInvLn2Lo = 2.03552737409310890474e-17;
  static constexpr double kLo = -1076.0;  // below: 0
  static constexpr double kHi = 1025.0;   // above: inf
};

// 2^x: x = k + r with k = round(x) and r = x - k exact (|r| <= 1/2), 2^r = e^(r ln 2) with
// r ln 2 = hi + lo (Dekker's product), e^(hi + lo) = e^hi (1 + lo), then 2^k applied in two
// exact halves as exp_f64 applies it (a subnormal result rounds once). Integers give exact powers.
template <typename F>
KILN_MATH_INLINE F exp2_f64(F x) {
  using C = Exp2Log2F64;
  using U = Like<F, uint64_t>;
  const F xc = clamp(x, F(C::kLo), F(C::kHi));
  const F t = xc + F(ExpF64::kMagic);
  const F k = t - F(ExpF64::kMagic);
  const U ki = bitcast<uint64_t>(t) - U(ExpF64::kMagicBits);
  const F r = xc - k;
  F lo;
  const F hi = times_double_double(r, C::kLn2, C::kLn2Lo, &lo);
  const F e = exp_f64(hi);
  const F y = fmadd(e, lo, e);
  const U k1 = sar(ki, 1), k2 = ki - k1;
  const F s1 = bitcast<double>((k1 + U(1023)) << 52);
  const F s2 = bitcast<double>((k2 + U(1023)) << 52);
  return (y * s1) * s2;
}

// x = 2^k m with m in [sqrt(1/2), sqrt(2)), from the bits (subnormals scaled by 2^54 first):
// returns m, k in *k. The split of log2_f64 and log10_f64.
template <typename F>
KILN_MATH_INLINE F log_split(F x, F* k) {
  using L = LogF64;
  using U = Like<F, uint64_t>;
  const auto subnormal = x < F(L::kSmallest);
  const F xs = select(subnormal, x * F(L::kScale), x);
  const U iu = log_offset_bits(bitcast<uint64_t>(xs));
  *k = convert<double>((iu >> 52) - U(1023)) - select(subnormal, F(54.0), F(0.0));
  return bitcast<double>((iu & U(0x000fffffffffffffu)) + U(L::kSqrtHalf));
}

// r with a logarithm's special values at x: NaN below 0, -inf at 0, x itself at inf and NaN.
template <typename F>
KILN_MATH_INLINE F with_log_specials(F x, F r) {
  using U = Like<F, uint64_t>;
  const F inf = bitcast<double>(U(0x7ff0000000000000u));
  r = select(x == F(0.0), -inf, r);
  r = select(x < F(0.0), bitcast<double>(U(TrigF64::kNaN)), r);
  return select((x == inf) | (x != x), x, r);
}

// log2(x) = k + log(m) / ln 2 with x = 2^k m (log_split) and the quotient a double-double: powers
// of two give k exactly.
template <typename F>
KILN_MATH_INLINE F log2_f64(F x) {
  using C = Exp2Log2F64;
  F k, lo, e;
  const F m = log_split(x, &k);
  const F hi = times_double_double(log_f64(m), C::kInvLn2, C::kInvLn2Lo, &lo);
  const F s = two_sum(k, hi, &e);
  return with_log_specials(x, s + (e + lo));
}

// ---- log10 ----

struct Log10F64 {
  static constexpr double kLog10Of2 = 3.01029995663981198017e-01;  // log10(2) and 1/ln 10 as
  static constexpr double kLog10Of2Lo = -2.80372812778517040e-18;  // double-doubles
  static constexpr double kInvLn10 = 4.34294481903251816668e-01;
  static constexpr double kInvLn10Lo = 1.09831965021676500e-17;
};

// log10(x) = k log10(2) + log(m) / ln 10 with x = 2^k m (log_split), both terms double-doubles
// summed before the one rounding: the powers of ten that doubles hold give their exponent exactly.
template <typename F>
KILN_MATH_INLINE F log10_f64(F x) {
  using C = Log10F64;
  F k, k_lo, l_lo, e;
  const F m = log_split(x, &k);
  const F k_hi = times_double_double(k, C::kLog10Of2, C::kLog10Of2Lo, &k_lo);
  const F l_hi = times_double_double(log_f64(m), C::kInvLn10, C::kInvLn10Lo, &l_lo);
  const F s = two_sum(k_hi, l_hi, &e);
  return with_log_specials(x, s + (e + (k_lo + l_lo)));
}

// ---- float32: the float64 definitions, rounded once ----

#define KILN_THROUGH_F64(f)                                                           \
  template <typename F>                                                               \
  KILN_MATH_INLINE F f##_f32(F x) {                                                   \
    return through_f64(x, [](auto d) KILN_MATH_LAMBDA_INLINE { return f##_f64(d); }); \
  }
KILN_THROUGH_F64(atan)
KILN_THROUGH_F64(asin)
KILN_THROUGH_F64(acos)
KILN_THROUGH_F64(sinh)
KILN_THROUGH_F64(cosh)
KILN_THROUGH_F64(asinh)
KILN_THROUGH_F64(acosh)
KILN_THROUGH_F64(atanh)
KILN_THROUGH_F64(exp2)
KILN_THROUGH_F64(log2)
KILN_THROUGH_F64(log10)
#undef KILN_THROUGH_F64

// tan(x) in double as sin_f32 reduces and evaluates, sin r / cos r (or -cos r / sin r in an odd
// quadrant), then one rounding: a third of tan_f64's cost (whose large reduction every vector
// lane computes).
template <typename F>
KILN_MATH_INLINE F tan_f32(F x) {
  using D = Like<F, double>;
  using U = Like<F, uint32_t>;
  D r, s, c;
  const U q = reduce_pio2_f32(x, &r);
  sin_cos_reduced_f32(r, &s, &c);
  const auto odd = (q & U(1)) != U(0);
  F y = convert<float>(select(odd, -c, s) / select(odd, s, c));
  y = select(x == F(0.0f), x, y);                                       // tan(-0) = -0
  return select(abs_of(x) < bitcast<float>(U(0x7f800000u)), y, x - x);  // inf and NaN: NaN
}

template <typename F>
KILN_MATH_INLINE F atan2_f32(F y, F x) {
  return through_f64(y, x, [](auto b, auto a) KILN_MATH_LAMBDA_INLINE { return atan2_f64(b, a); });
}

}  // namespace kiln::math
