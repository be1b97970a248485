// Tests of kiln::optim: SGD (momentum, dampening, Nesterov, weight decay) and Adam over several
// steps against float64 loops of torch's update rules, through both the fused loop (contiguous
// float32/float64) and the fallback (non-contiguous parameters or gradients), plus in-place
// updates, skipped parameters, errors and an end-to-end fit.
#include <cmath>
#include <memory>

#include "kiln/nn.h"
#include "kiln/optim.h"
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

// torch.optim.Adam (amsgrad=False) in float64.
std::vector<double> ref_adam(const Trajectory& tr, const optim::AdamOptions& o) {
  std::vector<double> p = tr.init, m(p.size()), v(p.size());
  for (int s = 1; s <= kSteps; ++s) {
    const double bc1 = 1 - std::pow(o.beta1, s), bc2 = 1 - std::pow(o.beta2, s);
    for (size_t k = 0; k < p.size(); ++k) {
      double g = tr.grads[s - 1][k] + o.weight_decay * p[k];
      m[k] = o.beta1 * m[k] + (1 - o.beta1) * g;
      v[k] = o.beta2 * v[k] + (1 - o.beta2) * g * g;
      p[k] -= o.lr / bc1 * m[k] / (std::sqrt(v[k]) / std::sqrt(bc2) + o.eps);
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
  };
  check_against_reference<optim::Adam>(configs, ref_adam);
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
