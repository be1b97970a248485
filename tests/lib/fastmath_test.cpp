// lib/fastmath.h's scalar functions (lib/math/primitives.h instantiated for plain C++ values):
// special values exactly, and float64 sin and cos on the hardest cases of their reductions. The
// accuracy sweeps of every primitive are tests/lib/ulp_test.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "lib/fastmath.h"

namespace kiln::detail {
namespace {

// Distance in representable doubles (both finite).
int64_t ulps64(double a, double b) {
  auto key = [](double f) {
    int64_t i;
    std::memcpy(&i, &f, 8);
    return i < 0 ? static_cast<long double>(INT64_MIN) - i : static_cast<long double>(i);
  };
  return static_cast<int64_t>(std::fabs(key(a) - key(b)));
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

  EXPECT_EQ(erf_f32(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(erf_f32(-0.0f)));
  EXPECT_EQ(erf_f32(inf), 1.0f);
  EXPECT_EQ(erf_f32(-inf), -1.0f);
  for (float v : {3.61037564f, 3.9f, 4.0f, 5.0f})  // a rational approximation gave 1 + 2^-23
    EXPECT_EQ(erf_f32(v), static_cast<float>(std::erf(double(v)))) << v;
  EXPECT_EQ(erf_f32(-10.0f), -1.0f);
  EXPECT_TRUE(std::isnan(erf_f32(nan)));
  EXPECT_EQ(erf_f32(sub), static_cast<float>(std::erf(double(sub))));

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
