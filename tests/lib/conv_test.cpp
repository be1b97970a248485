// Tests of the convolution ops (conv2d, conv1d, conv2d_grad_input, conv2d_grad_weight,
// conv_transpose2d): every algorithm against float64 direct loops over random geometries, gradient
// checks (twice differentiated), lazy and traced results equal to eager ones, the chooser, and
// errors.
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/ops/conv.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::ConvAlgo;
using testing::check_lazy;
using testing::expect_close;
using testing::expect_error;
using testing::random_tensor;
using testing::rng;
using testing::values;

[[maybe_unused]] ::testing::Environment* const kNoFlush =
    ::testing::AddGlobalTestEnvironment(new testing::NoFlushEnvironment);

// Forces an algorithm for a scope.
struct ForceAlgo {
  explicit ForceAlgo(ConvAlgo a) { detail::set_conv_algo(a); }
  ~ForceAlgo() { detail::set_conv_algo(ConvAlgo::Auto); }
};

struct Conv {
  int64_t N, C, H, W, O, kH, kW, sH, sW, pH, pW, dH, dW, groups;
  int64_t oH() const { return (H + 2 * pH - dH * (kH - 1) - 1) / sH + 1; }
  int64_t oW() const { return (W + 2 * pW - dW * (kW - 1) - 1) / sW + 1; }
  Shape in() const { return {N, C, H, W}; }
  Shape weight() const { return {O, C / groups, kH, kW}; }
  Shape out() const { return {N, O, oH(), oW()}; }
  Shape stride() const { return {sH, sW}; }
  Shape padding() const { return {pH, pW}; }
  Shape dilation() const { return {dH, dW}; }
  std::string str() const {
    return "in " + detail::shape_str(in()) + " weight " + detail::shape_str(weight()) + " stride " +
           detail::shape_str(stride()) + " padding " + detail::shape_str(padding()) + " dilation " +
           detail::shape_str(dilation()) + " groups " + std::to_string(groups);
  }
  // Calls f(n, o, c, oh, ow, ih, iw, i, j, weight index (o, c % Cg, i, j)) for every product of
  // the convolution that reads a pixel inside the image.
  template <typename F>
  void for_each_tap(F f) const {
    const int64_t Cg = C / groups, Og = O / groups;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t cg = 0; cg < Cg; ++cg)
          for (int64_t oh = 0; oh < oH(); ++oh)
            for (int64_t ow = 0; ow < oW(); ++ow)
              for (int64_t i = 0; i < kH; ++i)
                for (int64_t j = 0; j < kW; ++j) {
                  const int64_t c = o / Og * Cg + cg;
                  const int64_t ih = oh * sH - pH + i * dH, iw = ow * sW - pW + j * dW;
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  f(((n * O + o) * oH() + oh) * oW() + ow, ((n * C + c) * H + ih) * W + iw,
                    ((o * Cg + cg) * kH + i) * kW + j);
                }
  }
};

int64_t pick(int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng()() % static_cast<uint64_t>(hi - lo + 1));
}

// A random geometry, with the special cases cycled through by `i`: batch 1, 1x1 kernels, and a
// kernel larger than the image that fits only with the padding.
Conv random_conv(int i) {
  Conv c{};
  c.groups = pick(1, 3);
  c.C = c.groups * pick(1, 3);
  c.O = c.groups * pick(1, 3);
  c.N = i % 4 == 0 ? 1 : pick(1, 3);
  c.kH = pick(1, 4);
  c.kW = pick(1, 4);
  if (i % 4 == 1) c.kH = c.kW = 1;
  c.sH = pick(1, 3);
  c.sW = pick(1, 3);
  c.dH = pick(1, 2);
  c.dW = pick(1, 2);
  c.pH = pick(0, 2);
  c.pW = pick(0, 2);
  const int64_t eh = c.dH * (c.kH - 1) + 1, ew = c.dW * (c.kW - 1) + 1;
  c.H = std::max<int64_t>(1, eh - 2 * c.pH) + pick(0, 5);
  c.W = std::max<int64_t>(1, ew - 2 * c.pW) + pick(0, 5);
  if (i % 4 == 2) {  // the kernel is larger than the image
    c.kH = c.kW = 3;
    c.dH = c.dW = 1;
    c.pH = c.pW = 1;
    c.H = 2;
    c.W = 1 + pick(0, 1);
  }
  return c;
}

std::vector<double> ref_forward(const Conv& c, const std::vector<double>& x,
                                const std::vector<double>& w, const std::vector<double>& b) {
  std::vector<double> y(static_cast<size_t>(detail::shape_numel(c.out())), 0.0);
  c.for_each_tap([&](int64_t yi, int64_t xi, int64_t wi) { y[yi] += x[xi] * w[wi]; });
  if (!b.empty())
    for (size_t k = 0; k < y.size(); ++k) y[k] += b[k / (c.oH() * c.oW()) % c.O];
  return y;
}
std::vector<double> ref_grad_input(const Conv& c, const std::vector<double>& gy,
                                   const std::vector<double>& w) {
  std::vector<double> gx(static_cast<size_t>(detail::shape_numel(c.in())), 0.0);
  c.for_each_tap([&](int64_t yi, int64_t xi, int64_t wi) { gx[xi] += gy[yi] * w[wi]; });
  return gx;
}
std::vector<double> ref_grad_weight(const Conv& c, const std::vector<double>& gy,
                                    const std::vector<double>& x) {
  std::vector<double> gw(static_cast<size_t>(detail::shape_numel(c.weight())), 0.0);
  c.for_each_tap([&](int64_t yi, int64_t xi, int64_t wi) { gw[wi] += gy[yi] * x[xi]; });
  return gw;
}

double rtol(DType dt) {
  return dt == kFloat64 ? 1e-10 : 1e-4;
}
double atol(DType dt) {
  return dt == kFloat64 ? 1e-10 : 1e-4;
}

// The same values in a non-contiguous layout (a transposed copy transposed back).
Tensor strided(const Tensor& t) {
  return t.transpose(0, t.dim() - 1).contiguous().transpose(0, t.dim() - 1);
}

// The algorithm that must have run when `forced` is asked for: itself where it can run.
ConvAlgo expected_algo(ConvAlgo forced, const Conv& c, DType dt, bool forward) {
  if (forced == ConvAlgo::WeightGrad && (!forward || c.groups != 1)) return ConvAlgo::Auto;
  const int64_t pad_b = (c.oH() - 1) * c.sH + (c.kH - 1) * c.dH + 1 - c.H - c.pH;
  const int64_t pad_r = (c.oW() - 1) * c.sW + (c.kW - 1) * c.dW + 1 - c.W - c.pW;
  if (forced == ConvAlgo::OneDNN && (dt != kFloat32 || pad_b < 0 || pad_r < 0))
    return ConvAlgo::Auto;
  return forced;
}

const ConvAlgo kAlgos[] = {ConvAlgo::Im2col, ConvAlgo::WeightGrad, ConvAlgo::OneDNN};

TEST(Conv2d, EveryAlgorithmMatchesDirectLoops) {
  LazyGuard eager(false);
  for (int i = 0; i < 40; ++i) {
    const Conv c = random_conv(i);
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor x = random_tensor(c.in(), dt), w = random_tensor(c.weight(), dt);
      Tensor b = random_tensor({c.O}, dt), gy = random_tensor(c.out(), dt);
      if (i % 3 == 0) {  // non-contiguous operands
        x = strided(x);
        w = strided(w);
        gy = strided(gy);
      }
      const auto xv = values(x), wv = values(w), gv = values(gy);
      for (ConvAlgo a : kAlgos) {
        SCOPED_TRACE(c.str() + " " + dtype_name(dt) + " " + detail::conv_algo_name(a));
        ForceAlgo force(a);
        const Tensor y = conv2d(x, w, b, c.stride(), c.padding(), c.dilation(), c.groups);
        const ConvAlgo want = expected_algo(a, c, dt, true);
        if (want != ConvAlgo::Auto) {
          EXPECT_EQ(detail::last_conv_algo(), want);
        }
        expect_close(y, ref_forward(c, xv, wv, values(b)), c.out(), dt, rtol(dt), atol(dt));
        const Tensor gx =
            conv2d_grad_input(gy, w, c.in(), c.stride(), c.padding(), c.dilation(), c.groups);
        if (expected_algo(a, c, dt, false) != ConvAlgo::Auto) {
          EXPECT_EQ(detail::last_conv_algo(), a);
        }
        expect_close(gx, ref_grad_input(c, gv, wv), c.in(), dt, rtol(dt), atol(dt));
        const Tensor gw =
            conv2d_grad_weight(gy, x, c.weight(), c.stride(), c.padding(), c.dilation(), c.groups);
        if (expected_algo(a, c, dt, false) != ConvAlgo::Auto) {
          EXPECT_EQ(detail::last_conv_algo(), a);
        }
        expect_close(gw, ref_grad_weight(c, gv, xv), c.weight(), dt, rtol(dt), atol(dt));
      }
    }
  }
}

TEST(Conv2d, ChooserMeasuresOnceAndLogs) {
  LazyGuard eager(false);
  detail::clear_conv_choices();
  detail::set_conv_choices_on_disk(false);  // an earlier process's stored choice would be used
  const char* old = std::getenv("KILN_LOG");
  setenv("KILN_LOG", "conv", 1);
  const Tensor x = random_tensor({2, 3, 9, 9}), w = random_tensor({4, 3, 3, 3});
  ::testing::internal::CaptureStderr();
  const Tensor y1 = conv2d(x, w, {}, {1}, {1});
  const std::string first = ::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  const Tensor y2 = conv2d(x, w, {}, {1}, {1});
  const std::string second = ::testing::internal::GetCapturedStderr();
  if (old)
    setenv("KILN_LOG", old, 1);
  else
    unsetenv("KILN_LOG");
  // The first call measured every candidate and said which won; the second reused the choice.
  EXPECT_NE(first.find("[kiln conv] conv2d cpu float32 input [2, 3, 9, 9]"), std::string::npos)
      << first;
  for (const char* algo : {"im2col", "weight-grad", "onednn"})
    EXPECT_NE(first.find(std::string(algo) + " "), std::string::npos) << algo << ": " << first;
  EXPECT_NE(first.find("ms"), std::string::npos);
  EXPECT_EQ(second, "");
  EXPECT_TRUE(allclose(y1, y2, 1e-4, 1e-4));
  detail::set_conv_choices_on_disk(true);
}

TEST(Conv2d, EnvironmentForcesAnAlgorithm) {
  LazyGuard eager(false);
  const Tensor x = random_tensor({1, 2, 6, 6}), w = random_tensor({3, 2, 3, 3});
  setenv("KILN_CONV_ALGO", "onednn", 1);
  conv2d(x, w);
  EXPECT_EQ(detail::last_conv_algo(), ConvAlgo::OneDNN);
  // im2col: the GEMM formulation Theano's rule prefers; here batch * kH * kW (9) is below
  // channels * output positions (2 * 16), so the forward one.
  setenv("KILN_CONV_ALGO", "im2col", 1);
  conv2d(x, w);
  EXPECT_EQ(detail::last_conv_algo(), ConvAlgo::Im2col);
  // A kernel as large as the image: the weight-gradient formulation.
  conv2d(random_tensor({8, 1, 5, 5}), random_tensor({3, 1, 5, 5}));
  EXPECT_EQ(detail::last_conv_algo(), ConvAlgo::WeightGrad);
  setenv("KILN_CONV_ALGO", "fastest", 1);
  expect_error([&] { conv2d(x, w); }, {"KILN_CONV_ALGO", "fastest", "im2col", "onednn"});
  unsetenv("KILN_CONV_ALGO");
}

TEST(Conv2d, GradientsAndDoubleBackward) {
  for (int i = 0; i < 6; ++i) {
    Conv c = random_conv(i);
    c.N = std::min<int64_t>(c.N, 2);
    SCOPED_TRACE(c.str());
    const Tensor x = random_tensor(c.in(), kFloat64).requires_grad_();
    const Tensor w = random_tensor(c.weight(), kFloat64).requires_grad_();
    const Tensor b = random_tensor({c.O}, kFloat64).requires_grad_();
    auto f = [&](const std::vector<Tensor>& in) {
      return conv2d(in[0], in[1], in[2], c.stride(), c.padding(), c.dilation(), c.groups);
    };
    EXPECT_TRUE(testing::gradcheck(f, {x, w, b}));
    EXPECT_TRUE(testing::gradgradcheck(f, {x, w, b}));
  }
}

TEST(ConvTranspose2d, IsTheInputGradientPlusBias) {
  LazyGuard eager(false);
  for (int i = 0; i < 10; ++i) {
    const Conv c = random_conv(i);
    for (DType dt : {kFloat32, kFloat64}) {
      // conv_transpose2d's input is the convolution's output; output_padding restores the rows
      // the strided convolution dropped.
      const int64_t opH = (c.H + 2 * c.pH - c.dH * (c.kH - 1) - 1) % c.sH;
      const int64_t opW = (c.W + 2 * c.pW - c.dW * (c.kW - 1) - 1) % c.sW;
      const Tensor x = random_tensor(c.out(), dt), w = random_tensor(c.weight(), dt);
      const Tensor b = random_tensor({c.C}, dt);
      const Tensor y =
          conv_transpose2d(x, w, b, c.stride(), c.padding(), {opH, opW}, c.groups, c.dilation());
      std::vector<double> want = ref_grad_input(c, values(x), values(w));
      const auto bv = values(b);
      for (size_t k = 0; k < want.size(); ++k) want[k] += bv[k / (c.H * c.W) % c.C];
      expect_close(y, want, c.in(), dt, rtol(dt), atol(dt));
    }
  }
  const Tensor x = random_tensor({2, 4, 3, 3}, kFloat64).requires_grad_();
  const Tensor w = random_tensor({4, 3, 2, 2}, kFloat64).requires_grad_();
  auto f = [](const std::vector<Tensor>& in) {
    return conv_transpose2d(in[0], in[1], {}, {2}, {1}, {1}, 1, {1});
  };
  EXPECT_TRUE(testing::gradcheck(f, {x, w}));
  EXPECT_TRUE(testing::gradgradcheck(f, {x, w}));
}

// Empty batches and channel counts give empty or zero results, and gradients of the same kind.
TEST(Conv2d, EmptyProblems) {
  LazyGuard eager(false);
  const Tensor b = random_tensor({4});
  const Tensor y = conv2d(random_tensor({0, 3, 5, 5}), random_tensor({4, 3, 3, 3}), b);
  EXPECT_EQ(y.sizes(), Shape({0, 4, 3, 3}));
  // No input channels: the output is the bias.
  const Tensor y0 = conv2d(random_tensor({2, 0, 5, 5}), random_tensor({4, 0, 3, 3}), b);
  EXPECT_TRUE(allclose(y0, b.reshape({1, 4, 1, 1}).expand({2, 4, 3, 3})));
  const Tensor gw = conv2d_grad_weight(random_tensor({0, 4, 3, 3}), random_tensor({0, 3, 5, 5}),
                                       {4, 3, 3, 3}, {1}, {0}, {1}, 1);
  EXPECT_TRUE(allclose(gw, zeros({4, 3, 3, 3})));
  const Tensor gx = conv2d_grad_input(random_tensor({2, 0, 3, 3}), random_tensor({0, 3, 3, 3}),
                                      {2, 3, 5, 5}, {1}, {0}, {1}, 1);
  EXPECT_TRUE(allclose(gx, zeros({2, 3, 5, 5})));
}

TEST(Conv1d, IsConv2dOverOneRow) {
  LazyGuard eager(false);
  const Tensor x = random_tensor({2, 4, 11}, kFloat64), w = random_tensor({6, 2, 3}, kFloat64);
  const Tensor b = random_tensor({6}, kFloat64);
  const Tensor y = conv1d(x, w, b, {2}, {1}, {2}, 2);
  const Conv c{2, 4, 1, 11, 6, 1, 3, 1, 2, 0, 1, 1, 2, 2};
  expect_close(y, ref_forward(c, values(x), values(w), values(b)), {2, 6, c.oW()}, kFloat64, 1e-12,
               1e-12);
  // Unbatched.
  const Tensor y0 = conv1d(x.select(0, 1), w, b, {2}, {1}, {2}, 2);
  EXPECT_TRUE(allclose(y0, y.select(0, 1), 1e-12, 1e-12));
}

TEST(Conv2d, SameAndValidPadding) {
  LazyGuard eager(false);
  const Tensor x = random_tensor({2, 3, 7, 6}, kFloat64);
  for (int64_t k : {3, 4}) {
    const int64_t d = k == 3 ? 2 : 1;  // a total padding of 4, then of 3
    const Tensor w = random_tensor({5, 3, k, k}, kFloat64);
    const Tensor same = conv2d(x, w, {}, {1}, "same", {d});
    ASSERT_EQ(same.sizes(), Shape({2, 5, 7, 6}));
    // torch's "same": total padding dilation * (k - 1), the odd one at the bottom/right.
    const int64_t total = d * (k - 1), left = total / 2;
    Tensor padded = zeros({2, 3, 7 + total, 6 + total}, kFloat64);
    padded.narrow(2, left, 7).narrow(3, left, 6).copy_(x);
    const Conv c{2, 3, 7 + total, 6 + total, 5, k, k, 1, 1, 0, 0, d, d, 1};
    expect_close(same, ref_forward(c, values(padded), values(w), {}), {2, 5, 7, 6}, kFloat64, 1e-12,
                 1e-12);
    const Tensor valid = conv2d(x, w, {}, {1}, std::string("valid"));
    EXPECT_TRUE(allclose(valid, conv2d(x, w)));
  }
  const Tensor x1 = random_tensor({1, 2, 9}, kFloat64), w1 = random_tensor({2, 2, 4}, kFloat64);
  EXPECT_EQ(conv1d(x1, w1, {}, {1}, "same").sizes(), Shape({1, 2, 9}));
  expect_error(
      [&] {
        conv2d(x, random_tensor({5, 3, 3, 3}, kFloat64), {}, {2}, "same");
      },
      {"conv2d", "same", "strided"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({5, 3, 3, 3}, kFloat64), {}, {1}, "full");
      },
      {"conv2d", "\"same\" or \"valid\"", "full"});
}

TEST(Conv2d, LazyAndTracedEqualEager) {
  for (int i = 0; i < 8; ++i) {
    const Conv c = random_conv(i);
    const Tensor x = testing::input(c.in()), w = testing::input(c.weight());
    const Tensor b = testing::input({c.O}), gy = testing::input(c.out());
    check_lazy("conv " + c.str(), [&] {
      return std::vector<Tensor>{
          relu(conv2d(x, w, b, c.stride(), c.padding(), c.dilation(), c.groups)),
          conv2d_grad_input(gy, w, c.in(), c.stride(), c.padding(), c.dilation(), c.groups),
          conv2d_grad_weight(gy, x, c.weight(), c.stride(), c.padding(), c.dilation(), c.groups)};
    });
  }
  // A traced training step: forward, backward, and the gradients it assigns.
  const Tensor x = testing::input({2, 3, 8, 8});
  Tensor w = testing::input({4, 3, 3, 3}).requires_grad_();
  auto step = [&](const std::vector<Tensor>& in) {
    w.mutable_grad() = Tensor();
    Tensor loss = sum(relu(conv2d(in[0], w, {}, {2}, {1})) *
                      in[0].narrow(2, 0, 4).narrow(3, 0, 4).narrow(1, 0, 1));
    loss.backward();
    return std::vector<Tensor>{loss.detach(), w.grad()};
  };
  std::vector<Tensor> eager;
  {
    LazyGuard off(false);
    eager = step({x});
    eager[1] = eager[1].clone();
  }
  jit::Function traced = jit::trace(step, {x});
  for (int call = 0; call < 2; ++call) {
    const std::vector<Tensor> out = traced({x});
    testing::expect_lazy_equal(out[0], eager[0], "traced loss");
    testing::expect_lazy_equal(w.grad(), eager[1], "traced weight gradient");
  }
}

TEST(Conv2d, BadInputRaisesNamingTheOpAndShapes) {
  LazyGuard eager(false);
  const Tensor x = random_tensor({2, 4, 5, 5});
  const std::vector<double> before = values(x);
  expect_error(
      [&] {
        conv2d(x, random_tensor({3, 3, 3, 3}));
      },
      {"conv2d", "channels", "float32[2, 4, 5, 5]", "float32[3, 3, 3, 3]"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({3, 2, 3, 3}), {}, {1}, {0}, {1}, 2);
      },
      {"conv2d", "groups (2) must divide the output channels (3)"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({4, 1, 3, 3}), {}, {1}, {0}, {1}, 3);
      },
      {"conv2d", "groups (3) must divide the input channels (4)"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({3, 4, 7, 7}), {}, {1}, {0});
      },
      {"conv2d", "kernel size 7x7", "larger than the padded input size 5x5",
       "float32[2, 4, 5, 5]"});
  expect_error(
      [&] {
        conv2d(x.flatten(1), random_tensor({3, 4, 3, 3}));
      },
      {"conv2d", "3-D", "4-D", "float32[2, 100]"});
  expect_error([&] { conv2d(x, random_tensor({3, 4, 3})); }, {"conv2d", "weight", "4-D"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({3, 4, 3, 3}), random_tensor({4}));
      },
      {"conv2d", "bias of shape [3]", "float32[4]"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({3, 4, 3, 3}, kFloat64));
      },
      {"conv2d", "same dtype", "float32[2, 4, 5, 5]", "float64[3, 4, 3, 3]"});
  expect_error(
      [&] {
        conv2d(x, random_tensor({3, 4, 3, 3}), {}, {0});
      },
      {"conv2d", "stride", ">= 1"});
  expect_error([&] { conv1d(x, random_tensor({3, 4, 3})); }, {"conv1d", "2-D", "3-D"});
  expect_error(
      [&] {
        conv2d_grad_input(random_tensor({2, 3, 4, 4}), random_tensor({3, 4, 3, 3}), {2, 4, 5, 5},
                          {1}, {0}, {1}, 1);
      },
      {"conv2d_grad_input", "grad_output of shape [2, 3, 3, 3]", "float32[2, 3, 4, 4]"});
  expect_error(
      [&] {
        conv_transpose2d(x, random_tensor({3, 2, 3, 3}));
      },
      {"conv_transpose2d", "channels", "float32[2, 4, 5, 5]"});
  // The same in lazy mode, at the call; the input is untouched.
  {
    LazyGuard lazy(true);
    expect_error([&] { conv2d(x, random_tensor({3, 3, 3, 3})); }, {"conv2d", "channels"});
  }
  EXPECT_EQ(values(x), before);
}

}  // namespace
}  // namespace kiln
