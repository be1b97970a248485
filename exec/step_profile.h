// KILN_PROFILE around a plan's steps: each step's run timed (on the host, or on its device from
// events around it) and recorded, with the JIT's own work on a kernel's first use left out.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/plan_step.h"
#include "kiln/profiler.h"
#include "lib/profiler.h"

namespace kiln::jit {

// A kernel step about to compile or load its kernel calls this first, and resume_step_profile
// after, so that the JIT's work is a span of its own beside the kernel's, never counted as
// kernel time (`cuda_device`: the device whose timed event opens the step, or -1).
void pause_step_profile();
void resume_step_profile(int cuda_device);

// One run's profiling: wraps each step's run (see run) and stores the device steps' records once
// the run has issued everything, so that profiling does not make the host wait step by step.
// Constructed off too: then run is never called, and a kernel's first use pauses nothing.
class StepProfiler {
 public:
  StepProfiler(bool on, int64_t graph);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Runs `body` (which returns the symbol of the kernel it ran, or null) as `step`, timed and
  // recorded with the step's arguments and outputs.
  template <typename Body>
  void run(const PlanStep& step, const std::vector<Tensor>& args, const std::vector<Tensor>& outs,
           Body&& body) {
    begin(step);
    const char* kernel = body();
    end(step, kernel, args, outs);
  }
  // Stores the device steps' records (after the run's last step).
  void finish();

 private:
  struct DeviceSpan {
    detail::SpanStart start;
    profiler::Record record;
    void* begin;
    void* end;
  };
  void begin(const PlanStep& step);
  void end(const PlanStep& step, const char* kernel, const std::vector<Tensor>& args,
           const std::vector<Tensor>& outs);

  int64_t graph_;
  detail::SpanStart span_{0, 0};
  void* step_event_ = nullptr;  // the timed event opening a profiled device step
  std::vector<DeviceSpan> device_spans_;
  // The thread's step span and event before this run (a run inside a step's op restores them).
  detail::SpanStart* previous_span_;
  void** previous_event_;
};

}  // namespace kiln::jit
