// Neural-network modules in the style of libtorch's torch::nn: parameters, submodules, layers.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ops.h"
#include "kiln/state_dict.h"
#include "kiln/tensor.h"

namespace kiln::nn {

// A module owns parameters (tensors an optimizer trains), buffers (state that is not trained) and
// submodules. Modules are held by std::shared_ptr, as libtorch's module holders do. Every walk
// over the module tree is iterative, so arbitrarily deep trees cannot overflow the stack.
class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Parameters are handles: copying a module would silently share them, so it is not allowed.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's type, used in error messages ("Linear", "LSTMCell", ...).
  virtual std::string name() const { return "Module"; }
  // The single-input forward pass; modules without one throw kiln::Error naming themselves.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Registers `tensor` under `name` (unique among this module's parameters, buffers and children)
  // and marks it as requiring grad when asked. Returns the stored handle.
  Tensor& register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor tensor);
  std::shared_ptr<Module> register_module(const std::string& name, std::shared_ptr<Module> module);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module(name, std::static_pointer_cast<Module>(module));
    return module;
  }

  // Parameters of this module, then of each child in registration order (depth first, preorder),
  // each tensor once even when shared between modules. recurse=false lists only this module's.
  std::vector<Tensor> parameters(bool recurse = true) const;
  // The same, with dotted paths: "0.weight", "encoder.fc1.bias".
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  // Direct submodules in registration order.
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module and every descendant (preorder).
  std::vector<Module*> modules();

  // Training mode (the default) or evaluation mode, for this module and every descendant.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // The training flag as a forward pass reads it: inside jit::trace, each call of the traced
  // function checks it again (and traces anew when it changed).
  bool training_flag() const;

  // Makes every parameter's grad undefined (torch's set_to_none).
  void zero_grad();
  // Converts every floating-point parameter and buffer to `dtype` in place: existing handles to
  // them see the new dtype. Gradients are dropped.
  void to(DType dtype);
  // Moves every parameter and buffer to `device` in place (handles see the move); gradients are
  // dropped.
  void to(Device device);

  // Every parameter and buffer by dotted path, as torch.nn.Module.state_dict(): for each module
  // in preorder, its parameters then its buffers ("layers.0.weight", "bn.running_mean",
  // "bn.num_batches_tracked"). The tensors are detached handles sharing the module's storage; a
  // tensor reachable by two paths (tied weights) appears under both, as in torch.
  StateDict state_dict() const;
  // Copies `dict`'s tensors into the parameters and buffers of the same names (converting dtype
  // and device as copy_ does). Strict: every name must match both ways. A shape mismatch, or with
  // strict a missing or unexpected name, raises kiln::Error naming them, and then nothing in the
  // module has changed: every check runs before the first copy.
  LoadStateDictResult load_state_dict(const StateDict& dict, bool strict = true);

 private:
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  // Expires with the module: a traced function reads training_ through it.
  std::shared_ptr<const char> alive_ = std::make_shared<const char>(0);

  void check_new_name(const std::string& name, const char* what) const;
  template <typename Pick>
  std::vector<std::pair<std::string, Tensor>> collect(bool recurse, Pick pick) const;
};

// y = x @ weight^T + bias, weight [out, in] and bias [out], both initialized uniformly in
// [-1/sqrt(in), 1/sqrt(in)] as torch.nn.Linear.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  std::string name() const override { return "Linear"; }
  Tensor forward(const Tensor& input) override;

  int64_t in_features, out_features;
  Tensor weight, bias;  // bias is undefined when constructed with bias=false
};

// A lookup table: forward(indices) = weight[indices], weight [num, dim] drawn from N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  std::string name() const override { return "Embedding"; }
  Tensor forward(const Tensor& indices) override;

  int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

// Normalizes over the trailing normalized_shape dims; weight starts at ones, bias at zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  std::string name() const override { return "LayerNorm"; }
  Tensor forward(const Tensor& input) override;

  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // undefined without elementwise_affine
};

// Zeroes elements with probability p while training (scaling the rest by 1/(1-p)); the identity
// in evaluation mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  std::string name() const override { return "Dropout"; }
  Tensor forward(const Tensor& input) override;

  double p;
};

class ReLU : public Module {
 public:
  std::string name() const override { return "ReLU"; }
  Tensor forward(const Tensor& input) override { return relu(input); }
};
class Tanh : public Module {
 public:
  std::string name() const override { return "Tanh"; }
  Tensor forward(const Tensor& input) override { return tanh(input); }
};
class Sigmoid : public Module {
 public:
  std::string name() const override { return "Sigmoid"; }
  Tensor forward(const Tensor& input) override { return sigmoid(input); }
};
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate(std::move(approximate)) {}
  std::string name() const override { return "GELU"; }
  Tensor forward(const Tensor& input) override { return gelu(input, approximate); }

  std::string approximate;
};

// Convolutions with torch.nn's arguments. The weight [out, in / groups, k...] and the bias [out]
// are drawn uniformly from [-1/sqrt(fan_in), 1/sqrt(fan_in)], fan_in = in / groups * prod(k), as
// torch's default (kaiming_uniform_ with a = sqrt(5)). padding_mode names "same" or "valid" when
// constructed with one (padding is then unused).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1},
         Shape padding = {0}, Shape dilation = {1}, int64_t groups = 1, bool bias = true);
  Conv2d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride,
         PaddingMode padding, Shape dilation = {1}, int64_t groups = 1, bool bias = true);
  std::string name() const override { return "Conv2d"; }
  Tensor forward(const Tensor& input) override;

  int64_t in_channels, out_channels;
  Shape kernel_size, stride, padding, dilation;
  int64_t groups;
  std::string padding_mode;  // empty, "same" or "valid"
  Tensor weight, bias;       // bias is undefined when constructed with bias=false
};

// The same over [N, C, L] (conv1d); kernel_size, stride, padding and dilation have one value.
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1, bool bias = true);
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
         PaddingMode padding, int64_t dilation = 1, int64_t groups = 1, bool bias = true);
  std::string name() const override { return "Conv1d"; }
  Tensor forward(const Tensor& input) override;

  int64_t in_channels, out_channels, kernel_size, stride, padding, dilation, groups;
  std::string padding_mode;
  Tensor weight, bias;
};

// conv_transpose2d with torch.nn.ConvTranspose2d's arguments; weight [in, out / groups, kH, kW],
// initialized as torch's (fan_in = out / groups * kH * kW).
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1},
                  Shape padding = {0}, Shape output_padding = {0}, int64_t groups = 1,
                  bool bias = true, Shape dilation = {1});
  std::string name() const override { return "ConvTranspose2d"; }
  Tensor forward(const Tensor& input) override;

  int64_t in_channels, out_channels;
  Shape kernel_size, stride, padding, output_padding;
  int64_t groups;
  Shape dilation;
  Tensor weight, bias;
};

// Batch normalization over the channels of [N, C, ...]: weight ones, bias zeros (when affine);
// buffers running_mean (zeros), running_var (ones) and num_batches_tracked (int64) when
// track_running_stats. Training normalizes with batch statistics and updates the running ones;
// eval uses the running ones (or batch statistics without them).
class BatchNorm : public Module {
 public:
  BatchNorm(int64_t num_features, double eps, double momentum, bool affine,
            bool track_running_stats);
  Tensor forward(const Tensor& input) override;

  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  virtual void check_rank(const Tensor& input) const = 0;
};
// Over [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats) {}
  std::string name() const override { return "BatchNorm1d"; }

 protected:
  void check_rank(const Tensor& input) const override;
};
// Over [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats) {}
  std::string name() const override { return "BatchNorm2d"; }

 protected:
  void check_rank(const Tensor& input) const override;
};

// group_norm; weight ones and bias zeros [num_channels] when affine.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  std::string name() const override { return "GroupNorm"; }
  Tensor forward(const Tensor& input) override;

  int64_t num_groups, num_channels;
  double eps;
  bool affine;
  Tensor weight, bias;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Shape kernel_size, Shape stride = {}, Shape padding = {0},
                     Shape dilation = {1}, bool ceil_mode = false)
      : kernel_size(std::move(kernel_size)),
        stride(std::move(stride)),
        padding(std::move(padding)),
        dilation(std::move(dilation)),
        ceil_mode(ceil_mode) {}
  std::string name() const override { return "MaxPool2d"; }
  Tensor forward(const Tensor& input) override {
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode);
  }

  Shape kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Shape kernel_size, Shape stride = {}, Shape padding = {0},
                     bool ceil_mode = false, bool count_include_pad = true)
      : kernel_size(std::move(kernel_size)),
        stride(std::move(stride)),
        padding(std::move(padding)),
        ceil_mode(ceil_mode),
        count_include_pad(count_include_pad) {}
  std::string name() const override { return "AvgPool2d"; }
  Tensor forward(const Tensor& input) override {
    return avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad);
  }

  Shape kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Shape output_size) : output_size(std::move(output_size)) {}
  std::string name() const override { return "AdaptiveAvgPool2d"; }
  Tensor forward(const Tensor& input) override { return adaptive_avg_pool2d(input, output_size); }

  Shape output_size;
};

// Flattens dims start_dim..end_dim into one (by default all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  std::string name() const override { return "Flatten"; }
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim, end_dim); }

  int64_t start_dim, end_dim;
};

// Runs its modules in order, each on the previous one's output; they are registered as "0", "1",
// ... so parameters are named "0.weight" as in torch.nn.Sequential.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  std::string name() const override { return "Sequential"; }
  Tensor forward(const Tensor& input) override;

  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

// An LSTM's hidden and cell state: [batch, hidden] for a cell, [layers, batch, hidden] for LSTM.
struct LSTMState {
  Tensor h, c;
};

// One LSTM step. The input-to-hidden and hidden-to-hidden weights are stored side by side as one
// weight [4*hidden, input + hidden] with one bias [4*hidden], so a step is a single GEMM:
//   gates = bias + [x, h] @ weight^T, split into i, f, g, o (torch's gate order)
//   c' = sigmoid(f) * c + sigmoid(i) * tanh(g),  h' = sigmoid(o) * tanh(c').
// Initialized uniformly in [-1/sqrt(hidden), 1/sqrt(hidden)] as torch.nn.LSTMCell.
class LSTMCell : public Module {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size);
  std::string name() const override { return "LSTMCell"; }
  // input [batch, input_size]; a missing state (nullopt) starts at zeros.
  LSTMState forward(const Tensor& input, const std::optional<LSTMState>& state);
  // h' from a zero state, so that the cell also works as a plain Module (in a Sequential).
  Tensor forward(const Tensor& input) override { return forward(input, std::nullopt).h; }

  // Views of the two halves of weight, torch's weight_ih [4H, input] and weight_hh [4H, H].
  Tensor weight_ih() const { return weight.narrow(1, 0, input_size); }
  Tensor weight_hh() const { return weight.narrow(1, input_size, hidden_size); }

  int64_t input_size, hidden_size;
  Tensor weight, bias;
};

struct LSTMOutput {
  Tensor output;    // [time, batch, hidden]: the last layer's h at every step
  LSTMState state;  // h_n and c_n, each [layers, batch, hidden]
};

// A stack of LSTMCells run over a sequence [time, batch, input_size]; the cells are registered as
// "l0", "l1", .... Dropout with probability `dropout` is applied to each layer's output except the
// last one's, in training mode.
class LSTM : public Module {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, double dropout = 0.0);
  std::string name() const override { return "LSTM"; }
  // A missing state (nullopt) starts at zeros.
  LSTMOutput forward(const Tensor& input, const std::optional<LSTMState>& state);
  // The output sequence from a zero state, so that the LSTM also works as a plain Module.
  Tensor forward(const Tensor& input) override { return forward(input, std::nullopt).output; }

  int64_t input_size, hidden_size, num_layers;
  double dropout;
  std::vector<std::shared_ptr<LSTMCell>> cells;
};

namespace utils {

// Scales the gradients of `parameters` in place so that their combined norm (the norm of all of
// them concatenated; norm_type 2 is L2, infinity the max-abs) is at most max_norm, as
// torch.nn.utils.clip_grad_norm_. Parameters without a gradient are skipped. Returns the norm
// measured before clipping, as a float64 scalar tensor. Nothing reads a value, so a training step
// that clips traces (jit::trace) and lazy mode computes it all as one graph.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0);

}  // namespace utils
}  // namespace kiln::nn

// ---------------------------------------------------------------------------- attention
namespace kiln {

// torch.nn.functional.scaled_dot_product_attention: softmax(query key^T * scale + mask) value over
// query [..., L, E], key [..., S, E] and value [..., S, Ev] (batch dims broadcast), giving
// [..., L, Ev]. attn_mask broadcasts to [..., L, S]: a bool mask is true where a query may attend
// (false gives -inf), a float mask (query's dtype) is added to the scores. is_causal lets query i
// attend to keys 0..i (no attn_mask then). dropout_p drops attention weights (always: there is no
// training flag, as in torch). scale defaults to 1/sqrt(E). A query that may attend to nothing
// gets NaN, as torch 2.0-2.4 (torch 2.5 on gives 0; see docs/torch-differences.md). The two
// products are GEMMs; scaling, masking and softmax fuse into one kernel.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace kiln

namespace kiln::nn {

struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads)
      : embed_dim(embed_dim), num_heads(num_heads) {}
  int64_t embed_dim;
  int64_t num_heads;
  double dropout = 0.0;      // on the attention weights, in training mode
  bool bias = true;          // in_proj_bias and out_proj.bias
  bool batch_first = false;  // [N, L, E] rather than [L, N, E]
};

struct MultiheadAttentionOutput {
  Tensor output;   // [L, N, E] ([N, L, E] with batch_first; [L, E] unbatched)
  Tensor weights;  // [N, L, S] averaged over heads ([N, H, L, S] if not); undefined without
                   // need_weights
};

// torch.nn.MultiheadAttention (kdim = vdim = embed_dim, no add_bias_kv / add_zero_attn). Parameters
// as torch's: in_proj_weight [3E, E] (xavier uniform), in_proj_bias [3E] (zeros) and out_proj, a
// Linear(E, E) whose bias starts at zeros. Each of the num_heads heads attends over E / num_heads
// channels with scaled_dot_product_attention.
class MultiheadAttention : public Module {
 public:
  explicit MultiheadAttention(const MultiheadAttentionOptions& options);
  MultiheadAttention(int64_t embed_dim, int64_t num_heads)
      : MultiheadAttention(MultiheadAttentionOptions(embed_dim, num_heads)) {}
  std::string name() const override { return "MultiheadAttention"; }
  // query [L, N, E], key and value [S, N, E] (batch first: [N, L, E], [N, S, E]), or unbatched
  // [L, E], [S, E]. key_padding_mask [N, S] ([S] unbatched): true (or -inf) marks keys to ignore.
  // attn_mask [L, S] or [N * num_heads, L, S]: bool true marks pairs that may NOT attend (torch's
  // convention, the opposite of scaled_dot_product_attention's), a float mask is added.
  MultiheadAttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask = {}, bool need_weights = true,
                                   const Tensor& attn_mask = {}, bool average_attn_weights = true);
  // Self-attention: forward(x, x, x).output.
  Tensor forward(const Tensor& input) override { return forward(input, input, input).output; }

  MultiheadAttentionOptions options;
  int64_t head_dim;
  Tensor in_proj_weight, in_proj_bias;  // in_proj_bias undefined without bias
  std::shared_ptr<Linear> out_proj;
};

struct TransformerEncoderLayerOptions {
  TransformerEncoderLayerOptions(int64_t d_model, int64_t nhead) : d_model(d_model), nhead(nhead) {}
  int64_t d_model;
  int64_t nhead;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;  // pre-norm: x + sa(norm1(x)), x + ff(norm2(x))
  bool bias = true;
};

// torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block (linear1, activation,
// dropout, linear2), each followed by dropout and a residual add, with layer norms after them
// (post-norm, torch's default) or before (norm_first). Submodules named as torch's: self_attn,
// linear1, dropout, linear2, norm1, norm2, dropout1, dropout2.
class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);
  TransformerEncoderLayer(int64_t d_model, int64_t nhead)
      : TransformerEncoderLayer(TransformerEncoderLayerOptions(d_model, nhead)) {}
  std::string name() const override { return "TransformerEncoderLayer"; }
  // src [S, N, E] ([N, S, E] with batch_first); masks as MultiheadAttention's attn_mask and
  // key_padding_mask.
  Tensor forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = {});
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }

  TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding);
  Tensor feed_forward_block(const Tensor& x);
};

// torch.nn.TransformerEncoder: num_layers copies of `layer` (same options and initial weights, as
// torch's deep copies), registered as layers.0, layers.1, ..., then `norm` when given.
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(const std::shared_ptr<TransformerEncoderLayer>& layer, int64_t num_layers,
                     std::shared_ptr<LayerNorm> norm = nullptr);
  std::string name() const override { return "TransformerEncoder"; }
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = {});
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }

  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;  // null when not given
};

}  // namespace kiln::nn
