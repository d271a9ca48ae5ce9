// Small POSIX file helpers for the model reader/writer: whole-range pread/pwrite with EINTR handling,
// fsync of files and directories, and streaming xxHash64. Errors come back as sdk::Status naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::model::io {

namespace fs = std::filesystem;

// Owns a file descriptor.
class File {
 public:
  File() = default;
  File(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  static sdk::Expected<File> open_read(const fs::path& path);
  // Creates (or truncates) a file for writing.
  static sdk::Expected<File> create(const fs::path& path);

  [[nodiscard]] bool is_open() const noexcept { return fd_ >= 0; }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] const fs::path& path() const noexcept { return path_; }
  [[nodiscard]] sdk::Expected<std::uint64_t> size() const;

  // Reads exactly n bytes at offset; a short file is a corrupt_data error.
  sdk::Status read_at(void* dst, std::size_t n, std::uint64_t offset) const;
  sdk::Status write_all(const void* src, std::size_t n);
  sdk::Status sync();
  sdk::Status close();

 private:
  int fd_ = -1;
  fs::path path_;
};

sdk::Status fsync_directory(const fs::path& dir);

// A whole small file (manifest.json, an index, stripe.pending) as bytes, through File::open_read: a FIFO, directory
// or device is refused by what it is rather than waited on. Larger than max_bytes: corrupt_data, "implausibly large".
sdk::Expected<std::string> read_text(const fs::path& path, std::uint64_t max_bytes = 1ull << 30);

// xxHash64 (seed 0) of a whole file, read in chunks; `progress` (may be null) hears bytes hashed.
sdk::Expected<std::uint64_t> hash_file(const fs::path& path, void (*progress)(std::uint64_t, void*) = nullptr,
                                       void* progress_ctx = nullptr);

// A byte range of a file hashed on the same pass as the whole file (a tensor's bytes).
struct HashRange {
  std::uint64_t offset = 0, size = 0;
  std::uint64_t hash = 0;  // out: xxHash64 (seed 0) of the range; ranges past the file's end hash what exists
};
// hash_file, also hashing each of `ranges` (sorted by offset, not overlapping) from the same reads.
sdk::Expected<std::uint64_t> hash_file_and_ranges(const fs::path& path, std::vector<HashRange>& ranges,
                                                  void (*progress)(std::uint64_t, void*) = nullptr,
                                                  void* progress_ctx = nullptr);

std::string hex64(std::uint64_t v);
bool parse_hex64(const std::string& s, std::uint64_t& out);

// Path as UTF-8 text for messages and JSON (std::filesystem keeps bytes on Linux).
inline std::string path_text(const fs::path& p) {
  return p.string();
}

}  // namespace colibri::model::io
