// FNV-1a 64, the hash the golden vectors record for whole outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace colibri::quant::testing {

constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;

inline std::uint64_t fnv1a(const void* p, std::size_t n) {
  std::uint64_t h = kFnvOffset;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace colibri::quant::testing
