// The expert manager: owns the memory of routed experts (one slot per resident blob), reads misses through the
// storage plugin with ONE request per blob, and follows the cache-policy contract (sdk/cache_policy.hpp): the policy
// hears inserts, accesses and erasures and picks victims among entries that are not in use and not pinned.
// When the budget holds every expert, all are loaded at start (resident mode) and none is ever evicted.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "colibri/engine/memory.hpp"
#include "colibri/engine/vram_tier.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/storage.hpp"
#include "colibri/sdk/storage_view.hpp"

namespace colibri::engine {

struct ExpertWeights {
  sdk::Tensor gate, up, down;                 // GGML order: gate/up {D, F}, down {F, D}
  sdk::Tensor gate_bias, up_bias, down_bias;  // f32 {F}, {F}, {D} for gpt-oss experts; data and buffer null otherwise
};

// The tensors of expert `e` whose blob starts at `host` (may be null for device memory) and, in a device buffer, at
// `buffer` + `offset`.
ExpertWeights expert_weights(const model::ExpertEntry& e, std::byte* host, sdk::Buffer* buffer = nullptr,
                             std::size_t offset = 0);

struct ExpertStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t preloaded = 0;       // pinned experts read at load: in bytes_read, not lookups (hits + misses)
  std::uint64_t buffers_mapped = 0;  // RAM slot buffers newly mapped (the OS zeroes each page at first touch)
  double stall_seconds = 0;  // time demand reads (and waits for in-flight prefetches) kept the forward pass waiting
  // Prefetch: reads queued ahead of need (ReadPriority::prefetch), how many of them the router then used, how many
  // were evicted or failed unused, and the read time they took off the critical path (submit-to-completion time
  // of each used prefetch minus what the forward pass still waited for it; an estimate).
  std::uint64_t prefetch_issued = 0;
  std::uint64_t prefetch_used = 0;
  std::uint64_t prefetch_wasted = 0;
  std::uint64_t prefetch_failed = 0;
  std::uint64_t prefetch_cancelled = 0;  // withdrawn from the storage queue before they started (cancel_stale)
  double stall_saved_seconds = 0;
  // Router predictions for the next layers against the experts those layers then picked (all experts predicted,
  // resident or not): precision = correct / predicted, recall = correct / actual.
  std::uint64_t predicted = 0;
  std::uint64_t predicted_correct = 0;
  std::uint64_t actual = 0;
  [[nodiscard]] double prediction_precision() const {
    return predicted == 0 ? 0.0 : static_cast<double>(predicted_correct) / static_cast<double>(predicted);
  }
  [[nodiscard]] double prediction_recall() const {
    return actual == 0 ? 0.0 : static_cast<double>(predicted_correct) / static_cast<double>(actual);
  }
  [[nodiscard]] double hit_rate() const {
    return hits + misses == 0 ? 1.0 : static_cast<double>(hits) / static_cast<double>(hits + misses);
  }
  // compute.cpu_fallback: experts not in VRAM that ran on the CPU backend from RAM instead of being uploaded (each a
  // VRAM miss too), their weight bytes, and the time they took.
  std::uint64_t cpu_runs = 0;
  std::uint64_t cpu_run_bytes = 0;
  double cpu_run_seconds = 0;
  // The VRAM tier (when enabled): lookups it served and missed (a miss goes to the RAM tier, then uploads), slots it
  // freed for others, uploads and their bytes, and the time the forward pass waited for uploads. `hits`/`misses`
  // above are the RAM tier's and then count only VRAM misses.
  std::uint64_t vram_hits = 0;
  std::uint64_t vram_misses = 0;
  std::uint64_t vram_evictions = 0;
  std::uint64_t uploads = 0;
  std::uint64_t bytes_uploaded = 0;
  std::uint64_t vram_bypassed = 0;  // VRAM misses admission kept out of the tier: run from RAM, not uploaded
  double upload_seconds = 0;
  [[nodiscard]] double vram_hit_rate() const {
    return vram_hits + vram_misses == 0 ? 1.0
                                        : static_cast<double>(vram_hits) / static_cast<double>(vram_hits + vram_misses);
  }
  // What happened since `earlier` (a snapshot of the same counters): every field minus its earlier value.
  [[nodiscard]] ExpertStats since(const ExpertStats& earlier) const;
};

// What ExpertManager::clear() dropped and what it had to keep.
struct CacheClearResult {
  std::size_t dropped = 0;
  std::uint64_t dropped_bytes = 0;
  std::size_t kept_in_use = 0;
  std::size_t kept_pinned = 0;
  std::size_t vram_dropped = 0;  // experts the VRAM tier forgot (its slots stay allocated)
};

// What ExpertManager::warm() did with the experts it was given.
struct CacheWarmResult {
  std::size_t loaded = 0;
  std::size_t already_resident = 0;
  std::size_t no_room = 0;  // left out: the budget was full of experts warm may not evict
  std::uint64_t bytes_read = 0;
};

class ExpertManager {
 public:
  // budget_bytes: RAM for expert slots. Experts are checked against their manifest checksums when read.
  ExpertManager(const model::Manifest& manifest, std::filesystem::path model_dir, std::shared_ptr<sdk::Storage> storage,
                std::shared_ptr<sdk::CachePolicy> policy, std::uint64_t budget_bytes);
  ~ExpertManager();
  ExpertManager(const ExpertManager&) = delete;
  ExpertManager& operator=(const ExpertManager&) = delete;
  // The storage plugin's name, which a checksum error names (the bytes came through it).
  void set_storage_name(std::string name) { storage_name_ = std::move(name); }
  // The cache policy plugin's name, which an error about its victims names.
  void set_policy_name(std::string name) { policy_name_ = std::move(name); }

  // True when every expert fits the budget (resident mode).
  [[nodiscard]] bool resident() const { return resident_; }
  // Adds the VRAM tier (vram_tier.hpp) in front of the RAM tier: slots in `compute`'s buffers within budget_bytes,
  // victims picked by `policy` (an instance of its own). Call before preload().
  // `admission`: memory.vram_admission (VramTier::admits); an expert it turns away runs from RAM (vram_bypassed).
  sdk::Status enable_vram(std::shared_ptr<sdk::Compute> compute, std::shared_ptr<sdk::CachePolicy> policy,
                          std::uint64_t budget_bytes, bool admission = true);
  [[nodiscard]] const VramTier* vram() const { return vram_.get(); }
  // Loads every expert (resident mode) and the policy's wanted pins; with a VRAM tier that holds every expert,
  // uploads them all, and pins the wanted pins there too while room for one layer's experts is left.
  sdk::Status preload();

  // Makes the expert resident and marks it in use until release(); the weights stay valid until then. With a VRAM
  // tier the weights are in its device buffer: a VRAM miss goes through the RAM tier and uploads.
  sdk::Expected<ExpertWeights> acquire(std::int64_t layer, std::int64_t expert);
  void release(std::int64_t layer, std::int64_t expert);
  // compute.cpu_fallback: the expert's weights in RAM (read if needed), to run on the CPU backend instead of
  // uploading it; counted as a VRAM miss and a CPU run. Release with release_for_cpu(), passing the run's time.
  sdk::Expected<ExpertWeights> acquire_for_cpu(std::int64_t layer, std::int64_t expert);
  void release_for_cpu(std::int64_t layer, std::int64_t expert, double seconds);
  [[nodiscard]] bool in_vram(std::int64_t layer, std::int64_t expert) const;
  // Starts uploading an expert acquired for the CPU into a free VRAM slot, if one is free (VramTier::begin_fill):
  // the copy overlaps the CPU run, and the expert's next use hits VRAM. True when it started.
  bool fill_vram(std::int64_t layer, std::int64_t expert);
  // Runs `fn` with the expert's weights in RAM (read if needed) without counting a use, a hit or a miss: for
  // measuring (the cost model's calibration), not for running the model.
  sdk::Status with_ram_weights(std::int64_t layer, std::int64_t expert,
                               const std::function<sdk::Status(const ExpertWeights&)>& fn);

  // Queues asynchronous reads (ReadPriority::prefetch) of the experts in `wanted` that are neither resident nor in
  // flight (nothing when the storage reads synchronously). A prefetch never fails the caller and never evicts an expert
  // in use, pinned, named in `keep` (the current layer's experts) or prefetched and not used yet; without room it is
  // skipped. Returns how many it queued. A later acquire() of an expert in flight waits for that read instead of
  // reading again (single flight).
  std::size_t prefetch(std::span<const sdk::ExpertKey> wanted, std::span<const sdk::ExpertKey> keep = {});
  // Queues the reads of every expert in `needed` (one layer's routed experts) that is neither resident nor in flight,
  // all at once at demand priority, so a layer's misses share the device queue instead of being read one after
  // another; acquire() then waits for each (single flight) and counts it as a miss. Like prefetch() it never waits,
  // never evicts what is in use, pinned, needed or prefetched and not used yet, and does nothing on a synchronous
  // storage. Returns how many reads it queued.
  std::size_t fetch(std::span<const sdk::ExpertKey> needed);
  // Call once layer `layer` has acquired its experts: the prefetches of that layer (and earlier ones) still waiting
  // in the storage queue were for experts the router did not pick, so they are withdrawn and stop holding the disk
  // queue (storage interface "colibri.storage.cancel.v1"; nothing happens without it). Reads already started land
  // as usual. Returns how many it withdrew.
  std::size_t cancel_stale(std::int64_t layer);
  // With a VRAM tier: starts uploading every expert in `needed` (one layer's routed experts) that is in RAM but not
  // in VRAM, without waiting, so the copies cross the bus while the experts already in VRAM compute; acquire() then
  // waits for each. Never evicts from VRAM what is in use, pinned or needed; what finds no room, or is still being
  // read, is uploaded by acquire() as before. Returns how many uploads it started.
  std::size_t stage_uploads(std::span<const sdk::ExpertKey> needed);
  // True when acquire() of this expert would return without waiting for a read (or, with a VRAM tier, an upload).
  [[nodiscard]] bool ready(std::int64_t layer, std::int64_t expert) const;
  // expert_ffn_routed's table: W_gate, W_up, W_down of every expert of `layer` in expert order, where each runs without
  // a read, an upload or a wait: in VRAM when the tier holds every expert of the model, else (no VRAM tier) in RAM in
  // resident mode. Counts nothing: a use is settled afterwards with acquire() and release(). False, and `out`
  // empty, when one of them is not there now.
  bool routed_table(std::int64_t layer, std::vector<sdk::Tensor>& out) const;
  // Changes whenever a slot is freed (an expert's weights may then move), so a table from routed_table() holds while
  // it is unchanged.
  [[nodiscard]] std::uint64_t placement_generation() const { return freed_slots_ + (vram_ ? vram_->freed_slots() : 0); }
  // Counts router predictions against the experts the layer then used (see ExpertStats).
  void note_prediction(std::uint64_t predicted, std::uint64_t correct, std::uint64_t actual) {
    stats_.predicted += predicted;
    stats_.predicted_correct += correct;
    stats_.actual += actual;
  }
  // Experts acquired so far, by layer:expert (the usage history's counts).
  [[nodiscard]] const std::map<std::uint64_t, std::uint64_t>& usage() const { return usage_; }

  // Cache admin (colibri-server /admin/cache/*); call between forward passes, never during one.
  // Drops every resident expert that is neither in use nor pinned (prefetches in flight land first) and tells the
  // policy (on_erase). Not counted as evictions. Resident mode reloads what it needs on demand afterwards.
  CacheClearResult clear();
  // Loads `keys` in order (the most wanted first) until the budget is full. Room comes from the policy's victims,
  // never an expert in use, pinned or named in `keys`; what does not fit is counted in no_room. Loads are not
  // misses and not usage; their bytes count in bytes_read. An unknown key is an error before anything is loaded.
  sdk::Expected<CacheWarmResult> warm(std::span<const sdk::ExpertKey> keys);
  [[nodiscard]] std::size_t resident_count() const { return slots_.size() - inflight_.size(); }

  [[nodiscard]] const ExpertStats& stats() const { return stats_; }
  // Prefetch reads issued and not settled yet: still reading, or landed and not used (nor evicted) so far. With the
  // counters, prefetch_issued = used + wasted + failed + cancelled + this.
  [[nodiscard]] std::uint64_t prefetches_open() const;
  [[nodiscard]] std::uint64_t resident_bytes() const { return used_bytes_; }
  [[nodiscard]] std::uint64_t budget_bytes() const { return budget_; }

 private:
  // A slot's memory. While registered with the storage (interface "colibri.storage.buffers.v1") reads into it skip
  // per-read page pinning; while registered with the compute backend (sdk::kHostRegisterInterface) uploads read it
  // directly. It is unregistered before it is freed.
  class SlotBuffer {
   public:
    SlotBuffer() = default;
    SlotBuffer(AlignedBuffer data, sdk::StorageBuffers* registry, sdk::ComputeHostRegister* host)
        : data_(std::move(data)), registry_(registry), host_(host) {}
    ~SlotBuffer() { unregister(); }
    SlotBuffer(SlotBuffer&& o) noexcept
        : data_(std::move(o.data_)),
          registry_(std::exchange(o.registry_, nullptr)),
          host_(std::exchange(o.host_, nullptr)) {}
    SlotBuffer& operator=(SlotBuffer&& o) noexcept {
      if (this != &o) {
        unregister();
        data_ = std::move(o.data_);
        registry_ = std::exchange(o.registry_, nullptr);
        host_ = std::exchange(o.host_, nullptr);
      }
      return *this;
    }
    SlotBuffer(const SlotBuffer&) = delete;
    SlotBuffer& operator=(const SlotBuffer&) = delete;
    [[nodiscard]] std::byte* data() const { return data_.data(); }
    [[nodiscard]] std::size_t size() const { return data_.size(); }
    // Uploads may read it after copy_to_device_async returns.
    [[nodiscard]] bool host_registered() const { return host_ != nullptr; }

   private:
    void unregister() noexcept {
      if (registry_ != nullptr) registry_->unregister_buffer({data_.data(), data_.size()});
      if (host_ != nullptr) host_->unregister_host(data_.data());
      registry_ = nullptr;
      host_ = nullptr;
    }
    AlignedBuffer data_;
    sdk::StorageBuffers* registry_ = nullptr;   // non-null while registered
    sdk::ComputeHostRegister* host_ = nullptr;  // non-null while registered
  };
  // A prefetch read in flight; the storage thread sets done under mutex_.
  struct Pending {
    std::unique_ptr<sdk::StorageFile> file;
    std::chrono::steady_clock::time_point submitted;
    double read_seconds = 0;
    bool done = false;
    bool demand = false;    // queued by fetch(): a miss when acquired, not a prefetch
    std::uint64_t tag = 0;  // the request's user_tag: unique per read, so cancel() never reaches another manager's
    sdk::Status status;     // the read's, then the checksum check's (run on the storage thread)
  };
  struct Slot {
    const model::ExpertEntry* entry = nullptr;
    SlotBuffer data;
    int in_use = 0;
    bool pinned = false;
    std::shared_ptr<Pending> pending;  // non-null until the prefetch read lands and is verified
    bool prefetched_unused = false;    // landed by prefetch, not acquired yet
    bool fetched = false;              // landed by fetch(), not acquired yet
  };
  sdk::Expected<ExpertWeights> acquire_ram(std::int64_t layer, std::int64_t expert);
  void release_ram(std::int64_t layer, std::int64_t expert);
  // Takes back the use an acquire counted for a load (usage()).
  void uncount_use(sdk::ExpertKey key);
  sdk::Status preload_vram();
  sdk::Status load(const model::ExpertEntry& e, Slot& slot);
  sdk::Status verify(const model::ExpertEntry& e, const Slot& slot) const;
  sdk::Status verify(const model::ExpertEntry& e, const std::byte* data) const;
  // verify(); bytes that fail it are read again from the file's other copies (StorageCopies), the first that passes
  // kept with a warning naming the damaged copy.
  sdk::Status verify_or_other_copy(const model::ExpertEntry& e, sdk::StorageFile& file, std::byte* data) const;
  // Queues an asynchronous read of `e` into a new slot (shared by prefetch() and fetch()); false when it did not.
  bool start_read(sdk::ExpertKey key, const model::ExpertEntry& e, std::uint64_t bytes, sdk::ReadPriority priority);
  // A slot buffer of `bytes`: an evicted one of that size when there is one (no page faults, no zeroing), else new.
  SlotBuffer take_buffer(std::uint64_t bytes);
  // A new slot buffer, registered with the storage and the compute backend when they offer that (the first refusal
  // of each is logged and ends it).
  SlotBuffer new_buffer(std::uint64_t bytes);
  // After a copy into VRAM started from this slot: holds the slot until the copy is done when it reads registered
  // memory directly.
  void hold_for_copy(sdk::ExpertKey key, Slot& slot);
  // Gives back the holds whose copies are done (`wait`: waits for them all first). True when one was given back.
  bool release_copy_holds(bool wait);
  // Bytes of the RAM slot that holds `e`.
  [[nodiscard]] std::uint64_t slot_bytes(const model::ExpertEntry& e) const;
  sdk::Status make_room(std::uint64_t bytes);
  // make_room's error when nothing can go: the policy's fault when it named nothing evictable while something was,
  // else the budget's (and the pins' share of it).
  sdk::Status no_room_error(const std::optional<sdk::ExpertKey>& victim);
  // make_room under the prefetch rules (no waiting; `keep` and unused reads are not evicted); true when it fits.
  bool make_room_sparing(std::uint64_t bytes, std::span<const sdk::ExpertKey> keep);
  // Waits for every prefetch in flight and settles it (admin operations see a quiet cache).
  void settle_prefetches();
  // Settles landed prefetches (verify, hand to the policy); `only` limits it to one key.
  void reap(const std::uint64_t* only = nullptr);
  void erase_slot(std::map<std::uint64_t, Slot>::iterator it);
  static bool evictable(void* ctx, sdk::ExpertKey key) noexcept;
  ExpertWeights weights_of(const Slot& slot) const;

  const model::Manifest& manifest_;
  std::filesystem::path dir_;
  std::shared_ptr<sdk::Storage> storage_;
  std::string storage_name_;  // the storage plugin's, for errors about the bytes it returned
  std::string policy_name_;   // the cache policy plugin's, for errors about its victims
  // manifest.json as it was at load (device, inode, size, mtime): an expert that then fails to read is explained by a
  // model replaced on disk (convert --force under a running server), whose fix is a restart, not a re-convert.
  std::array<std::int64_t, 4> manifest_identity_{};
  [[nodiscard]] std::array<std::int64_t, 4> manifest_identity() const;
  [[nodiscard]] sdk::Status explain_replaced(sdk::Status s) const;
  sdk::Status load_from_disk(const model::ExpertEntry& e, Slot& slot);
  std::shared_ptr<sdk::CachePolicy> policy_;
  std::uint64_t budget_ = 0;
  std::uint64_t used_bytes_ = 0;
  bool resident_ = false;
  std::uint64_t slot_bytes_ = 0;  // streaming: every RAM slot's size (the largest expert's); 0: each expert's own
  bool async_storage_ = false;    // the storage overlaps submitted reads (else prefetch is skipped)
  sdk::StorageCancel* cancel_ = nullptr;    // the storage's cancel interface, when it offers one
  sdk::StorageCopies* copies_ = nullptr;    // the storage's other copies of a file (stripe's mirrors), when it has them
  sdk::StorageBuffers* buffers_ = nullptr;  // the storage's buffer registration, while it accepts ours
  // The compute backend's host registration (VRAM tier, not every expert in VRAM), while it accepts ours.
  sdk::ComputeHostRegister* host_register_ = nullptr;
  // Experts whose RAM slot an upload from registered memory may still read: held in use until the copy is done.
  std::vector<sdk::ExpertKey> copy_holds_;
  // Experts acquired from RAM because VRAM admission turned them away, with how many acquires are unreleased.
  std::map<std::uint64_t, int> bypassed_;
  std::map<std::uint64_t, Slot> slots_;  // by ExpertKey::packed()
  std::uint64_t freed_slots_ = 0;        // RAM slots erased so far (placement_generation)
  ExpertStats stats_;
  std::map<std::uint64_t, std::uint64_t> usage_;
  std::vector<std::uint64_t> inflight_;           // keys with a pending prefetch
  bool prefetch_eviction_ = false;                // make_room on behalf of a prefetch (stricter evictable())
  std::span<const sdk::ExpertKey> keep_;          // during a prefetch: experts it must not evict
  std::mutex mutex_;                              // guards Pending::done/status/read_seconds
  mutable std::mutex warned_mutex_;               // verify_or_other_copy runs on the storage thread too
  mutable std::set<std::string> warned_damaged_;  // damaged copies already warned about
  // Buffers of evicted slots kept for the next load. Resident plus spare bytes never exceed the budget: a spare is
  // made by an eviction and reused by the load that needed the room, or freed before a new buffer is allocated.
  std::vector<SlotBuffer> spare_;
  std::condition_variable landed_;
  std::unique_ptr<VramTier> vram_;  // last: it counts into stats_
};

}  // namespace colibri::engine
