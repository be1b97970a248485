// The CPU allocator. Large blocks (1 MiB and up) are 2 MiB-aligned, advised to use transparent huge
// pages, and kept in a cache when freed: a fresh 64 MiB buffer costs 16k page faults on first
// touch, which made every large eager op run at a third of memory bandwidth. Cached blocks are
// reused only for the same rounded size (2 MiB granules), so a steady-state loop allocates nothing
// new. The cache holds at most KILN_CPU_CACHE_MB (default 1024) MiB; beyond that, freed blocks go
// back to the system.
//
// Small blocks (under 1 MiB) are rounded up to a size class and, when freed, kept on the freeing
// thread's list for that class, so that a replay of a small traced function (a fresh result tensor
// per call) takes no lock and calls no glibc: aligned_alloc's memalign path (with its
// malloc_consolidate) had cost a replay of 10 ops on a [1] tensor about a sixth of its time. Blocks
// of a class are interchangeable memory, so a block freed on another thread than the one that
// took it simply joins the freeing thread's list. Each thread keeps at most kSmallPerClass blocks
// of a class and kSmallBytesPerThread bytes in all, and returns them when it exits.
//
// Under AddressSanitizer (tools/sanitize) the bytes past each block's requested size, and whole
// blocks while they wait in a cache, are poisoned: the memory stays mapped, but reading past a
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

// Small size classes: 64-byte steps up to 512 bytes, then four per doubling (a block is at most
// 25% larger than its request) up to 1 MiB. Every class is a multiple of 64 bytes.
constexpr size_t kSmallClasses = 52;
constexpr uint32_t kSmallPerClass = 64;
constexpr size_t kSmallBytesPerThread = size_t{4} << 20;

constexpr size_t small_class(size_t nbytes) {
  if (nbytes <= 512) return nbytes == 0 ? 0 : (nbytes + 63) / 64 - 1;
  const size_t m = nbytes - 1;
  const int bits = 64 - __builtin_clzll(m);  // 2^(bits-1) <= m < 2^bits, bits >= 10
  return 8 + static_cast<size_t>(bits - 10) * 4 + ((m >> (bits - 3)) & 3);
}

constexpr size_t small_class_size(size_t c) {
  if (c < 8) return (c + 1) * 64;
  return (5 + (c - 8) % 4) << (10 + (c - 8) / 4 - 3);
}
static_assert(small_class(kLargeBlock - 1) == kSmallClasses - 1);
static_assert(small_class_size(kSmallClasses - 1) == kLargeBlock);

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
  std::atomic<size_t> in_use{0};           // atomic: bytes handed out and not yet returned
  std::atomic<size_t> peak{0};             // atomic: the most in_use since the last reset
  std::atomic<uint64_t> system_allocs{0};  // atomic: blocks taken from aligned_alloc
};

AllocatorState& allocator_state() {
  static auto* s = new AllocatorState();  // never destroyed: tensors may be freed during exit
  return *s;
}

// A free small block: the link to the next one of its class is kept in its first bytes.
struct SmallFree {
  SmallFree* next;
};

// The calling thread's free small blocks, made at its first free of one. Reached through a plain
// pointer thread-local (no constructor or destructor: no guard on the hot path, and still usable
// while the thread's other thread-locals are destroyed, when a tensor freed by one of their
// destructors comes back); the initial-exec TLS block stays small, as a library loaded with
// dlopen needs. SmallCacheCloser returns the blocks at thread exit.
struct SmallCache {
  SmallFree* head[kSmallClasses] = {};
  uint32_t count[kSmallClasses] = {};
  size_t bytes = 0;  // in all classes
};
__attribute__((tls_model("initial-exec"))) thread_local SmallCache* t_small = nullptr;
// The thread is exiting: frees go to the system.
__attribute__((tls_model("initial-exec"))) thread_local bool t_small_closed = false;

void release_small_blocks() {
  SmallCache* t = t_small;
  if (!t) return;
  for (size_t c = 0; c < kSmallClasses; ++c) {
    while (SmallFree* b = t->head[c]) {
      ASAN_UNPOISON_MEMORY_REGION(b, small_class_size(c));
      t->head[c] = b->next;
      std::free(b);
    }
    t->count[c] = 0;
  }
  t->bytes = 0;
}

struct SmallCacheCloser {
  ~SmallCacheCloser() {
    t_small_closed = true;
    release_small_blocks();
    delete t_small;
    t_small = nullptr;
  }
};

// This thread's cache, made on first use; null once the thread is exiting.
SmallCache* small_cache() {
  if (SmallCache* t = t_small) return t;
  if (t_small_closed) return nullptr;
  static thread_local SmallCacheCloser closer;
  t_small = new SmallCache();
  return t_small;
}

// Keeps a freed small block for this thread's next request of its class; false when the thread's
// cache is full or closing.
bool keep_small(void* p, size_t nbytes) {
  SmallCache* t = small_cache();
  if (!t) return false;
  const size_t c = small_class(nbytes);
  const size_t size = small_class_size(c);
  if (t->count[c] >= kSmallPerClass || t->bytes + size > kSmallBytesPerThread) return false;
  ASAN_UNPOISON_MEMORY_REGION(p, sizeof(SmallFree));
  auto* b = static_cast<SmallFree*>(p);
  b->next = t->head[c];
  t->head[c] = b;
  ++t->count[c];
  t->bytes += size;
  ASAN_POISON_MEMORY_REGION(p, size);
  return true;
}

// A block of this thread's cache for `nbytes`, or null.
void* reuse_small(size_t nbytes) {
  SmallCache* t = t_small;
  if (!t) return nullptr;
  const size_t c = small_class(nbytes);
  SmallFree* b = t->head[c];
  if (!b) return nullptr;
  ASAN_UNPOISON_MEMORY_REGION(b, sizeof(SmallFree));
  t->head[c] = b->next;
  --t->count[c];
  t->bytes -= small_class_size(c);
  ASAN_POISON_MEMORY_REGION(b, small_class_size(c));
  ASAN_UNPOISON_MEMORY_REGION(b, nbytes);  // the rest stays poisoned
  return b;
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
  allocator_state().system_allocs.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void* alloc_uncounted(size_t nbytes) {
  // No object may exceed PTRDIFF_MAX bytes (and the rounding below must not wrap).
  KILN_CHECK(nbytes <= static_cast<size_t>(PTRDIFF_MAX), "out of memory: ", nbytes,
             " bytes is more than one allocation can hold");
  if (nbytes < kLargeBlock) {
    if (void* p = reuse_small(nbytes)) return p;
    const size_t size = small_class_size(small_class(nbytes));
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
  if (nbytes < kLargeBlock) {
    if (!keep_small(p, nbytes)) std::free(p);
    return;
  }
  const size_t size = round_large(nbytes);
  {
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
  release_small_blocks();
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

size_t cpu_thread_small_cached_bytes() {
  return t_small ? t_small->bytes : 0;
}

uint64_t cpu_system_allocs() {
  return allocator_state().system_allocs.load(std::memory_order_relaxed);
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
