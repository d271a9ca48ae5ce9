#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "colibri/sdk/testing/cache_conformance.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"

using colibri::sdk::testing::CacheConformance;
using colibri::sdk::testing::CacheParam;

INSTANTIATE_TEST_SUITE_P(Frequency, CacheConformance,
                         ::testing::Values(CacheParam{FREQUENCY_PLUGIN_PATH, {}, "default"},
                                           CacheParam{FREQUENCY_PLUGIN_PATH, {{"half_life", "1"}}, "fast_decay"}),
                         colibri::sdk::testing::CacheParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;

const EvictablePredicate kAll{[](void*, ExpertKey) noexcept { return true; }, nullptr};

std::shared_ptr<CachePolicy> make(const std::map<std::string, std::string>& options) {
  auto lib = ct::LoadedPlugin::load(FREQUENCY_PLUGIN_PATH);
  if (!lib) return nullptr;
  auto p = (*lib)->create_as<CachePolicy>(options);
  return p ? *p : nullptr;
}

std::vector<std::uint32_t> drain_victims(CachePolicy& p) {
  std::vector<std::uint32_t> out;
  while (auto v = p.pick_victim(kAll)) {
    out.push_back(v->expert);
    p.on_erase(*v);
  }
  return out;
}

TEST(FrequencyPolicy, LeastFrequentlyUsedGoesFirst) {
  auto p = make({});
  ASSERT_NE(p, nullptr);
  for (std::uint32_t e = 0; e < 3; ++e) p->on_insert({0, e}, 1);
  for (int i = 0; i < 5; ++i) p->on_access({0, 0});  // 0: 5 uses, 1: 2, 2: none (its insert counts as one)
  for (int i = 0; i < 2; ++i) p->on_access({0, 1});
  EXPECT_EQ(drain_victims(*p), (std::vector<std::uint32_t>{2, 1, 0}));
}

TEST(FrequencyPolicy, TiesGoToTheLeastRecentlyUsed) {
  auto p = make({});
  ASSERT_NE(p, nullptr);
  p->on_insert({1, 0}, 1);
  p->on_insert({1, 1}, 1);
  p->on_insert({1, 2}, 1);
  p->on_access({1, 0});
  p->on_access({1, 1});
  p->on_access({1, 2});
  // With the default half-life the three scores are nearly equal but later accesses weigh a
  // little more; with no decay at all the tie-break alone would give the same order.
  EXPECT_EQ(drain_victims(*p), (std::vector<std::uint32_t>{0, 1, 2}));
}

TEST(FrequencyPolicy, OldPopularityDecays) {
  // Expert 0 was used 19 times long ago; expert 1 is used steadily now.
  for (const auto& [half_life, expected_first] :
       std::vector<std::pair<std::string, std::uint32_t>>{{"1000000", 1u}, {"10", 0u}}) {
    auto p = make({{"half_life", half_life}});
    ASSERT_NE(p, nullptr);
    p->on_insert({0, 0}, 1);
    for (int i = 0; i < 19; ++i) p->on_access({0, 0});
    p->on_insert({0, 1}, 1);
    for (int i = 0; i < 9; ++i) p->on_access({0, 1});
    p->on_insert({0, 2}, 1);  // busy elsewhere for a while
    for (int i = 0; i < 200; ++i) p->on_access({0, 2});
    auto v = p->pick_victim(EvictablePredicate{[](void*, ExpertKey k) noexcept { return k.expert != 2; }, nullptr});
    ASSERT_TRUE(v);
    // Without decay 0 (19 uses) beats 1 (9 uses); with a short half-life 0's uses are older.
    EXPECT_EQ(v->expert, expected_first) << "half_life " << half_life;
  }
}

TEST(FrequencyPolicy, SurvivesVeryLongRunsWithFastDecay) {
  auto p = make({{"half_life", "1"}});
  ASSERT_NE(p, nullptr);
  for (std::uint32_t e = 0; e < 4; ++e) p->on_insert({2, e}, 1);
  for (int i = 0; i < 5000; ++i) p->on_access({2, static_cast<std::uint32_t>(i % 3)});  // 3 never used again
  auto v = p->pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->expert, 3u);
  // The most recent accesses dominate: 4999 % 3 == 1 was used last.
  EXPECT_EQ(drain_victims(*p), (std::vector<std::uint32_t>{3, 2, 0, 1}));
}

// A cache of `slots` driven the way the expert manager drives it: each use of a missing expert evicts the lowest
// ranked entry (never one of the step's own experts), inserts it and uses it. Returns the hits.
int run_cache(CachePolicy& p, std::size_t slots, const std::vector<std::vector<ExpertKey>>& steps) {
  std::set<std::uint64_t> resident;
  int hits = 0;
  for (const auto& step : steps) {
    struct Ctx {
      const std::set<std::uint64_t>* resident;
      const std::vector<ExpertKey>* step;
    } ctx{&resident, &step};
    const EvictablePredicate not_in_step{[](void* c, ExpertKey k) noexcept {
                                           const auto* x = static_cast<Ctx*>(c);
                                           return x->resident->count(k.packed()) != 0 &&
                                                  std::find(x->step->begin(), x->step->end(), k) == x->step->end();
                                         },
                                         &ctx};
    for (const ExpertKey k : step) {
      if (resident.count(k.packed()) != 0) {
        ++hits;
        p.on_access(k);
        continue;
      }
      while (resident.size() >= slots) {
        const auto v = p.pick_victim(not_in_step);
        if (!v) return -1;
        resident.erase(v->packed());
        p.on_erase(*v);
      }
      resident.insert(k.packed());
      p.on_insert(k, 1);
      p.on_access(k);
    }
  }
  return hits;
}

// Decode when the cache holds fewer experts than a token walks through: 8 layers of 8 experts, 2 per layer and
// token (seeded, uniform), 10 slots. Each expert is evicted before its layer comes round again, so a score kept only
// while resident is always one use (LRU order, no hit at all); remembered scores keep the most used in the cache.
TEST(FrequencyPolicy, RememberedScoresHitOnACyclicWalkLargerThanTheCache) {
  std::mt19937 rng(7);
  std::vector<std::vector<ExpertKey>> steps;
  for (int token = 0; token < 400; ++token) {
    for (std::uint32_t layer = 0; layer < 8; ++layer) {
      const auto a = static_cast<std::uint32_t>(rng() % 8);
      auto b = static_cast<std::uint32_t>(rng() % 7);
      if (b >= a) ++b;
      steps.push_back({{layer, a}, {layer, b}});
    }
  }
  auto remembering = make({});
  auto forgetting = make({{"history", "false"}});
  ASSERT_NE(remembering, nullptr);
  ASSERT_NE(forgetting, nullptr);
  const int with_history = run_cache(*remembering, 10, steps);
  const int without = run_cache(*forgetting, 10, steps);
  EXPECT_EQ(without, 0);
  // 8 of 64 experts held steadily would hit 1/8 of 6400 uses (800); ask for well over half of that.
  EXPECT_GT(with_history, 500) << "hits with remembered scores";
}

// A prefetch that is never used must not count as a use: five unused inserts of 0 leave it below 1 (two uses).
TEST(FrequencyPolicy, AnInsertThatIsNeverUsedLeavesNoScore) {
  auto p = make({{"half_life", "1000000"}});
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 5; ++i) {
    p->on_insert({0, 0}, 1);
    p->on_erase({0, 0});
  }
  p->on_insert({0, 1}, 1);
  p->on_access({0, 1});
  p->on_access({0, 1});
  p->on_insert({0, 0}, 1);
  p->on_access({0, 0});
  auto v = p->pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->expert, 0u);
}

// Until it is used, a fresh insert ranks like a use now: a prefetch is not the victim ahead of an expert whose only
// use is long past, and once used it does not count twice.
TEST(FrequencyPolicy, AnInsertRanksAsOneUseUntilItIsUsed) {
  auto p = make({{"half_life", "10"}});
  ASSERT_NE(p, nullptr);
  p->on_insert({0, 0}, 1);
  p->on_access({0, 0});  // one use, soon long past
  p->on_insert({0, 1}, 1);
  for (int i = 0; i < 100; ++i) p->on_access({0, 1});
  p->on_insert({0, 2}, 1);  // a prefetch, not used yet
  auto older = p->pick_victim(EvictablePredicate{[](void*, ExpertKey k) noexcept { return k.expert != 1; }, nullptr});
  ASSERT_TRUE(older);
  EXPECT_EQ(older->expert, 0u);
  // Its first use takes the credit over instead of adding to it: an expert read twice for two uses (each a miss:
  // insert, then use) ranks below one read once and hit three times (counting inserts too would make it 4 to 4).
  auto q = make({{"half_life", "1000000"}});
  ASSERT_NE(q, nullptr);
  q->on_insert({0, 3}, 1);
  for (int i = 0; i < 3; ++i) q->on_access({0, 3});
  for (int i = 0; i < 2; ++i) {
    q->on_insert({0, 2}, 1);
    q->on_access({0, 2});
    if (i == 0) q->on_erase({0, 2});
  }
  auto v = q->pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->expert, 2u);
}

// half_life auto follows the number of experts: with 400 experts each used 5 times after one expert's 40 uses, a
// fixed half-life of 100 uses has forgotten those 40 uses, auto (8 uses per expert: 3200) still ranks them first.
TEST(FrequencyPolicy, AutoHalfLifeGrowsWithTheNumberOfExperts) {
  for (const auto& [half_life, expected_victim] :
       std::vector<std::pair<std::string, std::uint32_t>>{{"auto", 1u}, {"100", 0u}}) {
    auto p = make({{"half_life", half_life}});
    ASSERT_NE(p, nullptr);
    p->on_insert({0, 0}, 1);
    for (int i = 0; i < 40; ++i) p->on_access({0, 0});
    for (std::uint32_t e = 1; e <= 400; ++e) p->on_insert({1, e}, 1);
    for (int round = 0; round < 5; ++round) {
      for (std::uint32_t e = 1; e <= 400; ++e) p->on_access({1, e});
    }
    auto v = p->pick_victim(EvictablePredicate{
        [](void*, ExpertKey k) noexcept { return (k.layer == 0 && k.expert == 0) || (k.layer == 1 && k.expert == 1); },
        nullptr});
    ASSERT_TRUE(v);
    EXPECT_EQ(v->layer, expected_victim) << "half_life " << half_life;
  }
}

TEST(FrequencyPolicy, HalfLifeMustBePositive) {
  auto lib = ct::LoadedPlugin::load(FREQUENCY_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto p = (*lib)->create({{"half_life", "0"}});
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("cache.half_life"), std::string::npos);
}

}  // namespace
