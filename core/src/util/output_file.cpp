#include "colibri/util/output_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ext/stdio_filebuf.h>

#include "colibri/sdk/os_error.hpp"

namespace colibri::util {

namespace fs = std::filesystem;
using sdk::Status;
using sdk::StatusCode;

namespace {

// The file's buffer, keeping the errno of its first failed write: by commit() other calls have overwritten errno, and
// "No space left on device" must not read "Input/output error".
class FileBuf : public __gnu_cxx::stdio_filebuf<char> {
 public:
  explicit FileBuf(int fd) : __gnu_cxx::stdio_filebuf<char>(fd, std::ios::out | std::ios::binary) {}
  int first_error = 0;

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override { return noted(stdio_filebuf::xsputn(s, n), n); }
  int_type overflow(int_type c) override {
    const int_type r = stdio_filebuf::overflow(c);
    if (traits_type::eq_int_type(r, traits_type::eof()) && !traits_type::eq_int_type(c, traits_type::eof())) note();
    return r;
  }
  int sync() override {
    const int r = stdio_filebuf::sync();
    if (r != 0) note();
    return r;
  }

 private:
  std::streamsize noted(std::streamsize written, std::streamsize wanted) {
    if (written < wanted) note();
    return written;
  }
  void note() {
    if (first_error == 0) first_error = errno != 0 ? errno : EIO;
  }
};

// The partial files being written, for a signal handler: a fixed table (no allocation, no lock), each entry free,
// being filled, or ready. A process with more files open at once than entries just does not list the rest.
struct PartialEntry {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 ready
  bool tree = false;          // a directory, removed with all it holds
  char path[4096] = {};
};
constexpr int kPartialEntries = 16;
PartialEntry g_partials[kPartialEntries];

int register_partial(const fs::path& p, bool tree = false) {
  const std::string& text = p.native();
  if (text.size() >= sizeof(PartialEntry::path)) return -1;
  for (int i = 0; i < kPartialEntries; ++i) {
    int expected = 0;
    if (!g_partials[i].state.compare_exchange_strong(expected, 1)) continue;
    g_partials[i].tree = tree;
    std::memcpy(g_partials[i].path, text.c_str(), text.size() + 1);
    g_partials[i].state.store(2);
    return i;
  }
  return -1;
}

void unregister_partial(int& entry) {
  if (entry >= 0) g_partials[entry].state.store(0);
  entry = -1;
}

bool is_dot_or_dot_dot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// Removes what directory `name` (under `parent_fd`) holds with system calls only (openat, getdents64, unlinkat):
// async-signal-safe. Each pass reads the directory from its start, as removing entries while reading may skip some.
void remove_contents_signal_safe(int parent_fd, const char* name, int depth) {
  if (depth > 32) return;
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  alignas(struct dirent64) char buf[8192];
  for (int pass = 0; pass < 64; ++pass) {
    bool removed = false;
    ::lseek(fd, 0, SEEK_SET);
    for (;;) {
      const ssize_t n = ::getdents64(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
        off += d->d_reclen;
        if (is_dot_or_dot_dot(d->d_name)) continue;
        if (::unlinkat(fd, d->d_name, 0) != 0 && (errno == EISDIR || errno == EPERM)) {
          remove_contents_signal_safe(fd, d->d_name, depth + 1);
          ::unlinkat(fd, d->d_name, AT_REMOVEDIR);
        }
        removed = true;
      }
    }
    if (!removed) break;
  }
  ::close(fd);
}

}  // namespace

RemovedOnSignal::RemovedOnSignal(const fs::path& path, Removal removal)
    : registered_(register_partial(path, removal == Removal::tree)) {}

RemovedOnSignal::~RemovedOnSignal() {
  unregister_partial(registered_);
}

void remove_partial_files_signal_safe() noexcept {
  for (auto& e : g_partials) {
    if (e.state.load() != 2) continue;
    if (e.tree) {
      remove_contents_signal_safe(AT_FDCWD, e.path, 0);
      ::rmdir(e.path);
    } else {
      ::unlink(e.path);
    }
  }
}

sdk::Expected<OutputFile> OutputFile::open(const fs::path& path) {
  OutputFile f;
  f.target_ = path;
  std::error_code ec;
  const auto st = fs::status(path, ec);  // through any links
  if (fs::is_directory(st)) {
    return Status(StatusCode::invalid_argument, path.string() + " is a directory; give a file name");
  }
  // A device or FIFO, and any name under /dev or /proc (the caller's descriptors, even /dev/stdout redirected to a
  // file), is opened by its own name: the kernel follows links such as /dev/stdout -> /proc/self/fd/1 -> pipe:[...],
  // which no path resolution could, and nothing there is replaced.
  const std::string text = path.lexically_normal().string();
  const bool special = text.rfind("/dev/", 0) == 0 || text.rfind("/proc/", 0) == 0;
  f.direct_ = special || (fs::exists(st) && !fs::is_regular_file(st));
  if (!f.direct_ && fs::is_symlink(fs::symlink_status(path, ec))) {
    // Replace the file the link names, not the link (it may not exist yet: a dangling link).
    const fs::path resolved = fs::weakly_canonical(path, ec);
    if (ec) return Status(StatusCode::io_error, "cannot resolve the link " + path.string() + ": " + ec.message());
    f.target_ = resolved;
  }
  f.partial_ = f.direct_ ? f.target_ : fs::path(f.target_.string() + ".partial");
  // Listed for the signal handler before it exists: a Ctrl-C between its creation and the listing would leave it.
  if (!f.direct_) f.registered_ = register_partial(f.partial_);
  int fd = -1;
  if (f.direct_) {
    fd = ::open(f.partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  } else {
    // Made afresh: a planted link at the .partial name would otherwise redirect the write to the file it names. If
    // another name appears between the unlink and the open, O_EXCL refuses it.
    if (::unlink(f.partial_.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      // A read-only file system refuses the unlink of a name that is not there too: no leftover to speak of.
      struct stat there {};
      if (::lstat(f.partial_.c_str(), &there) != 0) {
        return Status(StatusCode::io_error, "cannot write " + path.string() + ": " + sdk::os_error_text(err));
      }
      return Status(StatusCode::io_error, "cannot replace " + f.partial_.string() +
                                              " (a leftover of an earlier run): " + sdk::os_error_text(err));
    }
    fd = ::open(f.partial_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  }
  if (fd < 0) return Status(StatusCode::io_error, "cannot write " + path.string() + ": " + sdk::os_error_text(errno));
  f.fd_ = fd;
  f.buf_ = std::make_unique<FileBuf>(fd);
  f.out_ = std::make_unique<std::ostream>(f.buf_.get());
  return f;
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : target_(std::move(other.target_)),
      partial_(std::move(other.partial_)),
      registered_(other.registered_),
      fd_(other.fd_),
      buf_(std::move(other.buf_)),
      out_(std::move(other.out_)),
      direct_(other.direct_),
      committed_(other.committed_) {
  other.committed_ = true;  // the moved-from object owns nothing to remove
  other.registered_ = -1;
  other.fd_ = -1;
}

OutputFile::~OutputFile() {
  if (committed_ || direct_) return;
  out_.reset();
  buf_.reset();  // closes the file
  std::error_code ec;
  fs::remove(partial_, ec);
  unregister_partial(registered_);
}

int OutputFile::write_errno() const {
  return buf_ ? static_cast<const FileBuf*>(buf_.get())->first_error : 0;
}

Status OutputFile::commit() {
  out_->flush();
  const bool ok = static_cast<bool>(*out_);
  const int err = static_cast<FileBuf*>(buf_.get())->first_error;
  if (!ok) {
    return Status(StatusCode::io_error,
                  "writing " + target_.string() + " failed: " + sdk::os_error_text(err != 0 ? err : EIO));
  }
  // On disk before the rename: after a crash the path holds the old bytes or the new, never an empty file.
  if (!direct_ && ::fsync(fd_) != 0) {
    const int why = errno;
    return Status(StatusCode::io_error, "cannot flush " + partial_.string() + " to disk: " + sdk::os_error_text(why));
  }
  out_.reset();
  const bool closed = static_cast<FileBuf*>(buf_.get())->close() != nullptr;
  const int close_err = errno;
  buf_.reset();
  if (!closed) {
    return Status(StatusCode::io_error,
                  "writing " + target_.string() + " failed: " + sdk::os_error_text(close_err != 0 ? close_err : EIO));
  }
  if (!direct_) {
    std::error_code ec;
    fs::rename(partial_, target_, ec);
    if (ec) {
      return Status(StatusCode::io_error,
                    "cannot rename " + partial_.string() + " to " + target_.string() + ": " + ec.message());
    }
    unregister_partial(registered_);
  }
  committed_ = true;
  return {};
}

Status write_file_atomically(const fs::path& path, const std::function<bool(std::ostream&)>& body) {
  auto f = OutputFile::open(path);
  if (!f) return f.error();
  if (!body(f->stream()) || !f->stream()) {
    const int err = f->write_errno();
    return Status(StatusCode::io_error,
                  "writing " + path.string() + " failed: " + sdk::os_error_text(err != 0 ? err : EIO));
  }
  return f->commit();
}

}  // namespace colibri::util
