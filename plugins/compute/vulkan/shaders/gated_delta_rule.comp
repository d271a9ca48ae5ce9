#version 460
// gated_delta_rule (Qwen3-Next's linear attention): one invocation per (value head h, value column j), holding
// column j of head h's state S {dk x dv} in registers, the tokens in order, so a token's bits do not depend on how
// many share the call. Per token: q and k of h's key head l2-normed (q also by 1 / sqrt(dk)), decay =
// exp(A[h] * softplus(a + dt_bias[h])), beta = sigmoid(b); S[i][j] *= decay and u = sum over i of S[i][j] k[i];
// u = (v[j] - u) * beta; S[i][j] += k[i] u and O[j] = sum over i of S[i][j] q[i]; i ascending throughout. The state
// is S[h][i][j] at j + dv * (i + dk * h); tiled: value head h reads key head h % Hk, else h / (Hv / Hk).
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t q;
  uint64_t k;
  uint64_t v;
  uint64_t a;
  uint64_t b;
  uint64_t decay_a;  // A {Hv}
  uint64_t dt_bias;
  uint64_t o;
  uint64_t state;
  uint dk;
  uint dv;
  uint hk;
  uint hv;
  uint t;
  uint tiled;
}
p;

const uint kMaxDk = 256u;

void main() {
  const uint j = gl_GlobalInvocationID.x, h = gl_WorkGroupID.y;
  if (j >= p.dv) return;
  const uint kh = p.tiled != 0u ? h % p.hk : h / (p.hv / p.hk);
  float S[kMaxDk];
  const uint base = h * p.dk * p.dv + j;
  for (uint i = 0u; i < p.dk; ++i) S[i] = Floats(p.state).v[base + i * p.dv];
  const float q_scale = 1.0 / sqrt(float(p.dk));
  const float A = Floats(p.decay_a).v[h], dt = Floats(p.dt_bias).v[h];
  for (uint t = 0u; t < p.t; ++t) {
    const uint qk = (t * p.hk + kh) * p.dk;
    precise float qq = 0.0, kk = 0.0;
    for (uint i = 0u; i < p.dk; ++i) {
      const float qi = Floats(p.q).v[qk + i], ki = Floats(p.k).v[qk + i];
      qq += qi * qi;
      kk += ki * ki;
    }
    const float q_inv = 1.0 / sqrt(qq + 1e-6), k_inv = 1.0 / sqrt(kk + 1e-6);
    const float xa = Floats(p.a).v[t * p.hv + h] + dt;
    const float e = exp(xa);
    const float softplus = xa > 20.0 ? xa : (e < 1e-4 ? e * (1.0 - 0.5 * e) : log(1.0 + e));
    const float decay = exp(A * softplus);
    const float beta = 1.0 / (1.0 + exp(-Floats(p.b).v[t * p.hv + h]));
    precise float u = 0.0;
    for (uint i = 0u; i < p.dk; ++i) {
      S[i] *= decay;
      u += S[i] * (Floats(p.k).v[qk + i] * k_inv);
    }
    u = (Floats(p.v).v[(t * p.hv + h) * p.dv + j] - u) * beta;
    precise float out_j = 0.0;
    for (uint i = 0u; i < p.dk; ++i) {
      S[i] += (Floats(p.k).v[qk + i] * k_inv) * u;
      out_j += S[i] * (Floats(p.q).v[qk + i] * q_inv * q_scale);
    }
    Floats(p.o).v[(t * p.hv + h) * p.dv + j] = out_j;
  }
  for (uint i = 0u; i < p.dk; ++i) Floats(p.state).v[base + i * p.dv] = S[i];
}
