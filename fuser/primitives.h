// The primitives of fused kernels (fuser::Kernel's instructions), each described once: one line of
// KILN_PRIMITIVES below makes both its Prim enumerator and its row of the constexpr table kPrims
// (name, arity, kind, result type, a fold's identity, and the lib/math/primitives.h definition
// the code generators instantiate for it). Everything else derives from the table: the formula
// parser's vocabulary, Kernel::str's names, is_reduction, the folds' identities and names in both
// code generators, which primitives are costly to recompute, and the math dispatch
// (fuser/prim_math.h, checked against the table at compile time). Each code generator's switch
// over Prim compiles with -Werror=switch, so a primitive cannot be added without being rendered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln::fuser {

// X(enumerator, name, arity, kind, result, fold identity, math definition): the name is the
// formulas' (and Kernel::str's); the math definition, where there is one, is lib/math's template
// (exp_f32 and exp_f64 for "exp"; pow_float and pow_int for "pow"). Enumerators keep their
// order (their values are part of kernel keys): new primitives go at the end.
// clang-format off
#define KILN_PRIMITIVES(X)                                                                      \
  X(Load,       "load",    0, kLeaf,        kSame, kNone,    nullptr)  /* tensor input `index`'s element */       \
  X(Scalar,     "scalar",  0, kLeaf,        kSame, kNone,    nullptr)  /* kernel scalar `index` (its own dtype) */ \
  X(Literal,    "literal", 0, kLeaf,        kSame, kNone,    nullptr)  /* `literal`, of the instruction's type */  \
  X(Cast,       "cast",    1, kElementwise, kSame, kNone,    nullptr)  /* static_cast (to bool: != 0) */           \
  X(Neg,        "neg",     1, kElementwise, kSame, kNone,    nullptr)                                            \
  X(Add,        "add",     2, kElementwise, kSame, kNone,    nullptr)                                            \
  X(Sub,        "sub",     2, kElementwise, kSame, kNone,    nullptr)                                            \
  X(Mul,        "mul",     2, kElementwise, kSame, kNone,    nullptr)                                            \
  X(Div,        "div",     2, kElementwise, kSame, kNone,    nullptr)                                            \
  X(Lt,         "lt",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Le,         "le",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Gt,         "gt",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Ge,         "ge",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Eq,         "eq",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Ne,         "ne",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(And,        "and",     2, kElementwise, kBool, kNone,    nullptr)  /* logical: of bools */                    \
  X(Or,         "or",      2, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Not,        "not",     1, kElementwise, kBool, kNone,    nullptr)                                            \
  X(Select,     "select",  3, kElementwise, kSame, kNone,    nullptr)  /* a ? b : c */                            \
  X(Exp,        "exp",     1, kElementwise, kSame, kNone,    "exp")                                              \
  X(Log,        "log",     1, kElementwise, kSame, kNone,    "log")                                              \
  X(Log1p,      "log1p",   1, kElementwise, kSame, kNone,    "log1p")                                            \
  X(Expm1,      "expm1",   1, kElementwise, kSame, kNone,    "expm1")                                            \
  X(Sqrt,       "sqrt",    1, kElementwise, kSame, kNone,    nullptr)  /* IEEE's, correctly rounded */            \
  X(Sin,        "sin",     1, kElementwise, kSame, kNone,    "sin")                                              \
  X(Cos,        "cos",     1, kElementwise, kSame, kNone,    "cos")                                              \
  X(Tanh,       "tanh",    1, kElementwise, kSame, kNone,    "tanh")                                             \
  X(Floor,      "floor",   1, kElementwise, kSame, kNone,    nullptr)  /* the identity on integers */             \
  X(Ceil,       "ceil",    1, kElementwise, kSame, kNone,    nullptr)                                            \
  X(Round,      "round",   1, kElementwise, kSame, kNone,    nullptr)  /* to nearest, ties to even */             \
  X(ReduceSum,  "rsum",    1, kFold,        kSame, kZero,    nullptr)  /* floating sums may reassociate */        \
  X(ReduceMax,  "rmax",    1, kFold,        kSame, kLowest,  nullptr)  /* max and min propagate NaN */            \
  X(ReduceMin,  "rmin",    1, kFold,        kSame, kHighest, nullptr)                                            \
  X(Erf,        "erf",     1, kElementwise, kSame, kNone,    "erf")                                              \
  X(Rem,        "rem",     2, kElementwise, kSame, kNone,    nullptr)  /* fmod; truncated for integers (0 for a divisor of 0 or -1) */ \
  X(Pow,        "pow",     2, kElementwise, kSame, kNone,    "pow")    /* the reference kernel's pow */           \
  X(ReduceProd, "rprod",   1, kFold,        kSame, kOne,     nullptr)  /* floating products may reassociate, integer ones wrap */ \
  X(BitAnd,     "band",    2, kElementwise, kSame, kNone,    nullptr)  /* bitwise, in the operands' type */       \
  X(BitOr,      "bor",     2, kElementwise, kSame, kNone,    nullptr)                                            \
  X(BitXor,     "bxor",    2, kElementwise, kSame, kNone,    nullptr)                                            \
  X(ExpNonPos,  "exp_nonpos", 1, kElementwise, kSame, kNone, "exp_nonpos") /* exp of x <= 0 or NaN: exp's bits */ \
  X(Tan,        "tan",     1, kElementwise, kSame, kNone,    "tan")                                                  \
  X(Atan,       "atan",    1, kElementwise, kSame, kNone,    "atan")                                                 \
  X(Asin,       "asin",    1, kElementwise, kSame, kNone,    "asin")                                                 \
  X(Acos,       "acos",    1, kElementwise, kSame, kNone,    "acos")                                                 \
  X(Sinh,       "sinh",    1, kElementwise, kSame, kNone,    "sinh")                                                 \
  X(Cosh,       "cosh",    1, kElementwise, kSame, kNone,    "cosh")                                                 \
  X(Asinh,      "asinh",   1, kElementwise, kSame, kNone,    "asinh")                                                \
  X(Acosh,      "acosh",   1, kElementwise, kSame, kNone,    "acosh")                                                \
  X(Atanh,      "atanh",   1, kElementwise, kSame, kNone,    "atanh")                                                \
  X(Atan2,      "atan2",   2, kElementwise, kSame, kNone,    "atan2")    /* atan2(y, x) */                           \
  X(Exp2,       "exp2",    1, kElementwise, kSame, kNone,    "exp2")                                                 \
  X(Log2,       "log2",    1, kElementwise, kSame, kNone,    "log2")                                                 \
  X(Log10,      "log10",   1, kElementwise, kSame, kNone,    "log10")                                                \
  X(Signbit,    "signbit", 1, kElementwise, kBool, kNone,    nullptr)    /* the sign bit (-0.0, signed NaN); x < 0 for integers */ \
  X(Erfc,       "erfc",    1, kElementwise, kSame, kNone,    "erfc")                                                 \
  X(Erfinv,     "erfinv",  1, kElementwise, kSame, kNone,    "erfinv")                                               \
  X(Lgamma,     "lgamma",  1, kElementwise, kSame, kNone,    "lgamma")                                               \
  X(Digamma,    "digamma", 1, kElementwise, kSame, kNone,    "digamma")                                              \
  X(Trigamma,   "trigamma", 1, kElementwise, kSame, kNone,   "trigamma")
// clang-format on

enum class Prim : uint8_t {
#define KILN_PRIM_ENUMERATOR(p, ...) p,
  KILN_PRIMITIVES(KILN_PRIM_ENUMERATOR)
#undef KILN_PRIM_ENUMERATOR
};

enum class PrimKind : uint8_t {
  kLeaf,         // a load, a kernel scalar or a literal: made by the fuser, not named by formulas
  kElementwise,  // a value from its operands' values
  kFold,         // a reduction of a's values, in a's type (over a row, the call's rows, or the
                 // rows per position of a row)
};
enum class PrimResult : uint8_t {
  kSame,  // the operands' type (select: its choices')
  kBool,  // comparisons and logic
};
// The value a fold starts from: 0, 1, the type's lowest (a max: -inf, the least integer, false)
// or highest (a min: inf, the greatest integer, true).
enum class FoldIdentity : uint8_t { kNone, kZero, kOne, kLowest, kHighest };

struct PrimInfo {
  Prim prim;
  const char* name;
  int arity;  // operands a, b, c in order
  PrimKind kind;
  PrimResult result;
  FoldIdentity identity;  // folds only
  const char* math;       // lib/math/primitives.h's definition, or null
};

inline constexpr PrimInfo kPrims[] = {
#define KILN_PRIM_INFO(p, name, arity, kind, result, identity, math) \
  {Prim::p, name, arity, PrimKind::kind, PrimResult::result, FoldIdentity::identity, math},
    KILN_PRIMITIVES(KILN_PRIM_INFO)
#undef KILN_PRIM_INFO
};
inline constexpr size_t kNumPrims = sizeof(kPrims) / sizeof(kPrims[0]);

constexpr bool prims_in_order() {
  for (size_t i = 0; i < kNumPrims; ++i) {
    const PrimInfo& p = kPrims[i];
    if (static_cast<size_t>(p.prim) != i) return false;
    if ((p.kind == PrimKind::kFold) != (p.identity != FoldIdentity::kNone)) return false;
    if (p.kind == PrimKind::kFold && p.arity != 1) return false;
    if ((p.kind == PrimKind::kLeaf) != (p.arity == 0)) return false;
  }
  return true;
}
static_assert(prims_in_order(),
              "kPrims: one row per Prim in enumerator order; folds (and only they) have an "
              "identity and one operand; leaves (and only they) none");

constexpr const PrimInfo& prim_info(Prim p) {
  return kPrims[static_cast<size_t>(p)];
}
constexpr const char* prim_name(Prim p) {
  return prim_info(p).name;
}
constexpr bool is_reduction(Prim p) {
  return prim_info(p).kind == PrimKind::kFold;
}
// A primitive that costs more to recompute than to read back from a buffer in cache: lib/math's
// transcendentals and pow.
constexpr bool is_costly(Prim p) {
  return prim_info(p).math != nullptr;
}
// The primitive a formula names (not a leaf), or null.
constexpr const PrimInfo* prim_named(std::string_view name) {
  for (const PrimInfo& p : kPrims)
    if (p.kind != PrimKind::kLeaf && name == p.name) return &p;
  return nullptr;
}

}  // namespace kiln::fuser
