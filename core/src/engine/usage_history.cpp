#include "colibri/engine/usage_history.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <thread>

#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/util/home.hpp"
#include "colibri/util/output_file.hpp"
#include "model/file_io.hpp"

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

namespace fs = std::filesystem;

namespace {
// Counts stop at the largest value instead of wrapping back to small ones (a hand-edited or ancient history would
// otherwise turn the most used expert into the least).
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
}
}  // namespace

std::uint64_t UsageHistory::total() const {
  std::uint64_t n = 0;
  for (const auto& [key, c] : counts) n = saturating_add(n, c);
  return n;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> UsageHistory::most_used(std::size_t n) const {
  std::vector<std::pair<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t>> all(counts.begin(), counts.end());
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::pair<std::uint32_t, std::uint32_t>> out;
  for (std::size_t i = 0; i < all.size() && i < n; ++i) out.push_back(all[i].first);
  return out;
}

void UsageHistory::add_packed(const std::map<std::uint64_t, std::uint64_t>& usage) {
  for (const auto& [packed, n] : usage) {
    auto& c = counts[{static_cast<std::uint32_t>(packed >> 32), static_cast<std::uint32_t>(packed & 0xffffffffu)}];
    c = saturating_add(c, n);
  }
}

fs::path usage_history_path(const fs::path& model_dir) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(model_dir, ec), ec);
  if (ec) abs = model_dir;
  const std::string text = abs.string();
  const std::string hash = model::io::hex64(XXH64(text.data(), text.size(), 0));
  std::string name = abs.filename().string();
  if (name.empty()) name = "model";
  // "-<8 hex>.json.partial" (22 bytes, the file being written) must fit too, in the 255 bytes of a name.
  name = model::shortened_name(name, 230);
  // Two models with the same directory name in different places get different files.
  return colibri_cache_dir() / "usage" / (name + "-" + std::string(hash, 8) + ".json");
}

namespace {

bool parse_key(const std::string& text, std::uint32_t& layer, std::uint32_t& expert) {
  const auto colon = text.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return false;
  auto parse = [](const char* b, const char* e, std::uint32_t& v) {
    auto [p, ec] = std::from_chars(b, e, v);
    return ec == std::errc() && p == e;
  };
  return parse(text.data(), text.data() + colon, layer) &&
         parse(text.data() + colon + 1, text.data() + text.size(), expert);
}

}  // namespace

sdk::Expected<UsageHistory> load_usage_history(const fs::path& path) {
  UsageHistory h;
  auto text = model::io::read_text(path);  // a FIFO or directory there is refused, not waited on
  if (!text) {
    if (text.error().code() == StatusCode::not_found) return h;
    return text.error().with_context("reading usage history");
  }
  const auto j = nlohmann::json::parse(*text, nullptr, false);
  const std::string fix = "; fix it or remove it (a model's own history: colibri-cli cache clear --model M)";
  if (j.is_discarded()) {
    // A crash cannot leave one half-written (it is renamed into place), but a copy or an edit can.
    return Status(StatusCode::invalid_argument,
                  "usage history " + path.string() + " is not valid JSON (cut short, or edited?)" + fix);
  }
  if (!j.is_object()) {
    return Status(StatusCode::invalid_argument, "usage history " + path.string() + " is not a JSON object" + fix);
  }
  if (j.contains("version") && (!j["version"].is_number_integer() || j["version"].get<std::int64_t>() != 1)) {
    return Status(StatusCode::invalid_argument, "usage history " + path.string() + ": \"version\" must be 1" + fix);
  }
  if (j.contains("model")) {
    if (!j["model"].is_string()) {
      return Status(StatusCode::invalid_argument,
                    "usage history " + path.string() + ": \"model\" must be a string" + fix);
    }
    h.model = j["model"].get<std::string>();
  }
  if (!j.contains("counts") || !j["counts"].is_object()) {
    return Status(StatusCode::invalid_argument, "usage history " + path.string() + " has no \"counts\" object" + fix);
  }
  for (const auto& [k, v] : j["counts"].items()) {
    std::uint32_t layer = 0, expert = 0;
    if (!parse_key(k, layer, expert)) {
      return Status(StatusCode::invalid_argument,
                    "usage history " + path.string() + ": key \"" + k + "\" is not layer:expert" + fix);
    }
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
      return Status(StatusCode::invalid_argument,
                    "usage history " + path.string() + ": \"" + k + "\" must be a non-negative integer" + fix);
    }
    auto& c = h.counts[{layer, expert}];
    c = saturating_add(c, v.get<std::uint64_t>());
  }
  return h;
}

Status save_usage_history(const fs::path& path, const UsageHistory& history) {
  std::error_code ec;
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path(), ec);  // a bare name: the current dir
  if (ec) return Status(StatusCode::io_error, "cannot create " + path.parent_path().string() + ": " + ec.message());
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  for (const auto& [key, n] : history.counts) counts[std::to_string(key.first) + ":" + std::to_string(key.second)] = n;
  nlohmann::ordered_json doc{{"version", 1}};
  if (!history.model.empty()) doc["model"] = history.model;
  doc["counts"] = std::move(counts);
  const std::string text = doc.dump(1) + "\n";
  return util::write_file_atomically(path, [&](std::ostream& out) { return static_cast<bool>(out << text); });
}

std::string model_identity(const fs::path& model_dir) {
  // Unreadable, or no regular file (a FIFO would block): no identity, as for a missing manifest.
  const auto text = model::io::read_text(model_dir / "manifest.json");
  if (!text) return {};
  return model::manifest_identity(*text);
}

std::string history_mismatch(const UsageHistory& history, const fs::path& path, const fs::path& model_dir) {
  if (history.model.empty()) return {};
  return history_mismatch(history, path, model_dir, model_identity(model_dir));
}

std::string history_mismatch(const UsageHistory& history, const fs::path& path, const fs::path& model_dir,
                             const std::string& id) {
  if (history.model.empty() || id.empty() || id == history.model) return {};
  return "usage history " + path.string() + " was counted for another model at " + model_dir.string() +
         " (converted again?); clear it (colibri-cli cache clear --model " + model_dir.string() + ")";
}

bool is_own_history_file(const fs::path& path, const fs::path& model_dir) {
  std::error_code ec1, ec2;
  const auto named = fs::weakly_canonical(path, ec1);
  const auto own = fs::weakly_canonical(usage_history_path(model_dir), ec2);
  return !ec1 && !ec2 && named == own;
}

sdk::Status other_model_history(const fs::path& path, const fs::path& model_dir) {
  return Status(StatusCode::invalid_argument,
                "usage history " + path.string() + " holds the expert use of another model (or of " +
                    model_dir.string() +
                    " before it was converted again); it is left as it is: name another file, or remove it to "
                    "start a new one there");
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> drop_unknown_experts(UsageHistory& history,
                                                                          const fs::path& model_dir) {
  if (history.counts.empty()) return {};
  auto manifest = model::load_manifest(model_dir);
  if (!manifest) return {};
  return drop_unknown_experts(history, *manifest);
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> drop_unknown_experts(UsageHistory& history,
                                                                          const model::Manifest& manifest) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> dropped;
  for (auto it = history.counts.begin(); it != history.counts.end();) {
    if (manifest.expert(it->first.first, it->first.second) == nullptr) {
      dropped.push_back(it->first);
      it = history.counts.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

namespace {

// Another process holding the lock longer than this (a stuck one) costs the history, not the run.
constexpr auto kLockPatience = std::chrono::seconds(30);

}  // namespace

sdk::Expected<int> lock_history(const fs::path& path) {
  // The lock file stays: removing it would let a third process lock a new file while the second holds the old.
  const std::string lock_path = path.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return Status(StatusCode::io_error, "cannot open " + lock_path + ": " + sdk::os_error_text(errno));
  const auto give_up = std::chrono::steady_clock::now() + kLockPatience;
  bool said = false;
  while (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      ::close(lock);
      return Status(StatusCode::io_error, "cannot lock " + lock_path + ": " + sdk::os_error_text(err));
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      ::close(lock);
      return Status(StatusCode::io_error,
                    "another process has held " + lock_path + " for " + std::to_string(kLockPatience.count()) +
                        " s (a stuck colibri? see `fuser " + lock_path + "`)",
                    /*retryable=*/true);
    }
    if (!said) {
      spdlog::info("waiting for another colibri process to finish with {}", path.string());
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return lock;
}

sdk::Expected<bool> remove_usage_history(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return false;
  // Under the lock: a merge in flight would otherwise write the counts back after they were removed.
  auto locked = lock_history(path);
  if (!locked) return locked.error();
  const bool removed = fs::remove(path, ec);
  ::close(*locked);
  if (ec) return Status(StatusCode::io_error, "cannot remove " + path.string() + ": " + ec.message());
  return removed;
}

Status merge_usage_history(const fs::path& path, const std::map<std::uint64_t, std::uint64_t>& usage,
                           const fs::path& model_dir, const std::string& counted_identity) {
  if (usage.empty()) return {};
  // Counted on the model as it was loaded: if another conversion has replaced it since, the counts are not its.
  const std::string now = model_identity(model_dir);
  if (!counted_identity.empty() && !now.empty() && now != counted_identity) {
    return Status(StatusCode::invalid_argument,
                  "the model at " + model_dir.string() +
                      " changed on disk since it was loaded (converted again?); this run's expert use counts are "
                      "of the model it replaced, so they are not added to " +
                      path.string());
  }
  std::error_code ec;
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path(), ec);  // a bare name: the current dir
  if (ec) return Status(StatusCode::io_error, "cannot create " + path.parent_path().string() + ": " + ec.message());
  auto locked = lock_history(path);
  if (!locked) return locked.error();
  const int lock = *locked;
  Status result;
  auto h = load_usage_history(path);
  if (!h) {
    result = h.error();
  } else {
    const std::string id = counted_identity.empty() ? now : counted_identity;
    if (!history_mismatch(*h, path, model_dir, now).empty()) {
      if (!is_own_history_file(path, model_dir)) {
        // A file the user named (--usage-history): another model's counts are theirs, not colibri's to replace.
        result = other_model_history(path, model_dir);
      } else {
        spdlog::warn("usage history {} was counted for another model at {} (converted again?); starting a new one",
                     path.string(), model_dir.string());
        *h = UsageHistory{};
      }
    }
    if (result) {
      if (!id.empty()) h->model = id;
      if (const auto dropped = drop_unknown_experts(*h, model_dir); !dropped.empty()) {
        spdlog::warn("usage history {} counted {} expert(s) that {} does not have (e.g. {}:{}); dropped them",
                     path.string(), dropped.size(), model_dir.string(), dropped[0].first, dropped[0].second);
      }
      h->add_packed(usage);
      result = save_usage_history(path, *h);
    }
  }
  ::close(lock);  // releases the lock
  return result;
}

}  // namespace colibri::engine
