// The primitives whose table entry (fuser/primitives.h) names a lib/math/primitives.h definition,
// instantiated for a value family by the code generators: LLVM IR values
// (fuser/codegen/llvm/ir_value.h) and CUDA C source (fuser/codegen/cuda/source_value.h). MathOf<P>
// is that definition for primitive P; each table entry with a math name must have one with the
// table's arity (checked at compile time by for_each_math and visit_math), so the code generators
// cannot drift from the table or from each other.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "fuser/primitives.h"
#include "lib/math/primitives.h"

namespace kiln::fuser {

// Whether V is a family's float (as opposed to double) type.
template <typename V>
inline constexpr bool kIsF32 = std::is_same_v<math::Like<V, float>, V>;
template <typename V>
inline constexpr bool kIsFloating = kIsF32<V> || std::is_same_v<math::Like<V, double>, V>;

template <Prim P>
struct MathOf;  // defined for the primitives whose table entry names a math definition

#define KILN_UNARY_MATH(P, f)                \
  template <>                                \
  struct MathOf<Prim::P> {                   \
    static constexpr int kArity = 1;         \
    static constexpr bool kIntegers = false; \
    template <typename F>                    \
    static F apply(F x) {                    \
      if constexpr (kIsF32<F>)               \
        return math::f##_f32(x);             \
      else                                   \
        return math::f##_f64(x);             \
    }                                        \
  };
KILN_UNARY_MATH(Exp, exp)
KILN_UNARY_MATH(Log, log)
KILN_UNARY_MATH(Log1p, log1p)
KILN_UNARY_MATH(Expm1, expm1)
KILN_UNARY_MATH(Sin, sin)
KILN_UNARY_MATH(Cos, cos)
KILN_UNARY_MATH(Tanh, tanh)
KILN_UNARY_MATH(Erf, erf)
KILN_UNARY_MATH(Tan, tan)
KILN_UNARY_MATH(Atan, atan)
KILN_UNARY_MATH(Asin, asin)
KILN_UNARY_MATH(Acos, acos)
KILN_UNARY_MATH(Sinh, sinh)
KILN_UNARY_MATH(Cosh, cosh)
KILN_UNARY_MATH(Asinh, asinh)
KILN_UNARY_MATH(Acosh, acosh)
KILN_UNARY_MATH(Atanh, atanh)
KILN_UNARY_MATH(Exp2, exp2)
KILN_UNARY_MATH(Log2, log2)
KILN_UNARY_MATH(Log10, log10)
KILN_UNARY_MATH(Erfc, erfc)
KILN_UNARY_MATH(Erfinv, erfinv)
KILN_UNARY_MATH(Lgamma, lgamma)
KILN_UNARY_MATH(Digamma, digamma)
KILN_UNARY_MATH(Trigamma, trigamma)
#undef KILN_UNARY_MATH

template <>
struct MathOf<Prim::Atan2> {
  static constexpr int kArity = 2;
  static constexpr bool kIntegers = false;
  template <typename F>
  static F apply(F y, F x) {
    if constexpr (kIsF32<F>)
      return math::atan2_f32(y, x);
    else
      return math::atan2_f64(y, x);
  }
};

// exp of an argument at most 0 (or NaN), x minus its row's max: the same bits as exp, cheaper in
// float32 (math::exp_nonpos_f32); float64 has no cheaper form.
template <>
struct MathOf<Prim::ExpNonPos> {
  static constexpr int kArity = 1;
  static constexpr bool kIntegers = false;
  template <typename F>
  static F apply(F x) {
    if constexpr (kIsF32<F>)
      return math::exp_nonpos_f32(x);
    else
      return math::exp_f64(x);
  }
};

// Floats by pow_float; integers (as the family's unsigned type of their width) by pow_int.
template <>
struct MathOf<Prim::Pow> {
  static constexpr int kArity = 2;
  static constexpr bool kIntegers = true;
  template <typename V>
  static V apply(V x, V y) {
    if constexpr (kIsFloating<V>)
      return math::pow_float(x, y);
    else
      return math::pow_int(x, y);
  }
};

namespace math_dispatch {
template <size_t I>
constexpr bool has_math() {
  return kPrims[I].math != nullptr;
}
template <size_t I, typename Fn>
void math_at(Fn& fn) {
  if constexpr (has_math<I>()) {
    using M = MathOf<kPrims[I].prim>;
    static_assert(M::kArity == kPrims[I].arity, "MathOf's arity differs from the table's");
    fn(kPrims[I].prim, M{});
  }
}
template <typename Fn, size_t... I>
void for_each_math(Fn& fn, std::index_sequence<I...>) {
  (math_at<I>(fn), ...);
}
}  // namespace math_dispatch

// Calls fn(prim, MathOf<prim>{}) for every primitive with a math definition, in table order.
template <typename Fn>
void for_each_math(Fn&& fn) {
  math_dispatch::for_each_math(fn, std::make_index_sequence<kNumPrims>{});
}

// Calls fn(MathOf<p>{}) for primitive p; false when p has no math definition.
template <typename Fn>
bool visit_math(Prim p, Fn&& fn) {
  bool found = false;
  for_each_math([&](Prim q, auto m) {
    if (q == p) {
      fn(m);
      found = true;
    }
  });
  return found;
}

}  // namespace kiln::fuser
