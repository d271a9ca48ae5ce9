// A file a command writes for the user (logits, traces, reports): a failure part-way never leaves half of it, and
// never touches what the path held before. Bytes go to PATH.partial next to the file and a rename puts them in
// place at commit(), after an fsync. PATH.partial is made afresh (O_EXCL, O_NOFOLLOW): whatever held that name before,
// a link planted there included, is removed, never written through. A path naming a device or a FIFO (a pipe), or any
// path under /dev or /proc
// (/dev/stdout), is written directly, as the shell's `>` would; a symlink is followed, so the file it points to is
// replaced and the link stays.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "colibri/sdk/status.hpp"

namespace colibri::util {

class OutputFile {
 public:
  // Errors name the path and the system's reason.
  static sdk::Expected<OutputFile> open(const std::filesystem::path& path);
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  ~OutputFile();  // without a successful commit(): the .partial file is removed

  [[nodiscard]] std::ostream& stream() { return *out_; }
  // Flushes, closes and renames into place; an error leaves the old file as it was.
  sdk::Status commit();
  // The errno of the first write that failed (0: none), kept for the message: errno itself changes before it is read.
  [[nodiscard]] int write_errno() const;
  // Where the bytes go until commit() (the path itself for a device or a FIFO).
  [[nodiscard]] const std::filesystem::path& writing_to() const { return partial_; }

 private:
  OutputFile() = default;
  std::filesystem::path target_, partial_;
  int registered_ = -1;                  // its slot in the list remove_partial_files_signal_safe() reads
  int fd_ = -1;                          // the open file, owned by buf_
  std::unique_ptr<std::streambuf> buf_;  // writes to fd_ (a stream opened by name could follow a link)
  std::unique_ptr<std::ostream> out_;
  bool direct_ = false, committed_ = false;
};

// Removes the .partial file of every OutputFile of this process not yet committed or destroyed, and every file a
// RemovedOnSignal lists. Async-signal-safe (it only reads a fixed table and makes system calls): for a handler of a
// signal that ends the process (Ctrl-C).
void remove_partial_files_signal_safe() noexcept;

// Lists a scratch file (iobench's test file), or a directory with all it holds (convert's hidden partial model), for
// remove_partial_files_signal_safe() while it lives; removing it otherwise is the owner's.
class RemovedOnSignal {
 public:
  enum class Removal { file, tree };
  explicit RemovedOnSignal(const std::filesystem::path& path, Removal removal = Removal::file);
  ~RemovedOnSignal();
  RemovedOnSignal(const RemovedOnSignal&) = delete;
  RemovedOnSignal& operator=(const RemovedOnSignal&) = delete;

 private:
  int registered_ = -1;
};

// open(), body, commit(): body returns false when it failed (its stream's state is checked too).
sdk::Status write_file_atomically(const std::filesystem::path& path, const std::function<bool(std::ostream&)>& body);

}  // namespace colibri::util
