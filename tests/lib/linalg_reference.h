// Long-double references shared by the matrix function tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kiln::testing {

// The eigenvalues, ascending, of the symmetric n x n row-major matrix a, by cyclic Jacobi
// rotations.
inline std::vector<long double> symmetric_eigenvalues(std::vector<long double> a, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    long double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    if (off < 1e-36L) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (a[p * n + q] == 0) continue;
        const long double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
        const long double t =
            (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const long double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p and q, then rows p and q
          const long double kp = a[k * n + p], kq = a[k * n + q];
          a[k * n + p] = c * kp - s * kq;
          a[k * n + q] = s * kp + c * kq;
        }
        for (int64_t k = 0; k < n; ++k) {
          const long double pk = a[p * n + k], qk = a[q * n + k];
          a[p * n + k] = c * pk - s * qk;
          a[q * n + k] = s * pk + c * qk;
        }
      }
  }
  std::vector<long double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = a[i * n + i];
  std::sort(values.begin(), values.end());
  return values;
}

}  // namespace kiln::testing
