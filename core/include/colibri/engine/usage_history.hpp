// Per-model expert usage history: how often the router picked each expert, summed over runs. Persisted under
// $XDG_CACHE_HOME/colibri/usage/ (default ~/.cache/colibri/usage/) in the format the pinned cache policy reads
// (cache.auto_pin_history): {"version": 1, "model": "<identity>", "counts": {"layer:expert": n, ...}}. "model" ties
// the counts to one conversion: a model converted again at the same path starts a new history.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "colibri/sdk/status.hpp"
#include "colibri/util/home.hpp"

namespace colibri::model {
struct Manifest;
}  // namespace colibri::model

namespace colibri::engine {

struct UsageHistory {
  std::string model;  // model_identity() of the model the counts are from ("" in histories from before it)
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t> counts;  // (layer, expert) -> times used
  [[nodiscard]] std::uint64_t total() const;
  // The n most used experts, most used first (ties: lower layer, then expert).
  [[nodiscard]] std::vector<std::pair<std::uint32_t, std::uint32_t>> most_used(std::size_t n) const;
  // Adds counts keyed by ExpertKey::packed() (ExpertManager::usage()).
  void add_packed(const std::map<std::uint64_t, std::uint64_t>& usage);
};

using util::colibri_cache_dir;  // $XDG_CACHE_HOME/colibri, else $HOME/.cache/colibri
// The history file of one model: <cache>/usage/<model dir name>-<hash of its absolute path>.json.
std::filesystem::path usage_history_path(const std::filesystem::path& model_dir);

// A model's identity: the xxh64 of its manifest.json (which holds every file's checksum), as 16 hex digits; "" when
// the manifest cannot be read.
std::string model_identity(const std::filesystem::path& model_dir);

// "" when `history` may be from the model in `model_dir`; else why not (it was counted for another model converted
// at this path), naming `path` and how to clear it.
std::string history_mismatch(const UsageHistory& history, const std::filesystem::path& path,
                             const std::filesystem::path& model_dir);
// The same against the identity `id` of the model at model_dir, already read.
std::string history_mismatch(const UsageHistory& history, const std::filesystem::path& path,
                             const std::filesystem::path& model_dir, const std::string& id);

// Whether `path` is the model's own history file (usage_history_path), which a new conversion at the same path may
// start afresh; a file the user named (--usage-history) holding another model's counts is never replaced.
bool is_own_history_file(const std::filesystem::path& path, const std::filesystem::path& model_dir);
// The error for such a file: it names it and what to do.
sdk::Status other_model_history(const std::filesystem::path& path, const std::filesystem::path& model_dir);

// Removes the counts of experts the model in `model_dir` does not have (a hand-edited file, or one from another
// model that kept its identity) and returns them; nothing when its manifest cannot be read.
std::vector<std::pair<std::uint32_t, std::uint32_t>> drop_unknown_experts(UsageHistory& history,
                                                                          const std::filesystem::path& model_dir);
// The same against a manifest already loaded.
std::vector<std::pair<std::uint32_t, std::uint32_t>> drop_unknown_experts(UsageHistory& history,
                                                                          const model::Manifest& manifest);

// A missing file is an empty history; a malformed one is an error naming the file and the entry.
sdk::Expected<UsageHistory> load_usage_history(const std::filesystem::path& path);
// Writes a temporary file, fsyncs it and renames it over `path`: a crash leaves the old or the new file.
sdk::Status save_usage_history(const std::filesystem::path& path, const UsageHistory& history);
// The exclusive lock on <path>.lock that merges and removals take (an open descriptor: closing it releases it). A
// holder that keeps it is waited for, with one info line, for 30 s at most; then the error names the lock file.
sdk::Expected<int> lock_history(const std::filesystem::path& path);
// Removes the history file under that lock (false: there was none).
sdk::Expected<bool> remove_usage_history(const std::filesystem::path& path);

// Loads, adds `usage` from the model in `model_dir`, saves; under an exclusive lock on <path>.lock, so processes
// that share a model merge one after another and no count is lost. A history of another model (its identity
// differs: converted again at this path) is replaced, with a warning, when `path` is the model's own file; a file
// the user named is left as it is, and the error says so (other_model_history); counts of experts the model does not
// have are dropped, with a warning. `counted_identity`: Manifest::identity of the model the counts were made on (as
// loaded); if model_dir holds another conversion now, nothing is merged and the error says so ("": the model as it is
// now).
sdk::Status merge_usage_history(const std::filesystem::path& path, const std::map<std::uint64_t, std::uint64_t>& usage,
                                const std::filesystem::path& model_dir, const std::string& counted_identity = "");

}  // namespace colibri::engine
