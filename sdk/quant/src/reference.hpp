// Scalar reference quantizers / dequantizers (internal). Each one mirrors GGML's reference
// arithmetic operation by operation, so results match bit for bit; n is a multiple of the block size.
#pragma once

#include <cstdint>
#include <cstring>

#include "colibri/sdk/dtype.hpp"

namespace colibri::quant::detail {

inline std::uint16_t load_u16(const std::uint8_t* p) noexcept {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void store_u16(std::uint8_t* p, std::uint16_t v) noexcept {
  std::memcpy(p, &v, 2);
}

// The 16 signed 6-bit scales (already minus 32) of a q3_k block.
inline void unpack_q3_k_scales(const std::uint8_t* packed, std::int8_t* out) noexcept {
  constexpr std::uint32_t kmask1 = 0x03030303;
  constexpr std::uint32_t kmask2 = 0x0f0f0f0f;
  std::uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const std::uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<std::int8_t>(out[i] - 32);
}

void quantize_q8_0_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_q4_0_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_q2_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_q3_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_q4_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_q5_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_q6_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;
void quantize_mxfp4_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept;

void dequantize_q8_0_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_q4_0_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_q2_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_q3_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_q4_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_q5_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_q6_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
void dequantize_mxfp4_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept;

// Per-ISA dequantizers and conversions; each table entry has the signature of the reference one.
using DequantizeFn = void (*)(const std::uint8_t* x, float* y, std::int64_t n) noexcept;
using HalfToFloatFn = void (*)(const std::uint16_t* x, float* y, std::int64_t n) noexcept;
using FloatToHalfFn = void (*)(const float* x, std::uint16_t* y, std::int64_t n) noexcept;

struct KernelTable {
  DequantizeFn q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, mxfp4;
  HalfToFloatFn fp16_to_fp32, bf16_to_fp32;
  FloatToHalfFn fp32_to_fp16, fp32_to_bf16;
};

// q4_1, q5_0, q5_1 and iq4_nl: dequantized only (input_only.cpp), never quantized or run.
bool is_input_only(sdk::DType type) noexcept;
void dequantize_input_only(sdk::DType type, const std::uint8_t* x, float* y, std::int64_t n) noexcept;

const KernelTable& scalar_kernels() noexcept;
const KernelTable& avx2_kernels() noexcept;    // call only when the CPU has avx2 + f16c
const KernelTable& avx512_kernels() noexcept;  // call only when the CPU has avx512f/bw/vl

}  // namespace colibri::quant::detail
