// View ops: new geometry over the same storage, no copies (reshape copies only when it must).
#include <algorithm>

#include "kiln/ops.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::make_view;
using detail::OpKind;
using detail::shape_str;
using detail::wrap_dim;

namespace {
const detail::OpDef& def_view(const char* name) {
  return detail::register_op({name, OpKind::View, 1, detail::DTypeRule::Same});
}
const detail::OpDef& view_def = def_view("view");
const detail::OpDef& reshape_def = def_view("reshape");
const detail::OpDef& permute_def = def_view("permute");
const detail::OpDef& transpose_def = def_view("transpose");
const detail::OpDef& unsqueeze_def = def_view("unsqueeze");
const detail::OpDef& squeeze_def = def_view("squeeze");
const detail::OpDef& expand_def = def_view("expand");
const detail::OpDef& slice_def = def_view("slice");
const detail::OpDef& select_def = def_view("select");

// Resolves one -1 in a requested shape against numel.
Shape infer_shape(const char* op, const Shape& shape, int64_t numel, const Tensor& t) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      KILN_CHECK(infer < 0, op, ": only one dimension can be inferred in shape ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(out[i] >= 0, op, ": invalid shape dimension ", out[i], " in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape),
               " is invalid for input ", describe(t), " of size ", numel);
    out[infer] = numel / known;
  } else {
    KILN_CHECK(known == numel, op, ": shape ", shape_str(shape), " is invalid for input ",
               describe(t), " of size ", numel);
  }
  return out;
}

// Strides for viewing (sizes, strides) as new_sizes without copying, or nullopt when impossible.
// Groups of old dims that are contiguous among themselves ("chunks") can be re-split freely.
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides,
                                  const Shape& new_sizes) {
  int64_t numel = detail::shape_numel(sizes);
  Shape out(new_sizes.size());
  if (numel == 0 || sizes.empty()) return detail::contiguous_strides(new_sizes);
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  detail::check_defined(*this, "view");
  Shape new_sizes = infer_shape("view", shape, numel(), *this);
  auto st = view_strides(sizes(), strides(), new_sizes);
  KILN_CHECK(st.has_value(), "view: size ", shape_str(new_sizes), " is not compatible with input ",
             describe(*this), " with strides ", shape_str(strides()),
             " (at least one dimension spans across two contiguous subspaces); use .reshape(...) "
             "instead");
  (void)view_def;
  return make_view(*this, new_sizes, *st, storage_offset());
}

Tensor Tensor::reshape(const Shape& shape) const {
  detail::check_defined(*this, "reshape");
  Shape new_sizes = infer_shape("reshape", shape, numel(), *this);
  (void)reshape_def;
  if (auto st = view_strides(sizes(), strides(), new_sizes))
    return make_view(*this, new_sizes, *st, storage_offset());
  return clone().view(new_sizes);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  detail::check_defined(*this, "flatten");
  if (dim() == 0) return reshape({1});
  int64_t s = wrap_dim(start_dim, dim(), "flatten", this),
          e = wrap_dim(end_dim, dim(), "flatten", this);
  KILN_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for ",
             describe(*this));
  Shape shape(sizes().begin(), sizes().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= sizes()[d];
  shape.push_back(n);
  shape.insert(shape.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  detail::check_defined(*this, "permute");
  (void)permute_def;
  KILN_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: number of dims ", dims.size(),
             " doesn't match the input ", describe(*this));
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute", this);
    KILN_CHECK(!seen[d], "permute: dim ", d, " appears more than once in ", shape_str(dims));
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
  }
  return make_view(*this, sz, st, storage_offset());
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  detail::check_defined(*this, "transpose");
  (void)transpose_def;
  if (dim() == 0) {
    wrap_dim(dim0, 0, "transpose");
    wrap_dim(dim1, 0, "transpose");
    return make_view(*this, {}, {}, storage_offset());
  }
  int64_t a = wrap_dim(dim0, dim(), "transpose", this),
          b = wrap_dim(dim1, dim(), "transpose", this);
  Shape sz = sizes(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  return make_view(*this, sz, st, storage_offset());
}

Tensor Tensor::t() const {
  detail::check_defined(*this, "t");
  KILN_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dimensions, but got ", describe(*this));
  return dim() < 2 ? transpose(0, 0) : transpose(0, 1);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  detail::check_defined(*this, "unsqueeze");
  (void)unsqueeze_def;
  int64_t pos = wrap_dim(d, dim() + 1, "unsqueeze", this);
  Shape sz = sizes(), st = strides();
  int64_t stride = pos < dim() ? sz[pos] * st[pos] : 1;
  sz.insert(sz.begin() + pos, 1);
  st.insert(st.begin() + pos, stride);
  return make_view(*this, sz, st, storage_offset());
}

Tensor Tensor::squeeze() const {
  detail::check_defined(*this, "squeeze");
  (void)squeeze_def;
  Shape sz, st;
  for (int64_t d = 0; d < dim(); ++d) {
    if (sizes()[d] == 1) continue;
    sz.push_back(sizes()[d]);
    st.push_back(strides()[d]);
  }
  return make_view(*this, sz, st, storage_offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  detail::check_defined(*this, "squeeze");
  if (dim() == 0) {
    wrap_dim(d, 0, "squeeze");
    return make_view(*this, {}, {}, storage_offset());
  }
  int64_t pos = wrap_dim(d, dim(), "squeeze", this);
  if (sizes()[pos] != 1) return make_view(*this, sizes(), strides(), storage_offset());
  Shape sz = sizes(), st = strides();
  sz.erase(sz.begin() + pos);
  st.erase(st.begin() + pos);
  return make_view(*this, sz, st, storage_offset());
}

Tensor Tensor::expand(const Shape& shape) const {
  detail::check_defined(*this, "expand");
  (void)expand_def;
  KILN_CHECK(shape.size() >= sizes().size(), "expand: the target shape ", shape_str(shape),
             " has fewer dimensions than the input ", describe(*this));
  size_t off = shape.size() - sizes().size();
  Shape sz(shape.size()), st(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < off) {
      KILN_CHECK(shape[i] >= 0, "expand: the new leading dimension ", i,
                 " must be non-negative in ", shape_str(shape));
      sz[i] = shape[i];
      st[i] = 0;
      continue;
    }
    int64_t cur = sizes()[i - off];
    int64_t want = shape[i] == -1 ? cur : shape[i];
    KILN_CHECK(cur == want || cur == 1, "expand: the expanded size of the tensor (", want,
               ") must match the existing size (", cur, ") at non-singleton dimension ", i,
               ". Target sizes: ", shape_str(shape), ". Tensor sizes: ", shape_str(sizes()));
    sz[i] = want;
    st[i] = cur == want ? strides()[i - off] : 0;
  }
  return make_view(*this, sz, st, storage_offset());
}

Tensor Tensor::expand_as(const Tensor& other) const {
  return expand(other.sizes());
}

Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t step) const {
  detail::check_defined(*this, "slice");
  (void)slice_def;
  KILN_CHECK(dim() > 0, "slice: cannot slice a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "slice", this);
  KILN_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = sizes()[pos];
  int64_t s = start.value_or(0), e = end.value_or(n);
  if (s < 0) s += n;
  if (e < 0) e += n;
  s = std::clamp<int64_t>(s, 0, n);
  e = std::clamp<int64_t>(e, s, n);
  Shape sz = sizes(), st = strides();
  sz[pos] = (e - s + step - 1) / step;
  st[pos] = strides()[pos] * step;
  return make_view(*this, sz, st, storage_offset() + s * strides()[pos]);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  detail::check_defined(*this, "narrow");
  KILN_CHECK(dim() > 0, "narrow: cannot narrow a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "narrow", this);
  int64_t n = sizes()[pos];
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start (", start,
             ") + length (", length, ") exceeds dimension size (", n, ") of ", describe(*this));
  return slice(pos, start, start + length, 1);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  detail::check_defined(*this, "select");
  (void)select_def;
  KILN_CHECK(dim() > 0, "select: cannot select on a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "select", this);
  int64_t n = sizes()[pos];
  KILN_CHECK(index >= -n && index < n, "select: index ", index, " is out of bounds for dimension ",
             pos, " with size ", n, " of ", describe(*this));
  if (index < 0) index += n;
  Shape sz = sizes(), st = strides();
  int64_t offset = storage_offset() + index * st[pos];
  sz.erase(sz.begin() + pos);
  st.erase(st.begin() + pos);
  return make_view(*this, sz, st, offset);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  detail::check_defined(*this, "split");
  KILN_CHECK(dim() > 0, "split: cannot split a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "split", this);
  int64_t n = sizes()[pos];
  KILN_CHECK(split_size > 0 || (split_size == 0 && n == 0),
             "split: split_size must be positive, got ", split_size);
  std::vector<Tensor> out;
  if (n == 0) return {*this};
  for (int64_t s = 0; s < n; s += split_size)
    out.push_back(narrow(pos, s, std::min(split_size, n - s)));
  return out;
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& split_sizes, int64_t d) const {
  detail::check_defined(*this, "split");
  KILN_CHECK(dim() > 0, "split: cannot split a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "split", this);
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    KILN_CHECK(s >= 0, "split: split sizes must be non-negative, got ", shape_str(split_sizes));
    total += s;
  }
  KILN_CHECK(total == sizes()[pos], "split: split sizes ", shape_str(split_sizes), " sum to ",
             total, " but dimension ", pos, " of ", describe(*this), " has size ", sizes()[pos]);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(narrow(pos, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  detail::check_defined(*this, "chunk");
  KILN_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  KILN_CHECK(dim() > 0, "chunk: cannot chunk a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "chunk", this);
  int64_t n = sizes()[pos];
  int64_t size = std::max<int64_t>((n + chunks - 1) / chunks, 1);
  return split(size, pos);
}

std::vector<Tensor> Tensor::unbind(int64_t d) const {
  detail::check_defined(*this, "unbind");
  KILN_CHECK(dim() > 0, "unbind: cannot unbind a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "unbind", this);
  std::vector<Tensor> out;
  for (int64_t i = 0; i < sizes()[pos]; ++i) out.push_back(select(pos, i));
  return out;
}

}  // namespace kiln
