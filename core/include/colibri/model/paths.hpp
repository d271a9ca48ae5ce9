// Where models live: `--model` takes a model directory or a name under the models directory. Also the paths a model
// owns elsewhere: its directories on other disks, made by `colibri-cli model stripe`.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::model {

// $XDG_DATA_HOME/colibri/models, else ~/.local/share/colibri/models.
std::filesystem::path default_models_dir();

// A path to an existing directory is taken as is (relative to the working directory); otherwise a plain name
// (no '/') is looked up as <models_dir>/<name> (models_dir empty or "auto": default_models_dir()). The error
// names both places looked at.
sdk::Expected<std::filesystem::path> resolve_model_path(const std::string& name_or_path,
                                                        const std::filesystem::path& models_dir = {});

// Whether `path` is `dir` itself or lies inside it (equality counts: callers that refuse it check it first).
// Compared component by component after lexical normalization, without touching the file system (resolve symlinks
// first where they matter): "a/bc" is not inside "a/b", "a/b/../c" is not, "../x" is not inside ".", and a
// trailing separator on either side is ignored.
bool path_within(const std::filesystem::path& path, const std::filesystem::path& dir);

// `name` when it has at most `max_bytes` bytes; else its first bytes (cut at a UTF-8 character boundary), '~' and 8
// hex digits of a hash of the whole name, `max_bytes` long at most: for the names colibri derives from a directory's
// (hidden siblings, history files), which must stay within the file system's 255 bytes a name.
std::string shortened_name(const std::string& name, std::size_t max_bytes);

// An exclusive advisory lock (flock) on a model directory, held by the commands that change a model's files in place
// (convert --force over it, model stripe, model unstripe) while they run: two at once would leave a result that
// matches neither. Readers (run, the server) take none. Released when destroyed (or when the process ends).
class ModelLock {
 public:
  // Fails at once, naming the directory and what to do, when another process holds it.
  static sdk::Expected<ModelLock> acquire(const std::filesystem::path& model_dir);
  ModelLock(ModelLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ModelLock& operator=(ModelLock&& other) noexcept;
  ModelLock(const ModelLock&) = delete;
  ModelLock& operator=(const ModelLock&) = delete;
  ~ModelLock();

 private:
  explicit ModelLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// `model stripe` gives a model a directory of its own on each other disk, <DIR>/<model name>; this file in it names
// (first line) the model directory that owns it, so nothing of another model is ever removed or written over.
inline constexpr std::string_view kStripeMarker = ".colibri-stripe";

// The model directory a stripe directory's marker names; empty when it has no readable marker.
std::string stripe_owner(const std::filesystem::path& stripe_dir);

// Removes a stripe directory of `model_dir` (canonical) once its expert files are gone: the empty directories under
// experts/, then the marker and the directory itself when the marker is all that is left. A directory whose marker
// names another model (or none) is left alone, as is anything else found in it. Returns whether it is gone.
bool remove_emptied_stripe_dir(const std::filesystem::path& stripe_dir, const std::filesystem::path& model_dir);

// A stripe lists here, before its first copy, every directory it may copy into (one absolute path a line), and
// removes the file once stripe.yaml records the finished layout: the copies of an interrupted stripe (a `--copy`
// one leaves no symlink to them) stay findable by unstripe and convert --force.
inline constexpr std::string_view kStripePending = "stripe.pending";

// The stripe directories recorded for a model: those <model_dir>/stripe.yaml lists under storage.paths (the file
// alone, no environment), then those an unfinished stripe listed in <model_dir>/stripe.pending. Only absolute
// paths: `model stripe` writes those, any other is not one of its directories. Empty without either file; an error
// when one cannot be read.
sdk::Expected<std::vector<std::filesystem::path>> stripe_record_dirs(const std::filesystem::path& model_dir);

// Why a model file that does not open is missing, following its name: " is missing; re-run convert", or for a link
// `model stripe` left whose target is gone, the disk to mount (the data may be intact: converting again is not it).
std::string missing_file_reason(const std::filesystem::path& path);

// Why this process cannot read a model file that is there ("" when it can): the OS's words and the fix, permissions
// (converting again is not it). Checked at load, so a run does not stop half-way through an answer.
std::string unreadable_file_reason(const std::filesystem::path& path);

}  // namespace colibri::model
