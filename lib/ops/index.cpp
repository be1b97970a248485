// Indexing and joining ops: index_select, gather, embedding, cat, stack, index_add and scatter_add.
//
// Every index is read and range-checked before anything is written, so a bad index raises
// kiln::Error naming the op, the value and the valid range, and never reads out of bounds.
// index_select and embedding copy whole rows: the source is viewed as [outer, size, inner]
// (contiguous) and each output row is one memcpy of `inner` elements, in parallel over rows
// (rows of one element, a selection along the innermost dim, are a typed gather instead).
// gather walks the output's rows and reads the source at its own strides. cat copies each piece
// into its narrowed slice of the output with copy_kernel (which converts dtypes and parallelizes);
// stack is cat of the pieces unsqueezed at the new dim. index_add and scatter_add copy self and add
// src's values in increasing position, serially where positions collide. On a CUDA device each op
// runs by a kernel of the device that the CUDA code generator registers (lib/cuda_tensor.h; the
// scatter-add kernel adds in the CPU's order, so results are bit-identical), else through the host.
//
// In lazy mode (lib/lazy.h) each op records one node after its checks. Index values are data, so
// the bounds check makes a pending index concrete at the call; the tensors gathered from or
// scattered into stay pending, and the node takes the (now concrete) index as an input.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/cuda_tensor.h"
#include "lib/dispatch.h"
#include "lib/int_math.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/ops/index_common.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::DTypeRule;
using detail::OpKind;
using detail::shape_str;

namespace {

using detail::attr_int;
using detail::Attrs;
using Inputs = std::vector<Tensor>;

const detail::OpDef& def_op(const char* name, OpKind kind, int arity, DTypeRule rule,
                            detail::Invoke invoke, std::vector<std::string> attr_names = {}) {
  detail::OpDef def{name, kind, arity, rule, true, invoke, std::move(attr_names)};
  def.checks_integer_values = kind == OpKind::Index;  // indices out of range raise
  return detail::register_op(std::move(def));
}
detail::OpHandle index_select_def;
detail::OpHandle gather_def;
detail::OpHandle embedding_def;
detail::OpHandle cat_def;
detail::OpHandle stack_def;
detail::OpHandle index_add_def;
detail::OpHandle scatter_add_def;
}  // namespace

// The index ops' entries.
void registration::register_index_ops() {
  index_select_def.bind(def_op("index_select", OpKind::Index, 2, DTypeRule::Custom,
                               [](const Inputs& in, const Attrs& a) {
                                 return Inputs{index_select(in[0], attr_int(a.at(0)), in[1])};
                               },
                               {"dim"}));
  gather_def.bind(def_op("gather", OpKind::Index, 2, DTypeRule::Custom,
                         [](const Inputs& in, const Attrs& a) {
                           return Inputs{gather(in[0], attr_int(a.at(0)), in[1])};
                         },
                         {"dim"}));
  embedding_def.bind(
      def_op("embedding", OpKind::Index, 2, DTypeRule::Custom,
             [](const Inputs& in, const Attrs&) { return Inputs{embedding(in[0], in[1])}; }));
  cat_def.bind(
      def_op("cat", OpKind::Join, -1, DTypeRule::Same,
             [](const Inputs& in, const Attrs& a) { return Inputs{cat(in, attr_int(a.at(0)))}; },
             {"dim"}));
  stack_def.bind(
      def_op("stack", OpKind::Join, -1, DTypeRule::Same,
             [](const Inputs& in, const Attrs& a) { return Inputs{stack(in, attr_int(a.at(0)))}; },
             {"dim"}));
  index_add_def.bind(def_op("index_add", OpKind::Index, 3, DTypeRule::Same,
                            [](const Inputs& in, const Attrs& a) {
                              return Inputs{index_add(in[0], attr_int(a.at(0)), in[1], in[2])};
                            },
                            {"dim"}));
  scatter_add_def.bind(def_op("scatter_add", OpKind::Index, 3, DTypeRule::Same,
                              [](const Inputs& in, const Attrs& a) {
                                return Inputs{scatter_add(in[0], attr_int(a.at(0)), in[1], in[2])};
                              },
                              {"dim"}));
}

namespace {

// Every op here also runs on a device: the executor calls them with device tensors.
void check_operand(const Tensor& t, const char* op, const char* arg) {
  detail::check_defined(t, op, arg);
}

// dst[j] = src[idx[j]] for j < n, elements of E's size.
template <typename E>
void gather_elements(const char* src, char* dst, const int64_t* idx, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    E v;
    std::memcpy(&v, src + static_cast<size_t>(idx[j]) * sizeof(E), sizeof(E));
    std::memcpy(dst + static_cast<size_t>(j) * sizeof(E), &v, sizeof(E));
  }
}

// copy_rows of one-element rows (a selection along the innermost dim): a gather per outer row,
// without a memcpy call and a division per element.
void copy_elements(char* o, const char* s, const std::vector<int64_t>& idx, int64_t outer,
                   int64_t size, size_t esz) {
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(n, 1));
  detail::parallel_for(outer, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const char* row = s + static_cast<size_t>(b * size) * esz;
      char* dst = o + static_cast<size_t>(b * n) * esz;
      if (esz == 8) gather_elements<uint64_t>(row, dst, idx.data(), n);
      if (esz == 4) gather_elements<uint32_t>(row, dst, idx.data(), n);
      if (esz == 1) gather_elements<uint8_t>(row, dst, idx.data(), n);
    }
  });
}

// out viewed as [outer, n, inner] (contiguous) gets rows src[outer, idx[j], inner], src being a
// contiguous [outer, size, inner] tensor of out's dtype.
void copy_rows(const Tensor& out, const Tensor& src, const std::vector<int64_t>& idx, int64_t outer,
               int64_t size, int64_t inner) {
  const int64_t n = static_cast<int64_t>(idx.size());
  const size_t esz = element_size(src.dtype());
  if (inner == 1 && (esz == 8 || esz == 4 || esz == 1))
    return copy_elements(out.impl()->data(), src.impl()->data(), idx, outer, size, esz);
  const size_t row_bytes = static_cast<size_t>(inner) * esz;
  const char* s = src.impl()->data();
  char* o = out.impl()->data();
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(inner, 1));
  detail::parallel_for(outer * n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / n, j = r % n;
      std::memcpy(o + static_cast<size_t>(r) * row_bytes,
                  s + static_cast<size_t>(b * size + idx[j]) * row_bytes, row_bytes);
    }
  });
}

// Rows `idx` of x along dim (x's dims as given; `dim` already wrapped) into a new tensor of
// out_shape, whose elements are laid out as [outer, idx.size(), inner].
Tensor select_rows(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx,
                   const Shape& out_shape) {
  Tensor out = detail::make_empty(out_shape, x.dtype());
  if (out.numel() == 0) return out;
  Tensor src = x.contiguous();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  copy_rows(out, src, idx, outer, x.dim() == 0 ? 1 : x.size(dim), inner);
  return out;
}

// index_select's value: on a device by its gather kernel (lib/cuda_tensor.h), through the host
// where there is none; on the CPU by select_rows.
Tensor select_on(const Tensor& x, int64_t dim, const Tensor& index, const std::vector<int64_t>& idx,
                 const Shape& out_shape) {
  if (x.device().is_cpu()) return select_rows(x, dim, idx, out_shape);
  Tensor out = detail::make_empty_on(out_shape, x.dtype(), x.device());
  const auto gather = detail::device_kernels().gather;
  if (gather && gather(out, x, dim, index, true)) return out;
  return detail::copy_to_device(select_rows(detail::copy_to_device(x, kCPU), dim, idx, out_shape),
                                x.device());
}

// Copies the pieces (already checked, all of rank out.dim()) into out along dim.
void join_into(const Tensor& out, const std::vector<Tensor>& pieces, int64_t dim) {
  int64_t offset = 0;
  for (const Tensor& p : pieces) {
    int64_t len = p.size(dim);
    if (len > 0 && out.numel() > 0) detail::copy_kernel(out.narrow(dim, offset, len), p);
    offset += len;
  }
}

// out[...] = x[..., idx[...] along d, ...]: out has index's shape, idx its values (checked).
void gather_into(const Tensor& out, const Tensor& x, int64_t d, const Tensor& index,
                 const std::vector<int64_t>& idx) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (x.dim() == 0) {
    detail::copy_kernel(out, x);
    return;
  }
  // Rows of the output along its last dim; each row's source offset from the outer dims.
  const int64_t nd = x.dim(), last = nd - 1, row = index.size(last);
  const Shape& xs = x.strides();
  const Shape& is = index.sizes();
  const int64_t rows = n / row;
  const int64_t step = d == last ? 0 : xs[last];
  const int64_t dstride = xs[d];
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / row);
  detail::dispatch_all(x.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* src = reinterpret_cast<const T*>(x.impl()->data());
    T* dst = reinterpret_cast<T*>(out.impl()->data());
    detail::parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        int64_t rem = r, base = 0;
        for (int64_t k = last - 1; k >= 0; --k) {
          int64_t i = rem % is[k];
          rem /= is[k];
          if (k != d) base += i * xs[k];
        }
        const int64_t* ir = idx.data() + r * row;
        T* o = dst + r * row;
        for (int64_t j = 0; j < row; ++j) o[j] = src[base + j * step + ir[j] * dstride];
      }
    });
  });
}

// self + src added at rows idx along d; s3 is self's shape with a 0-dim self as [1].
Tensor index_add_rows(const Tensor& self, int64_t d, const std::vector<int64_t>& idx,
                      const Tensor& src, const Shape& s3) {
  Tensor out = detail::make_empty(self.sizes(), self.dtype());
  detail::copy_kernel(out, self);
  Tensor in = src.contiguous();
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= s3[k];
  for (size_t k = d + 1; k < s3.size(); ++k) inner *= s3[k];
  const int64_t n = s3[d], m = static_cast<int64_t>(idx.size());
  // Outer rows and chunks of each inner run are independent; rows repeated in idx add serially.
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (inner + kChunk - 1) / kChunk;
  detail::dispatch_all(self.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* o = out.data_ptr<T>();
    const T* sp = std::as_const(in).data_ptr<T>();
    detail::parallel_for(outer * chunks,
                         std::max<int64_t>(1, detail::kParallelGrain / (m * kChunk + 1)),
                         [&](int64_t begin, int64_t end) {
                           for (int64_t w = begin; w < end; ++w) {
                             const int64_t r = w / chunks, b = (w % chunks) * kChunk;
                             const int64_t e = std::min(inner, b + kChunk);
                             for (int64_t j = 0; j < m; ++j) {
                               T* dst = o + (r * n + idx[j]) * inner;
                               const T* from = sp + (r * m + j) * inner;
                               for (int64_t i = b; i < e; ++i) dst[i] = T(dst[i] + from[i]);
                             }
                           }
                         });
  });
  return out;
}

// index_add (select) or scatter_add's value when not recording: on the CPU by index_add_rows or
// scatter_add_values; on a device by its scatter-add kernel, through the host where there is none.
Tensor scatter_add_on(const Tensor& self, int64_t d, const std::vector<int64_t>& idx,
                      const Tensor& index, const Tensor& src, bool select, const Shape& s3) {
  const auto on_host = [&](const Tensor& x, const Tensor& from) {
    return select
               ? index_add_rows(x, d, idx, from, s3)
               : detail::scatter_values(x, d, idx, index.sizes(), from, detail::ScatterMode::Add);
  };
  if (self.device().is_cpu()) return on_host(self, src);
  Tensor out = detail::make_empty_on(self.sizes(), self.dtype(), self.device());
  const auto scatter_add = detail::device_kernels().scatter_add;
  if (scatter_add && scatter_add(out, self, d, idx, index.sizes(), src, select)) return out;
  return detail::copy_to_device(
      on_host(detail::copy_to_device(self, kCPU), detail::copy_to_device(src, kCPU)),
      self.device());
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = index_select_def->name.c_str();
  check_operand(x, op, "input");
  check_operand(index, op, "index");
  detail::check_index_dtype(index, op, true);
  KILN_CHECK(index.dim() <= 1, op, ": index must be a 1-D vector, got ", describe(index));
  const int64_t d = detail::wrap_dim(dim, x.dim(), op, &x);
  std::vector<int64_t> idx;
  Shape out_shape = x.sizes();
  if (x.dim() == 0) {
    KILN_CHECK(index.numel() == 1, op, ": an index into a 0-dim tensor must have exactly one ",
               "value, got ", describe(index));
    idx = detail::read_indices(index, 1, op, "a 0-dim tensor");
  } else {
    idx = detail::read_indices(index, x.size(d), op,
                               "dimension " + std::to_string(d) + " of " + describe(x));
    out_shape[d] = static_cast<int64_t>(idx.size());
  }
  Tensor out = detail::should_record(x, index)
                   ? detail::lazy_record1(index_select_def, {x, index}, {d}, {out_shape, x.dtype()})
                   : select_on(x, d, index, idx, out_shape);
  if (detail::needs_grad(x)) {
    if (x.dim() == 0) {
      detail::record(op, {x, index}, {out}, {}, [](const detail::BackwardContext& c) {
        return std::vector<Tensor>{c.grad(), Tensor()};
      });
    } else {
      detail::record(op, {x, index}, {out}, {index},
                     [d, in = x.sizes()](const detail::BackwardContext& c) {
                       const Tensor& g = c.grad();
                       return std::vector<Tensor>{
                           index_add(zeros(in, TensorOptions(g.dtype()).device(g.device())), d,
                                     c.saved(0).reshape({-1}), g),
                           Tensor()};
                     });
    }
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = embedding_def->name.c_str();
  check_operand(weight, op, "weight");
  check_operand(indices, op, "indices");
  detail::check_index_dtype(indices, op, true);
  KILN_CHECK(weight.dim() == 2, op, ": expected weight to be a 2-D [num_embeddings, ",
             "embedding_dim] matrix, got ", describe(weight));
  std::vector<int64_t> idx = detail::read_indices(indices, weight.size(0), op,
                                                  "weight " + describe(weight) + " with rows");
  Shape out_shape = indices.sizes();
  out_shape.push_back(weight.size(1));
  Tensor out =
      detail::should_record(weight, indices)
          ? detail::lazy_record1(embedding_def, {weight, indices}, {}, {out_shape, weight.dtype()})
      : weight.device().is_cpu() ? select_rows(weight, 0, idx, out_shape)
                                 : select_on(weight, 0, indices.reshape({-1}), idx,
                                             {static_cast<int64_t>(idx.size()), weight.size(1)})
                                       .view(out_shape);
  // Rows used several times sum their gradients.
  if (detail::needs_grad(weight))
    detail::record(
        op, {weight, indices}, {out}, {indices},
        [in = weight.sizes()](const detail::BackwardContext& c) {
          const Tensor& g = c.grad();
          return std::vector<Tensor>{
              // One gradient row per index (named, not inferred: a -1 is
              // ambiguous when embedding_dim is 0).
              index_add(zeros(in, TensorOptions(g.dtype()).device(g.device())), 0,
                        c.saved(0).reshape({-1}), g.reshape({c.saved(0).numel(), in[1]})),
              Tensor()};
        });
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = gather_def->name.c_str();
  check_operand(x, op, "input");
  check_operand(index, op, "index");
  detail::check_index_dtype(index, op, false);
  KILN_CHECK(index.dim() == x.dim(), op, ": index ", describe(index),
             " must have the same number of dimensions as input ", describe(x));
  const int64_t d = detail::wrap_dim(dim, x.dim(), op, &x);
  for (int64_t k = 0; k < x.dim(); ++k) {
    KILN_CHECK(k == d || index.size(k) <= x.size(k), op, ": index ", describe(index),
               " must not be larger than input ", describe(x), " in dimension ", k,
               " (apart from dimension ", d, ")");
  }
  const int64_t size = x.dim() == 0 ? 1 : x.size(d);
  std::vector<int64_t> idx = detail::read_indices(
      index, size, op, "dimension " + std::to_string(d) + " of " + describe(x));
  Tensor out;
  if (detail::should_record(x, index)) {
    out = detail::lazy_record1(gather_def, {x, index}, {d}, {index.sizes(), x.dtype()});
  } else if (x.device().is_cuda()) {
    out = detail::make_empty_on(index.sizes(), x.dtype(), x.device());
    const auto gather = detail::device_kernels().gather;
    if (!(gather && gather(out, x, d, index, false))) {
      Tensor host = detail::make_empty(index.sizes(), x.dtype());
      gather_into(host, detail::copy_to_device(x, kCPU), d, detail::copy_to_device(index, kCPU),
                  idx);
      out = detail::copy_to_device(host, x.device());
    }
  } else {
    out = detail::make_empty(index.sizes(), x.dtype());
    gather_into(out, x, d, index, idx);
  }
  if (detail::needs_grad(x))
    detail::record(
        op, {x, index}, {out}, {index}, [d, in = x.sizes()](const detail::BackwardContext& c) {
          const Tensor& g = c.grad();
          return std::vector<Tensor>{
              scatter_add(zeros(in, TensorOptions(g.dtype()).device(g.device())), d, c.saved(0), g),
              Tensor()};
        });
  return out;
}

namespace {
// cat's autograd node: each piece's gradient is its slice of the output's.
Tensor with_cat_grad(const std::vector<Tensor>& tensors, int64_t d, const Tensor& out) {
  if (!detail::any_needs_grad(tensors)) return out;
  std::vector<int64_t> widths;  // -1 for the skipped empty 1-D tensors
  for (const Tensor& t : tensors) widths.push_back(t.dim() == 1 && t.numel() == 0 ? -1 : t.size(d));
  detail::record(
      cat_def->name.c_str(), tensors, {out}, {}, [d, widths](const detail::BackwardContext& c) {
        std::vector<Tensor> grads;
        int64_t start = 0;
        for (size_t i = 0; i < widths.size(); ++i) {
          if (!c.needs_grad(i)) {
            grads.emplace_back();
          } else if (widths[i] < 0) {  // a skipped piece: an empty gradient (torch)
            grads.push_back(zeros({0}, TensorOptions(c.grad().dtype()).device(c.grad().device())));
          } else {
            grads.push_back(c.grad().narrow(d, start, widths[i]));
          }
          start += std::max<int64_t>(widths[i], 0);
        }
        return grads;
      });
  return out;
}
}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const char* op = cat_def->name.c_str();
  KILN_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (const Tensor& t : tensors) check_operand(t, op, "tensors");
  // Legacy behaviour kept by torch: 1-D tensors of size 0 are skipped whatever their shape.
  const Tensor* ref = nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.dim() > 0, op, ": zero-dimensional tensor (at position ", i,
               ") cannot be concatenated");
    if (!(t.dim() == 1 && t.numel() == 0) && !ref) ref = &t;
  }
  DType dtype = detail::result_type(tensors);
  // Only skipped pieces: an empty result, which still requires grad when a piece does (torch).
  if (!ref)
    return with_cat_grad(tensors, 0, detail::make_empty_on({0}, dtype, tensors[0].device()));
  const int64_t d = detail::wrap_dim(dim, ref->dim(), op, ref);
  Shape out_shape = ref->sizes();
  out_shape[d] = 0;
  std::vector<Tensor> pieces;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.dim() == 1 && t.numel() == 0) continue;
    KILN_CHECK(t.dim() == ref->dim(), op, ": tensors must have the same number of dimensions: got ",
               describe(*ref), " and ", describe(t), " (tensor number ", i, " in the list)");
    for (int64_t k = 0; k < t.dim(); ++k) {
      KILN_CHECK(k == d || t.size(k) == ref->size(k), op,
                 ": sizes of tensors must match except in dimension ", d, ". Expected size ",
                 ref->size(k), " but got size ", t.size(k), " for tensor number ", i,
                 " in the list (", describe(*ref), " vs ", describe(t), ")");
    }
    out_shape[d] = KILN_CHECKED_ADD(out_shape[d], t.size(d), op, ": the concatenated size of ",
                                    "dimension ", d, " (tensor number ", i, " in the list)");
    pieces.push_back(t);
  }
  detail::checked_numel(out_shape, op);
  Tensor out;
  if (detail::should_record(tensors)) {
    out = detail::lazy_record1(cat_def, tensors, {d}, {out_shape, dtype});
  } else {
    out = detail::make_empty_on(out_shape, dtype, ref->device());
    join_into(out, pieces, d);
  }
  return with_cat_grad(tensors, d, out);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  const char* op = stack_def->name.c_str();
  KILN_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (const Tensor& t : tensors) check_operand(t, op, "tensors");
  const Tensor& ref = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].sizes() == ref.sizes(), op,
               ": expects each tensor to be equal size, but got ", shape_str(ref.sizes()),
               " at entry 0 and ", shape_str(tensors[i].sizes()), " at entry ", i);
  }
  const int64_t d = detail::wrap_dim(dim, ref.dim() + 1, op, &ref);
  Shape out_shape = ref.sizes();
  out_shape.insert(out_shape.begin() + d, static_cast<int64_t>(tensors.size()));
  const DType dtype = detail::result_type(tensors);
  Tensor out;
  if (detail::should_record(tensors)) {
    out = detail::lazy_record1(stack_def, tensors, {d}, {out_shape, dtype});
  } else {
    std::vector<Tensor> pieces;
    pieces.reserve(tensors.size());
    for (const Tensor& t : tensors) pieces.push_back(t.unsqueeze(d));
    out = detail::make_empty_on(out_shape, dtype, pieces.front().device());
    join_into(out, pieces, d);
  }
  if (detail::any_needs_grad(tensors))
    detail::record(op, tensors, {out}, {},
                   [d](const detail::BackwardContext& c) { return c.grad().unbind(d); });
  return out;
}

Tensor index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = index_add_def->name.c_str();
  check_operand(self, op, "self");
  check_operand(index, op, "index");
  check_operand(src, op, "source");
  detail::check_index_device(op, self, index, src);
  detail::check_index_dtype(index, op, true);
  KILN_CHECK(index.dim() <= 1, op, ": index must be a 1-D vector, got ", describe(index));
  KILN_CHECK(src.dtype() == self.dtype(), op, ": source ", describe(src),
             " must have the dtype of self ", describe(self));
  const int64_t nd = std::max<int64_t>(self.dim(), 1);
  const int64_t d = detail::wrap_dim(dim, nd, op, &self);
  // 0-dim self and source count as [1].
  const Shape s3 = self.dim() == 0 ? Shape{1} : self.sizes();
  const Shape src3 = src.dim() == 0 ? Shape{1} : src.sizes();
  bool shapes_ok = src3.size() == s3.size() && src3[d] == index.numel();
  for (size_t k = 0; shapes_ok && k < s3.size(); ++k)
    shapes_ok = static_cast<int64_t>(k) == d || src3[k] == s3[k];
  KILN_CHECK(shapes_ok, op, ": source ", describe(src), " must match self ", describe(self),
             " except in dimension ", d, ", where it must have the index's ", index.numel(),
             " entries");
  std::vector<int64_t> idx = detail::read_indices(
      index, s3[d], op, "dimension " + std::to_string(d) + " of " + describe(self));
  Tensor out = detail::should_record({self, index, src})
                   ? detail::lazy_record1(index_add_def, {self, index, src}, {d},
                                          {self.sizes(), self.dtype()})
                   : scatter_add_on(self, d, idx, index, src, true, s3);
  if (detail::needs_grad(self, src))
    detail::record(op, {self, index, src}, {out}, {index},
                   [d, src_sizes = src.sizes()](const detail::BackwardContext& c) {
                     const Tensor& g = c.grad();
                     Tensor gs;
                     if (c.needs_grad(2)) {
                       gs = g.dim() == 0 ? g : index_select(g, d, c.saved(0));
                       gs = gs.reshape(src_sizes);
                     }
                     return std::vector<Tensor>{g, Tensor(), gs};
                   });
  return out;
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src_in) {
  const char* op = scatter_add_def->name.c_str();
  const auto [d, src] = detail::check_scatter(op, self, dim, index, src_in);
  const int64_t size = self.dim() == 0 ? 1 : self.size(d);
  std::vector<int64_t> idx = detail::read_indices(
      index, size, op, "dimension " + std::to_string(d) + " of " + describe(self));
  Tensor out = detail::should_record({self, index, src})
                   ? detail::lazy_record1(scatter_add_def, {self, index, src}, {d},
                                          {self.sizes(), self.dtype()})
                   : scatter_add_on(self, d, idx, index, src, false, {});
  if (detail::needs_grad(self, src))
    detail::record(op, {self, index, src}, {out}, {index}, [d](const detail::BackwardContext& c) {
      const Tensor& g = c.grad();
      return std::vector<Tensor>{g, Tensor(),
                                 c.needs_grad(2) ? gather(g, d, c.saved(0)) : Tensor()};
    });
  return out;
}

}  // namespace kiln
