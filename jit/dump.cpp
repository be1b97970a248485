// KILN_DUMP: graphs as "kiln.graph" JSON (docs/dump-schema.md) and kernels' IR and assembly.
//
// The switch is read from the environment once; off, each hook (run_passes, Plan's constructor,
// a kernel's compilation) costs one call and a relaxed load. Files are written to a temporary
// name and renamed, so a reader (kiln-viz on a running program's dump) never sees half a file.
// The writer walks the node list once, iteratively: a million-node graph dumps like a small one.
#include "jit/dump.h"

#include <cxxabi.h>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "kiln/error.h"
#include "lib/env.h"
#include "lib/profiler.h"

namespace kiln::jit {

namespace {

// KILN_DUMP's state.
struct DumpState {
  std::mutex mu;
  std::string dir;                     // under mu: the dump directory, "" when off
  std::atomic<bool> on{false};         // atomic: whether dir is set (read without the lock)
  std::atomic<int64_t> next_file{0};   // atomic: numbers the files written
  std::atomic<int64_t> next_graph{0};  // atomic: numbers the graphs dumped
  std::atomic<bool> warned{false};     // atomic: a failure to write was reported once
  bool made_dirs = false;              // under mu: dir and dir/kernels exist
  absl::flat_hash_map<int64_t, std::string> names;  // under mu: graph number -> what it is

  DumpState() {
    dir = detail::env_string("KILN_DUMP");
    if (!dir.empty()) {
      on.store(true, std::memory_order_relaxed);
    }
  }
};

DumpState& state() {
  static DumpState* s = new DumpState();  // never destroyed: usable from exit handlers
  return *s;
}

void warn_once(const std::string& what) {
  if (state().warned.exchange(true)) return;
  std::cerr << "kiln: KILN_DUMP: " << what << " (further dump errors are not reported)\n";
}

// The directory, with its kernels/ subdirectory created, or "" (dumping off, or not creatable).
std::string ready_dir() {
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.dir.empty()) return "";
  if (!s.made_dirs) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(s.dir) / "kernels", ec);
    if (ec) {
      warn_once("cannot create '" + s.dir + "/kernels': " + ec.message());
      return "";
    }
    s.made_dirs = true;
  }
  return s.dir;
}

// Writes `text` to `path` through a temporary file renamed over it.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f.good()) {
      warn_once("cannot write '" + tmp + "'");
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) warn_once("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

void append_int(std::string& out, int64_t v) {
  out += std::to_string(v);
}

// The shortest "%.*g" form that reads back as `v`; non-finite values as the strings "nan",
// "inf" and "-inf" (JSON has no numbers for them).
void append_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"nan\"";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "\"inf\"" : "\"-inf\"";
    return;
  }
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  out += buf;
}

void append_ints(std::string& out, const std::vector<int64_t>& v) {
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    append_int(out, v[i]);
  }
  out += ']';
}

void append_attr(std::string& out, const AttrValue& a) {
  if (std::holds_alternative<std::monostate>(a)) {
    out += "null";
  } else if (const bool* b = std::get_if<bool>(&a)) {
    out += *b ? "true" : "false";
  } else if (const int64_t* i = std::get_if<int64_t>(&a)) {
    append_int(out, *i);
  } else if (const double* d = std::get_if<double>(&a)) {
    append_double(out, *d);
  } else if (const std::string* s = std::get_if<std::string>(&a)) {
    append_json_string(out, *s);
  } else if (const auto* v = std::get_if<std::vector<int64_t>>(&a)) {
    append_ints(out, *v);
  } else if (const DType* t = std::get_if<DType>(&a)) {
    append_json_string(out, dtype_name(*t));
  }
}

void append_value_ids(std::string& out, const std::vector<const Value*>& values) {
  out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    if (values[i])
      append_int(out, values[i]->id());
    else
      out += "null";
  }
  out += ']';
}

// The file's path for the graph's next step.
std::string next_path(const std::string& dir, const Graph& g, const char* pass) {
  DumpState& s = state();
  const int64_t id = graph_number(g);
  const int step = g.dump_info().steps++;
  char name[64];
  std::snprintf(name, sizeof name, "%06lld_g%04lld_%02d_",
                static_cast<long long>(s.next_file.fetch_add(1)), static_cast<long long>(id), step);
  return dir + "/" + name + pass + ".json";
}

// The whole document up to the groups' "kernels" lists, which the caller appends (with the rest).
// `groups` may be empty. Every node is numbered by its place in the list.
struct GraphText {
  std::string head;                      // up to and including "groups":[
  std::vector<std::string> group_heads;  // per group: {"id":..., up to and including "kernels":[
};

GraphText graph_text(const Graph& g, const char* pass, int step,
                     const std::vector<DumpGroup>& groups) {
  absl::flat_hash_map<const Node*, int64_t> index;
  index.reserve(g.size());
  {
    int64_t i = 0;
    for (const Node* n = g.first(); n; n = n->next()) index.emplace(n, i++);
  }
  absl::flat_hash_map<const Node*, int64_t> group_of;
  for (size_t k = 0; k < groups.size(); ++k)
    for (const Node* n : groups[k].members) group_of.emplace(n, static_cast<int64_t>(k));

  GraphText t;
  std::string& out = t.head;
  out.reserve(g.size() * 160 + 256);
  out += "{\"schema\":\"kiln.graph\",\"version\":";
  append_int(out, kDumpSchemaVersion);
  out += ",\"graph\":";
  append_int(out, g.dump_info().id);
  out += ",\"step\":";
  append_int(out, step);
  out += ",\"pass\":";
  append_json_string(out, pass);
  const std::string name = graph_name(g);
  if (!name.empty()) {
    out += ",\"name\":";
    append_json_string(out, name);
  }
  out += ",\n\"nodes\":[\n";
  bool first = true;
  for (const Node* n = g.first(); n; n = n->next()) {
    if (!first) out += ",\n";
    first = false;
    out += "{\"id\":";
    append_int(out, index.at(n));
    out += ",\"op\":";
    append_json_string(out, n->kind());
    if (n->op().kind == detail::OpKind::View) out += ",\"view\":true";
    out += ",\"attrs\":{";
    const std::vector<std::string>& names = n->op().attr_names;
    for (size_t a = 0; a < n->attrs().size(); ++a) {
      if (a) out += ',';
      append_json_string(out, a < names.size() ? names[a] : "a" + std::to_string(a));
      out += ':';
      append_attr(out, n->attrs()[a]);
    }
    out += "},\"inputs\":";
    append_value_ids(out, std::vector<const Value*>(n->inputs().begin(), n->inputs().end()));
    out += ",\"outputs\":[";
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      const Value* v = n->output(k);
      const ValueType& type = v->type();
      if (k) out += ',';
      out += "{\"id\":";
      append_int(out, v->id());
      out += ",\"dtype\":";
      append_json_string(out, dtype_name(type.dtype));
      out += ",\"sizes\":";
      append_ints(out, type.sizes);
      out += ",\"device\":";
      append_json_string(out, type.device.str());
      if (type.wrapped_number) out += ",\"wrapped\":true";
      out += '}';
    }
    out += "],\"group\":";
    auto grp = group_of.find(n);
    if (grp == group_of.end())
      out += "null";
    else
      append_int(out, grp->second);
    out += '}';
  }
  out += "\n],\n\"inputs\":";
  append_value_ids(out, std::vector<const Value*>(g.inputs().begin(), g.inputs().end()));
  out += ",\n\"outputs\":";
  append_value_ids(out, std::vector<const Value*>(g.outputs().begin(), g.outputs().end()));
  out += ",\n\"groups\":[";

  for (size_t k = 0; k < groups.size(); ++k) {
    const DumpGroup& grp = groups[k];
    std::string s = k ? ",\n" : "\n";
    s += "{\"id\":";
    append_int(s, static_cast<int64_t>(k));
    s += ",\"ops\":";
    append_json_string(s, grp.ops);
    s += ",\"members\":[";
    for (size_t m = 0; m < grp.members.size(); ++m) {
      if (m) s += ',';
      append_int(s, index.at(grp.members[m]));
    }
    s += "],\"inputs\":";
    append_value_ids(s, grp.inputs);
    s += ",\"outputs\":";
    append_value_ids(s, grp.outputs);
    s += ",\"shape\":";
    append_ints(s, grp.shape);
    s += ",\"rows\":";
    s += grp.rows ? "true" : "false";
    s += ",\"joins\":[";
    for (size_t j = 0; j < grp.joins.size(); ++j) {
      if (j) s += ',';
      append_int(s, index.at(grp.joins[j]));
    }
    s += ']';
    s += ",\"kernels\":[";
    t.group_heads.push_back(std::move(s));
  }
  return t;
}

constexpr const char* kTail = "\n]}\n";

}  // namespace

int64_t graph_number(const Graph& g) {
  // A graph is numbered by the one thread that builds and plans it.
  Graph::DumpInfo& info = g.dump_info();
  if (info.id < 0) info.id = state().next_graph.fetch_add(1);
  return info.id;
}

bool graph_names_kept() {
  return dump_enabled() || detail::profiling();
}

void set_graph_name(const Graph& g, std::string name) {
  const int64_t id = graph_number(g);
  if (detail::profiling()) detail::profile_name_graph(id, name);
  if (!dump_enabled()) return;
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.names[id] = std::move(name);
}

std::string graph_name(const Graph& g) {
  if (g.dump_info().id < 0) return "";
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.names.find(g.dump_info().id);
  return it == s.names.end() ? "" : it->second;
}

namespace {
bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}
}  // namespace

std::string callable_name(const std::type_info& type) {
  // A pointer's mangled type name starts with 'P': a function pointer names no function.
  if (type.name()[0] == 'P') return "a function";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  const std::string full = status == 0 && demangled ? demangled.get() : type.name();
  // Drop namespaces' noise, parameter lists and braces: "(anonymous namespace)::lstm()::{lambda(
  // std::vector<kiln::Tensor> const&)#1}" becomes "lstm()::lambda#1".
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    if (full.compare(i, 21, "(anonymous namespace)") == 0) {
      i += 22;  // with the "::" after it
      continue;
    }
    // clang names a lambda "$_<n>" (n counted over the file, from 0), GCC "{lambda(...)#<n>}"
    // (counted in its function, from 1): both read "lambda#<n>", numbered from 1.
    if (full.compare(i, 2, "$_") == 0 && i + 2 < full.size() && std::isdigit(full[i + 2])) {
      size_t end = i + 2;
      while (end < full.size() && std::isdigit(full[end])) ++end;
      out += "lambda#" + std::to_string(std::stoll(full.substr(i + 2, end - i - 2)) + 1);
      i = end - 1;
      continue;
    }
    const char c = full[i];
    // "()" marks a function; a lambda's parameters are dropped with it ("lambda#1").
    if (c == '(' && depth++ == 0 && !ends_with(out, "lambda")) out += "()";
    if (c == ')') --depth;
    if (depth == 0 && c != ')' && c != '{' && c != '}') out += c;
  }
  return out;
}

bool dump_enabled() {
  return state().on.load(std::memory_order_relaxed);
}

std::string dump_dir() {
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.on.load(std::memory_order_relaxed) ? s.dir : "";
}

void set_dump_dir(const std::string& dir) {
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.dir = dir;
  s.made_dirs = false;
  s.on.store(!dir.empty(), std::memory_order_relaxed);
}

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void dump_graph(const Graph& g, const char* pass) {
  if (!dump_enabled()) return;
  const std::string dir = ready_dir();
  if (dir.empty()) return;
  const std::string path = next_path(dir, g, pass);
  GraphText t = graph_text(g, pass, g.dump_info().steps - 1, {});
  t.head += kTail;
  write_file(path, t.head);
}

std::unique_ptr<FusedGraphDump> FusedGraphDump::create(const Graph& g,
                                                       const std::vector<DumpGroup>& groups) {
  if (!dump_enabled()) return nullptr;
  const std::string dir = ready_dir();
  if (dir.empty()) return nullptr;
  std::unique_ptr<FusedGraphDump> d(new FusedGraphDump());
  d->path_ = next_path(dir, g, "fuse");
  GraphText t = graph_text(g, "fuse", g.dump_info().steps - 1, groups);
  d->head_ = std::move(t.head);
  d->group_heads_ = std::move(t.group_heads);
  d->kernels_.resize(d->group_heads_.size());
  std::lock_guard<std::mutex> lock(d->mu_);
  d->write();
  return d;
}

void FusedGraphDump::add_kernel(size_t group, const std::string& kernel) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string>& names = kernels_.at(group);
  for (const std::string& n : names)
    if (n == kernel) return;
  names.push_back(kernel);
  write();
}

// (Under mu_.)
void FusedGraphDump::write() {
  std::string text = head_;
  for (size_t k = 0; k < group_heads_.size(); ++k) {
    text += group_heads_[k];
    for (size_t i = 0; i < kernels_[k].size(); ++i) {
      if (i) text += ',';
      append_json_string(text, kernels_[k][i]);
    }
    text += "]}";
  }
  text += kTail;
  write_file(path_, text);
}

void dump_kernel_file(const std::string& name, const char* suffix, const std::string& text) {
  if (!dump_enabled()) return;
  const std::string dir = ready_dir();
  if (dir.empty()) return;
  write_file(dir + "/kernels/" + name + suffix, text);
}

}  // namespace kiln::jit
