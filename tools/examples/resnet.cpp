// Example: a small ResNet (basic blocks with batch norm and residual adds, global average pooling,
// a linear head) trained on images of coloured shapes that kiln draws itself, the whole training
// step (forward, backward, Adam) traced once with jit::trace and replayed.
#include "resnet.h"

#include "flags.h"

#include <kiln/jit.h>
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/optim.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace kiln::examples {
namespace {

constexpr int64_t kClasses = 10;
constexpr double kPi = 3.14159265358979323846;

// ---------------------------------------------------------------------------- the data set

// Bit-exact draws (the std distributions differ between standard libraries), so a seed gives
// the same images everywhere.
double uniform01(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}
double uniform(std::mt19937_64& gen, double lo, double hi) {
  return lo + (hi - lo) * uniform01(gen);
}
double normal(std::mt19937_64& gen) {
  double u1 = uniform01(gen), u2 = uniform01(gen);
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * kPi * u2);
}

// Whether the point (dx, dy) from the shape's centre (y pointing down) lies inside shape `label`
// of radius r and stroke width t.
bool inside(int64_t label, double dx, double dy, double r, double t) {
  const double ax = std::abs(dx), ay = std::abs(dy), d = std::hypot(dx, dy);
  switch (label) {
    case 0:
      return std::max(ax, ay) <= 0.85 * r;  // filled square
    case 1:
      return std::abs(std::max(ax, ay) - (0.85 * r - t / 2)) <= t / 2;  // outlined square
    case 2:
      return d <= r;  // disc
    case 3:
      return std::abs(d - (r - t / 2)) <= t / 2;  // ring
    case 4:
      return dy >= -r && dy <= 0.8 * r && ax <= (dy + r) / 1.8;  // triangle, apex up
    case 5:
      return (ax <= 0.6 * t && ay <= r) || (ay <= 0.6 * t && ax <= r);  // plus
    case 6:
      return std::abs(ax - ay) <= 0.85 * t && std::max(ax, ay) <= 0.8 * r;  // X
    case 7:
      return ay <= 0.3 * r && ax <= r;  // horizontal bar
    case 8:
      return ax <= 0.3 * r && ay <= r;  // vertical bar
    default:
      return ax + ay <= r;  // diamond
  }
}

// Draws one image into out[3 * size * size] (channel-major).
void draw_shape(int64_t label, int64_t size, std::mt19937_64& gen, float* out) {
  const double s = static_cast<double>(size);
  const double r = uniform(gen, 0.2 * s, 0.4 * s);
  const double t = std::max(1.2, 0.3 * r);
  const double cx = uniform(gen, r, s - r), cy = uniform(gen, r, s - r);
  // Each foreground channel differs from the background's by 0.3 to 0.7 (modulo 1), so every
  // colour pair has contrast but colour says nothing about the class.
  std::array<double, 3> bg{}, fg{};
  for (int c = 0; c < 3; ++c) {
    bg[c] = uniform01(gen);
    fg[c] = std::fmod(bg[c] + uniform(gen, 0.3, 0.7), 1.0);
  }
  const int64_t plane = size * size;
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x) {
      // Coverage from 2x2 samples per pixel: edges are anti-aliased, small shapes keep their form.
      double cover = 0;
      for (double sy : {0.25, 0.75})
        for (double sx : {0.25, 0.75})
          cover += inside(label, static_cast<double>(x) + sx - cx, static_cast<double>(y) + sy - cy,
                          r, t)
                       ? 0.25
                       : 0.0;
      for (int c = 0; c < 3; ++c) {
        const double v = bg[c] + cover * (fg[c] - bg[c]) + 0.08 * normal(gen);
        out[c * plane + y * size + x] = static_cast<float>((v - 0.5) / 0.3);
      }
    }
  }
}

// ---------------------------------------------------------------------------- the model

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(in, out, Shape{3, 3}, Shape{stride, stride}, Shape{1, 1},
                                      Shape{1, 1}, 1, /*bias=*/false);
}

// ResNet's basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the shortcut a
// strided 1x1 convolution with batch norm where the block changes the size or the channels.
class BasicBlock : public nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv3x3(in, out, stride))),
        bn1(register_module("bn1", std::make_shared<nn::BatchNorm2d>(out))),
        conv2(register_module("conv2", conv3x3(out, out, 1))),
        bn2(register_module("bn2", std::make_shared<nn::BatchNorm2d>(out))) {
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample",
          std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
              std::make_shared<nn::Conv2d>(in, out, Shape{1, 1}, Shape{stride, stride}, Shape{0, 0},
                                           Shape{1, 1}, 1, /*bias=*/false),
              std::make_shared<nn::BatchNorm2d>(out)}));
    }
  }
  std::string name() const override { return "BasicBlock"; }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(bn1->forward(conv1->forward(x)));
    h = bn2->forward(conv2->forward(h));
    return relu(h + (downsample ? downsample->forward(x) : x));
  }

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Conv2d> conv2;
  std::shared_ptr<nn::BatchNorm2d> bn2;
  std::shared_ptr<nn::Sequential> downsample;  // null: identity shortcut
};

class ResNet : public nn::Module {
 public:
  explicit ResNet(const ResNetArch& arch) {
    KILN_CHECK(arch.width > 0 && arch.classes > 0 && !arch.blocks.empty(),
               "make_resnet: width and classes must be positive and there must be a stage");
    features = register_module("features", std::make_shared<nn::Sequential>());
    if (arch.imagenet_stem) {
      features->push_back(std::make_shared<nn::Conv2d>(3, arch.width, Shape{7, 7}, Shape{2, 2},
                                                       Shape{3, 3}, Shape{1, 1}, 1,
                                                       /*bias=*/false));
    } else {
      features->push_back(conv3x3(3, arch.width, 1));
    }
    features->push_back(std::make_shared<nn::BatchNorm2d>(arch.width));
    features->push_back(std::make_shared<nn::ReLU>());
    if (arch.imagenet_stem)
      features->push_back(std::make_shared<nn::MaxPool2d>(Shape{3, 3}, Shape{2, 2}, Shape{1, 1}));
    int64_t in = arch.width;
    for (size_t stage = 0; stage < arch.blocks.size(); ++stage) {
      const int64_t out = arch.width << stage;
      KILN_CHECK(arch.blocks[stage] > 0, "make_resnet: stage ", stage, " has no blocks");
      for (int64_t b = 0; b < arch.blocks[stage]; ++b) {
        features->push_back(std::make_shared<BasicBlock>(in, out, stage > 0 && b == 0 ? 2 : 1));
        in = out;
      }
    }
    features->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(Shape{1, 1}));
    features->push_back(std::make_shared<nn::Flatten>());
    fc = register_module("fc", std::make_shared<nn::Linear>(in, arch.classes));
  }
  std::string name() const override { return "ResNet"; }
  Tensor forward(const Tensor& x) override { return fc->forward(features->forward(x)); }

  std::shared_ptr<nn::Sequential> features;
  std::shared_ptr<nn::Linear> fc;
};

// Accuracy and mean loss over a data set, in eval mode (batch norm's running statistics), in
// chunks so the activations stay small.
void evaluate(nn::Module& model, const ShapesDataset& data, ResNetResult& result) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t n = data.labels.size(0), chunk = 500;
  double correct = 0, loss = 0;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t len = std::min(chunk, n - i);
    Tensor y = data.labels.narrow(0, i, len);
    Tensor logits = model.forward(data.images.narrow(0, i, len));
    correct += logits.argmax(1).eq(y).to(kFloat64).sum().item<double>();
    loss += cross_entropy(logits, y, Reduction::Sum).item<double>();
  }
  model.train();
  result.test_accuracy = correct / static_cast<double>(n);
  result.test_loss = loss / static_cast<double>(n);
}

}  // namespace

std::shared_ptr<nn::Module> make_resnet(const ResNetArch& arch) {
  return std::make_shared<ResNet>(arch);
}

const std::vector<std::string>& shape_class_names() {
  static const std::vector<std::string> names = {
      "square", "outlined square", "disc",   "ring", "triangle", "plus", "X",
      "bar",    "vertical bar",    "diamond"};
  return names;
}

ShapesDataset generate_shapes(int64_t count, int64_t image_size, uint64_t seed) {
  KILN_CHECK(count > 0 && image_size >= 8,
             "generate_shapes: need a positive count and an image size of at least 8, got count ",
             count, ", image_size ", image_size);
  std::mt19937_64 gen(seed);
  const int64_t pixels = 3 * image_size * image_size;
  std::vector<float> images(static_cast<size_t>(count * pixels));
  std::vector<int64_t> labels(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    labels[i] = static_cast<int64_t>(gen() % kClasses);
    draw_shape(labels[i], image_size, gen, images.data() + i * pixels);
  }
  return {from_vector(images, Shape{count, 3, image_size, image_size}), from_vector(labels)};
}

ResNetResult train_resnet(const ResNetConfig& c) {
  KILN_CHECK(c.batch_size > 0 && c.steps >= 0 && c.width > 0 && c.blocks_per_stage > 0,
             "train_resnet: batch_size, width and blocks_per_stage must be positive and steps "
             "non-negative");
  KILN_CHECK(c.train_images >= c.batch_size,
             "train_resnet: need at least one batch of training images, got ", c.train_images,
             " images for batch_size ", c.batch_size);
  const Device device = Device::parse(c.device);
  manual_seed(c.seed);
  // Different seeds for the two splits: the test images are new draws.
  ShapesDataset train = generate_shapes(c.train_images, c.image_size, c.seed);
  ShapesDataset test = generate_shapes(c.test_images, c.image_size, c.seed ^ 0x9e3779b97f4a7c15ULL);
  // The CIFAR layout (He et al. 2016, section 4.2) at a small size.
  ResNet model(ResNetArch{c.width, std::vector<int64_t>(3, c.blocks_per_stage), false, kClasses});
  // Parameters, running statistics and both splits move to the device once: a training step
  // then reads nothing from the host.
  model.to(device);
  train = {train.images.to(device), train.labels.to(device)};
  test = {test.images.to(device), test.labels.to(device)};
  optim::Adam optimizer(model.parameters(), optim::AdamOptions{c.lr});

  ResNetResult result;
  for (const Tensor& p : model.parameters()) result.parameters += p.numel();
  if (c.log)
    *c.log << "shapes (generated): " << c.train_images << " training and " << c.test_images
           << " test images of 3x" << c.image_size << "x" << c.image_size << ", " << kClasses
           << " classes; ResNet with " << result.parameters << " parameters on " << device.str()
           << "\n";

  auto train_step = [&](const std::vector<Tensor>& in) {
    optimizer.zero_grad();
    Tensor loss = cross_entropy(model.forward(in[0]), in[1]);
    loss.backward();
    optimizer.step();
    return std::vector<Tensor>{loss.detach()};
  };
  // The images were drawn independently in random order, so consecutive fixed batches are
  // already shuffled; a partial last batch is skipped so that every call matches one trace.
  const int64_t batches = c.train_images / c.batch_size;
  auto batch = [&](int64_t step) {
    const int64_t start = (step % batches) * c.batch_size;
    return std::vector<Tensor>{train.images.narrow(0, start, c.batch_size),
                               train.labels.narrow(0, start, c.batch_size)};
  };
  // Losses are read only at progress lines and at the end, so a step waits for nothing.
  std::vector<Tensor> pending;
  auto read_pending = [&] {
    for (const Tensor& l : pending) result.step_losses.push_back(l.item<double>());
    pending.clear();
  };
  auto start = std::chrono::steady_clock::now();
  jit::Function traced_step;
  for (int64_t step = 0; step < c.steps; ++step) {
    std::vector<Tensor> in = batch(step);
    if (!traced_step.defined()) traced_step = jit::trace(train_step, in);
    pending.push_back(traced_step(in)[0]);
    if (c.log && c.log_every > 0 && (step + 1) % c.log_every == 0) {
      const size_t n = pending.size();
      read_pending();
      double mean = 0;
      for (size_t i = result.step_losses.size() - n; i < result.step_losses.size(); ++i)
        mean += result.step_losses[i] / static_cast<double>(n);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      *c.log << "step " << step + 1 << "  loss " << mean << "  (" << secs << " s)\n";
    }
  }
  read_pending();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.steps = c.steps;
  evaluate(model, test, result);
  if (c.log)
    *c.log << "test: accuracy " << result.test_accuracy << "  loss " << result.test_loss << "\n";
  return result;
}

}  // namespace kiln::examples

#ifndef KILN_EXAMPLE_NO_MAIN
namespace {

void usage(const char* argv0) {
  kiln::examples::ResNetConfig d;
  std::cout << "usage: " << argv0 << " [flags]\n"
            << "Trains a small ResNet (basic blocks, batch norm, global average pooling) with "
               "Adam,\n"
            << "the whole training step traced once (jit::trace) and replayed, and prints the "
               "training\n"
            << "loss and the test accuracy.\n\n"
            << "The images are generated by kiln itself: ten shapes (square, outlined square, "
               "disc,\n"
            << "ring, triangle, plus, X, bar, vertical bar, diamond) at random positions and "
               "sizes,\n"
            << "in random colours, with pixel noise. No external data is used.\n\n"
            << "  --steps N          training steps (" << d.steps << ")\n"
            << "  --batch N          images per step (" << d.batch_size << ")\n"
            << "  --device NAME      cpu or cuda (" << d.device << ")\n"
            << "  --size N           image height and width (" << d.image_size << ")\n"
            << "  --train N          training images (" << d.train_images << ")\n"
            << "  --test N           test images (" << d.test_images << ")\n"
            << "  --width N          channels of the first stage (" << d.width << ")\n"
            << "  --blocks N         basic blocks per stage (" << d.blocks_per_stage << ")\n"
            << "  --lr X             Adam's learning rate (" << d.lr << ")\n"
            << "  --seed N           (" << d.seed << ")\n"
            << "  --log-every N      steps between progress lines, 0 = none (" << d.log_every
            << ")\n";
}

}  // namespace

int main(int argc, char** argv) {
  kiln::examples::ResNetConfig c;
  c.log = &std::cout;
  kiln::examples::Flags flags;
  flags.add("--steps", &c.steps);
  flags.add("--batch", &c.batch_size);
  flags.add("--device", &c.device);
  flags.add("--size", &c.image_size);
  flags.add("--train", &c.train_images);
  flags.add("--test", &c.test_images);
  flags.add("--width", &c.width);
  flags.add("--blocks", &c.blocks_per_stage);
  flags.add("--lr", &c.lr);
  flags.add("--seed", &c.seed);
  flags.add("--log-every", &c.log_every);
  if (auto code = flags.parse(argc, argv, [&] { usage(argv[0]); })) return *code;
  try {
    auto r = kiln::examples::train_resnet(c);
    std::cout << "done: " << r.steps << " steps in " << r.seconds << " s, test accuracy "
              << r.test_accuracy << "\n";
  } catch (const kiln::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
#endif
