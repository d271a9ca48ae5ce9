// CacheSim must follow the expert manager's rules: both driven with the same accesses give the same hit/miss sequence.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <map>
#include <random>

#include "colibri/ab/replay.hpp"
#include "colibri/engine/expert_manager.hpp"
#include "colibri/registry/registry.hpp"
#include "colibri/util/host_info.hpp"
#include "support/memory_experts.hpp"

namespace colibri::ab {
namespace {

// A model of `layers` x `experts` blobs of 5000 bytes (slots round to 8192, as in the manager).
struct FakeModel {
  model::Manifest manifest;
  std::shared_ptr<testing::MemoryStorage> storage = std::make_shared<testing::MemoryStorage>();
  FakeModel(int layers, int experts) { testing::add_memory_experts(manifest, *storage, layers, experts, 5000, ""); }
  // Layer 1's blobs get `bytes` instead (two expert sizes, as when some layers use a bigger format).
  void resize_layer1(std::uint64_t bytes) {
    for (auto& e : manifest.experts) {
      if (e.layer != 1) continue;
      e.size = bytes;
      storage->files["/m/" + e.file].resize(bytes);
    }
  }
};

std::shared_ptr<sdk::CachePolicy> policy(const std::string& name) {
  static const auto reg = registry::PluginRegistry::scan({{COLIBRI_TEST_PLUGIN_DIR, "build"}}, util::host_info());
  const auto* info = reg.find(sdk::PluginKind::cache, name);
  if (info == nullptr) return nullptr;
  auto p = reg.create_as<sdk::CachePolicy>(*info, sdk::ConfigView{});
  return p ? *p : nullptr;
}

void expect_same_sequences(bool two_sizes) {
  const int layers = 3, experts = 10, k = 2;
  FakeModel fm(layers, experts);
  if (two_sizes) fm.resize_layer1(12000);
  const auto sizes = ExpertSizes::from_manifest(fm.manifest);
  std::vector<sdk::ExpertKey> universe;
  for (const auto& e : fm.manifest.experts) {
    universe.push_back({static_cast<std::uint32_t>(e.layer), static_cast<std::uint32_t>(e.expert)});
  }
  std::mt19937 rng(3);
  std::geometric_distribution<int> skew(0.3);
  for (const char* name : {"lru", "frequency", "pinned"}) {
    for (std::uint64_t slots : {2u, 3u, 5u, 9u, 30u}) {
      const std::uint64_t budget = slots * (two_sizes ? 12288 : 8192);
      auto p1 = policy(name), p2 = policy(name);
      ASSERT_TRUE(p1 && p2) << name;
      engine::ExpertManager manager(fm.manifest, "/m", fm.storage, p1, budget);
      CacheSim sim(p2, budget, sizes, universe);
      ASSERT_EQ(manager.resident(), sim.resident());
      ASSERT_TRUE(manager.preload());
      ASSERT_TRUE(sim.preload());
      std::string want, got;
      for (int step = 0; step < 400; ++step) {
        const auto layer = static_cast<std::uint32_t>(step % layers);
        std::vector<std::uint32_t> picked;
        while (static_cast<int>(picked.size()) < k) {
          const auto e = static_cast<std::uint32_t>(skew(rng) % experts);
          if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
        }
        for (auto e : picked) {
          const auto misses = manager.stats().misses;
          ASSERT_TRUE(manager.acquire(layer, e));
          want += manager.stats().misses > misses ? 'm' : 'h';
          auto hit = sim.acquire({layer, e});
          ASSERT_TRUE(hit) << hit.error().message();
          got += *hit ? 'h' : 'm';
        }
        for (auto e : picked) {
          manager.release(layer, e);
          sim.release({layer, e});
        }
      }
      EXPECT_EQ(got, want) << name << " with " << slots << " slots" << (two_sizes ? ", two expert sizes" : "");
      EXPECT_EQ(sim.stats().misses, manager.stats().misses);
      EXPECT_EQ(sim.stats().evictions, manager.stats().evictions);
      EXPECT_EQ(sim.stats().bytes_read, manager.stats().bytes_read);
      if (slots >= 5) {
        EXPECT_NE(want.find('h'), std::string::npos);
      }
      if (slots < 30) {
        EXPECT_GT(manager.stats().evictions, 0u);
      }
    }
  }
}

TEST(Equivalence, SameHitMissSequenceAsTheExpertManager) {
  expect_same_sequences(false);
}

TEST(Equivalence, SameHitMissSequenceWithTwoExpertSizes) {
  expect_same_sequences(true);
}

}  // namespace
}  // namespace colibri::ab
