// scatter (of a src or a value), scatter_reduce, index_copy, index_fill, masked_scatter, take,
// and the in-place forms (with index_add_ and scatter_add_): float64 reference loops over random
// shapes (size 0 and 1 dims, index smaller than src) and layouts in every dtype, gradients by
// gradcheck and at the points where torch's formulas decide (zero factors, tied extremes), lazy
// and traced runs against eager ones (a trace follows new index and mask values), and bad input
// raising kiln::Error without changing anything.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::rng;
using testing::values;
using In = std::vector<Tensor>;

const double kNan = std::numeric_limits<double>::quiet_NaN();

Tensor f64(std::vector<double> v) {
  return from_vector(v);
}
Tensor i64(std::vector<int64_t> v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return from_vector(v, shape);
}

int64_t pick(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

// Random positions in [0, n) of the given shape.
Tensor random_index(const Shape& shape, int64_t n) {
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<int64_t> v(static_cast<size_t>(count));
  for (int64_t& x : v) x = pick(0, std::max<int64_t>(n - 1, 0));
  return from_vector(v, shape);
}

// ------------------------------------------------------------ the float64 reference

// self with src combined in at index along d in index's row-major order, as documented:
// "none" assigns, the reductions combine (amax and amin propagate NaN), mean divides by the count.
std::vector<double> scatter_ref(const Tensor& self, int64_t d, const Tensor& index,
                                const Tensor& src, const std::string& reduce, bool include_self,
                                bool integral) {
  std::vector<double> out = values(self);
  const std::vector<double> s = values(src), idx = values(index);
  const Shape ss = self.dim() == 0 ? Shape{1} : self.sizes();
  const Shape is = index.dim() == 0 ? Shape{1} : index.sizes();
  const Shape srcs = src.dim() == 0 ? Shape{1} : src.sizes();
  std::vector<int64_t> count(out.size(), include_self ? 1 : 0);
  std::vector<bool> started(out.size(), include_self);
  for (size_t p = 0; p < idx.size(); ++p) {
    std::vector<int64_t> at = testing::unravel(static_cast<int64_t>(p), is);
    const double v = s[static_cast<size_t>(testing::ravel(at, srcs))];
    at[static_cast<size_t>(d)] = static_cast<int64_t>(idx[p]);
    const size_t o = static_cast<size_t>(testing::ravel(at, ss));
    double& r = out[o];
    ++count[o];
    if (!started[o] || reduce == "none") {
      r = v;
    } else if (reduce == "sum" || reduce == "mean") {
      r += v;
    } else if (reduce == "prod") {
      r *= v;
    } else if (reduce == "amax") {
      r = std::isnan(v) || std::isnan(r) ? kNan : std::max(r, v);
    } else {
      r = std::isnan(v) || std::isnan(r) ? kNan : std::min(r, v);
    }
    started[o] = true;
  }
  if (reduce == "mean")
    for (size_t o = 0; o < out.size(); ++o) {
      const double c = static_cast<double>(std::max<int64_t>(count[o], 1));
      out[o] = integral ? std::floor(out[o] / c) : out[o] / c;
    }
  return out;
}

const std::vector<std::string> kReduces = {"sum", "prod", "mean", "amax", "amin"};

TEST(Scatter, MatchesTheReferenceOverShapesLayoutsAndDtypes) {
  for (int trial = 0; trial < 60; ++trial) {
    const DType dtype = std::vector<DType>{kFloat64, kFloat32, kInt64, kInt32}[trial % 4];
    const Shape shape = testing::random_shape(trial % 10 == 0 ? 0 : 1, 3, 4);
    const int64_t rank = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
    const int64_t d = pick(0, rank - 1);
    const int64_t n = shape.empty() ? 1 : shape[static_cast<size_t>(d)];
    // index: at most self's size outside d (any size along d when self has a row to write);
    // src at least index's size everywhere.
    Shape is, srcs;
    for (int64_t k = 0; k < rank; ++k) {
      const int64_t limit = shape.empty() ? 1 : shape[static_cast<size_t>(k)];
      const int64_t size = k == d ? (n == 0 ? 0 : pick(0, 4)) : pick(0, limit);
      is.push_back(size);
      srcs.push_back(size + pick(0, 1));
    }
    if (shape.empty()) is = srcs = {};
    const Tensor base = testing::random_tensor(shape, dtype, -3, 4);
    // Values apart from zero for prod (no overflow), including some NaN in floating ones.
    Tensor src = testing::random_tensor(srcs, dtype, -3, 4);
    if (is_floating_point(dtype) && src.numel() > 2 && trial % 3 == 0)
      src.view({-1}).narrow(0, 1, 1).fill_(kNan);
    const Tensor index = random_index(is, n);
    for (const auto& [layout, self] : testing::layouts(base)) {
      const std::string what = layout + " self " + detail::describe(self) + " dim " +
                               std::to_string(d) + " index " + detail::describe(index) + " src " +
                               detail::describe(src);
      // The part of src that is scattered, for the reference.
      Tensor part = src;
      for (int64_t k = 0; k < static_cast<int64_t>(is.size()); ++k)
        part = part.narrow(k, 0, is[static_cast<size_t>(k)]);
      expect_close(scatter(self, d, index, src),
                   scatter_ref(self, d, index, part, "none", true, false), shape, dtype, 0, 0);
      for (const std::string& reduce : kReduces)
        for (bool include_self : {true, false}) {
          SCOPED_TRACE(what + " " + reduce + (include_self ? "" : " excluding self"));
          const Tensor r = scatter_reduce(self, d, index, src, reduce, include_self);
          const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
          expect_close(
              r, scatter_ref(self, d, index, part, reduce, include_self, !is_floating_point(dtype)),
              shape, dtype, tol, tol);
        }
    }
  }
}

TEST(Scatter, RepeatedPositionsTakeTheLastWriteAndAValueFillsEveryIndexedPosition) {
  const Tensor self = zeros({2, 3}, kFloat64);
  const Tensor index = i64({1, 0, 1, 1, 0, 1}, {2, 3});
  const Tensor src = f64({1, 2, 3, 4, 5, 6}).view({2, 3});
  // Column 0 gets row 1 from src[0][0] then src[1][0]: the last write wins.
  expect_close(scatter(self, 0, index, src), {0, 5, 0, 4, 0, 6}, {2, 3}, kFloat64, 0, 0);
  expect_close(scatter(self, 0, index, 7.5), {0, 7.5, 0, 7.5, 0, 7.5}, {2, 3}, kFloat64, 0, 0);
  expect_close(scatter(self, 1, i64({2, 2}, {2, 1}), src), {0, 0, 1, 0, 0, 4}, {2, 3}, kFloat64, 0,
               0);
  // A bool self, and a 0-dim self with a 0-dim index.
  expect_close(scatter(zeros({3}, kBool), 0, i64({2}), true), {0, 0, 1}, {3}, kBool, 0, 0);
  expect_close(
      scatter(full({}, 3.0, kFloat64), 0, full({}, int64_t{0}, kInt64), full({}, 9.0, kFloat64)),
      {9}, {}, kFloat64, 0, 0);
}

TEST(ScatterReduce, ExtremesPropagateNaNAndMeanRoundsIntegersDown) {
  const Tensor self = f64({1, 5, kNan});
  const Tensor index = i64({0, 0, 1, 2});
  const Tensor src = f64({kNan, 2, 3, 4});
  expect_close(scatter_reduce(self, 0, index, src, "amax"), {kNan, 5, kNan}, {3}, kFloat64, 0, 0);
  expect_close(scatter_reduce(self, 0, index, src, "amin", false), {kNan, 3, 4}, {3}, kFloat64, 0,
               0);
  const Tensor ints = i64({7, -7, 3});
  expect_close(scatter_reduce(ints, 0, i64({0, 1, 1}), i64({0, 0, 2}), "mean"), {3, -2, 3}, {3},
               kInt64, 0, 0);
  expect_close(scatter_reduce(ints, 0, i64({0, 1}), i64({4, 2}), "mean", false), {4, 2, 3}, {3},
               kInt64, 0, 0);
  // An integer amin without self starts from the value scattered, not from a sentinel.
  expect_close(scatter_reduce(i64({0, 0}), 0, i64({1}), i64({9}), "amin", false), {0, 9}, {2},
               kInt64, 0, 0);
}

// ------------------------------------------------------------ gradients

TEST(ScatterGrad, GradcheckEveryFormOverRandomIndices) {
  for (int trial = 0; trial < 4; ++trial) {
    // Distinct values (no ties among the extremes) away from zero.
    const Tensor self =
        (testing::random_tensor({3, 4}, kFloat64, 0.5, 2.0) + arange(12, kFloat64).view({3, 4}) * 3)
            .requires_grad_();
    const Tensor src = (testing::random_tensor({4, 5}, kFloat64, 0.5, 2.0) +
                        arange(20, kFloat64).view({4, 5}) * 3 + 0.7)
                           .requires_grad_();
    const Tensor index = random_index({4, 3}, 3);
    // Distinct positions for scatter: an element that a later write replaces still gets its
    // position's gradient (torch's), which finite differences cannot see.
    const Tensor distinct = argsort(testing::random_tensor({3, 4}), 0);
    EXPECT_TRUE(testing::gradcheck([&](const In& in) { return scatter(in[0], 0, distinct, in[1]); },
                                   {self, src}));
    EXPECT_TRUE(
        testing::gradcheck([&](const In& in) { return scatter(in[0], 0, index, 2.0); }, {self}));
    for (const std::string& reduce : kReduces)
      for (bool include_self : {true, false}) {
        SCOPED_TRACE(reduce + (include_self ? "" : " excluding self"));
        EXPECT_TRUE(testing::gradcheck(
            [&](const In& in) {
              return scatter_reduce(in[0], 0, index, in[1], reduce, include_self);
            },
            {self, src}));
      }
  }
  const Tensor self = testing::random_tensor({3, 4}, kFloat64, 0.5, 2.0).requires_grad_();
  const Tensor src = testing::random_tensor({3, 4}, kFloat64, 0.5, 2.0).requires_grad_();
  const Tensor index = random_index({3, 4}, 4);
  EXPECT_TRUE(testing::gradgradcheck(
      [&](const In& in) { return scatter_reduce(in[0], 1, index, in[1] * in[1], "prod"); },
      {self, src}));
  EXPECT_TRUE(testing::gradgradcheck(
      [&](const In& in) { return scatter(in[0] * in[0], 1, index, in[1]); }, {self, src}));
}

TEST(ScatterGrad, ZeroFactorsAndTiedExtremesFollowTorch) {
  // prod at one position of self 2 and src [0, 3]: the zero factor's gradient is the product of
  // the others; with two zeros every src gradient is 0.
  Tensor self = f64({2, 1}).requires_grad_();
  Tensor src = f64({0, 3, 5}).requires_grad_();
  const Tensor index = i64({0, 0, 1});
  Tensor out = scatter_reduce(self, 0, index, src, "prod");
  In g = autograd::grad({out.sum()}, {self, src});
  expect_close(g[0], {0, 5}, {2}, kFloat64, 0, 0);
  expect_close(g[1], {6, 0, 1}, {3}, kFloat64, 0, 0);
  src = f64({0, 0, 5}).requires_grad_();
  g = autograd::grad({scatter_reduce(self, 0, index, src, "prod").sum()}, {self, src});
  expect_close(g[0], {0, 5}, {2}, kFloat64, 0, 0);
  expect_close(g[1], {0, 0, 1}, {3}, kFloat64, 0, 0);
  // A zero self: its gradient is the product of the src values.
  self = f64({0, 1}).requires_grad_();
  src = f64({4, 3, 5}).requires_grad_();
  g = autograd::grad({scatter_reduce(self, 0, index, src, "prod").sum()}, {self, src});
  expect_close(g[0], {12, 5}, {2}, kFloat64, 0, 0);
  expect_close(g[1], {0, 0, 1}, {3}, kFloat64, 0, 0);
  // amax tied between self and two src values: a third each; excluding self, torch still counts
  // a self equal to the result among the ties, and passes self nothing.
  self = f64({1, 0}).requires_grad_();
  src = f64({1, 1, -1}).requires_grad_();
  g = autograd::grad({scatter_reduce(self, 0, index, src, "amax").sum()}, {self, src});
  expect_close(g[0], {1.0 / 3, 1}, {2}, kFloat64, 1e-15, 0);
  expect_close(g[1], {1.0 / 3, 1.0 / 3, 0}, {3}, kFloat64, 1e-15, 0);
  g = autograd::grad({scatter_reduce(self, 0, index, src, "amax", false).sum()}, {self, src});
  expect_close(g[0], {0, 0}, {2}, kFloat64, 0, 0);
  expect_close(g[1], {1.0 / 3, 1.0 / 3, 1}, {3}, kFloat64, 1e-15, 0);
  // scatter: written positions pass nothing back to self; every src element gets its position's
  // gradient, even a write that a later one replaced (torch's).
  self = f64({1, 2}).requires_grad_();
  src = f64({3, 4}).requires_grad_();
  g = autograd::grad({(scatter(self, 0, i64({1, 1}), src) * f64({10, 20})).sum()}, {self, src});
  expect_close(g[0], {10, 0}, {2}, kFloat64, 0, 0);
  expect_close(g[1], {20, 20}, {2}, kFloat64, 0, 0);
}

// ------------------------------------------------------------ index_copy, index_fill,
// masked_scatter, take

TEST(IndexCopyFill, MatchTheReferenceAndDifferentiate) {
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = testing::random_shape(1, 3, 4);
    const int64_t d = pick(0, static_cast<int64_t>(shape.size()) - 1);
    const int64_t n = shape[static_cast<size_t>(d)];
    // Distinct positions for index_copy (torch leaves repeated ones unspecified).
    std::vector<int64_t> rows(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng());
    rows.resize(static_cast<size_t>(pick(0, n)));
    const Tensor index = i64(rows, {static_cast<int64_t>(rows.size())});
    Shape source_shape = shape;
    source_shape[static_cast<size_t>(d)] = index.numel();
    const Tensor base = testing::random_tensor(shape, kFloat64);
    const Tensor source = testing::random_tensor(source_shape, kFloat64);
    const std::vector<double> sv = values(source);
    for (const auto& [layout, self] : testing::layouts(base)) {
      SCOPED_TRACE(layout + " " + detail::describe(self) + " dim " + std::to_string(d));
      std::vector<double> copied = values(self), filled = values(self);
      for (size_t p = 0; p < sv.size(); ++p) {
        std::vector<int64_t> at = testing::unravel(static_cast<int64_t>(p), source_shape);
        at[static_cast<size_t>(d)] = rows[static_cast<size_t>(at[static_cast<size_t>(d)])];
        copied[static_cast<size_t>(testing::ravel(at, shape))] = sv[p];
        filled[static_cast<size_t>(testing::ravel(at, shape))] = -0.5;
      }
      expect_close(index_copy(self, d, index, source), copied, shape, kFloat64, 0, 0);
      expect_close(index_fill(self, d, index, -0.5), filled, shape, kFloat64, 0, 0);
    }
  }
  const Tensor self = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const Tensor source = testing::random_tensor({3, 2}, kFloat64).requires_grad_();
  const Tensor value = full({}, 0.25, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [&](const In& in) {
        return index_copy(in[0], 1, i64({3, 0}), in[1]);
      },
      {self, source}));
  EXPECT_TRUE(testing::gradcheck(
      [&](const In& in) {
        return index_fill(in[0], 1, i64({3, 0, 3}), in[1]);
      },
      {self, value}));
  // A repeated index fills once: the value's gradient counts each filled element once.
  const Tensor g = autograd::grad({index_fill(self, 1, i64({3, 3}), value).sum()}, {value})[0];
  expect_close(g, {3}, {}, kFloat64, 0, 0);
  // 0-dim self.
  expect_close(index_copy(full({}, 1.0, kFloat64), 0, i64({0}), full({}, 2.0, kFloat64)), {2}, {},
               kFloat64, 0, 0);
  expect_close(index_fill(full({}, 1.0, kFloat64), 0, i64({0}), 5), {5}, {}, kFloat64, 0, 0);
}

TEST(MaskedScatter, FillsSelectedPositionsInOrderWithBroadcasting) {
  const Tensor self = f64({1, 2, 3, 4, 5, 6}).view({2, 3});
  const Tensor mask = from_vector(std::vector<bool>{true, false, true}, {1, 3});
  const Tensor source = f64({10, 20, 30, 40, 50});
  expect_close(masked_scatter(self, mask, source), {10, 2, 20, 30, 5, 40}, {2, 3}, kFloat64, 0, 0);
  // self broadcast with the mask.
  expect_close(
      masked_scatter(f64({1, 2, 3}), from_vector(std::vector<bool>{true, false}, {2, 1}), source),
      {10, 20, 30, 1, 2, 3}, {2, 3}, kFloat64, 0, 0);
  // Nothing selected, with an empty source.
  expect_close(masked_scatter(self, zeros({3}, kBool), zeros({0}, kFloat64)), values(self), {2, 3},
               kFloat64, 0, 0);
  // An empty source that requires grad: so does the result.
  const Tensor empty = zeros({0}, kFloat64).requires_grad_();
  EXPECT_TRUE(masked_scatter(self, zeros({3}, kBool), empty).requires_grad());
  // Gradients: self's where unselected, source's first elements from the selected positions.
  const Tensor s = self.detach().requires_grad_(), src = source.detach().requires_grad_();
  EXPECT_TRUE(testing::gradcheck([&](const In& in) { return masked_scatter(in[0], mask, in[1]); },
                                 {s, src}));
  const In g = autograd::grad(
      {(masked_scatter(s, mask, src) * f64({1, 2, 3, 4, 5, 6}).view({2, 3})).sum()}, {s, src});
  expect_close(g[0], {0, 2, 0, 0, 5, 0}, {2, 3}, kFloat64, 0, 0);
  expect_close(g[1], {1, 3, 4, 6, 0}, {5}, kFloat64, 0, 0);
}

TEST(Take, ReadsTheFlatElementsWithNegativePositions) {
  const Tensor base = f64({1, 2, 3, 4, 5, 6}).view({2, 3});
  for (const auto& [layout, x] : testing::layouts(base)) {
    SCOPED_TRACE(layout);
    expect_close(take(x, i64({0, -1, 4, -6}, {2, 2})), {1, 6, 5, 1}, {2, 2}, kFloat64, 0, 0);
    expect_close(take(x.t(), i64({1})), {4}, {1}, kFloat64, 0, 0);
  }
  expect_close(take(base, zeros({0, 2}, kInt64)), {}, {0, 2}, kFloat64, 0, 0);
  const Tensor x = testing::random_tensor({3, 2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return take(in[0], i64({5, -1, 0, 2}));
      },
      {x}));
}

// ------------------------------------------------------------ in place

TEST(ScatterInPlace, EachMatchesItsOutOfPlaceFormAndDifferentiates) {
  const Tensor base = testing::random_tensor({3, 4}, kFloat64);
  const Tensor index = random_index({2, 4}, 3);
  const Tensor src = testing::random_tensor({2, 4}, kFloat64);
  const Tensor rows = i64({2, 0});
  const Tensor mask = gt(base, 0);
  auto check = [&](const char* what, const std::function<void(Tensor&)>& in_place,
                   const Tensor& expected) {
    Tensor x = base.clone();
    in_place(x);
    EXPECT_TRUE(equal(x, expected)) << what << x << expected;
  };
  check(
      "scatter_", [&](Tensor& x) { x.scatter_(0, index, src); }, scatter(base, 0, index, src));
  check(
      "scatter_ value", [&](Tensor& x) { x.scatter_(0, index, 1.5); },
      scatter(base, 0, index, 1.5));
  check(
      "scatter_add_", [&](Tensor& x) { x.scatter_add_(0, index, src); },
      scatter_add(base, 0, index, src));
  check(
      "scatter_reduce_", [&](Tensor& x) { x.scatter_reduce_(0, index, src, "amin", false); },
      scatter_reduce(base, 0, index, src, "amin", false));
  check(
      "index_add_", [&](Tensor& x) { x.index_add_(0, rows, src); }, index_add(base, 0, rows, src));
  check(
      "index_copy_", [&](Tensor& x) { x.index_copy_(0, rows, src); },
      index_copy(base, 0, rows, src));
  check(
      "index_fill_", [&](Tensor& x) { x.index_fill_(1, rows, -1); }, index_fill(base, 1, rows, -1));
  check(
      "masked_scatter_", [&](Tensor& x) { x.masked_scatter_(mask, arange(12, kFloat64)); },
      masked_scatter(base, mask, arange(12, kFloat64)));
  // Through a view: the base sees the write.
  Tensor x = base.clone();
  x.t().scatter_(0, index.t().narrow(0, 0, 2), 0.0);
  EXPECT_TRUE(equal(x, scatter(base.t(), 0, index.t().narrow(0, 0, 2), 0.0).t()));
  // scatter_reduce_ of a non-leaf under autograd: its gradient reads self's old value.
  const Tensor leaf = testing::random_tensor({3, 4}, kFloat64, 0.5, 2).requires_grad_();
  const Tensor s = src.detach().requires_grad_();
  Tensor y = leaf * 1;
  y.scatter_reduce_(0, index, s, "prod");
  const In g = autograd::grad({y.sum()}, {leaf, s});
  const In expected = autograd::grad({scatter_reduce(leaf, 0, index, s, "prod").sum()}, {leaf, s});
  EXPECT_TRUE(allclose(g[0], expected[0], 1e-15, 0) && allclose(g[1], expected[1], 1e-15, 0));
}

// ------------------------------------------------------------ errors

TEST(ScatterErrors, BadInputRaisesAndChangesNothing) {
  const Tensor x = zeros({3, 4}, kFloat64);
  const Tensor index = i64({0, 1, 2, 0}, {1, 4});
  const Tensor src = ones({1, 4}, kFloat64);
  expect_error(
      [&] {
        (void)scatter(x, 0, i64({3}, {1, 1}), src);
      },
      {"scatter", "index 3 is out of range", "[0, 3)"});
  expect_error([&] { (void)scatter(x, 0, i64({-1}, {1, 1}), src); }, {"scatter", "out of range"});
  expect_error(
      [&] {
        (void)scatter(x, 0, index, ones({1, 4}, kFloat32));
      },
      {"scatter", "dtype", "float32[1, 4]", "float64[3, 4]"});
  expect_error(
      [&] {
        (void)scatter(x, 0, index, ones({1, 3}, kFloat64));
      },
      {"scatter", "larger than src", "int64[1, 4]", "float64[1, 3]"});
  expect_error(
      [&] {
        (void)scatter(x, 0, i64({0, 0, 0, 0, 0}, {1, 5}), ones({1, 5}, kFloat64));
      },
      {"scatter", "larger than self", "dimension 1"});
  expect_error(
      [&] {
        (void)scatter(x, 0, i64({0, 1, 2, 3}), src);
      },
      {"scatter", "number of dimensions"});
  expect_error([&] { (void)scatter(full({}, 1.0, kFloat64), 0, i64({0}), f64({2})); },
               {"scatter", "number of dimensions", "float64[]"});
  expect_error([&] { (void)scatter(x, 0, index.to(kInt32), src); }, {"scatter", "int64"});
  expect_error([&] { (void)scatter(x, 2, index, src); }, {"scatter", "dimension"});
  expect_error([&] { (void)scatter(x.to(kInt32), 0, index, 1e10); }, {"scatter", "int32"});
  expect_error([&] { (void)scatter_reduce(x, 0, index, src, "max"); },
               {"scatter_reduce", "sum, prod, mean, amax and amin", "\"max\""});
  expect_error([&] { (void)scatter_reduce(x.to(kBool), 0, index, src.to(kBool), "mean"); },
               {"scatter_reduce", "mean", "bool[3, 4]"});
  expect_error(
      [&] {
        (void)index_copy(x, 0, i64({3}), ones({1, 4}, kFloat64));
      },
      {"index_copy", "out of range"});
  expect_error(
      [&] {
        (void)index_copy(x, 0, i64({0}), ones({2, 4}, kFloat64));
      },
      {"index_copy", "float64[2, 4]", "float64[3, 4]"});
  expect_error([&] { (void)index_fill(x, 1, i64({0, 1}, {1, 2}), 1); }, {"index_fill", "1-D"});
  expect_error([&] { (void)index_fill(x, 1, i64({4}), 1); }, {"index_fill", "out of range"});
  expect_error([&] { (void)masked_scatter(x, gt(ones({4}), 0), ones({3}, kFloat64)); },
               {"masked_scatter", "selects 12", "float64[3]"});
  expect_error([&] { (void)masked_scatter(x, ones({4}), ones({12}, kFloat64)); },
               {"masked_scatter", "bool mask", "float32[4]"});
  expect_error([&] { (void)take(x, i64({12})); }, {"take", "index 12", "[-12, 12)"});
  expect_error([&] { (void)take(x, i64({-13})); }, {"take", "index -13"});
  // A failed in-place call leaves self as it was.
  Tensor y = arange(12, kFloat64).view({3, 4});
  const Tensor before = y.clone();
  expect_error([&] { y.scatter_(0, i64({5}, {1, 1}), 1.0); }, {"scatter", "out of range"});
  expect_error([&] { y.masked_scatter_(gt(y, -1), ones({2}, kFloat64)); }, {"masked_scatter"});
  expect_error([&] { y.index_copy_(1, i64({0, 9}), ones({3, 2}, kFloat64)); }, {"index_copy"});
  expect_error([&] { y.scatter_reduce_(0, index, src, "median"); }, {"scatter_reduce"});
  EXPECT_TRUE(equal(y, before));
}

// ------------------------------------------------------------ lazy and traced

In scatter_program(const In& in) {
  const Tensor& x = in[0];
  const Tensor& index = in[1];
  const Tensor& mask = in[2];
  const Tensor& rows = in[3];
  const Tensor y = x * 2;
  return In{scatter(y, 0, index, x.narrow(0, 0, 2)),
            scatter(x, 1, index.narrow(1, 0, 2), -1.0),
            scatter_reduce(y, 0, index, x, "amax", false),
            scatter_reduce(x, 0, index, y, "mean"),
            scatter_reduce(x, 0, index, y, "prod"),
            index_copy(x, 0, rows, y.narrow(0, 0, 2)),
            index_fill(y, 1, rows, 3.0),
            masked_scatter(x, mask, y.flatten().narrow(0, 0, 10)),
            take(y, index)};
}

TEST(ScatterModes, LazyAndTracedMatchEagerAndATraceFollowsNewIndices) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const Tensor index = random_index({2, 4}, 3);
  // At most 10 selected: the program's source has 10 elements.
  const Tensor few = lt(arange(12).view({3, 4}), 10);
  const Tensor mask = logical_and(gt(testing::random_tensor({3, 4}), 0), few);
  const Tensor rows = i64({2, 0});
  const In eager = scatter_program({x, index, mask, rows});
  In lazy;
  {
    LazyGuard on(true);
    lazy = scatter_program({x, index, mask, rows});
  }
  const jit::Function f = jit::trace(scatter_program, {x, index, mask, rows});
  // Saved and loaded: the scatter op's attributes (a string among them) round-trip.
  const std::string path = ::testing::TempDir() + "/kiln_scatter_program.kfn";
  f.save(path);
  const jit::Function loaded = jit::load(path);
  for (int call = 0; call < 3; ++call) {
    // New index, mask and row values on each call: the trace reads them, never bakes them in.
    const Tensor index2 = call == 0 ? index : random_index({2, 4}, 3);
    const Tensor mask2 = call == 0 ? mask : logical_and(gt(testing::random_tensor({3, 4}), 0), few);
    const Tensor rows2 = call == 0 ? rows : i64({pick(0, 1), 2});
    const In expected = scatter_program({x, index2, mask2, rows2});
    const In traced = f({x, index2, mask2, rows2});
    const In reloaded = loaded({x, index2, mask2, rows2});
    const auto [loss_traced, loss_eager] =
        testing::expect_replay_matches(traced, reloaded, call == 0 ? lazy : In{}, expected);
    testing::expect_lazy_equal(autograd::grad({loss_traced}, {x})[0],
                               autograd::grad({loss_eager}, {x})[0], "traced gradient");
  }
  // A replay whose mask selects more elements than the source holds raises.
  const Tensor all = gt(ones({3, 4}), 0);
  expect_error([&] { (void)f({x, index, all, rows}); }, {"out of range"});
  expect_error([&] { (void)loaded({x, index, all, rows}); }, {"out of range"});
  // A replay with an index out of range raises, as eager mode does.
  expect_error(
      [&] {
        (void)f({x, i64({0, 0, 0, 9, 0, 0, 0, 0}, {2, 4}), mask, rows});
      },
      {"out of range"});
}

}  // namespace
}  // namespace kiln
