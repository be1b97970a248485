// CPU code generation: a fused kernel as LLVM IR, optimized for this CPU and compiled by LLVM's
// ORC LLJIT, with the compiled kernels kept in a per-process cache of limited size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fuser/kernel.h"

namespace kiln::fuser {

struct CompileStats {
  int64_t compiled = 0;     // kernels generated and compiled
  int64_t memory_hits = 0;  // requests served by an already loaded kernel
  int64_t disk_hits = 0;    // kernels loaded (and linked) from the disk cache, not compiled
  int64_t evicted = 0;      // kernels dropped from the in-memory cache past its capacity
  int64_t revived = 0;      // memory hits on an evicted kernel that a plan still held
  int64_t unloaded = 0;     // kernels whose code was removed (evicted, and no longer held)
  double compile_seconds = 0;
};

// The in-memory cache keeps KILN_KERNEL_CACHE_MAX kernels (default in lib/env.cpp: 4096), evicting
// the least recently used. An evicted kernel's code stays loaded while a CompiledKernel of it
// lives.

// The machine code for (kernel, layout): found in the cache, or generated and compiled now.
// Thread-safe; lookups run beside a compilation, compilations are serialized.
CompiledKernel cpu_kernel(const Kernel& kernel, const Layout& layout);
// The key the disk cache files the kernel's object under: its emitted LLVM IR module (text) and
// the target (triple, CPU and features, LLVM's version); no hand-bumped version.
std::string cpu_disk_key(const Kernel& kernel, const Layout& layout);

// Sets the in-memory cache's capacity (for tests), evicting down to it; returns the previous one.
size_t set_cpu_kernel_cache_capacity(size_t kernels);

CompileStats cpu_compile_stats();

}  // namespace kiln::fuser
