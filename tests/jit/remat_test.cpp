// Rematerialization in lazy mode: a pending value that autograd saved, cheap to recompute from
// materialized values (exec/lazy_recipe.cpp, Collector::stays_recipe), is left as a recipe by the
// forward's evaluation and recomputed inside the backward's kernel. The gradients must be eager
// mode's whatever happens between the two: in-place writes, random draws, user reads.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/jit/log_capture.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::is_pending;
using detail::pending_count;

constexpr const char* kKeptOne = "left 1 value(s) held elsewhere as recipes";

// Logits that require grad, class indices [rows, 1] and the classes [1, cols], all concrete.
struct Batch {
  Tensor x, target, classes;
};

Batch make_batch(int64_t rows, int64_t cols, DType dtype) {
  LazyGuard eager(false);
  Batch b;
  b.x = testing::random_tensor({rows, cols}, dtype).requires_grad_(true);
  b.target = randint(0, cols, {rows, 1}, TensorOptions().dtype(kInt64));
  b.classes = arange(cols, TensorOptions().dtype(kInt64)).unsqueeze(0);
  return b;
}

Tensor one_hot(const Batch& b, DType dtype) {
  return eq(b.classes, b.target).to(dtype);
}

// Cross entropy from primitives, the one-hot made in the expression (as tools/bench's row
// model): per row, then their mean.
Tensor row_losses(const Batch& b, const Tensor& x) {
  return logsumexp(x, {1}) - (x * one_hot(b, x.dtype())).sum({1});
}
Tensor cross_entropy(const Batch& b, const Tensor& x) {
  return row_losses(b, x).mean();
}

// d loss / d x in float64: (softmax(x) - onehot(target)) / rows, from x's values.
std::vector<double> reference_gradient(const Tensor& x, const std::vector<double>& target) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const std::vector<double> v = testing::values(x);
  std::vector<double> g(v.size());
  for (int64_t i = 0; i < rows; ++i) {
    const double* row = v.data() + i * cols;
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < cols; ++j) top = std::max(top, row[j]);
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - top);
    for (int64_t j = 0; j < cols; ++j) {
      const double hot = static_cast<double>(j) == target[static_cast<size_t>(i)] ? 1.0 : 0.0;
      g[static_cast<size_t>(i * cols + j)] = (std::exp(row[j] - top) / sum - hot) / rows;
    }
  }
  return g;
}

// The forward evaluated lazily; returns what KILN_LOG=lazy said.
std::string evaluate_logged(const Tensor& t) {
  return testing::logged("lazy", [&] { kiln::eval(t); });
}

TEST(Remat, CrossEntropyLeavesTheOneHotAsARecipeAndMatchesTheReferenceGradient) {
  const Batch b = make_batch(64, 128, kFloat32);
  const std::vector<double> target = testing::values(b.target);
  LazyGuard lazy(true);
  const int64_t p0 = pending_count();
  const Tensor loss = cross_entropy(b, b.x);
  const std::string log = evaluate_logged(loss);
  // The one-hot, saved by mul for its backward, is not computed: its two nodes (eq, to) stay.
  EXPECT_NE(log.find(kKeptOne), std::string::npos) << log;
  EXPECT_EQ(pending_count() - p0, 2);
  const Tensor g = autograd::grad({loss}, {b.x})[0];
  kiln::eval(g);
  // The backward recomputed it, and nothing keeps its recipe alive now.
  EXPECT_EQ(pending_count(), p0);
  testing::expect_close(g, reference_gradient(b.x, target), {64, 128}, kFloat32, 1e-5, 1e-8);
}

TEST(Remat, ABackwardThatKeepsItsGraphLeavesTheRecipeForTheNextOne) {
  const Batch b = make_batch(16, 32, kFloat32);
  const std::vector<double> want = reference_gradient(b.x, testing::values(b.target));
  LazyGuard lazy(true);
  const Tensor loss = cross_entropy(b, b.x);
  kiln::eval(loss);
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass);
    const Tensor g = autograd::grad({loss}, {b.x}, {}, /*retain_graph=*/pass == 0)[0];
    const std::string log = evaluate_logged(g);
    if (pass == 0) EXPECT_NE(log.find(kKeptOne), std::string::npos) << log;
    testing::expect_close(g, want, {16, 32}, kFloat32, 1e-5, 1e-8);
  }
}

TEST(Remat, AValueTheUserHoldsIsComputedWhenAskedAndTheGradientAgrees) {
  const Batch b = make_batch(16, 32, kFloat32);
  const std::vector<double> target = testing::values(b.target);
  LazyGuard lazy(true);
  const Tensor onehot = one_hot(b, kFloat32);
  const Tensor loss = (logsumexp(b.x, {1}) - (b.x * onehot).sum({1})).mean();
  const std::string log = evaluate_logged(loss);
  EXPECT_NE(log.find(kKeptOne), std::string::npos) << log;
  EXPECT_TRUE(is_pending(onehot));
  // Read by the user between forward and backward: computed once, then the backward reads it.
  kiln::eval(onehot);
  EXPECT_FALSE(is_pending(onehot));
  const std::vector<double> hot = testing::values(onehot);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 32; ++j)
      ASSERT_EQ(hot[static_cast<size_t>(i * 32 + j)],
                static_cast<double>(j) == target[static_cast<size_t>(i)] ? 1.0 : 0.0);
  const Tensor g = autograd::grad({loss}, {b.x})[0];
  testing::expect_close(g, reference_gradient(b.x, target), {16, 32}, kFloat32, 1e-5, 1e-8);
}

TEST(Remat, ARecipeOverATensorThatRequiresGradKeepsNothingAliveThatWasNotAlready) {
  Tensor x;
  {
    LazyGuard eager(false);
    x = testing::random_tensor({64, 128}, kFloat32).requires_grad_(true);
  }
  LazyGuard lazy(true);
  const Tensor s = x * 2.0;  // saved twice by s * s; reads as many bytes as it stores
  const Tensor loss = (s * s).sum();
  const std::string log = evaluate_logged(loss);
  EXPECT_NE(log.find(kKeptOne), std::string::npos) << log;
  EXPECT_TRUE(is_pending(s));
  const Tensor g = autograd::grad({loss}, {x})[0];
  std::vector<double> want = testing::values(x);
  for (double& v : want) v *= 8.0;
  testing::expect_close(g, want, {64, 128}, kFloat32, 0.0, 0.0);
}

TEST(Remat, AValueAGemmReadsIsSavedNotRecomputed) {
  Tensor x, w;
  {
    LazyGuard eager(false);
    x = testing::random_tensor({16, 32}, kFloat32).requires_grad_(true);
    w = testing::random_tensor({32, 8}, kFloat32).requires_grad_(true);
  }
  LazyGuard lazy(true);
  const Tensor s = x * 2.0;  // saved by matmul for w's gradient, written out for the GEMM anyway
  const Tensor loss = s.matmul(w).sum();
  const std::string log = evaluate_logged(loss);
  EXPECT_EQ(log.find("as recipes"), std::string::npos) << log;
  EXPECT_FALSE(is_pending(s));
}

TEST(Remat, AValueOnlyTheProgramHoldsIsComputedWithTheEvaluationThatReachesIt) {
  const Batch b = make_batch(16, 32, kFloat32);
  LazyGuard lazy(true);
  const Tensor onehot = one_hot(b, kFloat32);  // saved by nothing: x does not require grad here
  const Tensor loss = (b.x.detach() * onehot).sum();
  const std::string log = evaluate_logged(loss);
  EXPECT_EQ(log.find("as recipes"), std::string::npos) << log;
  EXPECT_FALSE(is_pending(onehot));
}

// The gradient after the targets are overwritten in place between forward and backward.
Tensor gradient_after_overwriting_targets(const Batch& b, bool lazy_mode) {
  LazyGuard mode(lazy_mode);
  const Tensor loss = cross_entropy(b, b.x);
  if (lazy_mode) {
    const std::string log = evaluate_logged(loss);
    EXPECT_NE(log.find(kKeptOne), std::string::npos) << log;
  }
  Tensor target = b.target;
  target.fill_(0);
  const Tensor g = autograd::grad({loss}, {b.x})[0];
  kiln::eval(g);
  return g;
}

TEST(Remat, AnInPlaceWriteToARecipesInputBetweenForwardAndBackwardKeepsEagersGradient) {
  const Batch lazy_batch = make_batch(32, 48, kFloat32);
  Batch eager_batch;
  {
    LazyGuard eager(false);
    eager_batch = {lazy_batch.x.detach().clone().requires_grad_(true), lazy_batch.target.clone(),
                   lazy_batch.classes};
  }
  const std::vector<double> target = testing::values(lazy_batch.target);
  const Tensor eager_grad = gradient_after_overwriting_targets(eager_batch, false);
  const Tensor lazy_grad = gradient_after_overwriting_targets(lazy_batch, true);
  // Both read the targets as they were at the forward: the write flushed the recipe first.
  const std::vector<double> want = reference_gradient(lazy_batch.x, target);
  testing::expect_close(eager_grad, want, {32, 48}, kFloat32, 1e-5, 1e-8);
  testing::expect_close(lazy_grad, want, {32, 48}, kFloat32, 1e-5, 1e-8);
  testing::expect_lazy_equal(lazy_grad, eager_grad, "gradient");
}

TEST(Remat, AnInPlaceWriteToASavedInputRaisesAsInEagerMode) {
  for (const bool lazy_mode : {false, true}) {
    SCOPED_TRACE(lazy_mode ? "lazy" : "eager");
    const Batch b = make_batch(8, 16, kFloat32);
    LazyGuard mode(lazy_mode);
    const Tensor h = b.x * 1.0;  // not a leaf: writable in place
    const Tensor loss = cross_entropy(b, h);
    kiln::eval(loss);
    h.detach().mul_(2.0);
    testing::expect_error([&] { (void)autograd::grad({loss}, {b.x}); },
                          {"modified by an in-place operation"});
  }
}

TEST(Remat, RandomMasksAreNotDrawnAgain) {
  Tensor x;
  {
    LazyGuard eager(false);
    x = testing::random_tensor({32, 64}, kFloat64, 0.5, 2.0).requires_grad_(true);
  }
  LazyGuard lazy(true);
  manual_seed(7);
  const Tensor draws = rand({32, 64});  // float32: half the bytes of the float64 mask
  const Tensor loss = (x * (lt(draws, 0.5).to(kFloat64) * 2.0)).sum();
  const std::string log = evaluate_logged(loss);
  EXPECT_NE(log.find(kKeptOne), std::string::npos) << log;
  // Draws after the forward must not change the mask the backward uses.
  manual_seed(8);
  (void)rand({32, 64}).sum().item<float>();
  const Tensor g = autograd::grad({loss}, {x})[0];
  const std::vector<double> r = testing::values(draws), got = testing::values(g);
  ASSERT_EQ(got.size(), r.size());
  for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(got[i], r[i] < 0.5 ? 2.0 : 0.0) << i;

  // dropout's mask too: where the forward kept an element, the gradient is 1 / (1 - p).
  const Tensor y = dropout(x, 0.5, true);
  const Tensor out = y.sum();
  kiln::eval(out);
  manual_seed(9);
  const Tensor gy = autograd::grad({out}, {x})[0];
  const std::vector<double> kept = testing::values(y), gv = testing::values(gy);
  for (size_t i = 0; i < kept.size(); ++i) ASSERT_EQ(gv[i], kept[i] != 0 ? 2.0 : 0.0) << i;
}

TEST(Remat, ThreadsEachRecomputeTheirOwnRecipes) {
  constexpr int kThreads = 4;
  std::vector<Batch> batches;
  std::vector<std::vector<double>> want;
  for (int i = 0; i < kThreads; ++i) {
    batches.push_back(make_batch(32, 64, kFloat32));
    want.push_back(reference_gradient(batches.back().x, testing::values(batches.back().target)));
  }
  std::vector<Tensor> grads(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      LazyGuard lazy(true);
      for (int step = 0; step < 5; ++step) {
        const Tensor loss = cross_entropy(batches[i], batches[i].x);
        kiln::eval(loss);
        grads[i] = autograd::grad({loss}, {batches[i].x})[0];
        kiln::eval(grads[i]);
      }
    });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    testing::expect_close(grads[i], want[i], {32, 64}, kFloat32, 1e-5, 1e-8);
}

TEST(Remat, GradcheckOnSmallShapesAndBroadcasts) {
  for (const Shape& shape : std::vector<Shape>{{0, 5}, {1, 1}, {1, 5}, {3, 5}, {4, 1}, {6, 7}}) {
    SCOPED_TRACE(detail::shape_str(shape));
    const Batch b = make_batch(shape[0], shape[1], kFloat64);
    LazyGuard lazy(true);
    // The forward is evaluated on its own, so that the backward finds the saved one-hot (and the
    // broadcast sign matrix) pending.
    auto fn = [&](const std::vector<Tensor>& in) {
      const Tensor sign = eq(b.classes, b.target).to(kFloat64) * 2.0 - 1.0;
      // A sum over rows, not a mean: the mean of no rows is NaN.
      Tensor out = row_losses(b, in[0]).sum() + (in[0] * sign * in[1]).sum();
      kiln::eval(out);
      return out;
    };
    Tensor w;
    {
      LazyGuard eager(false);
      w = testing::random_tensor({1, shape[1]}, kFloat64).requires_grad_(true);
    }
    try {
      EXPECT_TRUE(testing::gradcheck(fn, {Tensor(b.x), w}));
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
