// storage/pread: positional reads from a thread pool. O_DIRECT into aligned buffers when the
// profile asks and the filesystem allows it; unaligned requests and filesystems that refuse
// O_DIRECT (tmpfs, some FUSE mounts) use a buffered descriptor of the same file.
#include <algorithm>

#include "colibri/sdk/sdk.hpp"
#include "colibri/sdk/storage_view.hpp"
#include "posix_read.hpp"

namespace {

using namespace colibri::sdk;
namespace common = colibri::plugins::storage_common;

class PreadStorage final : public StorageBase, public StorageCancel {
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
    auto chunk = common::chunk_bytes_option(*ctx.config);
    if (!chunk) return chunk.error();
    // auto: one thread per outstanding read up to 8; NVMe needs depth, but threads cost memory.
    const int n = *threads > 0 ? static_cast<int>(*threads) : static_cast<int>(std::clamp<std::int64_t>(*depth, 1, 8));
    return std::make_unique<PreadStorage>(*ctx.host, *direct, n, *chunk);
  }

  PreadStorage(HostServices& host, bool direct, int threads, std::uint64_t chunk_bytes)
      : host_(host),
        direct_(direct),
        queue_(
            threads,
            [this](ReadRequest& r) {
              return read_now(*r.file, r.offset, std::span<std::byte>(static_cast<std::byte*>(r.buffer), r.length));
            },
            chunk_bytes) {}

  Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept override {
    auto f = common::open_posix(path, direct_, host_, warned_direct_);
    if (!f) return f.error();
    return std::unique_ptr<StorageFile>(std::move(*f));
  }

  // A long read is split like a submitted one and its parts read by the pool at once; a worker (a callback
  // reading synchronously) reads inline instead of waiting for the pool it belongs to.
  Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    ReadRequest r;
    r.file = &file;
    r.offset = offset;
    r.length = dst.size();
    r.buffer = dst.data();
    if (queue_.chunks_for(r) > 1 && !queue_.on_worker()) {
      return common::read_via_submit(
          [this](ReadRequest req, ReadCallback done) { return queue_.submit(req, std::move(done)); }, file, offset,
          dst);
    }
    return read_now(file, offset, dst);
  }

  // Parallel across the pool, then wait for this batch only.
  void read_batch(std::span<ReadRequest> requests) noexcept override { common::batch_via_submit(*this, requests); }

  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    return queue_.submit(std::move(request), std::move(done));
  }

  void drain() noexcept override { queue_.drain(); }

  // Queued requests no worker has picked yet are withdrawn (a stale prefetch stops holding the queue).
  bool cancel(std::uint64_t user_tag) noexcept override { return queue_.cancel(user_tag); }

  void* query_interface(std::string_view id) noexcept override {
    if (id == kStorageCancelInterface) return static_cast<StorageCancel*>(this);
    return nullptr;
  }

  StorageCapabilities capabilities() const noexcept override {
    StorageCapabilities c;
    c.direct_io = direct_;
    c.async = true;
    c.queue_depth = static_cast<std::uint32_t>(queue_.threads());
    c.alignment = common::kDirectAlignment;
    return c;
  }

 private:
  // One positional read (a whole request or one part of it); reads_total counts them.
  Status read_now(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept {
    Status st = common::read_posix(static_cast<common::PosixFile&>(file), offset, dst);
    host_.counter_add("reads_total", 1);
    if (st) {
      host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
    } else if (st.code() == StatusCode::io_error) {
      host_.counter_add("read_errors_total", 1);
    }
    return st;
  }

  HostServices& host_;
  bool direct_;
  std::atomic<bool> warned_direct_{false};
  common::ReadQueue queue_;  // last: its workers stop before the members they use go away
};

Score score(const HostInfo&) noexcept {
  return {100, "positional reads work on every Linux filesystem"};
}

const OptionSpec kOptions[] = {
    {"threads", OptionType::integer, "0", "reader threads (0: queue_depth, at most 8)"},
    {"chunk_kib", OptionType::integer, "2048",
     "reads longer than this are split into chunks read by several threads at once (0: never)"},
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
