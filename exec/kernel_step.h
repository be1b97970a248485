// Running a kernel step: the layout, pointers, sizes and strides of one call of a fused group's
// kernel (flat, strided, or rows), handed to its device's kernels.
#pragma once

#include <vector>

#include "exec/plan_step.h"

namespace kiln::jit {

// Runs the group's kernel from `args` into `outs` (a join's value whole: its pieces are written
// in their slices); returns the kernel's symbol, or null when nothing ran.
const char* run_kernel_step(const PlanStep& step, const KernelStep& k,
                            const std::vector<Tensor>& args, const std::vector<Tensor>& outs);

}  // namespace kiln::jit
