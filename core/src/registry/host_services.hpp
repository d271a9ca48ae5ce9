// HostServices handed to each plugin object: logs tagged "[kind/name]", metrics prefixed
// "<kind>_<name>_", aligned allocation.
#pragma once

#include <string>

#include "colibri/sdk/host.hpp"
#include "colibri/sdk/plugin.hpp"

namespace colibri::registry {

class PluginHostServices final : public sdk::HostServices {
 public:
  PluginHostServices(sdk::PluginKind kind, std::string name);

  void log(sdk::LogLevel level, std::string_view message) noexcept override;
  [[nodiscard]] bool log_enabled(sdk::LogLevel level) const noexcept override;
  void counter_add(std::string_view metric, double delta) noexcept override;
  void gauge_set(std::string_view metric, double value) noexcept override;
  void* allocate_aligned(std::size_t bytes, std::size_t alignment) noexcept override;
  void free_aligned(void* ptr) noexcept override;
  void* allocate_pinned(std::size_t bytes) noexcept override;
  void free_pinned(void* ptr) noexcept override;

  [[nodiscard]] const std::string& tag() const noexcept { return tag_; }

 private:
  std::string tag_;            // "storage/pread"
  std::string metric_prefix_;  // "storage_pread_"
};

}  // namespace colibri::registry
