#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "colibri/sdk/testing/cache_conformance.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"

using colibri::sdk::testing::CacheConformance;
using colibri::sdk::testing::CacheParam;

// The conformance keys are layers 0..9; a wanted list that overlaps them must not break the contract.
INSTANTIATE_TEST_SUITE_P(
    Pinned, CacheConformance,
    ::testing::Values(CacheParam{PINNED_PLUGIN_PATH, {}, "no_pins"},
                      CacheParam{PINNED_PLUGIN_PATH, {{"pinned_experts", "[\"2:0\", \"0:3\"]"}}, "with_pins"}),
    colibri::sdk::testing::CacheParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
namespace fs = std::filesystem;

const EvictablePredicate kAll{[](void*, ExpertKey) noexcept { return true; }, nullptr};

Expected<std::shared_ptr<CachePolicy>> make(const std::map<std::string, std::string>& options,
                                            std::shared_ptr<ct::RecordingHost> host = nullptr) {
  auto lib = ct::LoadedPlugin::load(PINNED_PLUGIN_PATH);
  if (!lib) return lib.error();
  return (*lib)->create_as<CachePolicy>(options, std::move(host));
}

class History {
 public:
  explicit History(const std::string& text)
      : path_(fs::temp_directory_path() /
              ("colibri-history-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++) + ".json")) {
    std::ofstream(path_) << text;
  }
  ~History() { fs::remove(path_); }
  [[nodiscard]] std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(PinnedPolicy, WantedPinsAreTheProfileList) {
  auto p = make({{"pinned_experts", "[\"3:1\", \"3:5\", \"12:0\", \"3:1\"]"}});
  ASSERT_TRUE(p) << p.error().to_string();
  const auto pins = (*p)->wanted_pins();
  ASSERT_EQ(pins.size(), 3u);  // the duplicate counts once
  EXPECT_EQ(pins[0], (ExpertKey{3, 1}));
  EXPECT_EQ(pins[1], (ExpertKey{3, 5}));
  EXPECT_EQ(pins[2], (ExpertKey{12, 0}));
}

TEST(PinnedPolicy, InvalidEntriesAreNamed) {
  for (const char* bad : {"3-1", "3:", ":1", "-1:2", "3:1:2", "a:b", " 3:1", "99999999999:1"}) {
    auto p = make({{"pinned_experts", std::string("[\"0:0\", \"") + bad + "\"]"}});
    ASSERT_FALSE(p) << bad;
    EXPECT_NE(p.error().message().find("cache.pinned_experts[1]"), std::string::npos) << p.error().message();
    EXPECT_NE(p.error().message().find(bad), std::string::npos) << p.error().message();
  }
}

TEST(PinnedPolicy, EverythingElseIsLeastRecentlyUsed) {
  auto p = make({{"pinned_experts", "[\"0:9\"]"}});
  ASSERT_TRUE(p);
  auto& policy = **p;
  for (std::uint32_t e = 0; e < 4; ++e) policy.on_insert({0, e}, 1);
  policy.on_access({0, 0});  // order now: 1, 2, 3, 0
  std::vector<std::uint32_t> victims;
  while (auto v = policy.pick_victim(kAll)) {
    victims.push_back(v->expert);
    policy.on_erase(*v);
  }
  EXPECT_EQ(victims, (std::vector<std::uint32_t>{1, 2, 3, 0}));
}

TEST(PinnedPolicy, WantedButUnpinnedEntriesAreEvictedLast) {
  auto p = make({{"pinned_experts", "[\"1:1\"]"}});
  ASSERT_TRUE(p);
  auto& policy = **p;
  policy.on_insert({1, 1}, 1);  // oldest, but wanted
  policy.on_insert({1, 2}, 1);
  policy.on_insert({1, 3}, 1);
  auto v = policy.pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{1, 2}));
  policy.on_erase({1, 2});
  policy.on_erase({1, 3});
  v = policy.pick_victim(kAll);
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, (ExpertKey{1, 1}));
  policy.on_pin({1, 1}, true);  // once the core pins it, never
  EXPECT_FALSE(policy.pick_victim(kAll));
}

TEST(PinnedPolicy, AutoPinsTakeTheMostUsedFromTheHistory) {
  History h(R"({"version": 1, "counts": {"0:1": 10, "2:3": 500, "1:1": 40, "5:5": 40, "7:0": 0, "3:1": 9}})");
  auto host = std::make_shared<ct::RecordingHost>();
  auto p = make({{"pinned_experts", "[\"3:1\"]"}, {"auto_pin_history", h.path()}, {"auto_pin_count", "3"}}, host);
  ASSERT_TRUE(p) << p.error().to_string();
  const auto pins = (*p)->wanted_pins();
  // Explicit first; then by count, ties by key: 2:3 (500), 1:1 (40), 5:5 (40).
  ASSERT_EQ(pins.size(), 4u);
  EXPECT_EQ(pins[0], (ExpertKey{3, 1}));
  EXPECT_EQ(pins[1], (ExpertKey{2, 3}));
  EXPECT_EQ(pins[2], (ExpertKey{1, 1}));
  EXPECT_EQ(pins[3], (ExpertKey{5, 5}));
}

TEST(PinnedPolicy, MissingHistoryMeansNoAutoPins) {
  auto host = std::make_shared<ct::RecordingHost>();
  auto p = make({{"auto_pin_history", "/nonexistent/colibri/history.json"}, {"auto_pin_count", "4"}}, host);
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_TRUE((*p)->wanted_pins().empty());
  ASSERT_FALSE(host->lines().empty());
  EXPECT_NE(host->lines()[0].find("/nonexistent/colibri/history.json"), std::string::npos);
  EXPECT_EQ(host->lines()[0].rfind("warn: ", 0), 0u) << "a misspelt path pins nothing: said above info level";
}

TEST(PinnedPolicy, AHistoryThatIsADirectoryIsNamedNotAnException) {
  const fs::path dir = fs::temp_directory_path() / ("colibri-history-dir-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto p = make({{"auto_pin_history", dir.string()}, {"auto_pin_count", "2"}});
  fs::remove_all(dir);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().message(),
            "cache.auto_pin_history " + dir.string() + " is a directory; name the usage-history JSON file");
}

TEST(PinnedPolicy, MalformedHistoryIsAnErrorNamingFileAndEntry) {
  struct Case {
    const char* text;
    const char* mention;
  };
  for (const Case& c : {Case{"{not json", "not valid JSON"}, Case{R"({"count": {}})", "\"counts\""},
                        Case{R"({"counts": {"3x1": 4}})", "3x1"}, Case{R"({"counts": {"3:1": -4}})", "3:1"},
                        Case{R"({"counts": {"3:1": "many"}})", "non-negative integer"}}) {
    History h(c.text);
    auto p = make({{"auto_pin_history", h.path()}, {"auto_pin_count", "2"}});
    ASSERT_FALSE(p) << c.text;
    EXPECT_NE(p.error().message().find(h.path()), std::string::npos) << p.error().message();
    EXPECT_NE(p.error().message().find(c.mention), std::string::npos) << p.error().message();
  }
}

TEST(PinnedPolicy, AutoPinCountNeedsAHistory) {
  auto p = make({{"auto_pin_count", "2"}});
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message().find("auto_pin_history"), std::string::npos);
}

}  // namespace
