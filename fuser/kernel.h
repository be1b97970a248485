// The backend-neutral description of one fused elementwise kernel: a straight-line program of
// primitives over loaded elements, kernel scalars and numbers, that each code generator (LLVM
// here, CUDA later) turns into a loop. Ops reach it through their op-table formulas, so a code
// generator implements primitives, never ops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::fuser {

enum class Prim : uint8_t {
  Load,     // element of tensor input `index`
  Scalar,   // kernel scalar `index`, of its own dtype (see Kernel::scalar_types)
  Literal,  // `literal`, of the instruction's type
  Cast,     // a converted to the instruction's type, as static_cast (to bool: != 0)
  Neg,
  Add,
  Sub,
  Mul,
  Div,
  Lt,
  Le,
  Gt,
  Ge,
  Eq,
  Ne,
  And,
  Or,
  Not,
  Select,  // a ? b : c
  Exp,
  Log,
  Log1p,
  Expm1,
  Sqrt,
  Sin,
  Cos,
  Tanh,
  Floor,
  Ceil,
  Round,  // to nearest, ties to even (nearbyint in the default rounding mode)
};
const char* prim_name(Prim p);

struct Instr {
  Prim prim;
  DType type;                      // of the result
  int32_t a = -1, b = -1, c = -1;  // operands: earlier instructions
  int32_t index = -1;              // Load: tensor input; Scalar: kernel scalar
  double literal = 0;
};

// out_k[i] = body evaluated at element i, for every element of the iteration shape.
struct Kernel {
  std::vector<DType> input_types;   // tensor inputs, broadcast to the iteration shape
  std::vector<DType> scalar_types;  // values passed per call, 8 bytes each (literals of the
                                    // graph and op attributes: changing one never recompiles)
  std::vector<Instr> body;
  std::vector<int32_t> outputs;  // instruction per output
  std::vector<DType> output_types;
  std::string ops;  // the fused ops' names joined by '_', for the kernel's symbol

  int32_t add(Instr i) {
    body.push_back(i);
    return static_cast<int32_t>(body.size()) - 1;
  }
  std::string str() const;  // one line per instruction, for logs and test failures
};

// How a call lays out its operands; kernels are specialized on it, never on sizes.
// Flat: every operand is contiguous with the output's element count, or a single element (then
// read at index 0); the kernel runs a flat loop over [begin, end). Strided: the kernel walks rows
// of `rank` dimensions with runtime strides (in elements) over [begin, end) rows.
struct Layout {
  bool flat = true;
  int32_t rank = 0;                  // strided only
  std::vector<bool> single_element;  // flat only: per tensor input

  bool operator==(const Layout& o) const {
    return flat == o.flat && rank == o.rank && single_element == o.single_element;
  }
};

// Arguments of a compiled kernel: `ptrs` holds the tensor inputs' then the outputs' first
// elements; `sizes` the iteration shape (rank entries; strided only); `strides` rank entries per
// pointer, in elements (strided only); `scalars` 8 bytes per kernel scalar.
using KernelFn = void (*)(int64_t begin, int64_t end, char* const* ptrs, const int64_t* sizes,
                          const int64_t* strides, const void* scalars);

// The bytes that identify (kernel, layout): equal bytes, same machine code.
std::string kernel_key(const Kernel& k, const Layout& layout);

}  // namespace kiln::fuser
