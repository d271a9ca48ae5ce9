#include "colibri/registry/registry.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/dll/shared_library.hpp>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "registry/host_services.hpp"

namespace colibri::registry {

namespace fs = std::filesystem;
using sdk::Status;
using sdk::StatusCode;

namespace {

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// Libraries are never unloaded while the process runs (objects may still reference their code
// from static destructors); this list keeps one reference to each.
std::vector<std::shared_ptr<void>>& pinned_libraries() {
  static auto* libs = new std::vector<std::shared_ptr<void>>();
  return *libs;
}
std::mutex& pinned_mutex() {
  static std::mutex mu;
  return mu;
}

std::vector<std::string> split_fingerprint(std::string_view fp) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : fp) {
    if (c == ';') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  return parts;
}

std::string sdk_series() {
  return std::to_string(COLIBRI_SDK_VERSION_MAJOR) + "." + std::to_string(COLIBRI_SDK_VERSION_MINOR);
}

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; });
}

// What dlopen would refuse with a misleading reason (glibc says "No such file or directory" for a library of
// another architecture): the ELF header says what the file is. "" when it looks like a library for this machine.
std::string elf_problem(const fs::path& file) {
  std::error_code ec;
  const auto st = fs::status(file, ec);  // through links
  if (fs::is_symlink(fs::symlink_status(file, ec)) && !fs::exists(st)) {
    return "is a link to " + fs::read_symlink(file, ec).string() + ", which does not exist; fix or remove the link";
  }
  if (fs::is_directory(st)) return "is a directory, not a shared library; rename or remove it";
  unsigned char h[EI_NIDENT + 4] = {};
  std::ifstream in(file, std::ios::binary);
  if (!in) return "cannot be opened for reading (" + std::string(std::strerror(errno)) + "); check its permissions";
  in.read(reinterpret_cast<char*>(h), sizeof h);
  if (in.gcount() < static_cast<std::streamsize>(sizeof h) || std::memcmp(h, ELFMAG, SELFMAG) != 0) {
    return "is not a shared library (no ELF header); remove it from the plugin directory";
  }
  if (h[EI_CLASS] != ELFCLASS64) return "is a 32-bit library; rebuild it as a 64-bit one against colibri-sdk";
  std::uint16_t machine = 0;
  std::memcpy(&machine, h + EI_NIDENT + 2, sizeof machine);  // e_machine follows e_type
#if defined(__x86_64__)
  constexpr std::uint16_t kHost = EM_X86_64;
  constexpr const char* kHostName = "x86-64";
#elif defined(__aarch64__)
  constexpr std::uint16_t kHost = EM_AARCH64;
  constexpr const char* kHostName = "aarch64";
#else
  constexpr std::uint16_t kHost = 0;
  constexpr const char* kHostName = "";
#endif
  if (kHost != 0 && machine != kHost) {
    return "is built for another processor (ELF machine " + std::to_string(machine) + "), this colibri runs on " +
           kHostName + "; rebuild it for this machine";
  }
  return {};
}

// A plugin that crashes while colibri calls into it (loading, scoring, creating) would end the process with no word
// of which file it was: while a call runs, fatal signals first print it, then take their usual course.
std::atomic<const char*> g_plugin_call{nullptr};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

void on_fatal_signal(int sig) {
  if (const char* what = g_plugin_call.load()) {
    constexpr char kPrefix[] = "\nfatal: a plugin crashed (signal ";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, kPrefix, sizeof kPrefix - 1);
    char num[4] = {static_cast<char>('0' + sig / 10 % 10), static_cast<char>('0' + sig % 10), ')', ' '};
    n = ::write(STDERR_FILENO, sig >= 10 ? num : num + 1, sig >= 10 ? 4 : 3);
    n = ::write(STDERR_FILENO, what, std::strlen(what));
    constexpr char kSuffix[] = "; remove it from the plugin directory or rebuild it against this colibri\n";
    n = ::write(STDERR_FILENO, kSuffix, sizeof kSuffix - 1);
  }
  std::signal(sig, SIG_DFL);  // returning re-runs the fault (or abort() re-raises) under the default action
}

class PluginCall {
 public:
  explicit PluginCall(std::string what) : what_(std::move(what)) {
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    for (std::size_t i = 0; i < std::size(kFatalSignals); ++i) sigaction(kFatalSignals[i], &sa, &saved_[i]);
    outer_ = g_plugin_call.exchange(what_.c_str());
  }
  ~PluginCall() {
    g_plugin_call.store(outer_);
    for (std::size_t i = 0; i < std::size(kFatalSignals); ++i) sigaction(kFatalSignals[i], &saved_[i], nullptr);
  }
  PluginCall(const PluginCall&) = delete;
  PluginCall& operator=(const PluginCall&) = delete;

 private:
  std::string what_;
  const char* outer_ = nullptr;  // a call this one runs inside
  struct sigaction saved_[std::size(kFatalSignals)]{};
};

}  // namespace

std::vector<SearchDir> default_search_path(const std::vector<std::string>& profile_paths) {
  std::vector<SearchDir> dirs;
  for (const auto& p : profile_paths) dirs.push_back({p, "profile plugins.paths"});
  if (const char* env = std::getenv("COLIBRI_PLUGIN_PATH"); env != nullptr && *env != '\0') {
    std::string_view rest(env);
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      const auto item = rest.substr(0, colon);
      if (!item.empty()) dirs.push_back({fs::path(item), "COLIBRI_PLUGIN_PATH"});
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  dirs.push_back({COLIBRI_PLUGIN_INSTALL_DIR, "install dir"});
  // Where a third-party plugin built with colibri_add_plugin goes by CMake's default prefix (the packages install
  // colibri under /usr).
  dirs.push_back({"/usr/local/lib/colibri/plugins", "local plugins"});
  if (const fs::path exe = executable_dir(); !exe.empty()) {
    dirs.push_back({(exe / ".." / "lib" / "colibri" / "plugins").lexically_normal(), "next to the executable"});
    dirs.push_back({exe / "plugins", "next to the executable"});
  }
  // The same directory reached twice is searched once, under its first origin.
  std::vector<SearchDir> unique;
  std::set<fs::path> seen;
  for (auto& d : dirs) {
    std::error_code ec;
    fs::path key = fs::weakly_canonical(d.path, ec);
    if (ec) key = d.path;
    if (seen.insert(key).second) unique.push_back(std::move(d));
  }
  return unique;
}

Status check_descriptor(const sdk::PluginDescriptor* d, const fs::path& file) {
  const std::string where = file.filename().string() + " (" + file.string() + ")";
  if (d == nullptr)
    return Status(StatusCode::invalid_argument, "plugin " + where + ": colibri_plugin_entry() returned null");
  if (d->header.struct_size < sizeof(sdk::colibri_plugin_header)) {
    return Status(StatusCode::invalid_argument, "plugin " + where + ": descriptor header is too small (" +
                                                    std::to_string(d->header.struct_size) + " bytes)");
  }
  if (d->header.abi_version != sdk::kAbiVersion) {
    return Status(StatusCode::unsupported, "plugin " + where + " was built for SDK ABI " +
                                               std::to_string(d->header.abi_version) + ", this colibri has ABI " +
                                               std::to_string(sdk::kAbiVersion) + "; rebuild it against colibri-sdk " +
                                               sdk_series());
  }
  if (d->header.struct_size != sizeof(sdk::PluginDescriptor)) {
    return Status(StatusCode::unsupported, "plugin " + where + " has a descriptor of " +
                                               std::to_string(d->header.struct_size) + " bytes, expected " +
                                               std::to_string(sizeof(sdk::PluginDescriptor)) +
                                               "; rebuild it against colibri-sdk " + sdk_series());
  }
  const std::string theirs = d->header.build_fingerprint ? d->header.build_fingerprint : "";
  const auto a = split_fingerprint(theirs);
  const auto b = split_fingerprint(COLIBRI_SDK_BUILD_FINGERPRINT);
  // Compiler family and standard-library ABI must match; the SDK patch version may differ.
  if (a.size() != 3 || a[0] != b[0] || a[1] != b[1]) {
    return Status(StatusCode::unsupported, "plugin " + where + " was built with '" + theirs + "', this colibri with '" +
                                               COLIBRI_SDK_BUILD_FINGERPRINT +
                                               "'; rebuild it with the same compiler and standard library");
  }
  sdk::PluginKind kind;
  if (!parse_plugin_kind(to_string(d->kind), kind)) {
    return Status(StatusCode::invalid_argument,
                  "plugin " + where + " declares an unknown kind " + std::to_string(static_cast<unsigned>(d->kind)));
  }
  if (d->name == nullptr || !valid_name(d->name)) {
    return Status(StatusCode::invalid_argument, "plugin " + where + " has an invalid name (use a-z, 0-9, '_', '-')");
  }
  if (d->score == nullptr || d->create == nullptr) {
    return Status(StatusCode::invalid_argument, "plugin " + where + " has no score() or create() function");
  }
  for (std::size_t i = 0; i < d->options.size(); ++i) {
    const auto& o = d->options[i];
    const bool named =
        o.name != nullptr && valid_name(o.name) && std::string_view(o.name).find('-') == std::string_view::npos;
    if (!named || o.default_value == nullptr || o.doc == nullptr ||
        static_cast<unsigned>(o.type) > static_cast<unsigned>(sdk::OptionType::string_list)) {
      return Status(StatusCode::invalid_argument,
                    "plugin " + where + ": option " + std::to_string(i) +
                        (o.name != nullptr && named ? " ('" + std::string(o.name) + "')" : "") +
                        " needs a name (a-z, 0-9, '_'), a known type, a default and a doc string; fix its options "
                        "table and rebuild it");
    }
  }
  return {};
}

PluginRegistry PluginRegistry::scan(std::vector<SearchDir> search_path, const sdk::HostInfo& host) {
  PluginRegistry reg;
  reg.host_ = host;
  reg.search_path_ = std::move(search_path);
  for (const auto& dir : reg.search_path_) {
    std::error_code ec;
    if (!fs::is_directory(dir.path, ec)) {
      // The built-in places may well be absent; a directory the user named should not be, silently.
      if (dir.origin != "install dir" && dir.origin != "next to the executable") {
        spdlog::warn("plugin directory {} (from {}) {}; its plugins are not loaded", dir.path.string(), dir.origin,
                     fs::exists(dir.path, ec) ? "is not a directory (name the directory that holds the .so files)"
                                              : "does not exist");
      }
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir.path, ec)) {
      const std::string fname = entry.path().filename().string();
      if (fname.starts_with("libcolibri-") && fname.ends_with(".so")) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());  // deterministic order within a directory
    for (const auto& f : files) reg.load_one(f, host);
  }
  return reg;
}

void PluginRegistry::load_one(const fs::path& file, const sdk::HostInfo& host) {
  if (auto why = elf_problem(file); !why.empty()) {
    broken_.push_back({file, why});
    return;
  }
  auto lib = std::make_shared<boost::dll::shared_library>();
  boost::dll::fs::error_code ec;
  PluginCall call("while loading " + file.string());
  lib->load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec || !lib->is_loaded()) {
    const char* err = dlerror();
    broken_.push_back({file, std::string("cannot be loaded: ") + (err ? err : ec.message())});
    return;
  }
  if (!lib->has(COLIBRI_PLUGIN_ENTRY_SYMBOL)) {
    broken_.push_back({file, "has no entry symbol '" COLIBRI_PLUGIN_ENTRY_SYMBOL
                             "' (is it a colibri plugin? build it with colibri_add_plugin)"});
    return;
  }
  using EntryFn = const sdk::PluginDescriptor*();
  const sdk::PluginDescriptor* d = nullptr;
  try {  // a plugin's entry that throws is that plugin's fault, not every command's
    d = lib->get<EntryFn>(COLIBRI_PLUGIN_ENTRY_SYMBOL)();
  } catch (const std::exception& e) {
    broken_.push_back({file, std::string(COLIBRI_PLUGIN_ENTRY_SYMBOL) + "() threw: " + e.what()});
    return;
  } catch (...) {
    broken_.push_back({file, std::string(COLIBRI_PLUGIN_ENTRY_SYMBOL) + "() threw a non-standard exception"});
    return;
  }
  if (auto st = check_descriptor(d, file); !st) {
    broken_.push_back({file, st.message()});
    return;
  }
  if (const PluginInfo* first = find(d->kind, d->name)) {
    broken_.push_back({file, "duplicate " + std::string(to_string(d->kind)) + " plugin '" + d->name +
                                 "': already provided by " + first->path.string() + " (earlier in the search path)"});
    return;
  }
  PluginInfo info;
  info.kind = d->kind;
  info.name = d->name;
  info.version = d->version ? d->version : "";
  info.description = d->description ? d->description : "";
  info.path = file;
  info.build_fingerprint = d->header.build_fingerprint;
  info.options.assign(d->options.begin(), d->options.end());
  for (const char* c : d->capabilities) info.capabilities.emplace_back(c ? c : "");
  {
    PluginCall scoring("in score() of " + file.string());
    info.score = d->score(host);
  }
  if (info.score.value < 0) info.score.value = 0;
  info.descriptor = d;
  info.library = lib;
  {
    std::lock_guard lock(pinned_mutex());
    pinned_libraries().push_back(lib);
  }
  plugins_.push_back(std::move(info));
}

const PluginInfo* PluginRegistry::find(sdk::PluginKind kind, std::string_view name) const noexcept {
  for (const auto& p : plugins_) {
    if (p.kind == kind && p.name == name) return &p;
  }
  return nullptr;
}

sdk::Expected<const PluginInfo*> PluginRegistry::select(sdk::PluginKind kind, std::string_view name) const {
  const std::string kind_name(to_string(kind));
  auto describe = [&]() {
    std::ostringstream os;
    os << "\n  searched:";
    for (const auto& d : search_path_) os << "\n    " << d.path.string() << " (" << d.origin << ")";
    os << "\n  available " << kind_name << " plugins:";
    bool any = false;
    for (const auto& p : plugins_) {
      if (p.kind != kind) continue;
      any = true;
      os << "\n    " << p.name << " (score " << p.score.value;
      if (p.score.value == 0 && !p.score.reason.empty()) os << ": " << p.score.reason;
      os << ") " << p.path.string();
    }
    if (!any) os << " none";
    for (const auto& b : broken_) os << "\n  broken: " << b.path.string() << ": " << b.reason;
    return os.str();
  };
  if (name.empty() || name == "auto") {
    const PluginInfo* best = nullptr;
    for (const auto& p : plugins_) {
      if (p.kind == kind && p.score.value > 0 && (best == nullptr || p.score.value > best->score.value)) best = &p;
    }
    if (best == nullptr) {
      return Status(StatusCode::not_found, "no usable " + kind_name + " plugin was found" + describe());
    }
    return best;
  }
  const PluginInfo* p = find(kind, name);
  if (p == nullptr) {
    std::string hint;
    for (const auto& b : broken_) {
      if (b.path.filename().string().find("-" + std::string(name) + ".so") != std::string::npos) {
        hint = "\n  " + b.path.string() + " looks like it but was refused: " + b.reason;
      }
    }
    return Status(StatusCode::not_found,
                  "no " + kind_name + " plugin named '" + std::string(name) + "'" + hint + describe());
  }
  if (p->score.value == 0) {
    return Status(StatusCode::unsupported,
                  kind_name + " plugin '" + p->name + "' (" + p->path.string() + ") cannot run on this machine: " +
                      (p->score.reason.empty() ? "it scored 0" : p->score.reason) + describe());
  }
  return p;
}

sdk::Expected<std::shared_ptr<sdk::PluginObject>> PluginRegistry::create(const PluginInfo& plugin,
                                                                         const sdk::ConfigView& config) const {
  auto host = std::make_shared<PluginHostServices>(plugin.kind, plugin.name);
  sdk::CreateContext ctx;
  ctx.config = &config;
  ctx.host = host.get();
  ctx.host_info = &host_;
  sdk::Expected<sdk::PluginObject*> made = nullptr;
  {
    PluginCall creating("in create() of " + plugin.path.string());
    made = plugin.descriptor->create(ctx);
  }
  const std::string who =
      std::string(to_string(plugin.kind)) + " plugin '" + plugin.name + "' (" + plugin.path.string() + ")";
  if (!made) return made.error().with_context(who + " failed to create");
  if (*made == nullptr) return Status(StatusCode::internal, who + " returned no object");
  std::shared_ptr<void> library = plugin.library;
  return std::shared_ptr<sdk::PluginObject>(*made, [library, host](sdk::PluginObject* p) { delete p; });
}

}  // namespace colibri::registry
