// Launch geometry and policy: which variant a call needs (cuda_call_flags) and how a rows kernel
// is launched (cuda_rows_launch, CudaRowsPolicy), from the sizes alone (see cuda_codegen.h).
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "kiln/error.h"

namespace kiln::fuser::cuda {

namespace {
constexpr int64_t kMax = INT32_MAX;

// The rows policy, set by benchmarks and read by every rows launch.
struct CudaRowsPolicyState {
  std::mutex mu;
  CudaRowsPolicy policy;  // guarded by mu
};
CudaRowsPolicyState& rows_policy_state() {
  static CudaRowsPolicyState s;
  return s;
}

// Whether every pointer's offsets fit 32 bits: each offset's partial sums are bounded by the sum
// of |index * stride| over the dims (`rank` of them; strides pointer-major).
bool offsets_fit_index32(size_t num_ptrs, size_t rank, const int64_t* sizes,
                         const int64_t* strides) {
  for (size_t p = 0; p < num_ptrs; ++p) {
    int64_t reach = 0;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t stride = strides[p * rank + d];
      const int64_t step = stride < 0 ? -stride : stride;  // a stride is far from INT64_MIN
      const int64_t extent = sizes[d] - 1;
      if (extent > 0 && step > (kMax - reach) / extent) return false;
      reach += extent * step;
    }
  }
  return true;
}

// Whether a flat kernel's 4-wide loop may run: every pointer read or written through it of a type
// with a vector type and aligned to 4 of its elements.
bool aligned_for_vec(const Kernel& kernel, const Layout& layout, char* const* ptrs) {
  const size_t num_inputs = kernel.input_types.size(),
               num_ptrs = num_inputs + kernel.outputs.size();
  for (size_t p = 0; p < num_ptrs; ++p) {
    const bool single = p < layout.single_element.size() && layout.single_element[p];
    if (single) continue;
    const DType t = p < num_inputs ? kernel.input_types[p] : kernel.output_types[p - num_inputs];
    const auto address = reinterpret_cast<uintptr_t>(ptrs[p]);
    if (!((t == kFloat32 || t == kInt32 || t == kBool) && address % (4 * element_size(t)) == 0))
      return false;
  }
  return true;
}

// Whether a rows call's quads are aligned (the vec rule of cuda_codegen.h): every pointer that
// moves along the row (kUnit) has its first element, and the start of every row, at a multiple of
// 4 elements. Dims of one index never move a pointer: their strides do not count.
bool rows_aligned_for_vec(const Kernel& kernel, const Layout& layout, const int64_t* sizes,
                          const int64_t* strides, char* const* ptrs) {
  const size_t num_inputs = kernel.input_types.size(),
               num_ptrs = num_inputs + kernel.outputs.size();
  const auto dims = static_cast<size_t>(layout.rank) + 1;
  for (size_t p = 0; p < num_ptrs; ++p) {
    if (layout.inner[p] != Layout::kUnit) continue;
    const DType t = p < num_inputs ? kernel.input_types[p] : kernel.output_types[p - num_inputs];
    if (reinterpret_cast<uintptr_t>(ptrs[p]) % (4 * element_size(t)) != 0) return false;
    for (size_t d = 0; d + 1 < dims; ++d)
      if (sizes[d] > 1 && strides[p * dims + d] % 4 != 0) return false;
  }
  return true;
}

// A rows block's threads: at least min_per_thread positions per thread, in whole warps, up to the
// policy's block size.
int rows_threads(const CudaRowsPolicy& policy, int64_t R) {
  int threads = 32;
  while (threads < policy.max_threads && int64_t{threads} * policy.min_per_thread < R) threads *= 2;
  return threads;
}

// The least K that covers the row (0: the generic loop), where the policy takes the per_thread
// variant for this kernel.
int rows_per_thread(const Kernel& kernel, const CudaRowsPolicy& policy, int threads, int64_t R) {
  int per_thread = 0;
  for (int k = 64; k >= 4; k /= 2)
    if (k <= policy.max_per_thread && R <= k * int64_t{threads} &&
        (kernel.num_columns() > 0 || policy.registers_without_columns))
      per_thread = k;
  return per_thread;
}

// The partials buffer and the columns kernel's grid (a grid-stride loop over its positions).
void partials_geometry(const Kernel& kernel, int64_t R, CudaRowsLaunch& g) {
  if (kernel.num_globals > 0 || kernel.num_columns() > 0) {
    g.stride = kernel.partials_per_call(R);
    g.partials_bytes = g.blocks * g.stride * 8;
  }
  if (kernel.num_columns() > 0) {
    int32_t widest = 0;
    for (int32_t parts : kernel.column_parts) widest = std::max(widest, parts);
    g.column_positions = widest * R;
    g.columns_threads = 128;
    g.columns_blocks =
        std::max<int64_t>(1, std::min<int64_t>(65535, (g.column_positions + 127) / 128));
  }
}
}  // namespace

CudaCallFlags cuda_call_flags(const Kernel& kernel, const Layout& layout, int64_t n,
                              const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                              int64_t threads) {
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  CudaCallFlags flags;
  // 32-bit: the loop's index (below n, stepping by the thread count, in unsigned arithmetic) and
  // every offset's partial sums fit.
  flags.index32 = n <= kMax && threads <= (int64_t{1} << 31);
  if (layout.rows) flags.index32 = flags.index32 && sizes[layout.rank] <= kMax;
  if (flags.index32 && (!layout.flat || layout.rows) && n > 0) {
    const auto rank = static_cast<size_t>(layout.rank) + (layout.rows ? 1 : 0);
    flags.index32 = offsets_fit_index32(num_ptrs, rank, sizes, strides);
  }
  // 4-wide: a kernel with a 4-wide loop (rows: with quad accesses), and every pointer read or
  // written through it aligned.
  if (layout.flat && !layout.rows) flags.vec = aligned_for_vec(kernel, layout, ptrs);
  if (layout.rows)
    flags.vec = ptrs && cuda_variant(kernel, layout, {false, true}).vec &&
                rows_aligned_for_vec(kernel, layout, sizes, strides, ptrs);
  return flags;
}

CudaRowsPolicy cuda_rows_policy() {
  CudaRowsPolicyState& s = rows_policy_state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.policy;
}

void set_cuda_rows_policy(const CudaRowsPolicy& policy) {
  KILN_CHECK(policy.max_threads >= 32 && policy.max_threads <= 1024 &&
                 (policy.max_threads & (policy.max_threads - 1)) == 0 &&
                 policy.min_per_thread >= 1 && policy.max_per_thread >= 0,
             "set_cuda_rows_policy: max_threads ", policy.max_threads, ", min_per_thread ",
             policy.min_per_thread, ", max_per_thread ", policy.max_per_thread);
  CudaRowsPolicyState& s = rows_policy_state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.policy = policy;
}

CudaRowsLaunch cuda_rows_launch(const Kernel& kernel, const Layout& layout, const int64_t* sizes,
                                const int64_t* strides) {
  KILN_CHECK(layout.rows, "fuser: cuda_rows_launch of a layout without rows");
  int64_t rows = 1;
  for (int d = 0; d < layout.rank; ++d) rows *= sizes[d];
  const int64_t R = sizes[layout.rank];
  const CudaRowsPolicy policy = cuda_rows_policy();
  CudaRowsLaunch g;
  g.threads = rows_threads(policy, R);
  g.per_thread = rows_per_thread(kernel, policy, g.threads, R);
  g.vec = policy.vec;
  g.row_cache_bytes = policy.row_cache_bytes;
  // Column partials are one block of R positions per block of threads: 512 blocks (about four per
  // multiprocessor of a large GPU) keep every multiprocessor busy for a partial buffer of a few
  // times the columns' size.
  const int64_t cap = kernel.num_columns() > 0 ? 512 : kernel.num_globals > 0 ? 1024 : 65536;
  g.blocks = std::max<int64_t>(1, std::min(rows, cap));
  g.index32 = cuda_call_flags(kernel, layout, rows, sizes, strides, nullptr, g.blocks).index32;
  partials_geometry(kernel, R, g);
  return g;
}

std::vector<int> cuda_row_caches(const Kernel& kernel, const Layout& layout) {
  KILN_CHECK(layout.rows, "fuser: cuda_row_caches of a layout without rows");
  return codegen::Source(kernel, layout, "", CudaCallFlags{}).row_cache_sizes();
}

unsigned rows_shared_bytes(const std::vector<int>& caches, int64_t R, int64_t limit) {
  int64_t end = 0;
  for (int bytes : caches) {
    const int64_t next = end + (R * bytes + 15) / 16 * 16;
    if (next > limit) break;
    end = next;
  }
  return static_cast<unsigned>(end);
}

}  // namespace kiln::fuser::cuda
