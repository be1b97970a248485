// Fusion groups while find_groups builds them: the state that growing groups, deciding merges,
// moving exits and building kernels share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/fuse.h"
#include "jit/ir.h"

namespace kiln::fuser {

// How a member of a group computes: per element of the group's shape, once per row (row
// reductions and what only their results feed), once per call (a global reduction), or once per
// position of a row, over every row (a column reduction: a sum over the leading dims).
enum class Role : uint8_t { kElement, kRow, kGlobal, kColumn };

// A shape with its last k dims kept as 1 (a row value broadcast back: keepdim), or dropped.
inline Shape kept_shape(const Shape& s, int k) {
  Shape r(s.begin(), s.end() - k);
  r.resize(s.size(), 1);
  return r;
}
inline Shape dropped_shape(const Shape& s, int k) {
  return Shape(s.begin(), s.end() - k);
}

// Kernels stay small enough to compile in milliseconds: a longer chain becomes several groups.
constexpr size_t kMaxGroupNodes = 128;

// A group while find_groups builds it.
struct Building {
  std::vector<const jit::Node*> members;
  Shape shape;           // the iteration shape
  int k = -1;            // trailing dims a row reduction folds (or a column one keeps); -1: none
  bool small = false;    // a member of a smaller shape, recomputed per element
  bool reduces = false;  // a rows kernel
  // The cats or stacks it ends in (then it has no reductions but column exits): its root, and
  // other joins of pieces it computes, merged in later.
  std::vector<const jit::Node*> joins;
  bool columns = false;  // rooted at a column reduction (a sum over the leading dims)
};

// The graph in order and the groups made so far (from the end of the graph). One find_groups
// call owns it.
struct Grouping {
  explicit Grouping(const jit::Graph& g);

  const jit::Graph& graph;
  std::vector<const jit::Node*> order;                      // the graph's nodes
  absl::flat_hash_map<const jit::Node*, int64_t> position;  // index in `order`
  std::vector<int64_t> effects;                             // positions of collectives, in order
  absl::flat_hash_map<const jit::Node*, size_t> group_of;   // members: their group's index
  absl::flat_hash_map<const jit::Node*, Role> role_of;      // members: how they compute
  std::vector<Building> groups;
  std::vector<int64_t> run_at;  // per group: the position where it runs

  // Where a node's value is read: at the node, or where its group runs.
  int64_t runs_at(const jit::Node* n) const {
    auto g = group_of.find(n);
    return g == group_of.end() ? position.at(n) : run_at[g->second];
  }
};

// Starts a group at its root (the only member of `group`, computing in `root_role`), running
// where the root is; returns its index.
size_t start_group(Grouping& grouping, Building group, Role root_role);

// Whether a node with side effects (a collective) lies strictly between graph positions a < b;
// `effects` holds their positions in order. Work never moves across a collective: every rank runs
// the same steps around each one, and the graph's order is the program's.
bool effect_between(const std::vector<int64_t>& effects, int64_t a, int64_t b);

// Moves column exits, lone elementwise nodes and second joins into the earlier group whose values
// they read (fuser/column_exits.cpp).
void merge_column_exits(Grouping& grouping);

// Builds the group's kernel: loads for its inputs, scalars for its constants, attributes and
// element counts, and each member's formula in graph order (fuser/build_kernel.cpp).
void build_kernel(FusionGroup& g, const absl::flat_hash_map<const jit::Node*, Role>& roles);

}  // namespace kiln::fuser
