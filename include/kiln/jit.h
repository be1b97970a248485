// The JIT's public API: lazy-mode switches and kiln::eval, and kiln::jit::trace, which records a
// function once and replays its optimized plan.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// Lazy mode (on by default; KILN_LAZY=0 turns it off): ops record into the thread's pending trace
// and run when a value is needed. With it off every op runs at once, on the reference kernels.
bool is_lazy_enabled();
void set_lazy_enabled(bool enabled);

// Sets lazy mode for a scope, restoring the previous mode at its end.
class LazyGuard {
 public:
  explicit LazyGuard(bool enabled);
  ~LazyGuard();
  LazyGuard(const LazyGuard&) = delete;
  LazyGuard& operator=(const LazyGuard&) = delete;

 private:
  bool previous_;
};

// Computes every pending tensor given, in one graph.
void eval(const std::vector<Tensor>& tensors);
template <typename... Ts>
void eval(const Tensor& first, const Ts&... rest) {
  eval(std::vector<Tensor>{first, rest...});
}

namespace jit {

struct FunctionImpl;

// A traced function: calling it checks the inputs against the specializations traced so far
// (dtype, sizes, device, requires_grad), replays the matching plan, and traces a new
// specialization on a mismatch, up to max_specializations; past that it runs the function in
// plain lazy mode.
class Function {
 public:
  Function() = default;
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) const;
  // The optimized graph of the specialization used last (or the first one), and of its backward
  // (empty when its returned values need no gradient).
  std::string graph_str() const;
  std::string backward_graph_str() const;
  size_t num_specializations() const;
  // Warnings recorded while tracing (e.g. a value read with item()).
  std::vector<std::string> warnings() const;
  // Writes the most recent specialization: its graph and captured tensors (by value).
  void save(const std::string& path) const;
  bool defined() const { return impl_ != nullptr; }

 private:
  friend Function trace(std::function<std::vector<Tensor>(const std::vector<Tensor>&)>,
                        const std::vector<Tensor>&, int);
  friend Function load(const std::string&);
  std::shared_ptr<FunctionImpl> impl_;
};

using TracedFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Records fn on pending placeholders of example_inputs (nothing is computed and no tensor is
// written while tracing) and returns the replayable Function. Tensors fn uses but does not receive
// are captured by reference; in-place writes fn makes to them (an optimizer step), and gradients
// backward assigns to their .grad, happen on every call.
//
// Traced with autograd on, a function whose returned values require grad (through its arguments
// or captured tensors such as parameters) is differentiable: its backward is traced too, split
// from the forward (elementwise intermediates recomputed inside the backward's fused kernels, GEMM
// and reduction results saved), and `loss.backward()` on its results runs that backward plan as
// one autograd node. A function that runs a backward of its own is not differentiated again.
Function trace(TracedFn fn, const std::vector<Tensor>& example_inputs, int max_specializations = 8);

// Reads a Function written by Function::save; its captured tensors are the saved copies.
Function load(const std::string& path);

// Counters for tests and the profiler.
struct Stats {
  int64_t evaluations = 0;         // lazy-mode graphs built and run
  int64_t plan_cache_hits = 0;     // of those, found already optimized and planned
  int64_t nodes_executed = 0;      // nodes run by those graphs
  int64_t pending_nodes = 0;       // uncomputed pending nodes alive now
  int64_t traces = 0;              // specializations traced
  int64_t replays = 0;             // calls served by a traced plan
  int64_t guard_failures = 0;      // calls whose inputs matched no specialization
  int64_t arena_bytes = 0;         // held now by plans' arenas of small intermediate values
  int64_t kernels_compiled = 0;    // fused kernels generated and compiled by LLVM
  int64_t kernel_memory_hits = 0;  // kernel requests served by an already loaded kernel
  int64_t kernel_disk_hits = 0;    // kernels loaded from the disk cache ($KILN_CACHE_DIR)
  int64_t kernels_evicted = 0;     // dropped from the in-memory kernel cache past its capacity
                                   // (KILN_KERNEL_CACHE_MAX); plans keep what they hold loaded
  double compile_seconds = 0;      // spent generating and compiling kernels
  int64_t fused_kernels_run = 0;   // fused kernel launches by plans
  int64_t unfused_steps_run = 0;   // other plan steps that compute (GEMMs, reference kernels;
                                   // views, which compute nothing, are not counted)
  int64_t in_place_writes = 0;     // step outputs a traced plan computed in its input's buffer
                                   // (write-backs of optimizer state; no transient copy)
};
Stats stats();

}  // namespace jit
}  // namespace kiln
