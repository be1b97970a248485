// The statistics registry: providers by name, read on demand, and the code generators' providers
// registered when the library loads (jit::stats() reads the CPU code generator's through it).
#include <gtest/gtest.h>

#include "fuser/codegen/llvm/cpu_codegen.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/stats_registry.h"

namespace kiln {
namespace {

TEST(StatsRegistry, ReadsARegisteredProviderEachTime) {
  int64_t calls = 0;
  detail::register_stats("test_provider", [&calls] {
    ++calls;
    return detail::StatValues{{"calls", static_cast<double>(calls)}, {"half", 0.5}};
  });
  EXPECT_EQ(detail::stat(detail::read_stats("test_provider"), "calls"), 1);
  const detail::StatValues v = detail::read_stats("test_provider");
  EXPECT_EQ(detail::stat(v, "calls"), 2);
  EXPECT_EQ(detail::stat(v, "half"), 0.5);
  EXPECT_EQ(detail::stat(v, "absent"), 0);
}

TEST(StatsRegistry, ReplacesAProviderOfTheSameName) {
  detail::register_stats("test_replaced", [] { return detail::StatValues{{"v", 1}}; });
  detail::register_stats("test_replaced", [] { return detail::StatValues{{"v", 2}}; });
  EXPECT_EQ(detail::stat(detail::read_stats("test_replaced"), "v"), 2);
}

TEST(StatsRegistry, UnknownProviderReadsEmpty) {
  EXPECT_TRUE(detail::read_stats("no_such_provider").empty());
}

// The CPU code generator publishes its counters at load time, and jit::stats() shows them.
TEST(StatsRegistry, CpuCodegenCountersReachJitStats) {
  Tensor a = randn({64});
  Tensor b = randn({64});
  Tensor c = tanh(a * b + 1.0);
  eval({c});
  const fuser::CompileStats direct = fuser::cpu_compile_stats();
  const detail::StatValues published = detail::read_stats("cpu_codegen");
  ASSERT_FALSE(published.empty());
  const int64_t requests = direct.compiled + direct.memory_hits + direct.disk_hits;
  EXPECT_GT(requests, 0);
  EXPECT_EQ(detail::stat(published, "compiled"), direct.compiled);
  EXPECT_EQ(detail::stat(published, "disk_hits"), direct.disk_hits);
  const jit::Stats st = jit::stats();
  EXPECT_EQ(st.kernels_compiled + st.kernel_memory_hits + st.kernel_disk_hits, requests);
  EXPECT_EQ(st.kernels_evicted, direct.evicted);
}

}  // namespace
}  // namespace kiln
