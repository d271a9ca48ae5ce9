// mxfp4 (OCP microscaling FP4, gpt-oss's experts): hand-checked blocks (ties, subnormal and wrapped scales), round
// trips, and ggml's own bytes and floats for the golden inputs (tests/data/quant/inputs.bin) as hashes.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/quant.hpp"
#include "fnv1a.hpp"
#include "golden_io.hpp"

namespace colibri::quant {
namespace {

std::vector<std::uint8_t> quantize(const std::vector<float>& x) {
  std::vector<std::uint8_t> q(sdk::row_bytes(DType::mxfp4, static_cast<std::int64_t>(x.size())), 0xCD);
  EXPECT_TRUE(quantize_row(DType::mxfp4, x.data(), q.data(), static_cast<std::int64_t>(x.size())).is_ok());
  return q;
}

std::vector<float> dequantize(const std::vector<std::uint8_t>& q, Isa isa = Isa::scalar) {
  const std::int64_t n = static_cast<std::int64_t>(q.size() / sizeof(BlockMXFP4)) * kQK_MXFP4;
  std::vector<float> y(static_cast<std::size_t>(n), -7.0f);
  EXPECT_TRUE(dequantize_row(DType::mxfp4, q.data(), y.data(), n, isa).is_ok());
  return y;
}

// One block: x[j] for j < first.size(), zeros after.
std::vector<float> block(std::initializer_list<float> first) {
  std::vector<float> x(kQK_MXFP4, 0.0f);
  std::copy(first.begin(), first.end(), x.begin());
  return x;
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa_available(isa)) out.push_back(isa);
  }
  return out;
}

TEST(QuantMxfp4, TypeTraits) {
  EXPECT_TRUE(is_supported(DType::mxfp4));
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::mxfp4), 4.25);
  EXPECT_EQ(sdk::row_bytes(DType::mxfp4, 64), 34u);
  EXPECT_EQ(sizeof(BlockMXFP4), 17u);
}

TEST(QuantMxfp4, ScaleByteIsTwoToTheEMinus128) {
  EXPECT_EQ(std::bit_cast<std::uint32_t>(e8m0_to_fp32_half(0)), 0x00200000u);  // 2^-128, subnormal
  EXPECT_EQ(std::bit_cast<std::uint32_t>(e8m0_to_fp32_half(1)), 0x00400000u);  // 2^-127, subnormal
  EXPECT_EQ(e8m0_to_fp32_half(2), std::ldexp(1.0f, -126));                     // the smallest normal
  EXPECT_EQ(e8m0_to_fp32_half(127), 0.5f);
  EXPECT_EQ(e8m0_to_fp32_half(128), 1.0f);
  EXPECT_EQ(e8m0_to_fp32_half(255), std::ldexp(1.0f, 127));
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(e8m0_to_fp32_half(static_cast<std::uint8_t>(e)), std::ldexp(1.0f, e - 128)) << e;
  }
}

// amax 6 -> e = floor(log2 6) - 2 + 127 = 127, d = 0.5: the codes' values are 0, +-0.5, 1, 1.5, 2, 3, 4, 6.
// Every other input lies halfway between two of them; the first code of the two (the smaller magnitude) wins.
TEST(QuantMxfp4, HandCheckedBlockAndTiesGoToTheFirstCode) {
  const auto x = block({6.0f, 0.25f, -0.25f, 0.75f, -0.75f, 5.0f, -5.0f, 2.5f});
  const auto q = quantize(x);
  const std::vector<std::uint8_t> want = {127, 0x07, 0x00, 0x00, 0x01, 0x09, 0x06, 0x0e, 0x04, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(q, want);
  const std::vector<float> back = {6.0f, 0.0f, 0.0f, 0.5f, -0.5f, 4.0f, -4.0f, 2.0f};
  for (Isa isa : isas()) {
    const auto y = dequantize(q, isa);
    for (std::size_t j = 0; j < 32; ++j) EXPECT_EQ(y[j], j < back.size() ? back[j] : 0.0f) << to_string(isa) << j;
  }
  // Elements 16..31 go to the high nibbles.
  auto high = x;
  high[16] = -6.0f;  // code 15
  high[17] = 1.25f;  // 1 (code 2) or 1.5 (code 3): 2
  high[18] = -3.5f;  // -3 (code 13) or -4 (code 14): 13
  high[19] = 3.0f;   // code 5 exactly
  const auto qh = quantize(high);
  EXPECT_EQ(qh[0], 127);
  EXPECT_EQ(qh[1], 0x07 | (15 << 4));
  EXPECT_EQ(qh[2], 0x00 | (2 << 4));
  EXPECT_EQ(qh[3], 0x00 | (13 << 4));
  EXPECT_EQ(qh[4], 0x01 | (5 << 4));
  // amax 100 -> e = 6 - 2 + 127 = 131, d = 8 (codes 0, 8, 16, 24, 32, 48, 64, 96): the top code is 12 d = 96 < amax.
  const auto qb = quantize(block({100.0f, -1.0f, 20.0f, -100.0f}));
  EXPECT_EQ(qb[0], 131);
  EXPECT_EQ(qb[1], 0x07);  // 100 saturates at 96
  EXPECT_EQ(qb[2], 0x00);  // -1 -> 0 (nearer than -8)
  EXPECT_EQ(qb[3], 0x02);  // 20: 16 and 24 are both 4 away; code 2 comes first
  EXPECT_EQ(qb[4], 0x0f);  // -100 saturates at -96
}

TEST(QuantMxfp4, EveryCodeDequantizes) {
  std::vector<std::uint8_t> q(17, 0);
  q[0] = 128;  // d = 1
  for (int j = 0; j < 16; ++j) q[1 + static_cast<std::size_t>(j)] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  for (Isa isa : isas()) {
    const auto y = dequantize(q, isa);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[static_cast<std::size_t>(j)], kMxfp4Values[j]) << to_string(isa) << " code " << j;
      EXPECT_EQ(y[static_cast<std::size_t>(16 + j)], kMxfp4Values[15 - j]) << to_string(isa) << " code " << 15 - j;
    }
    EXPECT_FALSE(std::signbit(y[8])) << "code 8 is +0 (0 * d), as in ggml";
  }
}

// e = 0 and 1 make d subnormal (2^-128, 2^-127); the values are exact subnormals on every path, also when the caller
// has set flush-to-zero (quantize_row/dequantize_row switch IEEE mode on for the call).
TEST(QuantMxfp4, SubnormalScales) {
  // amax 3e-38 in [2^-125, 2^-124): e = -125 - 2 + 127 = 0, d = 2^-128 ~ 2.94e-39: 3e-38 ~ 10.2 d -> 12 (code 7),
  // 1e-38 ~ 3.4 d -> 3 (code 3), -1e-38 -> -3 (code 11).
  const auto q0 = quantize(block({1e-38f, 3e-38f, -1e-38f}));
  EXPECT_EQ(q0[0], 0);
  EXPECT_EQ(q0[1], 0x03);
  EXPECT_EQ(q0[2], 0x07);
  EXPECT_EQ(q0[3], 0x0b);
  // amax 2^-124 exactly: e = 1, d = 2^-127; 2^-124 = 8 d (code 6).
  const auto q1 = quantize(block({std::ldexp(1.0f, -124), -std::ldexp(1.0f, -126)}));
  EXPECT_EQ(q1[0], 1);
  EXPECT_EQ(q1[1], 0x06);
  EXPECT_EQ(q1[2], 0x0a);  // -2^-126 = -2 d
  for (Isa isa : isas()) {
    const auto y0 = dequantize(q0, isa);
    EXPECT_EQ(y0[0], 3.0f * std::ldexp(1.0f, -128)) << to_string(isa);
    EXPECT_EQ(y0[1], 12.0f * std::ldexp(1.0f, -128)) << to_string(isa);
    EXPECT_EQ(y0[2], -3.0f * std::ldexp(1.0f, -128)) << to_string(isa);
    EXPECT_NE(y0[0], 0.0f) << to_string(isa) << ": a subnormal value was flushed";
    const auto y1 = dequantize(q1, isa);
    EXPECT_EQ(y1[0], std::ldexp(1.0f, -124)) << to_string(isa);
    EXPECT_EQ(y1[1], -std::ldexp(1.0f, -126)) << to_string(isa);
  }
#if defined(__x86_64__)
  // The same under the caller's flush-to-zero / denormals-are-zero.
  const unsigned saved = _mm_getcsr();
  for (Isa isa : isas()) {
    _mm_setcsr(saved | (1u << 15) | (1u << 6));
    const auto qf = quantize(block({1e-38f, 3e-38f, -1e-38f}));
    const auto yf = dequantize(qf, isa);
    _mm_setcsr(saved);
    EXPECT_EQ(qf, q0) << to_string(isa);
    EXPECT_EQ(yf, dequantize(q0, isa)) << to_string(isa);
  }
#endif
}

// ggml casts the float exponent to uint8_t; built for x86-64 the cast goes through int32 and keeps the low byte.
// colibri reproduces that: amax below 2^-125 wraps around, and every code of such a block is 0.
TEST(QuantMxfp4, ExponentOutsideTheByteWrapsAsGgmlOnX86) {
  const auto tiny = quantize(block({1e-40f, -5e-41f}));  // floor(log2 1e-40) = -133: -133 - 2 + 127 = -8 -> 248
  EXPECT_EQ(tiny[0], 248);
  for (std::size_t i = 1; i < tiny.size(); ++i) EXPECT_EQ(tiny[i], 0) << i;
  const auto edge = quantize(block({std::ldexp(1.0f, -126)}));  // -126 - 2 + 127 = -1 -> 255
  EXPECT_EQ(edge[0], 255);
  const auto huge = quantize(block({3.0e38f, -1.0f}));  // floor(log2 3e38) = 127: e = 252, d = 2^124
  EXPECT_EQ(huge[0], 252);
  EXPECT_EQ(huge[1], 0x07);
  // An infinite amax: floor(log2 inf) = inf, cast through int32 -> INT_MIN, low byte 0. Then d = 2^-128: inf is no
  // nearer to any code, and for 1.0 every |code * d - 1| rounds to 1 in float: all code 0.
  const auto inf = quantize(block({std::numeric_limits<float>::infinity(), 1.0f, -1.0f, 1e-38f}));
  EXPECT_EQ(inf[0], 0);
  EXPECT_EQ(inf[1], 0x00);
  EXPECT_EQ(inf[2], 0x00);
  EXPECT_EQ(inf[3], 0x00);
  EXPECT_EQ(inf[4], 0x03) << "1e-38 ~ 3.4 d";
  // NaN never becomes amax and takes code 0.
  const auto nan = quantize(block({std::numeric_limits<float>::quiet_NaN(), 1.0f}));
  EXPECT_EQ(nan[0], 125);  // amax 1: 0 - 2 + 127, d = 2^-3
  EXPECT_EQ(nan[1], 0x00);
  EXPECT_EQ(nan[2], 0x06);  // 1 = 8 d
}

TEST(QuantMxfp4, ZerosGiveScaleByteZeroAndZeros) {
  const std::vector<float> zeros(256, 0.0f);
  const auto q = quantize(zeros);
  for (std::uint8_t b : q) ASSERT_EQ(b, 0);
  for (float v : dequantize(q)) ASSERT_EQ(v, 0.0f);
}

// Values that are codes times a power of two come back exactly (code 8, -0, comes back as code 0).
TEST(QuantMxfp4, RepresentableValuesRoundTripExactly) {
  std::mt19937 rng(39);
  std::vector<float> x(32 * 64);
  std::vector<int> scale(64);
  for (std::size_t b = 0; b < 64; ++b) {
    scale[b] = static_cast<int>(rng() % 200) + 20;
    const float d = std::ldexp(1.0f, scale[b] - 128);
    for (std::size_t j = 0; j < 32; ++j) x[32 * b + j] = kMxfp4Values[rng() % 16] * d;
    // amax = 12 d = 1.5 * 2^(e - 125): floor(log2) - 2 + 127 gives e back.
    x[32 * b + rng() % 32] = (rng() % 2 ? 12.0f : -12.0f) * d;
  }
  const auto q = quantize(x);
  for (std::size_t b = 0; b < 64; ++b) EXPECT_EQ(q[17 * b], scale[b]) << "block " << b;
  for (Isa isa : isas()) {
    const auto y = dequantize(q, isa);
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i]) << to_string(isa) << " element " << i;
  }
}

// Gaussian weights: every value is within half a gap of its code's value (4 d at most beyond 12 d, where the scale
// choice saturates), and the error is that of a 4-bit format (between q4_0's and q2_k's).
TEST(QuantMxfp4, GaussianRoundTripErrorIsBoundedPerBlock) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(256 * 64);
  for (auto& v : x) v = normal(rng);
  const auto q = quantize(x);
  const auto y = dequantize(q);
  double err2 = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float d = e8m0_to_fp32_half(q[17 * (i / 32)]);
    const float ax = std::fabs(x[i]);
    // Within the grid (|x| <= 12 d) the nearest code is at most half the widest gap (8 d -> 12 d) away.
    const float bound = ax <= 12.0f * d ? 2.0f * d : ax - 12.0f * d;
    ASSERT_LE(std::fabs(y[i] - x[i]), bound) << "element " << i << ": " << x[i] << " -> " << y[i] << ", d " << d;
    err2 += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
  }
  const double rmse = std::sqrt(err2 / static_cast<double>(x.size()));
  const auto other = [&](DType t) {
    std::vector<std::uint8_t> b(sdk::row_bytes(t, static_cast<std::int64_t>(x.size())));
    std::vector<float> back(x.size());
    EXPECT_TRUE(quantize_row(t, x.data(), b.data(), static_cast<std::int64_t>(x.size())).is_ok());
    EXPECT_TRUE(dequantize_row(t, b.data(), back.data(), static_cast<std::int64_t>(x.size())).is_ok());
    double e2 = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) e2 += (double(back[i]) - x[i]) * (double(back[i]) - x[i]);
    return std::sqrt(e2 / static_cast<double>(x.size()));
  };
  const double q4 = other(DType::q4_0), q3 = other(DType::q3_k);
  std::printf("[quant] mxfp4 4.25 bits/weight rmse %.6f (q4_0 %.6f, q3_k %.6f)\n", rmse, q4, q3);
  EXPECT_LT(rmse, q3);
  EXPECT_GT(rmse, 0.8 * q4);
}

TEST(QuantMxfp4, SeveralRowsAtOnceEqualRowByRowAndLengthsAreChecked) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(3 * 96);
  for (auto& v : x) v = normal(rng);
  const auto all = quantize(x);
  for (std::size_t r = 0; r < 3; ++r) {
    const auto one = quantize(std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(96 * r),
                                                 x.begin() + static_cast<std::ptrdiff_t>(96 * (r + 1))));
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + static_cast<std::ptrdiff_t>(51 * r))) << r;
  }
  std::vector<std::uint8_t> q(64);
  std::vector<float> y(48);
  const auto st = quantize_row(DType::mxfp4, x.data(), q.data(), 48);
  EXPECT_EQ(st.code(), sdk::StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("mxfp4"), std::string::npos) << st.message();
  EXPECT_EQ(dequantize_row(DType::mxfp4, q.data(), y.data(), 33).code(), sdk::StatusCode::invalid_argument);
}

// ---------------------------------------------------------------- ggml's own results

using testing::fnv1a;

// FNV-1a 64 of quantize_row_mxfp4_ref's bytes and of dequantize_row_mxfp4's floats (little-endian) for each row of
// inputs.bin, from ggml-org/ggml commit d99724f2 (src/ggml-quants.c built as tests/data/quant/README.md describes:
// gcc -O2 -std=gnu11, x86-64 baseline), and for 256 blocks with scale bytes 0..255 and random codes.
struct GgmlHashes {
  const char* input;
  std::uint32_t n;
  std::uint64_t bytes, floats;
};
constexpr GgmlHashes kGgml[] = {
    {"gaussian", 1024, 0x5e5874862bace58bull, 0xe64985be18cc6cbbull},
    {"zeros", 256, 0xd8f706edf03243c5ull, 0x51d88627df287325ull},
    {"dynamic_range", 512, 0xf034d7c63dbfd791ull, 0x86a6f24fa2163746ull},
    {"negative_only", 512, 0xe1f3778439d5819dull, 0xee411711c4c6feb5ull},
    {"positive_offset", 256, 0xa5d97b596b7a356aull, 0x4ad77d2a1a08c585ull},
    {"tiny_1e-6", 256, 0x048aafdb41fb354full, 0xc6b800bb66242520ull},
    {"tiny_1e-20", 256, 0x4d58d5c4d8fdc5dfull, 0xf4d55ede0b9aa4ceull},
    {"constant", 256, 0x3b57d214ef82e93dull, 0x4a7d420870007325ull},
    {"spike", 256, 0x3c5ab54ef864a425ull, 0xba0515463d03717full},
    {"half_integers", 256, 0x7a9c638f09fc9920ull, 0xce117c648c06a535ull},
    {"mixed_block_scales", 512, 0x261d36ff42f6d13dull, 0x30e132c374310778ull},
    {"fp16_overflow", 256, 0x153a18a38897e8f1ull, 0x3bea4718400563a5ull},
    {"large_gaussian", 256, 0x95b4127329a1059full, 0xe695851ff3ab1a80ull},
    {"float_specials", 256, 0xfa9eb732aa0ed327ull, 0xe92d6d8d4e387c0cull},
};
constexpr std::uint64_t kGgmlRandomBlockBytes = 0x2c3abb5580745ea3ull;
constexpr std::uint64_t kGgmlRandomBlockFloats = 0x5d2bd3e1dbd399feull;

TEST(QuantMxfp4, MatchesGgmlOnTheGoldenInputs) {
  const auto inputs = testing::read_inputs();
  ASSERT_EQ(inputs.size(), std::size(kGgml));
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    const auto& in = inputs[r];
    ASSERT_EQ(in.name, kGgml[r].input);
    ASSERT_EQ(in.values.size(), kGgml[r].n);
    const auto q = quantize(in.values);
    EXPECT_EQ(fnv1a(q.data(), q.size()), kGgml[r].bytes) << "input '" << in.name << "': bytes differ from ggml";
    for (Isa isa : isas()) {
      const auto y = dequantize(q, isa);
      EXPECT_EQ(fnv1a(y.data(), y.size() * 4), kGgml[r].floats)
          << "input '" << in.name << "' on " << to_string(isa) << ": floats differ from ggml";
    }
  }
}

// splitmix64 (seed 777 + 39), as the golden files' random blocks.
std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TEST(QuantMxfp4, MatchesGgmlOnEveryScaleByte) {
  std::uint64_t state = 777 + 39;
  std::vector<std::uint8_t> q(256 * sizeof(BlockMXFP4));
  for (std::size_t b = 0; b < 256; ++b) {
    q[17 * b] = static_cast<std::uint8_t>(b);
    for (std::size_t j = 0; j < 16; ++j) q[17 * b + 1 + j] = static_cast<std::uint8_t>(splitmix64(state));
  }
  ASSERT_EQ(fnv1a(q.data(), q.size()), kGgmlRandomBlockBytes) << "the test's blocks are not ggml's";
  for (Isa isa : isas()) {
    const auto y = dequantize(q, isa);
    EXPECT_EQ(fnv1a(y.data(), y.size() * 4), kGgmlRandomBlockFloats) << to_string(isa);
  }
}

}  // namespace
}  // namespace colibri::quant
