// The upper layers' hooks handed to the lower ones at load time: lower layers never include upper
// ones, so what they need from above is registered here, explicitly, in one place.
#include "exec/layer_hooks.h"

#include "fuser/registration.h"

namespace kiln::jit {

namespace {

// jit::stats() (exec/exec_state.cpp) reads the code generators' counters through the registry.
void register_statistics() {
  fuser::register_cpu_codegen_stats();
#ifdef KILN_HAS_CUDA
  fuser::register_cuda_codegen_stats();
#endif
}

}  // namespace

void register_layer_hooks() {
  // The passes (jit/passes/transfers.cpp, push_views.cpp) ask the fuser what fuses.
  fuser::register_fusion_queries();
  register_statistics();
}

}  // namespace kiln::jit
