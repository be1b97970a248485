// Device and pinned host memory through caching allocators (see lib/cuda_memory.h).
//
// One allocator per device over cuMemAlloc, tagging blocks with the device's stream (kiln uses one
// stream per device, so reuse is immediate and events are only needed for other streams), and one
// for pinned host staging buffers over cuMemHostAlloc, whose "stream" is the device copying from
// it. Both live until exit: tensors may be freed during static destruction.
#include "lib/cuda_memory.h"

#include <memory>
#include <mutex>
#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "lib/caching_allocator.h"
#include "lib/cuda_driver.h"

namespace kiln::detail::cuda {

namespace {
class DeviceBackend : public MemoryBackend {
 public:
  explicit DeviceBackend(int device) : device_(device) {}
  void* raw_alloc(size_t nbytes) override { return raw_device_alloc(device_, nbytes); }
  void raw_free(void* p, size_t) override { raw_device_free(device_, p); }
  void* record_event(void* s) override { return cuda::record_event(device_, s); }
  bool event_done(void* e) override { return cuda::event_done(e); }
  void wait_event(void* e) override { cuda::wait_event(e); }
  void destroy_event(void* e) override { cuda::destroy_event(e); }

 private:
  int device_;
};

class PinnedBackend : public MemoryBackend {
 public:
  void* raw_alloc(size_t nbytes) override { return raw_host_alloc(nbytes); }
  void raw_free(void* p, size_t) override { raw_host_free(p); }
  void* record_event(void* s) override { return cuda::record_event(0, s); }
  bool event_done(void* e) override { return cuda::event_done(e); }
  void wait_event(void* e) override { cuda::wait_event(e); }
  void destroy_event(void* e) override { cuda::destroy_event(e); }
};

// The process's caching allocators, made on first use (each guards its own blocks).
struct Allocators {
  std::mutex mu;
  std::vector<std::unique_ptr<CachingAllocator>> devices;  // under mu: by device index
  std::unique_ptr<CachingAllocator> pinned;                // under mu: page-locked host memory
};
Allocators& allocators() {
  static auto* a = new Allocators();  // never destroyed: memory may be freed during exit
  return *a;
}

CachingAllocator& for_device(int device) {
  require_device(device, "cuda allocator");
  Allocators& a = allocators();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.devices.size() <= static_cast<size_t>(device)) a.devices.resize(device + 1);
  auto& slot = a.devices[static_cast<size_t>(device)];
  if (!slot)
    slot = std::make_unique<CachingAllocator>(std::make_unique<DeviceBackend>(device),
                                              "cuda:" + std::to_string(device));
  return *slot;
}

CachingAllocator& pinned() {
  require_device(0, "pinned memory");
  Allocators& a = allocators();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!a.pinned)
    a.pinned = std::make_unique<CachingAllocator>(std::make_unique<PinnedBackend>(), "pinned host");
  return *a.pinned;
}
}  // namespace

void* device_alloc(int device, size_t nbytes) {
  return for_device(device).allocate(nbytes, stream(device));
}
void device_free(int device, void* p) {
  for_device(device).free(p);
}
// Staging buffers are used by device 0's stream and waited for before they are freed, so their
// stream tag only separates them from other streams' blocks.
void* pinned_alloc(size_t nbytes) {
  return pinned().allocate(nbytes, stream(0));
}
void pinned_free(void* p) {
  pinned().free(p);
}

}  // namespace kiln::detail::cuda

namespace kiln::cuda {

void synchronize(int device) {
  detail::cuda::synchronize(device);
}

void empty_cache() {
  detail::cuda::Allocators& a = detail::cuda::allocators();
  std::vector<detail::CachingAllocator*> all;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    for (auto& d : a.devices)
      if (d) all.push_back(d.get());
    if (a.pinned) all.push_back(a.pinned.get());
  }
  for (detail::CachingAllocator* c : all) c->empty_cache();
}

MemoryStats memory_stats(int device) {
  const detail::CachingAllocatorStats s = detail::cuda::for_device(device).stats();
  MemoryStats m;
  m.allocated_bytes = s.allocated_bytes;
  m.reserved_bytes = s.reserved_bytes;
  m.peak_allocated_bytes = s.peak_allocated_bytes;
  m.peak_reserved_bytes = s.peak_reserved_bytes;
  m.driver_allocations = s.num_backend_allocs;
  m.cache_hits = s.num_cache_hits;
  return m;
}

void reset_peak_memory_stats(int device) {
  detail::cuda::for_device(device).reset_peak();
}

}  // namespace kiln::cuda
