// A fused group's kernels on a CUDA device: compiled by NVRTC and loaded per layout and launch
// variant on first use, and launched on the device's stream.
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "exec/plan_step.h"
#include "exec/step_profile.h"
#include "jit/dump.h"
#include "kiln/error.h"
#ifdef KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_kernel.h"
#endif

namespace kiln::jit {

namespace {
#ifdef KILN_HAS_CUDA
class CudaKernels final : public KernelDevice {
 public:
  CudaKernels(const fuser::FusionGroup& group, int device, size_t index, FusedGraphDump* dump)
      : group_(group), device_(device), index_(index), dump_(dump) {}

  const char* launch(const KernelCall& c) const override {
    // The variant before the lookup: each is a binary of its own, compiled on first use.
    const fuser::cuda::CudaCallFlags variant = fuser::cuda::launch_variant(
        group_.kernel, c.layout, device_, c.n, c.sizes, c.strides, c.ptrs);
    const std::shared_ptr<const fuser::cuda::CudaKernel> kernel = find(c.layout, variant);
    if (c.layout.rows)
      fuser::cuda::launch_rows(*kernel, group_.kernel, c.layout, device_, c.sizes, c.strides,
                               c.ptrs, group_.scalars.data());
    else
      fuser::cuda::launch_elementwise(*kernel, group_.kernel, c.layout, device_, c.n, c.sizes,
                                      c.strides, c.ptrs, group_.scalars.data());
    return kernel->name;
  }

 private:
  struct Loaded {
    fuser::Layout layout;
    int variant;
    std::shared_ptr<const fuser::cuda::CudaKernel> kernel;
  };

  // The loaded kernel for (layout, variant), compiled or found in the cache on its first use; a
  // stand-in (fuser/codegen/cuda/cuda_kernel.h) until the wanted binary is ready.
  std::shared_ptr<const fuser::cuda::CudaKernel> find(
      const fuser::Layout& layout, const fuser::cuda::CudaCallFlags& variant) const {
    const int bits = (variant.index32 ? 1 : 0) | (variant.vec ? 2 : 0) | (variant.per_thread << 2) |
                     (variant.block << 10);
    std::shared_ptr<const fuser::cuda::CudaKernel> stand_in;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Loaded& l : loaded_)
        if (l.variant == bits && l.layout == layout) {
          if (!l.kernel->stand_in) return l.kernel;
          stand_in = l.kernel;
        }
    }
    if (stand_in) return upgrade(layout, variant, bits, stand_in);
    pause_step_profile();
    auto kernel = std::make_shared<const fuser::cuda::CudaKernel>(
        fuser::cuda::cuda_kernel_tiered(group_.kernel, layout, variant, device_));
    resume_step_profile(device_);
    if (dump_) dump_->add_kernel(index_, kernel->name);
    std::lock_guard<std::mutex> lock(mutex_);
    loaded_.push_back({layout, bits, kernel});
    return kernel;
  }

  // The wanted kernel in place of `stand_in` once its binary is ready; `stand_in` until then.
  std::shared_ptr<const fuser::cuda::CudaKernel> upgrade(
      const fuser::Layout& layout, const fuser::cuda::CudaCallFlags& variant, int bits,
      const std::shared_ptr<const fuser::cuda::CudaKernel>& stand_in) const {
    std::optional<fuser::cuda::CudaKernel> ready =
        fuser::cuda::cuda_kernel_if_ready(group_.kernel, layout, variant, device_, *stand_in);
    if (!ready) return stand_in;
    auto kernel = std::make_shared<const fuser::cuda::CudaKernel>(std::move(*ready));
    std::lock_guard<std::mutex> lock(mutex_);
    for (Loaded& l : loaded_)
      if (l.variant == bits && l.layout == layout) l.kernel = kernel;
    return kernel;
  }

  const fuser::FusionGroup& group_;
  int device_;
  size_t index_;          // the group's number in the plan, for the KILN_DUMP graph
  FusedGraphDump* dump_;  // the plan's KILN_DUMP graph, or null
  mutable std::mutex mutex_;
  mutable std::vector<Loaded> loaded_;  // per layout and variant met so far (under mutex_)
};
#else
// Built without the toolkit: a plan with a CUDA group is made, and raises when it runs.
class CudaKernels final : public KernelDevice {
 public:
  CudaKernels(const fuser::FusionGroup& group, int device, size_t, FusedGraphDump*)
      : group_(group), device_(device) {}
  const char* launch(const KernelCall&) const override {
    KILN_FAIL("jit: ", group_.kernel.ops, " is on cuda:", device_,
              " but kiln was built without the CUDA toolkit");
  }

 private:
  const fuser::FusionGroup& group_;
  int device_;
};
#endif
}  // namespace

std::unique_ptr<KernelDevice> cuda_kernels(const fuser::FusionGroup& group, int device,
                                           size_t index, FusedGraphDump* dump) {
  return std::make_unique<CudaKernels>(group, device, index, dump);
}

}  // namespace kiln::jit
