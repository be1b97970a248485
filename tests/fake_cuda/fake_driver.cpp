// A stand-in for libcuda.so.1 over host memory, for testing kiln's CUDA runtime on machines
// without a GPU: devices, contexts, streams, memory, copies and events behave as the driver's do
// (copies complete at once), modules load, and launching a kernel fails with
// CUDA_ERROR_NOT_SUPPORTED (nothing can run CUDA code here) unless a test registered a host
// build of that kernel by name (kiln_fake_register_kernel): then the launch calls it, with every
// device allocation open, as one thread whose grid-stride loops cover the whole launch. Device
// memory is a host mapping whose address is the device pointer, kept inaccessible (PROT_NONE)
// except while the fake itself copies: host code that reads or writes device memory directly
// faults, as it would read garbage on a GPU. Every pointer is checked against the live allocations,
// so a host pointer passed as a device one (or a stale one) fails the call instead of passing.
#include <cuda.h>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace {
std::mutex g_mu;
std::map<uintptr_t, size_t> g_device;  // live device allocations: address -> size
std::map<uintptr_t, size_t> g_pinned;
int g_context_tag, g_stream_tag, g_module_tag;
// A function handle per kernel name, and the host builds tests registered (under g_mu).
struct Function {
  std::string name;
  void (*host)(void** args) = nullptr;
};
std::map<std::string, std::unique_ptr<Function>> g_functions;
Function* function_named(const std::string& name) {
  std::unique_ptr<Function>& f = g_functions[name];
  if (!f) f.reset(new Function{name});
  return f.get();
}

size_t mapped_size(size_t n) {
  return (std::max<size_t>(n, 1) + 4095) / 4096 * 4096;
}

// Makes the device allocation holding p accessible (on) or not (off); under g_mu.
void set_access(uintptr_t p, bool on) {
  auto it = g_device.upper_bound(p);
  if (it == g_device.begin()) return;
  --it;
  mprotect(reinterpret_cast<void*>(it->first), mapped_size(it->second),
           on ? PROT_READ | PROT_WRITE : PROT_NONE);
}

// The fake's own access to device memory, for the duration of one copy (under g_mu).
struct Access {
  uintptr_t a, b;
  explicit Access(uintptr_t a_, uintptr_t b_ = 0) : a(a_), b(b_) {
    set_access(a, true);
    if (b) set_access(b, true);
  }
  ~Access() {
    set_access(a, false);
    if (b) set_access(b, false);
  }
};

bool inside(const std::map<uintptr_t, size_t>& m, uintptr_t p, size_t n) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return n == 0;
  --it;
  return p >= it->first && p + n <= it->first + it->second;
}
bool device_range(CUdeviceptr p, size_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  return inside(g_device, static_cast<uintptr_t>(p), n);
}
bool host_range_is_not_device(const void* p, size_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  return n == 0 || !inside(g_device, reinterpret_cast<uintptr_t>(p), 1);
}
}  // namespace

extern "C" {

CUresult cuInit(unsigned int) {
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::strncpy(name, "kiln fake CUDA device (host memory)", static_cast<size_t>(len));
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *v = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *v = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *v = 4;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *v = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      *v = 49152;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:  // an H100's
      *v = 232448;
      break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:  // small, so that tests' convolutions run in chunks
      *v = 64 << 10;
      break;
    default:
      *v = 0;
  }
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice) {
  *bytes = size_t{1} << 30;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = reinterpret_cast<CUcontext>(&g_context_tag);
  return CUDA_SUCCESS;
}
thread_local CUcontext t_current = nullptr;
CUresult cuCtxSetCurrent(CUcontext c) {
  t_current = c;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = t_current;
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream* s, unsigned int) {
  *s = reinterpret_cast<CUstream>(&g_stream_tag);
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream) {
  return t_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
CUresult cuMemAlloc(CUdeviceptr* p, size_t n) {
  if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
  void* q =
      mmap(nullptr, mapped_size(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(q, 0xa5, n);  // garbage, as fresh device memory holds
  mprotect(q, mapped_size(n), PROT_NONE);
  std::lock_guard<std::mutex> lock(g_mu);
  g_device[reinterpret_cast<uintptr_t>(q)] = n;
  *p = reinterpret_cast<CUdeviceptr>(q);
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_device.find(static_cast<uintptr_t>(p));
  if (it == g_device.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(p), mapped_size(it->second));
  g_device.erase(it);
  return CUDA_SUCCESS;
}
CUresult cuMemHostAlloc(void** p, size_t n, unsigned int) {
  *p = std::malloc(n ? n : 1);
  std::lock_guard<std::mutex> lock(g_mu);
  g_pinned[reinterpret_cast<uintptr_t>(*p)] = n;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_pinned.erase(reinterpret_cast<uintptr_t>(p))) return CUDA_ERROR_INVALID_VALUE;
  std::free(p);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream) {
  if (!device_range(dst, n) || !host_range_is_not_device(src, n)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  Access access(static_cast<uintptr_t>(dst));
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream) {
  if (!device_range(src, n) || !host_range_is_not_device(dst, n)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  Access access(static_cast<uintptr_t>(src));
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) {
  if (!device_range(dst, n) || !device_range(src, n)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  Access access(static_cast<uintptr_t>(dst), static_cast<uintptr_t>(src));
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream) {
  if (!device_range(dst, n)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  Access access(static_cast<uintptr_t>(dst));
  std::memset(reinterpret_cast<void*>(dst), v, n);
  return CUDA_SUCCESS;
}
// An event holds the time it was recorded at: the fake's work is done when it is issued.
CUresult cuEventCreate(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(new std::chrono::steady_clock::time_point());
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream) {
  *reinterpret_cast<std::chrono::steady_clock::time_point*>(e) = std::chrono::steady_clock::now();
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  using Time = std::chrono::steady_clock::time_point;
  *ms = std::chrono::duration<float, std::milli>(*reinterpret_cast<Time*>(end) -
                                                 *reinterpret_cast<Time*>(start))
            .count();
  return CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent) {
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent) {
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent e) {
  delete reinterpret_cast<std::chrono::steady_clock::time_point*>(e);
  return CUDA_SUCCESS;
}
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  if (!image) return CUDA_ERROR_INVALID_IMAGE;
  *m = reinterpret_cast<CUmodule>(&g_module_tag);
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule) {
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  *f = reinterpret_cast<CUfunction>(function_named(name));
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int value) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  const bool shared = a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
  return shared && value >= 0 && value <= 232448 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuLaunchKernel(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void** args, void**) {
  std::lock_guard<std::mutex> lock(g_mu);
  Function* fn = reinterpret_cast<Function*>(f);
  if (!fn || !fn->host) return CUDA_ERROR_NOT_SUPPORTED;
  for (const auto& [p, n] : g_device) set_access(p, true);
  fn->host(args);
  for (const auto& [p, n] : g_device) set_access(p, false);
  return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult r, const char** s) {
  *s = r == CUDA_ERROR_NOT_SUPPORTED     ? "CUDA_ERROR_NOT_SUPPORTED"
       : r == CUDA_ERROR_INVALID_VALUE   ? "CUDA_ERROR_INVALID_VALUE"
       : r == CUDA_ERROR_OUT_OF_MEMORY   ? "CUDA_ERROR_OUT_OF_MEMORY"
       : r == CUDA_ERROR_INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT"
                                         : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == CUDA_ERROR_NOT_SUPPORTED ? "the fake driver runs no kernels" : "fake driver error";
  return CUDA_SUCCESS;
}

// NVRTC looks this internal table up in whatever libcuda.so.1 is loaded; the fake has none.
CUresult cuGetExportTable(const void** table, const CUuuid*) {
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// For tests: launches of the kernel `name` run `host` (its source built for the host), which takes
// cuLaunchKernel's parameter pointers.
void kiln_fake_register_kernel(const char* name, void (*host)(void** args)) {
  std::lock_guard<std::mutex> lock(g_mu);
  function_named(name)->host = host;
}

// For the fake cuBLAS: opens (on != 0) or closes the device allocation holding p.
void kiln_fake_device_access(const void* p, int on) {
  std::lock_guard<std::mutex> lock(g_mu);
  set_access(reinterpret_cast<uintptr_t>(p), on != 0);
}

}  // extern "C"
