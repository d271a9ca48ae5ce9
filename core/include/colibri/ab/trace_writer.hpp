// Appending a routing trace while a long-running process (colibri-server) produces it: every append() writes whole
// JSONL lines with one write() each, so a process stopped at any point (SIGTERM, crash) leaves a file that
// read_trace() accepts, holding every batch appended before.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>

#include "colibri/ab/trace.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::ab {

class TraceWriter {
 public:
  // Creates or truncates `path`; errors name it.
  static sdk::Expected<std::unique_ptr<TraceWriter>> open(const std::filesystem::path& path);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Appends the records as lines. A failed write (disk full) cuts the file back to its last whole line and turns
  // the writer off: the first error is returned, later appends do nothing.
  sdk::Status append(std::span<const TraceRecord> records);
  // Flushes to the disk (fdatasync); called by the destructor too.
  sdk::Status sync();
  [[nodiscard]] std::uint64_t records_written() const { return records_; }
  // A write failed and recording stopped: the file holds the records before it, whole.
  [[nodiscard]] bool failed() const { return failed_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  TraceWriter(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::filesystem::path path_;
  int fd_ = -1;
  bool failed_ = false;
  std::uint64_t size_ = 0, records_ = 0;
  std::mutex mu_;
};

}  // namespace colibri::ab
