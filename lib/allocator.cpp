// The CPU allocator. Large blocks (1 MiB and up) are 2 MiB-aligned, advised to use transparent huge
// pages, and kept in a cache when freed: a fresh 64 MiB buffer costs 16k page faults on first
// touch, which made every large eager op run at a third of memory bandwidth. Cached blocks are
// reused only for the same rounded size (2 MiB granules), so a steady-state loop allocates nothing
// new. The cache holds at most KILN_CPU_CACHE_MB (default 1024) MiB; beyond that, freed blocks go
// back to the system.
//
// Under AddressSanitizer (tools/sanitize) the bytes past each block's requested size, and whole
// blocks while they wait in the cache, are poisoned: the memory stays mapped, but reading past a
// tensor's end or using a freed one is still reported. (Without ASan the macros are empty.)
#include "lib/allocator.h"

#include <sanitizer/asan_interface.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "kiln/error.h"
#include "lib/env.h"

namespace kiln::detail {

namespace {
constexpr size_t kLargeBlock = size_t{1} << 20;
constexpr size_t kHugePage = size_t{2} << 20;

size_t round_large(size_t n) {
  return (n + kHugePage - 1) / kHugePage * kHugePage;
}

size_t cache_limit() {
  static const size_t limit = [] {
    return static_cast<size_t>(env_int("KILN_CPU_CACHE_MB", OnBad::Warn)) << 20;
  }();
  return limit;
}

// The CPU allocator's state: freed blocks kept for reuse, and the byte counts.
struct AllocatorState {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;  // under mu: rounded size -> blocks
  size_t cached = 0;                                 // under mu: bytes held in free_blocks
  std::atomic<size_t> in_use{0};  // atomic: bytes handed out and not yet returned
  std::atomic<size_t> peak{0};    // atomic: the most in_use since the last reset
};

AllocatorState& allocator_state() {
  static auto* s = new AllocatorState();  // never destroyed: tensors may be freed during exit
  return *s;
}

void note_alloc(size_t n) {
  AllocatorState& s = allocator_state();
  size_t now = s.in_use.fetch_add(n, std::memory_order_relaxed) + n;
  size_t peak = s.peak.load(std::memory_order_relaxed);
  while (now > peak && !s.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void* system_alloc(size_t alignment, size_t size) {
  void* p = std::aligned_alloc(alignment, size);
  if (!p) {
    cpu_empty_cache();
    p = std::aligned_alloc(alignment, size);
  }
  KILN_CHECK(p != nullptr, "out of memory: failed to allocate ", size, " bytes");
  return p;
}

void* alloc_uncounted(size_t nbytes) {
  // No object may exceed PTRDIFF_MAX bytes (and the rounding below must not wrap).
  KILN_CHECK(nbytes <= static_cast<size_t>(PTRDIFF_MAX), "out of memory: ", nbytes,
             " bytes is more than one allocation can hold");
  if (nbytes < kLargeBlock) {
    const size_t size = (nbytes + 63) / 64 * 64 + (nbytes == 0 ? 64 : 0);
    void* p = system_alloc(64, size);
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + nbytes, size - nbytes);
    return p;
  }
  size_t size = round_large(nbytes);
  {
    AllocatorState& c = allocator_state();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= size;
      ASAN_UNPOISON_MEMORY_REGION(p, nbytes);  // the rest stays poisoned from cpu_free
      return p;
    }
  }
  void* p = system_alloc(kHugePage, size);
  madvise(p, size, MADV_HUGEPAGE);  // advisory: fewer page faults and TLB misses where THP is on
  ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + nbytes, size - nbytes);
  return p;
}
}  // namespace

void* cpu_alloc(size_t nbytes) {
  void* p = alloc_uncounted(nbytes);
  note_alloc(nbytes);  // after success: a failed request leaves the count unchanged
  return p;
}

void cpu_free(void* p, size_t nbytes) {
  if (!p) return;
  allocator_state().in_use.fetch_sub(nbytes, std::memory_order_relaxed);
  if (nbytes >= kLargeBlock) {
    size_t size = round_large(nbytes);
    AllocatorState& c = allocator_state();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached + size <= cache_limit()) {
      ASAN_POISON_MEMORY_REGION(p, size);
      c.free_blocks[size].push_back(p);
      c.cached += size;
      return;
    }
  }
  std::free(p);
}

void cpu_empty_cache() {
  AllocatorState& c = allocator_state();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [size, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
  c.cached = 0;
}

size_t cpu_cached_bytes() {
  AllocatorState& c = allocator_state();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.cached;
}

size_t cpu_allocated_bytes() {
  return allocator_state().in_use.load();
}
size_t cpu_peak_allocated_bytes() {
  return allocator_state().peak.load();
}
void cpu_reset_peak() {
  allocator_state().peak.store(allocator_state().in_use.load());
}

}  // namespace kiln::detail
