// Tests of the NN ops (softmax, log_softmax, layer_norm, nll_loss, cross_entropy, mse_loss,
// dropout) against float64 reference loops, over random shapes, every dim and non-contiguous
// layouts.
#include <cmath>
#include <limits>

#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::layouts;
using testing::random_shape;
using testing::random_tensor;
using testing::values;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tolerances for results computed in `dtype`.
double rtol_for(DType dt) {
  return dt == kFloat64 ? 1e-12 : 1e-5;
}
double atol_for(DType dt) {
  return dt == kFloat64 ? 1e-13 : 1e-6;
}

// [outer, D, inner] view of a row-major shape reduced over `dim` (a 0-dim shape is one row of 1).
struct Split {
  int64_t outer = 1, D = 1, inner = 1;
};
Split split_at(const Shape& shape, int64_t dim) {
  Split s;
  if (shape.empty()) return s;
  int64_t d = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
  for (int64_t i = 0; i < d; ++i) s.outer *= shape[i];
  s.D = shape[d];
  for (size_t i = d + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& shape, int64_t dim,
                                bool log) {
  Split s = split_at(shape, dim);
  std::vector<double> out(x.size());
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      auto at = [&](int64_t d) { return (o * s.D + d) * s.inner + i; };
      double m = -kInf;
      for (int64_t d = 0; d < s.D; ++d) m = std::max(m, x[at(d)]);
      double sum = 0;
      for (int64_t d = 0; d < s.D; ++d) sum += std::exp(x[at(d)] - m);
      for (int64_t d = 0; d < s.D; ++d)
        out[at(d)] = log ? x[at(d)] - m - std::log(sum) : std::exp(x[at(d)] - m) / sum;
    }
  }
  return out;
}

// Every valid dim of a rank, negative ones included (0-dim tensors accept 0 and -1).
std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> dims;
  int64_t n = std::max<int64_t>(rank, 1);
  for (int64_t d = -n; d < n; ++d) dims.push_back(d);
  return dims;
}

void check_softmax_all(const Tensor& t, DType out_dtype, double rtol, double atol) {
  std::vector<double> v = values(t);
  for (int64_t dim : all_dims(t.dim())) {
    std::vector<double> sm = ref_softmax(v, t.sizes(), dim, false);
    std::vector<double> lsm = ref_softmax(v, t.sizes(), dim, true);
    for (const auto& [name, x] : layouts(t)) {
      SCOPED_TRACE(::testing::Message()
                   << name << " " << ::testing::PrintToString(t.sizes()) << " dim " << dim);
      expect_close(softmax(x, dim), sm, t.sizes(), out_dtype, rtol, atol);
      expect_close(log_softmax(x, dim), lsm, t.sizes(), out_dtype, rtol, atol);
    }
  }
}

// ------------------------------------------------------------------------------------- softmax
TEST(Softmax, MatchesReferenceOverShapesDimsAndLayouts) {
  for (DType dt : {kFloat32, kFloat64}) {
    for (int iter = 0; iter < 40; ++iter) {
      Tensor t = random_tensor(random_shape(0, 4, 5), dt, -5, 5);
      check_softmax_all(t, dt, rtol_for(dt), atol_for(dt));
    }
  }
}

TEST(Softmax, LongRowsAndWideColumnBlocks) {
  // Rows longer than the summation block, columns wider than the column block (with a remainder),
  // and sizes large enough to be split across threads.
  for (DType dt : {kFloat32, kFloat64}) {
    for (Shape shape : {Shape{3, 1000}, Shape{1100, 3}, Shape{2, 300, 5}, Shape{2, 3, 600},
                        Shape{40, 2000}, Shape{8, 100, 300}, Shape{1, 70000}, Shape{3, 5000}}) {
      Tensor t = random_tensor(shape, dt, -10, 10);
      std::vector<double> v = values(t);
      for (int64_t dim : all_dims(t.dim())) {
        SCOPED_TRACE(::testing::Message() << ::testing::PrintToString(shape) << " dim " << dim);
        expect_close(softmax(t, dim), ref_softmax(v, shape, dim, false), shape, dt, rtol_for(dt),
                     atol_for(dt));
        expect_close(log_softmax(t, dim), ref_softmax(v, shape, dim, true), shape, dt,
                     rtol_for(dt) * 10, atol_for(dt) * 10);
      }
    }
  }
}

TEST(Softmax, RowsSumToOne) {
  for (DType dt : {kFloat32, kFloat64}) {
    for (int64_t dim : {0, 1, -1}) {
      Tensor t = random_tensor({37, 129}, dt, -20, 20);
      Tensor s = softmax(t, dim);
      Split sp = split_at(t.sizes(), dim);
      std::vector<double> v = values(s);
      for (int64_t o = 0; o < sp.outer; ++o) {
        for (int64_t i = 0; i < sp.inner; ++i) {
          double sum = 0;
          for (int64_t d = 0; d < sp.D; ++d) {
            double p = v[(o * sp.D + d) * sp.inner + i];
            EXPECT_GE(p, 0.0);
            EXPECT_LE(p, 1.0);
            sum += p;
          }
          EXPECT_NEAR(sum, 1.0, dt == kFloat32 ? 1e-5 : 1e-12);
        }
      }
    }
  }
}

TEST(Softmax, StableWithLargeLogits) {
  for (DType dt : {kFloat32, kFloat64}) {
    for (double base : {1000.0, -1000.0, 1e4}) {
      Tensor x = from_vector(std::vector<double>{base, base + 1, base + 2}).to(dt);
      std::vector<double> ref = ref_softmax({0, 1, 2}, {3}, 0, false);
      std::vector<double> lref = ref_softmax({0, 1, 2}, {3}, 0, true);
      expect_close(softmax(x, 0), ref, {3}, dt, 1e-5, 1e-6);
      expect_close(log_softmax(x, 0), lref, {3}, dt, 1e-5, 1e-6);
      expect_close(softmax(x.reshape({3, 1}), 0), ref, {3, 1}, dt, 1e-5, 1e-6);
      expect_close(log_softmax(x.reshape({3, 1}), 0), lref, {3, 1}, dt, 1e-5, 1e-6);
    }
    // Far-apart logits: the small probabilities underflow to exactly 0, log-probs stay finite.
    Tensor far = from_vector(std::vector<double>{0, 1000, -1000}).to(dt);
    expect_close(softmax(far, 0), {0, 1, 0}, {3}, dt, 0, 0);
    expect_close(log_softmax(far, 0), {-1000, 0, -2000}, {3}, dt, 1e-6, 0);
    // -inf logits get probability 0 and log-probability -inf.
    Tensor inf = from_vector(std::vector<double>{0, -kInf, 0}).to(dt);
    expect_close(softmax(inf, 0), {0.5, 0, 0.5}, {3}, dt, 1e-6, 0);
    expect_close(log_softmax(inf, 0), {-std::log(2.0), -kInf, -std::log(2.0)}, {3}, dt, 1e-6, 0);
  }
}

TEST(Softmax, NaNSpoilsOnlyItsRow) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector(std::vector<double>{1, nan, 2, 1, 2, 3}, Shape{2, 3}).to(kFloat32);
  std::vector<double> row = ref_softmax({1, 2, 3}, {3}, 0, false);
  expect_close(softmax(x, 1), {nan, nan, nan, row[0], row[1], row[2]}, {2, 3}, kFloat32);
  std::vector<double> col = ref_softmax({2, 3}, {2}, 0, false);
  expect_close(softmax(x, 0), {0.5, nan, col[0], 0.5, nan, col[1]}, {2, 3}, kFloat32);
}

TEST(Softmax, ExpAccuracyAcrossTheRange) {
  // Pairs [0, t]: the second probability is exp(t) / (1 + exp(t)) for t down to the underflow.
  std::vector<double> xs;
  for (int i = 0; i <= 2100; ++i) {
    xs.push_back(0);
    xs.push_back(-0.05 * i);
  }
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor pairs = from_vector(xs, Shape{2101, 2}).to(dt);
    std::vector<double> v = values(pairs);
    expect_close(softmax(pairs, 1), ref_softmax(v, pairs.sizes(), 1, false), pairs.sizes(), dt,
                 dt == kFloat32 ? 2e-6 : 1e-14, dt == kFloat32 ? 3e-45 : 1e-320);
  }
}

TEST(Softmax, IntegerAndBoolInputsPromoteToFloat32) {
  for (DType dt : {kInt32, kInt64, kBool}) {
    Tensor t = random_tensor({4, 5}, dt, -10, 10);
    SCOPED_TRACE(dtype_name(dt));
    check_softmax_all(t, kFloat32, 1e-5, 1e-6);
  }
}

TEST(Softmax, EmptyAndZeroDim) {
  for (Shape shape : {Shape{3, 0}, Shape{0, 4}, Shape{2, 0, 3}}) {
    Tensor t = zeros(shape);
    for (int64_t dim : all_dims(t.dim())) {
      EXPECT_EQ(softmax(t, dim).sizes(), shape);
      EXPECT_EQ(log_softmax(t, dim).sizes(), shape);
      EXPECT_EQ(softmax(t, dim).dtype(), kFloat32);
    }
  }
  Tensor s = scalar_tensor(3.5, kFloat64);
  expect_close(softmax(s, 0), {1.0}, {}, kFloat64);
  expect_close(softmax(s, -1), {1.0}, {}, kFloat64);
  expect_close(log_softmax(s, 0), {0.0}, {}, kFloat64);
  Tensor one = full({4, 1}, 7.0);
  expect_close(softmax(one, 1), {1, 1, 1, 1}, {4, 1}, kFloat32);
}

TEST(Softmax, MethodsMatchFreeFunctions) {
  Tensor t = random_tensor({3, 4});
  EXPECT_TRUE(equal(t.softmax(1), softmax(t, 1)));
  EXPECT_TRUE(equal(t.log_softmax(0), log_softmax(t, 0)));
}

TEST(Softmax, Errors) {
  Tensor t = zeros({2, 3});
  expect_error([&] { softmax(t, 2); }, {"softmax", "dimension out of range", "2"});
  expect_error([&] { softmax(t, -3); }, {"softmax", "-3"});
  expect_error([&] { log_softmax(t, 5); }, {"log_softmax", "dimension out of range"});
  expect_error([&] { softmax(Tensor(), 0); }, {"softmax"});
  expect_error([&] { softmax(scalar_tensor(1.0), 1); }, {"softmax", "out of range"});
}

// ---------------------------------------------------------------------------------- layer_norm
std::vector<double> ref_layer_norm(const std::vector<double>& x, int64_t n,
                                   const std::vector<double>* w, const std::vector<double>* b,
                                   double eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; n > 0 && r < x.size() / n; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[r * n + i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i) {
      double y = (x[r * n + i] - mean) / std::sqrt(var + eps);
      if (w) y *= (*w)[i];
      if (b) y += (*b)[i];
      out[r * n + i] = y;
    }
  }
  return out;
}

TEST(LayerNorm, MatchesReferenceWithAndWithoutAffine) {
  for (DType dt : {kFloat32, kFloat64}) {
    const double rtol = dt == kFloat32 ? 1e-4 : 1e-10, atol = dt == kFloat32 ? 1e-4 : 1e-10;
    for (int iter = 0; iter < 25; ++iter) {
      Tensor t = random_tensor(random_shape(1, 4, 5), dt);
      for (int64_t k = 1; k <= std::min<int64_t>(2, t.dim()); ++k) {
        Shape ns(t.sizes().end() - k, t.sizes().end());
        Tensor w = random_tensor(ns, dt), b = random_tensor(ns, dt);
        std::vector<double> wv = values(w), bv = values(b), xv = values(t);
        int64_t n = 1;
        for (int64_t s : ns) n *= s;
        for (int affine = 0; affine < 4; ++affine) {
          bool use_w = affine & 1, use_b = affine & 2;
          double eps = iter % 2 ? 1e-5 : 0.5;
          std::vector<double> ref =
              ref_layer_norm(xv, n, use_w ? &wv : nullptr, use_b ? &bv : nullptr, eps);
          for (const auto& [name, x] : layouts(t)) {
            // The weight and bias in a non-contiguous layout too.
            Tensor wl = layouts(w).back().second, bl = layouts(b).back().second;
            SCOPED_TRACE(::testing::Message() << name << " " << ::testing::PrintToString(t.sizes())
                                              << " k " << k << " affine " << affine);
            expect_close(layer_norm(x, ns, use_w ? wl : Tensor(), use_b ? bl : Tensor(), eps), ref,
                         t.sizes(), dt, rtol, atol);
          }
        }
      }
    }
  }
}

// An eager backward that builds no graph computes the statistics by the row kernel's code; one
// that does (create_graph) composes them of ops, so that they differentiate again. Both give the
// same gradients, in every layout, for rows of one element and of none.
TEST(LayerNorm, EagerBackwardMatchesTheDifferentiableBackward) {
  LazyGuard eager(false);
  for (DType dt : {kFloat32, kFloat64}) {
    const double rtol = dt == kFloat32 ? 1e-5 : 1e-12, atol = dt == kFloat32 ? 1e-5 : 1e-12;
    std::vector<Shape> shapes = {{3, 1}, {0, 4}, {3, 0}, {1, 5}};
    for (int iter = 0; iter < 12; ++iter) shapes.push_back(random_shape(2, 3, 6));
    for (const Shape& shape : shapes) {
      Tensor t = random_tensor(shape, dt, -3, 3);
      for (int64_t k = 1; k <= std::min<int64_t>(2, t.dim()); ++k) {
        Shape ns(t.sizes().end() - k, t.sizes().end());
        Tensor w = random_tensor(ns, dt, 0.5, 2).requires_grad_(true);
        Tensor b = random_tensor(ns, dt).requires_grad_(true);
        Tensor g = random_tensor(shape, dt);
        for (const auto& [name, layout] : layouts(t)) {
          SCOPED_TRACE(::testing::Message() << name << " " << ::testing::PrintToString(shape)
                                            << " k " << k << " " << dtype_name(dt));
          Tensor x = layout.detach().requires_grad_(true);
          Tensor y = layer_norm(x, ns, w, b, 1e-5);
          std::vector<Tensor> kernel = autograd::grad({y}, {x, w, b}, {g}, true, false);
          std::vector<Tensor> composed = autograd::grad({y}, {x, w, b}, {g}, true, true);
          for (size_t i = 0; i < 3; ++i)
            expect_close(kernel[i], values(composed[i].detach()), composed[i].sizes(), dt, rtol,
                         atol);
        }
      }
    }
  }
}

TEST(LayerNorm, LargeRowsAcrossThreads) {
  for (Shape shape : {Shape{64, 1000}, Shape{3, 40000}, Shape{5000, 7}}) {
    Tensor t = random_tensor(shape, kFloat32, -2, 6);
    Shape ns{shape.back()};
    Tensor w = random_tensor(ns), b = random_tensor(ns);
    std::vector<double> wv = values(w), bv = values(b);
    expect_close(layer_norm(t, ns, w, b), ref_layer_norm(values(t), shape.back(), &wv, &bv, 1e-5),
                 shape, kFloat32, 1e-4, 1e-4);
  }
}

TEST(LayerNorm, ConstantRowsGiveTheBias) {
  Tensor t = full({3, 4}, 2.5);
  Tensor b = from_vector(std::vector<float>{1, 2, 3, 4});
  expect_close(layer_norm(t, {4}, ones({4}), b), {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}, {3, 4},
               kFloat32, 0, 0);
  expect_close(layer_norm(t, {4}), std::vector<double>(12, 0.0), {3, 4}, kFloat32, 0, 0);
}

TEST(LayerNorm, IntegerInputPromotesAndEmptyInputs) {
  Tensor t = random_tensor({3, 4}, kInt64, -10, 10);
  expect_close(layer_norm(t, {4}), ref_layer_norm(values(t), 4, nullptr, nullptr, 1e-5), {3, 4},
               kFloat32, 1e-4, 1e-4);
  EXPECT_EQ(layer_norm(zeros({0, 4}), {4}).sizes(), (Shape{0, 4}));
  EXPECT_EQ(layer_norm(zeros({3, 0}), {0}).sizes(), (Shape{3, 0}));
  EXPECT_EQ(layer_norm(zeros({2, 3, 0}), {3, 0}, zeros({3, 0}), zeros({3, 0})).sizes(),
            (Shape{2, 3, 0}));
}

TEST(LayerNorm, Errors) {
  Tensor x = zeros({2, 4});
  expect_error([&] { layer_norm(x, {3}); }, {"layer_norm", "[3]", "float32[2, 4]"});
  expect_error([&] { layer_norm(x, {2, 4, 1}); }, {"layer_norm", "[2, 4, 1]", "float32[2, 4]"});
  expect_error([&] { layer_norm(x, {}); }, {"layer_norm", "normalized_shape", "float32[2, 4]"});
  expect_error([&] { layer_norm(x, {4}, zeros({3})); },
               {"layer_norm", "weight", "float32[3]", "[4]"});
  expect_error(
      [&] {
        layer_norm(x, {4}, Tensor(), zeros({2, 4}));
      },
      {"layer_norm", "bias", "float32[2, 4]", "[4]"});
  expect_error([&] { layer_norm(Tensor(), {4}); }, {"layer_norm"});
}

// ------------------------------------------------------------------------------------ nll_loss
double reduce_ref(const std::vector<double>& losses, Reduction r) {
  double s = 0;
  for (double l : losses) s += l;
  return r == Reduction::Sum ? s : s / static_cast<double>(losses.size());
}

// Per-element -input[n, target, k...] over input [N, C, K...] (or [C] with a 0-dim target).
std::vector<double> ref_nll(const std::vector<double>& lp, const Shape& shape,
                            const std::vector<double>& target) {
  int64_t C = shape.size() == 1 ? shape[0] : shape[1], K = 1;
  for (size_t i = 2; i < shape.size(); ++i) K *= shape[i];
  std::vector<double> out(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t n = i / K, k = i % K, c = static_cast<int64_t>(target[i]);
    out[i] = -lp[(n * C + c) * K + k];
  }
  return out;
}

void check_loss(const std::function<Tensor(Reduction)>& f, const std::vector<double>& per_element,
                const Shape& target_shape, DType dt, double rtol, double atol) {
  expect_close(f(Reduction::None), per_element, target_shape, dt, rtol, atol);
  expect_close(f(Reduction::Sum), {reduce_ref(per_element, Reduction::Sum)}, {}, dt, rtol, atol);
  expect_close(f(Reduction::Mean), {reduce_ref(per_element, Reduction::Mean)}, {}, dt, rtol, atol);
}

TEST(NllLoss, MatchesReferenceForAllReductions) {
  auto& g = testing::rng();
  for (DType dt : {kFloat32, kFloat64}) {
    for (int iter = 0; iter < 20; ++iter) {
      int64_t N = std::uniform_int_distribution<int64_t>(0, 6)(g);
      int64_t C = std::uniform_int_distribution<int64_t>(1, 6)(g);
      Shape shape{N, C};
      if (iter % 3 == 0) shape.push_back(std::uniform_int_distribution<int64_t>(1, 3)(g));
      if (iter % 6 == 0) shape.push_back(2);
      Shape tshape{N};
      tshape.insert(tshape.end(), shape.begin() + 2, shape.end());
      Tensor lp = random_tensor(shape, dt, -5, 0);
      Tensor target = randint(0, C, tshape, iter % 2 ? kInt32 : kInt64);
      std::vector<double> per = ref_nll(values(lp), shape, values(target));
      for (const auto& [name, x] : layouts(lp)) {
        SCOPED_TRACE(::testing::Message() << name << " " << ::testing::PrintToString(shape));
        check_loss([&](Reduction r) { return nll_loss(x, target, r); }, per, tshape, dt,
                   rtol_for(dt), atol_for(dt));
      }
    }
  }
}

TEST(NllLoss, OneDimensionalInputAndEmptyBatch) {
  Tensor lp = from_vector(std::vector<double>{-0.5, -1.5, -2.5});
  Tensor t = scalar_tensor(1, kInt64);
  expect_close(nll_loss(lp, t, Reduction::None), {1.5}, {}, kFloat64);
  expect_close(nll_loss(lp, t, Reduction::Mean), {1.5}, {}, kFloat64);
  expect_close(nll_loss(lp, t, Reduction::Sum), {1.5}, {}, kFloat64);
  Tensor empty_lp = zeros({0, 4});
  Tensor empty_t = zeros({0}, kInt64);
  EXPECT_EQ(nll_loss(empty_lp, empty_t, Reduction::None).sizes(), (Shape{0}));
  EXPECT_TRUE(std::isnan(nll_loss(empty_lp, empty_t, Reduction::Mean).item<float>()));
  EXPECT_EQ(nll_loss(empty_lp, empty_t, Reduction::Sum).item<float>(), 0.0f);
  // The default reduction is the mean.
  Tensor lp2 = from_vector(std::vector<float>{-1, -2, -3, -4}, Shape{2, 2});
  Tensor t2 = from_vector(std::vector<int64_t>{0, 1});
  expect_close(nll_loss(lp2, t2), {2.5}, {}, kFloat32);
}

TEST(NllLoss, Errors) {
  Tensor lp = zeros({2, 3});
  expect_error(
      [&] {
        nll_loss(lp, from_vector(std::vector<int64_t>{0, 3}));
      },
      {"nll_loss", "target 3", "out of bounds", "3 classes"});
  expect_error(
      [&] {
        nll_loss(lp, from_vector(std::vector<int32_t>{-1, 0}));
      },
      {"nll_loss", "target -1"});
  expect_error(
      [&] {
        nll_loss(lp, from_vector(std::vector<float>{0, 1}));
      },
      {"nll_loss", "float32[2]"});
  expect_error(
      [&] {
        nll_loss(lp, from_vector(std::vector<int64_t>{0, 1, 2}));
      },
      {"nll_loss", "[2]", "int64[3]", "float32[2, 3]"});
  expect_error([&] { nll_loss(zeros({3}), from_vector(std::vector<int64_t>{0})); },
               {"nll_loss", "0-dim", "int64[1]"});
  expect_error([&] { nll_loss(scalar_tensor(1.0), scalar_tensor(0, kInt64)); },
               {"nll_loss", "float32[]"});
  expect_error([&] { nll_loss(lp, Tensor()); }, {"nll_loss", "target"});
}

// ------------------------------------------------------------------------------- cross_entropy
// Per-sample logsumexp(logits[n, :, k]) - logits[n, target, k], computed from scratch.
std::vector<double> ref_cross_entropy(const std::vector<double>& x, const Shape& shape,
                                      const std::vector<double>& target) {
  int64_t C = shape.size() == 1 ? shape[0] : shape[1], K = 1;
  for (size_t i = 2; i < shape.size(); ++i) K *= shape[i];
  std::vector<double> out(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t n = i / K, k = i % K;
    double m = -kInf;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[(n * C + c) * K + k]);
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[(n * C + c) * K + k] - m);
    out[i] = m + std::log(s) - x[(n * C + static_cast<int64_t>(target[i])) * K + k];
  }
  return out;
}

TEST(CrossEntropy, MatchesReferenceFromScratch) {
  auto& g = testing::rng();
  for (DType dt : {kFloat32, kFloat64}) {
    for (int iter = 0; iter < 20; ++iter) {
      int64_t N = std::uniform_int_distribution<int64_t>(0, 6)(g);
      int64_t C = std::uniform_int_distribution<int64_t>(1, 7)(g);
      Shape shape{N, C};
      if (iter % 4 == 0) shape.push_back(3);
      Shape tshape{N};
      tshape.insert(tshape.end(), shape.begin() + 2, shape.end());
      Tensor logits = random_tensor(shape, dt, -8, 8);
      Tensor target = randint(0, C, tshape, iter % 2 ? kInt32 : kInt64);
      std::vector<double> per = ref_cross_entropy(values(logits), shape, values(target));
      for (const auto& [name, x] : layouts(logits)) {
        SCOPED_TRACE(::testing::Message() << name << " " << ::testing::PrintToString(shape));
        check_loss([&](Reduction r) { return cross_entropy(x, target, r); }, per, tshape, dt,
                   dt == kFloat32 ? 1e-5 : 1e-12, dt == kFloat32 ? 1e-5 : 1e-12);
      }
    }
  }
}

TEST(CrossEntropy, OneDimensionalLargeLogitsAndPromotion) {
  Tensor logits = from_vector(std::vector<double>{1000, 1002, 999});
  Tensor t = scalar_tensor(0, kInt64);
  std::vector<double> ref = ref_cross_entropy({1000, 1002, 999}, {3}, {0});
  expect_close(cross_entropy(logits, t, Reduction::None), ref, {}, kFloat64, 1e-12, 1e-12);
  expect_close(cross_entropy(logits.to(kFloat32), t), ref, {}, kFloat32, 1e-5, 1e-5);
  Tensor ints = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor t2 = from_vector(std::vector<int64_t>{2, 0});
  std::vector<double> per = ref_cross_entropy({1, 2, 3, 4, 5, 6}, {2, 3}, {2, 0});
  expect_close(cross_entropy(ints, t2, Reduction::None), per, {2}, kFloat32);
}

TEST(CrossEntropy, Errors) {
  Tensor logits = zeros({2, 3});
  expect_error(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int64_t>{0, 7}));
      },
      {"cross_entropy", "target 7", "3 classes"});
  expect_error([&] { cross_entropy(logits, from_vector(std::vector<int64_t>{0})); },
               {"cross_entropy", "int64[1]", "float32[2, 3]"});
  expect_error([&] { cross_entropy(logits, zeros({2})); }, {"cross_entropy", "float32[2]"});
}

// ------------------------------------------------------------------------------------ mse_loss
TEST(MseLoss, MatchesReferenceWithLayoutsAndBroadcasting) {
  for (DType dt : {kFloat32, kFloat64}) {
    for (int iter = 0; iter < 20; ++iter) {
      Shape shape = random_shape(0, 4, 5);
      Tensor a = random_tensor(shape, dt), b = random_tensor(shape, dt);
      std::vector<double> av = values(a), bv = values(b), per(av.size());
      for (size_t i = 0; i < av.size(); ++i) per[i] = (av[i] - bv[i]) * (av[i] - bv[i]);
      for (const auto& [name, x] : layouts(a)) {
        SCOPED_TRACE(::testing::Message() << name << " " << ::testing::PrintToString(shape));
        check_loss([&](Reduction r) { return mse_loss(x, b, r); }, per, shape, dt, rtol_for(dt),
                   atol_for(dt));
      }
    }
  }
  // [3, 1] against [4] broadcasts to [3, 4].
  Tensor a = random_tensor({3, 1}, kFloat64), b = random_tensor({4}, kFloat64);
  std::vector<double> av = values(a), bv = values(b), per;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) per.push_back((av[i] - bv[j]) * (av[i] - bv[j]));
  check_loss([&](Reduction r) { return mse_loss(a, b, r); }, per, {3, 4}, kFloat64, 1e-12, 1e-12);
}

TEST(MseLoss, PromotionEmptyAndErrors) {
  Tensor a = from_vector(std::vector<int64_t>{1, 2, 3}),
         b = from_vector(std::vector<int32_t>{3, 2, 0});
  expect_close(mse_loss(a, b, Reduction::None), {4, 0, 9}, {3}, kFloat32);
  expect_close(mse_loss(a, b), {13.0 / 3}, {}, kFloat32);
  expect_close(mse_loss(a, b.to(kFloat64), Reduction::Sum), {13}, {}, kFloat64);
  EXPECT_TRUE(std::isnan(mse_loss(zeros({0}), zeros({0})).item<float>()));
  EXPECT_EQ(mse_loss(zeros({0}), zeros({0}), Reduction::Sum).item<float>(), 0.0f);
  expect_error([&] { mse_loss(zeros({2, 3}), zeros({4})); }, {"mse_loss", "[2, 3]", "[4]"});
  expect_error([&] { mse_loss(zeros({2}), Tensor()); }, {"mse_loss", "target"});
}

// ------------------------------------------------------------------------------------- dropout
TEST(Dropout, ReproducibleWithManualSeed) {
  Tensor x = random_tensor({50, 40});
  manual_seed(123);
  Tensor a = dropout(x, 0.4);
  manual_seed(123);
  Tensor b = dropout(x, 0.4);
  EXPECT_TRUE(equal(a, b));
  Tensor c = dropout(x, 0.4);  // the generator moved on
  EXPECT_FALSE(equal(a, c));
  // The mask follows the logical (row-major) order, whatever the input's layout.
  for (const auto& [name, xl] : layouts(x)) {
    manual_seed(123);
    EXPECT_TRUE(equal(dropout(xl, 0.4), a)) << name;
  }
}

TEST(Dropout, KeepsAFractionNearOneMinusP) {
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    Tensor x = ones({100000});
    Tensor y = dropout(x, p);
    std::vector<float> v = y.to_vector<float>();
    int64_t kept = 0;
    for (float f : v) kept += f != 0.0f;
    // The standard deviation of the fraction is at most 0.0016; 0.01 is over six of them.
    EXPECT_NEAR(static_cast<double>(kept) / 100000.0, 1.0 - p, 0.01) << "p " << p;
  }
}

TEST(Dropout, KeptValuesAreScaledExactly) {
  for (DType dt : {kFloat32, kFloat64}) {
    for (double p : {0.5, 0.3, 0.75}) {
      Tensor x = random_tensor({30, 17}, dt, 0.5, 3.0);  // no zeros in the input
      Tensor y = dropout(x.t(), p);
      ASSERT_EQ(y.sizes(), (Shape{17, 30}));
      ASSERT_EQ(y.dtype(), dt);
      std::vector<double> xv = values(x.t()), yv = values(y);
      int64_t dropped = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        if (yv[i] == 0) {
          ++dropped;
          continue;
        }
        if (dt == kFloat32) {
          float scale = 1.0f / static_cast<float>(1.0 - p);
          EXPECT_EQ(static_cast<float>(yv[i]), static_cast<float>(xv[i]) * scale);
          if (p == 0.5 || p == 0.75) {  // 1 / (1 - p) is exact: the result is x / (1 - p) exactly
            EXPECT_EQ(static_cast<float>(yv[i]), static_cast<float>(xv[i]) / (1.0f - float(p)));
          }
        } else {
          EXPECT_EQ(yv[i], xv[i] * (1.0 / (1.0 - p)));
          if (p == 0.5 || p == 0.75) {
            EXPECT_EQ(yv[i], xv[i] / (1.0 - p));
          }
        }
      }
      EXPECT_GT(dropped, 0);
      EXPECT_LT(dropped, static_cast<int64_t>(xv.size()));
    }
  }
}

TEST(Dropout, EdgeCases) {
  Tensor x = random_tensor({4, 5});
  EXPECT_TRUE(dropout(x, 0.5, /*train=*/false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0).is_same(x));
  EXPECT_TRUE(dropout(x, 1.0, false).is_same(x));
  Tensor z = dropout(x.t(), 1.0);
  expect_close(z, std::vector<double>(20, 0.0), {5, 4}, kFloat32, 0, 0);
  Tensor zd = dropout(x.to(kFloat64), 1.0);
  expect_close(zd, std::vector<double>(20, 0.0), {4, 5}, kFloat64, 0, 0);
  EXPECT_EQ(dropout(zeros({0, 3}), 0.5).sizes(), (Shape{0, 3}));
  expect_close(dropout(scalar_tensor(2.0), 0.0), {2.0}, {}, kFloat32);
}

TEST(Dropout, Errors) {
  Tensor x = zeros({2, 3});
  expect_error([&] { dropout(x, -0.1); }, {"dropout", "between 0 and 1", "-0.1", "float32[2, 3]"});
  expect_error([&] { dropout(x, 1.5); }, {"dropout", "1.5"});
  expect_error([&] { dropout(x, std::nan("")); }, {"dropout", "nan"});
  expect_error([&] { dropout(x, 2.0, false); }, {"dropout", "2"});
  expect_error([&] { dropout(zeros({3}, kInt64), 0.5); }, {"dropout", "int64[3]"});
  expect_error([&] { dropout(zeros({3}, kBool), 0.5); }, {"dropout", "bool[3]"});
  expect_error([&] { dropout(Tensor(), 0.5); }, {"dropout"});
}

}  // namespace
}  // namespace kiln
