#include "interrupt.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>

#include "colibri/util/output_file.hpp"

namespace colibri::cli::interrupt {
namespace {

std::atomic<bool> g_cooperative{false};
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "read in a signal handler");

void on_signal(int sig) {
  if (sig == SIGINT && g_cooperative.load() && !g_stop.exchange(true)) {
    constexpr char kMessage[] = "\n(interrupted: stopping after this step; Ctrl-C again to quit at once)\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    return;
  }
  util::remove_partial_files_signal_safe();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // the terminal closed
  // Past `ulimit -f` a write fails (EFBIG), so the command's own error path cleans up, instead of a core dump.
  std::signal(SIGXFSZ, SIG_IGN);
}

bool stop_requested() {
  return g_stop.load();
}

Interruptible::Interruptible() {
  g_stop.store(false);
  g_cooperative.store(true);
}

Interruptible::~Interruptible() {
  g_cooperative.store(false);
}

}  // namespace colibri::cli::interrupt
