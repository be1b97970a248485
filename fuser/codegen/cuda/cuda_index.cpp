// Index ops on a CUDA device (see cuda_index.h).
#include "fuser/codegen/cuda/cuda_index.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/fuse.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser::cuda {

namespace {
// A grid-stride kernel's geometry over n elements: 256 threads a block, at most 32 blocks a
// multiprocessor (the loop covers the rest).
KernelCall grid_stride_call(int64_t n, int64_t multiprocessors) {
  constexpr int64_t kThreads = 256;
  KernelCall call;
  call.block = static_cast<unsigned>(kThreads);
  call.grid = static_cast<unsigned>(
      std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, multiprocessors * 32)));
  return call;
}
}  // namespace

std::string gather_name(DType dtype) {
  // The version suffix changes with the source, so a cached binary never outlives its text.
  return std::string("kiln_gather_") + dtype_name(dtype) + "_v1";
}

std::string gather_source(DType dtype) {
  const std::string t = cuda_storage_type(dtype);
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
  const int64_t n = out.numel();
  const int rank = std::max<int>(1, static_cast<int>(out.dim()));
  long long dims[3 * kGatherMaxRank] = {};
  for (int k = 0; k < rank; ++k) {
    const bool scalar = out.dim() == 0;
    dims[k] = scalar ? 1 : out.size(k);
    dims[kGatherMaxRank + k] = x.dim() == 0 ? 0 : x.stride(k);
    dims[2 * kGatherMaxRank + k] = scalar ? 0 : index_strides[static_cast<size_t>(k)];
  }
  KernelCall call = grid_stride_call(n, multiprocessors);
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

std::string scatter_add_name(DType dtype) {
  return std::string("kiln_scatter_add_") + dtype_name(dtype) + "_v1";
}

std::string scatter_add_source(DType dtype) {
  const std::string t = cuda_storage_type(dtype);
  // bool adds as the CPU's T(a + b) with T = bool does: a logical or.
  const std::string add = dtype == kBool ? "acc = (unsigned char)(acc | v);" : "acc = acc + v;";
  return std::string("// kiln: fuser/codegen/cuda/cuda_index.cpp\n") +
         "struct KilnScatterDims {\n  long long size[8];\n  long long self_stride[8];\n"
         "  long long src_stride[8];\n  long long extent[8];\n  long long line_stride[8];\n};\n"
         "extern \"C\" __global__ void " +
         scatter_add_name(dtype) +
         "(long long n, int rank, int dim, long long length, KilnScatterDims dims, const " + t +
         "* self, const " + t + "* src, const long long* lines, " + t +
         "* out) {\n"
         "  const long long step = (long long)blockDim.x * (long long)gridDim.x;\n"
         "  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) "
         "{\n"
         "    long long rest = e, so = 0, line = 0, sb = 0, at = 0;\n"
         "    bool inside = true;\n"
         "    for (int k = rank - 1; k >= 0; --k) {\n"
         "      const long long c = rest % dims.size[k];\n"
         "      rest /= dims.size[k];\n"
         "      so += c * dims.self_stride[k];\n"
         "      if (k == dim) {\n"
         "        at = c;\n"
         "      } else {\n"
         "        inside = inside && c < dims.extent[k];\n"
         "        line += c * dims.line_stride[k];\n"
         "        sb += c * dims.src_stride[k];\n"
         "      }\n"
         "    }\n"
         "    " +
         t +
         " acc = self[so];\n"
         "    if (inside) {\n"
         "      const long long* p = lines + 2 * line * length;\n"
         "      long long lo = 0, hi = length;\n"
         "      while (lo < hi) {\n"
         "        const long long mid = lo + (hi - lo) / 2;\n"
         "        if (p[2 * mid] < at) lo = mid + 1; else hi = mid;\n"
         "      }\n"
         "      for (; lo < length && p[2 * lo] == at; ++lo) {\n"
         "        const " +
         t +
         " v = src[sb + p[2 * lo + 1] * dims.src_stride[dim]];\n"
         "        " +
         add +
         "\n"
         "      }\n"
         "    }\n"
         "    out[e] = acc;\n"
         "  }\n"
         "}\n";
}

std::vector<int64_t> scatter_add_lines(const std::vector<int64_t>& idx, const Shape& index_sizes,
                                       int64_t dim) {
  const Shape sizes = index_sizes.empty() ? Shape{1} : index_sizes;
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < dim; ++k) outer *= sizes[static_cast<size_t>(k)];
  for (size_t k = static_cast<size_t>(dim) + 1; k < sizes.size(); ++k) inner *= sizes[k];
  const int64_t length = sizes[static_cast<size_t>(dim)];
  KILN_CHECK(static_cast<int64_t>(idx.size()) == outer * length * inner,
             "scatter_add_lines: ", idx.size(), " indices for an index of ",
             outer * length * inner);
  std::vector<int64_t> out(2 * idx.size());
  std::vector<std::pair<int64_t, int64_t>> line(static_cast<size_t>(length));
  // Line numbers run row-major over the index's coordinates without dim: (o, i) -> o * inner + i.
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      for (int64_t j = 0; j < length; ++j)
        line[static_cast<size_t>(j)] = {idx[static_cast<size_t>((o * length + j) * inner + i)], j};
      // Pairs are unique, so sorting them keeps equal values in increasing j: a stable order.
      std::sort(line.begin(), line.end());
      int64_t* dst = out.data() + 2 * (o * inner + i) * length;
      for (const auto& [value, j] : line) {
        *dst++ = value;
        *dst++ = j;
      }
    }
  }
  return out;
}

KernelCall scatter_add_call(const Tensor& out, const Tensor& self, int64_t dim,
                            const Shape& index_sizes, const Tensor& src, const Tensor& lines,
                            bool select, int64_t multiprocessors) {
  constexpr int kR = kScatterMaxRank;
  const int64_t n = out.numel();
  const int rank = std::max<int>(1, static_cast<int>(out.dim()));
  const Shape is = index_sizes.empty() ? Shape{1} : index_sizes;
  long long dims[5 * kR] = {};
  long long length = 0, line_stride = 1;
  for (int k = rank - 1; k >= 0; --k) {
    const size_t u = static_cast<size_t>(k);
    dims[k] = out.dim() == 0 ? 1 : out.size(k);
    dims[kR + k] = self.dim() == 0 ? 0 : self.stride(k);
    dims[2 * kR + k] = src.dim() == 0 ? 0 : src.stride(k);
    // index_add's one index line serves every coordinate outside dim.
    dims[3 * kR + k] = select ? dims[k] : is[u];
    if (k == dim || select) continue;
    dims[4 * kR + k] = line_stride;
    line_stride *= is[u];
  }
  // index_add's index is 1-D ([1] when 0-dim).
  length = is[select ? 0 : static_cast<size_t>(dim)];
  KernelCall call = grid_stride_call(n, multiprocessors);
  const long long count = n;
  const int r = rank, d = static_cast<int>(dim);
  char* ptrs[4] = {self.impl()->data(), src.impl()->data(),
                   lines.defined() ? lines.impl()->data() : nullptr, out.impl()->data()};
  call.add(&count, sizeof count);
  call.add(&r, sizeof r);
  call.add(&d, sizeof d);
  call.add(&length, sizeof length);
  call.add(dims, sizeof dims);
  for (char*& p : ptrs) call.add(&p, sizeof p);
  return call;
}

namespace {
// index_select and gather on a device (lib/cuda_tensor.h's DeviceKernels::gather): declines with
// fusion off (KILN_FUSE=0 runs every device op through the host) and past kGatherMaxRank dims.
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

// index_add (select) and scatter_add on a device (lib/cuda_tensor.h's DeviceKernels::scatter_add):
// declines as gather_on_device does. The lines go up in one copy; the kernel reads no other index
// data.
bool scatter_add_on_device(const Tensor& out, const Tensor& self, int64_t dim,
                           const std::vector<int64_t>& idx, const Shape& index_sizes,
                           const Tensor& src, bool select) {
  if (!fusion_enabled() || out.dim() > kScatterMaxRank || self.dtype() != out.dtype() ||
      src.dtype() != out.dtype())
    return false;
  if (out.numel() == 0) return true;
  const int device = out.device().index;
  const Shape shape = select ? Shape{static_cast<int64_t>(idx.size())} : index_sizes;
  Tensor lines;
  if (!idx.empty()) {
    const std::vector<int64_t> pairs = scatter_add_lines(idx, shape, select ? 0 : dim);
    Tensor host = detail::make_empty({static_cast<int64_t>(pairs.size())}, kInt64);
    std::memcpy(host.impl()->data(), pairs.data(), pairs.size() * sizeof(int64_t));
    lines = detail::copy_to_device(host, out.device());
  }
  const CudaKernel fn =
      source_kernel(scatter_add_name(self.dtype()), scatter_add_source(self.dtype()), device);
  KernelCall call = scatter_add_call(out, self, dim, shape, src, lines, select,
                                     detail::cuda::device_info(device).multiprocessors);
  detail::cuda::launch(device, fn.fn, {call.grid, call.block, 0}, call.args.data(), fn.name);
  return true;
}

}  // namespace

void register_index_kernels() {
  detail::device_kernels().gather = &gather_on_device;
  detail::device_kernels().scatter_add = &scatter_add_on_device;
}

}  // namespace kiln::fuser::cuda
