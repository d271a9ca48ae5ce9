// Where the tests find the plugin: COLIBRI_CUDA_PLUGIN when set (a build carried to another machine,
// see scripts/gpu-check --prebuilt), else the path CMake compiled in.
#pragma once

#include <cstdlib>
#include <string>

inline std::string cuda_plugin_path() {
  const char* env = std::getenv("COLIBRI_CUDA_PLUGIN");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(CUDA_PLUGIN_PATH);
}
