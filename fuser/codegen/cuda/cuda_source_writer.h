// The writer of one kernel's CUDA source: the state its emission steps share, declared once for
// the files that define them (cuda_codegen.cpp: the whole source and its parameters; cuda_expr.cpp:
// one instruction; cuda_elementwise.cpp: flat and strided loops; cuda_rows_plan.cpp,
// cuda_rows_kernel.cpp, cuda_rows_combine.cpp: rows kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/cuda_values.h"
#include "fuser/kernel.h"
#include "fuser/rows_plan.h"

// Internal to libkiln: hidden, so that the writer's calls between its steps and helpers are
// direct and may be inlined (-fPIC makes exported functions interposable, and so never inlined).
#pragma GCC visibility push(hidden)

namespace kiln::fuser::cuda::codegen {

class Source {
 public:
  Source(const Kernel& k, const Layout& layout, const std::string& symbol, CudaCallFlags variant)
      : k_(k), layout_(layout), symbol_(symbol), variant_(variant) {}

  // The whole source (cuda_source).
  std::string emit();
  // Whether the layout and the tensors' types allow a 4-wide loop (flat) or quad accesses (rows);
  // cuda_variant asks too.
  bool vectorizable() const;
  // A rows kernel's row caches in shared memory (the generic variant's), in order: the bytes of
  // one value of each (cuda_row_caches asks).
  std::vector<int> row_cache_sizes() const;

 private:
  // ------------------------------------------------------------ the source and its parameters
  void check_kernel() const;
  void check_parameter_bytes() const;
  size_t num_ptrs() const { return k_.input_types.size() + k_.outputs.size(); }
  DType ptr_type(size_t p) const {
    const size_t n = k_.input_types.size();
    return p < n ? k_.input_types[p] : k_.output_types[p - n];
  }
  bool single(size_t p) const {
    return layout_.flat && p < layout_.single_element.size() && layout_.single_element[p];
  }
  bool by_value(size_t p) const {
    return layout_.flat && p < layout_.by_value.size() && layout_.by_value[p];
  }
  std::string ptr_params() const;
  std::string ptr_params_of(size_t p) const;
  std::string ptr_name(size_t p) const;
  std::string scalar_params() const;
  std::string ptr_args() const;
  std::string entry_params() const;
  std::string entry_args() const;
  std::string scalar_args() const;
  // The index type of the loops (U, unsigned) and of offsets (S, signed) of the variant.
  std::string index_types() const {
    return variant_.index32 ? "unsigned, int" : "unsigned long long, long long";
  }
  std::string index_type() const { return variant_.index32 ? "unsigned" : "unsigned long long"; }
  // "const T vN" for instruction n.
  std::string decl(size_t n) const {
    return "const " + std::string(value_type(k_.body[n].type)) + " " + v(static_cast<int32_t>(n));
  }

  // -------------------------------------------------------------------- one instruction (expr)
  struct Operands;
  std::string expr(const Instr& in);
  Operands operands(const Instr& in) const;
  std::string load_expr(const Instr& in);
  std::string scalar_expr(const Instr& in) const;
  std::string math_call(const Instr& in, DType t, const std::string& a, const std::string& b);
  std::string load(size_t p);

  // ------------------------------------------------------------------------ elementwise loops
  void body();
  std::vector<bool> live_body() const;
  std::string body_call(const std::vector<std::string>& offsets) const;
  void flat();
  void flat_vec_loop();
  void strided();
  std::vector<std::string> strided_indices(bool need_j);
  std::string strided_offset(size_t p, const std::vector<std::string>& idx) const;

  // ---------------------------------------------------------------------- rows kernels' plan
  // Where each instruction is computed, decided once for the three kernels. Only what some output
  // needs is generated (NVRTC warns about unused variables): a reduction nothing reads is not
  // folded.
  struct RowsPlan {
    std::vector<Level> level;
    std::vector<int32_t> stage;
    std::vector<bool> finish_needed;  // computed by the finish kernel (live global reductions)
    std::vector<bool> rows_needed;    // computed by the rows kernel (live row reductions)
    std::vector<int32_t> slot_of;     // column-level instructions: the column slot they read
    std::vector<bool> live_slot;      // column slots some output reads
  };
  // Which element-level values each pass computes, and which of them a later pass reads back
  // (see rows_kernel in cuda_rows_kernel.cpp).
  struct RowCache {
    std::vector<std::vector<bool>> needed_of;  // per pass: the element-level values it computes
    std::vector<bool> cached;                  // per instruction: in shared memory, or registers
    std::vector<int32_t> first;                // registers: the pass that computes (or loads) it
  };
  struct RowsKernel;  // the state of one rows kernel's emission (cuda_rows_kernel.cpp)

  // Marks `work` and the instructions they read, not looking past those `stop` says (their
  // values come from another kernel). A worklist, not a recursion.
  template <typename Stop>
  std::vector<bool> reach(std::vector<size_t> work, Stop stop) const {
    std::vector<bool> seen(k_.body.size(), false);
    while (!work.empty()) {
      const size_t n = work.back();
      work.pop_back();
      if (seen.at(n)) continue;
      seen[n] = true;
      if (stop(n)) continue;
      const Instr& in = k_.body[n];
      for (int32_t o : {in.a, in.b, in.c})
        if (o >= 0) work.push_back(static_cast<size_t>(o));
    }
    return seen;
  }
  RowsPlan rows_plan() const;
  // The passes over a row, as the LLVM emitter plans them, folding the reductions some output
  // needs.
  RowsPasses rows_passes(const RowsPlan& p) const;
  void plan_column_slots(RowsPlan& p) const;
  bool live_global(const RowsPlan& p, size_t n) const;
  bool live_column(const RowsPlan& p, size_t n) const;
  std::vector<std::vector<size_t>> pass_work(const RowsPasses& passes,
                                             const std::vector<Level>& level) const;
  RowCache plan_row_cache(const std::vector<std::vector<size_t>>& work_of,
                          const std::vector<Level>& level) const;
  void plan_pass(RowCache& c, const std::vector<size_t>& work, const std::vector<Level>& level,
                 int64_t& budget, size_t pass) const;
  void plan_registers(RowCache& c, int64_t budget) const;
  void plan_shared_cache(RowCache& c, const std::vector<Level>& level) const;

  // ----------------------------------------------------------------------- the rows kernel
  std::string stride_of(size_t p, int dim) const;
  std::string row_loop(const std::string& body, const std::string& indent,
                       const std::string& before = "", const std::string& after = "") const;
  bool quad_ptr(size_t p) const;
  std::string position_offsets(const std::vector<bool>& used, std::vector<bool>& row_ptr,
                               const std::string& indent) const;
  std::string quad_loads(const RowsKernel& r, const std::vector<bool>& used) const;
  std::string quad_stores(const std::vector<bool>& used) const;
  void rows_kernel(const RowsPlan& p);
  void row_values(RowsKernel& r, int32_t stage);
  void register_declarations(RowsKernel& r) const;
  void rows_pass(RowsKernel& r, int32_t pass);
  std::string pass_register_loads(RowsKernel& r, int32_t pass);
  std::string pass_element_values(RowsKernel& r, int32_t pass);
  std::string element_value(RowsKernel& r, size_t n, int32_t pass);
  std::string cached_quad(RowsKernel& r, size_t n);
  std::string pass_folds(const std::vector<size_t>& roots) const;
  std::string column_fold(const Instr& in) const;
  std::string pass_stores(const RowsKernel& r, std::vector<bool>& used) const;
  void block_reductions(RowsKernel& r, const std::vector<size_t>& roots) const;
  void first_thread(RowsKernel& r) const;
  void check_row_values(const RowsKernel& r) const;
  void rows_prologue(const RowsKernel& r);
  void row_caches(const RowsKernel& r);
  std::string column_partials(const RowsKernel& r);
  std::string column_partial_slot(int32_t s, int64_t offset);
  void band_loop(const RowsKernel& r, const std::string& column_stores);
  void row_starts(const RowsKernel& r);
  void global_partials(const RowsKernel& r);
  void rows_entry();

  // --------------------------------------------------------- the finish and columns kernels
  size_t column_reduction_of(int32_t s) const;
  std::string helper_values(const std::vector<bool>& needed, const RowsPlan& p,
                            const std::string& indent);
  void finish_kernel(const RowsPlan& p);
  void columns_kernel(const RowsPlan& p);
  void columns_slot(const RowsPlan& p, int32_t s, int64_t offset);

  const Kernel& k_;
  const Layout& layout_;
  const std::string& symbol_;
  const CudaCallFlags variant_;
  std::string out_;
  std::set<std::string> math_;  // the transcendental device functions the kernel calls
  // Rows kernels: how expr reads each input (an element of the pointer, or a lane of its quad),
  // and the inputs it read.
  std::vector<std::string> load_at_;
  std::vector<bool> load_used_;
};

}  // namespace kiln::fuser::cuda::codegen

#pragma GCC visibility pop
