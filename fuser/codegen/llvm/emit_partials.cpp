// The IR of a rows kernel's finish and columns helpers, which combine the calls' partials.
//
// The finish function folds the global reductions (see FinishFn), the columns function the column
// reductions (see ColumnsFn).
#include <cstdint>
#include <vector>

#include "fuser/codegen/llvm/emitter.h"
#include "kiln/error.h"

namespace kiln::fuser::cpu {

// What the steps of a columns function share: its parameters and the kernel's column slots.
struct Emitter::Columns {
  llvm::Value* begin;  // the positions [begin, end) of each slot to combine
  llvm::Value* end;
  llvm::Value* calls;                  // how many calls' partials there are
  llvm::Value* stride;                 // a call's partials, in values of 8 bytes
  llvm::Value* R;                      // the row length
  std::vector<int32_t> slot_of{};      // per instruction: the column slot it derives from
  std::vector<llvm::Value*> base{};    // per slot: its first position in the first call's
  std::vector<llvm::Value*> origin{};  // per pointer: offset 0
};

// Starts a helper function of a kernel (finish, columns): its parameters are `leading`, then
// the tensor pointers and the kernel scalars. Loads the pointers' bases (every input read at
// its first element) and returns the leading arguments.
std::vector<llvm::Value*> Emitter::begin_helper(const std::string& name,
                                                std::vector<llvm::Type*> leading) {
  llvm::Type* ptr = b_.getPtrTy();
  const size_t num_leading = leading.size();
  leading.push_back(ptr);
  leading.push_back(ptr);
  auto* type = llvm::FunctionType::get(b_.getVoidTy(), leading, false);
  fn_ = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, m_);
  fn_->addFnAttr(llvm::Attribute::NoUnwind);
  std::vector<llvm::Value*> args;
  for (llvm::Argument& a : fn_->args()) args.push_back(&a);
  llvm::Value* ptrs = args[num_leading];
  scalars_ = args[num_leading + 1];
  args.resize(num_leading);
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
  bases_.clear();
  load_bases(ptrs);
  single_.assign(k_.input_types.size(), true);
  return args;
}

// The finish function: the calls' partials folded, call by call, then the global-level values
// and outputs computed from them.
void Emitter::emit_finish(const std::string& name) {
  llvm::Type* i64 = b_.getInt64Ty();
  const std::vector<llvm::Value*> args = begin_helper(name, {i64, i64, b_.getPtrTy()});
  llvm::Value* calls = args[0];
  llvm::Value* stride = args[1];
  llvm::Value* partials = args[2];
  const size_t num_inputs = k_.input_types.size();
  const size_t num_ptrs = num_inputs + k_.outputs.size();
  const std::vector<Level> level = instr_levels(k_);
  const size_t body_size = k_.body.size();
  std::vector<llvm::Value*> v(body_size, nullptr);
  std::vector<llvm::AllocaInst*> acc(body_size, nullptr);
  for (size_t n = 0; n < body_size; ++n) {
    const Instr& in = k_.body[n];
    if (!is_global_reduction(in)) continue;
    acc[n] = entry_alloca(value_type(in.type));
    b_.CreateStore(identity(in), acc[n]);
  }
  auto* done = llvm::BasicBlock::Create(ctx_, "combined", fn_);
  loop(
      b_.getInt64(0), calls, done,
      [&](llvm::Value* c) {
        for (size_t n = 0; n < body_size; ++n) {
          const Instr& in = k_.body[n];
          if (!acc[n]) continue;
          llvm::Value* slot = b_.CreateGEP(
              i64, partials, b_.CreateAdd(b_.CreateMul(c, stride), b_.getInt64(in.index)));
          llvm::Value* x = load(in.type, slot);
          llvm::Type* ty = value_type(in.type);
          b_.CreateStore(fold(in, b_.CreateLoad(ty, acc[n]), x, false), acc[n]);
        }
      },
      false);
  b_.SetInsertPoint(done);
  const std::vector<llvm::Value*> origin(num_ptrs, b_.getInt64(0));
  for (size_t n = 0; n < body_size; ++n) {
    if (acc[n]) {
      v[n] = b_.CreateLoad(value_type(k_.body[n].type), acc[n]);
      continue;
    }
    if (level[n] == Level::kGlobal || level[n] == Level::kConst) v[n] = compute(n, v, origin);
  }
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const auto n = static_cast<size_t>(k_.outputs[o]);
    if (level[n] != Level::kGlobal) continue;
    const DType t = k_.output_types[o];
    store_value(t, v[n], bases_[num_inputs + o]);
  }
  b_.CreateRetVoid();
}

// The columns function. Per slot, the calls' partials fold into the first call's, call after call
// (each position in call order, so in row order: the result does not depend on how calls were
// spread over threads), in a loop over positions that vectorizes; then each position's outputs
// are computed from the slot's value.
void Emitter::emit_columns(const std::string& name) {
  llvm::Type* i64 = b_.getInt64Ty();
  llvm::Type* ptr = b_.getPtrTy();
  const std::vector<llvm::Value*> args = begin_helper(name, {i64, i64, i64, i64, i64, ptr});
  Columns columns{args[0], args[1], args[2], args[3], args[4]};
  llvm::Value* partials = args[5];
  columns.slot_of = column_slots(instr_levels(k_));
  columns.base = column_bases(partials, columns.R);
  columns.origin.assign(k_.input_types.size() + k_.outputs.size(), b_.getInt64(0));
  for (int32_t s = 0; s < k_.num_columns(); ++s) {
    llvm::Value* width =
        b_.CreateMul(columns.R, b_.getInt64(k_.column_parts[static_cast<size_t>(s)]));
    llvm::Value* hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, columns.end, width);
    combine_column_calls(columns, s, hi);
    const std::vector<bool> needed = needed_by_slot(s, columns.slot_of);
    if (!needed.empty()) store_column_outputs(columns, s, hi, needed);
  }
  b_.CreateRetVoid();
}

// Each column slot's first position in a call's partials (Kernel::column_offset), for rows of
// length R.
std::vector<llvm::Value*> Emitter::column_bases(llvm::Value* partials, llvm::Value* R) {
  std::vector<llvm::Value*> base;
  int64_t parts = 0;
  for (int32_t s = 0; s < k_.num_columns(); ++s) {
    llvm::Value* offset =
        b_.CreateAdd(b_.getInt64(k_.num_globals), b_.CreateMul(R, b_.getInt64(parts)));
    base.push_back(b_.CreateGEP(b_.getInt64Ty(), partials, offset, "column_base"));
    parts += k_.column_parts[static_cast<size_t>(s)];
  }
  return base;
}

// A column reduction folding into slot s (its parts' reductions share the type and the fold).
size_t Emitter::column_reduction_of(int32_t s) const {
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (is_column_reduction(k_.body[n]) && k_.body[n].index == s) return n;
  KILN_CHECK(false, "fuser: column slot ", s, " has no reduction\n", k_.str());
  return 0;
}

// The slot each column-level instruction derives from (one: nothing combines two slots), or -1.
std::vector<int32_t> Emitter::column_slots(const std::vector<Level>& level) const {
  std::vector<int32_t> slot_of(k_.body.size(), -1);
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const Instr& in = k_.body[n];
    if (is_column_reduction(in)) {
      slot_of[n] = in.index;
      continue;
    }
    if (level[n] != Level::kColumn) continue;
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0 && slot_of[static_cast<size_t>(o)] >= 0)
        slot_of[n] = slot_of[static_cast<size_t>(o)];
  }
  return slot_of;
}

// Slot s's positions [begin, hi) of calls 1... folded into the first call's, call after call.
void Emitter::combine_column_calls(const Columns& columns, int32_t s, llvm::Value* hi) {
  const Instr& r = k_.body[column_reduction_of(s)];
  llvm::Type* st = storage_type(r.type);
  llvm::Value* base = columns.base[static_cast<size_t>(s)];
  auto* combined = llvm::BasicBlock::Create(ctx_, "combined", fn_);
  loop(
      b_.getInt64(1), columns.calls, combined,
      [&](llvm::Value* c) {
        llvm::Value* from = b_.CreateGEP(b_.getInt64Ty(), base, b_.CreateMul(c, columns.stride));
        auto* call_done = llvm::BasicBlock::Create(ctx_, "call_done", fn_);
        loop(columns.begin, hi, call_done, [&](llvm::Value* j) {
          llvm::Value* at = b_.CreateGEP(st, base, j);
          llvm::Value* x = load(r.type, b_.CreateGEP(st, from, j));
          store_value(r.type, fold(r, load(r.type, at), x, false), at);
        });
        b_.SetInsertPoint(call_done);
      },
      false);
  b_.SetInsertPoint(combined);
}

// What slot s's outputs need: column-level instructions of the slot and constants (empty when
// no output derives from the slot).
std::vector<bool> Emitter::needed_by_slot(int32_t s, const std::vector<int32_t>& slot_of) const {
  std::vector<size_t> work;
  for (int32_t o : k_.outputs)
    if (slot_of[static_cast<size_t>(o)] == s) work.push_back(static_cast<size_t>(o));
  if (work.empty()) return {};
  std::vector<bool> needed(k_.body.size(), false);
  while (!work.empty()) {
    const size_t n = work.back();
    work.pop_back();
    if (needed[n]) continue;
    needed[n] = true;
    if (is_column_reduction(k_.body[n])) continue;
    for (int32_t o : {k_.body[n].a, k_.body[n].b, k_.body[n].c})
      if (o >= 0) work.push_back(static_cast<size_t>(o));
  }
  return needed;
}

// Slot s's outputs at positions [begin, hi), computed from the slot's combined values.
void Emitter::store_column_outputs(const Columns& columns, int32_t s, llvm::Value* hi,
                                   const std::vector<bool>& needed) {
  const Instr& r = k_.body[column_reduction_of(s)];
  llvm::Type* st = storage_type(r.type);
  llvm::Value* base = columns.base[static_cast<size_t>(s)];
  const size_t num_inputs = k_.input_types.size();
  auto* stored = llvm::BasicBlock::Create(ctx_, "stored", fn_);
  loop(columns.begin, hi, stored, [&](llvm::Value* j) {
    std::vector<llvm::Value*> v(k_.body.size(), nullptr);
    for (size_t n = 0; n < k_.body.size(); ++n) {
      if (!needed[n]) continue;
      v[n] = is_column_reduction(k_.body[n]) ? load(r.type, b_.CreateGEP(st, base, j))
                                             : compute(n, v, columns.origin);
    }
    for (size_t o = 0; o < k_.outputs.size(); ++o) {
      const auto n = static_cast<size_t>(k_.outputs[o]);
      if (columns.slot_of[n] != s) continue;
      const DType t = k_.output_types[o];
      store_value(t, v[n], b_.CreateGEP(storage_type(t), bases_[num_inputs + o], j));
    }
  });
  b_.SetInsertPoint(stored);
}

}  // namespace kiln::fuser::cpu
