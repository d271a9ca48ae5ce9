// storage/io_uring: one ring per Storage, `queue_depth` reads in flight, one completion thread
// that reaps completions and hands the callbacks to `callback_threads` workers (so the caller's
// work in them, e.g. checksums, overlaps across requests and never delays reaping). Requests
// beyond the depth wait in two queues, demand before prefetch. O_DIRECT for aligned requests where
// the filesystem allows it, buffered otherwise (and when a filesystem rejects a direct read with
// EINVAL).
//
// Registered (fixed) buffers: one sparse table per ring. Through
// query_interface("colibri.storage.buffers.v1") the caller registers each buffer as it allocates
// it (the expert cache's slots); through "colibri.storage.registered_buffers.v1" it registers a
// whole set at once. Every request whose buffer lies inside a registered one is read with
// IORING_OP_READ_FIXED, which skips pinning the pages on each read; other requests are ordinary
// reads. A fixed read the kernel refuses is retried as an ordinary one. Counters
// fixed_reads_total and plain_reads_total count the reads (SQEs) of each kind.
//
// Cancel: through query_interface("colibri.storage.cancel.v1") requests still waiting in the two
// queues are withdrawn; those already on the ring complete.
//
// Threads: submit() may be called from any thread, including from a completion callback.
// Callbacks run on the callback threads (with callback_threads 0: on the completion thread, where
// the next completions wait for them). A request holds its place in the queue depth until its
// callback has returned, so slow callbacks hold back new reads rather than pile up.
#include <liburing.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cstring>

#include "colibri/sdk/storage_view.hpp"
#include "posix_read.hpp"

// An Op travels to the completion thread through the kernel's ring, a handoff ThreadSanitizer
// cannot see; these annotations tell it (and compile to nothing otherwise).
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define COLIBRI_RING_RELEASE(p) __tsan_release(p)
#define COLIBRI_RING_ACQUIRE(p) __tsan_acquire(p)
#else
#define COLIBRI_RING_RELEASE(p) ((void)(p))
#define COLIBRI_RING_ACQUIRE(p) ((void)(p))
#endif

namespace {

using namespace colibri::sdk;
namespace sc = colibri::plugins::storage_common;

constexpr std::uint64_t kMaxChunk = 1ull << 30;  // one SQE reads at most this much (lengths are 32-bit)
constexpr int kMaxTransientRetries = 8;
constexpr unsigned kBufferTableEntries = 1u << 14;  // the kernel's limit (IORING_MAX_REG_BUFFERS)

// One request from submit() to its callback.
struct Op {
  ReadRequest request;
  ReadCallback done;
  std::uint64_t done_bytes = 0;
  bool avoid_direct = false;     // the filesystem rejected a direct read of this request
  bool fixed = false;            // the SQE on the ring reads into a registered buffer
  bool avoid_fixed = false;      // the kernel refused a fixed read of this request
  bool inline_callback = false;  // `done` is trivial (a synchronous read's latch): run it on the completion thread
  int retries = 0;
};

// Threads that run completion callbacks in the order they are posted, each on whichever is free.
class CallbackPool {
 public:
  CallbackPool(int threads, std::function<void(Op*)> run) : run_(std::move(run)) {
    workers_.reserve(static_cast<std::size_t>(threads));
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~CallbackPool() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  CallbackPool(const CallbackPool&) = delete;
  CallbackPool& operator=(const CallbackPool&) = delete;

  [[nodiscard]] bool on_worker() const noexcept {
    const auto self = std::this_thread::get_id();
    return std::any_of(workers_.begin(), workers_.end(), [&](const std::thread& t) { return t.get_id() == self; });
  }

  // False when it could not queue (no memory): the caller runs the callback itself.
  bool post(Op* op) noexcept {
    try {
      std::lock_guard lock(mu_);
      queue_.push_back(op);
    } catch (...) {
      return false;
    }
    cv_.notify_one();
    return true;
  }

 private:
  void work() {
    while (true) {
      Op* op = nullptr;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = queue_.front();
        queue_.pop_front();
      }
      run_(op);
    }
  }

  std::function<void(Op*)> run_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op*> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

class UringStorage final : public StorageBase, public RegisteredBuffers, public StorageBuffers, public StorageCancel {
 public:
  static Expected<std::unique_ptr<UringStorage>> create(const CreateContext& ctx) {
    auto direct = ctx.config->get_bool("direct_io", true);
    if (!direct) return direct.error();
    auto depth = ctx.config->get_int("queue_depth", 32);
    if (!depth) return depth.error();
    if (*depth < 1 || *depth > 4096) {
      return Status(StatusCode::invalid_argument,
                    "storage.queue_depth is " + std::to_string(*depth) + "; io_uring needs 1..4096");
    }
    auto chunk = sc::chunk_bytes_option(*ctx.config);
    if (!chunk) return chunk.error();
    auto callback_threads = ctx.config->get_int("callback_threads", 2);
    if (!callback_threads) return callback_threads.error();
    if (*callback_threads < 0 || *callback_threads > 64) {
      return Status(StatusCode::invalid_argument, "storage.callback_threads is " + std::to_string(*callback_threads) +
                                                      "; use 0 (callbacks on the completion thread) or 1..64");
    }
    auto fixed = ctx.config->get_bool("fixed_buffers", true);
    if (!fixed) return fixed.error();
    auto self = std::make_unique<UringStorage>(*ctx.host, *direct, static_cast<unsigned>(*depth), *chunk, *fixed);
    if (Status st = self->start(static_cast<int>(*callback_threads)); !st) return st;
    return self;
  }

  UringStorage(HostServices& host, bool direct, unsigned depth, std::uint64_t chunk_bytes, bool fixed_buffers)
      : host_(host), direct_(direct), depth_(depth), chunk_bytes_(chunk_bytes), fixed_buffers_(fixed_buffers) {}

  ~UringStorage() override {
    if (!started_) return;
    drain();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      // A no-op without data wakes the completion thread and tells it to leave.
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe != nullptr) {
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, nullptr);
        submit_locked();
      }
    }
    reaper_.join();
    callbacks_.reset();  // idle after drain()
    io_uring_queue_exit(&ring_);
  }

  void* query_interface(std::string_view id) noexcept override {
    if (fixed_buffers_ && id == kRegisteredBuffersInterface) return static_cast<RegisteredBuffers*>(this);
    if (fixed_buffers_ && id == kStorageBuffersInterface) return static_cast<StorageBuffers*>(this);
    if (id == kStorageCancelInterface) return static_cast<StorageCancel*>(this);
    return nullptr;
  }

  Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept override {
    auto f = sc::open_posix(path, direct_, host_, warned_direct_);
    if (!f) return f.error();
    return std::unique_ptr<StorageFile>(std::move(*f));
  }

  Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    auto& f = static_cast<sc::PosixFile&>(file);
    if (!sc::in_range(f, offset, dst.size())) return sc::range_error(f, offset, dst.size());
    if (dst.empty()) return {};
    // A callback that reads synchronously must not wait for a queue slot its own request holds.
    if (std::this_thread::get_id() == reaper_.get_id() || (callbacks_ && callbacks_->on_worker())) {
      return sc::read_posix(f, offset, dst);
    }
    // The latch's callback is trivial: it runs on the completion thread, never behind other callbacks.
    return sc::read_via_submit([this](ReadRequest r, ReadCallback done) { return enqueue(r, std::move(done), true); },
                               file, offset, dst);
  }

  void read_batch(std::span<ReadRequest> requests) noexcept override { sc::batch_via_submit(*this, requests); }

  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    return enqueue(std::move(request), std::move(done), false);
  }

  // submit(); `inline_callback`: `done` is trivial and may run on the completion thread.
  Status enqueue(ReadRequest request, ReadCallback done, bool inline_callback) noexcept {
    if (!done) return Status(StatusCode::invalid_argument, "submit() needs a completion callback");
    Status early = sc::check_request(request);
    if (early && !sc::in_range(*request.file, request.offset, request.length)) {
      early = sc::range_error(*request.file, request.offset, request.length);
    }
    if (!early || request.length == 0) {  // completes here, without the ring
      request.status = early;
      done(request);
      return {};
    }
    std::vector<std::unique_ptr<Op>> ops;
    try {
      // A long read becomes several SQEs in flight at once (up to a quarter of the depth each).
      const std::uint64_t chunks = sc::chunk_count(request, chunk_bytes_, std::max(1u, depth_ / 4));
      if (chunks <= 1) {
        ops.push_back(std::make_unique<Op>(Op{request, std::move(done)}));
      } else {
        for (auto& [c, cb] : sc::split_request(request, std::move(done), chunks)) {
          ops.push_back(std::make_unique<Op>(Op{c, std::move(cb)}));
        }
      }
      for (auto& op : ops) op->inline_callback = inline_callback;
      std::lock_guard lock(mu_);
      if (stopping_) return Status(StatusCode::cancelled, "storage is shutting down");
      auto& q = request.priority == ReadPriority::demand ? demand_ : prefetch_;
      for (auto& op : ops) {
        q.push_back(op.get());
        static_cast<void>(op.release());
        ++outstanding_;
      }
      pump_locked();
    } catch (...) {
      return Status(StatusCode::out_of_memory, "queueing a read");
    }
    return {};
  }

  void drain() noexcept override {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return outstanding_ == 0; });
  }

  // Only requests waiting beyond the queue depth are withdrawn; those on the ring are the kernel's.
  bool cancel(std::uint64_t user_tag) noexcept override {
    std::vector<Op*> withdrawn;
    {
      std::lock_guard lock(mu_);
      for (auto* q : {&demand_, &prefetch_}) {
        sc::withdraw_if(*q, withdrawn, [&](const Op* op) { return op->request.user_tag == user_tag; });
      }
    }
    if (withdrawn.empty()) return false;
    for (Op* op : withdrawn) {
      op->request.status = Status(StatusCode::cancelled, "read cancelled before it started");
      op->done(op->request);
      delete op;
    }
    std::lock_guard lock(mu_);
    outstanding_ -= withdrawn.size();
    if (outstanding_ == 0) idle_cv_.notify_all();
    return true;
  }

  StorageCapabilities capabilities() const noexcept override {
    StorageCapabilities c;
    c.direct_io = direct_;
    c.async = true;
    c.registered_buffers = fixed_buffers_;
    c.queue_depth = depth_;
    c.alignment = sc::kDirectAlignment;
    return c;
  }

  // registered_buffers.v1: the whole table at once (1 GiB per entry, the kernel's cap).
  Status register_buffers(std::span<const std::span<std::byte>> regions) noexcept override {
    drain();
    std::lock_guard lock(mu_);
    clear_table_locked();
    try {
      std::vector<iovec> iov;
      for (const auto& r : regions) {
        for (std::size_t at = 0; at < r.size(); at += kMaxChunk) {
          iov.push_back(iovec{r.data() + at, std::min<std::size_t>(kMaxChunk, r.size() - at)});
        }
      }
      if (iov.empty()) return {};
      if (iov.size() > kBufferTableEntries) {
        return Status(StatusCode::invalid_argument, "cannot register " + std::to_string(iov.size()) +
                                                        " buffers; io_uring holds at most " +
                                                        std::to_string(kBufferTableEntries));
      }
      Status st = open_table_locked();
      if (st.code() == StatusCode::unsupported) return register_dense_locked(iov);  // an old kernel
      for (const auto& v : iov) {
        if (st) st = add_buffer_locked(static_cast<std::byte*>(v.iov_base), v.iov_len);
      }
      if (!st) clear_table_locked();
      return st;
    } catch (...) {
      clear_table_locked();
      return Status(StatusCode::out_of_memory, "registering buffers");
    }
  }

  void unregister_buffers() noexcept override {
    drain();
    std::lock_guard lock(mu_);
    clear_table_locked();
  }

  // buffers.v1: one entry of the sparse table per buffer; no waiting for reads elsewhere.
  Status register_buffer(std::span<std::byte> range) noexcept override {
    if (range.empty()) return Status(StatusCode::invalid_argument, "cannot register an empty buffer");
    if (range.size() > kMaxChunk) {
      return Status(StatusCode::invalid_argument, "cannot register a buffer of " + std::to_string(range.size()) +
                                                      " bytes; io_uring registers at most 1 GiB per buffer");
    }
    std::lock_guard lock(mu_);
    if (fixed_index(range.data(), range.size()) >= 0) return {};  // already inside a registered buffer
    try {
      if (Status st = open_table_locked(); !st) return st;
      return add_buffer_locked(range.data(), range.size());
    } catch (...) {
      return Status(StatusCode::out_of_memory, "registering a buffer");
    }
  }

  void unregister_buffer(std::span<std::byte> range) noexcept override {
    std::lock_guard lock(mu_);
    const auto start = reinterpret_cast<std::uintptr_t>(range.data());
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const Region& r) { return r.start == start && r.end == start + range.size(); });
    if (it == regions_.end()) return;
    if (table_ == Table::sparse) {
      iovec empty{nullptr, 0};
      __u64 tag = 0;
      const int ret = io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(it->index), &empty, &tag, 1);
      if (ret < 0) {
        // The entry stays registered (harmless: no read lands there once the caller frees it) and stays used.
        host_.warn("io_uring could not unregister a buffer: " + os_error_text(-ret));
        regions_.erase(it);
        return;
      }
      free_entries_.push_back(it->index);
    }
    regions_.erase(it);
  }

 private:
  struct Region {
    std::uintptr_t start;
    std::uintptr_t end;
    int index;
  };
  enum class Table { none, sparse, dense };

  Status start(int callback_threads) {
    const int ret = io_uring_queue_init(depth_, &ring_, 0);
    if (ret < 0) {
      return Status(StatusCode::unsupported, "io_uring_queue_init(" + std::to_string(depth_) +
                                                 ") failed: " + os_error_text(-ret) +
                                                 " (kernel.io_uring_disabled, a seccomp filter or an old kernel); "
                                                 "use storage.plugin: pread");
    }
    try {
      if (callback_threads > 0) {
        callbacks_ = std::make_unique<CallbackPool>(callback_threads, [this](Op* op) { finish(op); });
      }
      reaper_ = std::thread([this] { reap(); });
    } catch (...) {
      callbacks_.reset();
      io_uring_queue_exit(&ring_);
      return Status(StatusCode::internal, "cannot start the io_uring completion threads");
    }
    started_ = true;
    return {};
  }

  // A sparse table (kernel 5.19+) whose entries come and go. Caller holds mu_.
  Status open_table_locked() {
    if (table_ == Table::sparse) return {};
    if (table_ == Table::dense) {
      return Status(StatusCode::unsupported,
                    "the registered-buffer table is held by registered_buffers.v1 (this kernel has no sparse tables)");
    }
    if (!sparse_error_.is_ok()) return sparse_error_;
    const int ret = io_uring_register_buffers_sparse(&ring_, kBufferTableEntries);
    if (ret < 0) {
      sparse_error_ =
          Status(StatusCode::unsupported,
                 "io_uring refused a sparse registered-buffer table: " + os_error_text(-ret) + " (needs Linux 5.19+)");
      return sparse_error_;
    }
    table_ = Table::sparse;
    free_entries_.clear();
    for (unsigned i = kBufferTableEntries; i-- > 0;) free_entries_.push_back(static_cast<int>(i));
    return {};
  }

  // Registers one buffer in a free entry of the sparse table. Caller holds mu_.
  Status add_buffer_locked(std::byte* data, std::size_t size) {
    const auto start = reinterpret_cast<std::uintptr_t>(data);
    auto next = std::upper_bound(regions_.begin(), regions_.end(), start,
                                 [](std::uintptr_t s, const Region& r) { return s < r.start; });
    if ((next != regions_.end() && next->start < start + size) ||
        (next != regions_.begin() && std::prev(next)->end > start)) {
      return Status(StatusCode::invalid_argument, "the buffer overlaps a registered one without lying inside it");
    }
    if (free_entries_.empty()) {
      return Status(StatusCode::out_of_memory,
                    "all " + std::to_string(kBufferTableEntries) + " registered-buffer entries are in use");
    }
    const int index = free_entries_.back();
    iovec iov{data, size};
    __u64 tag = 0;  // no release notification: the completion thread reads every CQE as a request
    const int ret = io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(index), &iov, &tag, 1);
    if (ret < 0) return refused(ret, 1);
    free_entries_.pop_back();
    regions_.insert(next, Region{start, start + size, index});
    return {};
  }

  // registered_buffers.v1 where the kernel has no sparse tables: one dense registration. Caller holds mu_.
  Status register_dense_locked(const std::vector<iovec>& iov) {
    const int ret = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (ret < 0) return refused(ret, iov.size());
    table_ = Table::dense;
    for (std::size_t i = 0; i < iov.size(); ++i) {
      const auto start = reinterpret_cast<std::uintptr_t>(iov[i].iov_base);
      regions_.push_back(Region{start, start + iov[i].iov_len, static_cast<int>(i)});
    }
    std::sort(regions_.begin(), regions_.end(), [](const Region& a, const Region& b) { return a.start < b.start; });
    return {};
  }

  Status refused(int ret, std::size_t buffers) const {
    return Status(ret == -ENOMEM ? StatusCode::out_of_memory : StatusCode::unsupported,
                  "io_uring refused to register " + std::to_string(buffers) + " buffer(s): " + os_error_text(-ret) +
                      (ret == -ENOMEM ? " (locked-memory limit: raise `ulimit -l` or grant CAP_IPC_LOCK)" : "") +
                      "; reads continue without registered buffers");
  }

  // Drops the whole table (the next registration opens a new one). Caller holds mu_, no read in flight.
  void clear_table_locked() {
    if (table_ != Table::none) io_uring_unregister_buffers(&ring_);
    table_ = Table::none;
    regions_.clear();
    free_entries_.clear();
  }

  int fixed_index(const void* buf, std::uint64_t len) const {
    const auto start = reinterpret_cast<std::uintptr_t>(buf);
    auto it = std::upper_bound(regions_.begin(), regions_.end(), start,
                               [](std::uintptr_t s, const Region& r) { return s < r.start; });
    if (it == regions_.begin()) return -1;
    --it;
    return start >= it->start && start + len <= it->end ? it->index : -1;
  }

  // Queues the rest of `op` (after done_bytes) on the ring. Caller holds mu_.
  void prepare_locked(Op* op) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // cannot happen while in-flight <= depth; flush and retry once
      submit_locked();
      sqe = io_uring_get_sqe(&ring_);
    }
    auto& r = op->request;
    auto& f = static_cast<sc::PosixFile&>(*r.file);
    std::byte* buf = static_cast<std::byte*>(r.buffer) + op->done_bytes;
    const std::uint64_t off = r.offset + op->done_bytes;
    const auto len = static_cast<unsigned>(std::min<std::uint64_t>(r.length - op->done_bytes, kMaxChunk));
    const bool direct = f.direct_io() && !op->avoid_direct && sc::direct_compatible(off, len, buf);
    const int fd = direct ? f.direct_fd() : f.buffered_fd();
    const int fixed = regions_.empty() || op->avoid_fixed ? -1 : fixed_index(buf, len);
    op->fixed = fixed >= 0;
    if (op->fixed) {
      io_uring_prep_read_fixed(sqe, fd, buf, len, off, fixed);
      ++fixed_reads_;
    } else {
      io_uring_prep_read(sqe, fd, buf, len, off);
      ++plain_reads_;
    }
    COLIBRI_RING_RELEASE(op);
    io_uring_sqe_set_data(sqe, op);
  }

  void submit_locked() {
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int ret = io_uring_submit(&ring_);
      if (ret >= 0 || (ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)) {
        if (ret < 0) host_.error("io_uring_submit failed: " + os_error_text(-ret));
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));  // kernel short of memory: retry
    }
  }

  // Moves waiting requests onto the ring while there is room, demand first. Caller holds mu_.
  void pump_locked() {
    bool any = false;
    while (in_flight_ < depth_ && (!demand_.empty() || !prefetch_.empty())) {
      auto& q = !demand_.empty() ? demand_ : prefetch_;
      Op* op = q.front();
      q.pop_front();
      prepare_locked(op);
      ++in_flight_;
      any = true;
    }
    if (any) submit_locked();
  }

  void reap() {
    while (true) {
      io_uring_cqe* cqe = nullptr;
      const int ret = io_uring_wait_cqe(&ring_, &cqe);
      if (ret == -EINTR) continue;
      if (ret < 0) {
        host_.error("io_uring_wait_cqe failed: " + os_error_text(-ret));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      Op* op = static_cast<Op*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (op == nullptr) return;  // the destructor's no-op: everything before it has completed
      COLIBRI_RING_ACQUIRE(op);
      complete(op, res);
    }
  }

  void complete(Op* op, int res) {
    auto& r = op->request;
    auto& f = static_cast<sc::PosixFile&>(*r.file);
    bool again = false;
    if (res < 0) {
      const int err = -res;
      if ((err == EFAULT || err == EINVAL) && op->fixed) {
        op->avoid_fixed = true;  // the registration no longer covers the buffer: an ordinary read never fails for it
        again = true;
      } else if (err == EINVAL && f.direct_io() && !op->avoid_direct) {
        op->avoid_direct = true;  // accepted O_DIRECT at open, refuses it now: read buffered
        again = true;
      } else if ((err == EINTR || err == EAGAIN) && op->retries++ < kMaxTransientRetries) {
        again = true;
      } else {
        host_.counter_add("read_errors_total", 1);
        r.status = Status(StatusCode::io_error,
                          "reading " + std::to_string(r.length) + " bytes at offset " + std::to_string(r.offset) +
                              " of " + f.path() + ": " + os_error_text(err),
                          sc::transient(err));
      }
    } else if (res == 0) {
      r.status =
          Status(StatusCode::corrupt_data, f.path() + " ended after " + std::to_string(r.offset + op->done_bytes) +
                                               " bytes while reading " + std::to_string(r.length) +
                                               " bytes at offset " + std::to_string(r.offset) + " (truncated file?)");
    } else {
      op->done_bytes += static_cast<std::uint64_t>(res);
      again = op->done_bytes < r.length;  // short read or a chunk of a huge request: read the rest
      if (!again) r.status = Status();
    }
    if (again) {
      std::lock_guard lock(mu_);
      prepare_locked(op);  // keeps its in-flight slot
      submit_locked();
      return;
    }
    if (r.status) host_.counter_add("bytes_read_total", static_cast<double>(r.length));
    std::uint64_t fixed_reads = 0;
    std::uint64_t plain_reads = 0;
    {
      std::lock_guard lock(mu_);
      fixed_reads = std::exchange(fixed_reads_, 0);
      plain_reads = std::exchange(plain_reads_, 0);
    }
    // Counted before the callback runs, so a caller that saw its read complete sees its count too.
    if (fixed_reads > 0) host_.counter_add("fixed_reads_total", static_cast<double>(fixed_reads));
    if (plain_reads > 0) host_.counter_add("plain_reads_total", static_cast<double>(plain_reads));
    if (op->inline_callback || !callbacks_ || !callbacks_->post(op)) finish(op);
  }

  // Runs the callback of a completed request, then forgets it. The request keeps its place in the queue depth
  // until its callback has returned: callbacks that cannot keep up hold back new reads instead of piling up.
  void finish(Op* op) {
    op->done(op->request);
    delete op;
    std::lock_guard lock(mu_);
    --in_flight_;
    pump_locked();
    if (--outstanding_ == 0) idle_cv_.notify_all();
  }

  HostServices& host_;
  bool direct_;
  unsigned depth_;
  std::uint64_t chunk_bytes_;
  bool fixed_buffers_;  // offer buffer registration (off: every read is plain, no memory pinned)
  std::atomic<bool> warned_direct_{false};
  io_uring ring_{};
  bool started_ = false;
  std::thread reaper_;

  std::mutex mu_;  // the submission side of the ring, the queues and the counters below
  std::condition_variable idle_cv_;
  std::deque<Op*> demand_;
  std::deque<Op*> prefetch_;
  unsigned in_flight_ = 0;       // on the ring, or completed and in its callback
  std::size_t outstanding_ = 0;  // submitted, callback not yet returned
  std::uint64_t fixed_reads_ = 0;
  std::uint64_t plain_reads_ = 0;
  bool stopping_ = false;
  Table table_ = Table::none;
  Status sparse_error_;                      // why the kernel refused a sparse table (asked once)
  std::vector<Region> regions_;              // registered buffers, by start address
  std::vector<int> free_entries_;            // of the sparse table, the lowest last
  std::unique_ptr<CallbackPool> callbacks_;  // null: callbacks run on the completion thread
};

// A bare io_uring_setup: cheap, loads nothing, and sees what a real ring would see (no kernel
// support, kernel.io_uring_disabled, a seccomp filter, a container runtime's block).
Score score(const HostInfo& host) noexcept {
  io_uring_params params;
  std::memset(&params, 0, sizeof(params));
  const long fd = ::syscall(__NR_io_uring_setup, 1, &params);
  if (fd >= 0) {
    ::close(static_cast<int>(fd));
    return {110, "io_uring available (kernel " + host.kernel_release + ")"};
  }
  const int err = errno;
  if (err == ENOSYS) return {0, "this kernel has no io_uring (" + host.kernel_release + "); use pread"};
  if (err == EPERM || err == EACCES) {
    return {0, "io_uring is disabled here (kernel.io_uring_disabled or a seccomp filter refused io_uring_setup: " +
                   os_error_text(err) + "); use pread"};
  }
  return {0, "io_uring_setup failed: " + os_error_text(err) + "; use pread"};
}

const OptionSpec kOptions[] = {
    {"chunk_kib", OptionType::integer, "2048",
     "reads longer than this are split into chunks in flight at once (0: never)"},
    {"fixed_buffers", OptionType::boolean, "true",
     "offer buffer registration, so reads into the expert cache's slots are fixed reads (false: pin nothing)"},
    {"callback_threads", OptionType::integer, "2",
     "threads running completion callbacks, so their work (checksums) overlaps (0: on the completion thread)"},
};
const char* const kCapabilities[] = {"direct_io", "async", "priorities", "registered_buffers"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::storage,
    "io_uring",
    "1.0.0",
    "io_uring reads at queue_depth, O_DIRECT, registered buffers, a completion thread",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<UringStorage>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
