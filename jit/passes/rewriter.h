// Shared machinery of the graph passes: attribute readers that never throw, dead-node removal, and
// the worklist driver that applies rewrite rules to a fixpoint (canonicalize, stabilize).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "jit/ir.h"
#include "jit/passes/passes.h"

namespace kiln::jit::passes {

// Attribute readers for pattern matching: a malformed or missing attribute means "no match",
// never an exception in the middle of a rewrite.
const AttrValue* attr_at(const Node* n, size_t i);
std::optional<int64_t> int_attr(const Node* n, size_t i);
std::optional<bool> bool_attr(const Node* n, size_t i);
const std::vector<int64_t>* ints_attr(const Node* n, size_t i);
// bool, int64_t or double attribute as a number.
std::optional<double> number_attr(const Node* n, size_t i);

// The value of a constant node's output, or nothing when v is not a constant.
const AttrValue* constant_value(const Value* v);
// True when v is a constant equal to 1 (true, 1 or 1.0).
bool is_constant_one(const Value* v);

// The node producing v when it is of op `op` (compared by table entry), else null.
Node* producer(const Value* v, const OpDef* op);

// Removing nodes. Graph::destroy unlinks a node from each input's use list by searching that list,
// so destroying the readers of a value one by one costs the square of its fan-out (a million exp(x)
// merged by CSE). These functions destroy a whole set at once: for every value with a long use
// list they detach all doomed readers in one linear sweep (detach_readers in rewriter.cpp), then
// destroy the set, readers before producers.
//
// A number per node, indexed by the id of the node's first output: ids are dense and never
// reused, so this is a flat array, not a hash table (a pass over a million nodes touches each
// entry once or twice, and hashing them cost more than the rest of the pass). Nodes without outputs
// go to a side table.
class NodeMap {
 public:
  explicit NodeMap(int64_t fill = 0) : fill_(fill) {}
  int64_t& operator[](const Node* n);
  int64_t get(const Node* n) const;

 private:
  int64_t fill_;
  std::vector<int64_t> by_id_;
  absl::flat_hash_map<const Node*, int64_t> others_;
};

// Destroys `dead`, which must be ordered readers first (reverse graph order) and closed: every
// reader of a node in it is in it too, and none of its outputs is a graph output. `marked` is
// nonzero exactly for the nodes in `dead`.
int64_t destroy_dead(Graph& g, const std::vector<Node*>& dead, const NodeMap& marked);
// Destroys every candidate nothing reads (no uses, not a graph output, not a graph input), then
// every producer left unread by those, and so on. Candidates that are still read are kept.
int64_t remove_dead_nodes(Graph& g, const std::vector<Node*>& candidates);

// Ops whose result is not a function of their inputs (random draws, collectives): never merged,
// folded, recomputed or rewritten.
bool is_nondeterministic(const OpDef& op);
// Ops that act outside the graph (collectives: every rank must run each of them, in the same
// order): never removed, even when nothing reads their result.
bool has_side_effects(const OpDef& op);

// Applies a rule set to a graph until no rule fires.
//
// The worklist starts with every node in graph order. When a rule replaces a node's output, the
// nodes it created are queued (create() does it) and so are the users of the replaced value, the
// only nodes whose patterns can have changed: rules look at a node, its attributes and its
// inputs' producers, and producers are immutable once created (rules make new nodes rather than
// edit old ones). The replaced node, and then every producer left without a reader, is destroyed
// at the end (remove_dead_nodes), all at once; until then a replaced node is marked and never
// queued again. Each node is queued at most once at a time, marked by the id of its first output
// (ids are dense and never reused).
class Rewriter {
 public:
  // A rule looks at one node and returns the value that replaces its (single) output, or null;
  // `rule` receives the name it is counted under.
  using Rule = Value* (*)(Rewriter& rw, Node* n, const char** rule);

  Rewriter(Graph& g, PassContext& ctx);
  Graph& graph() { return g_; }

  // Creates a node before `before` with one output of `type`, and queues it.
  Value* create(const OpDef& op, const std::vector<Value*>& inputs, Attrs attrs, ValueType type,
                Node* before);

  // Runs `rule` over the graph to a fixpoint, then removes what the rewrites left unread; true when
  // anything changed.
  bool run(Rule rule);

 private:
  struct Item {
    Node* node;
    int64_t id;
  };
  void push(Node* n);
  uint8_t& state(int64_t id);

  Graph& g_;
  PassContext& ctx_;
  std::vector<Item> stack_;
  std::vector<uint8_t> state_;               // by output id: kQueued, kReplaced or 0
  std::vector<Node*> created_and_replaced_;  // candidates for removal at the end
};

}  // namespace kiln::jit::passes
