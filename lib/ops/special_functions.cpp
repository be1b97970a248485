// The special functions composed of the primitive rows of lib/ops/unary_ops.inc (erfc, erfinv,
// lgamma, digamma, trigamma): polygamma, mvlgamma and the kiln::special namespace, which holds
// libtorch's torch::special names for them.
#include <cmath>
#include <string>

#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

Tensor polygamma(int64_t n, const Tensor& x) {
  KILN_CHECK(n == 0 || n == 1, "polygamma: order ", n, " of ", describe(x),
             (n < 0 ? " is negative" : " is not implemented (kiln computes orders 0 and 1)"));
  return n == 0 ? digamma(x) : trigamma(x);
}

Tensor Tensor::polygamma(int64_t n) const {
  return kiln::polygamma(n, *this);
}

// sum_j lgamma(x - j/2) over j < p, plus p (p - 1) / 4 log(pi); every element must exceed
// (p - 1) / 2 (torch's check: a validity check only, which inside jit::trace checks the example).
Tensor mvlgamma(const Tensor& x, int64_t p) {
  const char* op = "mvlgamma";
  detail::check_defined(x, op, "input");
  KILN_CHECK(p >= 1, op, ": p must be at least 1, got ", p);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point tensor, got ", describe(x));
  {
    detail::ValueCheckScope checking;
    KILN_CHECK(all(gt(x.detach(), (static_cast<double>(p) - 1) / 2)).item<bool>(), op,
               ": every element of ", describe(x),
               " must be greater than (p - 1) / 2 = ", (static_cast<double>(p) - 1) / 2);
  }
  Tensor sum = lgamma(x);
  for (int64_t j = 1; j < p; ++j) sum = sum + lgamma(x - static_cast<double>(j) / 2);
  return sum + static_cast<double>(p) * static_cast<double>(p - 1) / 4 * std::log(M_PI);
}

namespace special {

Tensor erf(const Tensor& x) {
  return kiln::erf(x);
}
Tensor erfc(const Tensor& x) {
  return kiln::erfc(x);
}
Tensor erfinv(const Tensor& x) {
  return kiln::erfinv(x);
}
Tensor gammaln(const Tensor& x) {
  return kiln::lgamma(x);
}
Tensor digamma(const Tensor& x) {
  return kiln::digamma(x);
}
Tensor psi(const Tensor& x) {
  return kiln::digamma(x);
}
Tensor polygamma(int64_t n, const Tensor& x) {
  return kiln::polygamma(n, x);
}
Tensor multigammaln(const Tensor& x, int64_t p) {
  return kiln::mvlgamma(x, p);
}
// The standard normal's distribution function, (1 + erf(x / sqrt(2))) / 2 written with erfc so
// that the lower tail keeps its relative accuracy.
Tensor ndtr(const Tensor& x) {
  return kiln::erfc(x * -0.7071067811865476) * 0.5;
}

}  // namespace special
}  // namespace kiln
