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

#ifdef COLIBRI_THREAD_POOL_TESTING
// Test seam (only in the pool's own test build): called by dispatch() between the steps that
// publish a job, so a test can stretch the windows where a descheduled thread would race.
extern void (*thread_pool_publish_pause)() noexcept;
#endif

class ThreadPool {
 public:
  // `threads` includes the calling thread: 1 means "run everything inline".
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  [[nodiscard]] int size() const noexcept { return threads_; }
  // Whether waiting threads spin before they sleep: only while every thread can have a CPU of its own.
  [[nodiscard]] bool spins() const noexcept { return spin_; }

  // Calls fn(task, worker) for every task in [0, tasks), worker in [0, size()); returns when all
  // have run. fn must not throw. Not reentrant (the backend serialises calls). tasks < 2^32 - 1.
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
  // Claims and runs tasks of job `generation` until none is left. A late worker of a finished
  // job claims nothing: the claim counter carries the job's generation in its high 32 bits.
  void drain(std::uint32_t generation, int worker) noexcept;

  int threads_;
  bool spin_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_cv_;
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> stopping_{false};
  // The current job; fn_ and ctx_ are read only after a successful claim (the job cannot end
  // while a claimed task is unfinished, so they are still this job's).
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<std::int64_t> tasks_{0};
  std::atomic<std::uint64_t> next_{0};  // (generation << 32) | next task
  std::atomic<std::int64_t> done_{0};   // finished tasks of the current job
};

}  // namespace colibri::cpu
