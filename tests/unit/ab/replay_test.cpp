#include "colibri/ab/replay.hpp"

#include <gtest/gtest.h>

#include <random>

#include "unit/ab/cache_policies.hpp"

namespace colibri::ab {
namespace {

using sdk::ExpertKey;

// Records of one layer, each routing to one expert.
AccessSequence single_layer(const std::vector<int>& experts) {
  std::vector<TraceRecord> t;
  for (std::size_t i = 0; i < experts.size(); ++i) {
    TraceRecord r;
    r.position = static_cast<std::int64_t>(i);
    r.experts = {experts[i]};
    t.push_back(r);
  }
  return AccessSequence::from_trace(t);
}

using testing::cache_policy;

TEST(Belady, TextbookSequence) {
  // The classic 3-frame example: 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1 has 9 faults under OPT.
  const auto seq = single_layer({7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1});
  auto r = belady(seq, 3, ExpertSizes::uniform(0));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->stats.misses, 9u);
  EXPECT_EQ(r->stats.hits, 11u);
}

TEST(Belady, CyclicPatternKeepsAllButOne) {
  // 4 experts cycled 5 times in 3 slots, by hand: 0 1 2 3(evict 2) 0 1 2(evict 1) 3 0 1(evict 0) 2 3 0(evict 3)
  // 1 2 3(evict 2) 0 1 2(evict 1) 3: 4 cold misses + 5 more.
  std::vector<int> cyc;
  for (int i = 0; i < 5; ++i) cyc.insert(cyc.end(), {0, 1, 2, 3});
  auto r = belady(single_layer(cyc), 3, ExpertSizes::uniform(0));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stats.misses, 9u);
}

TEST(Belady, OnlyColdMissesWhenEverythingFits) {
  auto r = belady(single_layer({1, 2, 3, 1, 2, 3, 3, 2}), 3, ExpertSizes::uniform(100));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stats.misses, 3u);
  EXPECT_EQ(r->stats.bytes_read, 300u);
}

TEST(Belady, AGroupLargerThanTheCacheReadsTheExpertNeededSoonestLast) {
  // One slot; a pass needs experts 0 and 1, the next pass 0 again. Reading 1 first, then 0, leaves 0 resident.
  TraceRecord a, b;
  a.experts = {0, 1};
  b.experts = {0};
  auto r = belady(AccessSequence::from_trace({a, b}), 1, ExpertSizes::uniform(0));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->stats.misses, 2u);
  EXPECT_EQ(r->stats.hits, 1u);
}

TEST(AccessSequence, OneGroupPerStepAndLayerWithEachExpertOnceInAscendingId) {
  auto rec = [](std::int64_t step, std::int64_t layer, std::vector<std::int32_t> experts) {
    TraceRecord r;
    r.step = step;
    r.layer = layer;
    r.experts = std::move(experts);
    return r;
  };
  const auto seq = AccessSequence::from_trace(
      {rec(3, 0, {2, 1}), rec(3, 0, {1, 4}), rec(3, 1, {0}), rec(4, 0, {1}), rec(-1, 0, {5, 3, 5}), rec(-1, 0, {5})});
  ASSERT_EQ(seq.groups(), 5u);
  EXPECT_EQ(seq.records, 6u);
  EXPECT_EQ(seq.begin, (std::vector<std::size_t>{0, 3, 4, 5, 7, 8}));
  EXPECT_EQ(seq.first_record, (std::vector<std::size_t>{0, 2, 3, 4, 5}));
  const std::vector<ExpertKey> want = {{0, 1}, {0, 2}, {0, 4}, {1, 0}, {0, 1}, {0, 3}, {0, 5}, {0, 5}};
  EXPECT_EQ(seq.keys, want);
  EXPECT_EQ(seq.layers, 2u);
}

TEST(Replay, APrefillStepReadsEachExpertOnce) {
  // Four tokens of one prefill chunk, all routed to experts 0 and 1: the engine acquires each once.
  std::vector<TraceRecord> t(4);
  for (std::size_t i = 0; i < t.size(); ++i) {
    t[i].position = static_cast<std::int64_t>(i);
    t[i].experts = {1, 0};
  }
  const auto sizes = ExpertSizes::uniform(4096);
  auto no_steps = AccessSequence::from_trace(t);
  for (auto& r : t) r.step = 0;
  auto one_step = AccessSequence::from_trace(t);
  std::vector<ExpertKey> universe = {{0, 0}, {0, 1}, {0, 2}};  // three experts: a 2-slot cache streams
  auto a = replay(one_step, cache_policy("lru"), "lru", 2 * 4096, sizes, universe);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->accesses, 2u);
  EXPECT_EQ(a->stats.misses, 2u);
  EXPECT_EQ(a->stats.hits, 0u);
  // Without steps each record is a pass of its own: one token at a time, 6 hits.
  auto b = replay(no_steps, cache_policy("lru"), "lru", 2 * 4096, sizes, universe);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->accesses, 8u);
  EXPECT_EQ(b->stats.hits, 6u);
}

TEST(Replay, APassNeedingMoreExpertsThanTheCacheRunsThemOneAtATime) {
  // The engine reads what fits ahead, then the rest one at a time, evicting experts it has used already.
  TraceRecord r;
  r.experts = {0, 1, 2};
  const auto seq = AccessSequence::from_trace({r, r});
  const auto sizes = ExpertSizes::uniform(4096);
  auto lru = replay(seq, cache_policy("lru"), "lru", 2 * 4096, sizes, universe_of(seq, sizes));
  ASSERT_TRUE(lru) << lru.error().message();
  // 0 and 1 fetched together, 2 evicts 0; then 1 and 2 hit (ready first) and 0 evicts 1.
  EXPECT_EQ(lru->stats.misses, 4u);
  EXPECT_EQ(lru->stats.hits, 2u);
  EXPECT_EQ(lru->stats.evictions, 2u);
  auto opt = belady(seq, 2, sizes);
  ASSERT_TRUE(opt) << opt.error().message();
  EXPECT_LE(opt->reads(), lru->reads());
}

TEST(Replay, LruOnACycleLongerThanTheCacheNeverHits) {
  std::vector<int> cyc;
  for (int i = 0; i < 50; ++i) {
    for (int e = 0; e < 5; ++e) cyc.push_back(e);
  }
  const auto seq = single_layer(cyc);
  const auto sizes = ExpertSizes::uniform(0);
  auto r = replay(seq, cache_policy("lru"), "lru", 4, sizes, universe_of(seq, sizes));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->stats.hits, 0u);
  EXPECT_EQ(r->stats.misses, cyc.size());
  auto opt = belady(seq, 4, sizes);
  ASSERT_TRUE(opt);
  EXPECT_GT(opt->stats.hits, 150u);  // OPT keeps 3 of 4 slots useful
}

TEST(Replay, LruEvictsTheLeastRecentlyUsed) {
  const auto seq = single_layer({0, 1, 0, 2, 0, 1});
  const auto sizes = ExpertSizes::uniform(4096);
  auto r = replay(seq, cache_policy("lru"), "lru", 2 * 4096, sizes, universe_of(seq, sizes));
  ASSERT_TRUE(r);
  // 0m 1m 0h 2m(evict 1) 0h 1m(evict 2)
  EXPECT_EQ(r->stats.hits, 2u);
  EXPECT_EQ(r->stats.misses, 4u);
  EXPECT_EQ(r->stats.bytes_read, 4u * 4096);
  EXPECT_EQ(r->per_layer.at(0).hits, 2u);
}

// A policy that names no victim while some could go is blamed, as the engine blames it, not the cache size.
TEST(Replay, APolicyNamingNoVictimIsBlamedNotTheBudget) {
  struct NoVictim : sdk::CachePolicy {
    void on_insert(ExpertKey, std::uint64_t) noexcept override {}
    void on_access(ExpertKey) noexcept override {}
    void on_erase(ExpertKey) noexcept override {}
    std::optional<ExpertKey> pick_victim(const sdk::EvictablePredicate&) noexcept override { return std::nullopt; }
    void clear() noexcept override {}
  };
  const auto seq = single_layer({0, 1, 2});
  const auto sizes = ExpertSizes::uniform(4096);
  auto r = replay(seq, std::make_shared<NoVictim>(), "novictim", 2 * 4096, sizes, universe_of(seq, sizes));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("the policy named no victim while 2 cached experts could be"), std::string::npos)
      << r.error().message();
  EXPECT_EQ(r.error().message().find("use a larger cache"), std::string::npos) << r.error().message();
}

TEST(Replay, ResidentWhenTheBudgetHoldsEveryExpert) {
  const auto seq = single_layer({0, 1, 2, 0});
  const auto sizes = ExpertSizes::uniform(4096);
  auto r = replay(seq, cache_policy("lru"), "lru", 3 * 4096, sizes, universe_of(seq, sizes));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stats.hits, 4u);
  EXPECT_EQ(r->stats.preload_loads, 3u);
}

// Property: on random multi-layer traces no policy misses less than the clairvoyant optimum.
TEST(Replay, PoliciesNeverBeatBelady) {
  std::mt19937 rng(7);
  for (int round = 0; round < 30; ++round) {
    const int layers = 1 + static_cast<int>(rng() % 3), experts = 4 + static_cast<int>(rng() % 12);
    const int k = 1 + static_cast<int>(rng() % 3);
    std::vector<TraceRecord> t;
    std::geometric_distribution<int> skew(0.25);
    // Rounds 3, 7, ... as prefill: 1 to 5 tokens per forward pass, records of a pass layer by layer (steps).
    const bool steps = round % 4 == 3;
    for (int pos = 0; pos < 200;) {
      const int tokens = steps ? 1 + static_cast<int>(rng() % 5) : 1;
      for (int l = 0; l < layers; ++l) {
        for (int i = 0; i < tokens; ++i) {
          TraceRecord r;
          r.position = pos + i;
          r.layer = l;
          r.step = steps ? pos : -1;
          while (static_cast<int>(r.experts.size()) < k) {
            const int e = round % 2 == 0 ? skew(rng) % experts : static_cast<int>(rng() % experts);
            if (std::find(r.experts.begin(), r.experts.end(), e) == r.experts.end()) r.experts.push_back(e);
          }
          t.push_back(r);
        }
      }
      pos += tokens;
    }
    const auto seq = AccessSequence::from_trace(t);
    const auto sizes = ExpertSizes::uniform(4096);
    const auto universe = universe_of(seq, sizes);
    for (std::uint64_t slots = 1; slots < universe.size(); slots += 2) {
      auto opt = belady(seq, slots, sizes);
      ASSERT_TRUE(opt) << opt.error().message();
      for (const char* name : {"lru", "frequency", "pinned"}) {
        auto r = replay(seq, cache_policy(name), name, slots * 4096, sizes, universe);
        ASSERT_TRUE(r) << name << ": " << r.error().message();
        EXPECT_GE(r->reads(), opt->reads()) << name << " round " << round << " slots " << slots;
        EXPECT_LE(r->hit_rate(), opt->hit_rate()) << name << " round " << round << " slots " << slots;
        EXPECT_EQ(r->stats.hits + r->stats.misses, seq.keys.size());
      }
    }
  }
}

}  // namespace
}  // namespace colibri::ab
