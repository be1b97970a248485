// Matrix functions with libtorch's names and semantics: linalg::solve, solve_triangular, inv,
// det, slogdet, cholesky, eigh, eigvalsh, qr, svd, svdvals, and torch's inverse, det, logdet,
// slogdet and cholesky. float32 and float64, over the last two dims, batched over the leading ones.
//
// Ops of the table run Debian's LAPACK (through LAPACKE) and BLAS's triangular solve, a batch's
// matrices spread over the thread pool (for_each_matrix): "linalg_solve" and "linalg_inv" (LU with
// partial pivoting: getrf, getrs), "solve_triangular" (trsm), "det" and "slogdet" (getrf),
// "cholesky" (potrf), "eigh" (syevd), "qr" (geqrf, orgqr), "svd" (gesdd), and "cofactor" (gesvd),
// det's gradient.
// A CUDA tensor's matrices go through the host. A singular matrix (solve, inv) or one that is not
// positive-definite (cholesky) raises: at the call outside jit::trace, even in lazy mode, and on
// every replay of a trace that meets one. The gradients are torch's formulas composed of these ops
// and matmul, so they record, trace, replay and differentiate again.
#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/broadcast.h"
#include "lib/cuda_tensor.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {

// The double or the float one of a pair of LAPACK (or BLAS) routines.
template <typename T, typename D, typename S>
constexpr auto routine(D* for_double, S* for_float) {
  if constexpr (std::is_same_v<T, double>)
    return for_double;
  else
    return for_float;
}

// LAPACK and BLAS entry points for element type T (float or double), on row-major matrices.
template <typename T>
struct Lapack {
  static lapack_int getrf(lapack_int n, T* a, lapack_int* pivots) { return getrf(n, n, a, pivots); }
  static lapack_int getrf(lapack_int m, lapack_int n, T* a, lapack_int* pivots) {
    return routine<T>(LAPACKE_dgetrf, LAPACKE_sgetrf)(LAPACK_ROW_MAJOR, m, n, a, n, pivots);
  }
  static lapack_int getrs(lapack_int n, lapack_int k, const T* lu, const lapack_int* pivots, T* b) {
    return routine<T>(LAPACKE_dgetrs, LAPACKE_sgetrs)(LAPACK_ROW_MAJOR, 'N', n, k, lu, n, pivots, b,
                                                      k);
  }
  static lapack_int potrf(char uplo, lapack_int n, T* a) {
    return routine<T>(LAPACKE_dpotrf, LAPACKE_spotrf)(LAPACK_ROW_MAJOR, uplo, n, a, n);
  }
  static lapack_int gesvd(lapack_int n, T* a, T* s, T* u, T* vt, T* work) {
    return routine<T>(LAPACKE_dgesvd, LAPACKE_sgesvd)(LAPACK_ROW_MAJOR, 'A', 'A', n, n, a, n, s, u,
                                                      n, vt, n, work);
  }
  // Row-major m x n a (overwritten); jobz 'A' (u m x m, vt n x n), 'S' (k columns and rows) or
  // 'N' (s alone).
  static lapack_int gesdd(char jobz, lapack_int m, lapack_int n, T* a, T* s, T* u, lapack_int ldu,
                          T* vt, lapack_int ldvt) {
    return routine<T>(LAPACKE_dgesdd, LAPACKE_sgesdd)(LAPACK_ROW_MAJOR, jobz, m, n, a, n, s, u, ldu,
                                                      vt, ldvt);
  }
  static lapack_int geqrf(lapack_int m, lapack_int n, T* a, T* tau) {
    return routine<T>(LAPACKE_dgeqrf, LAPACKE_sgeqrf)(LAPACK_ROW_MAJOR, m, n, a, n, tau);
  }
  static lapack_int orgqr(lapack_int m, lapack_int n, lapack_int k, T* q, const T* tau) {
    return routine<T>(LAPACKE_dorgqr, LAPACKE_sorgqr)(LAPACK_ROW_MAJOR, m, n, k, q, n, tau);
  }
  static lapack_int syevd(char uplo, lapack_int n, T* a, T* w) {
    return routine<T>(LAPACKE_dsyevd, LAPACKE_ssyevd)(LAPACK_ROW_MAJOR, 'V', uplo, n, a, n, w);
  }
  static void trsm(CBLAS_SIDE side, CBLAS_UPLO uplo, CBLAS_DIAG diag, int rows, int cols,
                   const T* a, int n, T* b) {
    routine<T>(cblas_dtrsm, cblas_strsm)(CblasRowMajor, side, uplo, CblasNoTrans, diag, rows, cols,
                                         T(1), a, n, b, cols);
  }
};

// LAPACKE checks its inputs for NaN by default and refuses them; kiln's matrix functions let NaN
// propagate as torch's do. Called before every LAPACKE call (after the first, a static's check).
void disable_nan_checks() {
  static const bool done = (LAPACKE_set_nancheck(0), true);
  (void)done;
}

// Raises for what LAPACKE reports as its own failure (an argument it rejected, memory it could not
// get); a positive info is the caller's to interpret.
void check_lapack(lapack_int info, const char* op, const char* routine) {
  KILN_CHECK(info != LAPACK_WORK_MEMORY_ERROR && info != LAPACK_TRANSPOSE_MEMORY_ERROR, op,
             ": out of memory in LAPACK's ", routine);
  KILN_CHECK(info >= 0, op, ": LAPACK's ", routine, " rejected argument ", -info,
             " (an internal error of kiln)");
}

// Square matrices (n x n) of a batch of `shape`: their count and size (checked by check_matrix
// to fit LAPACK's 32-bit sizes).
struct Batch {
  int64_t count = 0;
  lapack_int n = 0;
};

Batch batch_of(const Shape& shape) {
  const int64_t n = shape.back();
  const int64_t count = n == 0 ? 0 : detail::shape_numel(shape) / (n * n);
  return {count, static_cast<lapack_int>(n)};
}

// `a` broadcast to `shape`, in a fresh contiguous host tensor for LAPACK to overwrite.
Tensor host_copy(const Tensor& a, const Shape& shape) {
  const Tensor host = a.device().is_cpu() ? a : detail::copy_to_device(a, kCPU);
  return host.expand(shape).clone();
}

// A host result moved to the device of `like`.
Tensor on_device_of(const Tensor& out, const Tensor& like) {
  return like.device().is_cpu() ? out : detail::copy_to_device(out, like.device());
}

// Runs f with T the C++ type of a float32 or float64 dtype.
template <typename F>
void float_dispatch(DType dtype, F&& f) {
  if (dtype == kFloat64)
    f(double{});
  else
    f(float{});
}

// Shape without its last `k` dims.
Shape leading(const Shape& s, size_t k) {
  return Shape(s.begin(), s.end() - static_cast<long>(k));
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

Tensor mT(const Tensor& t) {
  return t.transpose(-2, -1);
}

// x's trailing two size-1 dims added: a per-matrix scalar that broadcasts over its matrix.
Tensor per_matrix(const Tensor& x) {
  return x.unsqueeze(-1).unsqueeze(-1);
}

// ------------------------------------------------------------------------------------- kernels

// Autograd and recording off while a kernel runs: the ops it builds its result with run at once.
struct KernelScope {
  AutoGradMode no_grad{false};
  detail::RecordingOff recording_off;
};

// The first matrix (in batch order) for which LAPACK reported a nonzero info, or none.
struct Failure {
  int64_t matrix = -1;
  lapack_int info = 0;
};

// Runs one(m), LAPACK's info for matrix m, over `count` matrices of n x n on the thread pool
// (matrices are independent; small ones go several to a thread). one must not throw: everything it
// needs is allocated before. Returns the first failure in batch order, so that an error names the
// same matrix whatever the threads, after raising for LAPACKE's own errors.
template <typename F>
Failure for_each_matrix(int64_t count, lapack_int n, const char* op, const char* routine,
                        const F& one) {
  std::vector<lapack_int> infos(static_cast<size_t>(count), 0);
  const int64_t work = std::max<int64_t>(int64_t{n} * n * n, 1);
  detail::parallel_for(count, std::max<int64_t>(detail::kParallelGrain / work, 1),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t m = begin; m < end; ++m)
                           infos[static_cast<size_t>(m)] = one(m);
                       });
  for (int64_t m = 0; m < count; ++m) {
    const lapack_int info = infos[static_cast<size_t>(m)];
    if (info == 0) continue;
    check_lapack(info, op, routine);
    return {m, info};
  }
  return {};
}

// Solves A X = B in place of x (batch x n x k) with the LU of each of lu's matrices (batch x n x n,
// overwritten). A matrix whose LU has a zero pivot raises: it is singular.
template <typename T>
void lu_solve(Tensor& lu, Tensor& x, const char* op, const Tensor& input) {
  const Batch batch = batch_of(lu.sizes());
  const auto k = static_cast<lapack_int>(x.size(-1));
  const int64_t size = int64_t{batch.n} * batch.n;
  std::vector<lapack_int> pivots(static_cast<size_t>(batch.count * batch.n));
  T* factors = lu.data_ptr<T>();
  T* solutions = x.data_ptr<T>();
  const Failure f = for_each_matrix(batch.count, batch.n, op, "getrf", [&](int64_t m) {
    T* matrix = factors + m * size;
    lapack_int* p = pivots.data() + m * batch.n;
    const lapack_int info = Lapack<T>::getrf(batch.n, matrix, p);
    if (info != 0 || k == 0) return info;
    const lapack_int solved = Lapack<T>::getrs(batch.n, k, matrix, p, solutions + m * batch.n * k);
    return solved < 0 ? solved : 0;  // getrs fails only on arguments (as getrf did not)
  });
  KILN_CHECK(f.matrix < 0, op, ": matrix ", f.matrix, " of ", describe(input),
             " is singular (pivot ", f.info - 1, " of its LU factorization is zero)");
}

Tensor solve_kernel(const Tensor& a, const Tensor& b, const Shape& batch_shape) {
  const int64_t n = a.size(-1);
  Tensor lu = host_copy(a, with_matrix(batch_shape, n, n));
  Tensor x = host_copy(b, with_matrix(batch_shape, n, b.size(-1)));
  disable_nan_checks();
  float_dispatch(a.dtype(), [&](auto t) { lu_solve<decltype(t)>(lu, x, "linalg.solve", a); });
  return on_device_of(x, a);
}

Tensor inv_kernel(const Tensor& a) {
  Tensor lu = host_copy(a, a.sizes());
  const Tensor identity = eye(a.size(-1), TensorOptions(a.dtype()));
  Tensor x = identity.expand(a.sizes()).clone();
  disable_nan_checks();
  float_dispatch(a.dtype(), [&](auto t) { lu_solve<decltype(t)>(lu, x, "linalg.inv", a); });
  return on_device_of(x, a);
}

// X with A X = B (left) or X A = B, A triangular: BLAS's trsm reads only A's triangle (and not its
// diagonal when unit), and divides by a zero diagonal element as IEEE arithmetic does (no error,
// as torch's).
Tensor solve_triangular_kernel(const Tensor& a, const Tensor& b, const Shape& batch_shape,
                               bool upper, bool left, bool unitriangular) {
  const char* op = "linalg.solve_triangular";
  const int64_t n = a.size(-1);
  const Tensor tri = host_copy(a, with_matrix(batch_shape, n, n));
  Tensor x = host_copy(b, with_matrix(batch_shape, b.size(-2), b.size(-1)));
  const Batch batch = batch_of(tri.sizes());
  const auto rows = static_cast<int>(x.size(-2)), cols = static_cast<int>(x.size(-1));
  if (rows == 0 || cols == 0) return on_device_of(x, a);
  float_dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* triangles = tri.data_ptr<T>();
    T* solutions = x.data_ptr<T>();
    for_each_matrix(batch.count, batch.n, op, "trsm", [&](int64_t m) {
      Lapack<T>::trsm(left ? CblasLeft : CblasRight, upper ? CblasUpper : CblasLower,
                      unitriangular ? CblasUnit : CblasNonUnit, rows, cols,
                      triangles + m * batch.n * batch.n, batch.n, solutions + m * rows * cols);
      return lapack_int{0};
    });
  });
  return on_device_of(x, a);
}

// The determinant of one matrix from its LU (getrf, the matrix overwritten): the product of U's
// diagonal and the row permutation's sign, and, for slogdet, the sign and log of |det| accumulated
// factor by factor so that they neither overflow nor underflow. A zero pivot gives det 0.
template <typename T>
struct LuDet {
  T det = 1, sign = 1, logabs = 0;
};

template <typename T>
lapack_int lu_det(T* matrix, lapack_int n, lapack_int* pivots, LuDet<T>& r) {
  r = {};
  const lapack_int info = Lapack<T>::getrf(n, matrix, pivots);
  if (info < 0) return info;
  for (lapack_int i = 0; i < n; ++i) {
    const T u = matrix[i * n + i];
    const T flip = pivots[i] != i + 1 ? T(-1) : T(1);
    r.det *= u * flip;
    r.sign *= (u > 0 ? T(1) : u < 0 ? T(-1) : u == 0 ? T(0) : u) * flip;  // NaN stays NaN
    r.logabs += std::log(std::abs(u));
  }
  return 0;
}

// det (slogdet false) or (sign, log|det|) of each matrix; an empty matrix has det 1.
std::vector<Tensor> det_kernel(const Tensor& a, bool slogdet) {
  const char* op = slogdet ? "linalg.slogdet" : "linalg.det";
  Tensor lu = host_copy(a, a.sizes());
  const Shape batch_shape = leading(a.sizes(), 2);
  const Batch batch = batch_of(a.sizes());
  // Empty matrices: det 1, sign 1, log|det| 0. Made so, not filled: an in-place write inside
  // jit::trace would make the result unreadable there.
  const TensorOptions options(a.dtype());
  Tensor first = batch.n == 0 ? ones(batch_shape, options) : empty(batch_shape, options);
  Tensor second = batch.n == 0 ? zeros(batch_shape, options) : empty(batch_shape, options);
  disable_nan_checks();
  float_dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    std::vector<lapack_int> pivots(static_cast<size_t>(batch.count * batch.n));
    T* matrices = lu.data_ptr<T>();
    T* firsts = first.data_ptr<T>();
    T* seconds = second.data_ptr<T>();
    for_each_matrix(batch.count, batch.n, op, "getrf", [&](int64_t m) {
      LuDet<T> d;
      const lapack_int info =
          lu_det(matrices + m * batch.n * batch.n, batch.n, pivots.data() + m * batch.n, d);
      firsts[m] = slogdet ? d.sign : d.det;
      seconds[m] = d.logabs;
      return info;
    });
  });
  if (!slogdet) return {on_device_of(first, a)};
  return {on_device_of(first, a), on_device_of(second, a)};
}

// The Cholesky factor of each matrix, read from its lower (upper) triangle; the other triangle of
// the result is zero. A matrix that is not positive-definite (or holds NaN) raises.
Tensor cholesky_kernel(const Tensor& a, bool upper) {
  const char* op = "linalg.cholesky";
  Tensor factor = host_copy(a, a.sizes());
  const Batch batch = batch_of(a.sizes());
  disable_nan_checks();
  Failure f;
  float_dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    T* matrices = factor.data_ptr<T>();
    f = for_each_matrix(batch.count, batch.n, op, "potrf", [&](int64_t m) {
      T* matrix = matrices + m * batch.n * batch.n;
      lapack_int info = Lapack<T>::potrf(upper ? 'U' : 'L', batch.n, matrix);
      // A NaN reaches the diagonal without failing some LAPACKs' test (ajj <= 0): the minor
      // where it first does is not positive-definite either.
      for (lapack_int i = 0; i < batch.n && info == 0; ++i)
        if (!(matrix[i * batch.n + i] > 0)) info = i + 1;
      return info;
    });
  });
  KILN_CHECK(f.matrix < 0, op, ": matrix ", f.matrix, " of ", describe(a),
             " is not positive-definite (its leading minor of order ", f.info,
             " is not positive-definite)");
  return on_device_of(upper ? triu(factor) : tril(factor), a);
}

// One matrix's scratch for cofactor_of: its SVD (u, s, vt, gesvd's work), the products p, and LU
// pivots for det(U) and det(V^T).
template <typename T>
struct SvdScratch {
  std::vector<T> u, vt, s, work, p;
  std::vector<lapack_int> pivots;
  explicit SvdScratch(lapack_int n)
      : u(square(n)),
        vt(square(n)),
        s(size_t(n)),
        work(size_t(n)),
        p(size_t(n)),
        pivots(size_t(n)) {}
  static size_t square(lapack_int n) { return static_cast<size_t>(n) * static_cast<size_t>(n); }
};

// The cofactor matrix C = adj(A)^T of one matrix a (overwritten), d det(A) / dA, from its SVD
// A = U S V^T: adj(A) = det(U) det(V) V diag(p) U^T with p_i the product of the singular values but
// the i-th, exact for singular matrices too (where det(A) A^-T is not defined). A matrix with an
// infinity or NaN gets NaN.
template <typename T>
lapack_int cofactor_of(T* a, T* c, lapack_int n, SvdScratch<T>& w) {
  const size_t nn = SvdScratch<T>::square(n);
  if (!std::all_of(a, a + nn, [](T v) { return std::isfinite(v); })) {
    std::fill(c, c + nn, std::numeric_limits<T>::quiet_NaN());
    return 0;
  }
  const lapack_int info =
      Lapack<T>::gesvd(n, a, w.s.data(), w.u.data(), w.vt.data(), w.work.data());
  if (info != 0) return info;
  // p_i = prod_{j < i} s_j * prod_{j > i} s_j, without dividing by a zero singular value.
  T before = 1, after = 1;
  for (lapack_int i = 0; i < n; ++i) w.p[size_t(i)] = before, before *= w.s[size_t(i)];
  for (lapack_int i = n - 1; i >= 0; --i) w.p[size_t(i)] *= after, after *= w.s[size_t(i)];
  // C = adj(A)^T = det(U) det(V) U diag(p) V^T. The signs of det(U) and det(V^T) come from LUs of
  // copies: in c (written with C afterwards) and in a (no longer needed).
  std::copy(w.u.begin(), w.u.end(), c);
  std::copy(w.vt.begin(), w.vt.end(), a);
  LuDet<T> det_u, det_vt;
  lu_det(c, n, w.pivots.data(), det_u);
  lu_det(a, n, w.pivots.data(), det_vt);
  const T sign = (det_u.det < 0) != (det_vt.det < 0) ? T(-1) : T(1);
  for (lapack_int i = 0; i < n; ++i)
    for (lapack_int j = 0; j < n; ++j) {
      T sum = 0;
      for (lapack_int k = 0; k < n; ++k)
        sum += w.u[size_t(i * n + k)] * w.p[size_t(k)] * w.vt[size_t(k * n + j)];
      c[i * n + j] = sign * sum;
    }
  return 0;
}

Tensor cofactor_kernel(const Tensor& a) {
  const char* op = "linalg.det (gradient)";
  Tensor work = host_copy(a, a.sizes());
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype()));
  const Batch batch = batch_of(a.sizes());
  disable_nan_checks();
  Failure f;
  float_dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    std::vector<SvdScratch<T>> scratch(static_cast<size_t>(batch.count), SvdScratch<T>(batch.n));
    const int64_t size = int64_t{batch.n} * batch.n;
    T* matrices = work.data_ptr<T>();
    T* cofactors = out.data_ptr<T>();
    f = for_each_matrix(batch.count, batch.n, op, "gesvd", [&](int64_t m) {
      return cofactor_of(matrices + m * size, cofactors + m * size, batch.n,
                         scratch[static_cast<size_t>(m)]);
    });
  });
  KILN_CHECK(f.matrix < 0, op, ": the singular value decomposition of matrix ", f.matrix, " of ",
             describe(a), " did not converge");
  return on_device_of(out, a);
}

// The eigenvalues (ascending) and eigenvectors (columns) of each symmetric matrix, read from its
// lower (upper) triangle by LAPACK's syevd. A matrix whose triangle holds an infinity or NaN gets
// NaN (LAPACK's iterations are not meant for them); one for which syevd does not converge raises.
std::vector<Tensor> eigh_kernel(const Tensor& a, bool upper) {
  const char* op = "linalg.eigh";
  Tensor vectors = host_copy(a, a.sizes());
  Tensor values = empty(leading(a.sizes(), 1), TensorOptions(a.dtype()));
  const Batch batch = batch_of(a.sizes());
  disable_nan_checks();
  Failure f;
  float_dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    T* matrices = vectors.data_ptr<T>();
    T* eigenvalues = values.data_ptr<T>();
    const lapack_int n = batch.n;
    f = for_each_matrix(batch.count, n, op, "syevd", [&](int64_t m) {
      T* matrix = matrices + m * n * n;
      bool finite = true;
      for (lapack_int i = 0; i < n; ++i)
        for (lapack_int j = upper ? i : 0; j <= (upper ? n - 1 : i); ++j)
          finite = finite && std::isfinite(matrix[i * n + j]);
      if (!finite) {
        std::fill(matrix, matrix + n * n, std::numeric_limits<T>::quiet_NaN());
        std::fill(eigenvalues + m * n, eigenvalues + (m + 1) * n,
                  std::numeric_limits<T>::quiet_NaN());
        return lapack_int{0};
      }
      return Lapack<T>::syevd(upper ? 'U' : 'L', n, matrix, eigenvalues + m * n);
    });
  });
  KILN_CHECK(f.matrix < 0, op, ": the eigenvalue algorithm did not converge for matrix ", f.matrix,
             " of ", describe(a), " (LAPACK's syevd: ", f.info, ")");
  return {on_device_of(values, a), on_device_of(vectors, a)};
}

// Q and R of each m x n matrix by Householder reflections (geqrf, then orgqr forms Q): Q is
// m x k and R k x n with k = min(m, n), or (complete) Q m x m and R m x n. Without Q (mode "r"),
// Q is an empty tensor.
std::vector<Tensor> qr_kernel(const Tensor& a, const std::string& mode) {
  const char* op = "linalg.qr";
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const bool complete = mode == "complete";
  const int64_t q_cols = complete ? m : k, r_rows = complete ? m : k;
  Tensor factors = host_copy(a, a.sizes());
  const Shape batch_shape = leading(a.sizes(), 2);
  const int64_t count = detail::shape_numel(batch_shape);
  Tensor q = zeros(with_matrix(batch_shape, m, q_cols), TensorOptions(a.dtype()));
  disable_nan_checks();
  const bool without_q = mode == "r";
  if (k > 0)
    float_dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      std::vector<T> tau(static_cast<size_t>(count * k));
      T* matrices = factors.data_ptr<T>();
      T* qs = q.data_ptr<T>();
      const auto lm = static_cast<lapack_int>(m), ln = static_cast<lapack_int>(n);
      const auto lk = static_cast<lapack_int>(k), lq = static_cast<lapack_int>(q_cols);
      // geqrf and orgqr fail only on their arguments: for_each_matrix raises for that.
      for_each_matrix(count, static_cast<lapack_int>(std::max(m, n)), op, "geqrf", [&](int64_t b) {
        T* matrix = matrices + b * m * n;
        T* reflectors = tau.data() + b * k;
        const lapack_int info = Lapack<T>::geqrf(lm, ln, matrix, reflectors);
        if (info != 0 || without_q) return info;
        // The reflectors (below R's diagonal) in Q's first columns, for orgqr to expand.
        T* qb = qs + b * m * q_cols;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < std::min(n, q_cols); ++j) qb[i * q_cols + j] = matrix[i * n + j];
        return Lapack<T>::orgqr(lm, lq, lk, qb, reflectors);
      });
    });
  else if (complete)
    q = eye(m, TensorOptions(a.dtype())).expand(q.sizes()).clone();
  const Tensor r = triu(factors.narrow(-2, 0, r_rows)).contiguous();
  if (without_q) return {on_device_of(empty({0}, TensorOptions(a.dtype())), a), on_device_of(r, a)};
  return {on_device_of(q, a), on_device_of(r, a)};
}

// LU (m x n) and pivots (int32 [..., k], k = min(m, n)) of each m x n matrix by partial pivoting
// (getrf). With check_singular a matrix whose U has a zero on its diagonal raises, as torch's
// linalg.lu_factor.
std::vector<Tensor> lu_factor_kernel(const Tensor& a, bool check_singular) {
  static_assert(sizeof(lapack_int) == sizeof(int32_t), "pivots are stored as int32");
  const char* op = check_singular ? "linalg.lu_factor" : "linalg.lu";
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  Tensor factors = host_copy(a, a.sizes());
  const Shape batch_shape = leading(a.sizes(), 2);
  const int64_t count = detail::shape_numel(batch_shape);
  Shape pivots_shape = batch_shape;
  pivots_shape.push_back(k);
  Tensor pivots = zeros(pivots_shape, TensorOptions(kInt32));
  disable_nan_checks();
  Failure failure;
  if (k > 0)
    float_dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      T* matrices = factors.data_ptr<T>();
      auto* rows = reinterpret_cast<lapack_int*>(pivots.data_ptr<int32_t>());
      const auto lm = static_cast<lapack_int>(m), ln = static_cast<lapack_int>(n);
      failure = for_each_matrix(
          count, static_cast<lapack_int>(std::max(m, n)), op, "getrf",
          [&](int64_t b) { return Lapack<T>::getrf(lm, ln, matrices + b * m * n, rows + b * k); });
    });
  KILN_CHECK(!check_singular || failure.matrix < 0, op, ": U[", failure.info, ",", failure.info,
             "] of matrix ", failure.matrix, " of A ", describe(a),
             " is zero, so solving with it would divide by zero; linalg::lu factors A without "
             "this check");
  return {on_device_of(factors, a), on_device_of(pivots, a)};
}

// The row permutation of each matrix's pivots (LAPACK's 1-based interchanges, applied in order):
// int64 [..., rows] with row i of L U being row perm[i] of A. Pivots out of [1, rows] raise.
Tensor lu_permutation_kernel(const Tensor& pivots_in, int64_t rows) {
  const char* op = "lu_unpack";
  const Tensor pivots = host_copy(pivots_in, pivots_in.sizes());
  const int64_t k = pivots.size(-1);
  Shape shape = leading(pivots.sizes(), 1);
  const int64_t count = detail::shape_numel(shape);
  shape.push_back(rows);
  Tensor perm = empty(shape, TensorOptions(kInt64));
  const int32_t* swaps = pivots.data_ptr<int32_t>();
  int64_t* order = perm.data_ptr<int64_t>();
  for (int64_t b = 0; b < count; ++b) {
    int64_t* p = order + b * rows;
    for (int64_t i = 0; i < rows; ++i) p[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t with = int64_t{swaps[b * k + i]} - 1;
      KILN_CHECK(with >= i && with < rows, op, ": pivot ", with + 1, " at position ", i,
                 " of matrix ", b, " is out of range [", i + 1, ", ", rows, "] (pivots ",
                 describe(pivots_in), ")");
      std::swap(p[i], p[with]);
    }
  }
  return on_device_of(perm, pivots_in);
}

// U, S and V^T of each m x n matrix by LAPACK's divide and conquer (gesdd): U m x m and V^T n x n
// with full_matrices, otherwise m x k and k x n (k = min(m, n)); S alone (U and V^T empty)
// without compute_uv. A matrix holding an infinity or NaN raises: gesdd cannot converge on it.
std::vector<Tensor> svd_kernel(const Tensor& a, bool full_matrices, bool compute_uv) {
  constexpr lapack_int kNotFinite = std::numeric_limits<lapack_int>::max();  // not LAPACK's
  const char* op = compute_uv ? "linalg.svd" : "linalg.svdvals";
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const int64_t u_cols = full_matrices ? m : k, vt_rows = full_matrices ? n : k;
  const Shape batch_shape = leading(a.sizes(), 2);
  const int64_t count = detail::shape_numel(batch_shape);
  const TensorOptions options(a.dtype());
  Tensor work = host_copy(a, a.sizes());
  Shape s_shape = batch_shape;
  s_shape.push_back(k);
  Tensor s = empty(s_shape, options);
  Tensor u = compute_uv ? empty(with_matrix(batch_shape, m, u_cols), options) : empty({0}, options);
  Tensor vt =
      compute_uv ? empty(with_matrix(batch_shape, vt_rows, n), options) : empty({0}, options);
  if (k == 0 && compute_uv) {  // nothing to decompose: the identity's columns, if any
    u = eye(m, u_cols, options).expand(u.sizes()).clone();
    vt = eye(vt_rows, n, options).expand(vt.sizes()).clone();
  }
  disable_nan_checks();
  Failure f;
  if (k > 0)
    float_dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      T* matrices = work.data_ptr<T>();
      T* values = s.data_ptr<T>();
      T* us = compute_uv ? u.data_ptr<T>() : nullptr;
      T* vts = compute_uv ? vt.data_ptr<T>() : nullptr;
      const char jobz = !compute_uv ? 'N' : full_matrices ? 'A' : 'S';
      const auto lm = static_cast<lapack_int>(m), ln = static_cast<lapack_int>(n);
      // Leading dimensions LAPACKE accepts for every jobz (unused without U and V^T).
      const auto ldu = static_cast<lapack_int>(compute_uv ? u_cols : m);
      f = for_each_matrix(
          count, static_cast<lapack_int>(std::max(m, n)), op, "gesdd", [&](int64_t b) {
            T* matrix = matrices + b * m * n;
            if (!std::all_of(matrix, matrix + m * n, [](T v) { return std::isfinite(v); }))
              return kNotFinite;
            return Lapack<T>::gesdd(jobz, lm, ln, matrix, values + b * k,
                                    compute_uv ? us + b * m * u_cols : nullptr, ldu,
                                    compute_uv ? vts + b * vt_rows * n : nullptr, ln);
          });
    });
  KILN_CHECK(f.info != kNotFinite, op, ": matrix ", f.matrix, " of ", describe(a),
             " holds an infinity or NaN, on which the algorithm cannot converge");
  KILN_CHECK(f.matrix < 0, op, ": the algorithm did not converge for matrix ", f.matrix, " of ",
             describe(a), " (LAPACK's gesdd: ", f.info, ")");
  return {on_device_of(u, a), on_device_of(s, a), on_device_of(vt, a)};
}

// ------------------------------------------------------------------------------ checks, nodes

void check_matrix(const char* op, const Tensor& a, const char* name) {
  detail::check_defined(a, op, name);
  KILN_CHECK(a.dim() >= 2, op, ": ", name, " must have at least 2 dimensions, got ", describe(a));
  KILN_CHECK(a.dtype() == kFloat32 || a.dtype() == kFloat64, op,
             ": expected a float32 or float64 tensor, got ", name, " ", describe(a));
  // LAPACK and BLAS index a matrix with 32-bit ints; checked before anything is copied.
  KILN_CHECK(a.size(-2) * a.size(-1) <= std::numeric_limits<lapack_int>::max(), op, ": ", name, " ",
             describe(a), " has matrices of more elements than LAPACK's 32-bit sizes allow");
}

void check_square(const char* op, const Tensor& a) {
  check_matrix(op, a, "A");
  KILN_CHECK(a.size(-1) == a.size(-2), op, ": A must be batches of square matrices, got ",
             describe(a));
}

// A and B of one dtype on one device; returns their broadcast batch shape.
Shape check_pair(const char* op, const Tensor& a, const Tensor& b) {
  check_matrix(op, b, "B");
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected A and B of one dtype, got A ", describe(a),
             " and B ", describe(b));
  KILN_CHECK(a.device() == b.device(), op, ": expected A and B on one device, got A on ",
             a.device(), " and B on ", b.device());
  try {
    return detail::broadcast_shapes(leading(a.sizes(), 2), leading(b.sizes(), 2), op);
  } catch (const Error& e) {  // the batch dims' message, completed with the operands whole
    KILN_FAIL(e.what(), " (the batch dims of A ", describe(a), " and B ", describe(b), ")");
  }
}

detail::OpHandle solve_def, inv_def, solve_triangular_def, det_def, slogdet_def, cholesky_def,
    cofactor_def, eigh_def, qr_def, svd_def, lu_factor_def, lu_permutation_def;

// Whether a call that may raise on its operands' values records: only while jit::trace records,
// so that otherwise a singular or indefinite matrix raises at the call, as in eager mode (its
// pending operands are computed first). A replay that meets one raises.
bool records_checked(const std::vector<Tensor>& in) {
  return detail::trace_mode() && detail::should_record(in);
}

Tensor cofactor(const Tensor& a);

// X with A X = B, B a batch of matrices (checked).
Tensor solve_node(const Tensor& a, const Tensor& b) {
  const Shape batch_shape = check_pair("linalg.solve", a, b);
  Tensor out;
  if (records_checked({a, b})) {
    out = detail::lazy_record1(solve_def, {a, b}, {},
                               {with_matrix(batch_shape, a.size(-1), b.size(-1)), a.dtype()});
  } else {
    const KernelScope kernel;
    out = solve_kernel(a, b, batch_shape);
  }
  if (detail::needs_grad(a, b))
    // B's values are not needed (only its shape): writing to B after the call is allowed.
    detail::record("linalg.solve", {a, b}, {out}, {a, out},
                   [b_shape = b.sizes()](const detail::BackwardContext& c) {
                     // torch's: gB = A^-T g, gA = -gB X^T, each summed over the batch dims it
                     // broadcast.
                     const Tensor &a = c.saved(0), &x = c.saved(1);
                     const Tensor gb = solve_node(mT(a), c.grad());
                     return std::vector<Tensor>{
                         c.needs_grad(0) ? sum_to_size(-matmul(gb, mT(x)), a.sizes()) : Tensor(),
                         sum_to_size(gb, b_shape)};
                   });
  return out;
}

Tensor solve_triangular_node(const Tensor& a, const Tensor& b, bool upper, bool left,
                             bool unitriangular) {
  const Shape batch_shape = check_pair("linalg.solve_triangular", a, b);
  Tensor out;
  if (detail::should_record(a, b)) {
    out = detail::lazy_record1(solve_triangular_def, {a, b}, {upper, left, unitriangular},
                               {with_matrix(batch_shape, b.size(-2), b.size(-1)), a.dtype()});
  } else {
    const KernelScope kernel;
    out = solve_triangular_kernel(a, b, batch_shape, upper, left, unitriangular);
  }
  if (detail::needs_grad(a, b))
    detail::record(
        "linalg.solve_triangular", {a, b}, {out}, {a, out},
        [upper, left, unitriangular, b_shape = b.sizes()](const detail::BackwardContext& c) {
          // torch's: gB solves A^T's system; gA = -gB X^T (left) or -X^T gB, on A's triangle.
          const Tensor &a = c.saved(0), &x = c.saved(1);
          const Tensor gb = solve_triangular_node(mT(a), c.grad(), !upper, left, unitriangular);
          Tensor ga;
          if (c.needs_grad(0)) {
            ga = left ? -matmul(gb, mT(x)) : -matmul(mT(x), gb);
            ga = upper ? triu(ga, unitriangular ? 1 : 0) : tril(ga, unitriangular ? -1 : 0);
            ga = sum_to_size(ga, a.sizes());
          }
          return std::vector<Tensor>{ga, sum_to_size(gb, b_shape)};
        });
  return out;
}

// The det of each matrix (slogdet false), or its sign and log|det|.
std::vector<Tensor> det_node(const Tensor& a, bool slogdet) {
  const Shape batch_shape = leading(a.sizes(), 2);
  std::vector<Tensor> out;
  if (detail::should_record(a)) {
    std::vector<detail::LazyType> types(slogdet ? 2 : 1, {batch_shape, a.dtype()});
    out = detail::lazy_record(slogdet ? slogdet_def : det_def, {a}, {}, std::move(types));
  } else {
    const KernelScope kernel;
    out = det_kernel(a, slogdet);
  }
  if (!detail::needs_grad(a)) return out;
  if (slogdet) {
    // Only log|det| is differentiable: g A^-T (a singular A raises, as inv does).
    detail::record("linalg.slogdet", {a}, {out[1]}, {a}, [](const detail::BackwardContext& c) {
      return std::vector<Tensor>{per_matrix(c.grad()) * mT(linalg::inv(c.saved(0)))};
    });
  } else {
    detail::record("linalg.det", {a}, {out[0]}, {a}, [](const detail::BackwardContext& c) {
      return std::vector<Tensor>{per_matrix(c.grad()) * cofactor(c.saved(0))};
    });
  }
  return out;
}

// det's gradient: the cofactor matrix det(A) A^-T, also of singular matrices. Its own gradient
// (det's second derivative) is that of det(A) A^-T, defined where A is invertible: at a singular
// matrix, inv raises.
Tensor cofactor(const Tensor& a) {
  Tensor out;
  if (detail::should_record(a)) {
    out = detail::lazy_record1(cofactor_def, {a}, {}, {a.sizes(), a.dtype()});
  } else {
    const KernelScope kernel;
    out = cofactor_kernel(a);
  }
  if (detail::needs_grad(a))
    detail::record("cofactor", {a}, {out}, {a}, [](const detail::BackwardContext& c) {
      // C = det A^-T: dC = det (tr(A^-1 dA) A^-T - A^-T dA^T A^-T), so
      // gA = det (<G, A^-T> A^-T - A^-T G^T A^-T).
      const Tensor& a = c.saved(0);
      const Tensor& g = c.grad();
      const Tensor inv_t = mT(linalg::inv(a));
      const Tensor inner = sum(g * inv_t, {-2, -1}, true);
      return std::vector<Tensor>{per_matrix(linalg::det(a)) *
                                 (inner * inv_t - matmul(matmul(inv_t, mT(g)), inv_t))};
    });
  return out;
}
// The eigenvalues and eigenvectors of symmetric matrices (A checked), with torch's gradient:
// gA = V (diag(gL) + skew(V^T gV) / E) V^T with E_ij = L_j - L_i, symmetric (a repeated
// eigenvalue divides by zero, as in torch).
std::vector<Tensor> eigh_node(const Tensor& a, bool upper) {
  std::vector<Tensor> out;
  if (detail::should_record(a)) {
    out = detail::lazy_record(eigh_def, {a}, {upper},
                              {{leading(a.sizes(), 1), a.dtype()}, {a.sizes(), a.dtype()}});
  } else {
    const KernelScope kernel;
    out = eigh_kernel(a, upper);
  }
  if (detail::needs_grad(a))
    detail::record("linalg.eigh", {a}, out, out, [](const detail::BackwardContext& c) {
      const Tensor &values = c.saved(0), &vectors = c.saved(1);
      const Tensor &g_values = c.grad(0), &g_vectors = c.grad(1);
      const Tensor identity =
          eye(values.size(-1), TensorOptions(values.dtype()).device(values.device()));
      Tensor inner = zeros_like(vectors);
      if (g_vectors.defined()) {
        const Tensor vtg = matmul(mT(vectors), g_vectors);
        // E_ij = L_j - L_i, 1 on the diagonal (which diag(gL) fills).
        const Tensor diagonal = ne(identity, 0);
        const Tensor gaps = masked_fill(values.unsqueeze(-2) - values.unsqueeze(-1), diagonal, 1);
        inner = masked_fill(0.5 * (vtg - mT(vtg)) / gaps, diagonal, 0);
      }
      if (g_values.defined()) inner = inner + g_values.unsqueeze(-1) * identity;
      return std::vector<Tensor>{matmul(matmul(vectors, inner), mT(vectors))};
    });
  return out;
}
// The gradient of A = Q R for m >= n (Q m x n, R n x n): with M = R gR^T - gQ^T Q,
// gA = (gQ + Q copyltu(M)) R^-T, copyltu(M) M's lower triangle mirrored onto its upper.
Tensor qr_backward_tall(const Tensor& gq, const Tensor& gr, const Tensor& q, const Tensor& r) {
  const Tensor m = matmul(r, mT(gr)) - matmul(mT(gq), q);
  const Tensor b = gq + matmul(q, tril(m) + mT(tril(m, -1)));
  return solve_triangular_node(mT(r), b, false, false, false);
}

// Q and R (mode "reduced", "complete" or "r"), with torch's gradient: of the reduced form, and of
// the complete one when m <= n (where it is the same); a wide A = [X | Y] differentiates through
// X's square QR.
std::vector<Tensor> qr_node(const Tensor& a, const std::string& mode) {
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const Shape batch = leading(a.sizes(), 2);
  std::vector<Tensor> out;
  if (detail::should_record(a)) {
    const bool complete = mode == "complete";
    const Shape q_shape = mode == "r" ? Shape{0} : with_matrix(batch, m, complete ? m : k);
    out = detail::lazy_record(
        qr_def, {a}, {mode},
        {{q_shape, a.dtype()}, {with_matrix(batch, complete ? m : k, n), a.dtype()}});
  } else {
    const KernelScope kernel;
    out = qr_kernel(a, mode);
  }
  if (detail::needs_grad(a))
    detail::record(
        "linalg.qr", {a}, out, {a, out[0], out[1]}, [mode](const detail::BackwardContext& c) {
          const Tensor &a = c.saved(0), &q = c.saved(1), &r = c.saved(2);
          const int64_t m = a.size(-2), n = a.size(-1);
          KILN_CHECK(mode != "r",
                     "linalg.qr: the gradient needs Q, which mode \"r\" does not compute; "
                     "use mode \"reduced\" to differentiate");
          KILN_CHECK(mode != "complete" || m <= n,
                     "linalg.qr: the decomposition is not differentiable "
                     "with mode \"complete\" when A has more rows than columns, got ",
                     describe(a));
          const Tensor gq = c.grad(0).defined() ? c.grad(0) : zeros_like(q);
          const Tensor gr = c.grad(1).defined() ? c.grad(1) : zeros_like(r);
          if (m >= n) return std::vector<Tensor>{qr_backward_tall(gq, gr, q, r)};
          // A = [X | Y] with X = Q U square and Y = Q V.
          const Tensor y = a.narrow(-1, m, n - m), gv = gr.narrow(-1, m, n - m);
          const Tensor gx =
              qr_backward_tall(gq + matmul(y, mT(gv)), gr.narrow(-1, 0, m), q, r.narrow(-1, 0, m));
          return std::vector<Tensor>{cat({gx, matmul(q, gv)}, -1)};
        });
  return out;
}
// The gradient of A = P L U (L m x k, U k x n, k = min(m, n)) from those of L and U: with
// A's first k rows (after P) L1 U and the rest L2 U, U = [U1 | U2] split after k columns,
// phi = tril(L1^T gL1 - gU2 U2^T, -1) + triu(gU1 U1^T - L2^T gL2),
// gA = P [L1^-T phi U1^-T, L1^-T gU2; gL2 U1^-T] (one of the off blocks is empty).
Tensor lu_backward(const Tensor& gl, const Tensor& gu, const Tensor& p, const Tensor& l,
                   const Tensor& u) {
  const int64_t m = l.size(-2), n = u.size(-1), k = u.size(-2);
  const Tensor l1 = l.narrow(-2, 0, k), l2 = l.narrow(-2, k, m - k);
  const Tensor u1 = u.narrow(-1, 0, k), u2 = u.narrow(-1, k, n - k);
  const Tensor gl1 = gl.narrow(-2, 0, k), gl2 = gl.narrow(-2, k, m - k);
  const Tensor gu1 = gu.narrow(-1, 0, k), gu2 = gu.narrow(-1, k, n - k);
  const Tensor phi = tril(matmul(mT(l1), gl1) - matmul(gu2, mT(u2)), -1) +
                     triu(matmul(gu1, mT(u1)) - matmul(mT(l2), gl2));
  // L1^-T X and X U1^-T by triangular solves.
  auto left_l = [&](const Tensor& x) { return solve_triangular_node(mT(l1), x, true, true, true); };
  auto right_u = [&](const Tensor& x) {
    return solve_triangular_node(mT(u1), x, false, false, false);
  };
  Tensor gb = right_u(left_l(phi));
  if (n > k) gb = cat({gb, left_l(gu2)}, -1);
  if (m > k) gb = cat({gb, right_u(gl2)}, -2);
  return matmul(p, gb);
}

// (LU, pivots), with torch's gradient through LU (its unpacked L and U's).
std::vector<Tensor> lu_factor_node(const Tensor& a, bool check_singular) {
  const int64_t m = a.size(-2), n = a.size(-1);
  Shape pivots_shape = leading(a.sizes(), 2);
  pivots_shape.push_back(std::min(m, n));
  std::vector<Tensor> out;
  if (records_checked({a})) {
    out = detail::lazy_record(lu_factor_def, {a}, {check_singular},
                              {{a.sizes(), a.dtype()}, {pivots_shape, kInt32}});
  } else {
    const KernelScope kernel;
    out = lu_factor_kernel(a, check_singular);
  }
  if (detail::needs_grad(a))
    detail::record("linalg.lu_factor", {a}, {out[0]}, {out[0], out[1]},
                   [](const detail::BackwardContext& c) {
                     const Tensor &lu = c.saved(0), &pivots = c.saved(1);
                     const auto [p, l, u] = lu_unpack(lu, pivots);
                     const Tensor g = c.grad();
                     const int64_t k = u.size(-2);
                     return std::vector<Tensor>{
                         // L's and U's parts unmasked, as torch's: lu_backward reads only their
                         // triangles, but NaN and infinities elsewhere spread as in torch.
                         lu_backward(g.narrow(-1, 0, k), g.narrow(-2, 0, k), p, l, u)};
                   });
  return out;
}

Tensor lu_permutation(const Tensor& pivots, int64_t rows) {
  Shape shape = leading(pivots.sizes(), 1);
  shape.push_back(rows);
  if (records_checked({pivots}))
    return detail::lazy_record1(lu_permutation_def, {pivots}, {rows}, {shape, kInt64});
  const KernelScope kernel;
  return lu_permutation_kernel(pivots, rows);
}

// torch's gradient of A = U diag(S) V^T from the reduced factors (U m x k, V^T k x n) and the
// gradients of any of them (undefined when unused): with E_ij = S_j^2 - S_i^2 and
// skew(X) = X - X^T, gA = U [(skew(U^T gU) S + S skew(V^T gV)) / E + diag(gS)] V^T, plus, for
// m > n, (I - U U^T) gU S^-1 V^T, and for m < n, U S^-1 gV^T (I - V V^T).
Tensor svd_backward(const Tensor& gu, const Tensor& gs, const Tensor& gvt, const Tensor& u,
                    const Tensor& s, const Tensor& vt) {
  const int64_t m = u.size(-2), n = vt.size(-1), k = s.size(-1);
  const Tensor identity = eye(k, TensorOptions(s.dtype()).device(s.device()));
  if (!gu.defined() && !gvt.defined())  // svdvals: U diag(gS) V^T
    return matmul(u * gs.unsqueeze(-2), vt);
  const Tensor s_row = s.unsqueeze(-2), s_col = s.unsqueeze(-1);
  const Tensor squares = s * s;
  // 1 on the diagonal, where the skew parts are 0.
  const Tensor gaps =
      masked_fill(squares.unsqueeze(-2) - squares.unsqueeze(-1), ne(identity, 0), 1);
  auto skew = [](const Tensor& x) { return x - mT(x); };
  Tensor inner = zeros_like(gaps);
  if (gu.defined()) inner = inner + skew(matmul(mT(u), gu)) * s_row;
  if (gvt.defined()) inner = inner + s_col * skew(matmul(vt, mT(gvt)));
  inner = inner / gaps;
  if (gs.defined()) inner = inner + gs.unsqueeze(-1) * identity;
  if (m > n && gu.defined()) {
    const Tensor gu_sinv = gu / s_row;
    const Tensor left = matmul(u, inner) + gu_sinv - matmul(u, matmul(mT(u), gu_sinv));
    return matmul(left, vt);
  }
  if (m < n && gvt.defined()) {
    const Tensor sinv_gvt = gvt / s_col;
    const Tensor right = matmul(inner, vt) + sinv_gvt - matmul(matmul(sinv_gvt, mT(vt)), vt);
    return matmul(u, right);
  }
  return matmul(matmul(u, inner), vt);
}

// U, S, V^T (checked A); without compute_uv, U and V^T are empty.
std::vector<Tensor> svd_node(const Tensor& a, bool full_matrices, bool compute_uv) {
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const Shape batch = leading(a.sizes(), 2);
  std::vector<Tensor> out;
  if (records_checked({a})) {
    Shape s_shape = batch;
    s_shape.push_back(k);
    const Shape none{0};
    out = detail::lazy_record(
        svd_def, {a}, {full_matrices, compute_uv},
        {{compute_uv ? with_matrix(batch, m, full_matrices ? m : k) : none, a.dtype()},
         {s_shape, a.dtype()},
         {compute_uv ? with_matrix(batch, full_matrices ? n : k, n) : none, a.dtype()}});
  } else {
    const KernelScope kernel;
    out = svd_kernel(a, full_matrices, compute_uv);
  }
  if (detail::needs_grad(a))
    // Of full matrices, only the first k columns of U (rows of V^T) take part, as in torch.
    detail::record(
        "linalg.svd", {a}, out, out, [full_matrices, k](const detail::BackwardContext& c) {
          auto reduced = [&](const Tensor& t, int64_t dim) {
            return full_matrices && t.defined() ? t.narrow(dim, 0, k) : t;
          };
          return std::vector<Tensor>{svd_backward(reduced(c.grad(0), -1), c.grad(1),
                                                  reduced(c.grad(2), -2), reduced(c.saved(0), -1),
                                                  c.saved(1), reduced(c.saved(2), -2))};
        });
  return out;
}
}  // namespace

void registration::register_matrix_functions() {
  using detail::Attrs;
  using Inputs = std::vector<Tensor>;
  auto def = [](const char* name, int arity, detail::Invoke invoke,
                std::vector<std::string> attr_names = {}) {
    detail::OpDef d{name,   detail::OpKind::Linalg, arity, detail::DTypeRule::Same, false,
                    invoke, std::move(attr_names)};
    d.raises_on_values = true;  // a singular or indefinite matrix
    return &detail::register_op(std::move(d));
  };
  solve_def.bind(*def("linalg_solve", 2, [](const Inputs& in, const Attrs&) {
    return Inputs{solve_node(in[0], in[1])};
  }));
  inv_def.bind(*def("linalg_inv", 1,
                    [](const Inputs& in, const Attrs&) { return Inputs{linalg::inv(in[0])}; }));
  solve_triangular_def.bind(*def("solve_triangular", 2,
                                 [](const Inputs& in, const Attrs& a) {
                                   return Inputs{solve_triangular_node(
                                       in[0], in[1], detail::attr_bool(a.at(0)),
                                       detail::attr_bool(a.at(1)), detail::attr_bool(a.at(2)))};
                                 },
                                 {"upper", "left", "unitriangular"}));
  det_def.bind(
      *def("det", 1, [](const Inputs& in, const Attrs&) { return det_node(in[0], false); }));
  slogdet_def.bind(
      *def("slogdet", 1, [](const Inputs& in, const Attrs&) { return det_node(in[0], true); }));
  cholesky_def.bind(*def("cholesky", 1,
                         [](const Inputs& in, const Attrs& a) {
                           return Inputs{linalg::cholesky(in[0], detail::attr_bool(a.at(0)))};
                         },
                         {"upper"}));
  cofactor_def.bind(
      *def("cofactor", 1, [](const Inputs& in, const Attrs&) { return Inputs{cofactor(in[0])}; }));
  qr_def.bind(*def(
      "qr", 1,
      [](const Inputs& in, const Attrs& a) { return qr_node(in[0], detail::attr_string(a.at(0))); },
      {"mode"}));
  svd_def.bind(*def("svd", 1,
                    [](const Inputs& in, const Attrs& a) {
                      return svd_node(in[0], detail::attr_bool(a.at(0)),
                                      detail::attr_bool(a.at(1)));
                    },
                    {"full_matrices", "compute_uv"}));
  lu_factor_def.bind(*def("lu_factor", 1,
                          [](const Inputs& in, const Attrs& a) {
                            return lu_factor_node(in[0], detail::attr_bool(a.at(0)));
                          },
                          {"check_singular"}));
  lu_permutation_def.bind(*def("lu_permutation", 1,
                               [](const Inputs& in, const Attrs& a) {
                                 return Inputs{lu_permutation(in[0], detail::attr_int(a.at(0)))};
                               },
                               {"rows"}));
  eigh_def.bind(*def(
      "eigh", 1,
      [](const Inputs& in, const Attrs& a) { return eigh_node(in[0], detail::attr_bool(a.at(0))); },
      {"upper"}));
}

namespace linalg {

Tensor solve(const Tensor& a, const Tensor& b, bool left) {
  const char* op = "linalg.solve";
  check_square(op, a);
  detail::check_defined(b, op, "B");
  // torch's vector case: B of one dim, or of A's shape without its last dim.
  const bool vector =
      b.dim() == 1 || (b.dim() == a.dim() - 1 && b.sizes() == leading(a.sizes(), 1));
  const int64_t n = a.size(-1);
  if (vector) {
    KILN_CHECK(b.size(-1) == n, op, ": incompatible shapes of A and B for the equation ",
               left ? "AX = B" : "XA = B", ": A ", describe(a), ", B ", describe(b));
    return solve_node(left ? a : mT(a), b.unsqueeze(-1)).squeeze(-1);
  }
  KILN_CHECK(b.dim() >= 2 && (left ? b.size(-2) : b.size(-1)) == n, op,
             ": incompatible shapes of A and B for the equation ", left ? "AX = B" : "XA = B",
             ": A ", describe(a), ", B ", describe(b));
  // X A = B is A^T X^T = B^T.
  return left ? solve_node(a, b) : mT(solve_node(mT(a), mT(b)));
}

Tensor solve_triangular(const Tensor& a, const Tensor& b, bool upper, bool left,
                        bool unitriangular) {
  const char* op = "linalg.solve_triangular";
  check_square(op, a);
  check_matrix(op, b, "B");
  KILN_CHECK((left ? b.size(-2) : b.size(-1)) == a.size(-1), op,
             ": incompatible shapes of A and B for the equation ", left ? "AX = B" : "XA = B",
             ": A ", describe(a), ", B ", describe(b));
  return solve_triangular_node(a, b, upper, left, unitriangular);
}

Tensor inv(const Tensor& a) {
  check_square("linalg.inv", a);
  Tensor out;
  if (records_checked({a})) {
    out = detail::lazy_record1(inv_def, {a}, {}, {a.sizes(), a.dtype()});
  } else {
    const KernelScope kernel;
    out = inv_kernel(a);
  }
  if (detail::needs_grad(a))
    detail::record("linalg.inv", {a}, {out}, {out}, [](const detail::BackwardContext& c) {
      // torch's: -X^T g X^T.
      const Tensor x_t = mT(c.saved(0));
      return std::vector<Tensor>{-matmul(matmul(x_t, c.grad()), x_t)};
    });
  return out;
}

Tensor det(const Tensor& a) {
  check_square("linalg.det", a);
  return det_node(a, false)[0];
}

std::tuple<Tensor, Tensor> slogdet(const Tensor& a) {
  check_square("linalg.slogdet", a);
  const std::vector<Tensor> out = det_node(a, true);
  return {out[0], out[1]};
}

Tensor cholesky(const Tensor& a, bool upper) {
  check_square("linalg.cholesky", a);
  Tensor out;
  if (records_checked({a})) {
    out = detail::lazy_record1(cholesky_def, {a}, {upper}, {a.sizes(), a.dtype()});
  } else {
    const KernelScope kernel;
    out = cholesky_kernel(a, upper);
  }
  if (detail::needs_grad(a))
    detail::record("linalg.cholesky", {a}, {out}, {out}, [upper](const detail::BackwardContext& c) {
      // torch's, for A = L L^T: gA = L^-T Phi L^-1 with Phi the symmetric part of tril(L^T gL)
      // (its diagonal once). An upper factor U is L^T.
      const Tensor l = upper ? mT(c.saved(0)) : c.saved(0);
      const Tensor gl = upper ? mT(c.grad()) : c.grad();
      Tensor phi = tril(matmul(mT(l), gl));
      phi = 0.5 * (phi + mT(tril(phi, -1)));
      const Tensor left_solved = solve_triangular_node(mT(l), phi, true, true, false);
      return std::vector<Tensor>{solve_triangular_node(l, left_solved, false, false, false)};
    });
  return out;
}

std::tuple<Tensor, Tensor> eigh(const Tensor& a, const std::string& uplo) {
  check_square("linalg.eigh", a);
  KILN_CHECK(uplo == "L" || uplo == "U", "linalg.eigh: UPLO must be \"L\" or \"U\", got \"", uplo,
             "\"");
  const std::vector<Tensor> out = eigh_node(a, uplo == "U");
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> qr(const Tensor& a, const std::string& mode) {
  const char* op = "linalg.qr";
  check_matrix(op, a, "A");
  KILN_CHECK(mode == "reduced" || mode == "complete" || mode == "r", op,
             ": mode must be \"reduced\", \"complete\" or \"r\", got \"", mode, "\"");
  const int64_t m = a.size(-2);
  KILN_CHECK(m * m <= std::numeric_limits<lapack_int>::max(), op, ": A ", describe(a),
             " would have a Q of more elements than LAPACK's 32-bit sizes allow");
  const std::vector<Tensor> out = qr_node(a, mode);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> lu_factor(const Tensor& a, bool pivot) {
  const char* op = "linalg.lu_factor";
  check_matrix(op, a, "A");
  KILN_CHECK(pivot, op,
             ": LU without pivoting is not implemented on the CPU (nor on CUDA "
             "tensors, which kiln factors on the host)");
  const std::vector<Tensor> out = lu_factor_node(a, true);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor, Tensor> lu(const Tensor& a, bool pivot) {
  const char* op = "linalg.lu";
  check_matrix(op, a, "A");
  KILN_CHECK(pivot, op,
             ": LU without pivoting is not implemented on the CPU (nor on CUDA "
             "tensors, which kiln factors on the host)");
  // Unpacked without a gradient: L's and U's gradients reach torch's formula as given (their
  // zeros and unit diagonal's entries included, NaN and all, as torch's).
  std::vector<Tensor> out;
  Tensor p, l, u;
  {
    AutoGradMode no_grad(false);
    out = lu_factor_node(a, false);
    std::tie(p, l, u) = lu_unpack(out[0], out[1]);
  }
  if (detail::needs_grad(a))
    detail::record("linalg.lu", {a}, {l, u}, {p, l, u}, [](const detail::BackwardContext& c) {
      const Tensor &p = c.saved(0), &l = c.saved(1), &u = c.saved(2);
      return std::vector<Tensor>{lu_backward(c.grad(0).defined() ? c.grad(0) : zeros_like(l),
                                             c.grad(1).defined() ? c.grad(1) : zeros_like(u), p, l,
                                             u)};
    });
  return {p, l, u};
}

// A = P L U, L's unit diagonal implicit: unit-triangular solves read LU's strict lower triangle,
// the others its upper one (LU^T's triangles for A^T). P moves rows (or columns) by gathers at
// the pivots' permutation or its inverse. The gradient flows through the solves and gathers to
// LU and B, as torch's.
Tensor lu_solve(const Tensor& lu, const Tensor& pivots, const Tensor& b, bool left, bool adjoint) {
  const char* op = "linalg.lu_solve";
  check_square(op, lu);
  check_matrix(op, b, "B");
  const int64_t n = lu.size(-1);
  KILN_CHECK((left ? b.size(-2) : b.size(-1)) == n, op,
             ": incompatible shapes of LU and B for the equation ", left ? "AX = B" : "XA = B",
             ": LU ", describe(lu), ", B ", describe(b));
  KILN_CHECK(lu.dtype() == b.dtype(), op, ": expected LU and B of one dtype, got ", describe(lu),
             " and ", describe(b));
  std::ignore = lu_unpack(lu, pivots, false, false);  // checks the pivots
  // Row i of P^T B is row perm[i] of B; row r of P Y is row inverse[r] of Y.
  const Tensor perm = lu_permutation(pivots, n);
  // x gathered along dim at `at` (whose batch dims broadcast with x's, padded to x's rank).
  auto gathered = [](Tensor x, Tensor at, int64_t dim) {
    while (at.dim() < x.dim()) at = at.unsqueeze(0);
    while (x.dim() < at.dim()) x = x.unsqueeze(0);
    return take_along_dim(x, at, dim);
  };
  auto rows_at = [&](const Tensor& x, const Tensor& at) {
    return gathered(x, at.unsqueeze(-1), -2);
  };
  auto columns_at = [&](const Tensor& x, const Tensor& at) {
    return gathered(x, at.unsqueeze(-2), -1);
  };
  auto with_l = [&](const Tensor& x, bool transposed, bool on_left) {
    return solve_triangular(transposed ? mT(lu) : lu, x, transposed, on_left, true);
  };
  auto with_u = [&](const Tensor& x, bool transposed, bool on_left) {
    return solve_triangular(transposed ? mT(lu) : lu, x, !transposed, on_left, false);
  };
  if (!left && adjoint)  // X U^T L^T P^T = B
    return with_u(with_l(columns_at(b, perm), true, false), true, false);
  const Tensor inverse = argsort(perm, -1);
  if (left && !adjoint) return with_u(with_l(rows_at(b, perm), false, true), false, true);
  if (left)
    return rows_at(with_l(with_u(b, true, true), true, true), inverse);       // U^T L^T P^T X = B
  return columns_at(with_l(with_u(b, false, false), false, false), inverse);  // X P L U = B
}

Tensor eigvalsh(const Tensor& a, const std::string& uplo) {
  return std::get<0>(eigh(a, uplo));
}

std::tuple<Tensor, Tensor, Tensor> svd(const Tensor& a, bool full_matrices) {
  const char* op = "linalg.svd";
  check_matrix(op, a, "A");
  const int64_t side = full_matrices ? std::max(a.size(-2), a.size(-1)) : 0;
  KILN_CHECK(side * side <= std::numeric_limits<lapack_int>::max(), op, ": A ", describe(a),
             " would have a U or V^T of more elements than LAPACK's 32-bit sizes allow");
  const std::vector<Tensor> out = svd_node(a, full_matrices, true);
  return {out[0], out[1], out[2]};
}

Tensor svdvals(const Tensor& a) {
  check_matrix("linalg.svdvals", a, "A");
  return svd_node(a, false, detail::needs_grad(a))[1];  // the gradient needs U and V^T
}

}  // namespace linalg

Tensor inverse(const Tensor& a) {
  return linalg::inv(a);
}
Tensor det(const Tensor& a) {
  return linalg::det(a);
}
std::tuple<Tensor, Tensor> slogdet(const Tensor& a) {
  return linalg::slogdet(a);
}

Tensor logdet(const Tensor& a) {
  check_square("logdet", a);
  const auto [sign, logabsdet] = linalg::slogdet(a);
  // log(det): NaN where det < 0, -inf where it is 0.
  return where(ge(sign, 0), logabsdet, std::numeric_limits<double>::quiet_NaN());
}

Tensor cholesky(const Tensor& a, bool upper) {
  return linalg::cholesky(a, upper);
}

std::tuple<Tensor, Tensor, Tensor> lu_unpack(const Tensor& lu, const Tensor& pivots,
                                             bool unpack_data, bool unpack_pivots) {
  const char* op = "lu_unpack";
  check_matrix(op, lu, "LU");
  detail::check_defined(pivots, op, "pivots");
  const int64_t m = lu.size(-2), n = lu.size(-1), k = std::min(m, n);
  Shape expected = leading(lu.sizes(), 2);
  expected.push_back(k);
  KILN_CHECK(pivots.dtype() == kInt32 && pivots.sizes() == expected, op,
             ": expected int32 pivots of shape ", detail::shape_str(expected), " for LU ",
             describe(lu), ", got ", describe(pivots));
  KILN_CHECK(pivots.device() == lu.device(), op, ": expected LU and pivots on one device, got ",
             lu.device(), " and ", pivots.device());
  const TensorOptions options = TensorOptions(lu.dtype()).device(lu.device());
  Tensor p = empty({0}, options), l = p, u = p;
  if (unpack_pivots) {
    // P[r][c] = 1 where row c of L U is row r of A.
    const Tensor perm = lu_permutation(pivots, m);
    p = eq(perm.unsqueeze(-2), arange(m, TensorOptions(kInt64).device(lu.device())).unsqueeze(-1))
            .to(lu.dtype());
  }
  if (unpack_data) {
    l = tril(lu.narrow(-1, 0, k), -1) + eye(m, k, options);
    u = triu(lu.narrow(-2, 0, k));
  }
  return {p, l, u};
}

}  // namespace kiln
