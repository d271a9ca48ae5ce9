#pragma once
// Resource limits a test lowers for a while, to see what the code under test says when the OS refuses.
#include <sys/resource.h>
#include <unistd.h>

namespace colibri::sdk::testing {

// Sets the open-file limit to the lowest free descriptor number, so that the next open() fails with EMFILE (every
// number below it is taken), and puts the old limit back when destroyed.
class NoFreeDescriptors {
 public:
  NoFreeDescriptors() {
    if (::getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    const int lowest_free = ::dup(0);
    if (lowest_free < 0) return;
    ::close(lowest_free);
    rlimit tight = saved_;
    tight.rlim_cur = static_cast<rlim_t>(lowest_free);
    active_ = ::setrlimit(RLIMIT_NOFILE, &tight) == 0;
  }
  ~NoFreeDescriptors() { restore(); }
  NoFreeDescriptors(const NoFreeDescriptors&) = delete;
  NoFreeDescriptors& operator=(const NoFreeDescriptors&) = delete;

  // False when the limit could not be lowered (the test should fail rather than pass vacuously).
  [[nodiscard]] bool active() const noexcept { return active_; }
  // Puts the old limit back now (before assertions that open files).
  void restore() noexcept {
    if (active_) ::setrlimit(RLIMIT_NOFILE, &saved_);
    active_ = false;
  }

 private:
  rlimit saved_{};
  bool active_ = false;
};

}  // namespace colibri::sdk::testing
