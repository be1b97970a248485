// pad (constant, reflect, replicate, circular), pixel_shuffle, pixel_unshuffle, softmin, and the
// margin and likelihood losses (margin_ranking, soft_margin, hinge_embedding, cosine_embedding,
// triplet_margin, gaussian_nll, poisson_nll, multilabel_soft_margin): float64 reference loops,
// gradients by gradcheck, lazy runs against eager ones, bad input raising kiln::Error.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::pick;
using testing::values;
using In = std::vector<Tensor>;

// The padded element of a [rows, n] row-major x at column j of a dim padded by `before`.
double padded_at(const std::vector<double>& x, int64_t row, int64_t n, int64_t j, int64_t before,
                 const std::string& mode, double value) {
  int64_t i = j - before;
  if (i >= 0 && i < n) return x[size_t(row * n + i)];
  if (mode == "constant") return value;
  if (mode == "replicate") i = std::clamp<int64_t>(i, 0, n - 1);
  if (mode == "reflect") i = i < 0 ? -i : 2 * (n - 1) - i;
  if (mode == "circular") i = (i % n + n) % n;
  return x[size_t(row * n + i)];
}

TEST(Pad, EveryModeMatchesAReferenceAlongTheLastDim) {
  for (const char* mode : {"constant", "reflect", "replicate", "circular"})
    for (int iter = 0; iter < 12; ++iter) {
      const int64_t rows = pick(1, 4), n = pick(1, 5);
      const int64_t limit = std::string(mode) == "reflect" ? n - 1 : n;
      const int64_t before = pick(0, limit), after = pick(0, limit);
      const Tensor x = testing::random_tensor({1, rows, n}, kFloat64);
      const double value = std::string(mode) == "constant" ? 2.5 : 0.0;
      SCOPED_TRACE(::testing::Message()
                   << mode << " n " << n << " pads " << before << ", " << after);
      const std::vector<double> xv = values(x);
      std::vector<double> want;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n + before + after; ++j)
          want.push_back(padded_at(xv, r, n, j, before, mode, value));
      for (const auto& [layout, lx] : testing::layouts(x)) {
        SCOPED_TRACE(layout);
        expect_close(pad(lx, {before, after}, mode, value), want, {1, rows, n + before + after},
                     kFloat64, 0, 0);
      }
    }
}

TEST(Pad, TwoDimsCropsGradientsAndErrors) {
  const Tensor x = testing::random_tensor({2, 3, 4}, kFloat64);
  // Reflect over two dims: the corner reflects in both.
  const Tensor y = pad(x, {1, 2, 2, 1}, "reflect");
  ASSERT_EQ(y.sizes(), (Shape{2, 6, 7}));
  EXPECT_EQ(values(y)[0], values(x)[2 * 4 + 1]);  // row 2, column 1 of the first matrix
  // Negative constant pads crop.
  expect_close(pad(x, {-1, 0}), values(x.narrow(2, 1, 3).contiguous()), {2, 3, 3}, kFloat64, 0, 0);
  // Always a new tensor: writing to a result without padding leaves x alone.
  const std::vector<double> before = values(x);
  pad(x, {0, 0}).fill_(7.0);
  pad(x, {-1, 0}, "constant").fill_(7.0);
  expect_close(x, before, x.sizes(), kFloat64, 0, 0);
  const Tensor leaf = x.clone().requires_grad_();
  for (const char* mode : {"constant", "reflect", "replicate", "circular"})
    EXPECT_TRUE(testing::gradcheck(
        [mode](const In& in) {
          return pad(in[0], {2, 1, 1, 2}, mode).pow(2);
        },
        {leaf}))
        << mode;
  expect_error([&] { pad(x, {1}); }, {"pad", "even"});
  expect_error([&] { pad(x, {4, 0}, "reflect"); }, {"pad", "reflect", "smaller"});
  expect_error([&] { pad(x, {1, 1}, "wrap"); }, {"pad", "wrap"});
  expect_error([&] { pad(ones({4}), {1, 1}, "replicate"); }, {"pad", "replicate"});
  expect_error([&] { pad(x, {-5, 0}); }, {"pad", "negative size"});
}

TEST(PixelShuffle, RearrangesChannelsIntoBlocksAndBack) {
  const int64_t r = 2;
  const Tensor x = testing::random_tensor({2, 8, 3, 2}, kFloat64);
  const Tensor y = pixel_shuffle(x, r);
  ASSERT_EQ(y.sizes(), (Shape{2, 2, 6, 4}));
  const std::vector<double> xv = values(x), yv = values(y);
  // out[n][c][h r + i][w r + j] = in[n][c r^2 + i r + j][h][w].
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t h = 0; h < 6; ++h)
        for (int64_t w = 0; w < 4; ++w) {
          const int64_t in_c = c * r * r + (h % r) * r + (w % r);
          EXPECT_EQ(yv[size_t(((n * 2 + c) * 6 + h) * 4 + w)],
                    xv[size_t(((n * 8 + in_c) * 3 + h / r) * 2 + w / r)]);
        }
  expect_close(pixel_unshuffle(y, r), xv, x.sizes(), kFloat64, 0, 0);
  EXPECT_EQ(pixel_shuffle(ones({9, 1, 1}), 3).sizes(), (Shape{1, 3, 3}));
  // New tensors, as torch's, even where the rearrangement is a view: writing one leaves x as it
  // was (and a leaf that requires grad can be shuffled and then written).
  for (const Shape& shape : {Shape{1, 4, 1, 1}, Shape{2, 3, 2, 2}}) {
    const Tensor leaf = testing::random_tensor(shape, kFloat64).requires_grad_();
    const std::vector<double> before = values(leaf);
    const int64_t factor = shape[1] == 4 ? 2 : 1;
    Tensor shuffled = pixel_shuffle(leaf, factor), unshuffled = pixel_unshuffle(leaf, 1);
    shuffled.mul_(2.5);
    unshuffled.mul_(2.5);
    EXPECT_EQ(values(leaf), before);
  }
  expect_error([] { pixel_shuffle(ones({1, 3, 2, 2}), 2); }, {"pixel_shuffle", "divisible"});
  expect_error([] { pixel_unshuffle(ones({1, 1, 3, 2}), 2); }, {"pixel_unshuffle", "divisible"});
  expect_error([] { pixel_shuffle(ones({4, 2}), 2); }, {"pixel_shuffle", "3 dims"});
}

TEST(Softmin, IsTheSoftmaxOfTheNegation) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64);
  expect_close(softmin(x, 1), values(softmax(-x, 1)), {3, 4}, kFloat64, 0, 0);
}

// ------------------------------------------------------------ losses

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

TEST(MarginLosses, MatchTorchsFormulasElementByElement) {
  const Tensor x1 = testing::random_tensor({6}, kFloat64),
               x2 = testing::random_tensor({6}, kFloat64);
  const Tensor y = from_vector(std::vector<double>{1, -1, 1, -1, 1, -1});
  const std::vector<double> a = values(x1), b = values(x2), t = values(y);
  std::vector<double> ranking, soft, hinge;
  for (size_t i = 0; i < 6; ++i) {
    ranking.push_back(std::max(0.0, -t[i] * (a[i] - b[i]) + 0.5));
    soft.push_back(std::log1p(std::exp(-a[i] * t[i])));
    hinge.push_back(t[i] == 1 ? a[i] : std::max(0.0, 1.5 - a[i]));
  }
  expect_close(margin_ranking_loss(x1, x2, y, 0.5, Reduction::None), ranking, {6}, kFloat64, 1e-15,
               0);
  EXPECT_NEAR(soft_margin_loss(x1, y).item<double>(), mean_of(soft), 1e-14);
  EXPECT_NEAR(hinge_embedding_loss(x1, y, 1.5, Reduction::Sum).item<double>(), mean_of(hinge) * 6,
              1e-13);
  // cosine_embedding_loss of rows.
  const Tensor p = testing::random_tensor({3, 4}, kFloat64),
               q = testing::random_tensor({3, 4}, kFloat64);
  const Tensor ty = from_vector(std::vector<double>{1, -1, -1});
  const std::vector<double> pv = values(p), qv = values(q);
  std::vector<double> cosine;
  for (int64_t r = 0; r < 3; ++r) {
    double dot = 0, n1 = 1e-12, n2 = 1e-12;
    for (int64_t k = 0; k < 4; ++k) {
      dot += pv[size_t(r * 4 + k)] * qv[size_t(r * 4 + k)];
      n1 += pv[size_t(r * 4 + k)] * pv[size_t(r * 4 + k)];
      n2 += qv[size_t(r * 4 + k)] * qv[size_t(r * 4 + k)];
    }
    const double c = dot / std::sqrt(n1 * n2);
    cosine.push_back(r == 0 ? 1 - c : std::max(0.0, c - 0.1));
  }
  expect_close(cosine_embedding_loss(p, q, ty, 0.1, Reduction::None), cosine, {3}, kFloat64, 1e-12,
               1e-15);
  // triplet_margin_loss with and without swap, from pairwise distances.
  const Tensor n = testing::random_tensor({3, 4}, kFloat64);
  const Tensor dp = pairwise_distance(p, q), dn = pairwise_distance(p, n),
               ds = pairwise_distance(q, n);
  std::vector<double> plain, swapped;
  for (int64_t r = 0; r < 3; ++r) {
    plain.push_back(std::max(0.0, 1 + values(dp)[size_t(r)] - values(dn)[size_t(r)]));
    swapped.push_back(std::max(
        0.0, 1 + values(dp)[size_t(r)] - std::min(values(dn)[size_t(r)], values(ds)[size_t(r)])));
  }
  expect_close(triplet_margin_loss(p, q, n, 1, 2, 1e-6, false, Reduction::None), plain, {3},
               kFloat64, 1e-14, 1e-15);
  expect_close(triplet_margin_loss(p, q, n, 1, 2, 1e-6, true, Reduction::None), swapped, {3},
               kFloat64, 1e-14, 1e-15);
  expect_error([&] { cosine_embedding_loss(p, q, ones({3, 1})); }, {"cosine_embedding_loss"});
}

TEST(LikelihoodLosses, GaussianAndPoissonMatchTorchsFormulas) {
  const Tensor x = testing::random_tensor({3, 2}, kFloat64),
               t = testing::random_tensor({3, 2}, kFloat64);
  const Tensor var = from_vector(std::vector<double>{0.5, 1e-9, 2});  // one below eps: clamped
  const std::vector<double> xv = values(x), tv = values(t), vv = values(var);
  std::vector<double> gauss;
  for (int64_t i = 0; i < 6; ++i) {
    const double v = std::max(vv[size_t(i / 2)], 1e-6), d = xv[size_t(i)] - tv[size_t(i)];
    gauss.push_back(0.5 * (std::log(v) + d * d / v) + 0.5 * std::log(2 * M_PI));
  }
  expect_close(gaussian_nll_loss(x, t, var, true, 1e-6, Reduction::None), gauss, {3, 2}, kFloat64,
               1e-13, 1e-15);
  // The clamp changes the value, not the gradient.
  const Tensor v = var.clone().requires_grad_();
  gaussian_nll_loss(x, t, v, false, 1e-6, Reduction::Sum).backward();
  const double d0 = xv[2] - tv[2], d1 = xv[3] - tv[3];
  EXPECT_NEAR(values(v.grad())[1], 0.5 * (2 / 1e-6 - (d0 * d0 + d1 * d1) / 1e-12), 1e-3 * 1e12);
  expect_error([&] { gaussian_nll_loss(x, t, -ones({3})); }, {"gaussian_nll_loss", "negative"});
  expect_error([&] { gaussian_nll_loss(x, t, ones({2})); }, {"gaussian_nll_loss", "var"});
  // poisson_nll_loss, both input forms, with Stirling's term where t > 1.
  const Tensor rate = testing::random_tensor({5}, kFloat64, 0.1, 3);
  const Tensor counts = from_vector(std::vector<double>{0, 1, 2, 5, 3});
  const std::vector<double> rv = values(rate), cv = values(counts);
  std::vector<double> logged, direct;
  for (size_t i = 0; i < 5; ++i) {
    const double c = cv[i];
    const double stirling = c > 1 ? c * std::log(c) - c + 0.5 * std::log(2 * M_PI * c) : 0;
    logged.push_back(std::exp(rv[i]) - c * rv[i] + stirling);
    direct.push_back(rv[i] - c * std::log(rv[i] + 1e-8));
  }
  expect_close(poisson_nll_loss(rate, counts, true, true, 1e-8, Reduction::None), logged, {5},
               kFloat64, 1e-13, 1e-15);
  expect_close(poisson_nll_loss(rate, counts, false, false, 1e-8, Reduction::None), direct, {5},
               kFloat64, 1e-13, 1e-15);
  // multilabel_soft_margin_loss: the class mean of the binary terms.
  const Tensor labels = from_vector(std::vector<double>{1, 0, 0, 1, 1, 0}).reshape({3, 2});
  std::vector<double> multi;
  for (int64_t r = 0; r < 3; ++r) {
    double s = 0;
    for (int64_t k = 0; k < 2; ++k) {
      const double z = xv[size_t(r * 2 + k)], y = values(labels)[size_t(r * 2 + k)];
      s += -(y * -std::log1p(std::exp(-z)) + (1 - y) * -std::log1p(std::exp(z)));
    }
    multi.push_back(s / 2);
  }
  expect_close(multilabel_soft_margin_loss(x, labels, {}, Reduction::None), multi, {3}, kFloat64,
               1e-13, 1e-15);
}

TEST(LossGradients, MatchFiniteDifferences) {
  const Tensor a = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  const Tensor b = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  const Tensor c = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  const Tensor y = from_vector(std::vector<double>{1, -1, -1, 1});
  EXPECT_TRUE(testing::gradcheck(
      [&](const In& in) { return cosine_embedding_loss(in[0], in[1], y, 0.2); }, {a, b}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return triplet_margin_loss(in[0], in[1], in[2], 0.5, 3, 1e-6, true); },
      {a, b, c}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return soft_margin_loss(in[0], in[1].sign()); },
                                 {a, b}));
  const Tensor var = testing::random_tensor({4}, kFloat64, 0.5, 2).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return gaussian_nll_loss(in[0], in[1], in[2]); }, {a, b, var}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return poisson_nll_loss(in[0], in[1].abs(), true, true); }, {a, b}));
}

TEST(PaddingLossesLazy, CompositesRecordAndMatchEagerMode) {
  const Tensor x = testing::input({2, 4, 3, 3}, kFloat32);
  const Tensor y = testing::input({2, 4, 3, 3}, kFloat32);
  testing::check_lazy(
      "padding and losses",
      [&] {
        return std::vector<Tensor>{pad(x * 2.0, {1, 1, 2, 0}, "reflect"),
                                   pad(x + 1.0, {1, 2}, "constant", -1),
                                   pixel_shuffle(x * 3.0, 2),
                                   softmin(x, 1),
                                   soft_margin_loss(x, y.sign()),
                                   margin_ranking_loss(x, y, y.sign(), 0.1),
                                   poisson_nll_loss(x, y.abs())};
      },
      false);
}

}  // namespace
}  // namespace kiln
