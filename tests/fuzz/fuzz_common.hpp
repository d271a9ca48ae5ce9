// Helpers shared by the fuzz targets. Each target defines LLVMFuzzerTestOneInput and must not crash, hang, leak or
// trip a sanitizer on any input; a property that must hold for every input (a round trip, a stream that adds up to
// the whole) is checked with FUZZ_CHECK, which aborts so that libFuzzer and the replay driver both report it.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond, what)                                                                                         \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s (%s)\n", __FILE__, __LINE__, #cond, std::string(what).c_str()); \
      std::abort();                                                                                                    \
    }                                                                                                                  \
  } while (0)

namespace colibri::fuzz {

// Reads an input front to back: a byte at a time for choices, then pieces split at a separator.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}
  std::uint8_t byte() {
    if (rest_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(rest_.front());
    rest_.remove_prefix(1);
    return b;
  }
  // The text up to the next `separator` (all the rest when there is none).
  std::string_view until(std::string_view separator) {
    const auto at = rest_.find(separator);
    const std::string_view piece = rest_.substr(0, at);
    rest_.remove_prefix(at == std::string_view::npos ? rest_.size() : at + separator.size());
    return piece;
  }
  [[nodiscard]] std::string_view rest() const { return rest_; }

 private:
  std::string_view rest_;
};

// `s` with bytes outside printable ASCII escaped, for messages.
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += ch;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out + "\"";
}

// Both sides of a comparison, for messages.
inline std::string versus(std::string_view a, std::string_view b) {
  return quote(a) + "\n  vs " + quote(b);
}

// The bytes of a file ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A scratch file of this process (the readers under test take paths), rewritten for every input.
inline std::filesystem::path write_scratch(std::string_view name, std::string_view bytes) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("colibri-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(
          std::filesystem::temp_directory_path() / ("colibri-fuzz-" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  const auto path = dir / std::string(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace colibri::fuzz
