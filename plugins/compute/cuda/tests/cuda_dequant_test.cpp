// The CUDA kernels' dequantization (cuda_dequant.cuh) and integer dot products (cuda_q8dot.cuh), compiled for the
// host: every chunk of every weight format bit-identical to colibri::quant, every lane's integer dot product equal to
// the reference weights times its activations. Runs without a GPU, so the bit fiddling of each block layout is
// checked on every CI run.
#include "cuda_dequant.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "cuda_q8dot.cuh"

namespace {

using colibri::sdk::DType;
namespace dq = colibri::cuda::dequant;
namespace q8 = colibri::cuda::q8dot;

// `lanes` lanes, each taking `run` elements at off0(lane) and `run` at off1(lane), cover a 256-element unit exactly
// once.
template <class Off0, class Off1>
void expect_unit_covered_once(int lanes, int run, Off0 off0, Off1 off1) {
  std::vector<int> covered(dq::kUnit, 0);
  for (int lane = 0; lane < lanes; ++lane) {
    for (int e = 0; e < run; ++e) {
      ++covered[static_cast<std::size_t>(off0(lane) + e)];
      ++covered[static_cast<std::size_t>(off1(lane) + e)];
    }
  }
  for (int e = 0; e < dq::kUnit; ++e) ASSERT_EQ(covered[static_cast<std::size_t>(e)], 1) << "element " << e;
}

// Values quantized to `type` at `offset` bytes into word storage (word-aligned or not: the kernels then join aligned
// words), and what colibri::quant dequantizes them to: the reference every test compares with.
struct QuantizedRow {
  std::vector<std::uint32_t> storage;
  std::uint8_t* bytes = nullptr;
  std::vector<float> want;
};
QuantizedRow quantized_row(DType type, const std::vector<float>& values, std::size_t offset) {
  const auto n = static_cast<std::int64_t>(values.size());
  QuantizedRow r;
  r.storage.resize((colibri::sdk::row_bytes(type, n) + 16) / 4);
  r.bytes = reinterpret_cast<std::uint8_t*>(r.storage.data()) + offset;
  EXPECT_TRUE(colibri::quant::quantize_row(type, values.data(), r.bytes, n));
  r.want.resize(values.size());
  EXPECT_TRUE(colibri::quant::dequantize_row(type, r.bytes, r.want.data(), n));
  return r;
}

template <class F>
void expect_chunks_match(DType type, std::int64_t n, unsigned seed, std::size_t offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = dist(rng) * (i % 97 == 0 ? 40.0f : 1.0f);  // a few outliers
  const auto q = quantized_row(type, x, offset);
  const std::uint8_t* row = q.bytes;
  const std::vector<float>& want = q.want;
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

// The lane layouts: the 32 lanes cover each 256-element unit exactly once, and every weight a lane
// produces is the reference's weight at the element the lane's offsets name.
template <class F>
void expect_lanes_match(DType type, std::int64_t units, std::size_t offset) {
  const std::int64_t n = units * dq::kUnit;
  std::mt19937 rng(static_cast<unsigned>(units + offset));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = dist(rng) * (i % 89 == 0 ? 30.0f : 1.0f);
  const auto q = quantized_row(type, x, offset);
  const std::uint8_t* row = q.bytes;
  const std::vector<float>& want = q.want;
  ASSERT_NO_FATAL_FAILURE(expect_unit_covered_once(32, 4, F::off0, F::off1));
  for (std::int64_t u = 0; u < units; ++u) {
    for (int lane = 0; lane < 32; ++lane) {
      float got[8];
      F::lane(row, static_cast<int>(u), lane, got);
      for (int j = 0; j < 8; ++j) {
        const std::int64_t e = u * dq::kUnit + (j < 4 ? F::off0(lane) + j : F::off1(lane) + j - 4);
        const float expect = want[static_cast<std::size_t>(e)];
        std::uint32_t a, b;
        std::memcpy(&a, &got[j], 4);
        std::memcpy(&b, &expect, 4);
        ASSERT_EQ(a, b) << colibri::sdk::to_string(type) << " unit " << u << " lane " << lane << " weight " << j
                        << " (element " << e << "): got " << got[j] << ", want " << expect;
      }
    }
  }
}

TEST(CudaDequant, LaneLayoutsCoverEachUnitOnceAndMatchColibriQuant) {
  for (std::size_t offset : {0, 2}) {
    expect_lanes_match<dq::Q4_K>(DType::q4_k, 5, offset);
    expect_lanes_match<dq::Q5_K>(DType::q5_k, 5, offset);
    expect_lanes_match<dq::Q6_K>(DType::q6_k, 5, offset);
    expect_lanes_match<dq::Q8_0>(DType::q8_0, 3, offset);
    expect_lanes_match<dq::Q4_0>(DType::q4_0, 3, offset);
    expect_lanes_match<dq::F16>(DType::f16, 2, offset);
    expect_lanes_match<dq::BF16>(DType::bf16, 2, offset);
  }
  expect_lanes_match<dq::F32>(DType::f32, 2, 0);
  static_assert(!dq::Q2_K::kLanes && !dq::Q3_K::kLanes, "q2_k and q3_k take the chunk path");
}

// The integer lanes: the 8 lanes of a unit cover its 256 elements exactly once, and each lane's part() is the
// reference's weights at the elements its offsets name times the activations there (two tokens at once, as the
// kernel's token tiles do), up to float rounding; a wrong bit, byte or scale in a layout is far outside that.
template <class F>
void expect_q8_parts_match(DType type, std::int64_t units, std::size_t offset, unsigned seed) {
  const std::int64_t n = units * q8::kUnit;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = dist(rng) * (i % 83 == 0 ? 25.0f : 1.0f) + (i % 7 == 0 ? 0.3f : 0.0f);
  ASSERT_EQ(colibri::sdk::row_bytes(type, n), static_cast<std::size_t>(units * F::kUnitBytes));
  const auto q = quantized_row(type, w, offset);
  const std::uint8_t* row = q.bytes;
  const std::vector<float>& want = q.want;
  std::uniform_int_distribution<int> byte(-127, 127);
  std::vector<std::int8_t> x[2];
  for (auto& xi : x) {
    xi.resize(static_cast<std::size_t>(n));
    for (auto& v : xi) v = static_cast<std::int8_t>(byte(rng));
  }
  static_assert(q8::kUnit == dq::kUnit);
  constexpr int kLanes = q8::UnitLanes<F>::value, kRun = q8::Span<F>::value;
  ASSERT_NO_FATAL_FAILURE(expect_unit_covered_once(kLanes, kRun, F::xoff0, F::xoff1));
  const auto xrun = [](const std::int8_t* p) {
    q8::XQ<kRun> v{};
    std::memcpy(v.q, p, kRun);
    for (int e = 0; e < kRun; ++e) v.sum += p[e];
    return v;
  };
  for (std::int64_t u = 0; u < units; ++u) {
    for (int j = 0; j < kLanes; ++j) {
      q8::XQ<kRun> xa[2], xb[2];
      for (int i = 0; i < 2; ++i) {
        xa[i] = xrun(x[i].data() + u * q8::kUnit + F::xoff0(j));
        xb[i] = xrun(x[i].data() + u * q8::kUnit + F::xoff1(j));
      }
      float got[2];
      F::template part<2>(row + u * F::kUnitBytes, j, false, xa, xb, got);
      for (int i = 0; i < 2; ++i) {
        double expect = 0.0, magnitude = 0.0;
        for (int off : {F::xoff0(j), F::xoff1(j)}) {
          for (int e = 0; e < kRun; ++e) {
            const auto at = static_cast<std::size_t>(u * q8::kUnit + off + e);
            expect += static_cast<double>(want[at]) * x[i][at];
            magnitude += std::fabs(static_cast<double>(want[at]) * x[i][at]) + std::fabs(want[at]) * 127.0;
          }
        }
        ASSERT_NEAR(got[i], expect, 1e-6 * magnitude) << colibri::sdk::to_string(type) << " unit " << u << " lane " << j
                                                      << " token " << i << " offset " << offset;
      }
    }
  }
}

TEST(CudaQ8Dot, EveryLaneOfEveryFormatIsTheReferenceWeightsTimesItsActivations) {
  for (std::size_t offset : {0, 2}) {
    for (unsigned seed : {1u, 2u}) {
      expect_q8_parts_match<q8::Q4_K>(DType::q4_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q4_K_Pairs>(DType::q4_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q5_K_Pairs>(DType::q5_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q5_K>(DType::q5_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q6_K>(DType::q6_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q2_K>(DType::q2_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q3_K>(DType::q3_k, 5, offset, seed);
      expect_q8_parts_match<q8::Q8_0>(DType::q8_0, 3, offset, seed);
      expect_q8_parts_match<q8::Q4_0>(DType::q4_0, 3, offset, seed);
    }
  }
  // mxfp4's 17-byte blocks start at every byte offset of a word.
  for (std::size_t offset : {0, 1, 2, 3}) expect_q8_parts_match<q8::MXFP4>(DType::mxfp4, 3, offset, 5);
}

TEST(CudaQ8Dot, BytePermPicksTheSelectedBytesOfBothWords) {
  // The documented examples: bytes 1, 3, 5, 7; bit 3 of a selector nibble and the selector's upper half ignored.
  EXPECT_EQ(q8::byte_perm(0x03020100u, 0x07060504u, 0x7531u), 0x07050301u);
  EXPECT_EQ(q8::byte_perm(0x03020100u, 0x07060504u, 0xFFFF8F9Au), 0x00070102u);
  EXPECT_EQ(q8::byte_perm(0xDDCCBBAAu, 0x44332211u, 0x0123u), 0xAABBCCDDu);
}

// Every 4-bit code in every nibble of the four that e2m1_bytes reads, with the other three set to other codes, gives
// the reference's value (dequant::e2m1_value, which the chunk path's bit-identical tests check) as a signed byte.
TEST(CudaQ8Dot, E2m1BytesAreTheReferenceValuesOfEveryCodeInEveryPosition) {
  for (int pos = 0; pos < 4; ++pos) {
    for (int code = 0; code < 16; ++code) {
      for (std::uint32_t others : {0x0000u, 0xFFFFu, 0x8F3Cu, 0x1234u}) {
        std::uint32_t codes = others & ~(0xFu << (4 * pos));
        codes |= static_cast<std::uint32_t>(code) << (4 * pos);
        const std::uint32_t got = q8::e2m1_bytes(codes | 0xABCD0000u);  // bits 16-31 are not read
        for (int b = 0; b < 4; ++b) {
          const int want = dq::e2m1_value(static_cast<int>(codes >> (4 * b)) & 0xF);
          ASSERT_EQ(static_cast<int>(static_cast<std::int8_t>(got >> (8 * b))), want)
              << "codes 0x" << std::hex << codes << " byte " << b;
        }
      }
    }
  }
}

// The matmul kernel's lanes as a whole (q8dot::lane_sums, run here lane by lane, then the warp's shuffle tree):
// activations quantized the CPU backend's way, every unit, token and row reached, rows and tokens past the end
// clamped, and an output element's bits the same in every token and row tile (the batch promise).
template <class F>
void expect_warp_matches(DType type, std::int64_t k = 1024) {
  ASSERT_TRUE(q8::takes_k<F>(k));
  const std::int64_t n = 5, t = 3;
  std::mt19937 rng(41);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(k * n)), x(static_cast<std::size_t>(k * t));
  for (auto& v : w) v = dist(rng) * 0.1f;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = dist(rng) * (i % 61 == 0 ? 8.0f : 1.0f);
  const std::size_t rb = colibri::sdk::row_bytes(type, k);
  const auto wrows = quantized_row(type, w, 0);
  const std::uint8_t* wq = wrows.bytes;
  const std::vector<float>& wd = wrows.want;
  // X as the kernels take it: d = amax / 127 per block, q = x * (1 / d) rounded half to even.
  std::vector<std::int8_t> xq(x.size());
  std::vector<float> xd(x.size() / F::kXBlock);
  std::vector<std::int32_t> xs(x.size() / 16);
  for (std::size_t b = 0; b < xd.size(); ++b) {
    float amax = 0.0f;
    for (int e = 0; e < F::kXBlock; ++e) amax = std::max(amax, std::fabs(x[b * F::kXBlock + e]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    xd[b] = d;
    for (int e = 0; e < F::kXBlock; ++e) {
      xq[b * F::kXBlock + e] = static_cast<std::int8_t>(std::nearbyint(x[b * F::kXBlock + e] * id));
    }
  }
  for (std::size_t g = 0; g < xs.size(); ++g) {
    for (int e = 0; e < 16; ++e) xs[g] += xq[g * 16 + e];
  }
  // One warp's output for rows row0.. and tokens t0..: lane sums, then the fixed xor tree.
  auto warp = [&]<int NT, int R, int U = 1>(long long row0, int t0) {
    float lanes[32][R][NT];
    for (int l = 0; l < 32; ++l) {
      q8::lane_sums<F, NT, R, U>(wq, rb, xq.data(), xd.data(), xs.data(), static_cast<int>(k), static_cast<int>(n),
                                 static_cast<int>(t), row0, t0, l, lanes[l]);
    }
    for (int off = 16; off >= 1; off >>= 1) {
      float next[32][R][NT];
      for (int l = 0; l < 32; ++l) {
        for (int r = 0; r < R; ++r) {
          for (int i = 0; i < NT; ++i) next[l][r][i] = lanes[l][r][i] + lanes[l ^ off][r][i];
        }
      }
      std::memcpy(lanes, next, sizeof(lanes));
    }
    std::vector<float> out(R * NT);
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < NT; ++i) out[static_cast<std::size_t>(r * NT + i)] = lanes[0][r][i];
    }
    return out;
  };
  for (long long row = 0; row < n; ++row) {
    for (int tok = 0; tok < t; ++tok) {
      double want = 0.0, magnitude = 0.0;
      for (std::int64_t e = 0; e < k; ++e) {
        const double term = static_cast<double>(wd[static_cast<std::size_t>(row * k + e)]) *
                            xq[static_cast<std::size_t>(tok * k + e)] *
                            xd[static_cast<std::size_t>((tok * k + e) / F::kXBlock)];
        want += term;
        magnitude += std::fabs(term);
      }
      const float one = warp.template operator()<1, 1>(row, tok)[0];
      ASSERT_NEAR(one, want, 1e-5 * magnitude)
          << colibri::sdk::to_string(type) << " k " << k << " row " << row << " token " << tok;
      // The same element inside wider tiles (rows and tokens past the end repeat the last, as the kernel's do).
      const auto tile = warp.template operator()<4, 2>(row - row % 2, 0);
      std::uint32_t a, b;
      const float in_tile = tile[static_cast<std::size_t>((row % 2) * 4 + tok)];
      std::memcpy(&a, &one, 4);
      std::memcpy(&b, &in_tile, 4);
      EXPECT_EQ(a, b) << colibri::sdk::to_string(type) << " row " << row << " token " << tok
                      << ": a 4-token, 2-row tile changes the bits";
      // Decode's unrolled walks (several of a lane's units per step) add the same terms in the same order.
      for (const float unrolled :
           {warp.template operator()<1, 1, 2>(row, tok)[0], warp.template operator()<1, 1, 4>(row, tok)[0],
            warp.template operator()<1, 2, 2>(row - row % 2, tok)[static_cast<std::size_t>(row % 2)]}) {
        std::memcpy(&b, &unrolled, 4);
        EXPECT_EQ(a, b) << colibri::sdk::to_string(type) << " k " << k << " row " << row << " token " << tok
                        << ": a walk of several units per step changes the bits";
      }
    }
  }
}

TEST(CudaQ8Dot, AWarpOfLanesIsTheMatmulOfQuantizedActivationsInEveryTile) {
  expect_warp_matches<q8::Q4_K>(DType::q4_k);
  expect_warp_matches<q8::Q4_K_Pairs>(DType::q4_k);
  expect_warp_matches<q8::Q5_K_Pairs>(DType::q5_k);
  expect_warp_matches<q8::Q5_K>(DType::q5_k);
  expect_warp_matches<q8::Q6_K>(DType::q6_k);
  expect_warp_matches<q8::Q2_K>(DType::q2_k);
  expect_warp_matches<q8::Q3_K>(DType::q3_k);
  expect_warp_matches<q8::Q8_0>(DType::q8_0);
  expect_warp_matches<q8::Q4_0>(DType::q4_0);
  expect_warp_matches<q8::MXFP4>(DType::mxfp4);
  // 16 units and more, so that decode's walk of four units per step runs whole steps and a remainder.
  for (const std::int64_t k : {4096, 5120}) {
    expect_warp_matches<q8::Q4_K>(DType::q4_k, k);
    expect_warp_matches<q8::Q4_K_Pairs>(DType::q4_k, k);
    expect_warp_matches<q8::Q5_K_Pairs>(DType::q5_k, k);
    expect_warp_matches<q8::Q6_K>(DType::q6_k, k);
    expect_warp_matches<q8::Q8_0>(DType::q8_0, k);
  }
}

// Rows of whole 32-element blocks but not whole units (gpt-oss's 2880 = 11 units and 2 blocks; 1056 = 4 units and
// 1 block): the formats whose lanes take a block each run them, the last unit taken by its first lanes only; the
// k-quants do not (their rows are whole 256-element super-blocks anyway).
TEST(CudaQ8Dot, RowsEndingInAPartialUnitAreSummedWhole) {
  for (const std::int64_t k : {2880, 1056, 4096 + 2 * 32}) {
    expect_warp_matches<q8::Q8_0>(DType::q8_0, k);
    expect_warp_matches<q8::Q4_0>(DType::q4_0, k);
    expect_warp_matches<q8::MXFP4>(DType::mxfp4, k);
  }
  EXPECT_FALSE(q8::takes_k<q8::Q4_K>(2880));
  EXPECT_FALSE(q8::takes_k<q8::Q6_K>(1056));
  EXPECT_TRUE(q8::takes_k<q8::Q4_K>(4096));
  EXPECT_FALSE(q8::takes_k<q8::Q8_0>(2880 + 16));
}

// q4_k / q5_k lanes read a sub-block pair's scales and mins with byte permutes; they must be blocks.hpp's 6-bit values.
TEST(CudaQ8Dot, PackedScalesAndMinsAreTheK4ScalesAndMins) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::uint32_t head[4] = {0, static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng()),
                                   static_cast<std::uint32_t>(rng())};
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t sm = q8::K4Lanes::scales_mins(head, j);
      for (int half = 0; half < 2; ++half) {
        int sc = 0, mn = 0;
        colibri::cuda::dequant::k4_scale_min(2 * (j / 2) + half, head[1], head[2], head[3], sc, mn);
        ASSERT_EQ(static_cast<int>((sm >> (8 * half)) & 0xFFu), sc) << "lane " << j << " sub-block " << half;
        ASSERT_EQ(static_cast<int>((sm >> (16 + 8 * half)) & 0xFFu), mn) << "lane " << j << " sub-block " << half;
      }
    }
  }
}

TEST(CudaQ8Dot, Dp4aIsASignedByteDotProduct) {
  // 0x80 is -128, 0x7F is 127, 0xFF is -1: the host form of the instruction must read bytes as signed.
  EXPECT_EQ(q8::dp4a(0x80FF7F01u, 0x02030405u, 10), 10 + (-128 * 2) + (-1 * 3) + (127 * 4) + (1 * 5));
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
  // mxfp4's 17-byte blocks start at every byte offset of a word.
  for (std::size_t offset : {0, 1, 2, 3}) expect_chunks_match<dq::MXFP4>(DType::mxfp4, 32 * 13, 3, offset);
}

// Every e8m0 scale (the subnormal 0 and 1, and 255, whose 12 * 2^127 overflows) with every code, at an odd address.
TEST(CudaDequant, Mxfp4EveryScaleAndCodeIsBitIdenticalToColibriQuant) {
  constexpr std::size_t kBlock = 17;
  std::vector<std::uint8_t> storage(256 * kBlock + 8);
  std::uint8_t* row = storage.data() + 1;
  for (int e = 0; e < 256; ++e) {
    std::uint8_t* b = row + static_cast<std::size_t>(e) * kBlock;
    b[0] = static_cast<std::uint8_t>(e);
    for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<std::uint8_t>(((j + e) & 0xF) | ((15 - j) << 4));
  }
  std::vector<float> want(256 * 32);
  ASSERT_TRUE(colibri::quant::dequantize_row(DType::mxfp4, row, want.data(), 256 * 32));
  for (int c = 0; c < 256; ++c) {
    float got[dq::kChunk];
    dq::MXFP4::chunk(row, c, dq::kChunk, got);
    for (int j = 0; j < dq::kChunk; ++j) {
      const float expect = want[static_cast<std::size_t>(c * dq::kChunk + j)];
      std::uint32_t a, b;
      std::memcpy(&a, &got[j], 4);
      std::memcpy(&b, &expect, 4);
      ASSERT_EQ(a, b) << "scale " << c << " element " << j << ": got " << got[j] << ", want " << expect;
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
