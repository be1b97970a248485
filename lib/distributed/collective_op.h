// The collectives of the op table (all_reduce, broadcast, all_gather_into_tensor,
// reduce_scatter_tensor; lib/distributed/functional.cpp), as the JIT sees them: ops with side
// effects that start their work and finish it later.
//
// A plan's step for a collective starts it (on the group's thread, or NCCL's stream) and goes on;
// the step that first reads its result waits for it, so a replayed DDP step reduces a bucket while
// the rest of the backward runs, as eager DDP's hooks do (exec/executor.h).
#pragma once

#include <functional>
#include <vector>

#include "kiln/tensor.h"
#include "lib/op_table.h"

namespace kiln::detail {

// A collective in flight: its outputs are not to be read before wait() returned.
struct StartedCollective {
  std::vector<Tensor> outputs;
  std::function<void()> wait;  // completes the outputs; raises the collective's error
};

using StartCollective = StartedCollective (*)(const std::vector<Tensor>& inputs,
                                              const Attrs& attrs);

// The collective's start, or null for an op that is no collective. The op's invoke is start
// followed by wait.
StartCollective collective_start(const OpDef& op);

}  // namespace kiln::detail
