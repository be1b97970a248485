// Reductions and nn ops in lazy mode: each call records a pending node (errors still raise at the
// call), and the materialized values and gradients equal eager mode's bit for bit.
#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "lib/lazy.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::bytes;
using testing::check_lazy;
using testing::expect_bit_equal;
using testing::input;
using testing::input_layouts;
using testing::layouts;
using testing::random_shape;
using testing::random_tensor;
using testing::rng;

[[maybe_unused]] ::testing::Environment* const kNoFlush =
    ::testing::AddGlobalTestEnvironment(new testing::NoFlushEnvironment);

// A random subset of dims of a rank-nd shape, each given as d or d - nd at random.
std::vector<int64_t> random_dims(int64_t nd) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < nd; ++d) {
    if (rng()() % 2) continue;
    dims.push_back(rng()() % 2 ? d : d - nd);
  }
  std::shuffle(dims.begin(), dims.end(), rng());
  return dims;
}

std::string describe_dims(const std::vector<int64_t>& dims) {
  return detail::shape_str(dims);
}

// The node behind a pending tensor.
const detail::LazyNode& node_of(const Tensor& t) {
  return *t.impl()->storage->lazy.node;
}

// ---------------------------------------------------------------------------------- reductions

using DimsReduction = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;

void check_dims_reduction(const std::string& name, const DimsReduction& op,
                          const std::vector<DType>& dtypes, bool nonempty = false) {
  for (int trial = 0; trial < 12; ++trial) {
    Shape shape = random_shape(0, 4, 5, !nonempty);
    DType dtype = dtypes[static_cast<size_t>(trial) % dtypes.size()];
    Tensor x = input(shape, dtype);
    std::vector<int64_t> dims = random_dims(x.dim());
    if (nonempty && x.numel() == 0) continue;
    for (const auto& [layout, xv] : input_layouts(x)) {
      for (bool keepdim : {false, true}) {
        std::string what = name + " " + detail::describe(x) + " " + layout + " dims " +
                           describe_dims(dims) + (keepdim ? " keepdim" : "");
        check_lazy(what, [&, xv = xv, keepdim = keepdim] {
          return std::vector<Tensor>{op(xv, dims, keepdim)};
        });
      }
    }
  }
}

TEST(LazyReduce, SumMatchesEager) {
  check_dims_reduction("sum", [](const Tensor& x, const auto& d, bool k) { return sum(x, d, k); },
                       {kFloat32, kFloat64, kInt32, kBool});
  check_dims_reduction(
      "sum(float64)", [](const Tensor& x, const auto& d, bool k) { return sum(x, d, k, kFloat64); },
      {kFloat32, kInt64});
  // Large enough for the parallel and column paths.
  Tensor big = input({300, 257}, kFloat32);
  for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {1}, {}, {-1, 0}})
    check_lazy("sum big " + describe_dims(dims), [&] {
      return std::vector<Tensor>{sum(big, dims), sum(big.t(), dims, true)};
    });
}

TEST(LazyReduce, MeanProdMatchEager) {
  check_dims_reduction("mean", [](const Tensor& x, const auto& d, bool k) { return mean(x, d, k); },
                       {kFloat32, kFloat64});
  check_dims_reduction("prod", [](const Tensor& x, const auto& d, bool k) { return prod(x, d, k); },
                       {kFloat32, kFloat64, kInt64});
}

TEST(LazyReduce, ExtremaMatchEager) {
  check_dims_reduction(
      "amax", [](const Tensor& x, const auto& d, bool k) { return amax(x, d, k); },
      {kFloat32, kFloat64, kInt32}, true);
  check_dims_reduction(
      "amin", [](const Tensor& x, const auto& d, bool k) { return amin(x, d, k); },
      {kFloat32, kFloat64}, true);
  for (int trial = 0; trial < 10; ++trial) {
    Tensor x = input(random_shape(0, 4, 5, false), trial % 2 ? kFloat64 : kFloat32);
    for (const auto& [layout, xv] : input_layouts(x)) {
      const Tensor v = xv;
      check_lazy("max/min " + layout + " " + detail::describe(x), [&] {
        return std::vector<Tensor>{max(v), min(v)};
      });
      for (int64_t dim = -std::max<int64_t>(x.dim(), 1); dim < std::max<int64_t>(x.dim(), 1);
           ++dim) {
        for (bool keepdim : {false, true}) {
          std::string what = layout + " " + detail::describe(x) + " dim " + std::to_string(dim) +
                             (keepdim ? " keepdim" : "");
          check_lazy("max(dim) " + what, [&] {
            auto [values, indices] = max(v, dim, keepdim);
            return std::vector<Tensor>{values, indices};
          });
          check_lazy("min(dim) " + what, [&] {
            auto [values, indices] = min(v, dim, keepdim);
            return std::vector<Tensor>{values, indices};
          });
          check_lazy("argmax/argmin " + what, [&] {
            return std::vector<Tensor>{argmax(v, dim, keepdim), argmin(v, dim, keepdim)};
          });
        }
      }
      for (bool keepdim : {false, true})
        check_lazy("argmax/argmin all " + layout, [&] {
          return std::vector<Tensor>{argmax(v, std::nullopt, keepdim),
                                     argmin(v, std::nullopt, keepdim)};
        });
    }
  }
}

TEST(LazyReduce, VarStdMatchEager) {
  for (int64_t correction : {0, 1, 2}) {
    check_dims_reduction(
        "var c" + std::to_string(correction),
        [correction](const Tensor& x, const auto& d, bool k) { return var(x, d, correction, k); },
        {kFloat32, kFloat64});
    check_dims_reduction("std c" + std::to_string(correction),
                         [correction](const Tensor& x, const auto& d, bool k) {
                           return kiln::std(x, d, correction, k);
                         },
                         {kFloat32, kFloat64});
  }
}

TEST(LazyReduce, LogsumexpAllAnyMatchEager) {
  check_dims_reduction("logsumexp",
                       [](const Tensor& x, const auto& d, bool k) { return logsumexp(x, d, k); },
                       {kFloat32, kFloat64, kInt32});
  check_dims_reduction("all", [](const Tensor& x, const auto& d, bool k) { return all(x, d, k); },
                       {kBool, kFloat32, kInt64});
  check_dims_reduction("any", [](const Tensor& x, const auto& d, bool k) { return any(x, d, k); },
                       {kBool, kFloat64, kInt32});
}

TEST(LazyReduce, SumToSizeMatchesEager) {
  Tensor x = input({4, 3, 5}, kFloat64);
  for (const Shape& shape : {Shape{3, 5}, Shape{1, 5}, Shape{4, 1, 1}, Shape{5}, Shape{}})
    check_lazy("sum_to_size " + detail::shape_str(shape), [&] {
      return std::vector<Tensor>{sum_to_size(x, shape), sum_to_size(x.exp(), shape)};
    });
}

// Ops fed by pending producers (and views of them) chain into one graph.
TEST(LazyReduce, PendingInputsChain) {
  Tensor a = input({6, 7}, kFloat32), b = input({7}, kFloat32);
  check_lazy("chain", [&] {
    Tensor h = exp(a) * b;  // pending in lazy mode
    Tensor t = h.t();       // a view of a pending tensor
    auto [v, i] = max(t, 1);
    return std::vector<Tensor>{
        sum(h, {1}), mean(t, {-1}, true), v,
        i,           logsumexp(t, {0}),   var(h, {0}),
        amax(h),     softmax(t, 0),       log_softmax(h.slice(1, 1, 6, 2), -1)};
  });
}

TEST(LazyReduce, AttrsAreNormalized) {
  LazyGuard lazy(true);
  Tensor x = input({2, 3, 4}, kFloat32);
  Tensor s = sum(x, {-1, 0}, true);
  ASSERT_TRUE(detail::is_pending(s));
  const detail::LazyNode& n = node_of(s);
  EXPECT_EQ(n.op->name, "sum");
  ASSERT_EQ(n.attrs.size(), 3u);
  EXPECT_EQ(detail::attr_ints(n.attrs[0]), (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(detail::attr_bool(n.attrs[1]));
  EXPECT_FALSE(detail::attr_optional_dtype(n.attrs[2]).has_value());
  // The empty list (every dim) stays empty.
  Tensor all_dims = sum(x, {}, false, kFloat64);
  EXPECT_TRUE(detail::attr_ints(node_of(all_dims).attrs[0]).empty());
  EXPECT_EQ(detail::attr_optional_dtype(node_of(all_dims).attrs[2]).value_or(kBool), kFloat64);
  // max(x, dim) records max_dim with two outputs; max(x) records max with none.
  auto [values, indices] = max(x, -2, false);
  EXPECT_EQ(node_of(values).op->name, "max_dim");
  EXPECT_EQ(&node_of(values), &node_of(indices));
  EXPECT_EQ(detail::attr_int(node_of(values).attrs[0]), 1);
  Tensor whole = max(x), flat = argmax(x), sm = softmax(x, -1), v = var(x, {2, -3}, 0);
  EXPECT_EQ(node_of(whole).op->name, "max");
  EXPECT_TRUE(node_of(whole).attrs.empty());
  EXPECT_FALSE(detail::attr_optional_int(node_of(flat).attrs[0]).has_value());
  EXPECT_EQ(detail::attr_int(node_of(sm).attrs[0]), 2);
  EXPECT_EQ(detail::attr_ints(node_of(v).attrs[0]), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(detail::attr_int(node_of(v).attrs[1]), 0);
  // Every hooked op has a kernel to run and names its attributes.
  for (const char* name :
       {"sum",        "mean",      "prod",          "max",      "min",     "max_dim",
        "min_dim",    "amax",      "amin",          "argmax",   "argmin",  "var",
        "std",        "logsumexp", "all",           "any",      "softmax", "log_softmax",
        "layer_norm", "nll_loss",  "cross_entropy", "mse_loss", "dropout"}) {
    const detail::OpDef* def = detail::find_op(name);
    ASSERT_NE(def, nullptr) << name;
    EXPECT_NE(def->invoke, nullptr) << name;
  }
  EXPECT_EQ(detail::find_op("sum")->attr_names,
            (std::vector<std::string>{"dims", "keepdim", "dtype"}));
  EXPECT_EQ(detail::find_op("layer_norm")->attr_names,
            (std::vector<std::string>{"normalized_shape", "eps"}));
}

TEST(LazyReduce, ErrorsRaiseAtTheCall) {
  LazyGuard lazy(true);
  Tensor x = exp(input({2, 3}, kFloat32));
  ASSERT_TRUE(detail::is_pending(x));
  Tensor ints = input({2, 3}, kInt32) + 1;
  ASSERT_TRUE(detail::is_pending(ints));
  Tensor empty = exp(input({0, 3}, kFloat32));
  EXPECT_THROW(sum(x, {2}), Error);
  EXPECT_THROW(sum(x, {0, -2}), Error);
  EXPECT_THROW(mean(x, {-3}), Error);
  EXPECT_THROW(mean(ints), Error);
  EXPECT_THROW(prod(x, {5}), Error);
  EXPECT_THROW(amax(x, {1, 1}), Error);
  EXPECT_THROW(amin(empty, {0}), Error);
  EXPECT_THROW(max(empty), Error);
  EXPECT_THROW(min(x, 2), Error);
  EXPECT_THROW(max(empty, 0), Error);
  EXPECT_THROW(argmax(x, -3), Error);
  EXPECT_THROW(argmin(empty), Error);
  EXPECT_THROW(var(ints), Error);
  EXPECT_THROW(kiln::std(x, {3}), Error);
  EXPECT_THROW(logsumexp(x, {2}), Error);
  EXPECT_THROW(all(x, {2}), Error);
  EXPECT_THROW(any(x, {0, 0}), Error);
  EXPECT_THROW(sum_to_size(x, {4}), Error);
  // Nothing was computed.
  EXPECT_TRUE(detail::is_pending(x));
  EXPECT_TRUE(detail::is_pending(ints));
  EXPECT_TRUE(detail::is_pending(empty));
}

// ------------------------------------------------------------------------------------- nn ops

TEST(LazyNN, SoftmaxMatchesEager) {
  for (int trial = 0; trial < 10; ++trial) {
    Tensor x = input(random_shape(0, 4, 6), trial % 2 ? kFloat64 : kFloat32, -20, 20);
    for (const auto& [layout, xv] : input_layouts(x)) {
      const Tensor v = xv;
      for (int64_t dim = -std::max<int64_t>(x.dim(), 1); dim < std::max<int64_t>(x.dim(), 1); ++dim)
        check_lazy("softmax " + layout + " " + detail::describe(x) + " dim " + std::to_string(dim),
                   [&] {
                     return std::vector<Tensor>{softmax(v, dim), log_softmax(v, dim)};
                   });
    }
  }
  Tensor wide = input({3, 100, 70}, kFloat32);
  check_lazy("softmax wide", [&] {
    return std::vector<Tensor>{softmax(wide, 1), log_softmax(wide, -1), softmax(wide, 0)};
  });
  Tensor ints = input({3, 4}, kInt64);
  check_lazy("softmax int", [&] { return std::vector<Tensor>{softmax(ints, 1)}; });
}

TEST(LazyNN, LayerNormMatchesEager) {
  for (int trial = 0; trial < 8; ++trial) {
    DType dtype = trial % 2 ? kFloat64 : kFloat32;
    Tensor x = input({3, 4, 5}, dtype);
    Shape normalized = trial % 3 == 0 ? Shape{4, 5} : Shape{5};
    Tensor w = input(normalized, dtype), b = input(normalized, dtype);
    for (const auto& [layout, xv] : input_layouts(x)) {
      const Tensor v = xv;
      check_lazy("layer_norm " + layout + " " + detail::shape_str(normalized), [&] {
        return std::vector<Tensor>{
            layer_norm(v, normalized, w, b, 1e-5), layer_norm(v, normalized, {}, b),
            layer_norm(v, normalized, w, {}, 1e-3), layer_norm(v, normalized)};
      });
    }
  }
  Tensor x = input({4, 6}, kFloat32), w = input({6}, kFloat64);
  check_lazy("layer_norm mixed", [&] {
    return std::vector<Tensor>{layer_norm(x.t().contiguous().t(), {6}, w, w.slice(0, 0, 6))};
  });
}

TEST(LazyNN, LossesMatchEager) {
  const Reduction reductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};
  struct Case {
    Shape input;
    Shape target;
  };
  for (const Case& c :
       {Case{{5}, {}}, Case{{4, 5}, {4}}, Case{{3, 5, 2, 3}, {3, 2, 3}}, Case{{0, 5}, {0}}}) {
    for (DType dtype : {kFloat32, kFloat64}) {
      Tensor logits = input(c.input, dtype);
      Tensor target = input(c.target, kInt64, 0, 5);
      Tensor target32 = target.to(kInt32);
      for (const auto& [layout, lv] : input_layouts(logits)) {
        const Tensor l = lv;
        for (Reduction r : reductions) {
          std::string what = layout + " " + detail::describe(logits) + " reduction " +
                             std::to_string(static_cast<int>(r));
          check_lazy("cross_entropy " + what, [&] {
            return std::vector<Tensor>{cross_entropy(l, target, r), cross_entropy(l, target32, r)};
          });
          check_lazy("nll_loss " + what, [&] {
            return std::vector<Tensor>{nll_loss(l, target, r),
                                       nll_loss(log_softmax(l, l.dim() == 1 ? 0 : 1), target, r)};
          });
        }
      }
    }
  }
  for (int trial = 0; trial < 8; ++trial) {
    Shape a = random_shape(0, 3, 4), b = a;
    if (trial % 2 && !b.empty()) b[0] = 1;  // broadcasting
    if (trial % 3 == 0) b.insert(b.begin(), 2);
    Tensor x = input(a, trial % 2 ? kFloat64 : kFloat32), y = input(b, kFloat32);
    for (const auto& [layout, xv] : input_layouts(x)) {
      const Tensor v = xv;
      for (Reduction r : reductions)
        check_lazy("mse_loss " + layout + " " + detail::describe(x) + " " + detail::describe(y),
                   [&] {
                     return std::vector<Tensor>{mse_loss(v, y, r), mse_loss(y, v, r)};
                   });
    }
  }
}

TEST(LazyNN, DropoutMatchesEagerForTheSameSeed) {
  Tensor x = input({33, 17}, kFloat32);
  Tensor y = input({5, 8}, kFloat64);
  for (double p : {0.25, 0.5, 0.9}) {
    check_lazy(
        "dropout p " + std::to_string(p),
        [&] {
          manual_seed(1234);
          Tensor a = dropout(x, p);
          Tensor b = dropout(x.t(), p);   // a second draw, in program order
          Tensor c = dropout(exp(y), p);  // a pending input
          Tensor d = rand({3});           // the generator moved on past the draws
          return std::vector<Tensor>{a, b, c, d};
        },
        false);
    LazyGuard lazy(true);
    EXPECT_TRUE(detail::is_pending(dropout(x, p)));
  }
  check_lazy(
      "dropout identity",
      [&] {
        manual_seed(7);
        return std::vector<Tensor>{dropout(x, 0.0), dropout(x, 0.5, false), dropout(x, 1.0)};
      },
      false);
  // The draw happens at the call: reseeding before materializing changes nothing.
  Tensor eager_value;
  {
    LazyGuard eager(false);
    manual_seed(99);
    eager_value = dropout(y, 0.5);
  }
  LazyGuard lazy(true);
  manual_seed(99);
  Tensor pending = dropout(y, 0.5);
  ASSERT_TRUE(detail::is_pending(pending));
  manual_seed(5);
  Tensor other = rand({100});
  expect_bit_equal(pending, eager_value, "dropout drawn at the call");
}

TEST(LazyNN, ErrorsRaiseAtTheCall) {
  LazyGuard lazy(true);
  Tensor x = exp(input({4, 5}, kFloat32));
  ASSERT_TRUE(detail::is_pending(x));
  Tensor target = input({4}, kInt64, 0, 5);
  Tensor pending_target = target + 0;
  ASSERT_TRUE(detail::is_pending(pending_target));
  EXPECT_THROW(softmax(x, 2), Error);
  EXPECT_THROW(log_softmax(x, -3), Error);
  EXPECT_THROW(layer_norm(x, {4}), Error);
  EXPECT_THROW(layer_norm(x, {}), Error);
  EXPECT_THROW(layer_norm(x, {5}, input({4}, kFloat32)), Error);
  EXPECT_THROW(nll_loss(x, input({3}, kInt64, 0, 5)), Error);
  EXPECT_THROW(nll_loss(x, target.to(kFloat32)), Error);
  EXPECT_THROW(cross_entropy(x, input({4, 1}, kInt64, 0, 5)), Error);
  // Out-of-range classes are found by reading the (concrete) target at the call.
  EXPECT_THROW(nll_loss(x, input({4}, kInt64, 5, 9)), Error);
  EXPECT_THROW(cross_entropy(x, input({4}, kInt64, -3, -1)), Error);
  EXPECT_THROW(mse_loss(x, input({3}, kFloat32)), Error);
  EXPECT_THROW(dropout(x, 1.5), Error);
  EXPECT_THROW(dropout(x.to(kInt32), 0.5), Error);
  EXPECT_TRUE(detail::is_pending(x));
  // A pending target is materialized (only it) for the class check; the loss is still recorded.
  Tensor loss = nll_loss(x, pending_target);
  EXPECT_TRUE(detail::is_pending(loss));
  EXPECT_TRUE(detail::is_pending(x));
}

// ------------------------------------------------------------------------------------ gradients

// Every leaf's gradient after backward through f, as computed in the current mode.
std::vector<Tensor> grads_of(const std::vector<Tensor>& leaves,
                             const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  std::vector<Tensor> params;
  {
    LazyGuard eager(false);  // concrete leaves
    for (const Tensor& l : leaves) {
      Tensor p = l.detach().clone();
      if (is_floating_point(p.dtype())) p.requires_grad_();
      params.push_back(p);
    }
  }
  Tensor loss = f(params);
  loss.backward();
  std::vector<Tensor> out{loss};
  for (const Tensor& p : params) out.push_back(p.requires_grad() ? p.grad() : Tensor());
  return out;
}

void check_grads(const std::string& what, const std::vector<Tensor>& leaves,
                 const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  SCOPED_TRACE(what);
  std::vector<Tensor> eager, lazy;
  {
    LazyGuard mode(false);
    eager = grads_of(leaves, f);
  }
  {
    LazyGuard mode(true);
    lazy = grads_of(leaves, f);
  }
  ASSERT_EQ(eager.size(), lazy.size());
  for (size_t i = 0; i < eager.size(); ++i)
    testing::expect_lazy_equal(lazy[i], eager[i],
                               what + (i == 0 ? " loss" : " grad " + std::to_string(i)));
}

TEST(LazyGrad, ReductionsMatchEager) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor x = input({3, 4, 5}, dtype), w3 = input({3, 1, 5}, dtype), w = input({3, 5}, dtype);
    Tensor pos = input({3, 4, 5}, dtype, 0.5, 2.0);
    auto weighted = [](const Tensor& y, const Tensor& w) { return sum(y * w); };
    check_grads("sum", {x, w3},
                [&](const auto& p) { return weighted(sum(p[0], {-2}, true), p[1]); });
    check_grads("sum all", {x}, [&](const auto& p) { return sum(p[0].permute({2, 0, 1})) * 3.0; });
    check_grads("mean", {x, w}, [&](const auto& p) { return weighted(mean(p[0], {1}), p[1]); });
    check_grads("prod", {pos, w}, [&](const auto& p) { return weighted(prod(p[0], {1}), p[1]); });
    Tensor zeroed = pos.clone();
    {
      LazyGuard eager(false);
      zeroed.select(1, 2).zero_();
    }
    check_grads("prod with zeros", {zeroed, w},
                [&](const auto& p) { return weighted(prod(p[0], {1}), p[1]); });
    check_grads("amax", {x, w3},
                [&](const auto& p) { return weighted(amax(p[0], {1}, true), p[1]); });
    check_grads("amin", {x, w}, [&](const auto& p) { return weighted(amin(p[0], {-2}), p[1]); });
    check_grads("max min", {x}, [&](const auto& p) { return max(p[0]) - min(p[0]) * 2.0; });
    check_grads("max(dim)", {x, w},
                [&](const auto& p) { return weighted(std::get<0>(max(p[0], 1)), p[1]); });
    check_grads("min(dim) keepdim", {x, w3},
                [&](const auto& p) { return weighted(std::get<0>(min(p[0], -2, true)), p[1]); });
    check_grads("var std", {x, w}, [&](const auto& p) {
      return weighted(var(p[0], {1}), p[1]) + weighted(kiln::std(p[0], {1}, 0), p[1]);
    });
    check_grads("logsumexp", {x, w},
                [&](const auto& p) { return weighted(logsumexp(p[0], {1}), p[1]); });
    check_grads("sum_to_size", {x, w3}, [&](const auto& p) {
      return weighted(sum_to_size(p[0], {3, 1, 5}), p[1]);
    });
  }
}

TEST(LazyGrad, NNOpsMatchEager) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor x = input({4, 6}, dtype), w = input({4, 6}, dtype);
    Tensor gamma = input({6}, dtype), beta = input({6}, dtype);
    Tensor target = input({4}, kInt64, 0, 6), y = input({1, 6}, dtype);
    auto weighted = [](const Tensor& y, const Tensor& w) { return sum(y * w); };
    check_grads("softmax", {x, w}, [&](const auto& p) { return weighted(softmax(p[0], 1), p[1]); });
    check_grads("log_softmax", {x, w},
                [&](const auto& p) { return weighted(log_softmax(p[0].t(), 0), p[1].t()); });
    check_grads("layer_norm", {x, gamma, beta, w},
                [&](const auto& p) { return weighted(layer_norm(p[0], {6}, p[1], p[2]), p[3]); });
    check_grads("layer_norm no affine", {x, w},
                [&](const auto& p) { return weighted(layer_norm(p[0], {6}), p[1]); });
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      std::string suffix = " " + std::to_string(static_cast<int>(r));
      check_grads("cross_entropy" + suffix, {x},
                  [&](const auto& p) { return sum(cross_entropy(p[0] * 2.0, target, r)); });
      check_grads("nll_loss" + suffix, {x},
                  [&](const auto& p) { return sum(nll_loss(log_softmax(p[0], 1), target, r)); });
      check_grads("mse_loss" + suffix, {x, y},
                  [&](const auto& p) { return sum(mse_loss(p[0], p[1], r)); });
    }
    check_grads("dropout", {x, w}, [&](const auto& p) {
      manual_seed(42);
      return weighted(dropout(p[0], 0.4), p[1]);
    });
  }
}

// A small training-like step: every op above in one lazy graph, forward and backward.
TEST(LazyGrad, CombinedStepMatchesEager) {
  Tensor x = input({8, 10}, kFloat32), w1 = input({10, 10}, kFloat32), g = input({10}, kFloat32);
  Tensor target = input({8}, kInt64, 0, 10);
  check_grads("step", {x, w1, g}, [&](const auto& p) {
    manual_seed(3);
    Tensor h = layer_norm(matmul(p[0], p[1]), {10}, p[2]);
    h = dropout(h, 0.1);
    Tensor loss = cross_entropy(h, target) + mean(var(h, {1})) * 0.1 + logsumexp(h, {0, 1}) * 0.01;
    return loss + mse_loss(softmax(h, 1), softmax(p[0], 1)) + amax(h) * 0.001;
  });
}

}  // namespace
}  // namespace kiln
