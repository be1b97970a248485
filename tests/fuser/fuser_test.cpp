// The fuser and the LLVM code generator: canonical cases become one kernel, literals and sizes
// never recompile, and random elementwise graphs computed by fused kernels equal eager mode's
// results bit for bit (kernels call the same libm functions and use no fast-math).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tests/fuser/fuser_testing.h"
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

TEST(Fuser, ATransposedInputUsesTheStridedKernelAndMatchesEager) {
  Tensor x0 = testing::input({9, 13});
  for (const auto& [layout, x] : testing::input_layouts(x0)) {
    Fn fn = [](const Inputs& in) { return Inputs{sigmoid(in[0] * 3.0) - in[0]}; };
    expect_fused_equals_eager(fn, {x}, layout);
  }
}

// ------------------------------------------------------------- random differential testing
// Random elementwise programs over random shapes, dtypes, broadcasts and layouts, with C++
// numbers, comparisons and logic: each is recorded lazily, fused and compared with eager mode.
class RandomProgram {
 public:
  explicit RandomProgram(uint64_t seed) : rng_(seed) {}

  // Inputs for one program: 1-3 tensors broadcastable to one shape, some non-contiguous.
  Inputs make_inputs() {
    return testing::random_inputs(
        rng_,
        {{0, 1, 2, 3, 5, 8, 17}, {kFloat32, kFloat32, kFloat64, kInt32, kInt64, kBool}, 30, 3, 4});
  }

  // A program of `ops` random elementwise ops; values are picked from everything made so far.
  Fn make_program(int ops) {
    std::vector<int> choice;
    for (int i = 0; i < ops * 4; ++i) choice.push_back(pick(0, 1 << 20));
    return [choice, ops](const Inputs& in) {
      std::vector<Tensor> values(in.begin(), in.end());
      size_t c = 0;
      auto next = [&](int n) { return choice[c++ % choice.size()] % n; };
      for (int i = 0; i < ops; ++i) {
        const Tensor& a = values[static_cast<size_t>(next(static_cast<int>(values.size())))];
        const Tensor& b = values[static_cast<size_t>(next(static_cast<int>(values.size())))];
        const int op = next(testing::kElementwiseOps);
        try {
          values.push_back(testing::elementwise_op(op, a, b, next(7)));
        } catch (const Error&) {
          // The op does not take these dtypes (sub of bools, ...): eager and lazy agree on that.
        }
      }
      // The last three values the ops made: a group with several outputs.
      Inputs out;
      for (size_t k = std::max(in.size(), values.size() > 3 ? values.size() - 3 : 0);
           k < values.size(); ++k) {
        // to() of the same dtype returns its operand: keep each tensor once, and no inputs.
        bool seen = false;
        for (const Tensor& t : in) seen |= values[k].is_same(t);
        for (const Tensor& t : out) seen |= values[k].is_same(t);
        if (!seen) out.push_back(values[k]);
      }
      return out;
    };
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::mt19937_64 rng_;
};

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
  run_random_programs(20261122, 2000, 0);
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
