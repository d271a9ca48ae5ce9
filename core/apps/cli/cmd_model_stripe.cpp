// colibri-cli model stripe MODEL --to DIR2[,DIR3...] [--copy]; colibri-cli model unstripe MODEL
// Spreads a converted model's expert files round-robin over the model directory and DIR2/<model name>.. (one member
// each in turn; the model directory keeps its share), for the stripe storage plugin. Each model gets a directory of
// its own on every disk, claimed by a .colibri-stripe file naming the model, so models striped to one disk never
// write over each other.
//   default  each file given to another directory is copied there, checked against the manifest's xxh64, fsynced
//            and renamed into place; only then is the original replaced (atomically) by a symlink to the copy, so
//            the model directory still lists every file (load_manifest checks them) while the bytes live on the
//            other disk. A crash at any point leaves every path naming a complete file; re-running resumes.
//   --copy   keeps the originals: the copies are mirrors the stripe plugin falls back to when a read fails.
// Striping again over other directories moves every file to its new place (the model directory's share back into
// it). Only once the new layout is complete and recorded do the copies an earlier stripe left where the new one does
// not put them go (mirrors on disks no longer named, with their emptied directories): a failure midway leaves the
// old layout runnable. Only directories whose marker names this model are touched. The placement is recorded as a
// profile next to the model, <MODEL>/stripe.yaml (storage.plugin: stripe, storage.paths: [DIR2/<model name>, ...]);
// run with --profile <MODEL>/stripe.yaml; until then <MODEL>/stripe.pending lists the directories copied into, so
// unstripe finds what an interrupted stripe left. Unstriping is striping over no other directory: every file comes home
// (a checked copy replacing its symlink), then the copies elsewhere and stripe.yaml go.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/util/output_file.hpp"
#include "command.hpp"

namespace colibri::cli::model_stripe_command {
namespace {

namespace fs = std::filesystem;

bool on_same_filesystem(const fs::path& a, const fs::path& b) {
  struct stat sa = {}, sb = {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev;
}

struct StripeOptions {
  std::string model;
  std::string to;
  bool copy = false;
  bool undo = false;  // model unstripe: every file back into the model directory, stripe.yaml gone
};

bool fsync_path(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// Copies src to dst via dst.partial: checks the bytes against the manifest's hash, fsyncs, renames.
std::string copy_checked(const fs::path& src, const fs::path& dst, const model::FileEntry& fe) {
  std::error_code ec;
  fs::create_directories(dst.parent_path(), ec);
  if (ec) return "cannot create " + dst.parent_path().string() + ": " + ec.message();
  const fs::path tmp = dst.string() + ".partial";
  const util::RemovedOnSignal removed_on_ctrl_c(tmp);  // Ctrl-C mid-copy leaves no .partial on the other disk
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return "cannot open " + src.string() + ": " + std::strerror(errno);
  const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    const std::string why = std::strerror(errno);
    ::close(in);
    return "cannot write " + tmp.string() + ": " + why;
  }
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  std::vector<char> buf(4 << 20);
  std::string err;
  std::uint64_t total = 0;
  while (err.empty()) {
    const auto n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = "reading " + src.string() + " failed: " + std::strerror(errno);
    if (n <= 0) break;
    XXH64_update(h, buf.data(), static_cast<std::size_t>(n));
    total += static_cast<std::uint64_t>(n);
    for (ssize_t done = 0; done < n && err.empty();) {
      const auto w = ::write(out, buf.data() + done, static_cast<std::size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) err = "writing " + tmp.string() + " failed: " + std::strerror(errno);
      if (w > 0) done += w;
    }
  }
  const auto hash = XXH64_digest(h);
  XXH64_freeState(h);
  ::close(in);
  if (err.empty() && (total != fe.size || hash != fe.checksum)) {
    err = src.string() + " does not match manifest.json (size or xxh64); restore it or re-run convert";
  }
  if (err.empty() && ::fsync(out) != 0) err = "cannot flush " + tmp.string() + ": " + std::strerror(errno);
  if (::close(out) != 0 && err.empty()) err = "cannot close " + tmp.string() + ": " + std::strerror(errno);
  if (err.empty()) {
    fs::rename(tmp, dst, ec);
    if (ec) err = "cannot rename " + tmp.string() + " to " + dst.string() + ": " + ec.message();
  }
  if (!err.empty()) {
    fs::remove(tmp, ec);
    return err;
  }
  fsync_path(dst.parent_path(), O_RDONLY | O_DIRECTORY);
  return {};
}

// The file a path names: itself, or what its symlink (an earlier stripe) points to.
fs::path real_file(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::canonical(p, ec);
  return ec ? p : r;
}

// Claims <dir>/<name> for this model: the marker file inside names the model that owns it, so two models striped
// to one disk each get their own directory and never write over each other's files.
std::string claim_member(const fs::path& member, const fs::path& model_dir) {
  const fs::path marker = member / model::kStripeMarker;
  std::error_code ec;
  if (fs::exists(marker, ec)) {
    const std::string owner = model::stripe_owner(member);
    if (owner == model_dir.string()) return {};
    return "--to: " + member.string() + " holds the expert files of " + owner + " (" + marker.string() +
           " says so); name another directory";
  }
  if (fs::exists(member, ec) && !fs::is_empty(member, ec)) {
    return "--to: " + member.string() + " exists and is not a stripe directory of this model (no " + marker.string() +
           "); move it away or name another directory";
  }
  fs::create_directories(member, ec);
  if (ec) return "--to: cannot create " + member.string() + ": " + ec.message();
  if (auto s = util::write_file_atomically(marker,
                                           [&](std::ostream& f) {
                                             f << model_dir.string() << "\n";
                                             return static_cast<bool>(f);
                                           });
      !s) {
    return s.message();
  }
  return {};
}

// Removes the copy an earlier stripe left at <root>/<rel>, once the model's path names its new place, when <root> is
// a stripe directory of this model (a symlink the user made elsewhere keeps its file). Returns <root>, to be removed
// once emptied after the new layout is recorded; empty when nothing went. A stripe directory whose marker names
// another path (the model was renamed or moved since) keeps its copy and goes into `foreign`, to be said.
fs::path remove_old_copy(const fs::path& old_real, const std::string& rel, const fs::path& model_dir,
                         std::map<fs::path, std::string>& foreign) {
  const std::string suffix = "/" + rel;
  const std::string s = old_real.string();
  if (s.size() <= suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix) != 0) return {};
  if (model::path_within(old_real, model_dir)) return {};
  const fs::path root = s.substr(0, s.size() - suffix.size());
  if (const std::string owner = model::stripe_owner(root); fs::path(owner) != model_dir) {
    if (!owner.empty()) foreign.emplace(root, owner);
    return {};
  }
  std::error_code ec;
  if (!fs::remove(old_real, ec)) return {};
  return root;
}

// The directories the model's stripe.yaml names: the layout this run replaces (--copy leaves no symlinks to find
// its mirrors by). None without a readable stripe.yaml.
std::vector<fs::path> earlier_members(const fs::path& model_dir) {
  auto dirs = model::stripe_record_dirs(model_dir);
  if (!dirs) {
    std::cerr << "warning: cannot read where an earlier stripe of " << model_dir.string() << " put copies ("
              << dirs.error().message()
              << "); copies it left on disks this run does not name stay there: remove them yourself\n";
    return {};
  }
  return *dirs;
}

// Once the new layout is complete and recorded: in every stripe directory of this model (`members`, the new ones;
// `earlier`, those of the old layout), each expert file that is not the file's new place goes, then the directories
// no longer named once emptied. `place`: the member (1-based; 0 the model directory) each file now lives in.
// Returns how many files went.
std::size_t remove_stale_copies(const fs::path& model_dir, const std::vector<fs::path>& members,
                                const std::set<fs::path>& earlier, const std::map<std::string, std::size_t>& place,
                                std::map<fs::path, std::string>& foreign) {
  std::vector<std::pair<fs::path, std::size_t>> dirs;  // (directory, member number; 0: no longer named)
  for (std::size_t k = 0; k < members.size(); ++k) dirs.emplace_back(members[k], k + 1);
  std::set<fs::path> gone;
  for (const auto& e : earlier) {
    std::error_code ec;
    const fs::path d = fs::weakly_canonical(e, ec);
    if (ec || !fs::is_directory(d, ec) || gone.count(d) > 0) continue;
    if (model::path_within(d, model_dir) || model::path_within(model_dir, d)) continue;
    bool named = false;
    for (const auto& m : members) named = named || fs::equivalent(d, m, ec);
    if (named) continue;
    gone.insert(d);
    dirs.emplace_back(d, 0);
  }
  std::size_t removed = 0;
  for (const auto& [d, k] : dirs) {
    // Another model's, or the user's, or this model's under the path it had before a rename: kept, and a directory
    // of the old layout that holds copies is said to be (its stripe.yaml, the record of it, may be about to go).
    if (const std::string owner = model::stripe_owner(d); fs::path(owner) != model_dir) {
      const bool holds_copies = std::any_of(place.begin(), place.end(), [&](const auto& file) {
        std::error_code exists_ec;
        return fs::exists(d / file.first, exists_ec);
      });
      if (k == 0 && !owner.empty() && holds_copies) foreign.emplace(d, owner);
      continue;
    }
    for (const auto& [rel, at] : place) {
      const fs::path p = d / rel;
      std::error_code ec;
      fs::remove(p.string() + ".partial", ec);  // what a crashed copy left
      if ((k != 0 && at == k) || !fs::exists(fs::symlink_status(p, ec))) continue;
      if (fs::equivalent(p, model_dir / rel, ec)) continue;  // the bytes the model reads, however reached
      if (fs::remove(p, ec)) {
        ++removed;
      } else if (ec) {
        std::cerr << "warning: cannot remove " << p.string() << ", an old copy of " << rel << ": " << ec.message()
                  << "; delete it yourself\n";
      }
    }
  }
  for (const auto& d : gone) model::remove_emptied_stripe_dir(d, model_dir);
  return removed;
}

// Replaces `path` by a symlink to `target` in one rename: the path always names a complete file.
std::string link_to(const fs::path& path, const fs::path& target) {
  std::error_code ec;
  const fs::path link = path.string() + ".stripe-link";
  const util::RemovedOnSignal removed_on_ctrl_c(link);
  fs::remove(link, ec);
  fs::create_symlink(target, link, ec);
  if (ec) return "cannot create symlink " + link.string() + ": " + ec.message();
  fs::rename(link, path, ec);
  if (ec) return "cannot replace " + path.string() + " by a symlink: " + ec.message();
  fsync_path(path.parent_path(), O_RDONLY | O_DIRECTORY);
  return {};
}

int run_stripe(const GlobalOptions& global, const StripeOptions& o) {
  auto prof = global.load_profile();
  if (!prof) return global.profile_exit_code;
  if (auto s = registry::check_plugin_keys(*prof, registry::scan_for_profile(*prof)); !s) return fail(s.message());
  auto dir_r = model::resolve_model_path(o.model, prof->get_string("models.dir"));
  if (!dir_r) return fail(dir_r.error().message());
  std::error_code ec;
  const fs::path dir = fs::canonical(*dir_r, ec);
  if (ec) return fail("cannot resolve " + dir_r->string() + ": " + ec.message());
  // The marker on the other disks names the model by its path on one line (stripe_owner reads the first).
  if (dir.string().find('\n') != std::string::npos) {
    return fail("the path of " + dir.string() +
                " holds a line break, which the marker on the other disks cannot record; rename the directory");
  }
  // One command at a time changes a model's files: a stripe and an unstripe (or a convert --force) at once would
  // both report success on a result that matches neither.
  auto lock = model::ModelLock::acquire(dir);
  if (!lock) return fail(lock.error().message());
  auto m = model::load_manifest(dir);
  if (!m) return fail(m.error().message());
  // Each --to directory gets a directory of this model's own, <DIR>/<model name>. Unstriping names none: every
  // file's place is the model directory.
  std::vector<fs::path> members;
  std::stringstream ss(o.undo ? std::string() : o.to);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    // Not created here: a mistyped path, or the mount point of a disk that is not mounted, would put the experts
    // on the model's own disk.
    if (!fs::is_directory(item, ec)) {
      return fail("--to: " + item + " is not a directory; create it (or mount its disk) first");
    }
    const fs::path d = fs::canonical(item, ec);
    if (ec) return fail("--to: cannot resolve " + item + ": " + ec.message());
    if (d == dir) return usage_fail("--to: " + item + " is the model directory itself; name other directories");
    if (model::path_within(d, dir)) {
      return usage_fail("--to: " + item + " is inside the model directory; name directories on other disks");
    }
    if (model::path_within(dir, d)) {
      return usage_fail("--to: " + item + " contains the model directory; name directories on other disks");
    }
    // Another model's directory: what went in would be files that model does not list (convert --force refuses it).
    if (fs::exists(d / "manifest.json", ec)) {
      return fail("--to: " + item + " is the directory of a model (it holds manifest.json); name another directory");
    }
    if (on_same_filesystem(d, dir)) {
      std::cerr << "note: " << item << " is on the model's own filesystem; striping reads faster only across disks\n";
    }
    const fs::path member = d / dir.filename();
    for (const auto& seen : members) {
      if (seen == member) return usage_fail("--to names " + item + " twice");
    }
    members.push_back(member);
  }
  if (members.empty() && !o.undo) return usage_fail("--to names no directory (write --to DIR2[,DIR3...])");
  // Its expert files become links (or come back) and stripe.yaml is written there: a model that cannot be changed
  // is said before anything is made on the other disks.
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return fail("cannot change " + dir.string() + " (" + sdk::os_error_text(errno) + "); " +
                (o.undo ? "unstriping" : "striping") + " moves its expert files and writes stripe.yaml there");
  }
  for (const auto& member : members) {
    if (auto err = claim_member(member, dir); !err.empty()) return fail(err);
  }
  std::set<std::string> expert_files;
  for (const auto& e : m->experts) expert_files.insert(e.file);
  std::set<fs::path> earlier;  // stripe directories of the old layout, cleaned up once the new one is recorded
  const fs::path profile_path = dir / "stripe.yaml";
  const fs::path pending_path = dir / model::kStripePending;
  if (o.undo && !fs::exists(profile_path, ec) && !fs::exists(fs::symlink_status(pending_path, ec)) &&
      std::none_of(expert_files.begin(), expert_files.end(), [&](const std::string& rel) {
        std::error_code link_ec;
        return fs::is_symlink(dir / rel, link_ec);
      })) {
    std::cout << dir.string() << " is not striped (no stripe.yaml, every expert file in it): nothing to do\n";
    return 0;
  }
  for (const auto& e : earlier_members(dir)) earlier.insert(e);
  if (!o.undo) {
    // Before the first copy: every directory this run may copy into, and those of earlier runs, so an interruption
    // anywhere leaves its copies findable (a --copy stripe makes no symlink to them until the end).
    std::set<fs::path> recorded(earlier.begin(), earlier.end());
    recorded.insert(members.begin(), members.end());
    if (auto s = util::write_file_atomically(pending_path,
                                             [&](std::ostream& f) {
                                               for (const auto& d : recorded) f << d.string() << "\n";
                                               return static_cast<bool>(f);
                                             });
        !s) {
      return fail(s.message());
    }
  }
  std::map<std::string, std::size_t> place;
  std::vector<std::size_t> placed(members.size() + 1, 0);
  std::size_t i = 0, old_copies = 0;
  std::map<fs::path, std::string> foreign;  // stripe directories of the old layout that name another model path
  const auto say_foreign = [&] {
    for (const auto& [root, owner] : foreign) {
      std::cerr << "note: kept the copies in " << root.string() << ": its " << model::kStripeMarker << " names "
                << owner << ", not " << dir.string()
                << " (renamed or moved since it was striped?); delete them once no model uses them\n";
    }
  };
  // A failure midway says what state the model is in: the user must not take the error for a broken model.
  const auto fail_midway = [&](const std::string& err) {
    if (i <= 1) return fail(err);
    return fail(err + "\n  " + std::to_string(i - 1) + " of " + std::to_string(expert_files.size()) +
                " expert files were placed already; every path of the model still names a complete file, so it " +
                "runs as before. Mend the cause and run the same command again: it resumes.");
  };
  for (const auto& rel : expert_files) {
    const std::size_t member = i++ % (members.size() + 1);
    ++placed[member];
    place[rel] = member;
    const auto* fe = m->file(rel);
    if (fe == nullptr) return fail("manifest.json lists expert file " + rel + " without a files entry; re-run convert");
    const fs::path src = dir / rel;
    // A file an earlier stripe moved is a symlink; its bytes are wherever that points.
    const bool was_link = fs::is_symlink(src, ec);
    const fs::path old_real = real_file(src);
    const fs::path dst = member > 0 ? members[member - 1] / rel : fs::path();
    if (member > 0) {
      if (!(fs::exists(dst, ec) && fs::equivalent(old_real, dst, ec))) {
        if (auto err = copy_checked(src, dst, *fe); !err.empty()) return fail_midway(err);
      }
      if (!o.copy && !(was_link && fs::equivalent(src, dst, ec))) {
        if (auto err = link_to(src, dst); !err.empty()) return fail_midway(err);
      }
    }
    // The model directory keeps a real file for its own share, and for every file when the copies are mirrors.
    if ((member == 0 || o.copy) && was_link) {
      if (auto err = copy_checked(src, src, *fe); !err.empty()) return fail_midway(err);
    }
    if (was_link && real_file(src) != old_real && (dst.empty() || real_file(dst) != old_real)) {
      if (auto root = remove_old_copy(old_real, rel, dir, foreign); !root.empty()) {
        earlier.insert(root);
        ++old_copies;
      }
    }
  }
  if (o.undo) {
    // The copies elsewhere go before stripe.yaml, which names where they were: a failure between leaves a model
    // whose files are all home and a record by which the same command finishes the job.
    old_copies += remove_stale_copies(dir, members, earlier, place, foreign);
    fs::remove(pending_path, ec);
    if (ec) return fail("cannot remove " + pending_path.string() + ": " + ec.message());
    const bool had_profile = fs::remove(profile_path, ec);
    if (ec) return fail("cannot remove " + profile_path.string() + ": " + ec.message());
    fsync_path(dir, O_RDONLY | O_DIRECTORY);
    say_foreign();
    std::cout << "unstriped " << expert_files.size() << " expert files: every one is in " << dir.string() << " again";
    if (old_copies > 0) std::cout << "; removed " << old_copies << " copies from the other disks";
    std::cout << "\n";
    if (had_profile) std::cout << profile_path.string() << " is gone: run without it (the default storage plugin)\n";
    return 0;
  }
  // The placement, as a profile the stripe plugin reads.
  if (auto s = util::write_file_atomically(
          profile_path,
          [&](std::ostream& f) {
            f << "# Written by colibri-cli model stripe: expert files of this model spread over these directories.\n"
              << "description: "
              << profile::yaml_scalar(dir.filename().string() + " striped over " + std::to_string(members.size() + 1) +
                                      " directories" + (o.copy ? " (mirrors)" : ""))
              << "\nstorage:\n  plugin: stripe\n  paths:\n";
            for (const auto& d : members) f << "    - " << profile::yaml_scalar(d.string()) << "\n";
            return static_cast<bool>(f);
          });
      !s) {
    return fail_midway(s.message());
  }
  old_copies += remove_stale_copies(dir, members, earlier, place, foreign);
  fs::remove(pending_path, ec);  // stripe.yaml is the record now
  if (ec) {
    std::cerr << "warning: cannot remove " << pending_path.string() << ": " << ec.message() << "; delete it yourself\n";
  }
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
  say_foreign();
  std::cout << (o.copy ? "mirrored " : "striped ") << expert_files.size() << " expert files: " << placed[0]
            << " stay in " << dir.string();
  for (std::size_t k = 0; k < members.size(); ++k) {
    std::cout << ", " << placed[k + 1] << (o.copy ? " copied to " : " moved to ") << members[k].string();
  }
  if (old_copies > 0) std::cout << "; removed " << old_copies << " copies an earlier stripe had placed elsewhere";
  std::cout << "\nplacement: " << profile_path.string() << " (run with --profile " << profile_path.string() << ")\n";
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  CLI::App* model_cmd = nullptr;
  for (auto* sub : app.get_subcommands([](CLI::App* a) { return a->get_name() == "model"; })) model_cmd = sub;
  if (model_cmd == nullptr) model_cmd = app.add_subcommand("model", "Operations on a converted model");
  model_cmd->require_subcommand(1);
  auto o = std::make_shared<StripeOptions>();
  auto* cmd = model_cmd->add_subcommand(
      "stripe", "Spread expert files over several directories (disks) for the stripe storage plugin");
  cmd->add_option("model,-m,--model", o->model, "Model directory, or a name under models.dir")->required();
  cmd->add_option("--to", o->to, "Other directories, comma-separated: DIR2[,DIR3...]")->required();
  cmd->add_flag("--copy", o->copy, "Copy instead of move: the copies become mirrors (fallback on read errors)");
  add_profile_selection(*cmd, global);
  cmd->callback([&global, o] { global.exit_code = run_stripe(global, *o); });
  auto u = std::make_shared<StripeOptions>();
  u->undo = true;
  auto* undo = model_cmd->add_subcommand(
      "unstripe", "Bring a striped model's expert files back into its directory; remove stripe.yaml and the copies");
  undo->add_option("model,-m,--model", u->model, "Model directory, or a name under models.dir")->required();
  add_profile_selection(*undo, global);
  undo->callback([&global, u] { global.exit_code = run_stripe(global, *u); });
}

COLIBRI_CLI_COMMAND(45, setup);

}  // namespace
}  // namespace colibri::cli::model_stripe_command
