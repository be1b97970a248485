// Pending values that autograd saved for a backward. The lazy evaluator may leave such a value
// uncomputed when it is cheap to recompute where the backward reads it (see
// Collector::stays_recipe in exec/lazy_recipe.cpp); values only the program holds are computed
// with the evaluation that reaches them, as before, so that reading them later costs nothing.
#pragma once

#include "kiln/tensor.h"

namespace kiln::detail {

struct LazyNode;

// Marks the node that will fill t's storage, when t is pending (lib/autograd.cpp, SavedTensor).
void mark_saved_for_backward(const Tensor& t);
// Under the lazy lock: whether n was marked and is still uncomputed.
bool saved_for_backward(const LazyNode& n);
// Under the lazy lock: n was computed or is being freed (lib/lazy.cpp).
void forget_saved_for_backward(const LazyNode& n);

}  // namespace kiln::detail
