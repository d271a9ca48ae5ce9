// cache/lru: evicts the least recently used evictable entry. O(1) per access; a victim search
// walks from the cold end past entries that are in use or pinned.
#include "colibri/sdk/sdk.hpp"
#include "recency_order.hpp"

namespace {

using namespace colibri::sdk;

class LruPolicy final : public CachePolicy {
 public:
  static Expected<std::unique_ptr<LruPolicy>> create(const CreateContext&) { return std::make_unique<LruPolicy>(); }

  void on_insert(ExpertKey key, std::uint64_t) noexcept override { order_.touch(key.packed()); }
  void on_access(ExpertKey key) noexcept override {
    if (order_.contains(key.packed())) order_.touch(key.packed());
  }
  void on_erase(ExpertKey key) noexcept override { order_.erase(key.packed()); }
  void on_pin(ExpertKey key, bool pinned) noexcept override { order_.set_pinned(key.packed(), pinned); }
  std::optional<ExpertKey> pick_victim(const EvictablePredicate& evictable) noexcept override {
    auto v = order_.coldest([&](std::uint64_t k) { return evictable(ExpertKey::unpack(k)); });
    if (!v) return std::nullopt;
    return ExpertKey::unpack(*v);
  }
  void clear() noexcept override { order_.clear(); }

 private:
  colibri::plugins::cache_common::RecencyOrder order_;
};

Score score(const HostInfo&) noexcept {
  return {100, ""};
}

const char* const kCapabilities[] = {"recency"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),       PluginKind::cache, "lru", "1.0.0", "least recently used", {}, kCapabilities, &score,
    &create_guarded<LruPolicy>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
