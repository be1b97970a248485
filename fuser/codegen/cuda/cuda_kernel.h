// Compiled CUDA kernels: NVRTC's output cached in memory and on disk (fuser/cache.h), loaded with
// cuModuleLoadData, and launched on a device's stream by the ABI of cuda_codegen.h.
//
// Disk-cache key: the kernel's key (program and layout), the variant (cuda_codegen.h), the target
// ("sm_90" cubin, or "compute_XX" PTX when this NVRTC cannot build a cubin for the device), NVRTC's
// version and the CUDA emitter's version, so that another GPU or compiler never loads a stale
// binary.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/kernel.h"

namespace kiln::fuser::cuda {

// The binary NVRTC builds for (kernel, layout, variant) on a GPU of compute capability `sm` (a
// cubin, or PTX for an architecture newer than this NVRTC knows), through the memory and disk
// caches. Needs no GPU. `from_disk` (optional) tells whether the disk cache had it. The variants of
// a kernel share its symbol: each is a module of its own.
struct CudaBinary {
  std::string image;
  std::string symbol;  // kiln_<ops>_<hash8>
  bool ptx = false;
};
CudaBinary cuda_binary(const Kernel& kernel, const Layout& layout, CudaCallFlags variant, int sm,
                       bool* from_disk = nullptr);

// The key a process's binaries are kept under in memory (the kernel, its layout and variant, the
// target and NVRTC's version).
std::string cuda_binary_key(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                            int sm);
// The key the disk cache files a binary under: the CUDA source it is compiled from, the target
// (sm_<arch> for a binary, compute_<arch> for PTX), NVRTC's version and the compile options. No
// version is bumped by hand: a change of the generated code changes the key.
std::string cuda_disk_key(const std::string& source, int arch, bool ptx);

struct CudaCompileStats {
  int64_t compiles = 0;
  int64_t disk_hits = 0;
  int64_t memory_hits = 0;
  double compile_seconds = 0;
  int64_t stand_ins = 0;            // stand-in binaries served while the wanted one compiled
  int64_t background_compiles = 0;  // binaries compiled in the background and filed
  int64_t upgrades = 0;             // loaded kernels that replaced their stand-ins
};
CudaCompileStats cuda_compile_stats();

// A kernel loaded on a device: its functions stay valid while `owner` lives.
struct CudaKernel {
  void* fn = nullptr;
  void* finish = nullptr;   // rows kernels with global reductions: <symbol>_finish
  void* columns = nullptr;  // rows kernels with column reductions: <symbol>_columns
  std::shared_ptr<const void> owner;
  const char* name = nullptr;
  CudaCallFlags variant;  // the calls it is right for (launch_* check it)
  bool stand_in = false;  // cuda_kernel_tiered: serves while the wanted binary compiles
  // A rows kernel's generic variant: its row caches (cuda_row_caches) and the dynamic shared
  // memory its launches may have (the device's opt-in limit, allowed when it was loaded).
  std::vector<int> row_caches;
  int64_t max_dynamic_shared = 0;
};
CudaKernel cuda_kernel(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                       int device);

// Tiered compiles (KILN_CUDA_TIERED, on by default): a kernel whose binary is in neither cache
// first runs a stand-in that NVRTC builds in about half the time and that computes the same bits
// (a 4-wide flat kernel's scalar loop; a rows kernel compiled with --Ofast-compile=min), while the
// wanted binary compiles on a background thread and is filed in memory and on disk. The process
// waits for those compiles when it exits.
//   cuda_binary_now: the binary to run now (`stand_in` tells which), needing no GPU.
//   cuda_kernel_tiered: the same, loaded on `device` (CudaKernel::stand_in set for a stand-in).
//   cuda_kernel_if_ready: for a stand-in, the wanted kernel once its binary is ready, or the
//     stand-in marked final when its compile failed (logged under KILN_LOG=codegen); else nullopt.
CudaBinary cuda_binary_now(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                           int sm, bool* stand_in = nullptr);
CudaKernel cuda_kernel_tiered(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                              int device);
std::optional<CudaKernel> cuda_kernel_if_ready(const Kernel& kernel, const Layout& layout,
                                               CudaCallFlags variant, int device,
                                               const CudaKernel& stand_in);
// Tests and benchmarks: turn tiered compiles on or off, and wait for the background compiles.
void set_cuda_tiered_compile(bool on);
void wait_for_background_compiles();

// The variant a launch of (kernel, layout) on `device` needs (what launch_elementwise and
// launch_rows pass the same arguments to): the key, with the layout, of a launcher's loaded
// kernels.
CudaCallFlags launch_variant(const Kernel& kernel, const Layout& layout, int device, int64_t n,
                             const int64_t* sizes, const int64_t* strides, char* const* ptrs);

// One launch's parameters, as cuLaunchKernel takes them (a pointer per kernel parameter), with
// the size each parameter has in the kernel's signature (the tests compare them with the PTX's
// parameter list), and its geometry (one-dimensional).
struct KernelCall {
  unsigned grid = 1, block = 1;
  std::vector<void*> args;
  std::vector<size_t> bytes;
  std::vector<std::unique_ptr<char[]>> storage;  // what args point to
  CudaCallFlags variant;                         // generated kernels: the binary it needs
  void add(const void* value, size_t declared_bytes);
};
// The launch of a flat or strided kernel over n elements (grid capped at 32 blocks per
// multiprocessor); and of a rows kernel, then its finish and columns kernels when it has them
// (every call carries the rows kernel's variant).
KernelCall elementwise_call(const Kernel& kernel, const Layout& layout, int64_t n,
                            const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                            const uint64_t* scalars, int64_t multiprocessors);
std::vector<KernelCall> rows_calls(const Kernel& kernel, const Layout& layout,
                                   const CudaRowsLaunch& geometry, const int64_t* sizes,
                                   const int64_t* strides, char* const* ptrs,
                                   const uint64_t* scalars, void* partials);

// A hand-written kernel (index ops: fuser/codegen/cuda/cuda_index.cpp) named `name`, whose source
// defines `extern "C" __global__ void <name>(...)`: compiled and cached as generated kernels are
// (the key names the kernel, the target and the compiler; the name changes with the source).
CudaBinary source_binary(const std::string& name, const std::string& source, int sm);
CudaKernel source_kernel(const std::string& name, const std::string& source, int device);

// Fills lib/cuda_tensor.h's DeviceKernels::copy and ::source_kernel (exec/init.cpp calls it once).
void register_device_kernels();

// Launches a flat or strided elementwise kernel over `n` elements (sizes/strides as the CPU
// kernels take them: strided only), `ptrs` being device pointers (inputs, then outputs) and
// `scalars` 8 bytes per kernel scalar. `fn` must be the variant launch_variant gives (checked).
void launch_elementwise(const CudaKernel& fn, const Kernel& kernel, const Layout& layout,
                        int device, int64_t n, const int64_t* sizes, const int64_t* strides,
                        char* const* ptrs, const uint64_t* scalars);

// Launches a rows kernel (and its finish and columns kernels) by the geometry of
// cuda_rows_launch, `sizes` and `strides` as the CPU rows kernels take them; the partials buffer
// comes from the device's caching allocator. `fn` must be the variant launch_variant gives
// (checked).
void launch_rows(const CudaKernel& fn, const Kernel& kernel, const Layout& layout, int device,
                 const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                 const uint64_t* scalars);

}  // namespace kiln::fuser::cuda
