// Writes at positions given by a tensor, with libtorch's names and semantics: scatter (of a src or
// a value), scatter_reduce, index_copy, index_fill, masked_scatter and take.
//
// scatter and scatter_reduce's prod, amax and amin are one op of the table ("scatter", attributes
// dim, reduce and include_self), run by detail::scatter_values on the CPU and through the host on
// a device; their gradients are torch's formulas. scatter_reduce's sum and mean are scatter_add
// (lib/ops/index.cpp) and a division, and the others compose scatter, gather, where and cumsum, so
// that they record, trace and differentiate through their parts. Index and mask values are data:
// they are read only to check them (detail::read_indices), never baked into a trace.
#include <limits>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/broadcast.h"
#include "lib/cuda_tensor.h"
#include "lib/dispatch.h"
#include "lib/elementwise.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/ops/index_common.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::ScatterMode;

namespace {
detail::OpHandle scatter_def;

// The table op's reductions: "none" assigns (scatter), the others are scatter_reduce's.
ScatterMode mode_of(const std::string& reduce) {
  if (reduce == "prod") return ScatterMode::Multiply;
  if (reduce == "amax") return ScatterMode::Max;
  if (reduce == "amin") return ScatterMode::Min;
  return ScatterMode::Assign;
}

// The table op's value: on the CPU by scatter_values, on a device through the host.
Tensor scatter_on(const Tensor& self, int64_t d, const std::vector<int64_t>& idx,
                  const Tensor& index, const Tensor& src, const std::string& reduce,
                  bool include_self) {
  const ScatterMode mode = mode_of(reduce);
  if (self.device().is_cpu())
    return detail::scatter_values(self, d, idx, index.sizes(), src, mode, include_self);
  return detail::copy_to_device(
      detail::scatter_values(detail::copy_to_device(self, kCPU), d, idx, index.sizes(),
                             detail::copy_to_device(src, kCPU), mode, include_self),
      self.device());
}

// torch's gradients of scatter_reduce's prod, amax and amin (self, src), before the positions
// that did not include self are cleared.
std::vector<Tensor> reduce_grads(const Tensor& g, const Tensor& self, int64_t d,
                                 const Tensor& index, const Tensor& src, const Tensor& result,
                                 const std::string& reduce, bool include_self) {
  if (reduce == "prod") {
    // Products of the other factors, computed again where a factor is 0 (dividing by it would
    // not do); several zeros at one position give src a zero gradient.
    const Tensor masked_self = masked_fill(self, eq(self, 0), 1);
    const Tensor self_result = scatter_reduce(masked_self, d, index, src, reduce, include_self);
    const Tensor src_zero = eq(src, 0);
    const Tensor zeros_here = scatter_add(zeros_like(self), d, index, src_zero.to(self.dtype()));
    const Tensor single_zero = logical_and(src_zero, eq(gather(zeros_here, d, index), 1));
    const Tensor masked_src = masked_fill(src, single_zero, 1);
    const Tensor src_result = scatter_reduce(self, d, index, masked_src, reduce, include_self);
    return {g * self_result / masked_self,
            where(single_zero, gather(g * src_result, d, index),
                  gather(g * result, d, index) / masked_fill(src, src_zero, 1))};
  }
  // amax, amin: shared evenly among the values equal to the result.
  const Tensor value = gather(result, d, index);
  const Tensor self_is = eq(self, result), src_is = eq(src, value);
  const Tensor count = scatter_add(self_is.to(g.dtype()), d, index, src_is.to(g.dtype()));
  const Tensor share = g / count;
  return {self_is * share, src_is * gather(share, d, index)};
}

// The table op on checked operands (d wrapped, src of index's shape): recorded or computed, with
// its autograd node.
Tensor scatter_node(const char* op, const Tensor& self, int64_t d, const Tensor& index,
                    const Tensor& src, const std::string& reduce, bool include_self) {
  const int64_t size = self.dim() == 0 ? 1 : self.size(d);
  const std::vector<int64_t> idx = detail::read_indices(
      index, size, op, "dimension " + std::to_string(d) + " of " + describe(self));
  Tensor out = detail::should_record({self, index, src})
                   ? detail::lazy_record1(scatter_def, {self, index, src},
                                          {d, reduce, include_self}, {self.sizes(), self.dtype()})
                   : scatter_on(self, d, idx, index, src, reduce, include_self);
  if (!detail::needs_grad(self, src)) return out;
  const bool assigns = reduce == "none";
  detail::record(op, {self, index, src}, {out},
                 assigns ? std::vector<Tensor>{index} : std::vector<Tensor>{index, self, src, out},
                 [d, reduce, include_self, assigns](const detail::BackwardContext& c) {
                   const Tensor& g = c.grad();
                   const Tensor& index = c.saved(0);
                   std::vector<Tensor> grads =
                       assigns ? std::vector<Tensor>{g, gather(g, d, index)}
                               : reduce_grads(g, c.saved(1), d, index, c.saved(2), c.saved(3),
                                              reduce, include_self);
                   // Positions written by src (or not including self) pass nothing back to self.
                   if (assigns || !include_self) grads[0] = scatter(grads[0], d, index, 0);
                   return std::vector<Tensor>{grads[0], Tensor(), grads[1]};
                 });
  return out;
}

// index (1-D or 0-dim) viewed along dim d of a rank-`rank` tensor and expanded to `shape`.
Tensor along_dim(const Tensor& index, int64_t d, int64_t rank, const Shape& shape) {
  Shape view(static_cast<size_t>(rank), 1);
  view[static_cast<size_t>(d)] = index.numel();
  return index.reshape(view).expand(shape);
}

// The checks of index_copy and index_fill: a 1-D (or 0-dim) int64 index of positions along dim,
// read to check their range. Returns dim wrapped.
int64_t check_index_along(const char* op, const Tensor& self, int64_t dim, const Tensor& index) {
  detail::check_defined(self, op, "self");
  detail::check_defined(index, op, "index");
  detail::check_index_dtype(index, op, false);
  KILN_CHECK(index.dim() <= 1, op, ": index must be a 1-D vector, got ", describe(index));
  KILN_CHECK(index.device() == self.device() || (index.device().is_cpu() && index.dim() == 0), op,
             ": expected all tensors on one device, got ", describe(self), " on ", self.device(),
             " and ", describe(index), " on ", index.device());
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(self.dim(), 1), op, &self);
  const int64_t size = self.dim() == 0 ? 1 : self.size(d);
  detail::read_indices(index, size, op, "dimension " + std::to_string(d) + " of " + describe(self));
  return d;
}
}  // namespace

void registration::register_scatter_ops() {
  detail::OpDef def{
      "scatter",
      detail::OpKind::Index,
      3,
      detail::DTypeRule::Same,
      true,
      [](const std::vector<Tensor>& in, const detail::Attrs& a) {
        const std::string& reduce = detail::attr_string(a.at(1));
        const int64_t d = detail::attr_int(a.at(0));
        return std::vector<Tensor>{reduce == "none" ? scatter(in[0], d, in[1], in[2])
                                                    : scatter_reduce(in[0], d, in[1], in[2], reduce,
                                                                     detail::attr_bool(a.at(2)))};
      },
      {"dim", "reduce", "include_self"}};
  def.checks_integer_values = true;  // indices out of range raise
  scatter_def.bind(detail::register_op(std::move(def)));
}

Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const auto [d, s] = detail::check_scatter("scatter", self, dim, index, src);
  return scatter_node("scatter", self, d, index, s, "none", true);
}

Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value) {
  detail::check_defined(self, "scatter", "self");
  detail::check_defined(index, "scatter", "index");
  detail::check_value_fits("scatter", value, self.dtype(), self);
  const Tensor src =
      full({}, value, TensorOptions(self.dtype()).device(self.device())).expand(index.sizes());
  return scatter(self, dim, index, src);
}

Tensor scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const std::string& reduce, bool include_self) {
  const char* op = "scatter_reduce";
  const auto [d, s] = detail::check_scatter(op, self, dim, index, src);
  KILN_CHECK(reduce == "sum" || reduce == "prod" || reduce == "mean" || reduce == "amax" ||
                 reduce == "amin",
             op, ": reduce must be one of sum, prod, mean, amax and amin, got \"", reduce, "\"");
  KILN_CHECK(reduce != "mean" || self.dtype() != kBool, op, ": mean of a bool tensor ",
             describe(self), " is not supported");
  if (reduce != "sum" && reduce != "mean")
    return scatter_node(op, self, d, index, s, reduce, include_self);
  // sum: scatter_add into self, whose scattered positions are cleared when it is not included.
  const Tensor base = include_self ? self : scatter(self, d, index, 0);
  const Tensor total = scatter_add(base, d, index, s);
  if (reduce == "sum") return total;
  // mean: the sum divided by how many values each position took (at least 1), rounding down for
  // integers (torch's).
  Tensor count =
      scatter_add(include_self ? ones_like(self) : zeros_like(self), d, index, ones_like(s));
  count = masked_fill(count, eq(count, 0), 1);
  return self.is_floating_point() ? div(total, count) : div(total, count, "floor");
}

Tensor index_copy(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  const char* op = "index_copy";
  detail::check_defined(source, op, "source");
  const int64_t d = check_index_along(op, self, dim, index);
  const Shape s1 = self.dim() == 0 ? Shape{1} : self.sizes();
  Shape expected = s1;
  expected[static_cast<size_t>(d)] = index.numel();
  const Shape src1 = source.dim() == 0 ? Shape{1} : source.sizes();
  KILN_CHECK(src1 == expected && source.dtype() == self.dtype(), op, ": source ", describe(source),
             " must have the dtype of self ", describe(self), " and its shape with dimension ", d,
             " of the index's size ", index.numel());
  const Tensor positions =
      along_dim(index.to(self.device()), d, static_cast<int64_t>(s1.size()), expected);
  return scatter(self.reshape(s1), d, positions, source.reshape(expected)).reshape(self.sizes());
}

Tensor index_fill(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& value) {
  const char* op = "index_fill";
  detail::check_defined(value, op, "value");
  KILN_CHECK(value.dim() == 0, op, ": only a 0-dim value tensor is supported, got ",
             describe(value), " (self ", describe(self), ")");
  const int64_t d = check_index_along(op, self, dim, index);
  // The filled rows as a mask (repeated indices fill once, so the value's gradient counts each
  // filled element once, as torch's).
  const int64_t size = self.dim() == 0 ? 1 : self.size(d);
  const Tensor rows = scatter(zeros({size}, TensorOptions(kBool).device(self.device())), 0,
                              index.to(self.device()).reshape({-1}), true);
  const int64_t rank = std::max<int64_t>(self.dim(), 1);
  const Shape s1 = self.dim() == 0 ? Shape{1} : self.sizes();
  const Tensor mask = along_dim(rows, d, rank, s1).reshape(self.sizes());
  return where(mask, value.to(self.device()).to(self.dtype()), self);
}

Tensor index_fill(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value) {
  detail::check_defined(self, "index_fill", "self");
  detail::check_value_fits("index_fill", value, self.dtype(), self);
  return index_fill(self, dim, index, full({}, value, TensorOptions(self.dtype())));
}

Tensor masked_scatter(const Tensor& self, const Tensor& mask, const Tensor& source) {
  const char* op = "masked_scatter";
  detail::check_defined(self, op, "self");
  detail::check_defined(mask, op, "mask");
  detail::check_defined(source, op, "source");
  KILN_CHECK(mask.dtype() == kBool, op, ": expected a bool mask, got ", describe(mask), " (self ",
             describe(self), ")");
  KILN_CHECK(source.dtype() == self.dtype(), op, ": source ", describe(source),
             " must have the dtype of self ", describe(self));
  KILN_CHECK(mask.device() == self.device() && source.device() == self.device(), op,
             ": expected all tensors on one device, got ", describe(self), " on ", self.device(),
             ", mask on ", mask.device(), " and source on ", source.device());
  const Shape shape = detail::broadcast_shapes(self.sizes(), mask.sizes(), op);
  const Tensor flat_mask = mask.expand(shape).reshape({-1});
  {
    detail::ValueCheckScope checking;  // checked again by gather on every replay of a trace
    const int64_t count = count_nonzero(flat_mask).item<int64_t>();
    KILN_CHECK(count <= source.numel(), op, ": mask ", describe(mask), " selects ", count,
               " elements, but source ", describe(source), " has only ", source.numel());
  }
  // source after one zero, read at the running count of selected elements: the k-th selected one
  // reads source's k-th, an unselected one before the first the zero (every one, when source is
  // empty). A replay selecting more than source holds reads past the end, which gather raises.
  const Tensor place = cumsum(flat_mask, 0);
  const Tensor padded = cat(
      {zeros({1}, TensorOptions(source.dtype()).device(source.device())), source.reshape({-1})});
  return where(mask.expand(shape), gather(padded, 0, place).reshape(shape), self.expand(shape));
}

Tensor take(const Tensor& self, const Tensor& index) {
  const char* op = "take";
  detail::check_defined(self, op, "self");
  detail::check_defined(index, op, "index");
  detail::check_index_dtype(index, op, false);
  const int64_t n = self.numel();
  {
    detail::ValueCheckScope checking;  // checked again by index_select on every replay
    for (int64_t v : index.to_vector<int64_t>())
      KILN_CHECK(v >= -n && v < n, op, ": index ", v, " is out of range for ", describe(self),
                 " with ", n, " elements (valid range [", -n, ", ", n, "))");
  }
  // Negative positions count from the end.
  const Tensor flat_index = index.reshape({-1});
  const Tensor positions = where(lt(flat_index, 0), flat_index + n, flat_index);
  return index_select(self.reshape({-1}), 0, positions).reshape(index.sizes());
}

// torch's take_along_dim: gather along dim of self and indices broadcast to each other in every
// other dim; without a dim, the flattened self at the flattened indices.
Tensor take_along_dim(const Tensor& self, const Tensor& indices, std::optional<int64_t> dim) {
  const char* op = "take_along_dim";
  detail::check_defined(self, op, "self");
  detail::check_defined(indices, op, "indices");
  detail::check_index_dtype(indices, op, false);
  if (!dim) return gather(self.reshape({-1}), 0, indices.reshape({-1}));
  KILN_CHECK(self.dim() == indices.dim(), op,
             ": input and indices should have the same number of dimensions, got ", describe(self),
             " and ", describe(indices));
  const int64_t d = detail::wrap_dim(*dim, std::max<int64_t>(self.dim(), 1), op, &self);
  if (self.dim() == 0) return gather(self, 0, indices);
  Shape self_sizes = self.sizes(), index_sizes = indices.sizes();
  self_sizes[static_cast<size_t>(d)] = indices.size(d);
  index_sizes[static_cast<size_t>(d)] = self.size(d);
  return gather(self.expand(detail::broadcast_shapes(index_sizes, self.sizes(), op)), d,
                indices.expand(detail::broadcast_shapes(self_sizes, indices.sizes(), op)));
}

}  // namespace kiln
