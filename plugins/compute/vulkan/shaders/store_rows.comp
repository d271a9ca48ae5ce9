#version 460
// store_rows: f32 rows into f32 (mode 0, a copy) or f16 (mode 1, two values per word) rows, the bytes
// colibri::quant::quantize_row writes: f16 rounds to nearest even, done on the bits here because GLSL leaves the
// rounding of packHalf2x16 to the implementation. (q8_0 needs correctly rounded divisions, which Vulkan does not
// promise: the backend does not offer it.)
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t x;  // n f32
  uint64_t y;  // n f32, or n f16 at a 4-byte aligned address
  uint n;
  uint mode;
}
p;

uint f32_to_f16(float f) {
  const uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  const uint e = (x >> 23) & 0xFFu;
  uint m = x & 0x7FFFFFu;
  if (e == 0xFFu) return sign | 0x7C00u | (m != 0u ? 0x200u | (m >> 13) : 0u);  // inf; NaN stays a quiet NaN
  const int he = int(e) - 127 + 15;
  if (he >= 31) return sign | 0x7C00u;  // too large: inf
  if (he <= 0) {                        // a subnormal half (or zero)
    if (he < -10) return sign;
    m |= 0x800000u;
    const uint shift = uint(14 - he);
    uint h = m >> shift;
    const uint rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u) != 0u)) h += 1u;
    return sign | h;
  }
  uint h = sign | (uint(he) << 10) | (m >> 13);
  const uint rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;  // a carry moves into the exponent, as it must
  return h;
}

void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  if (p.mode == 0u) {
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) Floats(p.y).v[i] = Floats(p.x).v[i];
    return;
  }
  const uint words = (p.n + 1u) / 2u;
  for (uint w = gl_GlobalInvocationID.x; w < words; w += stride) {
    const uint lo = f32_to_f16(Floats(p.x).v[2u * w]);
    // An odd count: the last word's upper half is not ours and keeps its bytes.
    const uint hi = 2u * w + 1u < p.n ? f32_to_f16(Floats(p.x).v[2u * w + 1u]) : Words(p.y).v[w] >> 16;
    Words(p.y).v[w] = lo | (hi << 16);
  }
}
