// Every elementwise op against a float64 reference over random shapes, broadcasts, layouts and
// dtypes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/testing.h"

namespace kiln {
namespace {

using testing::values;

const std::vector<DType> kAllTypes = {kFloat32, kFloat64, kInt32, kInt64, kBool};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Where an op's inputs are drawn from: [lo, hi), optionally kept away from zero or rounded to
// multiples of 0.5 (so that comparisons see ties).
struct Domain {
  double lo = -3, hi = 3;
  bool nonzero = false;
  bool discrete = false;
};

// How an op's result dtype follows from the promoted input type.
enum class Rule { Same, Float, Bool };

Tensor make_input(const Shape& shape, DType dt, const Domain& d) {
  auto& g = testing::rng();
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  for (auto& x : v) {
    if (dt == kBool) {
      x = std::uniform_int_distribution<int>(0, 1)(g);
      continue;
    }
    x = std::uniform_real_distribution<double>(d.lo, d.hi)(g);
    if (d.discrete) x = std::round(x * 2) / 2;
    if (is_integral(dt)) x = std::floor(x);
    if (d.nonzero && std::fabs(x) < 0.25) x = (x < 0 ? -1 : 1) * (is_integral(dt) ? 1 : 0.5);
  }
  return from_vector(v, shape).to(dt);
}

DType out_type(Rule r, DType promoted) {
  if (r == Rule::Bool) return kBool;
  if (r == Rule::Float) return to_floating(promoted);
  return promoted;
}

// The reference value as the result dtype stores it (bool keeps only truth; integers are exact).
double as_type(DType dt, double v) {
  if (dt == kBool) return v != 0 ? 1 : 0;
  return v;
}

struct Tol {
  double rtol, atol;
};
Tol tolerance(DType dt) {
  if (dt == kFloat64) return {1e-12, 1e-12};
  if (dt == kFloat32) return {1e-6, 1e-6};
  return {0, 0};
}

// torch's promotion of two tensors: dimensioned tensors outrank 0-dim ones, which only count when
// they are of a higher category (bool < integer < floating).
DType expected_promotion(const Tensor& a, const Tensor& b) {
  bool za = a.dim() == 0, zb = b.dim() == 0;
  if (za == zb) return promote_types(a.dtype(), b.dtype());
  DType hi = za ? b.dtype() : a.dtype(), lo = za ? a.dtype() : b.dtype();
  auto category = [](DType d) { return d == kBool ? 0 : is_integral(d) ? 1 : 2; };
  return category(lo) > category(hi) ? promote_types(hi, lo) : hi;
}

// Two broadcast-compatible shapes: both derived from one shape by dropping leading dims and
// setting random dims to 1.
std::pair<Shape, Shape> broadcast_pair() {
  auto& g = testing::rng();
  Shape full = testing::random_shape(0, 4, 5);
  auto derive = [&](Shape s) {
    if (!s.empty() && std::uniform_int_distribution<int>(0, 2)(g) == 0) {
      size_t drop = std::uniform_int_distribution<size_t>(1, s.size())(g);
      s.erase(s.begin(), s.begin() + drop);
    }
    for (auto& d : s)
      if (std::uniform_int_distribution<int>(0, 3)(g) == 0) d = 1;
    return s;
  };
  return {derive(full), derive(full)};
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ------------------------------------------------------------------------------------ unary ops
struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  std::function<double(double)> ref;
  Rule rule;
  Domain domain = {};
  bool bool_ok = true;
};

double sigmoid_ref(double x) {
  return 1 / (1 + std::exp(-x));
}
double gelu_ref(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double softplus_ref(double x, double beta, double threshold) {
  return beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
}
// erfinv by bisection on erf; digamma and trigamma by the recurrence up to 20 and their
// asymptotic series there (reflected for x < 0).
double erfinv_ref(double y) {
  if (std::fabs(y) >= 1) return std::fabs(y) == 1 ? y * INFINITY : NAN;
  double lo = -6, hi = 6;
  for (int i = 0; i < 200 && lo < hi; ++i) {
    const double mid = (lo + hi) / 2;
    if (mid == lo || mid == hi) break;
    (std::erf(mid) < y ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}
double digamma_ref(double x) {
  if (x <= 0 && x == std::trunc(x)) return x == 0 ? -1 / x : NAN;  // torch's poles
  if (x < 0) return digamma_ref(1 - x) - M_PI / std::tan(M_PI * (x - std::trunc(x)));
  double shift = 0;
  for (; x < 20; x += 1) shift -= 1 / x;
  const double z = 1 / (x * x);
  return shift + std::log(x) - 0.5 / x -
         z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z / 132))));
}
double trigamma_ref(double x) {
  if (x <= 0 && x == std::trunc(x)) return INFINITY;
  if (x < 0) {
    const double s = std::sin(M_PI * (x - std::trunc(x)));
    return M_PI * M_PI / (s * s) - trigamma_ref(1 - x);
  }
  double shift = 0;
  for (; x < 20; x += 1) shift += 1 / (x * x);
  const double z = 1 / (x * x);
  return shift + 1 / x + z / 2 + z / x * (1.0 / 6 - z * (1.0 / 30 - z * (1.0 / 42 - z / 30)));
}
double round_half_even(double x) {
  double f = std::floor(x), diff = x - f;
  if (diff > 0.5) return f + 1;
  if (diff < 0.5) return f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

const std::vector<UnaryCase>& unary_cases() {
  const Domain positive{0.1, 5}, wide{-6, 6};
  static const std::vector<UnaryCase> cases = {
      {"neg",
       [](const Tensor& x) { return neg(x); },
       [](double x) { return -x; },
       Rule::Same,
       {},
       false},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); },
       Rule::Same},
      {"sign",
       [](const Tensor& x) { return sign(x); },
       [](double x) { return double((x > 0) - (x < 0)); },
       Rule::Same,
       {-3, 3, false, true}},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); },
       Rule::Float},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); },
       Rule::Float, positive},
      {"log1p",
       [](const Tensor& x) { return log1p(x); },
       [](double x) { return std::log1p(x); },
       Rule::Float,
       {-0.9, 3}},
      {"expm1", [](const Tensor& x) { return expm1(x); }, [](double x) { return std::expm1(x); },
       Rule::Float},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); },
       Rule::Float, positive},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
       Rule::Float, positive},
      {"reciprocal",
       [](const Tensor& x) { return reciprocal(x); },
       [](double x) { return 1 / x; },
       Rule::Float,
       {-3, 3, true}},
      {"sin", [](const Tensor& x) { return sin(x); }, [](double x) { return std::sin(x); },
       Rule::Float, wide},
      {"cos", [](const Tensor& x) { return cos(x); }, [](double x) { return std::cos(x); },
       Rule::Float, wide},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); },
       Rule::Float},
      {"tan",
       [](const Tensor& x) { return tan(x); },
       [](double x) { return std::tan(x); },
       Rule::Float,
       {-1.4, 1.4}},
      {"atan", [](const Tensor& x) { return atan(x); }, [](double x) { return std::atan(x); },
       Rule::Float, wide},
      {"asin",
       [](const Tensor& x) { return asin(x); },
       [](double x) { return std::asin(x); },
       Rule::Float,
       {-1, 1}},
      {"acos",
       [](const Tensor& x) { return acos(x); },
       [](double x) { return std::acos(x); },
       Rule::Float,
       {-1, 1}},
      {"sinh", [](const Tensor& x) { return sinh(x); }, [](double x) { return std::sinh(x); },
       Rule::Float, wide},
      {"cosh", [](const Tensor& x) { return cosh(x); }, [](double x) { return std::cosh(x); },
       Rule::Float, wide},
      {"asinh", [](const Tensor& x) { return asinh(x); }, [](double x) { return std::asinh(x); },
       Rule::Float, wide},
      {"acosh",
       [](const Tensor& x) { return acosh(x); },
       [](double x) { return std::acosh(x); },
       Rule::Float,
       {1, 6}},
      {"exp2", [](const Tensor& x) { return exp2(x); }, [](double x) { return std::exp2(x); },
       Rule::Float},
      {"log2", [](const Tensor& x) { return log2(x); }, [](double x) { return std::log2(x); },
       Rule::Float, positive},
      {"log10", [](const Tensor& x) { return log10(x); }, [](double x) { return std::log10(x); },
       Rule::Float, positive},
      {"sinc", [](const Tensor& x) { return sinc(x); },
       [](double x) { return x == 0 ? 1.0 : std::sin(M_PI * x) / (M_PI * x); }, Rule::Float, wide},
      {"atanh",
       [](const Tensor& x) { return atanh(x); },
       [](double x) { return std::atanh(x); },
       Rule::Float,
       {-0.99, 0.99}},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_ref, Rule::Float, wide},
      {"relu",
       [](const Tensor& x) { return relu(x); },
       [](double x) { return x > 0 ? x : 0; },
       Rule::Same,
       {},
       false},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, Rule::Float, wide},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, gelu_tanh_ref, Rule::Float,
       wide},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigmoid_ref(x); },
       Rule::Float, wide},
      {"softplus", [](const Tensor& x) { return softplus(x); },
       [](double x) { return softplus_ref(x, 1, 20); }, Rule::Float, wide},
      {"softplus_beta2_threshold1", [](const Tensor& x) { return softplus(x, 2.0, 1.0); },
       [](double x) { return softplus_ref(x, 2, 1); }, Rule::Float},
      {"erf", [](const Tensor& x) { return erf(x); }, [](double x) { return std::erf(x); },
       Rule::Float},
      {"erfc", [](const Tensor& x) { return erfc(x); }, [](double x) { return std::erfc(x); },
       Rule::Float, wide},
      {"erfinv", [](const Tensor& x) { return erfinv(x); }, erfinv_ref, Rule::Float, {-0.99, 0.99}},
      {"lgamma", [](const Tensor& x) { return lgamma(x); }, [](double x) { return std::lgamma(x); },
       Rule::Float, wide},
      {"digamma", [](const Tensor& x) { return digamma(x); }, digamma_ref, Rule::Float, wide},
      {"trigamma", [](const Tensor& x) { return trigamma(x); }, trigamma_ref, Rule::Float, wide},
      {"floor", [](const Tensor& x) { return floor(x); }, [](double x) { return std::floor(x); },
       Rule::Same},
      {"ceil", [](const Tensor& x) { return ceil(x); }, [](double x) { return std::ceil(x); },
       Rule::Same},
      {"round", [](const Tensor& x) { return round(x); }, round_half_even, Rule::Same},
      {"trunc", [](const Tensor& x) { return trunc(x); }, [](double x) { return std::trunc(x); },
       Rule::Same},
      {"round_ties",
       [](const Tensor& x) { return round(x); },
       round_half_even,
       Rule::Same,
       {-4, 4, false, true}},
      {"logical_not",
       [](const Tensor& x) { return logical_not(x); },
       [](double x) { return double(x == 0); },
       Rule::Bool,
       {-2, 2, false, true}},
      {"isnan", [](const Tensor& x) { return isnan(x); },
       [](double x) { return double(std::isnan(x)); }, Rule::Bool},
      {"signbit", [](const Tensor& x) { return signbit(x); },
       [](double x) { return double(std::signbit(x)); }, Rule::Bool},
      {"isfinite", [](const Tensor& x) { return isfinite(x); },
       [](double x) { return double(std::isfinite(x)); }, Rule::Bool},
  };
  return cases;
}

void PrintTo(const UnaryCase& c, std::ostream* os) {
  *os << c.name;
}

class UnaryTest : public ::testing::TestWithParam<UnaryCase> {};

// Checks a one-input op against its float64 reference over random shapes, every dtype and layout.
template <typename Fn, typename Ref, typename OutType>
void check_against_reference(const std::string& name, const Fn& fn, const Ref& ref, bool bool_ok,
                             const OutType& out_type_of, const Domain& domain, int iters) {
  for (DType dt : kAllTypes) {
    for (int iter = 0; iter < iters; ++iter) {
      Shape shape = testing::random_shape(0, 4, 5);
      Tensor x = make_input(shape, dt, domain);
      SCOPED_TRACE(::testing::Message() << name << " of " << dt << ::testing::PrintToString(shape));
      if (dt == kBool && !bool_ok) {
        EXPECT_THROW(fn(x), Error);
        continue;
      }
      DType out = out_type_of(dt);
      std::vector<double> xv = values(x), expected(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) expected[i] = as_type(out, ref(xv[i]));
      Tol tol = tolerance(out);
      for (const auto& [layout, lx] : testing::layouts(x)) {
        SCOPED_TRACE(layout);
        testing::expect_close(fn(lx), expected, shape, out, tol.rtol, tol.atol);
      }
    }
  }
}

TEST_P(UnaryTest, MatchesReference) {
  const UnaryCase& c = GetParam();
  check_against_reference(
      c.name, c.fn, c.ref, c.bool_ok, [&](DType dt) { return out_type(c.rule, dt); }, c.domain, 25);
}

INSTANTIATE_TEST_SUITE_P(Ops, UnaryTest, ::testing::ValuesIn(unary_cases()),
                         [](const auto& info) { return info.param.name; });

// ----------------------------------------------------------------------------------- binary ops
// Which promoted types a case runs on.
enum class Scope { All, FloatOnly, IntegralOnly };

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> fn;
  std::function<double(double, double)> ref;
  Rule rule;
  Domain a_domain = {}, b_domain = {};
  bool bool_ok = true;  // whether a bool operand is accepted
  Scope scope = Scope::All;
};

double python_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

const std::vector<BinaryCase>& binary_cases() {
  const Domain discrete{-3, 3, false, true}, nonzero{-3, 3, true}, exponent{0, 3};
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); },
       [](double a, double b) { return a + b; }, Rule::Same},
      {"add_alpha2", [](const Tensor& a, const Tensor& b) { return add(a, b, 2); },
       [](double a, double b) { return a + 2 * b; }, Rule::Same},
      {"add_alpha_half",
       [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); },
       [](double a, double b) { return a + 0.5 * b; },
       Rule::Same,
       {},
       {},
       true,
       Scope::FloatOnly},
      {"sub",
       [](const Tensor& a, const Tensor& b) { return sub(a, b); },
       [](double a, double b) { return a - b; },
       Rule::Same,
       {},
       {},
       false},
      {"sub_alpha3",
       [](const Tensor& a, const Tensor& b) { return sub(a, b, 3); },
       [](double a, double b) { return a - 3 * b; },
       Rule::Same,
       {},
       {},
       false},
      {"sub_alpha_half",
       [](const Tensor& a, const Tensor& b) { return sub(a, b, -0.5); },
       [](double a, double b) { return a + 0.5 * b; },
       Rule::Same,
       {},
       {},
       false,
       Scope::FloatOnly},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); },
       [](double a, double b) { return a * b; }, Rule::Same},
      {"div",
       [](const Tensor& a, const Tensor& b) { return div(a, b); },
       [](double a, double b) { return a / b; },
       Rule::Float,
       {},
       nonzero},
      {"atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); },
       [](double a, double b) { return std::atan2(a, b); }, Rule::Float},
      {"pow",
       [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); },
       Rule::Same,
       {},
       {},
       false,
       Scope::FloatOnly},
      {"pow_int",
       [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); },
       Rule::Same,
       {},
       exponent,
       false,
       Scope::IntegralOnly},
      {"remainder",
       [](const Tensor& a, const Tensor& b) { return remainder(a, b); },
       python_mod,
       Rule::Same,
       {-5, 5},
       nonzero,
       false,
       Scope::FloatOnly},
      {"remainder_int",
       [](const Tensor& a, const Tensor& b) { return remainder(a, b); },
       python_mod,
       Rule::Same,
       {-7, 7},
       nonzero,
       false,
       Scope::IntegralOnly},
      {"fmod",
       [](const Tensor& a, const Tensor& b) { return fmod(a, b); },
       [](double a, double b) { return std::fmod(a, b); },
       Rule::Same,
       {-7, 7},
       nonzero,
       false},
      {"div_trunc",
       [](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); },
       [](double a, double b) { return std::trunc(a / b); },
       Rule::Same,
       {-7, 7},
       nonzero,
       false},
      {"div_floor",
       [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); },
       [](double a, double b) { return std::floor(a / b); },
       Rule::Same,
       {-7, 7},
       nonzero,
       false},
      {"floor_divide",
       [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); },
       [](double a, double b) { return std::floor(a / b); },
       Rule::Same,
       {-7, 7},
       nonzero,
       false},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, Rule::Same, discrete, discrete},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, Rule::Same, discrete, discrete},
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); },
       [](double a, double b) { return double(a == b); }, Rule::Bool, discrete, discrete},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); },
       [](double a, double b) { return double(a != b); }, Rule::Bool, discrete, discrete},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); },
       [](double a, double b) { return double(a < b); }, Rule::Bool, discrete, discrete},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); },
       [](double a, double b) { return double(a <= b); }, Rule::Bool, discrete, discrete},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); },
       [](double a, double b) { return double(a > b); }, Rule::Bool, discrete, discrete},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); },
       [](double a, double b) { return double(a >= b); }, Rule::Bool, discrete, discrete},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); },
       [](double a, double b) { return double(a != 0 && b != 0); }, Rule::Bool, discrete, discrete},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); },
       [](double a, double b) { return double(a != 0 || b != 0); }, Rule::Bool, discrete, discrete},
      {"logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); },
       [](double a, double b) { return double((a != 0) != (b != 0)); }, Rule::Bool, discrete,
       discrete},
      {"xlogy", [](const Tensor& a, const Tensor& b) { return xlogy(a, b); },
       [](double a, double b) { return a == 0 ? 0.0 : a * std::log(b); }, Rule::Float, discrete,
       Domain{0.25, 4}},
      {"hypot", [](const Tensor& a, const Tensor& b) { return hypot(a, b); },
       [](double a, double b) { return std::hypot(a, b); }, Rule::Float},
      {"copysign", [](const Tensor& a, const Tensor& b) { return copysign(a, b); },
       [](double a, double b) { return std::copysign(a, b); }, Rule::Float},
      {"fmax", [](const Tensor& a, const Tensor& b) { return fmax(a, b); },
       [](double a, double b) { return std::isnan(b) || a >= b ? a : b; }, Rule::Same},
      {"fmin", [](const Tensor& a, const Tensor& b) { return fmin(a, b); },
       [](double a, double b) { return std::isnan(b) || a <= b ? a : b; }, Rule::Same},
      {"heaviside",
       [](const Tensor& a, const Tensor& b) { return heaviside(a, b); },
       [](double a, double b) { return a == 0 ? b : double(a > 0); },
       Rule::Same,
       discrete,
       {},
       false},
      {"logaddexp", [](const Tensor& a, const Tensor& b) { return logaddexp(a, b); },
       [](double a, double b) { return std::log(std::exp(a) + std::exp(b)); }, Rule::Float},
      {"rsub",
       [](const Tensor& a, const Tensor& b) { return rsub(a, b); },
       [](double a, double b) { return b - a; },
       Rule::Same,
       {},
       {},
       false},
      {"operator_plus", [](const Tensor& a, const Tensor& b) { return a + b; },
       [](double a, double b) { return a + b; }, Rule::Same},
      {"operator_minus",
       [](const Tensor& a, const Tensor& b) { return a - b; },
       [](double a, double b) { return a - b; },
       Rule::Same,
       {},
       {},
       false},
      {"operator_times", [](const Tensor& a, const Tensor& b) { return a * b; },
       [](double a, double b) { return a * b; }, Rule::Same},
      {"operator_divide",
       [](const Tensor& a, const Tensor& b) { return a / b; },
       [](double a, double b) { return a / b; },
       Rule::Float,
       {},
       nonzero},
  };
  return cases;
}

// Runs `fn` on every pairing of a's and b's layouts and compares with `expected`.
void check_layouts(const std::function<Tensor(const Tensor&, const Tensor&)>& fn, const Tensor& a,
                   const Tensor& b, const std::vector<double>& expected, const Shape& shape,
                   DType out) {
  Tol tol = tolerance(out);
  auto la = testing::layouts(a), lb = testing::layouts(b);
  for (size_t i = 0; i < la.size(); ++i) {
    for (size_t j = 0; j < lb.size(); ++j) {
      if (i != 0 && j != 0 && i != j) continue;  // every layout of each side, and matched pairs
      SCOPED_TRACE(la[i].first + " with " + lb[j].first);
      testing::expect_close(fn(la[i].second, lb[j].second), expected, shape, out, tol.rtol,
                            tol.atol);
    }
  }
}

void PrintTo(const BinaryCase& c, std::ostream* os) {
  *os << c.name;
}

class BinaryTest : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BinaryTest, MatchesReference) {
  const BinaryCase& c = GetParam();
  for (DType da : kAllTypes) {
    for (DType db : kAllTypes) {
      for (int iter = 0; iter < (da == db ? 12 : 3); ++iter) {
        auto [sa, sb] = broadcast_pair();
        Tensor a = make_input(sa, da, c.a_domain), b = make_input(sb, db, c.b_domain);
        DType promoted = expected_promotion(a, b);
        bool floating = is_floating_point(promoted);
        if ((c.scope == Scope::FloatOnly && !floating) ||
            (c.scope == Scope::IntegralOnly && floating))
          continue;
        SCOPED_TRACE(::testing::Message() << c.name << ": " << da << ::testing::PrintToString(sa)
                                          << " with " << db << ::testing::PrintToString(sb));
        if (!c.bool_ok && (da == kBool || db == kBool)) {
          EXPECT_THROW(c.fn(a, b), Error);
          continue;
        }
        Shape shape = testing::broadcast_shape(sa, sb);
        DType out = out_type(c.rule, promoted);
        std::vector<double> av = values(a), bv = values(b), expected(numel_of(shape));
        for (size_t i = 0; i < expected.size(); ++i) {
          auto idx = testing::unravel(static_cast<int64_t>(i), shape);
          expected[i] = as_type(out, c.ref(testing::broadcast_at(a, av, idx, shape),
                                           testing::broadcast_at(b, bv, idx, shape)));
        }
        check_layouts(c.fn, a, b, expected, shape, out);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BinaryTest, ::testing::ValuesIn(binary_cases()),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------- ops with C++ numbers
struct ScalarCase {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  std::function<double(double)> ref;
  // The result dtype for a tensor of the given dtype.
  std::function<DType(DType)> dtype;
  bool bool_ok = true;
  bool int_ok = true;
};

DType same(DType d) {
  return d;
}
DType at_least_int64(DType d) {
  return d == kBool ? kInt64 : d;
}
DType at_least_float32(DType d) {
  return is_floating_point(d) ? d : kFloat32;
}

const std::vector<ScalarCase>& scalar_cases() {
  static const std::vector<ScalarCase> cases = {
      {"plus_int", [](const Tensor& t) { return t + 2; }, [](double x) { return x + 2; },
       at_least_int64},
      {"int_plus", [](const Tensor& t) { return 2 + t; }, [](double x) { return 2 + x; },
       at_least_int64},
      {"plus_float", [](const Tensor& t) { return t + 2.5; }, [](double x) { return x + 2.5; },
       at_least_float32},
      {"float_plus", [](const Tensor& t) { return 2.5 + t; }, [](double x) { return 2.5 + x; },
       at_least_float32},
      {"minus_int", [](const Tensor& t) { return t - 3; }, [](double x) { return x - 3; }, same,
       false},
      {"int_minus", [](const Tensor& t) { return 3 - t; }, [](double x) { return 3 - x; }, same,
       false},
      {"minus_float", [](const Tensor& t) { return t - 0.25; }, [](double x) { return x - 0.25; },
       at_least_float32, false},
      {"float_minus", [](const Tensor& t) { return 0.25 - t; }, [](double x) { return 0.25 - x; },
       at_least_float32, false},
      {"times_int", [](const Tensor& t) { return t * 2; }, [](double x) { return x * 2; },
       at_least_int64},
      {"int_times", [](const Tensor& t) { return 3 * t; }, [](double x) { return 3 * x; },
       at_least_int64},
      {"times_float", [](const Tensor& t) { return t * 2.5; }, [](double x) { return x * 2.5; },
       at_least_float32},
      {"float_times", [](const Tensor& t) { return 2.5 * t; }, [](double x) { return 2.5 * x; },
       at_least_float32},
      {"divide_int", [](const Tensor& t) { return t / 2; }, [](double x) { return x / 2; },
       at_least_float32},
      {"int_divide", [](const Tensor& t) { return 2 / t; }, [](double x) { return 2 / x; },
       at_least_float32},
      {"divide_float", [](const Tensor& t) { return t / 0.5; }, [](double x) { return x / 0.5; },
       at_least_float32},
      {"float_divide", [](const Tensor& t) { return 1.5 / t; }, [](double x) { return 1.5 / x; },
       at_least_float32},
      {"unary_minus", [](const Tensor& t) { return -t; }, [](double x) { return -x; }, same, false},
      {"times_bool", [](const Tensor& t) { return t * true; }, [](double x) { return x; }, same},
      {"add_method_scalar", [](const Tensor& t) { return add(t, 7); },
       [](double x) { return x + 7; }, at_least_int64},
      {"sub_method_scalar", [](const Tensor& t) { return sub(t, 7); },
       [](double x) { return x - 7; }, same, false},
      {"mul_method_scalar", [](const Tensor& t) { return mul(t, -2); },
       [](double x) { return -2 * x; }, at_least_int64},
      {"div_method_scalar", [](const Tensor& t) { return div(t, 4); },
       [](double x) { return x / 4; }, at_least_float32},
      {"pow_tensor_int", [](const Tensor& t) { return pow(t, 2); }, [](double x) { return x * x; },
       same, false},
      {"pow_tensor_float", [](const Tensor& t) { return pow(t.abs(), 0.5); },
       [](double x) { return std::sqrt(std::fabs(x)); }, at_least_float32, false},
      {"pow_method", [](const Tensor& t) { return t.pow(3); }, [](double x) { return x * x * x; },
       same, false},
      {"pow_int_base", [](const Tensor& t) { return pow(2, t.abs()); },
       [](double x) { return std::pow(2, std::fabs(x)); }, same, false},
      {"pow_float_base", [](const Tensor& t) { return pow(2.5, t); },
       [](double x) { return std::pow(2.5, x); }, at_least_float32, false},
      {"remainder_float", [](const Tensor& t) { return remainder(t, -1.5); },
       [](double x) { return python_mod(x, -1.5); }, at_least_float32, false},
      {"remainder_int", [](const Tensor& t) { return remainder(t, 3); },
       [](double x) { return python_mod(x, 3); }, same, false},
      {"eq_scalar", [](const Tensor& t) { return eq(t, 1); },
       [](double x) { return double(x == 1); }, [](DType) { return kBool; }},
      {"ne_scalar", [](const Tensor& t) { return ne(t, 1); },
       [](double x) { return double(x != 1); }, [](DType) { return kBool; }},
      {"lt_scalar", [](const Tensor& t) { return lt(t, 0.5); },
       [](double x) { return double(x < 0.5); }, [](DType) { return kBool; }},
      {"le_scalar", [](const Tensor& t) { return le(t, 0); },
       [](double x) { return double(x <= 0); }, [](DType) { return kBool; }},
      {"gt_scalar", [](const Tensor& t) { return gt(t, -1); },
       [](double x) { return double(x > -1); }, [](DType) { return kBool; }},
      {"ge_scalar", [](const Tensor& t) { return ge(t, 1.5); },
       [](double x) { return double(x >= 1.5); }, [](DType) { return kBool; }},
  };
  return cases;
}

void PrintTo(const ScalarCase& c, std::ostream* os) {
  *os << c.name;
}

class ScalarOperandTest : public ::testing::TestWithParam<ScalarCase> {};

TEST_P(ScalarOperandTest, MatchesReferenceAndDType) {
  const ScalarCase& c = GetParam();
  const Domain domain{-3, 3, true, true};  // nonzero multiples of 0.5
  check_against_reference(c.name, c.fn, c.ref, c.bool_ok, c.dtype, domain, 10);
}

INSTANTIATE_TEST_SUITE_P(Ops, ScalarOperandTest, ::testing::ValuesIn(scalar_cases()),
                         [](const auto& info) { return info.param.name; });

// ------------------------------------------------------------------------------- where, clamp
TEST(Where, MatchesReferenceWithThreeWayBroadcast) {
  auto& g = testing::rng();
  for (DType da : kAllTypes) {
    for (DType db : kAllTypes) {
      for (int iter = 0; iter < 4; ++iter) {
        auto [sa, sb] = broadcast_pair();
        Shape sc = std::uniform_int_distribution<int>(0, 1)(g) ? sa : sb;
        for (auto& d : sc)
          if (std::uniform_int_distribution<int>(0, 2)(g) == 0) d = 1;
        Tensor cond = make_input(sc, kBool, {}), a = make_input(sa, da, {}),
               b = make_input(sb, db, {});
        Shape shape = testing::broadcast_shape(testing::broadcast_shape(sc, sa), sb);
        DType out = expected_promotion(a, b);
        std::vector<double> cv = values(cond), av = values(a), bv = values(b),
                            expected(numel_of(shape));
        for (size_t i = 0; i < expected.size(); ++i) {
          auto idx = testing::unravel(static_cast<int64_t>(i), shape);
          expected[i] = testing::broadcast_at(cond, cv, idx, shape) != 0
                            ? testing::broadcast_at(a, av, idx, shape)
                            : testing::broadcast_at(b, bv, idx, shape);
        }
        SCOPED_TRACE(::testing::Message()
                     << "where " << ::testing::PrintToString(sc) << ", " << da
                     << ::testing::PrintToString(sa) << ", " << db << ::testing::PrintToString(sb));
        for (const auto& [layout, lc] : testing::layouts(cond)) {
          SCOPED_TRACE(layout);
          testing::expect_close(where(lc, a, b), expected, shape, out, 0, 0);
        }
        check_layouts([&](const Tensor& x, const Tensor& y) { return where(cond, x, y); }, a, b,
                      expected, shape, out);
      }
    }
  }
}

TEST(Where, ScalarOtherKeepsTensorType) {
  Tensor cond = from_vector(std::vector<bool>{true, false, true});
  Tensor a = from_vector(std::vector<int32_t>{1, 2, 3});
  testing::expect_close(where(cond, a, 0), {1, 0, 3}, {3}, kInt32, 0, 0);
  testing::expect_close(where(cond, a, 0.5), {1, 0.5, 3}, {3}, kFloat32, 0, 0);
  Tensor f = from_vector(std::vector<double>{1.5, 2.5, 3.5});
  testing::expect_close(where(cond, f, -1), {1.5, -1, 3.5}, {3}, kFloat64, 0, 0);
}

struct ClampCase {
  std::optional<Scalar> lo, hi;
};

TEST(Clamp, MinOnlyMaxOnlyAndBoth) {
  const std::vector<ClampCase> cases = {{Scalar(-1), std::nullopt},   {std::nullopt, Scalar(1)},
                                        {Scalar(-1), Scalar(2)},      {Scalar(-0.5), Scalar(1.5)},
                                        {std::nullopt, Scalar(0.25)}, {Scalar(2), Scalar(-2)}};
  for (DType dt : {kFloat32, kFloat64, kInt32, kInt64}) {
    for (const auto& c : cases) {
      bool float_bound = (c.lo && c.lo->is_floating_point()) || (c.hi && c.hi->is_floating_point());
      DType out = float_bound ? to_floating(dt) : dt;
      for (int iter = 0; iter < 10; ++iter) {
        Shape shape = testing::random_shape(0, 4, 5);
        Tensor x = make_input(shape, dt, {-4, 4});
        std::vector<double> xv = values(x), expected(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) {
          double v = xv[i];
          if (c.lo) v = std::max(v, c.lo->to_double());
          if (c.hi) v = std::min(v, c.hi->to_double());  // min > max gives max, as torch
          expected[i] = v;
        }
        SCOPED_TRACE(::testing::Message() << "clamp of " << dt << ::testing::PrintToString(shape)
                                          << " to [" << (c.lo ? *c.lo : Scalar(-999)) << ", "
                                          << (c.hi ? *c.hi : Scalar(999)) << "]");
        for (const auto& [layout, lx] : testing::layouts(x)) {
          SCOPED_TRACE(layout);
          testing::expect_close(clamp(lx, c.lo, c.hi), expected, shape, out, 0, 0);
          testing::expect_close(lx.clamp(c.lo, c.hi), expected, shape, out, 0, 0);
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------ special values
TEST(SpecialValues, MinimumMaximumPropagateNaN) {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor a = from_vector(std::vector<double>{kNaN, 1, kNaN, -kInf, 2}).to(dt);
    Tensor b = from_vector(std::vector<double>{1, kNaN, kNaN, 0, kInf}).to(dt);
    testing::expect_close(minimum(a, b), {kNaN, kNaN, kNaN, -kInf, 2}, {5}, dt, 0, 0);
    testing::expect_close(maximum(a, b), {kNaN, kNaN, kNaN, 0, kInf}, {5}, dt, 0, 0);
    testing::expect_close(minimum(b, a), {kNaN, kNaN, kNaN, -kInf, 2}, {5}, dt, 0, 0);
    testing::expect_close(maximum(b, a), {kNaN, kNaN, kNaN, 0, kInf}, {5}, dt, 0, 0);
  }
}

TEST(SpecialValues, PredicatesOnNonFinite) {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = from_vector(std::vector<double>{kNaN, kInf, -kInf, 0, -1.5, 1e30}).to(dt);
    testing::expect_close(isnan(x), {1, 0, 0, 0, 0, 0}, {6}, kBool, 0, 0);
    testing::expect_close(isfinite(x), {0, 0, 0, 1, 1, 1}, {6}, kBool, 0, 0);
    testing::expect_close(logical_not(x), {0, 0, 0, 1, 0, 0}, {6}, kBool, 0, 0);
    testing::expect_close(eq(x, x), {0, 1, 1, 1, 1, 1}, {6}, kBool, 0, 0);
    testing::expect_close(ne(x, x), {1, 0, 0, 0, 0, 0}, {6}, kBool, 0, 0);
  }
  Tensor i = from_vector(std::vector<int64_t>{0, -5, 7});
  testing::expect_close(isnan(i), {0, 0, 0}, {3}, kBool, 0, 0);
  testing::expect_close(isfinite(i), {1, 1, 1}, {3}, kBool, 0, 0);
}

// isinf, isposinf and isneginf: false for integers; nan_to_num's defaults are the dtype's largest
// and lowest finite values; integers are copied.
TEST(SpecialValues, InfinityTestsAndNanToNum) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor x = from_vector(std::vector<double>{kInf, -kInf, kNaN, 0, -2.5, 0x1p100}).to(dtype);
    testing::expect_close(isinf(x), {1, 1, 0, 0, 0, 0}, {6}, kBool, 0, 0);
    testing::expect_close(isposinf(x), {1, 0, 0, 0, 0, 0}, {6}, kBool, 0, 0);
    testing::expect_close(x.isneginf(), {0, 1, 0, 0, 0, 0}, {6}, kBool, 0, 0);
    const double big =
        dtype == kFloat32 ? std::numeric_limits<float>::max() : std::numeric_limits<double>::max();
    testing::expect_close(nan_to_num(x), {big, -big, 0, 0, -2.5, 0x1p100}, {6}, dtype, 0, 0);
    testing::expect_close(x.nan_to_num(7, 8, std::nullopt), {8, -big, 7, 0, -2.5, 0x1p100}, {6},
                          dtype, 0, 0);
    testing::expect_close(nan_to_num(x, std::nullopt, std::nullopt, -1),
                          {big, -1, 0, 0, -2.5, 0x1p100}, {6}, dtype, 0, 0);
  }
  Tensor i = from_vector(std::vector<int64_t>{0, -5, 7});
  testing::expect_close(isinf(i), {0, 0, 0}, {3}, kBool, 0, 0);
  testing::expect_close(isneginf(i > 0), {0, 0, 0}, {3}, kBool, 0, 0);
  Tensor copy = nan_to_num(i, 1.0);
  EXPECT_FALSE(copy.is_same(i));
  testing::expect_close(copy, {0, -5, 7}, {3}, kInt64, 0, 0);
}

// xlogy is 0 where a is 0 unless b is NaN (0 log 0, 0 log -1 and 0 log inf are 0); elsewhere
// a log(b), NaN for a negative b. rsub is b - alpha a; clip is clamp; sgn is sign.
TEST(SpecialValues, XlogyRsubClipAndSgn) {
  Tensor a = from_vector(std::vector<double>{0, 0, 0, 0, -0.0, 2, 2, 2, kNaN, kInf});
  Tensor b = from_vector(std::vector<double>{0, -1, kInf, kNaN, 3, 0, -1, kInf, 1, 0});
  testing::expect_close(xlogy(a, b), {0, 0, 0, kNaN, 0, -kInf, kNaN, kInf, kNaN, -kInf}, {10},
                        kFloat64, 0, 0);
  testing::expect_close(xlogy(from_vector(std::vector<int32_t>{0, 3}), 2.0), {0, 3 * std::log(2.0)},
                        {2}, kFloat32, 1e-6, 0);
  Tensor x = from_vector(std::vector<double>{1, -2, 3.5});
  testing::expect_close(rsub(x, 10), {9, 12, 6.5}, {3}, kFloat64, 0, 0);
  testing::expect_close(rsub(x, x * 4, 2), {2, -4, 7}, {3}, kFloat64, 0, 0);
  testing::expect_close(clip(x, -1, 2), {1, -1, 2}, {3}, kFloat64, 0, 0);
  testing::expect_close(x.clip(std::nullopt, 0), {0, -2, 0}, {3}, kFloat64, 0, 0);
  testing::expect_close(clip(x, x * 0 + 2), {2, 2, 3.5}, {3}, kFloat64, 0, 0);
  testing::expect_close(sgn(x), {1, -1, 1}, {3}, kFloat64, 0, 0);
}

// torch reads logical_and/logical_or's operands in their common dtype: a float64 denormal (or a
// double scalar) beside a float32 tensor becomes 0 there, so false. Eager and recorded alike.
TEST(SpecialValues, LogicalOpsReadTruthInTheCommonDType) {
  for (bool lazy : {false, true}) {
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    LazyGuard guard(lazy);
    Tensor x = from_vector(std::vector<float>{1e-30f, 0.0f, 2.0f});
    Tensor tiny = from_vector(std::vector<double>{4.9406564584124654e-324}, Shape{});
    testing::expect_close(logical_or(x, tiny), {1, 0, 1}, {3}, kBool, 0, 0);
    testing::expect_close(logical_or(tiny, x), {1, 0, 1}, {3}, kBool, 0, 0);
    testing::expect_close(logical_and(x.abs() + 1, tiny), {0, 0, 0}, {3}, kBool, 0, 0);
    testing::expect_close(logical_or(x, 1e-300), {1, 0, 1}, {3}, kBool, 0, 0);
    // Operands of one dtype are read as they are.
    testing::expect_close(logical_or(x.to(kFloat64), tiny), {1, 1, 1}, {3}, kBool, 0, 0);
  }
}

TEST(SpecialValues, ReluAndClampPassNaNThrough) {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = from_vector(std::vector<double>{kNaN, -kInf, kInf, -1, 0.5}).to(dt);
    testing::expect_close(relu(x), {kNaN, 0, kInf, 0, 0.5}, {5}, dt, 0, 0);
    testing::expect_close(clamp(x, -2, 0.25), {kNaN, -2, 0.25, -1, 0.25}, {5}, dt, 0, 0);
    testing::expect_close(exp(x), {kNaN, 0, kInf, std::exp(-1), std::exp(0.5)}, {5}, dt, 1e-6, 0);
    testing::expect_close(sigmoid(x), {kNaN, 0, 1, sigmoid_ref(-1), sigmoid_ref(0.5)}, {5}, dt,
                          1e-6, 0);
    testing::expect_close(tanh(x), {kNaN, -1, 1, std::tanh(-1), std::tanh(0.5)}, {5}, dt, 1e-6, 0);
  }
}

TEST(SpecialValues, RoundHalfToEven) {
  Tensor x = from_vector(
      std::vector<float>{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 3.5f, 0.49999997f, -3.7f, 4.2f});
  testing::expect_close(round(x), {-2, -2, -0.0, 0, 2, 2, 4, 0, -4, 4}, {10}, kFloat32, 0, 0);
  testing::expect_close(round(x.to(kFloat64)), {-2, -2, -0.0, 0, 2, 2, 4, 0, -4, 4}, {10}, kFloat64,
                        0, 0);
  Tensor i = from_vector(std::vector<int32_t>{-3, 0, 5});
  testing::expect_close(round(i), {-3, 0, 5}, {3}, kInt32, 0, 0);
  testing::expect_close(floor(i), {-3, 0, 5}, {3}, kInt32, 0, 0);
  testing::expect_close(ceil(i), {-3, 0, 5}, {3}, kInt32, 0, 0);
}

TEST(SpecialValues, IntegerRoundingKeepsLargeInt64Exact) {
  const int64_t big = (int64_t{1} << 53) + 1;  // not representable as a double
  Tensor x = from_vector(std::vector<int64_t>{big, -big});
  for (const Tensor& r : {floor(x), ceil(x), round(x), abs(x), sign(x), relu(x), neg(x)})
    EXPECT_EQ(r.dtype(), kInt64);
  EXPECT_EQ(floor(x).to_vector<int64_t>(), (std::vector<int64_t>{big, -big}));
  EXPECT_EQ(ceil(x).to_vector<int64_t>(), (std::vector<int64_t>{big, -big}));
  EXPECT_EQ(round(x).to_vector<int64_t>(), (std::vector<int64_t>{big, -big}));
  EXPECT_EQ(abs(x).to_vector<int64_t>(), (std::vector<int64_t>{big, big}));
  EXPECT_EQ(neg(x).to_vector<int64_t>(), (std::vector<int64_t>{-big, big}));
  EXPECT_EQ((x + 1).to_vector<int64_t>(), (std::vector<int64_t>{big + 1, -big + 1}));
}

TEST(SpecialValues, RemainderHasTheSignOfTheDivisor) {
  Tensor a = from_vector(std::vector<double>{-3, 3, -3.5, 5, 4, -0.0, 7.25});
  Tensor b = from_vector(std::vector<double>{2, -2, 2, -3, 2, 3, 0});
  testing::expect_close(remainder(a, b), {1, -1, 0.5, -1, 0, 0, kNaN}, {7}, kFloat64, 0, 0);
  testing::expect_close(remainder(a.to(kFloat32), -2.5), {-0.5, -2, -1, 0, -1, 0, -0.25}, {7},
                        kFloat32, 1e-6, 1e-6);
}

TEST(SpecialValues, IntegerRemainderHasTheSignOfTheDivisor) {
  Tensor a = from_vector(std::vector<int32_t>{-3, 3, -7, 7, 6, 0});
  Tensor b = from_vector(std::vector<int32_t>{2, -2, 3, -3, -3, -5});
  testing::expect_close(remainder(a, b), {1, -1, 2, -2, 0, 0}, {6}, kInt32, 0, 0);
  testing::expect_close(remainder(a.to(kInt64), 4), {1, 3, 1, 3, 2, 0}, {6}, kInt64, 0, 0);
  testing::expect_close(remainder(a, -4), {-3, -1, -3, -1, -2, 0}, {6}, kInt32, 0, 0);
}

// div with "trunc" rounds toward zero, with "floor" toward -inf (Python's //, -0 where the quotient
// is a negative fraction of 1 only with "trunc"); fmod has the dividend's sign. A zero divisor
// gives the IEEE quotient; an infinite one leaves a finite dividend of the other sign a floor of
// -1.
TEST(SpecialValues, RoundedDivisionAndFmod) {
  Tensor a = from_vector(std::vector<double>{-7, 7, -7.5, 7.5, -0.5, 0.5, 1, -1, 0, 0.5, 0.5});
  Tensor b = from_vector(std::vector<double>{2, -2, 2, 2, 2, 2, 0, 0, 0, -kInf, kInf});
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor x = a.to(dtype), y = b.to(dtype);
    testing::expect_close(div(x, y, "trunc"), {-3, -3, -3, 3, -0.0, 0, kInf, -kInf, kNaN, -0.0, 0},
                          {11}, dtype, 0, 0);
    testing::expect_close(div(x, y, "floor"), {-4, -4, -4, 3, -1, 0, kInf, -kInf, kNaN, -1, 0},
                          {11}, dtype, 0, 0);
    testing::expect_close(fmod(x, y), {-1, 1, -1.5, 1.5, -0.5, 0.5, kNaN, kNaN, kNaN, 0.5, 0.5},
                          {11}, dtype, 0, 0);
    const std::vector<double> trunc = div(x, y, "trunc").to(kFloat64).to_vector<double>();
    EXPECT_TRUE(std::signbit(trunc[4]) && std::signbit(trunc[9])) << dtype_name(dtype);
    EXPECT_FALSE(std::signbit(trunc[5]) || std::signbit(trunc[10])) << dtype_name(dtype);
  }
}

// a == floor_divide(a, b) * b + remainder(a, b) where the product is exact: floor division
// divides a - fmod(a, b), so an a / b that rounds to an integer does not round the floor past
// remainder's quotient (a = 3 b rounded, whose fmod is nearly b: floor 2, remainder nearly b).
TEST(SpecialValues, FloorDivisionIsConsistentWithRemainder) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> av, bv;
  for (int i = 0; i < 4000; ++i) {
    const float b = u(rng);
    av.push_back(i % 2 ? u(rng) : 3 * b);  // half of them at a rounded multiple
    bv.push_back(b);
  }
  Tensor a = from_vector(av), b = from_vector(bv);
  const std::vector<float> q = floor_divide(a, b).to_vector<float>();
  const std::vector<float> r = remainder(a, b).to_vector<float>();
  for (size_t i = 0; i < av.size(); ++i) {
    if (bv[i] == 0) continue;
    const double rebuilt = double(q[i]) * double(bv[i]) + double(r[i]);
    EXPECT_NEAR(rebuilt, av[i], 1e-6 * std::abs(av[i])) << av[i] << " // " << bv[i];
  }
}

// Integers stay integers: C's quotient and remainder, and the floored quotient; the lowest
// integer over -1 wraps (to itself); a zero divisor raises, naming the op.
TEST(SpecialValues, IntegerRoundedDivisionAndFmod) {
  const int32_t lowest = std::numeric_limits<int32_t>::min();
  Tensor a = from_vector(std::vector<int32_t>{-7, 7, -7, 7, lowest, 0, 6});
  Tensor b = from_vector(std::vector<int32_t>{2, 2, -2, -2, -1, 5, -3});
  testing::expect_close(div(a, b, "trunc"), {-3, 3, 3, -3, lowest, 0, -2}, {7}, kInt32, 0, 0);
  testing::expect_close(div(a, b, "floor"), {-4, 3, 3, -4, lowest, 0, -2}, {7}, kInt32, 0, 0);
  testing::expect_close(floor_divide(a.to(kInt64), 2), {-4, 3, -4, 3, lowest / 2, 0, 3}, {7},
                        kInt64, 0, 0);
  testing::expect_close(fmod(a, b), {-1, 1, -1, 1, 0, 0, 0}, {7}, kInt32, 0, 0);
  testing::expect_error([&] { div(a, b - 2, "floor"); }, {"div_floor", "integer division by zero"});
  testing::expect_error([&] { div(a, 0, "trunc"); }, {"div_trunc", "integer division by zero"});
  testing::expect_error([&] { fmod(a, b * 0); }, {"fmod", "integer division by zero"});
  testing::expect_error([&] { div(a, b, "round"); },
                        {"div", "rounding_mode", "\"round\"", "int32", "[7]"});
}

// Rounded quotients are piecewise constant: their gradient is 0 for both operands, summed over
// broadcast dims to each operand's shape; fmod's dividend gets all of g.
TEST(SpecialValues, RoundedDivisionGradientIsZero) {
  Tensor a = testing::random_tensor({2, 3}).requires_grad_();
  Tensor b = (testing::random_tensor({3}).abs() + 0.5).requires_grad_();
  (div(a, b, "floor") + div(a, b, "trunc") * 2 + floor_divide(a, 1.5)).sum().backward();
  testing::expect_close(a.grad(), std::vector<double>(6, 0.0), {2, 3}, kFloat32, 0, 0);
  testing::expect_close(b.grad(), std::vector<double>(3, 0.0), {3}, kFloat32, 0, 0);
  Tensor x = testing::random_tensor({4}).requires_grad_();
  fmod(x, 0.7).sum().backward();
  testing::expect_close(x.grad(), std::vector<double>(4, 1.0), {4}, kFloat32, 0, 0);
}

TEST(SpecialValues, IntegerPowerAndDivision) {
  Tensor base = from_vector(std::vector<int64_t>{-3, -2, 0, 1, 2, 3, 10});
  Tensor exponent = from_vector(std::vector<int64_t>{3, 0, 0, 5, 10, 4, 2});
  testing::expect_close(pow(base, exponent), {-27, 1, 1, 1, 1024, 81, 100}, {7}, kInt64, 0, 0);
  testing::expect_close(pow(base, 2), {9, 4, 0, 1, 4, 9, 100}, {7}, kInt64, 0, 0);
  testing::expect_close(pow(2, exponent), {8, 1, 1, 32, 1024, 16, 4}, {7}, kInt64, 0, 0);
  // True division of integers gives float32, including division by zero.
  Tensor num = from_vector(std::vector<int32_t>{7, -7, 1, 0, -1});
  Tensor den = from_vector(std::vector<int32_t>{2, 2, 0, 0, 0});
  testing::expect_close(div(num, den), {3.5, -3.5, kInf, kNaN, -kInf}, {5}, kFloat32, 0, 0);
}

TEST(SpecialValues, SoftplusThresholdSwitchesToIdentity) {
  Tensor x = from_vector(std::vector<double>{-30, 0, 10, 19.5, 20, 20.5, 100});
  std::vector<double> expected;
  for (double v : values(x)) expected.push_back(softplus_ref(v, 1, 20));
  testing::expect_close(softplus(x), expected, {7}, kFloat64, 1e-12, 1e-300);
  EXPECT_EQ(softplus(x).to_vector<double>()[6], 100.0);
  EXPECT_EQ(softplus(x, 0.5, 4).to_vector<double>()[2], 10.0);  // 0.5 * 10 > 4
}

// A tensor big enough that the loop runs in several chunks across threads, read through
// transposed, sliced and broadcast views.
TEST(LargeTensors, NonContiguousInputsAcrossThreads) {
  int threads = get_num_threads();
  set_num_threads(4);
  Tensor base = make_input({70, 41, 33}, kFloat32, {});
  Tensor a = base.permute({2, 0, 1});  // [33, 70, 41], strided
  Tensor b = make_input({66, 1, 41}, kFloat64, {}).slice(0, 0, std::nullopt, 2);  // [33, 1, 41]
  Tensor c = a * b + sin(a);
  Shape shape{33, 70, 41};
  std::vector<double> av = values(a), bv = values(b), expected(av.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    auto idx = testing::unravel(static_cast<int64_t>(i), shape);
    expected[i] = av[i] * testing::broadcast_at(b, bv, idx, shape) + std::sin(av[i]);
  }
  testing::expect_close(c, expected, shape, kFloat64, 1e-6, 1e-6);
  // An in-place op on a large permuted view writes every element exactly once.
  Tensor d = zeros({70, 41, 33});
  d.permute({2, 0, 1}).add_(a);
  testing::expect_close(d, values(base), {70, 41, 33}, kFloat32, 0, 0);
  set_num_threads(threads);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {
TEST(Methods, ScalarOverloadsMatchOperators) {
  Tensor x = testing::random_tensor({3, 4}, kFloat32);
  EXPECT_TRUE(equal(x.add(2), x + 2));
  EXPECT_TRUE(equal(x.sub(2), x - 2));
  EXPECT_TRUE(equal(x.mul(2.5), x * 2.5));
  EXPECT_TRUE(equal(x.div(4), x / 4));
  EXPECT_EQ(arange(4).div(2).dtype(), kFloat32);  // true division of integers
}
}  // namespace
}  // namespace kiln

namespace kiln {
namespace {
TEST(Methods, ScalarFormsOfBinaryOps) {
  Tensor x = from_vector(std::vector<float>{-2, 0.5, 3});
  EXPECT_EQ(minimum(x, 1).to_vector<float>(), (std::vector<float>{-2, 0.5, 1}));
  EXPECT_EQ(maximum(x, 1).to_vector<float>(), (std::vector<float>{1, 1, 3}));
  EXPECT_EQ(logical_and(x, true).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(logical_or(x, false).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(gt(x, 0).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(minimum(arange(3), 1.5).dtype(), kFloat32);  // a float scalar promotes int tensors
}
}  // namespace
}  // namespace kiln

namespace kiln {
namespace {
// Distance in representable values between two finite values of one floating type.
template <typename T>
int64_t ulp_distance(T a, T b) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  auto key = [](T f) {
    I i;
    std::memcpy(&i, &f, sizeof(T));
    return i < 0 ? static_cast<long double>(std::numeric_limits<I>::min()) - i
                 : static_cast<long double>(i);
  };
  return static_cast<int64_t>(std::fabs(key(a) - key(b)));
}

// hypot over random bit patterns, half of the pairs within 2^20 of each other in magnitude:
// within 2 ulps of the long double hypot rounded (docs/numerics.md), infinities and NaN as
// libm's. sinc on [-1/2, 1/2], against sin(p) / p of the same rounded p = pi x: within 2 ulps.
template <typename T>
void check_hypot_and_sinc_ulps() {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  std::mt19937_64 gen(7);
  std::vector<T> a, b, s;
  for (int i = 0; i < 400000; ++i) {
    const Bits p = static_cast<Bits>(gen()), q = static_cast<Bits>(gen());
    T x, y;
    std::memcpy(&x, &p, sizeof(T));
    std::memcpy(&y, &q, sizeof(T));
    if (i % 2) y = x * std::ldexp(T(1), int(gen() % 40) - 20) * T(int(gen() % 1000)) / T(500);
    a.push_back(x), b.push_back(y);
    s.push_back(std::uniform_real_distribution<T>(T(-0.5), T(0.5))(gen));
  }
  const std::vector<T> h = hypot(from_vector(a), from_vector(b)).template to_vector<T>();
  const std::vector<T> sc = sinc(from_vector(s)).template to_vector<T>();
  int64_t worst_hypot = 0, worst_sinc = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const T want = static_cast<T>(std::hypot(static_cast<long double>(a[i]), b[i]));
    if (!std::isfinite(want)) {
      EXPECT_TRUE(std::isnan(want) ? std::isnan(h[i]) : h[i] == want) << a[i] << " " << b[i];
      continue;
    }
    worst_hypot = std::max(worst_hypot, ulp_distance(h[i], want));
    const T p = s[i] * T(3.141592653589793);
    const T ref = s[i] == 0 ? T(1) : static_cast<T>(std::sin(static_cast<long double>(p)) / p);
    worst_sinc = std::max(worst_sinc, ulp_distance(sc[i], ref));
  }
  EXPECT_LE(worst_hypot, 2);
  EXPECT_LE(worst_sinc, 2);
  std::printf("%s: hypot at most %lld ulp, sinc at most %lld ulp\n", sizeof(T) == 4 ? "f32" : "f64",
              static_cast<long long>(worst_hypot), static_cast<long long>(worst_sinc));
}

TEST(Ulps, HypotAndSincWithinTwoUlps) {
  check_hypot_and_sinc_ulps<float>();
  check_hypot_and_sinc_ulps<double>();
}
}  // namespace
}  // namespace kiln
