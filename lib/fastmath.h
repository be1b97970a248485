// Transcendental functions in plain arithmetic (no libm calls), so that loops calling them
// vectorize.
//
// The reference kernels of exp, log, log1p, expm1, sin, cos, tanh and erf (and everything built on
// them: sigmoid, silu, gelu, softplus) use these, and the LLVM code generator emits the very same
// operation sequence (fuser/codegen/llvm/cpu_codegen.cpp: no fast-math flags, no contraction,
// selects where these use ?:), so fused and eager results stay bit-identical. Every constant the
// emitter needs lives in the function's struct here. Accuracy against double precision
// (tests/lib/fastmath_test.cpp sweeps every 37th float, and random doubles):
//   float32: exp 1 ulp, tanh 2 ulp (Cephes), erf within 5e-7 (a rational polynomial), log, log1p,
//   expm1 2 ulp (Cephes-style), sin and cos
//            1 ulp over the whole float range (evaluated in double, with an exact integer
//            Payne-Hanek reduction for |x| >= 2^20, after ARM's optimized-routines sinf).
//   float64 (against long double, random doubles of every binade and uniform ones where the
//   cases meet): exp, log, log1p, expm1, erf, sin and cos 1 ulp, tanh 2 ulp (fdlibm's algorithms
//   and coefficients, rewritten branch-free; sin and cos reduce |x| >= 2^20 by an exact integer
//   Payne-Hanek product with 192 bits of 2/pi).
// Special values follow libm: NaN in, NaN out; log of a negative NaN, of 0 -inf; sin/cos of +-inf
// NaN; +-0 kept where libm keeps it.
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln::detail {

// Bit casts (std::bit_cast is C++20).
inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline uint64_t bits_of(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline double double_of(uint64_t u) {
  double x;
  std::memcpy(&x, &u, 8);
  return x;
}

// Constants shared with the code generator.
struct ExpF32 {
  static constexpr float kLo = -103.972084f;        // below: the result rounds to 0
  static constexpr float kHi = 88.72283935546875f;  // from here up: inf
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kMagic = 12582912.0f;   // 1.5 * 2^23: adding it rounds to integer
  static constexpr float kLn2Hi = 0.693359375f;  // ln 2 in two parts, n * hi exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};

// exp(x): Cody-Waite reduction to r in [-ln2/2, ln2/2], e^r by a degree-7 polynomial, times 2^n
// applied as 2^(n/2) * 2^(n - n/2) (both normal numbers) so that subnormal results round once.
inline float exp_f32(float x) {
  using C = ExpF32;
  const float xc = x < C::kLo ? C::kLo : (x > C::kHi ? C::kHi : x);
  const float t = xc * C::kLog2e + C::kMagic;
  const float n = t - C::kMagic;
  float r = xc - n * C::kLn2Hi;
  r = r - n * C::kLn2Lo;
  float p = C::kPoly[0];
  for (int i = 1; i < 6; ++i) p = p * r + C::kPoly[i];
  p = p * (r * r) + r + 1.0f;
  // n's bits (n fits below 2^22), not a conversion: a NaN must not meet a float-to-int
  // conversion (undefined in C++, poison in LLVM IR, which lets LLVM delete a kernel's stores).
  const auto ni = static_cast<int32_t>(bits_of(t) - bits_of(C::kMagic));
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23, b2 = static_cast<uint32_t>(n2 + 127)
                                                                  << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  const float y = (p * s1) * s2;
  return x < C::kLo ? 0.0f : y;
}

struct TanhF32 {
  static constexpr float kSmall = 0.625f;  // below: the odd polynomial
  static constexpr float kPoly[5] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f,
                                     1.33314422036e-1f, -3.33332819422e-1f};
};

// tanh(x): x + x^3 P(x^2) for |x| < 0.625, else 1 - 2 / (e^(2|x|) + 1) with x's sign; +-0 kept.
inline float tanh_f32(float x) {
  using C = TanhF32;
  const float ax = x < 0.0f ? -x : x;
  const float z = x * x;
  float p = C::kPoly[0];
  for (int i = 1; i < 5; ++i) p = p * z + C::kPoly[i];
  const float small = p * z * x + x;
  const float e = exp_f32(ax + ax);
  const float big = 1.0f - 2.0f / (e + 1.0f);
  const float signed_big = x < 0.0f ? -big : big;
  return ax < C::kSmall ? (x == 0.0f ? x : small) : signed_big;
}

struct LogF32 {
  static constexpr float kSmallest = 1.17549435e-38f;  // 2^-126: below, scale subnormals up
  static constexpr float kScale = 8388608.0f;          // 2^23
  static constexpr uint32_t kSqrtHalf = 0x3f3504f3;    // sqrt(1/2)
  static constexpr float kLn2Hi = 0.693359375f;        // ln 2 in two parts, k * hi exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kPoly[9] = {7.0376836292e-2f,  -1.1514610310e-1f, 1.1676998740e-1f,
                                     -1.2420140846e-1f, 1.4249322787e-1f,  -1.6668057665e-1f,
                                     2.0000714765e-1f,  -2.4999993993e-1f, 3.3333331174e-1f};
};

// log(x): x = 2^k m with m in [sqrt(1/2), sqrt(2)) taken from the bits (subnormals scaled by 2^23
// first), f = m - 1 exact, log(1 + f) = f - f^2/2 + f^3 P(f) (Cephes' logf), plus k ln 2 in two
// parts.
inline float log_f32(float x) {
  using C = LogF32;
  const bool sub = x < C::kSmallest;
  const float xs = sub ? x * C::kScale : x;
  const int32_t bias = sub ? 23 : 0;
  const uint32_t ix = bits_of(xs) + (0x3f800000u - C::kSqrtHalf);
  const int32_t k = static_cast<int32_t>(ix >> 23) - 127 - bias;
  const float f = float_of((ix & 0x007fffffu) + C::kSqrtHalf) - 1.0f;
  const float fk = static_cast<float>(k);
  const float z = f * f;
  float p = C::kPoly[0];
  for (int i = 1; i < 9; ++i) p = p * f + C::kPoly[i];
  float y = p * f * z;
  y = y + C::kLn2Lo * fk;
  y = y + -0.5f * z;
  float r = f + y;
  r = r + C::kLn2Hi * fk;
  const float inf = float_of(0x7f800000u);
  r = x < 0.0f ? float_of(0x7fc00000u) : r;
  r = x == 0.0f ? -inf : r;
  r = x == inf ? inf : r;
  return x != x ? x : r;
}

struct Log1pF32 {
  static constexpr float kTiny = 5.96046448e-8f;  // 2^-24: below, log1p(x) rounds to x
};

// log1p(x) = log(u) + c / u with u = 1 + x rounded and c = 1 + x - u exactly (Fast2Sum, the
// larger operand first): the correction carries what rounding u lost.
inline float log1p_f32(float x) {
  const float u = 1.0f + x;
  const float ax = x < 0.0f ? -x : x;
  const float c = ax <= 1.0f ? x - (u - 1.0f) : 1.0f - (u - x);
  float r = log_f32(u) + c / u;
  const float inf = float_of(0x7f800000u);
  r = ax < Log1pF32::kTiny ? x : r;  // +-0 kept
  r = x == -1.0f ? -inf : r;
  return x == inf ? inf : r;
}

struct Expm1F32 {
  static constexpr float kLo = -30.0f;            // below, expm1 rounds to -1
  static constexpr float kTiny = 2.98023224e-8f;  // 2^-25: below, expm1(x) rounds to x
};

// expm1(x) = 2^n (e^r - 1) + (2^n - 1) with x = n ln 2 + r as in exp_f32, e^r - 1 = r + r^2 P(r)
// (exp_f32's polynomial). n = 128 (x near the overflow bound) takes 2^127 and doubles the result.
inline float expm1_f32(float x) {
  using E = ExpF32;
  using C = Expm1F32;
  const float xc = x < C::kLo ? C::kLo : (x > E::kHi ? E::kHi : x);
  const float t = xc * E::kLog2e + E::kMagic;
  const float n = t - E::kMagic;
  const auto ni = static_cast<int32_t>(bits_of(t) - bits_of(E::kMagic));
  float r = xc - n * E::kLn2Hi;
  r = r - n * E::kLn2Lo;
  float p = E::kPoly[0];
  for (int i = 1; i < 6; ++i) p = p * r + E::kPoly[i];
  const float em = p * (r * r) + r;
  const bool big = ni > 127;
  const float s = float_of(static_cast<uint32_t>(ni - (big ? 1 : 0) + 127) << 23);
  float y = s * em + (s - 1.0f);
  y = big ? y * 2.0f : y;
  y = x > E::kHi ? float_of(0x7f800000u) : y;
  const float ax = x < 0.0f ? -x : x;
  return ax < C::kTiny ? x : y;
}

struct SinCosF32 {
  static constexpr float kFast = 1048576.0f;  // 2^20: from here up, the integer reduction
  static constexpr double k2OverPi = 0x1.45f306dc9c883p-1;
  static constexpr double kMagic = 0x1.8p52;          // adding it rounds to integer
  static constexpr double kPio2Hi = 0x1.921fb544p+0;  // pi/2: 33 bits (n * hi exact), the rest
  static constexpr double kPio2Lo = 0x1.0b4611a626331p-34;
  static constexpr double kPi63 = 0x1.921fb54442d18p-62;  // pi * 2^-63
  // Bits of 2/pi: entry j is floor(2/pi * 2^(8j + 8)) mod 2^32.
  static constexpr uint32_t kInvPio2Bits[24] = {
      0x000000a2, 0x0000a2f9, 0x00a2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44,
      0x6e4e4415, 0x4e441529, 0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1,
      0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0, 0x34ddc0db, 0xddc0db62,
      0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041};
  // sin r = r + r^3 S(r^2), cos r = 1 - r^2/2 + r^4 C(r^2) on |r| <= pi/4 (fdlibm's kernels,
  // cut to float accuracy).
  static constexpr double kSin[4] = {-1.66666666666666324348e-01, 8.33333333332248946124e-03,
                                     -1.98412698298579493134e-04, 2.75573137070700676789e-06};
  static constexpr double kCos[4] = {4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                     2.48015872894767294178e-05, -2.75573143513906633035e-07};
};

// |x| for |x| >= 2 as n pi/2 + r, |r| <= pi/4 (n mod 4 in *quadrant): the fixed-point product of
// the float's 24-bit significand and a 96-bit window of 2/pi's bits picked by its exponent, exact
// to 2^-62 of the quadrant (ARM optimized-routines' reduce_large).
inline double reduce_large_f32(uint32_t xi, uint32_t* quadrant) {
  using C = SinCosF32;
  const uint32_t j = (xi >> 26) & 15;
  const uint32_t m = ((xi & 0x7fffffu) | 0x800000u) << ((xi >> 23) & 7);
  const uint64_t r0 = m * C::kInvPio2Bits[j];
  const uint64_t r1 = static_cast<uint64_t>(m) * C::kInvPio2Bits[j + 4];
  const uint64_t r2 = static_cast<uint64_t>(m) * C::kInvPio2Bits[j + 8];
  uint64_t f = ((r2 >> 32) | (r0 << 32)) + r1;  // 2.62 fixed point: x 2/pi mod 4
  const uint64_t n = (f + (uint64_t{1} << 61)) >> 62;
  f = f - (n << 62);
  *quadrant = static_cast<uint32_t>(n);
  return static_cast<double>(static_cast<int64_t>(f)) * C::kPi63;
}

// sin(x) (cosine false) or cos(x) in double: x = n pi/2 + r, then +-sin r or +-cos r by n mod 4
// (cos x = sin(x + pi/2): one more quadrant). |x| < 2^20 reduces by Cody-Waite with pi/2 in two
// parts (exact to 2^-66 there), larger |x| by reduce_large_f32; the vector code computes both
// and selects, here only the one taken. Then one rounding to float: within 1 ulp everywhere.
inline float sincos_f32(float x, bool cosine) {
  using C = SinCosF32;
  const double xd = static_cast<double>(x);
  const float ax = x < 0.0f ? -x : x;
  double r;
  uint32_t q;
  if (ax < C::kFast) {
    const double t = xd * C::k2OverPi + C::kMagic;
    const double n = t - C::kMagic;
    q = static_cast<uint32_t>(bits_of(t));
    r = (xd - n * C::kPio2Hi) - n * C::kPio2Lo;
  } else {
    uint32_t ql;
    const double rl = reduce_large_f32(bits_of(ax), &ql);
    const bool negative = x < 0.0f;
    q = negative ? 0u - ql : ql;
    r = negative ? -rl : rl;
  }
  q = q + (cosine ? 1u : 0u);
  const double z = r * r;
  double s = C::kSin[3];
  for (int i = 2; i >= 0; --i) s = s * z + C::kSin[i];
  s = r * z * s + r;
  double c = C::kCos[3];
  for (int i = 2; i >= 0; --i) c = c * z + C::kCos[i];
  c = (1.0 - 0.5 * z) + z * z * c;
  double v = (q & 1) ? c : s;
  v = (q & 2) ? -v : v;
  auto y = static_cast<float>(v);
  if (!cosine) y = x == 0.0f ? x : y;             // sin(-0) = -0 (the polynomial gives +0)
  return ax < float_of(0x7f800000u) ? y : x - x;  // inf and NaN: NaN
}
inline float sin_f32(float x) {
  return sincos_f32(x, false);
}
inline float cos_f32(float x) {
  return sincos_f32(x, true);
}

struct ExpF64 {
  static constexpr double kLo = -746.0;  // below: 0 (exp(-746) rounds to 0)
  static constexpr double kHi = 710.0;   // above: inf (exp(710) overflows)
  static constexpr double kLog2e = 1.44269504088896338700e+00;
  static constexpr double kMagic = 0x1.8p52;                    // adding it rounds to integer
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 bits: k * hi exact
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kPoly[5] = {1.66666666666666019037e-01, -2.77777777770155933842e-03,
                                      6.61375632143793436117e-05, -1.65339022054652515390e-06,
                                      4.13813679705723846039e-08};
};

// exp(x) in double (fdlibm's e_exp.c): x = k ln 2 + r, |r| <= ln2/2, e^r = 1 + r + r c/(2 - c)
// with c = r - r^2 P(r^2), times 2^k as 2^(k/2) 2^(k - k/2) (so that subnormal results round
// once). k comes from the bits of x log2e + 1.5 2^52 (no float-to-int conversion, so NaN is no
// problem: it flows through r).
inline double exp_f64(double x) {
  using C = ExpF64;
  const double xc = x < C::kLo ? C::kLo : (x > C::kHi ? C::kHi : x);
  const double t = xc * C::kLog2e + C::kMagic;
  const double k = t - C::kMagic;
  const auto ki = static_cast<int64_t>(bits_of(t) - bits_of(C::kMagic));
  const double hi = xc - k * C::kLn2Hi;
  const double lo = k * C::kLn2Lo;
  const double r = hi - lo;
  const double z = r * r;
  double p = C::kPoly[4];
  for (int i = 3; i >= 0; --i) p = p * z + C::kPoly[i];
  const double c = r - z * p;
  const double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
  const int64_t k1 = ki >> 1, k2 = ki - k1;
  const double s1 = double_of(static_cast<uint64_t>(k1 + 1023) << 52);
  const double s2 = double_of(static_cast<uint64_t>(k2 + 1023) << 52);
  return (y * s1) * s2;
}

struct LogF64 {
  static constexpr double kSmallest = 0x1p-1022;  // below, scale subnormals up
  static constexpr double kScale = 0x1p54;
  static constexpr uint64_t kSqrtHalf = 0x3fe6a09e00000000;  // about sqrt(1/2)
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kLg[7] = {6.666666666666735130e-01, 3.999999999940941908e-01,
                                    2.857142874366239149e-01, 2.222219843214978396e-01,
                                    1.818357216161805012e-01, 1.531383769920937332e-01,
                                    1.479819860511658591e-01};
};

// log(x) in double (fdlibm's e_log.c): x = 2^k (1 + f), 1 + f in [sqrt(1/2), sqrt(2)) from the
// bits, s = f / (2 + f), log(1 + f) = f - hfsq + s (hfsq + R(s^2)), hfsq = f^2/2.
inline double log_f64(double x) {
  using C = LogF64;
  const bool sub = x < C::kSmallest;
  const double xs = sub ? x * C::kScale : x;
  const int64_t bias = sub ? 54 : 0;
  const uint64_t ix = bits_of(xs) + (0x3ff0000000000000u - C::kSqrtHalf);
  const int64_t k = static_cast<int64_t>(ix >> 52) - 1023 - bias;
  const double f = double_of((ix & 0x000fffffffffffffu) + C::kSqrtHalf) - 1.0;
  const double hfsq = 0.5 * f * f;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double w = z * z;
  const double t1 = w * (C::kLg[1] + w * (C::kLg[3] + w * C::kLg[5]));
  const double t2 = z * (C::kLg[0] + w * (C::kLg[2] + w * (C::kLg[4] + w * C::kLg[6])));
  const double rr = t2 + t1;
  const double dk = static_cast<double>(k);
  double r = dk * C::kLn2Hi - ((hfsq - (s * (hfsq + rr) + dk * C::kLn2Lo)) - f);
  const double inf = double_of(0x7ff0000000000000u);
  r = x < 0.0 ? double_of(0x7ff8000000000000u) : r;
  r = x == 0.0 ? -inf : r;
  r = x == inf ? inf : r;
  return x != x ? x : r;
}

struct ErfF32 {
  static constexpr float kBound = 4.0f;  // beyond: +-1 to float precision
  static constexpr float kP[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f,
                                  -2.10102402082508e-06f, -5.69250639462346e-05f,
                                  -7.34990630326855e-04f, -2.95459980854025e-03f,
                                  -1.60960333262415e-02f};
  static constexpr float kQ[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f,
                                  -1.68282697438203e-03f, -7.37332916720468e-03f,
                                  -1.42647390514189e-02f};
};

// erf(x) as x P(x^2) / Q(x^2) on [-4, 4] (x clamped to it; NaN compares false and passes
// through), which vectorizes where libm's erff does not; within 5e-7 of the exact value.
inline float erf_f32(float x) {
  using C = ErfF32;
  x = x > C::kBound ? C::kBound : (x < -C::kBound ? -C::kBound : x);
  const float x2 = x * x;
  float p = C::kP[0];
  for (int i = 1; i < 7; ++i) p = p * x2 + C::kP[i];
  float q = C::kQ[0];
  for (int i = 1; i < 5; ++i) q = q * x2 + C::kQ[i];
  return x * p / q;
}

// ---- float64: expm1, log1p, tanh, erf, sin and cos ----
// Written as the vector code runs them: every case computed, the right one selected (where a
// function below branches, the vector code computes both sides and selects the one the branch
// takes), integers taken from the bits of rounded values, table indices clamped, so that no NaN,
// infinity or out-of-range value reaches a float-to-int conversion, a shift or an index.

struct Expm1F64 {
  static constexpr double kLo = -40.0;                       // below: -1 (e^-40 < 2^-57)
  static constexpr double kHi = 7.09782712893383973096e+02;  // above: inf
  static constexpr double kTiny = 0x1p-54;                   // below: x
  // fdlibm's s_expm1.c: R1(z) = 1 + Q1 z + ... + Q5 z^5, z = r^2/2, within 2^-61 on
  // [0, 0.347].
  static constexpr double kQ[5] = {-3.33333333333331316428e-02, 1.58730158725481460165e-03,
                                   -7.93650757867487942473e-05, 4.00821782732936239552e-06,
                                   -2.01099218183624371326e-07};
};

// expm1(x) (fdlibm's algorithm): x = k ln 2 + r as in exp_f64 with r = hi - lo rounded and c
// the rounding's error, expm1(r + c) = r - e with e from fdlibm's rational form, then
// 2^k (1 + expm1(r)) - 1 rearranged by k so that it rounds about once: k = 0: r - e;
// k = -1: (r - e)/2 - 1/2; k = 1: 2 (r - e) + 1; 2 <= k < 20: 2^k (r - e + (1 - 2^-k));
// 20 <= k <= 56: 2^k (r - (e + 2^-k) + 1); else 2^k (r - e + 1) - 1 (k = 1024 as 2^1023 * 2).
inline double expm1_f64(double x) {
  using E = ExpF64;
  using C = Expm1F64;
  const double xc = x < C::kLo ? C::kLo : (x > C::kHi ? C::kHi : x);
  const double t = xc * E::kLog2e + E::kMagic;
  const double kd = t - E::kMagic;
  const uint64_t ku = bits_of(t) - bits_of(E::kMagic);  // k, two's complement
  const auto k = static_cast<int64_t>(ku);
  const double hi = xc - kd * E::kLn2Hi;
  const double lo = kd * E::kLn2Lo;
  const double r = hi - lo;
  const double c = (hi - r) - lo;
  const double hfx = 0.5 * r;
  const double hxs = r * hfx;
  double q = C::kQ[4];
  for (int i = 3; i >= 0; --i) q = q * hxs + C::kQ[i];
  const double r1 = q * hxs + 1.0;
  const double tt = 3.0 - r1 * hfx;
  double e = hxs * ((r1 - tt) / (6.0 - r * tt));
  e = r * (e - c) - c;
  e = e - hxs;
  const double em = r - e;
  const double y_m1 = 0.5 * em - 0.5;
  const double y_p1 = r < -0.25 ? -2.0 * (e - (r + 0.5)) : 2.0 * em + 1.0;
  const bool top = k == 1024;
  const double twopk = double_of((ku - (top ? 1u : 0u) + 1023u) << 52);
  const double twomk = double_of((1023u - ku) << 52);
  double y_far = (em + 1.0) * twopk;
  y_far = (top ? y_far * 2.0 : y_far) - 1.0;
  const double y_mid = (em + (1.0 - twomk)) * twopk;
  const double y_high = ((r - (e + twomk)) + 1.0) * twopk;
  double y = k < 20 ? y_mid : y_high;
  y = k < 0 || k > 56 ? y_far : y;
  y = k == 1 ? y_p1 : y;
  y = k == -1 ? y_m1 : y;
  y = k == 0 ? em : y;
  y = x > C::kHi ? double_of(0x7ff0000000000000u) : y;
  y = x < C::kLo ? -1.0 : y;
  const double ax = x < 0.0 ? -x : x;
  return ax < C::kTiny ? x : y;
}

struct Log1pF64 {
  static constexpr double kTiny = 0x1p-54;  // below: x
};

// log1p(x) as log_f64 computes log(u), u = 1 + x rounded and c = 1 + x - u exactly (Fast2Sum):
// u = 2^k (1 + f), log1p(x) = k ln 2 + log(1 + f) + c / u, the correction added with k ln2's low
// part, before the last roundings (fdlibm's s_log1p.c). Where k = 0, f is x itself (exact).
inline double log1p_f64(double x) {
  using C = LogF64;
  const double u = 1.0 + x;
  const double ax = x < 0.0 ? -x : x;
  const double c = ax <= 1.0 ? x - (u - 1.0) : 1.0 - (u - x);
  const uint64_t iu = bits_of(u) + (0x3ff0000000000000u - C::kSqrtHalf);
  const int64_t k = static_cast<int64_t>(iu >> 52) - 1023;
  const double fu = double_of((iu & 0x000fffffffffffffu) + C::kSqrtHalf) - 1.0;
  const bool k0 = k == 0;
  const double f = k0 ? x : fu;
  const double cu = k0 ? 0.0 : c / u;
  const double hfsq = 0.5 * f * f;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double w = z * z;
  const double t1 = w * (C::kLg[1] + w * (C::kLg[3] + w * C::kLg[5]));
  const double t2 = z * (C::kLg[0] + w * (C::kLg[2] + w * (C::kLg[4] + w * C::kLg[6])));
  const double rr = t2 + t1;
  const double dk = static_cast<double>(k);
  double r = dk * C::kLn2Hi - ((hfsq - (s * (hfsq + rr) + (dk * C::kLn2Lo + cu))) - f);
  const double inf = double_of(0x7ff0000000000000u);
  r = ax < Log1pF64::kTiny ? x : r;  // +-0 kept
  r = x < -1.0 ? double_of(0x7ff8000000000000u) : r;
  r = x == -1.0 ? -inf : r;
  r = x == inf ? inf : r;
  return x != x ? x : r;
}

struct TanhF64 {
  static constexpr double kTiny = 0x1p-28;                    // below: x
  static constexpr double kMid = 5.49306144334054845697e-01;  // log(3)/2: tanh = 1/2
};

// tanh(|x|) = u / (u + 2) below log(3)/2, else 1 - 2 / (u + 2), u = expm1(2|x|) (fdlibm's
// s_tanh.c); x's sign.
inline double tanh_f64(double x) {
  const double ax = x < 0.0 ? -x : x;
  const double u = expm1_f64(ax + ax);
  const double d = u + 2.0;
  double t = ax < TanhF64::kMid ? u / d : 1.0 - 2.0 / d;
  t = x < 0.0 ? -t : t;
  return ax < TanhF64::kTiny ? x : t;  // +-0 kept
}

struct ErfF64 {
  // fdlibm's s_erf.c: its intervals and rational approximations.
  static constexpr double kTiny = 0x1p-28;     // below: x (1 + efx)
  static constexpr double kSmall = 0.84375;    // below: x + x P(x^2) / Q(x^2)
  static constexpr double kMid = 1.25;         // below: erx + P(|x| - 1) / Q(|x| - 1)
  static constexpr double kFar = 0x1.6db6ep1;  // about 1/0.35: from here, R and S's second set
  static constexpr double kBig = 6.0;          // from here: +-1
  static constexpr double kEfx8 = 1.02703333676410069053e+00;  // 8 (2/sqrt(pi) - 1)
  static constexpr double kErx = 8.45062911510467529297e-01;   // erf(1) to float precision
  static constexpr double kPp[5] = {1.28379167095512558561e-01, -3.25042107247001499370e-01,
                                    -2.84817495755985104766e-02, -5.77027029648944159157e-03,
                                    -2.37630166566501626084e-05};
  static constexpr double kQq[6] = {1.0,
                                    3.97917223959155352819e-01,
                                    6.50222499887672944485e-02,
                                    5.08130628187576562776e-03,
                                    1.32494738004321644526e-04,
                                    -3.96022827877536812320e-06};
  static constexpr double kPa[7] = {-2.36211856075265944077e-03, 4.14856118683748331666e-01,
                                    -3.72207876035701323847e-01, 3.18346619901161753674e-01,
                                    -1.10894694282396677476e-01, 3.54783043256182359371e-02,
                                    -2.16637559486879084300e-03};
  static constexpr double kQa[7] = {1.0,
                                    1.06420880400844228286e-01,
                                    5.40397917702171048937e-01,
                                    7.18286544141962662868e-02,
                                    1.26171219808761642112e-01,
                                    1.36370839120290507362e-02,
                                    1.19844998467991074170e-02};
  // erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2) / S(1/x^2)) / x: coefficients for [1.25, 1/0.35),
  // then for [1/0.35, 28) padded with zeros to the same length (a zero leading coefficient
  // changes no bit of Horner's evaluation).
  static constexpr double kRa[8] = {-9.86494403484714822705e-03, -6.93858572707181764372e-01,
                                    -1.05586262253232909814e+01, -6.23753324503260060396e+01,
                                    -1.62396669462573470355e+02, -1.84605092906711035994e+02,
                                    -8.12874355063065934246e+01, -9.81432934416914548592e+00};
  static constexpr double kSa[9] = {1.0,
                                    1.96512716674392571292e+01,
                                    1.37657754143519042600e+02,
                                    4.34565877475229228821e+02,
                                    6.45387271733267880336e+02,
                                    4.29008140027567833386e+02,
                                    1.08635005541779435134e+02,
                                    6.57024977031928170135e+00,
                                    -6.04244152148580987438e-02};
  static constexpr double kRb[8] = {-9.86494292470009928597e-03, -7.99283237680523006574e-01,
                                    -1.77579549177547519889e+01, -1.60636384855821916062e+02,
                                    -6.37566443368389627722e+02, -1.02509513161107724954e+03,
                                    -4.83519191608651397019e+02, 0.0};
  static constexpr double kSb[9] = {1.0,
                                    3.03380607434824582924e+01,
                                    3.25792512996573918826e+02,
                                    1.53672958608443695994e+03,
                                    3.19985821950859553908e+03,
                                    2.55305040643316442583e+03,
                                    4.74528541206955367215e+02,
                                    -2.24409524465858183362e+01,
                                    0.0};
};

// erf(x) on |x| (fdlibm's s_erf.c, every interval computed and the right one selected), then
// x's sign: |x| < 2^-28: x + efx x (as (8x + 8efx x) / 8, exact scalings that keep subnormals);
// < 0.84375: x + x P/Q(x^2); < 1.25: erx + P/Q(|x| - 1); < 6: 1 - erfc(|x|) with erfc from
// exp(-z^2 - 0.5625) exp((z - x)(z + x) + R/S), z = |x| with its low 32 bits cleared (so z^2 is
// exact); from 6 on: 1.
inline double erf_f64(double x) {
  using C = ErfF64;
  const double ax = x < 0.0 ? -x : x;
  const double y_tiny = 0.125 * (8.0 * ax + C::kEfx8 * ax);
  const double z = ax * ax;
  double pp = C::kPp[4];
  for (int i = 3; i >= 0; --i) pp = pp * z + C::kPp[i];
  double qq = C::kQq[5];
  for (int i = 4; i >= 0; --i) qq = qq * z + C::kQq[i];
  const double y_small = ax + ax * (pp / qq);
  const double s = ax - 1.0;
  double pa = C::kPa[6];
  for (int i = 5; i >= 0; --i) pa = pa * s + C::kPa[i];
  double qa = C::kQa[6];
  for (int i = 5; i >= 0; --i) qa = qa * s + C::kQa[i];
  const double y_mid = C::kErx + pa / qa;
  const bool far = ax >= C::kFar;
  const double v = 1.0 / z;
  double rs = far ? C::kRb[7] : C::kRa[7];
  for (int i = 6; i >= 0; --i) rs = rs * v + (far ? C::kRb[i] : C::kRa[i]);
  double ss = far ? C::kSb[8] : C::kSa[8];
  for (int i = 7; i >= 0; --i) ss = ss * v + (far ? C::kSb[i] : C::kSa[i]);
  const double zh = double_of(bits_of(ax) & 0xffffffff00000000u);
  const double ec = exp_f64(-zh * zh - 0.5625) * exp_f64((zh - ax) * (zh + ax) + rs / ss);
  const double y_big = 1.0 - ec / ax;
  double y = ax < C::kBig ? y_big : 1.0;
  y = ax < C::kMid ? y_mid : y;
  y = ax < C::kSmall ? y_small : y;
  y = ax < C::kTiny ? y_tiny : y;
  y = x < 0.0 ? -y : y;
  return x != x ? x : y;
}

struct SinCosF64 {
  static constexpr double kFast = 0x1p20;  // below: Cody-Waite (n < 2^20); from here Payne-Hanek
  static constexpr double k2OverPi = 6.36619772367581382433e-01;
  static constexpr double kMagic = 0x1.8p52;  // adding it rounds to integer
  // pi/2 = kPio2[0] + kPio2[1] + kPio2[2] + kPio2[3] to 152 bits; the first three have 33
  // significant bits, so that n times each is exact for n < 2^20 (fdlibm's pio2_1, pio2_2,
  // pio2_3, pio2_3t).
  static constexpr double kPio2[4] = {1.57079632673412561417e+00, 6.07710050630396597660e-11,
                                      2.02226624871116645580e-21, 8.47842766036889956997e-32};
  static constexpr double kPio2Hi = 0x1.921fb54442d18p0;  // pi/2 as a double-double
  static constexpr double kPio2Lo = 0x1.1a62633145c07p-54;
  static constexpr double kSplit = 134217729.0;  // 2^27 + 1: Veltkamp's splitting
  // Bits of 2/pi behind 63 zero bits: bit p of the table (word p / 32, from its most significant
  // bit) is 2/pi's bit of weight 2^(63 - p). 40 words cover every double's window.
  static constexpr uint32_t kInvPio2Bits[40] = {
      0x00000000, 0x00000000, 0xa2f9836e, 0x4e441529, 0xfc2757d1, 0xf534ddc0, 0xdb629599,
      0x3c439041, 0xfe5163ab, 0xdebbc561, 0xb7246e3a, 0x424dd2e0, 0x06492eea, 0x09d1921c,
      0xfe1deb1c, 0xb129a73e, 0xe88235f5, 0x2ebb4484, 0xe99c7026, 0xb45f7e41, 0x3991d639,
      0x835339f4, 0x9c845f8b, 0xbdf9283b, 0x1ff897ff, 0xde05980f, 0xef2f118b, 0x5a0a6d1f,
      0x6d367ecf, 0x27cb09b7, 0x4f463f66, 0x9e5fea2d, 0x7527bac7, 0xebe5f17b, 0x3d0739f7,
      0x8a5292ea, 0x6bfb5fb1, 0x1f8d5d08, 0x56033046, 0xfc7b6bab};
  // sin r = r + S1 r^3 + ... + S6 r^13 and cos r = 1 - r^2/2 + C1 r^4 + ... + C6 r^14 on
  // |r| <= pi/4, within 2^-58 (fdlibm's k_sin.c and k_cos.c).
  static constexpr double kSin[6] = {-1.66666666666666324348e-01, 8.33333333332248946124e-03,
                                     -1.98412698298579493134e-04, 2.75573137070700676789e-06,
                                     -2.50507602534068634195e-08, 1.58969099521155010221e-10};
  static constexpr double kCos[6] = {4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                     2.48015872894767294178e-05, -2.75573143513906633035e-07,
                                     2.08757232129817482790e-09, -1.13596475577881948265e-11};
};

// s + e = a + b exactly (Knuth's TwoSum).
inline double two_sum(double a, double b, double* e) {
  const double s = a + b;
  const double bb = s - a;
  *e = (a - (s - bb)) + (b - bb);
  return s;
}
// p + e = a * b exactly (Dekker's product, the operands split in halves by Veltkamp's method; no
// fused multiply-add).
inline double two_product(double a, double b, double* e) {
  using C = SinCosF64;
  const double p = a * b;
  const double ta = C::kSplit * a;
  const double ah = ta - (ta - a);
  const double al = a - ah;
  const double tb = C::kSplit * b;
  const double bh = tb - (tb - b);
  const double bl = b - bh;
  *e = (((ah * bh - p) + ah * bl) + al * bh) + al * bl;
  return p;
}

// x = n pi/2 + (hi + lo), |x| < 2^20: n = x 2/pi rounded (its low bits from the rounded value's
// bits); x - n pi/2 with pi/2 in four parts, the first three products exact, summed by TwoSum.
inline uint32_t reduce_medium_f64(double x, double* hi, double* lo) {
  using C = SinCosF64;
  const double t = x * C::k2OverPi + C::kMagic;
  const double n = t - C::kMagic;
  const double a = x - n * C::kPio2[0];
  double e1, e2;
  const double s1 = two_sum(a, -(n * C::kPio2[1]), &e1);
  const double s2 = two_sum(s1, -(n * C::kPio2[2]), &e2);
  const double tail = (e1 + e2) - n * C::kPio2[3];
  *hi = s2 + tail;
  *lo = tail - (*hi - s2);
  return static_cast<uint32_t>(bits_of(t));
}

// |x| >= 2^20 (ix: its bits) as n pi/2 + (hi + lo), Payne-Hanek: |x| = m 2^(E - 1075) with a
// 53-bit integer m, and x 2/pi mod 4 = m W 2^-190 mod 4, W the 192 bits of 2/pi from the one of
// weight 2^(E - 1076) on (the bits before it add multiples of 4; those after, less than 2^-137).
// The product modulo 2^192 is formed from 32-bit limbs (each partial product fits 64 bits,
// each column sum of 32-bit halves well within them), n is its top 2 bits rounded, and the
// rest, a signed fraction of a quadrant with 126 bits (|fraction| >= 2^-62 for every double),
// becomes a double-double and is multiplied by pi/2 (Dekker). The exponent is clamped to
// [1043, 2046] so that other lanes (smaller |x|, inf, NaN) index the table in range.
inline uint32_t reduce_large_f64(uint64_t ix, double* hi, double* lo) {
  using C = SinCosF64;
  uint64_t e = ix >> 52;
  e = e < 1043u ? 1043u : (e > 2046u ? 2046u : e);
  const uint64_t p0 = e - 1013u;  // the window's first bit in the table
  const uint64_t k = p0 >> 5, sh = p0 & 31u;
  uint64_t w[6];  // the window, w[5] most significant
  for (int j = 0; j < 6; ++j) {
    const uint64_t pair =
        (static_cast<uint64_t>(C::kInvPio2Bits[k + j]) << 32) | C::kInvPio2Bits[k + j + 1];
    w[5 - j] = (pair << sh) >> 32;
  }
  const uint64_t m = (ix & 0x000fffffffffffffu) | 0x0010000000000000u;
  const uint64_t m0 = m & 0xffffffffu, m1 = m >> 32;
  uint64_t pa[6], pb[5];
  for (int j = 0; j < 6; ++j) pa[j] = m0 * w[j];
  for (int j = 0; j < 5; ++j) pb[j] = m1 * w[j];
  uint64_t out[6], carry = 0;
  for (int j = 0; j < 6; ++j) {
    uint64_t col = carry + (pa[j] & 0xffffffffu);
    if (j >= 1) col = col + (pa[j - 1] >> 32) + (pb[j - 1] & 0xffffffffu);
    if (j >= 2) col = col + (pb[j - 2] >> 32);
    out[j] = col & 0xffffffffu;
    carry = col >> 32;
  }
  const uint64_t top = (out[5] << 32) | out[4];  // 2.62 fixed point: x 2/pi mod 4
  const uint64_t mid = (out[3] << 32) | out[2];  // the next 64 bits
  const uint64_t n = (top + (uint64_t{1} << 61)) >> 62;
  const uint64_t f = top - (n << 62);  // the fraction's top, signed: |f| <= 2^61
  // The fraction as three exact doubles: f's top 53 bits, its low 11 and mid's top 42, mid's
  // low 22.
  const int64_t f_hi = static_cast<int64_t>(f) >> 11;
  const uint64_t f_mid = ((f & 0x7ffu) << 42) | (mid >> 22);
  const uint64_t f_lo = mid & 0x3fffffu;
  double e1;
  const double s = two_sum(static_cast<double>(f_hi) * 0x1p-51,
                           static_cast<double>(static_cast<int64_t>(f_mid)) * 0x1p-104, &e1);
  const double l = e1 + static_cast<double>(static_cast<int64_t>(f_lo)) * 0x1p-126;
  double pe;
  const double p = two_product(s, C::kPio2Hi, &pe);
  const double e2 = pe + (s * C::kPio2Lo + l * C::kPio2Hi);
  *hi = p + e2;
  *lo = e2 - (*hi - p);
  return static_cast<uint32_t>(n);
}

// sin(x + y) and cos(x + y) for |x| <= pi/4, y the tail (fdlibm's k_sin.c and k_cos.c).
inline double kernel_sin_f64(double x, double y) {
  const auto& s = SinCosF64::kSin;
  const double z = x * x;
  const double w = z * z;
  const double r = (s[1] + z * (s[2] + z * s[3])) + z * w * (s[4] + z * s[5]);
  const double v = z * x;
  return x - ((z * (0.5 * y - v * r) - y) - v * s[0]);
}
inline double kernel_cos_f64(double x, double y) {
  const auto& c = SinCosF64::kCos;
  const double z = x * x;
  const double w = z * z;
  const double r = z * (c[0] + z * (c[1] + z * c[2])) + w * w * (c[3] + z * (c[4] + z * c[5]));
  const double hz = 0.5 * z;
  const double h = 1.0 - hz;  // 1 - hz = h + ((1 - h) - hz) exactly
  return h + (((1.0 - h) - hz) + (z * r - x * y));
}

// sin(x) (cosine false) or cos(x): x = n pi/2 + r (reduce_medium_f64 below 2^20, else
// reduce_large_f64 on |x| and the signs flipped), then +-sin r or +-cos r by n mod 4 (cos x =
// sin(x + pi/2): one more quadrant). The vector code computes both reductions and selects.
inline double sincos_f64(double x, bool cosine) {
  using C = SinCosF64;
  const double ax = x < 0.0 ? -x : x;
  double hi, lo;
  uint32_t q;
  if (ax < C::kFast) {
    q = reduce_medium_f64(x, &hi, &lo);
  } else {
    double hl, ll;
    const uint32_t ql = reduce_large_f64(bits_of(ax), &hl, &ll);
    const bool negative = x < 0.0;
    q = negative ? 0u - ql : ql;
    hi = negative ? -hl : hl;
    lo = negative ? -ll : ll;
  }
  q = q + (cosine ? 1u : 0u);
  const double s = kernel_sin_f64(hi, lo);
  const double c = kernel_cos_f64(hi, lo);
  double v = (q & 1u) ? c : s;
  v = (q & 2u) ? -v : v;
  if (!cosine) v = x == 0.0 ? x : v;                       // sin(-0) = -0
  return ax < double_of(0x7ff0000000000000u) ? v : x - x;  // inf and NaN: NaN
}
inline double sin_f64(double x) {
  return sincos_f64(x, false);
}
inline double cos_f64(double x) {
  return sincos_f64(x, true);
}

}  // namespace kiln::detail
