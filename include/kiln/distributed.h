// Collectives between processes (torch.distributed's model): a rendezvous store, process groups on
// Gloo (CPU tensors, TCP) or NCCL (CUDA tensors, loaded on first use), and DistributedDataParallel.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::distributed {

constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

// A key-value store the ranks meet through. get() and wait() block until the keys exist, up to
// the store's timeout, then raise kiln::Error naming the missing keys.
class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  // True when every key exists now (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_;
};

// Files in a directory every rank sees (one machine, or a shared file system): Gloo's FileStore.
class FileStore : public Store {
 public:
  explicit FileStore(const std::string& path, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A store served over TCP by the master process (is_master, usually rank 0) at host:port; the
// others connect to it, retrying until the timeout.
class TCPStore : public Store {
 public:
  TCPStore(const std::string& host, int port, bool is_master,
           std::chrono::milliseconds timeout = kDefaultTimeout);
  ~TCPStore() override;
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  int port() const;  // the port served (useful with port 0 on the master)
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class ReduceOp { SUM, AVG, MAX, MIN };

// The completion of a collective. wait() blocks until it finished, copies the result into the
// tensors it writes and raises the collective's error, if any. A synchronous call returns a
// completed Work.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait() = 0;
};

// Ranks that run collectives together. Collectives run in the order they are called, on a thread
// of the group's own (the async variants overlap with the caller); every rank must call the same
// collectives in the same order. Pending tensors are computed first; results are written into
// the given tensors in place.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  virtual std::shared_ptr<Work> barrier() = 0;
  virtual std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, int root) = 0;
  // outputs[r] receives rank r's input; their sizes may differ between ranks (uneven gathers).
  virtual std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // output receives the reduction of every rank's inputs[rank()].
  virtual std::shared_ptr<Work> reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                               ReduceOp op) = 0;
};

// Creates the default group: "gloo" (CPU tensors) or "nccl" (CUDA tensors). Every rank checks that
// the others agree on the world size and backend; a rank missing after the store's timeout is
// named in the error.
void init_process_group(const std::string& backend, int rank, int world_size,
                        std::shared_ptr<Store> store,
                        std::chrono::milliseconds timeout = kDefaultTimeout);
// The same from the environment torchrun and tools/kiln-run set: MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE (rank 0 serves a TCPStore).
void init_process_group(const std::string& backend,
                        std::chrono::milliseconds timeout = kDefaultTimeout);
// A group of its own, not the default one (tests, several groups in one process).
std::shared_ptr<ProcessGroup> new_group(const std::string& backend, int rank, int world_size,
                                        std::shared_ptr<Store> store,
                                        std::chrono::milliseconds timeout = kDefaultTimeout);
void destroy_process_group();
bool is_initialized();
std::shared_ptr<ProcessGroup> default_group();  // raises when none was initialized
int get_rank();
int get_world_size();
// LOCAL_RANK from the environment (0 when unset): which device this process should use.
int get_local_rank();
// True when the backend can run here; otherwise `reason` says why.
bool is_available(const std::string& backend, std::string* reason = nullptr);

// Collectives on the default group (torch.distributed's functions). With async_op the call returns
// at once and the Work completes it; otherwise the result is in place on return.
std::shared_ptr<Work> barrier(bool async_op = false);
std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                                 bool async_op = false);
std::shared_ptr<Work> broadcast(Tensor& tensor, int src, bool async_op = false);
std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs, const Tensor& input,
                                 bool async_op = false);
// output (world_size * n elements along dim 0) receives every rank's input, in rank order.
std::shared_ptr<Work> all_gather_into_tensor(Tensor& output, const Tensor& input,
                                             bool async_op = false);
std::shared_ptr<Work> reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                     ReduceOp op = ReduceOp::SUM, bool async_op = false);
// input (world_size * n elements along dim 0): output receives the reduction of slice rank().
std::shared_ptr<Work> reduce_scatter_tensor(Tensor& output, const Tensor& input,
                                            ReduceOp op = ReduceOp::SUM, bool async_op = false);

// Collectives that return their result as a new tensor and write nothing (torch's functional
// collectives). Inside jit::trace each call records an op of the graph, which every replay runs
// with the replay's buffers (in the graph's order, the same on every rank that traced the same
// function): the replay starts it and waits for it only where its result is first read, so that
// communication overlaps the steps in between. Outside jit::trace they run at once. The in-place
// functions above (on the default group) inside jit::trace are these ops followed by recorded
// writes (all_gather then only with outputs of the input's size). The results do not require
// grad: the ops have no gradient formula. A ProcessGroup's own methods and barrier inside
// jit::trace raise.
namespace functional {
Tensor all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                  std::shared_ptr<ProcessGroup> group = nullptr);
// Rank src's tensor, on every rank (each passes a tensor of the same shape and dtype).
Tensor broadcast(const Tensor& tensor, int src, std::shared_ptr<ProcessGroup> group = nullptr);
// Every rank's tensor (at least one dim, the same shape on every rank), concatenated along dim 0
// in rank order: world_size * size(0) rows.
Tensor all_gather_into_tensor(const Tensor& tensor, std::shared_ptr<ProcessGroup> group = nullptr);
// The reduction over the ranks of slice rank() of tensor's dim 0, which splits evenly over the
// ranks: size(0) / world_size rows.
Tensor reduce_scatter_tensor(const Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                             std::shared_ptr<ProcessGroup> group = nullptr);
}  // namespace functional

// How this process's Gloo collectives overlapped its other work, since the last reset:
// in_flight_seconds, from the call that issued each to its completion on the group's thread;
// computed_seconds, the CPU time the issuing thread spent meanwhile before it waited (at most the
// collective's time in flight: the work communication overlapped); waited_seconds, the time
// callers were blocked in Work::wait until completion. computed / in_flight is the share of the
// communication that overlapped computation (tools/bench/ddp_bench.cpp).
struct CommTimes {
  int64_t collectives = 0;
  double in_flight_seconds = 0;
  double computed_seconds = 0;
  double waited_seconds = 0;
};
CommTimes comm_times();
void reset_comm_times();

}  // namespace kiln::distributed

namespace kiln::nn::parallel {

// Data parallelism over a process group (torch's DistributedDataParallel): construction broadcasts
// the module's parameters and buffers from rank 0; each backward averages the gradients over the
// ranks in buckets of about bucket_cap_mb, each bucket reduced on the group's thread as soon as
// its gradients are ready, while the backward goes on. Every parameter that requires grad must get
// a gradient in each backward.
class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(std::shared_ptr<Module> module,
                                   std::shared_ptr<distributed::ProcessGroup> group = nullptr,
                                   double bucket_cap_mb = 25);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  Module& module() { return *module_; }
  std::vector<Tensor> parameters() const { return module_->parameters(); }

  // While the guard lives, backward passes accumulate gradients locally; the first backward after
  // it reduces the accumulated sums (torch's no_sync()).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  // Buckets as lists of parameter indices (into parameters()), in the order they are reduced.
  std::vector<std::vector<size_t>> bucket_indices() const;

 private:
  struct Reducer;
  std::shared_ptr<Module> module_;
  std::shared_ptr<Reducer> reducer_;  // shared: the autograd hooks hold it weakly
};

}  // namespace kiln::nn::parallel
