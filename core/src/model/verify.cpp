#include "colibri/model/verify.hpp"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/sdk/os_error.hpp"
#include "model/file_io.hpp"

namespace colibri::model {

namespace fs = std::filesystem;

VerifyReport verify_model(const fs::path& dir, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  VerifyReport report;
  auto m = load_manifest(dir);
  if (!m) {
    // Size and presence problems are reported per file below when the manifest itself parses.
    std::error_code ec;
    auto parsed = [&]() -> sdk::Expected<Manifest> {
      auto text = io::read_text(dir / "manifest.json");
      if (!text) return text.error();
      try {
        return parse_manifest(nlohmann::json::parse(*text), (dir / "manifest.json").string());
      } catch (const std::exception& e) {
        return sdk::Status(sdk::StatusCode::corrupt_data, std::string("manifest.json is not valid JSON: ") + e.what());
      }
    }();
    if (!parsed) {
      report.problems.push_back({"manifest.json", "manifest", "invalid manifest", m.error().message()});
      return report;
    }
    m = std::move(parsed);
  }
  report.manifest_ok = true;
  // The tensors of each file: their own checksums are what a run checks, so verify checks them too (one read).
  std::map<std::string, std::vector<std::pair<const TensorEntry*, std::string>>> tensors_of;
  for (const auto& t : m->tensors) tensors_of[t.file].emplace_back(&t, "shared");
  for (const auto& e : m->experts) {
    const std::string where = "L" + std::to_string(e.layer) + "/E" + std::to_string(e.expert);
    for (const auto* part : e.parts()) tensors_of[e.file].emplace_back(part, where);
  }
  for (auto& [file, list] : tensors_of) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.first->offset < b.first->offset; });
  }
  // Mirrors (`model stripe --copy`, or a stripe.yaml's directories holding copies): the stripe plugin reads a file's
  // copy in any directory stripe.yaml lists when the model's own fails, so each copy that is another file is
  // checked too. Unreadable records are load_manifest's and the run's to report.
  std::vector<std::pair<const FileEntry*, fs::path>> mirrors;
  if (auto dirs = stripe_record_dirs(dir)) {
    for (const auto& f : m->files) {
      std::vector<fs::path> seen{dir / f.path};
      for (const auto& d : *dirs) {
        const fs::path copy = d / f.path;
        std::error_code ec;
        if (!fs::exists(fs::symlink_status(copy, ec))) continue;
        // The model's own file (a moved file's link), or a directory listed twice: the same copy.
        if (std::any_of(seen.begin(), seen.end(), [&](const fs::path& s) { return fs::equivalent(copy, s, ec); })) {
          continue;
        }
        seen.push_back(copy);
        mirrors.emplace_back(&f, copy);
      }
    }
  }
  std::uint64_t total = 0, done = 0;
  for (const auto& f : m->files) total += f.size;
  for (const auto& [f, copy] : mirrors) total += f->size;
  // What is wrong with one copy of `f` at `p` (`shown` in messages), if anything, and its fix apart: a copy with an
  // intact twin is mended by copying, not by a convert.
  struct Found {
    VerifyProblem problem;  // its message without the fix
    std::string fix;
    bool damaged = false;  // the file's bytes, which another copy can mend (not the manifest's record of them)
  };
  auto check = [&](const FileEntry& f, const fs::path& p, const std::string& shown) -> std::optional<Found> {
    const std::string where = describe_model_file(*m, f.path);
    struct stat st {};
    ++report.files_checked;
    if (::stat(p.c_str(), &st) != 0) {
      done += f.size;
      std::error_code ec;
      if (fs::is_symlink(p, ec)) {  // a link to where the file was: the reason says what to mend
        return Found{{shown, where, "missing", where + ": " + shown + missing_file_reason(p)}, "", true};
      }
      return Found{{shown, where, "missing", where + ": " + shown + " is missing"}, "re-run convert", true};
    }
    if (!S_ISREG(st.st_mode)) {  // its size would say nothing (a directory's 4096 bytes are no truncation)
      done += f.size;
      return Found{{shown, where, "not a file",
                    where + ": " + shown + " is " + sdk::file_kind_text(st.st_mode) + ", not a file"},
                   "put the file back, or re-run convert",
                   true};
    }
    if (static_cast<std::uint64_t>(st.st_size) != f.size) {
      const bool shorter = static_cast<std::uint64_t>(st.st_size) < f.size;
      done += f.size;
      return Found{{shown, where, shorter ? "truncated" : "wrong size",
                    where + ": " + shown + " is " + std::to_string(st.st_size) + " bytes, expected " +
                        std::to_string(f.size) + (shorter ? " (truncated)" : " (written to since convert?)")},
                   "re-run convert",
                   true};
    }
    if (const auto why = unreadable_file_reason(p); !why.empty()) {  // permissions, not damage: no re-convert
      done += f.size;
      return Found{{shown, where, "unreadable", where + ": " + shown + why}, "", false};
    }
    struct Ctx {
      std::uint64_t* done;
      std::uint64_t total;
      const std::function<void(std::uint64_t, std::uint64_t)>* cb;
    } ctx{&done, total, &progress};
    auto& tensors = tensors_of[f.path];
    std::vector<io::HashRange> ranges;
    for (const auto& [t, owner] : tensors) ranges.push_back({t->offset, t->size, 0});
    auto sum = io::hash_file_and_ranges(
        p, ranges,
        [](std::uint64_t n, void* c) {
          auto* x = static_cast<Ctx*>(c);
          *x->done += n;
          if (*x->cb) (*x->cb)(*x->done, x->total);
        },
        &ctx);
    report.bytes_hashed += f.size;
    if (!sum) return Found{{shown, where, "unreadable", where + ": " + sum.error().message()}, "re-run convert", true};
    if (*sum != f.checksum) {
      return Found{
          {shown, where, "checksum mismatch", where + ": checksum mismatch in " + shown}, "re-run convert", true};
    }
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].hash == tensors[i].first->checksum) continue;
      // The file is as written but a tensor is not what manifest.json says: the manifest was changed.
      return Found{{shown, tensors[i].second, "checksum mismatch",
                    tensors[i].second + ": tensor " + tensors[i].first->name + " in " + shown +
                        " does not match its checksum in manifest.json"},
                   "restore the manifest or re-run convert",
                   false};
    }
    return std::nullopt;
  };
  const auto with_fix = [](VerifyProblem problem, const std::string& fix) {
    if (!fix.empty()) problem.message += "; " + fix;
    return problem;
  };
  std::map<std::string, Found> bad_own;    // file -> what is wrong with the model's own copy
  std::map<std::string, fs::path> intact;  // file -> a mirror of it that checks out
  std::vector<std::pair<const FileEntry*, Found>> bad_mirrors;
  for (const auto& f : m->files) {
    if (auto found = check(f, dir / f.path, f.path)) bad_own.emplace(f.path, std::move(*found));
  }
  for (const auto& [f, copy] : mirrors) {
    if (auto found = check(*f, copy, copy.string())) {
      bad_mirrors.emplace_back(f, std::move(*found));
    } else {
      intact.emplace(f->path, copy);  // the first one found
    }
  }
  for (const auto& f : m->files) {  // in the manifest's order
    const auto bad = bad_own.find(f.path);
    if (bad == bad_own.end()) continue;
    const std::string& file = f.path;
    const Found& own = bad->second;
    const auto twin = intact.find(file);
    if (!own.damaged || twin == intact.end()) {
      report.problems.push_back(with_fix(own.problem, own.fix));
      continue;
    }
    // The stripe plugin reads a mirror when the model's copy fails, so runs go on; the copy mends it.
    report.problems.push_back(with_fix(own.problem, "its mirror " + twin->second.string() +
                                                        " is intact (runs read that one): copy it to " +
                                                        (dir / file).string()));
  }
  for (const auto& [f, found] : bad_mirrors) {
    if (!found.damaged) {
      report.problems.push_back(with_fix(found.problem, found.fix));
      continue;
    }
    std::string fix;
    if (!bad_own.contains(f->path)) {
      fix = "it is a mirror of " + (dir / f->path).string() + ", which is intact: copy that over it";
    } else if (const auto twin = intact.find(f->path); twin != intact.end()) {
      fix = "it is a mirror of " + f->path + ", whose copy " + twin->second.string() + " is intact: copy that over it";
    } else {
      fix = "it is a mirror of " + f->path + ", and no copy of it is intact: re-run convert";
    }
    report.problems.push_back(with_fix(found.problem, fix));
  }
  std::error_code ec;
  for (const auto& t : m->tokenizer_files) {
    ++report.files_checked;
    if (!fs::is_regular_file(dir / t, ec)) {
      report.problems.push_back({t, "tokenizer", "missing", "tokenizer: " + t + " is missing; re-run convert"});
    } else if (auto s = check_tokenizer_file(*m, dir, t); !s) {
      report.problems.push_back({t, "tokenizer", "checksum mismatch", s.message()});
    }
  }
  return report;
}

}  // namespace colibri::model
