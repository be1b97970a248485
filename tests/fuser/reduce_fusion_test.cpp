// Reduction fusion: softmax, log_softmax, layer_norm and cross entropy written from primitives
// become one kernel, sums over leading dims (bias and layer_norm weight gradients) fold into the
// kernel computing their operand (column exits), and fused reductions match eager mode's within
// the tolerances below, edge cases (empty rows, NaN and infinities, integer sums, var's
// correction) and random programs included.
//
// Tolerances. A fused reduction accumulates floats in double as eager mode does, but in another
// order, and a fused kernel's exp may differ from eager's std::exp by one ulp, so a floating
// result that depends on a reduction is compared within
//   |fused - eager| <= rtol * |eager| + atol * scale * sqrt(R)
// where R is the largest number of elements one reduction folds (at least 1) and scale the
// magnitude of the values involved (the largest finite |value| among the inputs and the eager
// result, at least 1):
//   float32: rtol 1e-5, atol 1e-6   (a result is one or two ulps (1.2e-7) off; the rest is room
//                                    for the elementwise ops after the reduction)
//   float64: rtol 1e-12, atol 1e-12 (one ulp is 2.2e-16; summation order moves a sum of R terms
//                                    by about R * 1e-16 * scale)
//   integers and bool: exact (sums of integers are int64 and modular, in any order).
// A NaN matches a NaN and an infinity only the same infinity. The random programs add to the
// tolerance of each element the amount one-ulp perturbations of every reduction and
// transcendental result move it in eager mode (see RandomReductionProgram), which covers the
// amplification of those differences by the ops that follow.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fuser/fuse.h"
#include "jit/ir.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/op_table.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/fuser/random_reduction.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::eager;
using testing::expect_fused_equals_eager;
using testing::Fn;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ------------------------------------------------------------------------------- comparison
struct Tolerance {
  double rtol;
  double atol;
};

// The tolerance (see the top of the file) for a result of `dtype` whose reductions fold at most
// `reduced` elements, with values of magnitude `scale`.
Tolerance tolerance(DType dtype, int64_t reduced, double scale) {
  const double grow = std::sqrt(static_cast<double>(std::max<int64_t>(reduced, 1)));
  scale = std::max(scale, 1.0);
  if (dtype == kFloat64) return {1e-12, 1e-12 * scale * grow};
  return {1e-5, 1e-6 * scale * grow};
}

using testing::values_of;

// The largest finite |value| of a floating tensor (0 for other dtypes and empty tensors).
double max_abs(const Tensor& t) {
  if (!t.defined() || !is_floating_point(t.dtype())) return 0;
  double m = 0;
  for (double v : values_of(t))
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

// got (fused) against want (eager): same sizes and dtype; integers and bools bit-equal; floats
// within `tol` plus, per element, slack[i] when given. NaN matches NaN, an infinity the same one.
void expect_close(const Tensor& got, const Tensor& want, const Tolerance& tol,
                  const std::vector<double>* slack, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  if (!is_floating_point(want.dtype())) {
    testing::expect_bit_equal(got, want, what);
    return;
  }
  const std::vector<double> g = values_of(got), w = values_of(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = g[i], e = w[i];
    if (a == e || (std::isnan(a) && std::isnan(e))) continue;
    const double allowed = tol.atol + tol.rtol * std::fabs(e) + (slack ? (*slack)[i] : 0.0);
    const bool ok = std::isfinite(a) && std::isfinite(e) && std::fabs(a - e) <= allowed;
    if (!ok && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " of " << ::testing::PrintToString(want.sizes())
                    << ": fused " << a << ", eager " << e << " (difference " << std::fabs(a - e)
                    << ", allowed " << allowed << ")";
    }
  }
}

// Runs fn fused and eagerly and compares every output within the tolerance of its dtype.
// `reduced`: the most elements one reduction folds (by default the largest input's size).
void expect_fused_close_to_eager(const Fn& fn, const Inputs& inputs, const std::string& what,
                                 int64_t reduced = -1) {
  Planned p = plan_of(fn, inputs);
  Inputs got = p.plan->run(p.binding.inputs);
  Inputs want = eager(fn, inputs);
  ASSERT_EQ(got.size(), want.size()) << what;
  // The plan computes the outputs' storages: a view's values (sum_to_size's) come in its root's
  // shape.
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k].sizes() != want[k].sizes() && got[k].numel() == want[k].numel())
      got[k] = got[k].view(want[k].sizes());
  double input_scale = 0;
  for (const Tensor& t : inputs) input_scale = std::max(input_scale, max_abs(t));
  if (reduced < 0) {
    for (const Tensor& t : inputs) reduced = std::max(reduced, t.numel());
  }
  for (size_t k = 0; k < got.size(); ++k) {
    const double scale = std::max(input_scale, max_abs(want[k]));
    expect_close(got[k], want[k], tolerance(want[k].dtype(), reduced, scale), nullptr,
                 what + ", output " + std::to_string(k) + "\n" + p.graph->str());
  }
}

// ------------------------------------------------------------------------- plan inspection
// Reduction nodes in the graph, and those the fuser put inside a group.
int reductions_in(const jit::Graph& graph) {
  int n = 0;
  for (const jit::Node* node : graph.nodes()) n += node->op().kind == detail::OpKind::Reduction;
  return n;
}
int fused_reductions_in(const jit::Graph& graph) {
  int n = 0;
  for (const fuser::FusionGroup& g : fuser::find_groups(graph))
    for (const jit::Node* node : g.nodes) n += node->op().kind == detail::OpKind::Reduction;
  return n;
}

// Every node of the plan runs in one compiled kernel, reductions included.
void expect_one_kernel(const Planned& p, const std::string& what) {
  EXPECT_GT(reductions_in(*p.graph), 0) << what;
  EXPECT_EQ(fused_reductions_in(*p.graph), reductions_in(*p.graph))
      << what << ": a reduction was left out of the groups";
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << what;
  EXPECT_EQ(p.plan->num_steps(), 1u) << what << ": every node should run in the kernel\n"
                                     << p.graph->str();
}

// ------------------------------------------------------------------- models from primitives
Tensor softmax_from_primitives(const Tensor& x) {
  Tensor m = x.amax({-1}, true);
  Tensor e = (x - m).exp();
  return e / e.sum({-1}, true);
}

Tensor log_softmax_from_primitives(const Tensor& x) {
  Tensor shifted = x - x.amax({-1}, true);
  return shifted - shifted.exp().sum({-1}, true).log();
}

// w and b of shape [D] (or anything that broadcasts to x's rows).
Tensor layer_norm_from_primitives(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor mean = x.mean({-1}, true);
  Tensor xc = x - mean;
  Tensor var = (xc * xc).mean({-1}, true);
  return xc / sqrt(var + 1e-5) * w + b;
}

// Mean over the batch of logsumexp(x) - x[target], the target given as a one-hot matrix.
Tensor cross_entropy_from_primitives(const Tensor& x, const Tensor& onehot) {
  return (logsumexp(x, {1}) - (x * onehot).sum({1})).mean();
}

// A one-hot [B, C] matrix of random classes, of `dtype` (made eagerly).
Tensor random_onehot(int64_t B, int64_t C, DType dtype) {
  Tensor target = testing::input({B, 1}, kInt64, 0, static_cast<double>(C));
  LazyGuard eager_mode(false);
  return eq(arange(C).reshape({1, C}), target).to(dtype);
}

const Shape kRowShapes[] = {{64, 1000}, {7, 3}};
const DType kFloatTypes[] = {kFloat32, kFloat64};

std::string case_name(const std::string& model, const Shape& shape, DType dtype) {
  return model + " " + ::testing::PrintToString(shape) + " " + dtype_name(dtype);
}

// ---------------------------------------------------------------------------- structural tests
TEST(ReduceFusion, SoftmaxFromPrimitivesIsOneKernel) {
  for (const Shape& shape : kRowShapes) {
    for (DType dtype : kFloatTypes) {
      const std::string what = case_name("softmax", shape, dtype);
      Tensor x = testing::input(shape, dtype, -5, 5);
      Fn fn = [](const Inputs& in) { return Inputs{softmax_from_primitives(in[0])}; };
      expect_one_kernel(plan_of(fn, {x}), what);
      expect_fused_close_to_eager(fn, {x}, what);
    }
  }
}

// The primitives of the graph's fused kernels, one Kernel::str per group.
std::string kernels_of(const Fn& fn, const Inputs& inputs) {
  const Planned p = plan_of(fn, inputs);
  std::string all;
  for (const fuser::FusionGroup& g : fuser::find_groups(*p.graph)) all += g.kernel.str() + "\n";
  return all;
}

// exp of x minus a max that folds x (softmax's, log_softmax's, a cross entropy's) is the
// primitive for arguments at most 0, whose bits are exp's: the kernels give eager mode's exp bits,
// at infinities and NaN too. An exp of anything else stays exp.
TEST(ReduceFusion, ExpOfXMinusItsMaxIsExpNonPos) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kFloatTypes) {
    Tensor x = from_vector(std::vector<double>{-inf, -inf, -inf, inf, 1, -2, std::nan(""), 3, 1e30,
                                               -1e30, 0, -88, -104, -120},
                           {2, 7})
                   .to(dtype);
    Tensor y = testing::input({2, 7}, dtype);
    Fn shifted = [](const Inputs& in) {
      return Inputs{exp(in[0] - in[0].amax({-1}, true)), exp(in[0] - in[0].amax())};
    };
    const std::string kernels = kernels_of(shifted, {x});
    EXPECT_NE(kernels.find("exp_nonpos"), std::string::npos) << kernels;
    EXPECT_EQ(kernels.find(" exp "), std::string::npos) << kernels;
    Inputs eager;
    {
      LazyGuard mode(false);
      eager = shifted({x});
    }
    const Inputs lazy = shifted({x});
    for (size_t k = 0; k < lazy.size(); ++k)
      testing::expect_bit_equal(lazy[k], eager[k], "exp(x - max) " + std::to_string(k));
    // logsumexp's formula subtracts the max itself (an infinite max is the result).
    Fn lse = [](const Inputs& in) {
      // Rows with NaN, of -inf, with +inf, and finite ones (each in a kernel of two nodes: a lone
      // node runs its reference kernel).
      return Inputs{in[0].logsumexp({-1}) * 2.0, in[0].slice(-1, 0, 3, 1).logsumexp({-1}) * 2.0,
                    in[0].slice(-1, 3, 6, 1).logsumexp({-1}) * 2.0};
    };
    const std::string lse_kernels = kernels_of(lse, {x});
    EXPECT_NE(lse_kernels.find("exp_nonpos"), std::string::npos) << lse_kernels;
    EXPECT_EQ(lse_kernels.find(" exp "), std::string::npos) << lse_kernels;
    testing::check_lazy("logsumexp of special values", [&] { return lse({x}); });
    Fn others = [](const Inputs& in) {
      return Inputs{exp(in[0] - in[1].amax({-1}, true)), exp(in[0] - in[0].amin({-1}, true))};
    };
    const std::string plain = kernels_of(others, {x, y});
    EXPECT_EQ(plain.find("exp_nonpos"), std::string::npos) << plain;
    EXPECT_NE(plain.find(" exp "), std::string::npos) << plain;
  }
}

TEST(ReduceFusion, LogSoftmaxFromPrimitivesIsOneKernel) {
  for (const Shape& shape : kRowShapes) {
    for (DType dtype : kFloatTypes) {
      const std::string what = case_name("log_softmax", shape, dtype);
      Tensor x = testing::input(shape, dtype, -5, 5);
      Fn fn = [](const Inputs& in) { return Inputs{log_softmax_from_primitives(in[0])}; };
      expect_one_kernel(plan_of(fn, {x}), what);
      expect_fused_close_to_eager(fn, {x}, what);
    }
  }
}

TEST(ReduceFusion, LayerNormFromPrimitivesIsOneKernel) {
  for (const Shape& shape : kRowShapes) {
    for (DType dtype : kFloatTypes) {
      const std::string what = case_name("layer_norm", shape, dtype);
      Tensor x = testing::input(shape, dtype, -2, 4);
      Tensor w = testing::input({shape[1]}, dtype), b = testing::input({shape[1]}, dtype);
      Fn fn = [](const Inputs& in) {
        return Inputs{layer_norm_from_primitives(in[0], in[1], in[2])};
      };
      expect_one_kernel(plan_of(fn, {x, w, b}), what);
      expect_fused_close_to_eager(fn, {x, w, b}, what);
    }
  }
}

TEST(ReduceFusion, CrossEntropyFromPrimitivesIsOneKernel) {
  for (const Shape& shape : kRowShapes) {
    for (DType dtype : kFloatTypes) {
      const std::string what = case_name("cross entropy", shape, dtype);
      Tensor x = testing::input(shape, dtype, -5, 5);
      Tensor onehot = random_onehot(shape[0], shape[1], dtype);
      Fn fn = [](const Inputs& in) { return Inputs{cross_entropy_from_primitives(in[0], in[1])}; };
      expect_one_kernel(plan_of(fn, {x, onehot}), what);
      expect_fused_close_to_eager(fn, {x, onehot}, what);
    }
  }
}

// The one-hot matrix made inside the kernel from the class indices (no [B, C] input to read).
TEST(ReduceFusion, CrossEntropyWithTheOneHotMadeInTheKernelIsOneKernel) {
  const int64_t B = 32, C = 100;
  Tensor x = testing::input({B, C}, kFloat32, -5, 5);
  Tensor target = testing::input({B, 1}, kInt64, 0, C);
  Tensor classes;
  {
    LazyGuard eager_mode(false);
    classes = arange(C).reshape({1, C});
  }
  Fn fn = [](const Inputs& in) {
    return Inputs{cross_entropy_from_primitives(in[0], eq(in[2], in[1]).to(kFloat32))};
  };
  expect_one_kernel(plan_of(fn, {x, target, classes}), "cross entropy, one-hot in the kernel");
  expect_fused_close_to_eager(fn, {x, target, classes}, "cross entropy, one-hot in the kernel");
}

TEST(ReduceFusion, MinusTheMeanOfAllElementsIsOneKernel) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({9, 13}, dtype, 1, 4);
    Fn fn = [](const Inputs& in) { return Inputs{in[0] - in[0].mean()}; };
    expect_one_kernel(plan_of(fn, {x}), "x - x.mean()");
    expect_fused_close_to_eager(fn, {x}, "x - x.mean()");
  }
}

TEST(ReduceFusion, SumOfAProductIsOneKernel) {
  for (DType dtype : kFloatTypes) {
    Tensor a = testing::input({33, 65}, dtype), b = testing::input({33, 65}, dtype);
    Fn fn = [](const Inputs& in) { return Inputs{(in[0] * in[1]).sum()}; };
    expect_one_kernel(plan_of(fn, {a, b}), "(a * b).sum()");
    expect_fused_close_to_eager(fn, {a, b}, "(a * b).sum()");
  }
}

// A reduction over a leading dim may stay out of the group; the result is right either way.
TEST(ReduceFusion, AReductionOverALeadingDimMatchesEager) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({17, 9}, dtype);
    Fn fn = [](const Inputs& in) {
      Tensor s = (in[0] * 2.0).sum({0});
      return Inputs{exp(s * 0.1) + 1.0, in[0] / s.abs().unsqueeze(0)};
    };
    expect_fused_close_to_eager(fn, {x}, "x.sum({0}) then elementwise");
    Fn keep = [](const Inputs& in) {
      return Inputs{in[0] - in[0].mean({0}, true), in[0].amax({0}) * 3.0};
    };
    expect_fused_close_to_eager(keep, {x}, "x - x.mean({0}, true)");
  }
}

// ---------------------------------------------------------------- column exits (issue 6)
// Sums over the leading dims (a bias gradient g.sum(0), layer_norm's weight gradient) are group
// exits: the kernel computing the values also folds their column sums.

// Column reductions in the plan's kernels.
int column_exits_in(const jit::Graph& graph) {
  int n = 0;
  for (const fuser::FusionGroup& g : fuser::find_groups(graph)) n += g.kernel.num_columns();
  return n;
}

// Every reduction of the plan (planned after the passes, as lazy mode and traces plan) is in its
// one kernel.
void expect_one_kernel_with_columns(const Planned& p, int columns, const std::string& what) {
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << what << "\n" << p.graph->str();
  EXPECT_EQ(fused_reductions_in(*p.graph), reductions_in(*p.graph))
      << what << ": a reduction was left out of the groups\n"
      << p.graph->str();
  EXPECT_EQ(column_exits_in(*p.graph), columns) << what << "\n" << p.graph->str();
  size_t computing = 0;
  for (const jit::Node* n : p.graph->nodes())
    computing += !n->is_input() && !n->is_constant() && n->op().kind != detail::OpKind::View;
  EXPECT_GE(computing, 1u);
}

// The gradients of sum(layer_norm(x, w, b) * weights) by autograd (recorded lazily in lazy mode):
// kiln::layer_norm's own gradient formula, or the one of a layer_norm written from primitives.
Fn layer_norm_backward(bool primitives) {
  return [primitives](const Inputs& in) {
    Tensor x = in[0].detach().requires_grad_(true), w = in[1].detach().requires_grad_(true),
           b = in[2].detach().requires_grad_(true);
    Tensor y =
        primitives ? layer_norm_from_primitives(x, w, b) : layer_norm(x, {x.size(-1)}, w, b, 1e-5);
    return autograd::grad({(y * in[3]).sum()}, {x, w, b});
  };
}

// x of `rows` rows of `width` (made from a transpose when `transposed`).
Tensor rows_input(int64_t rows, int64_t width, DType dtype, bool transposed) {
  if (!transposed) return testing::input({rows, width}, dtype, -2, 4);
  LazyGuard eager_mode(false);
  return testing::input({width, rows}, dtype, -2, 4).t();
}

TEST(ColumnExits, LayerNormBackwardIsOneKernel) {
  std::mt19937_64 rng(6);
  for (bool primitives : {false, true}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t rows = trial == 0 ? 1 : trial == 1 && primitives ? 0 : 1 + rng() % 70;
      const int64_t width = 1 + static_cast<int64_t>(rng() % 300);
      const DType dtype = trial % 2 ? kFloat64 : kFloat32;
      const bool transposed = trial % 3 == 2;
      const std::string what = std::string(primitives ? "primitives" : "kiln::layer_norm") + " [" +
                               std::to_string(rows) + ", " + std::to_string(width) + "] " +
                               dtype_name(dtype) + (transposed ? " transposed" : "");
      Inputs in = {rows_input(rows, width, dtype, transposed), testing::input({width}, dtype),
                   testing::input({width}, dtype), testing::input({rows, width}, dtype)};
      Fn fn = layer_norm_backward(primitives);
      Planned p = plan_of(fn, in, true);
      // The input gradient, and the weight's and bias's column sums, in one kernel.
      expect_one_kernel_with_columns(p, 2, what);
      expect_fused_close_to_eager(fn, in, what, std::max<int64_t>(rows, width));
    }
  }
}

TEST(ColumnExits, SumsOverLeadingDimsOfAComputedValueAreOneKernel) {
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : {Shape{37, 19}, Shape{1, 5}, Shape{4, 6, 7}}) {
      const std::string what = case_name("column sums", shape, dtype);
      Tensor x = testing::input(shape, dtype, -2, 2);
      Fn fn = [](const Inputs& in) {
        Tensor e = (in[0] * 0.5).exp();
        return Inputs{e.sum({0}), e.sum({0}, true), e.mean({0}), e.amax({0}), e.amin({0}, true)};
      };
      expect_one_kernel_with_columns(plan_of(fn, {x}, true), 5, what);
      expect_fused_close_to_eager(fn, {x}, what);
      if (shape.size() == 3) {
        // Over the two leading dims (a bias of a [B, T, C] gradient), or the first only.
        Fn two = [](const Inputs& in) {
          Tensor e = in[0] * in[0] + 1.0;
          return Inputs{e.sum({0, 1}), e.sum({0, 1}, true)};
        };
        expect_one_kernel_with_columns(plan_of(two, {x}, true), 2, what + " over {0, 1}");
        expect_fused_close_to_eager(two, {x}, what + " over {0, 1}");
        Fn first = [](const Inputs& in) { return Inputs{(in[0] * 3.0).tanh().sum({0})}; };
        expect_one_kernel_with_columns(plan_of(first, {x}, true), 1, what + " over {0}");
        expect_fused_close_to_eager(first, {x}, what + " over {0}");
      }
    }
  }
}

// GELU's backward from primitives with the bias gradient: the elementwise gradient is written
// (the GEMMs read it) and summed over the batch by the same kernel.
TEST(ColumnExits, GeluBackwardWithTheBiasGradientIsOneKernel) {
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : {Shape{64, 33}, Shape{1, 7}, Shape{0, 9}}) {
      const std::string what = case_name("gelu backward", shape, dtype);
      Inputs in = {testing::input(shape, dtype), testing::input(shape, dtype)};
      Fn fn = [](const Inputs& in) {
        const Tensor &g = in[0], &z = in[1];
        Tensor t = tanh((z + z * z * z * 0.044715) * 0.7978845608028654);
        Tensor dz = g * (0.5 * (t + 1.0) +
                         z * 0.5 * (1.0 - t * t) * 0.7978845608028654 * (1.0 + z * z * 0.134145));
        return Inputs{dz, dz.sum({0})};
      };
      expect_one_kernel_with_columns(plan_of(fn, in, true), 1, what);
      expect_fused_close_to_eager(fn, in, what);
    }
  }
}

// The bias gradient of an LSTM's gates: the column sum of the cat of the four gate gradients,
// folded piece by piece by the kernel that writes them into the cat's buffer.
TEST(ColumnExits, ASumOfACatOfPiecesJoinsTheCatsKernel) {
  for (DType dtype : kFloatTypes) {
    for (int64_t batch : {5, 1, 0}) {
      const std::string what = case_name("cat then sum(0)", {batch, 6}, dtype);
      Inputs in = {testing::input({batch, 6}, dtype), testing::input({batch, 6}, dtype)};
      Fn fn = [](const Inputs& in) {
        Tensor c = cat({sigmoid(in[0]), in[0] * in[1], tanh(in[1]), in[1] - 1.0}, 1);
        return Inputs{c, c.sum({0}, true)};
      };
      Planned p = plan_of(fn, in, true);
      expect_one_kernel_with_columns(p, 1, what);
      EXPECT_EQ(p.plan->num_join_kernel_steps(), 1u) << what;
      expect_fused_close_to_eager(fn, in, what);
    }
  }
}

TEST(ColumnExits, IntegerSumsAreExactAndNaNAndInfinitiesPropagate) {
  for (DType dtype : {kInt32, kInt64, kBool}) {
    Tensor x = testing::input({23, 11}, dtype, -1000, 1000);
    Fn fn = [](const Inputs& in) {
      Tensor v = in[0].dtype() == kBool ? logical_not(in[0]) : in[0] * 3;
      return Inputs{v.sum({0}), v.sum({0}, true), v.amax({0})};
    };
    expect_one_kernel_with_columns(plan_of(fn, {x}, true), 3, dtype_name(dtype));
    expect_fused_equals_eager(fn, {x}, dtype_name(dtype));
  }
  for (DType dtype : kFloatTypes) {
    Tensor x;
    {
      LazyGuard eager_mode(false);
      std::vector<double> v = testing::input({6, 5}, dtype).to_vector<double>();
      v[0 * 5 + 1] = kNaN;  // column 1: NaN
      v[3 * 5 + 2] = kInf;  // column 2: inf
      v[4 * 5 + 3] = kInf;  // column 3: inf and -inf (NaN sum)
      v[5 * 5 + 3] = -kInf;
      v[2 * 5 + 4] = -kInf;  // column 4: -inf
      x = from_vector(v, Shape{6, 5}).to(dtype);
    }
    Fn fn = [](const Inputs& in) {
      Tensor v = in[0] * 2.0;
      return Inputs{v.sum({0}), v.amax({0}), v.amin({0}), v.mean({0})};
    };
    expect_one_kernel_with_columns(plan_of(fn, {x}, true), 4, dtype_name(dtype));
    expect_fused_close_to_eager(fn, {x}, std::string("specials ") + dtype_name(dtype));
  }
}

TEST(ColumnExits, EmptyDims) {
  for (const Shape& shape : {Shape{0, 7}, Shape{9, 0}, Shape{0, 0}, Shape{3, 0, 4}}) {
    Tensor x = testing::input(shape, kFloat32);
    Fn fn = [](const Inputs& in) {
      Tensor v = in[0] * 2.0 + 1.0;
      return Inputs{v, v.sum({0}), v.mean({0}, true)};
    };
    expect_fused_close_to_eager(fn, {x}, "empty " + ::testing::PrintToString(shape));
  }
}

// Calls cover fixed row ranges and combine in order: the same bits whatever the thread count.
TEST(ColumnExits, ResultsDoNotDependOnTheThreadCount) {
  Inputs in = {testing::input({3000, 67}, kFloat32), testing::input({67}, kFloat32),
               testing::input({67}, kFloat32), testing::input({3000, 67}, kFloat32)};
  Fn fn = layer_norm_backward(true);
  Planned p = plan_of(fn, in, true);
  const int threads = get_num_threads();
  set_num_threads(1);
  Inputs one = p.plan->run(p.binding.inputs);
  set_num_threads(std::max(threads, 3));
  Inputs many = p.plan->run(p.binding.inputs);
  set_num_threads(threads);
  ASSERT_EQ(one.size(), many.size());
  for (size_t k = 0; k < one.size(); ++k)
    testing::expect_bit_equal(many[k], one[k], "output " + std::to_string(k));
}

// A call's rows go through its column sums in bands of several rows (fuser/codegen/llvm/
// emit_rows.cpp), each position still folding the rows in order. Values of magnitudes 2^60 and 1
// make every column's float64 sum depend on that order; one call (a narrow row) folds every row
// from 0 in row order, so the sum must equal that fold bit for bit, for row counts that fill
// whole bands and leave every remainder.
TEST(ColumnExits, ColumnSumsFoldTheRowsInOrder) {
  std::mt19937_64 rng(11);
  const double big = std::ldexp(1.0, 60);
  const double terms[] = {big, -big, 1.0, 3.0, -1.0, 0.5};
  for (int64_t rows : {1, 3, 4, 5, 8, 13, 16, 23, 64}) {
    const int64_t width = 1 + static_cast<int64_t>(rng() % 7);
    std::vector<double> x(static_cast<size_t>(rows * width));
    for (double& v : x) v = terms[rng() % 6];
    Tensor xt = from_vector(x, Shape{rows, width});
    Fn fn = [](const Inputs& in) {
      Tensor v = in[0] * 2.0;
      return Inputs{v, v.sum({0})};
    };
    const std::string what = "column sums of " + std::to_string(rows) + " rows";
    expect_one_kernel_with_columns(plan_of(fn, {xt}, true), 1, what);
    LazyGuard lazy(true);
    const std::vector<double> got = fn({xt})[1].to_vector<double>();
    for (int64_t c = 0; c < width; ++c) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += x[static_cast<size_t>(r * width + c)] * 2.0;
      EXPECT_EQ(got[static_cast<size_t>(c)], sum) << what << ", column " << c;
    }
  }
}

// A transcendental computed while summing a row and read back from a row buffer in the last pass
// (as softmax's exp) has a buffer per row of a band: every row reads back its own.
TEST(ColumnExits, RowBuffersOfABandHoldEachRowsOwnValues) {
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : {Shape{11, 9}, Shape{4, 130}, Shape{3, 5}, Shape{2, 6, 7}}) {
      const std::string what = case_name("normalized tanh then sum(0)", shape, dtype);
      Tensor x = testing::input(shape, dtype, -3, 3);
      Fn fn = [](const Inputs& in) {
        Tensor e = in[0].tanh() + 1.5;
        Tensor s = e / e.sum({-1}, true);
        return Inputs{s, s.dim() == 3 ? s.sum({0, 1}) : s.sum({0})};
      };
      expect_one_kernel_with_columns(plan_of(fn, {x}, true), 1, what);
      expect_fused_close_to_eager(fn, {x}, what);
    }
  }
}

// ---------------------------------------------------------------------------------- edge cases
TEST(ReduceFusionEdges, RowsOfLengthZero) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({3, 0}, dtype);
    Fn fn = [](const Inputs& in) {
      Tensor y = in[0] * 2.0;
      return Inputs{y.sum({-1}),       y.mean({-1}),           y.logsumexp({-1}),
                    y.sum({-1}, true), y - y.mean({-1}, true), (y + 1.0).exp().sum({-1}) * 2.0};
    };
    expect_fused_close_to_eager(fn, {x}, "rows of length 0");
    // Eager semantics: an empty sum is 0, an empty mean NaN, an empty logsumexp -inf.
    Planned p = plan_of(fn, {x});
    Inputs got = p.plan->run(p.binding.inputs);
    ASSERT_EQ(got.size(), 6u);
    testing::expect_close(got[0], {0, 0, 0}, {3}, dtype);
    testing::expect_close(got[1], {kNaN, kNaN, kNaN}, {3}, dtype);
    testing::expect_close(got[2], {-kInf, -kInf, -kInf}, {3}, dtype);
    testing::expect_close(got[5], {0, 0, 0}, {3}, dtype);
  }
}

// all and any fuse (their formulas fold x != 0) as rows, global and column reductions, in every
// dtype, with NaN (true), zeros of both signs (false) and empty folds (all true, any false).
TEST(ReduceFusionEdges, AllAndAnyMatchEager) {
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    for (const Shape& shape : {Shape{6, 5}, Shape{4, 0}, Shape{0, 3}}) {
      Tensor x = floor(testing::input(shape, kFloat64, -1.5, 1.5));
      if (x.numel() > 0) {
        x.narrow(0, 1, 1).fill_(0.0);
        x.narrow(0, 2, 1).fill_(-0.0);
        if (is_floating_point(dtype)) x.narrow(0, 3, 1).narrow(1, 0, 1).fill_(kNaN);
      }
      x = x.to(dtype);
      Fn fn = [](const Inputs& in) {
        Tensor y = in[0] * in[0];  // fuses the folds with an elementwise producer
        return Inputs{all(y, {-1}), any(y, {-1}, true),  all(y), any(y), all(y, {0}),
                      any(y, {0}),  any(eq(y, 0.0), {1})};
      };
      expect_fused_equals_eager(fn, {x},
                                std::string("all/any, ") + dtype_name(dtype) + " " +
                                    std::to_string(shape[0]) + "x" + std::to_string(shape[1]));
      for (const Fn& one :
           std::vector<Fn>{[](const Inputs& in) { return Inputs{all(in[0] * in[0], {-1})}; },
                           [](const Inputs& in) { return Inputs{any(in[0] * in[0])}; },
                           [](const Inputs& in) { return Inputs{all(in[0] * in[0], {0})}; }}) {
        const Planned p = plan_of(one, {x});
        EXPECT_EQ(p.plan->num_kernel_steps(), 1u);
        EXPECT_EQ(p.plan->num_steps(), 1u) << "the fold ran unfused";
      }
    }
  }
}

// prod fuses as row, global and column folds: floats within rounding (the product reassociates,
// as the reference kernel's lanes do) with zeros, NaN and infinities; integers wrap exactly as the
// reference (64-bit products in any order); an empty product is 1.
TEST(ReduceFusionEdges, ProductsMatchEager) {
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    for (const Shape& shape : {Shape{7, 37}, Shape{4, 0}, Shape{0, 3}}) {
      Tensor x = testing::input(shape, kFloat64, 0.5, 1.5);
      if (x.numel() > 0) {
        x.narrow(0, 1, 1).narrow(1, 3, 1).fill_(0.0);
        if (is_floating_point(dtype)) {
          x.narrow(0, 2, 1).narrow(1, 0, 1).fill_(kNaN);
          x.narrow(0, 3, 1).narrow(1, 5, 1).fill_(kInf);
        } else if (dtype != kBool) {
          x = x * 1000003.0;  // products that wrap
        }
      }
      x = x.to(dtype);
      Fn fn = [](const Inputs& in) {
        Tensor y = in[0] * in[0];
        return Inputs{prod(y, {-1}), prod(y, {-1}, true), prod(y), prod(y, {0})};
      };
      const std::string what = std::string("prod, ") + dtype_name(dtype) + " " +
                               std::to_string(shape[0]) + "x" + std::to_string(shape[1]);
      if (is_floating_point(dtype))
        expect_fused_close_to_eager(fn, {x}, what);
      else
        expect_fused_equals_eager(fn, {x}, what);
      const Planned p =
          plan_of([](const Inputs& in) { return Inputs{prod(in[0] * in[0], {-1})}; }, {x});
      EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << what;
      EXPECT_EQ(p.plan->num_steps(), 1u) << "the fold ran unfused: " << what;
    }
  }
}

// prod's folds count as folds (counted on the parsed kernel, not in the formula's text): a prod
// over the leading dims is a column exit of the kernel computing its operand, and a prod over
// every dim folds each call's rows into a global slot (not one row folded serially).
TEST(ReduceFusionEdges, ProductsFuseAsColumnAndGlobalFolds) {
  for (DType dtype : {kFloat32, kInt64}) {
    Tensor x = testing::input({64, 9}, kFloat64, 0.9, 1.1).to(dtype);
    const std::string what = std::string("prod, ") + dtype_name(dtype);
    const Planned column =
        plan_of([](const Inputs& in) { return Inputs{prod(in[0] * in[0], {0})}; }, {x});
    EXPECT_EQ(column.plan->num_kernel_steps(), 1u) << what;
    EXPECT_EQ(column.plan->num_steps(), 1u) << "the column fold ran unfused: " << what;
    EXPECT_EQ(column_exits_in(*column.graph), 1) << what << "\n" << column.graph->str();
    const Planned global =
        plan_of([](const Inputs& in) { return Inputs{prod(in[0] * in[0])}; }, {x});
    EXPECT_EQ(global.plan->num_kernel_steps(), 1u) << what;
    int globals = 0;
    for (const fuser::FusionGroup& g : fuser::find_groups(*global.graph))
      globals += g.kernel.num_globals;
    EXPECT_EQ(globals, 1) << "prod over every dim is not a global fold: " << what << "\n"
                          << global.graph->str();
    Fn fn = [](const Inputs& in) {
      Tensor y = in[0] * in[0];
      return Inputs{prod(y, {0}), prod(y)};
    };
    if (dtype == kFloat32)
      expect_fused_close_to_eager(fn, {x}, what);
    else
      expect_fused_equals_eager(fn, {x}, what);
  }
}

TEST(ReduceFusionEdges, NoRows) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({0, 5}, dtype);
    Fn fn = [](const Inputs& in) {
      Tensor y = in[0] + 1.0;
      return Inputs{y.sum({-1}),
                    y.mean({-1}, true),
                    y.amax({-1}),
                    y.logsumexp({-1}),
                    y.var({-1}, 1, true),
                    softmax_from_primitives(y),
                    y - y.mean({-1}, true),
                    y.sum()};
    };
    expect_fused_close_to_eager(fn, {x}, "no rows");
  }
}

TEST(ReduceFusionEdges, NaNInARowWinsForMaxAndLogSumExp) {
  for (DType dtype : kFloatTypes) {
    // Rows: a NaN in the middle, a NaN after +inf, a NaN first, and no NaN.
    Tensor x = from_vector(std::vector<double>{1, kNaN, 3, 2, kInf, kNaN, kNaN, -1, 0, 5, -2, 4},
                           Shape{4, 3})
                   .to(dtype);
    Fn fn = [](const Inputs& in) {
      Tensor y = in[0] * 1.0;
      return Inputs{y.amax({-1}), y.amin({-1}, true),         y.logsumexp({-1}),     y.max(),
                    y.min(),      softmax_from_primitives(y), y - y.amax({-1}, true)};
    };
    expect_fused_close_to_eager(fn, {x}, "NaN in a row");
    Planned p = plan_of(fn, {x});
    Inputs got = p.plan->run(p.binding.inputs);
    ASSERT_EQ(got.size(), 7u);
    testing::expect_close(got[0], {kNaN, kNaN, kNaN, 5}, {4}, dtype);
    testing::expect_close(
        got[2], {kNaN, kNaN, kNaN, 5.0 + std::log1p(std::exp(-1.0) + std::exp(-7.0))}, {4}, dtype);
    testing::expect_close(got[3], {kNaN}, {}, dtype);
  }
}

TEST(ReduceFusionEdges, InfinitiesInLogSumExpAndSoftmax) {
  for (DType dtype : kFloatTypes) {
    // Rows: a +inf, all -inf, some -inf (masked), +inf and -inf.
    Tensor x = from_vector(std::vector<double>{1, kInf, 2, -kInf, -kInf, -kInf, -kInf, 0, 1, kInf,
                                               -kInf, 3},
                           Shape{4, 3})
                   .to(dtype);
    Fn fn = [](const Inputs& in) {
      Tensor y = in[0] + 0.0;
      return Inputs{y.logsumexp({-1}), y.logsumexp({-1}, true) - y, softmax_from_primitives(y),
                    log_softmax_from_primitives(y), y.logsumexp({0, 1})};
    };
    expect_fused_close_to_eager(fn, {x}, "infinities");
    Planned p = plan_of(fn, {x});
    Inputs got = p.plan->run(p.binding.inputs);
    ASSERT_EQ(got.size(), 5u);
    testing::expect_close(got[0], {kInf, -kInf, 1 + std::log1p(std::exp(-1.0)), kInf}, {4}, dtype);
  }
}

TEST(ReduceFusionEdges, IntegerAndBoolSumsAreExact) {
  // int32 values near the int32 limit: their sum is int64 and must not wrap at 32 bits.
  Tensor i32 = testing::input({6, 1000}, kInt32, 2.0e9, 2.1e9);
  Tensor i64 = testing::input({6, 1000}, kInt64, -1e15, 1e15);
  Tensor small = testing::input({5, 17}, kInt32, -100, 100);
  Tensor flags = testing::input({5, 17}, kBool);
  for (const Tensor& x : {i32, i64, small}) {
    const std::string what = std::string("integer sums, ") + dtype_name(x.dtype());
    Fn fn = [](const Inputs& in) {
      Tensor y = in[0] + 1;
      return Inputs{y.sum({-1}),           (in[0] - 7).sum({-1}, true), y.sum(),
                    y.amax({-1}),          y.amin({-1}, true),          y - y.amax({-1}, true),
                    lt(in[0], 0).sum({-1})};
    };
    expect_fused_equals_eager(fn, {x}, what);
    Inputs want = eager(fn, {x});
    EXPECT_EQ(want[0].dtype(), kInt64) << what;
    EXPECT_EQ(want[6].dtype(), kInt64) << what;
  }
  Fn bools = [](const Inputs& in) {
    Tensor y = logical_not(in[0]);
    return Inputs{y.sum({-1}), y.sum(), y.amax({-1}), logical_and(y, in[0]).sum({-1}, true)};
  };
  expect_fused_equals_eager(bools, {flags}, "bool sums");
  EXPECT_EQ(eager(bools, {flags})[0].dtype(), kInt64);
  // Mixed: an integer sum broadcast back into float arithmetic.
  Tensor x = testing::input({5, 17});
  Fn mixed = [](const Inputs& in) { return Inputs{in[0] / (in[1] + 200).sum({-1}, true)}; };
  expect_fused_close_to_eager(mixed, {x, small}, "float over an integer sum");
}

// Eager accumulates float32 sums in double: 1e8 + 1000 ones - 1e8 is exactly 1000, where float
// accumulation would lose every one.
TEST(ReduceFusionEdges, Float32SumsAccumulateInDouble) {
  std::vector<double> row{1e8};
  for (int i = 0; i < 1000; ++i) row.push_back(1);
  row.push_back(-1e8);
  Tensor x = from_vector(row, Shape{1, static_cast<int64_t>(row.size())}).to(kFloat32);
  Fn fn = [](const Inputs& in) {
    Tensor y = in[0] * 1.0;
    return Inputs{y.sum({-1}), y.sum(), y.mean({-1}, true) * 1002.0};
  };
  Planned p = plan_of(fn, {x});
  Inputs got = p.plan->run(p.binding.inputs);
  ASSERT_EQ(got.size(), 3u);
  testing::expect_close(got[0], {1000}, {1}, kFloat32, 0, 0);
  testing::expect_close(got[1], {1000}, {}, kFloat32, 0, 0);
  testing::expect_close(got[2], {1000}, {1, 1}, kFloat32, 1e-6, 0);
}

TEST(ReduceFusionEdges, VarianceWithTooFewElementsIsNaN) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({4, 1}, dtype), y = testing::input({4, 3}, dtype);
    Fn fn = [](const Inputs& in) {
      Tensor a = in[0] * 2.0, b = in[1] * 2.0;
      return Inputs{a.var({-1}),
                    a.std({-1}, 1, true),
                    a.var({-1}, 0),
                    b.var({-1}, 3),
                    b.var({-1}, 5, true),
                    b.var({-1}, 2),
                    b.std({-1}),
                    b.var(),
                    b - b.std({-1}, 1, true)};
    };
    expect_fused_close_to_eager(fn, {x, y}, "var with correction");
    Planned p = plan_of(fn, {x, y});
    Inputs got = p.plan->run(p.binding.inputs);
    ASSERT_EQ(got.size(), 9u);
    testing::expect_close(got[0], {kNaN, kNaN, kNaN, kNaN}, {4}, dtype);
    testing::expect_close(got[1], {kNaN, kNaN, kNaN, kNaN}, {4, 1}, dtype);
    testing::expect_close(got[2], {0, 0, 0, 0}, {4}, dtype);
    testing::expect_close(got[3], {kNaN, kNaN, kNaN, kNaN}, {4}, dtype);
    testing::expect_close(got[4], {kNaN, kNaN, kNaN, kNaN}, {4, 1}, dtype);
  }
}

TEST(ReduceFusionEdges, NonContiguousInputs) {
  Tensor x0 = testing::input({12, 37}, kFloat32, -4, 4);
  Tensor w = testing::input({1, 37}), b = testing::input({37});
  Tensor w_expanded = testing::input_layouts(w).back().second;  // "expanded": a stride-0 dim
  for (const auto& [layout, x] : testing::input_layouts(x0)) {
    Fn fn = [](const Inputs& in) {
      return Inputs{softmax_from_primitives(in[0]), layer_norm_from_primitives(in[0], in[1], in[2]),
                    in[0].sum({-1}), in[0] - in[0].mean()};
    };
    expect_fused_close_to_eager(fn, {x, w, b}, "layout " + layout);
    expect_fused_close_to_eager(fn, {x, w_expanded, b}, "layout " + layout + ", expanded weight");
    // Weights broadcast to the full [B, D] as a view (stride 0 along the rows).
    Tensor w_full, b_full;
    {
      LazyGuard eager_mode(false);
      w_full = w.expand({12, 37});
      b_full = b.reshape({1, 37}).expand({12, 37});
    }
    expect_fused_close_to_eager(fn, {x, w_full, b_full}, "layout " + layout + ", [B, D] views");
  }
  // A transposed input whose rows are the original columns.
  Tensor t = testing::input({37, 12});
  Tensor xt;
  {
    LazyGuard eager_mode(false);
    xt = t.t();
  }
  Fn fn = [](const Inputs& in) {
    return Inputs{softmax_from_primitives(in[0]), log_softmax_from_primitives(in[0])};
  };
  expect_fused_close_to_eager(fn, {xt}, "transposed view");
}

// A strided input (every other element) read by a rows kernel that stores two element outputs,
// one of them a math call, and folds a column reduction: LLVM's loop vectorizer speculated the
// stride to be 1 and read the input as contiguous (fresh fuzz seed 2490609331, program 337).
TEST(ReduceFusionEdges, StridedRowsWithMathCalls) {
  Tensor base = testing::input({17 * 66});
  Tensor x, x3;
  {
    LazyGuard eager_mode(false);
    x = base.as_strided({17, 33}, {66, 2});
    x3 = base.as_strided({17, 33, 1}, {66, 2, 2});
  }
  for (const Tensor& in : {x, x3}) {
    Fn with_cos = [](const Inputs& v) {
      Tensor s = sigmoid(v[0]);
      return Inputs{s, cos(v[0]), mean(s, {0}, true)};
    };
    Fn with_sin = [](const Inputs& v) {
      Tensor s = sigmoid(v[0]);
      return Inputs{s, sin(s) + cos(v[0]), mean(s, {0}, true)};
    };
    expect_fused_close_to_eager(with_cos, {in}, "cos of a strided input");
    expect_fused_close_to_eager(with_sin, {in}, "sin of a value of a strided input");
  }
}

TEST(ReduceFusionEdges, KeepdimOrNot) {
  Tensor x = testing::input({6, 11});
  for (bool keepdim : {false, true}) {
    Fn fn = [keepdim](const Inputs& in) {
      Tensor y = in[0].exp();
      Tensor s = y.sum({-1}, keepdim), m = in[0].amax({-1}, keepdim);
      Tensor back = keepdim ? s : s.unsqueeze(-1);
      return Inputs{s * 2.0, m + 1.0, y / back, log1p(in[0].mean({-1}, keepdim)),
                    in[0].logsumexp({-1}, keepdim) - m};
    };
    expect_fused_close_to_eager(fn, {x}, keepdim ? "keepdim" : "no keepdim");
  }
}

// Softmax over the last two dims, or over every dim, is one kernel; other reductions of the
// same input (which no elementwise op produces) may run apart, and all match eager mode.
TEST(ReduceFusionEdges, ThreeDimsReducingTheLastTwoOrAll) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({4, 5, 6}, dtype);
    Fn softmax_last_two = [](const Inputs& in) {
      Tensor e = (in[0] - in[0].amax({-2, -1}, true)).exp();
      return Inputs{e / e.sum({-2, -1}, true)};
    };
    expect_one_kernel(plan_of(softmax_last_two, {x}), "softmax over the last two dims");
    Fn softmax_all = [](const Inputs& in) {
      Tensor e = (in[0] - in[0].max()).exp();
      return Inputs{e / e.sum()};
    };
    expect_one_kernel(plan_of(softmax_all, {x}), "softmax over every dim");
    Fn last_two = [](const Inputs& in) {
      const Tensor& v = in[0];
      Tensor m = v.amax({-2, -1}, true);
      Tensor e = (v - m).exp();
      return Inputs{e / e.sum({-2, -1}, true), v.sum({-2, -1}),       v - v.mean({-2, -1}, true),
                    v.var({-2, -1}, 1, true),  v.logsumexp({-2, -1}), (v * 2.0).sum({-2, -1})};
    };
    expect_fused_close_to_eager(last_two, {x}, "reducing the last two dims");
    Fn all = [](const Inputs& in) {
      const Tensor& v = in[0];
      Tensor e = (v - v.max()).exp();
      return Inputs{e / e.sum(), v.sum(), v - v.mean(),  v.amin({0, 1, 2}, true),
                    v.std(),     v.min(), (v * v).mean()};
    };
    expect_fused_close_to_eager(all, {x}, "reducing every dim");
  }
}

TEST(ReduceFusionEdges, AReductionReturnedAndBroadcastBack) {
  for (DType dtype : kFloatTypes) {
    Tensor x = testing::input({8, 29}, dtype);
    Fn fn = [](const Inputs& in) {
      Tensor m = in[0].amax({-1}, true);
      Tensor e = (in[0] - m).exp();
      Tensor s = e.sum({-1}, true);
      return Inputs{m, e, s, e / s};
    };
    expect_fused_close_to_eager(fn, {x}, "reductions returned and broadcast back");
    Fn mean = [](const Inputs& in) {
      Tensor mu = in[0].mean({-1}, true);
      return Inputs{mu, in[0] - mu, in[0].sum()};
    };
    expect_fused_close_to_eager(mean, {x}, "mean returned and broadcast back");
  }
}

// ------------------------------------------------------------- random differential testing
// tests/fuser/random_reduction.h makes the programs.
using testing::RandomReductionProgram;

// The scale of a run: the largest finite |value| made, at least 1.
double scale_of(const Inputs& in, const RandomReductionProgram::Run& run) {
  double s = 1;
  for (const Tensor& t : in) s = std::max(s, max_abs(t));
  for (const Tensor& t : run.values) s = std::max(s, max_abs(t));
  return s;
}

// Per element of each output: the largest change of eager results under one-ulp perturbations
// (over `runs` perturbed runs: every inexact result up, every one down, then in random
// directions), times 8. Integer and bool outputs must not change at all.
std::vector<std::vector<double>> perturbation_slack(const RandomReductionProgram::Program& prog,
                                                    const Inputs& in, const Inputs& want,
                                                    uint64_t seed, int runs,
                                                    const std::string& what) {
  std::vector<std::vector<double>> slack(want.size());
  for (size_t k = 0; k < want.size(); ++k)
    slack[k].assign(static_cast<size_t>(want[k].numel()), 0.0);
  std::mt19937_64 noise(seed);
  for (int r = 0; r < runs; ++r) {
    RandomReductionProgram::Run run;
    run.perturb = &noise;
    run.direction = r == 0 ? 1 : r == 1 ? -1 : 0;
    Inputs moved;
    {
      LazyGuard eager_mode(false);
      moved = prog(in, &run);
    }
    EXPECT_EQ(moved.size(), want.size()) << what;
    if (moved.size() != want.size()) return slack;
    for (size_t k = 0; k < want.size(); ++k) {
      if (!is_floating_point(want[k].dtype())) {
        testing::expect_bit_equal(moved[k], want[k], what + ": an exact output moved");
        continue;
      }
      const std::vector<double> a = values_of(moved[k]), e = values_of(want[k]);
      for (size_t i = 0; i < e.size(); ++i) {
        if (std::isfinite(a[i]) && std::isfinite(e[i]))
          slack[k][i] = std::max(slack[k][i], 8 * std::fabs(a[i] - e[i]));
      }
    }
  }
  return slack;
}

struct RandomStats {
  int run = 0;                   // programs that produced outputs
  int with_kernels = 0;          // plans with at least one kernel step
  int with_fused_reduction = 0;  // plans with a reduction inside a group
  int with_column_exit = 0;      // plans with a reduction over leading dims inside a group
};

// Runs `count` random programs (or as many as fit in `seconds`, when positive). With
// `self_check`, no fused plan is made: a third perturbed eager run is compared with the
// tolerance instead, which checks that the tolerance absorbs one-ulp differences.
RandomStats run_random_reduction_programs(uint64_t seed, int count, double seconds,
                                          bool self_check = false) {
  RandomReductionProgram gen(seed);
  RandomStats stats;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    if (seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      break;
    Inputs in = gen.make_inputs();
    RandomReductionProgram::Program prog = gen.make_program(2 + i % 7);
    RandomReductionProgram::Run run;
    Inputs want;
    {
      LazyGuard eager_mode(false);
      want = prog(in, &run);
    }
    if (want.empty()) continue;  // no op took these inputs
    ++stats.run;
    const double scale = scale_of(in, run);
    const std::string what = "seed " + std::to_string(seed) + ", program " + std::to_string(i);
    std::vector<std::vector<double>> slack =
        perturbation_slack(prog, in, want, seed * 1000003 + static_cast<uint64_t>(i), 3, what);
    if (::testing::Test::HasFailure()) return stats;
    Inputs got;
    std::string graph;
    if (self_check) {
      RandomReductionProgram::Run moved_run;
      std::mt19937_64 noise(seed ^ (static_cast<uint64_t>(i) << 32) ^ 0x5eed);
      moved_run.perturb = &noise;
      LazyGuard eager_mode(false);
      got = prog(in, &moved_run);
    } else {
      Fn fn = [prog](const Inputs& x) { return prog(x, nullptr); };
      Planned p = plan_of(fn, in);
      if (::testing::Test::HasFailure()) return stats;
      stats.with_kernels += p.plan->num_kernel_steps() > 0;
      stats.with_fused_reduction += fused_reductions_in(*p.graph) > 0;
      stats.with_column_exit += column_exits_in(*p.graph) > 0;
      graph = p.graph->str();
      try {
        got = p.plan->run(p.binding.inputs);
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": the fused plan threw: " << e.what() << "\n" << graph;
        return stats;
      }
    }
    EXPECT_EQ(got.size(), want.size()) << what << "\n" << graph;
    if (got.size() != want.size()) return stats;
    // A float64 result may carry a float32 value's rounding: with float32 values about, every
    // floating result gets float32's tolerance.
    bool float32_about = false;
    for (const Tensor& t : in) float32_about |= t.dtype() == kFloat32;
    for (const Tensor& t : run.values) float32_about |= t.dtype() == kFloat32;
    for (size_t k = 0; k < got.size(); ++k) {
      const DType precision = float32_about ? kFloat32 : want[k].dtype();
      expect_close(got[k], want[k], tolerance(precision, run.reduced, scale), &slack[k],
                   what + ", output " + std::to_string(k) + "\n" + graph);
      if (::testing::Test::HasFailure()) return stats;
    }
  }
  return stats;
}

void report(const char* what, uint64_t seed, const RandomStats& s) {
  std::printf(
      "%s (seed %llu): %d programs run, %d with a kernel, %d with a reduction in a kernel, %d with "
      "a column exit\n",
      what, static_cast<unsigned long long>(seed), s.run, s.with_kernels, s.with_fused_reduction,
      s.with_column_exit);
}

// The generator and the tolerance, without the fuser: perturbing every inexact result by an ulp
// stays within the tolerance computed from two other perturbed runs, and exact outputs don't move.
TEST(ReduceFusionRandom, ToleranceAbsorbsOneUlpDifferences) {
  const uint64_t seed = 20261123;
  RandomStats s = run_random_reduction_programs(seed, 1000, 0, true);
  EXPECT_GT(s.run, 800);
  report("perturbed eager runs", seed, s);
}

TEST(ReduceFusionRandom, AThousandProgramsWithAFixedSeedMatchEager) {
  const uint64_t seed = 20261123;
  const int programs = static_cast<int>(testing::scaled(1000, 100));  // KILN_TEST_SCALE
  RandomStats s = run_random_reduction_programs(seed, programs, 0);
  report("random reduction programs", seed, s);
  if (::testing::Test::HasFailure()) return;
  EXPECT_GT(s.run, programs * 8 / 10);
  EXPECT_GT(s.with_kernels, s.run / 4);
  // Most programs reduce a value made by an elementwise op over trailing dims or every dim.
  EXPECT_GT(s.with_fused_reduction, s.run / 5) << "few programs fused a reduction";
  EXPECT_GT(s.with_column_exit, s.run / 20) << "few programs fused a sum over leading dims";
}

// A fresh seed each run (printed, so a failure can be replayed with KILN_FUZZ_SEED), for at most
// KILN_FUZZ_SECONDS (default 10).
TEST(ReduceFusionRandom, FreshSeedTimeBoxed) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("KILN_FUZZ_SEED")) seed = std::strtoull(s, nullptr, 10);
  double seconds = 10;
  if (const char* s = std::getenv("KILN_FUZZ_SECONDS")) seconds = std::atof(s);
  std::printf("fresh seed: %llu (replay with KILN_FUZZ_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  RandomStats s = run_random_reduction_programs(seed, 1 << 30, seconds);
  report("random reduction programs", seed, s);
}

}  // namespace
}  // namespace kiln
