// Thread-local free lists for the small objects that lazy recording makes and frees by the
// thousand (nodes, tensor handles, storages). glibc's per-thread cache keeps only seven blocks of a
// size, so a burst of frees (a dropped chain of pending nodes) otherwise takes its slower paths,
// and the next burst of recording pays for it again.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace kiln::detail {

// One list per block size and thread. A block freed on another thread joins that thread's list:
// blocks are plain memory of one size, so any list of that size can hand them out again.
template <size_t Size>
class FreeList {
 public:
  static void* allocate() {
    if (Block* b = head_) {
      head_ = b->next;
      --count_;
      return b;
    }
    return ::operator new(Size);
  }
  static void deallocate(void* p) {
    if (closed_ || count_ >= kMaxBlocks) {
      ::operator delete(p);
      return;
    }
    if (!registered_) register_closer();
    auto* b = static_cast<Block*>(p);
    b->next = head_;
    head_ = b;
    ++count_;
  }

 private:
  // Kept per size and thread: enough for a typical burst, at most a few MiB in all.
  static constexpr size_t kMaxBlocks = 4096;
  struct Block {
    Block* next;
  };
  // Returns the list's blocks when the thread ends; later frees go straight to the heap.
  struct Closer {
    ~Closer() {
      closed_ = true;
      while (Block* b = head_) {
        head_ = b->next;
        ::operator delete(b);
      }
      count_ = 0;
    }
  };
  static void register_closer() {
    static thread_local Closer closer;
    registered_ = true;
  }
  // Plain thread-locals (no constructor or destructor): no guard on the hot path, and still
  // readable while the thread's other thread-locals are destroyed.
  static inline __attribute__((tls_model("initial-exec"))) thread_local Block* head_ = nullptr;
  static inline __attribute__((tls_model("initial-exec"))) thread_local size_t count_ = 0;
  static inline __attribute__((tls_model("initial-exec"))) thread_local bool registered_ = false;
  static inline __attribute__((tls_model("initial-exec"))) thread_local bool closed_ = false;
};

// An allocator for std::allocate_shared that takes single objects from FreeList.
template <typename T>
struct PoolAllocator {
  using value_type = T;
  static constexpr size_t kBlockSize = (sizeof(T) + 15) / 16 * 16;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned for the pool");

  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) {
    if (n != 1) return std::allocator<T>().allocate(n);
    return static_cast<T*>(FreeList<kBlockSize>::allocate());
  }
  void deallocate(T* p, size_t n) {
    if (n != 1) return std::allocator<T>().deallocate(p, n);
    FreeList<kBlockSize>::deallocate(p);
  }
  template <typename U>
  bool operator==(const PoolAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const PoolAllocator<U>&) const {
    return false;
  }
};

// std::make_shared<T>() with the object and its control block from the pool.
template <typename T>
std::shared_ptr<T> make_pooled() {
  return std::allocate_shared<T>(PoolAllocator<T>());
}

}  // namespace kiln::detail
