// The scalar path: the definition every SIMD path reproduces bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "kernels.hpp"

namespace colibri::cpu {

using namespace colibri::quant;

ActFormat act_format(DType weight, bool exact_activations) noexcept {
  if (exact_activations) return ActFormat::f32;
  switch (weight) {
    case DType::q8_0:
    case DType::q4_0:
    case DType::mxfp4: return ActFormat::q8_0;
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k: return ActFormat::q8_k;
    default: return ActFormat::f32;
  }
}

std::size_t act_row_bytes(ActFormat format, std::int64_t k) noexcept {
  switch (format) {
    case ActFormat::f32: return static_cast<std::size_t>(k) * sizeof(float);
    case ActFormat::q8_0: return static_cast<std::size_t>(k / 32) * sizeof(Q8Block);
    case ActFormat::q8_k: return static_cast<std::size_t>(k / 256) * sizeof(Q8KBlock);
  }
  return 0;
}

namespace {

// Round to nearest (ties to even), clamped to +-127; NaN becomes -127 instead of undefined behaviour.
inline std::int8_t to_q8(float v) noexcept {
  if (!(v >= -127.0f)) return -127;
  if (v > 127.0f) return 127;
  return static_cast<std::int8_t>(std::nearbyint(v));
}

// x ~= d * q with d = amax / 127 over n elements.
inline float quantize_block(const float* x, std::int8_t* q, int n) noexcept {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = to_q8(x[i] * id);
  return d;
}

}  // namespace

void quantize_activations(ActFormat format, const float* x, void* out, std::int64_t k) noexcept {
  switch (format) {
    case ActFormat::f32: std::memcpy(out, x, static_cast<std::size_t>(k) * sizeof(float)); return;
    case ActFormat::q8_0: {
      auto* y = static_cast<Q8Block*>(out);
      for (std::int64_t b = 0; b < k / 32; ++b) {
        y[b].d = quantize_block(x + b * 32, y[b].qs, 32);
        std::int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += y[b].qs[i];
        y[b].sum = s;
      }
      return;
    }
    case ActFormat::q8_k: {
      auto* y = static_cast<Q8KBlock*>(out);
      for (std::int64_t b = 0; b < k / 256; ++b) {
        y[b].d = quantize_block(x + b * 256, y[b].qs, 256);
        for (int g = 0; g < 16; ++g) {
          int s = 0;
          for (int i = 0; i < 16; ++i) s += y[b].qs[g * 16 + i];
          y[b].bsums[g] = static_cast<std::int16_t>(s);
        }
      }
      return;
    }
  }
}

float reduce_f32_lanes(const float* lanes) noexcept {
  float l[kF32Lanes];
  std::memcpy(l, lanes, sizeof(l));
  for (int s = kF32Lanes / 2; s > 0; s /= 2) {
    for (int i = 0; i < s; ++i) l[i] += l[i + s];
  }
  return l[0];
}

float reduce_block_lanes(const float* lanes) noexcept {
  return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
}

void unpack_q3_k_scales(const std::uint8_t* packed, std::int8_t* out) noexcept {
  constexpr std::uint32_t kmask1 = 0x03030303;
  constexpr std::uint32_t kmask2 = 0x0f0f0f0f;
  std::uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const std::uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<std::int8_t>(out[i] - 32);
}

DotFn select_dot(const KernelSet& set, DType type, bool exact_activations) noexcept {
  switch (type) {
    case DType::f32: return set.f32;
    case DType::f16: return set.f16;
    case DType::bf16: return set.bf16;
    default: break;
  }
  const bool known = type == DType::q8_0 || type == DType::q4_0 || type == DType::q2_k || type == DType::q3_k ||
                     type == DType::q4_k || type == DType::q5_k || type == DType::q6_k || type == DType::mxfp4;
  if (!known) return nullptr;
  if (exact_activations) return set.f32;  // the caller dequantizes the row first
  switch (type) {
    case DType::q8_0: return set.q8_0;
    case DType::q4_0: return set.q4_0;
    case DType::q2_k: return set.q2_k;
    case DType::q3_k: return set.q3_k;
    case DType::q4_k: return set.q4_k;
    case DType::q5_k: return set.q5_k;
    case DType::q6_k: return set.q6_k;
    case DType::mxfp4: return set.mxfp4;
    default: return nullptr;
  }
}

void scale_axpy_scalar(float* y, float c, float a, const float* x, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = y[i] * c + a * x[i];
}

float portable_exp(float x) noexcept {
  if (x != x) return x;
  if (x < kPortableExpMin) return 0.0f;
  if (x > kPortableExpMax) return std::numeric_limits<float>::infinity();
  const float n = std::nearbyint(x * kLog2e);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = kExpPoly[7];
  for (int i = 6; i >= 0; --i) p = p * r + kExpPoly[i];
  return p * std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23);
}

void swiglu_scalar(const float* g, const float* u, float* out, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + portable_exp(-g[i])) * u[i];
}

float softmax_block_scalar(float* s, int n, float scale, float m, float* sum) noexcept {
  float mn = m;
  for (int j = 0; j < n; ++j) {
    s[j] *= scale;
    if (s[j] > mn) mn = s[j];
  }
  float lanes[16] = {};
  for (int j = 0; j < n; ++j) lanes[j % 16] += (s[j] = portable_exp(s[j] - mn));
  for (int k = 8; k > 0; k /= 2)
    for (int i = 0; i < k; ++i) lanes[i] += lanes[i + k];
  *sum = lanes[0];
  return mn;
}

DotRowsFn select_rows(const KernelSet& set, DType type, bool exact_activations) noexcept {
  if (exact_activations) return nullptr;
  switch (type) {
    case DType::q4_k: return set.rows_q4_k;
    case DType::q5_k: return set.rows_q5_k;
    case DType::q6_k: return set.rows_q6_k;
    case DType::mxfp4: return set.rows_mxfp4;
    case DType::q4_0: return set.rows_q4_0;
    case DType::q2_k: return set.rows_q2_k;
    case DType::q3_k: return set.rows_q3_k;
    default: return nullptr;
  }
}

DotRowsTileFn select_tile_rows(const KernelSet& set, DType type, bool exact_activations) noexcept {
  if (exact_activations) return nullptr;
  switch (type) {
    case DType::q8_0: return set.tile_rows_q8_0;
    case DType::q4_0: return set.tile_rows_q4_0;
    case DType::q2_k: return set.tile_rows_q2_k;
    case DType::q3_k: return set.tile_rows_q3_k;
    case DType::mxfp4: return set.tile_rows_mxfp4;
    case DType::q4_k: return set.tile_rows_q4_k;
    case DType::q5_k: return set.tile_rows_q5_k;
    case DType::q6_k: return set.tile_rows_q6_k;
    default: return nullptr;
  }
}

namespace {

float dot_f32(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const float*>(w_row);
  const auto* x = static_cast<const float*>(act);
  float lanes[kF32Lanes] = {};
  for (std::int64_t i = 0; i < k; ++i) lanes[i % kF32Lanes] += w[i] * x[i];
  return reduce_f32_lanes(lanes);
}

float dot_f16(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const std::uint16_t*>(w_row);
  const auto* x = static_cast<const float*>(act);
  float lanes[kF32Lanes] = {};
  for (std::int64_t i = 0; i < k; ++i) lanes[i % kF32Lanes] += fp16_to_fp32(w[i]) * x[i];
  return reduce_f32_lanes(lanes);
}

float dot_bf16(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const std::uint16_t*>(w_row);
  const auto* x = static_cast<const float*>(act);
  float lanes[kF32Lanes] = {};
  for (std::int64_t i = 0; i < k; ++i) lanes[i % kF32Lanes] += bf16_to_fp32(w[i]) * x[i];
  return reduce_f32_lanes(lanes);
}

float dot_q8_0(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ8_0*>(w_row);
  const auto* y = static_cast<const Q8Block*>(act);
  float lanes[kBlockLanes] = {};
  for (std::int64_t b = 0; b < k / 32; ++b) {
    std::int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += w[b].qs[j] * y[b].qs[j];
    const float s = fp16_to_fp32(w[b].d) * y[b].d;
    lanes[b % kBlockLanes] += s * static_cast<float>(isum);
  }
  return reduce_block_lanes(lanes);
}

float dot_q4_0(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ4_0*>(w_row);
  const auto* y = static_cast<const Q8Block*>(act);
  float lanes[kBlockLanes] = {};
  for (std::int64_t b = 0; b < k / 32; ++b) {
    std::int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += (w[b].qs[j] & 15) * y[b].qs[j] + (w[b].qs[j] >> 4) * y[b].qs[j + 16];
    }
    isum -= 8 * y[b].sum;
    const float s = fp16_to_fp32(w[b].d) * y[b].d;
    lanes[b % kBlockLanes] += s * static_cast<float>(isum);
  }
  return reduce_block_lanes(lanes);
}

// mxfp4 with q8_0 activations, block for block as q4_0: the block's integer sum of code values times activations,
// then (2^(e - 128) * d_x) * isum into lane b % 4.
float dot_mxfp4(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockMXFP4*>(w_row);
  const auto* y = static_cast<const Q8Block*>(act);
  float lanes[kBlockLanes] = {};
  for (std::int64_t b = 0; b < k / 32; ++b) {
    std::int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += kMxfp4Values[w[b].qs[j] & 15] * y[b].qs[j] + kMxfp4Values[w[b].qs[j] >> 4] * y[b].qs[j + 16];
    }
    const float s = e8m0_to_fp32_half(w[b].e) * y[b].d;
    lanes[b % kBlockLanes] += s * static_cast<float>(isum);
  }
  return reduce_block_lanes(lanes);
}

// Sums of u[i] * y[i] per 16 elements of a super-block.
inline void dots16(const std::uint8_t* u, const std::int8_t* y, std::int32_t* out) noexcept {
  for (int g = 0; g < 16; ++g) {
    std::int32_t s = 0;
    for (int i = 0; i < 16; ++i) s += u[g * 16 + i] * y[g * 16 + i];
    out[g] = s;
  }
}

float dot_q2_k(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ2_K*>(w_row);
  const auto* y = static_cast<const Q8KBlock*>(act);
  float acc = 0.0f;
  std::uint8_t u[256];
  std::int32_t d16[16];
  for (std::int64_t b = 0; b < k / 256; ++b) {
    const BlockQ2_K& x = w[b];
    for (int half = 0; half < 2; ++half) {
      const std::uint8_t* q = x.qs + 32 * half;
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) u[128 * half + 32 * j + l] = (q[l] >> (2 * j)) & 3;
      }
    }
    dots16(u, y[b].qs, d16);
    std::int32_t isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      isum += (x.scales[g] & 15) * d16[g];
      msum += (x.scales[g] >> 4) * y[b].bsums[g];
    }
    const float dall = y[b].d * fp16_to_fp32(x.d);
    const float dmin = y[b].d * fp16_to_fp32(x.dmin);
    acc += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return acc;
}

float dot_q3_k(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ3_K*>(w_row);
  const auto* y = static_cast<const Q8KBlock*>(act);
  float acc = 0.0f;
  std::uint8_t u[256];
  std::int32_t d16[16];
  std::int8_t sc[16];
  for (std::int64_t b = 0; b < k / 256; ++b) {
    const BlockQ3_K& x = w[b];
    for (int half = 0; half < 2; ++half) {
      const std::uint8_t* q = x.qs + 32 * half;
      for (int j = 0; j < 4; ++j) {
        const int bit = 4 * half + j;
        for (int l = 0; l < 32; ++l) {
          u[128 * half + 32 * j + l] =
              static_cast<std::uint8_t>(((q[l] >> (2 * j)) & 3) | (((x.hmask[l] >> bit) & 1) << 2));
        }
      }
    }
    dots16(u, y[b].qs, d16);
    unpack_q3_k_scales(x.scales, sc);
    std::int32_t isum = 0;
    for (int g = 0; g < 16; ++g) isum += sc[g] * (d16[g] - 4 * y[b].bsums[g]);
    acc += (y[b].d * fp16_to_fp32(x.d)) * static_cast<float>(isum);
  }
  return acc;
}

float dot_q4_k(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ4_K*>(w_row);
  const auto* y = static_cast<const Q8KBlock*>(act);
  float acc = 0.0f;
  std::uint8_t u[256];
  std::int32_t d16[16];
  for (std::int64_t b = 0; b < k / 256; ++b) {
    const BlockQ4_K& x = w[b];
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        u[64 * j + l] = x.qs[32 * j + l] & 15;
        u[64 * j + 32 + l] = x.qs[32 * j + l] >> 4;
      }
    }
    dots16(u, y[b].qs, d16);
    std::int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      std::uint8_t sc, m;
      k4_scale_min(j, x.scales, sc, m);
      isum += sc * (d16[2 * j] + d16[2 * j + 1]);
      msum += m * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    }
    const float dall = y[b].d * fp16_to_fp32(x.d);
    const float dmin = y[b].d * fp16_to_fp32(x.dmin);
    acc += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return acc;
}

float dot_q5_k(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ5_K*>(w_row);
  const auto* y = static_cast<const Q8KBlock*>(act);
  float acc = 0.0f;
  std::uint8_t u[256];
  std::int32_t d16[16];
  for (std::int64_t b = 0; b < k / 256; ++b) {
    const BlockQ5_K& x = w[b];
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        u[64 * j + l] = static_cast<std::uint8_t>((x.qs[32 * j + l] & 15) | (((x.qh[l] >> (2 * j)) & 1) << 4));
        u[64 * j + 32 + l] = static_cast<std::uint8_t>((x.qs[32 * j + l] >> 4) | (((x.qh[l] >> (2 * j + 1)) & 1) << 4));
      }
    }
    dots16(u, y[b].qs, d16);
    std::int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      std::uint8_t sc, m;
      k4_scale_min(j, x.scales, sc, m);
      isum += sc * (d16[2 * j] + d16[2 * j + 1]);
      msum += m * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    }
    const float dall = y[b].d * fp16_to_fp32(x.d);
    const float dmin = y[b].d * fp16_to_fp32(x.dmin);
    acc += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return acc;
}

float dot_q6_k(const void* w_row, const void* act, std::int64_t k) noexcept {
  const auto* w = static_cast<const BlockQ6_K*>(w_row);
  const auto* y = static_cast<const Q8KBlock*>(act);
  float acc = 0.0f;
  std::uint8_t u[256];
  std::int32_t d16[16];
  for (std::int64_t b = 0; b < k / 256; ++b) {
    const BlockQ6_K& x = w[b];
    for (int half = 0; half < 2; ++half) {
      const std::uint8_t* ql = x.ql + 64 * half;
      const std::uint8_t* qh = x.qh + 32 * half;
      std::uint8_t* o = u + 128 * half;
      for (int l = 0; l < 32; ++l) {
        o[l] = static_cast<std::uint8_t>((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
        o[l + 32] = static_cast<std::uint8_t>((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
        o[l + 64] = static_cast<std::uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        o[l + 96] = static_cast<std::uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    dots16(u, y[b].qs, d16);
    std::int32_t isum = 0;
    for (int g = 0; g < 16; ++g) isum += x.scales[g] * (d16[g] - 32 * y[b].bsums[g]);
    acc += (y[b].d * fp16_to_fp32(x.d)) * static_cast<float>(isum);
  }
  return acc;
}

}  // namespace

const KernelSet& scalar_kernels() noexcept {
  static constexpr KernelSet set{"scalar", dot_f32,  dot_f16,  dot_bf16, dot_q8_0,  dot_q4_0,         dot_q2_k,
                                 dot_q3_k, dot_q4_k, dot_q5_k, dot_q6_k, dot_mxfp4, scale_axpy_scalar};
  static_assert(set.mxfp4 == dot_mxfp4 && set.scale_axpy == scale_axpy_scalar, "list every KernelSet member");
  return set;
}

}  // namespace colibri::cpu
