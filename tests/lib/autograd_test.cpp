// Tests of the autograd engine's semantics: accumulation, retain_graph, grad mode, autograd::grad,
// higher-order gradients, in-place ops and views under autograd, dtypes, broadcasting and very
// deep graphs.
#include <cmath>
#include <vector>

#include "kiln/testing.h"
#include "lib/autograd.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random_tensor;

Tensor leaf(const std::vector<double>& v, const Shape& shape) {
  Tensor t = from_vector(v, shape);
  t.requires_grad_();
  return t;
}
Tensor leaf(const std::vector<double>& v) {
  return leaf(v, {static_cast<int64_t>(v.size())});
}

std::vector<double> vals(const Tensor& t) {
  return t.to_vector<double>();
}

void expect_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  ASSERT_TRUE(t.defined());
  std::vector<double> got = vals(t);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i]))) << "element " << i;
}

void expect_gradcheck(const testing::DifferentiableFunction& fn, const std::vector<Tensor>& in,
                      bool gradgrad = false) {
  try {
    testing::gradcheck(fn, in);
    if (gradgrad) testing::gradgradcheck(fn, in);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

// ------------------------------------------------------------------------------- gradcheck

TEST(Autograd, GradcheckCatchesWrongGradients) {
  // x * x.detach() has derivative 2x, but backward only sees the first factor (x).
  Tensor x = leaf({1, 2, 3});
  expect_error(
      [&] {
        testing::gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0].detach(); },
                           {x});
      },
      {"input 0", "output 0", "analytic", "numeric"});
  EXPECT_TRUE(testing::gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0]; }, {x}));
  // Second derivatives: the backward of x * x.detach() is x.detach() * g, which is wrong in x.
  expect_error(
      [&] {
        testing::gradgradcheck(
            [](const std::vector<Tensor>& in) { return (in[0] * in[0].detach()).pow(2); }, {x});
      },
      {"analytic", "numeric"});
  EXPECT_TRUE(testing::gradgradcheck(
      [](const std::vector<Tensor>& in) { return (in[0] * in[0]).pow(2); }, {x}));
  // Float32 inputs are too coarse for finite differences.
  Tensor f = ones({2});
  f.requires_grad_();
  expect_error(
      [&] { testing::gradcheck([](const std::vector<Tensor>& in) { return in[0]; }, {f}); },
      {"float64"});
  // Inputs that alias their own elements cannot be perturbed one element at a time.
  Tensor e = from_vector<double>({1}).expand({3});
  e.requires_grad_();
  expect_error(
      [&] { testing::gradcheck([](const std::vector<Tensor>& in) { return in[0] * 2.0; }, {e}); },
      {"share memory"});
  // Non-contiguous leaves are perturbed through their strides and restored exactly.
  Tensor base = from_vector<double>({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, Shape{2, 3});
  Tensor t = base.t().detach();
  t.requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{in[0].exp(), in[0].gt(from_vector<double>({0.3}))};
      },
      {t}));
  EXPECT_EQ(base.to_vector<double>(), (std::vector<double>{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}));
}

// ------------------------------------------------------------------------------- basics

TEST(Autograd, LeafAccumulatesAcrossBackwardCalls) {
  Tensor x = leaf({1, 2, 3});
  EXPECT_TRUE(x.is_leaf());
  EXPECT_TRUE(x.requires_grad());
  EXPECT_FALSE(x.grad().defined());
  (x * x).sum().backward();
  expect_values(x.grad(), {2, 4, 6});
  (x * x).sum().backward();
  expect_values(x.grad(), {4, 8, 12});
  // Zeroing through mutable_grad() restarts the accumulation.
  x.mutable_grad().zero_();
  (x * 3.0).sum().backward();
  expect_values(x.grad(), {3, 3, 3});
  x.mutable_grad() = Tensor();
  x.sum().backward();
  expect_values(x.grad(), {1, 1, 1});
}

TEST(Autograd, GradientsOfATensorUsedTwiceAreSummed) {
  Tensor x = leaf({1, 2, 3});
  (x + x).sum().backward();
  expect_values(x.grad(), {2, 2, 2});
  Tensor y = leaf({0.5, -1, 2});
  // d/dy (y * sin(y)) = sin(y) + y cos(y), through two paths.
  (y * sin(y)).sum().backward();
  std::vector<double> expected;
  for (double v : {0.5, -1.0, 2.0}) expected.push_back(std::sin(v) + v * std::cos(v));
  expect_values(y.grad(), expected);
  // Diamond: a shared intermediate feeding two branches.
  Tensor z = leaf({1, 2});
  Tensor h = z * 2.0;
  (h * h + h.exp()).sum().backward();
  expect_values(z.grad(), {2 * (2 * 2 + std::exp(2.0)), 2 * (2 * 4 + std::exp(4.0))});
}

TEST(Autograd, GraphMetadata) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2.0;
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn_name(), "mul");
  EXPECT_EQ(x.grad_fn_name(), "");
  Tensor plain = from_vector<double>({1, 2});
  EXPECT_TRUE(plain.is_leaf());
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_FALSE((plain * 2.0).requires_grad());
  // retain_grad keeps a non-leaf's gradient.
  y.retain_grad();
  (y * y).sum().backward();
  expect_values(y.grad(), {4, 8});
  expect_values(x.grad(), {8, 16});
}

TEST(Autograd, BackwardOfNonScalarNeedsAGradient) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * 2.0;
  y.backward(from_vector<double>({1, 2, 3}));
  expect_values(x.grad(), {2, 4, 6});
  Tensor z = x * 2.0;
  expect_error([&] { z.backward(); }, {"scalar"});
  // A [1]-shaped or 0-dim output counts as a scalar.
  Tensor w = leaf({4});
  (w * 3.0).backward();
  expect_values(w.grad(), {3});
  // autograd::backward over several outputs at once.
  Tensor a = leaf({1, 2});
  autograd::backward({a * 2.0, (a * a).sum()}, {from_vector<double>({1, 1}), Tensor()});
  expect_values(a.grad(), {4, 6});
}

TEST(Autograd, RetainGraph) {
  Tensor x = leaf({0.5, 1.0});
  Tensor y = x.exp().sum();
  y.backward();
  expect_error([&] { y.backward(); }, {"retain_graph"});

  Tensor x2 = leaf({0.5, 1.0});
  Tensor y2 = x2.exp().sum();
  y2.backward({}, /*retain_graph=*/true);
  y2.backward();
  expect_values(x2.grad(), {2 * std::exp(0.5), 2 * std::exp(1.0)});
}

TEST(Autograd, DetachStopsGradients) {
  Tensor x = leaf({1, 2, 3});
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  // The same data: a write through the detached tensor is visible in x.
  EXPECT_EQ(d.raw_data_ptr(), x.raw_data_ptr());
  (x.detach() * x).sum().backward();
  expect_values(x.grad(), {1, 2, 3});
  Tensor h = (x * 2.0).detach();
  EXPECT_FALSE(h.requires_grad());
  EXPECT_TRUE(h.is_leaf());
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = leaf({1, 2});
  EXPECT_TRUE(is_grad_enabled());
  Tensor y;
  {
    NoGradGuard guard;
    EXPECT_FALSE(is_grad_enabled());
    y = (x * 2.0).exp();
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    EXPECT_EQ(y.grad_fn_name(), "");
    {
      AutoGradMode enable(true);
      EXPECT_TRUE((x * 2.0).requires_grad());
    }
    EXPECT_FALSE(is_grad_enabled());
    // Parameter updates are allowed without grad mode.
    x.add_(1.0);
  }
  EXPECT_TRUE(is_grad_enabled());
  expect_values(x, {2, 3});
  EXPECT_FALSE(y.requires_grad());
  expect_error([&] { y.sum().backward(); }, {"does not require grad"});
}

TEST(Autograd, RequiresGradOnlyForFloatingPointLeaves) {
  Tensor i = arange(3);
  expect_error([&] { i.requires_grad_(); }, {"requires_grad_", "floating"});
  Tensor b = from_vector(std::vector<bool>{true, false});
  expect_error([&] { b.requires_grad_(); }, {"requires_grad_"});
  // Turning it off on an integer tensor is harmless.
  EXPECT_NO_THROW(i.requires_grad_(false));
  Tensor x = leaf({1, 2});
  Tensor y = x * 2.0;
  expect_error([&] { y.requires_grad_(false); }, {"leaf"});
  // Float32 is fine.
  Tensor f = ones({2});
  f.requires_grad_();
  EXPECT_TRUE(f.requires_grad());
}

TEST(Autograd, GradDoesNotTouchDotGrad) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = (x * x).sum();
  std::vector<Tensor> g = autograd::grad({y}, {x});
  ASSERT_EQ(g.size(), 1u);
  expect_values(g[0], {2, 4, 6});
  EXPECT_FALSE(g[0].requires_grad());
  EXPECT_FALSE(x.grad().defined());
  // Non-scalar output with an explicit grad_output.
  Tensor z = x * 3.0;
  g = autograd::grad({z}, {x}, {from_vector<double>({1, 0, 2})});
  expect_values(g[0], {3, 0, 6});
  EXPECT_FALSE(x.grad().defined());
  // The gradient with respect to an intermediate.
  Tensor h = x * 2.0;
  Tensor out = (h * h).sum();
  g = autograd::grad({out}, {h, x});
  expect_values(g[0], {4, 8, 12});
  expect_values(g[1], {8, 16, 24});
}

TEST(Autograd, AllowUnused) {
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  Tensor y = (x * 2.0).sum();
  expect_error([&] { autograd::grad({y}, {x, w}, {}, true); }, {"allow_unused"});
  std::vector<Tensor> g = autograd::grad({y}, {x, w}, {}, true, false, /*allow_unused=*/true);
  ASSERT_EQ(g.size(), 2u);
  expect_values(g[0], {2, 2});
  EXPECT_FALSE(g[1].defined());
  // An input that does not require grad at all is an error either way.
  Tensor c = from_vector<double>({1, 2});
  expect_error([&] { autograd::grad({(x * c).sum()}, {c}, {}, false, false, true); },
               {"does not require grad"});
}

// ------------------------------------------------------------------------------- higher order

// A 3->4->1 MLP with tanh, its parameters as leaves.
struct Mlp {
  Tensor w1, b1, w2, b2;
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
};

Tensor mlp_loss(const std::vector<Tensor>& p, const Tensor& x) {
  return linear(tanh(linear(x, p[0], p[1])), p[2], p[3]).pow(2).sum();
}

std::vector<Tensor> gradient_at(const std::vector<Tensor>& p, const Tensor& x) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : p) {
    Tensor l = t.detach().clone();
    l.requires_grad_();
    leaves.push_back(l);
  }
  return autograd::grad({mlp_loss(leaves, x)}, leaves);
}

TEST(Autograd, HessianVectorProductOfAnMlp) {
  Tensor x = random_tensor({2, 3}, kFloat64, -1, 1);
  std::vector<Tensor> p = {
      random_tensor({4, 3}, kFloat64, -1, 1), random_tensor({4}, kFloat64, -1, 1),
      random_tensor({1, 4}, kFloat64, -1, 1), random_tensor({1}, kFloat64, -1, 1)};
  for (Tensor& t : p) t.requires_grad_();
  std::vector<Tensor> v;
  for (const Tensor& t : p) v.push_back(random_tensor(t.sizes(), kFloat64, -1, 1));

  std::vector<Tensor> g = autograd::grad({mlp_loss(p, x)}, p, {}, std::nullopt,
                                         /*create_graph=*/true);
  Tensor gv = zeros({}, kFloat64);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(g[i].requires_grad()) << "gradient " << i << " has no history";
    gv = gv + (g[i] * v[i]).sum();
  }
  std::vector<Tensor> hv = autograd::grad({gv}, p);

  // H v ~ (grad(p + eps v) - grad(p - eps v)) / (2 eps).
  const double eps = 1e-5;
  std::vector<Tensor> plus, minus;
  for (size_t i = 0; i < p.size(); ++i) {
    plus.push_back(p[i].detach() + v[i] * eps);
    minus.push_back(p[i].detach() - v[i] * eps);
  }
  std::vector<Tensor> gp = gradient_at(plus, x), gm = gradient_at(minus, x);
  for (size_t i = 0; i < p.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    std::vector<double> expected = vals((gp[i] - gm[i]) / (2 * eps));
    expect_close(hv[i], expected, p[i].sizes(), kFloat64, 1e-5, 1e-7);
  }
  // The whole MLP also passes gradgradcheck.
  expect_gradcheck(
      [x](const std::vector<Tensor>& in) { return std::vector<Tensor>{mlp_loss(in, x)}; }, p, true);
}

TEST(Autograd, BackwardWithCreateGraph) {
  Tensor x = leaf({0.5, 1.5});
  (x.pow(3)).sum().backward({}, std::nullopt, /*create_graph=*/true);
  // x.grad() = 3x^2 carries history; its gradient is 6x.
  EXPECT_TRUE(x.grad().requires_grad());
  std::vector<Tensor> g2 = autograd::grad({x.grad().sum()}, {x});
  expect_values(g2[0], {3, 9});
}

// A .grad made with create_graph has a history that leads back to its leaf (its accumulator, and
// the leaf saved by the nodes of that history): held strongly, every leaf and graph of such a loop
// would stay alive as a reference cycle.
TEST(Autograd, HessianVectorProductsWithCreateGraphFreeTheirGraphs) {
  const Tensor v = from_vector(std::vector<double>{0.25, -1.0, 2.0});
  auto hessian_vector_product = [&v] {
    Tensor x = leaf({0.5, 1.5, -2.0});
    (x.pow(3) * sin(x)).sum().backward({}, std::nullopt, /*create_graph=*/true);
    EXPECT_TRUE(x.grad().requires_grad());
    return autograd::grad({(x.grad() * v).sum()}, {x})[0];
  };
  Tensor first = hessian_vector_product();
  const int64_t live = detail::live_autograd_nodes();
  for (int i = 0; i < 200; ++i) hessian_vector_product();
  EXPECT_EQ(detail::live_autograd_nodes(), live) << "autograd nodes leaked";
  // H v for f = sum(x^3 sin x): f'' = 6x sin x + 6x^2 cos x - x^3 sin x, diagonal.
  std::vector<double> x{0.5, 1.5, -2.0}, vv{0.25, -1.0, 2.0}, expected;
  for (size_t i = 0; i < x.size(); ++i) {
    double a = x[i];
    expected.push_back(vv[i] *
                       (6 * a * std::sin(a) + 6 * a * a * std::cos(a) - a * a * a * std::sin(a)));
  }
  expect_values(first, expected);
  // The leaf's saved value still serves a second-order backward while the leaf lives.
  Tensor y = leaf({0.5, 1.5});
  (y * y * y).sum().backward({}, std::nullopt, /*create_graph=*/true);
  Tensor g = y.grad();
  y.mutable_grad() = Tensor();
  g.sum().backward();
  expect_values(y.grad(), {3, 9});
}

// ------------------------------------------------------------------------------- in-place

TEST(Autograd, ModifyingASavedTensorIsDetected) {
  Tensor x = leaf({0.5, 1.0});
  Tensor y = x.exp();  // exp saves its output
  y.add_(1.0);
  expect_error([&] { y.sum().backward(); }, {"exp", "in-place"});
  // Saved inputs too: mul saves both operands.
  Tensor a = leaf({1, 2});
  Tensor h = a * 2.0;
  Tensor z = h * h;
  h.mul_(2.0);
  expect_error([&] { z.sum().backward(); }, {"mul", "in-place"});
}

TEST(Autograd, InPlaceOnALeafRequiringGradThrows) {
  Tensor x = leaf({1, 2});
  expect_error([&] { x.add_(1.0); }, {"leaf"});
  expect_error([&] { x.mul_(x); }, {"leaf"});
  expect_error([&] { x.narrow(0, 0, 1).zero_(); }, {"leaf"});
  // Nothing was written.
  expect_values(x, {1, 2});
}

TEST(Autograd, InPlaceOnANonLeaf) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * 2.0;
  uint64_t before = y.version();
  y.mul_(3.0);
  EXPECT_GT(y.version(), before);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  expect_values(x.grad(), {6, 6, 6});

  Tensor a = leaf({1, 2, 3});
  Tensor w = leaf({0.5, -1, 2});
  Tensor h = a * 2.0;
  h.mul_(3.0);
  h.add_(w);  // h = 6a + w
  (h * h).sum().backward();
  std::vector<double> av = {1, 2, 3}, wv = {0.5, -1, 2}, ga, gw;
  for (size_t i = 0; i < 3; ++i) {
    double hv = 6 * av[i] + wv[i];
    ga.push_back(12 * hv);
    gw.push_back(2 * hv);
  }
  expect_values(a.grad(), ga);
  expect_values(w.grad(), gw);

  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0] * 2.0;
        t.mul_(in[1]);
        t.sub_(in[0], 0.5);
        t.div_(in[1]);
        return std::vector<Tensor>{t};
      },
      {leaf({1, 2, 3}), leaf({0.7, -1.3, 2})}, true);
}

TEST(Autograd, InPlaceOnAViewOfANonLeaf) {
  Tensor x = random_tensor({4, 3}, kFloat64);
  Tensor w = random_tensor({3}, kFloat64);
  x.requires_grad_();
  w.requires_grad_();
  // The base's history includes the in-place change made through its view.
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor y = in[0] * 1.0;
        y.narrow(0, 0, 2).mul_(in[1]);
        return std::vector<Tensor>{y};
      },
      {x, w}, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        // Not exp: it saves its output, which the in-place ops below would invalidate.
        Tensor y = in[0] * 2.0;
        y.select(1, 2).add_(in[1].narrow(0, 0, 1).expand({4}));
        y.t().slice(1, 1, std::nullopt, 2).mul_(2.0);
        return std::vector<Tensor>{sin(y)};
      },
      {x, w}, true);
  // Explicit values: y = x * 1 with rows 0-1 scaled by w.
  Tensor a = leaf({1, 2, 3, 4}, {2, 2});
  Tensor s = leaf({10});
  Tensor y = a * 1.0;
  y.select(0, 1).mul_(s);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  expect_values(a.grad(), {1, 1, 10, 10});
  expect_values(s.grad(), {7});
}

TEST(Autograd, CopyIntoASliceOfZeros) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor z = zeros({4, 3}, kFloat64);
  EXPECT_FALSE(z.requires_grad());
  z.narrow(0, 1, 2).copy_(x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_FALSE(z.is_leaf());
  (z * z).sum().backward();
  expect_values(x.grad(), {2, 4, 6, 8, 10, 12});

  // copy_ overwrites: the old values of the slice get no gradient.
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[1] * 1.0;
        t.narrow(0, 1, 2).copy_(in[0]);
        return std::vector<Tensor>{t * t};
      },
      {leaf({1, 2, 3, 4, 5, 6}, {2, 3}), leaf(vals(random_tensor({4, 3}, kFloat64)), {4, 3})},
      true);
  // A float32 source copied into a float64 slice gets a float32 gradient.
  Tensor f = ones({2, 3});
  f.requires_grad_();
  Tensor d = zeros({3, 3}, kFloat64);
  d.narrow(0, 0, 2).copy_(f);
  (d * 2.0).sum().backward();
  ASSERT_TRUE(f.grad().defined());
  EXPECT_EQ(f.grad().dtype(), kFloat32);
  expect_values(f.grad(), {2, 2, 2, 2, 2, 2});
}

TEST(Autograd, ViewsSeeInPlaceChangesOfTheirBase) {
  // v is taken before the base is modified in place; reading v afterwards must use the new
  // history (its values changed, so must its gradient).
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor y = in[0] * 1.0;
        Tensor v = y.narrow(0, 0, 2);
        y.mul_(in[1]);
        return std::vector<Tensor>{v * 1.0};
      },
      {leaf(vals(random_tensor({3, 2}, kFloat64)), {3, 2}), leaf({0.5, -2})}, true);
  // ... and through a sibling view.
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor y = in[0] * 1.0;
        Tensor row0 = y.select(0, 0);
        Tensor col1 = y.select(1, 1);
        col1.mul_(in[1].sum());
        return std::vector<Tensor>{row0.exp(), y};
      },
      {leaf(vals(random_tensor({3, 2}, kFloat64)), {3, 2}), leaf({0.5, -2})}, true);
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor w = leaf({3});
  Tensor y = x * 1.0;
  Tensor v = y.select(0, 0);
  y.mul_(w);
  v.sum().backward();
  expect_values(x.grad(), {3, 3, 0, 0});
  expect_values(w.grad(), {3});
}

TEST(Autograd, PiecesOfChunkSplitUnbind) {
  Tensor x = leaf(vals(arange(12).to(kFloat64)), {6, 2});
  (x.chunk(3)[1] * 2.0).sum().backward();
  expect_values(x.grad(), {0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0});

  Tensor y = leaf(vals(arange(12).to(kFloat64)), {6, 2});
  auto parts = y.split(std::vector<int64_t>{1, 3, 2});
  (parts[0] * 3.0 + parts[2].sum(std::vector<int64_t>{0})).sum().backward();
  expect_values(y.grad(), {3, 3, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});

  Tensor z = leaf(vals(arange(6).to(kFloat64)), {2, 3});
  auto cols = z.unbind(1);
  (cols[2] * cols[2]).sum().backward();
  expect_values(z.grad(), {0, 0, 4, 0, 0, 10});

  Tensor s = leaf(vals(arange(5).to(kFloat64)));
  auto pieces = s.split(2);
  pieces.back().backward(from_vector<double>({5}));
  expect_values(s.grad(), {0, 0, 0, 0, 5});
}

// ------------------------------------------------------------------------------- dtypes, shapes

TEST(Autograd, GradientHasTheInputsDtype) {
  Tensor x = ones({3});  // float32
  x.requires_grad_();
  Tensor w = leaf({1, 2, 3});  // float64
  Tensor y = x * w;
  EXPECT_EQ(y.dtype(), kFloat64);
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_EQ(w.grad().dtype(), kFloat64);
  expect_values(x.grad(), {1, 2, 3});
  expect_values(w.grad(), {1, 1, 1});

  Tensor f = ones({2});
  f.requires_grad_();
  (f.to(kFloat64) * 3.0).sum().backward();
  EXPECT_EQ(f.grad().dtype(), kFloat32);
  expect_values(f.grad(), {3, 3});
}

TEST(Autograd, BroadcastGradientsSumToTheInputShape) {
  Tensor a = leaf({1, 2, 3}, {3, 1});
  Tensor b = leaf({1, 10, 100, 1000}, {1, 4});
  (a * b).sum().backward();
  EXPECT_EQ(a.grad().sizes(), (Shape{3, 1}));
  EXPECT_EQ(b.grad().sizes(), (Shape{1, 4}));
  expect_values(a.grad(), {1111, 1111, 1111});
  expect_values(b.grad(), {6, 6, 6, 6});

  Tensor s = leaf({2}, {});  // 0-dim
  Tensor m = leaf(vals(arange(6).to(kFloat64)), {2, 3});
  Tensor v = leaf({1, 2, 3});
  (m * s + v).sum().backward();
  EXPECT_EQ(s.grad().sizes(), Shape{});
  expect_values(s.grad(), {15});
  expect_values(v.grad(), {2, 2, 2});
  expect_values(m.grad(), {2, 2, 2, 2, 2, 2});

  // An explicit expand sums back the same way.
  Tensor e = leaf({1, 2});
  (e.unsqueeze(0).expand({3, 2}) * 2.0).sum().backward();
  expect_values(e.grad(), {6, 6});
}

TEST(Autograd, EmptyTensors) {
  Tensor x = zeros({0, 3}, kFloat64);
  x.requires_grad_();
  x.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().sizes(), (Shape{0, 3}));
}

// ------------------------------------------------------------------------------- deep graphs

TEST(Autograd, DeepChainBackwardAndDestruction) {
  constexpr int kDepth = 200000;
  Tensor x = leaf({1, 2});
  {
    Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = y + 1.0;
    y.sum().backward();
  }
  expect_values(x.grad(), {1, 1});
  // A chain dropped without a backward pass must be freed without recursing either.
  {
    Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = y * 1.0;
  }
  // And one freed while a retained graph is still alive.
  {
    Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = y - 0.5;
    y.sum().backward({}, /*retain_graph=*/true);
  }
  expect_values(x.grad(), {2, 2});
}

}  // namespace
}  // namespace kiln
