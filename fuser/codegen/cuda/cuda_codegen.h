// CUDA code generation: a fused kernel (fuser/kernel.h) as CUDA C++ source for NVRTC.
//
// Flat and strided elementwise kernels and rows kernels (reductions) as source text, compiled by
// NVRTC (nvrtc.h) to PTX or cubin, loaded and launched by cuda_kernel.h.
//
// The launch ABI (what a launcher passes to cuLaunchKernel, one pointer per parameter):
//   flat:    (long long n, <ptrs>, <scalars>)
//   strided: (long long n, KilnDims dims, <ptrs>, <scalars>)
// - n: the element count of the iteration shape (strided: the product of sizes).
// Variants: one source is generated, and compiled, per (kernel, layout, variant), the variant
// being what a call needs (CudaCallFlags, by cuda_call_flags below); the launcher picks the
// binary by the call's flags. Each variant holds one instance of the body: every instance inlines
// the body, and libdevice's sin or cos with it, and a cold compile pays NVRTC and ptxas for each
// copy, while a kernel rarely meets more than one variant (huge tensors, misaligned views). The
// kernels take no index32 or vec parameter:
// a binary is right only for the calls its variant allows (a 32-bit one overflows on a huge
// tensor), so a flag passed at launch could not choose anything, only disagree.
// - index32: when 32-bit index arithmetic is exact: n <= INT32_MAX, and (strided) for every
//   pointer p, sum_d (size[d] - 1) * |stride[p][d]| <= INT32_MAX, and the grid has at most 2^31
//   threads. Integer division by the sizes is the strided kernel's main cost, and 32-bit division
//   is several times cheaper than 64-bit on the GPU. The 64-bit variant is right for every call.
// - vec (flat): when every pointer that is not a single element is aligned to 4 of its
//   elements (16 bytes for float32 and int32, 4 for bool); kernels whose tensors are all 4-byte or
//   bool types then move 4 elements per access (float4/int4/uchar4) and finish the tail one by
//   one. Other kernels have no vec variant (cuda_variant drops the flag). The scalar variant is
//   right for every alignment.
// - vec (rows): when every pointer that moves along the row (Layout::kUnit) starts every row at
//   a multiple of 4 of its elements: its first element aligned to 4 elements (16 bytes; 4 for
//   bool) and each of its outer strides (of dims of more than one index) a multiple of 4. Kernels
//   whose tensors are all 4-byte or bool types, none strided along the row (Layout::kAny) and
//   some kUnit, then move each whole quad of a row (below) with one access (KilnQuad: 16 bytes,
//   4 for bool): the loads of kUnit inputs, the stores of element-level kUnit outputs and the row
//   cache's writes and reads; a row's partial last quad (R % 4 positions) goes element by
//   element. kZero pointers are read per position as in the scalar variant. The positions and
//   their order are the scalar variant's, so both give the same bits; the scalar variant is right
//   for every alignment (it serves a vec call; a vec binary never serves a misaligned one: the
//   launcher checks). CudaRowsPolicy::vec turns the variant off.
// - per_thread (rows only): 0, or K (4 to 64) when R <= K * blockDim.x, so that thread t holds at
//   most K positions of a row (K / 4 quads: t, t + blockDim.x, ...). The K variant keeps them in
//   registers: a
//   row's loads are issued together before a pass computes (the memory system sees K loads per
//   thread in flight instead of one), an input that several passes read is loaded once, and the
//   block's column partials stay in registers across its band of rows, written once at its end.
//   The folds run in the same order as the generic loop's, so both variants give the same bits.
//   A K variant launched on a longer row would skip positions: the launcher checks it. Its block
//   size is part of the variant (block; __launch_bounds__), so that registers never exceed what
//   a launch of that size has (ptxas spills instead).
// - dims (strided only): a struct by value, `long long size[rank]; long long stride[P * rank]`:
//   exactly the CPU kernel's `sizes` then `strides` arrays (KernelFn), pointer-major.
// - ptrs: the tensor inputs' then the outputs' first elements, typed (bool as unsigned char).
// - scalars: one parameter per kernel scalar, of its dtype (bool as unsigned char), so a launcher
//   passes a pointer to each 8-byte slot of the CPU convention's `scalars` (the value sits in the
//   slot's low bytes). Scalars and sizes are never baked into the source: a new literal or shape
//   is the same source and the same compiled kernel.
// The kernels are grid-stride loops: any grid size is correct; a launcher picks one from n.
//
// Rows kernels (Layout::rows: kernels with reductions) are up to three kernels in one source:
//   rows:    <symbol>(long long rows, KilnRowsDims dims, <ptrs>, <scalars>
//                     [, unsigned long long* partials])
//   finish:  <symbol>_finish(long long blocks, long long stride, const unsigned long long*
//   partials,
//                            <ptrs>, <scalars>)                   (Kernel::num_globals > 0)
//   columns: <symbol>_columns(long long blocks, long long stride, long long R,
//                             const unsigned long long* partials, <ptrs>, <scalars>)
//                                                                  (Kernel::num_columns() > 0)
// - rows: the number of rows (the product of the rank outer sizes; 1 for rank 0), at least 0.
// - dims: `long long size[rank + 1]; long long stride[P * (rank + 1)]`: exactly the CPU rows
//   kernel's `sizes` (outer sizes, then the row length R) then `strides` (per pointer: its outer
//   strides, then its stride along a row), pointer-major.
// - index32 (the variant): as above, for the rows kernel:
//   rows <= INT32_MAX, R <= INT32_MAX, the grid at most 2^31 blocks, and for every pointer
//   sum_d (size[d] - 1) * |stride[p][d]| over the rank + 1 dims <= INT32_MAX. The finish and
//   columns kernels index in 64 bits in either variant.
// - partials (only when the kernel has global or column reductions): the launcher's buffer of
//   gridDim.x blocks of `stride` = Kernel::partials_per_call(R) values of 8 bytes, laid out per
//   block as one CPU call's partials (global slots, then column slots, a value of the reduction's
//   type at the start of each 8-byte global slot, column positions packed in the reduction's
//   type). Block b writes block b only (whatever it held before is overwritten; no clearing).
// - Geometry: blockDim.x a multiple of 32, from 32 to 1024 (blockDim.y = blockDim.z = 1); any
//   gridDim.x >= 1. Shared memory: 256 bytes, static, and for the generic variant (per_thread 0)
//   the row caches' dynamic shared memory (rows_shared_bytes; 0 leaves them off; 16-byte
//   aligned for the vec variant's quads). Block b walks the band of rows [b * chunk, min(rows,
//   (b + 1) * chunk)), chunk = ceil(rows / gridDim.x), as one CPU call walks its range; in every
//   variant thread t of a block takes the quads q = t, t + blockDim.x, ... of each row and, in
//   each, positions 4q, 4q + 1, 4q + 2, 4q + 3 (those < R), folding them in that order (a 16-byte
//   access per quad where the row starts aligned). A row reduction folds per thread, then over
//   the block through
//   warp shuffles (__shfl_xor_sync) and shared memory across warps: a fixed tree for a given block
//   size, no atomics, so results are the same on every run with the same geometry; every thread
//   gets the row's value for the next pass (softmax: max, then sum of exp, then the scaled store).
// - finish: launched after the rows kernel with one block of one thread (other threads return):
//   blocks is the rows kernel's gridDim.x, stride as above. It combines the blocks' global
//   partials in block order and writes the outputs that depend on them (at element 0 of their
//   pointers): the CPU's FinishFn over calls = blocks.
// - columns: launched after the rows kernel, any geometry (a grid-stride loop over positions
//   0 .. max parts * R); blocks and stride as above, R the row length. Column reductions fold each
//   row of a block's band into the block's column partial (position j by the thread that takes
//   element j of every row, so in row order and without atomics); this kernel combines the blocks'
//   partials per position in block order and stores the column outputs contiguously (position q
//   at element q): the CPU's ColumnsFn over calls = blocks (it leaves the partials as they were).
// cuda_rows_launch below computes a geometry from the sizes alone (not from the device), so that
// results do not depend on which GPU runs them.
//
// Numerics: every primitive computes what the LLVM emitter computes (casts as x86's truncating
// conversion, NaN to the lowest integer; wrapping integer arithmetic; the integer remainder by 0
// or -1 taken as 0; pow's case analysis; round to nearest even; no FMA contraction, see
// cuda_compile_options), the transcendental functions included: they are lib/math/primitives.h's
// definitions rendered as device functions (kiln_exp_f32, ...), whose fmadd is CUDA's fma. The
// CPU's fmadd fuses too where the host has FMA, and then the results are bit-equal; elsewhere
// both are within the bounds of docs/numerics.md of the exact result. pow's general case is
// CUDA's libdevice pow (float32 within 5 ulp of the CPU's libm, float64 within 3), fmod is exact.
// Formulas compose these (sigmoid = 1 / (1 + exp(-x))), so their outputs drift by the condition
// number of what follows; tests on a GPU should compare with such per-op tolerances.
// Reductions: max and min (NaN-propagating, -0 below +0), integer and bool folds are exact, so
// equal to the CPU's in any order. Sums of floats accumulate in double as on the CPU (the
// formulas widen them), but in another order (the CPU's vectorized, reassociated loop; here each
// thread's quads of positions, then the block's tree): a double sum of n terms differs from the
// CPU's by at most 2 (n - 1) 2^-53 sum |x| (each order's bound), which a float32 result sees as at
// most 1 ulp (and then rarely: only where the double sum lies near a float32 rounding boundary);
// where every partial sum is exact in double (terms of bounded exponent range: the tests' values),
// the results are equal bit for bit. A global reduction of row-level values (a mean over rows of
// row losses) and column reductions fold in the CPU's order when the CPU's calls cover the same
// bands of rows as the blocks (calls = blocks, chunk = ceil(rows / blocks)): then bit-equal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuser/kernel.h"

namespace kiln::fuser::cuda {

// What one call allows (index32, vec), by the rules above; as a variant, what a binary is
// generated for. The default, 64-bit and scalar, is right for every call.
struct CudaCallFlags {
  bool index32 = false;
  bool vec = false;
  int per_thread = 0;  // rows kernels: 0, or K when every row has at most K * blockDim.x positions
  int block = 0;       // rows kernels with per_thread: blockDim.x (__launch_bounds__)
  bool operator==(const CudaCallFlags& o) const {
    return index32 == o.index32 && vec == o.vec && per_thread == o.per_thread && block == o.block;
  }
  bool operator!=(const CudaCallFlags& o) const { return !(*this == o); }
};

// The C++ type of an element of dtype t in device memory (bool as unsigned char), as the
// generated and the hand-written kernels (cuda_index.h) declare their pointers.
const char* cuda_storage_type(DType t);

// The kernel's `variant` as CUDA C++ source defining `extern "C" __global__ void <symbol>(...)`
// (see above). Rows layouts also define <symbol>_finish and <symbol>_columns when the kernel has
// global or column reductions. Raises kiln::Error for an invalid symbol or layout, or parameters
// past CUDA's 32,764 bytes.
std::string cuda_source(const Kernel& kernel, const Layout& layout, const std::string& symbol,
                        CudaCallFlags variant);

// The variant whose source `flags` gives: vec dropped where the kernel has no 4-wide loop or
// quad accesses (strided layouts, a tensor of a type without a vector type, a rows layout with a
// kAny pointer or no kUnit one), so that equal sources have equal cache keys.
CudaCallFlags cuda_variant(const Kernel& kernel, const Layout& layout, CudaCallFlags flags);

// The flags of one call, by the rules above: `sizes` and `strides` as the CPU kernel takes them
// (strided only; rank and rank * pointers entries; rows: rank + 1 and (rank + 1) * pointers, with
// n the number of rows), `ptrs` the tensors' first elements, `threads` the grid's block size times
// its number of blocks (rows: its number of blocks). Kept here, beside the kernels that rely on
// them; vec is set only where the kernel has a vec variant.
CudaCallFlags cuda_call_flags(const Kernel& kernel, const Layout& layout, int64_t n,
                              const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                              int64_t threads);

// For a rows kernel (Layout::rows): the launch geometry of a call, by the rules above, from the
// CPU kernel's `sizes` (rank + 1 entries) and `strides` ((rank + 1) per pointer). Depends on the
// sizes only, never on the device, so that sums come out the same on every GPU.
//   threads: a power of two from 32 to CudaRowsPolicy::max_threads (512), about
//            R / min_per_thread (4) where that fits
//   per_thread: for kernels with column reductions (CudaRowsPolicy), the least K of 4, 8, 16,
//            32, 64 (at most CudaRowsPolicy::max_per_thread) with R <= K * threads, else 0
//   blocks:  min(rows, cap), at least 1; cap 65536, 1024 with global reductions (the finish
//            kernel combines the blocks' partials on one thread), 512 with column reductions
//            (blocks * R column partials)
struct CudaRowsLaunch {
  int64_t blocks = 1;            // the rows kernel's gridDim.x
  int threads = 32;              // its blockDim.x
  bool index32 = false;          // its variant's index32 ...
  int per_thread = 0;            // ... and per_thread
  bool vec = false;              // the policy takes the vec variant where the pointers allow it
  int64_t stride = 0;            // 8-byte values per block in partials: partials_per_call(R)
  int64_t partials_bytes = 0;    // the partials buffer: blocks * stride * 8 (0: none)
  int64_t column_positions = 0;  // positions the columns kernel covers (max parts * R)
  int64_t columns_blocks = 0;    // the columns kernel's grid (0: no columns kernel) ...
  int columns_threads = 0;       // ... and block size; the finish kernel runs <<<1, 1>>>
  int64_t row_cache_bytes = 0;   // the policy's budget for the row caches (rows_shared_bytes)
};
// How rows launches are shaped (benchmarks compare policies; results never depend on it beyond
// the sums' order, which follows the geometry as documented above).
struct CudaRowsPolicy {
  int max_threads = 512;    // a block's threads at most, a power of two from 32 to 1024
  int min_per_thread = 4;   // positions per thread at least, where the row has them
  int max_per_thread = 16;  // the per_thread variant's K at most (0: the generic loop only)
  // The per_thread variant for kernels without column reductions too. Off: on an H100 it was
  // slower than the strided loop for softmax's backward (1.8x) and layer_norm (1.3x), and gained
  // 4% on softmax; with column reductions it is 1.3x faster (tools/bench/RESULTS.md).
  bool registers_without_columns = false;
  // The vec variant (16-byte quad accesses) where a call's pointers allow it. On: expected to
  // raise the rows kernels' bandwidth (more bytes in flight per thread); not yet measured on a GPU.
  bool vec = true;
  // The generic variant's row caches at most, in bytes of dynamic shared memory a block (capped
  // by the device's opt-in limit). 96 KiB: softmax's backward keeps both its inputs' rows of 8192
  // float32 (64 KiB) instead of reading them again from memory in each of its three passes; two
  // such blocks fit a multiprocessor of an H100 (228 KiB). Not yet measured on a GPU (32 KiB, one
  // row, before).
  int64_t row_cache_bytes = 96 * 1024;
};
CudaRowsPolicy cuda_rows_policy();
void set_cuda_rows_policy(const CudaRowsPolicy& policy);
// A rows kernel's row caches (the generic variant's: the loads that several passes read, kept in
// shared memory by the first): one value's bytes for each, in the order they follow each other.
std::vector<int> cuda_row_caches(const Kernel& kernel, const Layout& layout);
// The dynamic shared memory a generic-variant launch over rows of R positions gives its row
// caches: the first ones whose rows, each rounded up to 16 bytes, fit in `limit` bytes together
// (each kernel uses a cache only where it fits; the values are the same either way).
unsigned rows_shared_bytes(const std::vector<int>& caches, int64_t R, int64_t limit);
CudaRowsLaunch cuda_rows_launch(const Kernel& kernel, const Layout& layout, const int64_t* sizes,
                                const int64_t* strides);

// NVRTC options the generated source must be compiled with: --fmad=false, so that a * b + c is
// rounded twice as on the CPU (the LLVM emitter never contracts), and IEEE division, square root
// and denormals (NVRTC's defaults, stated).
std::vector<std::string> cuda_compile_options();

}  // namespace kiln::fuser::cuda
