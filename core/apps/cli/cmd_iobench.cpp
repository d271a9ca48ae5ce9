// colibri-cli iobench DIR [--size 1G] [--block-sizes 4M,4K] [--depths 1,4,16,32] [--plugins a,b]
//                         [--seconds 2] [--seq-block 1M] [--seq-depth 8] [--json]
//
// Measures a disk the way the engine reads it: through the storage plugins (found by the
// registry like any run), with O_DIRECT requested. Writes one test file in DIR (removed
// afterwards), then per plugin: one sequential pass over the file, and random reads of each block
// size at each queue depth for a fixed time. The page cache is dropped for the file before every
// measurement, and without direct I/O (mmap) a point reads each block at most once, so it is measured cold too.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "../common/cli_values.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "colibri/sdk/storage_view.hpp"
#include "colibri/util/output_file.hpp"
#include "command.hpp"

namespace colibri::cli::iobench_command {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct IobenchOptions {
  std::string dir;
  std::string size = "1G";
  std::string block_sizes = "4M,4K";
  std::string depths = "1,4,16,32";
  std::string plugins;  // empty: every usable storage plugin except fault injectors
  double seconds = 2.0;
  std::string seq_block = "1M";
  int seq_depth = 8;
  bool json = false;
};

struct Result {
  std::string plugin;
  std::string test;  // "seq" or "rand"
  std::uint64_t block = 0;
  int depth = 0;
  bool direct_io = false;
  bool registered = false;
  std::uint64_t reads = 0;
  double seconds = 0;
  double mean_us = 0;
  double p99_us = 0;
  std::string error;
  [[nodiscard]] double mb_per_s() const { return seconds > 0 ? static_cast<double>(reads * block) / seconds / 1e6 : 0; }
  [[nodiscard]] double iops() const { return seconds > 0 ? static_cast<double>(reads) / seconds : 0; }
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct AlignedBlock {
  explicit AlignedBlock(std::size_t n)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~AlignedBlock() { std::free(data); }
  AlignedBlock(const AlignedBlock&) = delete;
  AlignedBlock& operator=(const AlignedBlock&) = delete;
  std::byte* data;
};

// The test file; removed when this goes out of scope, whatever happens, or by Ctrl-C.
class TestFile {
 public:
  explicit TestFile(fs::path p) : path_(std::move(p)), on_signal_(path_) {}
  ~TestFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  TestFile(const TestFile&) = delete;
  TestFile& operator=(const TestFile&) = delete;
  [[nodiscard]] const fs::path& path() const { return path_; }

  sdk::Status write(std::uint64_t size) const {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
      return sdk::Status(sdk::StatusCode::io_error, "cannot create " + path_.string() + ": " + std::strerror(errno));
    std::vector<std::uint64_t> chunk(8u << 20 >> 3);
    std::mt19937_64 rng(12345);  // incompressible, so a compressing filesystem cannot cheat
    for (std::uint64_t done = 0; done < size;) {
      for (auto& w : chunk) w = rng();
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size() * 8, size - done));
      const ssize_t w = ::write(fd, chunk.data(), n);
      if (w != static_cast<ssize_t>(n)) {
        const std::string why = w < 0 ? std::strerror(errno) : "short write";
        ::close(fd);
        return sdk::Status(sdk::StatusCode::io_error, "writing " + path_.string() + ": " + why);
      }
      done += n;
    }
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!synced) return sdk::Status(sdk::StatusCode::io_error, "fsync " + path_.string() + " failed");
    return {};
  }

  // Evicts the file's clean pages so the next measurement starts cold.
  void drop_cache() const {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

 private:
  fs::path path_;
  util::RemovedOnSignal on_signal_;
};

// Keeps `depth` reads in flight until the work runs out: each of `depth` slots (a buffer) submits
// its next read from the completion callback of its previous one.
class Driver {
 public:
  using NextOffset = std::function<std::optional<std::uint64_t>(std::uint64_t)>;

  Driver(sdk::Storage& storage, sdk::StorageFile& file, std::uint64_t block, int depth)
      : storage_(storage), file_(file), block_(block), depth_(depth), async_(storage.capabilities().async) {}

  // next(i) gives the offset of the i-th read, or nullopt when there is no more work.
  // The clock starts after the buffers are set up and registered: under load, registering can take longer than the
  // whole point (a deadline set before it left a point with no read at all).
  Result run(const NextOffset& next, Clock::duration budget) {
    next_ = &next;
    for (int i = 0; i < depth_; ++i) buffers_.push_back(std::make_unique<AlignedBlock>(block_));
    latencies_.assign(1u << 22, 0.0f);
    Result r;
    r.block = block_;
    r.depth = depth_;
    auto* reg = static_cast<sdk::RegisteredBuffers*>(storage_.query_interface(sdk::kRegisteredBuffersInterface));
    if (reg != nullptr) {
      std::vector<std::span<std::byte>> regions;
      for (auto& b : buffers_) regions.emplace_back(b->data, block_);
      r.registered = reg->register_buffers(regions).is_ok();
    }
    const auto t0 = Clock::now();
    deadline_ = t0 + budget;
    active_ = depth_;
    for (int i = 0; i < depth_; ++i) issue(static_cast<std::size_t>(i));
    {
      std::unique_lock lock(mu_);
      while (true) {
        cv_.wait(lock, [this] { return active_ == 0 || !pending_.empty(); });
        if (pending_.empty()) break;
        // A synchronous plugin ran the callback inside submit(): continue its slot from here.
        const std::size_t slot = pending_.back();
        pending_.pop_back();
        lock.unlock();
        issue(slot);
        lock.lock();
      }
    }
    storage_.drain();
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (reg != nullptr && r.registered) reg->unregister_buffers();
    r.reads = completed_.load();
    r.error = error_;
    const std::size_t n = std::min<std::size_t>(recorded_.load(), latencies_.size());
    if (n > 0) {
      std::vector<float> lat(latencies_.begin(), latencies_.begin() + static_cast<std::ptrdiff_t>(n));
      double sum = 0;
      for (float v : lat) sum += v;
      r.mean_us = sum / static_cast<double>(n);
      const std::size_t k = std::min(n - 1, n * 99 / 100);
      std::nth_element(lat.begin(), lat.begin() + static_cast<std::ptrdiff_t>(k), lat.end());
      r.p99_us = lat[k];
    }
    return r;
  }

 private:
  // Starts the next read into buffer `slot`, or retires the slot when the work is done.
  void issue(std::size_t slot) {
    std::optional<std::uint64_t> offset;
    if (Clock::now() < deadline_ && !failed_.load()) offset = (*next_)(issued_.fetch_add(1));
    if (!offset) {
      retire();
      return;
    }
    sdk::ReadRequest req;
    req.file = &file_;
    req.offset = *offset;
    req.length = block_;
    req.buffer = buffers_[slot]->data;
    req.user_tag = slot;
    const auto start = Clock::now();
    sdk::Status st = storage_.submit(req, [this, start](sdk::ReadRequest& done) {
      const float us = std::chrono::duration<float, std::micro>(Clock::now() - start).count();
      if (!done.status) {
        fail(done.status);
      } else {
        completed_.fetch_add(1);
        const std::size_t at = recorded_.fetch_add(1);
        if (at < latencies_.size()) latencies_[at] = us;
      }
      if (async_) {
        issue(done.user_tag);
      } else {
        std::lock_guard lock(mu_);
        pending_.push_back(done.user_tag);
        cv_.notify_all();
      }
    });
    if (!st) {
      fail(st);
      retire();
    }
  }

  void fail(const sdk::Status& st) {
    std::lock_guard lock(mu_);
    if (!failed_.exchange(true)) error_ = st.to_string();
  }

  void retire() {
    std::lock_guard lock(mu_);
    --active_;
    cv_.notify_all();
  }

  sdk::Storage& storage_;
  sdk::StorageFile& file_;
  std::uint64_t block_;
  int depth_;
  bool async_;
  const NextOffset* next_ = nullptr;
  Clock::time_point deadline_;
  std::vector<std::unique_ptr<AlignedBlock>> buffers_;
  std::vector<float> latencies_;
  std::atomic<std::uint64_t> issued_{0};
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<std::size_t> recorded_{0};
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;  // slots still working
  std::vector<std::size_t> pending_;
  std::string error_;
};

// A plugin's defaults, then `profile_values` (the profile's storage section, for the plugin it selects), then what
// iobench sets itself.
sdk::ConfigView storage_config(const registry::PluginInfo& plugin, int depth, const sdk::ConfigView* profile_values) {
  std::map<std::string, sdk::ConfigValue, std::less<>> values;
  for (const auto& o : plugin.options) {
    if (o.default_value == nullptr || *o.default_value == '\0') continue;
    if (auto v = sdk::parse_option_value(o, o.default_value)) values[o.name] = *v;
  }
  if (profile_values != nullptr) {
    for (const auto& [key, value] : profile_values->values()) values[key] = value;
  }
  values["direct_io"] = sdk::ConfigValue{true};
  values["queue_depth"] = sdk::ConfigValue{static_cast<std::int64_t>(depth)};
  values["paths"] = sdk::ConfigValue{std::vector<std::string>{}};
  return sdk::ConfigView(std::move(values));
}

// One measurement: a fresh Storage at this depth, the file opened cold.
Result measure(const registry::PluginRegistry& reg, const registry::PluginInfo& plugin,
               const sdk::ConfigView* profile_values, const TestFile& file, const std::string& test,
               std::uint64_t block, int depth, const IobenchOptions& opts, std::uint64_t file_size) {
  Result r;
  r.plugin = plugin.name;
  r.test = test;
  r.block = block;
  r.depth = depth;
  file.drop_cache();
  auto storage = reg.create_as<sdk::Storage>(plugin, storage_config(plugin, depth, profile_values));
  if (!storage) {
    r.error = storage.error().to_string();
    return r;
  }
  auto f = (*storage)->open(file.path().string());
  if (!f) {
    r.error = f.error().to_string();
    return r;
  }
  Driver driver(**storage, **f, block, depth);
  const std::uint64_t blocks = file_size / block;
  Driver::NextOffset next;
  Clock::duration budget;
  if (test == "seq") {
    next = [blocks, block](std::uint64_t i) -> std::optional<std::uint64_t> {
      if (i >= blocks) return std::nullopt;
      return i * block;
    };
    budget = std::chrono::hours(1);  // one whole pass
  } else if (!(*f)->direct_io()) {
    // Without O_DIRECT (mmap, or a file system that refuses it) a block read twice would come from the page cache
    // the first read filled: each block-sized slot is read at most once per point, in a shuffled order.
    auto order = std::make_shared<std::vector<std::uint64_t>>(blocks);
    for (std::uint64_t i = 0; i < blocks; ++i) (*order)[i] = i * block;
    std::shuffle(order->begin(), order->end(), std::mt19937_64(0x9E3779B97F4A7C15ull));
    next = [order](std::uint64_t i) -> std::optional<std::uint64_t> {
      if (i >= order->size()) return std::nullopt;
      return (*order)[i];
    };
    budget = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.seconds));
  } else {
    // Random 4 KiB-aligned offsets (expert files are 4 KiB aligned), never past the end.
    const std::uint64_t slots = (file_size - block) / 4096 + 1;
    next = [slots](std::uint64_t i) -> std::optional<std::uint64_t> {
      std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64: cheap, thread-safe, no state
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      x ^= x >> 31;
      return (x % slots) * 4096;
    };
    budget = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.seconds));
  }
  Result got = driver.run(next, budget);
  got.plugin = plugin.name;
  got.test = test;
  got.direct_io = (*f)->direct_io();
  return got;
}

std::string fmt(double v, int precision) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << v;
  return s.str();
}

int iobench(const GlobalOptions& global, const IobenchOptions& opts) {
  std::error_code ec;
  if (!fs::is_directory(opts.dir, ec))
    return fail("iobench: " + opts.dir + " is not a directory; name a directory on the disk to measure");
  auto size = sdk::parse_size(opts.size);
  if (!size) return usage_fail("iobench: --size " + opts.size + ": " + size.error().message());
  auto seq_block = sdk::parse_size(opts.seq_block);
  if (!seq_block || *seq_block == 0 || *seq_block % 4096 != 0) {
    return usage_fail("iobench: --seq-block " + opts.seq_block + " must be a positive multiple of 4K");
  }
  std::vector<std::uint64_t> blocks;
  for (const auto& b : split_commas(opts.block_sizes)) {
    auto v = sdk::parse_size(b);
    if (!v || *v == 0 || *v % 4096 != 0)
      return usage_fail("iobench: --block-sizes entry '" + b + "' must be a positive multiple of 4K (e.g. 4M,4K)");
    blocks.push_back(*v);
  }
  std::vector<int> depths;
  for (const auto& d : split_commas(opts.depths)) {
    char* end = nullptr;
    const long v = std::strtol(d.c_str(), &end, 10);
    if (end == d.c_str() || *end != '\0' || v < 1 || v > 1024)
      return usage_fail("iobench: --depths entry '" + d + "' must be 1..1024");
    depths.push_back(static_cast<int>(v));
  }
  if (blocks.empty() || depths.empty())
    return usage_fail("iobench: --block-sizes and --depths need at least one entry");
  if (opts.seconds <= 0 || opts.seconds > 600) return usage_fail("iobench: --seconds must be in (0, 600]");
  if (opts.seq_depth < 1 || opts.seq_depth > 1024) return usage_fail("iobench: --seq-depth must be 1..1024");
  const std::uint64_t largest = std::max(*std::max_element(blocks.begin(), blocks.end()), *seq_block);
  if (*size < largest) {
    return usage_fail("iobench: --size " + opts.size + " is smaller than the largest block (" +
                      sdk::format_size(largest) + "); give at least that, or smaller --block-sizes / --seq-block");
  }
  const std::uint64_t file_size = *size / largest * largest;
  struct statvfs vfs {};
  if (::statvfs(opts.dir.c_str(), &vfs) == 0) {
    const std::uint64_t avail = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < file_size + (64u << 20)) {
      return fail("iobench: " + opts.dir + " has " + sdk::format_size(avail) + " free; the test file needs " +
                  sdk::format_size(file_size) + " (use a smaller --size)");
    }
  }

  auto prof = global.load_profile();
  if (!prof) return global.profile_exit_code;
  const auto reg = registry::scan_for_profile(*prof);
  // The profile's storage settings (chunk_kib, sqpoll...) are those of the plugin it selects: that plugin is measured
  // with them, the others with their defaults. A value the plugin refuses is said here, as a run would say it; a
  // profile whose plugin is not usable here still lets the others be measured.
  const registry::PluginInfo* profile_plugin = nullptr;
  sdk::ConfigView profile_values;
  auto refused = [&](const sdk::Status& error) {
    const std::string m = "iobench: " + error.message();
    return apps::refused_value_of_command_line(*prof, error) ? usage_fail(m) : fail(m);
  };
  if (auto p = registry::resolve_plugin(*prof, reg, sdk::PluginKind::storage)) {
    profile_plugin = *p;
    profile_values = prof->section("storage");
    // Values out of the plugin's range are refused by its create(): once, here, rather than in every row.
    auto made = reg.create_as<sdk::Storage>(**p, storage_config(**p, 1, &profile_values));
    if (!made && made.error().code() == sdk::StatusCode::invalid_argument) {
      return refused(registry::with_value_origins(made.error(), *prof, "storage"));
    }
  } else if (p.error().code() == sdk::StatusCode::invalid_argument) {
    return refused(p.error());
  } else {
    spdlog::warn("iobench: the profile's storage plugin is not measured: {}", p.error().message());
  }
  std::vector<const registry::PluginInfo*> chosen;
  if (opts.plugins.empty()) {
    for (const auto& p : reg.plugins()) {
      const bool injector =
          std::find(p.capabilities.begin(), p.capabilities.end(), "fault_injection") != p.capabilities.end();
      if (p.kind == sdk::PluginKind::storage && p.score.value > 0 && !injector) chosen.push_back(&p);
    }
    if (chosen.empty()) return fail("iobench: no usable storage plugin was found (see `colibri-cli plugins list`)");
  } else {
    for (const auto& name : split_commas(opts.plugins)) {
      auto p = reg.select(sdk::PluginKind::storage, name);
      if (!p) return fail("iobench: --plugins " + name + ": " + p.error().message());
      chosen.push_back(*p);
    }
  }

  TestFile file(fs::path(opts.dir) / ("colibri-iobench-" + std::to_string(::getpid()) + ".bin"));
  if (!opts.json) std::cerr << "writing a " << sdk::format_size(file_size) << " test file in " << opts.dir << " ...\n";
  if (auto st = file.write(file_size); !st) return fail("iobench: " + st.message());

  std::vector<Result> results;
  auto report_row = [&](const Result& r) {
    if (opts.json) return;
    std::cout << std::left << std::setw(10) << r.plugin << std::setw(6) << r.test << std::right << std::setw(6)
              << sdk::format_size(r.block) << std::setw(7) << r.depth << std::setw(8) << (r.direct_io ? "yes" : "no")
              << std::setw(6) << (r.registered ? "yes" : "no");
    if (!r.error.empty()) {
      std::cout << "  error: " << r.error << "\n";
    } else {
      std::cout << std::setw(10) << fmt(r.mb_per_s(), 1) << std::setw(10) << fmt(r.iops(), 0) << std::setw(10)
                << fmt(r.mean_us, 0) << std::setw(10) << fmt(r.p99_us, 0) << "\n";
    }
    std::cout.flush();
  };
  if (!opts.json) {
    std::cout << "iobench " << opts.dir << ": " << sdk::format_size(file_size) << " file, O_DIRECT requested, "
              << opts.seconds
              << " s per random point, page cache dropped before each (DIRECT no: each block read once; REG: "
                 "into buffers registered with the plugin, as the expert cache's are)\n";
    if (profile_plugin != nullptr && std::find(chosen.begin(), chosen.end(), profile_plugin) != chosen.end()) {
      std::cout << profile_plugin->name << " with the profile's storage settings, "
                << (chosen.size() > 1 ? "the others with their defaults\n" : "\n");
    }
    std::cout << std::left << std::setw(10) << "PLUGIN" << std::setw(6) << "TEST" << std::right << std::setw(6)
              << "BLOCK" << std::setw(7) << "DEPTH" << std::setw(8) << "DIRECT" << std::setw(6) << "REG"
              << std::setw(10) << "MB/s" << std::setw(10) << "IOPS" << std::setw(10) << "mean_us" << std::setw(10)
              << "p99_us"
              << "\n";
  }
  for (const auto* plugin : chosen) {
    const sdk::ConfigView* settings = plugin == profile_plugin ? &profile_values : nullptr;
    results.push_back(measure(reg, *plugin, settings, file, "seq", *seq_block, opts.seq_depth, opts, file_size));
    report_row(results.back());
    for (std::uint64_t b : blocks) {
      for (int d : depths) {
        results.push_back(measure(reg, *plugin, settings, file, "rand", b, d, opts, file_size));
        report_row(results.back());
      }
    }
  }
  bool any_error = false;
  for (const auto& r : results) any_error |= !r.error.empty();
  if (opts.json) {
    nlohmann::json out;
    out["dir"] = opts.dir;
    out["file_size"] = file_size;
    out["seconds_per_point"] = opts.seconds;
    // The plugin measured with the profile's storage settings (the others: their defaults).
    out["profile_settings_plugin"] = profile_plugin != nullptr ? profile_plugin->name : "";
    out["results"] = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json j{{"plugin", r.plugin}, {"test", r.test},           {"block", r.block},
                       {"depth", r.depth},   {"direct_io", r.direct_io}, {"registered_buffers", r.registered},
                       {"reads", r.reads},   {"seconds", r.seconds}};
      if (r.error.empty()) {
        j["mb_per_s"] = r.mb_per_s();
        j["iops"] = r.iops();
        j["mean_us"] = r.mean_us;
        j["p99_us"] = r.p99_us;
      } else {
        j["error"] = r.error;
      }
      out["results"].push_back(j);
    }
    std::cout << out.dump(2) << "\n";
  }
  return any_error ? 1 : 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto opts = std::make_shared<IobenchOptions>();
  auto* cmd = app.add_subcommand("iobench",
                                 "Measure a disk through the storage plugins: sequential and random reads, O_DIRECT");
  cmd->add_option("DIR", opts->dir, "Directory on the disk to measure (a test file is written there and removed)")
      ->required();
  cmd->add_option("--size", opts->size, "Test file size (e.g. 1G, 512M)")->capture_default_str();
  cmd->add_option("--block-sizes", opts->block_sizes, "Random read sizes, comma-separated (expert size and 4K)")
      ->capture_default_str();
  cmd->add_option("--depths", opts->depths, "Queue depths, comma-separated")->capture_default_str();
  cmd->add_option("--plugins", opts->plugins, "Storage plugins to compare (default: every usable one)");
  cmd->add_option("--seconds", opts->seconds, "Duration of each random-read point")->capture_default_str();
  cmd->add_option("--seq-block", opts->seq_block, "Block size of the sequential pass")->capture_default_str();
  cmd->add_option("--seq-depth", opts->seq_depth, "Queue depth of the sequential pass")->capture_default_str();
  cmd->add_flag("--json", opts->json, "Machine-readable output");
  add_profile_selection(*cmd, global);
  cmd->callback([&global, opts] { global.exit_code = iobench(global, *opts); });
}

}  // namespace

COLIBRI_CLI_COMMAND(60, setup);

}  // namespace colibri::cli::iobench_command
