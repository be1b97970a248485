// Sliding windows (lib/ops/windows.cpp): Tensor::unfold as a view, unfold/fold (im2col/col2im)
// and the 1-D poolings, each against a float64 reference loop over random geometries (sizes 0 and
// 1, strides past the kernel, dilation, padding, non-contiguous inputs), gradients by gradcheck,
// fold as unfold's adjoint, lazy against eager, and errors that name the op.
#include <algorithm>
#include <cmath>
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
using testing::values;

int64_t pick(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(testing::rng());
}

TEST(TensorUnfold, WindowsAlongADimAreAViewOfTheInput) {
  for (int trial = 0; trial < 40; ++trial) {
    const Shape shape = {pick(0, 3), pick(1, 7), pick(1, 3)};
    Tensor x = testing::input(shape, kFloat64);
    if (trial % 3 == 1) x = x.transpose(0, 2).contiguous().transpose(0, 2);  // not contiguous
    const int64_t d = pick(0, 2), size = pick(0, shape[size_t(d)]), step = pick(1, 4);
    const Tensor w = x.unfold(d, size, step);
    const int64_t count = (shape[size_t(d)] - size) / step + 1;
    Shape want_shape = shape;
    want_shape[size_t(d)] = count;
    want_shape.push_back(size);
    ASSERT_EQ(w.sizes(), want_shape) << trial;
    const std::vector<double> xv = values(x), wv = values(w);
    for (int64_t flat = 0; flat < w.numel(); ++flat) {
      std::vector<int64_t> at = testing::unravel(flat, want_shape);
      std::vector<int64_t> src(at.begin(), at.end() - 1);
      src[size_t(d)] = at[size_t(d)] * step + at.back();
      ASSERT_EQ(wv[size_t(flat)], xv[size_t(testing::ravel(src, shape))]) << trial;
    }
  }
  // A view: a write into the input shows through the windows.
  Tensor x = arange(6, kFloat32);
  const Tensor w = x.unfold(0, 3, 2);
  x.fill_(7);
  EXPECT_EQ(values(w), std::vector<double>(6, 7.0));
  EXPECT_EQ(scalar_tensor(5.0).unfold(0, 1, 1).sizes(), Shape{1});
  expect_error([&] { arange(4).unfold(0, 5, 1); }, {"unfold", "size 5 exceeds dim 0"});
  expect_error([&] { arange(4).unfold(0, 2, 0); }, {"unfold", "step > 0"});
  expect_error([&] { arange(4).unfold(1, 2, 1); }, {"unfold"});
}

TEST(TensorUnfold, GradientAddsUpOverlappingWindows) {
  Tensor x = testing::input({3, 8}, kFloat64).requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const std::vector<Tensor>& in) { return in[0].unfold(1, 3, 2); }, {x}));
  Tensor y = arange(5, kFloat64).requires_grad_();
  y.unfold(0, 3, 1).sum().backward();
  EXPECT_EQ(values(y.grad()), (std::vector<double>{1, 2, 3, 2, 1}));
}

struct Geometry {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
  int64_t out_h(int64_t h) const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t out_w(int64_t w) const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

// A random geometry whose kernel fits an h x w image.
Geometry random_geometry(int64_t h, int64_t w) {
  for (;;) {
    Geometry g{pick(1, 3), pick(1, 3), pick(1, 2), pick(1, 2),
               pick(0, 2), pick(0, 2), pick(1, 3), pick(1, 3)};
    if (h + 2 * g.ph >= g.dh * (g.kh - 1) + 1 && w + 2 * g.pw >= g.dw * (g.kw - 1) + 1) return g;
  }
}

// im2col in float64: column (c, i, j) row, window (p, q).
std::vector<double> im2col(const std::vector<double>& x, int64_t n, int64_t c, int64_t h, int64_t w,
                           const Geometry& g) {
  const int64_t oh = g.out_h(h), ow = g.out_w(w);
  std::vector<double> out;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j)
          for (int64_t p = 0; p < oh; ++p)
            for (int64_t q = 0; q < ow; ++q) {
              const int64_t r = p * g.sh + i * g.dh - g.ph, s = q * g.sw + j * g.dw - g.pw;
              const bool inside = r >= 0 && r < h && s >= 0 && s < w;
              out.push_back(inside ? x[size_t(((b * c + ch) * h + r) * w + s)] : 0.0);
            }
  return out;
}

TEST(Im2col, UnfoldAndFoldMatchTheReferenceAndAreAdjoint) {
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t n = pick(0, 2), c = pick(1, 3), h = pick(1, 6), w = pick(1, 6);
    const Geometry g = random_geometry(h, w);
    const Shape k{g.kh, g.kw}, d{g.dh, g.dw}, p{g.ph, g.pw}, s{g.sh, g.sw};
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Tensor x = testing::input({n, c, h, w}, dtype);
    const Tensor cols = unfold(x, k, d, p, s);
    const int64_t blocks = g.out_h(h) * g.out_w(w);
    const Shape col_shape{n, c * g.kh * g.kw, blocks};
    testing::expect_close(cols, im2col(values(x), n, c, h, w, g), col_shape, dtype, 0, 0);
    // fold is the adjoint: <unfold(x), y> = <x, fold(y)>.
    const Tensor y = testing::input(col_shape, kFloat64);
    const Tensor folded = fold(y, {h, w}, k, d, p, s);
    ASSERT_EQ(folded.sizes(), (Shape{n, c, h, w}));
    const Tensor x64 = x.to(kFloat64);
    EXPECT_NEAR((unfold(x64, k, d, p, s) * y).sum().item<double>(),
                (x64 * folded).sum().item<double>(), 1e-9)
        << trial;
  }
  // Unbatched, and one value for both spatial dims.
  const Tensor x = testing::input({2, 5, 4}, kFloat64);
  EXPECT_TRUE(equal(unfold(x, {2}, {1}, {1}, {2}),
                    unfold(x.unsqueeze(0), {2, 2}, {1, 1}, {1, 1}, {2, 2}).squeeze(0)));
  // fold(unfold(x)) counts each pixel once per window covering it.
  const Tensor ones4 = ones({1, 1, 4, 4}, kFloat64);
  EXPECT_EQ(values(fold(unfold(ones4, {2}, {1}, {0}, {1}), {4, 4}, {2})),
            (std::vector<double>{1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1}));
}

TEST(Im2col, GradientsAndModules) {
  Tensor x = testing::input({1, 2, 4, 5}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        return unfold(in[0], {2, 3}, {1, 1}, {1, 0}, {2, 1});
      },
      {x}));
  Tensor cols = testing::input({1, 2 * 4, 6}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        return fold(in[0], {3, 4}, {2, 2}, {1}, {0}, {1});
      },
      {cols}));
  nn::Unfold unfold_module({2, 3}, {1}, {1, 0}, {2, 1});
  EXPECT_TRUE(
      equal(unfold_module.forward(x.detach()), unfold(x.detach(), {2, 3}, {1}, {1, 0}, {2, 1})));
  nn::Fold fold_module({3, 4}, {2, 2});
  EXPECT_TRUE(equal(fold_module.forward(cols.detach()), fold(cols.detach(), {3, 4}, {2, 2})));
  expect_error([&] { unfold(x, {6, 1}); }, {"unfold", "does not fit"});
  expect_error([&] { unfold(x.reshape({-1}), {1}); }, {"unfold", "4-D (batched)"});
  expect_error([&] { fold(cols, {3, 4}, {3, 3}); }, {"fold", "rows", "blocks"});
  expect_error([&] { unfold(x, {0, 1}); }, {"unfold", "kernel_size"});
}

// A convolution as im2col, a GEMM and a reshape: lazy (fused, traced) gives eager's values and
// gradients, and matches conv2d.
TEST(Im2col, ConvolutionThroughUnfoldLazyEqualsEager) {
  const Tensor x0 = testing::input({2, 3, 6, 5}, kFloat64);
  const Tensor w0 = testing::input({4, 3, 3, 2}, kFloat64);
  auto run = [&](bool lazy) {
    LazyGuard mode(lazy);
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const Tensor cols = unfold(x, {3, 2}, {1}, {1}, {1});
    Tensor y = w.reshape({4, -1}).matmul(cols).reshape({2, 4, 6, 6});
    (y * y).sum().backward();
    return std::vector<Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const std::vector<Tensor> eager = run(false), lazy = run(true);
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(allclose(eager[i], lazy[i], 1e-12, 1e-12));
  EXPECT_TRUE(allclose(eager[0], conv2d(x0, w0, {}, {1}, {1}), 1e-12, 1e-12));
}

// max_pool1d and avg_pool1d in float64 over [n, c, l].
TEST(Pool1d, MatchesTheReferenceWithIndicesAndGradients) {
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t n = pick(1, 2), c = pick(1, 3), l = pick(1, 9);
    const int64_t k = pick(1, std::min<int64_t>(l, 4)), s = pick(1, 3), d = pick(1, 2);
    if (d * (k - 1) + 1 > l) continue;
    const int64_t p = pick(0, (d * (k - 1) + 1) / 2), pa = pick(0, k / 2);  // avg: no dilation
    const bool ceil_mode = trial % 2, include_pad = trial % 3 != 0;
    const Tensor x = testing::input({n, c, l}, kFloat64);
    const std::vector<double> xv = values(x);
    auto [mx, idx] = max_pool1d_with_indices(x, {k}, {s}, {p}, {d}, ceil_mode);
    const int64_t out = mx.size(2);
    const Tensor avg = avg_pool1d(x, {k}, {s}, {pa}, ceil_mode, include_pad);
    std::vector<double> want_max, want_idx;
    for (int64_t row = 0; row < n * c; ++row)
      for (int64_t o = 0; o < out; ++o) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t at = -1;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t pos = o * s - p + j * d;
          if (pos < 0 || pos >= l) continue;
          if (at < 0 || xv[size_t(row * l + pos)] > best)
            best = xv[size_t(row * l + pos)], at = pos;
        }
        want_max.push_back(best);
        want_idx.push_back(double(at));
      }
    testing::expect_close(mx, want_max, {n, c, out}, kFloat64, 0, 0);
    testing::expect_close(idx, want_idx, {n, c, out}, kInt64, 0, 0);
    std::vector<double> want_avg;
    const int64_t avg_out = avg.size(2);
    for (int64_t row = 0; row < n * c; ++row)
      for (int64_t o = 0; o < avg_out; ++o) {
        const int64_t start = o * s - pa, end = std::min(start + k, l + pa);
        double sum = 0;
        for (int64_t pos = std::max<int64_t>(start, 0); pos < std::min(end, l); ++pos)
          sum += xv[size_t(row * l + pos)];
        const int64_t count =
            include_pad ? end - start : std::min(end, l) - std::max<int64_t>(start, 0);
        want_avg.push_back(sum / double(count));
      }
    testing::expect_close(avg, want_avg, {n, c, avg_out}, kFloat64, 1e-12, 1e-12);
  }
  Tensor x = testing::input({2, 7}, kFloat64).requires_grad_();  // unbatched
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return avg_pool1d(in[0], {3}, {2}, {1}); }, {x}));
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return max_pool1d(in[0], {2}, {1}); }, {x}));
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) { return adaptive_avg_pool1d(in[0], {3}); }, {x}));
}

TEST(Pool1d, AdaptiveAverageModulesAndErrors) {
  const Tensor x = testing::input({2, 3, 10}, kFloat64);
  const std::vector<double> xv = values(x);
  for (int64_t out : {1, 3, 4, 10, 13}) {
    std::vector<double> want;
    for (int64_t row = 0; row < 6; ++row)
      for (int64_t o = 0; o < out; ++o) {
        const int64_t start = o * 10 / out, end = ((o + 1) * 10 + out - 1) / out;
        double sum = 0;
        for (int64_t pos = start; pos < end; ++pos) sum += xv[size_t(row * 10 + pos)];
        want.push_back(sum / double(end - start));
      }
    testing::expect_close(adaptive_avg_pool1d(x, {out}), want, {2, 3, out}, kFloat64, 1e-12, 0);
  }
  EXPECT_TRUE(equal(nn::MaxPool1d({3}, {2}).forward(x), max_pool1d(x, {3}, {2})));
  EXPECT_TRUE(equal(nn::AvgPool1d({3}).forward(x), avg_pool1d(x, {3})));
  EXPECT_TRUE(equal(nn::AdaptiveAvgPool1d({4}).forward(x), adaptive_avg_pool1d(x, {4})));
  expect_error([&] { max_pool1d(x, {2, 2}); }, {"max_pool1d", "kernel_size", "one value"});
  expect_error([&] { avg_pool1d(x, {3}, {}, {2}); }, {"avg_pool1d", "padding 2"});
  expect_error([&] { max_pool1d(x, {11}); }, {"max_pool1d", "does not fit"});
  expect_error([&] { max_pool1d(x.reshape({-1}), {2}); }, {"max_pool1d", "3-D (batched)"});
  expect_error([&] { adaptive_avg_pool1d(x, {0}); }, {"adaptive_avg_pool1d", "output_size"});
}

// Four threads computing windows and special functions at once (each with its gradients) get one
// thread's results.
TEST(WindowsThreads, ConcurrentCallsMatchOneThread) {
  const Tensor x0 = testing::input({2, 3, 6, 5}, kFloat64, 0.1, 0.9);
  testing::expect_concurrent_runs_match(
      [&] {
        Tensor x = x0.clone().requires_grad_();
        const Tensor cols = unfold(x, {2, 3}, {1}, {1}, {2, 1});
        const Tensor image = fold(cols, {6, 5}, {2, 3}, {1}, {1}, {2, 1});
        const Tensor pooled =
            max_pool1d(x.flatten(2), {3}, {2}) + avg_pool1d(x.flatten(2), {3}, {2});
        Tensor y = lgamma(image + 1).sum() + digamma(erfinv(x * 0.5) + 1).sum() +
                   erfc(pooled).sum() + x.unfold(3, 2, 1).sum();
        y.backward();
        return std::vector<Tensor>{y.detach(), x.grad()};
      },
      4, 3);
}

}  // namespace
}  // namespace kiln
