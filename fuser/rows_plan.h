// The passes of a rows kernel over each row, planned once from the kernel and rendered by both
// code generators (the LLVM emitter's emit_rows, the CUDA generator's rows_kernel): which
// reductions each pass folds and whether it stores the element-by-element outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "fuser/kernel.h"

namespace kiln::fuser {

struct RowsPasses {
  std::vector<Level> level;    // instr_levels
  std::vector<int32_t> stage;  // instr_stages
  // The last pass (-1: none). A row reduction folds in the pass where its operand is first
  // available; the last pass also folds the global reductions of element-level values and the
  // column reductions, and stores the outputs written element by element.
  int32_t final_pass = -1;
  std::vector<std::vector<size_t>> roots_of;  // per pass: the reductions it folds
  std::vector<bool> stores_in;                // per pass: whether it stores outputs (the last)
};

// Whether output o is stored element by element in the last pass: an element-level value, or a
// row-level one (or a constant) whose tensor has the iteration shape.
bool stored_per_element(const Kernel& k, const std::vector<Level>& level, size_t o);

// The passes of kernel k, folding the reductions `folds` accepts (the LLVM emitter folds every
// one; the CUDA generator only those some output needs).
RowsPasses plan_rows(const Kernel& k, const std::function<bool(size_t)>& folds);

}  // namespace kiln::fuser
