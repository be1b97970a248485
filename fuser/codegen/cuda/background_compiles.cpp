// The worker threads of tiered compiles (see background_compiles.h).
#include "fuser/codegen/cuda/background_compiles.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <thread>

#include "jit/log.h"

namespace kiln::fuser::cuda {

BackgroundCompiles::BackgroundCompiles(int workers) : max_workers_(std::max(1, workers)) {}

BackgroundCompiles::~BackgroundCompiles() {
  std::unique_lock<std::mutex> lock(mu_);
  stop_ = true;
  queued_.notify_all();
  exited_.wait(lock, [this] { return workers_ == 0; });
}

bool BackgroundCompiles::submit(const std::string& key, std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!keys_.insert(key).second) return false;
  queue_.emplace_back(key, std::move(job));
  // A worker per queued job, up to the cap: a burst of new kernels compiles in parallel.
  if (workers_ < max_workers_ && workers_ < static_cast<int>(queue_.size()) + running_) {
    ++workers_;
    std::thread([this] { work(); }).detach();  // the queue outlives its workers (never destroyed)
  }
  queued_.notify_one();
  return true;
}

void BackgroundCompiles::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    queued_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {  // stopping
      --workers_;
      exited_.notify_all();
      return;
    }
    auto [key, job] = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    bool threw = false;
    try {
      job();
    } catch (const std::exception& e) {
      threw = true;
      jit::log("codegen", "background compile of ", key, " failed: ", e.what());
    } catch (...) {
      threw = true;
      jit::log("codegen", "background compile of ", key, " failed");
    }
    lock.lock();
    --running_;
    ++finished_;
    if (threw) ++failed_;
    keys_.erase(key);
    if (queue_.empty() && running_ == 0) idle_.notify_all();
  }
}

void BackgroundCompiles::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
}

int64_t BackgroundCompiles::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

int64_t BackgroundCompiles::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void BackgroundCompiles::after_fork_in_child() {
  // The fork happened with mu_ held (the prepare handler), so no worker was inside it; the
  // workers themselves are gone, and with them whatever they were running.
  queue_.clear();
  keys_.clear();
  workers_ = running_ = 0;
  mu_.unlock();
}

BackgroundCompiles& BackgroundCompiles::instance() {
  static BackgroundCompiles* queue = [] {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    auto* q = new BackgroundCompiles(std::clamp(cores / 2, 1, 4));
    std::atexit([] { instance().wait_idle(); });
    pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                   [] { instance().after_fork_in_child(); });
    return q;
  }();
  return *queue;
}

}  // namespace kiln::fuser::cuda
