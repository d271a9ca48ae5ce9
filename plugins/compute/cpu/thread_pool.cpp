#include "thread_pool.hpp"

#include <immintrin.h>

namespace colibri::cpu {

ThreadPool::ThreadPool(int threads) : threads_(threads < 1 ? 1 : threads) {
  workers_.reserve(static_cast<std::size_t>(threads_ - 1));
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { work(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(int worker) noexcept {
  while (true) {
    const std::int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= tasks_) break;
    fn_(ctx_, task, worker);
  }
}

void ThreadPool::dispatch(std::int64_t tasks, TaskFn fn, void* ctx) noexcept {
  {
    std::lock_guard lock(mu_);
    fn_ = fn;
    ctx_ = ctx;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_.store(threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain(0);
  // Workers finish within a task's time of the caller; spin briefly before sleeping.
  for (int spin = 0; spin < 20000 && busy_.load(std::memory_order_acquire) != 0; ++spin) _mm_pause();
  if (busy_.load(std::memory_order_acquire) != 0) {
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return busy_.load(std::memory_order_acquire) == 0; });
  }
}

void ThreadPool::work(int worker) noexcept {
  std::uint64_t seen = 0;
  while (true) {
    // Decode steps come back to back: poll a while before sleeping on the condition variable.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen; ++spin) _mm_pause();
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_.load() || generation_.load() != seen; });
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    drain(worker);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mu_);
      done_.notify_all();
    }
  }
}

}  // namespace colibri::cpu
