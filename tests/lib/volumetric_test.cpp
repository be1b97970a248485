// The 3-D ops (conv3d through conv2d over gathered depth slices, lib/ops/conv.cpp; the 3-D pools
// composed of the 2-D ones, lib/ops/pool3d.cpp): each against a float64 reference loop over
// random geometries (strides, padding, dilation, groups, ceil mode, count_include_pad, adaptive
// windows larger and smaller than the input), gradients by gradcheck, lazy against eager, the
// modules, and errors that name the op.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "tests/lib/threads.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::pick;
using testing::values;

// The value at (n, c, d, h, w) of a [N, C, D, H, W] row-major buffer.
struct Volume {
  std::vector<double> v;
  Shape s;
  double at(int64_t n, int64_t c, int64_t d, int64_t h, int64_t w) const {
    return v[size_t((((n * s[1] + c) * s[2] + d) * s[3] + h) * s[4] + w)];
  }
};

TEST(Conv3d, MatchesTheReference) {
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t groups = pick(1, 2), n = pick(1, 2), cin = groups * pick(1, 2);
    const int64_t cout = groups * pick(1, 2);
    Shape k, st, pd, dl, in;
    for (int i = 0; i < 3; ++i) {
      k.push_back(pick(1, 3));
      st.push_back(pick(1, 2));
      dl.push_back(pick(1, 2));
      pd.push_back(pick(0, 1));
      in.push_back(pick(std::max<int64_t>(1, dl.back() * (k.back() - 1) + 1 - 2 * pd.back()), 5));
    }
    Tensor x = testing::input({n, cin, in[0], in[1], in[2]}, kFloat64);
    if (trial % 3 == 1) x = x.transpose(2, 4).contiguous().transpose(2, 4);  // not contiguous
    const Tensor w = testing::input({cout, cin / groups, k[0], k[1], k[2]}, kFloat64);
    const Tensor b = testing::input({cout}, kFloat64);
    Shape out{n, cout};
    for (int i = 0; i < 3; ++i)
      out.push_back((in[i] + 2 * pd[i] - dl[i] * (k[i] - 1) - 1) / st[i] + 1);
    const Volume X{values(x), x.sizes()};
    const std::vector<double> wv = values(w), bv = values(b);
    std::vector<double> want;
    const int64_t per_in = cin / groups, per_out = cout / groups;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t o = 0; o < cout; ++o)
        for (int64_t od = 0; od < out[2]; ++od)
          for (int64_t oh = 0; oh < out[3]; ++oh)
            for (int64_t ow = 0; ow < out[4]; ++ow) {
              double acc = bv[size_t(o)];
              for (int64_t c = 0; c < per_in; ++c)
                for (int64_t i = 0; i < k[0]; ++i)
                  for (int64_t j = 0; j < k[1]; ++j)
                    for (int64_t l = 0; l < k[2]; ++l) {
                      const int64_t d = od * st[0] - pd[0] + i * dl[0];
                      const int64_t h = oh * st[1] - pd[1] + j * dl[1];
                      const int64_t q = ow * st[2] - pd[2] + l * dl[2];
                      if (d < 0 || d >= in[0] || h < 0 || h >= in[1] || q < 0 || q >= in[2])
                        continue;
                      acc += X.at(s, o / per_out * per_in + c, d, h, q) *
                             wv[size_t((((o * per_in + c) * k[0] + i) * k[1] + j) * k[2] + l)];
                    }
              want.push_back(acc);
            }
    testing::expect_close(conv3d(x, w, b, st, pd, dl, groups), want, out, kFloat64, 1e-12, 1e-12);
  }
}

TEST(Conv3d, GradientsSamePaddingModulesAndErrors) {
  Tensor x = testing::input({1, 2, 3, 4, 3}, kFloat64).requires_grad_();
  Tensor w = testing::input({2, 1, 2, 2, 1}, kFloat64).requires_grad_();
  Tensor b = testing::input({2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv3d(in[0], in[1], in[2], {1, 2, 1}, {1, 0, 1}, {1}, 2);
      },
      {x, w, b}));
  // "same": the output keeps the input's size (an even kernel pads one more at the end).
  const Tensor x0 = testing::input({2, 3, 4, 5, 6});
  const Tensor w0 = testing::input({4, 3, 2, 3, 1});
  EXPECT_EQ(conv3d(x0, w0, {}, {1}, "same").sizes(), (Shape{2, 4, 4, 5, 6}));
  EXPECT_TRUE(allclose(conv3d(x0, w0, {}, {1}, "same"), conv3d(pad(x0, {0, 0, 1, 1, 0, 1}), w0),
                       1e-5, 1e-5));
  EXPECT_EQ(conv3d(x0[0], w0).sizes(), (Shape{4, 3, 3, 6}));  // unbatched
  testing::check_lazy("conv3d", [&] {
    Tensor xi = x.detach().clone().requires_grad_(), wi = w.detach().clone().requires_grad_();
    Tensor y = conv3d(xi * 2, wi, {}, {1}, {1}, {1}, 2);
    (y * y).sum().backward();
    return std::vector<Tensor>{y.detach(), xi.grad(), wi.grad()};
  });
  nn::Conv3d module(3, 4, {2, 3, 1}, {1}, {1});
  EXPECT_EQ(module.weight.sizes(), (Shape{4, 3, 2, 3, 1}));
  EXPECT_TRUE(equal(module.forward(x0), conv3d(x0, module.weight, module.bias, {1}, {1})));
  EXPECT_EQ(nn::Conv3d(3, 4, {3}, {1}, "same").forward(x0).sizes(), (Shape{2, 4, 4, 5, 6}));
  expect_error([&] { conv3d(x0, w0.narrow(1, 0, 2)); }, {"conv3d", "channels"});
  expect_error([&] { conv3d(x0, w0, {}, {1, 1}); }, {"conv3d", "stride"});
  expect_error(
      [&] {
        conv3d(x0.narrow(2, 0, 1), testing::input({4, 3, 2, 1, 1}));
      },
      {"conv3d", "does not fit"});
  expect_error([&] { conv3d(x0, w0.flatten(3)); }, {"conv3d", "weight"});
  expect_error([&] { nn::Conv3d(3, 4, {2, 2}); }, {"Conv3d", "kernel_size"});
}

// ---------------------------------------------------------------------------------- the pools

struct PoolCase {
  Shape k, s, p, d;
  bool ceil, include_pad;
};

// torch's output size along one dim.
int64_t pool_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (span + (ceil ? s - 1 : 0)) / s + 1;
  if (ceil && (out - 1) * s >= in + p) --out;
  return out;
}

TEST(Pool3d, MaxAndAverageMatchTheReference) {
  for (int trial = 0; trial < 40; ++trial) {
    PoolCase c;
    Shape in;
    for (int i = 0; i < 3; ++i) {
      c.k.push_back(pick(1, 3));
      c.s.push_back(pick(1, 3));
      c.d.push_back(pick(1, 2));
      in.push_back(pick(c.d.back() * (c.k.back() - 1) + 1, 6));
      c.p.push_back(pick(0, c.k.back() / 2));
    }
    c.ceil = trial % 2, c.include_pad = trial % 3 != 0;
    const int64_t n = pick(1, 2), ch = pick(1, 2);
    Tensor x = testing::input({n, ch, in[0], in[1], in[2]}, kFloat64);
    if (trial == 7) x.view({-1}).narrow(0, 3, 1).fill_(std::nan(""));  // a NaN wins its windows
    const Volume X{values(x), x.sizes()};
    Shape out{n, ch}, avg_out{n, ch};
    for (int i = 0; i < 3; ++i) {
      out.push_back(pool_size(in[i], c.k[i], c.s[i], c.p[i], c.d[i], c.ceil));
      avg_out.push_back(pool_size(in[i], c.k[i], c.s[i], c.p[i], 1, c.ceil));
    }
    std::vector<double> want_max, want_idx, want_avg;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t q = 0; q < ch; ++q) {
        for (int64_t od = 0; od < out[2]; ++od)
          for (int64_t oh = 0; oh < out[3]; ++oh)
            for (int64_t ow = 0; ow < out[4]; ++ow) {
              double best = -INFINITY;
              int64_t at = -1;
              for (int64_t i = 0; i < c.k[0]; ++i)
                for (int64_t j = 0; j < c.k[1]; ++j)
                  for (int64_t l = 0; l < c.k[2]; ++l) {
                    const int64_t d = od * c.s[0] - c.p[0] + i * c.d[0];
                    const int64_t h = oh * c.s[1] - c.p[1] + j * c.d[1];
                    const int64_t w = ow * c.s[2] - c.p[2] + l * c.d[2];
                    if (d < 0 || d >= in[0] || h < 0 || h >= in[1] || w < 0 || w >= in[2]) continue;
                    const double v = X.at(s, q, d, h, w);
                    if (at < 0 || v > best || std::isnan(v)) {
                      if (!std::isnan(best) || at < 0) best = v, at = (d * in[1] + h) * in[2] + w;
                    }
                  }
              want_max.push_back(best);
              want_idx.push_back(double(at));
            }
        for (int64_t od = 0; od < avg_out[2]; ++od)
          for (int64_t oh = 0; oh < avg_out[3]; ++oh)
            for (int64_t ow = 0; ow < avg_out[4]; ++ow) {
              const int64_t o[3] = {od, oh, ow};
              int64_t lo[3], hi[3], divisor = 1;
              for (int i = 0; i < 3; ++i) {
                const int64_t start = o[i] * c.s[i] - c.p[i];
                const int64_t end = std::min(start + c.k[i], in[size_t(i)] + c.p[i]);
                lo[i] = std::max<int64_t>(start, 0), hi[i] = std::min(end, in[size_t(i)]);
                divisor *= c.include_pad ? end - start : hi[i] - lo[i];
              }
              double sum = 0;
              for (int64_t d = lo[0]; d < hi[0]; ++d)
                for (int64_t h = lo[1]; h < hi[1]; ++h)
                  for (int64_t w = lo[2]; w < hi[2]; ++w) sum += X.at(s, q, d, h, w);
              want_avg.push_back(sum / double(divisor));
            }
      }
    SCOPED_TRACE("trial " + std::to_string(trial));
    auto [mx, idx] = max_pool3d_with_indices(x, c.k, c.s, c.p, c.d, c.ceil);
    testing::expect_close(mx, want_max, out, kFloat64, 0, 0);
    if (trial != 7) testing::expect_close(idx, want_idx, out, kInt64, 0, 0);
    testing::expect_close(avg_pool3d(x, c.k, c.s, c.p, c.ceil, c.include_pad), want_avg, avg_out,
                          kFloat64, 1e-12, 1e-12);
  }
}

TEST(Pool3d, AdaptiveMatchTheReference) {
  for (int trial = 0; trial < 20; ++trial) {
    const Shape in{pick(1, 5), pick(1, 5), pick(1, 5)}, o{pick(1, 6), pick(1, 6), pick(1, 6)};
    const Tensor x = testing::input({1, 2, in[0], in[1], in[2]}, kFloat64);
    const Volume X{values(x), x.sizes()};
    std::vector<double> want_avg, want_max;
    for (int64_t q = 0; q < 2; ++q)
      for (int64_t od = 0; od < o[0]; ++od)
        for (int64_t oh = 0; oh < o[1]; ++oh)
          for (int64_t ow = 0; ow < o[2]; ++ow) {
            const int64_t oo[3] = {od, oh, ow};
            int64_t lo[3], hi[3];
            for (int i = 0; i < 3; ++i) {
              lo[i] = oo[i] * in[size_t(i)] / o[size_t(i)];
              hi[i] = ((oo[i] + 1) * in[size_t(i)] + o[size_t(i)] - 1) / o[size_t(i)];
            }
            double sum = 0, best = -INFINITY;
            for (int64_t d = lo[0]; d < hi[0]; ++d)
              for (int64_t h = lo[1]; h < hi[1]; ++h)
                for (int64_t w = lo[2]; w < hi[2]; ++w) {
                  sum += X.at(0, q, d, h, w);
                  best = std::max(best, X.at(0, q, d, h, w));
                }
            want_avg.push_back(sum / double((hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2])));
            want_max.push_back(best);
          }
    const Shape out{1, 2, o[0], o[1], o[2]};
    testing::expect_close(adaptive_avg_pool3d(x, o), want_avg, out, kFloat64, 1e-12, 1e-12);
    testing::expect_close(adaptive_max_pool3d(x, o), want_max, out, kFloat64, 0, 0);
  }
}

TEST(Pool3d, GradientsLazyModulesAndErrors) {
  Tensor x = testing::input({1, 2, 4, 3, 5}, kFloat64).requires_grad_();
  auto check = [&](const char* what, const std::function<Tensor(const Tensor&)>& f) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(testing::gradcheck([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x}));
  };
  check("max_pool3d", [](const Tensor& t) { return max_pool3d(t, {2}, {1, 2, 2}, {1}); });
  check("avg_pool3d", [](const Tensor& t) {
    return avg_pool3d(t, {2, 3, 2}, {2}, {1}, true, false);
  });
  check("adaptive_avg_pool3d", [](const Tensor& t) { return adaptive_avg_pool3d(t, {3, 2, 4}); });
  check("adaptive_max_pool3d", [](const Tensor& t) { return adaptive_max_pool3d(t, {2, 2, 3}); });
  testing::check_lazy("3-D pools", [&] {
    Tensor xi = x.detach().clone().requires_grad_();
    Tensor y = max_pool3d(xi * 2, {2}, {1}, {1}).sum() + avg_pool3d(xi, {3}, {2}, {1}, true).sum() +
               adaptive_avg_pool3d(xi, {2}).sum() + adaptive_max_pool3d(xi, {3}).sum();
    y.backward();
    return std::vector<Tensor>{y.detach(), xi.grad()};
  });
  // A window of -inf values keeps its first position inside the input, as torch's scan.
  const Tensor lowest = full({1, 1, 2, 1, 1}, -INFINITY, kFloat64);
  auto [v, i] = max_pool3d_with_indices(lowest, {2, 1, 1}, {1}, {1, 0, 0});
  EXPECT_EQ(values(i), (std::vector<double>{0, 0, 1}));
  // The gradient goes to the element the index names: the first maximum in (d, h, w) order, the
  // -inf ones beside padding too.
  Tensor ties =
      from_vector<double>({1, 5, 5, 0, 5, 2, -INFINITY, 5}, {1, 1, 2, 2, 2}).requires_grad_();
  max_pool3d(ties, {2}).sum().backward();
  EXPECT_EQ(values(ties.grad()), (std::vector<double>{0, 1, 0, 0, 0, 0, 0, 0}));
  Tensor edge = from_vector<double>({-INFINITY, -2}, {1, 1, 1, 1, 2}).requires_grad_();
  max_pool3d(edge, {2, 1, 1}, {1}, {1, 0, 0}).sum().backward();
  EXPECT_EQ(values(edge.grad()), (std::vector<double>{2, 2}));
  Tensor adaptive = ties.detach().clone().requires_grad_();
  adaptive_max_pool3d(adaptive, {1}).sum().backward();
  EXPECT_EQ(values(adaptive.grad()), (std::vector<double>{0, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_TRUE(equal(nn::MaxPool3d({2}).forward(x), max_pool3d(x, {2})));
  EXPECT_TRUE(equal(nn::AvgPool3d({2}, {1}).forward(x), avg_pool3d(x, {2}, {1})));
  EXPECT_TRUE(equal(nn::AdaptiveAvgPool3d({1}).forward(x), adaptive_avg_pool3d(x, {1})));
  EXPECT_TRUE(
      equal(nn::AdaptiveMaxPool3d({2, 1, 1}).forward(x), adaptive_max_pool3d(x, {2, 1, 1})));
  EXPECT_EQ(max_pool3d(x[0], {2}).sizes(), (Shape{2, 2, 1, 2}));  // unbatched
  nn::BatchNorm3d norm(2);
  const Tensor y = norm.forward(x.detach());
  EXPECT_TRUE(
      allclose(y, batch_norm(x.detach(), {}, {}, norm.weight, norm.bias, true), 1e-12, 1e-12));
  EXPECT_EQ(values(norm.num_batches_tracked), std::vector<double>{1});
  expect_error([&] { norm.forward(x.detach()[0]); }, {"BatchNorm3d", "5-D"});
  expect_error([&] { max_pool3d(x, {2, 2}); }, {"max_pool3d", "kernel_size"});
  expect_error([&] { max_pool3d(x, {3}, {1}, {2}); }, {"max_pool3d", "padding"});
  expect_error([&] { avg_pool3d(x, {4}); }, {"avg_pool3d", "larger than"});
  expect_error([&] { adaptive_avg_pool3d(x, {0}); }, {"adaptive_avg_pool3d", "output_size"});
  expect_error([&] { adaptive_max_pool3d(x.flatten(2), {1}); }, {"adaptive_max_pool3d", "5-D"});
}

// Four threads running the 3-D ops at once (with gradients) get one thread's results.
TEST(VolumetricThreads, ConcurrentCallsMatchOneThread) {
  const Tensor x0 = testing::input({2, 2, 4, 4, 3}, kFloat64);
  const Tensor w0 = testing::input({3, 2, 2, 2, 2}, kFloat64);
  testing::expect_concurrent_runs_match(
      [&] {
        Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
        const Tensor y = conv3d(x, w, {}, {1}, {1});
        Tensor z = max_pool3d(y, {2}).sum() + avg_pool3d(y, {2}, {1}).sum() +
                   adaptive_max_pool3d(y, {2}).sum();
        z.backward();
        return std::vector<Tensor>{z.detach(), x.grad(), w.grad()};
      },
      4, 3);
}

}  // namespace
}  // namespace kiln
