// Device and pinned host memory through caching allocators (lib/caching_allocator.h), one per
// CUDA device plus one for pinned host buffers, and the public statistics and empty_cache.
#pragma once

#include <cstddef>

namespace kiln::detail::cuda {

// Memory on `device`, ordered on its stream; raises kiln::Error when out of memory (after
// returning the cache to the driver and retrying) or when CUDA is unavailable.
void* device_alloc(int device, size_t nbytes);
void device_free(int device, void* p);
// Page-locked host memory, for staging copies.
void* pinned_alloc(size_t nbytes);
void pinned_free(void* p);

}  // namespace kiln::detail::cuda
