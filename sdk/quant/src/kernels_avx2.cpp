// AVX2 dequantizers and fp16/bf16 conversions (run-time dispatched; see quant.cpp).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "reference.hpp"

#define QUANT_TARGET __attribute__((target("avx2,f16c")))

namespace colibri::quant::detail {
namespace {

QUANT_TARGET inline void emit16(float* y, __m128i q, float d) {
  const __m256 vd = _mm256_set1_ps(d);
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
  _mm256_storeu_ps(y, _mm256_mul_ps(lo, vd));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(hi, vd));
}

QUANT_TARGET inline void emit16_min(float* y, __m128i q, float d, float m) {
  const __m256 vd = _mm256_set1_ps(d);
  const __m256 vm = _mm256_set1_ps(m);
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
  _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(lo, vd), vm));
  _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(hi, vd), vm));
}

}  // namespace

#include "simd_kernels.inc"

namespace {

QUANT_TARGET void fp16_to_fp32_avx2(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

QUANT_TARGET void fp32_to_fp16_avx2(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // The hardware keeps NaN payloads; ggml writes the canonical quiet NaN instead.
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int k = 0; k < 8; ++k) y[i + k] = fp32_to_fp16(x[i + k]);
    }
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

QUANT_TARGET void bf16_to_fp32_avx2(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm256_slli_epi32(h, 16));
  }
  for (; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

QUANT_TARGET void fp32_to_bf16_avx2(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i round_bias = _mm256_set1_epi32(0x7FFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(64);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(round_bias, odd)), 16);
    const __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
    const __m256i r = _mm256_blendv_epi8(rounded, nan_bits, is_nan);
    // Pack 8 x 32-bit (each < 65536) into 8 x 16-bit in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

}  // namespace

const KernelTable& avx2_kernels() noexcept {
  static constexpr KernelTable table{dequant_q8_0,      dequant_q4_0,      dequant_q2_k,      dequant_q3_k,
                                     dequant_q4_k,      dequant_q5_k,      dequant_q6_k,      dequant_mxfp4,
                                     fp16_to_fp32_avx2, bf16_to_fp32_avx2, fp32_to_fp16_avx2, fp32_to_bf16_avx2};
  return table;
}

}  // namespace colibri::quant::detail
