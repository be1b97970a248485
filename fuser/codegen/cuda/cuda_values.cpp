// C spellings of kiln values in generated CUDA source (see cuda_values.h).
#include "fuser/codegen/cuda/cuda_values.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "fuser/primitives.h"
#include "kiln/error.h"

namespace kiln::fuser::cuda::codegen {

// A number of type t exactly: hexadecimal floats (no decimal rounding), bit patterns for
// infinities and NaN, integers converted from the double as the LLVM emitter converts them.
std::string literal(double value, DType t) {
  char buf[64];
  switch (t) {
    case kBool:
      return value != 0 ? "true" : "false";
    case kFloat32: {
      const auto f = static_cast<float>(value);
      if (!std::isfinite(f)) {
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        std::snprintf(buf, sizeof buf, "__int_as_float(0x%08x)", bits);
      } else {
        std::snprintf(buf, sizeof buf, "(%af)", static_cast<double>(f));
      }
      return buf;
    }
    case kFloat64: {
      if (!std::isfinite(value)) {
        uint64_t bits;
        std::memcpy(&bits, &value, sizeof bits);
        std::snprintf(buf, sizeof buf, "__longlong_as_double((long long)0x%016llxull)",
                      static_cast<unsigned long long>(bits));
      } else {
        std::snprintf(buf, sizeof buf, "(%a)", value);
      }
      return buf;
    }
    case kInt32: {
      const auto i = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(value)));
      if (i == INT32_MIN) return "(-2147483647 - 1)";
      return "(" + std::to_string(i) + ")";
    }
    case kInt64: {
      const auto i = static_cast<int64_t>(value);
      if (i == INT64_MIN) return "(-9223372036854775807ll - 1)";
      return "(" + std::to_string(i) + "ll)";
    }
  }
  return "?";
}

// Static_cast semantics of the LLVM emitter's cast().
std::string cast(const std::string& a, DType from, DType to) {
  if (from == to) return a;
  if (to == kBool) return "(" + a + " != 0)";
  if (from == kBool) return "(" + std::string(value_type(to)) + ")" + a;
  if (is_floating_point(from) && !is_floating_point(to))
    return std::string(to == kInt32 ? "kiln_f2i(" : "kiln_f2l(") + a + ")";
  // float <-> double (round to nearest), integer -> float (round to nearest), and integer ->
  // integer (sign extension or truncation): C++'s conversions are these.
  return "(" + std::string(value_type(to)) + ")" + a;
}

// The math library's function for a float32 or float64 operand: CUDA's libdevice.
std::string libm(const char* name, DType t) {
  KILN_CHECK(is_floating_point(t), "fuser: CUDA codegen: ", name, " of ", dtype_name(t));
  return std::string(name) + (t == kFloat32 ? "f" : "");
}

std::string fold_name(const Instr& r) {
  return std::string("kiln_") + (prim_name(r.prim) + 1);
}

std::string fold_functor(const Instr& r) {
  std::string f = std::string("Kiln") + (prim_name(r.prim) + 1) + "()";
  f[4] = static_cast<char>(std::toupper(static_cast<unsigned char>(f[4])));
  return f;
}

std::string identity(const Instr& r) {
  const DType t = r.type;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  switch (prim_info(r.prim).identity) {
    case FoldIdentity::kZero:
      return literal(0.0, t);
    case FoldIdentity::kOne:
      return literal(1.0, t);
    case FoldIdentity::kLowest:
      if (t == kBool) return "false";
      if (is_floating_point(t)) return literal(-kInf, t);
      return t == kInt32 ? "(-2147483647 - 1)" : "(-9223372036854775807ll - 1)";
    case FoldIdentity::kHighest:
      if (t == kBool) return "true";
      if (is_floating_point(t)) return literal(kInf, t);
      return t == kInt32 ? "2147483647" : "9223372036854775807ll";
    case FoldIdentity::kNone:
      break;
  }
  KILN_CHECK(false, "fuser: CUDA codegen: ", prim_name(r.prim), " is not a reduction");
  return "";
}

}  // namespace kiln::fuser::cuda::codegen
