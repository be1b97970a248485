// C spellings of kiln values in generated CUDA source: types, literals, casts, folds' names and
// identities, and the stored form of bools.
#pragma once

#include <cstdint>
#include <string>

#include "fuser/kernel.h"

// Internal to libkiln: hidden, so that the writer's calls between its steps and helpers are
// direct and may be inlined (-fPIC makes exported functions interposable, and so never inlined).
#pragma GCC visibility push(hidden)

namespace kiln::fuser::cuda::codegen {

// The C++ type of a value of dtype t in registers, and in memory (bool as a byte).
inline const char* value_type(DType t) {
  switch (t) {
    case kBool:
      return "bool";
    case kInt32:
      return "int";
    case kInt64:
      return "long long";
    case kFloat32:
      return "float";
    case kFloat64:
      return "double";
  }
  return "?";
}
inline const char* storage_type(DType t) {
  return t == kBool ? "unsigned char" : value_type(t);
}

// The name of instruction n's value (v<n>).
inline std::string v(int32_t n) {
  return "v" + std::to_string(n);
}

// A number of type t exactly: hexadecimal floats (no decimal rounding), bit patterns for
// infinities and NaN, integers converted from the double as the LLVM emitter converts them.
std::string literal(double value, DType t);

// Static_cast semantics of the LLVM emitter's cast().
std::string cast(const std::string& a, DType from, DType to);

// The math library's function for a float32 or float64 operand: CUDA's libdevice.
std::string libm(const char* name, DType t);

// A value of type t read from (bool: as a byte) and stored to memory.
inline std::string read(DType t, const std::string& at) {
  return t == kBool ? "(" + at + " != 0)" : at;
}
inline std::string stored(DType t, const std::string& value) {
  return t == kBool ? "(unsigned char)" + value : value;
}

// The fold of reduction r, named after its primitive (rsum: kiln_sum), its functor (KilnSum),
// and its identity (its table entry's FoldIdentity).
std::string fold_name(const Instr& r);
std::string fold_functor(const Instr& r);
std::string identity(const Instr& r);

}  // namespace kiln::fuser::cuda::codegen

#pragma GCC visibility pop
