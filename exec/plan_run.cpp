// Running a Plan: binds the inputs and constants to their slots, runs each step through the run
// function of its kind (std::visit; KILN_PROFILE wraps it), and returns the outputs.
#include <atomic>
#include <functional>
#include <utility>

#include "exec/exec_state.h"
#include "exec/executor.h"
#include "exec/invoke.h"
#include "exec/kernel_step.h"
#include "exec/plan_step.h"
#include "exec/scratch.h"
#include "exec/step_profile.h"
#include "kiln/error.h"
#include "lib/cuda_tensor.h"
#include "lib/profiler.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// This thread's spare vectors (ScratchTensors), made at its first give-back. Reached through a
// plain pointer thread-local: no constructor or destructor, so taking a spare costs no TLS guard
// or __tls_get_addr call (a thread_local vector of vectors had cost a small replay a tenth of its
// time), and the initial-exec TLS block stays small. SparesCloser deletes them at thread exit.
constexpr size_t kMaxSpares = 16;
constexpr size_t kMaxKept = 1024;  // tensors (16 KiB of handles)
struct Spares {
  std::vector<Tensor>* v[kMaxSpares] = {};
  size_t n = 0;
};
__attribute__((tls_model("initial-exec"))) thread_local Spares* t_spares = nullptr;
// The thread is exiting: vectors given back are deleted.
__attribute__((tls_model("initial-exec"))) thread_local bool t_spares_closed = false;

struct SparesCloser {
  ~SparesCloser() {
    t_spares_closed = true;
    while (t_spares->n > 0) delete t_spares->v[--t_spares->n];
    delete t_spares;
    t_spares = nullptr;
  }
};

// This thread's spares, made on first use; null once the thread is exiting.
Spares* spares() {
  if (Spares* s = t_spares) return s;
  if (t_spares_closed) return nullptr;
  static thread_local SparesCloser closer;
  t_spares = new Spares();
  return t_spares;
}
}  // namespace

ScratchTensors::ScratchTensors() {
  Spares* s = t_spares;
  v_ = s && s->n > 0 ? s->v[--s->n] : new std::vector<Tensor>();
}

ScratchTensors::~ScratchTensors() {
  v_->clear();
  Spares* s = spares();
  // A large plan's slots are not kept: a thread would hold their capacity for good.
  if (!s || s->n == kMaxSpares || v_->capacity() > kMaxKept) {
    delete v_;
    return;
  }
  s->v[s->n++] = v_;
}

namespace {
// A run's collectives in flight: (the step that started one, its wait), in start order.
using InFlight = std::vector<std::pair<size_t, std::function<void()>>>;

void finish_collective(InFlight& in_flight, size_t step) {
  for (auto& [started_by, wait] : in_flight) {
    if (started_by != step || !wait) continue;
    std::function<void()> w = std::move(wait);
    wait = nullptr;
    w();
    return;
  }
}

// Whether a step may write a value of `type` into `target` (a graph input): the target is a whole,
// contiguous, concrete buffer of that type that no other graph input shares, and the step reads
// it, if at all, at the element it writes (contiguous, from the same first element).
bool writable_in_place(const Tensor& target, const ValueType& type, const std::vector<Tensor>& args,
                       const std::vector<Tensor>& inputs) {
  if (!target.defined() || target.dtype() != type.dtype || !target.is_contiguous()) return false;
  const detail::Storage* storage = target.impl()->storage.get();
  const int64_t numel = detail::shape_numel(type.sizes);
  if (storage->pending.load(std::memory_order_acquire) || target.numel() != numel ||
      static_cast<size_t>(numel) * element_size(type.dtype) != storage->nbytes)
    return false;
  int sharing = 0;
  for (const Tensor& t : inputs) sharing += t.defined() && t.impl()->storage.get() == storage;
  if (sharing != 1) return false;
  for (const Tensor& a : args) {
    if (!a.defined() || a.impl()->storage.get() != storage) continue;
    if (a.impl()->data() != target.impl()->data() || !a.is_contiguous() || a.numel() != numel)
      return false;
  }
  return true;
}

// One run's state, shared by its steps.
struct RunState {
  const std::vector<Tensor>& inputs;
  std::vector<Tensor>& args;  // the running step's inputs
  std::vector<Tensor>& outs;  // and its outputs
  const PlanArena* arena;
  bool warm;  // the plan ran before: in-place writes may start
  ExecState& counts;
  InFlight in_flight;
};

// The run function of each kind of step: reads run.args, sets run.outs; returns the symbol of
// the kernel it ran, or null.
struct RunStep {
  const PlanStep& step;
  RunState& run;

  const char* operator()(const InvokeStep& s) const {
    if (step.cuda_device >= 0) {
      run.outs = s.through_host ? invoke_through_host(*step.node, run.args)
                                : invoke_in_scope(*step.node, run.args);
      run.counts.unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    run.outs = invoke_in_scope(*step.node, run.args);
    if (step.node->op().kind != detail::OpKind::View)
      run.counts.unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const char* operator()(const DirectStep& s) const {
    allocate_outputs(s.own);
    s.map_into(run.outs[0], run.args.data(), step.node->attrs());
    run.counts.unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const char* operator()(const KernelStep& k) const {
    allocate_outputs(k.own);
    const char* kernel = run_kernel_step(step, k, run.args, run.outs);
    run.counts.fused_kernels_run.fetch_add(1, std::memory_order_relaxed);
    return kernel;
  }
  const char* operator()(const CollectiveStep& c) const {
    detail::StartedCollective started = c.start(run.args, step.node->attrs());
    run.outs = std::move(started.outputs);
    run.in_flight.emplace_back(static_cast<size_t>(&step - plan_steps_begin),
                               std::move(started.wait));
    run.counts.unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }

  // The outputs of a direct or kernel step: its arena values, its input's buffer where it
  // computes in place (from the plan's second run on), fresh tensors otherwise.
  void allocate_outputs(const OwnOutputs& own) const {
    run.outs.clear();
    const fuser::FusionGroup* g = step.group();
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      if (own.arena[k] >= 0) {
        run.outs.push_back(run.arena->values[static_cast<size_t>(own.arena[k])]);
        continue;
      }
      const ValueType& type = g ? g->outputs[k]->type() : step.node->output()->type();
      if (own.in_place[k] >= 0 && run.warm) {
        const Tensor& target = run.inputs[static_cast<size_t>(own.in_place[k])];
        if (writable_in_place(target, type, run.args, run.inputs)) {
          run.outs.push_back(target.view(type.sizes));
          run.counts.in_place_writes.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
      }
      run.outs.push_back(step.cuda_device < 0
                             ? detail::make_empty(type.sizes, type.dtype)
                             : detail::make_empty_on(type.sizes, type.dtype, type.device));
    }
  }

  const PlanStep* plan_steps_begin;
};

// Holds the plan's arena for a run, or makes one of the run's own while another run holds it.
class ArenaHold {
 public:
  ArenaHold(const std::vector<ArenaValue>& values, size_t bytes, std::unique_ptr<PlanArena>& shared,
            std::atomic<bool>& busy) {
    if (values.empty()) return;
    if (!busy.exchange(true, std::memory_order_acquire)) {
      busy_ = &busy;
      if (!shared) shared = make_arena(values, bytes);
      arena_ = shared.get();
    } else {
      own_ = make_arena(values, bytes);
      arena_ = own_.get();
    }
  }
  ~ArenaHold() {
    if (busy_) busy_->store(false, std::memory_order_release);
  }
  ArenaHold(const ArenaHold&) = delete;
  ArenaHold& operator=(const ArenaHold&) = delete;
  const PlanArena* get() const { return arena_; }

 private:
  std::atomic<bool>* busy_ = nullptr;
  std::unique_ptr<PlanArena> own_;
  const PlanArena* arena_ = nullptr;
};
}  // namespace

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(inputs.size() == input_slots_.size(), "jit: the graph takes ", input_slots_.size(),
             " inputs, got ", inputs.size());
  ScratchTensors slots_scratch, args_scratch, outs_scratch;
  std::vector<Tensor>& slots = *slots_scratch;
  slots.resize(num_slots_);
  for (size_t i = 0; i < inputs.size(); ++i)
    slots[static_cast<size_t>(input_slots_[i])] = inputs[i];
  for (const auto& [slot, value] : constants_) slots[static_cast<size_t>(slot)] = value;
  const ArenaHold arena(arena_values_, arena_bytes_, arena_, arena_busy_);
  EagerScope eager;
  RunState run{inputs,
               *args_scratch,
               *outs_scratch,
               arena.get(),
               warm_.load(std::memory_order_acquire),
               exec_state(),
               {}};
  // Read once per run: off, the steps' only profiling cost is a branch on this.
  const bool profiling = detail::profiling();
  StepProfiler profiler(profiling, graph_);
  for (const PlanStep& step : steps_) {
    for (size_t started_by : step.wait_for) finish_collective(run.in_flight, started_by);
    run.args.clear();
    for (int64_t s : step.inputs)
      run.args.push_back(s < 0 ? Tensor() : slots[static_cast<size_t>(s)]);
    const RunStep runner{step, run, steps_.data()};
    if (profiling)
      profiler.run(step, run.args, run.outs, [&] { return std::visit(runner, step.kind); });
    else
      std::visit(runner, step.kind);
    for (int64_t s : step.release) slots[static_cast<size_t>(s)] = Tensor();
    for (size_t k = 0; k < run.outs.size(); ++k) {
      bool released = false;
      for (int64_t r : step.release) released |= r == step.outputs[k];
      if (!released) slots[static_cast<size_t>(step.outputs[k])] = std::move(run.outs[k]);
    }
  }
  for (const auto& entry : run.in_flight) finish_collective(run.in_flight, entry.first);
  if (profiling) profiler.finish();
  warm_.store(true, std::memory_order_release);
  return results(slots);
}

std::vector<Tensor> Plan::results(const std::vector<Tensor>& slots) const {
  std::vector<Tensor> result;
  result.reserve(output_slots_.size());
  for (int64_t s : output_slots_) {
    Tensor t = slots[static_cast<size_t>(s)];
    // A plan's constants are reused by every run: callers get their own copy.
    if (t.defined() && !constant_storages_.empty() &&
        constant_storages_.contains(t.impl()->storage.get()))
      t = t.clone();
    result.push_back(std::move(t));
  }
  return result;
}

PlanRunCounts plan_run_counts() {
  const ExecState& s = exec_state();
  return {s.fused_kernels_run.load(std::memory_order_relaxed),
          s.unfused_steps_run.load(std::memory_order_relaxed),
          s.in_place_writes.load(std::memory_order_relaxed)};
}

std::vector<Tensor> run_graph(const Graph& graph, const std::vector<Tensor>& inputs) {
  return Plan(graph).run(inputs);
}

}  // namespace kiln::jit
