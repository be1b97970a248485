// KILN_LOG topics: one line per JIT decision on stderr for the topics named (or "all").
#pragma once

#include <iostream>
#include <sstream>
#include <string>

namespace kiln::jit {

// True when KILN_LOG names `topic` (a comma-separated list: fuser,codegen,ir,ir-raw,cuda,cache,
// guard,passes,lazy) or "all". Read once per process; set_log_topics overrides it (tests). With no
// topic on it is one relaxed atomic load: code that builds a costly line asks it once, then logs.
bool log_enabled(const char* topic);
void set_log_topics(const std::string& topics);

template <typename... Args>
void log(const char* topic, const Args&... args) {
  if (!log_enabled(topic)) return;
  std::ostringstream os;
  os << "[kiln " << topic << "] ";
  (os << ... << args);
  os << '\n';
  std::cerr << os.str();
}

}  // namespace kiln::jit
