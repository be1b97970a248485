// The NCCL process group: collectives on CUDA tensors through libnccl.so.2, opened with dlopen on
// first use (as lib/cuda_driver.cpp opens the driver), so that one build serves machines with and
// without GPUs. Each collective is enqueued on kiln's stream of the tensor's device, so it is
// ordered after the kernels that computed its inputs and before those that read its result;
// Work::wait synchronizes that stream and copies the result into the caller's tensor.
//
// Unlike the Gloo group, a rank that does not arrive makes the others wait (NCCL has no timeout
// of its own; torch runs a watchdog thread that aborts the communicator).
#include <dlfcn.h>

#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/cuda_driver.h"
#include "lib/distributed/internal.h"

#ifdef KILN_HAS_CUDA
#include <nccl.h>
#endif

namespace kiln::distributed {

#ifndef KILN_HAS_CUDA

const std::string& nccl_unavailable_reason() {
  static const std::string reason = "kiln was built without the CUDA toolkit";
  return reason;
}

std::shared_ptr<ProcessGroup> make_nccl_group(int, int, std::shared_ptr<Store>, const std::string&,
                                              std::chrono::milliseconds) {
  KILN_FAIL("init_process_group: backend 'nccl' is unavailable: ", nccl_unavailable_reason());
}

#else

namespace {

#define KILN_NCCL_FUNCTIONS(X) \
  X(ncclGetUniqueId)           \
  X(ncclCommInitRank)          \
  X(ncclCommDestroy)           \
  X(ncclGetErrorString)        \
  X(ncclAllReduce)             \
  X(ncclBroadcast)             \
  X(ncclReduceScatter)         \
  X(ncclGroupStart)            \
  X(ncclGroupEnd)

struct Nccl {
  std::string reason;  // why it cannot be used; empty when it can
#define KILN_NCCL_MEMBER(fn) decltype(&::fn) fn = nullptr;
  KILN_NCCL_FUNCTIONS(KILN_NCCL_MEMBER)
#undef KILN_NCCL_MEMBER
};

const Nccl& nccl() {
  static const Nccl* n = [] {
    auto* n = new Nccl();  // never destroyed: communicators may be released during exit
    const std::string& cuda = detail::cuda::unavailable_reason();
    if (!cuda.empty()) {
      n->reason = "no CUDA device: " + cuda;
      return n;
    }
    // The loader's path first, then the toolkit's own copy.
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      n->reason = std::string("NCCL (libnccl.so.2) could not be loaded: ") + (e ? e : "");
      return n;
    }
#define KILN_NCCL_LOOKUP(fn)                                            \
  n->fn = reinterpret_cast<decltype(&::fn)>(dlsym(lib, #fn));           \
  if (!n->fn) {                                                         \
    n->reason = "libnccl.so.2 lacks " #fn " (an NCCL older than 2.10)"; \
    return n;                                                           \
  }
    KILN_NCCL_FUNCTIONS(KILN_NCCL_LOOKUP)
#undef KILN_NCCL_LOOKUP
    return n;
  }();
  return *n;
}

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case kFloat32:
      return ncclFloat32;
    case kFloat64:
      return ncclFloat64;
    case kInt32:
      return ncclInt32;
    case kInt64:
      return ncclInt64;
    case kBool:
      return ncclUint8;
  }
  return ncclFloat32;
}

// Bool as torch reduces it: SUM and MAX are a logical or (a max of 0/1), MIN a logical and.
ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::SUM:
      return dtype == kBool ? ncclMax : ncclSum;
    case ReduceOp::AVG:
      return ncclAvg;
    case ReduceOp::MAX:
      return ncclMax;
    case ReduceOp::MIN:
      return ncclMin;
  }
  return ncclSum;
}

class NcclWork : public Work {
 public:
  NcclWork(int device, std::function<void()> finish)
      : device_(device),
        event_(detail::cuda::record_event(device, detail::cuda::stream(device))),
        finish_(std::move(finish)) {}
  ~NcclWork() override { detail::cuda::destroy_event(event_); }

  bool is_completed() override { return detail::cuda::event_done(event_); }

  void wait() override {
    detail::cuda::synchronize(device_);
    if (finish_) {
      auto finish = std::move(finish_);
      finish_ = nullptr;
      finish();
    }
  }

 private:
  int device_;
  void* event_;
  std::function<void()> finish_;  // used by the waiting thread only
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(int rank, int size, std::shared_ptr<Store> store, const std::string& prefix,
            std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), store_(std::move(store)) {
    // One device per process: LOCAL_RANK's, as torchrun's convention.
    device_ = get_local_rank() % detail::cuda::num_devices();
    ncclUniqueId id;
    const std::string key = prefix + "nccl_unique_id";
    if (rank_ == 0) {
      check(nccl().ncclGetUniqueId(&id), "init_process_group");
      store_->set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      store_->wait({key}, timeout);
      std::vector<char> bytes = store_->get(key);
      KILN_CHECK(bytes.size() == sizeof(id.internal), "init_process_group: a malformed NCCL id");
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    detail::cuda::set_device(device_);
    check(nccl().ncclCommInitRank(&comm_, size_, id, rank_), "init_process_group");
  }

  ~NcclGroup() override {
    detail::cuda::synchronize(device_);
    nccl().ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  std::shared_ptr<Work> barrier() override {
    Tensor token = ones({1}, Device{DeviceType::CUDA, device_});
    allreduce(token, ReduceOp::SUM)->wait();
    return std::make_shared<NcclWork>(device_, nullptr);
  }

  std::shared_ptr<Work> allreduce(Tensor& tensor, ReduceOp op) override {
    KILN_CHECK(op != ReduceOp::AVG || tensor.is_floating_point(),
               "all_reduce: ReduceOp::AVG needs a floating-point tensor, got ",
               dtype_name(tensor.dtype()));
    Tensor buf = stage(tensor, "all_reduce");
    if (buf.numel() > 0) {
      void* p = buf.raw_data_ptr();
      check(nccl().ncclAllReduce(p, p, buf.numel(), nccl_dtype(buf.dtype()),
                                 nccl_op(op, buf.dtype()), comm_, stream()),
            "all_reduce");
    }
    return std::make_shared<NcclWork>(device_,
                                      [tensor, buf]() mutable { write_back(tensor, buf); });
  }

  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override {
    KILN_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ",
               size_);
    Tensor buf = stage(tensor, "broadcast");
    if (buf.numel() > 0) {
      void* p = buf.raw_data_ptr();
      check(nccl().ncclBroadcast(p, p, buf.numel(), nccl_dtype(buf.dtype()), root, comm_, stream()),
            "broadcast");
    }
    return std::make_shared<NcclWork>(device_,
                                      [tensor, buf]() mutable { write_back(tensor, buf); });
  }

  // Each rank's piece is a broadcast from that rank, all in one NCCL group, so that pieces may
  // differ in size (ncclAllGather takes equal ones).
  std::shared_ptr<Work> allgather(std::vector<Tensor>& outputs, const Tensor& input) override {
    KILN_CHECK(static_cast<int>(outputs.size()) == size_, "all_gather: ", outputs.size(),
               " output tensors for a group of ", size_, " ranks");
    KILN_CHECK(outputs[rank_].numel() == input.numel(), "all_gather: output ", rank_, " has ",
               outputs[rank_].numel(), " elements, this rank's input ", input.numel());
    Tensor in = stage(input, "all_gather");
    int64_t total = 0;
    for (const Tensor& o : outputs) {
      KILN_CHECK(o.defined() && o.dtype() == input.dtype(),
                 "all_gather: outputs must be defined and of the input's dtype ",
                 dtype_name(input.dtype()));
      total += o.numel();
    }
    Tensor out = receive_buffer(total, input);
    char* base = static_cast<char*>(out.raw_data_ptr());
    const void* mine = in.numel() > 0 ? in.raw_data_ptr() : nullptr;
    check(nccl().ncclGroupStart(), "all_gather");
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = outputs[r].numel();
      void* dst = base + offset * int64_t(input.element_size());
      if (n > 0) {
        check(nccl().ncclBroadcast(r == rank_ ? mine : dst, dst, n, nccl_dtype(input.dtype()), r,
                                   comm_, stream()),
              "all_gather");
      }
      offset += n;
    }
    check(nccl().ncclGroupEnd(), "all_gather");
    auto finish = [outputs, out]() mutable {
      int64_t at = 0;
      for (Tensor& o : outputs) {
        write_back(o, out.narrow(0, at, o.numel()));
        at += o.numel();
      }
    };
    return std::make_shared<NcclWork>(device_, finish);
  }

  std::shared_ptr<Work> reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op) override {
    const std::vector<Tensor> flat = reduce_scatter_inputs(output, inputs, op, size_);
    Tensor in = stage(cat(flat, 0), "reduce_scatter");
    Tensor out = stage(output, "reduce_scatter");
    if (out.numel() > 0) {
      check(nccl().ncclReduceScatter(in.raw_data_ptr(), out.raw_data_ptr(), out.numel(),
                                     nccl_dtype(out.dtype()), nccl_op(op, out.dtype()), comm_,
                                     stream()),
            "reduce_scatter");
    }
    return std::make_shared<NcclWork>(device_,
                                      [output, in, out]() mutable { write_back(output, out); });
  }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(detail::cuda::stream(device_)); }

  void check(ncclResult_t r, const char* op) const {
    KILN_CHECK(r == ncclSuccess, op, ": NCCL failed on rank ", rank_, " of ", size_, ": ",
               nccl().ncclGetErrorString(r));
  }

  // A contiguous copy on this group's device, computed now (raw_data_ptr waits for the device).
  Tensor stage(const Tensor& t, const char* op) const {
    check_not_tracing(op);
    KILN_CHECK(t.defined(), op, ": undefined tensor");
    KILN_CHECK(t.device().is_cuda() && t.device().index == device_, op,
               ": the nccl backend takes tensors on cuda:", device_, " (this rank's LOCAL_RANK)");
    NoGradGuard no_grad;
    Tensor s = t.detach().contiguous().clone();
    if (s.numel() > 0) s.raw_data_ptr();
    return s;
  }

  static void write_back(Tensor& dst, const Tensor& src) {
    NoGradGuard no_grad;
    dst.copy_(src.view(dst.sizes()));
  }

  const int rank_, size_;
  const std::shared_ptr<Store> store_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

const std::string& nccl_unavailable_reason() {
  return nccl().reason;
}

std::shared_ptr<ProcessGroup> make_nccl_group(int rank, int world_size,
                                              std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              std::chrono::milliseconds timeout) {
  return std::make_shared<NcclGroup>(rank, world_size, std::move(store), prefix, timeout);
}

#endif  // KILN_HAS_CUDA

}  // namespace kiln::distributed
