// The fuser's registrations with the layers below it, each an explicit call made once at load
// time by exec/layer_hooks.cpp (no self-registering static objects).
#pragma once

namespace kiln::fuser {

// Hands fusion_enabled, is_fusible and has_device_kernel to jit/'s passes (jit/fusibility.h).
// Defined in fuser/fusion_queries.cpp.
void register_fusion_queries();

// Publishes cpu_compile_stats() as the statistics provider "cpu_codegen" (lib/stats_registry.h).
// Defined in fuser/codegen/llvm/kernel_cache.cpp.
void register_cpu_codegen_stats();

// Publishes cuda::cuda_compile_stats() as the provider "cuda_codegen"; CUDA builds only.
// Defined in fuser/codegen/cuda/cuda_kernel.cpp.
void register_cuda_codegen_stats();

}  // namespace kiln::fuser
