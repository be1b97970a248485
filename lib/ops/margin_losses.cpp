// torch.nn.functional's margin and likelihood losses: margin_ranking_loss, soft_margin_loss,
// hinge_embedding_loss, cosine_embedding_loss, triplet_margin_loss, gaussian_nll_loss,
// poisson_nll_loss, multilabel_soft_margin_loss and multi_margin_loss, each torch's formula term
// for term in kiln's ops (so they round as torch's, fuse, and differentiate through their parts).
#include <cmath>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/ops/losses.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::check_loss_pair;
using detail::describe;
using detail::reduce_loss;

Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                           double margin, Reduction reduction) {
  const char* op = "margin_ranking_loss";
  check_loss_pair(op, input1, input2, false);
  check_loss_pair(op, input1, target, false);
  return reduce_loss(clamp_min(-target * (input1 - input2) + margin, 0), reduction);
}

Tensor soft_margin_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_loss_pair("soft_margin_loss", input, target, false);
  return reduce_loss(log1p(exp(-input * target)), reduction);
}

Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, double margin,
                            Reduction reduction) {
  check_loss_pair("hinge_embedding_loss", input, target, false);
  const Tensor zero = zeros_like(input);
  const Tensor beyond_margin = where(ne(target, 1), clamp_min(margin - input, 0), zero);
  const Tensor itself = where(ne(target, -1), input, zero);
  return reduce_loss(beyond_margin + itself, reduction);
}

Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                             double margin, Reduction reduction) {
  const char* op = "cosine_embedding_loss";
  check_loss_pair(op, input1, input2, false);
  detail::check_defined(target, op, "target");
  const int64_t d = target.dim();
  KILN_CHECK(d <= 1 && input1.dim() == d + 1 && input2.dim() == d + 1, op,
             ": expected [N, D] inputs with a [N] target or [D] inputs with a 0-D target, got ",
             describe(input1), ", ", describe(input2), " and ", describe(target));
  constexpr double kEpsilon = 1e-12;  // torch's
  const Tensor products = (input1 * input2).sum({d});
  const Tensor squares1 = (input1 * input1).sum({d}) + kEpsilon;
  const Tensor squares2 = (input2 * input2).sum({d}) + kEpsilon;
  const Tensor cos = products / sqrt(squares1 * squares2);
  const Tensor zero = zeros_like(cos);
  const Tensor similar = where(eq(target, 1), 1 - cos, zero);
  const Tensor dissimilar = where(eq(target, -1), clamp_min(cos - margin, 0), zero);
  return reduce_loss(similar + dissimilar, reduction);
}

Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           double margin, double p, double eps, bool swap, Reduction reduction) {
  const char* op = "triplet_margin_loss";
  check_loss_pair(op, anchor, positive, false);
  check_loss_pair(op, anchor, negative, false);
  KILN_CHECK(anchor.dim() == positive.dim() && anchor.dim() == negative.dim(), op,
             ": expected anchor, positive and negative of one number of dims, got ",
             describe(anchor), ", ", describe(positive), " and ", describe(negative));
  const Tensor to_positive = pairwise_distance(anchor, positive, p, eps);
  Tensor to_negative = pairwise_distance(anchor, negative, p, eps);
  if (swap) to_negative = minimum(to_negative, pairwise_distance(positive, negative, p, eps));
  return reduce_loss(clamp_min(margin + to_positive - to_negative, 0), reduction);
}

Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var_in, bool full,
                         double eps, Reduction reduction) {
  const char* op = "gaussian_nll_loss";
  check_loss_pair(op, input, target, false);
  detail::check_defined(var_in, op, "var");
  KILN_CHECK(var_in.is_floating_point(), op, ": expected a floating-point var, got ",
             describe(var_in));
  Tensor var = var_in;
  if (var.sizes() != input.sizes()) {
    const Shape without_last(input.sizes().begin(), input.sizes().end() - (input.dim() > 0));
    const bool homoscedastic = input.dim() > 0 && var.dim() == input.dim() && var.size(-1) == 1 &&
                               Shape(var.sizes().begin(), var.sizes().end() - 1) == without_last;
    KILN_CHECK(input.dim() > 0 && (var.sizes() == without_last || homoscedastic), op, ": var ",
               describe(var), " must have the input's shape ", detail::shape_str(input.sizes()),
               ", or it without its last dim, or with it 1");
    if (!homoscedastic) var = var.unsqueeze(-1);
  }
  KILN_CHECK(!any(lt(var_in, 0)).item<bool>(), op, ": var ", describe(var_in),
             " has negative entries");
  // Clamped to eps in value only: the gradient reaches var as if unclamped (torch's no_grad clamp).
  var = var + (clamp_min(var, eps) - var).detach();
  Tensor terms = 0.5 * (log(var) + (input - target) * (input - target) / var);
  if (full) terms = terms + 0.5 * std::log(2 * M_PI);
  return reduce_loss(terms, reduction);
}

Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, bool log_input, bool full,
                        double eps, Reduction reduction) {
  check_loss_pair("poisson_nll_loss", input, target, false);
  Tensor terms = log_input ? exp(input) - target * input : input - target * log(input + eps);
  if (full) {
    const Tensor stirling = target * log(target) - target + 0.5 * log(2 * M_PI * target);
    terms = terms + masked_fill(stirling, le(target, 1), 0);
  }
  return reduce_loss(terms, reduction);
}

Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target, const Tensor& weight,
                                   Reduction reduction) {
  const char* op = "multilabel_soft_margin_loss";
  check_loss_pair(op, input, target, false);
  KILN_CHECK(input.dim() >= 1, op, ": expected an input with a class dim, got ", describe(input));
  Tensor terms = -(target * log_sigmoid(input) + (1 - target) * log_sigmoid(-input));
  if (weight.defined()) terms = terms * weight;
  const int64_t classes = input.size(-1);
  return reduce_loss(terms.sum({-1}) / static_cast<double>(classes), reduction);
}

Tensor multi_margin_loss(const Tensor& input, const Tensor& target, int64_t p, double margin,
                         const Tensor& weight, Reduction reduction) {
  const char* op = "multi_margin_loss";
  detail::check_defined(input, op, "input");
  detail::check_defined(target, op, "target");
  KILN_CHECK(p == 1 || p == 2, op, ": only p == 1 and p == 2 are supported, got ", p);
  KILN_CHECK(
      input.is_floating_point() && (input.dim() == 1 || input.dim() == 2) && input.size(-1) > 0, op,
      ": expected a non-empty floating-point [C] or [N, C] input, got ", describe(input));
  const int64_t frames = input.dim() == 2 ? input.size(0) : 1, classes = input.size(-1);
  KILN_CHECK(target.dtype() == kInt64 && target.dim() <= 1 && target.numel() == frames, op,
             ": expected an int64 target of ", frames, " class indices for input ", describe(input),
             ", got ", describe(target));
  KILN_CHECK(!weight.defined() || (weight.dim() == 1 && weight.numel() == classes &&
                                   weight.dtype() == input.dtype()),
             op, ": expected a weight of ", classes, " ", dtype_name(input.dtype()),
             " values, got ", describe(weight));
  {
    detail::ValueCheckScope checking;
    KILN_CHECK(all(logical_and(ge(target.detach(), 0), lt(target.detach(), classes))).item<bool>(),
               op, ": target ", describe(target), " holds a class outside [0, ", classes, ")");
  }
  // torch's loop: z_j = margin - x_y + x_j for every class j but y, counted where z_j > 0 (a NaN
  // z_j is not).
  const Tensor x = input.view({frames, classes}), y = target.reshape({frames, 1});
  Tensor z = margin - gather(x, 1, y) + x;
  z = where(gt(z, 0), z, 0);
  Tensor terms = p == 1 ? z : z * z;
  if (weight.defined()) terms = terms * index_select(weight, 0, y.view({-1})).view({frames, 1});
  terms = where(eq(arange(classes, TensorOptions(kInt64).device(input.device())), y),
                zeros_like(terms), terms);
  const Tensor per_frame = terms.sum({1}) / static_cast<double>(classes);
  return reduce_loss(per_frame.view(target.sizes()), reduction);
}

}  // namespace kiln
