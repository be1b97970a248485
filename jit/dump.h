// KILN_DUMP=dir: the graph as JSON after every pass and after fusion (schema: docs/dump-schema.md),
// and each compiled kernel's LLVM IR and assembly, for tools/kiln-viz and for reading.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include "jit/ir.h"

namespace kiln::jit {

// True when graphs and kernels are dumped: KILN_DUMP names a directory (read once per process), or
// set_dump_dir gave one. Off, this is the only cost of dumping at each hook.
bool dump_enabled();
// The dump directory, or "" when dumping is off.
std::string dump_dir();
// Overrides KILN_DUMP from now on ("" turns dumping off); for tests. Kernels compiled (or
// graphs planned) before the call are not dumped again.
void set_dump_dir(const std::string& dir);

// The version of the "kiln.graph" JSON schema this code writes.
constexpr int kDumpSchemaVersion = 2;

// The graph's number, given on first use from one process-wide count: the id in KILN_DUMP's file
// names and in the profile records of the steps its plan runs.
int64_t graph_number(const Graph& g);

// Whether graphs' names are kept: dumping or profiling is on.
bool graph_names_kept();
// Says what `g` is ("lazy flush #3: item() (data access)", "trace #1: backward") for the dump's
// "name" and the profile's graph_names(); call it before the graph's first dump (run_passes).
// `describe` returns the name and is called only when names are kept.
void set_graph_name(const Graph& g, std::string name);
template <typename Describe>
void name_graph(const Graph& g, Describe&& describe) {
  if (graph_names_kept()) set_graph_name(g, describe());
}
// The name set_graph_name gave `g`, or "".
std::string graph_name(const Graph& g);

// A callable's type as a short name for a traced function's graphs: "lstm()::lambda#1" for the
// first lambda in lstm(), a functor's class name, or "a function" for a function pointer.
std::string callable_name(const std::type_info& type);

// A fusion group as the dump describes it (the executor fills it from fuser::FusionGroup).
struct DumpGroup {
  std::vector<const Node*> members;  // in graph order
  std::vector<const Value*> inputs;
  std::vector<const Value*> outputs;
  std::string ops;  // the kernel's ops, as in its symbol kiln_<ops>_<hash8>
  Shape shape;      // the iteration shape
  bool rows = false;
  std::vector<const Node*> joins;  // the cats or stacks the group writes into, in kernel order
};

// Writes `g` as it is after `pass` ("input" before the passes): the file
// <dir>/<seq>_g<graph>_<step>_<pass>.json, where seq counts the files this process wrote, graph
// numbers the graph (the same in every file of it) and step counts the graph's own files. Does
// nothing when dumping is off. Write errors are reported once on stderr, never thrown.
void dump_graph(const Graph& g, const char* pass);

// The dump of a graph with its fusion groups (pass "fuse"), kept by the plan that ran the fuser:
// each kernel compiled for a group is added to the group's "kernels" and the file is rewritten,
// so that it names every kernel compiled so far. Thread-safe.
class FusedGraphDump {
 public:
  // Null when dumping is off.
  static std::unique_ptr<FusedGraphDump> create(const Graph& g,
                                                const std::vector<DumpGroup>& groups);
  // Records that `kernel` was compiled for group `group` (once per name) and rewrites the file.
  void add_kernel(size_t group, const std::string& kernel);
  const std::string& path() const { return path_; }

 private:
  FusedGraphDump() = default;
  void write();
  std::mutex mu_;
  std::string path_;
  std::string head_;                               // the JSON up to the groups' kernel lists
  std::vector<std::string> group_heads_;           // per group: its fields before "kernels"
  std::vector<std::vector<std::string>> kernels_;  // per group: kernel names so far
};

// Writes `text` to <dir>/kernels/<name><suffix> (the kernels' IR and assembly). Does nothing when
// dumping is off.
void dump_kernel_file(const std::string& name, const char* suffix, const std::string& text);

// `s` as a JSON string literal (quotes, backslashes and control characters escaped; bytes of 0x80
// and above copied, so UTF-8 stays UTF-8).
void append_json_string(std::string& out, const std::string& s);

}  // namespace kiln::jit
