// Byte-for-byte comparison with vectors produced by GGML's own reference code (tests/data/quant).
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "colibri/quant/float16.hpp"
#include "colibri/quant/quant.hpp"
#include "fnv1a.hpp"
#include "golden_io.hpp"

namespace colibri::quant {
namespace {

using testing::GoldenType;

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa_available(isa)) out.push_back(isa);
  }
  return out;
}

// Index of the first element whose bits differ, or -1.
long first_bit_mismatch(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return static_cast<long>(i);
  }
  return -1;
}

std::string describe_float(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(f), std::bit_cast<std::uint32_t>(f));
  return buf;
}

class GoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenTest, QuantizeMatchesGgmlBytes) {
  const std::string name = GetParam();
  const auto type = sdk::parse_dtype(name);
  ASSERT_TRUE(type.has_value());
  const auto inputs = testing::read_inputs();
  const GoldenType golden = testing::read_golden(name);
  ASSERT_EQ(golden.ggml_type, static_cast<std::uint32_t>(*type)) << "golden file holds another type";
  ASSERT_FALSE(golden.cases.empty());
  for (const auto& c : golden.cases) {
    ASSERT_LT(c.input_index, inputs.size());
    const auto& in = inputs[c.input_index];
    ASSERT_EQ(in.values.size(), c.n);
    ASSERT_EQ(sdk::row_bytes(*type, c.n), c.quantized.size());
    std::vector<std::uint8_t> ours(c.quantized.size(), 0xCD);
    ASSERT_TRUE(quantize_row(*type, in.values.data(), ours.data(), c.n).is_ok());
    for (std::size_t i = 0; i < ours.size(); ++i) {
      ASSERT_EQ(ours[i], c.quantized[i]) << name << " input '" << in.name << "': byte " << i << " (block "
                                         << i / sdk::dtype_traits(*type)->block_bytes << ") differs from ggml";
    }
  }
}

TEST_P(GoldenTest, DequantizeMatchesGgmlFloatsOnEveryPath) {
  const std::string name = GetParam();
  const auto type = sdk::parse_dtype(name);
  ASSERT_TRUE(type.has_value());
  const auto inputs = testing::read_inputs();
  const GoldenType golden = testing::read_golden(name);
  std::vector<const testing::GoldenEntry*> entries;
  for (const auto& c : golden.cases) entries.push_back(&c);
  for (const auto& c : golden.random_blocks) entries.push_back(&c);
  if (*type != DType::f32 && *type != DType::f16 && *type != DType::bf16) {
    EXPECT_FALSE(golden.random_blocks.empty()) << "random-block vectors missing";
  }
  for (Isa isa : available_isas()) {
    for (const auto* c : entries) {
      std::vector<float> ours(c->n, -1.0f);
      ASSERT_TRUE(dequantize_row(*type, c->quantized.data(), ours.data(), c->n, isa).is_ok());
      const long bad = first_bit_mismatch(ours, c->dequantized);
      ASSERT_EQ(bad, -1) << name << " on " << to_string(isa) << ", element " << bad << ": ours "
                         << describe_float(ours[static_cast<std::size_t>(bad)]) << ", ggml "
                         << describe_float(c->dequantized[static_cast<std::size_t>(bad)]);
    }
  }
}

#if defined(__x86_64__)
// Flush-to-zero / denormals-are-zero set by the caller must not change the bytes (k-quant sums of
// squares of tiny weights are subnormal), and the caller's mode comes back unchanged.
TEST_P(GoldenTest, CallerFlushToZeroModeDoesNotChangeResults) {
  const std::string name = GetParam();
  const auto type = sdk::parse_dtype(name);
  ASSERT_TRUE(type.has_value());
  const auto inputs = testing::read_inputs();
  const GoldenType golden = testing::read_golden(name);
  const unsigned saved = _mm_getcsr();
  const unsigned ftz_daz = saved | (1u << 15) | (1u << 6);
  for (const auto& c : golden.cases) {
    std::vector<std::uint8_t> ours(c.quantized.size());
    std::vector<float> back(c.n);
    _mm_setcsr(ftz_daz);
    const bool q_ok = quantize_row(*type, inputs[c.input_index].values.data(), ours.data(), c.n).is_ok();
    const unsigned after_quantize = _mm_getcsr();
    const bool d_ok = dequantize_row(*type, c.quantized.data(), back.data(), c.n).is_ok();
    const unsigned after_dequantize = _mm_getcsr();
    _mm_setcsr(saved);
    ASSERT_TRUE(q_ok && d_ok);
    EXPECT_EQ(after_quantize, ftz_daz);
    EXPECT_EQ(after_dequantize, ftz_daz);
    EXPECT_EQ(ours, c.quantized) << name << " input '" << inputs[c.input_index].name << "' under FTZ/DAZ";
    EXPECT_EQ(first_bit_mismatch(back, c.dequantized), -1) << name << " under FTZ/DAZ";
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(AllFormats, GoldenTest,
                         ::testing::Values("f32", "f16", "bf16", "q8_0", "q4_0", "q2_k", "q3_k", "q4_k", "q5_k",
                                           "q6_k"),
                         [](const auto& info) { return std::string(info.param); });

// ---------------------------------------------------------------- conversion sweeps

using testing::fnv1a;

std::map<std::string, std::uint64_t> read_conversion_hashes() {
  std::ifstream in(testing::golden_dir() + "/conversions.txt");
  std::map<std::string, std::uint64_t> out;
  std::string key, hex;
  while (in >> key >> hex) out[key] = std::stoull(hex, nullptr, 16);
  return out;
}

TEST(GoldenConversions, HalfToFloatAllValuesMatchGgml) {
  const auto hashes = read_conversion_hashes();
  ASSERT_EQ(hashes.count("fp16_to_fp32_all"), 1u);
  ASSERT_EQ(hashes.count("bf16_to_fp32_all"), 1u);
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t u = 0; u < 65536; ++u) all[u] = static_cast<std::uint16_t>(u);
  for (Isa isa : available_isas()) {
    std::vector<float> out(65536);
    ASSERT_TRUE(fp16_to_fp32_row(all.data(), out.data(), 65536, isa));
    EXPECT_EQ(fnv1a(out.data(), out.size() * 4), hashes.at("fp16_to_fp32_all")) << to_string(isa);
    ASSERT_TRUE(bf16_to_fp32_row(all.data(), out.data(), 65536, isa));
    EXPECT_EQ(fnv1a(out.data(), out.size() * 4), hashes.at("bf16_to_fp32_all")) << to_string(isa);
  }
}

TEST(GoldenConversions, FloatToHalfSweepMatchesGgml) {
  const auto hashes = read_conversion_hashes();
  ASSERT_EQ(hashes.count("fp32_to_fp16_stride4093"), 1u);
  ASSERT_EQ(hashes.count("fp32_to_bf16_stride4093"), 1u);
  std::vector<float> sweep;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4093)
    sweep.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  const auto n = static_cast<std::int64_t>(sweep.size());
  for (Isa isa : available_isas()) {
    std::vector<std::uint16_t> out(sweep.size());
    ASSERT_TRUE(fp32_to_fp16_row(sweep.data(), out.data(), n, isa));
    EXPECT_EQ(fnv1a(out.data(), out.size() * 2), hashes.at("fp32_to_fp16_stride4093")) << to_string(isa);
    ASSERT_TRUE(fp32_to_bf16_row(sweep.data(), out.data(), n, isa));
    EXPECT_EQ(fnv1a(out.data(), out.size() * 2), hashes.at("fp32_to_bf16_stride4093")) << to_string(isa);
  }
}

}  // namespace
}  // namespace colibri::quant
