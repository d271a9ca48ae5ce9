// Hardware profiles: YAML files chosen with --profile NAME|PATH, layered as
//   CLI flag > environment > profile > the profile it extends > built-in default,
// every value typed, range-checked and remembered with its origin.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "colibri/sdk/config.hpp"
#include "colibri/sdk/plugin.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::profile {

// Where a value came from, e.g. "profile laptop-8g-cuda (/etc/colibri/profiles/laptop-8g-cuda.yaml:7:15)".
struct Origin {
  enum class Layer { builtin, profile, environment, cli };
  Layer layer = Layer::builtin;
  std::string detail;          // "name (file:line:col)" of the value, the variable name or the flag
  std::string key_location;    // file:line:col of the key, for "unknown key" errors (files only)
  std::filesystem::path file;  // the profile file it was read from (files only): relative paths in it start there
  // Where to point a user at for a problem with the key itself.
  [[nodiscard]] const std::string& key_place() const { return key_location.empty() ? detail : key_location; }
  [[nodiscard]] std::string describe() const;
};

struct Entry {
  std::string key;   // "storage.plugin"
  std::string text;  // the value as written ("8G", "[a, b]", "auto")
  sdk::ConfigValue value;
  Origin origin;
  bool validated = false;  // checked against a schema (canonical or a plugin's)
};

// One command-line setting: --set storage.plugin=io_uring, or a dedicated flag.
struct Override {
  std::string key;
  std::string value;
  std::string flag;  // "--set" or "--expert-cache-size"
};

struct LoadOptions {
  std::string profile;  // NAME or PATH; empty: $COLIBRI_PROFILE, else "cpu", else built-in only
  std::vector<Override> overrides;
  std::map<std::string, std::string> environment;  // tests pass their own; empty means read the process env
  bool use_process_environment = true;
  std::vector<std::filesystem::path> search_dirs;  // empty: default_profile_dirs()
};

// The canonical keys of DESIGN.md "Profiles" with their types and defaults.
std::span<const sdk::OptionSpec> canonical_options();
// The section a plugin kind reads its options from and the key that names the plugin.
std::string_view plugin_section(sdk::PluginKind kind);
std::string_view plugin_selector_key(sdk::PluginKind kind);  // compute.backend, storage.plugin, cache.policy

// `text` as a YAML scalar a profile reads back as the same string: plain where that is safe, else quoted (a path
// with ": ", " #", a leading '[' or '*').
std::string yaml_scalar(std::string_view text);

// Where profile names are looked up, in order.
std::vector<std::filesystem::path> default_profile_dirs();
// Profile names found in those directories, with their files.
std::vector<std::pair<std::string, std::filesystem::path>> list_profiles(
    const std::vector<std::filesystem::path>& dirs);

class Profile {
 public:
  static sdk::Expected<Profile> load(const LoadOptions& options);

  // Checks the non-canonical keys of the plugin's section against the plugin's schema: unknown
  // keys (with file:line:col and a "did you mean") and ill-typed values are errors; defaults of
  // options the profile leaves out are filled in.
  sdk::Status apply_plugin_schema(sdk::PluginKind kind, std::string_view plugin_name,
                                  std::span<const sdk::OptionSpec> options);

  // Keys in plugin sections that no schema has claimed yet (a profile is complete when empty).
  [[nodiscard]] std::vector<const Entry*> unvalidated() const;
  // Fails with the first unvalidated key, as an unknown key.
  [[nodiscard]] sdk::Status require_all_validated() const;

  [[nodiscard]] sdk::ConfigView section(std::string_view section) const;
  [[nodiscard]] const Entry* find(std::string_view key) const;
  [[nodiscard]] std::string get_string(std::string_view key) const;  // "" when absent
  // A path as its origin means it (~ expanded, relative to the profile file that wrote it), before the plugin whose
  // option it is has been chosen (a path option's value is resolved so once its plugin is); "" when absent.
  [[nodiscard]] std::string get_path(std::string_view key) const;
  [[nodiscard]] std::vector<std::string> get_list(std::string_view key) const;
  [[nodiscard]] std::optional<std::int64_t> get_int(std::string_view key) const;  // nullopt when auto/absent
  [[nodiscard]] bool is_auto(std::string_view key) const;

  [[nodiscard]] const std::map<std::string, Entry, std::less<>>& entries() const { return entries_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  // The profile's `description:` (else the nearest one it extends that has one; "" for none).
  [[nodiscard]] const std::string& description() const { return description_; }
  // The files read, the selected profile first, then what it extends.
  [[nodiscard]] const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  std::string name_;
  std::string description_;
  std::vector<std::filesystem::path> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace colibri::profile
