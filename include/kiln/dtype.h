// Element types and torch's type-promotion rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>

namespace kiln {

// Ordered by promotion rank: a later type can hold every value category of an earlier one.
enum class DType : int8_t { Bool, Int32, Int64, Float32, Float64 };

constexpr DType kBool = DType::Bool;
constexpr DType kInt32 = DType::Int32;
constexpr DType kInt = DType::Int32;
constexpr DType kInt64 = DType::Int64;
constexpr DType kLong = DType::Int64;
constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kDouble = DType::Float64;
constexpr int kNumDTypes = 5;

const char* dtype_name(DType t);  // "float32", ...
size_t element_size(DType t);
inline bool is_floating_point(DType t) {
  return t == kFloat32 || t == kFloat64;
}
inline bool is_integral(DType t, bool include_bool = false) {
  return t == kInt32 || t == kInt64 || (include_bool && t == kBool);
}
// The smallest type both values fit in, as torch.promote_types.
DType promote_types(DType a, DType b);
// The floating type an op that needs floats computes in: the type itself if floating, else float32.
inline DType to_floating(DType t) {
  return is_floating_point(t) ? t : kFloat32;
}
// Whether a value of type `from` can be written into a tensor of type `to` by an in-place op
// (torch.can_cast: no float -> integral, no non-bool -> bool).
bool can_cast(DType from, DType to);

std::ostream& operator<<(std::ostream& os, DType t);

template <typename T>
struct CppTypeToDType;
template <>
struct CppTypeToDType<bool> {
  static constexpr DType value = kBool;
};
template <>
struct CppTypeToDType<int32_t> {
  static constexpr DType value = kInt32;
};
template <>
struct CppTypeToDType<int64_t> {
  static constexpr DType value = kInt64;
};
template <>
struct CppTypeToDType<float> {
  static constexpr DType value = kFloat32;
};
template <>
struct CppTypeToDType<double> {
  static constexpr DType value = kFloat64;
};
template <typename T>
constexpr DType dtype_of = CppTypeToDType<T>::value;

}  // namespace kiln
