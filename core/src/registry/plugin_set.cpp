#include "colibri/registry/plugin_set.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "colibri/util/host_info.hpp"

namespace colibri::registry {

sdk::Expected<const PluginInfo*> resolve_plugin(profile::Profile& profile, const PluginRegistry& registry,
                                                sdk::PluginKind kind) {
  const std::string key(profile::plugin_selector_key(kind));
  const profile::Entry* entry = profile.find(key);
  const std::string name = entry == nullptr || entry->value.is_auto ? "auto" : profile.get_string(key);
  if (name.empty()) {  // "--set compute.backend=" would otherwise pick a plugin silently
    return sdk::Status(sdk::StatusCode::invalid_argument,
                       key + " is empty (" + entry->origin.describe() + "); name a " + std::string(to_string(kind)) +
                           " plugin (colibri-cli plugins list), or auto for the highest score");
  }
  auto selected = registry.select(kind, name);
  if (!selected) {
    const std::string origin = entry ? " (" + key + " from " + entry->origin.describe() + ")" : "";
    return selected.error().with_context("selecting the " + std::string(to_string(kind)) + " plugin" + origin);
  }
  if (auto st = profile.apply_plugin_schema(kind, (*selected)->name, (*selected)->options); !st) return st;
  return selected;
}

sdk::Status check_plugin_keys(const profile::Profile& profile, const PluginRegistry& registry) {
  profile::Profile checked = profile;
  for (auto kind : {sdk::PluginKind::compute, sdk::PluginKind::storage, sdk::PluginKind::cache}) {
    auto r = resolve_plugin(checked, registry, kind);
    if (!r && r.error().code() == sdk::StatusCode::invalid_argument) return r.error();
  }
  return {};
}

sdk::Expected<CreatedPlugin<sdk::PluginObject>> create_selected(profile::Profile& profile,
                                                                const PluginRegistry& registry, sdk::PluginKind kind) {
  const std::string kind_name(to_string(kind));
  const std::string section(profile::plugin_section(kind));
  const profile::Entry* entry = profile.find(std::string(profile::plugin_selector_key(kind)));
  const bool automatic = entry == nullptr || entry->value.is_auto;
  std::optional<profile::Profile> unvalidated;  // the profile before a plugin's schema was applied, for the next one
  if (automatic) unvalidated = profile;
  auto first = resolve_plugin(profile, registry, kind);
  if (!first) return first.error();
  auto create = [&](const PluginInfo& p) -> sdk::Expected<std::shared_ptr<sdk::PluginObject>> {
    auto made = registry.create(p, profile.section(section));
    if (!made) {
      return with_value_origins(made.error(), profile, section)
          .with_context("creating " + kind_name + " plugin " + p.name);
    }
    return made;
  };
  auto made = create(**first);
  if (made) return CreatedPlugin<sdk::PluginObject>{*first, std::move(*made)};
  if (!automatic) return made.error();
  // auto: the others in auto's order.
  std::vector<const PluginInfo*> rest = registry.by_score(kind);
  std::erase(rest, *first);
  std::string failed =
      "\n  " + (*first)->name + " (score " + std::to_string((*first)->score.value) + "): " + made.error().message();
  for (const auto* p : rest) {
    profile = *unvalidated;
    sdk::Status why = profile.apply_plugin_schema(kind, p->name, p->options);
    if (why) {
      auto next = create(*p);
      if (next) {
        spdlog::warn("{} plugin {} (score {}) could not be created; {}: auto took the next score, {} (score {}):{}",
                     kind_name, (*first)->name, (*first)->score.value, profile::plugin_selector_key(kind), p->name,
                     p->score.value, failed);
        return CreatedPlugin<sdk::PluginObject>{p, std::move(*next)};
      }
      why = next.error();
    }
    failed += "\n  " + p->name + " (score " + std::to_string(p->score.value) + "): " + why.message();
  }
  return sdk::Status(made.error().code(), "no " + kind_name + " plugin that " +
                                              std::string(profile::plugin_selector_key(kind)) +
                                              ": auto could take was created:" + failed);
}

sdk::Status with_value_origins(const sdk::Status& error, const profile::Profile& profile, std::string_view section) {
  std::string places;
  const std::string prefix = std::string(section) + ".";
  for (const auto& [key, entry] : profile.entries()) {
    if (!key.starts_with(prefix) || entry.origin.layer == profile::Origin::Layer::builtin) continue;
    const auto at = error.message().find(key);
    if (at == std::string::npos) continue;
    const char after = at + key.size() < error.message().size() ? error.message()[at + key.size()] : ' ';
    if (std::isalnum(static_cast<unsigned char>(after)) || after == '_') continue;  // a longer key's prefix
    places += (places.empty() ? " (" : "; ") + key + " = " + entry.text + " is from " + entry.origin.describe();
  }
  if (places.empty()) return error;
  return sdk::Status(error.code(), error.message() + places + ")");
}

PluginRegistry scan_for_profile(const profile::Profile& profile) {
  // A path list: the profile resolved ~ and a profile file's relative entries.
  return PluginRegistry::scan(default_search_path(profile.get_list("plugins.paths")), util::host_info());
}

}  // namespace colibri::registry
