// The backend-neutral description of one fused kernel: a straight-line program of primitives over
// loaded elements, kernel scalars and numbers, that each code generator (LLVM here, CUDA later)
// turns into loops. Ops reach it through their op-table formulas, so a code generator implements
// primitives, never ops.
//
// A kernel with reductions runs row by row: a row is the trailing `R` elements of the iteration
// shape. A row reduction (ReduceSum/Max/Min with index -1) folds an element-level value over the
// row; what depends on its result is available in the next pass over the row, so softmax takes
// three passes (max, sum of exp, scale) over a row that stays in cache. A global reduction (index
// >= 0) folds a value over every row of the call into its slot of `partials`; the kernel's finish
// function combines the calls' partials in order and computes what depends on them.
//
// A column reduction (Reduce* with `column` set) folds an element-level value over the rows, per
// position in the row: the sum over the leading dims that a broadcast gradient needs (a bias
// gradient g.sum(0), layer_norm's weight gradient (g * xhat).sum(0)). Each call folds its rows, in
// order, into a column partial of R values (R the row length) in `partials`; the kernel's columns
// function then combines the calls' column partials in call order, per position, and computes
// and stores what depends on them (the sum's cast, a mean's division). Calls cover fixed row
// ranges, so results do not depend on the thread count. A column reduction is a group exit:
// nothing else in the kernel reads its result. A column slot may have several parts of R values
// (a column sum of a cat along the row's dim: piece p folds into part p, positions p * R + j).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuser/primitives.h"
#include "kiln/dtype.h"

namespace kiln::fuser {

// An instruction: a primitive (fuser/primitives.h) of earlier instructions.
struct Instr {
  Prim prim;
  DType type;                      // of the result
  int32_t a = -1, b = -1, c = -1;  // operands: earlier instructions
  int32_t index = -1;  // Load: tensor input; Scalar: kernel scalar; Reduce*: global or column
                       // slot, or -1 (a row reduction)
  double literal = 0;
  bool per_row = false;  // Load: the input is constant along a row (read once per row)
  bool column = false;   // Reduce*: a column reduction into column slot `index`, part `part`
  int32_t part = 0;
};
inline bool is_row_reduction(const Instr& i) {
  return is_reduction(i.prim) && i.index < 0;
}
inline bool is_global_reduction(const Instr& i) {
  return is_reduction(i.prim) && i.index >= 0 && !i.column;
}
inline bool is_column_reduction(const Instr& i) {
  return is_reduction(i.prim) && i.column;
}

// out_k[i] = body evaluated at element i, for every element of the iteration shape.
struct Kernel {
  std::vector<DType> input_types;   // tensor inputs, broadcast to the iteration shape
  std::vector<DType> scalar_types;  // values passed per call, 8 bytes each (literals of the
                                    // graph and op attributes: changing one never recompiles)
  std::vector<Instr> body;
  std::vector<int32_t> outputs;  // instruction per output
  std::vector<DType> output_types;
  // Rows kernels, per output: the value has the iteration shape, so it is stored for every element
  // even when its instruction is the same along a row (an expand of a row reduction's result).
  std::vector<bool> output_per_element;
  int32_t num_globals = 0;  // global reductions (slots 0 .. num_globals - 1)
  // Column reductions: per column slot, its number of parts of R values (1 but for a cat's).
  std::vector<int32_t> column_parts;
  std::string ops;  // the fused ops' names joined by '_', for the kernel's symbol

  // Appends i; an exp of x minus a max that folds x becomes ExpNonPos (its argument is at most 0
  // or NaN: softmax's, log_softmax's and a cross entropy's exp).
  int32_t add(Instr i);
  std::string str() const;  // one line per instruction, for logs and test failures
  int32_t num_columns() const { return static_cast<int32_t>(column_parts.size()); }
  // Column slot s's first value in a call's partials, in units of 8 bytes, for rows of length R.
  int64_t column_offset(int32_t s, int64_t R) const {
    int64_t parts = 0;
    for (int32_t i = 0; i < s; ++i) parts += column_parts[static_cast<size_t>(i)];
    return num_globals + parts * R;
  }
  // 8-byte values one call's partials hold: the global slots, then the column slots.
  int64_t partials_per_call(int64_t R) const { return column_offset(num_columns(), R); }
};

// How a call lays out its operands; kernels are specialized on it, never on sizes.
// Flat: every operand is contiguous with the output's element count, or a single element (then
// read at index 0); the kernel runs a flat loop over [begin, end). Strided: the kernel walks rows
// of `rank` dimensions with runtime strides (in elements) over [begin, end) rows, each pointer's
// elements along the innermost dim `inner[p]` apart (as below).
// Rows (kernels with reductions): the kernel walks rows [begin, end) of `rank` outer dimensions
// (sizes and strides per pointer at run time) and `sizes[rank]` elements each, every pointer's
// elements along a row `inner[p]` apart: kZero, kUnit or kAny (the stride passed at run time).
struct Layout {
  enum Inner : uint8_t { kZero, kUnit, kAny };
  bool flat = true;
  bool rows = false;
  int32_t rank = 0;                  // strided and rows
  std::vector<bool> single_element;  // flat only: per tensor input
  // Flat CUDA kernels only, per tensor input: a one-element host tensor (a number such as an
  // optimizer's step size) passed by value among the kernel's parameters rather than copied to the
  // device. Its entry in `ptrs` is the host address of the value.
  std::vector<bool> by_value;
  std::vector<Inner> inner;  // strided and rows: per pointer (inputs, then outputs)

  bool operator==(const Layout& o) const {
    return flat == o.flat && rows == o.rows && rank == o.rank &&
           single_element == o.single_element && by_value == o.by_value && inner == o.inner;
  }
};

// Arguments of a compiled kernel: `ptrs` holds the tensor inputs' then the outputs' first
// elements; `sizes` the iteration shape (rank entries; strided only; rows: rank + 1); `strides`
// rank entries per pointer, in elements (strided only; rows: rank + 1 per pointer, the last one
// along the row); `scalars` 8 bytes per kernel scalar; `partials` the call's partial results
// (Kernel::partials_per_call values of 8 bytes: global slots, then column slots), written by a
// rows kernel. Column outputs are not written by it (their pointers are not read).
using KernelFn = void (*)(int64_t begin, int64_t end, char* const* ptrs, const int64_t* sizes,
                          const int64_t* strides, const void* scalars, void* partials);
// A rows kernel with global reductions: combines `calls` calls' partials (blocks of `stride`
// values of 8 bytes, in row order) and writes the outputs that depend on them.
using FinishFn = void (*)(int64_t calls, int64_t stride, const void* partials, char* const* ptrs,
                          const void* scalars);
// A rows kernel with column reductions, for positions [begin, end) of its column slots (a slot
// of P parts has P * R positions; positions past a slot's end are skipped): combines the column
// partials of `calls` (at least 1) calls (blocks of `stride` values, in row order) into the first
// call's block, in call order, then computes the column outputs and stores them contiguously
// (position j at element j). Ranges of positions may run on several threads at once.
using ColumnsFn = void (*)(int64_t begin, int64_t end, int64_t calls, int64_t stride, int64_t R,
                           void* partials, char* const* ptrs, const void* scalars);
// A kernel's machine code stays loaded while any copy of its CompiledKernel lives: `owner` holds
// it (the code generator's handle on the code), and the in-memory kernel cache evicting the kernel
// only drops the cache's own copy. Keep the CompiledKernel, not just `fn`, while calling it.
struct CompiledKernel {
  KernelFn fn = nullptr;
  FinishFn finish = nullptr;          // set for kernels with global reductions
  ColumnsFn columns = nullptr;        // set for kernels with column reductions
  std::shared_ptr<const void> owner;  // keeps fn and finish loaded
  const char* name = nullptr;         // the symbol, kiln_<ops>_<hash8> (lives as long as owner)
};

// The bytes that identify (kernel, layout): equal bytes, same machine code.
std::string kernel_key(const Kernel& k, const Layout& layout);
// A kernel's symbol, readable in profilers: kiln_<ops>_<hash8 of key> (key: kernel_key's bytes,
// or more), the same for the CPU and CUDA code generators.
std::string kernel_symbol(const std::string& key, const Kernel& k);

// Where an instruction of a rows kernel varies: not at all (numbers, scalars), once per row (row
// reductions, per-row loads and what only they feed), per element, once per call (what depends
// on a global reduction, computed by the finish function), or once per position of a row (what
// depends on a column reduction, computed by the columns function).
enum class Level : uint8_t { kConst, kRow, kElement, kGlobal, kColumn };
std::vector<Level> instr_levels(const Kernel& k);
// The pass over a row in which each instruction is first available: row reductions of a value
// available in pass s give their result from pass s + 1 on (column and global reductions fold in
// the last pass and give theirs after every row).
std::vector<int32_t> instr_stages(const Kernel& k);

}  // namespace kiln::fuser
