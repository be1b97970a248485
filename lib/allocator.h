// The CPU allocator: aligned blocks; large blocks cached for reuse by all threads, small blocks by
// the thread that frees them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::detail {

// 64-byte aligned memory for `nbytes` (at least one byte); throws kiln::Error when out of memory.
void* cpu_alloc(size_t nbytes);
// Returns a block from cpu_alloc; `nbytes` must be the size it was allocated with.
void cpu_free(void* p, size_t nbytes);
// Releases every cached large block, and the calling thread's small blocks, to the system.
void cpu_empty_cache();
// Bytes of large blocks (1 MiB and up) held in the shared cache (not in use by any tensor).
size_t cpu_cached_bytes();
// Bytes of small blocks (under 1 MiB) the calling thread holds for reuse.
size_t cpu_thread_small_cached_bytes();
// Blocks taken from the system (aligned_alloc) so far, by all threads: a steady-state loop that the
// caches serve adds none.
uint64_t cpu_system_allocs();
// Bytes held by live tensors, the most held since the last cpu_reset_peak(), and a reset.
size_t cpu_allocated_bytes();
size_t cpu_peak_allocated_bytes();
void cpu_reset_peak();

}  // namespace kiln::detail
