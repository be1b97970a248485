// Graph, Node and Value: construction, rewiring, the printer and the verifier.
#include "jit/ir.h"

#include <ostream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "kiln/error.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
constexpr int64_t kGap = int64_t{1} << 20;

const char* short_name(DType t) {
  switch (t) {
    case DType::Bool:
      return "b8";
    case DType::Int32:
      return "i32";
    case DType::Int64:
      return "i64";
    case DType::Float32:
      return "f32";
    case DType::Float64:
      return "f64";
  }
  return "?";
}

const OpDef& graph_op(const char* name, std::vector<std::string> attr_names) {
  detail::OpDef def{name, detail::OpKind::Graph, 0, detail::DTypeRule::Custom};
  def.attr_names = std::move(attr_names);
  return detail::register_op(std::move(def));
}
}  // namespace

const OpDef& input_op() {
  static const OpDef& def = graph_op("input", {"index"});
  return def;
}
const OpDef& constant_op() {
  static const OpDef& def = graph_op("constant", {"value", "dtype"});
  return def;
}

std::string ValueType::str() const {
  std::string s = short_name(dtype);
  s += detail::shape_str(sizes);
  if (device != kCPU) {
    std::ostringstream os;
    os << device;
    s += "@" + os.str();
  }
  return s;
}

ValueType type_of(const Tensor& t) {
  return ValueType{t.dtype(), t.sizes(), t.device(), t.impl()->wrapped_number};
}

// ------------------------------------------------------------------------------------------ Value
void Value::replace_all_uses_with(Value* other) {
  if (other == this) return;
  std::vector<Use> uses = std::move(uses_);
  uses_.clear();
  for (const Use& u : uses) {
    u.user->inputs_[u.index] = other;
    if (other) other->uses_.push_back(u);
  }
  if (output_uses_ == 0) return;
  Graph* g = node_->owning_graph();
  for (Value*& out : g->outputs_)
    if (out == this) {
      out = other;
      --output_uses_;
      if (other) ++other->output_uses_;
    }
}

// ------------------------------------------------------------------------------------------- Node
Node::Node(Graph* graph, const OpDef* op, Attrs attrs)
    : graph_(graph), op_(op), attrs_(std::move(attrs)) {}
Node::~Node() = default;

void Node::replace_input(size_t i, Value* v) {
  Value* old = inputs_.at(i);
  if (old == v) return;
  if (old) {
    auto& uses = old->uses_;
    for (size_t k = 0; k < uses.size(); ++k)
      if (uses[k].user == this && uses[k].index == i) {
        uses[k] = uses.back();
        uses.pop_back();
        break;
      }
  }
  inputs_[i] = v;
  if (v) v->uses_.push_back({this, i});
}

void Node::set_subgraph(std::unique_ptr<Graph> g) {
  subgraph_ = std::move(g);
}
bool Node::is_input() const {
  return op_ == &input_op();
}
bool Node::is_constant() const {
  return op_ == &constant_op();
}

// ------------------------------------------------------------------------------------------ Graph
Graph::Graph() = default;

Graph::~Graph() {
  // Nested subgraphs are released through an explicit stack, so depth never reaches the C stack.
  std::vector<std::unique_ptr<Graph>> pending;
  for (Node* n = first_; n;) {
    Node* next = n->next_;
    if (n->subgraph_) pending.push_back(std::move(n->subgraph_));
    delete n;
    n = next;
  }
  first_ = last_ = nullptr;
  while (!pending.empty()) {
    std::unique_ptr<Graph> g = std::move(pending.back());
    pending.pop_back();
    for (Node* n = g->first_; n; n = n->next_)
      if (n->subgraph_) pending.push_back(std::move(n->subgraph_));
  }
}

void Graph::link_before(Node* node, Node* before) {
  if (!before) {
    node->prev_ = last_;
    node->next_ = nullptr;
    if (last_)
      last_->next_ = node;
    else
      first_ = node;
    last_ = node;
    node->position_ = node->prev_ ? node->prev_->position_ + kGap : 0;
  } else {
    node->next_ = before;
    node->prev_ = before->prev_;
    if (before->prev_)
      before->prev_->next_ = node;
    else
      first_ = node;
    before->prev_ = node;
    int64_t lo = node->prev_ ? node->prev_->position_ : before->position_ - 2 * kGap;
    if (before->position_ - lo < 2) {
      renumber();
    } else {
      node->position_ = lo + (before->position_ - lo) / 2;
    }
  }
  ++size_;
}

void Graph::unlink(Node* node) {
  if (node->prev_)
    node->prev_->next_ = node->next_;
  else
    first_ = node->next_;
  if (node->next_)
    node->next_->prev_ = node->prev_;
  else
    last_ = node->prev_;
  node->prev_ = node->next_ = nullptr;
  --size_;
}

void Graph::renumber() {
  int64_t pos = 0;
  for (Node* n = first_; n; n = n->next_, pos += kGap) n->position_ = pos;
}

Value* Graph::add_input(ValueType type) {
  // Inputs stay first: insert after the last input node.
  Node* before = inputs_.empty() ? first_ : inputs_.back()->node()->next_;
  Node* n = create(input_op(), {}, {int64_t(inputs_.size())}, {std::move(type)}, before);
  inputs_.push_back(n->output());
  return n->output();
}

Value* Graph::constant(const AttrValue& value, DType dtype, bool wrapped, Node* before) {
  ValueType t{dtype, {}, kCPU, wrapped};
  return create(constant_op(), {}, {value, dtype}, {t}, before)->output();
}

Node* Graph::create(const OpDef& op, const std::vector<Value*>& inputs, Attrs attrs,
                    std::vector<ValueType> output_types, Node* before) {
  Node* n = new Node(this, &op, std::move(attrs));
  n->inputs_ = inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i]) inputs[i]->uses_.push_back({n, i});
  n->outputs_.reserve(output_types.size());
  for (size_t i = 0; i < output_types.size(); ++i)
    n->outputs_.emplace_back(new Value(n, i, std::move(output_types[i]), next_value_id_++));
  link_before(n, before);
  return n;
}

Node* Graph::create(const std::string& op, const std::vector<Value*>& inputs, Attrs attrs,
                    std::vector<ValueType> output_types, Node* before) {
  const OpDef* def = detail::find_op(op);
  KILN_CHECK(def, "jit: no op named '", op, "'");
  return create(*def, inputs, std::move(attrs), std::move(output_types), before);
}

void Graph::destroy(Node* node) {
  for (const auto& out : node->outputs_) {
    KILN_CHECK(!out->has_uses() && !is_output(out.get()), "jit: destroying ", node->kind(),
               " whose output %", out->id(), " is still used");
  }
  for (size_t i = 0; i < node->inputs_.size(); ++i) node->replace_input(i, nullptr);
  if (node->is_input()) {
    for (size_t i = 0; i < inputs_.size(); ++i)
      if (inputs_[i] == node->output()) {
        inputs_.erase(inputs_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    for (size_t i = 0; i < inputs_.size(); ++i) inputs_[i]->node()->attrs_[0] = int64_t(i);
  }
  unlink(node);
  delete node;
}

void Graph::move_before(Node* node, Node* before) {
  if (node == before) return;
  unlink(node);
  link_before(node, before);
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(size_);
  for (Node* n = first_; n; n = n->next_) out.push_back(n);
  return out;
}

// ---------------------------------------------------------------------------------------- printer
namespace {
void print_node_line(std::ostream& os, const Node* n, int indent) {
  os << std::string(static_cast<size_t>(indent) * 2, ' ');
  for (size_t i = 0; i < n->num_outputs(); ++i) {
    const Value* v = n->output(i);
    os << (i ? ", " : "") << '%' << v->id() << " : " << v->type().str();
  }
  os << (n->num_outputs() ? " = " : "") << n->kind() << '(';
  bool first = true;
  for (const Value* in : n->inputs()) {
    os << (first ? "" : ", ");
    if (in)
      os << '%' << in->id();
    else
      os << "none";
    first = false;
  }
  const auto& names = n->op().attr_names;
  for (size_t i = 0; i < n->attrs().size(); ++i) {
    os << (first ? "" : ", ");
    if (i < names.size()) os << names[i] << '=';
    os << detail::attr_str(n->attrs()[i]);
    first = false;
  }
  os << ')';
}
}  // namespace

void Graph::print(std::ostream& os) const {
  // Explicit stack of (graph, next node) frames: a group's block is printed where it stands.
  struct Frame {
    const Graph* g;
    const Node* next;
    int indent;
  };
  std::vector<Frame> stack{{this, first_, 0}};
  os << "graph(";
  for (size_t i = 0; i < inputs_.size(); ++i)
    os << (i ? ", " : "") << '%' << inputs_[i]->id() << " : " << inputs_[i]->type().str();
  os << "):\n";
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (!f.next) {
      std::string pad(static_cast<size_t>(f.indent) * 2 + 2, ' ');
      os << pad << "return (";
      for (size_t i = 0; i < f.g->outputs_.size(); ++i)
        os << (i ? ", " : "") << '%' << f.g->outputs_[i]->id();
      os << ")\n";
      if (stack.size() > 1) os << std::string(static_cast<size_t>(f.indent) * 2, ' ') << "}\n";
      stack.pop_back();
      continue;
    }
    const Node* n = f.next;
    f.next = n->next_;
    if (n->is_input() && f.indent == 0) continue;  // shown in the header
    print_node_line(os, n, f.indent + 1);
    if (n->subgraph_) {
      os << " {\n";
      const Graph* sub = n->subgraph_.get();
      std::string pad(static_cast<size_t>(f.indent) * 2 + 4, ' ');
      os << pad << "block(";
      for (size_t i = 0; i < sub->inputs_.size(); ++i)
        os << (i ? ", " : "") << '%' << sub->inputs_[i]->id() << " : "
           << sub->inputs_[i]->type().str();
      os << "):\n";
      int indent = f.indent + 1;
      stack.push_back({sub, sub->first_, indent});
      // The closing brace is printed when the block's frame ends; see the return line above.
      continue;
    }
    os << '\n';
  }
}

std::string Graph::str() const {
  std::ostringstream os;
  print(os);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Graph& g) {
  g.print(os);
  return os;
}

// --------------------------------------------------------------------------------------- verifier
void Graph::verify() const {
  // Values defined so far (in order) and where each graph's walk stands.
  absl::flat_hash_set<const Value*> defined;
  absl::flat_hash_set<std::pair<const Node*, size_t>> use_slots;
  size_t input_slots = 0;
  std::vector<const Graph*> graphs{this};
  while (!graphs.empty()) {
    const Graph* g = graphs.back();
    graphs.pop_back();
    size_t count = 0;
    bool past_inputs = false;
    const Node* prev = nullptr;
    for (const Node* n = g->first_; n; prev = n, n = n->next_) {
      ++count;
      KILN_CHECK(n->graph_ == g, "jit verify: ", n->kind(),
                 " is linked into a graph it does not "
                 "belong to");
      KILN_CHECK(n->prev_ == prev, "jit verify: broken node list at ", n->kind());
      KILN_CHECK(!prev || prev->position_ < n->position_,
                 "jit verify: node positions do not increase at ", n->kind());
      if (n->is_input()) {
        KILN_CHECK(!past_inputs, "jit verify: graph input %", n->output()->id(),
                   " comes after other nodes");
        size_t idx = static_cast<size_t>(detail::attr_int(n->attrs_.at(0)));
        KILN_CHECK(idx < g->inputs_.size() && g->inputs_[idx] == n->output(),
                   "jit verify: graph input %", n->output()->id(), " has index ", idx,
                   " but is not that input");
      } else {
        past_inputs = true;
      }
      KILN_CHECK(n->op_->arity < 0 || n->op_->kind == detail::OpKind::Graph ||
                     n->inputs_.size() >= static_cast<size_t>(n->op_->arity) || n->op_->arity == 0,
                 "jit verify: ", n->kind(), " has ", n->inputs_.size(), " inputs");
      for (size_t i = 0; i < n->inputs_.size(); ++i) {
        const Value* in = n->inputs_[i];
        if (!in) continue;
        KILN_CHECK(defined.contains(in), "jit verify: ", n->kind(), " (output %",
                   n->num_outputs() ? n->output()->id() : -1, ") uses %", in->id(),
                   " before it is defined (not SSA or not in topological order)");
        ++input_slots;
      }
      for (size_t i = 0; i < n->outputs_.size(); ++i) {
        const Value* v = n->outputs_[i].get();
        KILN_CHECK(v->node_ == n && v->index_ == i, "jit verify: output %", v->id(),
                   " does not point back at its node");
        KILN_CHECK(defined.insert(v).second, "jit verify: %", v->id(), " is defined twice");
        // Every use entry names a distinct input slot that holds v; with the counts equal (checked
        // below), every input slot is then listed exactly once. Linear, whatever the fan-out.
        for (const Use& u : v->uses_) {
          KILN_CHECK(u.index < u.user->inputs_.size() && u.user->inputs_[u.index] == v,
                     "jit verify: stale use of %", v->id(), " by ", u.user->kind());
          KILN_CHECK(use_slots.insert({u.user, u.index}).second, "jit verify: use of %", v->id(),
                     " by ", u.user->kind(), " is listed twice");
        }
      }
      if (n->is_constant()) {
        KILN_CHECK(
            n->attrs_.size() == 2 && n->outputs_.size() == 1 && n->output()->type().sizes.empty() &&
                n->output()->type().dtype == detail::attr_dtype(n->attrs_[1]),
            "jit verify: malformed constant %", n->outputs_.empty() ? -1 : n->output()->id());
      }
      if (n->subgraph_) graphs.push_back(n->subgraph_.get());
    }
    KILN_CHECK(count == g->size_, "jit verify: node count ", g->size_, " but ", count,
               " nodes are linked");
    for (const Value* o : g->outputs_)
      KILN_CHECK(o && defined.contains(o), "jit verify: a graph output is not defined in it");
  }
  KILN_CHECK(use_slots.size() == input_slots, "jit verify: ", input_slots, " node inputs but ",
             use_slots.size(), " use-list entries");
}

}  // namespace kiln::jit
