// cpu-plugin specifics: every SIMD path gives the scalar path's bits, score() and options.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/test_data.hpp"

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
using ct::randn;

constexpr DType kWeightTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0,
                                  DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k};
// The weight types of matmul and the expert ops: the above and mxfp4 (not an embedding type).
constexpr DType kMatmulTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0, DType::q2_k,
                                  DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k, DType::mxfp4};

std::shared_ptr<Compute> make(const std::string& isa, const std::string& threads = "2") {
  auto lib = ct::LoadedPlugin::load(CPU_PLUGIN_PATH);
  if (!lib) return nullptr;
  auto c = (*lib)->create_as<Compute>({{"isa", isa}, {"threads", threads}});
  return c ? *c : nullptr;
}

std::vector<std::byte> quantized(DType type, std::int64_t k, std::int64_t n, unsigned seed) {
  const auto f = randn(static_cast<std::size_t>(k * n), seed, 0.2f);
  std::vector<std::byte> out(row_bytes(type, k) * static_cast<std::size_t>(n));
  EXPECT_TRUE(colibri::quant::quantize_row(type, f.data(), out.data(), k * n));
  return out;
}

// Runs matmul of every type (and odd K for the float types) on `c`, for one token (the multi-row
// decode kernels), two and three (the multi-row kernel per token or the small tiles, by ISA and type), then the
// multi-token tiles: four and five (partial), eight (full), eleven and thirteen (one full and one partial of 3 or 5
// tokens); 51 rows leave a short last row group (odd: the last row of a two-row pass
// alone) and K = 16896 (66 super-blocks) crosses a segment of the multi-row kernels.
std::vector<std::vector<float>> matmuls(Compute& c, bool exact) {
  std::vector<std::vector<float>> results;
  for (DType type : kMatmulTypes) {
    const bool plain = !dtype_traits(type)->quantized;
    // 32-element blocks: also K = 96 (three blocks, all in the tail after the four-block steps) and 1120 (35 blocks).
    const bool b32 = type == DType::q8_0 || type == DType::q4_0 || type == DType::mxfp4;
    for (std::int64_t k : plain ? std::vector<std::int64_t>{37, 1000, 768}
                          : b32 ? std::vector<std::int64_t>{256, 1024, 16896, 96, 1120}
                                : std::vector<std::int64_t>{256, 1024, 16896})
      for (std::int64_t t : {1, 2, 3, 4, 5, 8, 11, 13}) {
        const std::int64_t n = 51;
        auto w = quantized(type, k, n, static_cast<unsigned>(k) + static_cast<unsigned>(type));
        auto x = randn(static_cast<std::size_t>(k * t), 7, 3.0f);
        std::vector<float> y(static_cast<std::size_t>(n * t));
        Tensor in[] = {Tensor{type, {k, n, 1, 1}, w.data()}, Tensor{DType::f32, {k, t, 1, 1}, x.data()}};
        Tensor out{DType::f32, {n, t, 1, 1}, y.data()};
        OpParams p;
        p.flags = exact ? kExactActivations : 0;
        auto s = c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), p});
        EXPECT_TRUE(s) << s.to_string();
        results.push_back(std::move(y));
      }
  }
  return results;
}

struct AttentionShape {
  std::int64_t hd, heads, kvh, t;
  float scale = 0.09f;  // 40: scores hundreds apart, so portable_exp underflows to 0
};

// attention, or attention_sinks when `sinks` is given (one per query head).
std::vector<float> attention(Compute& c, DType kv, AttentionShape shape, const std::vector<float>* sinks = nullptr) {
  const auto [hd, heads, kvh, t, scale] = shape;
  const std::int64_t s = 200;
  auto q = randn(static_cast<std::size_t>(hd * heads * t), 1);
  auto kf = randn(static_cast<std::size_t>(hd * kvh * s), 2);
  auto vf = randn(static_cast<std::size_t>(hd * kvh * s), 3);
  std::vector<std::byte> kb(row_bytes(kv, hd) * static_cast<std::size_t>(kvh * s)), vb(kb.size());
  EXPECT_TRUE(colibri::quant::quantize_row(kv, kf.data(), kb.data(), hd * kvh * s));
  EXPECT_TRUE(colibri::quant::quantize_row(kv, vf.data(), vb.data(), hd * kvh * s));
  std::vector<float> o(q.size());
  Tensor in[] = {Tensor{DType::f32, {hd, heads, t, 1}, q.data()}, Tensor{kv, {hd, kvh, s, 1}, kb.data()},
                 Tensor{kv, {hd, kvh, s, 1}, vb.data()},
                 Tensor{DType::f32, {heads, 1, 1, 1}, sinks != nullptr ? const_cast<float*>(sinks->data()) : nullptr}};
  Tensor out{DType::f32, {hd, heads, t, 1}, o.data()};
  OpParams p;
  p.position = 190;
  p.scale = scale;
  const Op op = sinks != nullptr ? Op::attention_sinks : Op::attention;
  const auto st =
      c.run(OpCall{op, std::span<const Tensor>(in, sinks != nullptr ? 4 : 3), std::span<Tensor>(&out, 1), p});
  EXPECT_TRUE(st) << st.to_string();
  return o;
}

// SwiGLU over 1031 values (a tail after the last vector), gates up to +-120 so e^-g under- and overflows.
std::vector<float> swiglu(Compute& c) {
  const std::int64_t n = 1031;
  auto g = randn(static_cast<std::size_t>(n), 11, 40.0f);
  const auto u = randn(static_cast<std::size_t>(n), 12);
  g[3] = 0.0f;
  g[4] = -0.0f;
  std::vector<float> y(g.size());
  Tensor in[] = {Tensor{DType::f32, {n, 1, 1, 1}, g.data()},
                 Tensor{DType::f32, {n, 1, 1, 1}, const_cast<float*>(u.data())}};
  Tensor out{DType::f32, {n, 1, 1, 1}, y.data()};
  const auto s = c.run(OpCall{Op::swiglu, in, std::span<Tensor>(&out, 1), {}});
  EXPECT_TRUE(s) << s.to_string();
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(y[i], want, 1e-6 * (1.0 + std::fabs(want))) << "swiglu at " << i << ", gate " << g[i];
  }
  return y;
}

// Per head: far below, near and far above the scores (see the conformance suite), all different.
std::vector<float> sinks_for(std::int64_t heads) {
  const float pattern[] = {-100.0f, 2.5f, -2.0f, 20.0f, 0.0f, 6.0f, -0.5f, 4.0f};
  std::vector<float> s(static_cast<std::size_t>(heads));
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = pattern[i % 8] + 0.25f * static_cast<float>(i / 8);
  return s;
}

// expert_ffn_clamped of one weight-type triple for 1, 5 and 11 tokens; biases push gate and up past +-limit and
// gates reach the range where e^(-alpha g) under- and overflows.
std::vector<std::vector<float>> clamped_ffns(Compute& c, bool exact) {
  std::vector<std::vector<float>> results;
  const std::int64_t d = 256, f = 512;
  const DType combos[][3] = {{DType::q4_k, DType::q4_k, DType::q6_k},
                             {DType::q8_0, DType::q4_0, DType::q5_k},
                             {DType::f16, DType::bf16, DType::f32},
                             {DType::q2_k, DType::q3_k, DType::q8_0},
                             {DType::mxfp4, DType::mxfp4, DType::mxfp4}};
  for (const auto& types : combos) {
    auto g = quantized(types[0], d, f, 201), u = quantized(types[1], d, f, 202), dn = quantized(types[2], f, d, 203);
    auto bg = randn(static_cast<std::size_t>(f), 204, 40.0f), bu = randn(static_cast<std::size_t>(f), 205, 10.0f);
    auto bd = randn(static_cast<std::size_t>(d), 206);
    for (std::int64_t t : {1, 5, 11}) {
      auto x = randn(static_cast<std::size_t>(d * t), 207, 3.0f);
      std::vector<float> y(static_cast<std::size_t>(d * t));
      Tensor in[] = {Tensor{types[0], {d, f, 1, 1}, g.data()},    Tensor{types[1], {d, f, 1, 1}, u.data()},
                     Tensor{types[2], {f, d, 1, 1}, dn.data()},   Tensor{DType::f32, {d, t, 1, 1}, x.data()},
                     Tensor{DType::f32, {f, 1, 1, 1}, bg.data()}, Tensor{DType::f32, {f, 1, 1, 1}, bu.data()},
                     Tensor{DType::f32, {d, 1, 1, 1}, bd.data()}};
      Tensor out{DType::f32, {d, t, 1, 1}, y.data()};
      OpParams p;
      p.scale = 1.702f;
      p.eps = 7.0f;
      p.flags = exact ? kExactActivations : 0;
      const auto s = c.run(OpCall{Op::expert_ffn_clamped, in, std::span<Tensor>(&out, 1), p});
      EXPECT_TRUE(s) << s.to_string();
      results.push_back(std::move(y));
    }
  }
  return results;
}

// A gpt-oss layer's experts in one expert_ffn_clamped_group call (`group`), or one expert_ffn_clamped call each:
// mixed types with mxfp4, F 256..768, the decode step's one X for the experts of one token, and expert 0 twice, over
// 7 tokens and over the 4th of them alone (one row of the same X). Each expert's output, in order.
std::vector<std::vector<float>> clamped_group(Compute& c, bool exact, bool group) {
  const std::int64_t d = 256;
  struct Expert {
    DType g, u, dn;
    std::int64_t f, t;
    std::size_t x;  // which X: 0 one token, 1 seven tokens, 2 the 4th of those
    int weights;    // whose weights (expert 0's twice)
  };
  const Expert experts[] = {{DType::mxfp4, DType::mxfp4, DType::mxfp4, 512, 7, 1, 0},
                            {DType::q4_k, DType::q4_k, DType::q6_k, 256, 1, 0, 1},
                            {DType::mxfp4, DType::mxfp4, DType::mxfp4, 768, 1, 0, 2},
                            {DType::q8_0, DType::mxfp4, DType::q4_0, 256, 1, 0, 3},
                            {DType::mxfp4, DType::mxfp4, DType::mxfp4, 512, 1, 2, 0}};
  auto one = randn(static_cast<std::size_t>(d), 301, 3.0f), seven = randn(static_cast<std::size_t>(7 * d), 302, 3.0f);
  float* xs[] = {one.data(), seven.data(), seven.data() + 3 * d};
  std::vector<std::vector<std::byte>> w;
  std::vector<std::vector<float>> b, results;
  for (unsigned i = 0; i < 4; ++i) {
    const Expert& e = experts[i];
    w.push_back(quantized(e.g, d, e.f, 310 + 6 * i));
    w.push_back(quantized(e.u, d, e.f, 311 + 6 * i));
    w.push_back(quantized(e.dn, e.f, d, 312 + 6 * i));
    b.push_back(randn(static_cast<std::size_t>(e.f), 313 + 6 * i, 20.0f));
    b.push_back(randn(static_cast<std::size_t>(e.f), 314 + 6 * i, 8.0f));
    b.push_back(randn(static_cast<std::size_t>(d), 315 + 6 * i));
  }
  std::vector<Tensor> in, out;
  for (const Expert& e : experts) {
    const auto k = static_cast<std::size_t>(3 * e.weights);
    results.emplace_back(static_cast<std::size_t>(d * e.t), std::nanf(""));
    in.insert(in.end(),
              {Tensor{e.g, {d, e.f, 1, 1}, w[k].data()}, Tensor{e.u, {d, e.f, 1, 1}, w[k + 1].data()},
               Tensor{e.dn, {e.f, d, 1, 1}, w[k + 2].data()}, Tensor{DType::f32, {d, e.t, 1, 1}, xs[e.x]},
               Tensor{DType::f32, {e.f, 1, 1, 1}, b[k].data()}, Tensor{DType::f32, {e.f, 1, 1, 1}, b[k + 1].data()},
               Tensor{DType::f32, {d, 1, 1, 1}, b[k + 2].data()}});
    out.push_back(Tensor{DType::f32, {d, e.t, 1, 1}, results.back().data()});
  }
  OpParams p;
  p.scale = 1.702f;
  p.eps = 7.0f;
  p.flags = exact ? kExactActivations : 0;
  if (group) {
    const auto s = c.run(OpCall{Op::expert_ffn_clamped_group, in, out, p});
    EXPECT_TRUE(s) << s.to_string();
  } else {
    for (std::size_t e = 0; e < out.size(); ++e) {
      const auto s = c.run(OpCall{Op::expert_ffn_clamped, std::span<const Tensor>(in).subspan(7 * e, 7),
                                  std::span<Tensor>(out).subspan(e, 1), p});
      EXPECT_TRUE(s) << s.to_string();
    }
  }
  return results;
}

class CpuIsa : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuIsa, GivesTheScalarPathsBitsForEveryOp) {
  auto simd = make(GetParam());
  if (!simd) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto scalar = make("scalar");
  ASSERT_TRUE(scalar);
  for (bool exact : {false, true}) {
    const auto a = matmuls(*scalar, exact);
    const auto b = matmuls(*simd, exact);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)))
          << "matmul case " << i << (exact ? " exact" : "") << " differs from the scalar path";
    }
  }
  const auto sa = swiglu(*scalar), sb = swiglu(*simd);
  EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float))) << "swiglu";
  // head_dim 128 and 64 fill the 32 lanes of the float dot products; 80 leaves a tail (q8_0 rows need whole
  // 32-element blocks, so it skips 80). 16 query heads on 2 KV heads group 8 queries per task (two passes of
  // the value kernel); one token of 8 on 2 is decode; the last has scores hundreds apart.
  for (DType kv : {DType::f32, DType::f16, DType::q8_0})
    for (AttentionShape shape :
         {AttentionShape{128, 4, 2, 3}, AttentionShape{64, 4, 2, 3}, AttentionShape{80, 4, 2, 3},
          AttentionShape{64, 16, 2, 5}, AttentionShape{128, 8, 2, 1}, AttentionShape{64, 8, 2, 3, 40.0f}}) {
      if (kv == DType::q8_0 && shape.hd % 32 != 0) continue;
      const auto a = attention(*scalar, kv, shape);
      const auto b = attention(*simd, kv, shape);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "attention kv=" << to_string(kv) << " head_dim=" << shape.hd << " heads=" << shape.heads
          << " kv_heads=" << shape.kvh << " tokens=" << shape.t;
      const auto sinks = sinks_for(shape.heads);
      const auto sa2 = attention(*scalar, kv, shape, &sinks);
      const auto sb2 = attention(*simd, kv, shape, &sinks);
      EXPECT_EQ(0, std::memcmp(sa2.data(), sb2.data(), sa2.size() * sizeof(float)))
          << "attention_sinks kv=" << to_string(kv) << " head_dim=" << shape.hd << " heads=" << shape.heads
          << " kv_heads=" << shape.kvh << " tokens=" << shape.t;
    }
  for (bool exact : {false, true}) {
    const auto a = clamped_ffns(*scalar, exact);
    const auto b = clamped_ffns(*simd, exact);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)))
          << "expert_ffn_clamped case " << i << (exact ? " exact" : "") << " differs from the scalar path";
    }
  }
}

// The clamped group gives every expert the bits the scalar path's expert_ffn_clamped gives it alone, on every ISA
// and thread count (1, 2 and 16 split rows and tasks differently); a token's row is the same in a batch of 7 and
// alone in the same call.
TEST_P(CpuIsa, ClampedGroupHasThePerExpertBitsOfTheScalarPathAtAnyThreadCount) {
  if (!make(GetParam())) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto scalar = make("scalar", "1");
  ASSERT_TRUE(scalar);
  for (bool exact : {false, true}) {
    const auto want = clamped_group(*scalar, exact, false);
    ASSERT_EQ(want.size(), 5u);
    EXPECT_EQ(0, std::memcmp(want[4].data(), want[0].data() + 3 * 256, 256 * sizeof(float)))
        << "expert_ffn_clamped: token 3 differs alone and in a batch of 7" << (exact ? " exact" : "");
    for (const char* threads : {"1", "2", "16"}) {
      auto c = make(GetParam(), threads);
      ASSERT_TRUE(c);
      const auto got = clamped_group(*c, exact, true);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t e = 0; e < got.size(); ++e) {
        EXPECT_EQ(0, std::memcmp(got[e].data(), want[e].data(), want[e].size() * sizeof(float)))
            << "expert_ffn_clamped_group expert " << e << " threads=" << threads << (exact ? " exact" : "")
            << " differs from the scalar path's expert_ffn_clamped";
      }
    }
  }
}

// Decode tasks take up to 4 tiles of 64 rows when there are enough for every thread (2 threads: 2000 rows in 256-row
// tasks; 16 threads: 64-row tasks). Neither the split nor the ISA may change a bit.
TEST_P(CpuIsa, DecodeRowsDoNotDependOnHowTasksSplitThem) {
  auto two = make(GetParam(), "2");
  if (!two) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto sixteen = make(GetParam(), "16");
  auto scalar = make("scalar", "1");
  ASSERT_TRUE(sixteen && scalar);
  for (DType type :
       {DType::q4_k, DType::q6_k, DType::q8_0, DType::f16, DType::mxfp4, DType::q4_0, DType::q2_k, DType::q3_k}) {
    // q4_0's multi-row kernel starts at K = 1024; q2_k and q3_k take the long-row path (9 blocks: a partial chunk).
    const std::int64_t k = type == DType::q4_0 ? 1024 : type == DType::q2_k || type == DType::q3_k ? 2304 : 512;
    const std::int64_t n = 2000;
    auto w = quantized(type, k, n, 77);
    const auto x = randn(static_cast<std::size_t>(k), 78);
    std::vector<std::vector<float>> ys;
    for (Compute* c : {two.get(), sixteen.get(), scalar.get()}) {
      std::vector<float> y(static_cast<std::size_t>(n));
      Tensor in[] = {Tensor{type, {k, n, 1, 1}, w.data()},
                     Tensor{DType::f32, {k, 1, 1, 1}, const_cast<float*>(x.data())}};
      Tensor out{DType::f32, {n, 1, 1, 1}, y.data()};
      ASSERT_TRUE(c->run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
      ys.push_back(std::move(y));
    }
    EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(float))) << to_string(type);
    EXPECT_EQ(0, std::memcmp(ys[0].data(), ys[2].data(), ys[0].size() * sizeof(float))) << to_string(type);
  }
}

// An attention task takes as many query heads of a KV head as leaves a task per thread, so 1, 3 and 16
// threads group differently; every query's bits must stay the same.
TEST_P(CpuIsa, AttentionDoesNotDependOnHowQueriesAreGrouped) {
  auto one = make(GetParam(), "1");
  if (!one) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  for (const char* threads : {"3", "16"}) {
    auto many = make(GetParam(), threads);
    ASSERT_TRUE(many);
    for (DType kv : {DType::f16, DType::q8_0})
      for (AttentionShape shape : {AttentionShape{64, 16, 2, 1}, AttentionShape{128, 12, 4, 2}}) {
        const auto a = attention(*one, kv, shape);
        const auto b = attention(*many, kv, shape);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << "threads=" << threads << " kv=" << to_string(kv) << " heads=" << shape.heads;
        const auto sinks = sinks_for(shape.heads);
        const auto sa = attention(*one, kv, shape, &sinks);
        const auto sb = attention(*many, kv, shape, &sinks);
        EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)))
            << "attention_sinks threads=" << threads << " kv=" << to_string(kv) << " heads=" << shape.heads;
      }
  }
}

// Activation quantization at its edges: with amax = 127 the scale is exactly 1, so x * (1/d) lands
// on ties (n + 0.5, rounded half to even), and a NaN must become -127 on every path.
TEST_P(CpuIsa, QuantizesActivationTiesAndNaNLikeTheScalarPath) {
  auto simd = make(GetParam());
  if (!simd) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto scalar = make("scalar");
  ASSERT_TRUE(scalar);
  const std::int64_t k = 512, n = 20;
  std::vector<float> x(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < k; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i % 61 - 30) + 0.5f;
  x[0] = 127.0f;  // first 256 / first 32: the block maximum
  x[256] = -127.0f;
  x[7] = std::numeric_limits<float>::quiet_NaN();
  x[300] = -126.5f;
  for (DType type : {DType::q8_0, DType::q4_k, DType::q6_k, DType::mxfp4}) {
    auto w = quantized(type, k, n, 99);
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
    for (auto* out : {&a, &b}) {
      Compute& c = out == &a ? *scalar : *simd;
      Tensor in[] = {Tensor{type, {k, n, 1, 1}, w.data()}, Tensor{DType::f32, {k, 1, 1, 1}, x.data()}};
      Tensor y{DType::f32, {n, 1, 1, 1}, out->data()};
      ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&y, 1), {}}));
    }
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << to_string(type);
  }
}

// mxfp4 rows of raw blocks (every code; exponents 0 and 1, whose scales are subnormal, among others) at the
// block counts the kernels split differently: 1-3 (one-block tail), 4-15 (four- and eight-block steps), 16..31
// (one group of 16 of the multi-row kernel and a tail), 90 (gpt-oss's 2880: 5 groups, a step of 8 and 2 blocks),
// 128 and 256 (whole segments of 8 groups of the multi-row, multi-token kernel), 129 (a second segment of one block),
// 281 (two segments of the multi-row kernel and a tail of 9; three of the multi-token one, the last group partial).
// One token takes the multi-row kernel, 2 and more the multi-row, multi-token kernel (every tile width 1-8 with a
// remainder: 9-15, 33); 70 rows cross a 64-row tile, and rows of an odd number of 17-byte blocks start at
// odd addresses. Every result must have the scalar path's bits.
TEST_P(CpuIsa, Mxfp4RawBlocksGiveTheScalarBitsAtEveryBlockCount) {
  auto simd = make(GetParam());
  if (!simd) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto scalar = make("scalar");
  ASSERT_TRUE(scalar);
  std::mt19937 rng(2024);
  for (const std::int64_t blocks : {1, 3, 4, 7, 8, 12, 15, 16, 17, 20, 24, 31, 90, 128, 129, 256, 281}) {
    const std::int64_t k = 32 * blocks, n = 70;
    std::vector<std::byte> w(row_bytes(DType::mxfp4, k) * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::byte>(rng());
    // The exponents: every third row 0..3 only (results near the subnormal range, where the scales of 0 and 1
    // decide bits), the other rows 100..139 with a 0 or 1 now and then.
    const std::size_t rb = row_bytes(DType::mxfp4, k);
    for (std::size_t b = 0; b < w.size(); b += 17) {
      const unsigned r = rng() % 16;
      w[b] = static_cast<std::byte>(b / rb % 3 == 0 ? r % 4 : r < 2 ? r : 100 + rng() % 40);
    }
    for (const std::int64_t t : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 33, 64}) {
      const auto x = randn(static_cast<std::size_t>(k * t), static_cast<unsigned>(blocks + t), 2.0f);
      std::vector<float> a(static_cast<std::size_t>(n * t)), b(a.size());
      for (auto* out : {&a, &b}) {
        Compute& c = out == &a ? *scalar : *simd;
        Tensor in[] = {Tensor{DType::mxfp4, {k, n, 1, 1}, w.data()},
                       Tensor{DType::f32, {k, t, 1, 1}, const_cast<float*>(x.data())}};
        Tensor y{DType::f32, {n, t, 1, 1}, out->data()};
        ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&y, 1), {}}));
      }
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "mxfp4 blocks=" << blocks << " tokens=" << t;
    }
  }
}

// q8_0 and q4_0 rows of raw blocks (every code, -128 too; scales 0, subnormal, up to 65504, zero blocks) at the block
// counts the multi-row, multi-token kernel splits differently: 1-3 (one partial group), 8 and 16 (one group), 35 and
// 90 (gpt-oss's 2880: a partial last group), 128 and 129 (one segment of 8 groups, then a second of one block), 256
// and 257. One token takes the one-row dot, 2 and more the multi-row, multi-token kernel (every tile width 1-8 with
// a remainder: 9-15, 33); 70 rows cross a 64-row tile, and rows of an odd number of 34- or 18-byte
// blocks start at addresses that are only 2-byte aligned. Activation blocks of zeros (scale 0) are among them. Every
// result must have the scalar path's bits.
TEST_P(CpuIsa, Q8_0AndQ4_0RawBlocksGiveTheScalarBitsAtEveryBlockCount) {
  auto simd = make(GetParam());
  if (!simd) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto scalar = make("scalar");
  ASSERT_TRUE(scalar);
  std::mt19937 rng(2025);
  for (const DType type : {DType::q8_0, DType::q4_0})
    for (const std::int64_t blocks : {1, 3, 8, 16, 35, 90, 128, 129, 256, 257}) {
      const std::int64_t k = 32 * blocks, n = 70;
      const std::size_t rb = row_bytes(type, k), bb = rb / static_cast<std::size_t>(blocks);
      std::vector<std::byte> w(rb * static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::byte>(rng());
      // The fp16 scales (the first 2 bytes of a block): mostly 0.001-0.06, now and then 0, a subnormal or one of
      // the largest; a block of zero codes now and then.
      for (std::size_t b = 0; b < w.size(); b += bb) {
        const unsigned r = rng() % 32;
        const std::uint16_t d = r == 0   ? 0
                                : r == 1 ? static_cast<std::uint16_t>(1 + rng() % 0x3FF)
                                : r == 2 ? static_cast<std::uint16_t>(0x7800 + rng() % 0x400)
                                         : static_cast<std::uint16_t>(0x1400 + rng() % 0x1000);
        std::memcpy(&w[b], &d, 2);
        if (r == 3) std::memset(&w[b + 2], 0, bb - 2);
      }
      for (const std::int64_t t : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 33, 64}) {
        auto x = randn(static_cast<std::size_t>(k * t), static_cast<unsigned>(blocks + t), 2.0f);
        for (std::size_t i = 0; i + 32 <= x.size(); i += 32 * 7)
          std::fill_n(x.begin() + static_cast<std::ptrdiff_t>(i), 32, 0.0f);
        std::vector<float> a(static_cast<std::size_t>(n * t)), b(a.size());
        for (auto* out : {&a, &b}) {
          Compute& c = out == &a ? *scalar : *simd;
          Tensor in[] = {Tensor{type, {k, n, 1, 1}, w.data()}, Tensor{DType::f32, {k, t, 1, 1}, x.data()}};
          Tensor y{DType::f32, {n, t, 1, 1}, out->data()};
          ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&y, 1), {}}));
        }
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << dtype_traits(type)->name << " blocks=" << blocks << " tokens=" << t;
      }
    }
}

// The kernels read a row's last, partial group of blocks in place, past its end where that stays in the same page.
// Weights that end right before an unreadable page (the end of a mapped file, say) must be read only within
// themselves there: no fault, and the scalar path's bits. 3 blocks (one partial group) and 90 (gpt-oss's 2880: 5
// groups and 10 blocks); 1 token (the multi-row kernels), 4, 8 and 9 (the tiles).
TEST_P(CpuIsa, WeightsEndingAtAnUnreadablePageAreReadOnlyWithinThemselves) {
  auto simd = make(GetParam());
  if (!simd) GTEST_SKIP() << "this CPU cannot run isa=" << GetParam();
  auto scalar = make("scalar");
  ASSERT_TRUE(scalar);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  for (const DType type : {DType::mxfp4, DType::q8_0, DType::q4_0})
    for (const std::int64_t blocks : {3, 90}) {
      const std::int64_t k = 32 * blocks, n = 70;
      const std::vector<std::byte> heap = quantized(type, k, n, static_cast<unsigned>(blocks) + 17);
      const std::size_t pages = (heap.size() + page - 1) / page;
      void* map = mmap(nullptr, (pages + 1) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(map, MAP_FAILED);
      auto* base = static_cast<std::byte*>(map);
      ASSERT_EQ(0, mprotect(base + pages * page, page, PROT_NONE));
      std::byte* w = base + pages * page - heap.size();  // the last row ends where the unreadable page starts
      std::memcpy(w, heap.data(), heap.size());
      for (const std::int64_t t : {1, 4, 8, 9}) {
        const auto x = randn(static_cast<std::size_t>(k * t), static_cast<unsigned>(blocks + t), 2.0f);
        std::vector<float> a(static_cast<std::size_t>(n * t)), b(a.size());
        for (auto* out : {&a, &b}) {
          Compute& c = out == &a ? *scalar : *simd;
          Tensor in[] = {Tensor{type, {k, n, 1, 1}, out == &a ? const_cast<std::byte*>(heap.data()) : w},
                         Tensor{DType::f32, {k, t, 1, 1}, const_cast<float*>(x.data())}};
          Tensor y{DType::f32, {n, t, 1, 1}, out->data()};
          ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&y, 1), {}}));
        }
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << dtype_traits(type)->name << " blocks=" << blocks << " tokens=" << t;
      }
      munmap(map, (pages + 1) * page);
    }
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuIsa, ::testing::Values("avx2", "avxvnni", "avx512", "auto"));

TEST(CpuPlugin, ScoreRanksInstructionSetsFromHostInfoAlone) {
  auto lib = ct::LoadedPlugin::load(CPU_PLUGIN_PATH);
  ASSERT_TRUE(lib) << lib.error().to_string();
  HostInfo plain;
  HostInfo avx2 = plain;
  avx2.avx2 = avx2.fma = avx2.f16c = true;
  HostInfo avx512 = avx2;
  avx512.avx512f = avx512.avx512bw = avx512.avx512vl = avx512.avx512_vnni = true;
  const auto& d = (*lib)->descriptor();
  const Score s0 = d.score(plain), s1 = d.score(avx2), s2 = d.score(avx512);
  EXPECT_GT(s0.value, 0) << "the scalar path runs on every x86-64";
  EXPECT_GT(s1.value, s0.value);
  EXPECT_GT(s2.value, s1.value);
  EXPECT_FALSE(s2.reason.empty());
}

TEST(CpuPlugin, SupportsEveryOpOnEveryBlockFormat) {
  auto c = make("auto");
  ASSERT_TRUE(c);
  for (DType t : kWeightTypes) {
    EXPECT_TRUE(c->supports(Op::matmul, t)) << to_string(t);
    EXPECT_TRUE(c->supports(Op::expert_ffn, t)) << to_string(t);
    EXPECT_TRUE(c->supports(Op::embedding, t)) << to_string(t);
    EXPECT_TRUE(c->supports(Op::expert_ffn_group, t)) << to_string(t);
    EXPECT_TRUE(c->supports(Op::expert_ffn_clamped, t)) << to_string(t);
    EXPECT_TRUE(c->supports(Op::expert_ffn_clamped_group, t)) << to_string(t);
  }
  for (DType t : {DType::f32, DType::f16, DType::q8_0}) {
    EXPECT_TRUE(c->supports(Op::attention, t));
    EXPECT_TRUE(c->supports(Op::attention_sinks, t));
  }
  EXPECT_FALSE(c->supports(Op::attention, DType::q4_k));
  EXPECT_FALSE(c->supports(Op::attention_sinks, DType::q4_k));
  EXPECT_FALSE(c->supports(Op::expert_ffn_clamped, DType::q4_1));
  EXPECT_FALSE(c->supports(Op::expert_ffn_clamped_group, DType::q4_1));
  EXPECT_FALSE(c->supports(Op::matmul, DType::q4_1));
  // mxfp4 (an optional weight type): matmul and the expert ops, not embedding.
  for (Op op :
       {Op::matmul, Op::expert_ffn, Op::expert_ffn_group, Op::expert_ffn_clamped, Op::expert_ffn_clamped_group}) {
    EXPECT_TRUE(c->supports(op, DType::mxfp4)) << op_name(op);
  }
  EXPECT_FALSE(c->supports(Op::embedding, DType::mxfp4));
  for (Op op : {Op::rms_norm, Op::rope, Op::swiglu, Op::add, Op::topk_routing, Op::scale_add, Op::sigmoid}) {
    EXPECT_TRUE(c->supports(op, DType::f32));
  }
  ASSERT_EQ(c->devices().size(), 1u);
  EXPECT_TRUE(c->devices()[0].host_memory);
  EXPECT_GT(c->devices()[0].memory_total, 0u);
}

// The kernels read through block structs and floats: data that does not start where its type can is refused (a
// hand-edited manifest could place a tensor so), through a pointer and through a buffer offset alike.
TEST(CpuPlugin, DataThatStartsWhereItsTypeCannotIsAnError) {
  auto c = make("auto");
  ASSERT_TRUE(c);
  const std::int64_t k = 64, n = 4;
  const auto w = quantized(DType::q8_0, k, n, 3);
  std::vector<std::byte> shifted(w.size() + 8);
  const auto x = randn(static_cast<std::size_t>(k) + 1, 5);
  std::vector<float> y(static_cast<std::size_t>(n));
  auto run = [&](std::byte* wp, const float* xp) {
    Tensor in[] = {Tensor{DType::q8_0, {k, n, 1, 1}, wp}, Tensor{DType::f32, {k, 1, 1, 1}, const_cast<float*>(xp)}};
    Tensor out{DType::f32, {n, 1, 1, 1}, y.data()};
    return c->run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}});
  };
  std::memcpy(shifted.data() + 2, w.data(), w.size());
  EXPECT_TRUE(run(shifted.data() + 2, x.data())) << "q8_0 blocks need two-byte alignment only";
  std::memcpy(shifted.data() + 1, w.data(), w.size());
  auto odd = run(shifted.data() + 1, x.data());
  ASSERT_FALSE(odd);
  EXPECT_NE(odd.message().find("not a multiple of 2, which q8_0 data needs"), std::string::npos) << odd.message();
  auto floats = run(const_cast<std::byte*>(w.data()),
                    reinterpret_cast<const float*>(reinterpret_cast<const std::byte*>(x.data()) + 2));
  ASSERT_FALSE(floats);
  EXPECT_NE(floats.message().find("not a multiple of 4, which f32 data needs"), std::string::npos) << floats.message();

  auto buf = c->allocate(w.size() + 8);
  ASSERT_TRUE(buf);
  std::memcpy(static_cast<std::byte*>((*buf)->host_pointer()) + 2, w.data(), w.size());
  Tensor in[] = {Tensor{DType::q8_0, {k, n, 1, 1}, nullptr, buf->get(), 1},
                 Tensor{DType::f32, {k, 1, 1, 1}, const_cast<float*>(x.data())}};
  Tensor out{DType::f32, {n, 1, 1, 1}, y.data()};
  EXPECT_FALSE(c->run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
  in[0].offset = 2;
  EXPECT_TRUE(c->run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
}

TEST(CpuPlugin, RejectsBadOptionsWithTheKeyNamed) {
  auto lib = ct::LoadedPlugin::load(CPU_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto a = (*lib)->create({{"isa", "sse9"}});
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code(), StatusCode::invalid_argument);
  EXPECT_NE(a.error().message().find("isa"), std::string::npos) << a.error().message();
  auto b = (*lib)->create({{"threads", "-2"}});
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message().find("threads"), std::string::npos) << b.error().message();
  auto c = (*lib)->create({{"q6k_decode", "fast"}});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), StatusCode::invalid_argument);
  EXPECT_NE(c.error().message().find("compute.q6k_decode must be auto, rows or dot, got 'fast'"), std::string::npos)
      << c.error().message();
  auto d = (*lib)->create({{"prefetch", "l3"}});
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code(), StatusCode::invalid_argument);
  EXPECT_NE(d.error().message().find("compute.prefetch must be auto, l1 or l2, got 'l3'"), std::string::npos)
      << d.error().message();
}

// compute.prefetch moves only where the weight stream is prefetched to: every matmul path has the same bits with the
// prefetches to L1 and to L2 (the setting is the process's: the last object created).
TEST(CpuPlugin, PrefetchToL2GivesTheSameBits) {
  auto lib = ct::LoadedPlugin::load(CPU_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  std::vector<std::vector<float>> got[2];
  for (int i = 0; i < 2; ++i) {
    auto c = (*lib)->create_as<Compute>({{"prefetch", i == 0 ? "l1" : "l2"}, {"threads", "2"}});
    ASSERT_TRUE(c) << c.error().message();
    got[i] = matmuls(**c, false);
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  for (std::size_t r = 0; r < got[0].size(); ++r) {
    ASSERT_EQ(0, std::memcmp(got[0][r].data(), got[1][r].data(), got[0][r].size() * sizeof(float))) << "case " << r;
  }
}

}  // namespace
