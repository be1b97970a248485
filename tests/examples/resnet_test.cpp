// Runs the ResNet example (tools/examples/resnet.cpp) briefly: the generated shapes are
// deterministic and balanced, a short traced training run learns them well above chance, and
// --device cuda stops with a kiln::Error rather than crashing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "resnet.h"

namespace kiln::examples {
namespace {

std::vector<float> floats(const Tensor& t) {
  Tensor c = t.contiguous();
  const float* p = static_cast<const float*>(c.raw_data_ptr());
  return {p, p + c.numel()};
}

TEST(ResNetExample, ShapesAreDeterministicAndBalanced) {
  ShapesDataset a = generate_shapes(600, 16, 3), b = generate_shapes(600, 16, 3);
  ASSERT_EQ(a.images.sizes(), (Shape{600, 3, 16, 16}));
  ASSERT_EQ(a.labels.sizes(), (Shape{600}));
  EXPECT_EQ(floats(a.images), floats(b.images));
  EXPECT_NE(floats(a.images), floats(generate_shapes(600, 16, 4).images));
  std::vector<int64_t> count(10, 0);
  for (int64_t i = 0; i < 600; ++i) {
    const int64_t label = a.labels.narrow(0, i, 1).item<int64_t>();
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++count[label];
  }
  for (int64_t n : count) EXPECT_GT(n, 30) << "every class appears about 60 times";
  // Normalized pixels: roughly zero mean, unit-scale spread.
  const double mean = a.images.to(kFloat64).mean().item<double>();
  const double sd = (a.images.to(kFloat64) - mean).pow(2.0).mean().item<double>();
  EXPECT_LT(std::abs(mean), 0.3);
  EXPECT_GT(sd, 0.3);
  EXPECT_LT(sd, 3.0);
  EXPECT_EQ(shape_class_names().size(), 10u);
}

// Parameters of a ResNet with ResNet-18's layout (7x7 stem, two basic blocks in each of four
// stages, batch norm weight and bias per channel, 1x1 downsampling at each stage after the first),
// counted layer by layer as torchvision's resnet18 lays them out.
int64_t resnet18_parameters(int64_t width, int64_t classes) {
  int64_t n = 3 * width * 7 * 7 + 2 * width;  // stem convolution and batch norm
  int64_t in = width;
  for (int64_t stage = 0; stage < 4; ++stage) {
    const int64_t c = width << stage;
    n += in * c * 9 + c * c * 9 + 4 * c;  // first block: two convolutions, two batch norms
    if (stage > 0) n += in * c + 2 * c;   // its 1x1 downsampling and batch norm
    n += 2 * c * c * 9 + 4 * c;           // second block
    in = c;
  }
  return n + in * classes + classes;  // the linear head
}

// make_resnet builds ResNet-18's layout: the count above is torchvision's resnet18 at width 64
// (11,689,512 with 1000 classes), and a narrow one built here matches it. (A narrow one: building
// the full-width model draws 11.7M random numbers, which takes seconds.)
TEST(ResNetExample, ResNet18LayoutHasTorchvisionsParameters) {
  ASSERT_EQ(resnet18_parameters(64, 1000), 11689512);
  manual_seed(0);
  ResNetArch arch = resnet18_arch(10);
  arch.width = 8;
  std::shared_ptr<nn::Module> model = make_resnet(arch);
  int64_t n = 0;
  for (const Tensor& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, resnet18_parameters(8, 10));
  EXPECT_EQ(model->buffers().size(), 3u * 20);  // 20 batch norms: mean, var, batches tracked
  NoGradGuard no_grad;
  model->eval();
  Tensor logits = model->forward(randn({2, 3, 64, 64}));
  EXPECT_EQ(logits.sizes(), (Shape{2, 10}));
  EXPECT_TRUE(isfinite(logits).all().item<bool>());
}

TEST(ResNetExample, LearnsTheShapesInAShortTracedRun) {
  ResNetConfig c;
  c.train_images = 4800;
  c.test_images = 1000;
  c.batch_size = 32;  // small steps: most of a step's time is per-op overhead at this size
  c.steps = 400;
  c.log_every = 0;
  const jit::Stats before = jit::stats();
  ResNetResult r = train_resnet(c);
  const jit::Stats after = jit::stats();
  ASSERT_EQ(r.steps, 400);
  ASSERT_EQ(r.step_losses.size(), 400u);
  // Traced once, every later step a replay of the plan.
  EXPECT_EQ(after.traces - before.traces, 1);
  EXPECT_GE(after.replays - before.replays, 299);
  auto mean = [](auto begin, auto end) {
    return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
  };
  const double first = mean(r.step_losses.begin(), r.step_losses.begin() + 10);
  const double last = mean(r.step_losses.end() - 20, r.step_losses.end());
  EXPECT_NEAR(first, std::log(10.0), 0.6);  // starts near uniform over 10 classes
  EXPECT_LT(last, first - 1.0);
  EXPECT_GT(r.test_accuracy, 0.6);  // chance is 0.1; this run reaches about 0.95
  EXPECT_LT(r.test_loss, 1.5);
  std::cout << "resnet: loss " << first << " -> " << last << ", test accuracy " << r.test_accuracy
            << ", " << r.seconds << " s for " << r.steps << " steps\n";
}

TEST(ResNetExample, CudaDeviceTrainsOrFailsWithAKilnError) {
  ResNetConfig c;
  c.train_images = 64;
  c.test_images = 16;
  c.batch_size = 32;
  c.steps = 2;
  c.device = "cuda";
  // Without a GPU moving the parameters fails with an error that names the cause, not a crash;
  // with one the network trains there (tests/api/cuda_conv_test.cpp compares its losses with the
  // CPU's).
  if (cuda::is_available()) {
    const ResNetResult r = train_resnet(c);
    ASSERT_EQ(r.step_losses.size(), 2u);
    for (double loss : r.step_losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
  } else {
    try {
      train_resnet(c);
      FAIL() << "expected a kiln::Error";
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
    }
  }
  c.device = "tpu";
  EXPECT_THROW(train_resnet(c), kiln::Error);
}

}  // namespace
}  // namespace kiln::examples
