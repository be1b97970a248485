// all_reduce as an op of the op table, so that jit::trace records a collective as a node of its
// graph and each replay runs it (torch's functional collectives, which torch.compile traces).
//
// The op is functional: all_reduce(x) is a new tensor, x is not written. Outside a trace the public
// entry runs the collective at once, so collectives keep the program's order on every rank; inside
// one it records an "all_reduce" node whose attributes name the reduction and the process group (by
// a number of this process's registry, below). The executor runs the node through the op's invoke
// with the replay's buffer, which calls the group as DistributedDataParallel's buckets do. The
// passes treat the op as having side effects (jit/passes/rewriter.cpp): never merged, folded,
// recomputed or removed; the fuser, for which it is a library call, never fuses it.
#include <mutex>

#include "kiln/autograd.h"
#include "kiln/distributed.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/distributed/internal.h"
#include "lib/lazy.h"
#include "lib/op_table.h"

namespace kiln::distributed {
namespace {

// Groups that a recorded node names, by number. Held weakly: a graph does not keep a group alive,
// and a replay after its group was destroyed raises.
std::mutex g_registry_mu;                             // guards g_registry
std::vector<std::weak_ptr<ProcessGroup>> g_registry;  // indexed by group number

int64_t group_number(const std::shared_ptr<ProcessGroup>& group) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (size_t i = 0; i < g_registry.size(); ++i)
    if (g_registry[i].lock() == group) return static_cast<int64_t>(i);
  g_registry.push_back(group);
  return static_cast<int64_t>(g_registry.size()) - 1;
}

std::shared_ptr<ProcessGroup> group_of_number(int64_t number) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  KILN_CHECK(number >= 0 && static_cast<size_t>(number) < g_registry.size(),
             "all_reduce: no process group #", number, " in this process");
  std::shared_ptr<ProcessGroup> group = g_registry[static_cast<size_t>(number)].lock();
  KILN_CHECK(group, "all_reduce: process group #", number,
             " was destroyed; a traced function that reduces over it cannot run");
  return group;
}

// Runs the collective on a buffer of its own holding x's values: the result.
Tensor reduce_now(const Tensor& x, ReduceOp op, ProcessGroup& group) {
  NoGradGuard no_grad;
  Tensor out = x.detach().contiguous().clone();
  if (out.device().is_cuda()) {
    group.allreduce(out, op)->wait();
  } else {
    out.raw_data_ptr();  // computed here, before the group's thread reads it
    allreduce_buffer(group, out, op)->wait();
  }
  return out;
}

const detail::OpDef& all_reduce_def =
    detail::register_op({"all_reduce",
                         detail::OpKind::NN,
                         1,
                         detail::DTypeRule::Same,
                         true,
                         [](const std::vector<Tensor>& in, const detail::Attrs& a) {
                           return std::vector<Tensor>{reduce_now(
                               in.at(0), static_cast<ReduceOp>(detail::attr_int(a.at(0))),
                               *group_of_number(detail::attr_int(a.at(1))))};
                         },
                         {"op", "group"}});

}  // namespace

namespace functional {

Tensor all_reduce(const Tensor& tensor, ReduceOp op, std::shared_ptr<ProcessGroup> group) {
  KILN_CHECK(tensor.defined(), "all_reduce: undefined tensor");
  KILN_CHECK(op != ReduceOp::AVG || tensor.is_floating_point(),
             "all_reduce: ReduceOp::AVG needs a floating-point tensor, got ",
             dtype_name(tensor.dtype()));
  if (!group) group = default_group();
  if (!detail::trace_mode()) return reduce_now(tensor, op, *group);
  return detail::lazy_record1(all_reduce_def, {tensor.detach()}, {int64_t(op), group_number(group)},
                              {tensor.sizes(), tensor.dtype(), tensor.device()});
}

}  // namespace functional

void traced_all_reduce(Tensor& tensor, ReduceOp op, const std::shared_ptr<ProcessGroup>& group) {
  Tensor reduced = functional::all_reduce(tensor, op, group);
  NoGradGuard no_grad;
  tensor.copy_(reduced);
}

}  // namespace kiln::distributed
