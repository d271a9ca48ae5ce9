// Dequantization of one 32-element unit of a weight row, bit-identical to colibri::quant's
// reference dequantize_row (same products in the same order; `precise` forbids fusing).
// Define one of WTYPE_F32, WTYPE_F16, WTYPE_BF16, WTYPE_Q8_0, WTYPE_Q4_0, WTYPE_Q2_K, WTYPE_Q3_K,
// WTYPE_Q4_K, WTYPE_Q5_K, WTYPE_Q6_K, WTYPE_MXFP4.
#include "common.glsl"

#if defined(WTYPE_MXFP4)
// ggml's kvalues_mxfp4: the E2M1 values doubled (integers), hence the halved scale.
const float kMxfp4Values[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0,
                                         -8.0, -12.0);
#endif

// Unit u (elements 32u .. 32u+31) of the row at `row`; `k` elements in the row (f32/f16 may end
// inside a unit: missing elements are 0).
void dequant_unit(Bytes row, uint u, uint k, out float w[32]) {
#if defined(WTYPE_F32)
  for (uint j = 0u; j < 32u; ++j) {
    const uint e = u * 32u + j;
    w[j] = e < k ? uintBitsToFloat(read_u32(row, e * 4u)) : 0.0;
  }
#elif defined(WTYPE_F16)
  for (uint j = 0u; j < 32u; ++j) {
    const uint e = u * 32u + j;
    w[j] = e < k ? read_f16(row, e * 2u) : 0.0;
  }
#elif defined(WTYPE_BF16)
  for (uint j = 0u; j < 32u; ++j) {
    const uint e = u * 32u + j;
    w[j] = e < k ? uintBitsToFloat(read_u16(row, e * 2u) << 16) : 0.0;
  }
#elif defined(WTYPE_Q4_0)
  // 18-byte block: d, qs[16]; element j < 16 is the low nibble of qs[j], j + 16 the high one.
  const uint blk = u * 18u;
  const float d = read_f16(row, blk);
  for (uint j = 0u; j < 16u; j += 4u) {
    const uint q = read_u32(row, blk + 2u + j);
    for (uint i = 0u; i < 4u; ++i) {
      precise float lo = float(int((q >> (8u * i)) & 0xFu) - 8) * d;
      precise float hi = float(int((q >> (8u * i + 4u)) & 0xFu) - 8) * d;
      w[j + i] = lo;
      w[j + i + 16u] = hi;
    }
  }
#elif defined(WTYPE_MXFP4)
  // 17-byte block (any alignment): E8M0 exponent e, qs[16]; element j < 16 is the low nibble of qs[j], j + 16 the
  // high one. d = e8m0_to_fp32_half(e) built from its bits as the reference does (e = 0, 1: subnormals).
  const uint blk = u * 17u;
  const uint e = read_u8(row, blk);
  const float d = uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
  for (uint j = 0u; j < 16u; j += 4u) {
    const uint q = read_u32(row, blk + 1u + j);
    for (uint i = 0u; i < 4u; ++i) {
      precise float lo = kMxfp4Values[(q >> (8u * i)) & 0xFu] * d;
      precise float hi = kMxfp4Values[(q >> (8u * i + 4u)) & 0xFu] * d;
      w[j + i] = lo;
      w[j + i + 16u] = hi;
    }
  }
#elif defined(WTYPE_Q8_0)
  const uint blk = u * 34u;
  const float d = read_f16(row, blk);
  for (uint j = 0u; j < 32u; j += 4u) {
    const uint q = read_u32(row, blk + 2u + j);
    for (uint i = 0u; i < 4u; ++i) {
      precise float v = float(sext8(q >> (8u * i))) * d;
      w[j + i] = v;
    }
  }
#elif defined(WTYPE_Q2_K)
  // 84-byte super-block: scales[16] (min << 4 | scale), qs[64], d, dmin. Unit u: half h of 128
  // elements, 2-bit plane j; its 32 elements are qs[32h ..] >> 2j, scale pair 8h + 2j, 8h + 2j + 1.
  const uint blk = (u / 8u) * 84u;
  const uint h = (u % 8u) / 4u;
  const uint j = u % 4u;
  const float d = read_f16(row, blk + 80u);
  const float dmin = read_f16(row, blk + 82u);
  for (uint half16 = 0u; half16 < 2u; ++half16) {
    const uint sc = read_u8(row, blk + h * 8u + 2u * j + half16);
    precise float dl = d * float(sc & 0xFu);
    precise float ml = dmin * float(sc >> 4);
    for (uint l = 0u; l < 16u; l += 4u) {
      const uint q = read_u32(row, blk + 16u + h * 32u + half16 * 16u + l);
      for (uint i = 0u; i < 4u; ++i) {
        precise float v = dl * float((q >> (8u * i + 2u * j)) & 3u) - ml;
        w[half16 * 16u + l + i] = v;
      }
    }
  }
#elif defined(WTYPE_Q3_K)
  // 110-byte super-block: hmask[32], qs[64], scales[12] (16 packed 6-bit values), d. Unit u: half
  // h, 2-bit plane j; the high bit is bit 4h + j of hmask[l]; a clear bit subtracts 4.
  const uint blk = (u / 8u) * 110u;
  const uint h = (u % 8u) / 4u;
  const uint j = u % 4u;
  const float d_all = read_f16(row, blk + 108u);
  for (uint half16 = 0u; half16 < 2u; ++half16) {
    const uint is = h * 8u + 2u * j + half16;
    const uint lo = is < 8u ? read_u8(row, blk + 96u + is) & 0xFu : read_u8(row, blk + 96u + is - 8u) >> 4;
    const uint hi = (read_u8(row, blk + 96u + 8u + is % 4u) >> (2u * (is / 4u))) & 3u;
    precise float dl = d_all * float(int(lo | (hi << 4)) - 32);
    for (uint l = 0u; l < 16u; l += 4u) {
      const uint q = read_u32(row, blk + 32u + h * 32u + half16 * 16u + l);
      const uint hm = read_u32(row, blk + half16 * 16u + l);
      for (uint i = 0u; i < 4u; ++i) {
        const int q2 = int((q >> (8u * i + 2u * j)) & 3u);
        const int sub = ((hm >> (8u * i + 4u * h + j)) & 1u) != 0u ? 0 : 4;
        precise float v = dl * float(q2 - sub);
        w[half16 * 16u + l + i] = v;
      }
    }
  }
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
  // q4_k: 144-byte super-block d, dmin, scales[12], qs[128]. q5_k: 176 bytes, qh[32] between
  // scales and qs adds bit s of qh[l] as 16. Sub-block s (0..7) of 32 elements uses the low
  // nibbles of qs[32*(s/2) ..] for even s, the high nibbles for odd s.
#if defined(WTYPE_Q4_K)
  const uint blk = (u / 8u) * 144u;
  const uint qs_off = 16u;
#else
  const uint blk = (u / 8u) * 176u;
  const uint qs_off = 48u;
#endif
  const uint s = u % 8u;
  const float d = read_f16(row, blk);
  const float dmin = read_f16(row, blk + 2u);
  uint sc;
  uint mn;
  if (s < 4u) {
    sc = read_u8(row, blk + 4u + s) & 63u;
    mn = read_u8(row, blk + 4u + s + 4u) & 63u;
  } else {
    const uint a = read_u8(row, blk + 4u + s + 4u);
    sc = (a & 0xFu) | ((read_u8(row, blk + 4u + s - 4u) >> 6) << 4);
    mn = (a >> 4) | ((read_u8(row, blk + 4u + s) >> 6) << 4);
  }
  precise float d1 = d * float(sc);
  precise float m1 = dmin * float(mn);
  const uint qs = blk + qs_off + 32u * (s / 2u);
  const uint nib = (s & 1u) * 4u;
  for (uint j = 0u; j < 32u; j += 4u) {
    const uint q = read_u32(row, qs + j);
#if defined(WTYPE_Q5_K)
    const uint qh = read_u32(row, blk + 16u + j);
#endif
    for (uint i = 0u; i < 4u; ++i) {
      uint level = (q >> (8u * i + nib)) & 0xFu;
#if defined(WTYPE_Q5_K)
      level += ((qh >> (8u * i + s)) & 1u) * 16u;
#endif
      precise float v = d1 * float(level) - m1;
      w[j + i] = v;
    }
  }
#elif defined(WTYPE_Q6_K)
  // 210-byte super-block: ql[128], qh[64], scales[16] (int8), d. Unit u covers elements
  // 32*(u%8) .. of the block: half h = (u%8)/4 selects the 128-element half, quarter q = u%4
  // the nibble of ql and the 2-bit field of qh.
  const uint blk = (u / 8u) * 210u;
  const uint h = (u % 8u) / 4u;
  const uint q = u % 4u;
  const float d = read_f16(row, blk + 208u);
  const uint ql = blk + h * 64u + (q & 1u) * 32u;
  const uint qh = blk + 128u + h * 32u;
  const uint ql_shift = (q / 2u) * 4u;
  const uint qh_shift = q * 2u;
  for (uint j = 0u; j < 32u; j += 4u) {
    const uint lo = read_u32(row, ql + j);
    const uint hi = read_u32(row, qh + j);
    for (uint i = 0u; i < 4u; ++i) {
      const uint l = j + i;
      const int sc = sext8(read_u8(row, blk + 192u + h * 8u + l / 16u + 2u * q));
      const int qv = int(((lo >> (8u * i + ql_shift)) & 0xFu) | (((hi >> (8u * i + qh_shift)) & 3u) << 4)) - 32;
      precise float ds = d * float(sc);
      precise float v = ds * float(qv);
      w[l] = v;
    }
  }
#else
#error "define one WTYPE_*"
#endif
}
