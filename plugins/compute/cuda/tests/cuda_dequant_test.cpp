// The CUDA kernels' dequantization (cuda_dequant.cuh), compiled for the host: every chunk of every
// weight format bit-identical to colibri::quant. Runs without a GPU, so the bit fiddling of each
// block layout is checked on every CI run.
#include "cuda_dequant.cuh"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "colibri/quant/quant.hpp"

namespace {

using colibri::sdk::DType;
namespace dq = colibri::cuda::dequant;

template <class F>
void expect_chunks_match(DType type, std::int64_t n, unsigned seed, std::size_t offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = dist(rng) * (i % 97 == 0 ? 40.0f : 1.0f);  // a few outliers
  // Rows at any offset in a buffer: word-aligned and not (the kernels then join aligned words).
  std::vector<std::uint32_t> storage((colibri::sdk::row_bytes(type, n) + 16) / 4);
  std::uint8_t* row = reinterpret_cast<std::uint8_t*>(storage.data()) + offset;
  ASSERT_TRUE(colibri::quant::quantize_row(type, x.data(), row, n));
  std::vector<float> want(x.size());
  ASSERT_TRUE(colibri::quant::dequantize_row(type, row, want.data(), n));
  const std::int64_t chunks = (n + dq::kChunk - 1) / dq::kChunk;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const int valid = static_cast<int>(std::min<std::int64_t>(dq::kChunk, n - c * dq::kChunk));
    float got[dq::kChunk];
    F::chunk(row, static_cast<int>(c), valid, got);
    for (int j = 0; j < dq::kChunk; ++j) {
      const float expect = j < valid ? want[static_cast<std::size_t>(c * dq::kChunk + j)] : 0.0f;
      std::uint32_t a, b;
      std::memcpy(&a, &got[j], 4);
      std::memcpy(&b, &expect, 4);
      ASSERT_EQ(a, b) << colibri::sdk::to_string(type) << " chunk " << c << " element " << j << ": got " << got[j]
                      << ", want " << expect;
    }
  }
}

TEST(CudaDequant, EveryChunkOfEveryFormatIsBitIdenticalToColibriQuant) {
  for (std::size_t offset : {0, 2, 6}) {
    for (unsigned seed : {1u, 2u}) {
      expect_chunks_match<dq::Q4_K>(DType::q4_k, 256 * 6, seed, offset);
      expect_chunks_match<dq::Q5_K>(DType::q5_k, 256 * 6, seed, offset);
      expect_chunks_match<dq::Q6_K>(DType::q6_k, 256 * 6, seed, offset);
      expect_chunks_match<dq::Q2_K>(DType::q2_k, 256 * 6, seed, offset);
      expect_chunks_match<dq::Q3_K>(DType::q3_k, 256 * 6, seed, offset);
      expect_chunks_match<dq::Q8_0>(DType::q8_0, 32 * 13, seed, offset);
      expect_chunks_match<dq::Q4_0>(DType::q4_0, 32 * 13, seed, offset);
    }
  }
}

TEST(CudaDequant, PlainFloatRowsIncludingAPartialLastChunk) {
  for (std::int64_t n : {std::int64_t{96}, std::int64_t{100}, std::int64_t{4099}}) {
    expect_chunks_match<dq::F32>(DType::f32, n, 7, 0);
    expect_chunks_match<dq::F16>(DType::f16, n, 8, 0);
    expect_chunks_match<dq::F16>(DType::f16, n, 8, 2);
    expect_chunks_match<dq::BF16>(DType::bf16, n, 9, 2);
  }
}

}  // namespace
