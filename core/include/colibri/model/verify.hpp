// verify_model: load_manifest's checks plus a re-hash of every file, each problem named by layer and expert
// with the fix ("L12/E5: checksum mismatch; re-run convert").
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace colibri::model {

struct VerifyProblem {
  std::string file;      // relative path ("experts/L012/E005.bin"), or "manifest.json"
  std::string location;  // "L12/E5", "shared", "manifest", "tokenizer"
  std::string kind;      // "missing" | "not a file" | "truncated" | "wrong size" | "unreadable" |
                         // "checksum mismatch" | "invalid manifest"
  std::string message;   // the whole line to print, fix included
};

struct VerifyReport {
  bool manifest_ok = false;
  std::size_t files_checked = 0;
  std::uint64_t bytes_hashed = 0;
  std::vector<VerifyProblem> problems;
  [[nodiscard]] bool ok() const { return manifest_ok && problems.empty(); }
};

// `progress` (may be empty) hears (bytes hashed, bytes total).
VerifyReport verify_model(const std::filesystem::path& dir,
                          const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace colibri::model
