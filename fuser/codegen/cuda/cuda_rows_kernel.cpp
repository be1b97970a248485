// The rows kernel's source (Layout::rows): one thread block per band of rows, its threads
// striding along each row, pass by pass as the LLVM emitter's rows kernel (fuser/rows_plan.h).
//
// A rows kernel (see Layout and cuda_codegen.h) is up to three CUDA kernels: this one; the finish
// kernel (global reductions) and the columns kernel (column reductions), which combine the blocks'
// partials (cuda_rows_combine.cpp). They compute what the LLVM emitter's rows kernel, finish and
// columns functions compute, pass by pass (instr_stages), with the same folds; what differs is
// where values are kept: a reduction's value is folded per thread and then over the block
// (kiln_block_reduce), and an expensive value several passes need is recomputed in each rather
// than kept in a row buffer (the same value: the computation is deterministic).
//
// Row r of the call goes to block r / chunk (chunk = ceil(rows / gridDim.x)): each block walks a
// band of consecutive rows, as one CPU call walks its range, so that a global reduction of
// row-level values and the column partials fold the band's rows in row order, and combining the
// blocks in block order is combining the CPU's calls in call order. Any grid size is correct.
// Within a row, thread t takes quads q = t, t + blockDim.x, ... and in each positions 4q to
// 4q + 3 (those < R), in that order, in every variant: a pass folds each row reduction per
// thread and then over the block, and every thread gets the row's value for the next pass. The
// vec variant moves a whole quad of each pointer that moves along the row with one 16-byte
// access (KilnQuad: loaded before the quad's positions are computed, stored after), so it reads
// and writes what the scalar loop does and folds in its order: the same bits.
// Each load of the row that several passes read is kept in shared memory by the first of them
// (each thread keeps the positions it reads, so no barrier is needed) and read back by the later
// ones instead of global memory: a row cache per load, one after another in the launch's dynamic
// shared memory, each used where it fits (the launcher gives room to the first ones within
// CudaRowsPolicy::row_cache_bytes, past 48 KiB by the device's opt-in: rows_shared_bytes). The
// values are the same either way.
// The per_thread variant keeps values in registers instead (kiln_r<n>[4 * m + l], position l of
// the thread's m-th quad), up to 64 per thread: what a later pass reads of an earlier
// pass's element-level values (the frontier: exp(x - max) for softmax's last pass, not x and
// the subtraction again), then the loads of each pass, each loaded by an unrolled loop of its own
// before its pass computes, so that a thread has all its loads in flight at once.
//
// The loop over a band's rows is written first (row_values, rows_pass, first_thread), to learn
// which pointers' row starts it reads; then the kernel around it (rows_prologue, the column
// partials, band_loop, global_partials) and its entry point.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "fuser/codegen/cuda/cuda_values.h"
#include "kiln/error.h"

namespace kiln::fuser::cuda::codegen {

// What the emission steps of one rows kernel share.
struct Source::RowsKernel {
  explicit RowsKernel(const RowsPlan& plan) : p(plan) {}
  const RowsPlan& p;
  RowsPasses passes;                // the passes over a row (fuser/rows_plan.h)
  RowCache cache;                   // what each pass computes, and what it keeps
  bool any_per_element = false;     // the last pass stores outputs element by element
  bool any_global = false;          // live global reductions ...
  bool any_column = false;          // ... and column reductions
  bool loops = false;               // some pass loops over a row's positions
  std::vector<bool> emitted;        // row-level values (row reductions included) computed
  std::vector<bool> row_ptr;        // pointers whose row start the loop reads
  std::vector<bool> cache_written;  // shared-memory cached loads written by their first pass
  // vec: per input, the row cache the current pass reads its quads back from ("": global memory),
  // and the pass's quads kept in the row cache after its positions are computed.
  std::vector<std::string> quad_cache;
  std::string quad_cache_stores;
  std::string row;  // the body of the loop over a band's rows
};

namespace {
std::string cache_name(size_t n) {
  return "kiln_row" + std::to_string(n);
}
// Whether the row cache named `cache` (cache_name) has room in this launch.
std::string cache_fits(const std::string& cache) {
  return cache + "_fits";
}
std::string register_name(size_t n) {
  return "kiln_r" + std::to_string(n);
}
std::string column_registers(int32_t slot) {
  return "kiln_c" + std::to_string(slot);
}
// The per_thread variant's register of position j: the l-th of the thread's m-th quad.
std::string register_at(const std::string& registers) {
  return registers + "[4 * m + l]";
}
std::string quad_name(size_t p) {
  return "kiln_q" + std::to_string(p);
}
// `text` with `spaces` more spaces before each line.
std::string indented(const std::string& text, size_t spaces) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size() - 1) + 1;
    out += std::string(spaces, ' ') + text.substr(at, end - at);
    at = end;
  }
  return out;
}
}  // namespace

void Source::rows_kernel(const RowsPlan& p) {
  RowsKernel r(p);
  r.passes = rows_passes(p);
  const int32_t final_pass = r.passes.final_pass;
  r.any_per_element = final_pass >= 0 && r.passes.stores_in[final_pass];
  for (size_t n = 0; n < k_.body.size(); ++n) {
    r.any_global |= live_global(p, n);
    r.any_column |= live_column(p, n);
  }
  r.cache = plan_row_cache(pass_work(r.passes, p.level), p.level);
  r.emitted.assign(k_.body.size(), false);
  r.cache_written.assign(k_.body.size(), false);
  r.row_ptr.assign(num_ptrs(), false);
  // The loop over a band's rows, written first to learn which pointers' row starts it reads.
  register_declarations(r);
  row_values(r, 0);
  for (int32_t pass = 0; pass <= final_pass; ++pass) rows_pass(r, pass);
  first_thread(r);
  check_row_values(r);
  // The kernel: sizes and strides, the block's partials, then the band's rows.
  rows_prologue(r);
  const std::string column_stores = column_partials(r);
  band_loop(r, column_stores);
  global_partials(r);
  out_ += "}\n";
  rows_entry();
}

// Pointer p's stride along dim d of the dims struct (the rank outer dims, then the row).
std::string Source::stride_of(size_t p, int dim) const {
  return "(S)d.stride[" +
         std::to_string(p * static_cast<size_t>(layout_.rank + 1) + static_cast<size_t>(dim)) + "]";
}

// A loop over the thread's quads of a row (q = 4 * (threadIdx.x + m * blockDim.x), m = 0, 1,
// ...) and over each quad's positions j = q + l (l < 4, j < R) around `body`, each quad's `before`
// and `after` (the vec variant's quad loads and stores) around its positions: a strided loop, or
// for the per_thread variant an unrolled one over m < K / 4.
std::string Source::row_loop(const std::string& body, const std::string& indent,
                             const std::string& before, const std::string& after) const {
  // The callers write `body` for the positions' depth in the generic loop, and `before` and
  // `after` for the quads' depth there; the per_thread loop is one level deeper.
  const int per_thread = variant_.per_thread;
  const size_t deeper = per_thread == 0 ? 0 : 2;
  const std::string in = indent + std::string(deeper, ' ');
  const std::string positions = indented(before, deeper) + in + "  #pragma unroll\n" + in +
                                "  for (int l = 0; l < 4; ++l) {\n" + in +
                                "    const U j = q + (U)l;\n" + in + "    if (j < R) {\n" +
                                indented(body, 4 + deeper) + in + "    }\n" + in + "  }\n" +
                                indented(after, deeper);
  if (per_thread == 0)
    return indent + "for (U q = 4 * (U)threadIdx.x; q < R; q += 4 * (U)blockDim.x) {\n" +
           positions + indent + "}\n";
  return indent + "#pragma unroll\n" + indent + "for (int m = 0; m < " +
         std::to_string(per_thread / 4) + "; ++m) {\n" + indent +
         "  const U q = 4 * ((U)threadIdx.x + (U)m * (U)blockDim.x);\n" + indent +
         "  if (q < R) {\n" + positions + indent + "  }\n" + indent + "}\n";
}

// Whether pointer p moves by quads: in the vec variant, every pointer that moves along the row.
bool Source::quad_ptr(size_t p) const {
  return variant_.vec && layout_.inner[p] == Layout::kUnit;
}

// The offsets at position j of a row of the pointers `used` (noting them in row_ptr: the row's
// start is computed for them), but for those that move by quads.
std::string Source::position_offsets(const std::vector<bool>& used, std::vector<bool>& row_ptr,
                                     const std::string& indent) const {
  std::string offsets;
  for (size_t q = 0; q < num_ptrs(); ++q) {
    if (!used[q]) continue;
    row_ptr[q] = true;
    if (quad_ptr(q)) continue;
    const std::string st = "st" + std::to_string(q);
    std::string off;
    switch (layout_.inner[q]) {
      case Layout::kZero:
        off = st;
        break;
      case Layout::kUnit:
        off = st + " + (S)j";
        break;
      case Layout::kAny:
        off = st + " + (S)j * " + stride_of(q, layout_.rank);
        break;
    }
    offsets += indent + "const S o" + std::to_string(q) + " = " + off + ";\n";
  }
  return offsets;
}

// The row-level values (and constants) of stage s that the rows kernel needs, inputs read at the
// row's start.
void Source::row_values(RowsKernel& r, int32_t s) {
  const size_t ni = k_.input_types.size();
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const Level l = r.p.level[n];
    if (r.p.stage[n] != s || r.emitted[n] || !r.p.rows_needed[n] || is_reduction(k_.body[n].prim) ||
        (l != Level::kRow && l != Level::kConst))
      continue;
    load_at_.assign(ni, "");
    for (size_t q = 0; q < ni; ++q) load_at_[q] = ptr_name(q) + "[st" + std::to_string(q) + "]";
    load_used_.assign(ni, false);
    r.row += "    " + decl(n) + " = " + expr(k_.body[n]) + ";\n";
    for (size_t q = 0; q < ni; ++q) r.row_ptr[q] = r.row_ptr[q] || load_used_[q];
    r.emitted[n] = true;
  }
}

// The per_thread variant's registers: K positions of each value it keeps.
void Source::register_declarations(RowsKernel& r) const {
  const int per_thread = variant_.per_thread;
  if (per_thread == 0) return;
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (r.cache.cached[n])
      r.row += "    " + std::string(value_type(k_.body[n].type)) + " " + register_name(n) + "[" +
               std::to_string(per_thread) + "];\n";
}

// One pass over the row: its row reductions' accumulators, the loop over the thread's positions
// (element-level values, folds, and in the last pass the element-level stores), the reductions
// over the block, then the row-level values the next stage computes from them.
void Source::rows_pass(RowsKernel& r, int32_t pass) {
  const std::vector<size_t>& roots = r.passes.roots_of[static_cast<size_t>(pass)];
  const bool last = pass == r.passes.final_pass;
  if (roots.empty() && !(last && r.any_per_element)) return;
  r.loops = true;
  for (size_t n : roots)
    if (is_row_reduction(k_.body[n]))
      r.row += "    " + std::string(value_type(k_.body[n].type)) + " a" + std::to_string(n) +
               " = " + identity(k_.body[n]) + ";\n";
  const size_t ni = k_.input_types.size();
  load_at_.assign(ni, "");
  for (size_t q = 0; q < ni; ++q)
    load_at_[q] =
        quad_ptr(q) ? quad_name(q) + ".v[l]" : ptr_name(q) + "[o" + std::to_string(q) + "]";
  r.quad_cache.assign(ni, "");
  r.quad_cache_stores.clear();
  if (variant_.per_thread > 0) r.row += pass_register_loads(r, pass);
  std::string loop = pass_element_values(r, pass);
  std::vector<bool> used = load_used_;
  loop += pass_folds(roots);
  if (last) loop += pass_stores(r, used);
  r.row += row_loop(position_offsets(used, r.row_ptr, "      ") + loop, "    ", quad_loads(r, used),
                    quad_stores(used) + r.quad_cache_stores);
  block_reductions(r, roots);
  row_values(r, pass + 1);
}

// The per_thread variant: the pass's loads kept in registers, all issued (an unrolled loop of
// their own) before the pass computes.
std::string Source::pass_register_loads(RowsKernel& r, int32_t pass) {
  load_used_.assign(num_ptrs(), false);
  std::string loads;
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!r.cache.cached[n] || r.cache.first[n] != pass || k_.body[n].prim != Prim::Load) continue;
    loads += "      " + register_at(register_name(n)) + " = " + expr(k_.body[n]) + ";\n";
  }
  if (loads.empty()) return "";
  return row_loop(position_offsets(load_used_, r.row_ptr, "      ") + loads, "    ",
                  quad_loads(r, load_used_));
}

// The vec variant's quads of the pointers `used` at quad q: each input's loaded (from the row
// cache where the pass reads a kept load back and the row fits), each output's to be filled.
std::string Source::quad_loads(const RowsKernel& r, const std::vector<bool>& used) const {
  const size_t ni = k_.input_types.size();
  std::string quads;
  for (size_t p = 0; p < num_ptrs(); ++p) {
    if (!used[p] || !quad_ptr(p)) continue;
    const std::string type = "KilnQuad<" + std::string(storage_type(ptr_type(p))) + "> ";
    if (p >= ni) {
      quads += "      " + type + quad_name(p) + ";\n";
      continue;
    }
    const std::string global =
        "kiln_load_quad(" + ptr_name(p) + " + st" + std::to_string(p) + " + (S)q, R - q)";
    const std::string& cache = r.quad_cache[p];
    quads += "      const " + type + quad_name(p) + " = " +
             (cache.empty()
                  ? global
                  : cache_fits(cache) + " ? kiln_load_quad(" + cache + " + q, R - q) : " + global) +
             ";\n";
  }
  return quads;
}

// The vec variant's stores of the output quads `used` at quad q.
std::string Source::quad_stores(const std::vector<bool>& used) const {
  std::string stores;
  for (size_t p = k_.input_types.size(); p < num_ptrs(); ++p)
    if (used[p] && quad_ptr(p))
      stores += "      kiln_store_quad(" + ptr_name(p) + " + st" + std::to_string(p) + " + (S)q, " +
                quad_name(p) + ", R - q);\n";
  return stores;
}

// The element-level values the pass computes at position j, noting the inputs they read in
// load_used_.
std::string Source::pass_element_values(RowsKernel& r, int32_t pass) {
  load_used_.assign(num_ptrs(), false);
  const std::vector<bool>& needed = r.cache.needed_of[static_cast<size_t>(pass)];
  std::string loop;
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (needed[n] && r.p.level[n] == Level::kElement) loop += element_value(r, n, pass);
  return loop;
}

// Value n at position j: computed, or read back from where an earlier pass kept it (registers in
// the per_thread variant, the row cache in shared memory otherwise), or computed and kept.
std::string Source::element_value(RowsKernel& r, size_t n, int32_t pass) {
  const bool cached = r.cache.cached[n], registers = variant_.per_thread > 0;
  const std::string value = v(static_cast<int32_t>(n));
  if (registers && cached && (r.cache.first[n] < pass || k_.body[n].prim == Prim::Load))
    return "      " + decl(n) + " = " + register_at(register_name(n)) + ";\n";
  if (registers && cached)  // computed here, kept for later passes
    return "      " + decl(n) + " = " + expr(k_.body[n]) + ";\n      " +
           register_at(register_name(n)) + " = " + value + ";\n";
  if (!cached) return "      " + decl(n) + " = " + expr(k_.body[n]) + ";\n";
  if (quad_ptr(static_cast<size_t>(k_.body[n].index))) return cached_quad(r, n);
  if (!r.cache_written[n]) {  // its first pass loads it and keeps it
    r.cache_written[n] = true;
    return "      " + decl(n) + " = " + expr(k_.body[n]) + ";\n      if (" +
           cache_fits(cache_name(n)) + ") " + cache_name(n) + "[j] = " + value + ";\n";
  }
  // later passes read it back
  return "      " + decl(n) + " = " + cache_fits(cache_name(n)) + " ? " + cache_name(n) +
         "[j] : " + expr(k_.body[n]) + ";\n";
}

// The vec variant's row cache of load n, of an input read by quads: its first pass keeps the
// input's quads after computing their positions, later passes read them back (quad_loads).
std::string Source::cached_quad(RowsKernel& r, size_t n) {
  const auto p = static_cast<size_t>(k_.body[n].index);
  if (!r.cache_written[n]) {
    r.cache_written[n] = true;
    r.quad_cache_stores += "      if (" + cache_fits(cache_name(n)) + ") kiln_store_quad(" +
                           cache_name(n) + " + q, " + quad_name(p) + ", R - q);\n";
  } else {
    r.quad_cache[p] = cache_name(n);
  }
  return "      " + decl(n) + " = " + expr(k_.body[n]) + ";\n";
}

// The folds of the pass's reductions at position j: row reductions into the thread's accumulator,
// global ones into the block's, column ones into the position's partial.
std::string Source::pass_folds(const std::vector<size_t>& roots) const {
  std::string loop;
  for (size_t n : roots) {
    const Instr& in = k_.body[n];
    const std::string x = v(in.a), f = fold_name(in);
    if (is_row_reduction(in) || is_global_reduction(in)) {
      const std::string a = (is_row_reduction(in) ? "a" : "g") + std::to_string(n);
      loop += "      " + a + " = " + f + "(" + a + ", " + x + ");\n";
    } else {
      loop += column_fold(in);
    }
  }
  return loop;
}

// Position j of the column slot's part: this thread's, in every row of the band.
std::string Source::column_fold(const Instr& in) const {
  const int per_thread = variant_.per_thread;
  const std::string x = v(in.a), f = fold_name(in);
  if (per_thread > 0) {
    const std::string at =
        column_registers(in.index) + "[" + std::to_string(in.part * per_thread) + " + 4 * m + l]";
    return "      " + at + " = " + f + "(" + at + ", " + x + ");\n";
  }
  const std::string at = "col" + std::to_string(in.index) + "[" +
                         (in.part > 0 ? "(U)" + std::to_string(in.part) + " * R + " : "") + "j]";
  return "      " + at + " = " +
         stored(in.type, f + std::string("(") + read(in.type, at) + ", " + x + ")") + ";\n";
}

// The last pass's stores of the outputs written element by element (noting their pointers).
std::string Source::pass_stores(const RowsKernel& r, std::vector<bool>& used) const {
  std::string loop;
  const size_t ni = k_.input_types.size();
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    if (!stored_per_element(k_, r.p.level, o)) continue;
    const size_t q = ni + o;
    used[q] = true;
    const std::string at =
        quad_ptr(q) ? quad_name(q) + ".v[l]" : ptr_name(q) + "[o" + std::to_string(q) + "]";
    loop += "      " + at + " = " + stored(k_.output_types[o], v(k_.outputs[o])) + ";\n";
  }
  return loop;
}

// Each row reduction of the pass folded over the block; every thread gets the row's value.
void Source::block_reductions(RowsKernel& r, const std::vector<size_t>& roots) const {
  for (size_t n : roots) {
    const Instr& in = k_.body[n];
    if (!is_row_reduction(in)) continue;
    r.row += "    " + decl(n) + " = kiln_block_reduce(a" + std::to_string(n) + ", " + identity(in) +
             ", " + fold_functor(in) + ", scratch);\n";
    r.emitted[n] = true;
  }
}

// Row-level outputs, and global reductions of row-level values (folded once per row, as on the
// CPU), by the block's first thread.
void Source::first_thread(RowsKernel& r) const {
  const size_t ni = k_.input_types.size();
  std::string first;
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const auto n = static_cast<size_t>(k_.outputs[o]);
    const Level l = r.p.level[n];
    if ((l != Level::kRow && l != Level::kConst) || stored_per_element(k_, r.p.level, o)) continue;
    KILN_CHECK(r.emitted[n], "fuser: CUDA codegen: row-level output ", n, " not computed\n",
               k_.str());
    const size_t q = ni + o;
    r.row_ptr[q] = true;
    first += "      " + ptr_name(q) + "[st" + std::to_string(q) +
             "] = " + stored(k_.output_types[o], v(k_.outputs[o])) + ";\n";
  }
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!live_global(r.p, n)) continue;
    const Instr& in = k_.body[n];
    const auto a = static_cast<size_t>(in.a);
    if (r.p.level[a] == Level::kElement) continue;
    KILN_CHECK(r.emitted[a], "fuser: CUDA codegen: row-level operand ", a, " not computed\n",
               k_.str());
    const std::string g = "g" + std::to_string(n);
    first += "      " + g + " = " + fold_name(in) + "(" + g + ", " + v(in.a) + ");\n";
  }
  if (!first.empty()) r.row += "    if (threadIdx.x == 0) {\n" + first + "    }\n";
}

// Every row-level value the rows kernel needs was computed by some stage.
void Source::check_row_values(const RowsKernel& r) const {
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const bool row_level = r.p.level[n] == Level::kRow || r.p.level[n] == Level::kConst;
    KILN_CHECK(!r.p.rows_needed[n] || !row_level || r.emitted[n],
               "fuser: CUDA codegen: row-level instruction ", n, " not computed\n", k_.str());
  }
}

// kiln_rows's start: the dims struct, the signature, the row length, the row cache, and the
// block's part of the partials.
void Source::rows_prologue(const RowsKernel& r) {
  const int rank = layout_.rank;
  const size_t n_dims = static_cast<size_t>(rank) + 1;
  out_ += "\nstruct KilnRowsDims {\n  long long size[" + std::to_string(n_dims) +
          "];\n  long long stride[" + std::to_string(num_ptrs() * n_dims) +
          "];  // pointer-major\n};\n";
  out_ +=
      "\ntemplate <typename U, typename S>\nKILN_D void kiln_rows(U rows, const KilnRowsDims& d" +
      ptr_params() + scalar_params() +
      ", unsigned long long* partials, unsigned long long* scratch) {\n";
  if (r.loops || r.any_global || r.any_column)
    out_ += "  const U R = (U)d.size[" + std::to_string(rank) + "];\n";
  if (variant_.per_thread == 0) row_caches(r);
  int64_t total_parts = 0;
  for (int32_t parts : k_.column_parts) total_parts += parts;
  if (r.any_global || r.any_column)
    out_ += "  unsigned long long* const part = partials + (unsigned long long)blockIdx.x * (" +
            std::to_string(k_.num_globals) + "ull + " + std::to_string(total_parts) +
            "ull * (unsigned long long)R);\n";
}

// The generic variant's row caches: one after another in the dynamic shared memory, each R values
// rounded up to 16 bytes (rows_shared_bytes), each used where it ends within the launch's.
void Source::row_caches(const RowsKernel& r) {
  bool first = true;
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!r.cache.cached[n]) continue;
    if (first) out_ += "  KILN_ROW_CACHE(kiln_smem);\n  unsigned long long kiln_smem_end = 0;\n";
    first = false;
    const std::string type = value_type(k_.body[n].type), name = cache_name(n);
    out_ += "  " + type + "* const " + name + " = reinterpret_cast<" + type +
            "*>(kiln_smem + kiln_smem_end);\n";
    out_ += "  kiln_smem_end += ((unsigned long long)R * sizeof(" + type + ") + 15) & ~15ull;\n";
    out_ +=
        "  const bool " + cache_fits(name) + " = kiln_smem_end <= kiln_dynamic_shared_bytes();\n";
  }
}

// The live column slots' partials in the block's part; returns, for the per_thread variant, the
// stores of their registers after the band.
std::string Source::column_partials(const RowsKernel& r) {
  std::string column_stores;
  int64_t parts_before = 0;
  for (int32_t s = 0; s < k_.num_columns(); ++s) {
    const int64_t offset = parts_before;
    parts_before += k_.column_parts[static_cast<size_t>(s)];
    if (!r.p.live_slot[static_cast<size_t>(s)]) continue;
    column_stores += column_partial_slot(s, offset);
  }
  return column_stores;
}

// Slot s's column partials at `offset` parts into the block's: per_thread, registers starting at
// the identity, stored after the band (returned); otherwise each position of the partials starts
// at the identity, set by the thread that folds into it.
std::string Source::column_partial_slot(int32_t s, int64_t offset) {
  const int per_thread = variant_.per_thread;
  const int32_t parts = k_.column_parts[static_cast<size_t>(s)];
  const Instr& r = k_.body[column_reduction_of(s)];
  const std::string col = "col" + std::to_string(s);
  out_ += "  " + std::string(storage_type(r.type)) + "* const " + col + " = reinterpret_cast<" +
          storage_type(r.type) + "*>(part + " + std::to_string(k_.num_globals) + "ull + " +
          std::to_string(offset) + "ull * (unsigned long long)R);\n";
  auto at = [&](int32_t q) {
    return col + "[" + (q > 0 ? "(U)" + std::to_string(q) + " * R + " : "") + "j]";
  };
  if (per_thread > 0) {
    const std::string regs = column_registers(s), count = std::to_string(parts * per_thread);
    out_ += "  " + std::string(value_type(r.type)) + " " + regs + "[" + count + "];\n";
    out_ += "#pragma unroll\n  for (int i = 0; i < " + count + "; ++i) " + regs +
            "[i] = " + identity(r) + ";\n";
    std::string stores;
    for (int32_t q = 0; q < parts; ++q)
      stores += "      " + at(q) + " = " +
                stored(r.type, regs + "[" + std::to_string(q * per_thread) + " + 4 * m + l]") +
                ";\n";
    return row_loop(stores, "  ");
  }
  std::string starts;
  for (int32_t q = 0; q < parts; ++q)
    starts += "    " + at(q) + " = " + stored(r.type, identity(r)) + ";\n";
  out_ += row_loop(starts, "  ");
  return "";
}

// The block's global accumulators, then the loop over its band of rows (the row body written
// before), then the per_thread variant's column stores.
void Source::band_loop(const RowsKernel& r, const std::string& column_stores) {
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (live_global(r.p, n))
      out_ += "  " + std::string(value_type(k_.body[n].type)) + " g" + std::to_string(n) + " = " +
              identity(k_.body[n]) + ";\n";
  out_ += "  const U chunk = (rows + (U)gridDim.x - 1) / (U)gridDim.x;\n";
  out_ += "  const U first = (U)blockIdx.x * chunk;\n";
  out_ += "  const U last = first >= rows ? first : rows - first < chunk ? rows : first + chunk;\n";
  out_ += "  for (U row = first; row < last; ++row) {\n";
  row_starts(r);
  out_ += r.row + "  }\n" + column_stores;
}

// The row's first element per pointer the row body reads: the row's index per outer dim from the
// sizes, times the pointer's strides.
void Source::row_starts(const RowsKernel& r) {
  const int rank = layout_.rank;
  bool any_row_ptr = false;
  for (size_t q = 0; q < num_ptrs(); ++q) any_row_ptr |= r.row_ptr[q];
  std::vector<std::string> idx(static_cast<size_t>(rank));
  if (any_row_ptr && rank == 1) idx[0] = "row";
  if (any_row_ptr && rank > 1) {
    out_ += "    U rem = row;\n";
    for (int dim = rank - 1; dim >= 1; --dim) {
      const std::string size = "(U)d.size[" + std::to_string(dim) + "]",
                        i = "i" + std::to_string(dim);
      out_ += "    const U " + i + " = rem % " + size + ";\n    rem /= " + size + ";\n";
      idx[static_cast<size_t>(dim)] = i;
    }
    idx[0] = "rem";
  }
  for (size_t q = 0; q < num_ptrs(); ++q) {
    if (!r.row_ptr[q]) continue;
    std::string off;
    for (int dim = 0; dim < rank; ++dim)
      off += std::string(off.empty() ? "" : " + ") + "(S)" + idx[static_cast<size_t>(dim)] + " * " +
             stride_of(q, dim);
    out_ += "    const S st" + std::to_string(q) + " = " + (off.empty() ? "0" : off) + ";\n";
  }
}

// The block's global partials: each reduction over the block, written by its first thread.
void Source::global_partials(const RowsKernel& r) {
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!live_global(r.p, n)) continue;
    const Instr& in = k_.body[n];
    out_ += "  {\n    const " + std::string(value_type(in.type)) + " t = kiln_block_reduce(g" +
            std::to_string(n) + ", " + identity(in) + ", " + fold_functor(in) + ", scratch);\n";
    out_ += "    if (threadIdx.x == 0) *reinterpret_cast<" + std::string(storage_type(in.type)) +
            "*>(part + " + std::to_string(in.index) + ") = " + stored(in.type, "t") + ";\n  }\n";
  }
}

// The kernel's entry point: the ABI's parameters (cuda_codegen.h), the block reduction's scratch,
// and kiln_rows in the variant's index types.
void Source::rows_entry() {
  const bool has_partials = k_.num_globals > 0 || k_.num_columns() > 0;
  const std::string partials = has_partials ? ", unsigned long long* partials" : "";
  const std::string bounds = variant_.per_thread > 0 && variant_.block > 0
                                 ? "__launch_bounds__(" + std::to_string(variant_.block) + ") "
                                 : "";
  out_ += "\nextern \"C\" __global__ void " + bounds + symbol_ +
          "(long long rows, KilnRowsDims dims" + ptr_params() + scalar_params() + partials +
          ") {\n";
  out_ += "  __shared__ unsigned long long kiln_scratch[32];\n";
  const std::string args = "dims" + ptr_args() + scalar_args() +
                           (has_partials ? ", partials" : ", nullptr") + ", kiln_scratch";
  out_ += "  kiln_rows<" + index_types() + ">((" + index_type() + ")rows, " + args + ");\n}\n";
}

}  // namespace kiln::fuser::cuda::codegen
