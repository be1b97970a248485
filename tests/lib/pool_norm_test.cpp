// Tests of pooling (max_pool2d with indices, avg_pool2d, adaptive_avg_pool2d) and channel
// normalization (batch_norm, group_norm): float64 reference loops over random geometries,
// gradient checks (twice differentiated), lazy results equal to eager ones, and errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::check_lazy;
using testing::expect_close;
using testing::expect_error;
using testing::random_tensor;
using testing::rng;
using testing::values;

[[maybe_unused]] ::testing::Environment* const kNoFlush =
    ::testing::AddGlobalTestEnvironment(new testing::NoFlushEnvironment);

int64_t pick(int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng()() % static_cast<uint64_t>(hi - lo + 1));
}

// A random pooling geometry over [N, C, H, W].
struct Pool {
  int64_t N, C, H, W, kH, kW, sH, sW, pH, pW, dH, dW;
  bool ceil_mode;
  // torch's output size.
  static int64_t out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    const double span = static_cast<double>(in + 2 * p - d * (k - 1) - 1) / static_cast<double>(s);
    int64_t o = static_cast<int64_t>(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
    if (ceil_mode && (o - 1) * s >= in + p) --o;
    return o;
  }
  int64_t oH() const { return out(H, kH, sH, pH, dH, ceil_mode); }
  int64_t oW() const { return out(W, kW, sW, pW, dW, ceil_mode); }
  Shape in() const { return {N, C, H, W}; }
  Shape outs() const { return {N, C, oH(), oW()}; }
  std::string str() const {
    return "in " + detail::shape_str(in()) + " kernel " + std::to_string(kH) + "x" +
           std::to_string(kW) + " stride " + std::to_string(sH) + "x" + std::to_string(sW) +
           " padding " + std::to_string(pH) + "x" + std::to_string(pW) + " dilation " +
           std::to_string(dH) + "x" + std::to_string(dW) + (ceil_mode ? " ceil" : "");
  }
};

Pool random_pool(bool dilate) {
  Pool p{};
  p.N = pick(1, 2);
  p.C = pick(1, 3);
  p.kH = pick(1, 4);
  p.kW = pick(1, 4);
  p.sH = pick(1, 3);
  p.sW = pick(1, 3);
  p.dH = dilate ? pick(1, 2) : 1;
  p.dW = dilate ? pick(1, 2) : 1;
  p.pH = pick(0, ((p.kH - 1) * p.dH + 1) / 2);
  p.pW = pick(0, ((p.kW - 1) * p.dW + 1) / 2);
  p.H = (p.kH - 1) * p.dH + 1 + pick(0, 5);
  p.W = (p.kW - 1) * p.dW + 1 + pick(0, 5);
  p.ceil_mode = pick(0, 1) == 1;
  return p;
}

// Distinct values, so the maximum of every window is unique (finite differences stay valid).
Tensor distinct(const Shape& shape, DType dt) {
  const int64_t n = detail::shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.1 * static_cast<double>(i) - 0.05 * n;
  std::shuffle(v.begin(), v.end(), rng());
  return from_vector(v, shape).to(dt);
}

TEST(MaxPool2d, MatchesReferenceWithIndices) {
  LazyGuard eager(false);
  for (int t = 0; t < 30; ++t) {
    const Pool p = random_pool(true);
    SCOPED_TRACE(p.str());
    for (DType dt : {kFloat32, kFloat64}) {
      const Tensor x = random_tensor(p.in(), dt);
      const auto xv = values(x);
      auto [y, idx] = max_pool2d_with_indices(x, {p.kH, p.kW}, {p.sH, p.sW}, {p.pH, p.pW},
                                              {p.dH, p.dW}, p.ceil_mode);
      std::vector<double> want, want_idx;
      for (int64_t nc = 0; nc < p.N * p.C; ++nc)
        for (int64_t oh = 0; oh < p.oH(); ++oh)
          for (int64_t ow = 0; ow < p.oW(); ++ow) {
            double best = -std::numeric_limits<double>::infinity();
            int64_t at = -1;
            for (int64_t i = 0; i < p.kH; ++i)
              for (int64_t j = 0; j < p.kW; ++j) {
                const int64_t h = oh * p.sH - p.pH + i * p.dH, w = ow * p.sW - p.pW + j * p.dW;
                if (h < 0 || h >= p.H || w < 0 || w >= p.W) continue;
                const double v = xv[nc * p.H * p.W + h * p.W + w];
                if (at < 0 || v > best) {
                  best = v;
                  at = h * p.W + w;
                }
              }
            want.push_back(best);
            want_idx.push_back(static_cast<double>(at));
          }
      expect_close(y, want, p.outs(), dt, 0, 0);
      expect_close(idx, want_idx, p.outs(), kInt64, 0, 0);
    }
  }
  // A NaN is the maximum of its window; equal values give the first position.
  const Tensor x = from_vector<double>({1, std::nan(""), 2, 2}, Shape{1, 1, 1, 4});
  auto [y, idx] = max_pool2d_with_indices(x, {1, 2}, {1, 2});
  EXPECT_TRUE(std::isnan(values(y)[0]));
  EXPECT_EQ(values(idx), std::vector<double>({1, 2}));
}

TEST(MaxPool2d, GradientsAndDoubleBackward) {
  for (int t = 0; t < 6; ++t) {
    const Pool p = random_pool(true);
    SCOPED_TRACE(p.str());
    const Tensor x = distinct(p.in(), kFloat64).requires_grad_();
    auto f = [&](const std::vector<Tensor>& in) {
      return max_pool2d(in[0], {p.kH, p.kW}, {p.sH, p.sW}, {p.pH, p.pW}, {p.dH, p.dW}, p.ceil_mode);
    };
    EXPECT_TRUE(testing::gradcheck(f, {x}));
    EXPECT_TRUE(testing::gradgradcheck(f, {x}));
  }
  // Overlapping windows that share a maximum add their gradients there.
  const Tensor x = from_vector<double>({0, 5, 1, 2}, Shape{1, 1, 1, 4}).requires_grad_();
  max_pool2d(x, {1, 2}, {1, 1}).sum().backward();
  EXPECT_EQ(values(x.grad()), std::vector<double>({0, 2, 0, 1}));
}

// torch's average windows: clipped to the padded input for the divisor when count_include_pad.
std::vector<double> ref_avg_pool(const Pool& p, const std::vector<double>& xv,
                                 bool count_include_pad) {
  std::vector<double> out;
  for (int64_t nc = 0; nc < p.N * p.C; ++nc)
    for (int64_t oh = 0; oh < p.oH(); ++oh)
      for (int64_t ow = 0; ow < p.oW(); ++ow) {
        const int64_t h0 = oh * p.sH - p.pH, w0 = ow * p.sW - p.pW;
        const int64_t h1 = std::min(h0 + p.kH, p.H + p.pH), w1 = std::min(w0 + p.kW, p.W + p.pW);
        double sum = 0;
        int64_t inside = 0;
        for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h1, p.H); ++h)
          for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w1, p.W); ++w, ++inside)
            sum += xv[nc * p.H * p.W + h * p.W + w];
        out.push_back(sum /
                      static_cast<double>(count_include_pad ? (h1 - h0) * (w1 - w0) : inside));
      }
  return out;
}

TEST(AvgPool2d, MatchesReferenceAndDifferentiates) {
  for (int t = 0; t < 30; ++t) {
    const Pool p = random_pool(false);
    for (bool include : {true, false}) {
      SCOPED_TRACE(p.str() + (include ? " count_include_pad" : ""));
      auto f = [&](const std::vector<Tensor>& in) {
        return avg_pool2d(in[0], {p.kH, p.kW}, {p.sH, p.sW}, {p.pH, p.pW}, p.ceil_mode, include);
      };
      for (DType dt : {kFloat32, kFloat64}) {
        LazyGuard eager(false);
        const Tensor x = random_tensor(p.in(), dt);
        expect_close(f({x}), ref_avg_pool(p, values(x), include), p.outs(), dt, 1e-5, 1e-6);
      }
      if (t < 4) {
        const Tensor x = random_tensor(p.in(), kFloat64).requires_grad_();
        EXPECT_TRUE(testing::gradcheck(f, {x}));
        EXPECT_TRUE(testing::gradgradcheck(f, {x}));
      }
    }
  }
}

TEST(AdaptiveAvgPool2d, MatchesReferenceAndDifferentiates) {
  LazyGuard eager(false);
  for (int t = 0; t < 20; ++t) {
    const int64_t H = pick(1, 9), W = pick(1, 9), oH = pick(1, 5), oW = pick(1, 5);
    const Tensor x = random_tensor({2, 3, H, W}, kFloat64);
    const auto xv = values(x);
    std::vector<double> want;
    for (int64_t nc = 0; nc < 6; ++nc)
      for (int64_t i = 0; i < oH; ++i)
        for (int64_t j = 0; j < oW; ++j) {
          const int64_t h0 = i * H / oH, h1 = ((i + 1) * H + oH - 1) / oH;
          const int64_t w0 = j * W / oW, w1 = ((j + 1) * W + oW - 1) / oW;
          double s = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += xv[nc * H * W + h * W + w];
          want.push_back(s / static_cast<double>((h1 - h0) * (w1 - w0)));
        }
    expect_close(adaptive_avg_pool2d(x, {oH, oW}), want, {2, 3, oH, oW}, kFloat64, 1e-12, 1e-12);
  }
  // Global average pooling is the mean over H and W; unbatched input works too.
  const Tensor x = random_tensor({3, 5, 7}, kFloat64);
  EXPECT_TRUE(allclose(adaptive_avg_pool2d(x, {1}).flatten(), mean(x, {1, 2}), 1e-12, 1e-12));
  const Tensor g = random_tensor({1, 2, 5, 7}, kFloat64).requires_grad_();
  auto f = [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {3, 2}); };
  EXPECT_TRUE(testing::gradcheck(f, {g}));
  EXPECT_TRUE(testing::gradgradcheck(f, {g}));
}

TEST(BatchNorm, TrainingUsesBatchStatisticsAndUpdatesRunningOnes) {
  LazyGuard eager(false);
  const int64_t N = 3, C = 4, H = 2, W = 5;
  const Tensor x = random_tensor({N, C, H, W}, kFloat64);
  const Tensor w = random_tensor({C}, kFloat64), b = random_tensor({C}, kFloat64);
  Tensor rm = random_tensor({C}, kFloat64), rv = random_tensor({C}, kFloat64, 0.5, 2.0);
  const auto rm0 = values(rm), rv0 = values(rv), xv = values(x), wv = values(w), bv = values(b);
  const double momentum = 0.3, eps = 1e-3;
  const Tensor y = batch_norm(x, rm, rv, w, b, true, momentum, eps);
  std::vector<double> want(xv.size()), want_rm(C), want_rv(C);
  const int64_t count = N * H * W;
  for (int64_t c = 0; c < C; ++c) {
    double s = 0, ss = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < H * W; ++k) s += xv[(n * C + c) * H * W + k];
    const double mu = s / count;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < H * W; ++k) ss += std::pow(xv[(n * C + c) * H * W + k] - mu, 2);
    const double var = ss / count;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < H * W; ++k) {
        const int64_t i = (n * C + c) * H * W + k;
        want[i] = (xv[i] - mu) / std::sqrt(var + eps) * wv[c] + bv[c];
      }
    want_rm[c] = (1 - momentum) * rm0[c] + momentum * mu;
    want_rv[c] = (1 - momentum) * rv0[c] + momentum * ss / (count - 1);
  }
  expect_close(y, want, x.sizes(), kFloat64, 1e-10, 1e-10);
  expect_close(rm, want_rm, {C}, kFloat64, 1e-12, 1e-12);
  expect_close(rv, want_rv, {C}, kFloat64, 1e-12, 1e-12);

  // Eval: the running statistics, which stay as they are.
  const Tensor e = batch_norm(x, rm, rv, w, b, false, momentum, eps);
  const auto rmv = values(rm), rvv = values(rv);
  std::vector<double> want_eval(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i) / (H * W) % C;
    want_eval[i] = (xv[i] - rmv[c]) / std::sqrt(rvv[c] + eps) * wv[c] + bv[c];
  }
  expect_close(e, want_eval, x.sizes(), kFloat64, 1e-10, 1e-10);
  EXPECT_EQ(values(rm), rmv);
}

TEST(BatchNorm, Gradients) {
  const Tensor x = random_tensor({3, 2, 2, 3}, kFloat64).requires_grad_();
  const Tensor w = random_tensor({2}, kFloat64).requires_grad_();
  const Tensor b = random_tensor({2}, kFloat64).requires_grad_();
  auto train = [](const std::vector<Tensor>& in) {
    return batch_norm(in[0], {}, {}, in[1], in[2], true, 0.1, 1e-5);
  };
  EXPECT_TRUE(testing::gradcheck(train, {x, w, b}));
  EXPECT_TRUE(testing::gradgradcheck(train, {x, w, b}));
  const Tensor rm = random_tensor({2}, kFloat64), rv = random_tensor({2}, kFloat64, 0.5, 2.0);
  auto eval = [&](const std::vector<Tensor>& in) {
    return batch_norm(in[0], rm, rv, in[1], in[2], false, 0.1, 1e-5);
  };
  EXPECT_TRUE(testing::gradcheck(eval, {x, w, b}));
  // 2-D [N, C] input (BatchNorm1d).
  const Tensor x2 = random_tensor({5, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, {}, {}, true); }, {x2}));
}

TEST(GroupNorm, MatchesReferenceAndDifferentiates) {
  LazyGuard eager(false);
  const int64_t N = 2, C = 6, G = 3, HW = 5;
  const Tensor x = random_tensor({N, C, HW}, kFloat64);
  const Tensor w = random_tensor({C}, kFloat64), b = random_tensor({C}, kFloat64);
  const auto xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> want(xv.size());
  const int64_t per = C / G * HW;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t base = (n * G + g) * per;
      double s = 0, ss = 0;
      for (int64_t k = 0; k < per; ++k) s += xv[base + k];
      const double mu = s / per;
      for (int64_t k = 0; k < per; ++k) ss += std::pow(xv[base + k] - mu, 2);
      for (int64_t k = 0; k < per; ++k) {
        const int64_t c = (base + k) / HW % C;
        want[base + k] = (xv[base + k] - mu) / std::sqrt(ss / per + 1e-5) * wv[c] + bv[c];
      }
    }
  expect_close(group_norm(x, G, w, b), want, x.sizes(), kFloat64, 1e-10, 1e-10);
  const Tensor xg = random_tensor({2, 4, 3}, kFloat64).requires_grad_();
  const Tensor wg = random_tensor({4}, kFloat64).requires_grad_();
  auto f = [](const std::vector<Tensor>& in) { return group_norm(in[0], 2, in[1]); };
  EXPECT_TRUE(testing::gradcheck(f, {xg, wg}));
  EXPECT_TRUE(testing::gradgradcheck(f, {xg, wg}));
}

TEST(PoolNorm, LazyEqualsEager) {
  const Tensor x = testing::input({2, 3, 7, 6});
  const Tensor w = testing::input({3}), b = testing::input({3});
  check_lazy("max_pool2d", [&] {
    auto [y, i] = max_pool2d_with_indices(x, {3}, {2}, {1}, {1}, true);
    return std::vector<Tensor>{y, i};
  });
  check_lazy("avg_pool2d", [&] {
    return std::vector<Tensor>{avg_pool2d(x, {2, 3}, {2}, {1}, false, false)};
  });
  check_lazy("adaptive_avg_pool2d", [&] {
    return std::vector<Tensor>{adaptive_avg_pool2d(x, {4, 3})};
  });
  check_lazy("group_norm", [&] { return std::vector<Tensor>{group_norm(x, 3, w, b)}; });
  check_lazy("batch_norm eval",
             [&] { return std::vector<Tensor>{batch_norm(x, w.abs(), b.abs() + 1, w, b, false)}; });
  // Gradients through the pools, lazily.
  check_lazy(
      "pool gradients",
      [&] {
        Tensor xr = x.detach().requires_grad_();
        Tensor loss = sum(max_pool2d(xr, {2}) * 2) + sum(avg_pool2d(xr, {3}, {1}, {1}));
        loss.backward();
        return std::vector<Tensor>{xr.grad()};
      },
      /*expect_pending=*/false);
}

TEST(PoolNorm, BadInputRaisesNamingTheOpAndShapes) {
  LazyGuard eager(false);
  const Tensor x = random_tensor({2, 3, 4, 4});
  const auto before = values(x);
  expect_error(
      [&] { max_pool2d(x, {5}); },
      {"max_pool2d", "kernel [5, 5]", "larger than the padded input", "float32[2, 3, 4, 4]"});
  expect_error([&] { max_pool2d(x, {2}, {}, {2}); },
               {"max_pool2d", "padding [2, 2]", "at most half", "float32[2, 3, 4, 4]"});
  expect_error([&] { max_pool2d(x.flatten(1), {2}); },
               {"max_pool2d", "3-D", "4-D", "float32[2, 48]"});
  expect_error([&] { avg_pool2d(x, {2, 2, 2}); }, {"avg_pool2d", "kernel_size", "[2, 2, 2]"});
  expect_error([&] { adaptive_avg_pool2d(x, {0}); }, {"adaptive_avg_pool2d", "output_size"});
  expect_error([&] { batch_norm(x, zeros({4}), ones({4}), {}, {}, false); },
               {"batch_norm", "running_mean of shape [3]", "float32[4]", "float32[2, 3, 4, 4]"});
  expect_error(
      [&] {
        batch_norm(random_tensor({1, 3}), {}, {}, {}, {}, true);
      },
      {"batch_norm", "more than 1 value per channel", "float32[1, 3]"});
  expect_error([&] { group_norm(x, 2); },
               {"group_norm", "divisible by num_groups (2)", "float32[2, 3, 4, 4]"});
  expect_error([&] { group_norm(x, 3, ones({4})); }, {"group_norm", "weight of shape [3]"});
  EXPECT_EQ(values(x), before);
}

}  // namespace
}  // namespace kiln
