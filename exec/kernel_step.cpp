// Running a kernel step: the layout, pointers, sizes and strides of one call of a fused group's
// kernel (flat, strided, or rows), handed to its device's kernels.
#include "exec/kernel_step.h"

#include <algorithm>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "kiln/device.h"
#include "kiln/error.h"
#include "lib/cuda_tensor.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// The flat layout of a call (single_element, by_value) and whether it is flat: every input whole
// and contiguous or a single element, every destination contiguous. On a device, CPU inputs (0-dim
// numbers) are passed by value.
void set_flat_layout(fuser::Layout& layout, const std::vector<Tensor>& args,
                     const std::vector<Tensor>& dests, int64_t numel, bool on_device) {
  const size_t num_inputs = args.size();
  layout.flat = true;
  layout.rows = false;
  layout.rank = 0;
  layout.single_element.assign(num_inputs, false);
  layout.by_value.clear();
  layout.inner.clear();
  for (size_t k = 0; k < num_inputs; ++k) {
    const Tensor& t = args[k];
    const int64_t n = t.numel();
    if (on_device && t.device().is_cpu()) {
      layout.by_value.resize(num_inputs, false);
      layout.single_element[k] = layout.by_value[k] = true;
      continue;
    }
    if (n == numel && detail::is_contiguous_layout(t.sizes(), t.strides())) continue;
    if (n == 1) {
      layout.single_element[k] = true;
      continue;
    }
    layout.flat = false;
  }
  for (const Tensor& t : dests)
    if (!detail::is_contiguous_layout(t.sizes(), t.strides())) layout.flat = false;
}

// A CUDA kernel reads device memory, or numbers among its parameters: a CPU input (a 0-dim
// number) of a flat kernel is passed by value (Layout::by_value), of another copied over first.
std::vector<Tensor> uploaded(const std::vector<Tensor>& host_args, int device) {
  std::vector<Tensor> moved = host_args;
  for (Tensor& t : moved)
    if (t.defined() && t.device().is_cpu())
      t = detail::copy_to_device(t, Device(DeviceType::CUDA, device));
  return moved;
}

// Where the kernel's outputs go: the outputs, then each join's pieces in their slices of its
// value (the joins' values are the last outputs).
std::vector<Tensor> join_destinations(const fuser::FusionGroup& g,
                                      const std::vector<Tensor>& outs) {
  const size_t first_whole = outs.size() - g.joins.size();
  std::vector<Tensor> joined(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(first_whole));
  for (size_t j = 0; j < g.joins.size(); ++j) {
    const Tensor& whole = outs[first_whole + j];
    const bool stack = g.joins[j].node->op().name == "stack";
    const int64_t d = g.joins[j].dim;
    const int64_t width = stack ? 1 : g.shape[static_cast<size_t>(d)];
    for (int64_t p = 0; p < static_cast<int64_t>(g.joins[j].node->num_inputs()); ++p)
      joined.push_back(stack ? whole.select(d, p) : whole.narrow(d, p * width, width));
  }
  return joined;
}

// A rows kernel's call: per pointer, its strides over the outer dims and its one stride along a
// row (the row's dims must collapse into one for it).
struct RowsCall {
  const Shape& shape;
  int outer;
  fuser::Layout layout;
  std::vector<int64_t> sizes, strides;
  std::vector<char*> ptrs;
  std::vector<Tensor> copies;  // inputs whose rows do not collapse, made contiguous

  RowsCall(const Shape& s, int reduced_dims)
      : shape(s), outer(static_cast<int>(s.size()) - reduced_dims) {
    layout.flat = false;
    layout.rows = true;
    layout.rank = outer;
    sizes.assign(shape.begin(), shape.begin() + outer);
    sizes.push_back(detail::shape_numel(Shape(shape.begin() + outer, shape.end())));
  }
  int64_t row_length() const { return sizes.back(); }

  bool add(const Shape& st, char* data) {
    int64_t inner = 0, span = 0;
    for (int d = static_cast<int>(shape.size()) - 1; d >= outer; --d) {
      const auto u = static_cast<size_t>(d);
      if (shape[u] == 1) continue;
      if (span == 0) {
        inner = st[u];
        span = shape[u];
      } else if (st[u] != inner * span) {
        return false;
      } else {
        span *= shape[u];
      }
    }
    add_pointer(st, inner, data);
    return true;
  }
  void add_pointer(const Shape& st, int64_t inner, char* data) {
    strides.insert(strides.end(), st.begin(), st.begin() + outer);
    strides.push_back(inner);
    layout.inner.push_back(inner == 0   ? fuser::Layout::kZero
                           : inner == 1 ? fuser::Layout::kUnit
                                        : fuser::Layout::kAny);
    ptrs.push_back(data);
  }
};

void add_rows_inputs(RowsCall& call, const fuser::FusionGroup& g, const std::vector<Tensor>& args) {
  const Shape outer_shape(g.shape.begin(), g.shape.begin() + call.outer);
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& t = args[i];
    Shape st;
    if (g.input_outer[i]) {
      st = detail::broadcast_strides(t, outer_shape);
      st.resize(g.shape.size(), 0);
    } else {
      st = detail::broadcast_strides(t, g.shape);
    }
    if (call.add(st, t.impl()->data())) continue;
    call.copies.push_back(t.expand(g.shape).contiguous());
    const bool ok =
        call.add(detail::contiguous_strides(g.shape), call.copies.back().impl()->data());
    KILN_CHECK(ok, "jit: a contiguous input's rows do not collapse");
  }
}

void add_rows_outputs(RowsCall& call, const KernelStep& k, const std::vector<Tensor>& outs) {
  const Shape& shape = k.group->shape;
  const Shape row_strides =
      detail::contiguous_strides(Shape(shape.begin(), shape.begin() + call.outer));
  for (size_t o = 0; o < outs.size(); ++o) {
    Shape st(shape.size(), 0);
    switch (k.output_levels[o]) {
      case fuser::Level::kElement:
        // Fresh and contiguous, or a join's piece in its slice (rows of one dim then).
        st = outs[o].strides();
        break;
      case fuser::Level::kGlobal:
      case fuser::Level::kColumn:  // written by the finish functions
        break;
      default:
        std::copy(row_strides.begin(), row_strides.end(), st.begin());
        break;
    }
    char* data = outs[o].impl()->data();
    const bool ok = call.add(st, data);
    KILN_CHECK(ok || call.row_length() == 0, "jit: an output's rows do not collapse");
    if (!ok) call.add_pointer(st, 1, data);
  }
}

const char* launch_rows(const KernelStep& k, const std::vector<Tensor>& args,
                        const std::vector<Tensor>& outs) {
  RowsCall call(k.group->shape, k.group->reduced_dims);
  add_rows_inputs(call, *k.group, args);
  add_rows_outputs(call, k, outs);
  int64_t rows = 1;
  for (int d = 0; d < call.outer; ++d) rows *= call.sizes[static_cast<size_t>(d)];
  return k.kernels->launch({*k.group, call.layout, rows * call.row_length(), call.sizes.data(),
                            call.strides.data(), call.ptrs.data()});
}

// The strides of every pointer over the group's shape, and the layout's innermost-stride kinds:
// kernels are specialized on each pointer's stride along the innermost dim (broadcast, unit or
// other), so that the inner loop reads and writes whole vectors where it can.
std::vector<int64_t> strided_layout(fuser::Layout& layout, const Shape& shape,
                                    const std::vector<Tensor>& args,
                                    const std::vector<Tensor>& dests) {
  layout.single_element.clear();
  layout.rank = static_cast<int32_t>(shape.size());
  const size_t rank = shape.size();
  std::vector<int64_t> strides;
  strides.reserve((args.size() + dests.size()) * rank);
  for (const Tensor& t : args) {
    const Shape st = detail::broadcast_strides(t, shape);
    strides.insert(strides.end(), st.begin(), st.end());
  }
  for (const Tensor& t : dests)
    strides.insert(strides.end(), t.strides().begin(), t.strides().end());
  for (size_t p = 0; p < args.size() + dests.size(); ++p) {
    const int64_t s = strides[p * rank + rank - 1];
    layout.inner.push_back(shape.back() == 1 || s == 0 ? fuser::Layout::kZero
                           : s == 1                    ? fuser::Layout::kUnit
                                                       : fuser::Layout::kAny);
  }
  return strides;
}

const char* launch_elementwise(const PlanStep& step, const KernelStep& k,
                               const std::vector<Tensor>& host_args,
                               const std::vector<Tensor>& dests) {
  const fuser::FusionGroup& g = *k.group;
  const int64_t numel = detail::shape_numel(g.shape);
  const bool on_device = step.cuda_device >= 0;
  // This thread's layout, reset: its vectors keep their capacity, so finding the step's kernel
  // allocates nothing (a copy is kept only when a new kernel is looked up).
  // Initial-exec: the general model would add a call to every launch.
  static thread_local fuser::Layout t_layout __attribute__((tls_model("initial-exec")));
  fuser::Layout& layout = t_layout;
  set_flat_layout(layout, host_args, dests, numel, on_device);
  std::vector<Tensor> moved;
  if (!layout.flat && !layout.by_value.empty()) {  // strided on a device: numbers go over
    moved = uploaded(host_args, step.cuda_device);
    set_flat_layout(layout, moved, dests, numel, true);
  }
  const std::vector<Tensor>& args = moved.empty() ? host_args : moved;
  if (numel == 0) return nullptr;
  absl::InlinedVector<char*, 16> ptrs(args.size() + dests.size());
  for (size_t i = 0; i < args.size(); ++i) ptrs[i] = args[i].impl()->data();
  for (size_t i = 0; i < dests.size(); ++i) ptrs[args.size() + i] = dests[i].impl()->data();
  if (layout.flat) return k.kernels->launch({g, layout, numel, nullptr, nullptr, ptrs.data()});
  const std::vector<int64_t> strides = strided_layout(layout, g.shape, args, dests);
  return k.kernels->launch({g, layout, numel, g.shape.data(), strides.data(), ptrs.data()});
}
}  // namespace

const char* run_kernel_step(const PlanStep& step, const KernelStep& k,
                            const std::vector<Tensor>& args, const std::vector<Tensor>& outs) {
  const fuser::FusionGroup& g = *k.group;
  std::vector<Tensor> joined;
  if (!g.joins.empty()) joined = join_destinations(g, outs);
  const std::vector<Tensor>& dests = g.joins.empty() ? outs : joined;
  if (!g.rows) return launch_elementwise(step, k, args, dests);
  if (step.cuda_device < 0) return launch_rows(k, args, dests);
  return launch_rows(k, uploaded(args, step.cuda_device), dests);
}

}  // namespace kiln::jit
