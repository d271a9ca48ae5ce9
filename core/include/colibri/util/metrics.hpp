// Process-wide counters and gauges (exported by the server's /metrics, shown by the CLI).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace colibri::util {

class Metrics {
 public:
  static Metrics& global();
  void add(std::string_view name, double delta);
  void set(std::string_view name, double value);
  [[nodiscard]] double get(std::string_view name) const;
  [[nodiscard]] std::map<std::string, double> snapshot() const;
  // The values whose names start with `prefix`, by the rest of their name (one plugin's: plugin_metric_prefix).
  [[nodiscard]] std::map<std::string, double> with_prefix(std::string_view prefix) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, double, std::less<>> values_;
};

// Where a plugin's host-service metrics live: "<kind>_<name>_" with '-' as '_' ("storage_io_uring_").
std::string plugin_metric_prefix(std::string_view kind, std::string_view name);

}  // namespace colibri::util
