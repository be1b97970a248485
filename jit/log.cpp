// KILN_LOG parsing.
#include "jit/log.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_join.h"
#include "lib/env.h"

namespace kiln::jit {

namespace {
std::mutex g_mutex;
std::string g_topics;
bool g_loaded = false;
// -1 until KILN_LOG is read, then whether any topic is on: with logging off (the common case)
// log_enabled is one relaxed load, so callers may ask it per decision.
std::atomic<int> g_any{-1};

// (Under g_mutex.)
void store_topics(const std::string& topics) {
  g_topics = "," + topics + ",";
  g_loaded = true;
  g_any.store(g_topics.size() > 2 ? 1 : 0, std::memory_order_relaxed);
}
}  // namespace

void set_log_topics(const std::string& topics) {
  std::lock_guard<std::mutex> lock(g_mutex);
  store_topics(topics);
}

bool log_enabled(const char* topic) {
  if (g_any.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_loaded) {
    store_topics(absl::StrJoin(detail::env_list("KILN_LOG"), ","));
  }
  if (g_topics.size() <= 2) return false;
  return g_topics.find(",all,") != std::string::npos ||
         g_topics.find("," + std::string(topic) + ",") != std::string::npos;
}

}  // namespace kiln::jit
