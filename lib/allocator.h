// The CPU allocator: aligned blocks, with large blocks cached for reuse.
#pragma once

#include <cstddef>

namespace kiln::detail {

// 64-byte aligned memory for `nbytes` (at least one byte); throws kiln::Error when out of memory.
void* cpu_alloc(size_t nbytes);
// Returns a block from cpu_alloc; `nbytes` must be the size it was allocated with.
void cpu_free(void* p, size_t nbytes);
// Releases every cached block to the system.
void cpu_empty_cache();
// Bytes currently held in the cache (not in use by any tensor).
size_t cpu_cached_bytes();
// Bytes held by live tensors, the most held since the last cpu_reset_peak(), and a reset.
size_t cpu_allocated_bytes();
size_t cpu_peak_allocated_bytes();
void cpu_reset_peak();

}  // namespace kiln::detail
