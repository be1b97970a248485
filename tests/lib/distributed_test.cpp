// Tests of kiln::distributed over loopback: each test starts its ranks as processes (this binary
// run again with DIST_TEST_WORKER naming a scenario), which check their results against float64
// references they compute alone and exit non-zero on a mismatch. Collectives over every dtype,
// world sizes 1-4, uneven and empty tensors; DistributedDataParallel against one process on the
// whole batch; a rank exiting or hanging mid-step; mismatched world sizes; init from torchrun's
// environment over a TCP store; NCCL's unavailability without a GPU. A traced DDP step (all_reduce
// as an op of the traced graph) against the eager DDP step, bit for bit, with and without no_sync;
// its replay overlapping each bucket's all-reduce with the rest of the backward (a recording
// group counts the plan steps in between); every other collective traced against eager.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "jit/ir.h"
#include "jit/passes/passes.h"
#include "kiln/distributed.h"
#include "kiln/jit.h"
#include "kiln/optim.h"
#include "tests/testing.h"

extern char** environ;

namespace kiln {
namespace {

namespace dist = kiln::distributed;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------ the workers

int g_failures = 0;
int g_rank = 0;

#define WORKER_CHECK(cond, ...)                                                                    \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::cerr << "rank " << g_rank << ": check failed at line " << __LINE__ << ": " #cond << " " \
                << detail::str_cat(__VA_ARGS__) << std::endl;                                      \
      ++g_failures;                                                                                \
    }                                                                                              \
  } while (0)

int env_int(const char* name, int fallback = 0) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

std::chrono::milliseconds env_timeout() {
  return std::chrono::milliseconds(env_int("DIST_TEST_TIMEOUT_MS", 60000));
}

// Rank r's input for case `id`: integers in [-5, 5] for integral and bool dtypes (bool: != 0),
// reals otherwise; every rank can compute every other rank's input.
std::vector<double> input_values(int r, int id, int64_t n, DType dtype) {
  std::mt19937_64 gen(1000003u * uint64_t(id) + uint64_t(r));
  std::vector<double> v(n);
  for (double& x : v) {
    x = is_floating_point(dtype) ? std::uniform_real_distribution<double>(-4, 4)(gen)
                                 : double(std::uniform_int_distribution<int>(-5, 5)(gen));
    if (dtype == kBool) x = x > 0 ? 1 : 0;
  }
  return v;
}

Tensor make(const std::vector<double>& v, DType dtype, const Shape& shape) {
  return from_vector(v, shape).to(dtype);
}

void expect_values(const Tensor& t, const std::vector<double>& expected, DType dtype,
                   const std::string& what) {
  std::vector<double> got = testing::values(t);
  WORKER_CHECK(got.size() == expected.size(), what, ": ", got.size(), " values, expected ",
               expected.size());
  if (got.size() != expected.size()) return;
  double tol = dtype == kFloat32 ? 1e-5 : dtype == kFloat64 ? 1e-12 : 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - expected[i]) > tol * (1 + std::abs(expected[i]))) {
      WORKER_CHECK(false, what, ": element ", i, " is ", got[i], ", expected ", expected[i]);
      return;
    }
  }
}

double reduce_ref(const std::vector<double>& xs, dist::ReduceOp op, DType dtype) {
  double acc = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    if (op == dist::ReduceOp::MAX)
      acc = std::max(acc, xs[i]);
    else if (op == dist::ReduceOp::MIN)
      acc = std::min(acc, xs[i]);
    else
      acc += xs[i];
  }
  if (dtype == kBool && op == dist::ReduceOp::SUM) acc = acc > 0 ? 1 : 0;
  if (op == dist::ReduceOp::AVG) acc /= double(xs.size());
  if (dtype == kFloat32) acc = double(float(acc));
  return acc;
}

const std::vector<DType> kDTypes = {kFloat32, kFloat64, kInt32, kInt64, kBool};
const std::vector<dist::ReduceOp> kOps = {dist::ReduceOp::SUM, dist::ReduceOp::AVG,
                                          dist::ReduceOp::MAX, dist::ReduceOp::MIN};

void check_all_reduce(int rank, int world, int& id) {
  for (DType dtype : kDTypes) {
    for (dist::ReduceOp op : kOps) {
      if (op == dist::ReduceOp::AVG && !is_floating_point(dtype)) continue;
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1001)}) {
        ++id;
        Tensor t = make(input_values(rank, id, n, dtype), dtype, {n});
        // The functional form returns the reduction and leaves its input as it was.
        Tensor reduced = dist::functional::all_reduce(t, op);
        expect_values(t, input_values(rank, id, n, dtype), dtype, "functional all_reduce input");
        dist::all_reduce(t, op);
        WORKER_CHECK(testing::bytes(reduced) == testing::bytes(t), "functional all_reduce ",
                     dtype_name(dtype), " op ", int(op), " n ", n, " differs from all_reduce's");
        std::vector<double> expected(n);
        for (int64_t i = 0; i < n; ++i) {
          std::vector<double> xs;
          for (int r = 0; r < world; ++r) xs.push_back(input_values(r, id, n, dtype)[i]);
          expected[i] = reduce_ref(xs, op, dtype);
        }
        expect_values(t, expected, dtype,
                      detail::str_cat("all_reduce ", dtype_name(dtype), " op ", int(op), " n ", n));
      }
    }
  }
  // A pending input and a transposed (non-contiguous) view written in place.
  ++id;
  Tensor base = make(input_values(rank, id, 12, kFloat64), kFloat64, {3, 4});
  Tensor pending = base * 2.0;
  Tensor view = pending.t();
  dist::all_reduce(view);
  std::vector<double> expected(12, 0.0);
  for (int r = 0; r < world; ++r) {
    std::vector<double> x = input_values(r, id, 12, kFloat64);
    for (int i = 0; i < 12; ++i) expected[i] += 2 * x[i];
  }
  expect_values(pending, expected, kFloat64, "all_reduce of a transposed view of a pending tensor");
}

void check_broadcast(int rank, int world, int& id) {
  for (DType dtype : kDTypes) {
    for (int64_t n : {int64_t(0), int64_t(5), int64_t(333)}) {
      ++id;
      int root = world - 1;
      Tensor t = make(input_values(rank, id, n, dtype), dtype, {n});
      dist::broadcast(t, root);
      expect_values(t, input_values(root, id, n, dtype), dtype,
                    detail::str_cat("broadcast ", dtype_name(dtype), " n ", n));
    }
  }
}

void check_all_gather(int rank, int world, int& id) {
  const int64_t uneven[] = {3, 0, 5, 1};
  for (DType dtype : kDTypes) {
    ++id;
    Tensor in = make(input_values(rank, id, uneven[rank], dtype), dtype, {uneven[rank]});
    std::vector<Tensor> outs;
    for (int r = 0; r < world; ++r) outs.push_back(zeros({uneven[r]}, dtype));
    dist::all_gather(outs, in);
    for (int r = 0; r < world; ++r) {
      expect_values(outs[r], input_values(r, id, uneven[r], dtype), dtype,
                    detail::str_cat("all_gather ", dtype_name(dtype), " from rank ", r));
    }
    ++id;
    Tensor same = make(input_values(rank, id, 4, dtype), dtype, {2, 2});
    Tensor gathered = zeros({2 * world, 2}, dtype);
    dist::all_gather_into_tensor(gathered, same);
    std::vector<double> expected;
    for (int r = 0; r < world; ++r) {
      std::vector<double> x = input_values(r, id, 4, dtype);
      expected.insert(expected.end(), x.begin(), x.end());
    }
    expect_values(gathered, expected, dtype, "all_gather_into_tensor");
  }
}

void check_reduce_scatter(int rank, int world, int& id) {
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    for (dist::ReduceOp op : kOps) {
      if (op == dist::ReduceOp::AVG && !is_floating_point(dtype)) continue;
      for (int64_t n : {int64_t(0), int64_t(3)}) {
        ++id;
        Tensor in = make(input_values(rank, id, n * world, dtype), dtype, {n * world});
        Tensor out = zeros({n}, dtype);
        dist::reduce_scatter_tensor(out, in, op);
        std::vector<double> expected(n);
        for (int64_t i = 0; i < n; ++i) {
          std::vector<double> xs;
          for (int r = 0; r < world; ++r)
            xs.push_back(input_values(r, id, n * world, dtype)[rank * n + i]);
          expected[i] = reduce_ref(xs, op, dtype);
        }
        expect_values(out, expected, dtype, detail::str_cat("reduce_scatter ", dtype_name(dtype)));
      }
    }
  }
}

void check_async(int rank, int world, int& id) {
  ++id;
  Tensor a = make(input_values(rank, id, 100, kFloat64), kFloat64, {100});
  Tensor b = make(input_values(rank, id + 1, 50, kFloat64), kFloat64, {50});
  auto wa = dist::all_reduce(a, dist::ReduceOp::SUM, /*async_op=*/true);
  auto wb = dist::all_reduce(b, dist::ReduceOp::MAX, /*async_op=*/true);
  auto wc = dist::barrier(/*async_op=*/true);
  wb->wait();
  wa->wait();
  wc->wait();
  WORKER_CHECK(wa->is_completed() && wb->is_completed(), "async works not completed after wait");
  std::vector<double> ea(100, 0.0), eb(50, -1e300);
  for (int r = 0; r < world; ++r) {
    std::vector<double> x = input_values(r, id, 100, kFloat64),
                        y = input_values(r, id + 1, 50, kFloat64);
    for (int i = 0; i < 100; ++i) ea[i] += x[i];
    for (int i = 0; i < 50; ++i) eb[i] = std::max(eb[i], y[i]);
  }
  expect_values(a, ea, kFloat64, "async all_reduce sum");
  expect_values(b, eb, kFloat64, "async all_reduce max");
  id += 1;
}

std::shared_ptr<dist::Store> worker_store(std::chrono::milliseconds timeout) {
  return std::make_shared<dist::FileStore>(std::getenv("DIST_TEST_STORE"), timeout);
}

int collectives_worker(int rank, int world) {
  dist::init_process_group("gloo", rank, world, worker_store(env_timeout()), env_timeout());
  WORKER_CHECK(dist::get_rank() == rank && dist::get_world_size() == world, "rank/world");
  int id = 0;
  check_all_reduce(rank, world, id);
  check_broadcast(rank, world, id);
  check_all_gather(rank, world, id);
  check_reduce_scatter(rank, world, id);
  check_async(rank, world, id);
  dist::barrier();
  dist::destroy_process_group();
  return g_failures ? 1 : 0;
}

// A rank that stops taking part: "exit" exits before the second collective, "hang" sleeps past
// the others' timeout. The others must raise an error naming it, within the timeout.
int fault_worker(int rank, int world, const std::string& mode) {
  auto timeout = env_timeout();
  dist::init_process_group("gloo", rank, world, worker_store(std::chrono::seconds(30)), timeout);
  // A write to rank 1's closed connection must fail in Gloo, not kill this rank by SIGPIPE.
  struct sigaction pipe {};
  WORKER_CHECK(sigaction(SIGPIPE, nullptr, &pipe) == 0 && pipe.sa_handler == SIG_IGN,
               "SIGPIPE is not ignored after init_process_group");
  Tensor t = ones({10});
  dist::all_reduce(t);
  if (rank == 1) {
    if (mode == "exit") std::_Exit(3);
    std::this_thread::sleep_for(timeout * 3);
    std::_Exit(0);
  }
  auto start = Clock::now();
  try {
    dist::all_reduce(t);
    WORKER_CHECK(false, "the all_reduce without rank 1 did not raise");
  } catch (const Error& e) {
    std::string msg = e.what();
    std::cerr << "rank " << rank << " raised: " << msg << std::endl;
    WORKER_CHECK(msg.find("rank 1 did not arrive") != std::string::npos, "message: ", msg);
    WORKER_CHECK(msg.find("all_reduce") != std::string::npos, "message: ", msg);
  }
  auto elapsed = Clock::now() - start;
  WORKER_CHECK(elapsed < timeout + std::chrono::seconds(3), "raised after ",
               std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), " ms");
  std::_Exit(g_failures ? 1 : 0);  // the group's peers are gone: skip its orderly teardown
}

// Rank 1 believes the world is one rank larger.
int mismatch_worker(int rank, int world) {
  int claimed = rank == 1 ? world + 1 : world;
  try {
    dist::init_process_group("gloo", rank, claimed, worker_store(std::chrono::seconds(5)),
                             std::chrono::seconds(5));
    WORKER_CHECK(false, "init_process_group with mismatched world sizes did not raise");
  } catch (const Error& e) {
    std::string msg = e.what();
    std::cerr << "rank " << rank << " raised: " << msg << std::endl;
    WORKER_CHECK(msg.find("init_process_group") != std::string::npos &&
                     msg.find("world_size") != std::string::npos,
                 "message: ", msg);
  }
  return g_failures ? 1 : 0;
}

// torchrun's environment: a TCP store served by rank 0.
int env_worker() {
  dist::init_process_group("gloo");
  int rank = dist::get_rank(), world = dist::get_world_size();
  WORKER_CHECK(rank == env_int("RANK") && world == env_int("WORLD_SIZE"), "rank/world from env");
  WORKER_CHECK(dist::get_local_rank() == env_int("LOCAL_RANK"), "local rank");
  Tensor t = full({3}, double(rank + 1), kFloat64);
  dist::all_reduce(t);
  double sum = world * (world + 1) / 2.0;
  expect_values(t, {sum, sum, sum}, kFloat64, "all_reduce over a TCP store");
  dist::destroy_process_group();
  return g_failures ? 1 : 0;
}

// ------------------------------------------------------------------------------------ DDP

std::shared_ptr<nn::Module> make_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(16, 3)});
}

constexpr int kBatch = 24, kSteps = 4;

Tensor batch_inputs() {
  return make(input_values(0, 9001, kBatch * 6, kFloat32), kFloat32, {kBatch, 6});
}
Tensor batch_targets() {
  return make(input_values(0, 9002, kBatch * 3, kFloat32), kFloat32, {kBatch, 3});
}

// Parameters after kSteps SGD steps on rows [begin, end) of the batch, split into `micro` equal
// micro-batches whose gradients accumulate (each loss scaled by 1/micro).
template <typename Model, typename Sync>
void train(Model& model, std::vector<Tensor> params, int64_t begin, int64_t end, int micro,
           Sync no_sync_for_all_but_last) {
  optim::SGDOptions options;
  options.lr = 0.1;
  optim::SGD opt(params, options);
  Tensor x = batch_inputs().narrow(0, begin, end - begin);
  Tensor y = batch_targets().narrow(0, begin, end - begin);
  int64_t per = (end - begin) / micro;
  for (int step = 0; step < kSteps; ++step) {
    for (Tensor& p : params) p.mutable_grad() = Tensor();
    for (int m = 0; m < micro; ++m) {
      auto run = [&] {
        Tensor loss = mse_loss(model(x.narrow(0, m * per, per)), y.narrow(0, m * per, per));
        (loss / double(micro)).backward();
      };
      if (m + 1 < micro) {
        no_sync_for_all_but_last(run);
      } else {
        run();
      }
    }
    opt.step();
  }
}

void check_no_sync_keeps_local_gradients(int rank, int world);

int ddp_worker(int rank, int world) {
  dist::init_process_group("gloo", rank, world, worker_store(env_timeout()), env_timeout());
  for (int micro : {1, 2}) {
    for (double cap_mb : {25.0, 0.0005}) {  // one bucket; a bucket per parameter or two
      // Reference: one process, the whole batch, rank 0's initial parameters.
      auto reference = make_mlp(7);
      train(*reference, reference->parameters(), 0, kBatch, micro, [](auto run) { run(); });
      // Each rank starts from parameters of its own; DDP broadcasts rank 0's.
      auto module = make_mlp(rank == 0 ? 7 : 100 + rank);
      nn::parallel::DistributedDataParallel ddp(module, nullptr, cap_mb);
      if (cap_mb < 1) WORKER_CHECK(ddp.bucket_indices().size() > 2, "expected several buckets");
      int64_t shard = kBatch / world;
      train(ddp, ddp.parameters(), rank * shard, (rank + 1) * shard, micro, [&](auto run) {
        auto guard = ddp.no_sync();
        run();
      });
      std::vector<Tensor> got = ddp.parameters(), want = reference->parameters();
      for (size_t i = 0; i < got.size(); ++i) {
        expect_values(got[i], testing::values(want[i]), kFloat32,
                      detail::str_cat("DDP parameter ", i, " micro ", micro, " cap ", cap_mb));
      }
    }
  }
  check_no_sync_keeps_local_gradients(rank, world);
  dist::destroy_process_group();
  return g_failures ? 1 : 0;
}

// Under no_sync each rank keeps the gradient of its own shard (nothing is reduced).
void check_no_sync_keeps_local_gradients(int rank, int world) {
  auto module = make_mlp(7), plain = make_mlp(7);  // rank 0's parameters, as DDP broadcasts
  nn::parallel::DistributedDataParallel ddp(module);
  int64_t shard = kBatch / world;
  Tensor x = batch_inputs().narrow(0, rank * shard, shard);
  Tensor y = batch_targets().narrow(0, rank * shard, shard);
  {
    auto guard = ddp.no_sync();
    mse_loss(ddp(x), y).backward();
  }
  mse_loss((*plain)(x), y).backward();
  std::vector<Tensor> got = ddp.parameters(), want = plain->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    expect_values(got[i].grad(), testing::values(want[i].grad()), kFloat32,
                  detail::str_cat("gradient ", i, " under no_sync"));
  }
}

// ------------------------------------------------------------------------- traced DDP steps

using DDP = nn::parallel::DistributedDataParallel;

// This rank's shard of the batch, scaled per step so that every step sees other data.
Tensor shard_of(const Tensor& batch, int rank, int world, int step) {
  int64_t shard = kBatch / world;
  return (batch.narrow(0, rank * shard, shard) * (1.0 + 0.25 * step)).contiguous();
}

void expect_bit_equal_parameters(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                                 const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    WORKER_CHECK(testing::bytes(got[i]) == testing::bytes(want[i]), what, ": parameter ", i,
                 " differs from eager DDP's");
  }
}

// A training step (zero_grad, forward, backward with DDP's reduction, SGD step) traced once and
// replayed for kSteps steps equals the eager DDP step bit for bit at every step, and training on
// the whole batch in one process within float32's tolerance.
void check_traced_step_matches_eager(int rank, int world, double cap_mb) {
  optim::SGDOptions options;
  options.lr = 0.1;
  auto eager_module = make_mlp(7);
  DDP eager(eager_module, nullptr, cap_mb);
  optim::SGD eager_opt(eager.parameters(), options);
  auto traced_module = make_mlp(rank == 0 ? 7 : 100 + rank);  // DDP broadcasts rank 0's
  DDP traced(traced_module, nullptr, cap_mb);
  optim::SGD traced_opt(traced.parameters(), options);
  auto step = [](DDP& ddp, optim::SGD& opt, const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = mse_loss(ddp(x), y);
    loss.backward();
    opt.step();
    return loss;
  };
  jit::Function traced_step = jit::trace(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{step(traced, traced_opt, in[0], in[1])};
      },
      {shard_of(batch_inputs(), rank, world, 0), shard_of(batch_targets(), rank, world, 0)});
  WORKER_CHECK(traced_step.graph_str().find("all_reduce(") != std::string::npos,
               "the traced step's graph has no all_reduce:\n", traced_step.graph_str());
  auto reference = make_mlp(7);
  optim::SGD reference_opt(reference->parameters(), options);
  const int64_t replays = jit::stats().replays;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x = shard_of(batch_inputs(), rank, world, s),
           y = shard_of(batch_targets(), rank, world, s);
    Tensor eager_loss = step(eager, eager_opt, x, y);
    Tensor traced_loss = traced_step({x, y})[0];
    WORKER_CHECK(testing::bytes(traced_loss) == testing::bytes(eager_loss), "loss at step ", s);
    expect_bit_equal_parameters(traced.parameters(), eager.parameters(),
                                detail::str_cat("traced step ", s, " cap ", cap_mb));
    // One process on the whole batch (the ranks' shards, concatenated).
    reference_opt.zero_grad();
    mse_loss((*reference)(batch_inputs() * (1.0 + 0.25 * s)), batch_targets() * (1.0 + 0.25 * s))
        .backward();
    reference_opt.step();
  }
  WORKER_CHECK(jit::stats().replays - replays == kSteps, "the traced step was not replayed");
  std::vector<Tensor> got = traced.parameters(), want = reference->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    expect_values(
        got[i], testing::values(want[i]), kFloat32,
        detail::str_cat("traced DDP parameter ", i, " against one process, cap ", cap_mb));
  }
}

// Gradient accumulation: a traced forward-backward called inside no_sync() accumulates locally and
// called outside it reduces the sums, as eager DDP does: the flag is read by the trace, and each
// setting gets a specialization of its own (the one inside no_sync records no collective).
void check_traced_no_sync(int rank, int world) {
  optim::SGDOptions options;
  options.lr = 0.1;
  auto eager_module = make_mlp(7), traced_module = make_mlp(7);
  DDP eager(eager_module), traced(traced_module);
  optim::SGD eager_opt(eager.parameters(), options), traced_opt(traced.parameters(), options);
  auto forward_backward = [](DDP& ddp, const Tensor& x, const Tensor& y) {
    Tensor loss = mse_loss(ddp(x), y) / 2.0;
    loss.backward();
    return loss;
  };
  Tensor x0 = shard_of(batch_inputs(), rank, world, 0),
         y0 = shard_of(batch_targets(), rank, world, 0);
  jit::Function traced_fb = jit::trace(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{forward_backward(traced, in[0], in[1])};
      },
      {x0, y0});
  for (int s = 0; s < kSteps; ++s) {
    Tensor x1 = shard_of(batch_inputs(), rank, world, s + 1);
    Tensor y1 = shard_of(batch_targets(), rank, world, s + 1);
    for (Tensor& p : eager.parameters()) p.mutable_grad() = Tensor();
    for (Tensor& p : traced.parameters()) p.mutable_grad() = Tensor();
    {
      auto e = eager.no_sync();
      auto t = traced.no_sync();
      forward_backward(eager, x0, y0);
      traced_fb({x0, y0});
    }
    std::vector<Tensor> got = traced.parameters(), want = eager.parameters();
    for (size_t i = 0; i < got.size(); ++i)
      WORKER_CHECK(testing::bytes(got[i].grad()) == testing::bytes(want[i].grad()),
                   "local gradient ", i, " under no_sync at step ", s);
    forward_backward(eager, x1, y1);
    traced_fb({x1, y1});
    eager_opt.step();
    traced_opt.step();
    expect_bit_equal_parameters(traced.parameters(), eager.parameters(),
                                detail::str_cat("no_sync then synchronized, step ", s));
  }
  WORKER_CHECK(traced_fb.num_specializations() >= 2, "expected a specialization per no_sync mode");
}

// A rank gone in the middle of training: the replayed step's all-reduce raises on the others,
// naming it, and leaves the parameters and Adam's state (its step count too) as they were: no
// write-back is computed in place before a collective, which may fail.
int ddp_trace_fault_worker(int rank, int world) {
  dist::init_process_group("gloo", rank, world, worker_store(std::chrono::seconds(30)),
                           env_timeout());
  auto module = make_mlp(7);
  DDP ddp(module);
  optim::Adam adam(ddp.parameters(), optim::AdamOptions{1e-3});
  Tensor x = shard_of(batch_inputs(), rank, world, 0),
         y = shard_of(batch_targets(), rank, world, 0);
  jit::Function step = jit::trace(
      [&](const std::vector<Tensor>& in) {
        adam.zero_grad();
        Tensor loss = mse_loss(ddp(in[0]), in[1]);
        loss.backward();
        adam.step();
        return std::vector<Tensor>{loss};
      },
      {x, y});
  step({x, y});
  step({x, y});  // from the second run on, write-backs may be computed in place
  if (rank == 1) std::_Exit(3);
  std::vector<std::vector<unsigned char>> before;
  for (const Tensor& p : ddp.parameters()) before.push_back(testing::bytes(p));
  for (const auto& [name, t] : adam.state_dict()) before.push_back(testing::bytes(t));
  try {
    step({x, y});
    WORKER_CHECK(false, "the replay without rank 1 did not raise");
  } catch (const Error& e) {
    std::string msg = e.what();
    std::cerr << "rank " << rank << " raised: " << msg << std::endl;
    WORKER_CHECK(msg.find("rank 1 did not arrive") != std::string::npos, "message: ", msg);
    WORKER_CHECK(msg.find("all_reduce") != std::string::npos, "message: ", msg);
  }
  std::vector<std::vector<unsigned char>> after;
  for (const Tensor& p : ddp.parameters()) after.push_back(testing::bytes(p));
  for (const auto& [name, t] : adam.state_dict()) after.push_back(testing::bytes(t));
  WORKER_CHECK(after == before, "the failed replay changed the parameters or Adam's state");
  std::_Exit(g_failures ? 1 : 0);  // the group's peers are gone: skip its orderly teardown
}

// Every collective inside jit::trace is an op of the graph: a replay on new inputs equals the
// eager collectives on them bit for bit (and the float64 reference), so none became a constant.
std::vector<Tensor> collectives_of(const Tensor& x, int world) {
  namespace fn = dist::functional;
  Tensor y = x * 2.0 + 1.0;  // pending: each collective computes its input first
  Tensor b = y.clone();
  dist::broadcast(b, world - 1);
  std::vector<Tensor> parts;
  for (int r = 0; r < world; ++r) parts.push_back(zeros({4, 3}));
  dist::all_gather(parts, y);
  Tensor g = zeros({4 * world, 3});
  dist::all_gather_into_tensor(g, y);
  std::vector<Tensor> pieces;
  for (int r = 0; r < world; ++r) pieces.push_back(y.narrow(0, 0, 2) * double(r + 1));
  Tensor rs = zeros({2, 3}), rs_max = zeros({2, 3});
  dist::reduce_scatter_tensor(rs, kiln::cat(pieces, 0));
  dist::reduce_scatter(rs_max, pieces, dist::ReduceOp::MAX);
  return {b, fn::broadcast(y, 0), kiln::cat(parts, 0), g, fn::all_gather_into_tensor(y), rs, rs_max,
          fn::reduce_scatter_tensor(kiln::cat(pieces, 0), dist::ReduceOp::AVG),
          fn::all_reduce(y, dist::ReduceOp::MIN),
          // A collective of a collective's result: the replay waits for the first before
          // starting the second.
          fn::all_reduce(fn::broadcast(y, world - 1) * 0.5, dist::ReduceOp::SUM)};
}

int traced_collectives_worker(int rank, int world) {
  dist::init_process_group("gloo", rank, world, worker_store(env_timeout()), env_timeout());
  auto input = [](int r, int step) {
    return make(input_values(r, 7000 + step, 12, kFloat32), kFloat32, {4, 3});
  };
  jit::Function traced =
      jit::trace([world](const std::vector<Tensor>& in) { return collectives_of(in[0], world); },
                 {input(rank, 0)});
  const std::string graph = traced.graph_str();
  for (const char* op :
       {"broadcast(", "all_gather_into_tensor(", "reduce_scatter_tensor(", "all_reduce("})
    WORKER_CHECK(graph.find(op) != std::string::npos, "no ", op, " in the graph:\n", graph);
  const int64_t replays = jit::stats().replays;
  for (int step = 1; step <= 2; ++step) {
    const std::vector<Tensor> want = collectives_of(input(rank, step), world);
    const std::vector<Tensor> got = traced({input(rank, step)});
    WORKER_CHECK(got.size() == want.size(), got.size(), " outputs");
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      WORKER_CHECK(testing::bytes(got[i]) == testing::bytes(want[i]), "output ", i, " at step ",
                   step, " differs from the eager collectives'");
    // References: y_r = 2 x_r + 1 for each rank r.
    std::vector<std::vector<double>> y(world);
    for (int r = 0; r < world; ++r)
      for (double v : input_values(r, 7000 + step, 12, kFloat32))
        y[r].push_back(double(float(v)) * 2 + 1);
    std::vector<double> gathered, summed(6, 0.0);
    for (int r = 0; r < world; ++r) gathered.insert(gathered.end(), y[r].begin(), y[r].end());
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < 6; ++i) summed[i] += y[r][i] * (rank + 1);
    expect_values(got[0], y[world - 1], kFloat32, "traced broadcast");
    expect_values(got[1], y[0], kFloat32, "traced functional broadcast");
    expect_values(got[2], gathered, kFloat32, "traced all_gather");
    expect_values(got[3], gathered, kFloat32, "traced all_gather_into_tensor");
    expect_values(got[5], summed, kFloat32, "traced reduce_scatter_tensor");
    std::vector<double> chained;
    for (double v : y[world - 1]) chained.push_back(double(float(v * 0.5)) * world);
    expect_values(got[9], chained, kFloat32, "traced all_reduce of a traced broadcast");
  }
  WORKER_CHECK(jit::stats().replays - replays == 2, "the traced collectives were not replayed");
  dist::destroy_process_group();
  return g_failures ? 1 : 0;
}

int ddp_trace_worker(int rank, int world) {
  dist::init_process_group("gloo", rank, world, worker_store(env_timeout()), env_timeout());
  for (double cap_mb : {25.0, 0.0005}) check_traced_step_matches_eager(rank, world, cap_mb);
  check_traced_no_sync(rank, world);
  dist::destroy_process_group();
  return g_failures ? 1 : 0;
}

// Rank 1 wraps a model of another size: DDP's construction raises on every rank.
int ddp_mismatch_worker(int rank, int world) {
  dist::init_process_group("gloo", rank, world, worker_store(env_timeout()), env_timeout());
  auto module = std::make_shared<nn::Linear>(4, rank == 1 ? 3 : 2);
  try {
    nn::parallel::DistributedDataParallel ddp(module);
    WORKER_CHECK(false, "DDP over different models did not raise");
  } catch (const Error& e) {
    std::string msg = e.what();
    std::cerr << "rank " << rank << " raised: " << msg << std::endl;
    std::string other = rank == 0 ? "rank 1 has 2 parameters of 15 elements"
                                  : "rank 0 has 2 parameters of 10 elements";
    WORKER_CHECK(msg.find(other) != std::string::npos, "message: ", msg);
  }
  dist::destroy_process_group();
  return g_failures ? 1 : 0;
}

int run_worker(const std::string& scenario) {
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  g_rank = rank;
  try {
    if (scenario == "collectives") return collectives_worker(rank, world);
    if (scenario == "exit" || scenario == "hang") return fault_worker(rank, world, scenario);
    if (scenario == "mismatch") return mismatch_worker(rank, world);
    if (scenario == "env") return env_worker();
    if (scenario == "ddp") return ddp_worker(rank, world);
    if (scenario == "ddp_mismatch") return ddp_mismatch_worker(rank, world);
    if (scenario == "ddp_trace") return ddp_trace_worker(rank, world);
    if (scenario == "ddp_trace_fault") return ddp_trace_fault_worker(rank, world);
    if (scenario == "traced_collectives") return traced_collectives_worker(rank, world);
    std::cerr << "unknown scenario " << scenario << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
  }
  return 2;
}

// The worker runs in place of the test program, before main.
const int kWorkerExit = [] {
  const char* scenario = std::getenv("DIST_TEST_WORKER");
  if (!scenario) return 0;
  int code = run_worker(scenario);
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(code);
  return code;
}();

// ------------------------------------------------------------------------------ launching

struct RankResult {
  int exit_code = -1;  // -1: killed at the deadline
  std::string output;
};

std::string temp_dir() {
  char tmpl[] = "/tmp/kiln_dist_test_XXXXXX";
  char* dir = mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  return dir ? dir : "/tmp";
}

// A directory for one test's stores, removed with it.
struct TempDir {
  std::string path = temp_dir();
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Runs `world` ranks of `scenario`, killing those still running after `deadline`.
std::vector<RankResult> run_ranks(const std::string& scenario, int world,
                                  std::chrono::seconds deadline,
                                  std::map<std::string, std::string> extra_env = {}) {
  std::string dir = temp_dir();
  std::vector<pid_t> pids(world);
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = extra_env;
    env["DIST_TEST_WORKER"] = scenario;
    env["DIST_TEST_STORE"] = dir + "/store";
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(world);
    std::vector<std::string> strings;
    for (char** e = environ; *e; ++e) {
      std::string s = *e;
      if (!env.count(s.substr(0, s.find('=')))) strings.push_back(s);
    }
    for (auto& [k, v] : env) strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& s : strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string out = dir + "/rank" + std::to_string(r) + ".log";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    int rc = posix_spawn(&pids[r], "/proc/self/exe", &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0) << "posix_spawn failed";
  }
  std::vector<RankResult> results(world);
  std::vector<bool> done(world, false);
  auto end = Clock::now() + deadline;
  for (int left = world; left > 0;) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --left;
      results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (Clock::now() > end) {
      for (int r = 0; r < world; ++r) {
        if (done[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        done[r] = true;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".log");
    std::stringstream ss;
    ss << f.rdbuf();
    results[r].output = ss.str();
  }
  std::filesystem::remove_all(dir);
  return results;
}

void expect_all_pass(const std::vector<RankResult>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << what << ": rank " << r << " output:\n"
                                       << results[r].output;
  }
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// ---------------------------------------------------------------------------------- tests

TEST(Distributed, CollectivesMatchReferenceOverWorldSizes1To4) {
  for (int world = 1; world <= 4; ++world) {
    expect_all_pass(run_ranks("collectives", world, std::chrono::seconds(120)),
                    "collectives, world size " + std::to_string(world));
  }
}

TEST(Distributed, DdpMatchesOneProcessOnTheWholeBatch) {
  for (int world : {2, 4}) {
    expect_all_pass(run_ranks("ddp", world, std::chrono::seconds(120)),
                    "DDP, world size " + std::to_string(world));
  }
}

TEST(Distributed, TracedDdpStepMatchesEagerDdpBitForBit) {
  for (int world : {2, 3})
    expect_all_pass(run_ranks("ddp_trace", world, std::chrono::seconds(300)),
                    "traced DDP step, world size " + std::to_string(world));
}

TEST(Distributed, TracedCollectivesMatchEagerOnTwoAndThreeRanks) {
  for (int world : {2, 3})
    expect_all_pass(run_ranks("traced_collectives", world, std::chrono::seconds(180)),
                    "traced collectives, world size " + std::to_string(world));
}

TEST(Distributed, TracedDdpStepWithoutARankRaisesAndChangesNothing) {
  auto results = run_ranks("ddp_trace_fault", 2, std::chrono::seconds(120),
                           {{"DIST_TEST_TIMEOUT_MS", "3000"}});
  EXPECT_EQ(results[1].exit_code, 3);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
}

TEST(Distributed, DdpOverDifferentModelsRaises) {
  expect_all_pass(run_ranks("ddp_mismatch", 2, std::chrono::seconds(60)), "DDP model mismatch");
}

TEST(Distributed, RankExitingMidStepIsNamedByTheOthers) {
  auto results = run_ranks("exit", 3, std::chrono::seconds(60), {{"DIST_TEST_TIMEOUT_MS", "3000"}});
  EXPECT_EQ(results[1].exit_code, 3);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_EQ(results[2].exit_code, 0) << results[2].output;
}

TEST(Distributed, RankMissingTheTimeoutIsNamedByTheOthers) {
  auto results = run_ranks("hang", 3, std::chrono::seconds(60), {{"DIST_TEST_TIMEOUT_MS", "1500"}});
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_EQ(results[2].exit_code, 0) << results[2].output;
}

TEST(Distributed, MismatchedWorldSizeRaisesAtInit) {
  expect_all_pass(run_ranks("mismatch", 2, std::chrono::seconds(60)), "mismatch");
}

TEST(Distributed, InitFromTorchrunEnvironmentOverTcpStore) {
  expect_all_pass(
      run_ranks("env", 3, std::chrono::seconds(60),
                {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(free_port())}}),
      "env init");
}

// tools/kiln-run, found above this binary (build trees live in the source tree).
std::string find_kiln_run() {
  std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  for (; !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / "tools" / "kiln-run")) return dir / "tools" / "kiln-run";
  }
  return "";
}

TEST(Distributed, KilnRunStartsRanksWithTorchrunEnvironment) {
  std::string kiln_run = find_kiln_run();
  if (kiln_run.empty()) GTEST_SKIP() << "tools/kiln-run not found above this binary";
  std::string self = std::filesystem::read_symlink("/proc/self/exe");
  std::string cmd = "DIST_TEST_WORKER=env timeout 60 " + kiln_run + " -n 3 " + self + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // A failing rank stops the job, whose status is the rank's.
  cmd = "DIST_TEST_WORKER=no_such_scenario timeout 60 " + kiln_run + " -n 2 " + self + " 2>&1";
  int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << cmd;
}

std::string run_and_capture(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0) << cmd << "\n" << out;
  return out;
}

// The lines that report losses and perplexities (not the timings).
std::vector<std::string> loss_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.find(" step ") != std::string::npos) lines.push_back(line);
    auto valid = line.find("valid ppl");
    if (valid != std::string::npos) lines.push_back(line.substr(0, line.find(',', valid)));
  }
  return lines;
}

// The word language model example on two ranks follows the single-process run (without dropout,
// whose masks each rank draws for itself), with its training step run eagerly or traced.
TEST(Distributed, WordLmOnTwoRanksMatchesOneProcess) {
  std::string kiln_run = find_kiln_run();
  std::filesystem::path word_lm =
      std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "tools" /
      "examples" / "word_lm";
  if (kiln_run.empty() || !std::filesystem::exists(word_lm))
    GTEST_SKIP() << "needs tools/kiln-run and the word_lm example (ninja word_lm)";
  std::string args =
      " --epochs 1 --steps 12 --dropout 0 --log-every 4 --train-tokens 8000 --valid-tokens 1000";
  std::vector<std::string> one = loss_lines(run_and_capture(word_lm.string() + args + " 2>&1"));
  std::vector<std::string> two = loss_lines(
      run_and_capture("timeout 120 " + kiln_run + " -n 2 " + word_lm.string() + " --ddp" + args));
  EXPECT_EQ(one.size(), 4u);
  EXPECT_EQ(one, two);
  // The training step traced, its gradient all-reduces replayed as graph ops.
  std::vector<std::string> traced = loss_lines(run_and_capture(
      "timeout 120 " + kiln_run + " -n 2 " + word_lm.string() + " --ddp --trace" + args));
  EXPECT_EQ(traced, two);
}

TEST(Distributed, StoresSetGetWaitAndTimeOut) {
  TempDir dir;
  dist::FileStore file(dir.path + "/store", std::chrono::milliseconds(200));
  dist::TCPStore server("127.0.0.1", 0, /*is_master=*/true, std::chrono::milliseconds(200));
  dist::TCPStore client("127.0.0.1", server.port(), /*is_master=*/false,
                        std::chrono::milliseconds(200));
  for (dist::Store* writer : std::vector<dist::Store*>{&file, &server}) {
    dist::Store* reader = writer == &file ? static_cast<dist::Store*>(&file) : &client;
    writer->set("a", {'x', 'y'});
    EXPECT_EQ(reader->get("a"), std::vector<char>({'x', 'y'}));
    writer->set("a", {'z'});  // overwriting: the arrival records do
    EXPECT_EQ(reader->get("a"), std::vector<char>({'z'}));
    EXPECT_TRUE(reader->check({"a"}));
    EXPECT_FALSE(reader->check({"a", "b"}));
    testing::expect_error([&] { reader->wait({"b"}); }, {"timed out", "b"});
  }
}

TEST(Distributed, NcclReportsWhyItIsUnavailable) {
  std::string reason;
  if (dist::is_available("nccl", &reason)) GTEST_SKIP() << "NCCL runs here: see NcclOnOneGpu";
  EXPECT_FALSE(reason.empty());
  EXPECT_TRUE(reason.find("no CUDA device") != std::string::npos ||
              reason.find("libnccl.so.2") != std::string::npos ||
              reason.find("without the CUDA toolkit") != std::string::npos)
      << reason;
  TempDir dir;
  auto store = std::make_shared<dist::FileStore>(dir.path + "/store");
  testing::expect_error([&] { dist::init_process_group("nccl", 0, 1, store); },
                        {"init_process_group: backend 'nccl' is unavailable", reason});
  EXPECT_FALSE(dist::is_initialized());
}

// A group of one on this machine's GPU: every collective runs through NCCL on kiln's stream and
// its result lands in the caller's (CUDA, possibly pending) tensor.
TEST(Distributed, NcclOnOneGpu) {
  std::string reason;
  if (!dist::is_available("nccl", &reason)) GTEST_SKIP() << reason;
  TempDir dir;
  dist::init_process_group("nccl", 0, 1, std::make_shared<dist::FileStore>(dir.path + "/store"),
                           std::chrono::seconds(60));
  EXPECT_EQ(dist::default_group()->backend(), "nccl");
  for (DType dtype : kDTypes) {
    Tensor host = make(input_values(0, 1, 37, dtype), dtype, {37});
    Tensor t = host.to(kCUDA);
    dist::all_reduce(t, dist::ReduceOp::MAX);
    EXPECT_EQ(testing::values(t.to(kCPU)), testing::values(host)) << dtype_name(dtype);
  }
  Tensor x = (ones({5}, kFloat64).to(kCUDA) * 3.0);  // pending
  dist::all_reduce(x, dist::ReduceOp::AVG);
  dist::broadcast(x, 0);
  EXPECT_EQ(testing::values(x.to(kCPU)), std::vector<double>(5, 3.0));
  Tensor gathered = zeros({1, 5}, kFloat64).to(kCUDA);
  dist::all_gather_into_tensor(gathered, x.view({1, 5}));
  EXPECT_EQ(testing::values(gathered.to(kCPU)), std::vector<double>(5, 3.0));
  Tensor out = zeros({5}, kFloat64).to(kCUDA);
  dist::reduce_scatter_tensor(out, x);
  EXPECT_EQ(testing::values(out.to(kCPU)), std::vector<double>(5, 3.0));
  dist::barrier();
  Tensor cpu = ones({2});
  testing::expect_error([&] { dist::all_reduce(cpu); }, {"all_reduce", "nccl backend takes"});
  // DDP over CUDA parameters: with one rank the gradients are the plain backward's.
  auto module = make_mlp(7), plain = make_mlp(7);
  module->to(kCUDA);
  nn::parallel::DistributedDataParallel ddp(module);
  mse_loss(ddp(batch_inputs().to(kCUDA)), batch_targets().to(kCUDA)).backward();
  mse_loss((*plain)(batch_inputs()), batch_targets()).backward();
  std::vector<Tensor> got = ddp.parameters(), want = plain->parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    testing::expect_close(got[i].grad().to(kCPU), testing::values(want[i].grad()), want[i].sizes(),
                          kFloat32, 1e-4, 1e-6);
  }
  dist::destroy_process_group();
}

TEST(Distributed, BadArgumentsRaise) {
  TempDir dir;
  auto store = std::make_shared<dist::FileStore>(dir.path + "/store");
  testing::expect_error([&] { dist::init_process_group("mpi", 0, 1, store); },
                        {"unknown backend 'mpi'"});
  testing::expect_error([&] { dist::init_process_group("gloo", 2, 2, store); },
                        {"rank 2 is not in [0, world_size 2)"});
  testing::expect_error([&] { dist::get_rank(); }, {"no default process group"});
  dist::init_process_group("gloo", 0, 1, store, std::chrono::seconds(10));
  Tensor i = ones({2}, kInt64);
  testing::expect_error([&] { dist::all_reduce(i, dist::ReduceOp::AVG); },
                        {"all_reduce", "AVG", "int64"});
  std::vector<Tensor> outs = {zeros({3})};
  testing::expect_error([&] { dist::all_gather(outs, ones({2})); },
                        {"all_gather", "3 elements", "input 2"});
  Tensor out = zeros({2});
  testing::expect_error([&] { dist::reduce_scatter_tensor(out, ones({3})); },
                        {"reduce_scatter_tensor", "3 elements"});
  auto uneven_gather = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> outs = {zeros({3})};
    dist::all_gather(outs, in[0]);
    return outs;
  };
  testing::expect_error([&] { jit::trace(uneven_gather, {ones({2})}); },
                        {"all_gather inside jit::trace", "input's 2 elements", "got 3"});
  auto barrier = [](const std::vector<Tensor>& in) {
    dist::barrier();
    return in;
  };
  testing::expect_error([&] { jit::trace(barrier, {ones({2})}); },
                        {"barrier", "inside jit::trace", "are not"});
  testing::expect_error([&] { dist::functional::reduce_scatter_tensor(scalar_tensor(1.0)); },
                        {"reduce_scatter_tensor", "shape []", "1 ranks"});
  testing::expect_error([&] { dist::functional::broadcast(ones({2}), 1); },
                        {"broadcast", "src 1", "group of 1"});
  dist::destroy_process_group();
}

// all_reduce inside jit::trace is a node of the graph: a library call between two fused kernels
// (the fuser neither fuses it nor moves work across it), two reductions of the same value stay two
// (every rank must run each), and each replay runs it on the replay's values.
TEST(Distributed, TracedAllReduceIsAnUnfusedGraphOp) {
  TempDir dir;
  dist::init_process_group("gloo", 0, 1, std::make_shared<dist::FileStore>(dir.path + "/store"),
                           std::chrono::seconds(10));
  auto f = [](const std::vector<Tensor>& in) {
    Tensor c = in[0] * 5.0 + 2.0;  // computed before the collectives, read after them
    Tensor a = in[0] * 2.0 + 1.0;
    Tensor r1 = dist::functional::all_reduce(a);
    Tensor r2 = dist::functional::all_reduce(a);
    Tensor b = in[0].clone();
    dist::all_reduce(b);  // in place, on the default group
    return std::vector<Tensor>{c + ((r1 + r2) * 3.0 + b)};
  };
  jit::Function traced = jit::trace(f, {ones({5})});
  const std::string graph = traced.graph_str();
  size_t count = 0;
  for (size_t at = graph.find("all_reduce("); at != std::string::npos;
       at = graph.find("all_reduce(", at + 1))
    ++count;
  EXPECT_EQ(count, 3u) << graph;
  Tensor x = from_vector(std::vector<double>{0.5, -1, 2, 3.25, -4}).to(kFloat32);
  const jit::Stats before = jit::stats();
  Tensor out = traced({x})[0];
  const jit::Stats after = jit::stats();
  EXPECT_EQ(after.replays - before.replays, 1);
  // The collectives run as steps of their own and no kernel spans one: kernels compute c and a
  // before the first, (r1 + r2) * 3 between the second and the in-place one, and the sum after
  // it (c and (r1 + r2) * 3 would join that last kernel if work moved across collectives).
  EXPECT_EQ(after.fused_kernels_run - before.fused_kernels_run, 4) << graph;
  EXPECT_GE(after.unfused_steps_run - before.unfused_steps_run, 3);
  std::vector<double> expected;
  for (double v : testing::values(x)) expected.push_back((v * 5 + 2) + (2 * (v * 2 + 1) * 3 + v));
  testing::expect_close(out, expected, {5}, kFloat32);
  testing::expect_error([&] { traced.save(dir.path + "/f.kiln"); },
                        {"jit::save", "collective (all_reduce)"});
  dist::destroy_process_group();
  testing::expect_error([&] { traced({x}); }, {"all_reduce", "destroyed"});
}

// A group of one whose collectives record how many plan steps had run when each was issued and
// when its result was first waited for.
class RecordingGroup : public dist::ProcessGroup {
 public:
  struct Times {
    int64_t issued = -1, waited = -1;
  };
  std::vector<std::shared_ptr<Times>> log;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "recording"; }
  // One rank: a reduction (AVG too) and a broadcast leave the tensor as it is.
  std::shared_ptr<dist::Work> barrier() override { return issue(); }
  std::shared_ptr<dist::Work> allreduce(Tensor&, dist::ReduceOp) override { return issue(); }
  std::shared_ptr<dist::Work> broadcast(Tensor&, int) override { return issue(); }
  std::shared_ptr<dist::Work> allgather(std::vector<Tensor>& outputs,
                                        const Tensor& input) override {
    outputs.at(0).copy_(input);
    return issue();
  }
  std::shared_ptr<dist::Work> reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                             dist::ReduceOp) override {
    output.copy_(inputs.at(0).view(output.sizes()));
    return issue();
  }

 private:
  static int64_t steps_run() {
    const jit::Stats s = jit::stats();
    return s.fused_kernels_run + s.unfused_steps_run;
  }
  struct RecordingWork : dist::Work {
    std::shared_ptr<Times> times;
    bool is_completed() override { return true; }
    void wait() override {
      if (times->waited < 0) times->waited = steps_run();
    }
  };
  std::shared_ptr<dist::Work> issue() {
    auto work = std::make_shared<RecordingWork>();
    work->times = std::make_shared<Times>();
    work->times->issued = steps_run();
    log.push_back(work->times);
    return work;
  }
};

// A replayed DDP step starts each bucket's all-reduce and goes on with the backward: the plan
// waits for a bucket only where its averages are read (written into the .grads, after the
// backward), as eager DDP's hooks overlap the reductions with the rest of the backward.
TEST(Distributed, TracedDdpReplayOverlapsAllReducesWithTheRestOfTheBackward) {
  auto group = std::make_shared<RecordingGroup>();
  DDP ddp(make_mlp(7), group, /*bucket_cap_mb=*/0.0005);
  const size_t buckets = ddp.bucket_indices().size();
  ASSERT_GE(buckets, 3u);
  optim::SGDOptions options;
  options.lr = 0.1;
  optim::SGD sgd(ddp.parameters(), options);
  jit::Function step = jit::trace(
      [&](const std::vector<Tensor>& in) {
        sgd.zero_grad();
        Tensor loss = mse_loss(ddp(in[0]), in[1]);
        loss.backward();
        sgd.step();
        return std::vector<Tensor>{loss};
      },
      {batch_inputs(), batch_targets()});
  step({batch_inputs(), batch_targets()});  // compiles the kernels
  group->log.clear();
  step({batch_inputs(), batch_targets()});
  ASSERT_EQ(group->log.size(), buckets) << step.graph_str();
  // The first bucket holds the last layer's gradients: the steps computing the other layers'
  // gradients (GEMMs and kernels, at least one per remaining bucket) run while it is in flight.
  // A collective that blocked in its own step would count its step alone.
  const RecordingGroup::Times& first = *group->log.front();
  EXPECT_GE(first.waited - first.issued, static_cast<int64_t>(buckets)) << step.graph_str();
  for (const auto& t : group->log) EXPECT_GT(t->waited, t->issued);
}

// The passes keep every collective: CSE does not merge two of one value, DCE does not remove one
// whose result nothing reads.
TEST(Distributed, PassesKeepEveryAllReduce) {
  jit::Graph g;
  jit::Value* x = g.add_input(jit::ValueType{kFloat32, {4}, kCPU});
  const detail::Attrs attrs = {int64_t(dist::ReduceOp::SUM), int64_t(0)};
  auto reduce = [&](jit::Value* v) {
    return g.create("all_reduce", {v}, attrs, {jit::ValueType{kFloat32, {4}, kCPU}})->output();
  };
  jit::Value* r1 = reduce(x);
  jit::Value* r2 = reduce(x);
  reduce(x);  // read by nothing
  g.add_output(g.create("add", {r1, r2}, {}, {jit::ValueType{kFloat32, {4}, kCPU}})->output());
  jit::run_passes(g);
  size_t count = 0;
  for (const jit::Node* n = g.first(); n; n = n->next()) count += n->kind() == "all_reduce";
  EXPECT_EQ(count, 3u) << g.str();
}

}  // namespace
}  // namespace kiln
