// The grouping driver: grows fusion groups from their roots in reverse graph order, asks the
// fusion decision about each producer, and turns the groups into kernels; and the fusion switch.
#include "fuser/fuse.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/fusion_decision.h"
#include "fuser/grouping.h"
#include "fuser/members.h"
#include "jit/log.h"
#include "jit/passes/rewriter.h"
#include "lib/env.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using jit::Node;

namespace {
// The fusion switch: KILN_FUSE, overridden by set_fusion_enabled.
struct FusionState {
  std::atomic<int> enabled{-1};  // atomic; -1: not read from KILN_FUSE yet
};

FusionState& fusion_state() {
  static FusionState state;
  return state;
}
}  // namespace

bool fusion_enabled() {
  std::atomic<int>& enabled = fusion_state().enabled;
  int v = enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    v = detail::env_bool("KILN_FUSE") ? 1 : 0;
    enabled.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

bool set_fusion_enabled(bool on) {
  const bool was = fusion_enabled();
  fusion_state().enabled.store(on ? 1 : 0, std::memory_order_relaxed);
  return was;
}

size_t start_group(Grouping& g, Building group, Role root_role) {
  const size_t id = g.groups.size();
  const Node* root = group.members.front();
  g.group_of[root] = id;
  g.role_of[root] = root_role;
  g.run_at.push_back(g.position.at(root));
  g.groups.push_back(std::move(group));
  return id;
}

Grouping::Grouping(const jit::Graph& g) : graph(g) {
  for (const Node* n = g.first(); n; n = n->next()) {
    position[n] = static_cast<int64_t>(order.size());
    if (!n->is_input() && jit::passes::has_side_effects(n->op())) effects.push_back(position[n]);
    order.push_back(n);
  }
}

namespace {

// KILN_LOG=fuser: one line per producer a group did not take, with the reason. Passes over a
// group may refuse a producer and take it later, so reasons are kept (the latest per producer)
// and printed once the group is complete, for the producers still outside it.
class Refusals {
 public:
  Refusals() : logging_(jit::log_enabled("fuser")) {}

  void note(const Node* p, Reason why) {
    if (!logging_) return;
    auto [it, fresh] = at_.try_emplace(p, refused_.size());
    if (fresh)
      refused_.emplace_back(p, std::move(why));
    else
      refused_[it->second].second = std::move(why);
  }

  void print(const Grouping& g, size_t id, const Node& root) {
    if (!logging_) return;
    const std::string group = node_label(root);
    for (const auto& [p, why] : refused_) {
      auto it = g.group_of.find(p);
      if (it == g.group_of.end() || it->second != id)
        jit::log("fuser", node_label(*p), " not merged into the group at ", group, ": ",
                 why.to_string());
    }
    refused_.clear();
    at_.clear();
  }

 private:
  bool logging_;
  std::vector<std::pair<const Node*, Reason>> refused_;
  absl::flat_hash_map<const Node*, size_t> at_;  // index in refused_
};

// A group a node starts, when it can end one: its iteration space and the root's role.
struct Root {
  Building group;
  Role role = Role::kElement;
};

std::optional<Root> root_of(const Node& consumer) {
  Root r;
  Building& st = r.group;
  if (is_fusible(consumer) && !is_broadcast_view(consumer)) {
    st.shape = consumer.output()->type().sizes;
  } else if (is_row_wise(consumer)) {
    st.shape = consumer.output()->type().sizes;
    st.k = 1;
    st.reduces = true;
  } else if (is_join_exit(consumer)) {
    st.shape = consumer.input(0)->type().sizes;
    st.joins.push_back(&consumer);
  } else if (std::optional<int> lead = fused_column_dims(consumer)) {
    st.shape = consumer.input(0)->type().sizes;
    st.k = static_cast<int>(st.shape.size()) - *lead;
    st.reduces = true;
    st.columns = true;
    r.role = Role::kColumn;
  } else if (std::optional<int> k = fused_reduction_dims(consumer)) {
    st.shape = consumer.input(0)->type().sizes;
    st.reduces = true;
    if (*k == static_cast<int>(st.shape.size()) && folds_once(consumer)) {
      // Over every dim: each call folds its rows into partials, combined at the end. A formula
      // that folds twice (logsumexp, var) needs the first fold's final value: one row then.
      r.role = Role::kGlobal;
    } else {
      r.role = Role::kRow;
      st.k = *k;
    }
  } else {
    return std::nullopt;
  }
  st.members.push_back(&consumer);
  return r;
}

// Passes over the members until no producer joins: a producer refused because one of its uses
// was outside the group may join once that user has.
void grow(Grouping& g, size_t id, Refusals& refusals) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t m = 0; m < g.groups[id].members.size(); ++m) {
      for (const jit::Value* in : g.groups[id].members[m]->inputs()) {
        if (!in) continue;
        const Node* p = in->node();
        if (p->is_input() || p->is_constant() || g.group_of.contains(p)) continue;
        if (std::optional<Reason> full = why_not_full(g.groups[id])) {
          refusals.note(p, std::move(*full));
          break;
        }
        Merge merge;
        if (std::optional<Reason> why = why_not(g, id, *p, merge)) {
          refusals.note(p, std::move(*why));
          continue;
        }
        apply_merge(g, id, *p, merge);
        changed = true;
      }
    }
  }
}

// A lone elementwise node on the CPU computes a transcendental over this many elements or more:
// it runs its own kernel, not its reference kernel. The reference kernels compute math ops on
// blocks of lanes (lib/math/lanes.h); a kernel of one node (one compile, kept on disk) computes the
// same bits 1.4-2.6x faster still (LLVM's code; sin of 16M floats: 20 -> 9 ms, atan 27 -> 15 ms).
// Below, the compile would not pay for itself.
constexpr int64_t kLoneKernelElements = int64_t{1} << 16;

bool has_costly_primitive(const Kernel& k) {
  return std::any_of(k.body.begin(), k.body.end(),
                     [](const Instr& in) { return is_costly(in.prim); });
}

// The group as the executor runs it, with its kernel; nullopt for a lone node on the CPU, which
// runs its reference kernel (or its formula straight into its output), unless it computes a
// transcendental over a large tensor (kLoneKernelElements). On a device, where there is no
// reference kernel, a lone node is a group of one: its own kernel.
std::optional<FusionGroup> fusion_group(const Grouping& grouping, const Building& b) {
  const bool lone_kernel = b.members.size() == 1 && b.joins.empty() &&
                           !is_broadcast_view(*b.members[0]) &&
                           (b.reduces || is_fusible(*b.members[0]));
  const bool on_device = lone_kernel && b.members[0]->output()->type().device.is_cuda();
  const bool large_elementwise =
      lone_kernel && !b.reduces && detail::shape_numel(b.shape) >= kLoneKernelElements;
  if (b.members.size() < 2 && !on_device && !large_elementwise) return std::nullopt;
  FusionGroup g;
  g.nodes = b.members;
  std::sort(g.nodes.begin(), g.nodes.end(), [&](const Node* a, const Node* c) {
    return grouping.position.at(a) < grouping.position.at(c);
  });
  g.shape = b.shape;
  g.anchor = b.members.front();  // the root: merged column exits run with it, before their place
  g.rows = b.reduces;
  for (const Node* join : b.joins) g.joins.push_back({join, join_dim(*join)});
  // Without row reductions a row is the innermost dim.
  if (g.rows) g.reduced_dims = b.k >= 0 ? b.k : 1;
  absl::flat_hash_map<const Node*, Role> roles;
  for (const Node* n : g.nodes) roles[n] = grouping.role_of.at(n);
  build_kernel(g, roles);
  if (b.members.size() == 1 && !on_device && !has_costly_primitive(g.kernel)) return std::nullopt;
  return g;
}

// KILN_LOG=fuser: the group, its kernel's size, and its members' types.
void log_group(const FusionGroup& g) {
  jit::log("fuser", "group at ", node_label(*g.anchor), " of ", g.nodes.size(), " nodes (",
           g.kernel.ops, ") over ", detail::shape_str(g.shape),
           g.rows ? " by rows of its last " : "",
           g.rows ? std::to_string(g.reduced_dims) + " dims" : "", ": ", g.inputs.size(),
           " inputs, ", g.outputs.size(), " outputs, ", g.scalars.size(), " scalars");
  if (!jit::log_enabled("fuser")) return;
  std::ostringstream members;
  for (const Node* n : g.nodes) {
    members << "  " << n->output()->type().str() << " = " << n->op().name << "(";
    for (size_t i = 0; i < n->num_inputs(); ++i)
      members << (i ? ", " : "") << (n->input(i) ? n->input(i)->type().str() : "none");
    members << ")" << (n->attrs().empty() ? "" : " ...") << "\n";
  }
  jit::log("fuser", "members:\n", members.str());
}

}  // namespace

std::vector<FusionGroup> find_groups(const jit::Graph& graph) {
  Grouping g(graph);
  Refusals refusals;
  for (size_t i = g.order.size(); i-- > 0;) {
    const Node* consumer = g.order[i];
    if (g.group_of.contains(consumer)) continue;
    std::optional<Root> root = root_of(*consumer);
    if (!root) continue;
    const size_t id = start_group(g, std::move(root->group), root->role);
    grow(g, id, refusals);
    refusals.print(g, id, *consumer);
  }
  merge_column_exits(g);
  std::vector<FusionGroup> result;
  for (const Building& b : g.groups) {
    std::optional<FusionGroup> group = fusion_group(g, b);
    if (!group) continue;
    log_group(*group);
    result.push_back(std::move(*group));
  }
  return result;
}

}  // namespace kiln::fuser
