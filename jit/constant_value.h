// The value of a constant node as a tensor: what a plan binds and a kernel reads as a scalar.
#pragma once

#include "jit/ir.h"
#include "kiln/tensor.h"

namespace kiln::jit {

// The value of a constant node (a 0-dim tensor of its type, a wrapped number when it is one).
Tensor constant_value(const Node& n);

}  // namespace kiln::jit
