// Linear algebra composed of the matrix functions (lib/ops/matrix_functions.cpp) and tensor ops,
// with libtorch's names and semantics: linalg::pinv, matrix_rank, lstsq, matrix_power, norm,
// matrix_norm and cross, and torch's cholesky_solve.
// They record, trace and differentiate through their parts (pinv and lstsq through svd's
// gradient, as torch's composite implementations).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/tensor_impl.h"

namespace kiln::linalg {

using detail::describe;

namespace {
Tensor mT(const Tensor& t) {
  return t.transpose(-2, -1);
}

void check_floating_matrix(const Tensor& a, const char* op, const char* name = "A") {
  detail::check_defined(a, op, name);
  KILN_CHECK(a.dim() >= 2, op, ": ", name, " must have at least 2 dimensions, got ", describe(a));
  KILN_CHECK(a.dtype() == kFloat32 || a.dtype() == kFloat64, op,
             ": expected a float32 or float64 tensor, got ", name, " ", describe(a));
}

// A and, when hermitian, its square shape.
void check_decomposable(const Tensor& a, const char* op, bool hermitian) {
  check_floating_matrix(a, op);
  KILN_CHECK(!hermitian || a.size(-1) == a.size(-2), op,
             ": hermitian needs batches of square matrices, got ", describe(a));
}

double epsilon(DType dtype) {
  return dtype == kFloat64 ? std::numeric_limits<double>::epsilon()
                           : double(std::numeric_limits<float>::epsilon());
}

// torch's tolerances: without atol (or with atol 0), rtol defaults to max(m, n) eps; with one, 0.
struct Tolerances {
  double atol, rtol;
};
Tolerances tolerances(const Tensor& a, std::optional<double> atol, std::optional<double> rtol) {
  const double abs_tol = atol.value_or(0);
  const double eps_rtol = double(std::max(a.size(-2), a.size(-1))) * epsilon(a.dtype());
  return {abs_tol, rtol.value_or(abs_tol > 0 ? 0 : eps_rtol)};
}

// Where the singular (or eigen) values are above max(atol, rtol * the largest |value|).
Tensor kept(const Tensor& values, Tolerances tol) {
  const Tensor magnitude = abs(values);
  const Tensor largest = values.size(-1) == 0 ? magnitude : amax(magnitude, -1, true);
  const Tensor floor = full({}, tol.atol, TensorOptions(values.dtype()).device(values.device()));
  return gt(magnitude, maximum(largest * tol.rtol, floor));
}

// The reciprocals of the kept values, 0 for the others; a gradient reaches only the kept ones.
Tensor kept_reciprocals(const Tensor& values, Tolerances tol) {
  const Tensor keep = kept(values, tol);
  return where(keep, reciprocal(where(keep, values, 1.0)), 0.0);
}
}  // namespace

Tensor pinv(const Tensor& a, std::optional<double> atol, std::optional<double> rtol,
            bool hermitian) {
  const char* op = "linalg.pinv";
  check_decomposable(a, op, hermitian);
  const Tolerances tol = tolerances(a, atol, rtol);
  if (hermitian) {
    const auto [values, vectors] = eigh(a);
    return matmul(vectors * kept_reciprocals(values, tol).unsqueeze(-2), mT(vectors));
  }
  const auto [u, s, vt] = svd(a, false);
  return matmul(mT(vt) * kept_reciprocals(s, tol).unsqueeze(-2), mT(u));
}

Tensor matrix_rank(const Tensor& a, std::optional<double> atol, std::optional<double> rtol,
                   bool hermitian) {
  const char* op = "linalg.matrix_rank";
  check_decomposable(a, op, hermitian);
  NoGradGuard no_grad;  // a count
  const Tensor values = hermitian ? eigvalsh(a) : svdvals(a);
  return sum(kept(values, tolerances(a, atol, rtol)), {-1});
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lstsq(const Tensor& a, const Tensor& b_in,
                                                 std::optional<double> rcond,
                                                 std::optional<std::string_view> driver) {
  const char* op = "linalg.lstsq";
  check_floating_matrix(a, op);
  detail::check_defined(b_in, op, "B");
  KILN_CHECK(!driver || *driver == "gels" || *driver == "gelsy" || *driver == "gelsd" ||
                 *driver == "gelss",
             op, ": driver must be \"gels\", \"gelsy\", \"gelsd\" or \"gelss\", got \"",
             std::string(driver.value_or("")), "\"");
  KILN_CHECK(a.dtype() == b_in.dtype(), op, ": expected A and B of one dtype, got A ", describe(a),
             " and B ", describe(b_in));
  KILN_CHECK(a.device() == b_in.device(), op, ": expected A and B on one device, got A on ",
             a.device(), " and B on ", b_in.device());
  const int64_t m = a.size(-2), n = a.size(-1);
  // torch's vector case: B with one dim less than A.
  const bool vector = b_in.dim() == a.dim() - 1;
  const Tensor b = vector ? b_in.unsqueeze(-1) : b_in;
  KILN_CHECK(b.dim() >= 2 && b.size(-2) == m, op, ": A ", describe(a), " and B ", describe(b_in),
             " must have the same number of rows");
  const auto [u, s, vt] = svd(a, false);
  const Tensor reciprocals = kept_reciprocals(s, tolerances(a, 0.0, rcond));
  Tensor solution = matmul(mT(vt) * reciprocals.unsqueeze(-2), matmul(mT(u), b));
  Tensor rank;
  {
    NoGradGuard no_grad;
    rank = sum(ne(reciprocals, 0), {-1});
  }
  // The squared residual of each column where m > n and every matrix has full rank.
  Tensor residuals = empty({0}, TensorOptions(a.dtype()).device(a.device()));
  if (m > n && rank.numel() > 0 && all(eq(rank, n)).item<bool>())
    residuals = sum(square(matmul(a, solution) - b), {-2});
  if (vector) solution = solution.squeeze(-1);
  return {solution, residuals, rank, s};
}

Tensor matrix_power(const Tensor& a, int64_t n) {
  const char* op = "linalg.matrix_power";
  detail::check_defined(a, op);
  KILN_CHECK(a.dim() >= 2 && a.size(-1) == a.size(-2), op,
             ": A must be batches of square matrices, got ", describe(a));
  if (n == 0) {  // the identity, selected over A: a zero gradient reaches A, as torch's
    const TensorOptions options = TensorOptions(a.dtype()).device(a.device());
    return where(ones({}, TensorOptions(kBool).device(a.device())), eye(a.size(-1), options), a);
  }
  const Tensor base = n < 0 ? inv(a) : a;
  if (n == 1 || n == -1) return n == 1 ? base.clone() : base;
  // Binary powering, as torch's (same products, in the same order).
  uint64_t k = n < 0 ? uint64_t(0) - uint64_t(n) : uint64_t(n);
  Tensor z, result;
  while (k > 0) {
    const bool bit = k & 1;
    k >>= 1;
    z = z.defined() ? matmul(z, z) : base;
    if (bit) result = result.defined() ? matmul(result, z) : z;
  }
  return result;
}

namespace {
// The two matrix dims of A (wrapped, distinct), checked.
std::pair<int64_t, int64_t> matrix_dims(const Tensor& a, const std::vector<int64_t>& dims,
                                        const char* op) {
  KILN_CHECK(a.is_floating_point(), op, ": expected a floating-point input, got ", describe(a));
  KILN_CHECK(a.dim() >= 2, op, ": A must have at least 2 dimensions, got ", describe(a));
  KILN_CHECK(dims.size() == 2, op, ": dims must name two dimensions, got ", dims.size());
  const int64_t rows = detail::wrap_dim(dims[0], a.dim(), op, &a);
  const int64_t cols = detail::wrap_dim(dims[1], a.dim(), op, &a);
  KILN_CHECK(rows != cols, op, ": dims must be two different dimensions, got ", dims[0], " and ",
             dims[1], " of ", describe(a));
  return {rows, cols};
}

// A reduced over its two matrix dims (kept as size 1), removed unless keepdim.
Tensor finish(const Tensor& kept, int64_t rows, int64_t cols, bool keepdim) {
  return keepdim ? kept : kept.squeeze(std::max(rows, cols)).squeeze(std::min(rows, cols));
}

// The singular values of A's matrices over (rows, cols), with those dims kept as size 1 before.
Tensor singular_values(const Tensor& a, int64_t rows, int64_t cols) {
  return svdvals(movedim(a, {rows, cols}, {-2, -1}));
}
}  // namespace

Tensor matrix_norm(const Tensor& a, const std::string& ord, const std::vector<int64_t>& dims,
                   bool keepdim) {
  const char* op = "linalg.matrix_norm";
  detail::check_defined(a, op);
  const auto [rows, cols] = matrix_dims(a, dims, op);
  if (ord == "fro") return vector_norm(a, 2, {rows, cols}, keepdim);
  KILN_CHECK(ord == "nuc", op, ": ord must be \"fro\", \"nuc\" or a number, got \"", ord, "\"");
  const Tensor total = sum(singular_values(a, rows, cols), {-1});
  if (!keepdim) return total;
  return total.unsqueeze(std::min(rows, cols)).unsqueeze(std::max(rows, cols));
}

Tensor matrix_norm(const Tensor& a, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  const char* op = "linalg.matrix_norm";
  detail::check_defined(a, op);
  const auto [rows, cols] = matrix_dims(a, dims, op);
  const bool largest = ord > 0;
  if (std::abs(ord) == 2) {
    const Tensor values = singular_values(a, rows, cols);
    const Tensor extreme = largest ? amax(values, {-1}) : amin(values, {-1});
    if (!keepdim) return extreme;
    return extreme.unsqueeze(std::min(rows, cols)).unsqueeze(std::max(rows, cols));
  }
  KILN_CHECK(std::abs(ord) == 1 || std::isinf(ord), op,
             ": ord must be 1, -1, 2, -2, inf or -inf (or \"fro\", \"nuc\"), got ", ord);
  // 1: the largest column sum of |A|; inf: the largest row sum.
  const int64_t summed = std::abs(ord) == 1 ? rows : cols;
  const int64_t compared = std::abs(ord) == 1 ? cols : rows;
  const Tensor sums = sum(abs(a), {summed}, true);
  return finish(largest ? amax(sums, {compared}, true) : amin(sums, {compared}, true), rows, cols,
                keepdim);
}

Tensor norm(const Tensor& a, std::optional<Scalar> ord, const std::vector<int64_t>& dims,
            bool keepdim) {
  detail::check_defined(a, "linalg.norm");
  KILN_CHECK(dims.size() <= 2, "linalg.norm: dims must name one or two dimensions, got ",
             dims.size());
  if (dims.size() == 2 || (dims.empty() && ord && a.dim() == 2)) {
    const std::vector<int64_t> matrix = dims.empty() ? std::vector<int64_t>{-2, -1} : dims;
    return ord ? matrix_norm(a, ord->to_double(), matrix, keepdim)
               : matrix_norm(a, "fro", matrix, keepdim);
  }
  KILN_CHECK(!dims.empty() || !ord || a.dim() == 1,
             "linalg.norm: an ord without dims needs a 1-D or 2-D A, got ", describe(a));
  return vector_norm(a, ord.value_or(2), dims, keepdim);
}

Tensor norm(const Tensor& a, const std::string& ord, const std::vector<int64_t>& dims,
            bool keepdim) {
  detail::check_defined(a, "linalg.norm");
  KILN_CHECK(!dims.empty() || a.dim() == 2, "linalg.norm: ord \"", ord,
             "\" without dims needs a 2-D A, got ", describe(a));
  return matrix_norm(a, ord, dims.empty() ? std::vector<int64_t>{-2, -1} : dims, keepdim);
}

Tensor cross(const Tensor& a, const Tensor& b, int64_t dim) {
  const char* op = "linalg.cross";
  detail::check_defined(a, op, "a");
  detail::check_defined(b, op, "b");
  KILN_CHECK(a.dim() == b.dim(), op, ": a and b must have the same number of dimensions, got ",
             describe(a), " and ", describe(b));
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected a and b of one dtype, got ", describe(a),
             " and ", describe(b));
  const int64_t d = detail::wrap_dim(dim, a.dim(), op, &a);
  KILN_CHECK(a.size(d) == 3 && b.size(d) == 3, op, ": dim ", dim,
             " must have size 3 in a and b, got ", describe(a), " and ", describe(b));
  // c_i = a_(i+1) b_(i+2) - a_(i+2) b_(i+1), indices mod 3.
  auto shifted = [d](const Tensor& t, int64_t by) { return roll(t, {-by}, {d}); };
  return shifted(a, 1) * shifted(b, 2) - shifted(a, 2) * shifted(b, 1);
}

}  // namespace kiln::linalg

namespace kiln {

Tensor cholesky_solve(const Tensor& B, const Tensor& L, bool upper) {
  const char* op = "cholesky_solve";
  linalg::check_floating_matrix(B, op, "B");
  linalg::check_floating_matrix(L, op, "L");
  KILN_CHECK(L.size(-1) == L.size(-2) && L.size(-1) == B.size(-2), op,
             ": expected a square factor L [..., n, n] and B [..., n, k], got L ",
             detail::describe(L), " and B ", detail::describe(B));
  // A = L L^T: L Y = B, then L^T X = Y (A = U^T U: U^T Y = B, then U X = Y).
  const Tensor first = upper ? L.transpose(-2, -1) : L;
  const Tensor y = linalg::solve_triangular(first, B, false);
  return linalg::solve_triangular(first.transpose(-2, -1), y, true);
}

}  // namespace kiln
