// The executor layer's one ExecState, and jit::stats() read from it.
#include "exec/exec_state.h"

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "kiln/jit.h"
#include "lib/stats_registry.h"

namespace kiln::jit {

ExecState& exec_state() {
  static ExecState* state = new ExecState();  // never destroyed: plans may run during exit
  return *state;
}

Stats stats() {
  LazyStats l = lazy_stats();
  // The CPU code generator's counters, which it publishes (fuser/codegen/llvm/kernel_cache.cpp).
  const detail::StatValues c = detail::read_stats("cpu_codegen");
  auto count = [&c](const char* name) { return static_cast<int64_t>(detail::stat(c, name)); };
  Stats st;
  st.evaluations = l.evaluations;
  st.plan_cache_hits = l.plan_cache_hits;
  st.nodes_executed = l.nodes_executed;
  st.pending_nodes = l.pending;
  st.traces = exec_state().traces.load();
  st.replays = exec_state().replays.load();
  st.guard_failures = exec_state().guard_failures.load();
  st.arena_bytes = plan_arena_bytes();
  st.kernels_compiled = count("compiled");
  st.kernel_memory_hits = count("memory_hits");
  st.kernel_disk_hits = count("disk_hits");
  st.kernels_evicted = count("evicted");
  st.compile_seconds = detail::stat(c, "compile_seconds");
  const PlanRunCounts runs = plan_run_counts();
  st.fused_kernels_run = runs.fused_kernels;
  st.unfused_steps_run = runs.unfused_steps;
  st.in_place_writes = runs.in_place_writes;
  return st;
}

}  // namespace kiln::jit
