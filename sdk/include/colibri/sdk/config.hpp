// Configuration as a plugin sees it: a read-only, typed view of its profile section, owned by the
// SDK (never a YAML node), and the option schema each plugin publishes so the core can reject
// unknown or ill-typed keys before anything is created.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::sdk {

enum class OptionType : std::uint8_t {
  boolean,  // true / false
  integer,  // 64-bit signed
  number,   // double
  string,
  size,         // bytes; profiles write 512M, 8G, 1.5T
  string_list,  // [a, b, c]
  // A file or directory, given to the plugin as a string: colibri expands a leading ~, and a relative one written in
  // a profile file starts at that file's directory (from a flag or the environment: at the working directory).
  path,
  path_list,  // [a, b, c], each as `path`
};

std::string_view to_string(OptionType type) noexcept;

// One documented option. `default_value` is written as a profile would write it ("32", "8G",
// "true", "[]"); an empty string means "no default: optional".
struct OptionSpec {
  const char* name;
  OptionType type;
  const char* default_value;
  const char* doc;
  bool allow_auto = false;  // the value may also be the word `auto`
};

using ConfigScalar = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>>;

// A typed value; `is_auto` marks a value written as `auto` (the consumer decides what it means).
struct ConfigValue {
  ConfigScalar value;
  bool is_auto = false;
};

// Parses "8G", "512M", "1.5T", "4096", "64K", "2GiB" into bytes (binary multiples).
Expected<std::uint64_t> parse_size(std::string_view text) noexcept;
// Formats bytes the way parse_size reads them back: 8589934592 -> "8G", 1536 -> "1.5K".
std::string format_size(std::uint64_t bytes);

// Converts the text of a profile value to the option's type ("[a, b]" for lists).
Expected<ConfigValue> parse_option_value(const OptionSpec& spec, std::string_view text) noexcept;

class ConfigView {
 public:
  ConfigView() = default;
  explicit ConfigView(std::map<std::string, ConfigValue, std::less<>> values) : values_(std::move(values)) {}

  [[nodiscard]] bool contains(std::string_view key) const noexcept;
  [[nodiscard]] bool is_auto(std::string_view key) const noexcept;
  [[nodiscard]] const ConfigValue* find(std::string_view key) const noexcept;

  // Typed access: the fallback is returned when the key is absent or `auto`; a present value of
  // another type is an error in the caller's code, reported as invalid_argument.
  Expected<bool> get_bool(std::string_view key, bool fallback) const noexcept;
  Expected<std::int64_t> get_int(std::string_view key, std::int64_t fallback) const noexcept;
  Expected<double> get_number(std::string_view key, double fallback) const noexcept;
  Expected<std::uint64_t> get_size(std::string_view key, std::uint64_t fallback) const noexcept;
  Expected<std::string> get_string(std::string_view key, std::string fallback) const noexcept;
  Expected<std::vector<std::string>> get_string_list(std::string_view key) const noexcept;

  [[nodiscard]] const std::map<std::string, ConfigValue, std::less<>>& values() const noexcept { return values_; }

 private:
  std::map<std::string, ConfigValue, std::less<>> values_;
};

// Closest candidate by edit distance, for "did you mean"; empty when nothing is close.
std::string closest_match(std::string_view word, std::span<const std::string> candidates);

}  // namespace colibri::sdk
