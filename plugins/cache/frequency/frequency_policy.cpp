// cache/frequency: least frequently used with exponential decay. Each use (on_access) adds 1 to an
// expert's score and every score halves every `half_life` uses (of any expert), so experts that were
// hot long ago fade out. The victim is the resident expert with the lowest score; ties go to the least
// recently used. `half_life: auto` (the default) is 8 uses per distinct expert used so far, so the
// window holds the same few uses of each expert whether the model has 128 experts or 6000.
//
// Scores outlive eviction (`history`): when the cache holds fewer experts than one token walks through
// (streaming), every expert is evicted before its next use, so a score counted only while resident is
// always 1 and LFU degenerates into LRU, which never hits on that cyclic walk. Remembered scores keep
// the experts used most in the cache and let the rarely used ones pass through it.
//
// An insert is provisionally credited as one use, so an expert read ahead of need (prefetch) ranks like
// one just used until it is used; the first use takes the credit over, and an erase before any use
// takes it back, so a wrong guess leaves no trace in the history.
//
// Decay without touching every entry: a use at clock t adds 2^(t / half_life) instead of 1, which
// orders entries exactly as decayed scores would. When the weights grow large, every score is scaled
// down by the same factor (order unchanged).
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
    auto half_life = ctx.config->get_int("half_life", 0);  // absent or `auto`: 0
    if (!half_life) return half_life.error();
    if (*half_life < 1 && (ctx.config->contains("half_life") && !ctx.config->is_auto("half_life"))) {
      return Status(StatusCode::invalid_argument,
                    "cache.half_life is " + std::to_string(*half_life) + "; it counts uses and must be >= 1, or auto");
    }
    auto history = ctx.config->get_bool("history", true);
    if (!history) return history.error();
    return std::make_unique<FrequencyPolicy>(static_cast<double>(*half_life), *history);
  }

  // half_life 0: auto.
  FrequencyPolicy(double half_life, bool history)
      : auto_half_life_(half_life <= 0), half_life_(auto_half_life_ ? kUsesPerExpert : half_life), history_(history) {}

  void on_insert(ExpertKey key, std::uint64_t) noexcept override {
    try {
      const auto p = key.packed();
      auto it = entries_.find(p);
      if (it == entries_.end()) {
        it = entries_.emplace(p, Entry{}).first;
      } else if (it->second.resident) {
        order_.erase(rank_of(p, it->second));
      }
      Entry& e = it->second;
      e.resident = true;
      e.credit = current_weight();
      e.last = clock_;
      order_.insert(rank_of(p, e));
    } catch (...) {  // out of memory: the entry is not tracked (never a victim)
    }
  }
  void on_access(ExpertKey key) noexcept override {
    try {
      const auto p = key.packed();
      auto it = entries_.find(p);
      if (it == entries_.end() || !it->second.resident) return;
      if (auto_half_life_ && used_.insert(p).second) follow_expert_count();
      Entry& e = it->second;
      order_.erase(rank_of(p, e));
      ++clock_;
      const double weight = current_weight();
      e.score += weight;
      e.credit = 0;  // the first use after an insert replaces its provisional credit
      e.last = clock_;
      order_.insert(rank_of(p, e));
      if (weight > 0x1p500) rescale(weight);
    } catch (...) {
    }
  }
  void on_erase(ExpertKey key) noexcept override {
    const auto p = key.packed();
    pinned_.erase(p);
    auto it = entries_.find(p);
    if (it == entries_.end() || !it->second.resident) return;
    order_.erase(rank_of(p, it->second));
    Entry& e = it->second;
    e.credit = 0;  // never used while resident: the insert was not a use
    e.resident = false;
    if (!history_ || e.score <= 0) entries_.erase(it);
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
    for (const Rank& r : order_) {  // lowest score first, then oldest use
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
    used_.clear();
    clock_ = 0;
    base_ = 0;
    if (auto_half_life_) half_life_ = kUsesPerExpert;
  }

 private:
  struct Entry {
    double score = 0;        // decayed uses, kept after eviction when history_ is on
    double credit = 0;       // the provisional use of an insert, until the first use or the erase; kept apart from
                             // score so that a score never depends on when the insert came (the same bits either way)
    std::uint64_t last = 0;  // clock of the latest use or insert: the tie-break
    bool resident = false;
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
  static Rank rank_of(std::uint64_t key, const Entry& e) { return Rank{e.score + e.credit, e.last, key}; }

  // Weight of a use now, relative to base_ (the clock of the last rescale), so it stays representable.
  [[nodiscard]] double current_weight() const { return std::exp2(static_cast<double>(clock_ - base_) / half_life_); }

  // Auto half-life: kUsesPerExpert uses per distinct expert used, changed when that count has grown by a quarter
  // (a rescale each time, so a few dozen in all). Scores carry over exactly: weights restart at 1 from now on.
  void follow_expert_count() {
    const double wanted = kUsesPerExpert * static_cast<double>(used_.size());
    if (wanted < half_life_ * 1.25) return;
    rescale(current_weight());
    half_life_ = wanted;
  }

  // Divides every score (remembered ones too) by `factor` and makes the current clock the base.
  void rescale(double factor) {
    std::set<Rank> rescaled;
    for (auto& [key, e] : entries_) {
      e.score /= factor;
      e.credit /= factor;
      if (e.resident) rescaled.insert(rank_of(key, e));
    }
    order_.swap(rescaled);
    base_ = clock_;
  }

  static constexpr double kUsesPerExpert = 8;
  bool auto_half_life_;
  double half_life_;
  bool history_;
  std::unordered_set<std::uint64_t> used_;  // distinct experts used (auto half-life)
  std::uint64_t clock_ = 0;
  std::uint64_t base_ = 0;
  std::unordered_map<std::uint64_t, Entry> entries_;  // resident entries, and evicted ones with a score
  std::set<Rank> order_;                              // resident entries only
  std::unordered_set<std::uint64_t> pinned_;
};

Score score(const HostInfo&) noexcept {
  return {150, "LFU with exponential decay and remembered scores (the default: it beats LRU when experts stream)"};
}

const OptionSpec kOptions[] = {
    {"half_life", OptionType::integer, "auto",
     "uses after which a use counts half as much; auto: 8 per distinct expert used so far", true},
    {"history", OptionType::boolean, "true",
     "remember the scores of evicted experts (false: an expert read again starts from nothing)"},
};
const char* const kCapabilities[] = {"frequency", "decay", "history", "recency_tiebreak"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::cache,
    "frequency",
    "1.0.0",
    "least frequently used with exponential decay and remembered scores, recency breaks ties",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<FrequencyPolicy>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
