// Special functions of lib/math/primitives.h's value families (included at its end): erfc, erfinv,
// lgamma, digamma and trigamma, for float64; the float32 forms compute in float64 and round once.
// Branch-free as the rest of lib/math: every case is computed and the right one selected.
// Special values follow torch (which follows libm and SciPy): erfc(-inf) = 2, erfinv(+-1) = +-inf
// (NaN beyond), lgamma of 0 and of the negative integers +inf, digamma(+-0) = -+inf and NaN at the
// negative integers, trigamma +inf at 0 and the negative integers.
#pragma once

namespace kiln::math {

// +inf and a quiet NaN of a float64 family, from their bits (as exp's overflow).
template <typename F>
KILN_MATH_INLINE F infinity_f64() {
  return bitcast<double>(Like<F, uint64_t>(0x7ff0000000000000u));
}
template <typename F>
KILN_MATH_INLINE F nan_f64() {
  return bitcast<double>(Like<F, uint64_t>(0x7ff8000000000000u));
}

// erfc(x) (fdlibm's s_erf.c, with erf's coefficients): |x| < 0.84375: 1 - (x + x P/Q(x^2)),
// arranged as 0.5 - (x - 0.5 + x P/Q) from 1/4 on so that it does not cancel; < 1.25:
// (1 - erx) - P/Q(|x| - 1), or 1 + (erx + P/Q) for x < 0; < 28: erfc_tail_f64, or 2 minus it for
// x < 0; beyond: 0 (or 2).
template <typename F>
KILN_MATH_INLINE F erfc_f64(F x) {
  using C = ErfF64;
  const F ax = abs_of(x);
  const F z = x * x;
  const F r = x * (horner_up(z, C::kPp) / horner_up(z, C::kQq));
  const F y_small = select(ax < F(0.25), F(1.0) - (x + r), F(0.5) - (r + (x - F(0.5))));
  const F s = ax - F(1.0);
  const F pq = horner_up(s, C::kPa) / horner_up(s, C::kQa);
  const auto negative = x < F(0.0);
  const F y_mid = select(negative, F(1.0) + (F(C::kErx) + pq), F(1.0 - C::kErx) - pq);
  const F tail = erfc_tail_f64(ax);
  F y = select(negative, F(2.0), F(0.0));
  y = select(ax < F(28.0), select(negative, F(2.0) - tail, tail), y);
  y = select(ax < F(C::kMid), y_mid, y);
  y = select(ax < F(C::kSmall), y_small, y);
  return select(x != x, x, y);
}
template <typename F>
KILN_MATH_INLINE F erfc_f32(F x) {
  return convert<float>(erfc_f64(convert<double>(x)));
}

// erfinv(y): Winitzki's closed form (relative error below 2e-3) refined by two Halley steps on
// f(x) = erf(x) - |y|, written (1 - |y|) - erfc(x) beyond |y| = 1/2 (1 - |y| is exact there, so
// the tail keeps its relative accuracy): x -= u / (1 + x u), u = f / f', f' = 2/sqrt(pi) e^(-x^2).
// Each step cubes the relative error. +-1 give +-inf, |y| > 1 NaN, +-0 themselves.
template <typename F>
KILN_MATH_INLINE F erfinv_f64(F y) {
  constexpr double kA = 0.147;  // Winitzki's constant
  constexpr double kTwoOverPiA = 2.0 / (3.141592653589793 * kA);
  constexpr double kTwoOverSqrtPi = 1.1283791670955126;
  const F a = abs_of(y);
  const F q = F(1.0) - a;
  const F w = log_f64(q * (F(1.0) + a));  // log(1 - y^2)
  const F t = F(kTwoOverPiA) + F(0.5) * w;
  F x = sqrt_of(sqrt_of(t * t - w * F(1.0 / kA)) - t);
  const auto tail = a > F(0.5);
  for (int step = 0; step < 2; ++step) {
    const F f = select(tail, q - erfc_f64(x), erf_f64(x) - a);
    const F u = f / (F(kTwoOverSqrtPi) * exp_f64(-(x * x)));
    x = x - u / fmadd(x, u, F(1.0));
  }
  x = select(a == F(1.0), infinity_f64<F>(), x);
  x = select(a > F(1.0), nan_f64<F>(), x);
  x = select(y < F(0.0), -x, x);
  return select((a == F(0.0)) | (y != y), y, x);
}
template <typename F>
KILN_MATH_INLINE F erfinv_f32(F y) {
  return convert<float>(erfinv_f64(convert<double>(y)));
}

// sin(pi x) and cos(pi x) for finite x, the argument reduced exactly: y = x - 2 trunc(x / 2) in
// (-2, 2), n the integer nearest 2y, t = y - n/2 in [-1/4, 1/4]; then sin and cos of pi t rotated
// by n quarter turns.
template <typename F>
struct SinCos {
  F sin, cos;
};
template <typename F>
KILN_MATH_INLINE SinCos<F> sin_cos_pi_f64(F x) {
  const F y = x - F(2.0) * trunc_of(x * F(0.5));
  const F n = trunc_of(F(2.0) * y + select(y < F(0.0), F(-0.5), F(0.5)));
  const F t = y - F(0.5) * n;
  const F st = sin_f64(F(3.141592653589793) * t), ct = cos_f64(F(3.141592653589793) * t);
  F quarter = select(n < F(0.0), n + F(4.0), n);  // 0 to 4
  quarter = select(quarter >= F(4.0), quarter - F(4.0), quarter);
  const auto odd = (quarter == F(1.0)) | (quarter == F(3.0));
  const auto half_turn = quarter >= F(2.0);
  const F s = select(odd, ct, st), c = select(odd, -st, ct);
  return {select(half_turn, -s, s), select(half_turn, -c, c)};
}

struct LgammaF64 {
  // fdlibm's e_lgamma_r.c: its intervals and approximations (ascending coefficients).
  static constexpr double kTc = 1.46163214496836224576e+00;   // where lgamma is least
  static constexpr double kTf = -1.21486290535849611461e-01;  // lgamma(tc)
  static constexpr double kTt = -3.63867699703950536541e-18;  // -(tf's tail)
  // Around 1 and 2 (y = 1 - x or 2 - x): y A_even(y^2) + y^2 A_odd(y^2) - y / 2.
  static constexpr double kAEven[6] = {7.72156649015328655494e-02, 6.73523010531292681824e-02,
                                       7.38555086081402883957e-03, 1.19270763183362067845e-03,
                                       2.20862790713908385557e-04, 2.52144565451257326939e-05};
  static constexpr double kAOdd[6] = {3.22467033424113591611e-01, 2.05808084325167332806e-02,
                                      2.89051383673415629091e-03, 5.10069792153511336608e-04,
                                      1.08011567247583939954e-04, 4.48640949618915160150e-05};
  // Around tc (y = x - tc): tf + y^2 T0(y^3) - (tt - y^3 (T1(y^3) + y T2(y^3))).
  static constexpr double kT0[5] = {4.83836122723810047042e-01, -3.27885410759859649565e-02,
                                    6.10053870246291332635e-03, -1.40346469989232843813e-03,
                                    3.15632070903625950361e-04};
  static constexpr double kT1[5] = {-1.47587722994593911752e-01, 1.79706750811820387126e-02,
                                    -3.68452016781138256760e-03, 8.81081882437654011382e-04,
                                    -3.12754168375120860518e-04};
  static constexpr double kT2[5] = {6.46249402391333854778e-02, -1.03142241298341437450e-02,
                                    2.25964780900612472250e-03, -5.38595305356740546715e-04,
                                    3.35529192635519073543e-04};
  // Near 0 and 1 (y = x or x - 1): -y / 2 + y U(y) / V(y).
  static constexpr double kU[6] = {-7.72156649015328655494e-02, 6.32827064025093366517e-01,
                                   1.45492250137234768737e+00,  9.77717527963372745603e-01,
                                   2.28963728064692451092e-01,  1.33810918536787660377e-02};
  static constexpr double kV[6] = {1.0,
                                   2.45597793713041134822e+00,
                                   2.12848976379893395361e+00,
                                   7.69285150456672783825e-01,
                                   1.04222645593369134254e-01,
                                   3.21709242282423911810e-03};
  // [2, 8): y = x - floor(x): y / 2 + y S(y) / R(y), plus log((y + 2) ... (y + floor(x) - 1)).
  static constexpr double kS[7] = {-7.72156649015328655494e-02, 2.14982415960608852501e-01,
                                   3.25778796408930981787e-01,  1.46350472652464452805e-01,
                                   2.66422703033638609560e-02,  1.84028451407337715652e-03,
                                   3.19475326584100867617e-05};
  static constexpr double kR[7] = {1.0,
                                   1.39200533467621045958e+00,
                                   7.21935547567138069525e-01,
                                   1.71933865632803078993e-01,
                                   1.86459191715652901344e-02,
                                   7.77942496381893596434e-04,
                                   7.32668430744625636189e-06};
  // [8, 2^58): (x - 1/2)(log x - 1) + W(1/x) (Stirling's series, minimax).
  static constexpr double kW0 = 4.18938533204672725052e-01;
  static constexpr double kW[6] = {8.33333333333329678849e-02, -2.77777777728775536470e-03,
                                   7.93650558643019558500e-04, -5.95187557450339963135e-04,
                                   8.36339918996282139126e-04, -1.63092934096575273989e-03};
};

// lgamma of a > 0 below 2 (fdlibm's three approximations, picked by where a lies).
template <typename F>
KILN_MATH_INLINE F lgamma_below_two_f64(F a) {
  using C = LgammaF64;
  const auto low = a < F(0x1.ccccdp-1);  // below about 0.9: lgamma(a + 1) - log(a)
  const F r0 = select(low, -log_f64(a), F(0.0));
  // kind 0: around 1 or 2; kind 1: around tc; kind 2: near 0 or 1.
  const auto high = !low;
  const auto kind0 = (low & (a >= F(0x1.76944p-1))) | (high & (a >= F(0x1.bb4c3p+0)));
  const auto kind1 = (!kind0) & ((low & (a >= F(0x1.da661p-3))) | (high & (a >= F(0x1.3b4c4p+0))));
  F y = select(low, a, a - F(1.0));                                       // kind 2
  y = select(kind1, select(low, a - F(C::kTc - 1.0), a - F(C::kTc)), y);  // kind 1
  y = select(kind0, select(low, F(1.0) - a, F(2.0) - a), y);              // kind 0
  const F z = y * y, w = z * y;
  const F v0 = fmadd(y, horner_up(z, C::kAEven), z * horner_up(z, C::kAOdd)) - F(0.5) * y;
  const F p1 = horner_up(w, C::kT0), p2 = horner_up(w, C::kT1), p3 = horner_up(w, C::kT2);
  const F v1 = F(C::kTf) + (z * p1 - (F(C::kTt) - w * (p2 + y * p3)));
  const F v2 = F(-0.5) * y + y * horner_up(y, C::kU) / horner_up(y, C::kV);
  return r0 + select(kind0, v0, select(kind1, v1, v2));
}

// lgamma of a in [2, 8): the rational approximation on [2, 3) shifted up by the recurrence.
template <typename F>
KILN_MATH_INLINE F lgamma_two_to_eight_f64(F a) {
  using C = LgammaF64;
  const F i = trunc_of(a);
  const F y = a - i;
  const F r = F(0.5) * y + y * horner_up(y, C::kS) / horner_up(y, C::kR);
  F product = F(1.0);
  for (int k = 3; k <= 7; ++k) product = select(i >= F(k), product * (y + F(k - 1)), product);
  return r + log_f64(product);
}

// log|Gamma(x)| (fdlibm's e_lgamma_r.c): a = |x| < 2^-70: -log(a); < 2, < 8, < 2^58 and beyond:
// the approximations above, Stirling's series and a (log a - 1); for x < 0 the reflection
// log(pi / |x sin(pi x)|) - lgamma(-x), +inf at the negative integers.
template <typename F>
KILN_MATH_INLINE F lgamma_f64(F x) {
  using C = LgammaF64;
  const F a = abs_of(x);
  const F log_a = log_f64(a);
  const F inv = F(1.0) / a;
  const F stirling =
      fmadd(a - F(0.5), log_a - F(1.0), fmadd(inv, horner_up(inv * inv, C::kW), F(C::kW0)));
  F r = select(a < F(0x1p58), stirling, a * (log_a - F(1.0)));
  r = select(a < F(8.0), lgamma_two_to_eight_f64(a), r);
  r = select(a < F(2.0), lgamma_below_two_f64(a), r);
  const SinCos<F> pi_x = sin_cos_pi_f64(x);
  const F reflected = log_f64(F(3.141592653589793) / abs_of(pi_x.sin * x)) - r;
  const auto pole = (x <= F(0.0)) & (trunc_of(x) == x);  // 0, the negative integers, -inf
  r = select(x < F(0.0), reflected, r);
  r = select(a < F(0x1p-70), -log_a, r);
  r = select(pole, infinity_f64<F>(), r);
  return select(x != x, x, r);
}
template <typename F>
KILN_MATH_INLINE F lgamma_f32(F x) {
  return convert<float>(lgamma_f64(convert<double>(x)));
}

struct DigammaF64 {
  // The positive zero of digamma, as a double and the rest.
  static constexpr double kRootHi = 1.4616321449683622;
  static constexpr double kRootLo = 9.549995429965697e-17;
  // digamma(b) / (b - root) on [1, 2] as a polynomial in u = 2b - 3 (Chebyshev interpolation of
  // degree 22, computed with mpmath at 60 digits: relative error below 2e-16 in double).
  static constexpr double kFit[23] = {
      0.9510558760318328,     -0.2118137106407303,     0.060135621060196744,
      -0.018550615381735115,  0.005936795278305649,    -0.0019350666648590097,
      0.0006368880303257201,  -0.00021074841140458636, 6.995018873950506e-05,
      -2.325824239445257e-05, 7.741232223504057e-06,   -2.57809436305308e-06,
      8.589127353033379e-07,  -2.86315275846934e-07,   9.542050972688906e-08,
      -3.163020268955334e-08, 1.0542687624027994e-08,  -3.7075072647122386e-09,
      1.2358072433984831e-09, -2.7619635330317715e-10, 9.206434499177992e-11,
      -8.498137230186096e-11, 2.832706668021759e-11};
  // The asymptotic series from 10 on: log x - 1/(2x) - z A(z), z = 1/x^2, A's coefficients
  // B_2k / 2k (the Bernoulli numbers) for k = 1..7.
  static constexpr double kAsymptotic[7] = {1.0 / 12,  -1.0 / 120,       1.0 / 252, -1.0 / 240,
                                            1.0 / 132, -691.0 / 32760.0, 1.0 / 12};
};

// digamma of a > 0: from 10 on the asymptotic series; below, the fit on [1, 2) at b = a - m
// (m = floor(a) - 1, so b is exact) plus the recurrence's 1/(a - k) for k = 1..m (all positive,
// so nothing cancels), or minus 1/a below 1 (m = -1).
template <typename F>
KILN_MATH_INLINE F digamma_positive_f64(F a) {
  using C = DigammaF64;
  const F z = F(1.0) / (a * a);
  const F asymptotic = (log_f64(a) - F(0.5) / a) - z * horner_up(z, C::kAsymptotic);
  const F m = trunc_of(a) - F(1.0);
  const F b = a - m;
  const F near_root =
      ((b - F(C::kRootHi)) - F(C::kRootLo)) * horner_up(F(2.0) * b - F(3.0), C::kFit);
  F shift = F(0.0);
  for (int k = 1; k <= 8; ++k) shift = shift + select(F(k) <= m, F(1.0) / (a - F(k)), F(0.0));
  shift = select(a < F(1.0), F(-1.0) / a, shift);
  return select(a < F(10.0), shift + near_root, asymptotic);
}

// digamma(x): x > 0 above; x < 0 by the reflection digamma(1 - x) - pi cos(pi x) / sin(pi x); NaN
// at the negative integers and -inf, -1/x at +-0 (torch's -inf and +inf).
template <typename F>
KILN_MATH_INLINE F digamma_f64(F x) {
  const auto integer = trunc_of(x) == x;
  const SinCos<F> pi_x = sin_cos_pi_f64(x);
  const auto negative = x < F(0.0);
  const F a = select(negative, F(1.0) - x, x);
  const F positive = digamma_positive_f64(a);
  F r = select(negative, positive - F(3.141592653589793) * pi_x.cos / pi_x.sin, positive);
  r = select(negative & integer, nan_f64<F>(), r);
  r = select(x == F(0.0), F(-1.0) / x, r);
  return select(x != x, x, r);
}
template <typename F>
KILN_MATH_INLINE F digamma_f32(F x) {
  return convert<float>(digamma_f64(convert<double>(x)));
}

struct TrigammaF64 {
  // The asymptotic series from 10 on: (1 + 1/(2x) + z B(z)) / x, z = 1/x^2, B's coefficients the
  // Bernoulli numbers B_2k for k = 1..9.
  static constexpr double kAsymptotic[9] = {1.0 / 6,   -1.0 / 30,     1.0 / 42,
                                            -1.0 / 30, 5.0 / 66,      -691.0 / 2730.0,
                                            7.0 / 6,   -3617.0 / 510, 43867.0 / 798};
};

// trigamma(x) = polygamma(1, x): for 0 < x < 10, trigamma(x + 10) plus 1/(x + k)^2 for k = 0..9
// (all positive); from 10 the asymptotic series; x < 0 by the reflection
// pi^2 / sin^2(pi x) - trigamma(1 - x). +inf at 0 and the negative integers, NaN at -inf.
template <typename F>
KILN_MATH_INLINE F trigamma_f64(F x) {
  using C = TrigammaF64;
  const SinCos<F> pi_x = sin_cos_pi_f64(x);
  const auto negative = x < F(0.0);
  const F a = select(negative, F(1.0) - x, x);
  const auto shifted = a < F(10.0);
  const F s = select(shifted, a + F(10.0), a);
  const F inv = F(1.0) / s;
  const F asymptotic =
      inv * (F(1.0) + (F(0.5) * inv + inv * inv * horner_up(inv * inv, C::kAsymptotic)));
  F shift = F(0.0);
  for (int k = 9; k >= 0; --k) {
    const F d = a + F(k);
    shift = shift + F(1.0) / (d * d);
  }
  const F positive = select(shifted, asymptotic + shift, asymptotic);
  const F reflected = F(9.869604401089358) / (pi_x.sin * pi_x.sin) - positive;
  F r = select(negative, reflected, positive);
  r = select((x <= F(0.0)) & (trunc_of(x) == x), infinity_f64<F>(), r);
  r = select(x == -infinity_f64<F>(), nan_f64<F>(), r);
  return select(x != x, x, r);
}
template <typename F>
KILN_MATH_INLINE F trigamma_f32(F x) {
  return convert<float>(trigamma_f64(convert<double>(x)));
}

}  // namespace kiln::math
