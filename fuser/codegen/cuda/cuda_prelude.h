// The device helpers a generated source defines before its kernels: the fixed preludes (integer
// arithmetic, conversions, folds and the block reduction) and lib/math's primitives rendered as
// device functions.
#pragma once

#include <map>
#include <string>

#include "fuser/kernel.h"

// Internal to libkiln: hidden, so that the writer's calls between its steps and helpers are
// direct and may be inlined (-fPIC makes exported functions interposable, and so never inlined).
#pragma GCC visibility push(hidden)

namespace kiln::fuser::cuda::codegen {

// Every source's helpers (first in the source), and those of rows kernels (after it).
extern const char* const kPrelude;
extern const char* const kRowsPrelude;

// The suffix of a math device function's name for operands of type t.
const char* math_suffix(DType t);

// The primitives defined in lib/math/primitives.h (fuser/prim_math.h) as device functions
// (kiln_exp_f32, kiln_pow_i64, ...), by name; a kernel includes those it calls.
const std::map<std::string, std::string>& math_functions();

}  // namespace kiln::fuser::cuda::codegen

#pragma GCC visibility pop
