// The profiler's records: the switch, the clock, the store, KILN_PROFILE at start and exit, and
// the Chrome trace writer. The report, which reads the JIT's counters, is in
// exec/profile_report.cpp.
#include "lib/profiler.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "kiln/error.h"
#include "lib/env.h"

namespace kiln::detail {

std::atomic<bool> g_profiling{false};

namespace {

// The start of the profiler's clock, read when the library loads.
const std::chrono::steady_clock::time_point g_epoch = std::chrono::steady_clock::now();

// The profiler's state. Never destroyed, so that the exit handler and threads still running at
// exit can use it.
struct Store {
  std::mutex mutex;
  std::vector<profiler::Record> records;  // under mutex: appended as spans end, from every thread
  std::map<int64_t, std::string> graph_names;  // under mutex: by graph number; outlives reset()
  std::atomic<uint32_t> next_thread{1};        // atomic: numbers the threads that record
  bool print_at_exit = false;                  // set once at start (KILN_PROFILE=1), then read-only
  std::string exit_trace_path;  // set once at start (KILN_PROFILE=<file>), then read-only
};
Store& store() {
  static Store* s = new Store();
  return *s;
}

thread_local uint32_t t_thread = 0;
thread_local uint32_t t_depth = 0;

uint32_t thread_number() {
  if (t_thread == 0) t_thread = store().next_thread.fetch_add(1, std::memory_order_relaxed);
  return t_thread;
}

}  // namespace

int64_t profile_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              g_epoch)
      .count();
}

SpanStart profile_begin() {
  return {profile_now_ns(), t_depth++};
}

void profile_end(const SpanStart& s, profiler::Record&& r) {
  const int64_t end = profile_now_ns();
  t_depth = s.depth;
  profile_store(s, std::move(r), end - s.start_ns);
}

void profile_end_discard(const SpanStart& s) {
  t_depth = s.depth;
}

void profile_store(const SpanStart& s, profiler::Record&& r, int64_t duration_ns) {
  r.thread = thread_number();
  r.depth = s.depth;
  r.start_ns = s.start_ns;
  r.duration_ns = duration_ns;
  Store& st = store();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.records.push_back(std::move(r));
}

void profile_event(profiler::Record&& r) {
  profile_end(SpanStart{profile_now_ns(), t_depth}, std::move(r));
}

void profile_name_graph(int64_t graph, std::string name) {
  Store& st = store();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.graph_names[graph] = std::move(name);
}

void profile_clear() {
  Store& st = store();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.records.clear();
}

void ProfileSpan::finish() {
  profiler::Record r;
  r.name = name_;
  if (suffix_) r.name += suffix_;
  r.category = category_;
  if (detail_) r.shape = std::move(*detail_);
  profile_end(start_, std::move(r));
}

}  // namespace kiln::detail

namespace kiln::profiler {

const char* category_name(Category c) {
  switch (c) {
    case Category::kKernel:
      return "kernel";
    case Category::kLibrary:
      return "library";
    case Category::kOp:
      return "op";
    case Category::kJit:
      return "jit";
    case Category::kCache:
      return "cache";
  }
  return "?";
}

bool enabled() {
  return detail::profiling();
}

void set_enabled(bool on) {
  detail::g_profiling.store(on, std::memory_order_relaxed);
}

ProfileGuard::ProfileGuard(bool on) : previous_(enabled()) {
  set_enabled(on);
}
ProfileGuard::~ProfileGuard() {
  set_enabled(previous_);
}

std::vector<Record> records() {
  detail::Store& st = detail::store();
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.records;
}

std::vector<GraphName> graph_names() {
  detail::Store& st = detail::store();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<GraphName> out;
  for (const auto& [graph, name] : st.graph_names) out.push_back({graph, name});
  return out;
}

namespace {
void json_string(std::ostream& os, const std::string& s) {
  os << '"';
  for (char c : s) {
    switch (c) {
      case '"':
        os << "\\\"";
        break;
      case '\\':
        os << "\\\\";
        break;
      case '\n':
        os << "\\n";
        break;
      case '\t':
        os << "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          os << buf;
        } else {
          os << c;
        }
    }
  }
  os << '"';
}
}  // namespace

std::string chrome_trace() {
  const std::vector<Record> rs = records();
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  os << "[\n";
  const char* separator = "";  // before each event but the first
  for (const GraphName& g : graph_names()) {
    os << separator
       << "{\"name\":\"kiln_graph\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"graph\":"
       << g.graph << ",\"name\":";
    json_string(os, g.name);
    os << "}}";
    separator = ",\n";
  }
  for (const Record& r : rs) {
    os << separator << "{\"name\":";
    separator = ",\n";
    json_string(os, r.shape.empty() ? r.name : r.name + " " + r.shape);
    os << ",\"cat\":\"" << category_name(r.category)
       << "\",\"ph\":\"X\",\"ts\":" << static_cast<double>(r.start_ns) / 1e3
       << ",\"dur\":" << static_cast<double>(r.duration_ns) / 1e3
       << ",\"pid\":1,\"tid\":" << r.thread << ",\"args\":{\"op\":";
    json_string(os, r.name);
    os << ",\"shape\":";
    json_string(os, r.shape);
    if (!r.kernel.empty()) {
      os << ",\"kernel\":";
      json_string(os, r.kernel);
    }
    if (r.graph >= 0) os << ",\"graph\":" << r.graph;
    if (r.group >= 0) os << ",\"group\":" << r.group;
    os << ",\"bytes\":" << r.bytes << ",\"flops\":" << r.flops << "}}";
  }
  os << "\n]\n";
  return os.str();
}

void write_chrome_trace(const std::string& path) {
  std::ofstream f(path);
  KILN_CHECK(f.good(), "profiler: cannot write the trace to '", path, "'");
  f << chrome_trace();
  KILN_CHECK(f.good(), "profiler: writing the trace to '", path, "' failed");
}

namespace {
void at_exit() {
  set_enabled(false);
  try {
    const detail::Store& st = detail::store();
    if (st.print_at_exit) print();
    if (!st.exit_trace_path.empty()) {
      write_chrome_trace(st.exit_trace_path);
      std::cerr << "kiln: profile trace (" << records().size() << " spans) written to "
                << st.exit_trace_path << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "kiln: KILN_PROFILE: " << e.what() << "\n";
  }
}

// KILN_PROFILE: "1" prints the report at exit, any other value but "0" names the trace file.
const bool kFromEnvironment = [] {
  const std::string env = detail::env_string("KILN_PROFILE", detail::OnBad::Warn);
  if (env.empty()) return false;
  if (env == "1")
    detail::store().print_at_exit = true;
  else
    detail::store().exit_trace_path = env;
  set_enabled(true);
  std::atexit(&at_exit);
  return true;
}();
}  // namespace

}  // namespace kiln::profiler
