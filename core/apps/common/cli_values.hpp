// Command-line checks both programs share.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <set>
#include <string>

namespace colibri::apps {

// An integer CLI11 would clamp or wrap (99999999999999999999 read as 2^64-1, -1 for an unsigned as 2^64-1): "" when
// `value` is one the option's type holds, or is not plain digits (CLI11 judges those).
inline std::string integer_out_of_range(const std::string& value, bool is_unsigned) {
  const bool negative = value.starts_with('-');
  const std::string digits = negative ? value.substr(1) : value;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return {};
  if (is_unsigned && negative) return value + " is negative; give 0 or more";
  const char* end = value.data() + value.size();
  std::errc ec;
  if (is_unsigned) {
    std::uint64_t v = 0;
    ec = std::from_chars(value.data(), end, v).ec;
  } else {
    std::int64_t v = 0;
    ec = std::from_chars(value.data(), end, v).ec;
  }
  return ec == std::errc::result_out_of_range ? value + " is out of range" : std::string();
}

// Values that would silently change what runs are refused, on every option of `app` and its commands:
// - an empty one (--profile "", --api-key "$UNSET"), not read as unset or 0: an empty --api-key turned
//   authentication off. An empty environment variable still means unset (CLI11 skips it). `may_be_empty`: options
//   where "" is a value (a prompt).
// - an integer past its type, which CLI11 clamps or wraps.
inline void refuse_silently_changed_values(CLI::App& app, const std::set<std::string>& may_be_empty) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a flag takes no value
    const bool empty_ok = may_be_empty.count(opt->get_name()) > 0;
    const std::string type = opt->get_type_name();
    const bool is_integer = type.starts_with("INT") || type.starts_with("UINT");
    const bool is_unsigned = type.starts_with("UINT");
    opt->check(CLI::Validator(
        [empty_ok, is_integer, is_unsigned](std::string& value) {
          if (value.empty() && !empty_ok) return std::string("an empty value: give one, or leave the option out");
          return is_integer ? integer_out_of_range(value, is_unsigned) : std::string();
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    refuse_silently_changed_values(*sub, may_be_empty);
  }
}

}  // namespace colibri::apps
