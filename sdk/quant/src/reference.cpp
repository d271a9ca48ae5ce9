// Scalar reference block formats. The arithmetic follows ggml-quants.c step by step (same operation
// order, same float/int conversions, no FMA): any reordering changes rounding and breaks the byte
// compatibility that tests/data/quant checks.
#include "reference.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"

#if defined(__FAST_MATH__)
#error "the reference quantizers need IEEE arithmetic: do not build with -ffast-math"
#endif

namespace colibri::quant::detail {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

// ggml's nearest_int: round half to even through the float mantissa (valid for |x| < 2^22).
inline int nearest_int(float fval) noexcept {
  const float val = fval + 12582912.f;
  std::int32_t i;
  std::memcpy(&i, &val, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

// A C cast float -> int as x86 performs it (cvttss2si): out of range and NaN give INT_MIN.
inline int truncate_like_x86(float f) noexcept {
  if (!(f > -2147483904.f && f < 2147483648.f)) return INT_MIN;
  return static_cast<int>(f);
}

template <typename T>
T from_bytes(const std::uint8_t* p) noexcept {
  T b;
  std::memcpy(&b, p, sizeof(T));
  return b;
}

float make_qx_quants(int n, int nmax, const float* x, std::int8_t* L, int rmse_type) noexcept {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      const int l = nearest_int(iscale * x[i]);
      L[i] = static_cast<std::int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
    }
    return 1 / iscale;
  }
  auto weight = [rmse_type](float v) -> float {
    return rmse_type == 1 ? v * v : rmse_type == 2 ? 1 : rmse_type == 3 ? std::fabs(v) : std::sqrt(std::fabs(v));
  };
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = weight(x[i]);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = weight(x[i]);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<std::int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float make_q3_quants(int n, int nmax, const float* x, std::int8_t* L) noexcept {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<std::int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<std::int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<std::int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Scale and (negated) min for an asymmetric sub-block, searching nstep+1 candidate scales.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L, float* the_min,
                       std::uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) noexcept {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Packs 8 six-bit scales and mins the way q4_k / q5_k store them.
void pack_k4_scales(const float* scales, const float* mins, float max_scale, float max_min,
                    std::uint8_t* out) noexcept {
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQK_K / 32; ++j) {
    auto ls = static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j]));
    auto lm = static_cast<std::uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<std::uint8_t>(63, ls);
    lm = std::min<std::uint8_t>(63, lm);
    if (j < 4) {
      out[j] = ls;
      out[j + 4] = lm;
    } else {
      out[j + 4] = static_cast<std::uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      out[j - 4] |= static_cast<std::uint8_t>((ls >> 4) << 6);
      out[j - 0] |= static_cast<std::uint8_t>((lm >> 4) << 6);
    }
  }
}

// Sub-block scales and mins of a q4_k / q5_k super-block (weights favour large magnitudes).
void k4_sub_block_fit(const float* x, int nmax, float rmin, float rdelta, int nstep, std::uint8_t* L, float* scales,
                      float* mins, float& max_scale, float& max_min) noexcept {
  float weights[32];
  std::uint8_t Laux[32];
  max_scale = 0;
  max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
}

// Final per-weight levels of a q4_k / q5_k super-block from its stored (rounded) scales.
void k4_requantize(const float* x, std::uint16_t d16, std::uint16_t dmin16, const std::uint8_t* packed, int nmax,
                   std::uint8_t* L) noexcept {
  for (int j = 0; j < kQK_K / 32; ++j) {
    std::uint8_t sc, m;
    k4_scale_min(j, packed, sc, m);
    const float d = fp16_to_fp32(d16) * sc;
    if (!d) continue;
    const float dm = fp16_to_fp32(dmin16) * m;
    for (int ii = 0; ii < 32; ++ii) {
      int l = nearest_int((x[32 * j + ii] + dm) / d);
      l = std::max(0, std::min(nmax, l));
      L[32 * j + ii] = static_cast<std::uint8_t>(l);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- q8_0 / q4_0

void quantize_q8_0_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK8_0;
  for (std::int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) {
      const float v = std::fabs(xb[j]);
      amax = amax > v ? amax : v;  // ggml's MAX(): a NaN wins, as there
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) b.qs[j] = static_cast<std::int8_t>(truncate_like_x86(std::round(xb[j] * id)));
    std::memcpy(y + i * sizeof(BlockQ8_0), &b, sizeof(b));
  }
}

void quantize_q4_0_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK4_0;
  for (std::int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK4_0;
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    BlockQ4_0 b;
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[kQK4_0 / 2 + j] * id;
      // ggml: MIN(15, (int8_t)(x + 8.5f)) stored into a uint8_t.
      const auto xi0 = static_cast<std::uint8_t>(
          std::min(15, static_cast<int>(static_cast<std::int8_t>(truncate_like_x86(x0 + 8.5f)))));
      const auto xi1 = static_cast<std::uint8_t>(
          std::min(15, static_cast<int>(static_cast<std::int8_t>(truncate_like_x86(x1 + 8.5f)))));
      b.qs[j] = static_cast<std::uint8_t>(xi0 | (xi1 << 4));
    }
    std::memcpy(y + i * sizeof(BlockQ4_0), &b, sizeof(b));
  }
}

void dequantize_q8_0_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK8_0;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ8_0>(x + i * sizeof(BlockQ8_0));
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = b.qs[j] * d;
  }
}

void dequantize_q4_0_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK4_0;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ4_0>(x + i * sizeof(BlockQ4_0));
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int x0 = (b.qs[j] & 0x0F) - 8;
      const int x1 = (b.qs[j] >> 4) - 8;
      y[i * kQK4_0 + j] = x0 * d;
      y[i * kQK4_0 + j + kQK4_0 / 2] = x1 * d;
    }
  }
}

// ---------------------------------------------------------------- q2_k

void quantize_q2_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  std::uint8_t L[kQK_K];
  std::uint8_t Laux[16];
  float weights[16];
  float mins[kQK_K / 16];
  float scales[kQK_K / 16];
  const float q4scale = 15.f;

  for (std::int64_t i = 0; i < nb; ++i, x += kQK_K) {
    BlockQ2_K b{};
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) b.scales[j] = static_cast<std::uint8_t>(nearest_int(iscale * scales[j]));
      b.d = fp32_to_fp16(max_scale / q4scale);
    } else {
      for (int j = 0; j < kQK_K / 16; ++j) b.scales[j] = 0;
      b.d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < kQK_K / 16; ++j) {
        const int l = nearest_int(iscale * mins[j]);
        b.scales[j] = static_cast<std::uint8_t>(b.scales[j] | (l << 4));
      }
      b.dmin = fp32_to_fp16(max_min / q4scale);
    } else {
      b.dmin = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_fp32(b.d) * (b.scales[j] & 0xF);
      if (!d) continue;
      const float dm = fp16_to_fp32(b.dmin) * (b.scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int((x[16 * j + ii] + dm) / d);
        l = std::max(0, std::min(3, l));
        L[16 * j + ii] = static_cast<std::uint8_t>(l);
      }
    }
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        b.qs[j / 4 + l] =
            static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
      }
    }
    std::memcpy(y + i * sizeof(BlockQ2_K), &b, sizeof(b));
  }
}

void dequantize_q2_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ2_K>(x + i * sizeof(BlockQ2_K));
    const float d = fp16_to_fp32(b.d);
    const float min = fp16_to_fp32(b.dmin);
    const std::uint8_t* q = b.qs;
    int is = 0;
    for (int n128 = 0; n128 < kQK_K; n128 += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        std::uint8_t sc = b.scales[is++];
        float dl = d * (sc & 0xF);
        float ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<std::int8_t>((q[l] >> shift) & 3) - ml;
        sc = b.scales[is++];
        dl = d * (sc & 0xF);
        ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<std::int8_t>((q[l + 16] >> shift) & 3) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

// ---------------------------------------------------------------- q3_k

void quantize_q3_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  std::int8_t L[kQK_K];
  float scales[kQK_K / 16];

  for (std::int64_t i = 0; i < nb; ++i, x += kQK_K) {
    BlockQ3_K b{};
    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        auto l = static_cast<std::int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<std::int8_t>(std::max(-32, std::min(31, static_cast<int>(l))) + 32);
        if (j < 8) {
          b.scales[j] = static_cast<std::uint8_t>(l & 0xF);
        } else {
          b.scales[j - 8] = static_cast<std::uint8_t>(b.scales[j - 8] | ((l & 0xF) << 4));
        }
        l = static_cast<std::int8_t>(l >> 4);
        b.scales[j % 4 + 8] = static_cast<std::uint8_t>(b.scales[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      b.d = fp32_to_fp16(1 / iscale);
    } else {
      b.d = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      auto sc = static_cast<std::int8_t>(j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4);
      sc = static_cast<std::int8_t>((sc | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
      const float d = fp16_to_fp32(b.d) * sc;
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-4, std::min(3, l));
        L[16 * j + ii] = static_cast<std::int8_t>(l + 4);
      }
    }
    // High bit of the first 8 quants in bit 0 of hmask, the next 8 in bit 1, and so on.
    int m = 0;
    std::uint8_t hm = 1;
    for (int j = 0; j < kQK_K; ++j) {
      if (L[j] > 3) {
        b.hmask[m] |= hm;
        L[j] = static_cast<std::int8_t>(L[j] - 4);
      }
      if (++m == kQK_K / 8) {
        m = 0;
        hm = static_cast<std::uint8_t>(hm << 1);
      }
    }
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        b.qs[j / 4 + l] =
            static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
      }
    }
    std::memcpy(y + i * sizeof(BlockQ3_K), &b, sizeof(b));
  }
}

void dequantize_q3_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  std::int8_t scales[16];
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ3_K>(x + i * sizeof(BlockQ3_K));
    const float d_all = fp16_to_fp32(b.d);
    unpack_q3_k_scales(b.scales, scales);
    const std::uint8_t* q = b.qs;
    const std::uint8_t* hm = b.hmask;
    std::uint8_t m = 1;
    int is = 0;
    for (int n128 = 0; n128 < kQK_K; n128 += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * scales[is++];
        for (int l = 0; l < 16; ++l) {
          *y++ = dl * (static_cast<std::int8_t>((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
        }
        dl = d_all * scales[is++];
        for (int l = 0; l < 16; ++l) {
          *y++ = dl * (static_cast<std::int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        }
        shift += 2;
        m = static_cast<std::uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

// ---------------------------------------------------------------- q4_k / q5_k

void quantize_q4_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  std::uint8_t L[kQK_K];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  for (std::int64_t i = 0; i < nb; ++i, x += kQK_K) {
    BlockQ4_K b{};
    float max_scale = 0, max_min = 0;
    k4_sub_block_fit(x, 15, -1.f, 0.1f, 20, L, scales, mins, max_scale, max_min);
    pack_k4_scales(scales, mins, max_scale, max_min, b.scales);
    b.d = fp32_to_fp16(max_scale / 63.f);
    b.dmin = fp32_to_fp16(max_min / 63.f);
    k4_requantize(x, b.d, b.dmin, b.scales, 15, L);
    std::uint8_t* q = b.qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
    std::memcpy(y + i * sizeof(BlockQ4_K), &b, sizeof(b));
  }
}

void dequantize_q4_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ4_K>(x + i * sizeof(BlockQ4_K));
    const float d = fp16_to_fp32(b.d);
    const float min = fp16_to_fp32(b.dmin);
    const std::uint8_t* q = b.qs;
    int is = 0;
    std::uint8_t sc, m;
    for (int j = 0; j < kQK_K; j += 64) {
      k4_scale_min(is + 0, b.scales, sc, m);
      const float d1 = d * sc;
      const float m1 = min * m;
      k4_scale_min(is + 1, b.scales, sc, m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void quantize_q5_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  std::uint8_t L[kQK_K];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  for (std::int64_t i = 0; i < nb; ++i, x += kQK_K) {
    BlockQ5_K b{};
    float max_scale = 0, max_min = 0;
    k4_sub_block_fit(x, 31, -0.5f, 0.1f, 15, L, scales, mins, max_scale, max_min);
    pack_k4_scales(scales, mins, max_scale, max_min, b.scales);
    b.d = fp32_to_fp16(max_scale / 63.f);
    b.dmin = fp32_to_fp16(max_min / 63.f);
    k4_requantize(x, b.d, b.dmin, b.scales, 31, L);
    std::uint8_t* qh = b.qh;
    std::uint8_t* ql = b.qs;
    std::uint8_t m1 = 1, m2 = 2;
    for (int n64 = 0; n64 < kQK_K; n64 += 64) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n64 + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n64 + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<std::uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<std::uint8_t>(m1 << 2);
      m2 = static_cast<std::uint8_t>(m2 << 2);
      ql += 32;
    }
    std::memcpy(y + i * sizeof(BlockQ5_K), &b, sizeof(b));
  }
}

void dequantize_q5_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ5_K>(x + i * sizeof(BlockQ5_K));
    const std::uint8_t* ql = b.qs;
    const std::uint8_t* qh = b.qh;
    const float d = fp16_to_fp32(b.d);
    const float min = fp16_to_fp32(b.dmin);
    int is = 0;
    std::uint8_t sc, m;
    std::uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQK_K; j += 64) {
      k4_scale_min(is + 0, b.scales, sc, m);
      const float d1 = d * sc;
      const float m1 = min * m;
      k4_scale_min(is + 1, b.scales, sc, m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = static_cast<std::uint8_t>(u1 << 2);
      u2 = static_cast<std::uint8_t>(u2 << 2);
    }
  }
}

// ---------------------------------------------------------------- q6_k

void quantize_q6_k_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  std::int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (std::int64_t i = 0; i < nb; ++i, x += kQK_K) {
    BlockQ6_K b{};
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {  // an all-zero block
      b.d = fp32_to_fp16(0.f);
      std::memcpy(y + i * sizeof(BlockQ6_K), &b, sizeof(b));
      continue;
    }
    const float iscale = -128.f / max_scale;
    b.d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      b.scales[ib] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_fp32(b.d) * b.scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = static_cast<std::int8_t>(l + 32);
      }
    }
    std::uint8_t* ql = b.ql;
    std::uint8_t* qh = b.qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const std::uint8_t q1 = L[j + l + 0] & 0xF;
        const std::uint8_t q2 = L[j + l + 32] & 0xF;
        const std::uint8_t q3 = L[j + l + 64] & 0xF;
        const std::uint8_t q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<std::uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<std::uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<std::uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                          ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
    std::memcpy(y + i * sizeof(BlockQ6_K), &b, sizeof(b));
  }
}

void dequantize_q6_k_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_K;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockQ6_K>(x + i * sizeof(BlockQ6_K));
    const float d = fp16_to_fp32(b.d);
    const std::uint8_t* ql = b.ql;
    const std::uint8_t* qh = b.qh;
    const std::int8_t* sc = b.scales;
    for (int n128 = 0; n128 < kQK_K; n128 += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const auto q1 = static_cast<std::int8_t>(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        const auto q2 = static_cast<std::int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        const auto q3 = static_cast<std::int8_t>(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        const auto q4 = static_cast<std::int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// ---------------------------------------------------------------- mxfp4

namespace {

// ggml's best_index_mxfp4: the code whose value (times d) lies nearest x; the first of equals wins, so a tie
// goes to the smaller magnitude (codes ascend in magnitude within each sign) and to + zero. A NaN x gets code 0.
inline int best_index_mxfp4(float x, float d) noexcept {
  int best = 0;
  float best_err = std::fabs(kMxfp4Values[0] * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(kMxfp4Values[i] * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

}  // namespace

void quantize_mxfp4_ref(const float* x, std::uint8_t* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_MXFP4;
  for (std::int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK_MXFP4;
    float amax = 0.0f;
    for (int j = 0; j < kQK_MXFP4; ++j) {
      if (amax < std::fabs(xb[j])) amax = std::fabs(xb[j]);  // a NaN never wins
    }
    // ggml: (uint8_t)(floorf(log2f(amax)) - 2 + 127), a float -> uint8_t cast that x86 performs through int32 and
    // then keeps the low byte: amax below 2^-125 wraps (1e-40 gives 248), an infinite amax gives 0.
    const float e_float = std::floor(std::log2(amax)) - 2 + 127;
    const auto e = amax > 0.0f ? static_cast<std::uint8_t>(truncate_like_x86(e_float)) : std::uint8_t{0};
    const float d = e8m0_to_fp32_half(e);
    BlockMXFP4 b;
    b.e = e;
    for (int j = 0; j < kQK_MXFP4 / 2; ++j) {
      const int x0 = best_index_mxfp4(xb[j], d);
      const int x1 = best_index_mxfp4(xb[kQK_MXFP4 / 2 + j], d);
      b.qs[j] = static_cast<std::uint8_t>(x0 | (x1 << 4));
    }
    std::memcpy(y + i * sizeof(BlockMXFP4), &b, sizeof(b));
  }
}

void dequantize_mxfp4_ref(const std::uint8_t* x, float* y, std::int64_t n) noexcept {
  const std::int64_t nb = n / kQK_MXFP4;
  for (std::int64_t i = 0; i < nb; ++i) {
    const auto b = from_bytes<BlockMXFP4>(x + i * sizeof(BlockMXFP4));
    const float d = e8m0_to_fp32_half(b.e);
    for (int j = 0; j < kQK_MXFP4 / 2; ++j) {
      y[i * kQK_MXFP4 + j] = kMxfp4Values[b.qs[j] & 0x0F] * d;
      y[i * kQK_MXFP4 + j + kQK_MXFP4 / 2] = kMxfp4Values[b.qs[j] >> 4] * d;
    }
  }
}

// ---------------------------------------------------------------- conversions and table

namespace {
void fp16_to_fp32_scalar(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}
void bf16_to_fp32_scalar(const std::uint16_t* x, float* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
}
void fp32_to_fp16_scalar(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}
void fp32_to_bf16_scalar(const float* x, std::uint16_t* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}
}  // namespace

const KernelTable& scalar_kernels() noexcept {
  static constexpr KernelTable table{dequantize_q8_0_ref, dequantize_q4_0_ref,  dequantize_q2_k_ref,
                                     dequantize_q3_k_ref, dequantize_q4_k_ref,  dequantize_q5_k_ref,
                                     dequantize_q6_k_ref, dequantize_mxfp4_ref, fp16_to_fp32_scalar,
                                     bf16_to_fp32_scalar, fp32_to_fp16_scalar,  fp32_to_bf16_scalar};
  return table;
}

}  // namespace colibri::quant::detail
