// Shared by the loss functions (lib/ops/nn.cpp, lib/ops/margin_losses.cpp).
#pragma once

#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace kiln::detail {

// A loss's elementwise terms reduced as `reduction` says: the sum and the mean accumulate in
// double (mean and sum's formulas), as the CPU kernels do; mean over no terms is NaN.
Tensor reduce_loss(const Tensor& terms, Reduction reduction);

// A loss's input and target: defined, the input floating-point (the target too for the binary
// cross entropies, which also need the input's shape); others broadcast together, as torch's
// (which warns where kiln accepts silently). Returns the shape of the elementwise terms.
Shape check_loss_pair(const char* op, const Tensor& input, const Tensor& target, bool binary);

}  // namespace kiln::detail
