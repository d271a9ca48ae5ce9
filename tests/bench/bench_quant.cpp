// Block-format throughput, single thread: dequantize GB/s of quantized bytes per instruction set,
// fp16/bf16 conversion, and the reference quantizers (what bounds a conversion's speed).
//   colibri_bench_quant --benchmark_filter=Dequantize
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "colibri/quant/float16.hpp"
#include "colibri/quant/quant.hpp"

namespace {

using colibri::quant::Isa;
using colibri::sdk::DType;

constexpr std::int64_t kElems = 256 * 1024;  // 1 MiB of floats out: stays in L2/L3

std::vector<float> gaussian(std::int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

void BM_Dequantize(benchmark::State& state, DType type, Isa isa) {
  if (!colibri::quant::isa_available(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const auto x = gaussian(kElems);
  std::vector<std::uint8_t> q(colibri::sdk::row_bytes(type, kElems));
  std::vector<float> y(static_cast<std::size_t>(kElems));
  if (!colibri::quant::quantize_row(type, x.data(), q.data(), kElems).is_ok()) {
    state.SkipWithError("quantize_row failed");
    return;
  }
  for (auto _ : state) {
    auto st = colibri::quant::dequantize_row(type, q.data(), y.data(), kElems, isa);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(q.size()));
  state.counters["Gelem/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kElems / 1e9, benchmark::Counter::kIsRate);
}

void BM_Quantize(benchmark::State& state, DType type) {
  const auto x = gaussian(kElems / 4);
  std::vector<std::uint8_t> q(colibri::sdk::row_bytes(type, kElems / 4));
  for (auto _ : state) {
    auto st = colibri::quant::quantize_row(type, x.data(), q.data(), kElems / 4);
    benchmark::DoNotOptimize(st);
    benchmark::ClobberMemory();
  }
  // Bytes of f32 input consumed.
  state.SetBytesProcessed(state.iterations() * (kElems / 4) * 4);
}

void BM_FloatToHalf(benchmark::State& state, bool bf16, Isa isa) {
  if (!colibri::quant::isa_available(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const auto x = gaussian(kElems);
  std::vector<std::uint16_t> h(static_cast<std::size_t>(kElems));
  for (auto _ : state) {
    if (bf16) {
      colibri::quant::fp32_to_bf16_row(x.data(), h.data(), kElems, isa);
    } else {
      colibri::quant::fp32_to_fp16_row(x.data(), h.data(), kElems, isa);
    }
    benchmark::DoNotOptimize(h.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kElems * 2);
}

const struct {
  DType type;
  const char* name;
} kTypes[] = {{DType::f16, "f16"},   {DType::bf16, "bf16"}, {DType::q8_0, "q8_0"},
              {DType::q4_0, "q4_0"}, {DType::q2_k, "q2_k"}, {DType::q3_k, "q3_k"},
              {DType::q4_k, "q4_k"}, {DType::q5_k, "q5_k"}, {DType::q6_k, "q6_k"}};

const struct {
  Isa isa;
  const char* name;
} kIsas[] = {{Isa::scalar, "scalar"}, {Isa::avx2, "avx2"}, {Isa::avx512, "avx512"}};

[[maybe_unused]] const bool kRegistered = [] {
  for (const auto& t : kTypes) {
    for (const auto& i : kIsas) {
      benchmark::RegisterBenchmark((std::string("Dequantize/") + t.name + "/" + i.name).c_str(), BM_Dequantize, t.type,
                                   i.isa);
    }
  }
  for (const auto& t : kTypes) {
    benchmark::RegisterBenchmark((std::string("Quantize/") + t.name).c_str(), BM_Quantize, t.type);
  }
  for (const auto& i : kIsas) {
    benchmark::RegisterBenchmark((std::string("FloatToHalf/f16/") + i.name).c_str(), BM_FloatToHalf, false, i.isa);
    benchmark::RegisterBenchmark((std::string("FloatToHalf/bf16/") + i.name).c_str(), BM_FloatToHalf, true, i.isa);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
