// DistributedDataParallel: parameters broadcast from rank 0, gradients averaged in buckets while
// the backward runs (torch's Reducer, reduced to its core).
//
// Parameters are grouped into buckets in reverse registration order (a backward produces the last
// layers' gradients first), per dtype, up to bucket_cap_mb each. A hook after each leaf's gradient
// accumulation copies the gradient into its bucket's flat buffer; a full bucket is handed to the
// process group's thread as one averaging all-reduce, in bucket order on every rank, while the
// backward computes the next gradients. When the last parameter's gradient arrived the hook waits
// for the buckets and writes the averages back into each .grad.
//
// Inside jit::trace the same hooks record the step instead: a complete bucket becomes the cat of
// its gradients and a recorded all_reduce of it (functional.cpp), an op of the traced graph that
// each replay runs, and the averages are written into each .grad as recorded in-place writes. The
// arithmetic is eager mode's (the same gradients in the same flat layout, averaged by the same
// call), so a replayed step gives eager DDP's result bit for bit. Whether the step synchronizes is
// read as a traced flag: a traced step serves calls inside no_sync() by a specialization of its
// own, traced there without collectives.
#include <algorithm>
#include <cstring>

#include "kiln/autograd.h"
#include "kiln/distributed.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/autograd_hooks.h"
#include "lib/distributed/internal.h"
#include "lib/lazy.h"

namespace kiln::nn::parallel {

using distributed::ProcessGroup;
using distributed::ReduceOp;
using distributed::Work;

struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<size_t> params;    // indices into Reducer::params
    std::vector<int64_t> offsets;  // of each parameter's gradient in flat
    int64_t numel = 0;
    DType dtype = kFloat32;
    Device device = kCPU;
    size_t missing = 0;          // gradients not yet copied in during this backward
    Tensor flat;                 // this backward's gradients, then their averages
    std::shared_ptr<Work> work;  // none when the reduction was recorded inside jit::trace
    std::vector<Tensor> traced;  // inside jit::trace: the gradients, per entry of params
  };

  std::weak_ptr<Reducer> self;  // the owner of the no_sync flag a traced step reads
  std::shared_ptr<ProcessGroup> group;
  std::vector<std::string> names;  // of the parameters that require grad
  std::vector<Tensor> params;
  std::vector<std::shared_ptr<detail::Node>> accumulators;  // own the hooks
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // per parameter
  std::vector<bool> ready;        // per parameter, during a backward
  size_t num_ready = 0;
  size_t next_launch = 0;  // buckets are reduced in order
  bool sync = true;

  // As torch: the first bucket holds at most 1 MiB, so that communication starts early in the
  // backward; the others up to cap_mb.
  void make_buckets(double cap_mb) {
    const auto cap = static_cast<int64_t>(cap_mb * 1024 * 1024);
    const int64_t first_cap = std::min<int64_t>(cap, 1 << 20);
    bucket_of.assign(params.size(), 0);
    std::vector<size_t> open;  // the bucket being filled, per dtype
    for (size_t k = params.size(); k-- > 0;) {
      const Tensor& p = params[k];
      const int64_t bytes = p.numel() * int64_t(p.element_size());
      auto same_kind = [&](size_t b) {
        return buckets[b].dtype == p.dtype() && buckets[b].device == p.device();
      };
      auto it = std::find_if(open.begin(), open.end(), same_kind);
      if (it != open.end()) {
        const Bucket& current = buckets[*it];
        const int64_t limit = *it == 0 ? first_cap : cap;
        if (current.numel > 0 && current.numel * int64_t(p.element_size()) + bytes > limit) {
          open.erase(it);
          it = open.end();
        }
      }
      if (it == open.end()) {
        buckets.emplace_back();
        buckets.back().dtype = p.dtype();
        buckets.back().device = p.device();
        open.push_back(buckets.size() - 1);
        it = open.end() - 1;
      }
      Bucket& bucket = buckets[*it];
      bucket.params.push_back(k);
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += p.numel();
      bucket_of[k] = *it;
    }
    reset();
  }

  void reset() {
    ready.assign(params.size(), false);
    num_ready = 0;
    next_launch = 0;
    for (Bucket& b : buckets) {
      b.missing = b.params.size();
      b.flat = Tensor();
      b.work = nullptr;
      b.traced.assign(b.params.size(), Tensor());
    }
  }

  // The hook: parameter k's gradient is complete for this backward.
  void on_gradient(size_t k, const Tensor& param) {
    const bool tracing = detail::trace_mode();
    if (!(tracing ? traced_sync() : sync)) return;
    KILN_CHECK(!ready[k], "DistributedDataParallel: parameter '", names[k],
               "' received a gradient twice in one backward (a backward with retain_graph run "
               "again, or a second backward before the first one's gradients were all produced)");
    ready[k] = true;
    ++num_ready;
    Bucket& bucket = buckets[bucket_of[k]];
    size_t pos = 0;
    while (bucket.params[pos] != k) ++pos;
    if (tracing) {
      bucket.traced[pos] = param.grad().detach();
    } else {
      if (!bucket.flat.defined()) {
        bucket.flat =
            kiln::empty({bucket.numel}, TensorOptions(bucket.dtype).device(bucket.device));
        if (!bucket.device.is_cuda()) bucket.flat.raw_data_ptr();
      }
      copy_into_bucket(bucket, bucket.offsets[pos], param);
    }
    --bucket.missing;
    while (next_launch < buckets.size() && buckets[next_launch].missing == 0)
      launch(buckets[next_launch++], tracing);
    if (num_ready == params.size()) finish();
  }

  // Whether this backward synchronizes, read inside jit::trace as a flag each call checks.
  bool traced_sync() {
    return detail::traced_flag(
        "DistributedDataParallel synchronizing (outside no_sync())",
        [w = self] {
          auto r = w.lock();
          return r && r->sync;
        },
        self);
  }

  // Starts averaging a complete bucket: CPU buckets in place on the group's thread, CUDA ones
  // through NCCL's staged all-reduce; inside jit::trace, a recorded all_reduce of the bucket.
  void launch(Bucket& b, bool tracing) {
    if (tracing) {
      NoGradGuard no_grad;
      std::vector<Tensor> flat;
      for (const Tensor& g : b.traced) flat.push_back(g.reshape({g.numel()}));
      b.flat = distributed::functional::all_reduce(kiln::cat(flat, 0), ReduceOp::AVG, group);
      b.traced.assign(b.params.size(), Tensor());
      return;
    }
    b.work = b.device.is_cuda() ? group->allreduce(b.flat, ReduceOp::AVG)
                                : distributed::allreduce_buffer(*group, b.flat, ReduceOp::AVG);
  }

  static void copy_into_bucket(Bucket& bucket, int64_t offset, const Tensor& param) {
    const int64_t n = param.numel();
    if (bucket.device.is_cuda()) {
      NoGradGuard no_grad;
      bucket.flat.narrow(0, offset, n).copy_(param.grad().detach().reshape({n}));
      return;
    }
    // The CPU bucket's memory is written directly: it is computed and nothing else reads it.
    Tensor g = param.grad().detach().contiguous();
    std::memcpy(
        static_cast<char*>(bucket.flat.raw_data_ptr()) + offset * int64_t(param.element_size()),
        g.raw_data_ptr(), n * param.element_size());
  }

  void finish() {
    NoGradGuard no_grad;
    for (Bucket& b : buckets) {
      if (b.work) b.work->wait();
      for (size_t i = 0; i < b.params.size(); ++i) {
        Tensor& p = params[b.params[i]];
        p.mutable_grad().copy_(b.flat.narrow(0, b.offsets[i], p.numel()).view(p.sizes()));
      }
    }
    reset();
  }

  void check_previous_backward() const {
    if (num_ready == 0) return;
    std::string missing;
    for (size_t k = 0; k < params.size(); ++k) {
      if (!ready[k]) missing += (missing.empty() ? "" : ", ") + names[k];
    }
    KILN_FAIL("DistributedDataParallel: the previous backward produced no gradient for ", missing,
              "; every parameter that requires grad must take part in the loss");
  }
};

namespace {

// Every rank must hold parameters of the same number and sizes: otherwise buckets would average
// unrelated gradients, or the collectives would disagree on their sizes.
void verify_same_parameters(Module& module, ProcessGroup& group) {
  std::vector<Tensor> params = module.parameters();
  std::vector<int64_t> summary = {int64_t(params.size()), 0};
  for (const Tensor& p : params) summary[1] += p.numel();
  // On the parameters' device: the NCCL group takes CUDA tensors only.
  const Device device = params.empty() ? kCPU : params[0].device();
  Tensor local = from_vector(summary).to(device);
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r)
    all.push_back(zeros({2}, TensorOptions(kInt64).device(device)));
  group.allgather(all, local)->wait();
  for (int r = 0; r < group.size(); ++r) {
    std::vector<int64_t> theirs = all[r].to_vector<int64_t>();
    KILN_CHECK(theirs == summary, "DistributedDataParallel: rank ", r, " has ", theirs[0],
               " parameters of ", theirs[1], " elements in all, rank ", group.rank(), " has ",
               summary[0], " of ", summary[1], ": every rank must wrap the same model");
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 double bucket_cap_mb)
    : module_(std::move(module)), reducer_(std::make_shared<Reducer>()) {
  KILN_CHECK(module_, "DistributedDataParallel: no module");
  reducer_->group = group ? std::move(group) : distributed::default_group();
  verify_same_parameters(*module_, *reducer_->group);
  // Every rank starts from rank 0's parameters and buffers.
  std::vector<std::pair<Tensor, std::shared_ptr<Work>>> pending;
  for (Tensor t : module_->parameters()) pending.emplace_back(t, reducer_->group->broadcast(t, 0));
  for (Tensor t : module_->buffers()) pending.emplace_back(t, reducer_->group->broadcast(t, 0));
  for (auto& [t, work] : pending) work->wait();

  Reducer& r = *reducer_;
  r.self = reducer_;
  for (auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    r.names.push_back(name);
    r.params.push_back(p);
  }
  r.make_buckets(bucket_cap_mb);
  for (size_t k = 0; k < r.params.size(); ++k) {
    // A graph built before this module was dropped may still reach the accumulator.
    std::weak_ptr<Reducer> self = reducer_;
    r.accumulators.push_back(
        detail::add_post_accumulate_grad_hook(r.params[k], [self, k](const Tensor& param) {
          if (auto reducer = self.lock()) reducer->on_gradient(k, param);
        }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  // Waits for reductions still in flight: they write into buffers the reducer owns.
  for (auto& b : reducer_->buckets) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const std::exception&) {
    }
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  reducer_->check_previous_backward();
  return module_->forward(input);
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_indices() const {
  std::vector<std::vector<size_t>> out;
  // Reducer indices count parameters that require grad; parameters() counts them all.
  std::vector<size_t> position;
  std::vector<Tensor> all = module_->parameters();
  for (const Tensor& p : reducer_->params) {
    size_t i = 0;
    while (!all[i].is_same(p)) ++i;
    position.push_back(i);
  }
  for (const auto& b : reducer_->buckets) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(position[k]);
  }
  return out;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->sync) {
  ddp_.reducer_->sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  ddp_.reducer_->sync = previous_;
}

}  // namespace kiln::nn::parallel
