// cache kind: a replacement policy, not a store. The core owns memory and slots; the policy hears
// about inserts, accesses, pins and erasures and picks victims among entries the core says are
// evictable (not pinned, not in use). A pinned entry is never offered.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "colibri/sdk/plugin.hpp"

namespace colibri::sdk {

struct ExpertKey {
  std::uint32_t layer = 0;
  std::uint32_t expert = 0;

  [[nodiscard]] constexpr std::uint64_t packed() const noexcept {
    return (static_cast<std::uint64_t>(layer) << 32) | expert;
  }
  static constexpr ExpertKey unpack(std::uint64_t v) noexcept {
    return {static_cast<std::uint32_t>(v >> 32), static_cast<std::uint32_t>(v & 0xffffffffu)};
  }
  friend constexpr bool operator==(ExpertKey a, ExpertKey b) noexcept { return a.packed() == b.packed(); }
  friend constexpr auto operator<=>(ExpertKey a, ExpertKey b) noexcept { return a.packed() <=> b.packed(); }
};

// Asks the core whether a resident entry may be evicted right now.
struct EvictablePredicate {
  bool (*fn)(void* ctx, ExpertKey key) noexcept = nullptr;
  void* ctx = nullptr;
  bool operator()(ExpertKey key) const noexcept { return fn != nullptr && fn(ctx, key); }
};

class CachePolicy : public PluginObject {
 public:
  // The entry became resident: read for a use (on_access follows), ahead of need by a prefetch (on_access follows
  // when it is used; on_erase may come first when the guess was wrong), or loaded by preload/warm. Not a use.
  virtual void on_insert(ExpertKey key, std::uint64_t bytes) noexcept = 0;
  // One use of a resident entry, hit or miss: every use is reported exactly once.
  virtual void on_access(ExpertKey key) noexcept = 0;
  // The entry left the cache (evicted or cleared).
  virtual void on_erase(ExpertKey key) noexcept = 0;
  virtual void on_pin(ExpertKey /*key*/, bool /*pinned*/) noexcept {}

  // The resident entry to evict next among those `evictable` accepts; nullopt when none is.
  virtual std::optional<ExpertKey> pick_victim(const EvictablePredicate& evictable) noexcept = 0;

  // Entries this policy wants pinned for the whole run (the `pinned` policy's list).
  [[nodiscard]] virtual std::vector<ExpertKey> wanted_pins() const noexcept { return {}; }

  // Forgets all state; afterwards the policy holds no entries.
  virtual void clear() noexcept = 0;
};

}  // namespace colibri::sdk
