// CUDA code generation: a fused elementwise kernel (fuser/kernel.h) as CUDA C++ source for NVRTC.
//
// What exists: flat and strided elementwise kernels as source text, compiled by NVRTC (nvrtc.h)
// to PTX or cubin. What does not yet: loading and launching them (driver API), device tensors,
// and rows kernels (reductions); cuda_source raises for a rows layout.
//
// The launch ABI (what a launcher passes to cuLaunchKernel, one pointer per parameter):
//   flat:    (long long n, int index32, int vec, <ptrs>, <scalars>)
//   strided: (long long n, int index32, KilnDims dims, <ptrs>, <scalars>)
// - n: the element count of the iteration shape (strided: the product of sizes).
// - index32: nonzero when 32-bit index arithmetic is exact: n <= INT32_MAX, and (strided) for
//   every pointer p, sum_d (size[d] - 1) * |stride[p][d]| <= INT32_MAX, and the grid has at most
//   2^31 threads. The kernel then runs its 32-bit instance (both instances are in one kernel, so
//   the choice costs no compile): integer division by the sizes is the strided kernel's main cost,
//   and 32-bit division is several times cheaper than 64-bit on the GPU.
// - vec (flat only): nonzero when every pointer that is not a single element is aligned to 4 of
//   its elements (16 bytes for float32 and int32, 4 for bool); kernels whose tensors are all 4-byte
//   or bool types then move 4 elements per access (float4/int4/uchar4) and finish the tail one by
//   one. Other kernels ignore it.
// - dims (strided only): a struct by value, `long long size[rank]; long long stride[P * rank]`:
//   exactly the CPU kernel's `sizes` then `strides` arrays (KernelFn), pointer-major.
// - ptrs: the tensor inputs' then the outputs' first elements, typed (bool as unsigned char).
// - scalars: one parameter per kernel scalar, of its dtype (bool as unsigned char), so a launcher
//   passes a pointer to each 8-byte slot of the CPU convention's `scalars` (the value sits in the
//   slot's low bytes). Scalars and sizes are never baked into the source: a new literal or shape
//   is the same source and the same compiled kernel.
// The kernels are grid-stride loops: any grid size is correct; a launcher picks one from n.
//
// Numerics: every primitive computes what the LLVM emitter computes (casts as x86's truncating
// conversion, NaN to the lowest integer; wrapping integer arithmetic; the integer remainder by 0
// or -1 taken as 0; pow's case analysis; round to nearest even; no FMA contraction, see
// cuda_compile_options), except the transcendental functions, which are CUDA's own (libdevice)
// rather than lib/fastmath.h's sequences: results are then not bit-equal to the CPU's. Tolerance
// against the CPU (CUDA's documented maximum error plus fastmath.h's), in ulp of the result:
//   exact (0 ulp): + - * / sqrt, comparisons, casts, floor, ceil, round, fmod (remainder),
//                  pow with an integral exponent of magnitude <= 64 or +-0.5
//   float32: exp 3, log 3, log1p 3, expm1 3, sin 3, cos 3, tanh 4, erf 2 ulp + 5e-7 absolute
//            (fastmath.h's erf_f32 is a rational approximation), other pow 5
//   float64: exp 2, log 2, log1p 2, expm1 2, sin 3, cos 3, tanh 4, erf 3, other pow 3
// Formulas compose these (sigmoid = 1 / (1 + exp(-x))), so their outputs drift by the condition
// number of what follows; tests on a GPU should compare with such per-op tolerances.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuser/kernel.h"

namespace kiln::fuser::cuda {

// The kernel as CUDA C++ source defining `extern "C" __global__ void <symbol>(...)` (see above).
// Raises kiln::Error for a rows layout (not generated for CUDA yet), an invalid symbol, or
// parameters past CUDA's 32,764 bytes.
std::string cuda_source(const Kernel& kernel, const Layout& layout, const std::string& symbol);

// The index32 and vec arguments of one call, by the rules above: `sizes` and `strides` as the CPU
// kernel takes them (strided only; rank and rank * pointers entries), `ptrs` the tensors' first
// elements, `threads` the grid's block size times its number of blocks. A launcher passes these;
// kept here, beside the kernels that rely on them.
struct CudaCallFlags {
  bool index32 = false;
  bool vec = false;
};
CudaCallFlags cuda_call_flags(const Kernel& kernel, const Layout& layout, int64_t n,
                              const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                              int64_t threads);

// NVRTC options the generated source must be compiled with: --fmad=false, so that a * b + c is
// rounded twice as on the CPU (the LLVM emitter never contracts), and IEEE division, square root
// and denormals (NVRTC's defaults, stated).
std::vector<std::string> cuda_compile_options();

}  // namespace kiln::fuser::cuda
