#include "colibri/sdk/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace colibri::sdk {

std::string_view to_string(OptionType type) noexcept {
  switch (type) {
    case OptionType::boolean: return "boolean";
    case OptionType::integer: return "integer";
    case OptionType::number: return "number";
    case OptionType::string: return "string";
    case OptionType::size: return "size";
    case OptionType::string_list: return "list of strings";
    case OptionType::path: return "path";
    case OptionType::path_list: return "list of paths";
  }
  return "unknown";
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

Expected<std::uint64_t> parse_size(std::string_view text) noexcept {
  const std::string_view original = text;
  auto bad = [&]() {
    return Status(
        StatusCode::invalid_argument,
        "'" + std::string(original) + "' is not a size; write bytes or a number with K, M, G or T (e.g. 512M, 8G)");
  };
  text = trim(text);
  if (text.empty()) return bad();
  double number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || number < 0 || !std::isfinite(number) || text.front() == '-') return bad();  // -0 too
  // "4Gb", "512Mb": an upper-case prefix and a lower-case b is how bits are written; a size here is bytes.
  const std::string_view digits = text.substr(0, static_cast<std::size_t>(ptr - text.data()));
  if (const std::string_view rest = trim(text.substr(digits.size()));
      rest.size() == 2 && rest[1] == 'b' && std::string_view("KMGT").find(rest[0]) != std::string_view::npos) {
    const std::string bytes_form = std::string(digits) + rest[0];
    return Status(StatusCode::invalid_argument, "'" + std::string(original) + "': " + std::string(rest) +
                                                    " reads as bits, and a size is in bytes: write " + bytes_form +
                                                    " or " + bytes_form + "B");
  }
  std::string unit;
  for (const char* p = ptr; p != text.data() + text.size(); ++p) {
    if (*p != ' ') unit.push_back(lower(*p));
  }
  if (unit.size() > 1 && (unit.ends_with("ib") || unit.ends_with("b") || unit.ends_with("i"))) {
    unit.erase(unit.size() - (unit.ends_with("ib") ? 2 : 1));  // 4GiB, 4GB, 4Gi: all GiB
  }
  double mult = 1;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k") {
    mult = 1024.0;
  } else if (unit == "m") {
    mult = 1024.0 * 1024;
  } else if (unit == "g") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "t") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return bad();
  }
  const double bytes = number * mult;
  if (bytes >= 9223372036854775808.0) {  // 2^63 (8388608T): past it llround overflows
    return Status(StatusCode::invalid_argument, "'" + std::string(original) +
                                                    "' is too large a size (it must be below 8388608T); check the "
                                                    "number and its unit");
  }
  if (mult == 1 && number != std::floor(number)) return bad();  // 1.5 bytes
  return static_cast<std::uint64_t>(std::llround(bytes));
}

std::string format_size(std::uint64_t bytes) {
  static constexpr const char* units[] = {"", "K", "M", "G", "T"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(bytes));
  } else if (v == std::floor(v)) {
    std::snprintf(buf, sizeof buf, "%.0f%s", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g%s", v, units[u]);
  }
  return buf;
}

Expected<ConfigValue> parse_option_value(const OptionSpec& spec, std::string_view text) noexcept {
  try {
    const std::string_view t = trim(text);
    if (spec.allow_auto && t == "auto") {
      ConfigValue v;
      v.is_auto = true;
      v.value = std::string("auto");
      return v;
    }
    auto wrong = [&](std::string_view expected) {
      return Status(StatusCode::invalid_argument,
                    "'" + std::string(t) + "' is not " + std::string(expected) + (spec.allow_auto ? " (or auto)" : ""));
    };
    switch (spec.type) {
      case OptionType::boolean: {
        std::string l(t);
        for (auto& c : l) c = lower(c);  // YAML's True, TRUE, Yes, Off...
        if (l == "true" || l == "yes" || l == "on") return ConfigValue{true};
        if (l == "false" || l == "no" || l == "off") return ConfigValue{false};
        return wrong("a boolean (true or false)");
      }
      case OptionType::integer: {
        std::int64_t v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (ec != std::errc() || p != t.data() + t.size()) return wrong("an integer");
        return ConfigValue{v};
      }
      case OptionType::number: {
        double v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (ec != std::errc() || p != t.data() + t.size()) return wrong("a number");
        if (!std::isfinite(v)) return wrong("a finite number");  // nan would pass every range check
        return ConfigValue{v};
      }
      case OptionType::string:
      case OptionType::path: return ConfigValue{std::string(t)};
      case OptionType::size: {
        auto v = parse_size(t);
        if (!v) return v.error();
        return ConfigValue{static_cast<std::int64_t>(*v)};
      }
      case OptionType::string_list:
      case OptionType::path_list: {
        std::string_view body = t;
        if (!body.empty() && body.front() == '[') {
          if (body.back() != ']') return wrong("a list like [a, b]");
          body = body.substr(1, body.size() - 2);
        }
        std::vector<std::string> items;
        while (!trim(body).empty()) {
          const auto comma = body.find(',');
          std::string_view item = trim(body.substr(0, comma));
          if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') && item.back() == item.front()) {
            item = item.substr(1, item.size() - 2);
          }
          if (!item.empty()) items.emplace_back(item);
          if (comma == std::string_view::npos) break;
          body.remove_prefix(comma + 1);
        }
        return ConfigValue{std::move(items)};
      }
    }
    return Status(StatusCode::internal, "unknown option type");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, e.what());
  }
}

bool ConfigView::contains(std::string_view key) const noexcept {
  return values_.find(key) != values_.end();
}

bool ConfigView::is_auto(std::string_view key) const noexcept {
  const auto* v = find(key);
  return v != nullptr && v->is_auto;
}

const ConfigValue* ConfigView::find(std::string_view key) const noexcept {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

namespace {

template <typename T>
Expected<T> typed_get(const ConfigView& view, std::string_view key, T fallback, std::string_view type_name) noexcept {
  const ConfigValue* v = view.find(key);
  if (v == nullptr || v->is_auto) return fallback;
  if (const T* p = std::get_if<T>(&v->value)) return *p;
  return Status(StatusCode::invalid_argument, "option '" + std::string(key) + "' is not " + std::string(type_name));
}

}  // namespace

Expected<bool> ConfigView::get_bool(std::string_view key, bool fallback) const noexcept {
  return typed_get<bool>(*this, key, fallback, "a boolean");
}

Expected<std::int64_t> ConfigView::get_int(std::string_view key, std::int64_t fallback) const noexcept {
  return typed_get<std::int64_t>(*this, key, fallback, "an integer");
}

Expected<double> ConfigView::get_number(std::string_view key, double fallback) const noexcept {
  const ConfigValue* v = find(key);
  if (v != nullptr && !v->is_auto) {
    if (const auto* i = std::get_if<std::int64_t>(&v->value)) return static_cast<double>(*i);
  }
  return typed_get<double>(*this, key, fallback, "a number");
}

Expected<std::uint64_t> ConfigView::get_size(std::string_view key, std::uint64_t fallback) const noexcept {
  auto v = typed_get<std::int64_t>(*this, key, static_cast<std::int64_t>(fallback), "a size");
  if (!v) return v.error();
  if (*v < 0) return Status(StatusCode::invalid_argument, "option '" + std::string(key) + "' is negative");
  return static_cast<std::uint64_t>(*v);
}

Expected<std::string> ConfigView::get_string(std::string_view key, std::string fallback) const noexcept {
  try {
    return typed_get<std::string>(*this, key, std::move(fallback), "a string");
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copying a string option");
  }
}

Expected<std::vector<std::string>> ConfigView::get_string_list(std::string_view key) const noexcept {
  try {
    return typed_get<std::vector<std::string>>(*this, key, {}, "a list of strings");
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copying a list option");
  }
}

std::string closest_match(std::string_view word, std::span<const std::string> candidates) {
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t sub = prev[j - 1] + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::size_t d = distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the word, and never more than 3 edits.
  const std::size_t limit = std::min<std::size_t>(3, std::max<std::size_t>(1, word.size() / 3 + 1));
  return best_d <= limit ? best : std::string();
}

}  // namespace colibri::sdk
