// The CUDA driver, loaded with dlopen on first use (see lib/cuda_driver.h), so that builds with the
// CUDA backend run unchanged on machines without a GPU or driver.
//
// Entry points are looked up by the names cuda.h maps them to (cuMemAlloc is cuMemAlloc_v2), so
// the function table below has exactly the ABI of the header kiln was built against; a driver too
// old to have one of them is reported as unavailable, with the missing name.
#include "lib/cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"

#ifdef KILN_HAS_CUDA
#include <cuda.h>
#endif

namespace kiln::detail::cuda {

namespace {
// The driver's traffic counters.
struct DriverCounters {
  std::atomic<int64_t> h2d_bytes{0};   // atomic: bytes copied host to device
  std::atomic<int64_t> d2h_bytes{0};   // atomic: bytes copied device to host
  std::atomic<int64_t> h2d_copies{0};  // atomic
  std::atomic<int64_t> d2h_copies{0};  // atomic
  std::atomic<int64_t> launches{0};    // atomic: kernels launched
};
DriverCounters& counters() {
  static DriverCounters c;  // constant-initialized: no guard
  return c;
}

#ifdef KILN_HAS_CUDA
#define KILN_CU_NAME_(x) #x
#define KILN_CU_NAME(x) KILN_CU_NAME_(x)
// X(the cuda.h name); the pointer member is named after it, the symbol is what the macro maps it
// to.
#define KILN_CU_FUNCTIONS(X)  \
  X(cuInit)                   \
  X(cuDeviceGetCount)         \
  X(cuDeviceGet)              \
  X(cuDeviceGetName)          \
  X(cuDeviceGetAttribute)     \
  X(cuDeviceTotalMem)         \
  X(cuDevicePrimaryCtxRetain) \
  X(cuCtxSetCurrent)          \
  X(cuCtxGetCurrent)          \
  X(cuStreamCreate)           \
  X(cuStreamSynchronize)      \
  X(cuMemAlloc)               \
  X(cuMemFree)                \
  X(cuMemHostAlloc)           \
  X(cuMemFreeHost)            \
  X(cuMemcpyHtoDAsync)        \
  X(cuMemcpyDtoHAsync)        \
  X(cuMemcpyDtoDAsync)        \
  X(cuMemsetD8Async)          \
  X(cuEventCreate)            \
  X(cuEventRecord)            \
  X(cuEventQuery)             \
  X(cuEventSynchronize)       \
  X(cuEventDestroy)           \
  X(cuEventElapsedTime)       \
  X(cuModuleLoadData)         \
  X(cuModuleUnload)           \
  X(cuModuleGetFunction)      \
  X(cuFuncSetAttribute)       \
  X(cuLaunchKernel)           \
  X(cuGetErrorName)           \
  X(cuGetErrorString)

struct Api {
#define KILN_CU_MEMBER(fn) decltype(&::fn) fn = nullptr;
  KILN_CU_FUNCTIONS(KILN_CU_MEMBER)
#undef KILN_CU_MEMBER
};
#endif

struct PerDevice {
  std::once_flag once;
  DeviceInfo info;
  void* context = nullptr;
  void* stream = nullptr;
};

struct Driver {
  std::string reason;  // empty when usable
  int count = 0;
#ifdef KILN_HAS_CUDA
  Api api;
#endif
  std::vector<std::unique_ptr<PerDevice>> devices;
};

const Driver& driver() {
  static const Driver* d = [] {
    auto* d = new Driver();  // never destroyed: modules and memory may be released during exit
#ifndef KILN_HAS_CUDA
    d->reason = "kiln was built without the CUDA toolkit";
#else
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      d->reason = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") + dlerror();
      return d;
    }
#define KILN_CU_LOOKUP(fn)                                                            \
  d->api.fn = reinterpret_cast<decltype(&::fn)>(dlsym(lib, KILN_CU_NAME(fn)));        \
  if (!d->api.fn) {                                                                   \
    d->reason = "the CUDA driver lacks " KILN_CU_NAME(fn) " (a driver too old for " \
                "the CUDA toolkit kiln was built with)"; \
    return d;                                                                         \
  }
    KILN_CU_FUNCTIONS(KILN_CU_LOOKUP)
#undef KILN_CU_LOOKUP
    CUresult r = d->api.cuInit(0);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      d->api.cuGetErrorName(r, &name);
      d->reason = std::string("cuInit failed: ") + (name ? name : "unknown error");
      return d;
    }
    int n = 0;
    if (d->api.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0) {
      d->reason = "the CUDA driver reports no device";
      return d;
    }
    d->count = n;
    for (int i = 0; i < n; ++i) d->devices.push_back(std::make_unique<PerDevice>());
#endif
    return d;
  }();
  return *d;
}

#ifdef KILN_HAS_CUDA
const Api& api() {
  return driver().api;
}

[[noreturn]] void fail(CUresult r, const char* call, int device) {
  const char* name = nullptr;
  const char* text = nullptr;
  api().cuGetErrorName(r, &name);
  api().cuGetErrorString(r, &text);
  KILN_FAIL("CUDA: ", call, " failed on cuda:", device, ": ", name ? name : "unknown error", " (",
            text ? text : "no description", ")");
}

#define KILN_CU_CHECK(call, device)                            \
  do {                                                         \
    CUresult kiln_r_ = (call);                                 \
    if (kiln_r_ != CUDA_SUCCESS) fail(kiln_r_, #call, device); \
  } while (0)

PerDevice& per_device(int index) {
  require_device(index, "cuda");
  PerDevice& p = *driver().devices[static_cast<size_t>(index)];
  std::call_once(p.once, [&] {
    const Api& a = api();
    CUdevice dev;
    KILN_CU_CHECK(a.cuDeviceGet(&dev, index), index);
    char name[256] = {};
    KILN_CU_CHECK(a.cuDeviceGetName(name, sizeof(name) - 1, dev), index);
    p.info.name = name;
    auto attribute = [&](CUdevice_attribute at) {
      int v = 0;
      KILN_CU_CHECK(a.cuDeviceGetAttribute(&v, at, dev), index);
      return v;
    };
    p.info.sm = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
                attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    p.info.multiprocessors = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    p.info.max_threads_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    p.info.max_shared_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    p.info.max_shared_per_block_optin =
        attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    p.info.l2_cache_bytes = attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    size_t total = 0;
    KILN_CU_CHECK(a.cuDeviceTotalMem(&total, dev), index);
    p.info.total_memory = total;
    CUcontext ctx;
    KILN_CU_CHECK(a.cuDevicePrimaryCtxRetain(&ctx, dev), index);
    p.context = ctx;
    KILN_CU_CHECK(a.cuCtxSetCurrent(ctx), index);
    CUstream s;
    KILN_CU_CHECK(a.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), index);
    p.stream = s;
  });
  return p;
}
#endif
}  // namespace

const std::string& unavailable_reason() {
  return driver().reason;
}

int num_devices() {
  return driver().count;
}

void require_device(int index, const char* op) {
  const Driver& d = driver();
  KILN_CHECK(d.reason.empty(), op, ": cuda:", index, " cannot be used: CUDA is not available (",
             d.reason, ")");
  KILN_CHECK(index >= 0 && index < d.count, op, ": device cuda:", index, " does not exist (",
             d.count, d.count == 1 ? " CUDA device)" : " CUDA devices)");
}

#ifdef KILN_HAS_CUDA
const DeviceInfo& device_info(int index) {
  return per_device(index).info;
}

void set_device(int index) {
  PerDevice& p = per_device(index);
  // The primary context stays current on a thread once set; checking is cheaper than setting.
  CUcontext current = nullptr;
  api().cuCtxGetCurrent(&current);
  if (current != p.context)
    KILN_CU_CHECK(api().cuCtxSetCurrent(static_cast<CUcontext>(p.context)), index);
}

void* stream(int index) {
  return per_device(index).stream;
}

void synchronize(int index) {
  set_device(index);
  KILN_CU_CHECK(api().cuStreamSynchronize(static_cast<CUstream>(stream(index))), index);
}

void* raw_device_alloc(int index, size_t nbytes) {
  set_device(index);
  CUdeviceptr p = 0;
  CUresult r = api().cuMemAlloc(&p, nbytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) fail(r, "cuMemAlloc", index);
  return reinterpret_cast<void*>(p);
}

void raw_device_free(int index, void* p) {
  set_device(index);
  KILN_CU_CHECK(api().cuMemFree(reinterpret_cast<CUdeviceptr>(p)), index);
}

void* raw_host_alloc(size_t nbytes) {
  set_device(0);
  void* p = nullptr;
  CUresult r = api().cuMemHostAlloc(&p, nbytes, CU_MEMHOSTALLOC_PORTABLE);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) fail(r, "cuMemHostAlloc", 0);
  return p;
}

void raw_host_free(void* p) {
  set_device(0);
  KILN_CU_CHECK(api().cuMemFreeHost(p), 0);
}

void* record_event(int index, void* s, bool timed) {
  set_device(index);
  CUevent e;
  KILN_CU_CHECK(api().cuEventCreate(&e, timed ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING), index);
  KILN_CU_CHECK(api().cuEventRecord(e, static_cast<CUstream>(s)), index);
  return e;
}

bool event_done(void* event) {
  CUresult r = api().cuEventQuery(static_cast<CUevent>(event));
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS) fail(r, "cuEventQuery", -1);
  return true;
}

void wait_event(void* event) {
  KILN_CU_CHECK(api().cuEventSynchronize(static_cast<CUevent>(event)), -1);
}

float elapsed_ms(void* start, void* end) {
  wait_event(end);
  float ms = 0;
  KILN_CU_CHECK(
      api().cuEventElapsedTime(&ms, static_cast<CUevent>(start), static_cast<CUevent>(end)), -1);
  return ms;
}

void destroy_event(void* event) {
  api().cuEventDestroy(static_cast<CUevent>(event));
}

void copy_to_device(int index, void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  set_device(index);
  KILN_CU_CHECK(api().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, nbytes,
                                        static_cast<CUstream>(stream(index))),
                index);
  counters().h2d_bytes += static_cast<int64_t>(nbytes);
  ++counters().h2d_copies;
}

void copy_to_host(int index, void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  set_device(index);
  KILN_CU_CHECK(api().cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), nbytes,
                                        static_cast<CUstream>(stream(index))),
                index);
  counters().d2h_bytes += static_cast<int64_t>(nbytes);
  ++counters().d2h_copies;
}

void copy_on_device(int index, void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  set_device(index);
  KILN_CU_CHECK(api().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst),
                                        reinterpret_cast<CUdeviceptr>(src), nbytes,
                                        static_cast<CUstream>(stream(index))),
                index);
}

void memset_on_device(int index, void* dst, unsigned char value, size_t nbytes) {
  if (nbytes == 0) return;
  set_device(index);
  KILN_CU_CHECK(api().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(dst), value, nbytes,
                                      static_cast<CUstream>(stream(index))),
                index);
}

Module::Module(int device, const std::string& image) : device_(device) {
  set_device(device);
  CUmodule m;
  KILN_CU_CHECK(api().cuModuleLoadData(&m, image.data()), device);
  module_ = m;
}

Module::~Module() {
  if (!module_) return;
  set_device(device_);
  api().cuModuleUnload(static_cast<CUmodule>(module_));
}

void* Module::function(const std::string& name) const {
  CUfunction f;
  CUresult r = api().cuModuleGetFunction(&f, static_cast<CUmodule>(module_), name.c_str());
  KILN_CHECK(r == CUDA_SUCCESS, "CUDA: the loaded module has no kernel named ", name);
  return f;
}

void Module::allow_dynamic_shared(void* function, int bytes) const {
  set_device(device_);
  KILN_CU_CHECK(api().cuFuncSetAttribute(static_cast<CUfunction>(function),
                                         CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
                device_);
}

void launch(int index, void* function, const LaunchShape& shape, void** args, const char* name) {
  set_device(index);
  counters().launches.fetch_add(1, std::memory_order_relaxed);
  CUresult r =
      api().cuLaunchKernel(static_cast<CUfunction>(function), shape.grid, 1, 1, shape.block, 1, 1,
                           shape.shared_bytes, static_cast<CUstream>(stream(index)), args, nullptr);
  if (r != CUDA_SUCCESS) {
    const char* err = nullptr;
    api().cuGetErrorName(r, &err);
    KILN_FAIL("CUDA: launching ", name, " (grid ", shape.grid, ", block ", shape.block, ", shared ",
              shape.shared_bytes, " bytes) failed on cuda:", index, ": ",
              err ? err : "unknown error");
  }
}
#else
// Built without the toolkit: require_device always raises first, so these are never reached.
const DeviceInfo& device_info(int index) {
  require_device(index, "cuda");
  static DeviceInfo none;
  return none;
}
void set_device(int index) {
  require_device(index, "cuda");
}
void* stream(int index) {
  require_device(index, "cuda");
  return nullptr;
}
void synchronize(int index) {
  require_device(index, "cuda");
}
void* raw_device_alloc(int index, size_t) {
  require_device(index, "cuda");
  return nullptr;
}
void raw_device_free(int index, void*) {
  require_device(index, "cuda");
}
void* raw_host_alloc(size_t) {
  require_device(0, "cuda");
  return nullptr;
}
void raw_host_free(void*) {
  require_device(0, "cuda");
}
void* record_event(int index, void*, bool) {
  require_device(index, "cuda");
  return nullptr;
}
float elapsed_ms(void*, void*) {
  return 0;
}
bool event_done(void*) {
  return true;
}
void wait_event(void*) {}
void destroy_event(void*) {}
void copy_to_device(int index, void*, const void*, size_t) {
  require_device(index, "cuda");
}
void copy_to_host(int index, void*, const void*, size_t) {
  require_device(index, "cuda");
}
void copy_on_device(int index, void*, const void*, size_t) {
  require_device(index, "cuda");
}
void memset_on_device(int index, void*, unsigned char, size_t) {
  require_device(index, "cuda");
}
Module::Module(int device, const std::string&) : device_(device) {
  require_device(device, "cuda");
}
Module::~Module() = default;
void* Module::function(const std::string&) const {
  return nullptr;
}
void Module::allow_dynamic_shared(void*, int) const {}
void launch(int index, void*, const LaunchShape&, void**, const char*) {
  require_device(index, "cuda");
}
#endif

TransferCounts transfer_counts() {
  return {counters().h2d_bytes.load(), counters().d2h_bytes.load(), counters().h2d_copies.load(),
          counters().d2h_copies.load()};
}

int64_t launch_count() {
  return counters().launches.load(std::memory_order_relaxed);
}

}  // namespace kiln::detail::cuda

namespace kiln::cuda {
bool is_available() {
  return detail::cuda::unavailable_reason().empty();
}
int device_count() {
  return detail::cuda::num_devices();
}
}  // namespace kiln::cuda
