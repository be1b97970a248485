// kiln::nn::init: torch.nn.init's initializers, each overwriting a tensor in place outside
// autograd.
#include <cmath>
#include <functional>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/nn.h"
#include "lib/tensor_impl.h"

namespace kiln::nn::init {

using detail::describe;

namespace {

// Writes `values` (computed here in the tensor's dtype and device) into `tensor` without autograd
// history, so a parameter stays a leaf that requires grad.
Tensor overwrite(Tensor tensor, const char* op, const std::function<Tensor(TensorOptions)>& make) {
  KILN_CHECK(tensor.defined(), "nn::init::", op, ": the tensor is undefined");
  NoGradGuard no_grad;
  tensor.copy_(make(TensorOptions(tensor.dtype()).device(tensor.device())));
  return tensor;
}

double fan(const Tensor& tensor, FanMode mode) {
  auto [fan_in, fan_out] = _calculate_fan_in_and_fan_out(tensor);
  return static_cast<double>(mode == FanMode::FanIn ? fan_in : fan_out);
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU:
      return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::SELU:
      return 3.0 / 4.0;
    default:  // linear, the convolutions and sigmoid
      return 1.0;
  }
}

std::tuple<int64_t, int64_t> _calculate_fan_in_and_fan_out(const Tensor& tensor) {
  KILN_CHECK(tensor.defined() && tensor.dim() >= 2,
             "nn::init: fan in and fan out can not be computed for a tensor with fewer than 2 "
             "dimensions, got ",
             describe(tensor));
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

Tensor uniform_(Tensor tensor, double low, double high) {
  return overwrite(tensor, "uniform_",
                   [&](TensorOptions o) { return rand(tensor.sizes(), o) * (high - low) + low; });
}

Tensor normal_(Tensor tensor, double mean, double std) {
  return overwrite(tensor, "normal_",
                   [&](TensorOptions o) { return randn(tensor.sizes(), o) * std + mean; });
}

Tensor constant_(Tensor tensor, const Scalar& value) {
  return overwrite(tensor, "constant_",
                   [&](TensorOptions o) { return full(tensor.sizes(), value, o); });
}

Tensor ones_(Tensor tensor) {
  return constant_(std::move(tensor), 1);
}

Tensor zeros_(Tensor tensor) {
  return constant_(std::move(tensor), 0);
}

Tensor eye_(Tensor tensor) {
  KILN_CHECK(tensor.defined() && tensor.dim() == 2,
             "nn::init::eye_: only tensors with 2 dimensions are supported, got ",
             describe(tensor));
  return overwrite(tensor, "eye_",
                   [&](TensorOptions o) { return eye(tensor.size(0), tensor.size(1), o); });
}

Tensor trunc_normal_(Tensor tensor, double mean, double std, double a, double b) {
  KILN_CHECK(a < b && std > 0, "nn::init::trunc_normal_: expected a < b and std > 0, got a = ", a,
             ", b = ", b, ", std = ", std, " for ", describe(tensor));
  auto cdf = [&](double v) { return 0.5 * std::erfc((mean - v) / std * M_SQRT1_2); };
  const double low = 2 * cdf(a) - 1, high = 2 * cdf(b) - 1;
  return overwrite(tensor, "trunc_normal_", [&](TensorOptions options) {
    const Tensor u = rand(tensor.sizes(), options) * (high - low) + low;
    return clamp(erfinv(u) * (std * M_SQRT2) + mean, a, b);
  });
}

Tensor xavier_uniform_(Tensor tensor, double gain) {
  auto [fan_in, fan_out] = _calculate_fan_in_and_fan_out(tensor);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(std::move(tensor), -bound, bound);
}

Tensor xavier_normal_(Tensor tensor, double gain) {
  auto [fan_in, fan_out] = _calculate_fan_in_and_fan_out(tensor);
  const double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return normal_(std::move(tensor), 0.0, std);
}

Tensor kaiming_uniform_(Tensor tensor, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (tensor.defined() && tensor.numel() == 0) return tensor;  // torch warns and leaves it
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan(tensor, mode));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(std::move(tensor), -bound, bound);
}

Tensor kaiming_normal_(Tensor tensor, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (tensor.defined() && tensor.numel() == 0) return tensor;
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(fan(tensor, mode));
  return normal_(std::move(tensor), 0.0, std);
}

Tensor orthogonal_(Tensor tensor, double gain) {
  KILN_CHECK(tensor.defined() && tensor.dim() >= 2,
             "nn::init::orthogonal_: only tensors with 2 or more dimensions are supported, got ",
             describe(tensor));
  if (tensor.numel() == 0) return tensor;
  const int64_t rows = tensor.size(0), cols = tensor.numel() / rows;
  // torch's: Q of the QR of a standard normal draw (its transpose when wide), each column's sign
  // that of R's diagonal so that the distribution is uniform over orthogonal matrices.
  const Tensor draw = randn({rows, cols}, kFloat64);
  const bool wide = rows < cols;
  const auto [q, r] = linalg::qr(wide ? draw.t() : draw);
  Tensor m = q * sign(r.diagonal(0, -2, -1));
  if (wide) m = m.t();
  return overwrite(tensor, "orthogonal_", [&](TensorOptions) {
    return (m * gain).reshape(tensor.sizes()).to(tensor.dtype()).to(tensor.device());
  });
}

}  // namespace kiln::nn::init
