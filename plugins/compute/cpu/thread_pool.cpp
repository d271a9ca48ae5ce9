#include "thread_pool.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace colibri::cpu {

namespace {
// How long a thread spins before it sleeps. A decode step issues hundreds of jobs with short host
// work between them; a sleeping worker costs a futex wake (an inter-processor interrupt, slow in a
// VM) and arrives late, so the other thread does most of the job. Measured in time, not in pause
// instructions, whose length differs between CPUs by 10x.
constexpr auto kSpinTime = std::chrono::microseconds(1000);

// Spins until done() or kSpinTime has passed; returns done(). Not at all when `spin` is false: with more threads
// than CPUs a spinning thread holds the CPU that the thread it waits for needs (1024 threads on 2 CPUs took a
// minute for 2 tokens).
template <typename Done>
bool spin_until(bool spin, Done&& done) noexcept {
  if (!spin) return done();
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    _mm_pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kSpinTime) return done();
  }
}

constexpr std::int64_t kMaxClaim = 4;
constexpr std::uint64_t kClosed = 0xFFFFFFFFu;  // a task index no job reaches: nothing to claim

#ifdef COLIBRI_THREAD_POOL_TESTING
void publish_pause() noexcept {
  if (thread_pool_publish_pause != nullptr) thread_pool_publish_pause();
}
#else
void publish_pause() noexcept {}
#endif
}  // namespace

#ifdef COLIBRI_THREAD_POOL_TESTING
void (*thread_pool_publish_pause)() noexcept = nullptr;
#endif

ThreadPool::ThreadPool(int threads)
    : threads_(threads < 1 ? 1 : threads),
      spin_(static_cast<unsigned>(threads_) <= std::max(1u, std::thread::hardware_concurrency())) {
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
    // Acquire pairs with dispatch(): seeing the next job's count implies seeing its closed claim
    // word, so the compare-exchange below fails instead of claiming a task of the wrong job.
    const std::int64_t total = tasks_.load(std::memory_order_acquire);
    if (task >= total) return;
    // Guided claims: a share of what is left, at most kMaxClaim tasks, down to single tasks at the
    // end. Fewer contended atomics than one claim per task (the claim word and done_ bounce between
    // cores), the small last claims even out the finishing times, and the cap bounds what a thread
    // that the OS deschedules mid-claim (a shared machine) holds back from the others.
    const std::int64_t chunk =
        std::clamp<std::int64_t>((total - task) / (2 * static_cast<std::int64_t>(threads_)), 1, kMaxClaim);
    if (!next_.compare_exchange_weak(v, v + static_cast<std::uint64_t>(chunk), std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      continue;
    for (std::int64_t i = task; i < task + chunk; ++i) fn_(ctx_, i, worker);
    const std::int64_t finished = done_.fetch_add(chunk, std::memory_order_acq_rel) + chunk;
    if (finished == total && worker != 0) {
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
    // Close the previous job's claim word before touching the job: a worker that just finished its
    // last task may still hold that word, and must not pair it with this job's count and function
    // (it would run a task twice and push done_ past `tasks`, so the wait below never ended).
    next_.store((static_cast<std::uint64_t>(gen) << 32) | kClosed, std::memory_order_seq_cst);
    fn_ = fn;
    ctx_ = ctx;
    tasks_.store(tasks, std::memory_order_release);
    publish_pause();
    done_.store(0, std::memory_order_relaxed);
    publish_pause();
    next_.store(static_cast<std::uint64_t>(gen) << 32, std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
  }
  wake_.notify_all();
  drain(gen, 0);
  // Only tasks other threads have claimed are left; wait for those, never for idle workers.
  if (!spin_until(spin_, [&] { return done_.load(std::memory_order_acquire) == tasks; })) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == tasks; });
  }
}

void ThreadPool::work(int worker) noexcept {
  std::uint32_t seen = 0;
  while (true) {
    if (!spin_until(spin_, [&] { return generation_.load(std::memory_order_acquire) != seen || stopping_.load(); })) {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_.load() || generation_.load() != seen; });
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    drain(seen, worker);
  }
}

}  // namespace colibri::cpu
