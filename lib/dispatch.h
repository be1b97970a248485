// Runs a generic lambda with the C++ type of a runtime DType: dispatch(dt, [&](auto tag) {...}).
#pragma once

#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln::detail {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
decltype(auto) dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::Bool:
      return f(TypeTag<bool>{});
    case DType::Int32:
      return f(TypeTag<int32_t>{});
    case DType::Int64:
      return f(TypeTag<int64_t>{});
    case DType::Float32:
      return f(TypeTag<float>{});
    case DType::Float64:
      return f(TypeTag<double>{});
  }
  KILN_FAIL("unknown dtype");
}

// All types but bool.
template <typename F>
decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Int32:
      return f(TypeTag<int32_t>{});
    case DType::Int64:
      return f(TypeTag<int64_t>{});
    case DType::Float32:
      return f(TypeTag<float>{});
    case DType::Float64:
      return f(TypeTag<double>{});
    default:
      KILN_FAIL(op, ": not supported for dtype ", t);
  }
}

template <typename F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32:
      return f(TypeTag<float>{});
    case DType::Float64:
      return f(TypeTag<double>{});
    default:
      KILN_FAIL(op, ": expected a floating-point dtype, got ", t);
  }
}

}  // namespace kiln::detail

// The element type named by a dispatch tag: `using T = KILN_TYPE(tag);`
#define KILN_TYPE(tag) typename decltype(tag)::type
