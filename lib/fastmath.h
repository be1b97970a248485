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
//   float64: exp and log 1 ulp (fdlibm's algorithms); the other float64 functions keep libm.
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

}  // namespace kiln::detail
