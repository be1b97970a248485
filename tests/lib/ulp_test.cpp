// The documented accuracy of lib/math/primitives.h (docs/numerics.md, "Transcendental
// primitives"): every float32 unary primitive against double-precision libm, every float64 one
// against long double, in ulps of the result (the distance in representable values from the
// correctly rounded one), as glibc's and SLEEF's test suites measure it.
//   float32: a dense sweep over every binade of either sign (every 97th bit pattern: subnormals,
//            +-0, +-inf and NaN included), plus every float around each function's range-
//            reduction and case boundaries; exhaustive (all 2^32) takes minutes on the test
//            machines (libm's double reference is the cost), so the sweep is dense instead.
//   float64: random bit patterns (every binade alike) and uniform values in the intervals where
//            each function's cases meet.
// Special values (NaN, infinities, signed zeros, overflow and underflow) are checked exactly.
// KILN_TEST_SCALE shrinks the sweeps (sanitizer runs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/math/primitives.h"
#include "tests/scale.h"

namespace kiln::math {
namespace {

// y[i] = f(x[i]), compiled with FMA and AVX2 where the CPU has them (flatten: the primitive is
// inlined, so that its fmadd is one instruction; nothing else contracts): the same bits as the
// baseline loop, faster.
template <typename T, typename F>
__attribute__((target("avx2,fma"), optimize("fp-contract=off"), flatten)) void apply_fma(const F& f,
                                                                                         const T* x,
                                                                                         T* y,
                                                                                         size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = f(x[i]);
}
template <typename T, typename F>
void apply(const F& f, const std::vector<T>& x, std::vector<T>& y) {
  y.resize(x.size());
  static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (fma) return apply_fma(f, x.data(), y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
}

// Distance in representable values (any signs, both finite): the order-preserving integer of each.
int64_t ulps(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(b));
}
int64_t ulps(double a, double b) {
  auto key = [](double f) {
    int64_t i;
    std::memcpy(&i, &f, 8);
    return i < 0 ? static_cast<long double>(INT64_MIN) - i : static_cast<long double>(i);
  };
  return static_cast<int64_t>(std::fabs(key(a) - key(b)));
}

// The documented bounds (docs/numerics.md), in ulps.
const UlpBound& bound(const std::string& name) {
  for (const UlpBound& b : kUlpBounds)
    if (name == b.name) return b;
  std::abort();
}

template <typename T>
struct Result {
  int64_t max = 0;
  T worst = 0;
};

// got against want (the reference rounded to T) for each x: NaN for NaN, infinities exact,
// every finite result within `bound`.
// slack (when given): per x, an absolute error also accepted (the reflection formulas'
// cancellation).
template <typename T>
void check(const char* name, const std::vector<T>& x, const std::vector<T>& got,
           const std::vector<T>& want, int64_t bound, Result<T>& r,
           const std::vector<T>* slack = nullptr) {
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const T g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g) || std::isnan(g)) {
      ok = g == w;
    } else {
      const int64_t u = ulps(g, w);
      ok = u <= bound || (slack && std::fabs(g - w) <= (*slack)[i]);
      if (u > r.max && (!slack || (*slack)[i] == 0)) r.max = u, r.worst = x[i];
    }
    if (!ok && failures++ < 5)
      ADD_FAILURE() << name << "(" << std::hexfloat << x[i] << ") = " << g << ", want " << w;
  }
}

// ---- float32 ----

using F32 = float (*)(float);
using Ref32 = double (*)(double);

// Every stride-th bit pattern (from an odd offset, so that both signs and every exponent and
// low-bit pattern come up) and the special values, to f in chunks.
void float_sweep(const std::function<void(const std::vector<float>&)>& f) {
  const auto stride = static_cast<uint64_t>(97 / testing::test_scale());
  std::vector<float> x;
  for (uint64_t b = 13; b < (uint64_t{1} << 32); b += stride) {
    float v;
    const auto b32 = static_cast<uint32_t>(b);
    std::memcpy(&v, &b32, 4);
    x.push_back(v);
    if (x.size() == (1u << 20)) f(x), x.clear();
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v :
       {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
        std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
    x.push_back(v);
  f(x);
}

// Every float within `count` representable values of each centre, on either side.
std::vector<float> around(std::initializer_list<float> centres, int count) {
  count = static_cast<int>(testing::scaled(count));
  std::vector<float> x;
  for (float c : centres) {
    float lo = c, hi = c;
    x.push_back(c);
    for (int i = 0; i < count; ++i) {
      lo = std::nextafter(lo, -std::numeric_limits<float>::infinity());
      hi = std::nextafter(hi, std::numeric_limits<float>::infinity());
      x.push_back(lo);
      x.push_back(hi);
    }
  }
  return x;
}

// The floats nearest multiples of pi/2 (the reductions' hardest cases) and their neighbours.
std::vector<float> near_half_pi() {
  std::vector<float> x;
  for (double k = 1; k < 1e7; k = k * 1.002 + 1) {
    float y = static_cast<float>(k * 1.5707963267948966);
    for (int i = 0; i < 3; ++i, y = std::nextafter(y, 0.0f)) x.push_back(y), x.push_back(-y);
  }
  for (float v : {16367173.0f * 6.2831855f, 105414350.0f, 1e10f, 1e20f, 3.4e38f})
    x.push_back(v), x.push_back(-v);
  return x;
}

// fn against ref over the sweep and the sets.
template <typename Fn>
Result<float> sweep_f32(const char* name, const Fn& fn, Ref32 ref,
                        const std::vector<std::vector<float>>& sets) {
  Result<float> r;
  std::vector<float> got, want;
  auto run = [&](const std::vector<float>& x) {
    apply<float>(fn, x, got);
    want.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<float>(ref(x[i]));
    check(name, x, got, want, bound(name).f32, r);
  };
  float_sweep(run);
  for (const std::vector<float>& x : sets) run(x);
  std::printf("%s_f32: at most %lld ulp (worst at %.9g)\n", name, static_cast<long long>(r.max),
              static_cast<double>(r.worst));
  return r;
}

TEST(UlpF32, Exp) {
  sweep_f32(
      "exp", [](float x) { return exp_f32(x); }, [](double x) { return std::exp(x); },
      {around({-103.972084f, -87.33655f, 88.72284f, 0.0f, 0.34657359f}, 3000)});
}

// The softmax kernels' exp of x - max: bit for bit exp_f32 at every float in [-104, -87] (the
// subnormal results, where the scalings differ), every 97th float <= 0 elsewhere, and at -0, -inf
// and NaN.
TEST(UlpF32, ExpOfNonPositiveIsExp) {
  uint64_t mismatches = 0;
  float first = 0;
  auto compare = [&](float x) {
    const float got = exp_nonpos_f32(x), want = exp_f32(x);
    if (std::memcmp(&got, &want, 4) != 0 && mismatches++ == 0) first = x;
  };
  auto from_bits = [](uint64_t b) {
    const auto b32 = static_cast<uint32_t>(b);
    float x;
    std::memcpy(&x, &b32, 4);
    return x;
  };
  for (float x = -87.0f; x >= -104.0f; x = std::nextafter(x, -105.0f)) compare(x);
  const auto stride = static_cast<uint64_t>(97 / testing::test_scale());
  for (uint64_t b = 0x80000000u; b <= 0xff800000u; b += stride) compare(from_bits(b));
  for (float x : {-0.0f, 0.0f, -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    compare(x);
  EXPECT_EQ(mismatches, 0u) << "first at " << first;
}

TEST(UlpF32, Log) {
  sweep_f32(
      "log", [](float x) { return log_f32(x); }, [](double x) { return std::log(x); },
      {around({1.0f, 0.70710677f, 1.4142135f, std::numeric_limits<float>::min()}, 50000)});
}

TEST(UlpF32, Log1p) {
  sweep_f32(
      "log1p", [](float x) { return log1p_f32(x); }, [](double x) { return std::log1p(x); },
      {around({-1.0f, 0.0f, 5.96046448e-8f, -0.29289323f, 0.41421357f}, 50000)});
}

TEST(UlpF32, Expm1) {
  sweep_f32(
      "expm1", [](float x) { return expm1_f32(x); }, [](double x) { return std::expm1(x); },
      {around({0.0f, -30.0f, 88.72284f, 2.98023224e-8f, 0.34657359f}, 50000)});
}

TEST(UlpF32, SinAndCos) {
  const std::vector<std::vector<float>> sets{near_half_pi(),
                                             around({1048576.0f, -1048576.0f}, 50000)};
  sweep_f32(
      "sin", [](float x) { return sin_f32(x); }, [](double x) { return std::sin(x); }, sets);
  sweep_f32(
      "cos", [](float x) { return cos_f32(x); }, [](double x) { return std::cos(x); }, sets);
}

TEST(UlpF32, Tanh) {
  sweep_f32(
      "tanh", [](float x) { return tanh_f32(x); }, [](double x) { return std::tanh(x); },
      {around({0.625f, -0.625f, 0.0f, 9.0f, -9.0f}, 50000)});
}

// erf, and its magnitude at most 1 everywhere: near +-4 (where the rational approximation is
// clamped, and where its quotient rounded to 1 + 2^-23 before) every float.
TEST(UlpF32, ErfAndItsMagnitudeIsAtMostOne) {
  const std::vector<std::vector<float>> sets{around({4.0f, -4.0f, 3.8f, -3.8f}, 300000)};
  sweep_f32(
      "erf", [](float x) { return erf_f32(x); }, [](double x) { return std::erf(x); }, sets);
  auto at_most_one = [](const std::vector<float>& x) {
    for (float v : x) {
      const float y = erf_f32(v);
      if (!std::isnan(v) && !(std::ceil(std::fabs(y)) <= 1.0f)) {
        ADD_FAILURE() << "erf_f32(" << v << ") = " << std::hexfloat << y;
        return;
      }
    }
  };
  float_sweep(at_most_one);
  for (const std::vector<float>& x : sets) at_most_one(x);
}

TEST(UlpF32, TrigonometricAndHyperbolic) {
  const std::vector<std::vector<float>> poles{near_half_pi()};
  sweep_f32(
      "tan", [](float x) { return tan_f32(x); }, [](double x) { return std::tan(x); }, poles);
  const std::vector<std::vector<float>> cases{
      around({0.4375f, 0.6875f, 1.1875f, 2.4375f, 1.0f, -1.0f, 0.0f, 0.5f}, 20000)};
  sweep_f32(
      "atan", [](float x) { return atan_f32(x); }, [](double x) { return std::atan(x); }, cases);
  sweep_f32(
      "asin", [](float x) { return asin_f32(x); }, [](double x) { return std::asin(x); }, cases);
  sweep_f32(
      "acos", [](float x) { return acos_f32(x); }, [](double x) { return std::acos(x); }, cases);
  const std::vector<std::vector<float>> hyperbolic{
      around({0.0f, 0.34657359f, 1.0f, 2.0f, 22.0f, 88.7f, 89.4f, -89.4f}, 20000)};
  sweep_f32(
      "sinh", [](float x) { return sinh_f32(x); }, [](double x) { return std::sinh(x); },
      hyperbolic);
  sweep_f32(
      "cosh", [](float x) { return cosh_f32(x); }, [](double x) { return std::cosh(x); },
      hyperbolic);
  sweep_f32(
      "asinh", [](float x) { return asinh_f32(x); }, [](double x) { return std::asinh(x); },
      hyperbolic);
  sweep_f32(
      "acosh", [](float x) { return acosh_f32(x); }, [](double x) { return std::acosh(x); },
      hyperbolic);
  sweep_f32(
      "atanh", [](float x) { return atanh_f32(x); }, [](double x) { return std::atanh(x); }, cases);
}

// ---- float64 ----

using Ref64 = long double (*)(long double);

// Random doubles: uniform bit patterns (every binade alike) and uniform values in [lo, hi], for
// each interval.
std::vector<double> double_sample(std::initializer_list<std::pair<double, double>> ranges) {
  std::mt19937_64 rng(5);
  const int64_t n = testing::scaled(1000000);
  std::vector<double> x;
  for (auto [lo, hi] : ranges) {
    std::uniform_real_distribution<double> in_range(lo, hi);
    for (int64_t i = 0; i < n; ++i) {
      double v = in_range(rng);
      if (i % 2) {
        const uint64_t b = rng();
        std::memcpy(&v, &b, 8);
      }
      x.push_back(v);
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {0.0, -0.0, inf, -inf, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(),
                   std::numeric_limits<double>::max(), -std::numeric_limits<double>::max()})
    x.push_back(v);
  return x;
}

template <typename Fn>
void sweep_f64(const char* name, const Fn& fn, Ref64 ref, const std::vector<double>& x) {
  Result<double> r;
  std::vector<double> got, want(x.size());
  apply<double>(fn, x, got);
  for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<double>(ref(x[i]));
  check(name, x, got, want, bound(name).f64, r);
  std::printf("%s_f64: at most %lld ulp (worst at %.17g)\n", name, static_cast<long long>(r.max),
              r.worst);
}

TEST(UlpF64, Exp) {
  sweep_f64(
      "exp", [](double x) { return exp_f64(x); }, [](long double x) { return std::exp(x); },
      double_sample({{-750.0, 720.0}, {-1.0, 1.0}}));
}

TEST(UlpF64, Log) {
  sweep_f64(
      "log", [](double x) { return log_f64(x); }, [](long double x) { return std::log(x); },
      double_sample({{0.0, 4.0}, {0.7, 1.5}}));
}

TEST(UlpF64, Log1p) {
  sweep_f64(
      "log1p", [](double x) { return log1p_f64(x); }, [](long double x) { return std::log1p(x); },
      double_sample({{-1.0, 4.0}, {-0.4, 0.5}, {-1.0, -0.99}}));
}

TEST(UlpF64, Expm1) {
  sweep_f64(
      "expm1", [](double x) { return expm1_f64(x); }, [](long double x) { return std::expm1(x); },
      double_sample({{-45.0, 710.0}, {-1.5, 1.5}, {700.0, 709.78}}));
}

TEST(UlpF64, SinAndCos) {
  const std::vector<double> x = double_sample({{-10.0, 10.0}, {1e6, 1.1e6}, {-1e22, 1e22}});
  sweep_f64(
      "sin", [](double v) { return sin_f64(v); }, [](long double v) { return std::sin(v); }, x);
  sweep_f64(
      "cos", [](double v) { return cos_f64(v); }, [](long double v) { return std::cos(v); }, x);
}

TEST(UlpF64, Tanh) {
  sweep_f64(
      "tanh", [](double x) { return tanh_f64(x); }, [](long double x) { return std::tanh(x); },
      double_sample({{-25.0, 25.0}, {-1.0, 1.0}}));
}

TEST(UlpF64, Erf) {
  sweep_f64(
      "erf", [](double x) { return erf_f64(x); }, [](long double x) { return std::erf(x); },
      double_sample({{-7.0, 7.0}, {-1.3, 1.3}}));
}

TEST(UlpF64, TrigonometricAndHyperbolic) {
  sweep_f64(
      "tan", [](double x) { return tan_f64(x); }, [](long double x) { return std::tan(x); },
      double_sample({{-10.0, 10.0}, {1e6, 1.1e6}, {-1e22, 1e22}}));
  const std::vector<double> x = double_sample({{-3.0, 3.0}, {0.4, 2.5}, {-1.0, 1.0}});
  sweep_f64(
      "atan", [](double v) { return atan_f64(v); }, [](long double v) { return std::atan(v); }, x);
  sweep_f64(
      "asin", [](double v) { return asin_f64(v); }, [](long double v) { return std::asin(v); }, x);
  sweep_f64(
      "acos", [](double v) { return acos_f64(v); }, [](long double v) { return std::acos(v); }, x);
  sweep_f64(
      "atanh", [](double v) { return atanh_f64(v); }, [](long double v) { return std::atanh(v); },
      x);
  const std::vector<double> h = double_sample({{-30.0, 30.0}, {-1.0, 1.0}, {700.0, 711.0}});
  sweep_f64(
      "sinh", [](double v) { return sinh_f64(v); }, [](long double v) { return std::sinh(v); }, h);
  sweep_f64(
      "cosh", [](double v) { return cosh_f64(v); }, [](long double v) { return std::cosh(v); }, h);
  sweep_f64(
      "asinh", [](double v) { return asinh_f64(v); }, [](long double v) { return std::asinh(v); },
      h);
  sweep_f64(
      "acosh", [](double v) { return acosh_f64(v); }, [](long double v) { return std::acosh(v); },
      double_sample({{1.0, 3.0}, {1.0, 1.01}, {2.0, 1e9}}));
}

TEST(UlpF32, Exp2AndLog2) {
  sweep_f32(
      "exp2", [](float x) { return exp2_f32(x); }, [](double x) { return std::exp2(x); },
      {around({-149.0f, -126.0f, 0.0f, 0.5f, 128.0f}, 20000)});
  sweep_f32(
      "log2", [](float x) { return log2_f32(x); }, [](double x) { return std::log2(x); },
      {around({1.0f, 0.70710677f, 1.4142135f, std::numeric_limits<float>::min()}, 20000)});
}

// exp2 of integers and log2 of powers of two are exact, in both dtypes.
TEST(UlpF64, Exp2AndLog2) {
  sweep_f64(
      "exp2", [](double v) { return exp2_f64(v); }, [](long double v) { return std::exp2(v); },
      double_sample({{-1080.0, 1030.0}, {-1.0, 1.0}}));
  sweep_f64(
      "log2", [](double v) { return log2_f64(v); }, [](long double v) { return std::log2(v); },
      double_sample({{0.0, 4.0}, {0.7, 1.5}}));
  for (int k = -1074; k <= 1023; ++k) {
    const double p = std::ldexp(1.0, k);
    ASSERT_EQ(exp2_f64(double(k)), p) << k;
    ASSERT_EQ(log2_f64(p), double(k)) << k;
    if (k >= -149 && k <= 127) {
      ASSERT_EQ(exp2_f32(float(k)), float(p)) << k;
      ASSERT_EQ(log2_f32(float(p)), float(k)) << k;
    }
  }
}

TEST(UlpF32, Log10) {
  sweep_f32(
      "log10", [](float x) { return log10_f32(x); }, [](double x) { return std::log10(x); },
      {around({1.0f, 0.70710677f, 1.4142135f, 10.0f, std::numeric_limits<float>::min()}, 20000)});
}

// log10 of the powers of ten that each dtype holds exactly is exact.
TEST(UlpF64, Log10) {
  sweep_f64(
      "log10", [](double v) { return log10_f64(v); }, [](long double v) { return std::log10(v); },
      double_sample({{0.0, 4.0}, {0.7, 1.5}, {1.0, 1e6}}));
  double p = 1;
  for (int k = 0; k <= 22; ++k, p *= 10) {  // 10^k is exact up to 10^22
    ASSERT_EQ(log10_f64(p), double(k)) << k;
    if (k <= 10) ASSERT_EQ(log10_f32(float(p)), float(k)) << k;
  }
}

// atan2 over pairs: each y against x's of every sign and magnitude (random bit patterns and
// values of either sign), and every pair of special values (signed zeros, infinities, NaN, the
// extremes) exactly as libm gives them.
TEST(UlpAtan2, PairsAndSpecialValues) {
  const std::vector<double> y = double_sample({{-3.0, 3.0}});
  std::vector<double> x(y.rbegin(), y.rend());
  std::vector<double> got64(y.size()), want64(y.size());
  std::vector<float> y32(y.size()), x32(y.size()), got32(y.size()), want32(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    got64[i] = atan2_f64(y[i], x[i]);
    want64[i] = static_cast<double>(
        std::atan2(static_cast<long double>(y[i]), static_cast<long double>(x[i])));
    y32[i] = static_cast<float>(y[i]), x32[i] = static_cast<float>(x[i]);
    got32[i] = atan2_f32(y32[i], x32[i]);
    want32[i] = static_cast<float>(std::atan2(double(y32[i]), double(x32[i])));
  }
  Result<double> r64;
  Result<float> r32;
  check("atan2", y, got64, want64, bound("atan2").f64, r64);
  check("atan2", y32, got32, want32, bound("atan2").f32, r32);
  std::printf("atan2: at most %lld ulp (float64), %lld (float32)\n",
              static_cast<long long>(r64.max), static_cast<long long>(r32.max));
  const double inf = std::numeric_limits<double>::infinity();
  const double specials[] = {0.0,
                             -0.0,
                             inf,
                             -inf,
                             std::nan(""),
                             1.0,
                             -1.0,
                             0x1p-1074,
                             1e300,
                             -1e300,
                             std::numeric_limits<double>::max()};
  for (double b : specials)
    for (double a : specials) {
      const double got = atan2_f64(b, a), want = std::atan2(b, a);
      const bool same = std::isnan(want) ? std::isnan(got)
                                         : std::signbit(got) == std::signbit(want) &&
                                               ulps(got, want) <= bound("atan2").f64;
      EXPECT_TRUE(same) << "atan2(" << b << ", " << a << ") = " << std::hexfloat << got << ", want "
                        << want;
      const float got32s = atan2_f32(float(b), float(a));
      const float want32s = static_cast<float>(std::atan2(double(float(b)), double(float(a))));
      EXPECT_TRUE(std::isnan(want32s) ? std::isnan(got32s) : std::memcmp(&got32s, &want32s, 4) == 0)
          << "atan2_f32(" << b << ", " << a << ") = " << std::hexfloat << got32s << ", want "
          << want32s;
    }
}

// ---- The special functions (lib/math/special.h) ----
// References in long double: libm's erfc and lgamma; erfinv by Newton's method on erf (erfc in the
// upper half); digamma and trigamma by the recurrence up to 30 and the asymptotic series there,
// with digamma's Taylor series around its positive zero nearby (where the recurrence cancels).

constexpr long double kPiL = 3.141592653589793238462643383279502884L;

long double erfinv_reference(long double y, long double start) {
  const long double a = std::fabs(y);
  if (std::isnan(y) || a > 1) return std::numeric_limits<long double>::quiet_NaN();
  if (a == 1) return std::copysign(std::numeric_limits<long double>::infinity(), y);
  if (a == 0) return y;
  long double x = std::fmin(std::fabs(start), 6.5L);
  for (int i = 0; i < 4; ++i) {  // quadratic convergence from the float64 result
    const long double f = a > 0.5L ? (1 - a) - std::erfc(x) : std::erf(x) - a;
    x -= f / (1.12837916709551257390L * std::exp(-x * x));
  }
  return std::copysign(x, y);
}

// The Bernoulli numbers B_2 .. B_20.
constexpr long double kBernoulli[10] = {1.0L / 6,       -1.0L / 30,      1.0L / 42, -1.0L / 30,
                                        5.0L / 66,      -691.0L / 2730,  7.0L / 6,  -3617.0L / 510,
                                        43867.0L / 798, -174611.0L / 330};

// psi^(n)(x0) / n! for n = 1..26 at digamma's positive zero x0 = kRootHi + kRootLo (mpmath, 50
// digits).
constexpr long double kRootHi = 1.4616321449683622;  // the double
constexpr long double kRootLo = 9.549995429965697715184199e-17L;
constexpr long double kDigammaTaylor[26] = {
    0.9676722454476211704274L,     -0.4427631689835921060929L,    0.2584997609556510106244L,
    -0.1639427054424065275043L,    0.1078240506912623657572L,     -0.07219956125645471092612L,
    0.04880428816414310722509L,    -0.03316112647484735929226L,   0.02259764823221810465962L,
    -0.0154247659049489591388L,    0.01053879161661217538812L,    -0.00720453438635686824097L,
    0.004926781395729853446354L,   -0.003369801655439328082793L,  0.002305126326734927836938L,
    -0.001576936771430197259271L,  0.001078825201916296580692L,   -0.000738070938996005129566L,
    0.0005049532658346020351774L,  -0.0003454680251063076995556L, 0.0002363560156402705279237L,
    -0.0001617062209197480344936L, 0.0001106337276874741090409L,  -0.00007569179582195065919238L,
    0.00005178575795222080868993L, -0.0000354300709476596063157L};

long double digamma_reference(long double x) {
  if (std::isnan(x)) return x;
  if (x == 0) return -1 / x;
  if (x < 0) {
    if (x == std::trunc(x)) return std::numeric_limits<long double>::quiet_NaN();
    const long double r = x - std::round(x);  // cot(pi x) has period 1; |pi r| <= pi/2 is exact
    return digamma_reference(1 - x) - kPiL / std::tan(kPiL * r);
  }
  const long double d = (x - kRootHi) - kRootLo;
  if (std::fabs(d) < 0.1L) {
    long double p = 0;
    for (int n = 25; n >= 0; --n) p = (p + kDigammaTaylor[n]) * d;
    return p;
  }
  long double shift = 0;
  for (; x < 30; x += 1) shift -= 1 / x;
  const long double z = 1 / (x * x);
  long double series = 0, power = z;
  for (int k = 0; k < 10; ++k, power *= z) series += kBernoulli[k] / (2 * (k + 1)) * power;
  return shift + std::log(x) - 1 / (2 * x) - series;
}

long double trigamma_reference(long double x) {
  if (std::isnan(x) || x == -std::numeric_limits<long double>::infinity())
    return std::numeric_limits<long double>::quiet_NaN();
  if (x <= 0 && x == std::trunc(x)) return std::numeric_limits<long double>::infinity();
  if (x < 0) {
    const long double s = std::sin(kPiL * (x - std::round(x)));
    return kPiL * kPiL / (s * s) - trigamma_reference(1 - x);
  }
  long double shift = 0;
  for (; x < 30; x += 1) shift += 1 / (x * x);
  const long double z = 1 / (x * x);
  long double series = 0, power = z / x;
  for (int k = 0; k < 10; ++k, power *= z) series += kBernoulli[k] * power;
  return shift + 1 / x + z / 2 + series;
}

// 1 plus the larger term of the reflection formula at x < 0 (0 elsewhere), times
// kReflectionSlack: the absolute error allowed besides the ulp bound (lib/math/primitives.h).
template <typename T>
std::vector<T> reflection_slack(const std::vector<T>& x, bool lgamma) {
  std::vector<T> slack(x.size(), T(0));
  for (size_t i = 0; i < x.size(); ++i) {
    const long double v = x[i];
    if (!(v < 0) || v == std::trunc(v)) continue;
    const long double r = v - std::round(v);
    const long double s = std::fabs(std::sin(kPiL * r));
    const long double terms =
        lgamma ? std::fmax(std::fabs(std::log(kPiL / std::fabs(s * v))), std::fabs(std::lgamma(-v)))
               : std::fmax(std::fabs(digamma_reference(1 - v)),
                           std::fabs(kPiL * std::cos(kPiL * r) / s));
    slack[i] = static_cast<T>(kReflectionSlack * (1 + terms));
  }
  return slack;
}

TEST(UlpF32, SpecialFunctions) {
  sweep_f32(
      "erfc", [](float x) { return erfc_f32(x); }, [](double x) { return std::erfc(x); },
      {around({0.84375f, 1.25f, 2.857f, 10.0f, -0.25f, 0.25f, 28.0f}, 20000)});
  sweep_f32(
      "erfinv", [](float x) { return erfinv_f32(x); },
      [](double x) { return static_cast<double>(erfinv_reference(x, erfinv_f64(x))); },
      {around({0.5f, -0.5f, 1.0f, -1.0f, 0.0f}, 200000)});
  sweep_f32(
      "lgamma", [](float x) { return lgamma_f32(x); }, [](double x) { return std::lgamma(x); },
      {around({1.0f, 2.0f, 1.4616321f, 0.9f, 0.2316f, 1.2316f, 1.7316f, 8.0f, -2.4570549f,
               -2.7476826f, -3.1435808f, -3.9552986f, -0.5f},
              20000)});
  sweep_f32(
      "digamma", [](float x) { return digamma_f32(x); },
      [](double x) { return static_cast<double>(digamma_reference(x)); },
      {around({1.4616321f, 1.0f, 2.0f, 10.0f, -0.5040830f, -1.5734985f, -2.6107209f, -0.5f},
              20000)});
  sweep_f32(
      "trigamma", [](float x) { return trigamma_f32(x); },
      [](double x) { return static_cast<double>(trigamma_reference(x)); },
      {around({1.0f, 10.0f, -0.5f, -1.0f, 0.0f}, 20000)});
}

TEST(UlpF64, SpecialFunctions) {
  sweep_f64(
      "erfc", [](double x) { return erfc_f64(x); }, [](long double x) { return std::erfc(x); },
      double_sample({{-7.0, 28.0}, {-1.3, 1.3}, {0.2, 0.3}}));
  const std::vector<double> y = double_sample({{-1.0, 1.0}, {0.999, 1.0}, {0.45, 0.55}});
  Result<double> r;
  std::vector<double> got, want(y.size());
  apply<double>([](double v) { return erfinv_f64(v); }, y, got);
  for (size_t i = 0; i < y.size(); ++i)
    want[i] = static_cast<double>(erfinv_reference(y[i], got[i]));
  check("erfinv", y, got, want, bound("erfinv").f64, r);
  std::printf("erfinv_f64: at most %lld ulp (worst at %.17g)\n", static_cast<long long>(r.max),
              r.worst);
  sweep_f64(
      "trigamma", [](double x) { return trigamma_f64(x); }, trigamma_reference,
      double_sample({{0.0, 12.0}, {-10.0, 0.0}}));
}

// lgamma and digamma: every x > 0 within the ulp bound; x < 0 within it or the reflection's slack.
TEST(UlpF64, LgammaAndDigamma) {
  const std::vector<double> x = double_sample({{0.0, 3.0}, {1.36, 1.56}, {-10.0, 0.0}, {3.0, 1e6}});
  for (bool lgamma : {true, false}) {
    const char* name = lgamma ? "lgamma" : "digamma";
    Result<double> r;
    std::vector<double> got, want(x.size());
    if (lgamma)
      apply<double>([](double v) { return lgamma_f64(v); }, x, got);
    else
      apply<double>([](double v) { return digamma_f64(v); }, x, got);
    for (size_t i = 0; i < x.size(); ++i)
      want[i] = static_cast<double>(lgamma ? std::lgamma(static_cast<long double>(x[i]))
                                           : digamma_reference(x[i]));
    const std::vector<double> slack = reflection_slack(x, lgamma);
    check(name, x, got, want, bound(name).f64, r, &slack);
    std::printf("%s_f64: at most %lld ulp for x > 0 (worst at %.17g)\n", name,
                static_cast<long long>(r.max), r.worst);
  }
}

// Special values, exactly as torch gives them.
TEST(UlpSpecial, SpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(erfc_f64(-inf), 2.0);
  EXPECT_EQ(erfc_f64(inf), 0.0);
  EXPECT_EQ(erfc_f64(0.0), 1.0);
  EXPECT_EQ(erfc_f32(-30.0f), 2.0f);
  EXPECT_EQ(erfinv_f64(1.0), inf);
  EXPECT_EQ(erfinv_f64(-1.0), -inf);
  EXPECT_TRUE(std::isnan(erfinv_f64(1.5)));
  EXPECT_TRUE(std::signbit(erfinv_f64(-0.0)));
  EXPECT_EQ(erfinv_f32(1.0f), std::numeric_limits<float>::infinity());
  for (double pole : {0.0, -0.0, -1.0, -2.0, -1e20, -inf}) EXPECT_EQ(lgamma_f64(pole), inf) << pole;
  EXPECT_EQ(lgamma_f64(1.0), 0.0);
  EXPECT_EQ(lgamma_f64(2.0), 0.0);
  EXPECT_EQ(lgamma_f64(inf), inf);
  EXPECT_EQ(lgamma_f32(1e37f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(digamma_f64(0.0), -inf);
  EXPECT_EQ(digamma_f64(-0.0), inf);
  EXPECT_EQ(digamma_f64(inf), inf);
  for (double pole : {-1.0, -7.0, -1e20, -inf}) EXPECT_TRUE(std::isnan(digamma_f64(pole))) << pole;
  for (double pole : {0.0, -0.0, -3.0}) EXPECT_EQ(trigamma_f64(pole), inf) << pole;
  EXPECT_EQ(trigamma_f64(inf), 0.0);
  EXPECT_TRUE(std::isnan(trigamma_f64(-inf)));
  for (auto f : {erfc_f64<double>, erfinv_f64<double>, lgamma_f64<double>, digamma_f64<double>,
                 trigamma_f64<double>})
    EXPECT_TRUE(std::isnan(f(std::nan(""))));
}

}  // namespace
}  // namespace kiln::math
