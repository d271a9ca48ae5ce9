// cache/lru: evicts the least recently used evictable entry. O(1) per access; a victim search
// walks from the cold end past entries that are in use or pinned.
#include <list>
#include <unordered_map>
#include <unordered_set>

#include "colibri/sdk/sdk.hpp"

namespace {

using namespace colibri::sdk;

class LruPolicy final : public CachePolicy {
 public:
  static Expected<std::unique_ptr<LruPolicy>> create(const CreateContext&) { return std::make_unique<LruPolicy>(); }

  void on_insert(ExpertKey key, std::uint64_t) noexcept override { touch(key); }
  void on_access(ExpertKey key) noexcept override {
    if (where_.count(key.packed())) touch(key);
  }
  void on_erase(ExpertKey key) noexcept override {
    auto it = where_.find(key.packed());
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
    pinned_.erase(key.packed());
  }
  void on_pin(ExpertKey key, bool pinned) noexcept override {
    try {
      if (pinned) {
        pinned_.insert(key.packed());
      } else {
        pinned_.erase(key.packed());
      }
    } catch (...) {
    }
  }
  std::optional<ExpertKey> pick_victim(const EvictablePredicate& evictable) noexcept override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {  // back = least recently used
      const ExpertKey k = ExpertKey::unpack(*it);
      if (!pinned_.count(*it) && evictable(k)) return k;
    }
    return std::nullopt;
  }
  void clear() noexcept override {
    order_.clear();
    where_.clear();
    pinned_.clear();
  }

 private:
  void touch(ExpertKey key) noexcept {
    try {
      const auto p = key.packed();
      auto it = where_.find(p);
      if (it != where_.end()) {
        order_.splice(order_.begin(), order_, it->second);
      } else {
        order_.push_front(p);
        where_.emplace(p, order_.begin());
      }
    } catch (...) {  // out of memory: the entry is simply not tracked (never a victim)
    }
  }

  std::list<std::uint64_t> order_;  // front = most recently used
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> where_;
  std::unordered_set<std::uint64_t> pinned_;
};

Score score(const HostInfo&) noexcept { return {100, ""}; }

const char* const kCapabilities[] = {"recency"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::cache,
    "lru",
    "1.0.0",
    "least recently used",
    {},
    kCapabilities,
    &score,
    &create_guarded<LruPolicy>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
