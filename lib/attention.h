// Attention shared by scaled_dot_product_attention and nn::MultiheadAttention, which also needs
// the attention weights (torch's need_weights).
#pragma once

#include <optional>

#include "kiln/tensor.h"

namespace kiln::detail {

struct Attention {
  Tensor output;   // [..., L, Ev]
  Tensor weights;  // [..., L, S]: softmax of the scores, after dropout (as torch returns them)
};

// softmax(q k^T * scale + mask) v, with scaled_dot_product_attention's arguments and checks; `op`
// names the caller in errors. A query row whose scores are all -inf gets zero weights with `safe`
// (torch >= 2.5's scaled_dot_product_attention), NaN without (torch's softmax, as its
// MultiheadAttention computes the weights when they are asked for).
Attention attention(const char* op, const Tensor& query, const Tensor& key, const Tensor& value,
                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                    std::optional<double> scale, bool safe);

}  // namespace kiln::detail
