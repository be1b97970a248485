// The upper layers' one-time registration into lib's hooks (exec/init.cpp).
#pragma once

namespace kiln::detail {

// Registers what lib reaches only through hooks, because it does not depend on the layers above:
// the IR's graph ops, the lazy evaluator, the disk cache for measured convolution choices and the
// CUDA device kernels. Runs once (std::call_once); later calls return at once. The library calls
// it while it loads (exec/init.cpp says why), so callers never need to.
void initialize_upper_layers();

}  // namespace kiln::detail
