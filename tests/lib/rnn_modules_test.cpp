// Tests of kiln::nn's recurrent layers and model-building pieces: GRUCell/GRU against a float64
// reference, their fused kernels and traces; LSTM's batch_first, bidirectional and dropout options;
// Embedding's padding_idx; nn::init; ModuleList, ModuleDict and Sequential built from modules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/jit.h"
#include "kiln/nn.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random_tensor;
using testing::values;
using Inputs = std::vector<Tensor>;

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& entry : named) out.push_back(entry.first);
  return out;
}

// ---------------------------------------------------------------------------- GRU reference

// A GRU cell's parameters in float64, row-major as torch stores them.
struct RefGRUCell {
  int64_t input, hidden;
  std::vector<double> w_ih, w_hh, b_ih, b_hh;  // biases empty without bias
};
RefGRUCell ref_of(const nn::GRUCell& cell) {
  RefGRUCell r{
      cell.input_size, cell.hidden_size, values(cell.weight_ih), values(cell.weight_hh), {}, {}};
  if (cell.bias_ih.defined()) {
    r.b_ih = values(cell.bias_ih);
    r.b_hh = values(cell.bias_hh);
  }
  return r;
}

// One step of torch's GRU equations, in float64, for x [batch, input] and h [batch, hidden].
std::vector<double> ref_gru_step(const RefGRUCell& c, const std::vector<double>& x,
                                 const std::vector<double>& h, int64_t batch) {
  const int64_t I = c.input, H = c.hidden;
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  // Row g of W x + b.
  auto affine = [](const std::vector<double>& w, const std::vector<double>& b, const double* v,
                   int64_t n, int64_t g) {
    double acc = b.empty() ? 0.0 : b[g];
    for (int64_t k = 0; k < n; ++k) acc += w[g * n + k] * v[k];
    return acc;
  };
  std::vector<double> out(batch * H);
  for (int64_t n = 0; n < batch; ++n) {
    const double* xn = x.data() + n * I;
    const double* hn = h.data() + n * H;
    for (int64_t j = 0; j < H; ++j) {
      const double r = sig(affine(c.w_ih, c.b_ih, xn, I, j) + affine(c.w_hh, c.b_hh, hn, H, j));
      const double z =
          sig(affine(c.w_ih, c.b_ih, xn, I, H + j) + affine(c.w_hh, c.b_hh, hn, H, H + j));
      const double nn_ = std::tanh(affine(c.w_ih, c.b_ih, xn, I, 2 * H + j) +
                                   r * affine(c.w_hh, c.b_hh, hn, H, 2 * H + j));
      out[n * H + j] = (1.0 - z) * nn_ + z * hn[j];
    }
  }
  return out;
}

// torch's multi-layer, (bi)directional GRU in float64 over a time-major sequence x [T, B, I] with
// h0 [L * D, B, H]: returns output [T, B, D * H] and h_n [L * D, B, H] (row-major).
struct RefGRURun {
  std::vector<double> output, h_n;
};
RefGRURun ref_gru(const nn::GRU& gru, const std::vector<double>& x, const std::vector<double>& h0,
                  int64_t T, int64_t B) {
  const auto& o = gru.options();
  const int64_t L = o.num_layers(), D = o.bidirectional() ? 2 : 1, H = o.hidden_size();
  std::vector<double> layer_in = x;
  int64_t in_size = o.input_size();
  RefGRURun run{{}, std::vector<double>(L * D * B * H)};
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> layer_out(T * B * D * H);
    for (int64_t d = 0; d < D; ++d) {
      const RefGRUCell cell = ref_of(*gru.cells[l * D + d]);
      std::vector<double> h(h0.begin() + (l * D + d) * B * H, h0.begin() + (l * D + d + 1) * B * H);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t t = d == 0 ? i : T - 1 - i;
        std::vector<double> xt(layer_in.begin() + t * B * in_size,
                               layer_in.begin() + (t + 1) * B * in_size);
        h = ref_gru_step(cell, xt, h, B);
        for (int64_t n = 0; n < B; ++n)
          for (int64_t j = 0; j < H; ++j) layer_out[(t * B + n) * D * H + d * H + j] = h[n * H + j];
      }
      std::copy(h.begin(), h.end(), run.h_n.begin() + (l * D + d) * B * H);
    }
    layer_in = layer_out;
    in_size = D * H;
  }
  run.output = layer_in;
  return run;
}

// [B, T, F] row-major values to [T, B, F] and back (the same permutation both ways).
std::vector<double> swap01(const std::vector<double>& v, int64_t a, int64_t b, int64_t f) {
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < f; ++k) out[(j * a + i) * f + k] = v[(i * b + j) * f + k];
  return out;
}

// ---------------------------------------------------------------------------- GRUCell

TEST(GRUCell, MatchesFloat64ReferenceOnRandomShapes) {
  manual_seed(21);
  struct Case {
    int64_t batch, input, hidden;
    bool bias;
  };
  for (Case c : {Case{1, 1, 1, true}, Case{3, 5, 4, true}, Case{1, 7, 1, true},
                 Case{4, 2, 6, false}, Case{2, 0, 3, true}}) {
    SCOPED_TRACE("batch " + std::to_string(c.batch) + " input " + std::to_string(c.input) +
                 " hidden " + std::to_string(c.hidden) + (c.bias ? "" : " no bias"));
    nn::GRUCell cell(nn::GRUCellOptions(c.input, c.hidden).bias(c.bias));
    std::vector<std::string> want_names{"weight_ih", "weight_hh"};
    if (c.bias) want_names.insert(want_names.end(), {"bias_ih", "bias_hh"});
    EXPECT_EQ(names_of(cell.named_parameters()), want_names);
    EXPECT_EQ(cell.weight_ih.sizes(), (Shape{3 * c.hidden, c.input}));
    EXPECT_EQ(cell.weight_hh.sizes(), (Shape{3 * c.hidden, c.hidden}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(c.hidden));
    for (const Tensor& p : cell.parameters())
      for (double w : values(p)) EXPECT_LE(std::abs(w), bound);

    Tensor x = random_tensor({c.batch, c.input}), h = random_tensor({c.batch, c.hidden});
    const RefGRUCell ref = ref_of(cell);
    expect_close(cell.forward(x, h), ref_gru_step(ref, values(x), values(h), c.batch),
                 {c.batch, c.hidden}, kFloat32, 1e-5, 1e-6);
    // An undefined hx is zeros; the single-input forward is the same step.
    std::vector<double> zero_h(c.batch * c.hidden, 0.0);
    expect_close(cell.forward(x), ref_gru_step(ref, values(x), zero_h, c.batch),
                 {c.batch, c.hidden}, kFloat32, 1e-5, 1e-6);
    // In float64 the cell matches the reference to rounding.
    cell.to(kFloat64);
    expect_close(cell.forward(x.to(kFloat64), h.to(kFloat64)),
                 ref_gru_step(ref_of(cell), values(x), values(h), c.batch), {c.batch, c.hidden},
                 kFloat64, 1e-12, 1e-13);
  }
}

TEST(GRUCell, Gradcheck) {
  manual_seed(22);
  nn::GRUCell cell(3, 2);
  cell.to(kFloat64);
  Tensor x = random_tensor({2, 3}, kFloat64).requires_grad_();
  Tensor h = random_tensor({2, 2}, kFloat64, -1, 1).requires_grad_();
  auto wrt_inputs = [&](const Inputs& in) { return Inputs{cell.forward(in[0], in[1])}; };
  EXPECT_TRUE(testing::gradcheck(testing::DifferentiableFunction(wrt_inputs), {x, h}));
  // With respect to the parameters, swapped into the cell for each evaluation.
  auto wrt_params = [&](const Inputs& in) {
    Inputs saved{cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh};
    cell.weight_ih = in[0], cell.weight_hh = in[1], cell.bias_ih = in[2], cell.bias_hh = in[3];
    Tensor out = cell.forward(x, h);
    cell.weight_ih = saved[0], cell.weight_hh = saved[1], cell.bias_ih = saved[2],
    cell.bias_hh = saved[3];
    return Inputs{out};
  };
  EXPECT_TRUE(testing::gradcheck(testing::DifferentiableFunction(wrt_params),
                                 {cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh}));
}

TEST(GRUCell, BadInputRaisesNamingTheModuleAndShapes) {
  nn::GRUCell cell(5, 4);
  expect_error([&] { cell.forward(ones({3, 6})); }, {"GRUCell", "[batch, 5]", "float32[3, 6]"});
  expect_error([&] { cell.forward(ones({5})); }, {"GRUCell", "[batch, 5]", "float32[5]"});
  expect_error(
      [&] {
        cell.forward(ones({3, 5}), zeros({3, 5}));
      },
      {"GRUCell", "hx", "[3, 4]", "float32[3, 5]"});
  expect_error([] { nn::GRUCell(3, 0); }, {"GRUCell", "hidden_size"});
}

// The GRU cell's pointwise part fuses as the LSTM cell's does (DifferentiableTrace.
// LstmCellBackwardIsTheGemmsAndOneKernel): forward is its two gate GEMMs and one kernel, backward
// one kernel besides the GEMMs, which writes both gate gradients, cat(dr, dz, dn) for the input
// GEMM and cat(dr, dz, r * dn) for the hidden one, and sums each over the batch (the biases').
TEST(GRUCell, TracedStepIsTheGemmsAndOneKernelEachWay) {
  manual_seed(23);
  const int64_t batch = 4, input = 6, hidden = 5;
  nn::GRUCell cell(input, hidden);
  Inputs params = cell.parameters();
  auto step = [&](const Inputs& in) { return Inputs{cell.forward(in[0], in[1])}; };
  Tensor x = testing::input({batch, input}),
         h = testing::input({batch, hidden}, kFloat32, -1, 1).requires_grad_(true);
  jit::Function f = jit::trace(step, {x, h});
  Tensor weight = testing::input({batch, hidden});
  Inputs wrt = params;
  wrt.push_back(h);
  // Warm: kernels compiled.
  autograd::grad({(f({x, h})[0] * weight).sum()}, wrt, {}, false, false, true);

  const jit::Stats before = jit::stats();
  Inputs out = f({x, h});
  const jit::Stats mid = jit::stats();
  EXPECT_EQ(mid.fused_kernels_run - before.fused_kernels_run, 1) << f.graph_str();
  EXPECT_EQ(mid.unfused_steps_run - before.unfused_steps_run, 2) << "the two gate GEMMs\n"
                                                                 << f.graph_str();
  Tensor loss = (out[0] * weight).sum();
  const jit::Stats loss_done = jit::stats();
  Inputs got = autograd::grad({loss}, wrt, {}, false, false, true);
  const jit::Stats after = jit::stats();
  EXPECT_EQ(after.fused_kernels_run - loss_done.fused_kernels_run, 1) << f.backward_graph_str();

  // The traced gradients are eager autograd's.
  Inputs want;
  {
    LazyGuard eager(false);
    Tensor he = h.detach().requires_grad_(true);
    Inputs wrt_e = params;
    wrt_e.push_back(he);
    want = autograd::grad({(cell.forward(x, he) * weight).sum()}, wrt_e, {}, false, false, true);
  }
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(allclose(got[i], want[i], 1e-5, 1e-6)) << "gradient " << i;
}

// ---------------------------------------------------------------------------- GRU

TEST(GRU, MatchesFloat64ReferenceForEveryOption) {
  manual_seed(24);
  struct Case {
    int64_t T, B, I, H, L;
    bool bidirectional, batch_first, bias, with_hx;
  };
  for (Case c :
       {Case{1, 1, 1, 1, 1, false, false, true, false},
        Case{5, 3, 4, 6, 3, false, false, true, true}, Case{4, 2, 3, 5, 2, true, false, true, true},
        Case{3, 2, 3, 4, 2, true, true, false, false}, Case{1, 1, 2, 1, 2, true, true, true, true},
        Case{6, 1, 2, 3, 1, false, true, true, true}}) {
    const int64_t D = c.bidirectional ? 2 : 1;
    SCOPED_TRACE("T " + std::to_string(c.T) + " B " + std::to_string(c.B) + " L " +
                 std::to_string(c.L) + (c.bidirectional ? " bidirectional" : "") +
                 (c.batch_first ? " batch_first" : "") + (c.bias ? "" : " no bias") +
                 (c.with_hx ? " hx" : ""));
    nn::GRU gru(nn::GRUOptions(c.I, c.H)
                    .num_layers(c.L)
                    .bidirectional(c.bidirectional)
                    .batch_first(c.batch_first)
                    .bias(c.bias));
    gru.to(kFloat64);
    Shape x_shape = c.batch_first ? Shape{c.B, c.T, c.I} : Shape{c.T, c.B, c.I};
    Tensor x = random_tensor(x_shape, kFloat64);
    Tensor h0 = c.with_hx ? random_tensor({c.L * D, c.B, c.H}, kFloat64, -1, 1) : Tensor();
    auto [output, h_n] = gru.forward(x, h0);

    std::vector<double> xv = values(x);
    if (c.batch_first) xv = swap01(xv, c.B, c.T, c.I);
    std::vector<double> h0v =
        c.with_hx ? values(h0) : std::vector<double>(c.L * D * c.B * c.H, 0.0);
    RefGRURun ref = ref_gru(gru, xv, h0v, c.T, c.B);
    if (c.batch_first) ref.output = swap01(ref.output, c.T, c.B, D * c.H);
    Shape out_shape = c.batch_first ? Shape{c.B, c.T, D * c.H} : Shape{c.T, c.B, D * c.H};
    expect_close(output, ref.output, out_shape, kFloat64, 1e-12, 1e-13);
    expect_close(h_n, ref.h_n, {c.L * D, c.B, c.H}, kFloat64, 1e-12, 1e-13);
  }
}

TEST(GRU, ParametersHaveTorchsNames) {
  nn::GRU gru(nn::GRUOptions(3, 4).num_layers(2).bidirectional(true));
  EXPECT_EQ(names_of(gru.named_parameters()),
            (std::vector<std::string>{
                "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l0_reverse",
                "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse", "weight_ih_l1",
                "weight_hh_l1", "bias_ih_l1", "bias_hh_l1", "weight_ih_l1_reverse",
                "weight_hh_l1_reverse", "bias_ih_l1_reverse", "bias_hh_l1_reverse"}));
  EXPECT_EQ(gru.named_parameters()[8].second.sizes(), (Shape{12, 8}));  // layer 1 reads 2 * H
  nn::GRU no_bias(nn::GRUOptions(3, 4).bias(false));
  EXPECT_EQ(names_of(no_bias.named_parameters()),
            (std::vector<std::string>{"weight_ih_l0", "weight_hh_l0"}));
  // The cells' tensors are the module's: a state_dict round trip reaches them.
  nn::GRU copy(nn::GRUOptions(3, 4).num_layers(2).bidirectional(true));
  copy.load_state_dict(gru.state_dict());
  Tensor x = random_tensor({2, 5, 3});
  EXPECT_TRUE(equal(copy.forward(x), gru.forward(x)));
}

TEST(GRU, TracedMatchesEager) {
  manual_seed(25);
  nn::GRU gru(nn::GRUOptions(3, 4).num_layers(2).bidirectional(true).batch_first(true));
  auto run = [&](const Inputs& in) {
    auto [output, h_n] = gru.forward(in[0], in[1]);
    return Inputs{output, h_n};
  };
  Tensor x = testing::input({2, 5, 3}), h0 = testing::input({4, 2, 4}, kFloat32, -1, 1);
  Inputs eager;
  {
    LazyGuard off(false);
    eager = run({x, h0});
  }
  jit::Function f = jit::trace(run, {x, h0});
  for (int call = 0; call < 2; ++call) {
    Inputs traced = f({x, h0});
    ASSERT_EQ(traced.size(), 2u);
    EXPECT_TRUE(allclose(traced[0], eager[0], 1e-5, 1e-6)) << "output, call " << call;
    EXPECT_TRUE(allclose(traced[1], eager[1], 1e-5, 1e-6)) << "h_n, call " << call;
  }
}

TEST(GRU, AnEmptySequenceLeavesTheStateAsItWas) {
  nn::GRU gru(nn::GRUOptions(3, 4).num_layers(2).bidirectional(true));
  Tensor h0 = random_tensor({4, 2, 4});
  auto [output, h_n] = gru.forward(zeros({0, 2, 3}), h0);
  EXPECT_EQ(output.sizes(), (Shape{0, 2, 8}));
  EXPECT_TRUE(equal(h_n, h0));
  EXPECT_TRUE(equal(std::get<1>(gru.forward(zeros({0, 2, 3}), Tensor())), zeros({4, 2, 4})));
}

TEST(GRU, BadInputRaisesNamingTheModuleAndShapes) {
  nn::GRU gru(nn::GRUOptions(3, 4).num_layers(2));
  expect_error(
      [&] {
        gru.forward(ones({5, 2, 4}));
      },
      {"GRU", "[time, batch, 3]", "float32[5, 2, 4]"});
  expect_error([&] { gru.forward(ones({5, 3})); }, {"GRU", "float32[5, 3]"});
  expect_error(
      [&] {
        gru.forward(ones({5, 2, 3}), zeros({1, 2, 4}));
      },
      {"GRU", "hx", "[2, 2, 4]", "float32[1, 2, 4]"});
  nn::GRU batch_first(nn::GRUOptions(3, 4).batch_first(true));
  expect_error([&] { batch_first.forward(ones({2, 5, 2})); }, {"GRU", "[batch, time, 3]"});
  expect_error([] { nn::GRU(nn::GRUOptions(3, 4).num_layers(0)); }, {"GRU", "num_layers"});
  expect_error([] { nn::GRU(nn::GRUOptions(3, 4).dropout(1.5)); }, {"GRU", "dropout"});
}

TEST(GRU, DropoutBetweenLayersOnlyWhileTraining) {
  manual_seed(26);
  nn::GRU gru(nn::GRUOptions(3, 4).num_layers(2).dropout(0.5).bidirectional(true));
  nn::GRU plain(nn::GRUOptions(3, 4).num_layers(2).bidirectional(true));
  plain.load_state_dict(gru.state_dict());
  Tensor x = random_tensor({4, 2, 3});
  gru.eval();
  EXPECT_TRUE(equal(gru.forward(x), plain.forward(x)));
  gru.train();
  EXPECT_FALSE(allclose(gru.forward(x), plain.forward(x)));
}

// ---------------------------------------------------------------------------- LSTM options

// An LSTM's output and state composed from its cells stepped by hand over a time-major x, with
// h0 and c0 [layers * directions, batch, hidden].
nn::LSTMOutput lstm_by_cells(const nn::LSTM& lstm, const Tensor& x, const Tensor& h0,
                             const Tensor& c0) {
  const int64_t L = lstm.num_layers, D = lstm.options().bidirectional() ? 2 : 1, T = x.size(0);
  Inputs layer_in = x.unbind(0), h_n, c_n;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<Inputs> outs(D, Inputs(T));
    for (int64_t d = 0; d < D; ++d) {
      nn::LSTMState s{h0[l * D + d], c0[l * D + d]};
      for (int64_t i = 0; i < T; ++i) {
        const int64_t t = d == 0 ? i : T - 1 - i;
        s = lstm.cells[l * D + d]->forward(layer_in[t], s);
        outs[d][t] = s.h;
      }
      h_n.push_back(s.h);
      c_n.push_back(s.c);
    }
    for (int64_t t = 0; t < T; ++t)
      layer_in[t] = D == 1 ? outs[0][t] : cat({outs[0][t], outs[1][t]}, 1);
  }
  return {stack(layer_in, 0), {stack(h_n, 0), stack(c_n, 0)}};
}

TEST(LSTMOptions, BatchFirstAndBidirectionalMatchSteppingTheCells) {
  manual_seed(27);
  const int64_t T = 4, B = 3, I = 5, H = 2, L = 2;
  for (bool batch_first : {false, true}) {
    for (bool bidirectional : {false, true}) {
      SCOPED_TRACE(std::string(batch_first ? "batch_first" : "time-major") +
                   (bidirectional ? " bidirectional" : ""));
      const int64_t D = bidirectional ? 2 : 1;
      nn::LSTM lstm(nn::LSTMOptions(I, H)
                        .num_layers(L)
                        .batch_first(batch_first)
                        .bidirectional(bidirectional));
      std::vector<std::string> want{"l0.weight", "l0.bias"};
      if (bidirectional) want.insert(want.end(), {"l0_reverse.weight", "l0_reverse.bias"});
      want.insert(want.end(), {"l1.weight", "l1.bias"});
      if (bidirectional) want.insert(want.end(), {"l1_reverse.weight", "l1_reverse.bias"});
      EXPECT_EQ(names_of(lstm.named_parameters()), want);
      EXPECT_EQ(lstm.cells[D]->weight.sizes(), (Shape{4 * H, D * H + H}));

      Tensor x_tm = random_tensor({T, B, I});
      Tensor x = batch_first ? x_tm.transpose(0, 1).contiguous() : x_tm;
      Tensor h0 = random_tensor({L * D, B, H}, kFloat32, -1, 1), c0 = random_tensor({L * D, B, H});
      nn::LSTMOutput out = lstm.forward(x, nn::LSTMState{h0, c0});
      EXPECT_EQ(out.output.sizes(), batch_first ? Shape({B, T, D * H}) : Shape({T, B, D * H}));
      EXPECT_EQ(out.state.h.sizes(), (Shape{L * D, B, H}));
      EXPECT_EQ(out.state.c.sizes(), (Shape{L * D, B, H}));
      nn::LSTMOutput want_out = lstm_by_cells(lstm, x_tm, h0, c0);
      Tensor got_tm = batch_first ? out.output.transpose(0, 1) : out.output;
      EXPECT_TRUE(allclose(got_tm, want_out.output, 1e-6, 1e-7));
      EXPECT_TRUE(allclose(out.state.h, want_out.state.h, 1e-6, 1e-7));
      EXPECT_TRUE(allclose(out.state.c, want_out.state.c, 1e-6, 1e-7));
      // A missing state is zeros.
      nn::LSTMOutput zero_state = lstm.forward(x, std::nullopt);
      nn::LSTMOutput want_zero =
          lstm_by_cells(lstm, x_tm, zeros({L * D, B, H}), zeros({L * D, B, H}));
      EXPECT_TRUE(allclose(zero_state.state.h, want_zero.state.h, 1e-6, 1e-7));
    }
  }
  nn::LSTM bf(nn::LSTMOptions(I, H).batch_first(true));
  expect_error(
      [&] {
        bf.forward(ones({B, T, I + 1}));
      },
      {"LSTM", "[batch, time, 5]", "float32[3, 4, 6]"});
  nn::LSTM bi(nn::LSTMOptions(I, H).bidirectional(true));
  expect_error(
      [&] {
        bi.forward(ones({T, B, I}), nn::LSTMState{zeros({1, B, H}), zeros({1, B, H})});
      },
      {"LSTM", "[2, 3, 2]", "float32[1, 3, 2]"});
}

TEST(LSTMOptions, TracedMatchesEager) {
  manual_seed(34);
  nn::LSTM lstm(nn::LSTMOptions(3, 4).num_layers(2).bidirectional(true).batch_first(true));
  auto run = [&](const Inputs& in) {
    nn::LSTMOutput out = lstm.forward(in[0], nn::LSTMState{in[1], in[2]});
    return Inputs{out.output, out.state.h, out.state.c};
  };
  Tensor x = testing::input({2, 5, 3}), h0 = testing::input({4, 2, 4}, kFloat32, -1, 1),
         c0 = testing::input({4, 2, 4});
  Inputs eager;
  {
    LazyGuard off(false);
    eager = run({x, h0, c0});
  }
  jit::Function f = jit::trace(run, {x, h0, c0});
  for (int call = 0; call < 2; ++call) {
    Inputs traced = f({x, h0, c0});
    ASSERT_EQ(traced.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(allclose(traced[i], eager[i], 1e-5, 1e-6)) << "output " << i << ", call " << call;
  }
}

TEST(LSTMOptions, DropoutOnlyBetweenLayersWhileTrainingAndNoBias) {
  manual_seed(28);
  nn::LSTM lstm(nn::LSTMOptions(3, 4).num_layers(2).dropout(0.5).bidirectional(true));
  Tensor x = random_tensor({5, 2, 3});
  Tensor h0 = zeros({4, 2, 4}), c0 = zeros({4, 2, 4});
  lstm.eval();
  EXPECT_TRUE(allclose(lstm.forward(x), lstm_by_cells(lstm, x, h0, c0).output, 1e-6, 1e-7));
  lstm.train();
  EXPECT_FALSE(allclose(lstm.forward(x), lstm_by_cells(lstm, x, h0, c0).output));

  nn::LSTM no_bias(nn::LSTMOptions(3, 4).bias(false));
  EXPECT_EQ(names_of(no_bias.named_parameters()), (std::vector<std::string>{"l0.weight"}));
  EXPECT_EQ(no_bias.forward(x).sizes(), (Shape{5, 2, 4}));
}

// ---------------------------------------------------------------------------- Embedding

TEST(EmbeddingPadding, RowStartsAtZeroAndGetsNoGradient) {
  manual_seed(29);
  const int64_t num = 6, dim = 3;
  nn::Embedding emb(nn::EmbeddingOptions(num, dim).padding_idx(-2));  // row 4
  ASSERT_TRUE(emb.padding_idx.has_value());
  EXPECT_EQ(*emb.padding_idx, 4);
  EXPECT_EQ(values(emb.weight.select(0, 4)), std::vector<double>(dim, 0.0));
  EXPECT_NE(values(emb.weight.select(0, 3)), std::vector<double>(dim, 0.0));

  // A padding row changed by hand is still looked up as it is.
  {
    NoGradGuard no_grad;
    emb.weight.select(0, 4).fill_(2.0);
  }
  Tensor idx = from_vector(std::vector<int64_t>{4, 1, 4, 3, 1, 0}, Shape{2, 3});
  Tensor out = emb(idx);
  EXPECT_EQ(out.sizes(), (Shape{2, 3, dim}));
  EXPECT_EQ(values(out[0][0]), std::vector<double>(dim, 2.0));

  Tensor upstream = random_tensor({2, 3, dim});
  (out * upstream).sum().backward();
  ASSERT_TRUE(emb.weight.grad().defined());
  // Row r's gradient is the sum of the upstream rows that looked it up; row 4's is zero.
  std::vector<double> u = values(upstream), want(num * dim, 0.0);
  std::vector<int64_t> ids{4, 1, 4, 3, 1, 0};
  for (size_t k = 0; k < ids.size(); ++k)
    if (ids[k] != 4)
      for (int64_t j = 0; j < dim; ++j) want[ids[k] * dim + j] += u[k * dim + j];
  expect_close(emb.weight.grad(), want, {num, dim}, kFloat32, 1e-6, 1e-7);

  nn::Embedding plain(num, dim);
  EXPECT_FALSE(plain.padding_idx.has_value());
  expect_error([] { nn::Embedding(nn::EmbeddingOptions(4, 2).padding_idx(4)); },
               {"Embedding", "padding_idx", "4"});
  expect_error([] { nn::Embedding(nn::EmbeddingOptions(4, 2).padding_idx(-5)); },
               {"Embedding", "padding_idx", "-5"});
}

// ---------------------------------------------------------------------------- init

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(Init, GainsAndFansFollowTorchsFormulas) {
  using nn::init::Nonlinearity;
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::Linear), 1.0);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::Conv2D), 1.0);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::Sigmoid), 1.0);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::Tanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::ReLU), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::LeakyReLU), std::sqrt(2.0 / 1.0001));
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::LeakyReLU, std::sqrt(5.0)),
                   std::sqrt(1.0 / 3.0));
  EXPECT_DOUBLE_EQ(nn::init::calculate_gain(Nonlinearity::SELU), 0.75);

  // fan_in = size(1) * receptive field, fan_out = size(0) * receptive field.
  auto [in2, out2] = nn::init::_calculate_fan_in_and_fan_out(zeros({7, 3}));
  EXPECT_EQ(in2, 3);
  EXPECT_EQ(out2, 7);
  auto [in4, out4] = nn::init::_calculate_fan_in_and_fan_out(zeros({8, 4, 3, 5}));
  EXPECT_EQ(in4, 4 * 15);
  EXPECT_EQ(out4, 8 * 15);
  expect_error([] { nn::init::_calculate_fan_in_and_fan_out(zeros({5})); },
               {"fan in and fan out", "fewer than 2", "float32[5]"});
  expect_error([] { nn::init::eye_(zeros({2, 2, 2})); }, {"eye_", "float32[2, 2, 2]"});
}

TEST(Init, DistributionsHaveTheirStatisticsInPlaceWithoutHistory) {
  manual_seed(30);
  // 200k draws: the sample mean and standard deviation are within about 0.3% of the scale.
  const Shape shape{400, 500};
  const double fan_in = 500, fan_out = 400;
  struct Case {
    std::string what;
    std::function<void(Tensor)> init;
    double mean, std, bound;  // bound 0: unbounded
  };
  const double xavier_std = std::sqrt(2.0 / (fan_in + fan_out));
  const double kaiming_out_std = std::sqrt(2.0) / std::sqrt(fan_out);
  const double leaky_std = std::sqrt(2.0 / (1.0 + 5.0)) / std::sqrt(fan_in);  // a = sqrt(5)
  std::vector<Case> cases{
      {"uniform_(-2, 4)", [](Tensor t) { nn::init::uniform_(t, -2, 4); }, 1.0,
       6.0 / std::sqrt(12.0), 4.0},
      {"normal_(3, 0.5)", [](Tensor t) { nn::init::normal_(t, 3, 0.5); }, 3.0, 0.5, 0},
      {"xavier_uniform_(gain 2)", [](Tensor t) { nn::init::xavier_uniform_(t, 2.0); }, 0.0,
       2.0 * xavier_std, 2.0 * std::sqrt(3.0) * xavier_std},
      {"xavier_normal_", [](Tensor t) { nn::init::xavier_normal_(t); }, 0.0, xavier_std, 0},
      {"kaiming_normal_(fan_out, relu)",
       [](Tensor t) {
         nn::init::kaiming_normal_(t, 0, nn::init::FanMode::FanOut, nn::init::Nonlinearity::ReLU);
       },
       0.0, kaiming_out_std, 0},
      {"kaiming_uniform_(a = sqrt(5))",
       [](Tensor t) { nn::init::kaiming_uniform_(t, std::sqrt(5.0)); }, 0.0, leaky_std,
       std::sqrt(3.0) * leaky_std},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    nn::Linear layer(500, 400);  // weight [400, 500]: a parameter, a leaf that requires grad
    Tensor w = layer.weight;
    c.init(w);
    EXPECT_TRUE(w.requires_grad());
    EXPECT_TRUE(w.is_leaf());
    EXPECT_EQ(w.sizes(), shape);
    std::vector<double> v = values(w);
    EXPECT_NEAR(mean_of(v), c.mean, 0.01 * c.std);
    EXPECT_NEAR(std_of(v), c.std, 0.01 * c.std);
    if (c.bound > 0) {
      EXPECT_LE(max_abs(v), c.bound * (1 + 1e-6) + std::abs(c.mean));
      EXPECT_GT(max_abs(v), 0.99 * c.bound);
    }
  }
}

TEST(Init, ConstantsEyeAndOrthogonal) {
  manual_seed(31);
  Tensor w = zeros({3, 4}).requires_grad_(true);
  EXPECT_EQ(values(nn::init::constant_(w, 2.5)), std::vector<double>(12, 2.5));
  EXPECT_TRUE(w.is_leaf());
  EXPECT_EQ(values(nn::init::ones_(w)), std::vector<double>(12, 1.0));
  EXPECT_EQ(values(nn::init::zeros_(w)), std::vector<double>(12, 0.0));
  nn::init::eye_(w);
  expect_close(w, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, {3, 4}, kFloat32, 0, 0);

  // Orthonormal rows (wide), orthonormal columns (tall), and a conv weight flattened per row.
  for (Shape shape : {Shape{3, 7}, Shape{8, 3}, Shape{4, 2, 3, 3}}) {
    SCOPED_TRACE("rank " + std::to_string(shape.size()) + ", " + std::to_string(shape[0]) +
                 " rows");
    Tensor t = zeros(shape, kFloat64);
    nn::init::orthogonal_(t, 1.5);
    Tensor m = t.reshape({shape[0], -1});
    Tensor gram = m.size(0) <= m.size(1) ? m.matmul(m.t()) : m.t().matmul(m);
    const int64_t n = gram.size(0);
    std::vector<double> want(n * n, 0.0);
    for (int64_t i = 0; i < n; ++i) want[i * n + i] = 2.25;
    expect_close(gram, want, {n, n}, kFloat64, 1e-12, 1e-12);
  }
  expect_error([] { nn::init::orthogonal_(zeros({4})); }, {"orthogonal_", "float32[4]"});
}

// ---------------------------------------------------------------------------- containers

TEST(Containers, SequentialFromModuleValues) {
  manual_seed(32);
  nn::Sequential seq(nn::Linear(4, 3), nn::ReLU(), nn::Linear(3, 2));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  Tensor x = random_tensor({5, 4});
  auto& l0 = dynamic_cast<nn::Linear&>(*seq[0]);
  auto& l2 = dynamic_cast<nn::Linear&>(*seq[2]);
  EXPECT_TRUE(allclose(seq(x), linear(relu(linear(x, l0.weight, l0.bias)), l2.weight, l2.bias)));
  // Shared pointers and values mix; push_back takes both.
  auto fc = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential mixed(fc, nn::Tanh());
  mixed.push_back(nn::Sigmoid());
  EXPECT_EQ(mixed.size(), 3u);
  EXPECT_EQ(mixed[0], fc);
  EXPECT_EQ(mixed[2]->name(), "Sigmoid");
}

// A model holding a ModuleList and a ModuleDict, as torch code registers them.
class Tower : public nn::Module {
 public:
  Tower() {
    blocks = register_module(
        "blocks", std::make_shared<nn::ModuleList>(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 4)));
    heads = register_module("heads", std::make_shared<nn::ModuleDict>(nn::ModuleDict::Items{
                                         {"score", std::make_shared<nn::Linear>(4, 1)},
                                         {"norm", std::make_shared<nn::LayerNorm>(Shape{4})}}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& block : *blocks) y = block->forward(y);
    return (*heads)["score"]->forward((*heads)["norm"]->forward(y));
  }
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::ModuleDict> heads;
};

TEST(Containers, ModuleListAndModuleDictNamesAndStateDictRoundTrip) {
  manual_seed(33);
  Tower a;
  const std::vector<std::string> want{"blocks.0.weight",   "blocks.0.bias",      "blocks.2.weight",
                                      "blocks.2.bias",     "heads.score.weight", "heads.score.bias",
                                      "heads.norm.weight", "heads.norm.bias"};
  EXPECT_EQ(names_of(a.named_parameters()), want);
  EXPECT_EQ(a.parameters().size(), want.size());
  std::vector<std::string> dict_names;
  StateDict dict = a.state_dict();
  for (const auto& entry : dict) dict_names.push_back(entry.first);
  EXPECT_EQ(dict_names, want);

  Tower b;
  Tensor x = random_tensor({2, 3});
  EXPECT_FALSE(allclose(a(x), b(x)));
  b.load_state_dict(dict);
  EXPECT_TRUE(equal(a(x), b(x)));

  // Access, typed access and their errors.
  EXPECT_EQ(a.blocks->size(), 3u);
  EXPECT_EQ(a.blocks->at<nn::Linear>(2).out_features, 4);
  expect_error([&] { a.blocks->at<nn::Linear>(1); }, {"ModuleList", "1", "ReLU"});
  expect_error([&] { (*a.blocks)[3]; }, {"ModuleList", "index 3", "3 modules"});
  EXPECT_TRUE(a.heads->contains("norm"));
  EXPECT_EQ(a.heads->keys(), (std::vector<std::string>{"score", "norm"}));
  EXPECT_EQ(a.heads->at<nn::Linear>("score").in_features, 4);
  expect_error([&] { (*a.heads)["missing"]; }, {"ModuleDict", "missing"});
  // Inserting an existing key replaces the module under the same name and position.
  a.heads->insert("score", std::make_shared<nn::Linear>(4, 2, /*bias=*/false));
  EXPECT_EQ(a.heads->size(), 2u);
  EXPECT_EQ(names_of(a.heads->named_parameters()),
            (std::vector<std::string>{"score.weight", "norm.weight", "norm.bias"}));
  EXPECT_EQ(a(x).sizes(), (Shape{2, 2}));
  nn::ModuleList list;
  list.extend({std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(1, 1)});
  list.push_back(nn::GRUCell(1, 2));
  EXPECT_EQ(names_of(list.named_parameters()),
            (std::vector<std::string>{"1.weight", "1.bias", "2.weight_ih", "2.weight_hh",
                                      "2.bias_ih", "2.bias_hh"}));
}

}  // namespace
}  // namespace kiln
