// PLACEHOLDER: replaced by the GEMM implementation.
#include "kiln/ops.h"
namespace kiln {
#define TODO KILN_FAIL("not implemented yet")
Tensor mm(const Tensor&, const Tensor&) { TODO; }
Tensor bmm(const Tensor&, const Tensor&) { TODO; }
Tensor matmul(const Tensor&, const Tensor&) { TODO; }
Tensor linear(const Tensor&, const Tensor&, const Tensor&) { TODO; }
Tensor addmm(const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&) { TODO; }
}  // namespace kiln
