// Memory layout of GGML's quantization blocks (ggml-common.h), for code that reads quantized
// weights directly (the kernels). fp16 fields are raw bits; see float16.hpp.
#pragma once

#include <bit>
#include <cstdint>

namespace colibri::quant {

inline constexpr int kQK4_0 = 32;     // elements per q4_0 block
inline constexpr int kQK8_0 = 32;     // elements per q8_0 block
inline constexpr int kQK_K = 256;     // elements per k-quant super-block
inline constexpr int kQK_MXFP4 = 32;  // elements per mxfp4 block
inline constexpr int kKScaleSize = 12;

// x = d * (q - 8); element j in the low nibble of qs[j], element j+16 in the high nibble.
struct BlockQ4_0 {
  std::uint16_t d;
  std::uint8_t qs[kQK4_0 / 2];
};

// x = d * q.
struct BlockQ8_0 {
  std::uint16_t d;
  std::int8_t qs[kQK8_0];
};

// 16 sub-blocks of 16: x = d * (scales & 15) * q - dmin * (scales >> 4), q in 0..3.
struct BlockQ2_K {
  std::uint8_t scales[kQK_K / 16];
  std::uint8_t qs[kQK_K / 4];
  std::uint16_t d;
  std::uint16_t dmin;
};

// 16 sub-blocks of 16: x = d * (scale6 - 32) * (q - 4), q's low 2 bits in qs, high bit in hmask.
struct BlockQ3_K {
  std::uint8_t hmask[kQK_K / 8];
  std::uint8_t qs[kQK_K / 4];
  std::uint8_t scales[12];
  std::uint16_t d;
};

// 8 sub-blocks of 32: x = d * scale6 * q - dmin * min6, q in 0..15.
struct BlockQ4_K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[kKScaleSize];
  std::uint8_t qs[kQK_K / 2];
};

// As q4_k with a fifth bit per weight in qh.
struct BlockQ5_K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[kKScaleSize];
  std::uint8_t qh[kQK_K / 8];
  std::uint8_t qs[kQK_K / 2];
};

// 16 sub-blocks of 16: x = d * scales[i] * (q - 32), q's low 4 bits in ql, high 2 bits in qh.
struct BlockQ6_K {
  std::uint8_t ql[kQK_K / 2];
  std::uint8_t qh[kQK_K / 4];
  std::int8_t scales[kQK_K / 16];
  std::uint16_t d;
};

// OCP microscaling FP4 (gpt-oss's experts): x = kMxfp4Values[q] * e8m0_to_fp32_half(e); element j in the low
// nibble of qs[j], element j+16 in the high nibble (the layout of q4_0).
struct BlockMXFP4 {
  std::uint8_t e;
  std::uint8_t qs[kQK_MXFP4 / 2];
};

// ggml's kvalues_mxfp4: the E2M1 values doubled (so they are integers), hence a halved scale.
inline constexpr std::int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// GGML_E8M0_TO_FP32_HALF: 2^(e - 128); e = 0 and 1 give the subnormals 2^-128 and 2^-127, e = 255 gives 2^127.
constexpr float e8m0_to_fp32_half(std::uint8_t e) noexcept {
  const std::uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<std::uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockMXFP4) == 17);

// The 6-bit scale and min of sub-block j (0..7) of a q4_k / q5_k block.
inline void k4_scale_min(int j, const std::uint8_t* q, std::uint8_t& scale, std::uint8_t& min) noexcept {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace colibri::quant
