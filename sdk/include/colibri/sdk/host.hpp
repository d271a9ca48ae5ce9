// Services the host hands a plugin at create time. Plugins keep no global loggers: every message
// goes through the host's sink, which tags it with the plugin's kind and name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace colibri::sdk {

enum class LogLevel : std::uint8_t { trace, debug, info, warn, error };

class HostServices {
 public:
  virtual ~HostServices() = default;

  virtual void log(LogLevel level, std::string_view message) noexcept = 0;
  [[nodiscard]] virtual bool log_enabled(LogLevel level) const noexcept = 0;

  // Metrics are named "<kind>_<name>_<what>" by the host; the plugin passes only "<what>".
  virtual void counter_add(std::string_view metric, double delta) noexcept = 0;
  virtual void gauge_set(std::string_view metric, double value) noexcept = 0;

  // Aligned host memory (alignment a power of two, >= sizeof(void*)); nullptr on failure.
  virtual void* allocate_aligned(std::size_t bytes, std::size_t alignment) noexcept = 0;
  virtual void free_aligned(void* ptr) noexcept = 0;
  // Page-locked memory for DMA when a device backend has registered an allocator; otherwise the
  // same as allocate_aligned with 4 KiB alignment.
  virtual void* allocate_pinned(std::size_t bytes) noexcept = 0;
  virtual void free_pinned(void* ptr) noexcept = 0;

  void trace(std::string_view m) noexcept { log(LogLevel::trace, m); }
  void debug(std::string_view m) noexcept { log(LogLevel::debug, m); }
  void info(std::string_view m) noexcept { log(LogLevel::info, m); }
  void warn(std::string_view m) noexcept { log(LogLevel::warn, m); }
  void error(std::string_view m) noexcept { log(LogLevel::error, m); }
};

}  // namespace colibri::sdk
