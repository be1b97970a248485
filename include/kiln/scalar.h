// A number passed to an op (x * 2.5, fill_(0)): keeps whether it was bool, integral or floating,
// because torch's promotion treats `int_tensor * 2` and `int_tensor * 2.5` differently.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "kiln/dtype.h"

namespace kiln {

class Scalar {
 public:
  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(kBool), i_(v), d_(v) {}
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(kInt64), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {}
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(kFloat64), i_(truncate(static_cast<double>(v))), d_(static_cast<double>(v)) {}

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
      return static_cast<T>(kind_ == kFloat64 ? truncate(d_) : i_);
  }

 private:
  // Toward zero, and 0 for what no int64 holds (NaN, infinities, 2^63 and beyond), where a plain
  // cast would be undefined behaviour.
  static int64_t truncate(double v) {
    return v >= -0x1p63 && v < 0x1p63 ? static_cast<int64_t>(v) : 0;
  }

  DType kind_;
  int64_t i_;
  double d_;
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace kiln
