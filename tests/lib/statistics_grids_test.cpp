// quantile, nanquantile, cov, corrcoef, histc, bincount, trapezoid, cumulative_trapezoid, diff,
// meshgrid, cartesian_prod, block_diag, rot90, tensordot, tril/triu_indices, msort, cdist and the
// unique family: plain float64 reference loops over random shapes (size 0 and 1 where the op
// allows them), dtypes and non-contiguous layouts, with ties, infinities and NaN; gradients by
// gradcheck; lazy runs against eager ones; bad input raising kiln::Error.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/testing.h"
#include "lib/tensor_impl.h"
#include "tests/lib/lines.h"
#include "tests/lib/threads.h"
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

// Small integers (many ties) with, when `special`, some NaN and infinities.
Tensor tied_values(const Shape& shape, DType dtype, bool special) {
  Tensor t = testing::random_tensor(shape, kFloat64, -3, 3).round();
  if (special) {
    const Tensor u = testing::random_tensor(shape, kFloat64, 0, 1);
    t = masked_fill(masked_fill(masked_fill(t, lt(u, 0.1), -kInf), lt(u, 0.06), kInf), lt(u, 0.03),
                    kNan);
  }
  return t.to(dtype);
}

// ------------------------------------------------------------ quantile and nanquantile

// The quantile of one line by torch's definition, in double: ranks on the sorted line (NaN last).
double line_quantile(std::vector<double> line, double q, const std::string& how, bool skip_nan) {
  const bool has_nan = std::any_of(line.begin(), line.end(), [](double v) { return v != v; });
  if (skip_nan)
    line.erase(std::remove_if(line.begin(), line.end(), [](double v) { return v != v; }),
               line.end());
  if (line.empty() || (has_nan && !skip_nan)) return kNan;
  std::sort(line.begin(), line.end());
  double rank = q * double(line.size() - 1);
  if (how == "lower") rank = std::floor(rank);
  if (how == "higher") rank = std::ceil(rank);
  if (how == "nearest") rank = std::nearbyint(rank);
  const double below = line[size_t(std::floor(rank))], above = line[size_t(std::ceil(rank))];
  if (how != "linear" && how != "midpoint") return below;
  // torch's lerp: from below for a weight under 0.5, from above otherwise.
  const double w = how == "midpoint" ? 0.5 : rank - std::floor(rank);
  return w < 0.5 ? below + w * (above - below) : above - (above - below) * (1 - w);
}

TEST(Quantile, MatchesASortedReferenceForEveryInterpolationDimAndLayout) {
  const std::vector<std::string> hows{"linear", "lower", "higher", "midpoint", "nearest"};
  for (int trial = 0; trial < 80; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Shape shape = testing::random_shape(0, 3, 5, false);
    const bool with_dim = trial % 3 != 0;
    const int64_t d = shape.empty() ? 0 : pick(0, int64_t(shape.size()) - 1);
    const Tensor x = trial % 4 == 0 ? tied_values(shape, dtype, true)
                                    : testing::random_tensor(shape, dtype, -5, 5);
    // Multiples of 1/8: ranks are exact in both dtypes, so the reference picks the same elements.
    std::vector<double> qs;
    for (int i = 0, n = int(pick(1, 3)); i < n; ++i) qs.push_back(double(pick(0, 8)) / 8);
    const bool scalar_q = trial % 5 == 0;
    if (scalar_q) qs.resize(1);
    const Tensor q = scalar_q ? scalar_tensor(qs[0], dtype) : from_vector(qs).to(dtype);
    const std::string& how = hows[trial % hows.size()];
    const bool skip_nan = trial % 2 == 0;
    const std::vector<double> xv = values(x);
    // Reference: [q values, lines], lines along d or the whole tensor.
    std::vector<double> expected;
    for (double qv : qs) {
      if (!with_dim) {
        expected.push_back(line_quantile(xv, qv, how, skip_nan));
        continue;
      }
      for_each_line(shape, d, [&](int64_t first, int64_t stride, int64_t size) {
        std::vector<double> line;
        for (int64_t k = 0; k < size; ++k) line.push_back(xv[first + k * stride]);
        expected.push_back(line_quantile(line, qv, how, skip_nan));
      });
    }
    // for_each_line walks lines in row-major order of the remaining dims: the result's order.
    Shape out_shape = scalar_q ? Shape{} : Shape{int64_t(qs.size())};
    if (with_dim)
      for (int64_t i = 0; i < int64_t(shape.size()); ++i)
        if (i != d) out_shape.push_back(shape[i]);
    for (const auto& [layout, laid] : testing::layouts(x)) {
      SCOPED_TRACE(layout + " " + how + (skip_nan ? " nanquantile " : " quantile ") +
                   detail::describe(x) + (with_dim ? " dim " + std::to_string(d) : ""));
      const std::optional<int64_t> dim = with_dim ? std::optional<int64_t>(d) : std::nullopt;
      const Tensor got =
          skip_nan ? nanquantile(laid, q, dim, false, how) : quantile(laid, q, dim, false, how);
      const double tol = dtype == kFloat32 ? 1e-6 : 1e-14;
      expect_close(got, expected, out_shape, dtype, tol, tol);
      if (scalar_q) {
        const Tensor method = skip_nan ? laid.nanquantile(qs[0], dim, false, how)
                                       : laid.quantile(qs[0], dim, false, how);
        expect_close(method, expected, out_shape, dtype, tol, tol);
      }
      // keepdim: size 1 where the line was (every dim without a dim), after q's dim.
      const Tensor kept = quantile(laid, q, dim, true, how);
      Shape kept_shape = scalar_q ? Shape{} : Shape{int64_t(qs.size())};
      for (int64_t i = 0; i < int64_t(shape.size()); ++i)
        kept_shape.push_back(with_dim && i != d ? shape[i] : 1);
      EXPECT_EQ(kept.sizes(), kept_shape);
    }
  }
}

TEST(Quantile, GradientsReachThePickedElementsAndBadInputRaises) {
  const Tensor x = testing::random_tensor({4, 5}, kFloat64).requires_grad_();
  const Tensor q = from_vector(std::vector<double>{0.1, 0.5, 0.9});
  for (const char* how : {"linear", "midpoint", "lower"})
    EXPECT_TRUE(testing::gradcheck(
        [&](const In& in) { return quantile(in[0], q, int64_t{1}, false, how); }, {x}))
        << how;
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return nanquantile(in[0], 0.3); }, {x}));
  // The median of 4 elements is halfway between the middle two: half the gradient each.
  const Tensor v = from_vector(std::vector<double>{4, 1, 3, 2}).requires_grad_();
  quantile(v, 0.5).backward();
  expect_close(v.grad(), {0, 0, 0.5, 0.5}, {4}, kFloat64, 0, 0);

  const Tensor f = testing::random_tensor({3}, kFloat32);
  expect_error([&] { quantile(f, 1.5); }, {"quantile", "[0, 1]"});
  expect_error([&] { quantile(f, from_vector(std::vector<double>{0.5})); }, {"quantile", "dtype"});
  expect_error([&] { quantile(f.to(kInt64), 0.5); }, {"quantile", "int64"});
  expect_error([&] { quantile(zeros({0}), 0.5); }, {"quantile", "empty"});
  expect_error([&] { quantile(f, 0.5, std::nullopt, false, "cubic"); }, {"interpolation", "cubic"});
  expect_error([&] { nanquantile(f, 0.5, int64_t{2}); }, {"nanquantile"});
}

// ------------------------------------------------------------ cov and corrcoef

TEST(Cov, MatchesAWeightedReferenceAndCorrcoefItsNormalization) {
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t vars = pick(1, 4), obs = pick(1, 6);
    const bool one_d = trial % 5 == 0;
    const Tensor x = one_d ? testing::random_tensor({obs}, kFloat64)
                           : testing::random_tensor({vars, obs}, kFloat64);
    const int64_t rows = one_d ? 1 : vars;
    const int64_t correction = pick(0, 2);
    const Tensor fw = trial % 2 ? testing::random_tensor({obs}, kInt64, 0, 4) : Tensor();
    const Tensor aw = trial % 3 ? testing::random_tensor({obs}, kFloat64, 0.1, 2) : Tensor();
    const std::vector<double> xv = values(x);
    std::vector<double> w(size_t(obs), 1.0), a(size_t(obs), 1.0);
    if (fw.defined()) w = values(fw);
    if (aw.defined()) a = values(aw);
    double w_sum = 0, wa_sum = 0;
    for (int64_t k = 0; k < obs; ++k) w_sum += w[k] * a[k], wa_sum += w[k] * a[k] * a[k];
    double norm =
        aw.defined() && correction != 0 ? w_sum - correction * wa_sum / w_sum : w_sum - correction;
    if (norm <= 0) norm = 0;
    std::vector<double> mean(size_t(rows), 0.0), expected;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < obs; ++k) mean[i] += xv[i * obs + k] * w[k] * a[k] / w_sum;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < rows; ++j) {
        double s = 0;
        for (int64_t k = 0; k < obs; ++k)
          s += (xv[i * obs + k] - mean[i]) * (xv[j * obs + k] - mean[j]) * w[k] * a[k];
        expected.push_back(s / norm);
      }
    const Shape out_shape = rows == 1 ? Shape{} : Shape{rows, rows};
    SCOPED_TRACE(detail::describe(x) + " correction " + std::to_string(correction));
    if (w_sum == 0) continue;  // all weights 0: torch divides 0 by 0 too
    expect_close(cov(x, correction, fw, aw), expected, out_shape, kFloat64, 1e-10, 1e-12);
    if (fw.defined() || aw.defined() || correction != 1) continue;
    std::vector<double> r;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < rows; ++j)
        r.push_back(std::clamp(
            expected[i * rows + j] / std::sqrt(expected[i * rows + i] * expected[j * rows + j]),
            -1.0, 1.0));
    expect_close(x.corrcoef(), r, out_shape, kFloat64, 1e-10, 1e-12);
  }
  const Tensor x = testing::random_tensor({3, 5}, kFloat64).requires_grad_();
  const Tensor aw = testing::random_tensor({5}, kFloat64, 0.5, 2);
  EXPECT_TRUE(testing::gradcheck([&](const In& in) { return cov(in[0], 1, {}, aw); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return corrcoef(in[0]); }, {x}));
  // Integers give float32, as torch's true division.
  EXPECT_EQ(cov(from_vector(std::vector<int64_t>{1, 2, 4})).dtype(), kFloat32);
  expect_error([&] { cov(zeros({2, 2, 2})); }, {"cov", "[2, 2, 2]"});
  expect_error([&] { cov(x, 1, from_vector(std::vector<int64_t>{1, 2})); }, {"fweights"});
  expect_error([&] { cov(x, 1, {}, -ones({5}, kFloat64)); }, {"aweights", "negative"});
  expect_error([&] { cov(x, 1, ones({5}, kFloat64)); }, {"fweights", "integers"});
}

// ------------------------------------------------------------ histc and bincount

TEST(Histc, CountsLikeAReferenceLoopInTheInputsDtype) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Shape shape = testing::random_shape(0, 3, 6);
    const Tensor x = trial % 3 == 0 ? tied_values(shape, dtype, true)
                                    : testing::random_tensor(shape, dtype, -4, 4);
    const int64_t bins = pick(1, 9);
    const bool own_range = trial % 4 == 0;
    double lo = own_range ? 0 : -double(pick(0, 3)), hi = own_range ? 0 : double(pick(0, 3));
    std::vector<double> xv = values(x);
    if (lo == hi && !xv.empty()) {
      // The input's own range: NaN or an infinity in it raises, as torch.
      if (std::any_of(xv.begin(), xv.end(), [](double v) { return !std::isfinite(v); })) {
        expect_error([&] { histc(x, bins, lo, hi); }, {"histc", "not finite"});
        continue;
      }
      lo = *std::min_element(xv.begin(), xv.end());
      hi = *std::max_element(xv.begin(), xv.end());
    }
    if (lo == hi) lo -= 1, hi += 1;
    std::vector<double> expected(size_t(bins), 0.0);
    for (double v : xv) {
      if (!(v >= lo && v <= hi)) continue;
      // The bin in the input's dtype, as torch's kernel computes it.
      int64_t b = dtype == kFloat32
                      ? int64_t((float(v) - float(lo)) * float(bins) / (float(hi) - float(lo)))
                      : int64_t((v - lo) * double(bins) / (hi - lo));
      expected[size_t(std::min(b, bins - 1))] += 1;
    }
    for (const auto& [layout, laid] : testing::layouts(x)) {
      SCOPED_TRACE(layout + " " + detail::describe(x) + " bins " + std::to_string(bins));
      const Tensor got = own_range ? laid.histc(bins) : histc(laid, bins, lo, hi);
      expect_close(got, expected, {bins}, dtype, 0, 0);
    }
  }
  expect_error([] { histc(from_vector(std::vector<double>{1, kInf})); }, {"histc", "finite"});
  expect_error([] { histc(ones({2}), 0); }, {"histc", "bins"});
  expect_error([] { histc(ones({2}), 5, 2, 1); }, {"histc", "min"});
  expect_error([] { histc(ones({2}, kInt64)); }, {"histc", "int64"});
}

TEST(Bincount, CountsAndSumsWeightsLikeAReferenceLoop) {
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t n = pick(0, 12), minlength = pick(0, 8);
    const DType index_dtype = trial % 2 ? kInt32 : kInt64;
    const Tensor x = testing::random_tensor({n}, index_dtype, 0, 7);
    const DType weight_dtype = std::vector<DType>{kFloat32, kFloat64, kInt64}[trial % 3];
    const bool weighted = trial % 4 != 0;
    const Tensor w = weighted ? testing::random_tensor({n}, weight_dtype, -2, 2) : Tensor();
    const std::vector<double> xv = values(x);
    int64_t length = minlength;
    for (double v : xv) length = std::max(length, int64_t(v) + 1);
    std::vector<double> expected(size_t(length), 0.0);
    const std::vector<double> wv = weighted ? values(w) : std::vector<double>(size_t(n), 1.0);
    for (int64_t i = 0; i < n; ++i) expected[size_t(xv[i])] += wv[i];
    const DType out = !weighted ? kInt64 : weight_dtype == kFloat32 ? kFloat32 : kFloat64;
    SCOPED_TRACE(detail::describe(x) + " weights " + detail::describe(w));
    expect_close(bincount(x, w, minlength), expected, {length}, out, 1e-6, 1e-6);
    expect_close(x.bincount(w, minlength), expected, {length}, out, 1e-6, 1e-6);
  }
  expect_error(
      [] {
        bincount(from_vector(std::vector<int64_t>{1, -1}));
      },
      {"bincount", "non-negative"});
  expect_error([] { bincount(ones({2})); }, {"bincount", "float32"});
  expect_error([] { bincount(ones({2, 2}, kInt64)); }, {"bincount", "1-D"});
  expect_error([] { bincount(ones({2}, kInt64), ones({3})); }, {"bincount", "weights"});
}

// ------------------------------------------------------------ integration and differences

TEST(Trapezoid, MatchesTheTrapezoidalRuleWithSpacingsOrPoints) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Shape shape = testing::random_shape(1, 3, 5);
    const int64_t d = pick(0, int64_t(shape.size()) - 1);
    const Tensor y = testing::random_tensor(shape, dtype);
    const std::vector<double> yv = values(y);
    const bool with_points = trial % 2 == 0;
    const Tensor pts = testing::random_tensor({shape[d]}, dtype, -2, 2).cumsum(0);
    const std::vector<double> pv = values(pts);
    const double dx = 0.5 * double(pick(1, 4));
    // Each line's integral, and its running integrals at their row-major places in a tensor one
    // shorter along d (lines come in row-major order of the other dims: outer, then inner).
    Shape running_shape = shape;
    running_shape[d] = std::max<int64_t>(shape[d] - 1, 0);
    std::vector<double> total, running(size_t(detail::shape_numel(running_shape)));
    int64_t inner = 1, line_index = 0;
    for (int64_t i = d + 1; i < int64_t(shape.size()); ++i) inner *= shape[i];
    for_each_line(shape, d, [&](int64_t first, int64_t stride, int64_t size) {
      const int64_t outer = line_index / inner, in = line_index % inner;
      double s = 0;
      for (int64_t k = 1; k < size; ++k) {
        const double h = with_points ? pv[k] - pv[k - 1] : dx;
        s += h * (yv[first + k * stride] + yv[first + (k - 1) * stride]) / 2;
        running[size_t((outer * (size - 1) + k - 1) * inner + in)] = s;
      }
      total.push_back(s);
      ++line_index;
    });
    Shape out_shape = shape;
    out_shape.erase(out_shape.begin() + d);
    SCOPED_TRACE(detail::describe(y) + " dim " + std::to_string(d));
    const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
    for (const auto& [layout, laid] : testing::layouts(y)) {
      SCOPED_TRACE(layout);
      expect_close(with_points ? trapezoid(laid, pts, d) : trapezoid(laid, dx, d), total, out_shape,
                   dtype, tol, tol);
      if (shape[d] == 0) continue;
      expect_close(
          with_points ? cumulative_trapezoid(laid, pts, d) : cumulative_trapezoid(laid, dx, d),
          running, running_shape, dtype, tol, tol);
    }
  }
  // Points broadcasting with y, and the gradient through both.
  const Tensor y = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const Tensor x = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return trapezoid(in[0], in[1]); }, {y, x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cumulative_trapezoid(in[0], in[1], 0); },
                                 {y, x}));
  expect_error([&] { trapezoid(y, ones({5}, kFloat64)); }, {"trapezoid", "one x value"});
  expect_error([] { trapezoid(ones({2}, kBool)); }, {"trapezoid", "bool"});
}

TEST(Diff, TakesNthDifferencesAfterJoiningPrependAndAppend) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = std::vector<DType>{kFloat64, kInt32, kBool, kFloat32}[trial % 4];
    const Shape shape = testing::random_shape(1, 3, 5);
    const int64_t d = pick(0, int64_t(shape.size()) - 1), n = pick(0, 4);
    const Tensor x = testing::random_tensor(shape, dtype, -5, 5);
    Shape edge_shape = shape;
    edge_shape[d] = pick(0, 2);
    const Tensor pre = trial % 3 == 0 ? testing::random_tensor(edge_shape, dtype) : Tensor();
    const Tensor app = trial % 5 == 0 ? testing::random_tensor(edge_shape, dtype) : Tensor();
    std::vector<Tensor> parts;
    for (const Tensor& t : {pre, x, app})
      if (t.defined()) parts.push_back(t);
    const Tensor joined = cat(parts, d);
    // Reference: repeated differences of each line of the joined tensor, in double.
    Shape out_shape = joined.sizes();
    out_shape[d] = std::max<int64_t>(joined.size(d) - n, 0);
    std::vector<double> jv = values(joined), expected(size_t(detail::shape_numel(out_shape)));
    const int64_t inner = detail::shape_numel(joined.sizes()) == 0
                              ? 1
                              : detail::contiguous_strides(joined.sizes())[d];
    int64_t line_index = 0;
    for_each_line(joined.sizes(), d, [&](int64_t first, int64_t stride, int64_t size) {
      std::vector<double> line;
      for (int64_t k = 0; k < size; ++k) line.push_back(jv[first + k * stride]);
      for (int64_t i = 0; i < n && !line.empty(); ++i) {
        for (size_t k = 0; k + 1 < line.size(); ++k)
          line[k] = dtype == kBool ? double(line[k + 1] != line[k]) : line[k + 1] - line[k];
        line.pop_back();
      }
      const int64_t outer = line_index / inner, in = line_index % inner;
      for (size_t k = 0; k < line.size(); ++k)
        expected[(outer * out_shape[d] + int64_t(k)) * inner + in] = line[k];
      ++line_index;
    });
    SCOPED_TRACE(detail::describe(joined) + " n " + std::to_string(n) + " dim " +
                 std::to_string(d));
    for (const auto& [layout, laid] : testing::layouts(x)) {
      SCOPED_TRACE(layout);
      expect_close(diff(laid, n, d, pre, app), expected, out_shape, dtype, 1e-6, 1e-6);
    }
  }
  const Tensor x = testing::random_tensor({3, 5}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return in[0].diff(2, 1); }, {x}));
  // n = 0 (or nothing to difference) gives a new tensor, as torch's: writing it leaves x alone.
  Tensor same = diff(x.detach(), 0);
  EXPECT_FALSE(same.is_same(x.detach()));
  same.zero_();
  EXPECT_NE(x.abs().sum().item<double>(), 0.0);
  expect_error([] { diff(scalar_tensor(1.0)); }, {"diff", "1 dim"});
  expect_error([&] { diff(x, -1); }, {"diff", "non-negative"});
}

// ------------------------------------------------------------ grids and rearrangements

TEST(Grids, MeshgridCartesianProdAndBlockDiagPlaceEveryElement) {
  const Tensor a = from_vector(std::vector<double>{1, 2, 3});
  const Tensor b = from_vector(std::vector<double>{10, 20});
  const Tensor c = scalar_tensor(7.0, kFloat64);
  const auto ij = meshgrid({a, b, c});
  ASSERT_EQ(ij.size(), 3u);
  for (const Tensor& g : ij) EXPECT_EQ(g.sizes(), (Shape{3, 2, 1}));
  expect_close(ij[0], {1, 1, 2, 2, 3, 3}, {3, 2, 1}, kFloat64, 0, 0);
  expect_close(ij[1], {10, 20, 10, 20, 10, 20}, {3, 2, 1}, kFloat64, 0, 0);
  const auto xy = meshgrid({a, b}, "xy");
  expect_close(xy[0], {1, 2, 3, 1, 2, 3}, {2, 3}, kFloat64, 0, 0);
  expect_close(xy[1], {10, 10, 10, 20, 20, 20}, {2, 3}, kFloat64, 0, 0);
  expect_close(cartesian_prod({a, b}), {1, 10, 1, 20, 2, 10, 2, 20, 3, 10, 3, 20}, {6, 2}, kFloat64,
               0, 0);
  expect_close(cartesian_prod({a}), {1, 2, 3}, {3}, kFloat64, 0, 0);
  expect_close(cartesian_prod({a, zeros({0}, kFloat64)}), {}, {0, 2}, kFloat64, 0, 0);
  // block_diag of a 2 x 2, a row, a number and an empty 0 x 2 block: promoted to float64.
  const Tensor m = from_vector(std::vector<int64_t>{1, 2, 3, 4}, Shape{2, 2});
  expect_close(block_diag({m, b, scalar_tensor(5, kInt32), zeros({0, 2}, kInt64)}),
               {1, 2, 0,  0,  0, 0, 0,  //
                3, 4, 0,  0,  0, 0, 0,  //
                0, 0, 10, 20, 0, 0, 0,  //
                0, 0, 0,  0,  5, 0, 0},
               {4, 7}, kFloat64, 0, 0);
  const Tensor p = testing::random_tensor({2, 3}, kFloat64).requires_grad_();
  const Tensor q = testing::random_tensor({2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return block_diag({in[0], in[1]}); }, {p, q}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return cartesian_prod({in[0].reshape({-1}), in[1]});
      },
      {p, q}));
  expect_error([&] { meshgrid({a, ones({2, 2}, kFloat64)}); }, {"meshgrid", "1-D"});
  expect_error([&] { meshgrid({a, b.to(kFloat32)}); }, {"meshgrid", "dtype"});
  expect_error([&] { meshgrid({a}, "ji"); }, {"meshgrid", "ji"});
  expect_error([&] { block_diag({zeros({1, 1, 1})}); }, {"block_diag", "2 dims"});
}

TEST(Rearrangements, Rot90TensordotTriangleIndicesAndMsortMatchReferences) {
  // rot90 by k quarter turns: out[i][j] of a turned [r, c] matrix, for k = -1 .. 5.
  const Tensor m = testing::random_tensor({2, 3, 4}, kFloat64);
  const std::vector<double> mv = values(m);
  for (int64_t k = -1; k <= 5; ++k) {
    const int64_t turns = ((k % 4) + 4) % 4;
    const Tensor got = rot90(m, k, {1, 2});
    const int64_t r = turns % 2 ? 4 : 3, c = turns % 2 ? 3 : 4;
    std::vector<double> expected;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) {
          // Where out[i][j] came from in the [3, 4] plane.
          const int64_t si = turns == 0 ? i : turns == 1 ? j : turns == 2 ? 2 - i : 2 - j;
          const int64_t sj = turns == 0 ? j : turns == 1 ? 3 - i : turns == 2 ? 3 - j : i;
          expected.push_back(mv[size_t(b * 12 + si * 4 + sj)]);
        }
    expect_close(got, expected, {2, r, c}, kFloat64, 0, 0);
  }
  expect_close(m.rot90(1, {2, 1}), values(rot90(m, 3, {1, 2})), {2, 4, 3}, kFloat64, 0, 0);
  expect_error([&] { rot90(m, 1, {1, 1}); }, {"rot90"});

  // tensordot against einsum, with a size-1 dim broadcasting against a longer one.
  const Tensor a = testing::random_tensor({2, 3, 4}, kFloat64);
  const Tensor b = testing::random_tensor({4, 3, 5}, kFloat64);
  const Tensor t = tensordot(a, b, {1, 2}, {1, 0});
  expect_close(t, values(einsum("ijk,kjl->il", {a, b})), {2, 5}, kFloat64, 1e-12, 1e-12);
  expect_close(tensordot(a, b.permute({1, 0, 2}).reshape({12, 5}).reshape({3, 4, 5}), 2),
               values(einsum("ijk,jkl->il", {a, b.permute({1, 0, 2})})), {2, 5}, kFloat64, 1e-12,
               1e-12);
  const Tensor one = testing::random_tensor({2, 1}, kFloat64);
  expect_close(tensordot(one, b, {1}, {1}), values(einsum("ij,kjl->ikl", {one, b.sum(1, true)})),
               {2, 4, 5}, kFloat64, 1e-12, 1e-12);
  expect_close(tensordot(a, b, 0), values(einsum("ijk,lmn->ijklmn", {a, b})), {2, 3, 4, 4, 3, 5},
               kFloat64, 1e-12, 1e-12);
  const Tensor ga = a.detach().requires_grad_(), gb = b.detach().requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return tensordot(in[0], in[1], {2}, {0}); }, {ga, gb}));
  expect_error([&] { tensordot(a, b, {0}, {0}); }, {"tensordot", "size 2", "size 4"});
  expect_error([&] { tensordot(a, b, {1, 1}, {1, 0}); }, {"tensordot", "twice"});

  // Triangle indices, row by row, against the mask of tril/triu.
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t rows = pick(0, 5), cols = pick(0, 5), offset = pick(-6, 6);
    std::vector<double> lower_r, lower_c, upper_r, upper_c;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        if (j - i <= offset) lower_r.push_back(double(i)), lower_c.push_back(double(j));
        if (j - i >= offset) upper_r.push_back(double(i)), upper_c.push_back(double(j));
      }
    lower_r.insert(lower_r.end(), lower_c.begin(), lower_c.end());
    upper_r.insert(upper_r.end(), upper_c.begin(), upper_c.end());
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + " offset " +
                 std::to_string(offset));
    expect_close(tril_indices(rows, cols, offset), lower_r, {2, int64_t(lower_c.size())}, kInt64, 0,
                 0);
    expect_close(triu_indices(rows, cols, offset, kInt32), upper_r, {2, int64_t(upper_c.size())},
                 kInt32, 0, 0);
  }
  expect_error([] { tril_indices(-1, 2); }, {"tril_indices", "non-negative"});
  // Hostile sizes: a clear error, not a loop over 10^18 rows.
  const int64_t huge = int64_t{1} << 60;
  expect_error([&] { tril_indices(huge, huge); }, {"tril_indices", "too many"});
  expect_error([&] { triu_indices(huge, 1 << 20); }, {"triu_indices"});
  EXPECT_EQ(tril_indices(huge, 3, -huge + 2).size(1), 3);  // only the last 2 rows hold any
  EXPECT_EQ(triu_indices(huge, 2, 1).size(1), 1);
  expect_error([] { bincount(from_vector(std::vector<int64_t>{int64_t{1} << 50})); }, {"bincount"});
  expect_error([] { triu_indices(2, 2, 0, kFloat32); }, {"triu_indices", "float32"});

  const Tensor s = from_vector(std::vector<double>{3, kNan, 1, 2}, Shape{2, 2});
  expect_close(msort(s), {1, 2, 3, kNan}, {2, 2}, kFloat64, 0, 0);
}

// ------------------------------------------------------------ cdist

TEST(Cdist, MatchesReferenceDistancesForEveryPAndAlgorithm) {
  for (int trial = 0; trial < 30; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    // Sometimes more than 25 rows: the GEMM expansion for p = 2 in the default mode.
    const int64_t rows1 = trial % 6 == 0 ? 30 : pick(0, 4), rows2 = pick(1, 4), m = pick(0, 4);
    const bool batched = trial % 3 == 0;
    const Tensor x1 = testing::random_tensor(batched ? Shape{2, rows1, m} : Shape{rows1, m}, dtype);
    const Tensor x2 = testing::random_tensor({rows2, m}, dtype);
    const double p = std::vector<double>{0, 0.5, 1, 2, 3, kInf}[trial % 6];
    const std::vector<double> v1 = values(x1), v2 = values(x2);
    std::vector<double> expected;
    for (int64_t b = 0; b < (batched ? 2 : 1); ++b)
      for (int64_t i = 0; i < rows1; ++i)
        for (int64_t j = 0; j < rows2; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < m; ++k) {
            const double diff = std::abs(v1[(b * rows1 + i) * m + k] - v2[j * m + k]);
            acc = p == 0          ? acc + (diff != 0)
                  : std::isinf(p) ? std::max(acc, diff)
                                  : acc + std::pow(diff, p);
          }
          expected.push_back(p == 0 || std::isinf(p) ? acc : std::pow(acc, 1 / p));
        }
    const Shape shape = batched ? Shape{2, rows1, rows2} : Shape{rows1, rows2};
    SCOPED_TRACE(detail::describe(x1) + " " + detail::describe(x2) + " p " + std::to_string(p));
    // The GEMM expansion loses digits to cancellation: about sqrt(eps) of the norms.
    const double tol = dtype == kFloat32 ? 2e-3 : 1e-7;
    for (int64_t mode : {0, 1, 2})
      expect_close(cdist(x1, x2, p, mode), expected, shape, dtype, tol, tol);
  }
  // Gradients, also where a distance is 0 (x with itself): 0 there, as torch's.
  const Tensor x = testing::random_tensor({4, 3}, kFloat64).requires_grad_();
  const Tensor y = testing::random_tensor({5, 3}, kFloat64).requires_grad_();
  for (int64_t mode : {1, 2})
    for (double p : {1.0, 2.0, 3.0}) {
      if (mode == 1 && p != 2) continue;
      EXPECT_TRUE(testing::gradcheck(
          [p, mode](const In& in) { return cdist(in[0], in[1], p, mode); }, {x, y}))
          << "p " << p << " mode " << mode;
    }
  for (int64_t mode : {1, 2}) {
    const Tensor self = autograd::grad({cdist(x, x, 2, mode).sum()}, {x})[0];
    EXPECT_TRUE(isfinite(self).all().item<bool>()) << "mode " << mode;
  }
  expect_error([&] { cdist(x, ones({2, 4}, kFloat64)); }, {"cdist", "[4, 3]", "[2, 4]"});
  expect_error([&] { cdist(x, y, -1); }, {"cdist", "non-negative"});
  expect_error([&] { cdist(x, y.to(kFloat32)); }, {"cdist", "dtype"});
}

// ------------------------------------------------------------ unique

// A value's key in a std::map with NaN distinct: NaNs get keys of their own.
TEST(Unique, MatchesAReferenceWithInverseAndCountsForEveryDtype) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = std::vector<DType>{kFloat32, kInt64, kBool, kFloat64, kInt32}[trial % 5];
    const Shape shape = testing::random_shape(0, 3, 5);
    const Tensor x = is_floating_point(dtype) ? tied_values(shape, dtype, trial % 2 == 0)
                                              : testing::random_tensor(shape, dtype, -3, 3);
    const std::vector<double> xv = values(x);
    // Sorted distinct values, NaNs (each its own) last.
    std::vector<double> distinct;
    std::map<double, int64_t> counts;
    int64_t nans = 0;
    for (double v : xv) v != v ? ++nans : ++counts[v];
    std::vector<double> count_values, inverse;
    for (const auto& [v, c] : counts) distinct.push_back(v), count_values.push_back(double(c));
    for (int64_t i = 0; i < nans; ++i) distinct.push_back(kNan), count_values.push_back(1);
    int64_t nan_seen = 0;
    for (double v : xv) {
      if (v != v) {
        inverse.push_back(double(counts.size() + size_t(nan_seen++)));
      } else {
        inverse.push_back(double(std::distance(counts.begin(), counts.find(v))));
      }
    }
    const int64_t m = int64_t(distinct.size());
    for (const auto& [layout, laid] : testing::layouts(x)) {
      SCOPED_TRACE(layout + " " + detail::describe(x));
      const auto [values_out, inverse_out, counts_out] = unique(laid, true, true, true);
      expect_close(values_out, distinct, {m}, dtype, 0, 0);
      expect_close(inverse_out, inverse, shape, kInt64, 0, 0);
      expect_close(counts_out, count_values, {m}, kInt64, 0, 0);
      const auto [plain, no_inverse, no_counts] = unique(laid);
      EXPECT_EQ(no_inverse.numel(), 0);
      EXPECT_EQ(no_counts.numel(), 0);
      expect_close(plain, distinct, {m}, dtype, 0, 0);
    }
  }
}

TEST(Unique, DimAndConsecutiveFormsCompareWholeSlices) {
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = testing::random_shape(1, 3, 4);
    const int64_t d = pick(0, int64_t(shape.size()) - 1);
    // Few distinct values: equal slices happen.
    const Tensor x = testing::random_tensor(shape, kInt64, 0, 2);
    // Reference: the slices along d as vectors, ordered lexicographically.
    const int64_t k = detail::shape_numel(shape) / std::max<int64_t>(shape[d], 1);
    const Tensor slices = x.movedim(d, 0).reshape({shape[d], k});
    std::vector<std::vector<double>> rows;
    for (int64_t i = 0; i < shape[d]; ++i) rows.push_back(values(slices[i]));
    std::map<std::vector<double>, int64_t> counts;
    for (const auto& r : rows) ++counts[r];
    std::vector<double> inverse, count_values;
    for (const auto& r : rows)
      inverse.push_back(double(std::distance(counts.begin(), counts.find(r))));
    Tensor expected_values = zeros({0});
    std::vector<Tensor> picked;
    for (const auto& [r, c] : counts) {
      count_values.push_back(double(c));
      for (int64_t i = 0; i < shape[d]; ++i)
        if (rows[size_t(i)] == r) {
          picked.push_back(x.select(d, i));
          break;
        }
    }
    SCOPED_TRACE(detail::describe(x) + " dim " + std::to_string(d));
    const auto [v, inv, cnt] = unique_dim(x, d, true, true, true);
    if (!picked.empty()) EXPECT_TRUE(equal(v, stack(picked, d)));
    expect_close(inv, inverse, {shape[d]}, kInt64, 0, 0);
    expect_close(cnt, count_values, {int64_t(counts.size())}, kInt64, 0, 0);
    // Consecutive runs, in x's order.
    std::vector<double> run_inverse, run_counts;
    std::vector<Tensor> run_values;
    for (int64_t i = 0; i < shape[d]; ++i) {
      if (i == 0 || rows[size_t(i)] != rows[size_t(i - 1)]) {
        run_values.push_back(x.select(d, i));
        run_counts.push_back(0);
      }
      run_counts.back() += 1;
      run_inverse.push_back(double(run_counts.size() - 1));
    }
    const auto [rv, rinv, rcnt] = unique_consecutive(x, true, true, d);
    if (!run_values.empty()) EXPECT_TRUE(equal(rv, stack(run_values, d)));
    expect_close(rinv, run_inverse, {shape[d]}, kInt64, 0, 0);
    expect_close(rcnt, run_counts, {int64_t(run_counts.size())}, kInt64, 0, 0);
  }
  // Without a dim, consecutive runs of elements: NaNs never merge.
  const Tensor e = from_vector(std::vector<double>{1, 1, kNan, kNan, 2, 1});
  const auto [v, inv, cnt] = unique_consecutive(e, true, true);
  expect_close(v, {1, kNan, kNan, 2, 1}, {5}, kFloat64, 0, 0);
  expect_close(inv, {0, 0, 1, 2, 3, 4}, {6}, kInt64, 0, 0);
  expect_close(cnt, {2, 1, 1, 1, 1}, {5}, kInt64, 0, 0);
  // No gradient flows through unique.
  const Tensor g = from_vector(std::vector<double>{2, 1, 2}).requires_grad_();
  EXPECT_FALSE(std::get<0>(unique(g)).requires_grad());
  expect_error([] { unique_dim(scalar_tensor(1.0), 0); }, {"unique_dim"});
}

// ------------------------------------------------------------ nanmedian and cholesky_solve

TEST(NanMedian, IsTheLowerMedianOfTheOtherElementsWithItsIndex) {
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 ? kFloat32 : kFloat64;
    const Shape shape = testing::random_shape(0, 3, 5, false);
    const int64_t d = shape.empty() ? 0 : pick(0, int64_t(shape.size()) - 1);
    const Tensor x = tied_values(shape, dtype, true);
    const std::vector<double> xv = values(x);
    std::vector<double> expected, expected_index;
    for_each_line(shape, d, [&](int64_t first, int64_t stride, int64_t size) {
      std::vector<std::pair<double, int64_t>> kept;  // (value, index) of the numbers
      int64_t first_nan = -1;
      for (int64_t k = 0; k < size; ++k) {
        const double v = xv[first + k * stride];
        if (v == v) kept.push_back({v, k});
        if (v != v && first_nan < 0) first_nan = k;
      }
      std::stable_sort(kept.begin(), kept.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      const bool none = kept.empty();
      expected.push_back(none ? kNan : kept[(kept.size() - 1) / 2].first);
      expected_index.push_back(double(none ? first_nan : kept[(kept.size() - 1) / 2].second));
    });
    Shape out_shape = shape;
    if (!shape.empty()) out_shape.erase(out_shape.begin() + d);
    for (const auto& [layout, laid] : testing::layouts(x)) {
      SCOPED_TRACE(layout + " " + detail::describe(x) + " dim " + std::to_string(d));
      const auto [v, i] = nanmedian(laid, d);
      expect_close(v, expected, out_shape, dtype, 0, 0);
      expect_close(i, expected_index, out_shape, kInt64, 0, 0);
      // Over every element: the lower median of all the numbers.
      std::vector<double> all;
      for (double e : xv)
        if (e == e) all.push_back(e);
      std::sort(all.begin(), all.end());
      expect_close(laid.nanmedian(), {all.empty() ? kNan : all[(all.size() - 1) / 2]}, {}, dtype, 0,
                   0);
    }
  }
  // Over all elements the gradient is shared among the elements equal to the median (torch's).
  const Tensor y = from_vector(std::vector<double>{kNan, 2, 1, 2, kNan}).requires_grad_();
  nanmedian(y).backward();
  expect_close(y.grad(), {0, 0.5, 0, 0.5, 0}, {5}, kFloat64, 0, 0);  // the median 2, twice
  const Tensor z = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return std::get<0>(nanmedian(in[0], 1)); }, {z}));
  expect_error([] { nanmedian(ones({2, 0}), 1); }, {"nanmedian", "non-zero size"});
}

TEST(CholeskySolve, SolvesWithTheFactorReadingOnlyItsTriangle) {
  for (bool upper : {false, true}) {
    for (DType dtype : {kFloat32, kFloat64}) {
      const Tensor m = testing::random_tensor({2, 4, 4}, kFloat64);
      const Tensor a = matmul(m, m.transpose(-2, -1)) + eye(4, kFloat64) * 4.0;
      const Tensor b = testing::random_tensor({3, 1, 4, 2}, kFloat64);  // batch dims broadcast
      Tensor factor = linalg::cholesky(a, upper);
      // The other triangle holds garbage: only the factor's is read.
      const Tensor garbage = testing::random_tensor({2, 4, 4}, kFloat64, 5, 9);
      factor = upper ? factor + tril(garbage, -1) : factor + triu(garbage, 1);
      const Tensor x = cholesky_solve(b.to(dtype), factor.to(dtype), upper);
      SCOPED_TRACE(std::string(upper ? "upper " : "lower ") + dtype_name(dtype));
      const double tol = dtype == kFloat32 ? 1e-4 : 1e-11;
      expect_close(x, values(linalg::solve(a, b)), {3, 2, 4, 2}, dtype, tol, tol);
      expect_close(b.to(dtype).cholesky_solve(factor.to(dtype), upper), values(x), {3, 2, 4, 2},
                   dtype, 0, 0);
    }
  }
  const Tensor l = (linalg::cholesky(eye(3, kFloat64) * 2.0) +
                    testing::random_tensor({3, 3}, kFloat64, 0, 0.1).tril(-1))
                       .requires_grad_();
  const Tensor rhs = testing::random_tensor({3, 2}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cholesky_solve(in[1], in[0].tril()); },
                                 {l, rhs}));
  expect_error([] { cholesky_solve(ones({3, 2}), ones({2, 2})); }, {"cholesky_solve", "[3, 2]"});
}

// ------------------------------------------------------------ method forms

TEST(StatisticsMethods, EachMethodIsItsFunction) {
  const Tensor x = testing::random_tensor({3, 4}, kFloat64, 0.5, 3);
  const Tensor y = testing::random_tensor({3, 4}, kFloat64);
  EXPECT_TRUE(equal(x.log10(), log10(x)));
  EXPECT_TRUE(equal(y.sinc(), sinc(y)));
  EXPECT_TRUE(equal(x.hypot(y), hypot(x, y)));
  EXPECT_TRUE(equal(y.round().heaviside(x), heaviside(y.round(), x)));
  EXPECT_TRUE(equal(y.msort(), msort(y)));
  EXPECT_TRUE(equal(y.cov(0), cov(y, 0)));
  EXPECT_TRUE(equal(y.diff(1, 0), diff(y, 1, 0)));
  EXPECT_TRUE(equal(y.rot90(2), rot90(y, 2)));
  // log10 of the powers of ten is exact in both dtypes; hypot neither overflows nor underflows.
  expect_close(log10(from_vector(std::vector<double>{1, 10, 1e3, 1e22, 0, -1})),
               {0, 1, 3, 22, -kInf, kNan}, {6}, kFloat64, 0, 0);
  expect_close(log10(from_vector(std::vector<float>{1e3f, 1e10f})), {3, 10}, {2}, kFloat32, 0, 0);
  expect_close(hypot(from_vector(std::vector<double>{3e300, 3e-300, kInf, kNan}),
                     from_vector(std::vector<double>{4e300, 4e-300, kNan, 1})),
               {5e300, 5e-300, kInf, kNan}, {4}, kFloat64, 1e-15, 0);
  expect_close(sinc(from_vector(std::vector<double>{0, 0.5, 1})), {1, 2 / M_PI, 0}, {3}, kFloat64,
               1e-15, 1e-15);
  expect_close(
      heaviside(from_vector(std::vector<double>{-1, 0, 2, kNan}), scalar_tensor(0.5, kFloat64)),
      {0, 0.5, 1, 0}, {4}, kFloat64, 0, 0);
  // Their gradients: hypot's g a / y, sinc's 0 at 0, heaviside's 0.
  const Tensor s = from_vector(std::vector<double>{0, 0.5}).requires_grad_();
  sinc(s).sum().backward();
  expect_close(s.grad(), {0, -4 / M_PI}, {2}, kFloat64, 1e-12, 1e-12);
  const Tensor h = from_vector(std::vector<double>{-1, 2}).requires_grad_();
  heaviside(h, h).sum().backward();
  expect_close(h.grad(), {0, 0}, {2}, kFloat64, 0, 0);
}

// ------------------------------------------------------------ threads

// Four threads calling the statistics (sorts on the thread pool inside) get the sequential results.
TEST(StatisticsThreads, ConcurrentCallsMatchSequentialOnes) {
  const Tensor x = testing::random_tensor({32, 300}, kFloat64).round();  // ties
  const Tensor y = testing::random_tensor({40, 300}, kFloat64);
  auto run = [&] {
    return In{std::get<1>(sort(x, 1)),
              quantile(x, 0.3, int64_t{1}),
              std::get<1>(unique(x, true, true, false)),
              histc(x, 11),
              bincount(x.abs().to(kInt64).reshape({-1})),
              cdist(x, y),
              std::get<1>(nanmedian(x, 0))};
  };
  testing::expect_concurrent_runs_match(run, 4, 3);
}

// ------------------------------------------------------------ lazy recording

TEST(StatisticsLazy, CompositesRecordAndMatchEagerMode) {
  const Tensor x = testing::input({4, 6}, kFloat32);
  const Tensor y = testing::input({5, 6}, kFloat32);
  testing::check_lazy(
      "statistics and grids",
      [&] {
        return std::vector<Tensor>{quantile(x * 2.0, 0.25, int64_t{1}),
                                   cov(x + 1.0),
                                   cdist(x * 0.5, y, 2, 2),
                                   trapezoid(x.exp(), 0.5),
                                   diff(x - 1.0, 2),
                                   tensordot(x * 3.0, y, {1}, {1}),
                                   hypot(x, y.narrow(0, 0, 4)),
                                   log10(x.abs() + 1.0),
                                   sinc(x),
                                   heaviside(x.round(), y.narrow(0, 1, 4))};
      },
      false);
}

}  // namespace
}  // namespace kiln
