// View sinking: views whose values only leave the graph move to its end.
#include "absl/container/flat_hash_set.h"
#include "jit/passes/passes.h"

namespace kiln::jit {

// A view read by nothing but graph outputs (or by other such views) is computed last. Where it
// was, it stood between elementwise nodes as a use of their value, and the fuser would not merge
// a producer across a use before its consumer: a trace writes each updated optimizer state back
// through a view of the new value, recorded right where the state is assigned. One walk from the
// last node to the first finds the views to move (a node's readers are judged before it); moving
// them to the end in their order keeps the graph topologically sorted.
bool sink_views(Graph& g, PassContext& ctx) {
  absl::flat_hash_set<const Node*> sinking;
  std::vector<Node*> order;  // last first
  for (Node* n = g.last(); n; n = n->prev()) {
    if (n->op().kind != detail::OpKind::View) continue;
    bool only_leaves = true;
    for (size_t i = 0; i < n->num_outputs() && only_leaves; ++i)
      for (const Use& u : n->output(i)->uses()) only_leaves &= sinking.contains(u.user);
    if (!only_leaves) continue;
    sinking.insert(n);
    order.push_back(n);
  }
  // Already at the end: nothing to do for a trailing run of such views.
  size_t trailing = 0;
  for (Node* n = g.last(); n && sinking.contains(n); n = n->prev()) ++trailing;
  if (trailing == order.size()) return false;
  for (size_t i = order.size(); i-- > 0;) g.move_before(order[i], nullptr);
  ctx.count("view moved to the end", static_cast<int64_t>(order.size() - trailing));
  return true;
}

}  // namespace kiln::jit
