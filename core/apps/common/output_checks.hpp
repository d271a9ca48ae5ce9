// Checks of an output file named on the command line, said before a long load: both programs share them.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "colibri/model/paths.hpp"
#include "colibri/sdk/os_error.hpp"

namespace colibri::apps {

// The error for an output that names one of the profile files the command read (or one they extend).
inline std::string profile_overwrite_error(const std::string& out_flag, const std::string& output,
                                           const std::vector<std::filesystem::path>& profile_files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (output.empty() || !fs::exists(output, ec)) return {};
  for (const auto& file : profile_files) {
    if (fs::equivalent(output, file, ec)) {
      return out_flag + " " + output + " is the profile file " + file.string() +
             "; writing it would destroy that profile: name another file";
    }
  }
  return {};
}

// The error for an output that is `input` or lies inside it (a model directory).
inline std::string input_overwrite_error(const std::string& out_flag, const std::string& output,
                                         const std::string& in_flag, const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (output.empty() || input.empty()) return {};
  const fs::path out = fs::weakly_canonical(output, ec), in = fs::weakly_canonical(input, ec);
  const bool same = fs::exists(output, ec) && fs::equivalent(output, input, ec);
  const bool inside = fs::is_directory(input, ec) && model::path_within(out, in);
  if (!same && !inside) return {};
  return out_flag + " " + output + (same ? " is " : " lies inside ") + in_flag + " " + input +
         "; writing it would destroy that input: name another file";
}

// "" unless the output's directory does not exist or cannot be written (a read-only file system, its permissions).
inline std::string unwritable_output_error(const std::string& out_flag, const std::string& output) {
  namespace fs = std::filesystem;
  if (output.empty() || output == "-") return {};
  const std::string text = fs::path(output).lexically_normal().string();
  if (text.rfind("/dev/", 0) == 0 || text.rfind("/proc/", 0) == 0) return {};  // written in place
  std::error_code ec;
  if (fs::exists(output, ec) && !fs::is_regular_file(output, ec)) return {};  // a FIFO or device: written in place
  // The file is written as NAME.partial beside it and renamed: its directory must take both.
  const fs::path real = fs::weakly_canonical(fs::absolute(output, ec), ec);
  const fs::path dir = real.has_parent_path() ? real.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) {
    return out_flag + " " + output + ": the directory " + dir.string() + " does not exist; create it first";
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return out_flag + " " + output + ": cannot write in " + dir.string() + " (" + sdk::os_error_text(errno) +
           "); name a file in a directory you can write";
  }
  return {};
}

// The first of: the output is a profile file, is one of `inputs` (flag, path; empty paths and '-' for standard input
// are skipped) or lies inside one, or cannot be written.
inline std::string output_error(const std::string& out_flag, const std::string& output,
                                const std::vector<std::pair<std::string, std::string>>& inputs,
                                const std::vector<std::filesystem::path>& profile_files) {
  if (auto e = profile_overwrite_error(out_flag, output, profile_files); !e.empty()) return e;
  for (const auto& [flag, input] : inputs) {
    if (input == "-") continue;
    if (auto e = input_overwrite_error(out_flag, output, flag, input); !e.empty()) return e;
  }
  return unwritable_output_error(out_flag, output);
}

}  // namespace colibri::apps
