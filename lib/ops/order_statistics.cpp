// Reductions that skip NaN (nansum, nanmean) and that select an element (median, nanmedian,
// kthvalue), with libtorch's names and semantics, composed of where, sum, sort and gather: they
// record lazily, trace and differentiate through their parts, except the whole-tensor medians,
// whose gradient is torch's (shared evenly among the elements equal to the median).
#include <cmath>
#include <limits>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

Tensor nansum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  detail::check_defined(x, "nansum");
  if (!x.is_floating_point()) return sum(x, dims, keepdim);
  Tensor out;
  {
    AutoGradMode no_grad(false);
    out = sum(where(logical_not(isnan(x)), x, 0.0), dims, keepdim);
  }
  if (detail::needs_grad(x)) {
    // The reduced dims kept as size 1, to broadcast the gradient back over x.
    Shape kept = x.sizes();
    if (dims.empty()) kept.assign(kept.size(), 1);
    for (int64_t d : dims)  // valid: sum checked them (a 0-dim x has none to keep)
      if (x.dim() > 0) kept[static_cast<size_t>(detail::wrap_dim(d, x.dim(), "nansum", &x))] = 1;
    detail::record("nansum", {x}, {out}, {x}, [kept](const detail::BackwardContext& c) {
      // torch's: g * (x == x), so that an infinite or NaN g meets a NaN x as NaN.
      const Tensor& v = c.saved(0);
      return std::vector<Tensor>{c.grad().reshape(kept).expand(v.sizes()) * logical_not(isnan(v))};
    });
  }
  return out;
}

Tensor nanmean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  detail::check_defined(x, "nanmean");
  KILN_CHECK(x.is_floating_point(), "nanmean: expected a floating-point input, got ", describe(x));
  return nansum(x, dims, keepdim) / sum(logical_not(isnan(x)), dims, keepdim);
}

namespace {
void check_selectable(const Tensor& x, const char* op) {
  detail::check_defined(x, op);
  KILN_CHECK(x.dtype() != kBool, op, ": not supported for bool tensors, got ", describe(x));
}

// Where each value equals `value` (NaN: where x is NaN), sharing the gradient evenly among them.
Tensor evenly_distributed(const Tensor& grad, const Tensor& x, const Tensor& value) {
  const Tensor mask = logical_or(eq(x, value), logical_and(isnan(x), isnan(value)));
  return where(mask, grad / sum(mask), 0.0);
}

// value (a median of all of x's elements, computed without recording) with torch's gradient.
Tensor with_median_gradient(const char* op, const Tensor& x, const Tensor& value) {
  if (detail::needs_grad(x))
    detail::record(op, {x}, {value}, {x, value}, [](const detail::BackwardContext& c) {
      return std::vector<Tensor>{evenly_distributed(c.grad(), c.saved(0), c.saved(1))};
    });
  return value;
}

// The element at `position` (int64, x's shape with dim d of size 1) of each sorted slice along
// d, with its index; NaN sorts last. Values are gathered from x, through which they differentiate.
std::tuple<Tensor, Tensor> select_sorted(const Tensor& x, int64_t d, const Tensor& position,
                                         bool keepdim, bool zero_dim) {
  Tensor order;
  {
    AutoGradMode no_grad(false);
    order = std::get<1>(sort(x, d));
  }
  Tensor indices = gather(order, d, position);
  Tensor values = gather(x, d, indices);
  if (zero_dim) return {values.reshape({}), indices.reshape({})};
  if (!keepdim) return {values.squeeze(d), indices.squeeze(d)};
  return {values, indices};
}

// x with at least one dim, the reduced dim wrapped into d, its size checked non-zero.
Tensor reduced_along(const Tensor& x, int64_t dim, int64_t& d, const char* op) {
  check_selectable(x, op);
  const Tensor in = x.dim() == 0 ? x.reshape({1}) : x;
  d = detail::wrap_dim(dim, in.dim(), op, &x);
  KILN_CHECK(in.size(d) > 0, op, ": expected reduction dim ", d, " to have non-zero size, got ",
             describe(x));
  return in;
}

Shape with_size_one(const Tensor& x, int64_t d) {
  Shape s = x.sizes();
  s[static_cast<size_t>(d)] = 1;
  return s;
}
}  // namespace

// The lower median of all elements (NaN when any is); an empty floating tensor gives NaN.
Tensor median(const Tensor& x) {
  check_selectable(x, "median");
  KILN_CHECK(x.numel() > 0 || x.is_floating_point(), "median: cannot take the median of an empty ",
             describe(x));
  const int64_t n = x.numel();
  Tensor value;
  {
    AutoGradMode no_grad(false);
    if (n == 0) {
      value = full({}, std::numeric_limits<double>::quiet_NaN(),
                   TensorOptions(x.dtype()).device(x.device()));
    } else {
      const Tensor sorted = std::get<0>(sort(x.reshape({-1})));
      const Tensor last = sorted.select(0, n - 1);
      value = where(isnan(last), last, sorted.select(0, (n - 1) / 2));
    }
  }
  return with_median_gradient("median", x, value);
}

std::tuple<Tensor, Tensor> median(const Tensor& x, int64_t dim, bool keepdim) {
  int64_t d = 0;
  const Tensor in = reduced_along(x, dim, d, "median");
  // The lower median, or the first NaN of a slice that holds one (sorted after the numbers).
  const int64_t n = in.size(d);
  const Tensor nans = sum(isnan(in), {d}, true);
  const Tensor position =
      where(gt(nans, 0), n - nans, full({}, (n - 1) / 2, TensorOptions(kInt64).device(x.device())));
  return select_sorted(in, d, position, keepdim, x.dim() == 0);
}

// The lower median of the elements that are not NaN: position (valid - 1) / 2 of the sorted
// (NaN last) elements, 0 (a NaN) when there are none.
Tensor nanmedian(const Tensor& x) {
  check_selectable(x, "nanmedian");
  KILN_CHECK(x.numel() > 0 || x.is_floating_point(),
             "nanmedian: cannot take the median of an empty ", describe(x));
  if (x.numel() == 0) return median(x);
  Tensor value;
  {
    AutoGradMode no_grad(false);
    const Tensor flat = x.reshape({-1});
    const Tensor valid = sum(logical_not(isnan(flat)));
    const Tensor position = clamp_min(div(valid - 1, 2, "floor"), 0).reshape({1});
    value = gather(std::get<0>(sort(flat)), 0, position).reshape({});
  }
  return with_median_gradient("nanmedian", x, value);
}

std::tuple<Tensor, Tensor> nanmedian(const Tensor& x, int64_t dim, bool keepdim) {
  int64_t d = 0;
  const Tensor in = reduced_along(x, dim, d, "nanmedian");
  const Tensor valid = sum(logical_not(isnan(in)), {d}, true);
  const Tensor position = clamp_min(div(valid - 1, 2, "floor"), 0);
  return select_sorted(in, d, position, keepdim, x.dim() == 0);
}

std::tuple<Tensor, Tensor> kthvalue(const Tensor& x, int64_t k, int64_t dim, bool keepdim) {
  int64_t d = 0;
  const Tensor in = reduced_along(x, dim, d, "kthvalue");
  KILN_CHECK(k >= 1 && k <= in.size(d), "kthvalue: k = ", k, " is out of range for dim ", d, " of ",
             describe(x), " (1 to ", in.size(d), ")");
  const Tensor position =
      full(with_size_one(in, d), k - 1, TensorOptions(kInt64).device(x.device()));
  return select_sorted(in, d, position, keepdim, x.dim() == 0);
}

}  // namespace kiln
