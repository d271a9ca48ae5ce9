#version 460
// Rotary embedding. Invocation i handles pair j = i % (head_dim / 2) of one (head, token): pairs
// below rope_dims / 2 are rotated by pos * inv_freq[j], the rest copy the pass-through dims.
// GPU sin/cos are only specified to 2^-11 absolute on [-pi, pi], so sin_cos() reduces the angle
// itself and evaluates polynomials good to about one ulp.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t x;          // {head_dim, n_heads, T}
  uint64_t positions;  // {T} i32
  uint64_t inv_freq;   // {rope_dims / 2}
  uint64_t y;
  uint head_dim;
  uint n_heads;
  uint t;
  uint rope_dims;
  uint interleaved;
  float scale;
}
p;

// Cody-Waite reduction by pi/2 (three-part constant, the first with 8 significant bits so
// q * kPio2a is exact for q < 2^16), then minimax polynomials on [-pi/4, pi/4].
void sin_cos(float x, out float s_out, out float c_out) {
  const float kPio2a = 1.5703125;
  const float kPio2b = 4.837512969970703125e-4;
  const float kPio2c = 7.54978995489188216e-8;
  const float ax = abs(x);
  const float q = floor(ax * 0.636619772367581343 + 0.5);
  precise float r = ((ax - q * kPio2a) - q * kPio2b) - q * kPio2c;
  precise float z = r * r;
  precise float s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
  precise float c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
  const uint quadrant = uint(q) & 3u;
  float sv = (quadrant == 0u) ? s : (quadrant == 1u) ? c : (quadrant == 2u) ? -s : -c;
  float cv = (quadrant == 0u) ? c : (quadrant == 1u) ? -s : (quadrant == 2u) ? -c : s;
  s_out = x < 0.0 ? -sv : sv;
  c_out = cv;
}

void main() {
  const uint half_hd = p.head_dim / 2u;
  const uint total = half_hd * p.n_heads * p.t;
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
    const uint j = i % half_hd;
    const uint head_row = i / half_hd;  // head + n_heads * token
    const uint tok = head_row / p.n_heads;
    const uint base = head_row * p.head_dim;
    const uint half_rope = p.rope_dims / 2u;
    if (j >= half_rope) {
      const uint d = p.rope_dims + 2u * (j - half_rope);
      Floats(p.y).v[base + d] = Floats(p.x).v[base + d];
      Floats(p.y).v[base + d + 1u] = Floats(p.x).v[base + d + 1u];
      continue;
    }
    const uint i0 = p.interleaved != 0u ? 2u * j : j;
    const uint i1 = p.interleaved != 0u ? 2u * j + 1u : j + half_rope;
    precise float theta = float(Ints(p.positions).v[tok]) * Floats(p.inv_freq).v[j];
    float sn;
    float cs;
    sin_cos(theta, sn, cs);
    precise float c = cs * p.scale;
    precise float s = sn * p.scale;
    const float x0 = Floats(p.x).v[base + i0];
    const float x1 = Floats(p.x).v[base + i1];
    precise float y0 = x0 * c - x1 * s;
    precise float y1 = x0 * s + x1 * c;
    Floats(p.y).v[base + i0] = y0;
    Floats(p.y).v[base + i1] = y1;
  }
}
