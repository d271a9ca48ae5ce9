// compute/cuda: dequantization of one 32-element chunk per weight format, shared by the kernels
// and by a host-side test (cuda_dequant_test.cu) that checks every format bit for bit against
// colibri::quant on a machine without a GPU.
//
// chunk(row, c, valid, w) writes elements 32c .. 32c+31 of a row; `valid` < 32 only for the last
// chunk of plain-float rows (quantized rows are whole blocks). Each formula follows colibri::quant's
// reference term by term with non-contractible products and differences (mul_rn, sub_rn), so the
// values are bit-identical to the CPU backend's. Bytes are read as 32-bit words (load_words): a
// quarter of the load instructions of byte loads, at any alignment.
//
// Lane layouts (formats with kLanes): for rows that are whole 256-element units, a warp dequantizes
// one unit per step and lane l produces 8 weights: w[0..3] for elements off0(l)..off0(l)+3 of the unit
// and w[4..7] for off1(l)..off1(l)+3. Neighbouring lanes read neighbouring words of the row and of
// the activations, so a warp's loads are coalesced (the chunk path above gives each lane its own
// block, 32 loads of scattered lines per warp instruction).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace colibri::cuda::dequant {

constexpr int kChunk = 32;
constexpr int kUnit = 256;  // elements a warp takes per step in the lane layouts

#ifdef __CUDA_ARCH__
#define COLIBRI_HD __device__ __forceinline__
#else
#define COLIBRI_HD inline
#endif
#ifdef __CUDA_ARCH__  // device pass only: host compilers warn about the pragma
#define COLIBRI_UNROLL _Pragma("unroll")
#else
#define COLIBRI_UNROLL
#endif

COLIBRI_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
COLIBRI_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

COLIBRI_HD std::uint32_t aligned_word(const std::uint32_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned*>(p));
#else
  return *p;
#endif
}
// The 32 bits starting `shift` bits into lo (little-endian lo, hi).
COLIBRI_HD std::uint32_t funnel(std::uint32_t lo, std::uint32_t hi, unsigned shift) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<std::uint32_t>(((static_cast<std::uint64_t>(hi) << 32) | lo) >> shift);
#endif
}

// N little-endian 32-bit words from byte address p (any alignment): aligned word loads joined by
// funnel shifts, the same steps on the host (tests) as on the device. The last aligned word read
// holds the last byte asked for, so nothing past that word is touched.
template <int N>
COLIBRI_HD void load_words(const std::uint8_t* p, std::uint32_t (&w)[N]) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto* base = reinterpret_cast<const std::uint32_t*>(addr & ~std::uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(addr & 3) * 8;
  if (shift == 0) {
    COLIBRI_UNROLL
    for (int i = 0; i < N; ++i) w[i] = aligned_word(base + i);
  } else {
    std::uint32_t lo = aligned_word(base);
    COLIBRI_UNROLL
    for (int i = 0; i < N; ++i) {
      const std::uint32_t hi = aligned_word(base + i + 1);
      w[i] = funnel(lo, hi, shift);
      lo = hi;
    }
  }
}

template <int N>
COLIBRI_HD int byte_at(const std::uint32_t (&w)[N], int i) {
  return static_cast<int>((w[i >> 2] >> (8 * (i & 3))) & 0xFFu);
}

// Byte i (0..11, known only at run time) of 12 bytes held in three words: selects, not an indexed
// array, so the words stay in registers on the device.
COLIBRI_HD int byte12(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2, int i) {
  const std::uint32_t word = i < 4 ? w0 : (i < 8 ? w1 : w2);
  return static_cast<int>((word >> (8 * (i & 3))) & 0xFFu);
}

// Byte i (0..7, known only at run time) of two words.
COLIBRI_HD int byte8(std::uint32_t w0, std::uint32_t w1, int i) {
  return static_cast<int>(((i < 4 ? w0 : w1) >> (8 * (i & 3))) & 0xFFu);
}

COLIBRI_HD float half_bits(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}
// An fp16 at a 2-byte aligned address.
COLIBRI_HD float f16_at(const std::uint8_t* p) {
  std::uint16_t h;
#ifdef __CUDA_ARCH__
  h = __ldg(reinterpret_cast<const unsigned short*>(p));
#else
  std::memcpy(&h, p, 2);
#endif
  return half_bits(h);
}
COLIBRI_HD float as_float(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
COLIBRI_HD float bf16_bits(unsigned bits) {
  return as_float((bits & 0xFFFFu) << 16);
}

struct F32 {
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 8 * lane; }
  COLIBRI_HD static int off1(int lane) { return 8 * lane + 4; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    std::uint32_t v[8];
    load_words(row + (static_cast<std::size_t>(u) * kUnit + 8 * lane) * 4, v);
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) w[j] = as_float(v[j]);
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int valid, float* w) {
    const std::uint8_t* r = row + c * kChunk * 4;
    if (valid == kChunk) {
      std::uint32_t v[kChunk];
      load_words(r, v);
      COLIBRI_UNROLL
      for (int j = 0; j < kChunk; ++j) w[j] = as_float(v[j]);
      return;
    }
    for (int j = 0; j < kChunk; ++j) {
      std::uint32_t v[1] = {0};
      if (j < valid) load_words(r + 4 * j, v);
      w[j] = as_float(v[0]);
    }
  }
};

// f16 / bf16: 32 values in 16 words; the partial last chunk reads value by value.
template <bool Brain>
struct Half16 {
  COLIBRI_HD static float convert(unsigned bits) { return Brain ? bf16_bits(bits) : half_bits(bits); }
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 8 * lane; }
  COLIBRI_HD static int off1(int lane) { return 8 * lane + 4; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    std::uint32_t v[4];
    load_words(row + (static_cast<std::size_t>(u) * kUnit + 8 * lane) * 2, v);
    COLIBRI_UNROLL
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = convert(v[j]);
      w[2 * j + 1] = convert(v[j] >> 16);
    }
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int valid, float* w) {
    const std::uint8_t* r = row + c * kChunk * 2;
    if (valid == kChunk) {
      std::uint32_t v[kChunk / 2];
      load_words(r, v);
      COLIBRI_UNROLL
      for (int j = 0; j < kChunk / 2; ++j) {
        w[2 * j] = convert(v[j]);
        w[2 * j + 1] = convert(v[j] >> 16);
      }
      return;
    }
    for (int j = 0; j < kChunk; ++j) {
      std::uint16_t h = 0;
      if (j < valid) {
#ifdef __CUDA_ARCH__
        h = __ldg(reinterpret_cast<const unsigned short*>(r + 2 * j));
#else
        std::memcpy(&h, r + 2 * j, 2);
#endif
      }
      w[j] = j < valid ? convert(h) : 0.0f;
    }
  }
};
using F16 = Half16<false>;
using BF16 = Half16<true>;

struct Q8_0 {  // 34-byte blocks of 32: d, qs[32]
  // Lanes: 4 per block, 8 consecutive weights each.
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 32 * (lane / 4) + 8 * (lane % 4); }
  COLIBRI_HD static int off1(int lane) { return off0(lane) + 4; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    const std::uint8_t* b = row + (static_cast<std::size_t>(u) * 8 + lane / 4) * 34;
    const float d = f16_at(b);
    std::uint32_t q[2];
    load_words(b + 2 + 8 * (lane % 4), q);
    COLIBRI_UNROLL
    for (int j = 0; j < 8; ++j) w[j] = mul_rn(static_cast<float>(static_cast<std::int8_t>(byte_at(q, j))), d);
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + c * 34;
    const float d = f16_at(b);
    std::uint32_t q[8];
    load_words(b + 2, q);
    COLIBRI_UNROLL
    for (int j = 0; j < 32; ++j) w[j] = mul_rn(static_cast<float>(static_cast<std::int8_t>(byte_at(q, j))), d);
  }
};
struct Q4_0 {  // 18-byte blocks of 32: d, qs[16] (low nibbles first)
  // Lanes: 4 per block; a lane's 4 bytes hold elements 4m..4m+3 (low) and 16+4m.. (high nibbles).
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 32 * (lane / 4) + 4 * (lane % 4); }
  COLIBRI_HD static int off1(int lane) { return off0(lane) + 16; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    const std::uint8_t* b = row + (static_cast<std::size_t>(u) * 8 + lane / 4) * 18;
    const float d = f16_at(b);
    std::uint32_t q[1];
    load_words(b + 2 + 4 * (lane % 4), q);
    COLIBRI_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int v = byte_at(q, j);
      w[j] = mul_rn(static_cast<float>((v & 0xF) - 8), d);
      w[j + 4] = mul_rn(static_cast<float>((v >> 4) - 8), d);
    }
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + c * 18;
    const float d = f16_at(b);
    std::uint32_t q[4];
    load_words(b + 2, q);
    COLIBRI_UNROLL
    for (int j = 0; j < 16; ++j) {
      const int v = byte_at(q, j);
      w[j] = mul_rn(static_cast<float>((v & 0xF) - 8), d);
      w[j + 16] = mul_rn(static_cast<float>((v >> 4) - 8), d);
    }
  }
};
struct Q2_K {  // 84 bytes per 256: scales[16], qs[64], d, dmin
  static constexpr bool kLanes = false;
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + (c / 8) * 84;
    const int cc = c % 8, h = cc / 4, j = cc % 4, shift = 2 * j;
    std::uint32_t dm[1], sc[1], q[8];
    load_words(b + 80, dm);
    load_words(b + 8 * h + 2 * j, sc);
    load_words(b + 16 + 32 * h, q);
    const float d = half_bits(dm[0]), dmin = half_bits(dm[0] >> 16);
    COLIBRI_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int s = byte_at(sc, half);
      const float dl = mul_rn(d, static_cast<float>(s & 0xF));
      const float ml = mul_rn(dmin, static_cast<float>(s >> 4));
      COLIBRI_UNROLL
      for (int l = 0; l < 16; ++l) {
        const int v = (byte_at(q, 16 * half + l) >> shift) & 3;
        w[16 * half + l] = sub_rn(mul_rn(dl, static_cast<float>(v)), ml);
      }
    }
  }
};
struct Q3_K {  // 110 bytes per 256: hmask[32], qs[64], scales[12], d
  static constexpr bool kLanes = false;
  COLIBRI_HD static int scale(const std::uint32_t (&s)[3], int i) {
    const int low = i < 8 ? (byte12(s[0], s[1], s[2], i) & 0xF) : (byte12(s[0], s[1], s[2], i - 8) >> 4);
    const int high = (byte12(s[0], s[1], s[2], 8 + (i % 4)) >> (2 * (i / 4))) & 3;
    return (low | (high << 4)) - 32;
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + (c / 8) * 110;
    const int cc = c % 8, h = cc / 4, j = cc % 4, shift = 2 * j;
    const int m = 1 << (4 * h + j);
    std::uint32_t hm[8], q[8], sc[3];
    load_words(b, hm);
    load_words(b + 32 + 32 * h, q);
    load_words(b + 96, sc);
    const float d = f16_at(b + 108);
    COLIBRI_UNROLL
    for (int half = 0; half < 2; ++half) {
      const float dl = mul_rn(d, static_cast<float>(scale(sc, 8 * h + 2 * j + half)));
      COLIBRI_UNROLL
      for (int l = 0; l < 16; ++l) {
        const int v = ((byte_at(q, 16 * half + l) >> shift) & 3) - ((byte_at(hm, 16 * half + l) & m) ? 0 : 4);
        w[16 * half + l] = mul_rn(dl, static_cast<float>(v));
      }
    }
  }
};
// q4_k / q5_k: the 6-bit scale and min of sub-block j (blocks.hpp k4_scale_min) from the 12 scale
// bytes s0..s2.
COLIBRI_HD void k4_scale_min(int j, std::uint32_t s0, std::uint32_t s1, std::uint32_t s2, int& sc, int& mn) {
  if (j < 4) {
    sc = byte12(s0, s1, s2, j) & 63;
    mn = byte12(s0, s1, s2, j + 4) & 63;
  } else {
    sc = (byte12(s0, s1, s2, j + 4) & 0xF) | ((byte12(s0, s1, s2, j - 4) >> 6) << 4);
    mn = (byte12(s0, s1, s2, j + 4) >> 4) | ((byte12(s0, s1, s2, j) >> 6) << 4);
  }
}
struct Q4_K {  // 144 bytes per 256: d, dmin, scales[12], qs[128]
  // Lanes: 8 per 32-byte pair of sub-blocks 2p, 2p+1; a lane's word holds 4 weights of each.
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 64 * (lane / 8) + 4 * (lane % 8); }
  COLIBRI_HD static int off1(int lane) { return off0(lane) + 32; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    const std::uint8_t* b = row + static_cast<std::size_t>(u) * 144;
    const int p = lane / 8;
    std::uint32_t head[4], q[1];
    load_words(b, head);
    load_words(b + 16 + 32 * p + 4 * (lane % 8), q);
    int sc0, mn0, sc1, mn1;
    k4_scale_min(2 * p, head[1], head[2], head[3], sc0, mn0);
    k4_scale_min(2 * p + 1, head[1], head[2], head[3], sc1, mn1);
    const float d = half_bits(head[0]), dmin = half_bits(head[0] >> 16);
    const float d1 = mul_rn(d, static_cast<float>(sc0)), m1 = mul_rn(dmin, static_cast<float>(mn0));
    const float d2 = mul_rn(d, static_cast<float>(sc1)), m2 = mul_rn(dmin, static_cast<float>(mn1));
    COLIBRI_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int v = byte_at(q, j);
      w[j] = sub_rn(mul_rn(d1, static_cast<float>(v & 0xF)), m1);
      w[j + 4] = sub_rn(mul_rn(d2, static_cast<float>(v >> 4)), m2);
    }
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + (c / 8) * 144;
    const int sub = c % 8;
    std::uint32_t head[4], q[8];
    load_words(b, head);  // d, dmin, scales
    load_words(b + 16 + 32 * (sub / 2), q);
    int sc, mn;
    k4_scale_min(sub, head[1], head[2], head[3], sc, mn);
    const float d1 = mul_rn(half_bits(head[0]), static_cast<float>(sc));
    const float m1 = mul_rn(half_bits(head[0] >> 16), static_cast<float>(mn));
    const int shift = 4 * (sub % 2);
    COLIBRI_UNROLL
    for (int l = 0; l < 32; ++l) w[l] = sub_rn(mul_rn(d1, static_cast<float>((byte_at(q, l) >> shift) & 0xF)), m1);
  }
};
struct Q5_K {  // 176 bytes per 256: d, dmin, scales[12], qh[32], qs[128]
  // Lanes as q4_k; the fifth bit of element e of sub-block s is bit s of qh[e % 32].
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 64 * (lane / 8) + 4 * (lane % 8); }
  COLIBRI_HD static int off1(int lane) { return off0(lane) + 32; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    const std::uint8_t* b = row + static_cast<std::size_t>(u) * 176;
    const int p = lane / 8, m = lane % 8;
    std::uint32_t head[4], qh[1], q[1];
    load_words(b, head);
    load_words(b + 16 + 4 * m, qh);
    load_words(b + 48 + 32 * p + 4 * m, q);
    int sc0, mn0, sc1, mn1;
    k4_scale_min(2 * p, head[1], head[2], head[3], sc0, mn0);
    k4_scale_min(2 * p + 1, head[1], head[2], head[3], sc1, mn1);
    const float d = half_bits(head[0]), dmin = half_bits(head[0] >> 16);
    const float d1 = mul_rn(d, static_cast<float>(sc0)), m1 = mul_rn(dmin, static_cast<float>(mn0));
    const float d2 = mul_rn(d, static_cast<float>(sc1)), m2 = mul_rn(dmin, static_cast<float>(mn1));
    const int u1 = 1 << (2 * p), u2 = 2 << (2 * p);
    COLIBRI_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int v = byte_at(q, j), h = byte_at(qh, j);
      w[j] = sub_rn(mul_rn(d1, static_cast<float>((v & 0xF) + ((h & u1) ? 16 : 0))), m1);
      w[j + 4] = sub_rn(mul_rn(d2, static_cast<float>((v >> 4) + ((h & u2) ? 16 : 0))), m2);
    }
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + (c / 8) * 176;
    const int sub = c % 8;
    std::uint32_t head[4], qh[8], q[8];
    load_words(b, head);
    load_words(b + 16, qh);
    load_words(b + 48 + 32 * (sub / 2), q);
    int sc, mn;
    k4_scale_min(sub, head[1], head[2], head[3], sc, mn);
    const float d1 = mul_rn(half_bits(head[0]), static_cast<float>(sc));
    const float m1 = mul_rn(half_bits(head[0] >> 16), static_cast<float>(mn));
    const int shift = 4 * (sub % 2), u = 1 << sub;
    COLIBRI_UNROLL
    for (int l = 0; l < 32; ++l) {
      const int v = ((byte_at(q, l) >> shift) & 0xF) + ((byte_at(qh, l) & u) ? 16 : 0);
      w[l] = sub_rn(mul_rn(d1, static_cast<float>(v)), m1);
    }
  }
};
struct Q6_K {  // 210 bytes per 256: ql[128], qh[64], scales[16] (int8), d
  // Lanes: half h = lane / 16, sel = (lane / 8) % 2, m = lane % 8 covers l = 4m..4m+3 of
  // ql[64h + 32sel + l]: low nibbles are elements 128h + 32sel + l, high nibbles those 64 further.
  static constexpr bool kLanes = true;
  COLIBRI_HD static int off0(int lane) { return 128 * (lane / 16) + 32 * ((lane / 8) % 2) + 4 * (lane % 8); }
  COLIBRI_HD static int off1(int lane) { return off0(lane) + 64; }
  COLIBRI_HD static void lane(const std::uint8_t* row, int u, int lane, float* w) {
    const std::uint8_t* b = row + static_cast<std::size_t>(u) * 210;
    const int h = lane / 16, sel = (lane / 8) % 2, m = lane % 8;
    std::uint32_t ql[1], qh[1], sc[2];
    load_words(b + 64 * h + 32 * sel + 4 * m, ql);
    load_words(b + 128 + 32 * h + 4 * m, qh);
    load_words(b + 192 + 8 * h, sc);
    const float d = f16_at(b + 208);
    const int is = m / 4;
    const auto s_lo = static_cast<std::int8_t>(byte8(sc[0], sc[1], is + 2 * sel));
    const auto s_hi = static_cast<std::int8_t>(byte8(sc[0], sc[1], is + 4 + 2 * sel));
    const float d_lo = mul_rn(d, static_cast<float>(s_lo)), d_hi = mul_rn(d, static_cast<float>(s_hi));
    COLIBRI_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int v = byte_at(ql, j), hb = byte_at(qh, j);
      const int lo = ((v & 0xF) | (((hb >> (2 * sel)) & 3) << 4)) - 32;
      const int hi = ((v >> 4) | (((hb >> (4 + 2 * sel)) & 3) << 4)) - 32;
      w[j] = mul_rn(d_lo, static_cast<float>(lo));
      w[j + 4] = mul_rn(d_hi, static_cast<float>(hi));
    }
  }
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + (c / 8) * 210;
    const int cc = c % 8, h = cc / 4, quarter = cc % 4;
    std::uint32_t ql[8], qh[8], sc[1];
    load_words(b + 64 * h + (quarter % 2) * 32, ql);
    load_words(b + 128 + 32 * h, qh);
    load_words(b + 192 + 8 * h + 2 * quarter, sc);
    const float d = f16_at(b + 208);
    const int lshift = 4 * (quarter / 2), hshift = 2 * quarter;
    COLIBRI_UNROLL
    for (int l = 0; l < 32; ++l) {
      const int v = (((byte_at(ql, l) >> lshift) & 0xF) | (((byte_at(qh, l) >> hshift) & 3) << 4)) - 32;
      const auto s = static_cast<std::int8_t>(byte_at(sc, l / 16));
      w[l] = mul_rn(mul_rn(d, static_cast<float>(s)), static_cast<float>(v));
    }
  }
};

// mxfp4 (gpt-oss's experts): 17-byte blocks of 32: e (an e8m0 scale), qs[16] (low nibbles elements 0..15, high
// nibbles 16..31), x = kMxfp4Values[q] * 2^(e - 128). Blocks start at any byte, so only the chunk path reads them.
COLIBRI_HD float e8m0_half(unsigned e) {  // colibri::quant::e8m0_to_fp32_half: e = 0 and 1 are subnormals
  return as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}
// kMxfp4Values[q]: the magnitudes 0, 1, 2, 3, 4, 6, 8, 12 packed in a word (no table in device memory), bit 3 the
// sign (code 8 is 0, as in the reference).
COLIBRI_HD int e2m1_value(int q) {
  const int mag = static_cast<int>((0x0C08060403020100ull >> (8 * (q & 7))) & 0xFFu);
  return (q & 8) != 0 ? -mag : mag;
}
struct MXFP4 {
  static constexpr bool kLanes = false;
  COLIBRI_HD static void chunk(const std::uint8_t* row, int c, int, float* w) {
    const std::uint8_t* b = row + static_cast<std::size_t>(c) * 17;
#ifdef __CUDA_ARCH__
    const float d = e8m0_half(__ldg(b));
#else
    const float d = e8m0_half(*b);
#endif
    std::uint32_t q[4];
    load_words(b + 1, q);  // ends at the block's last byte
    COLIBRI_UNROLL
    for (int j = 0; j < 16; ++j) {
      const int v = byte_at(q, j);
      w[j] = mul_rn(static_cast<float>(e2m1_value(v & 0xF)), d);
      w[j + 16] = mul_rn(static_cast<float>(e2m1_value(v >> 4)), d);
    }
  }
};

}  // namespace colibri::cuda::dequant
