// Checks and the CPU scatter kernel shared by the indexing ops (lib/ops/index_common.h).
#include "lib/ops/index_common.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "kiln/ops.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

void check_index_device(const char* op, const Tensor& self, const Tensor& index,
                        const Tensor& src) {
  const bool number = index.device().is_cpu() && index.dim() == 0;
  for (const Tensor* t : {&index, &src}) {
    if (t == &index && number) continue;
    KILN_CHECK(t->device() == self.device(), op, ": expected all tensors on one device, got ",
               describe(self), " on ", self.device(), " and ", describe(*t), " on ", t->device());
  }
}

void check_index_dtype(const Tensor& index, const char* op, bool allow_int32) {
  bool ok = index.dtype() == kInt64 || (allow_int32 && index.dtype() == kInt32);
  KILN_CHECK(ok, op, ": expected ", allow_int32 ? "an int32 or int64" : "an int64",
             " index tensor, got ", describe(index));
}

// The values are read through the const accessor: a read must not flush pending work that reads
// the index (as a write would).
std::vector<int64_t> read_indices(const Tensor& index, int64_t size, const char* op,
                                  const std::string& what) {
  ValueCheckScope checking;
  MaterializeCause cause(op);
  materialize({index}, "an op that checks its operand's values");
  Tensor c;
  {
    RecordingOff eager;                          // reading an index runs its conversions at once
    c = index.to(kCPU).to(kInt64).contiguous();  // a device index's values come to the host
  }
  const int64_t* p = std::as_const(c).data_ptr<int64_t>();
  std::vector<int64_t> v(p, p + c.numel());
  for (int64_t x : v) {
    KILN_CHECK(x >= 0 && x < size, op, ": index ", x, " is out of range for ", what, " of size ",
               size, " (valid range [0, ", size, "))");
  }
  return v;
}

ScatterOperands check_scatter(const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                              const Tensor& src) {
  check_defined(self, op, "self");
  check_defined(index, op, "index");
  check_defined(src, op, "src");
  check_index_device(op, self, index, src);
  check_index_dtype(index, op, false);
  KILN_CHECK(src.dtype() == self.dtype(), op, ": src ", describe(src),
             " must have the dtype of self ", describe(self));
  const int64_t rank = std::max<int64_t>(self.dim(), 1);
  KILN_CHECK(index.dim() == self.dim() && src.dim() == self.dim(), op, ": index ", describe(index),
             " and src ", describe(src), " must have the number of dimensions of self ",
             describe(self));
  const int64_t d = wrap_dim(dim, rank, op, &self);
  // A 0-dim tensor counts as [1].
  const Shape is = index.dim() == 0 ? Shape{1} : index.sizes();
  Tensor narrowed = src.dim() == 0 ? src.reshape({1}) : src;
  for (int64_t k = 0; k < rank; ++k) {
    KILN_CHECK(is[k] <= narrowed.size(k), op, ": index ", describe(index),
               " must not be larger than src ", describe(src), " in dimension ", k);
    KILN_CHECK(k == d || is[k] <= self.size(k), op, ": index ", describe(index),
               " must not be larger than self ", describe(self), " in dimension ", k,
               " (apart from dimension ", d, ")");
    if (is[k] < narrowed.size(k)) narrowed = narrowed.narrow(k, 0, is[k]);
  }
  return {d, narrowed.reshape(index.sizes())};
}

namespace {
template <typename T>
T combine(T old, T v, ScatterMode mode) {
  switch (mode) {
    case ScatterMode::Add:
      return T(old + v);
    case ScatterMode::Assign:
      return v;
    case ScatterMode::Multiply:
      return T(old * v);
    case ScatterMode::Max:
      if constexpr (std::is_floating_point_v<T>)
        if (std::isnan(v)) return v;
      return v > old ? v : old;  // an old NaN stays
    case ScatterMode::Min:
      if constexpr (std::is_floating_point_v<T>)
        if (std::isnan(v)) return v;
      return v < old ? v : old;
  }
  return old;
}
}  // namespace

Tensor scatter_values(const Tensor& self, int64_t d, const std::vector<int64_t>& idx,
                      const Shape& index_shape, const Tensor& src, ScatterMode mode,
                      bool include_self) {
  Tensor out = make_empty(self.sizes(), self.dtype());
  copy_kernel(out, self);
  Tensor in = src.contiguous();
  const Shape& os = out.strides();
  dispatch_all(self.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* o = out.data_ptr<T>();
    const T* sp = std::as_const(in).data_ptr<T>();
    std::vector<int64_t> pos(index_shape.size(), 0);
    std::vector<bool> written(include_self ? 0 : static_cast<size_t>(out.numel()), false);
    for (size_t p = 0; p < idx.size(); ++p) {
      int64_t at = 0;
      for (size_t k = 0; k < pos.size(); ++k)
        at += (static_cast<int64_t>(k) == d ? idx[p] : pos[k]) * os[k];
      if (!include_self && !written[at]) {  // out is contiguous: `at` is its element's number
        written[at] = true;
        o[at] = sp[p];
      } else {
        o[at] = combine(o[at], sp[p], mode);
      }
      for (size_t k = pos.size(); k-- > 0;) {  // row-major odometer over index's shape
        if (++pos[k] < index_shape[k]) break;
        pos[k] = 0;
      }
    }
  });
  return out;
}

}  // namespace kiln::detail
