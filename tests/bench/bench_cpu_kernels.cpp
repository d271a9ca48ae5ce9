// Matrix-vector throughput of the cpu compute plugin per block format: a 4096 x 4096 weight
// matrix times one token (decode), reported as weight bytes read per second. The plugin is
// loaded from its .so (dlopen), as the engine does. Several copies of the matrix are cycled so
// the working set (>= 96 MiB) is larger than the last-level cache: the figure is DRAM-bound like
// a real decode step, not an L3 hit.
//
//   colibri_bench_cpu_kernels --benchmark_filter='matvec/q4_k'
//
// COLIBRI_BENCH_BASELINE_PLUGIN=/path/to/an/older/libcolibri-compute-cpu.so adds `base/` rows
// (the same decode matvecs on that build), so before/after figures come from one run.
#include <benchmark/benchmark.h>

#if __has_include("colibri/sdk/testing/plugin_loader.hpp") && defined(CPU_PLUGIN_PATH)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"

namespace {

using namespace colibri::sdk;

constexpr std::int64_t kK = 4096;
constexpr std::int64_t kN = 4096;
constexpr std::size_t kWorkingSet = 96u << 20;
// `cached/` rows: the first 256 rows of one copy, read again and again from the caches, so the
// figure is the kernel's arithmetic throughput rather than DRAM's.
constexpr std::int64_t kCachedRows = 256;

struct Matrix {
  std::size_t bytes = 0;  // of one copy
  std::vector<std::vector<std::byte>> copies;
};

// A decode step's shapes: the default square matrix, and a Mixtral-shaped expert's gate/up
// (K 2048 -> N 5632) and down (K 5632 -> N 2048) projections.
struct Shape {
  const char* name;
  std::int64_t k, n;
};
constexpr Shape kSquare{"", kK, kN};
// Mixtral-bench's experts (K = 5632: 22 super-blocks, 6 after the last chunk of 8) and Qwen3-MoE's down projection
// (K = 768: rows shorter than a chunk).
constexpr Shape kExpertShapes[] = {
    {"expert_up/", 2048, 5632}, {"expert_down/", 5632, 2048}, {"qwen3_down/", 768, 2048}};

const Matrix& matrix(DType type, const Shape& shape = kSquare) {
  static std::map<std::tuple<DType, std::int64_t, std::int64_t>, Matrix> cache;
  const auto key = std::make_tuple(type, shape.k, shape.n);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> f(static_cast<std::size_t>(shape.k * shape.n));
  for (auto& v : f) v = dist(rng);
  Matrix m;
  m.bytes = row_bytes(type, shape.k) * static_cast<std::size_t>(shape.n);
  std::vector<std::byte> first(m.bytes);
  if (!colibri::quant::quantize_row(type, f.data(), first.data(), shape.k * shape.n)) std::abort();
  const std::size_t n = std::max<std::size_t>(1, (kWorkingSet + m.bytes - 1) / m.bytes);
  for (std::size_t i = 0; i < n; ++i) m.copies.push_back(first);
  return cache.emplace(key, std::move(m)).first->second;
}

// isa may name compute.prefetch after a '+' ("auto+l2"). That setting is the process's (the last created cpu
// compute object's), so such an object is made for its benchmark alone, and the default restored after it.
std::shared_ptr<Compute> compute(const std::string& isa, int threads, const std::string& path = CPU_PLUGIN_PATH) {
  static std::map<std::string, std::shared_ptr<Compute>> cache;
  const auto plus = isa.find('+');
  const std::string key = path + "/" + isa + "/" + std::to_string(threads);
  auto it = cache.find(key);
  if (it != cache.end() && plus == std::string::npos) return it->second;
  std::shared_ptr<Compute> c;
  if (auto lib = colibri::sdk::testing::LoadedPlugin::load(path)) {
    std::map<std::string, std::string> config{{"isa", isa.substr(0, plus)}, {"threads", std::to_string(threads)}};
    if (plus != std::string::npos) config["prefetch"] = isa.substr(plus + 1);
    if (auto made = (*lib)->create_as<Compute>(config)) c = *made;
  }
  if (plus != std::string::npos) return c;
  return cache[key] = c;
}

void matvec(benchmark::State& state, DType type, std::string isa, int threads, std::int64_t tokens, std::string path,
            bool cached, Shape shape) {
  auto c = compute(isa, threads, path);
  if (!c) {
    state.SkipWithError(("isa=" + isa + " is not available on this CPU (or " + path + " did not load)").c_str());
    return;
  }
  const Matrix& m = matrix(type, shape);
  const std::int64_t k = shape.k, n = cached ? kCachedRows : shape.n;
  const std::size_t bytes = cached ? row_bytes(type, k) * static_cast<std::size_t>(n) : m.bytes;
  std::vector<float> x(static_cast<std::size_t>(k * tokens)), y(static_cast<std::size_t>(n * tokens));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  std::size_t next = 0;
  for (auto _ : state) {
    Tensor in[] = {Tensor{type, {k, n, 1, 1}, const_cast<std::byte*>(m.copies[next].data())},
                   Tensor{DType::f32, {k, tokens, 1, 1}, x.data()}};
    Tensor out{DType::f32, {n, tokens, 1, 1}, y.data()};
    if (auto s = c->run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}); !s) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(y.data());
    if (!cached) next = (next + 1) % m.copies.size();
  }
  if (isa.find('+') != std::string::npos) compute(isa.substr(0, isa.find('+')) + "+auto", threads, path);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
}

// A Qwen3-MoE layer's routed experts (hidden 2048, experts of 768, gate/up q4_k, down q6_k): `experts` of them, each
// over `tokens` tokens of its own, either one expert_ffn call per expert or one expert_ffn_group call for all. Enough
// distinct experts are cycled that every call reads them from DRAM. Reported as expert weight bytes per second.
void qwen3_experts(benchmark::State& state, int experts, std::int64_t tokens, bool group, std::string path) {
  auto c = compute("auto", 2, path);
  if (!c || (group && !c->supports(Op::expert_ffn_group, DType::q4_k))) {
    state.SkipWithError(("no expert_ffn_group in " + path).c_str());
    return;
  }
  constexpr std::int64_t kD = 2048, kF = 768;
  const Matrix& gate = matrix(DType::q4_k, {"", kD, kF});
  const Matrix& down = matrix(DType::q6_k, {"", kF, kD});
  // matrix() keeps >= 96 MiB of copies of each; expert i of a call takes copy (call * experts + i) of each.
  const std::size_t copies = std::min(gate.copies.size(), down.copies.size());
  const std::size_t bytes = 2 * gate.bytes + down.bytes;
  std::vector<std::vector<float>> x, y;
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int e = 0; e < experts; ++e) {
    x.emplace_back(static_cast<std::size_t>(kD * tokens));
    for (auto& v : x.back()) v = dist(rng);
    y.emplace_back(x.back().size());
  }
  std::vector<Tensor> in, out;
  std::size_t next = 0;
  for (auto _ : state) {
    in.clear();
    out.clear();
    for (int e = 0; e < experts; ++e) {
      // gate and up are two copies of one matrix: the same bytes to read as distinct weights
      auto* g = const_cast<std::byte*>(gate.copies[next % copies].data());
      auto* u = const_cast<std::byte*>(gate.copies[(next + 1) % copies].data());
      auto* d = const_cast<std::byte*>(down.copies[next % copies].data());
      next = (next + 2) % copies;
      in.insert(in.end(), {Tensor{DType::q4_k, {kD, kF, 1, 1}, g}, Tensor{DType::q4_k, {kD, kF, 1, 1}, u},
                           Tensor{DType::q6_k, {kF, kD, 1, 1}, d},
                           Tensor{DType::f32, {kD, tokens, 1, 1}, x[static_cast<std::size_t>(e)].data()}});
      out.push_back(Tensor{DType::f32, {kD, tokens, 1, 1}, y[static_cast<std::size_t>(e)].data()});
    }
    Status s;
    if (group) {
      s = c->run(OpCall{Op::expert_ffn_group, in, out, {}});
    } else {
      for (int e = 0; s && e < experts; ++e) {
        s = c->run(OpCall{Op::expert_ffn,
                          std::span<const Tensor>(in).subspan(static_cast<std::size_t>(4 * e), 4),
                          std::span<Tensor>(out).subspan(static_cast<std::size_t>(e), 1),
                          {}});
      }
    }
    if (!s) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * experts * static_cast<std::int64_t>(bytes));
}

// A gpt-oss layer's routed experts (hidden 2880, experts of 2880, MXFP4 as OpenAI ships them, biases, clamped SwiGLU):
// `experts` of them over `tokens` tokens each. With one token they read one X, as the engine passes a decode step's h
// to every routed expert; otherwise each its own rows. Every iteration runs both forms on distinct experts cycled
// from DRAM as above, one expert_ffn_clamped call per expert and one expert_ffn_clamped_group call for all, in
// alternating order, so both see the same machine (two rows' figures drift apart on a busy one). Counters: the mean
// time of each form and `speedup`, the median over iterations of one_by_one / group.
void gpt_oss_experts(benchmark::State& state, int experts, std::int64_t tokens, const std::string& path) {
  auto c = compute("auto", 2, path);
  if (!c || !c->supports(Op::expert_ffn_clamped_group, DType::mxfp4)) {
    state.SkipWithError("no expert_ffn_clamped_group for mxfp4 in this cpu plugin");
    return;
  }
  constexpr std::int64_t kD = 2880, kF = 2880;
  const Matrix& w = matrix(DType::mxfp4, {"", kD, kF});  // gate, up and down have the same shape
  const std::size_t copies = w.copies.size();
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::vector<float>> x, y;
  for (int e = 0; e < (tokens == 1 ? 1 : experts); ++e) {
    x.emplace_back(static_cast<std::size_t>(kD * tokens));
    for (auto& v : x.back()) v = dist(rng);
  }
  for (int e = 0; e < experts; ++e) y.emplace_back(static_cast<std::size_t>(kD * tokens));
  std::vector<float> b_f(static_cast<std::size_t>(kF)), b_d(static_cast<std::size_t>(kD));
  for (auto& v : b_f) v = dist(rng);
  for (auto& v : b_d) v = dist(rng);
  OpParams p;
  p.scale = 1.702f;  // gpt-oss's alpha and limit
  p.eps = 7.0f;
  std::vector<Tensor> in, out;
  std::size_t next = 0;
  // Seconds of one form on the next experts.
  const auto timed = [&](bool group) -> Expected<double> {
    in.clear();
    out.clear();
    for (int e = 0; e < experts; ++e) {
      const auto weight = [&](std::size_t i) { return const_cast<std::byte*>(w.copies[(next + i) % copies].data()); };
      float* xe = x[tokens == 1 ? 0 : static_cast<std::size_t>(e)].data();
      in.insert(in.end(),
                {Tensor{DType::mxfp4, {kD, kF, 1, 1}, weight(0)}, Tensor{DType::mxfp4, {kD, kF, 1, 1}, weight(1)},
                 Tensor{DType::mxfp4, {kF, kD, 1, 1}, weight(2)}, Tensor{DType::f32, {kD, tokens, 1, 1}, xe},
                 Tensor{DType::f32, {kF, 1, 1, 1}, b_f.data()}, Tensor{DType::f32, {kF, 1, 1, 1}, b_f.data()},
                 Tensor{DType::f32, {kD, 1, 1, 1}, b_d.data()}});
      out.push_back(Tensor{DType::f32, {kD, tokens, 1, 1}, y[static_cast<std::size_t>(e)].data()});
      next = (next + 3) % copies;
    }
    const auto start = std::chrono::steady_clock::now();
    Status s;
    if (group) {
      s = c->run(OpCall{Op::expert_ffn_clamped_group, in, out, p});
    } else {
      for (int e = 0; s && e < experts; ++e) {
        s = c->run(OpCall{Op::expert_ffn_clamped,
                          std::span<const Tensor>(in).subspan(static_cast<std::size_t>(7 * e), 7),
                          std::span<Tensor>(out).subspan(static_cast<std::size_t>(e), 1), p});
      }
    }
    if (!s) return s;
    benchmark::DoNotOptimize(y.data());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double one_total = 0.0, group_total = 0.0;
  std::vector<double> ratios;
  for (auto _ : state) {
    const bool group_first = ratios.size() % 2 == 1;
    auto a = timed(group_first), b = timed(!group_first);
    if (!a || !b) {
      state.SkipWithError((a ? b : a).error().to_string().c_str());
      return;
    }
    const double one = group_first ? *b : *a, group = group_first ? *a : *b;
    one_total += one;
    group_total += group;
    ratios.push_back(one / group);
  }
  std::nth_element(ratios.begin(), ratios.begin() + static_cast<std::ptrdiff_t>(ratios.size() / 2), ratios.end());
  const auto n = static_cast<double>(state.iterations());
  state.counters["one_by_one_us"] = 1e6 * one_total / n;
  state.counters["group_us"] = 1e6 * group_total / n;
  state.counters["speedup"] = ratios[ratios.size() / 2];
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 * experts * 3 *
                          static_cast<std::int64_t>(w.bytes));
}

// Qwen3-Next-80B-A3B's gated delta rule on one layer (16 key heads, 32 value heads, 128 x 128 state per value head:
// 2 MiB, read and written twice per token) over `tokens` tokens: microseconds per token, and the state's bytes
// touched per second.
void qwen3_next_delta_rule(benchmark::State& state, std::int64_t tokens, int threads) {
  auto c = compute("auto", threads);
  if (!c || !c->supports(Op::gated_delta_rule, DType::f32)) {
    state.SkipWithError("no gated_delta_rule in this cpu plugin");
    return;
  }
  constexpr std::int64_t kDk = 128, kDv = 128, kHk = 16, kHv = 32;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const auto filled = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = dist(rng);
    return v;
  };
  auto q = filled(kDk * kHk * tokens), k = filled(kDk * kHk * tokens), v = filled(kDv * kHv * tokens);
  auto a = filled(kHv * tokens), b = filled(kHv * tokens), dt = filled(kHv), A = filled(kHv);
  for (auto& x : A) x = -std::abs(x);
  std::vector<float> o(v.size()), st(static_cast<std::size_t>(kDv * kDk * kHv));
  const Tensor in[] = {
      Tensor{DType::f32, {kDk, kHk, tokens, 1}, q.data()}, Tensor{DType::f32, {kDk, kHk, tokens, 1}, k.data()},
      Tensor{DType::f32, {kDv, kHv, tokens, 1}, v.data()}, Tensor{DType::f32, {kHv, tokens, 1, 1}, a.data()},
      Tensor{DType::f32, {kHv, tokens, 1, 1}, b.data()},   Tensor{DType::f32, {kHv, 1, 1, 1}, A.data()},
      Tensor{DType::f32, {kHv, 1, 1, 1}, dt.data()}};
  Tensor out[] = {Tensor{DType::f32, {kDv, kHv, tokens, 1}, o.data()},
                  Tensor{DType::f32, {kDv, kDk, kHv, 1}, st.data()}};
  for (auto _ : state) {
    if (auto s = c->run(OpCall{Op::gated_delta_rule, in, out, {}}); !s) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(o.data());
  }
  const auto per_token_bytes = static_cast<std::int64_t>(4 * st.size() * sizeof(float));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * tokens * per_token_bytes);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * tokens);
}

const int kRegistered = [] {
  const DType types[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0, DType::q2_k,
                         DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k, DType::mxfp4};
  const char* env = std::getenv("COLIBRI_BENCH_BASELINE_PLUGIN");
  const std::string baseline = env != nullptr ? env : "";
  // `label` on this build's plugin; with a baseline plugin and `compare`, also `base/label` on that one, first.
  const auto add = [&](const std::string& label, DType t, const std::string& isa, int threads, std::int64_t tokens,
                       bool cached, const Shape& shape, bool compare) {
    for (const bool base : {true, false}) {
      if (base && (!compare || baseline.empty())) continue;
      benchmark::RegisterBenchmark((base ? "base/" + label : label).c_str(), matvec, t, isa, threads, tokens,
                                   base ? baseline : std::string(CPU_PLUGIN_PATH), cached, shape)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  };
  for (DType t : types) {
    const std::string name(to_string(t));
    for (int threads : {1, 2}) {
      add("matvec/" + name + "/auto/threads:" + std::to_string(threads), t, "auto", threads, 1, false, kSquare, true);
    }
    add("cached/matvec/" + name + "/auto/threads:1", t, "auto", 1, 1, true, kSquare, true);
    for (const char* isa : {"avx2", "avxvnni", "scalar"}) {
      add("matvec/" + name + "/" + isa + "/threads:1", t, isa, 1, 1, false, kSquare, false);
    }
    for (const Shape& shape : kExpertShapes) {
      add(std::string(shape.name) + "matvec/" + name + "/auto/threads:2", t, "auto", 2, 1, false, shape, true);
      // The same rows' arithmetic from the caches: how the kernel fares at the shape's K (a row of 8, 22 or 3
      // super-blocks) against the square matrix's 16.
      add("cached/" + std::string(shape.name) + "matvec/" + name + "/auto/threads:1", t, "auto", 1, 1, true, shape,
          true);
    }
    // compute.prefetch side by side: the weight stream's software prefetches to L1 or to L2, from DRAM.
    for (const char* where : {"l1", "l2"}) {
      add("matvec/" + name + "/prefetch_" + where + "/threads:2", t, std::string("auto+") + where, 2, 1, false, kSquare,
          false);
      add(std::string(kExpertShapes[2].name) + "matvec/" + name + "/prefetch_" + where + "/threads:2", t,
          std::string("auto+") + where, 2, 1, false, kExpertShapes[2], false);
    }
    // A small batch (prefill / several sequences): the matrix is read once for 8 tokens.
    add("matmul8/" + name + "/auto/threads:2", t, "auto", 2, 8, false, kSquare, true);
    // The multi-token kernels' arithmetic from the caches: 8 tokens (a full tile), 4 (a Qwen3-MoE expert's share
    // of a 64-token prefill chunk: 64 x top-8 / 128 experts), 2 and 3 (its experts that got fewer), 9 and 11 (a full
    // tile and a remainder).
    for (const std::int64_t tokens : {2, 3, 4, 8, 9, 11}) {
      for (const char* isa : {"auto", "avx2", "avxvnni"}) {
        add("cached/matmul" + std::to_string(tokens) + "/" + name + "/" + isa + "/threads:1", t, isa, 1, tokens, true,
            kSquare, true);
      }
    }
  }
  // A decode step's 8 routed experts, and a 64-token prefill chunk's share of 32 of its 128 experts (4 tokens each).
  for (const auto& [label, experts, tokens] :
       {std::tuple{"decode8", 8, std::int64_t{1}}, std::tuple{"prefill32x4", 32, std::int64_t{4}}}) {
    for (const bool group : {false, true}) {
      const std::string name = std::string("qwen3_experts/") + label + (group ? "/group" : "/one_by_one");
      for (const bool base : {true, false}) {
        if (base && baseline.empty()) continue;
        benchmark::RegisterBenchmark((base ? "base/" + name : name).c_str(), qwen3_experts, experts, tokens, group,
                                     base ? baseline : std::string(CPU_PLUGIN_PATH))
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  // gpt-oss: a decode step's 4 routed experts (top-4), and a 64-token prefill chunk's share of gpt-oss-20b's 32
  // experts (8 tokens each).
  for (const auto& [label, experts, tokens] :
       {std::tuple{"decode4", 4, std::int64_t{1}}, std::tuple{"prefill32x8", 32, std::int64_t{8}}}) {
    const std::string name = std::string("gpt_oss_experts/") + label + "/side_by_side";
    for (const bool base : {true, false}) {
      if (base && baseline.empty()) continue;
      benchmark::RegisterBenchmark((base ? "base/" + name : name).c_str(), gpt_oss_experts, experts, tokens,
                                   base ? baseline : std::string(CPU_PLUGIN_PATH))
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  for (const std::int64_t tokens : {std::int64_t{1}, std::int64_t{64}}) {
    for (const int threads : {1, 2}) {
      benchmark::RegisterBenchmark(
          ("qwen3_next_delta_rule/tokens:" + std::to_string(tokens) + "/threads:" + std::to_string(threads)).c_str(),
          qwen3_next_delta_rule, tokens, threads)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
  return 0;
}();

}  // namespace

#else
// Built without the SDK testing library (COLIBRI_BUILD_TESTS=OFF): nothing to measure.
#endif

BENCHMARK_MAIN();
