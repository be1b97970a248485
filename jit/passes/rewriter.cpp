// The graph passes' shared machinery: safe attribute readers, batch removal of dead nodes and the
// worklist rewrite driver (see rewriter.h for the algorithms).
#include "jit/passes/rewriter.h"

#include <algorithm>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "lib/distributed/collective_op.h"

namespace kiln::jit::passes {

const AttrValue* attr_at(const Node* n, size_t i) {
  return i < n->attrs().size() ? &n->attrs()[i] : nullptr;
}

std::optional<int64_t> int_attr(const Node* n, size_t i) {
  const AttrValue* a = attr_at(n, i);
  if (const int64_t* v = a ? std::get_if<int64_t>(a) : nullptr) return *v;
  return std::nullopt;
}

std::optional<bool> bool_attr(const Node* n, size_t i) {
  const AttrValue* a = attr_at(n, i);
  if (const bool* v = a ? std::get_if<bool>(a) : nullptr) return *v;
  return std::nullopt;
}

const std::vector<int64_t>* ints_attr(const Node* n, size_t i) {
  const AttrValue* a = attr_at(n, i);
  return a ? std::get_if<std::vector<int64_t>>(a) : nullptr;
}

namespace {
std::optional<double> as_number(const AttrValue* a) {
  if (!a) return std::nullopt;
  if (const bool* b = std::get_if<bool>(a)) return *b ? 1.0 : 0.0;
  if (const int64_t* i = std::get_if<int64_t>(a)) return static_cast<double>(*i);
  if (const double* d = std::get_if<double>(a)) return *d;
  return std::nullopt;
}
}  // namespace

std::optional<double> number_attr(const Node* n, size_t i) {
  return as_number(attr_at(n, i));
}

const AttrValue* constant_value(const Value* v) {
  if (!v || !v->node()->is_constant()) return nullptr;
  return attr_at(v->node(), 0);
}

bool is_constant_one(const Value* v) {
  const AttrValue* a = constant_value(v);
  if (!a) return false;
  // An int64 is compared as an integer: 2^53 + 1 must not read as 1 through a double.
  if (const int64_t* i = std::get_if<int64_t>(a)) return *i == 1;
  std::optional<double> d = as_number(a);
  return d && *d == 1.0;
}

Node* producer(const Value* v, const OpDef* op) {
  if (!v || !op || &v->node()->op() != op) return nullptr;
  return v->node();
}

namespace {
// Compared by table entry: these run once per node in every pass.
std::vector<const OpDef*> find_ops(std::initializer_list<const char*> names) {
  std::vector<const OpDef*> found;
  for (const char* name : names)
    if (const OpDef* def = detail::find_op(name)) found.push_back(def);
  return found;
}
}  // namespace

bool has_side_effects(const OpDef& op) {
  return detail::collective_start(op) != nullptr;
}

bool is_nondeterministic(const OpDef& op) {
  static const std::vector<const OpDef*> ops =
      find_ops({"dropout", "rand", "randn", "randint", "bernoulli", "rand_like", "randn_like",
                "randint_like", "normal", "uniform", "multinomial"});
  return has_side_effects(op) || std::find(ops.begin(), ops.end(), &op) != ops.end();
}

// ------------------------------------------------------------------------------ removing nodes
namespace {

// A use list this short is cheap to search; longer ones are detached in one sweep.
constexpr size_t kShortUseList = 16;

// Detaches every reader of v that is marked (its input becomes absent), in time linear in v's
// uses. All uses move at once to a placeholder (replace_all_uses_with splices lists); the
// placeholder's list is then drained from its front, where Node::replace_input finds each entry
// at once: doomed readers get no input, the others get v back.
void detach_readers(Graph& g, Value* v, const NodeMap& marked) {
  std::vector<size_t> output_slots;
  for (size_t i = 0; i < g.outputs().size(); ++i)
    if (g.outputs()[i] == v) output_slots.push_back(i);
  Value* tmp = g.constant(AttrValue(false), kBool);
  v->replace_all_uses_with(tmp);
  while (tmp->has_uses()) {
    Use u = tmp->uses().front();
    u.user->replace_input(u.index, marked.get(u.user) ? nullptr : v);
  }
  for (size_t i : output_slots) g.set_output(i, v);
  g.destroy(tmp->node());
}

}  // namespace

int64_t& NodeMap::operator[](const Node* n) {
  if (n->num_outputs() == 0) return others_.try_emplace(n, fill_).first->second;
  size_t i = static_cast<size_t>(n->output(0)->id());
  if (i >= by_id_.size()) by_id_.resize(std::max(i + 1, by_id_.size() * 2), fill_);
  return by_id_[i];
}

int64_t NodeMap::get(const Node* n) const {
  if (n->num_outputs() == 0) {
    auto it = others_.find(n);
    return it == others_.end() ? fill_ : it->second;
  }
  size_t i = static_cast<size_t>(n->output(0)->id());
  return i < by_id_.size() ? by_id_[i] : fill_;
}

int64_t destroy_dead(Graph& g, const std::vector<Node*>& dead, const NodeMap& marked) {
  if (dead.empty()) return 0;
  std::vector<bool> listed;  // by value id
  std::vector<Value*> long_lists;
  for (const Node* d : dead)
    for (Value* in : d->inputs()) {
      if (!in || in->uses().size() <= kShortUseList) continue;
      size_t id = static_cast<size_t>(in->id());
      if (id >= listed.size()) listed.resize(std::max(id + 1, listed.size() * 2), false);
      if (listed[id]) continue;
      listed[id] = true;
      long_lists.push_back(in);
    }
  for (Value* v : long_lists) detach_readers(g, v, marked);
  for (Node* d : dead) g.destroy(d);
  return static_cast<int64_t>(dead.size());
}

int64_t remove_dead_nodes(Graph& g, const std::vector<Node*>& candidates) {
  absl::flat_hash_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  // Uses of each node's outputs not yet known to come from doomed readers (-1: not counted yet);
  // a node is doomed when this reaches zero, which happens once, so each is found at most once.
  NodeMap unread(-1);
  NodeMap doomed(0);
  std::vector<Node*> dead, stack;
  auto uses_of = [&unread](const Node* n) -> int64_t& {
    int64_t& left = unread[n];
    if (left < 0) {
      left = 0;
      for (const auto& out : n->outputs()) left += static_cast<int64_t>(out->uses().size());
    }
    return left;
  };
  auto removable = [&outputs, &doomed](const Node* n) {
    if (n->is_input() || doomed.get(n) || has_side_effects(n->op())) return false;
    for (const auto& out : n->outputs())
      if (outputs.contains(out.get())) return false;
    return true;
  };
  auto doom = [&](Node* n) {
    doomed[n] = 1;
    dead.push_back(n);
    stack.push_back(n);
  };
  for (Node* c : candidates)
    if (removable(c) && uses_of(c) == 0) doom(c);
  while (!stack.empty()) {
    Node* d = stack.back();
    stack.pop_back();
    for (Value* in : d->inputs()) {
      if (!in) continue;
      Node* p = in->node();
      int64_t& left = uses_of(p);
      if (--left == 0 && removable(p)) doom(p);
    }
  }
  // Readers first: a node's readers all come later in the graph. Few nodes are sorted by
  // position; many are collected by one backward walk, which beats sorting scattered nodes.
  if (dead.size() * 16 < g.size()) {
    std::sort(dead.begin(), dead.end(),
              [](const Node* a, const Node* b) { return a->position() > b->position(); });
  } else {
    dead.clear();
    for (Node* n = g.last(); n; n = n->prev())
      if (doomed.get(n)) dead.push_back(n);
  }
  return destroy_dead(g, dead, doomed);
}

// ------------------------------------------------------------------------------------ Rewriter
namespace {
constexpr uint8_t kQueued = 1;
constexpr uint8_t kReplaced = 2;
}  // namespace

Rewriter::Rewriter(Graph& g, PassContext& ctx) : g_(g), ctx_(ctx) {}

uint8_t& Rewriter::state(int64_t id) {
  size_t i = static_cast<size_t>(id);
  if (i >= state_.size()) state_.resize(std::max(i + 1, state_.size() * 2), 0);
  return state_[i];
}

void Rewriter::push(Node* n) {
  // Graph inputs and constants match no rule; nodes without outputs cannot be replaced.
  if (n->is_input() || n->is_constant() || n->num_outputs() == 0) return;
  int64_t id = n->output(0)->id();
  uint8_t& s = state(id);
  if (s) return;  // already queued, or replaced (and unread)
  s = kQueued;
  stack_.push_back({n, id});
}

Value* Rewriter::create(const OpDef& op, const std::vector<Value*>& inputs, Attrs attrs,
                        ValueType type, Node* before) {
  Node* n = g_.create(op, inputs, std::move(attrs), {std::move(type)}, before);
  created_and_replaced_.push_back(n);
  push(n);
  return n->output();
}

bool Rewriter::run(Rule rule) {
  stack_.reserve(g_.size());
  // Pushed last to first, so that nodes are first visited in graph order (operands before users).
  for (Node* n = g_.last(); n; n = n->prev()) push(n);
  bool changed = false;
  std::vector<Use> moved;
  while (!stack_.empty()) {
    Item item = stack_.back();
    stack_.pop_back();
    uint8_t& s = state(item.id);
    if (s != kQueued) continue;
    s = 0;
    Node* n = item.node;
    if (n->num_outputs() != 1) continue;
    const char* name = "unnamed";
    Value* r = rule(*this, n, &name);
    Value* old = n->output();
    // A rule must not change what the graph computes; whatever it built is removed at the end.
    if (!r || r == old || r->type() != old->type()) continue;
    moved = old->uses();
    old->replace_all_uses_with(r);
    state(item.id) = kReplaced;  // `s` may dangle: create() can grow the vector
    created_and_replaced_.push_back(n);
    for (const Use& u : moved) push(u.user);
    ctx_.count(name);
    changed = true;
  }
  remove_dead_nodes(g_, created_and_replaced_);
  created_and_replaced_.clear();
  return changed;
}

}  // namespace kiln::jit::passes
