// Per-model expert usage history: how often the router picked each expert, summed over runs. Persisted under
// $XDG_CACHE_HOME/colibri/usage/ (default ~/.cache/colibri/usage/) in the format the pinned cache policy reads
// (cache.auto_pin_history): {"version": 1, "counts": {"layer:expert": n, ...}}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::engine {

struct UsageHistory {
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t> counts;  // (layer, expert) -> times used
  [[nodiscard]] std::uint64_t total() const;
  // The n most used experts, most used first (ties: lower layer, then expert).
  [[nodiscard]] std::vector<std::pair<std::uint32_t, std::uint32_t>> most_used(std::size_t n) const;
  // Adds counts keyed by ExpertKey::packed() (ExpertManager::usage()).
  void add_packed(const std::map<std::uint64_t, std::uint64_t>& usage);
};

// $XDG_CACHE_HOME/colibri, else $HOME/.cache/colibri.
std::filesystem::path colibri_cache_dir();
// The history file of one model: <cache>/usage/<model dir name>-<hash of its absolute path>.json.
std::filesystem::path usage_history_path(const std::filesystem::path& model_dir);

// A missing file is an empty history; a malformed one is an error naming the file and the entry.
sdk::Expected<UsageHistory> load_usage_history(const std::filesystem::path& path);
// Writes a temporary file, fsyncs it and renames it over `path`: a crash leaves the old or the new file.
sdk::Status save_usage_history(const std::filesystem::path& path, const UsageHistory& history);
// Loads, adds `usage`, saves.
sdk::Status merge_usage_history(const std::filesystem::path& path, const std::map<std::uint64_t, std::uint64_t>& usage);

}  // namespace colibri::engine
