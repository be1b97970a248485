// cuBLAS, opened with dlopen on first use (libcublas.so.<major> of the toolkit kiln was built
// with), so that loading kiln never maps cuBLAS's hundreds of megabytes unless a GEMM runs on a
// GPU.
#pragma once

#include <cstdint>

#include "kiln/dtype.h"

namespace kiln::detail::cuda {

// Row-major batched GEMM on `device`'s stream: for each of `batches` problems,
//   C = alpha * op(A) @ op(B) + beta * C
// where op(A) is M x K (trans_a 'N': A row-major with leading dimension lda; 'T': A is the
// transpose of a row-major K x M matrix with leading dimension lda), likewise op(B) K x N, and C
// is row-major M x N with leading dimension ldc; consecutive problems are stride_* elements apart.
// float32 or float64; float32 uses TF32 tensor cores only when kiln::cuda::allow_tf32().
void gemm(int device, DType dtype, char trans_a, char trans_b, int64_t M, int64_t N, int64_t K,
          double alpha, const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb,
          int64_t stride_b, double beta, void* C, int64_t ldc, int64_t stride_c, int64_t batches);

}  // namespace kiln::detail::cuda
