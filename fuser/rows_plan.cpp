// plan_rows: the passes of a rows kernel, derived once from the kernel for both code generators.

#include "fuser/rows_plan.h"

#include <algorithm>

namespace kiln::fuser {

bool stored_per_element(const Kernel& k, const std::vector<Level>& level, size_t o) {
  const Level l = level.at(static_cast<size_t>(k.outputs[o]));
  return l == Level::kElement || (o < k.output_per_element.size() && k.output_per_element[o] &&
                                  (l == Level::kRow || l == Level::kConst));
}

RowsPasses plan_rows(const Kernel& k, const std::function<bool(size_t)>& folds) {
  RowsPasses p;
  p.level = instr_levels(k);
  p.stage = instr_stages(k);
  const size_t body_size = k.body.size();
  auto operand_stage = [&](size_t n) { return p.stage[static_cast<size_t>(k.body[n].a)]; };
  // Folded by the last pass: global reductions of element-level values, column reductions.
  auto folds_last = [&](size_t n) {
    const Instr& in = k.body[n];
    return ((is_global_reduction(in) && p.level[static_cast<size_t>(in.a)] == Level::kElement) ||
            is_column_reduction(in)) &&
           folds(n);
  };
  std::vector<std::vector<size_t>> row_roots;
  int32_t final_pass = -1;
  for (size_t n = 0; n < body_size; ++n) {
    // A row reduction folds its operand once per element of the row, also when the operand is
    // the same for the whole row (a row-level value when rows are one element long).
    if (!is_row_reduction(k.body[n]) || !folds(n)) continue;
    const auto pass = static_cast<size_t>(operand_stage(n));
    if (row_roots.size() <= pass) row_roots.resize(pass + 1);
    row_roots[pass].push_back(n);
    final_pass = std::max(final_pass, static_cast<int32_t>(pass));
  }
  bool any_per_element = false;
  for (size_t o = 0; o < k.outputs.size(); ++o)
    if (stored_per_element(k, p.level, o)) {
      any_per_element = true;
      final_pass = std::max(final_pass, p.stage[static_cast<size_t>(k.outputs[o])]);
    }
  for (size_t n = 0; n < body_size; ++n)
    if (folds_last(n)) final_pass = std::max(final_pass, operand_stage(n));
  p.final_pass = final_pass;
  p.roots_of.resize(static_cast<size_t>(final_pass + 1));
  p.stores_in.assign(static_cast<size_t>(final_pass + 1), false);
  for (size_t pass = 0; pass < row_roots.size(); ++pass) p.roots_of[pass] = row_roots[pass];
  if (final_pass >= 0) {
    const auto last = static_cast<size_t>(final_pass);
    for (size_t n = 0; n < body_size; ++n)
      if (folds_last(n)) p.roots_of[last].push_back(n);
    p.stores_in[last] = any_per_element;
  }
  return p;
}

}  // namespace kiln::fuser
