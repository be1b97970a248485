// baddbmm, addbmm, addmv, addr, linalg::multi_dot, chain_matmul, linalg::vecdot; LU
// (linalg::lu_factor, linalg::lu, lu_unpack, linalg::lu_solve); and the smaller ops of the same
// change (signbit, copysign, fmax, fmin, float_power, aminmax, dist, renorm, take_along_dim, isin,
// select_scatter, diagonal_scatter): float64 reference loops over random shapes (size 0 and 1,
// broadcasting, non-contiguous layouts), special values, gradients by gradcheck, lazy and traced
// runs against eager ones, bad input raising kiln::Error.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/nn_functional.h"
#include "kiln/testing.h"
#include "tests/lib/threads.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::pick;
using testing::values;
using In = std::vector<Tensor>;

const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Row-major [rows x cols] product of a [rows x inner] and b [inner x cols] in double.
std::vector<double> reference_mm(const std::vector<double>& a, const std::vector<double>& b,
                                 int64_t rows, int64_t inner, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t k = 0; k < inner; ++k)
        out[size_t(i * cols + j)] += a[size_t(i * inner + k)] * b[size_t(k * cols + j)];
  return out;
}

// beta * self (broadcast to `shape`) + alpha * product, self ignored when beta is 0.
std::vector<double> reference_scaled(const Tensor& self, const std::vector<double>& product,
                                     const Shape& shape, double beta, double alpha) {
  const std::vector<double> sv = values(self);
  std::vector<double> out(product.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const double s =
        beta == 0 ? 0.0
                  : testing::broadcast_at(self, sv, testing::unravel(int64_t(i), shape), shape);
    out[i] = beta * s + alpha * product[i];
  }
  return out;
}

// A self that broadcasts to `shape`: some dims dropped from the front, some sizes 1.
Shape broadcastable(const Shape& shape) {
  Shape s(shape.begin() + pick(0, int64_t(shape.size())), shape.end());
  for (int64_t& d : s)
    if (pick(0, 2) == 0) d = 1;
  return s;
}

// ------------------------------------------------------------ scaled products

TEST(ScaledProducts, MatchAFloat64ReferenceForEveryScalingAndLayout) {
  const double scalings[][2] = {{1, 1}, {0.5, 2}, {0, 1}, {0, -1.5}, {2, 0}};
  for (int iter = 0; iter < 24; ++iter) {
    const DType dtype = iter % 3 == 0 ? kFloat32 : kFloat64;
    const int64_t b = pick(0, 3), n = pick(0, 4), m = pick(0, 4), p = pick(1, 4);
    const double beta = scalings[iter % 5][0], alpha = scalings[iter % 5][1];
    const Tensor b1 = testing::random_tensor({b, n, m}, dtype);
    const Tensor b2 = testing::random_tensor({b, m, p}, dtype);
    SCOPED_TRACE(::testing::Message() << "b " << b << " n " << n << " m " << m << " p " << p
                                      << " beta " << beta << " alpha " << alpha);
    const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
    // baddbmm and addbmm, self holding NaN where beta is 0 (ignored).
    std::vector<double> batched, summed(size_t(n * p), 0.0);
    const std::vector<double> v1 = values(b1), v2 = values(b2);
    for (int64_t k = 0; k < b; ++k) {
      const std::vector<double> one(v1.begin() + k * n * m, v1.begin() + (k + 1) * n * m);
      const std::vector<double> two(v2.begin() + k * m * p, v2.begin() + (k + 1) * m * p);
      const std::vector<double> c = reference_mm(one, two, n, m, p);
      batched.insert(batched.end(), c.begin(), c.end());
      for (size_t i = 0; i < c.size(); ++i) summed[i] += c[i];
    }
    Tensor self = testing::random_tensor(broadcastable({b, n, p}), dtype);
    if (beta == 0) self = full_like(self, kNan);
    for (const auto& [layout, l1] : testing::layouts(b1)) {
      SCOPED_TRACE(layout);
      expect_close(baddbmm(self, l1, b2, beta, alpha),
                   reference_scaled(self, batched, {b, n, p}, beta, alpha), {b, n, p}, dtype, tol,
                   tol);
    }
    const Tensor self2 = beta == 0 ? full({n, p}, kNan, TensorOptions(dtype))
                                   : testing::random_tensor(broadcastable({n, p}), dtype);
    expect_close(addbmm(self2, b1, b2, beta, alpha),
                 reference_scaled(self2, summed, {n, p}, beta, alpha), {n, p}, dtype, tol, tol);
    // addmv and addr.
    const Tensor mat = testing::random_tensor({n, m}, dtype),
                 vec = testing::random_tensor({m}, dtype);
    const Tensor self3 = testing::random_tensor(broadcastable({n}), dtype);
    for (const auto& [layout, lm] : testing::layouts(mat))
      expect_close(addmv(self3, lm, vec, beta, alpha),
                   reference_scaled(self3, reference_mm(values(mat), values(vec), n, m, 1), {n},
                                    beta, alpha),
                   {n}, dtype, tol, tol);
    const Tensor u = testing::random_tensor({n}, dtype), w = testing::random_tensor({p}, dtype);
    const Tensor self4 = testing::random_tensor(broadcastable({n, p}), dtype);
    expect_close(
        addr(self4, u, w, beta, alpha),
        reference_scaled(self4, reference_mm(values(u), values(w), n, 1, p), {n, p}, beta, alpha),
        {n, p}, dtype, tol, tol);
  }
}

TEST(ScaledProducts, IntegersStayExactAndSelfTakesTheProductsDtype) {
  const Tensor m = testing::random_tensor({3, 4}, kInt64, -5, 5);
  const Tensor v = testing::random_tensor({4}, kInt64, -5, 5);
  const Tensor s = testing::random_tensor({3}, kInt64, -5, 5);
  const Tensor got = addmv(s, m, v, 2, 3);
  EXPECT_EQ(got.dtype(), kInt64);
  const std::vector<double> mv = reference_mm(values(m), values(v), 3, 4, 1);
  expect_close(got, reference_scaled(s, mv, {3}, 2, 3), {3}, kInt64, 0, 0);
  // As torch: a float64 self added to a float32 product gives float32.
  EXPECT_EQ(addmv(ones({3}, kFloat64), m.to(kFloat32), v.to(kFloat32)).dtype(), kFloat32);
  expect_error([&] { addmv(s, m, v, 0.5); }, {"addmv", "beta", "integral"});
  expect_error([&] { addr(s, v, v.to(kInt32)); }, {"addr", "one dtype"});
  expect_error(
      [&] {
        baddbmm(zeros({2, 2, 2}), zeros({2, 2, 3}), zeros({3, 3, 2}));
      },
      {"baddbmm", "[2, 2, 3]", "[3, 3, 2]"});
  expect_error(
      [&] {
        addbmm(zeros({3, 3}), zeros({2, 2, 3}), zeros({2, 3, 2}));
      },
      {"addbmm", "self", "[2, 2]"});
  expect_error([&] { addmv(zeros({2}), zeros({2, 3}), zeros({2})); }, {"addmv", "[2, 3]"});
}

TEST(ScaledProducts, GradientsMatchFiniteDifferences) {
  const Tensor s = testing::random_tensor({1, 3}, kFloat64).requires_grad_();
  const Tensor b1 = testing::random_tensor({2, 2, 4}, kFloat64).requires_grad_();
  const Tensor b2 = testing::random_tensor({2, 4, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return baddbmm(in[0], in[1], in[2], 0.5, 2); },
                                 {s, b1, b2}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return addbmm(in[0], in[1], in[2], 1, -1); },
                                 {s, b1, b2}));
  const Tensor m = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const Tensor v = testing::random_tensor({4}, kFloat64).requires_grad_();
  const Tensor sv = testing::random_tensor({3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return addmv(in[0], in[1], in[2], 3, 0.5); },
                                 {sv, m, v}));
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return addr(in[0], in[1], in[2], 2, 1); },
                         {testing::random_tensor({4, 3}, kFloat64).requires_grad_(), v, sv}));
  // beta 0: self's gradient is zero, not missing.
  const Tensor self = testing::random_tensor({3}, kFloat64).requires_grad_();
  addmv(self, m, v, 0).sum().backward();
  ASSERT_TRUE(self.grad().defined());
  for (double g : values(self.grad())) EXPECT_EQ(g, 0.0);
}

// ------------------------------------------------------------ chained products and vecdot

TEST(MultiDot, MatchesTheLeftToRightProductWhateverTheOrderChosen) {
  for (int iter = 0; iter < 30; ++iter) {
    const int64_t count = pick(2, 6);
    std::vector<int64_t> dims;
    for (int64_t i = 0; i <= count; ++i) dims.push_back(pick(0, 5));
    if (iter % 3 == 0) dims[0] = pick(1, 60);  // uneven chains, where the order matters
    const bool first_vector = pick(0, 1) != 0, last_vector = pick(0, 1) != 0;
    if (first_vector) dims[0] = 1;
    if (last_vector) dims[size_t(count)] = 1;
    std::vector<Tensor> tensors;
    for (int64_t i = 0; i < count; ++i)
      tensors.push_back(testing::random_tensor({dims[size_t(i)], dims[size_t(i + 1)]}, kFloat64));
    std::vector<double> acc = values(tensors[0]);
    for (int64_t i = 1; i < count; ++i)
      acc = reference_mm(acc, values(tensors[size_t(i)]), dims[0], dims[size_t(i)],
                         dims[size_t(i + 1)]);
    Shape shape;
    if (!first_vector) shape.push_back(dims[0]);
    if (!last_vector) shape.push_back(dims[size_t(count)]);
    if (first_vector) tensors.front() = tensors.front().squeeze(0);
    if (last_vector) tensors.back() = tensors.back().squeeze(-1);
    SCOPED_TRACE(::testing::PrintToString(dims));
    expect_close(linalg::multi_dot(tensors), acc, shape, kFloat64, 1e-12, 1e-12);
  }
  const Tensor a = testing::random_tensor({3, 2}, kFloat64);
  const Tensor copy = chain_matmul({a});
  expect_close(copy, values(a), {3, 2}, kFloat64, 0, 0);
  EXPECT_NE(copy.data_ptr<double>(), a.data_ptr<double>());
  expect_error([&] { linalg::multi_dot({a}); }, {"multi_dot", "at least 2"});
  expect_error([&] { linalg::multi_dot({a, a}); }, {"multi_dot", "[3, 2]"});
  expect_error([&] { linalg::multi_dot({a, ones({2}), a}); }, {"multi_dot", "2-D"});
  expect_error([&] { chain_matmul({ones({3})}); }, {"chain_matmul", "2-D"});
  expect_error([&] { linalg::multi_dot({a, ones({2, 2}, kFloat32)}); }, {"one dtype"});
}

TEST(MultiDot, GradientsAndVecdot) {
  const Tensor a = testing::random_tensor({4}, kFloat64).requires_grad_();
  const Tensor b = testing::random_tensor({4, 2}, kFloat64).requires_grad_();
  const Tensor c = testing::random_tensor({2, 5}, kFloat64).requires_grad_();
  const Tensor d = testing::random_tensor({5, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return linalg::multi_dot(in); }, {a, b, c, d}));
  // vecdot: sum of products along a dim, operands broadcast.
  for (int iter = 0; iter < 10; ++iter) {
    const Shape shape = testing::random_shape(1, 3, 4);
    const Tensor x = testing::random_tensor(shape, kFloat64);
    const Tensor y = testing::random_tensor({shape.back()}, kFloat64);
    const std::vector<double> xv = values(x), yv = values(y);
    const int64_t n = shape.back();
    const Shape out(shape.begin(), shape.end() - 1);
    int64_t rows = 1;
    for (int64_t s : out) rows *= s;
    std::vector<double> want(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < n; ++k) want[size_t(r)] += xv[size_t(r * n + k)] * yv[size_t(k)];
    expect_close(linalg::vecdot(x, y), want, out, kFloat64, 1e-12, 1e-12);
  }
  expect_error([] { linalg::vecdot(ones({3}, kInt64), ones({3}, kInt64)); },
               {"vecdot", "floating"});
}

// ------------------------------------------------------------ LU

// A random m x n batch, well away from singular for square ones.
Tensor random_matrices(const Shape& batch, int64_t m, int64_t n, DType dtype = kFloat64) {
  Shape shape = batch;
  shape.push_back(m);
  shape.push_back(n);
  Tensor a = testing::random_tensor(shape, kFloat64, -1, 1);
  return (a + eye(m, n, TensorOptions(kFloat64)) * 2.0).to(dtype);
}

TEST(Lu, FactorsReassembleTheMatrixWithAUnitLowerLAndAPermutation) {
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{0, 0}, {1, 1}, {3, 3}, {5, 2},
                                                          {2, 5}, {4, 4}, {0, 3}, {6, 6}};
  for (const auto& [m, n] : sizes)
    for (DType dtype : {kFloat64, kFloat32}) {
      const Shape batch = testing::random_shape(0, 2, 3);
      const Tensor a = testing::random_tensor(
          [&] {
            Shape s = batch;
            s.push_back(m);
            s.push_back(n);
            return s;
          }(),
          dtype);
      SCOPED_TRACE(::testing::Message() << m << " x " << n << " " << dtype);
      const auto [p, l, u] = linalg::lu(a);
      const int64_t k = std::min(m, n);
      ASSERT_EQ(l.size(-1), k);
      ASSERT_EQ(u.size(-2), k);
      const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
      expect_close(matmul(p, matmul(l, u)), values(a), a.sizes(), dtype, tol, tol);
      // Partial pivoting: L has a unit diagonal and entries of at most 1 in magnitude.
      for (double v : values(l)) EXPECT_LE(std::abs(v), 1.0 + 1e-12);
      expect_close(l.diagonal(0, -2, -1),
                   std::vector<double>(size_t(l.diagonal(0, -2, -1).numel()), 1.0),
                   l.diagonal(0, -2, -1).sizes(), dtype, 0, 0);
      expect_close(tril(u, -1), std::vector<double>(size_t(u.numel()), 0.0), u.sizes(), dtype, 0,
                   0);
      // P is a permutation matrix: one 1 in every row and column.
      expect_close(p.sum({-1}),
                   std::vector<double>(size_t(p.numel() / std::max<int64_t>(m, 1)), 1.0),
                   p.sum({-1}).sizes(), dtype, 0, 0);
      // lu_factor packs the same factors; lu_unpack gives them back.
      if (m == n && m > 0) {
        const auto [lu, pivots] = linalg::lu_factor(a.to(kFloat64) + 0.0);
        EXPECT_EQ(pivots.dtype(), kInt32);
        const auto [p2, l2, u2] = lu_unpack(lu, pivots);
        expect_close(matmul(p2, matmul(l2, u2)), values(a), a.sizes(), kFloat64, tol, tol);
      }
    }
}

TEST(Lu, FactorRaisesOnASingularMatrixWhereLuDoesNot) {
  const Tensor singular = from_vector(std::vector<double>{1, 2, 2, 4}).reshape({2, 2});
  expect_error([&] { linalg::lu_factor(singular); }, {"lu_factor", "U[2,2]", "zero"});
  const auto [p, l, u] = linalg::lu(singular);
  expect_close(matmul(p, matmul(l, u)), values(singular), {2, 2}, kFloat64, 1e-12, 1e-12);
  expect_error([&] { linalg::lu_factor(singular, false); }, {"lu_factor", "pivoting"});
  expect_error([] { linalg::lu(ones({3})); }, {"linalg.lu", "[3]"});
  expect_error([] { linalg::lu(ones({2, 2}, kInt64)); }, {"linalg.lu", "int64"});
  const auto [lu, pivots] = linalg::lu_factor(eye(3, TensorOptions(kFloat64)));
  expect_error([&] { lu_unpack(lu, pivots.to(kInt64)); }, {"lu_unpack", "int32"});
  expect_error([&] { lu_unpack(lu, full({3}, 7, TensorOptions(kInt32))); },
               {"lu_unpack", "pivot 7", "out of range"});
  // NaN propagates without raising.
  const auto [lnan, pnan] = linalg::lu_factor(full({2, 2}, kNan, TensorOptions(kFloat64)));
  for (double v : values(lnan)) EXPECT_TRUE(std::isnan(v));
}

TEST(Lu, SolveHandlesEveryEquationAndBroadcastsBatches) {
  for (bool left : {true, false})
    for (bool adjoint : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "left " << left << " adjoint " << adjoint);
      const Tensor a = random_matrices({2, 1}, 4, 4);
      const Tensor b = testing::random_tensor(left ? Shape{3, 4, 2} : Shape{3, 2, 4}, kFloat64);
      const auto [lu, pivots] = linalg::lu_factor(a);
      const Tensor x = linalg::lu_solve(lu, pivots, b, left, adjoint);
      ASSERT_EQ(x.sizes(), (Shape{2, 3, left ? 4 : 2, left ? 2 : 4}));
      const Tensor op = adjoint ? a.transpose(-2, -1) : a;
      const Tensor back = left ? matmul(op, x) : matmul(x, op);
      expect_close(back, values(b.expand(back.sizes()).contiguous()), back.sizes(), kFloat64, 1e-10,
                   1e-10);
    }
  const auto [lu, pivots] = linalg::lu_factor(random_matrices({}, 3, 3));
  expect_error(
      [&] {
        linalg::lu_solve(lu, pivots, ones({2, 1}, kFloat64));
      },
      {"lu_solve", "[2, 1]"});
  expect_error(
      [&] {
        linalg::lu_solve(lu, pivots, ones({3, 1}, kFloat32));
      },
      {"lu_solve", "one dtype"});
}

TEST(Lu, GradientsMatchFiniteDifferences) {
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {4, 2}, {2, 4}}) {
    SCOPED_TRACE(::testing::Message() << m << " x " << n);
    const Tensor a = random_matrices({2}, m, n).requires_grad_();
    EXPECT_TRUE(testing::gradcheck(
        [](const In& in) {
          const auto [p, l, u] = linalg::lu(in[0]);
          return std::vector<Tensor>{l, u};
        },
        {a}));
    EXPECT_TRUE(testing::gradcheck(
        [](const In& in) { return std::get<0>(linalg::lu_factor(in[0])); }, {a}));
  }
  const Tensor a = random_matrices({}, 3, 3).requires_grad_();
  const Tensor b = testing::random_tensor({3, 2}, kFloat64).requires_grad_();
  for (bool adjoint : {false, true})
    EXPECT_TRUE(testing::gradcheck(
        [adjoint](const In& in) {
          const auto [lu, pivots] = linalg::lu_factor(in[0]);
          return linalg::lu_solve(lu, pivots, in[1], true, adjoint);
        },
        {a, b}));
}

TEST(Lu, TracedSolveReplaysOnNewMatrices) {
  auto fn = [](const In& in) {
    const auto [lu, pivots] = linalg::lu_factor(in[0]);
    const auto [p, l, u] = lu_unpack(lu, pivots);
    return In{linalg::lu_solve(lu, pivots, in[1]), p};
  };
  const Tensor b = testing::random_tensor({3, 2}, kFloat64);
  jit::Function traced = jit::trace(fn, {random_matrices({}, 3, 3), b});
  for (int i = 0; i < 3; ++i) {
    // A row swap makes other pivots than the example's.
    const Tensor a = random_matrices({}, 3, 3).flip({i % 2 == 0 ? 0 : 1});
    In want;
    {
      LazyGuard eager(false);
      want = fn({a, b});
    }
    const In got = traced({a, b});
    for (size_t k = 0; k < got.size(); ++k)
      testing::expect_lazy_equal(got[k], want[k], "output " + std::to_string(k));
  }
}

// ------------------------------------------------------------ elementwise rows

// A signed NaN, made from bits.
double negative_nan() {
  const uint64_t bits = 0xfff8000000000000ull;
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

TEST(SignRows, SignbitAndCopysignReadTheSignBitOfZerosAndNaNs) {
  const std::vector<double> xs = {-0.0, 0.0, -1.5, 2.0, kNan, negative_nan(), -kInf, kInf};
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    for (DType dtype : {kFloat64, kFloat32}) {
      const Tensor x = from_vector(xs).to(dtype);
      std::vector<double> want;
      for (double v : xs) want.push_back(std::signbit(v));
      expect_close(signbit(x), want, {8}, kBool, 0, 0);
      // copysign(1, x) has x's sign bit; copysign(x, -1) is -|x|.
      std::vector<double> one_signed;
      for (double v : xs) one_signed.push_back(std::copysign(1.0, v));
      expect_close(copysign(ones({8}, dtype), x), one_signed, {8}, dtype, 0, 0);
      const std::vector<double> neg = values(copysign(x, -1.0));
      for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(std::signbit(neg[i])) << xs[i];
    }
  }
  expect_close(signbit(from_vector(std::vector<int64_t>{-3, 0, 4})), {1, 0, 0}, {3}, kBool, 0, 0);
  // hypot of NaN and 0 is NaN (it was 0: the zero test met a NaN the comparisons skipped).
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    expect_close(hypot(from_vector(std::vector<double>{kNan, 0.0, -0.0, kNan}),
                       from_vector(std::vector<double>{0.0, kNan, -0.0, kInf})),
                 {kNan, kNan, 0.0, kInf}, {4}, kFloat64, 0, 0);
  }
  expect_close(signbit(ones({2}, kBool)), {0, 0}, {2}, kBool, 0, 0);
  EXPECT_EQ(copysign(from_vector(std::vector<int64_t>{3}), -1).dtype(), kFloat32);
  // torch's gradient: sign-adjusted g, 0 at a = 0; none reaches b.
  const Tensor a = from_vector(std::vector<double>{-2, 0, 3}).requires_grad_();
  const Tensor b = from_vector(std::vector<double>{1, -1, -1}).requires_grad_();
  copysign(a, b).sum().backward();
  expect_close(a.grad(), {-1, 0, -1}, {3}, kFloat64, 0, 0);
  expect_close(b.grad(), {0, 0, 0}, {3}, kFloat64, 0, 0);
}

TEST(SignRows, FmaxAndFminIgnoreNaNAndGiveTiesToTheFirstOperand) {
  const std::vector<double> xs = {1, kNan, kNan, -0.0, 2, 0.0};
  const std::vector<double> ys = {kNan, 3, kNan, 0.0, 2, -0.0};
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    const Tensor x = from_vector(xs), y = from_vector(ys);
    const std::vector<double> hi = values(fmax(x, y)), lo = values(fmin(x, y));
    const std::vector<double> want_hi = {1, 3, kNan, -0.0, 2, 0.0};
    for (size_t i = 0; i < xs.size(); ++i) {
      EXPECT_TRUE(std::isnan(want_hi[i]) ? std::isnan(hi[i]) : hi[i] == want_hi[i]) << i;
      // Zeros of both signs tie: a's is kept, sign and all.
      if (i >= 3) EXPECT_EQ(std::signbit(hi[i]), std::signbit(xs[i])) << i;
      if (i >= 3) EXPECT_EQ(std::signbit(lo[i]), std::signbit(xs[i])) << i;
    }
    expect_close(fmin(x, y), {1, 3, kNan, -0.0, 2, 0.0}, {6}, kFloat64, 0, 0);
  }
  const Tensor a = from_vector(std::vector<double>{1, kNan, 2, 5}).requires_grad_();
  const Tensor b = from_vector(std::vector<double>{kNan, 3, 2, 1}).requires_grad_();
  fmax(a, b).sum().backward();
  expect_close(a.grad(), {1, 0, 1, 1}, {4}, kFloat64, 0, 0);
  expect_close(b.grad(), {0, 1, 0, 0}, {4}, kFloat64, 0, 0);
  expect_close(fmax(from_vector(std::vector<int64_t>{1, 5}), 3), {3, 5}, {2}, kInt64, 0, 0);
}

TEST(SignRows, FloatPowerComputesInFloat64AndOtherNames) {
  const Tensor x = from_vector(std::vector<int64_t>{2, 3, -2});
  const Tensor p = float_power(x, 0.5);
  EXPECT_EQ(p.dtype(), kFloat64);
  expect_close(p, {std::sqrt(2.0), std::sqrt(3.0), kNan}, {3}, kFloat64, 1e-15, 0);
  expect_close(float_power(2, from_vector(std::vector<float>{-1, 3})), {0.5, 8}, {2}, kFloat64, 0,
               0);
  const Tensor f = testing::random_tensor({3}, kFloat32, 0.5, 2).requires_grad_();
  float_power(f, f).sum().backward();
  EXPECT_EQ(f.grad().dtype(), kFloat32);
  expect_close(true_divide(x, 4), {0.5, 0.75, -0.5}, {3}, kFloat32, 0, 0);
  expect_close(fix(from_vector(std::vector<double>{-1.5, 2.5})), {-1, 2}, {2}, kFloat64, 0, 0);
  expect_close(argwhere(from_vector(std::vector<double>{0, 1, 0, 2})), {1, 3}, {2, 1}, kInt64, 0,
               0);
}

// ------------------------------------------------------------ reductions and norms

TEST(NormsAndExtremes, AminmaxDistAndRenormMatchReferences) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64);
  const auto [lo, hi] = aminmax(x, int64_t{1}, true);
  ASSERT_EQ(lo.sizes(), (Shape{3, 1}));
  const std::vector<double> xv = values(x);
  for (int64_t r = 0; r < 3; ++r) {
    const auto first = xv.begin() + r * 4;
    EXPECT_EQ(values(lo)[size_t(r)], *std::min_element(first, first + 4));
    EXPECT_EQ(values(hi)[size_t(r)], *std::max_element(first, first + 4));
  }
  const auto [all_lo, all_hi] = x.aminmax();
  EXPECT_EQ(all_lo.dim(), 0);
  EXPECT_EQ(all_hi.item<double>(), *std::max_element(xv.begin(), xv.end()));
  expect_error([] { aminmax(zeros({0, 3}), int64_t{0}); }, {"empty"});
  // dist: the p-norm of the broadcast difference.
  const Tensor y = testing::random_tensor({4}, kFloat64);
  for (double p : {1.0, 2.0, 3.0, kInf, 0.0}) {
    double acc = 0, most = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      const double d = std::abs(xv[i] - values(y)[i % 4]);
      acc += p == 0 ? double(d != 0) : std::pow(d, p);
      most = std::max(most, d);
    }
    const double want = std::isinf(p) ? most : p == 0 ? acc : std::pow(acc, 1 / p);
    EXPECT_NEAR(dist(x, y, p).item<double>(), want, 1e-12 * want) << p;
  }
  // renorm: rows along dim 0 with a 2-norm over 1.5 scaled to 1.5.
  const Tensor r = renorm(x, 2, 0, 1.5);
  for (int64_t i = 0; i < 3; ++i) {
    double norm = 0;
    for (int64_t j = 0; j < 4; ++j) norm += xv[size_t(i * 4 + j)] * xv[size_t(i * 4 + j)];
    norm = std::sqrt(norm);
    const double factor = norm > 1.5 ? 1.5 / (norm + 1e-7) : 1.0;
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_NEAR(values(r)[size_t(i * 4 + j)], xv[size_t(i * 4 + j)] * factor, 1e-12);
  }
  const Tensor g = (testing::random_tensor({3, 4}, kFloat64) * 2.0).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return renorm(in[0], 3, 1, 1.0); }, {g}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return dist(in[0], in[1], 2.5); },
                                 {g, testing::random_tensor({4}, kFloat64).requires_grad_()}));
  expect_error([] { renorm(ones({3}), 2, 0, 1); }, {"renorm", "2 dimensions"});
  expect_error([] { renorm(ones({3, 3}), 0, 0, 1); }, {"renorm", "non-positive"});
  expect_error([] { dist(ones({3}, kInt64), ones({3}, kInt64)); }, {"dist", "floating"});
}

// ------------------------------------------------------------ indexing

TEST(IndexRows, TakeAlongDimGathersWithBroadcastIndices) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64);
  const Tensor idx = from_vector(std::vector<int64_t>{3, 0, 1, 1, 2, 0}).reshape({3, 2});
  const Tensor got = take_along_dim(x, idx, int64_t{1});
  const std::vector<double> xv = values(x), iv = values(idx);
  std::vector<double> want;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 2; ++c)
      want.push_back(xv[size_t(r * 4 + int64_t(iv[size_t(r * 2 + c)]))]);
  expect_close(got, want, {3, 2}, kFloat64, 0, 0);
  // Broadcast: one row of indices for every row of x; an index dim of 1 against x's 3.
  const Tensor row = from_vector(std::vector<int64_t>{2, 1}).reshape({1, 2});
  const Tensor b = take_along_dim(x, row, int64_t{1});
  ASSERT_EQ(b.sizes(), (Shape{3, 2}));
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(values(b)[size_t(r * 2)], xv[size_t(r * 4 + 2)]);
  // Without a dim: the flattened tensor.
  expect_close(x.take_along_dim(from_vector(std::vector<int64_t>{11, 0})), {xv[11], xv[0]}, {2},
               kFloat64, 0, 0);
  const Tensor leaf = x.clone().requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([&](const In& in) { return take_along_dim(in[0], idx, 1); }, {leaf}));
  expect_error([&] { take_along_dim(x, from_vector(std::vector<int64_t>{1}), int64_t{1}); },
               {"take_along_dim", "same number of dimensions"});
  expect_error([&] { take_along_dim(x, idx.to(kFloat32), int64_t{1}); }, {"take_along_dim"});
}

TEST(IndexRows, IsinFindsMembersWithPromotionNaNAndEmptySets) {
  for (int iter = 0; iter < 12; ++iter) {
    const Tensor e =
        testing::random_tensor(testing::random_shape(0, 3, 5), kFloat64, -4, 4).round();
    const Tensor t = testing::random_tensor(testing::random_shape(0, 2, 4), kInt64, -4, 4);
    const std::vector<double> ev = values(e), tv = values(t);
    std::vector<double> want, inverted;
    for (double v : ev) {
      const bool in = std::find(tv.begin(), tv.end(), v) != tv.end();
      want.push_back(in);
      inverted.push_back(!in);
    }
    for (const auto& [layout, le] : testing::layouts(e)) {
      SCOPED_TRACE(layout);
      expect_close(isin(le, t), want, e.sizes(), kBool, 0, 0);
      expect_close(isin(le, t, false, true), inverted, e.sizes(), kBool, 0, 0);
    }
  }
  const Tensor special = from_vector(std::vector<double>{kNan, -0.0, kInf, 1.5});
  expect_close(isin(special, from_vector(std::vector<double>{kNan, 0.0, kInf})), {0, 1, 1, 0}, {4},
               kBool, 0, 0);
  expect_close(isin(special, zeros({0})), {0, 0, 0, 0}, {4}, kBool, 0, 0);
  expect_close(isin(special, 1.5), {0, 0, 0, 1}, {4}, kBool, 0, 0);
  EXPECT_TRUE(isin(2, from_vector(std::vector<int64_t>{1, 2})).item<bool>());
  EXPECT_FALSE(isin(2.5, from_vector(std::vector<int64_t>{1, 2})).item<bool>());
  expect_close(isin(ones({2}, kBool), zeros({1}, kBool)), {0, 0}, {2}, kBool, 0, 0);
}

TEST(IndexRows, SelectAndDiagonalScatterWriteTheirRegion) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64);
  const Tensor src = testing::random_tensor({4}, kFloat64);
  const Tensor s = select_scatter(x, src, 0, -1);
  std::vector<double> want = values(x);
  for (int64_t j = 0; j < 4; ++j) want[size_t(8 + j)] = values(src)[size_t(j)];
  expect_close(s, want, {3, 4}, kFloat64, 0, 0);
  const Tensor d = testing::random_tensor({3}, kFloat64);
  for (const auto& [layout, lx] : testing::layouts(x)) {
    SCOPED_TRACE(layout);
    std::vector<double> diag = values(x);
    for (int64_t i = 0; i < 3; ++i) diag[size_t(i * 4 + i + 1)] = values(d)[size_t(i)];
    expect_close(diagonal_scatter(lx, d, 1), diag, {3, 4}, kFloat64, 0, 0);
  }
  const Tensor xl = x.clone().requires_grad_(), sl = src.clone().requires_grad_();
  const Tensor dl = testing::random_tensor({2}, kFloat64).requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return select_scatter(in[0], in[1], 1, 2).pow(2); },
                         {xl, testing::random_tensor({3}, kFloat64).requires_grad_()}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return diagonal_scatter(in[0], in[1], -1).pow(2); }, {xl, dl}));
  expect_error([&] { select_scatter(x, src, 0, 3); }, {"select_scatter", "out of range"});
  expect_error([&] { select_scatter(x, ones({3}, kFloat64), 0, 0); }, {"select_scatter", "[3]"});
  expect_error([&] { diagonal_scatter(x, ones({4}, kFloat64)); }, {"diagonal_scatter", "[4]"});
}

// ------------------------------------------------------------ threads

// Four threads calling the new ops at once get one thread's results (TSan runs it in CI).
TEST(ProductsThreads, ConcurrentCallsMatchSequentialOnes) {
  const Tensor a = random_matrices({3}, 5, 5);
  const Tensor b = testing::random_tensor({3, 5, 2}, kFloat64);
  const Tensor x = testing::random_tensor({2, 3, 4, 4}, kFloat64);
  auto run = [&] {
    const auto [lu, pivots] = linalg::lu_factor(a);
    return std::vector<Tensor>{
        linalg::lu_solve(lu, pivots, b), std::get<2>(linalg::lu(a)),
        baddbmm(b, a, b, 0.5, 2),        linalg::multi_dot({a[0], a[1], b[2]}),
        isin(x.round(), b.round()),      take_along_dim(x, argsort(x, -1), -1),
        pad(x, {1, 1, 2, 0}, "reflect"), interpolate(x, {6, 3}, {}, "bilinear"),
        copysign(x, b.sum() - x)};
  };
  testing::expect_concurrent_runs_match(run, 4, 3);
}

// ------------------------------------------------------------ lazy recording

TEST(ProductsLazy, CompositesRecordAndMatchEagerMode) {
  const Tensor x = testing::input({4, 6}, kFloat32);
  const Tensor y = testing::input({6, 4}, kFloat32);
  const Tensor v = testing::input({6}, kFloat32);
  testing::check_lazy(
      "products and rows",
      [&] {
        return std::vector<Tensor>{addmv(v.narrow(0, 0, 4), x * 2.0, v, 0.5, 2),
                                   addr(x, v.narrow(0, 0, 4) + 1.0, v),
                                   baddbmm(x.narrow(1, 0, 4), x.unsqueeze(0), y.unsqueeze(0) * 3.0),
                                   linalg::multi_dot({x, y, x}),
                                   copysign(x, y.t() - 0.5),
                                   signbit(x - 1.0),
                                   fmax(x, y.t()),
                                   fmin(x * 2.0, 1.0),
                                   renorm(x, 2, 0, 1.0),
                                   isin(x.round(), v.round())};
      },
      false);
}

}  // namespace
}  // namespace kiln
