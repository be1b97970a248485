// Runs the word language model example (tools/examples/word_lm.cpp) briefly with small sizes: the
// generated corpus is deterministic and in vocabulary, and the training loss falls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <set>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "word_lm.h"

namespace kiln::examples {
namespace {

// A model and corpus small enough for a few seconds of training.
WordLmConfig small_config() {
  WordLmConfig c;
  c.train_tokens = 20000;
  c.valid_tokens = 2000;
  c.embedding_dim = 32;
  c.hidden_size = 64;
  c.batch_size = 16;
  c.bptt = 16;
  return c;
}

TEST(WordLmExample, CorpusIsDeterministicAndInVocabulary) {
  std::vector<std::string> vocab = word_lm_vocabulary();
  EXPECT_GT(vocab.size(), 200u);
  EXPECT_LT(vocab.size(), 1000u);
  std::set<std::string> known(vocab.begin(), vocab.end());
  EXPECT_EQ(known.size(), vocab.size());
  std::vector<std::string> a = generate_corpus(5000, 3), b = generate_corpus(5000, 3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, generate_corpus(5000, 4));
  EXPECT_GE(a.size(), 5000u);
  EXPECT_EQ(a.back(), "<eos>");
  std::set<std::string> used;
  for (const auto& w : a) {
    EXPECT_TRUE(known.count(w)) << w;
    used.insert(w);
  }
  EXPECT_GT(used.size(), vocab.size() / 2);  // the grammar reaches most of the vocabulary
  // "a" never precedes a vowel (the generator writes "an").
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == "a") {
      EXPECT_EQ(std::string("aeiou").find(a[i + 1][0]), std::string::npos) << a[i + 1];
    }
  }
}

TEST(WordLmExample, LossFallsInAShortRun) {
  WordLmConfig c = small_config();
  c.epochs = 2;
  c.max_steps_per_epoch = 60;
  c.lr = 1e-2;
  c.log_every = 0;
  WordLmResult r = train_word_lm(c);
  ASSERT_EQ(r.steps, 120);
  ASSERT_EQ(r.valid_perplexity.size(), 2u);
  auto mean = [](auto begin, auto end) {
    return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
  };
  const double first = mean(r.step_losses.begin(), r.step_losses.begin() + 5);
  const double last = mean(r.step_losses.end() - 5, r.step_losses.end());
  EXPECT_NEAR(first, std::log(static_cast<double>(r.vocab_size)), 0.5);  // starts near uniform
  EXPECT_LT(last, first - 1.0);
  for (double ppl : r.valid_perplexity) {
    EXPECT_TRUE(std::isfinite(ppl));
    EXPECT_LT(ppl, static_cast<double>(r.vocab_size));
  }
  // Well past unigram statistics by the second epoch.
  EXPECT_LT(r.valid_perplexity.back(), static_cast<double>(r.vocab_size) / 3);
  std::cout << "word_lm: loss " << first << " -> " << last << ", valid ppl "
            << r.valid_perplexity.back() << " (vocab " << r.vocab_size << "), " << r.seconds
            << " s\n";
}

// The SGD path of the example (torch's recipe: lr 20, gradients clipped at 0.25) learns too.
TEST(WordLmExample, SgdLearns) {
  WordLmConfig c = small_config();
  c.valid_tokens = 1000;
  c.epochs = 1;
  c.max_steps_per_epoch = 60;
  c.optimizer = "sgd";
  c.lr = 20;
  c.clip = 0.25;
  c.log_every = 0;
  WordLmResult r = train_word_lm(c);
  ASSERT_EQ(r.step_losses.size(), 60u);
  auto mean = [](auto begin, auto end) {
    return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
  };
  const double first = mean(r.step_losses.begin(), r.step_losses.begin() + 5);
  const double last = mean(r.step_losses.end() - 5, r.step_losses.end());
  EXPECT_LT(last, first - 0.5);
  ASSERT_EQ(r.valid_perplexity.size(), 1u);
  EXPECT_LT(r.valid_perplexity[0], static_cast<double>(r.vocab_size));
  std::cout << "word_lm (sgd): loss " << first << " -> " << last << ", valid ppl "
            << r.valid_perplexity[0] << ", " << r.seconds << " s\n";
}

// --trace: the whole step (forward, backward, clipping, Adam) traced once and replayed. Without
// dropout the traced run follows the eager one step for step; only the order of fused sums
// differs, so the losses agree to a small tolerance over 200 steps.
TEST(WordLmExample, TracedTrainingFollowsEagerFor200Steps) {
  WordLmConfig c = small_config();
  c.train_tokens = 16000;
  c.embedding_dim = 16;
  c.hidden_size = 32;
  c.batch_size = 8;
  c.bptt = 8;
  c.dropout = 0.0;
  c.epochs = 1;
  c.max_steps_per_epoch = 200;
  c.log_every = 0;
  WordLmResult eager = train_word_lm(c);
  c.trace = true;
  const jit::Stats before = jit::stats();
  WordLmResult traced = train_word_lm(c);
  const jit::Stats after = jit::stats();
  ASSERT_EQ(eager.steps, 200);
  ASSERT_EQ(traced.steps, 200);
  EXPECT_LE(after.traces - before.traces, 2) << "one step shape (plus evaluation's none)";
  EXPECT_GE(after.replays - before.replays, 199);
  double worst = 0;
  for (size_t i = 0; i < eager.step_losses.size(); ++i) {
    const double d = std::fabs(traced.step_losses[i] - eager.step_losses[i]);
    worst = std::max(worst, d);
    EXPECT_LE(d, 1e-3 * std::fabs(eager.step_losses[i])) << "step " << i;
    if (d > 1e-3 * std::fabs(eager.step_losses[i])) break;
  }
  EXPECT_LT(eager.step_losses.back(), eager.step_losses.front() - 1.0);
  EXPECT_NEAR(traced.valid_perplexity[0], eager.valid_perplexity[0],
              1e-3 * eager.valid_perplexity[0]);
  std::cout << "word_lm traced vs eager: largest loss difference " << worst << " over 200 steps; "
            << eager.seconds << " s eager, " << traced.seconds << " s traced\n";
}

// With dropout the traced step draws new masks on every replay (recorded random draws, taken from
// the process generator in the order eager mode takes them), so it still follows eager mode.
TEST(WordLmExample, TracedTrainingWithDropoutFollowsEager) {
  WordLmConfig c = small_config();
  c.dropout = 0.2;
  c.epochs = 1;
  c.max_steps_per_epoch = 60;
  c.lr = 1e-2;
  c.log_every = 0;
  WordLmResult eager = train_word_lm(c);
  c.trace = true;
  WordLmResult traced = train_word_lm(c);
  ASSERT_EQ(traced.step_losses.size(), 60u);
  for (size_t i = 0; i < 60; ++i)
    ASSERT_NEAR(traced.step_losses[i], eager.step_losses[i], 1e-3 * eager.step_losses[i])
        << "step " << i;
  auto mean = [](auto begin, auto end) {
    return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
  };
  const double first = mean(traced.step_losses.begin(), traced.step_losses.begin() + 5);
  const double last = mean(traced.step_losses.end() - 5, traced.step_losses.end());
  EXPECT_LT(last, first - 0.5);
}

// On a GPU (--device cuda) the example trains as on the host, eagerly and traced: the same losses
// within float32 rounding of a different summation order (dropout masks are drawn on the host).
TEST(WordLmExample, TrainsOnTheDeviceAsOnTheHost) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable CUDA device: run tools/gpu-check on a GPU";
  WordLmConfig c = small_config();
  c.epochs = 1;
  c.max_steps_per_epoch = 40;
  c.lr = 1e-2;
  c.log_every = 0;
  const WordLmResult host = train_word_lm(c);
  c.device = "cuda";
  for (bool trace : {false, true}) {
    c.trace = trace;
    const WordLmResult device = train_word_lm(c);
    ASSERT_EQ(device.step_losses.size(), host.step_losses.size());
    for (size_t i = 0; i < host.step_losses.size(); ++i)
      ASSERT_NEAR(device.step_losses[i], host.step_losses[i], 2e-3 * host.step_losses[i])
          << "step " << i << (trace ? " (traced)" : "");
    ASSERT_EQ(device.valid_perplexity.size(), 1u);
    EXPECT_NEAR(device.valid_perplexity[0], host.valid_perplexity[0],
                1e-2 * host.valid_perplexity[0]);
  }
}

}  // namespace
}  // namespace kiln::examples
