// Vulkan-specific behaviour the conformance suite does not cover: score() without a driver, device
// selection, memory accounting, host-memory tensors, long-context rope angles, asynchronous copies.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/test_data.hpp"

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
using ct::ScopedEnv;

std::shared_ptr<ct::LoadedPlugin> plugin() {
  auto lib = ct::LoadedPlugin::load(VULKAN_PLUGIN_PATH);
  if (!lib) ADD_FAILURE() << lib.error().to_string();
  return lib ? *lib : nullptr;
}

bool vulkan_required() {
  const char* v = std::getenv("COLIBRI_REQUIRE_VULKAN");
  return v != nullptr && std::string(v) == "1";
}

// The Compute, or a skip saying why there is none (a failure when COLIBRI_REQUIRE_VULKAN=1).
#define VULKAN_COMPUTE(var, options, host)                                                               \
  auto var##_lib = plugin();                                                                             \
  ASSERT_NE(var##_lib, nullptr);                                                                         \
  auto var##_made = var##_lib->create_as<Compute>(options, host);                                        \
  if (!var##_made && var##_made.error().code() == StatusCode::unsupported) {                             \
    if (vulkan_required()) FAIL() << "COLIBRI_REQUIRE_VULKAN=1 but: " << var##_made.error().to_string(); \
    GTEST_SKIP() << var##_made.error().to_string();                                                      \
  }                                                                                                      \
  ASSERT_TRUE(var##_made) << var##_made.error().to_string();                                             \
  Compute& var = **var##_made

const std::map<std::string, std::string> kStaging{{"map_device_memory", "false"}};

TEST(VulkanPlugin, RequiredDeviceExistsWhenCiAsksForIt) {
  VULKAN_COMPUTE(c, {}, nullptr);
  EXPECT_FALSE(c.devices().empty());
}

TEST(VulkanPlugin, ScoreIsZeroWithAReasonWhenNoDriverIsInstalled) {
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  // A driver list that names nothing installed: the reason points at the variable, not at installing Mesa.
  ScopedEnv env("VK_DRIVER_FILES", "/nonexistent/colibri-no-such-icd.json");
  const Score s = lib->descriptor().score(HostInfo{});
  EXPECT_EQ(s.value, 0);
  EXPECT_NE(s.reason.find("VK_DRIVER_FILES=/nonexistent/colibri-no-such-icd.json names no readable Vulkan driver"),
            std::string::npos)
      << s.reason;
}

TEST(VulkanPlugin, CreateWithoutADriverIsAClearUnsupportedError) {
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  ScopedEnv env("VK_DRIVER_FILES", "/nonexistent/colibri-no-such-icd.json");
  auto c = lib->create_as<Compute>({});
  ASSERT_FALSE(c) << "a Compute without any Vulkan driver";
  EXPECT_EQ(c.error().code(), StatusCode::unsupported) << c.error().to_string();
  EXPECT_NE(c.error().message().find("driver"), std::string::npos) << c.error().message();
}

TEST(VulkanPlugin, ScoreOfASoftwareDeviceLosesToTheCpuBackend) {
  auto lib = plugin();
  ASSERT_NE(lib, nullptr);
  ScopedEnv env("VK_DRIVER_FILES", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json");
  const Score s = lib->descriptor().score(HostInfo{});
  if (s.value == 0) GTEST_SKIP() << "lavapipe is not installed here: " << s.reason;
  EXPECT_LT(s.value, 100) << "lavapipe must not outrank the CPU backend: " << s.reason;
  EXPECT_NE(s.reason.find("software"), std::string::npos) << s.reason;
}

TEST(VulkanPlugin, UnknownDeviceIndexListsTheDevices) {
  VULKAN_COMPUTE(c, {}, nullptr);
  (void)c;
  auto bad = c_lib->create_as<Compute>({{"device", "57"}});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.error().message().find("compute.device 57"), std::string::npos) << bad.error().message();
  EXPECT_NE(bad.error().message().find("0: "), std::string::npos) << bad.error().message();
}

TEST(VulkanPlugin, DeviceMemoryIsAccountedAndReportedAtCreation) {
  auto host = std::make_shared<ct::RecordingHost>();
  VULKAN_COMPUTE(c, {}, host);
  const DeviceInfo before = c.devices().front();
  EXPECT_GT(before.memory_total, 0u);
  EXPECT_NE(before.capabilities.find("vulkan-1."), std::string::npos) << before.capabilities;
  const std::size_t bytes = std::size_t{64} << 20;
  auto b = c.allocate(bytes);
  ASSERT_TRUE(b) << b.error().to_string();
  const DeviceInfo during = c.devices().front();
  if (before.capabilities.find("memory-budget") == std::string::npos) {
    // Without VK_EXT_memory_budget the plugin counts its own allocations.
    EXPECT_LE(during.memory_available + bytes, before.memory_available);
    b->reset();
    EXPECT_EQ(c.devices().front().memory_available, before.memory_available);
  }
  bool logged = false;
  for (const auto& line : host->lines()) logged |= line.find("using Vulkan device 0") != std::string::npos;
  EXPECT_TRUE(logged) << "create() should log the device it picked";
}

TEST(VulkanPlugin, AllocationBeyondTheDeviceIsAnOutOfMemoryError) {
  VULKAN_COMPUTE(c, {}, nullptr);
  auto b = c.allocate(std::size_t{1} << 50);
  ASSERT_FALSE(b);
  EXPECT_TRUE(b.error().code() == StatusCode::out_of_memory || b.error().code() == StatusCode::internal)
      << b.error().to_string();
  EXPECT_NE(b.error().message().find("allocating"), std::string::npos) << b.error().message();
}

TEST(VulkanPlugin, ManyAsynchronousCopiesCompleteAfterSynchronize) {
  VULKAN_COMPUTE(c, kStaging, nullptr);
  const std::size_t n = 8, chunk = 3000;
  auto b = c.allocate(n * chunk);
  ASSERT_TRUE(b);
  EXPECT_EQ((*b)->host_pointer(), nullptr) << "map_device_memory=false must not map device buffers";
  std::vector<unsigned char> src(n * chunk), back(n * chunk, 0);
  std::iota(src.begin(), src.end(), 0);
  std::vector<std::unique_ptr<Event>> ups;
  for (std::size_t i = 0; i < n; ++i) {
    auto e = c.copy_to_device_async(src.data() + i * chunk, **b, i * chunk, chunk);
    ASSERT_TRUE(e) << e.error().to_string();
    ups.push_back(std::move(*e));
  }
  // Downloads are ordered after the uploads on the one queue; synchronize finishes them all.
  std::vector<std::unique_ptr<Event>> downs;
  for (std::size_t i = 0; i < n; ++i) {
    auto e = c.copy_to_host_async(**b, i * chunk, back.data() + i * chunk, chunk);
    ASSERT_TRUE(e) << e.error().to_string();
    downs.push_back(std::move(*e));
  }
  ASSERT_TRUE(c.synchronize());
  for (auto& e : downs) EXPECT_TRUE(e->ready());
  EXPECT_EQ(src, back);
}

// Device buffers that hold `values` (uploaded and waited for), kept alive by `keep`.
Tensor filled(Compute& c, std::vector<std::unique_ptr<Buffer>>& keep, const std::vector<float>& values) {
  auto b = c.allocate(values.size() * sizeof(float));
  EXPECT_TRUE(b);
  if (!b) return Tensor{};
  auto up = c.copy_to_device_async(values.data(), **b, 0, values.size() * sizeof(float));
  EXPECT_TRUE(up && (*up)->wait());
  Tensor t{DType::f32, {static_cast<std::int64_t>(values.size()), 1, 1, 1}, nullptr, b->get(), 0};
  keep.push_back(std::move(*b));
  return t;
}

std::vector<float> downloaded(Compute& c, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(element_count(t)));
  auto ev = c.copy_to_host_async(*t.buffer, t.offset, v.data(), v.size() * sizeof(float));
  EXPECT_TRUE(ev && (*ev)->wait());
  return v;
}

// With device memory not mapped (a discrete GPU's path), ops on device buffers alone are not submitted and waited
// for one by one: their commands wait for whatever must come after them on the queue or see their results. A chain
// of ops is then one submission; a download sees what they wrote; an upload into a buffer they read comes after
// them; freeing a buffer they use, and an op with a host tensor, run them first.
TEST(VulkanPlugin, OpsOnUnmappedBuffersAreSubmittedTogetherWhenSomethingMustSeeThem) {
  auto host = std::make_shared<ct::RecordingHost>();
  VULKAN_COMPUTE(c, kStaging, host);
  auto submissions = [&] { return host->metric("deferred_submissions_total"); };
  constexpr std::int64_t n = 1000;
  std::vector<std::unique_ptr<Buffer>> keep;
  std::vector<float> a(n), ones(n, 1.0f), minus(n, -1.0f);
  std::iota(a.begin(), a.end(), 0.0f);
  Tensor ta = filled(c, keep, a), tb = filled(c, keep, ones), t1 = filled(c, keep, ones), t2 = filled(c, keep, ones);
  // x1 = a + 1, x2 = x1 + 1, ... : eight ops, each reading the one before.
  const double before = submissions();
  Tensor in[] = {ta, tb};
  Tensor* outs[] = {&t1, &t2};
  for (int i = 0; i < 8; ++i) {
    Tensor out = *outs[i % 2];
    ASSERT_TRUE(c.run(OpCall{Op::add, in, std::span<Tensor>(&out, 1), {}}));
    in[0] = out;
  }
  EXPECT_EQ(submissions(), before) << "nothing submitted before anything needs the results";
  EXPECT_EQ(host->metric("deferred_ops_total"), 8);
  EXPECT_EQ(downloaded(c, t2)[7], 15.0f) << "7 + 8 ones";
  EXPECT_EQ(submissions(), before + 1) << "the eight ops in one submission";

  // An upload into a buffer a queued op reads comes after the op.
  Tensor add_in[] = {ta, tb};
  ASSERT_TRUE(c.run(OpCall{Op::add, add_in, std::span<Tensor>(&t1, 1), {}}));
  auto up = c.copy_to_device_async(minus.data(), *ta.buffer, 0, minus.size() * sizeof(float));
  ASSERT_TRUE(up && (*up)->wait());
  EXPECT_EQ(downloaded(c, t1)[7], 8.0f) << "the add read A before the upload replaced it";

  // Freeing a buffer a queued op reads runs the op first.
  auto own = c.allocate(ones.size() * sizeof(float));
  ASSERT_TRUE(own);
  ASSERT_TRUE(c.copy_to_device_async(ones.data(), **own, 0, ones.size() * sizeof(float)).value()->wait());
  Tensor freed{DType::f32, {n, 1, 1, 1}, nullptr, own->get(), 0};
  Tensor freed_in[] = {ta, freed};
  const double before_free = submissions();
  ASSERT_TRUE(c.run(OpCall{Op::add, freed_in, std::span<Tensor>(&t2, 1), {}}));
  own->reset();
  EXPECT_EQ(submissions(), before_free + 1) << "the free submitted the queued add";
  EXPECT_EQ(downloaded(c, t2)[7], 0.0f) << "-1 + 1";

  // An op with a host tensor comes after the queued ones (it reads what they wrote).
  Tensor chain_in[] = {ta, tb};
  ASSERT_TRUE(c.run(OpCall{Op::add, chain_in, std::span<Tensor>(&t1, 1), {}}));  // t1 = -1 + 1 = 0
  std::vector<float> y(n, 5.0f);
  Tensor host_out{DType::f32, {n, 1, 1, 1}, y.data(), nullptr, 0};
  Tensor mixed_in[] = {t1, tb};
  ASSERT_TRUE(c.run(OpCall{Op::add, mixed_in, std::span<Tensor>(&host_out, 1), {}}));
  EXPECT_EQ(y[7], 1.0f) << "0 + 1: the host-tensor op saw the queued add's output";

  // synchronize() submits what is queued and waits for it.
  ASSERT_TRUE(c.run(OpCall{Op::add, chain_in, std::span<Tensor>(&t1, 1), {}}));
  const double before_sync = submissions();
  EXPECT_TRUE(c.synchronize());
  EXPECT_EQ(submissions(), before_sync + 1) << "synchronize() submitted the queued add";
}

// Queued commands that fail (here a submission failing as a lost device would, through the plugin's test hook) are
// reported once, by the next run(), download or synchronize(): the calls after it find a working device, not the same
// failure again. An upload that submits them does not report it (a prefetch's upload may not look): the next run()
// does. The failure of a flush no call could report (a buffer's destructor) is the next run()'s too.
TEST(VulkanPlugin, AFailureOfQueuedCommandsIsReportedOnce) {
  ScopedEnv fail("COLIBRI_VULKAN_FAIL_QUEUED_SUBMISSION", "1");
  VULKAN_COMPUTE(c, kStaging, nullptr);
  std::vector<std::unique_ptr<Buffer>> keep;
  const std::vector<float> ones(64, 1.0f);
  Tensor ta = filled(c, keep, ones), out = filled(c, keep, ones);
  Tensor in[] = {ta, ta};
  ASSERT_TRUE(c.run(OpCall{Op::add, in, std::span<Tensor>(&out, 1), {}}));  // queued
  std::vector<float> got(ones.size());
  auto down = c.copy_to_host_async(*out.buffer, 0, got.data(), got.size() * sizeof(float));
  ASSERT_FALSE(down) << "the queued add did not run: the download that would read it says so";
  EXPECT_NE(down.error().message().find("queued GPU commands did not run"), std::string::npos)
      << down.error().to_string();
  EXPECT_EQ(downloaded(c, out)[3], 1.0f) << "reported once: this download works, and shows the add never ran";
  ASSERT_TRUE(c.run(OpCall{Op::add, in, std::span<Tensor>(&out, 1), {}}));
  EXPECT_EQ(downloaded(c, out)[3], 2.0f);
  EXPECT_TRUE(c.synchronize());

  // Submission 1 made by an upload: the upload succeeds, the next run() reports the failure, the one after runs.
  VULKAN_COMPUTE(u, kStaging, nullptr);
  std::vector<std::unique_ptr<Buffer>> keep_u;
  Tensor ua = filled(u, keep_u, ones), uout = filled(u, keep_u, ones), other = filled(u, keep_u, ones);
  Tensor uin[] = {ua, ua};
  ASSERT_TRUE(u.run(OpCall{Op::add, uin, std::span<Tensor>(&uout, 1), {}}));  // queued
  auto up = u.copy_to_device_async(ones.data(), *other.buffer, 0, ones.size() * sizeof(float));
  ASSERT_TRUE(up && (*up)->wait()) << "the upload itself worked";
  const Status after_upload = u.run(OpCall{Op::add, uin, std::span<Tensor>(&uout, 1), {}});
  EXPECT_FALSE(after_upload) << "the next run() reports what the upload submitted";
  EXPECT_NE(after_upload.message().find("queued GPU commands did not run"), std::string::npos)
      << after_upload.to_string();
  ASSERT_TRUE(u.run(OpCall{Op::add, uin, std::span<Tensor>(&uout, 1), {}}));
  EXPECT_EQ(downloaded(u, uout)[3], 2.0f);

  // Submission 3 fails in a buffer's destructor: the next run() reports it, the one after runs.
  ScopedEnv fail_third("COLIBRI_VULKAN_FAIL_QUEUED_SUBMISSION", "3");
  VULKAN_COMPUTE(d, kStaging, nullptr);
  std::vector<std::unique_ptr<Buffer>> keep_d;
  Tensor da = filled(d, keep_d, ones), dout = filled(d, keep_d, ones);
  Tensor din[] = {da, da};
  for (int i = 0; i < 2; ++i) {  // submissions 1 and 2, by downloads
    ASSERT_TRUE(d.run(OpCall{Op::add, din, std::span<Tensor>(&dout, 1), {}}));
    EXPECT_EQ(downloaded(d, dout)[3], 2.0f);
  }
  auto scratch = d.allocate(ones.size() * sizeof(float));
  ASSERT_TRUE(scratch);
  Tensor st{DType::f32, {static_cast<std::int64_t>(ones.size()), 1, 1, 1}, nullptr, scratch->get(), 0};
  Tensor sin[] = {da, da};
  ASSERT_TRUE(d.run(OpCall{Op::add, sin, std::span<Tensor>(&st, 1), {}}));
  scratch->reset();  // submission 3, failing where nobody can be told
  const Status next = d.run(OpCall{Op::add, din, std::span<Tensor>(&dout, 1), {}});
  EXPECT_FALSE(next) << "the next run() reports the failed submission";
  EXPECT_NE(next.message().find("queued GPU commands did not run"), std::string::npos) << next.to_string();
  EXPECT_TRUE(d.run(OpCall{Op::add, din, std::span<Tensor>(&dout, 1), {}}));
  EXPECT_TRUE(d.synchronize());
}

// A buffer freed while a copy into or out of it is in flight waits for the copy (as cudaFree does): the GPU never
// reads or writes memory that was given back. The copies are large enough to be in flight when the free comes.
TEST(VulkanPlugin, FreeingABufferWaitsForItsCopiesInFlight) {
  VULKAN_COMPUTE(c, kStaging, nullptr);
  constexpr std::size_t bytes = 96u << 20;
  std::vector<unsigned char> src(bytes, 7), back(bytes, 0);
  for (const bool upload : {true, false}) {
    auto b = c.allocate(bytes);
    ASSERT_TRUE(b);
    auto copy =
        upload ? c.copy_to_device_async(src.data(), **b, 0, bytes) : c.copy_to_host_async(**b, 0, back.data(), bytes);
    ASSERT_TRUE(copy) << copy.error().to_string();
    b->reset();
    EXPECT_TRUE((*copy)->ready()) << (upload ? "upload" : "download") << ": the copy finished before the free";
    EXPECT_TRUE((*copy)->wait());
  }
  EXPECT_TRUE(c.synchronize());
}

// Queued expert ops share the plugin's scratch (gate and up outputs); a larger expert grows it, which submits the
// queued ones (and waits for them) before the old scratch goes: counted at each growth, since lavapipe would not
// fault on the freed memory. Each output has the bits of the same op run unqueued (mapped memory).
TEST(VulkanPlugin, QueuedExpertOpsSurviveTheScratchGrowing) {
  auto host = std::make_shared<ct::RecordingHost>();
  VULKAN_COMPUTE(queued, kStaging, host);
  VULKAN_COMPUTE(direct, {}, nullptr);
  constexpr std::int64_t d = 64;
  const std::int64_t widths[] = {64, 128, 512};  // F: each larger expert needs more scratch
  auto results = [&](Compute& c, const ct::RecordingHost* counts) {
    std::vector<std::unique_ptr<Buffer>> keep;
    const auto x = ct::randn(static_cast<std::size_t>(d), 5);
    Tensor tx = filled(c, keep, x);
    // Every input first (an upload submits what is queued), then the experts back to back.
    std::vector<std::array<Tensor, 4>> inputs;
    std::vector<Tensor> outs;
    for (const std::int64_t f : widths) {
      Tensor wg = filled(c, keep, ct::randn(static_cast<std::size_t>(d * f), 10 + static_cast<unsigned>(f), 0.1f));
      Tensor wu = filled(c, keep, ct::randn(static_cast<std::size_t>(d * f), 20 + static_cast<unsigned>(f), 0.1f));
      Tensor wd = filled(c, keep, ct::randn(static_cast<std::size_t>(d * f), 30 + static_cast<unsigned>(f), 0.1f));
      wg.ne = wu.ne = {d, f, 1, 1};
      wd.ne = {f, d, 1, 1};
      inputs.push_back({wg, wu, wd, tx});
      outs.push_back(filled(c, keep, std::vector<float>(static_cast<std::size_t>(d), 0.0f)));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const double before = counts ? counts->metric("deferred_submissions_total") : 0;
      EXPECT_TRUE(c.run(OpCall{Op::expert_ffn, inputs[i], std::span<Tensor>(&outs[i], 1), {}}));
      if (counts != nullptr && i > 0) {
        EXPECT_EQ(counts->metric("deferred_submissions_total"), before + 1)
            << "F = " << widths[i] << ": growing the scratch submitted the queued expert first";
      }
    }
    std::vector<std::vector<float>> got;
    for (const Tensor& y : outs) got.push_back(downloaded(c, y));
    return got;
  };
  const auto want = results(direct, nullptr);
  const auto got = results(queued, host.get());
  EXPECT_GE(host->metric("deferred_ops_total"), 3);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float))) << "F = " << widths[i];
  }
}

// expert_ffn_routed on unmapped memory (a discrete GPU's path) routes on the device: nothing is read back and the
// calls are queued like other ops. Over more calls than its ring of expert address tables holds (1024 experts: 24 KiB
// a call, 1 MiB, wrapping while calls that read its start are still queued), with the picks listed in either order,
// each column has the bits of the same call on mapped memory (which reads the choice back). A repeated pick there gives
// a NaN column.
TEST(VulkanPlugin, RoutedExpertsOnTheDeviceHaveTheBitsOfTheChoiceReadBack) {
  auto host = std::make_shared<ct::RecordingHost>(), read_back_host = std::make_shared<ct::RecordingHost>();
  VULKAN_COMPUTE(queued, kStaging, host);
  VULKAN_COMPUTE(read_back, kStaging, read_back_host);
  constexpr std::int64_t d = 64, f = 96, experts = 1024, k = 2, calls = 100;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  for (std::int64_t i = 0; i < calls; ++i) {
    const auto a = static_cast<std::int32_t>((7 * i + 3) % experts), b = a ^ 1;  // distinct, with other weights
    ids.insert(ids.end(), {i % 2 ? a : b, i % 2 ? b : a});
    weights.insert(weights.end(), {0.75f - 0.001f * static_cast<float>(i), 0.25f + 0.001f * static_cast<float>(i)});
  }
  // ids_in_host_memory: the op cannot be queued, so it reads the choice back (on any device).
  auto results = [&](Compute& c, bool ids_in_host_memory) {
    std::vector<std::unique_ptr<Buffer>> keep;
    std::vector<Tensor> w;  // four experts' weights
    for (unsigned j = 0; j < 4; ++j) {
      Tensor g = filled(c, keep, ct::randn(static_cast<std::size_t>(d * f), 40 + j, 0.1f));
      Tensor u = filled(c, keep, ct::randn(static_cast<std::size_t>(d * f), 50 + j, 0.1f));
      Tensor dn = filled(c, keep, ct::randn(static_cast<std::size_t>(d * f), 60 + j, 0.1f));
      g.ne = u.ne = {d, f, 1, 1};
      dn.ne = {f, d, 1, 1};
      w.insert(w.end(), {g, u, dn});
    }
    Tensor x = filled(c, keep, ct::randn(static_cast<std::size_t>(d), 70));
    std::vector<float> id_bits(ids.size());
    std::memcpy(id_bits.data(), ids.data(), ids.size() * sizeof(std::int32_t));
    Tensor all_ids = filled(c, keep, id_bits), all_weights = filled(c, keep, weights);
    Tensor y = filled(c, keep, std::vector<float>(static_cast<std::size_t>(d * (calls + 1)), -1.0f));
    std::vector<Tensor> in(3 + 3 * experts);
    for (std::int64_t i = 0; i < calls; ++i) {
      for (std::int64_t e = 0; e < experts; ++e) {  // each call its own table: expert e has the weights of (e + i) % 4
        for (std::int64_t r = 0; r < 3; ++r) in[3 + 3 * e + r] = w[static_cast<std::size_t>(3 * ((e + i) % 4) + r)];
      }
      in[0] = x;
      in[1] = all_ids;
      in[1].type = DType::i32;
      in[1].ne = {k, 1, 1, 1};
      in[1].offset = static_cast<std::size_t>(i * k) * sizeof(std::int32_t);
      if (ids_in_host_memory) {
        in[1].buffer = nullptr;
        in[1].offset = 0;
        in[1].data = ids.data() + i * k;
      }
      in[2] = all_weights;
      in[2].ne = {k, 1, 1, 1};
      in[2].offset = static_cast<std::size_t>(i * k) * sizeof(float);
      Tensor yi = y;
      yi.ne = {d, 1, 1, 1};
      yi.offset = static_cast<std::size_t>(i * d) * sizeof(float);
      const Status s = c.run(OpCall{Op::expert_ffn_routed, in, std::span<Tensor>(&yi, 1), {}});
      EXPECT_TRUE(s) << "call " << i << ": " << s.to_string();
    }
    return downloaded(c, y);
  };
  const auto want = results(read_back, true);
  EXPECT_EQ(read_back_host->metric("routed_on_device_total"), 0) << "the reference read the choice back";
  const auto got = results(queued, false);
  EXPECT_EQ(host->metric("routed_on_device_total"), calls) << "every call routed on the device";
  EXPECT_LT(host->metric("deferred_submissions_total"), calls / 4) << "the calls queued, not submitted one by one";
  for (std::int64_t i = 0; i < calls; ++i) {
    EXPECT_EQ(0, std::memcmp(got.data() + i * d, want.data() + i * d, d * sizeof(float))) << "call " << i;
    EXPECT_FALSE(std::isnan(want[static_cast<std::size_t>(i * d)]));
  }

  // topk's mark of a NaN logit (ids -1, weights NaN) and a repeated pick (the SDK has the picks distinct; the engine
  // reports it) on the device path: a NaN column each.
  std::vector<std::unique_ptr<Buffer>> keep;
  for (const std::int32_t pick : {-1, 5}) {
    std::vector<float> five_bits(2);
    const std::int32_t five[] = {pick, pick};
    std::memcpy(five_bits.data(), five, sizeof five);
    const auto wg = ct::randn(static_cast<std::size_t>(d * f), 80, 0.1f);
    Tensor x = filled(queued, keep, ct::randn(static_cast<std::size_t>(d), 81)), g = filled(queued, keep, wg),
           dn = filled(queued, keep, wg), repeated = filled(queued, keep, five_bits),
           halves = filled(queued, keep,
                           pick < 0 ? std::vector<float>(2, std::numeric_limits<float>::quiet_NaN())
                                    : std::vector<float>{0.5f, 0.5f}),
           y = filled(queued, keep, std::vector<float>(d, 0.0f));
    g.ne = {d, f, 1, 1};
    dn.ne = {f, d, 1, 1};
    repeated.type = DType::i32;
    std::vector<Tensor> in{x, repeated, halves};
    for (int e = 0; e < 8; ++e) in.insert(in.end(), {g, g, dn});
    const double before = host->metric("routed_on_device_total");
    ASSERT_TRUE(queued.run(OpCall{Op::expert_ffn_routed, in, std::span<Tensor>(&y, 1), {}}));
    EXPECT_EQ(host->metric("routed_on_device_total"), before + 1);
    for (const float v : downloaded(queued, y)) ASSERT_TRUE(std::isnan(v)) << "pick " << pick << ": " << v;
  }
}

// Mapped device memory (an iGPU, lavapipe by default) is read and written by the host directly: nothing is queued.
TEST(VulkanPlugin, OpsOnMappedBuffersAreNotQueued) {
  auto host = std::make_shared<ct::RecordingHost>();
  VULKAN_COMPUTE(c, {}, host);
  std::vector<std::unique_ptr<Buffer>> keep;
  const std::vector<float> ones(64, 1.0f);
  Tensor ta = filled(c, keep, ones), out = filled(c, keep, ones);
  if (ta.buffer->host_pointer() == nullptr) GTEST_SKIP() << "this device's memory is not mapped";
  Tensor in[] = {ta, ta};
  ASSERT_TRUE(c.run(OpCall{Op::add, in, std::span<Tensor>(&out, 1), {}}));
  EXPECT_EQ(static_cast<const float*>(out.buffer->host_pointer())[3], 2.0f) << "written when run() returned";
  EXPECT_EQ(host->metric("deferred_ops_total"), 0);
}

// Host tensors (data, no buffer) are imported or staged; results equal those of device tensors.
class VulkanHostTensors : public ::testing::TestWithParam<bool> {};

TEST_P(VulkanHostTensors, GiveTheSameResultsAsDeviceTensors) {
  const std::map<std::string, std::string> options{{"map_device_memory", "false"},
                                                   {"import_host_memory", GetParam() ? "true" : "false"}};
  VULKAN_COMPUTE(c, options, nullptr);
  const std::int64_t k = 256, n = 16, t = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> wf(static_cast<std::size_t>(k * n)), x(static_cast<std::size_t>(k * t));
  for (auto& v : wf) v = dist(rng);
  for (auto& v : x) v = dist(rng);
  std::vector<std::byte> w(row_bytes(DType::q6_k, k) * n);
  ASSERT_TRUE(colibri::quant::quantize_row(DType::q6_k, wf.data(), w.data(), k * n));
  std::vector<float> y_host(static_cast<std::size_t>(n * t)), y_dev(y_host.size());
  {
    Tensor in[] = {Tensor{DType::q6_k, {k, n, 1, 1}, w.data()}, Tensor{DType::f32, {k, t, 1, 1}, x.data()}};
    Tensor out{DType::f32, {n, t, 1, 1}, y_host.data()};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
  }
  {
    // Weights at an offset that is only 2-byte aligned, as a q6_k tensor inside a blob can be.
    const std::size_t w_off = 210 * 3 + 2;
    auto buf = c.allocate(w_off + w.size() + x.size() * 4 + y_dev.size() * 4 + 64);
    ASSERT_TRUE(buf);
    const std::size_t x_off = (w_off + w.size() + 3) / 4 * 4, y_off = x_off + x.size() * 4;
    ASSERT_TRUE((*c.copy_to_device_async(w.data(), **buf, w_off, w.size()))->wait());
    ASSERT_TRUE((*c.copy_to_device_async(x.data(), **buf, x_off, x.size() * 4))->wait());
    Tensor in[] = {Tensor{DType::q6_k, {k, n, 1, 1}, nullptr, buf->get(), w_off},
                   Tensor{DType::f32, {k, t, 1, 1}, nullptr, buf->get(), x_off}};
    Tensor out{DType::f32, {n, t, 1, 1}, nullptr, buf->get(), y_off};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
    ASSERT_TRUE((*c.copy_to_host_async(**buf, y_off, y_dev.data(), y_dev.size() * 4))->wait());
  }
  EXPECT_EQ(0, std::memcmp(y_host.data(), y_dev.data(), y_host.size() * 4));
  {
    // Mixed, as the engine's VRAM tier runs experts: weights in our buffer, activations in host memory.
    std::vector<float> y_mixed(y_host.size());
    auto buf = c.allocate(w.size() + 2);
    ASSERT_TRUE(buf);
    ASSERT_TRUE((*c.copy_to_device_async(w.data(), **buf, 2, w.size()))->wait());
    Tensor in[] = {Tensor{DType::q6_k, {k, n, 1, 1}, nullptr, buf->get(), 2},
                   Tensor{DType::f32, {k, t, 1, 1}, x.data()}};
    Tensor out{DType::f32, {n, t, 1, 1}, y_mixed.data()};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
    EXPECT_EQ(0, std::memcmp(y_host.data(), y_mixed.data(), y_host.size() * 4));
  }
  // And the reference says both are right.
  std::vector<float> wd(static_cast<std::size_t>(k * n));
  ASSERT_TRUE(colibri::quant::dequantize_row(DType::q6_k, w.data(), wd.data(), k * n));
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t r = 0; r < n; ++r) {
      double want = 0, mag = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        want += static_cast<double>(wd[static_cast<std::size_t>(r * k + j)]) * x[static_cast<std::size_t>(i * k + j)];
        mag += std::fabs(static_cast<double>(wd[static_cast<std::size_t>(r * k + j)]) *
                         x[static_cast<std::size_t>(i * k + j)]);
      }
      EXPECT_NEAR(y_host[static_cast<std::size_t>(i * n + r)], want, 1e-5 * mag + 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vulkan, VulkanHostTensors, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "imported" : "staged"; });

// map_device_memory: false makes lavapipe look like a discrete GPU: device memory the host cannot see, reported as
// such, while host tensors are still accepted (what the engine asks before running it).
TEST(VulkanPlugin, UnmappedDeviceMemoryActsAsADiscreteGpu) {
  VULKAN_COMPUTE(c, kStaging, nullptr);
  const DeviceInfo info = c.devices().front();
  EXPECT_FALSE(info.host_memory);
  EXPECT_GT(info.memory_total, 0u);
  EXPECT_LE(info.memory_available, info.memory_total);
  EXPECT_NE(info.capabilities.find("staging-copies"), std::string::npos) << info.capabilities;
  EXPECT_NE(c.query_interface(kHostTensorsInterface), nullptr);
  EXPECT_EQ(c.query_interface("colibri.compute.no-such-interface"), nullptr);
  auto buf = c.allocate(4096);
  ASSERT_TRUE(buf);
  EXPECT_EQ((*buf)->host_pointer(), nullptr);
}

TEST(VulkanPlugin, BufferTensorsOutsideTheirBufferAreRejected) {
  VULKAN_COMPUTE(c, {}, nullptr);
  auto buf = c.allocate(1024);
  ASSERT_TRUE(buf);
  Tensor in[] = {Tensor{DType::f32, {256, 1, 1, 1}, nullptr, buf->get(), 0},
                 Tensor{DType::f32, {256, 1, 1, 1}, nullptr, buf->get(), 512}};
  Tensor out{DType::f32, {256, 1, 1, 1}, nullptr, buf->get(), 0};
  const Status s = c.run(OpCall{Op::add, in, std::span<Tensor>(&out, 1), {}});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("B "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 512"), std::string::npos) << s.message();
}

// Long contexts: angles of tens of thousands of radians keep full float accuracy.
TEST(VulkanPlugin, RopeStaysAccurateAtLargePositions) {
  VULKAN_COMPUTE(c, {}, nullptr);
  const std::int64_t hd = 128, t = 4;
  std::vector<std::int32_t> pos{8191, 16384, 32767, 40000};
  std::vector<float> inv(hd / 2), x(static_cast<std::size_t>(hd * t)), y(x.size());
  for (std::int64_t i = 0; i < hd / 2; ++i)
    inv[static_cast<std::size_t>(i)] = static_cast<float>(std::pow(500000.0, -2.0 * i / hd));
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (auto& v : x) v = dist(rng);
  Tensor in[] = {Tensor{DType::f32, {hd, 1, t, 1}, x.data()}, Tensor{DType::i32, {t, 1, 1, 1}, pos.data()},
                 Tensor{DType::f32, {hd / 2, 1, 1, 1}, inv.data()}};
  Tensor out{DType::f32, {hd, 1, t, 1}, y.data()};
  OpParams p;
  p.rope_dims = static_cast<std::int32_t>(hd);
  ASSERT_TRUE(c.run(OpCall{Op::rope, in, std::span<Tensor>(&out, 1), p}));
  double worst = 0;
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t j = 0; j < hd / 2; ++j) {
      const float theta = static_cast<float>(pos[static_cast<std::size_t>(i)]) * inv[static_cast<std::size_t>(j)];
      const double cs = std::cos(static_cast<double>(theta)), sn = std::sin(static_cast<double>(theta));
      const double x0 = x[static_cast<std::size_t>(i * hd + j)], x1 = x[static_cast<std::size_t>(i * hd + j + hd / 2)];
      worst = std::max(worst, std::fabs(y[static_cast<std::size_t>(i * hd + j)] - (x0 * cs - x1 * sn)));
      worst = std::max(worst, std::fabs(y[static_cast<std::size_t>(i * hd + j + hd / 2)] - (x0 * sn + x1 * cs)));
    }
  }
  EXPECT_LT(worst, 2e-6) << "worst absolute error of rotated values";
}

TEST(VulkanPlugin, SupportsClaimsTheImplementedTypesOnly) {
  VULKAN_COMPUTE(c, {}, nullptr);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q2_k, DType::q3_k, DType::q4_k,
                  DType::q5_k, DType::q6_k}) {
    EXPECT_TRUE(c.supports(Op::matmul, t)) << to_string(t);
    EXPECT_TRUE(c.supports(Op::expert_ffn, t)) << to_string(t);
    EXPECT_TRUE(c.supports(Op::embedding, t)) << to_string(t);
    EXPECT_TRUE(c.supports(Op::expert_ffn_clamped, t)) << to_string(t);
  }
  // mxfp4 (optional): matmul and the expert ops, never embedding (check_op_call refuses it there).
  for (Op op : {Op::matmul, Op::expert_ffn, Op::expert_ffn_group, Op::expert_ffn_clamped}) {
    EXPECT_TRUE(c.supports(op, DType::mxfp4)) << op_name(op);
  }
  EXPECT_FALSE(c.supports(Op::embedding, DType::mxfp4));
  EXPECT_FALSE(c.supports(Op::attention, DType::mxfp4));
  for (DType t : {DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_1, DType::q8_k}) {
    EXPECT_FALSE(c.supports(Op::matmul, t)) << to_string(t);
    EXPECT_FALSE(c.supports(Op::expert_ffn_clamped, t)) << to_string(t);
  }
  for (DType t : {DType::f32, DType::f16, DType::q8_0}) {
    EXPECT_TRUE(c.supports(Op::attention, t)) << to_string(t);
    EXPECT_TRUE(c.supports(Op::attention_sinks, t)) << to_string(t);
  }
  EXPECT_FALSE(c.supports(Op::attention, DType::q4_k));
  EXPECT_FALSE(c.supports(Op::attention_sinks, DType::q4_k));
  std::vector<std::byte> w(row_bytes(DType::q4_1, 256) * 2);
  std::vector<float> x(256), y(2);
  Tensor in[] = {Tensor{DType::q4_1, {256, 2, 1, 1}, w.data()}, Tensor{DType::f32, {256, 1, 1, 1}, x.data()}};
  Tensor out{DType::f32, {2, 1, 1, 1}, y.data()};
  const Status s = c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}});
  EXPECT_EQ(s.code(), StatusCode::unsupported) << s.to_string();
}

// mxfp4's 17-byte blocks sit at any byte address (odd rows of 3 blocks here, weights at offsets 0..3 of a buffer
// and in host memory): W times the identity gives W's dequantized bits, which must be the reference's for every
// nibble and exponent (normal range and e = 0, 1, whose scales are subnormal).
TEST(VulkanPlugin, Mxfp4MatmulReadsTheReferenceBitsAtAnyByteOffset) {
  VULKAN_COMPUTE(c, {}, nullptr);
  const std::int64_t k = 96, n = 7, t = k;
  const std::uint8_t exps[] = {0, 1, 2, 3, 64, 100, 119, 125, 126, 127, 128, 131, 150, 200, 252};
  std::vector<std::byte> w(row_bytes(DType::mxfp4, k) * n);
  ASSERT_EQ(w.size(), 17u * 3u * 7u);
  std::mt19937 rng(5);
  for (std::size_t b = 0; b < w.size() / 17; ++b) {
    w[b * 17] = static_cast<std::byte>(exps[b % std::size(exps)]);
    for (std::size_t j = 1; j < 17; ++j) w[b * 17 + j] = static_cast<std::byte>(rng() & 0xFF);
  }
  std::vector<float> want(static_cast<std::size_t>(k * n));
  ASSERT_TRUE(colibri::quant::dequantize_row(DType::mxfp4, w.data(), want.data(), k * n));
  std::vector<float> x(static_cast<std::size_t>(k * t), 0.0f);
  for (std::int64_t i = 0; i < t; ++i) x[static_cast<std::size_t>(i * k + i)] = 1.0f;
  auto check = [&](const std::vector<float>& y, const std::string& where) {
    int bad = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = 0; j < k; ++j) {
        const float got = y[static_cast<std::size_t>(j * n + r)], ref = want[static_cast<std::size_t>(r * k + j)];
        if (std::memcmp(&got, &ref, 4) != 0 && bad++ < 4) {
          ADD_FAILURE() << where << ": W[" << r << "][" << j << "] = " << got << ", reference " << ref
                        << " (exponent byte " << static_cast<int>(w[static_cast<std::size_t>(r * 51 + j / 32 * 17)])
                        << ")";
        }
      }
    }
  };
  for (std::size_t off = 0; off < 4; ++off) {
    const std::size_t x_off = (off + w.size() + 3) / 4 * 4, y_off = x_off + x.size() * 4;
    auto buf = c.allocate(y_off + static_cast<std::size_t>(n * t) * 4);
    ASSERT_TRUE(buf);
    ASSERT_TRUE((*c.copy_to_device_async(w.data(), **buf, off, w.size()))->wait());
    ASSERT_TRUE((*c.copy_to_device_async(x.data(), **buf, x_off, x.size() * 4))->wait());
    Tensor in[] = {Tensor{DType::mxfp4, {k, n, 1, 1}, nullptr, buf->get(), off},
                   Tensor{DType::f32, {k, t, 1, 1}, nullptr, buf->get(), x_off}};
    Tensor out{DType::f32, {n, t, 1, 1}, nullptr, buf->get(), y_off};
    const Status s = c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}});
    ASSERT_TRUE(s) << "offset " << off << ": " << s.to_string();
    std::vector<float> y(static_cast<std::size_t>(n * t));
    ASSERT_TRUE((*c.copy_to_host_async(**buf, y_off, y.data(), y.size() * 4))->wait());
    check(y, "buffer offset " + std::to_string(off));
  }
  std::vector<std::byte> host(w.size() + 1);  // host memory at an odd address
  std::memcpy(host.data() + 1, w.data(), w.size());
  std::vector<float> y(static_cast<std::size_t>(n * t));
  Tensor in[] = {Tensor{DType::mxfp4, {k, n, 1, 1}, host.data() + 1}, Tensor{DType::f32, {k, t, 1, 1}, x.data()}};
  Tensor out{DType::f32, {n, t, 1, 1}, y.data()};
  const Status s = c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}});
  ASSERT_TRUE(s) << s.to_string();
  check(y, "host memory");
}

// The engine uploads from storage threads while its scheduler runs ops: results must not change.
TEST(VulkanPlugin, ConcurrentRunsAndCopiesFromManyThreads) {
  VULKAN_COMPUTE(c, kStaging, nullptr);
  const std::int64_t k = 512, n = 24;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  std::vector<float> wf(static_cast<std::size_t>(k * n));
  for (auto& v : wf) v = dist(rng);
  std::vector<std::byte> w(row_bytes(DType::q4_k, k) * n);
  ASSERT_TRUE(colibri::quant::quantize_row(DType::q4_k, wf.data(), w.data(), k * n));
  auto wbuf = c.allocate(w.size());
  ASSERT_TRUE(wbuf);
  ASSERT_TRUE((*c.copy_to_device_async(w.data(), **wbuf, 0, w.size()))->wait());
  const Tensor wt{DType::q4_k, {k, n, 1, 1}, nullptr, wbuf->get(), 0};

  constexpr int kThreads = 4, kRounds = 6;
  std::vector<std::vector<float>> xs(kThreads), want(kThreads), got(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    xs[static_cast<std::size_t>(i)].resize(static_cast<std::size_t>(k));
    for (auto& v : xs[static_cast<std::size_t>(i)]) v = dist(rng);
    want[static_cast<std::size_t>(i)].resize(static_cast<std::size_t>(n));
    Tensor in[] = {wt, Tensor{DType::f32, {k, 1, 1, 1}, xs[static_cast<std::size_t>(i)].data()}};
    Tensor out{DType::f32, {n, 1, 1, 1}, want[static_cast<std::size_t>(i)].data()};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}));
  }
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const auto id = static_cast<std::size_t>(i);
      auto buf = c.allocate(static_cast<std::size_t>(k + n) * 4);
      if (!buf) {
        errors[id] = buf.error().to_string();
        return;
      }
      std::vector<float> y(static_cast<std::size_t>(n));
      for (int r = 0; r < kRounds; ++r) {
        auto up = c.copy_to_device_async(xs[id].data(), **buf, 0, static_cast<std::size_t>(k) * 4);
        if (!up || !(*up)->wait()) {
          errors[id] = "upload failed";
          return;
        }
        Tensor in[] = {wt, Tensor{DType::f32, {k, 1, 1, 1}, nullptr, buf->get(), 0}};
        Tensor out{DType::f32, {n, 1, 1, 1}, nullptr, buf->get(), static_cast<std::size_t>(k) * 4};
        if (Status s = c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}}); !s) {
          errors[id] = s.to_string();
          return;
        }
        auto down = c.copy_to_host_async(**buf, static_cast<std::size_t>(k) * 4, y.data(), y.size() * 4);
        if (!down || !(*down)->wait()) {
          errors[id] = "download failed";
          return;
        }
        if (std::memcmp(y.data(), want[id].data(), y.size() * 4) != 0) {
          errors[id] = "round " + std::to_string(r) + " differs from the single-threaded result";
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(errors[static_cast<std::size_t>(i)], "") << "thread " << i;
}

// Short rows use fewer threads per row (more rows per workgroup): every K from 1 to 300, with
// tiles of tokens larger than the threads of a row, must match the reference and stay batch
// invariant.
TEST(VulkanPlugin, MatmulOnShortAndOddRows) {
  VULKAN_COMPUTE(c, {}, nullptr);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  const std::int64_t n = 67, t = 11;
  for (std::int64_t k : {1, 7, 32, 33, 64, 100, 160, 300}) {
    std::vector<float> w(static_cast<std::size_t>(k * n)), x(static_cast<std::size_t>(k * t)), bias(n);
    for (auto& v : w) v = dist(rng);
    for (auto& v : x) v = dist(rng);
    for (auto& v : bias) v = dist(rng);
    std::vector<float> y(static_cast<std::size_t>(n * t), std::nanf(""));
    Tensor in[] = {Tensor{DType::f32, {k, n, 1, 1}, w.data()}, Tensor{DType::f32, {k, t, 1, 1}, x.data()},
                   Tensor{DType::f32, {n, 1, 1, 1}, bias.data()}};
    Tensor out{DType::f32, {n, t, 1, 1}, y.data()};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in, std::span<Tensor>(&out, 1), {}})) << "K=" << k;
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t r = 0; r < n; ++r) {
        double want = bias[static_cast<std::size_t>(r)], mag = std::fabs(want);
        for (std::int64_t j = 0; j < k; ++j) {
          const double p =
              static_cast<double>(w[static_cast<std::size_t>(r * k + j)]) * x[static_cast<std::size_t>(i * k + j)];
          want += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[static_cast<std::size_t>(i * n + r)], want, 1e-5 * mag + 1e-6)
            << "K=" << k << " t=" << i << " row=" << r;
      }
    }
    // The last token alone gives the same bits as inside the batch of 11.
    std::vector<float> one(static_cast<std::size_t>(n));
    Tensor in1[] = {in[0], Tensor{DType::f32, {k, 1, 1, 1}, x.data() + (t - 1) * k}, in[2]};
    Tensor out1{DType::f32, {n, 1, 1, 1}, one.data()};
    ASSERT_TRUE(c.run(OpCall{Op::matmul, in1, std::span<Tensor>(&out1, 1), {}}));
    EXPECT_EQ(0, std::memcmp(one.data(), y.data() + (t - 1) * n, one.size() * 4)) << "K=" << k;
  }
}

}  // namespace
