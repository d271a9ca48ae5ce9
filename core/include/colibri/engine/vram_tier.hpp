// The VRAM expert tier: fixed slots in buffers from the compute backend's allocate(), as many as memory.vram_budget
// holds (never more than the model has experts), filled by uploading an expert's blob from the RAM tier
// (copy_to_device_async, waited on before the expert runs; begin_upload() starts a layer's uploads early so they
// cross the bus while other experts compute). Its own cache-policy instance picks victims among
// slots that are neither in use nor pinned. The weights it hands out reference the device buffer (Tensor::buffer +
// offset; Tensor::data is the buffer's host pointer where it has one), so the expert runs on the same backend with
// the same bytes as from RAM: placement changes speed, never the answer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "colibri/model/manifest.hpp"
#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/compute.hpp"

namespace colibri::engine {

struct ExpertWeights;
struct ExpertStats;

class VramTier {
 public:
  // Slots of the largest expert blob (4 KiB rounded), grouped into buffers of at most kBufferBytes. Errors when the
  // budget holds no slot or the backend cannot allocate them, naming memory.vram_budget.
  static sdk::Expected<std::unique_ptr<VramTier>> create(const model::Manifest& manifest,
                                                         std::shared_ptr<sdk::Compute> compute,
                                                         std::shared_ptr<sdk::CachePolicy> policy,
                                                         std::uint64_t budget_bytes, ExpertStats& stats);
  ~VramTier();
  VramTier(const VramTier&) = delete;
  VramTier& operator=(const VramTier&) = delete;

  static constexpr std::uint64_t kBufferBytes = 256ull << 20;  // few allocations, each well under device limits

  // A VRAM hit: marks the expert in use and returns its device weights; nullopt when it has no slot (a miss).
  std::optional<ExpertWeights> acquire(sdk::ExpertKey key);
  // Uploads the expert's blob (`blob`: its bytes as read, e.size of them) into a free slot, evicting through the
  // policy when none is free, waits for the copy and marks it in use. out_of_memory when every slot is in use or
  // pinned.
  sdk::Expected<ExpertWeights> upload(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob);
  // Starts uploading the expert into a free slot without waiting (the backend may reuse `blob` once the copy call
  // returns: sdk/compute.hpp); the next acquire() waits for the copy and is counted as this miss, not as a hit.
  // Room comes from the policy's victims, never an expert in use, pinned, uploading or named in `keep`. False
  // (nothing changed) when there is no such room or the copy could not start: acquire() then misses and upload()
  // runs as usual.
  bool begin_upload(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob,
                    std::span<const sdk::ExpertKey> keep);
  // Like begin_upload, but only into a free slot (never evicting) and not a miss: the expert runs elsewhere now
  // (compute.cpu_fallback) and is in VRAM for its next use. False when no slot is free.
  bool begin_fill(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob);
  // Admission (on unless set_admission(false)): when every slot is taken, an expert earns one only if it has been
  // used more often than the victim the policy would evict (use counts halved every 10 x slots uses, so they follow
  // what is hot now). Without that rule a tier smaller than what one token touches is a cyclic scan that LRU and
  // decayed frequency both turn into zero hits; with it, the experts already there stay and the others run from
  // host memory (the same bytes on the same backend: the same bits).
  void set_admission(bool on) { admission_ = on; }
  // Counts a use of the expert for admission (call once per use, hit or miss).
  void note_use(sdk::ExpertKey key);
  // Whether a miss of this expert should take a slot now: a free slot, no admission, or more uses than the victim.
  [[nodiscard]] bool admits(sdk::ExpertKey key);
  // Frees a slot (evicting through the policy) unless one is free; out_of_memory when every slot is in use or
  // pinned. upload() does it too; calling it first spares a read whose upload would fail.
  sdk::Status make_room();
  void release(sdk::ExpertKey key);
  // Pins a resident expert for the whole run (never evicted); false when it has no slot.
  bool pin(sdk::ExpertKey key);
  [[nodiscard]] bool contains(sdk::ExpertKey key) const { return entries_.count(key.packed()) != 0; }
  // Resident with its upload (if any) complete: acquire() returns without waiting.
  [[nodiscard]] bool ready(sdk::ExpertKey key) const;
  // Its weights when resident with no upload pending (acquire() has checked the upload), without marking it in use
  // or counting anything; nullopt otherwise.
  [[nodiscard]] std::optional<ExpertWeights> resident_weights(sdk::ExpertKey key) const;
  // Slots freed so far (an expert's place may then be another's): ExpertManager::placement_generation.
  [[nodiscard]] std::uint64_t freed_slots() const { return freed_slots_; }
  // True while a begin_upload() or begin_fill() copy of the expert may still read its source.
  [[nodiscard]] bool copying(sdk::ExpertKey key) const;
  // Waits for that copy; a failed one forgets the expert (its next acquire() misses and uploads again).
  void finish_copy(sdk::ExpertKey key);
  // Every expert of the model has a slot of its own: nothing is ever evicted.
  [[nodiscard]] bool holds_all() const { return slot_count() >= expert_count_; }
  // Forgets every expert neither in use nor pinned (their slots become free); returns how many.
  std::size_t clear();

  [[nodiscard]] std::size_t slot_count() const { return slots_.size(); }
  [[nodiscard]] std::size_t resident_count() const { return entries_.size(); }
  [[nodiscard]] std::uint64_t slot_bytes() const { return slot_bytes_; }
  // Bytes of device memory the slots hold (allocated at start): never above the budget.
  [[nodiscard]] std::uint64_t allocated_bytes() const { return allocated_; }
  [[nodiscard]] std::uint64_t resident_bytes() const { return entries_.size() * slot_bytes_; }
  [[nodiscard]] std::uint64_t budget_bytes() const { return budget_; }

 private:
  struct Place {
    sdk::Buffer* buffer = nullptr;
    std::size_t offset = 0;
  };
  struct Entry {
    const model::ExpertEntry* expert = nullptr;
    std::size_t slot = 0;
    int in_use = 0;
    bool pinned = false;
    std::unique_ptr<sdk::Event> upload;  // begin_upload()'s copy, until acquire() waits for it
    bool miss_counted = false;           // begun by begin_upload(): its first acquire() is that miss, not a hit
  };
  VramTier(std::shared_ptr<sdk::Compute> compute, std::shared_ptr<sdk::CachePolicy> policy, ExpertStats& stats)
      : compute_(std::move(compute)), policy_(std::move(policy)), stats_(stats) {}
  static bool evictable(void* ctx, sdk::ExpertKey key) noexcept;
  // Copies the blob into a free slot (making room first) and inserts its entry, with the copy's event when `wait`
  // is false; the entry, or nullptr with `error` set.
  Entry* start_upload(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob, bool wait,
                      sdk::Status& error);
  ExpertWeights weights_of(const Entry& entry) const;
  void erase(std::map<std::uint64_t, Entry>::iterator it);

  std::shared_ptr<sdk::Compute> compute_;
  std::shared_ptr<sdk::CachePolicy> policy_;
  ExpertStats& stats_;
  std::vector<std::unique_ptr<sdk::Buffer>> buffers_;
  std::vector<Place> slots_;
  std::vector<std::size_t> free_;  // slot indices without an expert
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t slot_bytes_ = 0;
  std::uint64_t allocated_ = 0;
  std::uint64_t budget_ = 0;
  std::size_t expert_count_ = 0;
  std::span<const sdk::ExpertKey> keep_;  // during begin_upload(): experts its eviction must spare
  bool admission_ = true;
  std::map<std::uint64_t, std::uint32_t> uses_;  // admission's use counts, by ExpertKey::packed()
  std::uint64_t uses_since_halving_ = 0;
  std::uint64_t freed_slots_ = 0;
};

}  // namespace colibri::engine
