// The fuser and the LLVM code generator: canonical cases become one kernel, literals and sizes
// never recompile, and random elementwise graphs computed by fused kernels equal eager mode's
// results bit for bit (kernels call the same libm functions, use no fast-math, and compute the
// transcendentals as lib/math/primitives.h does in both modes, its fmadd rounding once on every
// CPU); the transcendentals are held to their documented bounds against long double.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fuser/codegen/llvm/cpu_codegen.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/math/primitives.h"
#include "tests/fuser/fuser_testing.h"
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

// ---------------------------------------------------------------------------- structural tests
TEST(Fuser, SigmoidTimesTanhPlusBroadcastIsOneKernel) {
  Tensor a = testing::input({8, 16}), b = testing::input({16}), c = testing::input({8, 1});
  Fn fn = [](const Inputs& in) { return Inputs{sigmoid(in[0]) * tanh(in[1]) + in[2]}; };
  Planned p = plan_of(fn, {a, b, c});
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
  expect_fused_equals_eager(fn, {a, b, c}, "sigmoid(a) * tanh(b) + c");
}

Tensor gelu_from_primitives(const Tensor& x) {
  return x * 0.5 * (tanh((x + x * x * x * 0.044715) * 0.7978845608028654) + 1.0);
}

TEST(Fuser, GeluFromPrimitivesIsOneKernel) {
  Tensor x = testing::input({33, 65});
  Fn fn = [](const Inputs& in) { return Inputs{gelu_from_primitives(in[0])}; };
  Planned p = plan_of(fn, {x});
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
  expect_fused_equals_eager(fn, {x}, "gelu");
}

TEST(Fuser, LstmCellPointwisePartAfterTheGateGemmIsOneKernel) {
  const int64_t batch = 4, hidden = 6;
  Tensor gates = testing::input({batch, 4 * hidden}), c = testing::input({batch, hidden});
  Fn fn = [](const Inputs& in) {
    std::vector<Tensor> g = in[0].chunk(4, 1);
    Tensor i = sigmoid(g[0]), f = sigmoid(g[1]), cell = tanh(g[2]), o = sigmoid(g[3]);
    Tensor c2 = f * in[1] + i * cell;
    return Inputs{o * tanh(c2), c2};
  };
  Planned p = plan_of(fn, {gates, c});
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  EXPECT_EQ(p.plan->num_steps(), 1u) << "every elementwise node should be in the kernel\n"
                                     << p.graph->str();
  EXPECT_EQ(p.plan->num_nodes(), 9u);
  expect_fused_equals_eager(fn, {gates, c}, "lstm cell");
}

TEST(Fuser, AProducerReadByALaterUnfusedNodeBecomesAGroupOutput) {
  Tensor x = testing::input({5, 7});
  Fn fn = [](const Inputs& in) {
    Tensor e = exp(in[0]) * 2.0;
    Tensor s = e.sum({1}, true);  // not fusible: reads e after the group
    return Inputs{(e + 1.0) / s};
  };
  expect_fused_equals_eager(fn, {x}, "group output read by a reduction");
}

// An optimizer step as a trace records it: each in-place update writes the new value into the
// storage viewed flat and reads it back through as_strided, views that stood between the state
// update and the parameter update. The passes turn them into reshapes (canonicalize) and move the
// write-backs to the end (sink_views), so the whole step is one group.
TEST(Fuser, InPlaceUpdatesInATraceFuseIntoOneGroup) {
  Tensor m0 = testing::input({6, 5}), p0 = testing::input({6, 5}), g = testing::input({6, 5});
  Tensor m = m0.clone(), p = p0.clone(), me = m0.clone(), pe = p0.clone();
  auto step = [](Tensor& state, Tensor& param, const Tensor& grad) {
    state.mul_(0.9).add_(grad * 0.1);
    param.sub_(state * 0.01);
  };
  jit::Function f = jit::trace(
      [&](const Inputs& in) {
        step(m, p, in[0]);
        return Inputs{};
      },
      {g});
  for (int i = 0; i < 3; ++i) {
    f({g});
    LazyGuard eager(false);
    step(me, pe, g);
  }
  testing::expect_bit_equal(m, me, "state");
  testing::expect_bit_equal(p, pe, "parameter");
  const std::string graph = f.graph_str();
  EXPECT_EQ(graph.find("as_strided"), std::string::npos) << graph;
  // After the elementwise nodes come only the write-backs.
  const size_t last_sub = graph.rfind("= sub(");
  const size_t first_reshape = graph.find("= reshape(");
  ASSERT_NE(first_reshape, std::string::npos) << graph;
  EXPECT_LT(last_sub, first_reshape) << graph;
}

// Every elementwise op has a formula: where, clamp, pow, erf, remainder, gelu (both forms),
// softplus and isfinite join one group with the rest.
TEST(Fuser, AChainOfEveryFormulaOpIsOneKernel) {
  Tensor x = testing::input({9, 16}), y = testing::input({9, 16}), z = testing::input({16});
  Fn fn = [](const Inputs& in) {
    const Tensor &x = in[0], &y = in[1], &z = in[2];
    Tensor t = where(gt(x, 0.0), clamp(x, -1.0, 1.0), pow(y, 3.0)) + remainder(x, 1.5) * erf(z);
    t = gelu(t) + gelu(t, "tanh") + softplus(t, 2.0, 5.0) + pow(x, y) + clamp(y, std::nullopt, 2);
    return Inputs{where(isfinite(t), t, 0.0) + pow(2.0, clamp(z, -0.5))};
  };
  Planned p = plan_of(fn, {x, y, z});
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
  expect_fused_equals_eager(fn, {x, y, z}, "every formula op");
}

// Operands of different dtypes are converted inside the kernel, as the ops' entry points convert
// them: int32 * float32 + float64, and comparisons in the promoted type.
TEST(Fuser, AMixedDtypeChainIsOneKernel) {
  Tensor a = testing::input({6, 7}, kInt32), b = testing::input({6, 7}),
         c = testing::input({7}, kFloat64), d = testing::input({6, 1}, kInt64);
  Fn fn = [](const Inputs& in) {
    const Tensor &a = in[0], &b = in[1], &c = in[2], &d = in[3];
    Tensor t = a * b + c;                        // float64
    Tensor m = logical_and(lt(b, c), ge(a, d));  // float32 < float64, int32 >= int64
    // Integer remainder and pow never fuse (their entry points check the values): floating ones.
    Tensor w = where(m, a, d * 2) + remainder(d, 3.0) * pow(a, 2.0);  // float32
    Tensor out = t - w + exp(a) * sqrt(d);
    return Inputs{out, where(logical_or(m, b), out, 0.0)};
  };
  Planned p = plan_of(fn, {a, b, c, d});
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
  expect_fused_equals_eager(fn, {a, b, c, d}, "mixed dtypes");
}

// The bitwise ops fuse with comparisons and where: the integer mask arithmetic of libtorch code
// (flags, bit tests) is one kernel.
TEST(Fuser, BitwiseOpsThenACompareAndAWhereAreOneKernel) {
  Tensor a = testing::input({6, 7}, kInt32, -1000, 1000), b = testing::input({7}, kInt32, 0, 255),
         c = testing::input({6, 1}, kInt32, -1000, 1000), d = testing::input({6, 7}, kInt32, -9, 9);
  Fn fn = [](const Inputs& in) {
    const Tensor m = (in[0] & in[1]) | (in[2] ^ in[3]);
    return Inputs{where(gt(m, 7), m, ~in[0])};
  };
  Planned p = plan_of(fn, {a, b, c, d});
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
  expect_fused_equals_eager(fn, {a, b, c, d}, "(a & b) | (c ^ d), gt, where");
}

// Fused bitwise ops equal the eager kernels in bool, int32 and int64, with mixed dtypes, scalar
// operands, broadcasting and every input layout (transposed, strided, expanded).
TEST(Fuser, BitwiseOpsMatchEagerInEveryIntegerDtypeAndLayout) {
  Fn fn = [](const Inputs& in) {
    const Tensor &a = in[0], &b = in[1], &c = in[2];
    const Tensor m = ((a & b) ^ (~a | c)) | (b ^ 1);
    return Inputs{m, (m & c) ^ (a & 0x55), where(ne(m & b, 0), a, c)};
  };
  for (DType t : {kBool, kInt32, kInt64}) {
    const double lo = t == kBool ? 0 : -100000, hi = t == kBool ? 1 : 100000;
    const Tensor a = testing::input({4, 1, 5}, t, lo, hi), b = testing::input({3, 5}, t, lo, hi);
    for (DType tc : {kBool, kInt32, kInt64}) {
      const Tensor c = testing::input({4, 3, 1}, tc, tc == kBool ? 0 : lo, tc == kBool ? 1 : hi);
      for (const auto& [la, xa] : testing::input_layouts(a))
        for (const auto& [lb, xb] : testing::input_layouts(b)) {
          const std::string what = std::string(dtype_name(t)) + " and " + dtype_name(tc) + ", " +
                                   la + " a, " + lb + " b";
          expect_fused_equals_eager(fn, {xa, xb, c}, what);
          const Planned p = plan_of(fn, {xa, xb, c});
          bool fused = false;
          for (const fuser::FusionGroup& g : fuser::find_groups(*p.graph))
            for (const jit::Node* n : g.nodes) fused |= n->kind() == "bitwise_and";
          EXPECT_TRUE(fused) << what << ": no bitwise_and was fused\n" << p.graph->str();
        }
    }
  }
}

// A lone node with an operand of another dtype runs through its entry point (the executor's direct
// steps take operands of the compute type only), and still matches.
TEST(Fuser, ALoneMixedDtypeNodeIsNoKernelAndMatches) {
  Tensor a = testing::input({5, 3}, kInt32), b = testing::input({5, 3});
  Fn fn = [](const Inputs& in) { return Inputs{in[0] * in[1]}; };
  Planned p = plan_of(fn, {a, b});
  EXPECT_EQ(p.plan->num_kernel_steps(), 0u) << p.graph->str();
  expect_fused_equals_eager(fn, {a, b}, "int32 * float32 alone");
}

// Values where the new ops' branches meet: NaN, infinities, signed zeros, negative numbers, halves,
// integral exponents around 64, large and tiny magnitudes, over shapes with sizes 0 and 1 and
// non-contiguous layouts, in every dtype.
TEST(Fuser, NewOpsMatchEagerOnSpecialValues) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> special = {
      nan,   inf,  -inf, 0.0,    -0.0,  0.5,   -0.5, 1.0,    -1.0,      2.0,   -3.0, 7.5,
      -7.5,  64.0, 65.0, -64.0,  1e-30, 1e30,  3.25, -2.75,  4.5,       -4.5,  40.0, 0.1,
      -20.0, 25.0, 1.5,  1e-310, 0.3,   -0.75, 1e22, 709.78, 1048576.5, -1e300};
  const std::vector<Fn> fns = {
      [](const Inputs& in) {
        return Inputs{erf(in[0]) + 0, gelu(in[0]) + 0, gelu(in[0], "tanh")};
      },
      [](const Inputs& in) {
        return Inputs{softplus(in[0]) * 1, softplus(in[1], -2.0, 3.0) + 0};
      },
      [](const Inputs& in) {
        return Inputs{pow(in[0], in[1]) + 0, pow(in[1], 2.5) * 1};
      },
      [](const Inputs& in) {
        return Inputs{pow(in[0], -3) + 0, pow(in[0], 0.5) * 1, pow(-2.0, in[1])};
      },
      [](const Inputs& in) {
        return Inputs{remainder(in[0], in[1]) + 0, remainder(in[1], -2.5) * 1};
      },
      [](const Inputs& in) {
        return Inputs{fmod(in[0], in[1]) + 0, div(in[0], in[1], "trunc") * 1,
                      div(in[0], in[1], "floor") + 0, floor_divide(in[1], -2.5) * 1};
      },
      [](const Inputs& in) {
        return Inputs{xlogy(in[0], in[1]) + 0, logical_not(logical_xor(in[0], in[1])),
                      nan_to_num(in[0] * 1) + 0, logaddexp(in[0], in[1]) * 1};
      },
      [inf, nan](const Inputs& in) {
        return Inputs{clamp(in[0], -1.0, 2) + 0, clamp(in[1], std::nullopt, 0.5) * 1,
                      clamp(in[0] * 2, -inf, nan)};
      },
      [](const Inputs& in) {
        return Inputs{logical_not(isfinite(in[0] * in[1])), where(isnan(in[0]), in[1], in[0]) + 1};
      },
      [](const Inputs& in) {
        return Inputs{tanh(in[0]) + 0, log1p(in[0]) * 1, expm1(in[1]) + 0, sin(in[0]) * 1,
                      cos(in[1]) + 0};
      },
  };
  std::mt19937_64 rng(7);
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64}) {
    for (const Shape& shape : std::vector<Shape>{{0}, {1}, {1, 5}, {7, 0, 3}, {27}, {9, 27}}) {
      const int64_t n = detail::shape_numel(shape);
      std::vector<double> va(static_cast<size_t>(n)), vb(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        va[static_cast<size_t>(i)] = special[static_cast<size_t>(i) % special.size()];
        vb[static_cast<size_t>(i)] = special[rng() % special.size()];
      }
      Tensor a, b;
      {
        LazyGuard eager_mode(false);
        a = from_vector(va, shape).to(dtype);
        b = from_vector(vb, shape).to(dtype);
        if (!is_floating_point(dtype)) b = where(eq(b, 0), full_like(b, 3), b);  // no integer % 0
      }
      for (const auto& [layout, al] : testing::input_layouts(a)) {
        for (size_t f = 0; f < fns.size(); ++f) {
          const std::string what = std::string(dtype_name(dtype)) + detail::shape_str(shape) + " " +
                                   layout + ", function " + std::to_string(f);
          bool threw_eagerly = false;
          try {
            eager(fns[f], {al, b});
          } catch (const Error&) {
            threw_eagerly = true;  // integers to negative powers: both modes refuse
          }
          if (threw_eagerly) {
            EXPECT_THROW(plan_of(fns[f], {al, b}), Error) << what;
            continue;
          }
          expect_fused_equals_eager(fns[f], {al, b}, what);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Special values that a kernel makes from its own input are constants to LLVM, which folds every
// op applied to them. A fold may not meet undefined behaviour: exp of a NaN once converted the
// NaN to an integer (poison), and LLVM deleted the whole kernel's stores (found by a fresh-seed
// run: exp(cos(log(x < x))) fed a sine's table lookup). Every random-test op on every pair of
// 0, 1, -inf, inf and NaN made in the kernel, in every float dtype, matches eager bit for bit.
TEST(Fuser, OpsOnSpecialValuesMadeInsideTheKernelMatchEager) {
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor x = testing::input({3, 17}, dtype);
    auto specials = [](const Tensor& in) {
      Tensor zero = in.lt(in).to(in.dtype());  // false: 0 in every element, folded by LLVM
      Tensor one = logical_not(in.lt(in)).to(in.dtype());
      Tensor minus_inf = log(zero);
      Tensor inf = neg(minus_inf);
      Tensor nan = cos(minus_inf);
      return std::vector<Tensor>{zero, one, minus_inf, inf, nan};
    };
    for (int op = 0; op < testing::kElementwiseOps; ++op) {
      for (int a = 0; a < 5; ++a) {
        Fn fn = [op, a, &specials](const Inputs& in) {
          std::vector<Tensor> v = specials(in[0]);
          Inputs out;
          for (int b = 0; b < 5; ++b) {
            try {
              out.push_back(testing::elementwise_op(op, v[static_cast<size_t>(a)],
                                                    v[static_cast<size_t>(b)], 3) *
                            1);
            } catch (const Error&) {
              // The op does not take these operands (an integer op of floats): both modes agree.
            }
          }
          return out;
        };
        if (eager(fn, {x}).empty()) continue;
        expect_fused_equals_eager(fn, {x},
                                  std::string(dtype_name(dtype)) + " op " + std::to_string(op) +
                                      " of special " + std::to_string(a));
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// A transcendental that a kernel uses more than once is emitted once per module, as a function
// with a vector variant that the loop vectorizer calls (a cold compile then selects instructions
// for it twice, not three times per use); used once, it stays inline. Either way every fused
// result equals eager mode's bit for bit, in the vector loop and in its scalar remainder.
TEST(Fuser, ATranscendentalUsedTwiceIsOneFunctionAndMatchesEager) {
  auto chain = [](fuser::Prim prim, int uses) {
    fuser::Kernel k;
    k.input_types = {kFloat32};
    int32_t v = k.add({fuser::Prim::Load, kFloat32, -1, -1, -1, 0});
    for (int i = 0; i < uses; ++i) v = k.add({prim, kFloat32, v});
    k.outputs = {v};
    k.output_types = {kFloat32};
    k.ops = "tanh";
    return k;
  };
  fuser::Layout flat;
  flat.single_element = {false};
  const std::string once = fuser::cpu_disk_key(chain(fuser::Prim::Tanh, 1), flat);
  const std::string twice = fuser::cpu_disk_key(chain(fuser::Prim::Tanh, 2), flat);
  EXPECT_EQ(once.find("@kiln_tanh_f32("), std::string::npos) << once;
  EXPECT_NE(twice.find("define internal float @kiln_tanh_f32(float"), std::string::npos) << twice;
  const size_t first = twice.find("call float @kiln_tanh_f32(");
  ASSERT_NE(first, std::string::npos) << twice;
  EXPECT_NE(twice.find("call float @kiln_tanh_f32(", first + 1), std::string::npos) << twice;
  if (twice.find("@kiln_tanh_f32_v") != std::string::npos)  // a host with vectors
    EXPECT_NE(twice.find("vector-function-abi-variant"), std::string::npos) << twice;

  using Unary = Tensor (*)(const Tensor&);
  const std::pair<const char*, Unary> prims[] = {
      {"exp", kiln::exp},          {"log", kiln::log},       {"log1p", kiln::log1p},
      {"expm1", kiln::expm1},      {"sin", kiln::sin},       {"cos", kiln::cos},
      {"tanh", kiln::tanh},        {"erf", kiln::erf},       {"tan", kiln::tan},
      {"atan", kiln::atan},        {"asin", kiln::asin},     {"acos", kiln::acos},
      {"sinh", kiln::sinh},        {"cosh", kiln::cosh},     {"asinh", kiln::asinh},
      {"acosh", kiln::acosh},      {"atanh", kiln::atanh},   {"exp2", kiln::exp2},
      {"log2", kiln::log2},        {"log10", kiln::log10},   {"erfc", kiln::erfc},
      {"erfinv", kiln::erfinv},    {"lgamma", kiln::lgamma}, {"digamma", kiln::digamma},
      {"trigamma", kiln::trigamma}};
  for (DType dtype : {kFloat32, kFloat64}) {
    // 1000 elements: vectors of 16 (8 for float64 on AVX2) and a scalar remainder.
    Tensor x = testing::input({1000}, dtype, -40.0, 40.0);
    for (const auto& [name, f] : prims) {
      Fn fn = [f = f](const Inputs& in) { return Inputs{f(f(in[0]) * 3.0) + f(in[0] * 0.5)}; };
      expect_fused_equals_eager(fn, {x}, std::string(dtype_name(dtype)) + " " + name);
    }
  }
}

// A flat kernel computing a transcendental is marked for prefetching: its vector loop then asks
// for the tensors' elements further on (memory and arithmetic overlap: GELU 16M, -27% CPU time);
// a kernel of cheap ops leaves that to the hardware. Every size (a partial vector, one element,
// a scalar remainder) gives eager mode's result bit for bit.
TEST(Fuser, AFlatKernelWithATranscendentalIsMarkedForPrefetchingAndMatchesEagerAtEverySize) {
  auto kernel = [](fuser::Prim prim) {
    fuser::Kernel k;
    k.input_types = {kFloat32};
    const int32_t x = k.add({fuser::Prim::Load, kFloat32, -1, -1, -1, 0});
    k.outputs = {k.add({prim, kFloat32, x, x})};
    k.output_types = {kFloat32};
    k.ops = "op";
    return k;
  };
  fuser::Layout flat;
  flat.single_element = {false};
  EXPECT_NE(fuser::cpu_disk_key(kernel(fuser::Prim::Tanh), flat).find("\"kiln-prefetch\""),
            std::string::npos);
  EXPECT_EQ(fuser::cpu_disk_key(kernel(fuser::Prim::Mul), flat).find("\"kiln-prefetch\""),
            std::string::npos);
  for (DType dtype : {kFloat32, kFloat64})
    for (int64_t n : {1, 15, 63, 64, 65, 129, 1000, 4097}) {
      Tensor x = testing::input({n}, dtype, -5.0, 5.0);
      Fn gelu = [](const Inputs& in) {
        const Tensor& v = in[0];
        return Inputs{v * 0.5 * (kiln::tanh((v + v * v * v * 0.044715) * 0.7978845608) + 1.0)};
      };
      expect_fused_equals_eager(gelu, {x},
                                std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
    }
}

// The float64 transcendentals fused (lib/math/primitives.h's definitions, emitted as IR) over the
// whole double range, each within its documented bound (math::kUlpBounds, docs/numerics.md) of
// the long double result: random bit patterns (every binade, NaNs with payloads, infinities,
// subnormals), values on either side of each function's case boundaries and of sin and cos's two
// reductions, and doubles near multiples of pi/2. NaN for NaN, infinities exact.
TEST(Fuser, Float64TranscendentalsAreWithinTheirBoundsOverTheWholeRange) {
  std::mt19937_64 rng(11);
  std::vector<double> v;
  for (double b : {0x1p-1074,
                   0x1p-1022,
                   0x1p-54,
                   0x1p-28,
                   0.2554,
                   0.25,
                   0.3466,
                   0.5493061443340549,
                   0.84375,
                   1.0,
                   1.0397,
                   1.25,
                   0x1.6db6ep1,
                   6.0,
                   22.0,
                   38.8,
                   40.0,
                   709.78,
                   709.782712893384,
                   710.0,
                   1.5707963267948966,
                   0x1p20,
                   1e22,
                   std::ldexp(6381956970095103.0, 797),
                   std::numeric_limits<double>::max()}) {
    for (double x : {b, std::nextafter(b, 0.0), std::nextafter(b, 1e308)}) {
      v.push_back(x);
      v.push_back(-x);
      v.push_back(x - 1.0);  // log1p's neighbourhood of -1
    }
  }
  for (double x : {0.0, -0.0, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity(), std::nan(""), -1.0})
    v.push_back(x);
  std::uniform_real_distribution<double> small(-12.0, 12.0), near_boundary(1e6, 1.1e6);
  for (int i = 0; i < 3000; ++i) {
    const uint64_t bits = rng();
    double x;
    std::memcpy(&x, &bits, 8);
    v.push_back(x);
    v.push_back(small(rng));
    if (i % 4 == 0) v.push_back(near_boundary(rng));
  }
  v.resize(v.size() / 16 * 16);
  Tensor x;
  {
    LazyGuard eager_mode(false);
    x = from_vector(v, Shape{16, static_cast<int64_t>(v.size() / 16)});
  }
  ASSERT_EQ(x.dtype(), kFloat64);
  Fn fn = [](const Inputs& in) {
    const Tensor& a = in[0];
    return Inputs{tanh(a),  erf(a),   log1p(a), expm1(a), sin(a),  cos(a),
                  tan(a),   atan(a),  asin(a),  acos(a),  sinh(a), cosh(a),
                  asinh(a), acosh(a), atanh(a), exp2(a),  log2(a), log10(a)};
  };
  using Exact = long double (*)(long double);
  const std::pair<const char*, Exact> exact[] = {
      {"tanh", [](long double v) { return std::tanh(v); }},
      {"erf", [](long double v) { return std::erf(v); }},
      {"log1p", [](long double v) { return std::log1p(v); }},
      {"expm1", [](long double v) { return std::expm1(v); }},
      {"sin", [](long double v) { return std::sin(v); }},
      {"cos", [](long double v) { return std::cos(v); }},
      {"tan", [](long double v) { return std::tan(v); }},
      {"atan", [](long double v) { return std::atan(v); }},
      {"asin", [](long double v) { return std::asin(v); }},
      {"acos", [](long double v) { return std::acos(v); }},
      {"sinh", [](long double v) { return std::sinh(v); }},
      {"cosh", [](long double v) { return std::cosh(v); }},
      {"asinh", [](long double v) { return std::asinh(v); }},
      {"acosh", [](long double v) { return std::acosh(v); }},
      {"atanh", [](long double v) { return std::atanh(v); }},
      {"exp2", [](long double v) { return std::exp2(v); }},
      {"log2", [](long double v) { return std::log2(v); }},
      {"log10", [](long double v) { return std::log10(v); }}};
  auto bound = [](const std::string& name) {
    for (const math::UlpBound& b : math::kUlpBounds)
      if (name == b.name) return b.f64;
    return 0;
  };
  auto ulps = [](double a, double b) {
    auto key = [](double f) {
      int64_t i;
      std::memcpy(&i, &f, 8);
      return i < 0 ? static_cast<long double>(INT64_MIN) - i : static_cast<long double>(i);
    };
    return std::fabs(key(a) - key(b));
  };
  for (const auto& [layout, xl] : testing::input_layouts(x)) {
    Planned p = plan_of(fn, {xl});
    EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
    const Inputs got = p.plan->run(p.binding.inputs);
    LazyGuard eager_mode(false);
    const std::vector<double> xs = xl.to_vector<double>();
    for (size_t k = 0; k < got.size(); ++k) {
      const auto [name, f] = exact[k];
      const std::vector<double> ys = got[k].to_vector<double>();
      for (size_t i = 0; i < xs.size(); ++i) {
        const auto want = static_cast<double>(f(xs[i]));
        const bool ok = std::isnan(want)                        ? std::isnan(ys[i])
                        : std::isinf(want) || std::isinf(ys[i]) ? ys[i] == want
                                                                : ulps(ys[i], want) <= bound(name);
        ASSERT_TRUE(ok) << name << "(" << std::hexfloat << xs[i] << ") fused = " << ys[i]
                        << ", exact " << want << " (" << layout << ")";
      }
    }
  }
}

// atan2 fused against eager mode, bit for bit: every pair of signed zeros, infinities, NaN and
// finite values of both signs, in float32 and float64, broadcast against each other.
TEST(Fuser, Atan2MatchesEagerOnEveryPairOfSpecialValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> v = {0.0, -0.0, inf, -inf, std::nan(""), 1.0, -1.0, 0.3, -7.5, 1e-300};
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor y, x;
    {
      LazyGuard eager_mode(false);
      y = from_vector(v, Shape{static_cast<int64_t>(v.size()), 1}).to(dtype);
      x = from_vector(v, Shape{1, static_cast<int64_t>(v.size())}).to(dtype);
    }
    Fn fn = [](const Inputs& in) { return Inputs{atan2(in[0] * 1.0, in[1]) + 0.0}; };
    expect_fused_equals_eager(fn, {y, x}, std::string("atan2 ") + dtype_name(dtype));
  }
}

// sin, cos and tan compute their large reduction (arguments from 2^20 up) only for a vector of
// lanes that holds such an argument (a branch in their out-of-line vector functions): a large
// argument at every position among small ones, vectors without any, and the remainder loop's
// elements all give eager mode's bits.
TEST(Fuser, TrigonometricLargeReductionRunsOnlyForVectorsThatNeedIt) {
  std::vector<double> v;
  for (int i = 0; i < 301; ++i) v.push_back(0.37 * i - 40.0);
  for (int k = 0; k < 40; ++k) v[70 + k * 3] = (k % 2 ? -1.0 : 1.0) * std::ldexp(1.0 + k, 20 + k);
  v.back() = 3e30;
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor x;
    {
      LazyGuard eager_mode(false);
      x = from_vector(v, Shape{static_cast<int64_t>(v.size())}).to(dtype);
    }
    for (auto op : {kiln::sin, kiln::cos, kiln::tan}) {
      Fn fn = [op](const Inputs& in) { return Inputs{op(in[0] * 1.0) + 0.0}; };
      expect_fused_equals_eager(fn, {x}, dtype_name(dtype));
    }
  }
}

// Kernels of many outputs computing transcendentals once or twice each, on every layout (a
// strided kernel inlines them all: see Emitter::math), give eager mode's bits.
TEST(Fuser, StridedKernelsWithTranscendentalsMatchEager) {
  const Tensor x = testing::input({16, 436}, kFloat64, -3.0, 3.0);
  Fn once = [](const Inputs& in) {
    const Tensor& a = in[0];
    return Inputs{tanh(a),  erf(a),   log1p(a), expm1(a), sin(a),  cos(a),
                  tan(a),   atan(a),  asin(a),  acos(a),  sinh(a), cosh(a),
                  asinh(a), acosh(a), atanh(a), exp2(a),  log2(a), log10(a)};
  };
  Fn twice = [](const Inputs& in) {
    const Tensor &a = in[0], b = in[0] * 2.0;
    return Inputs{tanh(a) + tanh(b),
                  sin(a) + sin(b),
                  cos(a) + cos(b),
                  tan(a) + tan(b),
                  erf(a),
                  exp(a),
                  log(a),
                  atan(a)};
  };
  for (const auto& [layout, xl] : testing::input_layouts(x)) {
    expect_fused_equals_eager(once, {xl}, layout);
    expect_fused_equals_eager(twice, {xl}, layout);
  }
}

// A lone elementwise node on the CPU runs its reference kernel, unless it computes a
// transcendental over at least 2^16 elements: then it is a kernel of its own (the reference
// loops of sin, atan, ... do not vectorize), with eager mode's bits.
TEST(Fuser, ALoneTranscendentalOverALargeTensorIsItsOwnKernel) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor large = testing::input({256, 257}, dtype, -3.0, 3.0);
    const Tensor small = testing::input({255, 256}, dtype, -3.0, 3.0);
    for (auto op : {kiln::sin, kiln::atan, kiln::asinh, kiln::exp}) {
      Fn fn = [op](const Inputs& in) { return Inputs{op(in[0])}; };
      EXPECT_EQ(plan_of(fn, {large}).plan->num_kernel_steps(), 1u);
      expect_fused_equals_eager(fn, {large}, dtype_name(dtype));
      EXPECT_EQ(plan_of(fn, {small}).plan->num_kernel_steps(), 0u) << "2^16 - 256 elements";
    }
    Fn add = [](const Inputs& in) { return Inputs{in[0] + 1.0}; };
    EXPECT_EQ(plan_of(add, {large}).plan->num_kernel_steps(), 0u) << "no transcendental";
  }
}

// An integer remainder by 0 is an error in both modes (the check reads the divisor before the node
// is recorded); a kernel that meets a divisor of 0 or -1 anyway gives 0 and never traps.
TEST(Fuser, IntegerRemainderByZeroIsAnErrorInEveryMode) {
  Tensor a = testing::input({4, 5}, kInt32), zero;
  {
    LazyGuard eager_mode(false);
    zero = zeros({5}, kInt32);
  }
  Fn fn = [](const Inputs& in) { return Inputs{remainder(in[0] + 1, in[1]) * 2}; };
  EXPECT_THROW(eager(fn, {a, zero}), Error);
  {
    LazyGuard lazy(true);
    EXPECT_THROW(fn({a, zero}), Error);
  }
  // INT_MIN % -1 overflows x86's division: both modes give 0.
  Tensor lowest, minus_one;
  {
    LazyGuard eager_mode(false);
    lowest = full({3}, std::numeric_limits<int32_t>::min(), kInt32);
    minus_one = full({3}, -1, kInt32);
  }
  Fn fn2 = [](const Inputs& in) { return Inputs{remainder(in[0] - 0, in[1]) + 5}; };
  expect_fused_equals_eager(fn2, {lowest, minus_one}, "INT_MIN % -1");
  Planned p = plan_of(fn2, {lowest, minus_one});
  Inputs got = p.plan->run(p.binding.inputs);
  EXPECT_EQ(got[0].to(kInt64).sum().item<int64_t>(), 15);
  // Integer remainders are checked for zero divisors by their entry point, so they never fuse:
  // a traced one raises on replay too (floating ones fuse).
  EXPECT_EQ(p.plan->num_kernel_steps(), 0u) << p.graph->str();
  Tensor two;
  {
    LazyGuard eager_mode(false);
    two = full({5}, 2, kInt32);
  }
  jit::Function traced = jit::trace(fn, {a, two});
  EXPECT_NO_THROW(traced({a, two}));
  EXPECT_THROW(traced({a, zero}), Error);
  Fn float_fn = [](const Inputs& in) { return Inputs{remainder(in[0] + 1.0, in[1]) * 2.0}; };
  Planned pf = plan_of(float_fn, {testing::input({4, 5}), testing::input({5})});
  EXPECT_EQ(pf.plan->num_kernel_steps(), 1u) << pf.graph->str();
}

// ---------------------------------------------------------------------- compilation counting
TEST(Fuser, ChangingALiteralOrASizeCompilesNothingNew) {
  auto run = [](double literal, int64_t n) {
    Tensor x = testing::input({n});
    Fn fn = [literal](const Inputs& in) { return Inputs{exp(in[0] * literal) + 0.5}; };
    expect_fused_equals_eager(fn, {x}, "literal " + std::to_string(literal));
  };
  // Kernels come from compiling or from the disk cache (a kernel another run compiled).
  auto loaded = [] { return jit::stats().kernels_compiled + jit::stats().kernel_disk_hits; };
  run(0.37, 1000);
  const int64_t before = loaded();
  EXPECT_GE(before, 1);
  run(0.38, 1000);
  run(0.38, 1001);
  run(-2.5, 4096);
  EXPECT_EQ(loaded(), before) << "a literal or a size compiled a kernel";
  EXPECT_GE(jit::stats().kernel_memory_hits, 3);
}

// Attributes (clamp's bounds, softplus's beta and threshold, add's alpha) are kernel scalars too.
TEST(Fuser, ChangingAnAttributeCompilesNothingNew) {
  auto run = [](double lo, double hi, double beta, double alpha) {
    Tensor x = testing::input({100}), y = testing::input({100});
    Fn fn = [=](const Inputs& in) {
      return Inputs{softplus(clamp(in[0], lo, hi), beta, hi) + add(in[0], in[1], alpha)};
    };
    expect_fused_equals_eager(fn, {x, y}, "attributes " + std::to_string(lo));
  };
  auto loaded = [] { return jit::stats().kernels_compiled + jit::stats().kernel_disk_hits; };
  run(-1.0, 1.0, 1.0, 2.0);
  const int64_t before = loaded();
  run(-0.5, 2.0, 3.0, 0.5);
  run(0.25, 0.75, -1.0, -3.0);
  EXPECT_EQ(loaded(), before) << "an attribute compiled a kernel";
}

TEST(Fuser, ATransposedInputUsesTheStridedKernelAndMatchesEager) {
  Tensor x0 = testing::input({9, 13});
  for (const auto& [layout, x] : testing::input_layouts(x0)) {
    Fn fn = [](const Inputs& in) { return Inputs{sigmoid(in[0] * 3.0) - in[0]}; };
    expect_fused_equals_eager(fn, {x}, layout);
  }
}

// ------------------------------------------------------------- random differential testing
// Random elementwise programs (testing::RandomProgram) over random shapes, dtypes, broadcasts and
// layouts, with C++ numbers, comparisons and logic: each is recorded lazily, fused and compared
// with eager mode.
using testing::RandomProgram;

void run_random_programs(uint64_t seed, int count, double seconds) {
  RandomProgram gen(seed);
  const auto start = std::chrono::steady_clock::now();
  int fused = 0;
  for (int i = 0; i < count; ++i) {
    if (seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      break;
    Inputs in = gen.make_inputs();
    Fn fn = gen.make_program(2 + i % 9);
    if (eager(fn, in).empty()) continue;  // no op took these inputs
    Planned p = plan_of(fn, in);
    if (::testing::Test::HasFailure()) return;
    fused += p.plan->num_kernel_steps() > 0;
    Inputs got = p.plan->run(p.binding.inputs);
    Inputs want = eager(fn, in);
    const std::string what =
        "seed " + std::to_string(seed) + ", program " + std::to_string(i) + "\n" + p.graph->str();
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t k = 0; k < got.size(); ++k) {
      testing::expect_bit_equal(got[k], want[k], what);
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(fused, 0) << "no program was fused";
  std::printf("random programs (seed %llu): %d fused of those run\n",
              static_cast<unsigned long long>(seed), fused);
}

TEST(FuserRandom, TwoThousandProgramsWithAFixedSeedMatchEager) {
  run_random_programs(20261122, static_cast<int>(testing::scaled(2000, 200)), 0);
}

// A fresh seed each run (printed, so a failure can be replayed with KILN_FUZZ_SEED), for at most
// KILN_FUZZ_SECONDS (default 10).
TEST(FuserRandom, FreshSeedTimeBoxed) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("KILN_FUZZ_SEED")) seed = std::strtoull(s, nullptr, 10);
  double seconds = 10;
  if (const char* s = std::getenv("KILN_FUZZ_SECONDS")) seconds = std::atof(s);
  std::printf("fresh seed: %llu (replay with KILN_FUZZ_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  run_random_programs(seed, 1 << 30, seconds);
}

}  // namespace
}  // namespace kiln
