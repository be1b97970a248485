// CUDA tensors: device storage and host<->device copies (see lib/cuda_tensor.h).
//
// Copies go through pinned staging buffers in chunks: pageable memory cannot be read by the
// device's copy engine directly (the driver would stage it itself, through a small bounce buffer,
// at a fraction of the bus's bandwidth). Each chunk's copy is waited for before the buffer is
// refilled; a copy is synchronous as a whole, like torch's non_blocking=False.
#include "lib/cuda_tensor.h"

#include <algorithm>
#include <cstring>

#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_memory.h"
#include "lib/int_math.h"
#include "lib/pool.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

namespace {
constexpr size_t kStagingChunk = size_t{32} << 20;

struct Pinned {
  void* p;
  explicit Pinned(size_t n) : p(cuda::pinned_alloc(n)) {}
  ~Pinned() { cuda::pinned_free(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
};

// The byte range of t's storage that its elements lie in: [first, first + count) elements.
void element_span(const Tensor& t, int64_t* first, int64_t* count) {
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < t.sizes().size(); ++d) {
    const int64_t extent = (t.sizes()[d] - 1) * t.strides()[d];
    (extent < 0 ? lo : hi) += extent;
  }
  *first = t.storage_offset() + lo;
  *count = t.numel() == 0 ? 0 : hi - lo + 1;
}

void host_to_device(int device, void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  Pinned staging(std::min(nbytes, kStagingChunk));
  for (size_t done = 0; done < nbytes; done += kStagingChunk) {
    const size_t n = std::min(kStagingChunk, nbytes - done);
    std::memcpy(staging.p, static_cast<const char*>(src) + done, n);
    cuda::copy_to_device(device, static_cast<char*>(dst) + done, staging.p, n);
    cuda::synchronize(device);
  }
}

void device_to_host(int device, void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  Pinned staging(std::min(nbytes, kStagingChunk));
  for (size_t done = 0; done < nbytes; done += kStagingChunk) {
    const size_t n = std::min(kStagingChunk, nbytes - done);
    cuda::copy_to_host(device, staging.p, static_cast<const char*>(src) + done, n);
    cuda::synchronize(device);
    std::memcpy(static_cast<char*>(dst) + done, staging.p, n);
  }
}
}  // namespace

Tensor make_empty_on(const Shape& shape, DType dtype, Device device) {
  if (device.is_cpu()) return make_empty(shape, dtype);
  cuda::require_device(device.index, "empty");
  for (int64_t s : shape)
    KILN_CHECK(s >= 0, "empty: negative dimension in shape ", shape_str(shape));
  auto storage = std::make_shared<Storage>();
  const size_t nbytes = checked_nbytes(checked_numel(shape, "empty"), dtype, "empty", shape);
  const int index = device.index;
  storage->data = cuda::device_alloc(index, nbytes);
  storage->nbytes = nbytes;
  storage->device = device;
  storage->deleter = [index](void* p) { cuda::device_free(index, p); };
  storage->owns_allocation = true;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor copy_to_device(const Tensor& src, Device device) {
  check_defined(src, "to");
  if (device.is_cuda())
    cuda::require_device(device.index,
                         ("to: copying " + describe(src) + " from " + src.device().str()).c_str());
  const Device from = src.device();
  if (from.is_cpu()) {
    const Tensor c = src.contiguous();
    Tensor out = make_empty_on(c.sizes(), c.dtype(), device);
    host_to_device(device.index, out.impl()->storage->data, c.raw_data_ptr(),
                   static_cast<size_t>(c.numel()) * element_size(c.dtype()));
    return out;
  }
  // From the device: bring the span of storage the elements lie in to the host, and lay it out
  // there (a view of a larger buffer copies only its span).
  int64_t first = 0, count = 0;
  element_span(src, &first, &count);
  const size_t esize = element_size(src.dtype());
  Tensor span = make_empty({count}, src.dtype());
  (void)src.impl()->data();  // materializes a pending value
  synchronize_device(src);
  device_to_host(from.index, span.impl()->storage->data,
                 static_cast<const char*>(src.impl()->storage->data) + first * int64_t(esize),
                 static_cast<size_t>(count) * esize);
  Tensor host = make_view(span, src.sizes(), src.strides(), src.storage_offset() - first);
  host = host.contiguous();
  return device.is_cpu() ? host : copy_to_device(host, device);
}

void copy_into(const Tensor& dst, const Tensor& from) {
  const Tensor src =
      (from.device().is_cpu() ? from : copy_to_device(from, kCPU)).expand(dst.sizes());
  if (dst.device().is_cpu()) {
    copy_kernel(dst, src);
    return;
  }
  const int index = dst.device().index;
  const size_t esize = element_size(dst.dtype());
  char* base = static_cast<char*>(dst.impl()->storage->data);
  if (dst.is_contiguous()) {
    Tensor c = src.to(dst.dtype()).contiguous();
    host_to_device(index, base + dst.storage_offset() * int64_t(esize), c.raw_data_ptr(),
                   static_cast<size_t>(c.numel()) * esize);
    return;
  }
  // A strided view: the values go over contiguous, and the device's copy kernel writes them into
  // the view; where it declines, the view's span comes to the host, is written there, and goes
  // back.
  if (const auto device_copy = device_kernels().copy) {
    const Tensor staged = copy_to_device(src.to(dst.dtype()).contiguous(), dst.device());
    if (device_copy(dst, staged)) return;
  }
  int64_t first = 0, count = 0;
  element_span(dst, &first, &count);
  Tensor span = make_empty({count}, dst.dtype());
  device_to_host(index, span.impl()->storage->data, base + first * int64_t(esize),
                 static_cast<size_t>(count) * esize);
  copy_kernel(make_view(span, dst.sizes(), dst.strides(), dst.storage_offset() - first), src);
  host_to_device(index, base + first * int64_t(esize), span.impl()->storage->data,
                 static_cast<size_t>(count) * esize);
}

DeviceKernels& device_kernels() {
  static DeviceKernels kernels;  // filled once by exec/init.cpp while kiln loads, then read-only
  return kernels;
}

void synchronize_device(const Tensor& t) {
  if (t.defined() && t.device().is_cuda()) cuda::synchronize(t.device().index);
}

}  // namespace kiln::detail
