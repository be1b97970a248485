// TensorImpl and Storage: the data behind a kiln::Tensor handle, plus shape helpers used by every
// op.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "lib/lazy.h"

namespace kiln::detail {

struct AutogradMeta;

// A block of memory. Views share one Storage; the deleter runs when the last of them goes.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device = kCPU;
  std::function<void(void*)> deleter;
  // The buffer came from kiln's allocator (not a user's from_blob memory), so it may be handed
  // from one Storage to another.
  bool owns_allocation = false;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (deleter) deleter(data);
  }
  // Bumped by every in-place write so that saved tensors can detect they were modified.
  std::atomic<uint64_t> version{0};
  // Pending: the node output whose value will fill this storage (see lib/lazy.h). In trace mode
  // it may also be set on a concrete storage: the value written into it by the traced function.
  // Read and written under the lazy lock (set_storage_lazy); `pending` says whether it is set, for
  // the data path's check without the lock (released after the data is in place).
  LazyRef lazy;
  std::atomic<bool> pending{false};
  // Bumped whenever `lazy` changes, so views can tell their cached node is stale.
  uint64_t lazy_generation = 0;
  // Uncomputed nodes holding this storage as a concrete input: writes must flush them first.
  std::atomic<int64_t> lazy_readers{0};
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape sizes;
  Shape strides;  // in elements
  DType dtype = kFloat32;
  // A 0-dim tensor made from a C++ number: it takes the lowest priority in type promotion.
  bool wrapped_number = false;
  std::shared_ptr<AutogradMeta> autograd;
  // For views: the tensor (never itself a view) whose storage this one looks into. An in-place
  // write through the view rewrites the base's history; the view's own history is rebuilt from
  // the base's when the storage version moved past view_version and view_tracks_base is set.
  std::shared_ptr<TensorImpl> view_base;
  uint64_t view_version = 0;
  bool view_tracks_base = false;
  // For a tensor over a pending storage: its own value as a node output (a view node for views),
  // valid while lazy_generation matches the storage's.
  LazyRef lazy;
  uint64_t lazy_generation = 0;

  int64_t numel() const;
  char* data() {
    if (storage->pending.load(std::memory_order_acquire)) materialize_storage(*this);
    return static_cast<char*>(storage->data) + offset * static_cast<int64_t>(element_size(dtype));
  }
  Device device() const { return storage->device; }
};

inline bool is_pending(const Tensor& t) {
  return t.defined() && t.impl()->storage->pending.load(std::memory_order_acquire);
}

// Allocates a contiguous tensor (64-byte aligned, uninitialized).
Tensor make_empty(const Shape& shape, DType dtype);
// Allocates a tensor laid out with the given strides (non-overlapping), uninitialized.
Tensor make_empty_strided(const Shape& shape, const Shape& strides, DType dtype,
                          Device device = kCPU);
// The same, zero-filled.
Tensor make_zeros_strided(const Shape& shape, const Shape& strides, DType dtype,
                          Device device = kCPU);
// g's values laid out with `strides` (g itself when they are contiguous and g is); `origin`
// receives the storage offset of its first element. Geometry computed relative to a tensor with
// those strides then addresses the same elements of the result.
Tensor with_layout(const Tensor& g, const Shape& strides, int64_t* origin);
// A view of `base`'s storage with new geometry (recorded as a view of base's base, for
// autograd).
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);
Tensor wrap_scalar(const Scalar& s);  // 0-dim wrapped-number tensor

Shape contiguous_strides(const Shape& sizes);
int64_t shape_numel(const Shape& sizes);
bool is_contiguous_layout(const Shape& sizes, const Shape& strides);
// Wraps a possibly negative dim into [0, ndim); the error names the op and, when given, the input.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op, const Tensor* input = nullptr);
// numpy broadcasting of two shapes; the error names the op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Strides that read `t` as if expanded to `shape` (0 where broadcast); `shape` must be a broadcast
// of it.
Shape broadcast_strides(const Tensor& t, const Shape& shape);
// True when writing `a` may change what `b` reads (they share storage, and are not the same view).
bool may_overlap(const Tensor& a, const Tensor& b);
// dst[i] = src[i] converted to dst's dtype, src broadcast to dst's shape; they must not overlap.
void copy_kernel(const Tensor& dst, const Tensor& src);
// Bumps the version counter of `t`'s storage after an in-place write.
void bump_version(const Tensor& t);

std::string shape_str(const Shape& s);  // "[2, 3]"
std::string describe(const Tensor& t);  // "float32[2, 3]", or "undefined"

// The common dtype of operands as torch computes it: tensors with dims rank above 0-dim tensors,
// which rank above wrapped numbers; a lower tier only counts when it is of a higher category.
DType result_type(const std::vector<Tensor>& operands);
DType result_type(const Tensor& a, const Tensor& b);  // no allocation: the binary ops' hot path
DType result_type(const Tensor* const* operands, size_t count);
// The same from what the rule reads of each operand (the fuser's, for values of a graph).
struct PromotionOperand {
  DType dtype;
  bool zero_dim;  // a 0-dim tensor
  bool wrapped;   // a wrapped number (x * 2.5)
};
DType result_type(const PromotionOperand* operands, size_t count);

void check_defined(const Tensor& t, const char* op, const char* arg = "input");
void check_cpu(const Tensor& t, const char* op);

}  // namespace kiln::detail
