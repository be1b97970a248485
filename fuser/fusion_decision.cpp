// The fusion decision: whether a producer may join a group, how it joins (Merge), and if it may
// not, why (Reason, which KILN_LOG=fuser prints).
#include "fuser/fusion_decision.h"

#include "fuser/members.h"
#include "lib/broadcast.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::fuser {

using detail::broadcasts_to;
using jit::Node;
using Kind = Reason::Kind;

std::string node_label(const Node& n) {
  const std::string id = n.num_outputs() > 0 ? std::to_string(n.output(0)->id()) : "?";
  return "%" + id + " " + n.op().name;
}

namespace {
// Who else reads a value, for the reasons that name one.
std::string read_elsewhere(const Node* reader) {
  return reader ? "also read by " + node_label(*reader) : std::string("a graph output");
}

// The text of the reasons a row-wise op or a reduction is refused for, after their prefix.
std::string row_text(const Reason& r) {
  switch (r.kind) {
    case Kind::kRowWiseAfterJoin:
    case Kind::kReductionAfterJoin:
      return "the group ends in a cat or stack";
    case Kind::kRowWiseShape:
      return "its shape " + detail::shape_str(r.shape) + " is not the group's " +
             detail::shape_str(r.group_shape);
    case Kind::kRowWiseFolds:
      return "the group already folds rows of its last " + std::to_string(r.group_k) + " dims";
    case Kind::kReductionFolds:
      return "it folds " + std::to_string(r.count) + " dims of " +
             detail::shape_str(r.input_shape) + ", the group folds " + std::to_string(r.group_k) +
             " of " + detail::shape_str(r.group_shape);
    case Kind::kReductionRecomputes:
      return "the group recomputes broadcast members per element";
    case Kind::kReductionOfAll:
      return "it folds every element of " + detail::shape_str(r.input_shape) +
             " for a one-element group: as the root of its own group the threads share the fold";
    default:  // kReductionShape
      return "its input " + detail::shape_str(r.input_shape) + " and result " +
             detail::shape_str(r.shape) + " do not fit the group's " +
             detail::shape_str(r.group_shape);
  }
}
}  // namespace

std::string Reason::to_string() const {
  switch (kind) {
    case Kind::kGroupFull:
      return "the group has reached " + std::to_string(count) +
             " nodes (kernels stay quick to compile)";
    case Kind::kResults:
      return std::to_string(count) + " results";
    case Kind::kReadBefore:
      return "it is also read by " + node_label(*node) +
             ", outside the group and before the group's last node";
    case Kind::kCollective:
      return "a collective runs between it and the group's last node";
    case Kind::kExpandReadOutside:
      return "a broadcasting expand stays a view when read outside the group (" +
             read_elsewhere(node) + ")";
    case Kind::kOtherDevice:
      return "it computes on " + device.str() + ", the group on " + group_device.str();
    case Kind::kOneElement:
      return "a one-element value is computed once, not per element of " +
             detail::shape_str(group_shape);
    case Kind::kBroadcastReadOutside:
      return "it broadcasts from " + detail::shape_str(shape) + " to the group's " +
             detail::shape_str(group_shape) + " and would be recomputed per element, but it is " +
             read_elsewhere(node);
    case Kind::kShape:
      return "its shape " + detail::shape_str(shape) + " is not the group's " +
             detail::shape_str(group_shape) + (group_k >= 0 ? " nor the group's row shape" : "");
    case Kind::kRowWiseAfterJoin:
    case Kind::kRowWiseShape:
    case Kind::kRowWiseFolds:
      return "a row-wise op cannot join here: " + row_text(*this);
    case Kind::kReductionAfterJoin:
    case Kind::kReductionFolds:
    case Kind::kReductionRecomputes:
    case Kind::kReductionShape:
    case Kind::kReductionOfAll:
      return "a reduction cannot be an exit here: " + row_text(*this);
    case Kind::kNotFusible:
      return "not fusible: " + unfusible_reason(*node);
    case Kind::kRoleMismatch:
      return "a member reads it per element where it is computed per row, or the reverse";
  }
  return "";
}

namespace {
Reason because(Kind kind) {
  Reason r;
  r.kind = kind;
  return r;
}

// The producer's readers as the decision sees them: the group may run only before all readers
// outside it.
struct Readers {
  bool only_inside = true;        // every reader is a member of the group
  const Node* outside = nullptr;  // the first reader outside the group
  const Node* before = nullptr;   // the first reader outside that runs no later than the group
};

Readers readers_of(const Grouping& g, size_t id, const Node& p) {
  Readers r;
  for (const jit::Use& u : p.output()->uses()) {
    auto it = g.group_of.find(u.user);
    if (it != g.group_of.end() && it->second == id) continue;
    r.only_inside = false;
    if (!r.outside) r.outside = u.user;
    if (!r.before && g.runs_at(u.user) <= g.run_at[id]) r.before = u.user;
  }
  return r;
}

// When it runs: the producer's value moves to where the group runs (its last node), so every
// other reader must run after that, and no collective may lie in between.
std::optional<Reason> why_not_order(const Grouping& g, size_t id, const Node& p,
                                    const Readers& readers) {
  if (readers.before) {
    Reason r = because(Kind::kReadBefore);
    r.node = readers.before;
    return r;
  }
  if (effect_between(g.effects, g.position.at(&p), g.run_at[id])) return because(Kind::kCollective);
  return std::nullopt;
}

// Where it lives: a broadcast read (expand) joins only a group that alone reads it (as a group's
// result it would be written out whole, where a view costs nothing), and a group computes on one
// device (a 0-dim host value it reads stays a step of its own).
std::optional<Reason> why_not_placement(const Grouping& g, size_t id, const Node& p,
                                        const Readers& readers) {
  if (is_broadcast_view(p) && (!readers.only_inside || g.graph.is_output(p.output()))) {
    Reason r = because(Kind::kExpandReadOutside);
    r.node = readers.outside;
    return r;
  }
  const Device group_device = g.groups[id].members.front()->output()->type().device;
  if (p.output()->type().device != group_device) {
    Reason r = because(Kind::kOtherDevice);
    r.device = p.output()->type().device;
    r.group_device = group_device;
    return r;
  }
  return std::nullopt;
}

// Whether ps is a value per row of `shape` (its leading dims, trailing ones kept as 1) folding
// fewer than all its dims.
bool holds_a_value_per_row(const Shape& ps, const Shape& shape) {
  for (int k = 1; k < static_cast<int>(shape.size()); ++k)
    if (ps == kept_shape(shape, k)) return true;
  return false;
}

// A shape refusal: the producer's shape against the group's.
Reason shape_reason(Kind kind, const Shape& shape, const Building& group) {
  Reason r = because(kind);
  r.shape = shape;
  r.group_shape = group.shape;
  r.group_k = group.k;
  return r;
}

// An elementwise producer: of the group's shape (per element), of its row shape (per row), or
// smaller and broadcast (recomputed per element, so only when nothing outside reads it).
std::optional<Reason> why_not_elementwise(const Grouping& g, const Building& group, const Node& p,
                                          const Readers& readers, Merge& m) {
  const Shape& ps = p.output()->type().sizes;
  const int k = group.k;
  if (ps == group.shape) {
    m.role = Role::kElement;
    return std::nullopt;
  }
  if (k >= 0 && (ps == kept_shape(group.shape, k) || ps == dropped_shape(group.shape, k))) {
    m.role = Role::kRow;
    return std::nullopt;
  }
  if (k >= 0 || !broadcasts_to(ps, group.shape)) return shape_reason(Kind::kShape, ps, group);
  // A one-element value (an optimizer's bias correction from its step count) is computed once,
  // by a step of its own, rather than once per element: recomputed, a pow of it stays a libm call
  // per element and keeps the loop from vectorizing. A single row's statistic (a keepdim mean of
  // [1, n]) is not one: it joins as it would for several rows, so the group can fold the row.
  if (detail::shape_numel(ps) == 1 && detail::shape_numel(group.shape) > 1 &&
      !holds_a_value_per_row(ps, group.shape))
    return shape_reason(Kind::kOneElement, ps, group);
  if (!readers.only_inside || g.graph.is_output(p.output())) {
    Reason r = shape_reason(Kind::kBroadcastReadOutside, ps, group);
    r.node = readers.outside;
    return r;
  }
  m.role = Role::kElement;
  m.small = true;
  return std::nullopt;
}

// A row-wise op (softmax over the last dim): of the group's shape, folding rows of one dim.
std::optional<Reason> why_not_row_wise(const Building& group, const Node& p, Merge& m) {
  const Shape& ps = p.output()->type().sizes;
  if (!group.joins.empty()) return because(Kind::kRowWiseAfterJoin);
  if (ps != group.shape) return shape_reason(Kind::kRowWiseShape, ps, group);
  if (group.k >= 0 && group.k != 1) return shape_reason(Kind::kRowWiseFolds, ps, group);
  m.role = Role::kElement;
  m.k = 1;
  m.reduces = true;
  return std::nullopt;
}

// A reduction over trailing dims (k of them) as a group exit: folding the group's rows, or the
// first reduction, setting the row split, or one of a larger shape whose rows the group so far
// computes values of (lifting them).
std::optional<Reason> why_not_reduction(const Building& group, const Node& p, int k, Merge& m) {
  const Shape& ps = p.output()->type().sizes;
  const Shape& in_shape = p.input(0)->type().sizes;
  auto refuse = [&](Kind kind) {
    Reason r = shape_reason(kind, ps, group);
    r.input_shape = in_shape;
    r.count = k;
    return r;
  };
  if (!group.joins.empty()) return because(Kind::kReductionAfterJoin);
  // A fold of a whole tensor read by a one-element group (a loss's sum over its total weight, a
  // norm's sqrt) would make the tensor the group's single row, which one thread folds. As the root
  // of its own group it folds in parallel partials, and may lift its rows (a loss's terms from the
  // rows of the logits).
  if (k == static_cast<int>(in_shape.size()) && detail::shape_numel(in_shape) > 1 &&
      detail::shape_numel(group.shape) == 1 && folds_once(p))
    return refuse(Kind::kReductionOfAll);
  if (group.k >= 0) {
    if (in_shape != group.shape || k != group.k) return refuse(Kind::kReductionFolds);
  } else if (in_shape == group.shape) {
    m.k = k;
  } else if (ps == group.shape && !group.small) {
    m.shape = in_shape;
    m.k = k;
    m.lift = true;
  } else {
    return refuse(ps == group.shape ? Kind::kReductionRecomputes : Kind::kReductionShape);
  }
  m.role = Role::kRow;
  m.reduces = true;
  return std::nullopt;
}

// What the producer computes: a role in the group for the kinds of nodes a group holds.
std::optional<Reason> why_not_role(const Grouping& g, size_t id, const Node& p,
                                   const Readers& readers, Merge& m) {
  const Building& group = g.groups[id];
  if (is_fusible(p)) return why_not_elementwise(g, group, p, readers, m);
  if (is_row_wise(p)) return why_not_row_wise(group, p, m);
  if (std::optional<int> k = fused_reduction_dims(p)) return why_not_reduction(group, p, *k, m);
  Reason r = because(Kind::kNotFusible);
  r.node = &p;
  return r;
}

// Whether member c can read a value of shape `vs` computed at role `vr`, in the group as the merge
// leaves it.
bool reads_fit(const Grouping& g, const Merge& m, const Node& c, const Shape& vs, Role vr) {
  Role cr = g.role_of.at(&c);
  if (m.lift && cr == Role::kElement) cr = Role::kRow;
  if (cr == Role::kGlobal || cr == Role::kColumn || vr == Role::kElement) return true;
  if (c.op().kind == detail::OpKind::Reduction || is_row_wise(c)) return vs == m.shape;
  if (cr == Role::kElement) {
    const Shape dropped = dropped_shape(m.shape, m.k);
    return vs == kept_shape(m.shape, m.k) || (vs == dropped && dropped.empty());
  }
  return vs == c.output()->type().sizes;
}

// How its readers in the group read it: at the level it is computed at.
std::optional<Reason> why_not_readers(const Grouping& g, size_t id, const Node& p, const Merge& m) {
  const Shape& ps = p.output()->type().sizes;
  for (const jit::Use& u : p.output()->uses()) {
    auto it = g.group_of.find(u.user);
    if (it != g.group_of.end() && it->second == id && !reads_fit(g, m, *u.user, ps, m.role))
      return because(Kind::kRoleMismatch);
  }
  return std::nullopt;
}
}  // namespace

std::optional<Reason> why_not_full(const Building& group) {
  if (group.members.size() < kMaxGroupNodes) return std::nullopt;
  Reason r = because(Kind::kGroupFull);
  r.count = static_cast<int64_t>(kMaxGroupNodes);
  return r;
}

std::optional<Reason> why_not(const Grouping& g, size_t id, const Node& p, Merge& merge) {
  if (p.num_outputs() != 1) {
    Reason r = because(Kind::kResults);
    r.count = static_cast<int64_t>(p.num_outputs());
    return r;
  }
  const Readers readers = readers_of(g, id, p);
  if (std::optional<Reason> r = why_not_order(g, id, p, readers)) return r;
  if (std::optional<Reason> r = why_not_placement(g, id, p, readers)) return r;
  const Building& group = g.groups[id];
  merge = Merge{Role::kElement, group.shape, group.k, group.small, group.reduces, false};
  if (std::optional<Reason> r = why_not_role(g, id, p, readers, merge)) return r;
  return why_not_readers(g, id, p, merge);
}

void apply_merge(Grouping& g, size_t id, const Node& p, const Merge& merge) {
  Building& group = g.groups[id];
  group.shape = merge.shape;
  group.k = merge.k;
  group.small = merge.small;
  group.reduces = merge.reduces;
  if (merge.lift)
    for (const Node* member : group.members)
      if (g.role_of.at(member) == Role::kElement) g.role_of[member] = Role::kRow;
  g.group_of[&p] = id;
  g.role_of[&p] = merge.role;
  group.members.push_back(&p);
}

}  // namespace kiln::fuser
