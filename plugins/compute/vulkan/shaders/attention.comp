#version 460
// Causal attention over the KV cache with an online softmax, one workgroup per (head, query).
// Keys are taken in blocks of 64 aligned to absolute key index 0, so the blocks a query sees, and
// therefore its rounding, do not depend on T or on the other queries. Thread i scores key
// block + i (a sequential dot product over head_dim); block max and sum use fixed trees; thread i
// then accumulates output dims i, i + 64, ... over the block's keys in key order.
// WTYPE_* selects the cache row type (f32, f16 or q8_0 rows of head_dim).
// SINKS (attention_sinks, gpt-oss): head h's softmax also counts one more key, of score sinks[h] (not scaled) and
// value zero. The online softmax starts from it (m = sinks[h], l = e^0 = 1, acc = 0) instead of from nothing
// (m = -inf, l = 0); every key block then runs as without sinks. Without SINKS the shader is the plain attention.
#include "dequant.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t q;  // {head_dim, n_heads, T} f32
  uint64_t k;  // {head_dim, n_kv, S}
  uint64_t v;
  uint64_t o;  // {head_dim, n_heads, T} f32
  uint head_dim;
  uint n_heads;
  uint n_kv;
  uint t;
  uint position;
  uint window;
  float scale;
  uint kv_row_bytes;
#if defined(SINKS)
  uint64_t sinks;  // {n_heads} f32
#endif
}
p;

// 576: DeepSeek's latent attention (512 + 64). A smaller head_dim leaves the extra slots unused, its arithmetic as
// before.
const uint kMaxHeadDim = 576u;
const uint kDimsPerThread = kMaxHeadDim / 64u;
shared float q_sh[kMaxHeadDim];
shared float score_sh[64];
shared float red_sh[64];

float kv_elem(Bytes row, uint d) {
#if defined(WTYPE_F32)
  return uintBitsToFloat(read_u32(row, d * 4u));
#elif defined(WTYPE_F16)
  return read_f16(row, d * 2u);
#else
  const uint blk = (d / 32u) * 34u;
  precise float v = float(sext8(read_u8(row, blk + 2u + d % 32u))) * read_f16(row, blk);
  return v;
#endif
}

Bytes kv_row(uint64_t base, uint key, uint kv_head) {
  return bytes_at(base + uint64_t(key * p.n_kv + kv_head) * uint64_t(p.kv_row_bytes));
}

void main() {
  const uint head = gl_WorkGroupID.x;
  const uint tok = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  const uint kv_head = head / (p.n_heads / p.n_kv);
  const uint qbase = (tok * p.n_heads + head) * p.head_dim;
  for (uint d = lid; d < p.head_dim; d += 64u) q_sh[d] = Floats(p.q).v[qbase + d];
  barrier();

  const uint last = p.position + tok;  // inclusive
  const uint first = (p.window > 0u && last + 1u > p.window) ? last + 1u - p.window : 0u;
  const uint units = (p.head_dim + 31u) / 32u;

#if defined(SINKS)
  float m = Floats(p.sinks).v[head];
  precise float l = m == uintBitsToFloat(0xFF800000u) ? 0.0 : 1.0;  // a sink of -inf is no key
#else
  float m = uintBitsToFloat(0xFF800000u);  // -inf
  precise float l = 0.0;
#endif
  precise float acc[kDimsPerThread];
  for (uint i = 0u; i < kDimsPerThread; ++i) acc[i] = 0.0;
  float w[32];

  for (uint kb = (first / 64u) * 64u; kb <= last; kb += 64u) {
    const uint key = kb + lid;
    const bool valid = key >= first && key <= last;
    float s = uintBitsToFloat(0xFF800000u);
    if (valid) {
      const Bytes kr = kv_row(p.k, key, kv_head);
      precise float dot_qk = 0.0;
      for (uint u = 0u; u < units; ++u) {
        dequant_unit(kr, u, p.head_dim, w);
        const uint len = min(32u, p.head_dim - u * 32u);
        for (uint j = 0u; j < len; ++j) dot_qk = dot_qk + q_sh[u * 32u + j] * w[j];
      }
      precise float scaled = dot_qk * p.scale;
      s = scaled;
    }
    red_sh[lid] = s;
    barrier();
    for (uint st = 32u; st > 0u; st >>= 1u) {
      if (lid < st) red_sh[lid] = max(red_sh[lid], red_sh[lid + st]);
      barrier();
    }
    const float m_new = max(m, red_sh[0]);
    barrier();
    const float pr = valid ? exp(s - m_new) : 0.0;
    score_sh[lid] = pr;
    red_sh[lid] = pr;
    barrier();
    for (uint st = 32u; st > 0u; st >>= 1u) {
      if (lid < st) {
        precise float v = red_sh[lid] + red_sh[lid + st];
        red_sh[lid] = v;
      }
      barrier();
    }
    const float corr = exp(m - m_new);  // 0 on the first block (m = -inf) unless a sink came first
    l = l * corr + red_sh[0];
    const uint j0 = max(first, kb) - kb;
    const uint j1 = min(last, kb + 63u) - kb;
    for (uint i = 0u; i < kDimsPerThread; ++i) {
      const uint d = lid + 64u * i;
      if (d >= p.head_dim) break;
      precise float a = acc[i] * corr;
      for (uint j = j0; j <= j1; ++j) a = a + score_sh[j] * kv_elem(kv_row(p.v, kb + j, kv_head), d);
      acc[i] = a;
    }
    m = m_new;
    barrier();
  }
  for (uint i = 0u; i < kDimsPerThread; ++i) {
    const uint d = lid + 64u * i;
    if (d >= p.head_dim) break;
    precise float out_v = acc[i] / l;
    Floats(p.o).v[qbase + d] = out_v;
  }
}
