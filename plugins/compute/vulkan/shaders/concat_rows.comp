#version 460
// concat_rows: each of the rows of Y {a + b} is A's row {a} followed by B's {b}. Copied as words, so the bits
// (NaN payloads too) are the inputs'.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t a;
  uint64_t b;
  uint64_t y;
  uint a_width;
  uint b_width;
  uint n;  // elements of Y
}
p;

void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  const uint width = p.a_width + p.b_width;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    const uint row = i / width, col = i % width;
    Words(p.y).v[i] =
        col < p.a_width ? Words(p.a).v[row * p.a_width + col] : Words(p.b).v[row * p.b_width + col - p.a_width];
  }
}
