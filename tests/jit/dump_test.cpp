// KILN_DUMP: an LSTM cell's graph after every pass and after fusion, read back as JSON (schema,
// numbering, edges, groups against the plan's kernels) with each kernel's IR and assembly; string
// and number escaping; and the environment variable in a child process.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "jit/dump.h"
#include "jit/passes/passes.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/jit/graph_names.h"
#include "tests/testing.h"
#if KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_kernel.h"
#include "fuser/fuse.h"
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A JSON value, parsed by a small recursive-descent parser (the documents here nest 4 deep).
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  bool is_null() const { return kind == kNull; }
  const Json& operator[](const std::string& k) const {
    static const Json null;
    auto it = fields.find(k);
    return it == fields.end() ? null : it->second;
  }
  bool has(const std::string& k) const { return fields.count(k) > 0; }
  int64_t integer() const { return static_cast<int64_t>(num); }
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Json document() {
    Json v = value();
    ws();
    if (i_ != s_.size()) error("trailing text");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  void expect(char c) {
    ws();
    if (i_ >= s_.size() || s_[i_] != c) error(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) error("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          const unsigned code = static_cast<unsigned>(std::stoul(s_.substr(i_, 4), nullptr, 16));
          if (code >= 0x80) error("\\u escape above ASCII (not written by the dump)");
          out += static_cast<char>(code);
          i_ += 4;
          break;
        }
        default:
          error("bad escape");
      }
    }
  }
  Json value() {
    ws();
    if (i_ >= s_.size()) error("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::kObject;
      ++i_;
      ws();
      if (s_[i_] == '}') {
        ++i_;
        return v;
      }
      while (true) {
        std::string k = string();
        expect(':');
        if (v.fields.count(k)) error("duplicate key " + k);
        v.fields[k] = value();
        ws();
        if (s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::kArray;
      ++i_;
      ws();
      if (s_[i_] == ']') {
        ++i_;
        return v;
      }
      while (true) {
        v.items.push_back(value());
        ws();
        if (s_[i_] == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::kString;
      v.str = string();
      return v;
    }
    for (const char* word : {"null", "true", "false"}) {
      const std::string w = word;
      if (s_.compare(i_, w.size(), w) == 0) {
        i_ += w.size();
        v.kind = w == "null" ? Json::kNull : Json::kBool;
        v.b = w == "true";
        return v;
      }
    }
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    v.num = std::strtod(begin, &end);
    if (end == begin) error("bad value");
    v.kind = Json::kNumber;
    i_ += static_cast<size_t>(end - begin);
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Json parse_file(const fs::path& p) {
  const std::string text = read_file(p);
  try {
    return Parser(text).document();
  } catch (const std::exception& e) {
    ADD_FAILURE() << p << ": " << e.what();
    return Json();
  }
}

// The dump's graph files in name order (which is the order they were first written).
std::vector<fs::path> graph_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}

// Every node input, graph input and output names a value some node defines; node ids are their
// places; each node's "group" matches the groups' member lists. Returns the number of nodes.
void expect_consistent(const Json& doc, const std::string& what) {
  const std::vector<Json>& nodes = doc["nodes"].items;
  std::set<int64_t> values;
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(nodes[i]["id"].integer(), static_cast<int64_t>(i)) << what;
    EXPECT_EQ(nodes[i]["op"].kind, Json::kString) << what;
    EXPECT_EQ(nodes[i]["attrs"].kind, Json::kObject) << what;
    // Views, and only they, say so (kiln-viz hides them outside groups in its overview).
    const std::string& op = nodes[i]["op"].str;
    const bool view = op == "view" || op == "reshape" || op == "transpose" || op == "permute" ||
                      op == "select" || op == "slice" || op == "expand" || op == "unsqueeze" ||
                      op == "squeeze" || op == "as_strided";
    EXPECT_EQ(nodes[i].has("view"), view) << what << ": " << op;
    if (view) {
      EXPECT_TRUE(nodes[i]["view"].b) << what;
    }
    for (const Json& out : nodes[i]["outputs"].items) {
      EXPECT_TRUE(values.insert(out["id"].integer()).second) << what << ": value defined twice";
      EXPECT_EQ(out["dtype"].kind, Json::kString) << what;
      EXPECT_EQ(out["sizes"].kind, Json::kArray) << what;
      EXPECT_EQ(out["device"].str, "cpu") << what;
    }
  }
  // Inputs are defined earlier (the list is in topological order).
  std::set<int64_t> defined;
  for (const Json& n : nodes) {
    for (const Json& in : n["inputs"].items) {
      if (in.is_null()) continue;
      EXPECT_TRUE(defined.count(in.integer()))
          << what << ": node " << n["id"].integer() << " reads %" << in.integer()
          << ", which no earlier node defines";
    }
    for (const Json& out : n["outputs"].items) defined.insert(out["id"].integer());
  }
  for (const char* list : {"inputs", "outputs"})
    for (const Json& v : doc[list].items)
      EXPECT_TRUE(values.count(v.integer())) << what << ": graph " << list << " %" << v.integer();
  std::map<int64_t, int64_t> group_of;
  for (const Json& g : doc["groups"].items) {
    EXPECT_GE(g["members"].items.size(), 2u) << what;
    for (const Json& m : g["members"].items) {
      ASSERT_LT(m.integer(), static_cast<int64_t>(nodes.size())) << what;
      EXPECT_TRUE(group_of.emplace(m.integer(), g["id"].integer()).second) << what;
    }
    for (const char* list : {"inputs", "outputs"})
      for (const Json& v : g[list].items) EXPECT_TRUE(values.count(v.integer())) << what;
    // The joins are cats or stacks whose values end the group's outputs, in order.
    ASSERT_EQ(g["joins"].kind, Json::kArray) << what;
    const std::vector<Json>& joins = g["joins"].items;
    const std::vector<Json>& outs = g["outputs"].items;
    ASSERT_LE(joins.size(), outs.size()) << what;
    for (size_t j = 0; j < joins.size(); ++j) {
      ASSERT_LT(joins[j].integer(), static_cast<int64_t>(nodes.size())) << what;
      const Json& join = nodes[static_cast<size_t>(joins[j].integer())];
      EXPECT_TRUE(join["op"].str == "cat" || join["op"].str == "stack") << what;
      EXPECT_EQ(outs[outs.size() - joins.size() + j].integer(),
                join["outputs"].items.at(0)["id"].integer())
          << what;
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto it = group_of.find(static_cast<int64_t>(i));
    if (it == group_of.end())
      EXPECT_TRUE(nodes[i]["group"].is_null()) << what << ": node " << i;
    else
      EXPECT_EQ(nodes[i]["group"].integer(), it->second) << what << ": node " << i;
  }
}

// An LSTM cell with its bias, recorded lazily: its gates' GEMMs, chunk and activations.
std::vector<Tensor> lstm_cell(const std::vector<Tensor>& in) {
  std::vector<Tensor> g = (in[0].mm(in[2]) + in[1].mm(in[3]) + in[5]).chunk(4, 1);
  Tensor i = sigmoid(g[0]), f = sigmoid(g[1]), cell = tanh(g[2]), o = sigmoid(g[3]);
  Tensor c2 = f * in[4] + i * cell;
  return {o * tanh(c2), c2};
}

TEST(Dump, LstmCellGraphAfterEveryPassFusionGroupsAndKernels) {
  const fs::path dir = fresh_dir("kiln_dump_lstm");
  jit::set_dump_dir(dir.string());
  ASSERT_TRUE(jit::dump_enabled());
  const int64_t batch = 5, input = 7, hidden = 6;
  std::vector<Tensor> in = {
      testing::input({batch, input}),      testing::input({batch, hidden}),
      testing::input({input, 4 * hidden}), testing::input({hidden, 4 * hidden}),
      testing::input({batch, hidden}),     testing::input({4 * hidden})};
  std::unique_ptr<jit::Graph> graph;
  jit::LazyGraphBinding binding;
  {
    LazyGuard lazy(true);
    std::vector<Tensor> outs = lstm_cell(in);
    std::vector<detail::LazyRef> requests;
    for (const Tensor& t : outs) requests.push_back(t.impl()->storage->lazy);
    graph = jit::build_graph(requests, &binding, false);
  }
  const size_t recorded = graph->size();
  jit::run_passes(*graph);
  jit::Plan plan(*graph);
  plan.run(binding.inputs);
  jit::set_dump_dir("");
  EXPECT_FALSE(jit::dump_enabled());

  // One file per pass run, between the graph as built and the fused plan's.
  std::vector<std::string> passes = {"input"};
  for (const jit::PassInfo& p : jit::all_passes())
    if (!jit::pass_disabled(p.name)) passes.emplace_back(p.name);
  passes.emplace_back("fuse");
  const std::vector<fs::path> files = graph_files(dir);
  ASSERT_EQ(files.size(), passes.size());
  const std::regex name_re(R"((\d{6})_g(\d{4})_(\d{2})_([a-z_]+)\.json)");
  int64_t graph_id = -1;
  Json fused;
  for (size_t k = 0; k < files.size(); ++k) {
    const std::string name = files[k].filename().string();
    std::smatch m;
    ASSERT_TRUE(std::regex_match(name, m, name_re)) << name;
    EXPECT_EQ(std::stoi(m[3]), static_cast<int>(k)) << name;
    EXPECT_EQ(m[4], passes[k]) << name;
    const Json doc = parse_file(files[k]);
    EXPECT_EQ(doc["schema"].str, "kiln.graph") << name;
    EXPECT_EQ(doc["version"].integer(), jit::kDumpSchemaVersion) << name;
    EXPECT_EQ(doc["version"].integer(), 2) << name;
    EXPECT_EQ(doc["pass"].str, passes[k]) << name;
    EXPECT_EQ(doc["step"].integer(), static_cast<int64_t>(k)) << name;
    EXPECT_EQ(std::stoll(m[2]), doc["graph"].integer()) << name;
    if (k == 0) graph_id = doc["graph"].integer();
    EXPECT_EQ(doc["graph"].integer(), graph_id) << name;
    expect_consistent(doc, name);
    if (k == 0) {
      EXPECT_EQ(doc["nodes"].items.size(), recorded) << name;
    }
    if (k + 1 < files.size()) {
      EXPECT_TRUE(doc["groups"].items.empty()) << name;
    }
    if (k + 1 == files.size()) fused = doc;
  }

  // The fused graph: the graph's nodes, and one group per kernel the plan runs, each naming the
  // kernel it compiled, whose IR and assembly are in kernels/.
  EXPECT_EQ(fused["nodes"].items.size(), graph->size());
  EXPECT_EQ(fused["outputs"].items.size(), graph->outputs().size());
  ASSERT_EQ(fused["groups"].items.size(), plan.num_kernel_steps()) << graph->str();
  ASSERT_GE(plan.num_kernel_steps(), 1u);
  size_t grouped = 0;
  for (const Json& n : fused["nodes"].items) grouped += !n["group"].is_null();
  size_t members = 0;
  for (const Json& g : fused["groups"].items) {
    members += g["members"].items.size();
    EXPECT_FALSE(g["ops"].str.empty());
    ASSERT_EQ(g["kernels"].items.size(), 1u) << "one layout, one kernel";
    const std::string kernel = g["kernels"].items[0].str;
    EXPECT_EQ(kernel.rfind("kiln_" + g["ops"].str + "_", 0), 0u) << kernel;
    const std::string ir = read_file(dir / "kernels" / (kernel + ".ll"));
    const std::string assembly = read_file(dir / "kernels" / (kernel + ".s"));
    EXPECT_NE(ir.find("define void @" + kernel + "("), std::string::npos) << ir;
    EXPECT_NE(ir.find("; program:"), std::string::npos) << ir;
    EXPECT_NE(assembly.find(kernel + ":"), std::string::npos) << assembly;
  }
  EXPECT_EQ(grouped, members);
  EXPECT_EQ(grouped, plan.num_nodes() - (plan.num_steps() - plan.num_kernel_steps()));
  fs::remove_all(dir);
}

// A group that writes two cats (a GRU cell's backward: the two gate-gradient cats share pieces)
// names both, in the order of their values at the end of its outputs.
TEST(Dump, AGroupWritingTwoCatsNamesBoth) {
  const fs::path dir = fresh_dir("kiln_dump_two_joins");
  jit::set_dump_dir(dir.string());
  std::vector<Tensor> in;
  for (int k = 0; k < 4; ++k) in.push_back(testing::input({3, 5}));
  std::unique_ptr<jit::Graph> graph;
  jit::LazyGraphBinding binding;
  {
    LazyGuard lazy(true);
    Tensor r = sigmoid(in[0]), z = sigmoid(in[1]), dn = in[2] * (1.0 - in[3] * in[3]);
    Tensor dr = dn * in[3] * r * (1.0 - r), dz = in[2] * z * (1.0 - z);
    Tensor gi = cat({dr, dz, dn}, 1), gh = cat({dr, dz, r * dn}, 1);
    std::vector<detail::LazyRef> requests;
    for (const Tensor& t : {gi, gh}) requests.push_back(t.impl()->storage->lazy);
    graph = jit::build_graph(requests, &binding, false);
  }
  jit::run_passes(*graph);
  jit::Plan plan(*graph);
  plan.run(binding.inputs);
  jit::set_dump_dir("");
  ASSERT_EQ(plan.num_join_kernel_steps(), 1u) << graph->str();
  const std::vector<fs::path> files = graph_files(dir);
  ASSERT_FALSE(files.empty());
  const Json fused = parse_file(files.back());
  EXPECT_EQ(fused["pass"].str, "fuse");
  expect_consistent(fused, "fused");
  ASSERT_EQ(fused["groups"].items.size(), 1u);
  const std::vector<Json>& joins = fused["groups"].items[0]["joins"].items;
  ASSERT_EQ(joins.size(), 2u);
  for (const Json& j : joins)
    EXPECT_EQ(fused["nodes"].items.at(static_cast<size_t>(j.integer()))["op"].str, "cat");
  fs::remove_all(dir);
}

TEST(Dump, StringsAndNumbersAreEscaped) {
  const fs::path dir = fresh_dir("kiln_dump_escape");
  jit::set_dump_dir(dir.string());
  jit::Graph g;
  jit::Value* x = g.add_input(jit::ValueType{kFloat32, {2, 3}});
  const std::string weird = std::string("quote \" backslash \\ newline \n tab \t cr \r bell ") +
                            '\x07' + " del \x7f utf-8 \xc3\xa9 </script>";
  jit::Node* n =
      g.create("neg", {x},
               {weird, std::numeric_limits<double>::quiet_NaN(),
                std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                0.1, int64_t{-5}, std::vector<int64_t>{1, -2}, kFloat64, std::monostate{}, true},
               {x->type()});
  g.add_output(n->output());
  jit::dump_graph(g, "input");
  jit::set_dump_dir("");
  const std::vector<fs::path> files = graph_files(dir);
  ASSERT_EQ(files.size(), 1u);
  const std::string text = read_file(files[0]);
  for (char c : text)
    EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << "raw control character";
  const Json doc = parse_file(files[0]);
  ASSERT_EQ(doc["nodes"].items.size(), 2u);
  const Json& attrs = doc["nodes"].items[1]["attrs"];
  EXPECT_EQ(attrs["a0"].str, weird);
  EXPECT_EQ(attrs["a1"].str, "nan");
  EXPECT_EQ(attrs["a2"].str, "inf");
  EXPECT_EQ(attrs["a3"].str, "-inf");
  EXPECT_EQ(attrs["a4"].num, 0.1);
  EXPECT_EQ(attrs["a5"].num, -5);
  ASSERT_EQ(attrs["a6"].items.size(), 2u);
  EXPECT_EQ(attrs["a6"].items[1].num, -2);
  EXPECT_EQ(attrs["a7"].str, "float64");
  EXPECT_TRUE(attrs["a8"].is_null() && attrs.has("a8"));
  EXPECT_TRUE(attrs["a9"].b);
  EXPECT_EQ(doc["nodes"].items[1]["outputs"].items[0]["dtype"].str, "float32");
  fs::remove_all(dir);
}

TEST(Dump, OffWritesNothing) {
  jit::set_dump_dir("");
  EXPECT_FALSE(jit::dump_enabled());
  EXPECT_EQ(jit::dump_dir(), "");
  jit::Graph g;
  jit::Value* x = g.add_input(jit::ValueType{kFloat32, {4}});
  jit::Node* n = g.create("tanh", {x}, {}, {x->type()});
  g.add_output(g.create("exp", {n->output()}, {}, {x->type()})->output());
  EXPECT_EQ(jit::FusedGraphDump::create(g, {}), nullptr);
  jit::run_passes(g);
  EXPECT_EQ(g.dump_info().id, -1);  // never numbered: no file was written
}

struct StepFunctor {
  std::vector<Tensor> operator()(const std::vector<Tensor>& in) const { return in; }
};
std::vector<Tensor> step_function(const std::vector<Tensor>& in) {
  return in;
}

TEST(Dump, CallableNamesAreShort) {
  auto lambda = [](const std::vector<Tensor>& in) { return in; };
  // The lambda's number is GCC's count in its function, clang's in its file.
  EXPECT_TRUE(std::regex_match(
      jit::callable_name(jit::TracedFn(lambda).target_type()),
      std::regex(R"(kiln::Dump_CallableNamesAreShort_Test::TestBody\(\)::lambda#[0-9]+)")))
      << jit::callable_name(jit::TracedFn(lambda).target_type());
  EXPECT_EQ(jit::callable_name(jit::TracedFn(StepFunctor()).target_type()), "kiln::StepFunctor");
  EXPECT_EQ(jit::callable_name(jit::TracedFn(&step_function).target_type()), "a function");
}

// Each graph's files say what it is: a lazy flush and its cause, a traced function's part.
TEST(Dump, GraphsAreNamedByWhatTheyAre) {
  const fs::path dir = fresh_dir("kiln_dump_names");
  jit::set_dump_dir(dir.string());
  const Tensor x = testing::input({6, 5});
  Tensor w = testing::input({6, 5}).requires_grad_(true);
  {
    LazyGuard lazy(true);
    (tanh(x * 3.0) + x).sum().item();
  }
  jit::Function f = jit::trace(
      [&w](const std::vector<Tensor>& in) { return std::vector<Tensor>{(exp(in[0] * w)).sum()}; },
      {x});
  jit::set_dump_dir("");
  std::map<int64_t, std::set<std::string>> names;  // per graph: the names of its files
  for (const fs::path& file : graph_files(dir)) {
    const Json doc = parse_file(file);
    names[doc["graph"].integer()].insert(doc["name"].str);
  }
  std::set<std::string> all;
  for (const auto& [graph, n] : names) {
    EXPECT_EQ(n.size(), 1u) << "graph " << graph << " has files of different names";
    all.insert(*n.begin());
  }
  const std::string lambda =
      R"(trace kiln::Dump_GraphsAreNamedByWhatTheyAre_Test::TestBody\(\)::lambda#[0-9]+: )";
  bool flush = false;
  for (const std::string& n : all)
    flush |= n.rfind("lazy flush #", 0) == 0 && n.find("item()") != std::string::npos;
  EXPECT_TRUE(flush) << ::testing::PrintToString(all);
  EXPECT_EQ(testing::count_matching(all, lambda + "forward"), 1u) << ::testing::PrintToString(all);
  EXPECT_EQ(testing::count_matching(all, lambda + "backward"), 1u) << ::testing::PrintToString(all);
  fs::remove_all(dir);
}

// What the child process runs with KILN_DUMP set: a lazy LSTM cell through the public API.
TEST(DumpChild, LazyLstmCell) {
  manual_seed(3);
  nn::LSTMCell cell(9, 11);
  NoGradGuard no_grad;
  Tensor x = randn({4, 9}), h = randn({4, 11}), c = randn({4, 11});
  nn::LSTMState s = cell.forward(x, nn::LSTMState{h, c});
  eval(s.h, s.c);
}

void run_child(const fs::path& dir) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  const std::string cmd = "KILN_DUMP='" + dir.string() + "' '" + self +
                          "' --gtest_filter=DumpChild.LazyLstmCell >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Each kernel a fused graph of the dump names, with its IR and assembly beside it.
std::set<std::string> dumped_kernels(const fs::path& dir) {
  std::set<std::string> kernels;
  for (const fs::path& f : graph_files(dir)) {
    const Json doc = parse_file(f);
    EXPECT_EQ(doc["schema"].str, "kiln.graph") << f;
    expect_consistent(doc, f.string());
    for (const Json& g : doc["groups"].items)
      for (const Json& k : g["kernels"].items) {
        kernels.insert(k.str);
        EXPECT_TRUE(fs::exists(dir / "kernels" / (k.str + ".ll"))) << k.str;
        EXPECT_TRUE(fs::exists(dir / "kernels" / (k.str + ".s"))) << k.str;
      }
  }
  return kernels;
}

TEST(Dump, EnvironmentVariableDumpsEveryKernelEvenFromTheDiskCache) {
  // The second run finds its kernels in the disk cache (KILN_CACHE_DIR) and compiles them anyway
  // to dump them.
  const fs::path first = fresh_dir("kiln_dump_env_1"), second = fresh_dir("kiln_dump_env_2");
  run_child(first);
  run_child(second);
  const std::set<std::string> a = dumped_kernels(first), b = dumped_kernels(second);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  fs::remove_all(first);
  fs::remove_all(second);
}

#if KILN_HAS_CUDA
std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `negations` neg then tanh over [1024] float32: one flat CUDA kernel with a 4-wide variant.
struct NegationsKernel {
  explicit NegationsKernel(int negations) {
    jit::Graph g;
    const jit::ValueType type{kFloat32, {1024}};
    jit::Value* v = g.add_input(type);
    for (int k = 0; k < negations; ++k) v = g.create("neg", {v}, {}, {type})->output();
    g.add_output(g.create("tanh", {v}, {}, {type})->output());
    group = fuser::find_groups(g).at(0);
    layout.single_element.assign(group.kernel.input_types.size(), false);
    symbol = fuser::kernel_symbol(fuser::kernel_key(group.kernel, layout), group.kernel);
  }
  // Whether the disk cache had its 4-wide 32-bit binary for sm_90.
  bool compile_was_from_disk() const {
    bool from_disk = true;
    fuser::cuda::cuda_binary(group.kernel, layout, vec, 90, &from_disk);
    return from_disk;
  }
  fuser::FusionGroup group;
  fuser::Layout layout;
  std::string symbol;
  const fuser::cuda::CudaCallFlags vec{true, true};
};

// A CUDA kernel (no GPU needed: NVRTC runs on the host) is dumped as its source, its PTX and
// NVRTC's log with ptxas's report of registers, named by its symbol and variant; while dumping, a
// kernel the disk cache holds is compiled again, so that a second process's dump is complete.
TEST(Dump, CudaKernelsAsSourcePtxAndRegisterReport) {
  // Compiled here, or by an earlier run (the disk cache outlives runs, and a machine that ran
  // the suite often holds all 97 structures): on disk either way, which is what the child needs.
  const int negations = 1 + static_cast<int>(getpid() % 97);
  const NegationsKernel k(negations);
  k.compile_was_from_disk();
  const fs::path dir = fresh_dir("kiln_dump_cuda");
  const testing::ChildRun child = testing::run_this_binary(
      "KILN_DUMP='" + dir.string() + "' KILN_DUMP_CUDA_NEGATIONS=" + std::to_string(negations),
      "--gtest_also_run_disabled_tests --gtest_filter=DumpChild.DISABLED_CudaKernel");
  EXPECT_EQ(child.status, 0) << child.output;
  const std::string base = (dir / "kernels" / (k.symbol + ".i32.vec4")).string();
  EXPECT_EQ(read_text(base + ".cu"),
            fuser::cuda::cuda_source(k.group.kernel, k.layout, k.symbol, k.vec));
  const std::string ptx = read_text(base + ".ptx");
  EXPECT_NE(ptx.find(".entry " + k.symbol), std::string::npos) << ptx;
  EXPECT_NE(ptx.find(".target sm_90"), std::string::npos) << ptx;
  const std::string log = read_text(base + ".nvrtc.log");
  EXPECT_NE(log.find("Used "), std::string::npos) << log;
  EXPECT_NE(log.find(" registers"), std::string::npos) << log;
  fs::remove_all(dir);
}

// The child of CudaKernelsAsSourcePtxAndRegisterReport (disabled: only that test runs it): the
// same kernel, on disk, compiled again.
TEST(DumpChild, DISABLED_CudaKernel) {
  const char* negations = std::getenv("KILN_DUMP_CUDA_NEGATIONS");
  ASSERT_NE(negations, nullptr);
  EXPECT_FALSE(NegationsKernel(std::atoi(negations)).compile_was_from_disk())
      << "a kernel on disk is compiled again while dumping";
}
#endif

}  // namespace
}  // namespace kiln
