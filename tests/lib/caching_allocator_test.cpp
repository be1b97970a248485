// The device caching allocator on a fake backend: reuse, stream order, splitting and merging,
// empty_cache, exact statistics, out of memory, bad frees, and a randomized stress test.
#include "lib/caching_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kiln/error.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::CachingAllocator;
using detail::CachingAllocatorStats;
using testing::expect_error;

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;

// Stream handles are opaque to the allocator; any distinct addresses do.
int stream_tags[4];
void* const s1 = &stream_tags[0];
void* const s2 = &stream_tags[1];
void* const s3 = &stream_tags[2];

// Hands out real memory, counts every call, fails past `capacity`, and has events that complete
// only when the test says so (in record order per stream, like CUDA streams). The allocator owns
// it; the test keeps a raw pointer. Its destructor checks that nothing leaked.
class FakeBackend : public detail::MemoryBackend {
 public:
  struct Event {
    void* stream;
    uint64_t seq;  // 1, 2, ... per stream
    bool done = false;
  };

  size_t capacity = SIZE_MAX;
  bool events_enabled = true;  // false: a backend that needs no events (record_event -> nullptr)
  size_t in_use = 0;
  int64_t allocs = 0, frees = 0, failures = 0;
  int64_t events_recorded = 0, events_destroyed = 0, waits = 0;
  std::map<char*, size_t> raw;  // live raw allocations

  ~FakeBackend() override {
    EXPECT_EQ(in_use, 0u) << "segments not given back";
    EXPECT_TRUE(raw.empty());
    EXPECT_EQ(events_recorded, events_destroyed) << "events leaked";
  }

  void* raw_alloc(size_t nbytes) override {
    EXPECT_EQ(nbytes % (2 * MiB), 0u) << "segments are multiples of 2 MiB";
    if (nbytes > capacity - std::min(capacity, in_use)) {
      ++failures;
      return nullptr;
    }
    auto* p = static_cast<char*>(std::aligned_alloc(4096, nbytes));
    if (!p) return nullptr;
    raw[p] = nbytes;
    in_use += nbytes;
    ++allocs;
    return p;
  }
  void raw_free(void* p, size_t nbytes) override {
    auto it = raw.find(static_cast<char*>(p));
    EXPECT_TRUE(it != raw.end()) << "raw_free of memory not from raw_alloc";
    if (it == raw.end()) return;
    EXPECT_EQ(it->second, nbytes);
    in_use -= it->second;
    raw.erase(it);
    ++frees;
    std::free(p);
  }
  void* record_event(void* stream) override {
    if (!events_enabled) return nullptr;
    auto* e = new Event{stream, ++recorded_seq[stream]};
    queued[stream].push_back(e);
    ++events_recorded;
    return e;
  }
  bool event_done(void* e) override { return static_cast<Event*>(e)->done; }
  void wait_event(void* e) override {
    ++waits;
    auto* ev = static_cast<Event*>(e);
    while (!ev->done) complete(ev->stream, 1);
  }
  void destroy_event(void* e) override {
    auto* ev = static_cast<Event*>(e);
    EXPECT_TRUE(ev->done) << "the allocator gave up on an event that was not done";
    ++events_destroyed;
    delete ev;
  }

  // Completes the oldest `n` events not yet done on `stream` (all of them by default): the work
  // queued on the stream has progressed that far.
  void complete(void* stream, size_t n = SIZE_MAX) {
    auto& q = queued[stream];
    for (; n > 0 && !q.empty(); --n) {
      q.front()->done = true;
      done_seq[stream] = q.front()->seq;
      q.pop_front();
    }
  }
  // The sequence number of the last event recorded on `stream`, and whether it is done.
  uint64_t last_event(void* stream) { return recorded_seq[stream]; }
  bool done(void* stream, uint64_t seq) { return done_seq[stream] >= seq; }

 private:
  std::map<void*, std::deque<Event*>> queued;  // not yet done, per stream
  std::map<void*, uint64_t> recorded_seq, done_seq;
};

struct Fixture {
  FakeBackend* fake = new FakeBackend;
  CachingAllocator alloc{std::unique_ptr<detail::MemoryBackend>(fake), "cuda:0"};
};

// Writes a pattern unique to `id` over the whole block, and checks it is intact.
void fill(void* p, size_t n, uint64_t id) {
  auto* c = static_cast<char*>(p);
  size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) std::memcpy(c + 8 * i, &id, 8);
  std::memset(c + 8 * words, static_cast<int>(id & 0xff), n - 8 * words);
}
bool intact(const void* p, size_t n, uint64_t id) {
  auto* c = static_cast<const char*>(p);
  size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, c + 8 * i, 8);
    if (w != id) return false;
  }
  for (size_t i = 8 * words; i < n; ++i)
    if (static_cast<unsigned char>(c[i]) != (id & 0xff)) return false;
  return true;
}

TEST(CachingAllocator, ReusesOnTheSameStreamWithoutBackendCalls) {
  Fixture f;
  void* p = f.alloc.allocate(1000, s1);
  ASSERT_NE(p, nullptr);
  fill(p, 1000, 7);
  f.alloc.free(p);
  EXPECT_EQ(f.alloc.allocate(1000, s1), p);  // the same block, at once
  f.alloc.free(p);
  EXPECT_EQ(f.alloc.allocate(700, s1), p);  // any size that fits the free space
  f.alloc.free(p);
  void* big = f.alloc.allocate(5 * MiB, s1);
  f.alloc.free(big);
  EXPECT_EQ(f.alloc.allocate(5 * MiB, s1), big);
  f.alloc.free(big);
  EXPECT_EQ(f.fake->allocs, 2);  // one small and one large segment
  CachingAllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.num_backend_allocs, 2);
  EXPECT_EQ(st.num_cache_hits, 3);
  EXPECT_EQ(st.num_allocs, 5);
  EXPECT_EQ(st.allocated_bytes, 0u);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, RoundsRequestsAndSizesSegments) {
  struct Case {
    size_t request, block, segment;
  };
  // Small: 512-byte blocks from 2 MiB segments. Large: 20 MiB segments below 10 MiB, beyond that
  // the request rounded to 2 MiB; a large block keeps a rest of at most 1 MiB as slack.
  for (Case c :
       {Case{1, 512, 2 * MiB}, Case{512, 512, 2 * MiB}, Case{513, 1024, 2 * MiB},
        Case{MiB, MiB, 2 * MiB}, Case{MiB + 1, MiB + 512, 20 * MiB},
        Case{9 * MiB, 9 * MiB, 20 * MiB}, Case{10 * MiB, 10 * MiB, 10 * MiB},
        Case{11 * MiB, 12 * MiB, 12 * MiB}, Case{12 * MiB + 1, 12 * MiB + 512, 14 * MiB}}) {
    Fixture g;  // fresh, so each request makes its own segment
    void* p = g.alloc.allocate(c.request, s1);
    CachingAllocatorStats st = g.alloc.stats();
    EXPECT_EQ(st.allocated_bytes, c.block) << c.request;
    EXPECT_EQ(st.requested_bytes, c.request) << c.request;
    EXPECT_EQ(st.reserved_bytes, c.segment) << c.request;
    g.alloc.check_invariants();
    g.alloc.free(p);
  }
}

TEST(CachingAllocator, ZeroByteRequestsGetUniqueBlocks) {
  Fixture f;
  void* a = f.alloc.allocate(0, s1);
  void* b = f.alloc.allocate(0, s1);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 1024u);
  EXPECT_EQ(f.alloc.stats().requested_bytes, 0u);
  f.alloc.free(a);
  f.alloc.free(b);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0u);
  f.alloc.free(nullptr);  // ignored, like std::free
  f.alloc.check_invariants();
}

TEST(CachingAllocator, DoesNotReuseAcrossStreams) {
  Fixture f;
  void* p = f.alloc.allocate(4096, s1);
  f.alloc.free(p);
  void* q = f.alloc.allocate(4096, s2);
  EXPECT_NE(q, p);
  EXPECT_EQ(f.fake->allocs, 2);  // each stream has its own segments
  EXPECT_EQ(f.alloc.allocate(4096, s1), p);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, RecordStreamDefersReuseUntilTheEventCompletes) {
  Fixture f;
  void* p = f.alloc.allocate(MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.record_stream(p, s2);  // twice: still one event
  f.alloc.record_stream(p, s1);  // its own stream: nothing to wait for
  f.alloc.free(p);
  EXPECT_EQ(f.fake->events_recorded, 1);
  EXPECT_EQ(f.alloc.stats().pending_free_bytes, MiB);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0u);

  // s2 may still be reading p: a new request on s1 must not get it.
  void* q = f.alloc.allocate(MiB, s1);
  EXPECT_NE(q, p);
  f.alloc.free(q);
  f.alloc.check_invariants();

  f.fake->complete(s2);
  EXPECT_EQ(f.alloc.allocate(MiB, s1), p);  // polled at this allocation, then reused
  EXPECT_EQ(f.alloc.stats().pending_free_bytes, 0u);
  EXPECT_EQ(f.fake->events_destroyed, 1);
  f.alloc.free(p);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, WaitsForTheEventsOfEveryStreamThatUsedTheBlock) {
  Fixture f;
  void* p = f.alloc.allocate(MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.record_stream(p, s3);
  f.alloc.free(p);
  EXPECT_EQ(f.fake->events_recorded, 2);
  f.fake->complete(s2);
  void* q = f.alloc.allocate(MiB, s1);
  EXPECT_NE(q, p);  // s3 is not done yet
  f.fake->complete(s3);
  void* r = f.alloc.allocate(MiB, s1);
  EXPECT_EQ(r, p);
  f.alloc.free(q);
  f.alloc.free(r);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, EventsOfOneStreamAreReleasedInOrder) {
  Fixture f;
  void* a = f.alloc.allocate(4096, s1);
  void* b = f.alloc.allocate(4096, s1);
  f.alloc.record_stream(a, s2);
  f.alloc.record_stream(b, s2);
  f.alloc.free(a);
  f.alloc.free(b);
  EXPECT_EQ(f.alloc.stats().pending_free_bytes, 8192u);
  f.fake->complete(s2, 1);  // only a's event
  void* c = f.alloc.allocate(4096, s1);
  EXPECT_EQ(c, a);
  EXPECT_EQ(f.alloc.stats().pending_free_bytes, 4096u);
  f.fake->complete(s2);
  void* d = f.alloc.allocate(4096, s1);
  EXPECT_EQ(d, b);
  f.alloc.free(c);
  f.alloc.free(d);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, BackendWithoutEventsReleasesAtOnce) {
  Fixture f;
  f.fake->events_enabled = false;  // pinned host memory used synchronously, say
  void* p = f.alloc.allocate(4096, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.free(p);
  EXPECT_EQ(f.alloc.stats().pending_free_bytes, 0u);
  EXPECT_EQ(f.alloc.allocate(4096, s1), p);
  f.alloc.free(p);
}

TEST(CachingAllocator, SplitsBlocksAndMergesFreeNeighbours) {
  Fixture f;
  char* a = static_cast<char*>(f.alloc.allocate(512, s1));
  char* b = static_cast<char*>(f.alloc.allocate(512, s1));
  char* c = static_cast<char*>(f.alloc.allocate(512, s1));
  // One segment, split in address order.
  EXPECT_EQ(b, a + 512);
  EXPECT_EQ(c, b + 512);
  EXPECT_EQ(f.fake->allocs, 1);
  f.alloc.check_invariants();

  // a and b merge into one 1 KiB block, the best fit for 1 KiB (the segment's tail is larger).
  f.alloc.free(a);
  f.alloc.free(b);
  f.alloc.check_invariants();
  EXPECT_EQ(f.alloc.allocate(1024, s1), a);

  // Everything free: the segment is one block again, which empty_cache gives back.
  f.alloc.free(a);
  f.alloc.free(c);
  f.alloc.check_invariants();
  f.alloc.empty_cache();
  EXPECT_EQ(f.fake->frees, 1);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0u);

  // A block between two free neighbours merges with both.
  char* p = static_cast<char*>(f.alloc.allocate(512, s1));
  char* q = static_cast<char*>(f.alloc.allocate(512, s1));
  char* r = static_cast<char*>(f.alloc.allocate(512, s1));
  char* guard = static_cast<char*>(f.alloc.allocate(512, s1));
  EXPECT_EQ(guard, p + 1536);
  f.alloc.free(p);
  f.alloc.free(r);
  f.alloc.free(q);
  f.alloc.check_invariants();  // which also checks that no two free blocks are neighbours
  EXPECT_EQ(f.alloc.allocate(1536, s1), p);
  f.alloc.free(p);
  f.alloc.free(guard);

  // Large blocks share a 20 MiB segment, split at their rounded sizes.
  char* x = static_cast<char*>(f.alloc.allocate(3 * MiB, s1));
  char* y = static_cast<char*>(f.alloc.allocate(4 * MiB, s1));
  EXPECT_EQ(y, x + 3 * MiB);
  EXPECT_EQ(f.fake->allocs, 3);  // two small segments (the first went back), one large
  f.alloc.free(x);
  f.alloc.free(y);
  EXPECT_EQ(f.alloc.allocate(7 * MiB, s1), x);  // merged back
  f.alloc.check_invariants();
}

TEST(CachingAllocator, SmallRequestsDoNotSplitLargeSegments) {
  Fixture f;
  void* big = f.alloc.allocate(3 * MiB, s1);
  f.alloc.free(big);  // a free 20 MiB segment in the large pool
  void* small = f.alloc.allocate(4096, s1);
  EXPECT_EQ(f.fake->allocs, 2);  // a small segment of its own
  f.alloc.free(small);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, EmptyCacheGivesBackOnlyFullyFreeSegments) {
  Fixture f;
  void* keep = f.alloc.allocate(1000, s1);
  void* drop = f.alloc.allocate(12 * MiB, s1);
  void* pending = f.alloc.allocate(12 * MiB, s2);
  fill(keep, 1000, 42);
  f.alloc.record_stream(pending, s3);
  f.alloc.free(drop);
  f.alloc.free(pending);  // awaits s3: empty_cache waits for it
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 2 * MiB + 24 * MiB);
  f.alloc.empty_cache();
  EXPECT_EQ(f.fake->waits, 1);
  EXPECT_EQ(f.fake->frees, 2);
  CachingAllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.reserved_bytes, 2 * MiB);  // the small segment holds `keep`
  EXPECT_EQ(st.num_segments, 1);
  EXPECT_EQ(st.pending_free_bytes, 0u);
  EXPECT_TRUE(intact(keep, 1000, 42));
  f.alloc.check_invariants();
  f.alloc.free(keep);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0u);
  EXPECT_EQ(f.fake->in_use, 0u);
}

TEST(CachingAllocator, StatisticsAreExactInAScriptedSequence) {
  Fixture f;
  void* a = f.alloc.allocate(100, s1);      // new small segment: block 512
  void* b = f.alloc.allocate(3 * MiB, s1);  // new 20 MiB segment: block 3 MiB
  void* c = f.alloc.allocate(2000, s1);     // from a's segment: block 2048
  CachingAllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 512 + 3 * MiB + 2048);
  EXPECT_EQ(st.requested_bytes, 100 + 3 * MiB + 2000);
  EXPECT_EQ(st.reserved_bytes, 22 * MiB);
  EXPECT_EQ(st.cached_bytes, 22 * MiB - (512 + 3 * MiB + 2048));
  EXPECT_EQ(st.peak_allocated_bytes, st.allocated_bytes);
  EXPECT_EQ(st.peak_reserved_bytes, 22 * MiB);
  EXPECT_EQ(st.num_segments, 2);
  EXPECT_EQ(st.num_allocs, 3);
  EXPECT_EQ(st.num_backend_allocs, 2);
  EXPECT_EQ(st.num_cache_hits, 1);

  f.alloc.free(b);
  f.alloc.free(a);
  st = f.alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 2048u);
  EXPECT_EQ(st.requested_bytes, 2000u);
  EXPECT_EQ(st.peak_allocated_bytes, 512 + 3 * MiB + 2048);
  EXPECT_EQ(st.num_frees, 2);

  f.alloc.reset_peak();
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, 2048u);
  EXPECT_EQ(f.alloc.stats().peak_reserved_bytes, 22 * MiB);
  void* d = f.alloc.allocate(MiB, s1);  // from the small segment's free space
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, 2048 + MiB);
  f.alloc.free(d);
  f.alloc.empty_cache();  // the large segment is whole; the small one holds c
  st = f.alloc.stats();
  EXPECT_EQ(st.reserved_bytes, 2 * MiB);
  EXPECT_EQ(st.peak_reserved_bytes, 22 * MiB);
  f.alloc.reset_peak();
  EXPECT_EQ(f.alloc.stats().peak_reserved_bytes, 2 * MiB);
  EXPECT_EQ(f.alloc.stats().num_backend_frees, 1);
  EXPECT_EQ(f.alloc.stats().num_cache_hits, 2);
  EXPECT_EQ(f.alloc.stats().num_allocs, 4);
  f.alloc.free(c);
  st = f.alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.requested_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 2 * MiB);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, OutOfMemoryGivesBackTheCacheAndRetries) {
  Fixture f;
  f.fake->capacity = 24 * MiB;
  void* p = f.alloc.allocate(12 * MiB, s1);  // a 12 MiB segment
  f.alloc.free(p);                           // cached, on s1
  void* q = f.alloc.allocate(16 * MiB, s2);  // fails, the s1 segment goes back, then fits
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(f.fake->failures, 1);
  EXPECT_EQ(f.fake->frees, 1);
  CachingAllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.num_backend_alloc_failures, 1);
  EXPECT_EQ(st.reserved_bytes, 16 * MiB);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, OutOfMemoryWaitsForEventsAndReusesTheBlock) {
  Fixture f;
  f.fake->capacity = 20 * MiB;
  void* p = f.alloc.allocate(12 * MiB, s1);
  f.alloc.record_stream(p, s2);
  f.alloc.free(p);  // awaits s2
  void* q = f.alloc.allocate(12 * MiB, s1);
  EXPECT_EQ(q, p);  // the backend had no room: the allocator waited for s2 and took p
  EXPECT_EQ(f.fake->waits, 1);
  EXPECT_EQ(f.fake->frees, 0);
  EXPECT_EQ(f.alloc.stats().num_cache_hits, 1);
  f.alloc.free(q);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, OutOfMemoryFallsBackToTheRequestsOwnSegment) {
  Fixture f;
  f.fake->capacity = 8 * MiB;
  void* p = f.alloc.allocate(5 * MiB, s1);  // a 20 MiB segment does not fit; 6 MiB does
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 6 * MiB);
  f.alloc.free(p);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, OutOfMemoryThrowsWithTheSizesInTheMessage) {
  Fixture f;
  f.fake->capacity = 24 * MiB;
  void* p = f.alloc.allocate(16 * MiB, s1);
  void* small = f.alloc.allocate(1000, s1);
  void* cached = f.alloc.allocate(1000, s2);
  f.alloc.free(cached);  // a whole free small segment: given back before the retry
  expect_error([&] { f.alloc.allocate(16 * MiB, s1); },
               {"out of memory", "cuda:0", "16777216 bytes (16.00 MiB)",
                "16778240 bytes (16.00 MiB) allocated", "18874368 bytes (18.00 MiB) reserved",
                "2096128 bytes (2.00 MiB) cached"});
  EXPECT_EQ(f.fake->frees, 1);
  EXPECT_EQ(f.fake->failures, 2);  // the first try and the retry (16 MiB is its own size)
  // Nothing else changed: the live blocks are intact and everything still works.
  CachingAllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 16 * MiB + 1024);
  EXPECT_EQ(st.num_allocs, 3);
  f.alloc.check_invariants();
  f.alloc.free(p);
  void* again = f.alloc.allocate(16 * MiB, s1);
  EXPECT_EQ(again, p);
  f.alloc.free(again);
  f.alloc.free(small);
}

TEST(CachingAllocator, FreeOfAPointerItDoesNotOwnThrows) {
  Fixture f;
  char* p = static_cast<char*>(f.alloc.allocate(4096, s1));
  int local = 0;
  CachingAllocatorStats before = f.alloc.stats();
  expect_error([&] { f.alloc.free(&local); }, {"free of", "cuda:0", "not a live allocation"});
  expect_error([&] { f.alloc.free(p + 512); }, {"not a live allocation"});  // interior pointer
  expect_error([&] { f.alloc.record_stream(&local, s2); },
               {"record_stream", "not a live allocation"});
  CachingAllocatorStats after = f.alloc.stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_frees, before.num_frees);
  f.alloc.check_invariants();
  f.alloc.free(p);
  expect_error([&] { f.alloc.free(p); }, {"not a live allocation", "double free"});
  f.alloc.check_invariants();
  EXPECT_EQ(f.alloc.allocate(4096, s1), p);  // the double free did not put p in the pool twice
  EXPECT_NE(f.alloc.allocate(4096, s1), p);
}

// Thousands of random allocations and frees of random sizes on two streams, with record_stream,
// events completing at random, and a capacity that forces the out-of-memory path now and then.
// Every live block holds a pattern of its own, checked when it is freed: overlapping blocks would
// overwrite each other's. The live ranges are also checked for overlap directly.
TEST(CachingAllocator, RandomizedStress) {
  Fixture f;
  f.fake->capacity = 64 * MiB;
  std::mt19937_64 rng(12345);
  void* const streams[2] = {s1, s2};
  struct Live {
    char* p;
    size_t n;
    uint64_t id;
    void* stream;
    void* other;  // a stream record_stream added, or nullptr
  };
  std::vector<Live> live;
  std::map<char*, size_t> ranges;  // live [p, p + max(n, 1))
  // Freed blocks that another stream may still use, until its event (stream, seq) is done: no
  // allocation may overlap them before that.
  struct Quarantined {
    char* p;
    size_t extent;
    void* stream;
    uint64_t seq;
  };
  std::vector<Quarantined> quarantine;
  int64_t quarantined = 0;
  uint64_t next_id = 1;
  int64_t allocs = 0, frees = 0, ooms = 0, recorded = 0;
  size_t requested = 0;
  auto random_size = [&]() -> size_t {
    int kind = static_cast<int>(rng() % 20);
    if (kind < 14) return rng() % (64 * KiB + 1);
    if (kind < 19) return 64 * KiB + rng() % (2 * MiB);
    return 2 * MiB + rng() % (10 * MiB);
  };
  for (int step = 0; step < 6000; ++step) {
    int action = static_cast<int>(rng() % 100);
    if (live.empty() || action < 46) {
      size_t n = random_size();
      void* stream = streams[rng() % 2];
      char* p;
      try {
        p = static_cast<char*>(f.alloc.allocate(n, stream));
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
        ++ooms;
        continue;
      }
      ASSERT_NE(p, nullptr);
      size_t extent = std::max<size_t>(n, 1);
      auto after = ranges.lower_bound(p);
      ASSERT_TRUE(after == ranges.end() || after->first >= p + extent) << "overlaps the next block";
      ASSERT_TRUE(after == ranges.begin() ||
                  std::prev(after)->first + std::prev(after)->second <= p)
          << "overlaps the previous block";
      ranges.emplace(p, extent);
      for (size_t i = 0; i < quarantine.size();) {
        Quarantined& q = quarantine[i];
        if (f.fake->done(q.stream, q.seq)) {
          q = quarantine.back();
          quarantine.pop_back();
          continue;
        }
        ASSERT_TRUE(p + extent <= q.p || q.p + q.extent <= p)
            << "reused a block another stream may still be using";
        ++i;
      }
      uint64_t id = next_id++;
      fill(p, n, id);
      Live l{p, n, id, stream, nullptr};
      if (rng() % 5 == 0) {
        l.other = streams[rng() % 2];
        f.alloc.record_stream(p, l.other);
        ++recorded;
      }
      live.push_back(l);
      requested += n;
      ++allocs;
    } else if (action < 92) {
      size_t i = rng() % live.size();
      Live l = live[i];
      ASSERT_TRUE(intact(l.p, l.n, l.id)) << "block " << l.id << " was overwritten";
      f.alloc.free(l.p);
      if (l.other && l.other != l.stream) {
        quarantine.push_back({l.p, std::max<size_t>(l.n, 1), l.other, f.fake->last_event(l.other)});
        ++quarantined;
      }
      ranges.erase(l.p);
      requested -= l.n;
      live[i] = live.back();
      live.pop_back();
      ++frees;
    } else {
      f.fake->complete(streams[rng() % 2], 1 + rng() % 4);
    }
    if (step % 200 == 0) {
      f.alloc.check_invariants();
      CachingAllocatorStats st = f.alloc.stats();
      ASSERT_EQ(st.requested_bytes, requested);
      ASSERT_GE(st.allocated_bytes, requested);
      ASSERT_EQ(st.reserved_bytes, f.fake->in_use);
      ASSERT_EQ(st.num_backend_allocs, f.fake->allocs);
      ASSERT_EQ(st.num_backend_frees, f.fake->frees);
      ASSERT_EQ(st.num_backend_alloc_failures, f.fake->failures);
      ASSERT_EQ(st.allocated_bytes + st.cached_bytes, st.reserved_bytes);
      ASSERT_LE(st.peak_reserved_bytes, f.fake->capacity);
    }
  }
  for (const Live& l : live) {
    ASSERT_TRUE(intact(l.p, l.n, l.id)) << "block " << l.id << " was overwritten";
    f.alloc.free(l.p);
    if (l.other && l.other != l.stream) ++quarantined;
  }
  CachingAllocatorStats st = f.alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.requested_bytes, 0u);
  EXPECT_EQ(st.num_allocs, allocs);
  EXPECT_EQ(st.num_frees, allocs);
  EXPECT_GT(st.num_cache_hits, allocs / 2) << "the cache should serve most requests";
  f.alloc.check_invariants();
  f.alloc.empty_cache();  // waits for what is pending, then everything is whole and goes back
  st = f.alloc.stats();
  EXPECT_EQ(st.reserved_bytes, 0u);
  EXPECT_EQ(st.pending_free_bytes, 0u);
  EXPECT_EQ(st.num_segments, 0);
  EXPECT_EQ(f.fake->in_use, 0u);
  EXPECT_EQ(f.fake->events_recorded, f.fake->events_destroyed);
  f.alloc.check_invariants();
  // The run covered what it is meant to.
  EXPECT_GT(ooms, 0);
  EXPECT_GT(quarantined, 0);
  EXPECT_EQ(f.fake->events_recorded, quarantined);  // one per free of a block another stream used
  std::printf(
      "stress: %lld allocs, %lld frees, %lld out of memory, %lld record_stream, %lld cache "
      "hits, %lld segments created\n",
      static_cast<long long>(allocs), static_cast<long long>(frees), static_cast<long long>(ooms),
      static_cast<long long>(recorded), static_cast<long long>(st.num_cache_hits),
      static_cast<long long>(st.num_backend_allocs));
}

// Several threads allocating and freeing on their own streams through one allocator.
TEST(CachingAllocator, IsThreadSafe) {
  Fixture f;
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      void* stream = &stream_tags[t];
      struct Live {
        void* p;
        size_t n;
        uint64_t id;
      };
      std::vector<Live> live;
      for (int step = 0; step < 3000; ++step) {
        if (live.empty() || rng() % 2) {
          size_t n = rng() % (rng() % 8 == 0 ? 3 * MiB : 16 * KiB);
          uint64_t id = (uint64_t(t) << 32) | uint64_t(step);
          void* p = f.alloc.allocate(n, stream);
          fill(p, n, id);
          live.push_back({p, n, id});
        } else {
          size_t i = rng() % live.size();
          if (!intact(live[i].p, live[i].n, live[i].id)) ++failures[t];
          f.alloc.free(live[i].p);
          live[i] = live.back();
          live.pop_back();
        }
      }
      for (const Live& l : live) {
        if (!intact(l.p, l.n, l.id)) ++failures[t];
        f.alloc.free(l.p);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0u);
  f.alloc.check_invariants();
}

TEST(CachingAllocator, DestructionGivesEverythingBack) {
  auto* fake = new FakeBackend;
  {
    CachingAllocator alloc(std::unique_ptr<detail::MemoryBackend>(fake), "cuda:1");
    void* p = alloc.allocate(3 * MiB, s1);
    alloc.allocate(100, s2);  // still live at destruction
    alloc.record_stream(p, s2);
    alloc.free(p);  // awaiting an event at destruction
  }
  // ~FakeBackend (run by ~CachingAllocator) checks that no segment or event leaked.
}

}  // namespace
}  // namespace kiln
