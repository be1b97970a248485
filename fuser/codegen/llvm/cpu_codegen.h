// CPU code generation: a fused kernel as LLVM IR, optimized at O3 for this CPU and compiled by
// LLVM's ORC LLJIT, with the compiled functions kept in a per-process cache.
#pragma once

#include <cstdint>

#include "fuser/kernel.h"

namespace kiln::fuser {

struct CompileStats {
  int64_t compiled = 0;     // kernels generated and compiled
  int64_t memory_hits = 0;  // requests served by an already loaded kernel
  int64_t disk_hits = 0;    // kernels loaded from the disk cache instead of compiled
  double compile_seconds = 0;
};

// The machine code for (kernel, layout): found in the cache, or generated and compiled now.
// Thread-safe; compilations are serialized.
CompiledKernel cpu_kernel(const Kernel& kernel, const Layout& layout);

CompileStats cpu_compile_stats();

}  // namespace kiln::fuser
