// Structural hash of a Graph: equal for isomorphic graphs, stable across processes and builds.
//
// The hash depends on ops, attributes (value and type), value types, wiring, sharing, input order,
// output order and nested subgraphs, and on nothing else: not on value ids, node pointers, or the
// list order of independent nodes. It is XXH3-128 over a canonical byte form, so it can key the
// on-disk kernel cache.
#pragma once

#include <cstdint>
#include <string>

#include "jit/ir.h"

namespace kiln::jit {

struct GraphHash {
  uint64_t lo = 0, hi = 0;

  bool operator==(const GraphHash& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const GraphHash& o) const { return !(*this == o); }
  bool operator<(const GraphHash& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
  // 32 lowercase hex digits, high half first.
  std::string hex() const;
};

// Linear in the size of the graph and its subgraphs (plus sorting dead nodes); iterative.
//
// Nodes that reach a graph output are numbered canonically (inputs by index, then a depth-first
// walk from the outputs in order, operands in order), which identifies the live part of a graph
// up to isomorphism exactly. Nodes that reach no output (dead code) enter as a sorted multiset of
// Merkle-style keys that include their use counts.
GraphHash graph_hash(const Graph& g);

}  // namespace kiln::jit
