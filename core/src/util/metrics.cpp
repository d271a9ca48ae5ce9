#include "colibri/util/metrics.hpp"

namespace colibri::util {

Metrics& Metrics::global() {
  static Metrics m;
  return m;
}

void Metrics::add(std::string_view name, double delta) {
  std::lock_guard lock(mu_);
  auto it = values_.find(name);
  if (it == values_.end()) {
    values_.emplace(std::string(name), delta);
  } else {
    it->second += delta;
  }
}

void Metrics::set(std::string_view name, double value) {
  std::lock_guard lock(mu_);
  auto it = values_.find(name);
  if (it == values_.end()) {
    values_.emplace(std::string(name), value);
  } else {
    it->second = value;
  }
}

double Metrics::get(std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = values_.find(name);
  return it == values_.end() ? 0.0 : it->second;
}

std::map<std::string, double> Metrics::snapshot() const {
  std::lock_guard lock(mu_);
  return {values_.begin(), values_.end()};
}

}  // namespace colibri::util
