// Adaptive max pooling, instance and local response normalization, conv_transpose1d,
// multi_margin_loss, affine_grid/grid_sample and embedding_bag: each against a float64 reference
// loop written from torch's definition over random shapes (sizes 0 and 1, outputs larger than
// inputs, empty bags), gradients by gradcheck, lazy against eager, the modules, and errors that
// name the op.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
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

// ------------------------------------------------------------------------- adaptive max pooling

// The reference over [planes, h, w] planes: values and flat indices of each window's first maximum.
void adaptive_max_reference(const std::vector<double>& x, int64_t planes, int64_t h, int64_t w,
                            int64_t oh, int64_t ow, std::vector<double>& best,
                            std::vector<double>& at) {
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t h0 = i * h / oh, h1 = ((i + 1) * h + oh - 1) / oh;
        const int64_t w0 = j * w / ow, w1 = ((j + 1) * w + ow - 1) / ow;
        double b = -std::numeric_limits<double>::infinity();
        int64_t a = -1;
        for (int64_t r = h0; r < h1; ++r)
          for (int64_t c = w0; c < w1; ++c) {
            const double v = x[size_t(p * h * w + r * w + c)];
            if (a < 0 || v > b || std::isnan(v)) b = v, a = r * w + c;
          }
        best.push_back(b);
        at.push_back(double(a));
      }
}

TEST(AdaptiveMaxPool, MatchesTheReferenceWithIndices) {
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t n = pick(0, 2), c = pick(1, 3), h = pick(1, 9), w = pick(1, 9);
    const int64_t oh = pick(1, 11), ow = pick(1, 11);
    Tensor x = testing::input({n, c, h, w}, kFloat64);
    if (trial % 4 == 1) x = x.transpose(2, 3).contiguous().transpose(2, 3);  // not contiguous
    std::vector<double> best, at;
    adaptive_max_reference(values(x), n * c, h, w, oh, ow, best, at);
    auto [v, i] = adaptive_max_pool2d_with_indices(x, {oh, ow});
    testing::expect_close(v, best, {n, c, oh, ow}, kFloat64, 0, 0);
    testing::expect_close(i, at, {n, c, oh, ow}, kInt64, 0, 0);
    // 1-D: one row per plane, positions along L.
    best.clear(), at.clear();
    const Tensor line = x.flatten(2);
    adaptive_max_reference(values(line), n * c, 1, h * w, 1, ow, best, at);
    auto [v1, i1] = adaptive_max_pool1d_with_indices(line, {ow});
    testing::expect_close(v1, best, {n, c, ow}, kFloat64, 0, 0);
    testing::expect_close(i1, at, {n, c, ow}, kInt64, 0, 0);
  }
  // A NaN is the maximum of its window, as torch's.
  const Tensor x = from_vector<double>({1, NAN, 3, 2}, {1, 1, 4});
  EXPECT_TRUE(std::isnan(values(adaptive_max_pool1d(x, {2}))[0]));
  EXPECT_EQ(values(adaptive_max_pool1d(x, {2})).back(), 3.0);
}

TEST(AdaptiveMaxPool, GradientsLazyModulesAndErrors) {
  Tensor x = testing::input({2, 2, 5, 7}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        return adaptive_max_pool2d(in[0], {3, 4});
      },
      {x}));
  EXPECT_TRUE(testing::gradgradcheck(
      [](const std::vector<Tensor>& in) { return adaptive_max_pool2d(in[0], {2}); }, {x}));
  Tensor line = testing::input({3, 8}, kFloat64).requires_grad_();  // unbatched
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return adaptive_max_pool1d(in[0], {3}); }, {line}));
  testing::check_lazy("adaptive_max_pool2d", [&] {
    Tensor xi = x.detach().clone().requires_grad_();
    Tensor y = adaptive_max_pool2d(xi * 2, {3, 2});
    (y * y).sum().backward();
    return std::vector<Tensor>{y.detach(), xi.grad()};
  });
  EXPECT_TRUE(equal(nn::AdaptiveMaxPool2d({2, 3}).forward(x), adaptive_max_pool2d(x, {2, 3})));
  EXPECT_TRUE(equal(nn::AdaptiveMaxPool1d({4}).forward(line), adaptive_max_pool1d(line, {4})));
  EXPECT_EQ(adaptive_max_pool2d(x[0], {3}).sizes(), (Shape{2, 3, 3}));
  expect_error([&] { adaptive_max_pool2d(x, {0, 2}); }, {"adaptive_max_pool2d", "output_size"});
  expect_error([&] { adaptive_max_pool2d(x.flatten(), {2}); }, {"adaptive_max_pool2d", "4-D"});
  expect_error([&] { adaptive_max_pool1d(line, {2, 2}); }, {"adaptive_max_pool1d", "one value"});
  expect_error(
      [&] {
        adaptive_max_pool2d(zeros({1, 1, 0, 3}), {2});
      },
      {"adaptive_max_pool2d", "non-empty"});
}

// ------------------------------------------------------------------------------- instance norm

TEST(InstanceNorm, NormalizesEachSampleAndChannelAndTracksStatistics) {
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = pick(1, 3), c = pick(1, 4), l = pick(2, 6), m = pick(1, 3);
    const Tensor x = testing::input({n, c, l, m}, kFloat64);
    const Tensor weight = testing::input({c}, kFloat64), bias = testing::input({c}, kFloat64);
    Tensor running_mean = testing::input({c}, kFloat64),
           running_var = testing::input({c}, kFloat64, 0.5, 2);
    const std::vector<double> rm0 = values(running_mean), rv0 = values(running_var);
    const double momentum = 0.3, eps = 1e-3;
    const Tensor y = instance_norm(x, running_mean, running_var, weight, bias, true, momentum, eps);
    const std::vector<double> xv = values(x), wv = values(weight), bv = values(bias);
    std::vector<double> want, mean_of(static_cast<size_t>(c)), var_of(static_cast<size_t>(c));
    const int64_t count = l * m;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch) {
        const double* p = xv.data() + (s * c + ch) * count;
        double mean = 0, var = 0;
        for (int64_t k = 0; k < count; ++k) mean += p[k] / double(count);
        for (int64_t k = 0; k < count; ++k) var += (p[k] - mean) * (p[k] - mean) / double(count);
        for (int64_t k = 0; k < count; ++k)
          want.push_back((p[k] - mean) / std::sqrt(var + eps) * wv[size_t(ch)] + bv[size_t(ch)]);
        mean_of[size_t(ch)] += mean / double(n);
        var_of[size_t(ch)] += var * double(count) / double(count - 1) / double(n);
      }
    testing::expect_close(y, want, x.sizes(), kFloat64, 1e-10, 1e-10);
    std::vector<double> want_rm, want_rv;
    for (int64_t ch = 0; ch < c; ++ch) {
      want_rm.push_back((1 - momentum) * rm0[size_t(ch)] + momentum * mean_of[size_t(ch)]);
      want_rv.push_back((1 - momentum) * rv0[size_t(ch)] + momentum * var_of[size_t(ch)]);
    }
    testing::expect_close(running_mean, want_rm, {c}, kFloat64, 1e-12, 1e-12);
    testing::expect_close(running_var, want_rv, {c}, kFloat64, 1e-12, 1e-12);
    // Eval: the running statistics normalize, and stay as they are.
    const Tensor z = instance_norm(x, running_mean, running_var, {}, {}, false);
    std::vector<double> want_z;
    const std::vector<double> rm = values(running_mean), rv = values(running_var);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t k = 0; k < count; ++k)
          want_z.push_back((xv[size_t((s * c + ch) * count + k)] - rm[size_t(ch)]) /
                           std::sqrt(rv[size_t(ch)] + 1e-5));
    testing::expect_close(z, want_z, x.sizes(), kFloat64, 1e-12, 1e-12);
    EXPECT_EQ(values(running_mean), rm);
  }
}

TEST(InstanceNorm, GradientsModulesAndErrors) {
  Tensor x = testing::input({2, 3, 5}, kFloat64).requires_grad_();
  Tensor w = testing::input({3}, kFloat64).requires_grad_();
  Tensor b = testing::input({3}, kFloat64).requires_grad_();
  auto f = [](const std::vector<Tensor>& in) {
    return instance_norm(in[0], {}, {}, in[1], in[2], true, 0.1, 1e-3);
  };
  EXPECT_TRUE(testing::gradcheck(f, {x, w, b}));
  EXPECT_TRUE(testing::gradgradcheck(f, {x, w, b}));
  // The module: unbatched input, no parameters by default, the running statistics in eval.
  nn::InstanceNorm1d plain(3);
  EXPECT_TRUE(plain.parameters().empty());
  EXPECT_TRUE(allclose(plain.forward(x[0]), instance_norm(x.detach()[0].unsqueeze(0))[0], 0, 0));
  nn::InstanceNorm2d tracked(3, 1e-5, 0.1, true, true);
  EXPECT_EQ(tracked.parameters().size(), 2u);
  const Tensor image = testing::input({2, 3, 4, 4}, kFloat64).to(kFloat32);
  tracked.forward(image);
  EXPECT_EQ(values(tracked.num_batches_tracked), std::vector<double>{1});
  EXPECT_FALSE(equal(tracked.running_mean, zeros({3})));
  tracked.eval();
  EXPECT_TRUE(allclose(tracked.forward(image),
                       instance_norm(image, tracked.running_mean, tracked.running_var,
                                     tracked.weight, tracked.bias, false),
                       0, 0));
  EXPECT_EQ(nn::InstanceNorm3d(2).forward(testing::input({2, 2, 3, 2, 2})).sizes(),
            (Shape{2, 2, 3, 2, 2}));
  // float32 values whose products with the gradient overflow: eager's backward sums in double,
  // as the recorded kernel's.
  const Tensor big = from_vector<float>({1.2f, 3.4e38f, -2.0f, 0.5f, 1.5f, -1.0f}, {1, 2, 3});
  testing::check_lazy("instance_norm of float32 values near the largest", [&] {
    Tensor xi = big.clone().requires_grad_();
    Tensor y = instance_norm(xi * 1.0f);
    (y * 3.0f).sum().backward();
    return std::vector<Tensor>{y.detach(), xi.grad()};
  });
  expect_error([&] { instance_norm(ones({2, 3, 1})); }, {"instance_norm", "more than 1 spatial"});
  expect_error(
      [&] {
        instance_norm(ones({2, 3, 4}), {}, {}, {}, {}, false);
      },
      {"instance_norm", "use_input_stats"});
  expect_error(
      [&] {
        instance_norm(ones({2, 3, 4}), {}, {}, ones({4}));
      },
      {"instance_norm", "weight"});
  expect_error([&] { tracked.forward(ones({2, 4, 3, 3})); }, {"InstanceNorm2d", "num_features"});
  expect_error([&] { plain.forward(ones({2, 3, 4, 4})); }, {"InstanceNorm1d", "3-D (batched)"});
}

// ------------------------------------------------------------------------ local response norm

TEST(LocalResponseNorm, MatchesTheReferenceAndDifferentiates) {
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = pick(0, 2), c = pick(1, 6), l = pick(1, 4), size = pick(1, 5);
    const Tensor x = testing::input({n, c, l, 2}, kFloat64);
    const double alpha = 0.5, beta = 0.75, k = 2.0;
    const std::vector<double> xv = values(x);
    std::vector<double> want;
    const int64_t plane = l * 2;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t e = 0; e < plane; ++e) {
          double sum = 0;  // channels ch - size / 2 .. ch + (size - 1) / 2, zero outside
          for (int64_t j = ch - size / 2; j <= ch + (size - 1) / 2; ++j)
            if (j >= 0 && j < c) sum += std::pow(xv[size_t((s * c + j) * plane + e)], 2);
          want.push_back(xv[size_t((s * c + ch) * plane + e)] /
                         std::pow(k + alpha * sum / double(size), beta));
        }
    testing::expect_close(local_response_norm(x, size, alpha, beta, k), want, x.sizes(), kFloat64,
                          1e-12, 1e-12);
  }
  Tensor x = testing::input({2, 5, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return local_response_norm(in[0], 3, 0.1, 0.75, 1.0); },
      {x}));
  EXPECT_TRUE(equal(nn::LocalResponseNorm(2).forward(x), local_response_norm(x, 2)));
  expect_error([&] { local_response_norm(ones({2, 3}), 2); }, {"local_response_norm", "3 or more"});
  expect_error([&] { local_response_norm(x, 0); }, {"local_response_norm", "size"});
}

// ---------------------------------------------------------------------------- conv_transpose1d

TEST(ConvTranspose1d, MatchesTheReferenceAndDifferentiates) {
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t groups = pick(1, 2), n = pick(1, 2), l = pick(1, 6), k = pick(1, 3);
    const int64_t cin = groups * pick(1, 2), cout_per = pick(1, 2), s = pick(1, 3), d = pick(1, 2);
    const int64_t p = pick(0, 1), op = pick(0, s - 1);
    const int64_t out = (l - 1) * s - 2 * p + d * (k - 1) + op + 1;
    if (out <= 0) continue;
    const Tensor x = testing::input({n, cin, l}, kFloat64);
    const Tensor w = testing::input({cin, cout_per, k}, kFloat64);
    const Tensor b = testing::input({cout_per * groups}, kFloat64);
    const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
    const int64_t cout = cout_per * groups, in_per = cin / groups;
    std::vector<double> want(size_t(n * cout * out));
    for (int64_t s0 = 0; s0 < n; ++s0)
      for (int64_t o = 0; o < cout; ++o)
        for (int64_t t = 0; t < out; ++t) want[size_t((s0 * cout + o) * out + t)] = bv[size_t(o)];
    for (int64_t s0 = 0; s0 < n; ++s0)
      for (int64_t ci = 0; ci < cin; ++ci)
        for (int64_t oc = 0; oc < cout_per; ++oc)
          for (int64_t i = 0; i < l; ++i)
            for (int64_t j = 0; j < k; ++j) {
              const int64_t t = i * s - p + j * d, o = ci / in_per * cout_per + oc;
              if (t >= 0 && t < out)
                want[size_t((s0 * cout + o) * out + t)] +=
                    xv[size_t((s0 * cin + ci) * l + i)] * wv[size_t((ci * cout_per + oc) * k + j)];
            }
    testing::expect_close(conv_transpose1d(x, w, b, {s}, {p}, {op}, groups, {d}), want,
                          {n, cout, out}, kFloat64, 1e-12, 1e-12);
  }
  Tensor x = testing::input({2, 4}, kFloat64).requires_grad_();  // unbatched
  Tensor w = testing::input({2, 3, 2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return conv_transpose1d(in[0], in[1], {}, {2}, {1}); },
      {x, w}));
  nn::ConvTranspose1d module(2, 3, 3, 2, 1, 1);
  EXPECT_EQ(module.weight.sizes(), (Shape{2, 3, 3}));
  EXPECT_TRUE(
      equal(module.forward(x.detach().to(kFloat32)),
            conv_transpose1d(x.detach().to(kFloat32), module.weight, module.bias, {2}, {1}, {1})));
  expect_error([&] { conv_transpose1d(x, w, {}, {2}, {0}, {2}); },
               {"conv_transpose1d", "output_padding"});
  expect_error([&] { conv_transpose1d(x, w.unsqueeze(0)); }, {"conv_transpose1d", "3-D weight"});
  expect_error([&] { conv_transpose1d(x, w, {}, {1, 1}); }, {"conv_transpose1d", "stride"});
}

// --------------------------------------------------------------------------- multi_margin_loss

TEST(MultiMarginLoss, MatchesTheReferenceAndDifferentiates) {
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t n = pick(0, 4), c = pick(1, 5), p = pick(1, 2);
    const double margin = trial % 3 == 0 ? 0.5 : 1.0;
    const Tensor x = testing::input({n, c}, kFloat64);
    const Tensor y = randint(0, c, {n});
    const Tensor weight = trial % 2 ? testing::input({c}, kFloat64, 0.1, 2) : Tensor();
    const std::vector<double> xv = values(x), yv = values(y);
    const std::vector<double> wv =
        weight.defined() ? values(weight) : std::vector<double>(size_t(c), 1);
    std::vector<double> want;
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = int64_t(yv[size_t(i)]);
      double sum = 0;
      for (int64_t j = 0; j < c; ++j) {
        const double z = margin - xv[size_t(i * c + t)] + xv[size_t(i * c + j)];
        if (j != t && z > 0) sum += (p == 1 ? z : z * z) * wv[size_t(t)];
      }
      want.push_back(sum / double(c));
      total += sum / double(c);
    }
    testing::expect_close(multi_margin_loss(x, y, p, margin, weight, Reduction::None), want, {n},
                          kFloat64, 1e-12, 1e-12);
    testing::expect_close(multi_margin_loss(x, y, p, margin, weight, Reduction::Sum), {total}, {},
                          kFloat64, 1e-12, 1e-12);
    if (n > 0)
      testing::expect_close(multi_margin_loss(x, y, p, margin, weight), {total / double(n)}, {},
                            kFloat64, 1e-12, 1e-12);
  }
  Tensor x = testing::input({3, 4}, kFloat64).requires_grad_();
  const Tensor y = from_vector<int64_t>({0, 3, 1}, {3});
  for (int64_t p : {1, 2})
    EXPECT_TRUE(testing::gradcheck(
        [&](const std::vector<Tensor>& in) { return multi_margin_loss(in[0], y, p, 0.7); }, {x}));
  // One sample: a [C] input with a 0-D target.
  EXPECT_EQ(multi_margin_loss(x[0], y[0], 1, 1.0, {}, Reduction::None).dim(), 0);
  nn::MultiMarginLoss module(nn::MultiMarginLossOptions().p(2).margin(0.5));
  EXPECT_TRUE(equal(module(x, y), multi_margin_loss(x, y, 2, 0.5)));
  expect_error(
      [&] {
        multi_margin_loss(x, from_vector<int64_t>({0, 4, 1}, {3}));
      },
      {"multi_margin_loss", "outside [0, 4)"});
  expect_error([&] { multi_margin_loss(x, y, 3); }, {"multi_margin_loss", "p == 1"});
  expect_error([&] { multi_margin_loss(x, y.narrow(0, 0, 2)); }, {"multi_margin_loss", "target"});
  expect_error([&] { multi_margin_loss(x, y, 1, 1.0, ones({3}, kFloat64)); },
               {"multi_margin_loss", "weight"});
}

// ------------------------------------------------------------------ affine_grid and grid_sample

// torch's grid sampler for one coordinate: unnormalized, then clipped or reflected and clipped.
double source_reference(double c, int64_t size, const std::string& padding, bool align) {
  double x = align ? (c + 1) / 2 * double(size - 1) : ((c + 1) * double(size) - 1) / 2;
  auto clip = [&](double v) { return std::min(double(size - 1), std::max(v, 0.0)); };
  if (padding == "border") return clip(x);
  if (padding == "reflection") {
    const double twice_low = align ? 0 : -1,
                 twice_high = align ? 2.0 * double(size - 1) : 2.0 * double(size) - 1;
    if (twice_low == twice_high) return 0;
    const double low = twice_low / 2, span = (twice_high - twice_low) / 2;
    x = std::fabs(x - low);
    const double extra = std::fmod(x, span);
    const int64_t flips = int64_t(std::floor(x / span));
    return clip(flips % 2 == 0 ? extra + low : span - extra + low);
  }
  return x;
}

std::vector<double> grid_sample_reference(const Tensor& input, const Tensor& grid,
                                          const std::string& mode, const std::string& padding,
                                          bool align) {
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t oh = grid.size(1), ow = grid.size(2);
  const std::vector<double> xv = values(input), gv = values(grid);
  std::vector<double> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < oh * ow; ++p) {
        const double x = source_reference(gv[size_t((n * oh * ow + p) * 2)], W, padding, align);
        const double y = source_reference(gv[size_t((n * oh * ow + p) * 2 + 1)], H, padding, align);
        auto pixel = [&](double px, double py) {
          if (!(px >= 0 && px <= double(W - 1) && py >= 0 && py <= double(H - 1))) return 0.0;
          return xv[size_t(((n * C + c) * H + int64_t(py)) * W + int64_t(px))];
        };
        if (mode == "nearest") {
          out.push_back(pixel(std::nearbyint(x), std::nearbyint(y)));
          continue;
        }
        const double x0 = std::floor(x), y0 = std::floor(y);
        out.push_back(pixel(x0, y0) * (x0 + 1 - x) * (y0 + 1 - y) +
                      pixel(x0 + 1, y0) * (x - x0) * (y0 + 1 - y) +
                      pixel(x0, y0 + 1) * (x0 + 1 - x) * (y - y0) +
                      pixel(x0 + 1, y0 + 1) * (x - x0) * (y - y0));
      }
  return out;
}

TEST(GridSample, MatchesTheReferenceInEveryMode) {
  for (int trial = 0; trial < 48; ++trial) {
    const std::string mode = trial % 2 ? "nearest" : "bilinear";
    const std::string padding =
        std::vector<std::string>{"zeros", "border", "reflection"}[size_t(trial / 2 % 3)];
    const bool align = trial / 6 % 2;
    const int64_t n = pick(0, 2), c = pick(1, 3), h = pick(1, 5), w = pick(1, 5);
    const Tensor input = testing::input({n, c, h, w}, kFloat64);
    const Tensor grid = testing::input({n, pick(0, 4), pick(1, 4), 2}, kFloat64, -2.5, 2.5);
    SCOPED_TRACE(mode + " " + padding + (align ? " align_corners" : ""));
    testing::expect_close(grid_sample(input, grid, mode, padding, align),
                          grid_sample_reference(input, grid, mode, padding, align),
                          {n, c, grid.size(1), grid.size(2)}, kFloat64, 1e-12, 1e-12);
  }
  // float32; a NaN grid point samples NaN bilinearly and zero with "nearest" (zeros padding).
  const Tensor input = testing::input({1, 2, 3, 4});
  const Tensor grid = from_vector<float>({NAN, 0.2f, 0.3f, -0.4f}, {1, 1, 2, 2});
  const std::vector<double> got = values(grid_sample(input, grid));
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_NEAR(got[1], grid_sample_reference(input, grid, "bilinear", "zeros", false)[1], 1e-6);
  EXPECT_EQ(values(grid_sample(input, grid, "nearest"))[0], 0.0);
}

TEST(GridSample, AffineGridAndIdentitySampling) {
  const Tensor theta = testing::input({2, 2, 3}, kFloat64);
  for (bool align : {false, true}) {
    const Tensor grid = affine_grid(theta, {2, 5, 3, 4}, align);
    ASSERT_EQ(grid.sizes(), (Shape{2, 3, 4, 2}));
    const std::vector<double> tv = values(theta), gv = values(grid);
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j) {
          const double x = align ? -1 + 2.0 * double(j) / 3 : (-1 + 2.0 * double(j) / 3) * 3 / 4;
          const double y = align ? -1 + 2.0 * double(i) / 2 : (-1 + 2.0 * double(i) / 2) * 2 / 3;
          for (int64_t k = 0; k < 2; ++k) {
            const double* row = tv.data() + (n * 2 + k) * 3;
            EXPECT_NEAR(gv[size_t(((n * 3 + i) * 4 + j) * 2 + k)], row[0] * x + row[1] * y + row[2],
                        1e-12);
          }
        }
    // The identity map samples every pixel at its centre: the input again.
    const Tensor identity = from_vector<double>({1, 0, 0, 0, 1, 0}, {1, 2, 3});
    const Tensor image = testing::input({1, 3, 5, 6}, kFloat64);
    EXPECT_TRUE(allclose(
        grid_sample(image, affine_grid(identity, {1, 3, 5, 6}, align), "bilinear", "zeros", align),
        image, 1e-12, 1e-12));
  }
  EXPECT_EQ(affine_grid(testing::input({1, 3, 4}), {1, 1, 2, 3, 4}).sizes(),
            (Shape{1, 2, 3, 4, 3}));
  // One pixel along a dim sits at 0.
  EXPECT_EQ(values(affine_grid(from_vector<double>({1, 0, 0, 0, 1, 0}, {1, 2, 3}), {1, 1, 1, 1})),
            (std::vector<double>{0, 0}));
  expect_error([&] { affine_grid(theta, {2, 5, 3}); }, {"affine_grid", "size"});
  expect_error([&] { affine_grid(theta, {3, 5, 3, 4}); }, {"affine_grid", "theta"});
  expect_error([&] { affine_grid(theta, {2, 5, 0, 4}); }, {"affine_grid", "positive"});
}

TEST(GridSample, GradientsLazyAndErrors) {
  Tensor input = testing::input({1, 2, 3, 4}, kFloat64).requires_grad_();
  // Grid points away from pixel boundaries (floor's jumps) and the image's edges (the clips').
  Tensor grid = (testing::input({1, 2, 3, 2}, kFloat64, -0.8, 0.8) + 0.013).requires_grad_();
  for (const char* padding : {"zeros", "border", "reflection"})
    for (bool align : {false, true}) {
      SCOPED_TRACE(std::string(padding) + (align ? " align_corners" : ""));
      EXPECT_TRUE(testing::gradcheck(
          [&](const std::vector<Tensor>& in) {
            return grid_sample(in[0], in[1], "bilinear", padding, align);
          },
          {input, grid}));
    }
  Tensor theta = testing::input({1, 2, 3}, kFloat64, -0.6, 0.6).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return grid_sample(in[0], affine_grid(in[1], {1, 2, 4, 3}), "bilinear", "border");
      },
      {input, theta}));
  // nearest passes no gradient to the grid, as torch's.
  Tensor g2 = grid.detach().clone().requires_grad_();
  grid_sample(input.detach(), g2, "nearest").sum().backward();
  EXPECT_TRUE(equal(g2.grad(), zeros_like(g2)));
  testing::check_lazy("grid_sample", [&] {
    Tensor x = input.detach().clone().requires_grad_(), g = grid.detach().clone().requires_grad_();
    Tensor y = grid_sample(x * 2, g, "bilinear", "reflection");
    (y * y).sum().backward();
    return std::vector<Tensor>{y.detach(), x.grad(), g.grad()};
  });
  expect_error([&] { grid_sample(input, grid, "bicubic"); }, {"grid_sample", "bicubic"});
  expect_error([&] { grid_sample(input, grid, "bilinear", "wrap"); },
               {"grid_sample", "padding_mode"});
  expect_error([&] { grid_sample(input, grid.to(kFloat32)); }, {"grid_sample", "dtype"});
  expect_error([&] { grid_sample(input, grid.narrow(3, 0, 1)); },
               {"grid_sample", "[N, oH, oW, 2]"});
  expect_error([&] { grid_sample(input.expand({2, 2, 3, 4}), grid); }, {"grid_sample", "batch"});
}

// ------------------------------------------------------------------------------- embedding_bag

// The reference: the bags of positions [begin, end) per bag.
std::vector<double> bag_reference(const std::vector<double>& weight, int64_t dim,
                                  const std::vector<int64_t>& indices,
                                  const std::vector<int64_t>& starts, int64_t end,
                                  const std::string& mode, const std::vector<double>& scale,
                                  int64_t padding) {
  std::vector<double> out;
  for (size_t b = 0; b < starts.size(); ++b) {
    const int64_t stop = b + 1 < starts.size() ? starts[b + 1] : end;
    for (int64_t d = 0; d < dim; ++d) {
      double acc = mode == "max" ? -INFINITY : 0;
      int64_t count = 0;
      for (int64_t i = starts[b]; i < stop; ++i) {
        if (indices[size_t(i)] == padding) continue;
        const double v =
            weight[size_t(indices[size_t(i)] * dim + d)] * (scale.empty() ? 1.0 : scale[size_t(i)]);
        acc = mode == "max" ? std::max(acc, v) : acc + v;
        ++count;
      }
      if (count == 0) acc = 0;
      out.push_back(mode == "mean" && count > 0 ? acc / double(count) : acc);
    }
  }
  return out;
}

TEST(EmbeddingBag, MatchesTheReferenceForEveryMode) {
  for (int trial = 0; trial < 60; ++trial) {
    const std::string mode = std::vector<std::string>{"sum", "mean", "max"}[size_t(trial % 3)];
    const int64_t num = pick(1, 6), dim = pick(0, 3), count = pick(0, 9);
    const Tensor weight = testing::input({num, dim}, kFloat64);
    const Tensor input = randint(0, num, {count});
    std::vector<int64_t> starts{0};
    for (int64_t b = pick(0, 3); b > 0; --b) starts.push_back(pick(starts.back(), count));
    const bool last = trial % 4 == 1;
    std::vector<int64_t> offsets = starts;
    if (last) offsets.push_back(count);
    const std::optional<int64_t> padding =
        trial % 5 == 2 ? std::optional<int64_t>(0) : std::nullopt;
    const Tensor scale = mode == "sum" && trial % 2 ? testing::input({count}, kFloat64) : Tensor();
    std::vector<int64_t> iv;
    for (double v : values(input)) iv.push_back(int64_t(v));
    const Tensor got =
        embedding_bag(input, weight, from_vector<int64_t>(offsets, {int64_t(offsets.size())}), mode,
                      scale, last, padding);
    SCOPED_TRACE(mode);
    testing::expect_close(got,
                          bag_reference(values(weight), dim, iv, starts, count, mode,
                                        scale.defined() ? values(scale) : std::vector<double>{},
                                        padding.value_or(-1)),
                          {int64_t(starts.size()), dim}, kFloat64, 1e-12, 1e-12);
  }
  // A 2-D input: one bag per row.
  const Tensor weight = testing::input({5, 3}, kFloat64);
  const Tensor rows = from_vector<int64_t>({0, 4, 4, 1, 2, 3}, {2, 3});
  EXPECT_TRUE(allclose(embedding_bag(rows, weight, {}, "mean"), embedding(weight, rows).mean({1}),
                       1e-12, 1e-12));
  EXPECT_TRUE(
      allclose(embedding_bag(rows, weight, {}, "max"), embedding(weight, rows).amax({1}), 0, 0));
}

TEST(EmbeddingBag, GradientsModuleAndErrors) {
  Tensor weight = testing::input({6, 3}, kFloat64).requires_grad_();
  const Tensor input = from_vector<int64_t>({0, 2, 5, 2, 1, 3, 4}, {7});
  const Tensor offsets = from_vector<int64_t>({0, 2, 2, 5}, {4});
  Tensor scale = testing::input({7}, kFloat64).requires_grad_();
  for (const char* mode : {"sum", "mean", "max"})
    EXPECT_TRUE(testing::gradcheck(
        [&](const std::vector<Tensor>& in) {
          return embedding_bag(input, in[0], offsets, mode, {}, false, 2);
        },
        {weight}))
        << mode;
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return embedding_bag(input, in[0], offsets, "sum", in[1]);
      },
      {weight, scale}));
  // A bag's maximum takes its whole gradient, a -0 one too (never shared with the initial value).
  Tensor signed_zero = from_vector<double>({-0.0, 1.0}, {1, 2}).requires_grad_();
  embedding_bag(from_vector<int64_t>({0}, {1}), signed_zero, from_vector<int64_t>({0}, {1}), "max")
      .sum()
      .backward();
  EXPECT_EQ(values(signed_zero.grad()), (std::vector<double>{1, 1}));
  // Tied rows: the first holding the maximum takes the gradient (torch's), a -inf one too.
  Tensor tied = from_vector<double>({2, -INFINITY, 2, -INFINITY}, {2, 2}).requires_grad_();
  embedding_bag(from_vector<int64_t>({1, 0}, {2}), tied, from_vector<int64_t>({0}, {1}), "max")
      .sum()
      .backward();
  EXPECT_EQ(values(tied.grad()), (std::vector<double>{0, 0, 1, 1}));
  // No indices: zero bags that still require grad.
  EXPECT_TRUE(embedding_bag(zeros({0}, kInt64), weight, from_vector<int64_t>({0, 0}, {2}), "max")
                  .requires_grad());
  // The padding row gets no gradient.
  Tensor w2 = weight.detach().clone().requires_grad_();
  embedding_bag(input, w2, offsets, "mean", {}, false, -4).sum().backward();
  EXPECT_EQ(values(w2.grad()[2]), std::vector<double>(3, 0.0));
  for (const char* mode : {"sum", "mean", "max"})
    testing::check_lazy(std::string("embedding_bag ") + mode, [&] {
      Tensor w = weight.detach().clone().requires_grad_();
      Tensor sc = scale.detach().clone().requires_grad_();
      const bool summed = std::string(mode) == "sum";
      Tensor y = embedding_bag(input, w * 2, offsets, mode, summed ? sc * 1.0 : Tensor(), false,
                               summed ? std::optional<int64_t>(2) : std::nullopt);
      (y * y).sum().backward();
      return summed ? std::vector<Tensor>{y.detach(), w.grad(), sc.grad()}
                    : std::vector<Tensor>{y.detach(), w.grad()};
    });
  nn::EmbeddingBag module(nn::EmbeddingBagOptions(6, 3).mode("sum").padding_idx(-1));
  EXPECT_EQ(values(module.weight[5]), std::vector<double>(3, 0.0));
  EXPECT_TRUE(equal(module(input, offsets),
                    embedding_bag(input, module.weight, offsets, "sum", {}, false, 5)));
  EXPECT_EQ(module.forward(input.view({7, 1})).sizes(), (Shape{7, 3}));
  expect_error(
      [&] {
        embedding_bag(input, weight, from_vector<int64_t>({1, 2}, {2}));
      },
      {"embedding_bag", "start at 0"});
  expect_error(
      [&] {
        embedding_bag(input, weight, from_vector<int64_t>({0, 3, 2}, {3}));
      },
      {"embedding_bag", "never decrease"});
  expect_error(
      [&] {
        embedding_bag(input, weight, from_vector<int64_t>({0, 8}, {2}));
      },
      {"embedding_bag", "7 indices"});
  expect_error(
      [&] {
        embedding_bag(input, weight, from_vector<int64_t>({0, 3}, {2}), "sum", {}, true);
      },
      {"embedding_bag", "end at"});
  expect_error([&] { embedding_bag(input, weight); }, {"embedding_bag", "offsets"});
  expect_error(
      [&] {
        embedding_bag(input.view({7, 1}), weight, offsets);
      },
      {"embedding_bag", "2-D input"});
  expect_error([&] { embedding_bag(input, weight, offsets, "mean", scale); },
               {"embedding_bag", "per_sample_weights"});
  expect_error([&] { embedding_bag(input, weight, offsets, "median"); }, {"embedding_bag", "mode"});
  expect_error([&] { embedding_bag(input + 3, weight, offsets); },
               {"embedding_bag", "outside [0, 6)"});
  expect_error([&] { nn::EmbeddingBag(nn::EmbeddingBagOptions(3, 2).mode("min")); },
               {"EmbeddingBag", "mode"});
}

// A traced step replays with new weights, indices and grids (and after save and load).
TEST(VisionOpsTrace, ReplaysFollowNewInputs) {
  const Tensor offsets = from_vector<int64_t>({0, 2, 2, 5}, {4});
  auto fn = [offsets](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{embedding_bag(in[1], in[0], offsets, "sum"),
                               embedding_bag(in[1], in[0], offsets, "mean", {}, false, 3),
                               grid_sample(in[2], in[3], "bilinear", "border")};
  };
  auto inputs = [](int64_t seed) {
    manual_seed(seed);
    return std::vector<Tensor>{testing::input({6, 3}, kFloat64), randint(0, 6, {7}),
                               testing::input({1, 2, 3, 4}, kFloat64),
                               testing::input({1, 2, 3, 2}, kFloat64, -1.1, 1.1)};
  };
  jit::Function traced = jit::trace(fn, inputs(1));
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_vision_ops_" + std::to_string(::getpid()) + ".kiln"))
                               .string();
  traced.save(path);
  jit::Function loaded = jit::load(path);
  std::filesystem::remove(path);
  const std::vector<Tensor> fresh = inputs(2);
  std::vector<Tensor> want;
  {
    LazyGuard eager(false);
    want = fn(fresh);
  }
  const std::vector<Tensor> got = traced(fresh), got_loaded = loaded(fresh);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    testing::expect_lazy_equal(got[i], want[i], "replayed output " + std::to_string(i));
    testing::expect_lazy_equal(got_loaded[i], want[i], "loaded output " + std::to_string(i));
  }
}

// Four threads sampling, pooling and bagging at once (with gradients) get one thread's results.
TEST(VisionOpsThreads, ConcurrentCallsMatchOneThread) {
  const Tensor x0 = testing::input({2, 3, 6, 5}, kFloat64);
  const Tensor grid0 = testing::input({2, 4, 3, 2}, kFloat64, -1.2, 1.2);
  const Tensor table0 = testing::input({7, 4}, kFloat64);
  testing::expect_concurrent_runs_match(
      [&] {
        Tensor x = x0.clone().requires_grad_(), grid = grid0.clone().requires_grad_();
        Tensor table = table0.clone().requires_grad_();
        const Tensor pooled = adaptive_max_pool2d(instance_norm(x), {4, 3});
        const Tensor sampled = grid_sample(local_response_norm(x, 2), grid, "bilinear", "border");
        const Tensor bags = embedding_bag(from_vector<int64_t>({1, 6, 2, 2, 0}, {5}), table,
                                          from_vector<int64_t>({0, 1, 3}, {3}), "max");
        Tensor y = pooled.sum() + (sampled * sampled).sum() + bags.sum();
        y.backward();
        return std::vector<Tensor>{y.detach(), x.grad(), grid.grad(), table.grad()};
      },
      4, 3);
}

}  // namespace
}  // namespace kiln
