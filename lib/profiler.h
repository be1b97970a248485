// The profiler's recording machinery for the library's hooks: the on/off switch (one relaxed
// atomic load when off), the clock, per-thread span nesting, and the record store.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/profiler.h"

namespace kiln::detail {

extern std::atomic<bool> g_profiling;
// The hooks' test: true while profiling is on.
inline bool profiling() {
  return g_profiling.load(std::memory_order_relaxed);
}

// Nanoseconds since the profiler's clock started.
int64_t profile_now_ns();

// A span being measured on this thread: profile_begin opens it (one level deeper), profile_end
// closes it and stores `r` with its thread, depth, start and duration filled in.
struct SpanStart {
  int64_t start_ns;
  uint32_t depth;
};
SpanStart profile_begin();
void profile_end(const SpanStart& s, profiler::Record&& r);
// Closes a span without recording it (a step that computes nothing).
void profile_end_discard(const SpanStart& s);
// Stores `r` for a span closed earlier (by profile_end_discard) whose duration was measured
// elsewhere: a device step's, from events on the device's stream.
void profile_store(const SpanStart& s, profiler::Record&& r, int64_t duration_ns);
// Drops every record (profiler::reset).
void profile_clear();
// A record of no duration at the current time (a guard failure), at the current depth.
void profile_event(profiler::Record&& r);
// Names graph number `graph` for profiler::graph_names() (a later name replaces an earlier one).
void profile_name_graph(int64_t graph, std::string name);

// A JIT phase's span over a scope, measured only when profiling was on as it began. The name is
// `name` followed by `suffix` (both static strings, or living as long as the span).
class ProfileSpan {
 public:
  explicit ProfileSpan(const char* name, const char* suffix = nullptr,
                       profiler::Category category = profiler::Category::kJit) noexcept
      : name_(name), suffix_(suffix), category_(category) {
    if (profiling()) start_ = profile_begin();
  }
  ~ProfileSpan() {
    if (start_.start_ns >= 0) finish();
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;
  bool active() const { return start_.start_ns >= 0; }
  void set_name(const char* name) { name_ = name; }
  void set_category(profiler::Category category) { category_ = category; }
  // Detail shown beside the name (the kernel a compilation made); kept only when active.
  void set_detail(std::string detail) {
    if (active()) detail_ = std::make_unique<std::string>(std::move(detail));
  }

 private:
  void finish();
  const char* name_;
  const char* suffix_;
  profiler::Category category_;
  SpanStart start_{-1, 0};
  std::unique_ptr<std::string> detail_;
};

}  // namespace kiln::detail
