// Activations and losses with torch.nn.functional's names, arguments and defaults (libtorch's
// torch::nn::functional), in namespace kiln. Each is composed of kiln's elementwise ops and
// reductions, so it records lazily, fuses with its neighbours and differentiates (twice) through
// them; differences from torch are listed in docs/torch-differences.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace kiln {

// ---------------------------------------------------------------- activations (floating inputs)
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor selu(const Tensor& x);
Tensor hardswish(const Tensor& x);
Tensor hardsigmoid(const Tensor& x);
Tensor mish(const Tensor& x);
// min(x, 0) - log1p(exp(-|x|)): finite for every finite x. logsigmoid is libtorch's name.
Tensor log_sigmoid(const Tensor& x);
inline Tensor logsigmoid(const Tensor& x) {
  return log_sigmoid(x);
}
Tensor softsign(const Tensor& x);
// clamp(x, min_val, max_val) whose gradient is 0 on the bounds and beyond (torch's); relu6 is
// hardtanh(x, 0, 6).
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
Tensor relu6(const Tensor& x);
// x for x > 0, alpha * expm1(x / alpha) otherwise (alpha != 0).
Tensor celu(const Tensor& x, double alpha = 1.0);
// x - lambd above lambd, x + lambd below -lambd, 0 between (softshrink; lambd >= 0); x outside
// [-lambd, lambd], 0 inside (hardshrink); x - tanh(x) (tanhshrink).
Tensor softshrink(const Tensor& x, double lambd = 0.5);
Tensor hardshrink(const Tensor& x, double lambd = 0.5);
Tensor tanhshrink(const Tensor& x);
// a * sigmoid(b) for the halves a, b of x along dim (its size must be even).
Tensor glu(const Tensor& x, int64_t dim = -1);
// x for x > 0, weight * x otherwise; weight holds one slope or one per channel (dim 1 of x).
Tensor prelu(const Tensor& x, const Tensor& weight);

// ---------------------------------------------------------------- distances and encodings
// x divided by its p-norm along dim, at least eps.
Tensor normalize(const Tensor& x, double p = 2.0, int64_t dim = 1, double eps = 1e-12);
// sum((x1 / |x1|) * (x2 / |x2|)) along dim of the broadcast operands, each norm at least eps.
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim = 1, double eps = 1e-8);
// The p-norm of x1 - x2 + eps along the last dim.
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p = 2.0, double eps = 1e-6,
                         bool keepdim = false);
// int64 [..., num_classes] with a 1 at each class index of the int64 x; num_classes = -1 takes
// the largest index + 1 (reading x's values, as torch's).
Tensor one_hot(const Tensor& x, int64_t num_classes = -1);
// softmax of -x.
Tensor softmin(const Tensor& x, int64_t dim);

// ---------------------------------------------------------------- padding and pixel shuffles
// torch.nn.functional.pad: pads = {left, right} of the last dim, then of the one before, ...
// (negative values crop). mode "constant" (with value), "reflect" (mirrored without the edge;
// each pad below the dim's size), "replicate" (the edge repeated) or "circular" (wrapped; each pad
// at most the dim's size); the last three pad the last 1 to 3 dims of an input with 1 or 2 more.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, std::string_view mode = "constant",
           double value = 0.0);
// im2col: [N, C, H, W] (or [C, H, W]) -> [N, C kH kW, L], each column one window of the padded
// input (L windows, row-major; channel-major rows, as torch's); fold is its adjoint (col2im:
// overlapping windows add up) back to [N, C, output_size]. Each argument takes 1 or 2 values.
Tensor unfold(const Tensor& input, const Shape& kernel_size, const Shape& dilation = {1},
              const Shape& padding = {0}, const Shape& stride = {1});
Tensor fold(const Tensor& input, const Shape& output_size, const Shape& kernel_size,
            const Shape& dilation = {1}, const Shape& padding = {0}, const Shape& stride = {1});
// torch.nn.functional.affine_grid: the sampling grid [N, H, W, 2] ([N, D, H, W, 3]) of the affine
// maps theta [N, 2, 3] ([N, 3, 4]) for an output of size [N, C, H, W] ([N, C, D, H, W]), in
// grid_sample's normalized coordinates.
Tensor affine_grid(const Tensor& theta, const Shape& size, bool align_corners = false);
// torch.nn.functional.grid_sample of input [N, C, H, W] at grid [N, oH, oW, 2] ((x, y) in [-1, 1]
// spanning the corner pixels' centres with align_corners, their outer edges without): mode
// "bilinear" or "nearest" (half to even), padding_mode "zeros", "border" or "reflection".
Tensor grid_sample(const Tensor& input, const Tensor& grid, std::string_view mode = "bilinear",
                   std::string_view padding_mode = "zeros", bool align_corners = false);
// [..., C r^2, H, W] -> [..., C, H r, W r], and back.
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor);
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor);
// torch.nn.functional.interpolate of [N, C, ...] inputs (1 to 3 spatial dims) to `size`, or by
// `scale_factor` (one for every dim or one each), with mode "nearest", "nearest-exact",
// "linear", "bilinear" or "trilinear" (the linear mode of the input's spatial rank).
Tensor interpolate(const Tensor& x, const std::vector<int64_t>& size,
                   const std::vector<double>& scale_factor = {}, std::string_view mode = "nearest",
                   std::optional<bool> align_corners = std::nullopt,
                   std::optional<bool> recompute_scale_factor = std::nullopt);

// ---------------------------------------------------------------- normalization and embeddings
// x / (k + alpha / size * sum of x^2 over the `size` neighbouring channels)^beta over
// [N, C, ...] (the window zero-padded, as torch).
Tensor local_response_norm(const Tensor& x, int64_t size, double alpha = 1e-4, double beta = 0.75,
                           double k = 1.0);
// torch.nn.functional.embedding_bag: sums ("sum"), means ("mean") or maxima ("max") of the rows of
// weight [num, D] that input's indices select, one [D] row per bag: the rows of a 2-D input
// [B, L], or a 1-D input cut at offsets [B] (int64; offsets[0] = 0, non-decreasing; with
// include_last_offset offsets has B + 1 entries, the last the input's length). per_sample_weights
// (the input's shape, "sum" only) scale each row; padding_idx entries are left out of every bag
// (and its mean's count). An empty bag is zeros. Output [B, D].
Tensor embedding_bag(const Tensor& input, const Tensor& weight, const Tensor& offsets = {},
                     std::string_view mode = "mean", const Tensor& per_sample_weights = {},
                     bool include_last_offset = false,
                     std::optional<int64_t> padding_idx = std::nullopt);

// ---------------------------------------------------------------- losses
// torch's reduction="batchmean" (kl_div only): the sum divided by input.size(0).
struct BatchMean {
  bool batchmean = true;  // not empty: GCC warns of copying an empty struct into a variant
};
inline constexpr BatchMean kBatchMean{};
using KLDivReduction = std::variant<Reduction, BatchMean>;

// torch's full nll_loss and cross_entropy (the short forms are in kiln/ops.h). weight (optional,
// [C]) scales each class's terms, and a weighted mean divides by the sum of the weights of the
// targets; targets equal to ignore_index contribute nothing, to the sum or to that divisor.
// cross_entropy's target holds class indices, or class probabilities when it has the logits'
// shape (ignore_index must then be negative); label_smoothing mixes each target with the uniform
// distribution over the C classes. Pass Tensor() for no weight: a braced {} as the third
// argument would select the short form's Reduction::None.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                Reduction reduction = Reduction::Mean, int64_t ignore_index = -100);
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);

// input holds probabilities in [0, 1] (not checked: values outside give NaN); each log is clamped
// to >= -100 as torch's. weight (optional) broadcasts to the input.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = {},
                            Reduction reduction = Reduction::Mean);
// The stable form on logits; pos_weight (optional) scales the positive term, broadcasting along
// the last (class) dim as torch's.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const Tensor& weight = {},
                                        Reduction reduction = Reduction::Mean,
                                        const Tensor& pos_weight = {});
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      Reduction reduction = Reduction::Mean, double beta = 1.0);
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);
// input holds log-probabilities; target probabilities (log-probabilities with log_target).
Tensor kl_div(const Tensor& input, const Tensor& target,
              const KLDivReduction& reduction = Reduction::Mean, bool log_target = false);
// max(0, -y (x1 - x2) + margin), y = 1 or -1 per pair.
Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                           double margin = 0.0, Reduction reduction = Reduction::Mean);
// log(1 + exp(-y x)).
Tensor soft_margin_loss(const Tensor& input, const Tensor& target,
                        Reduction reduction = Reduction::Mean);
// x where y = 1, max(0, margin - x) where y = -1 (both where y is neither, as torch).
Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, double margin = 1.0,
                            Reduction reduction = Reduction::Mean);
// 1 - cos(x1, x2) where y = 1, max(0, cos - margin) where y = -1; rows of [N, D] inputs with a
// [N] target, or one [D] pair with a 0-D target.
Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                             double margin = 0.0, Reduction reduction = Reduction::Mean);
// max(0, margin + d(a, p) - d(a, n)) with pairwise_distance's p-norm (swap: d(a, n) is the smaller
// of it and d(p, n)).
Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           double margin = 1.0, double p = 2.0, double eps = 1e-6,
                           bool swap = false, Reduction reduction = Reduction::Mean);
// 0.5 (log(var) + (x - t)^2 / var) (+ 0.5 log(2 pi) when full), var clamped to >= eps without
// changing its gradient (torch's); var has the input's shape, or it without its last dim, or with
// that dim 1. A negative var raises.
Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var,
                         bool full = false, double eps = 1e-6,
                         Reduction reduction = Reduction::Mean);
// exp(x) - t x (log_input), else x - t log(x + eps); full adds Stirling's term where t > 1.
Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, bool log_input = true,
                        bool full = false, double eps = 1e-8,
                        Reduction reduction = Reduction::Mean);
// -(t log_sigmoid(x) + (1 - t) log_sigmoid(-x)), weighted, averaged over the last (class) dim.
Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target,
                                   const Tensor& weight = {},
                                   Reduction reduction = Reduction::Mean);

// The multi-class hinge loss of input [N, C] (or [C]) and class targets [N] (or 0-D): the sum over
// j != y of max(0, margin - x[y] + x[j])^p (p = 1 or 2), times weight[y] when given, over C.
Tensor multi_margin_loss(const Tensor& input, const Tensor& target, int64_t p = 1,
                         double margin = 1.0, const Tensor& weight = {},
                         Reduction reduction = Reduction::Mean);

}  // namespace kiln
