// colibri-cli convert --input SRC --output DIR --quantize PRESET [--split-experts] [--threads N] [--force]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include "colibri/model/convert.hpp"
#include "command.hpp"
#include "interrupt.hpp"

namespace colibri::cli::convert_command {
namespace {

struct ConvertCliOptions {
  std::string input, output, preset = "f16";
  bool split_experts = true;
  int threads = 0;
  bool force = false;
  bool quiet = false;
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string human_time(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  }
  return buf;
}

// A one-line progress bar on stderr (TTY only), redrawn at most 10 times a second.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()) {}
  void update(std::uint64_t done, std::uint64_t total) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
    const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int width = 30, fill = static_cast<int>(frac * width);
    std::string bar(static_cast<std::size_t>(fill), '#');
    bar.resize(width, '-');
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
    std::fprintf(stderr, "\r[%s] %5.1f%% %s / %s  %s/s  ETA %s   ", bar.c_str(), frac * 100,
                 human_bytes(static_cast<double>(done)).c_str(), human_bytes(static_cast<double>(total)).c_str(),
                 human_bytes(rate).c_str(), human_time(eta).c_str());
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

int run_convert(const ConvertCliOptions& o) {
  model::ConvertOptions opt;
  opt.input = o.input;
  opt.output = o.output;
  opt.preset = o.preset;
  opt.split_experts = o.split_experts;
  opt.threads = o.threads;
  opt.force = o.force;
  ProgressBar bar(!o.quiet && ::isatty(STDERR_FILENO));
  opt.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
  interrupt::Interruptible interruptible;  // Ctrl-C: the hidden partial model is removed, the old one stays
  opt.stop = [] { return interrupt::stop_requested(); };
  auto result = model::convert_model(opt);
  bar.finish();
  if (!result) {
    fail(result.error().message());
    return result.error().code() == sdk::StatusCode::cancelled ? 130 : 1;
  }
  const auto& s = *result;
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  std::cout << "converted " << s.architecture << " to " << o.output << " (" << o.preset << ")\n"
            << "  files:            " << s.files << "\n"
            << "  resident (shared) " << human_bytes(static_cast<double>(s.resident_bytes)) << "\n"
            << "  experts:          " << s.experts << ", " << human_bytes(static_cast<double>(s.expert_bytes))
            << " in all, " << human_bytes(static_cast<double>(s.bytes_per_expert)) << " per expert\n"
            << "  time:             " << human_time(s.seconds) << " ("
            << human_bytes(s.seconds > 0 ? static_cast<double>(s.bytes_written) / s.seconds : 0) << "/s written)\n"
            << "  peak RSS:         " << human_bytes(static_cast<double>(ru.ru_maxrss) * 1024) << "\n";
  if (!s.fallbacks.empty()) {
    std::map<std::string, int> by_kind;
    // "q8_0 instead of q4_k", not "q4_k -> q8_0": an arrow read as a conversion into q8_0 where q8_0 was kept.
    for (const auto& f : s.fallbacks) by_kind[f.used + " instead of " + f.wanted + " (" + f.reason + ")"]++;
    // Not only fallbacks: an input's quantized tensors (gpt-oss's MXFP4 experts) are kept as they are on purpose.
    std::cout << "  other types:      " << s.fallbacks.size() << " tensors not in the preset's type\n";
    for (const auto& [k, n] : by_kind) std::cout << "    " << n << " x " << k << "\n";
  }
  for (const auto& w : s.warnings) std::cout << "  warning: " << w << "\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<ConvertCliOptions>();
  auto* cmd = app.add_subcommand("convert", "Convert a HuggingFace checkpoint or a GGUF file into a colibri model");
  cmd->add_option("--input,-i", o->input, "HuggingFace checkpoint directory (config.json, *.safetensors) or .gguf file")
      ->required();
  cmd->add_option("--output,-o", o->output, "Model directory to create")->required();
  std::string presets;
  for (const auto& p : model::convert_presets()) presets += (presets.empty() ? "" : ", ") + p;
  cmd->add_option("--quantize,-q", o->preset, "Preset: " + presets)
      ->capture_default_str()
      ->check(CLI::Validator(
          [presets](std::string& value) {
            const auto names = model::convert_presets();
            return std::find(names.begin(), names.end(), value) != names.end()
                       ? std::string()
                       : "unknown preset '" + value + "'; choose one of " + presets;
          },
          ""));
  // Two flags rather than CLI11's "--a,!--no-a", whose help reads "{false}" as if that were the default.
  auto* split = cmd->add_flag_callback(
      "--split-experts", [o] { o->split_experts = true; }, "One file per expert (the default)");
  cmd->add_flag_callback(
         "--no-split-experts", [o] { o->split_experts = false; },
         "Pack each layer's experts in one file (fewer files; each expert still one read)")
      ->excludes(split);  // both given: which layout was meant is a guess
  cmd->add_option("--threads", o->threads, "Quantization threads, 1 to 1024 (default, or 0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--force", o->force, "Replace an existing output (only once the new model is complete)");
  cmd->add_flag("--quiet", o->quiet, "No progress bar");
  cmd->callback([&global, o] { global.exit_code = run_convert(*o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(40, setup);

}  // namespace colibri::cli::convert_command
