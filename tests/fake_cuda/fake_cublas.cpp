// A stand-in for cuBLAS over host memory (see fake_driver.cpp): the one GEMM kiln calls, computed
// by a plain column-major loop, so that kiln's row-major-to-column-major mapping of operands,
// transposes, leading dimensions and batch strides is checked against the CPU's products.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdint>

namespace {
int g_handle_tag;

// The fake driver keeps device memory inaccessible but while it is used (fake_driver.cpp).
void device_access(const void* p, bool on) {
  static auto* fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    return lib ? reinterpret_cast<void (*)(const void*, int)>(dlsym(lib, "kiln_fake_device_access"))
               : nullptr;
  }();
  if (fn) fn(p, on ? 1 : 0);
}

template <typename T>
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, T alpha, const T* A,
          int lda, long long sa, const T* B, int ldb, long long sb, T beta, T* C, int ldc,
          long long sc, int batches) {
  for (int b = 0; b < batches; ++b)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        T acc = 0;
        for (int p = 0; p < k; ++p) {
          const T a = ta == CUBLAS_OP_N ? A[b * sa + i + int64_t{p} * lda]
                                        : A[b * sa + p + int64_t{i} * lda];
          const T bv = tb == CUBLAS_OP_N ? B[b * sb + p + int64_t{j} * ldb]
                                         : B[b * sb + j + int64_t{p} * ldb];
          acc += a * bv;
        }
        T& c = C[b * sc + i + int64_t{j} * ldc];
        c = beta == T(0) ? alpha * acc : alpha * acc + beta * c;
      }
}
}  // namespace

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(&g_handle_tag);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t) {
  return "fake cuBLAS status";
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType at,
                                          int lda, long long sa, const void* B, cudaDataType,
                                          int ldb, long long sb, const void* beta, void* C,
                                          cudaDataType, int ldc, long long sc, int batches,
                                          cublasComputeType_t, cublasGemmAlgo_t) {
  struct Open {
    const void* p[3];
    ~Open() {
      for (const void* q : p) device_access(q, false);
    }
  } open{{A, B, C}};
  for (const void* q : open.p) device_access(q, true);
  if (at == CUDA_R_32F)
    gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), static_cast<const float*>(A), lda, sa,
         static_cast<const float*>(B), ldb, sb, *static_cast<const float*>(beta),
         static_cast<float*>(C), ldc, sc, batches);
  else if (at == CUDA_R_64F)
    gemm(ta, tb, m, n, k, *static_cast<const double*>(alpha), static_cast<const double*>(A), lda,
         sa, static_cast<const double*>(B), ldb, sb, *static_cast<const double*>(beta),
         static_cast<double*>(C), ldc, sc, batches);
  else
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}
}  // extern "C"
