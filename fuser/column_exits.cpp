// Exits moved up: column reductions, lone elementwise nodes and second joins merged into the
// earlier group whose values they read, so that it folds or writes them while it computes them.
#include <algorithm>
#include <optional>
#include <vector>

#include "fuser/grouping.h"
#include "fuser/members.h"
#include "jit/log.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using jit::Node;
using jit::Value;

bool effect_between(const std::vector<int64_t>& effects, int64_t a, int64_t b) {
  auto it = std::upper_bound(effects.begin(), effects.end(), a);
  return it != effects.end() && *it < b;
}

namespace {

// How many uses of one value the merge below looks at for groups that read it too: a bound, so
// that exits reading a value with a huge fan-out stay linear.
constexpr size_t kMaxReadersLookedAt = 64;
// How many target groups (the latest-running first) an exit is checked against.
constexpr size_t kMaxTargetsTried = 8;

// What kind of exit a group is, if it may move up.
enum class ExitKind : uint8_t {
  kNone,
  kColumns,  // rooted at a column reduction
  kLone,     // a lone elementwise node
  kJoin,     // a cat or stack with the elementwise nodes only it reads
};

ExitKind exit_kind(const Building& exit) {
  if (exit.members.empty()) return ExitKind::kNone;
  if (exit.columns) return ExitKind::kColumns;
  // A lone elementwise node (no kernel of its own: groups have two nodes at least) moves up the
  // same way, as another output of the kernel: an LSTM backward's gradient of c, f * dc'.
  if (exit.members.size() == 1 && !exit.reduces && exit.joins.empty() &&
      is_fusible(*exit.members[0]) && !is_broadcast_view(*exit.members[0]))
    return ExitKind::kLone;
  // A cat or stack (with the elementwise nodes only it reads) whose other pieces an earlier
  // join group computes (a GRU backward's second gate-gradient cat, sharing pieces with the
  // first) becomes another join of that group: its kernel writes the shared pieces twice
  // instead of a second kernel reading them back.
  if (exit.joins.size() == 1 && !exit.reduces && !exit.small) return ExitKind::kJoin;
  return ExitKind::kNone;
}

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
// most kMaxReadersLookedAt readers of each and at most kMaxTargetsTried targets: linear in the
// graph.
class ExitMerge {
 public:
  explicit ExitMerge(Grouping& g) : g_(g), merged_into_(g.groups.size()) {
    for (size_t i = 0; i < merged_into_.size(); ++i) merged_into_[i] = i;
  }

  void run() {
    // Groups were made from the end of the graph: the last made runs first.
    for (size_t e = g_.groups.size(); e-- > 0;) {
      const ExitKind kind = exit_kind(g_.groups[e]);
      if (kind == ExitKind::kNone) continue;
      const std::vector<const Value*> reads = reads_of(e);
      for (size_t t : targets_of(e, reads)) {
        const bool of_join = sums_join(g_.groups[e], g_.groups[t]);
        if (!fits(e, t, kind, of_join) || !available(t, reads, of_join)) continue;
        move(e, t, kind, of_join);
        break;
      }
    }
  }

 private:
  // The group a merged group has become.
  size_t resolve(size_t g) {
    while (merged_into_[g] != g) g = merged_into_[g] = merged_into_[merged_into_[g]];
    return g;
  }
  std::optional<size_t> group_at(const Node* n) {
    auto it = g_.group_of.find(n);
    if (it == g_.group_of.end()) return std::nullopt;
    return resolve(it->second);
  }

  // The values exit e reads from outside.
  std::vector<const Value*> reads_of(size_t e) {
    std::vector<const Value*> reads;
    for (const Node* m : g_.groups[e].members)
      for (const Value* in : m->inputs())
        if (in && group_at(in->node()) != std::optional<size_t>(e)) reads.push_back(in);
    return reads;
  }

  // The groups running earlier that compute or also read what exit e reads, the latest-running
  // first, at most kMaxTargetsTried.
  std::vector<size_t> targets_of(size_t e, const std::vector<const Value*>& reads) {
    std::vector<size_t> candidates;
    auto consider = [&](const Node* n) {
      std::optional<size_t> g = group_at(n);
      if (g && *g != e && g_.run_at[*g] < g_.run_at[e] && !g_.groups[*g].members.empty())
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
    const std::vector<int64_t>& run_at = g_.run_at;
    std::sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      return run_at[a] > run_at[b] || (run_at[a] == run_at[b] && a < b);
    });
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    if (candidates.size() > kMaxTargetsTried) candidates.resize(kMaxTargetsTried);
    return candidates;
  }

  // A lone column sum of one of the target's cats (pieces of the target's shape, cat along the
  // last dim): it folds the pieces.
  static bool sums_join(const Building& exit, const Building& target) {
    if (!exit.columns || exit.members.size() != 1) return false;
    const Node* r = exit.members.front();
    const auto rank = static_cast<int64_t>(target.shape.size());
    for (const Node* join : target.joins)
      if (r->input(0) == join->output() && join->op().name == "cat" &&
          join_dim(*join) == rank - 1 && exit.k == 1)
        return true;
    return false;
  }

  // Whether exit e fits target t's iteration space, joins and size, with no collective between.
  bool fits(size_t e, size_t t, ExitKind kind, bool of_join) const {
    const Building& exit = g_.groups[e];
    const Building& target = g_.groups[t];
    if (!of_join && exit.shape != target.shape) return false;
    if (exit.columns && target.k >= 0 && target.k != exit.k) return false;
    // A join's pieces are written through their slices' strides, one row dim (k = 1) at a time.
    if (exit.columns && !target.joins.empty() && exit.k != 1) return false;
    // Another join: of pieces of the same shape, along the same dim as the target's, on its
    // device.
    if (kind == ExitKind::kJoin &&
        (target.joins.empty() || join_dim(*exit.joins.front()) != join_dim(*target.joins.front()) ||
         exit.joins.front()->output()->type().device !=
             target.joins.front()->output()->type().device))
      return false;
    if (target.members.size() + exit.members.size() > kMaxGroupNodes + 32) return false;
    return !effect_between(g_.effects, g_.run_at[t], g_.run_at[e]);
  }

  // Whether every value the exit reads is available where target t runs.
  bool available(size_t t, const std::vector<const Value*>& reads, bool of_join) {
    for (const Value* v : reads) {
      const Node* p = v->node();
      if (group_at(p) == std::optional<size_t>(t)) {
        if (!computed_in(t, v, of_join)) return false;
        continue;
      }
      if (p->is_input() || p->is_constant()) continue;
      std::optional<size_t> pg = group_at(p);
      if ((pg ? g_.run_at[*pg] : g_.position.at(p)) >= g_.run_at[t]) return false;
    }
    return true;
  }

  // Whether a value target t computes can be read inside its kernel: an element's value, or a
  // row's broadcast back (keepdim). A global reduction's result exists only after every row, a
  // row value without keepdim broadcasts along other dims than the rows. A join's value is
  // written by the kernel, not computed in it: only its column sum (of_join) folds its pieces.
  bool computed_in(size_t t, const Value* v, bool of_join) const {
    const Building& target = g_.groups[t];
    const Node* p = v->node();
    const bool target_join =
        std::find(target.joins.begin(), target.joins.end(), p) != target.joins.end();
    if (target_join && !of_join) return false;
    const Role r = g_.role_of.at(p);
    return r == Role::kElement || (r == Role::kRow && target.k >= 0 &&
                                   v->type().sizes == kept_shape(target.shape, target.k));
  }

  // Moves exit e's members and joins into target t.
  void move(size_t e, size_t t, ExitKind kind, bool of_join) {
    Building& exit = g_.groups[e];
    Building& target = g_.groups[t];
    for (const Node* m : exit.members) {
      g_.group_of[m] = t;
      target.members.push_back(m);
    }
    if (exit.columns) {
      target.k = exit.k;
      target.reduces = true;
    }
    target.joins.insert(target.joins.end(), exit.joins.begin(), exit.joins.end());
    exit.members.clear();
    exit.joins.clear();
    merged_into_[e] = t;
    jit::log("fuser",
             kind == ExitKind::kColumns ? "column exit over "
             : kind == ExitKind::kJoin  ? "join exit over "
                                        : "lone node over ",
             detail::shape_str(exit.shape), " merged into the group over ",
             detail::shape_str(target.shape), of_join ? " (a sum of its cat)" : "");
  }

  Grouping& g_;
  std::vector<size_t> merged_into_;  // per group: the group it moved into (itself if none)
};

}  // namespace

void merge_column_exits(Grouping& grouping) {
  ExitMerge(grouping).run();
}

}  // namespace kiln::fuser
