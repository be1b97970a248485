// Gradient checks of every differentiable op against finite differences (gradcheck, and
// gradgradcheck for the ops whose backward is itself differentiated), over random shapes,
// broadcasting and non-contiguous inputs.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/nn_functional.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::DifferentiableFunction;
using testing::GradcheckOptions;
using testing::layouts;
using testing::random_shape;
using testing::random_tensor;
using testing::rng;

using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;
using Gen = std::function<Tensor(const Shape&)>;

// ------------------------------------------------------------------------------- helpers

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string str(const Shape& s) {
  return ::testing::PrintToString(s);
}

int uniform_int(int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}
bool coin(double p = 0.5) {
  return std::uniform_real_distribution<double>(0, 1)(rng()) < p;
}

// Shapes stay small because gradcheck costs one backward per output element and two forwards
// per input element.
Shape small_shape(int min_rank, int max_rank, int64_t max_numel = 24) {
  for (;;) {
    Shape s = random_shape(min_rank, max_rank, 4, /*allow_zero=*/false);
    if (numel_of(s) <= max_numel) return s;
  }
}

Gen uniform(double lo, double hi) {
  return [=](const Shape& s) { return random_tensor(s, kFloat64, lo, hi); };
}

// Magnitudes in [lo, hi) with random signs: keeps values away from 0 (abs, relu, reciprocal).
Gen signed_mag(double lo, double hi) {
  return [=](const Shape& s) {
    std::vector<double> v = random_tensor(s, kFloat64, lo, hi).to_vector<double>();
    for (double& x : v)
      if (coin()) x = -x;
    return from_vector(v, s);
  };
}

// Integers plus a fraction in [0.1, 0.4]: away from the jumps of floor, ceil and round.
Gen off_integers() {
  return [](const Shape& s) {
    std::vector<double> v = random_tensor(s, kFloat64, -3, 3).to_vector<double>();
    for (double& x : v) x = std::floor(x) + std::uniform_real_distribution<double>(0.1, 0.4)(rng());
    return from_vector(v, s);
  };
}

// Moves values within `margin` of any of `points` out to the nearer edge of that margin, so
// central differences never straddle a kink.
Gen avoiding(Gen base, std::vector<double> points, double margin) {
  return [=](const Shape& s) {
    std::vector<double> v = base(s).to_vector<double>();
    for (double& x : v)
      for (double p : points)
        if (std::fabs(x - p) < margin) x = x < p ? p - margin : p + margin;
    return from_vector(v, s);
  };
}

Tensor as_leaf(const Tensor& t) {
  Tensor leaf = t.detach();
  leaf.requires_grad_();
  return leaf;
}

Tensor index_tensor(const std::vector<int64_t>& v, const Shape& shape) {
  return from_vector(v, shape);
}
Tensor random_index(const Shape& shape, int64_t high) {
  std::vector<int64_t> v(numel_of(shape));
  for (auto& x : v) x = uniform_int(0, static_cast<int>(high) - 1);
  return index_tensor(v, shape);
}

// One memory layout of an input: the leaf gradcheck perturbs, and what fn does to it before the
// op sees it. "transposed" and "strided" leaves are themselves non-contiguous (detached views);
// "expanded" broadcasts a contiguous leaf inside fn, since a leaf with stride-0 dims would alias
// its own elements.
struct Variant {
  std::string name;
  Tensor leaf;
  Fn1 prep;
};

const std::vector<std::string> kLayoutNames = {"contiguous", "transposed", "strided", "expanded"};

// Without `expand_to`, "expanded" adds a broadcast leading dim of 2.
std::vector<Variant> variants(const Tensor& values,
                              const std::optional<Shape>& expand_to = std::nullopt) {
  std::vector<Variant> out;
  Fn1 identity = [](const Tensor& x) { return x; };
  for (const auto& [name, t] : layouts(values)) {
    if (name == "expanded") continue;
    out.push_back({name, as_leaf(name == "contiguous" ? t.clone() : t), identity});
  }
  Shape target = values.sizes();
  if (expand_to)
    target = *expand_to;
  else
    target.insert(target.begin(), 2);
  if (target != values.sizes()) {
    bool add_dim = !expand_to;
    out.push_back({"expanded", as_leaf(values.clone()), [target, add_dim](const Tensor& x) {
                     return (add_dim ? x.unsqueeze(0) : x).expand(target);
                   }});
  }
  return out;
}

const Variant* find_variant(const std::vector<Variant>& vs, const std::string& name) {
  for (const auto& v : vs)
    if (v.name == name) return &v;
  return nullptr;
}

// Random draws per check: each one is a new shape, new values and new dims.
constexpr int kIters = 10;

struct Cfg {
  int iters = kIters;
  int min_rank = 0;
  int max_rank = 3;
  int64_t max_numel = 24;
  bool gradgrad = false;
  GradcheckOptions opts;
};

Cfg with_gradgrad(Cfg c = {}) {
  c.gradgrad = true;
  return c;
}

// Runs gradcheck (and gradgradcheck) and reports kiln's message as a test failure.
bool run_check(const std::string& what, const DifferentiableFunction& fn,
               const std::vector<Tensor>& inputs, bool gradgrad,
               const GradcheckOptions& opts = {}) {
  try {
    testing::gradcheck(fn, inputs, opts);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << "\n  gradcheck: " << e.what();
    return false;
  }
  if (!gradgrad) return true;
  try {
    testing::gradgradcheck(fn, inputs, opts);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << "\n  gradgradcheck: " << e.what();
    return false;
  }
  return true;
}

bool check(const std::string& what,
           const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
           const std::vector<Tensor>& inputs, bool gradgrad = false,
           const GradcheckOptions& opts = {}) {
  return run_check(what, DifferentiableFunction(fn), inputs, gradgrad, opts);
}
bool check1(const std::string& what, const std::function<Tensor(const std::vector<Tensor>&)>& fn,
            const std::vector<Tensor>& inputs, bool gradgrad = false,
            const GradcheckOptions& opts = {}) {
  return run_check(what, DifferentiableFunction([fn](const std::vector<Tensor>& in) {
                     return std::vector{fn(in)};
                   }),
                   inputs, gradgrad, opts);
}

// An op whose parameters (dims, sizes) depend on the shape it is applied to.
struct Op1 {
  std::string desc;
  Fn1 f;
};
using Factory = std::function<Op1(const Shape&)>;

// Checks f over random shapes and every layout; stops at the first failure of an op.
void check_shaped(const std::string& name, const Factory& factory, const Gen& gen,
                  const Cfg& cfg = {}) {
  for (int it = 0; it < cfg.iters; ++it) {
    Shape shape = small_shape(cfg.min_rank, cfg.max_rank, cfg.max_numel);
    Tensor values = gen(shape);
    for (const Variant& v : variants(values)) {
      Shape prepped = v.prep(v.leaf.detach()).sizes();
      Op1 op = factory(prepped);
      Fn1 f = op.f, prep = v.prep;
      std::string what = name + " " + op.desc + " on " + v.name + " " + str(shape);
      if (!check1(
              what, [f, prep](const std::vector<Tensor>& in) { return f(prep(in[0])); }, {v.leaf},
              cfg.gradgrad, cfg.opts))
        return;
    }
  }
}

void check_unary(const std::string& name, const Fn1& f, const Gen& gen, const Cfg& cfg = {}) {
  check_shaped(
      name,
      [f](const Shape&) {
        return Op1{"", f};
      },
      gen, cfg);
}

// Two operands that broadcast against each other (either may be the larger, and both may have
// size-1 dims the other expands), in every layout.
void check_binary(const std::string& name, const Fn2& f, const Gen& gen_a, const Gen& gen_b,
                  const Cfg& cfg = {},
                  const std::function<bool(const Tensor&, const Tensor&)>& accept = nullptr) {
  for (int it = 0; it < cfg.iters; ++it) {
    Shape full = small_shape(cfg.min_rank, cfg.max_rank, cfg.max_numel);
    Shape sa = full;
    for (auto& d : sa)
      if (coin(0.3)) d = 1;
    size_t keep = static_cast<size_t>(uniform_int(0, static_cast<int>(full.size())));
    Shape sb(full.end() - static_cast<std::ptrdiff_t>(keep), full.end());
    for (auto& d : sb)
      if (coin(0.3)) d = 1;
    if (coin()) std::swap(sa, sb);
    Tensor a, b;
    for (int tries = 0;; ++tries) {
      a = gen_a(sa);
      b = gen_b(sb);
      if (!accept || accept(a, b)) break;
      ASSERT_LT(tries, 50) << name << ": could not draw acceptable operands";
    }
    Shape out = testing::broadcast_shape(sa, sb);
    std::vector<Variant> va = variants(a, out), vb = variants(b, out);
    for (const std::string& layout : kLayoutNames) {
      const Variant* xa = find_variant(va, layout);
      const Variant* xb = find_variant(vb, layout);
      if (!xa && !xb) continue;
      if (!xa) xa = &va[0];
      if (!xb) xb = &vb[0];
      Fn1 pa = xa->prep, pb = xb->prep;
      std::string what =
          name + " on " + xa->name + " " + str(sa) + " and " + xb->name + " " + str(sb);
      if (!check1(
              what, [f, pa, pb](const std::vector<Tensor>& in) { return f(pa(in[0]), pb(in[1])); },
              {xa->leaf, xb->leaf}, cfg.gradgrad, cfg.opts))
        return;
    }
  }
}

// A random subset of dims (sometimes negative); empty means all dims.
std::vector<int64_t> random_dims(int64_t rank) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < rank; ++d)
    if (coin()) dims.push_back(coin(0.3) ? d - rank : d);
  return dims;
}

// Dims whose sizes multiply to at least `min_count` (for var/std), or nullopt.
std::optional<std::vector<int64_t>> dims_with_count(const Shape& s, int64_t min_count) {
  for (int tries = 0; tries < 20; ++tries) {
    std::vector<int64_t> dims = random_dims(static_cast<int64_t>(s.size()));
    int64_t count = 1;
    if (dims.empty())
      count = numel_of(s);
    else
      for (int64_t d : dims) count *= s[d < 0 ? d + static_cast<int64_t>(s.size()) : d];
    if (count >= min_count) return dims;
  }
  return std::nullopt;
}

std::string dims_str(const std::vector<int64_t>& dims, bool keepdim) {
  std::ostringstream os;
  os << "dims " << ::testing::PrintToString(dims) << (keepdim ? " keepdim" : "");
  return os.str();
}

// A reduction over random dims, with and without keepdim.
using ReduceFn = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;
Factory reduction(ReduceFn f, int64_t min_count = 1) {
  return [f, min_count](const Shape& s) {
    std::optional<std::vector<int64_t>> dims = dims_with_count(s, min_count);
    bool keepdim = coin();
    if (!dims) {
      // No subset is large enough (e.g. a 1-element tensor); nothing to check there.
      return Op1{"(skipped)", [](const Tensor& x) { return x * 1.0; }};
    }
    std::vector<int64_t> d = *dims;
    return Op1{dims_str(d, keepdim), [f, d, keepdim](const Tensor& x) { return f(x, d, keepdim); }};
  };
}

// A dim valid for a shape of this rank (rank >= 1), sometimes negative.
int64_t random_dim(const Shape& s) {
  int64_t rank = static_cast<int64_t>(s.size());
  int64_t d = uniform_int(0, static_cast<int>(rank) - 1);
  return coin(0.3) ? d - rank : d;
}

// Rejects operand pairs with any broadcast pair closer than `margin` (ties for min/max).
std::function<bool(const Tensor&, const Tensor&)> apart(double margin) {
  return [margin](const Tensor& a, const Tensor& b) {
    return (a - b).abs().min().item<double>() > margin;
  };
}

Tensor bool_tensor(const Shape& s) {
  return random_tensor(s, kBool);
}

// ------------------------------------------------------------------------------- unary

TEST(AutogradOps, UnaryElementwise) {
  const Cfg c = with_gradgrad();
  const std::vector<std::tuple<std::string, Fn1, Gen>> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }, uniform(-2, 2)},
      {"operator-", [](const Tensor& x) { return -x; }, uniform(-2, 2)},
      {"abs", [](const Tensor& x) { return abs(x); }, signed_mag(0.1, 2)},
      {"exp", [](const Tensor& x) { return exp(x); }, uniform(-2, 2)},
      {"log", [](const Tensor& x) { return log(x); }, uniform(0.2, 3)},
      {"log1p", [](const Tensor& x) { return log1p(x); }, uniform(-0.5, 2)},
      {"expm1", [](const Tensor& x) { return expm1(x); }, uniform(-2, 2)},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, uniform(0.2, 3)},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, uniform(0.2, 3)},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, signed_mag(0.3, 2)},
      {"sin", [](const Tensor& x) { return sin(x); }, uniform(-3, 3)},
      {"cos", [](const Tensor& x) { return cos(x); }, uniform(-3, 3)},
      {"tanh", [](const Tensor& x) { return tanh(x); }, uniform(-2, 2)},
      {"tan", [](const Tensor& x) { return tan(x); }, uniform(-1.2, 1.2)},
      {"atan", [](const Tensor& x) { return atan(x); }, uniform(-3, 3)},
      {"asin", [](const Tensor& x) { return asin(x); }, uniform(-0.9, 0.9)},
      {"acos", [](const Tensor& x) { return acos(x); }, uniform(-0.9, 0.9)},
      {"sinh", [](const Tensor& x) { return sinh(x); }, uniform(-3, 3)},
      {"cosh", [](const Tensor& x) { return cosh(x); }, uniform(-3, 3)},
      {"asinh", [](const Tensor& x) { return asinh(x); }, uniform(-3, 3)},
      {"acosh", [](const Tensor& x) { return acosh(x); }, uniform(1.2, 4)},
      {"atanh", [](const Tensor& x) { return atanh(x); }, uniform(-0.9, 0.9)},
      {"exp2", [](const Tensor& x) { return exp2(x); }, uniform(-2, 2)},
      {"log2", [](const Tensor& x) { return log2(x); }, uniform(0.2, 3)},
      {"log10", [](const Tensor& x) { return log10(x); }, uniform(0.2, 3)},
      {"sinc", [](const Tensor& x) { return sinc(x); }, signed_mag(0.1, 2)},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, uniform(-3, 3)},
      {"relu", [](const Tensor& x) { return relu(x); }, signed_mag(0.1, 2)},
      {"gelu", [](const Tensor& x) { return gelu(x); }, uniform(-3, 3)},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, uniform(-3, 3)},
      {"silu", [](const Tensor& x) { return silu(x); }, uniform(-3, 3)},
      {"softplus", [](const Tensor& x) { return softplus(x); }, uniform(-3, 3)},
      // beta * x > threshold switches to the identity at x = 0.5: keep clear of that kink.
      {"softplus beta=2 threshold=1", [](const Tensor& x) { return softplus(x, 2.0, 1.0); },
       avoiding(uniform(-2, 2), {0.5}, 0.05)},
      {"erf", [](const Tensor& x) { return erf(x); }, uniform(-2, 2)},
      {"erfc", [](const Tensor& x) { return erfc(x); }, uniform(-2, 2)},
      {"erfinv", [](const Tensor& x) { return erfinv(x); }, uniform(-0.9, 0.9)},
      {"lgamma", [](const Tensor& x) { return lgamma(x); }, uniform(0.2, 4)},
      {"lgamma negative", [](const Tensor& x) { return lgamma(x - 3); }, off_integers()},
      {"floor", [](const Tensor& x) { return floor(x); }, off_integers()},
      {"ceil", [](const Tensor& x) { return ceil(x); }, off_integers()},
      {"round", [](const Tensor& x) { return round(x); }, off_integers()},
      {"trunc", [](const Tensor& x) { return trunc(x); }, off_integers()},
      {"frac", [](const Tensor& x) { return frac(x); }, off_integers()},
      {"square", [](const Tensor& x) { return square(x); }, uniform(-2, 2)},
      {"clamp_min", [](const Tensor& x) { return clamp_min(x, 0.25); }, off_integers()},
      {"clamp_max", [](const Tensor& x) { return x.clamp_max(0.25); }, off_integers()},
      {"sign", [](const Tensor& x) { return sign(x); }, signed_mag(0.1, 2)},
  };
  for (const auto& [name, f, gen] : ops) check_unary(name, f, gen, c);
}

// digamma's gradient is trigamma, whose own gradient (polygamma(2, x)) kiln does not compute: the
// first derivative only (trigamma's backward raises, tests/lib/special_functions_test.cpp).
TEST(AutogradOps, DigammaFirstDerivative) {
  check_unary(
      "digamma", [](const Tensor& x) { return digamma(x); }, uniform(0.3, 4), Cfg{});
}

TEST(AutogradOps, UnaryMethods) {
  Cfg c;
  check_unary(
      "Tensor::neg", [](const Tensor& x) { return x.neg(); }, uniform(-2, 2), c);
  check_unary(
      "Tensor::abs", [](const Tensor& x) { return x.abs(); }, signed_mag(0.1, 2), c);
  check_unary(
      "Tensor::exp", [](const Tensor& x) { return x.exp(); }, uniform(-2, 2), c);
  check_unary(
      "Tensor::log", [](const Tensor& x) { return x.log(); }, uniform(0.2, 3), c);
  check_unary(
      "Tensor::sqrt", [](const Tensor& x) { return x.sqrt(); }, uniform(0.2, 3), c);
  check_unary(
      "Tensor::tanh", [](const Tensor& x) { return x.tanh(); }, uniform(-2, 2), c);
  check_unary(
      "Tensor::sigmoid", [](const Tensor& x) { return x.sigmoid(); }, uniform(-2, 2), c);
  check_unary(
      "Tensor::relu", [](const Tensor& x) { return x.relu(); }, signed_mag(0.1, 2), c);
}

TEST(AutogradOps, ZeroGradientOpsGiveZeros) {
  // Their gradient is zero, not undefined: a backward through them reaches the leaf.
  for (const auto& f : std::vector<Fn1>{
           [](const Tensor& x) { return floor(x); }, [](const Tensor& x) { return ceil(x); },
           [](const Tensor& x) { return round(x); }, [](const Tensor& x) { return sign(x); }}) {
    Tensor x = as_leaf(from_vector<double>({-1.7, 0.3, 2.2}));
    (f(x) * 2.0).sum().backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));
  }
}

TEST(AutogradOps, Clamp) {
  Cfg c = with_gradgrad();
  Gen g = avoiding(uniform(-2, 2), {-0.5, 0.5}, 0.05);
  check_unary(
      "clamp min", [](const Tensor& x) { return clamp(x, -0.5); }, g, c);
  check_unary(
      "clamp max", [](const Tensor& x) { return clamp(x, std::nullopt, 0.5); }, g, c);
  check_unary(
      "clamp both", [](const Tensor& x) { return clamp(x, -0.5, 0.5); }, g, c);
  check_unary(
      "Tensor::clamp", [](const Tensor& x) { return x.clamp(-0.5, 0.5); }, g, c);
}

// ------------------------------------------------------------------------------- binary

TEST(AutogradOps, BinaryArithmetic) {
  Cfg c = with_gradgrad();
  Gen u = uniform(-2, 2);
  check_binary(
      "add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, u, u, c);
  check_binary(
      "add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); }, u, u, c);
  check_binary(
      "sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, u, u, c);
  check_binary(
      "sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, -1.5); }, u, u, c);
  check_binary(
      "mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, u, u, c);
  check_binary(
      "div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, u, signed_mag(0.5, 2), c);
  check_binary(
      "atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); }, u, signed_mag(0.5, 2),
      c);
  check_binary(
      "hypot", [](const Tensor& a, const Tensor& b) { return hypot(a, b); }, signed_mag(0.5, 2), u,
      c);
  check_binary(
      "operators", [](const Tensor& a, const Tensor& b) { return (a + b) * a - b / 3.0; }, u, u, c);
  check_binary(
      "Tensor methods",
      [](const Tensor& a, const Tensor& b) { return a.add(b, 2).sub(b).mul(a).div(b); }, u,
      signed_mag(0.5, 2), c);
}

// The divisor's gradient -g a / b^2 where b^2 alone underflows (1e-30f) or overflows (3e38f)
// and a / b / b does not: x / x has gradient 1/x - x/x^2 = 0 for x's both roles.
TEST(AutogradOps, DivGradientOfTinyAndHugeDivisors) {
  for (float v : {1e-30f, 3e38f, -2.5f}) {
    Tensor x = from_vector(std::vector<float>{v}).requires_grad_(true);
    div(x, x).sum().backward();
    const float got = x.grad().to_vector<float>()[0];
    EXPECT_TRUE(std::isfinite(got)) << v << ": " << got;
    EXPECT_LE(std::abs(got), 1e-6f / std::abs(v)) << v << ": " << got;
  }
}

TEST(AutogradOps, BinaryWithScalar) {
  Cfg c = with_gradgrad();
  Gen u = uniform(-2, 2);
  check_unary(
      "add scalar", [](const Tensor& x) { return add(x, 1.5); }, u, c);
  check_unary(
      "sub scalar", [](const Tensor& x) { return sub(x, 1.5); }, u, c);
  check_unary(
      "mul scalar", [](const Tensor& x) { return mul(x, -2.5); }, u, c);
  check_unary(
      "div scalar", [](const Tensor& x) { return div(x, 4.0); }, u, c);
  check_unary(
      "scalar - tensor", [](const Tensor& x) { return 2.0 - x; }, u, c);
  check_unary(
      "scalar / tensor", [](const Tensor& x) { return 2.0 / x; }, signed_mag(0.5, 2), c);
  check_unary(
      "scalar * tensor + scalar", [](const Tensor& x) { return 3 * x + 1; }, u, c);
}

TEST(AutogradOps, Pow) {
  Cfg c = with_gradgrad();
  check_binary(
      "pow tensor^tensor", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
      uniform(0.5, 2), uniform(-2, 2), c);
  check_unary(
      "pow tensor^2.5", [](const Tensor& x) { return pow(x, 2.5); }, uniform(0.3, 2), c);
  check_unary(
      "pow tensor^3", [](const Tensor& x) { return pow(x, 3); }, uniform(-2, 2), c);
  check_unary(
      "pow tensor^-1.5", [](const Tensor& x) { return x.pow(-1.5); }, uniform(0.5, 2), c);
  check_unary(
      "pow tensor^0", [](const Tensor& x) { return pow(x, 0); }, uniform(-2, 2), c);
  check_unary(
      "pow 2.5^tensor", [](const Tensor& x) { return pow(2.5, x); }, uniform(-2, 2), c);
  check_unary(
      "Tensor::pow(tensor)", [](const Tensor& x) { return x.pow(x); }, uniform(0.5, 2), c);
}

TEST(AutogradOps, Remainder) {
  Cfg c = with_gradgrad();
  // a / b kept away from integers, where remainder jumps.
  auto accept = [](const Tensor& a, const Tensor& b) {
    Tensor q = a / b;
    Tensor frac = q - floor(q);
    return frac.min().item<double>() > 0.05 && frac.max().item<double>() < 0.95;
  };
  check_binary(
      "remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, uniform(-4, 4),
      signed_mag(0.7, 2), c, accept);
  check_unary(
      "remainder scalar", [](const Tensor& x) { return remainder(x, 1.5); },
      avoiding(uniform(-4, 4), {-4.5, -3, -1.5, 0, 1.5, 3, 4.5}, 0.05), c);
}

// xlogy's gradients are torch's: log(b) (0 where a is 0 and b <= 0), a / b.
TEST(AutogradOps, Xlogy) {
  Cfg c = with_gradgrad();
  check_binary(
      "xlogy", [](const Tensor& a, const Tensor& b) { return xlogy(a, b); }, uniform(-2, 2),
      uniform(0.5, 3), c);
  Tensor a = from_vector(std::vector<double>{0, 2, 0, 0}).requires_grad_();
  Tensor b = from_vector(std::vector<double>{0.5, 4, 0, -1}).requires_grad_();
  xlogy(a, b).sum().backward();
  EXPECT_EQ(a.grad().to_vector<double>(),
            (std::vector<double>{std::log(0.5), std::log(4.0), 0, 0}));
  const std::vector<double> gb = b.grad().to_vector<double>();
  EXPECT_EQ(gb[0], 0.0);
  EXPECT_EQ(gb[1], 0.5);
  EXPECT_TRUE(std::isnan(gb[2])) << gb[2];  // 0 / 0, as torch's
  EXPECT_EQ(gb[3], 0.0);
}

// nan_to_num passes g where x is finite, 0 where it was replaced.
TEST(AutogradOps, NanToNum) {
  Tensor x = from_vector(std::vector<double>{1, NAN, INFINITY, -INFINITY, -3}).requires_grad_();
  (nan_to_num(x) * 2).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 0, 0, 0, 2}));
  // torch's g * isfinite(x): a NaN or infinite g where x was replaced gives NaN (0 * NaN).
  const Tensor g = from_vector(std::vector<double>{NAN, NAN, INFINITY, 1, 1});
  const std::vector<double> gx = autograd::grad({nan_to_num(x)}, {x}, {g})[0].to_vector<double>();
  EXPECT_TRUE(std::isnan(gx[0]) && std::isnan(gx[1]) && std::isnan(gx[2])) << gx[1] << gx[2];
  EXPECT_EQ(gx[3], 0.0);
  EXPECT_EQ(gx[4], 1.0);
}

// The 2-norm's gradient at a zero element is x * g / norm (torch's): 0, but NaN when the norm's
// gradient is NaN (an infinite element: normalize, differential seed 16195592963475514005).
TEST(AutogradOps, NormGradientAtAZeroElementFollowsTheNormsGradient) {
  Tensor x = from_vector(std::vector<double>{-1, -0.0, -INFINITY}).requires_grad_();
  const std::vector<double> g =
      autograd::grad({normalize(x, 2.0, 0).sum()}, {x})[0].to_vector<double>();
  EXPECT_TRUE(std::isnan(g[1])) << g[1];
  Tensor y = from_vector(std::vector<double>{3, 0, 4}).requires_grad_();
  EXPECT_EQ(autograd::grad({norm(y)}, {y})[0].to_vector<double>(),
            (std::vector<double>{0.6, 0, 0.8}));
}

TEST(AutogradOps, Fmod) {
  Cfg c = with_gradgrad();
  // a / b kept away from integers, where fmod jumps.
  auto accept = [](const Tensor& a, const Tensor& b) {
    Tensor q = abs(a / b);
    Tensor frac = q - floor(q);
    return frac.min().item<double>() > 0.05 && frac.max().item<double>() < 0.95;
  };
  check_binary(
      "fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }, uniform(-4, 4),
      signed_mag(0.7, 2), c, accept);
  check_unary(
      "fmod scalar", [](const Tensor& x) { return fmod(x, -1.5); },
      avoiding(uniform(-4, 4), {-4.5, -3, -1.5, 0, 1.5, 3, 4.5}, 0.05), c);
}

// The divisor's gradient is -g (a // b) with torch's floor division: -1 for a finite a over an
// infinite b of the other sign (floor(a / b) is -0 there), 0 for the same sign, NaN for an
// infinite a, and a / b (inf) for a zero b.
TEST(AutogradOps, RemainderGradientAtInfiniteAndZeroOperands) {
  const double inf = INFINITY;
  Tensor a = from_vector(std::vector<double>{0.5, -0.5, 0.5, inf, 3.0});
  Tensor b = from_vector(std::vector<double>{-inf, inf, inf, 2.0, 0.0});
  b.requires_grad_(true);
  remainder(a, b).sum().backward();
  const std::vector<double> got = b.grad().to_vector<double>();
  EXPECT_EQ(got[0], 1.0);
  EXPECT_EQ(got[1], 1.0);
  EXPECT_EQ(got[2], 0.0);
  EXPECT_TRUE(std::isnan(got[3])) << got[3];
  EXPECT_EQ(got[4], -inf);
}

// abs(-0) is +0, whose reciprocal is +inf, in every mode.
TEST(AutogradOps, AbsOfNegativeZeroIsPositiveZero) {
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    Tensor x = from_vector(std::vector<float>{-0.0f, 0.0f, -2.0f});
    const std::vector<float> got = reciprocal(abs(x) * 1.0f).to_vector<float>();
    EXPECT_EQ(got[0], INFINITY) << lazy;
    EXPECT_EQ(got[1], INFINITY) << lazy;
    EXPECT_EQ(got[2], 0.5f) << lazy;
  }
}

// The base's gradient is g (b a^(b-1)), as torch's: 2 a overflows for the largest double, so
// the gradient is infinite even where g is below 1/2.
TEST(AutogradOps, PowBaseGradientOverflowsAsTorch) {
  Tensor a = from_vector(std::vector<double>{1.7976931348623157e308}).requires_grad_(true);
  pow(a, 2).backward(from_vector(std::vector<double>{-0.25}));
  EXPECT_EQ(a.grad().to_vector<double>()[0], -INFINITY) << a.grad();
}

// The exponent's gradient is 0 where a = 0 and b >= 0 only: a NaN exponent's is NaN, as torch's.
TEST(AutogradOps, PowExponentGradientOfZeroBaseAndNaNExponent) {
  Tensor b = from_vector(std::vector<double>{NAN, 2.0}).requires_grad_(true);
  pow(from_vector(std::vector<double>{0.0, 0.0}), b).sum().backward();
  const std::vector<double> got = b.grad().to_vector<double>();
  EXPECT_TRUE(std::isnan(got[0])) << got[0];
  EXPECT_EQ(got[1], 0.0);
}

TEST(AutogradOps, MinimumMaximum) {
  Cfg c = with_gradgrad();
  Gen u = uniform(-2, 2);
  check_binary(
      "minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, u, u, c,
      apart(0.01));
  check_binary(
      "maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, u, u, c,
      apart(0.01));
  Gen away = avoiding(u, {0.5}, 0.05);
  check_unary(
      "minimum scalar", [](const Tensor& x) { return minimum(x, 0.5); }, away, c);
  check_unary(
      "maximum scalar", [](const Tensor& x) { return maximum(x, 0.5); }, away, c);
}

TEST(AutogradOps, Where) {
  Cfg c = with_gradgrad();
  for (int it = 0; it < kIters; ++it) {
    Shape s = small_shape(0, 3);
    Tensor cond = bool_tensor(s);
    Shape sb = s;
    for (auto& d : sb)
      if (coin(0.4)) d = 1;
    Tensor a = random_tensor(s, kFloat64, -2, 2);
    Tensor b = random_tensor(sb, kFloat64, -2, 2);
    for (const Variant& va : variants(a)) {
      Fn1 p = va.prep;
      std::string what = "where on " + va.name + " " + str(s) + " and " + str(sb);
      Tensor bl = as_leaf(b.clone());
      if (!check1(
              what,
              [cond, p](const std::vector<Tensor>& in) {
                Tensor x = p(in[0]);
                // The expanded variant adds a leading dim, which cond broadcasts over.
                return where(cond, x, in[1]);
              },
              {va.leaf, bl}, c.gradgrad))
        return;
      if (!check1(
              "where scalar " + what,
              [cond, p](const std::vector<Tensor>& in) { return where(cond, p(in[0]), 0.5); },
              {va.leaf}, c.gradgrad))
        return;
    }
  }
}

// ------------------------------------------------------------------------------- reductions

TEST(AutogradOps, SumMean) {
  Cfg c = with_gradgrad();
  Gen u = uniform(-2, 2);
  check_shaped("sum", reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return sum(x, d, k);
               }),
               u, c);
  check_shaped("mean", reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return mean(x, d, k);
               }),
               u, c);
  check_unary(
      "Tensor::sum()", [](const Tensor& x) { return x.sum(); }, u, c);
  check_unary(
      "Tensor::mean()", [](const Tensor& x) { return x.mean(); }, u, c);
  check_shaped(
      "Tensor::sum(dims)",
      reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return x.sum(d, k); }),
      u, c);
  check_shaped("Tensor::mean(dims)",
               reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return x.mean(d, k);
               }),
               u, c);
  check_unary(
      "sum dtype float64", [](const Tensor& x) { return sum(x, {}, false, kFloat64); }, u, c);
}

TEST(AutogradOps, Prod) {
  Cfg c = with_gradgrad();
  // Magnitudes not too close to 0 keep finite differences of the product well conditioned.
  Gen g = signed_mag(0.5, 1.5);
  check_shaped("prod", reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return prod(x, d, k);
               }),
               g, c);
  check_unary(
      "Tensor::prod()", [](const Tensor& x) { return x.prod(); }, g, c);
  Cfg c1 = c;
  c1.min_rank = 1;
  check_shaped(
      "Tensor::prod(dim)",
      [](const Shape& s) {
        int64_t d = random_dim(s);
        bool k = coin();
        return Op1{dims_str({d}, k), [d, k](const Tensor& x) { return x.prod(d, k); }};
      },
      g, c1);
}

TEST(AutogradOps, ProdWithZeros) {
  // Row 0: no zero; row 1: one zero; row 2: two zeros. The product is a polynomial, so finite
  // differences are exact enough even at the zeros.
  Tensor v = from_vector<double>({1.5, -0.7, 2.0, 0.9,  //
                                  0.8, 1.2, 0.0, -1.1,  //
                                  0.0, 1.3, -0.6, 0.0},
                                 Shape{3, 4});
  for (const Variant& var : variants(v)) {
    Fn1 p = var.prep;
    for (int64_t dim : {-1, 0}) {
      std::string what = "prod with zeros dim " + std::to_string(dim) + " on " + var.name;
      check1(
          what, [p, dim](const std::vector<Tensor>& in) { return prod(p(in[0]), {dim}); },
          {var.leaf}, true);
    }
    check1(
        "prod with zeros, all, on " + var.name,
        [p](const std::vector<Tensor>& in) { return prod(p(in[0])); }, {var.leaf}, true);
  }
  Tensor one_zero = as_leaf(from_vector<double>({2, 0, 3}));
  one_zero.prod().backward();
  EXPECT_EQ(one_zero.grad().to_vector<double>(), (std::vector<double>{0, 6, 0}));
  Tensor two_zeros = as_leaf(from_vector<double>({0, 2, 0}));
  two_zeros.prod().backward();
  EXPECT_EQ(two_zeros.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));
  // A single zero in a 1-element row.
  Tensor single = as_leaf(from_vector<double>({0.0}));
  single.prod().backward();
  EXPECT_EQ(single.grad().to_vector<double>(), (std::vector<double>{1}));
}

TEST(AutogradOps, MaxMinAmaxAmin) {
  Cfg c = with_gradgrad();
  // Continuous random values: ties (and near ties within eps) have probability ~0.
  Gen u = uniform(-2, 2);
  check_unary(
      "max()", [](const Tensor& x) { return max(x); }, u, c);
  check_unary(
      "min()", [](const Tensor& x) { return min(x); }, u, c);
  check_unary(
      "Tensor::max()", [](const Tensor& x) { return x.max(); }, u, c);
  check_unary(
      "Tensor::min()", [](const Tensor& x) { return x.min(); }, u, c);
  check_shaped("amax", reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return amax(x, d, k);
               }),
               u, c);
  check_shaped("amin", reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return amin(x, d, k);
               }),
               u, c);
  Cfg c1 = c;
  c1.min_rank = 1;
  for (bool is_max : {true, false}) {
    // Values and indices: the indices output is int64 and ignored by gradcheck.
    check_shaped(
        is_max ? "max(dim)" : "min(dim)",
        [is_max](const Shape& s) {
          int64_t d = random_dim(s);
          bool k = coin();
          return Op1{dims_str({d}, k), [d, k, is_max](const Tensor& x) {
                       return std::get<0>(is_max ? max(x, d, k) : min(x, d, k));
                     }};
        },
        u, c1);
  }
  Tensor x = as_leaf(random_tensor({3, 4}, kFloat64));
  check("max(dim) returning values and indices",
        [](const std::vector<Tensor>& in) {
          auto [values, indices] = in[0].max(1, true);
          return std::vector<Tensor>{values, indices};
        },
        {x});
}

TEST(AutogradOps, MaxMinTiesShareGradient) {
  // torch distributes the gradient of a full max/min (and of amax/amin) evenly over ties.
  auto grad_of = [](const std::vector<double>& v, const Shape& s,
                    const std::function<Tensor(const Tensor&)>& f) {
    Tensor x = as_leaf(from_vector(v, s));
    f(x).sum().backward();
    return x.grad().to_vector<double>();
  };
  const std::vector<double> hi = {1, 3, 3, 2}, lo = {2, 1, 1, 3};
  const std::vector<double> half = {0, 0.5, 0.5, 0};
  EXPECT_EQ(grad_of(hi, {4}, [](const Tensor& x) { return max(x); }), half);
  EXPECT_EQ(grad_of(lo, {4}, [](const Tensor& x) { return min(x); }), half);
  EXPECT_EQ(grad_of(hi, {4}, [](const Tensor& x) { return amax(x); }), half);
  EXPECT_EQ(grad_of(lo, {4}, [](const Tensor& x) { return amin(x); }), half);
  EXPECT_EQ(grad_of({3, 3, 3, 3}, {2, 2}, [](const Tensor& x) { return max(x); }),
            (std::vector<double>{0.25, 0.25, 0.25, 0.25}));
  // Per row along a dim.
  EXPECT_EQ(grad_of({1, 3, 3, 5, 2, 5}, {2, 3}, [](const Tensor& x) { return amax(x, {1}); }),
            (std::vector<double>{0, 0.5, 0.5, 0.5, 0, 0.5}));
  EXPECT_EQ(grad_of({1, 3, 1, 5, 2, 2}, {2, 3}, [](const Tensor& x) { return amin(x, {1}); }),
            (std::vector<double>{0.5, 0, 0.5, 0, 0.5, 0.5}));
  // max(dim) sends the whole gradient to the index it returns.
  Tensor x = as_leaf(from_vector<double>({1, 3, 3, 5, 2, 5}, Shape{2, 3}));
  auto [values, indices] = max(x, 1);
  values.sum().backward();
  std::vector<double> g = x.grad().to_vector<double>();
  std::vector<int64_t> idx = indices.to_vector<int64_t>();
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(g[r * 3 + j], j == idx[r] ? 1.0 : 0.0);
}

TEST(AutogradOps, VarStd) {
  Cfg c = with_gradgrad();
  Gen u = uniform(-2, 2);
  for (int64_t correction : {0, 1}) {
    std::string suffix = " correction " + std::to_string(correction);
    // Reduce at least two elements: std is not differentiable at zero variance, and
    // correction 1 over one element divides by zero.
    check_shaped("var" + suffix,
                 reduction([correction](const Tensor& x, const std::vector<int64_t>& d,
                                        bool k) { return var(x, d, correction, k); },
                           2),
                 u, c);
    check_shaped("std" + suffix,
                 reduction([correction](const Tensor& x, const std::vector<int64_t>& d,
                                        bool k) { return kiln::std(x, d, correction, k); },
                           2),
                 u, c);
    check_shaped("Tensor::var" + suffix,
                 reduction([correction](const Tensor& x, const std::vector<int64_t>& d,
                                        bool k) { return x.var(d, correction, k); },
                           2),
                 u, c);
    check_shaped("Tensor::std" + suffix,
                 reduction([correction](const Tensor& x, const std::vector<int64_t>& d,
                                        bool k) { return x.std(d, correction, k); },
                           2),
                 u, c);
  }
}

TEST(AutogradOps, Logsumexp) {
  Cfg c = with_gradgrad();
  check_shaped("logsumexp", reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return logsumexp(x, d, k);
               }),
               uniform(-3, 3), c);
  check_shaped("Tensor::logsumexp",
               reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) {
                 return x.logsumexp(d, k);
               }),
               uniform(-3, 3), c);
}

TEST(AutogradOps, SumToSize) {
  Cfg c = with_gradgrad();
  check_shaped(
      "sum_to_size",
      [](const Shape& s) {
        // A shape s broadcasts from: a suffix with some dims set to 1.
        size_t keep = static_cast<size_t>(uniform_int(0, static_cast<int>(s.size())));
        Shape target(s.end() - static_cast<std::ptrdiff_t>(keep), s.end());
        for (auto& d : target)
          if (coin(0.4)) d = 1;
        return Op1{"to " + str(target),
                   [target](const Tensor& x) { return sum_to_size(x, target); }};
      },
      uniform(-2, 2), c);
}

// ------------------------------------------------------------------------------- linear algebra

int64_t rand_size(int lo = 1, int hi = 4) {
  return uniform_int(lo, hi);
}

// Both operands of a product in every layout (the leaves themselves non-contiguous).
void check_product(const std::string& name, const Fn2& f, const Shape& sa, const Shape& sb,
                   bool gradgrad) {
  Tensor a = random_tensor(sa, kFloat64, -2, 2), b = random_tensor(sb, kFloat64, -2, 2);
  std::vector<Variant> va = variants(a, sa), vb = variants(b, sb);
  for (const std::string& layout : kLayoutNames) {
    const Variant* xa = find_variant(va, layout);
    const Variant* xb = find_variant(vb, layout);
    if (!xa && !xb) continue;
    if (!xa) xa = &va[0];
    if (!xb) xb = &vb[0];
    std::string what =
        name + " on " + xa->name + " " + str(sa) + " and " + xb->name + " " + str(sb);
    if (!check1(
            what, [f](const std::vector<Tensor>& in) { return f(in[0], in[1]); },
            {xa->leaf, xb->leaf}, gradgrad))
      return;
  }
}

TEST(AutogradOps, MmBmm) {
  for (int it = 0; it < kIters; ++it) {
    int64_t n = rand_size(), k = rand_size(), m = rand_size(), b = rand_size(1, 3);
    check_product(
        "mm", [](const Tensor& x, const Tensor& y) { return mm(x, y); }, {n, k}, {k, m}, true);
    check_product(
        "Tensor::mm", [](const Tensor& x, const Tensor& y) { return x.mm(y); }, {n, k}, {k, m},
        false);
    check_product(
        "bmm", [](const Tensor& x, const Tensor& y) { return bmm(x, y); }, {b, n, k}, {b, k, m},
        false);
  }
}

TEST(AutogradOps, Matmul) {
  Fn2 mmul = [](const Tensor& x, const Tensor& y) { return matmul(x, y); };
  for (int it = 0; it < kIters; ++it) {
    int64_t n = rand_size(), k = rand_size(), m = rand_size();
    check_product("matmul 1-D.1-D", mmul, {k}, {k}, true);
    check_product("matmul 1-D.2-D", mmul, {k}, {k, m}, true);
    check_product("matmul 2-D.1-D", mmul, {n, k}, {k}, true);
    check_product("matmul 2-D.2-D", mmul, {n, k}, {k, m}, true);
    check_product("matmul batched, broadcast batch", mmul, {2, 1, n, k}, {3, k, m}, true);
    check_product("matmul 1-D.batched", mmul, {k}, {2, k, m}, false);
    check_product("matmul batched.1-D", mmul, {2, n, k}, {k}, false);
    check_product(
        "Tensor::matmul", [](const Tensor& x, const Tensor& y) { return x.matmul(y); }, {2, n, k},
        {2, k, m}, false);
  }
}

TEST(AutogradOps, Linear) {
  for (int it = 0; it < kIters; ++it) {
    int64_t in = rand_size(), out = rand_size();
    for (const Shape& xs : {Shape{in}, Shape{rand_size(), in}, Shape{2, rand_size(1, 2), in}}) {
      Tensor x = random_tensor(xs, kFloat64, -2, 2);
      Tensor w = random_tensor({out, in}, kFloat64, -2, 2);
      Tensor b = random_tensor({out}, kFloat64, -2, 2);
      std::vector<Variant> vx = variants(x, xs), vw = variants(w, w.sizes());
      for (const std::string& layout : kLayoutNames) {
        const Variant* a = find_variant(vx, layout);
        const Variant* c = find_variant(vw, layout);
        if (!a && !c) continue;
        if (!a) a = &vx[0];
        if (!c) c = &vw[0];
        std::string what = "linear on " + a->name + " x " + str(xs) + ", " + c->name + " weight";
        if (!check1(
                what + " with bias",
                [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); },
                {a->leaf, c->leaf, as_leaf(b.clone())}, true))
          return;
        if (!check1(
                what + " without bias",
                [](const std::vector<Tensor>& t) { return linear(t[0], t[1]); }, {a->leaf, c->leaf},
                true))
          return;
      }
    }
  }
}

TEST(AutogradOps, Addmm) {
  for (int it = 0; it < kIters; ++it) {
    int64_t n = rand_size(), k = rand_size(), m = rand_size();
    Shape self_shape = coin() ? Shape{n, m} : Shape{m};
    Tensor self = random_tensor(self_shape, kFloat64, -2, 2);
    Tensor m1 = random_tensor({n, k}, kFloat64, -2, 2);
    Tensor m2 = random_tensor({k, m}, kFloat64, -2, 2);
    std::vector<Variant> v1 = variants(m1, m1.sizes()), v2 = variants(m2, m2.sizes());
    for (const std::string& layout : kLayoutNames) {
      const Variant* a = find_variant(v1, layout);
      const Variant* b = find_variant(v2, layout);
      if (!a && !b) continue;
      if (!a) a = &v1[0];
      if (!b) b = &v2[0];
      std::string what = "addmm self " + str(self_shape) + " m1 " + a->name + " " + str({n, k}) +
                         " m2 " + b->name + " " + str({k, m});
      if (!check1(
              what, [](const std::vector<Tensor>& t) { return addmm(t[0], t[1], t[2], 0.5, 2.0); },
              {as_leaf(self.clone()), a->leaf, b->leaf}, true))
        return;
      if (!check1(
              what + " default beta alpha",
              [](const std::vector<Tensor>& t) { return addmm(t[0], t[1], t[2]); },
              {as_leaf(self.clone()), a->leaf, b->leaf}, false))
        return;
    }
  }
}

// ------------------------------------------------------------------------------- indexing

TEST(AutogradOps, IndexSelectGatherEmbedding) {
  for (int it = 0; it < kIters; ++it) {
    Shape s = small_shape(1, 3);
    Tensor x = random_tensor(s, kFloat64, -2, 2);
    for (const Variant& v : variants(x, s)) {
      int64_t dim = random_dim(s);
      int64_t size = s[dim < 0 ? dim + static_cast<int64_t>(s.size()) : dim];
      // Repeated indices make the gradient accumulate.
      Tensor index = random_index({rand_size(1, 4)}, size);
      check1(
          "index_select dim " + std::to_string(dim) + " on " + v.name + " " + str(s),
          [dim, index](const std::vector<Tensor>& in) { return index_select(in[0], dim, index); },
          {v.leaf}, true);
      Shape is = s;
      int64_t d = dim < 0 ? dim + static_cast<int64_t>(s.size()) : dim;
      for (size_t i = 0; i < is.size(); ++i)
        is[i] =
            static_cast<int64_t>(i) == d ? rand_size(1, 4) : uniform_int(1, static_cast<int>(s[i]));
      Tensor gindex = random_index(is, size);
      check1(
          "gather dim " + std::to_string(dim) + " index " + str(is) + " on " + v.name + " " +
              str(s),
          [dim, gindex](const std::vector<Tensor>& in) { return gather(in[0], dim, gindex); },
          {v.leaf}, true);
    }
    int64_t vocab = rand_size(2, 5), width = rand_size(1, 3);
    Tensor w = random_tensor({vocab, width}, kFloat64, -2, 2);
    Shape ishape = small_shape(0, 2, 6);
    Tensor ids = random_index(ishape, vocab);
    for (const Variant& v : variants(w, w.sizes()))
      check1(
          "embedding " + str(ishape) + " on " + v.name + " weight " + str(w.sizes()),
          [ids](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {v.leaf}, true);
  }
}

TEST(AutogradOps, CatStack) {
  for (int it = 0; it < kIters; ++it) {
    Shape s = small_shape(1, 3, 12);
    int64_t dim = random_dim(s);
    int64_t d = dim < 0 ? dim + static_cast<int64_t>(s.size()) : dim;
    Shape s2 = s;
    s2[d] = rand_size(1, 3);
    Tensor a = random_tensor(s, kFloat64, -2, 2), b = random_tensor(s2, kFloat64, -2, 2);
    std::vector<Variant> va = variants(a, s), vb = variants(b, s2);
    for (const std::string& layout : kLayoutNames) {
      const Variant* x = find_variant(va, layout);
      const Variant* y = find_variant(vb, layout);
      if (!x && !y) continue;
      if (!x) x = &va[0];
      if (!y) y = &vb[0];
      check1(
          "cat dim " + std::to_string(dim) + " of " + x->name + " " + str(s) + ", " + y->name +
              " " + str(s2) + " and itself",
          [dim](const std::vector<Tensor>& in) {
            return cat({in[0], in[1], in[0]}, dim);
          },
          {x->leaf, y->leaf}, true);
    }
    Tensor c = random_tensor(s, kFloat64, -2, 2);
    int64_t sdim = uniform_int(0, static_cast<int>(s.size()));
    std::vector<Variant> vc = variants(c, s);
    for (size_t i = 0; i < va.size() && i < vc.size(); ++i)
      check1(
          "stack dim " + std::to_string(sdim) + " of " + va[i].name + " and " + vc[i].name + " " +
              str(s),
          [sdim](const std::vector<Tensor>& in) {
            return stack({in[0], in[1]}, sdim);
          },
          {va[i].leaf, vc[i].leaf}, true);
  }
}

TEST(AutogradOps, IndexAddScatterAdd) {
  for (int it = 0; it < kIters; ++it) {
    int64_t rows = rand_size(2, 4), cols = rand_size(1, 4), n = rand_size(1, 4);
    Tensor self = random_tensor({rows, cols}, kFloat64, -2, 2);
    Tensor index = random_index({n}, rows);
    Tensor src0 = random_tensor({n, cols}, kFloat64, -2, 2);
    Tensor src1 = random_tensor({rows, n}, kFloat64, -2, 2);
    Tensor index1 = random_index({n}, cols);
    std::vector<Variant> vs = variants(self, self.sizes()), v0 = variants(src0, src0.sizes());
    for (size_t i = 0; i < vs.size() && i < v0.size(); ++i) {
      std::string what =
          "on " + vs[i].name + " self " + str({rows, cols}) + ", " + v0[i].name + " src";
      check1(
          "index_add dim 0 " + what,
          [index](const std::vector<Tensor>& in) { return index_add(in[0], 0, index, in[1]); },
          {vs[i].leaf, v0[i].leaf}, true);
    }
    check1("index_add dim 1",
           [index1](const std::vector<Tensor>& in) { return index_add(in[0], 1, index1, in[1]); },
           {as_leaf(self.clone()), as_leaf(src1.clone())});
    // scatter_add: index and src of the same shape, no larger than self off the scatter dim.
    int64_t sr = rand_size(1, 4), sc = uniform_int(1, static_cast<int>(cols));
    Tensor sindex = random_index({sr, sc}, rows);
    Tensor ssrc = random_tensor({sr, sc}, kFloat64, -2, 2);
    std::vector<Variant> vss = variants(ssrc, ssrc.sizes());
    for (size_t i = 0; i < vs.size() && i < vss.size(); ++i)
      check1(
          "scatter_add dim 0 index " + str({sr, sc}) + " on " + vs[i].name + " self " +
              str({rows, cols}) + ", " + vss[i].name + " src",
          [sindex](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, sindex, in[1]); },
          {vs[i].leaf, vss[i].leaf}, true);
    int64_t tc = rand_size(1, 4);
    Tensor tindex = random_index({rows, tc}, cols);
    check1("scatter_add dim 1",
           [tindex](const std::vector<Tensor>& in) { return scatter_add(in[0], 1, tindex, in[1]); },
           {as_leaf(self.clone()), as_leaf(random_tensor({rows, tc}, kFloat64, -2, 2))});
  }
}

TEST(AutogradOps, SliceScatterAsStrided) {
  Tensor self = random_tensor({4, 5}, kFloat64, -2, 2);
  for (const Variant& v : variants(self, self.sizes())) {
    check1(
        "slice_scatter dim 1 1:5:2 on " + v.name,
        [](const std::vector<Tensor>& in) { return slice_scatter(in[0], in[1], 1, 1, 5, 2); },
        {v.leaf, as_leaf(random_tensor({4, 2}, kFloat64))}, true);
    check1(
        "slice_scatter dim 0 default range on " + v.name,
        [](const std::vector<Tensor>& in) { return slice_scatter(in[0], in[1]); },
        {v.leaf, as_leaf(random_tensor({4, 5}, kFloat64))}, true);
  }
  Tensor flat = as_leaf(random_tensor({12}, kFloat64));
  check1(
      "as_strided window",
      [](const std::vector<Tensor>& in) {
        return as_strided(in[0], {3, 3}, {3, 1}, 1);
      },
      {flat}, true);
  // Overlapping windows: one input element feeds several outputs.
  check1(
      "as_strided overlapping",
      [](const std::vector<Tensor>& in) {
        return as_strided(in[0], {4, 3}, {2, 1}, 0);
      },
      {flat}, true);
  check1(
      "as_strided transposed geometry",
      [](const std::vector<Tensor>& in) {
        return as_strided(in[0], {2, 3}, {1, 4});
      },
      {flat}, true);
  check1(
      "as_strided of an intermediate",
      [](const std::vector<Tensor>& in) {
        return as_strided(in[0] * 2.0, {2, 2}, {4, 2}, 1);
      },
      {flat}, true);
  check1(
      "as_strided_scatter",
      [](const std::vector<Tensor>& in) {
        return as_strided_scatter(in[0], in[1], {3, 2}, {4, 1}, 1);
      },
      {flat, as_leaf(random_tensor({3, 2}, kFloat64))}, true);
  Tensor mat = as_leaf(random_tensor({3, 4}, kFloat64));
  check1(
      "as_strided_scatter 2-D",
      [](const std::vector<Tensor>& in) {
        return as_strided_scatter(in[0], in[1], {2, 2}, {4, 2}, 1);
      },
      {mat, as_leaf(random_tensor({2, 2}, kFloat64))}, true);
}

// ------------------------------------------------------------------------------- views

TEST(AutogradOps, Views) {
  for (int it = 0; it < kIters; ++it) {
    int64_t a = rand_size(1, 3), b = rand_size(2, 3), c = rand_size(1, 3);
    Shape s{a, b, c};
    Tensor x = random_tensor(s, kFloat64, -2, 2);
    for (const Variant& v : variants(x, s)) {
      std::vector<std::pair<std::string, Fn1>> ops = {
          {"view",
           [=](const Tensor& t) {
             return t.contiguous().view({a * b, c});
           }},
          {"reshape",
           [=](const Tensor& t) {
             return t.reshape({c, a * b});
           }},
          {"reshape -1", [=](const Tensor& t) { return t.reshape({-1}); }},
          {"permute",
           [](const Tensor& t) {
             return t.permute({2, 0, 1});
           }},
          {"transpose", [](const Tensor& t) { return t.transpose(0, 2); }},
          {"t", [](const Tensor& t) { return t.select(0, 0).t(); }},
          {"unsqueeze", [](const Tensor& t) { return t.unsqueeze(1).unsqueeze(-1); }},
          {"squeeze", [](const Tensor& t) { return t.unsqueeze(0).squeeze(); }},
          {"squeeze(dim)", [](const Tensor& t) { return t.unsqueeze(2).squeeze(2); }},
          {"expand",
           [=](const Tensor& t) {
             return t.unsqueeze(1).expand({a, 2, b, c});
           }},
          {"expand -1",
           [=](const Tensor& t) {
             return t.unsqueeze(0).expand({2, -1, -1, -1});
           }},
          {"expand_as", [=](const Tensor& t) { return t.narrow(1, 0, 1).expand_as(t) * t; }},
          {"narrow", [=](const Tensor& t) { return t.narrow(1, 1, b - 1); }},
          {"slice step 2", [](const Tensor& t) { return t.slice(1, 0, std::nullopt, 2); }},
          {"slice negative start", [](const Tensor& t) { return t.slice(-1, -1); }},
          {"select", [](const Tensor& t) { return t.select(1, -1); }},
          {"operator[]", [](const Tensor& t) { return t[0]; }},
          {"flatten", [](const Tensor& t) { return t.flatten(); }},
          {"flatten(1, 2)", [](const Tensor& t) { return t.flatten(1, 2); }},
          {"contiguous", [](const Tensor& t) { return t.contiguous(); }},
          {"clone", [](const Tensor& t) { return t.clone(); }},
          {"to float64", [](const Tensor& t) { return t.to(kFloat64); }},
          {"view of a view",
           [=](const Tensor& t) { return t.transpose(0, 1).slice(0, 1).reshape({-1}) * 3.0; }},
      };
      for (const auto& [name, f] : ops) {
        Fn1 fn = f;
        check1(
            name + " on " + v.name + " " + str(s),
            [fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {v.leaf}, true);
      }
    }
  }
}

TEST(AutogradOps, MultiOutputViews) {
  Tensor x = random_tensor({5, 3}, kFloat64, -2, 2);
  for (const Variant& v : variants(x, x.sizes())) {
    auto checks = std::vector<std::pair<std::string, DifferentiableFunction>>{
        {"chunk", [](const std::vector<Tensor>& in) { return in[0].chunk(3, 0); }},
        {"chunk dim 1", [](const std::vector<Tensor>& in) { return in[0].chunk(2, 1); }},
        {"split size", [](const std::vector<Tensor>& in) { return in[0].split(2, 0); }},
        {"split sizes",
         [](const std::vector<Tensor>& in) {
           return in[0].split(std::vector<int64_t>{1, 4});
         }},
        {"unbind", [](const std::vector<Tensor>& in) { return in[0].unbind(1); }},
        // Only some pieces reach the output: the others get zero gradient.
        {"chunk, one piece used",
         [](const std::vector<Tensor>& in) {
           return std::vector<Tensor>{in[0].chunk(3, 0)[1] * 2.0};
         }},
        {"unbind, two pieces used",
         [](const std::vector<Tensor>& in) {
           auto parts = in[0].unbind(0);
           return std::vector<Tensor>{parts[0] * parts[3]};
         }},
    };
    for (const auto& [name, fn] : checks) check(name + " on " + v.name, fn, {v.leaf}, true);
  }
}

TEST(AutogradOps, DtypeConversions) {
  // Rounding to float32 makes finite differences with eps 1e-6 meaningless; step well above
  // float32's resolution.
  GradcheckOptions o;
  o.eps = 1e-3;
  o.atol = 1e-4;
  o.rtol = 1e-3;
  Tensor x = random_tensor({3, 2}, kFloat64, -2, 2);
  for (const Variant& v : variants(x, x.sizes()))
    check1(
        "to float32 and back on " + v.name,
        [](const std::vector<Tensor>& in) {
          Tensor f = in[0].to(kFloat32);
          EXPECT_EQ(f.dtype(), kFloat32);
          return (f * 2.0f).to(kFloat64);
        },
        {v.leaf}, false, o);
  check1(
      "float32 intermediate promoted by a float64 operand",
      [](const std::vector<Tensor>& in) { return in[0].to(kFloat32) * in[1]; },
      {as_leaf(x.clone()), as_leaf(random_tensor({2}, kFloat64))}, false, o);
}

TEST(AutogradOps, InPlaceMethods) {
  Gen u = uniform(-2, 2);
  Tensor x = random_tensor({3, 4}, kFloat64, -2, 2);
  Tensor w = random_tensor({4}, kFloat64, 0.5, 2);
  for (const Variant& v : variants(x, x.sizes())) {
    check1(
        "add_ sub_ mul_ div_ on " + v.name,
        [](const std::vector<Tensor>& in) {
          Tensor y = in[0] * 1.0;
          y.add_(in[1], 2);
          y.sub_(in[1]);
          y.mul_(in[1]);
          y.div_(in[1] + 1.0);
          y.add_(0.5).sub_(1.0).mul_(3.0).div_(2.0);
          return y;
        },
        {v.leaf, as_leaf(w.clone())}, true);
    check1(
        "operators += -= *= /= on " + v.name,
        [](const std::vector<Tensor>& in) {
          // sin saves its input, not its output, so the in-place ops below are legal.
          Tensor y = sin(in[0]);
          y += in[1];
          y *= in[1];
          y -= in[0];
          y /= in[1];
          return y;
        },
        {v.leaf, as_leaf(w.clone())}, true);
    check1(
        "clamp_ on " + v.name,
        [](const std::vector<Tensor>& in) {
          Tensor y = in[0] * 1.0;
          y.clamp_(-0.5, 0.5);
          return y;
        },
        {as_leaf(avoiding(u, {-0.5, 0.5}, 0.05)(x.sizes()))}, true);
    check1(
        "copy_ fill_ zero_ on " + v.name,
        [](const std::vector<Tensor>& in) {
          Tensor y = in[0] * 2.0;
          y.narrow(0, 0, 1).copy_(in[1].unsqueeze(0));
          y.select(0, 1).fill_(3.0);
          y.narrow(1, 3, 1).zero_();
          return y * in[0];
        },
        {v.leaf, as_leaf(w.clone())}, true);
  }
}

// ------------------------------------------------------------------------------- nn ops

TEST(AutogradOps, SoftmaxLogSoftmax) {
  Cfg c = with_gradgrad();
  c.min_rank = 1;
  c.max_numel = 12;
  Cfg c1;
  c1.min_rank = 1;
  for (bool log : {false, true}) {
    check_shaped(
        log ? "log_softmax" : "softmax",
        [log](const Shape& s) {
          int64_t d = random_dim(s);
          return Op1{"dim " + std::to_string(d),
                     [d, log](const Tensor& x) { return log ? log_softmax(x, d) : softmax(x, d); }};
        },
        uniform(-3, 3), c);
    check_shaped(
        log ? "Tensor::log_softmax" : "Tensor::softmax",
        [log](const Shape& s) {
          int64_t d = random_dim(s);
          return Op1{"dim " + std::to_string(d),
                     [d, log](const Tensor& x) { return log ? x.log_softmax(d) : x.softmax(d); }};
        },
        uniform(-3, 3), c1);
  }
}

TEST(AutogradOps, LayerNorm) {
  for (int it = 0; it < kIters; ++it) {
    int64_t n = rand_size(1, 3), a = rand_size(1, 2), d = rand_size(2, 4);
    for (int norm_dims : {1, 2}) {
      Shape xs{n, a, d};
      Shape ns = norm_dims == 1 ? Shape{d} : Shape{a, d};
      if (norm_dims == 2 && a * d < 2) continue;
      Tensor x = random_tensor(xs, kFloat64, -2, 2);
      Tensor w = random_tensor(ns, kFloat64, 0.5, 2);
      Tensor b = random_tensor(ns, kFloat64, -1, 1);
      for (const Variant& v : variants(x)) {
        std::string what = "layer_norm " + str(ns) + " on " + v.name + " " + str(xs);
        Fn1 p = v.prep;
        bool gg = true;
        check1(
            what + " with weight and bias",
            [p, ns](const std::vector<Tensor>& in) {
              return layer_norm(p(in[0]), ns, in[1], in[2]);
            },
            {v.leaf, as_leaf(w.clone()), as_leaf(b.clone())}, gg);
        check1(
            what + " with weight only",
            [p, ns](const std::vector<Tensor>& in) { return layer_norm(p(in[0]), ns, in[1]); },
            {v.leaf, as_leaf(w.clone())}, false);
        check1(
            what + " with bias only",
            [p, ns](const std::vector<Tensor>& in) {
              return layer_norm(p(in[0]), ns, Tensor(), in[1]);
            },
            {v.leaf, as_leaf(b.clone())}, false);
        check1(
            what + " without affine",
            [p, ns](const std::vector<Tensor>& in) { return layer_norm(p(in[0]), ns); }, {v.leaf},
            gg);
      }
    }
  }
}

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Mean ? "mean" : "sum";
}

TEST(AutogradOps, CrossEntropyNllLoss) {
  for (int it = 0; it < kIters; ++it) {
    int64_t n = rand_size(1, 4), c = rand_size(2, 5);
    Tensor logits = random_tensor({n, c}, kFloat64, -3, 3);
    Tensor target = random_index({n}, c);
    Tensor logits1 = random_tensor({c}, kFloat64, -3, 3);
    Tensor target1 = scalar_tensor(int64_t{uniform_int(0, static_cast<int>(c) - 1)}, kInt64);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      std::string red = std::string(" reduction ") + reduction_name(r);
      for (const Variant& v : variants(logits, logits.sizes())) {
        std::string what = " on " + v.name + " " + str({n, c}) + red;
        check1(
            "cross_entropy" + what,
            [target, r](const std::vector<Tensor>& in) { return cross_entropy(in[0], target, r); },
            {v.leaf}, true);
        check1(
            "nll_loss" + what,
            [target, r](const std::vector<Tensor>& in) { return nll_loss(in[0], target, r); },
            {v.leaf}, true);
        check1(
            "nll_loss of log_softmax" + what,
            [target, r](const std::vector<Tensor>& in) {
              return nll_loss(log_softmax(in[0], 1), target, r);
            },
            {v.leaf}, true);
      }
      check1(
          "cross_entropy 1-D" + red,
          [target1, r](const std::vector<Tensor>& in) { return cross_entropy(in[0], target1, r); },
          {as_leaf(logits1.clone())});
      check1("nll_loss 1-D" + red,
             [target1, r](const std::vector<Tensor>& in) { return nll_loss(in[0], target1, r); },
             {as_leaf(logits1.clone())});
    }
  }
}

TEST(AutogradOps, MseLoss) {
  for (int it = 0; it < kIters; ++it) {
    int64_t n = rand_size(1, 3), c = rand_size(1, 4);
    Tensor input = random_tensor({n, c}, kFloat64, -2, 2);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      for (const Shape& ts : {Shape{n, c}, Shape{c}, Shape{n, 1}}) {
        Tensor target = random_tensor(ts, kFloat64, -2, 2);
        for (const Variant& v : variants(input, input.sizes())) {
          check1(
              "mse_loss on " + v.name + " " + str({n, c}) + " target " + str(ts) + " reduction " +
                  reduction_name(r),
              [r](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], r); },
              {v.leaf, as_leaf(target.clone())}, true);
        }
      }
    }
  }
}

TEST(AutogradOps, Dropout) {
  Tensor x = random_tensor({4, 5}, kFloat64, -2, 2);
  for (const Variant& v : variants(x)) {
    Fn1 p = v.prep;
    // Reseeding inside fn gives every finite-difference evaluation the same mask.
    check1(
        "dropout p=0.3 on " + v.name,
        [p](const std::vector<Tensor>& in) {
          manual_seed(1234);
          return dropout(p(in[0]), 0.3);
        },
        {v.leaf}, true);
    check1(
        "dropout eval mode on " + v.name,
        [p](const std::vector<Tensor>& in) { return dropout(p(in[0]), 0.3, false) * 2.0; },
        {v.leaf}, true);
    check1(
        "dropout p=1 on " + v.name,
        [p](const std::vector<Tensor>& in) { return dropout(p(in[0]), 1.0); }, {v.leaf}, true);
  }
}

}  // namespace
}  // namespace kiln
