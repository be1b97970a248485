// scaled_dot_product_attention, composed of table ops as torch's math reference computes it:
//   scores = (q @ k^T) * scale, masked (a bool mask selects the scores, -inf elsewhere; a float
//   mask is added), softmax over the keys (zero weights for a fully masked row), dropout, then @ v.
// The two products are batched GEMMs (matmul); the scaling, the masking and the softmax are
// elementwise ops and one row reduction between them, so the fuser makes them one rows kernel, and
// the composition records lazily, traces and differentiates through its parts. The causal mask is
// a comparison of two expanded aranges (key index <= query index, torch's top-left aligned tril),
// which joins the same kernel instead of a materialized [L, S] tensor.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "kiln/nn.h"
#include "kiln/ops.h"
#include "lib/attention.h"
#include "lib/broadcast.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::shape_str;

namespace {

// The batch dims of a and b ([..., x, y] each) broadcast together, or an error naming op and both.
Shape broadcast_batch(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                      const char* b_name) {
  const size_t na = static_cast<size_t>(a.dim()) - 2, nb = static_cast<size_t>(b.dim()) - 2;
  const size_t n = std::max(na, nb);
  Shape batch(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - na ? 1 : a.size(static_cast<int64_t>(i - (n - na)));
    const int64_t db = i < n - nb ? 1 : b.size(static_cast<int64_t>(i - (n - nb)));
    KILN_CHECK(da == db || da == 1 || db == 1, op, ": the batch dims of ", a_name, " ", describe(a),
               " and ", b_name, " ", describe(b), " do not broadcast together");
    batch[i] = da == 1 ? db : da;
  }
  return batch;
}

// Every check of torch's, made before anything records, so errors name the op and the shapes.
// Returns the scores' shape [..., L, S].
Shape check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& mask, double dropout_p, bool is_causal) {
  for (const auto& [t, name] : {std::pair{&q, "query"}, {&k, "key"}, {&v, "value"}}) {
    KILN_CHECK(t->defined(), op, ": ", name, " is undefined");
    KILN_CHECK(t->dim() >= 2, op, ": expected ", name, " of shape [..., seq, embed], got ",
               describe(*t));
    KILN_CHECK(is_floating_point(t->dtype()), op, ": expected floating-point ", name, ", got ",
               describe(*t));
  }
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
             ": expected query, key and value of one dtype, got ", describe(q), ", ", describe(k),
             " and ", describe(v));
  KILN_CHECK(q.device() == k.device() && q.device() == v.device(), op,
             ": expected query, key and value on one device, got ", q.device().str(), ", ",
             k.device().str(), " and ", v.device().str());
  KILN_CHECK(q.size(-1) == k.size(-1), op, ": query ", describe(q), " and key ", describe(k),
             " differ in their embedding (last) dim");
  KILN_CHECK(k.size(-2) == v.size(-2), op, ": key ", describe(k), " and value ", describe(v),
             " differ in their sequence (second to last) dim");
  Shape scores = broadcast_batch(op, q, "query", k, "key");
  broadcast_batch(op, q, "query", v, "value");
  scores.insert(scores.end(), {q.size(-2), k.size(-2)});
  KILN_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout_p must be in [0, 1], got ",
             dropout_p);
  if (mask.defined()) {
    KILN_CHECK(!is_causal, op,
               ": an explicit attn_mask should not be set when is_causal=true (attn_mask ",
               describe(mask), ")");
    KILN_CHECK(mask.dtype() == kBool || mask.dtype() == q.dtype(), op,
               ": expected a bool attn_mask or one of query's dtype ", dtype_name(q.dtype()),
               ", got ", describe(mask));
    KILN_CHECK(mask.device() == q.device(), op, ": attn_mask ", describe(mask), " is on ",
               mask.device().str(), ", query on ", q.device().str());
    KILN_CHECK(detail::broadcasts_to(mask.sizes(), scores), op, ": attn_mask ", describe(mask),
               " does not broadcast to the attention scores ", shape_str(scores), " (query ",
               describe(q), ", key ", describe(k), ")");
  }
  return scores;
}

// true where query i may attend to key j: j <= i, over the scores' whole shape [..., L, S]. The
// aranges are expanded to that shape before the comparison, so that the comparison has the fused
// group's shape and joins its kernel (a rows group takes no computed operand of another shape).
Tensor causal_mask(const Shape& scores, Device device) {
  const int64_t L = scores[scores.size() - 2], S = scores.back();
  const TensorOptions options = TensorOptions(kInt64).device(device);
  return ge(arange(L, options).unsqueeze(1).expand(scores), arange(S, options).expand(scores));
}

// torch's _safe_softmax (torch >= 2.5 computes scaled_dot_product_attention's weights with it):
// a row whose scores are all -inf (a query that may attend to no key) gets zero weights where
// softmax gives NaN. Such a row's scores are replaced by zeros before the softmax too, so that no
// NaN reaches the backward (whose gradient for the row is then zero, as torch's).
Tensor safe_softmax(const Tensor& scores) {
  const Tensor live = ne(amax(scores, -1, true), -std::numeric_limits<double>::infinity());
  return where(live, softmax(where(live, scores, 0.0), -1), 0.0);
}

}  // namespace

namespace detail {

Attention attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& mask, double dropout_p, bool is_causal,
                    std::optional<double> scale, bool safe) {
  const Shape scores_shape = check_attention(op, q, k, v, mask, dropout_p, is_causal);
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  Tensor scores = matmul(q, k.transpose(-2, -1)) * s;
  if (is_causal)
    scores = where(causal_mask(scores_shape, q.device()), scores, kMinusInf);
  else if (mask.defined() && mask.dtype() == kBool)
    scores = where(mask, scores, kMinusInf);
  else if (mask.defined())
    scores = scores + mask;
  Tensor weights = safe ? safe_softmax(scores) : softmax(scores, -1);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, true);
  return {matmul(weights, v), weights};
}

}  // namespace detail

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  return detail::attention("scaled_dot_product_attention", query, key, value, attn_mask, dropout_p,
                           is_causal, scale, /*safe=*/true)
      .output;
}

}  // namespace kiln
