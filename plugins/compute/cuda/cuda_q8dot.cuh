// compute/cuda: integer dot products of each block format with 8-bit activations, shared by the matmul kernel and a
// host-side test (cuda_dequant_test.cpp) that checks every format against colibri::quant without a GPU.
//
// Without kExactActivations the SDK lets a quantized matmul quantize X per token, as the CPU backend does: per 256
// elements for the k-quants (its q8_K), per 32 for q8_0 and q4_0 (its q8_0), d = amax / 127. A warp then walks a
// row one 256-element unit at a time with 8 lanes per unit: lane j of a unit takes the 16 activations at xoff0(j)
// and the 16 at xoff1(j), and part() turns the matching 32 weights into one float, exact integer sums (dp4a) inside
// and a scale product or two outside. The kernel adds dx * part, dx being the activation scale of the lane's
// elements. A lane's bytes neighbour its neighbours' bytes, so a warp's loads are coalesced.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_dequant.cuh"

namespace colibri::cuda::q8dot {

using dequant::byte12;
using dequant::byte8;
using dequant::f16_at;
using dequant::half_bits;
using dequant::load_words;
using dequant::mul_rn;
using dequant::sub_rn;

// dx * part + acc with one rounding, on the host as on the device.
COLIBRI_HD float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

constexpr int kUnit = 256;

// N consecutive activations: N / 4 words of int8 and their sum. A lane takes two such runs of a unit (xoff0, xoff1).
template <int N>
struct XQ {
  std::uint32_t q[N / 4];
  int sum;
};
using X16 = XQ<16>;
using X32 = XQ<32>;

// Sum of the products of the four signed bytes of a and b, plus c.
COLIBRI_HD int dp4a(std::uint32_t a, std::uint32_t b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 4; ++i) {
    c += static_cast<int>(static_cast<std::int8_t>(a >> (8 * i))) *
         static_cast<int>(static_cast<std::int8_t>(b >> (8 * i)));
  }
  return c;
#endif
}
// The integer dot product of 4 W weights (signed bytes) with a run of as many activations.
template <int W>
COLIBRI_HD int dot_run(const std::uint32_t (&w)[W], const XQ<4 * W>& x) {
  int s = 0;
  COLIBRI_UNROLL
  for (int i = 0; i < W; ++i) s = dp4a(w[i], x.q[i], s);
  return s;
}
COLIBRI_HD int dot16(const std::uint32_t (&w)[4], const X16& x) {
  return dot_run(w, x);
}
// Bits `shift`.. of every byte of four words, under `mask` (0x0F0F0F0F: nibbles, 0x03030303: two bits).
template <int W>
COLIBRI_HD void bits(const std::uint32_t (&q)[W], int shift, std::uint32_t mask, std::uint32_t (&out)[W]) {
  COLIBRI_UNROLL
  for (int i = 0; i < W; ++i) out[i] = (q[i] >> shift) & mask;
}
// ORs bit `bit` of every byte of h, moved to bit `to`, into out.
COLIBRI_HD void add_high(const std::uint32_t (&h)[4], int bit, std::uint32_t mask, int to, std::uint32_t (&out)[4]) {
  COLIBRI_UNROLL
  for (int i = 0; i < 4; ++i) out[i] |= ((h[i] >> bit) & mask) << to;
}

// 16 bytes at p: one 16-byte load where `vec` says p allows it, else words; the same bytes either way.
COLIBRI_HD void load16(const std::uint8_t* p, bool vec, std::uint32_t (&w)[4]) {
#ifdef __CUDA_ARCH__
  if (vec) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    return;
  }
#else
  (void)vec;
#endif
  load_words(p, w);
}

// 32 bytes at p as two load16s (the pairs layouts' runs).
COLIBRI_HD void load32(const std::uint8_t* p, bool vec, std::uint32_t (&w)[8]) {
  std::uint32_t a[4], b[4];
  load16(p, vec, a);
  load16(p + 16, vec, b);
  COLIBRI_UNROLL
  for (int i = 0; i < 4; ++i) w[i] = a[i], w[4 + i] = b[i];
}

// d * isum - dmin * imin: the k-quants with a minimum per sub-block.
COLIBRI_HD float scaled_minus_min(float d, int isum, float dmin, int imin) {
  return sub_rn(mul_rn(d, static_cast<float>(isum)), mul_rn(dmin, static_cast<float>(imin)));
}

// d * (s0 * sum((a - offset) * xa) + s1 * sum((b - offset) * xb)): the formats whose values carry a fixed offset
// (q6_k 32, q3_k 4, q4_0 8), taken off through the activations' sums.
template <int NT>
COLIBRI_HD void offset_parts(float d, int s0, int s1, int offset, const std::uint32_t (&a)[4],
                             const std::uint32_t (&b)[4], const X16 (&xa)[NT], const X16 (&xb)[NT], float (&out)[NT]) {
  COLIBRI_UNROLL
  for (int i = 0; i < NT; ++i) {
    const int isum = s0 * (dot16(a, xa[i]) - offset * xa[i].sum) + s1 * (dot16(b, xb[i]) - offset * xb[i].sum);
    out[i] = mul_rn(d, static_cast<float>(isum));
  }
}

// __byte_perm on the device; on the host its documented result: byte i of the result is byte s<4i+2:4i> of y:x (bit 3
// of each selector nibble and the selector's upper 16 bits unused).
COLIBRI_HD std::uint32_t byte_perm(std::uint32_t x, std::uint32_t y, std::uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const std::uint64_t bytes = (static_cast<std::uint64_t>(y) << 32) | x;
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<std::uint32_t>(bytes >> (8 * ((s >> (4 * i)) & 7)) & 0xFFu) << (8 * i);
  return r;
#endif
}

// part() of a format that splits it into fetch() (the unit's loads) and use() (the arithmetic), so that a walk of
// several units can issue all their loads before the first use.
template <class F>
struct FetchThenUse {
  template <int NT, int N>
  COLIBRI_HD static void part(const std::uint8_t* b, int j, bool vec, const XQ<N> (&xa)[NT], const XQ<N> (&xb)[NT],
                              float (&out)[NT]) {
    typename F::Raw raw;
    F::fetch(b, j, vec, raw);
    F::template use<NT>(raw, j, xa, xb, out);
  }
};

// q4_k / q5_k: lane j takes 16 bytes of the sub-block pair p = j / 2 (its low nibbles are 16 elements of sub-block
// 2p, its high nibbles the same 16 of sub-block 2p + 1).
struct K4Lanes {
  static constexpr int kXBlock = 256;
  COLIBRI_HD static int xoff0(int j) { return 64 * (j / 2) + 16 * (j % 2); }
  COLIBRI_HD static int xoff1(int j) { return xoff0(j) + 32; }
  // The 6-bit scales and mins of sub-blocks a = 2p and a + 1 (dequant::k4_scale_min) as the bytes sc_a, sc_a+1, mn_a,
  // mn_a+1 of one word, by byte permutes: p < 2 keeps the low 6 bits of scales[a, a+1] and scales[a+4, a+5]; p >= 2
  // joins the nibbles of scales[a+4, a+5] with the top two bits of scales[a-4, a-3] and scales[a, a+1]. A lane's p is
  // fixed, so both are a handful of instructions without a branch.
  COLIBRI_HD static std::uint32_t scales_mins(const std::uint32_t (&head)[4], int j) {
    return pair_scales_mins(head, j / 2);
  }
  COLIBRI_HD static std::uint32_t pair_scales_mins(const std::uint32_t (&head)[4], int p) {
    const std::uint32_t a = 2u * static_cast<std::uint32_t>(p % 2);  // a, less 4 where p >= 2
    const std::uint32_t pair = byte_perm(head[1], head[2], a | (a + 1) << 4 | (a + 4) << 8 | (a + 5) << 12);
    if (p < 2) return pair & 0x3F3F3F3Fu;
    const std::uint32_t low = byte_perm(head[3], head[3], a | (a + 1) << 4 | a << 8 | (a + 1) << 12);
    return (low & 0x00000F0Fu) | ((low >> 4) & 0x0F0F0000u) | ((pair & 0xC0C0C0C0u) >> 2);
  }
  // The parts of the sub-block pair whose scales and mins sm packs: lo are values of its first sub-block at xa, hi of
  // its second at xb (runs of 16 here, of 32 in the pairs layout).
  template <int NT, int W>
  COLIBRI_HD static void pair_parts(const std::uint32_t (&head)[4], std::uint32_t sm, const std::uint32_t (&lo)[W],
                                    const std::uint32_t (&hi)[W], const XQ<4 * W> (&xa)[NT], const XQ<4 * W> (&xb)[NT],
                                    float (&out)[NT]) {
    const int sc0 = static_cast<int>(sm & 0xFFu), sc1 = static_cast<int>((sm >> 8) & 0xFFu);
    const int mn0 = static_cast<int>((sm >> 16) & 0xFFu), mn1 = static_cast<int>(sm >> 24);
    const float d = half_bits(head[0]), dmin = half_bits(head[0] >> 16);
    COLIBRI_UNROLL
    for (int i = 0; i < NT; ++i) {
      out[i] = scaled_minus_min(d, sc0 * dot_run(lo, xa[i]) + sc1 * dot_run(hi, xb[i]), dmin,
                                mn0 * xa[i].sum + mn1 * xb[i].sum);
    }
  }
  template <int NT>
  COLIBRI_HD static void finish(const std::uint32_t (&head)[4], int j, const std::uint32_t (&lo)[4],
                                const std::uint32_t (&hi)[4], const X16 (&xa)[NT], const X16 (&xb)[NT],
                                float (&out)[NT]) {
    pair_parts(head, scales_mins(head, j), lo, hi, xa, xb, out);
  }
};

// q4_k / q5_k in the pairs layout (candidates, timed by colibri_bench_cuda_gemv against Q4_K and Q5_K): 4 lanes a
// unit, lane j takes the whole sub-block pair j (its low nibbles are sub-block 2j, its high nibbles 2j + 1), so one
// load of the 16-byte head and one unpacking of its scales serve 64 weights rather than 32. The integer sums span 32
// activations where K4Lanes' span 16: the same terms, rounded in another order, so the bits differ from the default's.
struct K4Pairs {
  static constexpr int kXBlock = 256;
  static constexpr int kUnitLanes = 4;
  static constexpr int kSpan = 32;
  static constexpr bool kVector = true;
  COLIBRI_HD static int xoff0(int j) { return 64 * j; }
  COLIBRI_HD static int xoff1(int j) { return 64 * j + 32; }
  template <int NT>
  COLIBRI_HD static void finish(const std::uint32_t (&head)[4], int j, const std::uint32_t (&lo)[8],
                                const std::uint32_t (&hi)[8], const X32 (&xa)[NT], const X32 (&xb)[NT],
                                float (&out)[NT]) {
    K4Lanes::pair_parts(head, K4Lanes::pair_scales_mins(head, j), lo, hi, xa, xb, out);
  }
};

struct Q4_K : K4Lanes, FetchThenUse<Q4_K> {  // 144 bytes per unit: d, dmin, scales[12], qs[128]
  static constexpr int kUnitBytes = 144;
  static constexpr bool kVector = true;  // 16-byte loads when the row allows
  struct Raw {
    std::uint32_t head[4], q[4];
  };
  COLIBRI_HD static void fetch(const std::uint8_t* b, int j, bool vec, Raw& raw) {
    load16(b, vec, raw.head);
    load16(b + 16 + 32 * (j / 2) + 16 * (j % 2), vec, raw.q);
  }
  template <int NT>
  COLIBRI_HD static void use(const Raw& raw, int j, const X16 (&xa)[NT], const X16 (&xb)[NT], float (&out)[NT]) {
    std::uint32_t lo[4], hi[4];
    bits(raw.q, 0, 0x0F0F0F0Fu, lo);
    bits(raw.q, 4, 0x0F0F0F0Fu, hi);
    finish(raw.head, j, lo, hi, xa, xb, out);
  }
};

// q4_k in the pairs layout: lane j takes the 32 bytes of qs of sub-block pair j.
struct Q4_K_Pairs : K4Pairs, FetchThenUse<Q4_K_Pairs> {
  static constexpr int kUnitBytes = 144;
  struct Raw {
    std::uint32_t head[4], q[8];
  };
  COLIBRI_HD static void fetch(const std::uint8_t* b, int j, bool vec, Raw& raw) {
    load16(b, vec, raw.head);
    load32(b + 16 + 32 * j, vec, raw.q);
  }
  template <int NT>
  COLIBRI_HD static void use(const Raw& raw, int j, const X32 (&xa)[NT], const X32 (&xb)[NT], float (&out)[NT]) {
    std::uint32_t lo[8], hi[8];
    bits(raw.q, 0, 0x0F0F0F0Fu, lo);
    bits(raw.q, 4, 0x0F0F0F0Fu, hi);
    finish(raw.head, j, lo, hi, xa, xb, out);
  }
};

// q5_k in the pairs layout: lane j takes the 32 bytes of qs of sub-block pair j and all 32 bytes of qh, whose bits 2j
// and 2j + 1 are the fifth bits of sub-blocks 2j and 2j + 1.
struct Q5_K_Pairs : K4Pairs, FetchThenUse<Q5_K_Pairs> {
  static constexpr int kUnitBytes = 176;
  struct Raw {
    std::uint32_t head[4], qh[8], q[8];
  };
  COLIBRI_HD static void fetch(const std::uint8_t* b, int j, bool vec, Raw& raw) {
    load16(b, vec, raw.head);
    load32(b + 16, vec, raw.qh);
    load32(b + 48 + 32 * j, vec, raw.q);
  }
  template <int NT>
  COLIBRI_HD static void use(const Raw& raw, int j, const X32 (&xa)[NT], const X32 (&xb)[NT], float (&out)[NT]) {
    std::uint32_t lo[8], hi[8];
    bits(raw.q, 0, 0x0F0F0F0Fu, lo);
    bits(raw.q, 4, 0x0F0F0F0Fu, hi);
    COLIBRI_UNROLL
    for (int i = 0; i < 8; ++i) {
      lo[i] |= ((raw.qh[i] >> (2 * j)) & 0x01010101u) << 4;
      hi[i] |= ((raw.qh[i] >> (2 * j + 1)) & 0x01010101u) << 4;
    }
    finish(raw.head, j, lo, hi, xa, xb, out);
  }
};

struct Q5_K : K4Lanes, FetchThenUse<Q5_K> {  // 176 bytes per unit: d, dmin, scales[12], qh[32], qs[128]
  static constexpr int kUnitBytes = 176;
  static constexpr bool kVector = true;
  struct Raw {
    std::uint32_t head[4], qh[4], q[4];
  };
  COLIBRI_HD static void fetch(const std::uint8_t* b, int j, bool vec, Raw& raw) {
    const int p = j / 2, h = j % 2;
    load16(b, vec, raw.head);
    load16(b + 16 + 16 * h, vec, raw.qh);  // the fifth bit of element e of sub-block s: bit s of qh[e % 32]
    load16(b + 48 + 32 * p + 16 * h, vec, raw.q);
  }
  template <int NT>
  COLIBRI_HD static void use(const Raw& raw, int j, const X16 (&xa)[NT], const X16 (&xb)[NT], float (&out)[NT]) {
    const int p = j / 2;
    std::uint32_t lo[4], hi[4];
    bits(raw.q, 0, 0x0F0F0F0Fu, lo);
    bits(raw.q, 4, 0x0F0F0F0Fu, hi);
    add_high(raw.qh, 2 * p, 0x01010101u, 4, lo);
    add_high(raw.qh, 2 * p + 1, 0x01010101u, 4, hi);
    finish(raw.head, j, lo, hi, xa, xb, out);
  }
};

// q6_k: lane j takes half hh = j / 4, quarter sel = (j / 2) % 2, l0 = 16 (j % 2): 16 bytes of ql at
// 64 hh + 32 sel + l0, whose low nibbles are elements 128 hh + 32 sel + l0 .. and high nibbles those 64 further,
// and the 16 bytes of qh that hold their top two bits. Values are 0..63 here, the -32 comes off with the sums.
struct Q6_K : FetchThenUse<Q6_K> {  // 210 bytes per unit: ql[128], qh[64], scales[16] (int8), d
  static constexpr int kUnitBytes = 210;
  static constexpr bool kVector = false;
  static constexpr int kXBlock = 256;
  COLIBRI_HD static int xoff0(int j) { return 128 * (j / 4) + 32 * ((j / 2) % 2) + 16 * (j % 2); }
  COLIBRI_HD static int xoff1(int j) { return xoff0(j) + 64; }
  struct Raw {
    std::uint32_t ql[4], qh[4], sc[2];
    unsigned d;  // fp16 bits, converted in use(): a conversion here would wait for the load
  };
  COLIBRI_HD static void fetch(const std::uint8_t* b, int j, bool, Raw& raw) {
    const int hh = j / 4, sel = (j / 2) % 2, l0 = 16 * (j % 2);
    load_words(b + 64 * hh + 32 * sel + l0, raw.ql);
    load_words(b + 128 + 32 * hh + l0, raw.qh);
    load_words(b + 192 + 8 * hh, raw.sc);
#ifdef __CUDA_ARCH__
    raw.d = __ldg(reinterpret_cast<const unsigned short*>(b + 208));
#else
    std::uint16_t h;
    std::memcpy(&h, b + 208, 2);
    raw.d = h;
#endif
  }
  template <int NT>
  COLIBRI_HD static void use(const Raw& raw, int j, const X16 (&xa)[NT], const X16 (&xb)[NT], float (&out)[NT]) {
    const int sel = (j / 2) % 2, l0 = 16 * (j % 2);
    std::uint32_t lo[4], hi[4];
    const int is = 2 * sel + l0 / 16;
    const int s0 = static_cast<std::int8_t>(byte8(raw.sc[0], raw.sc[1], is));
    const int s1 = static_cast<std::int8_t>(byte8(raw.sc[0], raw.sc[1], is + 4));
    bits(raw.ql, 0, 0x0F0F0F0Fu, lo);
    bits(raw.ql, 4, 0x0F0F0F0Fu, hi);
    add_high(raw.qh, 2 * sel, 0x03030303u, 4, lo);
    add_high(raw.qh, 4 + 2 * sel, 0x03030303u, 4, hi);
    offset_parts(half_bits(raw.d), s0, s1, 32, lo, hi, xa, xb, out);
  }
};

// q2_k / q3_k: lane j takes half h = j / 4 and shift s = j % 4: bits 2s.. of the 32 bytes qs[32h ..] are elements
// 128 h + 32 s .., two 16-element sub-blocks.
struct K2Lanes {
  static constexpr int kXBlock = 256;
  static constexpr bool kVector = false;
  COLIBRI_HD static int xoff0(int j) { return 128 * (j / 4) + 32 * (j % 4); }
  COLIBRI_HD static int xoff1(int j) { return xoff0(j) + 16; }
};

struct Q2_K : K2Lanes {  // 84 bytes per unit: scales[16] (scale | min << 4), qs[64], d, dmin
  static constexpr int kUnitBytes = 84;
  template <int NT>
  COLIBRI_HD static void part(const std::uint8_t* b, int j, bool, const X16 (&xa)[NT], const X16 (&xb)[NT],
                              float (&out)[NT]) {
    const int h = j / 4, s = j % 4;
    std::uint32_t sc[4], q0[4], q1[4], dm[1], qa[4], qb[4];
    load_words(b, sc);
    load_words(b + 16 + 32 * h, q0);
    load_words(b + 32 + 32 * h, q1);
    load_words(b + 80, dm);
    bits(q0, 2 * s, 0x03030303u, qa);
    bits(q1, 2 * s, 0x03030303u, qb);
    const int s0 = dequant::byte_at(sc, 8 * h + 2 * s), s1 = dequant::byte_at(sc, 8 * h + 2 * s + 1);
    const float d = half_bits(dm[0]), dmin = half_bits(dm[0] >> 16);
    COLIBRI_UNROLL
    for (int i = 0; i < NT; ++i) {
      out[i] = scaled_minus_min(d, (s0 & 0xF) * dot16(qa, xa[i]) + (s1 & 0xF) * dot16(qb, xb[i]), dmin,
                                (s0 >> 4) * xa[i].sum + (s1 >> 4) * xb[i].sum);
    }
  }
};

struct Q3_K : K2Lanes {  // 110 bytes per unit: hmask[32], qs[64], scales[12], d
  static constexpr int kUnitBytes = 110;
  template <int NT>
  COLIBRI_HD static void part(const std::uint8_t* b, int j, bool, const X16 (&xa)[NT], const X16 (&xb)[NT],
                              float (&out)[NT]) {
    const int h = j / 4, s = j % 4;
    std::uint32_t h0[4], h1[4], q0[4], q1[4], sc[3], qa[4], qb[4];
    load_words(b, h0);
    load_words(b + 16, h1);
    load_words(b + 32 + 32 * h, q0);
    load_words(b + 48 + 32 * h, q1);
    load_words(b + 96, sc);
    const float d = f16_at(b + 108);
    // Values 0..7 here (two low bits, the hmask bit as 4); the -4 comes off with the sums.
    bits(q0, 2 * s, 0x03030303u, qa);
    bits(q1, 2 * s, 0x03030303u, qb);
    add_high(h0, 4 * h + s, 0x01010101u, 2, qa);
    add_high(h1, 4 * h + s, 0x01010101u, 2, qb);
    const int s0 = dequant::Q3_K::scale(sc, 8 * h + 2 * s), s1 = dequant::Q3_K::scale(sc, 8 * h + 2 * s + 1);
    offset_parts(d, s0, s1, 4, qa, qb, xa, xb, out);
  }
};

// q8_0 / q4_0: lane j takes block j of the unit (32 elements), activations quantized per 32 as well.
struct B32Lanes {
  static constexpr int kXBlock = 32;
  static constexpr bool kVector = false;
  COLIBRI_HD static int xoff0(int j) { return 32 * j; }
  COLIBRI_HD static int xoff1(int j) { return 32 * j + 16; }
};

struct Q8_0 : B32Lanes {  // 34-byte blocks: d, qs[32]
  static constexpr int kUnitBytes = 8 * 34;
  template <int NT>
  COLIBRI_HD static void part(const std::uint8_t* b, int j, bool, const X16 (&xa)[NT], const X16 (&xb)[NT],
                              float (&out)[NT]) {
    const std::uint8_t* blk = b + 34 * j;
    std::uint32_t qa[4], qb[4];
    load_words(blk + 2, qa);
    load_words(blk + 18, qb);
    const float d = f16_at(blk);
    COLIBRI_UNROLL
    for (int i = 0; i < NT; ++i) out[i] = mul_rn(d, static_cast<float>(dot16(qa, xa[i]) + dot16(qb, xb[i])));
  }
};

struct Q4_0 : B32Lanes {  // 18-byte blocks: d, qs[16] (low nibbles elements 0..15, high nibbles 16..31)
  static constexpr int kUnitBytes = 8 * 18;
  template <int NT>
  COLIBRI_HD static void part(const std::uint8_t* b, int j, bool, const X16 (&xa)[NT], const X16 (&xb)[NT],
                              float (&out)[NT]) {
    const std::uint8_t* blk = b + 18 * j;
    std::uint32_t q[4], lo[4], hi[4];
    load_words(blk + 2, q);
    const float d = f16_at(blk);
    bits(q, 0, 0x0F0F0F0Fu, lo);
    bits(q, 4, 0x0F0F0F0Fu, hi);
    offset_parts(d, 1, 1, 8, lo, hi, xa, xb, out);
  }
};

// The e2m1 values (dequant::e2m1_value: 0, 1, 2, 3, 4, 6, 8, 12, bit 3 the sign) of the four 4-bit codes in bits
// 0-15 of `codes` as four signed bytes: the magnitudes and their negatives looked up by the codes' low 3 bits, then
// each byte taken from one or the other by its code's bit 3. Three byte permutes for four weights.
COLIBRI_HD std::uint32_t e2m1_bytes(std::uint32_t codes) {
  const std::uint32_t pos = byte_perm(0x03020100u, 0x0C080604u, codes);
  const std::uint32_t neg = byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, codes);
  return byte_perm(pos, neg, 0x3210u | ((codes >> 1) & 0x4444u));
}

// mxfp4 (gpt-oss's experts): 17-byte blocks at any byte offset, e (an e8m0 scale) then qs[16] (low nibbles elements
// 0..15, high nibbles 16..31). part = e8m0_half(e) * sum(value * x): the integer sum is exact, as on the CPU.
struct MXFP4 : B32Lanes {
  static constexpr int kUnitBytes = 8 * 17;
  template <int NT>
  COLIBRI_HD static void part(const std::uint8_t* b, int j, bool, const X16 (&xa)[NT], const X16 (&xb)[NT],
                              float (&out)[NT]) {
    const std::uint8_t* blk = b + 17 * j;
#ifdef __CUDA_ARCH__
    const float d = dequant::e8m0_half(__ldg(blk));
#else
    const float d = dequant::e8m0_half(*blk);
#endif
    std::uint32_t q[4];
    load_words(blk + 1, q);  // ends at the block's last byte
    // Bits 0-15 of q[w] are the codes of elements 4w, 16 + 4w, 4w + 1 and 17 + 4w (a byte's low nibble, then its high
    // one), bits 16-31 those of 4w + 2, 18 + 4w, 4w + 3 and 19 + 4w; the activations are interleaved to match.
    std::uint32_t v[8];
    COLIBRI_UNROLL
    for (int w = 0; w < 4; ++w) {
      v[2 * w] = e2m1_bytes(q[w]);
      v[2 * w + 1] = e2m1_bytes(q[w] >> 16);
    }
    COLIBRI_UNROLL
    for (int i = 0; i < NT; ++i) {
      int isum = 0;
      COLIBRI_UNROLL
      for (int w = 0; w < 4; ++w) {
        isum = dp4a(v[2 * w], byte_perm(xa[i].q[w], xb[i].q[w], 0x5140u), isum);
        isum = dp4a(v[2 * w + 1], byte_perm(xa[i].q[w], xb[i].q[w], 0x7362u), isum);
      }
      out[i] = mul_rn(d, static_cast<float>(isum));
    }
  }
};

// Whether a matmul of `F` weights with rows of k elements takes 8-bit activations: whole 256-element units, or for the
// formats whose lanes take one 32-element block each (q8_0, q4_0, mxfp4), whole blocks, the last unit then partial.
template <class F>
COLIBRI_HD bool takes_k(long long k) {
  return k > 0 && k % F::kXBlock == 0 && (F::kXBlock == 32 || k % kUnit == 0);
}

// N activations at p (16-byte aligned); their sum comes from the quantizer (load_sum).
template <int N>
COLIBRI_HD void fetch_x(const std::int8_t* p, XQ<N>& x) {
#ifdef __CUDA_ARCH__
  COLIBRI_UNROLL
  for (int h = 0; h < N / 16; ++h) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + h);
    x.q[4 * h] = v.x, x.q[4 * h + 1] = v.y, x.q[4 * h + 2] = v.z, x.q[4 * h + 3] = v.w;
  }
#else
  std::memcpy(x.q, p, N);
#endif
}

// A format's lanes per 256-element unit (8 unless it says kUnitLanes) and the activations in each of a lane's two
// runs (16 unless it says kSpan).
template <class F, class = void>
struct UnitLanes : std::integral_constant<int, 8> {};
template <class F>
struct UnitLanes<F, std::void_t<decltype(F::kUnitLanes)>> : std::integral_constant<int, F::kUnitLanes> {};
template <class F, class = void>
struct Span : std::integral_constant<int, 16> {};
template <class F>
struct Span<F, std::void_t<decltype(F::kSpan)>> : std::integral_constant<int, F::kSpan> {};
// Whether F splits part() into fetch() and use() (F::Raw).
template <class F, class = void>
struct SplitsLoads : std::false_type {};
template <class F>
struct SplitsLoads<F, std::void_t<typename F::Raw>> : std::true_type {};
COLIBRI_HD int load_sum(const std::int32_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
// The sum of N activations from the quantizer's sums of 16 (p at an even index where N is 32, so 8-byte aligned).
template <int N>
COLIBRI_HD int load_sum_of(const std::int32_t* p) {
  if constexpr (N == 16) {
    return load_sum(p);
  } else {
    static_assert(N == 32, "runs of 16 or 32 activations");
#ifdef __CUDA_ARCH__
    const int2 v = __ldg(reinterpret_cast<const int2*>(p));
    return v.x + v.y;
#else
    return p[0] + p[1];
#endif
  }
}
COLIBRI_HD float load_scale(const float* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

// What lane `lane` of the warp that owns rows row0.. and tokens t0.. adds up, before the warp's fixed shuffle tree:
// acc[r][i] over the lane's units of row row0 + r (rows past n repeat the last) and token t0 + i (tokens past t repeat
// the last). A unit has L = UnitLanes<F> lanes (8, or 4 for Q4_K_Pairs), so lane l takes units l / L, l / L + 32 / L,
// ... as lane l % L. xq holds each token's k activations (k * token bytes in, 16-byte aligned), xd each token's
// k / F::kXBlock scales, xs each token's k / 16 sums of 16 activations (computed once per token, not per row);
// takes_k<F>(k). A partial last unit (k % 256 = 32 * m) is taken by its lanes j < m.
// The matmul kernel runs it on the device, the host test as it is.
//
// U > 1 walks U of a lane's units per step, their loads issued together: a decode warp owns one row of a few units
// (K = 4096 is 16 units, 4 steps of 4 lanes' units), so with one unit per step each warp waits on memory four times
// in a row. The units are still added in ascending order, so U never changes a bit.
template <class F, int NT, int R, int U = 1>
COLIBRI_HD void lane_sums(const std::uint8_t* w, std::size_t row_bytes, const std::int8_t* xq, const float* xd,
                          const std::int32_t* xs, int k, int n, int t, long long row0, int t0, int lane,
                          float (&acc)[R][NT]) {
  constexpr int L = UnitLanes<F>::value, Stride = 32 / L, N = Span<F>::value;
  static_assert(L == 8 || F::kXBlock == kUnit, "partial units are taken by 8-lane formats only");
  using X = XQ<N>;
  const int j = lane % L;
  const int units = k / kUnit, last_blocks = (k % kUnit) / F::kXBlock;
  const std::uint8_t* wr[R];
  COLIBRI_UNROLL
  for (int r = 0; r < R; ++r) {
    const long long row = row0 + r < n ? row0 + r : n - 1;
    wr[r] = w + static_cast<std::size_t>(row) * row_bytes;
  }
  const std::int8_t* xr[NT];
  const float* dr[NT];
  const std::int32_t* sr[NT];
  COLIBRI_UNROLL
  for (int i = 0; i < NT; ++i) {
    const int tok = t0 + i < t ? t0 + i : t - 1;
    xr[i] = xq + static_cast<std::size_t>(tok) * k;
    dr[i] = xd + static_cast<std::size_t>(tok) * (k / F::kXBlock);
    sr[i] = xs + static_cast<std::size_t>(tok) * (k / 16);
  }
  const int xo0 = F::xoff0(j), xo1 = F::xoff1(j);
  // W at any address (its place must not choose the path, or placement would change the bits): 16-byte loads where
  // the format and the rows allow (row_bytes is then a multiple of 16, so the whole warp agrees), word loads
  // otherwise; the same bytes either way.
  const bool vec = F::kVector && (reinterpret_cast<std::uintptr_t>(w) & 15) == 0;
  COLIBRI_UNROLL
  for (int r = 0; r < R; ++r) {
    COLIBRI_UNROLL
    for (int i = 0; i < NT; ++i) acc[r][i] = 0.0f;
  }
  auto fetch_xs = [&](int u, X(&xa)[NT], X(&xb)[NT], float(&dx)[NT]) {
    COLIBRI_UNROLL
    for (int i = 0; i < NT; ++i) {
      fetch_x(xr[i] + u * kUnit + xo0, xa[i]);
      fetch_x(xr[i] + u * kUnit + xo1, xb[i]);
      xa[i].sum = load_sum_of<N>(sr[i] + (u * kUnit + xo0) / 16);
      xb[i].sum = load_sum_of<N>(sr[i] + (u * kUnit + xo1) / 16);
      dx[i] = load_scale(dr[i] + (u * kUnit + xo0) / F::kXBlock);
    }
  };
  auto step = [&](int u) {
    X xa[NT], xb[NT];
    float dx[NT];
    fetch_xs(u, xa, xb, dx);
    COLIBRI_UNROLL
    for (int r = 0; r < R; ++r) {
      float part[NT];
      F::template part<NT>(wr[r] + static_cast<std::size_t>(u) * F::kUnitBytes, j, vec, xa, xb, part);
      COLIBRI_UNROLL
      for (int i = 0; i < NT; ++i) acc[r][i] = fma_rn(dx[i], part[i], acc[r][i]);
    }
  };
  int u = lane / L;
  if constexpr (U > 1 && SplitsLoads<F>::value) {
    // Every load of the U units first (weights and activations), then the sums in ascending unit order.
    for (; u + Stride * (U - 1) < units; u += Stride * U) {
      typename F::Raw raw[U][R];
      X xa[U][NT], xb[U][NT];
      float dx[U][NT];
      COLIBRI_UNROLL
      for (int s = 0; s < U; ++s) {
        const int us = u + Stride * s;
        COLIBRI_UNROLL
        for (int r = 0; r < R; ++r) F::fetch(wr[r] + static_cast<std::size_t>(us) * F::kUnitBytes, j, vec, raw[s][r]);
        fetch_xs(us, xa[s], xb[s], dx[s]);
      }
      COLIBRI_UNROLL
      for (int s = 0; s < U; ++s) {
        COLIBRI_UNROLL
        for (int r = 0; r < R; ++r) {
          float part[NT];
          F::template use<NT>(raw[s][r], j, xa[s], xb[s], part);
          COLIBRI_UNROLL
          for (int i = 0; i < NT; ++i) acc[r][i] = fma_rn(dx[s][i], part[i], acc[r][i]);
        }
      }
    }
  } else if constexpr (U > 1) {
    for (; u + Stride * (U - 1) < units; u += Stride * U) {
      COLIBRI_UNROLL
      for (int s = 0; s < U; ++s) step(u + Stride * s);
    }
  }
  if constexpr (F::kXBlock == kUnit) {
    for (; u < units; u += Stride) step(u);  // whole units only (takes_k)
  } else {
    for (; u < units || (u == units && j < last_blocks); u += Stride) step(u);
  }
}

}  // namespace colibri::cuda::q8dot
