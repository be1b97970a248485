// Diagonals and repetitions with libtorch's names: diagonal (a view), diag, diag_embed, kron,
// trace, tile and repeat_interleave, composed of views, where and index_select, so that they record
// lazily, trace and differentiate through their parts.
#include <algorithm>
#include <new>
#include <vector>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/int_math.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;

// A view of x's storage: the other dims in order, then the diagonal, whose stride steps along
// both dims at once.
Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  const char* op = "diagonal";
  detail::check_defined(x, op);
  const int64_t d1 = detail::wrap_dim(dim1, x.dim(), op, &x);
  const int64_t d2 = detail::wrap_dim(dim2, x.dim(), op, &x);
  KILN_CHECK(d1 != d2, op, ": diagonal dimensions cannot be identical (", dim1, " and ", dim2,
             ") for ", describe(x));
  const int64_t rows = x.size(d1), cols = x.size(d2);
  const int64_t length = std::max<int64_t>(
      0, offset >= 0 ? std::min(rows, cols - offset) : std::min(rows + offset, cols));
  int64_t start = x.storage_offset();
  if (length > 0) start += offset >= 0 ? offset * x.stride(d2) : -offset * x.stride(d1);
  Shape sizes, strides;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == d1 || d == d2) continue;
    sizes.push_back(x.size(d));
    strides.push_back(x.stride(d));
  }
  sizes.push_back(length);
  strides.push_back(x.stride(d1) + x.stride(d2));
  return as_strided(x, sizes, strides, start);
}

namespace {
// Square matrices with v's last dim on diagonal k (batched over v's other dims): where column -
// row is k, the element of v at the row (k >= 0) or the column (k < 0), which the gradient of
// where sums back into v.
Tensor diagonal_matrix(const Tensor& v, int64_t k) {
  const int64_t n = v.size(-1), m = n + (k >= 0 ? k : -k);
  Shape pad_shape = v.sizes();
  pad_shape.back() = m - n;
  const TensorOptions options = TensorOptions(v.dtype()).device(v.device());
  const Tensor padded = cat({v, zeros(pad_shape, options)}, -1);
  const Tensor rows = arange(m, v.device()).unsqueeze(1), cols = arange(m, v.device()).unsqueeze(0);
  const Tensor on_diagonal = eq(cols - rows, k);
  const Tensor values = k >= 0 ? padded.unsqueeze(-1) : padded.unsqueeze(-2);
  return where(on_diagonal, values, zeros({}, options));
}
}  // namespace

Tensor diag(const Tensor& x, int64_t k) {
  detail::check_defined(x, "diag");
  KILN_CHECK(x.dim() == 1 || x.dim() == 2, "diag: expected a 1-D or 2-D tensor, got ", describe(x));
  return x.dim() == 1 ? diagonal_matrix(x, k) : diagonal(x, k, 0, 1).clone();
}

Tensor diag_embed(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  const char* op = "diag_embed";
  detail::check_defined(x, op);
  KILN_CHECK(x.dim() >= 1, op, ": expected at least one dim, got ", describe(x));
  const int64_t d1 = detail::wrap_dim(dim1, x.dim() + 1, op, &x);
  const int64_t d2 = detail::wrap_dim(dim2, x.dim() + 1, op, &x);
  KILN_CHECK(d1 != d2, op, ": diagonal dimensions cannot be identical (", dim1, " and ", dim2,
             ") for ", describe(x));
  return movedim(diagonal_matrix(x, offset), {-2, -1}, {d1, d2});
}

Tensor kron(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "kron", "a");
  detail::check_defined(b, "kron", "b");
  const int64_t rank = std::max(a.dim(), b.dim());
  // a as [a0, 1, a1, 1, ...] and b as [1, b0, 1, b1, ...]: their product interleaves the dims.
  Shape a_split, b_split, out;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t ad = d - (rank - a.dim()), bd = d - (rank - b.dim());
    const int64_t as = ad >= 0 ? a.size(ad) : 1, bs = bd >= 0 ? b.size(bd) : 1;
    a_split.insert(a_split.end(), {as, 1});
    b_split.insert(b_split.end(), {1, bs});
    out.push_back(as * bs);
  }
  return (a.reshape(a_split) * b.reshape(b_split)).reshape(out);
}

Tensor trace(const Tensor& x) {
  detail::check_defined(x, "trace");
  KILN_CHECK(x.dim() == 2, "trace: expected a matrix (2-D tensor), got ", describe(x));
  return sum(diagonal(x, 0, 0, 1));
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& dims) {
  detail::check_defined(x, "tile");
  std::vector<int64_t> repeats(
      static_cast<size_t>(std::max<int64_t>(0, x.dim() - static_cast<int64_t>(dims.size()))), 1);
  repeats.insert(repeats.end(), dims.begin(), dims.end());
  for (int64_t r : repeats)
    KILN_CHECK(r >= 0, "tile: dims must be non-negative, got ", shape_str(dims), " for ",
               describe(x));
  return repeat(x, repeats);
}

namespace {
// x itself, or flattened when no dim is given; `d` is the dim to repeat along.
Tensor along(const Tensor& x, std::optional<int64_t> dim, int64_t& d, const char* op) {
  detail::check_defined(x, op);
  if (!dim) {
    d = 0;
    return x.reshape({-1});
  }
  d = detail::wrap_dim(*dim, std::max<int64_t>(x.dim(), 1), op, &x);
  return x.dim() == 0 ? x.reshape({1}) : x;
}
}  // namespace

Tensor repeat_interleave(const Tensor& x, int64_t repeats, std::optional<int64_t> dim) {
  const char* op = "repeat_interleave";
  int64_t d = 0;
  const Tensor in = along(x, dim, d, op);
  KILN_CHECK(repeats >= 0, op, ": repeats must be non-negative, got ", repeats, " for ",
             describe(x));
  // A size-r dim after d, expanded and merged into d: each element r times in a row.
  Shape expanded = in.sizes(), merged = in.sizes();
  expanded.insert(expanded.begin() + d + 1, repeats);
  KILN_CHECK(!__builtin_mul_overflow(in.size(d), repeats, &merged[static_cast<size_t>(d)]), op,
             ": ", repeats, " repeats of ", describe(in), " along dim ", d, " overflow int64");
  detail::checked_numel(merged, op);
  // A copy even where the reshape could view x (one repeat, or no elements), as torch's.
  const Tensor out = in.unsqueeze(d + 1).expand(expanded).reshape(merged);
  return out.impl()->storage == x.impl()->storage ? out.clone() : out;
}

Tensor repeat_interleave(const Tensor& x, const Tensor& repeats, std::optional<int64_t> dim) {
  const char* op = "repeat_interleave";
  int64_t d = 0;
  const Tensor in = along(x, dim, d, op);
  detail::check_defined(repeats, op, "repeats");
  KILN_CHECK(repeats.dtype() == kInt64 || repeats.dtype() == kInt32, op,
             ": repeats must be an integer tensor, got ", describe(repeats));
  KILN_CHECK(repeats.dim() <= 1 && (repeats.numel() == 1 || repeats.numel() == in.size(d)), op,
             ": repeats ", describe(repeats), " must be one count, or one per element of dim ", d,
             " of ", describe(in));
  // The counts are read here: the result's size depends on them (data-dependent, as torch's).
  const Tensor counts = repeats.to(kInt64).contiguous().reshape({-1});
  const int64_t* c = counts.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t i = 0; i < in.size(d); ++i) {
    const int64_t r = c[counts.numel() == 1 ? 0 : i];
    KILN_CHECK(r >= 0, op, ": repeats must be non-negative, got ", r, " for element ", i);
    KILN_CHECK(!__builtin_add_overflow(total, r, &total), op, ": the repeats of ", describe(in),
               " add up past int64");
  }
  Shape result = in.sizes();
  result[static_cast<size_t>(d)] = total;
  detail::checked_nbytes(detail::checked_numel(result, op), in.dtype(), op, result);
  std::vector<int64_t> index;
  try {
    index.resize(static_cast<size_t>(total));
  } catch (const std::bad_alloc&) {
    KILN_FAIL(op, ": out of memory for the ", total, " indices of ", describe(in), " repeated");
  }
  for (int64_t i = 0, at = 0; i < in.size(d); ++i) {
    const int64_t r = c[counts.numel() == 1 ? 0 : i];
    std::fill_n(index.begin() + at, r, i);
    at += r;
  }
  return index_select(in, d, from_vector(index).to(in.device()));
}

}  // namespace kiln
