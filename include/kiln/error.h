// kiln::Error, the one exception type kiln throws, and KILN_CHECK which builds its message.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, parts...) throws kiln::Error with the parts streamed together when cond is
// false.
#define KILN_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::kiln::detail::throw_error(__FILE__, __LINE__, ::kiln::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define KILN_FAIL(...) \
  ::kiln::detail::throw_error(__FILE__, __LINE__, ::kiln::detail::str_cat(__VA_ARGS__))
