// Whether a shape broadcasts to another under torch's rules (trailing dims equal or 1), without
// building the broadcast shape: the checks of ops that take a broadcastable operand and the fuser.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::detail {

inline bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

}  // namespace kiln::detail
