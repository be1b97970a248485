// The on-disk kernel cache, across processes: the test binary runs itself as a child program
// (three fused kernels) against one cache directory and reads back what the child compiled.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fuser/cache.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#include "fuser/kernel.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tests/testing.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// The child: three programs, each one fused kernel; prints what it compiled and a digest of the
// results.
TEST(KernelCacheChild, RunsThreeKernels) {
  if (!std::getenv("KILN_CACHE_TEST_CHILD")) GTEST_SKIP() << "runs as the child of KernelCache";
  Tensor x;
  {
    LazyGuard eager(false);
    x = arange(0, 64, 1, kFloat32) * 0.1 - 3.0;
  }
  std::vector<Tensor> ys{sigmoid(x) * 2.0 + 1.0, tanh(x) * x, exp(-x) + x * x};
  uint64_t digest = 1469598103934665603ull;
  for (const Tensor& y : ys)
    for (unsigned char b : testing::bytes(y)) digest = (digest ^ b) * 1099511628211ull;
  const jit::Stats s = jit::stats();
  std::printf("KILN_CHILD compiled=%lld disk=%lld digest=%016llx evicted=%lld\n",
              static_cast<long long>(s.kernels_compiled),
              static_cast<long long>(s.kernel_disk_hits), static_cast<unsigned long long>(digest),
              static_cast<long long>(s.kernels_evicted));
}

// y = f(x) for one float32 input: a kernel whose emitted code is the primitive's.
fuser::Kernel unary_kernel(fuser::Prim prim, const char* ops) {
  fuser::Kernel k;
  k.input_types = {kFloat32};
  const int32_t x = k.add({fuser::Prim::Load, kFloat32, -1, -1, -1, 0});
  k.outputs = {k.add({prim, kFloat32, x})};
  k.output_types = {kFloat32};
  k.ops = ops;
  return k;
}

// The disk cache files a CPU kernel under the code emitted for it (the LLVM IR module's text)
// and the target, with no version number bumped by hand: the same kernel gets the same key, the
// key holds the emitted module (an edit of the emitter or of lib/math/primitives.h changes it),
// and kernels whose code differs get different keys.
TEST(KernelCacheKey, IsTheEmittedCodeAndTheTarget) {
  fuser::Layout flat;
  flat.single_element = {false};
  const fuser::Kernel exp_k = unary_kernel(fuser::Prim::Exp, "exp");
  const std::string key = fuser::cpu_disk_key(exp_k, flat);
  EXPECT_EQ(key, fuser::cpu_disk_key(exp_k, flat));
  EXPECT_NE(key.find("define void @kiln_exp"), std::string::npos) << key;
  EXPECT_NE(key.find("@llvm.fma.f32"), std::string::npos);  // exp's polynomial, emitted
  EXPECT_NE(key.find("LLVM "), std::string::npos);
  EXPECT_EQ(key.find("codegen "), std::string::npos);  // no hand-bumped version
  EXPECT_NE(key, fuser::cpu_disk_key(unary_kernel(fuser::Prim::Tanh, "exp"), flat));
  fuser::Layout strided;
  strided.flat = false;
  strided.rank = 1;
  strided.inner = {fuser::Layout::kAny, fuser::Layout::kAny};
  EXPECT_NE(key, fuser::cpu_disk_key(exp_k, strided));
}

struct ChildResult {
  long long compiled = -1, disk = -1, evicted = -1;
  std::string digest, output;
};

ChildResult run_child(const std::string& env) {
  // The child fuses whatever mode the suite runs in (KILN_LAZY=0 and small KILN_MAX_PENDING
  // runs included): its three programs must each be one kernel.
  const testing::ChildRun run = testing::run_this_binary(
      "KILN_CACHE_TEST_CHILD=1 KILN_LAZY=1 KILN_FUSE=1 KILN_MAX_PENDING=10000 " + env,
      "--gtest_filter=KernelCacheChild.RunsThreeKernels");
  ChildResult r;
  r.output = run.output;
  EXPECT_EQ(run.status, 0) << r.output;
  auto pos = r.output.find("KILN_CHILD ");
  EXPECT_NE(pos, std::string::npos) << r.output;
  if (pos == std::string::npos) return r;
  char digest[32] = {};
  std::sscanf(r.output.c_str() + pos, "KILN_CHILD compiled=%lld disk=%lld digest=%16s evicted=%lld",
              &r.compiled, &r.disk, digest, &r.evicted);
  r.digest = digest;
  return r;
}

class KernelCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("kiln-cache-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string env() const { return "KILN_CACHE_DIR='" + dir_.string() + "'"; }
  // The kernels' objects (kCpuObject entries), or the entries naming them by kernel and build.
  std::vector<fs::path> entries(uint32_t kind = fuser::kCpuObject) const {
    std::vector<fs::path> out;
    if (fs::exists(dir_))
      for (const auto& e : fs::directory_iterator(dir_))
        if (e.path().extension() == ".kernel" && kind_of(e.path()) == kind) out.push_back(e.path());
    return out;
  }
  static uint32_t kind_of(const fs::path& p) {
    uint32_t kind = 0;  // the header's third field (fuser/cache.h)
    std::ifstream in(p, std::ios::binary);
    in.seekg(12);
    in.read(reinterpret_cast<char*>(&kind), sizeof kind);
    return in ? kind : 0;
  }
  fs::path dir_;
};

size_t count(const std::string& text, const std::string& s) {
  size_t n = 0;
  for (size_t p = text.find(s); p != std::string::npos; p = text.find(s, p + 1)) ++n;
  return n;
}
constexpr const char* kFoundByBuild = "by its kernel and this build (not emitted)";

// The second process finds each kernel by its structure and this build, without emitting it.
TEST_F(KernelCache, ASecondProcessCompilesNothing) {
  ChildResult first = run_child(env());
  EXPECT_EQ(first.compiled, 3) << first.output;
  EXPECT_EQ(first.disk, 0) << first.output;
  EXPECT_EQ(entries().size(), 3u);
  EXPECT_EQ(entries(fuser::kCpuEntryByBuild).size(), 3u);
  ChildResult second = run_child("KILN_LOG=cache " + env());
  EXPECT_EQ(second.compiled, 0) << second.output;
  EXPECT_EQ(second.disk, 3) << second.output;
  EXPECT_EQ(count(second.output, kFoundByBuild), 3u) << second.output;
  EXPECT_EQ(second.digest, first.digest) << "a kernel from disk computed something else";
}

// An entry by build that names another kernel's object (which links, without this kernel's
// symbol), or an entry that is gone: the kernel is emitted and found under its code's key (or
// compiled), and the entry by build is filed again.
TEST_F(KernelCache, AnEntryByBuildNamingAnotherKernelOrNothingFallsBackToTheEmittedCode) {
  const ChildResult reference = run_child(env());
  const std::vector<fs::path> by_build = entries(fuser::kCpuEntryByBuild);
  ASSERT_EQ(by_build.size(), 3u);
  std::vector<std::string> contents;
  for (const fs::path& p : by_build) {
    std::ifstream in(p, std::ios::binary);
    contents.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
  }
  for (size_t i = 0; i < by_build.size(); ++i)
    std::ofstream(by_build[i], std::ios::binary | std::ios::trunc)
        << contents[(i + 1) % contents.size()];
  ChildResult r = run_child("KILN_LOG=cache " + env());
  EXPECT_EQ(r.compiled, 0) << r.output;
  EXPECT_EQ(r.disk, 3) << r.output;
  EXPECT_EQ(count(r.output, kFoundByBuild), 0u) << r.output;
  EXPECT_EQ(r.digest, reference.digest);
  ChildResult again = run_child("KILN_LOG=cache " + env());
  EXPECT_EQ(count(again.output, kFoundByBuild), 3u) << "not filed again\n" << again.output;
  for (const fs::path& p : entries()) fs::remove(p);
  ChildResult gone = run_child(env());
  EXPECT_EQ(gone.compiled, 3) << gone.output;
  EXPECT_EQ(gone.digest, reference.digest);
}

TEST_F(KernelCache, BadEntriesAreDeletedAndRecompiledNeverRun) {
  const ChildResult reference = run_child(env());
  ASSERT_EQ(entries().size(), 3u);
  // Each damage applied to every entry; the next process must recompile all three, compute the
  // same results, and leave good entries behind for the one after.
  const std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> damages = {
      {"truncated", [](const fs::path& p) { fs::resize_file(p, fs::file_size(p) / 2); }},
      {"empty", [](const fs::path& p) { fs::resize_file(p, 0); }},
      {"payload byte flipped",
       [](const fs::path& p) {
         std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(static_cast<std::streamoff>(fs::file_size(p) - 7));
         char c = 0;
         f.read(&c, 1);
         c = static_cast<char>(c ^ 0x5a);
         f.seekp(static_cast<std::streamoff>(fs::file_size(p) - 7));
         f.write(&c, 1);
       }},
      {"other format version",
       [](const fs::path& p) {
         std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(8);
         const uint32_t v = 999;
         f.write(reinterpret_cast<const char*>(&v), 4);
       }},
      {"garbage",
       [](const fs::path& p) {
         std::ofstream f(p, std::ios::binary | std::ios::trunc);
         f << "this is not a kernel";
       }},
  };
  for (const auto& [what, damage] : damages) {
    for (const fs::path& p : entries()) damage(p);
    ChildResult r = run_child(env());
    EXPECT_EQ(r.compiled, 3) << what << "\n" << r.output;
    EXPECT_EQ(r.disk, 0) << what;
    EXPECT_EQ(r.digest, reference.digest) << what;
    ChildResult again = run_child(env());
    EXPECT_EQ(again.compiled, 0) << what << ": the recompiled entries were not stored";
  }
}

// An entry whose header and checksum are right but whose payload is not this kernel's code: it
// passes the file checks, so it is caught when it is linked (not an object file, or an object that
// does not define the kernel's symbol), and the kernel is compiled and the entry replaced.
TEST_F(KernelCache, AWellFormedEntryThatDoesNotLinkIsRecompiledAndReplaced) {
  const ChildResult reference = run_child(env());
  ASSERT_EQ(entries().size(), 3u);
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // The file format of fuser/cache.h: a 48-byte header whose last two fields are the payload's
  // size and XXH3-64 checksum.
  constexpr size_t kHeader = 48;
  auto plant = [&](const fs::path& p, const std::string& payload) {
    std::string data = read(p).substr(0, kHeader - 16);
    const uint64_t size = payload.size();
    const uint64_t sum = XXH3_64bits(payload.data(), payload.size());
    data.append(reinterpret_cast<const char*>(&size), 8);
    data.append(reinterpret_cast<const char*>(&sum), 8);
    data += payload;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << data;
    return data;
  };
  const std::vector<fs::path> paths = entries();
  std::vector<std::string> objects;
  for (const fs::path& p : paths) objects.push_back(read(p).substr(kHeader));
  const std::vector<std::pair<std::string, std::function<std::string(size_t)>>> payloads = {
      {"not an object file",
       [](size_t) { return std::string("well-formed entry, but not an object file"); }},
      {"an ELF header and nothing else", [&](size_t i) { return objects[i].substr(0, 64); }},
      // Another kernel's object: links, but defines the other kernel's symbol only.
      {"another kernel's object", [&](size_t i) { return objects[(i + 1) % objects.size()]; }},
  };
  for (const auto& [what, payload] : payloads) {
    std::vector<std::string> planted;
    for (size_t i = 0; i < paths.size(); ++i) planted.push_back(plant(paths[i], payload(i)));
    ChildResult r = run_child(env());
    EXPECT_EQ(r.compiled, 3) << what << "\n" << r.output;
    EXPECT_EQ(r.disk, 0) << what << "\n" << r.output;
    EXPECT_EQ(r.digest, reference.digest) << what;
    for (size_t i = 0; i < paths.size(); ++i) {
      ASSERT_TRUE(fs::exists(paths[i])) << what;
      EXPECT_NE(read(paths[i]), planted[i]) << what << ": the bad entry was not replaced";
      EXPECT_EQ(read(paths[i]).substr(kHeader), objects[i]) << what;
    }
    ChildResult again = run_child(env());
    EXPECT_EQ(again.compiled, 0) << what << ": the recompiled entries were not stored";
    EXPECT_EQ(again.disk, 3) << what;
  }
}

// Things in an entry's place that are not kernel files: read without hanging (a FIFO), without
// reading forever (a link to /dev/zero) and without throwing (a directory); each is recompiled, a
// link or a file replaced by a good entry, a directory left alone.
TEST_F(KernelCache, OddEntriesNeitherHangNorThrowAndAreRecompiled) {
  const ChildResult reference = run_child(env());
  ASSERT_EQ(entries().size(), 3u);
  auto header_longer_than_file = [](const fs::path& p) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t size = fs::file_size(p) + 100;  // the payload size field
    f.seekp(32);
    f.write(reinterpret_cast<const char*>(&size), 8);
  };
  const std::vector<std::tuple<std::string, std::function<void(const fs::path&)>, bool>> odd = {
      {"a directory", [](const fs::path& p) { fs::remove(p), fs::create_directory(p); }, false},
      {"a FIFO", [](const fs::path& p) { fs::remove(p), mkfifo(p.c_str(), 0644); }, true},
      {"a link to /dev/zero",
       [](const fs::path& p) { fs::remove(p), fs::create_symlink("/dev/zero", p); }, true},
      {"a header longer than the file", header_longer_than_file, true},
  };
  for (const auto& [what, make, replaced] : odd) {
    fs::remove_all(dir_);
    run_child(env());
    const std::vector<fs::path> paths = entries();
    ASSERT_EQ(paths.size(), 3u) << what;
    for (const fs::path& p : paths) make(p);
    ChildResult r = run_child(env());
    EXPECT_EQ(r.compiled, 3) << what << "\n" << r.output;
    EXPECT_EQ(r.disk, 0) << what;
    EXPECT_EQ(r.digest, reference.digest) << what;
    for (const fs::path& p : paths)
      EXPECT_EQ(fs::is_regular_file(fs::symlink_status(p)), replaced) << what << ": " << p;
    ChildResult again = run_child(env());
    EXPECT_EQ(again.compiled, replaced ? 0 : 3) << what << "\n" << again.output;
    EXPECT_EQ(again.digest, reference.digest) << what;
  }
}

TEST_F(KernelCache, ADirectoryThatIsAFileOrALinkLoopKeepsKernelsInMemoryWithOneWarning) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  fs::create_symlink(dir_ / "loop", dir_ / "loop");
  for (const std::string bad : {"file", "loop", "loop/cache"}) {
    ChildResult r = run_child("KILN_CACHE_DIR='" + (dir_ / bad).string() + "'");
    EXPECT_EQ(r.compiled, 3) << bad << "\n" << r.output;
    size_t warnings = 0;
    for (size_t at = 0;
         (at = r.output.find("kernel cache directory is unusable", at)) != std::string::npos; ++at)
      ++warnings;
    EXPECT_EQ(warnings, 1u) << bad << "\n" << r.output;
  }
}

TEST_F(KernelCache, TwoProcessesWritingTheSameKernelsAtOnceLeaveGoodEntries) {
  const ChildResult reference = run_child(env());
  fs::remove_all(dir_);
  std::vector<ChildResult> racers(2);
  std::vector<std::thread> threads;
  for (ChildResult& r : racers) threads.emplace_back([&] { r = run_child(env()); });
  for (std::thread& t : threads) t.join();
  for (const ChildResult& r : racers) EXPECT_EQ(r.digest, reference.digest) << r.output;
  ChildResult after = run_child(env());
  EXPECT_EQ(after.disk, 3) << after.output;
  EXPECT_EQ(after.digest, reference.digest);
}

// Stores and loads of one key, from two threads and then two processes at once: every load
// sees nothing or the whole payload that was stored, never a mixture or a partial file.
TEST(DiskCacheRaces, ConcurrentWritersOfOneKeyNeverExposeAPartialEntry) {
  fuser::DiskCache& cache = fuser::DiskCache::instance();
  if (!cache.enabled()) GTEST_SKIP() << "no disk cache in this environment";
  const std::string key = "race test key " + std::to_string(getpid());
  const std::string payload(20000, 'k');
  auto hammer = [&](int rounds) {
    int bad = 0;
    for (int i = 0; i < rounds; ++i) {
      cache.store(key, fuser::kCpuObject, payload);
      std::optional<std::string> got = cache.load(key, fuser::kCpuObject);
      bad += got && *got != payload;
    }
    return bad;
  };
  int bad_threads[2] = {0, 0};
  std::thread a([&] { bad_threads[0] = hammer(200); }), b([&] { bad_threads[1] = hammer(200); });
  a.join();
  b.join();
  EXPECT_EQ(bad_threads[0] + bad_threads[1], 0);
  pid_t children[2];
  for (pid_t& c : children)
    if ((c = fork()) == 0) _exit(hammer(200) == 0 ? 0 : 1);
  for (pid_t c : children) {
    int status = 0;
    ASSERT_EQ(waitpid(c, &status, 0), c);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a process read a bad entry";
  }
  EXPECT_EQ(cache.load(key, fuser::kCpuObject), payload);
  EXPECT_EQ(fuser::disk_cache_stats().rejected, 0) << "a concurrent write was seen half-done";
}

TEST_F(KernelCache, TheMemoryCacheCapacityComesFromTheEnvironment) {
  const ChildResult reference = run_child(env());
  EXPECT_EQ(reference.evicted, 0) << reference.output;
  // Three kernels through a memory cache of one: two evictions; the plan holds all three.
  ChildResult r = run_child("KILN_CACHE=0 KILN_KERNEL_CACHE_MAX=1 " + env());
  EXPECT_EQ(r.compiled, 3) << r.output;
  EXPECT_EQ(r.evicted, 2) << r.output;
  EXPECT_EQ(r.digest, reference.digest);
}

TEST_F(KernelCache, AnUnwritableDirectoryKeepsKernelsInMemoryWithOneWarning) {
  // A directory below a regular file can't be created.
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  const std::string bad = (dir_ / "file" / "cache").string();
  ChildResult r = run_child("KILN_CACHE_DIR='" + bad + "'");
  EXPECT_EQ(r.compiled, 3) << r.output;
  size_t warnings = 0;
  for (size_t at = 0;
       (at = r.output.find("kernel cache directory is unusable", at)) != std::string::npos; ++at)
    ++warnings;
  EXPECT_EQ(warnings, 1u) << r.output;
  ChildResult reference = run_child(env());
  EXPECT_EQ(r.digest, reference.digest);
}

TEST_F(KernelCache, DisabledWritesNothing) {
  ChildResult r = run_child("KILN_CACHE=0 " + env());
  EXPECT_EQ(r.compiled, 3) << r.output;
  EXPECT_TRUE(entries().empty());
}

TEST_F(KernelCache, TheDirectoryStaysUnderItsCapDroppingTheLeastRecentlyUsed) {
  run_child(env());
  ASSERT_EQ(entries().size(), 3u);
  std::vector<uintmax_t> sizes;
  for (const fs::path& p : entries()) sizes.push_back(fs::file_size(p));
  std::sort(sizes.begin(), sizes.end());
  // Room for any two entries but not for all three (entries differ in size: the kernels' code
  // does): a third must push out the least recently used.
  fs::remove_all(dir_);
  const uintmax_t cap = sizes[2] + sizes[1] + sizes[0] / 2;
  run_child("KILN_CACHE_MAXSIZE=" + std::to_string(cap) + " " + env());
  uintmax_t total = 0;
  for (const fs::path& p : entries()) total += fs::file_size(p);
  EXPECT_LE(total, cap);
  EXPECT_EQ(entries().size(), 2u);
}

}  // namespace
}  // namespace kiln
