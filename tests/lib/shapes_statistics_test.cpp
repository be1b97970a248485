// diagonal, diag, trace, tile, repeat_interleave, nansum, nanmean, median, kthvalue, logit,
// deg2rad and rad2deg, and the activations and distances of kiln/nn_functional.h added with them
// (hardtanh, relu6, celu, the shrinks, glu, prelu, normalize, cosine_similarity,
// pairwise_distance, one_hot): float64 reference loops over random shapes (size 0 and 1 dims) and
// layouts, gradients by gradcheck and at the points where torch's formulas decide (bounds, NaN),
// lazy and traced runs against eager ones, and bad input raising kiln::Error.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "kiln/jit.h"
#include "kiln/nn.h"
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
const double kInf = std::numeric_limits<double>::infinity();

Tensor f64(std::vector<double> v) {
  return from_vector(v);
}

int64_t pick(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

Tensor grad_of(const Tensor& y, const Tensor& x, const Tensor& g) {
  return autograd::grad({y}, {x}, {g})[0];
}

// ------------------------------------------------------------ diagonals

// Element (i, i + offset) of the plane (d1, d2), the other dims in order, the diagonal last.
std::vector<double> diagonal_ref(const Tensor& x, int64_t offset, int64_t d1, int64_t d2,
                                 Shape& shape) {
  const std::vector<double> v = values(x);
  const int64_t rows = x.size(d1), cols = x.size(d2);
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i) n += i + offset >= 0 && i + offset < cols;
  Shape rest;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != d1 && d != d2) rest.push_back(x.size(d));
  shape = rest;
  shape.push_back(n);
  std::vector<double> out;
  int64_t count = 1;
  for (int64_t s : rest) count *= s;
  for (int64_t r = 0; r < count; ++r) {
    const std::vector<int64_t> at_rest = testing::unravel(r, rest);
    for (int64_t i = 0; i < rows; ++i) {
      if (i + offset < 0 || i + offset >= cols) continue;
      std::vector<int64_t> at;
      for (int64_t d = 0, k = 0; d < x.dim(); ++d)
        at.push_back(d == d1 ? i : d == d2 ? i + offset : at_rest[static_cast<size_t>(k++)]);
      out.push_back(v[static_cast<size_t>(testing::ravel(at, x.sizes()))]);
    }
  }
  return out;
}

TEST(Diagonals, DiagonalIsAViewOfTheReferenceElements) {
  for (int trial = 0; trial < 40; ++trial) {
    const Tensor base = testing::random_tensor(testing::random_shape(2, 4, 4), kFloat64);
    const int64_t d1 = pick(0, base.dim() - 1);
    int64_t d2 = pick(0, base.dim() - 2);
    if (d2 >= d1) ++d2;
    const int64_t offset = pick(-4, 4);
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout + " offset " + std::to_string(offset) + " dims " + std::to_string(d1) +
                   "," + std::to_string(d2));
      Shape shape;
      const std::vector<double> expected = diagonal_ref(base, offset, d1, d2, shape);
      const Tensor d = diagonal(x, offset, d1 - base.dim(), d2);
      expect_close(d, expected, shape, kFloat64, 0, 0);
      expect_close(x.diagonal(offset, d1, d2), expected, shape, kFloat64, 0, 0);
    }
  }
  // A view: writing into it writes x.
  Tensor m = zeros({3, 3}, kFloat64);
  m.diagonal(1).fill_(5);
  expect_close(m, {0, 5, 0, 0, 0, 5, 0, 0, 0}, {3, 3}, kFloat64, 0, 0);
  expect_error([&] { (void)diagonal(m, 0, 1, -1); },
               {"diagonal", "cannot be identical", "float64[3, 3]"});
  expect_error([&] { (void)diagonal(m, 0, 0, 2); }, {"diagonal", "float64[3, 3]"});
}

TEST(Diagonals, DiagAndTrace) {
  expect_close(diag(f64({1, 2})), {1, 0, 0, 2}, {2, 2}, kFloat64, 0, 0);
  expect_close(diag(f64({1, 2}), 1), {0, 1, 0, 0, 0, 2, 0, 0, 0}, {3, 3}, kFloat64, 0, 0);
  expect_close(diag(f64({1, 2}), -1), {0, 0, 0, 1, 0, 0, 0, 2, 0}, {3, 3}, kFloat64, 0, 0);
  expect_close(diag(f64({})), {}, {0, 0}, kFloat64, 0, 0);
  expect_close(diag(f64({}), 2), {0, 0, 0, 0}, {2, 2}, kFloat64, 0, 0);
  EXPECT_EQ(diag(zeros({0, 0}), -1).sizes(), (Shape{0}));
  EXPECT_EQ(diag(zeros({2, 3}), 5).sizes(), (Shape{0}));
  const Tensor m = arange(6, kFloat64).view({2, 3});
  expect_close(diag(m), {0, 4}, {2}, kFloat64, 0, 0);
  expect_close(m.diag(1), {1, 5}, {2}, kFloat64, 0, 0);
  expect_close(diag(m.t(), -1), {1, 5}, {2}, kFloat64, 0, 0);
  Tensor copy = diag(m);
  copy.fill_(-1);  // a copy, not a view
  expect_close(m, {0, 1, 2, 3, 4, 5}, {2, 3}, kFloat64, 0, 0);
  expect_close(trace(m), {4}, {}, kFloat64, 0, 0);
  const Tensor t = trace(m.to(kInt32));
  EXPECT_EQ(t.dtype(), kInt64);
  expect_close(t, {4}, {}, kInt64, 0, 0);
  expect_close(trace(zeros({0, 3})), {0}, {}, kFloat32, 0, 0);
  expect_error([&] { (void)diag(zeros({2, 2, 2})); }, {"diag", "1-D or 2-D", "float32[2, 2, 2]"});
  expect_error([&] { (void)trace(zeros({2})); }, {"trace", "matrix", "float32[2]"});
}

TEST(Diagonals, Gradients) {
  const Tensor x = testing::random_tensor({3, 4, 2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return diagonal(in[0], 1, 0, 1); }, {x}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return diagonal(in[0].transpose(0, 2), -1, 2, 0); }, {x}));
  const Tensor v = testing::random_tensor({3}, kFloat64).requires_grad_();
  const Tensor m = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  for (int64_t k : {-2, 0, 1}) {
    EXPECT_TRUE(testing::gradcheck([k](const In& in) { return diag(in[0], k); }, {v}));
    EXPECT_TRUE(testing::gradcheck([k](const In& in) { return diag(in[0], k); }, {m}));
  }
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return trace(in[0]); }, {m}));
  // More rows than columns: only the diagonal (libtorch 1.13's gradient also reaches element 2).
  const Tensor tall = zeros({4, 1}, kFloat64).requires_grad_();
  expect_close(autograd::grad({trace(tall)}, {tall})[0], {1, 0, 0, 0}, {4, 1}, kFloat64, 0, 0);
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return trace(in[0].t()); }, {m}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return trace(in[0] * in[0]); }, {m}));
  // Of an expanded view (its elements share memory): each shared location's gradient is divided
  // among the elements that read it, so the expansion's gradient sums it back once.
  const Tensor row = testing::random_tensor({1, 1, 4}, kFloat64).requires_grad_();
  for (int64_t offset : {0, 3, -1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    auto f = [offset](const In& in) { return diagonal(in[0].expand({3, 4, 4}), offset, -2, 2); };
    EXPECT_TRUE(testing::gradcheck(f, {row}));
    EXPECT_TRUE(testing::gradgradcheck(f, {row}));
    EXPECT_TRUE(testing::gradcheck(
        [](const In& in) {
          return as_strided(in[0].reshape({1, 4}).expand({2, 4}), {3}, {1}, 1);
        },
        {row}));
  }
}

TEST(Diagonals, DiagEmbedAndKronAgainstReferences) {
  for (int trial = 0; trial < 20; ++trial) {
    const Tensor x = testing::random_tensor(testing::random_shape(1, 3, 4), kFloat64);
    const int64_t offset = pick(-2, 2);
    const int64_t rank = x.dim() + 1;
    const int64_t d1 = pick(0, rank - 1), d2 = (d1 + pick(1, rank - 1)) % rank;
    SCOPED_TRACE(detail::describe(x) + " offset " + std::to_string(offset) + " dims " +
                 std::to_string(d1) + ", " + std::to_string(d2));
    const Tensor out = diag_embed(x, offset, d1, d2 - rank);  // a negative dim2 too
    // x's last dim lies on that diagonal, and every other element is 0.
    EXPECT_TRUE(equal(diagonal(out, offset, d1, d2), x));
    EXPECT_EQ(sum(ne(out, 0)).item<int64_t>(), sum(ne(x, 0)).item<int64_t>());
    EXPECT_EQ(out.size(d1), x.size(-1) + std::abs(offset));
  }
  const Tensor v = testing::random_tensor({2, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return diag_embed(in[0], 1, 0, 2); }, {v}));
  expect_error([&] { (void)diag_embed(v, 0, 1, -2); }, {"diag_embed", "identical"});
  // kron: (a (x) b)[i*p + k, j*q + l] = a[i, j] b[k, l], and a vector against a matrix.
  const Tensor a = testing::random_tensor({2, 3}, kFloat64),
               b = testing::random_tensor({4, 5}, kFloat64);
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> expected(8 * 15);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t l = 0; l < 5; ++l)
          expected[(i * 4 + k) * 15 + j * 5 + l] = av[i * 3 + j] * bv[k * 5 + l];
  expect_close(kron(a, b), expected, {8, 15}, kFloat64, 0, 0);
  EXPECT_EQ(kron(ones({3}), ones({2, 4})).sizes(), (Shape{2, 12}));
  EXPECT_EQ(kron(ones({2, 1, 3}), ones({4, 2})).sizes(), (Shape{2, 4, 6}));
  EXPECT_EQ(kron(full({}, 2.0), full({}, 3.0)).item<double>(), 6.0);
  const Tensor ga = a.clone().requires_grad_(), gb = b.clone().requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return kron(in[0], in[1]); }, {ga, gb}));
}

// ------------------------------------------------------------ repetitions

TEST(Repetitions, TileAndRepeatInterleaveAgainstReference) {
  for (int trial = 0; trial < 30; ++trial) {
    const Tensor base = testing::random_tensor(testing::random_shape(0, 3, 3), kFloat64);
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout);
      const int64_t r = pick(0, 3);
      // Without a dim: the flattened x, each element r times.
      std::vector<double> flat;
      for (double e : values(base)) flat.insert(flat.end(), static_cast<size_t>(r), e);
      expect_close(repeat_interleave(x, r), flat, {base.numel() * r}, kFloat64, 0, 0);
      if (base.dim() == 0) continue;
      const int64_t d = pick(0, base.dim() - 1);
      const Tensor along = repeat_interleave(x, r, d);
      Shape shape = base.sizes();
      shape[static_cast<size_t>(d)] *= r;
      std::vector<double> expected;
      const int64_t count =
          std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
      for (int64_t i = 0; i < count; ++i) {
        std::vector<int64_t> at = testing::unravel(i, shape);
        at[static_cast<size_t>(d)] /= std::max<int64_t>(r, 1);
        expected.push_back(values(base)[static_cast<size_t>(testing::ravel(at, base.sizes()))]);
      }
      expect_close(along, expected, shape, kFloat64, 0, 0);
      // A count per element, as a tensor.
      std::vector<int64_t> counts;
      for (int64_t i = 0; i < base.size(d); ++i) counts.push_back(pick(0, 2));
      const Tensor by_counts = repeat_interleave(x, from_vector(counts), d);
      std::vector<int64_t> index;
      for (int64_t i = 0; i < base.size(d); ++i)
        index.insert(index.end(), static_cast<size_t>(counts[static_cast<size_t>(i)]), i);
      EXPECT_TRUE(equal(by_counts, index_select(base, d, from_vector(index)))) << by_counts;
      // tile: repeat with leading 1s.
      const std::vector<int64_t> dims{pick(0, 2), pick(1, 2)};
      std::vector<int64_t> padded(static_cast<size_t>(std::max<int64_t>(0, base.dim() - 2)), 1);
      padded.insert(padded.end(), dims.begin(), dims.end());
      EXPECT_TRUE(equal(x.tile(dims), base.repeat(padded)));
    }
  }
  expect_close(tile(f64({1, 2}), {}), {1, 2}, {2}, kFloat64, 0, 0);
  expect_close(repeat_interleave(f64({1, 2}), from_vector(std::vector<int64_t>{3})),
               {1, 1, 1, 2, 2, 2}, {6}, kFloat64, 0, 0);
}

TEST(Repetitions, GradientsAndBadInput) {
  const Tensor x = testing::random_tensor({2, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return repeat_interleave(in[0], 2, 1); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return repeat_interleave(in[0], 3); }, {x}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return repeat_interleave(in[0], from_vector(std::vector<int64_t>{2, 0, 1}), 1);
      },
      {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return tile(in[0], {2, 1, 2}); }, {x}));
  const Tensor v = f64({1, 2, 3});
  expect_error([&] { (void)repeat_interleave(v, -1); }, {"repeat_interleave", "non-negative"});
  expect_error(
      [&] {
        (void)repeat_interleave(v, from_vector(std::vector<int64_t>{1, -1, 0}));
      },
      {"repeat_interleave", "non-negative"});
  expect_error(
      [&] {
        (void)repeat_interleave(v, from_vector(std::vector<int64_t>{1, 2}));
      },
      {"repeat_interleave", "int64[2]", "float64[3]"});
  expect_error(
      [&] {
        (void)repeat_interleave(v, f64({1, 1, 1}));
      },
      {"repeat_interleave", "integer", "float64[3]"});
  expect_error([&] { (void)repeat_interleave(v, int64_t{1} << 62); }, {"repeat_interleave"});
  expect_error([&] { (void)repeat_interleave(v, 2, 1); }, {"repeat_interleave", "float64[3]"});
  expect_error([&] { (void)tile(v, {-1}); }, {"tile", "non-negative", "float64[3]"});
  expect_close(v, {1, 2, 3}, {3}, kFloat64, 0, 0);
  // Always a copy, even of an empty leaf (differential program 6226307354857802: a write into
  // the result raised as a write into a view of the leaf).
  const Tensor leaf = zeros({0}, kFloat64).requires_grad_();
  for (const Tensor& r : {repeat_interleave(leaf, 0, 0), repeat_interleave(leaf, 1),
                          tile(leaf, {3}), leaf.repeat({2})}) {
    EXPECT_NE(r.impl()->storage, leaf.impl()->storage);
    Tensor w = r;
    w.slice(0, 0, 0).fill_(1);
  }
}

// ------------------------------------------------------------ NaN-skipping reductions

TEST(NanReductions, AgainstReference) {
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = testing::random_shape(1, 3, 4);
    Tensor base = testing::random_tensor(shape, kFloat64);
    base = where(ge(testing::random_tensor(shape, kFloat64, 0, 1), 0.3), base, kNan);
    const int64_t d = pick(0, base.dim() - 1);
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout);
      std::vector<double> all = values(base), kept;
      for (double e : all)
        if (!std::isnan(e)) kept.push_back(e);
      const double total = std::accumulate(kept.begin(), kept.end(), 0.0);
      expect_close(nansum(x), {total}, {}, kFloat64, 1e-12, 1e-12);
      expect_close(nanmean(x), {kept.empty() ? kNan : total / kept.size()}, {}, kFloat64, 1e-12,
                   1e-12);
      const Tensor s = x.nansum(d, true), m = nanmean(x, {d});
      EXPECT_TRUE(
          allclose(s, sum(where(logical_not(isnan(base)), base, 0.0), {d}, true), 1e-12, 1e-12));
      const Tensor count = sum(logical_not(isnan(base)), {d}).to(kFloat64);
      EXPECT_TRUE(allclose(m, sum(where(logical_not(isnan(base)), base, 0.0), {d}) / count, 1e-12,
                           1e-12, true));
    }
  }
  const Tensor ints = from_vector(std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(nansum(ints).dtype(), kInt64);
  expect_close(nansum(ints), {6}, {}, kInt64, 0, 0);
  expect_close(nanmean(f64({kNan, kNan})), {kNan}, {}, kFloat64, 0, 0);
  expect_error([&] { (void)nanmean(ints); }, {"nanmean", "floating", "int32[3]"});
  // The gradient skips NaN, as torch's.
  const Tensor x = f64({1, kNan, 3}).requires_grad_();
  expect_close(grad_of(nansum(x), x, f64({2}).reshape({})), {2, 0, 2}, {3}, kFloat64, 0, 0);
  expect_close(grad_of(nanmean(x), x, f64({2}).reshape({})), {1, 0, 1}, {3}, kFloat64, 0, 0);
  // g * (x == x): an infinite g meets a NaN x as NaN (nanmean of only NaN divides by 0), as
  // torch's (differential program 2329849795708638592).
  const Tensor only_nan = f64({kNan}).reshape({}).requires_grad_();
  expect_close(grad_of(nanmean(only_nan, {-1}, true), only_nan, f64({1}).reshape({})), {kNan}, {},
               kFloat64, 0, 0);
  const Tensor m = f64({1, kNan, 3, 4}).view({2, 2}).requires_grad_();
  expect_close(grad_of(m.nansum(1), m, f64({1, 2})), {1, 0, 2, 2}, {2, 2}, kFloat64, 0, 0);
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return nansum(in[0] * in[0], {0}, true); },
                                     {testing::random_tensor({2, 3}, kFloat64).requires_grad_()}));
}

// ------------------------------------------------------------ median and kthvalue

// The lower median of a line, or its first NaN, with the index a stable sort puts there.
std::pair<double, int64_t> median_ref(const std::vector<double>& line) {
  for (size_t i = 0; i < line.size(); ++i)
    if (std::isnan(line[i])) return {kNan, static_cast<int64_t>(i)};
  std::vector<int64_t> order(line.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return line[static_cast<size_t>(a)] < line[static_cast<size_t>(b)];
  });
  const int64_t at = order[(line.size() - 1) / 2];
  return {line[static_cast<size_t>(at)], at};
}

TEST(OrderStatistics, MedianAndKthvalueAgainstReference) {
  for (int trial = 0; trial < 40; ++trial) {
    const Shape shape = testing::random_shape(1, 3, 5, false);
    // Few distinct values, so that ties are common; some NaN.
    Tensor base = testing::random_tensor(shape, kFloat64, -3, 3).round();
    if (trial % 3 == 0)
      base = where(ge(testing::random_tensor(shape, kFloat64, 0, 1), 0.2), base, kNan);
    const int64_t d = pick(0, base.dim() - 1), k = pick(1, base.size(d));
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout + " dim " + std::to_string(d) + " k " + std::to_string(k));
      const Tensor lines = base.movedim(d, -1).contiguous().reshape({-1, base.size(d)});
      std::vector<double> med, kth;
      std::vector<double> med_at, kth_at;
      for (int64_t l = 0; l < lines.size(0); ++l) {
        const std::vector<double> line = values(lines[l]);
        const auto [m, at] = median_ref(line);
        med.push_back(m);
        med_at.push_back(static_cast<double>(at));
        std::vector<int64_t> order(line.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          const double u = line[static_cast<size_t>(a)], v = line[static_cast<size_t>(b)];
          return !std::isnan(u) && (std::isnan(v) || u < v);
        });
        kth_at.push_back(static_cast<double>(order[static_cast<size_t>(k - 1)]));
        kth.push_back(line[static_cast<size_t>(order[static_cast<size_t>(k - 1)])]);
      }
      Shape reduced = base.sizes();
      reduced.erase(reduced.begin() + d);
      Shape moved = reduced;  // the lines' order: the other dims in order
      const auto [mv, mi] = x.median(d);
      expect_close(mv, med, moved, kFloat64, 0, 0);
      expect_close(mi, med_at, moved, kInt64, 0, 0);
      const auto [kv, ki] = kthvalue(x, k, d, true);
      Shape kept = base.sizes();
      kept[static_cast<size_t>(d)] = 1;
      expect_close(kv, kth, kept, kFloat64, 0, 0);
      expect_close(ki, kth_at, kept, kInt64, 0, 0);
    }
    // All elements: the lower median, NaN when any is.
    const auto [m, at] = median_ref(values(base));
    expect_close(median(base), {m}, {}, kFloat64, 0, 0);
  }
}

TEST(OrderStatistics, EdgesGradientsAndBadInput) {
  expect_close(median(zeros({0})), {kNan}, {}, kFloat32, 0, 0);
  // Empty, it still carries its input's history (differential program 141).
  const Tensor empty = zeros({0, 2}, kFloat64).requires_grad_();
  EXPECT_TRUE(median(empty).requires_grad());
  EXPECT_EQ(grad_of(median(empty), empty, f64({1}).reshape({})).sizes(), (Shape{0, 2}));
  const auto [zv, zi] = median(f64({7}).reshape({}), 0);
  expect_close(zv, {7}, {}, kFloat64, 0, 0);
  expect_close(zi, {0}, {}, kInt64, 0, 0);
  const auto [ev, ei] = median(zeros({0, 3}), 1);
  EXPECT_EQ(ev.sizes(), (Shape{0}));
  expect_close(median(from_vector(std::vector<int64_t>{5, 1, 3, 2})), {2}, {}, kInt64, 0, 0);
  expect_error(
      [&] {
        (void)median(zeros({0, 3}), 0);
      },
      {"median", "non-zero size", "float32[0, 3]"});
  expect_error([&] { (void)kthvalue(f64({1, 2}), 3); }, {"kthvalue", "k = 3", "float64[2]"});
  expect_error([&] { (void)kthvalue(f64({1, 2}), 0); }, {"kthvalue", "k = 0"});
  expect_error([&] { (void)median(ones({2}, kBool)); }, {"median", "bool"});
  expect_error([&] { (void)median(from_vector(std::vector<int64_t>{})); }, {"median", "empty"});
  // The median of all elements shares its gradient among the equal ones (NaN: among the NaN).
  const Tensor t = f64({1, 2, 2, 5}).requires_grad_();
  expect_close(grad_of(median(t), t, f64({1}).reshape({})), {0, 0.5, 0.5, 0}, {4}, kFloat64, 0, 0);
  const Tensor n = f64({1, kNan, 3, kNan}).requires_grad_();
  expect_close(grad_of(median(n), n, f64({1}).reshape({})), {0, 0.5, 0, 0.5}, {4}, kFloat64, 0, 0);
  // Along a dim the gradient goes to the selected index.
  const Tensor x = testing::random_tensor({3, 5}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return std::get<0>(in[0].median(1)); }, {x}));
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return std::get<0>(kthvalue(in[0], 2, 0)); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return median(in[0]); }, {x}));
}

// ------------------------------------------------------------ elementwise math

TEST(ElementwiseMath, LogitDeg2radRad2deg) {
  const Tensor x = f64({-0.5, 0, 0.25, 0.5, 1, 2, kNan});
  const std::vector<double> v = values(x);
  std::vector<double> logit_ref, clamped_ref, deg, rad;
  for (double e : v) {
    logit_ref.push_back(std::log(e / (1 - e)));
    const double z = std::isnan(e) ? e : std::min(std::max(e, 0.1), 0.9);
    clamped_ref.push_back(std::log(z / (1 - z)));
    deg.push_back(e * (M_PI / 180));
    rad.push_back(e * (180 / M_PI));
  }
  expect_close(logit(x), logit_ref, {7}, kFloat64, 1e-15, 0);
  expect_close(x.logit(0.1), clamped_ref, {7}, kFloat64, 1e-15, 0);
  expect_close(deg2rad(x), deg, {7}, kFloat64, 1e-16, 0);
  expect_close(x.rad2deg(), rad, {7}, kFloat64, 1e-16, 0);
  const Tensor i = from_vector(std::vector<int64_t>{0, 1, 180});
  expect_close(deg2rad(i), {0, M_PI / 180, M_PI}, {3}, kFloat32, 1e-7, 0);
  expect_close(rad2deg(ones({2}, kBool)), {180 / M_PI, 180 / M_PI}, {2}, kFloat32, 1e-7, 0);
  expect_close(logit(from_vector(std::vector<int64_t>{0, 1})), {-kInf, kInf}, {2}, kFloat32, 0, 0);
  // Gradients: torch's g / (x (1 - x)), 0 outside [eps, 1 - eps].
  const Tensor p = f64({0.05, 0.1, 0.3, 0.9, 0.95}).requires_grad_();
  expect_close(grad_of(logit(p, 0.1), p, ones({5}, kFloat64)), {0, 1 / 0.09, 1 / 0.21, 1 / 0.09, 0},
               {5}, kFloat64, 1e-14, 0);
  // Without eps: NaN outside [0, 1] and g * inf at its ends (-0 too), as torch's.
  const Tensor e = f64({-0.5, -0.0, 0, 1, 1.5}).requires_grad_();
  expect_close(grad_of(logit(e), e, f64({2, 2, -2, 2, 2})), {kNan, kInf, -kInf, kInf, kNan}, {5},
               kFloat64, 0, 0);
  const Tensor q = testing::random_tensor({4}, kFloat64, 0.1, 0.9).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return logit(in[0]); }, {q}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return logit(in[0], 0.01); }, {q}));
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return deg2rad(in[0]) + rad2deg(in[0]); }, {q}));
}

// ------------------------------------------------------------ activations

TEST(MoreActivations, ValuesAgainstReference) {
  const Tensor x = f64({-3, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 3, 7, kNan, -kInf, kInf});
  std::vector<double> ht, r6, ce, ss, hs, ts;
  for (double e : values(x)) {
    ht.push_back(std::isnan(e) ? e : std::min(std::max(e, -1.0), 1.0));
    r6.push_back(std::isnan(e) ? e : std::min(std::max(e, 0.0), 6.0));
    ce.push_back(e > 0 ? e : 2 * std::expm1(e / 2));
    ss.push_back(e > 0.5 ? e - 0.5 : e < -0.5 ? e + 0.5 : std::isnan(e) ? e : 0.0);
    hs.push_back(e >= -0.5 && e <= 0.5 ? 0 : e);
    ts.push_back(e - std::tanh(e));
  }
  const Shape s{13};
  expect_close(hardtanh(x), ht, s, kFloat64, 0, 0);
  expect_close(relu6(x), r6, s, kFloat64, 0, 0);
  expect_close(celu(x, 2), ce, s, kFloat64, 1e-15, 0);
  expect_close(softshrink(x), ss, s, kFloat64, 0, 0);
  // Between the bounds +0, also for negative x (libtorch 1.13's; a later division reads the sign).
  EXPECT_FALSE(std::signbit(softshrink(x)[3].item<double>()));
  expect_close(hardshrink(x), hs, s, kFloat64, 0, 0);
  expect_close(tanhshrink(x), ts, s, kFloat64, 1e-13, 0);
  expect_close(logsigmoid(x), values(log_sigmoid(x)), s, kFloat64, 0, 0);
  // glu: a * sigmoid(b) of the halves.
  const Tensor g = testing::random_tensor({3, 4}, kFloat64);
  EXPECT_TRUE(allclose(glu(g), g.narrow(1, 0, 2) * sigmoid(g.narrow(1, 2, 2)), 0, 0));
  EXPECT_TRUE(
      allclose(glu(g.t(), 0), g.t().narrow(0, 0, 2) * sigmoid(g.t().narrow(0, 2, 2)), 0, 0));
  // prelu: one slope, or one per channel (dim 1).
  const Tensor p = f64({-2, 1, -4, 3}).view({1, 2, 2});
  expect_close(prelu(p, f64({0.25})), {-0.5, 1, -1, 3}, {1, 2, 2}, kFloat64, 0, 0);
  expect_close(prelu(p, f64({0.5, 0.25})), {-1, 1, -1, 3}, {1, 2, 2}, kFloat64, 0, 0);
  expect_close(prelu(f64({-2}).reshape({}), f64({0.5})), {-1}, {}, kFloat64, 0, 0);
  EXPECT_EQ(prelu(zeros({0, 0}, kFloat64), zeros({0}, kFloat64)).sizes(), (Shape{0, 0}));
  expect_error(
      [&] {
        (void)prelu(f64({-2, 1}), f64({0.5, 1}));
      },
      {"prelu", "float64[2]", "one per channel (1)"});
  expect_error([&] { (void)prelu(p, f64({0.5}).to(kFloat32)); }, {"prelu", "float32[1]"});
  expect_error([&] { (void)glu(g, 0); }, {"glu", "even", "float64[3, 4]"});
  expect_error([&] { (void)hardtanh(x, 1, -1); }, {"hardtanh", "min_val"});
  expect_error([&] { (void)softshrink(x, -1); }, {"softshrink", "lambd"});
  expect_error([&] { (void)celu(x, 0); }, {"celu", "alpha"});
  expect_error([&] { (void)relu6(from_vector(std::vector<int64_t>{1})); }, {"hardtanh", "int64"});
}

// Gradients at the points where torch's formulas decide: on the bounds (0 for hardtanh, g for
// softshrink's outside), and NaN (g passes for hardtanh, hardshrink and softshrink).
TEST(MoreActivations, GradientsAtBoundsAndNan) {
  const Tensor x = f64({-1, 1, 0.5, -0.5, 0, kNan, 2}).requires_grad_();
  const Tensor g = ones({7}, kFloat64);
  expect_close(grad_of(hardtanh(x), x, g), {0, 0, 1, 1, 1, 1, 0}, {7}, kFloat64, 0, 0);
  expect_close(grad_of(relu6(x), x, g), {0, 1, 1, 0, 0, 1, 1}, {7}, kFloat64, 0, 0);
  expect_close(grad_of(softshrink(x), x, g), {1, 1, 0, 0, 0, 1, 1}, {7}, kFloat64, 0, 0);
  expect_close(grad_of(hardshrink(x), x, g), {1, 1, 0, 0, 0, 1, 1}, {7}, kFloat64, 0, 0);
  const Tensor r = testing::random_tensor({2, 6}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return celu(in[0], 0.7); }, {r}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return celu(in[0]); }, {r}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return tanhshrink(in[0]); }, {r}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return glu(in[0]); }, {r}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return glu(in[0], 1); }, {r}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return hardtanh(in[0], -2, 2.5); }, {r}));
  // The slope's gradient is 0 where x is inf (not g * inf masked), as torch's.
  const Tensor inf_x = f64({kInf, -kInf, 1}), slope = f64({0.5}).requires_grad_();
  expect_close(grad_of(prelu(inf_x, slope).sum(), slope, f64({1}).reshape({})), {-kInf}, {1},
               kFloat64, 0, 0);
  const Tensor w = f64({0.25, 0.5}).requires_grad_();
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return prelu(in[0].view({3, 2, 2}), in[1]);
      },
      {r, w}));
  nn::PReLU module(2, 0.1);
  EXPECT_EQ(module.named_parameters().size(), 1u);
  expect_close(module.weight, {0.1, 0.1}, {2}, kFloat32, 1e-7, 0);
  expect_close(nn::ReLU6().forward(f64({-1, 7})), {0, 6}, {2}, kFloat64, 0, 0);
}

// ------------------------------------------------------------ distances and encodings

TEST(Distances, NormalizeCosineSimilarityPairwiseDistance) {
  for (int trial = 0; trial < 20; ++trial) {
    const Tensor a = testing::random_tensor({3, 4}, kFloat64),
                 b = testing::random_tensor({4}, kFloat64);
    std::vector<double> cos, dist, unit;
    const std::vector<double> va = values(a), vb = values(b);
    for (int64_t i = 0; i < 3; ++i) {
      double ab = 0, aa = 0, bb = 0, dd = 0;
      for (int64_t j = 0; j < 4; ++j) {
        const double u = va[static_cast<size_t>(i * 4 + j)], v = vb[static_cast<size_t>(j)];
        ab += (u / 1) * v;
        aa += u * u;
        bb += v * v;
        dd += (u - v + 1e-6) * (u - v + 1e-6);
      }
      cos.push_back(ab / std::sqrt(aa) / std::sqrt(bb));
      dist.push_back(std::sqrt(dd));
      for (int64_t j = 0; j < 4; ++j)
        unit.push_back(va[static_cast<size_t>(i * 4 + j)] / std::sqrt(aa));
    }
    expect_close(cosine_similarity(a, b, 1), cos, {3}, kFloat64, 1e-14, 1e-15);
    expect_close(pairwise_distance(a, b), dist, {3}, kFloat64, 1e-14, 0);
    expect_close(normalize(a), unit, {3, 4}, kFloat64, 1e-14, 0);
  }
  // torch's clamps (libtorch 1.13's values): each norm at least eps, the norm's gradient read
  // with the clamped norm.
  const Tensor x1 = f64({1e-9, 0}).requires_grad_(), x2 = f64({1, 0});
  const Tensor c = cosine_similarity(x1, x2, 0);
  expect_close(c, {0.1}, {}, kFloat64, 1e-15, 0);
  expect_close(grad_of(c, x1, f64({1}).reshape({})), {9.9e7, 0}, {2}, kFloat64, 1e-15, 0);
  expect_close(cosine_similarity(f64({3, 4}), f64({0, 0}), 0), {0}, {}, kFloat64, 0, 0);
  expect_close(normalize(f64({0, 0}), 2, 0), {0, 0}, {2}, kFloat64, 0, 0);
  const Tensor a = testing::random_tensor({2, 3}, kFloat64).requires_grad_();
  const Tensor b = testing::random_tensor({2, 3}, kFloat64).requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return cosine_similarity(in[0], in[1]); }, {a, b}));
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return pairwise_distance(in[0], in[1], 3); }, {a, b}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return normalize(in[0], 2, 0); }, {a}));
  expect_error(
      [&] {
        (void)cosine_similarity(a, from_vector(std::vector<int64_t>{1, 2, 3}));
      },
      {"cosine_similarity", "floating", "int64[3]"});
}

TEST(Distances, OneHot) {
  const Tensor i = from_vector(std::vector<int64_t>{0, 2, 1, 2}, Shape{2, 2});
  expect_close(one_hot(i), {1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1}, {2, 2, 3}, kInt64, 0, 0);
  expect_close(one_hot(i, 4).sum(-1), {1, 1, 1, 1}, {2, 2}, kInt64, 0, 0);
  EXPECT_EQ(one_hot(from_vector(std::vector<int64_t>{}), 5).sizes(), (Shape{0, 5}));
  expect_error([&] { (void)one_hot(i, 2); }, {"one_hot", "smaller than num_classes 2"});
  expect_error([&] { (void)one_hot(i - 1, 3); }, {"one_hot", "non-negative"});
  expect_error([&] { (void)one_hot(i.to(kInt32)); }, {"one_hot", "int64", "int32[2, 2]"});
  expect_error([&] { (void)one_hot(from_vector(std::vector<int64_t>{})); },
               {"one_hot", "cannot infer"});
}

// ------------------------------------------------------------ lazy and traced

// The gradient of a diagonal of a transposed view, traced (differential program
// 17595593752534584910: as_strided's backward scattered into zeros of the view's layout, which a
// trace cannot record, and baked in the example's zero gradient).
TEST(NewOpsModes, TracedDiagonalOfAViewDifferentiatesAsEager) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const jit::Function f = jit::trace(
      [](const In& in) {
        return In{diagonal(in[0].t(), 1), diag(in[0].t().narrow(0, 1, 3), -1),
                  trace(in[0].narrow(1, 1, 3).t())};
      },
      {x});
  const In traced = f({x});
  const Tensor w = testing::random_tensor({3}, kFloat64);
  const Tensor g_traced = autograd::grad(
      {(traced[0] * w.narrow(0, 0, traced[0].size(0))).sum() + traced[1].sum() + traced[2]},
      {x})[0];
  const Tensor t = x.t();
  const Tensor d0 = diagonal(t, 1), d1 = diag(t.narrow(0, 1, 3), -1),
               d2 = trace(x.narrow(1, 1, 3).t());
  const Tensor g_eager =
      autograd::grad({(d0 * w.narrow(0, 0, d0.size(0))).sum() + d1.sum() + d2}, {x})[0];
  EXPECT_TRUE(equal(g_traced, g_eager)) << g_traced << g_eager;
  // A scatter into a self that is not contiguous cannot be traced: a clear error, not values
  // baked in.
  expect_error(
      [&] {
        (void)jit::trace(
            [](const In& in) {
              return In{as_strided_scatter(in[0].t(), zeros({2}, kFloat64), {2}, {1}, 0)};
            },
            {x})({x});
      },
      {"as_strided_scatter", "not contiguous"});
}

TEST(NewOpsModes, LazyAndTracedMatchEager) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64);
  const Tensor w = f64({0.2, 0.3, 0.4});
  auto program = [&](const In& in) {
    const Tensor& v = in[0];
    return In{diagonal(v, 1),
              diag(v.narrow(1, 0, 3)),
              trace(v),
              tile(v, {2}),
              repeat_interleave(v, 2, 0),
              nansum(v, {1}),
              nanmean(v),
              std::get<0>(kthvalue(v, 2, 1)),
              median(v),
              logit(sigmoid(v), 0.01),
              deg2rad(v),
              hardtanh(v) + relu6(v) + celu(v) + softshrink(v) + hardshrink(v) + tanhshrink(v),
              glu(v),
              prelu(v.view({1, 3, 4}), w),
              normalize(v),
              cosine_similarity(v, v.flip({0})),
              pairwise_distance(v, v * 2)};
  };
  const In eager = program({x});
  In lazy;
  {
    LazyGuard on(true);
    lazy = program({x});
  }
  const In traced = jit::trace(program, {x})({x});
  ASSERT_EQ(lazy.size(), eager.size());
  for (size_t k = 0; k < eager.size(); ++k) {
    testing::expect_lazy_equal(lazy[k], eager[k], "lazy output " + std::to_string(k));
    testing::expect_lazy_equal(traced[k], eager[k], "traced output " + std::to_string(k));
  }
}

}  // namespace
}  // namespace kiln
