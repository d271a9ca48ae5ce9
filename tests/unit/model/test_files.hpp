// Builders for small safetensors / GGUF byte streams used by the reader tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace colibri::model::testing {

class Bytes {
 public:
  template <typename T>
  Bytes& pod(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    data.append(p, sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    pod<std::uint64_t>(s.size());
    data += s;
    return *this;
  }
  Bytes& raw(const std::string& s) {
    data += s;
    return *this;
  }
  Bytes& pad_to(std::size_t align) {
    while (data.size() % align != 0) data.push_back('\0');
    return *this;
  }
  std::string data;
};

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One directory per test process, removed when the process exits so runs leave nothing in /tmp.
inline const std::filesystem::path& process_temp_root() {
  static const struct Root {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("colibri model test " + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } root;
  return root.path;
}

inline std::filesystem::path temp_dir(const std::string& name) {
  auto d = process_temp_root() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace colibri::model::testing
