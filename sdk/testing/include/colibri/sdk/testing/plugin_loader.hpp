// Loads one plugin library directly (dlopen) for conformance tests, without the colibri core.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "colibri/sdk/sdk.hpp"

namespace colibri::sdk::testing {

// HostServices that records log lines and metrics so tests can assert on them.
class RecordingHost final : public HostServices {
 public:
  void log(LogLevel level, std::string_view message) noexcept override;
  [[nodiscard]] bool log_enabled(LogLevel) const noexcept override { return true; }
  void counter_add(std::string_view metric, double delta) noexcept override;
  void gauge_set(std::string_view metric, double value) noexcept override;
  void* allocate_aligned(std::size_t bytes, std::size_t alignment) noexcept override;
  void free_aligned(void* ptr) noexcept override;
  void* allocate_pinned(std::size_t bytes) noexcept override { return allocate_aligned(bytes, 4096); }
  void free_pinned(void* ptr) noexcept override { free_aligned(ptr); }

  [[nodiscard]] std::vector<std::string> lines() const;
  [[nodiscard]] double metric(const std::string& name) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  std::map<std::string, double> metrics_;
};

class LoadedPlugin {
 public:
  // Loads the library and checks its ABI; failures are returned, never thrown.
  static Expected<std::shared_ptr<LoadedPlugin>> load(const std::string& path);
  ~LoadedPlugin();

  [[nodiscard]] const PluginDescriptor& descriptor() const { return *descriptor_; }

  // Creates an object with the given options (text values, parsed against the plugin's schema
  // plus the canonical keys the tests pass). The object keeps this library loaded.
  Expected<std::shared_ptr<PluginObject>> create(const std::map<std::string, std::string>& options,
                                                 std::shared_ptr<RecordingHost> host = nullptr);

  template <typename T>
  Expected<std::shared_ptr<T>> create_as(const std::map<std::string, std::string>& options,
                                         std::shared_ptr<RecordingHost> host = nullptr) {
    auto obj = create(options, std::move(host));
    if (!obj) return obj.error();
    auto typed = std::dynamic_pointer_cast<T>(*obj);
    if (!typed) return Status(StatusCode::internal, "plugin created an object of another kind");
    return typed;
  }

 private:
  LoadedPlugin() = default;
  void* handle_ = nullptr;
  const PluginDescriptor* descriptor_ = nullptr;
  HostInfo host_info_;
  std::weak_ptr<LoadedPlugin> self_;
};

}  // namespace colibri::sdk::testing
