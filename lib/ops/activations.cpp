// Activations of torch.nn.functional composed of kiln's elementwise ops (kiln/nn_functional.h).
//
// Each is a few elementwise ops, so the fuser makes it one kernel with its neighbours. Piecewise
// ones pick their branch with where, on the conditions of torch's kernels; a branch that would
// overflow where it is not taken (expm1 of a large x) reads a clamped operand. leaky_relu, elu,
// celu, softsign, hardshrink, tanhshrink, glu and prelu differentiate through their ops, which
// gives torch's gradients. hardswish, hardsigmoid, mish, log_sigmoid, hardtanh, softshrink and
// logit record torch's backward formula instead (written in kiln ops, so it differentiates again):
// through their ops a gradient would multiply an infinite or NaN output gradient by a zero
// (hardswish below -3), add two infinite terms (log_sigmoid), pass the gradient at a bound
// (hardtanh's clamp) or give NaN's a zero, where torch's formula selects or combines them first.
#include <cmath>
#include <limits>

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

// torch's elu with its scale arguments: x * scale for x > 0, expm1(x * input_scale) * alpha *
// scale otherwise (NaN too, whose gradient is then NaN, as in torch's vectorized loop).
Tensor elu_scaled(const Tensor& x, double alpha, double scale, const char* op,
                  double input_scale = 1.0) {
  check_floating(x, op);
  const Tensor positive = gt(x, 0);
  Tensor negative = where(logical_not(positive), x, 0.0);
  if (input_scale != 1.0) negative = negative * input_scale;
  const Tensor negative_part = expm1(negative) * (alpha * scale);
  return where(positive, scale == 1.0 ? x : x * scale, negative_part);
}

// min(max(x + 3, 0), 6) as torch's kernels compute it (NaN stays NaN), for hardswish and
// hardsigmoid.
Tensor relu6_of_x_plus_3(const Tensor& x) {
  const Tensor t = x + 3;
  return where(logical_not(lt(t, 0)), where(logical_not(gt(t, 6)), t, 6.0), 0.0);
}

// `forward`, computed from x without autograd, with backward(grad, x) as its gradient.
template <typename Forward, typename Backward>
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

Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  check_floating(x, "hardtanh");
  KILN_CHECK(min_val <= max_val, "hardtanh: min_val ", min_val, " must not exceed max_val ",
             max_val);
  return with_backward(
      "hardtanh", x, [&](const Tensor& v) { return clamp(v, min_val, max_val); },
      [min_val, max_val](const Tensor& g, const Tensor& v) {
        // torch's: 0 on and beyond the bounds (NaN passes g).
        return where(logical_not(logical_or(le(v, min_val), ge(v, max_val))), g, 0.0);
      });
}

Tensor relu6(const Tensor& x) {
  return hardtanh(x, 0.0, 6.0);
}

Tensor celu(const Tensor& x, double alpha) {
  KILN_CHECK(alpha != 0, "celu: alpha must not be 0 (it divides x)");
  return elu_scaled(x, alpha, 1.0, "celu", 1.0 / alpha);
}

Tensor softshrink(const Tensor& x, double lambd) {
  check_floating(x, "softshrink");
  KILN_CHECK(lambd >= 0, "softshrink: lambd must be non-negative, got ", lambd);
  return with_backward(
      "softshrink", x,
      [lambd](const Tensor& v) {
        // +0 between the bounds (libtorch 1.13's; 2's x * 0 gives -0 for negative x), and NaN
        // for NaN (libtorch 2's; 1.13's is 0).
        return where(gt(v, lambd), v - lambd,
                     where(lt(v, -lambd), v + lambd, where(isnan(v), v, 0.0)));
      },
      [lambd](const Tensor& g, const Tensor& v) {
        return where(logical_not(logical_and(ge(v, -lambd), le(v, lambd))), g, 0.0);
      });
}

Tensor hardshrink(const Tensor& x, double lambd) {
  check_floating(x, "hardshrink");
  return where(logical_not(logical_and(ge(x, -lambd), le(x, lambd))), x, 0.0);
}

Tensor tanhshrink(const Tensor& x) {
  check_floating(x, "tanhshrink");
  return x - tanh(x);
}

Tensor glu(const Tensor& x, int64_t dim) {
  check_floating(x, "glu");
  KILN_CHECK(x.dim() > 0, "glu: expected a tensor of at least 1 dim, got ", detail::describe(x));
  const int64_t d = detail::wrap_dim(dim, x.dim(), "glu", &x);
  KILN_CHECK(x.size(d) % 2 == 0, "glu: dim ", d, " of ", detail::describe(x),
             " must have an even size, to halve");
  const int64_t half = x.size(d) / 2;
  return x.narrow(d, 0, half) * sigmoid(x.narrow(d, half, half));
}

// weight holds one slope, or one per channel (dim 1 of x, as torch's).
Tensor prelu(const Tensor& x, const Tensor& weight) {
  check_floating(x, "prelu");
  detail::check_defined(weight, "prelu", "weight");
  const int64_t channels = x.dim() >= 2 ? x.size(1) : 1;
  KILN_CHECK(weight.dim() <= 1 && (weight.numel() == 1 || weight.numel() == channels) &&
                 weight.dtype() == x.dtype() && weight.device() == x.device(),
             "prelu: weight ", detail::describe(weight), " must be one slope or one per channel (",
             channels, ") of input ", detail::describe(x), ", of its dtype and device");
  // One slope is a 0-dim tensor; one per channel (even 0 of them) lies along dim 1.
  Shape slope_shape;
  if (weight.numel() != 1) {
    slope_shape.assign(static_cast<size_t>(x.dim()), 1);
    slope_shape[1] = channels;
  }
  const Tensor slope = weight.reshape(slope_shape);
  // The slope multiplies x only where x <= 0 (or NaN): elsewhere its gradient is 0, not g * x
  // masked (NaN where x is inf), as torch's.
  const Tensor positive = gt(x, 0);
  return where(positive, x, slope * where(logical_not(positive), x, 0.0));
}

Tensor logit(const Tensor& x, std::optional<double> eps) {
  detail::check_defined(x, "logit");
  const Tensor in = x.is_floating_point() ? x : x.to(kFloat32);
  return with_backward(
      "logit", in,
      [eps](const Tensor& v) {
        const Tensor z = eps ? clamp(v, *eps, 1 - *eps) : v;
        return log(z / (1 - z));
      },
      [eps](const Tensor& g, const Tensor& v) {
        // torch's: g / (x (1 - x)); with eps, 0 outside [eps, 1 - eps]; without, NaN outside
        // [0, 1] and g * inf at 0 and 1 (-0 too).
        const Tensor d = g / (v * (1 - v));
        if (eps) return where(logical_not(logical_or(lt(v, *eps), gt(v, 1 - *eps))), d, 0.0);
        const Tensor at_bound =
            where(logical_or(eq(v, 0), eq(v, 1)), g * std::numeric_limits<double>::infinity(), d);
        return where(logical_not(logical_or(lt(v, 0), gt(v, 1))), at_bound,
                     std::numeric_limits<double>::quiet_NaN());
      });
}

}  // namespace kiln
