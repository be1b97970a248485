// View ops: new geometry over the same storage, no copies (reshape copies only when it must).
#include <algorithm>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/cuda_tensor.h"
#include "lib/int_math.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::make_view;
using detail::OpKind;
using detail::shape_str;
using detail::wrap_dim;

namespace {
using detail::attr_int;
using detail::attr_ints;
using detail::Attrs;
using Inputs = std::vector<Tensor>;

const detail::OpDef& def_view(const char* name, detail::Invoke invoke = nullptr,
                              std::vector<std::string> attr_names = {}) {
  return detail::register_op(
      {name, OpKind::View, 1, detail::DTypeRule::Same, true, invoke, std::move(attr_names)});
}
const detail::OpDef& def_scatter(const char* name, detail::Invoke invoke,
                                 std::vector<std::string> attr_names) {
  return detail::register_op(
      {name, OpKind::Index, 2, detail::DTypeRule::Same, true, invoke, std::move(attr_names)});
}
detail::OpHandle view_def;
detail::OpHandle reshape_def;
detail::OpHandle permute_def;
detail::OpHandle transpose_def;
detail::OpHandle unsqueeze_def;
detail::OpHandle squeeze_def;
detail::OpHandle expand_def;
detail::OpHandle slice_def;
detail::OpHandle select_def;
detail::OpHandle as_strided_def;
detail::OpHandle split_def;
detail::OpHandle unbind_def;
detail::OpHandle slice_scatter_def;
detail::OpHandle as_strided_scatter_def;
}  // namespace

// The view ops' entries (their reference kernels are the Tensor methods), then the scatters
// that write a view's region.
void registration::register_views() {
  view_def.bind(def_view(
      "view", [](const Inputs& in, const Attrs& a) { return Inputs{in[0].view(attr_ints(a[0]))}; },
      {"shape"}));
  reshape_def.bind(def_view(
      "reshape",
      [](const Inputs& in, const Attrs& a) { return Inputs{in[0].reshape(attr_ints(a[0]))}; },
      {"shape"}));
  permute_def.bind(def_view(
      "permute",
      [](const Inputs& in, const Attrs& a) { return Inputs{in[0].permute(attr_ints(a[0]))}; },
      {"dims"}));
  transpose_def.bind(def_view("transpose",
                              [](const Inputs& in, const Attrs& a) {
                                return Inputs{in[0].transpose(attr_int(a[0]), attr_int(a[1]))};
                              },
                              {"dim0", "dim1"}));
  unsqueeze_def.bind(def_view(
      "unsqueeze",
      [](const Inputs& in, const Attrs& a) { return Inputs{in[0].unsqueeze(attr_int(a[0]))}; },
      {"dim"}));
  squeeze_def.bind(def_view("squeeze",
                            [](const Inputs& in, const Attrs& a) {
                              auto d = detail::attr_optional_int(a[0]);
                              return Inputs{d ? in[0].squeeze(*d) : in[0].squeeze()};
                            },
                            {"dim"}));
  // expand's formula: each element is its input's element, broadcast; a fused kernel reads it so
  // (the fuser takes an expand to the same rank into a group it feeds, never as a group's result).
  expand_def.bind(detail::register_op(
      {"expand",
       OpKind::View,
       1,
       detail::DTypeRule::Same,
       true,
       [](const Inputs& in, const Attrs& a) { return Inputs{in[0].expand(attr_ints(a[0]))}; },
       {"sizes"},
       nullptr,
       "x"}));
  slice_def.bind(def_view("slice",
                          [](const Inputs& in, const Attrs& a) {
                            return Inputs{in[0].slice(attr_int(a[0]), attr_int(a[1]),
                                                      attr_int(a[2]), attr_int(a[3]))};
                          },
                          {"dim", "start", "end", "step"}));
  select_def.bind(def_view("select",
                           [](const Inputs& in, const Attrs& a) {
                             return Inputs{in[0].select(attr_int(a[0]), attr_int(a[1]))};
                           },
                           {"dim", "index"}));
  // In the IR, as_strided addresses its input's elements in contiguous order: the executor hands
  // it a contiguous input starting at offset 0 (lazy mode records it only over such values).
  as_strided_def.bind(
      def_view("as_strided",
               [](const Inputs& in, const Attrs& a) {
                 Tensor x = in[0];
                 if (!x.is_contiguous() || x.storage_offset() != 0) x = x.clone();
                 return Inputs{as_strided(x, attr_ints(a[0]), attr_ints(a[1]), attr_int(a[2]))};
               },
               {"sizes", "strides", "offset"}));
  split_def.bind(def_view("split"));
  unbind_def.bind(def_view("unbind"));
  slice_scatter_def.bind(def_scatter("slice_scatter",
                                     [](const Inputs& in, const Attrs& a) {
                                       return Inputs{slice_scatter(in[0], in[1], attr_int(a[0]),
                                                                   attr_int(a[1]), attr_int(a[2]),
                                                                   attr_int(a[3]))};
                                     },
                                     {"dim", "start", "end", "step"}));
  // Like as_strided, the region addresses self's elements in contiguous order from its first one:
  // the executor hands it a contiguous self starting at offset 0 (lazy mode records it only over
  // contiguous values, with the offset relative to self's first element).
  as_strided_scatter_def.bind(
      def_scatter("as_strided_scatter",
                  [](const Inputs& in, const Attrs& a) {
                    Tensor x = in[0];
                    if (!x.is_contiguous() || x.storage_offset() != 0) x = x.clone();
                    return Inputs{as_strided_scatter(x, in[1], attr_ints(a[0]), attr_ints(a[1]),
                                                     attr_int(a[2]))};
                  },
                  {"sizes", "strides", "offset"}));
}

namespace {

// Records a view op whose input gradient is grad_of(output gradient). A view of a pending tensor
// also gets its own node, def(input, attrs) (see lib/lazy.h); without attrs it is derived from its
// storage's value when used.
template <typename F>
Tensor view_with_grad(const detail::OpDef& def, const Tensor& input, std::optional<Attrs> attrs,
                      Tensor out, F grad_of) {
  if (attrs) detail::lazy_record_view(def, input, std::move(*attrs), out);
  if (detail::needs_grad(input))
    detail::record(def.name.c_str(), {input}, {out}, {},
                   [grad_of](const detail::BackwardContext& c) {
                     return std::vector<Tensor>{grad_of(c.grad())};
                   });
  return out;
}

// The gradients of pieces of one tensor, undefined ones (unused pieces) as zeros.
std::vector<Tensor> with_zeros(const detail::BackwardContext& c, const std::vector<Shape>& shapes) {
  DType dtype = kFloat64;
  Device device = kCPU;
  for (size_t i = 0; i < c.num_grads(); ++i)
    if (c.grad(i).defined()) {
      dtype = c.grad(i).dtype();
      device = c.grad(i).device();
    }
  std::vector<Tensor> grads;
  for (size_t i = 0; i < c.num_grads(); ++i)
    grads.push_back(c.grad(i).defined() ? c.grad(i)
                                        : zeros(shapes[i], TensorOptions(dtype).device(device)));
  return grads;
}

// Records a multi-output view op (split, unbind): one node, so that the gradient is one join.
template <typename F>
void pieces_with_grad(const detail::OpDef& def, const Tensor& input, const std::vector<Tensor>& out,
                      F join) {
  if (!detail::needs_grad(input)) return;
  std::vector<Shape> shapes;
  for (const Tensor& t : out) shapes.push_back(t.sizes());
  detail::record(def.name.c_str(), {input}, out, {},
                 [join, shapes](const detail::BackwardContext& c) {
                   return std::vector<Tensor>{join(with_zeros(c, shapes))};
                 });
}

// The length of the slice [s, e) with `step` (0 <= s <= e); e - s + step - 1 may not fit.
int64_t slice_length(int64_t s, int64_t e, int64_t step) {
  return e == s ? 0 : (e - s - 1) / step + 1;
}

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
      known = KILN_CHECKED_MUL(known, out[i], op, ": the shape ", shape_str(shape));
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
  detail::checked_numel(out, op);  // with empty dims counted as 1, so that its strides fit too
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
    tensor_numel *= sizes[d];  // a product of the tensor's sizes: within its numel
    // A chunk ends where the next dim's stride is not the chunk's extent (an extent past int64
    // cannot equal any stride).
    int64_t chunk_extent;
    if (d == 0 || (sizes[d - 1] != 1 &&
                   (detail::mul_overflows(tensor_numel, chunk_base_stride, &chunk_extent) ||
                    strides[d - 1] != chunk_extent))) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        out[view_d] = KILN_CHECKED_MUL(view_numel, chunk_base_stride, "view: the strides for ",
                                       shape_str(new_sizes));
        view_numel *= new_sizes[view_d];  // new_sizes has the tensor's numel
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
  return view_with_grad(view_def, *this, Attrs{new_sizes},
                        make_view(*this, new_sizes, *st, storage_offset()),
                        [in = sizes()](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::reshape(const Shape& shape) const {
  detail::check_defined(*this, "reshape");
  Shape new_sizes = infer_shape("reshape", shape, numel(), *this);
  if (auto st = view_strides(sizes(), strides(), new_sizes))
    return view_with_grad(reshape_def, *this, Attrs{new_sizes},
                          make_view(*this, new_sizes, *st, storage_offset()),
                          [in = sizes()](const Tensor& g) { return g.reshape(in); });
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
  for (int64_t d = s; d <= e; ++d)
    n = KILN_CHECKED_MUL(n, sizes()[d], "flatten: the shape ", shape_str(sizes()));
  shape.push_back(n);
  shape.insert(shape.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  detail::check_defined(*this, "permute");
  KILN_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: number of dims ", dims.size(),
             " doesn't match the input ", describe(*this));
  Shape sz(dims.size()), st(dims.size()), normalized(dims.size());
  std::vector<bool> seen(dims.size(), false);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute", this);
    KILN_CHECK(!seen[d], "permute: dim ", d, " appears more than once in ", shape_str(dims));
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
    inverse[d] = static_cast<int64_t>(i);
    normalized[i] = d;
  }
  return view_with_grad(permute_def, *this, Attrs{normalized},
                        make_view(*this, sz, st, storage_offset()),
                        [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  detail::check_defined(*this, "transpose");
  if (dim() == 0) {
    wrap_dim(dim0, 0, "transpose");
    wrap_dim(dim1, 0, "transpose");
    return view_with_grad(transpose_def, *this, Attrs{int64_t{0}, int64_t{0}},
                          make_view(*this, {}, {}, storage_offset()),
                          [](const Tensor& g) { return g; });
  }
  int64_t a = wrap_dim(dim0, dim(), "transpose", this),
          b = wrap_dim(dim1, dim(), "transpose", this);
  Shape sz = sizes(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  return view_with_grad(transpose_def, *this, Attrs{a, b},
                        make_view(*this, sz, st, storage_offset()),
                        [a, b](const Tensor& g) { return g.transpose(a, b); });
}

Tensor Tensor::t() const {
  detail::check_defined(*this, "t");
  KILN_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dimensions, but got ", describe(*this));
  return dim() < 2 ? transpose(0, 0) : transpose(0, 1);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  detail::check_defined(*this, "unsqueeze");
  int64_t pos = wrap_dim(d, dim() + 1, "unsqueeze", this);
  Shape sz = sizes(), st = strides();
  int64_t stride = pos < dim() ? KILN_CHECKED_MUL(sz[pos], st[pos], "unsqueeze: the strides ",
                                                  shape_str(st), " of ", describe(*this))
                               : 1;
  sz.insert(sz.begin() + pos, 1);
  st.insert(st.begin() + pos, stride);
  return view_with_grad(unsqueeze_def, *this, Attrs{pos},
                        make_view(*this, sz, st, storage_offset()),
                        [pos](const Tensor& g) { return g.squeeze(pos); });
}

Tensor Tensor::squeeze() const {
  detail::check_defined(*this, "squeeze");
  Shape sz, st;
  for (int64_t d = 0; d < dim(); ++d) {
    if (sizes()[d] == 1) continue;
    sz.push_back(sizes()[d]);
    st.push_back(strides()[d]);
  }
  return view_with_grad(squeeze_def, *this, Attrs{detail::AttrValue{}},
                        make_view(*this, sz, st, storage_offset()),
                        [in = sizes()](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze(int64_t d) const {
  detail::check_defined(*this, "squeeze");
  Shape sz = sizes(), st = strides();
  int64_t squeezed = 0;
  if (dim() == 0) {
    wrap_dim(d, 0, "squeeze");
  } else {
    squeezed = wrap_dim(d, dim(), "squeeze", this);
    int64_t pos = wrap_dim(d, dim(), "squeeze", this);
    if (sizes()[pos] == 1) {
      sz.erase(sz.begin() + pos);
      st.erase(st.begin() + pos);
    }
  }
  return view_with_grad(squeeze_def, *this, Attrs{squeezed},
                        make_view(*this, sz, st, storage_offset()),
                        [in = sizes()](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::expand(const Shape& shape) const {
  detail::check_defined(*this, "expand");
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
  detail::checked_numel(sz, "expand");
  return view_with_grad(expand_def, *this, Attrs{sz}, make_view(*this, sz, st, storage_offset()),
                        [in = sizes()](const Tensor& g) { return kiln::sum_to_size(g, in); });
}

Tensor Tensor::expand_as(const Tensor& other) const {
  return expand(other.sizes());
}

Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t step) const {
  detail::check_defined(*this, "slice");
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
  sz[pos] = slice_length(s, e, step);
  st[pos] = KILN_CHECKED_MUL(strides()[pos], step, "slice: the stride of ", describe(*this),
                             " times step ", step);
  return view_with_grad(slice_def, *this, Attrs{pos, s, e, step},
                        make_view(*this, sz, st, storage_offset() + s * strides()[pos]),
                        [in = sizes(), pos, s, e, step](const Tensor& g) {
                          return kiln::slice_scatter(
                              zeros(in, TensorOptions(g.dtype()).device(g.device())), g, pos, s, e,
                              step);
                        });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  detail::check_defined(*this, "narrow");
  KILN_CHECK(dim() > 0, "narrow: cannot narrow a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "narrow", this);
  int64_t n = sizes()[pos];
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && length <= n - start, "narrow: start (", start,
             ") + length (", length, ") exceeds dimension size (", n, ") of ", describe(*this));
  return slice(pos, start, start + length, 1);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  detail::check_defined(*this, "select");
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
  return view_with_grad(select_def, *this, Attrs{pos, index}, make_view(*this, sz, st, offset),
                        [in = sizes(), pos, index](const Tensor& g) {
                          return kiln::slice_scatter(
                              zeros(in, TensorOptions(g.dtype()).device(g.device())),
                              g.unsqueeze(pos), pos, index, index + 1);
                        });
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  detail::check_defined(*this, "split");
  KILN_CHECK(dim() > 0, "split: cannot split a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "split", this);
  int64_t n = sizes()[pos];
  KILN_CHECK(split_size > 0 || (split_size == 0 && n == 0),
             "split: split_size must be positive, got ", split_size);
  if (n == 0) return {*this};
  std::vector<int64_t> sizes_list;
  for (int64_t s = 0; s < n; s += split_size) sizes_list.push_back(std::min(split_size, n - s));
  return split(sizes_list, pos);
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& split_sizes, int64_t d) const {
  detail::check_defined(*this, "split");
  KILN_CHECK(dim() > 0, "split: cannot split a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "split", this);
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    KILN_CHECK(s >= 0, "split: split sizes must be non-negative, got ", shape_str(split_sizes));
    total = KILN_CHECKED_ADD(total, s, "split: the split sizes ", shape_str(split_sizes));
  }
  KILN_CHECK(total == sizes()[pos], "split: split sizes ", shape_str(split_sizes), " sum to ",
             total, " but dimension ", pos, " of ", describe(*this), " has size ", sizes()[pos]);
  std::vector<Tensor> out;
  {
    AutoGradMode pieces_only(false);
    int64_t start = 0;
    for (int64_t s : split_sizes) {
      out.push_back(narrow(pos, start, s));
      start += s;
    }
  }
  pieces_with_grad(split_def, *this, out,
                   [pos](const std::vector<Tensor>& grads) { return cat(grads, pos); });
  return out;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  detail::check_defined(*this, "chunk");
  KILN_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  KILN_CHECK(dim() > 0, "chunk: cannot chunk a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "chunk", this);
  int64_t n = sizes()[pos];
  // An empty dim splits into `chunks` empty pieces, as in torch (split by a size would give one).
  if (n == 0) return split(std::vector<int64_t>(static_cast<size_t>(chunks), 0), pos);
  return split((n - 1) / chunks + 1, pos);  // n + chunks - 1 may not fit
}

std::vector<Tensor> Tensor::unbind(int64_t d) const {
  detail::check_defined(*this, "unbind");
  KILN_CHECK(dim() > 0, "unbind: cannot unbind a 0-dim tensor ", describe(*this));
  int64_t pos = wrap_dim(d, dim(), "unbind", this);
  std::vector<Tensor> out;
  {
    AutoGradMode pieces_only(false);
    for (int64_t i = 0; i < sizes()[pos]; ++i) out.push_back(select(pos, i));
  }
  pieces_with_grad(unbind_def, *this, out,
                   [pos](const std::vector<Tensor>& grads) { return stack(grads, pos); });
  return out;
}

// ------------------------------------------------------------------- strided views and scatters

namespace detail {
Tensor with_layout(const Tensor& g, const Shape& strides, int64_t* origin) {
  if (is_contiguous_layout(g.sizes(), strides)) {
    Tensor c = g.contiguous();
    *origin = c.storage_offset();
    return c;
  }
  *origin = 0;
  return as_strided_scatter(make_zeros_strided(g.sizes(), strides, g.dtype(), g.device()), g,
                            g.sizes(), strides, 0);
}
}  // namespace detail

namespace {
// Checks that (sizes, strides, offset) stays inside t's storage.
void check_in_storage(const char* op, const Tensor& t, const Shape& sizes, const Shape& strides,
                      int64_t offset) {
  KILN_CHECK(sizes.size() == strides.size(), op, ": sizes ", shape_str(sizes), " and strides ",
             shape_str(strides), " differ in length");
  KILN_CHECK(offset >= 0, op, ": negative storage offset ", offset);
  for (size_t i = 0; i < sizes.size(); ++i)
    KILN_CHECK(sizes[i] >= 0 && strides[i] >= 0, op, ": negative size or stride in sizes ",
               shape_str(sizes), ", strides ", shape_str(strides));
  const bool empty = detail::checked_numel(sizes, op) == 0;
  const int64_t last = empty ? offset : detail::checked_last_element(sizes, strides, offset, op);
  const int64_t capacity =
      static_cast<int64_t>(t.impl()->storage->nbytes / element_size(t.dtype()));
  KILN_CHECK(empty || last < capacity, op, ": sizes ", shape_str(sizes), ", strides ",
             shape_str(strides), " and offset ", offset, " reach element ", last,
             " outside the storage of ", capacity, " elements of ", describe(t));
}
}  // namespace

// Whether two elements of the geometry share a memory location.
bool overlaps(const Shape& sizes, const Shape& strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return false;
    if (sizes[i] > 1) dims.emplace_back(strides[i], sizes[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // the furthest element the smaller-stride dims reach
  for (auto [stride, size] : dims) {
    if (stride <= span) return true;
    span += (size - 1) * stride;  // within the view's last element, which as_strided checked
  }
  return false;
}

namespace {
// The storage position (from `start`) of every element of the geometry, as an int64 tensor of
// its sizes.
Tensor element_positions(const Shape& sizes, const Shape& strides, int64_t start, Device device) {
  Tensor positions = full({}, start, TensorOptions(kInt64).device(device));
  for (size_t i = 0; i < sizes.size(); ++i) {
    Shape along(sizes.size(), 1);
    along[i] = sizes[i];
    positions = positions + arange(sizes[i], device).view(along) * strides[i];
  }
  return positions;
}
}  // namespace

// The gradient of as_strided: each view element's gradient goes to the input element at the
// same memory location, summed where view elements share one. Where input elements share one
// too (an expanded input), that sum is divided among them, as torch's: the gradient of the
// expansion adds them up again.
Tensor as_strided_backward(const Tensor& g, const Shape& in_sizes, const Shape& in_strides,
                           const Shape& sizes, const Shape& strides, int64_t rel) {
  // A scatter into zeros of the input's layout; for an input that is not contiguous, the sum of
  // index_adds below, which records lazily (in a trace too) where such a scatter cannot.
  if (rel >= 0 && !overlaps(sizes, strides) && detail::is_contiguous_layout(in_sizes, in_strides)) {
    Tensor z = detail::make_zeros_strided(in_sizes, in_strides, g.dtype(), g.device());
    return as_strided_scatter(z, g, sizes, strides, rel);
  }
  const int64_t in_extent = detail::checked_last_element(in_sizes, in_strides, 1, "as_strided");
  const int64_t last = detail::checked_last_element(sizes, strides, rel, "as_strided");
  const int64_t shift = std::max<int64_t>(0, -rel);
  const TensorOptions options = TensorOptions(g.dtype()).device(g.device());
  Tensor flat = zeros({shift + std::max(in_extent, last + 1)}, options);
  const Tensor positions = element_positions(sizes, strides, rel + shift, g.device());
  flat = index_add(flat, 0, positions.reshape({-1}), g.reshape({-1}));
  if (overlaps(in_sizes, in_strides)) {
    const Tensor in_positions = element_positions(in_sizes, in_strides, shift, g.device());
    const Tensor counts = index_add(zeros(flat.sizes(), options), 0, in_positions.reshape({-1}),
                                    ones(in_sizes, options).reshape({-1}));
    flat = flat / clamp_min(counts, 1);  // a location no input element reads keeps its 0
  }
  return as_strided(flat, in_sizes, in_strides, shift);
}

Tensor as_strided(const Tensor& self, const Shape& sizes, const Shape& strides,
                  std::optional<int64_t> storage_offset) {
  detail::check_defined(self, "as_strided");
  const int64_t offset = storage_offset.value_or(self.storage_offset());
  check_in_storage("as_strided", self, sizes, strides, offset);
  Tensor out = make_view(self, sizes, strides, offset);
  return view_with_grad(
      as_strided_def, self, std::nullopt, out,
      [in_sizes = self.sizes(), in_strides = self.strides(), in_offset = self.storage_offset(),
       sizes, strides, offset](const Tensor& g) {
        return as_strided_backward(g, in_sizes, in_strides, sizes, strides, offset - in_offset);
      });
}

Tensor as_strided_scatter(const Tensor& self, const Tensor& src, const Shape& sizes,
                          const Shape& strides, std::optional<int64_t> storage_offset) {
  const char* op = as_strided_scatter_def->name.c_str();
  detail::check_defined(self, op);
  detail::check_defined(src, op, "src");
  KILN_CHECK(src.sizes() == sizes, op, ": src ", describe(src), " does not have the shape ",
             shape_str(sizes), " of the region it is written to");
  const int64_t offset = storage_offset.value_or(self.storage_offset());
  // The region's position relative to self's first element, applied to out's.
  const int64_t rel = offset - self.storage_offset();
  Tensor out;
  if (self.is_contiguous() && detail::should_record(self, src)) {
    // out would be a fresh contiguous tensor: check the region against one without making it.
    auto geometry = std::make_shared<detail::TensorImpl>();
    geometry->storage = std::make_shared<detail::Storage>();
    geometry->storage->nbytes =
        detail::checked_nbytes(self.numel(), self.dtype(), op, self.sizes());
    geometry->sizes = self.sizes();
    geometry->strides = detail::contiguous_strides(self.sizes());
    geometry->dtype = self.dtype();
    check_in_storage(op, Tensor(std::move(geometry)), sizes, strides, rel);
    out = detail::lazy_record1(as_strided_scatter_def, {self, src}, {sizes, strides, rel},
                               {self.sizes(), self.dtype()});
  } else {
    // Computed here, from self's values: inside a trace that would bake the example's values in.
    KILN_CHECK(!detail::trace_mode() || !detail::should_record(self, src), op,
               ": jit::trace cannot record a scatter into a self that is not contiguous (",
               describe(self), "); make self contiguous first");
    out = self.is_contiguous() ? detail::make_empty_on(self.sizes(), self.dtype(), self.device())
                               : detail::make_empty_strided(self.sizes(), self.strides(),
                                                            self.dtype(), self.device());
    check_in_storage(op, out, sizes, strides, rel);
    detail::copy_kernel(out, self);
    detail::copy_kernel(make_view(out, sizes, strides, rel), src);
  }
  if (detail::needs_grad(self, src))
    detail::record(
        op, {self, src}, {out}, {},
        [in_strides = self.strides(), sizes, strides, rel](const detail::BackwardContext& c) {
          int64_t origin = 0;
          Tensor g = detail::with_layout(c.grad(), in_strides, &origin);
          std::vector<Tensor> grads(2);
          if (c.needs_grad(0))
            grads[0] =
                as_strided_scatter(g, zeros(sizes, TensorOptions(g.dtype()).device(g.device())),
                                   sizes, strides, origin + rel);
          if (c.needs_grad(1)) grads[1] = as_strided(g, sizes, strides, origin + rel);
          return grads;
        });
  return out;
}

Tensor slice_scatter(const Tensor& self, const Tensor& src, int64_t dim,
                     std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  const char* op = slice_scatter_def->name.c_str();
  detail::check_defined(self, op);
  detail::check_defined(src, op, "src");
  KILN_CHECK(src.dtype() == self.dtype(), op, ": src ", describe(src),
             " must have the dtype of self ", describe(self));
  // The slice's range, normalized as Tensor::slice normalizes it.
  KILN_CHECK(self.dim() > 0, "slice: cannot slice a 0-dim tensor ", describe(self));
  const int64_t pos = wrap_dim(dim, self.dim(), "slice", &self);
  KILN_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = self.size(pos);
  int64_t s = start.value_or(0), e = end.value_or(n);
  if (s < 0) s += n;
  if (e < 0) e += n;
  s = std::clamp<int64_t>(s, 0, n);
  e = std::clamp<int64_t>(e, s, n);
  Shape region = self.sizes();
  region[pos] = slice_length(s, e, step);
  KILN_CHECK(src.sizes() == region, op, ": src ", describe(src), " does not match the shape ",
             shape_str(region), " of the slice of ", describe(self));
  Tensor out;
  if (detail::should_record(self, src)) {
    out = detail::lazy_record1(slice_scatter_def, {self, src}, {pos, s, e, step},
                               {self.sizes(), self.dtype()});
  } else {
    AutoGradMode kernel_only(false);
    out = self.clone();
    detail::copy_kernel(out.slice(pos, s, e, step), src);
  }
  if (detail::needs_grad(self, src))
    detail::record(
        op, {self, src}, {out}, {},
        [src_sizes = src.sizes(), dim, start, end, step](const detail::BackwardContext& c) {
          std::vector<Tensor> grads(2);
          const Tensor& g = c.grad();
          if (c.needs_grad(0))
            grads[0] =
                slice_scatter(g, zeros(src_sizes, TensorOptions(g.dtype()).device(g.device())), dim,
                              start, end, step);
          if (c.needs_grad(1)) grads[1] = g.slice(dim, start, end, step);
          return grads;
        });
  return out;
}

// select_scatter is slice_scatter of the one-element slice; diagonal_scatter writes through the
// diagonal's strides of a contiguous copy (as_strided_scatter). Both differentiate through those.
Tensor select_scatter(const Tensor& self, const Tensor& src, int64_t dim, int64_t index) {
  const char* op = "select_scatter";
  detail::check_defined(self, op);
  detail::check_defined(src, op, "src");
  KILN_CHECK(self.dim() > 0, op, ": cannot select from a 0-dim tensor ", describe(self));
  const int64_t pos = wrap_dim(dim, self.dim(), op, &self);
  const int64_t n = self.size(pos);
  KILN_CHECK(index >= -n && index < n, op, ": index ", index, " is out of range for dim ", pos,
             " of ", describe(self));
  const int64_t at = index < 0 ? index + n : index;
  Shape selected = self.sizes();
  selected.erase(selected.begin() + pos);
  KILN_CHECK(src.sizes() == selected, op, ": src ", describe(src), " does not match the shape ",
             shape_str(selected), " of the selected slice of ", describe(self));
  return slice_scatter(self, src.unsqueeze(pos), pos, at, at + 1);
}

Tensor diagonal_scatter(const Tensor& self, const Tensor& src, int64_t offset, int64_t dim1,
                        int64_t dim2) {
  const char* op = "diagonal_scatter";
  detail::check_defined(self, op);
  detail::check_defined(src, op, "src");
  KILN_CHECK(src.dtype() == self.dtype(), op, ": src ", describe(src),
             " must have the dtype of self ", describe(self));
  const Tensor base = self.contiguous();
  const Tensor diagonal = base.diagonal(offset, dim1, dim2);
  KILN_CHECK(src.sizes() == diagonal.sizes(), op, ": src ", describe(src),
             " does not match the shape ", shape_str(diagonal.sizes()), " of the diagonal of ",
             describe(self));
  return as_strided_scatter(base, src, diagonal.sizes(), diagonal.strides(),
                            diagonal.storage_offset());
}

// ------------------------------------------------------------------ free-function forms
Tensor Tensor::swapaxes(int64_t axis0, int64_t axis1) const {
  return transpose(axis0, axis1);
}
Tensor Tensor::swapdims(int64_t dim0, int64_t dim1) const {
  return transpose(dim0, dim1);
}
// The permutation that puts dim source[i] at destination[i] and the other dims, in their order,
// in the places left.
Tensor Tensor::movedim(const std::vector<int64_t>& source,
                       const std::vector<int64_t>& destination) const {
  detail::check_defined(*this, "movedim");
  KILN_CHECK(source.size() == destination.size(), "movedim: source (", shape_str(source),
             ") and destination (", shape_str(destination), ") must have the same number of dims (",
             describe(*this), ")");
  const int64_t n = dim();
  std::vector<int64_t> order(static_cast<size_t>(n), -1);
  std::vector<bool> moved(static_cast<size_t>(n), false);
  for (size_t i = 0; i < source.size(); ++i) {
    const int64_t from = wrap_dim(source[i], n, "movedim", this);
    const int64_t to = wrap_dim(destination[i], n, "movedim", this);
    KILN_CHECK(!moved[static_cast<size_t>(from)] && order[static_cast<size_t>(to)] < 0,
               "movedim: repeated dim in source (", shape_str(source), ") or destination (",
               shape_str(destination), ") for ", describe(*this));
    moved[static_cast<size_t>(from)] = true;
    order[static_cast<size_t>(to)] = from;
  }
  int64_t next = 0;
  for (int64_t& d : order) {
    if (d >= 0) continue;
    while (moved[static_cast<size_t>(next)]) ++next;
    d = next++;
  }
  return permute(order);
}
Tensor Tensor::movedim(int64_t source, int64_t destination) const {
  return movedim(std::vector<int64_t>{source}, std::vector<int64_t>{destination});
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  return x.reshape(shape);
}
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  return x.permute(dims);
}
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return x.transpose(dim0, dim1);
}
Tensor swapaxes(const Tensor& x, int64_t axis0, int64_t axis1) {
  return x.transpose(axis0, axis1);
}
Tensor swapdims(const Tensor& x, int64_t dim0, int64_t dim1) {
  return x.transpose(dim0, dim1);
}
Tensor movedim(const Tensor& x, const std::vector<int64_t>& source,
               const std::vector<int64_t>& destination) {
  return x.movedim(source, destination);
}
Tensor movedim(const Tensor& x, int64_t source, int64_t destination) {
  return x.movedim(source, destination);
}
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  return x.unsqueeze(dim);
}
Tensor squeeze(const Tensor& x) {
  return x.squeeze();
}
Tensor squeeze(const Tensor& x, int64_t dim) {
  return x.squeeze(dim);
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  return x.flatten(start_dim, end_dim);
}
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  return x.narrow(dim, start, length);
}
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  return x.chunk(chunks, dim);
}
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  return x.split(split_size, dim);
}
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim) {
  return x.split(split_sizes, dim);
}
Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  detail::check_defined(x, "broadcast_to");
  return x.expand(shape);
}

std::vector<Tensor> broadcast_tensors(const std::vector<Tensor>& tensors) {
  Shape shape;
  for (const Tensor& t : tensors) {
    detail::check_defined(t, "broadcast_tensors");
    shape = detail::broadcast_shapes(shape, t.sizes(), "broadcast_tensors");
  }
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.expand(shape));
  return out;
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  return x.unbind(dim);
}

}  // namespace kiln
