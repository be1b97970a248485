// torch.nn.functional's activations and losses (kiln/nn_functional.h) and their modules: values
// against float64 references over random shapes (size-0 and size-1 dims, non-contiguous inputs),
// gradients by finite differences (first and second order), gradients at the kinks as torch's
// backward gives them, lazy and traced results against eager mode, fusion into one kernel, and
// errors that name the op and the shapes.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kiln/testing.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::layouts;
using testing::random_shape;
using testing::random_tensor;
using testing::values;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double rtol_for(DType dt) {
  return dt == kFloat64 ? 1e-12 : 2e-5;
}
double atol_for(DType dt) {
  return dt == kFloat64 ? 1e-12 : 2e-6;
}

// ----------------------------------------------------------------------------------- activations
struct Activation {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  std::function<double(double)> ref;  // float64 reference, as torch's kernel
};

double relu6_plus_3(double x) {
  return std::min(std::max(x + 3, 0.0), 6.0);
}
double log_sigmoid_ref(double x) {
  return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x)));
}

std::vector<Activation> activations() {
  const double selu_alpha = 1.6732632423543772848170429916717;
  const double selu_scale = 1.0507009873554804934193349852946;
  return {
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x); },
       [](double x) { return x > 0 ? x : x * 0.01; }},
      {"leaky_relu(0.2)", [](const Tensor& x) { return leaky_relu(x, 0.2); },
       [](double x) { return x > 0 ? x : x * 0.2; }},
      {"elu", [](const Tensor& x) { return elu(x); },
       [](double x) { return x > 0 ? x : std::expm1(x); }},
      {"elu(0.5)", [](const Tensor& x) { return elu(x, 0.5); },
       [](double x) { return x > 0 ? x : 0.5 * std::expm1(x); }},
      {"selu", [](const Tensor& x) { return selu(x); },
       [=](double x) { return selu_scale * (x > 0 ? x : selu_alpha * std::expm1(x)); }},
      {"hardswish", [](const Tensor& x) { return hardswish(x); },
       [](double x) { return x * relu6_plus_3(x) / 6; }},
      {"hardsigmoid", [](const Tensor& x) { return hardsigmoid(x); },
       [](double x) { return relu6_plus_3(x) / 6; }},
      {"mish", [](const Tensor& x) { return mish(x); },
       [](double x) { return x * std::tanh(std::log1p(std::exp(x))); }},
      {"log_sigmoid", [](const Tensor& x) { return log_sigmoid(x); }, log_sigmoid_ref},
      {"softsign", [](const Tensor& x) { return softsign(x); },
       [](double x) { return x / (1 + std::abs(x)); }},
  };
}

std::vector<double> map_values(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> v = values(x);
  for (double& e : v) e = f(e);
  return v;
}

TEST(Activations, MatchFloat64ReferencesOnRandomShapesAndLayouts) {
  for (int trial = 0; trial < 10; ++trial) {
    const Shape shape = random_shape(0, 4, 5);
    const DType dt = trial % 2 ? kFloat64 : kFloat32;
    const Tensor x = random_tensor(shape, dt, -6, 6);
    for (const Activation& a : activations()) {
      const std::vector<double> want = map_values(x, a.ref);
      for (const auto& [layout, t] : layouts(x)) {
        SCOPED_TRACE(a.name + " " + layout + " " + detail::describe(x));
        expect_close(a.fn(t), want, shape, dt, rtol_for(dt), atol_for(dt));
      }
    }
  }
}

TEST(Activations, SpecialValues) {
  const Tensor x =
      from_vector(std::vector<double>{-300, -40, -3, -1e-8, 0, 1e-8, 3, 40, 300, kNaN});
  for (const Activation& a : activations()) {
    SCOPED_TRACE(a.name);
    expect_close(a.fn(x), map_values(x, a.ref), x.sizes(), kFloat64, 1e-12, 1e-300);
  }
  // log_sigmoid stays finite where log(sigmoid(x)) underflows.
  expect_close(log_sigmoid(from_vector(std::vector<float>{-200.f})), {-200.0}, {1}, kFloat32);
}

// Values for finite differences, at least 0.05 away from every kink (0 and +-3).
Tensor smooth_points(const Shape& shape) {
  std::vector<double> v = values(random_tensor(shape, kFloat64, -5, 5));
  for (double& e : v) {
    for (double kink : {-3.0, 0.0, 3.0})
      if (std::abs(e - kink) < 0.05) e = kink + 0.1;
  }
  return from_vector(v, shape);
}

TEST(Activations, GradcheckAndGradgradcheck) {
  const Tensor x = smooth_points({3, 4}).requires_grad_();
  for (const Activation& a : activations()) {
    SCOPED_TRACE(a.name);
    auto fn = [&](const std::vector<Tensor>& in) { return a.fn(in[0]); };
    EXPECT_TRUE(testing::gradcheck(fn, {x}));
    EXPECT_TRUE(testing::gradgradcheck(fn, {x}));
  }
}

// The gradient at a kink is the one torch's backward gives.
TEST(Activations, GradientsAtKinksAreTorchs) {
  auto grad_at = [](const std::function<Tensor(const Tensor&)>& f, double v) {
    Tensor x = from_vector(std::vector<double>{v}).requires_grad_();
    f(x).sum().backward();
    return x.grad().item<double>();
  };
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return leaky_relu(x, 0.2); }, 0), 0.2);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return elu(x, 0.5); }, 0), 0.5);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return hardswish(x); }, -3), -0.5);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return hardswish(x); }, 3), 1.0);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return hardsigmoid(x); }, -3), 0.0);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return hardsigmoid(x); }, 3), 0.0);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return log_sigmoid(x); }, 0), 0.5);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return softsign(x); }, 0), 1.0);
  // At NaN, what torch's vectorized backward gives.
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return leaky_relu(x, 0.2); }, kNaN), 0.2);
  EXPECT_TRUE(std::isnan(grad_at([](const Tensor& x) { return elu(x, 0.5); }, kNaN)));
  EXPECT_TRUE(std::isnan(grad_at([](const Tensor& x) { return hardswish(x); }, kNaN)));
  // Far out, the branch not taken does not overflow into the gradient.
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return elu(x); }, 800), 1.0);
  EXPECT_DOUBLE_EQ(grad_at([](const Tensor& x) { return log_sigmoid(x); }, -800), 1.0);
}

// Found by the libtorch differential tester: torch's backward selects (or combines before
// multiplying) where the gradient through the forward's ops multiplies an infinite or NaN output
// gradient by zero, or adds two infinite terms.
TEST(Activations, GradientsWithNonFiniteOutputGradientsAreTorchs) {
  auto grad_of = [](const Tensor& x, const std::function<Tensor(const Tensor&)>& loss) {
    Tensor leaf = x.clone().requires_grad_();
    loss(leaf).backward();
    return values(leaf.grad());
  };
  const double inf = kInf;
  // hardswish below -3: 0, though erf's gradient at the NaN output is NaN.
  EXPECT_EQ(grad_of(from_vector(std::vector<double>{-inf}),
                    [](const Tensor& x) { return erf(relu(hardswish(x))).sum(); }),
            std::vector<double>{0.0});
  // mish far out: g (t + x sigmoid(x) (1 - t^2)) with 1 - t^2 = 0, not x g overflowing first.
  EXPECT_EQ(grad_of(from_vector(std::vector<float>{3.4e38f}),
                    [](const Tensor& x) { return (mish(x) * -1.75).sum(); }),
            std::vector<double>{-1.75});
  // log_sigmoid under an infinite gradient: -inf, not inf - inf.
  const std::vector<double> g =
      grad_of(from_vector(std::vector<float>{-1.52786911f}),
              [](const Tensor& x) { return pow(1e-30, log_sigmoid(x)).sum(); });
  EXPECT_EQ(g, std::vector<double>{-inf});
  // hardsigmoid at NaN: 0, as torch's (-3 < x < 3 fails).
  EXPECT_EQ(grad_of(from_vector(std::vector<double>{kNaN}),
                    [](const Tensor& x) { return hardsigmoid(x).sum(); }),
            std::vector<double>{0.0});
}

TEST(Activations, LazyMatchesEager) {
  const Tensor x = testing::input({5, 7}, kFloat32, -6, 6);
  for (const Activation& a : activations())
    testing::check_lazy(a.name, [&] { return std::vector<Tensor>{a.fn(x * 2.0) + 1.0}; });
}

// Each activation is elementwise ops only: with its neighbours, one kernel.
TEST(Activations, FuseIntoOneKernelWithNeighbours) {
  const Tensor x = testing::input({33, 65}, kFloat32, -6, 6);
  for (const Activation& a : activations()) {
    SCOPED_TRACE(a.name);
    testing::Fn fn = [&](const testing::Inputs& in) {
      return testing::Inputs{a.fn(in[0] * 1.5 + 0.25) * 2.0};
    };
    testing::Planned p = testing::plan_of(fn, {x});
    EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
    EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
    testing::expect_fused_equals_eager(fn, {x}, a.name);
  }
}

TEST(Activations, RejectNonFloatingInputsNamingTheOp) {
  const Tensor i = arange(6).view({2, 3});
  for (const Activation& a : activations()) {
    const std::string op = a.name.substr(0, a.name.find('('));
    expect_error([&] { a.fn(i); }, {op, "floating-point", "int64[2, 3]"});
  }
  EXPECT_EQ(values(i), (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

TEST(Activations, Modules) {
  const Tensor x = random_tensor({2, 3, 4}, kFloat64);
  auto same = [&](nn::Module&& m, const Tensor& want, const char* name) {
    EXPECT_EQ(m.name(), name);
    expect_close(m(x), values(want), want.sizes(), kFloat64, 0, 0);
  };
  same(nn::LeakyReLU(0.3), leaky_relu(x, 0.3), "LeakyReLU");
  same(nn::LeakyReLU(), leaky_relu(x), "LeakyReLU");
  same(nn::ELU(0.7), elu(x, 0.7), "ELU");
  same(nn::SELU(), selu(x), "SELU");
  same(nn::Hardswish(), hardswish(x), "Hardswish");
  same(nn::Hardsigmoid(), hardsigmoid(x), "Hardsigmoid");
  same(nn::Mish(), mish(x), "Mish");
  same(nn::LogSigmoid(), log_sigmoid(x), "LogSigmoid");
  same(nn::Softsign(), softsign(x), "Softsign");
  same(nn::Softmax(1), softmax(x, 1), "Softmax");
  same(nn::LogSoftmax(-1), log_softmax(x, -1), "LogSoftmax");
}

// ------------------------------------------------------------------------ elementwise losses
// A reduction of float64 terms as torch's: none, mean (NaN for none) or sum.
std::vector<double> reduce_ref(const std::vector<double>& terms, Reduction r) {
  if (r == Reduction::None) return terms;
  double s = 0;
  for (double t : terms) s += t;
  return {r == Reduction::Sum ? s : s / static_cast<double>(terms.size())};
}
Shape reduced_shape(const Shape& shape, Reduction r) {
  return r == Reduction::None ? shape : Shape{};
}

const std::vector<Reduction> kReductions{Reduction::None, Reduction::Mean, Reduction::Sum};

struct PairLoss {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&, Reduction)> fn;
  std::function<double(double, double)> ref;  // the term of (input, target)
  double lo = -3, hi = 3;                     // input range
  double target_lo = -3, target_hi = 3;
};

std::vector<PairLoss> pair_losses() {
  auto huber = [](double delta) {
    return [delta](double x, double t) {
      const double z = std::abs(x - t);
      return z < delta ? 0.5 * z * z : delta * (z - 0.5 * delta);
    };
  };
  auto smooth_l1 = [](double beta) {
    return [beta](double x, double t) {
      const double z = std::abs(x - t);
      return z < beta ? 0.5 * z * z / beta : z - 0.5 * beta;
    };
  };
  auto xlogy = [](double t) { return t == 0 ? 0.0 : t * std::log(t); };
  return {
      {"l1_loss", [](auto& x, auto& t, Reduction r) { return l1_loss(x, t, r); },
       [](double x, double t) { return std::abs(x - t); }},
      {"smooth_l1_loss", [](auto& x, auto& t, Reduction r) { return smooth_l1_loss(x, t, r); },
       smooth_l1(1.0)},
      {"smooth_l1_loss(0.5)",
       [](auto& x, auto& t, Reduction r) { return smooth_l1_loss(x, t, r, 0.5); }, smooth_l1(0.5)},
      {"smooth_l1_loss(0)",
       [](auto& x, auto& t, Reduction r) { return smooth_l1_loss(x, t, r, 0.0); },
       [](double x, double t) { return std::abs(x - t); }},
      {"huber_loss", [](auto& x, auto& t, Reduction r) { return huber_loss(x, t, r); }, huber(1.0)},
      {"huber_loss(2)", [](auto& x, auto& t, Reduction r) { return huber_loss(x, t, r, 2.0); },
       huber(2.0)},
      {"kl_div", [](auto& x, auto& t, Reduction r) { return kl_div(x, t, r); },
       [=](double x, double t) { return xlogy(t) - t * x; }, -4, 0, 0, 1},
      {"kl_div(log_target)", [](auto& x, auto& t, Reduction r) { return kl_div(x, t, r, true); },
       [](double x, double t) { return std::exp(t) * (t - x); }, -4, 0, -4, 0},
      {"binary_cross_entropy",
       [](auto& x, auto& t, Reduction r) { return binary_cross_entropy(x, t, {}, r); },
       [](double x, double t) {
         return (t - 1) * std::max(std::log1p(-x), -100.0) - t * std::max(std::log(x), -100.0);
       },
       0.01, 0.99, 0, 1},
      {"binary_cross_entropy_with_logits",
       [](auto& x, auto& t, Reduction r) { return binary_cross_entropy_with_logits(x, t, {}, r); },
       [](double x, double t) { return (1 - t) * x - log_sigmoid_ref(x); }, -4, 4, 0, 1},
  };
}

TEST(Losses, MatchFloat64ReferencesOnRandomShapesAndLayouts) {
  for (int trial = 0; trial < 8; ++trial) {
    const Shape shape = random_shape(0, 3, 4);
    const DType dt = trial % 2 ? kFloat64 : kFloat32;
    for (const PairLoss& l : pair_losses()) {
      const Tensor x = random_tensor(shape, dt, l.lo, l.hi);
      Tensor t = random_tensor(shape, dt, l.target_lo, l.target_hi);
      if (l.name == "kl_div" && t.numel() > 0) t.view({-1}).narrow(0, 0, 1).zero_();  // t = 0
      std::vector<double> terms, xv = values(x), tv = values(t);
      for (size_t i = 0; i < xv.size(); ++i) terms.push_back(l.ref(xv[i], tv[i]));
      for (const auto& [layout, xl] : layouts(x)) {
        for (Reduction r : kReductions) {
          SCOPED_TRACE(l.name + " " + layout + " " + detail::describe(x) + " reduction " +
                       std::to_string(static_cast<int>(r)));
          expect_close(l.fn(xl, t, r), reduce_ref(terms, r), reduced_shape(shape, r), dt,
                       dt == kFloat64 ? 1e-11 : 1e-4, atol_for(dt));
        }
      }
    }
  }
}

TEST(Losses, BroadcastingTargetsAndWeights) {
  const Tensor x = random_tensor({3, 4}, kFloat64), t = random_tensor({4}, kFloat64);
  std::vector<double> want;
  const std::vector<double> xv = values(x), tv = values(t);
  for (size_t i = 0; i < xv.size(); ++i) want.push_back(std::abs(xv[i] - tv[i % 4]));
  expect_close(l1_loss(x, t, Reduction::None), want, {3, 4}, kFloat64, 1e-15, 0);

  // binary_cross_entropy's weight and the logits' pos_weight broadcast along the last dim.
  const Tensor p = random_tensor({3, 4}, kFloat64, 0.05, 0.95);
  const Tensor y = random_tensor({3, 4}, kFloat64, 0, 1);
  const Tensor w = random_tensor({4}, kFloat64, 0.5, 2), pw = random_tensor({4}, kFloat64, 0.5, 3);
  std::vector<double> bce, bcel;
  const std::vector<double> pv = values(p), yv = values(y), wv = values(w), pwv = values(pw);
  for (size_t i = 0; i < pv.size(); ++i) {
    const double wi = wv[i % 4], lw = 1 + (pwv[i % 4] - 1) * yv[i];
    bce.push_back(-wi * (yv[i] * std::log(pv[i]) + (1 - yv[i]) * std::log1p(-pv[i])));
    bcel.push_back(wi * ((1 - yv[i]) * xv[i] - lw * log_sigmoid_ref(xv[i])));
  }
  expect_close(binary_cross_entropy(p, y, w, Reduction::None), bce, {3, 4}, kFloat64, 1e-12, 0);
  expect_close(binary_cross_entropy_with_logits(x, y, w, Reduction::Sum, pw),
               reduce_ref(bcel, Reduction::Sum), {}, kFloat64, 1e-12, 0);
}

TEST(Losses, SpecialValues) {
  // torch clamps binary_cross_entropy's logs at -100.
  const Tensor p = from_vector(std::vector<double>{0, 1, 0, 1});
  const Tensor y = from_vector(std::vector<double>{1, 0, 0, 1});
  expect_close(binary_cross_entropy(p, y, {}, Reduction::None), {100, 100, 0, 0}, {4}, kFloat64);
  // Finite gradients there too (torch's (x - t) / max(x (1 - x), 1e-12)).
  Tensor leaf = p.clone().requires_grad_();
  binary_cross_entropy(leaf, y, {}, Reduction::Sum).backward();
  expect_close(leaf.grad(), {-1e12, 1e12, 0, 0}, {4}, kFloat64);
  // The logits' form is stable far out.
  const Tensor x = from_vector(std::vector<float>{-200.f, 200.f});
  const Tensor t = from_vector(std::vector<float>{1.f, 0.f});
  expect_close(binary_cross_entropy_with_logits(x, t, {}, Reduction::None), {200, 200}, {2},
               kFloat32);
  // kl_div with reduction batchmean: the sum over the batch size.
  const Tensor lp = log_softmax(random_tensor({3, 5}, kFloat64), 1);
  const Tensor q = softmax(random_tensor({3, 5}, kFloat64), 1);
  const double total = kl_div(lp, q, Reduction::Sum).item<double>();
  EXPECT_NEAR(kl_div(lp, q, kBatchMean).item<double>(), total / 3, 1e-14);
  EXPECT_NEAR(kl_div(lp.select(0, 0), q.select(0, 0), kBatchMean).item<double>(),
              kl_div(lp.select(0, 0), q.select(0, 0), Reduction::Sum).item<double>() / 5, 1e-14);
  // An infinite difference: torch's gradients (the clamp of d), not 0 * inf from the quadratic
  // branch (found by the differential tester).
  for (bool huber : {false, true}) {
    Tensor in = from_vector(std::vector<double>{2.5, 1.0}).requires_grad_();
    const Tensor inf_target = from_vector(std::vector<double>{kInf, -kInf});
    (huber ? huber_loss(in, inf_target, Reduction::Sum, 0.5)
           : smooth_l1_loss(in, inf_target, Reduction::Sum, 2.0))
        .backward();
    expect_close(in.grad(), huber ? std::vector<double>{-0.5, 0.5} : std::vector<double>{-1, 1},
                 {2}, kFloat64, 0, 0);
  }
  // Mean over nothing is NaN, as torch's.
  EXPECT_TRUE(std::isnan(l1_loss(zeros({0, 3}), zeros({0, 3})).item<double>()));
}

TEST(Losses, GradcheckAndGradgradcheck) {
  for (const PairLoss& l : pair_losses()) {
    SCOPED_TRACE(l.name);
    Tensor x = random_tensor({2, 3}, kFloat64, l.lo, l.hi);
    if (l.name.rfind("kl_div", 0) != 0)  // kinks at x = t: keep x away from the targets
      x = x + 0.2;
    Tensor t = random_tensor({2, 3}, kFloat64, l.target_lo, l.target_hi);
    if (l.name.find("binary") == std::string::npos && l.name.find("kl_div") == std::string::npos)
      t = x - random_tensor({2, 3}, kFloat64, 0.1, 3) * (1 - 2 * gt(x, 0).to(kFloat64));
    if (l.name == "binary_cross_entropy") x = random_tensor({2, 3}, kFloat64, 0.1, 0.9);
    x.requires_grad_();
    t.requires_grad_();
    for (Reduction r : kReductions) {
      auto fn = [&](const std::vector<Tensor>& in) { return l.fn(in[0], in[1], r); };
      EXPECT_TRUE(testing::gradcheck(fn, {x, t}));
      EXPECT_TRUE(testing::gradgradcheck(fn, {x, t}));
    }
  }
  const Tensor x = random_tensor({2, 3}, kFloat64).requires_grad_();
  const Tensor y = random_tensor({2, 3}, kFloat64, 0, 1);
  const Tensor w = random_tensor({3}, kFloat64, 0.5, 2).requires_grad_();
  const Tensor pw = random_tensor({3}, kFloat64, 0.5, 2).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    return binary_cross_entropy_with_logits(in[0], y, in[1], Reduction::Mean, in[2]);
  };
  EXPECT_TRUE(testing::gradcheck(fn, {x, w, pw}));
  EXPECT_TRUE(testing::gradgradcheck(fn, {x, w, pw}));
}

TEST(Losses, LazyMatchesEager) {
  const Tensor x = testing::input({4, 6}), t = testing::input({4, 6});
  const Tensor p = testing::input({4, 6}, kFloat32, 0.05, 0.95);
  const Tensor y = testing::input({4, 6}, kFloat32, 0, 1), w = testing::input({6}, kFloat32, 0, 2);
  for (Reduction r : kReductions) {
    testing::check_lazy("losses " + std::to_string(static_cast<int>(r)), [&] {
      return std::vector<Tensor>{l1_loss(x * 2.0, t, r),
                                 smooth_l1_loss(x, t, r, 0.5),
                                 huber_loss(x, t, r, 2),
                                 kl_div(log_softmax(x, 1), y, r),
                                 kl_div(x, t, r, true),
                                 binary_cross_entropy(p, y, w, r),
                                 binary_cross_entropy_with_logits(x, y, w, r, w)};
    });
  }
  testing::check_lazy("kl_div batchmean",
                      [&] { return std::vector<Tensor>{kl_div(x, y, kBatchMean)}; });
}

TEST(Losses, BadInputsRaiseNamingTheOpAndShapes) {
  const Tensor x = random_tensor({2, 3}), t = random_tensor({3, 2});
  const std::vector<double> before = values(x);
  expect_error([&] { l1_loss(x, t); }, {"l1_loss", "[2, 3]", "[3, 2]"});
  expect_error([&] { smooth_l1_loss(x, t); }, {"smooth_l1_loss", "[2, 3]", "[3, 2]"});
  expect_error([&] { smooth_l1_loss(x, x, Reduction::Mean, -1); }, {"smooth_l1_loss", "beta"});
  expect_error([&] { huber_loss(x, x, Reduction::Mean, 0); }, {"huber_loss", "delta"});
  expect_error([&] { kl_div(x, t); }, {"kl_div", "[2, 3]", "[3, 2]"});
  expect_error(
      [&] {
        binary_cross_entropy(x, x.view({3, 2}));
      },
      {"binary_cross_entropy", "[2, 3]", "[3, 2]"});
  expect_error([&] { binary_cross_entropy(x, x, ones({4})); },
               {"binary_cross_entropy", "weight", "[4]", "[2, 3]"});
  expect_error(
      [&] {
        binary_cross_entropy_with_logits(x, x.view({3, 2}));
      },
      {"binary_cross_entropy_with_logits", "[2, 3]", "[3, 2]"});
  expect_error([&] { binary_cross_entropy_with_logits(x, x, {}, Reduction::Mean, ones({2})); },
               {"binary_cross_entropy_with_logits", "pos_weight", "[2]"});
  expect_error([&] { l1_loss(arange(6).view({2, 3}), x); }, {"l1_loss", "int64[2, 3]"});
  EXPECT_EQ(values(x), before);
}

// --------------------------------------------------------------------- nll_loss, cross_entropy
// A class-loss case: input [N, C, K...] (or [C]) and its targets.
struct ClassCase {
  Shape shape;
  std::vector<int64_t> targets;  // classes or ignore_index
};

Shape target_shape(const Shape& input) {
  if (input.size() == 1) return {};
  Shape s{input[0]};
  s.insert(s.end(), input.begin() + 2, input.end());
  return s;
}

// The input's shape with the class dim; a random target for it with some ignored entries.
ClassCase class_case(const Shape& shape, int64_t ignore_index) {
  ClassCase c{shape, {}};
  const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
  const int64_t count = detail::shape_numel(target_shape(shape));
  std::uniform_int_distribution<int64_t> pick(0, C);  // C: ignored
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = C == 0 ? C : pick(testing::rng());
    c.targets.push_back(k == C ? ignore_index : k);
  }
  return c;
}

// K of an input [N, C, K...]: the positions per row.
int64_t positions(const Shape& input) {
  int64_t K = 1;
  for (size_t i = 2; i < input.size(); ++i) K *= input[i];
  return K;
}

// torch's nll_loss on float64 log-probabilities lp [N, C, K] (K = 1 for [N, C] or [C]).
std::vector<double> nll_ref(const std::vector<double>& lp, const ClassCase& c,
                            const std::vector<double>& weight, Reduction r, int64_t ignore_index,
                            double* total_weight) {
  const int64_t C = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
  const int64_t count = static_cast<int64_t>(c.targets.size());
  const int64_t K = positions(c.shape);
  std::vector<double> terms;
  double sum = 0, weights = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = c.targets[i], n = i / K, k = i % K;
    const double w = t == ignore_index ? 0 : weight.empty() ? 1 : weight[t];
    terms.push_back(t == ignore_index ? 0 : -w * lp[(n * C + t) * K + k]);
    sum += terms.back();
    weights += w;
  }
  *total_weight = weights;
  if (r == Reduction::None) return terms;
  return {r == Reduction::Sum ? sum : sum / weights};
}

// Float64 log_softmax along dim 1 (dim 0 for [C]) of row-major values.
std::vector<double> log_softmax_ref(const std::vector<double>& x, const Shape& shape) {
  const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
  int64_t K = 1;
  for (size_t i = 2; i < shape.size(); ++i) K *= shape[i];
  const int64_t N = C * K == 0 ? 0 : static_cast<int64_t>(x.size()) / (C * K);
  std::vector<double> out(x.size());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, x[(n * C + c) * K + k]);
      for (int64_t c = 0; c < C; ++c) s += std::exp(x[(n * C + c) * K + k] - m);
      for (int64_t c = 0; c < C; ++c)
        out[(n * C + c) * K + k] = x[(n * C + c) * K + k] - m - std::log(s);
    }
  }
  return out;
}

// torch's cross_entropy with class indices and label smoothing.
std::vector<double> cross_entropy_ref(const std::vector<double>& logits, const ClassCase& c,
                                      const std::vector<double>& weight, Reduction r,
                                      int64_t ignore_index, double smoothing) {
  const std::vector<double> lp = log_softmax_ref(logits, c.shape);
  double total_weight = 0;
  std::vector<double> nll = nll_ref(lp, c, weight, r, ignore_index, &total_weight);
  const int64_t C = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
  const int64_t count = static_cast<int64_t>(c.targets.size());
  const int64_t K = positions(c.shape);
  std::vector<double> smooth;
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    double s = 0;
    for (int64_t k = 0; k < C; ++k)
      s -= lp[((i / K) * C + k) * K + i % K] * (weight.empty() ? 1 : weight[k]);
    smooth.push_back(c.targets[i] == ignore_index ? 0 : s);
    sum += smooth.back();
  }
  if (r == Reduction::Sum) smooth = {sum};
  if (r == Reduction::Mean) smooth = {sum / total_weight};
  for (size_t i = 0; i < nll.size(); ++i)
    nll[i] = (1 - smoothing) * nll[i] + smooth[i] * smoothing / static_cast<double>(C);
  return nll;
}

const std::vector<Shape> kClassShapes{{5},       {4, 3},    {1, 1},      {0, 3},
                                      {3, 4, 2}, {2, 3, 0}, {2, 3, 2, 1}};

TEST(ClassLosses, NllLossWithWeightAndIgnoreIndexMatchesReference) {
  for (const Shape& shape : kClassShapes) {
    for (int64_t ignore : {int64_t{-100}, int64_t{1}}) {
      const ClassCase c = class_case(shape, ignore);
      const Tensor target = from_vector(c.targets, target_shape(shape));
      const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
      for (DType dt : {kFloat32, kFloat64}) {
        const Tensor lp = random_tensor(shape, dt, -4, 0);
        const Tensor w = random_tensor({C}, dt, 0.5, 2);
        for (bool weighted : {false, true}) {
          for (Reduction r : kReductions) {
            SCOPED_TRACE(detail::describe(lp) + " ignore " + std::to_string(ignore) +
                         (weighted ? " weighted" : "") + " reduction " +
                         std::to_string(static_cast<int>(r)));
            double total = 0;
            const std::vector<double> want = nll_ref(
                values(lp), c, weighted ? values(w) : std::vector<double>{}, r, ignore, &total);
            for (const auto& [layout, l] : layouts(lp))
              expect_close(nll_loss(l, target, weighted ? w : Tensor(), r, ignore), want,
                           reduced_shape(target.sizes(), r), dt, rtol_for(dt), atol_for(dt));
          }
        }
      }
    }
  }
}

TEST(ClassLosses, CrossEntropyWithOptionsMatchesReference) {
  for (const Shape& shape : kClassShapes) {
    const int64_t ignore = shape.size() > 2 ? 0 : -100;
    const ClassCase c = class_case(shape, ignore);
    const Tensor target = from_vector(c.targets, target_shape(shape));
    const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
    for (DType dt : {kFloat32, kFloat64}) {
      const Tensor x = random_tensor(shape, dt);
      const Tensor w = random_tensor({C}, dt, 0.5, 2);
      for (double smoothing : {0.0, 0.2}) {
        for (bool weighted : {false, true}) {
          for (Reduction r : kReductions) {
            SCOPED_TRACE(detail::describe(x) + " smoothing " + std::to_string(smoothing) +
                         (weighted ? " weighted" : "") + " reduction " +
                         std::to_string(static_cast<int>(r)));
            const std::vector<double> want = cross_entropy_ref(
                values(x), c, weighted ? values(w) : std::vector<double>{}, r, ignore, smoothing);
            for (const auto& [layout, l] : layouts(x))
              expect_close(cross_entropy(l, target, weighted ? w : Tensor(), r, ignore, smoothing),
                           want, reduced_shape(target.sizes(), r), dt, 1e-10,
                           1e-10 + atol_for(dt) * 10);
          }
        }
      }
    }
  }
  // The default ignore_index is -100, also in the short form.
  const Tensor x = random_tensor({3, 4}, kFloat64);
  const Tensor t = from_vector(std::vector<int64_t>{2, -100, 1});
  const Tensor kept = from_vector(std::vector<int64_t>{2, 1});
  EXPECT_NEAR(cross_entropy(x, t).item<double>(),
              cross_entropy(x.index_select(0, from_vector(std::vector<int64_t>{0, 2})), kept)
                  .item<double>(),
              1e-15);
}

// d cross_entropy / d logits in float64 (torch's): with a_i the nll term's scale at position i
// (output gradient g, the target's weight, 1 - smoothing, over the total weight for the mean) and
// s_i the smoothing term's (smoothing / C in place of the weight and 1 - smoothing), the gradient
// is softmax (a_i + s_i sum_j w_j) - a_i onehot - s_i w_j; 0 where the target is ignored.
std::vector<double> cross_entropy_grad_ref(const std::vector<double>& logits, const ClassCase& c,
                                           const std::vector<double>& weight,
                                           const std::vector<double>& g, Reduction r,
                                           int64_t ignore_index, double smoothing) {
  const int64_t C = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
  const int64_t K = positions(c.shape);
  const std::vector<double> lp = log_softmax_ref(logits, c.shape);
  const auto w_of = [&](int64_t j) { return weight.empty() ? 1.0 : weight[j]; };
  double total = 0, class_total = 0;
  for (int64_t t : c.targets) total += t == ignore_index ? 0 : w_of(t);
  for (int64_t j = 0; j < C; ++j) class_total += w_of(j);
  std::vector<double> grad(logits.size(), 0.0);
  for (size_t i = 0; i < c.targets.size(); ++i) {
    const int64_t t = c.targets[i], n = static_cast<int64_t>(i) / K,
                  k = static_cast<int64_t>(i) % K;
    if (t == ignore_index) continue;
    double scale = r == Reduction::None ? g[i] : g[0];
    if (r == Reduction::Mean) scale /= total;
    const double a = scale * w_of(t) * (1 - smoothing);
    const double s = scale * smoothing / static_cast<double>(C);
    for (int64_t j = 0; j < C; ++j) {
      const size_t at = static_cast<size_t>((n * C + j) * K + k);
      grad[at] = std::exp(lp[at]) * (a + s * class_total) - (j == t ? a : 0.0) - s * w_of(j);
    }
  }
  return grad;
}

// The gradient of cross_entropy with class indices, eager (its one-pass kernel for rows of
// contiguous classes, whatever the logits' layout) and lazy (the composition the fuser makes
// one kernel of), against the float64 reference.
TEST(ClassLosses, CrossEntropyGradientMatchesReferenceEagerAndLazy) {
  for (const Shape& shape : {Shape{5}, Shape{4, 3}, Shape{1, 1}, Shape{0, 3}, Shape{6, 1},
                             Shape{2, 7}, Shape{3, 4, 2}}) {
    for (int64_t ignore : {int64_t{-100}, int64_t{1}}) {
      const ClassCase c = class_case(shape, ignore);
      const Tensor target = from_vector(c.targets, target_shape(shape));
      const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
      for (DType dt : {kFloat32, kFloat64}) {
        const Tensor x = random_tensor(shape, dt, -4, 4);
        const Tensor w = random_tensor({C}, dt, 0.5, 2);
        for (double smoothing : {0.0, 0.3}) {
          for (bool weighted : {false, true}) {
            for (Reduction r : kReductions) {
              const Tensor g = random_tensor(reduced_shape(target.sizes(), r), dt, 0.5, 2);
              SCOPED_TRACE(detail::describe(x) + " ignore " + std::to_string(ignore) +
                           " smoothing " + std::to_string(smoothing) +
                           (weighted ? " weighted" : "") + " reduction " +
                           std::to_string(static_cast<int>(r)));
              const std::vector<double> want =
                  cross_entropy_grad_ref(values(x), c, weighted ? values(w) : std::vector<double>{},
                                         values(g), r, ignore, smoothing);
              auto grad_of = [&](const Tensor& l) {
                Tensor leaf = l.detach().requires_grad_();
                Tensor loss =
                    cross_entropy(leaf, target, weighted ? w : Tensor(), r, ignore, smoothing);
                return autograd::grad({loss}, {leaf}, {g})[0];
              };
              for (const auto& [layout, l] : layouts(x)) {
                SCOPED_TRACE(layout);
                Tensor eager_grad, lazy_grad;
                {
                  LazyGuard eager(false);
                  eager_grad = grad_of(l);
                }
                {
                  LazyGuard lazy(true);
                  lazy_grad = grad_of(l);
                }
                expect_close(eager_grad, want, shape, dt, rtol_for(dt) * 10, atol_for(dt) * 10);
                testing::expect_lazy_equal(lazy_grad, eager_grad, "lazy gradient");
              }
            }
          }
        }
      }
    }
  }
}

// Infinite and NaN logits give torch's values (those of log_softmax's (x - max) - log(sum)): NaN
// for a row holding +inf, whatever the target (inf - inf), for a row of -inf and for a row with a
// NaN; logits 2e30 apart give 2e30.
TEST(ClassLosses, CrossEntropyOfSpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (bool lazy : {false, true}) {
    for (DType dt : {kFloat32, kFloat64}) {
      LazyGuard mode(lazy);
      const Tensor x = from_vector(std::vector<double>{inf, 1, 0, inf, 1, 0, -inf, -inf, -inf, nan,
                                                       1, 0, 1e30, -1e30, 0},
                                   {5, 3})
                           .to(dt);
      const Tensor t = from_vector(std::vector<int64_t>{1, 0, 2, 1, 1});
      const std::vector<double> got = values(cross_entropy(x, t, Tensor(), Reduction::None));
      EXPECT_TRUE(std::isnan(got[0])) << lazy;
      EXPECT_TRUE(std::isnan(got[1])) << lazy;
      EXPECT_TRUE(std::isnan(got[2])) << lazy;
      EXPECT_TRUE(std::isnan(got[3])) << lazy;
      EXPECT_EQ(got[4], 2 * values(x)[12]) << lazy;  // lse is the max, 1e30 in dt
      // One class, unreduced: -lp is -0, as torch's.
      const double one =
          values(cross_entropy(from_vector(std::vector<double>{-2.5}, {1, 1}).to(dt),
                               from_vector(std::vector<int64_t>{0}), Tensor(), Reduction::None))[0];
      EXPECT_TRUE(one == 0 && std::signbit(one)) << lazy << " " << one;
      // Weighted smoothing with a logit at the float32 maximum: the terms overflow to +inf, not
      // inf - inf.
      const Tensor big =
          from_vector(std::vector<double>{1.7, 0.46, -2.6, 3.40282347e38, -2.7}, {1, 5});
      const Tensor w = from_vector(std::vector<double>{1.5, 1.8, 1.8, 1.75, 0.65}).to(dt);
      const double smoothed = values(cross_entropy(big.to(dt), from_vector(std::vector<int64_t>{1}),
                                                   w, Reduction::None, 0, 0.3))[0];
      const double want = cross_entropy_ref(values(big.to(dt)), ClassCase{{1, 5}, {1}}, values(w),
                                            Reduction::None, 0, 0.3)[0];  // 5.5e38
      if (dt == kFloat32)
        EXPECT_EQ(smoothed, inf) << lazy;
      else
        EXPECT_NEAR(smoothed, want, 1e-12 * want) << lazy;
      // The same at float64's maximum (in float32 it is inf, and the row's loss NaN, as torch's).
      const Tensor huge = from_vector(
          std::vector<double>{1.7, 0.46, -2.6, std::numeric_limits<double>::max(), -2.7}, {1, 5});
      if (dt == kFloat64)
        EXPECT_EQ(values(cross_entropy(huge.to(dt), from_vector(std::vector<int64_t>{1}), w,
                                       Reduction::None, 0, 0.3))[0],
                  inf)
            << lazy;
    }
  }
}

// cross_entropy saves its logits, not log_softmax's output (docs/torch-differences.md): an
// in-place write to them before the backward raises, naming the op.
TEST(ClassLosses, AnInPlaceWriteToTheLogitsBeforeBackwardRaises) {
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    const Tensor x = random_tensor({4, 3}).requires_grad_();
    const Tensor t = from_vector(std::vector<int64_t>{0, 2, 1, 1});
    Tensor h = x * 2.0;
    Tensor loss = cross_entropy(h, t);
    h.add_(1.0);
    expect_error([&] { loss.backward(); }, {"modified by an in-place operation", "cross_entropy"});
  }
}

TEST(ClassLosses, CrossEntropyWithProbabilityTargets) {
  for (const Shape& shape : {Shape{5}, Shape{4, 3}, Shape{3, 4, 2}, Shape{0, 3}}) {
    const int64_t C = shape.size() == 1 ? shape[0] : shape[1];
    int64_t K = 1;
    for (size_t i = 2; i < shape.size(); ++i) K *= shape[i];
    const Tensor x = random_tensor(shape, kFloat64);
    const Tensor p = softmax(random_tensor(shape, kFloat64), shape.size() == 1 ? 0 : 1);
    const Tensor w = random_tensor({C}, kFloat64, 0.5, 2);
    const std::vector<double> lp = log_softmax_ref(values(x), shape), pv = values(p),
                              wv = values(w);
    const int64_t rows = static_cast<int64_t>(lp.size()) / C;
    for (double smoothing : {0.0, 0.3}) {
      for (bool weighted : {false, true}) {
        std::vector<double> terms(static_cast<size_t>(rows), 0.0);
        for (size_t i = 0; i < lp.size(); ++i) {
          const int64_t k = (static_cast<int64_t>(i) / K) % C;
          const int64_t row = static_cast<int64_t>(i) / (C * K) * K + static_cast<int64_t>(i) % K;
          const double target = pv[i] * (1 - smoothing) + smoothing / static_cast<double>(C);
          terms[row] -= lp[i] * target * (weighted ? wv[k] : 1);
        }
        for (Reduction r : kReductions) {
          SCOPED_TRACE(detail::describe(x) + " smoothing " + std::to_string(smoothing) +
                       (weighted ? " weighted" : "") + " reduction " +
                       std::to_string(static_cast<int>(r)));
          // The mean divides by the number of rows, whatever the weights (as torch).
          expect_close(cross_entropy(x, p, weighted ? w : Tensor(), r, -100, smoothing),
                       reduce_ref(terms, r), reduced_shape(target_shape(shape), r), kFloat64, 1e-12,
                       1e-12);
        }
      }
    }
  }
}

TEST(ClassLosses, GradcheckAndGradgradcheck) {
  const Tensor x = random_tensor({4, 3, 2}, kFloat64).requires_grad_();
  const Tensor w = random_tensor({3}, kFloat64, 0.5, 2);
  const Tensor t = from_vector(std::vector<int64_t>{0, 2, 1, 1, -100, 2, 0, 1}, {4, 2});
  const Tensor p = softmax(random_tensor({4, 3, 2}, kFloat64), 1).requires_grad_();
  for (Reduction r : kReductions) {
    SCOPED_TRACE(static_cast<int>(r));
    auto ce = [&](const std::vector<Tensor>& in) {
      return cross_entropy(in[0], t, w, r, -100, 0.1);
    };
    auto ce_ignore_1 = [&](const std::vector<Tensor>& in) {
      return cross_entropy(in[0], remainder(abs(t), 3), w, r, 1, 0.1);
    };
    auto nll = [&](const std::vector<Tensor>& in) {
      return nll_loss(log_softmax(in[0], 1), t, w, r);
    };
    auto probs = [&](const std::vector<Tensor>& in) {
      return cross_entropy(in[0], in[1], w, r, -100, 0.2);
    };
    EXPECT_TRUE(testing::gradcheck(ce, {x}));
    EXPECT_TRUE(testing::gradgradcheck(ce, {x}));
    EXPECT_TRUE(testing::gradcheck(ce_ignore_1, {x}));
    EXPECT_TRUE(testing::gradgradcheck(ce_ignore_1, {x}));
    EXPECT_TRUE(testing::gradcheck(nll, {x}));
    EXPECT_TRUE(testing::gradgradcheck(nll, {x}));
    EXPECT_TRUE(testing::gradcheck(probs, {x, p}));
    EXPECT_TRUE(testing::gradgradcheck(probs, {x, p}));
  }
}

TEST(ClassLosses, LazyAndTracedMatchEager) {
  const Tensor x = testing::input({6, 5});
  const Tensor w = testing::input({5}, kFloat32, 0.5, 2);
  const Tensor t = from_vector(std::vector<int64_t>{0, 4, 2, 3, 2, 1});
  const Tensor p = testing::input({6, 5}, kFloat32, 0, 1);
  for (Reduction r : kReductions) {
    testing::check_lazy("class losses " + std::to_string(static_cast<int>(r)), [&] {
      return std::vector<Tensor>{cross_entropy(x, t, w, r, 2, 0.1), nll_loss(x, t, w, r),
                                 cross_entropy(x, t, Tensor(), r),
                                 cross_entropy(x, p, w, r, -100, 0.3)};
    });
  }
  // A traced training step: the loss and the parameter's gradient replay as eager mode computes
  // them (with other targets, some ignored), and a replay still checks the classes.
  auto step_of = [&](const Tensor& param) {
    return [param, w](const std::vector<Tensor>& in) {
      const Tensor z = in[0] * param;
      Tensor loss = cross_entropy(z * 2.0, in[1], w, Reduction::Mean, 2, 0.1) +
                    binary_cross_entropy_with_logits(z, in[2], Tensor(), Reduction::Mean, w) +
                    huber_loss(mish(z), in[2]) + kl_div(log_softmax(z, 1), in[2], kBatchMean);
      loss.backward();
      return std::vector<Tensor>{loss};
    };
  };
  const Tensor traced_param = testing::input({5}, kFloat32, 0.5, 2).requires_grad_();
  const Tensor eager_param = traced_param.detach().clone().requires_grad_();
  jit::Function traced = jit::trace(step_of(traced_param), {x, t, p});
  EXPECT_TRUE(traced.warnings().empty()) << traced.warnings()[0];
  const Tensor x2 = testing::input({6, 5});
  const Tensor t2 = from_vector(std::vector<int64_t>{2, 0, 3, 2, 0, 4});
  const std::vector<Tensor> got = traced({x2, t2, p});
  std::vector<Tensor> want;
  {
    LazyGuard eager(false);
    want = step_of(eager_param)({x2, t2, p});
  }
  testing::expect_lazy_equal(got[0], want[0], "traced loss");
  testing::expect_lazy_equal(traced_param.grad(), eager_param.grad(), "traced gradient");
  EXPECT_THROW(traced({x2, from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5}), p}), Error);
}

// A float64 class weight for float32 logits: the loss and the gradient stay float32.
TEST(ClassLosses, WeightOfAnotherDtype) {
  const Tensor x = random_tensor({4, 3});
  const Tensor w = random_tensor({3}, kFloat64, 0.5, 2);
  const Tensor t = from_vector(std::vector<int64_t>{0, 1, 2, 1});
  Tensor leaf = x.clone().requires_grad_();
  Tensor loss = cross_entropy(leaf, t, w, Reduction::Mean, -100, 0.1);
  EXPECT_EQ(loss.dtype(), kFloat32);
  loss.backward();
  EXPECT_EQ(leaf.grad().dtype(), kFloat32);
  const Tensor same = cross_entropy(x, t, w.to(kFloat32), Reduction::Mean, -100, 0.1);
  EXPECT_NEAR(loss.item<double>(), same.item<double>(), 1e-6);
  EXPECT_EQ(nll_loss(x, t, w).dtype(), kFloat32);
  const Tensor p = random_tensor({4, 3}, kFloat32, 0.1, 0.9);
  EXPECT_EQ(binary_cross_entropy(p, p, w).dtype(), kFloat32);
  EXPECT_EQ(binary_cross_entropy_with_logits(x, p, w, Reduction::Mean, w).dtype(), kFloat32);
  Tensor q = p.clone().requires_grad_();
  binary_cross_entropy(q, p, w).backward();
  EXPECT_EQ(q.grad().dtype(), kFloat32);
}

// The nll_loss node (two outputs, an optional weight) survives a save and load of a traced
// function.
TEST(ClassLosses, SavedTraceReplays) {
  const Tensor x = testing::input({6, 5});
  const Tensor w = testing::input({5}, kFloat32, 0.5, 2);
  const Tensor t = from_vector(std::vector<int64_t>{0, 4, 2, 3, 2, 1});
  auto fn = [w](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{cross_entropy(in[0], in[1], w, Reduction::Mean, 2, 0.1),
                               nll_loss(in[0], in[1], Tensor(), Reduction::None)};
  };
  jit::Function traced = jit::trace(fn, {x, t});
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_activations_losses_" + std::to_string(::getpid()) + ".kiln"))
                               .string();
  traced.save(path);
  jit::Function loaded = jit::load(path);
  std::filesystem::remove(path);
  const Tensor t2 = from_vector(std::vector<int64_t>{2, 1, 0, 4, 3, 2});
  std::vector<Tensor> want;
  {
    LazyGuard eager(false);
    want = fn({x, t2});
  }
  const std::vector<Tensor> got = loaded({x, t2});
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < got.size(); ++i)
    testing::expect_lazy_equal(got[i], want[i], "loaded output " + std::to_string(i));
}

TEST(ClassLosses, BadInputsRaiseNamingTheOpAndShapes) {
  const Tensor x = random_tensor({4, 3});
  const Tensor t = from_vector(std::vector<int64_t>{0, 1, 2, 1});
  const std::vector<double> before = values(x);
  expect_error(
      [&] {
        cross_entropy(x, from_vector(std::vector<int64_t>{0, 3, 1, 1}));
      },
      {"cross_entropy", "target 3", "3 classes", "float32[4, 3]"});
  expect_error(
      [&] {
        nll_loss(x, from_vector(std::vector<int64_t>{0, -1, 1, 1}), Tensor());
      },
      {"nll_loss", "target -1", "ignore_index -100"});
  expect_error([&] { nll_loss(x, t, ones({4})); }, {"nll_loss", "weight", "[3]", "float32[4]"});
  expect_error([&] { cross_entropy(x, t, ones({3}).to(kInt64)); }, {"cross_entropy", "weight"});
  expect_error([&] { cross_entropy(x, t.narrow(0, 0, 3)); }, {"cross_entropy", "[4]", "int64[3]"});
  expect_error([&] { cross_entropy(x, t, {}, Reduction::Mean, -100, 1.5); },
               {"cross_entropy", "label_smoothing", "1.5"});
  expect_error(
      [&] {
        cross_entropy(x, zeros({4, 3}, kInt64));
      },
      {"cross_entropy", "floating-point target", "int64[4, 3]"});
  expect_error(
      [&] {
        cross_entropy(x, zeros({4, 3}), {}, Reduction::Mean, 1);
      },
      {"cross_entropy", "ignore_index"});
  expect_error([&] { nll_loss(x, t.to(kFloat32), Tensor()); }, {"nll_loss", "float32[4]"});
  EXPECT_EQ(values(x), before);
}

TEST(ClassLosses, Modules) {
  const Tensor x = random_tensor({4, 3}, kFloat64), p = random_tensor({4, 3}, kFloat64, 0, 1);
  const Tensor w = random_tensor({3}, kFloat64, 0.5, 2);
  const Tensor t = from_vector(std::vector<int64_t>{0, 1, 2, 1});
  auto same = [](const Tensor& got, const Tensor& want) {
    expect_close(got, values(want), want.sizes(), kFloat64, 0, 0);
  };
  nn::CrossEntropyLoss ce(
      nn::CrossEntropyLossOptions().weight(w).ignore_index(1).label_smoothing(0.1));
  EXPECT_EQ(ce.options.ignore_index(), 1);
  same(ce(x, t), cross_entropy(x, t, w, Reduction::Mean, 1, 0.1));
  same(nn::CrossEntropyLoss()(x, t), cross_entropy(x, t));
  same(nn::NLLLoss(nn::NLLLossOptions().weight(w).reduction(Reduction::Sum))(x, t),
       nll_loss(x, t, w, Reduction::Sum));
  same(nn::BCEWithLogitsLoss(nn::BCEWithLogitsLossOptions().pos_weight(w))(x, p),
       binary_cross_entropy_with_logits(x, p, {}, Reduction::Mean, w));
  same(nn::BCELoss(nn::BCELossOptions().weight(w))(sigmoid(x), p),
       binary_cross_entropy(sigmoid(x), p, w));
  same(nn::MSELoss(Reduction::Sum)(x, p), mse_loss(x, p, Reduction::Sum));
  same(nn::L1Loss()(x, p), l1_loss(x, p));
  same(nn::SmoothL1Loss(nn::SmoothL1LossOptions().beta(0.5))(x, p),
       smooth_l1_loss(x, p, Reduction::Mean, 0.5));
  same(nn::HuberLoss(nn::HuberLossOptions().delta(2))(x, p), huber_loss(x, p, Reduction::Mean, 2));
  same(nn::KLDivLoss(nn::KLDivLossOptions().reduction(kBatchMean).log_target(true))(x, p),
       kl_div(x, p, kBatchMean, true));
  EXPECT_EQ(nn::KLDivLoss().name(), "KLDivLoss");
}

}  // namespace
}  // namespace kiln
