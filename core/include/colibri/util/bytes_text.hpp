// Bytes as people read them: "6.0 MiB", "1.5 GiB", "3.0 TiB".
#pragma once

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>

namespace colibri::util {

// In MiB, or the largest binary unit up to TiB that keeps a whole number in front (a 1T expert is not 1048576.0 MiB).
inline std::string bytes_text(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / (1024.0 * 1024.0);
  std::size_t unit = 0;
  while (v >= 1023.95 && unit + 1 < std::size(kUnits)) {  // as shown, to one decimal: 1 GiB - 1 byte is 1.0 GiB
    v /= 1024.0;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

}  // namespace colibri::util
