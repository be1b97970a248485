// unique, unique_dim and unique_consecutive, with libtorch's semantics. The elements (or the
// slices along dim) are rows of a [n, k] matrix: a stable sort by each column from the last to the
// first orders them lexicographically (one sort without dim), a row differing from the one before
// it starts a group, and a cumulative sum of those starts numbers the groups. Composed of sorts,
// comparisons, scans and index ops; the result's size depends on the values, so the call waits for
// them. Nothing differentiates through the results, as in torch.
#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {
// The permutation that sorts the rows of r lexicographically (stable).
Tensor lexicographic_order(const Tensor& r) {
  const Tensor keys = r.dtype() == kBool ? r.to(kInt32) : r;
  if (r.size(1) == 0) return arange(r.size(0), r.device());  // empty rows are all equal
  // The last column's sort needs no permutation before it.
  Tensor order = std::get<1>(sort(keys.select(1, r.size(1) - 1), 0));
  for (int64_t c = r.size(1) - 2; c >= 0; --c) {
    const Tensor column = keys.select(1, c).index_select(0, order);
    order = order.index_select(0, std::get<1>(sort(column, 0)));
  }
  return order;
}

std::tuple<Tensor, Tensor, Tensor> unique_rows(const Tensor& x, std::optional<int64_t> dim,
                                               bool consecutive, bool return_inverse,
                                               bool return_counts, const char* op) {
  detail::check_defined(x, op);
  NoGradGuard no_grad;
  const int64_t d = dim ? detail::wrap_dim(*dim, x.dim(), op, &x) : 0;
  KILN_CHECK(!dim || x.dim() > 0, op, ": a dim needs a tensor of at least 1 dim, got ",
             describe(x));
  // Each slice along dim as a row of k elements (explicit: -1 cannot stand for 0 elements).
  const int64_t k = dim ? detail::shape_numel(x.sizes()) / std::max<int64_t>(x.size(d), 1) : 1;
  const Tensor r = dim ? x.movedim(d, 0).reshape({x.size(d), k}) : x.reshape({x.numel(), 1});
  const int64_t n = r.size(0);
  const TensorOptions index_options = TensorOptions(kInt64).device(x.device());
  const Tensor order = consecutive ? Tensor() : lexicographic_order(r);
  const Tensor rows = consecutive ? r : r.index_select(0, order);
  // starts[i]: row i differs from row i - 1 (NaN differs from everything, itself included).
  const Tensor starts = n == 0
                            ? zeros({0}, TensorOptions(kBool).device(x.device()))
                            : cat({ones({1}, TensorOptions(kBool).device(x.device())),
                                   ne(rows.narrow(0, 1, n - 1), rows.narrow(0, 0, n - 1)).any(1)});
  const Tensor first_rows = nonzero(starts).reshape({-1});
  Tensor values = rows.index_select(0, first_rows);
  if (dim) {
    Shape shape = x.movedim(d, 0).sizes();
    shape[0] = values.size(0);
    values = values.reshape(shape).movedim(0, d);
  } else {
    values = values.reshape({-1});
  }
  Tensor inverse = zeros({0}, index_options), counts = zeros({0}, index_options);
  if (return_inverse) {
    const Tensor group = cumsum(starts, 0) - 1;  // each sorted row's group
    inverse = consecutive ? group : zeros({n}, index_options).scatter(0, order, group);
    if (!dim) inverse = inverse.reshape(x.sizes());
  }
  if (return_counts) counts = diff(cat({first_rows, full({1}, n, index_options)}));
  return {values, inverse, counts};
}
}  // namespace

std::tuple<Tensor, Tensor, Tensor> unique(const Tensor& x, bool /*sorted*/, bool return_inverse,
                                          bool return_counts, std::optional<int64_t> dim) {
  return unique_rows(x, dim, false, return_inverse, return_counts, "unique");
}

std::tuple<Tensor, Tensor, Tensor> unique_dim(const Tensor& x, int64_t dim, bool /*sorted*/,
                                              bool return_inverse, bool return_counts) {
  return unique_rows(x, dim, false, return_inverse, return_counts, "unique_dim");
}

std::tuple<Tensor, Tensor, Tensor> unique_consecutive(const Tensor& x, bool return_inverse,
                                                      bool return_counts,
                                                      std::optional<int64_t> dim) {
  return unique_rows(x, dim, true, return_inverse, return_counts, "unique_consecutive");
}

}  // namespace kiln
