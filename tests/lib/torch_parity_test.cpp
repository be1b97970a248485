// Ops and autograd against libtorch's semantics on edge cases (0-dim reductions, size-0 matrix
// products, what backward saves, NaN clamp bounds, empty chunks, in-place writes of tensors that
// require grad, writes into integral tensors, signed zeros in max/min, empty layer_norm and cat,
// NaN operands of minimum/maximum, NaN through zero gradients and relu, empty remainders,
// integral clamp bounds and fill values, pow of an integral base, prod of a 0-dim or subnormal
// input, an expanded view of a base written in place), each in eager mode and in lazy mode.
// Expected values are libtorch's (1.13 and 2.x agree on them), except where a test says it pins a
// deliberate difference (docs/torch-differences.md).
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Every case runs with lazy recording off (the reference) and on (the default).
class TorchParity : public ::testing::TestWithParam<bool> {
 protected:
  TorchParity() : mode_(GetParam()) {}
  LazyGuard mode_;
};

INSTANTIATE_TEST_SUITE_P(Modes, TorchParity, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Lazy" : "Eager";
                         });

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor leaf(const std::vector<double>& values, const Shape& shape) {
  return from_vector(values, shape).requires_grad_();
}

// ------------------------------------------------------------------- reductions of a 0-dim tensor

struct ZeroDimCase {
  std::string name;
  std::function<Tensor(const Tensor&, int64_t dim, bool keepdim)> fn;
  double value, grad;  // at x = 2
};

// torch accepts dim 0 and -1 for a 0-dim tensor; the result is 0-dim whatever keepdim says.
// var and std of one element with correction 1 divide by zero: NaN, and so is their gradient
// (torch's var_backward multiplies by 2 / (N - correction) = inf, std's divides by the NaN std).
std::vector<ZeroDimCase> zero_dim_cases() {
  return {
      {"sum", [](const Tensor& x, int64_t d, bool k) { return sum(x, {d}, k); }, 2, 1},
      {"sum_times_2", [](const Tensor& x, int64_t d, bool k) { return sum(x, {d}, k) * 2.f; }, 4,
       2},
      {"mean", [](const Tensor& x, int64_t d, bool k) { return mean(x, {d}, k); }, 2, 1},
      {"prod", [](const Tensor& x, int64_t d, bool k) { return prod(x, {d}, k); }, 2, 1},
      {"amax", [](const Tensor& x, int64_t d, bool k) { return amax(x, {d}, k); }, 2, 1},
      {"amin", [](const Tensor& x, int64_t d, bool k) { return amin(x, {d}, k); }, 2, 1},
      {"max_dim", [](const Tensor& x, int64_t d, bool k) { return std::get<0>(max(x, d, k)); }, 2,
       1},
      {"min_dim", [](const Tensor& x, int64_t d, bool k) { return std::get<0>(min(x, d, k)); }, 2,
       1},
      {"logsumexp", [](const Tensor& x, int64_t d, bool k) { return logsumexp(x, {d}, k); }, 2, 1},
      {"var", [](const Tensor& x, int64_t d, bool k) { return var(x, {d}, 1, k); }, kNaN, kNaN},
      {"std", [](const Tensor& x, int64_t d, bool k) { return kiln::std(x, {d}, 1, k); }, kNaN,
       kNaN},
      {"var_correction_0", [](const Tensor& x, int64_t d, bool k) { return var(x, {d}, 0, k); }, 0,
       0},
      {"std_correction_0",
       [](const Tensor& x, int64_t d, bool k) { return kiln::std(x, {d}, 0, k); }, 0, 0},
  };
}

TEST_P(TorchParity, ReductionOverTheDimOfA0DimTensorAndItsBackward) {
  for (const ZeroDimCase& c : zero_dim_cases()) {
    for (int64_t dim : {0, -1}) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(c.name + " dim " + std::to_string(dim) + (keepdim ? " keepdim" : ""));
        Tensor x = leaf({2.0}, Shape{});
        Tensor y = c.fn(x, dim, keepdim);
        testing::expect_close(y, {c.value}, Shape{}, kFloat64);
        y.sum().backward();
        ASSERT_TRUE(x.grad().defined());
        testing::expect_close(x.grad(), {c.grad}, Shape{}, kFloat64);
      }
    }
  }
}

TEST_P(TorchParity, ArgAndLogicalReductionsOverTheDimOfA0DimTensor) {
  Tensor x = from_vector(std::vector<double>{2.0}, Shape{});
  for (int64_t dim : {0, -1}) {
    testing::expect_close(argmax(x, dim), {0}, Shape{}, kInt64);
    testing::expect_close(argmin(x, dim, true), {0}, Shape{}, kInt64);
    testing::expect_close(all(x, {dim}), {1}, Shape{}, kBool);
    testing::expect_close(any(x, {dim}, true), {1}, Shape{}, kBool);
  }
}

// torch's prod gradient: g for a 0-dim input (even an infinite one), g * (y / x) otherwise, so a
// subnormal product divides back exactly before g scales it.
TEST_P(TorchParity, ProdGradientOfA0DimOrSubnormalInput) {
  Tensor inf = from_vector(std::vector<float>{INFINITY}, Shape{}).requires_grad_();
  (inf.prod(0, false) * 0.625f).backward();
  testing::expect_close(inf.grad(), {0.625}, {}, kFloat32);
  const float tiny = std::numeric_limits<float>::denorm_min();
  Tensor x = from_vector(std::vector<float>{1.0f, tiny}, Shape{2}).requires_grad_();
  (x.prod(0, false) * 0.625f).backward();
  EXPECT_EQ(x.grad().to_vector<float>()[1], 0.625f);
}

// Deliberate difference (docs/torch-differences.md): a float32 product accumulates in float64 and
// rounds once, so partial products past float32's range do not make it infinite (libtorch: -inf).
TEST_P(TorchParity, Float32ProdWhosePartialProductsOverflowIsFinite) {
  const std::vector<float> v = {3.40282347e+38f, 1.03001821f, -0.244147792f};
  const float want = static_cast<float>(double{v[0]} * double{v[1]} * double{v[2]});
  ASSERT_TRUE(std::isfinite(want));
  EXPECT_EQ(from_vector(v).prod(0, false).item<float>(), want);
}

// ---------------------------------------------------------------------- size-0 matrix products

TEST_P(TorchParity, MatmulWithAnEmptyContractionIsZeroAndSoAreItsGradients) {
  Tensor a = zeros({2, 3, 0}, kFloat64).requires_grad_();
  Tensor b = zeros({0, 1}, kFloat64).requires_grad_();
  Tensor y = matmul(a, b);
  testing::expect_close(y, std::vector<double>(6, 0.0), {2, 3, 1}, kFloat64);
  y.sum().backward();
  EXPECT_EQ(a.grad().sizes(), (Shape{2, 3, 0}));
  testing::expect_close(b.grad(), {}, {0, 1}, kFloat64);
}

TEST_P(TorchParity, MatrixProductsWithAnyEmptyDimForwardAndBackward) {
  struct Case {
    std::string name;
    Shape a, b, out;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
  };
  auto mm_fn = [](const Tensor& a, const Tensor& b) { return mm(a, b); };
  auto bmm_fn = [](const Tensor& a, const Tensor& b) { return bmm(a, b); };
  auto matmul_fn = [](const Tensor& a, const Tensor& b) { return matmul(a, b); };
  const std::vector<Case> cases = {
      {"mm k=0", {3, 0}, {0, 2}, {3, 2}, mm_fn},
      {"mm m=0", {0, 3}, {3, 2}, {0, 2}, mm_fn},
      {"mm n=0", {3, 4}, {4, 0}, {3, 0}, mm_fn},
      {"bmm k=0", {2, 3, 0}, {2, 0, 4}, {2, 3, 4}, bmm_fn},
      {"bmm batch=0", {0, 3, 2}, {0, 2, 4}, {0, 3, 4}, bmm_fn},
      {"matmul batched k=0", {2, 3, 0}, {0, 4}, {2, 3, 4}, matmul_fn},
      {"matmul 1-D k=0", {0}, {0, 4}, {4}, matmul_fn},
      {"matmul batch=0", {0, 3, 2}, {2, 4}, {0, 3, 4}, matmul_fn},
      {"matmul broadcast k=0", {2, 1, 3, 0}, {5, 0, 4}, {2, 5, 3, 4}, matmul_fn},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor a = testing::random_tensor(c.a, kFloat64).requires_grad_();
    Tensor b = testing::random_tensor(c.b, kFloat64).requires_grad_();
    Tensor y = c.fn(a, b);
    const int64_t k = c.a.back();
    if (k == 0)
      testing::expect_close(y, std::vector<double>(static_cast<size_t>(numel_of(c.out)), 0.0),
                            c.out, kFloat64);
    EXPECT_EQ(y.sizes(), c.out);
    y.sum().backward();
    EXPECT_EQ(a.grad().sizes(), c.a);
    EXPECT_EQ(b.grad().sizes(), c.b);
    // With an empty output nothing flows back; with an empty contraction there is nothing to
    // flow to.
    if (numel_of(c.out) == 0) {
      EXPECT_EQ(a.grad().abs().sum().item<double>(), 0.0);
      EXPECT_EQ(b.grad().abs().sum().item<double>(), 0.0);
    }
  }
}

TEST_P(TorchParity, LinearWithNoInputFeaturesIsItsBias) {
  Tensor x = zeros({4, 1, 1, 0}, kFloat64).requires_grad_();
  Tensor w = zeros({4, 0}, kFloat64).requires_grad_();
  Tensor bias = from_vector(std::vector<double>{1, 2, 3, 4}).requires_grad_();
  Tensor y = linear(x, w, bias);
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i) expected.insert(expected.end(), {1, 2, 3, 4});
  testing::expect_close(y, expected, {4, 1, 1, 4}, kFloat64);
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), (Shape{4, 1, 1, 0}));
  testing::expect_close(w.grad(), {}, {4, 0}, kFloat64);
  testing::expect_close(bias.grad(), {4, 4, 4, 4}, {4}, kFloat64);
}

// ------------------------------------------------------------------------ what backward saves

TEST_P(TorchParity, PowByANumberSavesItsInputNotItsOutput) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = pow(x, 2.0);
  y.sub_(1);
  y.sum().backward();
  testing::expect_close(x.grad(), {2, 4, 6}, {3}, kFloat64);
}

TEST_P(TorchParity, MulByANumberSavesNothingOfItsInput) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x.clone();
  Tensor z = y * 3.f;
  y.fill_(0);
  z.sum().backward();
  testing::expect_close(x.grad(), {3, 3}, {2}, kFloat64);
}

// d(c @ a)/da reads c only: a may change afterwards.
TEST_P(TorchParity, MatrixProductsSaveOnlyTheOperandTheOtherGradientReads) {
  Tensor c = from_vector(std::vector<double>{1, 2, 3, 4}, Shape{2, 2});
  Tensor x = leaf({1, 1, 1, 1}, {2, 2});
  Tensor a = x.clone();
  Tensor z = mm(c, a) + matmul(c, a) + linear(c, a);
  a.add_(1);
  z.sum().backward();
  // d/da sum(c a) = c^T 1 = [[4, 4], [6, 6]] (twice); d/da sum(c a^T) has c's column sums in
  // each row: [[4, 6], [4, 6]].
  testing::expect_close(x.grad(), {12, 14, 16, 18}, {2, 2}, kFloat64);
}

TEST_P(TorchParity, AnInputWhoseGradientIsNeededIsStillCheckedForInPlaceWrites) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x.clone();
  Tensor z = y * y;
  y.fill_(0);
  testing::expect_error([&] { z.sum().backward(); }, {"modified by an in-place operation", "mul"});
}

// ------------------------------------------------------------------------------------- clamp

// torch fills clamp's result with NaN when a bound is NaN; kiln does so for either bound alone
// too (as clamp with tensor bounds, torch.maximum and torch.minimum propagate NaN).
TEST_P(TorchParity, ClampPropagatesANaNBound) {
  Tensor x = from_vector(std::vector<float>{-5, 1, 5});
  const std::vector<double> nan3(3, kNaN);
  testing::expect_close(clamp(x, NAN, 3.0), nan3, {3}, kFloat32);
  testing::expect_close(clamp(x, -1.0, NAN), nan3, {3}, kFloat32);
  testing::expect_close(clamp(x, NAN, std::nullopt), nan3, {3}, kFloat32);
  testing::expect_close(clamp(x, std::nullopt, NAN), nan3, {3}, kFloat32);
  testing::expect_close(clamp(x, -1.0, 3.0), {-1, 1, 3}, {3}, kFloat32);
  // A NaN element stays NaN between ordinary bounds.
  testing::expect_close(clamp(from_vector(std::vector<float>{NAN}), -1.0, 3.0), {kNaN}, {1},
                        kFloat32);
  // Its gradient passes nowhere (x >= NaN is false), as torch's clamp_backward.
  Tensor xg = leaf({-5, 1, 5}, {3});
  clamp(xg, NAN, 3.0).sum().backward();
  testing::expect_close(xg.grad(), {0, 0, 0}, {3}, kFloat64);
}

// torch raises for an integral bound outside an int32 input's range; converted, it would wrap
// (INT64_MIN to 0, so clamp(-2, min=INT64_MIN) gave 0).
TEST_P(TorchParity, ClampRejectsAnIntegralBoundOutsideTheInputsRange) {
  Tensor x = from_vector(std::vector<int32_t>{-2, 5}, Shape{2});
  EXPECT_THROW(clamp(x, std::numeric_limits<int64_t>::min()), Error);
  EXPECT_THROW(clamp(x, std::nullopt, int64_t{1} << 40), Error);
  EXPECT_EQ(clamp(x, -3, 4).to_vector<int64_t>(), (std::vector<int64_t>{-2, 4}));
}

// As torch: fill_ of an integral tensor with a value it cannot hold raises (converted, inf is
// undefined behaviour).
TEST_P(TorchParity, FillOfAnIntegralTensorRejectsAValueItCannotHold) {
  Tensor i64 = zeros({2}, kInt64), i32 = zeros({2}, kInt32);
  EXPECT_THROW(i64.fill_(INFINITY), Error);
  EXPECT_THROW(i64.fill_(NAN), Error);
  EXPECT_THROW(i32.fill_(int64_t{1} << 40), Error);
  EXPECT_EQ(i32.fill_(-7).to_vector<int64_t>(), (std::vector<int64_t>{-7, -7}));
}

// -------------------------------------------------------------------------------------- chunk

TEST_P(TorchParity, ChunkOfAnEmptyDimGivesChunksEmptyPieces) {
  std::vector<Tensor> pieces = zeros({0, 3}).chunk(2, 0);
  ASSERT_EQ(pieces.size(), 2u);
  for (const Tensor& p : pieces) EXPECT_EQ(p.sizes(), (Shape{0, 3}));
  pieces = zeros({5, 0}).chunk(3, 1);
  ASSERT_EQ(pieces.size(), 3u);
  for (const Tensor& p : pieces) EXPECT_EQ(p.sizes(), (Shape{5, 0}));
  // A non-empty dim keeps torch's rule: pieces of ceil(n / chunks), possibly fewer of them.
  pieces = zeros({5}).chunk(3);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].sizes(), (Shape{1}));
  EXPECT_EQ(zeros({6}).chunk(4).size(), 3u);
}

// --------------------------------------------------------- in-place writes that drop the history

// torch: a non-leaf written by fill_, zero_ or copy_ (from a tensor without grad) still requires
// grad, its grad_fn is the write, and its old history receives zeros.
TEST_P(TorchParity, FillZeroAndCopyKeepANonLeafRequiringGrad) {
  const std::vector<std::pair<std::string, std::function<void(Tensor&)>>> writes = {
      {"fill_", [](Tensor& t) { t.fill_(5); }},
      {"zero_", [](Tensor& t) { t.zero_(); }},
      {"copy_",
       [](Tensor& t) {
         t.copy_(from_vector(std::vector<double>{7, 8}));
       }},
  };
  for (const auto& [name, write] : writes) {
    SCOPED_TRACE(name);
    Tensor x = leaf({1, 2}, {2});
    Tensor y = x * 2.0;
    write(y);
    EXPECT_TRUE(y.requires_grad());
    EXPECT_FALSE(y.grad_fn_name().empty());
    (y * 3.0).sum().backward();
    testing::expect_close(x.grad(), {0, 0}, {2}, kFloat64);
  }
}

TEST_P(TorchParity, FillOfAViewOfANonLeafZeroesOnlyThoseGradients) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x * 2.0;
  y.narrow(0, 1, 1).fill_(0);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  testing::expect_close(x.grad(), {2, 0, 2}, {3}, kFloat64);
}

// torch: a view taken before an in-place write to its base gets its history from the base's
// (as_strided's backward); an expanded view's elements share memory, so their gradients add up
// in the base, as they did through expand.
TEST_P(TorchParity, AnExpandedViewOfARewrittenBaseSumsItsGradient) {
  Tensor x = leaf({2}, {1});
  Tensor y = x * 3.0;
  Tensor e = y.expand({4});
  y.add_(1.0);
  (e * from_vector(std::vector<double>{1, 2, 3, 4})).sum().backward();
  testing::expect_close(x.grad(), {30}, {1}, kFloat64);
  // Through a write to a slice of the base, and an expanded column of a matrix.
  Tensor a = leaf({1, 2}, {2, 1});
  Tensor b = a * 1.0;
  Tensor wide = b.expand({2, 3});
  b.slice(0, 0, 1).add_(5.0);
  (wide * from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, Shape{2, 3})).sum().backward();
  testing::expect_close(a.grad(), {6, 15}, {2, 1}, kFloat64);
}

TEST_P(TorchParity, ALeafThatRequiresGradIsWrittenInPlaceOnlyWithoutGradMode) {
  Tensor x = leaf({1, 2}, {2});
  testing::expect_error([&] { x.fill_(0); }, {"fill_", "leaf"});
  testing::expect_error([&] { x.zero_(); }, {"leaf"});
  testing::expect_error([&] { x.copy_(zeros({2}, kFloat64)); }, {"copy_", "leaf"});
  {
    NoGradGuard no_grad;
    x.fill_(4);
    x.copy_(from_vector(std::vector<double>{5, 6}));
  }
  EXPECT_TRUE(x.requires_grad());
  testing::expect_close(x, {5, 6}, {2}, kFloat64);
  {
    NoGradGuard no_grad;
    x.zero_();
  }
  EXPECT_TRUE(x.requires_grad());
}

// torch: an integral or bool tensor never requires grad, whatever is written into it.
TEST_P(TorchParity, AWriteIntoABoolOrIntegralTensorRecordsNoGradient) {
  Tensor x = leaf({2, 0}, {2});
  for (DType dtype : {kBool, kInt64}) {
    Tensor t = ge(x, 1.0).to(dtype);
    t.slice(0, 0, 1).copy_(x.slice(0, 1, 2));
    EXPECT_FALSE(t.requires_grad()) << dtype;
    EXPECT_FALSE(erf(t).requires_grad()) << dtype;
    testing::expect_close(t.to(kFloat64), {0, 0}, {2}, kFloat64);
  }
}

// ---------------------------------------------------------------------- signed zeros in max/min

// amax/amin of equal zeros: +0 is the greater (IEEE 754-2019 maximum/minimum), whichever comes
// first, in eager and fused kernels alike (the fused folds are llvm.maximum / kiln_fmax).
TEST_P(TorchParity, AmaxAndAminOfSignedZerosDoNotDependOnOrder) {
  for (int64_t n : {2, 3, 17, 40}) {
    for (bool negative_first : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(n) + (negative_first ? " -0 first" : " +0 first"));
      std::vector<float> v(static_cast<size_t>(n), negative_first ? -0.f : 0.f);
      v[static_cast<size_t>(n) / 2] = negative_first ? 0.f : -0.f;
      Tensor x = from_vector(v);
      EXPECT_FALSE(std::signbit(amax(x).item<float>()));
      EXPECT_TRUE(std::signbit(amin(x).item<float>()));
      EXPECT_FALSE(std::signbit(max(x).item<float>()));
      EXPECT_TRUE(std::signbit(min(x).item<float>()));
      Tensor rows = x.view({1, n}).expand({3, n}).contiguous();
      for (float r : amax(rows, {1}).to_vector<float>()) EXPECT_FALSE(std::signbit(r));
      for (float r : amin(rows, {1}).to_vector<float>()) EXPECT_TRUE(std::signbit(r));
      for (float r : amax(rows.t().contiguous(), {0}).to_vector<float>())
        EXPECT_FALSE(std::signbit(r));
    }
  }
}

// maximum/minimum of zeros of both signs agree with amax/amin of the pair: +0 is the greater,
// whichever operand holds it, in eager and fused kernels (short and vectorized lengths alike).
// libtorch keeps the first operand in its scalar loop and the second in its vector loop (a
// deliberate difference: the tester does not pick such operands).
TEST_P(TorchParity, MaximumAndMinimumOfSignedZerosAgreeWithAmaxAndAmin) {
  for (int64_t n : {1, 8, 17}) {
    for (DType dtype : {kFloat32, kFloat64}) {
      const Tensor pos = zeros({n}, dtype), neg = full({n}, -0.0, dtype);
      for (bool negative_first : {false, true}) {
        SCOPED_TRACE("n " + std::to_string(n) + (negative_first ? " -0 first" : " +0 first"));
        const Tensor &a = negative_first ? neg : pos, &b = negative_first ? pos : neg;
        for (double r : maximum(a, b).to(kFloat64).to_vector<double>())
          EXPECT_FALSE(std::signbit(r));
        for (double r : minimum(a, b).to(kFloat64).to_vector<double>())
          EXPECT_TRUE(std::signbit(r));
        // Inside a fused group too (the lazy mode fuses the mul into the same kernel).
        for (double r : (maximum(a * 1.0, b) * 2.0).to(kFloat64).to_vector<double>())
          EXPECT_FALSE(std::signbit(r));
        for (double r : (minimum(a, b * 1.0) * 2.0).to(kFloat64).to_vector<double>())
          EXPECT_TRUE(std::signbit(r));
      }
      for (double r : maximum(neg, neg).to(kFloat64).to_vector<double>())
        EXPECT_TRUE(std::signbit(r));
      for (double r : minimum(pos, pos).to(kFloat64).to_vector<double>())
        EXPECT_FALSE(std::signbit(r));
    }
  }
  EXPECT_EQ(maximum(from_vector(std::vector<int64_t>{0, -3, 5}),
                    from_vector(std::vector<int64_t>{0, 2, 4}))
                .to_vector<int64_t>(),
            (std::vector<int64_t>{0, 2, 5}));
  EXPECT_EQ(minimum(from_vector(std::vector<int64_t>{0, -3, 5}),
                    from_vector(std::vector<int64_t>{0, 2, 4}))
                .to_vector<int64_t>(),
            (std::vector<int64_t>{0, -3, 4}));
}

// gelu(-0) is -0 (x Phi(x)), as libtorch's scalar loop and its float64 kernels give; libtorch's
// float32 vector loop gives +0 (a deliberate difference: the tester does not pick such operands).
TEST_P(TorchParity, GeluOfNegativeZeroIsNegativeZero) {
  for (int64_t n : {1, 8, 17}) {
    for (DType dtype : {kFloat32, kFloat64}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const Tensor x = full({n}, -0.0, dtype);
      for (const char* approximate : {"none", "tanh"}) {
        for (double r : gelu(x, approximate).to(kFloat64).to_vector<double>())
          EXPECT_TRUE(std::signbit(r)) << approximate;
        for (double r : (gelu(x * 1.0, approximate) * 2.0).to(kFloat64).to_vector<double>())
          EXPECT_TRUE(std::signbit(r)) << approximate << " fused";
      }
    }
  }
}

// remainder(a, b)'s divisor gradient is -g (a // b), libtorch's floor division: -1 for a nonzero
// a over a b of the other sign, even where a / b rounds to -0 (a subnormal a; an infinite b).
TEST_P(TorchParity, RemainderDivisorGradientWhereTheQuotientRoundsToZero) {
  const double tiny = std::numeric_limits<double>::denorm_min();
  Tensor a = from_vector(std::vector<double>{tiny, -tiny, tiny, 1.5, tiny});
  Tensor b = leaf({-2.5, 3.0, -kInf, -kInf, 2.5}, {5});
  remainder(a, b).backward(ones({5}, kFloat64));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1, 1, 1, 1, 0}));
}

// --------------------------------------------------------------------- layer_norm of nothing

// Deliberate difference (docs/torch-differences.md): layer_norm subtracts the mean first, so an
// element equal to its row's mean normalizes to exactly 0 (libtorch: a rounding error of either
// sign, about -1e-7 here, whose floor is -1).
TEST_P(TorchParity, LayerNormOfAnElementAtItsRowsMeanIsExactlyZero) {
  Tensor x = from_vector(std::vector<int32_t>{-2, 0, 2}) - 1.75;
  Tensor y = layer_norm(x, {3});
  EXPECT_EQ(y.to_vector<float>()[1], 0.f);
  EXPECT_EQ(floor(y).to_vector<float>()[1], 0.f);
}

// torch: layer_norm of an empty input (no rows, or rows of nothing) still requires grad; the
// weight's and bias's gradients are zeros.
TEST_P(TorchParity, LayerNormOfAnEmptyInputRequiresGrad) {
  for (const Shape& shape : {Shape{0, 3}, Shape{2, 0}}) {
    const Shape normalized{shape[1]};
    Tensor x = leaf({}, shape);
    Tensor w = leaf(std::vector<double>(static_cast<size_t>(shape[1]), 2.0), normalized);
    Tensor b = leaf(std::vector<double>(static_cast<size_t>(shape[1]), 1.0), normalized);
    Tensor y = layer_norm(x, normalized, w, b);
    ASSERT_TRUE(y.requires_grad()) << shape[0] << " rows of " << shape[1];
    EXPECT_EQ(y.sizes(), shape);
    y.sum().backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().sizes(), shape);
    testing::expect_close(w.grad(), std::vector<double>(static_cast<size_t>(shape[1]), 0.0),
                          normalized, kFloat64);
    testing::expect_close(b.grad(), std::vector<double>(static_cast<size_t>(shape[1]), 0.0),
                          normalized, kFloat64);
  }
}

// torch: cat skips empty 1-D pieces; when every piece is one, the empty result still requires
// grad if a piece does.
TEST_P(TorchParity, CatOfOnlyEmptyPiecesRequiresGrad) {
  Tensor x = leaf({}, {0});
  Tensor y = cat({x, zeros({0}, kBool)}, -1);
  EXPECT_EQ(y.dtype(), kFloat64);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), Shape{0});
}

// -------------------------------------------------------------- minimum and maximum of a NaN

// torch: each operand gets the gradient unless it loses (half where they tie), so where either
// is NaN both get all of it; minimum(v, v) of a NaN v passes twice the gradient to v.
TEST_P(TorchParity, MinimumAndMaximumPassTheGradientOfANaNToBothOperands) {
  for (bool is_max : {false, true}) {
    Tensor x = leaf({kNaN, 1, 2, 3}, {4}), y = leaf({0, kNaN, 2, 1}, {4});
    (is_max ? maximum(x, y) : minimum(x, y)).sum().backward();
    testing::expect_close(x.grad(), {1, 1, 0.5, is_max ? 1.0 : 0.0}, {4}, kFloat64);
    testing::expect_close(y.grad(), {1, 1, 0.5, is_max ? 0.0 : 1.0}, {4}, kFloat64);
  }
  Tensor v = leaf({kNaN}, {1});
  minimum(v, v).sum().backward();
  testing::expect_close(v.grad(), {2}, {1}, kFloat64);
}

// torch masks the loser's gradient (masked_fill): exactly 0 even where the incoming gradient is
// infinite (here the derivative of m / 0).
TEST_P(TorchParity, TheLoserOfMinimumOrMaximumGetsZeroEvenFromAnInfiniteGradient) {
  for (bool is_max : {false, true}) {
    Tensor x = leaf({1, 3}, {2}), y = leaf({2, 2}, {2});
    Tensor m = is_max ? maximum(x, y) : minimum(x, y);
    div(m, zeros({2}, kFloat64)).sum().backward();
    testing::expect_close(x.grad(),
                          is_max ? std::vector<double>{0, kInf} : std::vector<double>{kInf, 0}, {2},
                          kFloat64);
    testing::expect_close(y.grad(),
                          is_max ? std::vector<double>{kInf, 0} : std::vector<double>{0, kInf}, {2},
                          kFloat64);
  }
}

// d 3^x / dx = 3^x log 3 in float64: the log of the integral base is taken in the result's dtype.
TEST_P(TorchParity, PowOfAnIntegralBaseDifferentiatesInTheResultsDtype) {
  Tensor x = leaf({1.7675477301287135}, {1});
  pow(3, x).sum().backward();
  const double want = std::pow(3.0, 1.7675477301287135) * std::log(3.0);
  EXPECT_NEAR(x.grad().to_vector<double>()[0], want, 1e-14 * want);
}

// torch's exponent gradient of pow multiplies the incoming gradient by 0 where the base is 0: an
// infinite gradient (of 1 / 0^b) gives NaN there.
TEST_P(TorchParity, PowExponentGradientAtAZeroBaseKeepsAnInfiniteGradientNaN) {
  Tensor b = leaf({2.5}, {1});
  reciprocal(pow(zeros({1}, kFloat64), b)).sum().backward();
  testing::expect_close(b.grad(), {kNaN}, {1}, kFloat64);
}

// torch's max()/min() of every element (CPU): the elements equal to the result share the
// gradient, the others get exactly 0 even when it is NaN, and a NaN result's goes to the NaNs.
TEST_P(TorchParity, MaxAndMinOfEveryElementGiveOthersAZeroGradient) {
  for (bool is_max : {false, true}) {
    Tensor x = leaf(is_max ? std::vector<double>{1, 3, 3} : std::vector<double>{3, 1, 1}, {3});
    ((is_max ? x.max() : x.min()) * kNaN).backward();
    testing::expect_close(x.grad(), {0, kNaN, kNaN}, {3}, kFloat64);
    Tensor n = leaf({1, kNaN, 2}, {3});
    (is_max ? n.max() : n.min()).backward();
    testing::expect_close(n.grad(), {0, 1, 0}, {3}, kFloat64);
  }
}

// ------------------------------------------------------------------ NaN through zero gradients

// torch's relu gradient is g except where the result is <= 0: a NaN passes g through.
TEST_P(TorchParity, ReluOfNaNPassesTheGradientThrough) {
  Tensor x = leaf({kNaN, -1, 2}, {3});
  relu(x).sum().backward();
  testing::expect_close(x.grad(), {1, 0, 1}, {3}, kFloat64);
}

// A zero divisor in an integral remainder raises, but not when the result is empty: nothing is
// divided (torch).
TEST_P(TorchParity, IntegralRemainderOfAnEmptyResultDividesNothing) {
  Tensor r = remainder(zeros({0, 0}, kInt64), zeros({1}, kInt64));
  EXPECT_EQ(r.sizes(), (Shape{0, 0}));
  EXPECT_THROW(remainder(ones({2}, kInt64), zeros({1}, kInt64)), Error);
}

// A 0-dim int64 divisor of an int32 tensor is read as int32 (the result's dtype): INT64_MIN wraps
// to 0, and the remainder raises (torch: ZeroDivisionError) instead of trapping in the kernel.
TEST_P(TorchParity, IntegralRemainderChecksTheDivisorInTheResultsDtype) {
  Tensor x = from_vector(std::vector<int32_t>{-3}, Shape{1});
  Tensor lowest = from_vector(std::vector<int64_t>{std::numeric_limits<int64_t>::min()}, Shape{});
  testing::expect_error([&] { remainder(x, lowest); }, {"remainder", "division by zero", "int32"});
  Tensor r = remainder(x, from_vector(std::vector<int64_t>{(int64_t{1} << 32) + 2}, Shape{}));
  EXPECT_EQ(r.dtype(), kInt32);
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{1}));  // -3 mod 2
}

// ceil's gradient is zero, but cos's derivative at -inf is -sin(-inf) = NaN, and 0 * NaN is NaN:
// torch gives NaN, and so must every mode (no rewrite may drop a product with zero).
TEST_P(TorchParity, NaNFlowsThroughAZeroGradient) {
  Tensor x = leaf({-kInf, 0.5}, {2});
  ceil(cos(x)).sum().backward();
  testing::expect_close(x.grad(), {kNaN, 0}, {2}, kFloat64);
}

TEST(TorchParityTrace, NaNFlowsThroughAZeroGradientInATracedBackward) {
  Tensor x = leaf({-kInf, 0.5}, {2});
  jit::Function f = jit::trace(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ceil(cos(in[0])).sum()}; },
      {x});
  for (int call = 0; call < 2; ++call) {
    x.mutable_grad() = Tensor();
    f({x})[0].backward();
    testing::expect_close(x.grad(), {kNaN, 0}, {2}, kFloat64);
  }
}

// The same in a traced backward: the program of tests/diff (KILN_DIFF_PROGRAM=17261331561535160547)
// writes through slices of a GEMM result after expanding it.
TEST(TorchParityTrace, AnExpandedViewOfARewrittenBaseSumsItsGradientInATracedBackward) {
  Tensor x = leaf({1, 2, -1}, {3});
  Tensor m = leaf({2, 1, 3}, {3, 1});
  auto body = [](const std::vector<Tensor>& in) {
    Tensor y = matmul(in[0], in[1]);
    y.slice(-1, 0, 2, 2).add_(-0.75);
    Tensor e = y.expand({2, 2});
    y.slice(0, 2, 2, 2).add_(1.0);
    return std::vector<Tensor>{y, e};
  };
  jit::Function f = jit::trace(body, {x, m});
  for (int call = 0; call < 2; ++call) {
    x.mutable_grad() = Tensor();
    std::vector<Tensor> out = f({x, m});
    (out[0] * 10.0 + (out[1] * from_vector(std::vector<double>{1, 2, 3, 4}, Shape{2, 2})).sum())
        .sum()
        .backward();
    testing::expect_close(x.grad(), {40, 20, 60}, {3}, kFloat64);  // (10 + 1+2+3+4) * m
  }
}

}  // namespace
}  // namespace kiln
