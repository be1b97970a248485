// cummax, cummin, logcumsumexp, searchsorted and bucketize: plain reference loops (long double for
// logcumsumexp) over random shapes (size 0 and 1), every dim, every dtype and non-contiguous
// layouts, with ties, infinities and NaN; gradients by gradcheck and gradgradcheck; lazy and traced
// runs against eager ones with new values on each replay; bad input raising kiln::Error.
#include <cmath>
#include <limits>
#include <string>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/tensor_impl.h"
#include "tests/lib/lines.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::for_each_line;
using testing::pick;
using testing::values;
using In = std::vector<Tensor>;

const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Small integers (many ties) with, for floating dtypes, some NaN and infinities.
Tensor tied_values(const Shape& shape, DType dtype) {
  Tensor t = testing::random_tensor(shape, kFloat64, -3, 3).round();
  if (is_floating_point(dtype)) {
    const Tensor u = testing::random_tensor(shape, kFloat64, 0, 1);
    t = masked_fill(masked_fill(masked_fill(t, lt(u, 0.15), -kInf), lt(u, 0.1), kInf), lt(u, 0.05),
                    kNan);
  }
  return dtype == kBool ? gt(t, 0) : t.to(dtype);
}

// ------------------------------------------------------------ cummax and cummin

TEST(CumExtremes, MatchAReferenceLoopOverShapesDimsDtypesAndLayouts) {
  for (int trial = 0; trial < 60; ++trial) {
    const DType dtype = std::vector<DType>{kBool, kInt32, kInt64, kFloat32, kFloat64}[trial % 5];
    const Shape shape = testing::random_shape(0, 3, 5);
    const int64_t d = shape.empty() ? 0 : pick(0, static_cast<int64_t>(shape.size()) - 1);
    const Tensor x = tied_values(shape, dtype);
    const std::vector<double> xv = values(x);
    for (bool largest : {true, false}) {
      // torch's rule: a NaN replaces anything, nothing but a NaN replaces a NaN, ties move on.
      std::vector<double> best(xv.size()), index(xv.size());
      for_each_line(shape, d, [&](int64_t first, int64_t stride, int64_t size) {
        double b = 0, at = 0;
        for (int64_t k = 0; k < size; ++k) {
          const double v = xv[first + k * stride];
          if (k == 0 || std::isnan(v) || (!std::isnan(b) && (largest ? v >= b : v <= b)))
            b = v, at = static_cast<double>(k);
          best[first + k * stride] = b;
          index[first + k * stride] = at;
        }
      });
      for (const auto& [layout, laid] : testing::layouts(x)) {
        SCOPED_TRACE(layout + (largest ? " cummax " : " cummin ") + detail::describe(x) + " dim " +
                     std::to_string(d));
        const auto [v, i] = largest ? cummax(laid, d) : laid.cummin(d - x.dim());
        expect_close(v, best, shape, dtype, 0, 0);
        expect_close(i, index, shape, kInt64, 0, 0);
      }
    }
  }
}

TEST(CumExtremes, GradientsGoToTheIndicesAndPassGradcheck) {
  // Ties: the gradient goes to the element the index names (the last of equal values).
  const Tensor x = from_vector(std::vector<double>{1, 3, 3, 2}, {4}).requires_grad_();
  std::get<0>(cummax(x, 0)).sum().backward();
  expect_close(x.grad(), {1, 1, 2, 0}, {4}, kFloat64, 0, 0);
  const Tensor y = testing::random_tensor({3, 4, 2}, kFloat64).requires_grad_();
  for (int64_t d : {0, 1, -1}) {
    SCOPED_TRACE("dim " + std::to_string(d));
    EXPECT_TRUE(
        testing::gradcheck([d](const In& in) { return In{std::get<0>(cummax(in[0], d))}; }, {y}));
    EXPECT_TRUE(testing::gradgradcheck(
        [d](const In& in) { return In{std::get<0>(cummin(in[0], d)) * in[0]}; }, {y}));
  }
  // A 0-dim tensor is its own line.
  const Tensor s = full({}, 2.5, kFloat64).requires_grad_();
  const auto [v, i] = cummax(s, -1);
  EXPECT_EQ(v.item<double>(), 2.5);
  EXPECT_EQ(i.item<int64_t>(), 0);
  EXPECT_EQ(i.dim(), 0);
  v.backward();
  EXPECT_EQ(s.grad().item<double>(), 1.0);
}

// ------------------------------------------------------------ logcumsumexp

TEST(LogCumSumExp, MatchesALongDoubleReferenceWithoutOverflow) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Shape shape = testing::random_shape(0, 3, 5);
    const int64_t d = shape.empty() ? 0 : pick(0, static_cast<int64_t>(shape.size()) - 1);
    // Values up to 1000 (e^1000 overflows even float64), and every tenth trial infinities.
    const double scale = trial % 3 == 0 ? 1000 : 3;
    Tensor x = testing::random_tensor(shape, dtype, -scale, scale);
    if (trial % 10 == 0) x = tied_values(shape, dtype);
    const std::vector<double> xv = values(x);
    std::vector<double> expected(xv.size());
    for_each_line(shape, d, [&](int64_t first, int64_t stride, int64_t size) {
      long double top = -kInf, total = 0;  // sum of e^(x - top)
      for (int64_t k = 0; k < size; ++k) {
        const long double v = xv[first + k * stride];
        if (std::isnan(v) || std::isnan(top)) {
          top = NAN;
        } else if (v > top) {
          total = (std::isinf(top) ? 0 : total * std::exp(top - v)) + 1;
          top = v;
        } else if (!std::isinf(v) || v > 0) {
          total += std::isinf(v) ? 1 : std::exp(v - top);
        }
        expected[first + k * stride] = std::isnan(top)   ? kNan
                                       : std::isinf(top) ? double(top)
                                                         : double(top + std::log(total));
      }
    });
    for (const auto& [layout, laid] : testing::layouts(x)) {
      SCOPED_TRACE(layout + " " + detail::describe(x) + " dim " + std::to_string(d));
      const double tol = dtype == kFloat32 ? 2e-7 : 1e-13;
      expect_close(logcumsumexp(laid, d), expected, shape, dtype, tol, tol);
      expect_close(laid.logcumsumexp(d - x.dim()), expected, shape, dtype, tol, tol);
    }
  }
}

TEST(LogCumSumExp, GradcheckAndGradgradcheckWithLargeAndEqualValues) {
  const Tensor x = testing::random_tensor({3, 5}, kFloat64).requires_grad_();
  // Large values: e^x overflows, the log-space gradient does not.
  const Tensor big = (testing::random_tensor({2, 4}, kFloat64) + 800.0).requires_grad_();
  for (const Tensor& t : {x, big})
    for (int64_t d : {0, 1}) {
      SCOPED_TRACE(detail::describe(t) + " dim " + std::to_string(d));
      EXPECT_TRUE(
          testing::gradcheck([d](const In& in) { return In{logcumsumexp(in[0], d)}; }, {t}));
      EXPECT_TRUE(
          testing::gradgradcheck([d](const In& in) { return In{logcumsumexp(in[0], d)}; }, {t}));
    }
  // A NaN in the incoming gradient is dropped, as by torch's formula: the same gradient as a 0
  // there.
  const Tensor z = from_vector(std::vector<double>{0.5, -1, 2, 0.25}, {4}).requires_grad_();
  const Tensor nan_grad = from_vector(std::vector<double>{1, 1, kNan, 1}, {4});
  const Tensor zero_grad = from_vector(std::vector<double>{1, 1, 0, 1}, {4});
  const Tensor with_nan = autograd::grad({logcumsumexp(z, 0)}, {z}, {nan_grad})[0];
  const Tensor with_zero = autograd::grad({logcumsumexp(z, 0)}, {z}, {zero_grad})[0];
  expect_close(with_nan, values(with_zero), {4}, kFloat64, 0, 0);
  // The gradient of the last element of a line is the softmax of the line (within the rounding of
  // x + log(...) near 1000, 1e-13).
  const Tensor line = from_vector(std::vector<double>{1000, 1000, 999}, {3}).requires_grad_();
  logcumsumexp(line, 0).select(0, 2).backward();
  const double e = std::exp(-1.0);
  expect_close(line.grad(), {1 / (2 + e), 1 / (2 + e), e / (2 + e)}, {3}, kFloat64, 1e-12, 0);
}

// ------------------------------------------------------------ searchsorted and bucketize

// The insertion index of v into a sorted line with NaN the largest value: the count of elements
// before it (left), or not after it (right).
int64_t insertion(const std::vector<double>& line, double v, bool right) {
  auto before = [](double a, double b) { return std::isnan(b) ? !std::isnan(a) : a < b; };
  int64_t count = 0;
  for (double s : line) count += right ? !before(v, s) : before(s, v);
  return count;
}

// Sorted rows (NaN last) of small integers, many equal, in dtype.
Tensor sorted_rows(const Shape& shape, DType dtype) {
  Tensor t = std::get<0>(sort(tied_values(shape, kFloat64), -1));
  if (!is_floating_point(dtype)) t = masked_fill(clamp(t, -9, 9), isnan(t), 9.0);  // still sorted
  return t.to(dtype);
}

TEST(SearchSorted, MatchesAReferenceCountOverShapesDtypesSidesAndLayouts) {
  for (int trial = 0; trial < 60; ++trial) {
    const DType dtype = std::vector<DType>{kInt32, kInt64, kFloat32, kFloat64}[trial % 4];
    const int64_t length = pick(trial % 7 == 0 ? 0 : 1, 6);
    // A 1-D sequence for any values, or one line per row of values.
    const bool one_d = trial % 3 == 0;
    Shape values_shape = testing::random_shape(one_d ? 0 : 1, 3, 4);
    Shape seq_shape{length};
    if (!one_d) {
      seq_shape = values_shape;
      seq_shape.back() = length;
    }
    const Tensor seq = sorted_rows(seq_shape, dtype);
    const Tensor v = tied_values(values_shape, dtype);
    const std::vector<double> sv = values(seq), vv = values(v);
    const int64_t row = one_d || values_shape.back() == 0 ? std::max<int64_t>(int64_t(vv.size()), 1)
                                                          : values_shape.back();
    for (bool right : {false, true}) {
      std::vector<double> expected;
      for (size_t i = 0; i < vv.size(); ++i) {
        const int64_t line = one_d ? 0 : int64_t(i) / row;
        const std::vector<double> l(sv.begin() + line * length, sv.begin() + (line + 1) * length);
        expected.push_back(double(insertion(l, vv[i], right)));
      }
      for (const auto& [layout, laid] : testing::layouts(seq)) {
        SCOPED_TRACE(layout + (right ? " right " : " left ") + detail::describe(seq) + " into " +
                     detail::describe(v));
        expect_close(searchsorted(laid, v, false, right), expected, values_shape, kInt64, 0, 0);
        expect_close(searchsorted(laid, v, true, false, right ? "right" : "left"), expected,
                     values_shape, kInt32, 0, 0);
        if (one_d) {
          expect_close(bucketize(v, laid, false, right), expected, values_shape, kInt64, 0, 0);
        }
      }
    }
  }
}

TEST(SearchSorted, SortersScalarsPromotionAndEmptySequences) {
  // A sorter: the indices that sort the sequence.
  const Tensor unsorted = from_vector(std::vector<double>{3, 1, 2, 5, 4}, {5});
  const Tensor sorter = argsort(unsorted);
  const Tensor v = from_vector(std::vector<double>{0, 2, 2.5, 6}, {4});
  expect_close(searchsorted(unsorted, v, false, false, std::nullopt, sorter), {0, 1, 2, 5}, {4},
               kInt64, 0, 0);
  expect_close(searchsorted(unsorted, v, false, true, std::nullopt, sorter), {0, 2, 2, 5}, {4},
               kInt64, 0, 0);
  // Scalars, and dtypes promoted as torch: 2.5 into integers is not truncated to 2.
  const Tensor ints = arange(1, 4);
  EXPECT_EQ(searchsorted(ints, 2).item<int64_t>(), 1);
  EXPECT_EQ(searchsorted(ints, 2.5).item<int64_t>(), 2);
  EXPECT_EQ(searchsorted(ints, 2, false, true).item<int64_t>(), 2);
  EXPECT_EQ(searchsorted(ints, from_vector(std::vector<double>{2.5}, {1})).item<int64_t>(), 2);
  EXPECT_EQ(bucketize(1.5, from_vector(std::vector<double>{1, 2}, {2})).item<int64_t>(), 1);
  EXPECT_EQ(searchsorted(ints, 2).dim(), 0);
  // float64 values against a float32 sequence compare in float64.
  const Tensor f32 = from_vector(std::vector<double>{0.1, 0.2}, {2}).to(kFloat32);
  // 0.100000002 rounds to float(0.1) in float32, and is above it in float64.
  EXPECT_EQ(searchsorted(f32, full({1}, 0.100000002, kFloat64)).item<int64_t>(), 1);
  // An empty sequence: index 0 for every value.
  expect_close(searchsorted(empty({0}), v), {0, 0, 0, 0}, {4}, kInt64, 0, 0);
  expect_close(searchsorted(empty({2, 0}), zeros({2, 3})), std::vector<double>(6, 0), {2, 3},
               kInt64, 0, 0);
  // Nothing differentiates through the indices.
  const Tensor x = v.clone().requires_grad_();
  EXPECT_FALSE(searchsorted(std::get<0>(sort(unsorted)), x).requires_grad());
}

TEST(SearchSorted, BadInputRaisesNamingTheOperands) {
  const Tensor seq = arange(0, 5, 1, kFloat64), v = full({3}, 1.5, kFloat64);
  expect_error([&] { (void)searchsorted(seq, v, false, true, "left"); },
               {"searchsorted", "side \"left\"", "right"});
  expect_error([&] { (void)searchsorted(seq, v, false, false, "middle"); },
               {"searchsorted", "side", "middle"});
  expect_error([&] { (void)searchsorted(full({}, 1.0), v); }, {"searchsorted", "at least one dim"});
  expect_error(
      [&] {
        (void)searchsorted(zeros({2, 3}), zeros({3, 1}));
      },
      {"searchsorted", "[2, 3]", "[3, 1]"});
  expect_error(
      [&] {
        (void)searchsorted(zeros({2, 3}), zeros({2}));
      },
      {"searchsorted", "every dim but the last"});
  expect_error([&] { (void)searchsorted(zeros({2, 3}), 1.0); }, {"searchsorted", "scalar", "1-D"});
  expect_error([&] { (void)searchsorted(ones({2}, kBool), ones({2}, kBool)); },
               {"searchsorted", "bool"});
  expect_error([&] { (void)searchsorted(seq, v, false, false, std::nullopt, arange(0, 4)); },
               {"searchsorted", "sorter", "[4]", "[5]"});
  expect_error(
      [&] { (void)searchsorted(seq, v, false, false, std::nullopt, arange(0, 5, 1, kFloat64)); },
      {"searchsorted", "sorter", "int64"});
  expect_error([&] { (void)searchsorted(seq, v, false, false, std::nullopt, arange(1, 6)); },
               {"gather", "out of range"});
  expect_error([&] { (void)bucketize(v, zeros({2, 2})); }, {"bucketize", "1-D", "[2, 2]"});
}

// ------------------------------------------------------------ lazy and traced

In scan_program(const In& in) {
  const Tensor& x = in[0];
  const auto [max_values, max_indices] = cummax(x * 2.0, 1);
  const auto [min_values, min_indices] = x.cummin(0);
  // Sorted without sort (which reads the values: a trace would bake its permutation in).
  const Tensor seq = cumsum(abs(x.narrow(0, 0, 1).flatten()), 0) - 2.0;
  return In{max_values,
            max_indices,
            min_values + 1.0,
            min_indices,
            logcumsumexp(x, -1).exp(),
            searchsorted(seq, x),
            bucketize(x * 0.5, seq, false, true)};
}

TEST(ScansModes, LazyAndTracedMatchEagerWithNewValuesOnEachReplay) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const In eager = scan_program({x});
  In lazy;
  {
    LazyGuard on(true);
    lazy = scan_program({x * 1.0});  // a pending operand
  }
  const jit::Function f = jit::trace(scan_program, {x});
  const std::string path = ::testing::TempDir() + "/kiln_scan_program.kfn";
  f.save(path);
  const jit::Function loaded = jit::load(path);
  for (int call = 0; call < 3; ++call) {
    const Tensor x2 = call == 0 ? x : testing::random_tensor({3, 4}, kFloat64).requires_grad_();
    const In expected = scan_program({x2});
    const auto [loss_traced, loss_eager] =
        testing::expect_replay_matches(f({x2}), loaded({x2}), call == 0 ? lazy : In{}, expected);
    testing::expect_lazy_equal(autograd::grad({loss_traced}, {x2})[0],
                               autograd::grad({loss_eager}, {x2})[0], "traced gradient");
  }
}

}  // namespace
}  // namespace kiln
