// Factories (shapes, ranges, random draws, user memory), metadata, conversions and data access.
#include <cmath>
#include <numeric>

#include "tests/testing.h"

namespace kiln {
namespace {

using testing::values;

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

TEST(Factories, EmptyZerosOnes) {
  Tensor e = empty({2, 3});
  EXPECT_EQ(e.sizes(), (Shape{2, 3}));
  EXPECT_EQ(e.dtype(), kFloat32);
  EXPECT_EQ(empty({4}, kInt32).dtype(), kInt32);
  EXPECT_EQ(empty({0, 5}).numel(), 0);
  EXPECT_EQ(empty({}).dim(), 0);
  EXPECT_EQ(empty({}).numel(), 1);
  for (DType dt : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    Tensor z = zeros({3, 2}, dt), o = ones({2, 1, 2}, dt);
    EXPECT_EQ(z.dtype(), dt);
    EXPECT_EQ(o.dtype(), dt);
    EXPECT_EQ(values(z), std::vector<double>(6, 0));
    EXPECT_EQ(values(o), std::vector<double>(4, 1));
    EXPECT_EQ(values(zeros_like(o)), std::vector<double>(4, 0));
    EXPECT_EQ(zeros_like(o).sizes(), o.sizes());
    EXPECT_EQ(ones_like(z).dtype(), dt);
    EXPECT_EQ(empty_like(o).sizes(), o.sizes());
    EXPECT_EQ(empty_like(o).dtype(), dt);
  }
  EXPECT_EQ(zeros({2}).dtype(), kFloat32);
  EXPECT_EQ(ones({2}).dtype(), kFloat32);
}

TEST(Factories, FullInfersDTypeFromTheValue) {
  Tensor f = full({2, 2}, 1.5);
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(values(f), std::vector<double>(4, 1.5));
  Tensor i = full({3}, 7);
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{7, 7, 7}));
  Tensor b = full({2}, true);
  EXPECT_EQ(b.dtype(), kBool);
  EXPECT_EQ(values(b), (std::vector<double>{1, 1}));
  Tensor d = full({2}, 2, kFloat64);
  EXPECT_EQ(d.dtype(), kFloat64);
  EXPECT_EQ(values(d), (std::vector<double>{2, 2}));
  EXPECT_EQ(full({2}, 2.9, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(full({}, -1).item<int64_t>(), -1);
  Tensor like = full_like(zeros({2, 3}, kInt32), 4);
  EXPECT_EQ(like.dtype(), kInt32);
  EXPECT_EQ(values(like), std::vector<double>(6, 4));
  Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.dtype(), kFloat32);
  EXPECT_EQ(s.item<double>(), 2.5);
  EXPECT_EQ(scalar_tensor(3).dtype(), kInt64);
  EXPECT_EQ(scalar_tensor(3, kFloat64).dtype(), kFloat64);
}

TEST(Factories, Arange) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(5.0).dtype(), kFloat32);
  EXPECT_EQ(values(arange(5.0)), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(arange(1, 11, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7, 10}));
  EXPECT_EQ(arange(10, 0, -3).to_vector<int64_t>(), (std::vector<int64_t>{10, 7, 4, 1}));
  EXPECT_EQ(arange(-2, -8, -2).to_vector<int64_t>(), (std::vector<int64_t>{-2, -4, -6}));
  Tensor f = arange(0, 1, 0.25);
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(values(f), (std::vector<double>{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(values(arange(-1.0, -2.0, -0.5)), (std::vector<double>{-1, -1.5}));
  EXPECT_EQ(arange(0, 1, 0.1).numel(), 10);
  EXPECT_EQ(arange(0.0, 1.0, 0.3).numel(), 4);  // 0, 0.3, 0.6, 0.9
  EXPECT_EQ(arange(3, 3).numel(), 0);
  Tensor d = arange(4, kFloat64);
  EXPECT_EQ(d.dtype(), kFloat64);
  EXPECT_EQ(values(d), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(arange(2, 6, 1, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{2, 3, 4, 5}));
  testing::expect_error([] { arange(0, 5, 0); }, {"arange", "step"});
  testing::expect_error([] { arange(0, 5, -1); }, {"arange", "step"});
  testing::expect_error([] { arange(5, 0, 1); }, {"arange", "step"});
}

TEST(Factories, LinspaceEndpointsAreExact) {
  Tensor l = linspace(0, 1, 5);
  EXPECT_EQ(l.dtype(), kFloat32);
  EXPECT_EQ(values(l), (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  for (int64_t steps : {2, 3, 7, 13, 100, 1001}) {
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor t = linspace(-3.3, 7.7, steps, dt);
      ASSERT_EQ(t.numel(), steps);
      std::vector<double> v = values(t);
      double lo = dt == kFloat32 ? double(float(-3.3)) : -3.3;
      double hi = dt == kFloat32 ? double(float(7.7)) : 7.7;
      EXPECT_EQ(v.front(), lo) << steps;
      EXPECT_EQ(v.back(), hi) << steps;
      for (int64_t i = 0; i < steps; ++i)
        EXPECT_NEAR(v[i], -3.3 + 11.0 * double(i) / double(steps - 1), 1e-5);
    }
  }
  EXPECT_EQ(values(linspace(2, 5, 1)), (std::vector<double>{2}));  // torch gives the start
  EXPECT_EQ(linspace(2, 5, 0).numel(), 0);
  EXPECT_EQ(values(linspace(5, 2, 4)), (std::vector<double>{5, 4, 3, 2}));
  testing::expect_error([] { linspace(0, 1, -1); }, {"linspace", "-1"});
}

TEST(Factories, Eye) {
  EXPECT_EQ(values(eye(3)), (std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(eye(3).dtype(), kFloat32);
  Tensor r = eye(2, 4);
  EXPECT_EQ(r.sizes(), (Shape{2, 4}));
  EXPECT_EQ(values(r), (std::vector<double>{1, 0, 0, 0, 0, 1, 0, 0}));
  Tensor c = eye(3, 2, kInt64);
  EXPECT_EQ(c.dtype(), kInt64);
  EXPECT_EQ(values(c), (std::vector<double>{1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(values(eye(2, kBool)), (std::vector<double>{1, 0, 0, 1}));
  EXPECT_EQ(eye(0).sizes(), (Shape{0, 0}));
  testing::expect_error([] { eye(-1); }, {"eye", "-1"});
}

TEST(Random, RandIsUniformInHalfOpenUnitInterval) {
  manual_seed(1);
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor r = rand({100000}, dt);
    EXPECT_EQ(r.dtype(), dt);
    std::vector<double> v = values(r);
    for (double x : v) ASSERT_TRUE(x >= 0 && x < 1) << x;
    EXPECT_NEAR(mean_of(v), 0.5, 0.005);
    // Each tenth of [0, 1) gets about a tenth of the draws.
    std::vector<int> bins(10, 0);
    for (double x : v) ++bins[static_cast<int>(x * 10)];
    for (int b : bins) EXPECT_NEAR(b, 10000, 500);
  }
  EXPECT_EQ(rand({2, 3}).sizes(), (Shape{2, 3}));
  EXPECT_EQ(rand({2, 3}).dtype(), kFloat32);
  testing::expect_error([] { rand({2}, kInt32); }, {"rand", "int32"});
}

TEST(Random, RandnIsStandardNormal) {
  manual_seed(2);
  for (DType dt : {kFloat32, kFloat64}) {
    std::vector<double> v = values(randn({100001}, dt));
    double m = mean_of(v), var = 0;
    for (double x : v) var += (x - m) * (x - m);
    double sd = std::sqrt(var / double(v.size() - 1));
    EXPECT_NEAR(m, 0, 0.02);
    EXPECT_NEAR(sd, 1, 0.02);
    int64_t within1 = 0;
    for (double x : v) within1 += std::fabs(x) < 1;
    EXPECT_NEAR(double(within1) / double(v.size()), 0.6827, 0.01);
  }
  EXPECT_EQ(randn({3, 1}).sizes(), (Shape{3, 1}));
}

TEST(Random, RandintCoversTheRange) {
  manual_seed(3);
  Tensor r = randint(-3, 4, {10000});
  EXPECT_EQ(r.dtype(), kInt64);
  std::vector<int> counts(7, 0);
  for (int64_t x : r.to_vector<int64_t>()) {
    ASSERT_TRUE(x >= -3 && x < 4) << x;
    ++counts[x + 3];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000 / 7, 200);
  Tensor s = randint(5, {2, 50}, kInt32);
  EXPECT_EQ(s.dtype(), kInt32);
  EXPECT_EQ(s.sizes(), (Shape{2, 50}));
  std::vector<bool> hit(5, false);
  for (int32_t x : s.to_vector<int32_t>()) {
    ASSERT_TRUE(x >= 0 && x < 5);
    hit[x] = true;
  }
  for (bool h : hit) EXPECT_TRUE(h);
  testing::expect_error([] { randint(3, 3, {2}); }, {"randint", "low", "high"});
}

TEST(Random, ManualSeedReproduces) {
  manual_seed(42);
  std::vector<double> a = values(rand({50})), an = values(randn({7})),
                      ai = values(randint(0, 1000, {20}));
  manual_seed(42);
  EXPECT_EQ(values(rand({50})), a);
  EXPECT_EQ(values(randn({7})), an);
  EXPECT_EQ(values(randint(0, 1000, {20})), ai);
  manual_seed(43);
  EXPECT_NE(values(rand({50})), a);
  // Successive draws differ.
  manual_seed(42);
  rand({50});
  EXPECT_NE(values(rand({50})), a);
}

TEST(FromVector, EveryDType) {
  Tensor f = from_vector(std::vector<float>{1.5f, -2}, Shape{2, 1});
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(f.sizes(), (Shape{2, 1}));
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, -2}));
  Tensor d = from_vector(std::vector<double>{0.1, 0.2, 0.3});
  EXPECT_EQ(d.dtype(), kFloat64);
  EXPECT_EQ(d.sizes(), (Shape{3}));
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{0.1, 0.2, 0.3}));
  Tensor i = from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  EXPECT_EQ(i.dtype(), kInt32);
  EXPECT_EQ(i[1][2].item<int32_t>(), 6);
  Tensor l = from_vector(std::vector<int64_t>{int64_t{1} << 40, -7});
  EXPECT_EQ(l.dtype(), kInt64);
  EXPECT_EQ(l.to_vector<int64_t>(), (std::vector<int64_t>{int64_t{1} << 40, -7}));
  Tensor b = from_vector(std::vector<bool>{true, false, true, true}, Shape{2, 2});
  EXPECT_EQ(b.dtype(), kBool);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(b[0][1].item<bool>(), false);
  Tensor s = from_vector(std::vector<float>{3}, Shape{});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<float>(), 3);
  EXPECT_EQ(from_vector(std::vector<float>{}).sizes(), (Shape{0}));
  testing::expect_error(
      [] {
        from_vector(std::vector<float>{1, 2, 3}, Shape{2, 2});
      },
      {"from_vector", "3", "[2, 2]"});
}

TEST(FromBlob, SharesMemoryWithoutCopying) {
  std::vector<float> buf{1, 2, 3, 4, 5, 6};
  Tensor t = from_blob(buf.data(), {2, 3});
  EXPECT_EQ(t.raw_data_ptr(), buf.data());
  EXPECT_EQ(t.dtype(), kFloat32);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  buf[4] = 50;
  EXPECT_EQ(t[1][1].item<float>(), 50);
  t[0].fill_(-1);
  EXPECT_EQ(buf, (std::vector<float>{-1, -1, -1, 4, 50, 6}));
  t.add_(1);
  EXPECT_EQ(buf, (std::vector<float>{0, 0, 0, 5, 51, 7}));
  // Explicit strides: a column-major 2x3 view of the same memory.
  Tensor c = from_blob(buf.data(), {2, 3}, {1, 2});
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 0, 51, 0, 5, 7}));
  EXPECT_FALSE(c.is_contiguous());
  std::vector<int64_t> ints{10, 20, 30, 40};
  Tensor ti = from_blob(ints.data(), {2}, {2}, kInt64);  // every other element
  EXPECT_EQ(ti.to_vector<int64_t>(), (std::vector<int64_t>{10, 30}));
  ti.mul_(2);
  EXPECT_EQ(ints, (std::vector<int64_t>{20, 20, 60, 40}));
}

TEST(FromBlob, DeleterRunsWhenTheLastViewGoes) {
  int calls = 0;
  void* seen = nullptr;
  auto* data = new double[4]{1, 2, 3, 4};
  Tensor view;
  {
    Tensor t = from_blob(data, {2, 2}, kFloat64, [&](void* p) {
      ++calls;
      seen = p;
      delete[] static_cast<double*>(p);
    });
    view = t.t()[1];
    EXPECT_EQ(calls, 0);
  }
  EXPECT_EQ(calls, 0);  // the view keeps the memory alive
  EXPECT_EQ(view.to_vector<double>(), (std::vector<double>{2, 4}));
  view = Tensor();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, data);
  testing::expect_error([] { from_blob(nullptr, {2, 3}); }, {"from_blob", "null", "[2, 3]"});
}

TEST(DataAccess, ItemAndDataPtrCheckTheirArguments) {
  EXPECT_EQ(full({1, 1}, 2.5).item<float>(), 2.5f);
  EXPECT_EQ(full({1}, 3).item<int64_t>(), 3);
  EXPECT_TRUE(full({}, 7).item().is_integral());
  EXPECT_TRUE(full({}, 7.0).item().is_floating_point());
  EXPECT_TRUE(full({}, true).item().is_bool());
  EXPECT_EQ(full({}, 7.75).item<int>(), 7);
  testing::expect_error([] { zeros({2, 2}).item<float>(); }, {"item", "4 elements", "[2, 2]"});
  testing::expect_error([] { zeros({0}).item(); }, {"item", "0 elements"});
  Tensor t = zeros({3});
  EXPECT_NE(t.data_ptr<float>(), nullptr);
  testing::expect_error([&] { t.data_ptr<double>(); }, {"data_ptr", "float64", "float32[3]"});
  testing::expect_error([&] { t.data_ptr<int64_t>(); }, {"data_ptr", "int64"});
  // data_ptr of a view points at its first element.
  Tensor a = arange(10, kFloat32);
  EXPECT_EQ(a.slice(0, 3).data_ptr<float>(), a.data_ptr<float>() + 3);
  EXPECT_EQ(*a.slice(0, 3).data_ptr<float>(), 3);
}

TEST(Conversions, ToDType) {
  Tensor f = from_vector(std::vector<float>{2.7f, -2.7f, 0, 0.5f, -0.0f});
  EXPECT_EQ(f.to(kInt32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 0, 0}));
  EXPECT_EQ(f.to(kInt64).to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 0, 0}));
  EXPECT_EQ(f.to(kBool).to_vector<bool>(), (std::vector<bool>{true, true, false, true, false}));
  EXPECT_EQ(f.to(kFloat64).dtype(), kFloat64);
  EXPECT_EQ(f.to(kFloat64).to_vector<double>()[0], double(2.7f));
  Tensor b = from_vector(std::vector<bool>{true, false});
  EXPECT_EQ(b.to(kFloat32).to_vector<float>(), (std::vector<float>{1, 0}));
  EXPECT_EQ(from_vector(std::vector<int64_t>{3, 0, -2}).to(kBool).to_vector<bool>(),
            (std::vector<bool>{true, false, true}));
  EXPECT_EQ(from_vector(std::vector<double>{1e10}).to(kFloat32).item<float>(), 1e10f);
  EXPECT_TRUE(f.to(kFloat32).is_same(f));  // already that dtype: the same tensor, as torch
  // A conversion of a non-contiguous view keeps the values in order.
  Tensor m = arange(6, kFloat64).reshape({2, 3}).t();
  Tensor mi = m.to(kInt32);
  EXPECT_EQ(mi.sizes(), (Shape{3, 2}));
  EXPECT_EQ(mi.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(Conversions, ContiguousAndClone) {
  Tensor a = arange(6, kFloat32).reshape({2, 3});
  EXPECT_TRUE(a.contiguous().is_same(a));
  Tensor t = a.t();
  EXPECT_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_NE(c.raw_data_ptr(), a.raw_data_ptr());
  Tensor k = a.clone();
  EXPECT_NE(k.raw_data_ptr(), a.raw_data_ptr());
  k.fill_(9);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  a.fill_(1);
  EXPECT_EQ(k.to_vector<float>(), std::vector<float>(6, 9));
  Tensor kt = t.clone();  // cloning a view copies just the view's elements
  EXPECT_EQ(kt.sizes(), (Shape{3, 2}));
  EXPECT_TRUE(kt.is_contiguous());
  EXPECT_EQ(kt.to_vector<float>(), std::vector<float>(6, 1));
}

TEST(Metadata, SizesStridesDimNumel) {
  Tensor a = zeros({2, 3, 4});
  EXPECT_EQ(a.dim(), 3);
  EXPECT_EQ(a.numel(), 24);
  EXPECT_EQ(a.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(a.size(0), 2);
  EXPECT_EQ(a.size(-1), 4);
  EXPECT_EQ(a.stride(-2), 4);
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.storage_offset(), 0);
  EXPECT_EQ(a.element_size(), 4u);
  EXPECT_TRUE(a.is_floating_point());
  EXPECT_FALSE(zeros({2}, kInt64).is_floating_point());
  EXPECT_EQ(zeros({2}, kInt64).element_size(), 8u);
  EXPECT_EQ(zeros({2}, kBool).element_size(), 1u);
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_FALSE(a.permute({1, 0, 2}).is_contiguous());
  EXPECT_TRUE(a.slice(0, 0, 1).is_contiguous());
  EXPECT_FALSE(a.slice(2, 0, 2).is_contiguous());
  EXPECT_TRUE(zeros({3, 1}).t().is_contiguous());  // size-1 dims don't matter
  EXPECT_TRUE(zeros({0, 4}).t().is_contiguous());  // nor do empty tensors
  Tensor s = zeros({});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.strides().empty());
  EXPECT_EQ(zeros({5, 0, 2}).numel(), 0);
  testing::expect_error([&] { a.size(3); }, {"size", "out of range", "3"});
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  testing::expect_error([&] { undefined.sizes(); }, {"undefined"});
}

TEST(Runtime, AllcloseAndEqual) {
  Tensor a = from_vector(std::vector<double>{1, 2, std::nan(""), INFINITY});
  Tensor b = from_vector(std::vector<double>{1 + 1e-9, 2, std::nan(""), INFINITY});
  EXPECT_FALSE(allclose(a, b));  // NaNs differ unless equal_nan
  EXPECT_TRUE(allclose(a, b, 1e-5, 1e-8, true));
  EXPECT_FALSE(allclose(a, b, 0, 0, true));
  EXPECT_TRUE(allclose(from_vector(std::vector<float>{100}), from_vector(std::vector<float>{101}),
                       0.01, 0));
  EXPECT_FALSE(allclose(from_vector(std::vector<float>{100}), from_vector(std::vector<float>{102}),
                        0.01, 0));
  EXPECT_FALSE(allclose(zeros({2}), zeros({2, 1})));
  EXPECT_TRUE(allclose(zeros({2}), zeros({2}, kInt32)));
  EXPECT_TRUE(equal(arange(4), arange(4)));
  EXPECT_FALSE(equal(arange(4), arange(4, kInt32)));  // dtypes differ
  EXPECT_FALSE(equal(arange(4), arange(4).reshape({2, 2})));
  EXPECT_FALSE(equal(a, a));  // NaN != NaN, as torch.equal
  EXPECT_TRUE(equal(arange(6, kFloat32).reshape({2, 3}).t(),
                    from_vector(std::vector<float>{0, 3, 1, 4, 2, 5}, Shape{3, 2})));
}

TEST(Runtime, Threads) {
  int n = get_num_threads();
  EXPECT_GE(n, 1);
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
  set_num_threads(n);
  EXPECT_EQ(get_num_threads(), n);
}

}  // namespace
}  // namespace kiln
