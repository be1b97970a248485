// libtorch's everyday spellings: comparison and bitwise operators, op methods, single-dim
// reductions, kiln::tensor, from_vector with a braced shape and printing sizes().
#include <cmath>
#include <limits>
#include <sstream>

#include "kiln/jit.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::values;

// The elementwise reference of a binary op over broadcast a and b.
std::vector<double> reference(const Tensor& a, const Tensor& b, double (*f)(double, double)) {
  const Shape shape = testing::broadcast_shape(a.sizes(), b.sizes());
  const std::vector<double> va = values(a), vb = values(b);
  std::vector<double> out;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> at = testing::unravel(i, shape);
    out.push_back(
        f(testing::broadcast_at(a, va, at, shape), testing::broadcast_at(b, vb, at, shape)));
  }
  return out;
}

TEST(TensorApi, ComparisonOperatorsGiveBoolTensors) {
  for (int trial = 0; trial < 20; ++trial) {
    const Shape sa = testing::random_shape(0, 3, 4), sb = {sa.empty() ? 1 : sa.back()};
    const Tensor a = testing::random_tensor(sa, kFloat64, -2, 2).round();
    const Tensor b = testing::random_tensor(sb, kInt64, -2, 2);
    const Shape shape = testing::broadcast_shape(sa, sb);
    expect_close(a == b, reference(a, b, [](double x, double y) { return double(x == y); }), shape,
                 kBool);
    expect_close(a != b, reference(a, b, [](double x, double y) { return double(x != y); }), shape,
                 kBool);
    expect_close(a < b,
                 reference(
                     a, b, [](double x, double y) { return double(x < y); }),
                 shape, kBool);
    expect_close(a <= b, reference(a, b, [](double x, double y) { return double(x <= y); }), shape,
                 kBool);
    expect_close(a > b, reference(a, b, [](double x, double y) { return double(x > y); }), shape,
                 kBool);
    expect_close(a >= b, reference(a, b, [](double x, double y) { return double(x >= y); }), shape,
                 kBool);
  }
  const Tensor x = from_vector(std::vector<double>{-1, 0, 2});
  expect_close(x > 0, {0, 0, 1}, {3}, kBool);
  expect_close(x == 0, {0, 1, 0}, {3}, kBool);
  expect_close(0 < x, {0, 0, 1}, {3}, kBool);
  expect_close(1.5 >= x, {1, 1, 0}, {3}, kBool);
  expect_close(x != 2, {1, 1, 0}, {3}, kBool);
  expect_close(x <= -1, {1, 0, 0}, {3}, kBool);
  expect_close(-x, {1, 0, -2}, {3}, kFloat64);
}

TEST(TensorApi, BitwiseOperatorsOnBoolAndIntegers) {
  for (DType dtype : {kInt32, kInt64}) {
    const Tensor a = testing::random_tensor({3, 4}, dtype, -50, 50);
    const Tensor b = testing::random_tensor({4}, dtype, -50, 50);
    expect_close(
        a & b, reference(a, b, [](double x, double y) { return double(int64_t(x) & int64_t(y)); }),
        {3, 4}, dtype);
    expect_close(
        a | b, reference(a, b, [](double x, double y) { return double(int64_t(x) | int64_t(y)); }),
        {3, 4}, dtype);
    expect_close(
        a ^ b, reference(a, b, [](double x, double y) { return double(int64_t(x) ^ int64_t(y)); }),
        {3, 4}, dtype);
    std::vector<double> nots;
    for (double v : values(a)) nots.push_back(double(~int64_t(v)));
    expect_close(~a, nots, {3, 4}, dtype);
    expect_close(a & 6,
                 reference(a, full({}, 6, kInt64),
                           [](double x, double y) { return double(int64_t(x) & int64_t(y)); }),
                 {3, 4}, dtype);
    expect_close(6 | a,
                 reference(a, full({}, 6, kInt64),
                           [](double x, double y) { return double(int64_t(x) | int64_t(y)); }),
                 {3, 4}, dtype);
  }
  const Tensor p = from_vector(std::vector<bool>{true, true, false, false});
  const Tensor q = from_vector(std::vector<bool>{true, false, true, false});
  expect_close(p & q, {1, 0, 0, 0}, {4}, kBool);
  expect_close(p | q, {1, 1, 1, 0}, {4}, kBool);
  expect_close(p ^ q, {0, 1, 1, 0}, {4}, kBool);
  expect_close(~p, {0, 0, 1, 1}, {4}, kBool);
  expect_close((p > 0) & (q == true), {1, 0, 0, 0}, {4}, kBool);
}

TEST(TensorApi, BitwiseOnFloatsRaisesAndLeavesInputs) {
  const Tensor f = from_vector(std::vector<float>{1.5f, 2});
  const Tensor i = from_vector(std::vector<int64_t>{1, 2});
  expect_error([&] { (void)(f & i); }, {"bitwise_and", "float32[2]"});
  expect_error([&] { (void)(i | f); }, {"bitwise_or", "float32[2]"});
  expect_error([&] { (void)(f ^ f); }, {"bitwise_xor", "float32[2]"});
  expect_error([&] { (void)~f; }, {"bitwise_not", "float32[2]"});
  expect_error([&] { (void)(i & 1.5); }, {"bitwise_and", "int64[2]"});
  expect_close(f, {1.5, 2}, {2}, kFloat32);
  expect_close(i, {1, 2}, {2}, kInt64);
}

TEST(TensorApi, BitwiseOpsRecordLazilyAndTrace) {
  const Tensor a = testing::input({5, 3}, kInt32, -9, 9), b = testing::input({3}, kInt32, -9, 9);
  testing::check_lazy("bitwise", [&] {
    return std::vector<Tensor>{(a & b) | (a ^ 3), ~a, (a > 0) & (b < 2)};
  });
  jit::Function f = jit::trace(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{(in[0] & in[1]) ^ ~in[0]}; },
      {a, b});
  const Tensor a2 = testing::input({5, 3}, kInt32, -9, 9);
  testing::expect_lazy_equal(f({a2, b})[0], (a2 & b) ^ ~a2, "traced bitwise");
}

// trunc toward zero (-0 for (-1, 0)), frac = x - trunc(x) with x's sign, square = x * x; frac of
// an integer tensor raises, naming the op and the dtype.
TEST(TensorApi, TruncFracAndSquare) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor x =
      from_vector(std::vector<double>{-2.5, -0.5, -0.0, 0.0, 0.75, 3.0, inf, -inf}, Shape{8});
  const std::vector<double> t = trunc(x).to_vector<double>(), f = frac(x).to_vector<double>();
  const std::vector<double> want_t = {-2.0, -0.0, -0.0, 0.0, 0.0, 3.0, inf, -inf};
  const std::vector<double> want_f = {-0.5, -0.5, 0.0, 0.0, 0.75, 0.0};
  for (size_t i = 0; i < want_t.size(); ++i) {
    EXPECT_EQ(t[i], want_t[i]) << i;
    EXPECT_EQ(std::signbit(t[i]), std::signbit(want_t[i])) << i;
  }
  for (size_t i = 0; i < want_f.size(); ++i) EXPECT_EQ(f[i], want_f[i]) << i;
  EXPECT_TRUE(std::isnan(f[6]) && std::isnan(f[7]));  // inf - inf, as torch
  EXPECT_TRUE(equal(trunc(arange(-3, 3, 1, kInt64)), arange(-3, 3, 1, kInt64)));
  EXPECT_TRUE(equal(square(from_vector(std::vector<int64_t>{-3, 4}, Shape{2})),
                    from_vector(std::vector<int64_t>{9, 16}, Shape{2})));
  EXPECT_EQ(square(ones({2}, kBool)).dtype(), kInt64);
  try {
    frac(arange(0, 3, 1, kInt64));
    ADD_FAILURE() << "frac of int64 did not raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("frac"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
  }
}

TEST(TensorApi, MethodsForwardToTheFreeFunctions) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64, 0.5, 2);
  const Tensor y = testing::random_tensor({3, 4}, kFloat64, 0.5, 2);
  auto same = [](const Tensor& a, const Tensor& b) { EXPECT_TRUE(equal(a, b)); };
  same(x.sin(), sin(x));
  same(x.cos(), cos(x));
  same(x.exp(), exp(x));
  same(x.log1p(), log1p(x));
  same(x.expm1(), expm1(x));
  same(x.rsqrt(), rsqrt(x));
  same(x.reciprocal(), reciprocal(x));
  same(x.erf(), erf(x));
  same(x.tan(), tan(x));
  same(x.atan(), atan(x));
  same(x.sinh(), sinh(x));
  same(x.cosh(), cosh(x));
  same(x.asinh(), asinh(x));
  same((x * 0.4).asin(), asin(x * 0.4));
  same((x * 0.4).acos(), acos(x * 0.4));
  same((x * 0.4).atanh(), atanh(x * 0.4));
  same((x + 1).acosh(), acosh(x + 1));
  same(x.atan2(y), atan2(x, y));
  same(x.floor(), floor(x));
  same(x.ceil(), ceil(x));
  same(x.round(), round(x));
  same(x.trunc(), trunc(x));
  same(x.exp2(), exp2(x));
  same(x.log2(), log2(x));
  same(x.frac(), frac(x));
  same(x.square(), square(x));
  same(x.clamp_min(1.0), clamp(x, 1.0, std::nullopt));
  same(x.clamp_max(y), clamp(x, std::nullopt, y));
  same(x.clamp_min(y), clamp(x, y, Tensor()));
  same(clamp_max(x, 1.5), clamp(x, std::nullopt, 1.5));
  same(x.sign(), sign(x));
  same(x.isnan(), isnan(x));
  same(x.isfinite(), isfinite(x));
  same(x.remainder(y), remainder(x, y));
  same(x.remainder(0.75), remainder(x, 0.75));
  same(x.fmod(y), fmod(x, y));
  same(x.xlogy(y), xlogy(x, y));
  same(x.xlogy(2.0), xlogy(x, 2.0));
  same((x > 1).logical_xor(y > 1), logical_xor(x > 1, y > 1));
  same(x.isinf(), isinf(x));
  same(x.isposinf(), isposinf(x));
  same(x.sgn(), sign(x));
  same(x.clip(y), clamp(x, y));
  same(x.clip(0.5, 1.5), clamp(x, 0.5, 1.5));
  same(x.nan_to_num(), nan_to_num(x));
  same(x.fmod(0.75), fmod(x, 0.75));
  same(x.div(y, "trunc"), div(x, y, "trunc"));
  same(x.div(0.75, "floor"), div(x, 0.75, "floor"));
  same(x.div(y, std::nullopt), div(x, y));
  same(x.floor_divide(y), floor_divide(x, y));
  same(x.floor_divide(0.75), div(x, 0.75, "floor"));
  same(x.minimum(y), minimum(x, y));
  same(x.maximum(y), maximum(x, y));
  same(x.gt(1), gt(x, 1));
  same(x.eq(y), eq(x, y));
  same(x.le(1.0), le(x, 1.0));
  same(x.where(x > 1, y), where(x > 1, x, y));
  same((x > 1).logical_and(y > 1), logical_and(x > 1, y > 1));
  same((x > 1).logical_not(), logical_not(x > 1));
  same(x.cpu(), x);
  EXPECT_TRUE(x.cpu().is_same(x));
  same(x.norm(), sqrt((x * x).sum()));
  const Tensor idx = from_vector(std::vector<int64_t>{2, 0});
  same(x.index_select(1, idx), index_select(x, 1, idx));
  same(x.gather(0, idx.view({1, 2})), gather(x, 0, idx.view({1, 2})));
  same(x.index_add(1, idx, y.narrow(1, 0, 2)), index_add(x, 1, idx, y.narrow(1, 0, 2)));
  same(x.scatter_add(0, idx.view({1, 2}), y.narrow(0, 0, 1).narrow(1, 0, 2)),
       scatter_add(x, 0, idx.view({1, 2}), y.narrow(0, 0, 1).narrow(1, 0, 2)));
  same(x.slice_scatter(y.narrow(0, 0, 1), 0, 2), slice_scatter(x, y.narrow(0, 0, 1), 0, 2));
  same(x.as_strided({2, 2}, {1, 4}, 1), as_strided(x, {2, 2}, {1, 4}, 1));
  same(x.sum_to_size({1, 4}), sum_to_size(x, {1, 4}));
  same(x.addmm(y.narrow(1, 0, 3), y, 0.5, 2), addmm(x, y.narrow(1, 0, 3), y, 0.5, 2));
  same(x.lerp(y, 0.25), lerp(x, y, 0.25));
  same(x.addcdiv(x, y), addcdiv(x, x, y));
  same(x.masked_fill(x > 1, 0.0), masked_fill(x, x > 1, 0.0));
  const Tensor x3 = x.unsqueeze(0), y3 = y.t().unsqueeze(0);
  same(x3.bmm(y3), bmm(x3, y3));
}

TEST(TensorApi, SingleDimReductions) {
  const Tensor x = testing::random_tensor({2, 3, 4}, kFloat64);
  EXPECT_TRUE(equal(x.sum(1), sum(x, {1})));
  EXPECT_TRUE(equal(x.sum(-1, true), sum(x, {-1}, true)));
  EXPECT_TRUE(equal(x.sum(), sum(x)));
  EXPECT_TRUE(equal(x.sum(0, false, kFloat32), sum(x, {0}, false, kFloat32)));
  EXPECT_TRUE(equal(x.mean(1, true), mean(x, {1}, true)));
  EXPECT_EQ(x.mean(1, true).sizes(), (Shape{2, 1, 4}));
  EXPECT_TRUE(equal(x.amax(2), amax(x, {2})));
  EXPECT_TRUE(equal(x.amin(0), amin(x, {0})));
  EXPECT_TRUE(equal(x.var(1), var(x, {1})));
  EXPECT_TRUE(equal(x.std(1, 0, true), kiln::std(x, {1}, 0, true)));
  EXPECT_TRUE(equal(x.logsumexp(2), logsumexp(x, {2})));
  EXPECT_TRUE(equal((x > 0).all(1), all(x > 0, {1})));
  EXPECT_TRUE(equal((x > 0).any(2, true), any(x > 0, {2}, true)));
  EXPECT_TRUE(equal((x > 0).all({0, 2}), all(x > 0, {0, 2})));
  EXPECT_EQ((x > 0).any({}).dim(), 0);
  EXPECT_EQ(x.sum({}, true).sizes(), (Shape{1, 1, 1}));
  EXPECT_TRUE(equal(x.norm(1, 2), norm(x, 1, {2})));
  EXPECT_TRUE(equal(sum(x, 1), sum(x, {1})));
  EXPECT_TRUE(equal(mean(x, -1, true), mean(x, {-1}, true)));
  EXPECT_TRUE(equal(prod(x, 0), prod(x, {0})));
  // An empty braced list still means every dim, not dim 0.
  EXPECT_EQ(sum(x, {}).dim(), 0);
  EXPECT_EQ(mean(x, {}, true).sizes(), (Shape{1, 1, 1}));
  auto [values, indices] = x.max(1);
  EXPECT_TRUE(equal(values, amax(x, {1})));
  EXPECT_EQ(indices.dtype(), kInt64);
  EXPECT_TRUE(equal(indices, argmax(x, 1)));
}

TEST(TensorApi, TensorFromNestedLists) {
  const Tensor i = kiln::tensor({1, 2, 3});
  expect_close(i, {1, 2, 3}, {3}, kInt64);
  const Tensor f = kiln::tensor({{1.5, 2.}, {3., 4.}});
  expect_close(f, {1.5, 2, 3, 4}, {2, 2}, kFloat32);
  expect_close(kiln::tensor({true, false}), {1, 0}, {2}, kBool);
  expect_close(kiln::tensor({1., 2.}, kFloat64), {1, 2}, {2}, kFloat64);
  expect_close(kiln::tensor({{{1}, {2}}}, TensorOptions(kInt32)), {1, 2}, {1, 2, 1}, kInt32);
  expect_close(kiln::tensor(7), {7}, {}, kInt64);
  expect_close(kiln::tensor(2.5), {2.5}, {}, kFloat32);
  expect_close(kiln::tensor({1, 2.5}), {1, 2.5}, {2}, kFloat32);  // mixed: floating
  // int64 values beyond double's precision stay exact.
  EXPECT_EQ(kiln::tensor({int64_t{9007199254740993}}).item<int64_t>(), 9007199254740993);
  expect_error([] { (void)kiln::tensor({{1, 2}, {3}}); }, {"tensor", "[2]", "[1]"});
}

TEST(TensorApi, FromVectorWithBracedShapeAndPrintedSizes) {
  const Tensor x = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  expect_close(x, {1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32);
  const Tensor b = from_vector(std::vector<bool>{true, false}, Shape{2, 1});
  EXPECT_EQ(b.sizes(), (Shape{2, 1}));
  std::ostringstream os;
  os << x.sizes() << ' ' << kiln::tensor(1).sizes();
  EXPECT_EQ(os.str(), "[2, 3] []");
}

TEST(TensorApi, ComparisonsAndMethodsRecordLazily) {
  const Tensor x = testing::input({4, 5}, kFloat32), y = testing::input({5}, kFloat32);
  testing::check_lazy("operators", [&] {
    return std::vector<Tensor>{x > y, 0.5 <= x, x.sin().sum(1), x.mean(0, true), x.norm()};
  });
}

}  // namespace
}  // namespace kiln
