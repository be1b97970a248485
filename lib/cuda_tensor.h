// CUDA tensors: device storage from the caching allocator, and copies between host and device
// staged through pinned host buffers. Every entry raises kiln::Error (naming the op) on a machine
// where CUDA is unavailable, before anything is allocated.
#pragma once

#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::detail {

// An uninitialized contiguous tensor on `device` (CPU or CUDA).
Tensor make_empty_on(const Shape& shape, DType dtype, Device device);
// `src`'s values in a new contiguous tensor on `device`, of src's dtype; src is materialized
// first. Synchronous: the result is complete when it returns (as torch's non_blocking=False).
Tensor copy_to_device(const Tensor& src, Device device);
// Writes host tensor `src` (dst's shape) into `dst`, a tensor or view on any device.
void copy_into(const Tensor& dst, const Tensor& src);
// Kernels of a device that lib/ calls but does not define (lib/ does not depend on fuser/): the
// CUDA code generator fills them in at load (exec/init.cpp). Each returns false when it declines
// (then the copy or op goes through the host); a null entry declines too.
struct DeviceKernels {
  // A copy within one device: dst = src converted to dst's dtype, src broadcast to dst's shape,
  // any layouts.
  bool (*copy)(const Tensor& dst, const Tensor& src) = nullptr;
  // index_select (select: index 1-D along dim) and gather: out is contiguous and the indices were
  // checked.
  bool (*gather)(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index,
                 bool select) = nullptr;
  // index_add (select: index 1-D along dim, src has its idx.size() entries there) and scatter_add
  // (the index of index_sizes, src of that shape): out (contiguous, self's shape) = self plus src
  // added at the checked indices idx (row-major), in the CPU kernels' order.
  bool (*scatter_add)(const Tensor& out, const Tensor& self, int64_t dim,
                      const std::vector<int64_t>& idx, const Shape& index_sizes, const Tensor& src,
                      bool select) = nullptr;
  // A hand-written kernel (`extern "C" __global__ void <name>(...)` in `source`) compiled by NVRTC
  // and cached as the generated kernels are, loaded on `device`: its function handle (for
  // cuda::launch). Hand-written library kernels (lib/ops/conv_cuda.cpp) reach NVRTC through it.
  void* (*source_kernel)(const std::string& name, const std::string& source, int device) = nullptr;
};
DeviceKernels& device_kernels();
// Runs every pending CUDA copy and kernel on the tensor's device (a no-op for CPU tensors).
void synchronize_device(const Tensor& t);

}  // namespace kiln::detail
