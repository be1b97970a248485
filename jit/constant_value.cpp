// The value of a constant node as a tensor: what a plan binds and a kernel reads as a scalar.
#include "jit/constant_value.h"

#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

Tensor constant_value(const Node& n) {
  const ValueType& t = n.output()->type();
  Scalar value = detail::attr_scalar(n.attr(0));
  Tensor out = t.wrapped_number && t.dtype == value.kind() ? detail::wrap_scalar(value)
                                                           : scalar_tensor(value, t.dtype);
  out.impl()->wrapped_number = t.wrapped_number;
  return out;
}

}  // namespace kiln::jit
