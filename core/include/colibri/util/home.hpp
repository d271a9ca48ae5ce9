// The user's home directory: $HOME when it is an absolute path, else the password database's entry (a service or
// `env -i` has no HOME), else empty. Never a shared directory such as /tmp, where another user could plant files.
#pragma once

#include <filesystem>

namespace colibri::util {

[[nodiscard]] std::filesystem::path home_dir();
// colibri's cache: $XDG_CACHE_HOME/colibri, else <home>/.cache/colibri (the working directory's .cache without a home).
[[nodiscard]] std::filesystem::path colibri_cache_dir();

}  // namespace colibri::util
