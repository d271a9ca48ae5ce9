// colibri-cli cache stats|clear|warm --model M: the model's persisted expert usage history
// ($XDG_CACHE_HOME/colibri/usage/, written at the end of `run` and `bench`).
//   stats  the history file, how many expert uses it holds, the most used experts.
//   clear  removes the history.
//   warm   reads the --top most used experts' files once, so the OS page cache holds them for the next run
//          (storage plugins without direct I/O, e.g. mmap, then start warm), and prints the profile lines that
//          pin them instead (cache.policy pinned + auto_pin_history), which warm the expert cache itself at start.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <set>

#include "colibri/engine/usage_history.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "command.hpp"

namespace colibri::cli {
namespace {

struct CacheOptions {
  std::string model;
  std::size_t top = 10;
};

std::optional<std::filesystem::path> model_dir(const GlobalOptions& global, const CacheOptions& o) {
  auto prof = global.load_profile();
  if (!prof) return std::nullopt;
  auto dir = model::resolve_model_path(o.model, prof->get_string("models.dir"));
  if (!dir) {
    fail(dir.error().message());
    return std::nullopt;
  }
  return *dir;
}

int cache_stats(const GlobalOptions& global, const CacheOptions& o) {
  auto dir = model_dir(global, o);
  if (!dir) return 1;
  const auto path = engine::usage_history_path(*dir);
  auto h = engine::load_usage_history(path);
  if (!h) return fail(h.error().message());
  std::cout << "usage history  " << path.string() << (std::filesystem::exists(path) ? "" : " (none yet)") << "\n";
  std::cout << "experts used   " << h->counts.size() << " distinct, " << h->total() << " uses\n";
  const auto top = h->most_used(o.top);
  if (!top.empty()) std::cout << "most used      ";
  for (std::size_t i = 0; i < top.size(); ++i) {
    std::cout << (i ? ", " : "") << top[i].first << ":" << top[i].second << " (" << h->counts.at(top[i]) << ")";
  }
  if (!top.empty()) std::cout << "\n";
  return 0;
}

int cache_clear(const GlobalOptions& global, const CacheOptions& o) {
  auto dir = model_dir(global, o);
  if (!dir) return 1;
  const auto path = engine::usage_history_path(*dir);
  std::error_code ec;
  const bool removed = std::filesystem::remove(path, ec);
  if (ec) return fail("cannot remove " + path.string() + ": " + ec.message());
  std::cout << (removed ? "removed " : "no usage history at ") << path.string() << "\n";
  return 0;
}

int cache_warm(const GlobalOptions& global, const CacheOptions& o) {
  auto dir = model_dir(global, o);
  if (!dir) return 1;
  const auto path = engine::usage_history_path(*dir);
  auto h = engine::load_usage_history(path);
  if (!h) return fail(h.error().message());
  if (h->counts.empty()) {
    return fail("no usage history for " + dir->string() + " yet (" + path.string() + "); run or bench the model first");
  }
  auto m = model::load_manifest(*dir);
  if (!m) return fail(m.error().message());
  std::uint64_t bytes = 0;
  std::size_t warmed = 0;
  std::vector<char> buf(1 << 20);
  for (const auto& [layer, expert] : h->most_used(o.top)) {
    const auto* e = m->expert(layer, expert);
    if (e == nullptr) {
      return fail(path.string() + " names expert " + std::to_string(layer) + ":" + std::to_string(expert) +
                  ", which this model does not have; clear it (colibri-cli cache clear --model " + o.model + ")");
    }
    const auto file = (*dir / e->file).string();
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("cannot open " + file + ": " + std::strerror(errno));
    std::uint64_t done = 0;
    while (done < e->size) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), e->size - done));
      const auto n = ::pread(fd, buf.data(), want, static_cast<off_t>(e->offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        return fail("reading " + file + " failed (" + (n < 0 ? std::strerror(errno) : "file too short") +
                    "); restore it or re-run convert");
      }
      done += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    bytes += e->size;
    ++warmed;
  }
  std::cout << "warmed " << warmed << " experts (" << bytes << " bytes) into the page cache\n"
            << "to keep them in the expert cache from the start, add to the profile:\n"
            << "  cache:\n    policy: pinned\n    auto_pin_history: " << path.string()
            << "\n    auto_pin_count: " << warmed << "\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<CacheOptions>();
  auto* cmd = app.add_subcommand("cache", "The model's persisted expert usage history (stats, clear, warm)");
  cmd->require_subcommand(1);
  auto add = [&](const char* name, const char* help, int (*fn)(const GlobalOptions&, const CacheOptions&)) {
    auto* sub = cmd->add_subcommand(name, help);
    sub->add_option("--model,-m", o->model, "Model directory, or a name under models.dir")->required();
    sub->add_option("--top", o->top, "How many of the most used experts (default 10)");
    add_profile_options(*sub, global);
    sub->callback([&global, o, fn] { global.exit_code = fn(global, *o); });
  };
  add("stats", "Where the history is, how many uses it holds, the most used experts", cache_stats);
  add("clear", "Remove the history", cache_clear);
  add("warm", "Read the most used experts into the page cache and print the profile lines that pin them", cache_warm);
}

COLIBRI_CLI_COMMAND(60, setup);

}  // namespace
}  // namespace colibri::cli
