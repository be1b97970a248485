// The KILN_* flag table and its parsers (see lib/env.h).
#include "lib/env.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <set>

#include "kiln/error.h"

extern char** environ;

namespace kiln::detail {

namespace {

#ifdef NDEBUG
constexpr const char* kVerifyDefault = "0";
#else
constexpr const char* kVerifyDefault = "1";
#endif

const char* const kBoolValues = "0, 1, false, true, off, on, no, yes";

std::vector<EnvFlag> make_table() {
  using K = EnvKind;
  return {
      {"KILN_PROFILE", K::BoolOrJson, "0", nullptr, 0,
       "1: a profile on stderr at exit; a path ending in .json: a Chrome trace written there"},
      {"KILN_LOG", K::List, "", "fuser,codegen,ir,ir-raw,cuda,cache,guard,passes,lazy,conv,all", 0,
       "topics whose JIT decisions are logged on stderr"},
      {"KILN_DUMP", K::Path, "", nullptr, 0, "a directory receiving graphs and generated code"},
      {"KILN_LAZY", K::Bool, "1", nullptr, 0, "0: eager mode, every op runs at once"},
      {"KILN_FUSE", K::Bool, "1", nullptr, 0, "0: graphs run op by op, unfused"},
      {"KILN_DISABLE_PASSES", K::List, "", nullptr, 0, "graph passes switched off, or all"},
      {"KILN_VERIFY", K::Bool, kVerifyDefault, nullptr, 0, "check the graph after every pass"},
      {"KILN_MAX_PENDING", K::Count, "10000", nullptr, 1,
       "pending nodes recorded before lazy mode flushes them"},
      {"KILN_JIT_EARLY_START", K::Bool, "1", nullptr, 0,
       "0: LLVM's JIT starts at the first CPU kernel, not on a background thread as kiln loads"},
      {"KILN_CACHE", K::Bool, "1", nullptr, 0, "0: no disk cache of compiled kernels"},
      {"KILN_CACHE_DIR", K::Path, "", nullptr, 0, "where the disk cache lives"},
      {"KILN_CACHE_MAXSIZE", K::Size, "1G", nullptr, 0, "the disk cache's cap"},
      {"KILN_KERNEL_CACHE_MAX", K::Count, "4096", nullptr, 0,
       "compiled kernels kept loaded in memory"},
      {"KILN_CPU_CACHE_MB", K::Count, "1024", nullptr, 0,
       "MiB of freed large host blocks kept for reuse"},
      {"KILN_ALLOW_TF32", K::Bool, "0", nullptr, 0, "float32 GEMMs on CUDA may use TF32"},
      {"KILN_CUDA_FAST_COMPILE", K::List, "0", "0,min,mid,max", 0,
       "NVRTC's --Ofast-compile level for generated CUDA kernels (0: fully optimized)"},
      {"KILN_CUDA_TIERED", K::Bool, "1", nullptr, 0,
       "a new CUDA kernel first runs a quicker-to-compile stand-in while it compiles"},
      {"KILN_CONV_ALGO", K::List, "auto", "auto,im2col,im2col_l2,onednn", 0,
       "the convolution algorithm: auto (measured once per problem), im2col, im2col_l2 or onednn"},
      // Read by the tests and the tools' scripts: known here so that they draw no typo warning.
      {"KILN_FUZZ_SECONDS", K::External, "", nullptr, 0, "tests: how long the fuzz tests run"},
      {"KILN_FUZZ_SEED", K::External, "", nullptr, 0, "tests: the fuzz tests' seed"},
      {"KILN_CHROMIUM", K::External, "", nullptr, 0, "tests: the browser for kiln-viz's tests"},
      {"KILN_SKIP_BROWSER", K::External, "", nullptr, 0, "tests: skip kiln-viz's browser test"},
      {"KILN_CACHE_TEST_CHILD", K::External, "", nullptr, 0, "tests: a child process's role"},
      {"KILN_HASH_TEST_CHILD", K::External, "", nullptr, 0, "tests: a child process's role"},
      {"KILN_ENV_TEST_CHILD", K::External, "", nullptr, 0, "tests: a child process's role"},
      {"KILN_BENCH_CHILD", K::External, "", nullptr, 0, "benchmarks: a child process's role"},
      {"KILN_TEST_SCALE", K::External, "", nullptr, 0,
       "tests: a factor that shortens the longest tests (sanitizers)"},
      {"KILN_DIFF_SECONDS", K::External, "", nullptr, 0, "tests: the fresh-seed diff run's time"},
      {"KILN_DIFF_OPS", K::External, "", nullptr, 0,
       "tests: the ops (comma-separated) a diff run's programs draw from"},
      {"KILN_DIFF_SEED", K::External, "", nullptr, 0, "tests: the fresh-seed diff run's seed"},
      {"KILN_DIFF_PROGRAMS", K::External, "", nullptr, 0, "tests: programs per diff run"},
      {"KILN_DIFF_PROGRAM", K::External, "", nullptr, 0, "tests: run one diff program"},
      {"KILN_DIFF_SKIP", K::External, "", nullptr, 0, "tests: fixed-seed diff programs left out"},
      {"KILN_DIFF_VERBOSE", K::External, "", nullptr, 0, "tests: name each diff program"},
      {"KILN_JOBS", K::External, "", nullptr, 0, "tools: build and test parallelism"},
      {"KILN_BUILD_TYPE", K::External, "", nullptr, 0, "tools/setup: the CMake build type"},
      {"KILN_GPU_LIBS", K::External, "", nullptr, 0, "tools/gpu-check: extra libraries"},
  };
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    at = comma + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The edit distance, to name the flag a misspelled variable probably meant.
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// Flags (and "unknown") already warned about. Function-local: flags are read by other files'
// static initializers, which may run before this file's.
struct Warned {
  std::mutex mu;
  std::set<std::string> names;  // under mu
};
Warned& warned() {
  static Warned* w = new Warned();  // never destroyed: flags are read from exit handlers too
  return *w;
}

bool first_warning(const std::string& what) {
  std::lock_guard<std::mutex> lock(warned().mu);
  return warned().names.insert(what).second;
}

// Under the lock throughout: a flag read on another thread (the JIT's early start) must not
// return while this thread's first read is still printing.
void warn_unknown_variables() {
  static std::mutex printing;
  std::lock_guard<std::mutex> lock(printing);
  if (!first_warning("unknown")) return;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (std::strncmp(*e, "KILN_", 5) != 0 || !eq) continue;
    const std::string name(*e, static_cast<size_t>(eq - *e));
    const EnvFlag* nearest = nullptr;
    size_t best = SIZE_MAX;
    for (const EnvFlag& f : env_flags()) {
      const size_t d = distance(name, f.name);
      if (d < best) best = d, nearest = &f;
    }
    if (best == 0) continue;
    std::cerr << "kiln: warning: unknown environment variable " << name << " ignored";
    if (nearest && best <= 3) std::cerr << " (did you mean " << nearest->name << "?)";
    std::cerr << "\n";
  }
}

const EnvFlag& flag(const char* name) {
  for (const EnvFlag& f : env_flags())
    if (std::strcmp(f.name, name) == 0) return f;
  KILN_FAIL("kiln: no environment flag named ", name, " in lib/env.cpp's table");
}

// What the flag accepts, for messages.
std::string accepted_text(const EnvFlag& f, const std::vector<std::string>& accepted) {
  switch (f.kind) {
    case EnvKind::Bool:
      return kBoolValues;
    case EnvKind::Count:
      return "an integer >= " + std::to_string(f.min);
    case EnvKind::Size:
      return "a size in bytes, optionally with a K, M, G or T suffix (e.g. 512M)";
    case EnvKind::BoolOrJson:
      return std::string(kBoolValues) + ", or a file name ending in .json";
    case EnvKind::List:
      return accepted.empty() ? std::string(f.accepted ? f.accepted : "any names") : join(accepted);
    default:
      return "a non-empty value";
  }
}

// The variable's text, or the flag's default when it is unset or empty.
std::string raw(const EnvFlag& f) {
  warn_unknown_variables();
  const char* v = std::getenv(f.name);
  return v && *v ? std::string(v) : std::string(f.fallback);
}

// A bad value: raise, or warn once and fall back to the default.
template <typename T, typename Parse>
T read(const char* name, OnBad on_bad, const std::vector<std::string>& accepted,
       const Parse& parse) {
  const EnvFlag& f = flag(name);
  const std::string text = raw(f);
  std::string why;
  T value{};
  if (parse(f, text, value, why)) return value;
  const std::string message = std::string(f.name) + "='" + text + "' " + why +
                              "; accepted: " + accepted_text(f, accepted) +
                              " (default: " + (*f.fallback ? f.fallback : "unset") + ")";
  if (on_bad == OnBad::Throw) KILN_FAIL(message);
  if (first_warning(f.name)) std::cerr << "kiln: warning: " << message << "; using the default\n";
  std::string fallback_why;
  parse(f, std::string(f.fallback), value, fallback_why);
  return value;
}

bool parse_bool(const std::string& text, bool& out) {
  const std::string s = lower(text);
  if (s == "0" || s == "false" || s == "off" || s == "no") return out = false, true;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return out = true, true;
  return false;
}

// A non-negative decimal integer, times the unit of an optional size suffix.
bool parse_int(const EnvFlag& f, const std::string& text, int64_t& out, std::string& why) {
  size_t end = 0;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  if (end == 0 || end > 18) return why = "is not a non-negative integer", false;
  int64_t n = std::stoll(text.substr(0, end));
  std::string unit = lower(text.substr(end));
  int shift = 0;
  if (f.kind == EnvKind::Size && !unit.empty()) {
    const std::string units = "kmgt";
    const size_t u = units.find(unit[0]);
    const std::string rest = unit.substr(1);
    if (u == std::string::npos || !(rest.empty() || rest == "b" || rest == "ib"))
      return why = "has an unknown unit", false;
    shift = 10 * static_cast<int>(u + 1);
    unit.clear();
  }
  if (!unit.empty()) return why = "is not a non-negative integer", false;
  if (shift && n > (INT64_MAX >> shift)) return why = "is too large", false;
  n <<= shift;
  if (n < f.min) return why = "is too small", false;
  out = n;
  return true;
}

}  // namespace

const std::vector<EnvFlag>& env_flags() {
  static const auto* table = new std::vector<EnvFlag>(make_table());  // usable at exit
  return *table;
}

bool env_bool(const char* name, OnBad on_bad) {
  return read<bool>(name, on_bad, {},
                    [](const EnvFlag&, const std::string& text, bool& out, std::string& why) {
                      return parse_bool(text, out) || (why = "is not a boolean", false);
                    });
}

int64_t env_int(const char* name, OnBad on_bad) {
  return read<int64_t>(name, on_bad, {}, parse_int);
}

std::string env_string(const char* name, OnBad on_bad) {
  return read<std::string>(
      name, on_bad, {},
      [](const EnvFlag& f, const std::string& text, std::string& out, std::string& why) {
        if (f.kind == EnvKind::BoolOrJson) {
          bool on = false;
          if (text.empty() || parse_bool(text, on)) return out = on ? "1" : "", true;
          const bool json = text.size() > 5 && text.compare(text.size() - 5, 5, ".json") == 0;
          return json ? (out = text, true) : (why = "is neither a boolean nor a .json file", false);
        }
        out = text;
        return true;
      });
}

std::vector<std::string> env_list(const char* name, OnBad on_bad,
                                  const std::vector<std::string>& accepted) {
  return read<std::vector<std::string>>(
      name, on_bad, accepted,
      [&](const EnvFlag& f, const std::string& text, std::vector<std::string>& out,
          std::string& why) {
        const std::vector<std::string> known = !accepted.empty() ? accepted
                                               : f.accepted      ? split(f.accepted)
                                                                 : std::vector<std::string>{};
        out = split(text);
        for (const std::string& item : out)
          if (!known.empty() && std::find(known.begin(), known.end(), item) == known.end())
            return why = "names '" + item + "', which is not known", false;
        return true;
      });
}

void reset_env_warnings_for_testing() {
  std::lock_guard<std::mutex> lock(warned().mu);
  warned().names.clear();
}

}  // namespace kiln::detail
