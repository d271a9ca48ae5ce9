// The cache policy plugins of this build, for the A/B tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "colibri/registry/registry.hpp"
#include "colibri/util/host_info.hpp"

namespace colibri::testing {

inline const registry::PluginRegistry& built_plugins() {
  static const auto reg = registry::PluginRegistry::scan({{COLIBRI_TEST_PLUGIN_DIR, "build"}}, util::host_info());
  return reg;
}

// A new instance of the cache policy `name`, or nullptr with a test failure when the build has none.
inline std::shared_ptr<sdk::CachePolicy> cache_policy(const std::string& name) {
  const auto* info = built_plugins().find(sdk::PluginKind::cache, name);
  if (info == nullptr) {
    ADD_FAILURE() << "plugin " << name << " not built in " << COLIBRI_TEST_PLUGIN_DIR;
    return nullptr;
  }
  auto p = built_plugins().create_as<sdk::CachePolicy>(*info, sdk::ConfigView{});
  EXPECT_TRUE(p) << p.error().message();
  return p ? *p : nullptr;
}

}  // namespace colibri::testing
