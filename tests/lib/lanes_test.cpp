// lib/math/lanes.h: every primitive computed on blocks of lanes gives the scalar instantiation's
// bits in every lane (NaN: a NaN), for each register width; and the eager kernels that run blocks
// (lib/loops.h's Lanewise rows) give those bits at every length, tail and stride.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "lib/math/lanes.h"
#include "lib/math/trig_hyperbolic.h"

namespace kiln::math {
namespace {

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0 || (a != a && b != b);
}

// Random bit patterns (every binade, subnormals, infinities, NaNs), values of the scale the
// functions are used at, and the special values.
template <typename T>
std::vector<T> inputs(size_t n) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  std::vector<T> x;
  const T inf = std::numeric_limits<T>::infinity();
  for (T v : {T(0),
              -T(0),
              T(1),
              -T(1),
              T(0.5),
              -T(0.5),
              inf,
              -inf,
              std::numeric_limits<T>::quiet_NaN(),
              -std::numeric_limits<T>::quiet_NaN(),
              std::numeric_limits<T>::max(),
              std::numeric_limits<T>::lowest(),
              std::numeric_limits<T>::min(),
              std::numeric_limits<T>::denorm_min(),
              T(1e-30),
              T(88.7),
              T(-103.9),
              T(709.7),
              T(1e5),
              T(1e20)})
    x.push_back(v);
  while (x.size() < n) {
    const U bits = static_cast<U>(rng());
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    x.push_back(v);
    x.push_back(static_cast<T>(normal(rng)));
    x.push_back(static_cast<T>(normal(rng) * 30));
  }
  return x;
}

// The lanes of f over x, kLanes at a time, against f over each x.
template <typename T, int B, typename F>
int64_t count_differences(const F& f, const std::vector<T>& x, std::string* first) {
  int64_t differ = 0;
  for (size_t i = 0; i + kLanes <= x.size(); i += kLanes) {
    Lanes<T, B> v;
    std::memcpy(v.p, &x[i], sizeof(v.p));
    const Lanes<T, B> r = f(v);
    for (int k = 0; k < kLanes; ++k) {
      const T want = f(x[i + k]);
      if (same_bits(r[k], want)) continue;
      if (differ++ == 0)
        *first = "x = " + std::to_string(double(x[i + k])) + ": lanes " +
                 std::to_string(double(r[k])) + ", scalar " + std::to_string(double(want));
    }
  }
  return differ;
}

template <typename T, typename F>
void expect_lanes_match(const char* name, const F& f) {
  const std::vector<T> x = inputs<T>(30000);
  std::string first;
  EXPECT_EQ((count_differences<T, 64>(f, x, &first)), 0) << name << " 64-byte lanes: " << first;
  EXPECT_EQ((count_differences<T, 32>(f, x, &first)), 0) << name << " 32-byte lanes: " << first;
  EXPECT_EQ((count_differences<T, 16>(f, x, &first)), 0) << name << " 16-byte lanes: " << first;
}

#define KILN_EXPECT_LANES(f)                                               \
  expect_lanes_match<float>(#f "_f32", [](auto x) { return f##_f32(x); }); \
  expect_lanes_match<double>(#f "_f64", [](auto x) { return f##_f64(x); })

TEST(Lanes, EveryPrimitiveGivesTheScalarBitsInEveryLane) {
  KILN_EXPECT_LANES(exp);
  KILN_EXPECT_LANES(log);
  KILN_EXPECT_LANES(log1p);
  KILN_EXPECT_LANES(expm1);
  KILN_EXPECT_LANES(sin);
  KILN_EXPECT_LANES(cos);
  KILN_EXPECT_LANES(tanh);
  KILN_EXPECT_LANES(erf);
  KILN_EXPECT_LANES(tan);
  KILN_EXPECT_LANES(atan);
  KILN_EXPECT_LANES(asin);
  KILN_EXPECT_LANES(acos);
  KILN_EXPECT_LANES(sinh);
  KILN_EXPECT_LANES(cosh);
  KILN_EXPECT_LANES(asinh);
  KILN_EXPECT_LANES(acosh);
  KILN_EXPECT_LANES(atanh);
  KILN_EXPECT_LANES(exp2);
  KILN_EXPECT_LANES(log2);
  expect_lanes_match<float>("exp_nonpos_f32", [](auto x) { return exp_nonpos_f32(x); });
  // Two operands: y's lanes are x's in reverse order, so every pair of kinds meets.
  auto atan2_reversed = [](auto f) {
    return [f](auto x) {
      using V = decltype(x);
      if constexpr (std::is_arithmetic_v<V>) {
        return f(x, V(0.75) - x);
      } else {
        return f(x, V(ScalarOf<V>(0.75)) - x);
      }
    };
  };
  expect_lanes_match<float>("atan2_f32",
                            atan2_reversed([](auto y, auto x) { return atan2_f32(y, x); }));
  expect_lanes_match<double>("atan2_f64",
                             atan2_reversed([](auto y, auto x) { return atan2_f64(y, x); }));
}

// sin's large reduction runs for a block only when one of its lanes needs it: a block with one
// large lane among small ones, and blocks without.
TEST(Lanes, ALargeArgumentInOneLaneIsReducedLikeTheScalar) {
  for (int at = 0; at < kLanes; ++at) {
    float xf[kLanes];
    double xd[kLanes];
    for (int k = 0; k < kLanes; ++k) xf[k] = 0.1f * k - 0.7f, xd[k] = 0.1 * k - 0.7;
    xf[at] = 1.5e30f;
    xd[at] = -3.7e200;
    Lanes<float, 64> vf;
    Lanes<double, 64> vd;
    std::memcpy(vf.p, xf, sizeof(xf));
    std::memcpy(vd.p, xd, sizeof(xd));
    const Lanes<float, 64> sf = sin_f32(vf);
    const Lanes<double, 64> cd = cos_f64(vd);
    for (int k = 0; k < kLanes; ++k) {
      EXPECT_TRUE(same_bits(sf[k], sin_f32(xf[k]))) << "lane " << k << " of " << at;
      EXPECT_TRUE(same_bits(cd[k], cos_f64(xd[k]))) << "lane " << k << " of " << at;
    }
  }
}

TEST(Lanes, MasksConvertBetweenWidths) {
  Lanes<double, 64> a;
  double x[kLanes];
  for (int k = 0; k < kLanes; ++k) x[k] = k % 3 == 0 ? std::nan("") : k - 8.0;
  std::memcpy(a.p, x, sizeof(x));
  // A float64 comparison's mask selects float32 and uint64 lanes.
  const auto m = a < Lanes<double, 64>(0.0);
  const Lanes<float, 64> f = select(m, Lanes<float, 64>(1.0f), Lanes<float, 64>(2.0f));
  const Lanes<uint64_t, 64> u =
      select(!m, Lanes<uint64_t, 64>(uint64_t(1) << 40), Lanes<uint64_t, 64>(uint64_t(3)));
  for (int k = 0; k < kLanes; ++k) {
    const bool below = x[k] < 0.0;
    EXPECT_EQ(f[k], below ? 1.0f : 2.0f) << k;
    EXPECT_EQ(u[k], below ? uint64_t(3) : uint64_t(1) << 40) << k;
  }
  EXPECT_TRUE(any_of(m));
  EXPECT_FALSE(any_of(a > Lanes<double, 64>(100.0)));
}

}  // namespace
}  // namespace kiln::math

namespace kiln {
namespace {

template <typename T>
T at(const Tensor& t, int64_t i) {
  return t.select(0, i).item<T>();
}

// Eager kernels run Lanewise formulas on blocks: every length (whole blocks and every tail), a
// strided view and a broadcast operand give each element the scalar primitive's bits.
TEST(LanewiseKernels, EveryLengthAndStrideGivesTheScalarBits) {
  LazyGuard eager(false);
  for (int64_t n : {0, 1, 2, 15, 16, 17, 31, 32, 33, 47, 100, 1000}) {
    Tensor base = randn({n, 2}) * 20.0;
    Tensor x = base.select(1, 0);  // stride 2
    ASSERT_FALSE(x.is_contiguous() && n > 1);
    for (bool contiguous : {false, true}) {
      Tensor in = contiguous ? x.contiguous() : x;
      Tensor small = in * 0.01;
      Tensor y = kiln::sin(in), z = kiln::atanh(small), w = kiln::gelu(in);
      for (int64_t i = 0; i < n; ++i) {
        const float v = at<float>(in, i);
        EXPECT_EQ(at<float>(y, i), math::sin_f32(v)) << "n " << n << " at " << i;
        EXPECT_EQ(at<float>(z, i), math::atanh_f32(at<float>(small, i))) << "n " << n;
        const float g = 0.5f * v * (1.0f + math::erf_f32(v * float(0.7071067811865476)));
        EXPECT_EQ(at<float>(w, i), g) << "n " << n << " at " << i;
      }
    }
    Tensor d = kiln::exp(x.to(kFloat64).unsqueeze(0).expand({3, n}));
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(at<double>(d.select(0, 2), i), math::exp_f64(at<double>(x, i))) << n;
    // Two operands: a strided one and a broadcast scalar, then two contiguous ones.
    Tensor e = kiln::atan2(x, kiln::full({}, -0.75)), f = kiln::atan2(x.contiguous(), x * 0.5);
    for (int64_t i = 0; i < n; ++i) {
      const float v = at<float>(x, i);
      EXPECT_EQ(at<float>(e, i), math::atan2_f32(v, -0.75f)) << n;
      EXPECT_EQ(at<float>(f, i), math::atan2_f32(v, at<float>(x * 0.5, i))) << n;
    }
  }
}

}  // namespace
}  // namespace kiln
