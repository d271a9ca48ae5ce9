#include "colibri/engine/offload_cost.hpp"

#include <cmath>
#include <cstdio>

namespace colibri::engine {

std::int64_t OffloadCost::cpu_token_limit() const {
  if (!valid()) return 0;
  // cpu(n) < upload  <=>  1 + (n - 1) * extra < upload_per_byte * cpu_bytes_per_second
  const double ratio = (1.0 / upload_bytes_per_second + 1.0 / device_bytes_per_second) * cpu_bytes_per_second;
  if (ratio <= 1.0) return 0;
  if (cpu_extra_token <= 0) return -1;
  const double n = 1.0 + (ratio - 1.0) / cpu_extra_token;  // cpu(n) == upload; the CPU wins strictly below
  const double below = std::ceil(n) - 1.0;
  return below > 1e9 ? -1 : static_cast<std::int64_t>(below);
}

std::string OffloadCost::describe() const {
  char buf[256];
  const std::int64_t limit = cpu_token_limit();
  std::string verdict = limit < 0    ? "the CPU runs every expert not in VRAM"
                        : limit == 0 ? "every expert not in VRAM is uploaded"
                                     : "the CPU runs experts not in VRAM for up to " + std::to_string(limit) +
                                           (limit == 1 ? " token" : " tokens");
  std::snprintf(buf, sizeof buf, "upload %.2f GB/s, device %.2f GB/s, CPU %.2f GB/s at one token (+%.0f%% per token): ",
                upload_bytes_per_second / 1e9, device_bytes_per_second / 1e9, cpu_bytes_per_second / 1e9,
                cpu_extra_token * 100.0);
  return buf + verdict;
}

}  // namespace colibri::engine
