#include "thread_pool.hpp"

#include <immintrin.h>

namespace colibri::cpu {

namespace {
constexpr int kSpin = 20000;  // pause iterations (~0.5 ms) before sleeping: decode steps come back to back
}

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

void ThreadPool::drain(std::uint32_t generation, int worker) noexcept {
  std::uint64_t v = next_.load(std::memory_order_acquire);
  while (true) {
    if (static_cast<std::uint32_t>(v >> 32) != generation) return;
    const auto task = static_cast<std::int64_t>(v & 0xFFFFFFFFu);
    if (task >= tasks_.load(std::memory_order_relaxed)) return;
    if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    fn_(ctx_, task, worker);
    const std::int64_t finished = done_.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (finished == tasks_.load(std::memory_order_relaxed) && worker != 0) {
      std::lock_guard lock(mu_);
      done_cv_.notify_all();
    }
    v = next_.load(std::memory_order_acquire);
  }
}

void ThreadPool::dispatch(std::int64_t tasks, TaskFn fn, void* ctx) noexcept {
  std::uint32_t gen;
  {
    std::lock_guard lock(mu_);
    gen = generation_.load(std::memory_order_relaxed) + 1;
    fn_ = fn;
    ctx_ = ctx;
    tasks_.store(tasks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    next_.store(static_cast<std::uint64_t>(gen) << 32, std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
  }
  wake_.notify_all();
  drain(gen, 0);
  // Only tasks other threads have claimed are left; wait for those, never for idle workers.
  for (int spin = 0; spin < kSpin && done_.load(std::memory_order_acquire) != tasks; ++spin) _mm_pause();
  if (done_.load(std::memory_order_acquire) != tasks) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == tasks; });
  }
}

void ThreadPool::work(int worker) noexcept {
  std::uint32_t seen = 0;
  while (true) {
    for (int spin = 0; spin < kSpin && generation_.load(std::memory_order_acquire) == seen && !stopping_.load();
         ++spin) {
      _mm_pause();
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_.load() || generation_.load() != seen; });
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    drain(seen, worker);
  }
}

}  // namespace colibri::cpu
