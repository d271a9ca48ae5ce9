#include "colibri/profile/profile.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "colibri/registry/registry.hpp"
#include "colibri/util/host_info.hpp"

namespace {

namespace fs = std::filesystem;
using colibri::profile::LoadOptions;
using colibri::profile::Origin;
using colibri::profile::Profile;
using colibri::sdk::OptionSpec;
using colibri::sdk::OptionType;
using colibri::sdk::PluginKind;
using ::testing::HasSubstr;
using ::testing::Not;

class ProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("colibri-profile-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  colibri::sdk::Expected<Profile> load(const std::string& profile, std::vector<colibri::profile::Override> ov = {},
                                       std::map<std::string, std::string> env = {}) {
    LoadOptions o;
    o.profile = profile;
    o.overrides = std::move(ov);
    o.environment = std::move(env);
    o.use_process_environment = false;
    o.search_dirs = {dir_};
    return Profile::load(o);
  }

  fs::path dir_;
};

TEST_F(ProfileTest, BuiltInDefaultsRunAnywhere) {
  auto p = load("");  // no cpu.yaml in the search dirs: built-in only
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->name(), "built-in");
  EXPECT_EQ(p->get_string("compute.backend"), "cpu");
  EXPECT_EQ(p->get_string("storage.plugin"), "pread");
  EXPECT_EQ(p->get_string("cache.policy"), "frequency");
  EXPECT_TRUE(p->is_auto("memory.expert_cache"));
  EXPECT_EQ(p->get_int("server.port"), 8080);
  EXPECT_EQ(p->find("server.port")->origin.layer, Origin::Layer::builtin);
}

TEST_F(ProfileTest, AutoPicksTheDefaultCachePolicy) {
  // `cache.policy: auto` takes the highest-scoring policy: it must be the one a profile gets by default.
  auto p = load("");
  ASSERT_TRUE(p) << p.error().message();
  const auto reg =
      colibri::registry::PluginRegistry::scan({{COLIBRI_TEST_PLUGIN_DIR, "build"}}, colibri::util::host_info());
  auto best = reg.select(colibri::sdk::PluginKind::cache, "auto");
  ASSERT_TRUE(best) << best.error().message();
  EXPECT_EQ((*best)->name, p->get_string("cache.policy"));
}

TEST_F(ProfileTest, ExplicitProfileThatDoesNotExistIsAnError) {
  write("laptop.yaml", "compute: {backend: cpu}\n");
  auto p = load("lapton");
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("profile 'lapton' was not found"));
  EXPECT_THAT(p.error().message(), HasSubstr("did you mean 'laptop'?"));
}

TEST_F(ProfileTest, SizesAndOriginsWithLineNumbers) {
  const auto file = write("small.yaml",
                          "# comment\n"
                          "memory:\n"
                          "  expert_cache: 8G\n"
                          "  vram_budget: 512M\n"
                          "prefetch:\n"
                          "  layers: 3\n");
  auto p = load(file.string());
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_int("memory.expert_cache"), 8LL << 30);
  EXPECT_EQ(p->get_int("memory.vram_budget"), 512LL << 20);
  EXPECT_EQ(p->get_int("prefetch.layers"), 3);
  const auto* e = p->find("memory.vram_budget");
  EXPECT_EQ(e->origin.layer, Origin::Layer::profile);
  EXPECT_THAT(e->origin.describe(), HasSubstr("small.yaml:4:16"));
}

TEST_F(ProfileTest, ExtendsLayersBaseFirst) {
  write("base.yaml", "memory: {expert_cache: 4G, vram_budget: 1G}\nstorage: {queue_depth: 8}\n");
  write("derived.yaml", "extends: base\nmemory:\n  expert_cache: 6G\n");
  auto p = load("derived");
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_int("memory.expert_cache"), 6LL << 30);  // derived wins
  EXPECT_EQ(p->get_int("memory.vram_budget"), 1LL << 30);   // inherited
  EXPECT_EQ(p->get_int("storage.queue_depth"), 8);
  EXPECT_THAT(p->find("memory.vram_budget")->origin.describe(), HasSubstr("base.yaml"));
  ASSERT_EQ(p->files().size(), 2u);
  EXPECT_EQ(p->files()[0].filename(), "derived.yaml");
}

TEST_F(ProfileTest, TheDescriptionIsTheNearestOneInTheExtendsChain) {
  write("base.yaml", "description: the base\nstorage: {queue_depth: 8}\n");
  write("plain.yaml", "extends: base\n");
  write("own.yaml", "extends: base\ndescription: my laptop, 32 GB\n");
  write("none.yaml", "storage: {queue_depth: 4}\n");
  EXPECT_EQ(load("plain")->description(), "the base");
  EXPECT_EQ(load("own")->description(), "my laptop, 32 GB");
  EXPECT_EQ(load("none")->description(), "");
}

TEST_F(ProfileTest, AnEmptyExtendsIsAnError) {
  write("empty.yaml", "extends: \"\"\nstorage: {queue_depth: 4}\n");
  auto p = load("empty");
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(),
              HasSubstr("empty.yaml:1:1: 'extends' is empty; name the profile this one builds on"));
}

TEST_F(ProfileTest, ALinkThatCannotBeFollowedIsNamedNotCalledMissing) {
  std::filesystem::create_symlink(dir_ / "loop.yaml", dir_ / "loop.yaml");
  std::filesystem::create_symlink(dir_ / "gone.yaml", dir_ / "dangling.yaml");
  auto loop = load("loop");
  ASSERT_FALSE(loop);
  EXPECT_THAT(loop.error().message(),
              HasSubstr("loop.yaml is a symbolic link that does not lead to a profile file (Too "
                        "many levels of symbolic links)"));
  auto dangling = load("dangling");
  ASSERT_FALSE(dangling);
  EXPECT_THAT(dangling.error().message(), HasSubstr("dangling.yaml is a symbolic link that does not lead to a profile "
                                                    "file (its target " +
                                                    (dir_ / "gone.yaml").string() + " does not exist)"));
}

TEST_F(ProfileTest, APipeIsNamedAsSuchNotCalledMissingOrRead) {
  ASSERT_EQ(::mkfifo((dir_ / "pipe.yaml").c_str(), 0600), 0);
  for (const std::string& name : {std::string("pipe"), (dir_ / "pipe.yaml").string()}) {
    auto p = load(name);  // would block on open if it were read
    ASSERT_FALSE(p);
    EXPECT_THAT(p.error().message(), HasSubstr("pipe.yaml is a named pipe (FIFO), not a profile file")) << name;
    EXPECT_THAT(p.error().message(), Not(HasSubstr("did you mean"))) << name;
  }
}

TEST_F(ProfileTest, ExtendsCycleIsAnError) {
  write("a.yaml", "extends: b\n");
  write("b.yaml", "extends: a\n");
  auto p = load("a");
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("cycle"));
}

TEST_F(ProfileTest, AProfileExtendingOnlyItselfSaysSo) {
  write("loop.yaml", "extends: loop.yaml\n");
  for (const std::string& name : {std::string("loop"), (dir_ / "loop.yaml").string()}) {
    auto p = load(name);
    ASSERT_FALSE(p) << name;
    EXPECT_THAT(p.error().message(), HasSubstr("'extends: loop.yaml' names this profile itself")) << name;
    EXPECT_THAT(p.error().message(), HasSubstr("loop.yaml: extends 'loop.yaml'")) << name;
  }
}

TEST_F(ProfileTest, AProfileExtendingItsOwnNameExtendsTheOneItShadows) {
  // A user's ~/.config/colibri/profiles/cpu.yaml with `extends: cpu` builds on the shipped cpu profile.
  const fs::path user = dir_ / "user", shipped = dir_ / "shipped";
  fs::create_directories(user);
  fs::create_directories(shipped);
  std::ofstream(shipped / "cpu.yaml") << "memory: {expert_cache: 4G}\nstorage: {queue_depth: 8}\n";
  std::ofstream(user / "cpu.yaml") << "extends: cpu\nmemory:\n  expert_cache: 2G\n";
  LoadOptions o;
  o.profile = "cpu";
  o.use_process_environment = false;
  o.search_dirs = {user, shipped};
  auto p = Profile::load(o);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_int("memory.expert_cache"), 2LL << 30);
  EXPECT_EQ(p->get_int("storage.queue_depth"), 8);
  ASSERT_EQ(p->files().size(), 2u);
  EXPECT_EQ(p->files()[1], shipped / "cpu.yaml");
}

TEST_F(ProfileTest, AKeySetTwiceIsAnErrorNotTheLastSilently) {
  for (const auto& [file, text, want] : {
           std::tuple{"twice.yaml", "memory:\n  expert_cache: 1.5G\n  expert_cache: 2G\n",
                      "twice.yaml:3:3: 'memory.expert_cache' is set twice (first at "},
           std::tuple{"sections.yaml", "memory:\n  expert_cache: 1G\nmemory:\n  expert_cache: 2G\n",
                      "sections.yaml:3:1: 'memory' is written twice (first at "},
           // Different keys in two blocks of one section: still one section written twice, not merged.
           std::tuple{"merged.yaml",
                      "memory:\n  expert_cache: 1G\nstorage:\n  queue_depth: 4\nmemory:\n  kv_cache: 1G\n",
                      "merged.yaml:5:1: 'memory' is written twice"},
       }) {
    auto p = load(write(file, text).string());
    ASSERT_FALSE(p) << file;
    EXPECT_THAT(p.error().message(), HasSubstr(want));
  }
}

TEST_F(ProfileTest, ATabInTheIndentationIsNamed) {
  auto p = load(write("tabs.yaml", "compute:\n\tbackend: cpu\n").string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("tabs.yaml:2"));
  EXPECT_THAT(p.error().message(), HasSubstr("line 2 is indented with a tab, which YAML does not allow: use spaces"));
}

TEST_F(ProfileTest, NestingTooDeepIsSaidSoNotBadFile) {
  auto p = load(write("deep.yaml", "compute: " + std::string(5000, '[') + std::string(5000, ']') + "\n").string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("deep.yaml:1:"));
  EXPECT_THAT(p.error().message(), HasSubstr("nested too deeply"));
  EXPECT_THAT(p.error().message(), Not(HasSubstr("bad file")));
}

TEST_F(ProfileTest, AYmlProfileIsFoundByName) {
  write("fast.yml", "storage: {queue_depth: 5}\n");
  auto p = load("fast");
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_int("storage.queue_depth"), 5);
  const auto listed = colibri::profile::list_profiles({dir_});
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].first, "fast");
}

TEST_F(ProfileTest, AMisspeltEnvironmentSettingIsWarnedAbout) {
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
  auto p = load("", {},
                {{"COLIBRI_MEMORY_VRAM_BUGET", "1G"},
                 {"COLIBRI_MEMORY_VRAM_BUDGET", "2G"},
                 {"COLIBRI_PLUGIN_PATH", "/x"},
                 {"COLIBRI_SERVER_ARGS", "--verbose"},
                 {"COLIBRI_STORAGE_PLUGIN", ""},
                 {"COLIBRI_CACHE_HALF_LIFE", "9"},
                 {"COLIBRI_MEMROY_EXPERT_CACHE", "1G"},
                 {"COLIBRI_KV_CACHE", "1G"},
                 {"COLIBRI_API_KEY", "k"},
                 {"COLIBRI_REQUIRE_BACKEND", "1"}});
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_int("memory.vram_budget"), 2LL << 30);
  const std::string log = captured.str();
  EXPECT_THAT(log, HasSubstr("environment COLIBRI_MEMORY_VRAM_BUGET names no canonical key and is ignored (did you "
                             "mean COLIBRI_MEMORY_VRAM_BUDGET?)"));
  EXPECT_THAT(log, HasSubstr("COLIBRI_CACHE_HALF_LIFE names no canonical key"));
  // A section misspelt or left out: the key is still recognised (the cache ran at 80% of RAM, silently).
  EXPECT_THAT(log, HasSubstr("COLIBRI_MEMROY_EXPERT_CACHE names no canonical key and is ignored (did you mean "
                             "COLIBRI_MEMORY_EXPERT_CACHE?)"));
  EXPECT_THAT(log, HasSubstr("COLIBRI_KV_CACHE names no canonical key and is ignored (did you mean "
                             "COLIBRI_MEMORY_KV_CACHE?)"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("COLIBRI_API_KEY"))) << "the server's own variable";
  EXPECT_THAT(log, ::testing::Not(HasSubstr("COLIBRI_REQUIRE_BACKEND"))) << "like no key: another program's";
  EXPECT_THAT(log, HasSubstr("--set cache.KEY=VALUE"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("COLIBRI_PLUGIN_PATH"))) << "not a profile key, and not a typo of one";
  EXPECT_THAT(log, ::testing::Not(HasSubstr("COLIBRI_SERVER_ARGS"))) << "the packaged service's own variable";
  // An empty variable is unset: the built-in default stays, not "auto".
  EXPECT_EQ(p->get_string("storage.plugin"), "pread");
  EXPECT_NE(p->find("storage.plugin")->origin.describe(), "environment COLIBRI_STORAGE_PLUGIN");
  EXPECT_THAT(log, ::testing::Not(HasSubstr("COLIBRI_MEMORY_VRAM_BUDGET is not")));
}

TEST_F(ProfileTest, PrecedenceCliOverEnvironmentOverProfile) {
  write("p.yaml", "prefetch: {layers: 1}\nstorage: {queue_depth: 4}\nserver: {port: 9000}\n");
  auto p = load("p", {{"prefetch.layers", "3", "--prefetch-layers"}},
                {{"COLIBRI_PREFETCH_LAYERS", "2"}, {"COLIBRI_STORAGE_QUEUE_DEPTH", "16"}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_int("prefetch.layers"), 3);
  EXPECT_EQ(p->find("prefetch.layers")->origin.describe(), "command line --prefetch-layers 3");
  EXPECT_EQ(p->get_int("storage.queue_depth"), 16);
  EXPECT_EQ(p->find("storage.queue_depth")->origin.describe(), "environment COLIBRI_STORAGE_QUEUE_DEPTH");
  EXPECT_EQ(p->get_int("server.port"), 9000);
}

TEST_F(ProfileTest, EnvironmentSelectsTheProfile) {
  write("envp.yaml", "server: {port: 7000}\n");
  auto p = load("", {}, {{"COLIBRI_PROFILE", "envp"}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->name(), "envp");
  EXPECT_EQ(p->get_int("server.port"), 7000);
}

TEST_F(ProfileTest, SetAnyKeyFromTheCommandLine) {
  auto p = load("", {{"storage.plugin", "io_uring", "--set"}, {"cache.pinned_experts", "[3:1, 3:5]", "--set"}});
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_string("storage.plugin"), "io_uring");
  EXPECT_THAT(p->get_list("cache.pinned_experts"), ::testing::ElementsAre("3:1", "3:5"));
  EXPECT_EQ(p->find("storage.plugin")->origin.describe(), "command line --set storage.plugin=io_uring");
}

TEST_F(ProfileTest, MisspeltKeyGivesLineColumnAndSuggestion) {
  const auto file = write("typo.yaml", "memory:\n  expert_cache: 8G\n  vram_buget: 2G\n");
  auto p = load(file.string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(),
              HasSubstr("typo.yaml:3:3: unknown key 'memory.vram_buget'; did you mean 'vram_budget'?"));
}

TEST_F(ProfileTest, MisspeltSectionGivesSuggestion) {
  auto p = load(write("sec.yaml", "memroy:\n  expert_cache: 8G\n").string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("sec.yaml:1:1: unknown section 'memroy'; did you mean 'memory'?"));
}

TEST_F(ProfileTest, IllTypedValuesAreRejectedWithTheirPlace) {
  auto p = load(write("bad.yaml", "storage:\n  direct_io: maybe\n").string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("bad.yaml:2:14"));
  EXPECT_THAT(p.error().message(), HasSubstr("'maybe' is not a boolean"));

  auto size = load(write("size.yaml", "memory: {expert_cache: 8 gigs}\n").string());
  ASSERT_FALSE(size);
  EXPECT_THAT(size.error().message(), HasSubstr("is not a size"));

  auto port = load(write("port.yaml", "server: {port: 70000}\n").string());
  ASSERT_FALSE(port);
  EXPECT_THAT(port.error().message(), HasSubstr("out of range; use 0..65535"));
  auto any_port = load(write("any-port.yaml", "server: {port: 0}\n").string());  // as colibri-server --port 0
  ASSERT_TRUE(any_port) << any_port.error().message();
  EXPECT_EQ(any_port->get_int("server.port"), 0);

  auto pins = load(write("pins.yaml", "cache: {pinned_experts: [\"3:1\", \"x\"]}\n").string());
  ASSERT_FALSE(pins);
  EXPECT_THAT(pins.error().message(), HasSubstr("'x' is not layer:expert"));

  auto list = load(write("list.yaml", "server: {host: [a, b]}\n").string());
  ASSERT_FALSE(list);
  EXPECT_THAT(list.error().message(), HasSubstr("takes a single string, not a list"));
}

TEST_F(ProfileTest, InvalidYamlNamesTheLine) {
  auto p = load(write("broken.yaml", "memory:\n  expert_cache: [8G\n").string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("broken.yaml:"));
  EXPECT_THAT(p.error().message(), HasSubstr("invalid YAML"));
}

TEST_F(ProfileTest, SecondYamlDocumentIsAnErrorNotIgnored) {
  auto p = load(write("two.yaml", "memory:\n  expert_cache: 8G\n---\ncompute:\n  backend: cuda\n").string());
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("two.yaml:4"));
  EXPECT_THAT(p.error().message(), HasSubstr("a second YAML document"));
  auto one = load(write("one.yaml", "---\nmemory:\n  expert_cache: 8G\n").string());  // a leading --- is fine
  EXPECT_TRUE(one) << one.error().message();
}

// Found by fuzzing (tests/fuzz/fuzz_profile.cpp): with Debian 12's yaml-cpp 0.7, YAML::LoadAll on a lone ',' never
// returned, allocating until the OOM killer ended the process.
TEST_F(ProfileTest, TextThatReadsAsNothingIsAnErrorAndNeverHangs) {
  for (const std::string text : {",", "# settings\n\n  ,\n", "~\n"}) {
    auto p = load(write("nothing.yaml", text).string());
    ASSERT_FALSE(p) << text;
    EXPECT_THAT(p.error().message(), HasSubstr("nothing.yaml:" + std::to_string(text[0] == '#' ? 3 : 1) + ":"));
    EXPECT_THAT(p.error().message(), HasSubstr("no settings could be read"));
  }
  auto comments = load(write("comments.yaml", "# only a comment\n---\n").string());
  EXPECT_TRUE(comments) << comments.error().message();
}

TEST_F(ProfileTest, BadCommandLineKeys) {
  auto p = load("", {{"memory.expert_cach", "1G", "--set"}});
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message(), HasSubstr("unknown key 'memory.expert_cach'; did you mean 'memory.expert_cache'?"));
  auto q = load("", {{"plugin", "x", "--set"}});
  ASSERT_FALSE(q);
  EXPECT_THAT(q.error().message(), HasSubstr("section.key"));
  auto r = load("", {{"memory.expert_cache", "lots", "--expert-cache-size"}});
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message(), HasSubstr("--expert-cache-size lots"));
}

const OptionSpec kPluginOptions[] = {
    {"ring_entries", OptionType::integer, "256", "entries"},
    {"sqpoll", OptionType::boolean, "false", "kernel polling"},
};

// A relative path in a profile means the same file wherever the command runs: `extends`, the core's path keys and a
// plugin's path options start at the profile's directory (never the working directory's file of that name); one
// from the command line starts at the working directory; ~ is the home directory.
TEST_F(ProfileTest, RelativePathsInAProfileStartAtItsDirectory) {
  fs::create_directories(dir_ / "p" / "sub");
  write("p/A.yaml", "cache:\n  policy: lru\n");
  write("A.yaml", "cache:\n  policy: pinned\n");  // what `../A.yaml` means from the working directory dir_/p
  const auto child = write("p/sub/child.yaml",
                           "extends: ../A.yaml\nstorage:\n  paths: [../d1, ~/d2, /abs]\nplugins:\n  paths: [pl]\n"
                           "models:\n  dir: ./models\ncache:\n  auto_pin_history: h.json\n");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_ / "p");
  auto p = load(child.string(), {{"compute.threads", "1", "--set"}});
  auto from_flag = load("", {{"storage.paths", "[d3]", "--set"}, {"cache.auto_pin_history", "h.json", "--set"}});
  fs::current_path(cwd);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->get_string("cache.policy"), "lru") << "extends read the working directory's ../A.yaml";
  EXPECT_TRUE(fs::equivalent(p->files().back(), dir_ / "p" / "A.yaml")) << p->files().back();
  const std::string home = getenv("HOME") != nullptr ? getenv("HOME") : "";
  const fs::path sub = dir_ / "p" / "sub";
  // `..` is left for the OS to resolve (through a profile directory that is a symlink, as a shell would).
  EXPECT_EQ(p->get_list("storage.paths"),
            (std::vector<std::string>{(sub / "../d1").string(), home.empty() ? "~/d2" : home + "/d2", "/abs"}));
  EXPECT_EQ(p->get_list("plugins.paths"), std::vector<std::string>{(sub / "pl").string()});
  EXPECT_EQ(p->get_string("models.dir"), (sub / "./models").string());
  EXPECT_EQ(p->find("storage.paths")->text, "[../d1, ~/d2, /abs]") << "the text stays as written";
  // A plugin's option: resolved once its plugin's schema declares it a path; get_path reads it so before.
  EXPECT_EQ(p->get_path("cache.auto_pin_history"), (sub / "h.json").string());
  static const OptionSpec kPinned[] = {{"auto_pin_history", OptionType::path, "", "history"}};
  ASSERT_TRUE(p->apply_plugin_schema(PluginKind::cache, "pinned", kPinned));
  EXPECT_EQ(*p->section("cache").get_string("auto_pin_history", ""), (sub / "h.json").string());
  ASSERT_TRUE(from_flag) << from_flag.error().message();
  EXPECT_EQ(from_flag->get_list("storage.paths"), std::vector<std::string>{"d3"});
  EXPECT_EQ(from_flag->get_path("cache.auto_pin_history"), "h.json");
}

// What colibri writes into a profile (model stripe's stripe.yaml, cache warm's lines) reads back as written, whatever
// the directory is called.
TEST_F(ProfileTest, AYamlScalarReadsBackAsTheSameText) {
  for (const std::string name : {"plain", "mixtral: v2", "mixtral #2", "[x] *y", "&a !b %c @d `e", "\"q\" 'q'",
                                 "trailing ", " leading", "- dash", "? what", "{brace}", "tab\there", "ünï cödé"}) {
    const std::string dir = "/disks/" + name;
    for (const std::string& text : {dir, std::string("yes"), std::string("null"), std::string("~"), name}) {
      SCOPED_TRACE(text);
      const auto file = write("written.yaml", "models:\n  dir: " + colibri::profile::yaml_scalar(text) + "\n");
      auto p = load(file.string());
      ASSERT_TRUE(p) << p.error().message();
      EXPECT_EQ(p->find("models.dir")->text, text);
    }
  }
}

TEST_F(ProfileTest, PluginOptionsAreCheckedAgainstTheSchema) {
  const auto file = write("uring.yaml", "storage:\n  plugin: io_uring\n  ring_entries: 512\n");
  auto p = load(file.string());
  ASSERT_TRUE(p) << p.error().message();
  ASSERT_EQ(p->unvalidated().size(), 1u);
  ASSERT_TRUE(p->apply_plugin_schema(PluginKind::storage, "io_uring", kPluginOptions));
  EXPECT_TRUE(p->unvalidated().empty());
  auto view = p->section("storage");
  EXPECT_EQ(*view.get_int("ring_entries", 0), 512);
  EXPECT_EQ(*view.get_bool("sqpoll", true), false);  // default filled in from the schema
  EXPECT_EQ(view.get_string("plugin", "")->c_str(), std::string("io_uring"));
}

TEST_F(ProfileTest, MisspeltPluginOptionGetsLineAndSuggestion) {
  const auto file = write("uring2.yaml", "storage:\n  plugin: io_uring\n  ring_entires: 512\n");
  auto p = load(file.string());
  ASSERT_TRUE(p) << p.error().message();
  auto st = p->apply_plugin_schema(PluginKind::storage, "io_uring", kPluginOptions);
  ASSERT_FALSE(st);
  EXPECT_THAT(st.message(), HasSubstr("uring2.yaml:3:3: unknown key"));
  EXPECT_THAT(st.message(), HasSubstr("unknown key 'storage.ring_entires'; did you mean 'storage.ring_entries'?"));
}

TEST_F(ProfileTest, IllTypedPluginOption) {
  auto p = load("", {{"storage.sqpoll", "sometimes", "--set"}});
  ASSERT_TRUE(p);
  auto st = p->apply_plugin_schema(PluginKind::storage, "io_uring", kPluginOptions);
  ASSERT_FALSE(st);
  EXPECT_THAT(st.message(), HasSubstr("--set storage.sqpoll=sometimes"));
  EXPECT_THAT(st.message(), HasSubstr("'sometimes' is not a boolean"));
}

TEST_F(ProfileTest, ShippedProfilesAllLoad) {
  const fs::path shipped = fs::path(COLIBRI_TEST_SOURCE_DIR) / "configs" / "profiles";
  int count = 0;
  for (const auto& e : fs::directory_iterator(shipped)) {
    if (e.path().extension() != ".yaml") continue;
    ++count;
    LoadOptions o;
    o.profile = e.path().stem().string();
    o.use_process_environment = false;
    o.search_dirs = {shipped};
    auto p = Profile::load(o);
    EXPECT_TRUE(p) << e.path() << ": " << p.error().message();
  }
  EXPECT_GE(count, 5);
}

}  // namespace
