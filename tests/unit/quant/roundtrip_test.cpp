// Round trips on Gaussian data: each format's RMSE is printed and checked against the error a
// uniform quantizer with the format's bits and block size gives; plus argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "colibri/quant/quant.hpp"

namespace colibri::quant {
namespace {

// How a format spends its bits: `bits` per weight for the level, scales shared by `block` weights,
// `asymmetric` when it stores a min (levels span max - min instead of -amax..amax).
struct FormatModel {
  DType type;
  int bits;
  int block;
  bool asymmetric;
};

constexpr FormatModel kFormats[] = {
    {DType::q8_0, 8, 32, false}, {DType::q6_k, 6, 16, false}, {DType::q5_k, 5, 32, true}, {DType::q4_k, 4, 32, true},
    {DType::q4_0, 4, 32, false}, {DType::q3_k, 3, 16, false}, {DType::q2_k, 2, 16, true},
};

std::vector<float> gaussian(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

// RMSE of a uniform quantizer with 2^bits levels spread over each block's span: step / sqrt(12).
double uniform_quantizer_rmse(const std::vector<float>& x, const FormatModel& f) {
  double sum_sq_step = 0;
  std::size_t blocks = 0;
  for (std::size_t i = 0; i < x.size(); i += static_cast<std::size_t>(f.block), ++blocks) {
    const auto first = x.begin() + static_cast<std::ptrdiff_t>(i);
    const auto [lo, hi] = std::minmax_element(first, first + f.block);
    double span = 0;
    if (f.asymmetric) {
      span = double(*hi) - std::min(0.0, double(*lo));
    } else {
      span = 2 * std::max(std::fabs(double(*lo)), std::fabs(double(*hi)));
    }
    const double step = span / ((1 << f.bits) - 1);
    sum_sq_step += step * step;
  }
  return std::sqrt(sum_sq_step / static_cast<double>(blocks) / 12.0);
}

std::vector<float> round_trip(DType type, const std::vector<float>& x) {
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<std::uint8_t> q(sdk::row_bytes(type, n));
  std::vector<float> y(x.size());
  EXPECT_TRUE(quantize_row(type, x.data(), q.data(), n).is_ok());
  EXPECT_TRUE(dequantize_row(type, q.data(), y.data(), n).is_ok());
  return y;
}

TEST(QuantRoundTrip, GaussianRmseWithinWhatEachFormatShouldGive) {
  const auto x = gaussian(256 * 256, 42);
  std::map<DType, double> measured;
  for (const auto& f : kFormats) {
    const double err = rmse(x, round_trip(f.type, x));
    const double model = uniform_quantizer_rmse(x, f);
    measured[f.type] = err;
    std::printf("[quant] %-5s %.4f bits/weight  rmse %.6f  (uniform %d-bit quantizer over its blocks: %.6f)\n",
                std::string(sdk::to_string(f.type)).c_str(), bits_per_weight(f.type), err, f.bits, model);
    // Scale search and rounded scales move the error around the uniform model, never far from it.
    EXPECT_LT(err, 1.05 * model) << sdk::to_string(f.type);
    EXPECT_GT(err, 0.6 * model) << sdk::to_string(f.type) << " is implausibly accurate";
  }
  // More bits per weight, less error.
  EXPECT_LT(measured[DType::q8_0] * 2, measured[DType::q6_k]);
  EXPECT_LT(measured[DType::q6_k], measured[DType::q5_k]);
  EXPECT_LT(measured[DType::q5_k], measured[DType::q4_k]);
  EXPECT_LT(measured[DType::q4_k], measured[DType::q3_k]);
  EXPECT_LT(measured[DType::q3_k], measured[DType::q2_k]);
  // At the same 4.5 bits/weight the k-quant's scale search beats q4_0.
  EXPECT_LT(measured[DType::q4_k], measured[DType::q4_0]);
}

TEST(QuantRoundTrip, FloatFormats) {
  const auto x = gaussian(4096, 3);
  EXPECT_EQ(rmse(x, round_trip(DType::f32, x)), 0.0);
  const double f16 = rmse(x, round_trip(DType::f16, x));
  const double bf16 = rmse(x, round_trip(DType::bf16, x));
  std::printf("[quant] f16 rmse %.3g, bf16 rmse %.3g\n", f16, bf16);
  // Half an ulp at most: 2^-11 (fp16) and 2^-8 (bf16) relative to values below 4 in magnitude.
  EXPECT_LT(f16, 4.0 * std::ldexp(1.0, -11) / std::sqrt(3.0));
  EXPECT_LT(bf16, 4.0 * std::ldexp(1.0, -8) / std::sqrt(3.0));
  EXPECT_GT(f16, 0.0);
  EXPECT_LT(f16, bf16);
}

TEST(QuantRoundTrip, ZerosStayZero) {
  const std::vector<float> zeros(512, 0.f);
  for (const auto& f : kFormats) {
    const auto y = round_trip(f.type, zeros);
    for (float v : y) ASSERT_EQ(v, 0.f) << sdk::to_string(f.type);
  }
}

TEST(QuantRoundTrip, SeveralRowsAtOnceEqualRowByRow) {
  const auto x = gaussian(3 * 512, 5);
  for (const auto& f : kFormats) {
    const auto bytes_per_row = sdk::row_bytes(f.type, 512);
    std::vector<std::uint8_t> all(3 * bytes_per_row), one(bytes_per_row);
    ASSERT_TRUE(quantize_row(f.type, x.data(), all.data(), 3 * 512).is_ok());
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(quantize_row(f.type, x.data() + r * 512, one.data(), 512).is_ok());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + static_cast<std::ptrdiff_t>(r * bytes_per_row)));
    }
  }
}

// ---------------------------------------------------------------- errors

TEST(QuantErrors, LengthNotAWholeNumberOfBlocks) {
  std::vector<float> x(300, 1.f), y(300);
  std::vector<std::uint8_t> q(4096);
  auto st = quantize_row(DType::q4_k, x.data(), q.data(), 300);
  EXPECT_EQ(st.code(), sdk::StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("q4_k"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("300"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("256"), std::string::npos) << st.message();
  st = dequantize_row(DType::q8_0, q.data(), y.data(), 33);
  EXPECT_EQ(st.code(), sdk::StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("32"), std::string::npos) << st.message();
  EXPECT_EQ(quantize_row(DType::q4_0, x.data(), q.data(), -32).code(), sdk::StatusCode::invalid_argument);
  // Untouched output on error.
  std::vector<std::uint8_t> untouched(4096, 0x5A);
  EXPECT_FALSE(quantize_row(DType::q6_k, x.data(), untouched.data(), 257).is_ok());
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](std::uint8_t b) { return b == 0x5A; }));
}

TEST(QuantErrors, UnsupportedTypes) {
  std::vector<float> x(256, 1.f), y(256);
  std::vector<std::uint8_t> q(4096);
  for (DType t : {DType::q4_1, DType::q5_0, DType::q8_k, DType::i32, DType::f64, static_cast<DType>(999)}) {
    EXPECT_FALSE(is_supported(t));
    auto st = quantize_row(t, x.data(), q.data(), 256);
    EXPECT_EQ(st.code(), sdk::StatusCode::unsupported) << sdk::to_string(t);
    EXPECT_NE(st.message().find("supported: f32, f16, bf16"), std::string::npos) << st.message();
    // llama.cpp's fallback block types are read (convert re-quantizes them), never written.
    const bool read_only = t == DType::q4_1 || t == DType::q5_0;
    EXPECT_EQ(can_dequantize(t), read_only) << sdk::to_string(t);
    EXPECT_EQ(dequantize_row(t, q.data(), y.data(), 256).code(),
              read_only ? sdk::StatusCode::ok : sdk::StatusCode::unsupported);
  }
  for (const auto& f : kFormats) EXPECT_TRUE(is_supported(f.type));
}

// Hand-made blocks of the read-only types decode to the values ggml's layouts give: d (and m) as f16, 16 bytes of
// nibbles (element j low, j + 16 high), q5's fifth bits in qh (bit j for element j).
TEST(QuantReadOnly, HandMadeBlocksDecodeAsGgml) {
  const std::uint16_t half = 0x3800, one = 0x3C00;  // 0.5 and 1.0 as f16
  std::vector<float> y(32);
  auto block = [](std::initializer_list<std::uint8_t> head) {
    std::vector<std::uint8_t> b(head);
    for (int j = 0; j < 16; ++j) b.push_back(static_cast<std::uint8_t>((j & 0x0F) | ((15 - j) << 4)));
    return b;
  };
  const auto lo = static_cast<std::uint8_t>(half & 0xFF), hi = static_cast<std::uint8_t>(half >> 8);
  const auto m_lo = static_cast<std::uint8_t>(one & 0xFF), m_hi = static_cast<std::uint8_t>(one >> 8);
  // q4_1: x = q * d + m.
  auto q41 = block({lo, hi, m_lo, m_hi});
  ASSERT_TRUE(dequantize_row(DType::q4_1, q41.data(), y.data(), 32).is_ok());
  EXPECT_EQ(y[3], 3 * 0.5f + 1);
  EXPECT_EQ(y[16 + 3], 12 * 0.5f + 1);
  // q5_0: x = (q | bit << 4) - 16, times d; qh = bit 1 and bit 17 set.
  auto q50 = block({lo, hi, 0x02, 0x00, 0x02, 0x00});
  ASSERT_TRUE(dequantize_row(DType::q5_0, q50.data(), y.data(), 32).is_ok());
  EXPECT_EQ(y[0], (0 - 16) * 0.5f);
  EXPECT_EQ(y[1], (1 + 16 - 16) * 0.5f);
  EXPECT_EQ(y[17], (14 + 16 - 16) * 0.5f);
  EXPECT_EQ(y[18], (13 - 16) * 0.5f);
  // q5_1: x = (q | bit << 4) * d + m.
  auto q51 = block({lo, hi, m_lo, m_hi, 0x00, 0x00, 0x01, 0x00});
  ASSERT_TRUE(dequantize_row(DType::q5_1, q51.data(), y.data(), 32).is_ok());
  EXPECT_EQ(y[16], (15 + 16) * 0.5f + 1);
  EXPECT_EQ(y[2], 2 * 0.5f + 1);
  // iq4_nl: x = d * table[q].
  auto iq = block({lo, hi});
  ASSERT_TRUE(dequantize_row(DType::iq4_nl, iq.data(), y.data(), 32).is_ok());
  EXPECT_EQ(y[0], 0.5f * -127);
  EXPECT_EQ(y[8], 0.5f * 1);
  EXPECT_EQ(y[16], 0.5f * 113);
  EXPECT_FALSE(is_supported(DType::iq4_nl));
  EXPECT_EQ(quantize_row(DType::iq4_nl, y.data(), iq.data(), 32).code(), sdk::StatusCode::unsupported);
}

TEST(QuantErrors, NullBuffersAndEmptyRows) {
  std::vector<float> x(32, 1.f);
  EXPECT_EQ(quantize_row(DType::q8_0, nullptr, x.data(), 32).code(), sdk::StatusCode::invalid_argument);
  EXPECT_EQ(dequantize_row(DType::q8_0, x.data(), nullptr, 32).code(), sdk::StatusCode::invalid_argument);
  EXPECT_TRUE(quantize_row(DType::q8_0, nullptr, nullptr, 0).is_ok());
  EXPECT_TRUE(dequantize_row(DType::q2_k, nullptr, nullptr, 0).is_ok());
}

TEST(QuantErrors, UnavailableIsaIsRefused) {
  std::vector<std::uint8_t> q(34, 0);
  std::vector<float> y(32);
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    const auto st = dequantize_row(DType::q8_0, q.data(), y.data(), 32, isa);
    EXPECT_EQ(st.is_ok(), isa_available(isa));
    if (!st.is_ok()) {
      EXPECT_EQ(st.code(), sdk::StatusCode::unsupported);
    }
  }
}

TEST(QuantFormats, BitsPerWeight) {
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::q4_k), 4.5);
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::q6_k), 6.5625);
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::q2_k), 2.625);
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::q3_k), 3.4375);
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::q8_0), 8.5);
  EXPECT_DOUBLE_EQ(bits_per_weight(DType::f16), 16.0);
  EXPECT_EQ(bits_per_weight(static_cast<DType>(999)), 0.0);
}

}  // namespace
}  // namespace colibri::quant
