// colibri-cli's command framework: each cmd_*.cpp registers one subcommand with
// COLIBRI_CLI_COMMAND(order, setup). Commands share the global options (profile, --set, log level).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "colibri/profile/profile.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::cli {

struct GlobalOptions {
  std::string profile;             // --profile NAME|PATH
  std::vector<std::string> sets;   // --set KEY=VALUE (repeatable)
  std::string expert_cache_size;   // --expert-cache-size
  std::string vram_budget;         // --vram-budget
  std::string prefetch_layers;     // --prefetch-layers
  std::string log_level = "info";  // --log-level
  int exit_code = 0;               // set by the command that ran
  // After load_profile() failed: 2 when a value given on the command line is what the profile refuses (a usage
  // error, as the parser's refusals), 1 when the profile itself is (a file, COLIBRI_* variable, missing profile).
  mutable int profile_exit_code = 1;

  // The CLI layer of the profile stack (the dedicated flags and every --set).
  [[nodiscard]] std::vector<profile::Override> cli_overrides() const;
  // Loads and validates the effective profile; prints the error and returns nullopt on failure.
  [[nodiscard]] std::optional<profile::Profile> load_profile() const;
};

using CommandSetup = std::function<void(CLI::App& app, GlobalOptions& global)>;

struct CommandRegistrar {
  CommandRegistrar(int order, CommandSetup setup);
};

std::vector<std::pair<int, CommandSetup>>& registered_commands();

// Adds --profile, --set and the dedicated profile flags to a subcommand.
void add_profile_options(CLI::App& cmd, GlobalOptions& global);
// --profile and --set only: for commands the memory tiers and prefetch do not concern (inspect, plugins list, ...).
void add_profile_selection(CLI::App& cmd, GlobalOptions& global);

// Prints "error: ..." to stderr and returns the exit code for a failed command.
int fail(const std::string& message);
// The same for an option value the command refuses (out of range, contradictory): exit 2, as for the values the
// option parser refuses, so a script sees one code for every bad flag.
int usage_fail(const std::string& message);

// "" unless writing `output` would replace `input` (the same file, through any links) or go inside the directory
// `input`: then the error that names both flags. Outputs are written whole at the end, so the input would be lost.
std::string overwrite_error(const std::string& out_flag, const std::string& output, const std::string& in_flag,
                            const std::string& input);
// The first of those errors for any of `inputs` (flag, path; empty paths and '-' for standard input are skipped).
std::string overwrite_error(const std::string& out_flag, const std::string& output,
                            const std::vector<std::pair<std::string, std::string>>& inputs);
// The profile files this process read (GlobalOptions::load_profile, and `ab`'s own loads note theirs): every
// overwrite_error refuses an output that names one of them.
void note_profile_files(const profile::Profile& profile);

// "" unless the output's directory does not exist or cannot be written (a read-only file system, its permissions):
// said before a long load. The vector variant of overwrite_error ends with it.
std::string unwritable_output_error(const std::string& out_flag, const std::string& output);
// "" unless two outputs name the same file: the second would replace the first.
std::string same_output_error(const std::string& flag_a, const std::string& a, const std::string& flag_b,
                              const std::string& b);

// A warning on stderr when a prompt or text is not UTF-8 (the tokenizer reads such bytes as U+FFFD); `what` names
// it ("--file F", "--prompt"); `effect` adds what that changes for the command, or nothing.
inline void warn_if_not_utf8(const std::string& what, std::string_view text, const char* effect = "") {
  const auto bad = tokenizer::Tokenizer::first_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  std::cerr << "warning: " << what << " is not UTF-8 text (byte " << bad
            << " is not valid UTF-8): such bytes are read as U+FFFD" << effect
            << "; convert it (iconv -t UTF-8) if the text is in another encoding\n";
}

}  // namespace colibri::cli

#define COLIBRI_CLI_CONCAT_(a, b) a##b
#define COLIBRI_CLI_CONCAT(a, b) COLIBRI_CLI_CONCAT_(a, b)
#define COLIBRI_CLI_COMMAND(order, setup) \
  static ::colibri::cli::CommandRegistrar COLIBRI_CLI_CONCAT(colibri_cli_registrar_, __LINE__)(order, setup)
