// Test helper: the lines of a row-major tensor along one dim, for reference loops over scans,
// quantiles and integrals.
#pragma once

#include <cstdint>

#include "kiln/kiln.h"

namespace kiln::testing {

// Calls f(first, stride, size) for each line along dim d of a row-major tensor of `shape` (a 0-dim
// shape is one line of one element), in row-major order of the other dims.
template <typename F>
void for_each_line(const Shape& shape, int64_t d, const F& f) {
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < d) outer *= shape[i];
    if (i > d) inner *= shape[i];
  }
  const int64_t size = shape.empty() ? 1 : shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) f(o * size * inner + i, inner, size);
}

}  // namespace kiln::testing
