// The plan of a rows kernel's source: which kernel (rows, finish, columns) computes each
// instruction, what each pass over a row computes, and which values a later pass reads back from
// shared memory or registers instead of computing them again.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "kiln/error.h"

namespace kiln::fuser::cuda::codegen {

Source::RowsPlan Source::rows_plan() const {
  RowsPlan p;
  const size_t n_body = k_.body.size();
  p.level = instr_levels(k_);
  p.stage = instr_stages(k_);
  std::vector<size_t> work;
  for (int32_t o : k_.outputs)
    if (p.level.at(static_cast<size_t>(o)) == Level::kGlobal)
      work.push_back(static_cast<size_t>(o));
  p.finish_needed = reach(work, [&](size_t n) { return is_global_reduction(k_.body[n]); });
  plan_column_slots(p);
  // The rows kernel: the outputs it stores, and the operands of the global and column reductions
  // it folds (every part of a live column slot folds).
  work.clear();
  for (int32_t o : k_.outputs) {
    const Level l = p.level.at(static_cast<size_t>(o));
    if (l == Level::kElement || l == Level::kRow || l == Level::kConst)
      work.push_back(static_cast<size_t>(o));
  }
  for (size_t n = 0; n < n_body; ++n)
    if (live_global(p, n) || live_column(p, n)) work.push_back(static_cast<size_t>(k_.body[n].a));
  p.rows_needed = reach(work, [&](size_t n) {
    return is_global_reduction(k_.body[n]) || is_column_reduction(k_.body[n]);
  });
  return p;
}

RowsPasses Source::rows_passes(const RowsPlan& p) const {
  return plan_rows(k_, [&](size_t n) {
    return is_row_reduction(k_.body[n]) ? bool(p.rows_needed[n])
                                        : live_global(p, n) || live_column(p, n);
  });
}

std::vector<int> Source::row_cache_sizes() const {
  const RowsPlan p = rows_plan();
  const RowCache cache = plan_row_cache(pass_work(rows_passes(p), p.level), p.level);
  std::vector<int> sizes;
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (cache.cached[n]) sizes.push_back(static_cast<int>(element_size(k_.body[n].type)));
  return sizes;
}

// The slot each column-level instruction derives from (one: nothing combines two slots), and the
// slots some output reads.
void Source::plan_column_slots(RowsPlan& p) const {
  const size_t n_body = k_.body.size();
  p.slot_of.assign(n_body, -1);
  for (size_t n = 0; n < n_body; ++n) {
    const Instr& in = k_.body[n];
    if (is_column_reduction(in)) {
      KILN_CHECK(in.index < k_.num_columns() && in.part >= 0 &&
                     in.part < k_.column_parts[static_cast<size_t>(in.index)],
                 "fuser: CUDA codegen: column slot ", in.index, " part ", in.part, "\n", k_.str());
      p.slot_of[n] = in.index;
      continue;
    }
    if (p.level[n] != Level::kColumn) continue;
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0 && p.slot_of[static_cast<size_t>(o)] >= 0)
        p.slot_of[n] = p.slot_of[static_cast<size_t>(o)];
  }
  p.live_slot.assign(static_cast<size_t>(k_.num_columns()), false);
  for (int32_t o : k_.outputs)
    if (p.slot_of.at(static_cast<size_t>(o)) >= 0)
      p.live_slot[static_cast<size_t>(p.slot_of[static_cast<size_t>(o)])] = true;
}

bool Source::live_global(const RowsPlan& p, size_t n) const {
  return is_global_reduction(k_.body[n]) && p.finish_needed[n];
}

bool Source::live_column(const RowsPlan& p, size_t n) const {
  return is_column_reduction(k_.body[n]) && p.live_slot[static_cast<size_t>(k_.body[n].index)];
}

// What each pass's loop computes: the element-level instructions its roots (and, in the last
// pass, the element-level outputs) need.
std::vector<std::vector<size_t>> Source::pass_work(const RowsPasses& passes,
                                                   const std::vector<Level>& level) const {
  const int32_t final_pass = passes.final_pass;
  std::vector<std::vector<size_t>> work_of(static_cast<size_t>(final_pass + 1));
  for (int32_t pass = 0; pass <= final_pass; ++pass) {
    std::vector<size_t>& work = work_of[static_cast<size_t>(pass)];
    for (size_t r : passes.roots_of[static_cast<size_t>(pass)])
      work.push_back(static_cast<size_t>(k_.body[r].a));
    if (pass == final_pass)
      for (size_t o = 0; o < k_.outputs.size(); ++o)
        if (stored_per_element(k_, level, o)) work.push_back(static_cast<size_t>(k_.outputs[o]));
  }
  return work_of;
}

// The values each pass computes, and those kept for later passes: the per_thread variant keeps
// up to 64 values per thread in registers (the frontier a later pass reads, then the passes'
// loads); the generic variant keeps one load that several passes read in shared memory.
Source::RowCache Source::plan_row_cache(const std::vector<std::vector<size_t>>& work_of,
                                        const std::vector<Level>& level) const {
  const int per_thread = variant_.per_thread;
  RowCache c;
  c.cached.assign(k_.body.size(), false);
  c.first.assign(k_.body.size(), -1);
  int64_t budget = per_thread > 0 ? 64 / per_thread : 0;
  for (size_t pass = 0; pass < work_of.size(); ++pass)
    plan_pass(c, work_of[pass], level, budget, pass);
  if (per_thread > 0) {
    plan_registers(c, budget);
    return c;
  }
  std::fill(c.cached.begin(), c.cached.end(), false);
  plan_shared_cache(c, level);
  return c;
}

// What pass `pass` computes: its work and what they read, stopping at values of other levels and
// at values an earlier pass computed, which are kept (while `budget` lasts) rather than computed
// again.
void Source::plan_pass(RowCache& c, const std::vector<size_t>& work,
                       const std::vector<Level>& level, int64_t& budget, size_t pass) const {
  if (work.empty()) {
    c.needed_of.emplace_back();
    return;
  }
  c.needed_of.push_back(reach(work, [&](size_t n) {
    if (level[n] != Level::kElement) return true;
    if (c.first[n] < 0 || c.cached[n]) return static_cast<bool>(c.cached[n]);
    if (budget == 0) return false;  // computed again
    c.cached[n] = true;
    --budget;
    return true;
  }));
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (c.needed_of[pass][n] && level[n] == Level::kElement && c.first[n] < 0)
      c.first[n] = static_cast<int32_t>(pass);
}

// The per_thread variant: the registers left after the frontier hold the passes' loads.
void Source::plan_registers(RowCache& c, int64_t budget) const {
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (!c.cached[n] && budget > 0 && c.first[n] >= 0 && k_.body[n].prim == Prim::Load) {
      c.cached[n] = true;
      --budget;
    }
}

// The generic variant: every load (not of bools) of a tensor that moves along the row (not one
// value a row: Layout::kZero) that at least two passes read, each in a row cache of its own (the
// caches follow each other in the dynamic shared memory, in instruction order, and a launch gives
// room to as many of the first ones as fit: rows_shared_bytes).
void Source::plan_shared_cache(RowCache& c, const std::vector<Level>& level) const {
  for (size_t n = 0; n < k_.body.size(); ++n) {
    const Instr& in = k_.body[n];
    if (in.prim != Prim::Load || level[n] != Level::kElement || in.type == kBool) continue;
    const auto p = static_cast<size_t>(in.index);
    if (p < layout_.inner.size() && layout_.inner[p] == Layout::kZero) continue;
    int64_t passes = 0;
    for (const std::vector<bool>& needed : c.needed_of) passes += !needed.empty() && needed[n];
    if (passes < 2) continue;
    c.cached[n] = true;
  }
}

}  // namespace kiln::fuser::cuda::codegen
