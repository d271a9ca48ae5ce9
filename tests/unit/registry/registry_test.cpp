#include "colibri/registry/registry.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "colibri/profile/profile.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "colibri/util/host_info.hpp"
#include "colibri/util/metrics.hpp"

namespace {

// Sends spdlog's default logger into a string until restore() or destruction, for tests of what is logged.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(
        std::make_shared<spdlog::logger>("captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)));
  }
  ~CapturedLog() { restore(); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  void restore() {
    if (previous_) spdlog::set_default_logger(std::move(previous_));
  }
  [[nodiscard]] std::string str() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
};

namespace fs = std::filesystem;
using colibri::registry::PluginRegistry;
using colibri::registry::ScanOptions;
using colibri::registry::SearchDir;
using colibri::registry::SearchDirKind;
using colibri::sdk::PluginKind;
using colibri::sdk::StatusCode;
using ::testing::HasSubstr;

fs::path fixture_dir(const std::string& name) {
  return fs::path(COLIBRI_TEST_FIXTURE_PLUGIN_DIR) / name;
}

// Plugins loaded in this process at once, as without colibri-plugin-probe: what most tests look at.
ScanOptions in_process() {
  ScanOptions o;
  o.probe.clear();
  return o;
}

// Plugins of user directories probed first by the built colibri-plugin-probe.
ScanOptions probed(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  ScanOptions o;
  o.probe = COLIBRI_TEST_PROBE;
  o.probe_timeout = timeout;
  return o;
}

PluginRegistry scan(std::initializer_list<std::string> cases, const ScanOptions& options = in_process()) {
  std::vector<SearchDir> dirs;
  for (const auto& c : cases) dirs.push_back({fixture_dir(c), "test"});
  return PluginRegistry::scan(dirs, colibri::util::host_info(), options);
}

std::string broken_reason(const PluginRegistry& reg, const std::string& file_part) {
  for (const auto& b : reg.broken()) {
    if (b.path.string().find(file_part) != std::string::npos) return b.reason;
  }
  return "<not listed as broken>";
}

TEST(Registry, LoadsAGoodPluginWithItsDescriptor) {
  auto reg = scan({"good"});
  ASSERT_EQ(reg.plugins().size(), 1u);
  EXPECT_TRUE(reg.broken().empty());
  const auto& p = reg.plugins().front();
  EXPECT_EQ(p.kind, PluginKind::storage);
  EXPECT_EQ(p.name, "fixture-good");
  EXPECT_EQ(p.version, "0.0.1");
  EXPECT_EQ(p.score.value, 50);
  EXPECT_EQ(p.path.filename(), "libcolibri-storage-fixture-good.so");
  ASSERT_EQ(p.options.size(), 1u);
  EXPECT_STREQ(p.options[0].name, "greeting");
  EXPECT_THAT(p.capabilities, ::testing::ElementsAre("fixture"));
}

TEST(Registry, RefusesAnotherAbiNamingBothVersions) {
  auto reg = scan({"wrong_abi"});
  EXPECT_TRUE(reg.plugins().empty());
  const std::string reason = broken_reason(reg, "fixture-abi");
  EXPECT_THAT(reason, HasSubstr("libcolibri-storage-fixture-abi.so"));
  EXPECT_THAT(reason, HasSubstr("was built for SDK ABI " + std::to_string(colibri::sdk::kAbiVersion + 1)));
  EXPECT_THAT(reason, HasSubstr("this colibri has ABI " + std::to_string(colibri::sdk::kAbiVersion)));
  EXPECT_THAT(reason, HasSubstr("rebuild it against colibri-sdk"));
}

TEST(Registry, RefusesAnotherCompilerOrStandardLibrary) {
  auto reg = scan({"wrong_fingerprint"});
  EXPECT_TRUE(reg.plugins().empty());
  const std::string reason = broken_reason(reg, "fixture-fp");
  EXPECT_THAT(reason, HasSubstr("clang-99;libc++;sdk-9.9.9"));
  EXPECT_THAT(reason, HasSubstr(COLIBRI_SDK_BUILD_FINGERPRINT));
}

TEST(Registry, ReportsALibraryWithoutEntrySymbol) {
  auto reg = scan({"missing_entry"});
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_THAT(broken_reason(reg, "noentry"), HasSubstr("has no entry symbol 'colibri_plugin_entry'"));
}

TEST(Registry, ReportsAFileThatIsNotALibrary) {
  const fs::path dir = fs::path(COLIBRI_TEST_BINARY_DIR) / "test-plugins" / "garbage";
  fs::create_directories(dir);
  std::ofstream(dir / "libcolibri-storage-garbage.so") << "this is not an ELF file";
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_THAT(broken_reason(reg, "garbage"), HasSubstr("is not a shared library (no ELF header)"));
}

// A copy cut short would be mapped past its end: dlopen dies of SIGBUS in the loader, taking every command (plugins
// list too) with it. Its headers say it is cut short before it is opened.
TEST(Registry, ALibraryCutShortIsBrokenNotLoaded) {
  const fs::path dir = fs::path(COLIBRI_TEST_BINARY_DIR) / "test-plugins" / "cut-short";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path whole = fs::path(COLIBRI_TEST_PLUGIN_DIR) / "libcolibri-cache-lru.so";
  std::ifstream in(whole, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 8192u);
  for (const std::size_t keep : {std::size_t{3000}, bytes.size() / 2, bytes.size() - 1}) {
    std::ofstream(dir / "libcolibri-cache-cut.so", std::ios::binary | std::ios::trunc) << bytes.substr(0, keep);
    auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
    EXPECT_TRUE(reg.plugins().empty()) << keep;
    EXPECT_THAT(broken_reason(reg, "cut"), HasSubstr("is cut short (its ELF headers need")) << keep;
  }
}

TEST(Registry, ADanglingLinkAndADirectoryAreNamedAsSuch) {
  const fs::path dir = fs::path(COLIBRI_TEST_BINARY_DIR) / "test-plugins" / "odd-files";
  fs::remove_all(dir);
  fs::create_directories(dir / "libcolibri-cache-folder.so");
  fs::create_symlink("/nonexistent/libx.so", dir / "libcolibri-cache-dangling.so");
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_THAT(broken_reason(reg, "dangling"), HasSubstr("is a link to /nonexistent/libx.so, which does not exist"));
  EXPECT_THAT(broken_reason(reg, "folder"), HasSubstr("is a directory, not a shared library"));
}

TEST(Registry, ALibraryForAnotherMachineIsNamedAsSuch) {
  // glibc's dlopen says "No such file or directory" for these; the ELF header tells what they are.
  const fs::path dir = fs::path(COLIBRI_TEST_BINARY_DIR) / "test-plugins" / "foreign";
  fs::create_directories(dir);
  auto write_elf = [&](const std::string& name, unsigned char elf_class, std::uint16_t machine) {
    unsigned char h[64] = {0x7f, 'E', 'L', 'F', elf_class, 1, 1};
    h[16] = 3;  // ET_DYN
    std::memcpy(h + 18, &machine, sizeof machine);
    std::ofstream(dir / ("libcolibri-storage-" + name + ".so"), std::ios::binary)
        .write(reinterpret_cast<const char*>(h), sizeof h);
  };
  write_elf("arm", 2, 183);  // ELFCLASS64, EM_AARCH64
  write_elf("old", 1, 3);    // ELFCLASS32, EM_386
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_THAT(broken_reason(reg, "arm"), HasSubstr("is built for another processor (ELF machine 183)"));
  EXPECT_THAT(broken_reason(reg, "old"), HasSubstr("is a 32-bit library"));
}

TEST(Registry, AnEntryThatThrowsIsListedAsBroken) {
  auto reg = scan({"good", "entry_throws"});
  EXPECT_EQ(reg.plugins().size(), 1u);  // the others still load
  EXPECT_THAT(broken_reason(reg, "entry-throws"), HasSubstr("colibri_plugin_entry() threw: entry boom"));
}

TEST(Registry, AStaticConstructorThatThrowsIsListedAsBroken) {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's dlopen interceptor has no unwind tables: the exception cannot cross it and terminates (the
  // crash reporter still names the file). The release build runs this test.
  GTEST_SKIP() << "not under AddressSanitizer";
#endif
  auto reg = scan({"static_throws", "good"});
  EXPECT_EQ(reg.plugins().size(), 1u);  // the others still load
  EXPECT_THAT(broken_reason(reg, "static-throws"),
              HasSubstr("threw while loading (a static constructor): static boom"));
}

TEST(Registry, AFifoOrALinkLoopIsNamedAndNeverWaitedOn) {
  const fs::path dir = fs::temp_directory_path() / ("colibri-reg-fifo-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir / "libcolibri-cache-pipe.so").c_str(), 0600), 0);  // opening it to read would block
  fs::create_symlink("libcolibri-cache-loop.so", dir / "libcolibri-cache-loop.so");
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
  EXPECT_THAT(broken_reason(reg, "pipe"), HasSubstr("is a named pipe (FIFO), not a shared library; remove it"));
  EXPECT_THAT(broken_reason(reg, "loop"), HasSubstr("leads back to itself"));
  fs::remove_all(dir);
}

TEST(Registry, AFileNamedForAnotherKindOrNameIsSaidAtLoad) {
  const fs::path dir = fs::temp_directory_path() / ("colibri-reg-name-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink(fixture_dir("good") / "libcolibri-storage-fixture-good.so", dir / "libcolibri-cache-fast.so");
  CapturedLog log;
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
  log.restore();
  EXPECT_EQ(reg.plugins().size(), 1u);  // it still loads
  EXPECT_THAT(log.str(), HasSubstr("libcolibri-cache-fast.so holds storage plugin 'fixture-good'; name the file "
                                   "libcolibri-storage-fixture-good.so"));
  fs::remove_all(dir);
}

TEST(Registry, AFileNamedNearlyLikeAPluginIsListedAndNamedWhenItsPluginIsAskedFor) {
  const fs::path dir = fs::temp_directory_path() / ("colibri-reg-near-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture_dir("good") / "libcolibri-storage-fixture-good.so", dir / "colibri-storage-fast.so");
  fs::copy_file(fixture_dir("good") / "libcolibri-storage-fixture-good.so", dir / "libunrelated.so");
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), in_process());
  EXPECT_TRUE(reg.plugins().empty());
  ASSERT_EQ(reg.broken().size(), 1u) << "only the file that looks like a colibri plugin";
  EXPECT_THAT(reg.broken()[0].reason, HasSubstr("rename it libcolibri-storage-fast.so"));
  auto asked = reg.select(PluginKind::storage, "fast");
  ASSERT_FALSE(asked);
  EXPECT_THAT(asked.error().message(), HasSubstr("colibri-storage-fast.so looks like it but was refused"));
  fs::remove_all(dir);
}

TEST(Registry, AUserPluginNamedLikeColibrisOwnShadowsItAndSaysSo) {
  std::vector<SearchDir> dirs{{fixture_dir("dup_first"), "COLIBRI_PLUGIN_PATH"},
                              {fixture_dir("dup_second"), "install dir", SearchDirKind::colibri}};
  auto reg = PluginRegistry::scan(dirs, colibri::util::host_info(), in_process());
  EXPECT_TRUE(reg.broken().empty());
  ASSERT_EQ(reg.shadowed().size(), 1u);
  EXPECT_THAT(reg.shadowed()[0].path.string(), HasSubstr("dup_second"));
  EXPECT_THAT(reg.shadowed()[0].reason, HasSubstr("is replaced by"));
  const auto* p = reg.find(PluginKind::storage, "fixture-dup");
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(p->shadows.string(), HasSubstr("dup_second"));
  CapturedLog log;
  auto selected = reg.select(PluginKind::storage, "fixture-dup");
  log.restore();
  ASSERT_TRUE(selected);
  EXPECT_THAT(log.str(), HasSubstr("which replaces colibri's own"));
}

TEST(Registry, AnOptionTableWithoutANameIsRefusedNotDereferenced) {
  auto reg = scan({"option_without_name"});
  EXPECT_TRUE(reg.plugins().empty());
  EXPECT_THAT(broken_reason(reg, "noname"), HasSubstr("option 0 needs a name"));
}

TEST(Registry, AnOptionDefaultItsTypeRefusesIsFoundAtLoad) {
  auto reg = scan({"bad_default"});
  EXPECT_TRUE(reg.plugins().empty());  // not at the first profile that uses it
  EXPECT_THAT(broken_reason(reg, "bad-default"),
              HasSubstr("option 'level' has the default 'notanumber', which its type refuses"));
}

// Option tables that would break later, silently or at the first profile that uses the plugin, are refused at load.
TEST(Registry, OptionTablesThatWouldBreakLaterAreRefusedAtLoad) {
  auto dup = scan({"duplicate_option"});
  EXPECT_TRUE(dup.plugins().empty());
  EXPECT_THAT(broken_reason(dup, "dup-option"), HasSubstr("option 'level' is declared twice"));
  auto core = scan({"core_key_option"});
  EXPECT_TRUE(core.plugins().empty());
  EXPECT_THAT(
      broken_reason(core, "core-key"),
      HasSubstr("option 'paths' is of type integer, but storage.paths is the core's key, of type list of paths"));
  auto autodef = scan({"auto_default"});
  EXPECT_TRUE(autodef.plugins().empty());
  EXPECT_THAT(broken_reason(autodef, "auto-default"), HasSubstr("option 'depth' has the default 'auto'"));
  // An empty default is an optional option (config.hpp), and a core key of the core's own kind of value (a list of
  // strings for a list of paths) is read as the core's.
  auto optional = scan({"optional_option"});
  ASSERT_EQ(optional.plugins().size(), 1u) << broken_reason(optional, "optional");
}

// A negative score is "cannot run here" too; without a reason of its own, the number it gave is the reason shown.
TEST(Registry, ANegativeScoreIsZeroWithTheNumberAsItsReason) {
  auto reg = scan({"score_negative"});
  const auto* p = reg.find(PluginKind::storage, "fixture-negative");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->score.value, 0);
  EXPECT_EQ(p->score.reason, "it scored -5, read as 0");
}

// XDG_CACHE_HOME set to a fresh directory (where crash records go) for the life of the object; in the build tree,
// which (unlike a noexec /tmp) may hold a plugin to load. Its tests also fix the death-test style to "fast" (fork):
// "threadsafe" re-runs the test in the child, which would make a directory of its own.
class ScopedCacheHome {
 public:
  ScopedCacheHome() {
    GTEST_FLAG_SET(death_test_style, "fast");
    std::string tmpl = (fs::path(COLIBRI_TEST_FIXTURE_PLUGIN_DIR).parent_path() / "registry-cache-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data()) != nullptr ? fs::path(tmpl) : fs::path();
    if (const char* old = std::getenv("XDG_CACHE_HOME")) old_ = old;
    ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  }
  ~ScopedCacheHome() {
    if (old_) {
      ::setenv("XDG_CACHE_HOME", old_->c_str(), 1);
    } else {
      ::unsetenv("XDG_CACHE_HOME");
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  ScopedCacheHome(const ScopedCacheHome&) = delete;
  ScopedCacheHome& operator=(const ScopedCacheHome&) = delete;
  [[nodiscard]] const fs::path& path() const { return dir_; }
  // The crash records written so far.
  [[nodiscard]] std::vector<fs::path> records() const {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_ / "colibri" / "crashed-plugins", ec)) out.push_back(e.path());
    return out;
  }

 private:
  fs::path dir_;
  std::optional<std::string> old_;
};

std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(RegistryDeathTest, APluginThatCrashesIsNamedBeforeTheProcessEnds) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers own SIGSEGV and their forked death-test child hangs on the sanitizer's locks; the release build
  // runs this test.
  GTEST_SKIP() << "not under a sanitizer";
#endif
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty()) << "no temporary directory: records would go to the real cache";
  EXPECT_DEATH(scan({"score_crashes"}),
               "a plugin crashed .signal 11. in score.. of [^ ]*libcolibri-storage-fixture-crash.so; remove it");
  // Scoring runs in every command: the crash is recorded, and the next scan lists the file as broken instead of
  // crashing again, while the other plugins load.
  ASSERT_EQ(cache.records().size(), 1u);
  CapturedLog log;
  auto reg = scan({"score_crashes", "good"});
  log.restore();
  EXPECT_EQ(reg.plugins().size(), 1u);
  const std::string why = broken_reason(reg, "fixture-crash");
  EXPECT_THAT(why, HasSubstr("crashed colibri (signal 11) while loading or scoring on an earlier run (in its own code, "
                             "or in a driver or library it calls); skipped until the file or colibri changes (rebuild "
                             "or replace it), or delete " +
                             cache.records()[0].string()));
  // Every command says so, not only `plugins list`: with `auto` a skipped backend would pass unnoticed.
  EXPECT_THAT(log.str(), HasSubstr("libcolibri-storage-fixture-crash.so: " + why));
}

// A static constructor that crashes is recorded as well (dlopen runs it), and a changed file is tried again.
TEST(RegistryDeathTest, APluginThatCrashedWhileLoadingIsSkippedUntilItsFileChanges) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "not under a sanitizer";
#endif
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty()) << "no temporary directory: records would go to the real cache";
  const fs::path dir = cache.path() / "plugins";
  fs::create_directories(dir);
  const fs::path file = dir / "libcolibri-storage-fixture-static-crash.so";
  fs::copy_file(fixture_dir("static_crashes") / file.filename(), file);
  const std::vector<SearchDir> dirs{{dir, "test"}, {fixture_dir("good"), "test"}};
  EXPECT_DEATH(
      PluginRegistry::scan(dirs, colibri::util::host_info(), in_process()),
      "colibri skips this file from now on, until it or colibri changes .to try it again as it is, delete [^ ]*"
      "crashed-plugins/libcolibri-storage-fixture-static-crash.so-[0-9a-f]*.txt.");
  ASSERT_EQ(cache.records().size(), 1u);
  const std::string record = file_text(cache.records()[0]);
  EXPECT_THAT(record, HasSubstr("file " + fs::canonical(file).string() + "\n"));
  EXPECT_THAT(record, HasSubstr("signal 11\n"));
  {
    auto reg = PluginRegistry::scan(dirs, colibri::util::host_info(), in_process());
    EXPECT_EQ(reg.plugins().size(), 1u);
    EXPECT_THAT(broken_reason(reg, "static-crash"), HasSubstr("skipped until the file or colibri changes"));
  }
  // Rebuilt (here: a new modification time): loaded again, so it crashes again; the old record was removed first.
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(5));
  EXPECT_DEATH(PluginRegistry::scan(dirs, colibri::util::host_info(), in_process()),
               "a plugin crashed .signal 11. while loading");
  ASSERT_EQ(cache.records().size(), 1u);
  EXPECT_NE(file_text(cache.records()[0]), record) << "a record of the rebuilt file";
}

// create() runs in every command that picks the plugin: a crash there is recorded too, and with `auto` the next
// plugin of the kind is picked from then on.
TEST(RegistryDeathTest, APluginThatCrashedInCreateIsSkippedFromThenOn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "not under a sanitizer";
#endif
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty()) << "no temporary directory: records would go to the real cache";
  EXPECT_DEATH(
      {
        auto reg = scan({"create_crashes"});
        auto p = reg.select(PluginKind::storage, "fixture-create-crash");
        if (!p) std::abort();
        (void)reg.create_as<colibri::sdk::Storage>(**p, {});
      },
      "a plugin crashed .signal 11. in create.. of [^ ]*libcolibri-storage-fixture-create-crash.so; remove it[^\n]*\n"
      "colibri skips this file from now on");
  ASSERT_EQ(cache.records().size(), 1u);
  EXPECT_THAT(file_text(cache.records()[0]), HasSubstr("signal 11\nin create()\n"));
  CapturedLog log;
  auto reg = scan({"create_crashes", "good"});
  log.restore();
  EXPECT_EQ(reg.plugins().size(), 1u);
  EXPECT_THAT(broken_reason(reg, "fixture-create-crash"),
              HasSubstr("crashed colibri (signal 11) in create() on an earlier run (in its own code, or in a driver or "
                        "library it calls); skipped until the file or colibri changes"));
  auto picked = reg.select(PluginKind::storage, "auto");
  ASSERT_TRUE(picked);
  EXPECT_EQ((*picked)->name, "fixture-good");
  EXPECT_THAT(log.str(), HasSubstr("libcolibri-storage-fixture-create-crash.so: crashed colibri"));
}

// With colibri-plugin-probe, a plugin of a user's directory that crashes while it is scored or loaded ends the
// probe, not the command: the scan goes on (the other plugins load), says why, and records it, so the next scan
// skips it without probing.
TEST(RegistryProbe, APluginThatCrashesInTheProbeIsSkippedAndTheCommandGoesOn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's SIGSEGV handler ends the probe with an exit status instead";
#endif
  for (const std::string which : {"score_crashes", "static_crashes"}) {
    SCOPED_TRACE(which);
    ScopedCacheHome cache;
    ASSERT_FALSE(cache.path().empty());
    CapturedLog log;
    auto reg = scan({which, "good"}, probed());
    log.restore();
    EXPECT_EQ(reg.plugins().size(), 1u) << "the good plugin loads";
    const std::string file = which == "score_crashes" ? "fixture-crash.so" : "fixture-static-crash.so";
    const std::string why = broken_reason(reg, file);
    EXPECT_THAT(why, HasSubstr("crashed (signal 11) while loading or scoring in colibri-plugin-probe, a process of "
                               "its own, so this command goes on without it; skipped until the file or colibri "
                               "changes (rebuild or replace it), or delete "));
    EXPECT_THAT(log.str(), HasSubstr(file + ": " + why));
    ASSERT_EQ(cache.records().size(), 1u) << "the probe recorded the crash";
    EXPECT_THAT(file_text(cache.records()[0]), HasSubstr("signal 11\n"));
    auto again = scan({which, "good"}, probed());
    EXPECT_THAT(broken_reason(again, file),
                HasSubstr("crashed colibri (signal 11) while loading or scoring on an earlier run"));
  }
}

// A plugin that ends the process while it loads (exit() in a static constructor) would end every command silently,
// and one whose score() never returns would hang every command: in the probe, each is skipped with the reason and
// recorded (an exit status, a timeout), and the next scan skips it too.
TEST(RegistryProbe, APluginThatExitsOrHangsInTheProbeIsSkippedAndRecorded) {
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty());
  auto reg = scan({"static_exits", "good"}, probed());
  EXPECT_EQ(reg.plugins().size(), 1u);
  EXPECT_THAT(broken_reason(reg, "fixture-static-exit.so"),
              HasSubstr("ended the process (exit status 3) while loading or scoring in colibri-plugin-probe"));
  // Only the hanging one under a short deadline: a loaded machine may take longer to start a good one.
  const auto start = std::chrono::steady_clock::now();
  auto hung = scan({"score_hangs"}, probed(std::chrono::milliseconds(1500)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "the hang was cut short";
  EXPECT_THAT(broken_reason(hung, "fixture-hang.so"),
              HasSubstr("did not finish within 1.5 s (killed) while loading or scoring in colibri-plugin-probe"));
  EXPECT_EQ(cache.records().size(), 2u);
  auto again = scan({"static_exits", "score_hangs", "good"}, probed());
  EXPECT_EQ(again.plugins().size(), 1u);
  EXPECT_THAT(broken_reason(again, "fixture-static-exit.so"),
              HasSubstr("ended colibri-plugin-probe's process (exit status 3) while loading or scoring on an earlier "
                        "run"));
  EXPECT_THAT(broken_reason(again, "fixture-hang.so"),
              HasSubstr("hung (no answer within 1.5 s) while loading or scoring on an earlier run (in its own code, or "
                        "in a driver or library it calls); skipped until the file or colibri changes (rebuild or "
                        "replace it) (or a day has passed), or delete "));
  // A hang may have been a slow day: a day later it is probed again (and hangs again here); an exit is not.
  for (const auto& record : cache.records()) {
    fs::last_write_time(record, fs::last_write_time(record) - std::chrono::hours(25));
  }
  auto next_day = scan({"static_exits", "score_hangs", "good"}, probed(std::chrono::milliseconds(1500)));
  EXPECT_THAT(broken_reason(next_day, "fixture-hang.so"), HasSubstr("did not finish within 1.5 s (killed)"));
  EXPECT_THAT(broken_reason(next_day, "fixture-static-exit.so"), HasSubstr("on an earlier run"));
}

// A plugin that loads and scores in the probe is probed once: later scans load it at once, until the file changes.
// colibri's own plugins (a file colibri ships, in its install directory) are not probed; a third party's file
// installed there is. Counted by a fixture that logs every load.
TEST(RegistryProbe, APluginIsProbedOnceUntilItsFileChangesAndColibrisOwnAreNot) {
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty());
  const fs::path dir = cache.path() / "plugins", log_file = cache.path() / "loads.txt";
  fs::create_directories(dir);
  const fs::path file = dir / "libcolibri-storage-fixture-counts.so";
  fs::copy_file(fixture_dir("counts_loads") / file.filename(), file);
  ::setenv("COLIBRI_FIXTURE_LOAD_LOG", log_file.c_str(), 1);
  auto loads = [&] {
    std::ifstream in(log_file);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) ++n;
    return n;
  };
  // This process loads the file once (dlopen of a loaded library runs no constructor again): every later load in the
  // log is a probe's.
  auto reg = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), probed());
  ASSERT_EQ(reg.plugins().size(), 1u) << broken_reason(reg, "counts");
  EXPECT_EQ(loads(), 2) << "the probe's load, then this process's";
  auto again = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), probed());
  ASSERT_EQ(again.plugins().size(), 1u);
  EXPECT_EQ(loads(), 2) << "not probed again (and already loaded here)";
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(5));
  auto changed = PluginRegistry::scan({{dir, "test"}}, colibri::util::host_info(), probed());
  ASSERT_EQ(changed.plugins().size(), 1u);
  EXPECT_EQ(loads(), 3) << "a changed file is probed again";
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(5));
  auto third_party =
      PluginRegistry::scan({{dir, "install dir", SearchDirKind::colibri}}, colibri::util::host_info(), probed());
  ASSERT_EQ(third_party.plugins().size(), 1u);
  EXPECT_EQ(loads(), 4) << "a third party's plugin in colibri's install directory is probed too";
  // The same code under the file name of a plugin colibri ships: loaded here (a new path), not probed.
  const fs::path install_dir = cache.path() / "install";
  fs::create_directories(install_dir);
  fs::copy_file(file, install_dir / "libcolibri-storage-pread.so");
  auto own = PluginRegistry::scan({{install_dir, "install dir", SearchDirKind::colibri}}, colibri::util::host_info(),
                                  probed());
  ASSERT_EQ(own.plugins().size(), 1u);
  EXPECT_EQ(loads(), 5) << "colibri's own plugins are not probed";
  ::unsetenv("COLIBRI_FIXTURE_LOAD_LOG");
}

// A probe that does not run here (a broken install) is not the plugins' fault: they load in this process, as
// without it, and the scan says so once.
TEST(RegistryProbe, AProbeThatDoesNotStartLoadsThePluginsHere) {
  ScopedCacheHome cache;
  ScanOptions broken_probe;
  broken_probe.probe = "/bin/false";
  CapturedLog log;
  auto reg = scan({"good"}, broken_probe);
  log.restore();
  EXPECT_EQ(reg.plugins().size(), 1u);
  EXPECT_TRUE(reg.broken().empty());
  EXPECT_THAT(log.str(), HasSubstr("/bin/false did not start; plugins are loaded without it"));
}

// A probe stuck before it starts (in its own libraries) costs its start deadline, not the plugin's whole timeout,
// and is not tried again by this process.
TEST(RegistryProbe, AProbeThatHangsBeforeItStartsCostsOnlyItsStartDeadline) {
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty());
  const fs::path stuck = cache.path() / "stuck-probe";
  {
    std::ofstream out(stuck);
    out << "#!/bin/sh\nexec sleep 600\n";
  }
  fs::permissions(stuck, fs::perms::owner_all);
  ScanOptions options;
  options.probe = stuck;
  options.probe_timeout = std::chrono::hours(1);
  options.probe_start_timeout = std::chrono::milliseconds(300);
  CapturedLog log;
  const auto start = std::chrono::steady_clock::now();
  auto reg = scan({"good", "score_zero"}, options);
  const auto took = std::chrono::steady_clock::now() - start;
  log.restore();
  EXPECT_LT(took, std::chrono::minutes(1)) << "waited for the plugin's timeout";
  EXPECT_EQ(reg.plugins().size(), 2u) << "both load here";
  EXPECT_TRUE(reg.broken().empty());
  EXPECT_TRUE(cache.records().empty()) << "the plugins are not to blame";
  const std::string said = log.str();
  const std::string warning = stuck.string() + " did not start in time; plugins are loaded without it";
  EXPECT_THAT(said, HasSubstr(warning));
  EXPECT_EQ(said.find(warning), said.rfind(warning)) << "tried once, not once per plugin";
}

// Creates the read_crashes fixture's storage from `reg` and calls its read(), which crashes (SIGSEGV).
void read_through_the_crashing_plugin(const PluginRegistry& reg) {
  auto p = reg.select(PluginKind::storage, "fixture-read-crash");
  if (!p) std::abort();
  auto obj = reg.create_as<colibri::sdk::Storage>(**p, {});
  if (!obj) std::abort();
  std::byte buf[8];
  auto* file = reinterpret_cast<colibri::sdk::StorageFile*>(buf);
  (void)(*obj)->read(*file, 0, std::span<std::byte>(buf, 8));
}

TEST(RegistryDeathTest, APluginThatCrashesLaterIsNamedByItsCode) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "not under a sanitizer";
#endif
  // Not in a call colibri marks (loading, scoring, creating): a read, found by the faulting address.
  EXPECT_DEATH(read_through_the_crashing_plugin(scan({"read_crashes"})),
               "signal 11 while running the code of storage plugin 'fixture-read-crash' .[^ ]*libcolibri-storage-"
               "fixture-read-crash.so.; remove it from the plugin directory or rebuild it against this colibri");
}

TEST(RegistryDeathTest, AnExceptionThatEscapesAPluginIsSaidToBeOne) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "not under a sanitizer";
#endif
  EXPECT_DEATH(
      {
        auto reg = scan({"read_throws"});
        auto p = reg.select(PluginKind::storage, "fixture-read-throw");
        if (!p) std::abort();
        auto obj = reg.create_as<colibri::sdk::Storage>(**p, {});
        if (!obj) std::abort();
        std::byte buf[8];
        (void)(*obj)->read(*reinterpret_cast<colibri::sdk::StorageFile*>(buf), 0, std::span<std::byte>(buf, 8));
      },
      "signal 6 while running the code of storage plugin 'fixture-read-throw' .*\n.SIGABRT: the plugin aborted, "
      "most often on a C.. exception it let escape");
}

TEST(RegistryDeathTest, ColibrisOwnPluginThatCrashesIsABugToReport) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "not under a sanitizer";
#endif
  // A third party's file installed in colibri's own directory is still a third party's to remove.
  EXPECT_DEATH(read_through_the_crashing_plugin(
                   PluginRegistry::scan({{fixture_dir("read_crashes"), "install dir", SearchDirKind::colibri}},
                                        colibri::util::host_info(), in_process())),
               "signal 11 while running the code of storage plugin 'fixture-read-crash' .[^ ]*libcolibri-storage-"
               "fixture-read-crash.so.; remove it from the plugin directory or rebuild it against this colibri");
  // A crash in a file colibri ships, in its own directory, is a bug to report.
  ScopedCacheHome cache;
  ASSERT_FALSE(cache.path().empty());
  const fs::path dir = cache.path() / "install";
  fs::create_directories(dir);
  fs::copy_file(fixture_dir("read_crashes") / "libcolibri-storage-fixture-read-crash.so",
                dir / "libcolibri-storage-mmap.so");
  EXPECT_DEATH(read_through_the_crashing_plugin(PluginRegistry::scan({{dir, "install dir", SearchDirKind::colibri}},
                                                                     colibri::util::host_info(), in_process())),
               "signal 11 while running the code of storage plugin 'fixture-read-crash' .[^ ]*libcolibri-storage-"
               "mmap.so., one of colibri's own plugins: please report it with the command that ran");
}

TEST(Registry, ScoreZeroIsListedButNotSelected) {
  auto reg = scan({"score_zero", "good"});
  ASSERT_EQ(reg.plugins().size(), 2u);
  const auto* zero = reg.find(PluginKind::storage, "fixture-zero");
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(zero->score.value, 0);
  auto by_name = reg.select(PluginKind::storage, "fixture-zero");
  ASSERT_FALSE(by_name);
  EXPECT_EQ(by_name.error().code(), StatusCode::unsupported);
  EXPECT_THAT(by_name.error().message(), HasSubstr("cannot run on this machine: needs a frobnicator"));
  auto best = reg.select(PluginKind::storage, "auto");
  ASSERT_TRUE(best);
  EXPECT_EQ((*best)->name, "fixture-good");
}

TEST(Registry, AutoPicksTheHighestScore) {
  auto reg = scan({"good", "high_score", "score_zero"});
  auto best = reg.select(PluginKind::storage, "");
  ASSERT_TRUE(best);
  EXPECT_EQ((*best)->name, "fixture-high");
  auto named = reg.select(PluginKind::storage, "fixture-good");  // a name overrides the score
  ASSERT_TRUE(named);
  EXPECT_EQ((*named)->name, "fixture-good");
}

TEST(Registry, CreateFailureNamesThePluginAndTheReason) {
  auto reg = scan({"create_fails"});
  auto p = reg.select(PluginKind::storage, "fixture-fails");
  ASSERT_TRUE(p);
  auto obj = reg.create(**p, {});
  ASSERT_FALSE(obj);
  EXPECT_THAT(obj.error().message(), HasSubstr("the fixture device exploded"));
  EXPECT_THAT(obj.error().message(), HasSubstr("storage plugin 'fixture-fails'"));
  EXPECT_THAT(obj.error().message(), HasSubstr("libcolibri-storage-fixture-fails.so"));
}

// A profile of the built-in keys alone (no profile file), with `overrides`.
colibri::profile::Profile bare_profile(std::vector<colibri::profile::Override> overrides) {
  colibri::profile::LoadOptions o;
  o.overrides = std::move(overrides);
  o.use_process_environment = false;
  o.search_dirs = {fs::temp_directory_path() / "colibri-no-profiles-here"};
  auto p = colibri::profile::Profile::load(o);
  EXPECT_TRUE(p) << p.error().message();
  return std::move(*p);
}

// auto: the highest score's create() failing gives way to the next score, said in a warning naming both and why
// (as llama.cpp falls back to the CPU when CUDA cannot start); a plugin the profile names does not.
TEST(Registry, AutoFallsBackPastAPluginWhoseCreateFails) {
  auto reg = scan({"create_fails_high", "good"});
  ASSERT_EQ(reg.select(PluginKind::storage, "auto").value()->name, "fixture-fails-high");
  auto profile = bare_profile({{"storage.plugin", "auto", "--set"}});
  CapturedLog captured;
  auto made = colibri::registry::create_selected(profile, reg, PluginKind::storage);
  captured.restore();
  ASSERT_TRUE(made) << made.error().message();
  EXPECT_EQ(made->info->name, "fixture-good");
  EXPECT_TRUE(made->object);
  EXPECT_THAT(captured.str(), HasSubstr("storage plugin fixture-fails-high (score 600) could not be created; "
                                        "storage.plugin: auto took the next score, fixture-good (score 50)"));
  EXPECT_THAT(captured.str(), HasSubstr("the fixture device exploded"));

  auto named = bare_profile({{"storage.plugin", "fixture-fails-high", "--set"}});
  auto refused = colibri::registry::create_selected(named, reg, PluginKind::storage);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message(), HasSubstr("creating storage plugin fixture-fails-high"));
  EXPECT_THAT(refused.error().message(), HasSubstr("the fixture device exploded"));

  // Every candidate failing: each named with its reason.
  auto none = scan({"create_fails_high", "create_fails"});
  auto all_failed = colibri::registry::create_selected(profile, none, PluginKind::storage);
  ASSERT_FALSE(all_failed);
  EXPECT_THAT(all_failed.error().message(), HasSubstr("no storage plugin that storage.plugin: auto could take"));
  EXPECT_THAT(all_failed.error().message(), HasSubstr("fixture-fails-high (score 600): creating storage plugin"));
  EXPECT_THAT(all_failed.error().message(), HasSubstr("fixture-fails (score 50): creating storage plugin"));
}

TEST(Registry, AnExceptionInCreateDoesNotCrossTheBoundary) {
  auto reg = scan({"create_throws"});
  auto p = reg.select(PluginKind::storage, "fixture-throws");
  ASSERT_TRUE(p);
  auto obj = reg.create(**p, {});
  ASSERT_FALSE(obj);
  EXPECT_THAT(obj.error().message(), HasSubstr("boom from the fixture constructor"));
}

TEST(Registry, DuplicateNameKeepsTheFirstInSearchOrder) {
  auto reg = scan({"dup_first", "dup_second"});
  const auto* p = reg.find(PluginKind::storage, "fixture-dup");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->score.value, 10);  // dup_first, although dup_second scores higher
  EXPECT_THAT(p->path.string(), HasSubstr("dup_first"));
  ASSERT_EQ(reg.broken().size(), 1u);
  EXPECT_THAT(reg.broken()[0].path.string(), HasSubstr("dup_second"));
  EXPECT_THAT(reg.broken()[0].reason, HasSubstr("duplicate storage plugin 'fixture-dup'"));
  EXPECT_THAT(reg.broken()[0].reason, HasSubstr("dup_first"));
  // Selecting it says which file is used and that the other one is not.
  CapturedLog log;
  ASSERT_TRUE(reg.select(PluginKind::storage, "fixture-dup"));
  log.restore();
  EXPECT_THAT(log.str(), HasSubstr("libcolibri-storage-fixture-dup.so, also a storage plugin 'fixture-dup', comes "
                                   "later in the search path and is not used"));
}

TEST(Registry, UnknownNameListsSearchPathAndAvailablePlugins) {
  auto reg = scan({"good", "score_zero", "wrong_abi"});
  auto p = reg.select(PluginKind::storage, "nvme-magic");
  ASSERT_FALSE(p);
  const std::string m = p.error().message();
  EXPECT_THAT(m, HasSubstr("no storage plugin named 'nvme-magic'"));
  EXPECT_THAT(m, ::testing::Not(HasSubstr("did you mean")));  // nothing close
  auto typo = reg.select(PluginKind::storage, "fixture-godo");
  ASSERT_FALSE(typo);
  EXPECT_THAT(typo.error().message(),
              HasSubstr("no storage plugin named 'fixture-godo' (did you mean 'fixture-good'?)"));
  EXPECT_THAT(m, HasSubstr(fixture_dir("good").string()));
  EXPECT_THAT(m, HasSubstr(fixture_dir("wrong_abi").string()));
  EXPECT_THAT(m, HasSubstr("fixture-good (score 50)"));
  EXPECT_THAT(m, HasSubstr("fixture-zero (score 0: needs a frobnicator"));
  EXPECT_THAT(m, HasSubstr("broken: "));
  auto none = reg.select(PluginKind::compute, "auto");
  ASSERT_FALSE(none);
  EXPECT_THAT(none.error().message(), HasSubstr("available compute plugins: none"));
}

TEST(Registry, SelectingARefusedPluginByNameSaysWhyItWasRefused) {
  auto reg = scan({"wrong_abi"});
  auto p = reg.select(PluginKind::storage, "fixture-abi");
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("looks like it but was refused"));
  EXPECT_THAT(p.error().message(), HasSubstr("was built for SDK ABI"));
}

TEST(Registry, ObjectsKeepWorkingAfterTheRegistryIsGone) {
  std::shared_ptr<colibri::sdk::Storage> storage;
  {
    auto reg = scan({"good"});
    std::map<std::string, colibri::sdk::ConfigValue, std::less<>> cfg{{"greeting", {std::string("salut")}}};
    auto obj = reg.create_as<colibri::sdk::Storage>(reg.plugins().front(), colibri::sdk::ConfigView(cfg));
    ASSERT_TRUE(obj) << obj.error().to_string();
    storage = *obj;
  }
  auto f = storage->open("/nonexistent");  // calls into the library's code
  ASSERT_FALSE(f);
  EXPECT_THAT(f.error().message(), HasSubstr("greeting salut"));
}

TEST(Registry, PluginLogsAndMetricsCarryItsName) {
  CapturedLog captured;
  spdlog::set_level(spdlog::level::info);
  auto reg = scan({"good"});
  auto obj = reg.create(reg.plugins().front(), {});
  captured.restore();
  ASSERT_TRUE(obj);
  EXPECT_THAT(captured.str(), HasSubstr("[storage/fixture-good] hello from fixture-good"));
  EXPECT_GE(colibri::util::Metrics::global().get("storage_fixture_good_created_total"), 1.0);
  // How bench finds one plugin's counters: by its prefix, names without it.
  const auto own =
      colibri::util::Metrics::global().with_prefix(colibri::util::plugin_metric_prefix("storage", "fixture-good"));
  ASSERT_EQ(own.count("created_total"), 1u);
  EXPECT_GE(own.at("created_total"), 1.0);
  for (const auto& [name, v] : own) EXPECT_EQ(name.find("storage_"), std::string::npos) << name;
}

TEST(Registry, FindsTheInTreePlugins) {
  auto reg = PluginRegistry::scan({{COLIBRI_TEST_PLUGIN_DIR, "build"}}, colibri::util::host_info());
  EXPECT_NE(reg.find(PluginKind::storage, "pread"), nullptr);
  EXPECT_NE(reg.find(PluginKind::cache, "lru"), nullptr);
  for (const auto& b : reg.broken()) ADD_FAILURE() << b.path << ": " << b.reason;
}

TEST(Registry, SearchPathOrder) {
  ::setenv("COLIBRI_PLUGIN_PATH", "/opt/a:/opt/b", 1);
  auto dirs = colibri::registry::default_search_path({"/profile/dir"});
  ::unsetenv("COLIBRI_PLUGIN_PATH");
  ASSERT_GE(dirs.size(), 5u);
  EXPECT_EQ(dirs[0].path, "/profile/dir");
  EXPECT_EQ(dirs[0].origin, "profile plugins.paths");
  EXPECT_EQ(dirs[1].path, "/opt/a");
  EXPECT_EQ(dirs[2].path, "/opt/b");
  EXPECT_EQ(dirs[2].origin, "COLIBRI_PLUGIN_PATH");
  EXPECT_EQ(dirs[3].origin, "install dir");
  // A third-party plugin installed with CMake's default prefix is found (when the install dir is elsewhere, as the
  // packages' /usr).
  std::size_t local = 0;
  while (local < dirs.size() && dirs[local].path != "/usr/local/lib/colibri/plugins") ++local;
  ASSERT_LT(local, dirs.size());
  EXPECT_EQ(dirs[local].origin, dirs[3].path == dirs[local].path ? "install dir" : "local plugins");
  EXPECT_EQ(dirs.back().origin, "next to the executable");
  // Who named each decides whether its absence is worth a warning.
  EXPECT_EQ(dirs[0].kind, SearchDirKind::user);
  EXPECT_EQ(dirs[2].kind, SearchDirKind::user);
  EXPECT_EQ(dirs[3].kind, SearchDirKind::colibri);
  EXPECT_EQ(dirs.back().kind, SearchDirKind::colibri);
}

// A directory the user named that is absent is warned about (its plugins would be missed silently otherwise); the
// built-in places, which may well not exist, are not.
TEST(Registry, OnlyAnAbsentDirectoryTheUserNamedIsWarnedAbout) {
  const fs::path absent = fs::temp_directory_path() / "colibri-absent-plugin-dir";
  fs::remove_all(absent);
  CapturedLog log;
  PluginRegistry::scan({{absent / "colibri", "install dir", SearchDirKind::colibri},
                        {absent / "local", "local plugins", SearchDirKind::third_party}},
                       colibri::util::host_info());
  const std::string silent = log.str();
  PluginRegistry::scan({{absent / "mine", "COLIBRI_PLUGIN_PATH", SearchDirKind::user}}, colibri::util::host_info());
  // A command scans again once the profile is checked: said once.
  PluginRegistry::scan({{absent / "mine", "COLIBRI_PLUGIN_PATH", SearchDirKind::user}}, colibri::util::host_info());
  log.restore();
  EXPECT_EQ(silent, "");
  const std::string said = (absent / "mine").string() + " (from COLIBRI_PLUGIN_PATH) does not exist";
  EXPECT_THAT(log.str(), HasSubstr(said));
  EXPECT_EQ(log.str().find(said), log.str().rfind(said)) << log.str();
}

}  // namespace
