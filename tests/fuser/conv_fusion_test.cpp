// Fusion around convolutions: batch norm's statistics as one fused reduction, its apply with ReLU
// and the residual add as one elementwise kernel, and the same for their backward, in a ResNet
// basic block (lazy and traced), compared with eager mode and with a float64 reference.
//
// Kernel counts are of fused kernels (plan steps that run a compiled kernel); the convolutions
// are library calls beside them.
//
// Tolerances: fused against eager float32 as tests/fuser/reduce_fusion_test.cpp (reductions fold
// in another order): |fused - eager| <= 1e-5 |eager| + 1e-5 * scale, scale the largest |value| of
// the output (at least 1), the atol wider than the reductions' 1e-6 because a normalized value
// divides by the standard deviation. Against the float64 reference, the float32 results are
// within 2e-4 * scale: the convolutions over C * 9 = 72 products and the normalization's
// division by the standard deviation, each rounded in float32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fuser/fuse.h"
#include "jit/ir.h"
#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/ops/conv.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/fuser/random_reduction.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::ConvAlgo;
using testing::Fn;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

// ---------------------------------------------------------------------------------- the models
// in: x [N, C, H, W], then conv1's weight, bn1's weight and bias, conv2's weight, bn2's: the
// identity-shortcut basic block of ResNet in training mode (batch statistics).
Tensor basic_block(const Inputs& in) {
  auto bn = [](const Tensor& t, const Tensor& w, const Tensor& b) {
    return batch_norm(t, {}, {}, w, b, true, 0.1, 1e-5);
  };
  Tensor h = relu(bn(conv2d(in[0], in[1], {}, {1}, {1}), in[2], in[3]));
  h = bn(conv2d(h, in[4], {}, {1}, {1}), in[5], in[6]);
  return relu(h + in[0]);
}

Inputs block_inputs(int64_t N, int64_t C, int64_t HW, DType dtype) {
  return {testing::input({N, C, HW, HW}, dtype),
          testing::input({C, C, 3, 3}, dtype, -0.3, 0.3),
          testing::input({C}, dtype, 0.5, 1.5),
          testing::input({C}, dtype),
          testing::input({C, C, 3, 3}, dtype, -0.3, 0.3),
          testing::input({C}, dtype, 0.5, 1.5),
          testing::input({C}, dtype)};
}

// The gradients of sum(block(in) * r) for every input, r = in.back() (the upstream gradient).
Inputs block_grads(const Inputs& in) {
  Inputs leaves;
  for (size_t i = 0; i + 1 < in.size(); ++i) leaves.push_back(in[i].detach().requires_grad_(true));
  return autograd::grad({(basic_block(leaves) * in.back()).sum()}, leaves);
}

Inputs with_upstream_grad(Inputs in) {
  in.push_back(testing::input(in[0].sizes(), in[0].dtype()));
  return in;
}

// ------------------------------------------------------------------------------- inspection
int reductions_in(const fuser::FusionGroup& g) {
  int n = 0;
  for (const jit::Node* node : g.nodes) n += node->op().kind == detail::OpKind::Reduction;
  return n;
}

// "rows [8, 4, 6, 6]: to mul sum ..." per group, for failure messages.
std::string groups_str(const jit::Graph& graph) {
  std::string out;
  for (const fuser::FusionGroup& g : fuser::find_groups(graph)) {
    out += (g.rows ? "rows " : "elementwise ") + ::testing::PrintToString(g.shape) + ":";
    for (const jit::Node* n : g.nodes) out += " " + n->op().name;
    out += "\n";
  }
  return out + graph.str();
}

// Every reduction of the graph is inside a group, and the rows groups fold `sums` sums each.
void expect_reductions_fused(const Planned& p, int groups, int sums, const std::string& what) {
  int fused = 0, reducing_groups = 0, all = 0;
  for (const jit::Node* n : p.graph->nodes()) all += n->op().kind == detail::OpKind::Reduction;
  for (const fuser::FusionGroup& g : fuser::find_groups(*p.graph)) {
    const int r = reductions_in(g);
    fused += r;
    if (r == 0) continue;
    ++reducing_groups;
    EXPECT_EQ(r, sums) << what << ": a kernel folds " << r << " sums\n" << groups_str(*p.graph);
  }
  EXPECT_EQ(fused, all) << what << ": a reduction runs outside the kernels\n"
                        << groups_str(*p.graph);
  EXPECT_EQ(reducing_groups, groups) << what << "\n" << groups_str(*p.graph);
}

// ------------------------------------------------------------------------------- comparison
double scale_of(const Tensor& t) {
  double m = 1;
  for (double v : testing::values_of(t)) m = std::max(m, std::fabs(v));
  return m;
}

void expect_near(const Tensor& got, const Tensor& want, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const std::vector<double> g = testing::values_of(got), w = testing::values_of(want);
  const double bound = atol * scale_of(want);
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double allowed = bound + rtol * std::fabs(w[i]);
    if (std::fabs(g[i] - w[i]) <= allowed) continue;
    if (reported++ < 5)
      ADD_FAILURE() << what << ": element " << i << ": " << g[i] << ", expected " << w[i]
                    << " (allowed " << allowed << ")";
  }
}

Inputs to_dtype(const Inputs& in, DType dtype) {
  LazyGuard eager_mode(false);
  Inputs out;
  for (const Tensor& t : in) out.push_back(t.to(dtype));
  return out;
}

// Runs fn planned (fused), eagerly and eagerly in float64, and compares the outputs.
void expect_matches_eager_and_float64(const Fn& fn, const Inputs& in, const std::string& what) {
  Planned p = plan_of(fn, in, true);
  Inputs got = p.plan->run(p.binding.inputs);
  Inputs want = testing::eager(fn, in);
  Inputs ref = testing::eager(fn, to_dtype(in, kFloat64));
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    const std::string out = what + ", output " + std::to_string(k);
    if (got[k].sizes() != want[k].sizes()) got[k] = got[k].view(want[k].sizes());
    expect_near(got[k], want[k], 1e-5, 1e-5, out + " (fused against eager)");
    expect_near(got[k], ref[k], 0, 2e-4, out + " (fused against float64)");
    expect_near(want[k], ref[k], 0, 2e-4, out + " (eager against float64)");
  }
}

// ------------------------------------------------------------------------------------- tests
// batch_norm's mean and variance over (N, H, W): one rows kernel over the channels-first view
// of the convolution's output folding the sum and the sum of squares together (and computing
// invstd), then one elementwise kernel normalizing: 2 kernels.
TEST(ConvFusion, BatchNormStatisticsAreOneKernelReadingTheInputOnce) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Inputs in = {testing::input({4, 8, 6, 5}, dtype), testing::input({8, 8, 3, 3}, dtype),
                 testing::input({8}, dtype, 0.5, 1.5), testing::input({8}, dtype)};
    Fn fn = [](const Inputs& in) {
      return Inputs{
          batch_norm(conv2d(in[0], in[1], {}, {1}, {1}), {}, {}, in[2], in[3], true, 0.1, 1e-5)};
    };
    const std::string what = std::string("conv2d + batch_norm ") + dtype_name(dtype);
    Planned p = plan_of(fn, in, true);
    expect_reductions_fused(p, 1, 2, what);
    EXPECT_EQ(p.plan->num_kernel_steps(), 2u) << what << "\n" << groups_str(*p.graph);
    // The convolution's output is read by the statistics kernel and the normalizing one only.
    for (const jit::Node* n : p.graph->nodes())
      if (n->op().name == "conv2d") {
        EXPECT_EQ(n->output()->uses().size(), 2u) << what << "\n" << groups_str(*p.graph);
      }
    expect_matches_eager_and_float64(fn, in, what);
  }
}

// The running statistics update from the fused kernel's outputs as in eager mode.
TEST(ConvFusion, RunningStatisticsMatchEager) {
  Tensor x = testing::input({5, 3, 4, 4}, kFloat32, 1, 4);
  Tensor w = testing::input({3}), b = testing::input({3});
  const Tensor rm0 = testing::input({3}, kFloat32, 0, 1), rv0 = testing::input({3}, kFloat32, 1, 2);
  auto run = [&](bool lazy) {
    Tensor rm, rv, y;
    {
      LazyGuard eager_mode(false);
      rm = rm0.clone();
      rv = rv0.clone();
    }
    {
      LazyGuard mode(lazy);
      y = batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
      eval(y, rm, rv);
    }
    return Inputs{y, rm, rv};
  };
  Inputs lazy = run(true), eager = run(false);
  for (size_t k = 0; k < lazy.size(); ++k)
    expect_near(lazy[k], eager[k], 1e-5, 1e-5, "output " + std::to_string(k));
}

// The backward of batch_norm: the sums of g and of g * x per channel in one rows kernel, the
// input's gradient in one elementwise kernel, after the forward's statistics kernel: 3 kernels
// (the normalized output itself is not needed).
TEST(ConvFusion, BatchNormBackwardReductionsAreOneKernel) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Inputs in = {testing::input({4, 8, 6, 5}, dtype), testing::input({8}, dtype, 0.5, 1.5),
                 testing::input({8}, dtype), testing::input({4, 8, 6, 5}, dtype)};
    Fn fn = [](const Inputs& in) {
      Inputs leaves = {in[0].detach().requires_grad_(true), in[1].detach().requires_grad_(true),
                       in[2].detach().requires_grad_(true)};
      Tensor y = batch_norm(leaves[0], {}, {}, leaves[1], leaves[2], true, 0.1, 1e-5);
      return autograd::grad({(y * in[3]).sum()}, leaves);
    };
    const std::string what = std::string("batch_norm backward ") + dtype_name(dtype);
    Planned p = plan_of(fn, in, true);
    expect_reductions_fused(p, 2, 2, what);
    EXPECT_EQ(p.plan->num_kernel_steps(), 3u) << what << "\n" << groups_str(*p.graph);
    expect_matches_eager_and_float64(fn, in, what);
  }
}

// A basic block's forward: per batch norm, the statistics kernel and the apply kernel; bn1's
// apply ends in the ReLU, bn2's in the residual add and the last ReLU: 4 kernels.
TEST(ConvFusion, BasicBlockForwardIsFourKernels) {
  Inputs in = block_inputs(4, 8, 6, kFloat32);
  Fn fn = [](const Inputs& in) { return Inputs{basic_block(in)}; };
  Planned p = plan_of(fn, in, true);
  expect_reductions_fused(p, 2, 2, "basic block forward");
  EXPECT_EQ(p.plan->num_kernel_steps(), 4u) << groups_str(*p.graph);
  expect_matches_eager_and_float64(fn, in, "basic block forward");
}

// Forward and backward of a basic block in one graph: the forward's 4 kernels (the output's
// ReLU gradient and the loss's join bn2's apply kernel), and per batch norm the backward's
// reductions kernel and its elementwise input-gradient kernel (4): 8. The gradient of the
// block's inner ReLU runs inside both of bn1's backward kernels, which read it through views
// (push_views moves the ReLU gradient's where through them), so it is never written out.
constexpr size_t kBlockTrainingKernels = 8;

TEST(ConvFusion, BasicBlockForwardAndBackwardIsEightKernels) {
  Inputs in = with_upstream_grad(block_inputs(4, 8, 6, kFloat32));
  Planned p = plan_of(&block_grads, in, true);
  expect_reductions_fused(p, 4, 2, "basic block backward");
  EXPECT_EQ(p.plan->num_kernel_steps(), kBlockTrainingKernels) << groups_str(*p.graph);
  expect_matches_eager_and_float64(&block_grads, in, "basic block backward");
}

// The same step traced (jit::trace): each replay launches the same kernels.
TEST(ConvFusion, TracedBasicBlockStepRunsEightKernels) {
  Inputs in = with_upstream_grad(block_inputs(4, 8, 6, kFloat32));
  jit::Function f = jit::trace(&block_grads, in);
  Inputs want = testing::eager(&block_grads, in);
  for (int call = 0; call < 2; ++call) {
    const int64_t before = jit::stats().fused_kernels_run;
    Inputs got = f(in);
    eval(got);
    EXPECT_EQ(jit::stats().fused_kernels_run - before, static_cast<int64_t>(kBlockTrainingKernels))
        << f.graph_str();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k)
      expect_near(got[k], want[k], 1e-5, 1e-5, "traced, output " + std::to_string(k));
  }
}

// ------------------------------------------------------------------------------------- eval
// in: x, then per convolution its weight and bn's weight, bias, running mean and running var.
Tensor eval_block(const Inputs& in) {
  auto bn = [&](const Tensor& t, size_t p) {
    return batch_norm(t, in[p + 2], in[p + 3], in[p], in[p + 1], false, 0.1, 1e-5);
  };
  Tensor h = relu(bn(conv2d(in[0], in[1], {}, {1}, {1}), 2));
  h = bn(conv2d(h, in[6], {}, {1}, {1}), 7);
  return relu(h + in[0]);
}

Inputs eval_block_inputs(int64_t N, int64_t C, int64_t HW) {
  Inputs in = {testing::input({N, C, HW, HW})};
  for (int conv = 0; conv < 2; ++conv) {
    in.push_back(testing::input({C, C, 3, 3}, kFloat32, -0.3, 0.3));
    in.push_back(testing::input({C}, kFloat32, 0.5, 1.5));
    in.push_back(testing::input({C}));
    in.push_back(testing::input({C}, kFloat32, -1, 1));
    in.push_back(testing::input({C}, kFloat32, 0.5, 2));
  }
  return in;
}

int count_op(const jit::Graph& g, const std::string& name) {
  int n = 0;
  for (const jit::Node* node : g.nodes()) n += node->op().name == name;
  return n;
}

// No fused kernel walks the activations (shape `act`): every pass over them is a convolution's.
void expect_no_kernel_over(const jit::Graph& g, const Shape& act, const std::string& what) {
  for (const fuser::FusionGroup& fg : fuser::find_groups(g))
    EXPECT_NE(fg.shape, act) << what << ": a kernel passes over the activations\n" << groups_str(g);
}

// Runs fn planned with conv_fold and without it, and eagerly in float64; the folded result is
// within 2e-4 * scale of the float64 reference (as the unfolded one), and within 1e-4 * scale of
// the unfolded one (folding rounds the scaled weight once, and the epilogue adds inside oneDNN).
void expect_folded_close(const Fn& fn, const Inputs& in, const std::string& what) {
  Planned folded = plan_of(fn, in, true);
  Inputs got = folded.plan->run(folded.binding.inputs);
  Inputs unfolded;
  {
    const bool was_disabled = jit::pass_disabled("conv_fold");
    jit::set_disabled_passes({"conv_fold"});
    Planned p = plan_of(fn, in, true);
    unfolded = p.plan->run(p.binding.inputs);
    jit::set_disabled_passes(was_disabled ? std::vector<std::string>{"conv_fold"}
                                          : std::vector<std::string>{});
  }
  Inputs ref = testing::eager(fn, to_dtype(in, kFloat64));
  for (size_t k = 0; k < got.size(); ++k) {
    expect_near(got[k], ref[k], 0, 2e-4, what + " (folded against float64)");
    expect_near(unfolded[k], ref[k], 0, 2e-4, what + " (unfolded against float64)");
    expect_near(got[k], unfolded[k], 0, 1e-4, what + " (folded against unfolded)");
  }
}

// Eval batch norm folds into the convolutions' weights and biases, and the ReLUs and the residual
// add become their epilogues: two convolutions and no kernel over the activations. The 4 kernels
// left are per channel, 2 per batch norm: its scale (weight / sqrt(running_var + eps)) and its
// shift (bias - running_mean * scale, which reads the scale); each convolution's scaled weight
// is a lone multiplication (a step of its own, not a compiled kernel).
TEST(ConvFolding, EvalBasicBlockIsTwoConvolutionsWithEpilogues) {
  for (ConvAlgo algo : {ConvAlgo::OneDNN, ConvAlgo::Im2col}) {
    detail::set_conv_algo(algo);
    const std::string what = std::string("eval block, ") + detail::conv_algo_name(algo);
    Inputs in = eval_block_inputs(4, 8, 6);
    Fn fn = [](const Inputs& in) { return Inputs{eval_block(in)}; };
    Planned p = plan_of(fn, in, true);
    EXPECT_EQ(count_op(*p.graph, "conv2d_epilogue"), 2) << groups_str(*p.graph);
    EXPECT_EQ(count_op(*p.graph, "conv2d"), 0) << groups_str(*p.graph);
    expect_no_kernel_over(*p.graph, in[0].sizes(), what);
    EXPECT_EQ(p.plan->num_kernel_steps(), 4u) << groups_str(*p.graph);
    expect_folded_close(fn, in, what);
  }
  detail::set_conv_algo(ConvAlgo::Auto);
}

// A bias and each activation run as the epilogue, with or without a residual.
TEST(ConvFolding, BiasActivationAndResidualAreTheEpilogue) {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> acts = {
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"gelu", [](const Tensor& t) { return gelu(t, "none"); }},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, "tanh"); }},
      {"silu", [](const Tensor& t) { return silu(t); }}};
  for (ConvAlgo algo : {ConvAlgo::OneDNN, ConvAlgo::Im2col}) {
    detail::set_conv_algo(algo);
    for (const auto& [name, act] : acts) {
      for (bool residual : {false, true}) {
        const std::string what =
            name + (residual ? " with residual, " : ", ") + detail::conv_algo_name(algo);
        Inputs in = {testing::input({3, 4, 7, 5}), testing::input({6, 4, 3, 3}, kFloat32, -.3, .3),
                     testing::input({6}), testing::input({3, 6, 5, 3})};
        Fn fn = [act = act, residual](const Inputs& in) {
          Tensor y = conv2d(in[0], in[1], in[2], {1}, {0});
          return Inputs{act(residual ? y + in[3] : y)};
        };
        Planned p = plan_of(fn, in, true);
        EXPECT_EQ(count_op(*p.graph, "conv2d_epilogue"), 1) << what << groups_str(*p.graph);
        EXPECT_EQ(p.plan->num_kernel_steps(), 0u) << what << groups_str(*p.graph);
        expect_folded_close(fn, in, what);
      }
    }
  }
  detail::set_conv_algo(ConvAlgo::Auto);
}

// A convolution whose output is read elsewhere too (training: the batch statistics) keeps it.
TEST(ConvFolding, AConvolutionReadTwiceIsLeftAlone) {
  Inputs in = {testing::input({2, 3, 5, 5}), testing::input({4, 3, 3, 3})};
  Fn fn = [](const Inputs& in) {
    Tensor y = conv2d(in[0], in[1]);
    return Inputs{relu(y), y.sum()};
  };
  Planned p = plan_of(fn, in, true);
  EXPECT_EQ(count_op(*p.graph, "conv2d_epilogue"), 0) << groups_str(*p.graph);
  EXPECT_EQ(count_op(*p.graph, "conv2d"), 1) << groups_str(*p.graph);
}

}  // namespace
}  // namespace kiln
