// CUDA tensors: device storage from the caching allocator, and copies between host and device
// staged through pinned host buffers. Every entry raises kiln::Error (naming the op) on a machine
// where CUDA is unavailable, before anything is allocated.
#pragma once

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
// A copy within one device by a kernel of the device (the CUDA code generator registers it at
// load time: lib/ does not depend on fuser/): dst = src converted to dst's dtype, src broadcast to
// dst's shape, any layouts. Returns false when it declines (then copies go through the host).
using DeviceCopy = bool (*)(const Tensor& dst, const Tensor& src);
void set_device_copy(DeviceCopy copy);
DeviceCopy device_copy();
// index_select (select: index 1-D along dim) and gather on a device by a kernel of the device,
// registered by the CUDA code generator; out is contiguous and the indices were checked. Returns
// false when it declines (then the op runs through the host).
using DeviceGather = bool (*)(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index,
                              bool select);
void set_device_gather(DeviceGather gather);
DeviceGather device_gather();
// index_add (select: index 1-D along dim, src has its idx.size() entries there) and scatter_add
// (the index of index_sizes, src of that shape) on a device by a kernel of the device, registered
// by the CUDA code generator: out (contiguous, self's shape) = self plus src added at the checked
// indices idx (row-major), in the CPU kernels' order. Returns false when it declines (then the op
// runs through the host).
using DeviceScatterAdd = bool (*)(const Tensor& out, const Tensor& self, int64_t dim,
                                  const std::vector<int64_t>& idx, const Shape& index_sizes,
                                  const Tensor& src, bool select);
void set_device_scatter_add(DeviceScatterAdd scatter_add);
DeviceScatterAdd device_scatter_add();
// Runs every pending CUDA copy and kernel on the tensor's device (a no-op for CPU tensors).
void synchronize_device(const Tensor& t);

}  // namespace kiln::detail
