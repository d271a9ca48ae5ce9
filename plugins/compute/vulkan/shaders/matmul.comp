#version 460
// Y[t][n] = sum_k W[n][k] * X[t][k] (+ bias[n]) with f32 activations (never quantized, so the
// kExactActivations flag is always honoured). One workgroup per (row n, tile of kTile tokens).
// Thread i owns the 32-element units i, i + 64, ... of the row and accumulates them in order;
// the 64 partial sums are then added by a fixed tree. The sum of one (n, t) therefore never
// depends on T, on the tile or on the other tokens: batch-composition invariance by construction.
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
}
p;

const uint kTile = 8u;
shared float partial[kTile][64];

void main() {
  const uint row = flat_group();
  if (row >= p.n) return;  // uniform per workgroup
  const uint lid = gl_LocalInvocationID.x;
  const uint t0 = gl_WorkGroupID.y * kTile;
  const uint nt = min(kTile, p.t - t0);
  const Bytes wr = bytes_at(p.w + uint64_t(row) * uint64_t(p.w_row_bytes));
  const uint units = (p.k + 31u) / 32u;

  precise float acc[kTile];
  for (uint i = 0u; i < kTile; ++i) acc[i] = 0.0;
  float w[32];
  for (uint u = lid; u < units; u += 64u) {
    dequant_unit(wr, u, p.k, w);
    const uint base = u * 32u;
    const uint len = min(32u, p.k - base);
    for (uint i = 0u; i < kTile; ++i) {
      if (i >= nt) break;
      const uint xo = (t0 + i) * p.k + base;
      precise float a = acc[i];
      for (uint j = 0u; j < len; ++j) a = a + w[j] * Floats(p.x).v[xo + j];
      acc[i] = a;
    }
  }
  for (uint i = 0u; i < nt; ++i) partial[i][lid] = acc[i];
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1u) {
    if (lid < s) {
      for (uint i = 0u; i < nt; ++i) {
        precise float v = partial[i][lid] + partial[i][lid + s];
        partial[i][lid] = v;
      }
    }
    barrier();
  }
  if (lid < nt) {
    precise float out_v = partial[lid][0];
    if (p.bias != 0ul) out_v = out_v + Floats(p.bias).v[row];
    Floats(p.y).v[(t0 + lid) * p.n + row] = out_v;
  }
}
