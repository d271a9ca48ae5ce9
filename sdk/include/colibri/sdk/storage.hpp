// storage kind: open files and read byte ranges into caller-owned, aligned buffers.
// A plugin implements open() and read(); batch and asynchronous submission have correct defaults
// in StorageBase (async = sync + callback), which io_uring or stripe override.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "colibri/sdk/plugin.hpp"

namespace colibri::sdk {

// Probed at run time (the filesystem may refuse O_DIRECT, the kernel may lack io_uring).
struct StorageCapabilities {
  bool direct_io = false;           // reads bypass the page cache
  bool async = false;               // submit() overlaps requests instead of running them inline
  bool registered_buffers = false;  // fixed buffers avoid per-read page pinning
  bool zero_copy = false;           // exposes views into mapped files (interface "colibri.storage.view.v1")
  std::uint32_t queue_depth = 1;    // requests in flight at once
  std::size_t alignment = 1;        // offset, length and buffer alignment that reads require
};

class StorageFile {
 public:
  virtual ~StorageFile() = default;
  [[nodiscard]] virtual std::uint64_t size() const noexcept = 0;
  [[nodiscard]] virtual const std::string& path() const noexcept = 0;
  // Whether reads of this file bypass the page cache (the filesystem may have refused O_DIRECT).
  [[nodiscard]] virtual bool direct_io() const noexcept = 0;
};

enum class ReadPriority : std::uint8_t { demand = 0, prefetch = 1 };

struct ReadRequest {
  StorageFile* file = nullptr;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  void* buffer = nullptr;  // caller-owned; aligned to capabilities().alignment for direct I/O
  ReadPriority priority = ReadPriority::demand;
  std::uint64_t user_tag = 0;
  Status status;  // filled in on completion
};

// Called once per submitted request, on a storage thread or inline; must not throw.
using ReadCallback = std::function<void(ReadRequest& completed)>;

class Storage : public PluginObject {
 public:
  // A file must not outlive the Storage that opened it.
  virtual Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept = 0;

  // Reads exactly dst.size() bytes at offset. A short read (file truncated) is corrupt_data;
  // OS errors are io_error with retryable() set for transient ones.
  virtual Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept = 0;

  // Completes every request (each gets its own status). Returns when all are done.
  virtual void read_batch(std::span<ReadRequest> requests) noexcept = 0;

  // Queues one request; `done` runs when it completes. Returns an error only if the request could
  // not be queued (then `done` is never called).
  virtual Status submit(ReadRequest request, ReadCallback done) noexcept = 0;

  // Blocks until every request submitted so far has completed and its callback has returned.
  virtual void drain() noexcept = 0;

  [[nodiscard]] virtual StorageCapabilities capabilities() const noexcept = 0;
};

// Defaults that are correct for any synchronous implementation: read_batch loops over read(),
// submit() reads inline and then calls back, drain() has nothing to wait for.
class StorageBase : public Storage {
 public:
  void read_batch(std::span<ReadRequest> requests) noexcept override {
    for (auto& r : requests) r.status = read_request(r);
  }

  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    if (!done) return Status(StatusCode::invalid_argument, "submit() needs a completion callback");
    request.status = read_request(request);
    done(request);
    return {};
  }

  void drain() noexcept override {}

 protected:
  Status read_request(const ReadRequest& r) noexcept {
    if (r.file == nullptr || (r.buffer == nullptr && r.length > 0)) {
      return Status(StatusCode::invalid_argument, "read request without a file or buffer");
    }
    return read(*r.file, r.offset, std::span<std::byte>(static_cast<std::byte*>(r.buffer), r.length));
  }
};

}  // namespace colibri::sdk
