// Example: a 2-layer LSTM word language model trained with truncated BPTT on a corpus that kiln
// generates itself from a probabilistic grammar (so the example needs no data set and carries the
// project's licence).
#include "word_lm.h"

#include "flags.h"

#include <kiln/distributed.h>
#include <kiln/jit.h>
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/optim.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::examples {
namespace {

// ---------------------------------------------------------------------------- the grammar
// Nonterminals are upper case; "@category.form" draws a word of a category (form "sg"/"pl" for
// nouns, "base"/"s" for verbs); anything else is a literal word.

struct Expansion {
  double weight;
  std::vector<std::string> symbols;
};

const std::map<std::string, std::vector<Expansion>>& grammar() {
  static const std::map<std::string, std::vector<Expansion>> rules = {
      {"SENT",
       {{0.72, {"CL"}},
        {0.12, {"CL", "and", "CL"}},
        {0.06, {"CL", "but", "CL"}},
        {0.06, {"CL", "because", "CL"}},
        {0.04, {"when", "CL", "CL"}}}},
      {"CL", {{0.55, {"SUBJ_SG", "VP_SG"}}, {0.45, {"SUBJ_PL", "VP_PL"}}}},
      {"SUBJ_SG",
       {{4, {"@det.sg", "@animate.sg"}},
        {2, {"@det.sg", "@adj", "@animate.sg"}},
        {0.3, {"@det.sg", "@adj", "@adj", "@animate.sg"}},
        {2, {"@name"}},
        {1, {"@pron_subj.sg"}},
        {0.5, {"@det.sg", "@animate.sg", "PP"}}}},
      {"SUBJ_PL",
       {{4, {"@det.pl", "@animate.pl"}},
        {2, {"@det.pl", "@adj", "@animate.pl"}},
        {1, {"@animate.pl"}},
        {0.7, {"@name", "and", "@name"}},
        {1, {"@pron_subj.pl"}},
        {0.4, {"@det.pl", "@animate.pl", "PP"}}}},
      {"OBJ",
       {{3, {"@det.sg", "@thing.sg"}},
        {2, {"@det.sg", "@adj", "@thing.sg"}},
        {1.5, {"@det.pl", "@thing.pl"}},
        {0.8, {"@det.pl", "@adj", "@thing.pl"}},
        {0.5, {"@thing.pl"}},
        {1.5, {"@det.sg", "@animate.sg"}},
        {0.8, {"@det.pl", "@animate.pl"}},
        {1, {"@name"}},
        {1, {"@pron_obj"}}}},
      {"PP",
       {{3, {"@prep", "@det.sg", "@place.sg"}},
        {0.5, {"@prep", "@det.pl", "@place.pl"}},
        {0.7, {"with", "@det.sg", "@animate.sg"}}}},
      {"VP_SG",
       {{2, {"@vi.s"}},
        {1.5, {"@vi.s", "@adv"}},
        {1.5, {"@vi.s", "PP"}},
        {4, {"@vt.s", "OBJ"}},
        {1, {"@vt.s", "OBJ", "@adv"}},
        {1.2, {"@vt.s", "OBJ", "PP"}},
        {0.3, {"@vt.s", "OBJ", "and", "@vt.s", "OBJ"}},
        {0.6, {"will", "@vi.base"}},
        {0.8, {"will", "@vt.base", "OBJ"}},
        {0.4, {"can", "@vi.base"}},
        {0.5, {"does", "not", "@vt.base", "OBJ"}},
        {1, {"is", "@adj"}},
        {0.6, {"is", "PP"}},
        {0.45, {"@think.s", "that", "CL"}}}},
      {"VP_PL",
       {{2, {"@vi.base"}},
        {1.5, {"@vi.base", "@adv"}},
        {1.5, {"@vi.base", "PP"}},
        {4, {"@vt.base", "OBJ"}},
        {1, {"@vt.base", "OBJ", "@adv"}},
        {1.2, {"@vt.base", "OBJ", "PP"}},
        {0.3, {"@vt.base", "OBJ", "and", "@vt.base", "OBJ"}},
        {0.6, {"will", "@vi.base"}},
        {0.8, {"will", "@vt.base", "OBJ"}},
        {0.4, {"can", "@vi.base"}},
        {0.5, {"do", "not", "@vt.base", "OBJ"}},
        {1, {"are", "@adj"}},
        {0.6, {"are", "PP"}},
        {0.45, {"@think.base", "that", "CL"}}}},
  };
  return rules;
}

// Word lists, most frequent first: a word's probability within its category falls as 1/rank.
const std::map<std::string, std::vector<std::string>>& categories() {
  static const std::map<std::string, std::vector<std::string>> words = {
      {"animate",
       {"dog",    "cat",    "child",   "man",    "woman",    "teacher", "bird", "girl",  "boy",
        "friend", "doctor", "farmer",  "horse",  "student",  "baby",    "king", "queen", "fox",
        "rabbit", "mouse",  "wolf",    "bear",   "lion",     "duck",    "cow",  "owl",   "frog",
        "baker",  "pilot",  "painter", "singer", "neighbor", "person"}},
      {"thing", {"book",  "ball",   "cake",     "apple", "letter", "song", "box",   "key",
                 "door",  "window", "table",    "chair", "car",    "boat", "train", "picture",
                 "story", "egg",    "orange",   "cup",   "hat",    "coat", "shoe",  "bottle",
                 "lamp",  "bag",    "umbrella", "map",   "clock",  "gift", "basket"}},
      {"place",
       {"park", "house", "garden", "school", "city", "forest", "river", "village", "market",
        "kitchen", "library", "beach", "hill", "road", "bridge", "field"}},
      {"name", {"alice", "bob",  "emma",  "tom",   "lucy", "sam",  "anna", "jack",  "mia", "leo",
                "kate",  "noah", "grace", "henry", "ivy",  "paul", "rose", "oscar", "zoe", "dave"}},
      {"adj", {"big",    "small", "old",     "young",  "happy", "little", "good",  "red",
               "quiet",  "tall",  "new",     "sad",    "kind",  "green",  "blue",  "warm",
               "cold",   "dark",  "bright",  "clever", "brave", "lazy",   "angry", "tired",
               "funny",  "busy",  "strange", "gentle", "proud", "hungry", "loud",  "shy",
               "yellow", "heavy", "clean",   "empty",  "rich",  "poor",   "wild",  "calm"}},
      {"adv",
       {"today", "again", "quickly", "slowly", "now", "often", "always", "never", "quietly",
        "happily", "soon", "early", "late", "together", "outside"}},
      {"vi",
       {"sleep", "run", "walk", "wait", "sing", "laugh", "play", "work", "smile", "dance", "swim",
        "jump", "cry", "rest", "arrive", "fall", "listen", "hide"}},
      {"vt",
       {"see",   "like", "find",  "want",   "have",  "love",  "help", "take", "make",  "know",
        "bring", "hold", "watch", "follow", "call",  "visit", "keep", "open", "carry", "build",
        "paint", "draw", "clean", "cook",   "catch", "push",  "pull", "wash", "fix",   "miss"}},
      {"think", {"think", "say", "know", "hope", "believe"}},
      {"det", {"the", "a", "this", "that", "my", "his", "her", "our", "your", "their", "every"}},
      {"det_pl",
       {"the", "some", "many", "these", "those", "two", "my", "their", "our", "three", "all",
        "few"}},
      {"prep", {"in", "near", "behind", "under", "on", "by", "beside", "across", "into", "from"}},
      {"pron_subj_sg", {"he", "she", "it"}},
      {"pron_subj_pl", {"they", "we", "you"}},
      {"pron_obj", {"them", "him", "her", "it", "me", "us", "you"}},
  };
  return words;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool is_vowel(char c) {
  return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u';
}
// "-es" after sibilants (and "o" for verbs), "-ies" after a consonant and "y".
std::string add_s(const std::string& w, bool verb) {
  if (ends_with(w, "s") || ends_with(w, "x") || ends_with(w, "ch") || ends_with(w, "sh") ||
      (verb && ends_with(w, "o")))
    return w + "es";
  if (w.size() >= 2 && w.back() == 'y' && !is_vowel(w[w.size() - 2]))
    return w.substr(0, w.size() - 1) + "ies";
  return w + "s";
}
std::string plural(const std::string& noun) {
  static const std::map<std::string, std::string> irregular = {
      {"child", "children"}, {"man", "men"},     {"woman", "women"},
      {"mouse", "mice"},     {"wolf", "wolves"}, {"person", "people"}};
  auto it = irregular.find(noun);
  return it != irregular.end() ? it->second : add_s(noun, false);
}
std::string third_person(const std::string& verb) {
  return verb == "have" ? "has" : add_s(verb, true);
}

// The list a "@category.form" symbol draws from, and how the drawn word is inflected.
struct Draw {
  const std::vector<std::string>* words;
  std::vector<double> cumulative;  // Zipf weights 1/rank, summed
  std::string (*inflect)(const std::string&);
};

std::string same(const std::string& w) {
  return w;
}

Draw make_draw(const std::string& symbol) {
  std::string category = symbol.substr(1), form;
  if (auto dot = category.find('.'); dot != std::string::npos) {
    form = category.substr(dot + 1);
    category = category.substr(0, dot);
  }
  Draw d{nullptr, {}, same};
  if (category == "animate" || category == "thing" || category == "place") {
    if (form == "pl") d.inflect = plural;
  } else if (category == "vi" || category == "vt" || category == "think") {
    if (form == "s") d.inflect = third_person;
  } else if (category == "det") {
    if (form == "pl") category = "det_pl";
  } else if (category == "pron_subj") {
    category += "_" + form;
  }
  const auto& lists = categories();
  auto it = lists.find(category);
  KILN_CHECK(it != lists.end(), "word_lm grammar: unknown word category ", symbol);
  d.words = &it->second;
  double total = 0;
  for (size_t r = 0; r < d.words->size(); ++r) d.cumulative.push_back(total += 1.0 / (r + 1.0));
  return d;
}

// Every symbol of the grammar, resolved once.
struct CompiledGrammar {
  std::map<std::string, std::vector<double>> rule_cumulative;
  std::map<std::string, Draw> draws;
  std::set<std::string> literals;

  CompiledGrammar() {
    for (const auto& [lhs, expansions] : grammar()) {
      double total = 0;
      for (const auto& e : expansions) {
        rule_cumulative[lhs].push_back(total += e.weight);
        for (const auto& s : e.symbols) {
          if (s[0] == '@')
            draws.emplace(s, make_draw(s));
          else if (!grammar().count(s))
            literals.insert(s);
        }
      }
    }
  }
};

const CompiledGrammar& compiled() {
  static const CompiledGrammar g;
  return g;
}

// A bit-exact uniform draw (std::uniform_real_distribution differs between standard libraries).
double uniform01(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}
size_t pick(const std::vector<double>& cumulative, std::mt19937_64& gen) {
  double u = uniform01(gen) * cumulative.back();
  size_t i = std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin();
  return std::min(i, cumulative.size() - 1);
}

// One sentence, expanded with an explicit stack of pending symbols (leftmost first).
void generate_sentence(std::mt19937_64& gen, std::vector<std::string>& out) {
  const CompiledGrammar& g = compiled();
  std::vector<std::string> pending{"SENT"}, words;
  while (!pending.empty()) {
    std::string symbol = std::move(pending.back());
    pending.pop_back();
    if (auto rule = grammar().find(symbol); rule != grammar().end()) {
      const auto& chosen = rule->second[pick(g.rule_cumulative.at(symbol), gen)].symbols;
      pending.insert(pending.end(), chosen.rbegin(), chosen.rend());
    } else if (symbol[0] == '@') {
      const Draw& d = g.draws.at(symbol);
      words.push_back(d.inflect((*d.words)[pick(d.cumulative, gen)]));
    } else {
      words.push_back(symbol);
    }
  }
  for (size_t i = 0; i + 1 < words.size(); ++i)
    if (words[i] == "a" && is_vowel(words[i + 1][0])) words[i] = "an";
  out.insert(out.end(), words.begin(), words.end());
  out.push_back("<eos>");
}

// ---------------------------------------------------------------------------- the model

// Embedding -> dropout -> LSTM -> dropout -> linear decoder to vocabulary logits, as torch's
// word_language_model example.
class RnnLanguageModel : public nn::Module {
 public:
  RnnLanguageModel(int64_t vocab, const WordLmConfig& c)
      : encoder(
            register_module("encoder", std::make_shared<nn::Embedding>(vocab, c.embedding_dim))),
        drop(register_module("drop", std::make_shared<nn::Dropout>(c.dropout))),
        rnn(register_module("rnn", std::make_shared<nn::LSTM>(c.embedding_dim, c.hidden_size,
                                                              c.num_layers, c.dropout))),
        decoder(register_module("decoder", std::make_shared<nn::Linear>(c.hidden_size, vocab))) {
    // Small uniform embeddings and decoder (as the torch example) start the loss near log(vocab).
    NoGradGuard no_grad;
    encoder->weight.copy_(rand(encoder->weight.sizes()) * 0.2 - 0.1);
    decoder->weight.copy_(rand(decoder->weight.sizes()) * 0.2 - 0.1);
    decoder->bias.zero_();
  }
  std::string name() const override { return "RnnLanguageModel"; }

  // input [time, batch] int64 -> logits [time * batch, vocab] and the final LSTM state.
  std::pair<Tensor, nn::LSTMState> forward(const Tensor& input,
                                           const std::optional<nn::LSTMState>& state) {
    Tensor emb = drop->forward(encoder->forward(input));
    nn::LSTMOutput out = rnn->forward(emb, state);
    Tensor hidden = drop->forward(out.output);
    Tensor flat = hidden.reshape({hidden.size(0) * hidden.size(1), hidden.size(2)});
    return {decoder->forward(flat), out.state};
  }
  Tensor forward(const Tensor& input) override { return forward(input, std::nullopt).first; }

  std::shared_ptr<nn::Embedding> encoder;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::LSTM> rnn;
  std::shared_ptr<nn::Linear> decoder;
};

}  // namespace

Tensor batchify(const std::vector<int64_t>& ids, int64_t batch) {
  const int64_t rows = static_cast<int64_t>(ids.size()) / batch;
  std::vector<int64_t> laid_out(rows * batch);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r) laid_out[r * batch + b] = ids[b * rows + r];
  return from_vector(laid_out, Shape{rows, batch});
}

std::vector<int64_t> to_ids(const std::vector<std::string>& words,
                            const std::unordered_map<std::string, int64_t>& index) {
  std::vector<int64_t> ids;
  ids.reserve(words.size());
  for (const auto& w : words) ids.push_back(index.at(w));
  return ids;
}

namespace {

nn::LSTMState detached(const nn::LSTMState& s) {
  return {s.h.detach(), s.c.detach()};
}

double evaluate(RnnLanguageModel& model, const Tensor& data, int64_t bptt) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  int64_t count = 0;
  std::optional<nn::LSTMState> state;
  for (int64_t i = 0; i + 1 < data.size(0); i += bptt) {
    const int64_t len = std::min(bptt, data.size(0) - 1 - i);
    Tensor target = data.narrow(0, i + 1, len).reshape({len * data.size(1)});
    auto [logits, next] = model.forward(data.narrow(0, i, len), state);
    total += cross_entropy(logits, target, Reduction::Sum).item<double>();
    count += target.numel();
    state = next;
  }
  model.train();
  return std::exp(total / static_cast<double>(std::max<int64_t>(count, 1)));
}

}  // namespace

std::vector<std::string> word_lm_vocabulary() {
  const CompiledGrammar& g = compiled();
  std::set<std::string> vocab(g.literals.begin(), g.literals.end());
  for (const auto& [symbol, d] : g.draws)
    for (const auto& w : *d.words) vocab.insert(d.inflect(w));
  vocab.insert("an");
  vocab.insert("<eos>");
  return {vocab.begin(), vocab.end()};
}

std::vector<std::string> generate_corpus(int64_t tokens, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::string> out;
  while (static_cast<int64_t>(out.size()) < tokens) generate_sentence(gen, out);
  return out;
}

EpochLog::EpochLog(LmTrainingResult& result, int64_t epoch, std::ostream* log, int64_t log_every,
                   const std::function<void()>& after_step)
    : result_(result), epoch_(epoch), log_every_(log_every), log_(log), after_step_(after_step) {}

void EpochLog::step(double loss, std::chrono::steady_clock::time_point started) {
  result_.step_seconds.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (after_step_) after_step_();
  result_.step_losses.push_back(loss);
  loss_sum_ += loss;
  ++steps_;
  ++result_.steps;
  if (log_ && log_every_ > 0 && steps_ % log_every_ == 0)
    *log_ << "  epoch " << epoch_ << " step " << steps_ << "  loss " << loss << "  ppl "
          << std::exp(loss) << "\n";
}

void EpochLog::finish(double valid_perplexity, int64_t tokens_per_step) {
  result_.valid_perplexity.push_back(valid_perplexity);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double mean_loss = loss_sum_ / static_cast<double>(std::max<int64_t>(steps_, 1));
  if (log_)
    *log_ << "epoch " << epoch_ << ": train loss " << mean_loss << " (ppl " << std::exp(mean_loss)
          << "), valid ppl " << valid_perplexity << ", " << secs << " s, "
          << static_cast<double>(steps_ * tokens_per_step) / secs << " tokens/s\n";
}

WordLmResult train_word_lm(const WordLmConfig& config) {
  WordLmConfig c = config;
  int rank = 0, world = 1;
  if (c.ddp) {
    if (!distributed::is_initialized()) distributed::init_process_group("gloo");
    rank = distributed::get_rank();
    world = distributed::get_world_size();
    KILN_CHECK(c.batch_size % world == 0, "train_word_lm: batch_size ", c.batch_size,
               " does not split over ", world, " ranks");
    if (rank != 0) c.log = nullptr;  // rank 0 reports for all
  }
  const int64_t eval_batch = 10;
  KILN_CHECK(c.batch_size > 0 && c.bptt > 0 && c.epochs >= 0 && c.num_layers > 0,
             "train_word_lm: batch_size, bptt and num_layers must be positive");
  KILN_CHECK(c.train_tokens >= c.batch_size * (c.bptt + 1) && c.valid_tokens >= eval_batch * 2,
             "train_word_lm: need at least batch_size * (bptt + 1) = ", c.batch_size * (c.bptt + 1),
             " training tokens and ", eval_batch * 2, " validation tokens");
  KILN_CHECK(c.optimizer == "adam" || c.optimizer == "sgd",
             "train_word_lm: optimizer must be adam or sgd, got ", c.optimizer);
  const Device device = Device::parse(c.device);
  manual_seed(c.seed);
  const std::vector<std::string> vocab = word_lm_vocabulary();
  std::unordered_map<std::string, int64_t> index;
  for (size_t i = 0; i < vocab.size(); ++i) index[vocab[i]] = static_cast<int64_t>(i);
  // Different seeds for the two splits: validation sentences are new samples of the grammar.
  Tensor train_data =
      batchify(to_ids(generate_corpus(c.train_tokens, c.seed), index), c.batch_size);
  // Each rank trains on its own columns of the batch (a column is one continuous text stream).
  const int64_t local_batch = c.batch_size / world;
  train_data = train_data.narrow(1, rank * local_batch, local_batch).contiguous().to(device);
  Tensor valid_data =
      batchify(to_ids(generate_corpus(c.valid_tokens, c.seed ^ 0x9e3779b97f4a7c15ULL), index),
               eval_batch)
          .to(device);

  const int64_t V = static_cast<int64_t>(vocab.size());
  auto model_ptr = std::make_shared<RnnLanguageModel>(V, c);
  RnnLanguageModel& model = *model_ptr;
  model.to(device);
  // With --ddp the gradients are averaged over the ranks during each backward.
  std::unique_ptr<nn::parallel::DistributedDataParallel> ddp;
  if (c.ddp) ddp = std::make_unique<nn::parallel::DistributedDataParallel>(model_ptr);
  std::vector<Tensor> params = model.parameters();
  std::unique_ptr<optim::Optimizer> optimizer;
  if (c.optimizer == "sgd")
    optimizer = std::make_unique<optim::SGD>(params, optim::SGDOptions{c.lr});
  else
    optimizer = std::make_unique<optim::Adam>(params, optim::AdamOptions{c.lr});
  auto set_lr = [&](double lr) {
    if (auto* sgd = dynamic_cast<optim::SGD*>(optimizer.get())) sgd->options().lr = lr;
    if (auto* adam = dynamic_cast<optim::Adam*>(optimizer.get())) adam->options().lr = lr;
  };

  WordLmResult result;
  result.vocab_size = V;
  if (c.log)
    *c.log << "corpus (generated): " << c.train_tokens << " training and " << c.valid_tokens
           << " validation tokens, vocabulary " << V << ", parameters " <<
        [&] {
          int64_t n = 0;
          for (const auto& p : params) n += p.numel();
          return n;
        }() << "\n";
  // One training step: arguments input, target and the LSTM state (h, c; undefined for the
  // default zero state); returns the loss and the next state.
  auto train_step = [&](const std::vector<Tensor>& in) {
    std::optional<nn::LSTMState> initial;
    if (in[2].defined()) initial = nn::LSTMState{in[2], in[3]};
    optimizer->zero_grad();
    auto [logits, next] = model.forward(in[0], initial);
    Tensor loss = cross_entropy(logits, in[1]);
    loss.backward();
    nn::utils::clip_grad_norm_(params, c.clip);
    optimizer->step();
    return std::vector<Tensor>{loss.detach(), next.h.detach(), next.c.detach()};
  };
  jit::Function traced_step;
  auto start = std::chrono::steady_clock::now();
  double lr = c.lr, best_ppl = INFINITY;
  const int64_t B = c.batch_size;
  for (int64_t epoch = 1; epoch <= c.epochs; ++epoch) {
    EpochLog epoch_log(result, epoch, c.log, c.log_every, c.after_step);
    model.train();
    std::optional<nn::LSTMState> state;
    for (int64_t i = 0; i + 1 < train_data.size(0); i += c.bptt) {
      if (c.max_steps_per_epoch > 0 && epoch_log.steps() >= c.max_steps_per_epoch) break;
      const int64_t len = std::min(c.bptt, train_data.size(0) - 1 - i);
      Tensor input = train_data.narrow(0, i, len);
      Tensor target = train_data.narrow(0, i + 1, len).reshape({len * local_batch});
      const auto step_start = std::chrono::steady_clock::now();
      Tensor loss;
      if (c.trace) {
        // The traced step takes the state as arguments (zeros at the start of an epoch, as the
        // LSTM's default) and returns the next one, detached: truncated BPTT.
        if (!state) {
          const Shape s{c.num_layers, local_batch, c.hidden_size};
          state = nn::LSTMState{zeros(s, device), zeros(s, device)};
        }
        if (!traced_step.defined())
          traced_step = jit::trace(train_step, {input, target, state->h, state->c});
        std::vector<Tensor> out = traced_step({input, target, state->h, state->c});
        loss = out[0];
        state = nn::LSTMState{out[1], out[2]};
      } else {
        // Truncated BPTT: the state carries over, its history does not.
        if (state) state = detached(*state);
        std::vector<Tensor> out =
            train_step({input, target, state ? state->h : Tensor(), state ? state->c : Tensor()});
        loss = out[0];
        state = nn::LSTMState{out[1], out[2]};
      }
      if (c.ddp) {
        loss = loss.clone();
        distributed::all_reduce(loss, distributed::ReduceOp::AVG);  // the whole batch's loss
      }
      epoch_log.step(loss.item<double>(), step_start);
    }
    const double ppl = evaluate(model, valid_data, c.bptt);
    epoch_log.finish(ppl, c.bptt * B);
    // As torch's example: anneal the learning rate when validation stops improving.
    if (ppl < best_ppl) {
      best_ppl = ppl;
    } else {
      lr /= 4.0;
      set_lr(lr);
      traced_step = jit::Function();  // the learning rate is part of the trace
      if (c.log) *c.log << "  validation did not improve: learning rate now " << lr << "\n";
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln::examples

#ifndef KILN_EXAMPLE_NO_MAIN
namespace {

void usage(const char* argv0) {
  kiln::examples::WordLmConfig d;
  std::cout
      << "usage: " << argv0 << " [flags]\n"
      << "Trains a word-level LSTM language model (embedding, LSTM, linear decoder, cross "
         "entropy)\n"
      << "with truncated back-propagation through time and gradient clipping, printing the\n"
      << "training loss and the validation perplexity per epoch.\n\n"
      << "The corpus is generated by kiln itself: simple English sentences sampled from a seeded\n"
      << "probabilistic grammar with a vocabulary of "
      << kiln::examples::word_lm_vocabulary().size()
      << " words. No external data is used, so the corpus\n"
      << "is covered by kiln's own licence.\n\n"
      << "  --epochs N          (" << d.epochs << ")\n"
      << "  --train-tokens N    (" << d.train_tokens << ")\n"
      << "  --valid-tokens N    (" << d.valid_tokens << ")\n"
      << "  --embed N           embedding size (" << d.embedding_dim << ")\n"
      << "  --hidden N          LSTM hidden size (" << d.hidden_size << ")\n"
      << "  --layers N          LSTM layers (" << d.num_layers << ")\n"
      << "  --dropout X         (" << d.dropout << ")\n"
      << "  --batch N           (" << d.batch_size << ")\n"
      << "  --bptt N            segment length (" << d.bptt << ")\n"
      << "  --steps N           max steps per epoch, 0 = all (" << d.max_steps_per_epoch << ")\n"
      << "  --optimizer NAME    adam or sgd (" << d.optimizer << ")\n"
      << "  --lr X              (" << d.lr << "; try 20 with sgd)\n"
      << "  --clip X            gradient norm limit (" << d.clip << ")\n"
      << "  --seed N            (" << d.seed << ")\n"
      << "  --log-every N       steps between progress lines, 0 = none (" << d.log_every << ")\n"
      << "  --trace             trace the training step once (jit::trace) and replay it\n"
      << "  --ddp               data-parallel over the ranks tools/kiln-run starts\n"
      << "  --device NAME       cpu or cuda (" << d.device << ")\n"
      << "  --sample N          print the first N tokens of the corpus and exit\n";
}

}  // namespace

int main(int argc, char** argv) {
  kiln::examples::WordLmConfig c;
  c.log = &std::cout;
  int64_t sample = 0;
  kiln::examples::Flags flags;
  flags.add("--epochs", &c.epochs);
  flags.add_switch("--trace", &c.trace);
  flags.add_switch("--ddp", &c.ddp);
  flags.add("--device", &c.device);
  flags.add("--train-tokens", &c.train_tokens);
  flags.add("--valid-tokens", &c.valid_tokens);
  flags.add("--embed", &c.embedding_dim);
  flags.add("--hidden", &c.hidden_size);
  flags.add("--layers", &c.num_layers);
  flags.add("--dropout", &c.dropout);
  flags.add("--batch", &c.batch_size);
  flags.add("--bptt", &c.bptt);
  flags.add("--steps", &c.max_steps_per_epoch);
  flags.add("--optimizer", &c.optimizer);
  flags.add("--lr", &c.lr);
  flags.add("--clip", &c.clip);
  flags.add("--seed", &c.seed);
  flags.add("--log-every", &c.log_every);
  flags.add("--sample", &sample);
  if (auto code = flags.parse(argc, argv, [&] { usage(argv[0]); })) return *code;
  try {
    if (sample > 0) {
      for (const auto& w : kiln::examples::generate_corpus(sample, c.seed))
        std::cout << (w == "<eos>" ? "\n" : w + " ");
      return 0;
    }
    auto r = kiln::examples::train_word_lm(c);
    if (c.ddp && kiln::distributed::get_rank() != 0) return 0;  // rank 0 reports
    std::cout << "done: " << r.steps << " steps in " << r.seconds << " s";
    if (!r.valid_perplexity.empty())
      std::cout << ", final validation perplexity " << r.valid_perplexity.back();
    std::cout << " (vocabulary " << r.vocab_size << ")\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
#endif
