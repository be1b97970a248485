// Activations of torch.nn.functional composed of kiln's elementwise ops (kiln/nn_functional.h).
//
// Each is a few elementwise ops, so the fuser makes it one kernel with its neighbours and autograd
// differentiates it (twice) through them. Piecewise ones pick their branch with where; a branch
// that would overflow where it is not taken (expm1 of a large x) reads a clamped operand, so that
// its zero gradient there is not 0 * inf. The branch conditions follow torch's kernels, so the
// gradient at a kink (x = 0, x = +-3) is the one torch's backward gives.
#include <cmath>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

namespace {

void check_floating(const Tensor& x, const char* op) {
  detail::check_defined(x, op);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ",
             detail::describe(x));
}

// torch's elu with its scale arguments: x * scale for x > 0, expm1(x) * alpha * scale otherwise
// (NaN takes the second branch, as in torch's kernel).
Tensor elu_scaled(const Tensor& x, double alpha, double scale, const char* op) {
  check_floating(x, op);
  const Tensor positive = gt(x, 0);
  const Tensor negative_part = expm1(where(logical_not(positive), x, 0.0)) * (alpha * scale);
  return where(positive, scale == 1.0 ? x : x * scale, negative_part);
}

// min(max(x + 3, 0), 6), the clamp of hardswish and hardsigmoid. `inclusive` puts x = -3 and
// x = 3 in the constant branches (zero gradient there, as torch's hardsigmoid); otherwise in the
// linear one (as torch's hardswish).
Tensor relu6_of_x_plus_3(const Tensor& x, bool inclusive) {
  const Tensor low = inclusive ? le(x, -3) : lt(x, -3);
  const Tensor high = inclusive ? ge(x, 3) : gt(x, 3);
  return where(logical_not(low), where(logical_not(high), x + 3, 6.0), 0.0);
}

}  // namespace

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  check_floating(x, "leaky_relu");
  return where(gt(x, 0), x, x * negative_slope);
}

Tensor elu(const Tensor& x, double alpha) {
  return elu_scaled(x, alpha, 1.0, "elu");
}

Tensor selu(const Tensor& x) {
  // The constants of torch's selu (Klambauer et al., 2017).
  return elu_scaled(x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946,
                    "selu");
}

Tensor hardswish(const Tensor& x) {
  check_floating(x, "hardswish");
  return x * relu6_of_x_plus_3(x, false) / 6;
}

Tensor hardsigmoid(const Tensor& x) {
  check_floating(x, "hardsigmoid");
  return relu6_of_x_plus_3(x, true) / 6;
}

Tensor mish(const Tensor& x) {
  check_floating(x, "mish");
  return x * tanh(softplus(x));
}

Tensor log_sigmoid(const Tensor& x) {
  check_floating(x, "log_sigmoid");
  // min(x, 0) - log1p(exp(-|x|)), with x = 0 in the branch whose gradient is sigmoid(-x) = 1/2.
  const Tensor negative = lt(x, 0);
  return where(negative, x, 0.0) - log1p(exp(where(negative, x, -x)));
}

Tensor softsign(const Tensor& x) {
  check_floating(x, "softsign");
  return x / (abs(x) + 1);
}

}  // namespace kiln
