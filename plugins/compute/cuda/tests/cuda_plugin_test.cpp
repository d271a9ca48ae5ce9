// CUDA-specific behaviour the conformance suite does not cover: loading and score() without a
// driver or device, device info, host-memory tensors, shapes past one warp's worth of chunks and
// every token-tile size of the matmul kernel, wide heads and long caches in attention, many
// asynchronous copies in flight, copies ordered after the queued ops that use their buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/reference_ops.hpp"
#include "colibri/sdk/testing/test_data.hpp"
#include "cuda_plugin_path.hpp"

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
using ct::randn;
using ct::ScopedEnv;

std::shared_ptr<ct::LoadedPlugin> plugin() {
  auto lib = ct::LoadedPlugin::load(cuda_plugin_path());
  if (!lib) ADD_FAILURE() << lib.error().to_string();
  return lib ? *lib : nullptr;
}

bool cuda_required() {
  const char* v = std::getenv("COLIBRI_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

// The Compute, or a skip saying why there is none (a failure when COLIBRI_REQUIRE_CUDA=1).
#define CUDA_COMPUTE(var, options) CUDA_COMPUTE_HOST(var, options, nullptr)
// The same with a RecordingHost for the plugin's counters.
#define CUDA_COMPUTE_HOST(var, options, host)                                                        \
  auto var##_lib = plugin();                                                                         \
  ASSERT_NE(var##_lib, nullptr);                                                                     \
  auto var##_made = var##_lib->create_as<Compute>(options, host);                                    \
  if (!var##_made && var##_made.error().code() == StatusCode::unsupported) {                         \
    if (cuda_required()) FAIL() << "COLIBRI_REQUIRE_CUDA=1 but: " << var##_made.error().to_string(); \
    GTEST_SKIP() << var##_made.error().to_string();                                                  \
  }                                                                                                  \
  ASSERT_TRUE(var##_made) << var##_made.error().to_string();                                         \
  Compute& var = **var##_made

bool names_what_is_missing(const std::string& reason) {
  for (const char* word : {"NVIDIA driver", "CUDA device", "CUDA_VISIBLE_DEVICES", "cannot run this build"}) {
    if (reason.find(word) != std::string::npos) return true;
  }
  return false;
}

std::size_t bytes_of(DType type, const std::array<std::int64_t, 4>& ne) {
  return row_bytes(type, ne[0]) * static_cast<std::size_t>(ne[1] * ne[2] * ne[3]);
}

struct HostArg {
  DType type;
  std::array<std::int64_t, 4> ne;
  void* host;
};

// Runs an op with every tensor in a device buffer (device = true) or passed as host memory.
Status run_op(Compute& c, Op op, const std::vector<HostArg>& in, const std::vector<HostArg>& out, OpParams p,
              bool device = true) {
  std::vector<std::unique_ptr<Buffer>> keep;
  auto place = [&](const HostArg& a, Tensor& t) -> Status {
    t = Tensor{a.type, a.ne, a.host, nullptr, 0};
    if (!device) return {};
    auto b = c.allocate(bytes_of(a.type, a.ne));
    if (!b) return b.error();
    auto ev = c.copy_to_device_async(a.host, **b, 0, bytes_of(a.type, a.ne));
    if (!ev) return ev.error();
    if (Status s = (*ev)->wait(); !s) return s;
    t = Tensor{a.type, a.ne, nullptr, b->get(), 0};
    keep.push_back(std::move(*b));
    return {};
  };
  std::vector<Tensor> ti(in.size()), to(out.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (Status s = place(in[i], ti[i]); !s) return s;
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (Status s = place(out[i], to[i]); !s) return s;
  }
  if (Status s = c.run(OpCall{op, ti, to, p}); !s) return s;
  if (!device) return {};
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto ev = c.copy_to_host_async(*to[i].buffer, 0, out[i].host, bytes_of(out[i].type, out[i].ne));
    if (!ev) return ev.error();
    if (Status s = (*ev)->wait(); !s) return s;
  }
  return c.synchronize();
}

std::vector<std::byte> quantized(DType type, const std::vector<float>& f) {
  std::vector<std::byte> q(row_bytes(type, static_cast<std::int64_t>(f.size())));
  EXPECT_TRUE(colibri::quant::quantize_row(type, f.data(), q.data(), static_cast<std::int64_t>(f.size())));
  return q;
}

// ------------------------------------------------------------------ without a device

TEST(CudaPlugin, LoadsEverywhereAndScoresZeroWithAReasonWhenItCannotRun) {
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  EXPECT_EQ(lib->descriptor().kind, PluginKind::compute);
  EXPECT_STREQ(lib->descriptor().name, "cuda");
  const Score s = lib->descriptor().score(HostInfo{});
  auto made = lib->create_as<Compute>({});
  if (s.value == 0) {
    EXPECT_TRUE(names_what_is_missing(s.reason)) << s.reason;
    ASSERT_FALSE(made) << "score() said the backend cannot run (" << s.reason << ") but create() worked";
    EXPECT_EQ(made.error().code(), StatusCode::unsupported) << made.error().to_string();
    EXPECT_TRUE(names_what_is_missing(made.error().message())) << made.error().to_string();
  } else {
    EXPECT_FALSE(s.reason.empty());
    if (!made) {
      EXPECT_EQ(made.error().code(), StatusCode::unsupported) << made.error().to_string();
      EXPECT_FALSE(made.error().message().empty());
    }
  }
}

TEST(CudaPlugin, ScoreIsZeroWhenCudaVisibleDevicesHidesEveryDevice) {
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  ScopedEnv env("CUDA_VISIBLE_DEVICES", "");
  const Score s = lib->descriptor().score(HostInfo{});
  EXPECT_EQ(s.value, 0) << s.reason;
  EXPECT_TRUE(names_what_is_missing(s.reason)) << s.reason;
}

// Off by default until measured on a GPU: supports() says false for expert_ffn_routed until routed_experts turns
// it on, and ops are launched one by one until graphs does.
TEST(CudaPlugin, RoutedExpertsAndGraphsAreOptionsOffByDefault) {
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  for (const std::string name : {"routed_experts", "graphs"}) {
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& o : lib->descriptor().options) {
      if (name == o.name) spec = &o;
    }
    ASSERT_NE(spec, nullptr) << "the descriptor declares " << name;
    EXPECT_EQ(spec->type, OptionType::boolean) << name;
    EXPECT_STREQ(spec->default_value, "false") << name;
  }
}

// ------------------------------------------------------------------ with a device

TEST(CudaPlugin, RequiredDeviceExistsWhenAskedFor) {
  CUDA_COMPUTE(c, {});
  EXPECT_FALSE(c.devices().empty());
}

TEST(CudaPlugin, DeviceDescribesItsArchitectureAndMemory) {
  CUDA_COMPUTE(c, {});
  ASSERT_EQ(c.devices().size(), 1u);
  const DeviceInfo& d = c.devices().front();
  EXPECT_FALSE(d.host_memory);
  EXPECT_EQ(d.capabilities.rfind("sm_", 0), 0u) << d.capabilities;
  EXPECT_GT(d.memory_total, 0u);
  EXPECT_LE(d.memory_available, d.memory_total);
  auto before = c.devices().front().memory_available;
  auto big = c.allocate(std::size_t{256} << 20);
  ASSERT_TRUE(big) << big.error().to_string();
  EXPECT_LT(c.devices().front().memory_available, before) << "memory_available must follow allocations";
}

TEST(CudaPlugin, AnUnknownDeviceIndexIsAClearError) {
  CUDA_COMPUTE(c, {});
  (void)c;
  auto lib = plugin();
  auto bad = lib->create_as<Compute>({{"device", "99"}});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.error().message().find("compute.device"), std::string::npos) << bad.error().to_string();
}

TEST(CudaPlugin, HostMemoryTensorsGiveTheSameBitsAsDeviceBuffers) {
  CUDA_COMPUTE(c, {});
  const std::int64_t k = 4096, n = 100, t = 5;
  auto wq = quantized(DType::q4_k, randn(static_cast<std::size_t>(k * n), 1, 0.1f));
  auto x = randn(static_cast<std::size_t>(k * t), 2);
  std::vector<float> on_device(static_cast<std::size_t>(n * t)), on_host(on_device.size(), std::nanf(""));
  const std::vector<HostArg> in{{DType::q4_k, {k, n, 1, 1}, wq.data()}, {DType::f32, {k, t, 1, 1}, x.data()}};
  ASSERT_TRUE(run_op(c, Op::matmul, in, {{DType::f32, {n, t, 1, 1}, on_device.data()}}, {}, true));
  ASSERT_TRUE(run_op(c, Op::matmul, in, {{DType::f32, {n, t, 1, 1}, on_host.data()}}, {}, false));
  EXPECT_EQ(0, std::memcmp(on_device.data(), on_host.data(), on_host.size() * sizeof(float)));
  // scale_add accumulates into its output: a host output must be read as well as written.
  std::vector<float> acc(static_cast<std::size_t>(k * t), 1.0f), w{0.5f, 1.0f, 2.0f, -1.0f, 0.0f};
  ASSERT_TRUE(run_op(c, Op::scale_add, {{DType::f32, {k, t, 1, 1}, x.data()}, {DType::f32, {t, 1, 1, 1}, w.data()}},
                     {{DType::f32, {k, t, 1, 1}, acc.data()}}, {}, false));
  for (std::int64_t i = 0; i < t; ++i) {
    const auto at = static_cast<std::size_t>(i * k + 7);
    EXPECT_FLOAT_EQ(acc[at], 1.0f + w[static_cast<std::size_t>(i)] * x[at]) << "token " << i;
  }
}

// On 8-bit activations q4_k and q5_k load W 16 bytes at a time where they can: a W at an address that does not allow
// it (a VRAM slot or shared buffer puts tensors 2-byte aligned) takes word loads of the same bytes, same result; the
// other formats' blocks are never 16-byte aligned and must not care either.
TEST(CudaPlugin, EightBitActivationsGiveTheSameBitsAtAnyAddress) {
  CUDA_COMPUTE(c, {});
  const std::int64_t k = 2048, n = 40, t = 3;
  auto x = randn(static_cast<std::size_t>(k * t), 8);
  for (DType type : {DType::q4_k, DType::q5_k, DType::q6_k, DType::q2_k, DType::q3_k, DType::q8_0, DType::q4_0}) {
    auto w = quantized(type, randn(static_cast<std::size_t>(k * n), 7, 0.1f));
    std::vector<float> results[2];
    for (std::size_t offset : {std::size_t{0}, std::size_t{2}}) {
      auto buf = c.allocate(w.size() + 16);
      ASSERT_TRUE(buf);
      auto ev = c.copy_to_device_async(w.data(), **buf, offset, w.size());
      ASSERT_TRUE(ev);
      ASSERT_TRUE((*ev)->wait());
      auto& y = results[offset == 0 ? 0 : 1];
      y.assign(static_cast<std::size_t>(n * t), std::nanf(""));
      Tensor in[] = {Tensor{type, {k, n, 1, 1}, nullptr, buf->get(), offset},
                     Tensor{DType::f32, {k, t, 1, 1}, x.data(), nullptr, 0}};
      Tensor out{DType::f32, {n, t, 1, 1}, y.data(), nullptr, 0};
      ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}})) << to_string(type);
    }
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)))
        << to_string(type);
    EXPECT_FALSE(std::isnan(results[1][0])) << to_string(type);
  }
}

// run() on device buffers alone returns once its kernels are queued. A copy must still see the buffer as if every
// earlier run() had finished: an upload into W waits for the queued matmuls that read it, a download of Y for those
// that write it. Eight long matmuls (milliseconds each) are queued and W is overwritten at once from registered
// memory (no staging copy delays the DMA); every Y must be the old W's product.
TEST(CudaPlugin, CopiesWaitForQueuedOpsThatUseTheBuffer) {
  CUDA_COMPUTE(c, {});
  auto* reg = static_cast<ComputeHostRegister*>(c.query_interface(kHostRegisterInterface));
  ASSERT_NE(reg, nullptr);
  const std::int64_t k = 4096, n = 4096, t = 256;
  const auto w_old = randn(static_cast<std::size_t>(k * n), 21);
  auto w_new = randn(static_cast<std::size_t>(k * n), 22);
  const auto x = randn(static_cast<std::size_t>(k * t), 23);
  std::vector<float> want(static_cast<std::size_t>(n * t));
  ASSERT_TRUE(run_op(c, Op::matmul,
                     {{DType::f32, {k, n, 1, 1}, const_cast<float*>(w_old.data())},
                      {DType::f32, {k, t, 1, 1}, const_cast<float*>(x.data())}},
                     {{DType::f32, {n, t, 1, 1}, want.data()}}, {}));
  auto upload = [&](const std::vector<float>& v) -> std::unique_ptr<Buffer> {
    auto b = c.allocate(v.size() * sizeof(float));
    EXPECT_TRUE(b);
    if (!b) return nullptr;
    auto ev = c.copy_to_device_async(v.data(), **b, 0, v.size() * sizeof(float));
    EXPECT_TRUE(ev && (*ev)->wait());
    return std::move(*b);
  };
  auto w = upload(w_old), xb = upload(x);
  ASSERT_TRUE(w && xb);
  constexpr int kQueued = 8;
  std::vector<std::unique_ptr<Buffer>> ys;
  for (int i = 0; i < kQueued; ++i) {
    auto y = c.allocate(want.size() * sizeof(float));
    ASSERT_TRUE(y);
    Tensor in[] = {Tensor{DType::f32, {k, n, 1, 1}, nullptr, w.get(), 0},
                   Tensor{DType::f32, {k, t, 1, 1}, nullptr, xb.get(), 0}};
    Tensor out{DType::f32, {n, t, 1, 1}, nullptr, y->get(), 0};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
    ys.push_back(std::move(*y));
  }
  ASSERT_TRUE(reg->register_host(w_new.data(), w_new.size() * sizeof(float)));
  auto overwrite = c.copy_to_device_async(w_new.data(), *w, 0, w_new.size() * sizeof(float));
  ASSERT_TRUE(overwrite);
  ASSERT_TRUE((*overwrite)->wait());
  reg->unregister_host(w_new.data());
  for (int i = 0; i < kQueued; ++i) {
    std::vector<float> got(want.size(), std::nanf(""));
    auto ev = c.copy_to_host_async(*ys[static_cast<std::size_t>(i)], 0, got.data(), got.size() * sizeof(float));
    ASSERT_TRUE(ev);
    ASSERT_TRUE((*ev)->wait());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << "matmul " << i << " of " << kQueued;
  }
  // And W holds the new values: the upload was not lost behind the ops.
  std::vector<float> back(w_new.size());
  auto ev = c.copy_to_host_async(*w, 0, back.data(), back.size() * sizeof(float));
  ASSERT_TRUE(ev && (*ev)->wait());
  EXPECT_EQ(0, std::memcmp(back.data(), w_new.data(), back.size() * sizeof(float)));
}

// K = 4096 gives each lane several chunks (the conformance suite's K = 512 gives at most one),
// K = 4100 a partial last chunk for the float types; T runs through every token-tile size. With exact activations
// the result is the f32 reference's within 1e-4; without (quantized formats then take 8-bit activations) within the
// 8-bit rounding of X, and the batch promise holds either way.
TEST(CudaPlugin, LongRowsAndEveryTokenTileKeepTheBatchPromise) {
  CUDA_COMPUTE(c, {});
  const std::int64_t n = 77, tmax = 40;
  for (DType type : {DType::q4_k, DType::q5_k, DType::q6_k, DType::q8_0, DType::q4_0, DType::q2_k, DType::q3_k,
                     DType::f16, DType::bf16, DType::f32}) {
    const std::int64_t k = dtype_traits(type)->quantized ? 4096 : 4100;
    auto w = quantized(type, randn(static_cast<std::size_t>(k * n), 3, 0.1f));
    const auto wd = ct::ref::dequantize(type, w.data(), k * n);
    auto x = randn(static_cast<std::size_t>(k * tmax), 4);
    const auto want = ct::ref::matmul(DType::f32, wd.data(), k, n, x.data(), tmax, nullptr);
    for (bool exact : {true, false}) {
      OpParams p;
      p.flags = exact ? colibri::sdk::kExactActivations : 0;
      const std::string what = std::string(to_string(type)) + (exact ? " exact" : "");
      std::vector<float> all(static_cast<std::size_t>(n * tmax));
      ASSERT_TRUE(run_op(c, Op::matmul, {{type, {k, n, 1, 1}, w.data()}, {DType::f32, {k, tmax, 1, 1}, x.data()}},
                         {{DType::f32, {n, tmax, 1, 1}, all.data()}}, p));
      for (std::size_t i = 0; i < all.size(); ++i) {
        // 8-bit X: each term is off by at most half a step of its block (at most its 256 elements' amax / 254) times
        // |w|.
        double bound = 1e-4 * (1.0 + std::fabs(want[i]));
        if (!exact) {
          const std::size_t tok = i / static_cast<std::size_t>(n), row = i % static_cast<std::size_t>(n);
          double slack = 0.0;
          for (std::int64_t b = 0; b < k; b += 256) {
            float amax = 0.0f, wsum = 0.0f;
            for (std::int64_t j = b; j < b + 256; ++j) {
              amax = std::max(amax, std::fabs(x[tok * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)]));
              wsum += std::fabs(wd[row * static_cast<std::size_t>(k) + static_cast<std::size_t>(j)]);
            }
            slack += amax / 254.0 * wsum;
          }
          bound += slack * 1.01;
        }
        ASSERT_NEAR(all[i], want[i], bound) << what << " at " << i;
      }
      for (std::int64_t t : {1, 2, 3, 5, 9}) {
        std::vector<float> part(static_cast<std::size_t>(n * t));
        ASSERT_TRUE(run_op(c, Op::matmul,
                           {{type, {k, n, 1, 1}, w.data()}, {DType::f32, {k, t, 1, 1}, x.data() + 11 * k}},
                           {{DType::f32, {n, t, 1, 1}, part.data()}}, p));
        EXPECT_EQ(0, std::memcmp(part.data(), all.data() + 11 * n, part.size() * sizeof(float)))
            << what << ": tokens 11.." << 10 + t << " differ in a batch of " << t << " and of " << tmax;
      }
    }
  }
}

// CUDA grids hold at most 65535 blocks in y: a batch of more tokens must still quantize every token's activations
// (they once sat on grid.y), so tokens past 65535 equal the same token run alone.
TEST(CudaPlugin, MoreTokensThanAGridColumnHolds) {
  CUDA_COMPUTE(c, {});
  const std::int64_t k = 256, n = 4, t = 70000;
  auto w = quantized(DType::q4_k, randn(static_cast<std::size_t>(k * n), 5, 0.1f));
  auto x = randn(static_cast<std::size_t>(k * t), 6);
  std::vector<float> all(static_cast<std::size_t>(n * t));
  ASSERT_TRUE(run_op(c, Op::matmul, {{DType::q4_k, {k, n, 1, 1}, w.data()}, {DType::f32, {k, t, 1, 1}, x.data()}},
                     {{DType::f32, {n, t, 1, 1}, all.data()}}, {}));
  for (std::int64_t tok : {std::int64_t{0}, std::int64_t{65535}, std::int64_t{69999}}) {
    std::vector<float> one(static_cast<std::size_t>(n));
    ASSERT_TRUE(run_op(c, Op::matmul,
                       {{DType::q4_k, {k, n, 1, 1}, w.data()}, {DType::f32, {k, 1, 1, 1}, x.data() + tok * k}},
                       {{DType::f32, {n, 1, 1, 1}, one.data()}}, {}));
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + tok * n, one.size() * sizeof(float))) << "token " << tok;
  }
}

TEST(CudaPlugin, AttentionWithWideHeadsAndALongCache) {
  CUDA_COMPUTE(c, {});
  const std::int64_t heads = 4, kvh = 2, s = 1000, t = 3;
  for (std::int64_t hd : {128, 256}) {
    for (DType kv : {DType::f16, DType::q8_0}) {
      auto kf = randn(static_cast<std::size_t>(hd * kvh * s), 5);
      auto vf = randn(static_cast<std::size_t>(hd * kvh * s), 6);
      auto kb = quantized(kv, kf), vb = quantized(kv, vf);
      const auto kd = ct::ref::dequantize(kv, kb.data(), hd * kvh * s);
      const auto vd = ct::ref::dequantize(kv, vb.data(), hd * kvh * s);
      auto q = randn(static_cast<std::size_t>(hd * heads * t), 7);
      for (std::int32_t window : {0, 300}) {
        OpParams p;
        p.position = 997;
        p.window = window;
        p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> o(q.size());
        ASSERT_TRUE(run_op(c, Op::attention,
                           {{DType::f32, {hd, heads, t, 1}, q.data()},
                            {kv, {hd, kvh, s, 1}, kb.data()},
                            {kv, {hd, kvh, s, 1}, vb.data()}},
                           {{DType::f32, {hd, heads, t, 1}, o.data()}}, p));
        const auto want =
            ct::ref::attention(q.data(), hd, heads, t, kd.data(), vd.data(), kvh, s, p.position, window, p.scale);
        for (std::size_t i = 0; i < o.size(); ++i) {
          ASSERT_NEAR(o[i], want[i], 2e-5 + 1e-5 * std::fabs(want[i]))
              << "hd " << hd << " kv " << to_string(kv) << " window " << window << " at " << i;
        }
      }
    }
  }
}

TEST(CudaPlugin, ManyCopiesInFlightAllArrive) {
  CUDA_COMPUTE(c, {});
  const std::size_t n = 16, bytes = std::size_t{4} << 20;
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<std::unique_ptr<Event>> events;
  std::vector<std::vector<unsigned char>> want(n);
  std::vector<unsigned char> src(bytes);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < bytes; j += 4096) src[j] = static_cast<unsigned char>(i * 31 + j / 4096);
    want[i] = src;
    auto b = c.allocate(bytes);
    ASSERT_TRUE(b) << b.error().to_string();
    // One source array for all: it is the caller's again as soon as the call returns.
    auto ev = c.copy_to_device_async(src.data(), **b, 0, bytes);
    ASSERT_TRUE(ev) << ev.error().to_string();
    bufs.push_back(std::move(*b));
    events.push_back(std::move(*ev));
  }
  ASSERT_TRUE(c.synchronize());
  for (auto& e : events) EXPECT_TRUE(e->ready());
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<unsigned char> back(bytes);
    auto ev = c.copy_to_host_async(*bufs[i], 0, back.data(), bytes);
    ASSERT_TRUE(ev) << ev.error().to_string();
    ASSERT_TRUE((*ev)->wait());
    EXPECT_EQ(back, want[i]) << "buffer " << i;
  }
}

TEST(CudaPlugin, RegisteredHostMemoryUploadsDirectlyAndUnregisters) {
  CUDA_COMPUTE(c, {});
  auto* reg = static_cast<ComputeHostRegister*>(c.query_interface(kHostRegisterInterface));
  ASSERT_NE(reg, nullptr) << "the CUDA backend offers host registration";
  const std::size_t bytes = std::size_t{8} << 20;
  void* raw = std::aligned_alloc(4096, bytes);
  ASSERT_NE(raw, nullptr);
  auto* src = static_cast<unsigned char*>(raw);
  for (std::size_t j = 0; j < bytes; ++j) src[j] = static_cast<unsigned char>(j * 7 + 3);
  ASSERT_TRUE(reg->register_host(raw, bytes));
  auto b = c.allocate(bytes);
  ASSERT_TRUE(b) << b.error().to_string();
  // A part inside the region and the whole of it: both arrive once the events complete.
  auto part = c.copy_to_device_async(src + 4096, **b, 0, 4096);
  auto whole = c.copy_to_device_async(src, **b, 0, bytes);
  ASSERT_TRUE(part && whole);
  ASSERT_TRUE((*part)->wait());
  ASSERT_TRUE((*whole)->wait());
  std::vector<unsigned char> back(bytes);
  auto down = c.copy_to_host_async(**b, 0, back.data(), bytes);
  ASSERT_TRUE(down) << down.error().to_string();
  ASSERT_TRUE((*down)->wait());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), src));
  reg->unregister_host(raw);
  // Unregistered, the same memory is staged again: the source may change right after the call.
  auto staged = c.copy_to_device_async(src, **b, 0, bytes);
  ASSERT_TRUE(staged);
  std::fill(src, src + bytes, 0);
  ASSERT_TRUE((*staged)->wait());
  down = c.copy_to_host_async(**b, 0, back.data(), bytes);
  ASSERT_TRUE(down && (*down)->wait());
  EXPECT_EQ(back[4097], static_cast<unsigned char>(4097 * 7 + 3));
  EXPECT_FALSE(reg->register_host(nullptr, 0)) << "an empty region is an error";
  std::free(raw);
}

// ------------------------------------------------------------------ expert_ffn_routed

// A device buffer of `type` {ne} holding `data` (uninitialised without it), kept alive by `keep`.
Tensor on_device(Compute& c, std::vector<std::unique_ptr<Buffer>>& keep, DType type, std::array<std::int64_t, 4> ne,
                 const void* data = nullptr) {
  const std::size_t bytes = bytes_of(type, ne);
  auto b = c.allocate(bytes);
  EXPECT_TRUE(b) << b.error().to_string();
  if (!b) return Tensor{};
  if (data != nullptr) {
    auto ev = c.copy_to_device_async(data, **b, 0, bytes);
    EXPECT_TRUE(ev && (*ev)->wait());
  }
  Tensor t{type, ne, nullptr, b->get(), 0};
  keep.push_back(std::move(*b));
  return t;
}

std::vector<float> download(Compute& c, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(element_count(t)), 0.0f);
  auto ev = c.copy_to_host_async(*t.buffer, t.offset, v.data(), v.size() * sizeof(float));
  EXPECT_TRUE(ev && (*ev)->wait());
  return v;
}

const std::map<std::string, std::string> kRoutedOn{{"routed_experts", "true"}};

// E experts of one token with the routed op's inputs in device buffers, as the engine's decode leaves them.
struct RoutedLayer {
  std::int64_t d, f, experts;
  std::vector<float> x;
  std::vector<std::vector<std::byte>> w;  // gate, up, down of expert 0, then of expert 1, ...
  std::vector<std::unique_ptr<Buffer>> keep;
  std::vector<Tensor> weights;  // the same, on the device
  Tensor xt;

  RoutedLayer(Compute& c, DType gate_up, DType down, std::int64_t d_, std::int64_t f_, std::int64_t e_, unsigned seed)
      : d(d_), f(f_), experts(e_) {
    x = randn(static_cast<std::size_t>(d), seed);
    xt = on_device(c, keep, DType::f32, {d, 1, 1, 1}, x.data());
    for (std::int64_t e = 0; e < experts; ++e) {
      for (int p = 0; p < 3; ++p) {
        const DType type = p < 2 ? gate_up : down;
        const std::array<std::int64_t, 4> ne =
            p < 2 ? std::array<std::int64_t, 4>{d, f, 1, 1} : std::array<std::int64_t, 4>{f, d, 1, 1};
        w.push_back(
            quantized(type, randn(static_cast<std::size_t>(d * f), seed + 1 + static_cast<unsigned>(3 * e + p), 0.1f)));
        weights.push_back(on_device(c, keep, type, ne, w.back().data()));
      }
    }
  }

  // expert_ffn_routed on X with these picks; Y downloaded. host_io: X, ids, weights and Y as host tensors (staged).
  Expected<std::vector<float>> routed(Compute& c, const std::vector<std::int32_t>& ids, const std::vector<float>& wts,
                                      OpParams p = {}, bool host_io = false) {
    const auto k = static_cast<std::int64_t>(ids.size());
    std::vector<std::int32_t> id_copy = ids;
    std::vector<float> wt_copy = wts, y_host(static_cast<std::size_t>(d), 0.0f);
    std::vector<Tensor> in;
    Tensor y;
    if (host_io) {
      in = {Tensor{DType::f32, {d, 1, 1, 1}, x.data(), nullptr, 0},
            Tensor{DType::i32, {k, 1, 1, 1}, id_copy.data(), nullptr, 0},
            Tensor{DType::f32, {k, 1, 1, 1}, wt_copy.data(), nullptr, 0}};
      y = Tensor{DType::f32, {d, 1, 1, 1}, y_host.data(), nullptr, 0};
    } else {
      in = {xt, on_device(c, keep, DType::i32, {k, 1, 1, 1}, ids.data()),
            on_device(c, keep, DType::f32, {k, 1, 1, 1}, wts.data())};
      y = on_device(c, keep, DType::f32, {d, 1, 1, 1});
    }
    in.insert(in.end(), weights.begin(), weights.end());
    if (Status s = c.run(OpCall{Op::expert_ffn_routed, in, std::span<Tensor>(&y, 1), p}); !s) return s;
    return host_io ? y_host : download(c, y);
  }

  // What the engine runs without the op: expert_ffn per pick, out = zeros + zeros, then scale_add of each expert's
  // output with its weight where topk_routing left it, in ascending expert id.
  std::vector<float> composed(Compute& c, const std::vector<std::int32_t>& ids, const std::vector<float>& wts) {
    const auto k = static_cast<std::int64_t>(ids.size());
    Tensor wt = on_device(c, keep, DType::f32, {k, 1, 1, 1}, wts.data());
    const std::vector<float> zeros(static_cast<std::size_t>(d), 0.0f);
    Tensor z = on_device(c, keep, DType::f32, {d, 1, 1, 1}, zeros.data());
    Tensor out = on_device(c, keep, DType::f32, {d, 1, 1, 1});
    std::vector<std::size_t> order(ids.size());
    for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ids[a] < ids[b]; });
    std::vector<Tensor> ys;
    for (std::size_t j : order) {
      const auto e = static_cast<std::size_t>(ids[j]);
      Tensor in[] = {weights[3 * e], weights[3 * e + 1], weights[3 * e + 2], xt};
      ys.push_back(on_device(c, keep, DType::f32, {d, 1, 1, 1}));
      EXPECT_TRUE(c.run(OpCall{Op::expert_ffn, in, std::span<Tensor>(&ys.back(), 1), {}}));
    }
    Tensor zz[] = {z, z};
    EXPECT_TRUE(c.run(OpCall{Op::add, zz, std::span<Tensor>(&out, 1), {}}));
    for (std::size_t i = 0; i < order.size(); ++i) {
      Tensor w1 = wt;
      w1.ne = {1, 1, 1, 1};
      w1.offset = order[i] * sizeof(float);
      Tensor in[] = {ys[i], w1};
      EXPECT_TRUE(c.run(OpCall{Op::scale_add, in, std::span<Tensor>(&out, 1), {}}));
    }
    return download(c, out);
  }
};

// The routed op is the engine's composition bit for bit: the routed matmuls run the T = 1 tile on each pick's
// weights, and the combine adds in ascending id with scale_add's fmaf. Picks listed out of id order, a second call on
// the same experts (the cached pointer table), and gate/up of another block than down (q8_0 then q6_k: the swiglu
// outputs quantized in down's block). Gate and up of different blocks (X quantized twice) are in the conformance
// suite's ExpertFfnRoutedHasTheBitsOfTheEnginesCombine.
TEST(CudaPlugin, RoutedExpertsHaveTheBitsOfExpertFfnAndScaleAddInAscendingId) {
  CUDA_COMPUTE(c, kRoutedOn);
  struct Case {
    DType gate_up, down;
  };
  for (const Case& k : {Case{DType::q4_k, DType::q4_k}, Case{DType::q8_0, DType::q6_k}}) {
    const std::string what = std::string(to_string(k.gate_up)) + " / " + std::string(to_string(k.down));
    ASSERT_TRUE(c.supports(Op::expert_ffn_routed, k.gate_up)) << what;
    ASSERT_TRUE(c.supports(Op::expert_ffn_routed, k.down)) << what;
    RoutedLayer layer(c, k.gate_up, k.down, 512, 768, 5, 31);
    for (const auto& [ids, wts] : {std::pair{std::vector<std::int32_t>{3, 1}, std::vector<float>{0.62f, 0.38f}},
                                   std::pair{std::vector<std::int32_t>{0, 4}, std::vector<float>{0.55f, -1.25f}},
                                   std::pair{std::vector<std::int32_t>{3, 1}, std::vector<float>{0.25f, 0.75f}}}) {
      auto got = layer.routed(c, ids, wts);
      ASSERT_TRUE(got) << what << ": " << got.error().to_string();
      const auto want = layer.composed(c, ids, wts);
      ASSERT_EQ(got->size(), want.size());
      EXPECT_EQ(0, std::memcmp(got->data(), want.data(), want.size() * sizeof(float)))
          << what << ", ids " << ids[0] << ", " << ids[1] << ": first difference at "
          << std::mismatch(
                 got->begin(), got->end(), want.begin(),
                 [](float a, float b) {
                   return std::memcmp(&a, &b, sizeof a) == 0;
                 }).first -
                 got->begin();
      // And what it computes is the experts' sum (loosely: 8-bit activations), not a bit-identical mistake.
      double err = 0.0, norm = 0.0;
      std::vector<double> sum(static_cast<std::size_t>(layer.d), 0.0);
      for (std::size_t j = 0; j < ids.size(); ++j) {
        const auto e = static_cast<std::size_t>(ids[j]);
        const auto one = ct::ref::expert_ffn(k.gate_up, layer.w[3 * e].data(), k.gate_up, layer.w[3 * e + 1].data(),
                                             k.down, layer.w[3 * e + 2].data(), layer.d, layer.f, layer.x.data(), 1);
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += wts[j] * one[i];
      }
      for (std::size_t i = 0; i < sum.size(); ++i) {
        err += ((*got)[i] - sum[i]) * ((*got)[i] - sum[i]);
        norm += sum[i] * sum[i];
      }
      EXPECT_LT(std::sqrt(err), 0.05 * std::sqrt(norm)) << what;
      // With X, the choice and Y in host memory (staged, and run() waits): the same bits.
      auto staged = layer.routed(c, ids, wts, {}, true);
      ASSERT_TRUE(staged) << what << ": " << staged.error().to_string();
      EXPECT_EQ(0, std::memcmp(staged->data(), want.data(), want.size() * sizeof(float))) << what << " (host tensors)";
    }
  }
}

// topk_routing marks a token with a NaN logit by ids -1 and weights NaN: the routed op gives that column NaN (and
// reads no pointer table entry for it), without waiting.
TEST(CudaPlugin, RoutedExpertsGiveNaNForTheRoutersNaNMark) {
  CUDA_COMPUTE(c, kRoutedOn);
  RoutedLayer layer(c, DType::q4_k, DType::q4_k, 512, 768, 5, 41);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& ids : {std::vector<std::int32_t>{-1, -1}, std::vector<std::int32_t>{2, 5}}) {
    auto got = layer.routed(c, ids, {nan, nan});
    ASSERT_TRUE(got) << got.error().to_string();
    for (std::size_t i = 0; i < got->size(); ++i) ASSERT_TRUE(std::isnan((*got)[i])) << "ids " << ids[1] << " at " << i;
  }
  // A later call on the same buffers is clean again.
  auto fine = layer.routed(c, {1, 2}, {0.5f, 0.5f});
  ASSERT_TRUE(fine) << fine.error().to_string();
  EXPECT_EQ(std::count_if(fine->begin(), fine->end(), [](float v) { return std::isnan(v); }), 0);
}

// Off (the default), the op is not offered and run() says so; on, shapes and flags the kernels do not route answer
// `unsupported` too (the engine then runs the experts itself), and types without the 8-bit path are not offered.
TEST(CudaPlugin, RoutedExpertsAnswerUnsupportedWhereTheyDoNotRun) {
  {
    CUDA_COMPUTE(off, {});
    EXPECT_FALSE(off.supports(Op::expert_ffn_routed, DType::q4_k));
    RoutedLayer layer(off, DType::q4_k, DType::q4_k, 512, 256, 2, 51);
    auto got = layer.routed(off, {0, 1}, {0.5f, 0.5f});
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code(), StatusCode::unsupported) << got.error().to_string();
  }
  CUDA_COMPUTE(c, kRoutedOn);
  for (DType type :
       {DType::q4_k, DType::q5_k, DType::q6_k, DType::q2_k, DType::q3_k, DType::q8_0, DType::q4_0, DType::mxfp4}) {
    EXPECT_TRUE(c.supports(Op::expert_ffn_routed, type)) << to_string(type);
  }
  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    EXPECT_FALSE(c.supports(Op::expert_ffn_routed, type)) << to_string(type);
  }
  RoutedLayer layer(c, DType::q4_k, DType::q4_k, 512, 256, 2, 61);
  OpParams exact;
  exact.flags = colibri::sdk::kExactActivations;
  auto got = layer.routed(c, {0, 1}, {0.5f, 0.5f}, exact);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), StatusCode::unsupported) << got.error().to_string();
  // f16 experts take f32 activations (no 8-bit path): not routed, whatever the engine asks.
  RoutedLayer f16(c, DType::f16, DType::f16, 512, 256, 2, 71);
  got = f16.routed(c, {0, 1}, {0.5f, 0.5f});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), StatusCode::unsupported) << got.error().to_string();
}

// ------------------------------------------------------------------ graphs

// A decode layer's shape on device buffers: rms_norm, a q4_k matmul (X quantized, then the matmul: two kernels), a
// residual add; each layer's output downloaded, as the engine's download of the router's choice ends a segment.
std::vector<std::vector<float>> layers_on(Compute& c, int layers) {
  constexpr std::int64_t d = 512;
  std::vector<std::unique_ptr<Buffer>> keep;
  const auto x0 = randn(static_cast<std::size_t>(d), 3);
  Tensor x = on_device(c, keep, DType::f32, {d, 1, 1, 1}, x0.data());
  std::vector<std::vector<float>> out;
  for (int l = 0; l < layers; ++l) {
    const auto norm = randn(static_cast<std::size_t>(d), 10 + static_cast<unsigned>(l));
    const auto w = quantized(DType::q4_k, randn(static_cast<std::size_t>(d * d), 20 + static_cast<unsigned>(l), 0.05f));
    Tensor nt = on_device(c, keep, DType::f32, {d, 1, 1, 1}, norm.data());
    Tensor wt = on_device(c, keep, DType::q4_k, {d, d, 1, 1}, w.data());
    Tensor h = on_device(c, keep, DType::f32, {d, 1, 1, 1}), y = on_device(c, keep, DType::f32, {d, 1, 1, 1});
    Tensor next = on_device(c, keep, DType::f32, {d, 1, 1, 1});
    OpParams eps;
    eps.eps = 1e-5f;
    Tensor norm_in[] = {x, nt}, mm_in[] = {wt, h}, add_in[] = {x, y};
    EXPECT_TRUE(c.run(OpCall{Op::rms_norm, norm_in, std::span<Tensor>(&h, 1), eps}));
    EXPECT_TRUE(c.run(OpCall{Op::matmul, mm_in, std::span<Tensor>(&y, 1), {}}));
    EXPECT_TRUE(c.run(OpCall{Op::add, add_in, std::span<Tensor>(&next, 1), {}}));
    out.push_back(download(c, next));
    x = next;
  }
  return out;
}

// With graphs on, the same ops give the same bits: a layer's kernels are captured and launched as one graph by the
// download, and the next layers' segments (same kernels, other buffers) update that graph rather than instantiate
// it again.
TEST(CudaPlugin, GraphsGiveTheBitsOfOpsLaunchedOneByOne) {
  constexpr int kLayers = 6;
  std::vector<std::vector<float>> want;
  {
    CUDA_COMPUTE(eager, {});
    want = layers_on(eager, kLayers);
  }
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  auto host = std::make_shared<ct::RecordingHost>();
  auto made = lib->create_as<Compute>({{"graphs", "true"}}, host);
  ASSERT_TRUE(made) << made.error().to_string();
  const auto got = layers_on(**made, kLayers);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t l = 0; l < want.size(); ++l) {
    EXPECT_EQ(0, std::memcmp(got[l].data(), want[l].data(), want[l].size() * sizeof(float))) << "layer " << l;
  }
  const double launches = host->metric("graph_launches_total");
  const double updates = host->metric("graph_updates_total");
  const double made_new = host->metric("graph_instantiations_total");
  EXPECT_GE(launches, kLayers) << "a graph per layer at least";
  EXPECT_EQ(launches, updates + made_new);
  EXPECT_GE(updates, kLayers - 2) << "the same segment on other buffers updates its graph (" << made_new
                                  << " instantiations)";
  EXPECT_GT(host->metric("graph_nodes_total"), launches) << "each graph holds the layer's kernels";
}

// Whatever must see captured ops launches them first: an upload into a buffer they read (they see the old bytes), a
// copy from another thread, a buffer freed (they ran before), a call that fails after them (they ran, as they would
// have launched one by one). Each phase checks that a graph was launched there, so none passes without graphs.
TEST(CudaPlugin, GraphsRunCapturedOpsBeforeACopyAFreeOrAFailure) {
  auto host = std::make_shared<ct::RecordingHost>();
  CUDA_COMPUTE_HOST(c, (std::map<std::string, std::string>{{"graphs", "true"}}), host);
  auto launches = [&] { return host->metric("graph_launches_total"); };
  constexpr std::int64_t n = 1000;
  std::vector<std::unique_ptr<Buffer>> keep;
  std::vector<float> a(n), b(n), a2(n);
  for (std::int64_t i = 0; i < n; ++i) {
    a[static_cast<std::size_t>(i)] = static_cast<float>(i);
    b[static_cast<std::size_t>(i)] = 0.5f;
    a2[static_cast<std::size_t>(i)] = -1.0f;
  }
  const std::vector<float> hundred(n, 100.0f);
  Tensor ta = on_device(c, keep, DType::f32, {n, 1, 1, 1}, a.data());
  Tensor tb = on_device(c, keep, DType::f32, {n, 1, 1, 1}, b.data());
  Tensor out = on_device(c, keep, DType::f32, {n, 1, 1, 1});
  Tensor other = on_device(c, keep, DType::f32, {n, 1, 1, 1});
  Tensor shorter = on_device(c, keep, DType::f32, {n / 2, 1, 1, 1});
  Tensor add_in[] = {ta, tb};

  double before = launches();
  ASSERT_TRUE(c.run(OpCall{Op::add, add_in, std::span<Tensor>(&out, 1), {}}));
  auto up = c.copy_to_device_async(a2.data(), *ta.buffer, 0, a2.size() * sizeof(float));
  ASSERT_TRUE(up && (*up)->wait());
  EXPECT_EQ(launches(), before + 1) << "the upload launched the captured add";
  EXPECT_EQ(download(c, out)[7], 7.5f) << "the add ran on A before the upload replaced it";
  EXPECT_EQ(download(c, ta)[7], -1.0f);

  // A copy from another thread (as the VRAM tier's uploads) launches them too.
  before = launches();
  ASSERT_TRUE(c.run(OpCall{Op::add, add_in, std::span<Tensor>(&out, 1), {}}));
  std::thread([&] {
    auto ev = c.copy_to_device_async(hundred.data(), *other.buffer, 0, hundred.size() * sizeof(float));
    EXPECT_TRUE(ev && (*ev)->wait());
  }).join();
  EXPECT_EQ(launches(), before + 1) << "the other thread's upload launched the captured add";
  EXPECT_EQ(download(c, out)[7], -0.5f);

  // A freed input: the add ran first.
  auto own_b = c.allocate(b.size() * sizeof(float));
  ASSERT_TRUE(own_b);
  ASSERT_TRUE(c.copy_to_device_async(b.data(), **own_b, 0, b.size() * sizeof(float)).value()->wait());
  Tensor tb2{DType::f32, {n, 1, 1, 1}, nullptr, own_b->get(), 0};
  Tensor twice_in[] = {ta, ta};
  Tensor doubled = other;
  ASSERT_TRUE(c.run(OpCall{Op::add, twice_in, std::span<Tensor>(&doubled, 1), {}}));
  before = launches();
  Tensor add3[] = {doubled, tb2};
  ASSERT_TRUE(c.run(OpCall{Op::add, add3, std::span<Tensor>(&out, 1), {}}));
  own_b->reset();
  EXPECT_EQ(launches(), before + 1) << "freeing B launched the captured adds";
  EXPECT_EQ(download(c, out)[7], -1.5f);

  // A call refused after a captured one: the captured one still ran, launched by the refusal.
  ASSERT_TRUE(c.run(OpCall{Op::add, twice_in, std::span<Tensor>(&out, 1), {}}));
  before = launches();
  Tensor bad_in[] = {ta, shorter};
  EXPECT_FALSE(c.run(OpCall{Op::add, bad_in, std::span<Tensor>(&out, 1), {}}));
  EXPECT_EQ(launches(), before + 1) << "the refused call launched the captured add before it returned";
  EXPECT_EQ(download(c, out)[7], -2.0f);
  EXPECT_TRUE(c.synchronize());
}

// The arena (device scratch: X's 8-bit copy here) grows in the middle of a segment: what was captured runs first,
// then the call goes on without a graph; both results are the bits of the ops launched one by one.
TEST(CudaPlugin, GraphsLaunchWhatWasCapturedWhenTheArenaGrows) {
  constexpr std::int64_t k = 1024, rows = 256, wide = 300;
  const auto w = quantized(DType::q8_0, randn(static_cast<std::size_t>(k * rows), 81, 0.05f));
  const auto x = randn(static_cast<std::size_t>(k * wide), 82);
  // host: the graphs instance's counters (null: launched one by one).
  auto products = [&](Compute& c, const ct::RecordingHost* host) {
    auto launches = [&] { return host != nullptr ? host->metric("graph_launches_total") : 0.0; };
    std::vector<std::unique_ptr<Buffer>> keep;
    Tensor wt = on_device(c, keep, DType::q8_0, {k, rows, 1, 1}, w.data());
    Tensor x1 = on_device(c, keep, DType::f32, {k, 1, 1, 1}, x.data());
    Tensor xw = on_device(c, keep, DType::f32, {k, wide, 1, 1}, x.data());
    Tensor y1 = on_device(c, keep, DType::f32, {rows, 1, 1, 1}),
           yw = on_device(c, keep, DType::f32, {rows, wide, 1, 1});
    Tensor in1[] = {wt, x1}, inw[] = {wt, xw};
    EXPECT_TRUE(c.run(OpCall{Op::matmul, in1, std::span<Tensor>(&y1, 1), {}}));
    const double before = launches();
    EXPECT_TRUE(c.run(OpCall{Op::matmul, inw, std::span<Tensor>(&yw, 1), {}}));
    if (host != nullptr) {
      EXPECT_EQ(launches(), before + 1) << "growing the arena launched the captured T = 1 matmul";
    }
    return std::pair{download(c, y1), download(c, yw)};
  };
  std::pair<std::vector<float>, std::vector<float>> want;
  {
    CUDA_COMPUTE(eager, {});
    want = products(eager, nullptr);
  }
  auto host = std::make_shared<ct::RecordingHost>();
  CUDA_COMPUTE_HOST(c, (std::map<std::string, std::string>{{"graphs", "true"}}), host);
  const auto got = products(c, host.get());
  EXPECT_EQ(0, std::memcmp(got.first.data(), want.first.data(), want.first.size() * sizeof(float))) << "T = 1";
  EXPECT_EQ(0, std::memcmp(got.second.data(), want.second.data(), want.second.size() * sizeof(float))) << "T = 300";
}

}  // namespace
