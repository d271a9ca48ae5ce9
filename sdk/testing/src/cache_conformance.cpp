#include "colibri/sdk/testing/cache_conformance.hpp"

#include <filesystem>
#include <random>
#include <set>

#include "colibri/sdk/testing/plugin_loader.hpp"

namespace colibri::sdk::testing {

int cache_conformance_anchor() {
  return 1;
}

std::string CacheParamName(const ::testing::TestParamInfo<CacheParam>& info) {
  std::string n = std::filesystem::path(info.param.library).stem().string() + "_" + info.param.label;
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

namespace {

std::shared_ptr<CachePolicy> make_policy(const CacheParam& p, std::string& error) {
  auto lib = LoadedPlugin::load(p.library);
  if (!lib) {
    error = lib.error().to_string();
    return nullptr;
  }
  auto pol = (*lib)->create_as<CachePolicy>(p.options);
  if (!pol) {
    error = pol.error().to_string();
    return nullptr;
  }
  return *pol;
}

// The core's side of the contract: which entries are resident and which are evictable.
struct Residency {
  std::set<std::uint64_t> resident;
  std::set<std::uint64_t> in_use;
  std::set<std::uint64_t> pinned;
  EvictablePredicate predicate() {
    return EvictablePredicate{[](void* ctx, ExpertKey k) noexcept {
                                auto* self = static_cast<Residency*>(ctx);
                                return self->resident.count(k.packed()) && !self->in_use.count(k.packed()) &&
                                       !self->pinned.count(k.packed());
                              },
                              this};
  }
};

#define CACHE_FIXTURE(p)                   \
  std::string error;                       \
  auto p = make_policy(GetParam(), error); \
  ASSERT_TRUE(error.empty()) << error;     \
  ASSERT_NE(p, nullptr)

}  // namespace

TEST_P(CacheConformance, DescriptorIsCache) {
  auto lib = LoadedPlugin::load(GetParam().library);
  ASSERT_TRUE(lib) << lib.error().to_string();
  EXPECT_EQ((*lib)->descriptor().kind, PluginKind::cache);
}

TEST_P(CacheConformance, EmptyPolicyHasNoVictim) {
  CACHE_FIXTURE(policy);
  Residency r;
  EXPECT_FALSE(policy->pick_victim(r.predicate()).has_value());
}

TEST_P(CacheConformance, VictimIsAResidentEvictableEntry) {
  CACHE_FIXTURE(policy);
  Residency r;
  for (std::uint32_t e = 0; e < 8; ++e) {
    policy->on_insert({1, e}, 1000);
    r.resident.insert(ExpertKey{1, e}.packed());
  }
  auto v = policy->pick_victim(r.predicate());
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(r.resident.count(v->packed()));
}

TEST_P(CacheConformance, NeverPicksWhatThePredicateRefuses) {
  CACHE_FIXTURE(policy);
  Residency r;
  for (std::uint32_t e = 0; e < 6; ++e) {
    policy->on_insert({0, e}, 1);
    r.resident.insert(ExpertKey{0, e}.packed());
  }
  for (std::uint32_t e = 0; e < 5; ++e) r.in_use.insert(ExpertKey{0, e}.packed());
  auto v = policy->pick_victim(r.predicate());
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, (ExpertKey{0, 5}));
  r.in_use.insert(ExpertKey{0, 5}.packed());
  EXPECT_FALSE(policy->pick_victim(r.predicate()).has_value()) << "every entry is in use";
}

TEST_P(CacheConformance, PinnedEntriesAreNeverVictims) {
  CACHE_FIXTURE(policy);
  Residency r;
  for (std::uint32_t e = 0; e < 4; ++e) {
    policy->on_insert({2, e}, 1);
    r.resident.insert(ExpertKey{2, e}.packed());
  }
  for (std::uint32_t e = 0; e < 3; ++e) policy->on_pin({2, e}, true);
  // Even a predicate that accepts everything must not get a pinned entry from the policy.
  EvictablePredicate all{[](void*, ExpertKey) noexcept { return true; }, nullptr};
  auto v = policy->pick_victim(all);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, (ExpertKey{2, 3}));
  policy->on_pin({2, 0}, false);
  policy->on_erase({2, 3});
  v = policy->pick_victim(all);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, (ExpertKey{2, 0}));
}

TEST_P(CacheConformance, ErasedEntriesAreForgotten) {
  CACHE_FIXTURE(policy);
  Residency r;
  policy->on_insert({0, 1}, 1);
  policy->on_insert({0, 2}, 1);
  r.resident = {ExpertKey{0, 1}.packed(), ExpertKey{0, 2}.packed()};
  policy->on_erase({0, 1});
  r.resident.erase(ExpertKey{0, 1}.packed());
  EvictablePredicate all{[](void*, ExpertKey) noexcept { return true; }, nullptr};
  auto v = policy->pick_victim(all);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, (ExpertKey{0, 2}));
  policy->on_erase({0, 2});
  EXPECT_FALSE(policy->pick_victim(all).has_value());
  policy->on_erase({9, 9});   // erasing an unknown key is harmless
  policy->on_access({9, 9});  // so is touching one
  EXPECT_FALSE(policy->pick_victim(all).has_value());
}

TEST_P(CacheConformance, ClearForgetsEverything) {
  CACHE_FIXTURE(policy);
  for (std::uint32_t e = 0; e < 10; ++e) policy->on_insert({e, e}, 1);
  policy->clear();
  EvictablePredicate all{[](void*, ExpertKey) noexcept { return true; }, nullptr};
  EXPECT_FALSE(policy->pick_victim(all).has_value());
  policy->on_insert({3, 3}, 1);
  auto v = policy->pick_victim(all);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, (ExpertKey{3, 3}));
}

// A simulated cache driven by random accesses: the policy's victims must always be resident,
// unpinned and unused, and the cache never needs more slots than it has.
TEST_P(CacheConformance, RandomWorkloadKeepsInvariants) {
  CACHE_FIXTURE(policy);
  Residency r;
  constexpr std::size_t kSlots = 12;
  std::mt19937 rng(42);
  std::size_t hits = 0;
  for (std::uint32_t e = 0; e < 2; ++e) {
    policy->on_insert({0, e}, 1);
    policy->on_pin({0, e}, true);
    r.resident.insert(ExpertKey{0, e}.packed());
    r.pinned.insert(ExpertKey{0, e}.packed());
  }
  for (int step = 0; step < 20000; ++step) {
    // Skewed access: a few hot experts, a long tail.
    const auto layer = static_cast<std::uint32_t>(rng() % 4);
    const auto expert = static_cast<std::uint32_t>((rng() % 4 == 0) ? rng() % 64 : rng() % 6);
    const ExpertKey k{layer, expert};
    r.in_use.clear();
    if (rng() % 5 == 0) {
      r.in_use.insert(ExpertKey{static_cast<std::uint32_t>(rng() % 4), static_cast<std::uint32_t>(rng() % 6)}.packed());
    }
    if (r.resident.count(k.packed())) {
      ++hits;
      policy->on_access(k);
      continue;
    }
    while (r.resident.size() >= kSlots) {
      auto v = policy->pick_victim(r.predicate());
      ASSERT_TRUE(v.has_value()) << "no victim although " << r.resident.size() << " entries are resident";
      ASSERT_TRUE(r.resident.count(v->packed())) << "victim is not resident";
      ASSERT_FALSE(r.pinned.count(v->packed())) << "victim is pinned";
      ASSERT_FALSE(r.in_use.count(v->packed())) << "victim is in use";
      r.resident.erase(v->packed());
      policy->on_erase(*v);
    }
    r.resident.insert(k.packed());
    policy->on_insert(k, 1);
    policy->on_access(k);  // the miss was read for this use
  }
  EXPECT_GT(hits, 0u);
  for (auto p : r.pinned) EXPECT_TRUE(r.resident.count(p)) << "a pinned entry left the cache";
}

// ---- Added with the pinned / frequency policies ----

TEST_P(CacheConformance, VictimsAreDistinctUntilNoneIsLeft) {
  CACHE_FIXTURE(policy);
  Residency r;
  for (std::uint32_t l = 0; l < 5; ++l) {
    for (std::uint32_t e = 0; e < 10; ++e) {
      policy->on_insert({l, e}, 1);
      r.resident.insert(ExpertKey{l, e}.packed());
    }
  }
  for (int i = 0; i < 100; ++i)
    policy->on_access({static_cast<std::uint32_t>(i % 5), static_cast<std::uint32_t>(i % 7)});
  std::set<std::uint64_t> seen;
  while (auto v = policy->pick_victim(r.predicate())) {
    ASSERT_TRUE(r.resident.count(v->packed())) << "victim " << v->layer << ":" << v->expert << " is not resident";
    ASSERT_TRUE(seen.insert(v->packed()).second) << "victim offered twice";
    r.resident.erase(v->packed());
    policy->on_erase(*v);
  }
  EXPECT_EQ(seen.size(), 50u) << "some entries could never be evicted";
}

TEST_P(CacheConformance, ReinsertedEntryIsTrackedAgain) {
  CACHE_FIXTURE(policy);
  EvictablePredicate all{[](void*, ExpertKey) noexcept { return true; }, nullptr};
  policy->on_insert({4, 4}, 1);
  policy->on_pin({4, 4}, true);
  policy->on_erase({4, 4});  // leaving the cache drops its pin too
  EXPECT_FALSE(policy->pick_victim(all).has_value());
  policy->on_insert({4, 4}, 1);
  auto v = policy->pick_victim(all);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, (ExpertKey{4, 4}));
}

TEST_P(CacheConformance, AccessDoesNotUnpin) {
  CACHE_FIXTURE(policy);
  EvictablePredicate all{[](void*, ExpertKey) noexcept { return true; }, nullptr};
  policy->on_insert({1, 1}, 1);
  policy->on_pin({1, 1}, true);
  for (int i = 0; i < 10; ++i) policy->on_access({1, 1});
  EXPECT_FALSE(policy->pick_victim(all).has_value());
  policy->on_pin({1, 1}, false);
  EXPECT_TRUE(policy->pick_victim(all).has_value());
}

TEST_P(CacheConformance, WantedPinsAreStableAndUnique) {
  CACHE_FIXTURE(policy);
  const auto a = policy->wanted_pins();
  policy->on_insert({0, 0}, 1);
  policy->clear();
  const auto b = policy->wanted_pins();
  EXPECT_EQ(a, b) << "wanted_pins() changed with the cache's contents";
  std::set<std::uint64_t> unique;
  for (auto k : a) EXPECT_TRUE(unique.insert(k.packed()).second) << k.layer << ":" << k.expert << " listed twice";
}

}  // namespace colibri::sdk::testing
