// init_process_group and the collectives on the default group (torch.distributed's functions), and
// the rendezvous checks every rank makes at init.
#include <cstdlib>
#include <mutex>
#include <thread>

#include "kiln/distributed.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/distributed/internal.h"
#include "lib/distributed/state.h"
#include "lib/lazy.h"

namespace kiln::distributed {

DistributedState& distributed_state() {
  static auto* state = new DistributedState();
  return *state;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string join(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// Every rank publishes its world size and backend and reads the others', raising as soon as one
// disagrees, or naming the ranks still missing at the timeout.
void rendezvous_check(Store& store, const std::string& prefix, const std::string& backend, int rank,
                      int world_size, std::chrono::milliseconds timeout) {
  std::string mine = std::to_string(world_size) + " " + backend;
  store.set(prefix + "init/" + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  std::vector<bool> seen(world_size, false);
  auto deadline = Clock::now() + timeout;
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
      if (seen[r]) continue;
      std::string key = prefix + "init/" + std::to_string(r);
      if (!store.check({key})) {
        missing.push_back(r);
        continue;
      }
      std::vector<char> v = store.get(key);
      std::string theirs(v.begin(), v.end());
      KILN_CHECK(theirs == mine, "init_process_group: rank ", r,
                 " was started with (world_size, backend) = (", theirs, "), rank ", rank, " with (",
                 mine, ")");
      seen[r] = true;
    }
    if (missing.empty()) return;
    KILN_CHECK(Clock::now() < deadline, "init_process_group: rank ", rank, " of ", world_size,
               ": rank(s) ", join(missing), " did not arrive within ", timeout.count(), " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  KILN_CHECK(v && *v, "init_process_group: the environment variable ", name, " is not set (set ",
             "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, or start with tools/kiln-run)");
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  KILN_CHECK(*end == '\0', "init_process_group: ", name, "='", v, "' is not an integer");
  return static_cast<int>(n);
}

std::shared_ptr<ProcessGroup> group_or_default() {
  std::lock_guard<std::mutex> lock(distributed_state().groups_mu);
  KILN_CHECK(distributed_state().default_group,
             "kiln::distributed: no default process group; call init_process_group first");
  return distributed_state().default_group;
}

// What an all_reduce recorded inside jit::trace returns: the graph runs the collective.
class RecordedWork : public Work {
 public:
  bool is_completed() override { return true; }
  void wait() override {}
};

// Inside jit::trace: `tensor` is written a recorded collective's result; the graph runs it.
std::shared_ptr<Work> recorded(Tensor& tensor, const Tensor& value) {
  traced_write(tensor, value);
  return std::make_shared<RecordedWork>();
}

std::shared_ptr<Work> finish(std::shared_ptr<Work> work, bool async_op) {
  if (!async_op) work->wait();
  return work;
}

}  // namespace

Tensor receive_buffer(int64_t numel, const Tensor& like) {
  Tensor buffer = empty({numel}, TensorOptions(like.dtype()).device(like.device()));
  buffer.raw_data_ptr();  // allocated here, on the calling thread
  return buffer;
}

std::vector<Tensor> reduce_scatter_inputs(const Tensor& output, const std::vector<Tensor>& inputs,
                                          ReduceOp op, int group_size) {
  KILN_CHECK(static_cast<int>(inputs.size()) == group_size, "reduce_scatter: ", inputs.size(),
             " input tensors for a group of ", group_size, " ranks");
  KILN_CHECK(op != ReduceOp::AVG || output.is_floating_point(),
             "reduce_scatter: ReduceOp::AVG needs a floating-point tensor, got ",
             dtype_name(output.dtype()));
  std::vector<Tensor> flat;
  for (const Tensor& in : inputs) {
    KILN_CHECK(in.numel() == output.numel() && in.dtype() == output.dtype(),
               "reduce_scatter: each input must have the output's ", output.numel(),
               " elements and dtype ", dtype_name(output.dtype()), ", got ", in.numel(), " of ",
               dtype_name(in.dtype()));
    flat.push_back(in.detach().reshape({in.numel()}));
  }
  return flat;
}

void check_not_tracing(const char* op) {
  KILN_CHECK(!detail::trace_state(), op,
             ": inside jit::trace only the collective functions of kiln::distributed "
             "(all_reduce, broadcast, all_gather, all_gather_into_tensor, reduce_scatter, "
             "reduce_scatter_tensor, and their functional:: forms) are graph ops; a "
             "ProcessGroup's methods and barrier are not (a replay would skip them)");
}

bool is_available(const std::string& backend, std::string* reason) {
  std::string why;
  if (backend == "gloo") {
    why = "";
  } else if (backend == "nccl") {
    why = nccl_unavailable_reason();
  } else {
    why = "unknown backend '" + backend + "' (accepted: gloo, nccl)";
  }
  if (reason) *reason = why;
  return why.empty();
}

// ------------------------------------------------------------------------------- groups

std::shared_ptr<ProcessGroup> new_group(const std::string& backend, int rank, int world_size,
                                        std::shared_ptr<Store> store,
                                        std::chrono::milliseconds timeout) {
  KILN_CHECK(store, "init_process_group: no store");
  KILN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "init_process_group: rank ", rank,
             " is not in [0, world_size ", world_size, ")");
  std::string why;
  KILN_CHECK(is_available(backend, &why), "init_process_group: backend '", backend,
             "' is unavailable: ", why);
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(distributed_state().groups_mu);
    prefix = "group" + std::to_string(distributed_state().groups_made++) + "/";
  }
  rendezvous_check(*store, prefix, backend, rank, world_size, timeout);
  if (backend == "nccl")
    return make_nccl_group(rank, world_size, std::move(store), prefix, timeout);
  return make_gloo_group(rank, world_size, std::move(store), prefix, timeout);
}

void init_process_group(const std::string& backend, int rank, int world_size,
                        std::shared_ptr<Store> store, std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(distributed_state().groups_mu);
    KILN_CHECK(!distributed_state().default_group,
               "init_process_group: the default process group is already initialized "
               "(destroy_process_group first)");
  }
  auto group = new_group(backend, rank, world_size, std::move(store), timeout);
  std::lock_guard<std::mutex> lock(distributed_state().groups_mu);
  distributed_state().default_group = std::move(group);
}

void init_process_group(const std::string& backend, std::chrono::milliseconds timeout) {
  // torchrun's variables (not KILN_ flags: they are the launcher's contract, read where used).
  int rank = env_int("RANK"), world_size = env_int("WORLD_SIZE"), port = env_int("MASTER_PORT");
  const char* addr = std::getenv("MASTER_ADDR");
  KILN_CHECK(addr && *addr, "init_process_group: the environment variable MASTER_ADDR is not set");
  auto store = std::make_shared<TCPStore>(addr, port, rank == 0, timeout);
  init_process_group(backend, rank, world_size, std::move(store), timeout);
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(distributed_state().groups_mu);
    group.swap(distributed_state().default_group);
  }
  group.reset();  // joins the group's thread outside the lock
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(distributed_state().groups_mu);
  return distributed_state().default_group != nullptr;
}

std::shared_ptr<ProcessGroup> default_group() {
  return group_or_default();
}

int get_rank() {
  return group_or_default()->rank();
}

int get_world_size() {
  return group_or_default()->size();
}

int get_local_rank() {
  const char* v = std::getenv("LOCAL_RANK");
  return v && *v ? std::atoi(v) : 0;
}

// -------------------------------------------------------------------- default-group calls

std::shared_ptr<Work> barrier(bool async_op) {
  return finish(group_or_default()->barrier(), async_op);
}

std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOp op, bool async_op) {
  if (detail::trace_mode()) return recorded(tensor, functional::all_reduce(tensor, op));
  return finish(group_or_default()->allreduce(tensor, op), async_op);
}

std::shared_ptr<Work> broadcast(Tensor& tensor, int src, bool async_op) {
  if (detail::trace_mode()) return recorded(tensor, functional::broadcast(tensor, src));
  return finish(group_or_default()->broadcast(tensor, src), async_op);
}

std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs, const Tensor& input, bool async_op) {
  if (!detail::trace_mode()) return finish(group_or_default()->allgather(outputs, input), async_op);
  // Traced: one gather of equal pieces (the graph op's), each written into its output.
  const int64_t n = input.numel();
  KILN_CHECK(static_cast<int>(outputs.size()) == get_world_size(), "all_gather: ", outputs.size(),
             " output tensors for a group of ", get_world_size(), " ranks");
  for (const Tensor& o : outputs)
    KILN_CHECK(o.defined() && o.numel() == n && o.dtype() == input.dtype(),
               "all_gather inside jit::trace: every output must have the input's ", n,
               " elements and dtype ", dtype_name(input.dtype()),
               " (uneven gathers are not graph ops), got ", o.defined() ? o.numel() : 0);
  Tensor gathered = functional::all_gather_into_tensor(input.reshape({n}));
  for (size_t r = 0; r < outputs.size(); ++r)
    traced_write(outputs[r], gathered.narrow(0, static_cast<int64_t>(r) * n, n));
  return std::make_shared<RecordedWork>();
}

std::shared_ptr<Work> all_gather_into_tensor(Tensor& output, const Tensor& input, bool async_op) {
  auto group = group_or_default();
  int64_t n = input.numel();
  KILN_CHECK(output.numel() == n * group->size(), "all_gather_into_tensor: output has ",
             output.numel(), " elements, expected ", group->size(), " x ", n);
  if (detail::trace_mode())
    return recorded(output, functional::all_gather_into_tensor(input.reshape({n})));
  KILN_CHECK(output.is_contiguous(), "all_gather_into_tensor: the output must be contiguous");
  std::vector<Tensor> pieces = output.view({output.numel()}).split(std::max<int64_t>(n, 1));
  pieces.resize(group->size(), output.view({output.numel()}).narrow(0, 0, 0));
  return finish(group->allgather(pieces, input), async_op);
}

std::shared_ptr<Work> reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op,
                                     bool async_op) {
  if (!detail::trace_mode())
    return finish(group_or_default()->reduce_scatter(output, inputs, op), async_op);
  const std::vector<Tensor> flat = reduce_scatter_inputs(output, inputs, op, get_world_size());
  return recorded(output, functional::reduce_scatter_tensor(kiln::cat(flat, 0), op));
}

std::shared_ptr<Work> reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op,
                                            bool async_op) {
  auto group = group_or_default();
  int64_t n = output.numel();
  KILN_CHECK(input.numel() == n * group->size(), "reduce_scatter_tensor: input has ", input.numel(),
             " elements, expected ", group->size(), " x ", n);
  if (detail::trace_mode())
    return recorded(output, functional::reduce_scatter_tensor(input.reshape({input.numel()}), op));
  std::vector<Tensor> pieces;
  Tensor flat = input.reshape({input.numel()});
  for (int r = 0; r < group->size(); ++r) pieces.push_back(flat.narrow(0, r * n, n));
  return finish(group->reduce_scatter(output, pieces, op), async_op);
}

}  // namespace kiln::distributed
