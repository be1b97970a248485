// A number passed to an op (x * 2.5, fill_(0)): keeps whether it was bool, integral or floating,
// because torch's promotion treats `int_tensor * 2` and `int_tensor * 2.5` differently.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <type_traits>

#include "kiln/dtype.h"

namespace kiln {

namespace detail {
// A floating value converted to the integer type I as x86's truncating conversion (cvttss2si,
// cvttsd2si) computes it, and as the fused kernels do (fuser/codegen): toward zero, and the lowest
// I (the "integer indefinite" value) for NaN and values out of I's range, which C++ leaves
// undefined.
// Unsigned types go through int64 and wrap.
template <typename I, typename F>
I float_to_int(F v) {
  static_assert(std::is_integral_v<I> && std::is_floating_point_v<F>);
  if constexpr (std::is_signed_v<I>) {
    const F limit = std::ldexp(F(1), std::numeric_limits<I>::digits);  // 2^(bits - 1)
    return std::fabs(v) < limit ? static_cast<I>(v) : std::numeric_limits<I>::min();
  } else {
    return static_cast<I>(float_to_int<int64_t>(v));
  }
}
}  // namespace detail

class Scalar {
 public:
  Scalar() : Scalar(int64_t{0}) {}
  // A template, so that a pointer (a string literal) does not convert to a bool Scalar.
  template <typename T, std::enable_if_t<std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(kBool), i_(v), d_(v) {}
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(kInt64), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {}
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(kFloat64), i_(detail::float_to_int<int64_t>(v)), d_(static_cast<double>(v)) {}

  // kBool, kInt64 or kFloat64: the category of the value, not a tensor dtype.
  DType kind() const { return kind_; }
  bool is_floating_point() const { return kind_ == kFloat64; }
  bool is_integral() const { return kind_ == kInt64; }
  bool is_bool() const { return kind_ == kBool; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }
  template <typename T>
  T to() const {
    if constexpr (std::is_floating_point_v<T>)
      return static_cast<T>(d_);
    else if constexpr (std::is_same_v<T, bool>)
      return kind_ == kFloat64 ? d_ != 0 : i_ != 0;
    else
      return kind_ == kFloat64 ? detail::float_to_int<T>(d_) : static_cast<T>(i_);
  }

 private:
  DType kind_;
  int64_t i_;
  double d_;
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace kiln
