// CacheSim must follow the expert manager's rules: the manager driven as the engine drives it and replay_group
// driven with the same passes give the same hit/miss sequence.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <map>
#include <random>

#include "colibri/ab/replay.hpp"
#include "colibri/engine/expert_manager.hpp"
#include "support/memory_experts.hpp"
#include "unit/ab/cache_policies.hpp"

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

using testing::cache_policy;

// Drives the manager as Engine::moe runs one sparse layer of one forward pass (prefetch off): the misses are
// fetched together, then each expert is acquired and released in turn, those ready first, in ascending id.
std::string run_layer_like_the_engine(engine::ExpertManager& manager, std::uint32_t layer,
                                      const std::vector<sdk::ExpertKey>& needed, std::uint64_t& fetched) {
  fetched += manager.fetch(needed);
  std::vector<std::uint32_t> order;
  for (auto k : needed) {
    if (manager.ready(layer, k.expert)) order.push_back(k.expert);
  }
  for (auto k : needed) {
    if (!manager.ready(layer, k.expert)) order.push_back(k.expert);
  }
  std::string got;
  for (auto e : order) {
    const auto misses = manager.stats().misses;
    auto w = manager.acquire(layer, e);
    if (!w) return "error: " + w.error().message();
    got += manager.stats().misses > misses ? 'm' : 'h';
    manager.release(layer, e);
  }
  return got;
}

// `max_group`: distinct experts per layer and pass, 1 to this many (1: decode of one stream, more: prefill chunks
// and batches, up to more than the smallest caches hold).
void expect_same_sequences(bool two_sizes, int max_group) {
  const int layers = 3, experts = 10;
  FakeModel fm(layers, experts);
  fm.storage->async = true;  // as every storage plugin: the manager fetches a layer's misses together
  if (two_sizes) fm.resize_layer1(12000);
  const auto sizes = ExpertSizes::from_manifest(fm.manifest);
  std::vector<sdk::ExpertKey> universe;
  for (const auto& e : fm.manifest.experts) {
    universe.push_back({static_cast<std::uint32_t>(e.layer), static_cast<std::uint32_t>(e.expert)});
  }
  std::mt19937 rng(3);
  std::geometric_distribution<int> skew(0.3);
  for (const char* name : {"lru", "frequency", "pinned"}) {
    for (std::uint64_t slots : {1u, 2u, 3u, 5u, 9u, 30u}) {
      const std::uint64_t budget = slots * (two_sizes ? 12288 : 8192);
      auto p1 = cache_policy(name), p2 = cache_policy(name);
      ASSERT_TRUE(p1 && p2) << name;
      engine::ExpertManager manager(fm.manifest, "/m", fm.storage, p1, budget);
      CacheSim sim(p2, budget, sizes, universe);
      ASSERT_EQ(manager.resident(), sim.resident());
      ASSERT_TRUE(manager.preload());
      ASSERT_TRUE(sim.preload());
      std::string want, got;
      std::uint64_t fetched = 0;
      for (int step = 0; step < 400; ++step) {
        const auto layer = static_cast<std::uint32_t>(step % layers);
        const int n = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_group));
        std::vector<sdk::ExpertKey> needed;
        while (static_cast<int>(needed.size()) < n) {
          const sdk::ExpertKey k{layer, static_cast<std::uint32_t>(skew(rng) % experts)};
          if (std::find(needed.begin(), needed.end(), k) == needed.end()) needed.push_back(k);
        }
        std::sort(needed.begin(), needed.end());
        want += run_layer_like_the_engine(manager, layer, needed, fetched) + '|';
        auto s = replay_group(sim, needed, [&](sdk::ExpertKey, bool hit) { got += hit ? 'h' : 'm'; });
        ASSERT_TRUE(s) << s.message();
        got += '|';
      }
      const std::string what = std::string(name) + " with " + std::to_string(slots) + " slots" +
                               (two_sizes ? ", two expert sizes" : "") + ", groups up to " + std::to_string(max_group);
      EXPECT_EQ(got, want) << what;
      EXPECT_EQ(sim.stats().misses, manager.stats().misses) << what;
      EXPECT_EQ(sim.stats().evictions, manager.stats().evictions) << what;
      EXPECT_EQ(sim.stats().bytes_read, manager.stats().bytes_read) << what;
      if (slots >= 5) {
        EXPECT_NE(want.find('h'), std::string::npos) << what;
      }
      if (slots < 30) {
        EXPECT_GT(manager.stats().evictions, 0u) << what;
      }
      if (!manager.resident()) {
        EXPECT_GT(fetched, 0u) << what;  // the engine's way of reading was exercised
      }
    }
  }
}

TEST(Equivalence, SameHitMissSequenceAsTheExpertManager) {
  expect_same_sequences(false, 2);
}

TEST(Equivalence, SameHitMissSequenceWithTwoExpertSizes) {
  expect_same_sequences(true, 2);
}

// Prefill chunks and batches: up to 6 distinct experts per layer and pass, more than caches of 1 to 5 slots hold,
// so the manager's fetch stops early and the rest come one at a time.
TEST(Equivalence, SameHitMissSequenceWhenAPassNeedsMoreExpertsThanTheCacheHolds) {
  expect_same_sequences(false, 6);
  expect_same_sequences(true, 6);
}

}  // namespace
}  // namespace colibri::ab
