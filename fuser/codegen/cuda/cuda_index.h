// Index ops on a CUDA device: index_select (and so embedding) and gather as one hand-written
// gather kernel per dtype, index_add and scatter_add as one scatter-add kernel per dtype, compiled
// by NVRTC and cached like the generated kernels.
//
// Gather: out[o] = x[o with its coordinate along `dim` replaced by index[o']], o' being o for
// gather (the index has out's shape) and o's coordinate along dim for index_select (a 1-D index).
// The indices are checked on the host before (the ops read them there to raise for one out of
// range), so the kernel trusts them. Launch ABI (one pointer per parameter, see cuda_kernel.h's
// KernelCall):
//   <name>(long long n, int rank, int dim, KilnGatherDims dims, const T* x, const long long* index,
//          T* out)
// dims: `long long size[8]; long long x_stride[8]; long long index_stride[8]`: out's sizes (out is
// contiguous), x's strides and the index's strides (0 where the index does not vary), in elements.
//
// Scatter-add, deterministic and without atomics: out = self plus src's values added at the
// indices, in the order of the CPU kernels (increasing position along dim), so bit for bit what
// they compute. The host has the indices already (it checked them): per index line (the index
// elements that share every coordinate but the one along dim) it sorts the positions j along dim
// by index value, stably, and uploads the pairs (value, j) of every line, line after line
// (scatter_add_lines). One thread per output element then finds its line, binary-searches its own
// coordinate along dim among the line's values and adds src at each matching j in turn. For
// index_add one 1-D index serves every line (line strides 0); for scatter_add the index may be
// smaller than self outside dim, and elements past its extent only copy self. Launch ABI:
//   <name>(long long n, int rank, int dim, long long length, KilnScatterDims dims, const T* self,
//          const T* src, const long long* lines, T* out)
// length: the entries per line (L); dims: `long long size[8]; long long self_stride[8];
// long long src_stride[8]; long long extent[8]; long long line_stride[8]`: out's sizes (out is
// contiguous), self's and src's strides, the index's extents (out's sizes for index_add) and the
// line number's stride per coordinate (0 along dim), in elements; lines: 2 * L entries per line.
#pragma once

#include <string>

#include "fuser/codegen/cuda/cuda_kernel.h"
#include "kiln/tensor.h"

namespace kiln::fuser::cuda {

constexpr int kGatherMaxRank = 8;
constexpr int kScatterMaxRank = 8;

// Fills lib/cuda_tensor.h's DeviceKernels::gather and ::scatter_add (exec/init.cpp calls it once).
void register_index_kernels();

// The kernel's name and source for values of `dtype`.
std::string gather_name(DType dtype);
std::string gather_source(DType dtype);

// The launch for out (contiguous, rank <= kGatherMaxRank) from x along dim, reading index at
// index_strides (rank entries, in elements): its parameters and geometry.
KernelCall gather_call(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index,
                       const std::vector<int64_t>& index_strides, int64_t multiprocessors);

// The scatter-add kernel's name and source for values of `dtype`.
std::string scatter_add_name(DType dtype);
std::string scatter_add_source(DType dtype);

// The (value, j) pairs of every line of an index of `index_sizes` (checked values `idx`, row-major;
// a 0-dim index counts as [1]) along dim, each line's sorted by value, stably: the kernel's lines.
std::vector<int64_t> scatter_add_lines(const std::vector<int64_t>& idx, const Shape& index_sizes,
                                       int64_t dim);

// The launch for out (contiguous, self's shape, rank <= kScatterMaxRank) = self plus src added
// along dim at the index of `index_sizes` whose lines (scatter_add_lines, on the launch's device)
// are `lines`; select: index_add's 1-D index (shared by every line), else scatter_add's.
KernelCall scatter_add_call(const Tensor& out, const Tensor& self, int64_t dim,
                            const Shape& index_sizes, const Tensor& src, const Tensor& lines,
                            bool select, int64_t multiprocessors);

}  // namespace kiln::fuser::cuda
