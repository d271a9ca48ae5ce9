#include "registry/host_services.hpp"

#include <cstdlib>

#include "colibri/util/log.hpp"
#include "colibri/util/metrics.hpp"

namespace colibri::registry {

PluginHostServices::PluginHostServices(sdk::PluginKind kind, std::string name)
    : tag_(std::string(to_string(kind)) + "/" + name),
      metric_prefix_(util::plugin_metric_prefix(to_string(kind), name)) {}

void PluginHostServices::log(sdk::LogLevel level, std::string_view message) noexcept {
  try {
    spdlog::log(util::to_spdlog(level), "[{}] {}", tag_, message);
  } catch (...) {  // logging must never take a plugin down
  }
}

bool PluginHostServices::log_enabled(sdk::LogLevel level) const noexcept {
  return spdlog::should_log(util::to_spdlog(level));
}

void PluginHostServices::counter_add(std::string_view metric, double delta) noexcept {
  try {
    util::Metrics::global().add(metric_prefix_ + std::string(metric), delta);
  } catch (...) {
  }
}

void PluginHostServices::gauge_set(std::string_view metric, double value) noexcept {
  try {
    util::Metrics::global().set(metric_prefix_ + std::string(metric), value);
  } catch (...) {
  }
}

void* PluginHostServices::allocate_aligned(std::size_t bytes, std::size_t alignment) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return nullptr;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  return std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
}

void PluginHostServices::free_aligned(void* ptr) noexcept {
  std::free(ptr);
}

void* PluginHostServices::allocate_pinned(std::size_t bytes) noexcept {
  return allocate_aligned(bytes, 4096);
}

void PluginHostServices::free_pinned(void* ptr) noexcept {
  free_aligned(ptr);
}

}  // namespace colibri::registry
