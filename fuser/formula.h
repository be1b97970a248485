// Op-table formulas parsed into kernel instructions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fuser/kernel.h"
#include "kiln/dtype.h"

namespace kiln::fuser {

// What a formula's names stand for while it is parsed, and where its reductions fold.
struct FormulaArgs {
  using Attr = std::function<int32_t(int)>;  // attribute i's instruction, or -1
  using AttrText = std::function<std::optional<std::string>(int)>;  // nullopt: no attribute i
  DType type = kFloat32;           // the compute type: what numbers are made as
  DType out_type = kFloat32;       // the node's output type: what "cast" converts to
  std::vector<int32_t> operands;   // x, y, z: instructions
  Attr attr;                       // aN
  AttrText attr_text;              // what if-attr compares
  std::function<int32_t()> count;  // n: the number of elements a reduction folds (made once)
  bool global = false;             // reductions fold every row (global slots), not one row
  int32_t column_slot = -1;  // >= 0: reductions fold each position over the rows into this slot
  int32_t part = 0;          // ... at this part of it
};

// Parses an op-table formula into instructions appended to k; returns its result's. x, y and z are
// the operands; aN an attribute and n the number of elements a reduction folds (both through
// callbacks); (let NAME e body) names e in body; (if-attr aN WORD then else) is `then` when
// attribute N reads WORD (a string attribute's text, or none when it is absent) and `else`
// otherwise, decided while parsing (the attributes are part of the node, so of the kernel's
// identity), the other branch skipped unparsed. Numbers take the type of what they meet (the
// compute type alone); attributes and n are converted to it. Formulas are a few tokens long: the
// parser recurses over the formula's text, never over a graph. A bad formula raises kiln::Error.
int32_t parse_formula(Kernel& k, const std::string& text, const FormulaArgs& args);

}  // namespace kiln::fuser
