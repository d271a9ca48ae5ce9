// IEEE half (fp16) and bfloat16 conversions, bit-identical to GGML's reference conversions:
// fp32 -> fp16 rounds to nearest even, overflows to infinity, keeps subnormals, and maps every NaN
// to the quiet NaN 0x7e00 with the input's sign; fp32 -> bf16 rounds to nearest even (subnormals
// kept) and turns a NaN into a quiet NaN keeping its upper payload bits (ggml_compute_fp32_to_bf16).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "colibri/quant/quant.hpp"

namespace colibri::quant {

// fp16 bits -> float (exact; a signalling NaN comes back quiet, as on x86 hardware).
inline float fp16_to_fp32(std::uint16_t h) noexcept {
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  // Normal numbers: re-bias the exponent by a multiply so infinities and NaNs stay what they are.
  const float normalized = std::bit_cast<float>((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormals: place the mantissa under a 0.5 exponent and subtract 0.5.
  const float denormalized = std::bit_cast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t bits = sign | (two_w < (1u << 27) ? std::bit_cast<std::uint32_t>(denormalized)
                                                        : std::bit_cast<std::uint32_t>(normalized));
  return std::bit_cast<float>(bits);
}

// float -> fp16 bits, round to nearest even.
inline std::uint16_t fp32_to_fp16(float f) noexcept {
  // Scaling up then down rounds the value at fp16 precision using the FPU's own rounding.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const std::uint32_t w = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  std::uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(base);
  const std::uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const std::uint32_t mantissa_bits = bits & 0x00000FFFu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<std::uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float bf16_to_fp32(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// float -> bf16 bits, round to nearest even; NaN made quiet.
inline std::uint16_t fp32_to_bf16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 64u);
  return static_cast<std::uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

// Row conversions, vectorised (AVX2 / AVX-512 chosen at run time), bit-identical to the scalar functions above.
void fp16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n) noexcept;
void fp32_to_fp16_row(const float* src, std::uint16_t* dst, std::int64_t n) noexcept;
void bf16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n) noexcept;
void fp32_to_bf16_row(const float* src, std::uint16_t* dst, std::int64_t n) noexcept;

// The same on a chosen instruction set (tests and benchmarks); false when this CPU lacks it.
bool fp16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n, Isa isa) noexcept;
bool fp32_to_fp16_row(const float* src, std::uint16_t* dst, std::int64_t n, Isa isa) noexcept;
bool bf16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n, Isa isa) noexcept;
bool fp32_to_bf16_row(const float* src, std::uint16_t* dst, std::int64_t n, Isa isa) noexcept;

}  // namespace colibri::quant
