// Tests of kiln::optim: SGD (momentum, dampening, Nesterov, weight decay), Adam, AdamW (amsgrad),
// RMSprop (momentum, centered) and Adagrad over several steps against float64 loops of torch's
// update rules, through both the fused loop (contiguous float32/float64) and the fallback
// (non-contiguous parameters or gradients), plus parameter groups, state_dict round trips,
// in-place updates, skipped parameters, errors and an end-to-end fit.
#include <cmath>
#include <memory>

#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/serialize.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random_tensor;
using testing::values;

constexpr int kSteps = 5;

// How the parameter and its gradients are laid out: contiguous takes the fused loop, the others
// the fallback made of kiln ops.
enum class Layout { Contiguous, StridedParam, StridedGrad, OtherDTypeGrad };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous:
      return "contiguous (fused)";
    case Layout::StridedParam:
      return "strided parameter (fallback)";
    case Layout::StridedGrad:
      return "strided gradient (fallback)";
    case Layout::OtherDTypeGrad:
      return "float64 gradient (fallback)";
  }
  return "";
}

const Shape kShape{6, 7};

// A parameter holding `init` in the requested layout. A strided parameter is a column-major
// tensor over memory it owns (a leaf, not a view).
Tensor make_param(const std::vector<double>& init, DType dtype, Layout layout) {
  Tensor src = from_vector(init, kShape).to(dtype);
  if (layout != Layout::StridedParam) return src.clone().contiguous();
  Tensor storage = empty({kShape[1], kShape[0]}, dtype);
  Tensor p = from_blob(storage.raw_data_ptr(), kShape, Shape{1, kShape[0]}, dtype,
                       [storage](void*) mutable { storage = Tensor(); });
  p.copy_(src);
  EXPECT_FALSE(p.is_contiguous());
  return p;
}

Tensor make_grad(const std::vector<double>& g, DType dtype, Layout layout) {
  Tensor t = from_vector(g, kShape);
  if (layout == Layout::OtherDTypeGrad) return dtype == kFloat64 ? t.to(kFloat32) : t;
  t = t.to(dtype);
  if (layout == Layout::StridedGrad) {
    Tensor g2 = t.t().contiguous().t();  // same values, column-major
    EXPECT_FALSE(g2.is_contiguous());
    return g2;
  }
  return t;
}

struct Trajectory {
  std::vector<double> init;
  std::vector<std::vector<double>> grads;  // one per step
};

Trajectory random_trajectory(DType dtype) {
  Trajectory t;
  t.init = values(random_tensor(kShape, dtype, -1, 1));
  // float32 values, so that a gradient stored in either dtype holds exactly these.
  for (int s = 0; s < kSteps; ++s)
    t.grads.push_back(values(random_tensor(kShape, kFloat32, -1, 1)));
  return t;
}

// torch.optim.SGD in float64.
std::vector<double> ref_sgd(const Trajectory& tr, const optim::SGDOptions& o) {
  std::vector<double> p = tr.init, buf(p.size());
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < p.size(); ++k) {
      double d = tr.grads[s][k] + o.weight_decay * p[k];
      if (o.momentum != 0) {
        buf[k] = s == 0 ? d : o.momentum * buf[k] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[k] : buf[k];
      }
      p[k] -= o.lr * d;
    }
  }
  return p;
}

// torch.optim.Adam and torch.optim.AdamW (decoupled weight decay) in float64.
template <typename Options>
std::vector<double> ref_adam_family(const Trajectory& tr, const Options& o, bool decoupled) {
  std::vector<double> p = tr.init, m(p.size()), v(p.size()), v_max(p.size());
  for (int s = 1; s <= kSteps; ++s) {
    const double bc1 = 1 - std::pow(o.beta1, s), bc2 = 1 - std::pow(o.beta2, s);
    for (size_t k = 0; k < p.size(); ++k) {
      double g = tr.grads[s - 1][k];
      if (decoupled)
        p[k] *= 1 - o.lr * o.weight_decay;
      else
        g += o.weight_decay * p[k];
      m[k] = o.beta1 * m[k] + (1 - o.beta1) * g;
      v[k] = o.beta2 * v[k] + (1 - o.beta2) * g * g;
      v_max[k] = std::max(v_max[k], v[k]);
      const double second = o.amsgrad ? v_max[k] : v[k];
      p[k] -= o.lr / bc1 * m[k] / (std::sqrt(second) / std::sqrt(bc2) + o.eps);
    }
  }
  return p;
}
std::vector<double> ref_adam(const Trajectory& tr, const optim::AdamOptions& o) {
  return ref_adam_family(tr, o, false);
}
std::vector<double> ref_adamw(const Trajectory& tr, const optim::AdamWOptions& o) {
  return ref_adam_family(tr, o, true);
}

// torch.optim.RMSprop in float64.
std::vector<double> ref_rmsprop(const Trajectory& tr, const optim::RMSpropOptions& o) {
  std::vector<double> p = tr.init, v(p.size()), a(p.size()), buf(p.size());
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < p.size(); ++k) {
      const double g = tr.grads[s][k] + o.weight_decay * p[k];
      v[k] = o.alpha * v[k] + (1 - o.alpha) * g * g;
      double avg = v[k];
      if (o.centered) {
        a[k] = o.alpha * a[k] + (1 - o.alpha) * g;
        avg -= a[k] * a[k];
      }
      avg = std::sqrt(avg) + o.eps;
      if (o.momentum > 0) {
        buf[k] = o.momentum * buf[k] + g / avg;
        p[k] -= o.lr * buf[k];
      } else {
        p[k] -= o.lr * g / avg;
      }
    }
  }
  return p;
}

// torch.optim.Adagrad in float64.
std::vector<double> ref_adagrad(const Trajectory& tr, const optim::AdagradOptions& o) {
  std::vector<double> p = tr.init, sum(p.size(), o.initial_accumulator_value);
  for (int s = 1; s <= kSteps; ++s) {
    const double clr = o.lr / (1 + (s - 1) * o.lr_decay);
    for (size_t k = 0; k < p.size(); ++k) {
      const double g = tr.grads[s - 1][k] + o.weight_decay * p[k];
      sum[k] += g * g;
      p[k] -= clr * g / (std::sqrt(sum[k]) + o.eps);
    }
  }
  return p;
}

double rtol_for(DType dt) {
  return dt == kFloat64 ? 1e-12 : 2e-5;
}
double atol_for(DType dt) {
  return dt == kFloat64 ? 1e-12 : 2e-6;
}

// Runs kSteps of the optimizer made by `make` over one parameter and checks it against `expected`,
// and that the parameter handle, its storage and every alias of it saw the updates.
template <typename Make>
void run_and_check(const Trajectory& tr, DType dtype, Layout layout, Make make,
                   const std::vector<double>& expected) {
  SCOPED_TRACE(::testing::Message() << dtype << ", " << layout_name(layout));
  Tensor p = make_param(tr.init, dtype, layout);
  Tensor alias = p;             // another handle to the same tensor
  Tensor row = p.select(0, 2);  // a view of its storage
  void* data = p.raw_data_ptr();
  const uint64_t version = p.version();
  std::unique_ptr<optim::Optimizer> opt = make(std::vector<Tensor>{p});
  for (int s = 0; s < kSteps; ++s) {
    p.mutable_grad() = make_grad(tr.grads[s], dtype, layout);
    opt->step();
  }
  expect_close(p, expected, kShape, dtype, rtol_for(dtype), atol_for(dtype));
  EXPECT_EQ(p.raw_data_ptr(), data);
  EXPECT_TRUE(opt->parameters()[0].is_same(p));
  EXPECT_TRUE(equal(alias, p));
  std::vector<double> row_expected(expected.begin() + 2 * kShape[1],
                                   expected.begin() + 3 * kShape[1]);
  expect_close(row, row_expected, {kShape[1]}, dtype, rtol_for(dtype), atol_for(dtype));
  EXPECT_GT(p.version(), version);  // in-place writes are visible to autograd's checks
  EXPECT_TRUE(p.is_leaf());
  EXPECT_EQ(p.grad_fn_name(), "");
}

const std::vector<Layout> kLayouts{Layout::Contiguous, Layout::StridedParam, Layout::StridedGrad,
                                   Layout::OtherDTypeGrad};

// Runs optimizer Opt with each named options set, in both float dtypes and every layout, against
// the float64 reference `ref`.
template <typename Opt, typename Options, typename Ref>
void check_against_reference(const std::vector<std::pair<std::string, Options>>& configs, Ref ref) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Trajectory tr = random_trajectory(dtype);
    for (const auto& [name, o] : configs) {
      SCOPED_TRACE(name);
      for (Layout layout : kLayouts)
        run_and_check(
            tr, dtype, layout,
            [o = o](std::vector<Tensor> ps) { return std::make_unique<Opt>(ps, o); }, ref(tr, o));
    }
  }
}

TEST(Optim, SGDMatchesTorchRules) {
  const std::vector<std::pair<std::string, optim::SGDOptions>> configs = {
      {"plain", {0.1}},
      {"momentum", {0.1, 0.9}},
      {"dampening", {0.05, 0.8, 0.3}},
      {"nesterov", {0.1, 0.9, 0.0, 0.0, true}},
      {"weight decay", {0.1, 0.0, 0.0, 0.01}},
      {"everything", {0.02, 0.7, 0.0, 0.05, true}},
      {"momentum, dampening and decay", {0.3, 0.5, 0.1, 0.2}},
  };
  check_against_reference<optim::SGD>(configs, ref_sgd);
}

TEST(Optim, AdamMatchesTorchRules) {
  const std::vector<std::pair<std::string, optim::AdamOptions>> configs = {
      {"defaults", {}},
      {"large lr", {0.1}},
      {"betas and eps", {0.01, 0.5, 0.9, 1e-3}},
      {"weight decay", {0.01, 0.9, 0.999, 1e-8, 0.1}},
      {"amsgrad", {0.05, 0.9, 0.999, 1e-8, 0.1, true}},
  };
  check_against_reference<optim::Adam>(configs, ref_adam);
}

TEST(Optim, AdamWMatchesTorchRules) {
  const std::vector<std::pair<std::string, optim::AdamWOptions>> configs = {
      {"defaults (weight decay 1e-2)", {}},
      {"large lr and decay", {0.1, 0.9, 0.999, 1e-8, 0.5}},
      {"no decay", {0.01, 0.9, 0.999, 1e-8, 0.0}},
      {"betas and eps", {0.01, 0.5, 0.9, 1e-3, 0.1}},
      {"amsgrad", {0.05, 0.8, 0.99, 1e-8, 0.1, true}},
  };
  check_against_reference<optim::AdamW>(configs, ref_adamw);
}

TEST(Optim, RMSpropMatchesTorchRules) {
  const std::vector<std::pair<std::string, optim::RMSpropOptions>> configs = {
      {"defaults", {}},
      {"alpha and eps", {0.01, 0.9, 1e-3}},
      {"weight decay", {0.01, 0.99, 1e-8, 0.1}},
      {"momentum", {0.01, 0.99, 1e-8, 0.0, 0.9}},
      {"centered", {0.01, 0.9, 1e-8, 0.0, 0.0, true}},
      {"everything", {0.005, 0.8, 1e-6, 0.05, 0.5, true}},
  };
  check_against_reference<optim::RMSprop>(configs, ref_rmsprop);
}

TEST(Optim, AdagradMatchesTorchRules) {
  const std::vector<std::pair<std::string, optim::AdagradOptions>> configs = {
      {"defaults", {}},
      {"lr decay", {0.1, 0.5}},
      {"weight decay", {0.1, 0.0, 0.2}},
      {"initial accumulator and eps", {0.1, 0.0, 0.0, 0.5, 1e-3}},
      {"everything", {0.3, 0.1, 0.05, 0.1, 1e-6}},
  };
  check_against_reference<optim::Adagrad>(configs, ref_adagrad);
}

// A parameter that starts on the fallback (a strided gradient) and continues on the fused loop
// keeps one consistent state.
TEST(Optim, SwitchingPathsKeepsState) {
  Trajectory tr = random_trajectory(kFloat32);
  optim::AdamOptions ao{0.05};
  optim::SGDOptions so{0.1, 0.9, 0.0, 0.01, true};
  Tensor pa = make_param(tr.init, kFloat32, Layout::Contiguous);
  Tensor ps = make_param(tr.init, kFloat32, Layout::Contiguous);
  optim::Adam adam({pa}, ao);
  optim::SGD sgd({ps}, so);
  for (int s = 0; s < kSteps; ++s) {
    Layout layout = s % 2 == 0 ? Layout::StridedGrad : Layout::Contiguous;
    pa.mutable_grad() = make_grad(tr.grads[s], kFloat32, layout);
    ps.mutable_grad() = make_grad(tr.grads[s], kFloat32, layout);
    adam.step();
    sgd.step();
  }
  expect_close(pa, ref_adam(tr, ao), kShape, kFloat32, 2e-5, 2e-6);
  expect_close(ps, ref_sgd(tr, so), kShape, kFloat32, 2e-5, 2e-6);
  EXPECT_EQ(adam.step_count(0), kSteps);
  EXPECT_EQ(sgd.momentum_buffer(0).sizes(), kShape);
}

TEST(Optim, ParametersWithoutGradAreSkipped) {
  Tensor a = random_tensor({4}), b = random_tensor({3});
  Tensor b_before = b.clone();
  a.mutable_grad() = ones({4});
  optim::Adam adam({a, b}, {0.1});
  adam.step();
  EXPECT_TRUE(equal(b, b_before));
  EXPECT_EQ(adam.step_count(0), 1);
  EXPECT_EQ(adam.step_count(1), 0);
  EXPECT_FALSE(adam.exp_avg(1).defined());

  optim::SGD sgd({a, b}, {0.1, 0.9});
  sgd.step();
  EXPECT_TRUE(equal(b, b_before));
  EXPECT_TRUE(sgd.momentum_buffer(0).defined());
  EXPECT_FALSE(sgd.momentum_buffer(1).defined());

  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(Optim, InvalidOptionsAndParameters) {
  Tensor p = zeros({2});
  expect_error([&] { optim::SGD({p}, {-0.1}); }, {"SGD", "learning rate", "-0.1"});
  expect_error([&] { optim::SGD({p}, {0.1, 0.0, 0.0, 0.0, true}); }, {"SGD", "Nesterov"});
  expect_error([&] { optim::SGD({p}, {0.1, 0.9, 0.5, 0.0, true}); }, {"SGD", "dampening"});
  expect_error([&] { optim::SGD({p}, {0.1, -0.9}); }, {"SGD", "momentum"});
  expect_error([&] { optim::Adam({p}, {0.1, 1.0}); }, {"Adam", "betas", "1"});
  expect_error([&] { optim::Adam({p}, {0.1, 0.9, 0.999, -1.0}); }, {"Adam", "epsilon"});
  expect_error([&] { optim::Adam({arange(3)}, {}); }, {"parameter 0", "int64[3]"});
  Tensor leaf = ones({2}).requires_grad_();
  Tensor non_leaf = leaf * 2;
  expect_error([&] { optim::SGD({non_leaf}, {0.1}); }, {"non-leaf", "parameter 0", "mul"});
  Tensor q = zeros({2});
  q.mutable_grad() = zeros({3});
  optim::SGD sgd({q}, {0.1});
  expect_error([&] { sgd.step(); }, {"SGD", "float32[3]", "float32[2]"});
}

TEST(Optim, InvalidOptionsOfEveryOptimizerNameTheOptimizerAndTheOption) {
  Tensor p = zeros({2});
  expect_error([&] { optim::AdamW({p}, {-0.1}); }, {"AdamW", "learning rate", "-0.1"});
  expect_error([&] { optim::AdamW({p}, {0.1, 0.9, 1.5}); }, {"AdamW", "betas", "1.5"});
  expect_error([&] { optim::AdamW({p}, {0.1, 0.9, 0.999, -1e-8}); }, {"AdamW", "eps", "-1e-08"});
  expect_error(
      [&] {
        optim::AdamW({p}, {0.1, 0.9, 0.999, 1e-8, -0.5});
      },
      {"AdamW", "weight_decay", "-0.5"});
  expect_error([&] { optim::Adam({p}, {0.1, -0.1}); }, {"Adam", "betas", "-0.1"});
  expect_error([&] { optim::RMSprop({p}, {-1.0}); }, {"RMSprop", "learning rate", "-1"});
  expect_error([&] { optim::RMSprop({p}, {0.1, -0.5}); }, {"RMSprop", "alpha", "-0.5"});
  expect_error([&] { optim::RMSprop({p}, {0.1, 0.9, -1.0}); }, {"RMSprop", "eps"});
  expect_error([&] { optim::RMSprop({p}, {0.1, 0.9, 1e-8, -0.1}); }, {"RMSprop", "weight_decay"});
  expect_error(
      [&] {
        optim::RMSprop({p}, {0.1, 0.9, 1e-8, 0.0, -0.9});
      },
      {"RMSprop", "momentum", "-0.9"});
  expect_error([&] { optim::Adagrad({p}, {-0.01}); }, {"Adagrad", "learning rate", "-0.01"});
  expect_error([&] { optim::Adagrad({p}, {0.1, -0.5}); }, {"Adagrad", "lr_decay", "-0.5"});
  expect_error([&] { optim::Adagrad({p}, {0.1, 0.0, -0.1}); }, {"Adagrad", "weight_decay"});
  expect_error(
      [&] {
        optim::Adagrad({p}, {0.1, 0.0, 0.0, -2.0});
      },
      {"Adagrad", "initial_accumulator_value", "-2"});
  expect_error([&] { optim::Adagrad({p}, {0.1, 0.0, 0.0, 0.0, -1.0}); }, {"Adagrad", "eps"});
  expect_error([&] { optim::Adagrad({arange(3)}); }, {"Adagrad", "parameter 0", "int64[3]"});
  expect_error([&] { optim::RMSprop(std::vector<optim::ParamGroup<optim::RMSpropOptions>>{}); },
               {"RMSprop", "no parameter groups"});
}

using AdamWGroup = optim::ParamGroup<optim::AdamWOptions>;

// Groups with their own options, one of them taking the optimizer's defaults, and a group added
// later: each parameter follows the reference with its group's options.
TEST(Optim, ParameterGroupsUpdateWithTheirOwnOptions) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype);
    Trajectory tr = random_trajectory(dtype);
    const optim::AdamWOptions defaults{0.01}, own{0.1, 0.8, 0.99, 1e-8, 0.2, true}, added{0.05};
    Tensor a = make_param(tr.init, dtype, Layout::Contiguous);
    Tensor b = make_param(tr.init, dtype, Layout::Contiguous);
    Tensor c = make_param(tr.init, dtype, Layout::StridedParam);  // the fallback's path
    optim::AdamW opt({AdamWGroup({a}), AdamWGroup({b}, own)}, defaults);
    opt.add_param_group(AdamWGroup({c}, added));
    ASSERT_EQ(opt.num_param_groups(), 3u);
    ASSERT_EQ(opt.parameters().size(), 3u);
    EXPECT_EQ(opt.param_groups()[0].options.lr, 0.01);
    EXPECT_TRUE(opt.param_groups()[2].params[0].is_same(c));
    for (int s = 0; s < kSteps; ++s) {
      for (Tensor* t : {&a, &b, &c})
        t->mutable_grad() = make_grad(tr.grads[s], dtype, Layout::Contiguous);
      opt.step();
    }
    expect_close(a, ref_adamw(tr, defaults), kShape, dtype, rtol_for(dtype), atol_for(dtype));
    expect_close(b, ref_adamw(tr, own), kShape, dtype, rtol_for(dtype), atol_for(dtype));
    expect_close(c, ref_adamw(tr, added), kShape, dtype, rtol_for(dtype), atol_for(dtype));
    EXPECT_TRUE(opt.max_exp_avg_sq(1).defined());
    EXPECT_FALSE(opt.max_exp_avg_sq(0).defined());
  }
}

// A group's lr changed through param_groups() between steps is the next step's: plain SGD moves
// each parameter by -sum(lr_s * g_s).
TEST(Optim, AGroupsLrChangedBetweenStepsIsUsed) {
  Tensor a = zeros({3}, kFloat64), b = zeros({3}, kFloat64);
  using Group = optim::ParamGroup<optim::SGDOptions>;
  optim::SGD opt({Group({a}, {0.5}), Group({b}, {0.25})}, {0.1});
  const std::vector<double> lrs{0.25, 0.125, 2.0};
  double moved = 0;
  for (double lr : lrs) {
    opt.param_groups()[1].options.lr = lr;
    a.mutable_grad() = ones({3}, kFloat64);
    b.mutable_grad() = ones({3}, kFloat64);
    opt.step();
    moved += lr;
  }
  EXPECT_TRUE(equal(a, full({3}, -1.5, kFloat64))) << a;
  EXPECT_TRUE(equal(b, full({3}, -moved, kFloat64))) << b;
}

// Steps, a state_dict, a fresh optimizer (made with other options) loading it, more steps: the
// resumed run equals the uninterrupted one bit for bit. Two groups; parameter 2 has no gradient
// during the first steps, so it has no state yet (Adagrad's exists from the start).
template <typename Opt, typename Options>
void check_resumes_bit_for_bit(const Options& o0, const Options& o1) {
  Trajectory tr = random_trajectory(kFloat32);
  using Group = optim::ParamGroup<Options>;
  auto make_params = [&] {
    Tensor p = make_param(tr.init, kFloat32, Layout::Contiguous);
    return std::vector<Tensor>{p, p * 0.5, p * -2.0};
  };
  std::vector<Tensor> run = make_params();
  Opt opt({Group({run[0]}, o0), Group({run[1], run[2]}, o1)}, o0);
  auto step = [&](Opt& o, std::vector<Tensor>& ps, int s, bool all) {
    for (size_t i = 0; i < ps.size(); ++i)
      ps[i].mutable_grad() =
          i < 2 || all ? make_grad(tr.grads[s], kFloat32, Layout::Contiguous) * double(i + 1)
                       : Tensor();
    o.step();
  };
  for (int s = 0; s < 3; ++s) step(opt, run, s, s == 2);
  const StateDict saved = opt.state_dict();
  EXPECT_EQ(saved.at("param_groups.1.lr").item<double>(), o1.lr);
  EXPECT_EQ(saved.at("param_groups.1.params").to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(saved.at("param_groups.0.params").to_vector<int64_t>(), (std::vector<int64_t>{0}));

  std::vector<Tensor> resumed;
  for (const Tensor& p : run) resumed.push_back(p.detach().clone());
  // Through a file's bytes, as a checkpoint goes.
  const std::string bytes = save_to_string(saved);
  Opt fresh({Group({resumed[0]}), Group({resumed[1], resumed[2]})}, Options{});
  fresh.load_state_dict(load_from_bytes(bytes.data(), bytes.size(), "checkpoint"));
  EXPECT_EQ(fresh.param_groups()[1].options.lr, o1.lr);
  for (int s = 3; s < kSteps; ++s) {
    step(opt, run, s, true);
    step(fresh, resumed, s, true);
  }
  for (size_t i = 0; i < run.size(); ++i)
    testing::expect_bit_equal(resumed[i], run[i], "parameter " + std::to_string(i));
  const StateDict a = opt.state_dict(), b = fresh.state_dict();
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [key, t] : a) testing::expect_bit_equal(b.at(key), t, key);
}

TEST(Optim, StateDictRoundTripResumesBitForBit) {
  {
    SCOPED_TRACE("SGD");
    check_resumes_bit_for_bit<optim::SGD>(optim::SGDOptions{0.1, 0.9},
                                          optim::SGDOptions{0.05, 0.5, 0.0, 0.01, true});
  }
  {
    SCOPED_TRACE("Adam");
    check_resumes_bit_for_bit<optim::Adam>(optim::AdamOptions{0.1},
                                           optim::AdamOptions{0.05, 0.8, 0.9, 1e-6, 0.1, true});
  }
  {
    SCOPED_TRACE("AdamW");
    check_resumes_bit_for_bit<optim::AdamW>(optim::AdamWOptions{0.1, 0.9, 0.999, 1e-8, 0.0, true},
                                            optim::AdamWOptions{0.05, 0.8, 0.9, 1e-6, 0.3});
  }
  {
    SCOPED_TRACE("RMSprop");
    check_resumes_bit_for_bit<optim::RMSprop>(
        optim::RMSpropOptions{0.01, 0.9, 1e-6, 0.1, 0.5, true},
        optim::RMSpropOptions{0.02, 0.99, 1e-8, 0.0, 0.0, false});
  }
  {
    SCOPED_TRACE("Adagrad");
    check_resumes_bit_for_bit<optim::Adagrad>(optim::AdagradOptions{0.1, 0.1, 0.0, 0.5},
                                              optim::AdagradOptions{0.2, 0.0, 0.1});
  }
}

// A group that fails its checks, a step with a bad option set between steps and a bad
// state_dict each raise naming the optimizer and change nothing.
TEST(Optim, AFailedChangeLeavesTheOptimizerAsItWas) {
  Tensor a = random_tensor({4}), b = random_tensor({3});
  optim::AdamW opt({a}, {0.1});
  expect_error([&] { opt.add_param_group(AdamWGroup({b}, {-1.0})); },
               {"AdamW", "learning rate", "-1"});
  expect_error(
      [&] {
        opt.add_param_group(AdamWGroup({b, a}));
      },
      {"AdamW", "parameter 2", "float32[4]", "another parameter group"});
  EXPECT_EQ(opt.num_param_groups(), 1u);
  EXPECT_EQ(opt.parameters().size(), 1u);
  opt.add_param_group(AdamWGroup({b}));
  EXPECT_EQ(opt.param_groups()[1].options.lr, 0.1);  // the defaults

  a.mutable_grad() = ones({4});
  b.mutable_grad() = ones({3});
  opt.param_groups()[1].options.lr = -0.5;
  const Tensor a0 = a.clone(), b0 = b.clone();
  expect_error([&] { opt.step(); }, {"AdamW", "learning rate", "-0.5"});
  EXPECT_TRUE(equal(a, a0));
  EXPECT_TRUE(equal(b, b0));
  EXPECT_EQ(opt.step_count(0), 0);

  opt.param_groups()[1].options.lr = 0.5;
  opt.step();
  const StateDict good = opt.state_dict();
  const Tensor exp_avg = opt.exp_avg(1).clone();
  auto with = [&](const std::string& key, Tensor value) {
    StateDict d = good;
    d.insert(key, std::move(value));
    return d;
  };
  expect_error(
      [&] { opt.load_state_dict(with("param_groups.1.lr", scalar_tensor(-1.0, kFloat64))); },
      {"AdamW", "learning rate", "-1"});
  expect_error(
      [&] { opt.load_state_dict(with("param_groups.2.lr", scalar_tensor(1.0, kFloat64))); },
      {"AdamW", "param_groups.2.lr", "2 parameter group"});
  expect_error(
      [&] {
        opt.load_state_dict(with("param_groups.1.params", from_vector(std::vector<int64_t>{0})));
      },
      {"AdamW", "param_groups.1.params"});
  expect_error([&] { opt.load_state_dict(with("state.1.exp_avg", zeros({4}))); },
               {"AdamW", "state.1.exp_avg", "float32[4]", "float32[3]"});
  expect_error(
      [&] { opt.load_state_dict(with("param_groups.1.amsgrad", scalar_tensor(true, kBool))); },
      {"AdamW", "parameter 1", "state.1.max_exp_avg_sq"});
  optim::AdamW one_group({a.detach().clone(), b.detach().clone()}, {0.1});
  expect_error([&] { opt.load_state_dict(one_group.state_dict()); },
               {"AdamW", "missing", "param_groups.1.lr"});
  EXPECT_EQ(opt.param_groups()[1].options.lr, 0.5);
  EXPECT_FALSE(opt.param_groups()[1].options.amsgrad);
  EXPECT_TRUE(equal(opt.exp_avg(1), exp_avg));
  EXPECT_EQ(opt.step_count(1), 1);
}

// The update records no history and the parameter stays a leaf that requires grad.
TEST(Optim, StepRecordsNoGraph) {
  Tensor w = random_tensor(kShape).requires_grad_();
  Tensor v = make_param(values(random_tensor(kShape)), kFloat32, Layout::StridedParam);
  v.requires_grad_();  // strided: the fallback path
  optim::Adam adam({w, v}, {0.1});
  (w * v).sum().backward();
  adam.step();
  for (const Tensor& p : {w, v}) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
    EXPECT_EQ(p.grad_fn_name(), "");
  }
}

// End to end: least squares with backward, SGD with Nesterov momentum, a Linear module's
// parameters; the fit recovers the generating weights.
TEST(Optim, FitsALinearModel) {
  manual_seed(12);
  Tensor x = random_tensor({256, 3}, kFloat32, -1, 1);
  Tensor true_w = from_vector(std::vector<float>{1.5f, -2.0f, 0.5f}, Shape{1, 3});
  Tensor y = linear(x, true_w) + 0.25;
  for (bool use_adam : {false, true}) {
    SCOPED_TRACE(use_adam ? "Adam" : "SGD");
    nn::Linear model(3, 1);
    std::unique_ptr<optim::Optimizer> opt;
    if (use_adam)
      opt = std::make_unique<optim::Adam>(model.parameters(), optim::AdamOptions{0.05});
    else
      opt = std::make_unique<optim::SGD>(model.parameters(),
                                         optim::SGDOptions{0.1, 0.9, 0.0, 0.0, true});
    double loss_value = 0;
    for (int step = 0; step < 500; ++step) {
      opt->zero_grad();
      Tensor loss = mse_loss(model(x), y);
      loss.backward();
      opt->step();
      loss_value = loss.item<double>();
    }
    EXPECT_LT(loss_value, 1e-6);
    expect_close(model.weight, {1.5, -2.0, 0.5}, {1, 3}, kFloat32, 1e-3, 1e-3);
    expect_close(model.bias, {0.25}, {1}, kFloat32, 1e-3, 1e-3);
  }
}

}  // namespace
}  // namespace kiln
