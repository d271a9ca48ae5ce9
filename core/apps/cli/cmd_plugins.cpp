// colibri-cli plugins list [--json]
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "colibri/registry/plugin_set.hpp"
#include "colibri/util/host_info.hpp"
#include "command.hpp"

namespace colibri::cli::plugins_command {
namespace {

struct PluginsOptions {
  bool json = false;
};

int list_plugins(const GlobalOptions& global, const PluginsOptions& opts) {
  auto prof = global.load_profile();
  if (!prof) return global.profile_exit_code;
  const auto reg = registry::scan_for_profile(*prof);
  if (auto s = registry::check_plugin_keys(*prof, reg); !s) return fail(s.message());
  if (opts.json) {
    nlohmann::json out;
    out["search_path"] = nlohmann::json::array();
    for (const auto& d : reg.search_path())
      out["search_path"].push_back({{"path", d.path.string()}, {"origin", d.origin}});
    out["plugins"] = nlohmann::json::array();
    for (const auto& p : reg.plugins()) {
      nlohmann::json opts_json = nlohmann::json::array();
      for (const auto& o : p.options) {
        opts_json.push_back({{"name", o.name},
                             {"type", std::string(sdk::to_string(o.type))},
                             {"default", o.default_value ? o.default_value : ""},
                             {"doc", o.doc ? o.doc : ""}});
      }
      out["plugins"].push_back(
          {{"kind", std::string(to_string(p.kind))},
           {"name", p.name},
           {"version", p.version},
           {"description", p.description},
           {"score", p.score.value},
           {"score_reason", p.score.reason},
           {"path", p.path.string()},
           {"replaces", p.shadows.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.shadows.string())},
           {"capabilities", p.capabilities},
           {"options", opts_json}});
    }
    out["broken"] = nlohmann::json::array();
    for (const auto& b : reg.broken()) out["broken"].push_back({{"path", b.path.string()}, {"reason", b.reason}});
    out["shadowed"] = nlohmann::json::array();
    for (const auto& b : reg.shadowed()) out["shadowed"].push_back({{"path", b.path.string()}, {"reason", b.reason}});
    // A file name or a plugin's text that is not UTF-8 comes out with U+FFFD instead of failing the whole listing.
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  if (reg.plugins().empty()) {
    std::cout << "no plugins found. searched:\n";
    for (const auto& d : reg.search_path()) std::cout << "  " << d.path.string() << " (" << d.origin << ")\n";
  } else {
    // Columns as wide as their longest entry, and two spaces.
    std::size_t name_w = 14, version_w = 9, score_w = 7;
    for (const auto& p : reg.plugins()) {
      name_w = std::max(name_w, p.name.size() + 2);
      version_w = std::max(version_w, p.version.size() + 2);
      score_w = std::max(score_w, std::to_string(p.score.value).size() + 2);
    }
    std::cout << std::left << std::setw(9) << "KIND" << std::setw(static_cast<int>(name_w)) << "NAME"
              << std::setw(static_cast<int>(version_w)) << "VERSION" << std::setw(static_cast<int>(score_w)) << "SCORE"
              << "PATH\n";
    for (const auto& p : reg.plugins()) {
      std::cout << std::setw(9) << to_string(p.kind) << std::setw(static_cast<int>(name_w)) << p.name
                << std::setw(static_cast<int>(version_w)) << p.version << std::setw(static_cast<int>(score_w))
                << p.score.value << p.path.string() << "\n";
      if (!p.shadows.empty()) std::cout << "         replaces colibri's own " << p.shadows.string() << "\n";
      std::string caps;
      for (const auto& c : p.capabilities) caps += (caps.empty() ? "" : ", ") + c;
      if (!caps.empty()) std::cout << "         capabilities: " << caps << "\n";
      if (!p.score.reason.empty())
        std::cout << "         " << (p.score.value == 0 ? "unusable: " : "") << p.score.reason << "\n";
    }
  }
  for (const auto& b : reg.broken()) std::cout << "broken   " << b.path.string() << "\n         " << b.reason << "\n";
  for (const auto& b : reg.shadowed()) {
    std::cout << "shadowed " << b.path.string() << "\n         " << b.reason << "\n";
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto* plugins = app.add_subcommand("plugins", "List the compute, storage and cache plugins found");
  plugins->require_subcommand(1);
  auto opts = std::make_shared<PluginsOptions>();
  auto* list =
      plugins->add_subcommand("list", "Every plugin found: kind, name, version, score here, path, capabilities");
  list->add_flag("--json", opts->json, "Machine-readable output");
  add_profile_selection(*list, global);
  list->callback([&global, opts] { global.exit_code = list_plugins(global, *opts); });
}

}  // namespace

COLIBRI_CLI_COMMAND(10, setup);

}  // namespace colibri::cli::plugins_command
