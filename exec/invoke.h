// Running one graph node through its op's reference kernel, as the plan's unfused steps do.
#pragma once

#include <vector>

#include "jit/ir.h"
#include "kiln/autograd.h"
#include "kiln/tensor.h"
#include "lib/lazy.h"

namespace kiln::jit {

// Recording off and autograd off while reference kernels run; restored on exit.
struct EagerScope {
  NoGradGuard no_grad;
  detail::EvaluationScope evaluating;
  detail::RecordingOff recording_off;
};

// invoke_node (exec/executor.h) without setting up the eager scope (the caller holds one).
std::vector<Tensor> invoke_in_scope(const Node& node, const std::vector<Tensor>& inputs);

// A node on a CUDA device that no kernel of the device computes (not fused, not a GEMM, join or
// view): its reference kernel runs on copies of its inputs on the host, and its outputs are
// copied back. Correct for every op, at the price of the transfers, which KILN_PROFILE counts and
// its tips name.
std::vector<Tensor> invoke_through_host(const Node& node, const std::vector<Tensor>& inputs);

}  // namespace kiln::jit
