// The op table: one entry per op, naming its kind and dtype rule; ops register here where defined.
//
// Each op is defined in exactly one place (its source file in lib/ops/) by one registration that
// carries its name, kind, arity and dtype rule next to its reference kernel. Later layers (the
// tracer, the fuser, the emitters) look ops up here by name instead of keeping lists of their own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::detail {

enum class OpKind { Factory, View, Unary, Binary, Ternary, Reduction, Index, Join, Linalg, NN };

enum class DTypeRule {
  Same,       // the promoted input type
  Float,      // the promoted input type, integers and bool promoted to float32
  Predicate,  // bool, computed in the promoted input type
  Logical,    // bool, inputs read as bool
  Custom,     // stated by the op itself
};

struct OpDef {
  std::string name;
  OpKind kind;
  int arity;  // tensor inputs; -1 for variadic
  DTypeRule dtype_rule;
  bool supports_bool = true;
};

// Registers an op at static-initialization time and returns its stored entry.
const OpDef& register_op(OpDef def);
// nullptr when no op of that name exists.
const OpDef* find_op(std::string_view name);
std::vector<const OpDef*> all_ops();

}  // namespace kiln::detail
