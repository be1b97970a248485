// Runs the transformer language model example (tools/examples/transformer_lm.cpp) briefly with
// small sizes, untraced and with the training step traced: the training loss falls from near
// log(vocabulary), and the validation perplexity ends well below the vocabulary size.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <numeric>

#include "kiln/jit.h"
#include "transformer_lm.h"

namespace kiln::examples {
namespace {

TransformerLmConfig small_config() {
  TransformerLmConfig c;
  c.train_tokens = 20000;
  c.valid_tokens = 2000;
  c.d_model = 32;
  c.nhead = 4;
  c.num_layers = 2;
  c.dim_feedforward = 64;
  c.batch_size = 16;
  c.bptt = 16;
  c.epochs = 2;
  c.max_steps_per_epoch = 40;
  c.lr = 3e-3;
  c.log_every = 0;
  return c;
}

double mean(std::vector<double>::const_iterator begin, std::vector<double>::const_iterator end) {
  return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
}

void expect_loss_falls(const TransformerLmResult& r, const char* what) {
  ASSERT_EQ(r.steps, 80) << what;
  ASSERT_EQ(r.valid_perplexity.size(), 2u) << what;
  const double first = mean(r.step_losses.begin(), r.step_losses.begin() + 5);
  const double last = mean(r.step_losses.end() - 5, r.step_losses.end());
  EXPECT_NEAR(first, std::log(static_cast<double>(r.vocab_size)), 0.7) << what;
  EXPECT_LT(last, first - 1.0) << what;
  for (double ppl : r.valid_perplexity) EXPECT_TRUE(std::isfinite(ppl)) << what;
  EXPECT_LT(r.valid_perplexity.back(), static_cast<double>(r.vocab_size) / 3) << what;
  std::cout << what << ": loss " << first << " -> " << last << ", valid ppl "
            << r.valid_perplexity.back() << " (vocab " << r.vocab_size << "), " << r.seconds
            << " s\n";
}

TEST(TransformerLmExample, LossFallsInAShortRun) {
  expect_loss_falls(train_transformer_lm(small_config()), "untraced");
}

TEST(TransformerLmExample, LossFallsWithTheTracedStep) {
  TransformerLmConfig c = small_config();
  c.trace = true;
  c.norm_first = true;
  const jit::Stats before = jit::stats();
  expect_loss_falls(train_transformer_lm(c), "traced, norm_first");
  // Traced once; every later step replays the plan (the step's shapes never change).
  EXPECT_EQ(jit::stats().traces - before.traces, 1);
  EXPECT_GE(jit::stats().replays - before.replays, 79);
}

}  // namespace
}  // namespace kiln::examples
