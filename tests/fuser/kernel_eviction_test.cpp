// The in-memory kernel cache's capacity: least recently used kernels are evicted, plans that hold
// an evicted kernel keep running it, a kernel nobody holds any more is unloaded and loaded again
// when needed, and all of it holds with several threads compiling and running at once.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "fuser/codegen/llvm/cpu_codegen.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::eager;
using testing::Fn;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

// Sets the cache's capacity for a test, restoring the previous one at its end.
class CapacityGuard {
 public:
  explicit CapacityGuard(size_t kernels)
      : previous_(fuser::set_cpu_kernel_cache_capacity(kernels)) {}
  ~CapacityGuard() { fuser::set_cpu_kernel_cache_capacity(previous_); }

 private:
  size_t previous_;
};

// A chain of n + 1 elementwise steps: one fused kernel, a different one for every n.
Fn chain(int n) {
  return [n](const Inputs& in) {
    Tensor y = in[0];
    for (int i = 0; i <= n; ++i) y = i % 2 == 0 ? tanh(y * 1.5 + 0.25) : y * y - 0.5;
    return Inputs{y};
  };
}

// A random input, computed (not pending: its making must not join the planned graphs).
Tensor input(const Shape& shape) {
  LazyGuard eager_mode(false);
  return testing::random_tensor(shape);
}

// Kernels compiled or read from disk so far: the requests the in-memory cache did not serve.
int64_t loads() {
  const jit::Stats s = jit::stats();
  return s.kernels_compiled + s.kernel_disk_hits;
}

// Runs a planned chain and checks it against eager mode.
void expect_runs(const Planned& p, int n, const Tensor& x, const std::string& what) {
  Inputs got = p.plan->run(p.binding.inputs);
  Inputs want = eager(chain(n), {x});
  ASSERT_EQ(got.size(), 1u) << what;
  testing::expect_bit_equal(got[0], want[0], what);
}

TEST(KernelEviction, EvictedKernelsHeldByAPlanKeepRunning) {
  CapacityGuard capacity(2);
  const Tensor x = input({3, 37});
  const fuser::CompileStats before = fuser::cpu_compile_stats();
  const int64_t evicted_before = jit::stats().kernels_evicted;
  Planned p0 = plan_of(chain(0), {x});
  ASSERT_EQ(p0.plan->num_kernel_steps(), 1u);
  expect_runs(p0, 0, x, "chain 0");
  // Four more kernels through a cache of two: chain 0's kernel, the least recently used, goes
  // first; the plans of chains 1 to 4 go at once, so the kernels evicted after them are unloaded.
  for (int n = 1; n <= 4; ++n) {
    Planned p = plan_of(chain(n), {x});
    ASSERT_EQ(p.plan->num_kernel_steps(), 1u);
    expect_runs(p, n, x, "chain " + std::to_string(n));
  }
  const fuser::CompileStats after = fuser::cpu_compile_stats();
  EXPECT_EQ(after.evicted - before.evicted, 3);
  EXPECT_EQ(jit::stats().kernels_evicted - evicted_before, 3);
  EXPECT_EQ(after.unloaded - before.unloaded, 2) << "chains 1 and 2: evicted and not held";
  // p0 still holds its evicted kernel's code, and runs it, again and again.
  for (int i = 0; i < 3; ++i) expect_runs(p0, 0, x, "chain 0 after its eviction");
  // Planning chain 0 again finds its code still loaded (p0 holds it): nothing compiled or read.
  const int64_t loads_before = loads();
  Planned p0b = plan_of(chain(0), {x});
  expect_runs(p0b, 0, x, "chain 0 planned again");
  EXPECT_EQ(loads(), loads_before);
  EXPECT_EQ(fuser::cpu_compile_stats().revived - after.revived, 1);
}

TEST(KernelEviction, AnEvictedKernelNoLongerHeldIsUnloadedAndLoadedAgain) {
  CapacityGuard capacity(1);
  const Tensor x = input({4, 5, 6});
  {
    Planned p = plan_of(chain(5), {x});
    expect_runs(p, 5, x, "chain 5");
  }
  const fuser::CompileStats before = fuser::cpu_compile_stats();
  {
    Planned q = plan_of(chain(6), {x});
    expect_runs(q, 6, x, "chain 6");
  }
  const fuser::CompileStats after = fuser::cpu_compile_stats();
  EXPECT_EQ(after.evicted - before.evicted, 1);
  EXPECT_EQ(after.unloaded - before.unloaded, 1) << "chain 5's kernel is held by nothing";
  // Chain 5 again: compiled again, or read from the disk cache, and right.
  const int64_t loads_before = loads();
  Planned p = plan_of(chain(5), {x});
  expect_runs(p, 5, x, "chain 5 after its code was removed");
  EXPECT_EQ(loads(), loads_before + 1);
  EXPECT_EQ(fuser::cpu_compile_stats().revived, after.revived);
  // Through lazy evaluation too (its plan cache holds what it ran).
  Tensor lazy_result;
  {
    LazyGuard lazy(true);
    lazy_result = chain(7)({x})[0];
    eval(lazy_result);
  }
  testing::expect_bit_equal(lazy_result, eager(chain(7), {x})[0], "chain 7, lazily");
}

TEST(KernelEviction, ThreadsCompilingAndRunningThroughASmallCache) {
  CapacityGuard capacity(3);
  const Tensor x = input({2, 33});
  constexpr int kChains = 10;
  std::vector<Tensor> want;
  for (int n = 0; n < kChains; ++n) want.push_back(eager(chain(n), {x})[0]);
  const fuser::CompileStats before = fuser::cpu_compile_stats();
  constexpr int kThreads = 4, kRounds = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread keeps its last two plans alive: evicted kernels they hold stay in use while
      // other threads evict, revive and reload.
      std::vector<std::pair<int, Planned>> held;
      for (int r = 0; r < kRounds; ++r) {
        const int n = (t * 7 + r * 3) % kChains;
        held.emplace_back(n, plan_of(chain(n), {x}));
        if (held.size() > 2) held.erase(held.begin());
        for (const auto& [m, p] : held) {
          Inputs got = p.plan->run(p.binding.inputs);
          testing::expect_bit_equal(
              got[0], want[static_cast<size_t>(m)],
              "chain " + std::to_string(m) + " on thread " + std::to_string(t));
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_GT(fuser::cpu_compile_stats().evicted - before.evicted, 0);
}

}  // namespace
}  // namespace kiln
