// Products with libtorch's names and semantics beyond the GEMM ops of lib/ops/linalg.cpp: the
// scaled sums baddbmm, addbmm, addmv and addr, the chained products linalg::multi_dot and
// chain_matmul, and linalg::vecdot. Composed of bmm, mm, matmul and elementwise ops, so they record
// lazily, fuse their scaling into one kernel, trace and differentiate through their parts.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/broadcast.h"
#include "lib/ops/gemm.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;

namespace {

bool is_zero(const Scalar& s) {
  return s.to_double() == 0;
}
bool is_one(const Scalar& s) {
  return s.to_double() == 1;
}

// beta * self + alpha * product, self converted to the product's dtype and broadcast to its shape
// (as torch's). With beta 0 self is ignored, its NaN and infinities included, and its gradient is
// zero.
Tensor scaled_sum(const char* op, const Tensor& self, const Tensor& product, const Scalar& beta,
                  const Scalar& alpha) {
  KILN_CHECK(detail::broadcasts_to(self.sizes(), product.sizes()), op, ": self ", describe(self),
             " cannot be broadcast to the output shape ", shape_str(product.sizes()));
  detail::check_scalar_kind(op, product.dtype(), beta, "beta");
  detail::check_scalar_kind(op, product.dtype(), alpha, "alpha");
  const Tensor scaled = is_one(alpha) ? product : product * alpha;
  const Tensor addend = self.to(product.dtype());
  if (is_zero(beta))
    return addend.requires_grad()
               ? where(zeros({}, TensorOptions(kBool).device(self.device())), addend, scaled)
               : scaled;
  return (is_one(beta) ? addend : addend * beta) + scaled;
}

void check_batches(const char* op, const Tensor& b1, const Tensor& b2) {
  detail::check_defined(b1, op, "batch1");
  detail::check_defined(b2, op, "batch2");
  KILN_CHECK(b1.dim() == 3 && b2.dim() == 3 && b1.size(0) == b2.size(0) && b1.size(2) == b2.size(1),
             op, ": expected batch1 [b, n, m] and batch2 [b, m, p], got ", describe(b1), " and ",
             describe(b2));
}
}  // namespace

Tensor baddbmm(const Tensor& self, const Tensor& batch1, const Tensor& batch2, const Scalar& beta,
               const Scalar& alpha) {
  const char* op = "baddbmm";
  detail::check_defined(self, op, "self");
  check_batches(op, batch1, batch2);
  return scaled_sum(op, self, bmm(batch1, batch2), beta, alpha);
}

Tensor addbmm(const Tensor& self, const Tensor& batch1, const Tensor& batch2, const Scalar& beta,
              const Scalar& alpha) {
  const char* op = "addbmm";
  detail::check_defined(self, op, "self");
  check_batches(op, batch1, batch2);
  const Tensor products = bmm(batch1, batch2);
  return scaled_sum(op, self, sum(products, {0}, false, products.dtype()), beta, alpha);
}

Tensor addmv(const Tensor& self, const Tensor& mat, const Tensor& vec, const Scalar& beta,
             const Scalar& alpha) {
  const char* op = "addmv";
  detail::check_defined(self, op, "self");
  detail::check_defined(mat, op, "mat");
  detail::check_defined(vec, op, "vec");
  KILN_CHECK(mat.dim() == 2 && vec.dim() == 1 && mat.size(1) == vec.size(0), op,
             ": expected a matrix [n, m] and a vector [m], got ", describe(mat), " and ",
             describe(vec));
  return scaled_sum(op, self, matmul(mat, vec), beta, alpha);
}

Tensor addr(const Tensor& self, const Tensor& vec1, const Tensor& vec2, const Scalar& beta,
            const Scalar& alpha) {
  const char* op = "addr";
  detail::check_defined(self, op, "self");
  detail::check_defined(vec1, op, "vec1");
  detail::check_defined(vec2, op, "vec2");
  KILN_CHECK(vec1.dim() == 1 && vec2.dim() == 1, op, ": expected two vectors, got ", describe(vec1),
             " and ", describe(vec2));
  KILN_CHECK(vec1.dtype() == vec2.dtype(), op, ": expected vectors of one dtype, got ",
             describe(vec1), " and ", describe(vec2));
  return scaled_sum(op, self, outer(vec1, vec2), beta, alpha);
}

namespace {
// The cheapest parenthesization of a chain of matrices with dims[i] x dims[i + 1] each (the
// classic dynamic program over chain lengths, costs in double so that hostile sizes cannot
// overflow): split[i][j] is where the product of matrices i..j splits last.
std::vector<std::vector<size_t>> cheapest_splits(const std::vector<double>& dims) {
  const size_t n = dims.size() - 1;
  std::vector<std::vector<double>> cost(n, std::vector<double>(n, 0));
  std::vector<std::vector<size_t>> split(n, std::vector<size_t>(n, 0));
  for (size_t length = 2; length <= n; ++length)
    for (size_t i = 0; i + length <= n; ++i) {
      const size_t j = i + length - 1;
      cost[i][j] = std::numeric_limits<double>::infinity();
      for (size_t k = i; k < j; ++k) {
        const double c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1];
        if (c < cost[i][j]) {
          cost[i][j] = c;
          split[i][j] = k;
        }
      }
    }
  return split;
}

// The product of the matrices in the order the splits give, evaluated with an explicit stack.
Tensor chain_product(const std::vector<Tensor>& matrices,
                     const std::vector<std::vector<size_t>>& split) {
  struct Interval {
    size_t first, last;
    bool halves_done;  // both halves' products are on `done`
  };
  std::vector<Interval> pending{{0, matrices.size() - 1, false}};
  std::vector<Tensor> done;
  while (!pending.empty()) {
    const Interval at = pending.back();
    pending.pop_back();
    if (at.first == at.last) {
      done.push_back(matrices[at.first]);
    } else if (!at.halves_done) {
      const size_t k = split[at.first][at.last];
      pending.push_back({at.first, at.last, true});
      pending.push_back({k + 1, at.last, false});
      pending.push_back({at.first, k, false});
    } else {
      Tensor right = done.back();
      done.pop_back();
      done.back() = mm(done.back(), right);
    }
  }
  return done.back();
}
}  // namespace

namespace linalg {

Tensor multi_dot(const std::vector<Tensor>& tensors) {
  const char* op = "linalg.multi_dot";
  KILN_CHECK(tensors.size() >= 2, op, ": expected at least 2 tensors, got ", tensors.size());
  const size_t n = tensors.size();
  std::vector<Tensor> matrices;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = tensors[i];
    detail::check_defined(t, op, "tensors");
    const bool end = i == 0 || i == n - 1;
    KILN_CHECK(t.dim() == 2 || (end && t.dim() == 1), op, ": tensor ", i, " must be ",
               end ? "1-D or 2-D" : "2-D", ", got ", describe(t));
    KILN_CHECK(t.dtype() == tensors[0].dtype(), op, ": expected tensors of one dtype, got ",
               describe(tensors[0]), " and ", describe(t));
    // The first vector as a row, the last as a column.
    matrices.push_back(t.dim() == 2 ? t : i == 0 ? t.unsqueeze(0) : t.unsqueeze(1));
    KILN_CHECK(i == 0 || matrices[i - 1].size(1) == matrices[i].size(0), op, ": tensors ", i - 1,
               " and ", i, " cannot be multiplied: ", describe(tensors[i - 1]), " and ",
               describe(t));
  }
  std::vector<double> dims{static_cast<double>(matrices[0].size(0))};
  for (const Tensor& m : matrices) dims.push_back(static_cast<double>(m.size(1)));
  Tensor out = chain_product(matrices, cheapest_splits(dims));
  if (tensors[0].dim() == 1) out = out.squeeze(0);
  if (tensors[n - 1].dim() == 1) out = out.squeeze(-1);
  return out;
}

Tensor vecdot(const Tensor& x, const Tensor& y, int64_t dim) {
  const char* op = "linalg.vecdot";
  detail::check_defined(x, op, "x");
  detail::check_defined(y, op, "y");
  KILN_CHECK(x.is_floating_point() && x.dtype() == y.dtype(), op,
             ": expected floating-point x and y of one dtype, got ", describe(x), " and ",
             describe(y));
  return sum(x * y, {dim});
}

}  // namespace linalg

Tensor chain_matmul(const std::vector<Tensor>& matrices) {
  const char* op = "chain_matmul";
  KILN_CHECK(!matrices.empty(), op, ": expected one or more matrices");
  for (const Tensor& m : matrices) {
    detail::check_defined(m, op, "matrices");
    KILN_CHECK(m.dim() == 2, op, ": expected 2-D matrices, got ", describe(m));
  }
  return matrices.size() == 1 ? matrices[0].clone() : linalg::multi_dot(matrices);
}

}  // namespace kiln
