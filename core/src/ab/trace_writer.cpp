#include "colibri/ab/trace_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "colibri/sdk/os_error.hpp"

namespace colibri::ab {

using sdk::Status;
using sdk::StatusCode;

sdk::Expected<std::unique_ptr<TraceWriter>> TraceWriter::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status(StatusCode::io_error,
                  "cannot write the routing trace " + path.string() + ": " + sdk::os_error_text(errno));
  }
  return std::unique_ptr<TraceWriter>(new TraceWriter(path, fd));
}

TraceWriter::~TraceWriter() {
  if (fd_ < 0) return;
  (void)sync();
  ::close(fd_);
}

Status TraceWriter::append(std::span<const TraceRecord> records) {
  if (records.empty()) return {};
  std::string lines;
  for (const auto& r : records) {
    lines += to_jsonl(r);
    lines += '\n';
  }
  std::lock_guard lock(mu_);
  if (failed_) return {};
  std::size_t done = 0;
  while (done < lines.size()) {
    const auto n = ::write(fd_, lines.data() + done, lines.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? sdk::os_error_text(errno) : "nothing written";
      failed_ = true;
      // Whole lines only: cut back what this batch wrote.
      if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0) (void)::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
      return Status(StatusCode::io_error, "writing the routing trace " + path_.string() + " failed (" + why +
                                              "); it stops here with " + std::to_string(records_) + " records");
    }
    done += static_cast<std::size_t>(n);
  }
  size_ += lines.size();
  records_ += records.size();
  return {};
}

Status TraceWriter::sync() {
  std::lock_guard lock(mu_);
  if (::fdatasync(fd_) != 0) {
    return Status(StatusCode::io_error,
                  "syncing the routing trace " + path_.string() + ": " + sdk::os_error_text(errno));
  }
  return {};
}

}  // namespace colibri::ab
