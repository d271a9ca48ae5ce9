#version 460
// y = x / sqrt(mean(x^2) + eps) * w per row of D. One workgroup per row; thread i sums the squares
// of elements i, i + 64, ... in order, then a fixed tree adds the 64 partial sums.
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t x;  // {D, R}
  uint64_t w;  // {D}
  uint64_t y;  // {D, R}
  uint d;
  uint rows;
  float eps;
}
p;

shared float partial[64];

void main() {
  const uint row = flat_group();
  if (row >= p.rows) return;
  const uint lid = gl_LocalInvocationID.x;
  const uint base = row * p.d;
  precise float acc = 0.0;
  for (uint i = lid; i < p.d; i += 64u) {
    const float v = Floats(p.x).v[base + i];
    acc = acc + v * v;
  }
  partial[lid] = acc;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1u) {
    if (lid < s) {
      precise float v = partial[lid] + partial[lid + s];
      partial[lid] = v;
    }
    barrier();
  }
  precise float mean = partial[0] / float(p.d);
  precise float inv = 1.0 / sqrt(mean + p.eps);
  for (uint i = lid; i < p.d; i += 64u) {
    precise float v = Floats(p.x).v[base + i] * inv * Floats(p.w).v[i];
    Floats(p.y).v[base + i] = v;
  }
}
