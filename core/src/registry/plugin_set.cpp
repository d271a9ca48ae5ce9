#include "colibri/registry/plugin_set.hpp"

#include "colibri/util/host_info.hpp"

namespace colibri::registry {

sdk::Expected<const PluginInfo*> resolve_plugin(profile::Profile& profile, const PluginRegistry& registry,
                                                sdk::PluginKind kind) {
  const std::string key(profile::plugin_selector_key(kind));
  const profile::Entry* entry = profile.find(key);
  const std::string name = entry == nullptr || entry->value.is_auto ? "auto" : profile.get_string(key);
  auto selected = registry.select(kind, name);
  if (!selected) {
    const std::string origin = entry ? " (" + key + " from " + entry->origin.describe() + ")" : "";
    return selected.error().with_context("selecting the " + std::string(to_string(kind)) + " plugin" + origin);
  }
  if (auto st = profile.apply_plugin_schema(kind, (*selected)->name, (*selected)->options); !st) return st;
  return selected;
}

PluginRegistry scan_for_profile(const profile::Profile& profile) {
  return PluginRegistry::scan(default_search_path(profile.get_list("plugins.paths")), util::host_info());
}

}  // namespace colibri::registry
