// The scalar float32 and float64 transcendental functions of the eager kernels and the
// references: lib/math/primitives.h's single definitions instantiated for plain C++ values. The
// LLVM and CUDA code generators instantiate the same templates; accuracy bounds:
// docs/numerics.md. Always inlined, so that the eager kernels' multiversioned loops (lib/loops.h)
// compile them with FMA.
#pragma once

#include "lib/math/primitives.h"

namespace kiln::detail {

KILN_MATH_INLINE float exp_f32(float x) {
  return math::exp_f32(x);
}
KILN_MATH_INLINE float log_f32(float x) {
  return math::log_f32(x);
}
KILN_MATH_INLINE float log1p_f32(float x) {
  return math::log1p_f32(x);
}
KILN_MATH_INLINE float expm1_f32(float x) {
  return math::expm1_f32(x);
}
KILN_MATH_INLINE float sin_f32(float x) {
  return math::sin_f32(x);
}
KILN_MATH_INLINE float cos_f32(float x) {
  return math::cos_f32(x);
}
KILN_MATH_INLINE float tanh_f32(float x) {
  return math::tanh_f32(x);
}
KILN_MATH_INLINE float erf_f32(float x) {
  return math::erf_f32(x);
}
KILN_MATH_INLINE double exp_f64(double x) {
  return math::exp_f64(x);
}
KILN_MATH_INLINE double log_f64(double x) {
  return math::log_f64(x);
}
KILN_MATH_INLINE double log1p_f64(double x) {
  return math::log1p_f64(x);
}
KILN_MATH_INLINE double expm1_f64(double x) {
  return math::expm1_f64(x);
}
KILN_MATH_INLINE double sin_f64(double x) {
  return math::sin_f64(x);
}
KILN_MATH_INLINE double cos_f64(double x) {
  return math::cos_f64(x);
}
KILN_MATH_INLINE double tanh_f64(double x) {
  return math::tanh_f64(x);
}
KILN_MATH_INLINE double erf_f64(double x) {
  return math::erf_f64(x);
}

// exp(x) for x at most 0 or NaN (x minus a max over it, as softmax, logsumexp and cross entropy
// take it): exp's bits, cheaper in float32; float64 has no cheaper form.
KILN_MATH_INLINE float exp_nonpos(float x) {
  return math::exp_nonpos_f32(x);
}
KILN_MATH_INLINE double exp_nonpos(double x) {
  return math::exp_f64(x);
}

}  // namespace kiln::detail
