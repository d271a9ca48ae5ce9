#include <gtest/gtest.h>

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
  for (int i = 0; i < 5; ++i) p->on_access({0, 0});  // 0: 6 uses, 1: 3, 2: 1
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
  // Expert 0 was used 20 times long ago; expert 1 is used steadily now.
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
    // Without decay 0 (20 uses) beats 1 (10 uses); with a short half-life 0's uses are older.
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

TEST(FrequencyPolicy, HalfLifeMustBePositive) {
  auto lib = ct::LoadedPlugin::load(FREQUENCY_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto p = (*lib)->create({{"half_life", "0"}});
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("cache.half_life"), std::string::npos);
}

}  // namespace
