// Graph names in tests: a traced lambda's name carries its compiler's number (GCC counts lambdas
// in their function, clang in their file), so tests match names by pattern.
#pragma once

#include <algorithm>
#include <cstddef>
#include <regex>
#include <set>
#include <string>

namespace kiln::testing {

// How many of `names` match the regular expression `pattern` whole.
inline size_t count_matching(const std::set<std::string>& names, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<size_t>(std::count_if(
      names.begin(), names.end(), [&](const std::string& n) { return std::regex_match(n, re); }));
}

}  // namespace kiln::testing
