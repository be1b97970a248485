// The profiler's public API: spans of kernels, library calls, JIT phases and cache look-ups, a
// report of where the time went, and a Chrome trace (KILN_PROFILE=1 or KILN_PROFILE=path.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::profiler {

// What a span measured.
enum class Category {
  kKernel,   // a fused kernel compiled by the JIT
  kLibrary,  // an op's own kernel run by a plan (GEMMs through oneDNN, reductions, ...)
  kOp,       // an elementwise op a plan ran straight into its output (no fusion partner)
  kJit,      // the JIT's own work: graph building, passes, planning, compilation, tracing
  kCache,    // the kernel cache: in-memory look-ups ("kernel.lookup") and disk loads
};
const char* category_name(Category c);

// One measured span. Kernel, library and op spans are the steps of a plan's run; their bytes are
// the sizes of the step's inputs and outputs, and their flops are known for GEMMs (2*M*N*K).
struct Record {
  std::string name;    // fused kernels: "fused:" + the ops inside; other steps: the op's name;
                       // JIT phases: the phase ("lazy.evaluate", "pass:cse", "compile", ...);
                       // the cache: "kernel.lookup", "kernel.disk_load"
  std::string shape;   // the step's iteration shape ("64x256"), or the phase's detail (a
                       // kernel's symbol; a look-up's also says "(hit)" or "(miss)")
  std::string kernel;  // fused kernels: the kernel's symbol, kiln_<ops>_<hash8>
  Category category = Category::kJit;
  uint32_t thread = 0;   // small per-process thread number, 1 for the first thread seen
  uint32_t depth = 0;    // spans open on the thread when this one started
  int64_t start_ns = 0;  // since the profiler's clock started
  int64_t duration_ns = 0;
  int64_t bytes = 0;  // moved by the step, 0 when unknown
  int64_t flops = 0;  // floating-point operations, 0 when unknown
  // Plan steps: the number of the graph whose plan ran the step (the id KILN_DUMP's files and
  // graph_names() use), and for fused kernels the fusion group's index in that graph (the dump's
  // group id), so that a kernel two groups share is timed per group. -1 when none.
  int64_t graph = -1;
  int64_t group = -1;
};

// What a planned graph is (a lazy flush and why, a traced function's forward or backward), by
// graph number, for every graph named while profiling was on; kept by reset().
struct GraphName {
  int64_t graph = -1;
  std::string name;
};
std::vector<GraphName> graph_names();

// Profiling is off unless KILN_PROFILE is set (to 1: a report on stderr at exit; to a file name:
// a Chrome trace written there at exit) or set_enabled(true) is called. Off, each hook costs one
// relaxed atomic load and a branch.
bool enabled();
void set_enabled(bool on);

// Profiling on (or off) within a scope; the previous state comes back at its end.
class ProfileGuard {
 public:
  explicit ProfileGuard(bool on = true);
  ~ProfileGuard();
  ProfileGuard(const ProfileGuard&) = delete;
  ProfileGuard& operator=(const ProfileGuard&) = delete;

 private:
  bool previous_;
};

// Copies of the spans recorded since the start (or the last reset), in the order they ended.
std::vector<Record> records();
// Drops the records and starts the JIT's counters (cache hits, passes, guard failures) afresh
// for the report.
void reset();

// The report KILN_PROFILE=1 prints: the kernel and library call table, the same per op type, the
// JIT's own costs, and tips.
std::string report();
// Prints report() to stderr.
void print();
// The records as a Chrome trace event file (a JSON array of complete events, ts and dur in
// microseconds), which Perfetto and chrome://tracing load. Plan steps carry args.graph and
// args.group; each named graph is a metadata event {"ph":"M","name":"kiln_graph","args":{"graph":
// N,"name":...}}, which trace viewers ignore and tools/kiln-viz reads.
std::string chrome_trace();
void write_chrome_trace(const std::string& path);

}  // namespace kiln::profiler
