// Convolution and pooling kernels on a CUDA device (lib/ops/conv_cuda.cpp): the device side of
// lib/ops/conv.cpp's im2col formulation and of lib/ops/pool_norm.cpp's pools, float32 and float64.
// Inputs are on one device; results are new contiguous device tensors; nothing goes through the
// host.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor.h"
#include "lib/ops/conv.h"

namespace kiln::detail::cuda_conv {

// How the im2col passes lay out their GEMMs, per chunk of images (one column buffer, allocated
// once, serves every chunk):
//   Grouped (ConvAlgo::Im2col): one GEMM strided-batched over the groups with the chunk's images
//     in its N dimension; gy enters it regrouped as [G, O / G, N * L] (a copy) and the forward's
//     result leaves through a copy into [N, O, oH, oW]. Chunks of up to 256 MiB of columns
//     (set_max_cols_bytes).
//   PerImage (ConvAlgo::Im2colL2): per group, one GEMM strided-batched over the chunk's images
//     (the weight's batch stride 0) that writes y and reads gy in their NCHW layout (gy copied
//     only when its channel planes are not rows of oH * oW contiguous elements), in chunks whose
//     columns fill about half the device's L2 (set_l2_chunk_bytes), so that the GEMM reads
//     im2col's writes (and col2im the GEMM's) from L2 rather than DRAM. The weight gradient keeps
//     the grouped GEMM: per image it would reduce over only oH * oW, with too few output tiles to
//     fill the device, while regrouping gy moves O / K of the columns' bytes.
enum class Layout { Grouped, PerImage };

// The three im2col passes (conv.cpp's forward_im2col, grad_input_im2col, grad_weight_im2col):
// im2col or col2im kernels around cuBLAS GEMMs. Operands are of one dtype; the weight is
// contiguous, x and gy may have any strides.
Tensor forward(const Tensor& x, const Tensor& w, const ConvGeom& g,
               Layout layout = Layout::Grouped);
Tensor grad_input(const Tensor& gy, const Tensor& w, const ConvGeom& g,
                  Layout layout = Layout::Grouped);
Tensor grad_weight(const Tensor& gy, const Tensor& x, const ConvGeom& g,
                   Layout layout = Layout::Grouped);
// y [N, O, oH, oW] (contiguous) += bias [O], in place.
void add_bias(const Tensor& y, const Tensor& bias);

// The GEMM of a pass alone, on device buffers laid out as the pass's GEMM reads and writes them
// (forward: C [G, O/G, N*L] = w @ cols [G, K, N*L]; grad_input: cols = w^T @ gy_grouped
// [G, O/G, N*L]; grad_weight: gw [G, O/G, K] = gy_grouped @ cols^T). `a` is the first operand, `b`
// the second; c = product + beta * c. The benchmark times it next to the whole pass.
enum class ConvPass { Forward, GradInput, GradWeight };
void pass_gemm(ConvPass pass, const ConvGeom& g, DType dtype, int device, const void* a,
               const void* b, void* c, double beta = 0);

// A pooling's geometry (lib/ops/pool_norm.cpp's PoolGeom): input [N, C, H, W], output
// [N, C, oH, oW]; adaptive: adaptive_avg_pool2d's windows, else fixed ones of kernel k, stride s,
// padding p, dilation d.
struct PoolShape {
  int64_t N, C, H, W, oH, oW, kH, kW, sH, sW, pH, pW, dH, dW;
  bool count_include_pad, adaptive;
};
// max_pool2d's values and int64 indices (each window's first maximum; a NaN wins, the last one).
std::pair<Tensor, Tensor> max_pool(const Tensor& x, const PoolShape& p);
// gx [N, C, H, W] = gy added at the positions of `indices` in each plane (atomic adds: where
// windows overlap, float sums may come in any order).
Tensor max_pool_backward(const Tensor& gy, const Tensor& indices, const PoolShape& p);
// The average pools (adjoint: their backward, each input pixel gathering the gradients of the
// windows that hold it, in the CPU kernel's order).
Tensor avg_pool(const Tensor& x, const PoolShape& p, bool adjoint);

// For tests: the column matrix's budget per chunk of images (at least one image runs at once),
// of Layout::Grouped; and of Layout::PerImage (0, the default: half the device's L2).
void set_max_cols_bytes(int64_t bytes);
void set_l2_chunk_bytes(int64_t bytes);
// The images a chunk of g's passes holds in `layout` on `device`.
int64_t chunk_images(const ConvGeom& g, DType dtype, int device, Layout layout);
// For tests: 64-bit index arithmetic in every kernel, also where 32 bits suffice.
void set_wide_indices(bool on);

// Every kernel's (name, CUDA C source) in both dtypes. Each source also compiles as host C++ with
// KILN_HOST_LAUNCH defined: the kernel then runs as one thread of one block (its grid-stride loop
// covers every element), and `extern "C" void <name>_host(void** args)` calls it with
// cuLaunchKernel's parameter pointers (tests/fake_cuda runs launches through it).
std::vector<std::pair<std::string, std::string>> kernel_sources();

}  // namespace kiln::detail::cuda_conv
