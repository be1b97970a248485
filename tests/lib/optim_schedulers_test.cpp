// Tests of kiln::optim's learning-rate schedulers: each one's lr sequence against the closed form
// torch documents, on every parameter group; OneCycleLR's lr and momentum (cos annealing, torch's
// defaults); bad arguments; and schedules reaching a traced training step (jit::trace), whose next
// replay after scheduler.step() uses the new lr, as the eager loop does. Also the structural
// check that each optimizer's traced update is one fused kernel per parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tests/jit/log_capture.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using Inputs = std::vector<Tensor>;
using testing::expect_error;
using SGDGroup = optim::ParamGroup<optim::SGDOptions>;

const double kPi = std::acos(-1.0);

// An SGD with two groups of base lrs 0.1 and 0.02.
struct TwoGroups {
  Tensor a = zeros({2}), b = zeros({3});
  optim::SGD opt{{SGDGroup({a}, {0.1, 0.9}), SGDGroup({b}, {0.02})}, {0.5}};
};

// Steps `scheduler` `epochs` times; at each epoch (0 is the constructor's) both groups' lr, and
// get_last_lr(), must be closed_form(base lr, epoch).
void expect_schedule(TwoGroups& t, optim::LRScheduler& scheduler, int epochs,
                     const std::function<double(double, int)>& closed_form) {
  const double base[2] = {0.1, 0.02};
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (epoch > 0) scheduler.step();
    EXPECT_EQ(scheduler.last_epoch(), epoch);
    ASSERT_EQ(scheduler.get_last_lr().size(), 2u);
    for (size_t g = 0; g < 2; ++g) {
      const double want = closed_form(base[g], epoch);
      EXPECT_NEAR(t.opt.param_groups()[g].options.lr, want, 1e-15 + 1e-12 * want)
          << "group " << g << ", epoch " << epoch;
      EXPECT_EQ(scheduler.get_last_lr()[g], t.opt.param_groups()[g].options.lr);
    }
  }
}

TEST(LRScheduler, StepLR) {
  TwoGroups t;
  optim::StepLR s(t.opt, 3, 0.5);
  expect_schedule(t, s, 12, [](double lr, int e) { return lr * std::pow(0.5, e / 3); });
}

TEST(LRScheduler, MultiStepLR) {
  TwoGroups t;
  optim::MultiStepLR s(t.opt, {6, 2, 9}, 0.1);  // unsorted, as torch allows
  expect_schedule(t, s, 12, [](double lr, int e) {
    return lr * std::pow(0.1, (e >= 2) + (e >= 6) + (e >= 9));
  });
}

TEST(LRScheduler, ExponentialLR) {
  TwoGroups t;
  optim::ExponentialLR s(t.opt, 0.9);
  expect_schedule(t, s, 10, [](double lr, int e) { return lr * std::pow(0.9, e); });
}

TEST(LRScheduler, CosineAnnealingLR) {
  TwoGroups t;
  optim::CosineAnnealingLR s(t.opt, 8, 0.001);
  expect_schedule(t, s, 17, [](double lr, int e) {
    return 0.001 + (lr - 0.001) * (1 + std::cos(kPi * e / 8)) / 2;
  });
}

TEST(LRScheduler, LinearLR) {
  {
    TwoGroups t;
    optim::LinearLR s(t.opt);  // torch's defaults: 1/3 up to 1 over 5 epochs
    expect_schedule(t, s, 8, [](double lr, int e) {
      return lr * (1.0 / 3 + (1 - 1.0 / 3) * std::min(e, 5) / 5.0);
    });
  }
  TwoGroups t;
  optim::LinearLR s(t.opt, 1.0, 0.25, 4);
  expect_schedule(t, s, 7,
                  [](double lr, int e) { return lr * (1 + (0.25 - 1) * std::min(e, 4) / 4.0); });
}

TEST(LRScheduler, LambdaLR) {
  {
    TwoGroups t;
    optim::LambdaLR s(t.opt, [](int64_t e) { return 1.0 / (1.0 + double(e)); });
    expect_schedule(t, s, 6, [](double lr, int e) { return lr / (1.0 + e); });
  }
  TwoGroups t;
  optim::LambdaLR s(t.opt, {[](int64_t e) { return 0.5 * double(e + 1); },
                            [](int64_t e) { return std::pow(0.5, double(e)); }});
  for (int e = 0; e < 5; ++e) {
    if (e > 0) s.step();
    EXPECT_DOUBLE_EQ(s.get_last_lr()[0], 0.1 * 0.5 * (e + 1));
    EXPECT_DOUBLE_EQ(s.get_last_lr()[1], 0.02 * std::pow(0.5, e));
  }
}

// torch's documented 1cycle with cos annealing: from max_lr / div_factor up to max_lr at step
// pct_start * total - 1, then down to max_lr / div_factor / final_div_factor at step total - 1;
// the momentum from max_momentum down to base_momentum, then back up.
double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2 * (std::cos(kPi * pct) + 1);
}

TEST(LRScheduler, OneCycleLRWithTorchsDefaults) {
  TwoGroups t;
  const int total = 20;
  optim::OneCycleLROptions o;
  o.total_steps = total;
  optim::OneCycleLR s(t.opt, {1.0, 0.2}, o);
  const double max_lr[2] = {1.0, 0.2};
  const double up_end = 0.3 * total - 1;  // 5
  for (int step = 0; step < total; ++step) {
    if (step > 0) s.step();
    const bool up = step <= up_end;
    const double pct = up ? step / up_end : (step - up_end) / (total - 1 - up_end);
    for (size_t g = 0; g < 2; ++g) {
      const double initial = max_lr[g] / 25, minimum = initial / 1e4;
      const double want =
          up ? cos_anneal(initial, max_lr[g], pct) : cos_anneal(max_lr[g], minimum, pct);
      EXPECT_NEAR(t.opt.param_groups()[g].options.lr, want, 1e-14) << "step " << step;
      const double momentum = up ? cos_anneal(0.95, 0.85, pct) : cos_anneal(0.85, 0.95, pct);
      EXPECT_NEAR(t.opt.param_groups()[g].options.momentum, momentum, 1e-14) << "step " << step;
    }
  }
  EXPECT_NEAR(s.get_last_lr()[0], 1.0 / 25 / 1e4, 1e-18);
  s.step();  // step == total_steps is allowed, as in torch
  expect_error([&] { s.step(); }, {"OneCycleLR", "step 21 times", "total steps is 20"});
  EXPECT_EQ(s.last_epoch(), total);
}

// Adam's beta1 is the momentum OneCycleLR cycles; three phases and linear annealing.
TEST(LRScheduler, OneCycleLRThreePhasesLinearOnAdamsBeta1) {
  Tensor p = zeros({2});
  optim::Adam adam({p}, {0.1});
  optim::OneCycleLROptions o;
  o.epochs = 2;
  o.steps_per_epoch = 5;  // 10 steps
  o.anneal_strategy = "linear";
  o.three_phase = true;
  o.pct_start = 0.25;  // phases end at steps 1.5, 3 and 9
  optim::OneCycleLR s(adam, 0.5, o);
  const double initial = 0.5 / 25, minimum = initial / 1e4;
  auto lin = [](double a, double b, double pct) { return a + (b - a) * pct; };
  for (int step = 0; step < 10; ++step) {
    if (step > 0) s.step();
    double lr, beta1;
    if (step <= 1.5) {
      lr = lin(initial, 0.5, step / 1.5);
      beta1 = lin(0.95, 0.85, step / 1.5);
    } else if (step <= 3) {
      lr = lin(0.5, initial, (step - 1.5) / 1.5);
      beta1 = lin(0.85, 0.95, (step - 1.5) / 1.5);
    } else {
      lr = lin(initial, minimum, (step - 3) / 6.0);
      beta1 = 0.95;
    }
    EXPECT_NEAR(adam.options().lr, lr, 1e-15) << step;
    EXPECT_NEAR(adam.options().beta1, beta1, 1e-15) << step;
  }
}

TEST(LRScheduler, BadArgumentsRaiseNamingTheScheduler) {
  TwoGroups t;
  expect_error([&] { optim::StepLR(t.opt, 0); }, {"StepLR", "step_size", "0"});
  expect_error([&] { optim::CosineAnnealingLR(t.opt, -1); }, {"CosineAnnealingLR", "T_max"});
  expect_error([&] { optim::LinearLR(t.opt, 0.0); }, {"LinearLR", "start_factor", "0"});
  expect_error([&] { optim::LinearLR(t.opt, 0.5, 1.5); }, {"LinearLR", "end_factor", "1.5"});
  expect_error([&] { optim::LambdaLR(t.opt, std::vector<optim::LambdaLR::Lambda>(3)); },
               {"LambdaLR", "expected 2", "got 3"});
  optim::OneCycleLROptions o;
  expect_error([&] { optim::OneCycleLR(t.opt, 1.0, o); }, {"OneCycleLR", "total_steps"});
  o.total_steps = 10;
  o.pct_start = 1.5;
  expect_error([&] { optim::OneCycleLR(t.opt, 1.0, o); }, {"OneCycleLR", "pct_start", "1.5"});
  o.pct_start = 0.3;
  o.anneal_strategy = "cosine";
  expect_error([&] { optim::OneCycleLR(t.opt, 1.0, o); }, {"OneCycleLR", "anneal_strategy"});
  o.anneal_strategy = "cos";
  expect_error([&] { optim::OneCycleLR(t.opt, {1.0, 2.0, 3.0}, o); }, {"OneCycleLR", "max_lr"});
  Tensor p = zeros({2});
  optim::Adagrad adagrad({p});
  expect_error([&] { optim::OneCycleLR(adagrad, 1.0, o); },
               {"OneCycleLR", "Adagrad", "cycle_momentum"});
  // The failed constructions set nothing.
  EXPECT_EQ(t.opt.param_groups()[0].options.lr, 0.1);
  EXPECT_EQ(t.opt.param_groups()[0].options.momentum, 0.9);
  // A group added after the scheduler was made.
  optim::StepLR s(t.opt, 2);
  t.opt.add_param_group(SGDGroup({zeros({1})}));
  expect_error([&] { s.step(); }, {"StepLR", "3 parameter groups", "2"});
}

// ---------------------------------------------------------------- traced steps and schedules

// A small regression: loss = mean((tanh(x W^T + b) . v - y)^2), in float64.
struct Model {
  explicit Model(uint64_t seed) {
    manual_seed(seed);
    w = randn({8, 5}, kFloat64).requires_grad_();
    b = randn({8}, kFloat64).requires_grad_();
    v = randn({8}, kFloat64).requires_grad_();
  }
  std::vector<Tensor> params() const { return {w, b, v}; }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor h = tanh(linear(x, w, b));
    Tensor out = (h * v).sum({1});
    return ((out - y) * (out - y)).mean();
  }
  Tensor w, b, v;
};

Inputs train_step(optim::Optimizer& opt, const Model& m, const Inputs& in) {
  opt.zero_grad();
  Tensor loss = m.loss(in[0], in[1]);
  loss.backward();
  opt.step();
  return {loss};
}

// Trains two copies of the model, one through a traced step and one eagerly (lazy mode off), each
// with its optimizer (two groups: w and b, then v with half the lr) and scheduler, stepping the
// scheduler after every training step. The parameters must agree after each step (the traced one
// used the lr the scheduler just set), and the schedule must not make the trace specialize anew.
template <typename Make, typename Schedule>
void expect_traced_training_follows_the_schedule(Make make_optimizer, Schedule make_scheduler) {
  Model eager_model(3), traced_model(3);
  std::unique_ptr<optim::Optimizer> eager_opt = make_optimizer(eager_model);
  std::unique_ptr<optim::Optimizer> traced_opt = make_optimizer(traced_model);
  std::unique_ptr<optim::LRScheduler> eager_sched = make_scheduler(*eager_opt);
  std::unique_ptr<optim::LRScheduler> traced_sched = make_scheduler(*traced_opt);
  manual_seed(4);
  const Tensor x = randn({16, 5}, kFloat64), y = randn({16}, kFloat64);
  jit::Function f = jit::trace(
      [&](const Inputs& in) { return train_step(*traced_opt, traced_model, in); }, {x, y});
  int64_t traces = 0;
  const double initial_lr = traced_opt->group_lr(0);
  for (int step = 0; step < 12; ++step) {
    f({x, y});
    {
      LazyGuard eager(false);
      train_step(*eager_opt, eager_model, {x, y});
    }
    eager_sched->step();
    traced_sched->step();
    const std::vector<Tensor> pe = eager_model.params(), pt = traced_model.params();
    for (size_t i = 0; i < pe.size(); ++i)
      ASSERT_TRUE(allclose(pt[i], pe[i], 1e-9, 1e-12))
          << "step " << step << ", parameter " << i << ": " << pt[i] << " vs " << pe[i];
    if (step == 0) traces = jit::stats().traces;
  }
  EXPECT_EQ(jit::stats().traces, traces) << "a new lr must not trace the step anew";
  EXPECT_EQ(f.num_specializations(), 1u);
  EXPECT_NE(traced_opt->group_lr(0), initial_lr) << "the schedule changed no lr";
}

template <typename Opt, typename Options>
std::function<std::unique_ptr<optim::Optimizer>(const Model&)> two_groups(Options o) {
  return [o](const Model& m) -> std::unique_ptr<optim::Optimizer> {
    Options half = o;
    half.lr /= 2;
    using Group = optim::ParamGroup<Options>;
    return std::make_unique<Opt>(std::vector<Group>{Group({m.w, m.b}), Group({m.v}, half)}, o);
  };
}

TEST(LRScheduler, TracedSgdStepFollowsStepLR) {
  expect_traced_training_follows_the_schedule(
      two_groups<optim::SGD>(optim::SGDOptions{0.05, 0.9}),
      [](optim::Optimizer& o) { return std::make_unique<optim::StepLR>(o, 2, 0.5); });
}

TEST(LRScheduler, TracedAdamWStepFollowsOneCycleLR) {
  optim::OneCycleLROptions oc;
  oc.total_steps = 13;
  expect_traced_training_follows_the_schedule(
      two_groups<optim::AdamW>(optim::AdamWOptions{0.01, 0.9, 0.999, 1e-8, 0.1, true}),
      [oc](optim::Optimizer& o) { return std::make_unique<optim::OneCycleLR>(o, 0.05, oc); });
}

TEST(LRScheduler, TracedRMSpropStepFollowsCosineAnnealingLR) {
  expect_traced_training_follows_the_schedule(
      two_groups<optim::RMSprop>(optim::RMSpropOptions{0.01, 0.9, 1e-8, 0.01, 0.5, true}),
      [](optim::Optimizer& o) { return std::make_unique<optim::CosineAnnealingLR>(o, 8, 1e-4); });
}

TEST(LRScheduler, TracedAdagradStepFollowsExponentialLR) {
  expect_traced_training_follows_the_schedule(
      two_groups<optim::Adagrad>(optim::AdagradOptions{0.1, 0.01, 0.01, 0.1}),
      [](optim::Optimizer& o) { return std::make_unique<optim::ExponentialLR>(o, 0.8); });
}

TEST(LRScheduler, TracedAdamStepFollowsLinearLRAndLambdaLR) {
  expect_traced_training_follows_the_schedule(
      two_groups<optim::Adam>(optim::AdamOptions{0.02}),
      [](optim::Optimizer& o) { return std::make_unique<optim::LinearLR>(o, 0.2, 1.0, 6); });
  expect_traced_training_follows_the_schedule(
      two_groups<optim::Adam>(optim::AdamOptions{0.02}), [](optim::Optimizer& o) {
        return std::make_unique<optim::LambdaLR>(o, [](int64_t e) { return 1.0 / (1.0 + e); });
      });
}

// ---------------------------------------------------------------- one kernel per parameter

// The traced update of each optimizer, over two parameters of different sizes, is one fused
// kernel per parameter (the one-element values, such as bias corrections from the step count,
// are computed once aside), and no unfused step.
void expect_one_kernel_per_parameter(
    const std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>& make) {
  const Tensor a = testing::random_tensor({64, 33}), b = testing::random_tensor({17});
  std::unique_ptr<optim::Optimizer> opt = make({a, b});
  const Inputs grads{testing::random_tensor({64, 33}), testing::random_tensor({17})};
  jit::Function f;
  const std::string log = testing::logged("fuser", [&] {
    f = jit::trace(
        [&](const Inputs& in) {
          Tensor(a).mutable_grad() = in[0];
          Tensor(b).mutable_grad() = in[1];
          opt->step();
          return Inputs{};
        },
        grads);
    f(grads);
  });
  auto groups_over = [&](const std::string& shape) {
    const std::regex group("group at %[0-9]+ [a-z_]+ of [0-9]+ nodes \\([^)]*\\) over \\[" + shape +
                           "\\]");
    return std::distance(std::sregex_iterator(log.begin(), log.end(), group),
                         std::sregex_iterator());
  };
  EXPECT_EQ(groups_over("64, 33"), 1) << log;
  EXPECT_EQ(groups_over("17"), 1) << log;
  const jit::Stats before = jit::stats();
  f(grads);
  const jit::Stats after = jit::stats();
  EXPECT_EQ(after.unfused_steps_run, before.unfused_steps_run) << f.graph_str();
}

template <typename Opt, typename Options>
std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)> make(Options o) {
  return [o](const std::vector<Tensor>& ps) { return std::make_unique<Opt>(ps, o); };
}

TEST(OptimFusion, EachTracedUpdateIsOneKernelPerParameter) {
  const std::vector<std::pair<
      std::string, std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>>>
      cases = {
          {"SGD nesterov", make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.0, 0.01, true})},
          {"Adam", make<optim::Adam>(optim::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0.1})},
          {"AdamW", make<optim::AdamW>(optim::AdamWOptions{})},
          {"AdamW amsgrad",
           make<optim::AdamW>(optim::AdamWOptions{0.01, 0.9, 0.99, 1e-8, 0.1, true})},
          {"RMSprop", make<optim::RMSprop>(optim::RMSpropOptions{})},
          {"RMSprop centered momentum",
           make<optim::RMSprop>(optim::RMSpropOptions{0.01, 0.9, 1e-8, 0.1, 0.9, true})},
          {"Adagrad", make<optim::Adagrad>(optim::AdagradOptions{0.1, 0.01, 0.1, 0.1})},
      };
  for (const auto& [name, maker] : cases) {
    SCOPED_TRACE(name);
    expect_one_kernel_per_parameter(maker);
  }
}

// ---------------------------------------------------------------- on a GPU

// Every optimizer's update on the device (lazy, KILN_LAZY=0, and a traced step) with a schedule
// stepped after each update follows the host's fused loop. Skipped without a usable device.
TEST(OptimCuda, EveryOptimizerWithAScheduleOnTheDeviceFollowsTheHost) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device: run on a GPU machine";
  const std::vector<std::pair<
      std::string, std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>>>
      cases = {
          {"SGD nesterov", make<optim::SGD>(optim::SGDOptions{0.1, 0.9, 0.0, 0.01, true})},
          {"Adam", make<optim::Adam>(optim::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0.1})},
          {"AdamW amsgrad",
           make<optim::AdamW>(optim::AdamWOptions{0.01, 0.9, 0.99, 1e-8, 0.1, true})},
          {"RMSprop centered momentum",
           make<optim::RMSprop>(optim::RMSpropOptions{0.01, 0.9, 1e-8, 0.1, 0.9, true})},
          {"Adagrad", make<optim::Adagrad>(optim::AdagradOptions{0.1, 0.01, 0.1, 0.1})},
      };
  const int steps = 5;
  const Tensor a0 = testing::random_tensor({64, 33}), b0 = testing::random_tensor({17});
  std::vector<Inputs> grads;
  for (int s = 0; s < steps; ++s)
    grads.push_back({testing::random_tensor({64, 33}), testing::random_tensor({17})});
  enum class Mode { Lazy, Eager, Traced };
  for (const auto& [name, maker] : cases) {
    // Returns the parameters after `steps` updates on `device`.
    auto train = [&, &maker = maker](Device device, Mode mode) {
      LazyGuard lazy(mode != Mode::Eager);
      Tensor a = a0.to(device).clone(), b = b0.to(device).clone();
      std::unique_ptr<optim::Optimizer> opt = maker({a, b});
      optim::StepLR schedule(*opt, 2, 0.5);
      auto update = [&](const Inputs& in) {
        a.mutable_grad() = in[0];
        b.mutable_grad() = in[1];
        opt->step();
        return Inputs{};
      };
      jit::Function f;
      for (int s = 0; s < steps; ++s) {
        const Inputs in{grads[s][0].to(device), grads[s][1].to(device)};
        if (mode == Mode::Traced) {
          if (!f.defined()) f = jit::trace(update, in);
          f(in);
        } else {
          update(in);
        }
        schedule.step();
      }
      return Inputs{a.to(kCPU), b.to(kCPU)};
    };
    const Inputs host = train(kCPU, Mode::Lazy);
    for (Mode mode : {Mode::Lazy, Mode::Eager, Mode::Traced}) {
      const Inputs device = train(kCUDA, mode);
      for (size_t i = 0; i < 2; ++i)
        EXPECT_TRUE(allclose(device[i], host[i], 1e-5, 1e-6))
            << name << ", mode " << int(mode) << ", parameter " << i;
    }
  }
}

}  // namespace
}  // namespace kiln
