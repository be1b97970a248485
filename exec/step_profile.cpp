// KILN_PROFILE around a plan's steps: each step's run timed (on the host, or on its device from
// events around it) and recorded, with the JIT's own work on a kernel's first use left out.
#include "exec/step_profile.h"

#include <string>

#include "lib/cuda_driver.h"

namespace kiln::jit {

namespace {
// The span of the plan step running on this thread, while profiling: a step whose kernel must be
// looked up, loaded or compiled first closes it and opens it again after (pause_step_profile).
// Initial-exec: every run sets it, where the general model would add a call.
__attribute__((tls_model("initial-exec"))) thread_local detail::SpanStart* t_step_span = nullptr;
// The timed event opening the profiled device step running on this thread: recorded again after
// a compile, so that the step's device time leaves the compile out.
__attribute__((tls_model("initial-exec"))) thread_local void** t_step_event = nullptr;

int64_t tensor_bytes(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(element_size(t.dtype())) : 0;
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t d = 0; d < s.size(); ++d) out += (d ? "x" : "") + std::to_string(s[d]);
  return out.empty() ? "scalar" : out;
}

// The record of an unfused step: the op, its output's shape, and for GEMMs their 2*M*N*K
// floating-point operations.
void describe_op(profiler::Record& r, const Node& node, bool direct,
                 const std::vector<Tensor>& args, const std::vector<Tensor>& outs) {
  const std::string& op = node.op().name;
  r.category = direct ? profiler::Category::kOp : profiler::Category::kLibrary;
  r.name = op;
  if (!outs.empty() && outs[0].defined()) r.shape = shape_text(outs[0].sizes());
  // The contracted length: the first matrix's last dim (addmm's first matrix is its second
  // input).
  const size_t a = op == "addmm" ? 1 : 0;
  if ((op == "mm" || op == "bmm" || op == "matmul" || op == "addmm" || op == "linear") &&
      args.size() > a && args[a].defined() && args[a].dim() > 0 && !outs.empty() &&
      outs[0].defined() && is_floating_point(outs[0].dtype()))
    r.flops = 2 * outs[0].numel() * args[a].size(-1);
}

// The profile record of a step that ran: its kind, name, shape, the bytes of its inputs and
// outputs, its graph and fusion group (a kernel that several groups share is timed per group).
profiler::Record step_record(const PlanStep& step, int64_t graph, const char* kernel,
                             const std::vector<Tensor>& args, const std::vector<Tensor>& outs) {
  profiler::Record r;
  if (const KernelStep* k = std::get_if<KernelStep>(&step.kind)) {
    r.category = profiler::Category::kKernel;
    r.name = "fused:" + k->group->kernel.ops;
    if (kernel) r.kernel = kernel;
    r.shape = shape_text(k->group->shape);
    r.group = static_cast<int64_t>(k->index);
  } else {
    describe_op(r, *step.node, step.direct(), args, outs);
  }
  for (const Tensor& t : args) r.bytes += tensor_bytes(t);
  for (const Tensor& t : outs) r.bytes += tensor_bytes(t);
  r.graph = graph;
  return r;
}

void* record_timed_event(int device) {
  return detail::cuda::record_event(device, detail::cuda::stream(device), /*timed=*/true);
}
}  // namespace

void pause_step_profile() {
  if (detail::SpanStart* span = t_step_span) detail::profile_end_discard(*span);
}

void resume_step_profile(int cuda_device) {
  if (detail::SpanStart* span = t_step_span) *span = detail::profile_begin();
  if (cuda_device >= 0 && t_step_event && *t_step_event) {
    detail::cuda::destroy_event(*t_step_event);
    *t_step_event = record_timed_event(cuda_device);
  }
}

StepProfiler::StepProfiler(bool on, int64_t graph)
    : graph_(graph), previous_span_(t_step_span), previous_event_(t_step_event) {
  t_step_span = on ? &span_ : nullptr;
  t_step_event = on ? &step_event_ : nullptr;
}

StepProfiler::~StepProfiler() {
  t_step_span = previous_span_;
  t_step_event = previous_event_;
  for (DeviceSpan& s : device_spans_) {
    detail::cuda::destroy_event(s.begin);
    detail::cuda::destroy_event(s.end);
  }
}

void StepProfiler::begin(const PlanStep& step) {
  span_ = detail::profile_begin();
  if (step.cuda_device >= 0) step_event_ = record_timed_event(step.cuda_device);
}

void StepProfiler::end(const PlanStep& step, const char* kernel, const std::vector<Tensor>& args,
                       const std::vector<Tensor>& outs) {
  // Views compute nothing: no record.
  const bool records =
      step.group() || step.direct() || step.node->op().kind != detail::OpKind::View;
  if (step.cuda_device < 0) {
    if (records)
      detail::profile_end(span_, step_record(step, graph_, kernel, args, outs));
    else
      detail::profile_end_discard(span_);
    return;
  }
  // Device work is asynchronous: a device step's span is its time on the device, from the events
  // around it (read after the run).
  void* end = record_timed_event(step.cuda_device);
  if (records) {
    device_spans_.push_back(
        {span_, step_record(step, graph_, kernel, args, outs), step_event_, end});
  } else {
    detail::cuda::destroy_event(step_event_);
    detail::cuda::destroy_event(end);
  }
  step_event_ = nullptr;
  detail::profile_end_discard(span_);
}

void StepProfiler::finish() {
  // Each record with the time its device took from reaching the step's first event to finishing
  // the step's work.
  for (DeviceSpan& s : device_spans_) {
    const float ms = detail::cuda::elapsed_ms(s.begin, s.end);
    detail::profile_store(s.start, std::move(s.record), static_cast<int64_t>(ms * 1e6));
  }
}

}  // namespace kiln::jit
