// View ops: geometry, values, and that every view shares storage with its base (writes go through).
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::values;

Tensor iota(const Shape& shape, DType dt = kFloat32) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return arange(n, dt).reshape(shape);
}

// True when `v` reads `base`'s memory: a write through v shows in base.
bool shares_storage(Tensor base, Tensor v) {
  std::vector<double> before = values(base);
  v.fill_(-12345);
  bool changed = values(base) != before;
  base.copy_(from_vector(before, base.sizes()));  // restore
  return changed;
}

TEST(Views, ViewAndReshapeOfContiguous) {
  Tensor a = iota({2, 3, 4});
  Tensor v = a.view({6, 4});
  EXPECT_EQ(v.sizes(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_EQ(values(v), values(a));
  EXPECT_EQ(v.raw_data_ptr(), a.raw_data_ptr());
  EXPECT_EQ(a.view({-1}).sizes(), (Shape{24}));
  EXPECT_EQ(a.view({4, -1, 2}).sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(a.view({1, 24, 1}).strides(), (Shape{24, 1, 1}));
  Tensor r = a.reshape({3, 8});
  EXPECT_EQ(r.raw_data_ptr(), a.raw_data_ptr());  // no copy when a view is possible
  EXPECT_EQ(values(r), values(a));
  r.select(1, 2).fill_(100);  // elements 2, 10, 18 of the flat order
  auto av = values(a);
  EXPECT_EQ(av[2], 100);
  EXPECT_EQ(av[10], 100);
  EXPECT_EQ(av[18], 100);
  EXPECT_EQ(av[3], 3);
  // 0-dim and size-0 reshapes.
  Tensor s = full({}, 7.0f);
  EXPECT_EQ(s.view({1, 1}).sizes(), (Shape{1, 1}));
  EXPECT_EQ(s.reshape({-1}).sizes(), (Shape{1}));
  Tensor e = zeros({0, 3});
  EXPECT_EQ(e.view({3, 0, 5}).sizes(), (Shape{3, 0, 5}));
  EXPECT_EQ(e.reshape({-1, 3}).sizes(), (Shape{0, 3}));
}

TEST(Views, ViewOfNonContiguousWhenCompatible) {
  Tensor a = iota({4, 6});
  Tensor t = a.t();              // [6, 4] strides [1, 6]
  Tensor u = t.view({6, 2, 2});  // splitting the last dim keeps it a view
  EXPECT_EQ(u.strides(), (Shape{1, 12, 6}));
  EXPECT_TRUE(shares_storage(a, u));
  EXPECT_EQ(values(u), values(t));
  Tensor s = a.slice(1, 0, 4);  // [4, 4] strides [6, 1]
  EXPECT_EQ(s.view({2, 2, 4}).strides(), (Shape{12, 6, 1}));
  EXPECT_EQ(values(s.view({2, 2, 4})), values(s));
}

TEST(Views, ViewOnNonViewableLayoutSuggestsReshape) {
  Tensor a = iota({3, 4});
  testing::expect_error([&] { a.t().view({12}); }, {"view", "reshape", "[12]", "[4, 3]"});
  testing::expect_error([&] { a.view({5, 3}); }, {"view", "[5, 3]", "12"});
  testing::expect_error([&] { a.view({-1, -1}); }, {"view", "only one dimension"});
}

TEST(Views, ReshapeCopiesOnlyWhenNeeded) {
  Tensor a = iota({3, 4});
  Tensor r = a.t().reshape({12});  // needs a copy
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_FALSE(shares_storage(a, r));
  EXPECT_EQ(a.to_vector<float>()[0], 0);
  Tensor v = a.t().reshape({4, 3});  // the same shape: still a view
  EXPECT_TRUE(shares_storage(a, v));
  Tensor w = a.unsqueeze(0).reshape({3, 2, 2});
  EXPECT_TRUE(shares_storage(a, w));
}

TEST(Views, ReshapeOfExpandedAndSlicedViews) {
  Tensor row = from_vector(std::vector<float>{1, 2, 3});
  Tensor e = row.expand({2, 3});
  Tensor flat = e.reshape({6});  // stride-0 dims can't merge: a copy
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_FALSE(shares_storage(row, flat));
  EXPECT_EQ(e.reshape({2, 1, 3}).strides(), (Shape{0, 3, 1}));  // only inserting a 1: a view
  Tensor a = iota({4, 6});
  // Every other column of a 6-wide row is evenly spaced in memory, so it flattens as a view...
  Tensor even = a.slice(1, 0, 6, 2);  // [4, 3] strides [6, 2]
  EXPECT_EQ(even.reshape({12}).strides(), (Shape{2}));
  EXPECT_TRUE(shares_storage(a, even.reshape({12})));
  // ...but the first two of them are not.
  Tensor cols = a.slice(1, 0, 4, 2);  // [4, 2] strides [6, 2]
  Tensor r = cols.reshape({8});
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 2, 6, 8, 12, 14, 18, 20}));
  EXPECT_FALSE(shares_storage(a, r));
  EXPECT_TRUE(shares_storage(a, cols.reshape({2, 2, 2})));
  EXPECT_EQ(values(cols.reshape({2, 2, 2})), values(cols));
}

TEST(Views, PermuteTransposeT) {
  Tensor a = iota({2, 3, 4});
  Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(p[i][j][k].item<float>(), a[j][k][i].item<float>());
  EXPECT_EQ(a.permute({-1, 0, 1}).sizes(), p.sizes());
  EXPECT_TRUE(shares_storage(a, p));
  Tensor t = a.transpose(0, 2);
  EXPECT_EQ(t.sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_EQ(a.transpose(-1, -3).strides(), t.strides());
  EXPECT_TRUE(shares_storage(a, t));
  Tensor m = iota({2, 3});
  EXPECT_EQ(m.t().sizes(), (Shape{3, 2}));
  EXPECT_EQ(m.t().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(iota({5}).t().sizes(), (Shape{5}));
  EXPECT_EQ(full({}, 1.0f).t().dim(), 0);
  testing::expect_error([&] { a.t(); }, {"t", "float32[2, 3, 4]"});
  testing::expect_error([&] { a.permute({0, 0, 1}); }, {"permute", "more than once"});
  testing::expect_error([&] { a.permute({0, 1}); }, {"permute", "float32[2, 3, 4]"});
}

TEST(Views, UnsqueezeSqueeze) {
  Tensor a = iota({2, 3});
  EXPECT_EQ(a.unsqueeze(0).sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(a.unsqueeze(1).sizes(), (Shape{2, 1, 3}));
  EXPECT_EQ(a.unsqueeze(2).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(a.unsqueeze(-1).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(a.unsqueeze(-3).sizes(), (Shape{1, 2, 3}));
  EXPECT_TRUE(a.unsqueeze(1).is_contiguous());
  EXPECT_EQ(full({}, 2.0f).unsqueeze(0).sizes(), (Shape{1}));
  Tensor b = iota({1, 3, 1, 2});
  EXPECT_EQ(b.squeeze().sizes(), (Shape{3, 2}));
  EXPECT_EQ(b.squeeze(0).sizes(), (Shape{3, 1, 2}));
  EXPECT_EQ(b.squeeze(2).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(b.squeeze(-2).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(b.squeeze(1).sizes(), (Shape{1, 3, 1, 2}));  // not size 1: unchanged
  EXPECT_EQ(iota({1, 1}).squeeze().dim(), 0);
  EXPECT_EQ(values(b.squeeze()), values(b));
  EXPECT_TRUE(shares_storage(b, b.squeeze()));
  EXPECT_TRUE(shares_storage(a, a.unsqueeze(1)));
  testing::expect_error([&] { a.unsqueeze(3); }, {"unsqueeze", "out of range"});
  testing::expect_error([&] { b.squeeze(4); }, {"squeeze", "out of range"});
}

TEST(Views, ExpandAndExpandAs) {
  Tensor a = from_vector(std::vector<float>{1, 2, 3}, Shape{3, 1});
  Tensor e = a.expand({2, 3, 4});
  EXPECT_EQ(e.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) expected.push_back(j + 1);
  EXPECT_EQ(values(e), expected);
  EXPECT_EQ(a.expand({-1, 5}).sizes(), (Shape{3, 5}));
  Tensor like = zeros({7, 3, 2});
  EXPECT_EQ(a.expand_as(like).sizes(), (Shape{7, 3, 2}));
  // Writing through one element of an expanded view changes the base element.
  Tensor base = zeros({3});
  base.expand({4, 3})[2].copy_(from_vector(std::vector<float>{5, 6, 7}));
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{5, 6, 7}));
  testing::expect_error([&] { a.expand({3, 2, 2}).expand({4}); }, {"expand"});
  testing::expect_error([&] { a.expand({2, 4}); }, {"expand", "3", "[2, 4]"});
}

TEST(Views, NarrowSliceSelect) {
  Tensor a = iota({4, 5});
  Tensor n = a.narrow(1, 1, 3);
  EXPECT_EQ(n.sizes(), (Shape{4, 3}));
  EXPECT_EQ(n[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(a.narrow(0, -2, 2)[0].to_vector<float>(), (std::vector<float>{10, 11, 12, 13, 14}));
  EXPECT_TRUE(shares_storage(a, n));
  // Slices with steps and negative bounds, as Python's a[:, start:end:step].
  Tensor s = a.slice(1, 0, std::nullopt, 2);
  EXPECT_EQ(s.sizes(), (Shape{4, 3}));
  EXPECT_EQ(s.strides(), (Shape{5, 2}));
  EXPECT_EQ(s[1].to_vector<float>(), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(a.slice(1, -3)[0].to_vector<float>(), (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(a.slice(1, 1, -1)[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(a.slice(1, -4, -1, 2)[0].to_vector<float>(), (std::vector<float>{1, 3}));
  EXPECT_EQ(a.slice(1, 1, 100, 3)[0].to_vector<float>(), (std::vector<float>{1, 4}));
  EXPECT_EQ(a.slice(1, -100, 2)[0].to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(a.slice(1, 3, 1).sizes(), (Shape{4, 0}));
  EXPECT_EQ(a.slice(0, 1, 4, 2).to_vector<float>(),
            (std::vector<float>{5, 6, 7, 8, 9, 15, 16, 17, 18, 19}));
  EXPECT_TRUE(shares_storage(a, a.slice(0, 1, 4, 2)));
  EXPECT_EQ(a.slice(0, 1).storage_offset(), 5);
  // Select removes the dim; negative indices count from the end.
  EXPECT_EQ(a.select(1, -1).to_vector<float>(), (std::vector<float>{4, 9, 14, 19}));
  EXPECT_EQ(a.select(0, -4).to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a[2][3].item<float>(), 13);
  EXPECT_EQ(a[-1][-1].item<float>(), 19);
  EXPECT_EQ(a[1].dim(), 1);
  a[3][0].fill_(-1);
  EXPECT_EQ(a.to_vector<float>()[15], -1);
  testing::expect_error([&] { a.select(0, 4); }, {"select", "index 4", "size 4"});
  testing::expect_error([&] { a.select(1, -6); }, {"select", "-6"});
  testing::expect_error([&] { a.narrow(1, 3, 3); }, {"narrow", "float32[4, 5]"});
  testing::expect_error([&] { a.slice(0, 0, 2, 0); }, {"slice", "step"});
}

TEST(Views, Flatten) {
  Tensor a = iota({2, 3, 4, 5});
  EXPECT_EQ(a.flatten().sizes(), (Shape{120}));
  EXPECT_EQ(a.flatten(1).sizes(), (Shape{2, 60}));
  EXPECT_EQ(a.flatten(1, 2).sizes(), (Shape{2, 12, 5}));
  EXPECT_EQ(a.flatten(-2, -1).sizes(), (Shape{2, 3, 20}));
  EXPECT_EQ(a.flatten(2, 2).sizes(), a.sizes());
  EXPECT_EQ(full({}, 3.0f).flatten().sizes(), (Shape{1}));
  EXPECT_TRUE(shares_storage(a, a.flatten(1, 2)));
  Tensor t = a.transpose(0, 3);  // not flattenable without a copy
  Tensor f = t.flatten();
  EXPECT_EQ(values(f), values(t.contiguous()));
  EXPECT_FALSE(shares_storage(a, f));
}

TEST(Views, ChunkSplitUnbind) {
  Tensor a = iota({7, 2});
  auto c = a.chunk(3);  // 3, 3, 1
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].sizes(), (Shape{3, 2}));
  EXPECT_EQ(c[2].sizes(), (Shape{1, 2}));
  EXPECT_EQ(c[2].to_vector<float>(), (std::vector<float>{12, 13}));
  auto c4 = iota({6}).chunk(4);  // ceil(6/4) = 2 per chunk: 3 chunks, as torch
  ASSERT_EQ(c4.size(), 3u);
  EXPECT_EQ(c4[2].to_vector<float>(), (std::vector<float>{4, 5}));
  auto cols = a.chunk(2, 1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[1].to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11, 13}));
  auto s = a.split(3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].to_vector<float>(), (std::vector<float>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(s[2].sizes(), (Shape{1, 2}));
  auto ss = a.split(std::vector<int64_t>{1, 0, 6});
  ASSERT_EQ(ss.size(), 3u);
  EXPECT_EQ(ss[0].sizes(), (Shape{1, 2}));
  EXPECT_EQ(ss[1].sizes(), (Shape{0, 2}));
  EXPECT_EQ(ss[2].sizes(), (Shape{6, 2}));
  EXPECT_EQ(ss[2][0].to_vector<float>(), (std::vector<float>{2, 3}));
  auto u = a.unbind(1);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].sizes(), (Shape{7}));
  EXPECT_EQ(u[0].to_vector<float>(), (std::vector<float>{0, 2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(a.unbind().size(), 7u);
  // All of them are views.
  c[1].fill_(0);
  s[2].fill_(1);
  u[1][0].fill_(-1);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, -1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 1, 1}));
  testing::expect_error([&] { a.split(std::vector<int64_t>{3, 3}); }, {"split", "[3, 3]", "7"});
  testing::expect_error([&] { a.chunk(0); }, {"chunk", "positive"});
}

// Random views of random tensors: the view's values match an index computation on the base, and a
// write through the view lands in the base element it names.
TEST(Views, RandomChainsWriteThrough) {
  auto& g = testing::rng();
  for (int iter = 0; iter < 200; ++iter) {
    Shape shape = testing::random_shape(1, 4, 5, false);
    Tensor base = iota(shape, kFloat64);
    Tensor v = base;
    for (int step = 0; step < 3; ++step) {
      int op = std::uniform_int_distribution<int>(0, 3)(g);
      int64_t d = std::uniform_int_distribution<int64_t>(0, v.dim() - 1)(g);
      if (op == 0 && v.dim() >= 2) {
        v = v.transpose(d, (d + 1) % v.dim());
      } else if (op == 1 && v.size(d) > 1) {
        v = v.slice(d, 1, std::nullopt, 2);
      } else if (op == 2 && v.dim() >= 2) {
        v = v.select(d, v.size(d) - 1);
      } else {
        v = v.unsqueeze(d);
      }
    }
    // The values of a view are base elements: the storage offset plus strides.
    std::vector<double> bv = values(base), vv = values(v);
    for (int64_t i = 0; i < v.numel(); ++i) {
      auto idx = testing::unravel(i, v.sizes());
      int64_t off = v.storage_offset();
      for (int64_t k = 0; k < v.dim(); ++k) off += idx[k] * v.stride(k);
      ASSERT_EQ(vv[i], bv[off]);
    }
    if (v.numel() == 0) continue;
    v.add_(1000);
    std::vector<double> after = values(base);
    int64_t changed = 0;
    for (size_t i = 0; i < after.size(); ++i) changed += after[i] == bv[i] + 1000;
    EXPECT_EQ(changed, v.numel());
  }
}

}  // namespace
}  // namespace kiln
