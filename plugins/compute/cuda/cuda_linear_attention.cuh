// compute/cuda: Qwen3-Next's linear attention (causal_conv, gated_delta_rule) as per-thread steps, shared by the
// kernels and by a host test (cuda_linear_attention_test.cpp) that runs them over the whole grid on a machine without
// a GPU, so their indexing is checked on every CI run.
//
// Each thread owns what the op's bits depend on (a channel's window, a value column's state) and takes the tokens in
// order, so a token's bits never depend on how many share the call. Sums run i ascending, as the CPU backend's.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda_dequant.cuh"  // COLIBRI_HD

namespace colibri::cuda::linear {

// ---------------------------------------------------------------- causal_conv
// X {C, T}, W {K, C}, Y {C, T}, state {C, K - 1} (read, then rewritten with the last K - 1 inputs).
constexpr int kMaxTaps = 16;

struct ConvArgs {
  const float* x;
  const float* w;
  float* y;
  float* state;
  int c, t, k;
};

COLIBRI_HD float silu(float v) {
  return v / (1.0f + expf(-v));
}

// Channel ch (one thread each).
COLIBRI_HD void conv_channel(const ConvArgs& a, int ch) {
  float window[kMaxTaps];
  const int taps = a.k - 1;
  for (int j = 0; j < taps; ++j) window[j] = a.state[ch + static_cast<long long>(j) * a.c];
  const float* w = a.w + static_cast<long long>(ch) * a.k;
  for (int i = 0; i < a.t; ++i) {
    window[taps] = a.x[ch + static_cast<long long>(i) * a.c];
    float acc = 0.0f;
    for (int j = 0; j < a.k; ++j) acc = fmaf(w[j], window[j], acc);
    a.y[ch + static_cast<long long>(i) * a.c] = silu(acc);
    for (int j = 0; j < taps; ++j) window[j] = window[j + 1];
  }
  for (int j = 0; j < taps; ++j) a.state[ch + static_cast<long long>(j) * a.c] = window[j];
}

// ---------------------------------------------------------------- gated_delta_rule
// Q, K {dk, Hk, T}, V {dv, Hv, T}, a, b {Hv, T}, A, dt_bias {Hv}; O {dv, Hv, T}; state S[h][i][j] at j + dv (i + dk h).
// A block of kDeltaColumns threads owns value head h's columns [kDeltaColumns * blockIdx.x, ...): their state in
// shared memory (column-major per thread, so a warp's accesses fall in distinct banks), and per token the normalized
// q and k, which the block's threads fill together.
constexpr int kDeltaColumns = 32;
constexpr int kMaxDeltaDk = 256;  // shared memory: dk * (kDeltaColumns + 2) floats, 34 KiB at 256

struct DeltaArgs {
  const float *q, *k, *v, *a, *b, *decay_rate, *dt_bias;
  float* o;
  float* state;
  int dk, dv, hk, hv, t;
  bool tiled;  // kDeltaTiledHeads: value head h reads key head h % Hk, else h / (Hv / Hk)
};

COLIBRI_HD int key_head(const DeltaArgs& a, int h) {
  return a.tiled ? h % a.hk : h / (a.hv / a.hk);
}

// Token t of value head h: q / |q| / sqrt(dk) and k / |k| (norms over dk, i ascending) at elements lane, lane + lanes,
// ... of qn and kn. Every lane sums the whole row itself (broadcast loads), so each takes the same norm.
COLIBRI_HD void delta_keys(const DeltaArgs& a, int h, int t, int lane, int lanes, float* qn, float* kn) {
  const long long row = (static_cast<long long>(t) * a.hk + key_head(a, h)) * a.dk;
  const float *q = a.q + row, *k = a.k + row;
  float qq = 0.0f, kk = 0.0f;
  for (int i = 0; i < a.dk; ++i) {
    qq = fmaf(q[i], q[i], qq);
    kk = fmaf(k[i], k[i], kk);
  }
  const float q_inv = 1.0f / sqrtf(qq + 1e-6f), k_inv = 1.0f / sqrtf(kk + 1e-6f);
  const float q_scale = 1.0f / sqrtf(static_cast<float>(a.dk));
  for (int i = lane; i < a.dk; i += lanes) {
    qn[i] = q[i] * q_inv * q_scale;
    kn[i] = k[i] * k_inv;
  }
}

// Token t, value head h, column j: S (dk values `stride` apart) decays and takes the token, O[j] is written.
COLIBRI_HD void delta_column(const DeltaArgs& a, int h, int t, int j, float* S, int stride, const float* qn,
                             const float* kn) {
  const long long ht = static_cast<long long>(t) * a.hv + h;
  const float xa = a.a[ht] + a.dt_bias[h];
  const float softplus = xa > 20.0f ? xa : log1pf(expf(xa));
  const float decay = expf(a.decay_rate[h] * softplus);
  const float beta = 1.0f / (1.0f + expf(-a.b[ht]));
  float u = 0.0f;
  for (int i = 0; i < a.dk; ++i) {
    const float s = S[i * stride] * decay;
    S[i * stride] = s;
    u = fmaf(s, kn[i], u);
  }
  u = (a.v[ht * a.dv + j] - u) * beta;
  float out = 0.0f;
  for (int i = 0; i < a.dk; ++i) {
    const float s = fmaf(kn[i], u, S[i * stride]);
    S[i * stride] = s;
    out = fmaf(s, qn[i], out);
  }
  a.o[ht * a.dv + j] = out;
}

// Where column j of head h's state row i lives in the op's state tensor.
COLIBRI_HD long long delta_state_at(const DeltaArgs& a, int h, int i, int j) {
  return (static_cast<long long>(h) * a.dk + i) * a.dv + j;
}

}  // namespace colibri::cuda::linear
