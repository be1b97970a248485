// KILN_LOG parsing.
#include "jit/log.h"

#include <cstdlib>
#include <mutex>

namespace kiln::jit {

namespace {
std::mutex g_mutex;
std::string g_topics;
bool g_loaded = false;
}  // namespace

void set_log_topics(const std::string& topics) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_topics = "," + topics + ",";
  g_loaded = true;
}

bool log_enabled(const char* topic) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_loaded) {
    const char* env = std::getenv("KILN_LOG");
    g_topics = "," + std::string(env ? env : "") + ",";
    g_loaded = true;
  }
  if (g_topics.size() <= 2) return false;
  return g_topics.find(",all,") != std::string::npos ||
         g_topics.find("," + std::string(topic) + ",") != std::string::npos;
}

}  // namespace kiln::jit
