// The KILN_* flags (lib/env.h): each kind's bad values raise or warn naming what is accepted; the
// flags read at load time are checked in a child process; OpenMP's wait policy is set in time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kiln/kiln.h"
#include "lib/env.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::env_bool;
using detail::env_int;
using detail::env_list;
using detail::env_string;
using detail::OnBad;

// Sets a variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Env, BoolAcceptsTheUsualSpellingsAndRejectsOthers) {
  for (const char* on : {"1", "true", "ON", "yes"}) {
    ScopedEnv e("KILN_FUSE", on);
    EXPECT_TRUE(env_bool("KILN_FUSE")) << on;
  }
  for (const char* off : {"0", "false", "Off", "no"}) {
    ScopedEnv e("KILN_FUSE", off);
    EXPECT_FALSE(env_bool("KILN_FUSE")) << off;
  }
  {
    ScopedEnv e("KILN_FUSE", "");
    EXPECT_TRUE(env_bool("KILN_FUSE")) << "empty is the default";
  }
  ScopedEnv e("KILN_FUSE", "maybe");
  testing::expect_error([] { env_bool("KILN_FUSE"); },
                        {"KILN_FUSE='maybe'", "not a boolean", "0, 1, false, true"});
}

TEST(Env, CountsRejectTextNegativesAndValuesBelowTheirMinimum) {
  {
    ScopedEnv e("KILN_KERNEL_CACHE_MAX", "12");
    EXPECT_EQ(env_int("KILN_KERNEL_CACHE_MAX"), 12);
  }
  EXPECT_EQ(env_int("KILN_KERNEL_CACHE_MAX"), 4096) << "unset is the default";
  for (const char* bad : {"abc", "-5", "12x", "1.5", "99999999999999999999"}) {
    ScopedEnv e("KILN_KERNEL_CACHE_MAX", bad);
    testing::expect_error([] { env_int("KILN_KERNEL_CACHE_MAX"); },
                          {"KILN_KERNEL_CACHE_MAX='" + std::string(bad) + "'", "an integer >= 0"});
  }
  ScopedEnv e("KILN_MAX_PENDING", "0");
  testing::expect_error([] { env_int("KILN_MAX_PENDING"); },
                        {"KILN_MAX_PENDING='0'", "too small", "an integer >= 1"});
}

TEST(Env, SizesTakeUnitSuffixesAndRejectTextAndNegatives) {
  const std::pair<const char*, int64_t> good[] = {{"1000", 1000},
                                                  {"4K", 4096},
                                                  {"512M", int64_t{512} << 20},
                                                  {"2GiB", int64_t{2} << 30},
                                                  {"1tb", int64_t{1} << 40},
                                                  {"0", 0}};
  for (const auto& [text, bytes] : good) {
    ScopedEnv e("KILN_CACHE_MAXSIZE", text);
    EXPECT_EQ(env_int("KILN_CACHE_MAXSIZE"), bytes) << text;
  }
  EXPECT_EQ(env_int("KILN_CACHE_MAXSIZE"), int64_t{1} << 30) << "unset is the default";
  // abc once became 0 (every entry evicted) and -5 unlimited.
  for (const char* bad : {"abc", "-5", "5Q", "5MX", "M", "9999999999T"}) {
    ScopedEnv e("KILN_CACHE_MAXSIZE", bad);
    testing::expect_error([] { env_int("KILN_CACHE_MAXSIZE"); },
                          {"KILN_CACHE_MAXSIZE='" + std::string(bad) + "'", "512M"});
  }
}

TEST(Env, ProfileIsABooleanOrAJsonFileName) {
  const std::pair<const char*, const char*> good[] = {
      {"0", ""},     {"false", ""}, {"1", "1"},
      {"true", "1"}, {"on", "1"},   {"out/trace.json", "out/trace.json"}};
  for (const auto& [text, value] : good) {
    ScopedEnv e("KILN_PROFILE", text);
    EXPECT_EQ(env_string("KILN_PROFILE"), value) << text;
  }
  for (const char* bad : {"trace.txt", "yes please", ".json"}) {
    ScopedEnv e("KILN_PROFILE", bad);
    testing::expect_error([] { env_string("KILN_PROFILE"); },
                          {"KILN_PROFILE='" + std::string(bad) + "'", "ending in .json"});
  }
}

TEST(Env, ListsRejectUnknownNamesListingTheKnownOnes) {
  {
    ScopedEnv e("KILN_LOG", "fuser, cache");
    EXPECT_EQ(env_list("KILN_LOG"), (std::vector<std::string>{"fuser", "cache"}));
  }
  {
    ScopedEnv e("KILN_LOG", "fuser,cahce");
    testing::expect_error(
        [] { env_list("KILN_LOG"); },
        {"KILN_LOG", "'cahce'", "fuser,codegen,ir,ir-raw,cuda,cache,guard,passes,lazy,conv,all"});
  }
  // A list whose names the caller supplies (passes live above lib/).
  ScopedEnv e("KILN_DISABLE_PASSES", "cse,nope");
  testing::expect_error(
      [] {
        env_list("KILN_DISABLE_PASSES", OnBad::Throw, {"cse", "dce", "all"});
      },
      {"KILN_DISABLE_PASSES", "'nope'", "cse, dce, all"});
}

TEST(Env, FlagsReadAtLoadTimeWarnOnceAndUseTheDefault) {
  ScopedEnv e("KILN_MAX_PENDING", "lots");
  // Capture first: the JIT's early-start thread may read a flag right after the reset.
  ::testing::internal::CaptureStderr();
  detail::reset_env_warnings_for_testing();
  EXPECT_EQ(env_int("KILN_MAX_PENDING", OnBad::Warn), 10000);
  EXPECT_EQ(env_int("KILN_MAX_PENDING", OnBad::Warn), 10000);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("KILN_MAX_PENDING='lots'"), std::string::npos) << err;
  EXPECT_NE(err.find("using the default"), std::string::npos) << err;
  EXPECT_EQ(err.find("KILN_MAX_PENDING"), err.rfind("KILN_MAX_PENDING")) << "warned twice:\n"
                                                                         << err;
}

TEST(Env, AMisspelledVariableIsReportedWithTheLikelyFlag) {
  ScopedEnv e("KILN_LAZZY", "0");
  // Capture first: the JIT's early-start thread may read a flag right after the reset.
  ::testing::internal::CaptureStderr();
  detail::reset_env_warnings_for_testing();
  env_bool("KILN_FUSE");
  env_bool("KILN_FUSE");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("unknown environment variable KILN_LAZZY"), std::string::npos) << err;
  EXPECT_NE(err.find("did you mean KILN_LAZY?"), std::string::npos) << err;
  EXPECT_EQ(err.find("KILN_LAZZY"), err.rfind("KILN_LAZZY")) << "warned twice:\n" << err;
}

// The child: one fused kernel; prints its outcome. Run by the tests below with flags set.
TEST(EnvChild, RunsAFusedKernel) {
  if (!std::getenv("KILN_ENV_TEST_CHILD")) GTEST_SKIP() << "runs as the child of EnvInProcess";
  try {
    Tensor x = arange(0, 8, 1, kFloat32);
    std::printf("CHILD ok %g\n", (sigmoid(x) * 2.0 + 1.0).sum().item<double>());
  } catch (const Error& e) {
    std::printf("CHILD error %s\n", e.what());
  }
}

// Runs the child in `dir` with `env`; returns its stdout and stderr.
std::string run_child(const std::string& env, const std::string& dir) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  const std::string cmd = "cd '" + dir + "' && env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " +
                          "KILN_ENV_TEST_CHILD=1 KILN_LAZY=1 KILN_FUSE=1 " + env + " '" + exe +
                          "' --gtest_filter=EnvChild.RunsAFusedKernel 2>&1";
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[1024];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) out += buf;
  if (pipe) pclose(pipe);
  return out;
}

class EnvInProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::path(::testing::TempDir()) / ("kiln-env-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string run(const std::string& env) { return run_child(env, dir_.string()); }
  std::filesystem::path dir_;
};

TEST_F(EnvInProcess, ProfileTrueProfilesInsteadOfWritingAFileNamedTrue) {
  const std::string out = run("KILN_PROFILE=true");
  EXPECT_NE(out.find("CHILD ok"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "true")) << out;
  const std::string bad = run("KILN_PROFILE=trace.txt");
  EXPECT_NE(bad.find("KILN_PROFILE='trace.txt'"), std::string::npos) << bad;
  EXPECT_NE(bad.find("CHILD ok"), std::string::npos) << bad;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "trace.txt")) << bad;
}

TEST_F(EnvInProcess, BadFlagsReadOnFirstUseRaiseAtTheOpThatReadsThem) {
  for (const char* env : {"KILN_CACHE_MAXSIZE=abc", "KILN_LOG=fuser,bogus", "KILN_FUSE=nah",
                          "KILN_DISABLE_PASSES=cse,bogus"}) {
    const std::string out = run(std::string(env) + " KILN_CACHE_DIR='" + dir_.string() + "/cache'");
    const std::string name(env, std::string(env).find('='));
    EXPECT_NE(out.find("CHILD error"), std::string::npos) << env << "\n" << out;
    EXPECT_NE(out.find(name), std::string::npos) << env << "\n" << out;
  }
}

TEST_F(EnvInProcess, OpenMpThreadsSpinBrieflyUnlessTheUserChose) {
  const std::string out = run("OMP_DISPLAY_ENV=verbose");
  // The clang sanitizer builds (tools/sanitize) link LLVM's libomp, which has no GOMP_SPINCOUNT.
  if (out.find("KMP_") != std::string::npos || out.find("GOMP_") == std::string::npos)
    GTEST_SKIP() << "the OpenMP runtime is not libgomp: GOMP_SPINCOUNT does not apply";
  EXPECT_NE(out.find("GOMP_SPINCOUNT = '1000'"), std::string::npos) << out;
  const std::string chosen = run("OMP_DISPLAY_ENV=verbose GOMP_SPINCOUNT=300000");
  EXPECT_NE(chosen.find("GOMP_SPINCOUNT = '300000'"), std::string::npos) << chosen;
}

}  // namespace
}  // namespace kiln
