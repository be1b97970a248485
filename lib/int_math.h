// Integer arithmetic with defined results, in two flavours:
//  - sizes, strides, extents and byte counts are checked: an overflow is an error naming the op
//    and the shape, never a wrapped size (a wrapped numel once made zeros({1 << 40, 1 << 40}) an
//    empty tensor that fill_ wrote past);
//  - tensor values wrap in two's complement, as torch's kernels and the fused kernels (LLVM's add,
//    sub and mul without nsw, fuser/codegen/cuda's kiln_add and friends) compute them. Signed
//    overflow is undefined behaviour in C++, so the eager kernels compute in the unsigned type.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/error.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

// ------------------------------------------------------------------------------------- sizes
// The one place size arithmetic detects overflow: a * b and a + b into *out, true when the exact
// result does not fit in int64.
inline bool mul_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
inline bool add_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

// a * b and a + b for sizes; an overflow throws kiln::Error "<context...> is too large ...".
// Macros, so that the context (an op name, a formatted shape) is evaluated only on failure: these
// run on every op's size computation.
#define KILN_CHECKED_MUL(a, b, ...)                                             \
  ([&]() -> int64_t {                                                           \
    int64_t kiln_r_;                                                            \
    KILN_CHECK(!::kiln::detail::mul_overflows((a), (b), &kiln_r_), __VA_ARGS__, \
               " is too large (its size computation overflows 64 bits)");       \
    return kiln_r_;                                                             \
  }())
#define KILN_CHECKED_ADD(a, b, ...)                                             \
  ([&]() -> int64_t {                                                           \
    int64_t kiln_r_;                                                            \
    KILN_CHECK(!::kiln::detail::add_overflows((a), (b), &kiln_r_), __VA_ARGS__, \
               " is too large (its size computation overflows 64 bits)");       \
    return kiln_r_;                                                             \
  }())

// The element count of `sizes` for `op`: negative sizes are rejected, and so are shapes whose
// count or contiguous extent (the product with empty dims counted as 1, which bounds every
// contiguous stride) overflows int64.
int64_t checked_numel(const Shape& sizes, const char* op);
// The bytes of `numel` elements of `dtype`, or an error naming `op` and `shape` when they overflow
// or exceed what one allocation can hold (PTRDIFF_MAX, as malloc's limit).
size_t checked_nbytes(int64_t numel, DType dtype, const char* op, const Shape& shape);
// The furthest element (sizes[i] - 1) * strides[i] summed, from `offset`; an error naming `op` on
// overflow. Sizes must be non-negative and the geometry non-empty.
int64_t checked_last_element(const Shape& sizes, const Shape& strides, int64_t offset,
                             const char* op);

// ------------------------------------------------------------------------------------ values
template <typename T>
constexpr bool kWrapsInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// x + y, x - y, x * y and -x in two's complement for integers (the conversion back from the
// unsigned type is modular, as C++20 defines it and GCC and Clang implement it); plain arithmetic
// for floating types. Bool is not an arithmetic type here: callers handle it.
template <typename T>
T wrap_add(T x, T y) {
  if constexpr (kWrapsInteger<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
  } else {
    return T(x + y);
  }
}
template <typename T>
T wrap_sub(T x, T y) {
  if constexpr (kWrapsInteger<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) - static_cast<U>(y)));
  } else {
    return T(x - y);
  }
}
template <typename T>
T wrap_mul(T x, T y) {
  if constexpr (kWrapsInteger<T>) {
    // uint32 * uint32 would promote to (signed) int where int is wider; unsigned long long never.
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
  } else {
    return T(x * y);
  }
}
template <typename T>
T wrap_neg(T x) {
  if constexpr (kWrapsInteger<T>)
    return wrap_sub(T(0), x);
  else
    return T(-x);
}

}  // namespace kiln::detail
