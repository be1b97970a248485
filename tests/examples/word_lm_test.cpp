// Runs the word language model example (tools/examples/word_lm.cpp) briefly with small sizes: the
// generated corpus is deterministic and in vocabulary, and the training loss falls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

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

}  // namespace
}  // namespace kiln::examples
