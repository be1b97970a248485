// lib/fastmath.h against higher precision: the float32 functions against double-precision libm
// over the whole float range (exp within 1 ulp, tanh 2, log, log1p and expm1 2, sin and cos 1, of
// the correctly rounded result), the float64 ones against long double (random doubles of every
// binade plus uniform ones in the intervals where each function's cases meet): exp, log, log1p,
// expm1, erf, sin and cos within 1 ulp, tanh within 2; special values exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "lib/fastmath.h"

namespace kiln::detail {
namespace {

// Distance in representable floats (same sign; both finite).
int64_t ulps(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(b));
}

template <typename Fast, typename Exact>
int64_t max_ulps_over_floats(Fast fast, Exact exact, float* worst, uint64_t stride = 37) {
  int64_t max = 0;
  // Every stride-th float of either sign, finite only: about 116 million values for 37.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += stride) {
    const auto b32 = static_cast<uint32_t>(bits);
    float x;
    std::memcpy(&x, &b32, 4);
    if (!std::isfinite(x)) continue;
    const float want = static_cast<float>(exact(static_cast<double>(x)));
    const float got = fast(x);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "x = " << x;
      continue;
    }
    if (std::isinf(want) || want == 0.0f) {
      EXPECT_EQ(got, want) << "x = " << x;
      continue;
    }
    const int64_t u = ulps(got, want);
    if (u > max) {
      max = u;
      *worst = x;
    }
  }
  return max;
}

// Every 101st float of either sign (42 million), finite only.
template <typename Fast, typename Exact>
void expect_float_ulps(const char* name, Fast fast, Exact exact, int64_t bound) {
  float worst = 0;
  const int64_t max = max_ulps_over_floats(fast, exact, &worst, 101);
  EXPECT_LE(max, bound) << name << " at x = " << worst;
  std::printf("%s: at most %lld ulp (worst at %.9g)\n", name, static_cast<long long>(max), worst);
}

// Distance in representable doubles (both finite).
int64_t ulps64(double a, double b) {
  auto key = [](double f) {
    int64_t i;
    std::memcpy(&i, &f, 8);
    return i < 0 ? static_cast<long double>(INT64_MIN) - i : static_cast<long double>(i);
  };
  return static_cast<int64_t>(std::fabs(key(a) - key(b)));
}

// Random doubles: uniform bit patterns (every binade alike) and uniform values in [lo, hi].
template <typename Fast, typename Exact>
void expect_double_ulps(const char* name, Fast fast, Exact exact, double lo, double hi,
                        int64_t bound) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> in_range(lo, hi);
  int64_t max = 0;
  double worst = 0;
  for (int i = 0; i < 4000000; ++i) {
    double x;
    if (i % 2) {
      x = in_range(rng);
    } else {
      const uint64_t b = rng();
      std::memcpy(&x, &b, 8);
    }
    if (!std::isfinite(x)) continue;
    const long double e = exact(static_cast<long double>(x));
    const auto want = static_cast<double>(e);
    const double got = fast(x);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "x = " << x;
      continue;
    }
    if (std::isinf(want) || want == 0.0) {
      EXPECT_EQ(got, want) << "x = " << x;
      continue;
    }
    const int64_t u = ulps64(got, want);
    if (u > max) {
      max = u;
      worst = x;
    }
  }
  EXPECT_LE(max, bound) << name << " at x = " << worst;
  std::printf("%s: at most %lld ulp (worst at %.17g)\n", name, static_cast<long long>(max), worst);
}

TEST(FastMath, ExpIsWithinOneUlpOverTheFloatRange) {
  float worst = 0;
  const int64_t max = max_ulps_over_floats(
      exp_f32, [](double x) { return std::exp(x); }, &worst);
  EXPECT_LE(max, 1) << "at x = " << worst;
  std::printf("exp_f32: at most %lld ulp (worst at %.9g)\n", static_cast<long long>(max), worst);
}

TEST(FastMath, TanhIsWithinTwoUlpsOverTheFloatRange) {
  float worst = 0;
  const int64_t max = max_ulps_over_floats(
      tanh_f32, [](double x) { return std::tanh(x); }, &worst);
  EXPECT_LE(max, 2) << "at x = " << worst;
  std::printf("tanh_f32: at most %lld ulp (worst at %.9g)\n", static_cast<long long>(max), worst);
}

TEST(FastMath, LogIsWithinTwoUlpsOverTheFloatRange) {
  expect_float_ulps(
      "log_f32", log_f32, [](double x) { return std::log(x); }, 2);
}

TEST(FastMath, Log1pIsWithinTwoUlpsOverTheFloatRange) {
  expect_float_ulps(
      "log1p_f32", log1p_f32, [](double x) { return std::log1p(x); }, 2);
}

TEST(FastMath, Expm1IsWithinTwoUlpsOverTheFloatRange) {
  expect_float_ulps(
      "expm1_f32", expm1_f32, [](double x) { return std::expm1(x); }, 2);
}

TEST(FastMath, SinAndCosAreWithinOneUlpOverTheFloatRange) {
  expect_float_ulps(
      "sin_f32", sin_f32, [](double x) { return std::sin(x); }, 1);
  expect_float_ulps(
      "cos_f32", cos_f32, [](double x) { return std::cos(x); }, 1);
}

// Floats whose distance to a multiple of pi/2 is smallest (the hardest cases of the reduction),
// around both reductions' boundary, and large ones.
TEST(FastMath, SinAndCosNearMultiplesOfHalfPi) {
  int64_t max = 0;
  float worst = 0;
  auto check = [&](float x) {
    for (int c = 0; c < 2; ++c) {
      const float got = c ? cos_f32(x) : sin_f32(x);
      const auto want = static_cast<float>(c ? std::cos(double(x)) : std::sin(double(x)));
      const int64_t u = ulps(got, want);
      if (u > max) max = u, worst = x;
    }
  };
  for (double k = 1; k < 1e6; k = k * 1.01 + 1) {
    const float x = static_cast<float>(k * 1.5707963267948966);
    for (float y = x, i = 0; i < 4; ++i, y = std::nextafter(y, 0.0f)) check(y), check(-y);
    for (float y = x, i = 0; i < 4; ++i, y = std::nextafter(y, 1e30f)) check(y), check(-y);
  }
  // The reported hardest float for the reduction, 1.0 and 0.5 * pi's neighbours, the boundary.
  for (float x : {16367173.0f * 6.2831855f, 1.0f, 1.5707964f, 1.5707963f, 3.1415927f, 1048575.9f,
                  1048576.0f, 1048576.1f, 1e10f, 1e20f, 3.4e38f, 105414350.0f, 8.34e5f})
    check(x), check(-x);
  EXPECT_LE(max, 1) << "at x = " << worst;
}

TEST(FastMath, ExpF64IsWithinOneUlp) {
  expect_double_ulps(
      "exp_f64", exp_f64, [](long double x) { return std::exp(x); }, -750.0, 720.0, 1);
  expect_double_ulps(
      "exp_f64 near 0", exp_f64, [](long double x) { return std::exp(x); }, -1.0, 1.0, 1);
}

TEST(FastMath, LogF64IsWithinOneUlp) {
  expect_double_ulps(
      "log_f64", log_f64, [](long double x) { return std::log(x); }, 0.0, 4.0, 1);
  expect_double_ulps(
      "log_f64 near 1", log_f64, [](long double x) { return std::log(x); }, 0.7, 1.5, 1);
}

TEST(FastMath, Expm1F64IsWithinOneUlp) {
  auto exact = [](long double x) { return std::expm1(x); };
  expect_double_ulps("expm1_f64", expm1_f64, exact, -45.0, 710.0, 1);
  expect_double_ulps("expm1_f64 near 0", expm1_f64, exact, -1.5, 1.5, 1);
  expect_double_ulps("expm1_f64 near the overflow", expm1_f64, exact, 700.0, 709.78, 1);
}

TEST(FastMath, Log1pF64IsWithinOneUlp) {
  auto exact = [](long double x) { return std::log1p(x); };
  expect_double_ulps("log1p_f64", log1p_f64, exact, -1.0, 4.0, 1);
  expect_double_ulps("log1p_f64 near 0", log1p_f64, exact, -0.4, 0.5, 1);
  expect_double_ulps("log1p_f64 near -1", log1p_f64, exact, -1.0, -0.99, 1);
}

TEST(FastMath, TanhF64IsWithinTwoUlps) {
  auto exact = [](long double x) { return std::tanh(x); };
  expect_double_ulps("tanh_f64", tanh_f64, exact, -25.0, 25.0, 2);
  expect_double_ulps("tanh_f64 near 0", tanh_f64, exact, -1.0, 1.0, 2);
}

TEST(FastMath, ErfF64IsWithinOneUlp) {
  auto exact = [](long double x) { return std::erf(x); };
  expect_double_ulps("erf_f64", erf_f64, exact, -7.0, 7.0, 1);
  expect_double_ulps("erf_f64 near 0", erf_f64, exact, -1.3, 1.3, 1);
}

TEST(FastMath, SinAndCosF64AreWithinOneUlp) {
  auto sin_exact = [](long double x) { return std::sin(x); };
  auto cos_exact = [](long double x) { return std::cos(x); };
  // Every binade (half the draws), and uniform draws: small, around the reductions' boundary
  // (2^20), and large.
  for (auto [lo, hi] : {std::pair{-10.0, 10.0}, std::pair{1e6, 1.1e6}, std::pair{-1e22, 1e22}}) {
    expect_double_ulps("sin_f64", sin_f64, sin_exact, lo, hi, 1);
    expect_double_ulps("cos_f64", cos_f64, cos_exact, lo, hi, 1);
  }
}

// Doubles closest to multiples of pi/2 (the reductions' hardest cases: the remainder loses up to
// 61 leading bits), both reductions' boundary, and the largest double.
TEST(FastMath, SinAndCosF64NearMultiplesOfHalfPi) {
  int64_t max = 0;
  double worst = 0;
  auto check = [&](double x) {
    for (int c = 0; c < 2; ++c) {
      const double got = c ? cos_f64(x) : sin_f64(x);
      const auto want = static_cast<double>(c ? std::cos(static_cast<long double>(x))
                                              : std::sin(static_cast<long double>(x)));
      const int64_t u = ulps64(got, want);
      if (u > max) max = u, worst = x;
    }
  };
  for (double k = 1; k < 1e300; k = k * 1.01 + 1) {
    const double x = k * 1.5707963267948966;
    double y = x;
    for (int i = 0; i < 3; ++i, y = std::nextafter(y, 0.0)) check(y), check(-y);
    y = x;
    for (int i = 0; i < 3; ++i, y = std::nextafter(y, 1e308)) check(y), check(-y);
  }
  // Numerators p of the continued fraction convergents p/q of pi/2 (integers close to multiples
  // of pi/2), and those times powers of 2 up to the largest exponent.
  for (double p : {11.0,
                   344.0,
                   355.0,
                   51819.0,
                   52174.0,
                   260515.0,
                   573204.0,
                   4846147.0,
                   5419351.0,
                   37362253.0,
                   42781604.0,
                   122925461.0,
                   411557987.0,
                   534483448.0,
                   2549491779.0,
                   3083975227.0,
                   17969367914.0,
                   21053343141.0,
                   881156436695.0,
                   902209779836.0,
                   2685575996367.0,
                   8958937768937.0,
                   65398140378926.0,
                   74357078147863.0,
                   139755218526789.0,
                   214112296674652.0,
                   5920787228742393.0,
                   6134899525417045.0})
    for (int e = 0; e < 1024 - 53; e += 7) check(std::ldexp(p, e)), check(-std::ldexp(p, e));
  // The double nearest a multiple of pi/2 (its remainder is about 2^-60.9: Muller, "Elementary
  // Functions"); pi/2's and pi's neighbours; the boundary; the largest double.
  for (double x : {std::ldexp(6381956970095103.0, 797), 1.5707963267948966, 1.5707963267948968,
                   3.141592653589793, 1048575.9999999999, 1048576.0, 1048576.0000000002, 1e22,
                   std::numeric_limits<double>::max()})
    check(x), check(-x);
  EXPECT_LE(max, 1) << "at x = " << worst;
  std::printf("sin_f64 and cos_f64 near multiples of pi/2: at most %lld ulp (worst at %.17g)\n",
              static_cast<long long>(max), worst);
}

TEST(FastMath, SpecialValuesF64) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double sub = 1e-310;  // subnormal
  const double max = std::numeric_limits<double>::max();
  for (auto f : {expm1_f64, log1p_f64, tanh_f64, erf_f64, sin_f64}) {
    EXPECT_EQ(f(0.0), 0.0);
    EXPECT_FALSE(std::signbit(f(0.0)));
    EXPECT_TRUE(std::signbit(f(-0.0)));
    EXPECT_TRUE(std::isnan(f(nan)));
    EXPECT_TRUE(std::isnan(f(-nan)));
  }
  for (auto f : {expm1_f64, log1p_f64, tanh_f64, sin_f64}) {
    EXPECT_EQ(f(sub), sub);
    EXPECT_EQ(f(-sub), -sub);
    EXPECT_EQ(f(1e-20), 1e-20);
  }
  EXPECT_EQ(erf_f64(sub), std::erf(sub));
  EXPECT_EQ(erf_f64(-sub), std::erf(-sub));
  EXPECT_EQ(erf_f64(std::numeric_limits<double>::denorm_min()),
            std::erf(std::numeric_limits<double>::denorm_min()));

  EXPECT_EQ(expm1_f64(inf), inf);
  EXPECT_EQ(expm1_f64(-inf), -1.0);
  EXPECT_EQ(expm1_f64(709.8), inf);
  EXPECT_EQ(expm1_f64(max), inf);
  EXPECT_EQ(expm1_f64(-50.0), -1.0);
  EXPECT_EQ(expm1_f64(-max), -1.0);
  EXPECT_EQ(expm1_f64(709.78), std::expm1(709.78));  // k = 1024

  EXPECT_EQ(log1p_f64(-1.0), -inf);
  EXPECT_TRUE(std::isnan(log1p_f64(-1.5)));
  EXPECT_TRUE(std::isnan(log1p_f64(-inf)));
  EXPECT_EQ(log1p_f64(inf), inf);
  EXPECT_EQ(log1p_f64(max), std::log1p(max));
  EXPECT_EQ(log1p_f64(std::nextafter(-1.0, 0.0)), std::log1p(std::nextafter(-1.0, 0.0)));

  EXPECT_EQ(tanh_f64(inf), 1.0);
  EXPECT_EQ(tanh_f64(-inf), -1.0);
  EXPECT_EQ(tanh_f64(30.0), 1.0);
  EXPECT_EQ(tanh_f64(max), 1.0);
  EXPECT_EQ(tanh_f64(-max), -1.0);

  EXPECT_EQ(erf_f64(inf), 1.0);
  EXPECT_EQ(erf_f64(-inf), -1.0);
  EXPECT_EQ(erf_f64(10.0), 1.0);
  EXPECT_EQ(erf_f64(-max), -1.0);

  EXPECT_EQ(cos_f64(0.0), 1.0);
  EXPECT_EQ(cos_f64(-0.0), 1.0);
  EXPECT_EQ(cos_f64(sub), 1.0);
  for (double v : {inf, -inf, nan}) {
    EXPECT_TRUE(std::isnan(sin_f64(v))) << v;
    EXPECT_TRUE(std::isnan(cos_f64(v))) << v;
  }
}

TEST(FastMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_EQ(exp_f32(-inf), 0.0f);
  EXPECT_EQ(exp_f32(89.0f), inf);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(nan)));
  // A subnormal result, rounded once.
  EXPECT_EQ(exp_f32(-100.0f), static_cast<float>(std::exp(-100.0)));
  EXPECT_EQ(tanh_f32(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(tanh_f32(-0.0f)));
  EXPECT_EQ(tanh_f32(inf), 1.0f);
  EXPECT_EQ(tanh_f32(-inf), -1.0f);
  EXPECT_EQ(tanh_f32(20.0f), 1.0f);
  EXPECT_TRUE(std::isnan(tanh_f32(nan)));
  EXPECT_EQ(tanh_f32(1e-30f), 1e-30f);

  const float sub = 1e-40f;  // subnormal
  EXPECT_EQ(log_f32(1.0f), 0.0f);
  EXPECT_FALSE(std::signbit(log_f32(1.0f)));
  EXPECT_EQ(log_f32(0.0f), -inf);
  EXPECT_EQ(log_f32(-0.0f), -inf);
  EXPECT_TRUE(std::isnan(log_f32(-1.0f)));
  EXPECT_TRUE(std::isnan(log_f32(-inf)));
  EXPECT_TRUE(std::isnan(log_f32(nan)));
  EXPECT_EQ(log_f32(inf), inf);
  EXPECT_EQ(log_f32(sub), static_cast<float>(std::log(double(sub))));
  EXPECT_EQ(log_f32(std::numeric_limits<float>::denorm_min()),
            static_cast<float>(std::log(double(std::numeric_limits<float>::denorm_min()))));
  EXPECT_EQ(log_f32(std::numeric_limits<float>::max()),
            static_cast<float>(std::log(double(std::numeric_limits<float>::max()))));

  EXPECT_EQ(log1p_f32(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(log1p_f32(-0.0f)));
  EXPECT_EQ(log1p_f32(-1.0f), -inf);
  EXPECT_TRUE(std::isnan(log1p_f32(-1.5f)));
  EXPECT_TRUE(std::isnan(log1p_f32(-inf)));
  EXPECT_TRUE(std::isnan(log1p_f32(nan)));
  EXPECT_EQ(log1p_f32(inf), inf);
  EXPECT_EQ(log1p_f32(sub), sub);
  EXPECT_EQ(log1p_f32(-sub), -sub);
  EXPECT_EQ(log1p_f32(std::numeric_limits<float>::max()),
            static_cast<float>(std::log1p(double(std::numeric_limits<float>::max()))));

  EXPECT_EQ(expm1_f32(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(expm1_f32(-0.0f)));
  EXPECT_EQ(expm1_f32(inf), inf);
  EXPECT_EQ(expm1_f32(-inf), -1.0f);
  EXPECT_EQ(expm1_f32(89.0f), inf);
  EXPECT_EQ(expm1_f32(-100.0f), -1.0f);
  EXPECT_TRUE(std::isnan(expm1_f32(nan)));
  EXPECT_EQ(expm1_f32(sub), sub);
  EXPECT_EQ(expm1_f32(-sub), -sub);
  EXPECT_EQ(expm1_f32(88.7f), static_cast<float>(std::expm1(double(88.7f))));  // 2^127 doubled

  EXPECT_EQ(sin_f32(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(sin_f32(-0.0f)));
  EXPECT_EQ(sin_f32(sub), sub);
  EXPECT_EQ(sin_f32(-sub), -sub);
  EXPECT_EQ(cos_f32(0.0f), 1.0f);
  EXPECT_EQ(cos_f32(-0.0f), 1.0f);
  for (float v : {inf, -inf, nan}) {
    EXPECT_TRUE(std::isnan(sin_f32(v))) << v;
    EXPECT_TRUE(std::isnan(cos_f32(v))) << v;
  }

  const double dinf = std::numeric_limits<double>::infinity();
  const double dnan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(exp_f64(0.0), 1.0);
  EXPECT_EQ(exp_f64(-0.0), 1.0);
  EXPECT_EQ(exp_f64(dinf), dinf);
  EXPECT_EQ(exp_f64(-dinf), 0.0);
  EXPECT_EQ(exp_f64(709.8), dinf);
  EXPECT_EQ(exp_f64(-746.0), 0.0);
  EXPECT_TRUE(std::isnan(exp_f64(dnan)));
  EXPECT_EQ(exp_f64(-740.0), std::exp(-740.0));  // subnormal, rounded once
  EXPECT_EQ(exp_f64(709.78), std::exp(709.78));
  EXPECT_EQ(log_f64(1.0), 0.0);
  EXPECT_EQ(log_f64(0.0), -dinf);
  EXPECT_EQ(log_f64(-0.0), -dinf);
  EXPECT_TRUE(std::isnan(log_f64(-1.0)));
  EXPECT_TRUE(std::isnan(log_f64(dnan)));
  EXPECT_EQ(log_f64(dinf), dinf);
  EXPECT_EQ(log_f64(std::numeric_limits<double>::denorm_min()),
            std::log(std::numeric_limits<double>::denorm_min()));
  EXPECT_EQ(log_f64(std::numeric_limits<double>::max()),
            std::log(std::numeric_limits<double>::max()));
}

}  // namespace
}  // namespace kiln::detail
