// storage/pread: positional reads from a thread pool. O_DIRECT into aligned buffers when the
// profile asks and the filesystem allows it; unaligned requests and filesystems that refuse
// O_DIRECT (tmpfs, some FUSE mounts) use a buffered descriptor of the same file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "colibri/sdk/sdk.hpp"

namespace {

using namespace colibri::sdk;

constexpr std::size_t kDirectAlignment = 4096;

std::string errno_text(int err) { return std::strerror(err); }

bool transient(int err) { return err == EINTR || err == EAGAIN || err == ETIMEDOUT || err == ENOMEM; }

class PreadFile final : public StorageFile {
 public:
  PreadFile(std::string path, int buffered_fd, int direct_fd, std::uint64_t size)
      : path_(std::move(path)), buffered_fd_(buffered_fd), direct_fd_(direct_fd), size_(size) {}
  ~PreadFile() override {
    if (direct_fd_ >= 0) ::close(direct_fd_);
    ::close(buffered_fd_);
  }
  std::uint64_t size() const noexcept override { return size_; }
  const std::string& path() const noexcept override { return path_; }
  bool direct_io() const noexcept override { return direct_fd_ >= 0; }
  int buffered_fd() const noexcept { return buffered_fd_; }
  int direct_fd() const noexcept { return direct_fd_; }

 private:
  std::string path_;
  int buffered_fd_;
  int direct_fd_;
  std::uint64_t size_;
};

class PreadStorage final : public StorageBase {
 public:
  static Expected<std::unique_ptr<PreadStorage>> create(const CreateContext& ctx) {
    auto direct = ctx.config->get_bool("direct_io", true);
    if (!direct) return direct.error();
    auto depth = ctx.config->get_int("queue_depth", 32);
    if (!depth) return depth.error();
    auto threads = ctx.config->get_int("threads", 0);
    if (!threads) return threads.error();
    if (*threads < 0 || *threads > 256) {
      return Status(StatusCode::invalid_argument, "storage.threads must be 0 (auto) or 1..256");
    }
    // auto: one thread per outstanding read up to 8; NVMe needs depth, but threads cost memory.
    const int n = *threads > 0 ? static_cast<int>(*threads) : static_cast<int>(std::clamp<std::int64_t>(*depth, 1, 8));
    return std::make_unique<PreadStorage>(*ctx.host, *direct, n);
  }

  PreadStorage(HostServices& host, bool direct, int threads) : host_(host), direct_(direct) {
    workers_.reserve(static_cast<std::size_t>(threads));
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }

  ~PreadStorage() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      return Status(err == ENOENT ? StatusCode::not_found : StatusCode::io_error,
                    "cannot open " + path + ": " + errno_text(err), transient(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status(StatusCode::invalid_argument, path + " is not a regular file");
    }
    int dfd = -1;
    if (direct_) {
      dfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (dfd < 0) {
        std::lock_guard lock(mu_);
        if (!warned_direct_) {
          warned_direct_ = true;
          host_.info("the filesystem of " + path + " refuses O_DIRECT (" + errno_text(errno) +
                     "); reading through the page cache instead");
        }
      }
    }
    try {
      return std::unique_ptr<StorageFile>(new PreadFile(path, fd, dfd, static_cast<std::uint64_t>(st.st_size)));
    } catch (...) {
      if (dfd >= 0) ::close(dfd);
      ::close(fd);
      return Status(StatusCode::out_of_memory, "opening " + path);
    }
  }

  Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    auto& f = static_cast<PreadFile&>(file);
    if (offset > f.size() || dst.size() > f.size() - offset) {
      return Status(StatusCode::corrupt_data, f.path() + " is " + std::to_string(f.size()) + " bytes; cannot read " +
                                                  std::to_string(dst.size()) + " bytes at offset " + std::to_string(offset) +
                                                  " (truncated file?)");
    }
    const bool aligned = offset % kDirectAlignment == 0 && dst.size() % kDirectAlignment == 0 &&
                         reinterpret_cast<std::uintptr_t>(dst.data()) % kDirectAlignment == 0;
    const int fd = f.direct_io() && aligned ? f.direct_fd() : f.buffered_fd();
    std::size_t done = 0;
    while (done < dst.size()) {
      const ssize_t r = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        host_.counter_add("read_errors_total", 1);
        return Status(StatusCode::io_error, "reading " + std::to_string(dst.size()) + " bytes at offset " +
                                                std::to_string(offset) + " of " + f.path() + ": " + errno_text(err),
                      transient(err));
      }
      if (r == 0) {
        return Status(StatusCode::corrupt_data, f.path() + " ended after " + std::to_string(offset + done) +
                                                    " bytes while reading " + std::to_string(dst.size()) +
                                                    " bytes at offset " + std::to_string(offset) + " (truncated file?)");
      }
      done += static_cast<std::size_t>(r);
    }
    host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
    return {};
  }

  // Parallel across the pool, then wait for this batch only.
  void read_batch(std::span<ReadRequest> requests) noexcept override {
    std::mutex done_mu;
    std::condition_variable done_cv;
    std::size_t remaining = requests.size();
    for (auto& r : requests) {
      ReadRequest* slot = &r;
      Status st = submit(r, [slot, &done_mu, &done_cv, &remaining](ReadRequest& completed) {
        slot->status = completed.status;
        std::lock_guard lock(done_mu);
        if (--remaining == 0) done_cv.notify_all();
      });
      if (!st) {
        r.status = st;
        std::lock_guard lock(done_mu);
        --remaining;
      }
    }
    std::unique_lock lock(done_mu);
    done_cv.wait(lock, [&] { return remaining == 0; });
  }

  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    if (!done) return Status(StatusCode::invalid_argument, "submit() needs a completion callback");
    try {
      std::lock_guard lock(mu_);
      if (stopping_) return Status(StatusCode::cancelled, "storage is shutting down");
      auto& q = request.priority == ReadPriority::demand ? demand_ : prefetch_;
      q.push_back(Job{request, std::move(done)});
      ++outstanding_;
    } catch (...) {
      return Status(StatusCode::out_of_memory, "queueing a read");
    }
    cv_.notify_one();
    return {};
  }

  void drain() noexcept override {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return outstanding_ == 0; });
  }

  StorageCapabilities capabilities() const noexcept override {
    StorageCapabilities c;
    c.direct_io = direct_;
    c.async = true;
    c.queue_depth = static_cast<std::uint32_t>(workers_.size());
    c.alignment = kDirectAlignment;
    return c;
  }

 private:
  struct Job {
    ReadRequest request;
    ReadCallback done;
  };

  void work() {
    while (true) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !demand_.empty() || !prefetch_.empty(); });
        if (demand_.empty() && prefetch_.empty()) return;  // stopping and nothing left
        auto& q = !demand_.empty() ? demand_ : prefetch_;  // demand reads go first
        job = std::move(q.front());
        q.pop_front();
      }
      job.request.status = read_request(job.request);
      job.done(job.request);
      {
        std::lock_guard lock(mu_);
        if (--outstanding_ == 0) idle_cv_.notify_all();
      }
    }
  }

  HostServices& host_;
  bool direct_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Job> demand_;
  std::deque<Job> prefetch_;
  std::size_t outstanding_ = 0;
  bool stopping_ = false;
  bool warned_direct_ = false;
  std::vector<std::thread> workers_;
};

Score score(const HostInfo&) noexcept { return {100, "positional reads work on every Linux filesystem"}; }

const OptionSpec kOptions[] = {
    {"threads", OptionType::integer, "0", "reader threads (0: queue_depth, at most 8)"},
};
const char* const kCapabilities[] = {"direct_io", "async", "priorities"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::storage,
    "pread",
    "1.0.0",
    "positional reads from a thread pool, O_DIRECT when possible",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<PreadStorage>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
