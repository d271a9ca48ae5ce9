// Optional storage interfaces reached with Storage::query_interface(id). A plugin that offers one
// returns a pointer to it (owned by the Storage, valid while the Storage lives) and, for views and
// registered buffers, says so in StorageCapabilities; a plugin that does not returns nullptr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "colibri/sdk/storage.hpp"

namespace colibri::sdk {

// ---- "colibri.storage.view.v1": zero-copy views into mapped files (capabilities().zero_copy) ----
inline constexpr std::string_view kStorageViewInterface = "colibri.storage.view.v1";

// Read-only bytes of a file range. The view keeps its mapping valid while it is alive, even after
// the StorageFile (or the Storage) that produced it is destroyed. Touching a view of a file that
// another process truncates afterwards is undefined (the kernel raises SIGBUS); read() checks the
// size first and is the safe path for files that may change.
class StorageView {
 public:
  virtual ~StorageView() = default;
  [[nodiscard]] virtual std::span<const std::byte> bytes() const noexcept = 0;
};

class StorageViews {
 public:
  // A view of [offset, offset + length) of `file`; corrupt_data when the file is shorter now.
  virtual Expected<std::unique_ptr<StorageView>> view(StorageFile& file, std::uint64_t offset,
                                                      std::uint64_t length) noexcept = 0;

 protected:
  ~StorageViews() = default;
};

// ---- "colibri.storage.registered_buffers.v1": fixed buffers (capabilities().registered_buffers) ----
inline constexpr std::string_view kRegisteredBuffersInterface = "colibri.storage.registered_buffers.v1";

// The caller registers the memory its reads land in (typically the expert cache's slot arena) once;
// afterwards every request whose buffer lies entirely inside a registered region is read without
// per-read page pinning, and any other request is read the ordinary way. Regions stay owned by the
// caller and must stay allocated until unregister_buffers() returns or the Storage is destroyed.
class RegisteredBuffers {
 public:
  // Replaces any earlier registration. Waits for in-flight reads first. Fails (and leaves nothing
  // registered) when the kernel refuses, e.g. over RLIMIT_MEMLOCK; reads then still work unregistered.
  virtual Status register_buffers(std::span<const std::span<std::byte>> regions) noexcept = 0;
  // Waits for in-flight reads, then forgets every region.
  virtual void unregister_buffers() noexcept = 0;

 protected:
  ~RegisteredBuffers() = default;
};

// ---- "colibri.storage.buffers.v1": register buffers one at a time (capabilities().registered_buffers) ----
inline constexpr std::string_view kStorageBuffersInterface = "colibri.storage.buffers.v1";

// For callers whose buffers come and go (the expert cache's slots): each buffer is registered when it is
// allocated and unregistered before it is freed, without waiting for reads elsewhere. Reads landing entirely
// inside a registered buffer skip per-read page pinning; every other read works as before. Shares the plugin's
// table with registered_buffers.v1, whose register_buffers() and unregister_buffers() replace these entries too.
class StorageBuffers {
 public:
  // Registers `range`. Idempotent: a range inside one already registered succeeds without a new entry. A failure
  // says why (locked-memory limit, a kernel without the feature, a full table, an overlap with a registered
  // range) and leaves nothing registered; reads into `range` then simply stay unregistered. The memory stays the
  // caller's and must stay allocated until unregister_buffer() of it returns or the Storage is destroyed.
  virtual Status register_buffer(std::span<std::byte> range) noexcept = 0;
  // Forgets the entry registered for exactly `range` (nothing when there is none). No read into it may be in
  // flight.
  virtual void unregister_buffer(std::span<std::byte> range) noexcept = 0;

 protected:
  ~StorageBuffers() = default;
};

// ---- "colibri.storage.cancel.v1": withdraw queued requests that no longer matter ----
inline constexpr std::string_view kStorageCancelInterface = "colibri.storage.cancel.v1";

// A prefetch the caller no longer needs should stop holding a place in the device queue. cancel()
// withdraws every request submitted with `user_tag` that is still waiting in the plugin's queue;
// requests already handed to the OS (or the kernel ring) finish normally. Each withdrawn request
// still gets its callback exactly once, with StatusCode::cancelled: before cancel() returns, or, when
// a request was split into parts and some part had started, once that part finishes. drain() counts
// withdrawn requests like any other. Returns whether it withdrew anything. Callable from any thread
// except a callback of the request being cancelled.
class StorageCancel {
 public:
  virtual bool cancel(std::uint64_t user_tag) noexcept = 0;

 protected:
  ~StorageCancel() = default;
};

// ---- "colibri.storage.copies.v1": read one chosen copy of a file kept in several places ----
inline constexpr std::string_view kStorageCopiesInterface = "colibri.storage.copies.v1";

// A storage that keeps copies of a file (stripe's mirrors) serves read() from the first copy that reads; bytes that
// read fine but fail the host's checksum only the host can see. It then reads the other copies through this
// interface, keeps the first whose bytes pass, and says which copy was damaged.
class StorageCopies {
 public:
  // How many copies `file` has (1: no other; copy 0 is the one read() tries first).
  virtual std::size_t copy_count(StorageFile& file) noexcept = 0;
  // Reads [offset, offset + dst.size()) from copy `index` only, synchronously, on the caller's thread.
  virtual Status read_copy(StorageFile& file, std::size_t index, std::uint64_t offset,
                           std::span<std::byte> dst) noexcept = 0;
  // Where copy `index` is (for messages); "" when out of range.
  virtual std::string copy_path(StorageFile& file, std::size_t index) noexcept = 0;

 protected:
  ~StorageCopies() = default;
};

}  // namespace colibri::sdk
