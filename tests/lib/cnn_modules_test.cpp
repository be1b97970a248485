// Tests of the convolutional-network modules: Conv1d, Conv2d, ConvTranspose2d, BatchNorm1d/2d,
// GroupNorm, the pools and Flatten: parameter shapes and torch's default initialization, forward
// equal to the functional ops, running statistics as buffers (updated in training, used in eval,
// moved by to()), and a small CNN trained a step.
#include <cmath>

#include "kiln/jit.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::random_tensor;
using testing::values;

// Every value of t lies in [-bound, bound] and they are not all tiny (a uniform draw).
void expect_uniform_within(const Tensor& t, double bound) {
  double largest = 0;
  for (double v : values(t)) {
    EXPECT_LE(std::abs(v), bound);
    largest = std::max(largest, std::abs(v));
  }
  EXPECT_GT(largest, bound / 2);
}

TEST(CnnModules, ConvolutionsHaveTorchsShapesAndInitialization) {
  nn::Conv2d conv(6, 8, {3, 5}, {2}, {1}, {1}, 2);
  EXPECT_EQ(conv.weight.sizes(), Shape({8, 3, 3, 5}));
  EXPECT_EQ(conv.bias.sizes(), Shape({8}));
  expect_uniform_within(conv.weight, 1.0 / std::sqrt(3.0 * 15));
  expect_uniform_within(conv.bias, 1.0 / std::sqrt(3.0 * 15));
  EXPECT_EQ(conv.named_parameters().size(), 2u);
  const Tensor x = random_tensor({2, 6, 9, 9});
  EXPECT_TRUE(allclose(conv(x), conv2d(x, conv.weight, conv.bias, {2}, {1}, {1}, 2)));

  nn::Conv2d same(3, 4, {3}, {1}, "same", {1}, 1, false);
  EXPECT_FALSE(same.bias.defined());
  EXPECT_EQ(same(random_tensor({1, 3, 5, 7})).sizes(), Shape({1, 4, 5, 7}));

  nn::Conv1d c1(4, 6, 3, 1, 1);
  EXPECT_EQ(c1.weight.sizes(), Shape({6, 4, 3}));
  expect_uniform_within(c1.weight, 1.0 / std::sqrt(12.0));
  const Tensor s = random_tensor({2, 4, 10});
  EXPECT_TRUE(allclose(c1(s), conv1d(s, c1.weight, c1.bias, {1}, {1})));
  EXPECT_EQ(nn::Conv1d(4, 2, 4, 1, "same")(s).sizes(), Shape({2, 2, 10}));

  nn::ConvTranspose2d up(4, 6, {2}, {2}, {0}, {0}, 2);
  EXPECT_EQ(up.weight.sizes(), Shape({4, 3, 2, 2}));
  expect_uniform_within(up.weight, 1.0 / std::sqrt(3.0 * 4));
  const Tensor y = random_tensor({1, 4, 3, 3});
  EXPECT_EQ(up(y).sizes(), Shape({1, 6, 6, 6}));
  EXPECT_TRUE(allclose(up(y), conv_transpose2d(y, up.weight, up.bias, {2}, {0}, {0}, 2)));

  expect_error([] { nn::Conv2d(6, 8, {3}, {1}, {0}, {1}, 4); },
               {"Conv2d", "divisible by groups (4)"});
  expect_error([] { nn::Conv2d(3, 4, {3}, {1}, "full"); }, {"Conv2d", "\"same\" or \"valid\""});
}

TEST(CnnModules, BatchNormKeepsRunningStatisticsAsBuffers) {
  nn::BatchNorm2d bn(3, 1e-5, 0.2);
  EXPECT_EQ(bn.named_parameters().size(), 2u);
  const auto buffers = bn.named_buffers();
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0].first, "running_mean");
  EXPECT_EQ(buffers[1].first, "running_var");
  EXPECT_EQ(buffers[2].first, "num_batches_tracked");
  EXPECT_EQ(values(bn.running_var), std::vector<double>({1, 1, 1}));

  const Tensor x = random_tensor({4, 3, 2, 2}, kFloat32, 1.0, 3.0);
  const Tensor y = bn(x);
  // Training: batch statistics (each channel of y has mean 0), running ones moved by momentum.
  EXPECT_TRUE(allclose(mean(y, {0, 2, 3}), zeros({3}), 1e-5, 1e-5));
  EXPECT_TRUE(allclose(bn.running_mean, mean(x, {0, 2, 3}) * 0.2, 1e-5, 1e-6));
  EXPECT_TRUE(allclose(bn.running_var, var(x, {0, 2, 3}) * 0.2 + 0.8, 1e-5, 1e-6));
  EXPECT_EQ(values(bn.num_batches_tracked), std::vector<double>({1}));

  // Eval: the running statistics, unchanged by the call.
  bn.eval();
  const std::vector<double> rm = values(bn.running_mean);
  const Tensor e = bn(x);
  EXPECT_TRUE(allclose(e,
                       (x - bn.running_mean.reshape({1, 3, 1, 1})) /
                           sqrt(bn.running_var.reshape({1, 3, 1, 1}) + 1e-5),
                       1e-5, 1e-5));
  EXPECT_EQ(values(bn.running_mean), rm);

  // to() converts the buffers in place (handles see it); the step counter stays int64.
  bn.to(kFloat64);
  EXPECT_EQ(bn.running_mean.dtype(), kFloat64);
  EXPECT_EQ(bn.named_buffers()[1].second.dtype(), kFloat64);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), kInt64);

  nn::BatchNorm1d bn1(5, 1e-5, 0.1, false, false);
  EXPECT_TRUE(bn1.named_parameters().empty());
  EXPECT_TRUE(bn1.named_buffers().empty());
  bn1.eval();  // without running statistics: the batch's
  const Tensor z = bn1(random_tensor({6, 5}));
  EXPECT_TRUE(allclose(mean(z, {0}), zeros({5}), 1e-5, 1e-5));
  expect_error(
      [&] {
        bn1(random_tensor({6, 5, 2, 2}));
      },
      {"BatchNorm1d", "2-D", "float32[6, 5, 2, 2]"});
  expect_error(
      [&] {
        bn(random_tensor({2, 4, 3, 3}, kFloat64));
      },
      {"BatchNorm2d", "3 channels", "float64[2, 4, 3, 3]"});
}

TEST(CnnModules, GroupNormPoolsAndFlatten) {
  nn::GroupNorm gn(2, 4);
  EXPECT_EQ(values(gn.weight), std::vector<double>({1, 1, 1, 1}));
  const Tensor x = random_tensor({2, 4, 6, 6});
  EXPECT_TRUE(allclose(gn(x), group_norm(x, 2, gn.weight, gn.bias)));
  EXPECT_TRUE(allclose(nn::MaxPool2d({3}, {2}, {1})(x), max_pool2d(x, {3}, {2}, {1})));
  EXPECT_TRUE(allclose(nn::AvgPool2d({2})(x), avg_pool2d(x, {2})));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({1})(x).sizes(), Shape({2, 4, 1, 1}));
  EXPECT_EQ(nn::Flatten()(x).sizes(), Shape({2, 144}));
  EXPECT_EQ(nn::Flatten(0, 1)(x).sizes(), Shape({8, 6, 6}));
  expect_error([] { nn::GroupNorm(3, 4); }, {"GroupNorm", "divisible by num_groups (3)"});
}

// A small CNN: one SGD step lowers its loss on a fixed batch, in eager and lazy mode alike.
TEST(CnnModules, SmallNetworkTrains) {
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    manual_seed(3);
    auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(3, 8, Shape{3}, Shape{1}, Shape{1}),
        std::make_shared<nn::BatchNorm2d>(8), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::MaxPool2d>(Shape{2}), std::make_shared<nn::GroupNorm>(2, 8),
        std::make_shared<nn::AdaptiveAvgPool2d>(Shape{1}), std::make_shared<nn::Flatten>(),
        std::make_shared<nn::Linear>(8, 4)});
    const Tensor x = random_tensor({8, 3, 8, 8});
    const Tensor target = randint(4, {8});
    optim::SGDOptions options;
    options.lr = 0.1;
    optim::SGD opt(net->parameters(), options);
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      Tensor loss = cross_entropy((*net)(x), target);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    EXPECT_LT(losses.back(), losses.front()) << (lazy ? "lazy" : "eager");
  }
}

// A traced step updates BatchNorm's running statistics on every replay, as eager steps do.
TEST(CnnModules, TracedBatchNormUpdatesRunningStatistics) {
  const Tensor x = random_tensor({4, 2, 5, 5});
  auto run = [&](bool traced) {
    manual_seed(5);
    auto conv = std::make_shared<nn::Conv2d>(2, 3, Shape{3});
    auto bn = std::make_shared<nn::BatchNorm2d>(3);
    auto step = [&](const std::vector<Tensor>& in) {
      conv->zero_grad();
      Tensor loss = sum(relu((*bn)((*conv)(in[0]))));
      loss.backward();
      return std::vector<Tensor>{loss.detach()};
    };
    if (traced) {
      jit::Function f = jit::trace(step, {x});
      for (int i = 0; i < 3; ++i) f({x});
    } else {
      LazyGuard eager(false);
      for (int i = 0; i < 3; ++i) step({x});
    }
    return std::vector<Tensor>{bn->running_mean.clone(), bn->running_var.clone(),
                               conv->weight.grad().clone()};
  };
  const std::vector<Tensor> eager = run(false), traced = run(true);
  for (size_t i = 0; i < eager.size(); ++i)
    EXPECT_TRUE(allclose(traced[i], eager[i], 1e-5, 1e-5)) << i;
}

}  // namespace
}  // namespace kiln
