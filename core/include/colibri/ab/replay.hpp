// Offline replay of a routing trace through cache policies, and Belady's clairvoyant optimum as the upper bound.
//
// CacheSim follows the expert manager's rules exactly (core/src/engine/expert_manager.cpp), without memory or I/O:
// - a budget in bytes; each resident expert takes its size rounded up to 4096 (the manager's aligned slot);
// - resident mode when the sum of all expert sizes fits the budget: everything is loaded at start, never evicted;
// - preload acquires and pins the policy's wanted_pins() (counted as misses, as the manager counts them);
// - acquire: a resident expert is a hit (in use + on_access); a miss makes room by asking the policy for victims
//   among experts neither in use nor pinned (on_erase for each), then inserts (on_insert with the unrounded size);
// - release ends the in-use mark.
// Replay acquires the experts of one trace record together and releases them after, as the engine does for a token
// in a sparse layer. tests/unit/ab/equivalence_test.cpp drives CacheSim and ExpertManager with the same accesses and
// checks identical hit/miss sequences; keep both in step when the manager's rules change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
  // True for a hit.
  sdk::Expected<bool> acquire(sdk::ExpertKey key);
  void release(sdk::ExpertKey key);
  [[nodiscard]] const SimStats& stats() const { return stats_; }
  [[nodiscard]] bool is_resident(sdk::ExpertKey key) const { return slots_.count(key.packed()) != 0; }

 private:
  struct Slot {
    std::uint64_t bytes = 0;
    int in_use = 0;
    bool pinned = false;
  };
  sdk::Status make_room(std::uint64_t bytes);
  static bool evictable(void* ctx, sdk::ExpertKey key) noexcept;

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

// A trace flattened for replay: record r's accesses are keys[begin[r] .. begin[r+1]).
struct AccessSequence {
  std::vector<sdk::ExpertKey> keys;
  std::vector<std::size_t> begin;  // records + 1 entries
  std::uint32_t layers = 0;        // max layer + 1
  [[nodiscard]] std::size_t records() const { return begin.empty() ? 0 : begin.size() - 1; }
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

// Replays through a policy. Errors: a cache too small for one record's experts, an expert the manifest lacks.
sdk::Expected<ReplayResult> replay(const AccessSequence& seq, std::shared_ptr<sdk::CachePolicy> policy,
                                   std::string name, std::uint64_t budget_bytes, const ExpertSizes& sizes,
                                   const std::vector<sdk::ExpertKey>& universe);

// Belady's MIN with `slots` experts: on a miss with a full cache, evicts the resident expert (not in the current
// record) whose next use lies farthest in the future. Cold start; no pins. Optimal in misses for any policy, also
// ones that preload.
sdk::Expected<ReplayResult> belady(const AccessSequence& seq, std::uint64_t slots, const ExpertSizes& sizes);

// Every expert: the manifest's, else the distinct ones of the sequence.
std::vector<sdk::ExpertKey> universe_of(const AccessSequence& seq, const ExpertSizes& sizes);

}  // namespace colibri::ab
