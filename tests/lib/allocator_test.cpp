// The CPU allocator: alignment, reuse of cached large blocks and the cache's bound; the small-block
// cache: reuse by size class, alignment, class boundaries, a block freed on another thread, its
// bound.
#include "lib/allocator.h"

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/testing.h"

namespace kiln {
namespace {

TEST(Allocator, BlocksAreAligned) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, size_t{4096}, size_t{3} << 20}) {
    void* p = detail::cpu_alloc(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    detail::cpu_free(p, n);
  }
  Tensor t = empty({1000});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data_ptr()) % 64, 0u);
}

TEST(Allocator, LargeBlocksAreReusedForTheSameSize) {
  detail::cpu_empty_cache();
  void* first = nullptr;
  {
    Tensor a = empty({4 << 20});  // 16 MiB
    first = a.raw_data_ptr();
  }
  EXPECT_GE(detail::cpu_cached_bytes(), size_t{16} << 20);
  Tensor b = empty({4 << 20});
  EXPECT_EQ(b.raw_data_ptr(), first);
  EXPECT_EQ(detail::cpu_cached_bytes(), 0u);
  b.fill_(2.5f);  // the reused block is fully usable
  EXPECT_EQ(b.sum().item<double>(), 2.5 * (4 << 20));
}

TEST(Allocator, CacheIsBoundedAndCanBeEmptied) {
  detail::cpu_empty_cache();
  {
    std::vector<Tensor> many;
    for (int i = 0; i < 40; ++i) many.push_back(empty({8 << 20}));  // 40 x 32 MiB = 1.25 GiB
  }
  EXPECT_LE(detail::cpu_cached_bytes(), size_t{1024} << 20);
  EXPECT_GT(detail::cpu_cached_bytes(), 0u);
  detail::cpu_empty_cache();
  EXPECT_EQ(detail::cpu_cached_bytes(), 0u);
}

// Requests around the small size classes' edges (64-byte steps to 512, then four per doubling) and
// the 1 MiB boundary to the large blocks.
const size_t kEdgeSizes[] = {0,   1,    63,   64,   65,   511,  512,   513,    640,
                             641, 1023, 1024, 1025, 4096, 4097, 65535, 786432, (1 << 20) - 1};

TEST(Allocator, SmallBlocksAreReusedOnTheFreeingThread) {
  detail::cpu_empty_cache();
  void* p = detail::cpu_alloc(100);
  detail::cpu_free(p, 100);
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), 128u);  // 100 bytes: the 128-byte class
  const uint64_t taken = detail::cpu_system_allocs();
  void* q = detail::cpu_alloc(120);  // the same class
  EXPECT_EQ(q, p);
  EXPECT_EQ(detail::cpu_system_allocs(), taken);
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), 0u);
  std::memset(q, 0x5a, 120);
  detail::cpu_free(q, 120);
  detail::cpu_empty_cache();
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), 0u);
}

TEST(Allocator, SmallBlocksAreAlignedAndWholeAtEverySize) {
  detail::cpu_empty_cache();
  for (int round = 0; round < 2; ++round) {  // fresh blocks, then reused ones
    std::vector<void*> blocks;
    for (size_t n : kEdgeSizes) {
      void* p = detail::cpu_alloc(n);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
      std::memset(p, static_cast<int>(n & 0xff), n);
      blocks.push_back(p);
    }
    // No two live blocks overlap: each still holds its own bytes.
    for (size_t i = 0; i < blocks.size(); ++i) {
      const size_t n = kEdgeSizes[i];
      const auto* bytes = static_cast<const unsigned char*>(blocks[i]);
      for (size_t k = 0; k < n; k += 61) ASSERT_EQ(bytes[k], n & 0xff) << n << " byte " << k;
    }
    for (size_t i = 0; i < blocks.size(); ++i) detail::cpu_free(blocks[i], kEdgeSizes[i]);
  }
  detail::cpu_empty_cache();
}

TEST(Allocator, SizeClassBoundaries) {
  detail::cpu_empty_cache();
  // (a request, one in the same class, one just past it)
  const size_t cases[][3] = {
      {0, 64, 65},       {1, 64, 65},        {449, 512, 513},    {513, 640, 641},
      {897, 1024, 1025}, {1025, 1280, 1281}, {4097, 5120, 5121}, {917505, (1 << 20) - 1, 1 << 20}};
  for (const auto& c : cases) {
    void* p = detail::cpu_alloc(c[0]);
    detail::cpu_free(p, c[0]);
    EXPECT_EQ(detail::cpu_alloc(c[1]), p) << c[0] << " and " << c[1];
    detail::cpu_free(p, c[1]);
    const uint64_t taken = detail::cpu_system_allocs();
    void* next = detail::cpu_alloc(c[2]);
    EXPECT_NE(next, p) << c[2] << " is past " << c[0] << "'s class";
    EXPECT_EQ(detail::cpu_system_allocs(), taken + 1) << c[2];
    detail::cpu_free(next, c[2]);
    detail::cpu_empty_cache();
  }
}

TEST(Allocator, SmallBlockFreedOnAnotherThreadJoinsThatThreadsCache) {
  detail::cpu_empty_cache();
  void* p = detail::cpu_alloc(256);
  std::memset(p, 1, 256);
  void* reused = nullptr;
  size_t cached_there = 0, cached_after_reuse = 0;
  std::thread other([&] {
    detail::cpu_free(p, 256);
    cached_there = detail::cpu_thread_small_cached_bytes();
    reused = detail::cpu_alloc(200);
    cached_after_reuse = detail::cpu_thread_small_cached_bytes();
    std::memset(reused, 2, 200);
    detail::cpu_free(reused, 200);  // kept until the thread exits, which returns it
  });
  other.join();
  EXPECT_EQ(cached_there, 256u);
  EXPECT_EQ(reused, p);
  EXPECT_EQ(cached_after_reuse, 0u);
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), 0u);  // this thread's cache did not see it
  // Tensors made on one thread and dropped on another, both ways, stay whole.
  std::vector<Tensor> made(64);
  std::thread maker([&] {
    for (size_t i = 0; i < made.size(); ++i) made[i] = full({int64_t(i) + 1}, float(i));
  });
  maker.join();
  for (size_t i = 0; i < made.size(); ++i)
    EXPECT_EQ(made[i].sum().item<double>(), double(i) * double(i + 1)) << i;
  made.clear();
  Tensor t = full({7}, 3.0f);
  EXPECT_EQ(t.sum().item<double>(), 21.0);
}

TEST(Allocator, SmallBlockCacheIsBounded) {
  detail::cpu_empty_cache();
  // Many blocks of one class: at most 64 are kept.
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(detail::cpu_alloc(100));
  for (void* p : blocks) detail::cpu_free(p, 100);
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), 64u * 128u);
  detail::cpu_empty_cache();
  // Large small blocks: at most 4 MiB in all.
  blocks.clear();
  const size_t n = (1 << 20) - 1;
  for (int i = 0; i < 8; ++i) blocks.push_back(detail::cpu_alloc(n));
  for (void* p : blocks) detail::cpu_free(p, n);
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), size_t{4} << 20);
  detail::cpu_empty_cache();
  EXPECT_EQ(detail::cpu_thread_small_cached_bytes(), 0u);
}

}  // namespace
}  // namespace kiln
