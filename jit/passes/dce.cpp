// Dead-code elimination: removes every node none of whose outputs reaches a graph output.
#include "absl/container/flat_hash_set.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"

namespace kiln::jit {

// One walk from the last node to the first finds the dead: the list is in topological order, so
// every reader of a node comes after it and has already been judged when the walk reaches the
// node, which is live when it is a graph input (the graph's signature stays), has side effects (a
// collective), produces a graph output, or has a live reader. The dead are then destroyed
// together, readers first.
bool eliminate_dead_code(Graph& g, PassContext& ctx) {
  absl::flat_hash_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  passes::NodeMap dead_set;
  std::vector<Node*> dead;  // readers first
  for (Node* n = g.last(); n; n = n->prev()) {
    bool live = n->is_input() || passes::has_side_effects(n->op());
    for (size_t i = 0; i < n->num_outputs() && !live; ++i) {
      const Value* v = n->output(i);
      live = outputs.contains(v);
      for (const Use& u : v->uses()) {
        if (live) break;
        live = !dead_set.get(u.user);
      }
    }
    if (!live) {
      dead_set[n] = 1;
      dead.push_back(n);
    }
  }
  int64_t removed = passes::destroy_dead(g, dead, dead_set);
  if (removed) ctx.count("dead_node", removed);
  return removed > 0;
}

}  // namespace kiln::jit
