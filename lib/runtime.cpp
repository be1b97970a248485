// Library-wide runtime settings (threads) and the value-comparison helpers allclose and equal.
#include <omp.h>

#include <cmath>

#include "kiln/ops.h"
#include "lib/env.h"
#include "lib/tensor_impl.h"

extern "C" const char* kiln_omp_spin_count(void);  // lib/startup/omp_wait_policy.c

namespace kiln {

void set_num_threads(int n) {
  KILN_CHECK(n > 0, "set_num_threads: expected a positive number of threads, got ", n);
  omp_set_num_threads(n);
}

int get_num_threads() {
  return omp_get_max_threads();
}

const char* detail::omp_spin_count() {
  return kiln_omp_spin_count();
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  detail::check_defined(a, "allclose");
  detail::check_defined(b, "allclose", "other");
  if (a.sizes() != b.sizes()) return false;
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (!(equal_nan && std::isnan(x[i]) && std::isnan(y[i]))) return false;
      continue;
    }
    if (x[i] == y[i]) continue;  // equal infinities
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  detail::check_defined(a, "equal");
  detail::check_defined(b, "equal", "other");
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  return a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace kiln
