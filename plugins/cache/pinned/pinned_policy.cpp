// cache/pinned: the experts the profile names in `cache.pinned_experts` ("layer:expert") are
// reported by wanted_pins() so the core loads and pins them for the whole run; optionally the
// `auto_pin_count` most used experts of a usage history are added. Everything else is LRU.
//
// Usage history (`auto_pin_history`), as the core persists it:
//   {"version": 1, "counts": {"3:1": 5120, "12:7": 4410, ...}}
// "version" is optional; every key of "counts" is "layer:expert", every value a non-negative
// integer (how often the router picked that expert). A missing file is not an error (the first
// run has none); a malformed one is, naming the file and the entry.
//
// Victims: least recently used among entries the core has not pinned, taking experts of the
// wanted list last (they may be resident unpinned when the cache could not hold them all).
#include <charconv>
#include <filesystem>
#include <fstream>
#include <list>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "colibri/sdk/sdk.hpp"
#include "recency_order.hpp"

namespace {

using namespace colibri::sdk;

// "12:7" -> {12, 7}; false for anything else (signs, spaces, overflow, extra text).
bool parse_key(std::string_view text, ExpertKey& out) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) return false;
  auto parse = [](std::string_view s, std::uint32_t& v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && p == s.data() + s.size();
  };
  return parse(text.substr(0, colon), out.layer) && parse(text.substr(colon + 1), out.expert);
}

// The `count` most used experts of the history file (ties: the lower layer, then expert, first).
Expected<std::vector<ExpertKey>> most_used(const std::string& path, std::int64_t count, HostServices& host) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // an ifstream opens one and fails at its first read
    return Status(StatusCode::invalid_argument,
                  "cache.auto_pin_history " + path + " is a directory; name the usage-history JSON file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    // A first run has none yet (a run or the server writes it there); a misspelt path never will: a warning.
    host.warn("cache.auto_pin_history: no usage history at " + path +
              " yet; no automatic pins this run (a run or colibri-server writes it there; check the path if one "
              "should exist)");
    return std::vector<ExpertKey>{};
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const std::exception& e) {  // parse_error, out_of_range (a number past a double), a read error
    return Status(StatusCode::invalid_argument,
                  "cache.auto_pin_history " + path + " is not valid JSON (" + e.what() +
                      "); delete it or fix it (expected {\"counts\": {\"layer:expert\": n, ...}})");
  }
  if (!doc.is_object() || !doc.contains("counts") || !doc["counts"].is_object()) {
    return Status(StatusCode::invalid_argument, "cache.auto_pin_history " + path +
                                                    " has no \"counts\" object (expected {\"counts\": "
                                                    "{\"layer:expert\": n, ...}})");
  }
  std::vector<std::pair<std::uint64_t, ExpertKey>> ranked;
  for (const auto& [name, value] : doc["counts"].items()) {
    ExpertKey k;
    if (!parse_key(name, k)) {
      return Status(StatusCode::invalid_argument, "cache.auto_pin_history " + path + ": counts entry \"" + name +
                                                      "\" is not \"layer:expert\" (e.g. \"3:1\")");
    }
    if (!value.is_number_unsigned()) {
      return Status(StatusCode::invalid_argument, "cache.auto_pin_history " + path + ": counts entry \"" + name +
                                                      "\" must be a non-negative integer, got " + value.dump());
    }
    ranked.emplace_back(value.get<std::uint64_t>(), k);
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<ExpertKey> out;
  for (std::size_t i = 0; i < ranked.size() && static_cast<std::int64_t>(i) < count; ++i) {
    if (ranked[i].first > 0) out.push_back(ranked[i].second);
  }
  return out;
}

class PinnedPolicy final : public CachePolicy {
 public:
  static Expected<std::unique_ptr<PinnedPolicy>> create(const CreateContext& ctx) {
    const ConfigView& c = *ctx.config;
    std::vector<ExpertKey> wanted;
    std::set<std::uint64_t> seen;
    if (c.contains("pinned_experts")) {
      auto list = c.get_string_list("pinned_experts");
      if (!list) return list.error();
      for (std::size_t i = 0; i < list->size(); ++i) {
        ExpertKey k;
        if (!parse_key((*list)[i], k)) {
          return Status(StatusCode::invalid_argument, "cache.pinned_experts[" + std::to_string(i) + "] \"" +
                                                          (*list)[i] +
                                                          "\" is not \"layer:expert\" (two non-negative "
                                                          "integers, e.g. \"3:1\")");
        }
        if (seen.insert(k.packed()).second) wanted.push_back(k);
      }
    }
    auto count = c.get_int("auto_pin_count", 0);
    if (!count) return count.error();
    if (*count < 0) return Status(StatusCode::invalid_argument, "cache.auto_pin_count must be >= 0");
    auto history = c.get_string("auto_pin_history", "");
    if (!history) return history.error();
    if (*count > 0 && history->empty()) {
      return Status(StatusCode::invalid_argument,
                    "cache.auto_pin_count is " + std::to_string(*count) +
                        " but cache.auto_pin_history is empty; name the usage-history file");
    }
    if (*count > 0) {
      auto used = most_used(*history, *count, *ctx.host);
      if (!used) return used.error();
      std::size_t added = 0;
      for (ExpertKey k : *used) {
        if (seen.insert(k.packed()).second) {
          wanted.push_back(k);
          ++added;
        }
      }
      if (added > 0) ctx.host->info("pinning " + std::to_string(added) + " most used experts from " + *history);
    }
    return std::make_unique<PinnedPolicy>(std::move(wanted));
  }

  explicit PinnedPolicy(std::vector<ExpertKey> wanted) : wanted_(std::move(wanted)) {
    for (ExpertKey k : wanted_) wanted_set_.insert(k.packed());
  }

  void on_insert(ExpertKey key, std::uint64_t) noexcept override { order_.touch(key.packed()); }
  void on_access(ExpertKey key) noexcept override {
    if (order_.contains(key.packed())) order_.touch(key.packed());
  }
  void on_erase(ExpertKey key) noexcept override { order_.erase(key.packed()); }
  void on_pin(ExpertKey key, bool pinned) noexcept override { order_.set_pinned(key.packed(), pinned); }
  std::optional<ExpertKey> pick_victim(const EvictablePredicate& evictable) noexcept override {
    std::optional<ExpertKey> wanted_victim;
    auto v = order_.coldest([&](std::uint64_t packed) {
      const ExpertKey k = ExpertKey::unpack(packed);
      if (wanted_set_.count(packed)) {  // wanted but not pinned: evicted only when nothing else is
        if (!wanted_victim && evictable(k)) wanted_victim = k;
        return false;
      }
      return evictable(k);
    });
    if (v) return ExpertKey::unpack(*v);
    return wanted_victim;
  }
  std::vector<ExpertKey> wanted_pins() const noexcept override {
    try {
      return wanted_;
    } catch (...) {
      return {};
    }
  }
  void clear() noexcept override { order_.clear(); }

 private:
  std::vector<ExpertKey> wanted_;
  std::unordered_set<std::uint64_t> wanted_set_;
  colibri::plugins::cache_common::RecencyOrder order_;
};

Score score(const HostInfo&) noexcept {
  return {50, "LRU plus the profile's pinned_experts"};
}

const OptionSpec kOptions[] = {
    {"auto_pin_history", OptionType::path, "",
     "usage-history JSON ({\"counts\": {\"layer:expert\": n}}) to learn pins from"},
    {"auto_pin_count", OptionType::integer, "0", "also pin this many of the most used experts in the history"},
};
const char* const kCapabilities[] = {"recency", "pins", "usage_history"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::cache,
    "pinned",
    "1.0.0",
    "pins the profile's pinned_experts (and the most used ones), LRU for the rest",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<PinnedPolicy>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
