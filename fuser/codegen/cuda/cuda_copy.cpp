// A copy within a device as a generated kernel (the device_kernels().copy hook of lib/).
#include <vector>

#include "fuser/codegen/cuda/cuda_kernel.h"
#include "fuser/fuse.h"
#include "lib/cuda_tensor.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser::cuda {

namespace {
// A copy within a device as a generated kernel of one load (and a cast): the same code path as a
// fused group's, so it is cached and specialized on layout like one. With fusion off (KILN_FUSE=0)
// it declines, and the copy goes through the host like every other op.
bool copy_within_device(const Tensor& dst, const Tensor& src) {
  if (!fusion_enabled()) return false;
  const int64_t n = dst.numel();
  if (n == 0) return true;
  const int device = dst.device().index;
  Kernel k;
  k.ops = "copy";
  k.input_types = {src.dtype()};
  Instr load{Prim::Load, src.dtype()};
  load.index = 0;
  int32_t v = k.add(load);
  if (src.dtype() != dst.dtype()) {
    Instr cast{Prim::Cast, dst.dtype()};
    cast.a = v;
    v = k.add(cast);
  }
  k.outputs = {v};
  k.output_types = {dst.dtype()};
  char* ptrs[2] = {src.impl()->data(), dst.impl()->data()};
  Layout layout;
  const bool single = src.numel() == 1;
  if (dst.is_contiguous() && (single || (src.numel() == n && src.is_contiguous()))) {
    layout.single_element = {single};
    const CudaCallFlags variant = launch_variant(k, layout, device, n, nullptr, nullptr, ptrs);
    launch_elementwise(cuda_kernel(k, layout, variant, device), k, layout, device, n, nullptr,
                       nullptr, ptrs, nullptr);
    return true;
  }
  layout.flat = false;
  layout.rank = static_cast<int32_t>(dst.dim());
  const Shape& sizes = dst.sizes();
  std::vector<int64_t> strides = detail::broadcast_strides(src, sizes);
  strides.insert(strides.end(), dst.strides().begin(), dst.strides().end());
  const size_t rank = sizes.size();
  for (size_t p = 0; p < 2; ++p) {
    const int64_t s = strides[p * rank + rank - 1];
    layout.inner.push_back(sizes.back() == 1 || s == 0 ? Layout::kZero
                           : s == 1                    ? Layout::kUnit
                                                       : Layout::kAny);
  }
  const CudaCallFlags variant =
      launch_variant(k, layout, device, n, sizes.data(), strides.data(), ptrs);
  launch_elementwise(cuda_kernel(k, layout, variant, device), k, layout, device, n, sizes.data(),
                     strides.data(), ptrs, nullptr);
  return true;
}

// Hand-written kernels of lib/ (lib/cuda_tensor.h's DeviceKernels::source_kernel).
void* source_kernel_function(const std::string& name, const std::string& source, int device) {
  return source_kernel(name, source, device).fn;
}
}  // namespace

void register_device_kernels() {
  detail::device_kernels().copy = &copy_within_device;
  detail::device_kernels().source_kernel = &source_kernel_function;
}

}  // namespace kiln::fuser::cuda
