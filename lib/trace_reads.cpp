// Values a traced function reads from outside its tensors: hyperparameters (traced_scalar), which
// become graph inputs read at each call, and mode flags (traced_flag), which each call checks
// (exec/trace_replay.cpp replays and guards them).
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

namespace {
// Reads through `read` while `owner` lives; a traced function called after its optimizer or module
// is gone must not read freed memory.
std::function<double()> guarded(const char* what, std::function<double()> read,
                                std::weak_ptr<const void> owner) {
  return [what = std::string(what), read = std::move(read), owner = std::move(owner)] {
    KILN_CHECK(!owner.expired(), "jit::Function: the traced function reads ", what,
               " from an object that no longer exists");
    return read();
  };
}
}  // namespace

Tensor traced_scalar(const char* what, const double& value, std::weak_ptr<const void> owner) {
  Tensor now = scalar_tensor(value, kFloat64);
  TraceState* trace = trace_state();
  if (!trace || !lazy_mode()) return now;
  static const OpDef* input = find_op("input");
  KILN_CHECK(input, "jit::trace: the graph input op is not registered");
  const auto index = static_cast<int64_t>(trace->examples.size());
  trace->examples.push_back(now);
  trace->scalars.push_back({what,
                            guarded(
                                what, [p = &value] { return *p; }, std::move(owner)),
                            value, index});
  return trace_placeholder(*input, index, now);
}

bool traced_flag(const char* what, std::function<bool()> read, std::weak_ptr<const void> owner) {
  const bool now = read();
  if (TraceState* trace = trace_state())
    trace->flags.push_back(
        {what,
         guarded(
             what, [read = std::move(read)] { return read() ? 1.0 : 0.0; }, owner),
         now ? 1.0 : 0.0});
  return now;
}

}  // namespace kiln::detail
