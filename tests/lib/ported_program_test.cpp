// A small libtorch program ported by renaming torch:: to kiln::: an LSTM classifier over padded
// token sequences, built with the everyday API a libtorch user reaches for (kiln::tensor,
// comparisons and masks, index/index_put_ with Slice, method reductions, argmax), trained with
// Adam, then stopped, checkpointed (model, optimizer, generator) and resumed. The two differences
// from the libtorch original are kiln's documented ones (docs/api.md): modules are held by
// std::shared_ptr rather than TORCH_MODULE holders, and AdamOptions is a struct ({lr}) rather than
// a builder.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tests/testing.h"

namespace {

using namespace kiln::indexing;

constexpr int64_t kVocab = 20, kTime = 7, kBatch = 16, kClasses = 2;

struct Classifier : kiln::nn::Module {
  Classifier()
      : embed(register_module("embed", std::make_shared<kiln::nn::Embedding>(kVocab, 8))),
        lstm(register_module("lstm", std::make_shared<kiln::nn::LSTM>(8, 16))),
        drop(register_module("drop", std::make_shared<kiln::nn::Dropout>(0.2))),
        head(register_module("head", std::make_shared<kiln::nn::Linear>(16, kClasses))) {}
  std::string name() const override { return "Classifier"; }

  // tokens [time, batch] int64, 0 = padding: the mean of the LSTM's outputs over the real steps.
  kiln::Tensor forward(const kiln::Tensor& tokens) override {
    kiln::Tensor mask = (tokens != 0).to(kiln::kFloat32).unsqueeze(-1);
    kiln::Tensor out = lstm->forward(embed->forward(tokens), std::nullopt).output;
    kiln::Tensor pooled = (out * mask).sum(0) / mask.sum(0).clamp(1.0);
    return head->forward(drop->forward(pooled));
  }

  std::shared_ptr<kiln::nn::Embedding> embed;
  std::shared_ptr<kiln::nn::LSTM> lstm;
  std::shared_ptr<kiln::nn::Dropout> drop;
  std::shared_ptr<kiln::nn::Linear> head;
};

struct Batch {
  kiln::Tensor tokens, labels;
};

// Sequences whose class is whether their first token is in the upper half of the vocabulary;
// the last steps of the first sequences are padding.
Batch make_batch() {
  kiln::Tensor tokens = kiln::randint(1, kVocab, {kTime, kBatch});
  tokens.index_put_({Slice(kTime - 2, None), Slice(None, kBatch / 2)}, 0);
  kiln::Tensor labels = (tokens.index({0}) >= kVocab / 2).to(kiln::kInt64);
  return {tokens, labels};
}

struct TrainingRun {
  std::vector<float> losses;
  kiln::StateDict parameters;
};

float train_step(Classifier& model, kiln::optim::Adam& adam, const Batch& batch) {
  adam.zero_grad();
  kiln::Tensor loss = kiln::cross_entropy(model.forward(batch.tokens), batch.labels);
  loss.backward();
  adam.step();
  return loss.item<float>();
}

std::string checkpoint_path(const std::string& what) {
  return ::testing::TempDir() + "kiln_ported_" + what + ".safetensors";
}

// `steps` steps straight, or (resume) half of them, a checkpoint, fresh objects that load it, and
// the other half.
TrainingRun train(int64_t steps, bool resume) {
  kiln::manual_seed(7);
  const Batch batch = make_batch();
  auto model = std::make_shared<Classifier>();
  auto adam =
      std::make_unique<kiln::optim::Adam>(model->parameters(), kiln::optim::AdamOptions{3e-2});
  TrainingRun run;
  for (int64_t step = 0; step < steps; ++step) {
    if (resume && step == steps / 2) {
      kiln::save(checkpoint_path("model"), *model);
      kiln::save(checkpoint_path("adam"), *adam);
      kiln::StateDict rng;
      rng.insert("rng", kiln::get_rng_state());
      kiln::save(checkpoint_path("rng"), rng);
      // Fresh objects initialized from another seed: only the checkpoint can make them agree.
      kiln::manual_seed(12345);
      model = std::make_shared<Classifier>();
      adam =
          std::make_unique<kiln::optim::Adam>(model->parameters(), kiln::optim::AdamOptions{1.0});
      kiln::load(checkpoint_path("model"), *model);
      kiln::load(checkpoint_path("adam"), *adam);
      kiln::set_rng_state(kiln::load(checkpoint_path("rng")).at("rng"));
    }
    run.losses.push_back(train_step(*model, *adam, batch));
  }
  run.parameters = model->state_dict();
  return run;
}

TEST(PortedProgram, TheEverydayApiBuildsTheBatchAsInLibtorch) {
  kiln::manual_seed(7);
  const Batch batch = make_batch();
  EXPECT_EQ(batch.tokens.sizes(), (kiln::Shape{kTime, kBatch}));
  // The padded corner holds zeros and nothing else does.
  kiln::Tensor pad = batch.tokens == 0;
  EXPECT_EQ(pad.to(kiln::kInt64).sum().item<int64_t>(), 2 * kBatch / 2);
  EXPECT_TRUE(pad.index({Slice(kTime - 2, None), Slice(None, kBatch / 2)}).all().item<bool>());
  EXPECT_EQ(kiln::masked_select(batch.tokens, pad).numel(), 2 * kBatch / 2);
  // The labels follow the first row.
  for (int64_t b = 0; b < kBatch; ++b)
    EXPECT_EQ(batch.labels[b].item<int64_t>(), batch.tokens[0][b].item<int64_t>() >= kVocab / 2);
  EXPECT_TRUE(kiln::equal(kiln::tensor({1, 2, 3}), kiln::arange(1, 4, 1, kiln::kInt64)));
}

TEST(PortedProgram, TrainsAndResumesFromACheckpointBitForBit) {
  constexpr int64_t kSteps = 40;
  const TrainingRun straight = train(kSteps, /*resume=*/false);
  const TrainingRun resumed = train(kSteps, /*resume=*/true);
  EXPECT_LT(straight.losses.back(), 0.5f * straight.losses.front()) << "the classifier learns";
  ASSERT_EQ(straight.losses.size(), resumed.losses.size());
  for (size_t i = 0; i < straight.losses.size(); ++i)
    EXPECT_EQ(straight.losses[i], resumed.losses[i]) << "step " << i;
  ASSERT_EQ(straight.parameters.keys(), resumed.parameters.keys());
  for (const std::string& key : straight.parameters.keys())
    EXPECT_TRUE(kiln::equal(straight.parameters.at(key), resumed.parameters.at(key))) << key;
  for (const char* what : {"model", "adam", "rng"}) std::remove(checkpoint_path(what).c_str());
}

}  // namespace
