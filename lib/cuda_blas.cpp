// cuBLAS through dlopen, one handle per device bound to the device's stream (see cuda_blas.h).
#include "lib/cuda_blas.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/env.h"

#ifdef KILN_HAS_CUDA
#include <cublas_v2.h>
#endif

namespace kiln {
namespace {
// cuBLAS's settings.
struct BlasSettings {
  // atomic: KILN_ALLOW_TF32 (read on first use), then cuda::set_allow_tf32.
  std::atomic<bool> allow_tf32{detail::env_bool("KILN_ALLOW_TF32", detail::OnBad::Warn)};
};
BlasSettings& blas_settings() {
  static auto* s = new BlasSettings();  // never destroyed: GEMMs may run at exit
  return *s;
}
}  // namespace

void cuda::set_allow_tf32(bool allow) {
  blas_settings().allow_tf32.store(allow);
}
bool cuda::allow_tf32() {
  return blas_settings().allow_tf32.load();
}
}  // namespace kiln

namespace kiln::detail::cuda {

#ifdef KILN_HAS_CUDA
namespace {
#define KILN_BLAS_NAME_(x) #x
#define KILN_BLAS_NAME(x) KILN_BLAS_NAME_(x)
#define KILN_BLAS_FUNCTIONS(X) \
  X(cublasCreate)              \
  X(cublasSetStream)           \
  X(cublasGetStatusString)
// Overloaded in C++ (an inline variant taking cudaDataType compute types): named by its type.
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                                cublasOperation_t, int, int, int, const void*,
                                                const void*, cudaDataType, int, long long,
                                                const void*, cudaDataType, int, long long,
                                                const void*, void*, cudaDataType, int, long long,
                                                int, cublasComputeType_t, cublasGemmAlgo_t);

struct Blas {
  std::string reason;  // empty when loaded
#define KILN_BLAS_MEMBER(fn) decltype(&::fn) fn = nullptr;
  KILN_BLAS_FUNCTIONS(KILN_BLAS_MEMBER)
#undef KILN_BLAS_MEMBER
  GemmStridedBatchedEx gemm_strided_batched = nullptr;
  std::mutex mu;
  std::vector<cublasHandle_t> handles;  // per device, made on first use
};

Blas& blas() {
  static Blas* b = [] {
    auto* b = new Blas();  // never destroyed: handles may be used during exit
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      b->reason = "cuBLAS (" + soname + ") could not be loaded: " + dlerror();
      return b;
    }
#define KILN_BLAS_LOOKUP(fn)                                                 \
  b->fn = reinterpret_cast<decltype(&::fn)>(dlsym(lib, KILN_BLAS_NAME(fn))); \
  if (!b->fn) {                                                              \
    b->reason = soname + " lacks " KILN_BLAS_NAME(fn);                       \
    return b;                                                                \
  }
    KILN_BLAS_FUNCTIONS(KILN_BLAS_LOOKUP)
#undef KILN_BLAS_LOOKUP
    b->gemm_strided_batched =
        reinterpret_cast<GemmStridedBatchedEx>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    if (!b->gemm_strided_batched) b->reason = soname + " lacks cublasGemmStridedBatchedEx";
    return b;
  }();
  return *b;
}

cublasHandle_t handle(int device) {
  Blas& b = blas();
  KILN_CHECK(b.reason.empty(), "GEMM on cuda:", device, ": ", b.reason);
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.handles.size() <= static_cast<size_t>(device)) b.handles.resize(device + 1, nullptr);
  cublasHandle_t& h = b.handles[static_cast<size_t>(device)];
  if (!h) {
    set_device(device);
    cublasStatus_t st = b.cublasCreate(&h);
    KILN_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasCreate failed on cuda:", device, ": ",
               b.cublasGetStatusString(st));
    st = b.cublasSetStream(h, static_cast<cudaStream_t>(stream(device)));
    KILN_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasSetStream failed on cuda:", device);
  }
  return h;
}
}  // namespace

void gemm(int device, DType dtype, char trans_a, char trans_b, int64_t M, int64_t N, int64_t K,
          double alpha, const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb,
          int64_t stride_b, double beta, void* C, int64_t ldc, int64_t stride_c, int64_t batches) {
  KILN_CHECK(dtype == kFloat32 || dtype == kFloat64, "GEMM on cuda:", device,
             ": cuBLAS computes float32 and float64, not ", dtype_name(dtype));
  KILN_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && batches <= INT32_MAX,
             "GEMM on cuda:", device, ": sizes past 2^31 (M=", M, ", N=", N, ", K=", K, ")");
  cublasHandle_t h = handle(device);
  set_device(device);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B comes first, and a
  // row-major operand read as column-major is already transposed.
  const cublasOperation_t tb = trans_b == 'N' ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t ta = trans_a == 'N' ? CUBLAS_OP_N : CUBLAS_OP_T;
  const bool f32 = dtype == kFloat32;
  const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
  const cudaDataType_t type = f32 ? CUDA_R_32F : CUDA_R_64F;
  const cublasComputeType_t compute = !f32                       ? CUBLAS_COMPUTE_64F
                                      : kiln::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                 : CUBLAS_COMPUTE_32F;
  const void* pa = f32 ? static_cast<const void*>(&alpha32) : &alpha;
  const void* pb = f32 ? static_cast<const void*>(&beta32) : &beta;
  cublasStatus_t st = blas().gemm_strided_batched(
      h, tb, ta, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), pa, B, type,
      static_cast<int>(ldb), stride_b, A, type, static_cast<int>(lda), stride_a, pb, C, type,
      static_cast<int>(ldc), stride_c, static_cast<int>(batches), compute, CUBLAS_GEMM_DEFAULT);
  KILN_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS: GEMM (M=", M, ", N=", N, ", K=", K,
             ", batches=", batches, ") failed on cuda:", device, ": ",
             blas().cublasGetStatusString(st));
}
#else
void gemm(int device, DType, char, char, int64_t, int64_t, int64_t, double, const void*, int64_t,
          int64_t, const void*, int64_t, int64_t, double, void*, int64_t, int64_t, int64_t) {
  require_device(device, "GEMM");
}
#endif

}  // namespace kiln::detail::cuda
