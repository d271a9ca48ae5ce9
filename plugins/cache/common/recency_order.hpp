// Shared by the in-tree cache policies (header-only, compiled into each plugin): entries ordered
// by recency, O(1) touch and erase, and the entries the core pinned, which are never offered as
// victims.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace colibri::plugins::cache_common {

class RecencyOrder {
 public:
  // Inserts the key or makes it the most recently used.
  void touch(std::uint64_t key) noexcept {
    try {
      auto it = where_.find(key);
      if (it != where_.end()) {
        order_.splice(order_.begin(), order_, it->second);
      } else {
        order_.push_front(key);
        where_.emplace(key, order_.begin());
      }
    } catch (...) {  // out of memory: the entry is simply not tracked (never a victim)
    }
  }
  [[nodiscard]] bool contains(std::uint64_t key) const noexcept { return where_.count(key) != 0; }
  void erase(std::uint64_t key) noexcept {
    auto it = where_.find(key);
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
    pinned_.erase(key);
  }
  void set_pinned(std::uint64_t key, bool pinned) noexcept {
    try {
      if (pinned) {
        pinned_.insert(key);
      } else {
        pinned_.erase(key);
      }
    } catch (...) {
    }
  }
  void clear() noexcept {
    order_.clear();
    where_.clear();
    pinned_.clear();
  }
  // The first unpinned key, from the least recently used on, that `accept` takes.
  template <typename Accept>
  std::optional<std::uint64_t> coldest(Accept&& accept) const noexcept {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (!pinned_.count(*it) && accept(*it)) return *it;
    }
    return std::nullopt;
  }

 private:
  std::list<std::uint64_t> order_;  // front = most recently used
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> where_;
  std::unordered_set<std::uint64_t> pinned_;
};

}  // namespace colibri::plugins::cache_common
