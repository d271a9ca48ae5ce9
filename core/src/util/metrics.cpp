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

std::map<std::string, double> Metrics::with_prefix(std::string_view prefix) const {
  std::lock_guard lock(mu_);
  std::map<std::string, double> out;
  for (auto it = values_.lower_bound(prefix); it != values_.end() && it->first.starts_with(prefix); ++it) {
    out.emplace(it->first.substr(prefix.size()), it->second);
  }
  return out;
}

std::string plugin_metric_prefix(std::string_view kind, std::string_view name) {
  std::string prefix = std::string(kind) + "_" + std::string(name) + "_";
  for (char& c : prefix) {
    if (c == '-') c = '_';
  }
  return prefix;
}

}  // namespace colibri::util
