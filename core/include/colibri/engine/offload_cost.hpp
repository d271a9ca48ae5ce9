// The cost model behind compute.cpu_fallback: for a routed expert that is not in VRAM, is it faster to run it on
// the CPU from RAM, or to send its weights over the bus and run it on the GPU? Both sides are linear in the expert's
// bytes; the CPU side also grows with the tokens routed to it (decode reads the weights for one token, a prefill
// batch reuses them), the upload does not. Rates come from a calibration at load (Engine) or from the profile.
#pragma once

#include <cstdint>
#include <string>

namespace colibri::engine {

struct OffloadCost {
  double upload_bytes_per_second = 0;  // host RAM to device memory (PCIe), one expert blob at a time
  double device_bytes_per_second = 0;  // the device running an expert it holds, weight bytes per second, one token
  double cpu_bytes_per_second = 0;     // the CPU backend running an expert from RAM, one token
  double cpu_extra_token = 0;          // each further token adds this fraction of the one-token CPU time

  [[nodiscard]] bool valid() const {
    return upload_bytes_per_second > 0 && device_bytes_per_second > 0 && cpu_bytes_per_second > 0 &&
           cpu_extra_token >= 0;
  }
  [[nodiscard]] double cpu_seconds(std::uint64_t bytes, std::int64_t tokens) const {
    const double n = static_cast<double>(tokens < 1 ? 1 : tokens);
    return static_cast<double>(bytes) / cpu_bytes_per_second * (1.0 + (n - 1.0) * cpu_extra_token);
  }
  [[nodiscard]] double upload_seconds(std::uint64_t bytes) const {
    return static_cast<double>(bytes) / upload_bytes_per_second + static_cast<double>(bytes) / device_bytes_per_second;
  }
  // True when running `tokens` tokens through an expert of `bytes` on the CPU beats uploading it first.
  [[nodiscard]] bool cpu_faster(std::uint64_t bytes, std::int64_t tokens) const {
    return valid() && cpu_seconds(bytes, tokens) < upload_seconds(bytes);
  }
  // The most tokens for which the CPU still wins (0: never; -1: always).
  [[nodiscard]] std::int64_t cpu_token_limit() const;
  // "upload 12.1 GB/s, device 2.9 TB/s, CPU 24.0 GB/s at one token (+31% per token): the CPU runs up to 2 tokens"
  [[nodiscard]] std::string describe() const;
};

}  // namespace colibri::engine
