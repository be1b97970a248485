// The executor layer's one ExecState, and jit::stats() read from it.
#include "exec/exec_state.h"

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#include "kiln/jit.h"

namespace kiln::jit {

ExecState& exec_state() {
  static ExecState* state = new ExecState();  // never destroyed: plans may run during exit
  return *state;
}

Stats stats() {
  LazyStats l = lazy_stats();
  const fuser::CompileStats c = fuser::cpu_compile_stats();
  Stats st;
  st.evaluations = l.evaluations;
  st.plan_cache_hits = l.plan_cache_hits;
  st.nodes_executed = l.nodes_executed;
  st.pending_nodes = l.pending;
  st.traces = exec_state().traces.load();
  st.replays = exec_state().replays.load();
  st.guard_failures = exec_state().guard_failures.load();
  st.arena_bytes = plan_arena_bytes();
  st.kernels_compiled = c.compiled;
  st.kernel_memory_hits = c.memory_hits;
  st.kernel_disk_hits = c.disk_hits;
  st.kernels_evicted = c.evicted;
  st.compile_seconds = c.compile_seconds;
  const PlanRunCounts runs = plan_run_counts();
  st.fused_kernels_run = runs.fused_kernels;
  st.unfused_steps_run = runs.unfused_steps;
  st.in_place_writes = runs.in_place_writes;
  return st;
}

}  // namespace kiln::jit
