// A caching, stream-ordered allocator for device (CUDA) and pinned host memory, written against an
// abstract MemoryBackend so that it runs and is tested on the CPU with a fake backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln::detail {

// What the allocator asks of the memory it manages: the CUDA driver in production, a fake in tests.
// Streams and events are opaque pointers so that no CUDA type leaks into this interface. The
// allocator calls the backend only while holding its own lock, so a backend needs no locking of
// its own for the allocator's sake.
struct MemoryBackend {
  virtual ~MemoryBackend() = default;
  // `nbytes` of memory (a multiple of 2 MiB), or nullptr when out of memory; never throws for
  // lack of memory (other failures may throw kiln::Error, and leave the allocator unchanged).
  virtual void* raw_alloc(size_t nbytes) = 0;
  // Returns memory from raw_alloc; `nbytes` is the size it was allocated with.
  virtual void raw_free(void* p, size_t nbytes) = 0;
  // An event recorded on `stream` now, or nullptr when the backend needs none (a host backend
  // whose work is already done). Events recorded on one stream complete in the order recorded.
  // Must not throw: the allocator calls it while releasing a block.
  virtual void* record_event(void* stream) = 0;
  // Whether the work on the event's stream before the event has finished (non-blocking).
  virtual bool event_done(void* event) = 0;
  // Blocks until the event is done. Used only before giving memory back (out of memory,
  // empty_cache).
  virtual void wait_event(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
};

// Counters of one allocator. "Block" bytes are request sizes rounded up (see the .cpp), so
// allocated_bytes + cached_bytes == reserved_bytes always holds.
struct CachingAllocatorStats {
  size_t allocated_bytes = 0;       // block bytes held by live allocations
  size_t requested_bytes = 0;       // bytes the live allocations asked for (<= allocated_bytes)
  size_t reserved_bytes = 0;        // bytes held from the backend (the sum of segment sizes)
  size_t cached_bytes = 0;          // reserved_bytes - allocated_bytes: free or awaiting events
  size_t pending_free_bytes = 0;    // freed blocks still awaiting events on other streams
  size_t peak_allocated_bytes = 0;  // the most allocated_bytes since construction or reset_peak()
  size_t peak_reserved_bytes = 0;   // the most reserved_bytes since construction or reset_peak()
  int64_t num_segments = 0;         // segments held from the backend now
  int64_t num_allocs = 0;           // allocate() calls that returned a pointer
  int64_t num_frees = 0;            // free() calls that released a live allocation
  int64_t num_cache_hits = 0;       // allocations served from cached blocks, no backend call
  int64_t num_backend_allocs = 0;   // successful raw_alloc calls (segments created)
  int64_t num_backend_frees = 0;    // raw_free calls (segments given back)
  int64_t num_backend_alloc_failures = 0;  // raw_alloc calls that returned nullptr
};

// One device's caching allocator (one instance per CUDA device, one for pinned host memory).
// Thread-safe: every public method takes one mutex.
class CachingAllocator {
 public:
  // `device` names the memory in error messages ("cuda:0", "pinned host").
  CachingAllocator(std::unique_ptr<MemoryBackend> backend, std::string device);
  // Gives every segment back to the backend and destroys pending events; pointers still live
  // become invalid. (A process-wide allocator should be leaked rather than destroyed at exit, when
  // the CUDA context may already be gone.)
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `nbytes` bytes, 512-byte aligned relative to its segment, for use on
  // `stream`. Zero bytes give a unique 512-byte block like any other request (never nullptr).
  // Throws kiln::Error when the backend has no memory even after the cache has been released.
  void* allocate(size_t nbytes, void* stream);
  // Releases a pointer from allocate(). Throws kiln::Error, changing nothing, for a pointer this
  // allocator did not hand out or that was already freed. nullptr is ignored.
  void free(void* p);
  // Marks a live block as used by `stream` too: when it is freed, it is reused only after the
  // work queued on `stream` up to the free has completed. Throws kiln::Error for a foreign pointer.
  void record_stream(void* p, void* stream);
  // Waits for pending events, then gives every fully free segment back to the backend.
  void empty_cache();

  CachingAllocatorStats stats() const;
  // Peaks restart from the current values.
  void reset_peak();
  // Checks every internal invariant (segments tile exactly, free neighbours are coalesced, the
  // free lists and the counters agree with the blocks); throws kiln::Error naming the first
  // violation. Linear time; for tests and debugging.
  void check_invariants() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::detail
