// The CUDA driver API as kiln uses it: libcuda.so.1 opened with dlopen on first use, one primary
// context and one stream per device, device memory, copies, modules and launches. No CUDA types
// cross this header (handles are void*), so the rest of the runtime builds without cuda.h.
//
// Every call that fails raises kiln::Error naming the driver call, its error name and string, and
// the device; on a machine without a driver or GPU, `require_device` raises before any call is
// made, so a CUDA tensor can never be created there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln::detail::cuda {

// Why CUDA is unavailable ("" when it is): no toolkit at build time, no libcuda.so.1, cuInit's
// error, or no device.
const std::string& unavailable_reason();
int num_devices();  // 0 when unavailable
// Raises kiln::Error for `op` when device `index` cannot be used (naming the reason above, or the
// number of devices when the index is out of range).
void require_device(int index, const char* op);

struct DeviceInfo {
  std::string name;
  int sm = 0;  // compute capability as major * 10 + minor (90 for an H100)
  int multiprocessors = 0;
  int max_threads_per_block = 0;
  int max_shared_per_block = 0;
  int max_shared_per_block_optin = 0;  // with a kernel's opt-in (227 KiB on an H100)
  size_t total_memory = 0;
  int64_t l2_cache_bytes = 0;  // 50 MiB on an H100; sizes the convolutions' chunks
};
const DeviceInfo& device_info(int index);

// Makes device `index`'s primary context current on this thread (cheap when it already is).
void set_device(int index);
// The device's stream (created once, non-blocking with respect to the legacy default stream).
void* stream(int index);
void synchronize(int index);

// Raw device memory (the caching allocator sits on these); nullptr when out of memory.
void* raw_device_alloc(int index, size_t nbytes);
void raw_device_free(int index, void* p);
// Page-locked host memory, for copies the device can run asynchronously; nullptr when out.
void* raw_host_alloc(size_t nbytes);
void raw_host_free(void* p);
// Events on a device's stream, for stream-ordered reuse of freed blocks, and (timed) for the
// profiler's device spans.
void* record_event(int index, void* stream, bool timed = false);
// Milliseconds between two timed events of one stream, once `end` has completed (waits for it).
float elapsed_ms(void* start, void* end);
bool event_done(void* event);
void wait_event(void* event);
void destroy_event(void* event);

// Copies ordered on the device's stream; host pointers should be pinned for the copy to overlap.
void copy_to_device(int index, void* dst, const void* src, size_t nbytes);
void copy_to_host(int index, void* dst, const void* src, size_t nbytes);
void copy_on_device(int index, void* dst, const void* src, size_t nbytes);
void memset_on_device(int index, void* dst, unsigned char value, size_t nbytes);

// A loaded module (cubin or PTX); unloaded when the last handle goes.
class Module {
 public:
  Module(int device, const std::string& image);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // The __global__ function `name` (raises when the image has none).
  void* function(const std::string& name) const;
  // Lets `function` of this module launch with up to `bytes` of dynamic shared memory (above the
  // default 48 KiB a launch needs this opt-in; at most the device's opt-in limit less the
  // function's static shared memory). Raises with the driver's error otherwise.
  void allow_dynamic_shared(void* function, int bytes) const;
  int device() const { return device_; }

 private:
  int device_;
  void* module_ = nullptr;
};

struct LaunchShape {
  unsigned grid = 1;
  unsigned block = 1;
  unsigned shared_bytes = 0;
};
// Launches `function` on the device's stream with one pointer per kernel parameter.
void launch(int index, void* function, const LaunchShape& shape, void** args, const char* name);

// Host<->device bytes copied so far (KILN_PROFILE's transfer counts).
struct TransferCounts {
  int64_t host_to_device = 0;
  int64_t device_to_host = 0;
  int64_t copies_to_device = 0;
  int64_t copies_to_host = 0;
};
TransferCounts transfer_counts();

// Kernels kiln has launched so far (cuBLAS's own launches not counted): benchmarks count the
// launches of one replay with it.
int64_t launch_count();

}  // namespace kiln::detail::cuda
