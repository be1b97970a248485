// Internals shared by the distributed sources: kiln's Store seen as Gloo's, the group makers.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "kiln/distributed.h"

namespace kiln::distributed {

// Gloo's rendezvous speaks to any kiln Store through this.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(kiln::distributed::Store& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  kiln::distributed::Store& store_;
};

// Raises when called inside jit::trace: a ProcessGroup's own methods and barrier are no graph
// ops (only the functions of kiln/distributed.h are, see functional.cpp); a replay would skip them
// (and their results would be constants of the trace).
void check_not_tracing(const char* op);

// A collective in place inside jit::trace: tensor is written `value` (the result of a recorded
// functional collective, reshaped to tensor's sizes), a write the trace records functionally.
void traced_write(Tensor& tensor, const Tensor& value);

// A collective's receive buffer: `numel` elements of `like`'s dtype on its device, allocated now
// and never read before the collective writes it (so, unlike a staged input, not copied).
Tensor receive_buffer(int64_t numel, const Tensor& like);

// reduce_scatter's inputs, checked against the output and the group's size (every backend), each
// flattened to one dim for the backend to concatenate.
std::vector<Tensor> reduce_scatter_inputs(const Tensor& output, const std::vector<Tensor>& inputs,
                                          ReduceOp op, int group_size);

// Why NCCL cannot run in this process ("" when it can): no CUDA driver or device, or no
// libnccl.so.2. Loads NCCL on the first call.
const std::string& nccl_unavailable_reason();

// all_reduce straight on `buffer`'s memory, skipping the staging copies: the caller owns buffer (a
// contiguous CPU tensor whose value is computed), and neither reads nor writes it until the Work
// completes. DistributedDataParallel's buckets.
std::shared_ptr<Work> allreduce_buffer(ProcessGroup& group, const Tensor& buffer, ReduceOp op);

std::shared_ptr<ProcessGroup> make_nccl_group(int rank, int world_size,
                                              std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              std::chrono::milliseconds timeout);
std::shared_ptr<ProcessGroup> make_gloo_group(int rank, int world_size,
                                              std::shared_ptr<Store> store,
                                              const std::string& prefix,
                                              std::chrono::milliseconds timeout);

}  // namespace kiln::distributed
