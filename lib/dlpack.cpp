// DLPack export and import: kiln tensors and other libraries' tensors viewing the same memory.
//
// Ownership follows the DLPack contract. Exported: the DLManagedTensor's manager_ctx holds a
// kiln handle to the tensor (so to its storage); the consumer's single call of the deleter drops
// it, and the memory goes when kiln's last handle goes too. Imported: the storage's deleter calls
// the producer's deleter, so it runs once, when the last kiln tensor or view of it goes away.
#include "kiln/dlpack.h"

#include <cstdint>
#include <memory>

#include "lib/cuda_driver.h"
#include "lib/int_math.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;

namespace {

// DLPack 0.8's kDLBool, which the 0.6 header Debian ships lacks.
constexpr uint8_t kDLBoolCode = 6;

DLDataType dl_dtype(DType t) {
  switch (t) {
    // As libtorch 1.13 exports bool (DLPack 0.6 has no bool code), so at::fromDLPack reads it.
    case kBool:
      return {kDLUInt, 8, 1};
    case kInt32:
      return {kDLInt, 32, 1};
    case kInt64:
      return {kDLInt, 64, 1};
    case kFloat32:
      return {kDLFloat, 32, 1};
    case kFloat64:
      return {kDLFloat, 64, 1};
  }
  KILN_FAIL("to_dlpack: unknown dtype");
}

DType kiln_dtype(DLDataType d) {
  KILN_CHECK(d.lanes == 1, "from_dlpack: vector dtypes (lanes ", d.lanes, ") are not supported");
  if (d.code == kDLInt && d.bits == 32) return kInt32;
  if (d.code == kDLInt && d.bits == 64) return kInt64;
  if (d.code == kDLFloat && d.bits == 32) return kFloat32;
  if (d.code == kDLFloat && d.bits == 64) return kFloat64;
  if (d.code == kDLBoolCode && d.bits == 8) return kBool;
  KILN_FAIL("from_dlpack: unsupported dtype (code ", static_cast<int>(d.code), ", ",
            static_cast<int>(d.bits),
            " bits): kiln has bool (DLPack's kDLBool), int32, int64, float32 and float64; uint8 "
            "(kDLUInt 8, also libtorch 1.13's bool) and float16 have no kiln dtype");
}

Device kiln_device(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: the host reads it as any other
      return kCPU;
    case kDLCUDA:
      return Device(DeviceType::CUDA, d.device_id);
    default:
      KILN_FAIL("from_dlpack: unsupported device type ", static_cast<int>(d.device_type),
                " (kiln reads kDLCPU, kDLCUDAHost and kDLCUDA)");
  }
}

// What an exported DLManagedTensor points into: the tensor it keeps alive and the arrays its
// DLTensor's shape and strides point to.
struct Export {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  KILN_CHECK(t.defined(), "to_dlpack: the tensor is undefined");
  auto e = std::make_unique<Export>();
  e->tensor = t.detach();
  e->shape = t.sizes();
  e->strides = t.strides();
  DLTensor& dl = e->managed.dl_tensor;
  // The first element's address (a pending tensor is computed here; a device's queued work is
  // waited for, as DLPack 0.6 has no stream to hand over).
  dl.data = e->tensor.raw_data_ptr();
  dl.byte_offset = 0;
  const Device device = t.device();
  dl.device = {device.is_cuda() ? kDLCUDA : kDLCPU, device.index};
  dl.ndim = static_cast<int>(t.dim());
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  e->managed.manager_ctx = e.get();
  e->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<Export*>(self->manager_ctx);
  };
  return &e.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  KILN_CHECK(managed != nullptr, "from_dlpack: the DLManagedTensor is null");
  const DLTensor& dl = managed->dl_tensor;
  const DType dtype = kiln_dtype(dl.dtype);
  const Device device = kiln_device(dl.device);
  if (device.is_cuda()) detail::cuda::require_device(device.index, "from_dlpack");
  KILN_CHECK(dl.ndim >= 0 && (dl.ndim == 0 || dl.shape != nullptr), "from_dlpack: invalid ndim ",
             dl.ndim, " or null shape");
  const Shape sizes(dl.shape, dl.shape + dl.ndim);
  for (int64_t s : sizes) KILN_CHECK(s >= 0, "from_dlpack: negative size in ", shape_str(sizes));
  const Shape strides =
      dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : detail::contiguous_strides(sizes);
  for (int64_t s : strides)
    KILN_CHECK(s >= 0, "from_dlpack: negative stride in ", shape_str(strides),
               " (kiln's tensors have none)");
  const int64_t numel = detail::checked_numel(sizes, "from_dlpack");
  const int64_t extent =
      numel == 0 ? 1 : detail::checked_last_element(sizes, strides, 0, "from_dlpack") + 1;
  char* data = static_cast<char*>(dl.data) + dl.byte_offset;
  KILN_CHECK(numel == 0 || data != nullptr, "from_dlpack: null data for shape ", shape_str(sizes));
  KILN_CHECK(reinterpret_cast<uintptr_t>(data) % element_size(dtype) == 0,
             "from_dlpack: data + byte_offset is not aligned to ", dtype_name(dtype));

  // From here nothing throws before the storage owns `managed`.
  auto storage = std::make_shared<detail::Storage>();
  storage->data = data;
  storage->nbytes = detail::checked_nbytes(extent, dtype, "from_dlpack", sizes);
  storage->device = device;
  storage->deleter = [managed](void*) {
    if (managed->deleter) managed->deleter(managed);
  };
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = sizes;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace kiln
