// The expert manager: owns the memory of routed experts (one slot per resident blob), reads misses through the
// storage plugin with ONE request per blob, and follows the cache-policy contract (sdk/cache_policy.hpp): the policy
// hears inserts, accesses and erasures and picks victims among entries that are not in use and not pinned.
// When the budget holds every expert, all are loaded at start (resident mode) and none is ever evicted.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "colibri/engine/memory.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/storage.hpp"

namespace colibri::engine {

struct ExpertWeights {
  sdk::Tensor gate, up, down;  // GGML order: gate/up {D, F}, down {F, D}
};

struct ExpertStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t bytes_read = 0;
  double stall_seconds = 0;  // time demand reads kept the forward pass waiting
  [[nodiscard]] double hit_rate() const {
    return hits + misses == 0 ? 1.0 : static_cast<double>(hits) / static_cast<double>(hits + misses);
  }
};

class ExpertManager {
 public:
  // budget_bytes: RAM for expert slots. Experts are checked against their manifest checksums when read.
  ExpertManager(const model::Manifest& manifest, std::filesystem::path model_dir, std::shared_ptr<sdk::Storage> storage,
                std::shared_ptr<sdk::CachePolicy> policy, std::uint64_t budget_bytes);
  ~ExpertManager();
  ExpertManager(const ExpertManager&) = delete;
  ExpertManager& operator=(const ExpertManager&) = delete;

  // True when every expert fits the budget (resident mode).
  [[nodiscard]] bool resident() const { return resident_; }
  // Loads every expert (resident mode) and the policy's wanted pins.
  sdk::Status preload();

  // Makes the expert resident and marks it in use until release(); the weights stay valid until then.
  sdk::Expected<ExpertWeights> acquire(std::int64_t layer, std::int64_t expert);
  void release(std::int64_t layer, std::int64_t expert);

  [[nodiscard]] const ExpertStats& stats() const { return stats_; }
  [[nodiscard]] std::uint64_t resident_bytes() const { return used_bytes_; }
  [[nodiscard]] std::uint64_t budget_bytes() const { return budget_; }

 private:
  struct Slot {
    const model::ExpertEntry* entry = nullptr;
    AlignedBuffer data;
    int in_use = 0;
    bool pinned = false;
  };
  sdk::Status load(const model::ExpertEntry& e, Slot& slot);
  sdk::Status make_room(std::uint64_t bytes);
  static bool evictable(void* ctx, sdk::ExpertKey key) noexcept;
  ExpertWeights weights_of(const Slot& slot) const;

  const model::Manifest& manifest_;
  std::filesystem::path dir_;
  std::shared_ptr<sdk::Storage> storage_;
  std::shared_ptr<sdk::CachePolicy> policy_;
  std::uint64_t budget_ = 0;
  std::uint64_t used_bytes_ = 0;
  bool resident_ = false;
  std::map<std::uint64_t, Slot> slots_;  // by ExpertKey::packed()
  ExpertStats stats_;
};

}  // namespace colibri::engine
