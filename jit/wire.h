// Fixed little-endian byte encoding of IR fields, shared by the graph hash and the file format.
//
// Both need a byte form that is the same on every machine, build and process: integers are written
// byte by byte, doubles by bit pattern, strings with a length prefix, variants with a type tag, and
// enums through explicit code tables (so that reordering an enum never changes a hash or a file).
// `Out` is any type with `void write(const void* data, size_t n)`.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "jit/ir.h"
#include "kiln/error.h"

namespace kiln::jit::wire {

// Variant tags of AttrValue on the wire; pinned, not taken from variant::index().
enum AttrTag : uint8_t {
  kAttrNone = 0,
  kAttrBool = 1,
  kAttrInt = 2,
  kAttrDouble = 3,
  kAttrString = 4,
  kAttrInts = 5,
  kAttrDType = 6,
  kNumAttrTags = 7,
};
static_assert(std::variant_size_v<AttrValue> == kNumAttrTags,
              "a new attribute type needs a wire tag (and a new format version)");

inline uint8_t dtype_code(DType t) {
  switch (t) {
    case DType::Bool:
      return 0;
    case DType::Int32:
      return 1;
    case DType::Int64:
      return 2;
    case DType::Float32:
      return 3;
    case DType::Float64:
      return 4;
  }
  KILN_FAIL("jit: unknown dtype ", static_cast<int>(t));
}
// False for a code no dtype has.
inline bool dtype_from_code(uint8_t code, DType* out) {
  static constexpr DType kByCode[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float32,
                                      DType::Float64};
  if (code >= sizeof(kByCode) / sizeof(kByCode[0])) return false;
  *out = kByCode[code];
  return true;
}

inline uint8_t device_code(DeviceType t) {
  return t == DeviceType::CUDA ? 1 : 0;
}
inline bool device_from_code(uint8_t code, DeviceType* out) {
  if (code > 1) return false;
  *out = code == 1 ? DeviceType::CUDA : DeviceType::CPU;
  return true;
}

template <typename Out>
void put_u8(Out& out, uint8_t v) {
  out.write(&v, 1);
}
template <typename Out>
void put_u32(Out& out, uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  out.write(b, 4);
}
template <typename Out>
void put_u64(Out& out, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  out.write(b, 8);
}
template <typename Out>
void put_i64(Out& out, int64_t v) {
  put_u64(out, static_cast<uint64_t>(v));
}
template <typename Out>
void put_f64(Out& out, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_u64(out, bits);
}
// Counts and lengths are 32-bit on the wire; anything larger is not a graph we can describe.
template <typename Out>
void put_count(Out& out, size_t n) {
  KILN_CHECK(n <= UINT32_MAX, "jit: count ", n, " does not fit the graph encoding");
  put_u32(out, static_cast<uint32_t>(n));
}
template <typename Out>
void put_string(Out& out, const std::string& s) {
  put_count(out, s.size());
  out.write(s.data(), s.size());
}

template <typename Out>
void put_type(Out& out, const ValueType& t) {
  put_u8(out, dtype_code(t.dtype));
  put_u8(out, device_code(t.device.type));
  put_u32(out, static_cast<uint32_t>(t.device.index));
  put_u8(out, t.wrapped_number ? 1 : 0);
  put_count(out, t.sizes.size());
  for (int64_t s : t.sizes) put_i64(out, s);
}

template <typename Out>
void put_attr(Out& out, const AttrValue& a) {
  if (std::holds_alternative<std::monostate>(a)) {
    put_u8(out, kAttrNone);
  } else if (const bool* b = std::get_if<bool>(&a)) {
    put_u8(out, kAttrBool);
    put_u8(out, *b ? 1 : 0);
  } else if (const int64_t* i = std::get_if<int64_t>(&a)) {
    put_u8(out, kAttrInt);
    put_i64(out, *i);
  } else if (const double* d = std::get_if<double>(&a)) {
    put_u8(out, kAttrDouble);
    put_f64(out, *d);
  } else if (const std::string* s = std::get_if<std::string>(&a)) {
    put_u8(out, kAttrString);
    put_string(out, *s);
  } else if (const auto* v = std::get_if<std::vector<int64_t>>(&a)) {
    put_u8(out, kAttrInts);
    put_count(out, v->size());
    for (int64_t x : *v) put_i64(out, x);
  } else {
    put_u8(out, kAttrDType);
    put_u8(out, dtype_code(std::get<DType>(a)));
  }
}

template <typename Out>
void put_attrs(Out& out, const Attrs& attrs) {
  put_count(out, attrs.size());
  for (const AttrValue& a : attrs) put_attr(out, a);
}

// An Out that appends to a string.
struct StringOut {
  std::string& s;
  void write(const void* data, size_t n) { s.append(static_cast<const char*>(data), n); }
};

}  // namespace kiln::jit::wire
