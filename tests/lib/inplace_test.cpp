// In-place ops: values, broadcasting of the source, writes through views, aliasing between self
// and the source, and failed calls that leave self unchanged.
#include <cmath>
#include <functional>

#include "tests/testing.h"

namespace kiln {
namespace {

using testing::values;

struct InplaceCase {
  std::string name;
  std::function<void(Tensor&, const Tensor&)> fn;
  std::function<double(double, double)> ref;
};

void PrintTo(const InplaceCase& c, std::ostream* os) {
  *os << c.name;
}

const std::vector<InplaceCase>& inplace_cases() {
  static const std::vector<InplaceCase> cases = {
      {"add_", [](Tensor& s, const Tensor& o) { s.add_(o); },
       [](double a, double b) { return a + b; }},
      {"add_alpha", [](Tensor& s, const Tensor& o) { s.add_(o, -2); },
       [](double a, double b) { return a - 2 * b; }},
      {"add_float_alpha", [](Tensor& s, const Tensor& o) { s.add_(o, 0.5); },
       [](double a, double b) { return a + 0.5 * b; }},
      {"sub_", [](Tensor& s, const Tensor& o) { s.sub_(o); },
       [](double a, double b) { return a - b; }},
      {"sub_alpha", [](Tensor& s, const Tensor& o) { s.sub_(o, 3); },
       [](double a, double b) { return a - 3 * b; }},
      {"mul_", [](Tensor& s, const Tensor& o) { s.mul_(o); },
       [](double a, double b) { return a * b; }},
      {"div_", [](Tensor& s, const Tensor& o) { s.div_(o); },
       [](double a, double b) { return a / b; }},
      {"copy_", [](Tensor& s, const Tensor& o) { s.copy_(o); }, [](double, double b) { return b; }},
      {"plus_equals", [](Tensor& s, const Tensor& o) { s += o; },
       [](double a, double b) { return a + b; }},
      {"minus_equals", [](Tensor& s, const Tensor& o) { s -= o; },
       [](double a, double b) { return a - b; }},
      {"times_equals", [](Tensor& s, const Tensor& o) { s *= o; },
       [](double a, double b) { return a * b; }},
      {"divide_equals", [](Tensor& s, const Tensor& o) { s /= o; },
       [](double a, double b) { return a / b; }},
  };
  return cases;
}

Tensor nonzero_input(const Shape& shape, DType dt) {
  Tensor t = testing::random_tensor(shape, dt, -3, 3);
  std::vector<double> v = values(t);
  for (auto& x : v)
    if (std::fabs(x) < 0.25) x = 0.5;
  return from_vector(v, shape).to(dt);
}

// A shape the source broadcasts to `shape` from: leading dims dropped, random dims set to 1.
Shape source_shape(const Shape& shape) {
  auto& g = testing::rng();
  Shape s = shape;
  if (!s.empty() && std::uniform_int_distribution<int>(0, 2)(g) == 0)
    s.erase(s.begin(), s.begin() + std::uniform_int_distribution<size_t>(1, s.size())(g));
  for (auto& d : s)
    if (std::uniform_int_distribution<int>(0, 2)(g) == 0) d = 1;
  return s;
}

class InplaceTest : public ::testing::TestWithParam<InplaceCase> {};

// Self is a fresh contiguous tensor, a transposed view, or every other element of a larger
// tensor (whose other elements must stay untouched); the source broadcasts and is float64, so
// the result is converted back to self's float32.
TEST_P(InplaceTest, ThroughViewsWithBroadcastSource) {
  const InplaceCase& c = GetParam();
  for (DType src_type : {kFloat32, kFloat64}) {
    for (int iter = 0; iter < 40; ++iter) {
      Shape shape = testing::random_shape(1, 4, 5);
      Tensor init = nonzero_input(shape, kFloat32);
      Shape ss = source_shape(shape);
      Tensor src = nonzero_input(ss, src_type);
      std::vector<double> iv = values(init), sv = values(src), expected(iv.size());
      for (size_t i = 0; i < iv.size(); ++i) {
        auto idx = testing::unravel(static_cast<int64_t>(i), shape);
        expected[i] = double(float(c.ref(iv[i], testing::broadcast_at(src, sv, idx, shape))));
      }
      SCOPED_TRACE(::testing::Message()
                   << c.name << " of float32" << ::testing::PrintToString(shape) << " with "
                   << src_type << ::testing::PrintToString(ss));
      // Contiguous.
      Tensor a = init.clone();
      c.fn(a, src);
      testing::expect_close(a, expected, shape, kFloat32, 1e-6, 1e-6);
      // Transposed view: the base, read back through the same view, has the new values.
      if (shape.size() >= 2) {
        Tensor base = init.transpose(0, -1).clone();
        Tensor view = base.transpose(0, -1);
        c.fn(view, src);
        testing::expect_close(base.transpose(0, -1), expected, shape, kFloat32, 1e-6, 1e-6);
      }
      // Every other element of a larger tensor.
      Shape big_shape = shape;
      big_shape.back() *= 2;
      Tensor big = full(big_shape, -77.0f);
      Tensor strided = big.slice(-1, 0, std::nullopt, 2);
      strided.copy_(init);
      c.fn(strided, src);
      testing::expect_close(big.slice(-1, 0, std::nullopt, 2), expected, shape, kFloat32, 1e-6,
                            1e-6);
      std::vector<double> rest = values(big.slice(-1, 1, std::nullopt, 2));
      EXPECT_EQ(rest, std::vector<double>(rest.size(), -77.0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, InplaceTest, ::testing::ValuesIn(inplace_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Inplace, ScalarOperands) {
  Tensor a = from_vector(std::vector<float>{1, -2, 3.5f});
  a.add_(1);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, -1, 4.5f}));
  a.sub_(0.5);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.5f, -1.5f, 4}));
  a.mul_(2);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{3, -3, 8}));
  a.div_(4);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0.75f, -0.75f, 2}));
  a += 1;
  a -= 0.25;
  a *= -1;
  a /= 0.5;
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{-3, 0, -5.5f}));
  Tensor i = from_vector(std::vector<int64_t>{5, -5});
  i += 2;
  i *= 3;
  i -= 1;
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{20, -10}));
  i.add_(from_vector(std::vector<int64_t>{1, 1}), 10);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{30, 0}));
  // The methods return self.
  Tensor& r = a.add_(1);
  EXPECT_TRUE(r.is_same(a));
  EXPECT_TRUE(a.mul_(1).is_same(a));
  EXPECT_TRUE(a.zero_().is_same(a));
  EXPECT_TRUE(a.fill_(1).is_same(a));
  EXPECT_TRUE(a.copy_(a).is_same(a));
  EXPECT_TRUE(a.clamp_(0).is_same(a));
}

TEST(Inplace, ZeroFillClamp) {
  Tensor base = arange(12, kFloat32).reshape({3, 4});
  base.t()[1].zero_();  // column 1
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{0, 0, 2, 3, 4, 0, 6, 7, 8, 0, 10, 11}));
  base.slice(1, 2).fill_(-1.5);
  EXPECT_EQ(base.to_vector<float>(),
            (std::vector<float>{0, 0, -1.5f, -1.5f, 4, 0, -1.5f, -1.5f, 8, 0, -1.5f, -1.5f}));
  base.t().clamp_(-1, 5);
  EXPECT_EQ(base.to_vector<float>(),
            (std::vector<float>{0, 0, -1, -1, 4, 0, -1, -1, 5, 0, -1, -1}));
  base.clamp_(std::nullopt, 0.5);
  EXPECT_EQ(base.to_vector<float>()[4], 0.5f);
  base.clamp_(0);
  EXPECT_EQ(base.to_vector<float>()[2], 0);
  Tensor i = from_vector(std::vector<int32_t>{-10, 0, 10});
  i.clamp_(-3, 3);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{-3, 0, 3}));
  i.fill_(2.9);  // converted like a cast: truncated
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{2, 2, 2}));
  Tensor b = zeros({2}, kBool);
  b.fill_(5);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_THROW(i.clamp_(0.5), Error);  // the float result can't go back into int32
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{2, 2, 2}));
  Tensor s = full({}, 3.0);
  s.fill_(4);
  EXPECT_EQ(s.item<double>(), 4);
}

TEST(Inplace, CopyConvertsAndBroadcasts) {
  Tensor dst = zeros({2, 3}, kInt32);
  dst.copy_(from_vector(std::vector<double>{1.9, -1.9, 7}));
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{1, -1, 7, 1, -1, 7}));
  dst.copy_(from_vector(std::vector<int64_t>{4, 5}, Shape{2, 1}));
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{4, 4, 4, 5, 5, 5}));
  dst.copy_(full({}, 9.5));
  EXPECT_EQ(dst.to_vector<int32_t>(), std::vector<int32_t>(6, 9));
  Tensor b = zeros({3}, kBool);
  b.copy_(from_vector(std::vector<float>{0, 0.1f, -2}));
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{false, true, true}));
  Tensor f = zeros({2, 2}, kFloat64);
  f.t().copy_(from_vector(std::vector<bool>{true, false, false, true}, Shape{2, 2}));
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{1, 0, 0, 1}));
  f.t().copy_(arange(4, kInt64).reshape({2, 2}));
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{0, 2, 1, 3}));
}

TEST(Inplace, AliasingSourceAndSelf) {
  // a += a^T on a square matrix reads the original values.
  Tensor a = arange(9, kFloat32).reshape({3, 3});
  a.add_(a.t());
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 4, 8, 4, 8, 12, 8, 12, 16}));
  Tensor m = arange(16, kInt64).reshape({4, 4});
  m.t().mul_(m);  // self is the transposed view
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) expected.push_back((i * 4 + j) * (j * 4 + i));
  EXPECT_EQ(m.to_vector<int64_t>(), expected);
  // Overlapping shifted copies in both directions.
  Tensor x = arange(10, kFloat32);
  x.narrow(0, 1, 9).copy_(x.narrow(0, 0, 9));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
  Tensor y = arange(10, kFloat32);
  y.narrow(0, 0, 9).copy_(y.narrow(0, 1, 9));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 9}));
  Tensor z = arange(10, kFloat64);
  z.narrow(0, 1, 9).sub_(z.narrow(0, 0, 9));
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{0, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  // Source that broadcasts one row of self over all of self.
  Tensor r = arange(6, kFloat32).reshape({2, 3});
  r.add_(r[0]);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 2, 4, 3, 5, 7}));
  Tensor q = arange(6, kFloat32).reshape({2, 3});
  q.mul_(q[1]);
  EXPECT_EQ(q.to_vector<float>(), (std::vector<float>{0, 4, 10, 9, 16, 25}));
  // The same view on both sides.
  Tensor s = arange(4, kFloat32);
  s.mul_(s);
  s += s;
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{0, 2, 8, 18}));
  // Reversed order through a permuted view of the same storage.
  Tensor w = arange(4, kFloat32).reshape({2, 2});
  w.copy_(w.t());
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 2, 1, 3}));
}

TEST(Inplace, FailedCallsLeaveSelfUnchanged) {
  Tensor i = from_vector(std::vector<int64_t>{1, 2, 3});
  testing::expect_error([&] { i.add_(0.5); }, {"add", "float32", "int64"});
  testing::expect_error([&] { i.add_(from_vector(std::vector<float>{1, 1, 1})); }, {"add"});
  testing::expect_error([&] { i.mul_(2.5); }, {"mul"});
  testing::expect_error([&] { i.div_(from_vector(std::vector<int64_t>{1, 1, 1})); }, {"div"});
  testing::expect_error([&] { i.add_(from_vector(std::vector<int64_t>{1, 1}), 0.5); }, {"add"});
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
  Tensor f = zeros({2, 3});
  // Broadcastable together but the result is larger than self.
  testing::expect_error([&] { f.add_(ones({4, 2, 3})); }, {"add", "[2, 3]", "[4, 2, 3]"});
  testing::expect_error([&] { f.mul_(ones({2, 1, 3})); }, {"mul", "[2, 3]", "[2, 2, 3]"});
  testing::expect_error([&] { f.copy_(ones({4, 2, 3})); }, {"copy_", "[4, 2, 3]", "[2, 3]"});
  // Not broadcastable at all.
  testing::expect_error([&] { f.sub_(ones({2})); }, {"sub", "[2, 3]", "[2]"});
  testing::expect_error([&] { f.copy_(ones({3, 2})); }, {"copy_", "[3, 2]", "[2, 3]"});
  testing::expect_error([&] { f.div_(ones({4})); }, {"div", "[2, 3]", "[4]"});
  EXPECT_EQ(values(f), std::vector<double>(6, 0));
  Tensor b = zeros({2}, kBool);
  testing::expect_error([&] { b.add_(ones({2}, kInt32)); }, {"add", "bool"});
  testing::expect_error([&] { b.sub_(ones({2}, kBool)); }, {"sub", "bool"});
  EXPECT_EQ(values(b), (std::vector<double>{0, 0}));
}

}  // namespace
}  // namespace kiln
