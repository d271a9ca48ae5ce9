#include <gtest/gtest.h>

#include "colibri/sdk/testing/cache_conformance.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"

using colibri::sdk::testing::CacheConformance;
using colibri::sdk::testing::CacheParam;

INSTANTIATE_TEST_SUITE_P(Lru, CacheConformance, ::testing::Values(CacheParam{LRU_PLUGIN_PATH, {}, "default"}),
                         colibri::sdk::testing::CacheParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;

std::shared_ptr<CachePolicy> make_lru() {
  auto lib = ct::LoadedPlugin::load(LRU_PLUGIN_PATH);
  if (!lib) return nullptr;
  auto p = (*lib)->create_as<CachePolicy>({});
  return p ? *p : nullptr;
}

const EvictablePredicate kAll{[](void*, ExpertKey) noexcept { return true; }, nullptr};

TEST(LruPolicy, EvictsLeastRecentlyUsedFirst) {
  auto lru = make_lru();
  ASSERT_NE(lru, nullptr);
  lru->on_insert({0, 1}, 1);
  lru->on_insert({0, 2}, 1);
  lru->on_insert({0, 3}, 1);
  lru->on_access({0, 1});  // order now (old -> new): 2, 3, 1
  auto v = lru->pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{0, 2}));
  lru->on_erase(*v);
  v = lru->pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{0, 3}));
  lru->on_erase(*v);
  v = lru->pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{0, 1}));
}

TEST(LruPolicy, SkipsInUseEntriesButKeepsTheirRecency) {
  auto lru = make_lru();
  ASSERT_NE(lru, nullptr);
  for (std::uint32_t e = 0; e < 3; ++e) lru->on_insert({1, e}, 1);
  EvictablePredicate not_first{[](void*, ExpertKey k) noexcept { return k.expert != 0; }, nullptr};
  auto v = lru->pick_victim(not_first);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{1, 1}));
  v = lru->pick_victim(kAll);  // expert 0 is still the oldest
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{1, 0}));
}

}  // namespace
