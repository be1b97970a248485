// Output types of an IR node, inferred by the op's own validation and shape rules.
#pragma once

#include <optional>
#include <vector>

#include "jit/ir.h"

namespace kiln::jit {

// The types the node's op gives its inputs' types, or nullopt for ops whose types cannot be
// inferred without data (index ops read index values, GEMMs are library calls: both are checked
// when recorded). Throws kiln::Error when the op rejects the input types.
std::optional<std::vector<ValueType>> infer_output_types(const Node& n);

// Checks every node's output types against infer_output_types; throws kiln::Error naming the
// first mismatch. Run on the graphs lazy mode and traces build, after the passes, when
// verification is on (Graph::verify checks structure; graphs built by hand in tests may carry
// types of their own).
void verify_types(const Graph& g);

}  // namespace kiln::jit
