// Launches of generated kernels: the arguments of each kernel by the ABI of cuda_codegen.h, the
// grid of elementwise kernels, the variant a call needs, and the launches on a device's stream.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/cuda_kernel.h"
#include "kiln/error.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_memory.h"

namespace kiln::fuser::cuda {

namespace {
// Threads per block of the elementwise kernels: 256 keeps occupancy full on every architecture
// from sm_75 on, and the grid is capped at this many blocks per multiprocessor (the grid-stride
// loop covers the rest), so that huge tensors do not launch millions of short-lived blocks.
constexpr int64_t kThreads = 256;
constexpr int64_t kBlocksPerMultiprocessor = 32;
}  // namespace

void KernelCall::add(const void* value, size_t declared_bytes) {
  // The parameter's bytes (a scalar's are the low bytes of its 8-byte slot: little-endian).
  auto block = std::make_unique<char[]>(std::max<size_t>(declared_bytes, 8));
  std::memcpy(block.get(), value, declared_bytes);
  args.push_back(block.get());
  bytes.push_back(declared_bytes);
  storage.push_back(std::move(block));
}

namespace {
size_t scalar_bytes(DType t) {
  return t == kBool ? 1 : element_size(t);
}

void add_pointers_and_scalars(KernelCall& call, const Kernel& kernel, const Layout& layout,
                              char* const* ptrs, const uint64_t* scalars) {
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  for (size_t p = 0; p < num_ptrs; ++p) {
    if (p < layout.by_value.size() && layout.by_value[p])  // the value itself, copied now
      call.add(ptrs[p], scalar_bytes(kernel.input_types[p]));
    else
      call.add(&ptrs[p], sizeof(char*));
  }
  for (size_t k = 0; k < kernel.scalar_types.size(); ++k) {
    const uint64_t slot = scalars ? scalars[k] : 0;
    call.add(&slot, scalar_bytes(kernel.scalar_types[k]));
  }
}
}  // namespace

namespace {
int64_t elementwise_blocks(const Layout& layout, int64_t n, int64_t multiprocessors) {
  const int64_t per_thread = layout.flat ? 4 : 1;
  return std::max<int64_t>(1, std::min((n + kThreads * per_thread - 1) / (kThreads * per_thread),
                                       multiprocessors * kBlocksPerMultiprocessor));
}
}  // namespace

namespace {
// The variant a rows launch of this geometry needs on these pointers: vec where the policy takes
// it (CudaRowsLaunch::vec) and the pointers allow it (cuda_call_flags).
CudaCallFlags rows_variant(const Kernel& kernel, const Layout& layout, const CudaRowsLaunch& g,
                           const int64_t* sizes, const int64_t* strides, char* const* ptrs) {
  int64_t rows = 1;
  for (int d = 0; d < layout.rank; ++d) rows *= sizes[d];
  const bool vec =
      g.vec && cuda_call_flags(kernel, layout, rows, sizes, strides, ptrs, g.blocks).vec;
  return {g.index32, vec, g.per_thread, g.per_thread > 0 ? g.threads : 0};
}
}  // namespace

CudaCallFlags launch_variant(const Kernel& kernel, const Layout& layout, int device, int64_t n,
                             const int64_t* sizes, const int64_t* strides, char* const* ptrs) {
  if (layout.rows)
    return rows_variant(kernel, layout, cuda_rows_launch(kernel, layout, sizes, strides), sizes,
                        strides, ptrs);
  const int64_t blocks =
      elementwise_blocks(layout, n, detail::cuda::device_info(device).multiprocessors);
  return cuda_call_flags(kernel, layout, n, sizes, strides, ptrs, blocks * kThreads);
}

KernelCall elementwise_call(const Kernel& kernel, const Layout& layout, int64_t n,
                            const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                            const uint64_t* scalars, int64_t multiprocessors) {
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  const int64_t blocks = elementwise_blocks(layout, n, multiprocessors);
  KernelCall call;
  call.variant = cuda_call_flags(kernel, layout, n, sizes, strides, ptrs, blocks * kThreads);
  call.grid = static_cast<unsigned>(blocks);
  call.block = static_cast<unsigned>(kThreads);
  const long long count = n;
  call.add(&count, sizeof count);
  if (!layout.flat) {
    // The dims struct, by value: sizes then strides, as the CPU kernels take them.
    const auto rank = static_cast<size_t>(layout.rank);
    std::vector<long long> dims(sizes, sizes + rank);
    dims.insert(dims.end(), strides, strides + rank * num_ptrs);
    call.add(dims.data(), dims.size() * sizeof(long long));
  }
  add_pointers_and_scalars(call, kernel, layout, ptrs, scalars);
  return call;
}

std::vector<KernelCall> rows_calls(const Kernel& kernel, const Layout& layout,
                                   const CudaRowsLaunch& geometry, const int64_t* sizes,
                                   const int64_t* strides, char* const* ptrs,
                                   const uint64_t* scalars, void* partials) {
  const auto rank = static_cast<size_t>(layout.rank);
  const size_t num_ptrs = kernel.input_types.size() + kernel.outputs.size();
  long long rows = 1;
  for (size_t d = 0; d < rank; ++d) rows *= sizes[d];
  std::vector<KernelCall> calls(1);
  calls.reserve(3);  // the finish and columns calls: `main` must stay where it is
  KernelCall& main = calls[0];
  main.grid = static_cast<unsigned>(geometry.blocks);
  main.block = static_cast<unsigned>(geometry.threads);
  main.variant = rows_variant(kernel, layout, geometry, sizes, strides, ptrs);
  std::vector<long long> dims(sizes, sizes + rank + 1);
  dims.insert(dims.end(), strides, strides + (rank + 1) * num_ptrs);
  main.add(&rows, sizeof rows);
  main.add(dims.data(), dims.size() * sizeof(long long));
  add_pointers_and_scalars(main, kernel, layout, ptrs, scalars);
  if (geometry.partials_bytes > 0) main.add(&partials, sizeof partials);
  const long long blocks = geometry.blocks, stride = geometry.stride, R = sizes[rank];
  if (kernel.num_globals > 0) {
    KernelCall finish;  // one thread (ABI)
    finish.variant = main.variant;
    finish.add(&blocks, sizeof blocks);
    finish.add(&stride, sizeof stride);
    finish.add(&partials, sizeof partials);
    add_pointers_and_scalars(finish, kernel, layout, ptrs, scalars);
    calls.push_back(std::move(finish));
  }
  if (kernel.num_columns() > 0) {
    KernelCall columns;
    columns.variant = main.variant;
    columns.grid = static_cast<unsigned>(std::max<int64_t>(1, geometry.columns_blocks));
    columns.block = static_cast<unsigned>(std::max(32, geometry.columns_threads));
    columns.add(&blocks, sizeof blocks);
    columns.add(&stride, sizeof stride);
    columns.add(&R, sizeof R);
    columns.add(&partials, sizeof partials);
    add_pointers_and_scalars(columns, kernel, layout, ptrs, scalars);
    calls.push_back(std::move(columns));
  }
  return calls;
}

void launch_elementwise(const CudaKernel& fn, const Kernel& kernel, const Layout& layout,
                        int device, int64_t n, const int64_t* sizes, const int64_t* strides,
                        char* const* ptrs, const uint64_t* scalars) {
  if (n == 0) return;
  KernelCall call = elementwise_call(kernel, layout, n, sizes, strides, ptrs, scalars,
                                     detail::cuda::device_info(device).multiprocessors);
  // A 32-bit binary on a call that needs 64 bits, or a 4-wide one on misaligned pointers, would
  // compute wrong elements without a fault: a launcher that cached the wrong variant must fail.
  // The scalar loop serves any call of its index width (a 4-wide kernel's stand-in).
  const bool scalar_serves = !fn.variant.vec && fn.variant.index32 == call.variant.index32;
  KILN_CHECK(call.variant == fn.variant || scalar_serves, "CUDA: ", fn.name,
             " launched as variant index32 ", fn.variant.index32, " vec ", fn.variant.vec,
             " for a call that needs index32 ", call.variant.index32, " vec ", call.variant.vec);
  detail::cuda::launch(device, fn.fn, {call.grid, call.block, 0}, call.args.data(), fn.name);
}

void launch_rows(const CudaKernel& fn, const Kernel& kernel, const Layout& layout, int device,
                 const int64_t* sizes, const int64_t* strides, char* const* ptrs,
                 const uint64_t* scalars) {
  const CudaRowsLaunch geometry = cuda_rows_launch(kernel, layout, sizes, strides);
  const CudaCallFlags need = rows_variant(kernel, layout, geometry, sizes, strides, ptrs);
  // A vec binary on rows whose quads are not aligned would fault: never. The scalar loop serves
  // a vec call (the same positions, folded in the same order).
  CudaCallFlags scalar = need;
  scalar.vec = false;
  KILN_CHECK(need == fn.variant || scalar == fn.variant, "CUDA: ", fn.name,
             " launched as variant index32 ", fn.variant.index32, " vec ", fn.variant.vec,
             " per_thread ", fn.variant.per_thread, " block ", fn.variant.block,
             " for rows that need index32 ", need.index32, " vec ", need.vec, " per_thread ",
             need.per_thread, " block ", need.block);
  // The partials go back to the allocator right after the launches: a later allocation on the same
  // stream runs after them, so the block is not reused early.
  struct Partials {
    int device;
    void* p = nullptr;
    ~Partials() {
      if (p) detail::cuda::device_free(device, p);
    }
  } partials{device};
  if (geometry.partials_bytes > 0)
    partials.p = detail::cuda::device_alloc(device, static_cast<size_t>(geometry.partials_bytes));
  std::vector<KernelCall> calls =
      rows_calls(kernel, layout, geometry, sizes, strides, ptrs, scalars, partials.p);
  void* functions[3] = {fn.fn, nullptr, nullptr};
  size_t next = 1;
  if (kernel.num_globals > 0) functions[next++] = fn.finish;
  if (kernel.num_columns() > 0) functions[next++] = fn.columns;
  // The row caches that fit the policy's budget and what the device allowed the kernel.
  const unsigned shared = rows_shared_bytes(
      fn.row_caches, sizes[layout.rank],
      std::min(geometry.row_cache_bytes, std::max<int64_t>(fn.max_dynamic_shared, 0)));
  for (size_t i = 0; i < calls.size(); ++i)
    detail::cuda::launch(device, functions[i],
                         {calls[i].grid, calls[i].block, i == 0 ? shared : 0u},
                         calls[i].args.data(), fn.name);
}

}  // namespace kiln::fuser::cuda
