// Ctrl-C for colibri-cli. By default SIGINT, SIGTERM and SIGHUP remove the .partial files of outputs being written
// and what util::RemovedOnSignal lists (convert's hidden partial model), and end the process as the signal would.
// Around work that can stop cleanly (a generation, a perplexity run, a conversion), a command calls Interruptible:
// the first Ctrl-C then only sets stop_requested(), so the command prints its statistics and saves the usage history;
// a second one ends the process at once.
#pragma once

namespace colibri::cli::interrupt {

void install();
[[nodiscard]] bool stop_requested();

class Interruptible {
 public:
  Interruptible();
  ~Interruptible();
  Interruptible(const Interruptible&) = delete;
  Interruptible& operator=(const Interruptible&) = delete;
};

}  // namespace colibri::cli::interrupt
