// Neural-network modules in the style of libtorch's torch::nn: parameters, submodules, layers.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn_functional.h"
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

// ---------------------------------------------------------------- more activations
// torch.nn's activation modules with their arguments (no inplace variants).
class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  std::string name() const override { return "LeakyReLU"; }
  Tensor forward(const Tensor& input) override { return leaky_relu(input, negative_slope); }

  double negative_slope;
};
class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  std::string name() const override { return "ELU"; }
  Tensor forward(const Tensor& input) override { return elu(input, alpha); }

  double alpha;
};
class SELU : public Module {
 public:
  std::string name() const override { return "SELU"; }
  Tensor forward(const Tensor& input) override { return selu(input); }
};
class Hardswish : public Module {
 public:
  std::string name() const override { return "Hardswish"; }
  Tensor forward(const Tensor& input) override { return hardswish(input); }
};
class Hardsigmoid : public Module {
 public:
  std::string name() const override { return "Hardsigmoid"; }
  Tensor forward(const Tensor& input) override { return hardsigmoid(input); }
};
class Mish : public Module {
 public:
  std::string name() const override { return "Mish"; }
  Tensor forward(const Tensor& input) override { return mish(input); }
};
class LogSigmoid : public Module {
 public:
  std::string name() const override { return "LogSigmoid"; }
  Tensor forward(const Tensor& input) override { return log_sigmoid(input); }
};
class Softsign : public Module {
 public:
  std::string name() const override { return "Softsign"; }
  Tensor forward(const Tensor& input) override { return softsign(input); }
};
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : dim(dim) {}
  std::string name() const override { return "Softmax"; }
  Tensor forward(const Tensor& input) override { return softmax(input, dim); }

  int64_t dim;
};
class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : dim(dim) {}
  std::string name() const override { return "LogSoftmax"; }
  Tensor forward(const Tensor& input) override { return log_softmax(input, dim); }

  int64_t dim;
};

// ---------------------------------------------------------------- losses
// Loss modules with libtorch's options structs: each option is set by a chained call and read by
// the same name, CrossEntropyLossOptions().ignore_index(0).label_smoothing(0.1). forward takes
// (input, target); the modules have no parameters (a class weight is an option, not trained).
#define KILN_LOSS_ARG(TYPE, NAME) \
  auto& NAME(const TYPE& value) { \
    NAME##_ = value;              \
    return *this;                 \
  }                               \
  const TYPE& NAME() const {      \
    return NAME##_;               \
  }                               \
  TYPE NAME##_

class Loss : public Module {
 public:
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  using Module::forward;
};

struct ReductionOptions {
  ReductionOptions(Reduction r = Reduction::Mean) : reduction_(r) {}  // NOLINT: implicit, as torch
  KILN_LOSS_ARG(Reduction, reduction);
};
class MSELoss : public Loss {
 public:
  explicit MSELoss(ReductionOptions options = {}) : options(options) {}
  std::string name() const override { return "MSELoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return mse_loss(input, target, options.reduction());
  }
  ReductionOptions options;
};
class L1Loss : public Loss {
 public:
  explicit L1Loss(ReductionOptions options = {}) : options(options) {}
  std::string name() const override { return "L1Loss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return l1_loss(input, target, options.reduction());
  }
  ReductionOptions options;
};

struct NLLLossOptions {
  KILN_LOSS_ARG(Tensor, weight);
  KILN_LOSS_ARG(int64_t, ignore_index) = -100;
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
};
class NLLLoss : public Loss {
 public:
  explicit NLLLoss(NLLLossOptions options = {}) : options(std::move(options)) {}
  std::string name() const override { return "NLLLoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return nll_loss(input, target, options.weight(), options.reduction(), options.ignore_index());
  }
  NLLLossOptions options;
};

struct CrossEntropyLossOptions {
  KILN_LOSS_ARG(Tensor, weight);
  KILN_LOSS_ARG(int64_t, ignore_index) = -100;
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
  KILN_LOSS_ARG(double, label_smoothing) = 0.0;
};
class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions options = {}) : options(std::move(options)) {}
  std::string name() const override { return "CrossEntropyLoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return cross_entropy(input, target, options.weight(), options.reduction(),
                         options.ignore_index(), options.label_smoothing());
  }
  CrossEntropyLossOptions options;
};

struct BCELossOptions {
  KILN_LOSS_ARG(Tensor, weight);
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
};
class BCELoss : public Loss {
 public:
  explicit BCELoss(BCELossOptions options = {}) : options(std::move(options)) {}
  std::string name() const override { return "BCELoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return binary_cross_entropy(input, target, options.weight(), options.reduction());
  }
  BCELossOptions options;
};

struct BCEWithLogitsLossOptions {
  KILN_LOSS_ARG(Tensor, weight);
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
  KILN_LOSS_ARG(Tensor, pos_weight);
};
class BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsLossOptions options = {}) : options(std::move(options)) {}
  std::string name() const override { return "BCEWithLogitsLoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return binary_cross_entropy_with_logits(input, target, options.weight(), options.reduction(),
                                            options.pos_weight());
  }
  BCEWithLogitsLossOptions options;
};

struct SmoothL1LossOptions {
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
  KILN_LOSS_ARG(double, beta) = 1.0;
};
class SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(SmoothL1LossOptions options = {}) : options(options) {}
  std::string name() const override { return "SmoothL1Loss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return smooth_l1_loss(input, target, options.reduction(), options.beta());
  }
  SmoothL1LossOptions options;
};

struct HuberLossOptions {
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
  KILN_LOSS_ARG(double, delta) = 1.0;
};
class HuberLoss : public Loss {
 public:
  explicit HuberLoss(HuberLossOptions options = {}) : options(options) {}
  std::string name() const override { return "HuberLoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return huber_loss(input, target, options.reduction(), options.delta());
  }
  HuberLossOptions options;
};

// reduction is a Reduction or kiln::kBatchMean.
struct KLDivLossOptions {
  KILN_LOSS_ARG(KLDivReduction, reduction) = Reduction::Mean;
  KILN_LOSS_ARG(bool, log_target) = false;
};
class KLDivLoss : public Loss {
 public:
  explicit KLDivLoss(KLDivLossOptions options = {}) : options(options) {}
  std::string name() const override { return "KLDivLoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return kl_div(input, target, options.reduction(), options.log_target());
  }
  KLDivLossOptions options;
};
#undef KILN_LOSS_ARG

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
