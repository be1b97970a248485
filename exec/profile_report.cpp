// The profiler's report (KILN_PROFILE=1, kiln::profiler::report): the plan steps' table per
// kernel and per op type, the JIT's own costs from its counters, and tips computed from both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "exec/lazy_eval.h"
#include "jit/passes/passes.h"
#include "kiln/jit.h"
#include "lib/cuda_driver.h"
#include "lib/profiler.h"

namespace kiln::profiler {

namespace {

// The counters as reset() found them: the report shows what happened since.
struct Baseline {
  std::mutex mutex;
  jit::Stats stats;                           // under mutex
  jit::LazyStats lazy;                        // under mutex
  std::vector<jit::PassProfileEntry> passes;  // under mutex
  detail::cuda::TransferCounts transfers;     // under mutex
};
Baseline& baseline() {
  static Baseline* b = new Baseline();  // never destroyed: the exit handler reads it
  return *b;
}

struct Row {
  std::string name;
  bool gemm = false;
  int64_t calls = 0;
  int64_t ns = 0;
  int64_t bytes = 0;
  int64_t flops = 0;
  double gbps() const { return ns > 0 ? static_cast<double>(bytes) / static_cast<double>(ns) : 0; }
  double gflops() const {
    return ns > 0 ? static_cast<double>(flops) / static_cast<double>(ns) : 0;
  }
  double per_call_us() const { return calls ? static_cast<double>(ns) / 1e3 / calls : 0; }
};

bool is_step(const Record& r) {
  return r.category == Category::kKernel || r.category == Category::kLibrary ||
         r.category == Category::kOp;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The machine's memory floor for a streaming kernel: the best of a few copies of 64 MiB with
// memcpy (bytes read and written), measured once per process when a tip needs it.
double measured_copy_gbps() {
  static const double gbps = [] {
    const size_t n = size_t{64} << 20;
    std::vector<char> a(n, 1), b(n, 0);
    double best = 0;
    for (int i = 0; i < 3; ++i) {
      const auto t = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), n);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      if (b[n / 2] != 1) return 0.0;  // keeps the copy
      best = std::max(best, 2.0 * static_cast<double>(n) / s / 1e9);
    }
    return best;
  }();
  return gbps;
}

void table(std::ostringstream& os, std::vector<Row> rows, int64_t total_ns) {
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ns > b.ns; });
  char line[512];
  std::snprintf(line, sizeof line, "  %7s %7s %11s %12s %8s %8s %8s  %s\n", "% time", "cum %",
                "total ms", "per call us", "calls", "GB/s", "GFLOP/s", "name");
  os << line;
  double cum = 0;
  for (const Row& r : rows) {
    const double pct = total_ns > 0 ? 100.0 * static_cast<double>(r.ns) / total_ns : 0;
    cum += pct;
    const std::string gb = r.bytes > 0 ? fmt("%.2f", r.gbps()) : "-";
    const std::string gf = r.flops > 0 ? fmt("%.2f", r.gflops()) : "-";
    std::snprintf(line, sizeof line, "  %6.2f%% %6.2f%% %11.3f %12.2f %8lld %8s %8s  %s\n", pct,
                  cum, static_cast<double>(r.ns) / 1e6, r.per_call_us(),
                  static_cast<long long>(r.calls), gb.c_str(), gf.c_str(), r.name.c_str());
    os << line;
  }
}

}  // namespace

void reset() {
  detail::profile_clear();
  Baseline& b = baseline();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.stats = jit::stats();
  b.lazy = jit::lazy_stats();
  b.passes = jit::pass_profile();
  b.transfers = detail::cuda::transfer_counts();
}

namespace {
// What the report reads: the counters now and as reset() found them.
struct Counters {
  jit::Stats st, st0;
  jit::LazyStats lz, lz0;
  std::vector<jit::PassProfileEntry> passes0;
  detail::cuda::TransferCounts tr;  // since reset()
  int64_t replays = 0;              // since reset()
};

Counters read_counters() {
  Counters c;
  detail::cuda::TransferCounts tr0;
  {
    Baseline& b = baseline();
    std::lock_guard<std::mutex> lock(b.mutex);
    c.st0 = b.stats;
    c.lz0 = b.lazy;
    c.passes0 = b.passes;
    tr0 = b.transfers;
  }
  c.tr = detail::cuda::transfer_counts();
  c.tr.host_to_device -= tr0.host_to_device;
  c.tr.device_to_host -= tr0.device_to_host;
  c.tr.copies_to_device -= tr0.copies_to_device;
  c.tr.copies_to_host -= tr0.copies_to_host;
  c.st = jit::stats();
  c.lz = jit::lazy_stats();
  c.replays = c.st.replays - c.st0.replays;
  return c;
}

// The records summed: the steps' rows per kernel (name and shape), per op type (name) and per
// graph; the JIT's phases; the guard failures by what differed.
struct Tables {
  std::map<std::string, Row> per_kernel, per_type;
  std::map<int64_t, Row> per_graph;  // by graph number
  std::map<std::string, Row> phases;
  std::map<std::string, std::pair<int64_t, std::string>> guard_reasons;  // count, latest
  int64_t step_ns = 0, step_calls = 0;
};

void add_to(Row& row, const Record& r) {
  ++row.calls;
  row.ns += r.duration_ns;
  row.bytes += r.bytes;
  row.flops += r.flops;
}

void add_other(Tables& t, const Record& r) {
  if (r.name == "guard failure") {
    // Counted per input that differed ("input 0 is float32[5], traced as float32[4]" counts as
    // "input 0"), with the latest reason as the example.
    const size_t is = r.shape.find(" is ");
    auto& g = t.guard_reasons[is == std::string::npos ? r.shape : r.shape.substr(0, is)];
    ++g.first;
    g.second = r.shape;
    return;
  }
  Row& p = t.phases[r.name];
  p.name = r.name;
  ++p.calls;
  p.ns += r.duration_ns;
}

Tables tabulate(const std::vector<Record>& rs) {
  Tables t;
  for (const Record& r : rs) {
    if (!is_step(r)) {
      add_other(t, r);
      continue;
    }
    t.step_ns += r.duration_ns;
    ++t.step_calls;
    if (r.graph >= 0) add_to(t.per_graph[r.graph], r);
    for (auto* m : {&t.per_kernel, &t.per_type}) {
      const std::string key =
          m == &t.per_kernel && !r.shape.empty() ? r.name + " [" + r.shape + "]" : r.name;
      Row& row = (*m)[key];
      row.name = key;
      row.gemm |= r.flops > 0;
      add_to(row, r);
    }
  }
  return t;
}

std::vector<Row> values(const std::map<std::string, Row>& m) {
  std::vector<Row> v;
  for (const auto& [k, row] : m) v.push_back(row);
  return v;
}

void write_step_tables(std::ostringstream& os, Tables& t) {
  os << "=== kiln profile: " << t.step_calls << " plan steps, "
     << fmt("%.3f", static_cast<double>(t.step_ns) / 1e6) << " ms ===\n";
  os << "\nKernels and library calls (bytes: the step's inputs and outputs; GFLOP/s for GEMMs):\n";
  table(os, values(t.per_kernel), t.step_ns);
  os << "\nPer op type (fused kernels by the ops inside):\n";
  table(os, values(t.per_type), t.step_ns);
  if (t.per_graph.empty()) return;
  // Each graph by what it is: which traced function or lazy flush, as KILN_DUMP names it.
  std::map<int64_t, std::string> names;
  for (GraphName& g : graph_names()) names[g.graph] = std::move(g.name);
  std::vector<Row> rows;
  for (auto& [graph, row] : t.per_graph) {
    auto name = names.find(graph);
    row.name = "graph " + std::to_string(graph) +
               (name == names.end() ? std::string() : ": " + name->second);
    rows.push_back(row);
  }
  os << "\nPer graph (calls: the steps its plans ran):\n";
  table(os, rows, t.step_ns);
}

void write_counts(std::ostringstream& os, const Counters& c) {
  char line[512];
  const jit::Stats &st = c.st, &st0 = c.st0;
  std::snprintf(line, sizeof line,
                "  lazy evaluations %lld (plan cache hits %lld), nodes in their graphs %lld, "
                "nodes run %lld\n",
                static_cast<long long>(c.lz.evaluations - c.lz0.evaluations),
                static_cast<long long>(c.lz.plan_cache_hits - c.lz0.plan_cache_hits),
                static_cast<long long>(c.lz.nodes_in_graphs - c.lz0.nodes_in_graphs),
                static_cast<long long>(c.lz.nodes_executed - c.lz0.nodes_executed));
  os << line;
  std::snprintf(line, sizeof line,
                "  traces %lld, replays %lld, guard failures %lld (re-specializations and first "
                "calls)\n",
                static_cast<long long>(st.traces - st0.traces),
                static_cast<long long>(st.replays - st0.replays),
                static_cast<long long>(st.guard_failures - st0.guard_failures));
  os << line;
  std::snprintf(line, sizeof line,
                "  kernels: compiled %lld in %.3f ms, memory cache hits %lld, disk cache hits "
                "%lld, evicted %lld\n",
                static_cast<long long>(st.kernels_compiled - st0.kernels_compiled),
                (st.compile_seconds - st0.compile_seconds) * 1e3,
                static_cast<long long>(st.kernel_memory_hits - st0.kernel_memory_hits),
                static_cast<long long>(st.kernel_disk_hits - st0.kernel_disk_hits),
                static_cast<long long>(st.kernels_evicted - st0.kernels_evicted));
  os << line;
}

void write_transfers(std::ostringstream& os, const Counters& c) {
  const detail::cuda::TransferCounts& tr = c.tr;
  if (tr.copies_to_device + tr.copies_to_host == 0) return;
  char line[512];
  std::snprintf(
      line, sizeof line,
      "  host<->device: %.3f MB to the device in %lld copies, %.3f MB to the host in "
      "%lld copies",
      static_cast<double>(tr.host_to_device) / 1e6, static_cast<long long>(tr.copies_to_device),
      static_cast<double>(tr.device_to_host) / 1e6, static_cast<long long>(tr.copies_to_host));
  os << line;
  if (c.replays > 0) {
    std::snprintf(line, sizeof line, " (%.3f MB up, %.3f MB down per traced call)",
                  static_cast<double>(tr.host_to_device) / 1e6 / static_cast<double>(c.replays),
                  static_cast<double>(tr.device_to_host) / 1e6 / static_cast<double>(c.replays));
    os << line;
  }
  os << "\n";
}

void write_guards_and_phases(std::ostringstream& os, const Tables& t) {
  char line[512];
  for (const auto& [key, g] : t.guard_reasons) {
    std::snprintf(line, sizeof line, "  guard failed %lldx on %s (latest: %s)\n",
                  static_cast<long long>(g.first), key.c_str(), g.second.c_str());
    os << line;
  }
  if (t.phases.empty()) return;
  std::snprintf(line, sizeof line, "  %-24s %8s %11s %12s\n", "phase (nested ones included)",
                "calls", "total ms", "per call us");
  os << line;
  for (const auto& [name, p] : t.phases) {
    std::snprintf(line, sizeof line, "  %-24s %8lld %11.3f %12.2f\n", name.c_str(),
                  static_cast<long long>(p.calls), static_cast<double>(p.ns) / 1e6,
                  p.per_call_us());
    os << line;
  }
}

// A pass's profile since reset().
jit::PassProfileEntry since(const jit::PassProfileEntry& e,
                            const std::vector<jit::PassProfileEntry>& passes0) {
  jit::PassProfileEntry d = e;
  for (const jit::PassProfileEntry& b : passes0) {
    if (b.pass != e.pass) continue;
    d.runs -= b.runs;
    d.seconds -= b.seconds;
    d.nodes_before -= b.nodes_before;
    d.nodes_after -= b.nodes_after;
    for (const auto& [rule, n] : b.rewrites) d.rewrites[rule] -= n;
  }
  return d;
}

void write_passes(std::ostringstream& os, const std::vector<jit::PassProfileEntry>& passes0) {
  char line[512];
  bool header = false;
  for (const jit::PassProfileEntry& e : jit::pass_profile()) {
    const jit::PassProfileEntry d = since(e, passes0);
    if (d.runs <= 0) continue;
    if (!header) {
      std::snprintf(line, sizeof line, "  %-14s %6s %10s %14s  %s\n", "pass", "runs", "ms",
                    "nodes in->out", "rewrites");
      os << line;
      header = true;
    }
    std::string rules;
    for (const auto& [rule, n] : d.rewrites)
      if (n > 0) rules += (rules.empty() ? "" : ", ") + rule + " x" + std::to_string(n);
    const std::string nodes = std::to_string(d.nodes_before) + "->" + std::to_string(d.nodes_after);
    std::snprintf(line, sizeof line, "  %-14s %6lld %10.3f %14s  %s\n", d.pass.c_str(),
                  static_cast<long long>(d.runs), d.seconds * 1e3, nodes.c_str(),
                  rules.empty() ? "-" : rules.c_str());
    os << line;
  }
}

// A streaming kernel far below the best bandwidth seen (the steps' best, or a copy's).
void slow_kernel_tips(const Tables& t, std::vector<std::string>& tips) {
  double best = 0;
  for (const auto& [k, r] : t.per_kernel)
    if (!r.gemm && r.bytes / std::max<int64_t>(r.calls, 1) >= (int64_t{1} << 20))
      best = std::max(best, r.gbps());
  bool measured = false;
  for (const auto& [k, r] : t.per_kernel) {
    if (r.gemm || r.bytes / std::max<int64_t>(r.calls, 1) < (int64_t{1} << 20) ||
        r.ns * 20 < t.step_ns)
      continue;
    if (!measured) {
      best = std::max(best, measured_copy_gbps());
      measured = true;
    }
    if (r.gbps() < 0.25 * best)
      tips.push_back(r.name + " moves " + fmt("%.1f", r.gbps()) + " GB/s, under a quarter of " +
                     fmt("%.1f", best) + " GB/s (the best step or a measured copy) while taking " +
                     fmt("%.0f", 100.0 * static_cast<double>(r.ns) / t.step_ns) +
                     "% of the time: a strided or broadcast layout, or a costly formula?");
  }
}

void guard_tips(const Tables& t, std::vector<std::string>& tips) {
  for (const auto& [key, g] : t.guard_reasons)
    if (g.first >= 2 && key != "no specialization yet")
      tips.push_back("a traced function's guard failed " + std::to_string(g.first) + " times on " +
                     key + " (latest: " + g.second + ")" +
                     ": each new size traces and compiles again; keep the sizes fixed (pad) or "
                     "give the function the sizes it will see");
}

void tiny_step_tips(const Tables& t, std::vector<std::string>& tips) {
  int64_t tiny_calls = 0, tiny_ns = 0;
  for (const auto& [k, r] : t.per_kernel)
    if (r.per_call_us() < 5) {
      tiny_calls += r.calls;
      tiny_ns += r.ns;
    }
  if (tiny_calls >= 100 && tiny_ns * 2 >= t.step_ns)
    tips.push_back(std::to_string(tiny_calls) + " step runs took under 5 us each (" +
                   fmt("%.0f", 100.0 * static_cast<double>(tiny_ns) / t.step_ns) +
                   "% of the steps' time): launch and dispatch overhead dominates; batch the "
                   "work into larger tensors, or jit::trace the loop body");
}

// Compiling that costs more than running; uploads on every call of a traced function (inputs
// kept on the host, or ops that have no device kernel and run through the host).
void jit_cost_tips(const Tables& t, const Counters& c, std::vector<std::string>& tips) {
  const double compile_ms = (c.st.compile_seconds - c.st0.compile_seconds) * 1e3;
  if (compile_ms > 0 && compile_ms * 1e6 > static_cast<double>(t.step_ns))
    tips.push_back("compiling kernels took " + fmt("%.1f", compile_ms) +
                   " ms, more than running the steps: the disk cache ($KILN_CACHE_DIR) keeps "
                   "them for the next run");
  if (c.replays >= 2 && c.tr.host_to_device / c.replays >= (int64_t{1} << 20))
    tips.push_back("each traced call copies " +
                   fmt("%.1f", static_cast<double>(c.tr.host_to_device) / 1e6 /
                                   static_cast<double>(c.replays)) +
                   " MB from the host to the device: keep inputs on the device (t.to(kCUDA) "
                   "once, outside the loop); KILN_LOG=fuser names steps that run through the host");
}

void write_tips(std::ostringstream& os, const Tables& t, const Counters& c) {
  std::vector<std::string> tips;
  slow_kernel_tips(t, tips);
  guard_tips(t, tips);
  tiny_step_tips(t, tips);
  jit_cost_tips(t, c, tips);
  os << "\nTips:\n";
  if (tips.empty()) os << "  none\n";
  for (const std::string& tip : tips) os << "  - " << tip << "\n";
}
}  // namespace

std::string report() {
  const std::vector<Record> rs = records();
  const Counters c = read_counters();
  Tables t = tabulate(rs);
  std::ostringstream os;
  write_step_tables(os, t);
  // The JIT's own costs.
  os << "\nJIT:\n";
  write_counts(os, c);
  write_transfers(os, c);
  write_guards_and_phases(os, t);
  write_passes(os, c.passes0);
  write_tips(os, t, c);
  return os.str();
}

void print() {
  std::cerr << report() << std::flush;
}

}  // namespace kiln::profiler
