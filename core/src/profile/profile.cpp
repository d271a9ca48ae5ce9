#include "colibri/profile/profile.hpp"

#include <spdlog/spdlog.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "colibri/sdk/os_error.hpp"
#include "colibri/util/home.hpp"

extern char** environ;

namespace colibri::profile {

namespace fs = std::filesystem;
using sdk::OptionSpec;
using sdk::OptionType;
using sdk::Status;
using sdk::StatusCode;

namespace {

// clang-format off
const OptionSpec kCanonical[] = {
  {"compute.backend", OptionType::string, "cpu", "compute plugin: cpu, cuda, vulkan or a third-party name (auto: highest score)", true},
  {"compute.device", OptionType::integer, "0", "device index for GPU backends"},
  {"compute.threads", OptionType::integer, "auto", "compute threads (auto: physical cores)", true},
  {"compute.cpu_fallback", OptionType::string, "off", "auto: run experts not in VRAM on the CPU when the cost model says that beats uploading them (logits then depend on placement); off: always upload"},
  {"compute.upload_gbps", OptionType::number, "0", "cpu_fallback cost model: host-to-device GB/s (0: measured at load)"},
  {"compute.cpu_gbps", OptionType::number, "0", "cpu_fallback cost model: CPU expert GB/s at one token (0: measured at load)"},
  {"memory.expert_cache", OptionType::size, "auto", "RAM tier for experts (auto: sized from free RAM)", true},
  {"memory.vram_budget", OptionType::size, "0", "VRAM tier for experts (0: none)"},
  {"memory.vram_admission", OptionType::string, "frequency", "when the VRAM tier is full, frequency: upload an expert only if used more often than the victim (else it runs from RAM); always: upload every miss"},
  {"memory.shared_on_device", OptionType::boolean, "true", "upload the shared (non-expert) weights once into a discrete GPU's memory"},
  {"memory.kv_on_device", OptionType::boolean, "true", "keep the KV cache in a discrete GPU's memory (attention reads it in place)"},
  {"memory.kv_sliding_window", OptionType::boolean, "true", "sliding-window layers (gpt-oss, Mistral) and chunked-attention layers (Llama 4) keep only the KV rows their window or chunk reads (false: every layer keeps the whole context)"},
  {"memory.kv_checkpoints", OptionType::integer, "4", "copies of a KV cache's sliding-window rows and recurrent states (gpt-oss, Qwen3-Next) kept per sequence where a later prompt may part from this one: its end, its generation prompt's, last message's and system prompt's starts (0: none; a later prompt then reuses only what the cache still holds)"},
  {"memory.kv_checkpoint_every", OptionType::integer, "512", "the server's prompts without a chat's structure (/v1/completions) keep their KV checkpoints at multiples of this many positions before their end too, the last ones memory.kv_checkpoints allows, so that a later prompt parting from one anywhere returns to the nearest before (0: at the end only)"},
  {"memory.activations_on_device", OptionType::boolean, "true", "keep activations in a discrete GPU's memory from op to op (only routing, KV rows and logits cross the bus)"},
  {"memory.kv_cache", OptionType::size, "auto", "a sequence's KV cache size (auto: the model's context, at most what half the RAM beside the expert cache holds for every cache held at once: the server's --max-batch, a draft model's)", true},
  {"memory.kv_budget", OptionType::size, "auto", "what colibri-server's KV caches may take together: a request joins the batch only while its cache, with its prompt, fits beside what the running and kept caches reached (kept ones given up first), else it waits in the queue; where the running caches outgrow it as they fill, the newest are paused and run their tokens again when there is room (the same answer); the oldest always runs (auto: the RAM available beside the expert cache at start where the caches are in host memory, no limit where they are in a GPU's; 0: no limit)", true},
  {"storage.plugin", OptionType::string, "pread", "storage plugin: pread, io_uring, mmap, stripe (auto: highest score)", true},
  {"storage.direct_io", OptionType::boolean, "true", "read experts with O_DIRECT, bypassing the page cache"},
  {"storage.queue_depth", OptionType::integer, "32", "reads in flight at once"},
  {"storage.paths", OptionType::path_list, "[]", "extra directories holding expert files (stripe)"},
  {"cache.policy", OptionType::string, "frequency", "cache policy plugin: frequency, lru, pinned", true},
  {"cache.pinned_experts", OptionType::string_list, "[]", "experts never evicted, as layer:expert"},
  {"prefetch.layers", OptionType::integer, "1", "layers ahead whose experts are prefetched (0: off)"},
  {"prefetch.confidence", OptionType::number, "1", "prefetch a predicted expert only if its predicted routing weight is at least this many times the mean of the token's top-k weights (1: the above-average ones, always the most likely; 0: all top-k)"},
  {"server.host", OptionType::string, "127.0.0.1", "address colibri-server binds"},
  {"server.port", OptionType::integer, "8080", "port colibri-server listens on (0: a free one)"},
  {"plugins.paths", OptionType::path_list, "[]", "directories searched first for plugin libraries"},
  {"models.dir", OptionType::path, "auto", "where model names are resolved (auto: $XDG_DATA_HOME/colibri/models)", true},
};
// clang-format on

const char* const kTopLevelWords[] = {"extends", "description"};

const OptionSpec* canonical(std::string_view key) {
  for (const auto& o : kCanonical) {
    if (key == o.name) return &o;
  }
  return nullptr;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const auto& o : kCanonical) {
    std::string s(o.name);
    s = s.substr(0, s.find('.'));
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

bool is_plugin_section(std::string_view section) {
  return section == "compute" || section == "storage" || section == "cache";
}

std::vector<std::string> section_keys(std::string_view section) {
  std::vector<std::string> out;
  for (const auto& o : kCanonical) {
    std::string_view n(o.name);
    if (n.substr(0, n.find('.')) == section) out.emplace_back(n.substr(n.find('.') + 1));
  }
  return out;
}

std::string suggestion(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string m = sdk::closest_match(word, candidates);
  return m.empty() ? std::string() : "; did you mean '" + m + "'?";
}

std::string qualified_suggestion(const std::string& section, std::string_view word,
                                 const std::vector<std::string>& candidates) {
  const std::string m = sdk::closest_match(word, candidates);
  return m.empty() ? std::string() : "; did you mean '" + section + "." + m + "'?";
}

// Range checks beyond the type.
Status check_range(const std::string& key, const sdk::ConfigValue& v) {
  if (v.is_auto) return {};
  auto int_in = [&](std::int64_t lo, std::int64_t hi) -> Status {
    const auto* i = std::get_if<std::int64_t>(&v.value);
    if (i != nullptr && (*i < lo || *i > hi)) {
      return Status(StatusCode::invalid_argument,
                    std::to_string(*i) + " is out of range; use " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    return {};
  };
  if (key == "server.port") return int_in(0, 65535);  // 0: a free port, as --port 0
  if (key == "storage.queue_depth") return int_in(1, 4096);
  if (key == "prefetch.layers") return int_in(0, 64);
  if (key == "memory.kv_checkpoints") return int_in(0, 64);
  if (key == "memory.kv_checkpoint_every") return int_in(0, 1 << 30);
  if (key == "prefetch.confidence") {
    const auto* d = std::get_if<double>(&v.value);
    if (d != nullptr && !(*d >= 0 && *d <= 64)) {
      std::ostringstream text;
      text << *d;
      return Status(StatusCode::invalid_argument, text.str() + " is out of range; use 0..64");
    }
  }
  // The core's own choices, refused where they are given (a command line's: a usage error), not when the engine opens.
  auto one_of = [&](std::initializer_list<const char*> allowed) -> Status {
    const auto* text = std::get_if<std::string>(&v.value);
    if (text == nullptr || text->empty()) return {};  // no value: the first choice, the default
    std::string list;
    for (const char* a : allowed) {
      if (*text == a) return {};
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    return Status(StatusCode::invalid_argument, "'" + *text + "' is not one of " + list);
  };
  if (key == "memory.vram_admission") return one_of({"frequency", "always"});
  if (key == "compute.cpu_fallback") return one_of({"off", "auto"});
  if (key == "compute.threads") return int_in(1, 1024);
  if (key == "compute.device") return int_in(0, 1024);
  if (key == "cache.pinned_experts") {
    for (const auto& item : std::get<std::vector<std::string>>(v.value)) {
      const auto colon = item.find(':');
      auto digits = [](std::string_view s) {
        return !s.empty() && s.size() < 10 &&
               std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
      };
      if (colon == std::string::npos || !digits(std::string_view(item).substr(0, colon)) ||
          !digits(std::string_view(item).substr(colon + 1))) {
        return Status(StatusCode::invalid_argument, "'" + item + "' is not layer:expert (e.g. \"3:1\")");
      }
    }
  }
  return {};
}

struct RawValue {
  std::string key;
  std::string text;
  Origin origin;
};

struct FileLayer {
  fs::path file;
  std::string name;
  std::string extends;
  std::string description;
  std::vector<RawValue> values;
};

std::string mark_of(const fs::path& file, const YAML::Mark& m) {
  return file.string() + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::string node_text(const YAML::Node& n) {
  if (n.IsSequence()) {
    std::string t = "[";
    for (std::size_t i = 0; i < n.size(); ++i) {
      if (i) t += ", ";
      t += n[i].Scalar();
    }
    return t + "]";
  }
  return n.Scalar();
}

// Watches one document's events: whether it holds anything, and where that starts.
class DocumentProbe : public YAML::EventHandler {
 public:
  bool content = false;
  YAML::Mark mark = YAML::Mark::null_mark();

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { seen(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { seen(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    seen(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    seen(m);
  }
  void OnMapEnd() override {}

 private:
  void seen(const YAML::Mark& m) {
    if (!content) mark = m;
    content = true;
  }
};

// The line (from 1) of the first text in `yaml` that is not blank, a comment or a document marker; 0 when none.
std::size_t first_text_line(const std::string& yaml) {
  std::istringstream lines(yaml);
  std::string line;
  for (std::size_t n = 1; std::getline(lines, line); ++n) {
    const auto start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#' || line == "---" || line == "...") continue;
    return n;
  }
  return 0;
}

sdk::Expected<FileLayer> parse_file(const fs::path& file) {
  FileLayer layer;
  layer.file = file;
  layer.name = file.stem().string();
  errno = 0;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    const int err = errno;  // what the open failed with: permissions, a missing file
    return Status(err == ENOENT ? StatusCode::not_found : StatusCode::io_error,
                  file.string() + ": cannot be read" + (err != 0 ? " (" + sdk::os_error_text(err) + ")" : ""));
  }
  std::ostringstream text_stream;
  text_stream << in.rdbuf();
  const std::string text = text_stream.str();
  YAML::Node root;
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7 (Debian 12's) repeats an empty document forever, allocating as it goes, after
    // some syntax errors (a lone ',': yaml-cpp issue 1040, fixed upstream in 2024). The first document is loaded on
    // its own; the rest are only probed, stopping at the first empty one, so that a second document (after a `---`)
    // is still an error instead of being ignored.
    root = YAML::Load(text);
    std::istringstream probe_in(text);
    YAML::Parser parser(probe_in);
    for (int document = 0; document < 2; ++document) {
      DocumentProbe probe;
      if (!parser.HandleNextDocument(probe) || !probe.content) break;
      if (document == 1) {
        return Status(StatusCode::invalid_argument,
                      mark_of(file, probe.mark) + ": a second YAML document (after '---'); a profile is one " +
                          "document: merge the two, or put the second in its own file and use 'extends'");
      }
    }
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp 0.7 says "bad file" here (it reuses that message for its nesting guard).
    return Status(StatusCode::invalid_argument,
                  mark_of(file, e.mark) +
                      ": invalid YAML: nested too deeply; a profile's settings are two levels (section: key: value)");
  } catch (const YAML::ParserException& e) {
    // A tab in a line's indentation is YAML's most common trap; its own message ("illegal map value") hides it.
    std::string hint;
    std::istringstream lines(text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      const auto indent = line.find_first_not_of(" \t");
      if (indent != std::string::npos && line.substr(0, indent).find('\t') != std::string::npos) {
        hint = "; line " + std::to_string(n) + " is indented with a tab, which YAML does not allow: use spaces";
        break;
      }
    }
    return Status(StatusCode::invalid_argument, mark_of(file, e.mark) + ": invalid YAML: " + e.msg + hint);
  }
  if (root.IsNull()) {
    // Empty, or only comments: an empty profile. Text that reads as nothing is a mistake (yaml-cpp 0.7 reads some
    // invalid YAML, a lone ',', as an empty document rather than failing).
    if (const std::size_t line = first_text_line(text); line != 0) {
      return Status(StatusCode::invalid_argument,
                    file.string() + ":" + std::to_string(line) +
                        ": no settings could be read from here (invalid YAML, or a value where a profile's mapping "
                        "of sections belongs: compute:, memory:, ...)");
    }
    return layer;
  }
  if (!root.IsMap()) {
    return Status(StatusCode::invalid_argument,
                  mark_of(file, root.Mark()) + ": a profile is a mapping of sections (compute:, memory:, ...)");
  }
  const auto all_sections = sections();
  std::vector<std::string> top_words(all_sections);
  top_words.insert(top_words.end(), std::begin(kTopLevelWords), std::end(kTopLevelWords));
  std::map<std::string, std::string> section_at;  // a section written twice: YAML would merge or drop silently
  for (const auto& kv : root) {
    const std::string top = kv.first.Scalar();
    const YAML::Node& val = kv.second;
    const std::string where = mark_of(file, kv.first.Mark());
    if (const auto [it, first] = section_at.emplace(top, where); !first) {
      return Status(StatusCode::invalid_argument,
                    where + ": '" + top + "' is written twice (first at " + it->second + "); merge the two into one");
    }
    if (top == "extends" || top == "description") {
      if (!val.IsScalar()) return Status(StatusCode::invalid_argument, where + ": '" + top + "' takes a single value");
      if (top == "extends" && val.Scalar().empty()) {
        return Status(StatusCode::invalid_argument,
                      where + ": 'extends' is empty; name the profile this one builds on, or remove the line");
      }
      (top == "extends" ? layer.extends : layer.description) = val.Scalar();
      continue;
    }
    if (std::find(all_sections.begin(), all_sections.end(), top) == all_sections.end()) {
      return Status(StatusCode::invalid_argument,
                    where + ": unknown section '" + top + "'" + suggestion(top, top_words));
    }
    if (val.IsNull()) continue;
    if (!val.IsMap()) {
      return Status(StatusCode::invalid_argument, where + ": section '" + top + "' must be a mapping of keys");
    }
    for (const auto& item : val) {
      const std::string key = top + "." + item.first.Scalar();
      const std::string iwhere = mark_of(file, item.first.Mark());
      const YAML::Node& v = item.second;
      if (v.IsMap())
        return Status(StatusCode::invalid_argument, iwhere + ": '" + key + "' takes a value or a list, not a mapping");
      if (v.IsSequence()) {
        for (const auto& e : v) {
          if (!e.IsScalar()) {
            return Status(StatusCode::invalid_argument,
                          mark_of(file, e.Mark()) + ": '" + key + "' must be a list of plain values");
          }
        }
      }
      const OptionSpec* spec = canonical(key);
      if (spec == nullptr && !is_plugin_section(top)) {
        return Status(StatusCode::invalid_argument,
                      iwhere + ": unknown key '" + key + "'" + suggestion(item.first.Scalar(), section_keys(top)));
      }
      if (spec != nullptr && v.IsSequence() && spec->type != OptionType::string_list &&
          spec->type != OptionType::path_list) {
        return Status(StatusCode::invalid_argument,
                      iwhere + ": '" + key + "' takes a single " + std::string(to_string(spec->type)) + ", not a list");
      }
      for (const auto& earlier : layer.values) {
        if (earlier.key == key) {  // YAML would keep the last silently; one of the two is a mistake
          return Status(StatusCode::invalid_argument, iwhere + ": '" + key + "' is set twice (first at " +
                                                          earlier.origin.key_location + "); keep one");
        }
      }
      const YAML::Mark vm = v.IsNull() ? item.first.Mark() : v.Mark();
      layer.values.push_back(
          {key, v.IsNull() ? "" : node_text(v),
           Origin{Origin::Layer::profile, layer.name + " (" + mark_of(file, vm) + ")", iwhere, file}});
    }
  }
  return layer;
}

// A path option's value as a shell would read it: ~ is the home directory; a relative one written in a profile file
// starts at that file's directory (as `extends` does), one from a flag or the environment at the working directory.
void resolve_paths(const OptionSpec& spec, sdk::ConfigValue& value, const Origin& origin) {
  if (value.is_auto || (spec.type != OptionType::path && spec.type != OptionType::path_list)) return;
  const auto resolve = [&](std::string& p) {
    if (p == "~" || p.starts_with("~/")) {
      if (const std::string home = util::home_dir().string(); !home.empty()) p = home + p.substr(1);
    }
    // Not normalised: `..` is the OS's to resolve (through a profile directory that is a symlink, as the shell would).
    if (!p.empty() && p.front() != '/' && !origin.file.empty()) p = (origin.file.parent_path() / p).string();
  };
  if (auto* one = std::get_if<std::string>(&value.value)) resolve(*one);
  if (auto* list = std::get_if<std::vector<std::string>>(&value.value)) {
    for (auto& p : *list) resolve(p);
  }
}

bool looks_like_path(std::string_view s) {
  return s.find('/') != std::string_view::npos || s.ends_with(".yaml") || s.ends_with(".yml");
}

// `except`: a file that does not count (a profile that extends its own name means the one it shadows).
sdk::Expected<fs::path> find_profile(const std::string& name, const fs::path& relative_to,
                                     const std::vector<fs::path>& dirs, const fs::path& except = {}) {
  std::vector<fs::path> candidates;
  if (looks_like_path(name)) {
    fs::path p(name);
    if (p.is_relative() && !relative_to.empty()) p = relative_to / p;  // never the working directory's
    candidates.push_back(p);
  } else {
    for (const char* ext : {".yaml", ".yml"}) {
      if (!relative_to.empty()) candidates.push_back(relative_to / (name + ext));
    }
    for (const auto& d : dirs) {
      for (const char* ext : {".yaml", ".yml"}) candidates.push_back(d / (name + ext));
    }
  }
  std::error_code ec;
  const fs::path skip = except.empty() ? fs::path() : fs::weakly_canonical(except, ec);
  bool only_itself = false;
  for (const auto& c : candidates) {
    if (!fs::is_regular_file(c, ec)) continue;
    if (!skip.empty() && fs::weakly_canonical(c, ec) == skip) {
      only_itself = true;
      continue;
    }
    return c;
  }
  if (only_itself) {
    return Status(StatusCode::invalid_argument,
                  "'extends: " + name +
                      "' names this profile itself, and no other profile of that name was found; "
                      "a profile extends another one (by name or path), or nothing");
  }
  if (looks_like_path(name) && fs::is_directory(candidates.front(), ec)) {
    return Status(StatusCode::invalid_argument,
                  "profile '" + name + "' is a directory; name a profile file (.yaml) or a profile name");
  }
  // A pipe, socket or device is there but is no file to read settings from (a pipe would also block the read).
  for (const auto& c : candidates) {
    const auto type = fs::status(c, ec).type();
    if (ec || type == fs::file_type::not_found || type == fs::file_type::directory) continue;
    return Status(StatusCode::invalid_argument, "profile '" + name + "': " + c.string() + " is " +
                                                    sdk::path_kind_text(c.string()) +
                                                    ", not a profile file; name a .yaml file or a profile name");
  }
  // A candidate that is there but cannot be followed (a link loop, a link to nothing, no permission to look) is
  // named as such: "not found" would have the user look for a file they can see.
  for (const auto& c : candidates) {
    if (!fs::is_symlink(c, ec)) continue;
    std::error_code follow;
    (void)fs::status(c, follow);
    const std::string why = follow == std::errc::no_such_file_or_directory
                                ? "its target " + fs::read_symlink(c, ec).string() + " does not exist"
                            : follow ? follow.message()
                                     : "it points to something that is not a file";
    return Status(StatusCode::invalid_argument, "profile '" + name + "': " + c.string() +
                                                    " is a symbolic link that does not lead to a profile file (" + why +
                                                    "); point it at one");
  }
  std::string msg = "profile '" + name + "' was not found; looked in:";
  for (const auto& c : candidates) msg += "\n  " + c.string();
  auto known = list_profiles(dirs);
  if (!known.empty()) {
    msg += "\navailable profiles:";
    std::vector<std::string> names;
    for (const auto& [n, p] : known) {
      msg += " " + n;
      names.push_back(n);
    }
    msg += suggestion(name, names);
  }
  return Status(StatusCode::not_found, msg);
}

std::string env_name(std::string_view key) {
  std::string n = "COLIBRI_";
  for (char c : key) n.push_back(c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  return n;
}

}  // namespace

std::string Origin::describe() const {
  switch (layer) {
    case Layer::builtin: return detail.empty() ? "built-in default" : "default of " + detail;
    case Layer::profile: return "profile " + detail;
    case Layer::environment: return "environment " + detail;
    case Layer::cli: return "command line " + detail;
  }
  return detail;
}

std::span<const OptionSpec> canonical_options() {
  return kCanonical;
}

std::string_view plugin_section(sdk::PluginKind kind) {
  switch (kind) {
    case sdk::PluginKind::compute: return "compute";
    case sdk::PluginKind::storage: return "storage";
    case sdk::PluginKind::cache: return "cache";
  }
  return "";
}

std::string_view plugin_selector_key(sdk::PluginKind kind) {
  switch (kind) {
    case sdk::PluginKind::compute: return "compute.backend";
    case sdk::PluginKind::storage: return "storage.plugin";
    case sdk::PluginKind::cache: return "cache.policy";
  }
  return "";
}

std::vector<fs::path> default_profile_dirs() {
  std::vector<fs::path> dirs;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg != '\0') {
    dirs.emplace_back(fs::path(xdg) / "colibri" / "profiles");
  } else if (const fs::path home = util::home_dir(); !home.empty()) {
    dirs.emplace_back(home / ".config" / "colibri" / "profiles");
  }
  dirs.emplace_back("/etc/colibri/profiles");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path() / ".." / "share" / "colibri" / "profiles").lexically_normal());
  dirs.emplace_back(COLIBRI_PROFILE_INSTALL_DIR);
  return dirs;
}

std::vector<std::pair<std::string, fs::path>> list_profiles(const std::vector<fs::path>& dirs) {
  std::vector<std::pair<std::string, fs::path>> out;
  std::set<std::string> seen;
  for (const auto& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      if (e.path().extension() == ".yaml" || e.path().extension() == ".yml") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      if (seen.insert(f.stem().string()).second) out.emplace_back(f.stem().string(), f);
    }
  }
  return out;
}

sdk::Expected<Profile> Profile::load(const LoadOptions& options) {
  try {
    Profile prof;
    const auto dirs = options.search_dirs.empty() ? default_profile_dirs() : options.search_dirs;

    std::map<std::string, std::string> env = options.environment;
    if (options.use_process_environment && env.empty()) {
      for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        std::string_view kv(*e);
        if (!kv.starts_with("COLIBRI_")) continue;
        const auto eq = kv.find('=');
        if (eq != std::string_view::npos) env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
      }
    }

    // 1. Built-in defaults.
    for (const auto& o : kCanonical) {
      auto v = sdk::parse_option_value(o, o.default_value);
      if (!v) return v.error().with_context(std::string("built-in default of ") + o.name);
      prof.entries_[o.name] = Entry{o.name, o.default_value, *v, Origin{}, true};
    }

    // 2. The profile and what it extends (base first).
    std::string requested = options.profile;
    bool implicit = false;
    if (requested.empty()) {
      if (auto it = env.find("COLIBRI_PROFILE"); it != env.end() && !it->second.empty()) {
        requested = it->second;
      } else {
        requested = "cpu";
        implicit = true;
      }
    }
    std::vector<FileLayer> chain;
    auto first = find_profile(requested, {}, dirs);
    if (!first) {
      if (!implicit) return first.error();
      prof.name_ = "built-in";
    } else {
      fs::path file = *first;
      std::set<fs::path> visiting;
      while (true) {
        std::error_code ec;
        fs::path canon = fs::weakly_canonical(file, ec);
        if (!visiting.insert(ec ? file : canon).second) {
          return Status(StatusCode::invalid_argument, file.string() + ": 'extends' forms a cycle");
        }
        auto layer = parse_file(file);
        if (!layer) return layer.error();
        prof.files_.push_back(file);
        if (prof.description_.empty()) prof.description_ = layer->description;  // the nearest file's says most
        const std::string parent = layer->extends;
        chain.push_back(std::move(*layer));
        if (parent.empty()) break;
        // `extends: cpu` in a user's own cpu.yaml means the cpu profile it shadows, further down the search order.
        auto next = find_profile(parent, file.parent_path(), dirs, file);
        if (!next) return next.error().with_context(file.string() + ": extends '" + parent + "'");
        file = *next;
      }
      prof.name_ = chain.front().name;
    }

    auto apply = [&](const std::string& key, const std::string& text, const Origin& origin) -> Status {
      const OptionSpec* spec = canonical(key);
      Entry e{key, text, sdk::ConfigValue{text}, origin, false};
      if (spec != nullptr) {
        auto v = sdk::parse_option_value(*spec, text);
        if (!v) return Status(StatusCode::invalid_argument, origin.detail + ": " + key + ": " + v.error().message());
        if (auto st = check_range(key, *v); !st) {
          return Status(StatusCode::invalid_argument, origin.detail + ": " + key + ": " + st.message());
        }
        resolve_paths(*spec, *v, origin);
        e.value = *v;
        e.validated = true;
      }
      prof.entries_[key] = std::move(e);
      return {};
    };

    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      for (const auto& rv : it->values) {
        if (auto st = apply(rv.key, rv.text, rv.origin); !st) return st;
      }
    }

    // 3. Environment: COLIBRI_<SECTION>_<KEY> for the canonical keys.
    for (const auto& o : kCanonical) {
      const std::string name = env_name(o.name);
      // An empty variable is unset (as COLIBRI_PROFILE is): `COLIBRI_STORAGE_PLUGIN= cmd` does not mean "auto".
      if (auto it = env.find(name); it != env.end() && !it->second.empty()) {
        if (auto st = apply(o.name, it->second, Origin{Origin::Layer::environment, name, {}, {}}); !st) return st;
      }
    }

    // A COLIBRI_<SECTION>_... variable that names no key is a typo or a plugin's option (those are not read from
    // the environment): said once, not ignored silently.
    std::vector<std::string> names;
    for (const auto& o : kCanonical) names.push_back(env_name(o.name));
    for (const auto& [name, value] : env) {
      // The programs' own variables; COLIBRI_SERVER_ARGS: the packaged service's flags (/etc/default/colibri).
      static const std::set<std::string, std::less<>> kOwn{
          "COLIBRI_SERVER_ARGS", "COLIBRI_PROFILE", "COLIBRI_PLUGIN_PATH", "COLIBRI_LOG_LEVEL", "COLIBRI_API_KEY"};
      if (kOwn.count(name) > 0) continue;
      std::string section;
      for (const auto& sec : sections()) {
        if (name.starts_with(env_name(sec) + "_")) section = sec;
      }
      if (section.empty()) {
        // Not a section's: another program's variable (COLIBRI_PROFILE, COLIBRI_API_KEY) unless it is a key's
        // name with the section misspelt (COLIBRI_MEMROY_EXPERT_CACHE) or left out (COLIBRI_EXPERT_CACHE).
        if (!name.starts_with("COLIBRI_")) continue;
        std::string near = sdk::closest_match(name, names);
        for (std::size_t i = 0; near.empty() && i < names.size(); ++i) {
          const std::string_view key = kCanonical[i].name;
          if (env_name(key.substr(key.find('.') + 1)) == name) near = names[i];
        }
        if (!near.empty() && near != name) {
          spdlog::warn("environment {} names no canonical key and is ignored (did you mean {}?)", name, near);
        }
        continue;
      }
      const bool known = std::find(names.begin(), names.end(), name) != names.end();
      if (!known) {
        const std::string near = sdk::closest_match(name, names);
        spdlog::warn(
            "environment {} names no canonical key and is ignored{}; only the canonical keys are read "
            "from the environment (a plugin's own option goes in the profile or --set {}.KEY=VALUE)",
            name, near.empty() ? "" : " (did you mean " + near + "?)", section);
      }
    }

    // 4. Command line.
    std::vector<std::string> all_keys;
    for (const auto& o : kCanonical) all_keys.emplace_back(o.name);
    std::map<std::string, std::pair<std::string, std::string>> set_by;  // key -> (value, shown) of the flag
    for (const auto& ov : options.overrides) {
      // "--set key=value"; a flag that stands for one key, "--expert-cache-size 8G"; a flag that sets several
      // (written with its whole argument, "--policy lru:half_life=3") as it is.
      const std::string shown = ov.flag == "--set"                       ? "--set " + ov.key + "=" + ov.value
                                : ov.flag.find(' ') != std::string::npos ? ov.flag
                                                                         : ov.flag + " " + ov.value;
      const auto dot = ov.key.find('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == ov.key.size()) {
        return Status(StatusCode::invalid_argument,
                      shown + ": keys are written section.key (e.g. storage.plugin)" + suggestion(ov.key, all_keys));
      }
      const std::string section = ov.key.substr(0, dot);
      if (canonical(ov.key) == nullptr && !is_plugin_section(section)) {
        return Status(StatusCode::invalid_argument,
                      shown + ": unknown key '" + ov.key + "'" + suggestion(ov.key, all_keys));
      }
      // A dedicated flag and --set for one key: which came last is not known here, so neither wins silently.
      // (--set twice: the last wins, so that a script can append an override.)
      // Values compare as what they mean: 4G and 4096M are one size.
      auto same_value = [&](const std::string& a, const std::string& b) {
        if (a == b) return true;
        const OptionSpec* spec = canonical(ov.key);
        if (spec == nullptr) return false;
        auto va = sdk::parse_option_value(*spec, a), vb = sdk::parse_option_value(*spec, b);
        return va && vb && va->is_auto == vb->is_auto && va->value == vb->value;
      };
      if (const auto it = set_by.find(ov.key); it != set_by.end() && !same_value(it->second.first, ov.value) &&
                                               !(ov.flag == "--set" && it->second.second.starts_with("--set "))) {
        return Status(StatusCode::invalid_argument, it->second.second + " and " + shown + " both set " + ov.key +
                                                        " to different values; give one of them");
      }
      set_by[ov.key] = {ov.value, shown};
      if (auto st = apply(ov.key, ov.value, Origin{Origin::Layer::cli, shown, {}, {}}); !st) return st;
    }
    return prof;
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("loading the profile: ") + e.what());
  }
}

sdk::Status Profile::apply_plugin_schema(sdk::PluginKind kind, std::string_view plugin_name,
                                         std::span<const sdk::OptionSpec> options) {
  const std::string section(plugin_section(kind));
  const std::string prefix = section + ".";
  std::vector<std::string> candidates;
  for (const auto& k : section_keys(section)) candidates.push_back(k);
  for (const auto& o : options) candidates.emplace_back(o.name);
  for (auto& [key, entry] : entries_) {
    if (!key.starts_with(prefix) || entry.validated) continue;
    const std::string short_key = key.substr(prefix.size());
    const OptionSpec* spec = nullptr;
    for (const auto& o : options) {
      if (short_key == o.name) spec = &o;
    }
    if (spec == nullptr) {
      std::string known;
      for (const auto& c : candidates) known += (known.empty() ? "" : ", ") + c;
      return Status(StatusCode::invalid_argument, entry.origin.key_place() + ": unknown key '" + key + "'" +
                                                      qualified_suggestion(section, short_key, candidates) + " (" +
                                                      section + " keys with " + section + " plugin '" +
                                                      std::string(plugin_name) + "': " + known + ")");
    }
    auto v = sdk::parse_option_value(*spec, entry.text);
    if (!v) {
      return Status(StatusCode::invalid_argument, entry.origin.detail + ": " + key + " (an option of " + section +
                                                      " plugin '" + std::string(plugin_name) +
                                                      "'): " + v.error().message());
    }
    resolve_paths(*spec, *v, entry.origin);
    entry.value = *v;
    entry.validated = true;
  }
  for (const auto& o : options) {
    const std::string key = prefix + o.name;
    if (entries_.count(key) != 0 || o.default_value == nullptr || *o.default_value == '\0') continue;
    auto v = sdk::parse_option_value(o, o.default_value);
    if (!v) {
      return Status(StatusCode::internal, section + " plugin '" + std::string(plugin_name) +
                                              "' has an invalid default for " + o.name + ": " + v.error().message());
    }
    entries_[key] =
        Entry{key, o.default_value, *v,
              Origin{Origin::Layer::builtin, section + " plugin '" + std::string(plugin_name) + "'", {}, {}}, true};
  }
  return {};
}

std::vector<const Entry*> Profile::unvalidated() const {
  std::vector<const Entry*> out;
  for (const auto& [k, e] : entries_) {
    if (!e.validated) out.push_back(&e);
  }
  return out;
}

sdk::Status Profile::require_all_validated() const {
  for (const auto* e : unvalidated()) {
    const std::string section = e->key.substr(0, e->key.find('.'));
    return Status(StatusCode::invalid_argument,
                  e->origin.key_place() + ": unknown key '" + e->key + "'" +
                      qualified_suggestion(section, e->key.substr(section.size() + 1), section_keys(section)));
  }
  return {};
}

sdk::ConfigView Profile::section(std::string_view section) const {
  std::map<std::string, sdk::ConfigValue, std::less<>> values;
  const std::string prefix = std::string(section) + ".";
  for (const auto& [k, e] : entries_) {
    if (k.starts_with(prefix)) values.emplace(k.substr(prefix.size()), e.value);
  }
  return sdk::ConfigView(std::move(values));
}

const Entry* Profile::find(std::string_view key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

std::string Profile::get_string(std::string_view key) const {
  const Entry* e = find(key);
  if (e == nullptr) return {};
  if (const auto* s = std::get_if<std::string>(&e->value.value)) return *s;
  return e->text;
}

std::string yaml_scalar(std::string_view text) {
  YAML::Emitter out;
  out << std::string(text);
  return out.c_str();
}

std::string Profile::get_path(std::string_view key) const {
  const Entry* e = find(key);
  if (e == nullptr) return {};
  static const OptionSpec kPath{"path", OptionType::path, "", ""};
  auto v = sdk::parse_option_value(kPath, e->text);
  if (!v) return {};
  resolve_paths(kPath, *v, e->origin);
  return std::get<std::string>(v->value);
}

std::vector<std::string> Profile::get_list(std::string_view key) const {
  const Entry* e = find(key);
  if (e == nullptr) return {};
  if (const auto* l = std::get_if<std::vector<std::string>>(&e->value.value)) return *l;
  return {};
}

std::optional<std::int64_t> Profile::get_int(std::string_view key) const {
  const Entry* e = find(key);
  if (e == nullptr || e->value.is_auto) return std::nullopt;
  if (const auto* i = std::get_if<std::int64_t>(&e->value.value)) return *i;
  return std::nullopt;
}

bool Profile::is_auto(std::string_view key) const {
  const Entry* e = find(key);
  return e != nullptr && e->value.is_auto;
}

}  // namespace colibri::profile
