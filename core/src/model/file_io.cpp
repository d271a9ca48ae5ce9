#include "model/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "colibri/sdk/os_error.hpp"

namespace colibri::model::io {

using sdk::Status;
using sdk::StatusCode;

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

sdk::Expected<File> File::open_read(const fs::path& path) {
  // O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever. Every reader here reads at offsets,
  // which only a regular file has, so anything else is refused by what it is.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    return Status(err == ENOENT ? StatusCode::not_found : StatusCode::io_error,
                  "cannot open " + path_text(path) + ": " + sdk::os_error_text(err));
  }
  File file(fd, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    return Status(StatusCode::io_error, "cannot stat " + path_text(path) + ": " + sdk::os_error_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status(StatusCode::invalid_argument, path_text(path) + " is " + sdk::file_kind_text(st.st_mode) +
                                                    ", not a file colibri can read; give the file itself");
  }
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    int err = errno;
    return Status(StatusCode::io_error, "cannot read " + path_text(path) + ": " + sdk::os_error_text(err));
  }
  return file;
}

sdk::Expected<File> File::create(const fs::path& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    return Status(StatusCode::io_error, "cannot create " + path_text(path) + ": " + sdk::os_error_text(err));
  }
  return File(fd, path);
}

sdk::Expected<std::uint64_t> File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    return Status(StatusCode::io_error, "cannot stat " + path_text(path_) + ": " + sdk::os_error_text(err));
  }
  return static_cast<std::uint64_t>(st.st_size);
}

Status File::read_at(void* dst, std::size_t n, std::uint64_t offset) const {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      return Status(StatusCode::io_error, "reading " + path_text(path_) + ": " + sdk::os_error_text(err),
                    err == EAGAIN);
    }
    if (got == 0) {
      return Status(StatusCode::corrupt_data,
                    path_text(path_) + " ends early (truncated?) at byte " + std::to_string(offset));
    }
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
  return {};
}

Status File::write_all(const void* src, std::size_t n) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t put = ::write(fd_, p, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      return Status(StatusCode::io_error, "writing " + path_text(path_) + ": " + sdk::os_error_text(err), false, true);
    }
    p += put;
    n -= static_cast<std::size_t>(put);
  }
  return {};
}

Status File::sync() {
  if (::fsync(fd_) != 0) {
    int err = errno;
    return Status(StatusCode::io_error, "fsync " + path_text(path_) + ": " + sdk::os_error_text(err), false, true);
  }
  return {};
}

Status File::close() {
  if (fd_ < 0) return {};
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    int err = errno;
    return Status(StatusCode::io_error, "closing " + path_text(path_) + ": " + sdk::os_error_text(err), false, true);
  }
  return {};
}

Status fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return Status(StatusCode::io_error, "cannot open directory " + path_text(dir) + ": " + sdk::os_error_text(err));
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    return Status(StatusCode::io_error, "fsync directory " + path_text(dir) + ": " + sdk::os_error_text(err));
  return {};
}

sdk::Expected<std::uint64_t> hash_file(const fs::path& path, void (*progress)(std::uint64_t, void*),
                                       void* progress_ctx) {
  std::vector<HashRange> none;
  return hash_file_and_ranges(path, none, progress, progress_ctx);
}

sdk::Expected<std::uint64_t> hash_file_and_ranges(const fs::path& path, std::vector<HashRange>& ranges,
                                                  void (*progress)(std::uint64_t, void*), void* progress_ctx) {
  using State = std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)>;
  std::vector<State> range_states;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    range_states.emplace_back(XXH64_createState(), &XXH64_freeState);
    if (!range_states.back()) return Status(StatusCode::out_of_memory, "xxhash state");
    XXH64_reset(range_states.back().get(), 0);
  }
  std::size_t first_open = 0;  // ranges before it end before the current chunk
  auto file = File::open_read(path);
  if (!file) return file.error();
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(), &XXH64_freeState);
  if (!state) return Status(StatusCode::out_of_memory, "xxhash state");
  XXH64_reset(state.get(), 0);
  std::vector<char> buf(4 << 20);
  std::uint64_t offset = 0;
  for (;;) {
    ssize_t got = ::pread(file->fd(), buf.data(), buf.size(), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      return Status(StatusCode::io_error, "reading " + path_text(path) + ": " + sdk::os_error_text(err));
    }
    if (got == 0) break;
    XXH64_update(state.get(), buf.data(), static_cast<std::size_t>(got));
    const std::uint64_t end = offset + static_cast<std::uint64_t>(got);
    for (std::size_t i = first_open; i < ranges.size() && ranges[i].offset < end; ++i) {
      const std::uint64_t from = std::max(ranges[i].offset, offset);
      const std::uint64_t to = std::min(ranges[i].offset + ranges[i].size, end);
      if (from < to)
        XXH64_update(range_states[i].get(), buf.data() + (from - offset), static_cast<std::size_t>(to - from));
      if (ranges[i].offset + ranges[i].size <= end && i == first_open) ++first_open;
    }
    offset = end;
    if (progress) progress(static_cast<std::uint64_t>(got), progress_ctx);
  }
  for (std::size_t i = 0; i < ranges.size(); ++i) ranges[i].hash = XXH64_digest(range_states[i].get());
  return static_cast<std::uint64_t>(XXH64_digest(state.get()));
}

std::string hex64(std::uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<std::size_t>(i)] = digits[v & 0xF];
    v >>= 4;
  }
  return s;
}

bool parse_hex64(const std::string& s, std::uint64_t& out) {
  if (s.size() != 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

sdk::Expected<std::string> read_text(const fs::path& path, std::uint64_t max_bytes) {
  auto f = File::open_read(path);
  if (!f) return f.error();
  auto size = f->size();
  if (!size) return size.error();
  if (*size > max_bytes) {
    return Status(StatusCode::corrupt_data,
                  path_text(path) + " is implausibly large (" + std::to_string(*size) + " bytes)");
  }
  std::string text(*size, '\0');
  if (auto s = f->read_at(text.data(), text.size(), 0); !s) return s;
  return text;
}

}  // namespace colibri::model::io
