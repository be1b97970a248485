// User mistakes raise kiln::Error with a message that names the op and shows the operands.
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_error;

TEST(Errors, BroadcastMismatchNamesOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4});
  expect_error([&] { add(a, b); }, {"add", "[2, 3]", "[4]", "broadcast"});
  expect_error([&] { a - b; }, {"sub", "[2, 3]", "[4]"});
  expect_error([&] { mul(a, b); }, {"mul", "[2, 3]", "[4]"});
  expect_error([&] { a / b; }, {"div", "[2, 3]", "[4]"});
  expect_error([&] { pow(a, b); }, {"pow", "[2, 3]", "[4]"});
  expect_error([&] { maximum(a, zeros({3, 3})); }, {"maximum", "[2, 3]", "[3, 3]"});
  expect_error([&] { lt(a, b); }, {"lt", "[2, 3]", "[4]"});
  expect_error([&] { logical_or(a, b); }, {"logical_or", "[2, 3]", "[4]"});
  expect_error([&] { where(zeros({5}, kBool), a, a); }, {"where", "[5]", "[2, 3]"});
  expect_error([&] { where(zeros({3}, kBool), a, b); }, {"where", "[2, 3]", "[4]"});
  expect_error([&] { zeros({2, 3}).copy_(b); }, {"copy_", "[2, 3]", "[4]"});
  expect_error([&] { a.expand({2, 4}); }, {"expand", "[2, 4]", "[2, 3]"});
}

TEST(Errors, DimOutOfRange) {
  Tensor a = zeros({2, 3});
  expect_error([&] { a.transpose(0, 2); }, {"transpose", "out of range", "[-2, 1]", "2"});
  expect_error([&] { a.select(-3, 0); }, {"select", "out of range", "-3"});
  expect_error([&] { a.unsqueeze(3); }, {"unsqueeze", "out of range", "[-3, 2]"});
  expect_error([&] { a.squeeze(2); }, {"squeeze", "out of range"});
  expect_error([&] { a.narrow(2, 0, 1); }, {"narrow", "out of range"});
  expect_error([&] { a.slice(5); }, {"slice", "out of range"});
  expect_error([&] { a.flatten(0, 4); }, {"flatten", "out of range"});
  expect_error([&] { a.permute({0, 2}); }, {"permute", "out of range"});
  expect_error([&] { a.chunk(2, 2); }, {"chunk", "out of range"});
  expect_error([&] { a.split(1, -3); }, {"split", "out of range"});
  expect_error([&] { a.unbind(2); }, {"unbind", "out of range"});
  expect_error([&] { a.size(2); }, {"size", "out of range"});
  expect_error([&] { a.stride(-3); }, {"stride", "out of range"});
  expect_error([&] { zeros({}).unsqueeze(2); }, {"unsqueeze", "out of range"});
  expect_error([&] { zeros({}).select(0, 0); }, {"select", "0-dim"});
  expect_error([&] { a.select(1, 3); }, {"select", "index 3", "size 3", "float32[2, 3]"});
  expect_error([&] { a.narrow(1, 2, 2); }, {"narrow", "float32[2, 3]"});
  expect_error([&] { a.flatten(1, 0); }, {"flatten", "float32[2, 3]"});
}

TEST(Errors, UnsupportedDTypes) {
  Tensor b = zeros({3}, kBool);
  expect_error([&] { neg(b); }, {"neg", "bool", "[3]"});
  expect_error([&] { -b; }, {"neg", "bool"});
  expect_error([&] { sub(b, b); }, {"sub", "bool"});
  expect_error([&] { sub(zeros({3}), b); }, {"sub", "bool"});
  expect_error([&] { b - 1; }, {"sub", "bool"});
  expect_error([&] { relu(b); }, {"relu", "bool"});
  expect_error([&] { clamp(b, 0, 1); }, {"clamp", "bool"});
  expect_error([&] { remainder(b, b); }, {"remainder", "bool"});
  expect_error([&] { pow(b, 2); }, {"pow", "bool"});
  expect_error([&] { rand({2}, kInt64); }, {"rand", "int64"});
  expect_error([&] { randn({2}, kBool); }, {"randn", "bool"});
  Tensor i = zeros({2}, kInt32);
  expect_error([&] { add(i, i, 1.5); }, {"add", "alpha", "int32[2]"});
  expect_error([&] { sub(i, i, 0.5); }, {"sub", "alpha"});
  expect_error([&] { where(zeros({2}, kInt64), i, i); }, {"where", "bool", "int64[2]"});
  expect_error([&] { where(zeros({2}), i, i); }, {"where", "bool", "float32[2]"});
}

TEST(Errors, InvalidViewsAndShapes) {
  Tensor a = zeros({3, 4});
  expect_error([&] { a.t().view({12}); }, {"view", "reshape", "[4, 3]"});
  expect_error([&] { a.view({5, 2}); }, {"view", "[5, 2]", "[3, 4]"});
  expect_error([&] { a.reshape({7, -1}); }, {"reshape", "[7, -1]", "12"});
  expect_error([&] { a.view({-1, -1}); }, {"view", "[-1, -1]"});
  expect_error([&] { a.view({-2, 6}); }, {"view", "-2"});
  expect_error([&] { a.reshape({0, -1}); }, {"reshape", "[0, -1]"});
  expect_error([&] { a.split(std::vector<int64_t>{1, 1}); }, {"split", "[1, 1]", "[3, 4]"});
  expect_error([&] { a.chunk(-1); }, {"chunk", "-1"});
  expect_error([&] { a.split(0); }, {"split", "0"});
  expect_error([&] { a.expand({4}); }, {"expand", "[4]", "[3, 4]"});
  expect_error([&] { a.slice(0, 0, 2, -1); }, {"slice", "step", "-1"});
}

TEST(Errors, NegativeShapes) {
  expect_error([] { zeros({2, -1}); }, {"zeros", "-1", "[2, -1]"});
  expect_error([] { ones({-3}); }, {"ones", "-3"});
  expect_error([] { empty({-1, 2}); }, {"empty", "[-1, 2]"});
  expect_error([] { full({-2}, 1.5); }, {"full", "[-2]"});
  expect_error([] { rand({-2}); }, {"rand", "[-2]"});
  expect_error([] { randn({4, -4}); }, {"randn", "[4, -4]"});
  expect_error([] { randint(5, {-1}); }, {"randint", "[-1]"});
  expect_error([] { eye(-2, 3); }, {"eye", "-2"});
  expect_error([] { linspace(0, 1, -5); }, {"linspace", "-5"});
  expect_error([] { from_vector(std::vector<float>{}, Shape{-1, 0}); }, {"from_vector", "-1"});
  float x = 0;
  expect_error([&] { from_blob(&x, {-1}); }, {"from_blob", "-1"});
}

TEST(Errors, DataAccess) {
  Tensor a = zeros({2, 3});
  expect_error([&] { a.item(); }, {"item", "6 elements", "float32[2, 3]"});
  expect_error([&] { a.item<float>(); }, {"item", "6 elements"});
  expect_error([&] { a.data_ptr<int32_t>(); }, {"data_ptr", "int32", "float32[2, 3]"});
  expect_error([] { from_blob(nullptr, {4}); }, {"from_blob", "null", "[4]"});
  int64_t buf[4] = {};
  expect_error([&] { from_blob(buf, {2, 2}, {1}, kInt64); }, {"from_blob", "[2, 2]", "[1]"});
  expect_error(
      [] {
        from_vector(std::vector<int32_t>{1, 2, 3}, Shape{4});
      },
      {"from_vector", "3", "[4]"});
  Tensor undefined;
  expect_error([&] { undefined.numel(); }, {"numel", "undefined"});
  expect_error([&] { add(undefined, a); }, {"add", "undefined"});
  expect_error([&] { exp(undefined); }, {"exp", "undefined"});
  expect_error([&] { a.copy_(undefined); }, {"copy_", "undefined"});
}

TEST(Errors, IntegerRemainderAndPow) {
  Tensor i = from_vector(std::vector<int64_t>{1, 2, 3});
  expect_error(
      [&] {
        remainder(i, from_vector(std::vector<int64_t>{1, 0, 1}));
      },
      {"remainder", "division by zero", "int64[3]"});
  expect_error([&] { remainder(i, 0); }, {"remainder", "division by zero"});
  expect_error(
      [&] {
        pow(i, from_vector(std::vector<int64_t>{1, -1, 2}));
      },
      {"pow", "negative", "int64[3]"});
  expect_error([&] { pow(i, -2); }, {"pow", "negative"});
  expect_error([&] { pow(2, from_vector(std::vector<int32_t>{-1})); }, {"pow", "negative"});
  // Float versions are fine: inf / nan and fractions.
  EXPECT_NO_THROW(remainder(i.to(kFloat32), 0));
  EXPECT_NO_THROW(pow(i, -2.0));
  EXPECT_NO_THROW(pow(i.to(kFloat64), -1));
}

TEST(Errors, OpArguments) {
  Tensor a = zeros({2});
  expect_error([&] { gelu(a, "fast"); }, {"gelu", "fast", "tanh"});
  expect_error([&] { clamp(a, std::nullopt, std::nullopt); }, {"clamp", "min", "max"});
  expect_error([] { arange(0, 10, 0); }, {"arange", "step"});
  expect_error([] { arange(10, 0, 2); }, {"arange", "10", "0", "2"});
  expect_error([] { randint(5, 2, {3}); }, {"randint", "5", "2"});
  expect_error([] { set_num_threads(0); }, {"set_num_threads", "0"});
  expect_error([&] { zeros({2, 3, 4}).t(); }, {"t", "[2, 3, 4]"});
  expect_error([&] { zeros({2, 3}).permute({1, 1}); }, {"permute", "[1, 1]"});
}

}  // namespace
}  // namespace kiln
