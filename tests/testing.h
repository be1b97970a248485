// Shared test helpers: seeded random shapes and tensors, non-contiguous layouts of the same values,
// and comparison of a kiln result against a float64 reference computed by a plain loop.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

// A generator seeded per test from the test's name, so failures reproduce.
std::mt19937_64& rng();

// A uniform integer in [lo, hi] from rng().
inline int64_t pick(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

// A random shape of rank in [min_rank, max_rank], each size in [0 or 1, max_size].
Shape random_shape(int min_rank = 0, int max_rank = 4, int64_t max_size = 5,
                   bool allow_zero = true);

// A tensor of `shape` with values uniform in [lo, hi) (integers for integral dtypes, 0/1 for bool),
// made from std::mt19937_64 (independent of kiln's own generator).
Tensor random_tensor(const Shape& shape, DType dtype = kFloat32, double lo = -3.0, double hi = 3.0);

// The same values as `t` in several memory layouts: "contiguous", "transposed" (a permuted view of
// a permuted copy), "strided" (every other element of a larger tensor), and "expanded" when `t` has
// size-1 dims to broadcast. Every variant equals `t` elementwise.
std::vector<std::pair<std::string, Tensor>> layouts(const Tensor& t);

// Values of t in row-major order, as doubles.
std::vector<double> values(const Tensor& t);

// numpy broadcasting of two compatible shapes, computed independently of kiln's own rule.
Shape broadcast_shape(const Shape& a, const Shape& b);

// Row-major multi-index of a flat position, and the flat position of a multi-index.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape);
int64_t ravel(const std::vector<int64_t>& index, const Shape& shape);
// Reads element `index` of t, where t is broadcast to `shape` (numpy rules).
double broadcast_at(const Tensor& t, const std::vector<double>& t_values,
                    const std::vector<int64_t>& index, const Shape& shape);

// Asserts that `actual` has `shape` and dtype `dtype` and matches `expected` (row-major) within
// atol + rtol * |expected|, NaNs matching NaNs. Prints the first mismatches.
void expect_close(const Tensor& actual, const std::vector<double>& expected, const Shape& shape,
                  DType dtype, double rtol = 1e-5, double atol = 1e-6);

// Asserts that f() throws kiln::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts);

}  // namespace kiln::testing

// Lazy mode versus eager mode (tests of the ops' lazy recording).
namespace kiln::testing {

// The bytes of t's values in row-major order (materializing it, and only it).
std::vector<unsigned char> bytes(const Tensor& t);
// Same sizes, dtype and bytes, except that a NaN matches any NaN: the sign and payload of a NaN
// depend on the instruction that made it (x86's sqrt of a negative number, or libm's), which a
// fused kernel may choose differently.
void expect_bit_equal(const Tensor& lazy, const Tensor& eager, const std::string& what);
// Whether a lazy result matches eager mode's: elementwise kernels match bit for bit, but a fused
// kernel folds reductions (sums, softmax rows, variances) in another order than the reference
// kernels (both in double for float data) and its exp may differ by an ulp from libm's, so
// floating values match within |lazy - eager| <= rtol * |eager| + atol: 1e-5 and 1e-6 for
// float32, 1e-12 and 1e-12 for float64. NaN matches NaN; infinities and integers are exact.
bool lazy_close(double lazy, double eager, DType dtype);
// Same sizes and dtype and lazy_close values.
void expect_lazy_equal(const Tensor& lazy, const Tensor& eager, const std::string& what);
// A traced function's outputs against eager mode's: each traced and reloaded output (and each lazy
// one, when `lazy` is not empty) lazy-equal to eager's. Returns sum_k (k + 1) * sum(output k) of
// the traced and of the eager outputs, whose gradients the caller compares.
std::pair<Tensor, Tensor> expect_replay_matches(const std::vector<Tensor>& traced,
                                                const std::vector<Tensor>& reloaded,
                                                const std::vector<Tensor>& lazy,
                                                const std::vector<Tensor>& eager);
// Runs f eagerly and lazily: in lazy mode every output must come back pending and be computed by
// the executor (unless expect_pending is false: then either may happen), and the values must
// match eager mode's (expect_lazy_equal).
void check_lazy(const std::string& what, const std::function<std::vector<Tensor>()>& f,
                bool expect_pending = true);
// Concrete inputs (made eagerly), so that both runs read the same tensors.
Tensor input(const Shape& shape, DType dtype = kFloat32, double lo = -3.0, double hi = 3.0);
std::vector<std::pair<std::string, Tensor>> input_layouts(const Tensor& t);

// For binaries whose checks of pendingness assume nothing flushes the trace: a KILN_MAX_PENDING
// from the environment is lifted for the run.
class NoFlushEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;

 private:
  int64_t saved_ = 0;
};

// This test binary run again as a child process with `env` ("NAME=value ..." or "") before it and
// `args` (gtest's) after it: its exit status (as pclose gives it) and its output, stdout and
// stderr together. A child that hangs is killed after 60 s (a failed status), and gtest's sharding
// variables are unset, so that a sharded parent's child still runs the test it names.
struct ChildRun {
  int status = -1;
  std::string output;
};
ChildRun run_this_binary(const std::string& env, const std::string& args);

}  // namespace kiln::testing
