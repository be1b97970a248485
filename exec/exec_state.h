// The executor layer's shared mutable state, in one place: the counters its plans, traces and
// lazy evaluations keep for jit::stats() and the profile, and the lazy evaluations' plan cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "jit/hash.h"

namespace kiln::jit {

class Graph;
class Plan;

// A lazy evaluation's optimized graph and its plan (exec/lazy_eval.cpp).
struct PlanCacheEntry {
  std::unique_ptr<Graph> graph;  // optimized; the plan refers to it
  std::unique_ptr<Plan> plan;
  uint64_t last_use = 0;  // under ExecState::plan_cache_mutex
};
struct GraphHashOf {
  size_t operator()(const GraphHash& h) const { return static_cast<size_t>(h.lo ^ h.hi); }
};

struct ExecState {
  // Plans (exec/plan_run.cpp).
  std::atomic<int64_t> arena_bytes{0};        // atomic: held now by every plan's arenas
  std::atomic<int64_t> fused_kernels_run{0};  // atomic
  std::atomic<int64_t> unfused_steps_run{0};  // atomic: steps that compute, views not counted
  std::atomic<int64_t> in_place_writes{0};    // atomic
  // Traced functions (exec/trace_*.cpp).
  std::atomic<int64_t> traces{0};          // atomic
  std::atomic<int64_t> replays{0};         // atomic
  std::atomic<int64_t> guard_failures{0};  // atomic
  // Lazy evaluation (exec/lazy_eval.cpp).
  std::atomic<int64_t> evaluations{0};               // atomic
  std::atomic<int64_t> nodes_executed{0};            // atomic
  std::atomic<int64_t> nodes_recorded_in_graphs{0};  // atomic
  std::atomic<int64_t> plan_cache_hits{0};           // atomic
  // Optimized plans by the key of the recipe their graph is built from (exec/lazy_eval.cpp).
  std::mutex plan_cache_mutex;
  uint64_t plan_cache_clock = 0;  // under plan_cache_mutex
  absl::flat_hash_map<GraphHash, std::shared_ptr<PlanCacheEntry>, GraphHashOf>
      plan_cache;  // under plan_cache_mutex
};

// The one ExecState of the process (never destroyed: plans may run during exit).
ExecState& exec_state();

}  // namespace kiln::jit
