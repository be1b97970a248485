// torch.nn.functional's normalize, cosine_similarity and pairwise_distance, one_hot, and torch's
// cdist, composed of norms, GEMMs, elementwise ops and comparisons (kiln/nn_functional.h).
#include <algorithm>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {
void check_floating(const Tensor& x, const char* op, const char* what) {
  detail::check_defined(x, op, what);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point ", what, ", got ",
             describe(x));
}

// The 2-norm along d (kept), at least eps, with torch's gradient: g x / n with the clamped n
// (torch clamps the norm it saved in place), 0 where n is 0.
Tensor clamped_norm(const Tensor& x, int64_t d, double eps) {
  Tensor n;
  {
    AutoGradMode no_grad(false);
    n = clamp_min(norm(x, 2, {d}, true), eps);
  }
  if (detail::needs_grad(x))
    detail::record("cosine_similarity", {x}, {n}, {x, n}, [](const detail::BackwardContext& c) {
      const Tensor& n = c.saved(1);
      return std::vector<Tensor>{c.saved(0) * where(logical_not(eq(n, 0)), c.grad() / n, 0.0)};
    });
  return n;
}
}  // namespace

Tensor normalize(const Tensor& x, double p, int64_t dim, double eps) {
  check_floating(x, "normalize", "input");
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(x.dim(), 1), "normalize", &x);
  return x / clamp_min(norm(x, p, {d}, true), eps);
}

Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim, double eps) {
  const char* op = "cosine_similarity";
  check_floating(x1, op, "x1");
  check_floating(x2, op, "x2");
  const std::vector<Tensor> both = broadcast_tensors({x1, x2});
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(both[0].dim(), 1), op, &both[0]);
  // Each normalized first (torch's order), so that the result stays within [-1, 1].
  return sum((both[0] / clamped_norm(both[0], d, eps)) * (both[1] / clamped_norm(both[1], d, eps)),
             {d});
}

Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim) {
  const char* op = "pairwise_distance";
  check_floating(x1, op, "x1");
  check_floating(x2, op, "x2");
  // The last dim of the broadcast shape, as torch's (eps keeps the norm's gradient finite).
  const int64_t d = std::max<int64_t>(std::max(x1.dim(), x2.dim()) - 1, 0);
  return norm(x1 - x2 + eps, p, {d}, keepdim);
}

namespace {
// The Euclidean distances of the rows of x1 [..., P, M] and x2 [..., R, M] from one GEMM of
// [-2 x1, |x1|^2, 1] and [x2, 1, |x2|^2] (torch's _euclidean_dist: fast, but cancellation costs
// accuracy for nearby rows), with torch's gradient, which is 0 where a distance is 0.
Tensor euclidean_by_gemm(const Tensor& x1, const Tensor& x2) {
  Tensor result;
  {
    AutoGradMode no_grad(false);
    const Tensor norm1 = x1.pow(2).sum(-1, true), norm2 = x2.pow(2).sum(-1, true);
    const Tensor a = cat({x1 * -2, norm1, ones_like(norm1)}, -1);
    const Tensor b = cat({x2, ones_like(norm2), norm2}, -1);
    result = sqrt(clamp_min(matmul(a, b.transpose(-2, -1)), 0));
  }
  if (detail::needs_grad(x1, x2))
    detail::record(
        "cdist", {x1, x2}, {result}, {x1, x2, result}, [](const detail::BackwardContext& c) {
          const Tensor &x1 = c.saved(0), &x2 = c.saved(1), &d = c.saved(2);
          const Tensor ratio = where(ne(d, 0), c.grad() / d, 0.0);
          const Tensor g1 = x1 * ratio.sum(-1, true) - matmul(ratio, x2);
          const Tensor g2 = x2 * ratio.sum(-2).unsqueeze(-1) - matmul(ratio.transpose(-2, -1), x1);
          return std::vector<Tensor>{sum_to_size(g1, x1.sizes()), sum_to_size(g2, x2.sizes())};
        });
  return result;
}
}  // namespace

Tensor cdist(const Tensor& x1, const Tensor& x2, double p, std::optional<int64_t> compute_mode) {
  const char* op = "cdist";
  check_floating(x1, op, "x1");
  check_floating(x2, op, "x2");
  KILN_CHECK(x1.dim() >= 2 && x2.dim() >= 2 && x1.size(-1) == x2.size(-1), op,
             ": expected x1 [..., P, M] and x2 [..., R, M], got ", describe(x1), " and ",
             describe(x2));
  KILN_CHECK(x1.dtype() == x2.dtype() && x1.device() == x2.device(), op,
             ": expected x1 and x2 of one dtype and device, got ", describe(x1), " on ",
             x1.device().str(), " and ", describe(x2), " on ", x2.device().str());
  KILN_CHECK(p >= 0, op, ": p must be non-negative, got ", p);
  const int64_t mode = compute_mode.value_or(0);
  KILN_CHECK(mode >= 0 && mode <= 2, op, ": compute_mode must be 0, 1 or 2, got ", mode);
  if (p == 2 && (mode == 1 || (mode == 0 && (x1.size(-2) > 25 || x2.size(-2) > 25))))
    return euclidean_by_gemm(x1, x2);
  // Direct differences [..., P, R, M], reduced by the p-norm (0 between rows of no elements).
  if (x1.size(-1) == 0) return (x1.unsqueeze(-2) - x2.unsqueeze(-3)).sum(-1);
  return linalg::vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, {-1});
}

Tensor one_hot(const Tensor& x, int64_t num_classes) {
  const char* op = "one_hot";
  detail::check_defined(x, op);
  KILN_CHECK(x.dtype() == kInt64, op, ": expected an int64 tensor of class indices, got ",
             describe(x));
  if (x.numel() == 0) {
    KILN_CHECK(num_classes > 0, op, ": cannot infer the number of classes from the empty ",
               describe(x), "; pass num_classes");
  } else {
    // The values are read here, as torch's: the result's size may depend on them.
    const int64_t lowest = min(x).item<int64_t>(), highest = max(x).item<int64_t>();
    KILN_CHECK(lowest >= 0, op, ": class values must be non-negative, got ", lowest, " in ",
               describe(x));
    if (num_classes < 0) num_classes = highest + 1;
    KILN_CHECK(highest < num_classes, op, ": class values must be smaller than num_classes ",
               num_classes, ", got ", highest, " in ", describe(x));
  }
  return eq(x.unsqueeze(-1), arange(num_classes, x.device())).to(kInt64);
}

}  // namespace kiln
