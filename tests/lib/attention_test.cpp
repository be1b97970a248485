// Tests of attention: scaled_dot_product_attention against a float64 loop reference (random
// shapes, length-1 sequences, a transposed query, causal, bool and float masks, a fully masked row
// giving zeros as torch >= 2.5), its gradients by finite differences, traced against eager, one
// fused kernel between the two GEMMs; MultiheadAttention and TransformerEncoderLayer against
// references composed here from the same weights; and bad input raising kiln::Error naming the op
// and shapes.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/testing.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::Inputs;
using testing::random_tensor;
using testing::values;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { None, Bool, Float, Causal };

struct SdpaCase {
  Shape batch;
  int64_t L, S, E, Ev;
  MaskKind mask = MaskKind::None;
  Shape mask_shape;  // broadcasts to batch + [L, S]
};

Shape with(Shape batch, std::initializer_list<int64_t> tail) {
  batch.insert(batch.end(), tail);
  return batch;
}

// softmax(q k^T * scale + mask) v in double, one (batch, query) row at a time. A row whose
// scores are all -inf is zeros, as torch >= 2.5's "safe" softmax makes it.
std::vector<double> reference_sdpa(const SdpaCase& c, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& mask, double scale) {
  const std::vector<double> qv = values(q), kv = values(k), vv = values(v);
  const std::vector<double> mv = mask.defined() ? values(mask) : std::vector<double>{};
  const Shape scores_shape = with(c.batch, {c.L, c.S});
  int64_t B = 1;
  for (int64_t d : c.batch) B *= d;
  std::vector<double> out(B * c.L * c.Ev);
  std::vector<double> s(c.S);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < c.L; ++i) {
      double m = -kInf;
      for (int64_t j = 0; j < c.S; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < c.E; ++e)
          dot += qv[(b * c.L + i) * c.E + e] * kv[(b * c.S + j) * c.E + e];
        s[j] = dot * scale;
        if (c.mask == MaskKind::Causal && j > i) s[j] = -kInf;
        if (c.mask == MaskKind::Bool || c.mask == MaskKind::Float) {
          std::vector<int64_t> index = testing::unravel((b * c.L + i) * c.S + j, scores_shape);
          const double mval = testing::broadcast_at(mask, mv, index, scores_shape);
          s[j] = c.mask == MaskKind::Bool ? (mval != 0 ? s[j] : -kInf) : s[j] + mval;
        }
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < c.S; ++j) sum += s[j] = std::exp(s[j] - m);
      for (int64_t o = 0; o < c.Ev; ++o) {
        double acc = 0;
        if (m == -kInf) {  // every key masked
          out[(b * c.L + i) * c.Ev + o] = 0;
          continue;
        }
        for (int64_t j = 0; j < c.S; ++j) acc += s[j] / sum * vv[(b * c.S + j) * c.Ev + o];
        out[(b * c.L + i) * c.Ev + o] = acc;
      }
    }
  }
  return out;
}

Tensor make_mask(const SdpaCase& c, DType dtype) {
  if (c.mask == MaskKind::Bool) return random_tensor(c.mask_shape, kBool);
  if (c.mask == MaskKind::Float) return random_tensor(c.mask_shape, dtype, -2, 2);
  return {};
}

void check_sdpa(const SdpaCase& c, DType dtype, bool transposed_query, const std::string& what) {
  SCOPED_TRACE(what);
  Tensor q = transposed_query
                 ? random_tensor(with(c.batch, {c.E, c.L}), dtype, -1, 1).transpose(-2, -1)
                 : random_tensor(with(c.batch, {c.L, c.E}), dtype, -1, 1);
  Tensor k = random_tensor(with(c.batch, {c.S, c.E}), dtype, -1, 1);
  Tensor v = random_tensor(with(c.batch, {c.S, c.Ev}), dtype, -1, 1);
  Tensor mask = make_mask(c, dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));
  Tensor got = scaled_dot_product_attention(q, k, v, mask, 0.0, c.mask == MaskKind::Causal);
  const double tol = dtype == kFloat64 ? 1e-12 : 1e-5;
  expect_close(got, reference_sdpa(c, q, k, v, mask, scale), with(c.batch, {c.L, c.Ev}), dtype, tol,
               tol);
}

TEST(ScaledDotProductAttention, MatchesFloat64ReferenceOnRandomShapes) {
  std::mt19937_64& gen = testing::rng();
  auto size = [&](int64_t hi) { return static_cast<int64_t>(gen() % hi) + 1; };
  for (int trial = 0; trial < 40; ++trial) {
    SdpaCase c;
    const int rank = static_cast<int>(gen() % 3);
    for (int d = 0; d < rank; ++d) c.batch.push_back(size(3));
    // L or S of 1 every few trials.
    c.L = trial % 5 == 1 ? 1 : size(7);
    c.S = trial % 5 == 2 ? 1 : size(7);
    c.E = size(6);
    c.Ev = size(5);
    c.mask = static_cast<MaskKind>(trial % 4);
    // Masks of full rank, [L, S], or with broadcast size-1 dims.
    c.mask_shape = trial % 3 == 0   ? with(c.batch, {c.L, c.S})
                   : trial % 3 == 1 ? Shape{c.L, c.S}
                                    : Shape{1, c.S};
    for (DType dtype : {kFloat32, kFloat64})
      check_sdpa(c, dtype, trial % 2 == 0,
                 "trial " + std::to_string(trial) + " " + dtype_name(dtype));
  }
}

TEST(ScaledDotProductAttention, EdgeShapes) {
  // Batch 1, L = S = 1, one embedding channel; causal with more keys than queries (top-left
  // aligned, as torch's tril) and with more queries than keys.
  const std::vector<SdpaCase> cases = {
      {{1}, 1, 1, 1, 1, MaskKind::None, {}},        {{1}, 1, 5, 3, 2, MaskKind::None, {}},
      {{}, 4, 1, 3, 2, MaskKind::Causal, {}},       {{2}, 3, 6, 4, 4, MaskKind::Causal, {}},
      {{2, 1}, 6, 3, 2, 3, MaskKind::Causal, {}},   {{3}, 2, 4, 5, 1, MaskKind::Float, {4}},
      {{1}, 5, 5, 8, 8, MaskKind::Bool, {1, 5, 5}},
  };
  for (size_t i = 0; i < cases.size(); ++i)
    for (bool transposed : {false, true})
      check_sdpa(cases[i], kFloat32, transposed, "case " + std::to_string(i));
}

// A query that may attend to no key (its bool mask row all false, or its float mask row all -inf)
// gets zeros, as torch >= 2.5's scaled_dot_product_attention gives (torch 2.0-2.4: NaN), and its
// gradients stay finite: zero for that query, and the other rows' as without it.
TEST(ScaledDotProductAttention, FullyMaskedRowIsZeroAsTorch) {
  // Query row 1 may attend to nothing; the others to keys 0 and 3.
  std::vector<bool> allowed(15, false);
  for (int64_t i : {0, 2})
    for (int64_t j : {0, 3}) allowed[i * 5 + j] = true;
  Tensor fmask = zeros({3, 5}, kFloat64);
  fmask.narrow(0, 1, 1).fill_(-kInf);
  const Tensor q0 = random_tensor({2, 3, 4}, kFloat64), k0 = random_tensor({2, 5, 4}, kFloat64);
  const Tensor v0 = random_tensor({2, 5, 2}, kFloat64);
  for (bool bool_mask : {true, false}) {
    SCOPED_TRACE(bool_mask ? "bool mask" : "float mask");
    Tensor mask = bool_mask ? from_vector(allowed, Shape{3, 5}) : fmask.clone();
    Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    Tensor v = v0.clone().requires_grad_(true);
    if (!bool_mask) mask.requires_grad_(true);
    Tensor out = scaled_dot_product_attention(q, k, v, mask);
    const SdpaCase c{{2}, 3, 5, 4, 2, bool_mask ? MaskKind::Bool : MaskKind::Float, {3, 5}};
    expect_close(out, reference_sdpa(c, q0, k0, v0, mask.detach(), 0.5), {2, 3, 2}, kFloat64, 1e-12,
                 1e-12);
    for (double x : values(out.select(1, 1))) EXPECT_EQ(x, 0.0);
    (out * out).sum().backward();
    for (double x : values(q.grad().select(1, 1))) EXPECT_EQ(x, 0.0);
    for (const Tensor& g : {q.grad(), k.grad(), v.grad()})
      for (double x : values(g)) EXPECT_TRUE(std::isfinite(x));
    if (!bool_mask)
      for (double x : values(mask.grad())) EXPECT_TRUE(std::isfinite(x));
    // The other rows' gradients are those of the attention without the masked query.
    Tensor q2 = q0.narrow(1, 0, 1).clone().requires_grad_(true);
    Tensor row0 = scaled_dot_product_attention(q2, k0, v0, mask.detach().narrow(0, 0, 1));
    (row0 * row0).sum().backward();
    expect_close(q.grad().narrow(1, 0, 1), values(q2.grad()), {2, 1, 4}, kFloat64, 1e-12, 1e-12);
  }
}

TEST(ScaledDotProductAttention, ExplicitScaleAndDropout) {
  SdpaCase c{{2}, 3, 4, 5, 2, MaskKind::None, {}};
  Tensor q = random_tensor({2, 3, 5}, kFloat64), k = random_tensor({2, 4, 5}, kFloat64);
  Tensor v = random_tensor({2, 4, 2}, kFloat64);
  expect_close(scaled_dot_product_attention(q, k, v, {}, 0.0, false, 0.7),
               reference_sdpa(c, q, k, v, {}, 0.7), {2, 3, 2}, kFloat64, 1e-12, 1e-12);
  // Dropout of every weight leaves zeros; of some, a different result.
  Tensor all = scaled_dot_product_attention(q, k, v, {}, 1.0);
  for (double x : values(all)) EXPECT_EQ(x, 0.0);
  manual_seed(3);
  Tensor some = scaled_dot_product_attention(q, k, v, {}, 0.5);
  EXPECT_FALSE(allclose(some, scaled_dot_product_attention(q, k, v)));
}

TEST(ScaledDotProductAttention, Gradcheck) {
  Tensor q = random_tensor({2, 3, 4}, kFloat64).requires_grad_(true);
  Tensor k = random_tensor({2, 5, 4}, kFloat64).requires_grad_(true);
  Tensor v = random_tensor({2, 5, 3}, kFloat64).requires_grad_(true);
  Tensor fmask = random_tensor({3, 5}, kFloat64).requires_grad_(true);
  Tensor bmask = random_tensor({2, 3, 5}, kBool);
  bmask.select(2, 0).fill_(true);  // every query attends to something
  EXPECT_TRUE(testing::gradcheck(
      [](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
      {q, k, v}));
  EXPECT_TRUE(testing::gradcheck(
      [](const Inputs& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], in[3], 0.0, false, 0.3);
      },
      {q, k, v, fmask}));
  EXPECT_TRUE(testing::gradcheck(
      [bmask](const Inputs& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], bmask);
      },
      {q, k, v}));
  EXPECT_TRUE(testing::gradcheck(
      [](const Inputs& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, /*is_causal=*/true);
      },
      {q, k, v}));
}

// The forward and the gradients, traced once and replayed on new inputs, equal eager mode's: in
// float64 within lazy mode's tolerance (summation order), in float32 the forward too, and the
// gradients (a softmax backward between GEMMs whose operand layouts differ) within 1e-4.
TEST(ScaledDotProductAttention, TracedEqualsEager) {
  for (DType dtype : {kFloat64, kFloat32}) {
    for (MaskKind kind : {MaskKind::None, MaskKind::Bool, MaskKind::Float, MaskKind::Causal}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " mask kind " +
                   std::to_string(static_cast<int>(kind)));
      const bool masked = kind == MaskKind::Bool || kind == MaskKind::Float;
      auto fn = [kind, masked](const Inputs& in) {
        Tensor q = in[0].detach().requires_grad_(true), k = in[1].detach().requires_grad_(true);
        Tensor out = scaled_dot_product_attention(q, k, in[2], masked ? in[3] : Tensor(), 0.0,
                                                  kind == MaskKind::Causal);
        (out * out).sum().backward();
        return Inputs{out, q.grad(), k.grad()};
      };
      auto inputs = [kind, dtype] {
        Tensor mask = kind == MaskKind::Bool ? random_tensor({1, 6}, kBool)
                                             : random_tensor({4, 6}, dtype, -1, 1);
        if (kind == MaskKind::Bool) mask.narrow(1, 0, 1).fill_(true);
        Tensor v = random_tensor({2, 3, 5, 6}, dtype).transpose(-2, -1);  // a transposed value
        return Inputs{random_tensor({2, 3, 4, 8}, dtype), random_tensor({2, 3, 6, 8}, dtype), v,
                      mask};
      };
      jit::Function traced = jit::trace(fn, inputs());
      for (int call = 0; call < 2; ++call) {
        Inputs in = inputs();
        Inputs got = traced(in);
        Inputs want;
        {
          LazyGuard eager(false);
          want = fn(in);
        }
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const std::string what = "output " + std::to_string(i);
          if (dtype == kFloat64 || i == 0)
            testing::expect_lazy_equal(got[i], want[i], what);
          else
            EXPECT_TRUE(allclose(got[i], want[i], 1e-4, 1e-5)) << what;
        }
      }
    }
  }
}

// Scaling, masking and softmax are one kernel between the two GEMMs.
TEST(ScaledDotProductAttention, ScoresMaskAndSoftmaxAreOneKernel) {
  for (MaskKind kind : {MaskKind::None, MaskKind::Bool, MaskKind::Float, MaskKind::Causal}) {
    Tensor mask = kind == MaskKind::Bool    ? testing::input({5, 7}, kBool)
                  : kind == MaskKind::Float ? testing::input({2, 1, 5, 7})
                                            : testing::input({1});
    testing::Fn fn = [kind](const Inputs& in) {
      return Inputs{scaled_dot_product_attention(
          in[0], in[1], in[2], kind == MaskKind::Bool || kind == MaskKind::Float ? in[3] : Tensor(),
          0.0, kind == MaskKind::Causal)};
    };
    const Inputs inputs = {testing::input({2, 3, 5, 4}), testing::input({2, 3, 7, 4}),
                           testing::input({2, 3, 7, 6}), mask};
    testing::Planned p = testing::plan_of(fn, inputs);
    int64_t gemms = 0;
    for (const jit::Node* n : p.graph->nodes())
      if (n->op().name == "matmul") ++gemms;
    EXPECT_EQ(gemms, 2) << p.graph->str();
    EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << p.graph->str();
    // Nothing else runs: k's transpose is a strided read of the first GEMM, and the causal
    // mask's comparison is computed inside the kernel.
    EXPECT_EQ(p.plan->num_steps(), 3u) << p.graph->str();
    Inputs got = p.plan->run(p.binding.inputs);
    Inputs want = testing::eager(fn, inputs);
    testing::expect_lazy_equal(got[0], want[0], "fused against eager");
  }
}

TEST(ScaledDotProductAttention, BadInputNamesOpAndShapes) {
  Tensor q = random_tensor({2, 3, 4}), k = random_tensor({2, 5, 4}), v = random_tensor({2, 5, 6});
  const std::string op = "scaled_dot_product_attention";
  expect_error(
      [&] {
        scaled_dot_product_attention(q, random_tensor({2, 5, 3}), v);
      },
      {op, "[2, 3, 4]", "[2, 5, 3]", "embedding"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, random_tensor({2, 4, 6}));
      },
      {op, "[2, 5, 4]", "[2, 4, 6]", "sequence"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, random_tensor({3, 5, 4}), v);
      },
      {op, "[2, 3, 4]", "[3, 5, 4]", "broadcast"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, v, random_tensor({3, 4}, kBool));
      },
      {op, "attn_mask", "[3, 4]", "[2, 3, 5]"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, v, random_tensor({3, 5}, kFloat64));
      },
      {op, "attn_mask", "float64[3, 5]", "float32"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, v, random_tensor({3, 5}, kBool), 0.0, true);
      },
      {op, "is_causal"});
  expect_error([&] { scaled_dot_product_attention(q, k.to(kFloat64), v); },
               {op, "float64[2, 5, 4]", "dtype"});
  expect_error([&] { scaled_dot_product_attention(random_tensor({4}), k, v); },
               {op, "query", "[4]"});
  expect_error([&] { scaled_dot_product_attention(q, k, v, {}, 1.5); }, {op, "dropout_p"});
}

// ------------------------------------------------------------------------ MultiheadAttention

// torch's multi-head attention written out in float64 from the module's weights, eagerly:
// projections, heads, softmax(q k^T / sqrt(d) + mask) v, out projection. Inputs batch-major
// [N, seq, E]; attn_mask additive [L, S] (or undefined); padding bool [N, S] (or undefined).
std::pair<Tensor, Tensor> reference_mha(const nn::MultiheadAttention& m, const Tensor& query,
                                        const Tensor& key, const Tensor& value,
                                        const Tensor& attn_mask, const Tensor& padding) {
  LazyGuard eager(false);
  NoGradGuard no_grad;
  const int64_t E = m.options.embed_dim, H = m.options.num_heads, D = E / H;
  const Tensor W = m.in_proj_weight.to(kFloat64), b = m.in_proj_bias.to(kFloat64);
  auto project = [&](const Tensor& x, int64_t i) {
    Tensor y = matmul(x.to(kFloat64), W.narrow(0, i * E, E).t()) + b.narrow(0, i * E, E);
    return y.reshape({y.size(0), y.size(1), H, D}).permute({0, 2, 1, 3});  // [N, H, seq, D]
  };
  Tensor q = project(query, 0), k = project(key, 1), v = project(value, 2);
  Tensor scores = matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
  if (attn_mask.defined()) scores = scores + attn_mask.to(kFloat64);
  if (padding.defined())
    scores = scores.masked_fill(padding.reshape({padding.size(0), 1, 1, padding.size(1)}), -kInf);
  Tensor w = softmax(scores, -1);
  Tensor heads = matmul(w, v).permute({0, 2, 1, 3}).reshape({query.size(0), query.size(1), E});
  Tensor out = matmul(heads, m.out_proj->weight.to(kFloat64).t()) + m.out_proj->bias.to(kFloat64);
  return {out, w.mean({1})};
}

TEST(MultiheadAttention, ParametersAsTorch) {
  nn::MultiheadAttention m(8, 2);
  std::vector<std::string> names;
  for (const auto& [name, t] : m.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                             "out_proj.bias"}));
  EXPECT_EQ(m.in_proj_weight.sizes(), (Shape{24, 8}));
  EXPECT_EQ(m.head_dim, 4);
  for (double x : values(m.in_proj_bias)) EXPECT_EQ(x, 0.0);
  for (double x : values(m.out_proj->bias)) EXPECT_EQ(x, 0.0);
  const double bound = std::sqrt(6.0 / 32.0);  // xavier uniform over fan_in 8 + fan_out 24
  for (double x : values(m.in_proj_weight)) EXPECT_LE(std::abs(x), bound);
  expect_error([] { nn::MultiheadAttention(10, 3); }, {"MultiheadAttention", "divisible", "10"});
}

TEST(MultiheadAttention, MatchesComposedReference) {
  const int64_t N = 2, L = 3, S = 5, E = 8, H = 2;
  for (bool batch_first : {false, true}) {
    for (bool self : {false, true}) {
      SCOPED_TRACE(std::string(batch_first ? "batch_first" : "seq_first") +
                   (self ? " self" : " cross"));
      nn::MultiheadAttentionOptions o(E, H);
      o.batch_first = batch_first;
      nn::MultiheadAttention m(o);
      {
        NoGradGuard no_grad;  // nonzero biases, so that their use is checked
        m.in_proj_bias.copy_(random_tensor({3 * E}, kFloat32, -0.5, 0.5));
        m.out_proj->bias.copy_(random_tensor({E}, kFloat32, -0.5, 0.5));
      }
      const int64_t Sk = self ? L : S;
      Tensor q = random_tensor({N, L, E}), k = self ? q : random_tensor({N, Sk, E});
      Tensor v = self ? q : random_tensor({N, Sk, E});
      Tensor attn_mask = random_tensor({L, Sk}, kFloat32, -1, 1);
      Tensor padding = zeros({N, Sk}, kBool);
      padding.select(1, Sk - 1).fill_(true);  // the last key is padding
      auto layout = [&](const Tensor& t) { return batch_first ? t : t.transpose(0, 1); };
      Tensor lq = layout(q);
      Tensor lk = self ? lq : layout(k), lv = self ? lq : layout(v);
      nn::MultiheadAttentionOutput got = m.forward(lq, lk, lv, padding, true, attn_mask);
      auto [want_out, want_w] = reference_mha(m, q, k, v, attn_mask, padding);
      expect_close(got.output, values(layout(want_out)), layout(want_out).sizes(), kFloat32, 1e-5,
                   1e-5);
      expect_close(got.weights, values(want_w), {N, L, Sk}, kFloat32, 1e-5, 1e-6);
      // A bool attn_mask (true = may not attend) gives what the same -inf float mask gives.
      Tensor blocked = random_tensor({L, Sk}, kBool);
      blocked.select(1, 0).fill_(false);
      Tensor as_float = zeros({L, Sk}).masked_fill(blocked, -kInf);
      EXPECT_TRUE(allclose(m.forward(lq, lk, lv, {}, false, blocked).output,
                           m.forward(lq, lk, lv, {}, false, as_float).output));
      EXPECT_FALSE(m.forward(lq, lk, lv, {}, false).weights.defined());
    }
  }
}

TEST(MultiheadAttention, UnbatchedPerHeadMaskAndWeightsPerHead) {
  nn::MultiheadAttention m(6, 3);
  Tensor x = random_tensor({4, 6});
  nn::MultiheadAttentionOutput unbatched = m.forward(x, x, x);
  nn::MultiheadAttentionOutput batched = m.forward(x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1));
  EXPECT_EQ(unbatched.output.sizes(), (Shape{4, 6}));
  EXPECT_EQ(unbatched.weights.sizes(), (Shape{4, 4}));
  EXPECT_TRUE(allclose(unbatched.output, batched.output.squeeze(1), 1e-5, 1e-6));
  // A per-head mask [N * H, L, S] equal for every head is the [L, S] mask.
  Tensor mask = random_tensor({4, 4}, kFloat32, -1, 1);
  Tensor xb = x.unsqueeze(1);
  auto per_head = m.forward(xb, xb, xb, {}, true, mask.unsqueeze(0).expand({3, 4, 4}), false);
  auto shared = m.forward(xb, xb, xb, {}, true, mask, false);
  EXPECT_EQ(per_head.weights.sizes(), (Shape{1, 3, 4, 4}));
  EXPECT_TRUE(allclose(per_head.weights, shared.weights, 1e-5, 1e-6));
  expect_error(
      [&] {
        m.forward(xb, xb, xb, {}, true, random_tensor({4, 5}));
      },
      {"MultiheadAttention", "attn_mask", "[4, 4]", "[3, 4, 4]", "[4, 5]"});
  expect_error(
      [&] {
        m.forward(xb, xb, xb, zeros({2, 4}, kBool));
      },
      {"MultiheadAttention", "key_padding_mask", "[1, 4]", "[2, 4]"});
  expect_error(
      [&] {
        m.forward(random_tensor({4, 1, 5}), xb, xb);
      },
      {"MultiheadAttention", "query", "[4, 1, 5]"});
}

// A query that may attend to no key, as torch 2.15's module gives it: with need_weights its own
// softmax makes the query's output and weights NaN; without, it calls scaled_dot_product_attention,
// whose zeros leave out_proj's bias as the query's output.
TEST(MultiheadAttention, FullyMaskedQueryNaNWithWeightsZeroWithout) {
  const int64_t L = 3, N = 2, E = 8;
  nn::MultiheadAttention m(E, 2);
  {
    NoGradGuard no_grad;
    m.out_proj->bias.copy_(random_tensor({E}, kFloat32, -0.5, 0.5));
  }
  const std::vector<double> bias = values(m.out_proj->bias);
  Tensor x = random_tensor({L, N, E});  // [seq, batch, embed]
  Tensor blocked = zeros({L, L}, kBool);
  blocked.select(0, 1).fill_(true);  // query 1 may attend to nothing
  nn::MultiheadAttentionOutput with = m.forward(x, x, x, {}, true, blocked);
  nn::MultiheadAttentionOutput without = m.forward(x, x, x, {}, false, blocked);
  for (double y : values(with.output.select(0, 1))) EXPECT_TRUE(std::isnan(y));
  for (double y : values(with.weights.select(1, 1))) EXPECT_TRUE(std::isnan(y));
  const std::vector<double> row = values(without.output.select(0, 1));
  for (size_t i = 0; i < row.size(); ++i) EXPECT_NEAR(row[i], bias[i % E], 1e-6) << i;
  for (int64_t i : {0, 2}) {
    for (double y : values(with.output.select(0, i))) EXPECT_TRUE(std::isfinite(y));
    EXPECT_TRUE(allclose(with.output.select(0, i), without.output.select(0, i), 1e-5, 1e-6));
  }
  // Every key of batch 1 padding: all its queries alike.
  Tensor padding = zeros({N, L}, kBool);
  padding.select(0, 1).fill_(true);
  for (double y : values(m.forward(x, x, x, padding, true).output.select(1, 1)))
    EXPECT_TRUE(std::isnan(y));
  const std::vector<double> padded = values(m.forward(x, x, x, padding, false).output.select(1, 1));
  for (size_t i = 0; i < padded.size(); ++i) EXPECT_NEAR(padded[i], bias[i % E], 1e-6) << i;
}

// ------------------------------------------------------------------------ TransformerEncoderLayer

// The layer's two blocks written out from its own submodules' weights (eval: no dropout).
Tensor reference_encoder_layer(nn::TransformerEncoderLayer& l, const Tensor& src) {
  LazyGuard eager(false);
  NoGradGuard no_grad;
  auto norm = [](const nn::LayerNorm& n, const Tensor& x) {
    return layer_norm(x, n.normalized_shape, n.weight.to(kFloat64), n.bias.to(kFloat64), n.eps);
  };
  auto sa = [&](const Tensor& x) { return reference_mha(*l.self_attn, x, x, x, {}, {}).first; };
  auto ff = [&](const Tensor& x) {
    Tensor h = matmul(x, l.linear1->weight.to(kFloat64).t()) + l.linear1->bias.to(kFloat64);
    h = l.options.activation == "gelu" ? gelu(h) : relu(h);
    return matmul(h, l.linear2->weight.to(kFloat64).t()) + l.linear2->bias.to(kFloat64);
  };
  Tensor x = src.to(kFloat64);
  if (l.options.norm_first) {
    x = x + sa(norm(*l.norm1, x));
    return x + ff(norm(*l.norm2, x));
  }
  x = norm(*l.norm1, x + sa(x));
  return norm(*l.norm2, x + ff(x));
}

TEST(TransformerEncoderLayer, ForwardPostNormAndPreNorm) {
  for (bool norm_first : {false, true}) {
    for (std::string activation : {"relu", "gelu"}) {
      SCOPED_TRACE(std::string(norm_first ? "norm_first " : "post-norm ") + activation);
      nn::TransformerEncoderLayerOptions o(8, 2);
      o.dim_feedforward = 16;
      o.norm_first = norm_first;
      o.activation = activation;
      o.batch_first = true;
      nn::TransformerEncoderLayer layer(o);
      layer.eval();
      {
        NoGradGuard no_grad;
        layer.norm1->weight.copy_(random_tensor({8}, kFloat32, 0.5, 1.5));
        layer.norm2->bias.copy_(random_tensor({8}, kFloat32, -0.5, 0.5));
      }
      Tensor src = random_tensor({2, 5, 8});
      Tensor want = reference_encoder_layer(layer, src);
      expect_close(layer.forward(src), values(want), {2, 5, 8}, kFloat32, 1e-4, 1e-5);
      // Training mode with dropout draws masks: a different result, the same shape.
      layer.train();
      manual_seed(1);
      Tensor dropped = layer.forward(src);
      EXPECT_EQ(dropped.sizes(), (Shape{2, 5, 8}));
      EXPECT_FALSE(allclose(dropped, want.to(kFloat32), 1e-4, 1e-5));
    }
  }
  std::vector<std::string> names;
  nn::TransformerEncoderLayer layer(4, 2);
  for (const auto& [name, t] : layer.named_parameters()) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}));
  EXPECT_EQ(layer.linear1->weight.sizes(), (Shape{2048, 4}));
  nn::TransformerEncoderLayerOptions bad(4, 2);
  bad.activation = "tanh";
  expect_error([&] { nn::TransformerEncoderLayer l(bad); }, {"TransformerEncoderLayer", "tanh"});
}

TEST(TransformerEncoder, CopiesTheLayerAndRunsInOrder) {
  nn::TransformerEncoderLayerOptions o(8, 2);
  o.dim_feedforward = 12;
  auto layer = std::make_shared<nn::TransformerEncoderLayer>(o);
  nn::TransformerEncoder encoder(layer, 2, std::make_shared<nn::LayerNorm>(Shape{8}));
  encoder.eval();
  ASSERT_EQ(encoder.layers.size(), 2u);
  StateDict sd = encoder.state_dict();
  EXPECT_TRUE(sd.contains("layers.1.self_attn.in_proj_weight"));
  EXPECT_TRUE(sd.contains("norm.weight"));
  EXPECT_TRUE(equal(encoder.layers[1]->linear1->weight, layer->linear1->weight));
  EXPECT_FALSE(encoder.layers[1]->linear1->weight.is_same(layer->linear1->weight));
  Tensor src = random_tensor({5, 2, 8});
  Tensor mask = zeros({5, 5}).masked_fill(ones({5, 5}, kBool).triu(1), -kInf);  // causal
  Tensor want = encoder.norm->forward(
      encoder.layers[1]->forward(encoder.layers[0]->forward(src, mask), mask));
  EXPECT_TRUE(equal(encoder.forward(src, mask), want));
}

}  // namespace
}  // namespace kiln
