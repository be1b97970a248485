// torch.nn.functional's normalize, cosine_similarity and pairwise_distance, and one_hot, composed
// of norms, elementwise ops and comparisons (kiln/nn_functional.h).
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
