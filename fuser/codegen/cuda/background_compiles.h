// Compiles that run on worker threads while a quicker-to-compile stand-in kernel serves
// (cuda_kernel.cpp's tiered compile): one job per key, on a few threads started on first use.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace kiln::fuser::cuda {

class BackgroundCompiles {
 public:
  explicit BackgroundCompiles(int workers);
  // Runs what is queued, then stops the workers.
  ~BackgroundCompiles();
  BackgroundCompiles(const BackgroundCompiles&) = delete;
  BackgroundCompiles& operator=(const BackgroundCompiles&) = delete;

  // Queues `job` under `key`, unless a job of that key is queued or running (false then). A job
  // that throws is logged (KILN_LOG=codegen) and counted; the others go on.
  bool submit(const std::string& key, std::function<void()> job);
  // Blocks until nothing is queued or running.
  void wait_idle();
  int64_t finished() const;  // jobs run to the end, thrown or not
  int64_t failed() const;    // jobs that threw

  // The process's queue: never destroyed, drained when the process exits (so that what it compiles
  // reaches the disk cache), and reset in a forked child (whose workers did not survive the fork).
  static BackgroundCompiles& instance();

 private:
  void work();
  void after_fork_in_child();

  const int max_workers_;
  mutable std::mutex mu_;
  std::condition_variable queued_;  // a job was queued
  std::condition_variable idle_;    // the queue emptied and no job runs
  std::condition_variable exited_;  // a worker stopped
  std::deque<std::pair<std::string, std::function<void()>>> queue_;  // guarded by mu_
  absl::flat_hash_set<std::string> keys_;  // queued or running (guarded by mu_)
  int workers_ = 0;                        // started (guarded by mu_)
  int running_ = 0;                        // guarded by mu_
  int64_t finished_ = 0, failed_ = 0;      // guarded by mu_
  bool stop_ = false;                      // guarded by mu_
};

}  // namespace kiln::fuser::cuda
