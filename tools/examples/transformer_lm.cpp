// Example: a causal transformer language model (torch's word_language_model TransformerModel:
// scaled embeddings, sinusoidal positions, nn::TransformerEncoder with a causal mask, a linear
// decoder) trained with Adam on the corpus word_lm generates from its grammar, so the example
// needs no data set and carries the project's licence.
#include "transformer_lm.h"

#include "flags.h"
#include "word_lm.h"

#include <kiln/jit.h>
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/optim.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::examples {
namespace {

// pe[t, 2i] = sin(t / 10000^(2i/d)), pe[t, 2i+1] = cos(...), as [max_len, 1, d] for [T, B, d].
Tensor positional_encoding(int64_t max_len, int64_t d) {
  std::vector<float> pe(max_len * d);
  for (int64_t t = 0; t < max_len; ++t)
    for (int64_t i = 0; i < d; ++i) {
      const double angle =
          static_cast<double>(t) / std::pow(10000.0, static_cast<double>(i / 2 * 2) / d);
      pe[t * d + i] = static_cast<float>(i % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  return from_vector(pe, Shape{max_len, 1, d});
}

// -inf above the diagonal: position t sees positions 0..t (torch's
// generate_square_subsequent_mask).
Tensor causal_mask(int64_t T) {
  return zeros({T, T}).masked_fill(ones({T, T}, kBool).triu(1),
                                   -std::numeric_limits<double>::infinity());
}

class TransformerLanguageModel : public nn::Module {
 public:
  TransformerLanguageModel(int64_t vocab, const TransformerLmConfig& c)
      : d_model(c.d_model),
        encoder(register_module("encoder", std::make_shared<nn::Embedding>(vocab, c.d_model))),
        drop(register_module("drop", std::make_shared<nn::Dropout>(c.dropout))),
        transformer(register_module("transformer_encoder", make_encoder(c))),
        decoder(register_module("decoder", std::make_shared<nn::Linear>(c.d_model, vocab))) {
    positions = register_buffer("pe", positional_encoding(c.bptt, c.d_model));
    NoGradGuard no_grad;  // as the torch example: small uniform embedding and decoder
    encoder->weight.copy_(rand(encoder->weight.sizes()) * 0.2 - 0.1);
    decoder->weight.copy_(rand(decoder->weight.sizes()) * 0.2 - 0.1);
    decoder->bias.zero_();
  }
  std::string name() const override { return "TransformerLanguageModel"; }

  // input [T, B] int64 -> logits [T * B, vocab].
  Tensor forward(const Tensor& input) override {
    const int64_t T = input.size(0);
    Tensor x = encoder->forward(input) * std::sqrt(static_cast<double>(d_model));
    x = drop->forward(x + positions.narrow(0, 0, T));
    Tensor h = transformer->forward(x, causal_mask(T));
    return decoder->forward(h.reshape({T * input.size(1), d_model}));
  }

  int64_t d_model;
  std::shared_ptr<nn::Embedding> encoder;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::TransformerEncoder> transformer;
  std::shared_ptr<nn::Linear> decoder;
  Tensor positions;

 private:
  static std::shared_ptr<nn::TransformerEncoder> make_encoder(const TransformerLmConfig& c) {
    nn::TransformerEncoderLayerOptions o(c.d_model, c.nhead);
    o.dim_feedforward = c.dim_feedforward;
    o.dropout = c.dropout;
    o.norm_first = c.norm_first;
    return std::make_shared<nn::TransformerEncoder>(
        std::make_shared<nn::TransformerEncoderLayer>(o), c.num_layers);
  }
};

double evaluate(TransformerLanguageModel& model, const Tensor& data, int64_t bptt) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i + 1 < data.size(0); i += bptt) {
    const int64_t len = std::min(bptt, data.size(0) - 1 - i);
    Tensor target = data.narrow(0, i + 1, len).reshape({len * data.size(1)});
    total +=
        cross_entropy(model.forward(data.narrow(0, i, len)), target, Reduction::Sum).item<double>();
    count += target.numel();
  }
  model.train();
  return std::exp(total / static_cast<double>(std::max<int64_t>(count, 1)));
}

}  // namespace

TransformerLmResult train_transformer_lm(const TransformerLmConfig& c) {
  const int64_t eval_batch = 10;
  KILN_CHECK(c.batch_size > 0 && c.bptt > 0 && c.epochs >= 0 && c.num_layers > 0,
             "train_transformer_lm: batch_size, bptt and num_layers must be positive");
  KILN_CHECK(
      c.train_tokens >= c.batch_size * (c.bptt + 1) && c.valid_tokens >= eval_batch * 2,
      "train_transformer_lm: need at least batch_size * (bptt + 1) = ", c.batch_size * (c.bptt + 1),
      " training tokens and ", eval_batch * 2, " validation tokens");
  manual_seed(c.seed);
  const std::vector<std::string> vocab = word_lm_vocabulary();
  std::unordered_map<std::string, int64_t> index;
  for (size_t i = 0; i < vocab.size(); ++i) index[vocab[i]] = static_cast<int64_t>(i);
  // The splits as word_lm's: validation sentences are new samples of the grammar.
  Tensor train_data =
      batchify(to_ids(generate_corpus(c.train_tokens, c.seed), index), c.batch_size);
  Tensor valid_data = batchify(
      to_ids(generate_corpus(c.valid_tokens, c.seed ^ 0x9e3779b97f4a7c15ULL), index), eval_batch);

  const int64_t V = static_cast<int64_t>(vocab.size());
  TransformerLanguageModel model(V, c);
  std::vector<Tensor> params = model.parameters();
  optim::Adam optimizer(params, optim::AdamOptions{c.lr});
  TransformerLmResult result;
  result.vocab_size = V;
  if (c.log) {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    *c.log << "corpus (generated): " << c.train_tokens << " training and " << c.valid_tokens
           << " validation tokens, vocabulary " << V << ", parameters " << n << "\n";
  }
  // One training step: arguments input [T, B] and target [T * B]; returns the loss.
  auto train_step = [&](const std::vector<Tensor>& in) {
    optimizer.zero_grad();
    Tensor loss = cross_entropy(model.forward(in[0]), in[1]);
    loss.backward();
    nn::utils::clip_grad_norm_(params, c.clip);
    optimizer.step();
    return std::vector<Tensor>{loss.detach()};
  };
  jit::Function traced_step;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t epoch = 1; epoch <= c.epochs; ++epoch) {
    EpochLog epoch_log(result, epoch, c.log, c.log_every, c.after_step);
    model.train();
    // Whole segments only: every step has the traced shapes.
    for (int64_t i = 0; i + c.bptt < train_data.size(0); i += c.bptt) {
      if (c.max_steps_per_epoch > 0 && epoch_log.steps() >= c.max_steps_per_epoch) break;
      const std::vector<Tensor> in = {
          train_data.narrow(0, i, c.bptt),
          train_data.narrow(0, i + 1, c.bptt).reshape({c.bptt * c.batch_size})};
      const auto step_start = std::chrono::steady_clock::now();
      Tensor loss;
      if (c.trace) {
        if (!traced_step.defined()) traced_step = jit::trace(train_step, in);
        loss = traced_step(in)[0];
      } else {
        loss = train_step(in)[0];
      }
      epoch_log.step(loss.item<double>(), step_start);
    }
    epoch_log.finish(evaluate(model, valid_data, c.bptt), c.bptt * c.batch_size);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln::examples

#ifndef KILN_EXAMPLE_NO_MAIN
namespace {

void usage(const char* argv0) {
  kiln::examples::TransformerLmConfig d;
  std::cout
      << "usage: " << argv0 << " [flags]\n"
      << "Trains a causal transformer language model (embedding, sinusoidal positions,\n"
      << "TransformerEncoder with a causal mask, linear decoder, cross entropy) with Adam and\n"
      << "gradient clipping on word_lm's generated corpus, printing the training loss and the\n"
      << "validation perplexity per epoch. No external data is used.\n\n"
      << "  --epochs N          (" << d.epochs << ")\n"
      << "  --train-tokens N    (" << d.train_tokens << ")\n"
      << "  --valid-tokens N    (" << d.valid_tokens << ")\n"
      << "  --d-model N         embedding and model width (" << d.d_model << ")\n"
      << "  --heads N           attention heads (" << d.nhead << ")\n"
      << "  --layers N          encoder layers (" << d.num_layers << ")\n"
      << "  --ff N              feed-forward width (" << d.dim_feedforward << ")\n"
      << "  --dropout X         (" << d.dropout << ")\n"
      << "  --norm-first        pre-norm layers\n"
      << "  --batch N           (" << d.batch_size << ")\n"
      << "  --bptt N            context length (" << d.bptt << ")\n"
      << "  --steps N           max steps per epoch, 0 = all (" << d.max_steps_per_epoch << ")\n"
      << "  --lr X              Adam's learning rate (" << d.lr << ")\n"
      << "  --clip X            gradient norm limit (" << d.clip << ")\n"
      << "  --seed N            (" << d.seed << ")\n"
      << "  --log-every N       steps between progress lines, 0 = none (" << d.log_every << ")\n"
      << "  --trace             trace the training step once (jit::trace) and replay it\n";
}

}  // namespace

int main(int argc, char** argv) {
  kiln::examples::TransformerLmConfig c;
  c.log = &std::cout;
  kiln::examples::Flags flags;
  flags.add("--epochs", &c.epochs);
  flags.add_switch("--trace", &c.trace);
  flags.add_switch("--norm-first", &c.norm_first);
  flags.add("--train-tokens", &c.train_tokens);
  flags.add("--valid-tokens", &c.valid_tokens);
  flags.add("--d-model", &c.d_model);
  flags.add("--heads", &c.nhead);
  flags.add("--layers", &c.num_layers);
  flags.add("--ff", &c.dim_feedforward);
  flags.add("--dropout", &c.dropout);
  flags.add("--batch", &c.batch_size);
  flags.add("--bptt", &c.bptt);
  flags.add("--steps", &c.max_steps_per_epoch);
  flags.add("--lr", &c.lr);
  flags.add("--clip", &c.clip);
  flags.add("--seed", &c.seed);
  flags.add("--log-every", &c.log_every);
  if (auto code = flags.parse(argc, argv, [&] { usage(argv[0]); })) return *code;
  try {
    auto r = kiln::examples::train_transformer_lm(c);
    std::cout << "done: " << r.steps << " steps in " << r.seconds << " s";
    if (!r.valid_perplexity.empty())
      std::cout << ", final validation perplexity " << r.valid_perplexity.back();
    std::cout << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
#endif
