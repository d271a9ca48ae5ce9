#include "colibri/engine/expert_manager.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <sstream>

#include "support/device_compute.hpp"
#include "support/memory_experts.hpp"

namespace colibri::engine {
namespace {

using sdk::ExpertKey;

using testing::DeviceCompute;
using testing::ListPolicy;
using testing::MemoryStorage;

constexpr std::uint64_t kBlob = 4096;

struct Fixture : testing::MemoryExpertSet<> {
  Fixture(int layers, int experts) : MemoryExpertSet(layers, experts, kBlob) {}
};

TEST(ExpertManager, ResidentWhenTheBudgetHoldsEverything) {
  Fixture f(2, 3);
  auto m = f.manager(6 * kBlob);
  EXPECT_TRUE(m.resident());
  ASSERT_TRUE(m.preload());
  EXPECT_EQ(f.storage->reads, 6);
  auto w = m.acquire(1, 2);
  ASSERT_TRUE(w);
  EXPECT_EQ(static_cast<const std::uint8_t*>(w->up.data)[0], 16 + 2);
  EXPECT_EQ(w->gate.ne[0], 32);
  EXPECT_EQ(w->gate.ne[1], 8);
  m.release(1, 2);
  EXPECT_EQ(m.stats().hits, 1u);
  EXPECT_EQ(m.stats().misses, 0u);
  EXPECT_EQ(f.storage->reads, 6);
}

TEST(ExpertManager, EvictsThroughThePolicyButNeverAnExpertInUse) {
  Fixture f(1, 4);
  auto m = f.manager(2 * kBlob);
  EXPECT_FALSE(m.resident());
  ASSERT_TRUE(m.preload());
  ASSERT_TRUE(m.acquire(0, 0));  // held
  ASSERT_TRUE(m.acquire(0, 1));
  m.release(0, 1);
  ASSERT_TRUE(m.acquire(0, 2));  // evicts 1, the only evictable one
  EXPECT_EQ(m.stats().evictions, 1u);
  EXPECT_EQ(std::count(f.policy->order.begin(), f.policy->order.end(), ExpertKey{0, 1}), 0);
  auto full = m.acquire(0, 3);  // 0 and 2 are both in use
  ASSERT_FALSE(full);
  EXPECT_NE(full.error().message().find("expert_cache"), std::string::npos);
  m.release(0, 0);
  ASSERT_TRUE(m.acquire(0, 3));
  EXPECT_EQ(m.stats().misses, 4u);
  EXPECT_LE(m.resident_bytes(), 2 * kBlob);
}

TEST(ExpertManager, StreamingSlotsFitEveryExpertSoBuffersAreReused) {
  // Two expert sizes, as when some layers' down projections use a bigger format: with one size per slot an evicted
  // buffer always fits the next expert, so a long cyclic run maps no new buffers after the first fill.
  Fixture f(2, 4);
  for (auto& e : f.manifest.experts) {
    if (e.layer == 1) {
      e.size = 3 * kBlob;
      f.storage->files["/m/" + e.file].resize(e.size);
    }
  }
  const std::uint64_t budget = 3 * (3 * kBlob);
  ExpertManager m(f.manifest, "/m", f.storage, f.policy, budget);
  ASSERT_FALSE(m.resident());
  ASSERT_TRUE(m.preload());
  EXPECT_EQ(m.stats().buffers_mapped, 3u) << "streaming slots are mapped at load";
  for (int round = 0; round < 6; ++round) {
    for (int l = 0; l < 2; ++l) {
      for (int e = 0; e < 4; ++e) {
        auto w = m.acquire(l, e);
        ASSERT_TRUE(w) << w.error().message();
        EXPECT_EQ(static_cast<const std::uint8_t*>(w->gate.data)[0], l * 16 + e);
        m.release(l, e);
        EXPECT_LE(m.resident_bytes(), budget);
      }
    }
  }
  EXPECT_EQ(m.stats().misses, 6u * 8u);
  EXPECT_EQ(m.stats().buffers_mapped, 3u);
}

TEST(ExpertManager, PinnedExpertsStay) {
  Fixture f(1, 4);
  f.policy->pins = {{0, 3}};
  auto m = f.manager(2 * kBlob);
  ASSERT_TRUE(m.preload());
  for (int e : {0, 1, 2, 0, 1}) {
    ASSERT_TRUE(m.acquire(0, e));
    m.release(0, e);
  }
  const int reads = f.storage->reads;
  ASSERT_TRUE(m.acquire(0, 3));
  EXPECT_EQ(f.storage->reads, reads);
}

TEST(ExpertManager, ABudgetBelowOneSlotIsRefusedAtLoad) {
  Fixture f(1, 4);
  auto m = f.manager(kBlob - 1);
  auto s = m.preload();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("memory.expert_cache (4095 bytes) holds no expert: one slot needs 4096 bytes"),
            std::string::npos)
      << s.message();
}

TEST(ExpertManager, PinsThatLeaveNoRoomAreNamedInTheError) {
  Fixture f(1, 4);
  f.policy->pins = {{0, 2}, {0, 3}};
  auto m = f.manager(2 * kBlob);
  ASSERT_TRUE(m.preload());
  auto w = m.acquire(0, 0);
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message().find("or pin fewer experts: the 2 pinned ones loaded so far take 8K"),
            std::string::npos)
      << w.error().message();
}

TEST(ExpertManager, APolicyThatNamesAnEntryInUseIsBlamedNotTheBudget) {
  Fixture f(1, 4);
  f.policy->ignore_predicate = true;
  auto m = f.manager(2 * kBlob);
  m.set_policy_name("liar");  // a third-party plugin's: the error names it
  ASSERT_TRUE(m.preload());
  ASSERT_TRUE(m.acquire(0, 0));  // held: the faulty policy names it first
  ASSERT_TRUE(m.acquire(0, 1));
  m.release(0, 1);
  auto w = m.acquire(0, 2);
  ASSERT_FALSE(w);
  EXPECT_NE(
      w.error().message().find("the cache policy 'liar' (cache.policy) named L0/E0, which cannot be evicted, while 1 "
                               "cached experts could be"),
      std::string::npos)
      << w.error().message();
}

// The first byte of an expert's gate weights as the device holds them.
int device_byte(const sdk::Tensor& t) {
  return static_cast<int>(static_cast<DeviceCompute::DeviceBuffer*>(t.buffer)->bytes.at(t.offset));
}

TEST(ExpertManagerVram, UploadsFromRamAndServesTheDeviceBuffer) {
  Fixture f(2, 4);
  auto gpu = std::make_shared<DeviceCompute>();
  auto vram_policy = std::make_shared<ListPolicy>();
  auto m = f.manager(2 * kBlob);
  ASSERT_TRUE(m.enable_vram(gpu, vram_policy, 3 * kBlob + 100));
  ASSERT_TRUE(m.preload());
  ASSERT_NE(m.vram(), nullptr);
  EXPECT_EQ(m.vram()->slot_count(), 3u);
  EXPECT_EQ(gpu->allocated, 3 * kBlob);
  auto w = m.acquire(1, 2);
  ASSERT_TRUE(w);
  ASSERT_NE(w->gate.buffer, nullptr);
  EXPECT_EQ(w->gate.data, nullptr);  // device memory: no host pointer
  EXPECT_EQ(device_byte(w->gate), 16 + 2);
  EXPECT_EQ(device_byte(w->down), 16 + 2);
  EXPECT_EQ(w->down.offset - w->gate.offset, 2048u);
  m.release(1, 2);
  EXPECT_EQ(m.stats().vram_misses, 1u);
  EXPECT_EQ(m.stats().misses, 1u);  // the RAM tier read it once
  EXPECT_EQ(m.stats().uploads, 1u);
  EXPECT_EQ(m.stats().bytes_uploaded, kBlob);
  const int reads = f.storage->reads;
  ASSERT_TRUE(m.acquire(1, 2));
  m.release(1, 2);
  EXPECT_EQ(m.stats().vram_hits, 1u);
  EXPECT_EQ(m.stats().hits + m.stats().misses, 1u);  // a VRAM hit never asks the RAM tier
  EXPECT_EQ(f.storage->reads, reads);
  EXPECT_EQ(gpu->copies, 1);
}

TEST(ExpertManagerVram, NeverEvictsAnExpertInUseAndNeverGoesOverBudget) {
  Fixture f(2, 4);
  auto gpu = std::make_shared<DeviceCompute>();
  auto vram_policy = std::make_shared<ListPolicy>();
  auto m = f.manager(1 * kBlob);
  ASSERT_TRUE(m.enable_vram(gpu, vram_policy, 2 * kBlob, /*admission=*/false));  // every miss uploads
  ASSERT_TRUE(m.preload());
  auto a = m.acquire(0, 0);
  auto b = m.acquire(0, 1);
  ASSERT_TRUE(a && b);
  const int reads = f.storage->reads;
  auto full = m.acquire(0, 2);  // both slots in use
  ASSERT_FALSE(full);
  EXPECT_NE(full.error().message().find("vram_budget"), std::string::npos) << full.error().message();
  EXPECT_EQ(f.storage->reads, reads);  // refused before reading
  m.release(0, 1);
  auto c = m.acquire(0, 2);  // evicts 0:1, the only one not in use
  ASSERT_TRUE(c);
  EXPECT_EQ(m.stats().vram_evictions, 1u);
  EXPECT_TRUE(m.vram()->contains({0, 0}));
  EXPECT_FALSE(m.vram()->contains({0, 1}));
  EXPECT_EQ(device_byte(a->gate), 0);  // 0:0's slot was not reused
  EXPECT_EQ(device_byte(c->gate), 2);  // 0:2 took 0:1's slot
  EXPECT_EQ(c->gate.buffer, b->gate.buffer);
  EXPECT_EQ(c->gate.offset, b->gate.offset);
  m.release(0, 0);
  m.release(0, 2);
  // Many more lookups than slots: the device never holds more than the budget.
  for (int i = 0; i < 40; ++i) {
    const int l = i % 2, e = (i * 7) % 4;
    auto w = m.acquire(l, e);
    ASSERT_TRUE(w) << w.error().message();
    EXPECT_EQ(device_byte(w->up), l * 16 + e);
    m.release(l, e);
    EXPECT_LE(m.vram()->resident_bytes(), 2 * kBlob);
  }
  EXPECT_LE(gpu->peak_allocated, 2 * kBlob);
  EXPECT_EQ(m.stats().vram_hits + m.stats().vram_misses, 44u);  // a, b, the refused one, c and 40
  EXPECT_EQ(m.stats().uploads, m.stats().vram_misses - 1);      // the refused lookup uploaded nothing
  EXPECT_EQ(m.stats().bytes_uploaded, m.stats().uploads * kBlob);
}

TEST(ExpertManagerVram, StagedUploadsStartTogetherAndAreWaitedForByAcquire) {
  Fixture f(1, 5);
  auto gpu = std::make_shared<DeviceCompute>();
  auto vram_policy = std::make_shared<ListPolicy>();
  auto m = f.manager(5 * kBlob);  // every expert in RAM
  ASSERT_TRUE(m.enable_vram(gpu, vram_policy, 3 * kBlob, /*admission=*/false));
  ASSERT_TRUE(m.preload());
  ASSERT_TRUE(m.acquire(0, 0));
  m.release(0, 0);
  EXPECT_TRUE(m.ready(0, 0));
  EXPECT_FALSE(m.ready(0, 1));  // in RAM only: acquire() would upload and wait
  const ExpertKey layer[] = {{0, 0}, {0, 1}, {0, 2}};
  EXPECT_EQ(m.stage_uploads(layer), 2u);  // 0:0 is in VRAM already
  EXPECT_EQ(gpu->copies, 3);
  EXPECT_FALSE(m.ready(0, 1));  // the copy has not landed
  EXPECT_EQ(m.stats().vram_misses, 3u);
  EXPECT_EQ(m.stats().hits, 3u);  // each came from the RAM tier once
  auto w = m.acquire(0, 1);       // waits for the copy: the weights show the expert's bytes
  ASSERT_TRUE(w);
  EXPECT_EQ(device_byte(w->gate), 1);
  m.release(0, 1);
  ASSERT_TRUE(m.acquire(0, 2));
  m.release(0, 2);
  EXPECT_EQ(m.stats().vram_hits, 0u);  // the staged acquires are the misses counted when staging
  EXPECT_EQ(m.stats().vram_misses, 3u);
  EXPECT_EQ(m.stats().hits, 3u);
  EXPECT_EQ(m.stats().uploads, 3u);
  EXPECT_EQ(m.usage().at(ExpertKey{0, 1}.packed()), 1u);  // one use, not one per tier
  // VRAM is full (0:0, 0:1, 0:2; 0:0 least recently used). The next layer needs 0:0 and 0:3: staging evicts 0:1,
  // the least recently used expert that is not needed, never 0:0.
  const ExpertKey next[] = {{0, 0}, {0, 3}};
  EXPECT_EQ(m.stage_uploads(next), 1u);
  EXPECT_TRUE(m.vram()->contains({0, 0}));
  EXPECT_FALSE(m.vram()->contains({0, 1}));
  EXPECT_TRUE(m.vram()->contains({0, 3}));
  // A copy still in flight is never evicted: with 0:3 uploading and 0:0, 0:2 needed, 0:4 finds no room and is left
  // to acquire().
  const ExpertKey crowded[] = {{0, 0}, {0, 2}, {0, 4}};
  EXPECT_EQ(m.stage_uploads(crowded), 0u);
  EXPECT_FALSE(m.vram()->contains({0, 4}));
  EXPECT_EQ(gpu->copies, 4);
  auto late = m.acquire(0, 3);
  ASSERT_TRUE(late);
  EXPECT_EQ(device_byte(late->down), 3);
  m.release(0, 3);
}

TEST(ExpertManagerVram, CpuRunsCountAsVramMissesAndFillOnlyFreeSlots) {
  Fixture f(1, 4);
  auto gpu = std::make_shared<DeviceCompute>();
  auto m = f.manager(4 * kBlob);
  ASSERT_TRUE(m.enable_vram(gpu, std::make_shared<ListPolicy>(), 1 * kBlob));
  ASSERT_TRUE(m.preload());
  // Measuring reads the expert but is no lookup.
  int seen = -1;
  ASSERT_TRUE(m.with_ram_weights(0, 2, [&](const ExpertWeights& w) {
    seen = static_cast<const std::uint8_t*>(w.gate.data)[0];
    return sdk::Status{};
  }));
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(m.stats().hits + m.stats().misses, 0u);
  EXPECT_TRUE(m.usage().empty());
  auto w = m.acquire_for_cpu(0, 1);
  ASSERT_TRUE(w);
  ASSERT_NE(w->gate.data, nullptr);  // RAM weights, for the CPU backend
  EXPECT_EQ(w->gate.buffer, nullptr);
  EXPECT_TRUE(m.fill_vram(0, 1));  // the one slot is free
  m.release_for_cpu(0, 1, 0.25);
  EXPECT_EQ(m.stats().cpu_runs, 1u);
  EXPECT_EQ(m.stats().cpu_run_bytes, kBlob);
  EXPECT_DOUBLE_EQ(m.stats().cpu_run_seconds, 0.25);
  EXPECT_EQ(m.stats().vram_misses, 1u);
  EXPECT_TRUE(m.in_vram(0, 1));
  ASSERT_TRUE(m.acquire_for_cpu(0, 3));
  EXPECT_FALSE(m.fill_vram(0, 3));  // no free slot: a fill never evicts
  m.release_for_cpu(0, 3, 0);
  EXPECT_TRUE(m.in_vram(0, 1));
  EXPECT_FALSE(m.in_vram(0, 3));
  EXPECT_EQ(m.stats().vram_evictions, 0u);
  auto filled = m.acquire(0, 1);  // the fill's copy is waited for: a hit, not a miss
  ASSERT_TRUE(filled);
  EXPECT_EQ(device_byte(filled->gate), 1);
  m.release(0, 1);
  EXPECT_EQ(m.stats().vram_hits, 1u);
  EXPECT_EQ(m.stats().vram_misses, 2u);
  EXPECT_EQ(m.stats().uploads, 1u);
}

TEST(ExpertManagerVram, RegisteredSlotsAreReadDirectlyAndHeldUntilTheCopyIsDone) {
  Fixture f(1, 4);
  auto gpu = std::make_shared<DeviceCompute>();
  gpu->offer_register = true;
  {
    auto m = f.manager(1 * kBlob);  // one RAM slot: the next read must reuse it
    ASSERT_TRUE(m.enable_vram(gpu, std::make_shared<ListPolicy>(), 3 * kBlob, /*admission=*/false));
    ASSERT_TRUE(m.preload());
    EXPECT_EQ(gpu->registered.size(), 1u) << "the RAM slot is registered with the backend at load";
    // 0:3 in RAM only. Staging it starts a copy straight from the registered RAM slot, so that slot must stay 0:3's
    // until the copy is done, even when 0:1's read needs the room.
    ASSERT_TRUE(m.with_ram_weights(0, 3, [](const ExpertWeights&) { return sdk::Status{}; }));
    const ExpertKey next[] = {{0, 1}, {0, 3}};
    const int direct_before = gpu->direct_copies;
    EXPECT_EQ(m.stage_uploads(next), 1u);  // 0:3 starts uploading straight from the RAM slot
    EXPECT_EQ(gpu->direct_copies, direct_before + 1);
    auto b = m.acquire(0, 1);  // needs the RAM slot that 0:3's copy still reads: waits for that copy first
    ASSERT_TRUE(b) << b.error().message();
    EXPECT_EQ(device_byte(b->gate), 1);
    m.release(0, 1);
    auto c = m.acquire(0, 3);
    ASSERT_TRUE(c);
    EXPECT_EQ(device_byte(c->gate), 3) << "the copy read a reused RAM slot";
    EXPECT_EQ(device_byte(c->down), 3);
    m.release(0, 3);
  }
  EXPECT_TRUE(gpu->registered.empty()) << "every registration ends with the manager";

  // A refusal: one warning, and uploads go on staged.
  auto refusing = std::make_shared<DeviceCompute>();
  refusing->offer_register = true;
  refusing->refuse_register = true;
  auto m = f.manager(2 * kBlob);
  ASSERT_TRUE(m.enable_vram(refusing, std::make_shared<ListPolicy>(), 1 * kBlob, /*admission=*/false));
  ASSERT_TRUE(m.preload());
  for (int e : {0, 1, 2, 3}) {
    auto w = m.acquire(0, e);
    ASSERT_TRUE(w);
    EXPECT_EQ(device_byte(w->up), e);
    m.release(0, e);
  }
  EXPECT_EQ(refusing->register_calls, 1);
  EXPECT_EQ(refusing->direct_copies, 0);
}

// Four experts used in turn, three VRAM slots: a cyclic scan. Uploading every miss (LRU victims) never hits;
// admission keeps three experts and runs the fourth from RAM.
TEST(ExpertManagerVram, AdmissionKeepsACyclicWorkingSetInsteadOfThrashing) {
  for (const bool admission : {false, true}) {
    SCOPED_TRACE(admission ? "admission" : "every miss uploads");
    Fixture f(1, 4);
    auto gpu = std::make_shared<DeviceCompute>();
    gpu->mapped = true;  // weights carry host pointers either way, to check the bytes wherever they run from
    auto m = f.manager(4 * kBlob);
    ASSERT_TRUE(m.enable_vram(gpu, std::make_shared<ListPolicy>(), 3 * kBlob, admission));
    ASSERT_TRUE(m.preload());
    for (int round = 0; round < 10; ++round) {
      for (int e = 0; e < 4; ++e) {
        auto w = m.acquire(0, e);
        ASSERT_TRUE(w) << w.error().message();
        EXPECT_EQ(static_cast<const std::uint8_t*>(w->gate.data)[0], e);
        m.release(0, e);
      }
    }
    const auto& st = m.stats();
    EXPECT_EQ(st.vram_hits + st.vram_misses, 40u);
    EXPECT_EQ(st.vram_misses, st.uploads + st.vram_bypassed);
    if (admission) {
      EXPECT_EQ(st.vram_hits, 27u);  // 0, 1, 2 hit from the second round on
      EXPECT_EQ(st.uploads, 3u);
      EXPECT_EQ(st.vram_bypassed, 10u);
      EXPECT_EQ(st.vram_evictions, 0u);
    } else {
      EXPECT_EQ(st.vram_hits, 0u);
      EXPECT_EQ(st.uploads, 40u);
      EXPECT_EQ(st.vram_bypassed, 0u);
    }
  }
}

// Admission follows what is hot now: an expert used more often than the victim takes its slot.
TEST(ExpertManagerVram, AdmissionLetsAnExpertInOnceItIsUsedMoreThanTheVictim) {
  Fixture f(1, 3);
  auto m = f.manager(3 * kBlob);
  ASSERT_TRUE(m.enable_vram(std::make_shared<DeviceCompute>(), std::make_shared<ListPolicy>(), 1 * kBlob));
  ASSERT_TRUE(m.preload());
  auto use = [&](int e) {
    auto w = m.acquire(0, e);
    ASSERT_TRUE(w);
    m.release(0, e);
  };
  use(0);  // takes the free slot
  use(1);  // 0 uses vs 0:0's 1: runs from RAM
  EXPECT_FALSE(m.in_vram(0, 1));
  use(1);  // 1 use vs 1: still not more
  EXPECT_FALSE(m.in_vram(0, 1));
  use(1);  // 2 uses vs 1: evicts 0:0
  EXPECT_TRUE(m.in_vram(0, 1));
  EXPECT_FALSE(m.in_vram(0, 0));
  EXPECT_EQ(m.stats().vram_bypassed, 2u);
  EXPECT_EQ(m.stats().vram_evictions, 1u);
}

TEST(ExpertManagerVram, HoldsEveryExpertWhenTheBudgetAllows) {
  Fixture f(2, 3);
  auto gpu = std::make_shared<DeviceCompute>();
  gpu->mapped = true;  // a unified-memory device: weights also carry the host pointer
  auto m = f.manager(1 * kBlob);
  ASSERT_TRUE(m.enable_vram(gpu, std::make_shared<ListPolicy>(), 1ull << 30));
  EXPECT_EQ(gpu->allocated, 6 * kBlob);  // no more slots than experts
  ASSERT_TRUE(m.preload());
  EXPECT_TRUE(m.vram()->holds_all());
  EXPECT_EQ(m.stats().uploads, 6u);
  const int reads = f.storage->reads;
  for (int e : {2, 0, 1}) {
    auto w = m.acquire(1, e);
    ASSERT_TRUE(w);
    ASSERT_NE(w->gate.data, nullptr);
    EXPECT_EQ(static_cast<const std::uint8_t*>(w->gate.data)[0], 16 + e);
    m.release(1, e);
  }
  const ExpertKey wanted[] = {{0, 1}, {1, 1}};
  EXPECT_EQ(m.prefetch(wanted), 0u);  // nothing to fetch: all in VRAM
  EXPECT_EQ(m.stats().vram_hits, 3u);
  EXPECT_EQ(m.stats().vram_misses, 0u);
  EXPECT_EQ(f.storage->reads, reads);
}

TEST(ExpertManagerVram, PinnedExpertsStayInVram) {
  Fixture f(1, 4);
  f.policy->pins = {{0, 3}};
  auto vram_policy = std::make_shared<ListPolicy>();
  vram_policy->pins = f.policy->pins;
  auto gpu = std::make_shared<DeviceCompute>();
  auto m = f.manager(4 * kBlob);
  ASSERT_TRUE(m.enable_vram(gpu, vram_policy, 3 * kBlob));
  ASSERT_TRUE(m.preload());
  for (int e : {0, 1, 2, 0, 1, 2}) {
    ASSERT_TRUE(m.acquire(0, e));
    m.release(0, e);
  }
  const auto uploads = m.stats().uploads;
  ASSERT_TRUE(m.acquire(0, 3));
  EXPECT_EQ(m.stats().uploads, uploads);
}

TEST(ExpertManagerVram, ABudgetBelowOneExpertOrAboveTheDeviceIsAClearError) {
  Fixture f(1, 2);
  auto m = f.manager(4 * kBlob);
  auto s = m.enable_vram(std::make_shared<DeviceCompute>(), std::make_shared<ListPolicy>(), kBlob - 1);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("memory.vram_budget"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("holds no expert"), std::string::npos) << s.message();
  auto small_gpu = std::make_shared<DeviceCompute>();
  small_gpu->info[0].memory_available = kBlob;  // room for one slot, two asked for
  s = m.enable_vram(small_gpu, std::make_shared<ListPolicy>(), 2 * kBlob);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("fake gpu has only"), std::string::npos) << s.message();
  EXPECT_EQ(small_gpu->allocated, 0u);
}

TEST(ExpertManager, CorruptOrMissingBlobsAreNamed) {
  Fixture f(2, 2);
  f.storage->files["/m/experts/L1E0.bin"][1500] = std::byte{0xFF};
  f.storage->files.erase("/m/experts/L0E1.bin");
  auto m = f.manager(1 << 20);
  auto bad = m.acquire(1, 0);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("L1/E0: checksum mismatch"), std::string::npos) << bad.error().message();
  auto gone = m.acquire(0, 1);
  ASSERT_FALSE(gone);
  EXPECT_NE(gone.error().message().find("L0/E1"), std::string::npos) << gone.error().message();
  EXPECT_FALSE(m.preload());  // resident mode reads everything and meets the same files
}

// --- cache admin: clear() and warm() (colibri-server /admin/cache/*) ---

std::vector<std::uint8_t> bytes_of(const ExpertWeights& w) {
  const auto* p = static_cast<const std::uint8_t*>(w.gate.data);
  return {p, p + 3 * 1024};  // gate, up and down lie back to back in the fixture's blobs
}

TEST(ExpertManagerAdmin, ClearKeepsExpertsInUseAndPinnedAndTellsThePolicy) {
  Fixture f(1, 4);
  f.policy->pins = {{0, 3}};
  auto m = f.manager(3 * kBlob);
  ASSERT_FALSE(m.resident());
  ASSERT_TRUE(m.preload());
  auto held = m.acquire(0, 0);
  ASSERT_TRUE(held);
  auto first = m.acquire(0, 1);
  ASSERT_TRUE(first);
  const auto before = bytes_of(*first);
  m.release(0, 1);
  ASSERT_EQ(m.resident_count(), 3u);
  const auto evictions = m.stats().evictions;

  const auto r = m.clear();
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_EQ(r.dropped_bytes, kBlob);
  EXPECT_EQ(r.kept_in_use, 1u);
  EXPECT_EQ(r.kept_pinned, 1u);
  EXPECT_EQ(m.resident_count(), 2u);
  EXPECT_EQ(m.resident_bytes(), 2 * kBlob);
  EXPECT_EQ(m.stats().evictions, evictions);  // clearing is not eviction
  EXPECT_EQ(std::count(f.policy->order.begin(), f.policy->order.end(), ExpertKey{0, 1}), 0);
  // The held expert's weights are still valid and the pinned one is still a hit.
  EXPECT_EQ(static_cast<const std::uint8_t*>(held->gate.data)[0], 0);
  const int reads = f.storage->reads;
  ASSERT_TRUE(m.acquire(0, 3));
  m.release(0, 3);
  EXPECT_EQ(f.storage->reads, reads);
  // The dropped one comes back from storage, byte for byte.
  const auto misses = m.stats().misses;
  auto again = m.acquire(0, 1);
  ASSERT_TRUE(again);
  EXPECT_EQ(m.stats().misses, misses + 1);
  EXPECT_EQ(bytes_of(*again), before);
  m.release(0, 1);
  m.release(0, 0);
  EXPECT_EQ(m.clear().dropped, 2u);  // 0:0 no longer in use; 0:3 stays pinned
  EXPECT_EQ(m.resident_count(), 1u);
}

TEST(ExpertManagerAdmin, ClearInResidentModeReloadsOnDemand) {
  Fixture f(2, 2);
  auto m = f.manager(4 * kBlob);
  ASSERT_TRUE(m.resident());
  ASSERT_TRUE(m.preload());
  auto w = m.acquire(1, 1);
  ASSERT_TRUE(w);
  const auto before = bytes_of(*w);
  m.release(1, 1);
  EXPECT_EQ(m.clear().dropped, 4u);
  EXPECT_EQ(m.resident_bytes(), 0u);
  EXPECT_TRUE(f.policy->order.empty());
  auto again = m.acquire(1, 1);
  ASSERT_TRUE(again);
  EXPECT_EQ(bytes_of(*again), before);
  EXPECT_EQ(m.resident_count(), 1u);
}

TEST(ExpertManagerAdmin, WarmLoadsUntilTheBudgetIsFullWithoutEvictingWhatItMustKeep) {
  Fixture f(2, 4);
  f.policy->pins = {{0, 3}};
  auto m = f.manager(4 * kBlob);
  ASSERT_TRUE(m.preload());
  ASSERT_TRUE(m.acquire(0, 0));  // in use during the warm
  ASSERT_TRUE(m.acquire(0, 1));
  m.release(0, 1);  // evictable: the only victim warm may take
  const auto misses = m.stats().misses;
  const auto bytes = m.stats().bytes_read;
  const auto usage = m.usage();
  const std::vector<ExpertKey> keys{{1, 0}, {0, 0}, {1, 1}, {1, 2}};
  auto r = m.warm(keys);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->already_resident, 1u);  // 0:0
  EXPECT_EQ(r->loaded, 2u);            // 1:0, then 1:1 in place of 0:1
  EXPECT_EQ(r->no_room, 1u);           // 1:2: 0:0 in use, 0:3 pinned, 1:0 and 1:1 asked for
  EXPECT_EQ(r->bytes_read, 2 * kBlob);
  EXPECT_EQ(m.stats().bytes_read, bytes + 2 * kBlob);
  EXPECT_EQ(m.stats().misses, misses);  // warming is not a miss
  EXPECT_EQ(m.usage(), usage);          // nor a use
  EXPECT_LE(m.resident_bytes(), m.budget_bytes());
  const int reads = f.storage->reads;
  for (auto k : {ExpertKey{1, 0}, ExpertKey{1, 1}, ExpertKey{0, 3}}) {
    ASSERT_TRUE(m.acquire(k.layer, k.expert));
    m.release(k.layer, k.expert);
  }
  EXPECT_EQ(f.storage->reads, reads);  // all hits
  m.release(0, 0);
}

TEST(ExpertManagerAdmin, WarmRejectsAnUnknownExpertBeforeLoading) {
  Fixture f(1, 2);
  auto m = f.manager(kBlob);
  const std::vector<ExpertKey> keys{{0, 0}, {0, 9}};
  auto r = m.warm(keys);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("L0/E9"), std::string::npos) << r.error().message();
  EXPECT_EQ(m.resident_count(), 0u);
  EXPECT_EQ(f.storage->reads, 0);
}

// Offers "colibri.storage.buffers.v1": records what is registered, and whether each read lands inside it.
class RegisteringStorage final : public MemoryStorage, public sdk::StorageBuffers {
 public:
  bool refuse = false;
  int register_calls = 0;
  int unregister_calls = 0;
  int reads_registered = 0;
  int unregister_unknown = 0;
  std::map<const std::byte*, std::size_t> live;  // registered ranges

  void* query_interface(std::string_view id) noexcept override {
    return id == sdk::kStorageBuffersInterface ? static_cast<sdk::StorageBuffers*>(this) : nullptr;
  }
  sdk::Status register_buffer(std::span<std::byte> range) noexcept override {
    ++register_calls;
    if (refuse) return sdk::Status(sdk::StatusCode::out_of_memory, "locked-memory limit (test)");
    live[range.data()] = range.size();
    return {};
  }
  void unregister_buffer(std::span<std::byte> range) noexcept override {
    ++unregister_calls;
    auto it = live.find(range.data());
    if (it == live.end() || it->second != range.size()) {
      ++unregister_unknown;
      return;
    }
    live.erase(it);
  }
  sdk::Status read(sdk::StorageFile& f, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    auto it = live.upper_bound(dst.data());
    if (it != live.begin() && dst.data() + dst.size() <= std::prev(it)->first + std::prev(it)->second) {
      ++reads_registered;
    }
    return MemoryStorage::read(f, offset, dst);
  }
};

TEST(ExpertManagerBuffers, SlotBuffersAreRegisteredWhileTheyLiveAndReadsLandInThem) {
  testing::MemoryExpertSet<RegisteringStorage> f(1, 4, kBlob);
  const auto& storage = f.storage;
  {
    auto m = f.manager(2 * kBlob);
    ASSERT_TRUE(m.preload());
    EXPECT_EQ(storage->register_calls, 2) << "the fixed slots are mapped and registered at load";
    EXPECT_EQ(storage->reads, 0);
    for (int e : {0, 1, 2, 3, 0, 2, 1}) {  // evictions: the freed slots' buffers are reused
      auto w = m.acquire(0, e);
      ASSERT_TRUE(w) << w.error().message();
      EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(w->gate.data)), e);
      m.release(0, e);
    }
    EXPECT_EQ(storage->reads, 7);
    EXPECT_EQ(storage->reads_registered, 7);
    EXPECT_EQ(storage->register_calls, 2) << "a slot buffer is registered once and reused";
    EXPECT_LE(storage->live.size(), 2u);
    m.clear();  // frees its buffers: unregistered first
    EXPECT_TRUE(storage->live.empty());
    ASSERT_TRUE(m.acquire(0, 3));
    m.release(0, 3);
    EXPECT_EQ(storage->live.size(), 1u);
  }
  EXPECT_TRUE(storage->live.empty()) << "the manager's destruction unregisters what it registered";
  EXPECT_EQ(storage->register_calls, storage->unregister_calls);
  EXPECT_EQ(storage->unregister_unknown, 0);
}

TEST(ExpertManagerBuffers, ResidentModeRegistersNothing) {
  testing::MemoryExpertSet<RegisteringStorage> f(1, 4, kBlob);
  const auto& storage = f.storage;
  auto m = f.manager(4 * kBlob);
  ASSERT_TRUE(m.resident());
  ASSERT_TRUE(m.preload());
  EXPECT_EQ(storage->reads, 4);
  EXPECT_EQ(storage->register_calls, 0);
}

TEST(ExpertManagerBuffers, ARefusedRegistrationWarnsOnceAndReadsGoOnUnregistered) {
  testing::MemoryExpertSet<RegisteringStorage> f(1, 4, kBlob);
  const auto& storage = f.storage;
  storage->refuse = true;
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
  {
    auto m = f.manager(2 * kBlob);
    for (int e : {0, 1, 2, 3, 1}) {
      auto w = m.acquire(0, e);
      ASSERT_TRUE(w) << w.error().message();
      EXPECT_EQ(static_cast<unsigned char>(*static_cast<const std::byte*>(w->down.data)), e);
      m.release(0, e);
    }
    m.clear();
    ASSERT_TRUE(m.acquire(0, 2));
    m.release(0, 2);
  }
  spdlog::set_default_logger(previous);
  EXPECT_EQ(storage->register_calls, 1) << "no further attempts after a refusal";
  EXPECT_EQ(storage->unregister_calls, 0) << "nothing registered, nothing to unregister";
  EXPECT_EQ(storage->reads, 6);
  const std::string log = captured.str();
  EXPECT_NE(log.find("locked-memory limit (test)"), std::string::npos) << log;
  const std::string warning = "did not register a slot buffer";
  ASSERT_NE(log.find(warning), std::string::npos) << log;
  EXPECT_EQ(log.find(warning), log.rfind(warning)) << "one warning: " << log;
}

}  // namespace
}  // namespace colibri::engine
