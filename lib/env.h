// Every KILN_* environment flag, declared in one table and parsed and validated in one place.
//
// A reader returns the flag's value, or its default when the variable is unset or empty. A value
// the flag does not accept raises kiln::Error naming the flag, the value and what it accepts;
// flags read while the library loads, or from destructors and exit handlers, where an exception
// would end the process, pass OnBad::Warn instead: one line on stderr (once per flag) and the
// default. The first read also warns once about KILN_* variables the table does not know (a
// misspelled flag otherwise does nothing silently).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::detail {

enum class EnvKind {
  Bool,   // 0/1, false/true, off/on, no/yes (any case)
  Count,  // a non-negative decimal integer (at least `min`)
  Size,   // bytes: a non-negative integer with an optional K, M, G or T suffix (powers of 1024)
  List,   // comma-separated names, each one of `accepted` (when the table gives them)
  Path,   // any non-empty text
  BoolOrJson,  // a Bool, or the path of a file ending in .json
  External,    // read by the tests or the tools' scripts, not by the library: known, not parsed
};

struct EnvFlag {
  const char* name;
  EnvKind kind;
  const char* fallback;  // the default, as the variable would spell it ("" for none)
  const char* accepted;  // List: the accepted names, comma-separated (nullptr: any)
  int64_t min;           // Count: the smallest accepted value
  const char* help;
};

enum class OnBad { Throw, Warn };

// The table, in the order the documentation lists it.
const std::vector<EnvFlag>& env_flags();

bool env_bool(const char* name, OnBad on_bad = OnBad::Throw);
// Count and Size flags.
int64_t env_int(const char* name, OnBad on_bad = OnBad::Throw);
// Path flags; BoolOrJson: "" when off, "1" when on, else the .json path.
std::string env_string(const char* name, OnBad on_bad = OnBad::Throw);
// List flags. `accepted` replaces the table's list where the names live in a higher layer (the
// passes of KILN_DISABLE_PASSES).
std::vector<std::string> env_list(const char* name, OnBad on_bad = OnBad::Throw,
                                  const std::vector<std::string>& accepted = {});

// Tests only: forget which warnings were given, so the next read warns again.
void reset_env_warnings_for_testing();

// The spin count kiln gave OpenMP's idle threads (GOMP_SPINCOUNT) before the OpenMP runtime
// started, or null where the user chose with OMP_WAIT_POLICY or GOMP_SPINCOUNT (see
// lib/startup/omp_wait_policy.c; defined in lib/runtime.cpp).
const char* omp_spin_count();

}  // namespace kiln::detail
