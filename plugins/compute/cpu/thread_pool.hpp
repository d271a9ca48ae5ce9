// A fixed pool of compute threads. Work is a count of independent tasks handed out dynamically;
// which thread runs a task never changes its result (tasks own disjoint outputs and each is
// computed by the same code), so the thread count cannot change bits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace colibri::cpu {

class ThreadPool {
 public:
  // `threads` includes the calling thread: 1 means "run everything inline".
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  [[nodiscard]] int size() const noexcept { return threads_; }

  // Calls fn(task, worker) for every task in [0, tasks), worker in [0, size()); returns when all
  // have run. fn must not throw. Not reentrant (the backend serialises calls).
  template <typename Fn>
  void run(std::int64_t tasks, Fn&& fn) noexcept {
    if (tasks <= 0) return;
    if (threads_ == 1 || tasks == 1) {
      for (std::int64_t i = 0; i < tasks; ++i) fn(i, 0);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    dispatch(
        tasks, [](void* ctx, std::int64_t task, int worker) noexcept { (*static_cast<F*>(ctx))(task, worker); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, std::int64_t task, int worker) noexcept;
  void dispatch(std::int64_t tasks, TaskFn fn, void* ctx) noexcept;
  void work(int worker) noexcept;
  void drain(int worker) noexcept;

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  // The current job.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t tasks_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::atomic<int> busy_{0};
};

}  // namespace colibri::cpu
