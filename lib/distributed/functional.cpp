// The collectives as ops of the op table (all_reduce, broadcast, all_gather_into_tensor,
// reduce_scatter_tensor), so that jit::trace records each as a node of its graph and each replay
// runs it (torch's functional collectives, which torch.compile traces).
//
// The ops are functional: each returns a new tensor and writes none. Outside a trace the public
// entries run the collective at once, so collectives keep the program's order on every rank;
// inside one they record a node whose attributes name the collective's arguments and the process
// group (by a number of this process's registry, below). The executor starts the node through its
// start function (collective_op.h) with the replay's buffers and waits for it where its result is
// first read. The passes treat the ops as having side effects (jit/passes/rewriter.cpp): never
// merged, folded, recomputed or removed; the fuser, for which they are library calls, never fuses
// them.
#include <mutex>

#include "kiln/autograd.h"
#include "kiln/distributed.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/distributed/collective_op.h"
#include "lib/distributed/internal.h"
#include "lib/distributed/state.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/tensor_impl.h"

namespace kiln::distributed {
namespace {

using detail::StartedCollective;

// A group's number in distributed_state().registry, given on first use.
int64_t group_number(const std::shared_ptr<ProcessGroup>& group) {
  DistributedState& st = distributed_state();
  std::lock_guard<std::mutex> lock(st.registry_mu);
  for (size_t i = 0; i < st.registry.size(); ++i)
    if (st.registry[i].lock() == group) return static_cast<int64_t>(i);
  st.registry.push_back(group);
  return static_cast<int64_t>(st.registry.size()) - 1;
}

std::shared_ptr<ProcessGroup> group_of_number(const char* op, int64_t number) {
  DistributedState& st = distributed_state();
  std::lock_guard<std::mutex> lock(st.registry_mu);
  KILN_CHECK(number >= 0 && static_cast<size_t>(number) < st.registry.size(), op,
             ": no process group #", number, " in this process");
  std::shared_ptr<ProcessGroup> group = st.registry[static_cast<size_t>(number)].lock();
  KILN_CHECK(group, op, ": process group #", number,
             " was destroyed; a traced function that runs collectives over it cannot run");
  return group;
}

// x's values in a contiguous buffer of the collective's own, computed now.
Tensor own_copy(const Tensor& x) {
  NoGradGuard no_grad;
  Tensor out = x.detach().contiguous().clone();
  if (!out.device().is_cuda()) out.raw_data_ptr();  // computed before the group's thread reads it
  return out;
}

StartedCollective started(Tensor out, std::shared_ptr<Work> work) {
  return {{std::move(out)}, [work = std::move(work)] { work->wait(); }};
}

// The op's attributes: all_reduce (op, group), broadcast (src, group), all_gather_into_tensor
// (group), reduce_scatter_tensor (op, group).
StartedCollective start_all_reduce(const std::vector<Tensor>& in, const detail::Attrs& a) {
  auto group = group_of_number("all_reduce", detail::attr_int(a.at(1)));
  const auto op = static_cast<ReduceOp>(detail::attr_int(a.at(0)));
  Tensor out = own_copy(in.at(0));
  // A CPU buffer is reduced in place on the group's thread (as DDP's buckets are); NCCL stages.
  return started(
      out, out.device().is_cuda() ? group->allreduce(out, op) : allreduce_buffer(*group, out, op));
}

StartedCollective start_broadcast(const std::vector<Tensor>& in, const detail::Attrs& a) {
  auto group = group_of_number("broadcast", detail::attr_int(a.at(1)));
  Tensor out = own_copy(in.at(0));
  return started(out, group->broadcast(out, static_cast<int>(detail::attr_int(a.at(0)))));
}

StartedCollective start_all_gather(const std::vector<Tensor>& in, const detail::Attrs& a) {
  auto group = group_of_number("all_gather_into_tensor", detail::attr_int(a.at(0)));
  const Tensor& x = in.at(0);
  Shape sizes = x.sizes();
  sizes[0] *= group->size();
  Tensor out = empty(sizes, TensorOptions(x.dtype()).device(x.device()));
  const int64_t n = x.numel();
  std::vector<Tensor> pieces;
  for (int r = 0; r < group->size(); ++r)
    pieces.push_back(out.view({out.numel()}).narrow(0, r * n, n));
  return started(out, group->allgather(pieces, x));
}

StartedCollective start_reduce_scatter(const std::vector<Tensor>& in, const detail::Attrs& a) {
  auto group = group_of_number("reduce_scatter_tensor", detail::attr_int(a.at(1)));
  const auto op = static_cast<ReduceOp>(detail::attr_int(a.at(0)));
  const Tensor& x = in.at(0);
  Shape sizes = x.sizes();
  sizes[0] /= group->size();
  Tensor out = empty(sizes, TensorOptions(x.dtype()).device(x.device()));
  const int64_t n = out.numel();
  Tensor flat = x.detach().reshape({x.numel()});
  std::vector<Tensor> pieces;
  for (int r = 0; r < group->size(); ++r) pieces.push_back(flat.narrow(0, r * n, n));
  return started(out, group->reduce_scatter(out, pieces, op));
}

// The op's eager form: start, then wait.
template <detail::StartCollective start>
std::vector<Tensor> run_now(const std::vector<Tensor>& in, const detail::Attrs& a) {
  NoGradGuard no_grad;
  StartedCollective s = start(in, a);
  s.wait();
  return std::move(s.outputs);
}

template <detail::StartCollective start>
const detail::OpDef& define(const char* name, std::vector<std::string> attrs) {
  return detail::register_op({name, detail::OpKind::NN, 1, detail::DTypeRule::Same, true,
                              &run_now<start>, std::move(attrs)});
}

detail::OpHandle all_reduce_def;
detail::OpHandle broadcast_def;
detail::OpHandle all_gather_def;
detail::OpHandle reduce_scatter_def;

void register_collectives() {
  all_reduce_def.bind(define<start_all_reduce>("all_reduce", {"op", "group"}));
  broadcast_def.bind(define<start_broadcast>("broadcast", {"src", "group"}));
  all_gather_def.bind(define<start_all_gather>("all_gather_into_tensor", {"group"}));
  reduce_scatter_def.bind(define<start_reduce_scatter>("reduce_scatter_tensor", {"op", "group"}));
}

// Runs `def` on x at once, or records it inside jit::trace with the given result's sizes.
Tensor run_or_record(const detail::OpDef& def, const Tensor& x, detail::Attrs attrs,
                     const Shape& sizes) {
  if (!detail::trace_mode()) return def.invoke({x.detach()}, attrs)[0];
  return detail::lazy_record1(def, {x.detach()}, std::move(attrs), {sizes, x.dtype(), x.device()});
}

void check_defined(const Tensor& t, const char* op) {
  KILN_CHECK(t.defined(), op, ": undefined tensor");
}

void check_reduction(const Tensor& t, ReduceOp op, const char* name) {
  KILN_CHECK(op != ReduceOp::AVG || t.is_floating_point(), name,
             ": ReduceOp::AVG needs a floating-point tensor, got ", dtype_name(t.dtype()));
}

}  // namespace

namespace functional {

Tensor all_reduce(const Tensor& tensor, ReduceOp op, std::shared_ptr<ProcessGroup> group) {
  check_defined(tensor, "all_reduce");
  check_reduction(tensor, op, "all_reduce");
  if (!group) group = default_group();
  return run_or_record(all_reduce_def, tensor, {int64_t(op), group_number(group)}, tensor.sizes());
}

Tensor broadcast(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group) {
  check_defined(tensor, "broadcast");
  if (!group) group = default_group();
  KILN_CHECK(src >= 0 && src < group->size(), "broadcast: src ", src,
             " is not a rank of a group of ", group->size());
  return run_or_record(broadcast_def, tensor, {int64_t(src), group_number(group)}, tensor.sizes());
}

Tensor all_gather_into_tensor(const Tensor& tensor, std::shared_ptr<ProcessGroup> group) {
  check_defined(tensor, "all_gather_into_tensor");
  KILN_CHECK(tensor.dim() >= 1, "all_gather_into_tensor: needs a tensor of at least one dim, got ",
             "shape ", detail::shape_str(tensor.sizes()));
  if (!group) group = default_group();
  Shape sizes = tensor.sizes();
  sizes[0] *= group->size();
  return run_or_record(all_gather_def, tensor, {group_number(group)}, sizes);
}

Tensor reduce_scatter_tensor(const Tensor& tensor, ReduceOp op,
                             std::shared_ptr<ProcessGroup> group) {
  check_defined(tensor, "reduce_scatter_tensor");
  check_reduction(tensor, op, "reduce_scatter_tensor");
  if (!group) group = default_group();
  KILN_CHECK(tensor.dim() >= 1 && tensor.size(0) % group->size() == 0,
             "reduce_scatter_tensor: dim 0 of shape ", detail::shape_str(tensor.sizes()),
             " must split evenly over the group's ", group->size(), " ranks");
  Shape sizes = tensor.sizes();
  sizes[0] /= group->size();
  return run_or_record(reduce_scatter_def, tensor, {int64_t(op), group_number(group)}, sizes);
}

}  // namespace functional

void traced_write(Tensor& tensor, const Tensor& value) {
  NoGradGuard no_grad;
  tensor.copy_(value.reshape(tensor.sizes()));
}

}  // namespace kiln::distributed

namespace kiln::registration {
void register_collective_ops() {
  distributed::register_collectives();
}
}  // namespace kiln::registration

namespace kiln::detail {

StartCollective collective_start(const OpDef& op) {
  using namespace kiln::distributed;
  if (&op == &all_reduce_def.get()) return start_all_reduce;
  if (&op == &broadcast_def.get()) return start_broadcast;
  if (&op == &all_gather_def.get()) return start_all_gather;
  if (&op == &reduce_scatter_def.get()) return start_reduce_scatter;
  return nullptr;
}

}  // namespace kiln::detail
