// Shared by the in-tree storage plugins (header-only, compiled into each plugin; plugins link
// only the SDK): POSIX files with a buffered and an O_DIRECT descriptor, exact positional reads
// with precise errors, and a worker queue that serves demand reads before prefetch reads.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "colibri/sdk/sdk.hpp"

namespace colibri::plugins::storage_common {

using namespace colibri::sdk;

inline constexpr std::size_t kDirectAlignment = 4096;

// Errors the same call may get past later: EMFILE/ENFILE too, since descriptors come back as connections and other
// reads close theirs.
inline bool transient(int err) {
  return err == EINTR || err == EAGAIN || err == ETIMEDOUT || err == ENOMEM || err == EMFILE || err == ENFILE;
}

inline bool direct_compatible(std::uint64_t offset, std::size_t length, const void* buffer) {
  return offset % kDirectAlignment == 0 && length % kDirectAlignment == 0 &&
         reinterpret_cast<std::uintptr_t>(buffer) % kDirectAlignment == 0;
}

class PosixFile : public StorageFile {
 public:
  PosixFile(std::string path, int buffered_fd, int direct_fd, std::uint64_t size)
      : path_(std::move(path)), buffered_fd_(buffered_fd), direct_fd_(direct_fd), size_(size) {}
  ~PosixFile() override {
    if (direct_fd_ >= 0) ::close(direct_fd_);
    if (buffered_fd_ >= 0) ::close(buffered_fd_);
  }
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

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

// Opens `path` read-only (regular files only), plus an O_DIRECT descriptor when `want_direct` and
// the filesystem allows it. `warned` makes the "refuses O_DIRECT" note appear once per Storage.
template <typename File = PosixFile>
Expected<std::unique_ptr<File>> open_posix(const std::string& path, bool want_direct, HostServices& host,
                                           std::atomic<bool>& warned) noexcept {
  // O_NONBLOCK: a FIFO put where an expert file was would block open() until a writer came, hanging the engine
  // (and a server's shutdown); it is refused below instead. It changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? StatusCode::not_found : StatusCode::io_error,
                  "cannot open " + path + ": " + os_error_text(err), transient(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(StatusCode::invalid_argument, path + " is " + file_kind_text(st.st_mode) + ", not a file");
  }
  int dfd = -1;
  if (want_direct) {
    dfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
    if (dfd < 0 && !warned.exchange(true)) {
      host.info("the filesystem of " + path + " refuses O_DIRECT (" + os_error_text(errno) +
                "); reading through the page cache instead");
    }
  }
  try {
    return std::make_unique<File>(path, fd, dfd, static_cast<std::uint64_t>(st.st_size));
  } catch (...) {
    if (dfd >= 0) ::close(dfd);
    ::close(fd);
    return Status(StatusCode::out_of_memory, "opening " + path);
  }
}

inline Status range_error(const StorageFile& f, std::uint64_t offset, std::uint64_t length) {
  return Status(StatusCode::corrupt_data, f.path() + " is " + std::to_string(f.size()) + " bytes; cannot read " +
                                              std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                                              " (truncated file?)");
}

inline bool in_range(const StorageFile& f, std::uint64_t offset, std::uint64_t length) {
  return offset <= f.size() && length <= f.size() - offset;
}

// Reads exactly dst.size() bytes from fd at offset (EINTR and partial reads continue).
inline Status pread_exact(int fd, const std::string& path, std::uint64_t offset, std::span<std::byte> dst) noexcept {
  std::size_t done = 0;
  while (done < dst.size()) {
    const ssize_t r = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      return Status(StatusCode::io_error,
                    "reading " + std::to_string(dst.size()) + " bytes at offset " + std::to_string(offset) + " of " +
                        path + ": " + os_error_text(err),
                    transient(err));
    }
    if (r == 0) {
      return Status(StatusCode::corrupt_data, path + " ended after " + std::to_string(offset + done) +
                                                  " bytes while reading " + std::to_string(dst.size()) +
                                                  " bytes at offset " + std::to_string(offset) + " (truncated file?)");
    }
    done += static_cast<std::size_t>(r);
  }
  return {};
}

// Range check, then O_DIRECT for aligned requests and buffered reads otherwise. A filesystem that
// accepted O_DIRECT at open but rejects the read (EINVAL) is retried buffered.
inline Status read_posix(PosixFile& f, std::uint64_t offset, std::span<std::byte> dst) noexcept {
  if (!in_range(f, offset, dst.size())) return range_error(f, offset, dst.size());
  if (f.direct_io() && direct_compatible(offset, dst.size(), dst.data())) {
    Status st = pread_exact(f.direct_fd(), f.path(), offset, dst);
    if (st || st.message().find(os_error_text(EINVAL)) == std::string::npos) return st;
  }
  return pread_exact(f.buffered_fd(), f.path(), offset, dst);
}

inline Status check_request(const ReadRequest& r) {
  if (r.file == nullptr || (r.buffer == nullptr && r.length > 0)) {
    return Status(StatusCode::invalid_argument, "read request without a file or buffer");
  }
  return {};
}

// The `chunk_kib` option shared by the plugins that split reads: bytes, 0 = never split.
inline constexpr std::int64_t kDefaultChunkKib = 2048;
inline Expected<std::uint64_t> chunk_bytes_option(const ConfigView& config) {
  auto kib = config.get_int("chunk_kib", kDefaultChunkKib);
  if (!kib) return kib.error();
  if (*kib < 0 || *kib > (1 << 20) || *kib % 4 != 0) {
    return Status(StatusCode::invalid_argument, "storage.chunk_kib is " + std::to_string(*kib) +
                                                    "; use 0 (never split) or a multiple of 4 up to 1048576");
  }
  return static_cast<std::uint64_t>(*kib) << 10;
}

// Large reads split into chunks read at once: one 20 MiB expert then keeps several requests in the
// device queue instead of one, and lands sooner. How many chunks `r` becomes: up to max_chunks of at
// least chunk_bytes (0: never split); 1 for an invalid request, so it fails exactly as an unsplit read.
inline std::uint64_t chunk_count(const ReadRequest& r, std::uint64_t chunk_bytes, std::uint64_t max_chunks) {
  if (chunk_bytes == 0 || r.length <= chunk_bytes || max_chunks < 2 || !check_request(r) ||
      !in_range(*r.file, r.offset, r.length)) {
    return 1;
  }
  return std::min<std::uint64_t>(max_chunks, (r.length + chunk_bytes - 1) / chunk_bytes);
}

// The chunks of `r`: equal sizes, multiples of the direct-I/O alignment (each stays as aligned as `r`).
// Their callbacks count down; the last calls `done` once, with the whole request and the status of the
// first chunk that failed.
inline std::vector<std::pair<ReadRequest, ReadCallback>> split_request(const ReadRequest& r, ReadCallback done,
                                                                       std::uint64_t chunks) {
  struct Whole {
    ReadRequest request;
    ReadCallback done;
    std::mutex mu;
    std::size_t remaining = 0;
  };
  auto whole = std::make_shared<Whole>();
  whole->request = r;
  whole->request.status = Status();
  whole->done = std::move(done);
  const std::uint64_t per = (r.length / chunks + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  std::vector<std::pair<ReadRequest, ReadCallback>> out;
  for (std::uint64_t at = 0; at < r.length; at += per) {
    ReadRequest c = r;
    c.offset = r.offset + at;
    c.length = std::min(per, r.length - at);
    c.buffer = static_cast<std::byte*>(r.buffer) + at;
    out.emplace_back(c, [whole](ReadRequest& chunk) {
      {
        std::lock_guard lock(whole->mu);
        if (!chunk.status && whole->request.status) whole->request.status = chunk.status;
        if (--whole->remaining != 0) return;
      }
      whole->done(whole->request);
    });
  }
  whole->remaining = out.size();
  return out;
}

// Moves the entries of `q` that `match` into `out`, keeping the order of the rest (cancel() of the
// queueing plugins). An entry that cannot be moved (no memory) stays queued and is read as usual.
template <class T, class Match>
void withdraw_if(std::deque<T>& q, std::vector<T>& out, Match match) noexcept {
  for (auto it = q.begin(); it != q.end();) {
    if (!match(*it)) {
      ++it;
      continue;
    }
    try {
      out.push_back(std::move(*it));
    } catch (...) {
      ++it;
      continue;
    }
    it = q.erase(it);
  }
}

// Worker threads serving submitted requests, demand before prefetch. The executor runs one request
// and returns its status; callbacks run on the worker that read it. With chunk_bytes > 0, long
// requests are split (chunk_count, split_request) over up to one chunk per worker.
class ReadQueue {
 public:
  using Executor = std::function<Status(ReadRequest&)>;

  ReadQueue(int threads, Executor exec, std::uint64_t chunk_bytes = 0)
      : exec_(std::move(exec)), chunk_bytes_(chunk_bytes) {
    workers_.reserve(static_cast<std::size_t>(threads));
    try {
      for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      // The threads already started are joined (a joinable std::thread destroyed would end the process), and the
      // plugin's create() reports the failure.
      stop();
      throw std::runtime_error("cannot start I/O thread " + std::to_string(workers_.size() + 1) + " of " +
                               std::to_string(threads) + ": " + e.what() +
                               " (out of memory or threads: check ulimit -v and -u, or set storage.threads lower)");
    }
  }
  ~ReadQueue() { stop(); }
  ReadQueue(const ReadQueue&) = delete;
  ReadQueue& operator=(const ReadQueue&) = delete;

  Status submit(ReadRequest request, ReadCallback done) noexcept {
    if (!done) return Status(StatusCode::invalid_argument, "submit() needs a completion callback");
    try {
      const std::uint64_t chunks = chunk_count(request, chunk_bytes_, workers_.size());
      std::vector<Job> jobs;
      if (chunks <= 1) {
        jobs.push_back(Job{request, std::move(done)});
      } else {
        for (auto& [c, cb] : split_request(request, std::move(done), chunks)) jobs.push_back(Job{c, std::move(cb)});
      }
      std::lock_guard lock(mu_);
      if (stopping_) return Status(StatusCode::cancelled, "storage is shutting down");
      auto& q = request.priority == ReadPriority::demand ? demand_ : prefetch_;
      for (auto& j : jobs) q.push_back(std::move(j));
      outstanding_ += jobs.size();
    } catch (...) {
      return Status(StatusCode::out_of_memory, "queueing a read");
    }
    cv_.notify_all();
    return {};
  }

  void drain() noexcept {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return outstanding_ == 0; });
  }

  [[nodiscard]] std::size_t threads() const noexcept { return workers_.size(); }

  // How many parts submit() splits `r` into.
  [[nodiscard]] std::uint64_t chunks_for(const ReadRequest& r) const noexcept {
    return chunk_count(r, chunk_bytes_, workers_.size());
  }

  // Whether the calling thread is one of the workers (a callback running): it must not wait for the queue.
  [[nodiscard]] bool on_worker() const noexcept {
    const auto self = std::this_thread::get_id();
    return std::any_of(workers_.begin(), workers_.end(), [&](const std::thread& t) { return t.get_id() == self; });
  }

  // StorageCancel::cancel for this queue: withdraws the waiting jobs tagged `user_tag` and calls them
  // back here, with StatusCode::cancelled.
  bool cancel(std::uint64_t user_tag) noexcept {
    std::vector<Job> withdrawn;
    {
      std::lock_guard lock(mu_);
      for (auto* q : {&demand_, &prefetch_}) {
        withdraw_if(*q, withdrawn, [&](const Job& j) { return j.request.user_tag == user_tag; });
      }
    }
    if (withdrawn.empty()) return false;
    for (auto& job : withdrawn) {
      job.request.status = Status(StatusCode::cancelled, "read cancelled before it started");
      job.done(job.request);
    }
    std::lock_guard lock(mu_);
    outstanding_ -= withdrawn.size();
    if (outstanding_ == 0) idle_cv_.notify_all();
    return true;
  }

 private:
  // Ends the workers (those started, if the constructor failed part-way) and waits for them.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }
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
        auto& q = !demand_.empty() ? demand_ : prefetch_;
        job = std::move(q.front());
        q.pop_front();
      }
      job.request.status = check_request(job.request);
      if (job.request.status) job.request.status = exec_(job.request);
      job.done(job.request);
      {
        std::lock_guard lock(mu_);
        if (--outstanding_ == 0) idle_cv_.notify_all();
      }
    }
  }

  Executor exec_;
  std::uint64_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Job> demand_;
  std::deque<Job> prefetch_;
  std::size_t outstanding_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// A synchronous read on top of an asynchronous submission (`submit(ReadRequest, ReadCallback) -> Status`), so
// read() gets submit()'s splitting and overlap: one demand request, then wait for its callback. Must not be called
// from a thread that completes requests (it would wait for itself).
template <class Submit>
Status read_via_submit(Submit&& submit, StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept {
  struct Latch {
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    Status result;
  } latch;
  ReadRequest r;
  r.file = &file;
  r.offset = offset;
  r.length = dst.size();
  r.buffer = dst.data();
  Status st = submit(r, [&latch](ReadRequest& done) {
    std::lock_guard lock(latch.mu);
    latch.result = done.status;
    latch.finished = true;
    latch.cv.notify_one();
  });
  if (!st) return st;
  std::unique_lock lock(latch.mu);
  latch.cv.wait(lock, [&] { return latch.finished; });
  return latch.result;
}

// read_batch on top of submit(): every request in flight at once, returns when all completed.
inline void batch_via_submit(Storage& storage, std::span<ReadRequest> requests) noexcept {
  std::mutex done_mu;
  std::condition_variable done_cv;
  std::size_t remaining = requests.size();
  for (auto& r : requests) {
    ReadRequest* slot = &r;
    Status st = storage.submit(r, [slot, &done_mu, &done_cv, &remaining](ReadRequest& completed) {
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

}  // namespace colibri::plugins::storage_common
