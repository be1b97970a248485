// Tiered CUDA compiles, without a GPU (NVRTC runs on the host): a new kernel's first binary is a
// stand-in that compiles quicker (a 4-wide flat kernel's scalar loop; a rows kernel built with
// --Ofast-compile=min) while the wanted binary compiles in the background and is filed in memory
// and on disk; a process waits for its background compiles when it exits, so the next process
// loads the wanted binary from disk and needs no stand-in. And the background queue itself.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if KILN_HAS_CUDA
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <variant>

#include "fuser/cache.h"
#include "fuser/codegen/cuda/background_compiles.h"
#include "fuser/codegen/cuda/cuda_kernel.h"
#include "fuser/fuse.h"
#include "jit/ir.h"
#include "tests/testing.h"
#endif

namespace kiln {
namespace {

#if !KILN_HAS_CUDA

TEST(CudaTiers, NeedTheCudaToolkit) {
  GTEST_SKIP() << "kiln was built without the CUDA toolkit (no NVRTC)";
}

#else

using fuser::FusionGroup;
using fuser::Layout;
using fuser::cuda::BackgroundCompiles;
using fuser::cuda::CudaCallFlags;

constexpr int kSm = 90;

// A number no earlier run used: it picks the structure of the test's kernels, which are then in
// neither cache (the test kernel cache outlives a run).
uint64_t fresh_number() {
  static std::atomic<uint64_t> next{
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (static_cast<uint64_t>(getpid()) << 40)};
  return next.fetch_add(0x9e3779b97f4a7c15ull);
}

// An elementwise chain over [1024] float32 whose 16 ops (neg, abs, exp, tanh) follow the bits of
// `structure`: one flat group with a 4-wide loop.
FusionGroup chain_group(uint64_t structure) {
  static const char* ops[] = {"neg", "abs", "exp", "tanh"};
  jit::Graph g;
  const jit::ValueType type{kFloat32, {1024}};
  jit::Value* v = g.add_input(type);
  for (int k = 0; k < 16; ++k)
    v = g.create(ops[(structure >> (2 * k)) & 3], {v}, {}, {type})->output();
  g.add_output(v);
  return fuser::find_groups(g).at(0);
}

// A softmax along rows of [64, 1024] float32 after 16 neg or abs by the bits of `structure`.
FusionGroup softmax_group(uint64_t structure) {
  jit::Graph g;
  const jit::ValueType type{kFloat32, {64, 1024}}, row{kFloat32, {64, 1}};
  jit::Value* v = g.add_input(type);
  for (int k = 0; k < 16; ++k)
    v = g.create((structure >> k) & 1 ? "neg" : "abs", {v}, {}, {type})->output();
  jit::Value* m = g.create("amax", {v}, {std::vector<int64_t>{1}, true}, {row})->output();
  jit::Value* e =
      g.create("exp", {g.create("sub", {v, m}, {int64_t{1}}, {type})->output()}, {}, {type})
          ->output();
  jit::Value* s =
      g.create("sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, {row})->output();
  g.add_output(g.create("div", {e, s}, {}, {type})->output());
  for (FusionGroup& group : fuser::find_groups(g))
    if (group.rows) return group;
  ADD_FAILURE() << "the softmax has no rows group";
  return {};
}

Layout flat_layout(const FusionGroup& group) {
  Layout layout;
  layout.single_element.assign(group.kernel.input_types.size(), false);
  return layout;
}

Layout rows_layout(const FusionGroup& group) {
  Layout layout;
  layout.flat = false;
  layout.rows = true;
  layout.rank = 1;
  layout.inner.assign(group.kernel.input_types.size() + group.kernel.outputs.size(), Layout::kUnit);
  return layout;
}

// Turns tiered compiles on or off for a scope.
struct Tiered {
  explicit Tiered(bool on) { fuser::cuda::set_cuda_tiered_compile(on); }
  ~Tiered() {
    fuser::cuda::wait_for_background_compiles();
    fuser::cuda::set_cuda_tiered_compile(true);
  }
};

// The disk cache's entry for (group, layout, variant), filed under the source (cuda_kernel.h).
std::optional<std::string> on_disk(const FusionGroup& group, const Layout& layout,
                                   CudaCallFlags variant) {
  const std::string symbol =
      fuser::kernel_symbol(fuser::kernel_key(group.kernel, layout), group.kernel);
  return fuser::DiskCache::instance().load(
      fuser::cuda::cuda_disk_key(fuser::cuda::cuda_source(group.kernel, layout, symbol, variant),
                                 kSm, false),
      fuser::kCudaBinary);
}

TEST(CudaTiers, AFourWideKernelFirstRunsItsScalarLoop) {
  Tiered tiered(true);
  const FusionGroup group = chain_group(fresh_number());
  const Layout layout = flat_layout(group);
  const CudaCallFlags vec{true, true}, scalar{true, false};
  const fuser::cuda::CudaCompileStats before = fuser::cuda::cuda_compile_stats();
  bool stand_in = false;
  const fuser::cuda::CudaBinary first =
      fuser::cuda::cuda_binary_now(group.kernel, layout, vec, kSm, &stand_in);
  EXPECT_TRUE(stand_in);
  // The stand-in is the scalar variant's binary (now in memory: no second compile).
  EXPECT_EQ(first.image, fuser::cuda::cuda_binary(group.kernel, layout, scalar, kSm).image);
  fuser::cuda::wait_for_background_compiles();
  const fuser::cuda::CudaBinary wanted =
      fuser::cuda::cuda_binary_now(group.kernel, layout, vec, kSm, &stand_in);
  EXPECT_FALSE(stand_in);
  EXPECT_NE(wanted.image, first.image);
  EXPECT_EQ(wanted.image, fuser::cuda::cuda_binary(group.kernel, layout, vec, kSm).image);
  const fuser::cuda::CudaCompileStats after = fuser::cuda::cuda_compile_stats();
  EXPECT_EQ(after.stand_ins - before.stand_ins, 1);
  EXPECT_EQ(after.background_compiles - before.background_compiles, 1);
  EXPECT_EQ(after.compiles - before.compiles, 2);  // the scalar loop, then the 4-wide one
  if (fuser::DiskCache::instance().enabled()) {
    const std::optional<std::string> filed = on_disk(group, layout, vec);
    ASSERT_TRUE(filed.has_value()) << "the background compile did not reach the disk cache";
    EXPECT_EQ(*filed, wanted.image);
  }
}

TEST(CudaTiers, ARowsKernelFirstRunsALessOptimizedBuild) {
  Tiered tiered(true);
  const FusionGroup group = softmax_group(fresh_number());
  const Layout layout = rows_layout(group);
  const CudaCallFlags variant{true, false};
  bool stand_in = false;
  const fuser::cuda::CudaBinary first =
      fuser::cuda::cuda_binary_now(group.kernel, layout, variant, kSm, &stand_in);
  EXPECT_TRUE(stand_in);
  fuser::cuda::wait_for_background_compiles();
  const fuser::cuda::CudaBinary wanted =
      fuser::cuda::cuda_binary_now(group.kernel, layout, variant, kSm, &stand_in);
  EXPECT_FALSE(stand_in);
  EXPECT_NE(wanted.image, first.image);
  EXPECT_EQ(wanted.symbol, first.symbol);  // the launcher finds the same entry points in both
  if (fuser::DiskCache::instance().enabled()) {
    // The wanted binary is filed on disk; the stand-in (other options) only in memory.
    const std::optional<std::string> filed = on_disk(group, layout, variant);
    ASSERT_TRUE(filed.has_value());
    EXPECT_EQ(*filed, wanted.image);
  }
}

TEST(CudaTiers, TurnedOffANewKernelCompilesAtOnce) {
  Tiered tiered(false);
  const FusionGroup group = chain_group(fresh_number());
  const fuser::cuda::CudaCompileStats before = fuser::cuda::cuda_compile_stats();
  bool stand_in = true;
  const fuser::cuda::CudaBinary binary =
      fuser::cuda::cuda_binary_now(group.kernel, flat_layout(group), {true, true}, kSm, &stand_in);
  EXPECT_FALSE(stand_in);
  EXPECT_EQ(binary.image,
            fuser::cuda::cuda_binary(group.kernel, flat_layout(group), {true, true}, kSm).image);
  const fuser::cuda::CudaCompileStats after = fuser::cuda::cuda_compile_stats();
  EXPECT_EQ(after.compiles - before.compiles, 1);
  EXPECT_EQ(after.stand_ins - before.stand_ins, 0);
}

// A kernel without a 4-wide loop (64-bit integers) has no quicker binary: it compiles at once.
TEST(CudaTiers, AKernelWithoutAQuickerBuildCompilesAtOnce) {
  Tiered tiered(true);
  jit::Graph g;
  const jit::ValueType type{kInt64, {1024}};
  jit::Value* v = g.add_input(type);
  const uint64_t structure = fresh_number();
  for (int k = 0; k < 12; ++k)
    v = g.create((structure >> k) & 1 ? "neg" : "abs", {v}, {}, {type})->output();
  g.add_output(v);
  const FusionGroup group = fuser::find_groups(g).at(0);
  bool stand_in = true;
  fuser::cuda::cuda_binary_now(group.kernel, flat_layout(group), {true, true}, kSm, &stand_in);
  EXPECT_FALSE(stand_in);
}

// Threads asking for the same new kernel at once each get its stand-in or its compiled binary;
// the binary compiles once in the background, and then everyone gets it.
TEST(CudaTiers, ThreadsAskingForANewKernelAtOnce) {
  Tiered tiered(true);
  const FusionGroup group = chain_group(fresh_number());
  const Layout layout = flat_layout(group);
  const fuser::cuda::CudaCompileStats before = fuser::cuda::cuda_compile_stats();
  std::vector<std::thread> threads;
  std::atomic<int> stand_ins{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      bool stand_in = false;
      fuser::cuda::cuda_binary_now(group.kernel, layout, {true, true}, kSm, &stand_in);
      stand_ins += stand_in ? 1 : 0;
    });
  for (std::thread& t : threads) t.join();
  fuser::cuda::wait_for_background_compiles();
  const fuser::cuda::CudaCompileStats after = fuser::cuda::cuda_compile_stats();
  EXPECT_GE(stand_ins, 1);
  EXPECT_EQ(after.stand_ins - before.stand_ins, stand_ins);
  EXPECT_EQ(after.background_compiles - before.background_compiles, 1);
  bool stand_in = true;
  const fuser::cuda::CudaBinary wanted =
      fuser::cuda::cuda_binary_now(group.kernel, layout, {true, true}, kSm, &stand_in);
  EXPECT_FALSE(stand_in);
  EXPECT_EQ(wanted.image, fuser::cuda::cuda_binary(group.kernel, layout, {true, true}, kSm).image);
}

// Run by AProcessFilesItsBackgroundCompilesBeforeItExits in child processes: asks for the binaries
// of the flat and the rows kernel CUDA_TIERS_STRUCTURE names, prints how many stand-ins served, and
// exits at once (while the rows kernel's background compile runs).
TEST(CudaTiers, ChildAsksForTwoKernels) {
  const char* structure = std::getenv("CUDA_TIERS_STRUCTURE");
  if (!structure) GTEST_SKIP() << "run by AProcessFilesItsBackgroundCompilesBeforeItExits";
  const FusionGroup flat = chain_group(std::stoull(structure));
  const FusionGroup rows = softmax_group(std::stoull(structure));
  if (std::getenv("CUDA_TIERS_SCALAR_ONLY")) {  // files the flat kernel's scalar loop only
    fuser::cuda::cuda_binary(flat.kernel, flat_layout(flat), {true, false}, kSm);
    return;
  }
  bool flat_stand_in = false, rows_stand_in = false;
  fuser::cuda::cuda_binary_now(flat.kernel, flat_layout(flat), {true, true}, kSm, &flat_stand_in);
  fuser::cuda::cuda_binary_now(rows.kernel, rows_layout(rows), {true, false}, kSm, &rows_stand_in);
  std::printf("stand-ins %d disk hits %ld\n", (flat_stand_in ? 1 : 0) + (rows_stand_in ? 1 : 0),
              static_cast<long>(fuser::cuda::cuda_compile_stats().disk_hits));
}

// Runs ChildAsksForTwoKernels in a child process (with `env`, "VAR=value ..." or "") over the
// disk cache in `dir`; returns its output.
std::function<std::string(const std::string&)> child_runner(const std::string& dir,
                                                            const std::string& structure) {
  return [dir, structure](const std::string& env) {
    const testing::ChildRun run = testing::run_this_binary(
        "-u KILN_CUDA_TIERED KILN_CACHE=1 " + env + " KILN_CACHE_DIR=" + dir +
            "/cache CUDA_TIERS_STRUCTURE=" + structure,
        "--gtest_filter=CudaTiers.ChildAsksForTwoKernels");
    EXPECT_EQ(run.status, 0) << run.output;
    return run.output;
  };
}

// A process that exits right after its stand-ins served waits for the wanted binaries' compiles
// (and does not crash doing so): the next process finds them on disk and runs them at once.
TEST(CudaTiers, AProcessFilesItsBackgroundCompilesBeforeItExits) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/kiln_cuda_tiers_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string structure = std::to_string(fresh_number());
  auto run_child = child_runner(dir, structure);
  const std::string first = run_child("");
  EXPECT_NE(first.find("stand-ins 2 disk hits 0"), std::string::npos) << first;
  const std::string second = run_child("");
  EXPECT_NE(second.find("stand-ins 0 disk hits 2"), std::string::npos) << second;
  fs::remove_all(dir);
}

// A process whose stand-in comes from the disk cache (no NVRTC compile before the queue starts)
// files its background compiles before it exits as well.
TEST(CudaTiers, AProcessWhoseStandInWasOnDiskFilesItsCompilesBeforeItExits) {
  namespace fs = std::filesystem;
  const std::string dir =
      ::testing::TempDir() + "/kiln_cuda_tiers_disk_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string structure = std::to_string(fresh_number());
  auto run_child = child_runner(dir, structure);
  run_child("CUDA_TIERS_SCALAR_ONLY=1");
  const std::string first = run_child("");
  EXPECT_NE(first.find("stand-ins 2 disk hits 1"), std::string::npos) << first;
  const std::string second = run_child("");
  EXPECT_NE(second.find("stand-ins 0 disk hits 2"), std::string::npos) << second;
  fs::remove_all(dir);
}

// ------------------------------------------------------------------ the background queue

TEST(BackgroundCompiles, RunsEachKeyOnceWhileItIsQueuedOrRunning) {
  BackgroundCompiles queue(2);
  std::atomic<bool> release{false};
  std::atomic<int> runs{0};
  auto job = [&] {
    while (!release) std::this_thread::yield();
    ++runs;
  };
  EXPECT_TRUE(queue.submit("a", job));
  EXPECT_FALSE(queue.submit("a", job));  // queued or running: not again
  EXPECT_TRUE(queue.submit("b", job));
  release = true;
  queue.wait_idle();
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(queue.finished(), 2);
  EXPECT_TRUE(queue.submit("a", [&] { ++runs; }));  // done: a key may come again
  queue.wait_idle();
  EXPECT_EQ(runs, 3);
}

TEST(BackgroundCompiles, AJobThatThrowsIsCountedAndTheOthersRun) {
  BackgroundCompiles queue(1);
  std::atomic<int> runs{0};
  queue.submit("bad", [] { throw std::runtime_error("no"); });
  queue.submit("worse", [] { throw 7; });
  queue.submit("good", [&] { ++runs; });
  queue.wait_idle();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(queue.failed(), 2);
  EXPECT_EQ(queue.finished(), 3);
}

TEST(BackgroundCompiles, ManyThreadsSubmitAndWait) {
  BackgroundCompiles queue(3);
  std::atomic<int> runs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        queue.submit(std::to_string(t) + "/" + std::to_string(i), [&] { ++runs; });
        if (i % 10 == 0) queue.wait_idle();
      }
    });
  for (std::thread& t : threads) t.join();
  queue.wait_idle();
  EXPECT_EQ(runs, 200);
  EXPECT_EQ(queue.finished(), 200);
}

#endif

}  // namespace
}  // namespace kiln
