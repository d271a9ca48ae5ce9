#include "colibri/ab/replay.hpp"

#include <gtest/gtest.h>

#include <random>

#include "colibri/registry/registry.hpp"
#include "colibri/util/host_info.hpp"

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

const registry::PluginRegistry& plugins() {
  static const auto reg = registry::PluginRegistry::scan({{COLIBRI_TEST_PLUGIN_DIR, "build"}}, util::host_info());
  return reg;
}

std::shared_ptr<sdk::CachePolicy> policy(const std::string& name) {
  const auto* info = plugins().find(sdk::PluginKind::cache, name);
  if (info == nullptr) {
    ADD_FAILURE() << "plugin " << name << " not built in " << COLIBRI_TEST_PLUGIN_DIR;
    return nullptr;
  }
  auto p = plugins().create_as<sdk::CachePolicy>(*info, sdk::ConfigView{});
  EXPECT_TRUE(p) << p.error().message();
  return p ? *p : nullptr;
}

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

TEST(Belady, ExpertsOfOneRecordStayTogether) {
  TraceRecord a, b;
  a.experts = {0, 1};
  b.experts = {2, 3, 4};
  auto seq = AccessSequence::from_trace({a, b});
  auto r = belady(seq, 2, ExpertSizes::uniform(0));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("record 2"), std::string::npos) << r.error().message();
}

TEST(Replay, LruOnACycleLongerThanTheCacheNeverHits) {
  std::vector<int> cyc;
  for (int i = 0; i < 50; ++i) {
    for (int e = 0; e < 5; ++e) cyc.push_back(e);
  }
  const auto seq = single_layer(cyc);
  const auto sizes = ExpertSizes::uniform(0);
  auto r = replay(seq, policy("lru"), "lru", 4, sizes, universe_of(seq, sizes));
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
  auto r = replay(seq, policy("lru"), "lru", 2 * 4096, sizes, universe_of(seq, sizes));
  ASSERT_TRUE(r);
  // 0m 1m 0h 2m(evict 1) 0h 1m(evict 2)
  EXPECT_EQ(r->stats.hits, 2u);
  EXPECT_EQ(r->stats.misses, 4u);
  EXPECT_EQ(r->stats.bytes_read, 4u * 4096);
  EXPECT_EQ(r->per_layer.at(0).hits, 2u);
}

TEST(Replay, ResidentWhenTheBudgetHoldsEveryExpert) {
  const auto seq = single_layer({0, 1, 2, 0});
  const auto sizes = ExpertSizes::uniform(4096);
  auto r = replay(seq, policy("lru"), "lru", 3 * 4096, sizes, universe_of(seq, sizes));
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
    for (int pos = 0; pos < 200; ++pos) {
      for (int l = 0; l < layers; ++l) {
        TraceRecord r;
        r.position = pos;
        r.layer = l;
        while (static_cast<int>(r.experts.size()) < k) {
          const int e = round % 2 == 0 ? skew(rng) % experts : static_cast<int>(rng() % experts);
          if (std::find(r.experts.begin(), r.experts.end(), e) == r.experts.end()) r.experts.push_back(e);
        }
        t.push_back(r);
      }
    }
    const auto seq = AccessSequence::from_trace(t);
    const auto sizes = ExpertSizes::uniform(4096);
    const auto universe = universe_of(seq, sizes);
    for (std::uint64_t slots = static_cast<std::uint64_t>(k); slots < universe.size(); slots += 2) {
      auto opt = belady(seq, slots, sizes);
      ASSERT_TRUE(opt) << opt.error().message();
      for (const char* name : {"lru", "frequency", "pinned"}) {
        auto r = replay(seq, policy(name), name, slots * 4096, sizes, universe);
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
