// Compiled CUDA kernels: NVRTC output through the memory and disk caches, loading and launching
// (see cuda_kernel.h).
#include "fuser/codegen/cuda/cuda_kernel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/cache.h"
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/nvrtc.h"
#include "fuser/fuse.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_memory.h"
#include "lib/cuda_tensor.h"
#include "lib/profiler.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser::cuda {

namespace {
// Threads per block of the elementwise kernels: 256 keeps occupancy full on every architecture
// from sm_75 on, and the grid is capped at this many blocks per multiprocessor (the grid-stride
// loop covers the rest), so that huge tensors do not launch millions of short-lived blocks.
constexpr int64_t kThreads = 256;
constexpr int64_t kBlocksPerMultiprocessor = 32;

struct State {
  std::mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<const CudaBinary>> binaries;  // by disk key
  // Loaded modules by (device, disk key).
  absl::flat_hash_map<std::string, std::shared_ptr<detail::cuda::Module>> modules;
  CudaCompileStats stats;
};
State& state() {
  static auto* s = new State();  // never destroyed: modules may be released during exit
  return *s;
}

// The newest architecture this NVRTC builds cubins for that the device runs (its own, or PTX of
// an older one when the device is newer than the compiler).
// NVRTC's version and architectures, asked once: every kernel lookup needs them for its key.
const std::string& compiler_version() {
  static const std::string v = nvrtc_version();
  return v;
}

int target_arch(int sm, bool* ptx) {
  static const std::vector<int> archs = nvrtc_supported_archs();
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
  State& s = state();
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
  State& s = state();
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

void KernelCall::add(const void* value, size_t declared_bytes) {
  // The parameter's bytes (a scalar's are the low bytes of its 8-byte slot: little-endian).
  auto block = std::make_unique<char[]>(std::max<size_t>(declared_bytes, 8));
  std::memcpy(block.get(), value, declared_bytes);
  args.push_back(block.get());
  bytes.push_back(declared_bytes);
  storage.push_back(std::move(block));
}

namespace {
size_t scalar_bytes(DType t) {
  return t == kBool ? 1 : element_size(t);
}

void add_pointers_and_scalars(KernelCall& call, const Kernel& kernel, const Layout& layout,
                              char* const* ptrs, const uint64_t* scalars) {
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  for (size_t p = 0; p < num_ptrs; ++p) {
    if (p < layout.by_value.size() && layout.by_value[p])  // the value itself, copied now
      call.add(ptrs[p], scalar_bytes(kernel.input_types[p]));
    else
      call.add(&ptrs[p], sizeof(char*));
  }
  for (size_t k = 0; k < kernel.scalar_types.size(); ++k) {
    const uint64_t slot = scalars ? scalars[k] : 0;
    call.add(&slot, scalar_bytes(kernel.scalar_types[k]));
  }
}
}  // namespace

namespace {
int64_t elementwise_blocks(const Layout& layout, int64_t n, int64_t multiprocessors) {
  const int64_t per_thread = layout.flat ? 4 : 1;
  return std::max<int64_t>(1, std::min((n + kThreads * per_thread - 1) / (kThreads * per_thread),
                                       multiprocessors * kBlocksPerMultiprocessor));
}
}  // namespace

namespace {
// The variant a rows launch of this geometry needs (rows kernels have no vec variant).
CudaCallFlags rows_variant(const CudaRowsLaunch& g) {
  return {g.index32, false, g.per_thread, g.per_thread > 0 ? g.threads : 0};
}
}  // namespace

CudaCallFlags launch_variant(const Kernel& kernel, const Layout& layout, int device, int64_t n,
                             const int64_t* sizes, const int64_t* strides, char* const* ptrs) {
  if (layout.rows) return rows_variant(cuda_rows_launch(kernel, layout, sizes, strides));
  const int64_t blocks =
      elementwise_blocks(layout, n, detail::cuda::device_info(device).multiprocessors);
  return cuda_call_flags(kernel, layout, n, sizes, strides, ptrs, blocks * kThreads);
}

KernelCall elementwise_call(const Kernel& kernel, const Layout& layout, int64_t n,
                            const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                            const uint64_t* scalars, int64_t multiprocessors) {
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  const int64_t blocks = elementwise_blocks(layout, n, multiprocessors);
  KernelCall call;
  call.variant = cuda_call_flags(kernel, layout, n, sizes, strides, ptrs, blocks * kThreads);
  call.grid = static_cast<unsigned>(blocks);
  call.block = static_cast<unsigned>(kThreads);
  const long long count = n;
  call.add(&count, sizeof count);
  if (!layout.flat) {
    // The dims struct, by value: sizes then strides, as the CPU kernels take them.
    const auto rank = static_cast<size_t>(layout.rank);
    std::vector<long long> dims(sizes, sizes + rank);
    dims.insert(dims.end(), strides, strides + rank * num_ptrs);
    call.add(dims.data(), dims.size() * sizeof(long long));
  }
  add_pointers_and_scalars(call, kernel, layout, ptrs, scalars);
  return call;
}

std::vector<KernelCall> rows_calls(const Kernel& kernel, const Layout& layout,
                                   const CudaRowsLaunch& geometry, const int64_t* sizes,
                                   const int64_t* strides, char* const* ptrs,
                                   const uint64_t* scalars, void* partials) {
  const auto rank = static_cast<size_t>(layout.rank);
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  long long rows = 1;
  for (size_t d = 0; d < rank; ++d) rows *= sizes[d];
  std::vector<KernelCall> calls(1);
  calls.reserve(3);  // the finish and columns calls: `main` must stay where it is
  KernelCall& main = calls[0];
  main.grid = static_cast<unsigned>(geometry.blocks);
  main.block = static_cast<unsigned>(geometry.threads);
  main.variant = rows_variant(geometry);
  std::vector<long long> dims(sizes, sizes + rank + 1);
  dims.insert(dims.end(), strides, strides + (rank + 1) * num_ptrs);
  main.add(&rows, sizeof rows);
  main.add(dims.data(), dims.size() * sizeof(long long));
  add_pointers_and_scalars(main, kernel, layout, ptrs, scalars);
  if (geometry.partials_bytes > 0) main.add(&partials, sizeof partials);
  const long long blocks = geometry.blocks, stride = geometry.stride, R = sizes[rank];
  if (kernel.num_globals > 0) {
    KernelCall finish;  // one thread (ABI)
    finish.variant = main.variant;
    finish.add(&blocks, sizeof blocks);
    finish.add(&stride, sizeof stride);
    finish.add(&partials, sizeof partials);
    add_pointers_and_scalars(finish, kernel, layout, ptrs, scalars);
    calls.push_back(std::move(finish));
  }
  if (kernel.num_columns() > 0) {
    KernelCall columns;
    columns.variant = main.variant;
    columns.grid = static_cast<unsigned>(std::max<int64_t>(1, geometry.columns_blocks));
    columns.block = static_cast<unsigned>(std::max(32, geometry.columns_threads));
    columns.add(&blocks, sizeof blocks);
    columns.add(&stride, sizeof stride);
    columns.add(&R, sizeof R);
    columns.add(&partials, sizeof partials);
    add_pointers_and_scalars(columns, kernel, layout, ptrs, scalars);
    calls.push_back(std::move(columns));
  }
  return calls;
}

void launch_elementwise(const CudaKernel& fn, const Kernel& kernel, const Layout& layout,
                        int device, int64_t n, const int64_t* sizes, const int64_t* strides,
                        char* const* ptrs, const uint64_t* scalars) {
  if (n == 0) return;
  KernelCall call = elementwise_call(kernel, layout, n, sizes, strides, ptrs, scalars,
                                     detail::cuda::device_info(device).multiprocessors);
  // A 32-bit binary on a call that needs 64 bits, or a 4-wide one on misaligned pointers, would
  // compute wrong elements without a fault: a launcher that cached the wrong variant must fail.
  KILN_CHECK(call.variant == fn.variant, "CUDA: ", fn.name, " launched as variant index32 ",
             fn.variant.index32, " vec ", fn.variant.vec, " for a call that needs index32 ",
             call.variant.index32, " vec ", call.variant.vec);
  detail::cuda::launch(device, fn.fn, {call.grid, call.block, 0}, call.args.data(), fn.name);
}

void launch_rows(const CudaKernel& fn, const Kernel& kernel, const Layout& layout, int device,
                 const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                 const uint64_t* scalars) {
  const CudaRowsLaunch geometry = cuda_rows_launch(kernel, layout, sizes, strides);
  const CudaCallFlags need = rows_variant(geometry);
  KILN_CHECK(need == fn.variant, "CUDA: ", fn.name, " launched as variant index32 ",
             fn.variant.index32, " vec ", fn.variant.vec, " per_thread ", fn.variant.per_thread,
             " block ", fn.variant.block, " for rows that need index32 ", need.index32,
             " per_thread ", need.per_thread, " block ", need.block);
  // The partials go back to the allocator right after the launches: a later allocation on the same
  // stream runs after them, so the block is not reused early.
  struct Partials {
    int device;
    void* p = nullptr;
    ~Partials() {
      if (p) detail::cuda::device_free(device, p);
    }
  } partials{device};
  if (geometry.partials_bytes > 0)
    partials.p = detail::cuda::device_alloc(device, static_cast<size_t>(geometry.partials_bytes));
  std::vector<KernelCall> calls =
      rows_calls(kernel, layout, geometry, sizes, strides, ptrs, scalars, partials.p);
  void* functions[3] = {fn.fn, nullptr, nullptr};
  size_t next = 1;
  if (kernel.num_globals > 0) functions[next++] = fn.finish;
  if (kernel.num_columns() > 0) functions[next++] = fn.columns;
  for (size_t i = 0; i < calls.size(); ++i)
    detail::cuda::launch(device, functions[i],
                         {calls[i].grid, calls[i].block, i == 0 ? geometry.shared_bytes : 0u},
                         calls[i].args.data(), fn.name);
}

namespace {
// A copy within a device as a generated kernel of one load (and a cast): the same code path as a
// fused group's, so it is cached and specialized on layout like one. With fusion off (KILN_FUSE=0)
// it declines, and the copy goes through the host like every other op.
bool copy_within_device(const Tensor& dst, const Tensor& src) {
  if (!fusion_enabled()) return false;
  const int64_t n = dst.numel();
  if (n == 0) return true;
  const int device = dst.device().index;
  Kernel k;
  k.ops = "copy";
  k.input_types = {src.dtype()};
  Instr load{Prim::Load, src.dtype()};
  load.index = 0;
  int32_t v = k.add(load);
  if (src.dtype() != dst.dtype()) {
    Instr cast{Prim::Cast, dst.dtype()};
    cast.a = v;
    v = k.add(cast);
  }
  k.outputs = {v};
  k.output_types = {dst.dtype()};
  char* ptrs[2] = {src.impl()->data(), dst.impl()->data()};
  Layout layout;
  const bool single = src.numel() == 1;
  if (dst.is_contiguous() && (single || (src.numel() == n && src.is_contiguous()))) {
    layout.single_element = {single};
    const CudaCallFlags variant = launch_variant(k, layout, device, n, nullptr, nullptr, ptrs);
    launch_elementwise(cuda_kernel(k, layout, variant, device), k, layout, device, n, nullptr,
                       nullptr, ptrs, nullptr);
    return true;
  }
  layout.flat = false;
  layout.rank = static_cast<int32_t>(dst.dim());
  const Shape& sizes = dst.sizes();
  std::vector<int64_t> strides = detail::broadcast_strides(src, sizes);
  strides.insert(strides.end(), dst.strides().begin(), dst.strides().end());
  const size_t rank = sizes.size();
  for (size_t p = 0; p < 2; ++p) {
    const int64_t s = strides[p * rank + rank - 1];
    layout.inner.push_back(sizes.back() == 1 || s == 0 ? Layout::kZero
                           : s == 1                    ? Layout::kUnit
                                                       : Layout::kAny);
  }
  const CudaCallFlags variant =
      launch_variant(k, layout, device, n, sizes.data(), strides.data(), ptrs);
  launch_elementwise(cuda_kernel(k, layout, variant, device), k, layout, device, n, sizes.data(),
                     strides.data(), ptrs, nullptr);
  return true;
}

// Hand-written kernels of lib/ (lib/cuda_tensor.h's DeviceKernels::source_kernel).
void* source_kernel_function(const std::string& name, const std::string& source, int device) {
  return source_kernel(name, source, device).fn;
}
}  // namespace

void register_device_kernels() {
  detail::device_kernels().copy = &copy_within_device;
  detail::device_kernels().source_kernel = &source_kernel_function;
}

}  // namespace kiln::fuser::cuda
