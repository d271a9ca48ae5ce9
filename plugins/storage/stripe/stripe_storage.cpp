// storage/stripe: expert files spread over several directories (disks), each directory with its
// own reader threads so the disks work in parallel, and mirror copies as a fallback.
//
// Placement lookup. The directories are, in order: where the opened path itself is (the model
// directory), then every entry of `paths`. A file's path relative to the model is
//   - the part after `model_dir` when that option is set and the path lies under it,
//   - else the part from the last `experts` component on (experts/L007/E003.bin),
//   - else the file name,
// and it is looked up under each directory in that order. The first directory holding it is the
// primary copy, whose threads serve the file's reads; every later one is a mirror. A failed read
// (I/O error, short read of a truncated copy) is retried on the mirrors in order, and when one
// succeeds the caller gets the data and the host log a warning naming the failed copy. Copies of
// different sizes are all kept (a warning names both sizes): the file's size is the longest, and a
// read past a shorter copy's end fails there and goes to the next. A file missing from the model
// directory but found in another is read there with a warning.
//
// `colibri-cli model stripe` moves files to another directory and leaves a symlink in the model
// directory. A copy is served by the queue of the directory that really holds it: a symlink that
// resolves into one of `paths` reads on that directory's threads (a file itself, on those of the
// directory it was found in), and two candidates that resolve to the same file are one copy, not a
// file and its mirror. The host
// counter reads_dir<N>_total (0: the model directory, N: paths[N-1]) counts the reads each
// directory served, synchronous or queued (a split request counts its parts; a read a mirror
// served counts there; one every copy failed counts at the primary).
#include <algorithm>
#include <filesystem>

#include "colibri/sdk/storage_view.hpp"
#include "posix_read.hpp"

namespace {

using namespace colibri::sdk;
namespace sc = colibri::plugins::storage_common;
namespace fs = std::filesystem;

struct Copy {
  std::size_t member = 0;  // index into the directories: the one that really holds the file
  fs::path real;           // the file's path with every symlink resolved
  std::unique_ptr<sc::PosixFile> file;
  std::atomic<bool> warned{false};  // one warning per failing copy, not one per read
};

class StripeFile final : public StorageFile {
 public:
  StripeFile(std::string path, std::vector<std::unique_ptr<Copy>> copies)
      : path_(std::move(path)), copies_(std::move(copies)) {}
  // The longest copy's: a truncated primary must not hide the bytes its mirror still has (reads past its end fail
  // there and are served by the mirror).
  std::uint64_t size() const noexcept override {
    std::uint64_t n = 0;
    for (const auto& c : copies_) n = std::max(n, c->file->size());
    return n;
  }
  const std::string& path() const noexcept override { return path_; }
  bool direct_io() const noexcept override { return copies_.front()->file->direct_io(); }
  std::vector<std::unique_ptr<Copy>>& copies() noexcept { return copies_; }

 private:
  std::string path_;
  std::vector<std::unique_ptr<Copy>> copies_;  // primary first
};

// `path` relative to `dir` when it lies under it, else empty.
fs::path relative_under(const fs::path& path, const fs::path& dir) {
  const fs::path rel = path.lexically_normal().lexically_relative(dir.lexically_normal());
  return !rel.empty() && *rel.begin() != ".." ? rel : fs::path();
}

// The path of `path` relative to the model (see the header comment).
fs::path relative_to_model(const fs::path& path, const fs::path& model_dir) {
  if (!model_dir.empty()) {
    if (fs::path rel = relative_under(path, model_dir); !rel.empty()) return rel;
  }
  std::vector<fs::path> parts(path.begin(), path.end());
  for (std::size_t i = parts.size(); i-- > 0;) {
    if (parts[i] == "experts" && i + 1 < parts.size()) {
      fs::path rel;
      for (std::size_t j = i; j < parts.size(); ++j) rel /= parts[j];
      return rel;
    }
  }
  return path.filename();
}

class StripeStorage final : public StorageBase, public StorageCancel, public StorageCopies {
 public:
  static Expected<std::unique_ptr<StripeStorage>> create(const CreateContext& ctx) {
    const ConfigView& c = *ctx.config;
    auto direct = c.get_bool("direct_io", true);
    if (!direct) return direct.error();
    auto depth = c.get_int("queue_depth", 32);
    if (!depth) return depth.error();
    auto threads = c.get_int("threads_per_path", 0);
    if (!threads) return threads.error();
    if (*threads < 0 || *threads > 256) {
      return Status(StatusCode::invalid_argument, "storage.threads_per_path must be 0 (auto) or 1..256");
    }
    auto chunk = sc::chunk_bytes_option(c);
    if (!chunk) return chunk.error();
    auto model_dir = c.get_string("model_dir", "");
    if (!model_dir) return model_dir.error();
    std::vector<std::string> paths;
    if (c.contains("paths")) {
      auto p = c.get_string_list("paths");
      if (!p) return p.error();
      paths = *p;
    }
    for (std::size_t i = 0; i < paths.size(); ++i) {
      std::error_code ec;
      if (paths[i].empty() || !fs::is_directory(paths[i], ec)) {
        return Status(StatusCode::invalid_argument,
                      "storage.paths[" + std::to_string(i) + "] '" + paths[i] +
                          "' is not a directory; list the directories that hold expert files (or their mirrors)");
      }
    }
    // auto: the queue depth shared out over the disks, 1..8 threads each.
    const std::int64_t per =
        *threads > 0 ? *threads : std::clamp<std::int64_t>(*depth / static_cast<std::int64_t>(paths.size() + 1), 1, 8);
    return std::make_unique<StripeStorage>(*ctx.host, *direct, static_cast<int>(per), *chunk, std::move(paths),
                                           *model_dir);
  }

  StripeStorage(HostServices& host, bool direct, int threads, std::uint64_t chunk_bytes, std::vector<std::string> paths,
                std::string model_dir)
      : host_(host), direct_(direct), threads_(threads), model_dir_(std::move(model_dir)) {
    dirs_.push_back("");  // the model directory: wherever the opened path is
    for (auto& p : paths) dirs_.push_back(std::move(p));
    for (std::size_t i = 0; i < dirs_.size(); ++i) {
      std::error_code ec;
      fs::path real = i == 0 ? fs::path() : fs::weakly_canonical(dirs_[i], ec);
      real_dirs_.push_back(ec ? fs::path(dirs_[i]) : real);
      served_metric_.push_back("reads_dir" + std::to_string(i) + "_total");
      queues_.push_back(std::make_unique<sc::ReadQueue>(
          threads, [this](ReadRequest& r) { return read_request(r); }, chunk_bytes));
    }
  }

  ~StripeStorage() override { queues_.clear(); }  // workers stop before the members they use go away

  Expected<std::unique_ptr<StorageFile>> open(const std::string& path) noexcept override {
    try {
      const fs::path rel = relative_to_model(path, model_dir_);
      std::vector<std::unique_ptr<Copy>> copies;
      Status first_error;
      std::string looked;
      std::string primary_problem;  // why the model directory's own path did not open
      for (std::size_t m = 0; m < dirs_.size(); ++m) {
        const std::string candidate = m == 0 ? path : (fs::path(dirs_[m]) / rel).string();
        looked += (looked.empty() ? "" : ", ") + candidate;
        auto f = sc::open_posix(candidate, direct_, host_, warned_direct_);
        if (!f) {
          if (f.error().code() != StatusCode::not_found && first_error.is_ok()) first_error = f.error();
          if (m == 0) primary_problem = f.error().message();
          continue;
        }
        std::error_code ec;
        fs::path real = fs::canonical(candidate, ec);
        if (ec) real = fs::path(candidate).lexically_normal();
        if (std::any_of(copies.begin(), copies.end(), [&](const auto& c) { return c->real == real; })) {
          continue;  // a symlink to a copy already found: the same file, not a mirror
        }
        if (!copies.empty() && (*f)->size() != copies.front()->file->size()) {
          // Which one is whole is not known here (the engine checks the size against the manifest): reads past
          // the shorter copy's end fail there and are served by the longer one.
          host_.warn("copies of " + rel.string() + " differ in size: " + copies.front()->file->path() + " is " +
                     std::to_string(copies.front()->file->size()) + " bytes, " + candidate + " is " +
                     std::to_string((*f)->size()) + "; re-copy the wrong one (colibri-cli inspect --verify names it)");
        }
        auto copy = std::make_unique<Copy>();
        // A file itself (not a link) is served where it was found: a model directory inside a member is its own.
        copy->member = fs::is_symlink(candidate, ec) ? owner(real, m) : m;
        copy->real = std::move(real);
        copy->file = std::move(*f);
        copies.push_back(std::move(copy));
      }
      if (!copies.empty() && !primary_problem.empty() && dirs_.size() > 1) {
        host_.warn(primary_problem + "; reading its copy " + copies.front()->file->path() +
                   " instead (restore it, or run colibri-cli model stripe again)");
      }
      if (copies.empty()) {
        if (!first_error.is_ok()) return first_error;
        return Status(StatusCode::not_found, "cannot open " + path + ": " + rel.string() +
                                                 " is in none of the stripe directories (looked at " + looked + ")");
      }
      return std::unique_ptr<StorageFile>(new StripeFile(path, std::move(copies)));
    } catch (...) {
      return Status(StatusCode::out_of_memory, "opening " + path);
    }
  }

  // The directory whose queue serves the symlink `model stripe` left, whose target is `real`: the deepest member of
  // `paths` it lies under, else `found_in` (where it was looked up).
  std::size_t owner(const fs::path& real, std::size_t found_in) const {
    std::size_t best = found_in, depth = 0;
    for (std::size_t i = 0; i < real_dirs_.size(); ++i) {
      if (real_dirs_[i].empty() || relative_under(real, real_dirs_[i]).empty()) continue;
      if (real_dirs_[i].native().size() > depth) {
        best = i;
        depth = real_dirs_[i].native().size();
      }
    }
    return best;
  }

  void finished_one() noexcept {
    std::lock_guard lock(mu_);
    if (--outstanding_ == 0) idle_cv_.notify_all();
  }

  Status read(StorageFile& file, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    auto& f = static_cast<StripeFile&>(file);
    if (!sc::in_range(f, offset, dst.size())) return sc::range_error(f, offset, dst.size());
    auto& copies = f.copies();
    Status first = sc::read_posix(*copies.front()->file, offset, dst);
    if (first) {
      host_.counter_add(served_metric_[copies.front()->member], 1);
      host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
      return first;
    }
    for (std::size_t i = 1; i < copies.size(); ++i) {
      Status st = sc::read_posix(*copies[i]->file, offset, dst);
      if (!st) continue;
      host_.counter_add(served_metric_[copies[i]->member], 1);
      host_.counter_add("mirror_fallbacks_total", 1);
      host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
      if (!copies.front()->warned.exchange(true)) {
        host_.warn(first.to_string() + "; served from the mirror " + copies[i]->file->path() +
                   " (further failures of this copy are not logged; check the disk or re-copy the file)");
      }
      return st;
    }
    host_.counter_add(served_metric_[copies.front()->member], 1);
    host_.counter_add("read_errors_total", 1);
    if (copies.size() > 1)
      return first.with_context("every copy failed (" + std::to_string(copies.size()) + " copies)");
    return first;
  }

  void read_batch(std::span<ReadRequest> requests) noexcept override { sc::batch_via_submit(*this, requests); }

  // Each file's reads go to the threads of the directory holding its primary copy.
  Status submit(ReadRequest request, ReadCallback done) noexcept override {
    if (!done) return Status(StatusCode::invalid_argument, "submit() needs a completion callback");
    const std::size_t member =
        request.file == nullptr ? 0 : static_cast<StripeFile*>(request.file)->copies().front()->member;
    {
      std::lock_guard lock(mu_);
      ++outstanding_;
    }
    // Counted across directories, so drain() also waits for reads a callback submits elsewhere.
    Status st;
    try {
      st = queues_[member]->submit(request, [this, done = std::move(done)](ReadRequest& r) {
        done(r);
        finished_one();
      });
    } catch (...) {
      st = Status(StatusCode::out_of_memory, "queueing a read");
    }
    if (!st) finished_one();
    return st;
  }

  void drain() noexcept override {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return outstanding_ == 0; });
  }

  // Withdrawn from whichever directory's queue holds them; their wrapped callbacks keep the count right.
  bool cancel(std::uint64_t user_tag) noexcept override {
    bool any = false;
    for (auto& q : queues_) any = q->cancel(user_tag) || any;
    return any;
  }

  void* query_interface(std::string_view id) noexcept override {
    if (id == kStorageCancelInterface) return static_cast<StorageCancel*>(this);
    if (id == kStorageCopiesInterface) return static_cast<StorageCopies*>(this);
    return nullptr;
  }

  // The copies, primary first, for a host whose checksum refused the bytes read() returned.
  std::size_t copy_count(StorageFile& file) noexcept override { return static_cast<StripeFile&>(file).copies().size(); }
  Status read_copy(StorageFile& file, std::size_t index, std::uint64_t offset,
                   std::span<std::byte> dst) noexcept override {
    auto& copies = static_cast<StripeFile&>(file).copies();
    if (index >= copies.size()) {
      return Status(StatusCode::invalid_argument, "copy " + std::to_string(index) + " of " + file.path() +
                                                      " does not exist (it has " + std::to_string(copies.size()) + ")");
    }
    Status st = sc::read_posix(*copies[index]->file, offset, dst);
    if (st) {
      host_.counter_add(served_metric_[copies[index]->member], 1);
      host_.counter_add("bytes_read_total", static_cast<double>(dst.size()));
    }
    return st;
  }
  std::string copy_path(StorageFile& file, std::size_t index) noexcept override {
    auto& copies = static_cast<StripeFile&>(file).copies();
    return index < copies.size() ? copies[index]->file->path() : std::string();
  }

  StorageCapabilities capabilities() const noexcept override {
    StorageCapabilities c;
    c.direct_io = direct_;
    c.async = true;
    c.queue_depth = static_cast<std::uint32_t>(threads_ * static_cast<int>(dirs_.size()));
    c.alignment = sc::kDirectAlignment;
    return c;
  }

 private:
  HostServices& host_;
  bool direct_;
  int threads_;
  std::string model_dir_;
  std::vector<std::string> dirs_;
  std::vector<fs::path> real_dirs_;         // dirs_ with symlinks resolved (the model directory's: empty)
  std::vector<std::string> served_metric_;  // per directory: reads_dir<N>_total
  std::atomic<bool> warned_direct_{false};
  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::size_t outstanding_ = 0;
  std::vector<std::unique_ptr<sc::ReadQueue>> queues_;  // one per directory
};

Score score(const HostInfo&) noexcept {
  return {40, "spreads experts over storage.paths; worth it with several disks (name it in the profile)"};
}

const OptionSpec kOptions[] = {
    {"threads_per_path", OptionType::integer, "0",
     "reader threads per directory (0: queue_depth shared over the directories, 1..8 each)"},
    {"chunk_kib", OptionType::integer, "2048",
     "reads longer than this are split into chunks read by a directory's threads at once (0: never)"},
    {"model_dir", OptionType::string, "",
     "the model directory relative paths are taken from (empty: from the last 'experts' component)"},
};
const char* const kCapabilities[] = {"direct_io", "async", "priorities", "multi_path", "mirror_fallback"};

const PluginDescriptor kDescriptor{
    make_plugin_header(),
    PluginKind::storage,
    "stripe",
    "1.0.0",
    "experts spread over several directories, a queue per disk, mirror fallback",
    kOptions,
    kCapabilities,
    &score,
    &create_guarded<StripeStorage>,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
