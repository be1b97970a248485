// Sizes that overflow 64 bits are errors naming the op and the shape (never a wrapped, smaller
// tensor), and integer values wrap in two's complement, the same in eager and fused kernels.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/jit.h"
#include "lib/allocator.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_error;

constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
constexpr int64_t kMin32 = std::numeric_limits<int32_t>::min();
constexpr int64_t kBig = int64_t{1} << 40;

// ------------------------------------------------------------------------------------- sizes

TEST(Overflow, FactoriesRejectShapesWhoseElementCountOverflows) {
  // 2^80 elements once wrapped to 0 (an empty tensor), INT64_MAX * 2 to -2.
  expect_error([] { zeros({kBig, kBig}); }, {"zeros", "[1099511627776, 1099511627776]", "large"});
  expect_error([] { zeros({kMax64, 2}); }, {"zeros", "[9223372036854775807, 2]", "large"});
  expect_error([] { ones({kMax64, 2}, kInt64); }, {"ones", "[9223372036854775807, 2]"});
  expect_error([] { empty({kBig, kBig}); }, {"empty", "[1099511627776, 1099511627776]"});
  expect_error([] { full({kBig, 1, kBig}, 7); }, {"full", "[1099511627776, 1, 1099511627776]"});
  expect_error([] { rand({kBig, kBig}); }, {"rand", "[1099511627776, 1099511627776]"});
  expect_error([] { randn({kBig, kBig}); }, {"randn", "[1099511627776, 1099511627776]"});
  expect_error([] { randint(0, 5, {kBig, kBig}); }, {"randint", "[1099511627776, 1099511627776]"});
  expect_error([] { eye(kBig, kBig); }, {"eye", "[1099511627776, 1099511627776]"});
  // Empty dims count as 1 for the strides: [2^40, 2^40, 0] has no elements but its first
  // stride would be 2^80.
  expect_error([] { zeros({kBig, kBig, 0}); }, {"zeros", "[1099511627776, 1099511627776, 0]"});
  // Negative sizes still say so.
  expect_error([] { zeros({2, -1}); }, {"zeros", "negative dimension", "[2, -1]"});
}

TEST(Overflow, FactoriesRejectByteCountsPastOneAllocation) {
  // The element count fits, its bytes do not: 2^62 float64 values are 2^65 bytes.
  const int64_t n = int64_t{1} << 62;
  expect_error([&] { zeros({n}, kFloat64); },
               {"zeros", "[4611686018427387904]", "float64", "bytes"});
  expect_error([&] { empty({n / 2, 2}, kInt32); }, {"empty", "[2305843009213693952, 2]", "bytes"});
  expect_error([&] { linspace(0, 1, n, kFloat64); },
               {"linspace", "[4611686018427387904]", "bytes"});
  Tensor data = zeros({4});
  expect_error([&] { from_blob(data.data_ptr<float>(), Shape{n}, Shape{4}); },
               {"from_blob", "[4611686018427387904]", "bytes"});
  // Elements that fit, reached through strides that do not.
  expect_error([&] { from_blob(data.data_ptr<float>(), Shape{3}, Shape{n}); },
               {"from_blob", "[3]", "[4611686018427387904]", "64-bit"});
}

TEST(Overflow, AnAllocationTooLargeForMemoryIsAnOutOfMemoryError) {
  // 2^60 bytes: a valid size that no machine can map. The failed request counts nothing.
  const size_t before = detail::cpu_allocated_bytes();
  expect_error([] { zeros({int64_t{1} << 58}); }, {"out of memory", "1152921504606846976 bytes"});
  EXPECT_EQ(detail::cpu_allocated_bytes(), before);
  expect_error([] { detail::cpu_alloc(~size_t{0}); }, {"out of memory", "18446744073709551615"});
  EXPECT_EQ(detail::cpu_allocated_bytes(), before);
}

TEST(Overflow, ArangeLengthsAreExactOrRejected) {
  expect_error([] { arange(0, 1e19); }, {"arange", "too long", "1e+19"});
  expect_error([] { arange(-1e300, 1e300, 1.0); }, {"arange", "too long"});
  expect_error([] { arange(kMin64, kMax64); }, {"arange", "too long"});
  // end - start does not fit in int64 here, the length (4) and every value do.
  Tensor t = arange(kMin64, kMax64, int64_t{1} << 62);
  EXPECT_EQ(t.to_vector<int64_t>(),
            (std::vector<int64_t>{kMin64, -(int64_t{1} << 62), 0, int64_t{1} << 62}));
  Tensor top = arange(kMax64 - 2, kMax64);
  EXPECT_EQ(top.to_vector<int64_t>(), (std::vector<int64_t>{kMax64 - 2, kMax64 - 1}));
  Tensor down = arange(kMax64, kMax64 - 3, -1);
  EXPECT_EQ(down.to_vector<int64_t>(), (std::vector<int64_t>{kMax64, kMax64 - 1, kMax64 - 2}));
}

TEST(Overflow, ViewsRejectShapesWhoseSizeOverflows) {
  Tensor one = ones({1, 1});
  expect_error([&] { one.expand({kBig, kBig}); }, {"expand", "[1099511627776, 1099511627776]"});
  expect_error([&] { one.expand({kMax64, 2}); }, {"expand", "[9223372036854775807, 2]"});
  Tensor none = zeros({0});
  expect_error(
      [&] {
        none.view({-1, kBig, kBig});
      },
      {"view", "[-1, 1099511627776, 1099511627776]"});
  expect_error(
      [&] {
        none.reshape({0, kBig, kBig});
      },
      {"reshape", "[0, 1099511627776, 1099511627776]", "large"});
  // Two shapes that are valid on their own broadcast to 2^80 elements.
  Tensor tall = ones({1}).expand({kBig, 1}), wide = ones({1}).expand({1, kBig});
  expect_error([&] { add(tall, wide); }, {"add", "[1099511627776, 1099511627776]", "large"});
  expect_error([&] { mul(tall, wide); }, {"mul", "[1099511627776, 1099511627776]"});
  // A cat whose joined size passes int64.
  Tensor huge = ones({1}).expand({kMax64});
  expect_error([&] { cat({huge, huge}); }, {"cat", "dimension 0", "large"});
  // narrow's start + length, split's sum of sizes.
  Tensor four = arange(4);
  expect_error([&] { four.narrow(0, 1, kMax64); }, {"narrow", "9223372036854775807"});
  expect_error(
      [&] {
        four.split(std::vector<int64_t>{kMax64, kMax64, 2});
      },
      {"split", "split sizes", "large"});
}

TEST(Overflow, ResultsWhoseBytesOverflowAreRejected) {
  // 2^62 float64 elements: the count fits, the bytes (2^65) do not.
  Tensor many = ones({1}, kFloat64).expand({int64_t{1} << 62});
  {
    LazyGuard on(true);  // the pending result's storage size
    expect_error([&] { add(many, 1.0); }, {"add", "[4611686018427387904]", "float64", "bytes"});
  }
  LazyGuard off(false);
  expect_error([&] { add(many, 1.0); }, {"[4611686018427387904]", "float64", "bytes"});
  expect_error([&] { many.contiguous(); }, {"[4611686018427387904]", "bytes"});
}

TEST(Overflow, AsStridedChecksItsExtentAgainstTheStorage) {
  Tensor t = arange(4);
  // The last element (1 * INT64_MAX + 1) once wrapped negative and passed the storage check.
  expect_error([&] { as_strided(t, {2, 2}, {kMax64, 1}, 0); }, {"as_strided", "[2, 2]"});
  expect_error([&] { as_strided(t, {2}, {kMax64}, 1); }, {"as_strided", "[2]"});
  // Stride 0 reaches one element, but 2^80 of them overflow the count.
  expect_error(
      [&] {
        as_strided(t, {kBig, kBig}, {0, 0}, 0);
      },
      {"as_strided", "[1099511627776, 1099511627776]", "large"});
  // In range, it still works.
  EXPECT_EQ(as_strided(t, {2, 2}, {1, 2}, 0).contiguous().to_vector<int64_t>(),
            (std::vector<int64_t>{0, 2, 1, 3}));
}

TEST(Overflow, SliceStepsAndChunkCountsNearTheLimit) {
  Tensor t = arange(4);
  // (e - s + step - 1) / step overflowed; one element is right.
  Tensor s = t.slice(0, 1, 4, kMax64);
  EXPECT_EQ(s.sizes(), (Shape{1}));
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{1}));
  EXPECT_EQ(t.slice(0, 4, 4, kMax64).numel(), 0);
  // The stride of the slice of a strided tensor: 2 * INT64_MAX.
  Tensor every_other = arange(8).slice(0, 0, 8, 2);
  expect_error([&] { every_other.slice(0, 0, 4, kMax64); }, {"slice", "step", "large"});
  std::vector<Tensor> pieces = t.chunk(kMax64);
  ASSERT_EQ(pieces.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(pieces[i].item<int64_t>(), i);
}

// ---------------------------------------------------------------------------- integer values

// The low `bits` bits of x, read as a signed number: what two's-complement arithmetic gives.
int64_t wrap_to(uint64_t x, int bits) {
  if (bits == 64) return static_cast<int64_t>(x);
  return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(x)));
}
uint64_t u(int64_t v) {
  return static_cast<uint64_t>(v);
}

std::vector<int64_t> edge_values(DType dtype) {
  const int64_t lo = dtype == kInt32 ? kMin32 : kMin64, hi = dtype == kInt32 ? kMax32 : kMax64;
  return {lo, lo + 1, hi,    hi - 1,     -1,          0,      1,          2,
          3,  46341,  65536, 3037000500, -3037000500, lo / 2, hi / 2 + 1, 7};
}

// Pairs of every edge value with every other, as two flat tensors of `dtype`.
std::pair<Tensor, Tensor> pairs(DType dtype, std::vector<int64_t>* a, std::vector<int64_t>* b) {
  std::vector<int64_t> v = edge_values(dtype);
  const int bits = dtype == kInt32 ? 32 : 64;
  for (int64_t x : v)
    for (int64_t y : v) {
      a->push_back(wrap_to(u(x), bits));
      b->push_back(wrap_to(u(y), bits));
    }
  const Shape shape{static_cast<int64_t>(a->size())};
  return {from_vector(*a, shape).to(dtype), from_vector(*b, shape).to(dtype)};
}

std::vector<int64_t> as_int64(const Tensor& t) {
  return t.to(kInt64).to_vector<int64_t>();
}

// Runs f(a, b) eagerly and lazily (fused), and compares both with `expected`.
void expect_wraps(const std::string& what, DType dtype, const Tensor& a, const Tensor& b,
                  const std::function<Tensor(const Tensor&, const Tensor&)>& f,
                  const std::vector<int64_t>& expected) {
  SCOPED_TRACE(what + " on " + dtype_name(dtype));
  Tensor eager;
  {
    LazyGuard off(false);
    eager = f(a, b);
  }
  EXPECT_EQ(eager.dtype(), dtype);
  EXPECT_EQ(as_int64(eager), expected) << "eager";
  const int64_t fused_before = jit::stats().fused_kernels_run;
  Tensor lazy;
  {
    LazyGuard on(true);
    // The result times 1 and plus 0, so that the op is one of several fused into a kernel.
    lazy = f(a, b) * 1 + 0;
    testing::expect_bit_equal(lazy, eager, what);
  }
  EXPECT_GT(jit::stats().fused_kernels_run, fused_before) << "no fused kernel ran";
}

TEST(Overflow, IntegerAddSubMulWrapAsTwosComplement) {
  for (DType dtype : {kInt32, kInt64}) {
    const int bits = dtype == kInt32 ? 32 : 64;
    std::vector<int64_t> va, vb;
    auto [a, b] = pairs(dtype, &va, &vb);
    std::vector<int64_t> sum, diff, product, axpy, neg_axpy;
    for (size_t i = 0; i < va.size(); ++i) {
      sum.push_back(wrap_to(u(va[i]) + u(vb[i]), bits));
      diff.push_back(wrap_to(u(va[i]) - u(vb[i]), bits));
      product.push_back(wrap_to(u(va[i]) * u(vb[i]), bits));
      axpy.push_back(wrap_to(u(va[i]) + u(3) * u(vb[i]), bits));
      neg_axpy.push_back(wrap_to(u(va[i]) - u(kMin64) * u(vb[i]), bits));
    }
    expect_wraps(
        "add", dtype, a, b, [](const Tensor& x, const Tensor& y) { return x + y; }, sum);
    expect_wraps(
        "sub", dtype, a, b, [](const Tensor& x, const Tensor& y) { return x - y; }, diff);
    expect_wraps(
        "mul", dtype, a, b, [](const Tensor& x, const Tensor& y) { return x * y; }, product);
    expect_wraps(
        "add alpha 3", dtype, a, b, [](const Tensor& x, const Tensor& y) { return add(x, y, 3); },
        axpy);
    // -alpha of the lowest int64 is itself.
    expect_wraps(
        "sub alpha INT64_MIN", dtype, a, b,
        [](const Tensor& x, const Tensor& y) { return sub(x, y, kMin64); }, neg_axpy);
  }
}

TEST(Overflow, IntegerNegAbsAndPowWrap) {
  for (DType dtype : {kInt32, kInt64}) {
    const int bits = dtype == kInt32 ? 32 : 64;
    std::vector<int64_t> v = edge_values(dtype);
    for (int64_t& x : v) x = wrap_to(u(x), bits);
    const Shape shape{static_cast<int64_t>(v.size())};
    Tensor a = from_vector(v, shape).to(dtype);
    std::vector<int64_t> negated, absolute;
    for (int64_t x : v) {
      negated.push_back(wrap_to(0 - u(x), bits));
      absolute.push_back(x < 0 ? wrap_to(0 - u(x), bits) : x);  // abs(INT_MIN) is INT_MIN
    }
    expect_wraps(
        "neg", dtype, a, a, [](const Tensor& x, const Tensor&) { return neg(x); }, negated);
    expect_wraps(
        "abs", dtype, a, a, [](const Tensor& x, const Tensor&) { return abs(x); }, absolute);
    // Every base to exponents 0..66 by repeated multiplication in uint64.
    std::vector<int64_t> bases, exps, powers;
    for (int64_t x : v)
      for (int64_t e = 0; e <= 66; ++e) {
        uint64_t r = 1;
        for (int64_t k = 0; k < e; ++k) r *= u(x);
        bases.push_back(x);
        exps.push_back(e);
        powers.push_back(wrap_to(r, bits));
      }
    const Shape n{static_cast<int64_t>(bases.size())};
    expect_wraps(
        "pow", dtype, from_vector(bases, n).to(dtype), from_vector(exps, n).to(dtype),
        [](const Tensor& x, const Tensor& y) { return pow(x, y); }, powers);
  }
}

TEST(Overflow, IntegerSumsAndProductsWrap) {
  Tensor a = from_vector(std::vector<int64_t>{kMax64, 1, kMax64, 2});
  EXPECT_EQ(a.sum().item<int64_t>(), wrap_to(u(kMax64) + 1 + u(kMax64) + 2, 64));
  EXPECT_EQ(a.prod().item<int64_t>(), wrap_to(u(kMax64) * u(kMax64) * 2, 64));
  Tensor b = from_vector(std::vector<int64_t>{65536, 65536, 3}).to(kInt32);
  EXPECT_EQ(b.prod().item<int64_t>(), wrap_to(u(65536) * u(65536) * u(3), 64));
}

// x86's truncating conversion: toward zero, the lowest integer for NaN and out-of-range values.
int64_t truncated(double x, int bits) {
  const double limit = std::ldexp(1.0, bits - 1);
  if (!(std::fabs(x) < limit)) return bits == 32 ? kMin32 : kMin64;
  return static_cast<int64_t>(std::trunc(x));
}

TEST(Overflow, FloatToIntegerCastsGiveTheLowestIntegerOutOfRange) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v{nan,
                        inf,
                        -inf,
                        1e20,
                        -1e20,
                        3.7,
                        -3.7,
                        2147483647.0,
                        2147483648.0,
                        -2147483648.0,
                        -2147483649.0,
                        9.2233720368547758e18,
                        -9.2233720368547758e18,
                        4.5e15,
                        -0.5};
  const Shape shape{static_cast<int64_t>(v.size())};
  for (DType from : {kFloat64, kFloat32}) {
    Tensor x = from_vector(v, shape).to(from);
    const std::vector<double> xs = x.to_vector<double>();  // as rounded to float32
    for (DType to : {kInt32, kInt64}) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " to " + dtype_name(to));
      std::vector<int64_t> expected;
      for (double e : xs) expected.push_back(truncated(e, to == kInt32 ? 32 : 64));
      Tensor eager;
      {
        LazyGuard off(false);
        eager = x.to(to);
      }
      EXPECT_EQ(as_int64(eager), expected);
      LazyGuard on(true);
      testing::expect_bit_equal((x * 1).to(to) + 0, eager, "cast");
    }
  }
  // Scalars convert the same way.
  EXPECT_EQ(Scalar(1e20).to_int(), kMin64);
  EXPECT_EQ(Scalar(nan).to<int32_t>(), kMin32);
  EXPECT_EQ(Scalar(-3.7).to<int32_t>(), -3);
  EXPECT_EQ(full({2}, 1e20, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{kMin32, kMin32}));
  EXPECT_EQ(arange(0.5, 2.5, 1.0, kInt64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
}

}  // namespace
}  // namespace kiln
