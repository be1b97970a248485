// torch's type promotion: promote_types, the result type of ops mixing tensors, 0-dim tensors and
// C++ numbers, true division, comparisons, and can_cast for in-place writes.
#include <cmath>
#include <cstdint>
#include <limits>

#include "tests/testing.h"

namespace kiln {
namespace {

const std::vector<DType> kTypes = {kBool, kInt32, kInt64, kFloat32, kFloat64};

TEST(Promotion, PromoteTypesTable) {
  // torch.promote_types for every ordered pair; rows and columns in kTypes order.
  const DType table[5][5] = {
      {kBool, kInt32, kInt64, kFloat32, kFloat64},
      {kInt32, kInt32, kInt64, kFloat32, kFloat64},
      {kInt64, kInt64, kInt64, kFloat32, kFloat64},
      {kFloat32, kFloat32, kFloat32, kFloat32, kFloat64},
      {kFloat64, kFloat64, kFloat64, kFloat64, kFloat64},
  };
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(promote_types(kTypes[i], kTypes[j]), table[i][j])
          << kTypes[i] << " with " << kTypes[j];
}

TEST(Promotion, TensorWithTensorUsesPromoteTypes) {
  for (DType a : kTypes) {
    for (DType b : kTypes) {
      Tensor x = ones({2, 1}, a), y = ones({3}, b);
      DType p = promote_types(a, b);
      EXPECT_EQ((x * y).dtype(), p) << a << " * " << b;
      EXPECT_EQ(maximum(x, y).dtype(), p);
      EXPECT_EQ(where(ones({3}, kBool), x, y).dtype(), p);
      EXPECT_EQ(div(x, y).dtype(), to_floating(p));
      EXPECT_EQ(exp(x).dtype(), to_floating(a));
      EXPECT_EQ(eq(x, y).dtype(), kBool);
      EXPECT_EQ(lt(x, y).dtype(), kBool);
      EXPECT_EQ(logical_and(x, y).dtype(), kBool);
      if (a != kBool && b != kBool) {
        EXPECT_EQ((x - y).dtype(), p);
      }
    }
  }
}

TEST(Promotion, ZeroDimTensorsCountOnlyForAHigherCategory) {
  auto zero_dim = [](DType d) { return ones({}, d); };
  // Same category: the dimensioned tensor's type wins.
  EXPECT_EQ((ones({3}, kFloat32) + zero_dim(kFloat64)).dtype(), kFloat32);
  EXPECT_EQ((ones({3}, kInt32) + zero_dim(kInt64)).dtype(), kInt32);
  EXPECT_EQ((ones({3}, kInt64) * zero_dim(kInt32)).dtype(), kInt64);
  EXPECT_EQ((ones({3}, kBool) * zero_dim(kBool)).dtype(), kBool);
  // Higher category: promoted together.
  EXPECT_EQ((ones({3}, kInt32) + zero_dim(kFloat64)).dtype(), kFloat64);
  EXPECT_EQ((ones({3}, kInt64) + zero_dim(kFloat32)).dtype(), kFloat32);
  EXPECT_EQ((ones({3}, kBool) + zero_dim(kInt32)).dtype(), kInt32);
  EXPECT_EQ((ones({3}, kBool) + zero_dim(kFloat64)).dtype(), kFloat64);
  // Lower category: ignored.
  EXPECT_EQ((ones({3}, kInt32) + zero_dim(kBool)).dtype(), kInt32);
  EXPECT_EQ((ones({3}, kFloat32) * zero_dim(kInt64)).dtype(), kFloat32);
  // Either side, and for every binary op.
  EXPECT_EQ((zero_dim(kFloat64) + ones({3}, kFloat32)).dtype(), kFloat32);
  EXPECT_EQ(maximum(zero_dim(kInt64), ones({3}, kInt32)).dtype(), kInt32);
  EXPECT_EQ(where(ones({3}, kBool), ones({3}, kInt32), zero_dim(kInt64)).dtype(), kInt32);
  EXPECT_EQ(div(ones({3}, kInt32), zero_dim(kInt64)).dtype(), kFloat32);
  // Two 0-dim tensors promote normally.
  EXPECT_EQ((zero_dim(kInt32) + zero_dim(kFloat64)).dtype(), kFloat64);
  EXPECT_EQ((zero_dim(kFloat32) + zero_dim(kFloat64)).dtype(), kFloat64);
  // A size-1 tensor with a dim is not 0-dim.
  EXPECT_EQ((ones({3}, kFloat32) + ones({1}, kFloat64)).dtype(), kFloat64);
}

TEST(Promotion, CppNumbersRankBelowZeroDimTensors) {
  // An integral number keeps an integer tensor's type, a float number makes it float32.
  EXPECT_EQ((ones({2}, kInt32) * 2).dtype(), kInt32);
  EXPECT_EQ((ones({2}, kInt64) * 2).dtype(), kInt64);
  EXPECT_EQ((ones({2}, kInt32) * 2.5).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kInt64) + 2.5).dtype(), kFloat32);
  EXPECT_EQ((2.5 * ones({2}, kInt64)).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kFloat32) * 2.5).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kFloat64) * 2).dtype(), kFloat64);
  // bool tensors: an int number gives int64, a float number float32, a bool stays bool.
  EXPECT_EQ((ones({2}, kBool) + 1).dtype(), kInt64);
  EXPECT_EQ((1 + ones({2}, kBool)).dtype(), kInt64);
  EXPECT_EQ((ones({2}, kBool) + 1.0).dtype(), kFloat32);
  EXPECT_EQ((ones({2}, kBool) * true).dtype(), kBool);
  EXPECT_EQ((ones({2}, kInt32) * true).dtype(), kInt32);
  // A 0-dim tensor with a number: the tensor's type unless the number is of a higher category.
  EXPECT_EQ((ones({}, kInt32) + 1).dtype(), kInt32);
  EXPECT_EQ((ones({}, kInt32) + 1.5).dtype(), kFloat32);
  EXPECT_EQ((ones({}, kFloat64) + 1.5).dtype(), kFloat64);
  // The number's value decides nothing: large ints don't widen int32.
  EXPECT_EQ((ones({2}, kInt32) + (int64_t{1} << 40)).dtype(), kInt32);
  // Comparisons with numbers give bool; clamp bounds promote like operands.
  EXPECT_EQ(lt(ones({2}, kInt32), 2.5).dtype(), kBool);
  EXPECT_EQ(clamp(ones({2}, kInt32), 0, 5).dtype(), kInt32);
  EXPECT_EQ(clamp(ones({2}, kInt32), 0.5).dtype(), kFloat32);
  EXPECT_EQ(clamp(ones({2}, kFloat64), 0.5).dtype(), kFloat64);
  EXPECT_EQ(pow(ones({2}, kInt32), 2).dtype(), kInt32);
  EXPECT_EQ(pow(ones({2}, kInt32), 0.5).dtype(), kFloat32);
  EXPECT_EQ(pow(2, ones({2}, kInt32)).dtype(), kInt32);
  EXPECT_EQ(pow(2.0, ones({2}, kInt64)).dtype(), kFloat32);
  EXPECT_EQ(where(ones({2}, kBool), ones({2}, kInt32), 1.5).dtype(), kFloat32);
  EXPECT_EQ(where(ones({2}, kBool), ones({2}, kInt32), 7).dtype(), kInt32);
}

TEST(Promotion, ValuesFollowTheResultType) {
  // int * 2.5 computes in float, not in int then converts.
  Tensor i = from_vector(std::vector<int32_t>{1, 3});
  EXPECT_EQ((i * 2.5).to_vector<float>(), (std::vector<float>{2.5f, 7.5f}));
  EXPECT_EQ((i / 2).to_vector<float>(), (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ((i + ones({}, kFloat64) * 0.25).to_vector<double>(), (std::vector<double>{1.25, 3.25}));
  // float32 + 0-dim float64 computes in float32.
  Tensor f = from_vector(std::vector<float>{1.0f});
  Tensor tiny = from_vector(std::vector<double>{1e-10}, Shape{});
  EXPECT_EQ((f + tiny).item<double>(), 1.0);
  // bool + bool stays bool; bool + 1 counts.
  Tensor b = from_vector(std::vector<bool>{true, false});
  EXPECT_EQ((b + b).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ((b + 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 1}));
}

TEST(Promotion, DivisionOfIntegersIsFloat32) {
  for (DType a : {kBool, kInt32, kInt64}) {
    for (DType b : {kBool, kInt32, kInt64}) {
      EXPECT_EQ(div(ones({2}, a), ones({2}, b)).dtype(), kFloat32) << a << " / " << b;
      EXPECT_EQ((ones({2}, a) / ones({}, b)).dtype(), kFloat32);
    }
    EXPECT_EQ((ones({2}, a) / 2).dtype(), kFloat32);
    EXPECT_EQ((2 / ones({2}, a)).dtype(), kFloat32);
  }
  EXPECT_EQ((ones({2}, kInt64) / ones({2}, kFloat64)).dtype(), kFloat64);
  EXPECT_EQ((ones({2}, kFloat64) / 2).dtype(), kFloat64);
}

TEST(Promotion, CanCast) {
  // can_cast(from, to): no floating -> integral, no non-bool -> bool.
  const bool table[5][5] = {
      // to: bool  int32  int64  f32    f64
      {true, true, true, true, true},     // from bool
      {false, true, true, true, true},    // from int32
      {false, true, true, true, true},    // from int64
      {false, false, false, true, true},  // from float32
      {false, false, false, true, true},  // from float64
  };
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(can_cast(kTypes[i], kTypes[j]), table[i][j]) << kTypes[i] << " -> " << kTypes[j];
}

TEST(Promotion, InPlaceOpsFollowCanCast) {
  for (DType self : kTypes) {
    for (DType other : kTypes) {
      if (self == kBool || other == kBool) continue;  // add of bools is covered elsewhere
      Tensor t = ones({3}, self);
      DType result = promote_types(self, other);
      if (can_cast(result, self)) {
        t.add_(ones({3}, other));
        EXPECT_EQ(t.dtype(), self);
        EXPECT_EQ(testing::values(t), std::vector<double>(3, 2));
      } else {
        EXPECT_THROW(t.add_(ones({3}, other)), Error) << self << " += " << other;
        EXPECT_EQ(testing::values(t), std::vector<double>(3, 1));
      }
    }
  }
  Tensor i = ones({2}, kInt32);
  EXPECT_THROW(i.div_(2), Error);  // true division gives float
  EXPECT_THROW(i.mul_(1.5), Error);
  i.mul_(3);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{3, 3}));
  Tensor f = ones({2}, kFloat32);
  f.add_(ones({2}, kFloat64), 0.5);
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, 1.5f}));
}

TEST(Promotion, DTypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(kBool), "bool");
  EXPECT_STREQ(dtype_name(kInt32), "int32");
  EXPECT_STREQ(dtype_name(kInt64), "int64");
  EXPECT_STREQ(dtype_name(kFloat32), "float32");
  EXPECT_STREQ(dtype_name(kFloat64), "float64");
  EXPECT_EQ(element_size(kBool), 1u);
  EXPECT_EQ(element_size(kInt32), 4u);
  EXPECT_EQ(element_size(kInt64), 8u);
  EXPECT_EQ(element_size(kFloat32), 4u);
  EXPECT_EQ(element_size(kFloat64), 8u);
  EXPECT_EQ(to_floating(kInt64), kFloat32);
  EXPECT_EQ(to_floating(kFloat64), kFloat64);
  EXPECT_TRUE(is_integral(kBool, true));
  EXPECT_FALSE(is_integral(kBool));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A float Scalar's integer view truncates toward zero; for values the integer type cannot hold
// it is that type's lowest value (x86's "integer indefinite", what the fused kernels' conversion
// gives), never the undefined result of a plain cast (which UBSan reports).
TEST(ScalarConversion, NonFiniteAndHugeFloatsConvertToTheLowestInteger) {
  EXPECT_EQ(Scalar(-2.75).to_int(), -2);
  EXPECT_EQ(Scalar(2.75f).to<int32_t>(), 2);
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {std::nan(""), inf, -inf, 0x1p63, -0x1p64, 1e300}) {
    EXPECT_EQ(Scalar(v).to_int(), INT64_MIN) << v;
    EXPECT_EQ(Scalar(v).to<int64_t>(), INT64_MIN) << v;
    EXPECT_EQ(Scalar(v).to<int32_t>(), INT32_MIN) << v;
    if (!std::isnan(v)) EXPECT_EQ(Scalar(v).to_double(), v) << v;  // the value itself is kept
  }
  EXPECT_EQ(Scalar(-0x1p63).to_int(), INT64_MIN);   // the one power of two that fits
  EXPECT_EQ(Scalar(3e9).to<int32_t>(), INT32_MIN);  // fits int64, not int32
}

}  // namespace
}  // namespace kiln
