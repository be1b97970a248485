// The IR of rows kernels: the passes of the rows plan (fuser/rows_plan.h) over each row.
//
// Each pass runs over the row's elements, folding the row, global and column reductions, then the
// row-level outputs. Kernels with column reductions take their rows in bands (see kBandRows).
#include <cstdint>
#include <vector>

#include "fuser/codegen/llvm/emitter.h"
#include "fuser/rows_plan.h"
#include "kiln/error.h"

namespace kiln::fuser::cpu {

namespace {
// Rows of a kernel whose last pass folds only column reductions go in bands of kBandRows: each
// row's earlier passes, then the last pass over the band's rows together, position by position,
// so that a column partial (8 bytes a position, a row's length per slot: 64 KiB for layer_norm's
// two sums over rows of 4096) is loaded and stored once per band, not once per row. A row at a
// time, those partials went through L2 with every row and cost layer_norm's backward a third of
// its time. Each position still folds the rows in order: the same bits as a row at a time.
// Eight rows measured best (tools/bench/RESULTS.md): layer_norm's traced backward 8.8 ms a row at
// a time, 7.3 in bands of 4, 6.6-6.9 of 8, 7.4 of 16; each band row is one more copy of the last
// pass's body to compile (47, 63, 76 ms for that kernel in bands of 4, 8, 16).
constexpr int64_t kBandRows = 8;

// Whether the kernel's rows go in bands (see kBandRows): its last pass folds column reductions
// and nothing else.
bool in_bands(const Kernel& k, const RowsPasses& plan) {
  if (k.num_columns() == 0 || plan.final_pass < 0) return false;
  for (size_t r : plan.roots_of[static_cast<size_t>(plan.final_pass)])
    if (!is_column_reduction(k.body[r])) return false;
  return true;
}
}  // namespace

// What the steps of a rows kernel share.
struct Emitter::Rows {
  const Layout& layout;
  RowsPasses plan;                           // which reductions each pass folds (every one)
  llvm::Value* partials = nullptr;           // the call's partials (see KernelFn)
  Geometry g{};                              // rank + 1 dimensions, the last one along the row
  llvm::Value* row_length = nullptr;         // g.size[rank]
  std::vector<llvm::AllocaInst*> acc{};      // per row or global reduction: its accumulator
  std::vector<llvm::Value*> column_base{};   // per column slot: its first position in partials
  std::vector<int32_t> first_pass{};         // per instruction: the first pass needing it, or -1
  std::vector<bool> buffered{};              // per instruction: kept in a row buffer
  int64_t band = 1;                          // rows per band (kBandRows, or 1: no bands)
  std::vector<llvm::Value*> buffer_block{};  // per buffered instruction: a buffer per band row
  std::vector<llvm::Value*> row_buffer{};    // per buffered instruction: the current row's buffer
  std::vector<llvm::Value*> start{};         // the current row's first element, per pointer
  std::vector<llvm::Value*> v{};             // the current row's row-level and constant values
};

// What a band's rows keep for its last pass, per row of the band ([band x type] arrays).
struct Emitter::Band {
  std::vector<llvm::AllocaInst*> start;  // per pointer: each row's first element
  std::vector<llvm::AllocaInst*> value;  // per instruction: each row's value (row-level ones)
};

// One pass over a row's elements.
struct Emitter::Pass {
  int32_t index;                  // in the plan
  bool last;                      // the final pass, which stores the element-level outputs
  std::vector<bool> from_buffer;  // per instruction: read back from its row buffer
  std::vector<bool> needed;       // per instruction: computed (or read back) in this pass
};

// A rows kernel (see Layout): for each row, passes over its elements that fold the row
// reductions available so far, the last one also storing element-level outputs; then the
// row-level outputs; global reductions fold into `partials`.
void Emitter::emit_rows(const Layout& layout, const KernelArgs& args) {
  Rows rows{layout, plan_rows(k_, [](size_t) { return true; })};
  rows.partials = args.partials;
  rows.band = in_bands(k_, rows.plan) ? kBandRows : 1;
  single_.assign(k_.input_types.size(), false);
  load_bases(args.ptrs);
  rows.g = load_geometry(args.sizes, args.strides, layout.rank + 1);
  rows.row_length = rows.g.size[layout.rank];
  start_accumulators(rows);
  start_column_partials(rows);
  plan_row_buffers(rows);
  const llvm::FunctionCallee free_fn = allocate_row_buffers(rows);
  auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
  llvm::Value* rest = rows.band > 1 ? emit_bands(rows, args.begin, args.end) : args.begin;
  select_row_buffers(rows, b_.getInt64(0));
  loop(
      rest, args.end, exit, [&](llvm::Value* row) { emit_row(rows, row); }, false);
  b_.SetInsertPoint(exit);
  store_global_partials(rows, args.partials);
  for (llvm::Value* buffer : rows.buffer_block)
    if (buffer) b_.CreateCall(free_fn, {buffer});
  b_.CreateRetVoid();
}

// Global accumulators, folded over every row of the call, start at the identity; row
// accumulators get theirs at each pass.
void Emitter::start_accumulators(Rows& rows) {
  rows.acc.assign(k_.body.size(), nullptr);
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const Instr& in = k_.body[n];
    if (!is_reduction(in.prim) || is_column_reduction(in)) continue;
    rows.acc[n] = entry_alloca(value_type(in.type));
    if (is_global_reduction(in)) b_.CreateStore(identity(in), rows.acc[n]);
  }
}

// Column partials: each slot's positions start at the identity, then every row of the call
// folds into them, position by position (a loop that vectorizes across the row).
void Emitter::start_column_partials(Rows& rows) {
  rows.column_base = column_bases(rows.partials, rows.row_length);
  for (int32_t s = 0; s < k_.num_columns(); ++s) {
    const Instr& r = k_.body[column_reduction_of(s)];
    auto* done = llvm::BasicBlock::Create(ctx_, "columns_ready", fn_);
    llvm::Value* width = b_.CreateMul(rows.row_length, b_.getInt64(k_.column_parts[s]));
    loop(b_.getInt64(0), width, done, [&](llvm::Value* j) {
      store_value(r.type, identity(r), b_.CreateGEP(storage_type(r.type), rows.column_base[s], j));
    });
    b_.SetInsertPoint(done);
  }
}

// Element-level instructions pass `pass` needs, not looking past values it reads from a row
// buffer (`from_buffer`).
std::vector<bool> Emitter::needed_in(const Rows& rows, int32_t pass,
                                     const std::vector<bool>& from_buffer) const {
  const std::vector<Level>& level = rows.plan.level;
  std::vector<bool> needed(k_.body.size(), false);
  std::vector<size_t> work;
  for (size_t r : rows.plan.roots_of[pass]) work.push_back(static_cast<size_t>(k_.body[r].a));
  if (rows.plan.stores_in[pass])
    for (int32_t o : k_.outputs)
      if (level[static_cast<size_t>(o)] == Level::kElement) work.push_back(static_cast<size_t>(o));
  while (!work.empty()) {
    const size_t n = work.back();
    work.pop_back();
    if (needed[n] || level[n] != Level::kElement) continue;
    needed[n] = true;
    if (from_buffer[n]) continue;
    const Instr& in = k_.body[n];
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0) work.push_back(static_cast<size_t>(o));
  }
  return needed;
}

// A transcendental that several passes need is computed once per element, in the first of
// them, and kept in a row buffer that later passes read (softmax's exp: computed while
// summing, read back while scaling). The buffer holds one row, so it stays in cache.
void Emitter::plan_row_buffers(Rows& rows) {
  const size_t body_size = k_.body.size();
  rows.first_pass.assign(body_size, -1);
  rows.buffered.assign(body_size, false);
  const std::vector<bool> none(body_size, false);
  std::vector<int32_t> passes_needing(body_size, 0);
  for (int32_t pass = 0; pass <= rows.plan.final_pass; ++pass) {
    const std::vector<bool> needed = needed_in(rows, pass, none);
    for (size_t n = 0; n < body_size; ++n) {
      if (!needed[n]) continue;
      if (rows.first_pass[n] < 0) rows.first_pass[n] = pass;
      ++passes_needing[n];
    }
  }
  for (size_t n = 0; n < body_size; ++n)
    rows.buffered[n] =
        passes_needing[n] > 1 && k_.body[n].type != kBool && is_costly(k_.body[n].prim);
}

// The row buffers, of row_length + 1 values per band row; returns `free`, for the kernel's exit.
llvm::FunctionCallee Emitter::allocate_row_buffers(Rows& rows) {
  llvm::Type* i64 = b_.getInt64Ty();
  llvm::Type* ptr = b_.getPtrTy();
  llvm::FunctionCallee malloc_fn =
      m_.getOrInsertFunction("malloc", llvm::FunctionType::get(ptr, {i64}, false));
  llvm::FunctionCallee free_fn =
      m_.getOrInsertFunction("free", llvm::FunctionType::get(b_.getVoidTy(), {ptr}, false));
  rows.buffer_block.assign(k_.body.size(), nullptr);
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!rows.buffered[n]) continue;
    const uint64_t bytes = m_.getDataLayout().getTypeAllocSize(value_type(k_.body[n].type));
    llvm::Value* values =
        b_.CreateMul(b_.CreateAdd(rows.row_length, b_.getInt64(1)), b_.getInt64(rows.band));
    rows.buffer_block[n] =
        b_.CreateCall(malloc_fn, {b_.CreateMul(values, b_.getInt64(bytes))}, "row_buffers");
  }
  return free_fn;
}

// The buffers of row r of a band (of the only row without bands) become the current row's.
void Emitter::select_row_buffers(Rows& rows, llvm::Value* r) {
  rows.row_buffer.assign(k_.body.size(), nullptr);
  llvm::Value* first = b_.CreateMul(r, b_.CreateAdd(rows.row_length, b_.getInt64(1)));
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (rows.buffer_block[n])
      rows.row_buffer[n] =
          b_.CreateGEP(value_type(k_.body[n].type), rows.buffer_block[n], first, "row_buffer");
}

// One row: its row-level values, the passes of the plan, then its row-level outputs and the
// global reductions of row-level values.
void Emitter::emit_row(Rows& rows, llvm::Value* row) {
  begin_row(rows, row);
  emit_passes(rows, rows.plan.final_pass);
  finish_row(rows);
}

// The row's first elements and its values of stage 0.
void Emitter::begin_row(Rows& rows, llvm::Value* row) {
  rows.start = row_start(rows, row);
  rows.v.assign(k_.body.size(), nullptr);
  row_values(rows, 0);
}

// The passes 0 to `last` of the plan (those with something to fold or store).
void Emitter::emit_passes(Rows& rows, int32_t last) {
  for (int32_t pass = 0; pass <= last; ++pass) {
    const auto p = static_cast<size_t>(pass);
    if (rows.plan.roots_of[p].empty() && !rows.plan.stores_in[p]) continue;
    emit_pass(rows, pass);
  }
}

// The row's row-level outputs and its folds into global reductions of row-level values.
void Emitter::finish_row(Rows& rows) {
  store_row_outputs(rows);
  fold_row_level_globals(rows);
}

// The call's whole bands of rows from `begin`; returns the first row after them.
llvm::Value* Emitter::emit_bands(Rows& rows, llvm::Value* begin, llvm::Value* end) {
  llvm::Value* band = b_.getInt64(rows.band);
  llvm::Value* bands = b_.CreateSDiv(b_.CreateSub(end, begin), band);
  auto* done = llvm::BasicBlock::Create(ctx_, "bands_done", fn_);
  loop(
      b_.getInt64(0), bands, done,
      [&](llvm::Value* i) { emit_band(rows, b_.CreateAdd(begin, b_.CreateMul(i, band))); }, false);
  b_.SetInsertPoint(done);
  return b_.CreateAdd(begin, b_.CreateMul(bands, band));
}

// One band: each row's passes before the last (keeping its first elements and row values for
// the last), then the last pass over the band's rows together.
void Emitter::emit_band(Rows& rows, llvm::Value* first_row) {
  Band band;
  auto* rows_done = llvm::BasicBlock::Create(ctx_, "band_rows_done", fn_);
  loop(
      b_.getInt64(0), b_.getInt64(rows.band), rows_done,
      [&](llvm::Value* r) {
        select_row_buffers(rows, r);
        begin_row(rows, b_.CreateAdd(first_row, r));
        emit_passes(rows, rows.plan.final_pass - 1);
        finish_row(rows);
        band = keep_for_band(rows, r);
      },
      false);
  b_.SetInsertPoint(rows_done);
  emit_band_last_pass(rows, band);
}

// The current row's first elements and (non-constant) row values, stored at row r of the band's
// arrays.
Emitter::Band Emitter::keep_for_band(const Rows& rows, llvm::Value* r) {
  auto keep = [&](llvm::Value* x) {
    llvm::AllocaInst* array = entry_alloca(llvm::ArrayType::get(x->getType(), rows.band));
    b_.CreateStore(x, b_.CreateInBoundsGEP(array->getAllocatedType(), array, {b_.getInt64(0), r}));
    return array;
  };
  Band band;
  for (llvm::Value* start : rows.start) band.start.push_back(keep(start));
  band.value.assign(rows.v.size(), nullptr);
  for (size_t n = 0; n < rows.v.size(); ++n)
    if (rows.v[n] && !llvm::isa<llvm::Constant>(rows.v[n])) band.value[n] = keep(rows.v[n]);
  return band;
}

// Row r of the band, read back before its last pass: first elements, row values, row buffers.
void Emitter::restore_band_row(Rows& rows, const Band& band, int64_t r,
                               const std::vector<llvm::Value*>& constants) {
  auto at = [&](llvm::AllocaInst* array) {
    llvm::Type* type = array->getAllocatedType();
    llvm::Value* address = b_.CreateInBoundsGEP(type, array, {b_.getInt64(0), b_.getInt64(r)});
    return b_.CreateLoad(type->getArrayElementType(), address);
  };
  rows.start.clear();
  for (llvm::AllocaInst* start : band.start) rows.start.push_back(at(start));
  rows.v = constants;
  for (size_t n = 0; n < band.value.size(); ++n)
    if (band.value[n]) rows.v[n] = at(band.value[n]);
  select_row_buffers(rows, b_.getInt64(r));
}

// The last pass over a band's rows: at each position, the element of every row in turn, folded
// into the column partials in row order, each partial loaded and stored once.
void Emitter::emit_band_last_pass(Rows& rows, const Band& band) {
  const Pass pass = pass_of(rows, rows.plan.final_pass);
  std::vector<llvm::Value*> constants(rows.v.size(), nullptr);
  for (size_t n = 0; n < rows.v.size(); ++n)
    if (rows.v[n] && llvm::isa<llvm::Constant>(rows.v[n])) constants[n] = rows.v[n];
  std::vector<Rows> band_rows(static_cast<size_t>(rows.band), rows);
  for (int64_t r = 0; r < rows.band; ++r)
    restore_band_row(band_rows[static_cast<size_t>(r)], band, r, constants);
  const std::vector<size_t>& roots = rows.plan.roots_of[static_cast<size_t>(pass.index)];
  auto* pass_done = llvm::BasicBlock::Create(ctx_, "pass_done", fn_);
  loop(b_.getInt64(0), rows.row_length, pass_done, [&](llvm::Value* j) {
    std::vector<llvm::Value*> at(roots.size());
    std::vector<llvm::Value*> acc(roots.size());
    for (size_t i = 0; i < roots.size(); ++i) {
      at[i] = column_position(rows, k_.body[roots[i]], j);
      acc[i] = load(k_.body[roots[i]].type, at[i]);
    }
    for (Rows& row : band_rows) {
      std::vector<llvm::Value*> offsets;
      const std::vector<llvm::Value*> e = element_values(row, pass, j, offsets);
      for (size_t i = 0; i < roots.size(); ++i) {
        const Instr& in = k_.body[roots[i]];
        acc[i] = fold(in, acc[i], e[static_cast<size_t>(in.a)], false);
      }
      store_element_outputs(e, offsets, row);
    }
    for (size_t i = 0; i < roots.size(); ++i) store_value(k_.body[roots[i]].type, acc[i], at[i]);
  });
  b_.SetInsertPoint(pass_done);
}

// The row's first element per pointer, from the row's index over the outer dims.
std::vector<llvm::Value*> Emitter::row_start(const Rows& rows, llvm::Value* row) {
  const size_t num_ptrs = k_.input_types.size() + k_.outputs.size();
  std::vector<llvm::Value*> start(num_ptrs, b_.getInt64(0));
  llvm::Value* rem = row;
  for (int d = rows.layout.rank - 1; d >= 0; --d) {
    llvm::Value* idx = d == 0 ? rem : b_.CreateURem(rem, rows.g.size[d]);
    if (d > 0) rem = b_.CreateUDiv(rem, rows.g.size[d]);
    for (size_t p = 0; p < num_ptrs; ++p)
      start[p] = b_.CreateAdd(start[p], b_.CreateMul(idx, rows.g.stride[p][d]));
  }
  return start;
}

// Row-level and constant instructions of stage `s`, at the row's start.
void Emitter::row_values(Rows& rows, int32_t s) {
  const std::vector<Level>& level = rows.plan.level;
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (rows.plan.stage[n] != s || rows.v[n]) continue;
    if (level[n] != Level::kRow && level[n] != Level::kConst) continue;
    if (is_reduction(k_.body[n].prim)) continue;
    rows.v[n] = compute(n, rows.v, rows.start);
  }
}

// A loop over the row's elements folding the pass's reductions; after it, the row reductions'
// values and the row-level values of the next stage.
void Emitter::emit_pass(Rows& rows, int32_t pass) {
  const std::vector<size_t>& roots = rows.plan.roots_of[pass];
  const Pass p = pass_of(rows, pass);
  for (size_t r : roots)
    if (is_row_reduction(k_.body[r])) b_.CreateStore(identity(k_.body[r]), rows.acc[r]);
  auto* pass_done = llvm::BasicBlock::Create(ctx_, "pass_done", fn_);
  loop(b_.getInt64(0), rows.row_length, pass_done,
       [&](llvm::Value* j) { pass_element(rows, p, j); });
  b_.SetInsertPoint(pass_done);
  for (size_t r : roots)
    if (is_row_reduction(k_.body[r]))
      rows.v[r] = b_.CreateLoad(value_type(k_.body[r].type), rows.acc[r]);
  row_values(rows, pass + 1);
}

// Pass `pass` over a row: which values it computes and which it reads back from row buffers
// (values buffered by an earlier pass).
Emitter::Pass Emitter::pass_of(const Rows& rows, int32_t pass) const {
  Pass p{pass, pass == rows.plan.final_pass, std::vector<bool>(k_.body.size(), false), {}};
  for (size_t n = 0; n < k_.body.size(); ++n)
    p.from_buffer[n] = rows.buffered[n] && rows.first_pass[n] < pass;
  p.needed = needed_in(rows, pass, p.from_buffer);
  return p;
}

// Element j of the row in a pass: its folds, and in the last pass the element-level outputs.
void Emitter::pass_element(Rows& rows, const Pass& pass, llvm::Value* j) {
  std::vector<llvm::Value*> offsets;
  const std::vector<llvm::Value*> e = element_values(rows, pass, j, offsets);
  fold_roots(rows, pass, e, j);
  if (pass.last) store_element_outputs(e, offsets, rows);
}

// The values element j of the current row needs in a pass (a buffered one stored in, or read
// back from, its row buffer), and each pointer's offset of that element.
std::vector<llvm::Value*> Emitter::element_values(const Rows& rows, const Pass& pass,
                                                  llvm::Value* j,
                                                  std::vector<llvm::Value*>& offsets) {
  const size_t num_ptrs = k_.input_types.size() + k_.outputs.size();
  const int rank = rows.layout.rank;
  offsets.assign(num_ptrs, nullptr);
  for (size_t p = 0; p < num_ptrs; ++p)
    offsets[p] = inner_offset(rows.layout.inner[p], rows.start[p], j, rows.g.stride[p][rank]);
  std::vector<llvm::Value*> e = rows.v;
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!pass.needed[n]) continue;
    llvm::Type* ty = value_type(k_.body[n].type);
    if (pass.from_buffer[n]) {
      e[n] = b_.CreateLoad(ty, b_.CreateGEP(ty, rows.row_buffer[n], j));
      continue;
    }
    e[n] = compute(n, e, offsets);
    if (rows.buffered[n] && rows.first_pass[n] == pass.index)
      b_.CreateStore(e[n], b_.CreateGEP(ty, rows.row_buffer[n], j));
  }
  return e;
}

// The pass's reductions fold element j's values: a row or global one into its accumulator
// (reassociating), a column one into position j of its slot's part.
void Emitter::fold_roots(Rows& rows, const Pass& pass, const std::vector<llvm::Value*>& e,
                         llvm::Value* j) {
  for (size_t r : rows.plan.roots_of[pass.index]) {
    const Instr& in = k_.body[r];
    llvm::Value* x = e[static_cast<size_t>(in.a)];
    if (is_column_reduction(in)) {
      llvm::Value* at = column_position(rows, in, j);
      store_value(in.type, fold(in, load(in.type, at), x, false), at);
      continue;
    }
    llvm::Type* ty = value_type(in.type);
    b_.CreateStore(fold(in, b_.CreateLoad(ty, rows.acc[r]), x, true), rows.acc[r]);
  }
}

// Column reduction `in`'s partial at position j of its slot's part: no two elements of a row
// share it.
llvm::Value* Emitter::column_position(const Rows& rows, const Instr& in, llvm::Value* j) {
  return b_.CreateGEP(storage_type(in.type), rows.column_base[static_cast<size_t>(in.index)],
                      b_.CreateAdd(b_.CreateMul(rows.row_length, b_.getInt64(in.part)), j));
}

// The outputs stored element by element, at element j's offsets.
void Emitter::store_element_outputs(const std::vector<llvm::Value*>& e,
                                    const std::vector<llvm::Value*>& offsets, const Rows& rows) {
  const size_t num_inputs = k_.input_types.size();
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const auto n = static_cast<size_t>(k_.outputs[o]);
    if (!stored_per_element(k_, rows.plan.level, o)) continue;
    const size_t p = num_inputs + o;
    const DType t = k_.output_types[o];
    store_value(t, e[n], b_.CreateGEP(storage_type(t), bases_[p], offsets[p]));
  }
}

// The outputs of one value per row, at the row's start.
void Emitter::store_row_outputs(const Rows& rows) {
  const std::vector<Level>& level = rows.plan.level;
  const size_t num_inputs = k_.input_types.size();
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const auto n = static_cast<size_t>(k_.outputs[o]);
    if ((level[n] != Level::kRow && level[n] != Level::kConst) || stored_per_element(k_, level, o))
      continue;
    const size_t p = num_inputs + o;
    const DType t = k_.output_types[o];
    KILN_CHECK(rows.v[n], "fuser: row-level output ", n, " not computed\n", k_.str());
    store_value(t, rows.v[n], b_.CreateGEP(storage_type(t), bases_[p], rows.start[p]));
  }
}

// Global reductions of a row-level value fold it once per row.
void Emitter::fold_row_level_globals(Rows& rows) {
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const Instr& in = k_.body[n];
    if (!is_global_reduction(in)) continue;
    const auto a = static_cast<size_t>(in.a);
    if (rows.plan.level[a] == Level::kElement) continue;
    KILN_CHECK(rows.v[a], "fuser: row-level operand ", a, " not computed\n", k_.str());
    llvm::Type* ty = value_type(in.type);
    b_.CreateStore(fold(in, b_.CreateLoad(ty, rows.acc[n]), rows.v[a], false), rows.acc[n]);
  }
}

// The global reductions' values over the call's rows, into their slots of `partials`.
void Emitter::store_global_partials(const Rows& rows, llvm::Value* partials) {
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const Instr& in = k_.body[n];
    if (!is_global_reduction(in)) continue;
    store_value(in.type, b_.CreateLoad(value_type(in.type), rows.acc[n]),
                b_.CreateConstGEP1_64(b_.getInt64Ty(), partials, in.index));
  }
}

}  // namespace kiln::fuser::cpu
