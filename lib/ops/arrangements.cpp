// Tensors arranged from others, with libtorch's names and semantics: meshgrid, cartesian_prod,
// block_diag, rot90, diff, msort, tensordot and the triangle-index factories tril_indices and
// triu_indices. Composed of views, cat, flips, sorts and GEMMs, so that they record lazily, trace
// and differentiate through their parts.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {
// The inputs of meshgrid and cartesian_prod: one dtype and device, each with at most `max_dim`
// dims.
void check_grid_inputs(const std::vector<Tensor>& tensors, const char* op, int64_t max_dim) {
  KILN_CHECK(!tensors.empty(), op, ": expects a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::check_defined(t, op, "tensors");
    KILN_CHECK(t.dim() <= max_dim, op, ": expected ", max_dim == 0 ? "0-D" : "0-D or 1-D",
               " tensors, got ", describe(t), " at position ", i);
    KILN_CHECK(t.dtype() == tensors[0].dtype() && t.device() == tensors[0].device(), op,
               ": expected tensors of one dtype and device, got ", describe(tensors[0]), " on ",
               tensors[0].device().str(), " and ", describe(t), " on ", t.device().str());
  }
}
}  // namespace

std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing) {
  const char* op = "meshgrid";
  check_grid_inputs(tensors, op, 1);
  KILN_CHECK(indexing == "ij" || indexing == "xy", op,
             ": indexing must be \"ij\" or \"xy\", got \"", std::string(indexing), "\"");
  // Cartesian indexing is matrix indexing of the first two inputs swapped, their outputs swapped
  // back: the first input runs along dim 1, the second along dim 0.
  const bool xy = indexing == "xy" && tensors.size() >= 2;
  std::vector<Tensor> inputs = tensors;
  if (xy) std::swap(inputs[0], inputs[1]);
  Shape grid;
  for (const Tensor& t : inputs) grid.push_back(t.numel());
  std::vector<Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Shape along(grid.size(), 1);
    along[i] = grid[i];
    out.push_back(inputs[i].reshape(along).expand(grid));
  }
  if (xy) std::swap(out[0], out[1]);
  return out;
}

Tensor cartesian_prod(const std::vector<Tensor>& tensors) {
  const char* op = "cartesian_prod";
  check_grid_inputs(tensors, op, 1);
  for (const Tensor& t : tensors)
    KILN_CHECK(t.dim() == 1, op, ": expected 1-D tensors, got ", describe(t));
  if (tensors.size() == 1) return tensors[0];
  std::vector<Tensor> columns;
  for (const Tensor& g : meshgrid(tensors, "ij")) columns.push_back(g.flatten());
  return stack(columns, 1);
}

Tensor block_diag(const std::vector<Tensor>& tensors) {
  const char* op = "block_diag";
  if (tensors.empty()) return zeros({1, 0});  // torch's result for no blocks
  std::vector<Tensor> blocks;
  int64_t columns = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::check_defined(t, op, "tensors");
    KILN_CHECK(t.dim() <= 2, op, ": expected tensors of at most 2 dims, got ", describe(t),
               " at position ", i);
    KILN_CHECK(t.device() == tensors[0].device(), op, ": expected tensors on one device, got ",
               tensors[0].device().str(), " and ", t.device().str(), " at position ", i);
    blocks.push_back(t.dim() == 2 ? t : t.reshape({1, -1}));
    columns += blocks.back().size(1);
  }
  const DType dtype = detail::result_type(tensors);
  const TensorOptions options = TensorOptions(dtype).device(tensors[0].device());
  // Each block's rows: zeros left of it, the block, zeros right of it.
  std::vector<Tensor> rows;
  int64_t left = 0;
  for (const Tensor& b : blocks) {
    const int64_t r = b.size(0), c = b.size(1);
    rows.push_back(
        cat({zeros({r, left}, options), b.to(dtype), zeros({r, columns - left - c}, options)}, 1));
    left += c;
  }
  return cat(rows, 0);
}

Tensor rot90(const Tensor& x, int64_t k, const std::vector<int64_t>& dims) {
  const char* op = "rot90";
  detail::check_defined(x, op);
  KILN_CHECK(dims.size() == 2, op, ": expected 2 dims, got ", dims.size());
  KILN_CHECK(x.dim() >= 2, op, ": expected a tensor of at least 2 dims, got ", describe(x));
  const int64_t d0 = detail::wrap_dim(dims[0], x.dim(), op, &x);
  const int64_t d1 = detail::wrap_dim(dims[1], x.dim(), op, &x);
  KILN_CHECK(d0 != d1, op, ": expected two different dims, got ", dims[0], " and ", dims[1],
             " for ", describe(x));
  switch (((k % 4) + 4) % 4) {
    case 1:
      return flip(x, {d1}).transpose(d0, d1);
    case 2:
      return flip(x, {d0, d1});
    case 3:
      return flip(x, {d0}).transpose(d0, d1);
    default:
      return x.clone();
  }
}

Tensor diff(const Tensor& x, int64_t n, int64_t dim, const Tensor& prepend, const Tensor& append) {
  const char* op = "diff";
  detail::check_defined(x, op);
  KILN_CHECK(x.dim() >= 1, op, ": expected a tensor of at least 1 dim, got ", describe(x));
  KILN_CHECK(n >= 0, op, ": the order n must be non-negative, got ", n);
  const int64_t d = detail::wrap_dim(dim, x.dim(), op, &x);
  std::vector<Tensor> parts;
  for (const Tensor* t : {&prepend, &x, &append})
    if (t->defined()) parts.push_back(*t);
  Tensor out = parts.size() == 1 ? x : cat(parts, d);
  // Each difference is one shorter; past the length, the result is empty.
  for (int64_t i = 0; i < n && out.size(d) > 0; ++i) {
    const int64_t length = out.size(d) - 1;
    const Tensor later = out.narrow(d, 1, length), earlier = out.narrow(d, 0, length);
    out = out.dtype() == kBool ? logical_xor(later, earlier) : later - earlier;
  }
  return out.is_same(x) ? x.clone() : out;  // a new tensor, as torch's (n = 0 copies)
}

Tensor msort(const Tensor& x) {
  detail::check_defined(x, "msort");
  return std::get<0>(sort(x, 0));
}

Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<int64_t>& dims_a,
                 const std::vector<int64_t>& dims_b) {
  const char* op = "tensordot";
  detail::check_defined(a, op, "a");
  detail::check_defined(b, op, "b");
  KILN_CHECK(dims_a.size() == dims_b.size(), op, ": both dim lists must have one length, got ",
             dims_a.size(), " and ", dims_b.size());
  std::vector<bool> contracted_a(a.dim(), false), contracted_b(b.dim(), false);
  std::vector<int64_t> da, db;
  Tensor ta = a, tb = b;
  int64_t contracted = 1;
  for (size_t i = 0; i < dims_a.size(); ++i) {
    const int64_t i_a = detail::wrap_dim(dims_a[i], a.dim(), op, &a);
    const int64_t i_b = detail::wrap_dim(dims_b[i], b.dim(), op, &b);
    KILN_CHECK(!contracted_a[i_a] && !contracted_b[i_b], op, ": dim ", dims_a[i], " of ",
               describe(a), " or ", dims_b[i], " of ", describe(b), " is contracted twice");
    contracted_a[i_a] = contracted_b[i_b] = true;
    const int64_t sa = a.size(i_a), sb = b.size(i_b);
    // A size-1 dim broadcasts against the other side: that side's dim is summed first, as torch.
    if (sb == 1 && sa != 1) {
      ta = ta.sum(i_a, true);
    } else if (sa == 1 && sb != 1) {
      tb = tb.sum(i_b, true);
    } else {
      KILN_CHECK(sa == sb, op, ": contracted dims must match, got size ", sa, " in dim ", i_a,
                 " of ", describe(a), " and size ", sb, " in dim ", i_b, " of ", describe(b));
      contracted *= sa;
    }
    da.push_back(i_a);
    db.push_back(i_b);
  }
  // a as [its free dims, the contracted ones], b as [the contracted ones, its free dims].
  std::vector<int64_t> perm_a, perm_b = db;
  Shape out_shape;
  int64_t free_a = 1, free_b = 1;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (!contracted_a[d]) perm_a.push_back(d), out_shape.push_back(a.size(d)), free_a *= a.size(d);
  for (int64_t d = 0; d < b.dim(); ++d)
    if (!contracted_b[d]) perm_b.push_back(d), out_shape.push_back(b.size(d)), free_b *= b.size(d);
  perm_a.insert(perm_a.end(), da.begin(), da.end());
  const Tensor ma = ta.permute(perm_a).reshape({free_a, contracted});
  const Tensor mb = tb.permute(perm_b).reshape({contracted, free_b});
  return mm(ma, mb).reshape(out_shape);
}

Tensor tensordot(const Tensor& a, const Tensor& b, int64_t dims) {
  const char* op = "tensordot";
  detail::check_defined(a, op, "a");
  detail::check_defined(b, op, "b");
  KILN_CHECK(dims >= 0 && dims <= a.dim() && dims <= b.dim(), op, ": cannot contract ", dims,
             " dims of ", describe(a), " and ", describe(b));
  std::vector<int64_t> dims_a, dims_b;
  for (int64_t i = 0; i < dims; ++i) {
    dims_a.push_back(a.dim() - dims + i);
    dims_b.push_back(i);
  }
  return tensordot(a, b, dims_a, dims_b);
}

namespace {
using Wide = __int128;  // sizes and offsets near the int64 limits, without overflow

// sum over r in [0, n) of clamp(r + c, 0, m), m >= 0: 0 below r = -c, m from r = m - c on.
Wide clamped_sum(Wide n, Wide c, Wide m) {
  const Wide lo = std::clamp<Wide>(-c, 0, n), hi = std::clamp<Wide>(m - c, 0, n);
  return (hi - lo) * (lo + hi - 1 + 2 * c) / 2 + (n - hi) * m;
}

// The (row, column) pairs of the lower (on and below diagonal `offset`) or upper triangle of a
// row x col matrix, row by row. Counted in closed form first, and only the rows holding some
// visited: hostile sizes fail at the allocation instead of looping.
Tensor triangle_indices(const char* op, int64_t row, int64_t col, int64_t offset, bool lower,
                        TensorOptions options) {
  KILN_CHECK(row >= 0 && col >= 0, op, ": row and col must be non-negative, got ", row, " and ",
             col);
  const DType dtype = options.dtype_or(kInt64);
  KILN_CHECK(dtype == kInt64 || dtype == kInt32, op, ": expected an int64 or int32 dtype, got ",
             dtype_name(dtype));
  const Wide count = lower ? clamped_sum(row, Wide(offset) + 1, col)
                           : Wide(row) * col - clamped_sum(row, offset, col);
  KILN_CHECK(count <= std::numeric_limits<int64_t>::max() / 2, op, ": ", row, " x ", col,
             " with offset ", offset, " has too many indices");
  Tensor out;
  try {
    out = empty({2, static_cast<int64_t>(count)}, kInt64);
  } catch (const Error& e) {
    KILN_FAIL(op, ": ", static_cast<int64_t>(count), " indices of ", row, " x ", col,
              " with offset ", offset, ": ", e.what());
  }
  int64_t* rows = out.data_ptr<int64_t>();
  int64_t* cols = rows + static_cast<int64_t>(count);
  // Lower: the rows from -offset on, columns [0, r + offset + 1); upper: the rows before
  // col - offset, columns [r + offset, col).
  const auto first_row = static_cast<int64_t>(lower ? std::clamp<Wide>(-Wide(offset), 0, row) : 0);
  const auto end_row =
      static_cast<int64_t>(lower ? row : std::clamp<Wide>(Wide(col) - offset, 0, row));
  for (int64_t r = first_row; r < end_row; ++r) {
    const Wide diagonal = Wide(r) + offset;
    const auto begin = static_cast<int64_t>(lower ? 0 : std::clamp<Wide>(diagonal, 0, col));
    const auto end = static_cast<int64_t>(lower ? std::clamp<Wide>(diagonal + 1, 0, col) : col);
    for (int64_t c = begin; c < end; ++c) *rows++ = r, *cols++ = c;
  }
  return out.to(dtype).to(options.device_);
}
}  // namespace

Tensor tril_indices(int64_t row, int64_t col, int64_t offset, TensorOptions options) {
  return triangle_indices("tril_indices", row, col, offset, true, options);
}

Tensor triu_indices(int64_t row, int64_t col, int64_t offset, TensorOptions options) {
  return triangle_indices("triu_indices", row, col, offset, false, options);
}

}  // namespace kiln
