// The CPU allocator: alignment, reuse of cached large blocks, and the cache's bound.
#include "lib/allocator.h"

#include <cstdint>

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

}  // namespace
}  // namespace kiln
