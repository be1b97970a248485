// The MLP training example as a function: a two-class spiral, an MLP, Adam; config in, result out.
#pragma once

#include <cstdint>
#include <ostream>

namespace kiln::examples {

struct MlpTrainConfig {
  int64_t points_per_class = 500;
  double turns = 1.25;  // how far each arm of the spiral winds around the origin
  double noise = 0.08;  // standard deviation of the Gaussian jitter added to every point
  int64_t hidden = 64;  // width of each of the two hidden layers
  int64_t steps = 500;  // full-batch Adam steps
  double lr = 0.01;
  uint64_t seed = 0;
  int64_t log_every = 100;      // 0: no progress lines
  std::ostream* log = nullptr;  // where progress goes; null: nowhere
};

struct MlpTrainResult {
  double initial_loss = 0;  // before the first step
  double final_loss = 0;    // after the last step, on the whole data set
  double accuracy = 0;      // fraction of points classified correctly after the last step
  int64_t steps = 0;
  double seconds = 0;  // wall time of the training loop
};

// Generates the spiral (deterministic for a seed), trains a 2-hidden-layer MLP on it and returns
// the final loss and accuracy.
MlpTrainResult train_mlp(const MlpTrainConfig& config);

}  // namespace kiln::examples
