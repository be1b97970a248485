// kiln::nn: the Module tree (registration, iterative traversal, modes) and the standard layers.
#include <cmath>
#include <functional>
#include <unordered_set>

#include "kiln/autograd.h"
#include "kiln/nn.h"
#include "lib/tensor_impl.h"

namespace kiln::nn {

using detail::describe;
using detail::shape_str;

namespace {

// Uniform in [-bound, bound), drawn from the process generator so manual_seed reproduces it.
Tensor uniform(const Shape& shape, double bound) {
  return rand(shape) * (2.0 * bound) - bound;
}

}  // namespace

// ---------------------------------------------------------------------------- Module

Tensor Module::forward(const Tensor& input) {
  KILN_FAIL(name(), ": this module has no forward(input) taking one tensor (called with ",
            describe(input), ")");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, this->name(), ": ", what,
             " name '", name, "' must be non-empty and contain no '.'");
  auto taken = [&](const auto& list) {
    for (const auto& entry : list)
      if (entry.first == name) return true;
    return false;
  };
  KILN_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), this->name(), ": ", what,
             " name '", name, "' is already in use");
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  KILN_CHECK(tensor.defined(), this->name(), ": parameter '", name, "' is undefined");
  if (requires_grad) {
    KILN_CHECK(tensor.is_floating_point(), this->name(), ": parameter '", name,
               "' must be floating point to require grad, got ", describe(tensor));
    tensor.requires_grad_(true);
  }
  parameters_.emplace_back(name, std::move(tensor));
  return parameters_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  buffers_.emplace_back(name, std::move(tensor));
  return buffers_.back().second;
}

std::shared_ptr<Module> Module::register_module(const std::string& name,
                                                std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  KILN_CHECK(module != nullptr, this->name(), ": submodule '", name, "' is null");
  children_.emplace_back(name, module);
  return module;
}

// Walks the tree in preorder with an explicit stack, prefixing names with the path to each module.
// A tensor reachable through several modules (tied weights) is listed once, at its first path.
template <typename Pick>
std::vector<std::pair<std::string, Tensor>> Module::collect(bool recurse, Pick pick) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const detail::TensorImpl*> seen;
  std::vector<std::pair<std::string, const Module*>> stack{{"", this}};
  while (!stack.empty()) {
    auto [prefix, module] = stack.back();
    stack.pop_back();
    for (const auto& [name, tensor] : pick(*module)) {
      if (tensor.defined() && !seen.insert(tensor.impl()).second) continue;
      out.emplace_back(prefix + name, tensor);
    }
    if (!recurse) break;
    const auto& kids = module->children_;
    for (auto it = kids.rbegin(); it != kids.rend(); ++it)
      stack.emplace_back(prefix + it->first + ".", it->second.get());
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  return collect(
      recurse, [](const Module& m) -> const auto& { return m.parameters_; });
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  return collect(
      recurse, [](const Module& m) -> const auto& { return m.buffers_; });
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_parameters(recurse)) out.push_back(std::move(entry.second));
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_buffers(recurse)) out.push_back(std::move(entry.second));
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& entry : children_) out.push_back(entry.second);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  std::vector<Module*> stack{this};
  while (!stack.empty()) {
    Module* module = stack.back();
    stack.pop_back();
    out.push_back(module);
    const auto& kids = module->children_;
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.push_back(it->second.get());
  }
  return out;
}

void Module::train(bool on) {
  for (Module* module : modules()) module->training_ = on;
}

bool Module::training_flag() const {
  return detail::traced_flag((name() + " training").c_str(), [this] { return training_; }, alive_);
}

void Module::zero_grad() {
  // Without reading .grad first: a traced zero_grad then does not depend on whether it was set.
  for (Tensor& p : parameters()) p.mutable_grad() = Tensor();
}

namespace {
// Replaces t's data by `convert(t)`'s under the existing TensorImpl, which keeps every handle (the
// module's members, an optimizer's list) and the autograd flags pointing at the converted tensor.
// Pending work that reads t runs first, and the new data is computed now: a pending node holds
// t's TensorImpl, whose storage is about to change under it. Gradients are dropped.
void replace_data(const Tensor& t, const std::function<Tensor(const Tensor&)>& convert) {
  detail::prepare_write(t);
  Tensor converted = convert(t).contiguous();
  detail::materialize({converted}, "Module::to converting a parameter");
  detail::TensorImpl* impl = t.impl();
  const detail::TensorImpl* src = converted.impl();
  impl->storage = src->storage;
  impl->offset = src->offset;
  impl->sizes = src->sizes;
  impl->strides = src->strides;
  impl->dtype = src->dtype;
  // The new storage is its own: a parameter that was a view no longer looks into its base.
  impl->view_base.reset();
  impl->view_tracks_base = false;
  Tensor handle = t;
  if (handle.grad().defined()) handle.mutable_grad() = Tensor();
}
}  // namespace

void Module::to(DType dtype) {
  KILN_CHECK(is_floating_point(dtype), name(), ".to: expected a floating-point dtype, got ", dtype);
  NoGradGuard no_grad;
  auto convert = [&](const Tensor& t) {
    if (!t.defined() || !t.is_floating_point() || t.dtype() == dtype) return;
    replace_data(t, [&](const Tensor& x) { return x.to(dtype); });
  };
  for (const Tensor& p : parameters()) convert(p);
  for (const Tensor& b : buffers()) convert(b);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  auto move = [&](const Tensor& t) {
    if (!t.defined() || t.device() == device) return;
    replace_data(t, [&](const Tensor& x) { return x.to(device); });
  };
  for (const Tensor& p : parameters()) move(p);
  for (const Tensor& b : buffers()) move(b);
}

// ---------------------------------------------------------------------------- layers

Linear::Linear(int64_t in, int64_t out, bool with_bias) : in_features(in), out_features(out) {
  KILN_CHECK(in >= 0 && out >= 0, "Linear: in_features and out_features must be non-negative, got ",
             in, " and ", out);
  const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
  weight = register_parameter("weight", uniform({out, in}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor Linear::forward(const Tensor& input) {
  KILN_CHECK(input.defined() && input.dim() >= 1 && input.size(-1) == in_features,
             "Linear: expected an input whose last dim is in_features=", in_features, ", got ",
             describe(input), " (weight ", describe(weight), ")");
  return linear(input, weight, bias);
}

Embedding::Embedding(int64_t num, int64_t dim) : num_embeddings(num), embedding_dim(dim) {
  KILN_CHECK(num >= 0 && dim >= 0, "Embedding: sizes must be non-negative, got ", num, " x ", dim);
  weight = register_parameter("weight", randn({num, dim}));
}

Tensor Embedding::forward(const Tensor& indices) {
  return embedding(weight, indices);
}

LayerNorm::LayerNorm(Shape shape, double eps_, bool elementwise_affine)
    : normalized_shape(std::move(shape)), eps(eps_) {
  for (int64_t d : normalized_shape)
    KILN_CHECK(d >= 0, "LayerNorm: normalized_shape ", shape_str(normalized_shape),
               " has a negative size");
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layer_norm(input, normalized_shape, weight, bias, eps);
}

Dropout::Dropout(double p_) : p(p_) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability has to be between 0 and 1, but got ", p);
}

Tensor Dropout::forward(const Tensor& input) {
  return dropout(input, p, training_flag());
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, "Sequential: cannot append a null module at position ",
             layers_.size());
  register_module(std::to_string(layers_.size()), module);
  layers_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& layer : layers_) x = layer->forward(x);
  return x;
}

// ---------------------------------------------------------------------------- convolutions

namespace {
// torch's default initialization of a convolution's weight (kaiming_uniform_ with a = sqrt(5))
// and bias: both uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)].
double conv_bound(int64_t fan_in) {
  return fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
}
void check_conv_channels(const char* module, int64_t in, int64_t out, int64_t groups) {
  KILN_CHECK(in > 0 && out > 0, module, ": in_channels and out_channels must be positive, got ", in,
             " and ", out);
  KILN_CHECK(groups > 0 && in % groups == 0 && out % groups == 0, module, ": in_channels (", in,
             ") and out_channels (", out, ") must be divisible by groups (", groups, ")");
}
int64_t prod(const Shape& s) {
  int64_t p = 1;
  for (int64_t v : s) p *= v;
  return p;
}
// A size-1 kernel_size applies to both dims.
Shape pair(const Shape& s) {
  return s.size() == 1 ? Shape{s[0], s[0]} : s;
}
}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Shape kernel, Shape stride_, Shape padding_,
               Shape dilation_, int64_t groups_, bool with_bias)
    : in_channels(in),
      out_channels(out),
      kernel_size(pair(kernel)),
      stride(std::move(stride_)),
      padding(std::move(padding_)),
      dilation(std::move(dilation_)),
      groups(groups_) {
  check_conv_channels("Conv2d", in, out, groups);
  KILN_CHECK(kernel_size.size() == 2 && kernel_size[0] > 0 && kernel_size[1] > 0,
             "Conv2d: expected kernel_size of 1 or 2 positive values, got ", shape_str(kernel));
  const double bound = conv_bound(in / groups * prod(kernel_size));
  weight = register_parameter("weight",
                              uniform({out, in / groups, kernel_size[0], kernel_size[1]}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Conv2d::Conv2d(int64_t in, int64_t out, Shape kernel, Shape stride_, PaddingMode mode,
               Shape dilation_, int64_t groups_, bool with_bias)
    : Conv2d(in, out, std::move(kernel), std::move(stride_), Shape{0}, std::move(dilation_),
             groups_, with_bias) {
  KILN_CHECK(mode.name == "same" || mode.name == "valid",
             "Conv2d: padding must be \"same\" or \"valid\", got \"", mode.name, "\"");
  padding_mode = mode.name;
}

Tensor Conv2d::forward(const Tensor& input) {
  if (!padding_mode.empty())
    return conv2d(input, weight, bias, stride, PaddingMode(padding_mode), dilation, groups);
  return conv2d(input, weight, bias, stride, padding, dilation, groups);
}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
               int64_t dilation_, int64_t groups_, bool with_bias)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_),
      dilation(dilation_),
      groups(groups_) {
  check_conv_channels("Conv1d", in, out, groups);
  KILN_CHECK(kernel > 0, "Conv1d: expected a positive kernel_size, got ", kernel);
  const double bound = conv_bound(in / groups * kernel);
  weight = register_parameter("weight", uniform({out, in / groups, kernel}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, PaddingMode mode,
               int64_t dilation_, int64_t groups_, bool with_bias)
    : Conv1d(in, out, kernel, stride_, 0, dilation_, groups_, with_bias) {
  KILN_CHECK(mode.name == "same" || mode.name == "valid",
             "Conv1d: padding must be \"same\" or \"valid\", got \"", mode.name, "\"");
  padding_mode = mode.name;
}

Tensor Conv1d::forward(const Tensor& input) {
  if (!padding_mode.empty())
    return conv1d(input, weight, bias, {stride}, PaddingMode(padding_mode), {dilation}, groups);
  return conv1d(input, weight, bias, {stride}, {padding}, {dilation}, groups);
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Shape kernel, Shape stride_,
                                 Shape padding_, Shape output_padding_, int64_t groups_,
                                 bool with_bias, Shape dilation_)
    : in_channels(in),
      out_channels(out),
      kernel_size(pair(kernel)),
      stride(std::move(stride_)),
      padding(std::move(padding_)),
      output_padding(std::move(output_padding_)),
      groups(groups_),
      dilation(std::move(dilation_)) {
  check_conv_channels("ConvTranspose2d", in, out, groups);
  KILN_CHECK(kernel_size.size() == 2 && kernel_size[0] > 0 && kernel_size[1] > 0,
             "ConvTranspose2d: expected kernel_size of 1 or 2 positive values, got ",
             shape_str(kernel));
  // torch computes fan_in from the weight's second dim: out / groups.
  const double bound = conv_bound(out / groups * prod(kernel_size));
  weight = register_parameter("weight",
                              uniform({in, out / groups, kernel_size[0], kernel_size[1]}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor ConvTranspose2d::forward(const Tensor& input) {
  return conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation);
}

// ---------------------------------------------------------------------------- normalization

BatchNorm::BatchNorm(int64_t features, double eps_, double momentum_, bool affine_,
                     bool track_running_stats_)
    : num_features(features),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track_running_stats_) {
  KILN_CHECK(features > 0, "BatchNorm: num_features must be positive, got ", features);
  if (affine) {
    weight = register_parameter("weight", ones({features}));
    bias = register_parameter("bias", zeros({features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({features}));
    running_var = register_buffer("running_var", ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, TensorOptions(kInt64)));
  }
}

Tensor BatchNorm::forward(const Tensor& input) {
  check_rank(input);
  KILN_CHECK(input.size(1) == num_features, name(), ": expected input with ", num_features,
             " channels (num_features), got ", describe(input));
  if (is_training() && track_running_stats) num_batches_tracked.add_(1);
  // Without running statistics, evaluation normalizes with the batch's, as torch.
  return batch_norm(input, running_mean, running_var, weight, bias,
                    is_training() || !track_running_stats, momentum, eps);
}

void BatchNorm1d::check_rank(const Tensor& input) const {
  KILN_CHECK(input.defined() && (input.dim() == 2 || input.dim() == 3), name(),
             ": expected a 2-D [N, C] or 3-D [N, C, L] input, got ", describe(input));
}

void BatchNorm2d::check_rank(const Tensor& input) const {
  KILN_CHECK(input.defined() && input.dim() == 4, name(),
             ": expected a 4-D [N, C, H, W] input, got ", describe(input));
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine_)
    : num_groups(groups), num_channels(channels), eps(eps_), affine(affine_) {
  KILN_CHECK(groups > 0 && channels % groups == 0, "GroupNorm: num_channels (", channels,
             ") must be divisible by num_groups (", groups, ")");
  if (affine) {
    weight = register_parameter("weight", ones({channels}));
    bias = register_parameter("bias", zeros({channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& input) {
  return group_norm(input, num_groups, weight, bias, eps);
}

// ---------------------------------------------------------------------------- LSTM

LSTMCell::LSTMCell(int64_t input, int64_t hidden) : input_size(input), hidden_size(hidden) {
  KILN_CHECK(input >= 0 && hidden > 0, "LSTMCell: expected input_size >= 0 and hidden_size > 0, ",
             "got ", input, " and ", hidden);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  weight = register_parameter("weight", uniform({4 * hidden, input + hidden}, bound));
  bias = register_parameter("bias", uniform({4 * hidden}, bound));
}

LSTMState LSTMCell::forward(const Tensor& input, const std::optional<LSTMState>& state) {
  KILN_CHECK(input.defined() && input.dim() == 2 && input.size(1) == input_size,
             "LSTMCell: expected input [batch, ", input_size, "], got ", describe(input));
  const int64_t batch = input.size(0);
  Tensor h, c;
  if (state) {
    h = state->h;
    c = state->c;
    auto check = [&](const Tensor& t, const char* what) {
      KILN_CHECK(t.defined() && t.sizes() == Shape({batch, hidden_size}), "LSTMCell: expected ",
                 what, " [", batch, ", ", hidden_size, "] for input ", describe(input), ", got ",
                 describe(t));
    };
    check(h, "h");
    check(c, "c");
  } else {
    h = zeros({batch, hidden_size}, TensorOptions(input.dtype()).device(input.device()));
    c = zeros({batch, hidden_size}, TensorOptions(input.dtype()).device(input.device()));
  }
  // linear(x, W, b) is addmm(b, x, W^T) as one GEMM, but its backward writes the weight's
  // gradient in weight's own [4H, in + H] layout; addmm's would be W^T's and need a transposing
  // copy of the whole weight-sized gradient.
  Tensor gates = linear(cat({input, h}, 1), weight, bias);
  std::vector<Tensor> igfo = gates.chunk(4, 1);
  Tensor c_next = sigmoid(igfo[1]) * c + sigmoid(igfo[0]) * tanh(igfo[2]);
  Tensor h_next = sigmoid(igfo[3]) * tanh(c_next);
  return {h_next, c_next};
}

LSTM::LSTM(int64_t input, int64_t hidden, int64_t layers, double dropout_)
    : input_size(input), hidden_size(hidden), num_layers(layers), dropout(dropout_) {
  KILN_CHECK(layers >= 1, "LSTM: num_layers must be at least 1, got ", layers);
  KILN_CHECK(dropout >= 0.0 && dropout <= 1.0, "LSTM: dropout has to be between 0 and 1, got ",
             dropout);
  for (int64_t l = 0; l < layers; ++l)
    cells.push_back(register_module("l" + std::to_string(l),
                                    std::make_shared<LSTMCell>(l == 0 ? input : hidden, hidden)));
}

LSTMOutput LSTM::forward(const Tensor& input, const std::optional<LSTMState>& state) {
  KILN_CHECK(input.defined() && input.dim() == 3 && input.size(2) == input_size,
             "LSTM: expected input [time, batch, ", input_size, "], got ", describe(input));
  const int64_t steps = input.size(0), batch = input.size(1);
  const Shape state_shape{num_layers, batch, hidden_size};
  if (state) {
    KILN_CHECK(state->h.defined() && state->c.defined() && state->h.sizes() == state_shape &&
                   state->c.sizes() == state_shape,
               "LSTM: expected h and c of shape ", shape_str(state_shape), " for input ",
               describe(input), ", got ", describe(state->h), " and ", describe(state->c));
  }
  std::vector<Tensor> layer_input = input.unbind(0);
  std::vector<Tensor> h_n, c_n;
  Tensor output;
  for (int64_t l = 0; l < num_layers; ++l) {
    std::optional<LSTMState> s;
    if (state) s = LSTMState{state->h.select(0, l), state->c.select(0, l)};
    std::vector<Tensor> hs;
    hs.reserve(steps);
    for (int64_t t = 0; t < steps; ++t) {
      LSTMState next = cells[l]->forward(layer_input[t], s);
      hs.push_back(next.h);
      s = std::move(next);
    }
    if (s) {
      h_n.push_back(s->h);
      c_n.push_back(s->c);
    } else {  // an empty sequence without an initial state
      h_n.push_back(zeros({batch, hidden_size}, input.dtype()));
      c_n.push_back(zeros({batch, hidden_size}, input.dtype()));
    }
    output = steps > 0 ? stack(hs, 0) : zeros({0, batch, hidden_size}, input.dtype());
    if (l + 1 < num_layers) {
      // One dropout over the whole layer output rather than one per time step.
      if (dropout > 0.0 && training_flag()) output = kiln::dropout(output, dropout, true);
      layer_input = output.unbind(0);
    }
  }
  return {output, {stack(h_n, 0), stack(c_n, 0)}};
}

// ---------------------------------------------------------------------------- utils

namespace utils {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type) {
  KILN_CHECK(norm_type > 0.0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  NoGradGuard no_grad;
  const bool inf_norm = std::isinf(norm_type);
  Tensor total = zeros({}, kFloat64);
  for (const Tensor& p : parameters) {
    const Tensor& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    Tensor a = abs(g.to(kFloat64));
    if (inf_norm)
      total = maximum(total, a.max());
    else if (norm_type == 2.0)
      total = total + (a * a).sum();
    else
      total = total + pow(a, norm_type).sum();
  }
  if (!inf_norm) total = norm_type == 2.0 ? sqrt(total) : pow(total, 1.0 / norm_type);
  // As torch: the epsilon keeps the ratio finite for a zero norm and makes the clipped norm land
  // just under max_norm. A coefficient clamped to 1 instead of a branch on the norm's value: a
  // product by exactly 1 leaves the gradients as they were.
  Tensor coef = clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (Tensor p : parameters)
    if (p.grad().defined()) p.mutable_grad().mul_(coef);
  return total;
}

}  // namespace utils
}  // namespace kiln::nn
