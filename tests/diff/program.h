// The differential tester's programs: a few input tensors (shape, dtype and a seed for their
// bytes) and a list of steps, each one op from the op table (tests/diff/ops.h) applied to earlier
// values with parameters drawn when the program was generated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::differential {

// Parameters of one step: integers (dims, sizes, indices, flags), an integer list (dims, a shape
// or a permutation) and scalar operands, all of one kind (as a Python literal would be).
struct Params {
  std::vector<int64_t> i;
  std::vector<int64_t> list;
  std::vector<double> scalars;
  enum class ScalarKind : int8_t { Int, Float, Bool } scalar_kind = ScalarKind::Float;
};

// A value of a program: step k's result when k >= 0, input -1 - k when k < 0.
using ValueId = int;
inline ValueId input_id(size_t index) {
  return -1 - static_cast<int>(index);
}
inline size_t input_index(ValueId id) {
  return static_cast<size_t>(-1 - id);
}

struct Input {
  std::vector<int64_t> shape;
  DType dtype = kFloat32;
  uint64_t seed = 0;
  // Values are drawn in [lo, hi) (integers for integral dtypes); with `special`, some elements
  // are replaced by special values (signed zeros, infinities, NaN, huge and tiny, limits).
  double lo = -3, hi = 3;
  bool special = false;
};

struct Step {
  int op = 0;  // index into the op table
  std::vector<ValueId> args;
  Params p;
};

struct Program {
  uint64_t seed = 0;
  std::vector<Input> inputs;
  std::vector<Step> steps;
};

}  // namespace kiln::differential
