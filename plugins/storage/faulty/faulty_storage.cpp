// storage/faulty: positional reads (like pread) that inject faults on demand, so the engine's
// fault handling can be tested: failed reads, short reads, silent corruption, missing files and
// slow disks. Never selected automatically (score 1); name it in a profile or a test.
#include <chrono>
#include <thread>

#include "colibri/sdk/storage_view.hpp"
#include "posix_read.hpp"

namespace {

using namespace colibri::sdk;
namespace sc = colibri::plugins::storage_common;

struct Faults {
  std::int64_t fail_every = 0;            // every N-th read fails with io_error
  bool fail_retryable = false;            // ... and says it may be retried
  std::string fail_path_substring;        // reads of matching files always fail with io_error
  std::string short_read_path_substring;  // reads of matching files stop halfway (corrupt_data)
  std::string missing_path_substring;     // opening matching files gives not_found
  std::int64_t delay_ms = 0;              // every read sleeps first
  std::int64_t corrupt_bytes = 0;         // bytes flipped in each successful read of matching files
  std::string corrupt_path_substring;     // empty: every file
};

bool matches(const std::string& path, const std::string& needle) {
  return !needle.empty() && path.find(needle) != std::string::npos;
}

class FaultyStorage final : public StorageBase, public StorageCancel {
 public:
  static Expected<std::unique_ptr<FaultyStorage>> create(const CreateContext& ctx) {
    const ConfigView& c = *ctx.config;
    auto direct = c.get_bool("direct_io", true);
    if (!direct) return direct.error();
    auto depth = c.get_int("queue_depth", 32);
    if (!depth) return depth.error();
    Faults f;
    auto get_int = [&](const char* key, std::int64_t& out) -> Status {
      auto v = c.get_int(key, 0);
      if (!v) return v.error();
      if (*v < 0) return Status(StatusCode::invalid_argument, std::string("storage.") + key + " must be >= 0");
      out = *v;
      return {};
    };
    auto get_str = [&](const char* key, std::string& out) -> Status {
      auto v = c.get_string(key, "");
      if (!v) return v.error();
      out = *v;
      return {};
    };
    for (Status st : {get_int("fail_every", f.fail_every), get_int("delay_ms", f.delay_ms),
                      get_int("corrupt_bytes", f.corrupt_bytes), get_str("fail_path_substring", f.fail_path_substring),
                      get_str("short_read_path_substring", f.short_read_path_substring),
                      get_str("missing_path_substring", f.missing_path_substring),
                      get_str("corrupt_path_substring", f.corrupt_path_substring)}) {
      if (!st) return st;
    }
    auto retry = c.get_bool("fail_retryable", false);
    if (!retry) return retry.error();
    f.fail_retryable = *retry;
    const int threads = static_cast<int>(std::clamp<std::int64_t>(*depth, 1, 8));
    return std::make_unique<FaultyStorage>(*ctx.host, *direct, threads, std::move(f));
  }

  FaultyStorage(HostServices& host, bool direct, int threads, Faults faults)
      : host_(host),
        direct_(direct),
        faults_(std::move(faults)),
        queue_(threads, [this](ReadRequest& r) { return read_request(r); }) {}

  Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept override {
    if (matches(path, faults_.missing_path_substring)) {
      return Status(StatusCode::not_found, "cannot open " + path + ": No such file or directory (injected)");
    }
    auto f = sc::open_posix(path, direct_, host_, warned_direct_);
    if (!f) return f.error();
    return std::unique_ptr<StorageFile>(std::move(*f));
  }

  Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    auto& f = static_cast<sc::PosixFile&>(file);
    const std::uint64_t n = reads_.fetch_add(1) + 1;
    if (faults_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(faults_.delay_ms));
    if ((faults_.fail_every > 0 && n % static_cast<std::uint64_t>(faults_.fail_every) == 0) ||
        matches(f.path(), faults_.fail_path_substring)) {
      host_.counter_add("injected_faults_total", 1);
      return Status(StatusCode::io_error,
                    "reading " + std::to_string(dst.size()) + " bytes at offset " + std::to_string(offset) + " of " +
                        f.path() + ": Input/output error (injected, read #" + std::to_string(n) + ")",
                    faults_.fail_retryable);
    }
    if (matches(f.path(), faults_.short_read_path_substring) && !dst.empty()) {
      // Half the bytes arrive, then the file "ends": what a truncated copy looks like.
      const std::size_t half = dst.size() / 2;
      if (Status st = sc::read_posix(f, offset, dst.first(half)); !st) return st;
      host_.counter_add("injected_faults_total", 1);
      return Status(StatusCode::corrupt_data, f.path() + " ended after " + std::to_string(offset + half) +
                                                  " bytes while reading " + std::to_string(dst.size()) +
                                                  " bytes at offset " + std::to_string(offset) +
                                                  " (injected short read)");
    }
    Status st = sc::read_posix(f, offset, dst);
    if (!st) return st;
    if (faults_.corrupt_bytes > 0 && !dst.empty() &&
        (faults_.corrupt_path_substring.empty() || matches(f.path(), faults_.corrupt_path_substring))) {
      // Evenly spaced flips: deterministic, and every part of the range is affected.
      const std::size_t count = std::min<std::size_t>(static_cast<std::size_t>(faults_.corrupt_bytes), dst.size());
      for (std::size_t i = 0; i < count; ++i) dst[i * dst.size() / count] ^= std::byte{0xff};
      host_.counter_add("injected_faults_total", 1);
    }
    host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
    return {};
  }

  void read_batch(std::span<ReadRequest> requests) noexcept override { sc::batch_via_submit(*this, requests); }
  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    return queue_.submit(request, std::move(done));
  }
  void drain() noexcept override { queue_.drain(); }
  // A slow disk (delay_ms) keeps prefetches queued: the case cancel is for.
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
    c.alignment = sc::kDirectAlignment;
    return c;
  }

 private:
  HostServices& host_;
  bool direct_;
  Faults faults_;
  std::atomic<bool> warned_direct_{false};
  std::atomic<std::uint64_t> reads_{0};
  sc::ReadQueue queue_;  // last: its workers stop before the members they use go away
};

Score score(const HostInfo&) noexcept {
  return {1, "fault injection for tests; name it explicitly"};
}

const OptionSpec kOptions[] = {
    {"fail_every", OptionType::integer, "0", "every N-th read fails with io_error (0: never)"},
    {"fail_retryable", OptionType::boolean, "false", "injected read errors are marked retryable"},
    {"fail_path_substring", OptionType::string, "", "reads of files whose path contains this fail with io_error"},
    {"short_read_path_substring", OptionType::string, "",
     "reads of files whose path contains this stop halfway (corrupt_data, like a truncated file)"},
    {"missing_path_substring", OptionType::string, "", "opening files whose path contains this gives not_found"},
    {"delay_ms", OptionType::integer, "0", "every read waits this long first (a slow disk)"},
    {"corrupt_bytes", OptionType::integer, "0", "bytes flipped in each successful read (silent corruption)"},
    {"corrupt_path_substring", OptionType::string, "", "limit corrupt_bytes to files whose path contains this"},
};
const char* const kCapabilities[] = {"direct_io", "async", "priorities", "fault_injection"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::storage,
    "faulty",
    "1.0.0",
    "positional reads with injected faults (errors, short reads, corruption, delays) for tests",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<FaultyStorage>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
