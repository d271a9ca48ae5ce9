// colibri-cli: thin front end; each command lives in its own cmd_*.cpp.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "../common/cli_values.hpp"
#include "../common/output_checks.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/util/log.hpp"
#include "command.hpp"
#include "interrupt.hpp"

namespace colibri::cli {

std::vector<std::pair<int, CommandSetup>>& registered_commands() {
  static std::vector<std::pair<int, CommandSetup>> commands;
  return commands;
}

CommandRegistrar::CommandRegistrar(int order, CommandSetup setup) {
  registered_commands().emplace_back(order, std::move(setup));
}

int fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 1;
}

int usage_fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 2;
}

std::vector<std::filesystem::path>& profile_files_read() {
  static std::vector<std::filesystem::path> files;
  return files;
}

void note_profile_files(const profile::Profile& profile) {
  auto& files = profile_files_read();
  files.insert(files.end(), profile.files().begin(), profile.files().end());
}

std::string overwrite_error(const std::string& out_flag, const std::string& output, const std::string& in_flag,
                            const std::string& input) {
  if (auto e = apps::profile_overwrite_error(out_flag, output, profile_files_read()); !e.empty()) return e;
  return apps::input_overwrite_error(out_flag, output, in_flag, input);
}

std::string overwrite_error(const std::string& out_flag, const std::string& output,
                            const std::vector<std::pair<std::string, std::string>>& inputs) {
  return apps::output_error(out_flag, output, inputs, profile_files_read());
}

std::string unwritable_output_error(const std::string& out_flag, const std::string& output) {
  return apps::unwritable_output_error(out_flag, output);
}

std::string same_output_error(const std::string& flag_a, const std::string& a, const std::string& flag_b,
                              const std::string& b) {
  namespace fs = std::filesystem;
  if (a.empty() || b.empty()) return {};
  std::error_code ec_a, ec_b;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a, ec_a), ec_a);
  const fs::path pb = fs::weakly_canonical(fs::absolute(b, ec_b), ec_b);
  if (ec_a || ec_b || pa != pb) return {};
  return flag_a + " and " + flag_b + " both name " + a + ": give each output a file of its own";
}

std::vector<profile::Override> GlobalOptions::cli_overrides() const {
  std::vector<profile::Override> out;
  if (!expert_cache_size.empty()) out.push_back({"memory.expert_cache", expert_cache_size, "--expert-cache-size"});
  if (!vram_budget.empty()) out.push_back({"memory.vram_budget", vram_budget, "--vram-budget"});
  if (!prefetch_layers.empty()) out.push_back({"prefetch.layers", prefetch_layers, "--prefetch-layers"});
  for (const auto& s : sets) {  // each holds '=' (the parser's profile_setting check)
    const auto eq = s.find('=');
    out.push_back({s.substr(0, eq), s.substr(eq + 1), "--set"});
  }
  return out;
}

std::optional<profile::Profile> GlobalOptions::load_profile() const {
  profile::LoadOptions opts;
  opts.profile = profile;
  opts.overrides = cli_overrides();
  auto p = profile::Profile::load(opts);
  profile_exit_code = 1;
  if (!p) {
    if (apps::refused_for_command_line(opts)) profile_exit_code = 2;
    fail(p.error().message());
    return std::nullopt;
  }
  note_profile_files(*p);  // outputs never replace them (overwrite_error)
  return std::move(*p);
}

void add_profile_selection(CLI::App& cmd, GlobalOptions& global) {
  // COLIBRI_PROFILE is read once in main: as an envname on every subcommand, CLI11 filled it into the ones not
  // used too, overwriting the --profile given.
  cmd.add_option("--profile", global.profile,
                 "Hardware profile: a name from the profile directories or a YAML path (env COLIBRI_PROFILE)");
  cmd.add_option("--set", global.sets, "Set any profile key: --set storage.plugin=io_uring (repeatable)")
      ->check(apps::profile_setting());
}

void add_profile_options(CLI::App& cmd, GlobalOptions& global) {
  add_profile_selection(cmd, global);
  cmd.add_option("--expert-cache-size", global.expert_cache_size,
                 "RAM tier for experts, e.g. 8G (memory.expert_cache)");
  cmd.add_option("--vram-budget", global.vram_budget, "VRAM tier for experts, e.g. 6G (memory.vram_budget)");
  cmd.add_option("--prefetch-layers", global.prefetch_layers, "Layers ahead to prefetch experts for (prefetch.layers)");
}

}  // namespace colibri::cli

// CLI11 exits with its own code per kind of mistake (104, 105, 109...); a usage error is exit status 2, as in
// getopt's tools and Python's argparse, so that scripts can tell it from a failed run (1). --help stays 0.
static int usage_exit(const CLI::App& app, const CLI::ParseError& e) {
  return app.exit(e) == 0 ? 0 : 2;
}

namespace {

// An argument that may be given as a positional or a flag (`inspect MODEL` or `-m MODEL`) is listed once, under
// Options as "model,-m,--model", where CLI11 lists it twice.
class OneEntryFormatter : public CLI::Formatter {
 public:
  std::string make_positionals(const CLI::App* app) const override {
    auto only_positional = app->get_options(
        [](const CLI::Option* o) { return !o->get_group().empty() && o->get_positional() && !o->nonpositional(); });
    return only_positional.empty() ? std::string() : make_group(get_label("Positionals"), true, only_positional);
  }
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    if (!is_positional && opt->get_positional()) return opt->get_name(true, true);
    return CLI::Formatter::make_option_name(opt, is_positional);
  }
};

// The first word of the command line that is not an option must be a command: `rn --model m` and `foo cache` are
// said to be a mistyped command (rather than "unknown option --model", or "unknown command 'foo' for cache").
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.starts_with('-')) {
      if (word == "--log-level") ++i;  // the only global option with a value
      continue;
    }
    std::string names;
    bool known = false;
    for (const auto* sub : app.get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known = known || sub->check_name(word);
    }
    if (known) return false;
    std::cerr << "error: unknown command '" << word << "'; the commands are " << names << " (colibri-cli --help)\n";
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace colibri;
  CLI::App app{"colibri: run Mixture-of-Experts models larger than your GPU and RAM", "colibri-cli"};
  auto formatter = std::make_shared<OneEntryFormatter>();
  formatter->column_width(34);  // "model,-m,--model TEXT REQUIRED" on one line
  app.formatter(formatter);     // before the commands: subcommands copy it
  app.set_version_flag("--version", std::string("colibri ") + COLIBRI_SDK_VERSION_STRING);
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  cli::GlobalOptions global;
  app.add_option("--log-level", global.log_level, "trace, debug, info, warn, error or off (env COLIBRI_LOG_LEVEL)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  auto& commands = cli::registered_commands();
  std::stable_sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : commands) setup(app, global);

  app.parse_complete_callback([&] {
    const bool from_environment = apps::log_level_from_environment(app, global.log_level);
    if (auto st = util::set_log_level(global.log_level); !st) {
      std::cerr << "error: " << (from_environment ? "COLIBRI_LOG_LEVEL: " : "") << st.message() << "\n";
      std::exit(from_environment ? 1 : 2);
    }
    // The command line wins over the environment; an empty variable is unset.
    if (const char* env = std::getenv("COLIBRI_PROFILE"); global.profile.empty() && env != nullptr) {
      global.profile = env;
    }
  });
  cli::interrupt::install();
  // "" is a value for a prompt, a system prompt and a text to tokenize; --stop says why "" stops nothing itself.
  apps::refuse_silently_changed_values(app, {"--prompt", "--system", "--text", "--stop"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    if (unknown_command(app, argc, argv)) return 2;
    // The deepest command given (`colibri-cli cache`), and the words it did not take.
    std::string command = "colibri-cli";
    const CLI::App* deepest = &app;
    while (!deepest->get_subcommands().empty()) {
      deepest = deepest->get_subcommands().front();
      command += " " + deepest->get_name();
    }
    const auto extras = app.remaining(true);
    // `cache stat --model m`: a mistyped command of a group ("A subcommand is required", or the option's complaint),
    // named with the commands there are.
    if (deepest != &app && !deepest->get_subcommands({}).empty() &&
        (extras.empty() || !extras.front().starts_with('-'))) {
      std::string names;
      for (const auto* sub : deepest->get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      if (extras.empty()) {
        std::cerr << "error: " << command << " needs a command: " << names << " (" << command << " --help)\n";
      } else {
        std::cerr << "error: unknown command '" << extras.front() << "' for " << command << "; the commands are "
                  << names << " (" << command << " --help)\n";
      }
      return 2;
    }
    // CLI11 checks required options before unknown ones: "--model is required" for `run --modle m` would hide the
    // typo. An unknown option the command line holds is the error to name.
    for (const auto& extra : extras) {
      if (!extra.starts_with('-') || extra == "-") continue;
      std::cerr << "error: unknown option " << extra << " for " << command << " (" << command << " --help)\n";
      return 2;
    }
    return usage_exit(app, e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0 && unknown_command(app, argc, argv)) return 2;
    return usage_exit(app, e);
  } catch (const std::exception& e) {
    return cli::fail(e.what());
  }
  // A full disk or a closed descriptor must not pass for success (a closed pipe ends the process by SIGPIPE).
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::cerr << "error: writing standard output failed (a full disk, or it was closed): the output is incomplete\n";
    return global.exit_code != 0 ? global.exit_code : 1;
  }
  return global.exit_code;
}
