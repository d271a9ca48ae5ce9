// ExpertManager prefetch: reads queued through Storage::submit land as ordinary cache entries, a demand for an
// expert in flight waits for that read (one read, not two), prefetch never evicts what is in use, kept or
// prefetched-and-unused, and a failed prefetch leaves the demand read to report the fault.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "colibri/engine/expert_manager.hpp"
#include "colibri/sdk/storage_view.hpp"
#include "support/memory_experts.hpp"

namespace colibri::engine {
namespace {

using sdk::ExpertKey;

// Serves files from memory; submit() holds requests until complete_all() (another thread may call it).
// Offers "colibri.storage.cancel.v1" over its queue unless offer_cancel is false.
class DeferredStorage final : public testing::MemoryStorage, public sdk::StorageCancel {
 public:
  std::atomic<int> prefetch_reads{0};
  std::atomic<int> demand_submits{0};  // fetch() queues at demand priority, prefetch() below it

  sdk::Status submit(sdk::ReadRequest request, sdk::ReadCallback done) noexcept override {
    if (request.priority == sdk::ReadPriority::demand) ++demand_submits;
    std::lock_guard lock(mu_);
    queued_.emplace_back(request, std::move(done));
    return {};
  }
  std::size_t queued() {
    std::lock_guard lock(mu_);
    return queued_.size();
  }
  void complete_all() {
    std::vector<std::pair<sdk::ReadRequest, sdk::ReadCallback>> now;
    {
      std::lock_guard lock(mu_);
      now.swap(queued_);
    }
    for (auto& [r, done] : now) {
      r.status = read_request(r);
      ++prefetch_reads;
      done(r);
    }
  }
  void drain() noexcept override { complete_all(); }
  bool offer_cancel = true;
  void* query_interface(std::string_view id) noexcept override {
    return offer_cancel && id == sdk::kStorageCancelInterface ? static_cast<sdk::StorageCancel*>(this) : nullptr;
  }
  bool cancel(std::uint64_t user_tag) noexcept override {
    std::vector<std::pair<sdk::ReadRequest, sdk::ReadCallback>> withdrawn;
    {
      std::lock_guard lock(mu_);
      for (auto it = queued_.begin(); it != queued_.end();) {
        if (it->first.user_tag == user_tag) {
          withdrawn.push_back(std::move(*it));
          it = queued_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& [r, done] : withdrawn) {
      r.status = sdk::Status(sdk::StatusCode::cancelled, "cancelled");
      done(r);
    }
    return !withdrawn.empty();
  }
  bool async = true;
  sdk::StorageCapabilities capabilities() const noexcept override {
    sdk::StorageCapabilities c;
    c.async = async;
    return c;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<sdk::ReadRequest, sdk::ReadCallback>> queued_;
};

using testing::ListPolicy;

constexpr std::uint64_t kBlob = 4096;

struct Fixture : testing::MemoryExpertSet<DeferredStorage> {
  Fixture(int layers, int experts) : MemoryExpertSet(layers, experts, kBlob) {}
};

ExpertKey key(std::uint32_t l, std::uint32_t e) {
  return {l, e};
}

// m.acquire(layer, expert) while another thread lands the queued reads after `delay`: a demand that has to wait.
auto acquire_while_landing(ExpertManager& m, DeferredStorage& storage, std::int64_t layer, std::int64_t expert,
                           std::chrono::milliseconds delay) {
  std::thread completer([&] {
    std::this_thread::sleep_for(delay);
    storage.complete_all();
  });
  auto w = m.acquire(layer, expert);
  completer.join();
  return w;
}

TEST(Prefetch, LandedPrefetchIsAHitAndReadsOnce) {
  Fixture f(2, 4);
  auto m = f.manager(3 * kBlob);
  ASSERT_FALSE(m.resident());
  const ExpertKey want[] = {key(1, 2)};
  EXPECT_EQ(m.prefetches_open(), 0u);
  EXPECT_EQ(m.prefetch(want), 1u);
  EXPECT_EQ(m.prefetch(want), 0u);     // already in flight: not queued twice
  EXPECT_EQ(m.prefetches_open(), 1u);  // reading
  f.storage->complete_all();
  EXPECT_EQ(m.prefetches_open(), 1u);  // landed, not used yet
  auto w = m.acquire(1, 2);
  EXPECT_EQ(m.prefetches_open(), 0u);
  ASSERT_TRUE(w) << w.error().message();
  EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(w->gate.data)), 1 * 16 + 2);
  m.release(1, 2);
  EXPECT_EQ(f.storage->reads.load(), 1);
  EXPECT_EQ(m.stats().misses, 0u);
  EXPECT_EQ(m.stats().hits, 1u);
  EXPECT_EQ(m.stats().prefetch_issued, 1u);
  EXPECT_EQ(m.stats().prefetch_used, 1u);
  EXPECT_EQ(m.stats().bytes_read, kBlob);
  EXPECT_EQ(f.storage->demand_submits.load(), 0);  // prefetches queue below demand reads
}

TEST(Prefetch, DemandForAnExpertInFlightWaitsForThatRead) {
  Fixture f(1, 4);
  auto m = f.manager(2 * kBlob);
  const ExpertKey want[] = {key(0, 3)};
  ASSERT_EQ(m.prefetch(want), 1u);
  // Blocks until the completer lands the prefetch.
  auto w = acquire_while_landing(m, *f.storage, 0, 3, std::chrono::milliseconds(50));
  ASSERT_TRUE(w) << w.error().message();
  m.release(0, 3);
  EXPECT_EQ(f.storage->reads.load(), 1);  // single flight: no second read
  EXPECT_EQ(m.stats().misses, 0u);
  EXPECT_EQ(m.stats().prefetch_used, 1u);
  EXPECT_GT(m.stats().stall_seconds, 0.0);
}

TEST(Prefetch, NeverEvictsInUseKeptOrUnusedPrefetchedExperts) {
  Fixture f(2, 4);
  auto m = f.manager(3 * kBlob);
  ASSERT_TRUE(m.acquire(0, 0));  // in use
  ASSERT_TRUE(m.acquire(0, 1));
  m.release(0, 1);  // resident, but kept below
  const ExpertKey keep[] = {key(0, 1)};
  const ExpertKey want[] = {key(1, 0), key(1, 1)};
  EXPECT_EQ(m.prefetch(want, keep), 1u);  // room for one only: 0:0 in use, 0:1 kept
  f.storage->complete_all();
  const ExpertKey more[] = {key(1, 2)};
  EXPECT_EQ(m.prefetch(more, keep), 0u);  // would have to evict 0:0 (in use), 0:1 (kept) or 1:0 (unused prefetch)
  m.release(0, 0);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
  // A demand read may evict an unused prefetch; that counts as wasted.
  ASSERT_TRUE(m.acquire(1, 3));
  m.release(1, 3);
  ASSERT_TRUE(m.acquire(0, 2));
  m.release(0, 2);
  ASSERT_TRUE(m.acquire(1, 2));
  m.release(1, 2);
  EXPECT_EQ(m.stats().prefetch_wasted, 1u);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
}

// Byte `at` of expert 0:1's file corrupted, its read queued by `queue` (prefetch or fetch) and landed: the demand
// read reports the checksum mismatch (`failed_prefetches` counts it as a failed prefetch or not), and the manager
// goes on: another expert still loads, within budget.
template <typename Queue>
void expect_corrupt_expert_reported_on_demand(std::size_t at, Queue queue, std::uint64_t failed_prefetches) {
  Fixture f(1, 2);
  f.storage->files["/m/experts/L0E1.bin"][at] = std::byte{0xFF};
  auto m = f.manager(1 * kBlob);
  const ExpertKey want[] = {key(0, 1)};
  ASSERT_EQ(queue(m, want), 1u);
  f.storage->complete_all();
  auto bad = m.acquire(0, 1);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("L0/E1: checksum mismatch in "), std::string::npos) << bad.error().message();
  EXPECT_EQ(m.stats().prefetch_failed, failed_prefetches);
  auto good = m.acquire(0, 0);
  ASSERT_TRUE(good) << good.error().message();
  m.release(0, 0);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
}

TEST(Prefetch, FailedPrefetchLeavesTheDemandReadToReportTheFault) {
  expect_corrupt_expert_reported_on_demand(
      100, [](ExpertManager& m, std::span<const ExpertKey> k) { return m.prefetch(k); }, 1);
}

TEST(Prefetch, DemandReadWaitsForPrefetchesHoldingTheRoomItNeeds) {
  Fixture f(1, 3);
  auto m = f.manager(1 * kBlob);
  const ExpertKey want[] = {key(0, 1)};
  ASSERT_EQ(m.prefetch(want), 1u);  // the only slot, in flight
  // Needs that slot: waits for the read to land, then evicts it.
  auto w = acquire_while_landing(m, *f.storage, 0, 2, std::chrono::milliseconds(30));
  ASSERT_TRUE(w) << w.error().message();
  m.release(0, 2);
  EXPECT_EQ(m.stats().prefetch_wasted, 1u);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
}

TEST(Prefetch, ResidentModeNeverPrefetches) {
  Fixture f(1, 2);
  auto m = f.manager(1 << 20);
  ASSERT_TRUE(m.preload());
  const ExpertKey want[] = {key(0, 1)};
  EXPECT_EQ(m.prefetch(want), 0u);
  EXPECT_EQ(f.storage->queued(), 0u);
}

TEST(Prefetch, SynchronousStorageIsNotPrefetchedFrom) {
  Fixture f(1, 4);
  f.storage->async = false;
  auto m = f.manager(2 * kBlob);
  const ExpertKey want[] = {key(0, 1)};
  EXPECT_EQ(m.prefetch(want), 0u);
  EXPECT_EQ(f.storage->queued(), 0u);
}

TEST(Prefetch, DestructionWaitsForReadsInFlight) {
  Fixture f(1, 4);
  {
    auto m = f.manager(2 * kBlob);
    const ExpertKey want[] = {key(0, 1), key(0, 2)};
    ASSERT_EQ(m.prefetch(want), 2u);
  }  // drain() lands both before the slots go away
  EXPECT_EQ(f.storage->prefetch_reads.load(), 2);
}

TEST(Usage, CountsAcquiresButNotPinLoads) {
  Fixture f(1, 3);
  auto m = f.manager(1 << 20);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m.acquire(0, 2));
    m.release(0, 2);
  }
  ASSERT_TRUE(m.acquire(0, 0));
  m.release(0, 0);
  EXPECT_EQ(m.usage().at(key(0, 2).packed()), 3u);
  EXPECT_EQ(m.usage().at(key(0, 0).packed()), 1u);
  EXPECT_EQ(m.usage().count(key(0, 1).packed()), 0u);
}

// fetch(): one layer's misses queued together at demand priority; each is read once and counts as a miss.
TEST(Fetch, LayerMissesAreQueuedTogetherAndCountAsMisses) {
  Fixture f(1, 4);
  auto m = f.manager(3 * kBlob);
  const ExpertKey layer[] = {key(0, 1), key(0, 2)};
  EXPECT_EQ(m.fetch(layer), 2u);
  EXPECT_EQ(f.storage->queued(), 2u);  // both in flight before either is waited for
  EXPECT_EQ(f.storage->demand_submits.load(), 2);
  EXPECT_FALSE(m.ready(0, 1));
  EXPECT_EQ(m.fetch(layer), 0u);  // in flight: not queued twice
  f.storage->complete_all();
  for (const auto& k : layer) {
    auto w = m.acquire(k.layer, k.expert);
    ASSERT_TRUE(w) << w.error().message();
    EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(w->down.data)), k.expert);
    m.release(k.layer, k.expert);
  }
  EXPECT_EQ(f.storage->reads.load(), 2);
  EXPECT_EQ(m.stats().misses, 2u);
  EXPECT_EQ(m.stats().hits, 0u);
  EXPECT_EQ(m.stats().prefetch_issued, 0u);
  EXPECT_EQ(m.stats().prefetch_used, 0u);
  EXPECT_EQ(m.stats().bytes_read, 2 * kBlob);
  EXPECT_TRUE(m.ready(0, 1));
  EXPECT_FALSE(m.ready(0, 3));
}

TEST(Fetch, DemandWaitsForTheFetchInFlight) {
  Fixture f(1, 4);
  auto m = f.manager(2 * kBlob);
  const ExpertKey layer[] = {key(0, 3)};
  ASSERT_EQ(m.fetch(layer), 1u);
  auto w = acquire_while_landing(m, *f.storage, 0, 3, std::chrono::milliseconds(50));
  ASSERT_TRUE(w) << w.error().message();
  m.release(0, 3);
  EXPECT_EQ(f.storage->reads.load(), 1);
  EXPECT_EQ(m.stats().misses, 1u);
  EXPECT_GT(m.stats().stall_seconds, 0.0);
  EXPECT_EQ(m.stats().stall_saved_seconds, 0.0);  // a demand read saves nothing
}

TEST(Fetch, NeverEvictsInUseOrNeededExperts) {
  Fixture f(1, 4);
  auto m = f.manager(2 * kBlob);
  ASSERT_TRUE(m.acquire(0, 0));  // in use
  const ExpertKey layer[] = {key(0, 1), key(0, 2)};
  EXPECT_EQ(m.fetch(layer), 1u);  // room for one: the second would evict 0:0 (in use) or 0:1 (needed)
  f.storage->complete_all();
  m.release(0, 0);
  for (const auto& k : layer) {  // the rest is read on demand
    ASSERT_TRUE(m.acquire(k.layer, k.expert));
    m.release(k.layer, k.expert);
  }
  EXPECT_EQ(m.stats().misses, 3u);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
}

TEST(Fetch, CorruptExpertIsReportedByTheDemandRead) {
  // A fetch is not a prefetch: no failed prefetch.
  expect_corrupt_expert_reported_on_demand(
      2000, [](ExpertManager& m, std::span<const ExpertKey> k) { return m.fetch(k); }, 0);
}

TEST(Fetch, SynchronousStorageIsNotFetchedFrom) {
  Fixture f(1, 2);
  f.storage->async = false;
  auto m = f.manager(1 * kBlob);
  ASSERT_FALSE(m.resident());
  const ExpertKey layer[] = {key(0, 1)};
  EXPECT_EQ(m.fetch(layer), 0u);
}

// An evicted expert's buffer holds the next one loaded (no new mapping to fault in and zero), even a smaller one,
// and resident bytes never exceed the budget.
TEST(SlotBuffers, EvictedBufferIsReusedForTheNextLoad) {
  Fixture f(1, 3);
  f.manifest.experts[0].size = 2 * kBlob;  // a larger blob first
  f.storage->files["/m/experts/L0E0.bin"].resize(2 * kBlob);
  auto m = f.manager(2 * kBlob);
  ASSERT_FALSE(m.resident());
  auto a = m.acquire(0, 0);
  ASSERT_TRUE(a);
  const void* first = a->gate.data;
  m.release(0, 0);
  auto b = m.acquire(0, 1);  // evicts 0:0 and lands in its buffer
  ASSERT_TRUE(b);
  EXPECT_EQ(b->gate.data, first);
  EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(b->gate.data)), 1);
  EXPECT_EQ(m.resident_bytes(), 2 * kBlob);  // the reused buffer's size, not the blob's
  m.release(0, 1);
  auto c = m.acquire(0, 2);  // evicts 0:1 again: still one buffer, within the budget
  ASSERT_TRUE(c);
  EXPECT_EQ(c->gate.data, first);
  EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(c->gate.data)), 2);
  m.release(0, 2);
  EXPECT_EQ(m.stats().evictions, 2u);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
}

TEST(CancelStale, WithdrawsQueuedPrefetchesOfLayersThatHavePassed) {
  Fixture f(3, 2);
  auto m = f.manager(4 * kBlob);
  const ExpertKey want[] = {key(1, 0), key(1, 1), key(2, 0)};
  ASSERT_EQ(m.prefetch(want), 3u);
  const ExpertKey needed[] = {key(0, 1)};
  ASSERT_EQ(m.fetch(needed), 1u);  // a demand read of an earlier layer: never stale
  EXPECT_EQ(m.resident_bytes(), 4 * kBlob);
  EXPECT_EQ(m.cancel_stale(1), 2u);  // layer 1 is done: its two prefetches were not picked
  EXPECT_EQ(m.stats().prefetch_cancelled, 2u);
  EXPECT_EQ(m.stats().prefetch_failed, 0u);
  EXPECT_EQ(m.resident_bytes(), 2 * kBlob) << "withdrawn slots go back to the budget";
  EXPECT_EQ(f.storage->queued(), 2u);  // 2:0 and the demand read of 0:1 stay queued
  EXPECT_EQ(m.cancel_stale(1), 0u);
  f.storage->complete_all();
  EXPECT_EQ(f.storage->reads.load(), 2);
  // Cancelling changes where bytes come from, never which: a cancelled expert is read on demand.
  for (const auto k : {key(1, 0), key(2, 0), key(0, 1)}) {
    auto w = m.acquire(k.layer, k.expert);
    ASSERT_TRUE(w) << w.error().message();
    EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(w->gate.data)), k.layer * 16 + k.expert);
    m.release(k.layer, k.expert);
  }
  EXPECT_EQ(m.stats().prefetch_used, 1u);  // 2:0
  EXPECT_EQ(m.stats().misses, 2u);         // 1:0 read again on demand, 0:1 fetched
  EXPECT_EQ(m.stats().prefetch_wasted, 0u);
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
}

TEST(CancelStale, LandedPrefetchesAndStoragesWithoutCancelAreLeftAlone) {
  Fixture f(2, 2);
  auto m = f.manager(2 * kBlob);
  const ExpertKey want[] = {key(1, 0)};
  ASSERT_EQ(m.prefetch(want), 1u);
  f.storage->complete_all();
  EXPECT_EQ(m.cancel_stale(1), 0u);  // it has landed: it stays cached
  EXPECT_EQ(m.resident_count(), 1u);

  Fixture g(2, 2);
  g.storage->offer_cancel = false;
  auto n = g.manager(2 * kBlob);
  ASSERT_EQ(n.prefetch(want), 1u);
  EXPECT_EQ(n.cancel_stale(1), 0u);
  EXPECT_EQ(g.storage->queued(), 1u);
  g.storage->complete_all();
  ASSERT_TRUE(n.acquire(1, 0));
  n.release(1, 0);
  EXPECT_EQ(n.stats().prefetch_used, 1u);
  EXPECT_EQ(n.stats().prefetch_cancelled, 0u);
}

// Records what the policy hears per expert; victims as ListPolicy picks them.
class CountingPolicy final : public sdk::CachePolicy {
 public:
  std::map<std::uint64_t, int> inserts, accesses;
  void on_insert(ExpertKey k, std::uint64_t bytes) noexcept override {
    ++inserts[k.packed()];
    order_.on_insert(k, bytes);
  }
  void on_access(ExpertKey k) noexcept override {
    ++accesses[k.packed()];
    order_.on_access(k);
  }
  void on_erase(ExpertKey k) noexcept override { order_.on_erase(k); }
  std::optional<ExpertKey> pick_victim(const sdk::EvictablePredicate& ok) noexcept override {
    return order_.pick_victim(ok);
  }
  void clear() noexcept override { order_.clear(); }

 private:
  ListPolicy order_;
};

// The policy contract (sdk/cache_policy.hpp): every use is one on_access, whatever read the expert; an insert is
// not a use, so a prefetch that is never used and a warm load leave no access behind.
TEST(PolicyEvents, EachUseIsOneAccessAndInsertsAreNotUses) {
  Fixture f(2, 4);
  auto counting = std::make_shared<CountingPolicy>();
  ExpertManager m(f.manifest, "/m", f.storage, counting, 5 * kBlob);
  auto use = [&](std::uint32_t l, std::uint32_t e) {
    ASSERT_TRUE(m.acquire(l, e));
    m.release(l, e);
  };
  use(0, 0);  // demand miss, read synchronously
  use(0, 0);  // hit
  const ExpertKey fetched[] = {key(0, 1)};
  ASSERT_EQ(m.fetch(fetched), 1u);
  const ExpertKey guessed[] = {key(1, 0), key(1, 1)};
  ASSERT_EQ(m.prefetch(guessed), 2u);
  f.storage->complete_all();
  use(0, 1);  // fetched for this use
  use(1, 0);  // prefetched and used
  const ExpertKey warmed[] = {key(1, 2)};
  ASSERT_TRUE(m.warm(warmed));
  EXPECT_EQ(m.stats().misses, 2u);
  EXPECT_EQ(m.stats().hits, 2u);
  const std::map<std::uint64_t, int> inserts{
      {key(0, 0).packed(), 1}, {key(0, 1).packed(), 1}, {key(1, 0).packed(), 1},
      {key(1, 1).packed(), 1}, {key(1, 2).packed(), 1},
  };
  const std::map<std::uint64_t, int> accesses{
      {key(0, 0).packed(), 2},
      {key(0, 1).packed(), 1},
      {key(1, 0).packed(), 1},
  };
  EXPECT_EQ(counting->inserts, inserts);
  EXPECT_EQ(counting->accesses, accesses);  // 1:1 (never used) and 1:2 (warmed) have none
}

}  // namespace
}  // namespace colibri::engine
