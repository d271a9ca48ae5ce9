// Op throughput of the Vulkan plugin on whatever device is present (lavapipe in CI):
//   colibri_bench_vulkan_ops [--benchmark_filter=Matmul]
// Tensors live in device buffers, as the engine's would; each iteration is one synchronous run().
#include <benchmark/benchmark.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"

namespace {

using namespace colibri::sdk;

// The plugin's compute object with these options; null without a Vulkan device.
std::shared_ptr<Compute> make_compute(const std::map<std::string, std::string>& options) {
  auto lib = testing::LoadedPlugin::load(VULKAN_PLUGIN_PATH);
  if (!lib) return nullptr;
  auto obj = (*lib)->create_as<Compute>(options);
  return obj ? *obj : nullptr;
}

std::shared_ptr<Compute>& compute() {
  static std::shared_ptr<Compute> c = make_compute({});
  return c;
}

struct DeviceTensor {
  std::unique_ptr<Buffer> buffer;
  Tensor tensor;
};

DeviceTensor upload(Compute& c, DType type, std::array<std::int64_t, 4> ne, const void* data) {
  const std::size_t bytes = row_bytes(type, ne[0]) * static_cast<std::size_t>(ne[1] * ne[2] * ne[3]);
  DeviceTensor t;
  auto made = c.allocate(bytes);
  if (!made) return t;
  t.buffer = std::move(*made);
  if (data != nullptr) (void)(*c.copy_to_device_async(data, *t.buffer, 0, bytes))->wait();
  t.tensor = Tensor{type, ne, nullptr, t.buffer.get(), 0};
  return t;
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Args: weight type id, K (= N), T.
void BM_Matmul(benchmark::State& state) {
  auto c = compute();
  if (!c) {
    state.SkipWithError("no Vulkan device");
    return;
  }
  const auto type = static_cast<DType>(state.range(0));
  const std::int64_t k = state.range(1), n = state.range(1), t = state.range(2);
  const auto wf = random_floats(static_cast<std::size_t>(k * n), 1);
  std::vector<std::byte> w(row_bytes(type, k) * static_cast<std::size_t>(n));
  (void)colibri::quant::quantize_row(type, wf.data(), w.data(), k * n);
  const auto xf = random_floats(static_cast<std::size_t>(k * t), 2);
  auto wt = upload(*c, type, {k, n, 1, 1}, w.data());
  auto xt = upload(*c, DType::f32, {k, t, 1, 1}, xf.data());
  auto yt = upload(*c, DType::f32, {n, t, 1, 1}, nullptr);
  Tensor in[] = {wt.tensor, xt.tensor};
  for (auto _ : state) {
    if (!c->run(OpCall{Op::matmul, in, std::span<Tensor>(&yt.tensor, 1), {}})) state.SkipWithError("run failed");
  }
  state.SetLabel(std::string(to_string(type)) + " T=" + std::to_string(t));
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(w.size()) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * k * n * t * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Matmul)
    ->ArgsProduct({{static_cast<int>(DType::f16), static_cast<int>(DType::q8_0), static_cast<int>(DType::q4_k),
                    static_cast<int>(DType::q6_k), static_cast<int>(DType::mxfp4)},
                   {2048},
                   {1, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: KV type id, cached keys S; 32 heads of 128 over 8 KV heads, one query.
void BM_Attention(benchmark::State& state) {
  auto c = compute();
  if (!c) {
    state.SkipWithError("no Vulkan device");
    return;
  }
  const auto type = static_cast<DType>(state.range(0));
  const std::int64_t hd = 128, heads = 32, kvh = 8, s = state.range(1);
  const auto kvf = random_floats(static_cast<std::size_t>(hd * kvh * s), 3);
  std::vector<std::byte> kv(row_bytes(type, hd) * static_cast<std::size_t>(kvh * s));
  (void)colibri::quant::quantize_row(type, kvf.data(), kv.data(), hd * kvh * s);
  const auto qf = random_floats(static_cast<std::size_t>(hd * heads), 4);
  auto qt = upload(*c, DType::f32, {hd, heads, 1, 1}, qf.data());
  auto kt = upload(*c, type, {hd, kvh, s, 1}, kv.data());
  auto vt = upload(*c, type, {hd, kvh, s, 1}, kv.data());
  auto ot = upload(*c, DType::f32, {hd, heads, 1, 1}, nullptr);
  Tensor in[] = {qt.tensor, kt.tensor, vt.tensor};
  OpParams p;
  p.position = static_cast<std::int32_t>(s - 1);
  p.scale = 0.088f;
  for (auto _ : state) {
    if (!c->run(OpCall{Op::attention, in, std::span<Tensor>(&ot.tensor, 1), p})) state.SkipWithError("run failed");
  }
  state.SetLabel(std::string(to_string(type)) + " S=" + std::to_string(s));
  state.counters["kv_GB/s"] =
      benchmark::Counter(2.0 * static_cast<double>(kv.size()) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{static_cast<int>(DType::f16), static_cast<int>(DType::q8_0)}, {1024}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_RmsNorm(benchmark::State& state) {
  auto c = compute();
  if (!c) {
    state.SkipWithError("no Vulkan device");
    return;
  }
  const std::int64_t d = 4096, rows = state.range(0);
  const auto xf = random_floats(static_cast<std::size_t>(d * rows), 5);
  const auto wf = random_floats(static_cast<std::size_t>(d), 6);
  auto xt = upload(*c, DType::f32, {d, rows, 1, 1}, xf.data());
  auto wt = upload(*c, DType::f32, {d, 1, 1, 1}, wf.data());
  auto yt = upload(*c, DType::f32, {d, rows, 1, 1}, nullptr);
  Tensor in[] = {xt.tensor, wt.tensor};
  OpParams p;
  p.eps = 1e-5f;
  for (auto _ : state) {
    if (!c->run(OpCall{Op::rms_norm, in, std::span<Tensor>(&yt.tensor, 1), p})) state.SkipWithError("run failed");
  }
}
BENCHMARK(BM_RmsNorm)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

// A decode step's 8 experts of one layer (Qwen3-MoE's shape scaled down for lavapipe: d 512, f 256, q4_k, one
// token each): arg 0 runs 8 expert_ffn calls (8 submissions and waits), arg 1 one expert_ffn_group call.
void BM_ExpertsOfALayer(benchmark::State& state) {
  auto c = compute();
  if (!c) {
    state.SkipWithError("no Vulkan device");
    return;
  }
  const bool group = state.range(0) != 0;
  const std::int64_t d = 512, f = 256;
  constexpr int kExperts = 8;
  std::vector<DeviceTensor> keep;
  std::vector<Tensor> in, out;
  for (int e = 0; e < kExperts; ++e) {
    for (const auto& [rows, cols] : {std::pair{f, d}, std::pair{f, d}, std::pair{d, f}}) {
      const auto wf = random_floats(static_cast<std::size_t>(rows * cols), static_cast<unsigned>(10 * e + rows));
      std::vector<std::byte> w(row_bytes(DType::q4_k, cols) * static_cast<std::size_t>(rows));
      (void)colibri::quant::quantize_row(DType::q4_k, wf.data(), w.data(), rows * cols);
      keep.push_back(upload(*c, DType::q4_k, {cols, rows, 1, 1}, w.data()));
      in.push_back(keep.back().tensor);
    }
    const auto xf = random_floats(static_cast<std::size_t>(d), static_cast<unsigned>(e));
    keep.push_back(upload(*c, DType::f32, {d, 1, 1, 1}, xf.data()));
    in.push_back(keep.back().tensor);
    keep.push_back(upload(*c, DType::f32, {d, 1, 1, 1}, nullptr));
    out.push_back(keep.back().tensor);
  }
  for (auto _ : state) {
    if (group) {
      if (!c->run(OpCall{Op::expert_ffn_group, in, out, {}})) state.SkipWithError("run failed");
      continue;
    }
    for (int e = 0; e < kExperts; ++e) {
      const OpCall call{Op::expert_ffn,
                        std::span<Tensor>(in).subspan(4 * e, 4),
                        std::span<Tensor>(out).subspan(static_cast<std::size_t>(e), 1),
                        {}};
      if (!c->run(call)) state.SkipWithError("run failed");
    }
  }
  state.SetLabel(group ? "one expert_ffn_group" : "8 expert_ffn");
}
BENCHMARK(BM_ExpertsOfALayer)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

// A KV prefix copied between two caches in unmapped device memory (a discrete GPU's: the server's n choices, a kept
// prompt taken by a new request): 48 layers' K and V of 4 MiB each. Arg 0 goes through host memory (a download and an
// upload per buffer, what the engine does without kDeviceCopyInterface), arg 1 copies between the buffers on the
// device (copy_between_async). On lavapipe device memory is host memory, so this measures the staging copies saved,
// not a bus crossed.
void BM_KvPrefixCopy(benchmark::State& state) {
  static std::shared_ptr<Compute> unmapped = make_compute({{"map_device_memory", "false"}});
  auto* on_device =
      unmapped ? static_cast<ComputeDeviceCopy*>(unmapped->query_interface(kDeviceCopyInterface)) : nullptr;
  if (on_device == nullptr) {
    state.SkipWithError("no Vulkan device");
    return;
  }
  const bool direct = state.range(0) != 0;
  constexpr std::size_t kBuffers = 96, kBytes = std::size_t{4} << 20;
  std::vector<std::unique_ptr<Buffer>> from, to;
  for (std::size_t i = 0; i < kBuffers; ++i) {
    auto a = unmapped->allocate(kBytes), b = unmapped->allocate(kBytes);
    if (!a || !b) {
      state.SkipWithError("no room for the caches");
      return;
    }
    from.push_back(std::move(*a));
    to.push_back(std::move(*b));
  }
  std::vector<std::byte> host(kBytes, std::byte{1});
  for (std::size_t i = 0; i < kBuffers; ++i) {  // touched once before timing: lavapipe maps pages at first use
    for (auto* b : {from[i].get(), to[i].get()})
      (void)(*unmapped->copy_to_device_async(host.data(), *b, 0, kBytes))->wait();
  }
  for (auto _ : state) {
    std::vector<std::unique_ptr<Event>> started;
    for (std::size_t i = 0; i < kBuffers; ++i) {
      if (direct) {
        auto copy = on_device->copy_between_async(*from[i], 0, *to[i], 0, kBytes);
        if (copy) started.push_back(std::move(*copy));
        continue;
      }
      (void)(*unmapped->copy_to_host_async(*from[i], 0, host.data(), kBytes))->wait();
      (void)(*unmapped->copy_to_device_async(host.data(), *to[i], 0, kBytes))->wait();
    }
    for (auto& e : started) (void)e->wait();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBuffers * kBytes));
  state.SetLabel(direct ? "on the device" : "through host memory");
}
BENCHMARK(BM_KvPrefixCopy)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
