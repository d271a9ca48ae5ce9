// Scalar float64 reference of every compute op (compute.hpp), written for clarity rather than
// speed: the yardstick of the compute conformance suite. Weights of block types are dequantized
// with colibri::quant (bit-exact GGML dequantizers) and then used in double precision.
#pragma once

#include <cstdint>
#include <vector>

#include "colibri/sdk/dtype.hpp"

namespace colibri::sdk::testing::ref {

// n elements of `type` at data, as floats (dequantized exactly as GGML does).
std::vector<float> dequantize(DType type, const void* data, std::int64_t n);

// Y[t * n + r] = sum_k W[r][k] * X[t][k] (+ bias[r]); W is n rows of k elements of `type`.
std::vector<double> matmul(DType type, const void* w, std::int64_t k, std::int64_t n, const float* x, std::int64_t t,
                           const float* bias = nullptr);

// down(silu(gate X) * up X), every intermediate in double. gate/up: f rows of d; down: d rows of f.
std::vector<double> expert_ffn(DType gate_type, const void* gate, DType up_type, const void* up, DType down_type,
                               const void* down, std::int64_t d, std::int64_t f, const float* x, std::int64_t t);

// gpt-oss's expert (expert_ffn_clamped), every intermediate in double: g = min(gate X + b_gate, limit),
// u = clamp(up X + b_up, -limit, limit), Y = down((u + 1) * g * sigmoid(alpha * g)) + b_down.
std::vector<double> expert_ffn_clamped(DType gate_type, const void* gate, DType up_type, const void* up,
                                       DType down_type, const void* down, std::int64_t d, std::int64_t f,
                                       const float* x, std::int64_t t, const float* b_gate, const float* b_up,
                                       const float* b_down, float alpha, float limit);

std::vector<double> rms_norm(const float* x, std::int64_t d, std::int64_t rows, const float* w, float eps);

// X {head_dim, heads, t}. The angle is float32(pos) * inv_freq[i] rounded to float32, as
// HuggingFace computes it; cos and sin are then taken in double.
std::vector<double> rope(const float* x, std::int64_t head_dim, std::int64_t heads, std::int64_t t,
                         const std::int32_t* positions, const float* inv_freq, int rope_dims, bool interleaved,
                         float scale);

// Causal attention with a full (double) softmax. K/V are f32 {head_dim, kv_heads, s}. With sinks ({heads},
// attention_sinks), head h's softmax has one more logit, sinks[h] (not scaled), whose value row is zero: as
// HuggingFace's gpt-oss appends it as a column, subtracts the row maximum, takes the softmax and drops the column.
std::vector<double> attention(const float* q, std::int64_t head_dim, std::int64_t heads, std::int64_t t, const float* k,
                              const float* v, std::int64_t kv_heads, std::int64_t s, std::int32_t position,
                              std::int32_t window, float scale, const float* sinks = nullptr);

// concat_rows: A {a, rows} and B {b, rows} into {a + b, rows}, each row A's then B's (a copy of the floats).
std::vector<float> concat_rows(const float* a, std::int64_t a_width, const float* b, std::int64_t b_width,
                               std::int64_t rows);

// matmul_heads: W {k, n, heads} of `type` (heads matrices of n rows), X {kx, heads, t} with kx >= k;
// Y[(i * heads + h) * n + r] = matmul of W's matrix h and the first k values of X's row (i, h).
std::vector<double> matmul_heads(DType type, const void* w, std::int64_t k, std::int64_t n, std::int64_t heads,
                                 const float* x, std::int64_t kx, std::int64_t t);

double silu(double x);
double sigmoid(double x);

// causal_conv: X {ch, t}, W {k, ch} (a channel's taps, oldest first), the state {ch, k - 1} (updated to the last k - 1
// inputs); Y {ch, t} = silu of each window's dot product.
std::vector<double> causal_conv(const std::vector<float>& x, const std::vector<float>& w, std::vector<double>& state,
                                std::int64_t ch, std::int64_t k, std::int64_t t);

// gated_delta_rule's shapes: Q, K {dk, hk, t}, V {dv, hv, t}.
struct DeltaShape {
  std::int64_t dk, hk, dv, hv, t;
};
// gated_delta_rule (compute.hpp) in doubles: O {dv, hv, t}; `state` {dv, dk, hv} updated. `tiled`: value head h reads
// key head h % hk (kDeltaTiledHeads), else h / (hv / hk).
std::vector<double> gated_delta_rule(const DeltaShape& d, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const std::vector<float>& a,
                                     const std::vector<float>& b, const std::vector<float>& A,
                                     const std::vector<float>& dt, std::vector<double>& state, bool tiled);

struct Routing {
  std::vector<std::int32_t> ids;  // {k, t}
  std::vector<double> weights;    // {k, t}
};
// flags: kRoutingSoftmax / kRoutingRenormalize / kRoutingSigmoid of compute.hpp.
Routing topk_routing(const float* logits, std::int64_t experts, std::int64_t t, int k, int flags);
// topk_routing_biased (GLM-4.5 / DeepSeek-V3), bias {experts}: scores as topk_routing's, the k picks by score + bias
// (ties to the lower id, listed by descending score + bias), each weight its own score divided by the k scores' sum
// + 1e-20 with kRoutingRenormalize, then times scale.
Routing topk_routing_biased(const float* logits, const float* bias, std::int64_t experts, std::int64_t t, int k,
                            int flags, float scale);
// topk_routing_grouped (DeepSeek-V3 / V2): as topk_routing_biased, but only the experts of the groups_used of the
// `groups` consecutive groups with the highest group scores compete: a group's score is the sum of its two highest
// score + bias (its highest alone with kRoutingGroupMax); ties go to the lower group.
Routing topk_routing_grouped(const float* logits, const float* bias, std::int64_t experts, std::int64_t t, int k,
                             int flags, float scale, int groups, int groups_used);

}  // namespace colibri::sdk::testing::ref
