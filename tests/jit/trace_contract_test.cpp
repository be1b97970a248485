// What a traced function promises beyond replaying its graph: it follows the hyperparameters and
// modes it reads (an optimizer's learning rate, a module's training flag), tracing has no side
// effects, a failed trace leaves the thread as it was, factories start afresh on every call,
// returned aliases of inputs get their gradients, a function that runs its own backward is a
// plain function, and leaves' .grad are read and written at each call (accumulating over calls).
// Each is checked against eager mode.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "jit/log.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/autograd.h"
#include "tests/jit/log_capture.h"

namespace kiln {
namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Inputs(const Inputs&)>;

Inputs eager(const Fn& fn, const Inputs& in) {
  LazyGuard off(false);
  return fn(in);
}

Tensor f64(std::vector<double> v) {
  return from_vector(v);
}

using testing::logged;

// ------------------------------------------------------------ hyperparameters and modes

// One optimizer step on loss = sum(p * x): the gradient is x exactly, and with dyadic values
// every update is exact, so traced and eager parameters must be equal.
template <typename Opt>
Inputs step_on(Opt& opt, const Tensor& p, const Inputs& in) {
  opt.zero_grad();
  Tensor loss = (p * in[0]).sum();
  loss.backward();
  opt.step();
  return Inputs{loss};
}

void eager_step_and_clear(optim::Optimizer& opt) {
  eager(
      [&](const Inputs&) {
        opt.step();
        opt.zero_grad();
        return Inputs{};
      },
      {});
}

TEST(TraceContract, SgdFollowsHyperparametersChangedAfterTracingWithoutRecompiling) {
  Tensor traced_p = f64({1, 2, -3}).requires_grad_(true);
  Tensor eager_p = f64({1, 2, -3}).requires_grad_(true);
  optim::SGD traced_opt({traced_p}, optim::SGDOptions{0.25, 0.5});
  optim::SGD eager_opt({eager_p}, optim::SGDOptions{0.25, 0.5});
  const Tensor x = f64({1, -2, 4});
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step_on(traced_opt, traced_p, in); }, {x});
  auto eager_step = [&] {
    eager([&](const Inputs& in) { return step_on(eager_opt, eager_p, in); }, {x});
  };
  f({x});
  eager_step();
  ASSERT_TRUE(equal(traced_p, eager_p));
  const jit::Stats before = jit::stats();
  for (double lr : {0.5, 0.125, 1.0}) {
    traced_opt.options().lr = lr;  // a schedule's update
    eager_opt.options().lr = lr;
    traced_opt.options().momentum = lr / 2;
    eager_opt.options().momentum = lr / 2;
    f({x});
    eager_step();
    EXPECT_TRUE(equal(traced_p, eager_p)) << "lr " << lr << ": " << traced_p << " vs " << eager_p;
    EXPECT_TRUE(equal(traced_opt.momentum_buffer(0), eager_opt.momentum_buffer(0))) << lr;
  }
  const jit::Stats after = jit::stats();
  EXPECT_EQ(after.traces, before.traces);
  EXPECT_EQ(after.kernels_compiled, before.kernels_compiled);
  EXPECT_EQ(f.num_specializations(), 1u);
}

TEST(TraceContract, SgdTracesAnewWhenTheUpdateChangesShape) {
  Tensor traced_p = f64({1, 2}).requires_grad_(true);
  Tensor eager_p = f64({1, 2}).requires_grad_(true);
  optim::SGD traced_opt({traced_p}, optim::SGDOptions{0.5});
  optim::SGD eager_opt({eager_p}, optim::SGDOptions{0.5});
  const Tensor x = f64({1, -2});
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step_on(traced_opt, traced_p, in); }, {x});
  f({x});
  eager([&](const Inputs& in) { return step_on(eager_opt, eager_p, in); }, {x});
  traced_opt.options().weight_decay = 0.25;  // the traced update had no weight-decay term
  eager_opt.options().weight_decay = 0.25;
  const std::string log = logged("guard", [&] { f({x}); });
  eager([&](const Inputs& in) { return step_on(eager_opt, eager_p, in); }, {x});
  EXPECT_NE(log.find("SGD weight_decay != 0 is true, traced as false"), std::string::npos) << log;
  EXPECT_TRUE(equal(traced_p, eager_p)) << traced_p << " vs " << eager_p;
  EXPECT_EQ(f.num_specializations(), 2u);
}

TEST(TraceContract, AdamFollowsHyperparametersChangedAfterTracingWithoutRecompiling) {
  Tensor traced_p = f64({1, 2, -3}).requires_grad_(true);
  Tensor eager_p = f64({1, 2, -3}).requires_grad_(true);
  optim::Adam traced_opt({traced_p}, optim::AdamOptions{0.1});
  optim::Adam eager_opt({eager_p}, optim::AdamOptions{0.1});
  const Tensor x = f64({1, -2, 4});
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step_on(traced_opt, traced_p, in); }, {x});
  auto eager_step = [&] {
    eager([&](const Inputs& in) { return step_on(eager_opt, eager_p, in); }, {x});
  };
  f({x});
  eager_step();
  const jit::Stats before = jit::stats();
  for (double lr : {0.5, 0.02}) {
    for (optim::Adam* opt : {&traced_opt, &eager_opt}) {
      opt->options().lr = lr;
      opt->options().beta1 = 0.8;
      opt->options().eps = 1e-3;
    }
    f({x});
    eager_step();
    // Eager Adam is one fused loop, the traced update a graph of ops: equal up to rounding.
    EXPECT_TRUE(allclose(traced_p, eager_p, 1e-13, 1e-13))
        << lr << ": " << traced_p << " vs " << eager_p;
  }
  EXPECT_EQ(traced_opt.step_count(0), 3);
  const jit::Stats after = jit::stats();
  EXPECT_EQ(after.traces, before.traces);
  EXPECT_EQ(after.kernels_compiled, before.kernels_compiled);
}

TEST(TraceContract, DropoutFollowsTrainAndEvalAfterTracing) {
  auto drop = std::make_shared<nn::Dropout>(0.5);
  const Tensor x = ones({4096});
  jit::Function f = jit::trace([&](const Inputs& in) { return Inputs{drop->forward(in[0])}; }, {x});
  auto zeros_in = [](const Tensor& t) { return eq(t, 0.0).sum().item<int64_t>(); };
  EXPECT_GT(zeros_in(f({x})[0]), 1000);
  drop->eval();
  std::string log = logged("guard", [&] { EXPECT_TRUE(equal(f({x})[0], x)); });
  EXPECT_NE(log.find("Dropout training is false, traced as true"), std::string::npos) << log;
  EXPECT_TRUE(equal(f({x})[0], x));
  drop->train();
  EXPECT_GT(zeros_in(f({x})[0]), 1000);
  EXPECT_EQ(f.num_specializations(), 2u);
}

// ----------------------------------------------------------------------------- no side effects

TEST(TraceContract, TracingAnOptimizerStepLeavesVersionCountersAlone) {
  Tensor p = f64({1, 2}).requires_grad_(true);
  optim::SGD opt({p}, optim::SGDOptions{0.5});
  Tensor earlier = (p * p).sum();  // saves p for its backward
  const uint64_t version = p.version();
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step_on(opt, p, in); }, {f64({1, 1})});
  EXPECT_EQ(p.version(), version);
  EXPECT_NO_THROW(earlier.backward());
  ASSERT_TRUE(p.grad().defined());
  EXPECT_TRUE(equal(p.grad(), f64({2, 4})));
}

// -------------------------------------------------------------------------- calls and failures

TEST(TraceContract, ACallWithAnotherNumberOfInputsIsAnError) {
  jit::Function f = jit::trace([](const Inputs& in) { return Inputs{in[0] + 1}; }, {ones({2})});
  try {
    f({ones({2}), ones({2})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("called with 2 inputs, but the function was traced with 1"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(f({}), Error);
  EXPECT_EQ(f.num_specializations(), 1u);
}

// c.sub_(b) gives c a history that reaches the trace's placeholder for b; c is a constant of the
// plan, and must not keep that history past the trace (every later flush would find b pending).
TEST(TraceContract, InPlaceWriteOfAFactoryResultUnderAutogradTraces) {
  const Fn fn = [](const Inputs& in) {
    Tensor c = full_like(in[0], 1);
    c.sub_(in[1]);
    return Inputs{c * 2};
  };
  Tensor a = f64({1, 2}).requires_grad_(true), b = f64({3, 5}).requires_grad_(true);
  jit::Function f = jit::trace(fn, {a, b});
  Inputs got = f({a, b});
  EXPECT_TRUE(equal(got[0], f64({-4, -8})));
  got[0].sum().backward();
  ASSERT_TRUE(b.grad().defined());
  EXPECT_TRUE(equal(b.grad(), f64({-2, -2})));
  EXPECT_TRUE(equal(f({a, f64({0, 1})})[0], f64({2, 0})));
  // As in eager mode: a gets no gradient (c's value does not depend on a's), b gets -2 each.
  Tensor ea = f64({1, 2}).requires_grad_(true), eb = f64({3, 5}).requires_grad_(true);
  eager(fn, {ea, eb})[0].sum().backward();
  a.mutable_grad() = Tensor();
  b.mutable_grad() = Tensor();
  f({a, b})[0].sum().backward();
  EXPECT_EQ(a.grad().defined(), ea.grad().defined());
  if (ea.grad().defined()) {
    EXPECT_TRUE(equal(a.grad(), ea.grad())) << a.grad();
  }
  EXPECT_TRUE(equal(b.grad(), eb.grad())) << b.grad() << " vs " << eb.grad();
}

// zero_ of a computed value makes its new value (a factory's result inside the trace, a capture
// of the traced graph) the value's history; held with that history, the capture would keep the
// trace's placeholder alive, and the call's flush would find it pending.
TEST(TraceContract, FillOfAComputedValueUnderAutogradTraces) {
  const Fn fn = [](const Inputs& in) {
    Tensor y = in[0] * 2;
    y.slice(0, 0, 1).zero_();
    return Inputs{y};
  };
  Tensor x = f64({3, 5}).requires_grad_(true);
  jit::Function f = jit::trace(fn, {x});
  Inputs got = f({x});
  EXPECT_TRUE(equal(got[0], f64({0, 10})));
  got[0].sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(equal(x.grad(), f64({0, 2})));
}

// Differentiating the function raises (amin saved its output, which fill_ then wrote): the trace
// still succeeds, as eager mode's forward does, its backward raises, and nothing of the trace stays
// pending. The written value's node held the fill value with its history, which reached amin's
// saved output, whose storage held the node: a cycle that kept the placeholder alive, and the
// thread's next flush raised in unrelated code.
TEST(TraceContract, AFailedDifferentiationLeavesNothingPending) {
  const Fn fn = [](const Inputs& in) {
    Tensor y = in[0].amin({0}, true);
    y.fill_(2);
    return Inputs{y};
  };
  const int64_t before = jit::stats().pending_nodes;
  {
    Tensor x = f64({3, 5}).requires_grad_(true);
    Inputs out = jit::trace(fn, {x})({x});
    EXPECT_TRUE(equal(out[0], f64({2})));
    EXPECT_THROW(out[0].sum().backward(), Error);
  }
  EXPECT_EQ(jit::stats().pending_nodes, before);
}

// A function whose backward would raise (reciprocal saved its output, which a write through a
// slice then changed) traces and runs forward as in eager mode, where only a backward raises: a
// caller that never differentiates it must not see the error.
TEST(TraceContract, AWriteToASavedValueRaisesOnlyInBackwardAsEagerMode) {
  const Fn fn = [](const Inputs& in) {
    Tensor y = reciprocal(in[0]);
    y.slice(0, 1, 2).fill_(0);
    return Inputs{y};
  };
  Tensor x = f64({2, 4}).requires_grad_(true);
  Inputs want = eager(fn, {x});
  jit::Function f = jit::trace(fn, {x});
  Inputs got = f({x});
  EXPECT_TRUE(equal(got[0], want[0])) << got[0] << " vs " << want[0];
  EXPECT_TRUE(got[0].requires_grad());
  EXPECT_TRUE(equal(f({f64({4, 8}).requires_grad_(true)})[0], f64({0.25, 0})));
  EXPECT_THROW(want[0].sum().backward(), Error);
  try {
    got[0].sum().backward();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified by an in-place operation"), std::string::npos)
        << e.what();
  }
}

TEST(TraceContract, AFailedTraceLeavesTheThreadAsItWas) {
  const bool lazy = is_lazy_enabled();
  EXPECT_THROW(jit::trace(
                   [](const Inputs& in) -> Inputs {
                     Tensor c = zeros({2});
                     c.add_(in[0]);
                     throw Error("the traced function failed");
                   },
                   {ones({2})}),
               Error);
  EXPECT_EQ(is_lazy_enabled(), lazy);
  // Unrelated lazy in-place work on this thread still runs.
  Tensor y = clamp(f64({-4, 6}), -1, std::nullopt);
  y.div_(3.0);
  EXPECT_TRUE(equal(y, f64({-1.0 / 3, 2})));
  jit::Function f = jit::trace([](const Inputs& in) { return Inputs{in[0] * 2}; }, {ones({2})});
  EXPECT_TRUE(equal(f({ones({2})})[0], full({2}, 2.0)));
}

// A function that fails after writing, with autograd, a factory's result and captured tensors
// (one through a view), and after storing a value computed from its arguments outside.
TEST(TraceContract, AFailedTraceUnderAutogradLeavesTheThreadAsItWas) {
  Tensor w = f64({1, 2});
  const Tensor p = f64({0.5, -1}).requires_grad_(true);
  const uint64_t w_version = w.version();
  Tensor stored;
  const auto fails = [&](const Inputs& in) -> Inputs {
    Tensor c = full_like(in[0], 1);
    c.sub_(in[1]);
    w.add_(c * p);
    w.view({2, 1}).mul_(in[0].view({2, 1}));
    stored = w * in[1];
    throw Error("the traced function failed");
  };
  const Tensor a = f64({2, 4}).requires_grad_(true), b = f64({1, 3}).requires_grad_(true);
  EXPECT_THROW(jit::trace(fails, {a, b}), Error);
  // The captured tensor is as it was: value, version, no history.
  EXPECT_TRUE(equal(w, f64({1, 2}))) << w;
  EXPECT_EQ(w.version(), w_version);
  EXPECT_FALSE(w.requires_grad());
  EXPECT_FALSE(p.grad().defined());
  // The stored value cannot be computed outside the trace, and says so.
  try {
    eval({stored});
    FAIL() << "reading a value computed inside a failed trace did not raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("used outside the trace"), std::string::npos) << e.what();
  }
  // Unrelated lazy in-place work on this thread runs, with eager mode's values.
  const Fn unrelated = [](const Inputs& in) {
    Tensor y = clamp(in[0], -1, std::nullopt);
    y.div_(3.0);
    Tensor z = y * in[0];
    z.add_(y);
    return Inputs{y, z};
  };
  const Inputs want = eager(unrelated, {f64({-4, 6})});
  const Inputs got = unrelated({f64({-4, 6})});
  EXPECT_TRUE(equal(got[0], want[0])) << got[0];
  EXPECT_TRUE(equal(got[1], want[1])) << got[1];
  w.add_(p.detach());
  EXPECT_TRUE(equal(w, f64({1.5, 1}))) << w;
  // And so does tracing the same captures again.
  jit::Function f =
      jit::trace([&](const Inputs& in) { return Inputs{(w * p * in[0]).sum()}; }, {a});
  f({a})[0].backward();
  EXPECT_TRUE(equal(p.grad(), f64({3, 4}))) << p.grad();
}

// --------------------------------------------------------------------------------- factories

TEST(TraceContract, FactoriesWrittenInPlaceStartAfreshOnEveryCall) {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> factories = {
      {"zeros", [](const Tensor&) { return zeros({3}, kFloat64); }},
      {"zeros_like", [](const Tensor& t) { return zeros_like(t); }},
      {"ones", [](const Tensor&) { return ones({3}, kFloat64); }},
      {"full", [](const Tensor&) { return full({3}, 2.0, kFloat64); }},
      {"full_like", [](const Tensor& t) { return full_like(t, 2.0); }},
      {"arange", [](const Tensor&) { return arange(3, kFloat64); }},
      {"linspace", [](const Tensor&) { return linspace(0, 1, 3, kFloat64); }},
      {"eye", [](const Tensor&) { return eye(3, kFloat64).select(0, 1); }},
      {"empty+fill_", [](const Tensor&) { return empty({3}, kFloat64).fill_(4.0); }},
  };
  for (const auto& [name, make] : factories) {
    const Fn fn = [make = make](const Inputs& in) {
      Tensor z = make(in[0]);
      z.add_(in[0]);
      return Inputs{z * 1};
    };
    const Tensor x = f64({1, 2, 3});
    const Tensor want = eager(fn, {x})[0];
    jit::Function f = jit::trace(fn, {x});
    for (int call = 0; call < 3; ++call)
      EXPECT_TRUE(equal(f({x})[0], want)) << name << ", call " << call << ": " << f({x})[0];
  }
}

TEST(TraceContract, RandomFactoriesDrawAnewOnEveryCall) {
  jit::Function f = jit::trace(
      [](const Inputs& in) {
        Tensor z = randn({64}, kFloat64);
        z.add_(in[0]);
        return Inputs{z * 1};
      },
      {zeros({64}, kFloat64)});
  Tensor a = f({zeros({64}, kFloat64)})[0], b = f({zeros({64}, kFloat64)})[0];
  EXPECT_FALSE(equal(a, b));
}

// ------------------------------------------------------------------- aliases of the inputs

void expect_alias_gradient(const char* what, const Fn& fn) {
  Tensor x = f64({1, 2}).requires_grad_(true);
  Inputs out = fn({x});
  (out[0].sum() + out[1].sum()).backward();
  const Tensor want = x.grad().clone();
  x.mutable_grad() = Tensor();
  jit::Function f = jit::trace(fn, {x});
  out = f({x});
  (out[0].sum() + out[1].sum()).backward();
  ASSERT_TRUE(x.grad().defined()) << what;
  EXPECT_TRUE(equal(x.grad(), want)) << what << ": " << x.grad() << ", eager " << want;
  EXPECT_TRUE(equal(want, f64({4, 4}))) << what;
}

TEST(TraceContract, ReturnedAliasesOfAnInputGetTheirGradient) {
  expect_alias_gradient("view", [](const Inputs& in) {
    return Inputs{in[0].view({2}), in[0] * 3};
  });
  expect_alias_gradient("to", [](const Inputs& in) {
    return Inputs{in[0].to(kFloat64), in[0] * 3};
  });
  expect_alias_gradient("copy_", [](const Inputs& in) {
    Tensor y = empty({2}, kFloat64);
    y.copy_(in[0]);
    return Inputs{y, in[0] * 3};
  });
}

// The graph merges sqrt(x) computed twice (CSE) into one value, yet the two outputs were two
// tensors: each gets its own gradient, as in eager mode. When they came back as one tensor, both
// weights reached the backward through one slot and the other read zeros: 0 / (2 sqrt(0)) made
// the gradient at 0 NaN instead of inf.
TEST(TraceContract, OutputsMergedIntoOneValueGetTheirOwnGradients) {
  const Fn fn = [](const Inputs& in) { return Inputs{sqrt(in[0]), sqrt(in[0])}; };
  const Inputs weights = {f64({1, 1, 2}), f64({1, -3, 2})};
  auto gradient = [&](const Inputs& out, const Tensor& x) {
    return autograd::grad(out, {x}, weights)[0];
  };
  Tensor x = f64({0, 4, 1}).requires_grad_(true);
  const Tensor want = gradient(eager(fn, {x}), x);
  jit::Function f = jit::trace(fn, {x});
  for (int call = 0; call < 2; ++call) {
    const Inputs out = f({x});
    EXPECT_FALSE(out[0].is_same(out[1]));
    const Tensor got = gradient(out, x);
    EXPECT_TRUE(equal(got, want)) << "call " << call << ": " << got << ", eager " << want;
  }
  EXPECT_TRUE(equal(want, f64({INFINITY, -0.5, 2})));
}

// The single piece of chunk(1, d) is its whole input, so the graph gives it the input's value:
// the trace returned one tensor for both. Taken before an in-place write of y into the input,
// the piece does not require grad in eager mode (nor in libtorch), while the input does; the one
// tensor took the call's node as its history and the piece's weight reached y's gradient.
TEST(TraceContract, ASinglePieceOfChunkIsNotItsInputAfterAnInPlaceWrite) {
  const Fn fn = [](const Inputs& in) {
    Tensor v = clamp(in[0] * 1.0, 0.5, 0.5);  // no history: in[0] does not require grad
    Tensor piece = v.chunk(1, 0)[0];
    v.slice(0, 1, 2).copy_(in[1]);
    return Inputs{piece, v};
  };
  Tensor x = f64({3, -1, 2}), y = f64({5}).requires_grad_(true);
  const Inputs eager_out = eager(fn, {x, y});
  EXPECT_FALSE(eager_out[0].requires_grad());
  const Tensor want = autograd::grad({eager_out[1]}, {y}, {f64({1, 4, 1})})[0];
  jit::Function f = jit::trace(fn, {x, y});
  for (int call = 0; call < 2; ++call) {
    const Inputs out = f({x, y});
    EXPECT_FALSE(out[0].is_same(out[1])) << "call " << call;
    EXPECT_FALSE(out[0].requires_grad()) << "call " << call;
    EXPECT_TRUE(equal(out[0], f64({0.5, 5, 0.5}))) << "call " << call << ": " << out[0];
    const Tensor got = autograd::grad({out[1]}, {y}, {f64({1, 4, 1})})[0];
    EXPECT_TRUE(equal(got, want)) << "call " << call << ": " << got << ", eager " << want;
  }
  EXPECT_TRUE(equal(want, f64({4})));
}

// ------------------------------------------------------------------- .grad across calls

// loss = sum(p * p * x): p's gradient 2 p x is exact in float64 with dyadic values.
Tensor micro_batch(const Tensor& p, const Tensor& x) {
  Tensor loss = (p * p * x).sum();
  loss.backward();
  return loss.detach();
}

const std::vector<Tensor>& batches() {
  static const std::vector<Tensor> b = {f64({1, 2}), f64({-3, 0.25}), f64({4, -1}), f64({0.5, 8})};
  return b;
}

// Gradient accumulation over micro-batches, split across two traced functions: one runs a
// backward (no zero_grad), the other steps and clears. The .grad each reads is the one of the
// call, and each backward adds to it, as in eager mode.
TEST(TraceContract, BackwardAccumulatesIntoGradAcrossCallsAsEagerMode) {
  Tensor traced_p = f64({0.5, -1.5}).requires_grad_(true);
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true);
  optim::SGD traced_opt({traced_p}, optim::SGDOptions{0.25});
  optim::SGD eager_opt({eager_p}, optim::SGDOptions{0.25});
  jit::Function accumulate = jit::trace(
      [&](const Inputs& in) { return Inputs{micro_batch(traced_p, in[0])}; }, {f64({1, 1})});
  EXPECT_FALSE(traced_p.grad().defined()) << "tracing assigned .grad";
  micro_batch(traced_p, f64({1, 1}));  // .grad defined when the step is traced
  jit::Function step = jit::trace(
      [&](const Inputs&) {
        traced_opt.step();
        traced_opt.zero_grad();
        return Inputs{};
      },
      {});
  EXPECT_TRUE(traced_p.grad().defined()) << "tracing cleared .grad";
  traced_p.mutable_grad() = Tensor();
  std::string log;
  for (int round = 0; round < 3; ++round) {
    for (const Tensor& x : batches()) {
      SCOPED_TRACE(::testing::Message() << "round " << round << ", x = " << x);
      const Tensor held = eager_p.grad(), traced_held = traced_p.grad();
      const Tensor want =
          eager([&](const Inputs& in) { return Inputs{micro_batch(eager_p, in[0])}; }, {x})[0];
      log += logged("guard", [&] { EXPECT_TRUE(equal(accumulate({x})[0], want)); });
      ASSERT_TRUE(traced_p.grad().defined());
      EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()))
          << traced_p.grad() << " vs " << eager_p.grad();
      // Eager mode adds into the .grad it finds: a tensor holding it sees the sum.
      if (held.defined()) {
        EXPECT_TRUE(equal(traced_held, held)) << traced_held << " vs " << held;
      }
    }
    step({});
    eager_step_and_clear(eager_opt);
    EXPECT_FALSE(traced_p.grad().defined());
    EXPECT_TRUE(equal(traced_p, eager_p)) << traced_p << " vs " << eager_p;
  }
  EXPECT_NE(log.find("the .grad of a captured float64[2] tensor is float64[2], traced as "
                     "undefined"),
            std::string::npos)
      << log;
  EXPECT_EQ(accumulate.num_specializations(), 2u);
  EXPECT_EQ(step.num_specializations(), 1u);
}

// A .grad defined at trace time and undefined at a call (and the other way): the step reads it,
// so each case has its own specialization, and an undefined .grad leaves p alone as in eager mode.
TEST(TraceContract, AStepTracesAnewWhenGradIsSetOrNot) {
  Tensor traced_p = f64({0.5, -1.5}).requires_grad_(true);
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true);
  optim::SGD traced_opt({traced_p}, optim::SGDOptions{0.5, 0.5});
  optim::SGD eager_opt({eager_p}, optim::SGDOptions{0.5, 0.5});
  micro_batch(traced_p, f64({1, 1}));
  jit::Function step = jit::trace(
      [&](const Inputs&) {
        traced_opt.step();
        return Inputs{};
      },
      {});
  traced_p.mutable_grad() = Tensor();
  for (int call = 0; call < 6; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    const Tensor& x = batches()[static_cast<size_t>(call) % batches().size()];
    if (call % 3 != 1) {
      micro_batch(traced_p, x);
      eager([&](const Inputs& in) { return Inputs{micro_batch(eager_p, in[0])}; }, {x});
    } else {
      traced_p.mutable_grad() = Tensor();
      eager_p.mutable_grad() = Tensor();
    }
    step({});
    eager(
        [&](const Inputs&) {
          eager_opt.step();
          return Inputs{};
        },
        {});
    EXPECT_TRUE(equal(traced_p, eager_p)) << traced_p << " vs " << eager_p;
  }
  EXPECT_EQ(step.num_specializations(), 2u);
}

// clip_grad_norm_ scales the .grad it finds in place: each call scales the .grad of the call, and
// a tensor holding it sees the change, as in eager mode. Such a function cannot be saved.
TEST(TraceContract, ClippingWritesTheGradOfTheCallInPlace) {
  Tensor traced_p = f64({0.5, -1.5}).requires_grad_(true);
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true);
  micro_batch(traced_p, f64({1, 1}));
  jit::Function clip = jit::trace(
      [&](const Inputs&) { return Inputs{nn::utils::clip_grad_norm_({traced_p}, 1.0)}; }, {});
  for (const Tensor& x : batches()) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    traced_p.mutable_grad() = Tensor();
    micro_batch(traced_p, x);
    eager([&](const Inputs& in) { return Inputs{micro_batch(eager_p, in[0])}; }, {x});
    const Tensor traced_held = traced_p.grad(), held = eager_p.grad();
    const Tensor norm = clip({})[0];
    const Tensor want = eager(
        [&](const Inputs&) { return Inputs{nn::utils::clip_grad_norm_({eager_p}, 1.0)}; }, {})[0];
    EXPECT_TRUE(allclose(norm, want, 1e-14, 1e-14)) << norm << " vs " << want;
    EXPECT_TRUE(allclose(traced_held, held, 1e-14, 1e-14)) << traced_held << " vs " << held;
    EXPECT_TRUE(traced_p.grad().is_same(traced_held));
    eager_p.mutable_grad() = Tensor();
  }
  EXPECT_THROW(clip.save(::testing::TempDir() + "/kiln_trace_clip.kiln"), Error);
}

// A call argument that requires grad gets its gradient in its own .grad, added to the one it has.
TEST(TraceContract, BackwardAccumulatesIntoAnArgumentsGrad) {
  const Tensor w = f64({3, -0.5});
  const Fn fn = [&](const Inputs& in) { return Inputs{micro_batch(in[0], w)}; };
  Tensor traced_x = f64({1, 2}).requires_grad_(true);
  Tensor eager_x = f64({1, 2}).requires_grad_(true);
  jit::Function f = jit::trace(fn, {traced_x});
  EXPECT_FALSE(traced_x.grad().defined());
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    if (call == 2) {  // new arguments, without a .grad
      traced_x = batches()[2].clone().requires_grad_(true);
      eager_x = batches()[2].clone().requires_grad_(true);
    }
    const Tensor want = eager(fn, {eager_x})[0];
    EXPECT_TRUE(equal(f({traced_x})[0], want));
    ASSERT_TRUE(traced_x.grad().defined());
    EXPECT_TRUE(equal(traced_x.grad(), eager_x.grad()))
        << traced_x.grad() << " vs " << eager_x.grad();
  }
}

// Tracing zero_grad (and a step after it) leaves .grad as it was before the trace, and each call
// clears and assigns it as eager mode does.
TEST(TraceContract, TracingZeroGradLeavesGradAsItWas) {
  Tensor traced_p = f64({0.5, -1.5}).requires_grad_(true);
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true);
  optim::SGD traced_opt({traced_p}, optim::SGDOptions{0.25});
  optim::SGD eager_opt({eager_p}, optim::SGDOptions{0.25});
  micro_batch(traced_p, f64({1, 3}));
  micro_batch(eager_p, f64({1, 3}));
  const Tensor before = traced_p.grad();
  jit::Function f = jit::trace([&](const Inputs& in) { return step_on(traced_opt, traced_p, in); },
                               {f64({1, 1})});
  EXPECT_TRUE(traced_p.grad().is_same(before)) << "tracing changed .grad";
  jit::Function clear = jit::trace(
      [&](const Inputs&) {
        traced_opt.zero_grad();
        return Inputs{};
      },
      {});
  EXPECT_TRUE(traced_p.grad().is_same(before)) << "tracing zero_grad cleared .grad";
  EXPECT_TRUE(equal(before, f64({1, -9})));
  for (const Tensor& x : batches()) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    f({x});
    eager([&](const Inputs& in) { return step_on(eager_opt, eager_p, in); }, {x});
    EXPECT_TRUE(equal(traced_p, eager_p)) << traced_p << " vs " << eager_p;
    EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()));
    clear({});
    EXPECT_FALSE(traced_p.grad().defined());
  }
}

// A captured tensor whose history dates from before the trace, written in place under autograd:
// a replay could not give it the history eager mode does (its gradient would flow into the old
// one), so tracing raises and leaves it as it was. Written under NoGradGuard, it traces and
// matches eager mode.
TEST(TraceContract, WritingATensorWithEarlierHistoryUnderAutogradIsAnError) {
  const Tensor p = f64({0.5, -1.5}).requires_grad_(true);
  Tensor h = p * 2;
  try {
    jit::trace(
        [&](const Inputs& in) {
          h.mul_(in[0]);
          return Inputs{h.sum()};
        },
        {f64({1, 2})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mul_: jit::trace: the traced function writes in place, "
                                         "with autograd on,"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("history from before the trace"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(equal(h, f64({1, -3}))) << h;
  h.sum().backward();
  EXPECT_TRUE(equal(p.grad(), f64({2, 2}))) << p.grad();

  Tensor eager_h = p * 2;
  const auto write = [](Tensor& t, const Inputs& in) {
    NoGradGuard no_grad;
    t.mul_(in[0]);
    return Inputs{t * 1};
  };
  jit::Function f = jit::trace([&](const Inputs& in) { return write(h, in); }, {f64({1, 1})});
  for (const Tensor& x : batches()) {
    EXPECT_TRUE(
        equal(f({x})[0], eager([&](const Inputs& in) { return write(eager_h, in); }, {x})[0]));
    EXPECT_TRUE(equal(h, eager_h)) << h << " vs " << eager_h;
  }
}

// A captured tensor written in place, inside the function, with a value that requires grad: eager
// mode gives it a history that reaches the argument, which a replay (writing its value back)
// could not, so later gradients through it would be lost. Tracing raises and leaves it as it was.
TEST(TraceContract, WritingACapturedTensorWithAValueThatRequiresGradIsAnError) {
  const auto write = [](Tensor& c, const Inputs& in) {
    c.copy_(in[0] * 2);
    return Inputs{c.sum()};
  };
  Tensor eager_c = f64({0, 0}), eager_x = f64({1, 3}).requires_grad_(true);
  eager([&](const Inputs& in) { return write(eager_c, in); }, {eager_x});
  eager_c.sum().backward();
  EXPECT_TRUE(equal(eager_x.grad(), f64({2, 2})));

  Tensor c = f64({0, 0}), x = f64({1, 3}).requires_grad_(true);
  const int64_t pending = jit::stats().pending_nodes;
  try {
    jit::trace([&](const Inputs& in) { return write(c, in); }, {x});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("jit::trace: the traced function writes, with autograd "
                                         "on, a value that requires grad into"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(equal(c, f64({0, 0}))) << c;
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(jit::stats().pending_nodes, pending);
}

// A tensor the function allocates, written with a value that requires grad and saved by the op
// that reads it: its history is the graph's own, and the call's gradient is eager mode's.
TEST(TraceContract, AFactoryResultWrittenWithAValueThatRequiresGradTraces) {
  const Fn fn = [](const Inputs& in) {
    Tensor c = zeros_like(in[0]);
    c.copy_(in[0] * 2);
    return Inputs{(c * c).sum()};
  };
  jit::Function f = jit::trace(fn, {f64({1, 1}).requires_grad_(true)});
  for (const Tensor& x : batches()) {
    const Tensor eager_x = x.clone().requires_grad_(true),
                 traced_x = x.clone().requires_grad_(true);
    eager(fn, {eager_x})[0].backward();
    f({traced_x})[0].backward();
    EXPECT_TRUE(equal(traced_x.grad(), eager_x.grad()))
        << traced_x.grad() << " vs " << eager_x.grad();
  }
}

// A captured non-leaf (computed from a parameter before the trace): the call's gradient reaches the
// parameter through the capture's history, as in eager mode.
TEST(TraceContract, ACapturedNonLeafPassesItsGradientOnAsEagerMode) {
  const auto fn = [](const Tensor& h, const Inputs& in) { return Inputs{(h * h * in[0]).sum()}; };
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true), traced_p = f64({0.5, -1.5});
  traced_p.requires_grad_(true);
  Tensor eager_h = eager_p * 2, traced_h = traced_p * 2;
  jit::Function f = jit::trace([&](const Inputs& in) { return fn(traced_h, in); }, {f64({1, 1})});
  for (const Tensor& x : batches()) {
    eager([&](const Inputs& in) { return fn(eager_h, in); }, {x})[0].backward(
        Tensor(), /*retain_graph=*/true);
    f({x})[0].backward(Tensor(), /*retain_graph=*/true);
    EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()))
        << traced_p.grad() << " vs " << eager_p.grad();
  }
}

// --------------------------------------------------- functions that run a backward of their own

enum class Inner { kBackward, kGrad, kGradCreateGraph, kNone };

const char* inner_name(Inner k) {
  switch (k) {
    case Inner::kBackward:
      return "Backward";
    case Inner::kGrad:
      return "Grad";
    case Inner::kGradCreateGraph:
      return "GradCreateGraph";
    case Inner::kNone:
      return "NoBackward";
  }
  return "";
}

// loss = sum(p * p * x) over a captured parameter p. Its gradient 2 p x depends on p, so the
// gradient computed with create_graph is differentiable again. `differentiable` false: every
// returned value is detached or computed under NoGradGuard.
Inputs own_backward(Inner kind, bool differentiable, Tensor p, const Inputs& in) {
  Tensor loss = (p * p * in[0]).sum();
  Inputs out;
  switch (kind) {
    case Inner::kBackward:
      p.mutable_grad() = Tensor();  // zero_grad
      loss.backward();
      out = {loss};
      break;
    case Inner::kGrad:
      out = autograd::grad({loss}, {p});
      out.push_back(loss);
      break;
    case Inner::kGradCreateGraph:
      out = autograd::grad({loss}, {p}, {}, std::nullopt, /*create_graph=*/true);
      out.push_back(loss);
      break;
    case Inner::kNone:
      out = {loss, p * in[0]};
      break;
  }
  if (!differentiable) {
    for (Tensor& t : out) t = t.detach();
    NoGradGuard no_grad;
    out.push_back(p * in[0] + loss);
  }
  return out;
}

// Runs `call`; false when it raised kiln::Error (what eager mode and the replay must agree on).
bool runs(const std::function<void()>& call) {
  try {
    call();
    return true;
  } catch (const Error&) {
    return false;
  }
}

Tensor sum_of(const Inputs& values, const std::vector<size_t>& which) {
  Tensor s = values[which[0]].sum();
  for (size_t k = 1; k < which.size(); ++k) s = s + values[which[k]].sum();
  return s;
}

class OwnBackward : public ::testing::TestWithParam<std::tuple<Inner, bool, bool>> {};

// Traced with autograd on (as a Function is made once, up front), then called three times with
// changing inputs with autograd on or off: returned values, errors and p.grad as in eager mode,
// and where eager's returned values are differentiable, the gradients of an outer backward too.
TEST_P(OwnBackward, MatchesEagerMode) {
  const auto [kind, differentiable, grad_on] = GetParam();
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true);
  Tensor traced_p = f64({0.5, -1.5}).requires_grad_(true);
  jit::Function f =
      jit::trace([&, kind = kind, differentiable = differentiable](
                     const Inputs& in) { return own_backward(kind, differentiable, traced_p, in); },
                 {f64({1, 1})});
  EXPECT_FALSE(traced_p.grad().defined()) << "tracing assigned .grad";
  AutoGradMode mode(grad_on);
  for (const Tensor& x : {f64({1, 2}), f64({-3, 0.25}), f64({4, -1})}) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    Inputs want, got;
    const bool eager_ran = runs([&] {
      want = eager(
          [&](const Inputs& in) { return own_backward(kind, differentiable, eager_p, in); }, {x});
    });
    const bool traced_ran = runs([&] { got = f({x}); });
    ASSERT_EQ(traced_ran, eager_ran);
    if (!eager_ran) continue;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(equal(got[i], want[i])) << "output " << i << ": " << got[i] << " vs " << want[i];
    ASSERT_EQ(traced_p.grad().defined(), eager_p.grad().defined());
    if (eager_p.grad().defined()) {
      EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()))
          << traced_p.grad() << " vs " << eager_p.grad();
    }
    std::vector<size_t> differentiable_outputs;
    for (size_t i = 0; i < want.size(); ++i)
      if (want[i].requires_grad()) differentiable_outputs.push_back(i);
    if (differentiable_outputs.empty()) continue;
    // A loss whose graph the function's own backward freed cannot be differentiated again, in
    // either mode; the others give the same gradients.
    const bool eager_backward = runs([&] { sum_of(want, differentiable_outputs).backward(); });
    const bool traced_backward = runs([&] { sum_of(got, differentiable_outputs).backward(); });
    EXPECT_EQ(traced_backward, eager_backward);
    ASSERT_EQ(traced_p.grad().defined(), eager_p.grad().defined());
    if (eager_p.grad().defined()) {
      EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()))
          << "after the outer backward: " << traced_p.grad() << " vs " << eager_p.grad();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TraceContract, OwnBackward,
                         ::testing::Combine(::testing::Values(Inner::kBackward, Inner::kGrad,
                                                              Inner::kGradCreateGraph,
                                                              Inner::kNone),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<OwnBackward::ParamType>& info) {
                           return std::string(inner_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_ReturnsDifferentiable"
                                                           : "_ReturnsPlain") +
                                  (std::get<2>(info.param) ? "_GradOn" : "_GradOff");
                         });

// The function's own backward runs through the earlier graph of a captured non-leaf (h = p * p,
// which saved p) and frees it. As in eager mode: tracing frees nothing (a backward through h
// still works), each call frees it (a backward through h then raises), and a call after that
// raises as its backward would.
TEST(TraceContract, AnOwnBackwardFreesACapturedTensorsEarlierGraphAtEachCallAsEagerMode) {
  const auto fn = [](const Tensor& h, const Inputs& in) {
    Tensor loss = (h * in[0]).sum();
    loss.backward();
    return Inputs{loss.detach()};
  };
  Tensor eager_p = f64({0.5, -1.5}).requires_grad_(true), traced_p = f64({0.5, -1.5});
  traced_p.requires_grad_(true);
  Tensor eager_h = eager_p * eager_p, traced_h = traced_p * traced_p;
  jit::Function f = jit::trace([&](const Inputs& in) { return fn(traced_h, in); }, {f64({1, 1})});
  EXPECT_TRUE(runs([&] { traced_h.sum().backward(Tensor(), /*retain_graph=*/true); }))
      << "tracing freed the captured tensor's graph";
  EXPECT_TRUE(runs([&] { eager_h.sum().backward(Tensor(), /*retain_graph=*/true); }));
  const Inputs x = {f64({1, 2})};
  const Inputs want = eager([&](const Inputs& in) { return fn(eager_h, in); }, x);
  const Inputs got = f(x);
  EXPECT_TRUE(equal(got[0], want[0])) << got[0] << " vs " << want[0];
  EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()))
      << traced_p.grad() << " vs " << eager_p.grad();
  EXPECT_FALSE(runs([&] { eager_h.sum().backward(Tensor(), /*retain_graph=*/true); }));
  EXPECT_FALSE(runs([&] { traced_h.sum().backward(Tensor(), /*retain_graph=*/true); }))
      << "the call left the captured tensor's graph alive";
  EXPECT_FALSE(runs([&] { eager([&](const Inputs& in) { return fn(eager_h, in); }, x); }));
  EXPECT_FALSE(runs([&] { f(x); })) << "a call ran backward through a freed graph";
  EXPECT_TRUE(equal(traced_p.grad(), eager_p.grad()))
      << traced_p.grad() << " vs " << eager_p.grad();
}

// -------------------------------------------------------------- differentiable functions

// retain_grad() on an intermediate the function returns: after a call and a backward, its .grad
// is the whole gradient that reached it (through the other returned value too), as in eager mode.
TEST(TraceContract, ARetainedReturnedIntermediateGetsItsGradientAsEagerMode) {
  const Fn fn = [](const Inputs& in) {
    Tensor t = in[0] * in[1];
    t.retain_grad();
    return Inputs{(t * t).sum(), t};
  };
  const Inputs example = {f64({1, 1}).requires_grad_(true), f64({1, 1}).requires_grad_(true)};
  jit::Function f = jit::trace(fn, example);
  for (const Tensor& x : batches()) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    const Inputs in = {x.clone().requires_grad_(true), f64({0.5, 3}).requires_grad_(true)};
    const Inputs want = eager(fn, in);
    const Inputs got = f(in);
    for (int pass = 0; pass < 2; ++pass) {
      (want[0] + want[1].sum() * 3).backward(Tensor(), /*retain_graph=*/true);
      (got[0] + got[1].sum() * 3).backward(Tensor(), /*retain_graph=*/true);
      ASSERT_TRUE(want[1].grad().defined());
      ASSERT_TRUE(got[1].grad().defined()) << "the intermediate's .grad was not kept";
      EXPECT_TRUE(equal(got[1].grad(), want[1].grad()))
          << got[1].grad() << " vs " << want[1].grad();
    }
  }
}

// Differentiating part of the function fails (reciprocal saved its output y, which a write
// through a slice then changed); y * w, whose gradient for w does not need reciprocal's, and
// x * w differentiate. As in eager mode, a backward raises only when it reaches reciprocal.
TEST(TraceContract, AFailedDifferentiationRaisesOnlyInBackwardsThatReachIt) {
  const Fn fn = [](const Inputs& in) {
    Tensor y = reciprocal(in[0]);
    y.slice(0, 1, 2).fill_(0);
    return Inputs{y * in[1], in[0] * in[1]};
  };
  const auto inputs = [] {
    return Inputs{f64({2, 4}).requires_grad_(true), f64({3, 5}).requires_grad_(true)};
  };
  jit::Function f = jit::trace(fn, inputs());
  for (bool traced : {false, true}) {
    SCOPED_TRACE(traced ? "traced" : "eager");
    const Inputs in = inputs();
    const Inputs out = traced ? f(in) : eager(fn, in);
    // Through the second output only: both gradients.
    EXPECT_TRUE(runs([&] { out[1].sum().backward(Tensor(), /*retain_graph=*/true); }));
    ASSERT_TRUE(in[0].grad().defined() && in[1].grad().defined());
    EXPECT_TRUE(equal(in[0].grad(), f64({3, 5}))) << in[0].grad();
    EXPECT_TRUE(equal(in[1].grad(), f64({2, 4}))) << in[1].grad();
    // Through the first, for w only: reciprocal is not reached.
    Inputs gw;
    EXPECT_TRUE(runs([&] { gw = autograd::grad({out[0].sum()}, {in[1]}, {}, true); }));
    ASSERT_EQ(gw.size(), 1u);
    EXPECT_TRUE(equal(gw[0], f64({0.5, 0}))) << gw[0];
    // For x it is.
    EXPECT_FALSE(runs([&] { autograd::grad({out[0].sum()}, {in[0]}, {}, true); }));
    EXPECT_FALSE(runs([&] { out[0].sum().backward(Tensor(), /*retain_graph=*/true); }));
  }
}

// The autograd node of a call holds the forward values its backward reads (here the sum s, a
// reduction's result, which is returned too) without their history: the returned s holds the
// node, and a node holding s itself would be a cycle that outlives both.
TEST(TraceContract, ACallsAutogradNodeIsFreedWithItsOutputs) {
  const Fn fn = [](const Inputs& in) {
    Tensor s = in[0].sum();
    return Inputs{s, s * s};
  };
  Tensor x = f64({0.5, 1}).requires_grad_(true);
  jit::Function f = jit::trace(fn, {x});
  const int64_t live = detail::live_autograd_nodes();
  {
    const Inputs out = f({x});
    const Inputs g = autograd::grad({out[1]}, {x}, {}, /*retain_graph=*/true);
    EXPECT_TRUE(equal(g[0], f64({3, 3}))) << g[0];
  }
  EXPECT_EQ(detail::live_autograd_nodes(), live) << "a call's autograd node leaked";
}

// ------------------------------------------------------------ returned values are the caller's

// The optimized graph returns x for x * 1 and a captured constant for a value the function built
// from factories alone; eager mode returns a new tensor each time. Writing into what a call
// returned must change neither its inputs nor what later calls return, traced or loaded.
TEST(TraceContract, AValueTheFunctionComputedIsANewTensorEvenWhereTheGraphFoldsItAway) {
  Tensor w = f64({5, 6});
  const Fn fn = [&](const Inputs& in) {
    return Inputs{in[0] * 1, ones({2}, kFloat64) * 1, w * 1, in[0].view({2}), w.view({2})};
  };
  const Inputs expected = eager(fn, {f64({1, 2})});
  Tensor x = f64({1, 2});
  jit::Function traced = jit::trace(fn, {x});
  const std::string path = ::testing::TempDir() + "/kiln_fresh_returns.kiln";
  traced.save(path);
  jit::Function loaded = jit::load(path);
  for (jit::Function* f : {&traced, &loaded}) {
    for (int call = 0; call < 2; ++call) {
      Tensor xi = f64({1, 2});
      Inputs out = (*f)({xi});
      ASSERT_EQ(out.size(), expected.size());
      for (size_t k = 0; k < out.size(); ++k)
        EXPECT_TRUE(equal(out[k], expected[k])) << "output " << k << ": " << out[k];
      for (size_t k = 0; k < 3; ++k) out[k].add_(100);
      EXPECT_TRUE(equal(xi, f64({1, 2}))) << "x * 1 returned the argument itself: " << xi;
      EXPECT_TRUE(equal(w, f64({5, 6}))) << "w * 1 returned the captured tensor itself: " << w;
      // A view is one, traced as in eager mode: writing into it writes the argument.
      out[3].add_(1);
      EXPECT_TRUE(equal(xi, f64({2, 3}))) << xi;
    }
  }
  // Eager mode returns a view of the captured w; a trace returns a copy
  // (docs/torch-differences.md).
  Inputs out = traced({x});
  out[4].add_(1);
  EXPECT_TRUE(equal(w, f64({5, 6}))) << w;
}

// A value the function wrote in place and then read (sort reads its data; so does item()): the
// read sees the write, also after an earlier read (differential program 18175266749348811613
// crashed reading a null buffer: the written value's node filled another storage).
TEST(TraceContract, ReadingAValueWrittenInPlaceInsideTheTraceSeesTheWrite) {
  const Fn fn = [](const Inputs& in) {
    Tensor v = in[0] * 2;
    v.slice(1, 1, 1).fill_(-0.75);  // an empty write
    Tensor first = std::get<0>(sort(v.reshape({-1})));
    const double before = v[2][1].item<double>();  // a read of v's own storage
    v.slice(1, 1, 2).fill_(-0.75);
    Tensor second = std::get<0>(sort(v.reshape({-1})));
    v.add_(1);
    const double after = v[2][1].item<double>();
    return Inputs{first, second, v, full({}, before, kFloat64), full({}, after, kFloat64)};
  };
  const Tensor x = f64({0.5, 2, -1, 3, 4, -2}).view({3, 2}).requires_grad_(true);
  const Inputs expected = eager(fn, {x});
  Inputs traced;
  {
    ::testing::internal::CaptureStderr();  // the trace warns of the values it read
    traced = jit::trace(fn, {x})({x});
    ::testing::internal::GetCapturedStderr();
  }
  ASSERT_EQ(traced.size(), expected.size());
  for (size_t k = 0; k < traced.size(); ++k)
    EXPECT_TRUE(equal(traced[k], expected[k])) << k << ": " << traced[k] << " vs " << expected[k];
}

// A size-0 value the trace captured as a constant, returned and saved for the backward (found by
// the differential tester, program 281): the call's node saved the constant, and holding the
// returned value, which held the node, it was never freed.
TEST(TraceContract, AnEmptyValueFoldedToAConstantDoesNotHoldItsCallsNode) {
  const Fn fn = [](const Inputs& in) {
    Tensor v = gather(in[0], -2, in[1]);
    v.slice(2, 0, 1, 2).zero_();
    return Inputs{v, rsqrt(v)};
  };
  Tensor x = ones({2, 4, 3}, kFloat64).requires_grad_(true);
  Tensor index = zeros({2, 0, 2}, kInt64);
  jit::Function f = jit::trace(fn, {x, index});
  const int64_t live = detail::live_autograd_nodes();
  {
    const Inputs out = f({x, index});
    EXPECT_EQ(out[0].sizes(), (Shape{2, 0, 2}));
    EXPECT_TRUE(out[0].requires_grad());
    const Inputs g = autograd::grad({out[1].sum()}, {x});
    EXPECT_TRUE(equal(g[0], zeros({2, 4, 3}, kFloat64))) << g[0];
  }
  EXPECT_EQ(detail::live_autograd_nodes(), live) << "a call's autograd node leaked";
}

}  // namespace
}  // namespace kiln
