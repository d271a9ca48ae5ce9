// compute/cuda: kernel launchers. Plain C++ interface over cuda_kernels.cu so the plugin (and the
// GEMV benchmark) need no CUDA language. Pointers are device pointers; shapes were validated by
// the caller. Every launcher enqueues on `stream` and returns the launch error (cudaSuccess when
// queued). Weight and cache types are GGML type ids (colibri::sdk::DType values).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace colibri::cuda {

// Device scratch for X quantized to 8 bits: t * k bytes (256-byte aligned), t * k / 32 floats (the scales) and
// t * k / 16 ints (the sum of each 16 quantized activations, which the formats with a min or an offset subtract).
struct Q8Scratch {
  std::int8_t* q;
  float* d;
  std::int32_t* s;
};
// Bytes of Q8Scratch that a matmul over {k, t} activations needs (0 when it would not use it), and that scratch
// laid out at `base` (device memory of at least that many bytes, 256-byte aligned).
std::size_t q8_scratch_bytes(std::int64_t k, std::int64_t t) noexcept;
Q8Scratch q8_scratch_at(void* base, std::int64_t k, std::int64_t t) noexcept;

// Where a matmul's rows lie, in floats (X, Y) and bytes (W). Token j of head h reads X at h * x_head + j * x_token and
// writes Y at h * y_head + j * y_token, with matrix h at h * w_head bytes. A plain matmul has one head and dense rows.
struct MatmulRows {
  int x_token, y_token, x_head, y_head;
  std::size_t w_head;
  static MatmulRows dense(std::int64_t k, std::int64_t n) noexcept {
    return {static_cast<int>(k), static_cast<int>(n), 0, 0, 0};
  }
};

// Y {n, t} = W {k, n} * X {k, t} (+ bias {n}); W of any supported type, rows row_bytes apart. With `q8` (the op
// may quantize activations: no kExactActivations) a block-format matmul quantizes X per token into it and takes
// integer dot products: the k-quants where k is a multiple of 256, q8_0, q4_0 and mxfp4 where it is a multiple of 32
// (q8dot::takes_k); otherwise X stays f32. The choice never depends on where W lies. `x_in_q8`: q8 already holds this
// X, quantized by an earlier launch on the stream for a weight type of the same q8_block and the same k and t (the
// expert ops' gate and up, and a group's experts that share X), so it is not quantized again: the same integers.
cudaError_t launch_matmul(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                          const float* x, float* y, const float* bias, std::int64_t k, std::int64_t n, std::int64_t t,
                          const Q8Scratch* q8 = nullptr, bool x_in_q8 = false) noexcept;
// matmul_heads in one matmul launch (the head on grid.z): Y {n, heads, t} with Y[:, h, j] = W_h {k, n} * the first k
// values of X[:, h, j], X {kx, heads, t}, W {k, n, heads} (rows row_bytes apart). Every element has the bits of
// launch_matmul on W_h and those rows. With q8 (and a weight type and k that take 8-bit activations) X is quantized
// head by head into q8, which must hold k x (heads * t) activations; heads at most 65535.
cudaError_t launch_matmul_heads(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                                const float* x, float* y, std::int64_t k, std::int64_t n, std::int64_t heads,
                                std::int64_t kx, std::int64_t t, const Q8Scratch* q8 = nullptr) noexcept;
// The block of 8-bit activations launch_matmul with q8 quantizes X into for this weight type and k (32 or 256; the
// quantized bytes depend on it, k and t only), or 0 where X stays f32.
int q8_block(std::uint32_t wtype, std::int64_t k) noexcept;

// For colibri_bench_cuda_gemv: the decode matmul (T = 1, 8-bit activations) of q4_k, q5_k, q6_k, q8_0, q4_0 or mxfp4
// in variant 0..kDecodeVariantCount-1, named by matmul_q8_variant_name: "default" (launch_matmul's tile for the
// format), else "RxU[ minB]": R rows per warp, U of a lane's units per step, at least B blocks of 256 threads per
// multiprocessor (a register cap). Without `quantize` the matmul alone runs, on X already quantized in q8 by an
// earlier call of the same k. Variants from kPairsVariant on ("pairs RxU[ minB]") run q4_k and q5_k in their
// candidate layouts (q8dot::Q4_K_Pairs, Q5_K_Pairs) and give launch_matmul_q8_pairs's bits (cudaErrorNotSupported for
// other formats); the others give launch_matmul's. cudaErrorInvalidValue for another format or variant.
constexpr int kDecodeVariantCount = 12;
constexpr int kPairsVariant = 8;
cudaError_t launch_matmul_q8_variant(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                                     const float* x, float* y, std::int64_t k, std::int64_t n, const Q8Scratch& q8,
                                     int variant, bool quantize = true) noexcept;
const char* matmul_q8_variant_name(int variant) noexcept;
// For colibri_bench_cuda_gemv: launch_matmul of q4_k or q5_k weights with 8-bit activations (q8 as there), in the
// candidate pairs layout (q8dot::Q4_K_Pairs, Q5_K_Pairs: lanes of 64 weights) rather than the default's; the same sums
// in another order, so the bits differ from launch_matmul's by rounding, while an element's bits are the same at every
// t. cudaErrorNotSupported for other formats.
cudaError_t launch_matmul_q8_pairs(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                                   const float* x, float* y, std::int64_t k, std::int64_t n, std::int64_t t,
                                   const Q8Scratch& q8) noexcept;

// expert_ffn_routed (one token, k picks, no host wait): the choice is read on the device.
// launch_quantize_q8: X {k, t} quantized into q8 as launch_matmul does for this weight type and k (per token, so token
// j of t has the integers it has alone); cudaErrorInvalidValue where that type and k keep X in f32.
cudaError_t launch_quantize_q8(cudaStream_t stream, std::uint32_t wtype, const float* x, const Q8Scratch& q8,
                               std::int64_t k, std::int64_t t) noexcept;
// Y {n, picks}: column j = W_e * X with e = ids[j], W_e = table[e] (E device pointers, W of wtype, rows row_bytes
// apart) and X the quantized token j of q8 (x_per_pick) or token 0 (every pick the same X); the bits of launch_matmul
// at t = 1 on W_e. An id outside 0..experts-1 reads no table entry and gives a column of NaN.
constexpr int kMaxRoutedPicks = 32;
cudaError_t launch_matmul_q8_routed(cudaStream_t stream, std::uint32_t wtype, const void* const* table,
                                    const std::int32_t* ids, std::int32_t experts, std::size_t row_bytes,
                                    const Q8Scratch& q8, bool x_per_pick, float* y, std::int64_t k, std::int64_t n,
                                    std::int64_t picks) noexcept;
// y {d} = +0, then += weights[j] * ys[:, j] with scale_add's fmaf for the picks in ascending ids[j]; NaN where any id
// is outside 0..experts-1. ys {d, picks}.
cudaError_t launch_routed_combine(cudaStream_t stream, const float* ys, const std::int32_t* ids, const float* weights,
                                  float* y, std::int64_t d, std::int64_t picks, std::int32_t experts) noexcept;

// n elements of X encoded into Y of a KV cache type (f32, f16, q8_0; n a multiple of 32 for q8_0), the bytes of
// colibri::quant::quantize_row. Y is 2-byte aligned.
cudaError_t launch_store_rows(cudaStream_t stream, std::uint32_t type, const float* x, void* y,
                              std::int64_t n) noexcept;

// Y {d, t}: rows ids[i] of the table; an id outside 0..vocab-1 sets status[0] = i + 1, status[1] = id.
cudaError_t launch_embedding(cudaStream_t stream, std::uint32_t wtype, const void* table, std::size_t row_bytes,
                             const std::int32_t* ids, float* y, std::int64_t d, std::int64_t vocab, std::int64_t t,
                             std::int32_t* status) noexcept;

// Rows of `width` floats indexed (o, i), o < outer and i < inner: dst[o * dst_outer + i * dst_inner + e] =
// src[o * src_outer + i * src_inner + e] (strides in floats), the bits as they are: concat_rows.
cudaError_t launch_copy_rows(cudaStream_t stream, const float* src, float* dst, std::int64_t width, std::int64_t outer,
                             std::int64_t inner, std::int64_t src_outer, std::int64_t src_inner, std::int64_t dst_outer,
                             std::int64_t dst_inner) noexcept;

struct AttentionArgs {
  const float* q;
  const void* k;
  const void* v;
  float* o;
  std::int32_t head_dim, n_heads, n_kv_heads, t, position, window;
  float scale;
  std::size_t kv_row_bytes;      // bytes of one cached row of head_dim
  const float* sinks = nullptr;  // attention_sinks: {n_heads} f32, each head's extra softmax key of value zero
};
cudaError_t launch_attention(cudaStream_t stream, std::uint32_t kv_type, const AttentionArgs& a) noexcept;

cudaError_t launch_rms_norm(cudaStream_t stream, const float* x, const float* w, float* y, std::int64_t d,
                            std::int64_t rows, float eps) noexcept;

cudaError_t launch_rope(cudaStream_t stream, const float* x, const std::int32_t* positions, const float* inv_freq,
                        float* y, std::int64_t head_dim, std::int64_t n_heads, std::int64_t t, std::int32_t rope_dims,
                        bool interleaved, float scale) noexcept;

enum class Eltwise : int { add, swiglu, sigmoid, scale_add, mul };
// add / swiglu / mul: y = f(a, b); sigmoid: y = f(a); scale_add: y[i] += b[i / d] * a[i].
cudaError_t launch_eltwise(cudaStream_t stream, Eltwise mode, const float* a, const float* b, float* y, std::int64_t n,
                           std::int64_t d) noexcept;

// causal_conv (sdk compute.hpp): X {channels, t}, W {k, channels} with k <= 16, Y {channels, t}, state
// {channels, k - 1}; one thread per channel, its tokens in order.
cudaError_t launch_causal_conv(cudaStream_t stream, const float* x, const float* w, float* y, float* state,
                               std::int64_t channels, std::int64_t t, std::int64_t k) noexcept;

// gated_delta_rule (sdk compute.hpp), dk <= 256, hv <= 65535: a block per (32 value columns, value head).
struct DeltaRuleArgs {
  const float *q, *k, *v, *a, *b, *decay_rate, *dt_bias;
  float* o;
  float* state;
  std::int64_t dk, dv, hk, hv, t;
  bool tiled;
};
cudaError_t launch_gated_delta_rule(cudaStream_t stream, const DeltaRuleArgs& d) noexcept;

// gpt-oss's clamped SwiGLU (expert_ffn_clamped): y = g / (1 + e^(-alpha g)) * (u + 1) with g = min(gate, limit) and
// u = clamp(up, -limit, limit); y may be gate.
cudaError_t launch_clamped_glu(cudaStream_t stream, const float* gate, const float* up, float* y, std::int64_t n,
                               float alpha, float limit) noexcept;

// mode: 0 raw logits, 1 softmax, 2 sigmoid. A NaN logit sets status[0] = token + 1, status[1] = expert.
cudaError_t launch_topk(cudaStream_t stream, const float* logits, std::int32_t* ids, float* weights, std::int64_t e,
                        std::int64_t t, std::int32_t k, int mode, bool renormalize, std::int32_t* status) noexcept;
// topk_routing_biased: picks by score + bias[j] (bias {e}), weights the scores, / (sum + 1e-20) with renormalize,
// then * scale. NaN logits as launch_topk.
cudaError_t launch_topk_biased(cudaStream_t stream, const float* logits, const float* bias, std::int32_t* ids,
                               float* weights, std::int64_t e, std::int64_t t, std::int32_t k, int mode,
                               bool renormalize, float scale, std::int32_t* status) noexcept;
// topk_routing_grouped: as launch_topk_biased among the experts of the groups_used best of `groups` consecutive
// groups only (a group's score: its two highest score + bias added, or its highest with group_max; ties to the lower
// group).
cudaError_t launch_topk_grouped(cudaStream_t stream, const float* logits, const float* bias, std::int32_t* ids,
                                float* weights, std::int64_t e, std::int64_t t, std::int32_t k, int mode,
                                bool renormalize, float scale, std::int32_t groups, std::int32_t groups_used,
                                bool group_max, std::int32_t* status) noexcept;

// cudaSuccess when this build holds code the current device can run (else cudaErrorNoKernelImageForDevice).
cudaError_t kernel_image_status() noexcept;

}  // namespace colibri::cuda
