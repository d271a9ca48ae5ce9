#include "colibri/engine/usage_history.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include "colibri/model/manifest.hpp"

namespace colibri::engine {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const auto d = fs::path(COLIBRI_TEST_BINARY_DIR) / "streaming-unit" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(UsageHistory, PathFollowsXdgCacheHomeAndDiffersPerModel) {
  const auto d = scratch("xdg");
  ::setenv("XDG_CACHE_HOME", d.c_str(), 1);
  const auto a = usage_history_path("/models/a/mixtral");
  const auto b = usage_history_path("/models/b/mixtral");
  EXPECT_EQ(a.parent_path(), d / "colibri" / "usage");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.filename().string().rfind("mixtral-", 0), 0u) << a;
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", d.c_str(), 1);
  EXPECT_EQ(colibri_cache_dir(), d / ".cache" / "colibri");
}

// A model directory whose manifest.json holds `text` (model_identity hashes it).
fs::path model_dir(const fs::path& d, const std::string& text) {
  fs::create_directories(d / "model");
  std::ofstream(d / "model" / "manifest.json") << text;
  return d / "model";
}

TEST(UsageHistory, MergeSavesTheFormatThePinnedPolicyReads) {
  const auto d = scratch("merge");
  const auto file = d / "h.json";
  const auto model = model_dir(d, "{\"a\": 1}");
  EXPECT_TRUE(load_usage_history(file)->counts.empty());  // missing: empty, not an error
  std::map<std::uint64_t, std::uint64_t> run{{(3ull << 32) | 1, 5}, {(0ull << 32) | 7, 2}};
  ASSERT_TRUE(merge_usage_history(file, run, model));
  ASSERT_TRUE(merge_usage_history(file, run, model));
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"version\": 1"), std::string::npos) << text;
  EXPECT_NE(text.find("\"3:1\": 10"), std::string::npos) << text;
  auto h = load_usage_history(file);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->total(), 14u);
  const auto top = h->most_used(1);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0], std::make_pair(3u, 1u));
  EXPECT_FALSE(fs::exists(file.string() + ".partial"));
  EXPECT_EQ(h->model, model_identity(model));
  EXPECT_EQ(h->model.size(), 16u);
}

// A FIFO in the place of manifest.json has no identity (as a missing one): reading it would wait for a writer.
TEST(UsageHistory, AFifoManifestHasNoIdentityAndIsNotWaitedOn) {
  const auto d = scratch("fifo-manifest");
  fs::create_directories(d / "model");
  fs::remove(d / "model" / "manifest.json");
  ASSERT_EQ(::mkfifo((d / "model" / "manifest.json").c_str(), 0600), 0);
  EXPECT_EQ(model_identity(d / "model"), "");
}

// The history itself a FIFO (or a directory): refused by what it is; a plain stream waited for a writer forever.
TEST(UsageHistory, AFifoOrDirectoryHistoryIsRefusedNotWaitedOn) {
  const auto d = scratch("fifo-history");
  ASSERT_EQ(::mkfifo((d / "h.json").c_str(), 0600), 0);
  auto h = load_usage_history(d / "h.json");
  ASSERT_FALSE(h);
  EXPECT_NE(h.error().message().find("is a named pipe (FIFO)"), std::string::npos) << h.error().message();
  EXPECT_NE(h.error().message().find("reading usage history"), std::string::npos) << h.error().message();
  fs::create_directories(d / "dir.json");
  auto dir = load_usage_history(d / "dir.json");
  ASSERT_FALSE(dir);
  EXPECT_NE(dir.error().message().find("is a directory"), std::string::npos) << dir.error().message();
  EXPECT_TRUE(load_usage_history(d / "none.json"));  // none yet: an empty history
}

TEST(UsageHistory, CountsStopAtTheLargestValueInsteadOfWrapping) {
  const auto d = scratch("saturate");
  const auto file = d / "h.json";
  const auto model = model_dir(d, "{\"a\": 1}");
  constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();
  std::map<std::uint64_t, std::uint64_t> huge{{(0ull << 32) | 0, kMax - 1}, {(0ull << 32) | 1, kMax - 5}};
  ASSERT_TRUE(merge_usage_history(file, huge, model));
  std::map<std::uint64_t, std::uint64_t> run{{(0ull << 32) | 0, 3}, {(0ull << 32) | 2, 4}};
  ASSERT_TRUE(merge_usage_history(file, run, model));
  auto h = load_usage_history(file);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->counts.at({0u, 0u}), kMax);  // was 1 after wrapping: the most used became the least
  EXPECT_EQ(h->most_used(1)[0], std::make_pair(0u, 0u));
  EXPECT_EQ(h->total(), kMax);  // not a wrapped sum
}

TEST(UsageHistory, ABareFileNameIsSavedInTheCurrentDirectory) {
  const auto d = scratch("bare");
  const auto model = model_dir(d, "{\"a\": 2}");
  const auto cwd = fs::current_path();
  fs::current_path(d);
  std::map<std::uint64_t, std::uint64_t> run{{(1ull << 32) | 2, 3}};
  const auto s = merge_usage_history("bare.json", run, model);
  fs::current_path(cwd);
  ASSERT_TRUE(s) << s.message();
  auto h = load_usage_history(d / "bare.json");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->total(), 3u);
}

TEST(UsageHistory, AModelConvertedAgainAtThePathStartsANewHistory) {
  const auto d = scratch("identity");
  ::setenv("XDG_CACHE_HOME", (d / "cache").c_str(), 1);
  const auto file = usage_history_path(d / "model");  // the model's own file: colibri's to start afresh
  ASSERT_TRUE(merge_usage_history(file, {{(1ull << 32) | 5, 9}}, model_dir(d, "{\"experts\": 8}")));
  ASSERT_TRUE(merge_usage_history(file, {{(1ull << 32) | 2, 3}}, model_dir(d, "{\"experts\": 4}")));
  auto h = load_usage_history(file);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->counts.size(), 1u) << "the old model's 1:5 is gone";
  EXPECT_EQ(h->total(), 3u);
  EXPECT_EQ(h->model, model_identity(d / "model"));
  // A history from before identities were kept is merged into, and gets one.
  std::ofstream(file) << "{\"version\": 1, \"counts\": {\"0:1\": 4}}";
  ASSERT_TRUE(merge_usage_history(file, {{1, 1}}, d / "model"));
  EXPECT_EQ(load_usage_history(file)->total(), 5u);
  EXPECT_EQ(load_usage_history(file)->model, model_identity(d / "model"));
  ::unsetenv("XDG_CACHE_HOME");
}

// A file the user named (the server's --usage-history) that holds another model's counts is theirs: never replaced.
TEST(UsageHistory, ANamedFileOfAnotherModelIsLeftAsItIs) {
  const auto d = scratch("named");
  ::setenv("XDG_CACHE_HOME", (d / "cache").c_str(), 1);
  const auto file = d / "h.json";
  ASSERT_TRUE(merge_usage_history(file, {{(1ull << 32) | 5, 9}}, model_dir(d, "{\"experts\": 8}")));
  EXPECT_FALSE(is_own_history_file(file, d / "model"));
  EXPECT_TRUE(is_own_history_file(usage_history_path(d / "model"), d / "model"));
  const auto s = merge_usage_history(file, {{(1ull << 32) | 2, 3}}, model_dir(d, "{\"experts\": 4}"));
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("holds the expert use of another model"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(file.string()), std::string::npos) << s.message();
  auto h = load_usage_history(file);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->total(), 9u) << "the other model's counts stay";
  ::unsetenv("XDG_CACHE_HOME");
}

// Counts made on the model as it was loaded are not added once another conversion has replaced it on disk (a server
// that ran while the model was converted again): the history keeps what it had, and the error says why.
TEST(UsageHistory, CountsOfAModelReplacedSinceItWasLoadedAreNotMerged) {
  const auto d = scratch("replaced");
  const auto file = d / "h.json";
  const auto model = model_dir(d, "{\"experts\": 8}");
  const std::string loaded = model_identity(model);
  ASSERT_TRUE(merge_usage_history(file, {{(1ull << 32) | 5, 9}}, model, loaded));
  EXPECT_EQ(load_usage_history(file)->model, loaded);
  model_dir(d, "{\"experts\": 4}");  // converted again while the counts were made
  const auto s = merge_usage_history(file, {{(1ull << 32) | 5, 2}}, model, loaded);
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("changed on disk since it was loaded (converted again?)"), std::string::npos)
      << s.message();
  auto h = load_usage_history(file);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->total(), 9u) << "the old counts stay, the new ones are not added";
  EXPECT_EQ(h->model, loaded);
  // The identity load_manifest gives is the one model_identity reads.
  EXPECT_EQ(colibri::model::manifest_identity("{\"experts\": 4}"), model_identity(model));
}

// `cache clear` while another process merges: it waits for the lock, so the merge cannot write the counts back after
// the removal.
TEST(UsageHistory, RemovalWaitsForTheLockOfAMergeInFlight) {
  const auto d = scratch("remove-locked");
  const auto file = d / "h.json";
  ASSERT_TRUE(merge_usage_history(file, {{(1ull << 32) | 5, 9}}, model_dir(d, "{\"experts\": 8}")));
  const int held = ::open((file.string() + ".lock").c_str(), O_RDWR);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  std::atomic<bool> done{false};
  std::thread remover([&] {
    auto removed = remove_usage_history(file);
    EXPECT_TRUE(removed && *removed);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "removed while another process held the lock";
  EXPECT_TRUE(fs::exists(file));
  ::close(held);  // releases it
  remover.join();
  EXPECT_FALSE(fs::exists(file));
  auto again = remove_usage_history(file);
  ASSERT_TRUE(again);
  EXPECT_FALSE(*again);  // nothing to remove
}

TEST(UsageHistory, ConcurrentMergesLoseNoCount) {
  const auto d = scratch("concurrent");
  const auto file = d / "h.json";
  const auto model = model_dir(d, "{}");
  constexpr int kWriters = 4, kMerges = 25;
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < kMerges; ++i) {
        if (!merge_usage_history(file, {{static_cast<std::uint64_t>(w), 1}}, model)) ++failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto h = load_usage_history(file);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->total(), static_cast<std::uint64_t>(kWriters * kMerges));
}

TEST(UsageHistory, MalformedFilesNameTheFileAndEntry) {
  const auto d = scratch("bad");
  const std::pair<const char*, const char*> cases[] = {
      {"[]", "not a JSON object"},
      {"{\"version\":2,\"counts\":{}}", "\"version\" must be 1"},
      {"{\"counts\":{\"3-1\":4}}", "key \"3-1\" is not layer:expert"},
      {"{\"counts\":{\"3:1\":-4}}", "\"3:1\" must be a non-negative integer"},
      {"{\"model\":7,\"counts\":{}}", "\"model\" must be a string"},
  };
  for (const auto& [text, want] : cases) {
    const auto file = d / "h.json";
    std::ofstream(file) << text;
    auto h = load_usage_history(file);
    ASSERT_FALSE(h) << text;
    EXPECT_NE(h.error().message().find(want), std::string::npos) << h.error().message();
    EXPECT_NE(h.error().message().find(file.string()), std::string::npos) << h.error().message();
    // A bad file is not silently replaced by a merge.
    EXPECT_FALSE(merge_usage_history(file, {{1, 1}}, d));
  }
}

}  // namespace
}  // namespace colibri::engine
