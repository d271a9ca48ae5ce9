// AVX-512 row kernels: 512-bit float rows, VNNI (vpdpbusd) for the 32-element block formats, and
// the 256-bit k-quant kernels re-encoded for this target. Same bits as the scalar path.
// GCC 12 reports its own _mm512_undefined_* pass-through values as (maybe-)uninitialized; they are not.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

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

// reduce_f32_lanes's tree on 16 lanes in one register (from the step s = 8 on), and on 32 lanes in two (lanes 0-15
// and 16-31, from s = 16 on).
KTARGET inline float z_tree16(__m512 v) noexcept {
  return x86_tree16(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
KTARGET inline float z_tree32(__m512 a0, __m512 a1) noexcept {
  return z_tree16(_mm512_add_ps(a0, a1));
}

// 32 lanes = two 512-bit registers (lanes 0-15 and 16-31), reduced as x86_finish does.
template <typename Tail>
KTARGET inline float z_finish(__m512 a0, __m512 a1, std::int64_t done, std::int64_t k, Tail&& tail) noexcept {
  if (done == k) return z_tree32(a0, a1);
  alignas(64) float lanes[kF32Lanes];
  _mm512_store_ps(lanes, a0);
  _mm512_store_ps(lanes + 16, a1);
  for (std::int64_t i = done; i < k; ++i) lanes[i % kF32Lanes] += tail(i);
  return reduce_f32_lanes(lanes);
}

KTARGET float z_dot_f32(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const float*>(w_row);
  const auto* x = static_cast<const float*>(act);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  const std::int64_t n32 = k / 32 * 32;
  for (std::int64_t i = 0; i < n32; i += 32) {
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i)));
    a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16)));
  }
  return z_finish(a0, a1, n32, k, [&](std::int64_t i) { return w[i] * x[i]; });
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
  return z_finish(a0, a1, n32, k, [&](std::int64_t i) { return quant::fp16_to_fp32(w[i]) * x[i]; });
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
  return z_finish(a0, a1, n32, k, [&](std::int64_t i) { return quant::bf16_to_fp32(w[i]) * x[i]; });
}

KTARGET float z_dot_q8_0(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const quant::BlockQ8_0*>(w_row);
  const auto* y = static_cast<const Q8Block*>(act);
  const std::int64_t nb = k / 32, nb4 = nb / 4 * 4;
  __m128 acc = _mm_setzero_ps();
  for (std::int64_t b = 0; b < nb4; b += 4) {
    x86_prefetch_ahead<3>(w + b);  // 136 bytes a step
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
    x86_prefetch_ahead<2>(w + b);  // 72 bytes a step
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

// ---------------------------------------------------------------- mxfp4, eight blocks a step
//
// x86_dot_mxfp4 (kernels_x86.inc) eight blocks at a time in 512-bit registers, with the same integer sums and float
// steps. One register holds blocks b and b + 1: each block's 16 code bytes go into two 128-bit lanes by broadcast
// loads (no shuffle), the second lane shifted right by 4, so one vpshufb after the nibble mask gives elements 0-15
// and 16-31 of both blocks (values plus 12) in the order of their activations, two plain 32-byte loads. The four
// registers' vpdpbusd sums meet per block in three rounds of blend, lane swap and add: exact, so each block's
// integer sum is the scalar path's. The float steps per block are x86_accumulate4's, and the eight products go into
// the four lanes in block order (blocks b..b+3, then b+4..b+7), as two four-block steps would add them.

// The integer sums of blocks w[0..7] with activation blocks y[0..7] in block order; yd gets the activation scales.
KTARGET inline __m256i z_mxfp4_isum8(const quant::BlockMXFP4* w, const Q8Block* y, __m256& yd) noexcept {
  const __m512i values = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Biased)));
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i p[4];
  for (int i = 0; i < 4; ++i) {
    const auto codes = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[2 * i + j].qs)); };
    // 128-bit lanes: block 2i's codes twice, then block 2i + 1's twice; lanes 1 and 3 (int16 lanes 8-15 and
    // 24-31) shifted to their high nibbles.
    __m512i q = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(codes(0)), 0xFF00, codes(1));
    q = _mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4);
    const __m512i v = _mm512_shuffle_epi8(values, _mm512_and_si512(q, m4));
    const __m512i a =
        _mm512_inserti64x4(_mm512_castsi256_si512(x86_load32(y[2 * i].qs)), x86_load32(y[2 * i + 1].qs), 1);
    p[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, a);
  }
  // p[i]: 128-bit lanes 0-1 hold block 2i's partial sums, lanes 2-3 block 2i + 1's. r[h]: the lanes hold blocks
  // 4h + 0, 2, 1, 3 (four partial sums each).
  __m512i r[2];
  for (int h = 0; h < 2; ++h) {
    const __m512i a = p[2 * h], b = p[2 * h + 1];
    const __m512i x = _mm512_mask_blend_epi32(0xF0F0, a, b), z = _mm512_mask_blend_epi32(0xF0F0, b, a);
    r[h] = _mm512_add_epi32(x, _mm512_shuffle_i32x4(z, z, _MM_SHUFFLE(2, 3, 0, 1)));
  }
  // s: each lane's int32 lanes 0-1 hold two partial sums of r[0]'s block there, lanes 2-3 two of r[1]'s; t: the
  // totals, in int32 lanes 0, 2, ... 14 for blocks 0, 4, 2, 6, 1, 5, 3, 7.
  const __m512i x = _mm512_mask_blend_epi32(0xCCCC, r[0], r[1]), z = _mm512_mask_blend_epi32(0xCCCC, r[1], r[0]);
  const __m512i s = _mm512_add_epi32(x, _mm512_shuffle_epi32(z, _MM_PERM_BADC));
  const __m512i t = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));
  const __m512i order = _mm512_setr_epi32(0, 8, 4, 12, 2, 10, 6, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i isum = _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, t));
  // Each activation block's d and sum (its first 8 bytes): l[j] = [d_j, sum_j, -, - | d_j+4, sum_j+4, -, -].
  __m256i l[4];
  for (int j = 0; j < 4; ++j) {
    l[j] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(&y[j + 4]), reinterpret_cast<const __m128i*>(&y[j]));
  }
  const __m256i a = _mm256_unpacklo_epi32(l[0], l[1]), b = _mm256_unpacklo_epi32(l[2], l[3]);
  yd = _mm256_castsi256_ps(_mm256_unpacklo_epi64(a, b));
  const __m256i sums = _mm256_unpackhi_epi64(a, b);
  return _mm256_sub_epi32(isum, _mm256_add_epi32(_mm256_slli_epi32(sums, 3), _mm256_slli_epi32(sums, 2)));
}

// x86_mxfp4_scales4 for blocks w[0..7]: their e bytes (at 17 j) picked as int16 lanes from the step's first 128
// bytes, each into the low half of int32 lane j (odd j: the byte is the high one of its int16 lane).
KTARGET inline __m256 z_mxfp4_scales8(const quant::BlockMXFP4* w) noexcept {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(w);
  const __m512i lo = _mm512_loadu_si512(bytes), hi = _mm512_loadu_si512(bytes + 64);
  const __m512i pick = _mm512_setr_epi32(0, 8, 17, 25, 34, 42, 51, 59, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i words = _mm512_castsi512_si256(_mm512_maskz_permutex2var_epi16(0x5555, lo, pick, hi));
  const __m256i e =
      _mm256_and_si256(_mm256_srlv_epi32(words, _mm256_setr_epi32(0, 8, 0, 8, 0, 8, 0, 8)), _mm256_set1_epi32(0xFF));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  return _mm256_castsi256_ps(
      _mm256_mask_blend_epi32(_mm256_cmplt_epu32_mask(e, _mm256_set1_epi32(2)), normal, subnormal));
}

// The float scales of e8m0 exponents e (int32 lanes), as quant::e8m0_to_fp32_half gives them.
KTARGET inline __m512 z_e8m0_scales(__m512i e) noexcept {
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  return _mm512_castsi512_ps(_mm512_mask_sllv_epi32(normal, _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)),
                                                    _mm512_set1_epi32(0x00200000), e));
}

// The scales of blocks w[0..15], picked as z_mxfp4_scales8 does from the 272 bytes of the 16 blocks.
KTARGET inline __m512 z_mxfp4_scales16(const quant::BlockMXFP4* w) noexcept {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(w);
  const __m512i pick = _mm512_setr_epi32(0, 8, 17, 25, 34, 42, 51, 59, 4, 12, 21, 29, 38, 46, 55, 63);
  const __m512i first =
      _mm512_maskz_permutex2var_epi16(0x00005555u, _mm512_loadu_si512(bytes), pick, _mm512_loadu_si512(bytes + 64));
  const __m512i second = _mm512_maskz_permutex2var_epi16(0x55550000u, _mm512_loadu_si512(bytes + 128), pick,
                                                         _mm512_loadu_si512(bytes + 192));
  const __m512i odd = _mm512_set1_epi64(static_cast<long long>(8ull << 32));
  return z_e8m0_scales(
      _mm512_and_si512(_mm512_srlv_epi32(_mm512_or_si512(first, second), odd), _mm512_set1_epi32(0xFF)));
}

// z_dot_mxfp4 from block `from` (a multiple of 4) on, with the lanes so far in acc.
KTARGET inline float z_mxfp4_finish(__m128 acc, const quant::BlockMXFP4* w, const Q8Block* y, std::int64_t from,
                                    std::int64_t nb) noexcept {
  const std::int64_t nb8 = from + (nb - from) / 8 * 8, nb4 = nb / 4 * 4;
  for (std::int64_t b = from; b < nb8; b += 8) {
    x86_prefetch_ahead<3>(w + b);  // 136 bytes a step
    __m256 yd;
    const __m256i isum = z_mxfp4_isum8(w + b, y + b, yd);
    const __m256 f = _mm256_mul_ps(_mm256_mul_ps(z_mxfp4_scales8(w + b), yd), _mm256_cvtepi32_ps(isum));
    acc = _mm_add_ps(acc, _mm256_castps256_ps128(f));
    acc = _mm_add_ps(acc, _mm256_extractf128_ps(f, 1));
  }
  for (std::int64_t b = nb8; b < nb4; b += 4) {
    __m128 yd;
    const __m128i isum = x86_mxfp4_isum4(x86_mxfp4_decode4(w + b), y + b, yd);
    acc = x86_accumulate4(acc, isum, x86_mxfp4_scales4(w + b), yd);
  }
  alignas(16) float lanes[kBlockLanes];
  _mm_store_ps(lanes, acc);
  for (std::int64_t b = nb4; b < nb; ++b) {
    lanes[b % kBlockLanes] +=
        (quant::e8m0_to_fp32_half(w[b].e) * y[b].d) * static_cast<float>(x86_mxfp4_isum(w[b], y[b]));
  }
  return reduce_block_lanes(lanes);
}

KTARGET float z_dot_mxfp4(const void* w_row, const void* act, std::int64_t k) noexcept {
  return z_mxfp4_finish(_mm_setzero_ps(), static_cast<const quant::BlockMXFP4*>(w_row),
                        static_cast<const Q8Block*>(act), 0, k / 32);
}

// ---------------------------------------------------------------- mxfp4, q8_0, q4_0: several rows, several tokens
//
// Prefill's matmul: up to kRowTile rows against up to kTokenTile tokens. Each token's activations are laid out once
// per call (ZTok16), and each row's 16 blocks are decoded once into 8 registers for every token. In those registers
// int32 lane b belongs to block b: register k holds 4 codes of each block (lo: elements 4k..4k + 3, hi: 16 + 4k..),
// as unsigned bytes plus a bias (mxfp4's values + 12, q8_0's codes + 128 by an xor, q4_0's nibbles, i.e. + 8).
// So 8 vpdpbusd, started from minus the bias times the activation block's sum, leave each block's exact integer sum
// in its own lane (the scalar path's sum) with no horizontal step. The float steps ((scale_w * d_y) * isum) follow,
// and the products go to lane b % 4 in block order: for 4 tokens at once, the 4 products' 128-bit quarters are
// transposed (one register per quarter, a quarter per token) and added in quarter order, so each lane of each token
// adds its blocks in the one-row dot's order and every row and token gets its bits. A row's last, partial group of
// blocks is read in place where that is safe (x86_whole_group), and its products go into the lanes by masked adds (a
// lane without a block stays as it is).

// Bytes off..off + 15 of the codes of blocks m, 4 + m, 8 + m and 12 + m of x, in 128-bit lanes 0-3.
template <typename Block>
KTARGET inline __m512i z_q32_load4(const Block* x, int m, int off) noexcept {
  const auto* p = reinterpret_cast<const std::int8_t*>(x[m].qs) + off;
  constexpr std::size_t step = 4 * sizeof(Block);
  __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + step)), 1);
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * step)), 2);
  return _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * step)), 3);
}

// Bytes off..off + 15 of the codes of blocks 0-15 of x, regrouped so that int32 lane b of register k holds bytes
// off + 4k..off + 4k + 3 of block b (z_q32_load4, then a 4 x 4 transpose of int32 lanes in each 128-bit lane).
template <typename Block>
KTARGET inline void z_q32_load16(const Block* x, int off, __m512i (&q)[4]) noexcept {
  const __m512i r0 = z_q32_load4(x, 0, off), r1 = z_q32_load4(x, 1, off), r2 = z_q32_load4(x, 2, off),
                r3 = z_q32_load4(x, 3, off);
  const __m512i u0 = _mm512_unpacklo_epi32(r0, r1), u1 = _mm512_unpackhi_epi32(r0, r1);
  const __m512i u2 = _mm512_unpacklo_epi32(r2, r3), u3 = _mm512_unpackhi_epi32(r2, r3);
  q[0] = _mm512_unpacklo_epi64(u0, u2);
  q[1] = _mm512_unpackhi_epi64(u0, u2);
  q[2] = _mm512_unpacklo_epi64(u1, u3);
  q[3] = _mm512_unpackhi_epi64(u1, u3);
}

// One token's activations of 16 blocks (zeros past a partial group's last block).
struct alignas(64) ZTok16 {
  std::int8_t lo[4][64];   // [k][4 b + i] = element 4k + i of block b
  std::int8_t hi[4][64];   // element 16 + 4k + i
  std::int32_t start[16];  // minus the format's bias times the sum of block b (what the bias of every code adds)
  float d[16];
};

template <std::int32_t kBias>
KTARGET inline void z_prepare_tok16(const Q8Block* y, int count, ZTok16& a) noexcept {
  if (count < 16) std::memset(&a, 0, sizeof(a));
  if (count == 16) {
    __m512i q[4];
    z_q32_load16(y, 0, q);
    for (int k = 0; k < 4; ++k) _mm512_store_si512(a.lo[k], q[k]);
    z_q32_load16(y, 16, q);
    for (int k = 0; k < 4; ++k) _mm512_store_si512(a.hi[k], q[k]);
  } else {
    for (int b = 0; b < count; ++b) {
      for (int k = 0; k < 4; ++k) {
        std::memcpy(&a.lo[k][4 * b], y[b].qs + 4 * k, 4);
        std::memcpy(&a.hi[k][4 * b], y[b].qs + 16 + 4 * k, 4);
      }
    }
  }
  for (int b = 0; b < count; ++b) {
    a.start[b] = -kBias * y[b].sum;
    a.d[b] = y[b].d;
  }
}

// The products (scale * d) * isum of one token's 16 blocks with decoded codes lo/hi, in block order.
KTARGET inline __m512 z_products16(const __m512i* lo, const __m512i* hi, __m512 scales, const ZTok16& a) noexcept {
  __m512i isum = _mm512_load_si512(a.start);
  for (int k = 0; k < 4; ++k) {
    isum = _mm512_dpbusd_epi32(isum, lo[k], _mm512_load_si512(a.lo[k]));
    isum = _mm512_dpbusd_epi32(isum, hi[k], _mm512_load_si512(a.hi[k]));
  }
  return _mm512_mul_ps(_mm512_mul_ps(scales, _mm512_load_ps(a.d)), _mm512_cvtepi32_ps(isum));
}

// How each format's 16 blocks become the tile's registers: the codes as unsigned bytes (lo, hi) and the scales.
struct ZTileMxfp4 {
  using Block = quant::BlockMXFP4;
  static constexpr std::int32_t kBias = 12;
  KTARGET static void decode(const Block* xg, __m512i (&lo)[4], __m512i (&hi)[4]) noexcept {
    const __m512i values = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Biased)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i q[4];
    z_q32_load16(xg, 0, q);
    for (int k = 0; k < 4; ++k) {
      lo[k] = _mm512_shuffle_epi8(values, _mm512_and_si512(q[k], m4));
      hi[k] = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(q[k], 4), m4));
    }
  }
  // The decode kernel's layout (ZRowTok16): register m holds block 4l + m in 128-bit lane l.
  KTARGET static void decode_by_lane(const Block* xg, __m512i (&lo)[4], __m512i (&hi)[4]) noexcept {
    const __m512i values = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Biased)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int m = 0; m < 4; ++m) {
      const __m512i q = z_q32_load4(xg, m, 0);
      lo[m] = _mm512_shuffle_epi8(values, _mm512_and_si512(q, m4));
      hi[m] = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
    }
  }
  KTARGET static __m512 scales(const Block* xg) noexcept { return z_mxfp4_scales16(xg); }
};
template <X86Q32 F>
struct ZTileQ32 {
  using Block = std::conditional_t<F == X86Q32::q8_0, quant::BlockQ8_0, quant::BlockQ4_0>;
  static constexpr std::int32_t kBias = F == X86Q32::q8_0 ? 128 : 8;
  KTARGET static void decode(const Block* xg, __m512i (&lo)[4], __m512i (&hi)[4]) noexcept {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    if constexpr (F == X86Q32::q8_0) {
      z_q32_load16(xg, 0, lo);
      z_q32_load16(xg, 16, hi);
      for (int k = 0; k < 4; ++k) {
        lo[k] = _mm512_xor_si512(lo[k], flip);
        hi[k] = _mm512_xor_si512(hi[k], flip);
      }
    } else {
      __m512i q[4];
      z_q32_load16(xg, 0, q);
      for (int k = 0; k < 4; ++k) {
        lo[k] = _mm512_and_si512(q[k], m4);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(q[k], 4), m4);
      }
    }
  }
  KTARGET static __m512 scales(const Block* xg) noexcept {
    alignas(32) std::uint16_t d16[16];
    for (int j = 0; j < 16; ++j) d16[j] = xg[j].d;
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16)));
  }
};

// The products f[0..3] of 4 tokens (16 blocks each, in block order) added into a: lane 4i + j of a is lane j of
// token i, and gets blocks j, 4 + j, 8 + j and 12 + j of token i in that order (where keep[s] has the block 4s + j).
KTARGET inline __m512 z_add_quarters(__m512 a, const __m512 (&f)[4], const __mmask16 (&keep)[4]) noexcept {
  const __m512 x0 = _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 x1 = _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 x2 = _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 x3 = _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(3, 2, 3, 2));
  a = _mm512_mask_add_ps(a, keep[0], a, _mm512_shuffle_f32x4(x0, x2, _MM_SHUFFLE(2, 0, 2, 0)));
  a = _mm512_mask_add_ps(a, keep[1], a, _mm512_shuffle_f32x4(x0, x2, _MM_SHUFFLE(3, 1, 3, 1)));
  a = _mm512_mask_add_ps(a, keep[2], a, _mm512_shuffle_f32x4(x1, x3, _MM_SHUFFLE(2, 0, 2, 0)));
  return _mm512_mask_add_ps(a, keep[3], a, _mm512_shuffle_f32x4(x1, x3, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Rows [0, nrows) against N tokens, groups [g0, g0 + ng) of 16 blocks (nb blocks in a row); acc holds the lanes
// between segments (z_add_quarters' layout, 4 tokens a register), `last`: the segment that finishes the rows into out.
template <class Fmt, int N>
KTARGET void z_tile_rows_n(const std::byte* w, std::size_t stride, int nrows, std::int64_t nb, std::int64_t g0, int ng,
                           const ZTok16 (*prepared)[kTokenTile], __m512 (*acc)[kTokenTile / 4], bool last,
                           float* out) noexcept {
  using Block = typename Fmt::Block;
  constexpr int kQuads = (N + 3) / 4;
  constexpr std::size_t kPrefetchBytes = 4096, kPrefetchRows = 4;
  constexpr int kLines = static_cast<int>((16 * sizeof(Block) + 63) / 64);
  const bool whole = g0 == 0 && last;
  for (int r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r) * stride) + 16 * g0;
    __m512 a[kQuads];
    for (int q = 0; q < kQuads; ++q) a[q] = g0 == 0 ? _mm512_setzero_ps() : acc[r][q];
    for (int g = 0; g < ng; ++g) {
      const Block* xg = x + 16 * g;
      const int count = static_cast<int>(std::min<std::int64_t>(16, nb - 16 * (g0 + g)));
      if (count == 16) {
        // A segment that is the whole row streams on; one of several goes on at the same place a few rows down.
        const std::size_t ahead = whole ? kPrefetchBytes : kPrefetchRows * stride;
        for (int i = 0; i < kLines; ++i) _mm_prefetch(reinterpret_cast<const char*>(xg) + ahead + 64 * i, _MM_HINT_T0);
      }
      // Step s adds block 4s + j to lane j (of every token) if there is one: the one-row dot's steps of 8 and 4 and
      // its last blocks.
      __mmask16 keep[4];
      for (int s = 0; s < 4; ++s)
        keep[s] = static_cast<__mmask16>(((1u << std::clamp(count - 4 * s, 0, 4)) - 1) * 0x1111u);
      __m512i lo[4], hi[4];
      Block pad[16];
      xg = x86_whole_group<16>(xg, count, pad);
      Fmt::decode(xg, lo, hi);
      const __m512 scales = Fmt::scales(xg);
      const ZTok16* p = prepared[g];
      for (int q = 0; q < kQuads; ++q) {
        __m512 f[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
          f[i] = 4 * q + i < N ? z_products16(lo, hi, scales, p[4 * q + i]) : _mm512_setzero_ps();
        a[q] = z_add_quarters(a[q], f, keep);
      }
    }
    for (int q = 0; q < kQuads; ++q) {
      if (last) {
        alignas(64) float lanes[16];
        _mm512_store_ps(lanes, a[q]);
        for (int i = 0; i < 4 && 4 * q + i < N; ++i)
          out[(4 * q + i) * kRowTile + r] = reduce_block_lanes(lanes + 4 * i);
      } else {
        acc[r][q] = a[q];
      }
    }
  }
}

template <class Fmt>
KTARGET void z_tile_rows(const std::byte* w, std::size_t stride, int nrows, const std::byte* act,
                         std::size_t act_stride, int ntok, std::int64_t k, float* out) noexcept {
  constexpr int kSegGroups = 8;  // a segment: up to 8 groups of 16 blocks (40 KiB of 8 tokens' activations)
  const std::int64_t nb = k / 32, groups = (nb + 15) / 16;
  if (groups == 0) {
    const float lanes[kBlockLanes] = {};
    for (int t = 0; t < ntok; ++t)
      for (int r = 0; r < nrows; ++r) out[t * kRowTile + r] = reduce_block_lanes(lanes);
    return;
  }
  static_assert(kTokenTile % 4 == 0 && kBlockLanes == 4, "z_add_quarters' layout");
  ZTok16 prepared[kSegGroups][kTokenTile];
  __m512 acc[kRowTile][kTokenTile / 4];
  for (std::int64_t g0 = 0; g0 < groups; g0 += kSegGroups) {
    const int ng = static_cast<int>(std::min<std::int64_t>(kSegGroups, groups - g0));
    for (int g = 0; g < ng; ++g) {
      const std::int64_t b0 = 16 * (g0 + g);
      const int count = static_cast<int>(std::min<std::int64_t>(16, nb - b0));
      for (int t = 0; t < ntok; ++t)
        z_prepare_tok16<Fmt::kBias>(
            reinterpret_cast<const Q8Block*>(act + static_cast<std::size_t>(t) * act_stride) + b0, count,
            prepared[g][t]);
    }
    const bool last = g0 + ng == groups;
    switch (ntok) {
      case 1: z_tile_rows_n<Fmt, 1>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 2: z_tile_rows_n<Fmt, 2>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 3: z_tile_rows_n<Fmt, 3>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 4: z_tile_rows_n<Fmt, 4>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 5: z_tile_rows_n<Fmt, 5>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 6: z_tile_rows_n<Fmt, 6>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 7: z_tile_rows_n<Fmt, 7>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      default: z_tile_rows_n<Fmt, 8>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
    }
  }
}

// ---------------------------------------------------------------- mxfp4, several rows, one token
//
// Decode's matmul: up to kRowTile rows against one token's activations. The token's activations are laid out once
// per call (ZRowTok16), each row's 16 blocks are decoded into 8 registers, register m holding block 4l + m in 128-bit
// lane l (no regrouping of the codes: with one token it would not pay for itself), and after 8 vpdpbusd one 4 x 4
// transpose-and-add gives the 16 blocks' exact integer sums, with no horizontal sum per block. The float steps and
// the order of the lane additions are z_dot_mxfp4's (z_mxfp4_finish does the rows' tails), so every row gets the bits
// of the one-row dot.

// One token's activations of 16 blocks in the decode kernel's layout.
struct alignas(64) ZRowTok16 {
  std::int8_t lo[4][64];  // [m][16 l + i] = element i of block 4l + m
  std::int8_t hi[4][64];  // elements 16 + i
  std::int32_t bias[16];  // mxfp4's bias (12) times the sum of block b
  float d[16];
};

KTARGET inline void z_prepare_row_tok16(const Q8Block* y, ZRowTok16& a) noexcept {
  for (int b = 0; b < 16; ++b) {
    std::memcpy(&a.lo[b % 4][16 * (b / 4)], y[b].qs, 16);
    std::memcpy(&a.hi[b % 4][16 * (b / 4)], y[b].qs + 16, 16);
    a.bias[b] = ZTileMxfp4::kBias * y[b].sum;
    a.d[b] = y[b].d;
  }
}

// The products (scale * d) * isum of the token's 16 blocks with codes lo/hi from decode_by_lane, in block order.
KTARGET inline __m512 z_row_products16(const __m512i* lo, const __m512i* hi, __m512 scales,
                                       const ZRowTok16& a) noexcept {
  __m512i acc[4];
  for (int m = 0; m < 4; ++m) {
    acc[m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[m], _mm512_load_si512(a.lo[m])), hi[m],
                                 _mm512_load_si512(a.hi[m]));
  }
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0], acc[1]), _mm512_unpackhi_epi32(acc[0], acc[1]));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2], acc[3]), _mm512_unpackhi_epi32(acc[2], acc[3]));
  const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1)),
                                        _mm512_load_si512(a.bias));
  return _mm512_mul_ps(_mm512_mul_ps(scales, _mm512_load_ps(a.d)), _mm512_cvtepi32_ps(isum));
}

// Decode's multi-row kernel for q4_0: the tile with one token from kRowsQ4_0MinK on, the one-row dot before.
KTARGET void z_rows_q4_0(const std::byte* w, std::size_t stride, int nrows, const void* act, std::int64_t k,
                         float* out) noexcept {
  if (k < kRowsQ4_0MinK) {
    x86_rows_dot<z_dot_q4_0>(w, stride, nrows, act, k, out);
    return;
  }
  z_tile_rows<ZTileQ32<X86Q32::q4_0>>(w, stride, nrows, static_cast<const std::byte*>(act), 0, 1, k, out);
}

KTARGET void z_rows_mxfp4(const std::byte* w, std::size_t stride, int nrows, const void* act, std::int64_t k,
                          float* out) noexcept {
  constexpr std::int64_t kSegGroups = 16;  // a segment: up to 16 groups of 16 blocks (13 KiB of activations)
  // Rows of up to one segment (K <= 8192) are one stream from row to row. Decoding from DRAM on one thread, the
  // one-row dots' 1024 bytes ahead left this kernel at 19 GB/s (K = 2880), 4096 bytes ahead at 22 GB/s.
  constexpr std::size_t kPrefetchBytes = 4096;
  const auto* y = static_cast<const Q8Block*>(act);
  const std::int64_t nb = k / 32, nb16 = nb / 16 * 16;
  const auto row = [&](int r) {
    return reinterpret_cast<const quant::BlockMXFP4*>(w + static_cast<std::size_t>(r) * stride);
  };
  __m128 acc[kRowTile];
  for (int r = 0; r < nrows; ++r) acc[r] = _mm_setzero_ps();
  ZRowTok16 prepared[kSegGroups];
  for (std::int64_t seg = 0; seg < nb16; seg += 16 * kSegGroups) {
    const int groups = static_cast<int>(std::min<std::int64_t>(kSegGroups, (nb16 - seg) / 16));
    for (int g = 0; g < groups; ++g) z_prepare_row_tok16(y + seg + 16 * g, prepared[g]);
    for (int r = 0; r < nrows; ++r) {
      const quant::BlockMXFP4* x = row(r) + seg;
      __m128 a = acc[r];
      for (int g = 0; g < groups; ++g) {
        const quant::BlockMXFP4* xg = x + 16 * g;
        for (int i = 0; i < 5; ++i)  // 272 bytes a step
          _mm_prefetch(reinterpret_cast<const char*>(xg) + kPrefetchBytes + 64 * i, _MM_HINT_T0);
        __m512i lo[4], hi[4];
        ZTileMxfp4::decode_by_lane(xg, lo, hi);
        const __m512 f = z_row_products16(lo, hi, ZTileMxfp4::scales(xg), prepared[g]);
        a = _mm_add_ps(a, _mm512_castps512_ps128(f));
        a = _mm_add_ps(a, _mm512_extractf32x4_ps(f, 1));
        a = _mm_add_ps(a, _mm512_extractf32x4_ps(f, 2));
        a = _mm_add_ps(a, _mm512_extractf32x4_ps(f, 3));
      }
      // The last segment finishes the row while its tail is in the caches.
      if (seg + 16 * kSegGroups >= nb16) {
        out[r] = z_mxfp4_finish(a, row(r), y, nb16, nb);
      } else {
        acc[r] = a;
      }
    }
  }
  if (nb16 == 0) {
    for (int r = 0; r < nrows; ++r) out[r] = z_mxfp4_finish(_mm_setzero_ps(), row(r), y, 0, nb);
  }
}

// ---------------------------------------------------------------- eight rows, one token (512-bit blocks)

// Totals of eight 16-lane vectors.
KTARGET inline __m256i z_sum8(const __m512i* v) noexcept {
  __m512i p[4], q[2];
  for (int i = 0; i < 4; ++i)
    p[i] =
        _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    q[i] =
        _mm512_add_epi32(_mm512_unpacklo_epi64(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
  // Each 128-bit lane of q[0] holds partial sums of vectors 0-3, of q[1] vectors 4-7.
  const __m512i z = _mm512_add_epi32(_mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i t = _mm512_shuffle_i32x4(z, z, _MM_SHUFFLE(3, 1, 2, 0));
  return _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
}

KTARGET inline __m512i z_load_2x32(const std::int8_t* lo, const std::int8_t* hi) noexcept {
  return _mm512_inserti64x4(_mm512_castsi256_si512(x86_load32(lo)), x86_load32(hi), 1);
}

// int16 lanes 0-15 = lo, lanes 16-31 = hi.
KTARGET inline __m512i z_int16_halves(int lo, int hi) noexcept {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<short>(lo))),
                            _mm256_set1_epi16(static_cast<short>(hi)), 1);
}

// A vpshufb index: int16 lanes 0-15 <- byte `lo` of each 128-bit lane, lanes 16-31 <- byte `hi`.
KTARGET inline __m512i z_spread_index(int lo, int hi) noexcept {
  return z_int16_halves(0x8000 | lo, 0x8000 | hi);
}

// x86_k4_scales of 8 consecutive blocks, four per 512-bit register.
template <typename Block>
KTARGET inline void z_k4_scales8(const Block* x, __m128i* out) noexcept {
  const __m512i pick = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m512i pick_top =
      _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m512i keep =
      _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  for (int h = 0; h < 2; ++h) {
    const auto raw16 = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[4 * h + j].scales)); };
    __m512i raw = _mm512_castsi128_si512(raw16(0));
    raw = _mm512_inserti32x4(raw, raw16(1), 1);
    raw = _mm512_inserti32x4(raw, raw16(2), 2);
    raw = _mm512_inserti32x4(raw, raw16(3), 3);
    const __m512i a = _mm512_shuffle_epi8(raw, pick), top = _mm512_shuffle_epi8(raw, pick_top);
    const __m512i a_hi = _mm512_mask_blend_epi8(0xF000F000F000F000ull, a, _mm512_srli_epi16(a, 4));
    const __m512i r = _mm512_or_si512(_mm512_and_si512(a_hi, keep),
                                      _mm512_and_si512(_mm512_srli_epi16(top, 2), _mm512_set1_epi8(0x30)));
    _mm512_storeu_si512(out + 4 * h, r);
  }
}

// A block format for x86_rows_k: Consts (vector constants, built once per call), Act (one token's
// super-block laid out for the weights, built once per call and read by every row), block() (the
// exact integer sum of one row's super-block, plus the min term of formats with mins), block8()
// (optional: eight consecutive super-blocks of a row), update() (the scalar path's float steps
// for eight rows at once).
struct ZQ4K {
  using Int = __m512i;
  KTARGET static __m256i sum8(const __m512i* v) noexcept { return z_sum8(v); }
  using Block = quant::BlockQ4_K;
  static constexpr bool kMins = true;
  static constexpr bool kShortRows = true;   // x86_rows_k_short for K < 2048: 1.21x at K = 768
  static constexpr std::size_t kWordAt = 0;  // d | dmin << 16
  struct Consts {
    __m512i m4, spread[4];
  };
  // 64 weight bytes hold 4 sub-blocks: the low nibbles of bytes 0-31 / 32-63 are sub-blocks
  // 2c / 2c+2 of that half, the high nibbles 2c+1 / 2c+3; the activations are paired to match.
  struct Act {
    __m512i y[4];
    __m128i pairs;  // bsums[2j] + bsums[2j+1]: activation sum of sub-block j
  };
  KTARGET static Consts consts() noexcept {
    return {_mm512_set1_epi8(0x0F),
            {z_spread_index(0, 2), z_spread_index(1, 3), z_spread_index(4, 6), z_spread_index(5, 7)}};
  }
  KTARGET static void prepare(const Q8KBlock& y, Act& a) noexcept {
    a.y[0] = z_load_2x32(y.qs, y.qs + 64);
    a.y[1] = z_load_2x32(y.qs + 32, y.qs + 96);
    a.y[2] = z_load_2x32(y.qs + 128, y.qs + 192);
    a.y[3] = z_load_2x32(y.qs + 160, y.qs + 224);
    a.pairs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums)),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums + 8)));
  }
  KTARGET static __m512i block(const Consts& c, const Block& x, const Act& a, __m128i& msum) noexcept {
    return block(c, x, x86_k4_scales(x.scales), a, msum);
  }
  KTARGET static void block8(const Consts& c, const Block* x, const Act* a, __m512i* isum, __m128i* msum) noexcept {
    __m128i sm[8];
    z_k4_scales8(x, sm);
    for (int j = 0; j < 8; ++j) isum[j] = block(c, x[j], sm[j], a[j], msum[j]);
  }
  // sm: the block's scales and mins as x86_k4_scales gives them.
  KTARGET static __m512i block(const Consts& c, const Block& x, __m128i sm, const Act& a, __m128i& msum) noexcept {
    const __m512i sc = _mm512_broadcast_i32x4(sm);
    const __m512i q0 = _mm512_loadu_si512(x.qs), q1 = _mm512_loadu_si512(x.qs + 64);
    __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(_mm512_and_si512(q0, c.m4), a.y[0]),
                                    _mm512_shuffle_epi8(sc, c.spread[0]));
    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(q0, 4), c.m4), a.y[1]),
                            _mm512_shuffle_epi8(sc, c.spread[1]));
    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(_mm512_and_si512(q1, c.m4), a.y[2]),
                            _mm512_shuffle_epi8(sc, c.spread[2]));
    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(q1, 4), c.m4), a.y[3]),
                            _mm512_shuffle_epi8(sc, c.spread[3]));
    msum = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), a.pairs);
    return s;
  }
  KTARGET static __m256 update(__m256 acc, float yd, __m256i dd, __m256i is, __m256i ms) noexcept {
    return x86_update_k4(acc, yd, dd, is, ms);
  }
};

// q4_k plus a fifth bit per weight: bit i of qh[l] belongs to sub-block i, byte l.
struct ZQ5K {
  using Int = __m512i;
  KTARGET static __m256i sum8(const __m512i* v) noexcept { return z_sum8(v); }
  using Block = quant::BlockQ5_K;
  static constexpr bool kMins = true;
  static constexpr bool kShortRows = true;  // x86_rows_k_short for K < 2048: 1.02x at K = 768
  static constexpr std::size_t kWordAt = 0;
  using Act = ZQ4K::Act;
  struct Consts {
    ZQ4K::Consts q4;
    __m512i m10, shift[4];  // per int16 lane: the qh bit of that lane's sub-block
  };
  KTARGET static Consts consts() noexcept {
    return {ZQ4K::consts(),
            _mm512_set1_epi8(0x10),
            {z_int16_halves(0, 2), z_int16_halves(1, 3), z_int16_halves(4, 6), z_int16_halves(5, 7)}};
  }
  KTARGET static void prepare(const Q8KBlock& y, Act& a) noexcept { ZQ4K::prepare(y, a); }
  KTARGET static __m512i block(const Consts& c, const Block& x, const Act& a, __m128i& msum) noexcept {
    return block(c, x, x86_k4_scales(x.scales), a, msum);
  }
  KTARGET static void block8(const Consts& c, const Block* x, const Act* a, __m512i* isum, __m128i* msum) noexcept {
    __m128i sm[8];
    z_k4_scales8(x, sm);
    for (int j = 0; j < 8; ++j) isum[j] = block(c, x[j], sm[j], a[j], msum[j]);
  }
  // sm: the block's scales and mins as x86_k4_scales gives them.
  KTARGET static __m512i block(const Consts& c, const Block& x, __m128i sm, const Act& a, __m128i& msum) noexcept {
    const __m512i sc = _mm512_broadcast_i32x4(sm);
    const __m512i q0 = _mm512_loadu_si512(x.qs), q1 = _mm512_loadu_si512(x.qs + 64);
    const __m512i h = _mm512_broadcast_i64x4(x86_load32(x.qh));
    const __m512i m4 = c.q4.m4;
    const __m512i u[4] = {_mm512_and_si512(q0, m4), _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                          _mm512_and_si512(q1, m4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
    __m512i s = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(h, c.shift[v]), 4), c.m10);
      s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(_mm512_or_si512(u[v], hi), a.y[v]),
                              _mm512_shuffle_epi8(sc, c.q4.spread[v]));
    }
    msum = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), a.pairs);
    return s;
  }
  KTARGET static __m256 update(__m256 acc, float yd, __m256i dd, __m256i is, __m256i ms) noexcept {
    return x86_update_k4(acc, yd, dd, is, ms);
  }
};

// 64 weights are groups 4v..4v+3 of 16: int16 lane i of their products takes scale 4v + i / 8.
alignas(64) inline constexpr std::int16_t kQ6KSpread[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

struct ZQ6K {
  using Int = __m512i;
  KTARGET static __m256i sum8(const __m512i* v) noexcept { return z_sum8(v); }
  using Block = quant::BlockQ6_K;
  static constexpr bool kMins = false;
  // The chunked kernel stays: x86_rows_k_short measured 0.96x at K = 768 (qwen3_down in bench_cpu_kernels).
  static constexpr bool kShortRows = false;
  static constexpr std::size_t kWordAt = sizeof(Block) - 4;  // d is the block's last 2 bytes
  struct Consts {
    __m512i m4, m30, spread[4];
  };
  struct Act {
    __m512i y[4];  // elements 64v..64v+63
    __m256i bsums;
  };
  KTARGET static Consts consts() noexcept {
    Consts c{_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30), {}};
    for (int v = 0; v < 4; ++v) c.spread[v] = _mm512_load_si512(kQ6KSpread[v]);
    return c;
  }
  KTARGET static void prepare(const Q8KBlock& y, Act& a) noexcept {
    for (int v = 0; v < 4; ++v) a.y[v] = _mm512_loadu_si512(y.qs + 64 * v);
    a.bsums = x86_load32(y.bsums);
  }
  KTARGET static __m512i block(const Consts& c, const Block& x, const Act& a, __m128i&) noexcept {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m512i sc = _mm512_zextsi256_si512(sc16);
    // The -32 offset of every weight: -32 * sum_g scale[g] * bsums[g].
    __m512i s = _mm512_zextsi256_si512(
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(_mm256_slli_epi16(sc16, 5), a.bsums)));
    for (int half = 0; half < 2; ++half) {
      const __m512i l = _mm512_loadu_si512(x.ql + 64 * half);
      const __m256i qh = x86_load32(x.qh + 32 * half);
      // Bytes 0-31: qh (high bits of weights 0-31 and 64-95 of the half), 32-63: qh >> 2 (32-63, 96-127).
      const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      const __m512i u0 = _mm512_or_si512(_mm512_and_si512(l, c.m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), c.m30));
      const __m512i u1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), c.m4), _mm512_and_si512(h, c.m30));
      s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u0, a.y[2 * half]),
                              _mm512_permutexvar_epi16(c.spread[2 * half], sc));
      s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u1, a.y[2 * half + 1]),
                              _mm512_permutexvar_epi16(c.spread[2 * half + 1], sc));
    }
    return s;
  }
  KTARGET static __m256 update(__m256 acc, float yd, __m256i dd, __m256i is, __m256i ms) noexcept {
    return x86_update_q6(acc, yd, dd, is, ms);
  }
};

// ---------------------------------------------------------------- k-quant rows x up to 8 tokens (512-bit)

// a in lanes 0-3, b in lanes 4-7.
KTARGET inline __m256 z_halves(float a, float b) noexcept {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(a)), _mm_set1_ps(b), 1);
}

// q4_k: vector v holds sub-blocks 2v (low nibbles of qs[32v..32v+31]) and 2v+1 (their high nibbles).
struct ZTileQ4K {
  using Block = quant::BlockQ4_K;
  using Extra = X86Q4K::Extra;
  // The scales of sub-blocks 2v and 2v+1 in s[v]'s halves, the mins and d / dmin (q4_k and q5_k alike).
  template <typename B>
  KTARGET static void scales(const B& x, __m512i* s, Extra& e) noexcept {
    const __m128i sm = x86_k4_scales(x.scales);
    const __m512i sc = _mm512_broadcast_i32x4(sm);
    for (int v = 0; v < 4; ++v) s[v] = _mm512_shuffle_epi8(sc, z_spread_index(2 * v, 2 * v + 1));
    X86Q4K::extra(x, sm, e);
  }
  KTARGET static __m512i nibbles(const std::uint8_t* qs32) noexcept {
    const __m512i q = _mm512_broadcast_i64x4(x86_load32(qs32));
    return _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF0000u, q, 4), _mm512_set1_epi8(0x0F));
  }
  KTARGET static void decode(const Block& x, __m512i* u, __m512i* s, Extra& e) noexcept {
    scales(x, s, e);
    for (int v = 0; v < 4; ++v) u[v] = nibbles(x.qs + 32 * v);
  }
  static constexpr bool kSubBlockSums = true;
  KTARGET static __m256 update(__m256 acc, const Extra& e, const XKTok8& tok, __m256i is) noexcept {
    return X86Q4K::update(acc, e, tok, is);
  }
  // Two rows' blocks (e0: lanes 0-3, e1: lanes 4-7) against the 4 tokens that tok holds twice: update's operations
  // lane by lane.
  KTARGET static __m256 update2(__m256 acc, const Extra& e0, const Extra& e1, const XKTok8& tok, __m256i is) noexcept {
    const __m256i mins = _mm256_inserti128_si256(e0.mins, _mm256_castsi256_si128(e1.mins), 1);
    __m256i ms = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i both = _mm256_permutevar8x32_epi32(mins, _mm256_setr_epi32(p, p, p, p, 4 + p, 4 + p, 4 + p, 4 + p));
      ms = _mm256_add_epi32(ms,
                            _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(tok.pairs[p])), both));
    }
    const __m256 ydv = _mm256_load_ps(tok.d);
    const __m256 dall = _mm256_mul_ps(ydv, z_halves(e0.d, e1.d)), dm = _mm256_mul_ps(ydv, z_halves(e0.dmin, e1.dmin));
    return _mm256_add_ps(
        acc, _mm256_sub_ps(_mm256_mul_ps(dall, _mm256_cvtepi32_ps(is)), _mm256_mul_ps(dm, _mm256_cvtepi32_ps(ms))));
  }
};

// q5_k: q4_k plus bit i of qh[l] for sub-block i, byte l.
struct ZTileQ5K : ZTileQ4K {
  using Block = quant::BlockQ5_K;
  KTARGET static void decode(const Block& x, __m512i* u, __m512i* s, Extra& e) noexcept {
    scales(x, s, e);
    const __m512i h = _mm512_broadcast_i64x4(x86_load32(x.qh));
    for (int v = 0; v < 4; ++v) {
      const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(h, z_int16_halves(2 * v, 2 * v + 1)), 4),
                                          _mm512_set1_epi8(0x10));
      u[v] = _mm512_or_si512(nibbles(x.qs + 32 * v), hi);
    }
  }
};

// q6_k: the AVX2 path's decode (weights in order, a scale per 16), joined in pairs.
struct ZTileQ6K {
  using Block = quant::BlockQ6_K;
  using Extra = X86Q6K::Extra;
  KTARGET static void decode(const Block& x, __m512i* u2, __m512i* s2, Extra& e) noexcept {
    __m256i u[8], s[8];
    X86Q6K::decode(x, u, s, e);
    for (int v = 0; v < 4; ++v) {
      u2[v] = _mm512_inserti64x4(_mm512_castsi256_si512(u[2 * v]), u[2 * v + 1], 1);
      s2[v] = _mm512_inserti64x4(_mm512_castsi256_si512(s[2 * v]), s[2 * v + 1], 1);
    }
  }
  static constexpr bool kSubBlockSums = false;
  KTARGET static __m256 update(__m256 acc, const Extra& e, const XKTok8& tok, __m256i is) noexcept {
    return X86Q6K::update(acc, e, tok, is);
  }
  KTARGET static __m256 update2(__m256 acc, const Extra& e0, const Extra& e1, const XKTok8& tok, __m256i is) noexcept {
    const __m256i sc0 = _mm256_cvtepi8_epi16(e0.sc), sc1 = _mm256_cvtepi8_epi16(e1.sc);
    __m256i bs = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {
      const __m256i both =
          _mm256_permutex2var_epi32(sc0, _mm256_setr_epi32(p, p, p, p, 8 + p, 8 + p, 8 + p, 8 + p), sc1);
      bs = _mm256_add_epi32(bs,
                            _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(tok.pairs[p])), both));
    }
    is = _mm256_sub_epi32(is, _mm256_slli_epi32(bs, 5));  // the -32 of every weight, as x86_tile_update_q6
    const __m256 dall = _mm256_mul_ps(_mm256_load_ps(tok.d), z_halves(e0.d, e1.d));
    return _mm256_add_ps(acc, _mm256_mul_ps(dall, _mm256_cvtepi32_ps(is)));
  }
};

// One row block's 16-lane integer sums (decoded as u, s) with block b of each token's activations y[t], into is[t] for
// t < lanes (zero past ntok). Built in a register and stored whole: zeroing the array first compiles to a rep stos.
KTARGET inline void z_block_sums(const __m512i (&u)[4], const __m512i (&s)[4], const Q8KBlock* const* y, std::int64_t b,
                                 int ntok, int lanes, __m512i* is) noexcept {
  for (int t = 0; t < lanes; ++t) {
    __m512i sum = _mm512_setzero_si512();
    if (t < ntok) {
      const Q8KBlock* yt = y[t] + b;
      for (int v = 0; v < 4; ++v) {
        sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(u[v], _mm512_loadu_si512(yt->qs + 64 * v)), s[v]);
      }
    }
    is[t] = sum;
  }
}

// One row's step for its block x (block b of the tokens y), one token a lane: decode, integer sums, float steps.
template <typename T>
KTARGET inline __m256 z_row_block8(__m256 acc, const typename T::Block& x, const Q8KBlock* const* y, std::int64_t b,
                                   int ntok, const XKTok8& tok) noexcept {
  __m512i u[4], s[4];
  typename T::Extra e;
  T::decode(x, u, s, e);
  __m512i is[8];
  z_block_sums(u, s, y, b, ntok, 8, is);
  return T::update(acc, e, tok, z_sum8(is));
}

// z_tile_rows_k for 2-4 tokens (a Qwen3-MoE expert's share of a prefill chunk): two rows at a time fill the 8 lanes,
// row r's 4 tokens in lanes 0-3 and row r + 1's in 4-7, so that the reduction and the float steps of a block serve
// two rows. Each lane runs the 8-token tile's operations for its row and token, so the bits are the same. An odd last
// row goes through the 8-lane form.
template <typename T>
KTARGET void z_tile_rows_k_pairs(const std::byte* w, std::size_t stride, int nrows, const std::byte* act,
                                 std::size_t act_stride, int ntok, std::int64_t k, float* out) noexcept {
  const std::int64_t nb = k / 256;
  const Q8KBlock* y0[4];
  for (int t = 0; t < 4; ++t)
    y0[t] = reinterpret_cast<const Q8KBlock*>(act + static_cast<std::size_t>(t < ntok ? t : 0) * act_stride);
  const int pairs = nrows / 2;
  __m256 acc[kRowTile / 2];
  for (int q = 0; q < pairs; ++q) acc[q] = _mm256_setzero_ps();
  __m256 last = _mm256_setzero_ps();  // an odd last row, tokens in lanes 0-3
  XKTok8 tok[kKTokSegBlocks];
  for (std::int64_t seg = 0; seg < nb; seg += kKTokSegBlocks) {
    const int count = static_cast<int>(std::min(kKTokSegBlocks, nb - seg));
    for (int b = 0; b < count; ++b) {
      const Q8KBlock* y[8];
      for (int t = 0; t < 8; ++t) y[t] = y0[t % 4] + seg + b;
      x86_prepare_ktok8<T::kSubBlockSums>(y, tok[b]);
    }
    const auto row = [&](int r) {
      return reinterpret_cast<const typename T::Block*>(w + static_cast<std::size_t>(r) * stride) + seg;
    };
    for (int q = 0; q < pairs; ++q) {
      const typename T::Block *x0 = row(2 * q), *x1 = row(2 * q + 1);
      __m256 a = acc[q];
      for (int b = 0; b < count; ++b) {
        __m512i is[8];
        typename T::Extra e[2];
        for (int h = 0; h < 2; ++h) {
          __m512i u[4], s[4];
          T::decode((h == 0 ? x0 : x1)[b], u, s, e[h]);
          z_block_sums(u, s, y0, seg + b, ntok, 4, is + 4 * h);
        }
        a = T::update2(a, e[0], e[1], tok[b], z_sum8(is));
      }
      acc[q] = a;
    }
    if (nrows % 2 != 0) {
      const typename T::Block* x = row(nrows - 1);
      for (int b = 0; b < count; ++b) last = z_row_block8<T>(last, x[b], y0, seg + b, ntok, tok[b]);
    }
  }
  for (int q = 0; q < pairs; ++q) {
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[q]);
    for (int t = 0; t < ntok; ++t) {
      out[t * kRowTile + 2 * q] = v[t];
      out[t * kRowTile + 2 * q + 1] = v[4 + t];
    }
  }
  if (nrows % 2 != 0) {
    alignas(32) float v[8];
    _mm256_store_ps(v, last);
    for (int t = 0; t < ntok; ++t) out[t * kRowTile + nrows - 1] = v[t];
  }
}

// Prefill's k-quant matmul: up to kRowTile rows against up to kTokenTile tokens. Each row's super-block is decoded once
// (the AVX2 path's decode; its 32-weight vectors joined in pairs, so that 64 weights meet 64 consecutive activations),
// multiplied with each token, and the tokens' integer sums are reduced together; the scalar path's float steps then
// run with one token per lane, in the same order, on the tokens' per-block terms (XKTok8), laid out once per call.
// One or two tokens go through the multi-row decode kernel once per token (2 tokens, cached q4_k..q6_k: 1.05-1.2x
// faster than the pairs tile, 1.3x than this one), 3-4 through z_tile_rows_k_pairs (a single row with 3: the decode
// kernel, once per token).
template <typename T, DotRowsFn kRows>
KTARGET void z_tile_rows_k(const std::byte* w, std::size_t stride, int nrows, const std::byte* act,
                           std::size_t act_stride, int ntok, std::int64_t k, float* out) noexcept {
  if (ntok >= 3 && ntok <= 4 && nrows >= 2) {
    z_tile_rows_k_pairs<T>(w, stride, nrows, act, act_stride, ntok, k, out);
    return;
  }
  if (ntok <= kRowsKernelTokens) {
    for (int i = 0; i < ntok; ++i) {
      kRows(w, stride, nrows, act + static_cast<std::size_t>(i) * act_stride, k,
            out + static_cast<std::size_t>(i) * kRowTile);
    }
    return;
  }
  const std::int64_t nb = k / 256;
  // Lanes past ntok read token 0 (valid memory) and are dropped at the end.
  const Q8KBlock* y0[8];
  for (int t = 0; t < 8; ++t)
    y0[t] = reinterpret_cast<const Q8KBlock*>(act + static_cast<std::size_t>(t < ntok ? t : 0) * act_stride);
  __m256 acc[kRowTile];
  for (int r = 0; r < nrows; ++r) acc[r] = _mm256_setzero_ps();
  XKTok8 tok[kKTokSegBlocks];
  for (std::int64_t seg = 0; seg < nb; seg += kKTokSegBlocks) {
    const int count = static_cast<int>(std::min(kKTokSegBlocks, nb - seg));
    for (int b = 0; b < count; ++b) {
      const Q8KBlock* y[8];
      for (int t = 0; t < 8; ++t) y[t] = y0[t] + seg + b;
      x86_prepare_ktok8<T::kSubBlockSums>(y, tok[b]);
    }
    for (int r = 0; r < nrows; ++r) {
      const auto* x = reinterpret_cast<const typename T::Block*>(w + static_cast<std::size_t>(r) * stride) + seg;
      __m256 a = acc[r];
      for (int b = 0; b < count; ++b) a = z_row_block8<T>(a, x[b], y0, seg + b, ntok, tok[b]);
      acc[r] = a;
    }
  }
  for (int r = 0; r < nrows; ++r) {
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[r]);
    for (int t = 0; t < ntok; ++t) out[t * kRowTile + r] = v[t];
  }
}

// portable_exp on 16 lanes: the scalar function's operations, lane by lane.
KTARGET inline __m512 z_portable_exp(__m512 x) noexcept {
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Hi))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(kLn2Lo)));
  __m512 p = _mm512_set1_ps(kExpPoly[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpPoly[i]));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kPortableExpMin), _CMP_LT_OQ), y, _mm512_setzero_ps());
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kPortableExpMax), _CMP_GT_OQ), y,
                           _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

KTARGET void z_swiglu(const float* g, const float* u, float* out, std::int64_t n) noexcept {
  const __m512 one = _mm512_set1_ps(1.0f);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = z_portable_exp(_mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(gv), _mm512_set1_epi32(static_cast<int>(0x80000000u)))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
  }
  swiglu_scalar(g + i, u + i, out + i, n - i);
}

// softmax_block_scalar on 16 lanes: one vector holds the sum's 16 lanes.
KTARGET float z_softmax_block(float* s, int n, float scale, float m, float* sum) noexcept {
  const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx = _mm512_set1_ps(m);
  for (int j = 0; j < n; j += 16) {
    const auto k = static_cast<__mmask16>(n - j >= 16 ? 0xFFFFu : (1u << (n - j)) - 1u);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vs);
    _mm512_mask_storeu_ps(s + j, k, v);
    mx = _mm512_max_ps(_mm512_mask_blend_ps(k, ninf, v), mx);  // a NaN score leaves mx
  }
  const float mn = _mm512_reduce_max_ps(mx);
  const __m512 vm = _mm512_set1_ps(mn);
  __m512 acc = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const auto k = static_cast<__mmask16>(n - j >= 16 ? 0xFFFFu : (1u << (n - j)) - 1u);
    const __m512 e = z_portable_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm));
    _mm512_mask_storeu_ps(s + j, k, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
  }
  *sum = z_tree16(acc);
  return mn;
}

// Elements e..e+15 of a KV row of type T (f32, f16, or q8_0 with e a multiple of 16) as f32, exactly as
// colibri::quant::dequantize_row gives them (q8_0: qs * d).
template <DType T>
KTARGET inline __m512 z_load16(const std::byte* row, int e) noexcept {
  if constexpr (T == DType::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * e)));
  } else if constexpr (T == DType::q8_0) {
    const std::byte* block = row + static_cast<std::size_t>(e / 32) * sizeof(quant::BlockQ8_0);
    std::uint16_t d;
    std::memcpy(&d, block, sizeof(d));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 + e % 32));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(quant::fp16_to_fp32(d)));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + e);
  }
}

// dot_rows_multi for head_dim = 32 * NC: the key row is converted once into 2 * NC registers and
// multiplied with every query; lanes as z_dot_f16 / z_dot_f32 (element e in lane e % 32; q8_0 dequantized first).
template <int NC, DType T>
KTARGET void z_dot_rows(const std::byte* k, std::size_t stride, int nkeys, const float* q, int nq, float* out,
                        std::size_t out_stride) noexcept {
  for (int j = 0; j < nkeys; ++j) {
    const std::byte* row = k + static_cast<std::size_t>(j) * stride;
    __m512 kr[2 * NC];
    for (int i = 0; i < 2 * NC; ++i) kr[i] = z_load16<T>(row, 16 * i);
    for (int n = 0; n < nq; ++n) {
      const float* qn = q + static_cast<std::size_t>(n) * (32 * NC);
      __m512 a0 = _mm512_setzero_ps(), a1 = a0;
      for (int c = 0; c < NC; ++c) {
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(kr[2 * c], _mm512_loadu_ps(qn + 32 * c)));
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(kr[2 * c + 1], _mm512_loadu_ps(qn + 32 * c + 16)));
      }
      out[static_cast<std::size_t>(n) * out_stride + static_cast<std::size_t>(j)] = z_tree32(a0, a1);
    }
  }
}

// scale_axpy_rows_multi on W vectors of columns (16 * W floats from column col) for NQ queries: the
// NQ * W sums stay in registers across the keys, and each value vector is loaded once for all queries.
template <int W, int NQ, DType T>
KTARGET void z_axpy_cols(float* y, std::size_t hd, const float* c, const float* a, std::size_t a_stride,
                         const std::byte* x, std::size_t stride, int nkeys, int col) noexcept {
  __m512 acc[NQ][W];
  for (int n = 0; n < NQ; ++n) {
    const __m512 vc = _mm512_set1_ps(c[n]);
    for (int i = 0; i < W; ++i) acc[n][i] = _mm512_mul_ps(_mm512_loadu_ps(y + n * hd + col + 16 * i), vc);
  }
  for (int j = 0; j < nkeys; ++j) {
    const std::byte* row = x + static_cast<std::size_t>(j) * stride;
    __m512 v[W];
    for (int i = 0; i < W; ++i) v[i] = z_load16<T>(row, col + 16 * i);
    for (int n = 0; n < NQ; ++n) {
      const __m512 va = _mm512_set1_ps(a[n * a_stride + static_cast<std::size_t>(j)]);
      for (int i = 0; i < W; ++i) acc[n][i] = _mm512_add_ps(acc[n][i], _mm512_mul_ps(va, v[i]));
    }
  }
  for (int n = 0; n < NQ; ++n)
    for (int i = 0; i < W; ++i) _mm512_storeu_ps(y + n * hd + col + 16 * i, acc[n][i]);
}

constexpr int kAxpyQueries = 4;  // queries per pass: 4 x 4 sums + 4 value vectors fit the 32 registers
using AxpyColsFn = void (*)(float*, std::size_t, const float*, const float*, std::size_t, const std::byte*, std::size_t,
                            int, int) noexcept;

template <DType T, int... I>
constexpr std::array<AxpyColsFn, sizeof...(I)> z_axpy_table(std::integer_sequence<int, I...>) noexcept {
  return {&z_axpy_cols<I % 4 + 1, I / 4 + 1, T>...};  // index (NQ - 1) * 4 + (W - 1)
}

KTARGET bool z_scale_axpy_rows_multi(float* y, const float* c, const float* a, std::size_t a_stride, int nq,
                                     const void* x, std::size_t stride, int nkeys, std::int64_t hd,
                                     DType type) noexcept {
  if (nkeys < 1 || nq < 1 || hd % (type == DType::q8_0 ? 32 : 16) != 0) return false;
  const auto* rows = static_cast<const std::byte*>(x);
  const auto h = static_cast<std::size_t>(hd);
  return x86_for_kv_type(type, [&](auto t) {
    static constexpr auto kTable =
        z_axpy_table<decltype(t)::value>(std::make_integer_sequence<int, 4 * kAxpyQueries>{});
    for (int n0 = 0; n0 < nq; n0 += kAxpyQueries) {
      const int queries = std::min(kAxpyQueries, nq - n0);
      for (int col = 0; col < hd; col += 64) {
        const int w = static_cast<int>(std::min<std::int64_t>(4, (hd - col) / 16));
        kTable[static_cast<std::size_t>((queries - 1) * 4 + (w - 1))](y + n0 * h, h, c + n0, a + n0 * a_stride,
                                                                      a_stride, rows, stride, nkeys, col);
      }
    }
  });
}

// z_dot_rows<nc, T> for a run-time nc in 1..sizeof...(NC).
template <DType T, int... NC>
KTARGET void z_dot_rows_for(int nc, const std::byte* k, std::size_t stride, int nkeys, const float* q, int nq,
                            float* out, std::size_t out_stride, std::integer_sequence<int, NC...>) noexcept {
  (void)((nc == NC + 1 && (z_dot_rows<NC + 1, T>(k, stride, nkeys, q, nq, out, out_stride), true)) || ...);
}

KTARGET bool z_dot_rows_multi(const void* k, std::size_t stride, int nkeys, const float* q, int nq, std::int64_t hd,
                              DType type, float* out, std::size_t out_stride) noexcept {
  if (hd % 32 != 0 || hd > 256) return false;  // hd / 32 in 1..8
  const auto nc = static_cast<int>(hd / 32);
  const auto* rows = static_cast<const std::byte*>(k);
  return x86_for_kv_type(type, [&](auto t) {
    z_dot_rows_for<decltype(t)::value>(nc, rows, stride, nkeys, q, nq, out, out_stride,
                                       std::make_integer_sequence<int, 8>{});
  });
}

#undef KTARGET

}  // namespace

const KernelSet& avx512_kernels() noexcept {
  static constexpr KernelSet set{"avx512",
                                 z_dot_f32,
                                 z_dot_f16,
                                 z_dot_bf16,
                                 z_dot_q8_0,
                                 z_dot_q4_0,
                                 x86_dot_q2_k,
                                 x86_dot_q3_k,
                                 x86_dot_q4_k,
                                 x86_dot_q5_k,
                                 x86_dot_q6_k,
                                 z_dot_mxfp4,
                                 x86_scale_axpy,
                                 x86_rows_k<ZQ4K>,
                                 x86_rows_k<ZQ6K>,
                                 x86_rows_k<ZQ5K>,
                                 z_rows_mxfp4,
                                 x86_scale_axpy_f16,
                                 x86_quantize_activations,
                                 z_dot_rows_multi,
                                 z_scale_axpy_rows_multi,
                                 z_softmax_block,
                                 z_swiglu,
                                 z_tile_rows<ZTileMxfp4>,
                                 z_tile_rows<ZTileQ32<X86Q32::q8_0>>,
                                 z_tile_rows<ZTileQ32<X86Q32::q4_0>>,
                                 z_tile_rows_k<ZTileQ4K, x86_rows_k<ZQ4K>>,
                                 z_tile_rows_k<ZTileQ5K, x86_rows_k<ZQ5K>>,
                                 z_tile_rows_k<ZTileQ6K, x86_rows_k<ZQ6K>>,
                                 z_rows_q4_0,
                                 x86_rows_k<XQ2K>,
                                 x86_rows_k<XQ3K>,
                                 x86_tile_rows_k<X86Q2K, x86_rows_k<XQ2K>>,
                                 x86_tile_rows_k<X86Q3K, x86_rows_k<XQ3K>>};
  // The initializer is positional: a member left out shifts the last one, and the path silently runs scalar code.
  static_assert(set.swiglu == z_swiglu && set.mxfp4 == z_dot_mxfp4 && set.rows_mxfp4 == z_rows_mxfp4 &&
                    set.tile_rows_mxfp4 == z_tile_rows<ZTileMxfp4> &&
                    set.tile_rows_q8_0 == z_tile_rows<ZTileQ32<X86Q32::q8_0>> &&
                    set.tile_rows_q4_0 == z_tile_rows<ZTileQ32<X86Q32::q4_0>> &&
                    set.tile_rows_q6_k == z_tile_rows_k<ZTileQ6K, x86_rows_k<ZQ6K>> && set.rows_q4_0 == z_rows_q4_0 &&
                    set.tile_rows_q3_k == x86_tile_rows_k<X86Q3K, x86_rows_k<XQ3K>>,
                "list every KernelSet member");
  return set;
}

}  // namespace colibri::cpu
