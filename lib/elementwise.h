// Elementwise op drivers: dtype rule, broadcasting, conversion and in-place handling around
// map_kernel.
#pragma once

#include <type_traits>

#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/loops.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

inline void check_elementwise_input(const OpDef& def, const Tensor& t, const char* arg) {
  check_defined(t, def.name.c_str(), arg);
  check_cpu(t, def.name.c_str());
  KILN_CHECK(def.supports_bool || t.dtype() != kBool, def.name,
             ": not supported for bool tensors (", arg, " is ", describe(t), ")");
}

// Raises unless a tensor of `dtype` can hold `value` (an integral dtype: the value in its range,
// not NaN or inf), as torch does: converted, it would wrap or be undefined. `t` is the operand
// named in the message.
void check_value_fits(const char* op, const Scalar& value, DType dtype, const Tensor& t);

// Runs f over the compute type chosen by the rule, instantiating only the types the rule allows.
template <DTypeRule Rule, typename F>
void dispatch_for_rule(DType compute, const OpDef& def, F&& f) {
  if constexpr (Rule == DTypeRule::Float)
    dispatch_floating(compute, def.name.c_str(), f);
  else if constexpr (Rule == DTypeRule::Logical)
    f(TypeTag<bool>{});
  else
    dispatch_all(compute, f);
}

inline DType compute_type(DTypeRule rule, DType promoted) {
  if (rule == DTypeRule::Float) return to_floating(promoted);
  if (rule == DTypeRule::Logical) return kBool;
  return promoted;
}

constexpr bool produces_bool(DTypeRule rule) {
  return rule == DTypeRule::Predicate || rule == DTypeRule::Logical;
}

// Writes `result` into `self` for an in-place op after checking torch's casting rule.
inline void finish_inplace(const OpDef& def, Tensor& self, const Tensor& result) {
  KILN_CHECK(can_cast(result.dtype(), self.dtype()), def.name, "_: result type ", result.dtype(),
             " can't be cast to the desired output type ", self.dtype(), " of ", describe(self));
  KILN_CHECK(result.sizes() == self.sizes(), def.name, "_: output with shape ",
             shape_str(self.sizes()), " doesn't match the broadcast shape ",
             shape_str(result.sizes()));
  self.copy_(result);
}

// out = f(in) and out = f(a, b): the kernels alone, for operands already of the compute type
// (in's, a's) and an output of the op's output type (see MapInto).
template <DTypeRule Rule, typename F>
void unary_into(const OpDef& def, const F& f, const Tensor& out, const Tensor& in) {
  dispatch_for_rule<Rule>(in.dtype(), def, [&](auto tag) {
    using T = KILN_TYPE(tag);
    if constexpr (produces_bool(Rule))
      map_kernel<bool, T>(f, out, in);
    else
      map_kernel<T, T>(f, out, in);
  });
}

template <DTypeRule Rule, typename F>
void binary_into(const OpDef& def, const F& f, const Tensor& out, const Tensor& a,
                 const Tensor& b) {
  dispatch_for_rule<Rule>(a.dtype(), def, [&](auto tag) {
    using T = KILN_TYPE(tag);
    if constexpr (produces_bool(Rule))
      map_kernel<bool, T, T>(f, out, a, b);
    else
      map_kernel<T, T, T>(f, out, a, b);
  });
}

// f is a generic lambda over the compute type T. Rule must be def's dtype rule; it is a template
// argument so that only the compute types the rule allows are instantiated.
// In lazy mode the call is recorded (as def(x) with `attrs`) instead of run.
template <DTypeRule Rule, typename F>
Tensor unary_op(const OpDef& def, const Tensor& x, const F& f, Attrs attrs = {}) {
  KILN_CHECK(def.dtype_rule == Rule, def.name, ": dtype rule mismatch");
  check_elementwise_input(def, x, "input");
  DType compute = compute_type(def.dtype_rule, x.dtype());
  DType out_type = produces_bool(def.dtype_rule) ? kBool : compute;
  if (should_record(x)) return lazy_record1(def, {x}, std::move(attrs), {x.sizes(), out_type});
  Tensor out = make_empty(x.sizes(), out_type);
  unary_into<Rule>(def, f, out, x.to(compute));
  return out;
}

// out = f(a, b) with broadcasting. When `inplace` is given (a is then *inplace), the result is
// written into it; the inputs are untouched if a check fails. Out of place, lazy mode records the
// call (as def(a, b) with `attrs`) instead of running it.
template <DTypeRule Rule, typename F>
Tensor binary_op(const OpDef& def, const Tensor& a_in, const Tensor& b_in, const F& f,
                 Tensor* inplace = nullptr, Attrs attrs = {}) {
  KILN_CHECK(def.dtype_rule == Rule, def.name, ": dtype rule mismatch");
  check_elementwise_input(def, a_in, inplace ? "self" : "input");
  check_elementwise_input(def, b_in, "other");
  Shape shape = broadcast_shapes(a_in.sizes(), b_in.sizes(), def.name.c_str());
  const DType promoted = result_type(a_in, b_in);
  // torch reads a logical op's operands' truth in their common dtype: a float64 denormal beside a
  // float32 tensor is 0 there, so false. Converted first, the recorded op's operands agree too.
  const bool convert =
      Rule == DTypeRule::Logical && (a_in.dtype() != promoted || b_in.dtype() != promoted);
  const Tensor a = convert ? a_in.to(promoted) : a_in, b = convert ? b_in.to(promoted) : b_in;
  DType compute = compute_type(def.dtype_rule, promoted);
  DType out_type = produces_bool(def.dtype_rule) ? kBool : compute;
  if (!inplace && should_record(a, b))
    return lazy_record1(def, {a, b}, std::move(attrs), {std::move(shape), out_type});
  Tensor ta = a.to(compute), tb = b.to(compute);
  Tensor out;
  bool direct =
      inplace && out_type == inplace->dtype() && shape == inplace->sizes() && ta.is_same(*inplace);
  if (direct) {
    out = *inplace;
    if (may_overlap(out, tb)) tb = tb.clone();
  } else {
    out = make_empty(shape, out_type);
  }
  binary_into<Rule>(def, f, out, ta, tb);
  if (inplace) {
    if (direct)
      bump_version(out);
    else
      finish_inplace(def, *inplace, out);
  }
  return out;
}

}  // namespace kiln::detail
