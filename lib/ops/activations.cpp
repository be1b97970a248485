// Activations of torch.nn.functional composed of kiln's elementwise ops (kiln/nn_functional.h).
//
// Each is a few elementwise ops, so the fuser makes it one kernel with its neighbours. Piecewise
// ones pick their branch with where, on the conditions of torch's kernels; a branch that would
// overflow where it is not taken (expm1 of a large x) reads a clamped operand. leaky_relu, elu
// and softsign differentiate through their ops, which gives torch's gradients. hardswish,
// hardsigmoid, mish and log_sigmoid record torch's backward formula instead (written in kiln ops,
// so it differentiates again): through their ops a gradient would multiply an infinite or NaN
// output gradient by a zero (hardswish below -3) or add two infinite terms (log_sigmoid), where
// torch's formula selects or combines them first.
#include <cmath>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/tensor_impl.h"

namespace kiln {

namespace {

void check_floating(const Tensor& x, const char* op) {
  detail::check_defined(x, op);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ",
             detail::describe(x));
}

// torch's elu with its scale arguments: x * scale for x > 0, expm1(x) * alpha * scale otherwise
// (NaN too, whose gradient is then NaN, as in torch's vectorized loop).
Tensor elu_scaled(const Tensor& x, double alpha, double scale, const char* op) {
  check_floating(x, op);
  const Tensor positive = gt(x, 0);
  const Tensor negative_part = expm1(where(logical_not(positive), x, 0.0)) * (alpha * scale);
  return where(positive, scale == 1.0 ? x : x * scale, negative_part);
}

// min(max(x + 3, 0), 6) as torch's kernels compute it (NaN stays NaN), for hardswish and
// hardsigmoid.
Tensor relu6_of_x_plus_3(const Tensor& x) {
  const Tensor t = x + 3;
  return where(logical_not(lt(t, 0)), where(logical_not(gt(t, 6)), t, 6.0), 0.0);
}

using Backward = Tensor (*)(const Tensor& grad, const Tensor& x);

// `forward`, computed from x without autograd, with `backward` as its gradient.
template <typename Forward>
Tensor with_backward(const char* op, const Tensor& x, Forward forward, Backward backward) {
  Tensor out;
  {
    AutoGradMode kernel_only(false);
    out = forward(x);
  }
  if (detail::needs_grad(x))
    detail::record(op, {x}, {out}, {x}, [backward](const detail::BackwardContext& c) {
      return std::vector<Tensor>{backward(c.grad(), c.saved(0))};
    });
  return out;
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
  return with_backward(
      "hardswish", x, [](const Tensor& v) { return v * relu6_of_x_plus_3(v) / 6; },
      [](const Tensor& g, const Tensor& v) {
        // torch's vectorized loop's: 0 below -3, g from 3 on, g (x / 3 + 1/2) between (NaN
        // too, which stays NaN).
        return where(logical_not(lt(v, -3)), where(ge(v, 3), g, g * (v / 3 + 0.5)), 0.0);
      });
}

Tensor hardsigmoid(const Tensor& x) {
  check_floating(x, "hardsigmoid");
  return with_backward(
      "hardsigmoid", x, [](const Tensor& v) { return relu6_of_x_plus_3(v) / 6; },
      [](const Tensor& g, const Tensor& v) {
        return where(logical_and(gt(v, -3), lt(v, 3)), g * (1.0 / 6), 0.0);  // torch's
      });
}

Tensor mish(const Tensor& x) {
  check_floating(x, "mish");
  return with_backward(
      "mish", x, [](const Tensor& v) { return v * tanh(log1p(exp(v))); },
      [](const Tensor& g, const Tensor& v) {
        // torch's: g (t + x sigmoid(x) (1 - t^2)), t = tanh(softplus(x)).
        const Tensor t = tanh(log1p(exp(v)));
        return g * (t + v * sigmoid(v) * (1 - t * t));
      });
}

Tensor log_sigmoid(const Tensor& x) {
  check_floating(x, "log_sigmoid");
  return with_backward(
      "log_sigmoid", x,
      [](const Tensor& v) {
        // min(x, 0) - log1p(exp(-|x|)).
        const Tensor negative = lt(v, 0);
        return where(negative, v, 0.0) - log1p(exp(where(negative, v, -v)));
      },
      [](const Tensor& g, const Tensor& v) {
        // torch's: g (max'(x, 0) - sign * z / (1 + z)), z = exp(-|x|): sigmoid(-x), stably.
        const Tensor z = exp(-abs(v)), q = z / (z + 1);
        return g * where(lt(v, 0), 1 - q, q);
      });
}

Tensor softsign(const Tensor& x) {
  check_floating(x, "softsign");
  return x / (abs(x) + 1);
}

}  // namespace kiln
