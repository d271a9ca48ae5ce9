#include "colibri/model/paths.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "colibri/profile/profile.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/util/home.hpp"
#include "model/file_io.hpp"

namespace colibri::model {

namespace fs = std::filesystem;
using sdk::Status;
using sdk::StatusCode;

std::string shortened_name(const std::string& name, std::size_t max_bytes) {
  if (name.size() <= max_bytes || max_bytes < 10) return name;
  std::size_t keep = max_bytes - 9;  // '~' and 8 hex digits
  // Not inside a UTF-8 character: back up over its continuation bytes (top two bits 10).
  while (keep > 0 && (static_cast<unsigned char>(name[keep]) & 0xC0) == 0x80) --keep;
  return name.substr(0, keep) + "~" + io::hex64(XXH64(name.data(), name.size(), 0)).substr(8);
}

sdk::Expected<ModelLock> ModelLock::acquire(const fs::path& model_dir) {
  const int fd = ::open(model_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Status(err == ENOENT ? StatusCode::not_found : StatusCode::io_error,
                  "cannot open " + model_dir.string() + " to lock it: " + sdk::os_error_text(err));
  }
  int rc = 0;
  while ((rc = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EBADF || err == ENOLCK || err == EOPNOTSUPP || err == EINVAL || err == ENOSYS) {
      // NFS and SMB emulate flock with a write lock, which a directory (opened read-only) cannot take: such a file
      // system goes on without the lock, said once.
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        spdlog::warn(
            "cannot lock {} on this file system ({}); run one convert --force, model stripe or model "
            "unstripe of a model at a time there",
            model_dir.string(), sdk::os_error_text(err));
      }
      return ModelLock(-1);
    }
    if (err == EWOULDBLOCK) {
      return Status(StatusCode::io_error,
                    model_dir.string() +
                        " is being changed by another colibri command (convert --force, model stripe or model "
                        "unstripe); let it finish, then run this again",
                    /*retryable=*/true);
    }
    return Status(StatusCode::io_error, "cannot lock " + model_dir.string() + ": " + sdk::os_error_text(err));
  }
  return ModelLock(fd);
}

ModelLock& ModelLock::operator=(ModelLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ModelLock::~ModelLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

fs::path default_models_dir() {
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && xdg[0] == '/') {
    return fs::path(xdg) / "colibri" / "models";
  }
  const fs::path home = util::home_dir();
  return (home.empty() ? fs::path(".") : home) / ".local" / "share" / "colibri" / "models";
}

sdk::Expected<fs::path> resolve_model_path(const std::string& name_or_path, const fs::path& models_dir) {
  if (name_or_path.empty()) return Status(StatusCode::invalid_argument, "no model given (a directory or a model name)");
  std::error_code ec;
  const fs::path as_path(name_or_path);
  if (fs::is_directory(as_path, ec)) return fs::absolute(as_path, ec);
  const fs::path dir = models_dir.empty() || models_dir == "auto" ? default_models_dir() : models_dir;
  const bool plain_name = name_or_path.find('/') == std::string::npos && name_or_path != "." && name_or_path != "..";
  const fs::path candidate = dir / name_or_path;
  if (plain_name && fs::is_directory(candidate, ec)) return candidate;
  if (std::error_code link_ec; fs::is_symlink(fs::symlink_status(as_path, link_ec))) {
    // A link whose target is missing (an unmounted disk) or that loops: said as such, not as a missing model.
    std::error_code target_ec;
    (void)fs::status(as_path, target_ec);
    if (target_ec) {
      return Status(StatusCode::not_found,
                    "model " + as_path.string() + " is a link to " + fs::read_symlink(as_path, link_ec).string() +
                        " that does not resolve (" + target_ec.message() + "); fix or remove the link");
    }
  }
  if (fs::exists(as_path, ec)) {
    // A file where a model directory was expected: most often the GGUF or checkpoint file before conversion.
    return Status(StatusCode::invalid_argument,
                  as_path.string() + " is a file, not a colibri model directory; convert it first (colibri-cli " +
                      "convert --input " + as_path.string() + " --output DIR) and pass DIR");
  }
  if (plain_name) {
    return Status(StatusCode::not_found, "model '" + name_or_path + "' not found: no directory " + as_path.string() +
                                             " and no " + candidate.string() +
                                             " (convert one with colibri-cli convert --output " + candidate.string() +
                                             ")");
  }
  return Status(StatusCode::not_found, "model directory " + as_path.string() + " does not exist");
}

bool path_within(const fs::path& path, const fs::path& dir) {
  const fs::path p = path.lexically_normal(), d = dir.lexically_normal();
  if (p.is_absolute() != d.is_absolute()) return false;  // no common ground without the working directory
  // "." (what "a/.." becomes) has no components to match; empty ones are trailing separators.
  auto skip = [](const fs::path& c) { return c.empty() || c == "."; };
  auto pi = p.begin();
  while (pi != p.end() && skip(*pi)) ++pi;
  for (const auto& c : d) {
    if (skip(c)) continue;
    if (pi == p.end() || *pi != c) return false;
    ++pi;
    while (pi != p.end() && skip(*pi)) ++pi;
  }
  // A ".." left over climbs out of `dir` ("../.." is not inside ".."); normalized, ".." only leads a path.
  return pi == p.end() || *pi != "..";
}

std::string stripe_owner(const fs::path& stripe_dir) {
  const auto text = io::read_text(stripe_dir / kStripeMarker, 1 << 20);  // none, unreadable or no file: no owner
  if (!text) return {};
  return text->substr(0, text->find('\n'));
}

bool remove_emptied_stripe_dir(const fs::path& stripe_dir, const fs::path& model_dir) {
  const std::string owner = stripe_owner(stripe_dir);
  if (owner.empty() || fs::path(owner) != model_dir) return false;
  std::error_code ec;
  std::vector<fs::path> dirs;  // parents before children: removed in reverse, experts/L007 before experts
  for (auto it = fs::recursive_directory_iterator(stripe_dir / "experts", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code st;
    if (it->is_directory(st) && !it->is_symlink(st)) dirs.push_back(it->path());
  }
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) fs::remove(*d, ec);  // fails, harmlessly, unless empty
  fs::remove(stripe_dir / "experts", ec);
  std::size_t left = 0;
  for (auto it = fs::directory_iterator(stripe_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    ++left;
  }
  if (ec || left != 1 || !fs::remove(stripe_dir / kStripeMarker, ec)) return false;
  return fs::remove(stripe_dir, ec);
}

sdk::Expected<std::vector<fs::path>> stripe_record_dirs(const fs::path& model_dir) {
  const fs::path yaml = model_dir / "stripe.yaml";
  std::vector<fs::path> out;
  const auto add = [&out](const fs::path& p) {
    if (p.is_absolute() && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  std::error_code ec;
  if (fs::exists(fs::symlink_status(yaml, ec))) {
    profile::LoadOptions opts;
    opts.profile = yaml.string();
    opts.use_process_environment = false;  // the file alone, as written
    auto prof = profile::Profile::load(opts);
    if (!prof) return prof.error();
    for (const auto& p : prof->get_list("storage.paths")) add(p);
  }
  const fs::path pending = model_dir / kStripePending;
  if (fs::exists(fs::symlink_status(pending, ec))) {
    auto text = io::read_text(pending);  // a FIFO would block a plain read: refused by what it is
    if (!text && text.error().code() == StatusCode::invalid_argument) {
      return Status(StatusCode::invalid_argument,
                    pending.string() + " is " + sdk::path_kind_text(pending.string()) + ", not a file; remove it");
    }
    if (!text) return text.error();
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) add(line);
    }
  }
  return out;
}

std::string missing_file_reason(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_symlink(path, ec)) return " is missing; re-run convert";
  std::error_code follow;
  (void)std::filesystem::status(path, follow);
  if (follow == std::errc::too_many_symbolic_link_levels) {
    return " is a symbolic link that leads back to itself (" + std::filesystem::read_symlink(path, ec).string() +
           "); point it at the file, or re-run convert";
  }
  return " links to " + std::filesystem::read_symlink(path, ec).string() +
         ", which is missing (a stripe disk not mounted, or moved?); mount the disk at that path again, or point the "
         "link at the file's new place";
}

std::string unreadable_file_reason(const std::filesystem::path& path) {
  if (::access(path.c_str(), R_OK) == 0) return {};
  return " cannot be read: " + sdk::os_error_text(errno);
}

}  // namespace colibri::model
