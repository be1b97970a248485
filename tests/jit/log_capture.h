// What the JIT logs while a piece of test code runs (KILN_LOG topics set for its duration).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "jit/log.h"

namespace kiln::testing {

// stderr while `body` runs with KILN_LOG=topics.
inline std::string logged(const char* topics, const std::function<void()>& body) {
  jit::set_log_topics(topics);
  ::testing::internal::CaptureStderr();
  body();
  std::string out = ::testing::internal::GetCapturedStderr();
  jit::set_log_topics("");
  return out;
}

}  // namespace kiln::testing
