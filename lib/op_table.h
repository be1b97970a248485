// The op table: one entry per op, naming its kind and dtype rule (lib/op_registry.h fills it).
//
// Each op is defined in exactly one place (its source file in lib/ops/) by one registration that
// carries its name, kind, arity and dtype rule next to its reference kernel. Later layers (the
// tracer, the fuser, the emitters) look ops up here by name instead of keeping lists of their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/scalar.h"
#include "kiln/tensor.h"

namespace kiln::detail {

// Graph marks the IR's own nodes (graph inputs, constants) that no public function computes.
enum class OpKind {
  Factory,
  View,
  Unary,
  Binary,
  Ternary,
  Reduction,
  Index,
  Join,
  Linalg,
  NN,
  Transfer,  // a copy to another device
  Graph
};

// One attribute of an op call: the non-tensor arguments that, with the op and its tensor inputs,
// determine the result. Ops are values: equality and hashing of a call come from (op, attributes),
// never from object identity. monostate stands for an absent optional (std::nullopt).
using AttrValue =
    std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<int64_t>, DType>;
using Attrs = std::vector<AttrValue>;  // positional, named by OpDef::attr_names

AttrValue scalar_attr(const Scalar& s);  // bool, int64_t or double, by the scalar's kind
Scalar attr_scalar(const AttrValue& a);
int64_t attr_int(const AttrValue& a);
double attr_double(const AttrValue& a);  // also accepts int64_t and bool
bool attr_bool(const AttrValue& a);
const std::string& attr_string(const AttrValue& a);
const std::vector<int64_t>& attr_ints(const AttrValue& a);
DType attr_dtype(const AttrValue& a);
std::optional<int64_t> attr_optional_int(const AttrValue& a);
std::optional<DType> attr_optional_dtype(const AttrValue& a);
std::string attr_str(const AttrValue& a);  // for printing: 3, 0.5, true, [1, 2], float32, none

// Runs the op's reference kernel on concrete inputs: the executor calls it with recording and
// gradient tracking off. Absent optional tensor inputs are undefined Tensors.
using Invoke = std::vector<Tensor> (*)(const std::vector<Tensor>& inputs, const Attrs& attrs);
// An elementwise op's formula run straight into a preallocated output: every input already has
// the op's compute type (the dtype its rule gives for them) and broadcasts to `out`'s shape, and
// `out` has the op's output type and does not overlap the inputs. No validation, conversion,
// allocation or autograd: the executor checks all of that once, when it plans a graph.
using MapInto = void (*)(const Tensor& out, const Tensor* inputs, const Attrs& attrs);

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
  Invoke invoke = nullptr;
  std::vector<std::string> attr_names = {};
  MapInto map_into = nullptr;  // elementwise ops only
  // Elementwise ops: the same formula as map_into's, as an s-expression over primitives that
  // every code generator implements (see fuser/kernel.h), for operands x and y and attribute a0,
  // all of the compute type T; numbers are of type T too. E.g. sigmoid's
  // "(div 1 (add 1 (exp (neg x))))". It must compute exactly what map_into computes.
  // Reductions: what the reference kernel computes from the folded elements x, with rsum, rmax
  // and rmin over them, n their number, aN attribute N, widen (to double, or int64 for integers)
  // and (let NAME e body); e.g. mean's "(cast (div (rsum (widen x)) n))".
  const char* formula = nullptr;
  // The entry point checks integer operands' values before computing (a zero divisor, a negative
  // exponent, an index or a class out of range): integer instances run through it (invoke), never
  // fused or run directly, so a replayed trace raises as eager mode does; and a plan computes
  // nothing in place before such a step (exec/executor.h).
  bool checks_integer_values = false;
  // The kernel may raise on floating-point values too (a singular matrix): a plan computes
  // nothing in place before such a step.
  bool raises_on_values = false;
};

// Registers an op during initialization (lib/op_registry.h) and returns its stored entry.
const OpDef& register_op(OpDef def);
// nullptr when no op of that name exists.
const OpDef* find_op(std::string_view name);
std::vector<const OpDef*> all_ops();

}  // namespace kiln::detail
