// randperm, bernoulli, normal, multinomial (statistical checks with bounds far beyond chance,
// reproducibility under manual_seed, fresh draws on every replay of a trace) and interpolate
// (nearest, nearest-exact, linear, bilinear, trilinear against a float64 reference of torch's
// index and weight arithmetic; gradients by gradcheck; lazy against eager).
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::values;
using In = std::vector<Tensor>;

bool is_permutation_of_n(const Tensor& t, int64_t n) {
  std::vector<double> v = values(t);
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < n; ++i)
    if (v[size_t(i)] != double(i)) return false;
  return int64_t(v.size()) == n;
}

TEST(Sampling, RandpermIsAPermutationReproducibleBySeed) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    const Tensor p = randperm(n);
    EXPECT_EQ(p.dtype(), kInt64);
    EXPECT_TRUE(is_permutation_of_n(p, n)) << n;
  }
  manual_seed(5);
  const std::vector<double> first = values(randperm(50));
  manual_seed(5);
  EXPECT_EQ(values(randperm(50)), first);
  EXPECT_NE(values(randperm(50)), first);  // 1 in 50! to fail by chance
  EXPECT_EQ(randperm(4, kInt32).dtype(), kInt32);
  expect_error([] { randperm(-1); }, {"randperm", "-1"});
  // Traced: every replay draws a new permutation.
  jit::Function traced =
      jit::trace([](const In& in) { return In{randperm(30) + in[0]}; }, {zeros({1}, kInt64)});
  const std::vector<double> a = values(traced({zeros({1}, kInt64)})[0]);
  const std::vector<double> b = values(traced({zeros({1}, kInt64)})[0]);
  EXPECT_TRUE(is_permutation_of_n(from_vector(a), 30));
  EXPECT_TRUE(is_permutation_of_n(from_vector(b), 30));
  EXPECT_NE(a, b);
}

TEST(Sampling, BernoulliAndNormalHaveTheirMoments) {
  const int64_t n = 200000;
  const Tensor p = full({n}, 0.3, kFloat64);
  const Tensor draws = bernoulli(p);
  EXPECT_EQ(draws.dtype(), kFloat64);
  const double mean = draws.mean().item<double>();
  EXPECT_NEAR(mean, 0.3, 5 * std::sqrt(0.3 * 0.7 / n));  // 5 standard errors
  for (double v : values(bernoulli(from_vector(std::vector<double>{0, 1, 0, 1}))))
    EXPECT_TRUE(v == 0 || v == 1);
  expect_close(bernoulli(from_vector(std::vector<float>{0, 1, 1, 0})), {0, 1, 1, 0}, {4}, kFloat32,
               0, 0);
  EXPECT_NEAR(bernoulli(zeros({n}), 0.75).mean().item<float>(), 0.75, 5 * std::sqrt(0.1875 / n));
  // normal: mean + std z, broadcast; the reparameterized gradient.
  const Tensor mu = from_vector(std::vector<double>{-2, 3}).reshape({2, 1});
  const Tensor sigma = from_vector(std::vector<double>{0.5, 2}).reshape({2, 1});
  const Tensor z = normal(mu.expand({2, n / 2}).contiguous(), sigma);
  for (int64_t r = 0; r < 2; ++r) {
    const Tensor row = z.select(0, r);
    const double m = row.mean().item<double>(), s = row.std().item<double>();
    const double want_m = values(mu)[size_t(r)], want_s = values(sigma)[size_t(r)];
    EXPECT_NEAR(m, want_m, 5 * want_s / std::sqrt(n / 2.0));
    EXPECT_NEAR(s, want_s, 5 * want_s / std::sqrt(double(n)));
  }
  const Tensor leaf = from_vector(std::vector<double>{1, 2}).requires_grad_();
  normal(leaf, 0.5).sum().backward();
  expect_close(leaf.grad(), {1, 1}, {2}, kFloat64, 0, 0);
  EXPECT_EQ(normal(0.0, 1.0, {3, 4}).sizes(), (Shape{3, 4}));
  expect_error([] { normal(zeros({2}), -1.0); }, {"normal", "std"});
}

TEST(Sampling, MultinomialFollowsTheDistribution) {
  const Tensor probs = from_vector(std::vector<double>{0.1, 0, 0.6, 0.3});
  const int64_t n = 100000;
  const Tensor samples = multinomial(probs, n, true);
  ASSERT_EQ(samples.sizes(), (Shape{n}));
  EXPECT_EQ(samples.dtype(), kInt64);
  std::vector<double> count(4, 0);
  for (double v : values(samples)) count[size_t(v)] += 1;
  EXPECT_EQ(count[1], 0);  // probability 0: never drawn
  for (size_t k = 0; k < 4; ++k) {
    const double pk = values(probs)[k];
    EXPECT_NEAR(count[k] / n, pk, 5 * std::sqrt(pk * (1 - pk) / n) + 1e-12) << k;
  }
  // Without replacement: distinct categories, the zero-probability one never, rows independent.
  const Tensor rows = from_vector(std::vector<float>{1, 0, 2, 3, 5, 5, 5, 5}).reshape({2, 4});
  for (int trial = 0; trial < 50; ++trial) {
    const Tensor s = multinomial(rows, 3, false);
    ASSERT_EQ(s.sizes(), (Shape{2, 3}));
    const std::vector<double> v = values(s);
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<double> row(v.begin() + r * 3, v.begin() + r * 3 + 3);
      std::sort(row.begin(), row.end());
      EXPECT_TRUE(std::adjacent_find(row.begin(), row.end()) == row.end());
      if (r == 0) EXPECT_TRUE(std::find(row.begin(), row.end(), 1.0) == row.end());
    }
  }
  // The first draw without replacement is distributed as p: category 2 of [1, 0, 2, 3] is first
  // about a third of the time.
  double firsts = 0;
  const int64_t m = 20000;
  const Tensor many = multinomial(rows.select(0, 0).unsqueeze(0).expand({m, 4}).contiguous(), 1);
  for (double v : values(many)) firsts += v == 2;
  EXPECT_NEAR(firsts / m, 2.0 / 6, 5 * std::sqrt((2.0 / 6) * (4.0 / 6) / m));
  expect_error([&] { multinomial(-probs, 1); }, {"multinomial", "non-negative"});
  expect_error([] { multinomial(zeros({3}), 1); }, {"multinomial", "sum to 0"});
  expect_error([&] { multinomial(probs, 5); }, {"multinomial", "without replacement"});
  expect_error([&] { multinomial(probs, 4); }, {"multinomial", "fewer nonzero"});
  expect_error([] { multinomial(ones({2, 2, 2}), 1); }, {"multinomial", "1-D or 2-D"});
}

// ------------------------------------------------------------ interpolate

// torch's source index and weights of one dim (UpSample.h), in double.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<double> w0, w1;
};
Taps linear_taps(int64_t in, int64_t out, bool align, std::optional<double> scale) {
  Taps t;
  const double s = align ? (out > 1 ? double(in - 1) / double(out - 1) : 0.0)
                         : (scale ? 1.0 / *scale : double(in) / double(out));
  for (int64_t o = 0; o < out; ++o) {
    if (in == out) {
      t.i0.push_back(o), t.i1.push_back(o), t.w0.push_back(1), t.w1.push_back(0);
      continue;
    }
    const double src = align ? s * double(o) : std::max(s * (double(o) + 0.5) - 0.5, 0.0);
    const int64_t i = std::min(int64_t(src), in - 1);
    const double l1 = std::min(std::max(src - double(i), 0.0), 1.0);
    t.i0.push_back(i), t.i1.push_back(i + (i < in - 1 ? 1 : 0));
    t.w0.push_back(1 - l1), t.w1.push_back(l1);
  }
  return t;
}

TEST(Interpolate, BilinearMatchesTorchsNestedSum) {
  for (bool align : {false, true})
    for (const auto& [h, w, oh, ow] : std::vector<std::array<int64_t, 4>>{
             {3, 4, 5, 7}, {4, 4, 2, 3}, {1, 3, 4, 3}, {5, 2, 5, 9}}) {
      SCOPED_TRACE(::testing::Message()
                   << h << "x" << w << " -> " << oh << "x" << ow << " align " << align);
      const Tensor x = testing::random_tensor({2, 3, h, w}, kFloat64);
      const Taps th = linear_taps(h, oh, align, std::nullopt);
      const Taps tw = linear_taps(w, ow, align, std::nullopt);
      const std::vector<double> xv = values(x);
      std::vector<double> want;
      for (int64_t nc = 0; nc < 6; ++nc)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            auto at = [&](int64_t r, int64_t c) { return xv[size_t((nc * h + r) * w + c)]; };
            auto row = [&](int64_t r) {
              return tw.w0[size_t(j)] * at(r, tw.i0[size_t(j)]) +
                     tw.w1[size_t(j)] * at(r, tw.i1[size_t(j)]);
            };
            want.push_back(th.w0[size_t(i)] * row(th.i0[size_t(i)]) +
                           th.w1[size_t(i)] * row(th.i1[size_t(i)]));
          }
      for (const auto& [layout, lx] : testing::layouts(x)) {
        SCOPED_TRACE(layout);
        expect_close(interpolate(lx, {oh, ow}, {}, "bilinear", align), want, {2, 3, oh, ow},
                     kFloat64, 1e-15, 1e-15);
      }
    }
}

TEST(Interpolate, NearestLinearTrilinearAndScaleFactors) {
  const Tensor x = testing::random_tensor({1, 2, 5}, kFloat64);
  const std::vector<double> xv = values(x);
  // nearest: floor(o * in / out); nearest-exact: floor((o + 0.5) * in / out).
  for (const auto& [out, exact] : std::vector<std::pair<int64_t, bool>>{
           {3, false}, {8, false}, {10, false}, {3, true}, {8, true}}) {
    std::vector<double> want;
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t o = 0; o < out; ++o) {
        const float s = 5.0f / float(out);
        int64_t i = exact ? int64_t(std::floor(float((o + 0.5) * s))) : int64_t(std::floor(o * s));
        if (!exact && out == 10) i = o >> 1;
        want.push_back(xv[size_t(c * 5 + std::min<int64_t>(i, 4))]);
      }
    expect_close(interpolate(x, {out}, {}, exact ? "nearest-exact" : "nearest"), want, {1, 2, out},
                 kFloat64, 0, 0);
  }
  // linear with a scale factor: the factor itself is the kernel's scale (no recompute).
  const Taps t = linear_taps(5, 8, false, 1.7);
  std::vector<double> want;
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t o = 0; o < 8; ++o)
      want.push_back(t.w0[size_t(o)] * xv[size_t(c * 5 + t.i0[size_t(o)])] +
                     t.w1[size_t(o)] * xv[size_t(c * 5 + t.i1[size_t(o)])]);
  expect_close(interpolate(x, {}, {1.7}, "linear"), want, {1, 2, 8}, kFloat64, 1e-15, 1e-15);
  // recompute_scale_factor: the scale becomes in / out.
  expect_close(interpolate(x, {}, {1.7}, "linear", false, true),
               values(interpolate(x, {8}, {}, "linear")), {1, 2, 8}, kFloat64, 0, 0);
  // trilinear of a constant is the constant; integers take the nearest modes only.
  expect_close(interpolate(full({1, 1, 2, 3, 2}, 1.5, kFloat64), {}, {2.0}, "trilinear"),
               std::vector<double>(4 * 6 * 4, 1.5), {1, 1, 4, 6, 4}, kFloat64, 1e-15, 0);
  EXPECT_EQ(interpolate(ones({1, 1, 2, 2}, kInt64), {3, 3}, {}, "nearest").dtype(), kInt64);
  const Tensor leaf = testing::random_tensor({1, 2, 3, 4}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return interpolate(in[0], {5, 3}, {}, "bilinear", true);
      },
      {leaf}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return interpolate(in[0], {}, {2.5}, "nearest"); }, {leaf}));
  expect_error([&] { interpolate(x, {4}, {2.0}); }, {"interpolate", "either"});
  expect_error([&] { interpolate(x, {4}, {}, "bilinear"); }, {"interpolate", "\"linear\""});
  expect_error([&] { interpolate(x, {4}, {}, "nearest", true); }, {"interpolate", "align_corners"});
  expect_error([] { interpolate(ones({4}), {2}); }, {"interpolate", "spatial"});
  expect_error([&] { interpolate(x.to(kInt64), {4}, {}, "linear"); }, {"interpolate", "floating"});
}

TEST(SamplingInterpolateLazy, CompositesRecordAndMatchEagerMode) {
  const Tensor x = testing::input({2, 3, 4, 5}, kFloat32);
  testing::check_lazy(
      "interpolate",
      [&] {
        return std::vector<Tensor>{interpolate(x * 2.0, {7, 3}, {}, "bilinear"),
                                   interpolate(x + 1.0, {}, {1.5, 2.0}, "nearest"),
                                   interpolate(x, {6, 6}, {}, "bilinear", true)};
      },
      false);
}

}  // namespace
}  // namespace kiln
