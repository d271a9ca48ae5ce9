// The compute pool: every task runs exactly once per job, jobs never bleed into each other, and
// a job finishes even when workers arrive late.
#include "../thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

namespace {

using colibri::cpu::ThreadPool;

TEST(ThreadPool, RunsEveryTaskOnceAcrossManyBackToBackJobs) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int job = 0; job < 2000; ++job) {
      const std::int64_t tasks = 1 + job % 37;
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
      std::atomic<int> bad_worker{0};
      pool.run(tasks, [&](std::int64_t task, int worker) noexcept {
        hits[static_cast<std::size_t>(task)].fetch_add(1);
        if (worker < 0 || worker >= threads) bad_worker.fetch_add(1);
      });
      for (std::int64_t i = 0; i < tasks; ++i) {
        ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1)
            << "threads " << threads << " job " << job << " task " << i;
      }
      ASSERT_EQ(bad_worker.load(), 0);
    }
  }
}

// More threads than CPUs: nobody spins (a spinning waiter would hold the CPU the awaited thread needs), and every
// task still runs exactly once.
TEST(ThreadPool, OversubscribedPoolSleepsInsteadOfSpinningAndStaysCorrect) {
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_TRUE(ThreadPool(1).spins());
  EXPECT_EQ(ThreadPool(static_cast<int>(cpus)).spins(), true);
  ThreadPool pool(static_cast<int>(cpus) * 4 + 1);
  EXPECT_FALSE(pool.spins());
  for (int job = 0; job < 200; ++job) {
    const std::int64_t tasks = 1 + job % 53;
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(tasks));
    pool.run(tasks, [&](std::int64_t task, int) noexcept { hits[static_cast<std::size_t>(task)].fetch_add(1); });
    for (std::int64_t i = 0; i < tasks; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << job;
  }
}

// A worker that finished the last task of a job must not claim a task of the next job through
// the old job's claim word while dispatch() publishes the next job. It used to: the task ran twice
// and done_ overshot the task count, so run() waited forever (a rare hang under machine load). The
// seam sleeps inside the publish steps to make that preemption certain; a watchdog turns a hang
// into a failure.
TEST(ThreadPool, WorkerOfFinishedJobNeverClaimsTaskOfNextJob) {
  colibri::cpu::thread_pool_publish_pause = []() noexcept {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  };
  std::promise<void> finished;
  auto finished_future = finished.get_future();
  std::atomic<int> duplicate_job{-1};
  std::thread runner([&] {
    ThreadPool pool(4);
    std::vector<std::atomic<int>> hits(64);
    for (int job = 0; job < 3000 && duplicate_job.load() < 0; ++job) {
      const std::int64_t tasks = 2 + job % 31;  // growing counts make a stale claim look valid
      for (std::int64_t i = 0; i < tasks; ++i) hits[static_cast<std::size_t>(i)].store(0);
      pool.run(tasks, [&](std::int64_t task, int) noexcept { hits[static_cast<std::size_t>(task)].fetch_add(1); });
      for (std::int64_t i = 0; i < tasks; ++i) {
        if (hits[static_cast<std::size_t>(i)].load() != 1) duplicate_job = job;
      }
    }
    finished.set_value();
  });
  if (finished_future.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "ThreadPool::run() did not return within 120 s (lost completion)\n");
    std::_Exit(1);  // the pool thread is stuck; it cannot be joined
  }
  runner.join();
  colibri::cpu::thread_pool_publish_pause = nullptr;
  EXPECT_EQ(duplicate_job.load(), -1) << "a task ran twice or never in job " << duplicate_job.load();
}

TEST(ThreadPool, ZeroTasksReturnsAtOnce) {
  ThreadPool pool(2);
  int calls = 0;
  pool.run(0, [&](std::int64_t, int) noexcept { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
