// colibri-cli cache stats|clear|warm --server URL: the expert cache of a running colibri-server (/admin/cache/*).
// colibri-cli cache stats|clear|warm --model M: the model's persisted expert usage history
// ($XDG_CACHE_HOME/colibri/usage/, written at the end of `run` and `bench`).
//   stats  the history file, how many expert uses it holds, the most used experts.
//   clear  removes the history.
//   warm   reads the --top most used experts' files once, so the OS page cache holds them for the next run
//          (storage plugins without direct I/O, e.g. mmap, then start warm), and prints the profile lines that
//          pin them instead (cache.policy pinned + auto_pin_history), which warm the expert cache itself at start.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <variant>

#include "../common/cli_values.hpp"
#include "colibri/engine/usage_history.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/sdk/config.hpp"
#include "colibri/server/api.hpp"
#include "colibri/server/http_client.hpp"
#include "command.hpp"

namespace colibri::cli::cache_command {
namespace {

struct CacheOptions {
  std::string model;
  std::int64_t top = 10;
  bool top_given = false;
  std::string server, api_key;
  std::vector<std::string> experts;  // warm --server: "layer:expert"
  bool json = false;
};

// --- --server: a running colibri-server ---

// One admin request; the parsed JSON answer, or nullopt after printing why not.
std::optional<nlohmann::ordered_json> admin_call(const CacheOptions& o, const char* method, const char* path,
                                                 const std::string& body) {
  auto url = server::parse_http_url(o.server);
  if (!url) {
    fail("--server: " + url.error().message());
    return std::nullopt;
  }
  server::HttpRequestOptions ro;
  ro.bearer_token = o.api_key;
  if (const char* env = std::getenv("COLIBRI_API_KEY"); ro.bearer_token.empty() && env != nullptr)
    ro.bearer_token = env;
  auto res = server::http_request(*url, method, path, body, ro);
  if (!res) {
    fail(res.error().message());
    return std::nullopt;
  }
  auto j = nlohmann::ordered_json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (res->status == 401) {
    fail(ro.bearer_token.empty()
             ? "the server at " + o.server + " needs an API key: pass --api-key KEY (or set COLIBRI_API_KEY)"
             : "the server at " + o.server + " rejected the API key " +
                   (o.api_key.empty() ? "in COLIBRI_API_KEY" : "given with --api-key"));
    return std::nullopt;
  }
  if (res->status != 200) {
    std::string why = res->body.substr(0, 300);
    if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].value("message", "") != "") {
      why = j["error"]["message"].get<std::string>();
    }
    if (res->status == 404) why += " (is " + o.server + " a colibri-server?)";
    fail("the server at " + o.server + " answered " + std::to_string(res->status) + ": " + why);
    return std::nullopt;
  }
  if (!j.is_object()) {
    fail("the server at " + o.server + " answered " + path + " with something that is not a JSON object");
    return std::nullopt;
  }
  return j;
}

// Prints the answer as JSON (--json) or as aligned "key  value" lines.
void print_answer(const CacheOptions& o, const nlohmann::ordered_json& j) {
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::size_t width = 0;  // the longest key, and two spaces
  for (const auto& [key, value] : j.items()) width = std::max(width, key.size() + 2);
  for (const auto& [key, value] : j.items()) {
    if (key == "object") continue;
    std::string shown = value.is_string() ? value.get<std::string>() : value.is_null() ? "n/a" : value.dump();
    char buf[64];
    if (value.is_number_float() && key.ends_with("rate")) {
      std::snprintf(buf, sizeof buf, "%.1f%%", 100 * value.get<double>());
      shown = buf;
    } else if (value.is_number_float() && key.ends_with("seconds")) {
      std::snprintf(buf, sizeof buf, "%.3f s", value.get<double>());
      shown = buf;
    } else if (value.is_number_unsigned() && (key.ends_with("bytes") || key.starts_with("bytes_")) &&
               value.get<std::uint64_t>() >= 1024) {  // resident_bytes, bytes_read, bytes_uploaded
      shown = sdk::format_size(value.get<std::uint64_t>()) + " (" + shown + " bytes)";
    }
    std::cout << std::left << std::setw(static_cast<int>(width)) << key << shown << "\n";
  }
}

int server_stats(const CacheOptions& o) {
  auto j = admin_call(o, "GET", "/admin/cache/stats", "");
  if (!j) return 1;
  print_answer(o, *j);
  return 0;
}

int server_clear(const CacheOptions& o) {
  auto j = admin_call(o, "POST", "/admin/cache/clear", "");
  if (!j) return 1;
  print_answer(o, *j);
  return 0;
}

int server_warm(const CacheOptions& o) {
  nlohmann::ordered_json body = nlohmann::ordered_json::object();
  if (!o.experts.empty()) {
    if (o.top_given) return usage_fail("give either --experts or --top, not both");
    for (const auto& e : o.experts) {
      if (!server::parse_expert_key(e)) return usage_fail("--experts " + e + ": write layer:expert, e.g. 3:1");
    }
    body["experts"] = o.experts;
  } else if (o.top_given) {
    body["top"] = o.top;
  }
  auto j = admin_call(o, "POST", "/admin/cache/warm", body.empty() ? "" : body.dump());
  if (!j) return 1;
  print_answer(o, *j);
  // A partial warm is not a failure (the cache holds what fits), but it is not what was asked either: say so.
  if (const auto no_room = j->value("no_room", std::uint64_t{0}); no_room > 0) {
    std::cerr << "note: " << no_room << " of the " << j->value("requested", std::uint64_t{0})
              << " experts asked for did not fit in the server's expert cache (budget "
              << sdk::format_size(j->value("budget_bytes", std::uint64_t{0}))
              << "): warm fewer, or start the server with a larger --expert-cache-size\n";
  }
  return 0;
}

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
  if (!dir) return global.profile_exit_code;  // 1 unless the profile refused a command-line value
  const auto path = engine::usage_history_path(*dir);
  auto h = engine::load_usage_history(path);
  if (!h) return fail(h.error().message());
  auto why = engine::history_mismatch(*h, path, *dir);
  // Counts of experts this model does not have are not shown (the next run's save drops them).
  if (const auto unknown = engine::drop_unknown_experts(*h, *dir); !unknown.empty() && why.empty()) {
    why = std::to_string(unknown.size()) + " count(s) name experts this model does not have (e.g. " +
          std::to_string(unknown[0].first) + ":" + std::to_string(unknown[0].second) +
          "); left out here, and dropped from the file at the next run's save (or: colibri-cli cache clear)";
  }
  const auto top = h->most_used(static_cast<std::size_t>(o.top));
  if (o.json) {
    nlohmann::ordered_json j{{"usage_history", path.string()},
                             {"exists", std::filesystem::exists(path)},
                             {"note", why.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(why)},
                             {"distinct_experts", h->counts.size()},
                             {"uses", h->total()},
                             {"most_used", nlohmann::ordered_json::array()}};
    for (const auto& key : top) {
      j["most_used"].push_back({{"layer", key.first}, {"expert", key.second}, {"uses", h->counts.at(key)}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "usage history  " << path.string() << (std::filesystem::exists(path) ? "" : " (none yet)") << "\n";
  if (!why.empty()) std::cout << "note           " << why << "\n";
  std::cout << "experts used   " << h->counts.size() << " distinct, " << h->total() << " uses\n";
  if (!top.empty()) std::cout << "most used      ";
  for (std::size_t i = 0; i < top.size(); ++i) {
    std::cout << (i ? ", " : "") << top[i].first << ":" << top[i].second << " (" << h->counts.at(top[i]) << ")";
  }
  if (!top.empty()) std::cout << "\n";
  return 0;
}

int cache_clear(const GlobalOptions& global, const CacheOptions& o) {
  auto dir = model_dir(global, o);
  if (!dir) return global.profile_exit_code;  // 1 unless the profile refused a command-line value
  const auto path = engine::usage_history_path(*dir);
  std::error_code ec;
  // Only the file colibri writes: filesystem::remove would also take an empty directory of the user's at that path.
  const auto st = std::filesystem::symlink_status(path, ec);
  if (!ec && std::filesystem::exists(st) && std::filesystem::is_directory(st)) {
    return fail(path.string() + " is a directory, not a usage history; colibri-cli cache clear removes only the " +
                "history file colibri writes there (remove the directory yourself if it is not needed)");
  }
  auto removed_or = engine::remove_usage_history(path);
  if (!removed_or) return fail(removed_or.error().message());
  const bool removed = *removed_or;
  if (o.json) {
    std::cout << nlohmann::ordered_json{{"usage_history", path.string()}, {"removed", removed}}.dump(2) << "\n";
  } else {
    std::cout << (removed ? "removed " : "no usage history at ") << path.string() << "\n";
  }
  return 0;
}

int cache_warm(const GlobalOptions& global, const CacheOptions& o) {
  auto prof = global.load_profile();
  if (!prof) return global.profile_exit_code;
  auto dir = model_dir(global, o);
  if (!dir) return global.profile_exit_code;  // 1 unless the profile refused a command-line value
  const auto path = engine::usage_history_path(*dir);
  auto h = engine::load_usage_history(path);
  if (!h) return fail(h.error().message());
  if (auto why = engine::history_mismatch(*h, path, *dir); !why.empty()) return fail(why);
  auto m = model::load_manifest(*dir);
  if (m) engine::drop_unknown_experts(*h, *m);  // as `cache stats` shows it: experts the model lacks are left out
  if (h->counts.empty()) {
    return fail("no usage history for " + dir->string() + " yet (" + path.string() + "); run or bench the model first");
  }
  if (!m) return fail(m.error().message());
  std::uint64_t bytes = 0;
  std::size_t warmed = 0;
  std::vector<char> buf(1 << 20);
  for (const auto& [layer, expert] : h->most_used(static_cast<std::size_t>(o.top))) {
    const auto* e = m->expert(layer, expert);  // one the model has: the others were dropped above
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
  // O_DIRECT reads skip the page cache: then only the pins below help the next run.
  const auto* dio = prof->find("storage.direct_io");
  const auto* dio_value = dio != nullptr ? std::get_if<bool>(&dio->value.value) : nullptr;
  const bool direct_io = dio_value == nullptr || *dio_value;
  std::string budget_note;
  if (auto budget = prof->get_int("memory.expert_cache"); budget && *budget > 0) {
    budget_note = "the pins take " + sdk::format_size(bytes) + " of memory.expert_cache (" +
                  sdk::format_size(static_cast<std::uint64_t>(*budget)) +
                  "); leave room for the experts one layer needs besides them, or lower auto_pin_count";
  }
  if (o.json) {
    nlohmann::ordered_json j{
        {"usage_history", path.string()},
        {"warmed_experts", warmed},
        {"bytes", bytes},
        {"page_cache_bypassed", direct_io},
        {"profile_lines",
         {{"cache.policy", "pinned"}, {"cache.auto_pin_history", path.string()}, {"cache.auto_pin_count", warmed}}}};
    if (!budget_note.empty()) j["note"] = budget_note;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "warmed " << warmed << " experts (" << bytes << " bytes) into the page cache\n";
  if (direct_io) {
    std::cout << "note: this profile reads experts with O_DIRECT (storage.direct_io: true), which bypasses the page "
                 "cache; the warmed copies help only runs with --set storage.direct_io=false\n";
  }
  std::cout << "to keep them in the expert cache from the start, add to the profile:\n"
            << "  cache:\n    policy: pinned\n    auto_pin_history: " << profile::yaml_scalar(path.string())
            << "\n    auto_pin_count: " << warmed << "\n";
  if (!budget_note.empty()) std::cout << "note: " << budget_note << "\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<CacheOptions>();
  auto* cmd = app.add_subcommand("cache",
                                 "The expert cache of a running server (--server URL), or a model's persisted usage "
                                 "history (--model M): stats, clear, warm");
  cmd->require_subcommand(1);
  auto add = [&](const char* name, const char* help, int (*fn)(const GlobalOptions&, const CacheOptions&),
                 int (*server_fn)(const CacheOptions&)) {
    auto* sub = cmd->add_subcommand(name, help);
    auto* model = sub->add_option("--model,-m", o->model, "Model directory, or a name under models.dir");
    auto* server = sub->add_option("--server", o->server, "A running colibri-server, e.g. http://127.0.0.1:8080")
                       ->check(CLI::Validator(
                           [](std::string& value) {
                             auto url = server::parse_http_url(value);
                             return url ? std::string() : url.error().message();
                           },
                           "URL"));
    model->excludes(server);
    // COLIBRI_API_KEY is read where the key is used: as an envname on each of these subcommands, CLI11 filled it
    // into the ones not used too, overwriting the --api-key given.
    sub->add_option("--api-key", o->api_key,
                    "With --server: the key given to colibri-server --api-key (env COLIBRI_API_KEY)");
    sub->add_flag("--json", o->json, "Print the answer as JSON (with --server: the server's own)");
    // clear takes no count: --top there would be silently ignored
    CLI::Option* top = nullptr;
    if (std::string_view(name) != "clear") {
      top = sub->add_option("--top", o->top,
                            "How many of the most used experts (default 10; with --server: until the cache is full)")
                ->check(apps::integer_at_least(1, "give 1 or more experts"));
    }
    if (std::string_view(name) == "warm") {
      sub->add_option("--experts", o->experts, "With --server: warm these experts (layer:expert, e.g. 3:1,3:5)")
          ->delimiter(',');
    }
    add_profile_options(*sub, global);
    sub->callback([&global, o, fn, server_fn, top] {
      o->top_given = top != nullptr && top->count() > 0;
      if (!o->server.empty()) {
        global.exit_code = server_fn(*o);
      } else if (!o->model.empty()) {
        if (!o->experts.empty()) {
          global.exit_code = usage_fail("--experts needs --server (a running server)");
          return;
        }
        global.exit_code = fn(global, *o);
      } else {
        global.exit_code = usage_fail("give --server URL (a running colibri-server) or --model M (its usage history)");
      }
    });
  };
  add("stats", "Cache statistics of the server, or where the history is and its most used experts", cache_stats,
      server_stats);
  add("clear", "Drop the server's cached experts (not pinned, not in use), or remove the history", cache_clear,
      server_clear);
  add("warm",
      "Load experts into the server's cache (--experts, else the most used), or read them into the page cache and "
      "print the profile lines that pin them",
      cache_warm, server_warm);
}

COLIBRI_CLI_COMMAND(60, setup);

}  // namespace
}  // namespace colibri::cli::cache_command
