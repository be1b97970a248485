// libtorch-style indexing: Tensor::index, Tensor::index_put_, masked_fill, masked_select and
// nonzero.
//
// Basic indices (integers, slices, None, Ellipsis, true/false) are views, as in torch. Tensor
// indices (integer index tensors and boolean masks, a mask standing for the integer indices of its
// nonzero elements) follow numpy's advanced indexing: the indexed dims are moved to the front and
// merged, the broadcast indices are merged into one linear index, and one index_select picks the
// rows; the result's indexed dims go where the first indexed dim was when the indexed dims are
// adjacent, else to the front. Everything is a composition of existing ops, so gradients flow
// through index_select. index_put_ finds the flat positions the same indices address (indexing an
// arange of positions) and writes through copy_, so autograd sees one in-place write.
// Index values are data: reading them makes pending (lazy) index tensors concrete.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/broadcast.h"
#include "lib/elementwise.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::broadcasts_to;
using detail::describe;
using detail::shape_str;
using indexing::TensorIndex;

indexing::TensorIndex::TensorIndex(const char* text) : kind_(Kind::Ellipsis) {
  KILN_CHECK(text && std::strcmp(text, "...") == 0,
             "index: the only string index is \"...\" (Ellipsis), got \"", text ? text : "", "\"");
}

namespace {
// The row-major flat positions where a bool tensor holds (read on the host: counted, then
// written).
std::vector<int64_t> true_positions(const Tensor& flags) {
  const Tensor c = flags.to(kCPU).contiguous();
  const bool* p = c.data_ptr<bool>();
  const int64_t n = c.numel();
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(std::count(p, p + n, true)));
  for (int64_t i = 0; i < n; ++i)
    if (p[i]) positions.push_back(i);
  return positions;
}
}  // namespace

Tensor nonzero(const Tensor& x) {
  detail::check_defined(x, "nonzero");
  const std::vector<int64_t> positions = true_positions(ne(x, 0));
  const auto count = static_cast<int64_t>(positions.size());
  const int64_t nd = x.dim();
  const Shape strides = detail::contiguous_strides(x.sizes());
  Tensor out = detail::make_empty({count, nd}, kInt64);
  int64_t* index = out.data_ptr<int64_t>();
  for (int64_t position : positions)
    for (int64_t d = 0; d < nd; ++d) *index++ = position / strides[d] % x.size(d);
  return out.to(x.device());
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  detail::check_defined(x, "masked_select");
  detail::check_defined(mask, "masked_select", "mask");
  KILN_CHECK(mask.dtype() == kBool, "masked_select: expected a bool mask, got ", describe(mask),
             " (input ", describe(x), ")");
  const Shape shape = detail::broadcast_shapes(x.sizes(), mask.sizes(), "masked_select");
  const std::vector<int64_t> picked = true_positions(mask.expand(shape));
  return index_select(x.expand(shape).reshape({-1}), 0, from_vector(picked).to(x.device()));
}

namespace {
void check_mask(const char* op, const Tensor& x, const Tensor& mask) {
  detail::check_defined(x, op);
  detail::check_defined(mask, op, "mask");
  KILN_CHECK(mask.dtype() == kBool, op, ": expected a bool mask, got ", describe(mask), " (input ",
             describe(x), ")");
  KILN_CHECK(broadcasts_to(mask.sizes(), x.sizes()), op, ": mask ", describe(mask),
             " does not broadcast to the input's shape ", describe(x));
}
}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value) {
  check_mask("masked_fill", x, mask);
  detail::check_value_fits("masked_fill", value, x.dtype(), x);
  return where(mask, full({}, value, TensorOptions(x.dtype()).device(x.device())), x);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value) {
  check_mask("masked_fill", x, mask);
  detail::check_defined(value, "masked_fill", "value");
  KILN_CHECK(value.dim() == 0, "masked_fill: only a 0-dim value tensor is supported, got ",
             describe(value), " (input ", describe(x), ")");
  return where(mask, value.to(x.dtype()), x);
}

namespace {
// An index tensor applied to one dim of the basic-indexed view.
struct Advanced {
  int64_t dim;
  Tensor index;  // int64, values wrapped into [0, size)
};

// The index's values wrapped into [0, size), after checking that they lie in [-size, size).
Tensor wrapped_index(const Tensor& index, int64_t size, int64_t dim, const Tensor& self) {
  std::vector<int64_t> values = index.to_vector<int64_t>();
  for (int64_t& v : values) {
    KILN_CHECK(v >= -size && v < size, "index: index ", v, " is out of bounds for dimension ", dim,
               " with size ", size, " (indexing ", describe(self), ")");
    if (v < 0) v += size;
  }
  return from_vector(values, index.sizes());
}

int64_t dims_consumed(const TensorIndex& i) {
  switch (i.kind()) {
    case TensorIndex::Kind::Integer:
    case TensorIndex::Kind::Slice:
      return 1;
    case TensorIndex::Kind::Tensor:
      return i.tensor().dtype() == kBool ? i.tensor().dim() : 1;
    default:
      return 0;
  }
}

// Applies the basic indices as views; collects the tensor indices, by the dim of the view they
// index.
Tensor apply_basic(const Tensor& self, const std::vector<TensorIndex>& indices,
                   std::vector<Advanced>& advanced) {
  int64_t consumed = 0, ellipses = 0;
  for (const TensorIndex& i : indices) {
    consumed += dims_consumed(i);
    ellipses += i.kind() == TensorIndex::Kind::Ellipsis;
  }
  KILN_CHECK(ellipses <= 1, "index: an index can only have a single ellipsis (indexing ",
             describe(self), ")");
  KILN_CHECK(consumed <= self.dim(), "index: too many indices for ", describe(self), ": ", consumed,
             " dims indexed");
  Tensor cur = self;
  int64_t d = 0, remaining = consumed;
  for (const TensorIndex& i : indices) {
    switch (i.kind()) {
      case TensorIndex::Kind::None:
        cur = cur.unsqueeze(d++);
        break;
      case TensorIndex::Kind::Boolean:
        cur = cur.unsqueeze(d);
        if (!i.boolean()) cur = cur.narrow(d, 0, 0);
        ++d;
        break;
      case TensorIndex::Kind::Ellipsis:
        d = cur.dim() - remaining;
        break;
      case TensorIndex::Kind::Integer:
        cur = cur.select(d, i.integer());
        --remaining;
        break;
      case TensorIndex::Kind::Slice: {
        const indexing::Slice& s = i.slice();
        KILN_CHECK(s.step > 0, "index: slice step must be positive, got ", s.step, " (indexing ",
                   describe(self), ")");
        cur = cur.slice(d++, s.start, s.stop, s.step);
        --remaining;
        break;
      }
      case TensorIndex::Kind::Tensor: {
        const Tensor& t = i.tensor();
        detail::check_defined(t, "index", "index tensor");
        if (t.dtype() == kBool && t.dim() == 0) {  // as true or false
          cur = cur.unsqueeze(d);
          if (!t.item<bool>()) cur = cur.narrow(d, 0, 0);
          ++d;
        } else if (t.dtype() == kBool) {
          const Shape covered(cur.sizes().begin() + d, cur.sizes().begin() + d + t.dim());
          KILN_CHECK(covered == t.sizes(), "index: the shape of the mask ", describe(t),
                     " does not match the shape ", shape_str(covered), " of the indexed dims of ",
                     describe(self));
          const Tensor nz = nonzero(t);
          for (int64_t k = 0; k < t.dim(); ++k)
            advanced.push_back({d + k, wrapped_index(nz.select(1, k), covered[k], d + k, self)});
          d += t.dim();
          remaining -= t.dim();
        } else {
          KILN_CHECK(is_integral(t.dtype()), "index: tensors used as indices must be integer or ",
                     "bool tensors, got ", describe(t), " (indexing ", describe(self), ")");
          advanced.push_back({d, wrapped_index(t, cur.size(d), d, self)});
          ++d;
          --remaining;
        }
        break;
      }
    }
  }
  return cur;
}

// numpy's advanced indexing of `cur` by the collected index tensors.
Tensor apply_advanced(const Tensor& cur, const std::vector<Advanced>& advanced) {
  Shape batch;
  for (const Advanced& a : advanced)
    batch = detail::broadcast_shapes(batch, a.index.sizes(), "index");
  std::vector<int64_t> order, rest;
  Tensor linear = zeros(batch, kInt64);
  int64_t merged = 1;
  for (const Advanced& a : advanced) {
    order.push_back(a.dim);
    linear = linear * cur.size(a.dim) + a.index;
    merged *= cur.size(a.dim);
  }
  Shape rest_shape{merged};
  for (int64_t d = 0; d < cur.dim(); ++d) {
    if (std::find(order.begin(), order.end(), d) != order.end()) continue;
    order.push_back(d);
    rest.push_back(d);
    rest_shape.push_back(cur.size(d));
  }
  Tensor rows = cur.permute(order).reshape(rest_shape);
  Tensor picked = index_select(rows, 0, linear.reshape({-1}).to(cur.device()));
  Shape out_shape = batch;
  for (int64_t d : rest) out_shape.push_back(cur.size(d));
  Tensor out = picked.reshape(out_shape);
  // Adjacent indexed dims keep their place: the batch dims go where the first of them was.
  bool adjacent = true;
  for (size_t k = 1; k < advanced.size(); ++k)
    adjacent = adjacent && advanced[k].dim == advanced[k - 1].dim + 1;
  const int64_t first = advanced.front().dim, nb = static_cast<int64_t>(batch.size());
  if (!adjacent || first == 0) return out;
  std::vector<int64_t> perm;
  for (int64_t k = 0; k < first; ++k) perm.push_back(nb + k);
  for (int64_t k = 0; k < nb; ++k) perm.push_back(k);
  for (int64_t k = nb + first; k < out.dim(); ++k) perm.push_back(k);
  return out.permute(perm);
}
}  // namespace

Tensor Tensor::index(const std::vector<TensorIndex>& indices) const {
  detail::check_defined(*this, "index");
  std::vector<Advanced> advanced;
  Tensor cur = apply_basic(*this, indices, advanced);
  return advanced.empty() ? cur : apply_advanced(cur, advanced);
}

Tensor& Tensor::index_put_(const std::vector<TensorIndex>& indices, const Scalar& value) {
  detail::check_defined(*this, "index_put_");
  detail::check_value_fits("index_put_", value, dtype(), *this);
  return index_put_(indices, full({}, value, TensorOptions(dtype()).device(device())));
}

// Writes value (broadcast to the indexed shape) where index(indices) reads. Where an index repeats,
// the last write wins (torch leaves the order unspecified).
Tensor& Tensor::index_put_(const std::vector<TensorIndex>& indices, const Tensor& value) {
  detail::check_defined(*this, "index_put_");
  detail::check_defined(value, "index_put_", "value");
  const int64_t n = numel();
  const Tensor positions = arange(n).view(sizes()).index(indices);
  KILN_CHECK(broadcasts_to(value.sizes(), positions.sizes()), "index_put_: value ", describe(value),
             " cannot be broadcast to the indexed shape ", shape_str(positions.sizes()), " of ",
             describe(*this));
  const std::vector<int64_t> pos = positions.to_vector<int64_t>();
  std::vector<int64_t> source(static_cast<size_t>(n), -1);  // which value each element takes
  for (size_t i = 0; i < pos.size(); ++i) source[pos[i]] = static_cast<int64_t>(i);
  std::vector<bool> hit(source.size());
  for (size_t j = 0; j < source.size(); ++j) {
    hit[j] = source[j] >= 0;
    if (!hit[j]) source[j] = 0;
  }
  if (pos.empty()) return *this;
  const Tensor values = value.to(dtype()).expand(positions.sizes()).reshape({-1});
  const Tensor taken =
      kiln::index_select(values, 0, from_vector(source).to(device())).view(sizes());
  return copy_(kiln::where(from_vector(hit, sizes()).to(device()), taken, *this));
}

}  // namespace kiln
