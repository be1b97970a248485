// jit::differentiate: the symbolic derivative of a graph recorded lazily, as an augmented forward
// graph and a backward graph, checked against eager autograd and against finite differences.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "jit/differentiate.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Inputs(const Inputs&)>;

// The graphs here are recorded from pending tensors: no flush in the middle.
[[maybe_unused]] ::testing::Environment* const kNoFlush =
    ::testing::AddGlobalTestEnvironment(new testing::NoFlushEnvironment);

// fn recorded lazily on `inputs`; `order` receives, per graph input, the index of the input it
// is (fn must not take a view of an input: the view would be a graph input of its own).
std::unique_ptr<jit::Graph> graph_of(const Fn& fn, const Inputs& inputs,
                                     std::vector<size_t>* order) {
  eval(inputs);
  LazyGuard lazy(true);
  NoGradGuard no_grad;
  Inputs outs = fn(inputs);
  std::vector<detail::LazyRef> requests;
  for (const Tensor& t : outs) {
    EXPECT_TRUE(detail::is_pending(t)) << "an output was not recorded";
    requests.push_back(t.impl()->lazy);
  }
  jit::LazyGraphBinding binding;
  std::unique_ptr<jit::Graph> g = jit::build_graph(requests, &binding, false);
  order->clear();
  for (const Tensor& t : binding.inputs) {
    size_t i = 0;
    while (i < inputs.size() && !inputs[i].is_same(t)) ++i;
    EXPECT_LT(i, inputs.size()) << "a graph input is none of the inputs\n" << g->str();
    order->push_back(i);
  }
  return g;
}

// Runs the two graphs: the forward on `inputs` (bound to g's inputs by `order`), the backward on
// `output_grads` (per output of g) and what the forward saved. Returns g's outputs and, per input
// (in the order of `inputs`), its gradient (undefined where the backward gives none).
struct TwoGraphs {
  Inputs outputs;
  Inputs grads;
};
TwoGraphs run(const jit::GraphGradient& d, const std::vector<size_t>& order, const Inputs& inputs,
              const Inputs& output_grads, size_t num_outputs) {
  LazyGuard eager(false);
  auto source = [&](const jit::GraphGradient::Source& s, const Inputs& saved) {
    switch (s.kind) {
      case jit::GraphGradient::kInput:
        return inputs[order[s.index]];
      case jit::GraphGradient::kConstant:
        return d.constants[s.index];
      case jit::GraphGradient::kSaved:
        return saved[num_outputs + s.index];
      case jit::GraphGradient::kOutputGrad:
        return output_grads[s.index];
    }
    return Tensor();
  };
  Inputs forward_in;
  for (const jit::GraphGradient::Source& s : d.forward_inputs) forward_in.push_back(source(s, {}));
  jit::Plan forward(*d.forward);
  Inputs forward_out = forward.run(forward_in);
  EXPECT_EQ(forward_out.size(), num_outputs + d.num_saved);
  TwoGraphs r;
  r.outputs.assign(forward_out.begin(), forward_out.begin() + static_cast<int64_t>(num_outputs));
  r.grads.resize(inputs.size());
  if (!d.backward) return r;
  Inputs backward_in;
  for (const jit::GraphGradient::Source& s : d.backward_inputs)
    backward_in.push_back(source(s, forward_out));
  jit::Plan backward(*d.backward);
  Inputs grads = backward.run(backward_in);
  EXPECT_EQ(grads.size(), d.gradient_of.size());
  for (size_t k = 0; k < grads.size() && k < d.gradient_of.size(); ++k)
    r.grads[order[d.gradient_of[k]]] = grads[k];
  return r;
}

// Eager autograd's gradients of sum_i sum(outputs[i] * output_grads[i]) with respect to every
// floating input.
Inputs eager_grads(const Fn& fn, const Inputs& inputs, const Inputs& output_grads) {
  LazyGuard eager(false);
  Inputs leaves, wrt;
  for (const Tensor& t : inputs) {
    Tensor c = t.detach().clone();
    if (is_floating_point(t.dtype())) {
      c.requires_grad_(true);
      wrt.push_back(c);
    }
    leaves.push_back(c);
  }
  Inputs out = fn(leaves);
  Tensor loss = zeros({}, kFloat64);
  for (size_t i = 0; i < out.size(); ++i)
    if (is_floating_point(out[i].dtype()))
      loss = loss + (out[i].to(kFloat64) * output_grads[i].to(kFloat64)).sum();
  Inputs g = autograd::grad({loss}, wrt, {}, false, false, true);
  Inputs per_input;
  size_t w = 0;
  for (const Tensor& t : inputs)
    per_input.push_back(is_floating_point(t.dtype()) ? g[w++] : Tensor());
  return per_input;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  if (!want.defined()) {
    // No gradient eagerly: the backward gives none or zeros.
    if (got.defined()) {
      LazyGuard eager(false);
      EXPECT_EQ(got.abs().max().item<double>(), 0.0) << what;
    }
    return;
  }
  ASSERT_TRUE(got.defined()) << what << ": no gradient";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  LazyGuard eager(false);
  Tensor a = got.to(kFloat64), b = want.to(kFloat64);
  const double err = got.numel() ? (a - b).abs().max().item<double>() : 0.0;
  const double scale = got.numel() ? std::max(1.0, b.abs().max().item<double>()) : 1.0;
  EXPECT_LE(err, tol * scale) << what << ": max error " << err;
}

struct Case {
  std::string name;
  Fn fn;
  std::function<Inputs(std::mt19937_64&, DType)> inputs;
};

std::vector<Case> cases() {
  auto shape = [](std::mt19937_64& rng, int lo, int hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  return {
      {"broadcast elementwise",
       [](const Inputs& in) {
         return Inputs{tanh(in[0] * in[1]) + sigmoid(in[0]) * 2.0, exp(in[1] * 0.5) - in[1]};
       },
       [shape](std::mt19937_64& rng, DType t) {
         const int64_t m = shape(rng, 1, 5), n = shape(rng, 1, 6);
         return Inputs{testing::input({m, n}, t), testing::input({n}, t)};
       }},
      {"matmul bias gelu",
       [](const Inputs& in) { return Inputs{gelu(in[0].matmul(in[1]) + in[2])}; },
       [shape](std::mt19937_64& rng, DType t) {
         const int64_t b = shape(rng, 1, 4), k = shape(rng, 1, 5), n = shape(rng, 1, 5);
         return Inputs{testing::input({b, k}, t), testing::input({k, n}, t),
                       testing::input({n}, t)};
       }},
      {"softmax and reductions",
       [](const Inputs& in) {
         Tensor y = in[0] * in[1];
         Tensor e = exp(y - y.amax({-1}, true));
         return Inputs{e / e.sum({-1}, true), y.mean({0}), y.var({-1}, 1, true) + y.sum()};
       },
       [shape](std::mt19937_64& rng, DType t) {
         const int64_t m = shape(rng, 2, 5), n = shape(rng, 2, 6);
         return Inputs{testing::input({m, n}, t), testing::input({m, 1}, t)};
       }},
      {"views, chunk and cat",
       [](const Inputs& in) {
         // Views of a computed value (a view of an input is a graph input of its own).
         std::vector<Tensor> c = (in[0] * 1.5).chunk(2, 1);
         Tensor s = cat({sigmoid(c[1]), tanh(c[0]) * (in[1] + 1.0).t()}, 0);
         return Inputs{s.transpose(0, 1).unsqueeze(0) * 3.0, c[0].narrow(0, 0, 1).sum()};
       },
       [shape](std::mt19937_64& rng, DType t) {
         const int64_t m = shape(rng, 1, 4), n = shape(rng, 1, 3);
         return Inputs{testing::input({m, 2 * n}, t), testing::input({n, m}, t)};
       }},
      {"an integer input and output",
       [](const Inputs& in) {
         return Inputs{in[0] * in[1].to(in[0].dtype()), in[1] + 1, log1p(in[0] * in[0])};
       },
       [shape](std::mt19937_64& rng, DType t) {
         const int64_t n = shape(rng, 1, 7);
         return Inputs{testing::input({n}, t), testing::input({n}, kInt64, -4, 4)};
       }},
  };
}

TEST(Differentiate, GradientsMatchEagerAutogradOnRandomShapes) {
  std::mt19937_64 rng(20261122);
  for (const Case& c : cases()) {
    for (DType dtype : {kFloat32, kFloat64}) {
      for (int trial = 0; trial < 4; ++trial) {
        const std::string what =
            c.name + " " + dtype_name(dtype) + " trial " + std::to_string(trial);
        Inputs in = c.inputs(rng, dtype);
        std::vector<size_t> order;
        std::unique_ptr<jit::Graph> g = graph_of(c.fn, in, &order);
        jit::GraphGradient d = jit::differentiate(*g);
        ASSERT_TRUE(d.forward) << what;
        ASSERT_TRUE(d.backward) << what;
        Inputs want_out;
        {
          LazyGuard eager(false);
          want_out = c.fn(in);
        }
        Inputs output_grads;
        for (const Tensor& o : want_out)
          output_grads.push_back(testing::input(o.sizes(), o.dtype()));
        TwoGraphs r = run(d, order, in, output_grads, want_out.size());
        const double tol = dtype == kFloat64 ? 1e-12 : 1e-5;
        for (size_t k = 0; k < want_out.size(); ++k)
          expect_close(r.outputs[k], want_out[k], tol, what + ", output " + std::to_string(k));
        Inputs want = eager_grads(c.fn, in, output_grads);
        for (size_t i = 0; i < in.size(); ++i)
          expect_close(r.grads[i], want[i], dtype == kFloat64 ? 1e-10 : 1e-4,
                       what + ", gradient of input " + std::to_string(i));
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// <gradient, v> against (L(x + eps v) - L(x - eps v)) / 2 eps, L = sum(outputs * output_grads),
// through the two graphs only (float64).
TEST(Differentiate, DirectionalDerivativesMatchFiniteDifferences) {
  std::mt19937_64 rng(7);
  for (const Case& c : cases()) {
    Inputs in = c.inputs(rng, kFloat64);
    std::vector<size_t> order;
    std::unique_ptr<jit::Graph> g = graph_of(c.fn, in, &order);
    jit::GraphGradient d = jit::differentiate(*g);
    Inputs out0;
    {
      LazyGuard eager(false);
      out0 = c.fn(in);
    }
    Inputs output_grads;
    for (const Tensor& o : out0) output_grads.push_back(testing::input(o.sizes(), kFloat64));
    TwoGraphs r = run(d, order, in, output_grads, out0.size());
    LazyGuard eager(false);
    auto loss = [&](const Inputs& x) {
      TwoGraphs rx = run(d, order, x, output_grads, out0.size());
      double l = 0;
      for (size_t k = 0; k < rx.outputs.size(); ++k)
        if (is_floating_point(rx.outputs[k].dtype()))
          l += (rx.outputs[k].to(kFloat64) * output_grads[k]).sum().item<double>();
      return l;
    };
    const double eps = 1e-6;
    Inputs plus = in, minus = in;
    double predicted = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!is_floating_point(in[i].dtype())) continue;
      Tensor v = testing::input(in[i].sizes(), kFloat64);
      plus[i] = in[i] + v * eps;
      minus[i] = in[i] - v * eps;
      if (r.grads[i].defined()) predicted += (r.grads[i] * v).sum().item<double>();
    }
    const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
    EXPECT_NEAR(predicted, numeric, 1e-6 * std::max(1.0, std::fabs(numeric))) << c.name;
  }
}

TEST(Differentiate, ElementwiseValuesAreRecomputedAndGemmResultsSaved) {
  Inputs in = {testing::input({8, 16}, kFloat32), testing::input({16, 32}, kFloat32),
               testing::input({32}, kFloat32)};
  Fn fn = [](const Inputs& x) { return Inputs{gelu(tanh(x[0].matmul(x[1]) + x[2]) * 2.0)}; };
  std::vector<size_t> order;
  std::unique_ptr<jit::Graph> g = graph_of(fn, in, &order);
  jit::GraphGradient d = jit::differentiate(*g);
  // The GEMM result (with its bias) is saved; tanh, the product and gelu are recomputed from it.
  EXPECT_EQ(d.num_saved, 1u) << d.forward->str();
  int elementwise_in_backward = 0;
  for (jit::Node* n = d.backward->first(); n; n = n->next())
    elementwise_in_backward += n->kind() == "tanh";
  EXPECT_GE(elementwise_in_backward, 1) << d.backward->str();
}

TEST(Differentiate, OnlyTheFlaggedInputsGetGradients) {
  Inputs in = {testing::input({3, 4}, kFloat64), testing::input({4}, kFloat64)};
  Fn fn = [](const Inputs& x) { return Inputs{(x[0] * x[1]).sum({1})}; };
  std::vector<size_t> order;
  std::unique_ptr<jit::Graph> g = graph_of(fn, in, &order);
  jit::GraphGradient d = jit::differentiate(*g, {false, true});
  ASSERT_TRUE(d.backward);
  ASSERT_EQ(d.gradient_of, std::vector<size_t>{1});
  Tensor og = testing::input({3}, kFloat64);
  TwoGraphs r = run(d, order, in, {og}, 1);
  EXPECT_FALSE(r.grads[0].defined());
  expect_close(r.grads[1], eager_grads(fn, in, {og})[1], 1e-12, "gradient of input 1");
}

TEST(Differentiate, AGraphWhoseOutputsDoNotDependOnItsInputsHasNoBackward) {
  Inputs in = {testing::input({3}, kFloat32), testing::input({3}, kInt32, -3, 3)};
  Fn fn = [](const Inputs& x) { return Inputs{x[1] * 2, gt(x[0], 0)}; };
  std::vector<size_t> order;
  std::unique_ptr<jit::Graph> g = graph_of(fn, in, &order);
  jit::GraphGradient d = jit::differentiate(*g);
  EXPECT_FALSE(d.backward);
  TwoGraphs r = run(d, order, in, {}, 2);
  LazyGuard eager(false);
  testing::expect_bit_equal(r.outputs[0], in[1] * 2, "output 0");
}

TEST(Differentiate, BadRequestsAreErrors) {
  Inputs in = {testing::input({3}, kFloat32), testing::input({3}, kInt32, -3, 3)};
  Fn fn = [](const Inputs& x) { return Inputs{x[0] * x[1]}; };
  std::vector<size_t> order;
  std::unique_ptr<jit::Graph> g = graph_of(fn, in, &order);
  EXPECT_THROW(jit::differentiate(*g, {true, true}), Error);  // an int32 input has no gradient
  EXPECT_THROW(jit::differentiate(*g, {true}), Error);        // one flag for two inputs
  try {
    jit::differentiate(*g, {true, true});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32[3]"), std::string::npos) << e.what();
  }
}

// A 40,000-op chain: differentiated and run without recursion (the graph algorithms are
// iterative; tests/jit/million_node_test.cpp covers a million nodes for the others).
TEST(Differentiate, ALongChain) {
  Inputs in = {testing::input({4}, kFloat64)};
  Fn fn = [](const Inputs& x) {
    Tensor y = x[0];
    for (int i = 0; i < 20000; ++i) y = y * 0.9999 + 0.0001;
    return Inputs{y};
  };
  std::vector<size_t> order;
  std::unique_ptr<jit::Graph> g = graph_of(fn, in, &order);
  jit::GraphGradient d = jit::differentiate(*g);
  ASSERT_TRUE(d.backward);
  Tensor og = testing::input({4}, kFloat64);
  TwoGraphs r = run(d, order, in, {og}, 1);
  LazyGuard eager(false);
  expect_close(r.grads[0], og * std::pow(0.9999, 20000), 1e-9, "gradient");
}

}  // namespace
}  // namespace kiln
