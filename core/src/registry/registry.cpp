#include "colibri/registry/registry.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <link.h>
#include <poll.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <boost/dll/shared_library.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>

#include "colibri/profile/profile.hpp"
#include "colibri/sdk/config.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/util/home.hpp"
#include "colibri/util/host_info.hpp"
#include "colibri/util/output_file.hpp"
#include "model/file_io.hpp"
#include "registry/host_services.hpp"
#include "registry/shipped_plugins.hpp"

extern char** environ;

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
  std::error_code ec, status_ec;
  const auto st = fs::status(file, status_ec);  // through links
  if (fs::is_symlink(fs::symlink_status(file, ec)) && !fs::exists(st)) {
    if (status_ec.value() == ELOOP) return "is a link that leads back to itself (a loop); fix or remove the link";
    return "is a link to " + fs::read_symlink(file, ec).string() + ", which does not exist; fix or remove the link";
  }
  if (fs::is_directory(st)) return "is a directory, not a shared library; rename or remove it";
  // Opening a FIFO to read its header would wait for a writer forever.
  if (!fs::is_regular_file(st)) return "is " + sdk::path_kind_text(file.string()) + ", not a shared library; remove it";
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
  // A file cut short (a copy interrupted) would be mapped past its end: dlopen then dies of SIGBUS in the loader, with
  // no chance to list the file as broken. The headers say how long the file must be.
  const std::uint64_t size = fs::file_size(file, ec);
  Elf64_Ehdr eh{};
  in.clear();
  in.seekg(0);
  in.read(reinterpret_cast<char*>(&eh), sizeof eh);
  const auto cut_short = [&](std::uint64_t needed) {
    return "is cut short (its ELF headers need " + std::to_string(needed) + " bytes, the file has " +
           std::to_string(size) + "); copy or build it again whole";
  };
  if (ec || in.gcount() < static_cast<std::streamsize>(sizeof eh)) return cut_short(sizeof eh);
  // A table [offset, offset + count * entry) within the file (offsets are the file's word: no sum may wrap).
  const auto within = [size](std::uint64_t offset, std::uint64_t bytes) {
    return offset <= size && bytes <= size - offset;
  };
  if (eh.e_phentsize != sizeof(Elf64_Phdr)) {
    return "has a damaged ELF header (program headers of " + std::to_string(eh.e_phentsize) +
           " bytes); copy or build it again";
  }
  const auto end = [](std::uint64_t offset, std::uint64_t bytes) {  // saturating: a garbage offset is no small size
    return bytes > UINT64_MAX - offset ? UINT64_MAX : offset + bytes;
  };
  const std::uint64_t ph_bytes = std::uint64_t{eh.e_phnum} * eh.e_phentsize;
  if (!within(eh.e_phoff, ph_bytes)) return cut_short(end(eh.e_phoff, ph_bytes));
  const std::uint64_t sh_bytes = std::uint64_t{eh.e_shnum} * eh.e_shentsize;
  if (!within(eh.e_shoff, sh_bytes)) return cut_short(end(eh.e_shoff, sh_bytes));
  const std::uint64_t ph_end = eh.e_phoff + ph_bytes;
  in.seekg(static_cast<std::streamoff>(eh.e_phoff));
  for (std::uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    in.read(reinterpret_cast<char*>(&ph), sizeof ph);
    if (in.gcount() < static_cast<std::streamsize>(sizeof ph)) return cut_short(ph_end);
    if (ph.p_type == PT_LOAD && !within(ph.p_offset, ph.p_filesz)) return cut_short(end(ph.p_offset, ph.p_filesz));
  }
  return {};
}

// A plugin that crashes would end the process with no word of which file it was. One handler, installed with the
// first plugin, names it: the call colibri is making into a plugin (loading, scoring, creating), else the plugin whose
// code is at the faulting address or on the crashing stack (a victim pick, a read, a kernel). Then the signal takes the
// course it had before (the default action, or a sanitizer's report).
std::atomic<const char*> g_plugin_call{nullptr};
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
struct sigaction g_previous[std::size(kFatalSignals)]{};

// Loading and scoring run in every command, and create() in every command that picks the plugin, so a plugin that
// crashes there would end every such command. While they run, the handler also writes a crash record for the file
// (prepared here, written with async-signal-safe calls only), and later scans skip the file until it changes
// (crash_record_reason); with `auto` the next plugin of its kind is picked.
struct CrashRecord {
  std::vector<std::string> dirs;  // created in order, each inside the one before
  std::string path;               // the record file
  std::string identity;           // its first lines: which file, of what size and time, under which colibri
  std::string during;             // its last line, the call that crashed ("in create()\n"); none: loading or scoring
  pid_t thread = 0;               // the calling thread: a crash on another thread is not this plugin's
};
std::atomic<const CrashRecord*> g_crash_record{nullptr};

// Writes the record with what ended the process ("signal " "11", "exit status " "3", "timeout " "60 s"); true when it
// is written.
bool write_crash_record(const CrashRecord& r, const char* what, const char* value) {
  for (const auto& d : r.dirs) (void)::mkdir(d.c_str(), 0755);  // EEXIST and the like: the open below decides
  const int fd = ::open(r.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return false;
  bool ok = ::write(fd, r.identity.data(), r.identity.size()) == static_cast<ssize_t>(r.identity.size());
  const std::size_t w = std::strlen(what), n = std::strlen(value);
  ok = ok && ::write(fd, what, w) == static_cast<ssize_t>(w) && ::write(fd, value, n) == static_cast<ssize_t>(n) &&
       ::write(fd, "\n", 1) == 1 &&
       ::write(fd, r.during.data(), r.during.size()) == static_cast<ssize_t>(r.during.size());
  ok = ::close(fd) == 0 && ok;
  return ok;
}

// Executable ranges of the loaded plugins, written before they are published through g_code_range_count.
struct CodeRange {
  std::uintptr_t begin = 0, end = 0;
  const char* label = nullptr;  // "cache plugin 'x' (/path/libcolibri-cache-x.so)"
};
constexpr std::size_t kMaxCodeRanges = 512;
CodeRange g_code_ranges[kMaxCodeRanges];
std::atomic<std::size_t> g_code_range_count{0};
std::mutex g_code_range_mutex;

const char* plugin_code_at(std::uintptr_t pc) {
  const std::size_t n = g_code_range_count.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    if (pc >= g_code_ranges[i].begin && pc < g_code_ranges[i].end) return g_code_ranges[i].label;
  }
  return nullptr;
}

void write_stderr(const char* text) {
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, text, std::strlen(text));
}

std::uintptr_t faulting_pc(void* context) {
  if (context == nullptr) return 0;
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<std::uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

// What a signal in a plugin usually means, for the crash message ("" when there is nothing to add).
const char* signal_hint(int sig) {
  switch (sig) {
    case SIGABRT:
      return "(SIGABRT: the plugin aborted, most often on a C++ exception it let escape (plugin entry points must not "
             "throw) or a failed assertion)\n";
    case SIGILL:
      return "(SIGILL: an instruction this CPU lacks; was the plugin built with -march for another machine?)\n";
    case SIGBUS:
      return "(SIGBUS: a file mapped into memory became shorter while it was read; was a model file replaced or "
             "truncated while colibri ran?)\n";
    default: return "";
  }
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  char num[8] = {};
  num[0] = sig >= 10 ? static_cast<char>('0' + sig / 10 % 10) : static_cast<char>('0' + sig % 10);
  if (sig >= 10) num[1] = static_cast<char>('0' + sig % 10);
  if (const char* what = g_plugin_call.load()) {
    write_stderr("\nfatal: a plugin crashed (signal ");
    write_stderr(num);
    write_stderr(") ");
    write_stderr(what);
    write_stderr("; remove it from the plugin directory or rebuild it against this colibri\n");
    write_stderr(signal_hint(sig));
    if (const CrashRecord* record = g_crash_record.load();
        record != nullptr && record->thread == ::gettid() && write_crash_record(*record, "signal ", num)) {
      write_stderr(
          "colibri skips this file from now on, until it or colibri changes (to try it again as it is, delete ");
      write_stderr(record->path.c_str());
      write_stderr(")\n");
    }
  } else {
    const char* where = plugin_code_at(faulting_pc(context));
    if (where == nullptr && g_code_range_count.load() > 0) {
      void* frames[64];
      const int n = ::backtrace(frames, 64);
      for (int i = 0; i < n && where == nullptr; ++i)
        where = plugin_code_at(reinterpret_cast<std::uintptr_t>(frames[i]));
    }
    if (where != nullptr) {
      write_stderr("\nfatal: signal ");
      write_stderr(num);
      write_stderr(" while running the code of ");
      write_stderr(where);
      write_stderr("\n");
      write_stderr(signal_hint(sig));
    }
  }
  for (std::size_t i = 0; i < std::size(kFatalSignals); ++i) {
    if (kFatalSignals[i] == sig) sigaction(sig, &g_previous[i], nullptr);
  }
  // A fault recurs when the handler returns; a signal sent by raise(), kill() or abort() would not: send it again.
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
}

void install_crash_reporter() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[1];
    ::backtrace(warm, 1);  // loads the unwinder now: the handler must not be the first to
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    for (std::size_t i = 0; i < std::size(kFatalSignals); ++i) sigaction(kFatalSignals[i], &sa, &g_previous[i]);
  });
}

// Publishes the executable segments of the library holding `symbol` under `label`.
void register_plugin_code(const void* symbol, const std::string& label) {
  Dl_info info{};
  if (::dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return;
  struct Search {
    const char* file;
    const void* base;
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  } search{info.dli_fname, info.dli_fbase, {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* object, std::size_t, void* data) {
        auto* sr = static_cast<Search*>(data);
        if (object->dlpi_name == nullptr || std::strcmp(object->dlpi_name, sr->file) != 0) return 0;
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const auto& ph = object->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
          const std::uintptr_t begin = object->dlpi_addr + ph.p_vaddr;
          sr->ranges.emplace_back(begin, begin + ph.p_memsz);
        }
        return 1;
      },
      &search);
  std::lock_guard lock(g_code_range_mutex);
  const char* text = ::strdup(label.c_str());  // lives as long as the process: the handler may read it at any time
  for (const auto& [begin, end] : search.ranges) {
    const std::size_t n = g_code_range_count.load(std::memory_order_relaxed);
    if (n == kMaxCodeRanges) return;
    g_code_ranges[n] = {begin, end, text};
    g_code_range_count.store(n + 1, std::memory_order_release);
  }
}

// The crash record of `file`: <cache>/crashed-plugins/<file name>-<xxh64 of its path>.txt, whose first lines name the
// file, its size and its modification time, so a file rebuilt or replaced no longer matches. nullopt where the file
// cannot be stat'ed (the load then says why).
std::optional<CrashRecord> crash_record_for(const fs::path& file) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(file, ec), ec);
  if (ec) abs = file;
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) return std::nullopt;
  const std::string text = abs.string();
  const std::string hash = model::io::hex64(XXH64(text.data(), text.size(), 0));
  const fs::path dir = util::colibri_cache_dir() / "crashed-plugins";
  CrashRecord r;
  r.dirs = {dir.parent_path().parent_path().string(), dir.parent_path().string(), dir.string()};
  r.path = (dir / (abs.filename().string() + "-" + hash + ".txt")).string();
  // colibri's build too: an upgrade (of colibri, or of the compiler and library it was built with) tries it again.
  r.identity = "colibri crash record 1\nfile " + text + "\nsize " + std::to_string(st.st_size) + "\nmtime " +
               std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) +
               "\ncolibri " COLIBRI_SDK_BUILD_FINGERPRINT "\n";
  r.thread = ::gettid();
  return r;
}

// What a record of this very file says after its identity ("signal 11\n" and the call); nullopt where there is none.
// A record of an earlier version of the file is removed.
std::optional<std::string> crash_record_body(const CrashRecord& r) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(r.path, ec))) return std::nullopt;
  auto text = model::io::read_text(r.path, 1 << 16);
  if (!text || !text->starts_with(r.identity)) {
    fs::remove(r.path, ec);  // the file changed since (or the record is not one): try it again
    return std::nullopt;
  }
  return text->substr(r.identity.size());
}

// Why the file of `r` is skipped: a record of this very file says it crashed an earlier run while loading, scoring
// or creating (or, in the probe, ended it or hung). "" to load it.
std::string crash_record_reason(const CrashRecord& r) {
  std::error_code ec;
  auto body = crash_record_body(r);
  if (!body) return {};
  std::string signal = std::move(*body);
  // A hang may have been a slow day (a driver's cold start on a loaded machine): tried again after a day.
  if (signal.starts_with("timeout ")) {
    const auto age = fs::file_time_type::clock::now() - fs::last_write_time(r.path, ec);
    if (!ec && age > std::chrono::hours(24)) {
      fs::remove(r.path, ec);
      return {};
    }
  }
  std::string during = "while loading or scoring";
  if (const auto eol = signal.find('\n'); eol != std::string::npos) {
    if (std::string rest = signal.substr(eol + 1); rest.starts_with("in ")) during = rest;
    signal.resize(eol);
  }
  while (!during.empty() && during.back() == '\n') during.pop_back();
  // What ended it: a signal (here or in colibri-plugin-probe), or in the probe an exit or no answer in time.
  std::string ended = "crashed colibri (" + signal + ")";
  if (signal.starts_with("exit status ")) ended = "ended colibri-plugin-probe's process (" + signal + ")";
  if (signal.starts_with("timeout ")) ended = "hung (no answer within " + signal.substr(8) + ")";
  const std::string retry = signal.starts_with("timeout ") ? " (or a day has passed)" : "";
  return ended + " " + during +
         " on an earlier run (in its own code, or in a driver or library it calls); "
         "skipped until the file or colibri changes (rebuild or replace it)" +
         retry + ", or delete " + r.path + " to try it again as it is";
}

// Sets one of the handler's globals for as long as it lives, then puts back the value it found (an outer call's).
template <typename T>
class ScopedGlobal {
 public:
  ScopedGlobal(std::atomic<T>& global, T value) : global_(global), outer_(global.exchange(value)) {}
  ~ScopedGlobal() { global_.store(outer_); }
  ScopedGlobal(const ScopedGlobal&) = delete;
  ScopedGlobal& operator=(const ScopedGlobal&) = delete;

 private:
  std::atomic<T>& global_;
  T outer_;
};

// Marks a call into a plugin, so a crash during it names the call.
class PluginCall {
 public:
  explicit PluginCall(std::string what) : what_(std::move(what)), mark_(g_plugin_call, what_.c_str()) {
    install_crash_reporter();  // before the call into the plugin, which is all that matters
  }

 private:
  std::string what_;
  ScopedGlobal<const char*> mark_;
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
  dirs.push_back({COLIBRI_PLUGIN_INSTALL_DIR, "install dir", SearchDirKind::colibri});
  // Where a third-party plugin built with colibri_add_plugin goes by CMake's default prefix (the packages install
  // colibri under /usr).
  dirs.push_back({"/usr/local/lib/colibri/plugins", "local plugins", SearchDirKind::third_party});
  if (const fs::path exe = executable_dir(); !exe.empty()) {
    dirs.push_back({(exe / ".." / "lib" / "colibri" / "plugins").lexically_normal(), "next to the executable",
                    SearchDirKind::colibri});
    dirs.push_back({exe / "plugins", "next to the executable", SearchDirKind::colibri});
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

namespace {
// A plugin's option named as the core's key gets the core's value: a path is a string to the plugin, a list of paths
// a list of strings (a plugin built before path types declares them so).
bool same_kind_of_value(sdk::OptionType core, sdk::OptionType plugin) {
  const auto kind = [](sdk::OptionType t) {
    return t == sdk::OptionType::path        ? sdk::OptionType::string
           : t == sdk::OptionType::path_list ? sdk::OptionType::string_list
                                             : t;
  };
  return kind(core) == kind(plugin);
}
}  // namespace

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
  // Compiler family and standard-library ABI must match; the SDK version may differ (the ABI version decides).
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
    const std::string name = d->name == nullptr ? "" : d->name;
    return Status(StatusCode::invalid_argument, "plugin " + where + " has an invalid name" +
                                                    (d->name == nullptr ? "" : " '" + name + "'") +
                                                    " (use 1 to 64 of a-z, 0-9, '_', '-')");
  }
  if (d->score == nullptr || d->create == nullptr) {
    return Status(StatusCode::invalid_argument, "plugin " + where + " has no score() or create() function");
  }
  // The core's own keys of the plugin's section (cache.policy, cache.pinned_experts...): an option of that name gets
  // the core's value, so it must be of the core's type.
  const std::string section = std::string(profile::plugin_section(kind)) + ".";
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < d->options.size(); ++i) {
    const auto& o = d->options[i];
    const bool named =
        o.name != nullptr && valid_name(o.name) && std::string_view(o.name).find('-') == std::string_view::npos;
    if (!named || o.default_value == nullptr || o.doc == nullptr || *o.doc == '\0' ||
        static_cast<unsigned>(o.type) > static_cast<unsigned>(sdk::OptionType::path_list)) {
      return Status(StatusCode::invalid_argument,
                    "plugin " + where + ": option " + std::to_string(i) +
                        (o.name != nullptr ? " ('" + std::string(o.name) + "')" : "") +
                        " needs a name (a-z, 0-9, '_'), a known type, a default and a doc string; fix its options "
                        "table and rebuild it");
    }
    const auto refuse = [&](const std::string& why) {
      return Status(StatusCode::invalid_argument,
                    "plugin " + where + ": option '" + o.name + "' " + why + "; fix its options table and rebuild it");
    };
    if (!seen.insert(o.name).second) return refuse("is declared twice (a profile value would meet either type)");
    for (const auto& core : profile::canonical_options()) {
      if (std::string_view(core.name) == section + o.name && !same_kind_of_value(core.type, o.type)) {
        return refuse(std::string("is of type ") + std::string(sdk::to_string(o.type)) + ", but " + core.name +
                      " is the core's key, of type " + std::string(sdk::to_string(core.type)) +
                      ", whose value the plugin would be given: rename the option");
      }
    }
    // A default its own type refuses ('auto' too, unless allow_auto) would fail only when a profile first uses the
    // plugin. An empty one means the option is optional (config.hpp): no value unless a profile gives one.
    if (*o.default_value != '\0') {
      if (auto v = sdk::parse_option_value(o, o.default_value); !v) {
        return Status(StatusCode::invalid_argument, "plugin " + where + ": option '" + o.name + "' has the default '" +
                                                        o.default_value + "', which its type refuses (" +
                                                        v.error().message() +
                                                        "); fix its options table and rebuild it");
      }
    }
  }
  return {};
}

namespace {
// A command scans more than once (the profile's plugin options are checked, then the plugins chosen): a problem
// with a directory is said once per process, not once per scan.
bool first_time_said(const std::string& what) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard lock(mu);
  return said.insert(what).second;
}

// The probe's note that a file loaded and scored in colibri-plugin-probe: <cache>/probed-plugins/, named and headed
// as its crash record would be, so a changed file (or another colibri build) is probed again.
fs::path probe_note_path(const CrashRecord& r) {
  return fs::path(r.dirs[1]) / "probed-plugins" / fs::path(r.path).filename();
}

bool probed_before(const CrashRecord& r) {
  auto text = model::io::read_text(probe_note_path(r), 1 << 16);
  return text && *text == r.identity;
}

void note_probed(const CrashRecord& r) {
  std::error_code ec;
  const fs::path path = probe_note_path(r);
  fs::create_directories(path.parent_path(), ec);
  // Whole or absent (probes of two commands may race); not written: probed again next time.
  (void)util::write_file_atomically(path, [&](std::ostream& out) { return static_cast<bool>(out << r.identity); });
}

// How colibri-plugin-probe ended on one file.
struct ProbeRun {
  bool started = false;    // it said 'R': whatever follows is the plugin's doing
  bool finished = false;   // it said 'D' and exited 0
  bool timed_out = false;  // killed (its process group) at the deadline
  bool reaped = false;     // `status` is known (a host ignoring SIGCHLD leaves it unknown)
  int status = 0;          // waitpid's
};

ProbeRun run_probe(const fs::path& probe, const fs::path& file, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds start_timeout) {
  ProbeRun run;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return run;
  // The write end becomes the child's fd 3 (dup2 clears close-on-exec there), or 5 in the odd case it is 3 already;
  // duplicated before /dev/null takes 0-2, which it may be when those were closed.
  const int report_fd = fds[1] == 3 ? 5 : 3;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], report_fd);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);  // its crash report: ours says it
  // A group of its own: a terminal's Ctrl-C is not the plugin's doing, and a timeout kills whatever it started.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  std::string exe = probe.string(), fd_arg = "--report-fd=" + std::to_string(report_fd), target = file.string();
  char* argv[] = {exe.data(), fd_arg.data(), target.data(), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, exe.c_str(), &actions, &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    return run;
  }
  // Until 'D', or until it has ended (the pipe closed and the process reaped), or the deadline: the start's until
  // it says 'R' (a probe stuck in its own libraries is not worth the plugin's whole timeout), then the plugin's.
  std::string said;
  bool pipe_open = true;
  const auto now = std::chrono::steady_clock::now();
  const auto plugin_deadline = now + timeout;
  const auto start_deadline = now + std::min(timeout, start_timeout);
  bool told_waiting = false;
  while (said.find('D') == std::string::npos) {
    // A probe that takes a while is said, so that a command waiting on it does not look hung.
    if (!told_waiting && std::chrono::steady_clock::now() - now > std::chrono::seconds(2)) {
      told_waiting = true;
      spdlog::warn("checking plugin {} in a separate process before it loads (once per file; gives up after {} s)",
                   file.string(), std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
    }
    const auto deadline = said.find('R') == std::string::npos ? start_deadline : plugin_deadline;
    if (!pipe_open) {
      const pid_t r = ::waitpid(pid, &run.status, WNOHANG);
      if (r == pid || (r < 0 && errno == ECHILD)) {
        run.reaped = r == pid;
        break;
      }
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      break;
    }
    if (!pipe_open) {  // it closed the pipe but lives on: poll its end
      ::poll(nullptr, 0, static_cast<int>(std::min<std::int64_t>(left.count(), 20)));
      continue;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (n <= 0) continue;  // EINTR or no news: the deadline decides
    char buf[16];
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      pipe_open = false;
      continue;
    }
    said.append(buf, static_cast<std::size_t>(got));
  }
  ::close(fds[0]);
  if (run.timed_out) ::kill(-pid, SIGKILL);
  if (!run.reaped) {
    pid_t r;
    while ((r = ::waitpid(pid, &run.status, 0)) < 0 && errno == EINTR) {
    }
    run.reaped = r == pid;
  }
  run.started = said.find('R') != std::string::npos;
  const bool said_done = said.find('D') != std::string::npos;
  run.finished = said_done && (!run.reaped || (WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0));
  return run;
}

// A crash record written whole or not at all (another command may read it meanwhile); outside a signal handler.
bool write_crash_record_atomically(const CrashRecord& r, const std::string& what, const std::string& value) {
  std::error_code ec;
  fs::create_directories(fs::path(r.path).parent_path(), ec);
  const sdk::Status written = util::write_file_atomically(r.path, [&](std::ostream& out) {
    return static_cast<bool>(out << r.identity << what << value << '\n' << r.during);
  });
  return static_cast<bool>(written);
}

// Signals that end a process from outside (a shutdown, the OOM killer): not the plugin's doing.
bool external_signal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT || sig == SIGKILL || sig == SIGPIPE;
}
}  // namespace

fs::path default_probe() {
  std::error_code ec;
  // The build tree; an installed tree moved elsewhere (as the plugins next to the executable); the install path.
  const fs::path exe = executable_dir();
  for (const fs::path& p : {exe / "colibri-plugin-probe", exe / ".." / "lib" / "colibri" / "colibri-plugin-probe",
                            fs::path(COLIBRI_PROBE_INSTALL_PATH)}) {
    if (!p.parent_path().empty() && fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

namespace {

// What the probe found wrong with `file`, whose crash record is `record`: "" when it loaded and scored it, or when
// the probe cannot run here.
std::string probe_problem(const ScanOptions& options, const fs::path& file, const CrashRecord& record) {
  if (probed_before(record)) return {};
  // A probe that did not run is not tried again by this process (each try may cost the timeout).
  static std::mutex unusable_mu;
  static std::set<std::string> unusable;
  {
    std::lock_guard lock(unusable_mu);
    if (unusable.count(options.probe.string()) != 0) return {};
  }
  const ProbeRun run = run_probe(options.probe, file, options.probe_timeout, options.probe_start_timeout);
  if (!run.started) {
    // Not the plugin: the probe did not run here (a broken install). Plugins load as they did without it.
    {
      std::lock_guard lock(unusable_mu);
      unusable.insert(options.probe.string());
    }
    spdlog::warn("{} did not start{}; plugins are loaded without it (a crashing one would end the command)",
                 options.probe.string(), run.timed_out ? " in time" : "");
    return {};
  }
  if (run.finished) {
    note_probed(record);
    return {};
  }
  if (run.reaped && WIFSIGNALED(run.status) && external_signal(WTERMSIG(run.status)) && !run.timed_out) {
    return {};  // ended from outside (a shutdown): the plugin loads here, as without the probe
  }
  // The probe's own handler records a crash (under a sanitizer the process then ends with the sanitizer's exit
  // status instead of the signal): its record says what happened. Anything else is recorded here. Either way the
  // file is skipped from now on, as after a crash in this process.
  std::string what, value, kept = crash_record_body(record).value_or("");
  kept.resize(std::min(kept.size(), kept.find('\n')));
  bool recorded = kept.starts_with("signal ");
  if (recorded) {
    what = "signal ";
    value = kept.substr(7);
  } else if (run.timed_out) {
    what = "timeout ";
    value = fmt::format("{:g} s", static_cast<double>(options.probe_timeout.count()) / 1000.0);
  } else if (run.reaped && WIFSIGNALED(run.status)) {
    what = "signal ";
    value = std::to_string(WTERMSIG(run.status));
  } else {
    what = "exit status ";
    value = run.reaped && WIFEXITED(run.status) ? std::to_string(WEXITSTATUS(run.status)) : "unknown";
  }
  if (!recorded) recorded = write_crash_record_atomically(record, what, value);
  std::string ended = what == "signal "    ? "crashed (signal " + value + ")"
                      : what == "timeout " ? "did not finish within " + value + " (killed)"
                                           : "ended the process (exit status " + value + ")";
  return ended + " while loading or scoring in colibri-plugin-probe, a process of its own, so this command goes on " +
         "without it; " +
         (recorded ? "skipped until the file or colibri changes (rebuild or replace it), or delete " + record.path +
                         " to try it again as it is"
                   : "not recorded (the cache directory is not writable), so the next command probes it again");
}

}  // namespace

int PluginRegistry::probe_main(int argc, char** argv) {
  int report_fd = -1;
  fs::path file;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--report-fd=")) {
      report_fd = std::atoi(argv[i] + 12);
    } else {
      file = a;
    }
  }
  if (report_fd < 0 || file.empty()) {
    std::fprintf(stderr,
                 "usage: colibri-plugin-probe --report-fd=N FILE\n"
                 "(run by colibri: loads and scores a plugin in a process of its own before colibri loads it)\n");
    return 2;
  }
  PluginRegistry reg;
  reg.host_ = util::host_info();            // before 'R': its own probes are not the plugin's doing
  ::fcntl(report_fd, F_SETFD, FD_CLOEXEC);  // nothing the plugin starts holds the pipe
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // nor outlives colibri
  (void)!::write(report_fd, "R", 1);
  reg.options_.probe.clear();  // loads here
  reg.load_one(file, reg.host_, SearchDir{file.parent_path(), "probe", SearchDirKind::user});
  (void)!::write(report_fd, "D", 1);
  std::_Exit(0);  // no exit-time work of the plugin's: what was to be probed is done
}

namespace {
// A name close to libcolibri-<kind>-<name>.so (no "lib", '_' for '-'): a plugin a user meant to install.
bool looks_like_plugin_file(const std::string& fname) {
  std::string n = fname.starts_with("lib") ? fname.substr(3) : fname;
  std::replace(n.begin(), n.end(), '_', '-');
  return n.starts_with("colibri-cache-") || n.starts_with("colibri-storage-") || n.starts_with("colibri-compute-");
}
}  // namespace

PluginRegistry PluginRegistry::scan(std::vector<SearchDir> search_path, const sdk::HostInfo& host,
                                    const ScanOptions& options) {
  PluginRegistry reg;
  reg.host_ = host;
  reg.options_ = options;
  reg.search_path_ = std::move(search_path);
  for (const auto& dir : reg.search_path_) {
    std::error_code ec;
    if (!fs::is_directory(dir.path, ec)) {
      // The built-in places may well be absent; a directory the user named should not be, silently.
      if (dir.kind == SearchDirKind::user && first_time_said("absent " + dir.path.string())) {
        spdlog::warn("plugin directory {} (from {}) {}; its plugins are not loaded", dir.path.string(), dir.origin,
                     fs::exists(dir.path, ec) ? "is not a directory (name the directory that holds the .so files)"
                                              : "does not exist");
      }
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir.path, ec)) {
      const std::string fname = entry.path().filename().string();
      if (fname.starts_with("libcolibri-") && fname.ends_with(".so")) {
        files.push_back(entry.path());
      } else if (fname.ends_with(".so") && looks_like_plugin_file(fname)) {
        // A near miss (no "lib", a "_"): listed, and named when its plugin is asked for, rather than ignored.
        std::string fix = fname.starts_with("colibri-") ? "lib" + fname : "libcolibri-<kind>-<name>.so";
        reg.broken_.push_back({entry.path(),
                               "is not loaded: colibri loads plugin files named "
                               "libcolibri-<kind>-<name>.so; rename it " +
                                   fix});
      }
    }
    if (ec && first_time_said("unreadable " + dir.path.string())) {
      spdlog::warn(
          "plugin directory {} (from {}) cannot be read ({}); its plugins are not loaded; check its "
          "permissions",
          dir.path.string(), dir.origin, ec.message());
    }
    std::sort(files.begin(), files.end());  // deterministic order within a directory
    for (const auto& f : files) reg.load_one(f, host, dir);
  }
  return reg;
}

void PluginRegistry::load_one(const fs::path& file, const sdk::HostInfo& host, const SearchDir& dir) {
  if (auto why = elf_problem(file); !why.empty()) {
    broken_.push_back({file, why});
    return;
  }
  const std::optional<CrashRecord> record = crash_record_for(file);
  if (record) {
    if (auto why = crash_record_reason(*record); !why.empty()) {
      // Said at every command (once each), not only in `plugins list`: with `auto`, a skipped GPU backend would
      // otherwise pass unnoticed (a run falls back to the CPU).
      if (first_time_said("crash record " + record->path)) spdlog::warn("plugin {}: {}", file.string(), why);
      broken_.push_back({file, why});
      return;
    }
  }
  // colibri's own plugins are built and tested with it; others, wherever they are installed, are probed once first
  // (where the probe exists).
  const bool shipped =
      dir.kind == SearchDirKind::colibri && std::find(std::begin(kShippedPluginFiles), std::end(kShippedPluginFiles),
                                                      file.filename().string()) != std::end(kShippedPluginFiles);
  if (record && !shipped && options_.probe.empty() && default_probe().empty() &&
      first_time_said("no probe for third-party plugins")) {
    spdlog::warn(
        "colibri-plugin-probe was not found (next to the executable, in ../lib/colibri, or at {}), so "
        "third-party plugins such as {} load "
        "without being checked first: one that crashes or hangs while loading ends or hangs the command; "
        "reinstall colibri to restore it",
        COLIBRI_PROBE_INSTALL_PATH, file.string());
  }
  if (record && !shipped && !options_.probe.empty()) {
    if (auto why = probe_problem(options_, file, *record); !why.empty()) {
      if (first_time_said("probe problem " + file.string())) spdlog::warn("plugin {}: {}", file.string(), why);
      broken_.push_back({file, why});
      return;
    }
  }
  const ScopedGlobal<const CrashRecord*> armed(g_crash_record, record ? &*record : nullptr);  // loading and scoring
  auto lib = std::make_shared<boost::dll::shared_library>();
  boost::dll::fs::error_code ec;
  PluginCall call("while loading " + file.string());
  try {  // a static constructor that throws is that plugin's fault, not every command's
    lib->load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  } catch (const std::exception& e) {
    broken_.push_back({file, std::string("threw while loading (a static constructor): ") + e.what()});
    return;
  } catch (...) {
    broken_.push_back({file, "threw a non-standard exception while loading (a static constructor)"});
    return;
  }
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
  if (PluginInfo* first = find_mutable(d->kind, d->name)) {
    // colibri's own plugin, replaced by one of the same name earlier in the search path: not broken, shadowed
    if (dir.kind == SearchDirKind::colibri && first->origin != dir.origin) {
      first->shadows = file;
      shadowed_.push_back({file, std::string(to_string(d->kind)) + " plugin '" + d->name + "' is replaced by " +
                                     first->path.string() + " (" + first->origin + ", earlier in the search path)"});
      return;
    }
    broken_.push_back({file, "duplicate " + std::string(to_string(d->kind)) + " plugin '" + d->name +
                                 "': already provided by " + first->path.string() + " (earlier in the search path)"});
    return;
  }
  // The file name is what a user searches for ("no storage plugin named 'fast'" while libcolibri-storage-fast.so
  // declares another): say where they disagree.
  if (const std::string expected = "libcolibri-" + std::string(to_string(d->kind)) + "-" + d->name + ".so";
      file.filename().string() != expected) {
    spdlog::warn("{} holds {} plugin '{}'; name the file {} so that its name says what it is", file.string(),
                 to_string(d->kind), d->name, expected);
  }
  PluginInfo info;
  info.kind = d->kind;
  info.name = d->name;
  info.version = d->version ? d->version : "";
  info.description = d->description ? d->description : "";
  info.path = file;
  info.origin = dir.origin;
  info.build_fingerprint = d->header.build_fingerprint;
  info.options.assign(d->options.begin(), d->options.end());
  for (const char* c : d->capabilities) info.capabilities.emplace_back(c ? c : "");
  // The label ends with what to do: a third party's plugin can be removed or rebuilt; colibri's own is a bug to report.
  register_plugin_code(d, std::string(to_string(d->kind)) + " plugin '" + d->name + "' (" + file.string() + ")" +
                              (shipped ? ", one of colibri's own plugins: please report it with the command that ran"
                                       : "; remove it from the plugin directory or rebuild it against this colibri"));
  {
    PluginCall scoring("in score() of " + file.string());
    const auto start = std::chrono::steady_clock::now();
    info.score = d->score(host);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (took.count() > 1.0) {
      spdlog::warn(
          "{} plugin '{}' ({}) took {:.1f} s to score this machine; every colibri command waits for it at start",
          to_string(d->kind), d->name, file.string(), took.count());
    }
  }
  if (info.score.value < 0) {  // read as 0, "cannot run here"; the reason says what it said, as it gave none
    if (info.score.reason.empty()) info.score.reason = "it scored " + std::to_string(info.score.value) + ", read as 0";
    info.score.value = 0;
  }
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

PluginInfo* PluginRegistry::find_mutable(sdk::PluginKind kind, std::string_view name) noexcept {
  for (auto& p : plugins_) {
    if (p.kind == kind && p.name == name) return &p;
  }
  return nullptr;
}

std::vector<const PluginInfo*> PluginRegistry::by_score(sdk::PluginKind kind) const {
  std::vector<const PluginInfo*> ranked;
  for (const auto& p : plugins_) {
    if (p.kind == kind && p.score.value > 0) ranked.push_back(&p);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const PluginInfo* a, const PluginInfo* b) { return a->score.value > b->score.value; });
  return ranked;
}

sdk::Expected<const PluginInfo*> PluginRegistry::select(sdk::PluginKind kind, std::string_view name) const {
  const std::string kind_name(to_string(kind));
  fs::path hinted;  // a refused file already named with its reason: not listed again
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
    for (const auto& b : broken_) {
      if (b.path != hinted) os << "\n  broken: " << b.path.string() << ": " << b.reason;
    }
    return os.str();
  };
  if (name.empty() || name == "auto") {
    const auto ranked = by_score(kind);
    if (ranked.empty())
      return Status(StatusCode::not_found, "no usable " + kind_name + " plugin was found" + describe());
    return ranked.front();
  }
  const PluginInfo* p = find(kind, name);
  if (p == nullptr) {
    std::string hint;
    for (const auto& b : broken_) {
      if (b.path.filename().string().find("-" + std::string(name) + ".so") != std::string::npos) {
        hint = "\n  " + b.path.string() + " looks like it but was refused: " + b.reason;
        hinted = b.path;
      }
    }
    if (hint.empty()) {
      std::vector<std::string> names;
      for (const auto& q : plugins_) {
        if (q.kind == kind) names.push_back(q.name);
      }
      if (const auto near = sdk::closest_match(name, names); !near.empty()) hint = " (did you mean '" + near + "'?)";
    }
    return Status(StatusCode::not_found,
                  "no " + kind_name + " plugin named '" + std::string(name) + "'" + hint + describe());
  }
  if (!p->shadows.empty()) {
    spdlog::warn(
        "{} plugin '{}' is {}, which replaces colibri's own {}; remove it (or rename its plugin) to use the "
        "built-in one",
        kind_name, p->name, p->path.string(), p->shadows.string());
  }
  // Another file of the same plugin later in the search path is not used: said, since the user may have meant it
  // (a new build in another directory).
  const std::string duplicate = "duplicate " + kind_name + " plugin '" + p->name + "'";
  for (const auto& b : broken_) {
    if (b.reason.rfind(duplicate, 0) == 0 && first_time_said("duplicate used " + b.path.string())) {
      spdlog::warn("{} plugin '{}' is {}; {}, also a {} plugin '{}', comes later in the search path and is not used",
                   kind_name, p->name, p->path.string(), b.path.string(), kind_name, p->name);
    }
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
    std::optional<CrashRecord> record = crash_record_for(plugin.path);
    if (record) record->during = "in create()\n";
    const ScopedGlobal<const CrashRecord*> armed(g_crash_record, record ? &*record : nullptr);
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
