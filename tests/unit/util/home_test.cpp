// util::home_dir: $HOME when absolute; without it (a service, `env -i`) the password database's, never /tmp.
#include "colibri/util/home.hpp"

#include <gtest/gtest.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace {

class SavedHome {
 public:
  SavedHome() {
    if (const char* h = std::getenv("HOME")) saved_ = h;
  }
  ~SavedHome() {
    if (saved_) {
      ::setenv("HOME", saved_->c_str(), 1);
    } else {
      ::unsetenv("HOME");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(HomeDir, TheEnvironmentFirstThenThePasswordDatabase) {
  SavedHome keep;
  ::setenv("HOME", "/some/where", 1);
  EXPECT_EQ(colibri::util::home_dir(), "/some/where");
  const passwd* pw = ::getpwuid(::getuid());
  ASSERT_NE(pw, nullptr);
  for (const char* bad : {"", "relative/dir"}) {
    ::setenv("HOME", bad, 1);
    EXPECT_EQ(colibri::util::home_dir(), pw->pw_dir) << "HOME=" << bad;
  }
  ::unsetenv("HOME");
  EXPECT_EQ(colibri::util::home_dir(), pw->pw_dir);
  EXPECT_NE(colibri::util::home_dir(), "/tmp");
}

}  // namespace
