// storage/io_uring: one ring per Storage, `queue_depth` reads in flight, one completion thread
// that reaps completions and runs the callbacks. Requests beyond the depth wait in two queues,
// demand before prefetch. O_DIRECT for aligned requests where the filesystem allows it, buffered
// otherwise (and when a filesystem rejects a direct read with EINVAL).
//
// Registered (fixed) buffers: through query_interface("colibri.storage.registered_buffers.v1")
// the caller registers the memory its reads land in once (the expert cache's slot arena); every
// later request whose buffer lies inside a registered region is read with IORING_OP_READ_FIXED,
// which skips pinning the pages on each read. Other requests are ordinary reads.
//
// Cancel: through query_interface("colibri.storage.cancel.v1") requests still waiting in the two
// queues are withdrawn; those already on the ring complete.
//
// Threads: submit() may be called from any thread, including from a completion callback.
// Callbacks run on the completion thread and should be short: the next completions wait for them.
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

// One request from submit() to its callback.
struct Op {
  ReadRequest request;
  ReadCallback done;
  std::uint64_t done_bytes = 0;
  bool avoid_direct = false;  // the filesystem rejected a direct read of this request
  int retries = 0;
};

class UringStorage final : public StorageBase, public RegisteredBuffers, public StorageCancel {
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
    auto self = std::make_unique<UringStorage>(*ctx.host, *direct, static_cast<unsigned>(*depth), *chunk);
    if (Status st = self->start(); !st) return st;
    return self;
  }

  UringStorage(HostServices& host, bool direct, unsigned depth, std::uint64_t chunk_bytes)
      : host_(host), direct_(direct), depth_(depth), chunk_bytes_(chunk_bytes) {}

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
    io_uring_queue_exit(&ring_);
  }

  void* query_interface(std::string_view id) noexcept override {
    if (id == kRegisteredBuffersInterface) return static_cast<RegisteredBuffers*>(this);
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
    // A callback that reads synchronously must not wait for the thread it runs on.
    if (std::this_thread::get_id() == reaper_.get_id()) return sc::read_posix(f, offset, dst);
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

  void read_batch(std::span<ReadRequest> requests) noexcept override { sc::batch_via_submit(*this, requests); }

  Status submit(ReadRequest request, ReadCallback done) noexcept override {
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
    c.registered_buffers = true;
    c.queue_depth = depth_;
    c.alignment = sc::kDirectAlignment;
    return c;
  }

  Status register_buffers(std::span<const std::span<std::byte>> regions) noexcept override {
    drain();
    std::lock_guard lock(mu_);
    unregister_locked();
    try {
      std::vector<iovec> iov;
      std::vector<Region> table;
      for (const auto& r : regions) {
        for (std::size_t at = 0; at < r.size(); at += kMaxChunk) {  // the kernel caps one buffer at 1 GiB
          const std::size_t n = std::min<std::size_t>(kMaxChunk, r.size() - at);
          iov.push_back(iovec{r.data() + at, n});
          const auto start = reinterpret_cast<std::uintptr_t>(r.data() + at);
          table.push_back(Region{start, start + n, static_cast<int>(iov.size() - 1)});
        }
      }
      if (iov.empty()) return {};
      const int ret = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
      if (ret < 0) {
        return Status(ret == -ENOMEM ? StatusCode::out_of_memory : StatusCode::unsupported,
                      "io_uring refused to register " + std::to_string(iov.size()) + " buffers: " +
                          sc::errno_text(-ret) + (ret == -ENOMEM ? " (locked-memory limit: raise `ulimit -l`)" : "") +
                          "; reads continue without registered buffers");
      }
      std::sort(table.begin(), table.end(), [](const Region& a, const Region& b) { return a.start < b.start; });
      regions_ = std::move(table);
    } catch (...) {
      return Status(StatusCode::out_of_memory, "registering buffers");
    }
    return {};
  }

  void unregister_buffers() noexcept override {
    drain();
    std::lock_guard lock(mu_);
    unregister_locked();
  }

 private:
  struct Region {
    std::uintptr_t start;
    std::uintptr_t end;
    int index;
  };

  Status start() {
    const int ret = io_uring_queue_init(depth_, &ring_, 0);
    if (ret < 0) {
      return Status(StatusCode::unsupported, "io_uring_queue_init(" + std::to_string(depth_) +
                                                 ") failed: " + sc::errno_text(-ret) +
                                                 " (kernel.io_uring_disabled, a seccomp filter or an old kernel); "
                                                 "use storage.plugin: pread");
    }
    try {
      reaper_ = std::thread([this] { reap(); });
    } catch (...) {
      io_uring_queue_exit(&ring_);
      return Status(StatusCode::internal, "cannot start the io_uring completion thread");
    }
    started_ = true;
    return {};
  }

  void unregister_locked() {
    if (regions_.empty()) return;
    io_uring_unregister_buffers(&ring_);
    regions_.clear();
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
    const int fixed = regions_.empty() ? -1 : fixed_index(buf, len);
    if (fixed >= 0) {
      io_uring_prep_read_fixed(sqe, fd, buf, len, off, fixed);
      ++fixed_reads_;
    } else {
      io_uring_prep_read(sqe, fd, buf, len, off);
    }
    COLIBRI_RING_RELEASE(op);
    io_uring_sqe_set_data(sqe, op);
  }

  void submit_locked() {
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int ret = io_uring_submit(&ring_);
      if (ret >= 0 || (ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)) {
        if (ret < 0) host_.error("io_uring_submit failed: " + sc::errno_text(-ret));
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
        host_.error("io_uring_wait_cqe failed: " + sc::errno_text(-ret));
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
      if (err == EINVAL && f.direct_io() && !op->avoid_direct) {
        op->avoid_direct = true;  // accepted O_DIRECT at open, refuses it now: read buffered
        again = true;
      } else if ((err == EINTR || err == EAGAIN) && op->retries++ < kMaxTransientRetries) {
        again = true;
      } else {
        host_.counter_add("read_errors_total", 1);
        r.status = Status(StatusCode::io_error,
                          "reading " + std::to_string(r.length) + " bytes at offset " + std::to_string(r.offset) +
                              " of " + f.path() + ": " + sc::errno_text(err),
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
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      pump_locked();
    }
    op->done(r);
    delete op;
    std::lock_guard lock(mu_);
    if (--outstanding_ == 0) idle_cv_.notify_all();
    if (fixed_reads_ > 0) {
      host_.counter_add("fixed_reads_total", static_cast<double>(fixed_reads_));
      fixed_reads_ = 0;
    }
  }

  HostServices& host_;
  bool direct_;
  unsigned depth_;
  std::uint64_t chunk_bytes_;
  std::atomic<bool> warned_direct_{false};
  io_uring ring_{};
  bool started_ = false;
  std::thread reaper_;

  std::mutex mu_;  // the submission side of the ring, the queues and the counters below
  std::condition_variable idle_cv_;
  std::deque<Op*> demand_;
  std::deque<Op*> prefetch_;
  unsigned in_flight_ = 0;       // on the ring now
  std::size_t outstanding_ = 0;  // submitted, callback not yet returned
  std::uint64_t fixed_reads_ = 0;
  bool stopping_ = false;
  std::vector<Region> regions_;
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
                   sc::errno_text(err) + "); use pread"};
  }
  return {0, "io_uring_setup failed: " + sc::errno_text(err) + "; use pread"};
}

const OptionSpec kOptions[] = {
    {"chunk_kib", OptionType::integer, "2048",
     "reads longer than this are split into chunks in flight at once (0: never)"},
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
