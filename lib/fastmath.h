// float exp, tanh and erf in plain arithmetic (no libm calls), so that loops calling them
// vectorize.
//
// The reference kernels of exp, tanh and erf (and everything built on them: sigmoid, silu, gelu,
// softplus) use these for float32, and the LLVM code generator emits the very same operation
// sequence (fuser/codegen/llvm/cpu_codegen.cpp), so fused and eager results stay bit-identical.
// Both are Cephes' algorithms: exp within 1 ulp, tanh within 2 ulp (tests/lib/fastmath_test.cpp
// checks both against double precision over the whole float range). float64 keeps libm.
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln::detail {

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
  const auto ni = static_cast<int32_t>(n);
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
