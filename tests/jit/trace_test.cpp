// kiln::jit::trace: replays match eager, captured tensors stay by reference, in-place updates and
// .grad assignments happen on every call (and never while tracing), guards re-specialize.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "jit/infer.h"
#include "jit/ir.h"
#include "jit/log.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/allocator.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using Inputs = std::vector<Tensor>;

TEST(Trace, ReplayMatchesEagerOnNewInputs) {
  manual_seed(1);
  Tensor w = randn({5, 3}), b = randn({3});
  auto fn = [&](const Inputs& in) {
    Tensor h = tanh(in[0].matmul(w) + b);
    return Inputs{h * sigmoid(h), h.sum({1}, true)};
  };
  jit::Function f = jit::trace(fn, {randn({4, 5})});
  EXPECT_NE(f.graph_str().find("tanh"), std::string::npos) << f.graph_str();
  for (int i = 0; i < 5; ++i) {
    Tensor x = randn({4, 5});
    Inputs got = f({x});
    Inputs want;
    {
      LazyGuard eager(false);
      want = fn({x});
    }
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(equal(got[0], want[0]));
    EXPECT_TRUE(equal(got[1], want[1]));
    EXPECT_FALSE(detail::is_pending(got[0]));
  }
}

TEST(Trace, CapturedTensorsStayByReference) {
  Tensor scale = full({3}, 2.0);
  jit::Function f =
      jit::trace([&](const Inputs& in) { return Inputs{in[0] * scale}; }, {ones({3})});
  EXPECT_TRUE(equal(f({ones({3})})[0], full({3}, 2.0)));
  scale.mul_(3.0);  // seen by the next call
  EXPECT_TRUE(equal(f({ones({3})})[0], full({3}, 6.0)));
}

TEST(Trace, InPlaceWritesHappenOnEveryCallAndNeverWhileTracing) {
  Tensor counter = zeros({2});
  Tensor view_target = zeros({3, 4});
  jit::Function f = jit::trace(
      [&](const Inputs& in) {
        counter.add_(in[0]);
        view_target.select(1, 2).add_(1.0);  // through a view
        return Inputs{counter * 10};
      },
      {ones({2})});
  // Tracing wrote nothing.
  EXPECT_TRUE(equal(counter, zeros({2})));
  EXPECT_TRUE(equal(view_target, zeros({3, 4})));
  Inputs out = f({full({2}, 3.0)});
  EXPECT_TRUE(equal(counter, full({2}, 3.0)));
  EXPECT_TRUE(equal(out[0], full({2}, 30.0)));
  f({full({2}, 1.0)});
  EXPECT_TRUE(equal(counter, full({2}, 4.0)));
  std::vector<float> v = view_target.to_vector<float>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(v[r * 4 + c], c == 2 ? 2.0f : 0.0f);
}

// A small MLP classifier; its training step traced once and replayed must follow eager training.
struct Model {
  nn::Sequential net;
  explicit Model(uint64_t seed)
      : net((manual_seed(seed),
             nn::Sequential{std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::GELU>(),
                            std::make_shared<nn::Linear>(16, 3)})) {}
};

Tensor loss_of(Model& m, const Tensor& x, const Tensor& y) {
  return cross_entropy(m.net.forward(x), y);
}

TEST(Trace, TrainingStepWithAdamMatchesEagerFor100Steps) {
  Model eager_model(5), traced_model(5);
  optim::Adam eager_opt(eager_model.net.parameters(), optim::AdamOptions{1e-2});
  optim::Adam traced_opt(traced_model.net.parameters(), optim::AdamOptions{1e-2});
  manual_seed(9);
  Tensor x = randn({32, 6});
  Tensor y = randint(0, 3, {32});
  auto step = [&](const Inputs& in) {
    traced_opt.zero_grad();
    Tensor loss = loss_of(traced_model, in[0], in[1]);
    loss.backward();
    traced_opt.step();
    return Inputs{loss};
  };
  jit::Function f = jit::trace(step, {x, y});
  // Bounds checks of the targets read values, but do not specialize the trace.
  EXPECT_TRUE(f.warnings().empty()) << f.warnings()[0];
  for (const auto& p : traced_model.net.parameters()) EXPECT_FALSE(p.grad().defined());
  for (int i = 0; i < 100; ++i) {
    eager_opt.zero_grad();
    Tensor l = loss_of(eager_model, x, y);
    l.backward();
    eager_opt.step();
    float traced = f({x, y})[0].item<float>();
    float eager = l.item<float>();
    ASSERT_NEAR(traced, eager, 1e-4 * std::max(1.0f, std::abs(eager))) << "step " << i;
  }
  EXPECT_EQ(traced_opt.step_count(0), 100);
  auto pe = eager_model.net.parameters(), pt = traced_model.net.parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    EXPECT_TRUE(allclose(pt[i], pe[i], 1e-3, 1e-4)) << "parameter " << i;
    ASSERT_TRUE(pt[i].grad().defined());  // each replay assigns .grad as backward does
    EXPECT_TRUE(allclose(pt[i].grad(), pe[i].grad(), 1e-3, 1e-4)) << "gradient " << i;
  }
  EXPECT_EQ(f.num_specializations(), 1u);
}

// Random draws are recorded in a trace, not frozen into it: each replay draws new numbers from the
// process generator, so manual_seed makes replays reproducible; dropout's backward uses the mask
// its forward drew.
TEST(Trace, RandomDrawsAreFreshOnEveryReplay) {
  Tensor x = ones({64, 32}).requires_grad_(true);
  auto fn = [](const Inputs& in) {
    return Inputs{in[0] * rand(in[0].sizes()) + randn({4}, kFloat64).sum().to(kFloat32),
                  dropout(in[0], 0.5, true), randint(0, 5, {7}).to(kFloat32)};
  };
  jit::Function f = jit::trace(fn, {x});
  EXPECT_NE(f.graph_str().find("rand("), std::string::npos) << f.graph_str();
  manual_seed(3);
  Inputs a = f({x});
  Inputs b = f({x});
  manual_seed(3);
  Inputs c = f({x});
  LazyGuard eager(false);
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_FALSE(equal(a[k].detach(), b[k].detach())) << "output " << k << " was the same twice";
    EXPECT_TRUE(equal(a[k].detach(), c[k].detach())) << "output " << k << " after the same seed";
  }
  // About half of the elements dropped, the others scaled by 2; the gradient is the same mask.
  const double kept = gt(a[1].detach(), 0).to(kFloat64).mean().item<double>();
  EXPECT_GT(kept, 0.4);
  EXPECT_LT(kept, 0.6);
  a[1].sum().backward();
  EXPECT_TRUE(equal(x.grad(), a[1].detach())) << "dropout's gradient used another mask";
  Tensor v = a[2].detach();
  EXPECT_GE(v.min().item<double>(), 0.0);
  EXPECT_LE(v.max().item<double>(), 4.0);
}

TEST(Trace, GuardsRespecializeAndLogTheReason) {
  jit::set_log_topics("guard");
  jit::Function f =
      jit::trace([](const Inputs& in) { return Inputs{exp(in[0]) * 2}; }, {ones({2, 3})});
  ::testing::internal::CaptureStderr();
  Inputs out = f({ones({4, 3})});
  std::string log = ::testing::internal::GetCapturedStderr();
  jit::set_log_topics("");
  EXPECT_EQ(f.num_specializations(), 2u);
  EXPECT_NE(log.find("[kiln guard]"), std::string::npos) << log;
  EXPECT_NE(log.find("input 0 is float32[4, 3], traced as float32[2, 3]"), std::string::npos)
      << log;
  EXPECT_EQ(out[0].sizes(), Shape({4, 3}));
  EXPECT_TRUE(allclose(out[0], full({4, 3}, 2 * std::exp(1.0))));
  // dtype and requires_grad are guarded too.
  f({ones({2, 3}, kFloat64)});
  EXPECT_EQ(f.num_specializations(), 3u);
  f({ones({2, 3}).requires_grad_()});
  EXPECT_EQ(f.num_specializations(), 4u);
  f({ones({2, 3})});  // matches the first
  EXPECT_EQ(f.num_specializations(), 4u);
}

// A call takes the previous call's specialization without the Function's lock when that one still
// serves it; alternating inputs and autograd modes must still find each call's own.
TEST(Trace, AlternatingCallsEachFindTheirOwnSpecialization) {
  jit::Function f =
      jit::trace([](const Inputs& in) { return Inputs{exp(in[0]) * 2}; }, {ones({2, 3})});
  const double e2 = 2 * std::exp(1.0);
  int64_t failures = 0;
  for (int i = 0; i < 4; ++i) {
    // The first round traces the specializations: [2, 3], [4, 3], [2, 3] requiring grad with
    // autograd on and with it off.
    if (i == 1) {
      ASSERT_EQ(f.num_specializations(), 4u);
      failures = jit::stats().guard_failures;
    }
    for (int64_t rows : {2, 4, 4, 2, 2}) {
      Tensor y = f({ones({rows, 3})})[0];
      EXPECT_EQ(y.sizes(), Shape({rows, 3}));
      EXPECT_TRUE(allclose(y, full({rows, 3}, e2)));
      EXPECT_FALSE(y.requires_grad());
    }
    Tensor x = ones({2, 3}).requires_grad_();
    Tensor y = f({x})[0];
    EXPECT_TRUE(y.requires_grad());
    y.sum().backward();
    EXPECT_TRUE(allclose(x.grad(), full({2, 3}, e2)));
    NoGradGuard no_grad;
    EXPECT_FALSE(f({x})[0].requires_grad());
    EXPECT_TRUE(allclose(f({x})[0], full({2, 3}, e2)));
  }
  EXPECT_EQ(f.num_specializations(), 4u);
  EXPECT_EQ(jit::stats().guard_failures, failures);  // every later call found its own
}

TEST(Trace, PastTheLimitRunsInPlainLazyModeAndSaysSoOnce) {
  jit::Function f = jit::trace([](const Inputs& in) { return Inputs{in[0] + 1}; }, {ones({1})}, 2);
  f({ones({2})});
  ::testing::internal::CaptureStderr();
  Inputs a = f({ones({3})});
  Inputs b = f({ones({4})});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(f.num_specializations(), 2u);
  EXPECT_TRUE(equal(a[0], full({3}, 2.0)));
  EXPECT_TRUE(equal(b[0], full({4}, 2.0)));
  size_t first = err.find("plain lazy mode");
  EXPECT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("plain lazy mode", first + 1), std::string::npos) << err;
}

TEST(Trace, ReadingAValueWarnsThatTheTraceIsSpecialized) {
  ::testing::internal::CaptureStderr();
  jit::Function f = jit::trace(
      [](const Inputs& in) {
        double s = in[0].sum().item<double>();  // data-dependent: baked into the trace
        return Inputs{in[0] * s};
      },
      {full({2}, 1.0)});
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(f.warnings().size(), 1u);
  EXPECT_NE(f.warnings()[0].find("specialized"), std::string::npos);
  EXPECT_NE(err.find("specialized"), std::string::npos);
  // The trace uses the value seen while tracing (2), as torch's tracer does.
  EXPECT_TRUE(equal(f({full({2}, 5.0)})[0], full({2}, 10.0)));
}

TEST(Trace, ValuesFromInsideATraceCannotEscape) {
  Tensor leaked;
  jit::trace(
      [&](const Inputs& in) {
        leaked = in[0] * 2;
        return Inputs{leaked};
      },
      {ones({2})});
  EXPECT_THROW(leaked.item<float>(), Error);
}

TEST(Trace, PlanReusesSlotsAndTracedStepPeakMemoryIsReported) {
  Model eager_model(3), traced_model(3);
  optim::SGD eager_opt(eager_model.net.parameters(), optim::SGDOptions{0.1, 0.9});
  optim::SGD traced_opt(traced_model.net.parameters(), optim::SGDOptions{0.1, 0.9});
  manual_seed(4);
  Tensor x = randn({256, 6});
  Tensor y = randint(0, 3, {256});
  auto step = [&](optim::SGD& opt, Model& m, const Inputs& in) {
    opt.zero_grad();
    Tensor loss = loss_of(m, in[0], in[1]);
    loss.backward();
    opt.step();
    return Inputs{loss};
  };
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step(traced_opt, traced_model, in); }, {x, y});
  for (int i = 0; i < 3; ++i) {
    Tensor le = step(eager_opt, eager_model, {x, y})[0];
    Tensor lt = f({x, y})[0];
    EXPECT_NEAR(lt.item<float>(), le.item<float>(), 1e-4);
  }
  detail::cpu_reset_peak();
  size_t base = detail::cpu_allocated_bytes();
  {
    LazyGuard eager(false);
    step(eager_opt, eager_model, {x, y});
  }
  size_t eager_peak = detail::cpu_peak_allocated_bytes() - base;
  detail::cpu_reset_peak();
  base = detail::cpu_allocated_bytes();
  f({x, y});
  // The plan's arena of small intermediates was made by the first replay and stays between calls:
  // it counts as part of the replay's peak.
  const int64_t arena = jit::stats().arena_bytes;
  EXPECT_GE(arena, 0);
  size_t traced_peak = detail::cpu_peak_allocated_bytes() - base + static_cast<size_t>(arena);
  std::printf(
      "MLP step peak memory: eager %zu bytes, traced %zu bytes (%.2fx, of which %lld bytes are "
      "the plan's arena)\n",
      eager_peak, traced_peak, double(traced_peak) / double(eager_peak),
      static_cast<long long>(arena));
  EXPECT_GT(eager_peak, 0u);
  EXPECT_GT(traced_peak, 0u);
}

// From the second replay on, an optimizer's write-backs (parameters, Adam's moments) are computed
// in the captured tensors' own buffers: the step holds no parameter-sized transients, the
// parameters keep their memory, and the results still follow eager training.
TEST(Trace, OptimizerWriteBacksAreComputedInPlaceFromTheSecondReplay) {
  Model eager_model(7), traced_model(7);
  optim::Adam eager_opt(eager_model.net.parameters(), optim::AdamOptions{1e-2});
  optim::Adam traced_opt(traced_model.net.parameters(), optim::AdamOptions{1e-2});
  manual_seed(12);
  Tensor x = randn({64, 6});
  Tensor y = randint(0, 3, {64});
  auto step = [](optim::Adam& opt, Model& m, const Inputs& in) {
    opt.zero_grad();
    Tensor loss = loss_of(m, in[0], in[1]);
    loss.backward();
    opt.step();
    return Inputs{loss};
  };
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step(traced_opt, traced_model, in); }, {x, y});
  const auto params = traced_model.net.parameters();
  std::vector<const void*> buffers;
  for (const Tensor& p : params) buffers.push_back(p.impl()->storage->data);
  for (int i = 0; i < 20; ++i) {
    const int64_t before = jit::stats().in_place_writes;
    float traced = f({x, y})[0].item<float>();
    const int64_t writes = jit::stats().in_place_writes - before;
    float eager;
    {
      LazyGuard lazy_off(false);
      eager = step(eager_opt, eager_model, {x, y})[0].item<float>();
    }
    ASSERT_NEAR(traced, eager, 1e-4 * std::max(1.0f, std::abs(eager))) << "step " << i;
    if (i == 0) {
      EXPECT_EQ(writes, 0) << "the first replay compiles; it writes nothing in place";
    } else {
      // Each parameter, its exp_avg and its exp_avg_sq.
      EXPECT_GE(writes, static_cast<int64_t>(3 * params.size())) << "step " << i;
    }
  }
  auto pe = eager_model.net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(allclose(params[i], pe[i], 1e-3, 1e-4)) << "parameter " << i;
  }
  // The first replay swapped fresh buffers in; from the second on the parameters keep theirs.
  buffers.clear();
  for (const Tensor& p : params) buffers.push_back(p.impl()->storage->data);
  f({x, y});
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i].impl()->storage->data, buffers[i]) << "parameter " << i;
}

// A training step's replay holds no more than eager's step: parameter and momentum updates are
// written in place, and the .grad that zero_grad drops is dropped before the replay runs, so the
// old and the new gradients are never held together. Bytes, not time: a deterministic measure.
TEST(Trace, ATrainingStepReplayHoldsLessThanEagersStep) {
  manual_seed(31);
  auto make = [] {
    manual_seed(32);
    return std::make_shared<nn::Linear>(512, 512);
  };
  auto eager_layer = make(), traced_layer = make();
  optim::SGD eager_opt(eager_layer->parameters(), optim::SGDOptions{0.01, 0.9});
  optim::SGD traced_opt(traced_layer->parameters(), optim::SGDOptions{0.01, 0.9});
  Tensor x = randn({16, 512});
  auto step = [](optim::SGD& opt, nn::Linear& layer, const Inputs& in) {
    opt.zero_grad();
    Tensor loss = tanh(layer.forward(in[0])).pow(2).mean();
    loss.backward();
    opt.step();
    return Inputs{loss};
  };
  jit::Function f =
      jit::trace([&](const Inputs& in) { return step(traced_opt, *traced_layer, in); }, {x});
  for (int i = 0; i < 3; ++i) {
    float traced = f({x})[0].item<float>();
    float eager;
    {
      LazyGuard lazy_off(false);
      eager = step(eager_opt, *eager_layer, {x})[0].item<float>();
    }
    ASSERT_NEAR(traced, eager, 1e-5) << "step " << i;
  }
  detail::cpu_reset_peak();
  size_t base = detail::cpu_allocated_bytes();
  {
    LazyGuard lazy_off(false);
    step(eager_opt, *eager_layer, {x});
  }
  const size_t eager_peak = detail::cpu_peak_allocated_bytes() - base;
  detail::cpu_reset_peak();
  base = detail::cpu_allocated_bytes();
  f({x});
  const size_t traced_peak = detail::cpu_peak_allocated_bytes() - base;
  std::printf("Linear 512x512 SGD step peak: eager %zu bytes, traced %zu bytes (%.2fx)\n",
              eager_peak, traced_peak, double(traced_peak) / double(eager_peak));
  // Eager's step frees the old gradient at zero_grad and makes the new one: only its small
  // activations and temporaries count. The replay may hold no parameter-sized buffer more.
  EXPECT_LE(traced_peak, eager_peak);
  // A .grad the user still holds is not disturbed by the replay that replaces it.
  Tensor old_grad = traced_layer->weight.grad();
  const std::vector<float> old_values = old_grad.to_vector<float>();
  f({x});
  EXPECT_EQ(old_grad.to_vector<float>(), old_values);
  EXPECT_FALSE(traced_layer->weight.grad().is_same(old_grad));
}

// A write-back is computed in place only where that is invisible: not when a later step reads the
// old value, not when the step reads the target through another layout, and not when a step that
// may fail still follows it.
TEST(Trace, WriteBacksStayOutOfPlaceWhereTheOldValueIsStillNeeded) {
  auto expect_eager_like = [](auto body, Tensor& target, const Inputs& in, const char* what) {
    Tensor twin = target.clone();
    jit::Function f = jit::trace([&](const Inputs& a) { return body(target, a); }, in);
    for (int call = 0; call < 3; ++call) {
      Inputs got = f(in);
      Inputs want;
      {
        LazyGuard lazy_off(false);
        want = body(twin, in);
      }
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_TRUE(equal(got[k], want[k])) << what << ", call " << call << ", output " << k;
      EXPECT_TRUE(equal(target, twin)) << what << ", call " << call;
    }
  };
  manual_seed(3);
  // The old value is read after the update: 2 * p joins exp's kernel, which runs after add_.
  Tensor p = randn({64, 33});
  expect_eager_like(
      [](Tensor& t, const Inputs& in) {
        Tensor doubled = t * 2;
        t.add_(in[0]);
        return Inputs{exp(doubled) + 1};
      },
      p, {randn({64, 33})}, "old value read later");
  // The kernel reads the target transposed while writing it.
  Tensor q = randn({40, 40});
  expect_eager_like(
      [](Tensor& t, const Inputs& in) {
        t.mul_(in[0]).add_(t.t());
        return Inputs{t.sum()};
      },
      q, {randn({40, 40})}, "read through another layout");
  // The update itself: computed in place from the second call, with the same results.
  Tensor r = randn({1000});
  const int64_t before = jit::stats().in_place_writes;
  expect_eager_like(
      [](Tensor& t, const Inputs& in) {
        t.mul_(0.5).add_(in[0]);
        return Inputs{in[0] * 3};
      },
      r, {randn({1000})}, "plain update");
  EXPECT_EQ(jit::stats().in_place_writes - before, 2) << "calls 2 and 3 write r in place";

  // An index out of range after the update: the call fails and leaves the target as it was.
  Tensor w = randn({50});
  Tensor table = randn({10, 4});
  jit::Function g = jit::trace(
      [&](const Inputs& in) {
        w.mul_(0.5).add_(1.0);
        return Inputs{index_select(table, 0, in[0])};
      },
      {from_vector(std::vector<int64_t>{1, 2})});
  g({from_vector(std::vector<int64_t>{3, 4})});
  g({from_vector(std::vector<int64_t>{3, 4})});
  const Tensor kept = w.clone();
  EXPECT_THROW(g({from_vector(std::vector<int64_t>{3, 40})}), Error);
  EXPECT_TRUE(equal(w, kept)) << "a failed call changed the captured tensor";
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

// A replay makes a fresh result tensor per call; in a steady-state loop its data block comes from
// the allocator's small-block cache, never from glibc (whose memalign path was a sixth of a small
// replay's time).
TEST(Trace, SteadyStateReplayOfASmallFunctionTakesNoBlocksFromTheSystem) {
  auto fn = [](const Inputs& in) {
    Tensor y = tanh(in[0] * 1.5 + 0.25) * 2.0 - 0.5;
    y = sigmoid(y) * in[0] + in[0];
    return Inputs{exp(-y)};
  };
  Tensor x = randn({1});
  eval(x);
  jit::Function f = jit::trace(fn, {x});
  for (int i = 0; i < 3; ++i) f({x});  // the first calls trace and make the plan's state
  const double xd = x.item<double>();
  const double yd = std::tanh(xd * 1.5 + 0.25) * 2.0 - 0.5;
  const double want = std::exp(-(1.0 / (1.0 + std::exp(-yd)) * xd + xd));
  const uint64_t before = detail::cpu_system_allocs();
  for (int i = 0; i < 100; ++i) {
    Tensor y = f({x})[0];
    ASSERT_NEAR(y.item<double>(), want, 1e-6 * std::abs(want)) << i;
  }
  EXPECT_EQ(detail::cpu_system_allocs() - before, 0u);
}

TEST(TraceSave, LoadedFunctionComputesTheSameAndOwnsItsCaptures) {
  manual_seed(11);
  Tensor w = randn({4, 3});
  jit::Function f = jit::trace(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{relu(in[0].matmul(w)).sum({0})};
      },
      {randn({5, 4})});
  std::string path = temp_path("kiln_trace_save.kiln");
  f.save(path);
  jit::Function g = jit::load(path);
  Tensor x = randn({5, 4});
  EXPECT_TRUE(equal(g({x})[0], f({x})[0]));
  w.mul_(2.0);  // the loaded function holds its own copy of w
  EXPECT_FALSE(equal(g({x})[0], f({x})[0]));
  // It is specialized to the saved input types.
  EXPECT_THROW(g({randn({6, 4})}), Error);
}

TEST(TraceSave, LoadedTrainingStepKeepsTraining) {
  Model a(21), b(21);
  optim::SGD opt_a(a.net.parameters(), optim::SGDOptions{0.05, 0.9});
  manual_seed(22);
  Tensor x = randn({16, 6});
  Tensor y = randint(0, 3, {16});
  jit::Function f = jit::trace(
      [&](const std::vector<Tensor>& in) {
        opt_a.zero_grad();
        Tensor loss = loss_of(a, in[0], in[1]);
        loss.backward();
        opt_a.step();
        return std::vector<Tensor>{loss};
      },
      {x, y});
  std::string path = temp_path("kiln_trace_step.kiln");
  f.save(path);
  jit::Function g = jit::load(path);
  for (int i = 0; i < 20; ++i) {
    float la = f({x, y})[0].item<float>();
    float lb = g({x, y})[0].item<float>();
    EXPECT_EQ(la, lb) << "step " << i;
  }
}

TEST(TraceSave, CorruptOrTruncatedFilesRaiseClearErrors) {
  jit::Function f = jit::trace(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 3}; }, {ones({2})});
  std::string path = temp_path("kiln_trace_bad.kiln");
  f.save(path);
  std::string bytes;
  {
    std::FILE* fp = std::fopen(path.c_str(), "rb");
    ASSERT_NE(fp, nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) bytes.append(buf, n);
    std::fclose(fp);
  }
  for (size_t cut : {size_t{0}, size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
    std::FILE* fp = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, cut, fp);
    std::fclose(fp);
    try {
      jit::load(path);
      ADD_FAILURE() << "a file cut at " << cut << " bytes loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kiln_trace_bad.kiln"), std::string::npos) << e.what();
    }
  }
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x5a;
  std::FILE* fp = std::fopen(path.c_str(), "wb");
  std::fwrite(flipped.data(), 1, flipped.size(), fp);
  std::fclose(fp);
  EXPECT_THROW(jit::load(path), Error);
  EXPECT_THROW(jit::load(temp_path("does_not_exist.kiln")), Error);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(VerifyTypes, CatchesANodeWhoseTypeDisagreesWithItsOp) {
  jit::Graph g;
  jit::Value* x = g.add_input(jit::ValueType{kFloat32, {2, 3}});
  jit::Value* y = g.add_input(jit::ValueType{kFloat32, {3}});
  jit::Value* s =
      g.create("add", {x, y}, {int64_t{1}}, {jit::ValueType{kFloat32, {2, 3}}})->output();
  jit::Value* r = g.create("sum", {s}, {std::vector<int64_t>{1}, false, std::monostate{}},
                           {jit::ValueType{kFloat32, {2}}})
                      ->output();
  g.add_output(r);
  EXPECT_NO_THROW(jit::verify_types(g));
  // Wrong dtype, wrong shape, and an op that rejects its inputs are all caught.
  jit::Value* bad = g.create("exp", {x}, {}, {jit::ValueType{kFloat64, {2, 3}}})->output();
  g.add_output(bad);
  EXPECT_THROW(jit::verify_types(g), Error);
  g.set_output(1, r);
  g.destroy(bad->node());
  jit::Value* wide = g.create("neg", {x}, {}, {jit::ValueType{kFloat32, {3, 2}}})->output();
  g.add_output(wide);
  EXPECT_THROW(jit::verify_types(g), Error);
  g.set_output(2, r);
  g.destroy(wide->node());
  jit::Value* z = g.add_input(jit::ValueType{kFloat32, {4}});
  jit::Value* mismatch = g.create("mul", {x, z}, {}, {jit::ValueType{kFloat32, {2, 4}}})->output();
  g.add_output(mismatch);
  EXPECT_THROW(jit::verify_types(g), Error);
}

}  // namespace
}  // namespace kiln
