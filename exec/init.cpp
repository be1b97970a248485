// The one place where the layers above lib register themselves into lib's hooks, in a fixed order.
#include "exec/init.h"

#include <mutex>

#include "exec/layer_hooks.h"
#include "exec/lazy_eval.h"
#include "fuser/cache.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#include "jit/ir.h"
#include "lib/lazy.h"
#ifdef KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_index.h"
#include "fuser/codegen/cuda/cuda_kernel.h"
#endif

namespace kiln::detail {

namespace {
// The order: the IR's own ops join the op table first (so that look-ups by name find "input" and
// "constant" before any graph is built), then the hooks, which are independent of each other.
void register_upper_layers() {
  jit::input_op();  // each registers its op on first use
  jit::constant_op();
  set_evaluator(&jit::evaluate);  // lib/lazy.h: materializing a pending tensor
  jit::register_layer_hooks();    // the fuser's answers to the passes, the statistics providers
  fuser::register_conv_choices();
#ifdef KILN_HAS_CUDA
  fuser::cuda::register_device_kernels();  // copy, hand-written kernels
  fuser::cuda::register_index_kernels();   // gather, scatter_add
#endif
  fuser::start_cpu_jit_early();  // last: the rest is registered before its thread runs
}
}  // namespace

void initialize_upper_layers() {
  static std::once_flag once;
  std::call_once(once, register_upper_layers);
}

namespace {
// The only static initializer of kiln's registrations, and the trigger of the one above: lib
// cannot call upward, yet lib's first op may need the evaluator (reading a pending value) or a
// device kernel (a CUDA copy) before the program calls anything in jit/, fuser/ or exec/. So the
// upper layers register while the library loads, before main and before any other thread exists.
// It is safe in any initialization order: everything it writes is reached through function-local
// statics (the op table's storage, DeviceKernels, ConvChoiceStore) or is constant-initialized (the
// evaluator pointer), and lib's own op families register on their first use (lib/op_registry.h).
// Linking: this object must be in the link, as it is in libkiln.so (a static archive would need
// it kept, e.g. with --whole-archive, as it would for the upper layers themselves).
const bool kUpperLayersInitialized = (initialize_upper_layers(), true);
}  // namespace

}  // namespace kiln::detail
