// The special functions' ops beyond their rows (tests/lib/elementwise_test.cpp checks each against
// a float64 reference, tests/lib/autograd_ops_test.cpp their gradients, tests/lib/ulp_test.cpp
// their ulps): polygamma's orders, mvlgamma, the kiln::special names, ndtr's lower tail,
// trigamma's missing gradient as an error, nn::init::trunc_normal_, and fused against eager.
#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::values;

// actual against expected's values, within atol + rtol |expected|.
void expect_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  testing::expect_close(actual, values(expected), expected.sizes(), expected.dtype(), rtol, atol);
}

TEST(SpecialFunctions, PolygammaHasOrdersZeroAndOne) {
  const Tensor x = testing::input({3, 5}, kFloat64, 0.2, 6.0);
  EXPECT_TRUE(equal(polygamma(0, x), digamma(x)));
  EXPECT_TRUE(equal(polygamma(1, x), trigamma(x)));
  EXPECT_TRUE(equal(x.polygamma(1), trigamma(x)));
  EXPECT_TRUE(equal(special::polygamma(0, x), special::psi(x)));
  expect_error([&] { polygamma(2, x); }, {"polygamma", "order 2", "not implemented"});
  expect_error([&] { polygamma(-1, x); }, {"polygamma", "negative"});
  // trigamma(1) = pi^2 / 6, digamma(1) = -Euler's constant.
  const Tensor one = ones({1}, kFloat64);
  EXPECT_DOUBLE_EQ(polygamma(1, one).item<double>(), M_PI * M_PI / 6);
  EXPECT_DOUBLE_EQ(polygamma(0, one).item<double>(), -0.57721566490153286);
}

TEST(SpecialFunctions, TrigammaHasNoGradientAndSaysSo) {
  Tensor x = testing::input({4}, kFloat64, 0.5, 3.0).requires_grad_();
  Tensor y = trigamma(x).sum();
  expect_error([&] { y.backward(); }, {"trigamma", "polygamma(2, x)", "not implemented"});
  // digamma's gradient is trigamma: one order deep works.
  Tensor z = digamma(x).sum();
  z.backward();
  expect_close(x.grad(), trigamma(x.detach()), 1e-15, 0);
}

TEST(SpecialFunctions, MvlgammaMatchesItsSumAndChecksItsDomain) {
  for (int64_t p : {1, 2, 5}) {
    const Tensor x = testing::input({2, 7}, kFloat64, 0.5 * double(p - 1) + 0.01, 8.0);
    std::vector<double> want = values(x);
    for (double& v : want) {
      double sum = double(p) * double(p - 1) / 4 * std::log(M_PI);
      for (int64_t j = 0; j < p; ++j) sum += std::lgamma(v - 0.5 * double(j));
      v = sum;
    }
    expect_close(mvlgamma(x, p), from_vector(want, x.sizes()), 1e-13, 1e-13);
    EXPECT_TRUE(equal(special::multigammaln(x, p), mvlgamma(x, p)));
    Tensor leaf = x.clone().requires_grad_();
    EXPECT_TRUE(testing::gradcheck(
        [p](const std::vector<Tensor>& in) { return mvlgamma(in[0], p); }, {leaf}));
  }
  const Tensor bad = from_vector(std::vector<double>{3.0, 0.5}, {2});
  expect_error([&] { mvlgamma(bad, 2); }, {"mvlgamma", "greater than (p - 1) / 2 = 0.5"});
  expect_error([&] { mvlgamma(bad, 0); }, {"mvlgamma", "p must be at least 1"});
  expect_error([&] { mvlgamma(arange(3), 1); }, {"mvlgamma", "floating-point"});
}

TEST(SpecialFunctions, SpecialNamesAreTheOps) {
  const Tensor x = testing::input({9}, kFloat32, -0.95, 0.95);
  EXPECT_TRUE(equal(special::erf(x), erf(x)));
  EXPECT_TRUE(equal(special::erfc(x), erfc(x)));
  EXPECT_TRUE(equal(special::erfinv(x), erfinv(x)));
  EXPECT_TRUE(equal(special::gammaln(x), lgamma(x)));
  EXPECT_TRUE(equal(special::digamma(x), x.digamma()));
  EXPECT_TRUE(equal(x.erfc(), erfc(x)));
  EXPECT_TRUE(equal(x.erfinv(), erfinv(x)));
  EXPECT_TRUE(equal(x.lgamma(), lgamma(x)));
  // Integers compute in float32, as torch's.
  EXPECT_EQ(lgamma(arange(1, 6)).dtype(), kFloat32);
  expect_close(
      lgamma(arange(1, 6)),
      from_vector(std::vector<float>{0, 0, std::log(2.0f), std::log(6.0f), std::log(24.0f)}, {5}),
      1e-6, 1e-7);
}

// ndtr keeps its relative accuracy far into the lower tail, where 1 + erf(x / sqrt(2)) would be 0:
// within ulps of erfc at its rounded argument x * -1/sqrt(2), whose rounding (as in torch's
// formula) moves the exact result by up to x^2 ulps.
TEST(SpecialFunctions, NdtrKeepsTheLowerTail) {
  const std::vector<double> xs = {-37.0, -30.0, -10.0, -3.0, -0.5, 0.0, 0.5, 3.0, 10.0};
  const Tensor got = special::ndtr(from_vector(xs, {int64_t(xs.size())}));
  std::vector<double> want, exact;
  for (double x : xs) {
    want.push_back(static_cast<double>(0.5L * std::erfc(static_cast<long double>(x * -M_SQRT1_2))));
    exact.push_back(0.5 * std::erfc(-x / std::sqrt(2.0)));
  }
  expect_close(got, from_vector(want, got.sizes()), 1e-15, 0);
  expect_close(got, from_vector(exact, got.sizes()), 4 * 37 * 37 * 0x1p-52, 0);
  EXPECT_GT(values(got)[0], 1e-300);
}

TEST(SpecialFunctions, TruncNormalStaysInItsBoundsWithTheTruncatedMoments) {
  manual_seed(3);
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor w = zeros({400, 500}, dtype).requires_grad_();
    nn::init::trunc_normal_(w, 1.0, 2.0, -1.0, 3.0);  // the standard bounds -1 and 1
    EXPECT_TRUE(w.is_leaf() && w.requires_grad());
    EXPECT_GE(w.min().item<double>(), -1.0);
    EXPECT_LE(w.max().item<double>(), 3.0);
    // N(0, 1) truncated to [-1, 1]: mean 0, variance 1 - 2 phi(1) / (Phi(1) - Phi(-1)).
    const double phi1 = std::exp(-0.5) / std::sqrt(2 * M_PI), mass = std::erf(1 / std::sqrt(2.0));
    const double sd = 2.0 * std::sqrt(1 - 2 * phi1 / mass);
    const Tensor v = w.detach().to(kFloat64);
    EXPECT_NEAR(v.mean().item<double>(), 1.0, 0.01);
    EXPECT_NEAR(v.std().item<double>(), sd, 0.01);
  }
  Tensor w = zeros({3});
  const Tensor before = w.clone();
  expect_error([&] { nn::init::trunc_normal_(w, 0, 1, 2, 2); }, {"trunc_normal_", "a < b"});
  expect_error([&] { nn::init::trunc_normal_(w, 0, 0); }, {"trunc_normal_", "std > 0"});
  EXPECT_TRUE(equal(w, before));
}

// A chain of the special functions fused gives eager mode's bits, forward and backward.
TEST(SpecialFunctions, FusedEqualsEager) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor x0 = testing::input({33, 17}, dtype, 0.1, 0.9);
    auto run = [&](bool lazy) {
      LazyGuard mode(lazy);
      Tensor x = x0.clone().requires_grad_();
      Tensor y = lgamma(erfinv(x) + 1.5) + digamma(erfc(x) + 0.5) * 0.25;
      y.sum().backward();
      return std::vector<Tensor>{y.detach(), x.grad()};
    };
    const std::vector<Tensor> eager = run(false), lazy = run(true);
    for (size_t i = 0; i < eager.size(); ++i)
      EXPECT_TRUE(equal(eager[i], lazy[i])) << dtype_name(dtype) << " output " << i;
  }
}

}  // namespace
}  // namespace kiln
