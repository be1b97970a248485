// The Gloo process group: CPU collectives over Gloo's TCP transport, run in call order on a thread
// of the group's own (as c10d's ProcessGroupGloo), so that async collectives overlap the caller.
//
// A collective stages its tensors on the calling thread (computing pending ones into contiguous
// buffers of its own), runs Gloo's algorithm on the buffers on the group's thread, and copies the
// results back into the caller's tensors in Work::wait, on the calling thread (an ordinary
// in-place kiln write, which orders itself with the tensor's pending readers).
//
// Naming the rank that did not arrive: before each collective a rank writes its number to the
// store ("arrived/<rank>"). When Gloo fails (a peer closed its connections, or the timeout
// passed), the rank reads the others' numbers and names those behind its own.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/distributed/internal.h"
#include "lib/distributed/state.h"

namespace kiln::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using GlooFn = void (*)(void*, const void*, const void*, size_t);
using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

template <typename T>
ReduceFn typed_reduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::MAX:
      return static_cast<GlooFn>(&gloo::max<T>);
    case ReduceOp::MIN:
      return static_cast<GlooFn>(&gloo::min<T>);
    default:
      return static_cast<GlooFn>(&gloo::sum<T>);  // AVG divides the sum afterwards
  }
}

// Bool as torch reduces it: SUM and MAX are a logical or, MIN a logical and.
ReduceFn bool_reduce(ReduceOp op) {
  bool is_and = op == ReduceOp::MIN;
  return [is_and](void* c, const void* a, const void* b, size_t n) {
    auto* out = static_cast<uint8_t*>(c);
    auto* x = static_cast<const uint8_t*>(a);
    auto* y = static_cast<const uint8_t*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = is_and ? (x[i] && y[i]) : (x[i] || y[i]);
  };
}

// This thread's CPU time: the work a caller did between issuing a collective and waiting for it
// (its wall time would count the time the scheduler gave other threads, on a loaded machine).
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A collective's completion: what wait() does once the group's thread is done with it (copy the
// results into the caller's tensors, on the caller's thread).
class GlooWork : public Work {
 public:
  explicit GlooWork(std::function<void()> finish) : finish_(std::move(finish)) {}

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  void wait() override {
    const Clock::time_point start = Clock::now();
    const double cpu = thread_cpu_seconds();
    Clock::time_point completed;
    bool first = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return done_; });
      completed = completed_;
      first = !waited_;
      waited_ = true;
    }
    if (first) {
      // Blocked until the collective completed (the wake-up after it is the scheduler's); the
      // issuing thread's work meanwhile, at most the collective's time in flight.
      const double in_flight = std::chrono::duration<double>(completed - issued_).count();
      DistributedState& st = distributed_state();
      std::lock_guard<std::mutex> lock(st.times_mu);
      st.times.waited_seconds +=
          std::max(0.0, std::chrono::duration<double>(completed - start).count());
      if (std::this_thread::get_id() == issuer_)
        st.times.computed_seconds += std::clamp(cpu - issued_cpu_, 0.0, in_flight);
    }
    if (error_) std::rethrow_exception(error_);
    if (finish_) {
      auto finish = std::move(finish_);
      finish_ = nullptr;
      finish();
    }
  }

  void complete(std::exception_ptr error) {
    const Clock::time_point now = Clock::now();
    {
      DistributedState& st = distributed_state();
      std::lock_guard<std::mutex> lock(st.times_mu);
      ++st.times.collectives;
      st.times.in_flight_seconds += std::chrono::duration<double>(now - issued_).count();
    }
    std::lock_guard<std::mutex> lock(mu_);
    completed_ = now;
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }

 private:
  std::function<void()> finish_;  // used by the waiting thread only
  const Clock::time_point issued_ = Clock::now();
  const double issued_cpu_ = thread_cpu_seconds();
  const std::thread::id issuer_ = std::this_thread::get_id();
  std::mutex mu_;  // guards done_, error_, completed_ and waited_
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  Clock::time_point completed_;
  bool waited_ = false;
};

// The collective number a rank reached, as its arrival record in the store holds it.
std::vector<char> encode(uint64_t n) {
  std::string s = std::to_string(n);
  return std::vector<char>(s.begin(), s.end());
}

// A tensor's values in a contiguous CPU buffer of the collective's own, computed now.
Tensor stage(const Tensor& t, const char* op) {
  check_not_tracing(op);
  KILN_CHECK(t.defined(), op, ": undefined tensor");
  KILN_CHECK(!t.device().is_cuda(), op,
             ": the gloo backend takes CPU tensors; a CUDA tensor needs the nccl backend");
  NoGradGuard no_grad;
  Tensor s = t.detach().contiguous().clone();
  KILN_CHECK(s.is_contiguous(), op, ": internal: staged buffer is not contiguous");
  s.raw_data_ptr();  // computes a pending value here, on the calling thread
  return s;
}

void write_back(Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  dst.copy_(src.view(dst.sizes()));
}

// The address this rank's Gloo device listens on, which its peers connect to: loopback when every
// rank is on this machine (a file store, or a TCP store served on loopback), the host name
// otherwise.
std::string transport_hostname(const Store& store) {
  auto* tcp = dynamic_cast<const TCPStore*>(&store);
  if (!tcp || tcp->host() == "127.0.0.1" || tcp->host() == "localhost" || tcp->host() == "::1")
    return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Gloo's TCP pairs write with writev, which raises SIGPIPE on a connection whose peer has gone (a
// rank that exited mid-step): by default that kills this rank before Gloo can report the error
// that names the missing rank. Python, and so torch's ProcessGroupGloo, ignores SIGPIPE; a
// program that installed a handler of its own keeps it.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
}

class GlooGroup : public ProcessGroup {
 public:
  GlooGroup(int rank, int size, std::shared_ptr<Store> store, const std::string& prefix,
            std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), store_(std::move(store)), prefix_(prefix), timeout_(timeout) {
    adapter_ = std::make_unique<GlooStoreAdapter>(*store_);
    prefixed_ = std::make_unique<gloo::rendezvous::PrefixStore>(prefix_ + "gloo", *adapter_);
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME")) {
      attr.iface = iface;  // torch's variable for the interface Gloo listens on
    } else {
      attr.hostname = transport_hostname(*store_);
    }
    ignore_sigpipe();
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout_);
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      context->connectFullMesh(*prefixed_, device);
    } catch (const std::exception& e) {
      KILN_FAIL("init_process_group: rank ", rank_, " could not connect to its peers: ", e.what());
    }
    context_ = context;
    thread_ = std::thread([this] { loop(); });
  }

  ~GlooGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }

  std::shared_ptr<Work> barrier() override {
    check_not_tracing("barrier");
    return enqueue(
        "barrier",
        [ctx = context_](uint32_t tag) {
          gloo::BarrierOptions opts(ctx);
          opts.setTag(tag);
          gloo::barrier(opts);
        },
        nullptr);
  }

  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) override {
    KILN_CHECK(op != ReduceOp::AVG || tensor.is_floating_point(),
               "all_reduce: ReduceOp::AVG needs a floating-point tensor, got ",
               dtype_name(tensor.dtype()));
    Tensor buf = stage(tensor, "all_reduce");
    return enqueue("all_reduce", reduce_task(buf, op),
                   [tensor, buf]() mutable { write_back(tensor, buf); });
  }

  // all_reduce on a buffer the caller owns (see allreduce_buffer in internal.h): no staging.
  std::shared_ptr<Work> allreduce_buffer(const Tensor& buffer, ReduceOp op) {
    check_not_tracing("all_reduce");
    return enqueue("all_reduce", reduce_task(buffer, op), nullptr);
  }

  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override {
    KILN_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ",
               size_);
    Tensor buf = stage(tensor, "broadcast");
    auto run = [ctx = context_, buf, root](uint32_t tag) {
      if (buf.numel() == 0) return;
      gloo::BroadcastOptions opts(ctx);
      opts.setOutput(static_cast<char*>(buf.raw_data_ptr()), buf.numel() * buf.element_size());
      opts.setRoot(root);
      opts.setTag(tag);
      gloo::broadcast(opts);
    };
    return enqueue("broadcast", run, [tensor, buf]() mutable { write_back(tensor, buf); });
  }

  std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) override {
    KILN_CHECK(static_cast<int>(outputs.size()) == size_, "all_gather: ", outputs.size(),
               " output tensors for a group of ", size_, " ranks");
    Tensor in = stage(input, "all_gather");
    std::vector<size_t> bytes;
    size_t total = 0;
    for (const Tensor& o : outputs) {
      KILN_CHECK(o.defined() && o.dtype() == input.dtype(),
                 "all_gather: outputs must be defined and of the input's dtype ",
                 dtype_name(input.dtype()));
      bytes.push_back(o.numel() * o.element_size());
      total += bytes.back();
    }
    KILN_CHECK(outputs[rank_].numel() == input.numel(), "all_gather: output ", rank_, " has ",
               outputs[rank_].numel(), " elements, this rank's input ", input.numel());
    Tensor out = receive_buffer(static_cast<int64_t>(total / input.element_size()), input);
    auto run = [ctx = context_, in, out, bytes, total](uint32_t tag) {
      if (total == 0) return;
      gloo::AllgathervOptions opts(ctx);
      opts.setInput(static_cast<char*>(in.raw_data_ptr()), in.numel() * in.element_size());
      opts.setOutput(static_cast<char*>(out.raw_data_ptr()), bytes);
      opts.setTag(tag);
      gloo::allgatherv(opts);
    };
    auto finish = [outputs, out]() mutable {
      int64_t offset = 0;
      for (Tensor& o : outputs) {
        write_back(o, out.narrow(0, offset, o.numel()));
        offset += o.numel();
      }
    };
    return enqueue("all_gather", run, finish);
  }

  std::shared_ptr<Work> reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op) override {
    const std::vector<Tensor> flat = reduce_scatter_inputs(output, inputs, op, size_);
    // An all-reduce of the whole input, of which this rank keeps its slice: right for any group
    // size and dtype, at world_size times the traffic of a true reduce-scatter.
    Tensor buf = stage(kiln::cat(flat, 0), "reduce_scatter");
    auto run = reduce_task(buf, op);
    auto finish = [output, buf, n = output.numel(), rank = rank_]() mutable {
      write_back(output, buf.narrow(0, rank * n, n));
    };
    return enqueue("reduce_scatter", run, finish);
  }

 private:
  std::function<void(uint32_t)> reduce_task(const Tensor& buf, ReduceOp op) const {
    return [ctx = context_, buf, op, size = size_](uint32_t tag) {
      reduce_in_place(ctx, buf, op, tag);
      if (op == ReduceOp::AVG) divide(buf, size);
    };
  }

  template <typename T>
  static void set_output(gloo::AllreduceOptions& opts, void* p, size_t n, ReduceFn fn) {
    opts.setOutput(static_cast<T*>(p), n);
    opts.setReduceFunction(std::move(fn));
  }

  static void reduce_in_place(const std::shared_ptr<gloo::Context>& ctx, const Tensor& buf,
                              ReduceOp op, uint32_t tag) {
    if (buf.numel() == 0) return;
    gloo::AllreduceOptions opts(ctx);
    void* p = buf.raw_data_ptr();
    size_t n = static_cast<size_t>(buf.numel());
    switch (buf.dtype()) {
      case kFloat32:
        set_output<float>(opts, p, n, typed_reduce<float>(op));
        break;
      case kFloat64:
        set_output<double>(opts, p, n, typed_reduce<double>(op));
        break;
      case kInt32:
        set_output<int32_t>(opts, p, n, typed_reduce<int32_t>(op));
        break;
      case kInt64:
        set_output<int64_t>(opts, p, n, typed_reduce<int64_t>(op));
        break;
      case kBool:
        set_output<uint8_t>(opts, p, n, bool_reduce(op));
        break;
    }
    opts.setTag(tag);
    gloo::allreduce(opts);
  }

  static void divide(const Tensor& buf, int size) {
    void* p = buf.raw_data_ptr();
    int64_t n = buf.numel();
    if (buf.dtype() == kFloat32) {
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(p)[i] /= static_cast<float>(size);
    } else {
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(p)[i] /= static_cast<double>(size);
    }
  }

  struct Task {
    std::string name;
    uint64_t number;
    std::function<void(uint32_t)> body;
    std::shared_ptr<GlooWork> work;
  };

  std::shared_ptr<Work> enqueue(const char* name, std::function<void(uint32_t)> body,
                                std::function<void()> finish) {
    auto task = std::make_shared<Task>();
    task->name = name;
    task->body = std::move(body);
    task->work = std::make_shared<GlooWork>(std::move(finish));
    {
      std::lock_guard<std::mutex> lock(mu_);
      task->number = ++issued_;
      queue_.push_back(task);
    }
    cv_.notify_all();
    return task->work;
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      execute(*task);
    }
  }

  void execute(Task& task) {
    std::exception_ptr error;
    try {
      store_->set(prefix_ + "arrived/" + std::to_string(rank_), encode(task.number));
      task.body(static_cast<uint32_t>(task.number));
    } catch (const kiln::Error&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(kiln::Error(describe_failure(task, e)));
    }
    task.body = nullptr;  // releases the staged buffers the caller does not hold
    task.work->complete(error);
  }

  // Names the ranks that did not reach this collective, after a short grace for slow writers.
  std::string describe_failure(const Task& task, const std::exception& e) {
    std::string missing;
    try {
      auto deadline =
          Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(1));
      for (;;) {
        missing.clear();
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          std::string key = prefix_ + "arrived/" + std::to_string(r);
          uint64_t reached = 0;
          if (store_->check({key})) {
            std::vector<char> v = store_->get(key);
            reached = std::stoull(std::string(v.begin(), v.end()));
          }
          if (reached < task.number) {
            missing += (missing.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                       " did not arrive (its last collective was #" + std::to_string(reached) + ")";
          }
        }
        if (missing.empty() || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception& store_error) {
      missing = std::string("the store is unreachable (") + store_error.what() + ")";
    }
    if (missing.empty()) missing = "every rank arrived";
    return task.name + ": collective #" + std::to_string(task.number) + " failed on rank " +
           std::to_string(rank_) + " of " + std::to_string(size_) + " (timeout " +
           std::to_string(timeout_.count()) + " ms): " + missing + "; gloo: " + e.what();
  }

  const int rank_, size_;
  const std::shared_ptr<Store> store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<GlooStoreAdapter> adapter_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefixed_;
  std::shared_ptr<gloo::Context> context_;

  std::mutex mu_;  // guards the three below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  uint64_t issued_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // runs the queue in order
};

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_group(int rank, int world_size,
                                              std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              std::chrono::milliseconds timeout) {
  return std::make_shared<GlooGroup>(rank, world_size, std::move(store), prefix, timeout);
}

std::shared_ptr<Work> allreduce_buffer(ProcessGroup& group, const Tensor& buffer, ReduceOp op) {
  KILN_CHECK(buffer.is_contiguous() && !buffer.device().is_cuda(),
             "allreduce_buffer: needs a contiguous CPU buffer");
  if (auto* gloo = dynamic_cast<GlooGroup*>(&group)) return gloo->allreduce_buffer(buffer, op);
  Tensor t = buffer;
  return group.allreduce(t, op);
}

CommTimes comm_times() {
  DistributedState& st = distributed_state();
  std::lock_guard<std::mutex> lock(st.times_mu);
  return st.times;
}

void reset_comm_times() {
  DistributedState& st = distributed_state();
  std::lock_guard<std::mutex> lock(st.times_mu);
  st.times = CommTimes();
}

}  // namespace kiln::distributed
