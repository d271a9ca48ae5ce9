// storage/mmap: maps each file once at open. read() copies from the mapping after an
// madvise(MADV_WILLNEED) of the range, so the kernel reads the whole range ahead instead of
// faulting page by page; zero-copy views ("colibri.storage.view.v1") hand out the mapped bytes
// themselves and keep the mapping alive. Reads go through the page cache (no direct I/O).
//
// SIGBUS safety: touching a mapped page past the current end of a file raises SIGBUS. read() never
// touches the mapping from user space: the kernel copies out of it (process_vm_readv on this
// process), so a page past the end, a truncation racing with the copy included, fails the call
// (EFAULT) and the read reports the truncated file as corrupt_data. Where that call is not allowed
// (a seccomp filter), the rest is read with pread() from the same page cache, equally safe.
#include <sys/mman.h>
#include <sys/uio.h>

#include <atomic>

#include "colibri/sdk/storage_view.hpp"
#include "posix_read.hpp"

namespace {

using namespace colibri::sdk;
namespace sc = colibri::plugins::storage_common;

// One mapping of a whole file; shared by its file object and every view of it.
struct Mapping {
  Mapping(void* a, std::size_t l) : addr(a), length(l) {}
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, length);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const std::byte* bytes() const { return static_cast<const std::byte*>(addr); }
  void* addr;
  std::size_t length;
};

class MmapFile final : public StorageFile {
 public:
  MmapFile(std::string path, int fd, std::uint64_t size, std::shared_ptr<Mapping> map)
      : path_(std::move(path)), fd_(fd), size_(size), map_(std::move(map)) {}
  ~MmapFile() override { ::close(fd_); }
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;

  std::uint64_t size() const noexcept override { return size_; }
  const std::string& path() const noexcept override { return path_; }
  bool direct_io() const noexcept override { return false; }
  int fd() const noexcept { return fd_; }
  const std::shared_ptr<Mapping>& mapping() const noexcept { return map_; }

  // The file's size now: a file truncated after mapping must not be touched past its end.
  Status check_current(std::uint64_t offset, std::uint64_t length) const noexcept {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      return Status(StatusCode::io_error, "fstat " + path_ + ": " + os_error_text(err), sc::transient(err));
    }
    const auto now = static_cast<std::uint64_t>(st.st_size);
    if (offset > now || length > now - offset) {
      return Status(StatusCode::corrupt_data, path_ + " is " + std::to_string(now) + " bytes now (" +
                                                  std::to_string(size_) + " when opened); cannot read " +
                                                  std::to_string(length) + " bytes at offset " +
                                                  std::to_string(offset) + " (truncated file?)");
    }
    return {};
  }

 private:
  std::string path_;
  int fd_;
  std::uint64_t size_;
  std::shared_ptr<Mapping> map_;
};

class MmapView final : public StorageView {
 public:
  MmapView(std::shared_ptr<Mapping> map, std::span<const std::byte> bytes) : map_(std::move(map)), bytes_(bytes) {}
  std::span<const std::byte> bytes() const noexcept override { return bytes_; }

 private:
  std::shared_ptr<Mapping> map_;
  std::span<const std::byte> bytes_;
};

// pread()s dst[done..] from `offset + done`. 0, or the errno (EFAULT when the file ends early, as for a page past
// its end).
int pread_rest(int fd, std::uint64_t offset, std::span<std::byte> dst, std::size_t done) noexcept {
  while (done < dst.size()) {
    const ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return EFAULT;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

// Copies `dst.size()` bytes from `src` (in the mapping of `fd` at `offset`) without a user-space touch of the
// mapping. 0, or the errno of the failure (EFAULT: a page past the file's end).
int copy_out_of_mapping(int fd, const std::byte* src, std::uint64_t offset, std::span<std::byte> dst) noexcept {
  static std::atomic<bool> vm_readv_refused{false};  // seccomp (some container runtimes) or no such call
  std::size_t done = 0;
  while (done < dst.size() && !vm_readv_refused.load(std::memory_order_relaxed)) {
    iovec local{dst.data() + done, dst.size() - done};
    iovec remote{const_cast<std::byte*>(src + done), dst.size() - done};
    const ssize_t n = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return EFAULT;
    } else if (errno == ENOSYS || errno == EPERM) {
      vm_readv_refused.store(true, std::memory_order_relaxed);
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return pread_rest(fd, offset, dst, done);
}

std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

class MmapStorage final : public StorageBase, public StorageViews, public StorageCancel {
 public:
  static Expected<std::unique_ptr<MmapStorage>> create(const CreateContext& ctx) {
    const ConfigView& c = *ctx.config;
    auto depth = c.get_int("queue_depth", 32);
    if (!depth) return depth.error();
    auto threads = c.get_int("threads", 0);
    if (!threads) return threads.error();
    if (*threads < 0 || *threads > 256) {
      return Status(StatusCode::invalid_argument, "storage.threads must be 0 (auto) or 1..256");
    }
    auto advice_name = c.get_string("advice", "sequential");
    if (!advice_name) return advice_name.error();
    int advice = MADV_NORMAL;
    if (*advice_name == "sequential") {
      advice = MADV_SEQUENTIAL;
    } else if (*advice_name == "random") {
      advice = MADV_RANDOM;
    } else if (*advice_name != "normal") {
      return Status(StatusCode::invalid_argument,
                    "storage.advice is '" + *advice_name + "'; use sequential, random or normal");
    }
    auto willneed = c.get_bool("willneed", true);
    if (!willneed) return willneed.error();
    // Page faults block their thread, so parallelism comes from threads, as with pread.
    const int n = *threads > 0 ? static_cast<int>(*threads) : static_cast<int>(std::clamp<std::int64_t>(*depth, 1, 8));
    return std::make_unique<MmapStorage>(*ctx.host, n, advice, *willneed);
  }

  MmapStorage(HostServices& host, int threads, int advice, bool willneed)
      : host_(host),
        advice_(advice),
        willneed_(willneed),
        queue_(threads, [this](ReadRequest& r) { return read_request(r); }) {}

  void* query_interface(std::string_view id) noexcept override {
    if (id == kStorageViewInterface) return static_cast<StorageViews*>(this);
    if (id == kStorageCancelInterface) return static_cast<StorageCancel*>(this);
    return nullptr;
  }

  Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block: refused below
    if (fd < 0) {
      const int err = errno;
      return Status(err == ENOENT ? StatusCode::not_found : StatusCode::io_error,
                    "cannot open " + path + ": " + os_error_text(err), sc::transient(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status(StatusCode::invalid_argument, path + " is " + file_kind_text(st.st_mode) + ", not a file");
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    void* addr = nullptr;
    if (size > 0) {
      addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (addr == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return Status(StatusCode::io_error,
                      "cannot map " + path + " (" + std::to_string(size) + " bytes): " + os_error_text(err),
                      sc::transient(err));
      }
      if (advice_ != MADV_NORMAL) ::madvise(addr, size, advice_);  // a hint: failure changes nothing
    }
    try {
      auto map = std::make_shared<Mapping>(addr, size);
      addr = nullptr;  // owned by map now
      return std::unique_ptr<StorageFile>(new MmapFile(path, fd, size, std::move(map)));
    } catch (...) {
      if (addr != nullptr) ::munmap(addr, size);
      ::close(fd);
      return Status(StatusCode::out_of_memory, "opening " + path);
    }
  }

  Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    auto& f = static_cast<MmapFile&>(file);
    if (!sc::in_range(f, offset, dst.size())) return sc::range_error(f, offset, dst.size());
    if (dst.empty()) return {};
    if (Status st = f.check_current(offset, dst.size()); !st) return st;
    const std::byte* src = f.mapping()->bytes() + offset;
    if (willneed_) {
      const std::uintptr_t page = page_size();
      const auto start = reinterpret_cast<std::uintptr_t>(src) / page * page;
      const auto end = reinterpret_cast<std::uintptr_t>(src) + dst.size();
      ::madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);
    }
    if (int err = copy_out_of_mapping(f.fd(), src, offset, dst); err != 0) {
      // Truncated while it was copied: the size check says so with the size it has now.
      if (Status st = f.check_current(offset, dst.size()); !st) return st;
      // Not shorter: a page the kernel could not read (an I/O error) fails the copy with EFAULT too; pread gives the
      // real error, or the bytes (the file grew back meanwhile).
      if (err == EFAULT) err = pread_rest(f.fd(), offset, dst, 0);
      if (err == 0) {
        host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
        return {};
      }
      return Status(err == EFAULT ? StatusCode::corrupt_data : StatusCode::io_error,
                    "reading " + f.path() + " at offset " + std::to_string(offset) + ": " + os_error_text(err) +
                        (err == EFAULT ? " (the file changed while it was read?)" : ""),
                    sc::transient(err));
    }
    host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
    return {};
  }

  Expected<std::unique_ptr<StorageView>> view(StorageFile& file, std::uint64_t offset,
                                              std::uint64_t length) noexcept override {
    auto& f = static_cast<MmapFile&>(file);
    if (!sc::in_range(f, offset, length)) return sc::range_error(f, offset, length);
    if (Status st = f.check_current(offset, length); !st) return st;
    try {
      const std::byte* base = length == 0 ? nullptr : f.mapping()->bytes() + offset;
      return std::unique_ptr<StorageView>(
          new MmapView(f.mapping(), std::span<const std::byte>(base, static_cast<std::size_t>(length))));
    } catch (...) {
      return Status(StatusCode::out_of_memory, "creating a view of " + f.path());
    }
  }

  void read_batch(std::span<ReadRequest> requests) noexcept override { sc::batch_via_submit(*this, requests); }
  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    return queue_.submit(request, std::move(done));
  }
  void drain() noexcept override { queue_.drain(); }
  bool cancel(std::uint64_t user_tag) noexcept override { return queue_.cancel(user_tag); }

  StorageCapabilities capabilities() const noexcept override {
    StorageCapabilities c;
    c.direct_io = false;
    c.async = true;
    c.zero_copy = true;
    c.queue_depth = static_cast<std::uint32_t>(queue_.threads());
    c.alignment = 1;
    return c;
  }

 private:
  HostServices& host_;
  int advice_;
  bool willneed_;
  sc::ReadQueue queue_;
};

Score score(const HostInfo&) noexcept {
  return {50, "memory-mapped reads through the page cache; zero-copy views, no direct I/O"};
}

const OptionSpec kOptions[] = {
    {"threads", OptionType::integer, "0", "threads serving submitted reads (0: queue_depth, at most 8)"},
    {"advice", OptionType::string, "sequential", "madvise for each mapping: sequential, random or normal"},
    {"willneed", OptionType::boolean, "true", "madvise(MADV_WILLNEED) each range before copying it"},
};
const char* const kCapabilities[] = {"async", "priorities", "zero_copy"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::storage,
    "mmap",
    "1.0.0",
    "memory-mapped files with madvise hints and zero-copy views",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<MmapStorage>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
