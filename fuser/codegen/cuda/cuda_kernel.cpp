// Compiled CUDA kernels: NVRTC output through the memory and disk caches, and the modules loaded
// from it (see cuda_kernel.h; their launches are in cuda_kernel_call.cpp).
#include "fuser/codegen/cuda/cuda_kernel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "fuser/cache.h"
#include "fuser/codegen/cuda/background_compiles.h"
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/nvrtc.h"
#include "fuser/fuse.h"
#include "fuser/registration.h"
#include "jit/dump.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/env.h"
#include "lib/profiler.h"
#include "lib/stats_registry.h"

namespace kiln::fuser::cuda {

namespace {
// The compiled kernels of this process.
struct CudaKernelState {
  std::mutex mu;
  // Binaries by their key (cuda_binary_key, source_binary_key).
  absl::flat_hash_map<std::string, std::shared_ptr<const CudaBinary>> binaries;  // guarded by mu
  // Keys whose background compile failed: their stand-ins serve for good.
  absl::flat_hash_set<std::string> failed;  // guarded by mu
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
// One binary's compile: where it is filed and what NVRTC builds it from.
struct BinaryJob {
  std::string key;  // in memory (cuda_binary_key, source_binary_key)
  std::string symbol;
  int arch = 0;
  bool ptx = false;
  std::string source;
  std::vector<std::string> options = cuda_compile_options();
  bool to_disk = true;   // stand-ins compiled with other options stay in memory
  std::string dump_tag;  // KILN_DUMP's file names: the variant (".i32.vec4"), "" for hand-written
};

// The variant in KILN_DUMP's file names: index width, 4-wide, registers per thread x block.
std::string variant_tag(CudaCallFlags v) {
  return std::string(v.index32 ? ".i32" : ".i64") + (v.vec ? ".vec4" : "") +
         (v.per_thread > 0 ? ".k" + std::to_string(v.per_thread) + "x" + std::to_string(v.block)
                           : "");
}

BinaryJob binary_job(const std::string& key, const std::string& symbol, int sm, std::string source,
                     std::string dump_tag = "") {
  BinaryJob job;
  job.key = key;
  job.dump_tag = std::move(dump_tag);
  job.symbol = symbol;
  job.arch = target_arch(sm, &job.ptx);
  job.source = std::move(source);
  return job;
}

// The binary filed in memory under `key`, or nullptr; a lookup for a launch counts as a hit.
std::shared_ptr<const CudaBinary> memory_binary(const std::string& key, bool count_hit = true) {
  CudaKernelState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.binaries.find(key);
  if (it == s.binaries.end()) return nullptr;
  if (count_hit) ++s.stats.memory_hits;
  return it->second;
}

std::shared_ptr<const CudaBinary> file_in_memory(const std::string& key,
                                                 std::shared_ptr<const CudaBinary> binary) {
  CudaKernelState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.binaries.emplace(key, std::move(binary)).first->second;
}

// The binary the disk cache holds for the job (then filed in memory), or nullptr. On disk, a
// binary is filed under the source it was compiled from (with the target, the compiler and its
// options): a change of the code generator's output can never load a binary built from other code.
// `span` (the caller's "compile") is renamed for a hit. While KILN_DUMP is on, nothing is read
// from disk, so that every kernel the process uses is compiled and dumped (as on the CPU).
std::shared_ptr<const CudaBinary> disk_binary(const BinaryJob& job, detail::ProfileSpan& span) {
  if (jit::dump_enabled()) return nullptr;
  std::optional<std::string> image =
      DiskCache::instance().load(cuda_disk_key(job.source, job.arch, job.ptx), kCudaBinary);
  if (!image) return nullptr;
  span.set_name("kernel.disk_load");
  span.set_category(profiler::Category::kCache);
  auto binary = std::make_shared<CudaBinary>(CudaBinary{std::move(*image), job.symbol, job.ptx});
  {
    std::lock_guard<std::mutex> lock(state().mu);
    ++state().stats.disk_hits;
  }
  return file_in_memory(job.key, std::move(binary));
}

// Whether an NVRTC compile has returned in this process (see compile_in_background), and the
// smallest program that makes it so.
std::atomic<bool> g_compiled{false};
constexpr const char* kNvrtcStart = "extern \"C\" __global__ void kiln_nvrtc_start() {}\n";

// KILN_DUMP: the job's source, NVRTC's log (for a cubin, ptxas's report of each function's
// registers, spills and shared memory: what occupancy follows from, readable without a GPU) and
// its PTX (compiled again for that, only while dumping), as kernels/<symbol><tag>.cu, .nvrtc.log
// and .ptx. A failure here is logged, never raised: the kernel itself compiled.
void dump_compile(const BinaryJob& job, const CudaCompiled& out) {
  const std::string name = job.symbol + job.dump_tag;
  jit::dump_kernel_file(name, ".cu", job.source);
  jit::dump_kernel_file(name, ".nvrtc.log", out.log);
  try {
    jit::dump_kernel_file(
        name, ".ptx",
        job.ptx
            ? out.code
            : nvrtc_compile(job.source, job.symbol, job.arch, CudaOutput::kPtx, job.options).code);
  } catch (const Error& e) {
    jit::log("codegen", "KILN_DUMP: no PTX for ", name, ": ", e.what());
  }
}

// NVRTC's build of the job, filed in memory and (unless a stand-in) on disk.
std::shared_ptr<const CudaBinary> compile_binary(const BinaryJob& job) {
  jit::log("cuda", "source of ", job.symbol, ":\n", job.source);
  const bool dump = jit::dump_enabled();
  std::vector<std::string> options = job.options;
  if (dump && !job.ptx) options.push_back("--ptxas-options=--verbose");
  const auto start = std::chrono::steady_clock::now();
  CudaCompiled out = nvrtc_compile(job.source, job.symbol, job.arch,
                                   job.ptx ? CudaOutput::kPtx : CudaOutput::kCubin, options);
  g_compiled.store(true);
  if (!out.log.empty()) jit::log("codegen", "NVRTC log for ", job.symbol, ": ", out.log);
  auto binary = std::make_shared<CudaBinary>(CudaBinary{out.code, job.symbol, job.ptx});
  if (job.to_disk)
    DiskCache::instance().store(cuda_disk_key(job.source, job.arch, job.ptx), kCudaBinary,
                                binary->image);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(state().mu);
    ++state().stats.compiles;
    state().stats.compile_seconds += seconds;
  }
  if (dump) dump_compile(job, out);
  return file_in_memory(job.key, std::move(binary));
}

// The binary filed under `key` (which names the target and compiler), from memory, the disk cache,
// or NVRTC compiling source() for sm.
CudaBinary compile_cached(const std::string& key, const std::string& symbol, int sm,
                          const std::function<std::string()>& source, bool* from_disk,
                          const std::string& dump_tag = "") {
  if (from_disk) *from_disk = false;
  if (auto binary = memory_binary(key)) return *binary;
  detail::ProfileSpan span("compile");
  span.set_detail(symbol);
  const BinaryJob job = binary_job(key, symbol, sm, source(), dump_tag);
  if (auto binary = disk_binary(job, span)) {
    if (from_disk) *from_disk = true;
    return *binary;
  }
  return *compile_binary(job);
}

// A rows kernel's generic variant keeps rows in dynamic shared memory: its caches, and the opt-in
// to more than the default 48 KiB (up to the device's limit less the static shared memory).
void allow_row_caches(CudaKernel& k, const Kernel& kernel, const Layout& layout,
                      const detail::cuda::Module& module) {
  if (!layout.rows || k.variant.per_thread > 0) return;
  k.row_caches = cuda_row_caches(kernel, layout);
  if (k.row_caches.empty()) return;
  constexpr int kStaticShared = 1024;  // the block reduction's scratch (256 bytes), and room
  const int optin = detail::cuda::device_info(module.device()).max_shared_per_block_optin;
  k.max_dynamic_shared = std::max(0, optin - kStaticShared);
  if (k.max_dynamic_shared > 48 * 1024)
    module.allow_dynamic_shared(k.fn, static_cast<int>(k.max_dynamic_shared));
}

// The binary loaded on `device` (one module per device and key) and its entry points: a fused
// kernel's (`kernel` in `layout`: with a rows kernel's finish and columns functions and row
// caches), or a hand-written one's (null).
CudaKernel load_cached(const std::string& key, const CudaBinary& binary, int device,
                       CudaCallFlags variant, const Kernel* kernel = nullptr,
                       const Layout* layout = nullptr) {
  const bool rows = kernel && layout->rows;
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
  if (rows && kernel->num_globals > 0) k.finish = module->function(binary.symbol + "_finish");
  if (rows && kernel->num_columns() > 0) k.columns = module->function(binary.symbol + "_columns");
  // The name must outlive the call: keep it beside the module.
  auto owner = std::make_shared<std::pair<std::shared_ptr<detail::cuda::Module>, std::string>>(
      module, binary.symbol);
  k.name = owner->second.c_str();
  k.owner = owner;
  k.variant = variant;
  if (rows) allow_row_caches(k, *kernel, *layout, *module);
  return k;
}
}  // namespace

CudaBinary cuda_binary(const Kernel& kernel, const Layout& layout, CudaCallFlags variant, int sm,
                       bool* from_disk) {
  const std::string symbol = kernel_symbol(kernel_key(kernel, layout), kernel);
  return compile_cached(
      cuda_binary_key(kernel, layout, variant, sm), symbol, sm,
      [&] { return cuda_source(kernel, layout, symbol, variant); }, from_disk,
      variant_tag(cuda_variant(kernel, layout, variant)));
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
  return load_cached(key, cuda_binary(kernel, layout, variant, sm), device, variant, &kernel,
                     &layout);
}

namespace {
// -1 until KILN_CUDA_TIERED is read, then 0 or 1 (set_cuda_tiered_compile overrides).
std::atomic<int> g_tiered{-1};

bool tiered_compile() {
  int on = g_tiered.load(std::memory_order_relaxed);
  if (on < 0) {
    on = detail::env_bool("KILN_CUDA_TIERED") ? 1 : 0;
    int unread = -1;
    if (!g_tiered.compare_exchange_strong(unread, on)) on = unread;
  }
  return on == 1;
}

// Whether a quicker-to-compile binary can stand in for (layout, variant)'s: a 4-wide flat
// kernel's scalar loop (the body once, where the 4-wide loop and its tail inline it five times),
// or a rows kernel compiled with NVRTC's --Ofast-compile=min (unless KILN_CUDA_FAST_COMPILE
// already gives a level).
bool has_stand_in(const Layout& layout, CudaCallFlags variant, const BinaryJob& job) {
  if (!layout.rows) return variant.vec;
  return std::none_of(job.options.begin(), job.options.end(),
                      [](const std::string& o) { return o.rfind("--Ofast-compile", 0) == 0; });
}

// A binary to run and the key and variant it was filed under.
struct Runnable {
  std::shared_ptr<const CudaBinary> binary;
  std::string key;
  CudaCallFlags variant;
  bool stand_in = false;
};

// The stand-in for `job`'s binary (has_stand_in), through the caches (`span`: the caller's
// "compile").
Runnable stand_in(const Kernel& kernel, const Layout& layout, CudaCallFlags variant, int sm,
                  const BinaryJob& job, detail::ProfileSpan& span) {
  if (!layout.rows) {
    variant.vec = false;
    const std::string key = cuda_binary_key(kernel, layout, variant, sm);
    std::shared_ptr<const CudaBinary> binary = memory_binary(key);
    if (!binary) {
      const BinaryJob scalar =
          binary_job(key, job.symbol, sm, cuda_source(kernel, layout, job.symbol, variant),
                     variant_tag(variant));
      binary = disk_binary(scalar, span);
      if (!binary) binary = compile_binary(scalar);
    }
    return {binary, key, variant, true};
  }
  BinaryJob quick = job;
  quick.key += "|stand-in";
  quick.options.push_back("--Ofast-compile=min");
  quick.to_disk = false;
  quick.dump_tag += ".stand-in";
  std::shared_ptr<const CudaBinary> binary = memory_binary(quick.key);
  return {binary ? binary : compile_binary(quick), quick.key, variant, true};
}

// Compiles `job` on a background thread (once per key), filing it in memory and on disk; a key
// whose compile fails is remembered, so that its stand-in serves for good.
void compile_in_background(const BinaryJob& job) {
  // The queue's exit handler (which waits for running compiles) must be registered after the exit
  // handlers of what NVRTC sets up on its first compile, or those would tear NVRTC down under a
  // compile still running at exit: so NVRTC has compiled something before the queue starts.
  if (!g_compiled.load()) {
    nvrtc_compile(kNvrtcStart, "kiln_nvrtc_start", job.arch, CudaOutput::kPtx);
    g_compiled.store(true);
  }
  BackgroundCompiles::instance().submit(job.key, [job] {
    if (memory_binary(job.key, false)) return;
    try {
      compile_binary(job);
    } catch (...) {
      std::lock_guard<std::mutex> lock(state().mu);
      state().failed.insert(job.key);
      throw;  // logged by the queue
    }
    std::lock_guard<std::mutex> lock(state().mu);
    ++state().stats.background_compiles;
  });
}

// The binary for (kernel, layout, variant) from the caches; else, where a stand-in exists and
// tiered compiles are on, the stand-in while the binary compiles in the background; else NVRTC's
// build now.
Runnable runnable_binary(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                         int sm) {
  variant = cuda_variant(kernel, layout, variant);
  const std::string key = cuda_binary_key(kernel, layout, variant, sm);
  if (auto binary = memory_binary(key)) return {binary, key, variant};
  const std::string symbol = kernel_symbol(kernel_key(kernel, layout), kernel);
  detail::ProfileSpan span("compile");
  span.set_detail(symbol);
  const BinaryJob job = binary_job(key, symbol, sm, cuda_source(kernel, layout, symbol, variant),
                                   variant_tag(variant));
  if (auto binary = disk_binary(job, span)) return {binary, key, variant};
  if (!tiered_compile() || !has_stand_in(layout, variant, job))
    return {compile_binary(job), key, variant};
  // Queued once the stand-in is built, so that the stand-in's compile has the host to itself.
  Runnable quick = stand_in(kernel, layout, variant, sm, job, span);
  compile_in_background(job);
  std::lock_guard<std::mutex> lock(state().mu);
  ++state().stats.stand_ins;
  return quick;
}

CudaKernel load_runnable(const Runnable& r, const Kernel& kernel, const Layout& layout,
                         int device) {
  CudaKernel k = load_cached(r.key, *r.binary, device, r.variant, &kernel, &layout);
  k.stand_in = r.stand_in;
  return k;
}
}  // namespace

void set_cuda_tiered_compile(bool on) {
  g_tiered.store(on ? 1 : 0);
}

void wait_for_background_compiles() {
  BackgroundCompiles::instance().wait_idle();
}

CudaBinary cuda_binary_now(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                           int sm, bool* stand_in) {
  const Runnable r = runnable_binary(kernel, layout, variant, sm);
  if (stand_in) *stand_in = r.stand_in;
  return *r.binary;
}

CudaKernel cuda_kernel_tiered(const Kernel& kernel, const Layout& layout, CudaCallFlags variant,
                              int device) {
  const int sm = detail::cuda::device_info(device).sm;
  return load_runnable(runnable_binary(kernel, layout, variant, sm), kernel, layout, device);
}

std::optional<CudaKernel> cuda_kernel_if_ready(const Kernel& kernel, const Layout& layout,
                                               CudaCallFlags variant, int device,
                                               const CudaKernel& stand_in) {
  const int sm = detail::cuda::device_info(device).sm;
  variant = cuda_variant(kernel, layout, variant);
  const std::string key = cuda_binary_key(kernel, layout, variant, sm);
  if (auto binary = memory_binary(key, false)) {
    {
      std::lock_guard<std::mutex> lock(state().mu);
      ++state().stats.upgrades;
    }
    return load_runnable({binary, key, variant}, kernel, layout, device);
  }
  std::lock_guard<std::mutex> lock(state().mu);
  if (!state().failed.contains(key)) return std::nullopt;
  CudaKernel kept = stand_in;
  kept.stand_in = false;
  return kept;
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
  return load_cached(source_binary_key(name, sm), source_binary(name, source, sm), device,
                     CudaCallFlags{});
}

}  // namespace kiln::fuser::cuda

namespace kiln::fuser {

void register_cuda_codegen_stats() {
  detail::register_stats("cuda_codegen", [] {
    const cuda::CudaCompileStats s = cuda::cuda_compile_stats();
    return detail::StatValues{
        {"compiles", s.compiles},       {"disk_hits", s.disk_hits},
        {"memory_hits", s.memory_hits}, {"compile_seconds", s.compile_seconds},
        {"stand_ins", s.stand_ins},     {"background_compiles", s.background_compiles}};
  });
}

}  // namespace kiln::fuser
