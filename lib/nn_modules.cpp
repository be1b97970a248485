// kiln::nn: the Module tree (registration, iterative traversal, modes) and the standard layers.
#include <algorithm>
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

Module::Module(Module&& other) noexcept
    : parameters_(std::move(other.parameters_)),
      buffers_(std::move(other.buffers_)),
      children_(std::move(other.children_)),
      training_(other.training_) {}

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

std::shared_ptr<Module> Module::replace_module(const std::string& name,
                                               std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, this->name(), ": replacement for submodule '", name, "' is null");
  for (auto& entry : children_) {
    if (entry.first != name) continue;
    entry.second = module;
    return module;
  }
  KILN_FAIL(this->name(), ": no submodule named '", name, "' to replace");
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

Embedding::Embedding(int64_t num, int64_t dim) : Embedding(EmbeddingOptions(num, dim)) {}

Embedding::Embedding(const EmbeddingOptions& options)
    : num_embeddings(options.num_embeddings()), embedding_dim(options.embedding_dim()) {
  const int64_t num = num_embeddings, dim = embedding_dim;
  KILN_CHECK(num >= 0 && dim >= 0, "Embedding: sizes must be non-negative, got ", num, " x ", dim);
  Tensor w = randn({num, dim});
  if (const auto& pad = options.padding_idx()) {
    KILN_CHECK(*pad >= -num && *pad < num, "Embedding: padding_idx must be within [", -num, ", ",
               num, ") for num_embeddings=", num, ", got ", *pad);
    padding_idx = *pad < 0 ? *pad + num : *pad;
    w.select(0, *padding_idx).zero_();
  }
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  Tensor out = embedding(weight, indices);
  if (!padding_idx || !weight.requires_grad() || !is_grad_enabled()) return out;
  // Lookups of the padding row take their value from a detached weight: the same values, but
  // their gradient stops there, so the row's gradient is zero (one fusible select per element
  // instead of a special embedding backward).
  Tensor is_pad = (indices == *padding_idx).unsqueeze(-1);
  return where(is_pad, out.detach(), out);
}

EmbeddingBag::EmbeddingBag(int64_t num, int64_t dim)
    : EmbeddingBag(EmbeddingBagOptions(num, dim)) {}

EmbeddingBag::EmbeddingBag(const EmbeddingBagOptions& options_) : options(options_) {
  const int64_t num = options.num_embeddings(), dim = options.embedding_dim();
  KILN_CHECK(num >= 0 && dim >= 0, "EmbeddingBag: sizes must be non-negative, got ", num, " x ",
             dim);
  const std::string& mode = options.mode();
  KILN_CHECK(mode == "sum" || mode == "mean" || mode == "max",
             "EmbeddingBag: mode must be \"sum\", \"mean\" or \"max\", got \"", mode, "\"");
  Tensor w = randn({num, dim});
  if (const auto& pad = options.padding_idx()) {
    KILN_CHECK(*pad >= -num && *pad < num, "EmbeddingBag: padding_idx must be within [", -num, ", ",
               num, ") for num_embeddings=", num, ", got ", *pad);
    const int64_t row = *pad < 0 ? *pad + num : *pad;
    options.padding_idx(row);
    w.select(0, row).zero_();
  }
  weight = register_parameter("weight", w);
}

Tensor EmbeddingBag::forward(const Tensor& input, const Tensor& offsets,
                             const Tensor& per_sample_weights) {
  return embedding_bag(input, weight, offsets, options.mode(), per_sample_weights,
                       options.include_last_offset(), options.padding_idx());
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

PReLU::PReLU(int64_t num_parameters, double init) {
  KILN_CHECK(num_parameters >= 1, "PReLU: num_parameters must be at least 1, got ", num_parameters);
  weight = register_parameter("weight", full({num_parameters}, init));
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

// ---------------------------------------------------------------------------- containers

void ModuleList::push_back(std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, "ModuleList: cannot append a null module at position ",
             modules_.size());
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

void ModuleList::extend(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t index) const {
  KILN_CHECK(index < modules_.size(), "ModuleList: index ", index, " is out of range for ",
             modules_.size(), " modules");
  return modules_[index];
}

void ModuleList::fail_cast(const std::string& key, const std::string& actual) const {
  KILN_FAIL("ModuleList: module ", key, " is a ", actual, ", not the type asked for");
}

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  KILN_CHECK(module != nullptr, "ModuleDict: module for key '", key, "' is null");
  for (auto& entry : items_) {
    if (entry.first != key) continue;
    replace_module(key, module);
    entry.second = std::move(module);
    return;
  }
  register_module(key, module);
  items_.emplace_back(key, std::move(module));
}

void ModuleDict::update(const Items& modules) {
  for (const auto& [key, module] : modules) insert(key, module);
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& entry : items_)
    if (entry.first == key) return true;
  return false;
}

const std::shared_ptr<Module>& ModuleDict::operator[](const std::string& key) const {
  for (const auto& entry : items_)
    if (entry.first == key) return entry.second;
  KILN_FAIL("ModuleDict: no module under key '", key, "' (", items_.size(), " keys)");
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& entry : items_) out.push_back(entry.first);
  return out;
}

std::vector<std::shared_ptr<Module>> ModuleDict::values() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& entry : items_) out.push_back(entry.second);
  return out;
}

void ModuleDict::fail_cast(const std::string& key, const std::string& actual) const {
  KILN_FAIL("ModuleDict: module '", key, "' is a ", actual, ", not the type asked for");
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

// A convolution module's padding mode by name: "same" or "valid".
std::string padding_mode_named(const char* module, const PaddingMode& mode) {
  KILN_CHECK(mode.name == "same" || mode.name == "valid", module,
             ": padding must be \"same\" or \"valid\", got \"", mode.name, "\"");
  return mode.name;
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
  padding_mode = padding_mode_named("Conv2d", mode);
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
  padding_mode = padding_mode_named("Conv1d", mode);
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

Conv3d::Conv3d(int64_t in, int64_t out, Shape kernel, Shape stride_, Shape padding_,
               Shape dilation_, int64_t groups_, bool with_bias)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel.size() == 1 ? Shape(3, kernel[0]) : kernel),
      stride(std::move(stride_)),
      padding(std::move(padding_)),
      dilation(std::move(dilation_)),
      groups(groups_) {
  check_conv_channels("Conv3d", in, out, groups);
  KILN_CHECK(kernel_size.size() == 3 && std::all_of(kernel_size.begin(), kernel_size.end(),
                                                    [](int64_t k) { return k > 0; }),
             "Conv3d: expected kernel_size of 1 or 3 positive values, got ", shape_str(kernel));
  const double bound = conv_bound(in / groups * prod(kernel_size));
  Shape shape{out, in / groups};
  shape.insert(shape.end(), kernel_size.begin(), kernel_size.end());
  weight = register_parameter("weight", uniform(shape, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Conv3d::Conv3d(int64_t in, int64_t out, Shape kernel, Shape stride_, PaddingMode mode,
               Shape dilation_, int64_t groups_, bool with_bias)
    : Conv3d(in, out, std::move(kernel), std::move(stride_), Shape{0}, std::move(dilation_),
             groups_, with_bias) {
  padding_mode = padding_mode_named("Conv3d", mode);
}

Tensor Conv3d::forward(const Tensor& input) {
  if (!padding_mode.empty())
    return conv3d(input, weight, bias, stride, PaddingMode(padding_mode), dilation, groups);
  return conv3d(input, weight, bias, stride, padding, dilation, groups);
}

ConvTranspose1d::ConvTranspose1d(int64_t in, int64_t out, int64_t kernel, int64_t stride_,
                                 int64_t padding_, int64_t output_padding_, int64_t groups_,
                                 bool with_bias, int64_t dilation_)
    : in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_),
      output_padding(output_padding_),
      groups(groups_),
      dilation(dilation_) {
  check_conv_channels("ConvTranspose1d", in, out, groups);
  KILN_CHECK(kernel > 0, "ConvTranspose1d: expected a positive kernel_size, got ", kernel);
  const double bound = conv_bound(out / groups * kernel);
  weight = register_parameter("weight", uniform({in, out / groups, kernel}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor ConvTranspose1d::forward(const Tensor& input) {
  return conv_transpose1d(input, weight, bias, {stride}, {padding}, {output_padding}, groups,
                          {dilation});
}

// ---------------------------------------------------------------------------- normalization

NormBase::NormBase(const char* module, int64_t features, double eps_, double momentum_,
                   bool affine_, bool track_running_stats_)
    : num_features(features),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track_running_stats_) {
  KILN_CHECK(features > 0, module, ": num_features must be positive, got ", features);
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

void BatchNorm3d::check_rank(const Tensor& input) const {
  KILN_CHECK(input.defined() && input.dim() == 5, name(),
             ": expected a 5-D [N, C, D, H, W] input, got ", describe(input));
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

Tensor InstanceNorm::forward(const Tensor& input) {
  const int64_t batched = spatial_dims_ + 2;
  KILN_CHECK(input.defined() && (input.dim() == batched || input.dim() == batched - 1), name(),
             ": expected a ", batched - 1, "-D (unbatched) or ", batched,
             "-D (batched) input, got ", describe(input));
  if (input.dim() == batched - 1) return forward(input.unsqueeze(0)).squeeze(0);
  // torch only warns of a channel count other than num_features when no parameter needs it.
  KILN_CHECK(input.size(1) == num_features || (!affine && !track_running_stats), name(),
             ": expected input with ", num_features, " channels (num_features), got ",
             describe(input));
  if (is_training() && track_running_stats) num_batches_tracked.add_(1);
  return instance_norm(input, running_mean, running_var, weight, bias,
                       is_training() || !track_running_stats, momentum, eps);
}

// ---------------------------------------------------------------------------- recurrent layers

namespace {

// The options every recurrent stack shares, checked once.
void check_recurrent_options(const char* module, int64_t input, int64_t hidden, int64_t layers,
                             double dropout) {
  KILN_CHECK(input >= 0 && hidden > 0, module,
             ": expected input_size >= 0 and hidden_size > 0, got ", input, " and ", hidden);
  KILN_CHECK(layers >= 1, module, ": num_layers must be at least 1, got ", layers);
  KILN_CHECK(dropout >= 0.0 && dropout <= 1.0, module, ": dropout has to be between 0 and 1, got ",
             dropout);
}

// A sequence input, made time-major.
Tensor time_major(const char* module, const Tensor& input, int64_t input_size, bool batch_first) {
  KILN_CHECK(input.defined() && input.dim() == 3 && input.size(2) == input_size, module,
             ": expected input ", batch_first ? "[batch, time, " : "[time, batch, ", input_size,
             "], got ", describe(input));
  return batch_first ? input.transpose(0, 1) : input;
}

// An initial state tensor [layers * directions, batch, hidden], or zeros when it is undefined.
Tensor initial_state(const char* module, const char* what, const Tensor& state, const Shape& shape,
                     const Tensor& input) {
  if (!state.defined()) return zeros(shape, TensorOptions(input.dtype()).device(input.device()));
  KILN_CHECK(state.sizes() == shape, module, ": expected ", what, " of shape ", shape_str(shape),
             " for input ", describe(input), ", got ", describe(state));
  return state;
}

struct RecurrentRun {
  Tensor output;              // [time, batch, directions * hidden]
  std::vector<Tensor> final;  // per state member: [layers * directions, batch, hidden]
};

// Runs layers x directions cells over a time-major input, as torch's RNN modules do: `step(cell,
// x_t, state)` returns the state after one step of cells[cell] (state[0] is the output h). The
// reverse direction reads the sequence backwards and writes its outputs at the same time steps;
// the next layer reads both directions side by side, after dropout when `dropout` > 0.
template <typename Step>
RecurrentRun run_recurrent(const Tensor& input, int64_t layers, int64_t directions, int64_t hidden,
                           double dropout, const std::vector<Tensor>& initial, Step step) {
  const int64_t steps = input.size(0), batch = input.size(1);
  RecurrentRun run;
  std::vector<std::vector<Tensor>> finals(initial.size());
  Tensor layer_input = input;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<Tensor> xs = layer_input.unbind(0), direction_outputs;
    for (int64_t d = 0; d < directions; ++d) {
      const int64_t cell = l * directions + d;
      std::vector<Tensor> state;
      for (const Tensor& s : initial) state.push_back(s.select(0, cell));
      std::vector<Tensor> hs(steps);
      for (int64_t i = 0; i < steps; ++i) {
        const int64_t t = d == 0 ? i : steps - 1 - i;
        state = step(cell, xs[t], state);
        hs[t] = state[0];
      }
      for (size_t k = 0; k < state.size(); ++k) finals[k].push_back(state[k]);
      direction_outputs.push_back(
          steps > 0
              ? stack(hs, 0)
              : zeros({0, batch, hidden}, TensorOptions(input.dtype()).device(input.device())));
    }
    run.output = directions == 1 ? direction_outputs[0] : cat(direction_outputs, 2);
    // One dropout over the whole layer output rather than one per time step.
    if (l + 1 < layers && dropout > 0.0)
      layer_input = kiln::dropout(run.output, dropout, true);
    else
      layer_input = run.output;
  }
  for (const std::vector<Tensor>& last_states : finals) run.final.push_back(stack(last_states, 0));
  return run;
}

}  // namespace

LSTMCell::LSTMCell(int64_t input, int64_t hidden, bool with_bias)
    : input_size(input), hidden_size(hidden) {
  KILN_CHECK(input >= 0 && hidden > 0, "LSTMCell: expected input_size >= 0 and hidden_size > 0, ",
             "got ", input, " and ", hidden);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  weight = register_parameter("weight", uniform({4 * hidden, input + hidden}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({4 * hidden}, bound));
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
    : LSTM(LSTMOptions(input, hidden).num_layers(layers).dropout(dropout_)) {}

LSTM::LSTM(const LSTMOptions& options)
    : input_size(options.input_size()),
      hidden_size(options.hidden_size()),
      num_layers(options.num_layers()),
      dropout(options.dropout()),
      options_(options) {
  check_recurrent_options("LSTM", input_size, hidden_size, num_layers, dropout);
  const int64_t directions = options.bidirectional() ? 2 : 1;
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int64_t d = 0; d < directions; ++d) {
      const int64_t in = l == 0 ? input_size : directions * hidden_size;
      cells.push_back(register_module("l" + std::to_string(l) + (d ? "_reverse" : ""),
                                      std::make_shared<LSTMCell>(in, hidden_size, options.bias())));
    }
  }
}

LSTMOutput LSTM::forward(const Tensor& input, const std::optional<LSTMState>& state) {
  const bool batch_first = options_.batch_first();
  const Tensor x = time_major("LSTM", input, input_size, batch_first);
  const int64_t directions = options_.bidirectional() ? 2 : 1;
  const Shape state_shape{num_layers * directions, x.size(1), hidden_size};
  if (state) {
    KILN_CHECK(state->h.defined() && state->c.defined(), "LSTM: h and c must both be defined, got ",
               describe(state->h), " and ", describe(state->c));
  }
  std::vector<Tensor> initial{
      initial_state("LSTM", "h", state ? state->h : Tensor(), state_shape, input),
      initial_state("LSTM", "c", state ? state->c : Tensor(), state_shape, input)};
  const bool drop = dropout > 0.0 && num_layers > 1 && training_flag();
  RecurrentRun run =
      run_recurrent(x, num_layers, directions, hidden_size, drop ? dropout : 0.0, initial,
                    [&](int64_t cell, const Tensor& xt, const std::vector<Tensor>& s) {
                      LSTMState next = cells[cell]->forward(xt, LSTMState{s[0], s[1]});
                      return std::vector<Tensor>{next.h, next.c};
                    });
  Tensor output = batch_first ? run.output.transpose(0, 1) : run.output;
  return {output, {run.final[0], run.final[1]}};
}

GRUCell::GRUCell(int64_t input, int64_t hidden, bool with_bias)
    : GRUCell(GRUCellOptions(input, hidden).bias(with_bias)) {}

GRUCell::GRUCell(const GRUCellOptions& options)
    : input_size(options.input_size()), hidden_size(options.hidden_size()) {
  const int64_t input = input_size, hidden = hidden_size;
  KILN_CHECK(input >= 0 && hidden > 0, "GRUCell: expected input_size >= 0 and hidden_size > 0, ",
             "got ", input, " and ", hidden);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  weight_ih = register_parameter("weight_ih", uniform({3 * hidden, input}, bound));
  weight_hh = register_parameter("weight_hh", uniform({3 * hidden, hidden}, bound));
  if (options.bias()) {
    bias_ih = register_parameter("bias_ih", uniform({3 * hidden}, bound));
    bias_hh = register_parameter("bias_hh", uniform({3 * hidden}, bound));
  }
}

Tensor GRUCell::forward(const Tensor& input, const Tensor& hx) {
  KILN_CHECK(input.defined() && input.dim() == 2 && input.size(1) == input_size,
             "GRUCell: expected input [batch, ", input_size, "], got ", describe(input));
  const int64_t batch = input.size(0);
  Tensor h = hx;
  if (!h.defined()) {
    h = zeros({batch, hidden_size}, TensorOptions(input.dtype()).device(input.device()));
  } else {
    KILN_CHECK(h.sizes() == Shape({batch, hidden_size}), "GRUCell: expected hx [", batch, ", ",
               hidden_size, "] for input ", describe(input), ", got ", describe(h));
  }
  std::vector<Tensor> gi = linear(input, weight_ih, bias_ih).chunk(3, 1);
  std::vector<Tensor> gh = linear(h, weight_hh, bias_hh).chunk(3, 1);
  Tensor r = sigmoid(gi[0] + gh[0]);
  Tensor z = sigmoid(gi[1] + gh[1]);
  Tensor n = tanh(gi[2] + r * gh[2]);
  // (1 - z) * n + z * h, with one multiply fewer.
  return n + z * (h - n);
}

GRU::GRU(const GRUOptions& options) : options_(options) {
  check_recurrent_options("GRU", options.input_size(), options.hidden_size(), options.num_layers(),
                          options.dropout());
  const int64_t directions = options.bidirectional() ? 2 : 1, hidden = options.hidden_size();
  for (int64_t l = 0; l < options.num_layers(); ++l) {
    for (int64_t d = 0; d < directions; ++d) {
      const int64_t in = l == 0 ? options.input_size() : directions * hidden;
      auto cell = std::make_shared<GRUCell>(in, hidden, options.bias());
      const std::string suffix = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      register_parameter("weight_ih" + suffix, cell->weight_ih);
      register_parameter("weight_hh" + suffix, cell->weight_hh);
      if (options.bias()) {
        register_parameter("bias_ih" + suffix, cell->bias_ih);
        register_parameter("bias_hh" + suffix, cell->bias_hh);
      }
      cells.push_back(std::move(cell));
    }
  }
}

std::tuple<Tensor, Tensor> GRU::forward(const Tensor& input, const Tensor& hx) {
  const GRUOptions& o = options_;
  const Tensor x = time_major("GRU", input, o.input_size(), o.batch_first());
  const int64_t directions = o.bidirectional() ? 2 : 1;
  const Shape state_shape{o.num_layers() * directions, x.size(1), o.hidden_size()};
  std::vector<Tensor> initial{initial_state("GRU", "hx", hx, state_shape, input)};
  const bool drop = o.dropout() > 0.0 && o.num_layers() > 1 && training_flag();
  RecurrentRun run =
      run_recurrent(x, o.num_layers(), directions, o.hidden_size(), drop ? o.dropout() : 0.0,
                    initial, [&](int64_t cell, const Tensor& xt, const std::vector<Tensor>& s) {
                      return std::vector<Tensor>{cells[cell]->forward(xt, s[0])};
                    });
  Tensor output = o.batch_first() ? run.output.transpose(0, 1) : run.output;
  return {output, run.final[0]};
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
