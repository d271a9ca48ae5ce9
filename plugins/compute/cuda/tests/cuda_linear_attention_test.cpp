// The CUDA kernels' linear-attention steps (cuda_linear_attention.cuh), compiled for the host and run over the grid
// the kernels launch (a block's threads step by step between its barriers): causal_conv and gated_delta_rule against
// the double-precision reference of the conformance suite, the state carried across calls with the same bits, both
// head orders, and value columns that do not fill the last block. Runs without a GPU, so every CI run checks their
// indexing; the conformance suite checks the kernels themselves on a device.
#include "cuda_linear_attention.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "colibri/sdk/testing/expect_values.hpp"
#include "colibri/sdk/testing/reference_ops.hpp"

namespace {

namespace la = colibri::cuda::linear;
namespace ref = colibri::sdk::testing::ref;
using colibri::sdk::testing::expect_bits;
using colibri::sdk::testing::expect_close;

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// causal_conv_kernel's grid: one thread per channel.
void run_conv(const std::vector<float>& x, const std::vector<float>& w, std::vector<float>& y,
              std::vector<float>& state, int ch, int k, int t) {
  y.assign(static_cast<std::size_t>(ch * t), 9.0f);
  const la::ConvArgs a{x.data(), w.data(), y.data(), state.data(), ch, t, k};
  for (int c = 0; c < ch; ++c) la::conv_channel(a, c);
}

// gated_delta_rule_kernel's grid: blocks of kDeltaColumns threads per (column tile, value head), the block's shared
// memory as the kernel lays it out, every thread through one step before any thread takes the next (the barriers).
struct DeltaInputs {
  ref::DeltaShape d;
  std::vector<float> q, k, v, a, b, A, dt;
};
std::vector<float> run_delta(const DeltaInputs& in, std::vector<float>& state, std::int64_t from, std::int64_t count,
                             bool tiled) {
  const auto& d = in.d;
  const auto cols = [&](const std::vector<float>& src, std::int64_t width) {
    return std::vector<float>(src.begin() + from * width, src.begin() + (from + count) * width);
  };
  const auto q = cols(in.q, d.dk * d.hk), k = cols(in.k, d.dk * d.hk), v = cols(in.v, d.dv * d.hv);
  const auto a_ = cols(in.a, d.hv), b_ = cols(in.b, d.hv);
  std::vector<float> o(static_cast<std::size_t>(d.dv * d.hv * count), 5.0f);
  const la::DeltaArgs a{q.data(),
                        k.data(),
                        v.data(),
                        a_.data(),
                        b_.data(),
                        in.A.data(),
                        in.dt.data(),
                        o.data(),
                        state.data(),
                        static_cast<int>(d.dk),
                        static_cast<int>(d.dv),
                        static_cast<int>(d.hk),
                        static_cast<int>(d.hv),
                        static_cast<int>(count),
                        tiled};
  constexpr int kLanes = la::kDeltaColumns;
  const int dk = a.dk, tiles = (a.dv + kLanes - 1) / kLanes;
  std::vector<float> smem(static_cast<std::size_t>(dk * (kLanes + 2)));
  float *qn = smem.data() + dk * kLanes, *kn = qn + dk;
  for (int h = 0; h < a.hv; ++h) {
    for (int tile = 0; tile < tiles; ++tile) {
      std::fill(smem.begin(), smem.end(), std::nanf(""));  // shared memory starts undefined
      const auto live = [&](int lane) { return tile * kLanes + lane < a.dv; };
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int i = 0; live(lane) && i < dk; ++i)
          smem[static_cast<std::size_t>(i * kLanes + lane)] = state[la::delta_state_at(a, h, i, tile * kLanes + lane)];
      }
      for (int t = 0; t < a.t; ++t) {
        for (int lane = 0; lane < kLanes; ++lane) la::delta_keys(a, h, t, lane, kLanes, qn, kn);
        for (int lane = 0; lane < kLanes; ++lane) {
          if (live(lane)) la::delta_column(a, h, t, tile * kLanes + lane, smem.data() + lane, kLanes, qn, kn);
        }
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int i = 0; live(lane) && i < dk; ++i)
          state[la::delta_state_at(a, h, i, tile * kLanes + lane)] = smem[static_cast<std::size_t>(i * kLanes + lane)];
      }
    }
  }
  return o;
}

DeltaInputs delta_inputs(const ref::DeltaShape& d, unsigned seed) {
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  DeltaInputs in{d,
                 randn(n(d.dk * d.hk * d.t), seed),
                 randn(n(d.dk * d.hk * d.t), seed + 1),
                 randn(n(d.dv * d.hv * d.t), seed + 2),
                 randn(n(d.hv * d.t), seed + 3),
                 randn(n(d.hv * d.t), seed + 4),
                 std::vector<float>(n(d.hv)),
                 randn(n(d.hv), seed + 5)};
  for (std::size_t h = 0; h < in.A.size(); ++h) in.A[h] = -std::exp(0.5f * static_cast<float>(h % 6) - 1.0f);
  return in;
}

TEST(CudaLinearAttentionOnHost, CausalConvMatchesTheReferenceAndCarriesItsState) {
  for (const int k : {2, 4, la::kMaxTaps}) {
    const int ch = 70, t = 9;
    const auto x = randn(static_cast<std::size_t>(ch * t), 81), w = randn(static_cast<std::size_t>(ch * k), 82, 0.5f);
    const auto state0 = randn(static_cast<std::size_t>(ch * (k - 1)), 83);
    std::vector<float> y, state = state0;
    run_conv(x, w, y, state, ch, k, t);
    std::vector<double> ref_state(state0.begin(), state0.end());
    const auto want = ref::causal_conv(x, w, ref_state, ch, k, t);
    const std::string what = "causal_conv, " + std::to_string(k) + " taps";
    expect_close(y, want, 1e-5, what);
    expect_close(state, ref_state, 0, what + ": the state after the call");
    // Token by token from the same state: the same bits.
    std::vector<float> stepped = state0;
    for (int i = 0; i < t; ++i) {
      const std::vector<float> xi(x.begin() + i * ch, x.begin() + (i + 1) * ch);
      std::vector<float> yi;
      run_conv(xi, w, yi, stepped, ch, k, 1);
      expect_bits(yi, std::vector<float>(y.begin() + i * ch, y.begin() + (i + 1) * ch),
                  what + ": token " + std::to_string(i) + " alone");
    }
    expect_bits(stepped, state, what + ": the state token by token");
  }
}

TEST(CudaLinearAttentionOnHost, GatedDeltaRuleMatchesTheReferenceAndCarriesItsState) {
  // The conformance suite's shape (8 columns of one block), Qwen3-Next's heads (128) and columns that leave the last
  // block part empty (40), the largest key heads the kernel takes.
  for (const ref::DeltaShape d : {ref::DeltaShape{16, 2, 8, 4, 7}, ref::DeltaShape{128, 2, 40, 4, 5},
                                  ref::DeltaShape{la::kMaxDeltaDk, 1, 33, 2, 3}}) {
    const std::string what = "gated_delta_rule dk " + std::to_string(d.dk) + ", dv " + std::to_string(d.dv);
    const auto in = delta_inputs(d, 91);
    const auto state0 = randn(static_cast<std::size_t>(d.dv * d.dk * d.hv), 97, 0.3f);
    for (const bool tiled : {false, true}) {
      std::vector<float> state = state0;
      const auto o = run_delta(in, state, 0, d.t, tiled);
      std::vector<double> ref_state(state0.begin(), state0.end());
      const auto want = ref::gated_delta_rule(d, in.q, in.k, in.v, in.a, in.b, in.A, in.dt, ref_state, tiled);
      const std::string how = what + (tiled ? ", tiled heads" : "");
      expect_close(o, want, 1e-5, how);
      expect_close(state, ref_state, 1e-5, how + ": the state after the call");
      // In calls of 1 and then the rest, from the same state: the same bits.
      std::vector<float> split = state0;
      auto first = run_delta(in, split, 0, 1, tiled);
      const auto rest = run_delta(in, split, 1, d.t - 1, tiled);
      first.insert(first.end(), rest.begin(), rest.end());
      expect_bits(first, o, how + ": in two calls");
      expect_bits(split, state, how + ": the state in two calls");
    }
  }
}

}  // namespace
