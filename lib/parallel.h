// parallel_for over an index range on the library's one OpenMP thread pool.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace kiln::detail {

// Below this many elements of simple work a loop stays on one thread: waking the pool costs more.
constexpr int64_t kParallelGrain = 32768;

// Calls f(begin, end) on disjoint chunks covering [0, n). Chunks are contiguous and at least
// `grain` long; f must not throw (exceptions cannot cross an OpenMP region), so check first.
template <typename F>
void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n <= grain) {  // without asking OpenMP: small loops are common and its calls are not free
    f(int64_t{0}, n);
    return;
  }
  int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t chunks = std::min<int64_t>(max_threads, (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    int64_t tid = omp_get_thread_num();
    int64_t nt = omp_get_num_threads();
    int64_t per = (n + nt - 1) / nt;
    int64_t b = std::min(n, tid * per), e = std::min(n, b + per);
    if (b < e) f(b, e);
  }
}

}  // namespace kiln::detail
