// What a traced function promises beyond replaying its graph: it follows the hyperparameters and
// modes it reads (an optimizer's learning rate, a module's training flag), tracing has no side
// effects, a failed trace leaves the thread as it was, factories start afresh on every call,
// returned aliases of inputs get their gradients, and a function that runs its own backward is a
// plain function. Each is checked against eager mode.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "jit/log.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"

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

// stderr while `body` runs with KILN_LOG=topics.
std::string logged(const char* topics, const std::function<void()>& body) {
  jit::set_log_topics(topics);
  ::testing::internal::CaptureStderr();
  body();
  std::string out = ::testing::internal::GetCapturedStderr();
  jit::set_log_topics("");
  return out;
}

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

// Still failing: after the trace, something still holds the trace's placeholder for b (through
// the autograd history c.sub_(b) recorded), so the call's flush finds it pending.
TEST(TraceContract, DISABLED_InPlaceWriteOfAFactoryResultUnderAutogradTraces) {
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

// The trace's backward raises (amin saved its output, which fill_ then wrote): nothing of the
// trace stays pending. The written value's node held the fill value with its history, which
// reached amin's saved output, whose storage held the node: a cycle that kept the placeholder
// alive, and the thread's next flush raised in unrelated code.
TEST(TraceContract, AFailedDifferentiationLeavesNothingPending) {
  const Fn fn = [](const Inputs& in) {
    Tensor y = in[0].amin({0}, true);
    y.fill_(2);
    return Inputs{y};
  };
  const int64_t before = jit::stats().pending_nodes;
  EXPECT_THROW(jit::trace(fn, {f64({3, 5}).requires_grad_(true)}), Error);
  EXPECT_EQ(jit::stats().pending_nodes, before);
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

}  // namespace
}  // namespace kiln
