#version 460
// Element-wise ops over n f32 values (a grid-stride loop; no reductions, so no ordering issues):
// 0 add: y = a + b; 1 swiglu: y = silu(a) * b; 2 sigmoid: y = 1 / (1 + exp(-a));
// 3 scale_add: y[i] += w[i / d] * a[i] (in place on y);
// 4 clamped GLU (gpt-oss experts): g = min(a, limit), u = clamp(b, -limit, limit),
//   y = g / (1 + exp(-alpha g)) * (u + 1); 5 mul: y = a * b.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t a;
  uint64_t b;
  uint64_t y;
  uint n;
  uint mode;
  uint d;       // scale_add: elements per token
  float alpha;  // clamped GLU
  float limit;  // clamped GLU
}
p;

float sigmoid(float v) {
  precise float r = 1.0 / (1.0 + exp(-v));
  return r;
}

void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    const float a = Floats(p.a).v[i];
    precise float r;
    if (p.mode == 0u) {
      r = a + Floats(p.b).v[i];
    } else if (p.mode == 1u) {
      precise float silu = a / (1.0 + exp(-a));
      r = silu * Floats(p.b).v[i];
    } else if (p.mode == 2u) {
      r = sigmoid(a);
    } else if (p.mode == 5u) {
      r = a * Floats(p.b).v[i];
    } else if (p.mode == 4u) {
      const float g = min(a, p.limit);
      const float u = clamp(Floats(p.b).v[i], -p.limit, p.limit);
      precise float ag = p.alpha * g;
      precise float glu = g / (1.0 + exp(-ag));
      r = glu * (u + 1.0);
    } else {
      precise float scaled = Floats(p.b).v[i / p.d] * a;
      r = Floats(p.y).v[i] + scaled;
    }
    Floats(p.y).v[i] = r;
  }
}
