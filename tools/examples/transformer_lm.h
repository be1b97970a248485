// The transformer language model example as a function: a small causal transformer encoder
// trained on word_lm's generated corpus.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "word_lm.h"

namespace kiln::examples {

struct TransformerLmConfig {
  int64_t train_tokens = 60000;
  int64_t valid_tokens = 6000;
  int64_t d_model = 64;
  int64_t nhead = 4;
  int64_t num_layers = 2;
  int64_t dim_feedforward = 256;
  double dropout = 0.1;
  bool norm_first = false;  // pre-norm layers (post-norm, torch's default, otherwise)
  int64_t batch_size = 20;
  int64_t bptt = 32;  // context length: tokens per training sequence
  int64_t epochs = 3;
  int64_t max_steps_per_epoch = 0;  // 0: every segment of the training data
  double lr = 1e-3;                 // Adam
  double clip = 0.5;                // max L2 norm of all gradients together
  uint64_t seed = 1;
  int64_t log_every = 100;  // steps between progress lines; 0: only per-epoch lines
  // Trace the whole training step (forward, backward, clipping, Adam) once with jit::trace and
  // replay it.
  bool trace = false;
  std::function<void()> after_step;  // called after every training step (benchmarks measure)
  std::ostream* log = nullptr;
};

using TransformerLmResult = LmTrainingResult;

TransformerLmResult train_transformer_lm(const TransformerLmConfig& config);

}  // namespace kiln::examples
