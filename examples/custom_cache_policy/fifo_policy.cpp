// cache/fifo: evicts the entry that was inserted first, whatever happened since. A deliberately
// simple policy showing the whole plugin contract: descriptor, options, score, create, logging.
#include <deque>
#include <unordered_set>

#include "colibri/sdk/sdk.hpp"

namespace {

using namespace colibri::sdk;

class FifoPolicy final : public CachePolicy {
 public:
  static Expected<std::unique_ptr<FifoPolicy>> create(const CreateContext& ctx) {
    auto log = ctx.config->get_bool("log_evictions", false);
    if (!log) return log.error();
    ctx.host->debug("fifo policy created");
    return std::make_unique<FifoPolicy>(*ctx.host, *log);
  }
  FifoPolicy(HostServices& host, bool log_evictions) : host_(host), log_evictions_(log_evictions) {}

  void on_insert(ExpertKey key, std::uint64_t) noexcept override {
    try {
      if (resident_.insert(key.packed()).second) order_.push_back(key.packed());
    } catch (...) {
    }
  }
  void on_access(ExpertKey) noexcept override {}  // FIFO ignores hits
  void on_erase(ExpertKey key) noexcept override {
    resident_.erase(key.packed());
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
    // Erased entries are dropped lazily from the front of the queue.
    while (!order_.empty() && !resident_.count(order_.front())) order_.pop_front();
    for (auto packed : order_) {
      const ExpertKey k = ExpertKey::unpack(packed);
      if (resident_.count(packed) && !pinned_.count(packed) && evictable(k)) {
        if (log_evictions_) host_.info("evicting L" + std::to_string(k.layer) + "/E" + std::to_string(k.expert));
        return k;
      }
    }
    return std::nullopt;
  }
  void clear() noexcept override {
    order_.clear();
    resident_.clear();
    pinned_.clear();
  }

 private:
  HostServices& host_;
  bool log_evictions_;
  std::deque<std::uint64_t> order_;
  std::unordered_set<std::uint64_t> resident_;
  std::unordered_set<std::uint64_t> pinned_;
};

Score score(const HostInfo&) noexcept {
  return {10, ""};
}

const OptionSpec kOptions[] = {{"log_evictions", OptionType::boolean, "false", "log every eviction at info level"}};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::cache,
    "fifo",
    "0.1.0",
    "first in, first out (example third-party plugin)",
    kOptions,
    {},
    &score,
    &create_guarded<FifoPolicy>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
