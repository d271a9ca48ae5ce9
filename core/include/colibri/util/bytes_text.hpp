// Bytes as people read them: "6.0 MiB", "1.5 GiB", "3.0 TiB".
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>

namespace colibri::util {

enum class Rounding {
  nearest,
  up,  // a size to pass back as a budget (--expert-cache-size): at least the bytes, so at least as many slots
};

// In MiB, or the largest binary unit up to TiB that keeps a whole number in front (a 1T expert is not 1048576.0 MiB),
// to one decimal.
inline std::string bytes_text(std::uint64_t bytes, Rounding rounding = Rounding::nearest) {
  static constexpr const char* kUnits[] = {"MiB", "GiB", "TiB"};
  const auto shown = [&](double x) { return rounding == Rounding::up ? std::ceil(x * 10.0) / 10.0 : x; };
  double v = static_cast<double>(bytes) / (1024.0 * 1024.0);
  std::size_t unit = 0;
  // As shown: 1 GiB - 1 byte is 1.0 GiB, not 1024.0 MiB.
  while (shown(v) >= (rounding == Rounding::up ? 1024.0 : 1023.95) && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  v = shown(v);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

}  // namespace colibri::util
