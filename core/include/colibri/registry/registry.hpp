// Finds plugin libraries, checks their ABI, scores them on this machine and creates their objects.
// Built on Boost.DLL; libraries load RTLD_NOW | RTLD_LOCAL and stay loaded while the process runs.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/plugin.hpp"
#include "colibri/sdk/storage.hpp"

namespace colibri::registry {

// Who put a directory on the search path: the user (the profile, COLIBRI_PLUGIN_PATH; an absent one is warned about),
// colibri's own installation (a user's plugin of the same name replaces its plugins), or a conventional place for
// third-party plugins that may well not exist.
enum class SearchDirKind { user, colibri, third_party };

// One directory of the search path and why it is there ("profile plugins.paths",
// "COLIBRI_PLUGIN_PATH", "install dir", "next to the executable").
struct SearchDir {
  std::filesystem::path path;
  std::string origin;
  SearchDirKind kind = SearchDirKind::user;
};

// The search order: profile plugins.paths, $COLIBRI_PLUGIN_PATH (colon-separated), the install
// dir, then next to the executable (<exe>/../lib/colibri/plugins and <exe>/plugins).
std::vector<SearchDir> default_search_path(const std::vector<std::string>& profile_paths);

struct PluginInfo {
  sdk::PluginKind kind = sdk::PluginKind::storage;
  std::string name;
  std::string version;
  std::string description;
  std::filesystem::path path;
  std::string origin;             // the search directory's ("COLIBRI_PLUGIN_PATH", "install dir", ...)
  std::filesystem::path shadows;  // colibri's own plugin of this kind and name that this one replaces, if any
  std::string build_fingerprint;
  std::vector<sdk::OptionSpec> options;
  std::vector<std::string> capabilities;
  sdk::Score score;
  const sdk::PluginDescriptor* descriptor = nullptr;
  std::shared_ptr<void> library;  // keeps the library loaded
};

struct BrokenPlugin {
  std::filesystem::path path;
  std::string reason;
};

// colibri-plugin-probe next to the executable, or in <exe>/../lib/colibri, else where colibri installs it; empty where
// none exists.
std::filesystem::path default_probe();

struct ScanOptions {
  // colibri-plugin-probe: a plugin of a user's or third-party directory is first loaded and scored by it, in a process
  // of its own, the first time the file is seen (and after it changes), so that one that crashes, exits or hangs
  // there is skipped (and recorded) instead of ending the command. Empty: such plugins load here at once.
  std::filesystem::path probe = default_probe();
  std::chrono::milliseconds probe_timeout{60000};
  // Until the probe itself has started (before it loads the plugin): longer, and it is taken as not running here.
  std::chrono::milliseconds probe_start_timeout{10000};
};

class PluginRegistry {
 public:
  // Loads every libcolibri-*.so in the directories (first occurrence of a kind/name wins; a later
  // one is reported broken as a duplicate). Never throws for bad libraries: they go to broken().
  static PluginRegistry scan(std::vector<SearchDir> search_path, const sdk::HostInfo& host,
                             const ScanOptions& options = {});

  // colibri-plugin-probe's main: `--report-fd=N FILE` loads and scores FILE in this process, writing 'R' to fd N
  // before and 'D' after (a crash there is recorded as in scan()). Returns the exit status.
  static int probe_main(int argc, char** argv);

  [[nodiscard]] const std::vector<PluginInfo>& plugins() const noexcept { return plugins_; }
  [[nodiscard]] const std::vector<BrokenPlugin>& broken() const noexcept { return broken_; }
  // colibri's own plugins that one of the same kind and name earlier in the search path replaces (reason: by which).
  [[nodiscard]] const std::vector<BrokenPlugin>& shadowed() const noexcept { return shadowed_; }
  [[nodiscard]] const std::vector<SearchDir>& search_path() const noexcept { return search_path_; }
  [[nodiscard]] const sdk::HostInfo& host() const noexcept { return host_; }

  [[nodiscard]] const PluginInfo* find(sdk::PluginKind kind, std::string_view name) const noexcept;
  // `auto`'s order: the plugins of `kind` that score above 0, highest first, ties in search order.
  [[nodiscard]] std::vector<const PluginInfo*> by_score(sdk::PluginKind kind) const;

  // `name` empty or "auto": the highest score above 0. Otherwise the named plugin, which must
  // score above 0. Errors list the paths searched and the plugins available of that kind.
  sdk::Expected<const PluginInfo*> select(sdk::PluginKind kind, std::string_view name) const;

  // Creates an object of the plugin. `config` must already be validated against its schema.
  // The result's deleter holds the library and the host services.
  sdk::Expected<std::shared_ptr<sdk::PluginObject>> create(const PluginInfo& plugin,
                                                           const sdk::ConfigView& config) const;

  template <typename T>
  sdk::Expected<std::shared_ptr<T>> create_as(const PluginInfo& plugin, const sdk::ConfigView& config) const {
    auto obj = create(plugin, config);
    if (!obj) return obj.error();
    auto typed = std::dynamic_pointer_cast<T>(*obj);
    if (!typed) {
      return sdk::Status(sdk::StatusCode::internal, "plugin " + plugin.name + " (" + plugin.path.string() +
                                                        ") created an object of the wrong kind");
    }
    return typed;
  }

 private:
  void load_one(const std::filesystem::path& file, const sdk::HostInfo& host, const SearchDir& dir);
  PluginInfo* find_mutable(sdk::PluginKind kind, std::string_view name) noexcept;

  sdk::HostInfo host_;
  ScanOptions options_;
  std::vector<SearchDir> search_path_;
  std::vector<PluginInfo> plugins_;
  std::vector<BrokenPlugin> broken_;
  std::vector<BrokenPlugin> shadowed_;
};

// Reads a library's descriptor and checks it against this colibri: exact ABI version, compatible
// build fingerprint, a valid kind and name. Exposed for tests and `plugins list`.
sdk::Status check_descriptor(const sdk::PluginDescriptor* d, const std::filesystem::path& file);

}  // namespace colibri::registry
