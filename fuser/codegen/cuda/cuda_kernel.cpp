// Compiled CUDA kernels: NVRTC output through the memory and disk caches, and the modules loaded
// from it (see cuda_kernel.h; their launches are in cuda_kernel_call.cpp).
#include "fuser/codegen/cuda/cuda_kernel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/cache.h"
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/nvrtc.h"
#include "fuser/fuse.h"
#include "fuser/registration.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/profiler.h"
#include "lib/stats_registry.h"

namespace kiln::fuser::cuda {

namespace {
// The compiled kernels of this process.
struct CudaKernelState {
  std::mutex mu;
  // Binaries by their key (cuda_binary_key, source_binary_key).
  absl::flat_hash_map<std::string, std::shared_ptr<const CudaBinary>> binaries;  // guarded by mu
  // Loaded modules by (device, binary key).
  absl::flat_hash_map<std::string, std::shared_ptr<detail::cuda::Module>> modules;  // guarded by mu
  CudaCompileStats stats;                                                           // guarded by mu
};
CudaKernelState& state() {
  static auto* s = new CudaKernelState();  // never destroyed: modules may be released during exit
  return *s;
}

// NVRTC's version and architectures, asked once: every kernel lookup needs them for its key.
const std::string& compiler_version() {
  static const std::string v = nvrtc_version();  // set once on first use, then read-only
  return v;
}

// The newest architecture this NVRTC builds cubins for that the device runs (its own, or PTX of
// an older one when the device is newer than the compiler).
int target_arch(int sm, bool* ptx) {
  static const std::vector<int> archs = nvrtc_supported_archs();  // set once, then read-only
  *ptx = std::find(archs.begin(), archs.end(), sm) == archs.end();
  if (!*ptx) return sm;
  int best = 0;
  for (int a : archs)
    if (a <= sm) best = std::max(best, a);
  KILN_CHECK(best > 0, "CUDA: ", nvrtc_version(), " compiles for no architecture that sm_", sm,
             " runs");
  return best;
}

}  // namespace

std::string cuda_binary_key(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                            int sm) {
  bool ptx = false;
  const int arch = target_arch(sm, &ptx);
  variant = cuda_variant(kernel, layout, variant);
  return kernel_key(kernel, layout) + (variant.index32 ? "|index32" : "|index64") +
         (variant.vec ? "|vec4" : "") +
         (variant.per_thread > 0
              ? "|k" + std::to_string(variant.per_thread) + "x" + std::to_string(variant.block)
              : "") +
         (ptx ? "|compute_" : "|sm_") + std::to_string(arch) + "|" + compiler_version();
}

std::string cuda_disk_key(const std::string& source, int arch, bool ptx) {
  std::string key =
      source + (ptx ? "|compute_" : "|sm_") + std::to_string(arch) + "|" + compiler_version();
  for (const std::string& option : cuda_compile_options()) key += "|" + option;
  return key;
}

namespace {
// The binary filed under `key` (which names the target and compiler), from memory, the disk cache,
// or NVRTC compiling source() for sm.
CudaBinary compile_cached(const std::string& key, const std::string& symbol, int sm,
                          const std::function<std::string()>& source, bool* from_disk) {
  if (from_disk) *from_disk = false;
  CudaKernelState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.binaries.find(key);
    if (it != s.binaries.end()) {
      ++s.stats.memory_hits;
      return *it->second;
    }
  }
  auto binary = std::make_shared<CudaBinary>();
  binary->symbol = symbol;
  bool ptx = false;
  const int arch = target_arch(sm, &ptx);
  binary->ptx = ptx;
  detail::ProfileSpan span("compile");
  span.set_detail(binary->symbol);
  // On disk, the binary is filed under the source it was compiled from (with the target, the
  // compiler and its options): a change of the code generator's output can never load a binary
  // built from other code.
  const std::string code = source();
  const std::string disk_key = cuda_disk_key(code, arch, ptx);
  std::optional<std::string> cached = DiskCache::instance().load(disk_key, kCudaBinary);
  if (cached) {
    binary->image = std::move(*cached);
    span.set_name("kernel.disk_load");
    span.set_category(profiler::Category::kCache);
    if (from_disk) *from_disk = true;
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.stats.disk_hits;
  } else {
    jit::log("cuda", "source of ", binary->symbol, ":\n", code);
    const auto start = std::chrono::steady_clock::now();
    CudaCompiled out =
        nvrtc_compile(code, binary->symbol, arch, ptx ? CudaOutput::kPtx : CudaOutput::kCubin,
                      cuda_compile_options());
    if (!out.log.empty()) jit::log("codegen", "NVRTC log for ", binary->symbol, ": ", out.log);
    binary->image = std::move(out.code);
    DiskCache::instance().store(disk_key, kCudaBinary, binary->image);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.stats.compiles;
    s.stats.compile_seconds += seconds;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.binaries.emplace(key, binary);
  return *binary;
}

// The binary loaded on `device` (one module per device and key) and its entry points.
CudaKernel load_cached(const std::string& key, const CudaBinary& binary, int device,
                       bool with_finish, bool with_columns, CudaCallFlags variant) {
  const std::string module_key = std::to_string(device) + "|" + key;
  CudaKernelState& s = state();
  std::shared_ptr<detail::cuda::Module> module;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.modules.find(module_key);
    if (it != s.modules.end()) module = it->second;
  }
  if (!module) {
    module = std::make_shared<detail::cuda::Module>(device, binary.image);
    std::lock_guard<std::mutex> lock(s.mu);
    module = s.modules.emplace(module_key, module).first->second;
  }
  CudaKernel k;
  k.fn = module->function(binary.symbol);
  if (with_finish) k.finish = module->function(binary.symbol + "_finish");
  if (with_columns) k.columns = module->function(binary.symbol + "_columns");
  // The name must outlive the call: keep it beside the module.
  auto owner = std::make_shared<std::pair<std::shared_ptr<detail::cuda::Module>, std::string>>(
      module, binary.symbol);
  k.name = owner->second.c_str();
  k.owner = owner;
  k.variant = variant;
  return k;
}
}  // namespace

CudaBinary cuda_binary(const Kernel& kernel, const Layout& layout, CudaCallFlags variant, int sm,
                       bool* from_disk) {
  const std::string symbol = kernel_symbol(kernel_key(kernel, layout), kernel);
  return compile_cached(
      cuda_binary_key(kernel, layout, variant, sm), symbol, sm,
      [&] { return cuda_source(kernel, layout, symbol, variant); }, from_disk);
}

CudaCompileStats cuda_compile_stats() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().stats;
}

CudaKernel cuda_kernel(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                       int device) {
  const int sm = detail::cuda::device_info(device).sm;
  variant = cuda_variant(kernel, layout, variant);
  const std::string key = cuda_binary_key(kernel, layout, variant, sm);
  return load_cached(key, cuda_binary(kernel, layout, variant, sm), device,
                     layout.rows && kernel.num_globals > 0, layout.rows && kernel.num_columns() > 0,
                     variant);
}

std::string source_binary_key(const std::string& name, int sm) {
  bool ptx = false;
  const int arch = target_arch(sm, &ptx);
  return "source kernel " + name + (ptx ? "|compute_" : "|sm_") + std::to_string(arch) + "|" +
         compiler_version();
}

CudaBinary source_binary(const std::string& name, const std::string& source, int sm) {
  return compile_cached(
      source_binary_key(name, sm), name, sm, [&] { return source; }, nullptr);
}

CudaKernel source_kernel(const std::string& name, const std::string& source, int device) {
  const int sm = detail::cuda::device_info(device).sm;
  return load_cached(source_binary_key(name, sm), source_binary(name, source, sm), device, false,
                     false, CudaCallFlags{});
}

}  // namespace kiln::fuser::cuda

namespace kiln::fuser {

void register_cuda_codegen_stats() {
  detail::register_stats("cuda_codegen", [] {
    const cuda::CudaCompileStats s = cuda::cuda_compile_stats();
    return detail::StatValues{{"compiles", s.compiles},
                              {"disk_hits", s.disk_hits},
                              {"memory_hits", s.memory_hits},
                              {"compile_seconds", s.compile_seconds}};
  });
}

}  // namespace kiln::fuser
