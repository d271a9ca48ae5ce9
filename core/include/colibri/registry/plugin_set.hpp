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

// For commands that create no plugin (plugins list, model stripe): the profile's compute, storage and cache sections
// checked against the plugins it selects, so a misspelt or ill-typed key is the error it is in a run. A selected
// plugin that is missing here is no error (listing plugins is how one finds that out).
sdk::Status check_plugin_keys(const profile::Profile& profile, const PluginRegistry& registry);

// Scans the plugin search path of a profile (its plugins.paths first).
PluginRegistry scan_for_profile(const profile::Profile& profile);

// A plugin's create() error names a key of its section (a value out of its range) but not where the value was
// set: this adds that place, "(cache.half_life = -5 is from profile hl (/home/me/hl.yaml:2:14))", for every key of
// `section` the message names that a profile, the environment or a flag set.
sdk::Status with_value_origins(const sdk::Status& error, const profile::Profile& profile, std::string_view section);

// A plugin the profile selected, and the object it created.
template <typename T>
struct CreatedPlugin {
  const PluginInfo* info = nullptr;
  std::shared_ptr<T> object;
};

// Resolves and creates the plugin of `kind` the profile selects. Selected by `auto`, a plugin whose create() fails
// (a GPU whose driver is too old for its runtime, no device memory left) gives way to the next score, with a warning
// that names it and why, as llama.cpp falls back to the CPU; a plugin the profile names is that plugin or an error.
// The profile's section is then validated against the schema of the plugin that was created.
sdk::Expected<CreatedPlugin<sdk::PluginObject>> create_selected(profile::Profile& profile,
                                                                const PluginRegistry& registry, sdk::PluginKind kind);

template <typename T>
sdk::Expected<CreatedPlugin<T>> create_selected_as(profile::Profile& profile, const PluginRegistry& registry,
                                                   sdk::PluginKind kind) {
  auto made = create_selected(profile, registry, kind);
  if (!made) return made.error();
  auto typed = std::dynamic_pointer_cast<T>(made->object);
  if (!typed) {
    return sdk::Status(sdk::StatusCode::internal, "plugin " + made->info->name + " (" + made->info->path.string() +
                                                      ") created an object of the wrong kind");
  }
  return CreatedPlugin<T>{made->info, std::move(typed)};
}

template <typename T>
sdk::Expected<std::shared_ptr<T>> create_plugin(profile::Profile& profile, const PluginRegistry& registry,
                                                sdk::PluginKind kind) {
  auto made = create_selected_as<T>(profile, registry, kind);
  if (!made) return made.error();
  return made->object;
}

}  // namespace colibri::registry
