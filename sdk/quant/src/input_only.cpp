// Block formats colibri reads but neither runs nor writes: llama.cpp's quantizer falls back to them for rows that
// k-quants do not fit (q5_0 for q4_k, q5_1 for q5_k, iq4_nl for q2_k/q3_k), and older GGUFs hold q4_1. convert
// dequantizes them (then quantizes to its preset's type). Layouts and arithmetic are ggml's dequantize_row_*.
#include <cstring>

#include "colibri/quant/float16.hpp"
#include "reference.hpp"

namespace colibri::quant::detail {

using sdk::DType;

namespace {

constexpr int kBlock = 32;

float half_at(const std::uint8_t* p) {
  std::uint16_t h = 0;
  std::memcpy(&h, p, sizeof h);
  return fp16_to_fp32(h);
}

std::uint32_t u32_at(const std::uint8_t* p) {
  std::uint32_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; q5 adds bit j (j + 16) of qh as bit 4.
void q4_1(const std::uint8_t* x, float* y, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, x += 20, y += kBlock) {
    const float d = half_at(x), m = half_at(x + 2);
    const std::uint8_t* qs = x + 4;
    for (int j = 0; j < kBlock / 2; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + kBlock / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void q5_0(const std::uint8_t* x, float* y, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, x += 22, y += kBlock) {
    const float d = half_at(x);
    const std::uint32_t qh = u32_at(x + 2);
    const std::uint8_t* qs = x + 6;
    for (int j = 0; j < kBlock / 2; ++j) {
      const int lo = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
      const int hi = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
      y[j] = static_cast<float>(lo) * d;
      y[j + kBlock / 2] = static_cast<float>(hi) * d;
    }
  }
}

void q5_1(const std::uint8_t* x, float* y, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, x += 24, y += kBlock) {
    const float d = half_at(x), m = half_at(x + 2);
    const std::uint32_t qh = u32_at(x + 4);
    const std::uint8_t* qs = x + 8;
    for (int j = 0; j < kBlock / 2; ++j) {
      const unsigned lo = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
      const unsigned hi = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kBlock / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

// iq4_nl: 4-bit indices into a fixed non-linear table, one f16 scale per block.
constexpr std::int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void iq4_nl(const std::uint8_t* x, float* y, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b, x += 18, y += kBlock) {
    const float d = half_at(x);
    const std::uint8_t* qs = x + 2;
    for (int j = 0; j < kBlock / 2; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[qs[j] & 0x0F]);
      y[j + kBlock / 2] = d * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

}  // namespace

bool is_input_only(DType type) noexcept {
  return type == DType::q4_1 || type == DType::q5_0 || type == DType::q5_1 || type == DType::iq4_nl;
}

void dequantize_input_only(DType type, const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t blocks = n / kBlock;
  switch (type) {
    case DType::q4_1: q4_1(x, y, blocks); break;
    case DType::q5_0: q5_0(x, y, blocks); break;
    case DType::q5_1: q5_1(x, y, blocks); break;
    case DType::iq4_nl: iq4_nl(x, y, blocks); break;
    default: break;
  }
}

}  // namespace colibri::quant::detail
