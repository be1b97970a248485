// Matrix functions (linalg::solve, solve_triangular, inv, det, slogdet, cholesky; inverse, det,
// logdet, slogdet, cholesky): long-double reference loops over random batches (size 0 and 1,
// broadcast batch dims, vector right-hand sides) and layouts in float32 and float64, gradients by
// gradcheck and gradgradcheck (det's also at singular matrices, where it is the adjugate), lazy
// and traced runs against eager ones, and bad input raising kiln::Error without changing anything.
#include <cmath>
#include <limits>
#include <string>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/tensor_impl.h"
#include "tests/lib/linalg_reference.h"
#include "tests/lib/threads.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::rng;
using testing::values;
using In = std::vector<Tensor>;
using Real = long double;
using Values = std::vector<Real>;

const double kNan = std::numeric_limits<double>::quiet_NaN();

int64_t pick(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

Tensor f64(std::vector<double> v, Shape shape) {
  return from_vector(v, shape);
}

// Random well-conditioned matrices: uniform entries in [-1, 1) plus n on the diagonal.
Tensor well_conditioned(const Shape& shape, DType dtype) {
  const int64_t n = shape.back();
  return (testing::random_tensor(shape, kFloat64, -1, 1) +
          eye(n, kFloat64) * static_cast<double>(n))
      .to(dtype);
}

// Random symmetric positive-definite matrices: X X^T + n I.
Tensor positive_definite(const Shape& shape, DType dtype) {
  const int64_t n = shape.back();
  const Tensor x = testing::random_tensor(shape, kFloat64, -1, 1);
  return (matmul(x, x.transpose(-2, -1)) + eye(n, kFloat64) * static_cast<double>(n)).to(dtype);
}

// ------------------------------------------------------------ long-double references

// Row-major matrices of size n x n (a) and n x k (b); the results are row-major too.
Values slice(const std::vector<double>& v, int64_t m, int64_t size) {
  return Values(v.begin() + m * size, v.begin() + (m + 1) * size);
}

// Gaussian elimination with partial pivoting: det(a), and a^-1 b in place of b.
Real eliminate(Values a, Values* b, int64_t n, int64_t k) {
  Real det = 1;
  for (int64_t c = 0; c < n; ++c) {
    int64_t p = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
    if (p != c) {
      det = -det;
      for (int64_t j = 0; j < n; ++j) std::swap(a[c * n + j], a[p * n + j]);
      if (b)
        for (int64_t j = 0; j < k; ++j) std::swap((*b)[c * k + j], (*b)[p * k + j]);
    }
    det *= a[c * n + c];
    if (a[c * n + c] == 0) continue;
    for (int64_t r = c + 1; r < n; ++r) {
      const Real f = a[r * n + c] / a[c * n + c];
      for (int64_t j = c; j < n; ++j) a[r * n + j] -= f * a[c * n + j];
      if (b)
        for (int64_t j = 0; j < k; ++j) (*b)[r * k + j] -= f * (*b)[c * k + j];
    }
  }
  if (b)
    for (int64_t c = n - 1; c >= 0; --c)
      for (int64_t j = 0; j < k; ++j) {
        Real s = (*b)[c * k + j];
        for (int64_t i = c + 1; i < n; ++i) s -= a[c * n + i] * (*b)[i * k + j];
        (*b)[c * k + j] = s / a[c * n + c];
      }
  return det;
}

// Lower-triangular L with a = L L^T, from a's lower triangle.
Values cholesky_ref(const Values& a, int64_t n) {
  Values l(static_cast<size_t>(n * n), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      Real s = a[i * n + j];
      for (int64_t p = 0; p < j; ++p) s -= l[i * n + p] * l[j * n + p];
      l[i * n + j] = i == j ? std::sqrt(s) : s / l[j * n + j];
    }
  return l;
}

Values transposed(const Values& a, int64_t rows, int64_t cols) {
  Values t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// a's triangle (the diagonal ones when unit) with zeros elsewhere: what solve_triangular reads.
Values triangle(Values a, int64_t n, bool upper, bool unit) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      if (upper ? j < i : j > i) a[i * n + j] = 0;
      if (unit && i == j) a[i * n + j] = 1;
    }
  return a;
}

std::vector<double> to_double(const std::vector<Values>& parts) {
  std::vector<double> out;
  for (const Values& p : parts)
    for (const Real v : p) out.push_back(static_cast<double>(v));
  return out;
}

Shape with_matrix(Shape s, int64_t rows, int64_t cols) {
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

// Trial `trial`'s dtype (float32 or float64), matrix size (0 every tenth trial) and batch shape
// (up to 2 dims, an empty one every ninth trial).
struct SquareTrial {
  DType dtype;
  int64_t n;
  Shape batch;
};
SquareTrial square_trial(int trial) {
  SquareTrial t{trial % 2 ? kFloat32 : kFloat64, trial % 10 == 0 ? 0 : pick(1, 5), {}};
  for (int64_t d = pick(0, 2); d > 0; --d) t.batch.push_back(pick(trial % 9 == 0 ? 0 : 1, 3));
  return t;
}

double tolerance(DType dtype) {
  return dtype == kFloat32 ? 2e-4 : 1e-10;
}

// ------------------------------------------------------------ values

TEST(LinalgSolve, MatchesTheReferenceOverBroadcastBatchesLayoutsAndVectors) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const int64_t n = trial % 10 == 0 ? 0 : pick(1, 5), k = pick(trial % 7 == 0 ? 0 : 1, 3);
    // Batch dims of A and B that broadcast (a 1 against any size, or absent).
    Shape batch_a, batch_b;
    for (int64_t d = pick(0, 2); d > 0; --d) {
      const int64_t size = pick(0, 3);
      batch_a.push_back(pick(0, 1) ? size : 1);
      batch_b.push_back(pick(0, 1) ? size : 1);
    }
    if (pick(0, 1)) batch_b.insert(batch_b.begin(), pick(1, 2));
    const Tensor a = well_conditioned(with_matrix(batch_a, n, n), dtype);
    const Tensor b = testing::random_tensor(with_matrix(batch_b, n, k), dtype);
    const Shape batch = testing::broadcast_shape(batch_a, batch_b);
    const int64_t count = detail::shape_numel(batch);
    const std::vector<double> av = values(a.expand(with_matrix(batch, n, n)));
    const std::vector<double> bv = values(b.expand(with_matrix(batch, n, k)));
    std::vector<Values> expected;
    for (int64_t m = 0; m < count; ++m) {
      Values x = slice(bv, m, n * k);
      eliminate(slice(av, m, n * n), &x, n, k);
      expected.push_back(x);
    }
    for (const auto& [layout, a_laid] : testing::layouts(a)) {
      SCOPED_TRACE(layout + " A " + detail::describe(a) + " B " + detail::describe(b));
      const double tol = tolerance(dtype);
      expect_close(linalg::solve(a_laid, b), to_double(expected), with_matrix(batch, n, k), dtype,
                   tol, tol);
      // X A = B is A^T X^T = B^T.
      expect_close(linalg::solve(a_laid.transpose(-2, -1), b.transpose(-2, -1), false)
                       .transpose(-2, -1)
                       .contiguous(),
                   to_double(expected), with_matrix(batch, n, k), dtype, tol, tol);
    }
    // A vector B: one dim, or A's shape without its last dim.
    if (k == 1 && batch_b.empty()) {
      Shape vector_shape = batch;
      vector_shape.push_back(n);
      const double tol = tolerance(dtype);
      expect_close(linalg::solve(a, b.squeeze(-1)), to_double(expected), vector_shape, dtype, tol,
                   tol);
      if (!batch_a.empty() && batch == batch_a)
        expect_close(linalg::solve(a, b.squeeze(-1).expand(vector_shape)), to_double(expected),
                     vector_shape, dtype, tol, tol);
    }
  }
}

TEST(LinalgInvDet, MatchTheReferenceIncludingSingularAndEmptyMatrices) {
  for (int trial = 0; trial < 30; ++trial) {
    const auto [dtype, n, batch] = square_trial(trial);
    // Rows negated at random: either sign of det, as well conditioned.
    const Tensor flips =
        1.0 - lt(testing::random_tensor(with_matrix(batch, n, 1), kFloat64), 0).to(kFloat64) * 2.0;
    const Tensor a = well_conditioned(with_matrix(batch, n, n), dtype) * flips.to(dtype);
    const int64_t count = detail::shape_numel(batch);
    const std::vector<double> av = values(a);
    std::vector<Values> inverse_ref, det_ref, sign_ref, log_ref;
    for (int64_t m = 0; m < count; ++m) {
      Values x(static_cast<size_t>(n * n), 0);
      for (int64_t i = 0; i < n; ++i) x[i * n + i] = 1;
      const Real d = eliminate(slice(av, m, n * n), &x, n, n);
      inverse_ref.push_back(x);
      det_ref.push_back({d});
      sign_ref.push_back({d > 0 ? Real(1) : d < 0 ? Real(-1) : Real(0)});
      log_ref.push_back({std::log(std::fabs(d))});
    }
    for (const auto& [layout, a_laid] : testing::layouts(a)) {
      SCOPED_TRACE(layout + " " + detail::describe(a));
      const double tol = tolerance(dtype);
      expect_close(linalg::inv(a_laid), to_double(inverse_ref), a.sizes(), dtype, tol, tol);
      expect_close(a_laid.inverse(), to_double(inverse_ref), a.sizes(), dtype, tol, tol);
      expect_close(linalg::det(a_laid), to_double(det_ref), batch, dtype, tol, tol);
      const auto [sign, logabsdet] = a_laid.slogdet();
      expect_close(sign, to_double(sign_ref), batch, dtype, 0, 0);
      expect_close(logabsdet, to_double(log_ref), batch, dtype, tol, tol);
      std::vector<double> logdet_ref = to_double(log_ref);
      for (size_t m = 0; m < logdet_ref.size(); ++m)
        if (sign_ref[m][0] < 0) logdet_ref[m] = kNan;
      expect_close(a_laid.logdet(), logdet_ref, batch, dtype, tol, tol);
    }
  }
  // Singular: det 0, sign 0 and log|det| -inf; NaN propagates.
  const Tensor singular = f64({1, 2, 2, 4}, {2, 2});
  EXPECT_EQ(det(singular).item<double>(), 0.0);
  EXPECT_EQ(std::get<0>(slogdet(singular)).item<double>(), 0.0);
  EXPECT_EQ(std::get<1>(slogdet(singular)).item<double>(), -INFINITY);
  EXPECT_EQ(logdet(singular).item<double>(), -INFINITY);
  const Tensor with_nan = f64({kNan, 1, 1, 1}, {2, 2});
  EXPECT_TRUE(std::isnan(det(with_nan).item<double>()));
  EXPECT_TRUE(std::isnan(logdet(with_nan).item<double>()));
  EXPECT_TRUE(all(isnan(inverse(with_nan))).item<bool>());
  // Empty matrices: det 1, an empty inverse.
  EXPECT_EQ(det(zeros({0, 0}, kFloat64)).item<double>(), 1.0);
  EXPECT_EQ(inverse(zeros({2, 0, 0})).sizes(), (Shape{2, 0, 0}));
}

TEST(LinalgCholesky, MatchesTheReferenceAndReadsOnlyItsTriangle) {
  for (int trial = 0; trial < 30; ++trial) {
    const auto [dtype, n, batch] = square_trial(trial);
    const Tensor a = positive_definite(with_matrix(batch, n, n), dtype);
    const int64_t count = detail::shape_numel(batch);
    const std::vector<double> av = values(a);
    std::vector<Values> lower, upper;
    for (int64_t m = 0; m < count; ++m) {
      lower.push_back(cholesky_ref(slice(av, m, n * n), n));
      upper.push_back(transposed(lower.back(), n, n));
    }
    // NaN in the triangle that is not read changes nothing.
    const Tensor strictly_upper = triu(ones({n, n}, kBool), 1);
    const Tensor garbage_above = masked_fill(a, strictly_upper, kNan);
    const Tensor garbage_below = masked_fill(a, strictly_upper.transpose(0, 1), kNan);
    for (const auto& [layout, a_laid] : testing::layouts(a)) {
      SCOPED_TRACE(layout + " " + detail::describe(a));
      const double tol = tolerance(dtype);
      expect_close(linalg::cholesky(a_laid), to_double(lower), a.sizes(), dtype, tol, tol);
      expect_close(a_laid.cholesky(true), to_double(upper), a.sizes(), dtype, tol, tol);
    }
    const double tol = tolerance(dtype);
    expect_close(linalg::cholesky(garbage_above), to_double(lower), a.sizes(), dtype, tol, tol);
    expect_close(linalg::cholesky(garbage_below, true), to_double(upper), a.sizes(), dtype, tol,
                 tol);
  }
}

TEST(LinalgSolveTriangular, MatchesTheReferenceOnEitherSideAndTriangle) {
  for (int trial = 0; trial < 48; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const bool upper = trial % 4 < 2, left = trial % 8 < 4, unit = trial % 16 < 8;
    const int64_t n = trial % 10 == 0 ? 0 : pick(1, 5), k = pick(trial % 7 == 0 ? 0 : 1, 3);
    Shape batch;
    for (int64_t d = pick(0, 2); d > 0; --d) batch.push_back(pick(1, 3));
    // The other triangle (and a unit diagonal) hold NaN: never read.
    Tensor a = well_conditioned(with_matrix(batch, n, n), dtype);
    const Tensor unread =
        upper ? tril(ones({n, n}, kBool), unit ? 0 : -1) : triu(ones({n, n}, kBool), unit ? 0 : 1);
    a = masked_fill(a, unread, kNan);
    const Tensor b = testing::random_tensor(with_matrix(batch, left ? n : k, left ? k : n), dtype);
    const std::vector<double> av = values(a), bv = values(b);
    std::vector<Values> expected;
    for (int64_t m = 0; m < detail::shape_numel(batch); ++m) {
      const Values tri = triangle(slice(av, m, n * n), n, upper, unit);
      // X A = B is A^T X^T = B^T.
      Values x = left ? slice(bv, m, n * k) : transposed(slice(bv, m, n * k), k, n);
      eliminate(left ? tri : transposed(tri, n, n), &x, n, k);
      expected.push_back(left ? x : transposed(x, n, k));
    }
    SCOPED_TRACE(std::string(upper ? "upper" : "lower") + (left ? " left" : " right") +
                 (unit ? " unit " : " ") + detail::describe(a));
    const double tol = tolerance(dtype);
    for (const auto& [layout, b_laid] : testing::layouts(b))
      expect_close(linalg::solve_triangular(a, b_laid, upper, left, unit), to_double(expected),
                   b.sizes(), dtype, tol, tol);
  }
}

TEST(LinalgEigh, MatchesTheReferenceAndReadsOnlyItsTriangle) {
  for (int trial = 0; trial < 30; ++trial) {
    const auto [dtype, n, batch] = square_trial(trial);
    const Tensor x = testing::random_tensor(with_matrix(batch, n, n), kFloat64);
    const Tensor a = (x + x.transpose(-2, -1)).to(dtype);
    const int64_t count = detail::shape_numel(batch);
    const std::vector<double> av = values(a);
    std::vector<Values> expected;
    for (int64_t m = 0; m < count; ++m)
      expected.push_back(testing::symmetric_eigenvalues(slice(av, m, n * n), n));
    Shape values_shape = batch;
    values_shape.push_back(n);
    const Tensor strictly_upper = triu(ones({n, n}, kBool), 1);
    const double tol = dtype == kFloat32 ? 1e-4 : 1e-10;
    for (const std::string uplo : {"L", "U"}) {
      // NaN in the triangle that is not read changes nothing.
      const Tensor unread = uplo == "L" ? strictly_upper : strictly_upper.transpose(0, 1);
      for (const auto& [layout, a_laid] : testing::layouts(masked_fill(a, unread, kNan))) {
        SCOPED_TRACE(layout + " " + uplo + " " + detail::describe(a));
        const auto [l, v] = linalg::eigh(a_laid, uplo);
        expect_close(l, to_double(expected), values_shape, dtype, tol, tol * 10);
        expect_close(linalg::eigvalsh(a_laid, uplo), to_double(expected), values_shape, dtype, tol,
                     tol * 10);
        // Orthonormal eigenvectors, as columns: V^T V = I and A V = V diag(L).
        const Tensor vd = v.to(kFloat64);
        expect_close(matmul(vd.transpose(-2, -1), vd), values(eye(n, kFloat64).expand(a.sizes())),
                     a.sizes(), kFloat64, 0, tol * 10);
        expect_close(matmul(a.to(kFloat64), vd), values(vd * l.to(kFloat64).unsqueeze(-2)),
                     a.sizes(), kFloat64, 0, tol * 100);
      }
    }
  }
  // An infinity or NaN in the triangle read gives NaN.
  const auto [l, v] = linalg::eigh(f64({1, 0, INFINITY, 1}, {2, 2}));
  EXPECT_TRUE(all(isnan(l)).item<bool>());
  EXPECT_TRUE(all(isnan(v)).item<bool>());
  expect_error([&] { (void)linalg::eigh(eye(2, kFloat64), "X"); }, {"linalg.eigh", "UPLO"});
  expect_error([&] { (void)linalg::eigvalsh(ones({2, 3}, kFloat64)); }, {"linalg.eigh", "square"});
}

TEST(LinalgQr, ReconstructsAWithOrthonormalQAndTriangularRInEveryMode) {
  for (int trial = 0; trial < 36; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const int64_t m = trial % 11 == 0 ? 0 : pick(1, 5), n = trial % 7 == 0 ? 0 : pick(1, 5);
    const int64_t k = std::min(m, n);
    Shape batch;
    for (int64_t d = pick(0, 2); d > 0; --d) batch.push_back(pick(1, 3));
    const Tensor a = testing::random_tensor(with_matrix(batch, m, n), dtype);
    const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
    for (const auto& [layout, a_laid] : testing::layouts(a))
      for (const std::string mode : {"reduced", "complete"}) {
        SCOPED_TRACE(layout + " " + mode + " " + detail::describe(a));
        const auto [q, r] = linalg::qr(a_laid, mode);
        const int64_t cols = mode == "complete" ? m : k;
        ASSERT_EQ(q.sizes(), with_matrix(batch, m, cols));
        ASSERT_EQ(r.sizes(), with_matrix(batch, cols, n));
        const Tensor qd = q.to(kFloat64), rd = r.to(kFloat64);
        expect_close(matmul(qd.transpose(-2, -1), qd),
                     values(eye(cols, kFloat64).expand(with_matrix(batch, cols, cols))),
                     with_matrix(batch, cols, cols), kFloat64, 0, tol * 10);
        expect_close(matmul(qd, rd), values(a), a.sizes(), kFloat64, 0, tol * 20);
        EXPECT_TRUE(equal(r, triu(r)));
        // Mode "r": the same R, and an empty Q.
        const auto [none, r_only] = linalg::qr(a_laid, "r");
        EXPECT_EQ(none.numel(), 0);
        if (mode == "reduced") {
          EXPECT_TRUE(equal(r_only, r));
        }
      }
  }
  expect_error([&] { (void)linalg::qr(eye(2, kFloat64), "full"); }, {"linalg.qr", "mode"});
  expect_error([&] { (void)linalg::qr(ones({3}, kFloat64)); }, {"linalg.qr", "2 dimensions"});
  // Gradients that do not exist raise, naming why.
  const Tensor tall = testing::random_tensor({4, 2}, kFloat64).requires_grad_();
  expect_error([&] { std::get<1>(linalg::qr(tall, "r")).sum().backward(); },
               {"linalg.qr", "mode \"r\""});
  expect_error([&] { std::get<0>(linalg::qr(tall, "complete")).sum().backward(); },
               {"linalg.qr", "complete", "more rows"});
}

// Batches large enough to run on several threads (small matrices go many to a thread): the same
// values as one matrix at a time, and an error that names the first bad matrix in batch order.
TEST(LinalgBatches, ManySmallMatricesMatchOneAtATimeAndNameTheFirstFailure) {
  const int64_t count = 6000;
  const Tensor a = well_conditioned({count, 3, 3}, kFloat64);
  const Tensor b = testing::random_tensor({count, 3, 2}, kFloat64);
  const Tensor x = linalg::solve(a, b), inv = linalg::inv(a), d = linalg::det(a);
  const Tensor l = linalg::cholesky(matmul(a, a.transpose(1, 2)));
  const Tensor t = linalg::solve_triangular(a, b, true);
  const Tensor leaf = a.clone().requires_grad_();
  const Tensor cofactors = autograd::grad({det(leaf).sum()}, {leaf})[0];
  for (int64_t m : {int64_t{0}, pick(1, count - 2), count - 1}) {
    SCOPED_TRACE("matrix " + std::to_string(m));
    const Tensor am = a.select(0, m), bm = b.select(0, m);
    EXPECT_TRUE(equal(x.select(0, m), linalg::solve(am, bm)));
    EXPECT_TRUE(equal(inv.select(0, m), linalg::inv(am)));
    EXPECT_TRUE(equal(d.select(0, m), linalg::det(am)));
    EXPECT_TRUE(equal(l.select(0, m), linalg::cholesky(matmul(am, am.t()))));
    EXPECT_TRUE(equal(t.select(0, m), linalg::solve_triangular(am, bm, true)));
    const Tensor one = am.clone().requires_grad_();
    EXPECT_TRUE(equal(cofactors.select(0, m), autograd::grad({det(one)}, {one})[0]));
  }
  // Matrices 4000 and 5000 singular: the error names 4000, whichever thread met which first.
  Tensor bad = a.clone();
  bad.select(0, 4000).zero_();
  bad.select(0, 5000).zero_();
  for (int repeat = 0; repeat < 5; ++repeat) {
    expect_error([&] { (void)linalg::inv(bad); }, {"linalg.inv", "matrix 4000 of"});
    expect_error([&] { (void)linalg::cholesky(bad); }, {"linalg.cholesky", "matrix 4000 of"});
  }
}

// Several threads calling matrix functions, scans and searchsorted at once (each call spreading
// its batch or lines over the pool too) get what one thread alone computes: LAPACK keeps no
// shared state between calls.
TEST(LinalgThreads, ConcurrentCallsMatchSequentialOnes) {
  const Tensor a = well_conditioned({64, 6, 6}, kFloat64);
  const Tensor b = testing::random_tensor({64, 6, 2}, kFloat64);
  const Tensor spd = matmul(a, a.transpose(1, 2));
  auto run = [&] {
    return In{linalg::solve(a, b),
              linalg::det(a),
              linalg::cholesky(spd),
              std::get<0>(linalg::eigh(spd)),
              std::get<1>(linalg::qr(a)),
              linalg::svdvals(a),
              std::get<1>(cummax(a, 1)),
              logcumsumexp(a, 2),
              searchsorted(cumsum(abs(b), 2), a.narrow(2, 0, 2))};
  };
  testing::expect_concurrent_runs_match(run, 4, 5);
}

// ------------------------------------------------------------ gradients

TEST(LinalgGrad, GradcheckAndGradgradcheckOfEveryFunction) {
  const Tensor a = well_conditioned({2, 3, 3}, kFloat64).requires_grad_();
  const Tensor a1 = well_conditioned({3, 3}, kFloat64).requires_grad_();
  const Tensor b = testing::random_tensor({2, 1, 3, 2}, kFloat64).requires_grad_();
  const Tensor v = testing::random_tensor({3}, kFloat64).requires_grad_();
  const Tensor s = testing::random_tensor({2, 3, 3}, kFloat64).requires_grad_();
  auto check = [](const std::string& what, const testing::DifferentiableFunction& f, const In& in) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(testing::gradcheck(f, in));
    EXPECT_TRUE(testing::gradgradcheck(f, in));
  };
  // Broadcast batches: A [2, 3, 3] against B [2, 1, 3, 2].
  check("solve", [](const In& in) { return In{linalg::solve(in[0], in[1])}; }, {a, b});
  check("solve right",
        [](const In& in) { return In{linalg::solve(in[0], in[1].transpose(-2, -1), false)}; },
        {a, b});
  check("solve vector", [](const In& in) { return In{linalg::solve(in[0], in[1])}; }, {a1, v});
  check("inv", [](const In& in) { return In{linalg::inv(in[0])}; }, {a});
  check("det", [](const In& in) { return In{linalg::det(in[0])}; }, {a});
  check("slogdet", [](const In& in) { return In{std::get<1>(linalg::slogdet(in[0]))}; }, {a});
  check("logdet", [](const In& in) { return In{logdet(in[0])}; }, {a});
  // cholesky of the symmetric part (it reads one triangle; its gradient is symmetric, torch's).
  for (bool upper : {false, true})
    check(upper ? "cholesky upper" : "cholesky",
          [upper](const In& in) {
            const Tensor sym = matmul(in[0], in[0].transpose(-2, -1)) + eye(3, kFloat64) * 3.0;
            return In{linalg::cholesky(sym, upper)};
          },
          {s});
  // qr of a tall, a square and a wide matrix (reduced), and of a wide one (complete: the same).
  for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 3}, Shape{3, 5}})
    for (const std::string mode : {"reduced", "complete"}) {
      if (mode == "complete" && shape[shape.size() - 2] > shape.back()) continue;
      const Tensor x = testing::random_tensor(shape, kFloat64).requires_grad_();
      check("qr " + mode + " " + detail::shape_str(shape),
            [mode](const In& in) {
              const auto [q, r] = linalg::qr(in[0], mode);
              return In{q, r};
            },
            {x});
    }
  // eigh of the symmetric part: its eigenvalues, the squares of its eigenvectors (sign-free) and
  // V diag(w) V^T, which depend on no choice of eigenvector signs.
  for (const std::string uplo : {"L", "U"})
    check("eigh " + uplo,
          [uplo](const In& in) {
            const auto [l, v] = linalg::eigh(in[0] + in[0].transpose(-2, -1), uplo);
            const Tensor w = arange(3, kFloat64) + 1.0;
            return In{l, v * v, matmul(v * w, v.transpose(-2, -1))};
          },
          {s});
  for (bool upper : {false, true})
    for (bool left : {false, true})
      for (bool unit : {false, true})
        check(std::string("solve_triangular ") + (upper ? "upper" : "lower") +
                  (left ? " left" : " right") + (unit ? " unit" : ""),
              [=](const In& in) {
                const Tensor rhs = left ? in[1] : in[1].transpose(-2, -1);
                return In{linalg::solve_triangular(in[0], rhs, upper, left, unit)};
              },
              {a, b});
}

TEST(LinalgGrad, DetGradientAtSingularMatricesIsTheAdjugate) {
  // [[1, 2], [2, 4]]: the cofactor matrix [[4, -2], [-2, 1]] (torch 1.13 returns zeros here).
  const Tensor a = f64({1, 2, 2, 4}, {2, 2}).requires_grad_();
  det(a).backward();
  expect_close(a.grad(), {4, -2, -2, 1}, {2, 2}, kFloat64, 1e-12, 1e-12);
  // Rank 2 of 3, and rank 1 of 3 (every 2x2 minor zero: a zero gradient): finite differences of
  // the polynomial det agree.
  const Tensor rank2 = f64({1, 2, 3, 2, 4, 6, 1, 1, 1}, {3, 3}).requires_grad_();
  const Tensor rank1 = f64({1, 2, 3, 2, 4, 6, -1, -2, -3}, {3, 3}).requires_grad_();
  for (const Tensor& m : {rank2, rank1})
    EXPECT_TRUE(testing::gradcheck([](const In& in) { return In{det(in[0])}; }, {m}));
  const Tensor g = autograd::grad({det(rank1)}, {rank1})[0];
  expect_close(g, std::vector<double>(9, 0.0), {3, 3}, kFloat64, 0, 1e-12);
  // The second derivative needs A^-1: at a singular matrix it raises.
  const Tensor first = autograd::grad({det(a)}, {a}, {}, true, true)[0];
  expect_error([&] { (void)autograd::grad({first.sum()}, {a}); }, {"linalg.inv", "singular"});
}

// ------------------------------------------------------------ errors

TEST(LinalgErrors, BadInputRaisesAndChangesNothing) {
  const Tensor a = well_conditioned({3, 3}, kFloat64);
  const Tensor before = a.clone();
  const Tensor b = testing::random_tensor({3, 2}, kFloat64);
  expect_error(
      [&] {
        (void)linalg::det(ones({2, 3}, kFloat64));
      },
      {"linalg.det", "square", "[2, 3]"});
  expect_error([&] { (void)linalg::inv(ones({3}, kFloat64)); }, {"linalg.inv", "2 dimensions"});
  expect_error(
      [&] {
        (void)linalg::cholesky(ones({2, 2}, kInt64));
      },
      {"linalg.cholesky", "float32 or float64", "int64"});
  expect_error([&] { (void)linalg::solve(a, b.to(kFloat32)); },
               {"linalg.solve", "one dtype", "float64", "float32"});
  expect_error(
      [&] {
        (void)linalg::solve(a, ones({4, 2}, kFloat64));
      },
      {"linalg.solve", "AX = B", "[3, 3]", "[4, 2]"});
  expect_error(
      [&] {
        (void)linalg::solve(a, ones({3, 2}, kFloat64), false);
      },
      {"linalg.solve", "XA = B"});
  expect_error(
      [&] {
        (void)linalg::solve(ones({2, 3, 3}, kFloat64), ones({3, 3, 1}, kFloat64));
      },
      {"linalg.solve", "broadcast"});
  expect_error([&] { (void)linalg::solve_triangular(a, ones({3}, kFloat64), true); },
               {"linalg.solve_triangular", "B", "2 dimensions"});
  // Matrices past LAPACK's 32-bit sizes raise before anything is copied (an expanded view: no
  // memory behind it).
  const Tensor huge = zeros({1, 1}, kFloat64).expand({50000, 50000});
  expect_error([&] { (void)linalg::det(huge); }, {"linalg.det", "32-bit", "[50000, 50000]"});
  expect_error(
      [&] {
        (void)linalg::solve(eye(2, kFloat64), zeros({2, 1}, kFloat64).expand({2, 1 << 30}));
      },
      {"linalg.solve", "32-bit"});
  // B may be written after a solve and before its backward (only its shape is kept), as in torch.
  {
    const Tensor aa = a.clone().requires_grad_(), bb = b.clone().requires_grad_();
    const Tensor x = linalg::solve(aa, bb) + linalg::solve_triangular(aa, bb, true);
    bb.detach().add_(1.0);
    x.sum().backward();
    EXPECT_TRUE(aa.grad().defined() && bb.grad().defined());
  }
  // Singular and indefinite matrices name the matrix of the batch.
  const Tensor batch = stack({a, f64({1, 2, 3, 2, 4, 6, 1, 1, 1}, {3, 3})});
  expect_error([&] { (void)linalg::inv(batch); }, {"linalg.inv", "matrix 1", "singular"});
  expect_error([&] { (void)linalg::solve(batch, b); }, {"linalg.solve", "matrix 1", "singular"});
  expect_error([&] { (void)linalg::cholesky(-eye(3, kFloat64)); },
               {"linalg.cholesky", "matrix 0", "not positive-definite", "order 1"});
  expect_error(
      [&] {
        (void)linalg::cholesky(f64({1, kNan, kNan, 1}, {2, 2}));
      },
      {"linalg.cholesky", "not positive-definite", "order 2"});
  // In lazy mode too, at the call: the operands are computed first.
  {
    LazyGuard on(true);
    const Tensor pending = batch * 1.0;
    expect_error([&] { (void)linalg::inv(pending); }, {"linalg.inv", "matrix 1", "singular"});
  }
  EXPECT_TRUE(equal(a, before));
}

// ------------------------------------------------------------ lazy and traced

In matrix_program(const In& in) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const Tensor spd = matmul(a, a.transpose(-2, -1)) + eye(3, kFloat64);
  const Tensor l = linalg::cholesky(spd);
  return In{linalg::solve(a * 2, b),
            linalg::inv(a) + 1,
            linalg::det(a).exp(),
            std::get<1>(linalg::slogdet(spd)),
            l,
            linalg::solve_triangular(l, b, false),
            logdet(spd),
            linalg::eigvalsh(spd),
            std::get<1>(linalg::eigh(spd, "U")).square(),
            std::get<0>(linalg::qr(a.narrow(-1, 0, 2))),
            std::get<1>(linalg::qr(a))};
}

TEST(LinalgModes, LazyAndTracedMatchEagerAndReplaysRaiseOnSingularMatrices) {
  const Tensor a = well_conditioned({2, 3, 3}, kFloat64).requires_grad_();
  const Tensor b = testing::random_tensor({3, 2}, kFloat64).requires_grad_();
  const In eager = matrix_program({a, b});
  In lazy;
  {
    LazyGuard on(true);
    lazy = matrix_program({a * 1.0, b * 1.0});  // pending operands
  }
  const jit::Function f = jit::trace(matrix_program, {a, b});
  const std::string path = ::testing::TempDir() + "/kiln_matrix_program.kfn";
  f.save(path);
  const jit::Function loaded = jit::load(path);
  for (int call = 0; call < 3; ++call) {
    // New values on each call: the trace computes them, never bakes them in.
    const Tensor a2 = call == 0 ? a : well_conditioned({2, 3, 3}, kFloat64).requires_grad_();
    const In expected = matrix_program({a2, b});
    const In traced = f({a2, b});
    const In reloaded = loaded({a2, b});
    const auto [loss_traced, loss_eager] =
        testing::expect_replay_matches(traced, reloaded, call == 0 ? lazy : In{}, expected);
    const In g_traced = autograd::grad({loss_traced}, {a2, b});
    const In g_eager = autograd::grad({loss_eager}, {a2, b});
    testing::expect_lazy_equal(g_traced[0], g_eager[0], "traced gradient of A");
    testing::expect_lazy_equal(g_traced[1], g_eager[1], "traced gradient of B");
  }
  // Results the kernels make for empty matrices, and matrix_power's identity, are readable inside
  // the trace (sort reads them): nothing writes them in place.
  const jit::Function reads = jit::trace(
      [](const In& in) {
        return In{std::get<0>(sort(linalg::det(in[0]).flatten())),
                  std::get<0>(sort(linalg::matrix_power(in[1], 0).flatten()))};
      },
      {zeros({2, 0, 0}, kFloat64), b.detach().narrow(0, 0, 2)});
  const In read = reads({zeros({2, 0, 0}, kFloat64), b.detach().narrow(0, 0, 2)});
  expect_close(read[0], {1, 1}, {2}, kFloat64, 0, 0);
  expect_close(read[1], {0, 0, 1, 1}, {4}, kFloat64, 0, 0);
  // A replay with a singular matrix raises, as eager mode does.
  const Tensor singular = zeros({2, 3, 3}, kFloat64).requires_grad_();
  expect_error([&] { (void)f({singular, b}); }, {"singular"});
  expect_error([&] { (void)loaded({singular, b}); }, {"singular"});
}

}  // namespace
}  // namespace kiln
