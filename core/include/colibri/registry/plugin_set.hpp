// Ties a profile to the registry: picks the plugin of each kind the profile names and checks that
// kind's section against the plugin's option schema before anything is created.
#pragma once

#include "colibri/profile/profile.hpp"
#include "colibri/registry/registry.hpp"

namespace colibri::registry {

// The plugin the profile selects for `kind` (by name, or by score for `auto`), with its section
// validated against its schema (unknown keys and bad values are errors with file:line:col).
sdk::Expected<const PluginInfo*> resolve_plugin(profile::Profile& profile, const PluginRegistry& registry,
                                                sdk::PluginKind kind);

// Scans the plugin search path of a profile (its plugins.paths first).
PluginRegistry scan_for_profile(const profile::Profile& profile);

// A plugin's create() error names a key of its section (a value out of its range) but not where the value was
// set: this adds that place, "(cache.half_life = -5 is from profile hl (/home/me/hl.yaml:2:14))", for every key of
// `section` the message names that a profile, the environment or a flag set.
sdk::Status with_value_origins(const sdk::Status& error, const profile::Profile& profile, std::string_view section);

// Resolves and creates the plugin of `kind` named by the profile.
template <typename T>
sdk::Expected<std::shared_ptr<T>> create_plugin(profile::Profile& profile, const PluginRegistry& registry,
                                                sdk::PluginKind kind) {
  auto info = resolve_plugin(profile, registry, kind);
  if (!info) return info.error();
  auto made = registry.create_as<T>(**info, profile.section(profile::plugin_section(kind)));
  if (!made) return with_value_origins(made.error(), profile, profile::plugin_section(kind));
  return made;
}

}  // namespace colibri::registry
