// Where models live: `--model` takes a model directory or a name under the models directory.
#pragma once

#include <filesystem>
#include <string>

#include "colibri/sdk/status.hpp"

namespace colibri::model {

// $XDG_DATA_HOME/colibri/models, else ~/.local/share/colibri/models.
std::filesystem::path default_models_dir();

// A path to an existing directory is taken as is (relative to the working directory); otherwise a plain name
// (no '/') is looked up as <models_dir>/<name> (models_dir empty or "auto": default_models_dir()). The error
// names both places looked at.
sdk::Expected<std::filesystem::path> resolve_model_path(const std::string& name_or_path,
                                                        const std::filesystem::path& models_dir = {});

}  // namespace colibri::model
