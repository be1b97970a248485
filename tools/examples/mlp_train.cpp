// Example: trains a small MLP (kiln::nn, kiln::optim) to separate the two arms of a spiral.
#include "mlp_train.h"

#include "flags.h"

#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/optim.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace kiln::examples {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Draws come from a bit-exact generator (not std::normal_distribution, whose algorithm varies by
// standard library), so a seed gives the same data set everywhere.
double uniform01(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}
double normal(std::mt19937_64& gen) {
  double u1 = uniform01(gen), u2 = uniform01(gen);
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * kPi * u2);
}

struct Dataset {
  Tensor x;  // [2 * points_per_class, 2] float32
  Tensor y;  // class labels, int64
};

// Arm c of the spiral: radius growing linearly from the centre, angle turning with the radius,
// the second arm rotated half a turn from the first.
Dataset make_spiral(const MlpTrainConfig& config) {
  std::mt19937_64 gen(config.seed);
  const int64_t n = config.points_per_class;
  std::vector<float> xs;
  std::vector<int64_t> ys;
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t i = 0; i < n; ++i) {
      double r =
          0.05 + 0.95 * static_cast<double>(i) / static_cast<double>(std::max<int64_t>(n - 1, 1));
      double angle = 2.0 * kPi * config.turns * r + kPi * static_cast<double>(c);
      xs.push_back(static_cast<float>(r * std::cos(angle) + config.noise * normal(gen)));
      xs.push_back(static_cast<float>(r * std::sin(angle) + config.noise * normal(gen)));
      ys.push_back(c);
    }
  }
  return {from_vector(xs, Shape{2 * n, 2}), from_vector(ys)};
}

double accuracy_of(const Tensor& logits, const Tensor& y) {
  return logits.argmax(1).eq(y).to(kFloat64).mean().item<double>();
}

}  // namespace

MlpTrainResult train_mlp(const MlpTrainConfig& config) {
  KILN_CHECK(config.points_per_class > 0 && config.hidden > 0 && config.steps >= 0,
             "train_mlp: points_per_class and hidden must be positive and steps non-negative");
  manual_seed(config.seed);
  Dataset data = make_spiral(config);
  nn::Sequential model{std::make_shared<nn::Linear>(2, config.hidden), std::make_shared<nn::Tanh>(),
                       std::make_shared<nn::Linear>(config.hidden, config.hidden),
                       std::make_shared<nn::Tanh>(),
                       std::make_shared<nn::Linear>(config.hidden, 2)};
  optim::Adam optimizer(model.parameters(), optim::AdamOptions{config.lr});

  MlpTrainResult result;
  {
    NoGradGuard no_grad;
    result.initial_loss = cross_entropy(model.forward(data.x), data.y).item<double>();
  }
  auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= config.steps; ++step) {
    optimizer.zero_grad();
    Tensor logits = model.forward(data.x);
    Tensor loss = cross_entropy(logits, data.y);
    loss.backward();
    optimizer.step();
    if (config.log && config.log_every > 0 && (step % config.log_every == 0 || step == 1)) {
      *config.log << "step " << step << "  loss " << loss.item<double>() << "  accuracy "
                  << accuracy_of(logits.detach(), data.y) << "\n";
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  NoGradGuard no_grad;
  model.eval();
  Tensor logits = model.forward(data.x);
  result.final_loss = cross_entropy(logits, data.y).item<double>();
  result.accuracy = accuracy_of(logits, data.y);
  result.steps = config.steps;
  return result;
}

}  // namespace kiln::examples

#ifndef KILN_EXAMPLE_NO_MAIN
namespace {

void usage(const char* argv0) {
  std::cout << "usage: " << argv0
            << " [--steps N] [--hidden N] [--points N] [--lr X] [--noise X] [--turns X] "
               "[--seed N] [--log-every N]\n"
               "Trains a 2-64-64-2 tanh MLP with Adam on a generated two-class spiral and prints "
               "loss and accuracy.\n";
}

}  // namespace

int main(int argc, char** argv) {
  kiln::examples::MlpTrainConfig config;
  config.log = &std::cout;
  kiln::examples::Flags flags;
  flags.add("--steps", &config.steps);
  flags.add("--hidden", &config.hidden);
  flags.add("--points", &config.points_per_class);
  flags.add("--lr", &config.lr);
  flags.add("--noise", &config.noise);
  flags.add("--turns", &config.turns);
  flags.add("--seed", &config.seed);
  flags.add("--log-every", &config.log_every);
  if (auto code = flags.parse(argc, argv, [&] { usage(argv[0]); })) return *code;
  try {
    auto r = kiln::examples::train_mlp(config);
    std::cout << "final: loss " << r.final_loss << " (initial " << r.initial_loss << "), accuracy "
              << r.accuracy << " after " << r.steps << " steps in " << r.seconds << " s\n";
  } catch (const kiln::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
#endif
