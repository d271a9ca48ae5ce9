// Command-line checks both programs share.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <string>

#include "colibri/model/manifest.hpp"
#include "colibri/profile/profile.hpp"

namespace colibri::apps {

// COLIBRI_LOG_LEVEL, taken where --log-level is not given (an empty variable is unset). Read here rather than by
// CLI11's envname so that a bad value is named as the environment's and exits 1, as every other COLIBRI_* variable
// does, not as a refused --log-level (2). Returns whether `level` came from the environment.
inline bool log_level_from_environment(const CLI::App& app, std::string& level) {
  if (app.count("--log-level") > 0) return false;
  const char* env = std::getenv("COLIBRI_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return false;
  level = env;
  return true;
}

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

// Range checks run by the parser, so a refused value exits 2 before anything loads, as every other bad flag does.
// A value is read as CLI11 2.1 converts it (strtoll / strtold, whole string: "0x10", "+3" and "010", octal, are
// numbers), so no spelling passes the check and then converts to a value out of range. What does not read so is left
// to CLI11, which refuses it. `hint` says what to give instead.
inline CLI::Validator integer_between(std::int64_t min, std::int64_t max, std::string hint) {
  return CLI::Validator(
      [min, max, hint](std::string& value) {
        if (value.empty()) return std::string();
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(value.c_str(), &end, 0);
        if (end != value.c_str() + value.size()) return std::string();
        if (errno == ERANGE) return value + " is out of range; " + hint;
        if (v > max) return value + " is above " + std::to_string(max) + "; " + hint;
        if (v >= min) return std::string();
        return value + (v < 0 ? " is negative; " : " is below " + std::to_string(min) + "; ") + hint;
      },
      "");
}

inline CLI::Validator integer_at_least(std::int64_t min, std::string hint) {
  return integer_between(min, std::numeric_limits<std::int64_t>::max(), std::move(hint));
}

// A number in [min, max]; nan and inf are not.
inline CLI::Validator number_between(double min, double max, std::string hint) {
  return CLI::Validator(
      [min, max, hint](std::string& value) {
        if (value.empty()) return std::string();
        char* end = nullptr;
        const long double v = std::strtold(value.c_str(), &end);
        if (end != value.c_str() + value.size()) return std::string();
        return v >= min && v <= max ? std::string() : value + " is out of range; " + hint;
      },
      "");
}

// --draft / --draft-ngram / --draft-model / --draft-p-min (run, chat, colibri-server): speculation.
struct DraftFlags {
  std::int64_t tokens = -1;  // -1: not given (16 with a draft model, else 0: off)
  std::int64_t ngram = 3;
  std::string model;  // a draft model instead of prompt lookup
  double p_min = 0.75;
  [[nodiscard]] std::int64_t count() const { return tokens >= 0 ? tokens : model.empty() ? 0 : 16; }
};
inline void add_draft_options(CLI::App& cmd, DraftFlags& d) {
  cmd.add_option("--draft", d.tokens,
                 "Speculate up to N tokens per step, from earlier text (prompt lookup) or --draft-model (the same "
                 "answer, faster where the drafts are right; default 0: off, 16 with --draft-model)")
      ->check(integer_between(0, 64, "give 0 (off) to 64 draft tokens"));
  cmd.add_option("--draft-ngram", d.ngram, "Longest run of last tokens prompt lookup looks up (default 3)")
      ->check(integer_between(1, 16, "give 1 to 16 tokens"));
  cmd.add_option("--draft-model", d.model,
                 "Draft with this smaller model of the same vocabulary (a directory, or a name under models.dir)");
  cmd.add_option("--draft-p-min", d.p_min,
                 "A draft model drafts while its top token is at least this likely (default 0.75; 0: always)")
      ->check(number_between(0, 1, "give a probability from 0 (draft always) to 1"));
}

// --ctx of the commands that run a model (0: the default, as llama.cpp's -c 0).
inline constexpr const char* kContextLengthCheck = "context length";
inline CLI::Validator context_length() {
  return integer_at_least(0,
                          "give a context length in tokens, or 0 for the default (memory.kv_cache, else the model's)")
      .name(kContextLengthCheck);
}

inline CLI::Validator kv_cache_type() {
  return CLI::IsMember({"f16", "q8_0", "f32"});
}

// --set KEY=VALUE, in both programs.
inline CLI::Validator profile_setting() {
  return CLI::Validator(
      [](std::string& value) {
        return value.find('=') != std::string::npos
                   ? std::string()
                   : value + ": write --set KEY=VALUE (e.g. --set storage.plugin=io_uring)";
      },
      "");
}

// Whether a profile that failed to load with `opts` is refused for the command line's values: it loads without them.
// Such a refusal is a usage error (exit 2); a profile file's or a COLIBRI_* variable's is not (1).
inline bool refused_for_command_line(const profile::LoadOptions& opts) {
  if (opts.overrides.empty()) return false;
  profile::LoadOptions without = opts;
  without.overrides.clear();
  return profile::Profile::load(without).has_value();
}

// Whether `error`, from choosing and creating the profile's plugins, is about a value the command line gave (a key
// the plugin does not have, a value of the wrong type, one its plugin refuses): a usage error too. Such errors name
// the value by its origin: "--set KEY=VALUE: ..." (the plugin's schema), or "KEY = VALUE is from ORIGIN" (what a
// plugin's create() refused, registry::with_value_origins).
inline bool refused_value_of_command_line(const profile::Profile& profile, const sdk::Status& error) {
  if (error.code() != sdk::StatusCode::invalid_argument) return false;
  const std::string& said = error.message();
  for (const auto& [key, entry] : profile.entries()) {
    if (entry.origin.layer != profile::Origin::Layer::cli) continue;
    if (said.find(entry.origin.detail + ": ") != std::string::npos ||
        said.find(key + " = " + entry.text + " is from " + entry.origin.describe()) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// "" unless `ctx` is past the model's context, known from its manifest: said before the weights load (minutes on a
// real model). A manifest that does not load is left to the load, which names what is wrong with it.
inline std::string context_past_model(const model::Manifest* manifest, std::int64_t ctx) {
  if (ctx <= 0 || manifest == nullptr || ctx <= manifest->hparams.max_position_embeddings) return {};
  return "--ctx " + std::to_string(ctx) + " exceeds the model's context (" +
         std::to_string(manifest->hparams.max_position_embeddings) + " positions)";
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
