// AVX2 row kernels (avx2 + fma + f16c; FMA itself is never used so the bits match the scalar path).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "kernels.hpp"

namespace colibri::cpu {
namespace {

#define KTARGET [[maybe_unused]] __attribute__((target("avx2,fma,f16c")))
#define X86_DOT_U8S8 x86_dot_u8s8
#include "kernels_x86.inc"
#undef X86_DOT_U8S8

// ---------------------------------------------------------------- mxfp4, q4_0: several rows, several tokens
//
// Prefill's matmul, the AVX-512 tiles' scheme (z_tile_rows) in 256-bit registers: up to kRowTile rows against up to
// kTokenTile tokens, 8 blocks a group. Each token's activations are laid out once per call (YTok8), each row's 8
// blocks are decoded once into 8 registers in which int32 lane b belongs to block b (register k: elements 4k..4k + 3
// (lo) and 16 + 4k.. (hi) of every block, as unsigned bytes: mxfp4's values + 12, q4_0's nibbles, i.e. + 8). The
// u8 x s8 pairs of 4 registers are summed as int16 (at most 4 x 2 x 24 x 127 = 24384: exact) before one vpmaddwd, so
// each block's exact integer sum, started from minus the bias times the activation block's sum, ends in its lane
// with no horizontal step; then (scale_w * d_y) * isum, and lanes 0-3 get blocks 0-3, then 4-7, for two tokens at
// once (their halves swapped into one register), so every lane adds its blocks in the one-row dot's order and every
// row and token gets the scalar path's bits. A row's last, partial group is read in place where x86_readable_blocks
// allows it, else from a zero-padded copy, and its products go into the lanes by blends. q8_0 keeps x86_tile_q32: its
// codes + 128 would overflow vpmaddubsw's int16 pairs.

// One token's activations of 8 blocks (zeros past a partial group's last block).
struct alignas(32) YTok8 {
  std::int8_t lo[4][32];  // [k][4 b + i] = element 4k + i of block b
  std::int8_t hi[4][32];  // element 16 + 4k + i
  std::int32_t start[8];  // minus the format's bias times the sum of block b
  float d[8];
};

// Bytes off..off + 15 of the codes (qs) of blocks 0-7 of x, regrouped so that int32 lane b of register k holds bytes
// off + 4k..off + 4k + 3 of block b.
template <typename Block>
KTARGET inline void y_codes8(const Block* x, int off, __m256i (&q)[4]) noexcept {
  const auto at = [x, off](int b) {
    return reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint8_t*>(x) + offsetof(Block, qs) +
                                            static_cast<std::size_t>(b) * sizeof(Block) + off);
  };
  __m256i r[4];  // block m in the low 128-bit lane, m + 4 in the high one
  for (int m = 0; m < 4; ++m)
    r[m] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(at(m))), _mm_loadu_si128(at(m + 4)), 1);
  const __m256i u0 = _mm256_unpacklo_epi32(r[0], r[1]), u1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i u2 = _mm256_unpacklo_epi32(r[2], r[3]), u3 = _mm256_unpackhi_epi32(r[2], r[3]);
  q[0] = _mm256_unpacklo_epi64(u0, u2);
  q[1] = _mm256_unpackhi_epi64(u0, u2);
  q[2] = _mm256_unpacklo_epi64(u1, u3);
  q[3] = _mm256_unpackhi_epi64(u1, u3);
}

template <std::int32_t kBias>
KTARGET inline void y_prepare_tok8(const Q8Block* y, int count, YTok8& a) noexcept {
  if (count < 8) std::memset(&a, 0, sizeof(a));
  if (count == 8) {
    __m256i q[4];
    y_codes8(y, 0, q);
    for (int k = 0; k < 4; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(a.lo[k]), q[k]);
    y_codes8(y, 16, q);
    for (int k = 0; k < 4; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(a.hi[k]), q[k]);
  } else {
    for (int b = 0; b < count; ++b)
      for (int k = 0; k < 4; ++k) {
        std::memcpy(&a.lo[k][4 * b], y[b].qs + 4 * k, 4);
        std::memcpy(&a.hi[k][4 * b], y[b].qs + 16 + 4 * k, 4);
      }
  }
  for (int b = 0; b < count; ++b) {
    a.start[b] = -kBias * y[b].sum;
    a.d[b] = y[b].d;
  }
}

KTARGET inline __m256i y_act(const std::int8_t* p) noexcept {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

// The products (scale * d) * isum of one token's 8 blocks with decoded codes lo/hi, in block order.
KTARGET inline __m256 y_products8(const __m256i* lo, const __m256i* hi, __m256 scales, const YTok8& a) noexcept {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.start));
  for (int h = 0; h < 2; ++h) {  // elements 4k..4k + 3 of k = 0, 1 (lo and hi), then k = 2, 3
    const int k = 2 * h;
    const __m256i s = _mm256_add_epi16(
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[k], y_act(a.lo[k])), _mm256_maddubs_epi16(hi[k], y_act(a.hi[k]))),
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[k + 1], y_act(a.lo[k + 1])),
                         _mm256_maddubs_epi16(hi[k + 1], y_act(a.hi[k + 1]))));
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s, ones));
  }
  return _mm256_mul_ps(_mm256_mul_ps(scales, _mm256_load_ps(a.d)), _mm256_cvtepi32_ps(isum));
}

template <X86Q32 F>
struct YTile {
  static_assert(F == X86Q32::mxfp4 || F == X86Q32::q4_0);
  using Block = std::conditional_t<F == X86Q32::mxfp4, quant::BlockMXFP4, quant::BlockQ4_0>;
  static constexpr std::int32_t kBias = F == X86Q32::mxfp4 ? 12 : 8;
  KTARGET static void decode(const Block* xg, __m256i (&lo)[4], __m256i (&hi)[4]) noexcept {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i q[4];
    y_codes8(xg, 0, q);
    for (int k = 0; k < 4; ++k) {
      lo[k] = _mm256_and_si256(q[k], m4);
      hi[k] = _mm256_and_si256(_mm256_srli_epi16(q[k], 4), m4);
      if constexpr (F == X86Q32::mxfp4) {
        const __m256i values =
            _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Biased)));
        lo[k] = _mm256_shuffle_epi8(values, lo[k]);
        hi[k] = _mm256_shuffle_epi8(values, hi[k]);
      }
    }
  }
  KTARGET static __m256 scales(const Block* xg) noexcept {
    if constexpr (F == X86Q32::mxfp4) {
      const __m256i e = _mm256_setr_epi32(xg[0].e, xg[1].e, xg[2].e, xg[3].e, xg[4].e, xg[5].e, xg[6].e, xg[7].e);
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
    } else {
      return _mm256_cvtph_ps(_mm_setr_epi16(static_cast<short>(xg[0].d), static_cast<short>(xg[1].d),
                                            static_cast<short>(xg[2].d), static_cast<short>(xg[3].d),
                                            static_cast<short>(xg[4].d), static_cast<short>(xg[5].d),
                                            static_cast<short>(xg[6].d), static_cast<short>(xg[7].d)));
    }
  }
};

// Rows [0, nrows) against N tokens, groups [g0, g0 + ng) of 8 blocks (nb blocks in a row); acc holds the lanes
// between segments (two tokens a register: lanes 0-3 the first, 4-7 the second), `last`: the segment that finishes
// the rows into out.
template <class Fmt, int N>
KTARGET void y_tile_rows_n(const std::byte* w, std::size_t stride, int nrows, std::int64_t nb, std::int64_t g0, int ng,
                           const YTok8 (*prepared)[kTokenTile], __m256 (*acc)[kTokenTile / 2], bool last,
                           float* out) noexcept {
  using Block = typename Fmt::Block;
  constexpr int kPairs = (N + 1) / 2;
  constexpr std::size_t kPrefetchBytes = 4096, kPrefetchRows = 4;
  constexpr int kLines = static_cast<int>((8 * sizeof(Block) + 63) / 64);
  const bool whole = g0 == 0 && last;
  for (int r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(r) * stride) + 8 * g0;
    __m256 a[kPairs];
    for (int q = 0; q < kPairs; ++q) a[q] = g0 == 0 ? _mm256_setzero_ps() : acc[r][q];
    for (int g = 0; g < ng; ++g) {
      const Block* xg = x + 8 * g;
      const int count = static_cast<int>(std::min<std::int64_t>(8, nb - 8 * (g0 + g)));
      Block pad[8];
      if (count < 8 && x86_readable_blocks<8>(xg, count) < 8) {
        std::memset(static_cast<void*>(pad), 0, sizeof(pad));
        std::memcpy(static_cast<void*>(pad), xg, static_cast<std::size_t>(count) * sizeof(Block));
        xg = pad;
      } else if (count == 8) {
        // A segment that is the whole row streams on; one of several goes on at the same place a few rows down.
        const std::size_t ahead = whole ? kPrefetchBytes : kPrefetchRows * stride;
        for (int i = 0; i < kLines; ++i) _mm_prefetch(reinterpret_cast<const char*>(xg) + ahead + 64 * i, _MM_HINT_T0);
      }
      __m256i lo[4], hi[4];
      Fmt::decode(xg, lo, hi);
      const __m256 scales = Fmt::scales(xg);
      // Lane j of the first step gets block j, of the second block 4 + j, where there is one.
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);
      const __m256 keep0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane));
      const __m256 keep1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count - 4), lane));
      const YTok8* p = prepared[g];
      for (int q = 0; q < kPairs; ++q) {
        const __m256 f0 = y_products8(lo, hi, scales, p[2 * q]);
        const __m256 f1 = 2 * q + 1 < N ? y_products8(lo, hi, scales, p[2 * q + 1]) : _mm256_setzero_ps();
        const __m256 first = _mm256_permute2f128_ps(f0, f1, 0x20), second = _mm256_permute2f128_ps(f0, f1, 0x31);
        if (count == 8) {
          a[q] = _mm256_add_ps(_mm256_add_ps(a[q], first), second);
        } else {
          a[q] = _mm256_blendv_ps(a[q], _mm256_add_ps(a[q], first), keep0);
          a[q] = _mm256_blendv_ps(a[q], _mm256_add_ps(a[q], second), keep1);
        }
      }
    }
    for (int q = 0; q < kPairs; ++q) {
      if (last) {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, a[q]);
        out[2 * q * kRowTile + r] = reduce_block_lanes(lanes);
        if (2 * q + 1 < N) out[(2 * q + 1) * kRowTile + r] = reduce_block_lanes(lanes + 4);
      } else {
        acc[r][q] = a[q];
      }
    }
  }
}

template <class Fmt>
KTARGET void y_tile_rows(const std::byte* w, std::size_t stride, int nrows, const std::byte* act,
                         std::size_t act_stride, int ntok, std::int64_t k, float* out) noexcept {
  constexpr int kSegGroups = 12;  // a segment: up to 12 groups of 8 blocks (30 KiB of 8 tokens' activations)
  const std::int64_t nb = k / 32, groups = (nb + 7) / 8;
  if (groups == 0) {
    const float lanes[kBlockLanes] = {};
    for (int t = 0; t < ntok; ++t)
      for (int r = 0; r < nrows; ++r) out[t * kRowTile + r] = reduce_block_lanes(lanes);
    return;
  }
  static_assert(kTokenTile % 2 == 0 && kBlockLanes == 4, "two tokens' lanes a register");
  YTok8 prepared[kSegGroups][kTokenTile];
  __m256 acc[kRowTile][kTokenTile / 2];
  for (std::int64_t g0 = 0; g0 < groups; g0 += kSegGroups) {
    const int ng = static_cast<int>(std::min<std::int64_t>(kSegGroups, groups - g0));
    for (int g = 0; g < ng; ++g) {
      const std::int64_t b0 = 8 * (g0 + g);
      const int count = static_cast<int>(std::min<std::int64_t>(8, nb - b0));
      for (int t = 0; t < ntok; ++t)
        y_prepare_tok8<Fmt::kBias>(
            reinterpret_cast<const Q8Block*>(act + static_cast<std::size_t>(t) * act_stride) + b0, count,
            prepared[g][t]);
    }
    const bool last = g0 + ng == groups;
    switch (ntok) {
      case 1: y_tile_rows_n<Fmt, 1>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 2: y_tile_rows_n<Fmt, 2>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 3: y_tile_rows_n<Fmt, 3>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 4: y_tile_rows_n<Fmt, 4>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 5: y_tile_rows_n<Fmt, 5>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 6: y_tile_rows_n<Fmt, 6>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      case 7: y_tile_rows_n<Fmt, 7>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
      default: y_tile_rows_n<Fmt, 8>(w, stride, nrows, nb, g0, ng, prepared, acc, last, out); break;
    }
  }
}

#undef KTARGET

}  // namespace

const KernelSet& avx2_kernels() noexcept {
  static constexpr KernelSet set{"avx2",
                                 x86_dot_f32,
                                 x86_dot_f16,
                                 x86_dot_bf16,
                                 x86_dot_q8_0,
                                 x86_dot_q4_0,
                                 x86_dot_q2_k,
                                 x86_dot_q3_k,
                                 x86_dot_q4_k,
                                 x86_dot_q5_k,
                                 x86_dot_q6_k,
                                 x86_dot_mxfp4,
                                 x86_tile_q32<X86Q32::q8_0>,
                                 x86_tile_q32<X86Q32::q4_0>,
                                 x86_tile_k<X86Q2K>,
                                 x86_tile_k<X86Q3K>,
                                 x86_tile_k<X86Q4K>,
                                 x86_tile_k<X86Q5K>,
                                 x86_tile_k<X86Q6K>,
                                 x86_tile_q32<X86Q32::mxfp4>,
                                 x86_scale_axpy,
                                 x86_rows_k<XQ4K>,
                                 x86_rows_k<XQ6K>,
                                 x86_rows_k<XQ5K>,
                                 nullptr,  // rows_mxfp4: one x86_dot_mxfp4 per row
                                 x86_scale_axpy_f16,
                                 x86_quantize_activations,
                                 x86_dot_rows_multi,
                                 x86_scale_axpy_rows_multi,
                                 x86_softmax_block,
                                 x86_swiglu,
                                 y_tile_rows<YTile<X86Q32::mxfp4>>,
                                 nullptr,  // tile_rows_q8_0: x86_tile_q32 (see y_tile_rows)
                                 y_tile_rows<YTile<X86Q32::q4_0>>};
  // The initializer is positional: a member left out shifts the last one, and the path silently runs scalar code.
  static_assert(set.swiglu == x86_swiglu && set.mxfp4 == x86_dot_mxfp4 &&
                    set.tile_rows_mxfp4 == y_tile_rows<YTile<X86Q32::mxfp4>> &&
                    set.tile_rows_q4_0 == y_tile_rows<YTile<X86Q32::q4_0>>,
                "list every KernelSet member");
  return set;
}

}  // namespace colibri::cpu
