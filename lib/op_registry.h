// How lib's ops get into the op table: each family's register function, run once in a fixed
// order, and the handles through which the defining files reach their ops' entries.
//
// No op registers during static initialization: the first look-up (find_op, all_ops) or op call
// (an OpHandle read) runs ensure_ops_registered(), which calls every family's register function
// once (std::call_once), so the table is complete before any op runs, whatever the link keeps.
#pragma once

#include "lib/op_table.h"

namespace kiln::detail {

// Registers every family below, in this order, exactly once; later calls return at once. Thread-
// safe: a call that finds registration under way on another thread waits for it to finish.
void ensure_ops_registered();

}  // namespace kiln::detail

// The families, one per source file that defines ops (the order ensure_ops_registered calls them).
// Their own namespace, directly under kiln's: their bodies look names up as the defining files'
// namespace-scope code does (a name of kiln::detail never hides a public op).
namespace kiln::registration {
void register_factories();          // lib/ops/factories.cpp
void register_tensor_ops();         // lib/tensor.cpp: to, to_device, clone
void register_views();              // lib/ops/views.cpp
void register_elementwise_ops();    // lib/ops/elementwise.cpp
void register_bitwise_ops();        // lib/ops/more_ops.cpp
void register_reductions();         // lib/ops/reduce.cpp
void register_scans();              // lib/ops/sort_scan.cpp
void register_searchsorted();       // lib/ops/searchsorted.cpp
void register_index_ops();          // lib/ops/index.cpp
void register_scatter_ops();        // lib/ops/scatter.cpp
void register_linalg_ops();         // lib/ops/linalg.cpp
void register_matrix_functions();   // lib/ops/matrix_functions.cpp
void register_nn_ops();             // lib/ops/nn.cpp
void register_pool_ops();           // lib/ops/pool_norm.cpp
void register_conv_ops();           // lib/ops/conv.cpp
void register_embedding_bag_ops();  // lib/ops/embedding_bag.cpp
void register_collective_ops();     // lib/distributed/functional.cpp
}  // namespace kiln::registration

namespace kiln::detail {

// A defining file's reference to one of its ops' entries. A namespace-scope handle is constant-
// initialized (no static initializer); its family's register function binds it, and every read
// first makes sure registration has run, so an op called before any look-up still finds its entry.
// A read costs a call and one acquire load, never a look-up by name.
class OpHandle {
 public:
  constexpr OpHandle() = default;
  OpHandle(const OpHandle&) = delete;
  OpHandle& operator=(const OpHandle&) = delete;

  // Only the family's register function calls this, inside ensure_ops_registered.
  void bind(const OpDef& def) { def_ = &def; }

  const OpDef& get() const {
    ensure_ops_registered();  // after the first time, one acquire load (lib/op_table.cpp)
    return *def_;
  }
  operator const OpDef&() const { return get(); }  // NOLINT: a handle stands for its entry
  const OpDef* operator->() const { return &get(); }

 private:
  const OpDef* def_ = nullptr;  // set once inside ensure_ops_registered, then read-only
};

}  // namespace kiln::detail
