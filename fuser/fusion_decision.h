// The fusion decision: whether a producer may join a group, how it joins (Merge), and if it may
// not, why (Reason, which KILN_LOG=fuser prints).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fuser/grouping.h"
#include "jit/ir.h"

namespace kiln::fuser {

// "%7 mul": a node as the graph printer names its first output.
std::string node_label(const jit::Node& n);

// Why a producer did not join a group: what kind of check refused it and the values that explain
// the refusal. Made on every refusal (cheap: no text); to_string spells it out for the log.
struct Reason {
  enum class Kind : uint8_t {
    kGroupFull,             // count: the cap on a group's nodes
    kResults,               // count: the producer's number of results
    kReadBefore,            // node: a reader outside the group that runs before it
    kCollective,            // a collective runs between the producer and the group
    kExpandReadOutside,     // node: another reader (null: a graph output)
    kOtherDevice,           // device, group_device
    kOneElement,            // group_shape
    kBroadcastReadOutside,  // shape, group_shape, node: another reader (null: a graph output)
    kShape,                 // shape, group_shape, group_k
    kRowWiseAfterJoin,      // a row-wise op after the group's cat or stack
    kRowWiseShape,          // shape, group_shape
    kRowWiseFolds,          // group_k: the group folds rows of other dims
    kReductionAfterJoin,    // a reduction after the group's cat or stack
    kReductionFolds,        // count: dims it folds of input_shape; group_k of group_shape
    kReductionRecomputes,   // the group recomputes broadcast members per element
    kReductionShape,        // input_shape, shape, group_shape
    kReductionOfAll,        // input_shape: a fold of every element, the root of its own group
    kNotFusible,            // node: the producer (unfusible_reason says why)
    kRoleMismatch,          // a member reads it per element where it is per row, or the reverse
  };
  Kind kind = Kind::kNotFusible;
  const jit::Node* node = nullptr;
  Shape shape;        // the producer's result
  Shape input_shape;  // a reduction's operand
  Shape group_shape;
  int64_t count = 0;
  int group_k = -1;  // the group's row split (Building::k)
  Device device = kCPU;
  Device group_device = kCPU;

  std::string to_string() const;
};

// How a producer joins a group: the role it computes in and the group's iteration space after.
struct Merge {
  Role role = Role::kElement;
  Shape shape;  // Building's fields after the merge
  int k = -1;
  bool small = false;
  bool reduces = false;
  // The group's element members become row-level: a reduction of a larger shape joins, and what
  // the group computed so far is its rows' values.
  bool lift = false;
};

// Whether `group` is full: then no producer joins it.
std::optional<Reason> why_not_full(const Building& group);

// The decision for a producer of a member of group `id` (not a graph input, constant or member of
// a group): nullopt when it may join, `merge` then saying how; else why not. It checks, in order:
// one result, every other reader later than the group, no collective in between, no expand read
// elsewhere, one device, a role that fits the group's shape and row split, and members reading it
// at the level it is computed at.
std::optional<Reason> why_not(const Grouping& grouping, size_t id, const jit::Node& producer,
                              Merge& merge);

// Makes `producer` a member of group `id` as `merge` says.
void apply_merge(Grouping& grouping, size_t id, const jit::Node& producer, const Merge& merge);

}  // namespace kiln::fuser
