// Differentiable traced functions: a function traced from forward-only code gets its backward
// traced and fused too, and loss.backward() through its results gives eager autograd's gradients.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "jit/differentiate.h"
#include "jit/log.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "lib/allocator.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Inputs(const Inputs&)>;

Inputs detached_copies(const Inputs& in) {
  Inputs out;
  for (const Tensor& t : in) {
    Tensor c = t.detach().clone();
    if (t.requires_grad()) c.requires_grad_(true);
    out.push_back(c);
  }
  return out;
}

// The gradients of sum(outputs[i] * weights[i]) with respect to `wrt`, eagerly.
Inputs eager_grads(const Fn& fn, const Inputs& in, const Inputs& weights, const Inputs& wrt) {
  LazyGuard eager(false);
  Inputs out = fn(in);
  Tensor loss;
  for (size_t i = 0; i < out.size(); ++i) {
    Tensor term = (out[i] * weights[i]).sum();
    loss = loss.defined() ? loss + term : term;
  }
  return autograd::grad({loss}, wrt, {}, false, false, true);
}

// The same through a traced function, called `calls` times (each call must give the same).
Inputs traced_grads(jit::Function& f, const Inputs& in, const Inputs& weights, const Inputs& wrt) {
  Inputs out = f(in);
  Tensor loss;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(out[i].requires_grad()) << "output " << i << " has no grad_fn";
    Tensor term = (out[i] * weights[i]).sum();
    loss = loss.defined() ? loss + term : term;
  }
  return autograd::grad({loss}, wrt, {}, false, false, true);
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double tol = got.dtype() == kFloat64 ? 1e-10 : 1e-4;
  LazyGuard eager(false);
  const double err = (got.to(kFloat64) - want.to(kFloat64)).abs().max().item<double>();
  const double scale = std::max(1.0, want.to(kFloat64).abs().max().item<double>());
  EXPECT_LE(err, tol * scale) << what << ": max error " << err;
}

TEST(DifferentiableTrace, ElementwiseFunctionOfArgumentsWithBroadcasting) {
  Tensor x = testing::input({3, 4}, kFloat64).requires_grad_(true);
  Tensor y = testing::input({4}, kFloat64).requires_grad_(true);
  Fn fn = [](const Inputs& in) {
    return Inputs{tanh(in[0] * in[1]) + sigmoid(in[0]) * 2.0, exp(in[1] * 0.5)};
  };
  jit::Function f = jit::trace(fn, {x, y});
  EXPECT_FALSE(f.backward_graph_str().empty());
  Inputs weights = {testing::input({3, 4}, kFloat64), testing::input({4}, kFloat64)};
  for (int call = 0; call < 3; ++call) {
    Inputs in = {testing::input({3, 4}, kFloat64).requires_grad_(true),
                 testing::input({4}, kFloat64).requires_grad_(true)};
    Inputs got = traced_grads(f, in, weights, in);
    Inputs eager_in = detached_copies(in);
    Inputs want = eager_grads(fn, eager_in, weights, eager_in);
    for (size_t k = 0; k < 2; ++k)
      expect_close(got[k], want[k],
                   "call " + std::to_string(call) + ", input " + std::to_string(k));
  }
}

TEST(DifferentiableTrace, GradcheckThroughTheTracedFunction) {
  Tensor a = testing::input({2, 3}, kFloat64).requires_grad_(true);
  Tensor b = testing::input({3}, kFloat64).requires_grad_(true);
  jit::Function f = jit::trace(
      [](const Inputs& in) {
        Tensor s = in[0] * in[1] - in[1].exp();
        return Inputs{(s * s).sum({1}, true) + s.tanh(), (s.sigmoid() * in[0]).mean()};
      },
      {a, b});
  EXPECT_TRUE(testing::gradcheck(
      testing::DifferentiableFunction([&f](const Inputs& in) { return f(in); }), {a, b}));
}

TEST(DifferentiableTrace, CapturedParametersGetTheirGradients) {
  // A linear layer with tanh: the parameters are captured, not arguments.
  Tensor w = testing::input({5, 3}).requires_grad_(true);
  Tensor b = testing::input({3}).requires_grad_(true);
  Tensor x = testing::input({4, 5});
  Fn fn = [&](const Inputs& in) { return Inputs{tanh(in[0].matmul(w) + b)}; };
  jit::Function f = jit::trace(fn, {x});
  // The GEMM's result is saved for the backward, never recomputed: the backward graph's GEMMs are
  // the two gradient products only (x^T g for w; w's gradient alone here since x needs none).
  const std::string bwd = f.backward_graph_str();
  ASSERT_FALSE(bwd.empty());
  Inputs weights = {testing::input({4, 3})};
  for (int call = 0; call < 2; ++call) {
    Tensor xi = testing::input({4, 5});
    Inputs got = traced_grads(f, {xi}, weights, {w, b});
    Inputs want = eager_grads(fn, {xi}, weights, {w, b});
    expect_close(got[0], want[0], "w");
    expect_close(got[1], want[1], "b");
  }
  // .backward() accumulates into the parameters' .grad.
  w.mutable_grad() = Tensor();
  b.mutable_grad() = Tensor();
  f({x})[0].sum().backward();
  Inputs want = eager_grads(fn, {x}, {ones({4, 3})}, {w, b});
  expect_close(w.grad(), want[0], "w.grad");
  expect_close(b.grad(), want[1], "b.grad");
}

// Kernels a traced backward runs: its fused kernels, and its other computing steps.
struct StepCounts {
  int64_t kernels, others;
};
StepCounts backward_steps(jit::Function& f, const Inputs& in, const Inputs& wrt) {
  Inputs out = f(in);
  Tensor loss = out[0].sum();  // its own backward is a view (expand), no kernel
  for (size_t k = 1; k < out.size(); ++k) loss = loss + out[k].sum();
  const jit::Stats before = jit::stats();
  autograd::grad({loss}, wrt, {}, false, false, true);
  const jit::Stats after = jit::stats();
  return {after.fused_kernels_run - before.fused_kernels_run,
          after.unfused_steps_run - before.unfused_steps_run};
}

TEST(DifferentiableTrace, LstmCellBackwardIsTheGemmsAndOneKernel) {
  const int64_t batch = 4, input = 6, hidden = 5;
  Tensor wx = testing::input({input, 4 * hidden}).requires_grad_(true);
  Tensor wh = testing::input({hidden, 4 * hidden}).requires_grad_(true);
  Tensor bias = testing::input({4 * hidden}).requires_grad_(true);
  Fn cell = [&](const Inputs& in) {
    std::vector<Tensor> g = (in[0].matmul(wx) + in[1].matmul(wh) + bias).chunk(4, 1);
    Tensor i = sigmoid(g[0]), f = sigmoid(g[1]), c = tanh(g[2]), o = sigmoid(g[3]);
    Tensor c2 = f * in[2] + i * c;
    return Inputs{o * tanh(c2), c2};
  };
  Tensor x = testing::input({batch, input}),
         h = testing::input({batch, hidden}).requires_grad_(true),
         c = testing::input({batch, hidden}).requires_grad_(true);
  jit::Function f = jit::trace(cell, {x, h, c});
  Inputs weights = {testing::input({batch, hidden}), testing::input({batch, hidden})};
  // Warm: kernels compiled.
  traced_grads(f, {x, h, c}, weights, {wx, wh, bias, h, c});

  const jit::Stats before = jit::stats();
  Inputs out = f({x, h, c});
  const jit::Stats mid = jit::stats();
  EXPECT_EQ(mid.fused_kernels_run - before.fused_kernels_run, 1) << f.graph_str();
  EXPECT_EQ(mid.unfused_steps_run - before.unfused_steps_run, 2) << "forward: the two gate GEMMs\n"
                                                                 << f.graph_str();
  Tensor loss = (out[0] * weights[0]).sum() + (out[1] * weights[1]).sum();
  const jit::Stats loss_done = jit::stats();
  Inputs got = autograd::grad({loss}, {wx, wh, bias, h, c}, {}, false, false, true);
  const jit::Stats after = jit::stats();
  // The backward plan: the weight and state gradient GEMMs and one kernel that writes the four
  // gate gradients into one buffer and sums them over the batch (the bias gradient, a column
  // exit of the cat).
  EXPECT_EQ(after.fused_kernels_run - loss_done.fused_kernels_run, 1) << f.backward_graph_str();
  // Its other steps: the GEMMs of wx, wh and h only (the loss's own backward aside).
  const StepCounts n = backward_steps(f, {x, h, c}, {wx, wh, bias, h, c});
  EXPECT_EQ(n.kernels, 1) << f.backward_graph_str();
  EXPECT_EQ(n.others, 3) << f.backward_graph_str();
  EXPECT_NE(f.backward_graph_str().find("cat("), std::string::npos) << f.backward_graph_str();

  Inputs want =
      eager_grads(cell, {x, h.detach().requires_grad_(true), c.detach().requires_grad_(true)},
                  weights, {wx, wh, bias});
  expect_close(got[0], want[0], "wx");
  expect_close(got[1], want[1], "wh");
  expect_close(got[2], want[2], "bias");
  Tensor he = h.detach().requires_grad_(true), ce = c.detach().requires_grad_(true);
  Inputs want_state = eager_grads(cell, {x, he, ce}, weights, {he, ce});
  expect_close(got[3], want_state[0], "h");
  expect_close(got[4], want_state[1], "c");
}

TEST(DifferentiableTrace, GeluBackwardIsOneKernel) {
  Tensor x = testing::input({16, 33}).requires_grad_(true);
  Fn fn = [](const Inputs& in) {
    const Tensor& v = in[0];
    return Inputs{v * 0.5 * (tanh((v + v * v * v * 0.044715) * 0.7978845608028654) + 1.0)};
  };
  jit::Function f = jit::trace(fn, {x});
  backward_steps(f, {x}, {x});  // compiles
  const StepCounts n = backward_steps(f, {x}, {x});
  EXPECT_EQ(n.kernels, 1) << f.backward_graph_str();
  EXPECT_EQ(n.others, 0) << f.backward_graph_str();
  Tensor xe = x.detach().requires_grad_(true);
  Inputs w = {testing::input({16, 33})};
  expect_close(traced_grads(f, {x}, w, {x})[0], eager_grads(fn, {xe}, w, {xe})[0], "gelu");
}

TEST(DifferentiableTrace, LayerNormBackwardFromPrimitives) {
  Tensor x = testing::input({8, 64}).requires_grad_(true);
  Tensor w = testing::input({64}).requires_grad_(true),
         b = testing::input({64}).requires_grad_(true);
  Fn fn = [&](const Inputs& in) {
    Tensor mean = in[0].mean({-1}, true);
    Tensor xc = in[0] - mean;
    Tensor var = (xc * xc).mean({-1}, true);
    return Inputs{xc / sqrt(var + 1e-5) * w + b};
  };
  jit::Function f = jit::trace(fn, {x});
  backward_steps(f, {x}, {x, w, b});
  const StepCounts n = backward_steps(f, {x}, {x, w, b});
  // One rows kernel: the input gradient (both row sums and everything around them, the keepdim
  // means' gradients broadcast back through expands read inside the kernel), and the weight and
  // bias gradients, sums over the batch folded by the same kernel (column exits).
  EXPECT_EQ(n.kernels, 1) << f.backward_graph_str();
  EXPECT_EQ(n.others, 0) << f.backward_graph_str();
  Inputs wts = {testing::input({8, 64})};
  Tensor xe = x.detach().requires_grad_(true);
  Inputs got = traced_grads(f, {x}, wts, {x, w, b});
  Inputs want = eager_grads(fn, {xe}, wts, {xe, w, b});
  expect_close(got[0], want[0], "x");
  expect_close(got[1], want[1], "w");
  expect_close(got[2], want[2], "b");
}

// kiln::layer_norm in lazy mode: the forward is one kernel, and its gradient formula, run by
// eager autograd, makes the input, weight and bias gradients one kernel.
TEST(DifferentiableTrace, LayerNormOpBackwardInLazyModeIsOneKernel) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (int64_t rows : {16, 1}) {
      Tensor x = testing::input({rows, 96}, dtype).requires_grad_(true);
      Tensor w = testing::input({96}, dtype).requires_grad_(true),
             b = testing::input({96}, dtype).requires_grad_(true);
      Tensor wts = testing::input({rows, 96}, dtype);
      Fn fn = [&](const Inputs& in) { return Inputs{layer_norm(in[0], {96}, w, b, 1e-5)}; };
      for (int run = 0; run < 2; ++run) {  // the first compiles
        // The forward, which also writes the rows' statistics that the backward keeps, is one
        // kernel.
        const jit::Stats start = jit::stats();
        Tensor y = fn({x})[0];
        eval(y);
        const jit::Stats forward_done = jit::stats();
        EXPECT_EQ(forward_done.fused_kernels_run - start.fused_kernels_run, 1);
        EXPECT_EQ(forward_done.unfused_steps_run - start.unfused_steps_run, 0);
        Tensor loss = (y * wts).sum();
        eval(loss);
        const jit::Stats before = jit::stats();
        Inputs got = autograd::grad({loss}, {x, w, b});
        eval(got);
        const jit::Stats after = jit::stats();
        EXPECT_EQ(after.fused_kernels_run - before.fused_kernels_run, 1);
        EXPECT_EQ(after.unfused_steps_run - before.unfused_steps_run, 0);
        if (run == 0) continue;
        Tensor xe = x.detach().requires_grad_(true);
        Inputs want = eager_grads(
            [&](const Inputs& in) { return Inputs{layer_norm(in[0], {96}, w, b, 1e-5)}; }, {xe},
            {wts}, {xe, w, b});
        expect_close(got[0], want[0], "x");
        expect_close(got[1], want[1], "w");
        expect_close(got[2], want[2], "b");
      }
    }
  }
}

// kiln::cross_entropy in lazy mode: the forward reads the logits in one rows kernel (logsumexp
// and the target's logit) and writes nothing of their size; the backward recomputes the softmax
// from them and writes the gradient alone. Both match eager mode.
TEST(DifferentiableTrace, CrossEntropyInLazyModeWritesOnlyTheGradient) {
  const int64_t rows = 64, classes = 1000;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < rows; ++i) targets.push_back(i % 7 == 3 ? -100 : (i * 37) % classes);
  const Tensor target = from_vector(targets);
  for (DType dtype : {kFloat32, kFloat64}) {
    const size_t logits_bytes = static_cast<size_t>(rows * classes) * element_size(dtype);
    const Tensor w = testing::input({classes}, dtype, 0.5, 2);
    for (double smoothing : {0.0, 0.1}) {
      for (bool weighted : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " smoothing " + std::to_string(smoothing) +
                     (weighted ? " weighted" : ""));
        Tensor x = testing::input({rows, classes}, dtype, -4, 4).requires_grad_(true);
        Fn fn = [&](const Inputs& in) {
          return Inputs{cross_entropy(in[0], target, weighted ? w : Tensor(), Reduction::Mean, -100,
                                      smoothing)};
        };
        for (int run = 0; run < 2; ++run) {  // the first compiles
          const jit::Stats start = jit::stats();
          detail::cpu_reset_peak();
          const size_t before = detail::cpu_allocated_bytes();
          Tensor loss = fn({x})[0];
          eval(loss);
          EXPECT_LT(detail::cpu_peak_allocated_bytes() - before, logits_bytes / 4);
          EXPECT_LE(jit::stats().fused_kernels_run - start.fused_kernels_run, 2);
          detail::cpu_reset_peak();
          const size_t held = detail::cpu_allocated_bytes();
          Inputs got = autograd::grad({loss}, {x});
          eval(got);
          EXPECT_LT(detail::cpu_peak_allocated_bytes() - held, logits_bytes + logits_bytes / 4);
          if (run == 0) continue;
          Tensor xe = x.detach().requires_grad_(true);
          Inputs want = eager_grads(fn, {xe}, {ones({}, dtype)}, {xe});
          expect_close(got[0], want[0], "x");
          LazyGuard eager(false);
          testing::expect_lazy_equal(loss, fn({xe})[0], "loss");
        }
      }
    }
  }
}

// kiln::layer_norm traced: its forward is one kernel, which also writes the row statistics its
// backward reads (the backward's copy of the statistics is the forward's own expression, so the
// two are one), and its backward is one kernel.
TEST(DifferentiableTrace, LayerNormOpTracedIsOneKernelEachWay) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (int64_t rows : {16, 3, 1}) {
      const std::string what = std::string(dtype_name(dtype)) + " rows " + std::to_string(rows);
      Tensor x = testing::input({rows, 40}, dtype).requires_grad_(true);
      Tensor w = testing::input({40}, dtype).requires_grad_(true),
             b = testing::input({40}, dtype).requires_grad_(true);
      Fn fn = [&](const Inputs& in) { return Inputs{layer_norm(in[0], {40}, w, b, 1e-5)}; };
      jit::Function f = jit::trace(fn, {x});
      Inputs wts = {testing::input({rows, 40}, dtype)};
      traced_grads(f, {x}, wts, {x, w, b});  // compiles
      const jit::Stats before = jit::stats();
      eval(f({x}));
      const jit::Stats after = jit::stats();
      EXPECT_EQ(after.fused_kernels_run - before.fused_kernels_run, 1) << what << "\n"
                                                                       << f.graph_str();
      EXPECT_EQ(after.unfused_steps_run - before.unfused_steps_run, 0) << what << "\n"
                                                                       << f.graph_str();
      const StepCounts n = backward_steps(f, {x}, {x, w, b});
      EXPECT_EQ(n.kernels, 1) << what << "\n" << f.backward_graph_str();
      EXPECT_EQ(n.others, 0) << what << "\n" << f.backward_graph_str();
      Tensor xe = x.detach().requires_grad_(true);
      Inputs got = traced_grads(f, {x}, wts, {x, w, b});
      Inputs want = eager_grads(fn, {xe}, wts, {xe, w, b});
      expect_close(got[0], want[0], what + " x");
      expect_close(got[1], want[1], what + " w");
      expect_close(got[2], want[2], what + " b");
      LazyGuard eager_mode(false);
      expect_close(f({x})[0], layer_norm(x.detach(), {40}, w.detach(), b.detach(), 1e-5),
                   what + " forward");
    }
  }
}

// A 3-layer MLP with biases and GELU, traced: the forward is 3 GEMMs and 3 kernels (bias and
// GELU: the GEMMs' results are saved for the backward, so the bias does not fold into them); the
// backward its GEMMs and 3 kernels, each layer's GELU gradient with its bias gradient (a column
// exit). The layers' activations, written out for the next GEMM, are saved for the weight
// gradients' GEMMs rather than recomputed by kernels of their own.
TEST(DifferentiableTrace, MlpWithBiasAndGeluIsItsGemmsAndOneKernelPerLayer) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (int64_t batch : {12, 1}) {
      const std::string what = std::string(dtype_name(dtype)) + " batch " + std::to_string(batch);
      const int64_t width = 20;
      std::vector<Tensor> ws, bs;
      for (int l = 0; l < 3; ++l) {
        ws.push_back((testing::input({width, width}, dtype) * 0.3).detach().requires_grad_(true));
        bs.push_back(testing::input({width}, dtype).requires_grad_(true));
      }
      Fn mlp = [&](const Inputs& in) {
        Tensor h = in[0];
        for (int l = 0; l < 3; ++l) h = gelu(h.matmul(ws[l]) + bs[l]);
        return Inputs{h};
      };
      Tensor x;
      {
        LazyGuard eager(false);
        x = testing::input({width, batch}, dtype).t();  // not contiguous
      }
      jit::Function f = jit::trace(mlp, {x});
      Inputs wrt = {ws[0], ws[1], ws[2], bs[0], bs[1], bs[2]};
      backward_steps(f, {x}, wrt);  // compiles
      const jit::Stats before = jit::stats();
      f({x});
      const jit::Stats mid = jit::stats();
      EXPECT_EQ(mid.fused_kernels_run - before.fused_kernels_run, 3) << what << f.graph_str();
      EXPECT_EQ(mid.unfused_steps_run - before.unfused_steps_run, 3) << what << f.graph_str();
      const StepCounts n = backward_steps(f, {x}, wrt);
      EXPECT_EQ(n.kernels, 3) << what << f.backward_graph_str();
      // The weight gradients of the 3 layers and the input gradients of the last two.
      EXPECT_EQ(n.others, 5) << what << f.backward_graph_str();
      Inputs wts = {testing::input({batch, width}, dtype)};
      Inputs got = traced_grads(f, {x}, wts, wrt);
      Inputs want = eager_grads(mlp, {x}, wts, wrt);
      for (size_t k = 0; k < wrt.size(); ++k)
        expect_close(got[k], want[k], what + ", parameter " + std::to_string(k));
    }
  }
}

// The same MLP's forward and backward traced as one function (its gradients returned): one plan
// of 3 addmm (the biases fold into the GEMMs), 2 GELUs (lone nodes, run by their reference
// kernels; the last layer's output is not needed for the gradients), 5 backward GEMMs and 3
// backward kernels.
TEST(DifferentiableTrace, MlpForwardAndBackwardTracedTogether) {
  const int64_t batch = 16, width = 24;
  std::vector<Tensor> params;
  for (int l = 0; l < 3; ++l) {
    params.push_back((testing::input({width, width}) * 0.3).detach().requires_grad_(true));
    params.push_back(testing::input({width}).requires_grad_(true));
  }
  Tensor wts = testing::input({batch, width});
  auto forward = [&](const Tensor& x) {
    Tensor h = x;
    for (int l = 0; l < 3; ++l) h = gelu(h.matmul(params[2 * l]) + params[2 * l + 1]);
    return (h * wts).sum();
  };
  Fn step = [&](const Inputs& in) {
    Inputs grads = autograd::grad({forward(in[0])}, params);
    return grads;
  };
  Tensor x = testing::input({batch, width});
  jit::Function f = jit::trace(step, {x});
  f({x});  // compiles
  const jit::Stats before = jit::stats();
  Inputs got = f({x});
  const jit::Stats after = jit::stats();
  EXPECT_EQ(after.fused_kernels_run - before.fused_kernels_run, 3) << f.graph_str();
  EXPECT_EQ(after.unfused_steps_run - before.unfused_steps_run, 3 + 2 + 5) << f.graph_str();
  EXPECT_NE(f.graph_str().find("addmm("), std::string::npos) << f.graph_str();
  Inputs want;
  {
    LazyGuard eager(false);
    want = autograd::grad({forward(x)}, params);
  }
  for (size_t k = 0; k < params.size(); ++k)
    expect_close(got[k], want[k], "parameter " + std::to_string(k));
}

// A call's results hold the backward (their grad_fn), and the backward must not hold the results:
// once the results are gone, so are the saved values.
TEST(DifferentiableTrace, ResultsAndSavedValuesAreFreedWithTheResults) {
  Tensor w = testing::input({256, 256}).requires_grad_(true);
  Tensor x = testing::input({64, 256});
  jit::Function f =
      jit::trace([&](const Inputs& in) { return Inputs{tanh(in[0].matmul(w))}; }, {x});
  f({x});
  const size_t before = detail::cpu_allocated_bytes();
  for (int i = 0; i < 20; ++i) {
    Inputs out = f({x});
    out[0].sum().backward();
  }
  w.mutable_grad() = Tensor();
  EXPECT_EQ(detail::cpu_allocated_bytes(), before);
}

// KILN_LOG=fuser says, per saved value, what is saved and why, and how many values the backward
// recomputes instead.
TEST(DifferentiableTrace, TheSaveOrRecomputeChoiceIsLogged) {
  Tensor w = testing::input({16, 8}).requires_grad_(true);
  Tensor x = testing::input({4, 16});
  jit::set_log_topics("fuser");
  ::testing::internal::CaptureStderr();
  jit::Function f = jit::trace(
      [&](const Inputs& in) { return Inputs{tanh(sigmoid(in[0].matmul(w)) * 3.0)}; }, {x});
  const std::string log = ::testing::internal::GetCapturedStderr();
  jit::set_log_topics("");
  EXPECT_NE(log.find("backward: saves %"), std::string::npos) << log;
  EXPECT_NE(log.find("= matmul ("), std::string::npos) << log;
  // sigmoid, the product and tanh are recomputed from the saved GEMM result.
  const size_t at = log.find("backward: 1 forward value(s) saved, ");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_GE(
      std::atoi(log.c_str() + at + std::string("backward: 1 forward value(s) saved, ").size()), 3)
      << log;
}

TEST(DifferentiableTrace, NoGradCallsAndOutputsThatNeedNoGradient) {
  Tensor x = testing::input({3}).requires_grad_(true);
  jit::Function f = jit::trace(
      [](const Inputs& in) {
        return Inputs{exp(in[0]), gt(in[0], 0.0)};
      },
      {x});
  {
    NoGradGuard no_grad;
    Inputs out = f({x});
    EXPECT_FALSE(out[0].requires_grad());
  }
  Inputs out = f({x});
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  out[0].sum().backward();
  LazyGuard eager(false);
  expect_close(x.grad(), exp(x.detach()), "d exp");
}

TEST(DifferentiableTrace, SplitSavesGemmsAndRecomputesElementwiseValues) {
  // The joint graph of y = tanh(mm(a, b)) and its gradient: the backward reads tanh's output,
  // recomputed from the saved mm result.
  jit::Graph g;
  jit::ValueType t{kFloat32, {2, 2}};
  jit::Value* a = g.add_input(t);
  jit::Value* b = g.add_input(t);
  jit::Value* gy = g.add_input(t);
  jit::Value* m = g.create("mm", {a, b}, {}, {t})->output();
  jit::Value* y = g.create("tanh", {m}, {}, {t})->output();
  jit::Value* y2 = g.create("mul", {y, y}, {}, {t})->output();
  jit::Value* one_minus = g.create("sub", {g.constant(1.0, kFloat64), y2}, {1.0}, {t})->output();
  jit::Value* gm = g.create("mul", {gy, one_minus}, {}, {t})->output();
  g.add_output(y);
  g.add_output(gm);
  jit::Differentiated d = jit::split_forward_backward(g, 1, {false, false, true});
  EXPECT_EQ(d.num_saved, 1u);
  EXPECT_EQ(d.forward->outputs().size(), 2u);  // y, then the saved mm result
  const std::string bwd = d.backward->str();
  EXPECT_EQ(bwd.find("mm("), std::string::npos) << bwd;
  EXPECT_NE(bwd.find("tanh("), std::string::npos) << bwd;
  EXPECT_EQ(d.backward_inputs, (std::vector<int64_t>{2, -1})) << bwd;
}

}  // namespace
}  // namespace kiln
