// Test helper: the same calls from several threads at once give the results of one thread alone.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "kiln/jit.h"
#include "kiln/kiln.h"

namespace kiln::testing {

// Runs `run` once here, then on `threads` threads `repeats` times each (each result computed on its
// thread): every thread's last results must equal the first run's.
inline void expect_concurrent_runs_match(const std::function<std::vector<Tensor>()>& run,
                                         int threads, int repeats) {
  const std::vector<Tensor> expected = run();
  std::vector<std::vector<Tensor>> got(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (size_t t = 0; t < got.size(); ++t)
    workers.emplace_back([&, t] {
      for (int repeat = 0; repeat < repeats; ++repeat) {
        got[t] = run();
        eval(got[t]);  // computed on this thread
      }
    });
  for (std::thread& w : workers) w.join();
  for (const std::vector<Tensor>& g : got)
    for (size_t k = 0; k < expected.size(); ++k) EXPECT_TRUE(equal(g[k], expected[k])) << k;
}

}  // namespace kiln::testing
