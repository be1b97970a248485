// DLPack (https://dmlc.github.io/dlpack/latest/): tensors shared with other libraries (PyTorch's
// at::fromDLPack / at::toDLPack, NumPy, JAX, CuPy) without copying. Needs the DLPack header
// (Debian's libdlpack-dev, dlpack/dlpack.h).
#pragma once

#include <dlpack/dlpack.h>

#include "kiln/tensor.h"

namespace kiln {

// A DLManagedTensor viewing `t`'s memory (a pending tensor is computed first): its sizes, strides
// (in elements), dtype and device (kDLCPU or kDLCUDA with the device index). The consumer calls
// its deleter once when done, which releases kiln's reference: the memory lives until both kiln's
// tensors and the consumer are done with it.
DLManagedTensor* to_dlpack(const Tensor& t);
// A tensor viewing the memory `managed` describes (data + byte_offset, strides, or contiguous when
// strides is null), taking ownership of `managed`: its deleter is called exactly once, when the
// last kiln tensor or view of that memory goes away. Raises kiln::Error (and leaves `managed` to
// the caller, its deleter not called) for dtypes kiln lacks (float16, uint8, ...), lanes other
// than 1, negative strides, or devices other than CPU and CUDA.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace kiln
