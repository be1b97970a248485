// libtorch-style indexing against float64 reference loops: basic indices (slices, integers, None,
// Ellipsis, "..."), integer and boolean tensor indices (adjacent, non-adjacent, broadcast),
// index_put_, masked_fill, masked_select and nonzero, on several memory layouts; gradients,
// lazy recording and errors.
#include <functional>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using namespace kiln::indexing;
using testing::expect_close;
using testing::expect_error;
using testing::values;

// out[flat] = x[source(multi-index of flat in `shape`)] for every element of `shape`.
std::vector<double> gather_ref(
    const Tensor& x, const Shape& shape,
    const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& source) {
  const std::vector<double> v = values(x);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(v[testing::ravel(source(testing::unravel(i, shape)), x.sizes())]);
  return out;
}

int64_t wrap(int64_t i, int64_t n) {
  return i < 0 ? i + n : i;
}

TEST(Indexing, BasicIndicesAreViews) {
  const Tensor base = testing::random_tensor({5, 4, 3, 2}, kFloat64);
  for (const auto& [layout, x] : testing::layouts(base)) {
    SCOPED_TRACE(layout);
    const Tensor r = x.index({Slice(1, None, 2), 0, Ellipsis, None});
    expect_close(r,
                 gather_ref(base, {2, 3, 2, 1},
                            [](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{1 + 2 * i[0], 0, i[1], i[2]};
                            }),
                 {2, 3, 2, 1}, kFloat64);
    const Tensor s = x.index({"...", -1});
    expect_close(s,
                 gather_ref(base, {5, 4, 3},
                            [](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{i[0], i[1], i[2], 1};
                            }),
                 {5, 4, 3}, kFloat64);
    const Tensor t = x.index({None, Slice(None, -2), Slice(1), 2});
    expect_close(t,
                 gather_ref(base, {1, 3, 3, 2},
                            [](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{i[1], 1 + i[2], 2, i[3]};
                            }),
                 {1, 3, 3, 2}, kFloat64);
  }
  const Tensor x = testing::random_tensor({3, 2}, kFloat64);
  Tensor v = x.index({1});
  v.fill_(7);  // a view: writes reach x
  expect_close(x.index({1}), {7, 7}, {2}, kFloat64);
  EXPECT_EQ(x.index({true}).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(x.index({false}).sizes(), (Shape{0, 3, 2}));
  EXPECT_EQ(x.index({Slice(), full({}, true)}).sizes(), (Shape{3, 1, 2}));
  EXPECT_EQ(x.index({full({}, false)}).sizes(), (Shape{0, 3, 2}));
  EXPECT_EQ(x.index({}).sizes(), (Shape{3, 2}));
}

TEST(Indexing, IntegerTensorIndices) {
  const Tensor base = testing::random_tensor({5, 4, 3, 2}, kFloat64);
  const std::vector<int64_t> i1v{-1, 0, 2, 2};
  const Tensor i1 = from_vector(i1v);
  const std::vector<int64_t> p{3, -4}, q{0, 2, 1};
  const Tensor ip = from_vector(p, {2, 1}), iq = from_vector(q);
  for (const auto& [layout, x] : testing::layouts(base)) {
    SCOPED_TRACE(layout);
    expect_close(x.index({Slice(), i1}),
                 gather_ref(base, {5, 4, 3, 2},
                            [&](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{i[0], wrap(i1v[i[1]], 4), i[2], i[3]};
                            }),
                 {5, 4, 3, 2}, kFloat64);
    // Adjacent indexed dims keep their place; the indices broadcast to [2, 3].
    expect_close(x.index({Slice(), ip, iq}),
                 gather_ref(base, {5, 2, 3, 2},
                            [&](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{i[0], wrap(p[i[1]], 4), q[i[2]], i[3]};
                            }),
                 {5, 2, 3, 2}, kFloat64);
    // Separated by a slice: the indexed dims go first.
    expect_close(x.index({ip, Slice(), iq}),
                 gather_ref(base, {2, 3, 4, 2},
                            [&](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{wrap(p[i[0]], 5), i[2], q[i[1]], i[3]};
                            }),
                 {2, 3, 4, 2}, kFloat64);
    // With an integer and a slice in front.
    expect_close(x.index({1, Slice(1, 3), iq}),
                 gather_ref(base, {2, 3, 2},
                            [&](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{1, 1 + i[0], q[i[1]], i[2]};
                            }),
                 {2, 3, 2}, kFloat64);
  }
  // An empty index and a size-0 dim.
  EXPECT_EQ(base.index({Slice(), from_vector(std::vector<int64_t>{})}).sizes(),
            (Shape{5, 0, 3, 2}));
  const Tensor empty = zeros({0, 3});
  EXPECT_EQ(empty.index({Slice(), from_vector(std::vector<int64_t>{2, 0})}).sizes(), (Shape{0, 2}));
}

TEST(Indexing, BooleanMasks) {
  const Tensor base = testing::random_tensor({4, 3, 2}, kFloat64);
  for (const auto& [layout, x] : testing::layouts(base)) {
    SCOPED_TRACE(layout);
    std::vector<double> positive;
    for (double v : values(base))
      if (v > 0) positive.push_back(v);
    expect_close(x.index({x > 0}), positive, {static_cast<int64_t>(positive.size())}, kFloat64);
    expect_close(masked_select(x, x > 0), positive, {static_cast<int64_t>(positive.size())},
                 kFloat64);
    // A mask over the leading two dims keeps the rest.
    const Tensor m = x.select(2, 0) > 0;
    const std::vector<double> mv = values(m);
    std::vector<double> rows;
    int64_t count = 0;
    for (int64_t i = 0; i < 12; ++i) {
      if (!mv[i]) continue;
      ++count;
      for (int64_t k = 0; k < 2; ++k) rows.push_back(values(base)[i * 2 + k]);
    }
    expect_close(x.index({m}), rows, {count, 2}, kFloat64);
    // A mask after a slice.
    const Tensor m1 = from_vector(std::vector<bool>{true, false, true});
    expect_close(x.index({Slice(), m1, 1}),
                 gather_ref(base, {4, 2},
                            [](const std::vector<int64_t>& i) {
                              return std::vector<int64_t>{i[0], 2 * i[1], 1};
                            }),
                 {4, 2}, kFloat64);
  }
  // masked_select broadcasts the mask and the input.
  const Tensor row = from_vector(std::vector<double>{1, 2, 3});
  const Tensor mask = from_vector(std::vector<bool>{true, false}, Shape{2, 1});
  expect_close(masked_select(row, mask), {1, 2, 3}, {3}, kFloat64);
}

TEST(Indexing, NonzeroAgainstReference) {
  const Tensor x = from_vector(std::vector<int64_t>{0, 3, 0, -1, 0, 5}, {2, 3});
  expect_close(nonzero(x), {0, 1, 1, 0, 1, 2}, {3, 2}, kInt64);
  expect_close(x.nonzero(), {0, 1, 1, 0, 1, 2}, {3, 2}, kInt64);
  EXPECT_EQ(nonzero(zeros({0, 4})).sizes(), (Shape{0, 2}));
  EXPECT_EQ(nonzero(full({}, 2.0)).sizes(), (Shape{1, 0}));
  EXPECT_EQ(nonzero(full({}, 0.0)).sizes(), (Shape{0, 0}));
  const Tensor f = from_vector(std::vector<double>{0, std::nan(""), -0.0});
  expect_close(nonzero(f), {1}, {1, 1}, kInt64);  // NaN is nonzero, -0.0 is zero
  // Random shapes (size 0 and 1) and layouts: each nonzero element's multi-index, row by row;
  // masked_select of the same mask gives those elements.
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = testing::random_shape(0, 4, 4);
    const Tensor r = testing::random_tensor(shape, kInt64, -1, 2);
    const std::vector<double> rv = values(r);
    std::vector<double> expected, picked;
    int64_t count = 0;
    for (size_t i = 0; i < rv.size(); ++i) {
      if (rv[i] == 0) continue;
      ++count;
      picked.push_back(rv[i]);
      for (int64_t k : testing::unravel(static_cast<int64_t>(i), shape))
        expected.push_back(double(k));
    }
    for (const auto& [layout, laid] : testing::layouts(r)) {
      SCOPED_TRACE(layout + " " + ::testing::PrintToString(shape));
      expect_close(nonzero(laid), expected, {count, int64_t(shape.size())}, kInt64, 0, 0);
      expect_close(masked_select(laid, ne(laid, 0)), picked, {count}, kInt64, 0, 0);
    }
  }
}

TEST(Indexing, IndexPutAndMaskedFill) {
  const Tensor base = testing::random_tensor({4, 3}, kFloat64);
  std::vector<double> expected = values(base);
  for (double& v : expected)
    if (v > 0) v = 0.5;
  Tensor y = base.clone();
  y.index_put_({y > 0}, 0.5);
  expect_close(y, expected, {4, 3}, kFloat64);
  expect_close(masked_fill(base, base > 0, 0.5), expected, {4, 3}, kFloat64);
  expect_close(base.masked_fill(base > 0, full({}, 0.5, kFloat64)), expected, {4, 3}, kFloat64);
  Tensor z = base.clone();
  z.masked_fill_(z > 0, 0.5);
  expect_close(z, expected, {4, 3}, kFloat64);
  // The mask broadcasts to x; x's dtype is kept.
  const Tensor ints = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  expect_close(ints.masked_fill(from_vector(std::vector<bool>{false, true}), 9), {1, 9, 3, 9},
               {2, 2}, kInt64);

  // Tensor values broadcast to the indexed shape; slices and tensors mix.
  Tensor w = base.clone();
  w.index_put_({Slice(), 1}, from_vector(std::vector<double>{10, 11, 12, 13}));
  std::vector<double> ew = values(base);
  for (int64_t r = 0; r < 4; ++r) ew[r * 3 + 1] = 10 + r;
  expect_close(w, ew, {4, 3}, kFloat64);
  w.index_put_({from_vector(std::vector<int64_t>{0, -1})},
               from_vector(std::vector<double>{7, 8, 9}));
  for (int64_t c = 0; c < 3; ++c) ew[c] = ew[9 + c] = 7 + c;
  expect_close(w, ew, {4, 3}, kFloat64);
  // A repeated index: the last write wins.
  Tensor d = zeros({3}, kFloat64);
  d.index_put_({from_vector(std::vector<int64_t>{1, 1})}, from_vector(std::vector<double>{4, 5}));
  expect_close(d, {0, 5, 0}, {3}, kFloat64);
  // A strided (non-contiguous) destination is written in place.
  Tensor big = zeros({4, 6}, kFloat64);
  Tensor view = big.slice(1, 0, 6, 2);
  view.index_put_({Slice(), 2}, 1.0);
  EXPECT_EQ(big.sum().item<double>(), 4.0);
  expect_close(big.select(1, 4), {1, 1, 1, 1}, {4}, kFloat64);
}

TEST(Indexing, Gradients) {
  const Tensor x = testing::random_tensor({4, 3, 2}, kFloat64).requires_grad_();
  const Tensor idx = from_vector(std::vector<int64_t>{2, -1, 2});
  const Tensor i2 = from_vector(std::vector<int64_t>{0, 1, 0}, {3, 1});
  const Tensor mask = testing::random_tensor({4, 3}, kFloat64) > 0;
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return in[0].index({Slice(1), idx, None});
      },
      {x}));
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return in[0].index({i2, Slice(), idx.index({Slice(None, 2)}) - 1});
      },
      {x}));
  EXPECT_TRUE(
      testing::gradcheck([&](const std::vector<Tensor>& in) { return in[0].index({mask}); }, {x}));
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) { return masked_select(in[0], in[0] > 0); }, {x}));
  const Tensor v = full({}, 0.25, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) { return masked_fill(in[0], mask.unsqueeze(-1), in[1]); },
      {x, v}));
  const Tensor rows = testing::random_tensor({2, 3, 2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        Tensor c = in[0] * 1.0;
        c.index_put_({from_vector(std::vector<int64_t>{3, 0})}, in[1]);
        return c;
      },
      {x, rows}));
}

TEST(Indexing, RecordsLazily) {
  const Tensor x = testing::input({4, 3}, kFloat32);
  const Tensor idx = testing::input({5}, kInt64, -4, 4);
  const Tensor mask = testing::input({4, 3}, kBool);
  testing::check_lazy("index", [&] {
    Tensor y = x * 2;
    return std::vector<Tensor>{y.index({idx, Slice(1)}), masked_fill(y, mask, -1.0),
                               y.index({Slice(), 0}) + 1};
  });
  jit::Function f = jit::trace(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{masked_fill(in[0].sin(), mask, 0.0).index({Slice(), 1})};
      },
      {x});
  const Tensor x2 = testing::input({4, 3}, kFloat32);
  testing::expect_lazy_equal(f({x2})[0], masked_fill(x2.sin(), mask, 0.0).index({Slice(), 1}),
                             "traced masked_fill");
}

TEST(Indexing, BadIndicesRaiseAndLeaveInputs) {
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  expect_error(
      [&] {
        (void)x.index({Slice(), from_vector(std::vector<int64_t>{0, 3})});
      },
      {"index", "3", "out of bounds", "size 3"});
  expect_error([&] { (void)x.index({from_vector(std::vector<int64_t>{-3})}); },
               {"index", "-3", "size 2"});
  expect_error([&] { (void)x.index({0, 0, 0}); }, {"index", "too many indices", "float64[2, 3]"});
  expect_error([&] { (void)x.index({Ellipsis, "..."}); }, {"index", "single ellipsis"});
  expect_error([&] { (void)x.index({from_vector(std::vector<double>{0})}); },
               {"index", "integer or bool", "float64[1]"});
  expect_error(
      [&] {
        (void)x.index({from_vector(std::vector<bool>{true, false, true})});
      },
      {"index", "mask", "bool[3]", "[2]"});
  expect_error([&] { (void)x.index({"..:"}); }, {"index", "..:"});
  expect_error([&] { (void)x.index({Slice(None, None, -1)}); }, {"index", "step", "-1"});
  Tensor y = x.clone();
  expect_error(
      [&] {
        y.index_put_({Slice(), 0}, from_vector(std::vector<double>{1, 2, 3}));
      },
      {"index_put_", "float64[3]", "[2]"});
  expect_error([&] { y.index_put_({from_vector(std::vector<int64_t>{5})}, 1.0); },
               {"index", "5", "size 2"});
  expect_error([&] { (void)masked_fill(x, x, 0.0); }, {"masked_fill", "bool", "float64[2, 3]"});
  expect_error(
      [&] {
        (void)masked_fill(x, zeros({3, 2, 3}, kBool), 0.0);
      },
      {"masked_fill", "bool[3, 2, 3]", "float64[2, 3]"});
  expect_error([&] { (void)masked_fill(x, x > 0, zeros({2}, kFloat64)); },
               {"masked_fill", "0-dim", "float64[2]"});
  expect_error([&] { (void)masked_select(x, x); }, {"masked_select", "bool", "float64[2, 3]"});
  expect_close(x, {1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64);
  expect_close(y, {1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64);
}

}  // namespace
}  // namespace kiln
