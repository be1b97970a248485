// The caching allocator for device and pinned host memory: segments from a MemoryBackend, split
// into blocks, cached when freed and reused in stream order.
//
// The algorithm is PyTorch's CUDACachingAllocator, simplified.
//
// Memory comes from the backend in *segments* and is handed out as *blocks*, the pieces a segment
// is split into. Each segment's blocks form a doubly linked list in address order that tiles the
// segment exactly. A request of n bytes becomes a block of n rounded up to 512 bytes (zero bytes
// to 512, so every allocation is a unique real address). Requests up to 1 MiB are "small": they
// are served from the small pool, whose segments are 2 MiB; larger ones come from the large pool,
// whose segments are 20 MiB for requests under 10 MiB (several mid-sized blocks share one) and the
// request rounded up to 2 MiB beyond that. Keeping the pools apart stops small, long-lived
// tensors from pinning the middle of a large segment, which would leave it unusable for large ones.
// Block sizes are rounded to 512 bytes only, not to 2 MiB: rounding a 1.1 MiB request up to 2 MiB
// would waste almost half of it, while 512-byte blocks carved from shared 20 MiB segments waste
// little, and splitting and merging keep the segments usable.
//
// Each pool keeps its free blocks in an ordered set keyed by (stream, size, address). An allocation
// on stream s takes the smallest free block of s that fits (best fit, O(log n)); if none does, it
// asks the backend for a new segment. The chosen block is split when the rest is worth keeping:
// in the small pool when at least 512 bytes remain, in the large pool when more than 1 MiB
// remains (a smaller rest stays with the block as slack, so the large pool never holds fragments
// that only small requests could use, and the slack per large block is at most 1 MiB). A freed
// block is merged with a free neighbour on either side before it returns to its pool, so a
// segment's free space is always in maximal pieces, and a segment whose blocks are all free is a
// single block again, which empty_cache() and the out-of-memory path give back to the backend.
//
// Stream order. A segment, and every block carved from it, belongs to the stream that was current
// when the segment was created. Work on one stream runs in order, so a block freed on its own
// stream can be handed to the next allocation on that stream at once: any kernel that will use it
// is queued after the kernels that used it before. A block that record_stream() marked as used by
// other streams is different: when it is freed, an event is recorded on each of those streams and
// the block waits (state kAwaitingEvents, not in any free set, not merged with neighbours) until
// all of its events are done. Every allocate() first polls the pending events, stream by stream in
// record order, stopping at the first one not done on each stream (later ones on that stream
// cannot be done either), and releases the blocks whose last event has completed.
//
// Out of memory. When the backend returns nullptr, the allocator waits for every pending event
// (which may free a block of this stream that fits: then it is used), gives back every fully free
// segment of every stream and asks again once. If the segment asked for was the shared 20 MiB
// one of a mid-sized request, it then also tries a segment of just the request rounded to 2 MiB,
// which may still fit. If that fails too, it throws kiln::Error naming the request, the device and
// the allocated, reserved and cached bytes, having changed nothing but the cache it gave back.
//
// Costs: allocate and free are O(log F) in the number of free blocks, plus a poll of each stream
// with pending events and the work for the events completed since the last poll; empty_cache and
// the out-of-memory path are linear in the free blocks. Nothing recurses. One mutex guards
// everything; backend calls are made under it.
#include "lib/caching_allocator.h"

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <mutex>
#include <vector>

#include "kiln/error.h"

namespace kiln::detail {

namespace {
constexpr size_t kMinBlockSize = 512;                // every block size is a multiple of this
constexpr size_t kSmallSize = size_t{1} << 20;       // largest request of the small pool
constexpr size_t kSmallBuffer = size_t{2} << 20;     // size of a small-pool segment
constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // requests below share a kLargeBuffer segment
constexpr size_t kLargeBuffer = size_t{20} << 20;
constexpr size_t kRoundLarge = size_t{2} << 20;  // large segments are multiples of this
// Far beyond any real memory; keeps the rounding below from overflowing.
constexpr size_t kMaxRequest = size_t{1} << 60;

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

size_t block_size_for(size_t nbytes) {
  return nbytes == 0 ? kMinBlockSize : round_up(nbytes, kMinBlockSize);
}

size_t segment_size_for(size_t block_size) {
  if (block_size <= kSmallSize) return kSmallBuffer;
  if (block_size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(block_size, kRoundLarge);
}

std::string format_bytes(size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes (%.2f MiB)", n, static_cast<double>(n) / (1 << 20));
  return buf;
}

enum class State : uint8_t {
  kFree,            // in its pool's free set
  kAllocated,       // handed out, in the live map
  kAwaitingEvents,  // freed, but other streams may still use it
};

struct Pool;

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  void* stream = nullptr;
  Pool* pool = nullptr;
  State state = State::kFree;
  size_t requested = 0;   // the bytes asked for, while allocated
  Block* prev = nullptr;  // neighbours in the same segment, in address order
  Block* next = nullptr;
  int pending_events = 0;
  std::vector<void*> stream_uses;  // other streams that use the block (record_stream); few
};

// The free-set order: blocks of one stream together, by size, then address, so lower_bound of
// (stream, size, null) is the best fit on that stream.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    auto sa = reinterpret_cast<uintptr_t>(a->stream), sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

struct Pool {
  explicit Pool(bool small) : small(small) {}
  const bool small;
  absl::btree_set<Block*, BlockOrder> free_blocks;
};

struct Segment {
  Block* head;  // the block at the segment's base; it is never merged away (merges keep the lower)
  size_t size;
};

struct PendingEvent {
  void* event;
  Block* block;
};
}  // namespace

struct CachingAllocator::Impl {
  Impl(std::unique_ptr<MemoryBackend> b, std::string d)
      : backend(std::move(b)), device(std::move(d)) {}

  std::unique_ptr<MemoryBackend> backend;
  const std::string device;
  mutable std::mutex mu;
  Pool small{true};
  Pool large{false};
  absl::flat_hash_map<char*, Block*> live;                      // allocated blocks by address
  absl::flat_hash_map<char*, Segment> segments;                 // by base address
  absl::flat_hash_map<void*, std::deque<PendingEvent>> events;  // by stream, in record order
  CachingAllocatorStats st;

  void note_allocated(size_t nbytes) {
    st.allocated_bytes += nbytes;
    st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
  }

  // The best-fitting free block of `stream`, taken out of the pool, or nullptr.
  Block* take_free(Pool& pool, void* stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.free_blocks.lower_bound(&key);
    if (it == pool.free_blocks.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool.free_blocks.erase(it);
    return b;
  }

  void* try_raw_alloc(size_t nbytes) {
    void* p = backend->raw_alloc(nbytes);
    if (!p) ++st.num_backend_alloc_failures;
    return p;
  }

  // A free block of at least `size` bytes on `stream` (requested: `nbytes`), not in any set: a
  // cached one, or else a new segment. Throws when the backend has no memory even after the cache
  // has been given back, having changed nothing but that.
  Block* get_block(Pool& pool, void* stream, size_t size, size_t nbytes) {
    if (Block* b = take_free(pool, stream, size)) {
      ++st.num_cache_hits;
      return b;
    }
    size_t seg = segment_size_for(size);
    void* p = try_raw_alloc(seg);
    if (!p) {
      // Blocks awaiting events may include one of this stream that fits: wait and look again
      // before giving segments back (which would give back that very block).
      wait_for_all_events();
      if (Block* b = take_free(pool, stream, size)) {
        ++st.num_cache_hits;
        return b;
      }
      release_cached_segments();
      p = try_raw_alloc(seg);
    }
    // A mid-sized request asked for a 20 MiB segment to share; its own size may still fit.
    size_t minimal = round_up(size, kRoundLarge);
    if (!p && minimal < seg) {
      seg = minimal;
      p = try_raw_alloc(seg);
    }
    if (!p) {
      KILN_FAIL("out of memory on ", device, ": cannot allocate ", format_bytes(nbytes),
                " (a new segment of ", format_bytes(seg), ") after giving back the cache; ",
                format_bytes(st.allocated_bytes), " allocated, ", format_bytes(st.reserved_bytes),
                " reserved, ", format_bytes(st.reserved_bytes - st.allocated_bytes),
                " cached in partly used segments");
    }
    auto* b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->stream = stream;
    b->pool = &pool;
    segments.emplace(b->ptr, Segment{b, seg});
    ++st.num_backend_allocs;
    ++st.num_segments;
    st.reserved_bytes += seg;
    st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
    return b;
  }

  bool should_split(const Block& b, size_t size) const {
    size_t rest = b.size - size;
    return b.pool->small ? rest >= kMinBlockSize : rest > kSmallSize;
  }

  void* allocate(size_t nbytes, void* stream) {
    KILN_CHECK(nbytes <= kMaxRequest, "out of memory on ", device, ": cannot allocate ", nbytes,
               " bytes (larger than any device)");
    std::lock_guard<std::mutex> lock(mu);
    process_events();
    size_t size = block_size_for(nbytes);
    Pool& pool = size <= kSmallSize ? small : large;
    Block* b = get_block(pool, stream, size, nbytes);
    if (should_split(*b, size)) {
      auto* rest = new Block;
      rest->ptr = b->ptr + size;
      rest->size = b->size - size;
      rest->stream = stream;
      rest->pool = &pool;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      // b was free, hence its next neighbour is not (free neighbours are always merged): the rest
      // needs no merging.
      pool.free_blocks.insert(rest);
    }
    b->state = State::kAllocated;
    b->requested = nbytes;
    live.emplace(b->ptr, b);
    note_allocated(b->size);
    st.requested_bytes += nbytes;
    ++st.num_allocs;
    return b->ptr;
  }

  // Makes `b` free: merges it with free neighbours (keeping the lower block, so a segment's head
  // survives) and puts the result in its pool.
  void release_block(Block* b) {
    b->state = State::kFree;
    Pool& pool = *b->pool;
    if (Block* prev = b->prev; prev && prev->state == State::kFree) {
      pool.free_blocks.erase(prev);  // before its size changes: the set is ordered by size
      prev->size += b->size;
      prev->next = b->next;
      if (b->next) b->next->prev = prev;
      delete b;
      b = prev;
    }
    if (Block* next = b->next; next && next->state == State::kFree) {
      pool.free_blocks.erase(next);
      b->size += next->size;
      b->next = next->next;
      if (next->next) next->next->prev = b;
      delete next;
    }
    pool.free_blocks.insert(b);
  }

  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu);
    auto it = live.find(static_cast<char*>(p));
    KILN_CHECK(it != live.end(), "free of ", p, " on ", device,
               ": not a live allocation of this allocator (a foreign or interior pointer, or a "
               "double free)");
    Block* b = it->second;
    live.erase(it);
    st.allocated_bytes -= b->size;
    st.requested_bytes -= b->requested;
    b->requested = 0;
    ++st.num_frees;
    for (void* s : b->stream_uses) {
      if (void* e = backend->record_event(s)) {
        events[s].push_back({e, b});
        ++b->pending_events;
      }
    }
    b->stream_uses.clear();
    if (b->pending_events > 0) {
      b->state = State::kAwaitingEvents;
      st.pending_free_bytes += b->size;
      return;
    }
    release_block(b);
  }

  void record_stream(void* p, void* stream) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = live.find(static_cast<char*>(p));
    KILN_CHECK(it != live.end(), "record_stream of ", p, " on ", device,
               ": not a live allocation of this allocator");
    Block* b = it->second;
    if (stream == b->stream) return;  // its own stream orders every use already
    if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
      b->stream_uses.push_back(stream);
  }

  void event_finished(const PendingEvent& pe) {
    backend->destroy_event(pe.event);
    if (--pe.block->pending_events == 0) {
      st.pending_free_bytes -= pe.block->size;
      release_block(pe.block);
    }
  }

  // Releases the blocks whose events have all completed, without waiting.
  void process_events() {
    for (auto it = events.begin(); it != events.end();) {
      std::deque<PendingEvent>& queue = it->second;
      // Events on one stream complete in order: the first one not done ends this stream's scan.
      while (!queue.empty() && backend->event_done(queue.front().event)) {
        PendingEvent pe = queue.front();
        queue.pop_front();
        event_finished(pe);
      }
      if (queue.empty()) {
        events.erase(it++);  // absl's idiom: erasing does not move the other elements
      } else {
        ++it;
      }
    }
  }

  void wait_for_all_events() {
    for (auto& [stream, queue] : events) {
      while (!queue.empty()) {
        PendingEvent pe = queue.front();
        backend->wait_event(pe.event);
        queue.pop_front();
        event_finished(pe);
      }
    }
    events.clear();
  }

  // Waits for pending events, then gives every fully free segment back to the backend.
  void release_cached_segments() {
    wait_for_all_events();
    for (Pool* pool : {&small, &large}) {
      for (auto it = pool->free_blocks.begin(); it != pool->free_blocks.end();) {
        Block* b = *it;
        if (b->prev || b->next) {  // part of a segment still in use
          ++it;
          continue;
        }
        backend->raw_free(b->ptr, b->size);  // first: if it throws, nothing has changed
        it = pool->free_blocks.erase(it);
        segments.erase(b->ptr);
        st.reserved_bytes -= b->size;
        --st.num_segments;
        ++st.num_backend_frees;
        delete b;
      }
    }
  }

  ~Impl() {
    wait_for_all_events();
    for (auto& [base, seg] : segments) {
      for (Block* b = seg.head; b;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
      backend->raw_free(base, seg.size);
    }
  }

  CachingAllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mu);
    CachingAllocatorStats s = st;
    s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
    return s;
  }

  void check_invariants() const {
    std::lock_guard<std::mutex> lock(mu);
    size_t reserved = 0, allocated = 0, requested = 0, pending = 0;
    size_t free_count = 0, live_count = 0;
    int64_t block_events = 0;
    for (const auto& [base, seg] : segments) {
      const Block* head = seg.head;
      KILN_CHECK(head->ptr == base && !head->prev, "segment ", static_cast<void*>(base),
                 ": its head block is not at its base");
      KILN_CHECK(!head->pool->small || seg.size == kSmallBuffer, "small segment of ", seg.size,
                 " bytes");
      size_t offset = 0;
      for (const Block* b = head; b; b = b->next) {
        KILN_CHECK(b->ptr == base + offset, "block ", static_cast<void*>(b->ptr), " of segment ",
                   static_cast<void*>(base), " is not where its previous block ends");
        KILN_CHECK(b->size > 0 && b->size % kMinBlockSize == 0, "block size ", b->size);
        KILN_CHECK(b->pool == head->pool && b->stream == head->stream,
                   "block of another pool or stream inside a segment");
        KILN_CHECK(!b->next || b->next->prev == b, "broken back link");
        switch (b->state) {
          case State::kFree:
            KILN_CHECK(b->pool->free_blocks.count(const_cast<Block*>(b)) == 1,
                       "free block not in its pool");
            KILN_CHECK(!b->next || b->next->state != State::kFree, "free neighbours not merged");
            KILN_CHECK(b->stream_uses.empty() && b->pending_events == 0, "free block with uses");
            ++free_count;
            break;
          case State::kAllocated: {
            auto it = live.find(b->ptr);
            KILN_CHECK(it != live.end() && it->second == b, "allocated block not in the live map");
            KILN_CHECK(b->pending_events == 0, "allocated block with pending events");
            allocated += b->size;
            requested += b->requested;
            ++live_count;
            break;
          }
          case State::kAwaitingEvents:
            KILN_CHECK(b->pending_events > 0, "block awaiting no events");
            pending += b->size;
            block_events += b->pending_events;
            break;
        }
        offset += b->size;
      }
      KILN_CHECK(offset == seg.size, "segment of ", seg.size, " bytes tiled by ", offset);
      reserved += seg.size;
    }
    int64_t queued = 0;
    for (const auto& [stream, queue] : events) queued += static_cast<int64_t>(queue.size());
    KILN_CHECK(queued == block_events, queued, " queued events, ", block_events, " awaited");
    KILN_CHECK(free_count == small.free_blocks.size() + large.free_blocks.size(),
               "free sets hold blocks that are not free in any segment");
    KILN_CHECK(live_count == live.size(), "live map holds blocks that are not in any segment");
    KILN_CHECK(reserved == st.reserved_bytes && allocated == st.allocated_bytes &&
                   requested == st.requested_bytes && pending == st.pending_free_bytes,
               "counters disagree with the blocks: reserved ", st.reserved_bytes, " vs ", reserved,
               ", allocated ", st.allocated_bytes, " vs ", allocated, ", requested ",
               st.requested_bytes, " vs ", requested, ", pending ", st.pending_free_bytes, " vs ",
               pending);
    KILN_CHECK(st.num_segments == static_cast<int64_t>(segments.size()), "segment count");
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<MemoryBackend> backend, std::string device)
    : impl_(std::make_unique<Impl>(std::move(backend), std::move(device))) {}

CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::allocate(size_t nbytes, void* stream) {
  return impl_->allocate(nbytes, stream);
}

void CachingAllocator::free(void* p) {
  impl_->free(p);
}

void CachingAllocator::record_stream(void* p, void* stream) {
  impl_->record_stream(p, stream);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->release_cached_segments();
}

CachingAllocatorStats CachingAllocator::stats() const {
  return impl_->stats();
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->st.peak_allocated_bytes = impl_->st.allocated_bytes;
  impl_->st.peak_reserved_bytes = impl_->st.reserved_bytes;
}

void CachingAllocator::check_invariants() const {
  impl_->check_invariants();
}

}  // namespace kiln::detail
