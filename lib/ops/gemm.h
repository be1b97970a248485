// The GEMM driver behind the linear-algebra ops (lib/ops/linalg.cpp), for kernels built on GEMMs
// (convolution): oneDNN's sgemm for float32, a cache-blocked loop else, cuBLAS on CUDA.
#pragma once

#include "kiln/scalar.h"
#include "kiln/tensor.h"

namespace kiln::detail {

// out (contiguous, batch + [M, N], of dtype `compute`) = beta * out + alpha * a @ b, where a is
// [..., M, K] and b is [..., K, N] with batch dims that broadcast to `batch`. When beta != 0, out
// holds the addend on entry. The caller has checked shapes and the alpha/beta kinds. When every
// batch multiplies by the same b and a's batch and row dims merge, the batch folds into M.
void gemm_into(const char* op, const Tensor& out, Tensor a, Tensor b, const Shape& batch,
               DType compute, const Scalar& alpha, const Scalar& beta);

// Raises when an integral product is given a floating-point beta or alpha (named `name`), as torch.
void check_scalar_kind(const char* op, DType compute, const Scalar& s, const char* name);

}  // namespace kiln::detail
