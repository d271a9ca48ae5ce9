#include "colibri/model/paths.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include "test_files.hpp"

namespace colibri::model {
namespace {

namespace fs = std::filesystem;

TEST(PathWithin, ComparesWholeComponentsNotPrefixes) {
  EXPECT_TRUE(path_within("/a/b/c", "/a/b"));
  EXPECT_TRUE(path_within("a/b/c/d", "a/b"));
  EXPECT_FALSE(path_within("a/bc", "a/b"));  // a string prefix, not a directory inside
  EXPECT_FALSE(path_within("/a/bc/d", "/a/b"));
  EXPECT_FALSE(path_within("a/b", "a/bc"));
  EXPECT_FALSE(path_within("a", "a/b"));     // the parent is not inside the child
  EXPECT_FALSE(path_within("/a/b", "a/b"));  // absolute against relative
  EXPECT_FALSE(path_within("a/b", "/a/b"));
}

TEST(PathWithin, EqualityCounts) {
  EXPECT_TRUE(path_within("a/b", "a/b"));
  EXPECT_TRUE(path_within("/", "/"));
  EXPECT_TRUE(path_within("/x", "/"));
  EXPECT_TRUE(path_within(".", "."));
  EXPECT_TRUE(path_within("a/b/c/..", "a/b"));  // normalized: a/b itself
}

TEST(PathWithin, TrailingSeparatorsAreIgnored) {
  EXPECT_TRUE(path_within("a/b/", "a/b"));
  EXPECT_TRUE(path_within("a/b", "a/b/"));
  EXPECT_TRUE(path_within("/a/b/c/", "/a/b/"));
  EXPECT_FALSE(path_within("a/bc/", "a/b/"));
}

TEST(PathWithin, DotDotIsResolvedLexically) {
  EXPECT_FALSE(path_within("a/b/../c", "a/b"));   // a/c
  EXPECT_TRUE(path_within("a/c/../b/x", "a/b"));  // a/b/x
  EXPECT_FALSE(path_within("/a/b/../../etc", "/a"));
  EXPECT_TRUE(path_within("x", "."));
  EXPECT_TRUE(path_within("./x", "a/.."));  // both name the working directory's x and .
  EXPECT_FALSE(path_within("../x", "."));
  EXPECT_TRUE(path_within("../x", ".."));
  EXPECT_FALSE(path_within("../../x", ".."));  // climbs out of ..
  EXPECT_FALSE(path_within("..", "."));
}

// <disk>/<model name> as `model stripe` leaves it: the marker, experts/L000 with one file of the model.
fs::path stripe_dir(const std::string& name, const std::string& owner) {
  const fs::path d = testing::temp_dir(name) / "tiny";
  testing::write_file(d / kStripeMarker, owner + "\n");
  testing::write_file(d / "experts" / "L000" / "E000.bin", "x");
  return d;
}

TEST(StripeDir, RemovedOnlyOnceEmptiedAndOnlyForItsOwner) {
  const fs::path model = "/models/tiny";
  const fs::path d = stripe_dir("emptied", model.string());
  EXPECT_EQ(stripe_owner(d), model.string());
  EXPECT_FALSE(remove_emptied_stripe_dir(d, model));  // still holds an expert file
  EXPECT_TRUE(fs::exists(d / "experts" / "L000" / "E000.bin"));
  fs::remove(d / "experts" / "L000" / "E000.bin");
  EXPECT_FALSE(remove_emptied_stripe_dir(d, "/models/tiny2"));  // not that model's
  EXPECT_TRUE(fs::exists(d / kStripeMarker));
  EXPECT_TRUE(remove_emptied_stripe_dir(d, model));
  EXPECT_FALSE(fs::exists(d));
  EXPECT_TRUE(fs::exists(d.parent_path()));  // the disk's own directory stays
}

TEST(StripeDir, FilesOfOthersKeepIt) {
  const fs::path model = "/models/tiny";
  const fs::path d = stripe_dir("foreign", model.string());
  fs::remove(d / "experts" / "L000" / "E000.bin");
  testing::write_file(d / "notes.txt", "the user's");
  EXPECT_FALSE(remove_emptied_stripe_dir(d, model));
  EXPECT_TRUE(fs::exists(d / "notes.txt"));
  EXPECT_TRUE(fs::exists(d / kStripeMarker));
  EXPECT_FALSE(fs::exists(d / "experts"));  // its own emptied layout went

  const fs::path unmarked = testing::temp_dir("unmarked") / "tiny";
  fs::create_directories(unmarked / "experts");
  EXPECT_EQ(stripe_owner(unmarked), "");
  EXPECT_FALSE(remove_emptied_stripe_dir(unmarked, model));
  EXPECT_TRUE(fs::exists(unmarked / "experts"));
}

TEST(ShortenedName, KeepsShortNamesAndCutsLongOnesToTheirLimitWithAHash) {
  EXPECT_EQ(shortened_name("mixtral", 200), "mixtral");
  const std::string a(250, 'a');
  const std::string cut = shortened_name(a, 200);
  EXPECT_EQ(cut.size(), 200u);
  EXPECT_EQ(cut.substr(0, 191), std::string(191, 'a'));
  EXPECT_EQ(cut[191], '~');
  // Two long names that share their first 191 bytes stay apart.
  EXPECT_NE(cut, shortened_name(std::string(249, 'a') + "b", 200));
  // Never inside a UTF-8 character: "é" is 2 bytes, so a cut at an odd byte backs up one.
  std::string accents;
  for (int i = 0; i < 150; ++i) accents += "\xc3\xa9";
  const std::string u = shortened_name(accents, 200);
  EXPECT_LE(u.size(), 200u);
  const auto tilde = u.find('~');
  ASSERT_NE(tilde, std::string::npos);
  EXPECT_EQ(tilde % 2, 0u) << "cut inside a character";
  EXPECT_EQ(u.substr(0, tilde), accents.substr(0, tilde));
}

TEST(ModelLock, ASecondHolderIsRefusedUntilTheFirstLetsGo) {
  const auto dir = fs::temp_directory_path() / ("colibri-lock-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    auto first = ModelLock::acquire(dir);
    ASSERT_TRUE(first) << first.error().message();
    auto second = ModelLock::acquire(dir);  // another open file description: flock refuses it as another process's
    ASSERT_FALSE(second);
    EXPECT_NE(second.error().message().find(dir.string() + " is being changed by another colibri command"),
              std::string::npos)
        << second.error().message();
  }
  EXPECT_TRUE(ModelLock::acquire(dir));  // released with the first
  EXPECT_FALSE(ModelLock::acquire(dir / "missing"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace colibri::model
