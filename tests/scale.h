// KILN_TEST_SCALE: shrinks the suite's largest workloads (the million-node graphs) without skipping
// them. Sanitizer builds (tools/sanitize) run 5-20x slower and set it to 0.1: the same code paths
// run on 100,000 nodes, still far deeper than any recursion over a graph would survive, so the
// tests keep checking that graph walks are iterative. Unset (or 1), every size is as written.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace kiln::testing {

inline double test_scale() {
  static const double scale = [] {
    const char* s = std::getenv("KILN_TEST_SCALE");
    const double v = s && *s ? std::atof(s) : 1.0;
    return v > 0 && v <= 1 ? v : 1.0;  // only shrinks; nonsense means full size
  }();
  return scale;
}

// `n` times the scale, rounded down to a multiple of 4 (tests halve and quarter their sizes and
// count the nodes that result), and never below `at_least`.
inline int64_t scaled(int64_t n, int64_t at_least = 4) {
  const auto s = static_cast<int64_t>(static_cast<double>(n) * test_scale());
  return std::max(at_least, s - s % 4);
}

}  // namespace kiln::testing
