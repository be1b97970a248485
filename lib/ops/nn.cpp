// PLACEHOLDER: replaced by the NN ops implementation.
#include "kiln/ops.h"
namespace kiln {
#define TODO KILN_FAIL("not implemented yet")
Tensor softmax(const Tensor&, int64_t) { TODO; }
Tensor log_softmax(const Tensor&, int64_t) { TODO; }
Tensor layer_norm(const Tensor&, const Shape&, const Tensor&, const Tensor&, double) { TODO; }
Tensor cross_entropy(const Tensor&, const Tensor&, Reduction) { TODO; }
Tensor nll_loss(const Tensor&, const Tensor&, Reduction) { TODO; }
Tensor mse_loss(const Tensor&, const Tensor&, Reduction) { TODO; }
Tensor dropout(const Tensor&, double, bool) { TODO; }
}  // namespace kiln
