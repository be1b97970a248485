// The graph passes, run in a fixed order by run_passes; each is a named function that returns
// whether it changed the graph and counts its rewrites per rule.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "jit/ir.h"

namespace kiln::jit {

// What one pass run did: filled by the pass (rewrites) and by run_passes (the rest).
struct PassContext {
  std::map<std::string, int64_t> rewrites;  // rule name -> times applied
  void count(const std::string& rule, int64_t n = 1) { rewrites[rule] += n; }
};

// Removes nodes none of whose outputs reach a graph output.
bool eliminate_dead_code(Graph& g, PassContext& ctx);
// Merges nodes with equal (op, attributes, inputs); constants merge by (value, dtype, wrapped).
bool eliminate_common_subexpressions(Graph& g, PassContext& ctx);
// Replaces nodes whose inputs are all scalar constants by the constant they compute (through the
// op's reference kernel, so folding is exact).
bool fold_constants(Graph& g, PassContext& ctx);
// Algebraic simplification to a fixpoint; exact in IEEE arithmetic (see canonicalize.cpp).
bool canonicalize(Graph& g, PassContext& ctx);
// Rewrites numerically unstable patterns into their stable forms (log1p, expm1, log_softmax, ...).
bool stabilize(Graph& g, PassContext& ctx);
// Moves views read only by graph outputs to the end of the graph (so they split no fusion group).
bool sink_views(Graph& g, PassContext& ctx);
// add(mm(a, b), bias) -> addmm(bias, a, b): the bias add folds into the GEMM (beta = 1).
bool fold_gemm_bias(Graph& g, PassContext& ctx);
// Folds a per-channel affine after a convolution (eval batch norm) into its weight and bias, and
// makes a residual add and an activation after it the convolution's epilogue (see conv_fold.cpp).
bool fold_conv_epilogues(Graph& g, PassContext& ctx);
// view(elementwise(a, b)) -> elementwise(view(a), view(b)) where that removes the view from
// between fusible nodes (see push_views.cpp); only with fusion on.
bool push_views(Graph& g, PassContext& ctx);

// Removes device round trips and copies to the device a value is on, and moves copies to a
// device above the elementwise work feeding them (see transfers.cpp).
bool eliminate_transfers(Graph& g, PassContext& ctx);

using PassFn = bool (*)(Graph&, PassContext&);
struct PassInfo {
  const char*
      name;  // as named in KILN_DISABLE_PASSES: dce, cse, fold, canonicalize, stabilize, transfers
  PassFn fn;
};
// The passes in the order run_passes runs them.
const std::vector<PassInfo>& all_passes();

// Runs every pass not disabled (KILN_DISABLE_PASSES=a,b or set_disabled_passes), in order, and
// verifies the graph after each when verification is on (debug builds, KILN_VERIFY=1, tests).
void run_passes(Graph& g);
void set_disabled_passes(const std::vector<std::string>& names);  // overrides the environment
bool pass_disabled(const std::string& name);
void set_verify_passes(bool on);
bool verify_passes();

// The passes' own profile since the last reset, one entry per pass, for the profiler.
struct PassProfileEntry {
  std::string pass;
  int64_t runs = 0;
  double seconds = 0;
  int64_t nodes_before = 0;  // summed over runs
  int64_t nodes_after = 0;
  std::map<std::string, int64_t> rewrites;
};
std::vector<PassProfileEntry> pass_profile();
void reset_pass_profile();

}  // namespace kiln::jit
