// CPU code generation: fused kernels compiled through LLVM's ORC LLJIT, cached per process.
//
// One LLJIT serves the process; each kernel is its own module under its own ResourceTracker, whose
// handle the kernel's CompiledKernels share: the in-memory cache keeps at most
// KILN_KERNEL_CACHE_MAX kernels (least recently used evicted), and a kernel's code is removed
// when the cache and every plan holding it have let go. The IR is a loop over elements (flat
// layout) or over rows with an inner loop over the last dimension (strided layout, strides passed
// per call: LLVM's loop vectorizer versions the inner loop on a unit stride), or the passes of a
// rows kernel. Every primitive computes what the op's reference kernel computes: IEEE operations
// without fast-math flags or contraction (a fused result of ops without a transcendental is
// bit-equal to the eager one); the transcendental functions (float32 and float64) are
// lib/math/primitives.h's single definitions instantiated for IR values (ir_value.h: branch-free,
// so loops vectorize; FMA inside a primitive where the host has it), within the bounds of
// docs/numerics.md of the exact result; fmod and pow call the same libm functions the reference
// kernels call (marked nobuiltin, so LLVM does not rewrite them).
//
// The files of fuser/codegen/llvm/, by job: kernel_cache.cpp (these entry points: the in-memory
// cache, eviction, disk-cache hookup, statistics), jit_engine.cpp (LLVM for the host: target
// machine, LLJIT, emit/optimize/compile/link one kernel), passes.cpp (the optimization pipeline
// and PrefetchPass), emitter.cpp (flat and strided kernels, each instruction's IR), emit_rows.cpp
// (rows kernels), emit_partials.cpp (the finish and columns helpers), math_emit.cpp (the lib/math
// primitives as IR), ir_value.h (IR values for lib/math's templates); emitter.h, jit_engine.h and
// cpu_internal.h are private to the directory.
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

// Starts LLVM's JIT (host detection, target machine, LLJIT) on a background thread, so that the
// first kernel, compiled or found in the disk cache, finds it started or waits only for the rest.
// Called once as kiln loads (exec/init.cpp); a second call does nothing. Nothing starts with
// KILN_LAZY=0 (nothing is fused on the CPU) or KILN_JIT_EARLY_START=0 (then LLVM starts at the
// first kernel). The thread is joined at exit and before a fork.
void start_cpu_jit_early();

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
