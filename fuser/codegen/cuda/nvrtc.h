// NVRTC, the CUDA runtime compiler: CUDA C++ source to PTX or cubin, in process, without a GPU.
// Built only with the CUDA toolkit (KILN_HAS_CUDA); this header exposes no CUDA types.
#pragma once

#include <string>
#include <vector>

namespace kiln::fuser::cuda {

enum class CudaOutput {
  kPtx,    // --gpu-architecture=compute_XX: PTX text, which the driver JIT-compiles for newer GPUs
  kCubin,  // --gpu-architecture=sm_XX: machine code for exactly that architecture
};

struct CudaCompiled {
  std::string code;  // PTX text or cubin bytes
  std::string log;   // NVRTC's log: empty, or warnings
};

// Compiles `source` (named `name` in messages) for compute capability `sm` (90 for sm_90) with
// -std=c++17 and `options`. Raises kiln::Error with NVRTC's full log on a compile error, and for
// an architecture this NVRTC does not support.
CudaCompiled nvrtc_compile(const std::string& source, const std::string& name, int sm,
                           CudaOutput output, const std::vector<std::string>& options = {});

// "NVRTC <major>.<minor>": part of a future cache key for compiled kernels (another NVRTC may
// generate other code from the same source).
std::string nvrtc_version();

// The compute capabilities (e.g. 75, 80, 90) this NVRTC compiles for.
std::vector<int> nvrtc_supported_archs();

}  // namespace kiln::fuser::cuda
