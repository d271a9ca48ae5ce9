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

 private:
  mutable std::mutex mu_;
  std::map<std::string, double, std::less<>> values_;
};

}  // namespace colibri::util
