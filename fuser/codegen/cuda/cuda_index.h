// Index ops on a CUDA device: index_select (and so embedding) and gather as one hand-written
// gather kernel per dtype, compiled by NVRTC and cached like the generated kernels.
//
// out[o] = x[o with its coordinate along `dim` replaced by index[o']], o' being o for gather (the
// index has out's shape) and o's coordinate along dim for index_select (a 1-D index). The indices
// are checked on the host before (the ops read them there to raise for one out of range), so the
// kernel trusts them. Launch ABI (one pointer per parameter, see cuda_kernel.h's KernelCall):
//   <name>(long long n, int rank, int dim, KilnGatherDims dims, const T* x, const long long* index,
//          T* out)
// dims: `long long size[8]; long long x_stride[8]; long long index_stride[8]`: out's sizes (out is
// contiguous), x's strides and the index's strides (0 where the index does not vary), in elements.
#pragma once

#include <string>

#include "fuser/codegen/cuda/cuda_kernel.h"
#include "kiln/tensor.h"

namespace kiln::fuser::cuda {

constexpr int kGatherMaxRank = 8;

// The kernel's name and source for values of `dtype`.
std::string gather_name(DType dtype);
std::string gather_source(DType dtype);

// The launch for out (contiguous, rank <= kGatherMaxRank) from x along dim, reading index at
// index_strides (rank entries, in elements): its parameters and geometry.
KernelCall gather_call(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index,
                       const std::vector<int64_t>& index_strides, int64_t multiprocessors);

}  // namespace kiln::fuser::cuda
