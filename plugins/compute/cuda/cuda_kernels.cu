// compute/cuda: every kernel of the backend.
//
// Numerics (the one promise): each output element is reduced in an order that depends only on the
// op's own shape (K, head_dim, a query's position), never on T or on other tokens. Products and sums
// that the promise or the reference depends on are spelled out (fmaf, __fmul_rn, __fsub_rn) so
// that the compiler's FMA contraction cannot differ between template instantiations. Dequantization
// follows colibri::quant's reference term by term, so it is bit-identical to the CPU backend.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda_dequant.cuh"
#include "cuda_kernels.hpp"
#include "cuda_linear_attention.cuh"
#include "cuda_q8dot.cuh"

namespace colibri::cuda {
namespace {

// GGML type ids (colibri::sdk::DType).
constexpr std::uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
                        kQ6_K = 14, kBF16 = 30, kMXFP4 = 39;

using dequant::BF16;
using dequant::F16;
using dequant::f16_at;
using dequant::F32;
using dequant::kChunk;
using dequant::MXFP4;
using dequant::Q2_K;
using dequant::Q3_K;
using dequant::Q4_0;
using dequant::Q4_K;
using dequant::Q5_K;
using dequant::Q6_K;
using dequant::Q8_0;

// ---------------------------------------------------------------- matmul
// A warp owns R rows and accumulates NT tokens at once, so weights are read once per NT tokens and
// activations once per R rows. Each lane keeps one partial sum per row and token; the 32 partial
// sums are combined by a fixed xor-shuffle tree. Which weights a lane takes depends on K alone:
// - lane layouts (dequant.cuh; K a multiple of 256): the warp walks the row one 256-element unit at
//   a time, lane l taking 8 weights whose words and activations neighbour lane l+1's (coalesced);
// - chunk path (q2_k, q3_k, other K): lane l dequantizes 32-weight chunks l, l+32, ...
// NT and R vary with T; the operations on any one output element, and their order, do not.

constexpr int kMatmulThreads = 256;
constexpr int kWarps = kMatmulThreads / 32;

// n activations (zeros past `valid`), as 16-byte loads where `vec` says the address allows.
template <int N>
__device__ __forceinline__ void load_x(const float* p, int valid, bool vec, float* xv) {
  if (vec && valid == N) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + j);
      xv[4 * j] = v.x;
      xv[4 * j + 1] = v.y;
      xv[4 * j + 2] = v.z;
      xv[4 * j + 3] = v.w;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) xv[j] = j < valid ? __ldg(p + j) : 0.0f;
}

// Sums a warp's partial sums for rows row0.. and tokens t0.. (fixed tree) and lane 0 writes Y (+ bias): token j's
// row at y + j * y_token.
template <int NT, int R>
__device__ __forceinline__ void store_tile(float (&acc)[R][NT], long long row0, int t0, float* y, const float* bias,
                                           int n, int t, int y_token) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      float s = acc[r][i];
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, off));
      const long long row = row0 + r;
      if (threadIdx.x % 32 == 0 && row < n && t0 + i < t) {
        y[static_cast<std::size_t>(t0 + i) * y_token + row] = bias != nullptr ? __fadd_rn(s, bias[row]) : s;
      }
    }
  }
}

// The rows and tokens a warp works on (rows past N and tokens past T repeat the last real one). Heads (matmul_heads):
// in head blockIdx.z's matrix and rows (MatmulRows); otherwise X and Y are dense and `rows` is not read, so the plain
// matmul's code is what it was.
template <int NT, int R, bool Heads>
struct WarpTile {
  long long row0;
  int t0;
  const std::uint8_t* w[R];
  const float* x[NT];

  __device__ WarpTile(const std::uint8_t* weights, std::size_t row_bytes, const float* acts, int k, int n, int t,
                      const MatmulRows& rows) {
    row0 = (static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
    t0 = blockIdx.y * NT;
    if constexpr (Heads) {
      weights += blockIdx.z * rows.w_head;
      acts += static_cast<std::size_t>(blockIdx.z) * rows.x_head;
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      w[r] = weights + static_cast<std::size_t>(min(row0 + r, static_cast<long long>(n - 1))) * row_bytes;
#pragma unroll
    for (int i = 0; i < NT; ++i)
      x[i] = acts + static_cast<std::size_t>(min(t0 + i, t - 1)) * (Heads ? rows.x_token : k);
  }

  __device__ void store(float (&acc)[R][NT], float* y, const float* bias, int n, int t, const MatmulRows& rows) const {
    if constexpr (Heads) {
      store_tile<NT, R>(acc, row0, t0, y + static_cast<std::size_t>(blockIdx.z) * rows.y_head, bias, n, t,
                        rows.y_token);
    } else {
      store_tile<NT, R>(acc, row0, t0, y, bias, n, t, n);
    }
  }
};

template <class F, int NT, int R, bool Heads>
__global__ void __launch_bounds__(kMatmulThreads)
    matmul_lanes_kernel(const std::uint8_t* __restrict__ w, std::size_t row_bytes, const float* __restrict__ x,
                        float* __restrict__ y, const float* __restrict__ bias, int k, int n, int t, MatmulRows rows) {
  const WarpTile<NT, R, Heads> tile(w, row_bytes, x, k, n, t, rows);
  if (tile.row0 >= n) return;  // whole warps leave; no block-level synchronisation follows
  const int lane = threadIdx.x % 32;
  const int o0 = F::off0(lane), o1 = F::off1(lane);
  // K % 256 == 0: every unit of a row alike, and every token's row (heads: where the rows lie 16 bytes apart)
  const bool vec = Heads ? (reinterpret_cast<std::uintptr_t>(tile.x[0]) & 15) == 0 && rows.x_token % 4 == 0
                         : (reinterpret_cast<std::uintptr_t>(x) & 15) == 0;
  float acc[R][NT] = {};
  const int units = k / dequant::kUnit;
#pragma unroll 2
  for (int u = 0; u < units; ++u) {
    float wv[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) F::lane(tile.w[r], u, lane, wv[r]);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      float xv[8];
      const float* xp = tile.x[i] + u * dequant::kUnit;
      load_x<4>(xp + o0, 4, vec, xv);
      load_x<4>(xp + o1, 4, vec, xv + 4);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][i] = fmaf(wv[r][j], xv[j], acc[r][i]);
      }
    }
  }
  tile.store(acc, y, bias, n, t, rows);
}

template <class F, int NT, int R, bool Heads>
__global__ void __launch_bounds__(kMatmulThreads)
    matmul_chunks_kernel(const std::uint8_t* __restrict__ w, std::size_t row_bytes, const float* __restrict__ x,
                         float* __restrict__ y, const float* __restrict__ bias, int k, int n, int t, MatmulRows rows) {
  const WarpTile<NT, R, Heads> tile(w, row_bytes, x, k, n, t, rows);
  if (tile.row0 >= n) return;
  const int lane = threadIdx.x % 32;
  float acc[R][NT] = {};
  const int chunks = (k + kChunk - 1) / kChunk;
  for (int c = lane; c < chunks; c += 32) {
    const int base = c * kChunk;
    const int valid = min(kChunk, k - base);
    if constexpr (NT == 1) {
      // Decode: the token's 32 activations stay in registers while each row's chunk streams by.
      float xv[kChunk];
      load_x<kChunk>(tile.x[0] + base, valid, (reinterpret_cast<std::uintptr_t>(tile.x[0] + base) & 15) == 0, xv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wv[kChunk];
        F::chunk(tile.w[r], c, valid, wv);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) acc[r][0] = fmaf(wv[j], xv[j], acc[r][0]);
      }
    } else {
      float wv[R][kChunk];
#pragma unroll
      for (int r = 0; r < R; ++r) F::chunk(tile.w[r], c, valid, wv[r]);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        float xv[kChunk];
        load_x<kChunk>(tile.x[i] + base, valid, (reinterpret_cast<std::uintptr_t>(tile.x[i] + base) & 15) == 0, xv);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][i] = fmaf(wv[r][j], xv[j], acc[r][i]);
        }
      }
    }
  }
  tile.store(acc, y, bias, n, t, rows);
}

template <class F, int NT, int R, bool Lanes, bool Heads = false>
cudaError_t matmul_as(cudaStream_t s, const void* w, std::size_t rb, const float* x, float* y, const float* bias,
                      std::int64_t k, std::int64_t n, std::int64_t t, const MatmulRows& rows, std::int64_t heads) {
  const std::int64_t rows_per_block = static_cast<std::int64_t>(kWarps) * R;
  const dim3 grid(static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>((t + NT - 1) / NT), static_cast<unsigned>(heads));
  const auto* wb = static_cast<const std::uint8_t*>(w);
  const int ki = static_cast<int>(k), ni = static_cast<int>(n), ti = static_cast<int>(t);
  if constexpr (Lanes) {
    matmul_lanes_kernel<F, NT, R, Heads><<<grid, kMatmulThreads, 0, s>>>(wb, rb, x, y, bias, ki, ni, ti, rows);
  } else {
    matmul_chunks_kernel<F, NT, R, Heads><<<grid, kMatmulThreads, 0, s>>>(wb, rb, x, y, bias, ki, ni, ti, rows);
  }
  return cudaGetLastError();
}

// Token tiles by T: one token reads each weight once; bigger batches share each dequantized weight
// among up to 8 tokens (the tiled path for prefill). The layout is chosen by K alone.
template <class F>
cudaError_t matmul_for(cudaStream_t s, const void* w, std::size_t rb, const float* x, float* y, const float* bias,
                       std::int64_t k, std::int64_t n, std::int64_t t) {
  const MatmulRows rows = MatmulRows::dense(k, n);
  const std::int64_t heads = 1;
  if constexpr (F::kLanes) {
    if (k % dequant::kUnit == 0) {
      if (t == 1) return matmul_as<F, 1, 4, true>(s, w, rb, x, y, bias, k, n, t, rows, heads);
      if (t == 2) return matmul_as<F, 2, 4, true>(s, w, rb, x, y, bias, k, n, t, rows, heads);
      if (t <= 4) return matmul_as<F, 4, 2, true>(s, w, rb, x, y, bias, k, n, t, rows, heads);
      return matmul_as<F, 8, 2, true>(s, w, rb, x, y, bias, k, n, t, rows, heads);
    }
    // Rows that are not whole units (rare shapes): two tiles suffice, the order is the same.
    if (t == 1) return matmul_as<F, 1, 4, false>(s, w, rb, x, y, bias, k, n, t, rows, heads);
    return matmul_as<F, 8, 2, false>(s, w, rb, x, y, bias, k, n, t, rows, heads);
  } else {
    if (t == 1) return matmul_as<F, 1, 4, false>(s, w, rb, x, y, bias, k, n, t, rows, heads);
    if (t == 2) return matmul_as<F, 2, 4, false>(s, w, rb, x, y, bias, k, n, t, rows, heads);
    if (t <= 4) return matmul_as<F, 4, 2, false>(s, w, rb, x, y, bias, k, n, t, rows, heads);
    return matmul_as<F, 8, 2, false>(s, w, rb, x, y, bias, k, n, t, rows, heads);
  }
}

// matmul_heads (MatmulRows, the head on grid.z): the decode tile for one token, the widest for more. The tile never
// changes an element's terms or their order, so fewer instantiations cost nothing but speed on batches of 2 to 4.
template <class F>
cudaError_t matmul_heads_for(cudaStream_t s, const void* w, std::size_t rb, const float* x, float* y, std::int64_t k,
                             std::int64_t n, std::int64_t t, const MatmulRows& rows, std::int64_t heads) {
  constexpr bool lanes = F::kLanes;
  if (lanes && k % dequant::kUnit == 0) {
    if (t == 1) return matmul_as<F, 1, 4, lanes, true>(s, w, rb, x, y, nullptr, k, n, t, rows, heads);
    return matmul_as<F, 8, 2, lanes, true>(s, w, rb, x, y, nullptr, k, n, t, rows, heads);
  }
  if (t == 1) return matmul_as<F, 1, 4, false, true>(s, w, rb, x, y, nullptr, k, n, t, rows, heads);
  return matmul_as<F, 8, 2, false, true>(s, w, rb, x, y, nullptr, k, n, t, rows, heads);
}

// ---------------------------------------------------------------- matmul on 8-bit activations
// Without kExactActivations a quantized matmul may quantize X per token (as GGML's vec_dot and the CPU backend do).
// X is quantized the CPU backend's way (q8dot.cuh: per 256 for the k-quants, per 32 for q8_0 and q4_0), then each
// lane takes 32 weights of one unit at a time: integer dot products (dp4a, exact in any order) and one float step,
// acc += dx * part. Lane l takes units l / 8, l / 8 + 4, ..., so the terms of an output element and their order
// depend on K alone, for every token tile; the float-per-weight path spends about nine instructions per weight,
// this one about one.

// One warp per 256 elements (blockIdx.y) of one token (blockIdx.x) of head blockIdx.z (MatmulRows: X's rows; they
// land in q8 as token blockIdx.z * t + blockIdx.x, each head's t tokens in a run), 8 per lane: d = amax / 127 over each
// kBlock-element block (lanes kBlock / 8 apart), q = x * (1 / d) rounded half to even, as the CPU backend quantizes
// (same integers, so the two backends' sums agree). A partial last unit (k a multiple of kBlock) leaves the lanes
// past k idle but in the shuffles, which stay within a block.
template <int kBlock>
__global__ void quantize_q8_kernel(const float* __restrict__ x, std::int8_t* __restrict__ q, float* __restrict__ d,
                                   std::int32_t* __restrict__ sums, int k, int x_token, int x_head) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");  // the matmul after it may be placed now (it waits for us)
#endif
  const int lane = threadIdx.x;
  const int element = static_cast<int>(blockIdx.y) * q8dot::kUnit + 8 * lane;
  const bool inside = element < k;
  const std::size_t from = static_cast<std::size_t>(blockIdx.z) * x_head +
                           static_cast<std::size_t>(blockIdx.x) * x_token + static_cast<std::size_t>(element);
  const std::size_t at =
      (static_cast<std::size_t>(blockIdx.z) * gridDim.x + blockIdx.x) * k + static_cast<std::size_t>(element);
  float v[8];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = inside ? __ldg(x + from + j) : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
#pragma unroll
  for (int off = kBlock / 16; off >= 1; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float dq = __fdiv_rn(amax, 127.0f);
  const float id = dq != 0.0f ? __fdiv_rn(1.0f, dq) : 0.0f;
  std::uint32_t packed[2] = {0, 0};
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float s = __fmul_rn(v[j], id);
    const int qi = !(s >= -127.0f) ? -127 : (s > 127.0f ? 127 : __float2int_rn(s));
    packed[j / 4] |= (static_cast<std::uint32_t>(qi) & 0xFFu) << (8 * (j % 4));
    sum += qi;
  }
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);  // lanes 2m and 2m + 1 hold one group of 16
  if (!inside) return;
  *reinterpret_cast<uint2*>(q + at) = make_uint2(packed[0], packed[1]);
  if (lane % (kBlock / 8) == 0) d[at / kBlock] = dq;
  if (lane % 2 == 0) sums[at / 16] = sum;
}

// expert_ffn_routed's choice for the routed matmul (Routed = true): pick blockIdx.y takes expert ids[pick]'s weights,
// table[ids[pick]], and writes column pick of Y. Empty otherwise, so the plain matmul's code is what it was.
template <bool Routed>
struct Route {};
template <>
struct Route<true> {
  const void* const* table;  // one device pointer per expert
  const std::int32_t* ids;   // the k picks of the token, where topk_routing left them
  int experts;
  int x_per_pick;  // 1: pick j reads token j of the quantized X (down); 0: token 0 for every pick (gate, up)
};

template <class F, int NT, int R, int U, int MinBlocks, bool Routed, bool Heads>
__global__ void __launch_bounds__(kMatmulThreads, MinBlocks)
    matmul_q8_kernel(const std::uint8_t* __restrict__ w, std::size_t row_bytes, const std::int8_t* __restrict__ xq,
                     const float* __restrict__ xd, const std::int32_t* __restrict__ xs, float* __restrict__ y,
                     const float* __restrict__ bias, int k, int n, int t, Route<Routed> route, MatmulRows rows) {
  const long long row0 = (static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= n) return;  // whole warps leave; no block-level synchronisation follows
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched early (matmul_q8_as): X's quantization must be complete and visible first (routed: the ids and the
  // table too, though those were written before the quantization started). A no-op otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  float acc[R][NT];
  if constexpr (Routed) {
    // One pick per block row, in the decode tile (NT = 1): lane_sums and store_tile as the T = 1 matmul runs them, on
    // that pick's weights and token, so every element has the terms, order and bits of launch_matmul at t = 1.
    static_assert(NT == 1, "a routed block row takes one pick");
    (void)w, (void)bias, (void)t, (void)rows;
    const int pick = static_cast<int>(blockIdx.y);
    const int id = route.ids[pick];
    float* yp = y + static_cast<std::size_t>(pick) * n;
    if (id < 0 || id >= route.experts) {
      // topk_routing's NaN mark (id -1): no table entry to read. The combine gives the token NaN; these rows get NaN
      // too, so the later kernels read written values.
      if (threadIdx.x % 32 == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (row0 + r < n) yp[row0 + r] = __int_as_float(0x7FC00000);
        }
      }
      return;
    }
    const int tok = route.x_per_pick != 0 ? pick : 0;
    q8dot::lane_sums<F, NT, R, U>(static_cast<const std::uint8_t*>(route.table[id]), row_bytes, xq, xd, xs, k, n,
                                  tok + 1, row0, tok, static_cast<int>(threadIdx.x % 32), acc);
    store_tile<NT, R>(acc, row0, 0, yp, nullptr, n, 1, n);
  } else {
    (void)route;
    const int t0 = blockIdx.y * NT;
    if constexpr (Heads) {
      // Head blockIdx.z (MatmulRows): its matrix, its run of t tokens in q8 (quantize_q8_kernel), its rows of Y.
      const std::size_t first = static_cast<std::size_t>(blockIdx.z) * t;
      q8dot::lane_sums<F, NT, R, U>(w + blockIdx.z * rows.w_head, row_bytes, xq + first * k,
                                    xd + first * (k / F::kXBlock), xs + first * (k / 16), k, n, t, row0, t0,
                                    static_cast<int>(threadIdx.x % 32), acc);
      store_tile<NT, R>(acc, row0, t0, y + static_cast<std::size_t>(blockIdx.z) * rows.y_head, bias, n, t,
                        rows.y_token);
    } else {
      (void)rows;
      q8dot::lane_sums<F, NT, R, U>(w, row_bytes, xq, xd, xs, k, n, t, row0, t0, static_cast<int>(threadIdx.x % 32),
                                    acc);
      store_tile<NT, R>(acc, row0, t0, y, bias, n, t, n);
    }
  }
}

// Whether the current device takes programmatic dependent launches (compute capability 9.0 and later).
bool launches_early() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
}

// Routed: t is the number of picks (grid.y), w and bias unused (route names the weights). Heads: matmul_heads, `rows`
// and `heads` given (grid.z); otherwise they are not read.
template <class F, int NT, int R, int U = 1, int MinBlocks = 1, bool Routed = false, bool Heads = false>
cudaError_t matmul_q8_as(cudaStream_t s, const void* w, std::size_t rb, const Q8Scratch& q8, float* y,
                         const float* bias, std::int64_t k, std::int64_t n, std::int64_t t, Route<Routed> route = {},
                         const MatmulRows* rows = nullptr, std::int64_t heads = 1) {
  const std::int64_t rows_per_block = static_cast<std::int64_t>(kWarps) * R;
  const dim3 grid(static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>((t + NT - 1) / NT), static_cast<unsigned>(heads));
  // On Hopper and later the matmul is launched while X's quantization still runs (programmatic dependent launch):
  // its blocks are placed early and wait in griddepcontrol.wait, which hides the launch gap between the two kernels.
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kMatmulThreads);
  config.stream = s;
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  if (launches_early()) {
    config.attrs = &early;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, matmul_q8_kernel<F, NT, R, U, MinBlocks, Routed, Heads>,
                            static_cast<const std::uint8_t*>(w), rb, static_cast<const std::int8_t*>(q8.q),
                            static_cast<const float*>(q8.d), static_cast<const std::int32_t*>(q8.s), y, bias,
                            static_cast<int>(k), static_cast<int>(n), static_cast<int>(t), route,
                            rows != nullptr ? *rows : MatmulRows::dense(k, n));
}

template <class F>
cudaError_t quantize_q8(cudaStream_t s, const float* x, const Q8Scratch& q8, std::int64_t k, std::int64_t t,
                        const MatmulRows* rows = nullptr, std::int64_t heads = 1) {
  // Tokens on grid.x: a batch may hold more than grid.y's 65535 (units of 256 per token never do).
  const auto units = static_cast<unsigned>((k + q8dot::kUnit - 1) / q8dot::kUnit);
  const MatmulRows r = rows != nullptr ? *rows : MatmulRows::dense(k, 0);
  quantize_q8_kernel<F::kXBlock><<<dim3(static_cast<unsigned>(t), units, static_cast<unsigned>(heads)), 32, 0, s>>>(
      x, q8.q, q8.d, q8.s, static_cast<int>(k), r.x_token, r.x_head);
  return cudaGetLastError();
}

// The decode (T = 1) tile of each format: rows per warp, units per lane step, minimum blocks per multiprocessor (a
// register cap). Picked from colibri_bench_cuda_gemv's variant table on an H200 (two runs, K = 4096 and 2880,
// 2026-12-04): q4_k walks two units per step (64-66% of bandwidth against 61-63% for one), q4_0 and mxfp4 take two
// rows per warp, q5_k, q6_k and q8_0 gain a little from more resident warps (at most 40 registers); q2_k and q3_k
// were not in the table. None changes an output element's bits.
template <int Rows, int Unroll, int MinBlocks>
struct Tile {
  static constexpr int kRows = Rows, kUnroll = Unroll, kMinBlocks = MinBlocks;
};
template <class F>
struct DecodeTile : Tile<1, 1, 1> {};
template <>
struct DecodeTile<q8dot::Q4_K> : Tile<1, 2, 1> {};
template <>
struct DecodeTile<q8dot::Q5_K> : Tile<1, 1, 6> {};
template <>
struct DecodeTile<q8dot::Q6_K> : Tile<1, 1, 6> {};
template <>
struct DecodeTile<q8dot::Q8_0> : Tile<1, 1, 6> {};
template <>
struct DecodeTile<q8dot::Q4_0> : Tile<2, 1, 1> {};
template <>
struct DecodeTile<q8dot::MXFP4> : Tile<2, 1, 1> {};

template <class F>
cudaError_t matmul_q8_for(cudaStream_t s, const void* w, std::size_t rb, const float* x, const Q8Scratch& q8, float* y,
                          const float* bias, std::int64_t k, std::int64_t n, std::int64_t t, bool quantize,
                          const MatmulRows* rows = nullptr, std::int64_t heads = 1) {
  if (quantize) {
    if (cudaError_t e = quantize_q8<F>(s, x, q8, k, t, rows, heads); e != cudaSuccess) return e;
  }
  // Few rows per warp for decode: more warps in flight beat sharing X (q4_k: 57% of bandwidth on an H200 against 47%
  // for four rows); the row count never changes an output element's order.
  using D = DecodeTile<F>;
  if (rows != nullptr) {  // matmul_heads: the decode tile and the widest, as matmul_heads_for
    constexpr Route<false> plain{};
    if (t == 1) {
      return matmul_q8_as<F, 1, D::kRows, D::kUnroll, D::kMinBlocks, false, true>(s, w, rb, q8, y, bias, k, n, t, plain,
                                                                                  rows, heads);
    }
    return matmul_q8_as<F, 8, 2, 1, 1, false, true>(s, w, rb, q8, y, bias, k, n, t, plain, rows, heads);
  }
  if (t == 1) return matmul_q8_as<F, 1, D::kRows, D::kUnroll, D::kMinBlocks>(s, w, rb, q8, y, bias, k, n, t);
  if (t == 2) return matmul_q8_as<F, 2, 4>(s, w, rb, q8, y, bias, k, n, t);
  if (t <= 4) return matmul_q8_as<F, 4, 2>(s, w, rb, q8, y, bias, k, n, t);
  return matmul_q8_as<F, 8, 2>(s, w, rb, q8, y, bias, k, n, t);
}

cudaError_t matmul_q8(cudaStream_t s, std::uint32_t type, const void* w, std::size_t rb, const float* x,
                      const Q8Scratch& q8, float* y, const float* bias, std::int64_t k, std::int64_t n, std::int64_t t,
                      bool quantize, const MatmulRows* rows = nullptr, std::int64_t heads = 1) {
  switch (type) {
    case kQ4_K: return matmul_q8_for<q8dot::Q4_K>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kQ5_K: return matmul_q8_for<q8dot::Q5_K>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kQ6_K: return matmul_q8_for<q8dot::Q6_K>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kQ2_K: return matmul_q8_for<q8dot::Q2_K>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kQ3_K: return matmul_q8_for<q8dot::Q3_K>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kQ8_0: return matmul_q8_for<q8dot::Q8_0>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kQ4_0: return matmul_q8_for<q8dot::Q4_0>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    case kMXFP4: return matmul_q8_for<q8dot::MXFP4>(s, w, rb, x, q8, y, bias, k, n, t, quantize, rows, heads);
    default: return cudaErrorInvalidValue;
  }
}

// Calls fn(Format<F>{}) for the 8-bit-activation format F of `type` (cudaErrorInvalidValue for other types).
template <class F>
struct Format {
  using type = F;
};
template <class Fn>
cudaError_t with_q8_format(std::uint32_t type, Fn&& fn) {
  switch (type) {
    case kQ4_K: return fn(Format<q8dot::Q4_K>{});
    case kQ5_K: return fn(Format<q8dot::Q5_K>{});
    case kQ6_K: return fn(Format<q8dot::Q6_K>{});
    case kQ2_K: return fn(Format<q8dot::Q2_K>{});
    case kQ3_K: return fn(Format<q8dot::Q3_K>{});
    case kQ8_0: return fn(Format<q8dot::Q8_0>{});
    case kQ4_0: return fn(Format<q8dot::Q4_0>{});
    case kMXFP4: return fn(Format<q8dot::MXFP4>{});
    default: return cudaErrorInvalidValue;
  }
}

// expert_ffn_routed's matmul of one projection for all picks at once: the decode tile matmul_q8_for takes at t = 1
// (NT = 1, DecodeTile's rows, unroll and register cap), one block row per pick.
template <class F>
cudaError_t matmul_q8_routed_for(cudaStream_t s, const void* const* table, const std::int32_t* ids, int experts,
                                 bool x_per_pick, std::size_t rb, const Q8Scratch& q8, float* y, std::int64_t k,
                                 std::int64_t n, std::int64_t picks) {
  using D = DecodeTile<F>;
  return matmul_q8_as<F, 1, D::kRows, D::kUnroll, D::kMinBlocks, true>(
      s, nullptr, rb, q8, y, nullptr, k, n, picks, Route<true>{table, ids, experts, x_per_pick ? 1 : 0});
}

// The candidate pairs layout of a format (64 weights a lane), where one exists.
template <class F>
struct PairsOf {
  using type = void;
};
template <>
struct PairsOf<q8dot::Q4_K> {
  using type = q8dot::Q4_K_Pairs;
};
template <>
struct PairsOf<q8dot::Q5_K> {
  using type = q8dot::Q5_K_Pairs;
};

template <class F>
cudaError_t matmul_q8_variant_for(cudaStream_t s, const void* w, std::size_t rb, const float* x, const Q8Scratch& q8,
                                  float* y, std::int64_t k, std::int64_t n, int variant, bool quantize) {
  if (quantize) {
    if (cudaError_t e = quantize_q8<F>(s, x, q8, k, 1); e != cudaSuccess) return e;
  }
  using D = DecodeTile<F>;
  switch (variant) {  // matmul_q8_variant_name
    case 0: return matmul_q8_as<F, 1, D::kRows, D::kUnroll, D::kMinBlocks>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 1: return matmul_q8_as<F, 1, 1, 1>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 2: return matmul_q8_as<F, 1, 1, 2>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 3: return matmul_q8_as<F, 1, 1, 4>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 4: return matmul_q8_as<F, 1, 2, 1>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 5: return matmul_q8_as<F, 1, 2, 2>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 6: return matmul_q8_as<F, 1, 1, 1, 6>(s, w, rb, q8, y, nullptr, k, n, 1);
    case 7: return matmul_q8_as<F, 1, 1, 2, 4>(s, w, rb, q8, y, nullptr, k, n, 1);
    default: break;
  }
  if (variant >= kDecodeVariantCount) return cudaErrorInvalidValue;
  if constexpr (!std::is_void_v<typename PairsOf<F>::type>) {
    using P = typename PairsOf<F>::type;
    switch (variant) {
      case 8: return matmul_q8_as<P, 1, 1, 1>(s, w, rb, q8, y, nullptr, k, n, 1);
      case 9: return matmul_q8_as<P, 1, 1, 2>(s, w, rb, q8, y, nullptr, k, n, 1);
      case 10: return matmul_q8_as<P, 1, 2, 1>(s, w, rb, q8, y, nullptr, k, n, 1);
      default: return matmul_q8_as<P, 1, 1, 2, 4>(s, w, rb, q8, y, nullptr, k, n, 1);
    }
  }
  return cudaErrorNotSupported;  // the pairs layout is q4_k's and q5_k's alone
}

// The whole op (X quantized, then the matmul) in a candidate pairs layout (q8dot::Q4_K_Pairs, Q5_K_Pairs), in a token
// tile by t as matmul_q8_for picks them; its X runs are twice as long, so the wide tiles take one row per warp.
template <class P>
cudaError_t matmul_q8_pairs(cudaStream_t s, const void* w, std::size_t rb, const float* x, const Q8Scratch& q8,
                            float* y, std::int64_t k, std::int64_t n, std::int64_t t) {
  if (cudaError_t e = quantize_q8<P>(s, x, q8, k, t); e != cudaSuccess) return e;
  if (t == 1) return matmul_q8_as<P, 1, 1, 2>(s, w, rb, q8, y, nullptr, k, n, t);
  if (t == 2) return matmul_q8_as<P, 2, 2>(s, w, rb, q8, y, nullptr, k, n, t);
  if (t <= 4) return matmul_q8_as<P, 4, 1>(s, w, rb, q8, y, nullptr, k, n, t);
  return matmul_q8_as<P, 8, 1>(s, w, rb, q8, y, nullptr, k, n, t);
}

// The block of 8-bit activations a matmul of format F with rows of k elements quantizes X into, 0 where it keeps X
// in f32 (q8dot::takes_k).
template <class F>
int q8_block_of(std::int64_t k) {
  return q8dot::takes_k<F>(k) ? F::kXBlock : 0;
}

// Whether a matmul of `type` weights with rows of k elements takes 8-bit activations.
bool takes_q8(std::uint32_t type, std::int64_t k) {
  return q8_block(type, k) != 0;
}

// ---------------------------------------------------------------- store_rows
// New KV rows encoded where the cache lives, as colibri::quant::quantize_row does (ggml's reference), byte for byte:
// f16 rounds to nearest even; q8_0 per 32: amax (a NaN wins, as ggml's MAX), d = amax / 127 as f16,
// q = round(x * (1 / d)) half away from zero, cast like x86 (NaN or out of range: INT_MIN, whose low byte is 0).

// colibri::quant::fp32_to_fp16's bits: round to nearest even, and a NaN becomes sign | 0x7E00 (the device's
// conversion gives 0x7FFF for every NaN).
__device__ __forceinline__ std::uint16_t fp16_bits_like_host(float f) {
  if (isnan(f)) return static_cast<std::uint16_t>((__float_as_uint(f) >> 16 & 0x8000u) | 0x7E00u);
  return __half_as_ushort(__float2half_rn(f));
}

__global__ void store_rows_f16_kernel(const float* __restrict__ x, std::uint16_t* __restrict__ y, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    y[i] = fp16_bits_like_host(x[i]);
  }
}

__device__ __forceinline__ int truncate_like_x86(float f) {
  if (!(f > -2147483904.0f && f < 2147483648.0f)) return static_cast<int>(0x80000000u);
  return static_cast<int>(f);
}

// One thread per 34-byte block (2-byte aligned: written as 17 halfwords).
__global__ void store_rows_q8_0_kernel(const float* __restrict__ x, std::uint16_t* __restrict__ y, long long blocks) {
  for (long long b = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = fabsf(xb[j]);
      amax = amax > v ? amax : v;
    }
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    std::uint16_t* out = y + b * 17;
    out[0] = fp16_bits_like_host(d);
    for (int j = 0; j < 32; j += 2) {
      const auto q0 = static_cast<std::uint8_t>(truncate_like_x86(roundf(__fmul_rn(xb[j], id))));
      const auto q1 = static_cast<std::uint8_t>(truncate_like_x86(roundf(__fmul_rn(xb[j + 1], id))));
      out[1 + j / 2] = static_cast<std::uint16_t>(q0 | (q1 << 8));
    }
  }
}

// ---------------------------------------------------------------- embedding

template <class F>
__global__ void embedding_kernel(const std::uint8_t* __restrict__ table, std::size_t row_bytes,
                                 const std::int32_t* __restrict__ ids, float* __restrict__ y, int d, int vocab,
                                 std::int32_t* status) {
  const int i = blockIdx.y;
  const int id = ids[i];
  if (id < 0 || id >= vocab) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && atomicCAS(status, 0, i + 1) == 0) status[1] = id;
    return;
  }
  const int chunks = (d + kChunk - 1) / kChunk;
  const std::uint8_t* row = table + static_cast<std::size_t>(id) * row_bytes;
  float* out = y + static_cast<std::size_t>(i) * d;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
    const int valid = min(kChunk, d - c * kChunk);
    float wv[kChunk];
    F::chunk(row, c, valid, wv);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (j < valid) out[c * kChunk + j] = wv[j];
    }
  }
}

template <class F>
cudaError_t embedding_for(cudaStream_t s, const void* table, std::size_t rb, const std::int32_t* ids, float* y,
                          std::int64_t d, std::int64_t vocab, std::int64_t t, std::int32_t* status) {
  const std::int64_t chunks = (d + kChunk - 1) / kChunk;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((chunks + 63) / 64, 1024)), static_cast<unsigned>(t));
  embedding_kernel<F><<<grid, 64, 0, s>>>(static_cast<const std::uint8_t*>(table), rb, ids, y, static_cast<int>(d),
                                          static_cast<int>(vocab), status);
  return cudaGetLastError();
}

template <template <class> class Launch, typename... Args>
cudaError_t by_type(std::uint32_t type, Args... args) {
  switch (type) {
    case kF32: return Launch<F32>::run(args...);
    case kF16: return Launch<F16>::run(args...);
    case kBF16: return Launch<BF16>::run(args...);
    case kQ8_0: return Launch<Q8_0>::run(args...);
    case kQ4_0: return Launch<Q4_0>::run(args...);
    case kQ2_K: return Launch<Q2_K>::run(args...);
    case kQ3_K: return Launch<Q3_K>::run(args...);
    case kQ4_K: return Launch<Q4_K>::run(args...);
    case kQ5_K: return Launch<Q5_K>::run(args...);
    case kQ6_K: return Launch<Q6_K>::run(args...);
    case kMXFP4: return Launch<MXFP4>::run(args...);  // matmul only: check_op_call refuses it for embedding
    default: return cudaErrorInvalidValue;
  }
}
template <class F>
struct MatmulLaunch {
  template <typename... Args>
  static cudaError_t run(Args... args) {
    return matmul_for<F>(args...);
  }
};
template <class F>
struct MatmulHeadsLaunch {
  template <typename... Args>
  static cudaError_t run(Args... args) {
    return matmul_heads_for<F>(args...);
  }
};
template <class F>
struct EmbeddingLaunch {
  template <typename... Args>
  static cudaError_t run(Args... args) {
    return embedding_for<F>(args...);
  }
};

// ---------------------------------------------------------------- attention
// One block per (head, query). Keys in blocks of 64 aligned to key 0 (so the blocks a query sees
// depend only on its own position and window), scored by warps (lanes split head_dim, fixed
// shuffle tree), then an online softmax whose sums run over the block's keys in order.
// attention_sinks (gpt-oss): head h's sink is one more key of score sinks[h] (not scaled) and value zero, so the
// online softmax starts from it (m = sink, l = e^0 = 1, acc = 0) instead of from nothing (m = -inf, l = 0), as
// on the CPU backend; every key block then runs as without sinks.

constexpr int kAttnThreads = 128;
constexpr int kKeyBlock = 64;
constexpr int kMaxHeadDim = 576;  // DeepSeek's latent attention: 512 + 64
constexpr int kDimsPerThread = (kMaxHeadDim + kAttnThreads - 1) / kAttnThreads;

struct KvF32 {
  __device__ static float at(const std::uint8_t* row, int e) { return reinterpret_cast<const float*>(row)[e]; }
};
struct KvF16 {
  __device__ static float at(const std::uint8_t* row, int e) { return f16_at(row + 2 * e); }
};
struct KvQ8_0 {
  __device__ static float at(const std::uint8_t* row, int e) {
    const std::uint8_t* b = row + (e / 32) * 34;
    return __fmul_rn(static_cast<float>(reinterpret_cast<const std::int8_t*>(b + 2)[e % 32]), f16_at(b));
  }
};

template <class KV>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttentionArgs a) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float score[kKeyBlock];
  __shared__ float prob[kKeyBlock];
  const int h = blockIdx.x, i = blockIdx.y;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int hd = a.head_dim;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int p = a.position + i;
  const int lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
  const float* q = a.q + (static_cast<std::size_t>(i) * a.n_heads + h) * hd;
  for (int e = tid; e < hd; e += kAttnThreads) qs[e] = q[e];
  const auto* kbase = static_cast<const std::uint8_t*>(a.k);
  const auto* vbase = static_cast<const std::uint8_t*>(a.v);
  auto row_of = [&](const std::uint8_t* base, int j) {
    return base + (static_cast<std::size_t>(j) * a.n_kv_heads + kvh) * a.kv_row_bytes;
  };
  float m = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
  float l = m == -INFINITY ? 0.0f : 1.0f;  // a sink of -inf is no key
  float acc[kDimsPerThread] = {};
  __syncthreads();
  for (int kb = lo / kKeyBlock * kKeyBlock; kb <= p; kb += kKeyBlock) {
    constexpr int kPerWarp = kKeyBlock / (kAttnThreads / 32);
    for (int kk = 0; kk < kPerWarp; ++kk) {
      const int slot = warp * kPerWarp + kk, j = kb + slot;
      float s = -INFINITY;
      if (j >= lo && j <= p) {
        const std::uint8_t* kr = row_of(kbase, j);
        float dot = 0.0f;
        for (int e = lane; e < hd; e += 32) dot = fmaf(qs[e], KV::at(kr, e), dot);
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) dot = __fadd_rn(dot, __shfl_xor_sync(0xFFFFFFFFu, dot, off));
        s = __fmul_rn(dot, a.scale);
      }
      if (lane == 0) score[slot] = s;
    }
    __syncthreads();
    float mb = m;
    for (int j = 0; j < kKeyBlock; ++j) mb = fmaxf(mb, score[j]);
    if (tid < kKeyBlock) prob[tid] = expf(score[tid] - mb);  // exp(-inf) = 0 for keys outside the range
    __syncthreads();
    const float corr = expf(m - mb);  // 0 on the first block (m = -inf) unless a sink came first
    float sum = 0.0f;
    for (int j = 0; j < kKeyBlock; ++j) sum = __fadd_rn(sum, prob[j]);
    l = fmaf(l, corr, sum);
#pragma unroll
    for (int r = 0; r < kDimsPerThread; ++r) {
      const int e = tid + r * kAttnThreads;
      if (e >= hd) break;
      float o = __fmul_rn(acc[r], corr);
      const int jmax = min(kKeyBlock, p + 1 - kb);
      for (int j = max(0, lo - kb); j < jmax; ++j) o = fmaf(prob[j], KV::at(row_of(vbase, kb + j), e), o);
      acc[r] = o;
    }
    m = mb;
    __syncthreads();  // score / prob are rewritten by the next block
  }
  float* o = a.o + (static_cast<std::size_t>(i) * a.n_heads + h) * hd;
#pragma unroll
  for (int r = 0; r < kDimsPerThread; ++r) {
    const int e = tid + r * kAttnThreads;
    if (e < hd) o[e] = __fdiv_rn(acc[r], l);
  }
}

// ---------------------------------------------------------------- rms_norm, rope, elementwise

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* __restrict__ w, float* y, int d, float eps) {  // y may be x
  __shared__ double part[kNormThreads];
  const float* xr = x + static_cast<std::size_t>(blockIdx.x) * d;
  float* yr = y + static_cast<std::size_t>(blockIdx.x) * d;
  double ss = 0.0;
  for (int j = threadIdx.x; j < d; j += kNormThreads) {
    const double v = xr[j];
    ss = fma(v, v, ss);
  }
  part[threadIdx.x] = ss;
  __syncthreads();
  for (int stride = kNormThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(part[0] / d + static_cast<double>(eps)));
  for (int j = threadIdx.x; j < d; j += kNormThreads) yr[j] = __fmul_rn(__fmul_rn(xr[j], inv), w[j]);
}

// One thread per (pair or pass-through element); in place is safe (each pair is read, then written
// by the same thread).
__global__ void rope_kernel(const float* x, const std::int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, float* y, long long heads_total, int head_dim,
                            int n_heads, int rope_dims, int interleaved, float scale) {
  const int half = rope_dims / 2;
  const int per_head = half + (head_dim - rope_dims);
  const long long n = heads_total * per_head;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long head = idx / per_head;
    const int j = static_cast<int>(idx % per_head);
    const std::size_t base = static_cast<std::size_t>(head) * head_dim;
    if (j >= half) {  // dims past rope_dims pass through
      const int e = rope_dims + (j - half);
      y[base + e] = x[base + e];
      continue;
    }
    const int token = static_cast<int>(head / n_heads);
    const float theta = __fmul_rn(static_cast<float>(positions[token]), inv_freq[j]);
    double sn, cs;
    sincos(static_cast<double>(theta), &sn, &cs);
    const double c = cs * scale, s = sn * scale;
    const int ia = interleaved ? 2 * j : j;
    const int ib = interleaved ? ia + 1 : ia + half;
    const double x0 = x[base + ia], x1 = x[base + ib];
    y[base + ia] = static_cast<float>(x0 * c - x1 * s);
    y[base + ib] = static_cast<float>(x0 * s + x1 * c);
  }
}

__device__ __forceinline__ float sigmoidf(float v) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
}

__global__ void eltwise_kernel(int mode, const float* a, const float* b, float* y, long long n, long long d) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    switch (mode) {
      case 0: y[i] = __fadd_rn(a[i], b[i]); break;
      case 1: y[i] = __fmul_rn(__fmul_rn(a[i], sigmoidf(a[i])), b[i]); break;
      case 2: y[i] = sigmoidf(a[i]); break;
      case 3: y[i] = fmaf(b[i / d], a[i], y[i]); break;
      default: y[i] = __fmul_rn(a[i], b[i]); break;
    }
  }
}

// ---------------------------------------------------------------- linear attention (cuda_linear_attention.cuh)
__global__ void causal_conv_kernel(linear::ConvArgs a) {
  for (long long ch = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; ch < a.c;
       ch += static_cast<long long>(gridDim.x) * blockDim.x) {
    linear::conv_channel(a, static_cast<int>(ch));
  }
}

// Block (column tile, value head): shared memory holds the tile's state, dk rows of kDeltaColumns, then qn and kn.
__global__ void __launch_bounds__(linear::kDeltaColumns) gated_delta_rule_kernel(linear::DeltaArgs a) {
  extern __shared__ float smem[];
  const int h = static_cast<int>(blockIdx.y), lane = static_cast<int>(threadIdx.x);
  const int j = static_cast<int>(blockIdx.x) * linear::kDeltaColumns + lane;
  const bool live = j < a.dv;
  float* S = smem + lane;
  float* qn = smem + a.dk * linear::kDeltaColumns;
  float* kn = qn + a.dk;
  if (live) {
    for (int i = 0; i < a.dk; ++i) S[i * linear::kDeltaColumns] = a.state[linear::delta_state_at(a, h, i, j)];
  }
  for (int t = 0; t < a.t; ++t) {
    linear::delta_keys(a, h, t, lane, linear::kDeltaColumns, qn, kn);
    __syncthreads();
    if (live) linear::delta_column(a, h, t, j, S, linear::kDeltaColumns, qn, kn);
    __syncthreads();  // qn and kn are the next token's
  }
  if (live) {
    for (int i = 0; i < a.dk; ++i) a.state[linear::delta_state_at(a, h, i, j)] = S[i * linear::kDeltaColumns];
  }
}

// gpt-oss's activation, with the CPU backend's operations in its order: g = min(gate, limit) and
// u = clamp(up, -limit, limit) as std::min / std::clamp take them (a NaN gate stays NaN), then
// g / (1 + e^(-alpha g)) * (u + 1), no contraction.
__global__ void clamped_glu_kernel(const float* g, const float* __restrict__ u, float* y, long long n, float alpha,
                                   float limit) {  // y may be g
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float gv = g[i], uv = u[i];
    const float gi = limit < gv ? limit : gv;
    const float ui = uv < -limit ? -limit : (limit < uv ? limit : uv);
    const float e = expf(-__fmul_rn(alpha, gi));
    y[i] = __fmul_rn(__fdiv_rn(gi, __fadd_rn(1.0f, e)), __fadd_rn(ui, 1.0f));
  }
}

// ---------------------------------------------------------------- topk routing
// One thread per token. Picks in (score desc, id asc) order without storing the chosen ids: the
// next pick is the best candidate ranked after the previous one. Biased (topk_routing_biased): ranked by
// score + bias[j] instead, each weight still the score, / (sum + 1e-20) with renormalize, then * scale.
// Grouped (topk_routing_grouped, also Biased): only the experts of the groups_used best of the groups (e / groups
// consecutive experts each) compete; a group scores the sum of its two highest score + bias (its highest alone with
// group_max), ties to the lower group.

__device__ float route_score(const float* x, int j, int mode, float mx, float sum) {
  if (mode == 1) return __fdiv_rn(expf(x[j] - mx), sum);
  if (mode == 2) return sigmoidf(x[j]);
  return x[j];
}

// Group g's score, from the same __fadd_rn keys the picks rank by: the two highest added (the higher first), or the
// highest alone. Starts from the group's first two (groups of one need group_max, which check_op_call enforces).
__device__ float group_score(const float* x, const float* bias, int g, int per, int mode, float mx, float sum,
                             int group_max) {
  const int first = g * per;
  float hi = __fadd_rn(route_score(x, first, mode, mx, sum), bias[first]);
  if (per == 1) return hi;
  float lo = __fadd_rn(route_score(x, first + 1, mode, mx, sum), bias[first + 1]);
  if (lo > hi) {
    const float swap = hi;
    hi = lo;
    lo = swap;
  }
  for (int j = first + 2; j < first + per; ++j) {
    const float key = __fadd_rn(route_score(x, j, mode, mx, sum), bias[j]);
    if (key > hi) {
      lo = hi;
      hi = key;
    } else if (key > lo) {
      lo = key;
    }
  }
  return group_max ? hi : __fadd_rn(hi, lo);
}

template <bool Biased, bool Grouped>
__global__ void topk_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                            std::int32_t* __restrict__ ids, float* __restrict__ weights, int e, int t, int k, int mode,
                            int renormalize, float scale, int groups, int groups_used, int group_max,
                            std::int32_t* status) {
  static_assert(Biased || !Grouped, "grouped routing is biased routing within groups");
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= t) return;
  const float* x = logits + static_cast<std::size_t>(i) * e;
  float mx = x[0], sum = 0.0f;
  for (int j = 0; j < e; ++j) {
    if (isnan(x[j])) {
      // run() reports it where it waits; where it does not (outputs in device memory), the reader sees the mark.
      if (atomicCAS(status, 0, i + 1) == 0) status[1] = j;
      for (int pick = 0; pick < k; ++pick) {
        ids[static_cast<std::size_t>(i) * k + pick] = -1;
        weights[static_cast<std::size_t>(i) * k + pick] = __int_as_float(0x7FC00000);
      }
      return;
    }
    mx = fmaxf(mx, x[j]);
  }
  if (mode == 1) {
    for (int j = 0; j < e; ++j) sum = __fadd_rn(sum, expf(x[j] - mx));
  }
  // Grouped: the last of the groups_used best groups in (group score desc, group asc) order, found as the picks are;
  // a group competes iff it ranks at or before it. Every group competes when all are used.
  int per = e, last_g = 0;
  float last_gs = 0.0f;
  bool every_group = true;
  if constexpr (Grouped) {
    per = e / groups;
    every_group = groups_used >= groups;
    for (int gp = 0; !every_group && gp < groups_used; ++gp) {
      int best_g = -1;
      float best_gs = 0.0f;
      for (int g = 0; g < groups; ++g) {
        const float gs = group_score(x, bias, g, per, mode, mx, sum, group_max);
        const bool after_prev = gp == 0 || gs < last_gs || (gs == last_gs && g > last_g);
        if (after_prev && (best_g < 0 || gs > best_gs)) best_g = g, best_gs = gs;
      }
      last_gs = best_gs;
      last_g = best_g;
    }
  }
  float prev = INFINITY, chosen_sum = 0.0f;
  int prev_id = -1;
  std::int32_t* out_ids = ids + static_cast<std::size_t>(i) * k;
  float* out_w = weights + static_cast<std::size_t>(i) * k;
  for (int pick = 0; pick < k; ++pick) {
    int best = -1;
    float best_key = 0.0f, best_s = 0.0f;
    for (int j = 0; j < e; ++j) {
      if constexpr (Grouped) {
        if (!every_group && j % per == 0) {
          const int g = j / per;
          const float gs = group_score(x, bias, g, per, mode, mx, sum, group_max);
          if (!(gs > last_gs || (gs == last_gs && g <= last_g))) {
            j += per - 1;  // a losing group: none of its experts is picked
            continue;
          }
        }
      }
      const float s = route_score(x, j, mode, mx, sum);
      float key = s;  // what ranks the experts: the score, or score + bias
      if constexpr (Biased) key = __fadd_rn(s, bias[j]);
      const bool after_prev = key < prev || (key == prev && j > prev_id);
      if (after_prev && (best < 0 || key > best_key)) best = j, best_key = key, best_s = s;
    }
    out_ids[pick] = best;
    out_w[pick] = best_s;
    chosen_sum = __fadd_rn(chosen_sum, best_s);
    prev = best_key;
    prev_id = best;
  }
  if (renormalize) {
    if constexpr (Biased) chosen_sum = __fadd_rn(chosen_sum, 1e-20f);  // HF: w / (sum + 1e-20)
    for (int pick = 0; pick < k; ++pick) out_w[pick] = __fdiv_rn(out_w[pick], chosen_sum);
  }
  if constexpr (Biased) {
    for (int pick = 0; pick < k; ++pick) out_w[pick] = __fmul_rn(out_w[pick], scale);
  }
}

// ---------------------------------------------------------------- expert_ffn_routed's combine
// The engine's combine of one token's experts: out = add(zeros, zeros) = +0, then scale_add of each expert in
// ascending id, y = fmaf(w, x, y) as eltwise_kernel does; here acc = +0 then acc = fmaf(w_j, y_j[i], acc) over the
// picks sorted by id, so the same operations in the same order. A pick outside 0..experts-1 (topk_routing's NaN mark)
// makes the whole column NaN.
__global__ void routed_combine_kernel(const float* __restrict__ ys, const std::int32_t* __restrict__ ids,
                                      const float* __restrict__ weights, float* __restrict__ y, long long d, int picks,
                                      int experts) {
  __shared__ int order[kMaxRoutedPicks];
  __shared__ int marked;
  if (threadIdx.x == 0) marked = 0;
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < picks) {
    const int j = static_cast<int>(threadIdx.x), id = ids[j];
    // The pick's place in ascending id; equal ids (which the SDK rules out) by pick, so the places stay distinct.
    int rank = 0;
    for (int i = 0; i < picks; ++i) {
      const int other = ids[i];
      rank += (other < id || (other == id && i < j)) ? 1 : 0;
    }
    order[rank] = j;
    if (id < 0 || id >= experts) atomicOr(&marked, 1);
  }
  __syncthreads();
  const bool nan = marked != 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < d;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    if (nan) {
      acc = __int_as_float(0x7FC00000);
    } else {
      for (int s = 0; s < picks; ++s) {
        const int j = order[s];
        acc = fmaf(weights[j], ys[static_cast<std::size_t>(j) * d + i], acc);
      }
    }
    y[i] = acc;
  }
}

unsigned grid_for(long long items, int threads) {
  const long long g = (items + threads - 1) / threads;
  return static_cast<unsigned>(g < 1 ? 1 : (g > 65535 ? 65535 : g));
}

// ---------------------------------------------------------------- row copies (concat_rows)
// Rows of `width` 4-byte words indexed (o, i), o < outer and i < inner, at o * so + i * si in src and o * dso + i * dsi
// in dst: words, not floats, so the bits are copied as they are.
__global__ void copy_rows_kernel(const std::uint32_t* __restrict__ src, std::uint32_t* __restrict__ dst,
                                 long long width, long long inner, long long total, long long so, long long si,
                                 long long dso, long long dsi) {
  for (long long at = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; at < total;
       at += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = at / width, e = at % width, o = row / inner, i = row % inner;
    dst[o * dso + i * dsi + e] = src[o * so + i * si + e];
  }
}

}  // namespace

namespace {
std::size_t q8_values_bytes(std::int64_t k, std::int64_t t) {
  return (static_cast<std::size_t>(k * t) + 255) / 256 * 256;
}
}  // namespace

// Scales for the smallest activation block (32), which every format's layout fits in.
std::size_t q8_scales_bytes(std::int64_t k, std::int64_t t) {
  return (static_cast<std::size_t>(k / 32 * t) * sizeof(float) + 255) / 256 * 256;
}

std::size_t q8_scratch_bytes(std::int64_t k, std::int64_t t) noexcept {
  if (k <= 0 || k % 32 != 0) return 0;  // no format takes 8-bit activations for such rows (q8dot::takes_k)
  return q8_values_bytes(k, t) + q8_scales_bytes(k, t) + static_cast<std::size_t>(k / 16 * t) * sizeof(std::int32_t);
}

Q8Scratch q8_scratch_at(void* base, std::int64_t k, std::int64_t t) noexcept {
  auto* b = static_cast<std::byte*>(base);
  auto* scales = b + q8_values_bytes(k, t);
  return {reinterpret_cast<std::int8_t*>(b), reinterpret_cast<float*>(scales),
          reinterpret_cast<std::int32_t*>(scales + q8_scales_bytes(k, t))};
}

cudaError_t launch_matmul(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                          const float* x, float* y, const float* bias, std::int64_t k, std::int64_t n, std::int64_t t,
                          const Q8Scratch* q8, bool x_in_q8) noexcept {
  if (q8 != nullptr && takes_q8(wtype, k)) {
    return matmul_q8(stream, wtype, w, row_bytes, x, *q8, y, bias, k, n, t, !x_in_q8);
  }
  return by_type<MatmulLaunch>(wtype, stream, w, row_bytes, x, y, bias, k, n, t);
}

cudaError_t launch_matmul_heads(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                                const float* x, float* y, std::int64_t k, std::int64_t n, std::int64_t heads,
                                std::int64_t kx, std::int64_t t, const Q8Scratch* q8) noexcept {
  if (heads < 1 || heads > 65535 || heads * kx > 0x7FFFFFFF || heads * n > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const MatmulRows rows{static_cast<int>(heads * kx), static_cast<int>(heads * n), static_cast<int>(kx),
                        static_cast<int>(n), static_cast<std::size_t>(n) * row_bytes};
  if (q8 != nullptr && takes_q8(wtype, k)) {
    return matmul_q8(stream, wtype, w, row_bytes, x, *q8, y, nullptr, k, n, t, true, &rows, heads);
  }
  return by_type<MatmulHeadsLaunch>(wtype, stream, w, row_bytes, x, y, k, n, t, rows, heads);
}

int q8_block(std::uint32_t wtype, std::int64_t k) noexcept {
  switch (wtype) {
    case kQ4_K: return q8_block_of<q8dot::Q4_K>(k);
    case kQ5_K: return q8_block_of<q8dot::Q5_K>(k);
    case kQ6_K: return q8_block_of<q8dot::Q6_K>(k);
    case kQ2_K: return q8_block_of<q8dot::Q2_K>(k);
    case kQ3_K: return q8_block_of<q8dot::Q3_K>(k);
    case kQ8_0: return q8_block_of<q8dot::Q8_0>(k);
    case kQ4_0: return q8_block_of<q8dot::Q4_0>(k);
    case kMXFP4: return q8_block_of<q8dot::MXFP4>(k);
    default: return 0;
  }
}

cudaError_t launch_matmul_q8_variant(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                                     const float* x, float* y, std::int64_t k, std::int64_t n, const Q8Scratch& q8,
                                     int variant, bool quantize) noexcept {
  if (!takes_q8(wtype, k) || variant < 0 || variant >= kDecodeVariantCount) return cudaErrorInvalidValue;
  switch (wtype) {
    case kQ4_K: return matmul_q8_variant_for<q8dot::Q4_K>(stream, w, row_bytes, x, q8, y, k, n, variant, quantize);
    case kQ5_K: return matmul_q8_variant_for<q8dot::Q5_K>(stream, w, row_bytes, x, q8, y, k, n, variant, quantize);
    case kQ6_K: return matmul_q8_variant_for<q8dot::Q6_K>(stream, w, row_bytes, x, q8, y, k, n, variant, quantize);
    case kQ8_0: return matmul_q8_variant_for<q8dot::Q8_0>(stream, w, row_bytes, x, q8, y, k, n, variant, quantize);
    case kQ4_0: return matmul_q8_variant_for<q8dot::Q4_0>(stream, w, row_bytes, x, q8, y, k, n, variant, quantize);
    case kMXFP4: return matmul_q8_variant_for<q8dot::MXFP4>(stream, w, row_bytes, x, q8, y, k, n, variant, quantize);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_matmul_q8_pairs(cudaStream_t stream, std::uint32_t wtype, const void* w, std::size_t row_bytes,
                                   const float* x, float* y, std::int64_t k, std::int64_t n, std::int64_t t,
                                   const Q8Scratch& q8) noexcept {
  if (!takes_q8(wtype, k) || t < 1) return cudaErrorInvalidValue;
  switch (wtype) {
    case kQ4_K: return matmul_q8_pairs<q8dot::Q4_K_Pairs>(stream, w, row_bytes, x, q8, y, k, n, t);
    case kQ5_K: return matmul_q8_pairs<q8dot::Q5_K_Pairs>(stream, w, row_bytes, x, q8, y, k, n, t);
    default: return cudaErrorNotSupported;
  }
}

const char* matmul_q8_variant_name(int variant) noexcept {
  static constexpr const char* kNames[kDecodeVariantCount] = {"default",   "1x1",       "1x2",       "1x4",
                                                              "2x1",       "2x2",       "1x1 min6",  "1x2 min4",
                                                              "pairs 1x1", "pairs 1x2", "pairs 2x1", "pairs 1x2 min4"};
  return variant >= 0 && variant < kDecodeVariantCount ? kNames[variant] : nullptr;
}

cudaError_t launch_quantize_q8(cudaStream_t stream, std::uint32_t wtype, const float* x, const Q8Scratch& q8,
                               std::int64_t k, std::int64_t t) noexcept {
  if (!takes_q8(wtype, k) || t < 1) return cudaErrorInvalidValue;
  return with_q8_format(wtype, [&](auto f) { return quantize_q8<typename decltype(f)::type>(stream, x, q8, k, t); });
}

cudaError_t launch_matmul_q8_routed(cudaStream_t stream, std::uint32_t wtype, const void* const* table,
                                    const std::int32_t* ids, std::int32_t experts, std::size_t row_bytes,
                                    const Q8Scratch& q8, bool x_per_pick, float* y, std::int64_t k, std::int64_t n,
                                    std::int64_t picks) noexcept {
  if (!takes_q8(wtype, k) || picks < 1 || picks > kMaxRoutedPicks) return cudaErrorInvalidValue;
  return with_q8_format(wtype, [&](auto f) {
    return matmul_q8_routed_for<typename decltype(f)::type>(stream, table, ids, experts, x_per_pick, row_bytes, q8, y,
                                                            k, n, picks);
  });
}

cudaError_t launch_routed_combine(cudaStream_t stream, const float* ys, const std::int32_t* ids, const float* weights,
                                  float* y, std::int64_t d, std::int64_t picks, std::int32_t experts) noexcept {
  if (picks < 1 || picks > kMaxRoutedPicks) return cudaErrorInvalidValue;
  routed_combine_kernel<<<grid_for(d, 256), 256, 0, stream>>>(ys, ids, weights, y, d, static_cast<int>(picks), experts);
  return cudaGetLastError();
}

cudaError_t launch_store_rows(cudaStream_t stream, std::uint32_t type, const float* x, void* y,
                              std::int64_t n) noexcept {
  switch (type) {
    case kF32:
      return cudaMemcpyAsync(y, x, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case kF16: store_rows_f16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, static_cast<std::uint16_t*>(y), n); break;
    case kQ8_0:
      store_rows_q8_0_kernel<<<grid_for(n / 32, 128), 128, 0, stream>>>(x, static_cast<std::uint16_t*>(y), n / 32);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_embedding(cudaStream_t stream, std::uint32_t wtype, const void* table, std::size_t row_bytes,
                             const std::int32_t* ids, float* y, std::int64_t d, std::int64_t vocab, std::int64_t t,
                             std::int32_t* status) noexcept {
  return by_type<EmbeddingLaunch>(wtype, stream, table, row_bytes, ids, y, d, vocab, t, status);
}

cudaError_t launch_copy_rows(cudaStream_t stream, const float* src, float* dst, std::int64_t width, std::int64_t outer,
                             std::int64_t inner, std::int64_t src_outer, std::int64_t src_inner, std::int64_t dst_outer,
                             std::int64_t dst_inner) noexcept {
  const long long total = static_cast<long long>(width) * outer * inner;
  if (total <= 0) return cudaSuccess;
  copy_rows_kernel<<<grid_for(total, 256), 256, 0, stream>>>(reinterpret_cast<const std::uint32_t*>(src),
                                                             reinterpret_cast<std::uint32_t*>(dst), width, inner, total,
                                                             src_outer, src_inner, dst_outer, dst_inner);
  return cudaGetLastError();
}

cudaError_t launch_attention(cudaStream_t stream, std::uint32_t kv_type, const AttentionArgs& a) noexcept {
  const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.t));
  switch (kv_type) {
    case kF32: attention_kernel<KvF32><<<grid, kAttnThreads, 0, stream>>>(a); break;
    case kF16: attention_kernel<KvF16><<<grid, kAttnThreads, 0, stream>>>(a); break;
    case kQ8_0: attention_kernel<KvQ8_0><<<grid, kAttnThreads, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(cudaStream_t stream, const float* x, const float* w, float* y, std::int64_t d,
                            std::int64_t rows, float eps) noexcept {
  rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(x, w, y, static_cast<int>(d), eps);
  return cudaGetLastError();
}

cudaError_t launch_rope(cudaStream_t stream, const float* x, const std::int32_t* positions, const float* inv_freq,
                        float* y, std::int64_t head_dim, std::int64_t n_heads, std::int64_t t, std::int32_t rope_dims,
                        bool interleaved, float scale) noexcept {
  const long long heads_total = n_heads * t;
  const long long items = heads_total * (rope_dims / 2 + (head_dim - rope_dims));
  rope_kernel<<<grid_for(items, 256), 256, 0, stream>>>(x, positions, inv_freq, y, heads_total,
                                                        static_cast<int>(head_dim), static_cast<int>(n_heads),
                                                        rope_dims, interleaved ? 1 : 0, scale);
  return cudaGetLastError();
}

cudaError_t launch_eltwise(cudaStream_t stream, Eltwise mode, const float* a, const float* b, float* y, std::int64_t n,
                           std::int64_t d) noexcept {
  eltwise_kernel<<<grid_for(n, 256), 256, 0, stream>>>(static_cast<int>(mode), a, b, y, n, d);
  return cudaGetLastError();
}

cudaError_t launch_causal_conv(cudaStream_t stream, const float* x, const float* w, float* y, float* state,
                               std::int64_t channels, std::int64_t t, std::int64_t k) noexcept {
  const linear::ConvArgs a{x, w, y, state, static_cast<int>(channels), static_cast<int>(t), static_cast<int>(k)};
  causal_conv_kernel<<<grid_for(channels, 64), 64, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_gated_delta_rule(cudaStream_t stream, const DeltaRuleArgs& d) noexcept {
  const linear::DeltaArgs a{d.q,
                            d.k,
                            d.v,
                            d.a,
                            d.b,
                            d.decay_rate,
                            d.dt_bias,
                            d.o,
                            d.state,
                            static_cast<int>(d.dk),
                            static_cast<int>(d.dv),
                            static_cast<int>(d.hk),
                            static_cast<int>(d.hv),
                            static_cast<int>(d.t),
                            d.tiled};
  const dim3 grid(static_cast<unsigned>((d.dv + linear::kDeltaColumns - 1) / linear::kDeltaColumns),
                  static_cast<unsigned>(d.hv));
  const std::size_t shared = static_cast<std::size_t>(d.dk) * (linear::kDeltaColumns + 2) * sizeof(float);
  gated_delta_rule_kernel<<<grid, linear::kDeltaColumns, shared, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_clamped_glu(cudaStream_t stream, const float* gate, const float* up, float* y, std::int64_t n,
                               float alpha, float limit) noexcept {
  clamped_glu_kernel<<<grid_for(n, 256), 256, 0, stream>>>(gate, up, y, n, alpha, limit);
  return cudaGetLastError();
}

cudaError_t launch_topk(cudaStream_t stream, const float* logits, std::int32_t* ids, float* weights, std::int64_t e,
                        std::int64_t t, std::int32_t k, int mode, bool renormalize, std::int32_t* status) noexcept {
  topk_kernel<false, false><<<static_cast<unsigned>((t + 63) / 64), 64, 0, stream>>>(
      logits, nullptr, ids, weights, static_cast<int>(e), static_cast<int>(t), k, mode, renormalize ? 1 : 0, 1.0f, 0, 0,
      0, status);
  return cudaGetLastError();
}

cudaError_t launch_topk_biased(cudaStream_t stream, const float* logits, const float* bias, std::int32_t* ids,
                               float* weights, std::int64_t e, std::int64_t t, std::int32_t k, int mode,
                               bool renormalize, float scale, std::int32_t* status) noexcept {
  topk_kernel<true, false><<<static_cast<unsigned>((t + 63) / 64), 64, 0, stream>>>(
      logits, bias, ids, weights, static_cast<int>(e), static_cast<int>(t), k, mode, renormalize ? 1 : 0, scale, 0, 0,
      0, status);
  return cudaGetLastError();
}

cudaError_t launch_topk_grouped(cudaStream_t stream, const float* logits, const float* bias, std::int32_t* ids,
                                float* weights, std::int64_t e, std::int64_t t, std::int32_t k, int mode,
                                bool renormalize, float scale, std::int32_t groups, std::int32_t groups_used,
                                bool group_max, std::int32_t* status) noexcept {
  topk_kernel<true, true><<<static_cast<unsigned>((t + 63) / 64), 64, 0, stream>>>(
      logits, bias, ids, weights, static_cast<int>(e), static_cast<int>(t), k, mode, renormalize ? 1 : 0, scale, groups,
      groups_used, group_max ? 1 : 0, status);
  return cudaGetLastError();
}

cudaError_t kernel_image_status() noexcept {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, eltwise_kernel);
}

}  // namespace colibri::cuda
