// Neural-network modules in the style of libtorch's torch::nn: parameters, submodules, layers.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "kiln/state_dict.h"
#include "kiln/tensor.h"

// A field of an options struct with libtorch's accessors (TORCH_ARG): `name(value)` sets it and
// returns the options for chaining, `name()` reads it. Declared as `KILN_ARG(type, name) =
// default;`.
#ifndef KILN_ARG
#define KILN_ARG(T, name)                                        \
 public:                                                         \
  auto name(const T& new_##name)->decltype(*this) { /* NOLINT */ \
    this->name##_ = new_##name;                                  \
    return *this;                                                \
  }                                                              \
  const T& name() const noexcept {                               \
    return this->name##_;                                        \
  }                                                              \
  T& name() noexcept {                                           \
    return this->name##_;                                        \
  }                                                              \
                                                                 \
 private:                                                        \
  T name##_
#endif

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
  // Moving takes over the parameters, buffers and children (the same tensor handles), so that a
  // module built as a value can be handed to a container: Sequential seq(Linear(2, 3), ReLU()).
  // The moved-to module has its own lifetime token: a trace that read the moved-from module's
  // training flag does not follow the move.
  Module(Module&& other) noexcept;

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
  // Swaps the submodule registered as `name` for `module` (same name, same position), as
  // libtorch's replace_module; raises if no submodule has that name.
  std::shared_ptr<Module> replace_module(const std::string& name, std::shared_ptr<Module> module);

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

// torch::nn::EmbeddingOptions: padding_idx only (no max_norm, scale_grad_by_freq or sparse).
class EmbeddingOptions {
 public:
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  KILN_ARG(int64_t, num_embeddings);
  KILN_ARG(int64_t, embedding_dim);
  // A row whose lookups pass no gradient back; it starts at zeros. Negative counts from the end.
  KILN_ARG(std::optional<int64_t>, padding_idx) = std::nullopt;
};

// A lookup table: forward(indices) = weight[indices], weight [num, dim] drawn from N(0, 1). With
// padding_idx, that row starts at zeros and its gradient is always zero (as torch: the row itself
// may still be changed by hand, and lookups of it return its current value).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  explicit Embedding(const EmbeddingOptions& options);
  std::string name() const override { return "Embedding"; }
  Tensor forward(const Tensor& indices) override;

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // normalized to [0, num_embeddings)
  Tensor weight;
};

// torch::nn::EmbeddingBagOptions: mode ("sum", "mean" or "max"), include_last_offset, padding_idx
// (no max_norm, scale_grad_by_freq or sparse).
class EmbeddingBagOptions {
 public:
  EmbeddingBagOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  KILN_ARG(int64_t, num_embeddings);
  KILN_ARG(int64_t, embedding_dim);
  KILN_ARG(std::string, mode) = "mean";
  KILN_ARG(bool, include_last_offset) = false;
  KILN_ARG(std::optional<int64_t>, padding_idx) = std::nullopt;
};

// embedding_bag over a weight [num, dim] drawn from N(0, 1) (the padding_idx row zeros).
class EmbeddingBag : public Module {
 public:
  EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim);
  explicit EmbeddingBag(const EmbeddingBagOptions& options);
  std::string name() const override { return "EmbeddingBag"; }
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  Tensor forward(const Tensor& input, const Tensor& offsets, const Tensor& per_sample_weights = {});
  Tensor operator()(const Tensor& input, const Tensor& offsets,
                    const Tensor& per_sample_weights = {}) {
    return forward(input, offsets, per_sample_weights);
  }
  using Module::operator();

  EmbeddingBagOptions options;
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
class Hardtanh : public Module {
 public:
  explicit Hardtanh(double min_val = -1.0, double max_val = 1.0)
      : min_val(min_val), max_val(max_val) {}
  std::string name() const override { return "Hardtanh"; }
  Tensor forward(const Tensor& input) override { return hardtanh(input, min_val, max_val); }

  double min_val, max_val;
};
class ReLU6 : public Module {
 public:
  std::string name() const override { return "ReLU6"; }
  Tensor forward(const Tensor& input) override { return relu6(input); }
};
class CELU : public Module {
 public:
  explicit CELU(double alpha = 1.0) : alpha(alpha) {}
  std::string name() const override { return "CELU"; }
  Tensor forward(const Tensor& input) override { return celu(input, alpha); }

  double alpha;
};
class Softshrink : public Module {
 public:
  explicit Softshrink(double lambd = 0.5) : lambd(lambd) {}
  std::string name() const override { return "Softshrink"; }
  Tensor forward(const Tensor& input) override { return softshrink(input, lambd); }

  double lambd;
};
class Hardshrink : public Module {
 public:
  explicit Hardshrink(double lambd = 0.5) : lambd(lambd) {}
  std::string name() const override { return "Hardshrink"; }
  Tensor forward(const Tensor& input) override { return hardshrink(input, lambd); }

  double lambd;
};
class Tanhshrink : public Module {
 public:
  std::string name() const override { return "Tanhshrink"; }
  Tensor forward(const Tensor& input) override { return tanhshrink(input); }
};
class GLU : public Module {
 public:
  explicit GLU(int64_t dim = -1) : dim(dim) {}
  std::string name() const override { return "GLU"; }
  Tensor forward(const Tensor& input) override { return glu(input, dim); }

  int64_t dim;
};
// A learned slope for negative inputs: one, or one per channel (num_parameters), from `init`.
class PReLU : public Module {
 public:
  explicit PReLU(int64_t num_parameters = 1, double init = 0.25);
  std::string name() const override { return "PReLU"; }
  Tensor forward(const Tensor& input) override { return prelu(input, weight); }

  Tensor weight;
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

struct MultiMarginLossOptions {
  KILN_LOSS_ARG(int64_t, p) = 1;
  KILN_LOSS_ARG(double, margin) = 1.0;
  KILN_LOSS_ARG(Tensor, weight);
  KILN_LOSS_ARG(Reduction, reduction) = Reduction::Mean;
};
class MultiMarginLoss : public Loss {
 public:
  explicit MultiMarginLoss(MultiMarginLossOptions options = {}) : options(std::move(options)) {}
  std::string name() const override { return "MultiMarginLoss"; }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return multi_margin_loss(input, target, options.p(), options.margin(), options.weight(),
                             options.reduction());
  }
  MultiMarginLossOptions options;
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

// The same over [N, C, D, H, W] (conv3d); kernel_size, stride, padding and dilation have 1 or 3
// values.
class Conv3d : public Module {
 public:
  Conv3d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride = {1},
         Shape padding = {0}, Shape dilation = {1}, int64_t groups = 1, bool bias = true);
  Conv3d(int64_t in_channels, int64_t out_channels, Shape kernel_size, Shape stride,
         PaddingMode padding, Shape dilation = {1}, int64_t groups = 1, bool bias = true);
  std::string name() const override { return "Conv3d"; }
  Tensor forward(const Tensor& input) override;

  int64_t in_channels, out_channels;
  Shape kernel_size, stride, padding, dilation;
  int64_t groups;
  std::string padding_mode;  // empty, "same" or "valid"
  Tensor weight, bias;
};

// conv_transpose1d with torch.nn.ConvTranspose1d's arguments (one value each); weight
// [in, out / groups, k], initialized as ConvTranspose2d's.
class ConvTranspose1d : public Module {
 public:
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                  int64_t stride = 1, int64_t padding = 0, int64_t output_padding = 0,
                  int64_t groups = 1, bool bias = true, int64_t dilation = 1);
  std::string name() const override { return "ConvTranspose1d"; }
  Tensor forward(const Tensor& input) override;

  int64_t in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, dilation;
  Tensor weight, bias;
};

// The state of a normalization over num_features channels (torch's _NormBase): weight ones and
// bias zeros when affine; buffers running_mean (zeros), running_var (ones) and
// num_batches_tracked (int64) when track_running_stats.
class NormBase : public Module {
 public:
  NormBase(const char* module, int64_t num_features, double eps, double momentum, bool affine,
           bool track_running_stats);

  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

// Batch normalization over the channels of [N, C, ...]. Training normalizes with batch
// statistics and updates the running ones; eval uses the running ones (or batch statistics
// without them).
class BatchNorm : public NormBase {
 public:
  BatchNorm(int64_t num_features, double eps, double momentum, bool affine,
            bool track_running_stats)
      : NormBase("BatchNorm", num_features, eps, momentum, affine, track_running_stats) {}
  Tensor forward(const Tensor& input) override;

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

// Over [N, C, D, H, W].
class BatchNorm3d : public BatchNorm {
 public:
  explicit BatchNorm3d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats) {}
  std::string name() const override { return "BatchNorm3d"; }

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

// Instance normalization (instance_norm) of [N, C, ...] or one unbatched sample [C, ...]; the
// running statistics, when tracked, serve eval. torch's defaults: no affine, no statistics.
class InstanceNorm : public NormBase {
 public:
  InstanceNorm(int64_t num_features, double eps, double momentum, bool affine,
               bool track_running_stats, int64_t spatial_dims)
      : NormBase("InstanceNorm", num_features, eps, momentum, affine, track_running_stats),
        spatial_dims_(spatial_dims) {}
  Tensor forward(const Tensor& input) override;

 private:
  int64_t spatial_dims_;
};
// Over [N, C, L] or [C, L].
class InstanceNorm1d : public InstanceNorm {
 public:
  explicit InstanceNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false)
      : InstanceNorm(num_features, eps, momentum, affine, track_running_stats, 1) {}
  std::string name() const override { return "InstanceNorm1d"; }
};
// Over [N, C, H, W] or [C, H, W].
class InstanceNorm2d : public InstanceNorm {
 public:
  explicit InstanceNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false)
      : InstanceNorm(num_features, eps, momentum, affine, track_running_stats, 2) {}
  std::string name() const override { return "InstanceNorm2d"; }
};
// Over [N, C, D, H, W] or [C, D, H, W].
class InstanceNorm3d : public InstanceNorm {
 public:
  explicit InstanceNorm3d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false)
      : InstanceNorm(num_features, eps, momentum, affine, track_running_stats, 3) {}
  std::string name() const override { return "InstanceNorm3d"; }
};

// local_response_norm as a module.
class LocalResponseNorm : public Module {
 public:
  explicit LocalResponseNorm(int64_t size, double alpha = 1e-4, double beta = 0.75, double k = 1.0)
      : size(size), alpha(alpha), beta(beta), k(k) {}
  std::string name() const override { return "LocalResponseNorm"; }
  Tensor forward(const Tensor& input) override {
    return local_response_norm(input, size, alpha, beta, k);
  }

  int64_t size;
  double alpha, beta, k;
};

// The pooling modules hold their function's arguments; Pool is the 1-D or 2-D function.
template <Tensor (*Pool)(const Tensor&, const Shape&, const Shape&, const Shape&, const Shape&,
                         bool)>
class MaxPoolNd : public Module {
 public:
  explicit MaxPoolNd(Shape kernel_size, Shape stride = {}, Shape padding = {0},
                     Shape dilation = {1}, bool ceil_mode = false)
      : kernel_size(std::move(kernel_size)),
        stride(std::move(stride)),
        padding(std::move(padding)),
        dilation(std::move(dilation)),
        ceil_mode(ceil_mode) {}
  Tensor forward(const Tensor& input) override {
    return Pool(input, kernel_size, stride, padding, dilation, ceil_mode);
  }

  Shape kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

template <Tensor (*Pool)(const Tensor&, const Shape&, const Shape&, const Shape&, bool, bool)>
class AvgPoolNd : public Module {
 public:
  explicit AvgPoolNd(Shape kernel_size, Shape stride = {}, Shape padding = {0},
                     bool ceil_mode = false, bool count_include_pad = true)
      : kernel_size(std::move(kernel_size)),
        stride(std::move(stride)),
        padding(std::move(padding)),
        ceil_mode(ceil_mode),
        count_include_pad(count_include_pad) {}
  Tensor forward(const Tensor& input) override {
    return Pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad);
  }

  Shape kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
};

template <Tensor (*Pool)(const Tensor&, const Shape&)>
class AdaptivePoolNd : public Module {
 public:
  explicit AdaptivePoolNd(Shape output_size) : output_size(std::move(output_size)) {}
  Tensor forward(const Tensor& input) override { return Pool(input, output_size); }

  Shape output_size;
};

class MaxPool2d : public MaxPoolNd<max_pool2d> {
 public:
  using MaxPoolNd::MaxPoolNd;
  std::string name() const override { return "MaxPool2d"; }
};
class AvgPool2d : public AvgPoolNd<avg_pool2d> {
 public:
  using AvgPoolNd::AvgPoolNd;
  std::string name() const override { return "AvgPool2d"; }
};
class AdaptiveAvgPool2d : public AdaptivePoolNd<adaptive_avg_pool2d> {
 public:
  using AdaptivePoolNd::AdaptivePoolNd;
  std::string name() const override { return "AdaptiveAvgPool2d"; }
};
class MaxPool1d : public MaxPoolNd<max_pool1d> {
 public:
  using MaxPoolNd::MaxPoolNd;
  std::string name() const override { return "MaxPool1d"; }
};
class AvgPool1d : public AvgPoolNd<avg_pool1d> {
 public:
  using AvgPoolNd::AvgPoolNd;
  std::string name() const override { return "AvgPool1d"; }
};
class AdaptiveAvgPool1d : public AdaptivePoolNd<adaptive_avg_pool1d> {
 public:
  using AdaptivePoolNd::AdaptivePoolNd;
  std::string name() const override { return "AdaptiveAvgPool1d"; }
};
class MaxPool3d : public MaxPoolNd<max_pool3d> {
 public:
  using MaxPoolNd::MaxPoolNd;
  std::string name() const override { return "MaxPool3d"; }
};
class AvgPool3d : public AvgPoolNd<avg_pool3d> {
 public:
  using AvgPoolNd::AvgPoolNd;
  std::string name() const override { return "AvgPool3d"; }
};
class AdaptiveAvgPool3d : public AdaptivePoolNd<adaptive_avg_pool3d> {
 public:
  using AdaptivePoolNd::AdaptivePoolNd;
  std::string name() const override { return "AdaptiveAvgPool3d"; }
};
class AdaptiveMaxPool3d : public AdaptivePoolNd<adaptive_max_pool3d> {
 public:
  using AdaptivePoolNd::AdaptivePoolNd;
  std::string name() const override { return "AdaptiveMaxPool3d"; }
};
// forward returns the values; adaptive_max_pool*_with_indices gives the indices too.
class AdaptiveMaxPool2d : public AdaptivePoolNd<adaptive_max_pool2d> {
 public:
  using AdaptivePoolNd::AdaptivePoolNd;
  std::string name() const override { return "AdaptiveMaxPool2d"; }
};
class AdaptiveMaxPool1d : public AdaptivePoolNd<adaptive_max_pool1d> {
 public:
  using AdaptivePoolNd::AdaptivePoolNd;
  std::string name() const override { return "AdaptiveMaxPool1d"; }
};

// im2col and col2im as modules (torch.nn.Unfold and Fold).
class Unfold : public Module {
 public:
  explicit Unfold(Shape kernel_size, Shape dilation = {1}, Shape padding = {0}, Shape stride = {1})
      : kernel_size(std::move(kernel_size)),
        dilation(std::move(dilation)),
        padding(std::move(padding)),
        stride(std::move(stride)) {}
  std::string name() const override { return "Unfold"; }
  Tensor forward(const Tensor& input) override {
    return unfold(input, kernel_size, dilation, padding, stride);
  }

  Shape kernel_size, dilation, padding, stride;
};

class Fold : public Module {
 public:
  explicit Fold(Shape output_size, Shape kernel_size, Shape dilation = {1}, Shape padding = {0},
                Shape stride = {1})
      : output_size(std::move(output_size)),
        kernel_size(std::move(kernel_size)),
        dilation(std::move(dilation)),
        padding(std::move(padding)),
        stride(std::move(stride)) {}
  std::string name() const override { return "Fold"; }
  Tensor forward(const Tensor& input) override {
    return fold(input, output_size, kernel_size, dilation, padding, stride);
  }

  Shape output_size, kernel_size, dilation, padding, stride;
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

namespace module_args {
// What a container accepts as a module: a shared_ptr to one, or a module value (moved into a
// new shared_ptr, as libtorch's containers take module holders).
template <typename M>
constexpr bool is_module_arg_v = std::is_convertible_v<std::decay_t<M>, std::shared_ptr<Module>> ||
                                 std::is_base_of_v<Module, std::decay_t<M>>;
template <typename M>
std::shared_ptr<Module> to_module_ptr(M&& module) {
  using T = std::decay_t<M>;
  if constexpr (std::is_convertible_v<T, std::shared_ptr<Module>>) {
    return std::forward<M>(module);
  } else {
    static_assert(!std::is_lvalue_reference_v<M>,
                  "a module value is moved into its container: pass a temporary or std::move it");
    return std::make_shared<T>(std::move(module));
  }
}
}  // namespace module_args

// Runs its modules in order, each on the previous one's output; they are registered as "0", "1",
// ... so parameters are named "0.weight" as in torch.nn.Sequential. Constructible from modules
// directly, values or shared_ptrs: Sequential seq(Linear(4, 3), ReLU()).
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  template <typename... Ms, typename = std::enable_if_t<(sizeof...(Ms) > 0) &&
                                                        (module_args::is_module_arg_v<Ms> && ...)>>
  explicit Sequential(Ms&&... modules) {
    (push_back(module_args::to_module_ptr(std::forward<Ms>(modules))), ...);
  }
  std::string name() const override { return "Sequential"; }
  Tensor forward(const Tensor& input) override;

  void push_back(std::shared_ptr<Module> module);
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>>>
  void push_back(M&& module) {
    push_back(module_args::to_module_ptr(std::forward<M>(module)));
  }
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

// An LSTM's hidden and cell state: [batch, hidden] for a cell, [layers * directions, batch, hidden]
// for LSTM.
struct LSTMState {
  Tensor h, c;
};

// One LSTM step. The input-to-hidden and hidden-to-hidden weights are stored side by side as one
// weight [4*hidden, input + hidden] with one bias [4*hidden], so a step is a single GEMM:
//   gates = bias + [x, h] @ weight^T, split into i, f, g, o (torch's gate order)
//   c' = sigmoid(f) * c + sigmoid(i) * tanh(g),  h' = sigmoid(o) * tanh(c').
// Initialized uniformly in [-1/sqrt(hidden), 1/sqrt(hidden)] as torch.nn.LSTMCell. Without bias
// (bias=false) the bias is undefined and not registered.
class LSTMCell : public Module {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
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
  // [time, batch, directions * hidden] ([batch, time, ...] with batch_first): the last layer's h
  // at every step, the two directions side by side (forward first).
  Tensor output;
  // h_n and c_n, each [layers * directions, batch, hidden] (row l * directions + d), whatever
  // batch_first says, as torch.
  LSTMState state;
};

// torch::nn::LSTMOptions (no proj_size).
class LSTMOptions {
 public:
  LSTMOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  KILN_ARG(int64_t, input_size);
  KILN_ARG(int64_t, hidden_size);
  KILN_ARG(int64_t, num_layers) = 1;
  KILN_ARG(bool, bias) = true;
  KILN_ARG(bool, batch_first) = false;
  // Dropout on each layer's output but the last one's, in training mode only.
  KILN_ARG(double, dropout) = 0.0;
  KILN_ARG(bool, bidirectional) = false;
};

// A stack of LSTMCells run over a sequence [time, batch, input_size] ([batch, time, input_size]
// with batch_first); the cells are registered as "l0", "l1", ..., and the reverse direction's as
// "l0_reverse", ... (torch's suffix). A bidirectional layer feeds the next one with both
// directions' outputs side by side.
class LSTM : public Module {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, double dropout = 0.0);
  explicit LSTM(const LSTMOptions& options);
  std::string name() const override { return "LSTM"; }
  // A missing state (nullopt) starts at zeros.
  LSTMOutput forward(const Tensor& input, const std::optional<LSTMState>& state);
  // The output sequence from a zero state, so that the LSTM also works as a plain Module.
  Tensor forward(const Tensor& input) override { return forward(input, std::nullopt).output; }
  const LSTMOptions& options() const { return options_; }

  int64_t input_size, hidden_size, num_layers;
  double dropout;
  // Layer l's direction d is cells[l * directions + d].
  std::vector<std::shared_ptr<LSTMCell>> cells;

 private:
  LSTMOptions options_;
};

// ---------------------------------------------------------------------------- GRU

// torch::nn::GRUCellOptions.
class GRUCellOptions {
 public:
  GRUCellOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  KILN_ARG(int64_t, input_size);
  KILN_ARG(int64_t, hidden_size);
  KILN_ARG(bool, bias) = true;
};

// One GRU step with torch's parameters and gate order r, z, n:
//   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
//   n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h' = (1 - z) * n + z * h.
// weight_ih [3H, input], weight_hh [3H, H], bias_ih and bias_hh [3H] (undefined without bias),
// all uniform in [-1/sqrt(H), 1/sqrt(H)]. A step is two GEMMs (r * (W_hn h + b_hn) keeps the
// two products apart) and one fused kernel for everything pointwise.
class GRUCell : public Module {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  explicit GRUCell(const GRUCellOptions& options);
  std::string name() const override { return "GRUCell"; }
  // input [batch, input_size], hx [batch, hidden_size]; an undefined hx starts at zeros.
  Tensor forward(const Tensor& input, const Tensor& hx);
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }

  int64_t input_size, hidden_size;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};

// torch::nn::GRUOptions.
class GRUOptions {
 public:
  GRUOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  KILN_ARG(int64_t, input_size);
  KILN_ARG(int64_t, hidden_size);
  KILN_ARG(int64_t, num_layers) = 1;
  KILN_ARG(bool, bias) = true;
  KILN_ARG(bool, batch_first) = false;
  // Dropout on each layer's output but the last one's, in training mode only.
  KILN_ARG(double, dropout) = 0.0;
  KILN_ARG(bool, bidirectional) = false;
};

// A stack of GRU cells over a sequence [time, batch, input_size] ([batch, time, input_size] with
// batch_first). Parameters have torch's names: weight_ih_l0, weight_hh_l0, bias_ih_l0,
// bias_hh_l0, and weight_ih_l0_reverse, ... for the reverse direction, so a torch GRU's
// state_dict loads as it is.
class GRU : public Module {
 public:
  GRU(int64_t input_size, int64_t hidden_size) : GRU(GRUOptions(input_size, hidden_size)) {}
  explicit GRU(const GRUOptions& options);
  std::string name() const override { return "GRU"; }
  // (output, h_n) as torch: output [time, batch, directions * hidden] (batch-first with
  // batch_first), h_n [layers * directions, batch, hidden]; an undefined hx starts at zeros.
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx);
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, Tensor())); }
  const GRUOptions& options() const { return options_; }

  // Layer l's direction d is cells[l * directions + d]; their tensors are this module's
  // parameters (the cells themselves are not registered submodules).
  std::vector<std::shared_ptr<GRUCell>> cells;

 private:
  GRUOptions options_;
};

// ---------------------------------------------------------------------------- containers

// torch::nn::ModuleList: modules registered as "0", "1", ... (parameters "0.weight"), with no
// forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <typename... Ms, typename = std::enable_if_t<(sizeof...(Ms) > 0) &&
                                                        (module_args::is_module_arg_v<Ms> && ...)>>
  explicit ModuleList(Ms&&... modules) {
    (push_back(module_args::to_module_ptr(std::forward<Ms>(modules))), ...);
  }
  std::string name() const override { return "ModuleList"; }

  void push_back(std::shared_ptr<Module> module);
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>>>
  void push_back(M&& module) {
    push_back(module_args::to_module_ptr(std::forward<M>(module)));
  }
  void extend(const std::vector<std::shared_ptr<Module>>& modules);
  size_t size() const { return modules_.size(); }
  bool is_empty() const { return modules_.empty(); }
  // Raise kiln::Error for an index out of range.
  const std::shared_ptr<Module>& operator[](size_t index) const;
  const std::shared_ptr<Module>& ptr(size_t index) const { return (*this)[index]; }
  // The module at `index` as a T (raises when it is not one).
  template <typename T>
  T& at(size_t index) const {
    return checked_cast<T>(ptr(index), std::to_string(index));
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
  template <typename T>
  T& checked_cast(const std::shared_ptr<Module>& m, const std::string& key) const {
    auto* typed = dynamic_cast<T*>(m.get());
    if (!typed) fail_cast(key, m->name());
    return *typed;
  }
  [[noreturn]] void fail_cast(const std::string& key, const std::string& actual) const;
};

// torch::nn::ModuleDict: modules registered under their keys (parameters "key.weight"), in
// insertion order; inserting an existing key replaces that module in place.
class ModuleDict : public Module {
 public:
  using Items = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;
  ModuleDict() = default;
  explicit ModuleDict(const Items& modules) { update(modules); }
  std::string name() const override { return "ModuleDict"; }

  void insert(const std::string& key, std::shared_ptr<Module> module);
  void update(const Items& modules);
  bool contains(const std::string& key) const;
  // Raises kiln::Error naming the key when it is absent.
  const std::shared_ptr<Module>& operator[](const std::string& key) const;
  template <typename T>
  T& at(const std::string& key) const {
    auto* typed = dynamic_cast<T*>((*this)[key].get());
    if (!typed) fail_cast(key, (*this)[key]->name());
    return *typed;
  }
  std::vector<std::string> keys() const;
  std::vector<std::shared_ptr<Module>> values() const;
  const Items& items() const { return items_; }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  Items items_;
  [[noreturn]] void fail_cast(const std::string& key, const std::string& actual) const;
};

// ---------------------------------------------------------------------------- init

// torch::nn::init: each function overwrites its tensor in place without autograd history (as
// under NoGradGuard; a parameter stays a leaf) and returns it. Random draws come from the process
// generator, so manual_seed reproduces them.
namespace init {

// torch's nonlinearity and fan-mode names (torch::kReLU, torch::kFanIn) as enums.
enum class Nonlinearity {
  Linear,
  Conv1D,
  Conv2D,
  Conv3D,
  ConvTranspose1D,
  ConvTranspose2D,
  ConvTranspose3D,
  Sigmoid,
  Tanh,
  ReLU,
  LeakyReLU,
  SELU
};
enum class FanMode { FanIn, FanOut };

// The recommended gain for a nonlinearity: 1 for linear, convolutions and sigmoid, 5/3 for tanh,
// sqrt(2) for ReLU, sqrt(2 / (1 + param^2)) for leaky ReLU (param = negative slope), 3/4 for SELU.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);
// (fan_in, fan_out) = (size(1) * receptive field, size(0) * receptive field), the receptive field
// being the product of the sizes after the second; raises for fewer than 2 dims.
std::tuple<int64_t, int64_t> _calculate_fan_in_and_fan_out(const Tensor& tensor);

Tensor uniform_(Tensor tensor, double low = 0.0, double high = 1.0);
Tensor normal_(Tensor tensor, double mean = 0.0, double std = 1.0);
Tensor constant_(Tensor tensor, const Scalar& value);
Tensor ones_(Tensor tensor);
Tensor zeros_(Tensor tensor);
// The identity on a 2-D tensor (ones on the diagonal of a non-square one).
Tensor eye_(Tensor tensor);
// U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor tensor, double gain = 1.0);
// N(0, std), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor tensor, double gain = 1.0);
// U(-b, b), b = sqrt(3) * gain / sqrt(fan), gain = calculate_gain(nonlinearity, a) and fan the
// fan_in or fan_out as mode says.
Tensor kaiming_uniform_(Tensor tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// N(0, std), std = gain / sqrt(fan).
Tensor kaiming_normal_(Tensor tensor, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// N(mean, std) truncated to [a, b] (torch's method: uniform draws between the bounds' normal
// distribution function values, mapped back through erfinv, then clamped to [a, b]); raises
// unless a < b and std > 0.
Tensor trunc_normal_(Tensor tensor, double mean = 0.0, double std = 1.0, double a = -2.0,
                     double b = 2.0);
// A (semi-)orthogonal matrix times gain over the tensor flattened to [size(0), rest], from the QR
// decomposition of a standard normal draw (signs fixed so R's diagonal is positive), as torch.
Tensor orthogonal_(Tensor tensor, double gain = 1.0);

}  // namespace init

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
