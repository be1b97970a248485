// Stress tests of kiln's threading contract (docs/architecture.md, "Threads"): tensors and modules
// used by one thread at a time work from any number of threads at once; a pending tensor read from
// several threads is computed once and all see its value; a traced function replays from several
// threads (training steps one at a time, pure functions concurrently). Every thread's result is
// compared with the same program run on one thread. Bounded in time, fixed seeds; tools/sanitize
// runs them under ThreadSanitizer.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "exec/lazy_eval.h"
#include "jit/infer.h"
#include "jit/ir.h"
#include "kiln/jit.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::values;

constexpr int kThreads = 4;

// Iterations shrink under sanitizers (KILN_TEST_SCALE), never below a few rounds.
int scaled(int n) {
  return static_cast<int>(testing::scaled(n, 2));
}

// Runs body(i) on kThreads threads that start together.
void run_threads(const std::function<void(int)>& body) {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (++arrived == kThreads) cv.notify_all();
        cv.wait(lock, [&] { return arrived == kThreads; });
      }
      try {
        body(i);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << i << " raised: " << e.what();
      }
    });
  for (auto& t : threads) t.join();
}

struct Mlp {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Adam> opt;
};

Mlp make_mlp(uint64_t seed) {
  manual_seed(seed);
  Mlp m;
  m.model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 32), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(32, 4)});
  m.opt = std::make_unique<optim::Adam>(m.model->parameters(), optim::AdamOptions{1e-2});
  return m;
}

void train_step(Mlp& m, const Tensor& x, const Tensor& target) {
  m.opt->zero_grad();
  Tensor loss = cross_entropy(m.model->forward(x), target);
  loss.backward();
  m.opt->step();
}

std::vector<std::vector<double>> parameter_values(const Mlp& m) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : m.model->parameters()) out.push_back(values(p));
  return out;
}

struct Batch {
  Tensor x, target;
};
Batch make_batch(uint64_t seed) {
  manual_seed(seed);
  return {randn({16, 8}), randint(4, {16})};
}

// Each thread trains its own MLP with Adam; each ends where the same training on one thread ends.
TEST(Concurrency, ThreadsTrainingTheirOwnModelsMatchOneThread) {
  const int steps = scaled(30);
  std::vector<Mlp> models;
  std::vector<Batch> batches;
  for (int i = 0; i < kThreads; ++i) {
    models.push_back(make_mlp(100 + i));
    batches.push_back(make_batch(200 + i));
  }
  run_threads([&](int i) {
    for (int s = 0; s < steps; ++s) train_step(models[i], batches[i].x, batches[i].target);
  });
  for (int i = 0; i < kThreads; ++i) {
    Mlp alone = make_mlp(100 + i);
    for (int s = 0; s < steps; ++s) train_step(alone, batches[i].x, batches[i].target);
    EXPECT_EQ(parameter_values(models[i]), parameter_values(alone)) << "thread " << i;
  }
}

// A pending tensor read from several threads at once is computed once; all see its value.
TEST(Concurrency, PendingTensorReadFromThreadsIsComputedOnce) {
  for (int round = 0; round < scaled(20); ++round) {
    manual_seed(round);
    Tensor a = randn({64, 33});
    Tensor y = (a * 2.f + 1.f).tanh().sum(std::vector<int64_t>{1});
    Tensor expected;
    {
      LazyGuard eager(false);
      expected = (a * 2.f + 1.f).tanh().sum(std::vector<int64_t>{1});
    }
    ASSERT_TRUE(detail::is_pending(y));
    const int64_t before = jit::lazy_stats().evaluations;
    std::vector<std::vector<double>> seen(kThreads);
    // Read through the data pointer: values() would record a cast on each thread.
    run_threads([&](int i) {
      const float* p = y.data_ptr<float>();
      seen[i].assign(p, p + y.numel());
    });
    EXPECT_EQ(jit::lazy_stats().evaluations - before, 1) << "round " << round;
    const std::vector<float> want = expected.to_vector<float>();
    for (int i = 0; i < kThreads; ++i)
      EXPECT_EQ(seen[i], std::vector<double>(want.begin(), want.end())) << "thread " << i;
  }
}

// A handshake between a test's threads: stages numbered from 0, advanced and awaited.
class Stages {
 public:
  // Sets the stage to `to`, then waits until it is at least `until`.
  void advance(int to, int until = 0) {
    std::unique_lock<std::mutex> lock(mu_);
    stage_ = to;
    cv_.notify_all();
    cv_.wait(lock, [&] { return stage_ >= until; });
  }
  void wait_for(int at_least) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stage_ >= at_least; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int stage_ = 0;
};

// Reads y's first three values through the mutable data_ptr() (which prepares a write, and so
// flushes every thread's pending work: what the tests below need) on a new thread: the read must
// raise nothing and evaluate exactly once. Returns what it read.
std::vector<double> read_once_on_another_thread(Tensor y) {
  const int64_t before = jit::lazy_stats().evaluations;
  std::vector<double> seen;
  std::thread reader([&] {
    try {
      const float* p = y.data_ptr<float>();
      seen.assign(p, p + 3);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the reader raised: " << e.what();
    }
  });
  reader.join();
  EXPECT_EQ(jit::lazy_stats().evaluations - before, 1);
  return seen;
}

// Type inference (jit/infer.cpp, run while a plan is built and by KILN_VERIFY) records an op on
// pending placeholders whose producer never runs, on the thread building the plan. A read on
// another thread of a tensor recorded elsewhere flushes every thread's pending work; it used to
// take those nodes too, evaluating a placeholder (an undefined graph input): "sizes: called on an
// undefined tensor" and a second evaluation for one read. Here one thread stops inside inference,
// as infer_output_types records, while another reads.
TEST(Concurrency, ReadWhileAnotherThreadInfersTypes) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3});
  Tensor y = (x * 2.f).exp();
  ASSERT_TRUE(detail::is_pending(y));
  Stages stages;
  std::thread inferring([&] {
    LazyGuard lazy(true);
    NoGradGuard no_grad;
    detail::EvaluationScope no_flush;
    detail::InferenceScope scope;
    Tensor placeholder = detail::lazy_record1(jit::input_op(), {}, {int64_t{-1}}, {{3}, kFloat32});
    Tensor inferred = placeholder.tanh();
    stages.advance(1, 2);
    EXPECT_TRUE(detail::is_pending(inferred));
  });
  stages.wait_for(1);
  const std::vector<double> seen = read_once_on_another_thread(y);
  LazyGuard eager(false);
  EXPECT_EQ(seen, values((x * 2.f).exp()));
  stages.advance(2);
  inferring.join();
}

// The same with real inference: one thread checks a graph's types over and over (as KILN_VERIFY
// does after each pass) while another reads pending tensors recorded on a third; each read is one
// evaluation and raises nothing.
TEST(Concurrency, ReadsWhileAnotherThreadVerifiesGraphs) {
  manual_seed(3);
  Tensor a = randn({8, 5});
  std::unique_ptr<jit::Graph> graph;
  {
    Tensor g = (a * 2.f + 1.f).tanh().sum(std::vector<int64_t>{1});
    jit::LazyGraphBinding binding;
    graph = jit::build_graph({g.impl()->storage->lazy}, &binding, false);
  }
  a.data_ptr<float>();
  std::atomic<bool> done{false};
  std::thread verifier([&] {
    while (!done.load()) jit::verify_types(*graph);
  });
  // Each value is recorded here and read on a thread of its own: the read flushes every thread's
  // pending roots, which are this value's alone.
  const int reads = scaled(200);
  int64_t extra = 0;
  std::vector<Tensor> read;
  for (int k = 0; k < reads; ++k) {
    Tensor y = (a * static_cast<float>(k)).exp();
    const int64_t before = jit::lazy_stats().evaluations;
    std::thread reader([&] {
      try {
        y.data_ptr<float>();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "read " << k << " raised: " << e.what();
      }
    });
    reader.join();
    extra += jit::lazy_stats().evaluations - before - 1;
    read.push_back(y);
  }
  done = true;
  verifier.join();
  EXPECT_EQ(extra, 0) << "evaluations beyond one per read";
  LazyGuard eager(false);
  for (int k = 0; k < reads; ++k)
    ASSERT_EQ(values(read[k]), values((a * static_cast<float>(k)).exp())) << "read " << k;
}

// The same for a trace: a read on one thread that flushes every thread's pending work, while
// another thread is inside jit::trace, used to evaluate the trace's nodes and raise ("a value
// computed inside jit::trace from its argument 0 was used outside the trace").
TEST(Concurrency, ReadWhileAnotherThreadTraces) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3});
  Tensor y = (x * 2.f).exp();
  ASSERT_TRUE(detail::is_pending(y));
  Stages stages;
  std::thread tracing([&] {
    auto fn = [&](const std::vector<Tensor>& in) {
      Tensor traced = (in[0] + 1.f).tanh();
      stages.advance(1, 2);
      return std::vector<Tensor>{traced};
    };
    const Tensor example = from_vector(std::vector<float>{4, 5, 6});
    jit::Function f = jit::trace(fn, {example});
    LazyGuard eager(false);
    EXPECT_EQ(values(f({example})[0]), values((example + 1.f).tanh()));
  });
  stages.wait_for(1);
  const std::vector<double> seen = read_once_on_another_thread(y);
  stages.advance(2);
  tracing.join();
  LazyGuard eager(false);
  EXPECT_EQ(seen, values((x * 2.f).exp()));
}

// Threads record their own ops on one shared pending tensor and read them, while others read it.
TEST(Concurrency, ThreadsBuildOnASharedPendingTensor) {
  auto program = [](const Tensor& shared, int i) {
    Tensor mine = (shared * static_cast<float>(i + 1)).sum(std::vector<int64_t>{0});
    return values(mine + shared[i]);
  };
  for (int round = 0; round < scaled(20); ++round) {
    manual_seed(1000 + round);
    Tensor a = randn({32, 16});
    Tensor shared = a.exp() - 1.f;
    std::vector<std::vector<double>> seen(kThreads);
    run_threads([&](int i) { seen[i] = program(shared, i); });
    for (int i = 0; i < kThreads; ++i)
      EXPECT_EQ(seen[i], program(a.exp() - 1.f, i)) << "thread " << i;
  }
}

// A write on one thread to a tensor that another thread's pending work reads runs that work first:
// it sees the value from before the write, as in eager mode.
TEST(Concurrency, WriteRunsAnotherThreadsPendingReadersFirst) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3});
  Tensor y;
  std::thread recorder([&] { y = x * 2.f; });
  recorder.join();
  ASSERT_TRUE(detail::is_pending(y));
  x.add_(100.f);
  EXPECT_EQ(values(y), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(values(x), (std::vector<double>{101, 102, 103}));
}

// Pending tensors outlive the thread that recorded them.
TEST(Concurrency, PendingWorkOfAnEndedThreadStillComputes) {
  std::vector<Tensor> made(kThreads);
  run_threads([&](int i) {
    made[i] = (arange(0, 5, 1, TensorOptions().dtype(kFloat32)) + static_cast<float>(i)).exp();
  });
  for (int i = 0; i < kThreads; ++i) {
    LazyGuard eager(false);
    Tensor expected =
        (arange(0, 5, 1, TensorOptions().dtype(kFloat32)) + static_cast<float>(i)).exp();
    EXPECT_EQ(values(made[i]), values(expected)) << "thread " << i;
  }
}

// The first calls of a fresh traced function, from several threads at once: one trace, and every
// result equals eager mode's.
TEST(Concurrency, FirstCallsOfATracedFunctionFromThreads) {
  for (int round = 0; round < scaled(10); ++round) {
    auto fn = [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{(in[0] * in[1] + 1.f).sigmoid().sum(std::vector<int64_t>{1})};
    };
    manual_seed(round);
    std::vector<Tensor> a, b;
    for (int i = 0; i < kThreads; ++i) {
      a.push_back(randn({8, 5}));
      b.push_back(randn({8, 5}));
    }
    jit::Function f = jit::trace(fn, {a[0], b[0]});
    std::vector<std::vector<double>> seen(kThreads);
    run_threads([&](int i) { seen[i] = values(f({a[i], b[i]})[0]); });
    EXPECT_EQ(f.num_specializations(), 1u);
    for (int i = 0; i < kThreads; ++i)
      EXPECT_EQ(seen[i], values(f({a[i], b[i]})[0])) << "thread " << i;
  }
}

// A pure traced function replayed from several threads on different inputs at once.
TEST(Concurrency, PureReplaysRunConcurrently) {
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{(in[0].tanh() * 3.f - in[0]).softmax(1)};
  };
  manual_seed(7);
  jit::Function f = jit::trace(fn, {randn({4, 9})});
  const int calls = scaled(50);
  std::vector<std::vector<Tensor>> inputs(kThreads), outputs(kThreads);
  for (int i = 0; i < kThreads; ++i)
    for (int c = 0; c < calls; ++c) inputs[i].push_back(randn({4, 9}));
  run_threads([&](int i) {
    for (int c = 0; c < calls; ++c) outputs[i].push_back(f({inputs[i][c]})[0]);
  });
  // Equal to the same replays on one thread (and close to eager mode: fused sums may associate
  // differently).
  for (int i = 0; i < kThreads; ++i)
    for (int c = 0; c < calls; ++c) {
      ASSERT_EQ(values(outputs[i][c]), values(f({inputs[i][c]})[0]))
          << "thread " << i << ", call " << c;
      LazyGuard eager(false);
      ASSERT_TRUE(allclose(outputs[i][c], fn({inputs[i][c]})[0], 1e-6, 1e-7));
    }
}

// A traced training step (forward, backward, Adam) replayed from several threads: replays that
// write captured parameters run one at a time, so the parameters end where as many replays on one
// thread end.
TEST(Concurrency, TracedTrainingStepReplaysSerialize) {
  const int per_thread = scaled(10);
  const Batch batch = make_batch(5);
  auto step_of = [&](Mlp& m) {
    return jit::trace(
        [&m](const std::vector<Tensor>& in) {
          train_step(m, in[0], in[1]);
          return std::vector<Tensor>{};
        },
        {batch.x, batch.target});
  };
  Mlp shared = make_mlp(9);
  jit::Function step = step_of(shared);
  run_threads([&](int) {
    for (int s = 0; s < per_thread; ++s) step({batch.x, batch.target});
  });
  Mlp alone = make_mlp(9);
  jit::Function alone_step = step_of(alone);
  for (int s = 0; s < kThreads * per_thread; ++s) alone_step({batch.x, batch.target});
  EXPECT_EQ(parameter_values(shared), parameter_values(alone));
}

}  // namespace
}  // namespace kiln
