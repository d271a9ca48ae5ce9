#version 460
// Y[t][n] = sum_k W[n][k] * X[t][k] (+ bias[n]) with f32 activations (never quantized, so the
// kExactActivations flag is always honoured). A workgroup of 64 threads takes 64 / tpr rows and a
// tile of kTile tokens; the tpr threads of a row (a power of two chosen from K alone) own the
// 32-element units sub, sub + tpr, ... and accumulate them in order, then a fixed tree adds their
// partial sums. The sum of one (n, t) therefore depends only on K, never on T, on the tile or on
// the other tokens: batch-composition invariance by construction.
// HEADS (matmul_heads): W holds `heads` matrices of N rows and X, Y rows {Kx or N, heads, T}; grid y counts
// (token tile, head) pairs, and each head's work is exactly the plain shader's on its matrix and rows.
#include "dequant.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t w;     // W {K, N}
  uint64_t x;     // X {K, T} f32
  uint64_t y;     // Y {N, T} f32
  uint64_t bias;  // {N} f32, 0 when absent
  uint k;
  uint n;
  uint t;
  uint w_row_bytes;
  uint tpr;         // threads per row: 1, 2, 4, ..., 64
  uint w_indirect;  // w holds W's address (expert_ffn_routed: the expert picked on the device)
#if defined(HEADS)
  uint64_t w_head_bytes;  // bytes of one head's N rows
  uint heads;
  uint kx;  // floats of one X row (>= k; the values past k are not read)
#endif
}
p;

const uint kTile = 8u;
shared float partial[kTile][64];

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint sub = lid % p.tpr;
  const uint row = flat_group() * (64u / p.tpr) + lid / p.tpr;
  const bool live = row < p.n;
#if defined(HEADS)
  const uint head = gl_WorkGroupID.y % p.heads;
  const uint t0 = gl_WorkGroupID.y / p.heads * kTile;
  const uint x_stride = p.heads * p.kx, x_at = head * p.kx;  // token t's head row at t * x_stride + x_at
  const uint y_stride = p.heads * p.n, y_at = head * p.n;
  const uint64_t w_base = p.w + uint64_t(head) * p.w_head_bytes;
#else
  const uint t0 = gl_WorkGroupID.y * kTile;
  const uint x_stride = p.k, x_at = 0u, y_stride = p.n, y_at = 0u;
  const uint64_t w_base = p.w;
#endif
  const uint nt = min(kTile, p.t - t0);
  const uint units = (p.k + 31u) / 32u;

  precise float acc[kTile];
  for (uint i = 0u; i < kTile; ++i) acc[i] = 0.0;
  if (live) {
    const uint64_t w_at = p.w_indirect != 0u ? Addresses(w_base).v[0] : w_base;
    const Bytes wr = bytes_at(w_at + uint64_t(row) * uint64_t(p.w_row_bytes));
    float w[32];
    for (uint u = sub; u < units; u += p.tpr) {
      dequant_unit(wr, u, p.k, w);
      const uint base = u * 32u;
      const uint len = min(32u, p.k - base);
      for (uint i = 0u; i < nt; ++i) {
        const uint xo = (t0 + i) * x_stride + x_at + base;
        precise float a = acc[i];
        for (uint j = 0u; j < len; ++j) a = a + w[j] * Floats(p.x).v[xo + j];
        acc[i] = a;
      }
    }
  }
  for (uint i = 0u; i < nt; ++i) partial[i][lid] = acc[i];
  barrier();
  for (uint s = p.tpr / 2u; s > 0u; s >>= 1u) {
    if (sub < s) {
      for (uint i = 0u; i < nt; ++i) {
        precise float v = partial[i][lid] + partial[i][lid + s];
        partial[i][lid] = v;
      }
    }
    barrier();
  }
  if (live) {
    for (uint i = sub; i < nt; i += p.tpr) {  // a row's threads share out its tokens
      precise float out_v = partial[i][lid - sub];
      if (p.bias != 0ul) out_v = out_v + Floats(p.bias).v[row];
      Floats(p.y).v[(t0 + i) * y_stride + y_at + row] = out_v;
    }
  }
}
