#version 460
// embedding: out[:, t] = dequantize(table row ids[t]). One invocation per (32-element unit, token).
// An id outside the table writes zeros and records the first offending token in `status` (the
// host turns that into an error naming the token and id).
#include "dequant.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t table;   // {D, V}
  uint64_t ids;     // {T} i32
  uint64_t out_f;   // {D, T} f32
  uint64_t status;  // uint[2]: 1 + first bad token, its id
  uint d;
  uint rows;
  uint t;
  uint row_bytes;
}
p;

void main() {
  const uint u = gl_GlobalInvocationID.x;
  const uint tok = gl_GlobalInvocationID.y;
  if (u * 32u >= p.d || tok >= p.t) return;
  const int id = Ints(p.ids).v[tok];
  const uint o = tok * p.d + u * 32u;
  const uint len = min(32u, p.d - u * 32u);
  if (id < 0 || uint(id) >= p.rows) {
    for (uint j = 0u; j < len; ++j) Floats(p.out_f).v[o + j] = 0.0;
    if (u == 0u && atomicCompSwap(Words(p.status).v[0], 0u, tok + 1u) == 0u) Words(p.status).v[1] = uint(id);
    return;
  }
  float w[32];
  dequant_unit(bytes_at(p.table + uint64_t(id) * uint64_t(p.row_bytes)), u, p.d, w);
  for (uint j = 0u; j < len; ++j) Floats(p.out_f).v[o + j] = w[j];
}
