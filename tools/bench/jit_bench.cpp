// JIT overhead benchmarks (issue 4), each figure printed next to its target and next to a reference
// measured earlier in the same run:
//   BM_JitEagerOps/*, BM_JitRecordOps/*: per-op cost of 1000 elementwise ops on a [1] float32
//     tensor, run eagerly and recorded in lazy mode (recording only; dropping the pending chain,
//     which frees its nodes, is timed apart). Target: recording < 300 ns/op.
//   BM_JitCall10Ops/*: one call of a 10-op function on a [1] float32 tensor: eager, lazy with
//     kiln::eval of the result, and replayed by a jit::trace'd Function. Target: replay <= 0.3 us.
//   BM_ProfileReplay10Ops/{off,on}: the replay with the profiler off and on (issue 7); off should
//     match BM_JitCall10Ops/replay within noise.
//   BM_JitPasses/*: run_passes (verification off) on chain and wide graphs of 10k, 100k and 1M
//     nodes, built directly through the Graph API; ns/node should not grow with the size.
// Benchmarks run in registration order, so each ratio's reference (eager ops, the eager call, the
// smaller graphs) has run before the figure that reads it; when a filter leaves the reference out,
// the ratio is not printed. Times are taken with std::chrono around the measured part only (manual
// time where part of each iteration is excluded), and the per-unit figures are plain counters:
//   ns_per_op, drop_ns_per_op, us_per_call, ns_per_node  (absolute)
//   vs_target, vs_eager, vs_lazy_eval, vs_10k, vs_prev   (ratios: measured / reference)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jit/ir.h"
#include "jit/passes/passes.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/profiler.h"
#include "lib/op_table.h"

namespace {

using kiln::Tensor;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Figures measured earlier in this run, by key, for the ratios of later benchmarks.
std::map<std::string, double>& references() {
  static std::map<std::string, double> refs;
  return refs;
}
void set_reference(const std::string& key, double value) {
  references()[key] = value;
}
// Sets counter `name` to value / the reference `key`, when that reference was measured.
void set_ratio(benchmark::State& state, const char* name, double value, const std::string& key) {
  auto it = references().find(key);
  if (it != references().end() && it->second > 0) state.counters[name] = value / it->second;
}

constexpr double kRecordTargetNs = 300;  // issue 4: lazy recording per op
constexpr double kReplayTargetUs = 0.3;  // replay of a traced 10-op graph on [1], per call

// ------------------------------------------------------------------------- per-op recording cost
// The ops of a batch, alternating two of a kind: with a C++ scalar (each call wraps it in a 0-dim
// tensor), with a concrete [1] tensor, or unary.
enum class OpMix { Scalar, Tensor, Unary };

const char* mix_name(OpMix mix) {
  switch (mix) {
    case OpMix::Scalar:
      return "scalar";
    case OpMix::Tensor:
      return "tensor";
    case OpMix::Unary:
      return "unary";
  }
  return "";
}

Tensor apply_op(OpMix mix, const Tensor& y, const Tensor& b, int i) {
  switch (mix) {
    case OpMix::Scalar:
      return i % 2 ? y * 1.5 : y + 0.25;
    case OpMix::Tensor:
      return i % 2 ? y * b : y + b;
    case OpMix::Unary:
      return i % 2 ? kiln::neg(y) : kiln::abs(y);
  }
  return y;
}

// Ops per batch: well below KILN_MAX_PENDING (10000 by default), past which recording flushes.
constexpr int kOpsPerBatch = 1000;

// Concrete operands: ones, so that repeated products and sums reach inf without denormals.
struct Operands {
  Tensor x, b;
  Operands() {
    kiln::LazyGuard eager(false);
    x = kiln::ones({1});
    b = kiln::ones({1});
  }
};

// The reference: the same batch run eagerly (each op allocates and computes its [1] result).
void BM_JitEagerOps(benchmark::State& state, OpMix mix) {
  Operands in;
  kiln::LazyGuard eager(false);
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    Tensor y = in.x;
    for (int i = 0; i < kOpsPerBatch; ++i) y = apply_op(mix, y, in.b, i);
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  const double ns_per_op =
      seconds(start, Clock::now()) * 1e9 / (static_cast<double>(state.iterations()) * kOpsPerBatch);
  state.counters["ns_per_op"] = ns_per_op;
  set_reference(std::string("eager/") + mix_name(mix), ns_per_op);
  state.SetLabel("eager, per op: allocate + compute a [1] result");
}

// Records the batch as one chain of pending nodes, then drops its last tensor, which frees the
// chain. The benchmark's time is the recording alone (manual time); drop_ns_per_op is the freeing.
void BM_JitRecordOps(benchmark::State& state, OpMix mix) {
  Operands in;
  kiln::LazyGuard lazy(true);
  {
    // Recording must leave kOpsPerBatch pending nodes, and dropping must free them.
    const int64_t pending = kiln::jit::stats().pending_nodes;
    Tensor y = in.x;
    for (int i = 0; i < kOpsPerBatch; ++i) y = apply_op(mix, y, in.b, i);
    const int64_t recorded = kiln::jit::stats().pending_nodes - pending;
    y = Tensor();
    const int64_t left = kiln::jit::stats().pending_nodes - pending;
    if (recorded != kOpsPerBatch || left != 0) {
      state.SkipWithError(("expected " + std::to_string(kOpsPerBatch) +
                           " pending nodes, freed on "
                           "drop; got " +
                           std::to_string(recorded) + ", " + std::to_string(left) +
                           " left after the drop")
                              .c_str());
      return;
    }
  }
  const int64_t evaluations = kiln::jit::stats().evaluations;
  double record_s = 0, drop_s = 0;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    Tensor y = in.x;
    for (int i = 0; i < kOpsPerBatch; ++i) y = apply_op(mix, y, in.b, i);
    const Clock::time_point t1 = Clock::now();
    y = Tensor();
    const Clock::time_point t2 = Clock::now();
    record_s += seconds(t0, t1);
    drop_s += seconds(t1, t2);
    state.SetIterationTime(seconds(t0, t1));
  }
  if (kiln::jit::stats().evaluations != evaluations) {
    state.SkipWithError("recording ran a graph: the batch must stay pending");
    return;
  }
  const double ops = static_cast<double>(state.iterations()) * kOpsPerBatch;
  const double ns_per_op = record_s * 1e9 / ops;
  state.counters["ns_per_op"] = ns_per_op;
  state.counters["drop_ns_per_op"] = drop_s * 1e9 / ops;
  state.counters["vs_target"] = ns_per_op / kRecordTargetNs;
  set_ratio(state, "vs_eager", ns_per_op, std::string("eager/") + mix_name(mix));
  state.SetLabel("lazy recording only, per op; target 300 ns/op");
}

BENCHMARK_CAPTURE(BM_JitEagerOps, scalar, OpMix::Scalar)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JitEagerOps, tensor, OpMix::Tensor)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JitEagerOps, unary, OpMix::Unary)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JitRecordOps, scalar, OpMix::Scalar)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_JitRecordOps, tensor, OpMix::Tensor)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_JitRecordOps, unary, OpMix::Unary)
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime();

// ------------------------------------------------------------------- per-call cost of 10 ops
// Ten elementwise ops: with scalars, unary, and with the input itself.
std::vector<Tensor> ten_ops(const std::vector<Tensor>& in) {
  const Tensor& x = in[0];
  Tensor y = x * 1.5;
  y = y + 0.25;
  y = kiln::tanh(y);
  y = y * 2.0;
  y = y - 0.5;
  y = kiln::sigmoid(y);
  y = y * x;
  y = y + x;
  y = kiln::neg(y);
  y = kiln::exp(y);
  return {y};
}

enum class CallMode { Eager, LazyEval, Replay };

// One call with a concrete result: eager (LazyGuard(false)), lazy mode and kiln::eval (build the
// graph, optimize, plan and run it on every call), or a traced Function's replay.
void BM_JitCall10Ops(benchmark::State& state, CallMode mode) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({1});
  }
  kiln::jit::Function f;
  if (mode == CallMode::Replay) {
    f = kiln::jit::trace(ten_ops, {x});
    benchmark::DoNotOptimize(f({x})[0].raw_data_ptr());  // the first call traces
  }
  kiln::LazyGuard guard(mode != CallMode::Eager);
  const int64_t replays = kiln::jit::stats().replays;
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    switch (mode) {
      case CallMode::Eager: {
        Tensor y = ten_ops({x})[0];
        benchmark::DoNotOptimize(y.raw_data_ptr());
        break;
      }
      case CallMode::LazyEval: {
        Tensor y = ten_ops({x})[0];
        kiln::eval(y);
        benchmark::DoNotOptimize(y.raw_data_ptr());
        break;
      }
      case CallMode::Replay: {
        Tensor y = f({x})[0];
        benchmark::DoNotOptimize(y.raw_data_ptr());
        break;
      }
    }
  }
  const double us_per_call =
      seconds(start, Clock::now()) * 1e6 / static_cast<double>(state.iterations());
  state.counters["us_per_call"] = us_per_call;
  switch (mode) {
    case CallMode::Eager:
      set_reference("call/eager", us_per_call);
      state.SetLabel("eager, 10 ops");
      break;
    case CallMode::LazyEval:
      set_reference("call/lazy_eval", us_per_call);
      set_ratio(state, "vs_eager", us_per_call, "call/eager");
      state.SetLabel("lazy: record 10 ops + eval (graph, passes, plan, run)");
      break;
    case CallMode::Replay: {
      if (kiln::jit::stats().replays - replays != static_cast<int64_t>(state.iterations())) {
        state.SkipWithError("a call was not served by the traced plan");
        return;
      }
      set_reference("call/replay", us_per_call);
      state.counters["vs_target"] = us_per_call / kReplayTargetUs;
      set_ratio(state, "vs_eager", us_per_call, "call/eager");
      set_ratio(state, "vs_lazy_eval", us_per_call, "call/lazy_eval");
      const std::string graph = f.graph_str();
      int64_t lines = 0;
      for (char c : graph) lines += c == '\n';
      state.SetLabel("traced replay; target 0.3 us/call; optimized graph of " +
                     std::to_string(lines) + " lines");
      break;
    }
  }
}

BENCHMARK_CAPTURE(BM_JitCall10Ops, eager, CallMode::Eager)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JitCall10Ops, lazy_eval, CallMode::LazyEval)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JitCall10Ops, replay, CallMode::Replay)->Unit(benchmark::kMicrosecond);

// The profiler's cost on the same replay (issue 7): off, each hook is one relaxed atomic load and a
// branch, so `off` should equal BM_JitCall10Ops/replay within noise; on, each call stores the
// replay's and its steps' spans (cleared every 4096 calls so memory stays bounded; the clearing
// is not timed).
void BM_ProfileReplay10Ops(benchmark::State& state, bool on) {
  Tensor x;
  {
    kiln::LazyGuard eager(false);
    x = kiln::randn({1});
  }
  kiln::jit::Function f = kiln::jit::trace(ten_ops, {x});
  benchmark::DoNotOptimize(f({x})[0].raw_data_ptr());
  kiln::LazyGuard guard(true);
  kiln::profiler::reset();
  kiln::profiler::ProfileGuard profiling(on);
  Clock::duration measured{};
  int64_t calls = 0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    Tensor y = f({x})[0];
    benchmark::DoNotOptimize(y.raw_data_ptr());
    y = Tensor();
    measured += Clock::now() - start;
    if (++calls % 4096 == 0) kiln::profiler::reset();
  }
  const int64_t spans = static_cast<int64_t>(kiln::profiler::records().size());
  kiln::profiler::reset();
  const double us_per_call = std::chrono::duration<double>(measured).count() * 1e6 /
                             static_cast<double>(state.iterations());
  state.counters["us_per_call"] = us_per_call;
  set_ratio(state, "vs_replay", us_per_call, "call/replay");
  if (on && spans == 0) state.SkipWithError("profiling on recorded nothing");
  if (!on && spans != 0) state.SkipWithError("profiling off recorded spans");
  state.SetLabel(on ? "replay, profiling on" : "replay, profiling off");
}
BENCHMARK_CAPTURE(BM_ProfileReplay10Ops, off, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ProfileReplay10Ops, on, true)->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------- pass time per node
enum class GraphShape { Chain, Wide };

const char* shape_name(GraphShape shape) {
  return shape == GraphShape::Chain ? "chain" : "wide";
}

struct Ops {
  const kiln::detail::OpDef& mul = *kiln::detail::find_op("mul");
  const kiln::detail::OpDef& add = *kiln::detail::find_op("add");
  const kiln::detail::OpDef& exp = *kiln::detail::find_op("exp");
  const kiln::detail::OpDef& neg = *kiln::detail::find_op("neg");
};

kiln::jit::Value* make(kiln::jit::Graph& g, const kiln::detail::OpDef& def,
                       const std::vector<kiln::jit::Value*>& inputs, kiln::jit::Attrs attrs = {}) {
  kiln::jit::ValueType type = inputs[0]->type();
  return g.create(def, inputs, std::move(attrs), {std::move(type)})->output();
}

// About `nodes` nodes on one f32[4] input.
// chain: mul by 1.5, add 0.25, exp, neg, repeated; every scalar is its own constant node, as lazy
//   recording makes them, so CSE merges them all.
// wide: exp(x * c_i) for distinct constants c_i (nothing merges; x has nodes/4 uses), summed
//   pairwise level by level into one output.
std::unique_ptr<kiln::jit::Graph> build_graph(GraphShape shape, int64_t nodes) {
  using kiln::jit::Value;
  static const Ops ops;
  auto g = std::make_unique<kiln::jit::Graph>();
  Value* x = g->add_input(kiln::jit::ValueType{kiln::kFloat32, {4}, kiln::kCPU, false});
  if (shape == GraphShape::Chain) {
    Value* v = x;
    for (int64_t i = 0; static_cast<int64_t>(g->size()) < nodes; ++i) {
      switch (i % 4) {
        case 0:
          v = make(*g, ops.mul, {v, g->constant(kiln::jit::AttrValue(1.5), kiln::kFloat64)});
          break;
        case 1:
          v = make(*g, ops.add, {v, g->constant(kiln::jit::AttrValue(0.25), kiln::kFloat64)},
                   {int64_t{1}});
          break;
        case 2:
          v = make(*g, ops.exp, {v});
          break;
        default:
          v = make(*g, ops.neg, {v});
          break;
      }
    }
    g->add_output(v);
    return g;
  }
  std::vector<Value*> level;
  const int64_t branches = nodes / 4;  // constant, mul, exp, and one add of the sum per branch
  level.reserve(static_cast<size_t>(branches));
  for (int64_t i = 0; i < branches; ++i) {
    Value* c = g->constant(kiln::jit::AttrValue(static_cast<double>(i + 2)), kiln::kFloat64);
    level.push_back(make(*g, ops.exp, {make(*g, ops.mul, {x, c})}));
  }
  while (level.size() > 1) {
    std::vector<Value*> next;
    next.reserve(level.size() / 2 + 1);
    for (size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(make(*g, ops.add, {level[i], level[i + 1]}, {int64_t{1}}));
    if (level.size() % 2) next.push_back(level.back());
    level = std::move(next);
  }
  g->add_output(level[0]);
  return g;
}

// run_passes alone is timed (manual time): building and destroying the graph are not.
void BM_JitPasses(benchmark::State& state, GraphShape shape) {
  const int64_t target_nodes = state.range(0);
  const bool verify = kiln::jit::verify_passes();
  kiln::jit::set_verify_passes(false);
  kiln::jit::reset_pass_profile();
  double total_s = 0;
  int64_t nodes_before = 0, nodes_after = 0;
  for (auto _ : state) {
    std::unique_ptr<kiln::jit::Graph> g = build_graph(shape, target_nodes);
    nodes_before = static_cast<int64_t>(g->size());
    const Clock::time_point t0 = Clock::now();
    kiln::jit::run_passes(*g);
    const Clock::time_point t1 = Clock::now();
    nodes_after = static_cast<int64_t>(g->size());
    g.reset();
    total_s += seconds(t0, t1);
    state.SetIterationTime(seconds(t0, t1));
  }
  kiln::jit::set_verify_passes(verify);
  const double node_runs = static_cast<double>(state.iterations()) * nodes_before;
  const double ns_per_node = total_s * 1e9 / node_runs;
  state.counters["nodes"] = static_cast<double>(nodes_before);
  state.counters["nodes_after"] = static_cast<double>(nodes_after);
  state.counters["ns_per_node"] = ns_per_node;
  // Each pass's share, per node of the input graph (dce runs twice; both runs are summed).
  for (const kiln::jit::PassProfileEntry& e : kiln::jit::pass_profile())
    if (e.runs > 0) state.counters[e.pass] = e.seconds * 1e9 / node_runs;
  // Linear growth: ns/node flat across sizes (vs_10k and vs_prev, the size 10x smaller, ~1).
  const std::string ref = std::string("passes/") + shape_name(shape) + "/";
  set_reference(ref + std::to_string(target_nodes), ns_per_node);
  set_ratio(state, "vs_10k", ns_per_node, ref + "10000");
  if (target_nodes > 10000)
    set_ratio(state, "vs_prev", ns_per_node, ref + std::to_string(target_nodes / 10));
  state.SetLabel("run_passes, ns per input node (total and per pass); linear: vs_prev ~ 1");
}

BENCHMARK_CAPTURE(BM_JitPasses, chain, GraphShape::Chain)
    ->Arg(10000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_JitPasses, chain, GraphShape::Chain)
    ->Arg(1000000)
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_JitPasses, wide, GraphShape::Wide)
    ->Arg(10000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_JitPasses, wide, GraphShape::Wide)
    ->Arg(1000000)
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
