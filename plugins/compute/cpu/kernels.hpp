// Row kernels of the CPU backend: one dot product of a weight row with one token's activations.
//
// Every instruction-set path computes the same bits as the scalar path: integer sums inside a
// block are exact, and the float steps around them (scale products, lane-wise accumulation, the
// final reduction) are the same operations in the same order, without FMA. So a token's result
// depends only on its own row pair, never on the batch, the thread or the ISA.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "colibri/sdk/dtype.hpp"

namespace colibri::cpu {

using sdk::DType;

// Activations quantized per 32 elements (for q8_0, q4_0 and mxfp4 weights): x ~= d * qs.
struct Q8Block {
  float d;
  std::int32_t sum;  // sum of qs (the q4_0 and mxfp4 offset terms)
  std::int8_t qs[32];
};

// Activations quantized per 256 elements (for k-quant weights), with sums per 16.
struct Q8KBlock {
  float d;
  std::int16_t bsums[16];
  std::int8_t qs[256];
};

static_assert(sizeof(Q8Block) == 40);
static_assert(sizeof(Q8KBlock) == 292);

// The activation format a weight type is multiplied with.
enum class ActFormat { f32, q8_0, q8_k };
ActFormat act_format(DType weight, bool exact_activations) noexcept;
// Bytes of one token's activations of k elements in `format`.
std::size_t act_row_bytes(ActFormat format, std::int64_t k) noexcept;
// Quantizes (or copies) one token: k elements of x into act_row_bytes(format, k) bytes.
void quantize_activations(ActFormat format, const float* x, void* out, std::int64_t k) noexcept;

// One dot product: w_row (k elements of the weight type) with one token's activations.
using DotFn = float (*)(const void* w_row, const void* act, std::int64_t k) noexcept;

// Lanes of the float dot products: element i is accumulated in lane i % kF32Lanes, lanes reduced
// as a fixed binary tree. 32 lanes = 4 AVX2 or 2 AVX-512 registers.
inline constexpr int kF32Lanes = 32;
// Lanes of the q8_0 / q4_0 / mxfp4 block accumulation: block b goes to lane b % kBlockLanes.
inline constexpr int kBlockLanes = 4;

// Tokens a multi-token kernel (DotRowsTileFn) takes at a time.
inline constexpr int kTokenTile = 8;

// Several weight rows against one token (decode): the token's activation block is loaded once
// for all rows, scales are unpacked in vector registers and the per-row float updates run as
// one vector across rows. out[r] gets exactly the bits of DotFn for row r (at w + r * row_stride),
// nrows <= kRowTile (also the rows of one pool task: fewer, longer sequential streams per job).
inline constexpr int kRowTile = 64;
// Up to this many tokens a matmul's pool tasks take decode's larger share of rows, and the AVX-512 k-quant tile runs
// a single row through the multi-row kernel once per token.
inline constexpr int kRowsKernelTokens = 3;
using DotRowsFn = void (*)(const std::byte* w, std::size_t row_stride, int nrows, const void* act, std::int64_t k,
                           float* out) noexcept;

// Several weight rows against several tokens (prefill): each row's codes are decoded once per call for all the
// tokens, and the tokens' activations laid out once per call for all the rows. out[i * kRowTile + r] gets exactly
// the bits of DotFn for row r (at w + r * row_stride) and token i (at act + i * act_stride), nrows <= kRowTile,
// ntok <= kTokenTile.
using DotRowsTileFn = void (*)(const std::byte* w, std::size_t row_stride, int nrows, const std::byte* act,
                               std::size_t act_stride, int ntok, std::int64_t k, float* out) noexcept;

struct KernelSet {
  const char* name;
  DotFn f32;  // f32 weights (and every type in exact mode, after dequantizing the row)
  DotFn f16;
  DotFn bf16;
  DotFn q8_0;
  DotFn q4_0;
  DotFn q2_k;
  DotFn q3_k;
  DotFn q4_k;
  DotFn q5_k;
  DotFn q6_k;
  DotFn mxfp4;
  // y[i] = y[i] * c + a * x[i] (elementwise, so every vector width gives the same bits).
  void (*scale_axpy)(float* y, float c, float a, const float* x, std::int64_t n) noexcept = nullptr;
  // Several weight rows against one token; nullptr: call the DotFn per row.
  DotRowsFn rows_q4_k = nullptr;
  DotRowsFn rows_q6_k = nullptr;
  DotRowsFn rows_q5_k = nullptr;
  DotRowsFn rows_mxfp4 = nullptr;
  // scale_axpy with fp16 x (same bits as converting x first); nullptr: convert, then scale_axpy.
  void (*scale_axpy_f16)(float* y, float c, float a, const std::uint16_t* x, std::int64_t n) noexcept = nullptr;
  // quantize_activations with the same bits; nullptr: the scalar function.
  void (*quantize)(ActFormat format, const float* x, void* out, std::int64_t k) noexcept = nullptr;
  // Attention over nq queries that share a KV head (a GQA group), one block of keys at a time; each query's
  // result has the bits of the one-query functions, so grouping never changes the answer. false: this
  // head_dim or KV type is not handled here; nothing was written (the caller uses the one-query path).
  // Scores: out[n * out_stride + j] = f16/f32 DotFn(key j at k + j * stride bytes, query n at q + n * hd, hd).
  bool (*dot_rows_multi)(const void* k, std::size_t stride, int nkeys, const float* q, int nq, std::int64_t hd,
                         DType type, float* out, std::size_t out_stride) noexcept = nullptr;
  // Values: for query n (y + n * hd) and j = 0..nkeys-1, y = y * (j == 0 ? c[n] : 1) + a[n * a_stride + j] * x_j
  // (x_j at x + j * stride bytes): the bits of nkeys scale_axpy calls (y * 1 is exact), y held in registers.
  bool (*scale_axpy_rows_multi)(float* y, const float* c, const float* a, std::size_t a_stride, int nq, const void* x,
                                std::size_t stride, int nkeys, std::int64_t hd, DType type) noexcept = nullptr;
  // softmax_block_scalar with the same bits; nullptr: that function.
  float (*softmax_block)(float* s, int n, float scale, float m, float* sum) noexcept = nullptr;
  // swiglu_scalar with the same bits; nullptr: that function.
  void (*swiglu)(const float* g, const float* u, float* out, std::int64_t n) noexcept = nullptr;
  // Several weight rows against several tokens; nullptr: the multi-row kernel (or the DotFn) once per token.
  DotRowsTileFn tile_rows_mxfp4 = nullptr;
  DotRowsTileFn tile_rows_q8_0 = nullptr;  // 2 or more tokens; one token keeps the DotFn row by row
  DotRowsTileFn tile_rows_q4_0 = nullptr;
  DotRowsTileFn tile_rows_q4_k = nullptr;  // 2 or more tokens; one token keeps rows_q4_k
  DotRowsTileFn tile_rows_q5_k = nullptr;
  DotRowsTileFn tile_rows_q6_k = nullptr;
  // After the tiles (the initializers are positional): decode's multi-row kernel for q4_0; nullptr: the DotFn per row.
  DotRowsFn rows_q4_0 = nullptr;
  DotRowsFn rows_q2_k = nullptr;
  DotRowsFn rows_q3_k = nullptr;
  DotRowsTileFn tile_rows_q2_k = nullptr;
  DotRowsTileFn tile_rows_q3_k = nullptr;
};

// Where the kernels' software prefetches bring the weight stream (compute.prefetch): L2 (prefetcht1) or L1
// (prefetcht0). Set as the plugin is created; the results are the same either way.
inline std::atomic<bool> prefetch_to_l2{false};

// q4_0 rows from this K on take the multi-row, multi-token kernel for one token too (from memory 1.5-1.7x the one-row
// dot at K 2048-5632); shorter rows (Qwen3-MoE's down projection, K 768: 0.95x) keep the dot.
inline constexpr std::int64_t kRowsQ4_0MinK = 1024;

void scale_axpy_scalar(float* y, float c, float a, const float* x, std::int64_t n) noexcept;

// e^x for attention's softmax and SwiGLU. std::exp differs between C libraries and has no vector form, so the CPU
// backend computes its own, the same operations on every path: n = nearest(x * log2 e), r = x - n ln 2 (in two parts),
// a degree-7 polynomial in r (Horner, no FMA), times 2^n; within 2 ulp of e^x. Below kPortableExpMin it is 0 (the
// value would be subnormal), above kPortableExpMax infinity, NaN stays NaN.
inline constexpr float kPortableExpMin = -87.0f;
inline constexpr float kPortableExpMax = 88.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpPoly[8] = {1.0f,         1.0f,          0.5f,          1.0f / 6.0f,
                                      1.0f / 24.0f, 1.0f / 120.0f, 1.0f / 720.0f, 1.0f / 5040.0f};
float portable_exp(float x) noexcept;

// SwiGLU: out[i] = g[i] / (1 + portable_exp(-g[i])) * u[i], operation for operation on every path.
void swiglu_scalar(const float* g, const float* u, float* out, std::int64_t n) noexcept;

// One block of attention scores (n <= 64): s[j] *= scale; mn = max(m, every s[j]) (a NaN score is skipped);
// s[j] = portable_exp(s[j] - mn). Returns mn; *sum = the new s[j] summed in 16 lanes (j % 16), then lanes i and
// i + k added for k = 8, 4, 2, 1.
float softmax_block_scalar(float* s, int n, float scale, float m, float* sum) noexcept;

const KernelSet& scalar_kernels() noexcept;
const KernelSet& avx2_kernels() noexcept;     // needs avx2, fma, f16c
const KernelSet& avxvnni_kernels() noexcept;  // needs avxvnni besides the above
const KernelSet& avx512_kernels() noexcept;   // needs avx512f/bw/vl/vnni besides the above

// The dot function for weights of `type` with activations in act_format(type, exact); nullptr
// for a type the kernels do not handle.
DotFn select_dot(const KernelSet& set, DType type, bool exact_activations) noexcept;

// The multi-token function for quantized weights with quantized activations; nullptr otherwise.

// The multi-row function for quantized weights with quantized activations; nullptr otherwise.
DotRowsFn select_rows(const KernelSet& set, DType type, bool exact_activations) noexcept;

// The multi-row, multi-token function for quantized weights with quantized activations; nullptr otherwise.
DotRowsTileFn select_tile_rows(const KernelSet& set, DType type, bool exact_activations) noexcept;

// Shared scalar pieces (used by every path so the float steps match exactly).
float reduce_f32_lanes(const float* lanes) noexcept;    // kF32Lanes values, fixed tree
float reduce_block_lanes(const float* lanes) noexcept;  // kBlockLanes values
void unpack_q3_k_scales(const std::uint8_t* packed, std::int8_t* out) noexcept;

}  // namespace colibri::cpu
