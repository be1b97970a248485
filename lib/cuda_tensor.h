// CUDA tensors: device storage from the caching allocator, and copies between host and device
// staged through pinned host buffers. Every entry raises kiln::Error (naming the op) on a machine
// where CUDA is unavailable, before anything is allocated.
#pragma once

#include "kiln/tensor.h"

namespace kiln::detail {

// An uninitialized contiguous tensor on `device` (CPU or CUDA).
Tensor make_empty_on(const Shape& shape, DType dtype, Device device);
// `src`'s values in a new contiguous tensor on `device`, of src's dtype; src is materialized
// first. Synchronous: the result is complete when it returns (as torch's non_blocking=False).
Tensor copy_to_device(const Tensor& src, Device device);
// Writes host tensor `src` (dst's shape) into `dst`, a tensor or view on any device.
void copy_into(const Tensor& dst, const Tensor& src);
// Runs every pending CUDA copy and kernel on the tensor's device (a no-op for CPU tensors).
void synchronize_device(const Tensor& t);

}  // namespace kiln::detail
