// The compute pool: every task runs exactly once per job, jobs never bleed into each other, and
// a job finishes even when workers arrive late.
#include "../thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
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

TEST(ThreadPool, ZeroTasksReturnsAtOnce) {
  ThreadPool pool(2);
  int calls = 0;
  pool.run(0, [&](std::int64_t, int) noexcept { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
