// The executor's plan: elementwise steps run straight into their outputs (and small values into
// the plan's arena) must compute exactly what the ops' public entry points compute.
#include <gtest/gtest.h>

#include <functional>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "fuser/fuse.h"
#include "jit/ir.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using Inputs = std::vector<Tensor>;
using testing::expect_bit_equal;

// The plans here are built from pending tensors: a KILN_MAX_PENDING from the environment is lifted.
[[maybe_unused]] ::testing::Environment* const kNoFlush =
    ::testing::AddGlobalTestEnvironment(new testing::NoFlushEnvironment);

// Records fn lazily on `inputs` and returns the graph of its results with the tensors bound to
// the graph's inputs.
std::unique_ptr<jit::Graph> graph_of(const std::function<Inputs(const Inputs&)>& fn,
                                     const Inputs& inputs, jit::LazyGraphBinding* binding) {
  LazyGuard lazy(true);
  Inputs outs = fn(inputs);
  std::vector<detail::LazyRef> requests;
  for (const Tensor& t : outs) {
    EXPECT_TRUE(detail::is_pending(t));
    requests.push_back(t.impl()->storage->lazy);
  }
  return jit::build_graph(requests, binding, false);
}

Inputs eager(const std::function<Inputs(const Inputs&)>& fn, const Inputs& inputs) {
  LazyGuard eager(false);
  return fn(inputs);
}

// Elementwise ops of every dtype rule, with numbers of another type (converted once by the plan),
// broadcasting, and alpha.
Inputs elementwise_mix(const Inputs& in) {
  const Tensor &x = in[0], &y = in[1];
  const bool floating = is_floating_point(x.dtype());
  Tensor a = x * 3;
  Tensor b = a + y;
  Tensor c = sub(b, x, 2);
  Tensor d = maximum(c, y);
  Tensor e = neg(minimum(d, x * 5));
  Tensor p = logical_and(gt(e, x), le(x, y));
  Inputs out{e, p, logical_not(p)};
  if (floating) {
    Tensor f = tanh(e * 0.25) + exp(x * 0.5) / 1.5;
    out.push_back(sigmoid(f) * abs(y));
    out.push_back(add(f, y, 0.75));
  } else {
    out.push_back(abs(e) - 1);
  }
  return out;
}

TEST(Plan, DirectStepsMatchTheOpEntryPointsBitForBit) {
  const int64_t arena_before = jit::plan_arena_bytes();
  std::mt19937 rng(7);
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64}) {
    for (int trial = 0; trial < 3; ++trial) {
      // Small shapes (arena values) and one past the arena's per-value limit.
      const int64_t rows = trial == 2 ? 70 : 1 + static_cast<int64_t>(rng() % 5);
      const int64_t cols = trial == 2 ? 90 : 1 + static_cast<int64_t>(rng() % 6);
      Tensor x0 = testing::input({rows, cols}, dtype, -4, 4);
      Tensor y = testing::input({cols}, dtype, -4, 4);
      for (const auto& [layout, x] : testing::input_layouts(x0)) {
        for (bool fuse : {false, true}) {
          const std::string what = std::string(dtype_name(dtype)) + " " + layout + " " +
                                   detail::shape_str(x.sizes()) + (fuse ? " fused" : "");
          jit::LazyGraphBinding binding;
          auto graph = graph_of(elementwise_mix, {x, y}, &binding);
          fuser::FusionGuard fusion(fuse);
          jit::Plan plan(*graph);
          if (fuse) {
            EXPECT_GE(plan.num_kernel_steps(), 1u) << what << "\n" << graph->str();
          } else {
            EXPECT_EQ(plan.num_kernel_steps(), 0u) << what;
            EXPECT_GE(plan.num_direct_steps(), 12u) << what << "\n" << graph->str();
          }
          // Unfused, the small intermediates live in the arena (fused, they are never stored).
          if (trial < 2 && !fuse) {
            EXPECT_GT(plan.arena_bytes(), 0u) << what;
          }
          Inputs want = eager(elementwise_mix, {x, y});
          Inputs first = plan.run(binding.inputs);
          Inputs first_copy;
          for (const Tensor& t : first)
            first_copy.push_back(
                eager([](const Inputs& v) { return Inputs{v[0].clone()}; }, {t})[0]);
          Inputs second = plan.run(binding.inputs);
          ASSERT_EQ(first.size(), want.size()) << what;
          for (size_t k = 0; k < want.size(); ++k) {
            expect_bit_equal(first[k], want[k], what + " output " + std::to_string(k));
            expect_bit_equal(second[k], want[k], what + " rerun, output " + std::to_string(k));
            // A second run must not write into what the first returned.
            expect_bit_equal(first[k], first_copy[k], what + " first result after the rerun");
          }
        }
      }
    }
  }
  EXPECT_EQ(jit::plan_arena_bytes(), arena_before) << "arenas outlived their plans";
}

TEST(Plan, OperandsNeedingPromotionRunThroughTheOpEntry) {
  fuser::FusionGuard no_fusion(false);
  // int32 * 1.5 computes in float32: the tensor operand needs a conversion at run time.
  Tensor x = testing::input({3, 4}, kInt32, -5, 5);
  auto fn = [](const Inputs& in) { return Inputs{in[0] * 1.5, gt(in[0], 0.5)}; };
  jit::LazyGraphBinding binding;
  auto graph = graph_of(fn, {x}, &binding);
  jit::Plan plan(*graph);
  EXPECT_EQ(plan.num_direct_steps(), 0u) << graph->str();
  Inputs got = plan.run(binding.inputs);
  Inputs want = eager(fn, {x});
  expect_bit_equal(got[0], want[0], "int32 * 1.5");
  expect_bit_equal(got[1], want[1], "int32 > 0.5");
}

TEST(Plan, ConcurrentReplaysOfOneFunctionEachGetTheirOwnResults) {
  auto fn = [](const Inputs& in) {
    Tensor h = tanh(in[0] * 1.5 + 0.25);
    return Inputs{exp(neg(h * in[0]))};
  };
  jit::Function f = jit::trace(fn, {testing::input({2, 3})});
  constexpr int kThreads = 4, kCalls = 300;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Tensor x;
      Tensor want;
      {
        LazyGuard eager(false);
        x = full({2, 3}, 0.1 * (t + 1));
        want = fn({x})[0];
      }
      for (int i = 0; i < kCalls; ++i) {
        Tensor got = f({x})[0];
        if (testing::bytes(got) != testing::bytes(want)) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  EXPECT_GE(jit::stats().replays, kThreads * kCalls);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Lazy evaluation reuses the optimized plan of a structurally equal graph: the same computation
// on new values hits, while another literal or another size builds a new plan.
TEST(PlanCache, ASecondEvaluationOfTheSameGraphReusesItsPlan) {
  auto run = [](const Tensor& x, double literal) {
    LazyGuard lazy(true);
    Tensor y = tanh(x * literal) + x;
    kiln::eval(y);
    return y;
  };
  auto eager_run = [](const Tensor& x, double literal) {
    LazyGuard eager(false);
    return tanh(x * literal) + x;
  };
  Tensor a = testing::input({7, 3}), b = testing::input({7, 3}), c = testing::input({8, 3});
  run(a, 0.5);
  const int64_t hits = jit::stats().plan_cache_hits;
  testing::expect_bit_equal(run(b, 0.5), eager_run(b, 0.5), "same graph, new values");
  EXPECT_EQ(jit::stats().plan_cache_hits, hits + 1);
  testing::expect_bit_equal(run(b, 0.25), eager_run(b, 0.25), "another literal");
  EXPECT_EQ(jit::stats().plan_cache_hits, hits + 1) << "a different constant must not hit";
  testing::expect_bit_equal(run(c, 0.5), eager_run(c, 0.5), "another size");
  EXPECT_EQ(jit::stats().plan_cache_hits, hits + 1) << "a different size must not hit";
  testing::expect_bit_equal(run(a.t().contiguous().t(), 0.5), eager_run(a, 0.5),
                            "same graph, another input layout");
}

// The cache key covers everything the graph is built from: each of these differs from the first
// recording in one respect and must build its own plan, and each result must equal eager's.
TEST(PlanCache, AnyStructuralDifferenceMisses) {
  Tensor a = testing::input({5, 4}), b = testing::input({5, 4});
  Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
  using Fn = std::function<std::vector<Tensor>(const Tensor&, const Tensor&)>;
  std::vector<std::pair<const char*, Fn>> variants = {
      {"base",
       [](const Tensor& x, const Tensor& y) { return std::vector<Tensor>{tanh(x * y) + x}; }},
      {"other op",
       [](const Tensor& x, const Tensor& y) { return std::vector<Tensor>{sigmoid(x * y) + x}; }},
      {"other wiring",
       [](const Tensor& x, const Tensor& y) { return std::vector<Tensor>{tanh(x * y) + y}; }},
      {"shared input",
       [](const Tensor& x, const Tensor&) { return std::vector<Tensor>{tanh(x * x) + x}; }},
      {"other attribute",
       [](const Tensor& x, const Tensor& y) {
         return std::vector<Tensor>{tanh(x * y).add(x, 2.0)};
       }},
      {"another output kept",
       [](const Tensor& x, const Tensor& y) {
         Tensor t = tanh(x * y);
         return std::vector<Tensor>{t + x, t};
       }},
  };
  auto run = [](const Fn& fn, const Tensor& x, const Tensor& y) {
    LazyGuard lazy(true);
    std::vector<Tensor> out = fn(x, y);
    for (const Tensor& t : out) kiln::eval(t);
    return out;
  };
  for (int dtype = 0; dtype < 2; ++dtype) {
    const Tensor& x = dtype ? a64 : a;
    const Tensor& y = dtype ? b64 : b;
    for (const auto& [what, fn] : variants) {
      const int64_t hits = jit::stats().plan_cache_hits;
      std::vector<Tensor> got = run(fn, x, y);
      std::vector<Tensor> want;
      {
        LazyGuard eager(false);
        want = fn(x, y);
      }
      const std::string name = std::string(what) + (dtype ? " (float64)" : "");
      EXPECT_EQ(jit::stats().plan_cache_hits, hits) << name << " hit another recording's plan";
      ASSERT_EQ(got.size(), want.size()) << name;
      for (size_t k = 0; k < got.size(); ++k) testing::expect_bit_equal(got[k], want[k], name);
    }
  }
  // And the same recording again hits.
  const int64_t hits = jit::stats().plan_cache_hits;
  run(variants[0].second, b, a);
  EXPECT_EQ(jit::stats().plan_cache_hits, hits + 1);
}

// In-place outputs, on hand-built graphs whose step order is fixed: input 0 (p) may take output
// 0. Each graph runs three times on fresh copies of p; the first run compiles and writes nothing
// in place, the later ones may.
struct InPlaceCase {
  std::vector<Tensor> outputs;
  int64_t in_place_writes;  // over the three runs
  bool shares_p;            // the last run's output 0 is p's buffer
};

InPlaceCase run_in_place(const jit::Graph& g, const Tensor& p, const Tensor& x) {
  jit::Plan plan(g, std::vector<int64_t>{0, -1});
  const int64_t before = jit::stats().in_place_writes;
  InPlaceCase c{};
  for (int run = 0; run < 3; ++run) {
    Tensor target;
    {
      LazyGuard concrete(false);  // a graph's inputs are concrete
      target = p.clone();
    }
    c.outputs = plan.run({target, x});
    c.shares_p = c.outputs[0].impl()->storage->data == target.impl()->storage->data;
  }
  c.in_place_writes = jit::stats().in_place_writes - before;
  return c;
}

jit::ValueType f32_type(Shape sizes) {
  return jit::ValueType{kFloat32, std::move(sizes), kCPU, false};
}

TEST(PlanInPlace, AnUpdateNothingElseReadsIsComputedInItsInputsBuffer) {
  manual_seed(21);
  Tensor p = randn({64, 64}), x = randn({64, 64});
  jit::Graph g;
  jit::Value* pv = g.add_input(f32_type({64, 64}));
  jit::Value* xv = g.add_input(f32_type({64, 64}));
  jit::Value* sum = g.create("add", {pv, xv}, {int64_t{1}}, {f32_type({64, 64})})->output();
  jit::Value* upd = g.create("mul", {sum, xv}, {}, {f32_type({64, 64})})->output();
  jit::Value* other = g.create("exp", {xv}, {}, {f32_type({64, 64})})->output();
  g.add_output(upd);
  g.add_output(other);
  InPlaceCase c = run_in_place(g, p, x);
  EXPECT_EQ(c.in_place_writes, 2);
  EXPECT_TRUE(c.shares_p);
  expect_bit_equal(c.outputs[0], (p + x) * x, "update");
  expect_bit_equal(c.outputs[1], exp(x), "other output");
}

TEST(PlanInPlace, AnInputReadByALaterStepKeepsItsOldValue) {
  manual_seed(22);
  Tensor p = randn({64, 64}), x = randn({64, 64});
  jit::Graph g;
  jit::Value* pv = g.add_input(f32_type({64, 64}));
  jit::Value* xv = g.add_input(f32_type({64, 64}));
  jit::Value* sum = g.create("add", {pv, xv}, {int64_t{1}}, {f32_type({64, 64})})->output();
  jit::Value* upd = g.create("mul", {sum, xv}, {}, {f32_type({64, 64})})->output();
  // After the update's kernel, a GEMM reads p (through a view) and the update.
  jit::Value* pt =
      g.create("transpose", {pv}, {int64_t{0}, int64_t{1}}, {f32_type({64, 64})})->output();
  jit::Value* prod = g.create("mm", {pt, upd}, {}, {f32_type({64, 64})})->output();
  g.add_output(upd);
  g.add_output(prod);
  InPlaceCase c = run_in_place(g, p, x);
  EXPECT_EQ(c.in_place_writes, 0);
  EXPECT_FALSE(c.shares_p);
  expect_bit_equal(c.outputs[0], (p + x) * x, "update");
  expect_bit_equal(c.outputs[1], mm(p.t(), (p + x) * x), "GEMM of the old value");
}

TEST(PlanInPlace, AKernelReadingItsTargetThroughAnotherLayoutGetsAFreshBuffer) {
  manual_seed(23);
  Tensor p = randn({48, 48}), x = randn({48, 48});
  jit::Graph g;
  jit::Value* pv = g.add_input(f32_type({48, 48}));
  jit::Value* xv = g.add_input(f32_type({48, 48}));
  jit::Value* pt =
      g.create("transpose", {pv}, {int64_t{0}, int64_t{1}}, {f32_type({48, 48})})->output();
  jit::Value* sum = g.create("add", {pv, pt}, {int64_t{1}}, {f32_type({48, 48})})->output();
  jit::Value* upd = g.create("mul", {sum, xv}, {}, {f32_type({48, 48})})->output();
  g.add_output(upd);
  g.add_output(g.create("neg", {xv}, {}, {f32_type({48, 48})})->output());
  InPlaceCase c = run_in_place(g, p, x);
  EXPECT_EQ(c.in_place_writes, 0);
  EXPECT_FALSE(c.shares_p);
  expect_bit_equal(c.outputs[0], (p + p.t()) * x, "update reading p transposed");
}

}  // namespace
}  // namespace kiln
