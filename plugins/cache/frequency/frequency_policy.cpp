// cache/frequency: least frequently used with exponential decay. Each access adds 1 to an entry's
// score and every score halves every `half_life` accesses (of any entry), so experts that were hot
// long ago fade out. The victim is the lowest score; ties go to the least recently used.
//
// Decay without touching every entry: an access at clock t adds 2^(t / half_life) instead of 1,
// which orders entries exactly as decayed scores would. When the weights grow large, every score
// is scaled down by the same factor (order unchanged).
#include <cmath>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "colibri/sdk/sdk.hpp"

namespace {

using namespace colibri::sdk;

class FrequencyPolicy final : public CachePolicy {
 public:
  static Expected<std::unique_ptr<FrequencyPolicy>> create(const CreateContext& ctx) {
    auto half_life = ctx.config->get_int("half_life", 1000);
    if (!half_life) return half_life.error();
    if (*half_life < 1) {
      return Status(StatusCode::invalid_argument,
                    "cache.half_life is " + std::to_string(*half_life) + "; it counts accesses and must be >= 1");
    }
    return std::make_unique<FrequencyPolicy>(static_cast<double>(*half_life));
  }

  explicit FrequencyPolicy(double half_life) : half_life_(half_life) {}

  void on_insert(ExpertKey key, std::uint64_t) noexcept override { bump(key); }
  void on_access(ExpertKey key) noexcept override {
    if (entries_.count(key.packed())) bump(key);
  }
  void on_erase(ExpertKey key) noexcept override {
    auto it = entries_.find(key.packed());
    if (it == entries_.end()) return;
    order_.erase(rank_of(it->first, it->second));
    entries_.erase(it);
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
    for (const Rank& r : order_) {  // lowest score first, then oldest access
      if (pinned_.count(r.key)) continue;
      const ExpertKey k = ExpertKey::unpack(r.key);
      if (evictable(k)) return k;
    }
    return std::nullopt;
  }
  void clear() noexcept override {
    order_.clear();
    entries_.clear();
    pinned_.clear();
    clock_ = 0;
    base_ = 0;
  }

 private:
  struct Entry {
    double score = 0;
    std::uint64_t last = 0;  // clock of the latest access: the tie-break
  };
  struct Rank {
    double score;
    std::uint64_t last;
    std::uint64_t key;
    bool operator<(const Rank& o) const {
      if (score != o.score) return score < o.score;
      if (last != o.last) return last < o.last;
      return key < o.key;
    }
  };
  static Rank rank_of(std::uint64_t key, const Entry& e) { return Rank{e.score, e.last, key}; }

  void bump(ExpertKey key) noexcept {
    try {
      ++clock_;
      // Weight relative to base_, the clock of the last rescale, so it stays representable.
      double weight = std::exp2(static_cast<double>(clock_ - base_) / half_life_);
      if (weight > 0x1p500) {
        rescale(weight);
        weight = 1.0;
      }
      const auto p = key.packed();
      auto it = entries_.find(p);
      if (it == entries_.end()) {
        it = entries_.emplace(p, Entry{}).first;
      } else {
        order_.erase(rank_of(p, it->second));
      }
      it->second.score += weight;
      it->second.last = clock_;
      order_.insert(rank_of(p, it->second));
    } catch (...) {  // out of memory: the entry is not tracked (never a victim)
    }
  }

  // Divides every score by `factor` (the current weight) and makes the current clock the base.
  void rescale(double factor) {
    std::set<Rank> rescaled;
    for (auto& [key, e] : entries_) {
      e.score /= factor;
      rescaled.insert(rank_of(key, e));
    }
    order_.swap(rescaled);
    base_ = clock_;
  }

  double half_life_;
  std::uint64_t clock_ = 0;
  std::uint64_t base_ = 0;
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::set<Rank> order_;
  std::unordered_set<std::uint64_t> pinned_;
};

Score score(const HostInfo&) noexcept {
  return {50, "LFU with exponential decay"};
}

const OptionSpec kOptions[] = {
    {"half_life", OptionType::integer, "1000", "accesses after which an access counts half as much"},
};
const char* const kCapabilities[] = {"frequency", "decay", "recency_tiebreak"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::cache,
    "frequency",
    "1.0.0",
    "least frequently used with exponential decay, recency breaks ties",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<FrequencyPolicy>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
