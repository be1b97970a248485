// lib/fastmath.h against double precision: exp within 1 ulp and tanh within 2 ulp of the
// correctly rounded result over the whole float range, special values exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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
int64_t max_ulps_over_floats(Fast fast, Exact exact, float* worst) {
  int64_t max = 0;
  // Every 37th float of either sign, finite only: about 116 million values.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 37) {
    const auto b32 = static_cast<uint32_t>(bits);
    float x;
    std::memcpy(&x, &b32, 4);
    if (!std::isfinite(x)) continue;
    const float want = static_cast<float>(exact(static_cast<double>(x)));
    const float got = fast(x);
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
}

}  // namespace
}  // namespace kiln::detail
