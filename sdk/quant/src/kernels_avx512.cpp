// AVX-512 dequantizers and fp16/bf16 conversions (run-time dispatched; see quant.cpp).
// GCC 12 reports its own _mm512_undefined_* helpers as maybe-uninitialized; they are not.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "reference.hpp"

#define QUANT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

namespace colibri::quant::detail {
namespace {

QUANT_TARGET inline void emit16(float* y, __m128i q, float d) {
  _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d)));
}

QUANT_TARGET inline void emit16_min(float* y, __m128i q, float d, float m) {
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d));
  _mm512_storeu_ps(y, _mm512_sub_ps(v, _mm512_set1_ps(m)));
}

}  // namespace

#include "simd_kernels.inc"

namespace {

QUANT_TARGET void fp16_to_fp32_avx512(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
  }
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

QUANT_TARGET void fp32_to_fp16_avx512(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // The hardware keeps NaN payloads; ggml writes the canonical quiet NaN instead.
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) {
      for (int k = 0; k < 16; ++k) y[i + k] = fp32_to_fp16(x[i + k]);
    }
  }
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

QUANT_TARGET void bf16_to_fp32_avx512(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    _mm512_storeu_si512(y + i, _mm512_slli_epi32(h, 16));
  }
  for (; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}

// Integer rounding rather than vcvtneps2bf16, which flushes subnormals (ggml keeps them).
QUANT_TARGET void fp32_to_bf16_avx512(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  std::int64_t i = 0;
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  const __m512i round_bias = _mm512_set1_epi32(0x7FFF);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(64);
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(round_bias, odd)), 16);
    const __m512i nan_bits = _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet);
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, nan_bits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

}  // namespace

const KernelTable& avx512_kernels() noexcept {
  static constexpr KernelTable table{
      dequant_q8_0, dequant_q4_0,  dequant_q2_k,        dequant_q3_k,        dequant_q4_k,        dequant_q5_k,
      dequant_q6_k, dequant_mxfp4, fp16_to_fp32_avx512, bf16_to_fp32_avx512, fp32_to_fp16_avx512, fp32_to_bf16_avx512};
  return table;
}

}  // namespace colibri::quant::detail
