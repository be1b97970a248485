// The IR emitter of one kernel function (private to fuser/codegen/llvm/).
//
// Its builder, its state, and the pieces that the flat, strided and rows kernels and the finish
// and columns helpers are built from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuser/kernel.h"
#include "fuser/primitives.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Module.h"

namespace kiln::fuser::cpu {

// Emits one kernel function (see KernelFn), or one of its helpers (FinishFn, ColumnsFn).
// emitter.cpp: flat and strided kernels, loops, loads, casts and each instruction's value;
// math_emit.cpp: the primitives defined in lib/math; emit_rows.cpp: rows kernels;
// emit_partials.cpp: the finish and columns helpers, which combine the calls' partials.
class Emitter {
 public:
  Emitter(llvm::Module& m, const Kernel& k, int vector_width)
      : m_(m), ctx_(m.getContext()), b_(ctx_), k_(k), vector_width_(vector_width) {}

  // The kernel function `name` of the layout.
  void emit(const std::string& name, const Layout& layout);
  // The finish function of a kernel with global reductions (see FinishFn).
  void emit_finish(const std::string& name);
  // The columns function of a kernel with column reductions (see ColumnsFn).
  void emit_columns(const std::string& name);

 private:
  // The kernel function's parameters (see KernelFn).
  struct KernelArgs {
    llvm::Value* begin;
    llvm::Value* end;
    llvm::Value* ptrs;
    llvm::Value* sizes;
    llvm::Value* strides;
    llvm::Value* partials;
  };
  // The iteration shape's sizes, and per pointer its strides, as loaded from the call's arrays.
  struct Geometry {
    std::vector<llvm::Value*> size;
    std::vector<std::vector<llvm::Value*>> stride;  // [pointer][dimension]
  };
  // An instruction's operands' values, and what the first operand's type says about the IR to
  // emit.
  struct Operands {
    llvm::Value* a;
    llvm::Value* b;
    llvm::Value* c;
    DType at;      // a's type (a leaf's: its own)
    bool fp;       // a is floating point
    bool boolean;  // a is a bool
  };
  struct Rows;     // emit_rows.cpp
  struct Pass;     // emit_rows.cpp
  struct Band;     // emit_rows.cpp
  struct Columns;  // emit_partials.cpp

  // LLVM's cost model picks 4 lanes for these loops, and unrolls them 4 times more; measured on
  // the GELU kernel, 16 lanes twice interleaved run 2.6x faster (10.4 ms against 27 ms per 16M
  // elements) and compile 3x faster (13 ms against 45 ms) than the defaults; not interleaved
  // (interleave count 1) the GELU kernel ran 2.2x slower.
  static constexpr int kInterleave = 2;

  // --- emitter.cpp: kernel entry, flat and strided kernels
  KernelArgs begin_kernel(const std::string& name);
  void load_bases(llvm::Value* ptrs);
  Geometry load_geometry(llvm::Value* sizes, llvm::Value* strides, int dims);
  void emit_flat(const Layout& layout, const KernelArgs& args, llvm::BasicBlock* exit);
  void emit_strided(const Layout& layout, const KernelArgs& args, llvm::BasicBlock* exit);
  void body(const std::vector<llvm::Value*>& offsets);
  bool computes_transcendentals() const;

  // --- emitter.cpp: loops
  // for (i = from; i < to; ++i) f(i), leaving the builder at `done`'s predecessor... then `done`.
  // With `vectorize`, vector_width_ lanes kInterleave times (the loops over elements).
  template <typename F>
  void loop(llvm::Value* from, llvm::Value* to, llvm::BasicBlock* done, const F& f,
            bool vectorize = true) {
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx_, "loop", fn_);
    b_.CreateCondBr(b_.CreateICmpSLT(from, to), head, done);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(b_.getInt64Ty(), 2, "i");
    i->addIncoming(from, pre);
    f(i);
    llvm::Value* next = b_.CreateAdd(i, b_.getInt64(1), "", true, true);
    i->addIncoming(next, b_.GetInsertBlock());
    llvm::BranchInst* back = b_.CreateCondBr(b_.CreateICmpSLT(next, to), head, done);
    if (vector_width_ == 0 || !vectorize) return;
    mark_vectorized(head, back);
  }
  void mark_vectorized(llvm::BasicBlock* head, llvm::BranchInst* back);
  llvm::MDNode* property(const char* name, llvm::Constant* value);

  // --- emitter.cpp: types, loads, stores, casts
  llvm::Type* storage_type(DType t);
  llvm::Type* value_type(DType t);
  llvm::Value* load(DType t, llvm::Value* address);
  void store_value(DType t, llvm::Value* value, llvm::Value* address);
  llvm::Value* cast(llvm::Value* v, DType from, DType to);
  llvm::Value* intrinsic(llvm::Intrinsic::ID id, llvm::Value* x);
  llvm::Value* inner_offset(Layout::Inner inner, llvm::Value* start, llvm::Value* j,
                            llvm::Value* stride);
  llvm::AllocaInst* entry_alloca(llvm::Type* ty);

  // --- emitter.cpp: an instruction's value (a dispatch over the primitive table)
  llvm::Value* compute(size_t n, const std::vector<llvm::Value*>& v,
                       const std::vector<llvm::Value*>& offsets);
  llvm::Value* leaf(const Instr& in, const std::vector<llvm::Value*>& offsets);
  llvm::Value* arithmetic(Prim p, const Operands& o);
  llvm::Value* compare(Prim p, const Operands& o);
  llvm::Value* logic(Prim p, const Operands& o);
  llvm::Value* rounding(Prim p, const Operands& o);

  // --- emitter.cpp: reductions
  llvm::Value* identity(const Instr& r);
  llvm::Value* fold(const Instr& r, llvm::Value* acc, llvm::Value* x, bool reassociate);

  // --- math_emit.cpp
  llvm::Value* math(Prim p, DType t, llvm::Value* a, llvm::Value* b);
  llvm::Value* inline_math(Prim p, DType t, llvm::Value* a, llvm::Value* b);
  int uses_of(Prim p, DType t) const;
  llvm::Function* math_function(Prim p, DType t);
  llvm::Value* libm2(const char* name, llvm::Value* x, llvm::Value* y, DType t);
  llvm::Value* int_rem(llvm::Value* a, llvm::Value* b);

  // --- emit_rows.cpp
  void emit_rows(const Layout& layout, const KernelArgs& args);
  void start_accumulators(Rows& rows);
  void start_column_partials(Rows& rows);
  void plan_row_buffers(Rows& rows);
  llvm::FunctionCallee allocate_row_buffers(Rows& rows);
  void select_row_buffers(Rows& rows, llvm::Value* r);
  std::vector<bool> needed_in(const Rows& rows, int32_t pass,
                              const std::vector<bool>& from_buffer) const;
  void emit_row(Rows& rows, llvm::Value* row);
  void begin_row(Rows& rows, llvm::Value* row);
  void emit_passes(Rows& rows, int32_t last);
  void finish_row(Rows& rows);
  llvm::Value* emit_bands(Rows& rows, llvm::Value* begin, llvm::Value* end);
  void emit_band(Rows& rows, llvm::Value* first_row);
  Band keep_for_band(const Rows& rows, llvm::Value* r);
  void restore_band_row(Rows& rows, const Band& band, int64_t r,
                        const std::vector<llvm::Value*>& constants);
  void emit_band_last_pass(Rows& rows, const Band& band);
  std::vector<llvm::Value*> row_start(const Rows& rows, llvm::Value* row);
  void row_values(Rows& rows, int32_t s);
  void emit_pass(Rows& rows, int32_t pass);
  Pass pass_of(const Rows& rows, int32_t pass) const;
  void pass_element(Rows& rows, const Pass& pass, llvm::Value* j);
  std::vector<llvm::Value*> element_values(const Rows& rows, const Pass& pass, llvm::Value* j,
                                           std::vector<llvm::Value*>& offsets);
  void fold_roots(Rows& rows, const Pass& pass, const std::vector<llvm::Value*>& e, llvm::Value* j);
  llvm::Value* column_position(const Rows& rows, const Instr& in, llvm::Value* j);
  void store_element_outputs(const std::vector<llvm::Value*>& e,
                             const std::vector<llvm::Value*>& offsets, const Rows& rows);
  void store_row_outputs(const Rows& rows);
  void fold_row_level_globals(Rows& rows);
  void store_global_partials(const Rows& rows, llvm::Value* partials);

  // --- emit_partials.cpp
  std::vector<llvm::Value*> begin_helper(const std::string& name, std::vector<llvm::Type*> leading);
  std::vector<llvm::Value*> column_bases(llvm::Value* partials, llvm::Value* R);
  size_t column_reduction_of(int32_t s) const;
  std::vector<int32_t> column_slots(const std::vector<Level>& level) const;
  void combine_column_calls(const Columns& columns, int32_t s, llvm::Value* hi);
  std::vector<bool> needed_by_slot(int32_t s, const std::vector<int32_t>& slot_of) const;
  void store_column_outputs(const Columns& columns, int32_t s, llvm::Value* hi,
                            const std::vector<bool>& needed);

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const Kernel& k_;
  llvm::Function* fn_ = nullptr;
  llvm::Value* scalars_ = nullptr;
  std::vector<llvm::Value*> bases_;  // per pointer (inputs, then outputs): its first element
  std::vector<bool> single_;         // per input: read at its first element only
  int vector_width_;                 // float lanes of a vector register, or 0
  bool strided_ = false;             // a strided kernel: every primitive inline (see math)
};

}  // namespace kiln::fuser::cpu
