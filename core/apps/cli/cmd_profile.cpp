// colibri-cli profile show [--profile NAME|PATH] [--json]; profile list
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "colibri/registry/plugin_set.hpp"
#include "colibri/util/host_info.hpp"
#include "command.hpp"

namespace colibri::cli {
namespace {

struct ProfileOptions {
  bool json = false;
};

// What an `auto` resolves to on this machine, shown beside it.
std::string auto_meaning(const std::string& key) {
  if (key == "compute.threads") return std::to_string(util::physical_core_count()) + " threads (physical cores)";
  if (key == "memory.expert_cache") {
    return sdk::format_size(util::auto_expert_cache_bytes()) + " (80% of the RAM available now)";
  }
  if (key == "models.dir") {
    const char* xdg = std::getenv("XDG_DATA_HOME");
    const char* home = std::getenv("HOME");
    return xdg && *xdg ? std::string(xdg) + "/colibri/models"
                       : std::string(home ? home : "~") + "/.local/share/colibri/models";
  }
  return {};
}

int show(const GlobalOptions& global, const ProfileOptions& opts) {
  auto prof = global.load_profile();
  if (!prof) return 1;
  const auto reg = registry::scan_for_profile(*prof);
  std::vector<std::string> notes;
  for (auto kind : {sdk::PluginKind::compute, sdk::PluginKind::storage, sdk::PluginKind::cache}) {
    auto r = registry::resolve_plugin(*prof, reg, kind);
    if (!r) {
      // A misspelt or ill-typed key is an error; a plugin that is not installed is reported but
      // does not stop the display.
      if (r.error().code() == sdk::StatusCode::invalid_argument) return fail(r.error().message());
      notes.push_back(r.error().message());
    }
  }
  if (opts.json) {
    nlohmann::json out;
    out["profile"] = prof->name();
    out["files"] = nlohmann::json::array();
    for (const auto& f : prof->files()) out["files"].push_back(f.string());
    for (const auto& [key, e] : prof->entries()) {
      nlohmann::json v{{"value", e.text}, {"origin", e.origin.describe()}, {"checked", e.validated}};
      if (e.value.is_auto) v["auto"] = auto_meaning(key);
      out["values"][key] = v;
    }
    out["problems"] = notes;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "profile: " << prof->name();
  if (!prof->files().empty()) {
    std::cout << " (" << prof->files().front().string();
    for (std::size_t i = 1; i < prof->files().size(); ++i) std::cout << ", extends " << prof->files()[i].string();
    std::cout << ")";
  }
  std::cout << "\n";
  std::size_t width = 0;
  for (const auto& [key, e] : prof->entries()) width = std::max(width, key.size() + e.text.size() + 3);
  for (const auto& [key, e] : prof->entries()) {
    std::string shown = key + " = " + (e.text.empty() ? "\"\"" : e.text);
    std::cout << std::left << std::setw(static_cast<int>(width) + 2) << shown << "# " << e.origin.describe();
    if (e.value.is_auto) {
      if (auto m = auto_meaning(key); !m.empty()) std::cout << "; auto = " << m;
    }
    if (!e.validated) std::cout << "; NOT CHECKED (its plugin was not found)";
    std::cout << "\n";
  }
  for (const auto& n : notes) std::cout << "\nnote: " << n << "\n";
  return 0;
}

int list(const GlobalOptions&) {
  for (const auto& [name, path] : profile::list_profiles(profile::default_profile_dirs())) {
    std::cout << std::left << std::setw(20) << name << path.string() << "\n";
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto* prof = app.add_subcommand("profile", "Show the effective hardware profile, or list profiles");
  prof->require_subcommand(1);
  auto opts = std::make_shared<ProfileOptions>();
  auto* show_cmd = prof->add_subcommand("show", "Every effective value with where it came from");
  show_cmd->add_flag("--json", opts->json, "Machine-readable output");
  add_profile_options(*show_cmd, global);
  show_cmd->callback([&global, opts] { global.exit_code = show(global, *opts); });
  auto* list_cmd = prof->add_subcommand("list", "Profiles found in the profile directories");
  list_cmd->callback([&global] { global.exit_code = list(global); });
}

}  // namespace

COLIBRI_CLI_COMMAND(20, setup);

}  // namespace colibri::cli
