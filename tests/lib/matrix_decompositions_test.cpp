// linalg::svd, svdvals, pinv, lstsq, matrix_power, vector_norm, matrix_norm and cross: long-double
// references (singular values from Jacobi eigenvalues of A^T A) and defining identities
// (orthonormal factors, the Moore-Penrose conditions, the normal equations) over random batches
// (size 0 and 1, tall, wide and square, non-contiguous layouts) in float32 and float64; gradients
// by gradcheck and gradgradcheck of sign-free functions; lazy and traced runs against eager ones;
// bad input raising kiln::Error.
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/tensor_impl.h"
#include "tests/lib/linalg_reference.h"
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

Shape with_matrix(Shape s, int64_t rows, int64_t cols) {
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

Shape random_batch() {
  Shape batch;
  for (int64_t d = pick(0, 2); d > 0; --d) batch.push_back(pick(1, 3));
  return batch;
}

Tensor mT(const Tensor& t) {
  return t.transpose(-2, -1);
}

// The identity's first `rows` x `cols` block over `batch`, in float64.
std::vector<double> identity(const Shape& batch, int64_t rows, int64_t cols) {
  return values(eye(rows, cols, kFloat64).expand(with_matrix(batch, rows, cols)));
}

// The singular values (descending) of each matrix of a float64 batch: square roots of the
// eigenvalues of A^T A or A A^T (the smaller), in long double.
std::vector<double> singular_values_ref(const Tensor& a) {
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const std::vector<double> av = values(a);
  std::vector<double> out;
  for (int64_t b = 0; m * n > 0 && b < a.numel() / (m * n); ++b) {
    std::vector<long double> gram(static_cast<size_t>(k * k), 0);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j)
        for (int64_t p = 0; p < std::max(m, n); ++p) {
          // (A^T A)_ij when m >= n, (A A^T)_ij otherwise.
          const double x = m >= n ? av[b * m * n + p * n + i] : av[b * m * n + i * n + p];
          const double y = m >= n ? av[b * m * n + p * n + j] : av[b * m * n + j * n + p];
          gram[i * k + j] += static_cast<long double>(x) * y;
        }
    const std::vector<long double> e = testing::symmetric_eigenvalues(gram, k);
    for (int64_t i = k - 1; i >= 0; --i) out.push_back(double(std::sqrt(std::max(e[i], 0.0L))));
  }
  return out;
}

double tolerance(DType dtype) {
  return dtype == kFloat32 ? 2e-5 : 1e-12;
}

// ------------------------------------------------------------ svd

TEST(LinalgSvd, OrthonormalFactorsReconstructAWithTheReferenceSingularValues) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const int64_t m = trial % 11 == 0 ? 0 : pick(1, 5), n = trial % 7 == 0 ? 0 : pick(1, 5);
    const int64_t k = std::min(m, n);
    const Shape batch = random_batch();
    const Tensor a = testing::random_tensor(with_matrix(batch, m, n), dtype);
    Shape s_shape = batch;
    s_shape.push_back(k);
    const std::vector<double> expected = singular_values_ref(a.to(kFloat64));
    const double tol = tolerance(dtype);
    for (const auto& [layout, laid] : testing::layouts(a))
      for (bool full : {true, false}) {
        SCOPED_TRACE(layout + (full ? " full " : " reduced ") + detail::describe(a));
        const auto [u, s, vt] = linalg::svd(laid, full);
        const int64_t u_cols = full ? m : k, vt_rows = full ? n : k;
        ASSERT_EQ(u.sizes(), with_matrix(batch, m, u_cols));
        ASSERT_EQ(vt.sizes(), with_matrix(batch, vt_rows, n));
        expect_close(s, expected, s_shape, dtype, tol, tol * 10);
        expect_close(linalg::svdvals(laid), expected, s_shape, dtype, tol, tol * 10);
        const Tensor ud = u.to(kFloat64), sd = s.to(kFloat64), vd = vt.to(kFloat64);
        expect_close(matmul(mT(ud), ud), identity(batch, u_cols, u_cols),
                     with_matrix(batch, u_cols, u_cols), kFloat64, 0, tol * 10);
        expect_close(matmul(vd, mT(vd)), identity(batch, vt_rows, vt_rows),
                     with_matrix(batch, vt_rows, vt_rows), kFloat64, 0, tol * 10);
        const Tensor rebuilt = matmul(ud.narrow(-1, 0, k) * sd.unsqueeze(-2), vd.narrow(-2, 0, k));
        expect_close(rebuilt, values(a), a.sizes(), kFloat64, 0, tol * 20);
        // Descending and not negative.
        if (k > 1) {
          EXPECT_TRUE(all(ge(s.narrow(-1, 0, k - 1), s.narrow(-1, 1, k - 1))).item<bool>());
        }
        EXPECT_TRUE(all(ge(s, 0)).item<bool>());
      }
  }
}

TEST(LinalgSvd, GradcheckOfSignFreeFunctionsOfTallWideAndSquareMatrices) {
  auto check = [](const std::string& what, const testing::DifferentiableFunction& f, const In& in) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(testing::gradcheck(f, in));
    EXPECT_TRUE(testing::gradgradcheck(f, in));
  };
  for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 3}, Shape{3, 5}}) {
    const Tensor a = testing::random_tensor(shape, kFloat64).requires_grad_();
    const int64_t k = std::min(shape[shape.size() - 2], shape.back());
    check("svdvals " + detail::shape_str(shape),
          [](const In& in) { return In{linalg::svdvals(in[0])}; }, {a});
    for (bool full : {false, true})
      // U diag(w) V^T and the squares of U and V^T: unchanged by flipping a pair of singular
      // vectors' signs.
      check(std::string(full ? "svd full " : "svd ") + detail::shape_str(shape),
            [full, k](const In& in) {
              const auto [u, s, vt] = linalg::svd(in[0], full);
              const Tensor uk = u.narrow(-1, 0, k), vk = vt.narrow(-2, 0, k);
              const Tensor w = arange(k, kFloat64) + 1.0;
              return In{s, matmul(uk * w, vk), uk.square(), vk.square()};
            },
            {a});
  }
}

TEST(LinalgSvd, NonFiniteMatricesRaiseNamingTheMatrix) {
  Tensor a = testing::random_tensor({3, 2, 2}, kFloat64);
  a.select(0, 1).fill_(kNan);
  expect_error([&] { (void)linalg::svd(a); }, {"linalg.svd", "matrix 1", "infinity or NaN"});
  expect_error([&] { (void)linalg::svdvals(a); }, {"linalg.svdvals", "matrix 1"});
  expect_error([&] { (void)linalg::svd(ones({3}, kFloat64)); }, {"linalg.svd", "2 dimensions"});
  expect_error([&] { (void)linalg::svd(ones({2, 2}, kInt64)); }, {"linalg.svd", "int64"});
  // Full matrices past LAPACK's 32-bit sizes raise before anything is allocated.
  expect_error(
      [&] {
        (void)linalg::svd(zeros({1, 1}, kFloat64).expand({50000, 2}));
      },
      {"linalg.svd", "32-bit"});
}

// ------------------------------------------------------------ pinv and lstsq

// The Moore-Penrose conditions: A P A = A, P A P = P, A P and P A symmetric.
void expect_pseudo_inverse(const Tensor& a, const Tensor& p, double tol) {
  const Tensor ad = a.to(kFloat64), pd = p.to(kFloat64);
  const Tensor ap = matmul(ad, pd), pa = matmul(pd, ad);
  expect_close(matmul(ap, ad), values(ad), ad.sizes(), kFloat64, 0, tol);
  expect_close(matmul(pa, pd), values(pd), pd.sizes(), kFloat64, 0, tol);
  expect_close(ap, values(mT(ap)), ap.sizes(), kFloat64, 0, tol);
  expect_close(pa, values(mT(pa)), pa.sizes(), kFloat64, 0, tol);
}

TEST(LinalgPinv, SatisfiesTheMoorePenroseConditionsAlsoForRankDeficientMatrices) {
  for (int trial = 0; trial < 30; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const int64_t m = pick(trial % 9 == 0 ? 0 : 1, 5), n = pick(1, 5);
    const Shape batch = random_batch();
    Tensor a = testing::random_tensor(with_matrix(batch, m, n), kFloat64);
    // Every third trial rank 1: an outer product.
    if (trial % 3 == 0)
      a = matmul(a.narrow(-1, 0, 1), testing::random_tensor(with_matrix(batch, 1, n), kFloat64));
    a = a.to(dtype);
    const double tol = dtype == kFloat32 ? 1e-3 : 1e-9;
    for (const auto& [layout, laid] : testing::layouts(a)) {
      SCOPED_TRACE(layout + " " + detail::describe(a));
      const Tensor p = linalg::pinv(laid);
      ASSERT_EQ(p.sizes(), with_matrix(batch, n, m));
      expect_pseudo_inverse(a, p, tol);
    }
    if (m == n) {  // symmetric: through eigh, the same pseudo-inverse
      const Tensor sym = a + mT(a);
      expect_close(linalg::pinv(sym, std::nullopt, std::nullopt, true), values(linalg::pinv(sym)),
                   sym.sizes(), dtype, tol, tol);
    }
  }
  // Tolerances: singular values at most max(atol, rtol * largest) are dropped.
  const Tensor d = from_vector(std::vector<double>{4, 0, 0, 1e-3}, {2, 2});
  expect_close(linalg::pinv(d), {0.25, 0, 0, 1000}, {2, 2}, kFloat64, 1e-12, 0);
  expect_close(linalg::pinv(d, 1e-2), {0.25, 0, 0, 0}, {2, 2}, kFloat64, 1e-12, 0);
  expect_close(linalg::pinv(d, std::nullopt, 1e-2), {0.25, 0, 0, 0}, {2, 2}, kFloat64, 1e-12, 0);
  expect_close(linalg::pinv(d, std::nullopt, 1e-2, true), {0.25, 0, 0, 0}, {2, 2}, kFloat64, 1e-12,
               0);
  const Tensor full_rank = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return In{linalg::pinv(in[0])}; }, {full_rank}));
  EXPECT_TRUE(
      testing::gradgradcheck([](const In& in) { return In{linalg::pinv(in[0])}; }, {full_rank}));
  expect_error(
      [&] {
        (void)linalg::pinv(ones({2, 3}, kFloat64), 0, 0, true);
      },
      {"linalg.pinv", "hermitian", "square"});
}

TEST(LinalgLstsq, SolvesTheNormalEquationsWithResidualsRankAndSingularValues) {
  for (int trial = 0; trial < 30; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const int64_t n = pick(1, 4), m = n + pick(0, 3), k = pick(1, 3);
    const Shape batch = random_batch();
    const Tensor a = testing::random_tensor(with_matrix(batch, m, n), dtype);
    const Tensor b = testing::random_tensor(with_matrix(batch, m, k), dtype);
    // Full rank: X = (A^T A)^-1 A^T B, in float64.
    const Tensor ad = a.to(kFloat64), bd = b.to(kFloat64);
    const Tensor x = linalg::solve(matmul(mT(ad), ad), matmul(mT(ad), bd));
    const double tol = dtype == kFloat32 ? 2e-3 : 1e-9;
    SCOPED_TRACE(detail::describe(a) + " " + detail::describe(b));
    const auto [solution, residuals, rank, singular] = linalg::lstsq(a, b);
    expect_close(solution, values(x), x.sizes(), dtype, tol, tol);
    expect_close(rank, std::vector<double>(size_t(detail::shape_numel(batch)), double(n)), batch,
                 kInt64, 0, 0);
    expect_close(singular, singular_values_ref(ad), linalg::svdvals(a).sizes(), dtype, tol, tol);
    if (m > n) {
      Shape residual_shape = batch;
      residual_shape.push_back(k);
      expect_close(residuals, values(sum(square(matmul(ad, x) - bd), {-2})), residual_shape, dtype,
                   tol, tol);
    } else {
      EXPECT_EQ(residuals.numel(), 0);
    }
  }
}

TEST(LinalgLstsq, WideRankDeficientAndVectorProblemsGiveTheMinimumNormSolution) {
  // Wide: the minimum-norm solution pinv(A) B; no residuals.
  const Tensor wide = testing::random_tensor({2, 3, 5}, kFloat64);
  const Tensor b = testing::random_tensor({2, 3, 2}, kFloat64);
  const auto [x, residuals, rank, singular] = linalg::lstsq(wide, b);
  expect_close(x, values(matmul(linalg::pinv(wide), b)), {2, 5, 2}, kFloat64, 1e-10, 1e-10);
  EXPECT_EQ(residuals.numel(), 0);
  expect_close(rank, {3, 3}, {2}, kInt64, 0, 0);
  EXPECT_EQ(singular.sizes(), (Shape{2, 3}));
  // Rank 1 of 2 columns: rank 1, no residuals, the minimum-norm solution.
  const Tensor deficient = from_vector(std::vector<double>{1, 2, 2, 4, 3, 6}, {3, 2});
  const Tensor rhs = from_vector(std::vector<double>{1, 2, 3}, {3});
  const auto [xd, rd, rankd, sd] = linalg::lstsq(deficient, rhs);
  EXPECT_EQ(rankd.item<int64_t>(), 1);
  EXPECT_EQ(rd.numel(), 0);
  expect_close(xd, {0.2, 0.4}, {2}, kFloat64, 1e-12, 1e-12);  // x = t (1, 2), 5t = 1
  // A vector B: a vector solution; residuals keep a dim of 1, as torch's.
  const Tensor tall = testing::random_tensor({2, 5, 3}, kFloat64);
  const auto [xv, rv, rankv, sv] = linalg::lstsq(tall, testing::random_tensor({2, 5}, kFloat64));
  EXPECT_EQ(xv.sizes(), (Shape{2, 3}));
  EXPECT_EQ(rv.sizes(), (Shape{2, 1}));
  // rcond drops small singular values.
  const Tensor d = from_vector(std::vector<double>{4, 0, 0, 1e-3}, {2, 2});
  const Tensor ones2 = ones({2, 1}, kFloat64);
  expect_close(std::get<0>(linalg::lstsq(d, ones2, 1e-2)), {0.25, 0}, {2, 1}, kFloat64, 1e-12, 0);
  // Gradients through the solution.
  const Tensor a = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  const Tensor bb = testing::random_tensor({4, 2}, kFloat64).requires_grad_();
  auto solve = [](const In& in) { return In{std::get<0>(linalg::lstsq(in[0], in[1]))}; };
  EXPECT_TRUE(testing::gradcheck(solve, {a, bb}));
  EXPECT_TRUE(testing::gradgradcheck(solve, {a, bb}));
  // Errors.
  expect_error([&] { (void)linalg::lstsq(tall, b, std::nullopt, "qr"); },
               {"linalg.lstsq", "driver", "qr"});
  expect_error(
      [&] {
        (void)linalg::lstsq(tall, ones({2, 4, 1}, kFloat64));
      },
      {"linalg.lstsq", "same number of rows"});
  expect_error(
      [&] {
        (void)linalg::lstsq(tall, ones({2, 5, 1}));
      },
      {"linalg.lstsq", "one dtype", "float32"});
}

// ------------------------------------------------------------ matrix_power

TEST(LinalgMatrixPower, MatchesRepeatedProductsForEveryExponent) {
  const Tensor a = (testing::random_tensor({2, 3, 3}, kFloat64) + eye(3, kFloat64) * 3.0);
  const Tensor inverse = linalg::inv(a);
  for (int64_t n = -4; n <= 6; ++n) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Tensor expected = eye(3, kFloat64).expand({2, 3, 3});
    for (int64_t i = 0; i < std::abs(n); ++i) expected = matmul(expected, n < 0 ? inverse : a);
    expect_close(linalg::matrix_power(a, n), values(expected), {2, 3, 3}, kFloat64, 1e-10, 1e-10);
    expect_close(a.matrix_power(n), values(expected), {2, 3, 3}, kFloat64, 1e-10, 1e-10);
  }
  // n = 0 and 1 are new tensors (writing to them leaves A alone).
  Tensor one = linalg::matrix_power(a, 1);
  one.fill_(0.0);
  EXPECT_FALSE(all(eq(a, 0)).item<bool>());
  EXPECT_EQ(linalg::matrix_power(zeros({0, 2, 2}), 3).sizes(), (Shape{0, 2, 2}));
  // n = 0: the identity, differentiable with a zero gradient (as torch's).
  const Tensor leaf = a.clone().requires_grad_();
  const Tensor power0 = linalg::matrix_power(leaf, 0);
  EXPECT_TRUE(power0.requires_grad());
  power0.sum().backward();
  expect_close(leaf.grad(), std::vector<double>(18, 0.0), {2, 3, 3}, kFloat64, 0, 0);
  const Tensor g = a.clone().requires_grad_();
  for (int64_t n : {-2, 1, 3}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    EXPECT_TRUE(
        testing::gradcheck([n](const In& in) { return In{linalg::matrix_power(in[0], n)}; }, {g}));
  }
  expect_error(
      [&] {
        (void)linalg::matrix_power(ones({2, 3}), 2);
      },
      {"linalg.matrix_power", "square", "[2, 3]"});
  expect_error(
      [&] {
        (void)linalg::matrix_power(zeros({2, 2}, kFloat64), -1);
      },
      {"linalg.inv", "singular"});
}

// ------------------------------------------------------------ norms

TEST(LinalgVectorNorm, MatchesAReferenceForEveryOrderOverDims) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Shape shape = testing::random_shape(1, 3, 4, false);
    Tensor x = testing::random_tensor(shape, dtype);
    x = masked_fill(x, lt(testing::random_tensor(shape, kFloat64, 0, 1), 0.2), 0.0);  // zeros
    const int64_t d = pick(0, static_cast<int64_t>(shape.size()) - 1);
    const std::vector<double> xv = values(x);
    for (double ord : {2.0, 1.0, 3.0, 0.5, -1.0, -2.5, 0.0, kInf, -kInf}) {
      // The reference over dim d, kept as size 1.
      Shape kept = shape;
      kept[d] = 1;
      std::vector<double> expected(size_t(detail::shape_numel(kept)));
      for (size_t out = 0; out < expected.size(); ++out) {
        std::vector<int64_t> index = testing::unravel(int64_t(out), kept);
        long double acc = ord == kInf ? 0 : ord == -kInf ? kInf : 0;
        for (int64_t k = 0; k < shape[d]; ++k) {
          index[d] = k;
          const long double v = std::fabs(xv[testing::ravel(index, shape)]);
          if (ord == kInf)
            acc = std::max(acc, v);
          else if (ord == -kInf)
            acc = std::min(acc, v);
          else if (ord == 0)
            acc += v != 0;
          else
            acc += std::pow(v, static_cast<long double>(ord));
        }
        expected[out] = std::isinf(ord) || ord == 0 ? double(acc) : double(std::pow(acc, 1 / ord));
      }
      SCOPED_TRACE(detail::describe(x) + " ord " + std::to_string(ord) + " dim " +
                   std::to_string(d));
      const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
      expect_close(linalg::vector_norm(x, ord, {d}, true), expected, kept, dtype, tol, tol);
      Shape removed = shape;
      removed.erase(removed.begin() + d);
      expect_close(linalg::vector_norm(x, ord, {d}), expected, removed, dtype, tol, tol);
    }
  }
  // Every dim; dtype converts first; an empty tensor's 2-norm is 0.
  const Tensor v = from_vector(std::vector<double>{3, 0, -4}, {3}).to(kFloat32);
  EXPECT_EQ(linalg::vector_norm(v).item<double>(), 5.0);
  EXPECT_EQ(linalg::vector_norm(v, 2, {}, false, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(linalg::vector_norm(v, 0).item<double>(), 2.0);
  EXPECT_EQ(linalg::vector_norm(empty({0})).item<double>(), 0.0);
  expect_error([&] { (void)linalg::vector_norm(arange(0, 3)); },
               {"linalg.vector_norm", "floating", "int64"});
  expect_error([&] { (void)linalg::vector_norm(empty({0}), kInf); },
               {"linalg.vector_norm", "no elements"});
  expect_error(
      [&] {
        (void)linalg::vector_norm(empty({2, 0}), -1, {1});
      },
      {"linalg.vector_norm", "no elements"});
  expect_error([&] { (void)linalg::vector_norm(v, 2, {1}); }, {"linalg.vector_norm", "dim"});
}

TEST(LinalgVectorNorm, GradientsAreTorchsIncludingAtZero) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  for (double ord : {2.0, 3.0, 0.5, -1.0, kInf, -kInf, 1.0}) {
    SCOPED_TRACE("ord " + std::to_string(ord));
    auto f = [ord](const In& in) { return In{linalg::vector_norm(in[0], ord, {1})}; };
    EXPECT_TRUE(testing::gradcheck(f, {x}));
    if (!std::isinf(ord) && ord != 1) {
      EXPECT_TRUE(testing::gradgradcheck(f, {x}));
    }
  }
  // At zero elements: 0 for ord 2 at a zero vector and for ord < 2 at a zero element; ord 0's
  // gradient is 0 everywhere.
  const Tensor z = from_vector(std::vector<double>{1, 0, -2}, {3}).requires_grad_();
  linalg::vector_norm(z, -1).backward();
  expect_close(z.grad(), {0, 0, 0}, {3}, kFloat64, 0, 0);
  const Tensor z2 = z.detach().clone().requires_grad_();
  linalg::vector_norm(z2, 0).backward();
  expect_close(z2.grad(), {0, 0, 0}, {3}, kFloat64, 0, 0);
  const Tensor zero = zeros({3}, kFloat64).requires_grad_();
  linalg::vector_norm(zero).backward();
  expect_close(zero.grad(), {0, 0, 0}, {3}, kFloat64, 0, 0);
}

TEST(LinalgMatrixNorm, MatchesTheReferenceForEveryOrderOverAnyTwoDims) {
  for (int trial = 0; trial < 20; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Tensor a = testing::random_tensor({pick(1, 3), pick(1, 4), pick(1, 4)}, dtype);
    // The two dims in either order, and the third the batch.
    const int64_t rows = pick(0, 2), cols = (rows + pick(1, 2)) % 3;
    const Tensor m = movedim(a, {rows, cols}, {-2, -1}).to(kFloat64);  // batch x rows x cols
    const std::vector<double> sv = singular_values_ref(m);
    const int64_t k = std::min(m.size(1), m.size(2)), count = m.size(0);
    std::vector<double> fro, nuc, two, minus_two;
    for (int64_t b = 0; b < count; ++b) {
      const auto first = sv.begin() + b * k;
      nuc.push_back(std::accumulate(first, first + k, 0.0));
      two.push_back(*first);
      minus_two.push_back(*(first + k - 1));
      fro.push_back(std::sqrt(sum(square(m.select(0, b))).item<double>()));
    }
    const Tensor abs_m = abs(m);
    auto ref = [&](const Tensor& t) { return values(t); };
    SCOPED_TRACE(detail::describe(a) + " dims " + std::to_string(rows) + ", " +
                 std::to_string(cols));
    const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
    const Shape out{count};
    const std::vector<int64_t> dims{rows, cols};
    expect_close(linalg::matrix_norm(a, "fro", dims), fro, out, dtype, tol, tol);
    expect_close(linalg::matrix_norm(a, "nuc", dims), nuc, out, dtype, tol * 10, tol);
    expect_close(linalg::matrix_norm(a, 2, dims), two, out, dtype, tol * 10, tol);
    expect_close(linalg::matrix_norm(a, -2, dims), minus_two, out, dtype, tol * 10, tol);
    expect_close(linalg::matrix_norm(a, 1, dims), ref(amax(sum(abs_m, {1}), {1})), out, dtype, tol,
                 tol);
    expect_close(linalg::matrix_norm(a, -1, dims), ref(amin(sum(abs_m, {1}), {1})), out, dtype, tol,
                 tol);
    expect_close(linalg::matrix_norm(a, kInf, dims), ref(amax(sum(abs_m, {2}), {1})), out, dtype,
                 tol, tol);
    expect_close(linalg::matrix_norm(a, -kInf, dims), ref(amin(sum(abs_m, {2}), {1})), out, dtype,
                 tol, tol);
    // keepdim keeps both dims as size 1.
    Shape kept = a.sizes();
    kept[rows] = kept[cols] = 1;
    for (const std::string ord : {"fro", "nuc"})
      EXPECT_EQ(linalg::matrix_norm(a, ord, dims, true).sizes(), kept) << ord;
    for (double ord : {1.0, -2.0, kInf})
      EXPECT_EQ(linalg::matrix_norm(a, ord, dims, true).sizes(), kept) << ord;
  }
  const Tensor x = testing::random_tensor({2, 3, 4}, kFloat64).requires_grad_();
  for (const std::string ord : {"fro", "nuc"})
    EXPECT_TRUE(testing::gradcheck(
        [ord](const In& in) { return In{linalg::matrix_norm(in[0], ord)}; }, {x}))
        << ord;
  for (double ord : {1.0, 2.0, -2.0, kInf})
    EXPECT_TRUE(testing::gradcheck(
        [ord](const In& in) { return In{linalg::matrix_norm(in[0], ord)}; }, {x}))
        << ord;
  expect_error([&] { (void)linalg::matrix_norm(x, 3.0); }, {"linalg.matrix_norm", "ord", "3"});
  expect_error([&] { (void)linalg::matrix_norm(x, "max"); }, {"linalg.matrix_norm", "\"max\""});
  expect_error([&] { (void)linalg::matrix_norm(ones({3}, kFloat64)); },
               {"linalg.matrix_norm", "2 dimensions"});
  expect_error(
      [&] {
        (void)linalg::matrix_norm(x, "fro", {1, -2});
      },
      {"linalg.matrix_norm", "two different"});
  expect_error(
      [&] {
        (void)linalg::matrix_norm(arange(0, 4).reshape({2, 2}));
      },
      {"linalg.matrix_norm", "floating"});
}

TEST(LinalgNormAndRank, NormDispatchesAsTorchAndMatrixRankCountsSingularValues) {
  const Tensor m = testing::random_tensor({3, 4}, kFloat64);
  const Tensor batch = testing::random_tensor({2, 3, 4}, kFloat64);
  auto same = [](const Tensor& a, const Tensor& b) {
    expect_close(a, values(b), b.sizes(), b.dtype(), 1e-14, 1e-14);
  };
  same(linalg::norm(m), linalg::vector_norm(m));                // flattened 2-norm
  same(linalg::norm(m, "nuc"), linalg::matrix_norm(m, "nuc"));  // a string: matrix
  same(linalg::norm(m, 2), linalg::matrix_norm(m, 2.0));        // 2-D with an ord: matrix
  same(linalg::norm(m, 3, {1}), linalg::vector_norm(m, 3, {1}));
  same(linalg::norm(batch, std::nullopt, {0, 2}, true),
       linalg::matrix_norm(batch, "fro", {0, 2}, true));
  same(linalg::norm(batch, -1, {2, 1}), linalg::matrix_norm(batch, -1.0, {2, 1}));
  same(linalg::norm(batch), linalg::vector_norm(batch));
  expect_error([&] { (void)linalg::norm(batch, 2); }, {"linalg.norm", "1-D or 2-D"});
  expect_error([&] { (void)linalg::norm(batch, "fro"); }, {"linalg.norm", "2-D"});
  expect_error([&] { (void)linalg::norm(batch, 2, {0, 1, 2}); }, {"linalg.norm", "one or two"});
  // matrix_rank: full, deficient (an outer product, a zero matrix), batched, hermitian.
  const Tensor outer =
      matmul(testing::random_tensor({4, 1}, kFloat64), testing::random_tensor({1, 3}, kFloat64));
  const Tensor stacked = stack({m.narrow(1, 0, 3), outer.narrow(0, 0, 3), zeros({3, 3}, kFloat64)});
  expect_close(linalg::matrix_rank(stacked), {3, 1, 0}, {3}, kInt64, 0, 0);
  expect_close(
      linalg::matrix_rank(stacked + stacked.transpose(-2, -1), std::nullopt, std::nullopt, true),
      {3, 2, 0}, {3}, kInt64, 0, 0);  // x y^T + y x^T has rank 2
  EXPECT_EQ(linalg::matrix_rank(m).item<int64_t>(), 3);
  // Tolerances: singular values 4 and 1e-3.
  const Tensor d = from_vector(std::vector<double>{4, 0, 0, 1e-3}, {2, 2});
  EXPECT_EQ(linalg::matrix_rank(d).item<int64_t>(), 2);
  EXPECT_EQ(linalg::matrix_rank(d, 1e-2).item<int64_t>(), 1);
  EXPECT_EQ(linalg::matrix_rank(d, std::nullopt, 1e-2).item<int64_t>(), 1);
  expect_error([&] { (void)linalg::matrix_rank(m, std::nullopt, std::nullopt, true); },
               {"linalg.matrix_rank", "hermitian", "square"});
}

// ------------------------------------------------------------ cross

TEST(LinalgCross, MatchesTheFormulaBroadcastingAlongAnyDim) {
  const Tensor a = testing::random_tensor({1, 4, 3}, kFloat64);
  const Tensor b = testing::random_tensor({2, 1, 3}, kFloat64);
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> expected;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 3; ++c) {
        auto at = [&](int64_t j) { return av[r * 3 + (c + j) % 3]; };
        auto bt = [&](int64_t j) { return bv[i * 3 + (c + j) % 3]; };
        expected.push_back(at(1) * bt(2) - at(2) * bt(1));
      }
  expect_close(linalg::cross(a, b), expected, {2, 4, 3}, kFloat64, 0, 0);
  // Along dim 0 of the transposes: the same values, transposed.
  expect_close(linalg::cross(a.select(0, 0).t(), b.select(0, 0).t(), 0).t().contiguous(),
               std::vector<double>(expected.begin(), expected.begin() + 12), {4, 3}, kFloat64, 0,
               0);
  const Tensor x = a.clone().requires_grad_(), y = b.clone().requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return In{linalg::cross(in[0], in[1])}; }, {x, y}));
  expect_error([&] { (void)linalg::cross(ones({2}), ones({2})); },
               {"linalg.cross", "size 3", "[2]"});
  expect_error(
      [&] {
        (void)linalg::cross(ones({3}), ones({2, 3}));
      },
      {"linalg.cross", "same number of dimensions"});
  expect_error([&] { (void)linalg::cross(ones({3}), ones({3}, kFloat64)); },
               {"linalg.cross", "one dtype", "float32", "float64"});
}

// ------------------------------------------------------------ lazy and traced

In decomposition_program(const In& in) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const auto [u, s, vt] = linalg::svd(a, false);
  const auto [x, residuals, rank, singular] = linalg::lstsq(a, b);
  return In{s,
            matmul(u * s.unsqueeze(-2), vt),
            linalg::svdvals(a * 2.0),
            linalg::pinv(a),
            x,
            linalg::matrix_power(a.narrow(-1, 0, 3).narrow(-2, 0, 3), 3),
            linalg::vector_norm(a, 3, {-1}),
            linalg::matrix_norm(a, "nuc"),
            linalg::matrix_norm(a, 1.0),
            linalg::cross(a.narrow(-1, 0, 3), b.narrow(-1, 0, 1).expand({4, 3}))};
}

TEST(LinalgDecompositionModes, LazyAndTracedMatchEagerAndReplaysRaiseOnNaN) {
  const Tensor a = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  const Tensor b = testing::random_tensor({4, 2}, kFloat64).requires_grad_();
  const In eager = decomposition_program({a, b});
  In lazy;
  {
    LazyGuard on(true);
    lazy = decomposition_program({a * 1.0, b * 1.0});
  }
  const jit::Function f = jit::trace(decomposition_program, {a, b});
  const std::string path = ::testing::TempDir() + "/kiln_decomposition_program.kfn";
  f.save(path);
  const jit::Function loaded = jit::load(path);
  for (int call = 0; call < 3; ++call) {
    const Tensor a2 = call == 0 ? a : testing::random_tensor({4, 3}, kFloat64).requires_grad_();
    const In expected = decomposition_program({a2, b});
    const auto [loss_traced, loss_eager] = testing::expect_replay_matches(
        f({a2, b}), loaded({a2, b}), call == 0 ? lazy : In{}, expected);
    const In g_traced = autograd::grad({loss_traced}, {a2, b});
    const In g_eager = autograd::grad({loss_eager}, {a2, b});
    testing::expect_lazy_equal(g_traced[0], g_eager[0], "traced gradient of A");
    testing::expect_lazy_equal(g_traced[1], g_eager[1], "traced gradient of B");
  }
  const Tensor with_nan = full({4, 3}, kNan, kFloat64).requires_grad_();
  expect_error([&] { (void)f({with_nan, b}); }, {"linalg.svd", "NaN"});
}

}  // namespace
}  // namespace kiln
