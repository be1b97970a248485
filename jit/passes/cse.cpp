// Common-subexpression elimination: merges nodes that compute the same op, with equal attributes,
// on the same input values.
#include <algorithm>
#include <cstring>
#include <variant>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"

namespace kiln::jit {

namespace {

uint64_t double_bits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

// Doubles compare by bit pattern: 0.0 and -0.0 are different constants (1/x tells them apart),
// and a NaN attribute equals itself.
size_t attr_hash(const AttrValue& a) {
  return std::visit(
      [&a](const auto& v) -> size_t {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::monostate>)
          return absl::HashOf(a.index());
        else if constexpr (std::is_same_v<V, double>)
          return absl::HashOf(a.index(), double_bits(v));
        else if constexpr (std::is_same_v<V, DType>)
          return absl::HashOf(a.index(), static_cast<int>(v));
        else
          return absl::HashOf(a.index(), v);
      },
      a);
}

bool attr_equal(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a))
    return double_bits(*x) == double_bits(std::get<double>(b));
  return a == b;
}

struct Entry {
  Node* node;
  size_t hash;
};

// The key of a node is (op, attributes, input values); output types are compared as well, which
// is what keeps a wrapped constant apart from a non-wrapped one of the same value and dtype.
size_t node_hash(const Node* n) {
  size_t h = absl::HashOf(&n->op(), n->inputs(), n->attrs().size());
  for (const AttrValue& a : n->attrs()) h = absl::HashOf(h, attr_hash(a));
  return h;
}

struct EntryHash {
  size_t operator()(const Entry& e) const { return e.hash; }
};

struct EntryEq {
  bool operator()(const Entry& x, const Entry& y) const {
    const Node* a = x.node;
    const Node* b = y.node;
    if (x.hash != y.hash || &a->op() != &b->op() || a->inputs() != b->inputs() ||
        a->attrs().size() != b->attrs().size() || a->num_outputs() != b->num_outputs())
      return false;
    for (size_t i = 0; i < a->attrs().size(); ++i)
      if (!attr_equal(a->attrs()[i], b->attrs()[i])) return false;
    for (size_t i = 0; i < a->num_outputs(); ++i)
      if (a->output(i)->type() != b->output(i)->type()) return false;
    return true;
  }
};

}  // namespace

// One walk in graph order. A node's inputs are final by the time it is reached (their producers
// came earlier and were already merged), and a merged node's readers all come later, so one walk
// finds every duplicate, including chains of them. The earlier node of a pair is kept, so its
// outputs are defined before every reader of the later one. Duplicates stay in place, unread,
// until the walk ends; they are not in the table, so nothing merges into them.
bool eliminate_common_subexpressions(Graph& g, PassContext& ctx) {
  absl::flat_hash_set<Entry, EntryHash, EntryEq> seen;
  seen.reserve(g.size());
  int64_t merged = 0, constants = 0;
  std::vector<Node*> duplicates;
  for (Node* n = g.first(); n;) {
    Node* next = n->next();
    if (n->is_input() || n->subgraph() || n->num_outputs() == 0 ||
        passes::is_nondeterministic(n->op())) {
      n = next;
      continue;
    }
    auto [it, inserted] = seen.insert(Entry{n, node_hash(n)});
    if (!inserted) {
      Node* keep = it->node;
      for (size_t i = 0; i < n->num_outputs(); ++i)
        n->output(i)->replace_all_uses_with(keep->output(i));
      (n->is_constant() ? constants : merged) += 1;
      duplicates.push_back(n);
    }
    n = next;
  }
  // Destroyed together (see destroy_dead): a million duplicates of f(x) are a million readers of x.
  std::reverse(duplicates.begin(), duplicates.end());
  passes::NodeMap marked;
  for (const Node* d : duplicates) marked[d] = 1;
  passes::destroy_dead(g, duplicates, marked);
  if (merged) ctx.count("common_subexpression", merged);
  if (constants) ctx.count("duplicate_constant", constants);
  return merged + constants > 0;
}

}  // namespace kiln::jit
