// Offline replay of a routing trace through cache policies, and Belady's clairvoyant optimum as the upper bound.
//
// CacheSim follows the expert manager's rules exactly (core/src/engine/expert_manager.cpp), without memory or I/O,
// with an asynchronous storage (every storage plugin is one):
// - a budget in bytes; each resident expert takes its size rounded up to 4096 (the manager's aligned slot), or, when
//   streaming, the largest expert's slot;
// - resident mode when the sum of all expert sizes fits the budget: everything is loaded at start, never evicted;
// - preload acquires and pins the policy's wanted_pins() (counted as misses, as the manager counts them);
// - fetch: the misses of one layer's step are read together, in order, while room can be made without evicting
//   an expert in use, pinned, read and not yet used, or needed by this step (on_erase for each victim); the policy
//   hears of a read (on_insert) when the next acquire starts, as the manager hears of it when a read has landed;
// - acquire: a resident expert is a hit (in use + on_access); a fetched one a miss (on_access); any other a miss
//   that makes room among experts neither in use nor pinned, then inserts (on_insert with the unrounded size,
//   on_access);
// - release ends the in-use mark.
// Replay runs each access group as Engine::moe runs one sparse layer of one forward pass: fetch the group's
// experts, then acquire and release them one at a time, those resident before the fetch first, each part in
// ascending expert id. tests/unit/ab/equivalence_test.cpp drives CacheSim and ExpertManager in that way and checks
// identical hit/miss sequences, and tests/integration/ab/ab_test.py checks a replayed bench trace against the run's
// own counts; keep them in step when the manager's or the engine's rules change. Prefetch (prefetch.layers) is
// not replayed: the replay is a run with prefetch.layers 0.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "colibri/ab/trace.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/sdk/cache_policy.hpp"

namespace colibri::ab {

// Expert sizes: from a model manifest, or one size for all (0: unknown, slots counted as 1 unit each).
class ExpertSizes {
 public:
  static ExpertSizes uniform(std::uint64_t bytes) { return ExpertSizes(bytes, nullptr); }
  static ExpertSizes from_manifest(const model::Manifest& m) { return ExpertSizes(0, &m); }
  // Bytes read for the expert; nullopt when the manifest lacks it.
  [[nodiscard]] std::optional<std::uint64_t> read_bytes(sdk::ExpertKey k) const;
  // Budget units one resident expert takes.
  [[nodiscard]] std::optional<std::uint64_t> slot_bytes(sdk::ExpertKey k) const;
  [[nodiscard]] bool known() const { return manifest_ != nullptr || bytes_ > 0; }
  [[nodiscard]] const model::Manifest* manifest() const { return manifest_; }

 private:
  ExpertSizes(std::uint64_t bytes, const model::Manifest* m) : bytes_(bytes), manifest_(m) {}
  std::uint64_t bytes_;
  const model::Manifest* manifest_;
};

struct SimStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;  // includes preload loads, like the manager's counter
  std::uint64_t preload_loads = 0;
  std::uint64_t evictions = 0;
  std::uint64_t bytes_read = 0;
};

class CacheSim {
 public:
  // `universe`: every expert the model has (resident mode loads them all).
  CacheSim(std::shared_ptr<sdk::CachePolicy> policy, std::uint64_t budget_bytes, const ExpertSizes& sizes,
           std::vector<sdk::ExpertKey> universe);
  ~CacheSim();
  CacheSim(const CacheSim&) = delete;
  CacheSim& operator=(const CacheSim&) = delete;

  [[nodiscard]] bool resident() const { return resident_; }
  sdk::Status preload();
  // Reads the misses among `needed` ahead of their acquire while room can be made (ExpertManager::fetch).
  // Returns how many it read.
  std::size_t fetch(std::span<const sdk::ExpertKey> needed);
  // True for a hit.
  sdk::Expected<bool> acquire(sdk::ExpertKey key);
  void release(sdk::ExpertKey key);
  [[nodiscard]] const SimStats& stats() const { return stats_; }
  [[nodiscard]] bool is_resident(sdk::ExpertKey key) const { return slots_.count(key.packed()) != 0; }
  // Resident and not a read fetch() made for a use still to come (ExpertManager::ready).
  [[nodiscard]] bool ready(sdk::ExpertKey key) const;

 private:
  struct Slot {
    std::uint64_t bytes = 0;
    int in_use = 0;
    bool pinned = false;
    bool fetched = false;  // read by fetch() and not yet acquired
  };
  sdk::Status make_room(std::uint64_t bytes);
  static bool evictable(void* ctx, sdk::ExpertKey key) noexcept;
  static bool evictable_sparing(void* ctx, sdk::ExpertKey key) noexcept;
  void tell_fetched();
  std::vector<sdk::ExpertKey> untold_;         // fetched, the policy not told yet (the manager's reads in flight)
  std::span<const sdk::ExpertKey> sparing_{};  // during fetch: the step's experts

  std::shared_ptr<sdk::CachePolicy> policy_;
  std::uint64_t budget_;
  const ExpertSizes& sizes_;
  std::vector<sdk::ExpertKey> universe_;
  bool resident_ = false;
  std::uint64_t stream_slot_ = 0;  // not resident: the one slot size (the largest expert's); 0: each expert's own
  [[nodiscard]] std::uint64_t slot_of(sdk::ExpertKey key) const;
  std::uint64_t used_ = 0;
  std::unordered_map<std::uint64_t, Slot> slots_;
  SimStats stats_;
};

// A trace flattened for replay into access groups, one per sparse layer of one forward pass: consecutive records
// with the same step and layer (records without a step are a group each). A group's accesses are its distinct
// experts in ascending id, keys[begin[g] .. begin[g+1]), as the engine acquires each routed expert once per layer
// and pass, whatever the number of tokens routed to it.
struct AccessSequence {
  std::vector<sdk::ExpertKey> keys;
  std::vector<std::size_t> begin;         // groups + 1 entries
  std::vector<std::size_t> first_record;  // per group: the index of its first trace record
  std::uint32_t layers = 0;               // max layer + 1
  std::size_t records = 0;                // trace records
  [[nodiscard]] std::size_t groups() const { return begin.empty() ? 0 : begin.size() - 1; }
  static AccessSequence from_trace(const std::vector<TraceRecord>& trace);
};

struct LayerStats {
  std::uint64_t hits = 0, misses = 0, bytes_read = 0;
};

struct ReplayResult {
  std::string policy;                 // "optimal" for Belady
  SimStats stats;                     // hits and misses of trace accesses; preload_loads apart; bytes_read of both
  std::vector<LayerStats> per_layer;  // trace accesses only (no preload)
  std::uint64_t accesses = 0;
  // Every expert read, preload included: never below the optimum's.
  [[nodiscard]] std::uint64_t reads() const { return stats.misses + stats.preload_loads; }
  // Hits over trace accesses, as a run reports it.
  [[nodiscard]] double hit_rate() const {
    return accesses == 0 ? 0 : static_cast<double>(stats.hits) / static_cast<double>(accesses);
  }
};

// One access group as Engine::moe runs a sparse layer: fetch the group's misses, then acquire and release each
// expert, those ready (resident before the fetch) first, in ascending id within each part. `seen(key, hit)` after
// each access. `group`: distinct keys in ascending id (AccessSequence's groups are).
sdk::Status replay_group(CacheSim& sim, std::span<const sdk::ExpertKey> group,
                         const std::function<void(sdk::ExpertKey, bool)>& seen);

// Replays through a policy. Errors: a cache too small for its pinned experts or for one expert, an expert the
// manifest lacks.
sdk::Expected<ReplayResult> replay(const AccessSequence& seq, std::shared_ptr<sdk::CachePolicy> policy,
                                   std::string name, std::uint64_t budget_bytes, const ExpertSizes& sizes,
                                   const std::vector<sdk::ExpertKey>& universe);

// Belady's MIN with `slots` experts: on a miss with a full cache, evicts the resident expert whose next use lies
// farthest in the future. Cold start; no pins. Within a group, the experts resident at its start first, then the
// others, those needed latest first (the order only matters when a group's experts do not all fit). The fewest
// reads a policy can make, also one that preloads; the replay's property test checks it on random traces.
sdk::Expected<ReplayResult> belady(const AccessSequence& seq, std::uint64_t slots, const ExpertSizes& sizes);

// Every expert: the manifest's, else the distinct ones of the sequence.
std::vector<sdk::ExpertKey> universe_of(const AccessSequence& seq, const ExpertSizes& sizes);

}  // namespace colibri::ab
