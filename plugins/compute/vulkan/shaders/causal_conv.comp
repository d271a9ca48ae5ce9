#version 460
// causal_conv (Qwen3-Next's linear attention): one invocation per channel, its tokens in order, so a column's bits
// do not depend on how many share the call. X {C, T}, W {K, C} (a channel's taps, oldest first), Y {C, T}, and the
// state {C, K - 1} (the K - 1 inputs before X's first column, oldest first), read and then rewritten with the last
// K - 1 inputs. Y[t][c] = silu(sum over j ascending of W[c][j] * in(t - K + 1 + j)[c]).
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t x;
  uint64_t w;
  uint64_t y;
  uint64_t state;
  uint c;
  uint t;
  uint k;
  uint pad;
}
p;

const uint kMaxTaps = 16u;

void main() {
  const uint ch = gl_GlobalInvocationID.x;
  if (ch >= p.c) return;
  float window[kMaxTaps];
  const uint taps = p.k - 1u;
  for (uint j = 0u; j < taps; ++j) window[j] = Floats(p.state).v[ch + j * p.c];
  for (uint i = 0u; i < p.t; ++i) {
    window[taps] = Floats(p.x).v[ch + i * p.c];
    precise float acc = 0.0;
    for (uint j = 0u; j < p.k; ++j) acc += Floats(p.w).v[ch * p.k + j] * window[j];
    precise float silu = acc / (1.0 + exp(-acc));
    Floats(p.y).v[ch + i * p.c] = silu;
    for (uint j = 0u; j < taps; ++j) window[j] = window[j + 1u];
  }
  for (uint j = 0u; j < taps; ++j) Floats(p.state).v[ch + j * p.c] = window[j];
}
