// kiln::nn's attention modules: MultiheadAttention, TransformerEncoderLayer, TransformerEncoder,
// as torch.nn's. Every forward is a composition of recorded ops (linear, views, the attention of
// lib/attention.h, layer_norm, dropout), so the modules record lazily, trace and differentiate.
#include <limits>
#include <memory>
#include <string>

#include "kiln/autograd.h"
#include "kiln/nn.h"
#include "lib/attention.h"
#include "lib/tensor_impl.h"

namespace kiln::nn {

using detail::describe;
using detail::shape_str;

namespace {

constexpr const char* kMha = "MultiheadAttention";

// torch's _canonical_mask: a bool mask (true = masked out) as an additive one (-inf where true);
// a float mask, which must have the query's dtype, as it is.
Tensor additive_mask(const Tensor& mask, const char* name, const Tensor& query) {
  if (mask.dtype() == kBool)
    return zeros(mask.sizes(), TensorOptions(query.dtype()).device(query.device()))
        .masked_fill(mask, -std::numeric_limits<double>::infinity());
  KILN_CHECK(mask.dtype() == query.dtype(), kMha, ": expected a bool ", name, " or one of ",
             "query's dtype ", dtype_name(query.dtype()), ", got ", describe(mask));
  return mask;
}

// attn_mask ([L, S] or [N * H, L, S]) and key_padding_mask ([N, S], or [S] unbatched) merged
// into one additive mask broadcasting to the scores [N, H, L, S]; undefined without either.
Tensor merged_mask(const Tensor& attn_mask, const Tensor& padding, const Tensor& query, int64_t N,
                   int64_t H, int64_t L, int64_t S, bool batched) {
  Tensor mask;
  if (attn_mask.defined()) {
    const bool per_head = attn_mask.dim() == 3 && attn_mask.sizes() == Shape{N * H, L, S};
    KILN_CHECK((attn_mask.dim() == 2 && attn_mask.sizes() == Shape{L, S}) || per_head, kMha,
               ": expected attn_mask of shape ", shape_str({L, S}), " or ",
               shape_str({N * H, L, S}), ", got ", describe(attn_mask), " (query ", describe(query),
               ")");
    mask = additive_mask(attn_mask, "attn_mask", query);
    if (per_head) mask = mask.reshape({N, H, L, S});
  }
  if (padding.defined()) {
    const Shape want = batched ? Shape{N, S} : Shape{S};
    KILN_CHECK(padding.sizes() == want, kMha, ": expected key_padding_mask of shape ",
               shape_str(want), ", got ", describe(padding));
    Tensor p = additive_mask(padding, "key_padding_mask", query).reshape({N, 1, 1, S});
    mask = mask.defined() ? mask + p : p;
  }
  return mask;
}

}  // namespace

// ---------------------------------------------------------------------------- MultiheadAttention

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& options_)
    : options(options_) {
  const int64_t E = options.embed_dim, H = options.num_heads;
  KILN_CHECK(E > 0 && H > 0, kMha, ": embed_dim and num_heads must be positive, got ", E, " and ",
             H);
  KILN_CHECK(E % H == 0, kMha, ": embed_dim must be divisible by num_heads, got ", E, " and ", H);
  KILN_CHECK(options.dropout >= 0.0 && options.dropout <= 1.0, kMha,
             ": dropout must be in [0, 1], got ", options.dropout);
  head_dim = E / H;
  in_proj_weight = register_parameter("in_proj_weight", init::xavier_uniform_(empty({3 * E, E})));
  if (options.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * E}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(E, E, options.bias));
  if (options.bias) {
    NoGradGuard no_grad;
    out_proj->bias.zero_();
  }
}

MultiheadAttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                     const Tensor& value,
                                                     const Tensor& key_padding_mask,
                                                     bool need_weights, const Tensor& attn_mask,
                                                     bool average_attn_weights) {
  const int64_t E = options.embed_dim, H = options.num_heads;
  for (const auto& [t, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}}) {
    KILN_CHECK(t->defined() && (t->dim() == 2 || t->dim() == 3) && t->size(-1) == E, kMha,
               ": expected ", name, " of shape [seq, batch, ", E, "] (or [seq, ", E,
               "] unbatched), got ", describe(*t));
    KILN_CHECK(t->dim() == query.dim(), kMha, ": query ", describe(query), " and ", name, " ",
               describe(*t), " differ in rank");
  }
  const bool batched = query.dim() == 3;
  // Batch-major [N, seq, E] whatever the layout.
  auto batch_major = [&](const Tensor& t) {
    if (!batched) return t.unsqueeze(0);
    return options.batch_first ? t : t.transpose(0, 1);
  };
  const Tensor q = batch_major(query), k = batch_major(key), v = batch_major(value);
  const int64_t N = q.size(0), L = q.size(1), S = k.size(1);
  KILN_CHECK(k.size(0) == N && v.size(0) == N && v.size(1) == S, kMha, ": key ", describe(key),
             " and value ", describe(value),
             " must have query's batch size and one sequence length (query ", describe(query), ")");
  // Self-attention projects once, with one GEMM of the stacked weights (torch's fast path).
  Tensor qp, kp, vp;
  if (query.is_same(key) && key.is_same(value)) {
    std::vector<Tensor> parts = linear(q, in_proj_weight, in_proj_bias).chunk(3, -1);
    qp = parts[0], kp = parts[1], vp = parts[2];
  } else {
    auto project = [&](const Tensor& x, int64_t i) {
      return linear(x, in_proj_weight.narrow(0, i * E, E),
                    in_proj_bias.defined() ? in_proj_bias.narrow(0, i * E, E) : Tensor());
    };
    qp = project(q, 0), kp = project(k, 1), vp = project(v, 2);
  }
  // [N, seq, E] -> [N, H, seq, head_dim]
  auto heads = [&](const Tensor& x) {
    return x.reshape({N, x.size(1), H, head_dim}).transpose(1, 2);
  };
  const Tensor mask = merged_mask(attn_mask, key_padding_mask, query, N, H, L, S, batched);
  const double p = training_flag() ? options.dropout : 0.0;
  // torch computes the softmax itself when the weights are asked for (a query that may attend to
  // no key gets NaN) and calls scaled_dot_product_attention otherwise (zeros there).
  detail::Attention a = detail::attention(kMha, heads(qp), heads(kp), heads(vp), mask, p, false,
                                          std::nullopt, /*safe=*/!need_weights);
  Tensor out = out_proj->forward(a.output.transpose(1, 2).reshape({N, L, E}));
  out = !batched ? out.squeeze(0) : options.batch_first ? out : out.transpose(0, 1);
  Tensor weights;
  if (need_weights) {
    weights = average_attn_weights ? a.weights.mean({1}) : a.weights;
    if (!batched) weights = weights.squeeze(0);
  }
  return {out, weights};
}

// ----------------------------------------------------------------------------
// TransformerEncoderLayer

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& options_)
    : options(options_) {
  KILN_CHECK(options.activation == "relu" || options.activation == "gelu",
             "TransformerEncoderLayer: activation should be relu or gelu, not ",
             options.activation);
  KILN_CHECK(options.dim_feedforward > 0, "TransformerEncoderLayer: dim_feedforward must be ",
             "positive, got ", options.dim_feedforward);
  MultiheadAttentionOptions attention(options.d_model, options.nhead);
  attention.dropout = options.dropout;
  attention.bias = options.bias;
  attention.batch_first = options.batch_first;
  const int64_t d = options.d_model, ff = options.dim_feedforward;
  // Registered in torch's order, so state_dict keys and parameters() line up with torch's.
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(attention));
  linear1 = register_module("linear1", std::make_shared<Linear>(d, ff, options.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(options.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(ff, d, options.bias));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d}, options.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d}, options.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(options.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(options.dropout));
}

Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& mask,
                                                     const Tensor& padding) {
  return dropout1->forward(
      self_attn->forward(x, x, x, padding, /*need_weights=*/false, mask).output);
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  Tensor h = linear1->forward(x);
  h = options.activation == "gelu" ? gelu(h) : relu(h);
  return dropout2->forward(linear2->forward(dropout->forward(h)));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask) {
  Tensor x = src;
  if (options.norm_first) {
    x = x + self_attention_block(norm1->forward(x), src_mask, src_key_padding_mask);
    return x + feed_forward_block(norm2->forward(x));
  }
  x = norm1->forward(x + self_attention_block(x, src_mask, src_key_padding_mask));
  return norm2->forward(x + feed_forward_block(x));
}

// ---------------------------------------------------------------------------- TransformerEncoder

TransformerEncoder::TransformerEncoder(const std::shared_ptr<TransformerEncoderLayer>& layer,
                                       int64_t num_layers, std::shared_ptr<LayerNorm> norm_)
    : norm(std::move(norm_)) {
  KILN_CHECK(layer != nullptr, "TransformerEncoder: encoder_layer is null");
  KILN_CHECK(num_layers > 0, "TransformerEncoder: num_layers must be positive, got ", num_layers);
  // torch deep-copies the layer: every copy starts from its weights.
  const StateDict weights = layer->state_dict();
  auto list = register_module("layers", std::make_shared<Sequential>());
  for (int64_t i = 0; i < num_layers; ++i) {
    auto copy = std::make_shared<TransformerEncoderLayer>(layer->options);
    copy->load_state_dict(weights);
    copy->train(layer->is_training());
    list->push_back(copy);
    layers.push_back(copy);
  }
  if (norm) register_module("norm", norm);
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask) {
  Tensor x = src;
  for (const auto& layer : layers) x = layer->forward(x, mask, src_key_padding_mask);
  return norm ? norm->forward(x) : x;
}

}  // namespace kiln::nn
