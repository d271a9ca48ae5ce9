// AVX-512 row kernels: 512-bit float rows, VNNI (vpdpbusd) for the 32-element block formats, and
// the 256-bit k-quant kernels re-encoded for this target. Same bits as the scalar path.
// GCC 12 reports its own _mm512_undefined_* pass-through values as maybe-uninitialized; they are not.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "kernels.hpp"

namespace colibri::cpu {
namespace {

#define KTARGET [[maybe_unused]] __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
// u8 x s8 with VNNI: one instruction, no int16 saturation.
KTARGET inline __m256i z_dot_u8s8(__m256i u, __m256i s) noexcept {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

#define X86_DOT_U8S8 z_dot_u8s8
#include "kernels_x86.inc"
#undef X86_DOT_U8S8

// 32 lanes = two 512-bit registers (lanes 0-15 and 16-31).
KTARGET float z_dot_f32(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const float*>(w_row);
  const auto* x = static_cast<const float*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  const std::int64_t n32 = k / 32 * 32;
  for (std::int64_t i = 0; i < n32; i += 32) {
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i)));
    a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16)));
  }
  alignas(64) float lanes[kF32Lanes];
  _mm512_store_ps(lanes, a0);
  _mm512_store_ps(lanes + 16, a1);
  for (std::int64_t i = n32; i < k; ++i) lanes[i % kF32Lanes] += w[i] * x[i];
  return reduce_f32_lanes(lanes);
}

KTARGET float z_dot_f16(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const std::uint16_t*>(w_row);
  const auto* x = static_cast<const float*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  const std::int64_t n32 = k / 32 * 32;
  for (std::int64_t i = 0; i < n32; i += 32) {
    const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
    const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16)));
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(w0, _mm512_loadu_ps(x + i)));
    a1 = _mm512_add_ps(a1, _mm512_mul_ps(w1, _mm512_loadu_ps(x + i + 16)));
  }
  alignas(64) float lanes[kF32Lanes];
  _mm512_store_ps(lanes, a0);
  _mm512_store_ps(lanes + 16, a1);
  for (std::int64_t i = n32; i < k; ++i) lanes[i % kF32Lanes] += quant::fp16_to_fp32(w[i]) * x[i];
  return reduce_f32_lanes(lanes);
}

KTARGET inline __m512 z_load_bf16(const std::uint16_t* p) noexcept {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

KTARGET float z_dot_bf16(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const std::uint16_t*>(w_row);
  const auto* x = static_cast<const float*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  const std::int64_t n32 = k / 32 * 32;
  for (std::int64_t i = 0; i < n32; i += 32) {
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(z_load_bf16(w + i), _mm512_loadu_ps(x + i)));
    a1 = _mm512_add_ps(a1, _mm512_mul_ps(z_load_bf16(w + i + 16), _mm512_loadu_ps(x + i + 16)));
  }
  alignas(64) float lanes[kF32Lanes];
  _mm512_store_ps(lanes, a0);
  _mm512_store_ps(lanes + 16, a1);
  for (std::int64_t i = n32; i < k; ++i) lanes[i % kF32Lanes] += quant::bf16_to_fp32(w[i]) * x[i];
  return reduce_f32_lanes(lanes);
}

KTARGET float z_dot_q8_0(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const quant::BlockQ8_0*>(w_row);
  const auto* y = static_cast<const Q8Block*>(act);
  const std::int64_t nb = k / 32, nb4 = nb / 4 * 4;
  __m128 acc = _mm_setzero_ps();
  for (std::int64_t b = 0; b < nb4; b += 4) {
    __m256i p[4];
    for (int j = 0; j < 4; ++j) {
      const __m256i wq = x86_load32(w[b + j].qs);
      const __m256i yq = x86_load32(y[b + j].qs);
      p[j] = z_dot_u8s8(_mm256_abs_epi8(wq), _mm256_sign_epi8(yq, wq));
    }
    const std::uint16_t wd[4] = {w[b].d, w[b + 1].d, w[b + 2].d, w[b + 3].d};
    const float yd[4] = {y[b].d, y[b + 1].d, y[b + 2].d, y[b + 3].d};
    acc = x86_accumulate4(acc, x86_hsum4(p[0], p[1], p[2], p[3]), wd, yd);
  }
  alignas(16) float lanes[kBlockLanes];
  _mm_store_ps(lanes, acc);
  for (std::int64_t b = nb4; b < nb; ++b) {
    std::int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += w[b].qs[j] * y[b].qs[j];
    lanes[b % kBlockLanes] += (quant::fp16_to_fp32(w[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return reduce_block_lanes(lanes);
}

KTARGET float z_dot_q4_0(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const quant::BlockQ4_0*>(w_row);
  const auto* y = static_cast<const Q8Block*>(act);
  const std::int64_t nb = k / 32, nb4 = nb / 4 * 4;
  __m128 acc = _mm_setzero_ps();
  for (std::int64_t b = 0; b < nb4; b += 4) {
    __m256i p[4];
    for (int j = 0; j < 4; ++j) p[j] = z_dot_u8s8(x86_unpack_q4_0(w[b + j].qs), x86_load32(y[b + j].qs));
    const __m128i sums = _mm_set_epi32(y[b + 3].sum, y[b + 2].sum, y[b + 1].sum, y[b].sum);
    const __m128i isum = _mm_sub_epi32(x86_hsum4(p[0], p[1], p[2], p[3]), _mm_slli_epi32(sums, 3));
    const std::uint16_t wd[4] = {w[b].d, w[b + 1].d, w[b + 2].d, w[b + 3].d};
    const float yd[4] = {y[b].d, y[b + 1].d, y[b + 2].d, y[b + 3].d};
    acc = x86_accumulate4(acc, isum, wd, yd);
  }
  alignas(16) float lanes[kBlockLanes];
  _mm_store_ps(lanes, acc);
  for (std::int64_t b = nb4; b < nb; ++b) {
    std::int32_t isum = 0;
    for (int j = 0; j < 16; ++j) isum += (w[b].qs[j] & 15) * y[b].qs[j] + (w[b].qs[j] >> 4) * y[b].qs[j + 16];
    isum -= 8 * y[b].sum;
    lanes[b % kBlockLanes] += (quant::fp16_to_fp32(w[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return reduce_block_lanes(lanes);
}

#undef KTARGET

}  // namespace

const KernelSet& avx512_kernels() noexcept {
  static constexpr KernelSet set{"avx512",           z_dot_f32,          z_dot_f16,          z_dot_bf16,
                                 z_dot_q8_0,         z_dot_q4_0,         x86_dot_q2_k,       x86_dot_q3_k,
                                 x86_dot_q4_k,       x86_dot_q5_k,       x86_dot_q6_k,       x86_tile_q32<false>,
                                 x86_tile_q32<true>, x86_tile_k<X86Q2K>, x86_tile_k<X86Q3K>, x86_tile_k<X86Q4K>,
                                 x86_tile_k<X86Q5K>, x86_tile_k<X86Q6K>, x86_scale_axpy};
  return set;
}

}  // namespace colibri::cpu
