#include "colibri/model/paths.hpp"

#include <cstdlib>

namespace colibri::model {

namespace fs = std::filesystem;
using sdk::Status;
using sdk::StatusCode;

fs::path default_models_dir() {
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && xdg[0] == '/') {
    return fs::path(xdg) / "colibri" / "models";
  }
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr && home[0] != '\0' ? home : ".") / ".local" / "share" / "colibri" / "models";
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

}  // namespace colibri::model
