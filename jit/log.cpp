// KILN_LOG parsing.
#include "jit/log.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_join.h"
#include "lib/env.h"

namespace kiln::jit {

namespace {
// The log topics' state.
struct LogState {
  std::mutex mutex;
  std::string topics;   // ",topic,topic,": guarded by mutex
  bool loaded = false;  // whether topics holds KILN_LOG or set_log_topics' value: guarded by mutex
  // atomic: -1 until KILN_LOG is read, then whether any topic is on. With logging off (the common
  // case) log_enabled is one relaxed load, so callers may ask it per decision.
  std::atomic<int> any{-1};
};

LogState& log_state() {
  static auto* state = new LogState();  // never destroyed: exit handlers may still log
  return *state;
}

// (Under LogState::mutex.)
void store_topics(LogState& st, const std::string& topics) {
  st.topics = "," + topics + ",";
  st.loaded = true;
  st.any.store(st.topics.size() > 2 ? 1 : 0, std::memory_order_relaxed);
}
}  // namespace

void set_log_topics(const std::string& topics) {
  LogState& st = log_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  store_topics(st, topics);
}

bool log_enabled(const char* topic) {
  LogState& st = log_state();
  if (st.any.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(st.mutex);
  if (!st.loaded) store_topics(st, absl::StrJoin(detail::env_list("KILN_LOG"), ","));
  if (st.topics.size() <= 2) return false;
  return st.topics.find(",all,") != std::string::npos ||
         st.topics.find("," + std::string(topic) + ",") != std::string::npos;
}

}  // namespace kiln::jit
