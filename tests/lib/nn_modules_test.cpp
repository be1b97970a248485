// Tests of kiln::nn: parameter registration and traversal, modes, each layer against functional ops
// or float64 reference loops, LSTMCell/LSTM against separate W_ih/W_hh math, and clip_grad_norm_.
#include <cmath>
#include <limits>

#include "kiln/nn.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random_tensor;
using testing::values;

// A two-level module: parameters of its own, a Linear child and a nested Sequential.
class Net : public nn::Module {
 public:
  Net() {
    scale = register_parameter("scale", ones({3}));
    frozen = register_parameter("frozen", zeros({2}), /*requires_grad=*/false);
    running = register_buffer("running", zeros({3}));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 3));
    body = register_module(
        "body",
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::ReLU>(),
            std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::LayerNorm>(Shape{5})}));
  }
  std::string name() const override { return "Net"; }
  Tensor forward(const Tensor& x) override { return body->forward(fc1->forward(x) * scale); }

  Tensor scale, frozen, running;
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::Sequential> body;
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& entry : named) out.push_back(entry.first);
  return out;
}

TEST(NnModules, RegistrationOrderNamesAndFlags) {
  Net net;
  EXPECT_EQ(names_of(net.named_parameters()),
            (std::vector<std::string>{"scale", "frozen", "fc1.weight", "fc1.bias", "body.0.weight",
                                      "body.0.bias", "body.3.weight", "body.3.bias"}));
  EXPECT_EQ(names_of(net.named_parameters(/*recurse=*/false)),
            (std::vector<std::string>{"scale", "frozen"}));
  EXPECT_EQ(names_of(net.named_buffers()), (std::vector<std::string>{"running"}));
  std::vector<Tensor> params = net.parameters();
  ASSERT_EQ(params.size(), 8u);
  // parameters() hands out the modules' own tensors, not copies.
  EXPECT_TRUE(params[0].is_same(net.scale));
  EXPECT_TRUE(params[2].is_same(net.fc1->weight));
  EXPECT_TRUE(params[3].is_same(net.fc1->bias));
  EXPECT_EQ(params[2].sizes(), (Shape{3, 4}));
  EXPECT_EQ(params[4].sizes(), (Shape{5, 3}));
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].requires_grad(), i != 1) << i;
    EXPECT_TRUE(params[i].is_leaf()) << i;
  }
  auto kids = net.named_children();
  ASSERT_EQ(kids.size(), 2u);
  EXPECT_EQ(kids[0].first, "fc1");
  EXPECT_EQ(kids[1].first, "body");
  EXPECT_EQ(net.children()[0].get(), net.fc1.get());
  EXPECT_EQ(net.modules().size(), 7u);  // net, fc1, body and body's four layers
  int64_t count = 0;
  for (const Tensor& p : params) count += p.numel();
  EXPECT_EQ(count, 3 + 2 + 12 + 3 + 15 + 5 + 5 + 5);
}

TEST(NnModules, RegistrationErrors) {
  Net net;
  expect_error([&] { net.register_parameter("scale", ones({1})); },
               {"Net", "parameter", "'scale'", "already in use"});
  expect_error([&] { net.register_buffer("fc1", ones({1})); }, {"Net", "'fc1'", "already"});
  expect_error([&] { net.register_parameter("a.b", ones({1})); }, {"Net", "'a.b'"});
  expect_error([&] { net.register_parameter("ints", arange(3)); },
               {"Net", "'ints'", "floating point", "int64[3]"});
  expect_error([&] { net.register_module("none", std::shared_ptr<nn::Module>()); },
               {"Net", "'none'", "null"});
  // A module without a single-tensor forward says which module it is.
  struct Holder : nn::Module {
    std::string name() const override { return "Holder"; }
  };
  std::shared_ptr<nn::Module> holder = std::make_shared<Holder>();
  expect_error([&] { holder->forward(ones({1, 2})); }, {"Holder", "forward", "float32[1, 2]"});
  expect_error(
      [&] {
        nn::Linear(3, 2).forward(ones({4, 5}));
      },
      {"Linear", "in_features=3", "float32[4, 5]"});
  expect_error([] { nn::Dropout(1.5); }, {"Dropout", "1.5"});
}

TEST(NnModules, SharedParametersAreListedOnce) {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential seq{shared, std::make_shared<nn::Tanh>(), shared};
  EXPECT_EQ(names_of(seq.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
}

// A chain far deeper than any recursion would survive in tests is walked iteratively.
TEST(NnModules, DeepTreesAreWalkedIteratively) {
  const int depth = 3000;
  auto root = std::make_shared<nn::Sequential>();
  nn::Sequential* tail = root.get();
  for (int i = 0; i < depth; ++i) {
    auto next = std::make_shared<nn::Sequential>();
    tail->push_back(std::make_shared<nn::Linear>(1, 1, /*bias=*/false));
    tail->push_back(next);
    tail = next.get();
  }
  auto named = root->named_parameters();
  ASSERT_EQ(named.size(), static_cast<size_t>(depth));
  EXPECT_EQ(named[0].first, "0.weight");
  EXPECT_EQ(named[1].first, "1.0.weight");
  root->eval();
  EXPECT_FALSE(tail->is_training());
  root->train();
  EXPECT_TRUE(tail->is_training());
}

TEST(NnModules, TrainEvalPropagatesAndSwitchesDropout) {
  Net net;
  EXPECT_TRUE(net.is_training());
  net.eval();
  for (nn::Module* m : net.modules()) EXPECT_FALSE(m->is_training()) << m->name();
  nn::Dropout& drop = static_cast<nn::Dropout&>(*(*net.body)[2]);
  Tensor x = random_tensor({64, 32}, kFloat32, 1.0, 2.0);
  EXPECT_TRUE(equal(drop.forward(x), x));
  net.train();
  for (nn::Module* m : net.modules()) EXPECT_TRUE(m->is_training()) << m->name();
  std::vector<double> xv = values(x), yv = values(drop.forward(x));
  int64_t zeros_seen = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0.0)
      ++zeros_seen;
    else
      EXPECT_NEAR(yv[i], 2.0 * xv[i], 1e-6);
  }
  EXPECT_GT(zeros_seen, 800);  // about half of 2048
  EXPECT_LT(zeros_seen, 1250);
}

TEST(NnModules, LinearMatchesFunctionalAndReference) {
  manual_seed(3);
  nn::Linear fc(5, 4);
  EXPECT_EQ(fc.weight.sizes(), (Shape{4, 5}));
  EXPECT_EQ(fc.bias.sizes(), (Shape{4}));
  const double bound = 1.0 / std::sqrt(5.0);
  for (double w : values(fc.weight)) EXPECT_LE(std::abs(w), bound);
  for (double b : values(fc.bias)) EXPECT_LE(std::abs(b), bound);
  EXPECT_GT(fc.weight.std().item<double>(), 0.5 * bound / std::sqrt(3.0));

  Tensor x = random_tensor({2, 3, 5});
  std::vector<double> xv = values(x), w = values(fc.weight), b = values(fc.bias);
  std::vector<double> ref(2 * 3 * 4);
  for (int r = 0; r < 6; ++r)
    for (int o = 0; o < 4; ++o) {
      double acc = b[o];
      for (int i = 0; i < 5; ++i) acc += xv[r * 5 + i] * w[o * 5 + i];
      ref[r * 4 + o] = acc;
    }
  expect_close(fc.forward(x), ref, {2, 3, 4}, kFloat32);
  EXPECT_TRUE(equal(fc(x), linear(x, fc.weight, fc.bias)));

  nn::Linear no_bias(5, 4, /*bias=*/false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.parameters().size(), 1u);
  EXPECT_TRUE(equal(no_bias(x), matmul(x, no_bias.weight.t())));
}

TEST(NnModules, EmbeddingLooksUpRows) {
  manual_seed(4);
  nn::Embedding emb(200, 50);
  EXPECT_EQ(emb.weight.sizes(), (Shape{200, 50}));
  // N(0, 1) initialization.
  EXPECT_NEAR(emb.weight.mean().item<double>(), 0.0, 0.03);
  EXPECT_NEAR(emb.weight.std().item<double>(), 1.0, 0.03);
  Tensor idx = from_vector(std::vector<int64_t>{3, 0, 199, 3, 7, 42}, Shape{2, 3});
  Tensor out = emb(idx);
  EXPECT_EQ(out.sizes(), (Shape{2, 3, 50}));
  EXPECT_TRUE(equal(out, embedding(emb.weight, idx)));
  EXPECT_TRUE(equal(out[1][2], emb.weight[42]));
  expect_error([&] { emb(from_vector(std::vector<int64_t>{200})); }, {"embedding", "200"});
}

TEST(NnModules, LayerNormMatchesFunctional) {
  nn::LayerNorm ln({3, 4}, 1e-3);
  EXPECT_TRUE(equal(ln.weight, ones({3, 4})));
  EXPECT_TRUE(equal(ln.bias, zeros({3, 4})));
  {
    NoGradGuard no_grad;
    ln.weight.copy_(random_tensor({3, 4}));
    ln.bias.copy_(random_tensor({3, 4}));
  }
  Tensor x = random_tensor({2, 3, 4});
  EXPECT_TRUE(equal(ln(x), layer_norm(x, {3, 4}, ln.weight, ln.bias, 1e-3)));
  nn::LayerNorm plain({4}, 1e-5, /*elementwise_affine=*/false);
  EXPECT_TRUE(plain.parameters().empty());
  EXPECT_TRUE(equal(plain(x), layer_norm(x, {4})));
}

TEST(NnModules, SequentialChainsAndActivations) {
  manual_seed(5);
  auto fc1 = std::make_shared<nn::Linear>(3, 6), fc2 = std::make_shared<nn::Linear>(6, 2);
  nn::Sequential seq{fc1, std::make_shared<nn::GELU>(), fc2, std::make_shared<nn::Sigmoid>()};
  seq.push_back(std::make_shared<nn::Tanh>());
  EXPECT_EQ(seq.size(), 5u);
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  Tensor x = random_tensor({7, 3});
  Tensor manual =
      tanh(sigmoid(linear(gelu(linear(x, fc1->weight, fc1->bias)), fc2->weight, fc2->bias)));
  EXPECT_TRUE(equal(seq(x), manual));
  EXPECT_TRUE(equal(nn::ReLU()(x), relu(x)));
  EXPECT_TRUE(equal(nn::GELU("tanh")(x), gelu(x, "tanh")));
}

// ---------------------------------------------------------------------------- LSTM

// One LSTM step in float64 from the cell's weights, using the separate input-to-hidden and
// hidden-to-hidden blocks (torch's W_ih and W_hh) rather than the concatenated GEMM.
struct RefState {
  std::vector<double> h, c;
};
RefState ref_lstm_step(const nn::LSTMCell& cell, const std::vector<double>& x, const RefState& s,
                       int64_t batch) {
  const int64_t I = cell.input_size, H = cell.hidden_size;
  std::vector<double> wih = values(cell.weight_ih()), whh = values(cell.weight_hh());
  std::vector<double> b = values(cell.bias);
  RefState out{std::vector<double>(batch * H), std::vector<double>(batch * H)};
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  for (int64_t n = 0; n < batch; ++n) {
    std::vector<double> gates(4 * H);
    for (int64_t g = 0; g < 4 * H; ++g) {
      double acc = b[g];
      for (int64_t i = 0; i < I; ++i) acc += wih[g * I + i] * x[n * I + i];
      for (int64_t j = 0; j < H; ++j) acc += whh[g * H + j] * s.h[n * H + j];
      gates[g] = acc;
    }
    for (int64_t j = 0; j < H; ++j) {
      double i = sig(gates[j]), f = sig(gates[H + j]), gg = std::tanh(gates[2 * H + j]),
             o = sig(gates[3 * H + j]);
      double c = f * s.c[n * H + j] + i * gg;
      out.c[n * H + j] = c;
      out.h[n * H + j] = o * std::tanh(c);
    }
  }
  return out;
}

TEST(NnModules, LSTMCellMatchesSeparateWeightReference) {
  manual_seed(6);
  const int64_t B = 3, I = 5, H = 4;
  nn::LSTMCell cell(I, H);
  EXPECT_EQ(cell.weight.sizes(), (Shape{4 * H, I + H}));
  EXPECT_EQ(cell.bias.sizes(), (Shape{4 * H}));
  EXPECT_EQ(cell.weight_ih().sizes(), (Shape{4 * H, I}));
  EXPECT_EQ(cell.weight_hh().sizes(), (Shape{4 * H, H}));
  EXPECT_EQ(names_of(cell.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  for (double w : values(cell.weight)) EXPECT_LE(std::abs(w), 0.5);  // 1/sqrt(4)

  Tensor x = random_tensor({B, I}), h = random_tensor({B, H}, kFloat32, -1, 1),
         c = random_tensor({B, H});
  nn::LSTMState out = cell.forward(x, nn::LSTMState{h, c});
  RefState ref = ref_lstm_step(cell, values(x), {values(h), values(c)}, B);
  expect_close(out.h, ref.h, {B, H}, kFloat32, 1e-5, 1e-6);
  expect_close(out.c, ref.c, {B, H}, kFloat32, 1e-5, 1e-6);

  // No state means zeros; the single-input forward gives h' of that step.
  nn::LSTMState from_zero = cell.forward(x, std::nullopt);
  EXPECT_TRUE(equal(cell.forward(x), from_zero.h));
  std::shared_ptr<nn::Module> as_module = std::make_shared<nn::LSTMCell>(I, H);
  EXPECT_EQ(as_module->forward(x).sizes(), (Shape{B, H}));
  RefState ref0 = ref_lstm_step(
      cell, values(x), {std::vector<double>(B * H, 0.0), std::vector<double>(B * H, 0.0)}, B);
  expect_close(from_zero.h, ref0.h, {B, H}, kFloat32, 1e-5, 1e-6);
  expect_close(from_zero.c, ref0.c, {B, H}, kFloat32, 1e-5, 1e-6);

  // In float64 (converted in place) the cell matches the reference to rounding.
  Tensor weight_handle = cell.weight;
  cell.to(kFloat64);
  EXPECT_EQ(weight_handle.dtype(), kFloat64);
  EXPECT_EQ(cell.parameters()[0].dtype(), kFloat64);
  EXPECT_TRUE(cell.weight.requires_grad());
  nn::LSTMState out64 = cell.forward(x.to(kFloat64), nn::LSTMState{h.to(kFloat64), c.to(kFloat64)});
  RefState ref64 = ref_lstm_step(cell, values(x), {values(h), values(c)}, B);
  expect_close(out64.h, ref64.h, {B, H}, kFloat64, 1e-12, 1e-13);
  expect_close(out64.c, ref64.c, {B, H}, kFloat64, 1e-12, 1e-13);

  expect_error(
      [&] {
        cell.forward(ones({B, I + 1}, kFloat64));
      },
      {"LSTMCell", "[batch, 5]", "float64[3, 6]"});
  expect_error(
      [&] {
        cell.forward(x.to(kFloat64), nn::LSTMState{zeros({B, H + 1}), c});
      },
      {"LSTMCell", "h", "[3, 4]", "float32[3, 5]"});
}

TEST(NnModules, LSTMCellGradcheck) {
  manual_seed(7);
  nn::LSTMCell cell(3, 2);
  cell.to(kFloat64);
  Tensor x = random_tensor({2, 3}, kFloat64).requires_grad_();
  Tensor h = random_tensor({2, 2}, kFloat64, -1, 1).requires_grad_();
  Tensor c = random_tensor({2, 2}, kFloat64).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    nn::LSTMState s = cell.forward(in[0], nn::LSTMState{in[1], in[2]});
    return std::vector<Tensor>{s.h, s.c};
  };
  EXPECT_TRUE(testing::gradcheck(testing::DifferentiableFunction(fn), {x, h, c}));
  // And with respect to the parameters, swapped into the cell for each evaluation.
  auto wrt_params = [&](const std::vector<Tensor>& in) {
    Tensor saved_weight = cell.weight, saved_bias = cell.bias;
    cell.weight = in[0];
    cell.bias = in[1];
    nn::LSTMState s = cell.forward(x, nn::LSTMState{h, c});
    cell.weight = saved_weight;
    cell.bias = saved_bias;
    return std::vector<Tensor>{s.h, s.c};
  };
  EXPECT_TRUE(
      testing::gradcheck(testing::DifferentiableFunction(wrt_params), {cell.weight, cell.bias}));
}

TEST(NnModules, LSTMMultiLayerMatchesSteppingTheCells) {
  manual_seed(8);
  const int64_t T = 5, B = 3, I = 4, H = 6, L = 3;
  nn::LSTM lstm(I, H, L);
  EXPECT_EQ(names_of(lstm.named_parameters()),
            (std::vector<std::string>{"l0.weight", "l0.bias", "l1.weight", "l1.bias", "l2.weight",
                                      "l2.bias"}));
  EXPECT_EQ(lstm.cells[0]->weight.sizes(), (Shape{4 * H, I + H}));
  EXPECT_EQ(lstm.cells[1]->weight.sizes(), (Shape{4 * H, 2 * H}));

  Tensor x = random_tensor({T, B, I});
  Tensor h0 = random_tensor({L, B, H}, kFloat32, -1, 1), c0 = random_tensor({L, B, H});
  for (bool with_state : {false, true}) {
    SCOPED_TRACE(with_state ? "initial state" : "zero state");
    std::optional<nn::LSTMState> init;
    if (with_state) init = nn::LSTMState{h0, c0};
    nn::LSTMOutput out = lstm.forward(x, init);
    ASSERT_EQ(out.output.sizes(), (Shape{T, B, H}));
    ASSERT_EQ(out.state.h.sizes(), (Shape{L, B, H}));
    ASSERT_EQ(out.state.c.sizes(), (Shape{L, B, H}));

    std::vector<Tensor> inputs = x.unbind(0);
    for (int64_t l = 0; l < L; ++l) {
      nn::LSTMState s{with_state ? h0[l] : zeros({B, H}), with_state ? c0[l] : zeros({B, H})};
      for (int64_t t = 0; t < T; ++t) {
        s = lstm.cells[l]->forward(inputs[t], s);
        inputs[t] = s.h;
      }
      EXPECT_TRUE(allclose(out.state.h[l], s.h, 1e-6, 1e-7)) << "layer " << l;
      EXPECT_TRUE(allclose(out.state.c[l], s.c, 1e-6, 1e-7)) << "layer " << l;
    }
    EXPECT_TRUE(allclose(out.output, stack(inputs, 0), 1e-6, 1e-7));
    EXPECT_TRUE(allclose(out.output[T - 1], out.state.h[L - 1], 0, 0));
    if (!with_state) {
      EXPECT_TRUE(equal(lstm.forward(x), out.output));
    }
  }
  expect_error([&] { lstm.forward(ones({T, B, I + 1})); }, {"LSTM", "float32[5, 3, 5]"});
  // The sequence with no time steps leaves a given state as it was.
  nn::LSTMOutput empty_run = lstm.forward(zeros({0, B, I}), nn::LSTMState{h0, c0});
  EXPECT_EQ(empty_run.output.sizes(), (Shape{0, B, H}));
  EXPECT_TRUE(equal(empty_run.state.h, h0));
  EXPECT_TRUE(equal(empty_run.state.c, c0));
  expect_error(
      [&] {
        lstm.forward(x, nn::LSTMState{zeros({L, B, H}), zeros({L, B + 1, H})});
      },
      {"LSTM", "[3, 3, 6]", "float32[3, 4, 6]"});
}

TEST(NnModules, LSTMDropoutOnlyBetweenLayersWhileTraining) {
  manual_seed(9);
  const int64_t T = 4, B = 2, I = 3, H = 5;
  nn::LSTM with_dropout(I, H, 2, 0.5), without(I, H, 2, 0.0);
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < 4; ++i) without.parameters()[i].copy_(with_dropout.parameters()[i]);
  }
  Tensor x = random_tensor({T, B, I});
  with_dropout.eval();
  EXPECT_TRUE(equal(with_dropout.forward(x), without.forward(x)));
  with_dropout.train();
  manual_seed(10);
  Tensor a = with_dropout.forward(x);
  manual_seed(10);
  Tensor b = with_dropout.forward(x);
  EXPECT_TRUE(equal(a, b));  // the mask comes from the seeded generator
  EXPECT_FALSE(allclose(a, without.forward(x)));
  // A single layer has no dropout at all.
  nn::LSTM single(I, H, 1, 0.9);
  EXPECT_TRUE(equal(single.forward(x), single.forward(x)));
}

TEST(NnModules, BackwardReachesEveryParameterAndZeroGradClears) {
  manual_seed(11);
  nn::Embedding emb(10, 4);
  nn::LSTM lstm(4, 3, 2);
  nn::Linear dec(3, 10);
  Tensor idx = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, Shape{3, 2});
  Tensor out = lstm.forward(emb(idx));
  Tensor loss = cross_entropy(dec(out.reshape({6, 3})), idx.reshape({6}));
  loss.backward();
  std::vector<nn::Module*> mods{&emb, &lstm, &dec};
  for (nn::Module* m : mods)
    for (const auto& [name, p] : m->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << m->name() << " " << name;
      EXPECT_EQ(p.grad().sizes(), p.sizes()) << m->name() << " " << name;
      EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << m->name() << " " << name;
    }
  lstm.zero_grad();
  for (const Tensor& p : lstm.parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(dec.weight.grad().defined());
}

// ---------------------------------------------------------------------------- clip_grad_norm_

TEST(NnModules, ClipGradNorm) {
  std::vector<Tensor> params{zeros({3, 4}), zeros({5}), zeros({2}, kFloat64), zeros({2})};
  std::vector<std::vector<double>> grads;
  for (size_t i = 0; i < 3; ++i) {
    Tensor g = random_tensor(params[i].sizes(), params[i].dtype(), -2, 2);
    grads.push_back(values(g));
    params[i].mutable_grad() = g;
  }
  // params[3] has no gradient: skipped, and left without one.
  double sq = 0, mx = 0;
  for (const auto& g : grads)
    for (double v : g) sq += v * v, mx = std::max(mx, std::abs(v));
  const double norm = std::sqrt(sq);

  // Under the limit: nothing changes.
  EXPECT_NEAR(nn::utils::clip_grad_norm_(params, norm * 2).item<double>(), norm, 1e-6 * norm);
  for (size_t i = 0; i < 3; ++i)
    expect_close(params[i].grad(), grads[i], params[i].sizes(), params[i].dtype());
  EXPECT_FALSE(params[3].grad().defined());

  // Over the limit: every gradient is scaled by max_norm / (norm + 1e-6), as torch.
  const double max_norm = norm / 4;
  EXPECT_NEAR(nn::utils::clip_grad_norm_(params, max_norm).item<double>(), norm, 1e-6 * norm);
  const double coef = max_norm / (norm + 1e-6);
  for (size_t i = 0; i < 3; ++i) {
    std::vector<double> expected = grads[i];
    for (double& v : expected) v *= coef;
    expect_close(params[i].grad(), expected, params[i].sizes(), params[i].dtype(), 1e-5, 1e-7);
  }
  double after = 0;
  for (size_t i = 0; i < 3; ++i)
    for (double v : values(params[i].grad())) after += v * v;
  EXPECT_NEAR(std::sqrt(after), max_norm, 1e-5 * max_norm);

  // The infinity norm is the largest magnitude.
  for (size_t i = 0; i < 3; ++i)
    params[i].mutable_grad() = from_vector(grads[i], params[i].sizes()).to(params[i].dtype());
  EXPECT_NEAR(nn::utils::clip_grad_norm_(params, 1e9, std::numeric_limits<double>::infinity())
                  .item<double>(),
              mx, 1e-6 * mx);
  // No gradients at all: a zero norm.
  std::vector<Tensor> bare{zeros({2})};
  EXPECT_EQ(nn::utils::clip_grad_norm_(bare, 1.0).item<double>(), 0.0);
}

}  // namespace
}  // namespace kiln
