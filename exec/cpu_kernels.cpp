// A fused group's kernels on the CPU: compiled by LLVM per layout on first use, and run over the
// cores (flat, strided, or rows with their reductions' partials combined in row order).
#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "exec/plan_step.h"
#include "exec/step_profile.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#include "jit/dump.h"
#include "lib/parallel.h"

namespace kiln::jit {

namespace {
// The most calls (row ranges) a rows kernel with column reductions is split into.
constexpr int64_t kMaxColumnCalls = 64;

void run_flat(const fuser::CompiledKernel& kernel, const KernelCall& c) {
  const fuser::KernelFn fn = kernel.fn;
  detail::parallel_for(c.n, detail::kParallelGrain, [&](int64_t begin, int64_t end) {
    fn(begin, end, c.ptrs, nullptr, nullptr, c.group.scalars.data(), nullptr);
  });
}

// Strided: over the shape's rows, each call a range of them.
void run_strided(const fuser::CompiledKernel& kernel, const KernelCall& c) {
  const fuser::KernelFn fn = kernel.fn;
  const int64_t inner = c.sizes[c.layout.rank - 1];
  detail::parallel_for(c.n / inner, std::max<int64_t>(1, detail::kParallelGrain / inner),
                       [&](int64_t begin, int64_t end) {
                         fn(begin, end, c.ptrs, c.sizes, c.strides, c.group.scalars.data(),
                            nullptr);
                       });
}

// Global and column reductions: calls of fixed row ranges (so results do not depend on the
// thread count), each folding into its own partials, combined in row order by the finish and
// columns functions. Column partials are a row's length each: at most kMaxColumnCalls calls keep
// them (and their combination) small beside the data, with enough calls for every core.
void run_reducing_rows(const fuser::CompiledKernel& kernel, const KernelCall& c, int64_t rows,
                       int64_t row_length, int64_t chunk) {
  const fuser::Kernel& k = c.group.kernel;
  const void* scalars = c.group.scalars.data();
  const int32_t columns = k.num_columns();
  if (columns > 0) chunk = std::max(chunk, (rows + kMaxColumnCalls - 1) / kMaxColumnCalls);
  const int64_t calls = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  const int64_t stride = k.partials_per_call(row_length);
  // Every call writes its whole block first: no need to clear it.
  std::unique_ptr<uint64_t[]> partials(new uint64_t[static_cast<size_t>(calls * stride)]);
  detail::parallel_for(calls, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      kernel.fn(std::min(rows, i * chunk), std::min(rows, (i + 1) * chunk), c.ptrs, c.sizes,
                c.strides, scalars, partials.get() + i * stride);
  });
  if (k.num_globals > 0) kernel.finish(calls, stride, partials.get(), c.ptrs, scalars);
  if (columns == 0) return;
  int64_t positions = 0;
  for (int32_t parts : k.column_parts) positions = std::max(positions, parts * row_length);
  detail::parallel_for(positions, detail::kParallelGrain / std::max<int64_t>(1, calls),
                       [&](int64_t begin, int64_t end) {
                         kernel.columns(begin, end, calls, stride, row_length, partials.get(),
                                        c.ptrs, scalars);
                       });
}

// Rows: `sizes` holds the outer sizes, then the row length.
void run_rows(const fuser::CompiledKernel& kernel, const KernelCall& c) {
  int64_t rows = 1;
  for (int32_t d = 0; d < c.layout.rank; ++d) rows *= c.sizes[d];
  const int64_t row_length = c.sizes[c.layout.rank];
  const int64_t chunk =
      std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(1, row_length));
  const fuser::Kernel& k = c.group.kernel;
  if (k.num_globals != 0 || k.num_columns() != 0)
    return run_reducing_rows(kernel, c, rows, row_length, chunk);
  detail::parallel_for(rows, chunk, [&](int64_t begin, int64_t end) {
    kernel.fn(begin, end, c.ptrs, c.sizes, c.strides, c.group.scalars.data(), nullptr);
  });
}

class CpuKernels final : public KernelDevice {
 public:
  CpuKernels(const fuser::FusionGroup& group, size_t index, FusedGraphDump* dump)
      : group_(group), index_(index), dump_(dump) {}

  const char* launch(const KernelCall& call) const override {
    // Held while it runs (the step holds it too).
    const fuser::CompiledKernel kernel = find(call.layout);
    if (call.layout.rows)
      run_rows(kernel, call);
    else if (call.layout.flat)
      run_flat(kernel, call);
    else
      run_strided(kernel, call);
    return kernel.name;
  }

 private:
  // The kernel for `layout`, compiled (or found in the kernel cache) on its first use.
  fuser::CompiledKernel find(const fuser::Layout& layout) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [l, fn] : kernels_)
        if (l == layout) return fn;
    }
    pause_step_profile();
    fuser::CompiledKernel fn = fuser::cpu_kernel(group_.kernel, layout);
    if (dump_ && fn.name) dump_->add_kernel(index_, fn.name);
    resume_step_profile(-1);
    std::lock_guard<std::mutex> lock(mutex_);
    kernels_.emplace_back(layout, fn);
    return fn;
  }

  const fuser::FusionGroup& group_;
  size_t index_;
  FusedGraphDump* dump_;  // the plan's KILN_DUMP graph, or null
  mutable std::mutex mutex_;
  // The kernel per layout met so far (under mutex_).
  mutable std::vector<std::pair<fuser::Layout, fuser::CompiledKernel>> kernels_;
};
}  // namespace

std::unique_ptr<KernelDevice> cpu_kernels(const fuser::FusionGroup& group, size_t index,
                                          FusedGraphDump* dump) {
  return std::make_unique<CpuKernels>(group, index, dump);
}

}  // namespace kiln::jit
