// The forward fuser: finds groups of elementwise nodes and builds each group's kernel from its
// ops' formulas.
#include "fuser/fuse.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/constant_value.h"
#include "jit/log.h"
#include "jit/passes/rewriter.h"
#include "kiln/error.h"
#include "lib/broadcast.h"
#include "lib/env.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using detail::broadcasts_to;
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

namespace {
// How a member of a fused group computes: in `compute`, each operand converted in the kernel to its
// entry in `operands`, as the op's entry point converts it (lib/elementwise.h: binary_op's
// a.to(compute), where's condition kept bool).
struct MemberTypes {
  DType compute;
  std::vector<DType> operands;
};

// A view with a formula (expand) to the same rank: read broadcast, like an elementwise operand.
bool is_broadcast_view(const Node& n) {
  return n.op().kind == detail::OpKind::View && n.op().formula && n.num_inputs() == 1 &&
         n.num_outputs() == 1 && n.input(0) &&
         n.input(0)->type().sizes.size() == n.output()->type().sizes.size();
}

// A group computes on one device: its members' operands are on the device of their results,
// except 0-dim host values (numbers), which any device's kernel takes.
bool on_device_of(const jit::ValueType& operand, Device device) {
  return operand.device == device || (operand.device.is_cpu() && operand.sizes.empty());
}

// Why a node is no member (KILN_LOG=fuser): set when member_types refuses it, if asked.
std::optional<MemberTypes> member_types(const Node& n, const char** why = nullptr) {
  auto refuse = [why](const char* reason) -> std::optional<MemberTypes> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const detail::OpDef& op = n.op();
  const bool ternary = op.kind == detail::OpKind::Ternary;
  if (op.kind != detail::OpKind::Unary && op.kind != detail::OpKind::Binary && !ternary &&
      !is_broadcast_view(n))
    return refuse("not an elementwise op");
  if (!op.formula) return refuse("the op has no formula in the op table");
  if (n.num_outputs() != 1 || n.num_inputs() == 0) return refuse("not one output over operands");
  const Device device = n.output()->type().device;
  std::vector<detail::PromotionOperand> facts;
  for (const Value* in : n.inputs()) {
    if (!in) return refuse("an operand is absent");
    if (!on_device_of(in->type(), device)) return refuse("an operand is on another device");
    facts.push_back({in->type().dtype, in->type().sizes.empty(), in->type().wrapped_number});
  }
  MemberTypes t;
  switch (op.dtype_rule) {
    case detail::DTypeRule::Same:
    case detail::DTypeRule::Float:
      // The promoted operands' type (and clamp's bounds'), made floating by
      // Float: the output's.
      t.compute = n.output()->type().dtype;
      break;
    case detail::DTypeRule::Logical:
      t.compute = kBool;
      break;
    case detail::DTypeRule::Predicate:
      // Compared in the promoted type (unary ones: the operand's own).
      t.compute =
          facts.size() == 1 ? facts[0].dtype : detail::result_type(facts.data(), facts.size());
      break;
    case detail::DTypeRule::Custom:
      // where: a bool condition selecting between operands promoted to the output's type; a
      // conversion (to) reads its operand as it is.
      t.compute = ternary ? n.output()->type().dtype : facts[0].dtype;
      break;
    default:
      return refuse("its dtype rule is not one a kernel computes");
  }
  if (op.checks_integer_values && !is_floating_point(t.compute))
    return refuse("on integers it checks its operands' values (division by zero): its kernel runs");
  t.operands.assign(n.num_inputs(), t.compute);
  if (ternary) {
    if (facts[0].dtype != kBool)
      return refuse("its condition is not bool (a conversion left to the op)");
    t.operands[0] = kBool;
  }
  return t;
}

// An attribute as a kernel scalar of type t, converted as Scalar::to<T> (what the reference
// kernels do with them).
uint64_t scalar_bits(const Scalar& s, DType t) {
  uint64_t bits = 0;
  auto put = [&bits](auto v) { std::memcpy(&bits, &v, sizeof v); };
  switch (t) {
    case kBool:
      put(s.to<bool>());
      break;
    case kInt32:
      put(s.to<int32_t>());
      break;
    case kInt64:
      put(s.to<int64_t>());
      break;
    case kFloat32:
      put(s.to<float>());
      break;
    case kFloat64:
      put(s.to<double>());
      break;
  }
  return bits;
}
}  // namespace

bool is_fusible(const Node& n) {
  return member_types(n).has_value();
}

namespace {
// The convolution passes and pools, which run lib/ops/conv_cuda.cpp's kernels on a device.
bool is_conv_or_pool(const std::string& name) {
  return name == "conv2d" || name == "conv2d_grad_input" || name == "conv2d_grad_weight" ||
         name == "max_pool2d_with_indices" || name == "max_pool2d_backward" ||
         name == "avg_pool2d" || name == "avg_pool2d_backward";
}
}  // namespace

bool has_device_kernel(const Node& n) {
  if (n.num_outputs() == 0) return false;
  const DType t = n.output(0)->type().dtype;
  const detail::OpKind kind = n.op().kind;
  const std::string& name = n.op().name;
  return (kind == detail::OpKind::Linalg && (t == kFloat32 || t == kFloat64)) ||
         kind == detail::OpKind::Join || kind == detail::OpKind::View || name == "index_select" ||
         name == "gather" || name == "embedding" || name == "index_add" || name == "scatter_add" ||
         name == "slice_scatter" || name == "as_strided_scatter" || is_conv_or_pool(name);
}

namespace {
std::atomic<int> g_fusion{-1};  // -1: not read from KILN_FUSE yet
}  // namespace

bool fusion_enabled() {
  int v = g_fusion.load(std::memory_order_relaxed);
  if (v < 0) {
    v = detail::env_bool("KILN_FUSE") ? 1 : 0;
    g_fusion.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

bool set_fusion_enabled(bool on) {
  const bool was = fusion_enabled();
  g_fusion.store(on ? 1 : 0, std::memory_order_relaxed);
  return was;
}

std::string Kernel::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < body.size(); ++i) {
    const Instr& in = body[i];
    os << "%" << i << " : " << dtype_name(in.type) << " = " << prim_name(in.prim);
    if (in.prim == Prim::Load || in.prim == Prim::Scalar) os << " " << in.index;
    if (in.per_row) os << " per-row";
    if (is_global_reduction(in)) os << " global " << in.index;
    if (is_column_reduction(in)) os << " column " << in.index << " part " << in.part;
    if (in.prim == Prim::Literal) os << " " << in.literal;
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0) os << " %" << o;
    os << "\n";
  }
  os << "outputs:";
  for (int32_t o : outputs) os << " %" << o;
  return os.str();
}

std::string kernel_symbol(const std::string& key, const Kernel& k) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return "kiln_" + k.ops + "_" + std::string(hash, 8);
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
    put_i(in.per_row);
    put_i(in.column);
    put_i(in.part);
  }
  put_i(static_cast<int64_t>(k.outputs.size()));
  for (int32_t o : k.outputs) put_i(o);
  for (DType t : k.output_types) put_i(static_cast<int64_t>(t));
  for (bool e : k.output_per_element) put_i(e);
  put_i(k.num_globals);
  put_i(k.num_columns());
  for (int32_t p : k.column_parts) put_i(p);
  put_i(layout.flat);
  put_i(layout.rows);
  put_i(layout.rank);
  put_i(static_cast<int64_t>(layout.single_element.size()));
  for (bool s : layout.single_element) put_i(s);
  put_i(static_cast<int64_t>(layout.by_value.size()));
  for (bool v : layout.by_value) put_i(v);
  put_i(static_cast<int64_t>(layout.inner.size()));
  for (Layout::Inner i : layout.inner) put_i(i);
  return key;
}

std::vector<Level> instr_levels(const Kernel& k) {
  std::vector<Level> level(k.body.size(), Level::kConst);
  for (size_t n = 0; n < k.body.size(); ++n) {
    const Instr& in = k.body[n];
    if (in.prim == Prim::Load) {
      level[n] = in.per_row ? Level::kRow : Level::kElement;
    } else if (in.prim == Prim::Scalar || in.prim == Prim::Literal) {
      level[n] = Level::kConst;
    } else if (is_reduction(in.prim)) {
      level[n] = is_column_reduction(in)   ? Level::kColumn
                 : is_global_reduction(in) ? Level::kGlobal
                                           : Level::kRow;
    } else {
      for (int32_t o : {in.a, in.b, in.c})
        if (o >= 0) level[n] = std::max(level[n], level[static_cast<size_t>(o)]);
    }
  }
  return level;
}

std::vector<int32_t> instr_stages(const Kernel& k) {
  std::vector<int32_t> stage(k.body.size(), 0);
  for (size_t n = 0; n < k.body.size(); ++n) {
    const Instr& in = k.body[n];
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0) stage[n] = std::max(stage[n], stage[static_cast<size_t>(o)]);
    if (is_row_reduction(in)) ++stage[n];
  }
  return stage;
}

namespace {

// Parses an op-table formula into instructions. x, y and z are the operands; aN an attribute and
// n the number of elements a reduction folds (both through callbacks); (let NAME e body) names e
// in body; (if-attr aN WORD then else) is `then` when attribute N reads WORD (a string attribute's
// text, or none when it is absent) and `else` otherwise, decided while parsing (the attributes are
// part of the node, so of the kernel's identity), the other branch skipped unparsed. Numbers take
// the type of what they meet (the compute type alone); attributes and n are converted to it.
// Formulas are a few tokens long: the parser recurses over the formula's text, never over a graph.
class FormulaParser {
 public:
  using Attr = std::function<int32_t(int)>;  // attribute i's instruction, or -1
  using AttrText = std::function<std::optional<std::string>(int)>;  // nullopt: no attribute i
  FormulaParser(Kernel& k, const std::string& text, DType type, DType out_type,
                const int32_t* operands, size_t num_operands, Attr attr, AttrText attr_text,
                std::function<int32_t()> count = nullptr, bool global = false,
                int32_t column_slot = -1, int32_t part = 0)
      : k_(k),
        text_(text),
        type_(type),
        out_type_(out_type),
        operands_(operands),
        num_operands_(num_operands),
        attr_(std::move(attr)),
        attr_text_(std::move(attr_text)),
        count_(std::move(count)),
        global_(global),
        column_slot_(column_slot),
        part_(part) {}

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
  const Instr& at(int32_t i) const { return k_.body[static_cast<size_t>(i)]; }
  int32_t expr() {
    skip_space();
    check(pos_ < text_.size(), "unexpected end");
    if (text_[pos_] != '(') return atom(token());
    ++pos_;
    const std::string name = token();
    if (name == "let") {
      const std::string bound = token();
      const int32_t value = expr();
      lets_.emplace_back(bound, value);
      const int32_t body = expr();
      lets_.pop_back();
      close();
      return body;
    }
    if (name == "if-attr") {
      const std::string a = token();
      check(a.size() >= 2 && a[0] == 'a' && std::isdigit(static_cast<unsigned char>(a[1])),
            "expected an attribute");
      const std::string word = token();
      const std::optional<std::string> text =
          attr_text_ ? attr_text_(std::atoi(a.c_str() + 1)) : std::nullopt;
      check(text.has_value(), "no such attribute");
      int32_t r;
      if (*text == word) {
        r = expr();
        skip();
      } else {
        skip();
        r = expr();
      }
      close();
      return r;
    }
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
  // Passes over one expression without parsing it.
  void skip() {
    skip_space();
    check(pos_ < text_.size(), "unexpected end");
    if (text_[pos_] != '(') {
      token();
      return;
    }
    int depth = 0;
    do {
      check(pos_ < text_.size(), "unclosed '('");
      if (text_[pos_] == '(') ++depth;
      if (text_[pos_] == ')') --depth;
      ++pos_;
    } while (depth > 0);
  }
  void close() {
    skip_space();
    check(pos_ < text_.size() && text_[pos_] == ')', "expected ')'");
    ++pos_;
  }
  int32_t atom(const std::string& t) {
    for (size_t i = lets_.size(); i-- > 0;)
      if (lets_[i].first == t) return lets_[i].second;
    if (t == "x" || t == "y" || t == "z") {
      const auto i = static_cast<size_t>(t[0] - 'x');
      check(i < num_operands_, "operand missing");
      return operands_[i];
    }
    if (t == "n") {
      check(count_ != nullptr, "no element count here");
      if (count_instr_ < 0) count_instr_ = count_();
      return count_instr_;
    }
    if (t.size() >= 2 && t[0] == 'a' && std::isdigit(static_cast<unsigned char>(t[1]))) {
      const int32_t a = attr_ ? attr_(std::atoi(t.c_str() + 1)) : -1;
      check(a >= 0, "no such attribute");
      return a;
    }
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    check(end && *end == '\0', "unknown name");
    return literal(type_, v);
  }
  int32_t literal(DType type, double v) {
    Instr in{Prim::Literal, type};
    in.literal = v;
    return k_.add(in);
  }
  // `v` as `type`: numbers are retyped, attributes and counts converted.
  int32_t coerce(int32_t v, DType type) {
    const Instr& in = at(v);
    if (in.type == type) return v;
    if (in.prim == Prim::Literal) return literal(type, in.literal);
    check(in.prim == Prim::Scalar || in.prim == Prim::Cast, "operands of different types");
    Instr c{Prim::Cast, type};
    c.a = v;
    return k_.add(c);
  }
  // The type two operands meet in: a computed value's, over numbers, attributes and counts.
  DType meet(int32_t a, int32_t b) const {
    auto weak = [this](int32_t v) {
      Prim p = at(v).prim;
      return p == Prim::Literal || p == Prim::Scalar;
    };
    if (weak(a) && !weak(b)) return at(b).type;
    return at(a).type;
  }
  // The primitive `name` (kPrims' names; "widen" is a cast to the accumulation type of sums).
  int32_t apply(const std::string& name, std::vector<int32_t> args) {
    const bool widen = name == "widen";
    const PrimInfo* e = prim_named(widen ? "cast" : name);
    check(e != nullptr, "unknown primitive");
    check(static_cast<int>(args.size()) == e->arity, "wrong number of operands");
    // Operands of arithmetic, comparisons and select's choices meet in one type.
    if (e->arity == 2 && e->prim != Prim::And && e->prim != Prim::Or) {
      const DType t = meet(args[0], args[1]);
      args[0] = coerce(args[0], t);
      args[1] = coerce(args[1], t);
    }
    if (e->prim == Prim::Select) {
      const DType t = meet(args[1], args[2]);
      args[1] = coerce(args[1], t);
      args[2] = coerce(args[2], t);
    }
    Instr in{e->prim, e->result == PrimResult::kBool
                          ? kBool
                          : at(args[e->prim == Prim::Select ? 1 : 0]).type};
    if (e->prim == Prim::Cast) in.type = out_type_;
    if (widen) {
      // The accumulation type of sums: double for floating types, int64 otherwise.
      in.type = is_floating_point(at(args[0]).type) ? kFloat64 : kInt64;
      if (in.type == at(args[0]).type) return args[0];
    }
    if (is_reduction(e->prim)) {
      if (column_slot_ >= 0) {
        in.index = column_slot_;
        in.column = true;
        in.part = part_;
      } else {
        in.index = global_ ? k_.num_globals++ : -1;
      }
    }
    in.a = args[0];
    if (e->arity > 1) in.b = args[1];
    if (e->arity > 2) in.c = args[2];
    return k_.add(in);
  }

  Kernel& k_;
  const std::string& text_;
  DType type_;
  DType out_type_;  // the node's output type: what "cast" converts to
  const int32_t* operands_;
  size_t num_operands_;
  Attr attr_;
  AttrText attr_text_;
  std::function<int32_t()> count_;
  int32_t count_instr_ = -1;
  bool global_;          // reductions fold every row (global slots), not one row
  int32_t column_slot_;  // >= 0: reductions fold each position over the rows into this slot
  int32_t part_;         // ... at this part of it
  std::vector<std::pair<std::string, int32_t>> lets_;
  size_t pos_ = 0;
};

uint64_t value_bits(const Tensor& t) {
  uint64_t bits = 0;
  std::memcpy(&bits, t.impl()->data(), element_size(t.dtype()));
  return bits;
}

// How a member of a group computes: per element of the group's shape, once per row (row
// reductions and what only their results feed), once per call (a global reduction), or once per
// position of a row, over every row (a column reduction: a sum over the leading dims).
enum class Role : uint8_t { kElement, kRow, kGlobal, kColumn };

Shape kept_shape(const Shape& s, int k) {
  Shape r(s.begin(), s.end() - k);
  r.resize(s.size(), 1);
  return r;
}
Shape dropped_shape(const Shape& s, int k) {
  return Shape(s.begin(), s.end() - k);
}

int attr_index(const Node& n, const char* name) {
  const auto& names = n.op().attr_names;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

// The type a reduction's formula computes in: its output type for float-producing ones
// (logsumexp of integers), else its input's.
DType reduction_compute_type(const Node& n) {
  return n.op().dtype_rule == detail::DTypeRule::Float ? n.output()->type().dtype
                                                       : n.input(0)->type().dtype;
}

// A reduction node's attribute i as a kernel scalar of its own kind (a float64 or an int64, as
// var's correction), made by `scalar`; -1 when there is no attribute i.
int32_t reduction_attr(const Node& n, int i,
                       const std::function<int32_t(DType, uint64_t)>& scalar) {
  if (i < 0 || static_cast<size_t>(i) >= n.attrs().size()) return -1;
  const Scalar a = detail::attr_scalar(n.attr(static_cast<size_t>(i)));
  uint64_t bits;
  if (a.is_floating_point()) {
    const double d = a.to_double();
    std::memcpy(&bits, &d, sizeof d);
    return scalar(kFloat64, bits);
  }
  const int64_t v = a.to_int();
  std::memcpy(&bits, &v, sizeof v);
  return scalar(kInt64, bits);
}

// The text of a node's attribute i as formulas' if-attr reads it.
std::optional<std::string> attr_text_of(const Node& n, int i) {
  if (i < 0 || static_cast<size_t>(i) >= n.attrs().size()) return std::nullopt;
  const detail::AttrValue& a = n.attr(static_cast<size_t>(i));
  if (const auto* text = std::get_if<std::string>(&a)) return *text;
  return detail::attr_str(a);
}

// Whether a reduction node's formula folds exactly once, counted on the parsed kernel (operands
// as loads, attributes and the element count as kernel scalars), so that every reduction
// primitive counts and an if-attr branch not taken does not.
bool folds_once(const Node& n) {
  Kernel k;
  const DType compute = reduction_compute_type(n);
  std::vector<int32_t> operands;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    Instr load{Prim::Load, compute};
    load.index = static_cast<int32_t>(i);
    k.input_types.push_back(compute);
    operands.push_back(k.add(load));
  }
  auto scalar = [&k](DType type, uint64_t) {
    Instr s{Prim::Scalar, type};
    s.index = static_cast<int32_t>(k.scalar_types.size());
    k.scalar_types.push_back(type);
    return k.add(s);
  };
  FormulaParser(
      k, n.op().formula, compute, n.output()->type().dtype, operands.data(), operands.size(),
      [&](int i) { return reduction_attr(n, i, scalar); },
      [&n](int i) { return attr_text_of(n, i); }, [&] { return scalar(kFloat64, 0); })
      .parse();
  return std::count_if(k.body.begin(), k.body.end(),
                       [](const Instr& in) { return is_reduction(in.prim); }) == 1;
}

// Ops that compute each element from its whole row along a dim (softmax): with the dim the last,
// they join groups as elementwise members that fold rows.
bool is_row_wise(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::NN || !op.formula || n.num_inputs() != 1 || n.num_outputs() != 1 ||
      n.attrs().size() != 1 || !n.input(0))
    return false;
  const jit::ValueType& in = n.input(0)->type();
  const jit::ValueType& out = n.output()->type();
  if (in.device != out.device || in.sizes.empty() || in.sizes != out.sizes) return false;
  const int d = attr_index(n, "dim");
  return d == 0 && detail::attr_int(n.attr(0)) == static_cast<int64_t>(in.sizes.size()) - 1;
}

// The kernel's symbol names its first ops, up to about 48 characters, and always its join.
void append_op_name(Kernel& k, const std::string& name, bool always = false) {
  if (k.ops.size() >= 48 && !always) return;
  if (!k.ops.empty()) k.ops += "_";
  k.ops += name;
}

// The dim a cat or stack joins along, counted from the front.
int64_t join_dim(const Node& join) {
  const auto rank = static_cast<int64_t>(join.output()->type().sizes.size());
  const int64_t d = detail::attr_int(join.attr(0));
  return d < 0 ? d + rank : d;
}

// The join of g whose value `v` is, or null.
const Node* join_of(const FusionGroup& g, const Value* v) {
  for (const FusionGroup::Join& j : g.joins)
    if (j.node->output() == v) return j.node;
  return nullptr;
}

// Builds the group's kernel: loads for its inputs, scalars for its constants, attributes and
// element counts, and each member's formula in graph order.
void build_kernel(FusionGroup& g, const absl::flat_hash_map<const Node*, Role>& roles) {
  Kernel& k = g.kernel;
  absl::flat_hash_map<const Value*, int32_t> value_instr;   // members' results
  absl::flat_hash_map<const Value*, int32_t> scalar_instr;  // constants, as read
  // Loads by (value, per row, against the kept dims only).
  absl::flat_hash_map<std::tuple<const Value*, bool, bool>, int32_t> loads;
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
  auto double_scalar = [&](double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof d);
    return scalar(kFloat64, bits);
  };
  // The instruction giving `in` to a member: its result, a constant's scalar, or a load.
  auto operand = [&](const Value* in, bool per_row, bool outer) -> int32_t {
    if (auto it = value_instr.find(in); it != value_instr.end()) return it->second;
    if (in->node()->is_constant()) {
      auto s = scalar_instr.find(in);
      if (s == scalar_instr.end()) {
        const Tensor c = jit::constant_value(*in->node());
        s = scalar_instr.emplace(in, scalar(c.dtype(), value_bits(c))).first;
      }
      return s->second;
    }
    auto key = std::make_tuple(in, per_row, outer);
    auto l = loads.find(key);
    if (l == loads.end()) {
      Instr load{Prim::Load, in->type().dtype};
      load.index = static_cast<int32_t>(g.inputs.size());
      load.per_row = per_row;
      g.inputs.push_back(in);
      g.input_outer.push_back(outer);
      k.input_types.push_back(in->type().dtype);
      l = loads.emplace(key, k.add(load)).first;
    }
    return l->second;
  };
  for (const Node* n : g.nodes) {
    if (join_of(g, n->output())) continue;  // written as the kernel's last outputs
    const Role role = roles.at(n);
    const bool reduction = n->op().kind == detail::OpKind::Reduction;
    const bool folds = reduction || is_row_wise(*n);
    DType compute;
    std::vector<DType> operand_types;
    if (folds) {
      compute = reduction_compute_type(*n);
      operand_types.assign(n->num_inputs(), compute);
    } else {
      MemberTypes t = *member_types(*n);
      compute = t.compute;
      operand_types = std::move(t.operands);
    }
    // Inputs from outside: per element, or (for row-level members and a global reduction of
    // row-level values) once per row, broadcast against the kept dims when the member drops the
    // reduced ones.
    const Shape& shape = reduction ? n->input(0)->type().sizes : n->output()->type().sizes;
    const bool per_row = g.rows && role != Role::kElement && role != Role::kColumn &&
                         !(reduction && role == Role::kRow) && shape != g.shape;
    const bool outer = per_row && shape == dropped_shape(g.shape, g.reduced_dims) &&
                       shape != kept_shape(g.shape, g.reduced_dims);
    // A column sum of the group's join (cat along the row's dim) folds each piece into its part
    // of the column slot: the cat's element (i, p * R + j) is piece p's (i, j).
    const Node* summed_join = role == Role::kColumn ? join_of(g, n->input(0)) : nullptr;
    const bool of_join = summed_join != nullptr;
    const size_t parts = of_join ? summed_join->num_inputs() : 1;
    std::vector<int32_t> operands;
    for (const Value* in : n->inputs())
      operands.push_back(
          of_join ? -1 : cast(operand(in, per_row, outer), operand_types[operands.size()]));
    const std::string formula = n->op().formula;
    FormulaParser::Attr attr;
    std::function<int32_t()> count;
    if (folds) {
      // Attributes as they are (var's correction), and the number of elements folded.
      attr = [&scalar, n](int i) { return reduction_attr(*n, i, scalar); };
      count = [&, n, role] {
        const Shape& in_shape = n->input(0)->type().sizes;
        const int64_t folded =
            role == Role::kGlobal ? detail::shape_numel(in_shape)
            : role == Role::kColumn
                ? detail::shape_numel(Shape(in_shape.begin(), in_shape.end() - g.reduced_dims))
                : detail::shape_numel(Shape(in_shape.end() - g.reduced_dims, in_shape.end()));
        return double_scalar(static_cast<double>(folded));
      };
    } else if (!n->attrs().empty()) {
      // The op's numeric attributes (add's alpha, clamp's bounds, softplus's beta) as the
      // formula's aN: kernel scalars of the compute type, passed per call and converted as the
      // reference kernel converts them (Scalar::to), made when the formula first reads them. An
      // absent one (none) has no value: formulas test for it with if-attr.
      attr = [&scalar, n, compute,
              made = std::vector<int32_t>(n->attrs().size(), -1)](int i) mutable -> int32_t {
        if (i < 0 || static_cast<size_t>(i) >= made.size()) return -1;
        const detail::AttrValue& a = n->attr(static_cast<size_t>(i));
        if (std::holds_alternative<std::monostate>(a)) return -1;
        int32_t& m = made[static_cast<size_t>(i)];
        if (m < 0) m = scalar(compute, scalar_bits(detail::attr_scalar(a), compute));
        return m;
      };
    }
    FormulaParser::AttrText attr_text = [n](int i) { return attr_text_of(*n, i); };
    const int32_t slot = role == Role::kColumn ? k.num_columns() : -1;
    if (role == Role::kColumn) k.column_parts.push_back(static_cast<int32_t>(parts));
    int32_t result = -1;
    for (size_t part = 0; part < parts; ++part) {
      if (of_join)
        operands[0] = cast(operand(summed_join->input(part), false, false), operand_types[0]);
      // Parts after the first only fold: what follows their reduction is the first part's (the
      // columns function computes it for every position of the slot).
      const int32_t r = FormulaParser(k, formula, compute, n->output()->type().dtype,
                                      operands.data(), operands.size(), attr, attr_text, count,
                                      role == Role::kGlobal, slot, static_cast<int32_t>(part))
                            .parse();
      if (part == 0) result = r;
    }
    KILN_CHECK(k.body[static_cast<size_t>(result)].type == n->output()->type().dtype,
               "fuser: the formula of ", n->op().name, " gives ",
               dtype_name(k.body[static_cast<size_t>(result)].type), ", the node is ",
               dtype_name(n->output()->type().dtype));
    value_instr[n->output()] = result;
    append_op_name(k, n->op().name);
  }
  // Outputs: members whose value is read outside the group or returned; then the joins' pieces.
  for (const Node* n : g.nodes) {
    if (join_of(g, n->output())) continue;
    const Value* v = n->output();
    bool outside = n->owning_graph()->is_output(v);
    for (const jit::Use& u : v->uses()) outside |= !roles.contains(u.user);
    if (!outside) continue;
    g.outputs.push_back(v);
    k.outputs.push_back(value_instr.at(v));
    k.output_types.push_back(v->type().dtype);
    k.output_per_element.push_back(g.rows && v->type().sizes == g.shape &&
                                   roles.at(n) != Role::kColumn);
  }
  for (FusionGroup::Join& join : g.joins) {
    const Value* whole = join.node->output();
    for (const Value* piece : join.node->inputs()) {
      k.outputs.push_back(operand(piece, false, false));
      k.output_types.push_back(whole->type().dtype);
      k.output_per_element.push_back(false);
    }
    g.outputs.push_back(whole);
    join.dim = join_dim(*join.node);
    append_op_name(k, join.node->op().name, /*always=*/true);
  }
}

// Kernels stay small enough to compile in milliseconds: a longer chain becomes several groups.
constexpr size_t kMaxGroupNodes = 128;

}  // namespace

std::optional<int> fused_reduction_dims(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::Reduction || !op.formula || n.num_outputs() != 1 ||
      n.num_inputs() != 1)
    return std::nullopt;
  const Value* in = n.input(0);
  if (!in || in->type().device != n.output()->type().device) return std::nullopt;
  const int rank = static_cast<int>(in->type().sizes.size());
  if (rank == 0) return std::nullopt;
  // sum with a dtype converts first: left to the op.
  if (int d = attr_index(n, "dtype");
      d >= 0 && !std::holds_alternative<std::monostate>(n.attr(static_cast<size_t>(d))))
    return std::nullopt;
  const int d = attr_index(n, "dims");
  if (d < 0) return rank;
  const std::vector<int64_t>& dims = detail::attr_ints(n.attr(static_cast<size_t>(d)));
  if (dims.empty()) return rank;
  const int k = static_cast<int>(dims.size());
  for (int i = 0; i < k; ++i)
    if (dims[static_cast<size_t>(i)] != rank - k + i) return std::nullopt;
  return k;
}

std::optional<int> fused_column_dims(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::Reduction || !op.formula || n.num_outputs() != 1 ||
      n.num_inputs() != 1)
    return std::nullopt;
  const Value* in = n.input(0);
  if (!in || in->type().device != n.output()->type().device) return std::nullopt;
  const int rank = static_cast<int>(in->type().sizes.size());
  if (int d = attr_index(n, "dtype");
      d >= 0 && !std::holds_alternative<std::monostate>(n.attr(static_cast<size_t>(d))))
    return std::nullopt;
  const int d = attr_index(n, "dims");
  if (d < 0) return std::nullopt;
  const std::vector<int64_t>& dims = detail::attr_ints(n.attr(static_cast<size_t>(d)));
  const int lead = static_cast<int>(dims.size());
  if (lead == 0 || lead >= rank) return std::nullopt;
  for (int i = 0; i < lead; ++i)
    if (dims[static_cast<size_t>(i)] != i) return std::nullopt;
  if (!folds_once(n)) return std::nullopt;
  return lead;
}

bool is_join_exit(const Node& n) {
  const detail::OpDef& op = n.op();
  if (op.kind != detail::OpKind::Join || (op.name != "cat" && op.name != "stack") ||
      n.num_outputs() != 1 || n.num_inputs() == 0 || n.attrs().size() != 1 || !n.input(0))
    return false;
  const jit::ValueType& out = n.output()->type();
  const Shape& piece = n.input(0)->type().sizes;
  if (op.name == "cat" && piece.empty()) return false;
  for (const Value* in : n.inputs())
    if (!in || in->type().sizes != piece || in->type().dtype != out.dtype ||
        in->type().device != out.device)
      return false;
  return true;
}

namespace {
// "%7 mul": a node as the graph printer names its first output.
std::string node_label(const Node& n) {
  const std::string id = n.num_outputs() > 0 ? std::to_string(n.output(0)->id()) : "?";
  return "%" + id + " " + n.op().name;
}

// Why a node can join no group at all (KILN_LOG=fuser).
std::string unfusible_reason(const Node& n) {
  const detail::OpDef& op = n.op();
  switch (op.kind) {
    case detail::OpKind::Unary:
    case detail::OpKind::Binary:
    case detail::OpKind::Ternary: {
      const char* why = "";
      member_types(n, &why);
      return why;
    }
    case detail::OpKind::View:
      return is_broadcast_view(n) ? "an expand whose operand is on another device"
                                  : "a view other than an expand to the same rank stays a view";
    case detail::OpKind::Linalg:
      return op.name == "mm" || op.name == "bmm" || op.name == "matmul" || op.name == "addmm" ||
                     op.name == "linear"
                 ? "a GEMM (a oneDNN library call)"
                 : "a linear-algebra library call";
    case detail::OpKind::Reduction: {
      if (!op.formula) return "a reduction with no formula in the op table";
      if (n.num_inputs() != 1 || n.num_outputs() != 1 || !n.input(0))
        return "a reduction of several operands or results";
      if (n.input(0)->type().device != n.output()->type().device)
        return "a reduction whose result is on another device";
      if (n.input(0)->type().sizes.empty()) return "a reduction of a 0-dim value";
      if (int d = attr_index(n, "dtype");
          d >= 0 && !std::holds_alternative<std::monostate>(n.attr(static_cast<size_t>(d))))
        return "a reduction converting to another dtype first";
      return "a reduction over dims that are not the trailing ones";
    }
    case detail::OpKind::Join:
      return is_join_exit(n) ? "a cat or stack only ends a group (its exit), never feeds one"
                             : "a cat or stack whose pieces differ in shape, dtype or device";
    case detail::OpKind::NN:
      if (!op.formula) return "the op has no formula in the op table (its own kernel runs)";
      return is_row_wise(n) ? "a row-wise op" : "a row-wise op not over its last dim";
    default:
      return "the op has no formula in the op table (its own kernel runs)";
  }
}

// A group while find_groups builds it.
struct Building {
  std::vector<const Node*> members;
  Shape shape;           // the iteration shape
  int k = -1;            // trailing dims a row reduction folds (or a column one keeps); -1: none
  bool small = false;    // a member of a smaller shape, recomputed per element
  bool reduces = false;  // a rows kernel
  // The cats or stacks it ends in (then it has no reductions but column exits): its root, and
  // other joins of pieces it computes, merged in later.
  std::vector<const Node*> joins;
  bool columns = false;  // rooted at a column reduction (a sum over the leading dims)
};

// How many uses of one value the merge below looks at for groups that read it too: a bound, so
// that exits reading a value with a huge fan-out stay linear.
constexpr size_t kMaxReadersLookedAt = 64;
// How many target groups (the latest-running first) an exit is checked against.
constexpr size_t kMaxTargetsTried = 8;

// Column exits join the group whose values they read. A group rooted at a column reduction (the
// sum over the batch of a gradient, with the elementwise nodes that only it reads) ends up where
// the reduction is, after the group computing its operand, which has by then written that operand
// out for it: the gradient g * xhat of layer_norm's weight is read again from memory. Instead the
// exit moves up into that group, which then folds the column sums while it computes the values:
// the merged group runs where the earlier group runs, which is correct when every value the exit
// reads from outside is available there (computed by the group itself, a graph input or constant,
// or made by something that runs before it); the exit's own results are then ready earlier than
// their readers need. The target is the latest-running group that computes or also reads one of
// the exit's inputs (sharing its reads is what saves memory traffic), of the same iteration shape
// and row split. A column sum of a group's join (the bias gradient of an LSTM's gates, a sum over
// the batch of cat(di, df, dg, do)) joins it too when the cat is along the last dim, each piece
// folding into its part of the sum. A lone elementwise node (which would run on its own, reading
// back what the kernel wrote) moves up by the same rule. A value the exit reads from the target
// must be an element's or a row's broadcast back (keepdim): a global reduction's result exists
// only after every row. Exits are visited in the order they run, so a target that was itself an
// exit has already moved (merged_into resolves it). Each exit looks at its members' inputs, at
// Whether a node with side effects (a collective) lies strictly between graph positions a < b;
// `effects` holds their positions in order. Work never moves across a collective: every rank runs
// the same steps around each one, and the graph's order is the program's.
bool effect_between(const std::vector<int64_t>& effects, int64_t a, int64_t b) {
  auto it = std::upper_bound(effects.begin(), effects.end(), a);
  return it != effects.end() && *it < b;
}

// most kMaxReadersLookedAt readers of each and at most kMaxTargetsTried targets: linear in the
// graph.
void merge_column_exits(std::vector<Building>& groups, std::vector<int64_t>& run_at,
                        absl::flat_hash_map<const Node*, size_t>& group_of,
                        const absl::flat_hash_map<const Node*, Role>& role_of,
                        const absl::flat_hash_map<const Node*, int64_t>& position,
                        const std::vector<int64_t>& effects) {
  std::vector<size_t> merged_into(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) merged_into[i] = i;
  auto resolve = [&](size_t g) {
    while (merged_into[g] != g) g = merged_into[g] = merged_into[merged_into[g]];
    return g;
  };
  auto group_at = [&](const Node* n) -> std::optional<size_t> {
    auto it = group_of.find(n);
    if (it == group_of.end()) return std::nullopt;
    return resolve(it->second);
  };
  // Groups were made from the end of the graph: the last made runs first.
  for (size_t e = groups.size(); e-- > 0;) {
    Building& exit = groups[e];
    // A lone elementwise node (no kernel of its own: groups have two nodes at least) moves up the
    // same way, as another output of the kernel: an LSTM backward's gradient of c, f * dc'.
    const bool lone = exit.members.size() == 1 && !exit.reduces && exit.joins.empty() &&
                      is_fusible(*exit.members[0]) && !is_broadcast_view(*exit.members[0]);
    // A cat or stack (with the elementwise nodes only it reads) whose other pieces an earlier
    // join group computes (a GRU backward's second gate-gradient cat, sharing pieces with the
    // first) becomes another join of that group: its kernel writes the shared pieces twice
    // instead of a second kernel reading them back.
    const bool join_exit = exit.joins.size() == 1 && !exit.reduces && !exit.small;
    if ((!exit.columns && !lone && !join_exit) || exit.members.empty()) continue;
    std::vector<const Value*> reads;  // values the exit reads from outside
    for (const Node* m : exit.members)
      for (const Value* in : m->inputs())
        if (in && group_at(in->node()) != std::optional<size_t>(e)) reads.push_back(in);
    std::vector<size_t> candidates;
    auto consider = [&](const Node* n) {
      std::optional<size_t> g = group_at(n);
      if (g && *g != e && run_at[*g] < run_at[e] && !groups[*g].members.empty())
        candidates.push_back(*g);
    };
    for (const Value* v : reads) {
      consider(v->node());
      size_t looked = 0;
      for (const jit::Use& u : v->uses()) {
        if (looked++ == kMaxReadersLookedAt) break;
        consider(u.user);
      }
    }
    std::sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      return run_at[a] > run_at[b] || (run_at[a] == run_at[b] && a < b);
    });
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    if (candidates.size() > kMaxTargetsTried) candidates.resize(kMaxTargetsTried);
    // A lone column sum of one of the target's cats (pieces of the target's shape, cat along the
    // last dim): it folds the pieces.
    auto sums_join = [&](const Building& t) {
      if (!exit.columns || exit.members.size() != 1) return false;
      const Node* r = exit.members.front();
      const auto rank = static_cast<int64_t>(t.shape.size());
      for (const Node* join : t.joins)
        if (r->input(0) == join->output() && join->op().name == "cat" &&
            join_dim(*join) == rank - 1 && exit.k == 1)
          return true;
      return false;
    };
    for (size_t t : candidates) {
      Building& target = groups[t];
      const bool of_join = sums_join(target);
      if (!of_join && exit.shape != target.shape) continue;
      if (exit.columns && target.k >= 0 && target.k != exit.k) continue;
      // A join's pieces are written through their slices' strides, one row dim (k = 1) at a time.
      if (exit.columns && !target.joins.empty() && exit.k != 1) continue;
      // Another join: of pieces of the same shape, along the same dim as the target's, on its
      // device.
      if (join_exit && (target.joins.empty() ||
                        join_dim(*exit.joins.front()) != join_dim(*target.joins.front()) ||
                        exit.joins.front()->output()->type().device !=
                            target.joins.front()->output()->type().device))
        continue;
      if (target.members.size() + exit.members.size() > kMaxGroupNodes + 32) continue;
      if (effect_between(effects, run_at[t], run_at[e])) continue;
      bool available = true;
      for (const Value* v : reads) {
        const Node* p = v->node();
        if (group_at(p) == std::optional<size_t>(t)) {
          // A join's value is written by the kernel, not computed in it: only its column sum
          // (above) folds its pieces.
          const bool target_join =
              std::find(target.joins.begin(), target.joins.end(), p) != target.joins.end();
          if (target_join && !of_join) available = false;
          // Read inside the kernel: an element's value, or a row's broadcast back (keepdim). A
          // global reduction's result exists only after every row, a row value without keepdim
          // broadcasts along other dims than the rows.
          const Role r = role_of.at(p);
          available &=
              r == Role::kElement || (r == Role::kRow && target.k >= 0 &&
                                      v->type().sizes == kept_shape(target.shape, target.k));
          continue;
        }
        if (p->is_input() || p->is_constant()) continue;
        std::optional<size_t> pg = group_at(p);
        if ((pg ? run_at[*pg] : position.at(p)) >= run_at[t]) available = false;
      }
      if (!available) continue;
      for (const Node* m : exit.members) {
        group_of[m] = t;
        target.members.push_back(m);
      }
      if (exit.columns) {
        target.k = exit.k;
        target.reduces = true;
      }
      target.joins.insert(target.joins.end(), exit.joins.begin(), exit.joins.end());
      exit.members.clear();
      exit.joins.clear();
      merged_into[e] = t;
      jit::log("fuser",
               exit.columns ? "column exit over "
               : join_exit  ? "join exit over "
                            : "lone node over ",
               detail::shape_str(exit.shape), " merged into the group over ",
               detail::shape_str(target.shape), of_join ? " (a sum of its cat)" : "");
      break;
    }
  }
}
}  // namespace

std::vector<FusionGroup> find_groups(const jit::Graph& graph) {
  // KILN_LOG=fuser: one line per producer a group did not take, with the reason. Passes over a
  // group may refuse a producer and take it later, so reasons are kept (the latest per producer)
  // and printed once the group is complete, for the producers still outside it.
  const bool logging = jit::log_enabled("fuser");
  std::vector<std::pair<const Node*, std::string>> refused;
  absl::flat_hash_map<const Node*, size_t> refused_at;
  auto refuse = [&](const Node* p, const auto& why) {
    if (!logging) return;
    auto [it, fresh] = refused_at.try_emplace(p, refused.size());
    if (fresh)
      refused.emplace_back(p, why());
    else
      refused[it->second].second = why();
  };
  std::vector<const Node*> order;
  absl::flat_hash_map<const Node*, int64_t> position;
  std::vector<int64_t> effects;  // positions of collectives, in order
  for (const Node* n = graph.first(); n; n = n->next()) {
    position[n] = static_cast<int64_t>(order.size());
    if (!n->is_input() && jit::passes::has_side_effects(n->op())) effects.push_back(position[n]);
    order.push_back(n);
  }
  absl::flat_hash_map<const Node*, size_t> group_of;
  absl::flat_hash_map<const Node*, Role> role_of;
  std::vector<Building> groups;
  std::vector<int64_t> group_run_at;
  // Where a node's value is read: at the node, or where its group runs.
  auto runs_at = [&](const Node* n) {
    auto g = group_of.find(n);
    return g == group_of.end() ? position.at(n) : group_run_at[g->second];
  };
  for (size_t i = order.size(); i-- > 0;) {
    const Node* consumer = order[i];
    if (group_of.contains(consumer)) continue;
    Building st;
    Role root_role = Role::kElement;
    if (is_fusible(*consumer) && !is_broadcast_view(*consumer)) {
      st.shape = consumer->output()->type().sizes;
    } else if (is_row_wise(*consumer)) {
      st.shape = consumer->output()->type().sizes;
      st.k = 1;
      st.reduces = true;
    } else if (is_join_exit(*consumer)) {
      st.shape = consumer->input(0)->type().sizes;
      st.joins.push_back(consumer);
    } else if (std::optional<int> lead = fused_column_dims(*consumer)) {
      st.shape = consumer->input(0)->type().sizes;
      st.k = static_cast<int>(st.shape.size()) - *lead;
      st.reduces = true;
      st.columns = true;
      root_role = Role::kColumn;
    } else if (std::optional<int> k = fused_reduction_dims(*consumer)) {
      st.shape = consumer->input(0)->type().sizes;
      st.reduces = true;
      if (*k == static_cast<int>(st.shape.size()) && folds_once(*consumer)) {
        // Over every dim: each call folds its rows into partials, combined at the end. A formula
        // that folds twice (logsumexp, var) needs the first fold's final value: one row then.
        root_role = Role::kGlobal;
      } else {
        root_role = Role::kRow;
        st.k = *k;
      }
    } else {
      continue;
    }
    const size_t id = groups.size();
    const int64_t run_at = static_cast<int64_t>(i);
    st.members.push_back(consumer);
    group_of[consumer] = id;
    role_of[consumer] = root_role;
    group_run_at.push_back(run_at);
    // Whether member c can read a value of shape `vs` computed at role `vr`.
    auto fits = [&](const Node* c, const Shape& vs, Role vr) {
      const Role cr = role_of.at(c);
      if (cr == Role::kGlobal || cr == Role::kColumn || vr == Role::kElement) return true;
      if (c->op().kind == detail::OpKind::Reduction || is_row_wise(*c)) return vs == st.shape;
      if (cr == Role::kElement) {
        const Shape dropped = dropped_shape(st.shape, st.k);
        return vs == kept_shape(st.shape, st.k) || (vs == dropped && dropped.empty());
      }
      return vs == c->output()->type().sizes;
    };
    // Passes over the members until no producer joins: a producer refused because one of its
    // uses was outside the group may join once that user has.
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t m = 0; m < st.members.size(); ++m) {
        for (const Value* in : st.members[m]->inputs()) {
          if (!in) continue;
          const Node* p = in->node();
          if (p->is_input() || p->is_constant() || group_of.contains(p)) continue;
          if (st.members.size() >= kMaxGroupNodes) {
            refuse(p, [] {
              return "the group has reached " + std::to_string(kMaxGroupNodes) +
                     " nodes (kernels stay quick to compile)";
            });
            break;
          }
          if (p->num_outputs() != 1) {
            refuse(p, [&] { return std::to_string(p->num_outputs()) + " results"; });
            continue;
          }
          bool later = true, only_inside = true;
          const Node* reader_before = nullptr;  // a use outside the group that runs before it
          const Node* reader_outside = nullptr;
          for (const jit::Use& u : p->output()->uses()) {
            auto g = group_of.find(u.user);
            const bool inside = g != group_of.end() && g->second == id;
            only_inside &= inside;
            if (!inside && !reader_outside) reader_outside = u.user;
            if (!inside && runs_at(u.user) <= run_at) {
              later = false;
              if (!reader_before) reader_before = u.user;
            }
          }
          if (!later) {
            refuse(p, [&] {
              return "it is also read by " + node_label(*reader_before) +
                     ", outside the group and before the group's last node";
            });
            continue;
          }
          if (effect_between(effects, position.at(p), run_at)) {
            refuse(p, [] {
              return std::string("a collective runs between it and the group's last node");
            });
            continue;
          }
          // Who else reads a value, for the reasons below.
          auto read_elsewhere = [&] {
            return reader_outside ? "also read by " + node_label(*reader_outside)
                                  : std::string("a graph output");
          };
          const Shape& ps = p->output()->type().sizes;
          const Building saved = st;
          std::vector<const Node*> lifted;
          Role pr;
          // A broadcast read (expand) joins only a group that alone reads it: as a group's result
          // it would be written out whole, where a view costs nothing.
          if (is_broadcast_view(*p) && (!only_inside || graph.is_output(p->output()))) {
            refuse(p, [&] {
              return "a broadcasting expand stays a view when read outside the group (" +
                     read_elsewhere() + ")";
            });
            continue;
          }
          // A group computes on one device (a 0-dim host value it reads stays a step of its own).
          const Device group_device = st.members.front()->output()->type().device;
          if (p->output()->type().device != group_device) {
            refuse(p, [&] {
              return "it computes on " + p->output()->type().device.str() + ", the group on " +
                     group_device.str();
            });
            continue;
          }
          if (is_fusible(*p)) {
            if (ps == st.shape) {
              pr = Role::kElement;
            } else if (st.k >= 0 &&
                       (ps == kept_shape(st.shape, st.k) || ps == dropped_shape(st.shape, st.k))) {
              pr = Role::kRow;
            } else if (st.k < 0 && broadcasts_to(ps, st.shape) && detail::shape_numel(ps) == 1 &&
                       detail::shape_numel(st.shape) > 1) {
              // A one-element value (an optimizer's bias correction from its step count) is
              // computed once, by a step of its own, rather than once per element: recomputed,
              // a pow of it stays a libm call per element and keeps the loop from vectorizing.
              refuse(p, [&] {
                return "a one-element value is computed once, not per element of " +
                       detail::shape_str(st.shape);
              });
              continue;
            } else if (st.k < 0 && broadcasts_to(ps, st.shape) && only_inside &&
                       !graph.is_output(p->output())) {
              // A producer of a smaller shape that broadcasts to the group's is recomputed for
              // each element it broadcasts to: it may join only when nothing outside reads it.
              pr = Role::kElement;
              st.small = true;
            } else if (st.k < 0 && broadcasts_to(ps, st.shape)) {
              refuse(p, [&] {
                return "it broadcasts from " + detail::shape_str(ps) + " to the group's " +
                       detail::shape_str(st.shape) +
                       " and would be recomputed per element, but it is " + read_elsewhere();
              });
              continue;
            } else {
              refuse(p, [&] {
                return "its shape " + detail::shape_str(ps) + " is not the group's " +
                       detail::shape_str(st.shape) +
                       (st.k >= 0 ? " nor the group's row shape" : "");
              });
              continue;
            }
          } else if (is_row_wise(*p)) {
            if (!st.joins.empty() || ps != st.shape || (st.k >= 0 && st.k != 1)) {
              refuse(p, [&] {
                return std::string("a row-wise op cannot join here: ") +
                       (!st.joins.empty() ? "the group ends in a cat or stack"
                        : ps != st.shape  ? "its shape " + detail::shape_str(ps) +
                                               " is not the group's " + detail::shape_str(st.shape)
                                         : "the group already folds rows of its last " +
                                               std::to_string(st.k) + " dims");
              });
              continue;
            }
            st.k = 1;
            st.reduces = true;
            pr = Role::kElement;
          } else if (std::optional<int> k = fused_reduction_dims(*p)) {
            const Shape& in_shape = p->input(0)->type().sizes;
            auto cannot_exit = [&](const std::string& why) {
              refuse(p, [&] { return "a reduction cannot be an exit here: " + why; });
            };
            if (!st.joins.empty()) {
              cannot_exit("the group ends in a cat or stack");
              continue;
            } else if (st.k >= 0) {
              if (in_shape != st.shape || *k != st.k) {
                cannot_exit("it folds " + std::to_string(*k) + " dims of " +
                            detail::shape_str(in_shape) + ", the group folds " +
                            std::to_string(st.k) + " of " + detail::shape_str(st.shape));
                continue;
              }
            } else if (in_shape == st.shape) {
              st.k = *k;
            } else if (ps == st.shape && !st.small) {
              // The group so far computes row-level values of a larger shape: lift it.
              st.shape = in_shape;
              st.k = *k;
              for (const Node* member : st.members) {
                if (role_of.at(member) != Role::kElement) continue;
                role_of[member] = Role::kRow;
                lifted.push_back(member);
              }
            } else {
              cannot_exit(ps == st.shape
                              ? "the group recomputes broadcast members per element"
                              : "its input " + detail::shape_str(in_shape) + " and result " +
                                    detail::shape_str(ps) + " do not fit the group's " +
                                    detail::shape_str(st.shape));
              continue;
            }
            pr = Role::kRow;
            st.reduces = true;
          } else {
            refuse(p, [&] { return "not fusible: " + unfusible_reason(*p); });
            continue;
          }
          bool ok = true;
          for (const jit::Use& u : p->output()->uses()) {
            auto g = group_of.find(u.user);
            if (g != group_of.end() && g->second == id) ok &= fits(u.user, ps, pr);
          }
          if (!ok) {
            st = saved;
            for (const Node* member : lifted) role_of[member] = Role::kElement;
            refuse(p, [] {
              return std::string(
                  "a member reads it per element where it is computed per row, or the reverse");
            });
            continue;
          }
          group_of[p] = id;
          role_of[p] = pr;
          st.members.push_back(p);
          changed = true;
        }
      }
    }
    if (logging) {
      const std::string group = node_label(*consumer);
      for (const auto& [p, why] : refused)
        if (group_of.find(p) == group_of.end() || group_of.at(p) != id)
          jit::log("fuser", node_label(*p), " not merged into the group at ", group, ": ", why);
      refused.clear();
      refused_at.clear();
    }
    groups.push_back(std::move(st));
  }
  merge_column_exits(groups, group_run_at, group_of, role_of, position, effects);
  std::vector<FusionGroup> result;
  for (Building& b : groups) {
    // On the CPU a lone node runs its reference kernel (or its formula straight into its output);
    // on a device, where there is no reference kernel, it is a group of one: its own kernel.
    const bool lone_on_device = b.members.size() == 1 &&
                                b.members[0]->output()->type().device.is_cuda() &&
                                b.joins.empty() && !is_broadcast_view(*b.members[0]) &&
                                (b.reduces || is_fusible(*b.members[0]));
    if (b.members.size() < 2 && !lone_on_device) continue;
    FusionGroup g;
    g.nodes = b.members;
    std::sort(g.nodes.begin(), g.nodes.end(),
              [&](const Node* a, const Node* c) { return position.at(a) < position.at(c); });
    g.shape = b.shape;
    g.anchor = b.members.front();  // the root: merged column exits run with it, before their place
    g.rows = b.reduces;
    for (const Node* join : b.joins) g.joins.push_back({join, join_dim(*join)});
    // Without row reductions a row is the innermost dim.
    if (g.rows) g.reduced_dims = b.k >= 0 ? b.k : 1;
    absl::flat_hash_map<const Node*, Role> roles;
    for (const Node* n : g.nodes) roles[n] = role_of.at(n);
    build_kernel(g, roles);
    jit::log("fuser", "group at ", node_label(*b.members.front()), " of ", g.nodes.size(),
             " nodes (", g.kernel.ops, ") over ", detail::shape_str(g.shape),
             g.rows ? " by rows of its last " : "",
             g.rows ? std::to_string(g.reduced_dims) + " dims" : "", ": ", g.inputs.size(),
             " inputs, ", g.outputs.size(), " outputs, ", g.scalars.size(), " scalars");
    if (jit::log_enabled("fuser")) {
      std::ostringstream members;
      for (const Node* n : g.nodes) {
        members << "  " << n->output()->type().str() << " = " << n->op().name << "(";
        for (size_t i = 0; i < n->num_inputs(); ++i)
          members << (i ? ", " : "") << (n->input(i) ? n->input(i)->type().str() : "none");
        members << ")" << (n->attrs().empty() ? "" : " ...") << "\n";
      }
      jit::log("fuser", "members:\n", members.str());
    }
    result.push_back(std::move(g));
  }
  return result;
}

}  // namespace kiln::fuser
