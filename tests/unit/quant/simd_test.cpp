// Every SIMD path gives the scalar reference's bits: random block bytes, all fp16/bf16 values,
// fp32 sweeps with NaNs, and lengths that leave vector tails.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "colibri/quant/blocks.hpp"
#include "colibri/quant/float16.hpp"
#include "colibri/quant/quant.hpp"

namespace colibri::quant {
namespace {

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    if (isa_available(isa)) out.push_back(isa);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(QuantIsa, BestIsaIsAvailableAndNamed) {
  EXPECT_TRUE(isa_available(Isa::scalar));
  EXPECT_TRUE(isa_available(best_isa()));
  EXPECT_EQ(to_string(Isa::avx512), "avx512");
  std::printf("[quant] dequantize path on this CPU: %s\n", std::string(to_string(best_isa())).c_str());
  if (simd_isas().empty()) GTEST_SKIP() << "this CPU has no AVX2: only the scalar path is tested";
}

// Random bytes with random finite fp16 scales at the positions of d / dmin.
std::vector<std::uint8_t> random_blocks(DType type, std::int64_t n, std::mt19937& rng, bool tiny_scales) {
  const auto* t = sdk::dtype_traits(type);
  std::vector<std::uint8_t> bytes(sdk::row_bytes(type, n));
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  std::size_t d_off = 0, n_halves = 1;
  switch (type) {
    case DType::q2_k: d_off = offsetof(BlockQ2_K, d), n_halves = 2; break;
    case DType::q3_k: d_off = offsetof(BlockQ3_K, d); break;
    case DType::q4_k: d_off = offsetof(BlockQ4_K, d), n_halves = 2; break;
    case DType::q5_k: d_off = offsetof(BlockQ5_K, d), n_halves = 2; break;
    case DType::q6_k: d_off = offsetof(BlockQ6_K, d); break;
    case DType::mxfp4: n_halves = 0; break;  // every scale byte is a finite power of two: keep the random ones
    default: break;
  }
  std::normal_distribution<float> normal(0.f, tiny_scales ? 1e-6f : 1.f);
  for (std::size_t blk = 0; blk < bytes.size() / t->block_bytes; ++blk) {
    for (std::size_t h = 0; h < n_halves; ++h) {
      const std::uint16_t v = fp32_to_fp16(normal(rng));
      std::memcpy(bytes.data() + blk * t->block_bytes + d_off + 2 * h, &v, 2);
    }
  }
  return bytes;
}

class SimdDequantTest : public ::testing::TestWithParam<DType> {};

TEST_P(SimdDequantTest, EqualsScalarBitForBit) {
  const DType type = GetParam();
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD path on this CPU";
  std::mt19937 rng(1234);
  const std::int64_t block = sdk::dtype_traits(type)->block_elems;
  for (std::int64_t n : {block, 3 * block, 64 * block}) {
    for (bool tiny : {false, true}) {
      const auto bytes = random_blocks(type, n, rng, tiny);
      std::vector<float> ref(static_cast<std::size_t>(n));
      ASSERT_TRUE(dequantize_row(type, bytes.data(), ref.data(), n, Isa::scalar).is_ok());
      for (Isa isa : simd_isas()) {
        std::vector<float> got(static_cast<std::size_t>(n), 7.f);
        ASSERT_TRUE(dequantize_row(type, bytes.data(), got.data(), n, isa).is_ok());
        EXPECT_TRUE(same_bits(ref, got)) << sdk::to_string(type) << " on " << to_string(isa) << ", n = " << n;
      }
      std::vector<float> dispatched(static_cast<std::size_t>(n));
      ASSERT_TRUE(dequantize_row(type, bytes.data(), dispatched.data(), n).is_ok());
      EXPECT_TRUE(same_bits(ref, dispatched));
    }
  }
}

TEST_P(SimdDequantTest, UnalignedSourceAndDestination) {
  const DType type = GetParam();
  std::mt19937 rng(99);
  const std::int64_t n = 4 * sdk::dtype_traits(type)->block_elems;
  const auto bytes = random_blocks(type, n, rng, false);
  std::vector<std::uint8_t> shifted(bytes.size() + 1);
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  std::vector<float> ref(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n) + 1);
  ASSERT_TRUE(dequantize_row(type, bytes.data(), ref.data(), n, Isa::scalar).is_ok());
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_available(isa)) continue;
    ASSERT_TRUE(dequantize_row(type, shifted.data() + 1, out.data() + 1, n, isa).is_ok());
    EXPECT_EQ(std::memcmp(ref.data(), out.data() + 1, ref.size() * 4), 0) << to_string(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(BlockFormats, SimdDequantTest,
                         ::testing::Values(DType::q8_0, DType::q4_0, DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k,
                                           DType::q6_k, DType::mxfp4),
                         [](const auto& info) { return std::string(sdk::to_string(info.param)); });

TEST(SimdConversion, AllHalfValuesEqualScalar) {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t u = 0; u < 65536; ++u) all[u] = static_cast<std::uint16_t>(u);
  std::vector<float> ref16(65536), refb(65536);
  for (std::uint32_t u = 0; u < 65536; ++u) {
    ref16[u] = fp16_to_fp32(all[u]);
    refb[u] = bf16_to_fp32(all[u]);
  }
  // The scalar function is exact: every finite fp16 converts back to itself.
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const bool nan = (u & 0x7C00) == 0x7C00 && (u & 0x03FF) != 0;
    if (!nan) {
      ASSERT_EQ(fp32_to_fp16(ref16[u]), u) << std::hex << u;
    }
  }
  for (Isa isa : simd_isas()) {
    for (std::int64_t n : {std::int64_t{65536}, std::int64_t{65535}, std::int64_t{13}}) {
      std::vector<float> got(65536, 0.f);
      ASSERT_TRUE(fp16_to_fp32_row(all.data(), got.data(), n, isa));
      EXPECT_EQ(std::memcmp(got.data(), ref16.data(), static_cast<std::size_t>(n) * 4), 0) << to_string(isa);
      ASSERT_TRUE(bf16_to_fp32_row(all.data(), got.data(), n, isa));
      EXPECT_EQ(std::memcmp(got.data(), refb.data(), static_cast<std::size_t>(n) * 4), 0) << to_string(isa);
    }
  }
}

TEST(SimdConversion, FloatToHalfEqualsScalarIncludingNaNs) {
  std::mt19937 rng(7);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  // Values around fp16 rounding ties, subnormals and overflow, and NaNs with payloads mid-vector.
  for (std::uint32_t base : {0x33000000u, 0x38800000u, 0x477fe000u, 0x3f800000u, 0x00000000u}) {
    for (std::uint32_t d = 0; d < 0x4000; d += 7) x.push_back(std::bit_cast<float>(base + d));
  }
  for (std::uint32_t nan : {0x7fc00001u, 0xffa00000u, 0x7f800001u}) x.insert(x.begin() + 5, std::bit_cast<float>(nan));
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<std::uint16_t> ref16(x.size()), refb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    ref16[i] = fp32_to_fp16(x[i]);
    refb[i] = fp32_to_bf16(x[i]);
  }
  EXPECT_EQ(fp32_to_fp16(std::bit_cast<float>(0xffa00000u)), 0xFE00);  // canonical quiet NaN, sign kept
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7FC0);  // signalling NaN made quiet
  EXPECT_EQ(fp32_to_bf16(1.00390625f), 0x3F80);                        // tie rounds to even
  EXPECT_EQ(fp32_to_bf16(1.01171875f), 0x3F82);                        // tie rounds to even (up)
  for (Isa isa : simd_isas()) {
    for (std::int64_t len : {n, n - 3, std::int64_t{7}}) {
      std::vector<std::uint16_t> got(x.size(), 0);
      ASSERT_TRUE(fp32_to_fp16_row(x.data(), got.data(), len, isa));
      EXPECT_EQ(std::memcmp(got.data(), ref16.data(), static_cast<std::size_t>(len) * 2), 0) << to_string(isa);
      ASSERT_TRUE(fp32_to_bf16_row(x.data(), got.data(), len, isa));
      EXPECT_EQ(std::memcmp(got.data(), refb.data(), static_cast<std::size_t>(len) * 2), 0) << to_string(isa);
    }
  }
}

}  // namespace
}  // namespace colibri::quant
