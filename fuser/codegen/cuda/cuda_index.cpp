// Index ops on a CUDA device (see cuda_index.h).
#include "fuser/codegen/cuda/cuda_index.h"

#include <algorithm>

#include "fuser/fuse.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser::cuda {

namespace {
const char* value_type(DType t) {
  switch (t) {
    case kFloat32:
      return "float";
    case kFloat64:
      return "double";
    case kInt32:
      return "int";
    case kInt64:
      return "long long";
    default:
      return "unsigned char";  // bool
  }
}
}  // namespace

std::string gather_name(DType dtype) {
  // The version suffix changes with the source, so a cached binary never outlives its text.
  return std::string("kiln_gather_") + dtype_name(dtype) + "_v1";
}

std::string gather_source(DType dtype) {
  const std::string t = value_type(dtype);
  return std::string("// kiln: fuser/codegen/cuda/cuda_index.cpp\n") +
         "struct KilnGatherDims {\n  long long size[8];\n  long long x_stride[8];\n"
         "  long long index_stride[8];\n};\n"
         "extern \"C\" __global__ void " +
         gather_name(dtype) + "(long long n, int rank, int dim, KilnGatherDims dims, const " + t +
         "* x, const long long* index, " + t +
         "* out) {\n"
         "  const long long step = (long long)blockDim.x * (long long)gridDim.x;\n"
         "  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) "
         "{\n"
         "    long long rest = e, xo = 0, io = 0;\n"
         "    for (int k = rank - 1; k >= 0; --k) {\n"
         "      const long long c = rest % dims.size[k];\n"
         "      rest /= dims.size[k];\n"
         "      io += c * dims.index_stride[k];\n"
         "      if (k != dim) xo += c * dims.x_stride[k];\n"
         "    }\n"
         "    out[e] = x[xo + index[io] * dims.x_stride[dim]];\n"
         "  }\n"
         "}\n";
}

KernelCall gather_call(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index,
                       const std::vector<int64_t>& index_strides, int64_t multiprocessors) {
  constexpr int64_t kThreads = 256;
  const int64_t n = out.numel();
  const int rank = std::max<int>(1, static_cast<int>(out.dim()));
  long long dims[3 * kGatherMaxRank] = {};
  for (int k = 0; k < rank; ++k) {
    const bool scalar = out.dim() == 0;
    dims[k] = scalar ? 1 : out.size(k);
    dims[kGatherMaxRank + k] = x.dim() == 0 ? 0 : x.stride(k);
    dims[2 * kGatherMaxRank + k] = scalar ? 0 : index_strides[static_cast<size_t>(k)];
  }
  KernelCall call;
  call.block = static_cast<unsigned>(kThreads);
  call.grid = static_cast<unsigned>(
      std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, multiprocessors * 32)));
  const long long count = n;
  const int r = rank, d = static_cast<int>(dim);
  char* ptrs[3] = {x.impl()->data(), index.impl()->data(), out.impl()->data()};
  call.add(&count, sizeof count);
  call.add(&r, sizeof r);
  call.add(&d, sizeof d);
  call.add(dims, sizeof dims);
  for (char*& p : ptrs) call.add(&p, sizeof p);
  return call;
}

namespace {
// index_select and gather on a device (lib/cuda_tensor.h's DeviceGather): declines with fusion
// off (KILN_FUSE=0 runs every device op through the host) and past kGatherMaxRank dims.
bool gather_on_device(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index,
                      bool select) {
  if (!fusion_enabled() || out.dim() > kGatherMaxRank || x.dtype() != out.dtype()) return false;
  if (out.numel() == 0) return true;
  const int device = out.device().index;
  const Tensor idx = index.to(kInt64).contiguous();  // on the device
  std::vector<int64_t> strides(static_cast<size_t>(std::max<int64_t>(1, out.dim())), 0);
  if (select) {
    if (out.dim() > 0) strides[static_cast<size_t>(dim)] = 1;
  } else {
    for (int64_t k = 0; k < out.dim(); ++k) strides[static_cast<size_t>(k)] = idx.stride(k);
  }
  const CudaKernel fn = source_kernel(gather_name(x.dtype()), gather_source(x.dtype()), device);
  KernelCall call = gather_call(out, x, x.dim() == 0 ? 0 : dim, idx, strides,
                                detail::cuda::device_info(device).multiprocessors);
  detail::cuda::launch(device, fn.fn, {call.grid, call.block, 0}, call.args.data(), fn.name);
  return true;
}

const bool g_gather_registered = (detail::set_device_gather(&gather_on_device), true);
}  // namespace

}  // namespace kiln::fuser::cuda
