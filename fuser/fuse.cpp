// The forward fuser: finds groups of elementwise nodes and builds each group's kernel from its
// ops' formulas.
#include "fuser/fuse.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/executor.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using jit::Node;
using jit::Value;

std::optional<DType> elementwise_compute_type(const Node& n, std::vector<bool>& convert) {
  const detail::OpDef& op = n.op();
  if (!op.map_into || (op.kind != detail::OpKind::Unary && op.kind != detail::OpKind::Binary))
    return std::nullopt;
  if (n.num_outputs() != 1 || n.output()->type().device != kCPU) return std::nullopt;
  DType compute;
  switch (op.dtype_rule) {
    case detail::DTypeRule::Same:
    case detail::DTypeRule::Float:
      compute = n.output()->type().dtype;
      break;
    case detail::DTypeRule::Logical:
      compute = kBool;
      break;
    case detail::DTypeRule::Custom:
      // A conversion (to): it reads its operand as it is.
      if (!n.input(0)) return std::nullopt;
      compute = n.input(0)->type().dtype;
      break;
    case detail::DTypeRule::Predicate:
      // Promotion between differing operands is left to the op's entry point.
      if (!n.input(0)) return std::nullopt;
      compute = n.input(0)->type().dtype;
      break;
    default:
      return std::nullopt;
  }
  convert.assign(n.num_inputs(), false);
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* in = n.input(i);
    if (!in || in->type().device != kCPU) return std::nullopt;
    if (in->type().dtype == compute) continue;
    if (!in->node()->is_constant() || op.dtype_rule == detail::DTypeRule::Predicate ||
        op.dtype_rule == detail::DTypeRule::Custom)
      return std::nullopt;
    convert[i] = true;
  }
  return compute;
}

bool is_fusible(const Node& n) {
  std::vector<bool> convert;
  return n.op().formula && elementwise_compute_type(n, convert).has_value();
}

namespace {
std::atomic<int> g_fusion{-1};  // -1: not read from KILN_FUSE yet
}  // namespace

bool fusion_enabled() {
  int v = g_fusion.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("KILN_FUSE");
    v = env && std::string(env) == "0" ? 0 : 1;
    g_fusion.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

bool set_fusion_enabled(bool on) {
  const bool was = fusion_enabled();
  g_fusion.store(on ? 1 : 0, std::memory_order_relaxed);
  return was;
}

const char* prim_name(Prim p) {
  static const char* const names[] = {
      "load", "scalar", "literal", "cast", "neg", "add", "sub",  "mul",   "div",    "lt",
      "le",   "gt",     "ge",      "eq",   "ne",  "and", "or",   "not",   "select", "exp",
      "log",  "log1p",  "expm1",   "sqrt", "sin", "cos", "tanh", "floor", "ceil",   "round"};
  return names[static_cast<int>(p)];
}

std::string Kernel::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < body.size(); ++i) {
    const Instr& in = body[i];
    os << "%" << i << " : " << dtype_name(in.type) << " = " << prim_name(in.prim);
    if (in.prim == Prim::Load || in.prim == Prim::Scalar) os << " " << in.index;
    if (in.prim == Prim::Literal) os << " " << in.literal;
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0) os << " %" << o;
    os << "\n";
  }
  os << "outputs:";
  for (int32_t o : outputs) os << " %" << o;
  return os.str();
}

std::string kernel_key(const Kernel& k, const Layout& layout) {
  std::string key;
  auto put = [&key](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  auto put_i = [&put](int64_t v) { put(&v, sizeof v); };
  // The ops' names too: they are part of the kernel's symbol.
  put_i(static_cast<int64_t>(k.ops.size()));
  key += k.ops;
  put_i(static_cast<int64_t>(k.input_types.size()));
  for (DType t : k.input_types) put_i(static_cast<int64_t>(t));
  put_i(static_cast<int64_t>(k.scalar_types.size()));
  for (DType t : k.scalar_types) put_i(static_cast<int64_t>(t));
  put_i(static_cast<int64_t>(k.body.size()));
  for (const Instr& in : k.body) {
    put_i(static_cast<int64_t>(in.prim));
    put_i(static_cast<int64_t>(in.type));
    put_i(in.a);
    put_i(in.b);
    put_i(in.c);
    put_i(in.index);
    put(&in.literal, sizeof in.literal);
  }
  put_i(static_cast<int64_t>(k.outputs.size()));
  for (int32_t o : k.outputs) put_i(o);
  put_i(layout.flat);
  put_i(layout.rank);
  for (bool s : layout.single_element) put_i(s);
  return key;
}

namespace {

// Parses an op-table formula into instructions, with x, y and a0 bound to instructions and
// numbers typed `type`. Formulas are a few tokens long: the parser recurses over the formula's
// text, never over a graph.
class FormulaParser {
 public:
  FormulaParser(Kernel& k, const std::string& text, DType type, DType out_type,
                const int32_t* operands, size_t num_operands, int32_t attr)
      : k_(k),
        text_(text),
        type_(type),
        out_type_(out_type),
        operands_(operands),
        num_operands_(num_operands),
        attr_(attr) {}

  int32_t parse() {
    int32_t r = expr();
    skip_space();
    check(pos_ == text_.size(), "trailing text");
    return r;
  }

 private:
  void check(bool ok, const char* what) {
    KILN_CHECK(ok, "fuser: bad formula '", text_, "' (", what, " at ", pos_, ")");
  }
  void skip_space() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  std::string token() {
    skip_space();
    size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != ' ' && text_[pos_] != '(' && text_[pos_] != ')')
      ++pos_;
    check(pos_ > start, "expected a name or number");
    return text_.substr(start, pos_ - start);
  }
  int32_t expr() {
    skip_space();
    check(pos_ < text_.size(), "unexpected end");
    if (text_[pos_] != '(') return atom(token());
    ++pos_;
    const std::string name = token();
    std::vector<int32_t> args;
    for (;;) {
      skip_space();
      check(pos_ < text_.size(), "unclosed '('");
      if (text_[pos_] == ')') break;
      args.push_back(expr());
    }
    ++pos_;
    return apply(name, args);
  }
  int32_t atom(const std::string& t) {
    if (t == "x" || t == "y") {
      size_t i = t == "x" ? 0 : 1;
      check(i < num_operands_, "operand missing");
      return operands_[i];
    }
    if (t == "a0") {
      check(attr_ >= 0, "no attribute");
      return attr_;
    }
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    check(end && *end == '\0', "unknown name");
    Instr in{Prim::Literal, type_};
    in.literal = v;
    return k_.add(in);
  }
  int32_t apply(const std::string& name, const std::vector<int32_t>& args) {
    struct Entry {
      const char* name;
      Prim prim;
      int arity;
      bool to_bool;  // the result is bool (comparisons and logic)
    };
    static const Entry entries[] = {
        {"neg", Prim::Neg, 1, false},       {"add", Prim::Add, 2, false},
        {"sub", Prim::Sub, 2, false},       {"mul", Prim::Mul, 2, false},
        {"div", Prim::Div, 2, false},       {"lt", Prim::Lt, 2, true},
        {"le", Prim::Le, 2, true},          {"gt", Prim::Gt, 2, true},
        {"ge", Prim::Ge, 2, true},          {"eq", Prim::Eq, 2, true},
        {"ne", Prim::Ne, 2, true},          {"and", Prim::And, 2, true},
        {"or", Prim::Or, 2, true},          {"not", Prim::Not, 1, true},
        {"select", Prim::Select, 3, false}, {"exp", Prim::Exp, 1, false},
        {"log", Prim::Log, 1, false},       {"log1p", Prim::Log1p, 1, false},
        {"expm1", Prim::Expm1, 1, false},   {"sqrt", Prim::Sqrt, 1, false},
        {"sin", Prim::Sin, 1, false},       {"cos", Prim::Cos, 1, false},
        {"tanh", Prim::Tanh, 1, false},     {"floor", Prim::Floor, 1, false},
        {"ceil", Prim::Ceil, 1, false},     {"round", Prim::Round, 1, false},
        {"cast", Prim::Cast, 1, false},
    };
    for (const Entry& e : entries) {
      if (name != e.name) continue;
      check(static_cast<int>(args.size()) == e.arity, "wrong number of operands");
      Instr in{e.prim, e.to_bool ? kBool : type_};
      if (e.prim == Prim::Select) in.type = k_.body[static_cast<size_t>(args[1])].type;
      if (e.prim == Prim::Cast) in.type = out_type_;
      in.a = args[0];
      if (e.arity > 1) in.b = args[1];
      if (e.arity > 2) in.c = args[2];
      return k_.add(in);
    }
    check(false, "unknown primitive");
    return -1;
  }

  Kernel& k_;
  const std::string& text_;
  DType type_;
  DType out_type_;  // the node's output type: what "cast" converts to
  const int32_t* operands_;
  size_t num_operands_;
  int32_t attr_;
  size_t pos_ = 0;
};

uint64_t value_bits(const Tensor& t) {
  uint64_t bits = 0;
  std::memcpy(&bits, t.impl()->data(), element_size(t.dtype()));
  return bits;
}

// Builds the group's kernel: loads for its inputs, scalars for its constants and attributes, and
// each member's formula in graph order.
void build_kernel(FusionGroup& g, const absl::flat_hash_set<const Node*>& members) {
  Kernel& k = g.kernel;
  absl::flat_hash_map<const Value*, int32_t> value_instr;   // members' results and loads
  absl::flat_hash_map<const Value*, int32_t> scalar_instr;  // constants, as read
  std::vector<bool> convert;
  auto cast = [&k](int32_t v, DType to) {
    if (k.body[static_cast<size_t>(v)].type == to) return v;
    Instr c{Prim::Cast, to};
    c.a = v;
    return k.add(c);
  };
  auto scalar = [&](DType type, uint64_t bits) {
    Instr s{Prim::Scalar, type};
    s.index = static_cast<int32_t>(k.scalar_types.size());
    k.scalar_types.push_back(type);
    g.scalars.push_back(bits);
    return k.add(s);
  };
  for (const Node* n : g.nodes) {
    const DType compute = *elementwise_compute_type(*n, convert);
    std::vector<int32_t> operands;
    for (const Value* in : n->inputs()) {
      int32_t v;
      if (auto it = value_instr.find(in); it != value_instr.end()) {
        v = it->second;
      } else if (in->node()->is_constant()) {
        auto s = scalar_instr.find(in);
        if (s == scalar_instr.end()) {
          const Tensor c = jit::constant_value(*in->node());
          s = scalar_instr.emplace(in, scalar(c.dtype(), value_bits(c))).first;
        }
        v = s->second;
      } else {
        Instr load{Prim::Load, in->type().dtype};
        load.index = static_cast<int32_t>(g.inputs.size());
        g.inputs.push_back(in);
        k.input_types.push_back(in->type().dtype);
        v = k.add(load);
        value_instr[in] = v;
      }
      operands.push_back(cast(v, compute));
    }
    int32_t attr = -1;
    if (!n->attrs().empty() && std::string(n->op().formula).find("a0") != std::string::npos) {
      // The op's attribute (add's alpha) as the formula's a0: passed per call, as eager mode
      // converts it (double for floating compute types, int64 otherwise).
      const Scalar a = detail::attr_scalar(n->attr(0));
      uint64_t bits;
      DType type;
      if (is_floating_point(compute)) {
        double d = a.to_double();
        std::memcpy(&bits, &d, sizeof d);
        type = kFloat64;
      } else {
        int64_t i = a.to_int();
        std::memcpy(&bits, &i, sizeof i);
        type = kInt64;
      }
      attr = cast(scalar(type, bits), compute);
    }
    const int32_t result = FormulaParser(k, n->op().formula, compute, n->output()->type().dtype,
                                         operands.data(), operands.size(), attr)
                               .parse();
    KILN_CHECK(k.body[static_cast<size_t>(result)].type == n->output()->type().dtype,
               "fuser: the formula of ", n->op().name, " gives ",
               dtype_name(k.body[static_cast<size_t>(result)].type), ", the node is ",
               dtype_name(n->output()->type().dtype));
    value_instr[n->output()] = result;
    if (!k.ops.empty()) k.ops += "_";
    if (k.ops.size() < 48) k.ops += n->op().name;
  }
  // Outputs: members whose value is read outside the group or returned.
  for (const Node* n : g.nodes) {
    const Value* v = n->output();
    bool outside = n->owning_graph()->is_output(v);
    for (const jit::Use& u : v->uses()) outside |= !members.contains(u.user);
    if (!outside) continue;
    g.outputs.push_back(v);
    k.outputs.push_back(value_instr.at(v));
    k.output_types.push_back(v->type().dtype);
  }
}

}  // namespace

namespace {
// Kernels stay small enough to compile in milliseconds: a longer chain becomes several groups.
constexpr size_t kMaxGroupNodes = 128;

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != t && f != 1) return false;
  }
  return true;
}
}  // namespace

std::vector<FusionGroup> find_groups(const jit::Graph& graph) {
  std::vector<const Node*> order;
  absl::flat_hash_map<const Node*, int64_t> position;
  for (const Node* n = graph.first(); n; n = n->next()) {
    position[n] = static_cast<int64_t>(order.size());
    order.push_back(n);
  }
  absl::flat_hash_map<const Node*, size_t> group_of;
  std::vector<std::vector<const Node*>> groups;
  std::vector<int64_t> group_run_at;
  // Where a node's value is read: at the node, or where its group runs.
  auto runs_at = [&](const Node* n) {
    auto g = group_of.find(n);
    return g == group_of.end() ? position.at(n) : group_run_at[g->second];
  };
  for (size_t i = order.size(); i-- > 0;) {
    const Node* consumer = order[i];
    if (group_of.contains(consumer) || !is_fusible(*consumer)) continue;
    const size_t id = groups.size();
    const int64_t run_at = static_cast<int64_t>(i);
    const Shape& shape = consumer->output()->type().sizes;
    std::vector<const Node*> members{consumer};
    group_of[consumer] = id;
    group_run_at.push_back(run_at);
    // Passes over the members until no producer joins: a producer refused because one of its
    // uses was outside the group may join once that user has.
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t m = 0; m < members.size(); ++m) {
        for (const Value* in : members[m]->inputs()) {
          const Node* p = in->node();
          if (p->is_input() || p->is_constant() || group_of.contains(p)) continue;
          if (members.size() >= kMaxGroupNodes) break;
          if (p->num_outputs() != 1 || !is_fusible(*p)) continue;
          // A producer of a smaller shape that broadcasts to the group's is recomputed for each
          // element it broadcasts to: it may join only when nothing outside the group reads it.
          const Shape& p_shape = p->output()->type().sizes;
          if (p_shape != shape) {
            if (!broadcasts_to(p_shape, shape) || graph.is_output(p->output())) continue;
            bool inside = true;
            for (const jit::Use& u : p->output()->uses()) {
              auto g = group_of.find(u.user);
              inside &= g != group_of.end() && g->second == id;
            }
            if (!inside) continue;
          }
          bool later = true;
          for (const jit::Use& u : p->output()->uses()) {
            auto g = group_of.find(u.user);
            if ((g == group_of.end() || g->second != id) && runs_at(u.user) <= run_at)
              later = false;
          }
          if (!later) continue;
          group_of[p] = id;
          members.push_back(p);
          changed = true;
        }
      }
    }
    groups.push_back(std::move(members));
  }
  std::vector<FusionGroup> result;
  for (auto& members : groups) {
    if (members.size() < 2) continue;
    FusionGroup g;
    g.nodes = members;
    std::sort(g.nodes.begin(), g.nodes.end(),
              [&](const Node* a, const Node* b) { return position.at(a) < position.at(b); });
    g.shape = g.nodes.back()->output()->type().sizes;
    absl::flat_hash_set<const Node*> member_set(g.nodes.begin(), g.nodes.end());
    build_kernel(g, member_set);
    jit::log("fuser", "group of ", g.nodes.size(), " nodes (", g.kernel.ops, ") over ",
             detail::shape_str(g.shape), ": ", g.inputs.size(), " inputs, ", g.outputs.size(),
             " outputs, ", g.scalars.size(), " scalars");
    result.push_back(std::move(g));
  }
  return result;
}

}  // namespace kiln::fuser
