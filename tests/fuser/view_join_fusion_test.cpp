// Views of intermediate values inside fusion groups (index arithmetic, through the push_views
// pass) and cat/stack as group exits (pieces written into their slices of one output): canonical
// cases become one kernel, and random programs of elementwise ops, views, chunks and joins
// computed fused equal eager mode's results bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::eager;
using testing::Fn;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

// Plans fn with the passes (push_views is one) and compares with eager mode bit for bit. The
// passes that change rounding on purpose (stabilize: log(sigmoid(x)) -> -softplus(-x); gemm_bias)
// are off.
Planned expect_planned_equals_eager(const Fn& fn, const Inputs& inputs, const std::string& what) {
  struct ExactPassesOnly {
    ExactPassesOnly() { jit::set_disabled_passes({"stabilize", "gemm_bias"}); }
    ~ExactPassesOnly() { jit::set_disabled_passes({}); }
  } exact;
  Planned p = plan_of(fn, inputs, /*passes=*/true);
  Inputs got = p.plan->run(p.binding.inputs);
  Inputs want = eager(fn, inputs);
  EXPECT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size() && k < want.size(); ++k)
    testing::expect_bit_equal(got[k], want[k], what + ", output " + std::to_string(k));
  return p;
}

// Steps that are not a kernel or a view of a graph input (zero-copy) do real work on their own.
size_t unfused_compute_steps(const Planned& p) {
  size_t n = 0;
  for (const jit::Node* node = p.graph->first(); node; node = node->next()) {
    if (node->is_input() || node->is_constant()) continue;
    if (node->op().kind == detail::OpKind::View) continue;
    ++n;
  }
  return n;
}

// Every computing node of the graph sits in the plan's one kernel.
void expect_one_kernel(const Planned& p, const std::string& what) {
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << what << "\n" << p.graph->str();
  EXPECT_EQ(p.plan->num_nodes() - (p.plan->num_steps() - 1), unfused_compute_steps(p))
      << what << ": a computing node runs outside the kernel\n"
      << p.graph->str();
}

// ---------------------------------------------------------------------- views as index arithmetic
TEST(ViewFusion, TransposeOfAnIntermediateIsOneKernel) {
  Tensor a = testing::input({7, 9}), b = testing::input({9}), c = testing::input({9, 7});
  Fn fn = [](const Inputs& in) { return Inputs{exp(in[0] * in[1]).t() + in[2]}; };
  Planned p = expect_planned_equals_eager(fn, {a, b, c}, "exp(a * b).t() + c");
  expect_one_kernel(p, "transpose");
}

TEST(ViewFusion, SliceSelectNarrowPermuteSqueezeAndExpandOfIntermediates) {
  Tensor a = testing::input({4, 6, 5}), b = testing::input({6, 1}), c = testing::input({5, 4});
  struct Case {
    const char* what;
    Fn fn;
  };
  const std::vector<Case> cases = {
      {"slice",
       [](const Inputs& in) { return Inputs{tanh(in[0] + in[1]).slice(1, 1, 6, 2) * 2.0}; }},
      {"select",
       [](const Inputs& in) { return Inputs{sigmoid(in[0] * in[1]).select(0, 2) - 1.0}; }},
      {"narrow", [](const Inputs& in) { return Inputs{exp(in[0] - in[1]).narrow(2, 1, 3) + 0.5}; }},
      {"permute",
       [](const Inputs& in) {
         return Inputs{(in[0] * in[1]).permute({2, 0, 1}) + in[2].unsqueeze(2)};
       }},
      {"squeeze/unsqueeze",
       [](const Inputs& in) {
         return Inputs{neg(in[1] * 3.0).squeeze(1).unsqueeze(0) + in[0].select(2, 0)};
       }},
      {"expand",
       [](const Inputs& in) {
         return Inputs{exp(in[1] * 2.0).expand({4, 6, 5}) * in[0]};
       }},
      {"transpose then slice",
       [](const Inputs& in) {
         return Inputs{relu(in[0] - 0.25).transpose(0, 2).slice(1, 0, 6, 3) * in[2].unsqueeze(1)};
       }},
  };
  for (const Case& c_ : cases) {
    Planned p = expect_planned_equals_eager(c_.fn, {a, b, c}, c_.what);
    expect_one_kernel(p, c_.what);
  }
}

TEST(ViewFusion, ChunkOfASumOfGemmsFusesWithTheGateActivations) {
  // An LSTM cell whose gates are x W + h U: the add of the two GEMM outputs is chunked, and each
  // chunk's add moves into the pointwise kernel.
  const int64_t batch = 5, input = 7, hidden = 6;
  Tensor x = testing::input({batch, input}), h = testing::input({batch, hidden}),
         w = testing::input({input, 4 * hidden}), u = testing::input({hidden, 4 * hidden}),
         c = testing::input({batch, hidden});
  Fn fn = [](const Inputs& in) {
    std::vector<Tensor> g = (in[0].mm(in[2]) + in[1].mm(in[3])).chunk(4, 1);
    Tensor i = sigmoid(g[0]), f = sigmoid(g[1]), cell = tanh(g[2]), o = sigmoid(g[3]);
    Tensor c2 = f * in[4] + i * cell;
    return Inputs{o * tanh(c2), c2};
  };
  Planned p = expect_planned_equals_eager(fn, {x, h, w, u, c}, "lstm cell, gates x W + h U");
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  // Two GEMMs and one kernel: nothing else computes.
  EXPECT_EQ(unfused_compute_steps(p) - p.plan->num_nodes() + p.plan->num_steps(), 3u)
      << p.graph->str();
}

TEST(ViewFusion, AViewOfAValueAlsoReadElsewhereIsNotPushed) {
  // e is read whole by a reduction: pushing the transpose would compute e twice.
  Tensor a = testing::input({6, 6});
  Fn fn = [](const Inputs& in) {
    Tensor e = exp(in[0]);
    return Inputs{e.t() + 1.0, e.sum({1})};
  };
  Planned p = expect_planned_equals_eager(fn, {a}, "shared value");
  EXPECT_NE(p.graph->str().find("exp("), std::string::npos);
  size_t exps = 0;
  for (const jit::Node* n = p.graph->first(); n; n = n->next()) exps += n->op().name == "exp";
  EXPECT_EQ(exps, 1u) << p.graph->str();
}

TEST(ViewFusion, ViewsLeadingToAGemmStayPut) {
  // The pieces feed GEMMs, which take strided operands: the add is computed once, whole.
  Tensor a = testing::input({4, 8}), b = testing::input({4, 8}), w = testing::input({4, 3});
  Fn fn = [](const Inputs& in) {
    std::vector<Tensor> s = (in[0] + in[1]).t().chunk(2, 0);
    return Inputs{s[0].mm(in[2]), s[1].mm(in[2])};
  };
  Planned p = expect_planned_equals_eager(fn, {a, b, w}, "pieces into GEMMs");
  size_t adds = 0;
  for (const jit::Node* n = p.graph->first(); n; n = n->next()) adds += n->op().name == "add";
  EXPECT_EQ(adds, 1u) << p.graph->str();
}

TEST(ViewFusion, OffWithFusionOff) {
  Tensor a = testing::input({3, 4});
  LazyGuard lazy(true);
  fuser::FusionGuard off(false);
  Tensor y = exp(a * 2.0).t() + 1.0;
  std::vector<detail::LazyRef> requests{y.impl()->storage->lazy};
  jit::LazyGraphBinding binding;
  auto graph = jit::build_graph(requests, &binding, false);
  jit::run_passes(*graph);
  EXPECT_NE(graph->str().find("transpose(%"), std::string::npos);
  EXPECT_EQ(graph->str().find("= exp(%") < graph->str().find("transpose("), true) << graph->str();
}

// An expand of a row reduction's result is read inside the kernel; a member of the full shape
// whose value is the same along each row is still stored for every element.
TEST(ViewFusion, AnExpandedRowValueIsReadInTheKernelAndStoredWhole) {
  Tensor x = testing::input({5, 7}), y = testing::input({5, 7});
  Fn fn = [](const Inputs& in) {
    Tensor row = in[0].sum({1}, true).expand({5, 7}) / 3.0;  // same along each row
    return Inputs{row, row * in[1] + in[0]};
  };
  Planned p = plan_of(fn, {x, y}, /*passes=*/true);
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  Inputs got = p.plan->run(p.binding.inputs);
  Inputs want = eager(fn, {x, y});
  for (size_t k = 0; k < 2; ++k)
    testing::expect_lazy_equal(got[k], want[k], "output " + std::to_string(k));
}

// ---------------------------------------------------------------------------- cat/stack exits
TEST(JoinFusion, CatOfFusedPiecesIsOneKernelWritingSlices) {
  Tensor a = testing::input({5, 3}), b = testing::input({5, 3}), c = testing::input({5, 3});
  for (int64_t dim : {0, 1, -1}) {
    Fn fn = [dim](const Inputs& in) {
      return Inputs{cat({sigmoid(in[0]), tanh(in[1]) * in[2], in[0] * in[1] + 1.0}, dim)};
    };
    Planned p = expect_planned_equals_eager(fn, {a, b, c}, "cat dim " + std::to_string(dim));
    expect_one_kernel(p, "cat dim " + std::to_string(dim));
    EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
  }
}

TEST(JoinFusion, StackAndPiecesThatAreInputsOrReadElsewhere) {
  Tensor a = testing::input({4, 5}), b = testing::input({4, 5});
  for (int64_t dim : {0, 1, 2}) {
    Fn fn = [dim](const Inputs& in) {
      Tensor s = exp(in[0]);
      // An input as a piece (copied by the kernel), a piece read again afterwards, and one
      // piece twice.
      return Inputs{stack({s, in[1], s * in[1], s}, dim), s + 2.0};
    };
    Planned p = expect_planned_equals_eager(fn, {a, b}, "stack dim " + std::to_string(dim));
    EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
  }
}

TEST(JoinFusion, LstmBackwardStyleGateGradientsCatIntoOneKernel) {
  // The four gate gradients of an LSTM cell, each elementwise in [batch, hidden], concatenated
  // into the gates' gradient: one kernel writes all four into one buffer.
  const int64_t batch = 3, hidden = 5;
  std::vector<Tensor> in;
  for (int k = 0; k < 6; ++k) in.push_back(testing::input({batch, hidden}));
  Fn fn = [](const Inputs& x) {
    Tensor i = x[0], f = x[1], g = x[2], o = x[3], dc = x[4], c = x[5];
    Tensor di = dc * g * i * (1.0 - i);
    Tensor df = dc * c * f * (1.0 - f);
    Tensor dg = dc * i * (1.0 - g * g);
    Tensor do_ = tanh(c) * o * (1.0 - o);
    return Inputs{cat({di, df, dg, do_}, 1)};
  };
  Planned p = expect_planned_equals_eager(fn, in, "gate gradients");
  expect_one_kernel(p, "gate gradients");
  EXPECT_EQ(p.plan->num_steps(), 1u) << p.graph->str();
}

TEST(JoinFusion, TwoCatsOfSharedPiecesAreOneKernel) {
  // A GRU cell's backward: the input GEMM's gate gradient cat(dr, dz, dn) and the hidden GEMM's
  // cat(dr, dz, r * dn) share pieces; one kernel writes both, each with its column sum (the two
  // bias gradients).
  const int64_t batch = 3, hidden = 5;
  std::vector<Tensor> in;
  for (int k = 0; k < 4; ++k) in.push_back(testing::input({batch, hidden}));
  Fn fn = [](const Inputs& x) {
    Tensor r = sigmoid(x[0]), z = sigmoid(x[1]), dn = x[2] * (1.0 - x[3] * x[3]);
    Tensor dr = dn * x[3] * r * (1.0 - r), dz = x[2] * z * (1.0 - z);
    Tensor gi = cat({dr, dz, dn}, 1), gh = cat({dr, dz, r * dn}, 1);
    return Inputs{gi, gh, gi.sum({0}), gh.sum({0})};
  };
  Planned p = expect_planned_equals_eager(fn, in, "two gate-gradient cats");
  expect_one_kernel(p, "two gate-gradient cats");
  EXPECT_EQ(p.plan->num_join_kernel_steps(), 1u) << p.graph->str();
  // A cat along another dim stays a step of its own (here the reference cat, reading the pieces
  // the kernel wrote for it).
  Fn two_dims = [](const Inputs& x) {
    Tensor a = exp(x[0]), b = x[1] * x[2];
    return Inputs{cat({a, b}, 1), cat({a, b}, 0)};
  };
  Planned q = expect_planned_equals_eager(two_dims, in, "cats along dims 1 and 0");
  EXPECT_EQ(q.plan->num_kernel_steps(), 1u) << q.graph->str();
  EXPECT_EQ(q.plan->num_steps(), 2u) << q.graph->str();
}

TEST(JoinFusion, CatWithMismatchedPiecesRunsTheReferenceKernel) {
  Tensor a = testing::input({2, 3}), b = testing::input({2, 4});
  Fn fn = [](const Inputs& in) { return Inputs{cat({exp(in[0]), exp(in[1])}, 1)}; };
  Planned p = expect_planned_equals_eager(fn, {a, b}, "pieces of two widths");
  EXPECT_EQ(p.plan->num_kernel_steps(), 0u) << p.graph->str();
}

TEST(JoinFusion, EmptyPieces) {
  Tensor a = testing::input({0, 3}), b = testing::input({0, 3});
  Fn fn = [](const Inputs& in) { return Inputs{cat({exp(in[0]), in[0] * in[1]}, 1)}; };
  Planned p = expect_planned_equals_eager(fn, {a, b}, "empty pieces");
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u);
}

// -------------------------------------------------------------------------------- random programs
// A random program over values of shape [m, n] (and views of them): elementwise ops, views of
// intermediate values (transpose, slice, select, narrow, expand, permute through unsqueeze),
// chunk, and cat/stack of equal-shaped values. Returns the last values made.
Inputs random_program(const Inputs& in, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Tensor> pool(in.begin(), in.end());
  auto any = [&]() -> Tensor& { return pool[static_cast<size_t>(pick(0, int(pool.size()) - 1))]; };
  // A value of pool with the shape of t, or t itself.
  auto partner = [&](const Tensor& t) -> Tensor {
    std::vector<size_t> same;
    for (size_t i = 0; i < pool.size(); ++i)
      if (pool[i].sizes() == t.sizes()) same.push_back(i);
    return pool[same[static_cast<size_t>(pick(0, int(same.size()) - 1))]];
  };
  const int steps = pick(3, 10);
  for (int s = 0; s < steps; ++s) {
    Tensor a = any();
    Tensor out;
    switch (pick(0, 9)) {
      case 0:
      case 1: {
        Tensor b = partner(a);
        out = testing::elementwise_op(pick(0, 22), a, b, pick(0, 6));
        break;
      }
      case 2:
        out = a.dim() >= 2 ? a.transpose(0, a.dim() - 1) : exp(a);
        break;
      case 3:
        if (a.dim() >= 1 && a.size(0) > 1) {
          out = a.slice(0, pick(0, 1), a.size(0), pick(1, 2));
        } else {
          out = sigmoid(a);
        }
        break;
      case 4:
        out = a.dim() >= 2 && a.size(-1) >= 1 ? a.select(a.dim() - 1, pick(0, int(a.size(-1)) - 1))
                                              : tanh(a);
        break;
      case 5: {
        Shape sizes{2};
        sizes.insert(sizes.end(), a.sizes().begin(), a.sizes().end());
        out = a.unsqueeze(0).expand(sizes);
        break;
      }
      case 6:
        if (a.dim() >= 1 && a.size(-1) >= 2) {
          std::vector<Tensor> pieces = a.chunk(2, -1);
          pool.insert(pool.end(), pieces.begin(), pieces.end());
          out = pieces.back() * 2.0;
        } else {
          out = neg(a);
        }
        break;
      case 7: {
        Tensor b = partner(a);
        if (a.dim() >= 1 && pick(0, 1)) {
          out = cat({a * 0.5, b, exp(b)}, pick(0, int(a.dim()) - 1));
        } else {
          out = stack({a, b + 1.0}, pick(0, int(a.dim())));
        }
        break;
      }
      case 8:
        out = a.dim() == 3 ? a.permute({1, 2, 0}) : a.unsqueeze(a.dim()) * 1.5;
        break;
      default:
        out = testing::elementwise_op(pick(0, 14), a, a, pick(0, 6));
        break;
    }
    pool.push_back(out);
  }
  // Elementwise consumers of the last values, so that views and joins sit between fused nodes.
  Inputs result;
  for (size_t k = pool.size() - 2; k < pool.size(); ++k) result.push_back(pool[k] * 2.0);
  return result;
}

// What the random programs exercised: views pushed into kernels and kernels ending in a join.
struct Coverage {
  int64_t pushed_views = 0;
  int64_t join_kernels = 0;
  int64_t programs = 0;
};

int64_t pushed_views_so_far() {
  for (const jit::PassProfileEntry& e : jit::pass_profile())
    if (e.pass == "push_views") {
      auto it = e.rewrites.find("view pushed through an elementwise op");
      return it == e.rewrites.end() ? 0 : it->second;
    }
  return 0;
}

Coverage run_random(uint64_t seed, int programs) {
  Coverage cov;
  const int64_t pushed_before = pushed_views_so_far();
  std::mt19937_64 rng(seed);
  for (int i = 0; i < programs; ++i) {
    const uint64_t program_seed = rng();
    const int64_t m = std::uniform_int_distribution<int64_t>(0, 5)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 6)(rng);
    Inputs in = {testing::input({m, n}, kFloat32, -3, 3), testing::input({m, n}, kFloat32, -3, 3),
                 testing::input({m, n}, kFloat64, -3, 3).to(kFloat32).t().contiguous().t()};
    if (in[2].sizes() != in[0].sizes()) in[2] = testing::input({m, n}, kFloat32, -3, 3);
    Fn fn = [program_seed](const Inputs& x) { return random_program(x, program_seed); };
    const std::string what = "seed " + std::to_string(seed) + ", program " + std::to_string(i) +
                             " (" + std::to_string(program_seed) + ")";
    bool eager_ok = true;
    try {
      eager(fn, in);
    } catch (const Error&) {
      eager_ok = false;  // an op that does not take these dtypes: the program is skipped
    }
    if (!eager_ok) continue;
    Planned p = expect_planned_equals_eager(fn, in, what);
    ++cov.programs;
    cov.join_kernels += static_cast<int64_t>(p.plan->num_join_kernel_steps());
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "failed at " << what;
      break;
    }
  }
  cov.pushed_views = pushed_views_so_far() - pushed_before;
  return cov;
}

TEST(ViewJoinRandom, TwoThousandProgramsWithAFixedSeedMatchEager) {
  const int programs = static_cast<int>(testing::scaled(2000, 200));  // KILN_TEST_SCALE
  const Coverage cov = run_random(20261122, programs);
  std::cout << cov.programs << " programs ran, " << cov.pushed_views << " views pushed, "
            << cov.join_kernels << " kernels ending in a join\n";
  // The generator reaches what this test is about.
  EXPECT_GE(cov.programs, programs * 3 / 4);
  EXPECT_GE(cov.pushed_views, programs / 4);
  EXPECT_GE(cov.join_kernels, programs * 3 / 20);
}

TEST(ViewJoinRandom, FreshSeedTimeBoxed) {
  const char* env = std::getenv("KILN_FUZZ_SECONDS");
  const double seconds = env ? std::atof(env) : 5.0;
  // KILN_FUZZ_SEED replays a failure's seed.
  const char* fixed = std::getenv("KILN_FUZZ_SEED");
  const uint64_t seed = fixed ? std::strtoull(fixed, nullptr, 10) : std::random_device{}();
  std::cout << "ViewJoinRandom seed " << seed << "\n";
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 rng(seed);
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         seconds) {
    run_random(rng(), 20);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "fresh seed " << seed;
      return;
    }
  }
}

}  // namespace
}  // namespace kiln
