// The expert cache's admin operations on a real engine: logits stay bit-identical after clear() and warm() (the one
// promise), pinned experts survive a clear, and the statistics show the reloads. Also the engine's use of the
// optional group ops (expert_ffn_group; expert_ffn_clamped_group for gpt-oss) and of expert_ffn_routed (resident
// decode): the same bits, cache counts and routing records with them, without them, and after a backend refuses
// them. Tiny Mixtral and gpt-oss from tests/fixtures/make_tiny_model.py, the built
// cpu/pread/pinned/lru plugins.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include "colibri/engine/engine.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "tiny_engine.hpp"

namespace fs = std::filesystem;
using namespace colibri;

namespace {

const fs::path kWork = COLIBRI_TEST_WORK_DIR;
constexpr std::uint64_t kSlot = 3 * 256 * 512 * 4;  // one f32 expert of the tiny Mixtral

// `mxfp4`: the checkpoint's experts in MXFP4, kept so whatever the preset.
fs::path tiny_model(const std::string& arch = "mixtral", const std::string& preset = "f32", bool mxfp4 = false) {
  const std::string name =
      arch == "mixtral" && preset == "f32" ? "tiny" : "tiny-" + arch + "-" + preset + (mxfp4 ? "-mxfp4" : "");
  return test_support::tiny_model(kWork, name, arch, preset, mxfp4);
}

std::unique_ptr<engine::Engine> open_engine(const fs::path& model, const std::string& policy = "pinned") {
  ::setenv("COLIBRI_PLUGIN_PATH", COLIBRI_TEST_PLUGIN_DIR, 1);
  profile::LoadOptions lo;
  lo.use_process_environment = false;  // the built-in defaults (cpu backend), whatever $COLIBRI_PROFILE says
  lo.overrides = {{"storage.plugin", "pread", "--set"},
                  {"cache.policy", policy, "--set"},
                  {"cache.pinned_experts", "[0:1]", "--set"},
                  {"prefetch.layers", "0", "--set"}};
  auto prof = profile::Profile::load(lo);
  EXPECT_TRUE(prof) << (prof ? "" : prof.error().message());
  if (!prof) return nullptr;
  engine::EngineOptions eo;
  eo.context = 64;
  eo.expert_cache_bytes = 4 * kSlot;  // half of the 8 experts: streaming
  auto e = engine::Engine::open(model, *prof, eo);
  EXPECT_TRUE(e) << (e ? "" : e.error().message());
  return e ? std::move(*e) : nullptr;
}

std::vector<float> logits_of(engine::Engine& e, const std::vector<std::int32_t>& tokens) {
  e.reset();
  std::vector<float> logits;
  auto s = e.forward(tokens, engine::LogitsWanted::all, logits);
  EXPECT_TRUE(s) << s.message();
  return logits;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool is_group(sdk::Op op) {
  return op == sdk::Op::expert_ffn_group || op == sdk::Op::expert_ffn_clamped_group;
}

bool is_optional_expert_op(sdk::Op op) {
  return is_group(op) || op == sdk::Op::expert_ffn_routed;
}

// The cpu backend behind a seam: `offer` decides what supports() says of the group and routed ops, `refuse` makes
// run() answer `unsupported` for them (a plugin whose supports() promises more than its run() does); the calls are
// counted. `repeat_pick`: topk_routing's second pick of the first token repeats its first (a backend bug), while the
// routed op still computes with the true pick (a backend that does not notice).
class GroupSeam final : public sdk::Compute {
 public:
  GroupSeam(std::shared_ptr<sdk::Compute> inner, bool offer, bool refuse)
      : inner_(std::move(inner)), offer_(offer), refuse_(refuse) {}
  int group_calls = 0, refused = 0, single_calls = 0, routed_calls = 0, routed_refused = 0;
  bool repeat_pick = false;
  std::span<const sdk::DeviceInfo> devices() const noexcept override { return inner_->devices(); }
  sdk::Expected<std::unique_ptr<sdk::Buffer>> allocate(std::size_t bytes) noexcept override {
    return inner_->allocate(bytes);
  }
  bool supports(sdk::Op op, sdk::DType type) const noexcept override {
    return is_optional_expert_op(op) ? offer_ && inner_->supports(op, type) : inner_->supports(op, type);
  }
  sdk::Status run(const sdk::OpCall& call) noexcept override {
    if (repeat_pick && call.op == sdk::Op::topk_routing) {
      auto s = inner_->run(call);
      auto* ids = static_cast<std::int32_t*>(call.outputs[0].data);  // host memory on the cpu backend
      if (s && ids != nullptr && call.outputs[0].ne[0] >= 2) {
        true_pick_ = ids[1];
        ids[1] = ids[0];
      }
      return s;
    }
    if (repeat_pick && call.op == sdk::Op::expert_ffn_routed && true_pick_ >= 0) {
      ++routed_calls;
      std::vector<std::int32_t> ids(static_cast<const std::int32_t*>(call.inputs[1].data),
                                    static_cast<const std::int32_t*>(call.inputs[1].data) + call.inputs[1].ne[0]);
      ids[1] = true_pick_;
      std::vector<sdk::Tensor> in(call.inputs.begin(), call.inputs.end());
      in[1].data = ids.data();
      return inner_->run(sdk::OpCall{call.op, in, call.outputs, call.params});
    }
    if (call.op == sdk::Op::expert_ffn_routed) {
      ++routed_calls;
      if (refuse_) {
        ++routed_refused;
        return sdk::Status(sdk::StatusCode::unsupported, "seam: expert_ffn_routed refused");
      }
    }
    if (is_group(call.op)) {
      ++group_calls;
      if (refuse_) {
        ++refused;
        return sdk::Status(sdk::StatusCode::unsupported, std::string("seam: ") + sdk::op_name(call.op) + " refused");
      }
    }
    if (call.op == sdk::Op::expert_ffn || call.op == sdk::Op::expert_ffn_clamped) ++single_calls;
    return inner_->run(call);
  }
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_device_async(const void* src, sdk::Buffer& dst, std::size_t offset,
                                                                  std::size_t bytes) noexcept override {
    return inner_->copy_to_device_async(src, dst, offset, bytes);
  }
  sdk::Expected<std::unique_ptr<sdk::Event>> copy_to_host_async(const sdk::Buffer& src, std::size_t offset, void* dst,
                                                                std::size_t bytes) noexcept override {
    return inner_->copy_to_host_async(src, offset, dst, bytes);
  }
  sdk::Status synchronize() noexcept override { return inner_->synchronize(); }
  // A device backend's interfaces (host tensors, registered memory) are the inner one's.
  void* query_interface(std::string_view id) noexcept override { return inner_->query_interface(id); }

 private:
  std::shared_ptr<sdk::Compute> inner_;
  bool offer_, refuse_;
  std::int32_t true_pick_ = -1;
};

// How open_behind_seam opens an engine.
struct SeamEngine {
  std::string backend = "cpu";           // the built compute plugin behind the seam
  std::vector<profile::Override> extra;  // profile overrides (the backend's options)
  bool offer = true;                     // the seam offers the optional expert ops
  bool refuse = false;                   // ... and refuses them when called
  std::uint64_t ram_bytes = 64 * kSlot;  // the RAM cache (below the model's experts: streamed)
  std::uint64_t vram_bytes = 0;          // a VRAM tier that admits every miss (0: none)
};

// An engine on the built `o.backend`, pread and lru plugins, the backend behind a GroupSeam; null (and `why` says
// so) where the backend cannot run here.
std::unique_ptr<engine::Engine> open_behind_seam(const fs::path& model, std::shared_ptr<GroupSeam>& seam,
                                                 const SeamEngine& o, std::string& why) {
  ::setenv("COLIBRI_PLUGIN_PATH", COLIBRI_TEST_PLUGIN_DIR, 1);
  profile::LoadOptions lo;
  lo.use_process_environment = false;
  lo.overrides = {{"compute.backend", o.backend, "--set"}, {"prefetch.layers", "0", "--set"}};
  lo.overrides.insert(lo.overrides.end(), o.extra.begin(), o.extra.end());
  auto prof = profile::Profile::load(lo);
  EXPECT_TRUE(prof) << (prof ? "" : prof.error().message());
  if (!prof) return nullptr;
  const auto reg = registry::scan_for_profile(*prof);
  const auto* device = reg.find(sdk::PluginKind::compute, o.backend);
  const auto* pread = reg.find(sdk::PluginKind::storage, "pread");
  const auto* lru = reg.find(sdk::PluginKind::cache, "lru");
  EXPECT_TRUE(pread && lru) << "built plugins not found in " << COLIBRI_TEST_PLUGIN_DIR;
  if (!pread || !lru) return nullptr;
  if (device == nullptr || device->score.value == 0) {
    why = o.backend + " cannot run here" + (device ? ": " + device->score.reason : std::string(" (not built)"));
    return nullptr;
  }
  const auto typed = prof->apply_plugin_schema(sdk::PluginKind::compute, o.backend, device->options);
  EXPECT_TRUE(typed) << typed.message();
  auto compute = reg.create_as<sdk::Compute>(*device, prof->section("compute"));
  if (!compute) {
    why = compute.error().message();
    EXPECT_EQ(compute.error().code(), sdk::StatusCode::unsupported) << why;  // no device here, not a broken option
    return nullptr;
  }
  auto storage = reg.create_as<sdk::Storage>(*pread, prof->section("storage"));
  auto cache = reg.create_as<sdk::CachePolicy>(*lru, prof->section("cache"));
  EXPECT_TRUE(storage && cache);
  if (!storage || !cache) return nullptr;
  seam = std::make_shared<GroupSeam>(*compute, o.offer, o.refuse);
  engine::Plugins plugins;
  plugins.compute = seam;
  plugins.storage = *storage;
  plugins.cache = *cache;
  plugins.compute_name = o.backend + " (seam)";
  engine::EngineOptions eo;
  eo.context = 64;
  if (o.vram_bytes > 0) {
    auto vram_cache = reg.create_as<sdk::CachePolicy>(*lru, prof->section("cache"));
    EXPECT_TRUE(vram_cache);
    if (!vram_cache) return nullptr;
    plugins.vram_cache = *vram_cache;
    eo.vram_budget_bytes = o.vram_bytes;
    eo.vram_admission = false;  // always: a miss is uploaded, so a cleared tier fills again
  }
  auto e = engine::Engine::open(model, plugins, o.ram_bytes, 0, eo);
  EXPECT_TRUE(e) << (e ? "" : e.error().message());
  return e ? std::move(*e) : nullptr;
}

// The cpu backend behind a GroupSeam; `cache_bytes` below the model's experts streams them.
std::unique_ptr<engine::Engine> open_with_seam(const fs::path& model, std::shared_ptr<GroupSeam>& seam, bool offer,
                                               bool refuse, std::uint64_t cache_bytes) {
  std::string why;
  SeamEngine cpu;
  cpu.offer = offer;
  cpu.refuse = refuse;
  cpu.ram_bytes = cache_bytes;
  auto e = open_behind_seam(model, seam, cpu, why);
  EXPECT_TRUE(e) << why;
  return e;
}

// Logits of a prompt in one pass (experts run rows gathered per expert) and then token by token (every routed
// expert runs the whole batch), concatenated; the steps' routing records into `trace` when given.
std::vector<float> prompt_then_steps(engine::Engine& e, std::vector<engine::RoutingRecord>* trace = nullptr) {
  const std::vector<std::int32_t> tokens{1, 17, 42, 99, 5, 250, 3, 77, 12, 8};
  auto all = logits_of(e, tokens);
  e.reset();
  for (const auto t : tokens) {
    std::vector<float> step;
    auto s = e.forward(std::span(&t, 1), engine::LogitsWanted::last, step, trace);
    EXPECT_TRUE(s) << s.message();
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

// Routing records as text, for comparisons that show where two differ.
std::string records_text(const std::vector<engine::RoutingRecord>& records) {
  std::ostringstream out;
  for (const auto& r : records) {
    out << "step " << r.step << " pos " << r.position << " layer " << r.layer << ":";
    for (std::size_t j = 0; j < r.experts.size(); ++j) out << " " << r.experts[j] << "@" << r.weights[j];
    out << "\n";
  }
  return out.str();
}

// Resident and streaming (a cache of `streaming_slots` of the model's largest experts), the logits are bit-identical
// with the group op, without it and after a refusal; the group op is used where offered, and never otherwise. Where
// `routes` (experts without biases), resident decode runs through expert_ffn_routed where it is offered, and the
// cache's counts and the routing records are those of the engine routing itself.
void expect_group_op_keeps_the_bits(const fs::path& model, std::uint64_t streaming_slots, bool routes = false) {
  auto manifest = model::load_manifest(model);
  ASSERT_TRUE(manifest) << manifest.error().message();
  std::uint64_t slot = 0;
  for (const auto& e : manifest->experts) slot = std::max(slot, e.size);
  for (const std::uint64_t cache_bytes : {std::uint64_t{64} * slot, streaming_slots * slot}) {
    const std::string where = cache_bytes > 16 * slot ? "resident" : "streaming";
    std::shared_ptr<GroupSeam> grouped, single, refusing;
    auto a = open_with_seam(model, grouped, true, false, cache_bytes);
    auto b = open_with_seam(model, single, false, false, cache_bytes);
    auto c = open_with_seam(model, refusing, true, true, cache_bytes);
    ASSERT_TRUE(a && b && c);
    ASSERT_EQ(a->mode(), where);
    std::vector<engine::RoutingRecord> want_trace, got_trace;
    const auto want = prompt_then_steps(*b, &want_trace);
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(bit_identical(prompt_then_steps(*a, &got_trace), want)) << where << ": the group op changed the logits";
    EXPECT_TRUE(bit_identical(prompt_then_steps(*c), want)) << where << ": the fallback changed the logits";
    EXPECT_EQ(single->group_calls, 0) << where << ": the group op called though supports() said no";
    EXPECT_EQ(single->routed_calls, 0) << where << ": the routed op called though supports() said no";
    EXPECT_GT(single->single_calls, 0);
    EXPECT_GT(grouped->group_calls, 0) << where << ": the engine never grouped the experts of a layer";
    EXPECT_EQ(refusing->refused, 1) << where << ": after one refusal the engine must stop asking";
    const bool resident_routes = routes && where == "resident";
    if (resident_routes) {
      EXPECT_GT(grouped->routed_calls, 0) << where << ": resident decode never routed on the backend";
    } else {
      EXPECT_EQ(grouped->routed_calls, 0) << where << ": routed on the backend where the engine must route itself";
    }
    EXPECT_EQ(refusing->routed_refused, resident_routes ? 1 : 0) << where << ": after one refusal, never again";
    // The routed op's uses are settled at the end of each pass: the same hits, misses, per-expert use counts and
    // routing records (in layer order) as the engine's own routing.
    EXPECT_EQ(a->experts().stats().hits, b->experts().stats().hits) << where;
    EXPECT_EQ(a->experts().stats().misses, b->experts().stats().misses) << where;
    EXPECT_EQ(a->experts().usage(), b->experts().usage()) << where << ": per-expert use counts differ";
    EXPECT_FALSE(want_trace.empty());
    EXPECT_EQ(records_text(got_trace), records_text(want_trace)) << where;
  }
}

TEST(ExpertGroupEngine, SameBitsWithTheGroupAndRoutedOpsWithoutThemAndAfterABackendRefusesThem) {
  expect_group_op_keeps_the_bits(tiny_model(), 4, true);  // streaming: half of its experts
}

// A backend whose topk_routing repeats a pick is an error naming it, where the engine routes (the host path) and where
// the backend routes (found when the pass is settled), never a token counted twice by one expert.
TEST(ExpertGroupEngine, APickTheBackendRepeatsIsAnErrorNotATokenCountedTwice) {
  for (const bool routes : {false, true}) {
    std::shared_ptr<GroupSeam> seam;
    auto e = open_with_seam(tiny_model(), seam, routes, false, 64 * kSlot);
    ASSERT_TRUE(e);
    ASSERT_EQ(e->mode(), "resident");
    seam->repeat_pick = true;
    std::vector<float> out;
    const std::int32_t token = 17;
    const auto s = e->forward(std::span(&token, 1), engine::LogitsWanted::last, out);
    ASSERT_FALSE(s) << (routes ? "routed" : "engine routing") << ": a repeated pick went unnoticed";
    EXPECT_NE(s.message().find("compute backend cpu (seam) routed token row 0 of layer 0 to expert"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("twice; topk_routing's picks of a token must be distinct"), std::string::npos)
        << s.message();
    EXPECT_EQ(seam->routed_calls > 0, routes) << s.message();
  }
}

// Routed decode on a backend with memory of its own (Vulkan with its memory not mapped: a discrete GPU's path; CI's
// lavapipe), every expert in VRAM. After the cache is cleared, a layer routes on the backend again only once the
// tier holds all its experts, so for a while a pass mixes layers the backend routes with layers the engine routes,
// each choice in its own region of device memory, the routed ones downloaded together at the end of the pass. The
// logits, the tiers' counts, per-expert uses and routing records are those of the same run with the engine routing
// every layer itself.
TEST(CacheAdminEngine, DecodeAfterAClearMixesRoutedAndUnroutedLayersWithTheSameBits) {
  const fs::path model = tiny_model();
  const std::vector<profile::Override> unmapped{{"compute.map_device_memory", "false", "--set"}};
  std::shared_ptr<GroupSeam> ref_seam, seam;
  std::string why;
  SeamEngine engine_routes;
  engine_routes.backend = "vulkan";
  engine_routes.extra = unmapped;
  engine_routes.offer = false;
  engine_routes.vram_bytes = 64 * kSlot;
  SeamEngine backend_routes = engine_routes;
  backend_routes.offer = true;
  auto reference = open_behind_seam(model, ref_seam, engine_routes, why);
  if (!reference) GTEST_SKIP() << why;
  auto e = open_behind_seam(model, seam, backend_routes, why);
  ASSERT_TRUE(e) << why;
  std::vector<engine::RoutingRecord> want_trace, got_trace;
  const std::vector<std::int32_t> tokens{1,  17,  42, 99,  5, 250, 3,   77, 12,  8,  31,  64, 200, 7,   150, 90,
                                         45, 120, 33, 180, 2, 66,  240, 19, 101, 55, 170, 88, 13,  222, 9,   140};
  const auto layers = static_cast<int>(e->hparams().num_layers);
  int mixed = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i == 3) {
      const auto cleared = e->experts().clear();
      ASSERT_GT(cleared.vram_dropped, 0u) << "the clear left the VRAM tier as it was";
      ASSERT_EQ(reference->experts().clear().vram_dropped, cleared.vram_dropped);
    }
    std::vector<float> want, got;
    ASSERT_TRUE(reference->forward(std::span(&tokens[i], 1), engine::LogitsWanted::last, want, &want_trace));
    const int before = seam->routed_calls;
    const auto s = e->forward(std::span(&tokens[i], 1), engine::LogitsWanted::last, got, &got_trace);
    ASSERT_TRUE(s) << "token " << i << ": " << s.message();
    ASSERT_TRUE(bit_identical(got, want)) << "token " << i << ": the logits moved";
    const int routed = seam->routed_calls - before;
    if (i < 3) {
      EXPECT_EQ(routed, layers) << "token " << i << ": every expert in VRAM, every layer routes on the backend";
    } else if (i == 3) {
      EXPECT_EQ(routed, 0) << "right after the clear no layer has its experts in VRAM";
    }
    if (i > 3) mixed += routed > 0 && routed < layers ? 1 : 0;
  }
  EXPECT_GT(mixed, 0) << "no pass mixed routed and unrouted layers after the clear";
  EXPECT_EQ(ref_seam->routed_calls, 0);
  const auto &got_stats = e->experts().stats(), &want_stats = reference->experts().stats();
  EXPECT_EQ(got_stats.hits, want_stats.hits);
  EXPECT_EQ(got_stats.misses, want_stats.misses);
  EXPECT_EQ(got_stats.vram_hits, want_stats.vram_hits);
  EXPECT_EQ(got_stats.vram_misses, want_stats.vram_misses);
  EXPECT_EQ(got_stats.uploads, want_stats.uploads);
  EXPECT_EQ(e->experts().usage(), reference->experts().usage()) << "per-expert use counts differ";
  EXPECT_EQ(records_text(got_trace), records_text(want_trace));
}

// gpt-oss's biased experts through expert_ffn_clamped_group: f32, MXFP4 experts (q8_0 activations) and q4_k_m. Two
// thirds of its 12 experts streaming: with fewer, a layer's top 2 are seldom both ready to run together.
TEST(ExpertGroupEngine, GptOssSameBitsWithTheClampedGroupOpWithoutItAndAfterARefusal) {
  for (const auto& [preset, mxfp4] : {std::pair{"f32", false}, std::pair{"f32", true}, std::pair{"q4_k_m", false}}) {
    SCOPED_TRACE(std::string("gpt_oss ") + preset + (mxfp4 ? " with mxfp4 experts" : ""));
    expect_group_op_keeps_the_bits(tiny_model("gpt_oss", preset, mxfp4), 8);
  }
}

// cache.pinned_experts only means something to a policy that pins: any other says so, instead of silently not pinning.
TEST(CacheAdminEngine, PinnedExpertsUnderAPolicyThatDoesNotPinAreReported) {
  const fs::path model = tiny_model();
  for (const std::string policy : {"lru", "pinned"}) {
    std::ostringstream captured;
    auto previous = spdlog::default_logger();
    spdlog::set_default_logger(
        std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
    auto e = open_engine(model, policy);
    spdlog::set_default_logger(previous);
    ASSERT_TRUE(e) << policy;
    const bool warned =
        captured.str().find("cache.pinned_experts (1 listed) ignored: cache policy lru does not pin experts") !=
        std::string::npos;
    EXPECT_EQ(warned, policy == "lru") << policy << ": " << captured.str();
  }
}

TEST(CacheAdminEngine, LogitsAreBitIdenticalAfterClearAndWarm) {
  auto e = open_engine(tiny_model());
  ASSERT_TRUE(e);
  ASSERT_EQ(e->mode(), "streaming");
  const std::vector<std::int32_t> tokens{1, 17, 42, 99, 5, 250, 3, 77, 12, 8};
  const auto reference = logits_of(*e, tokens);
  ASSERT_FALSE(reference.empty());
  auto& experts = e->experts();
  ASSERT_GE(experts.resident_count(), 2u);

  const auto misses = experts.stats().misses;
  const auto cleared = experts.clear();
  EXPECT_EQ(cleared.kept_pinned, 1u);  // 0:1
  EXPECT_EQ(cleared.kept_in_use, 0u);
  EXPECT_GE(cleared.dropped, 1u);
  EXPECT_EQ(experts.resident_count(), 1u);
  EXPECT_EQ(experts.resident_bytes(), kSlot);
  EXPECT_TRUE(bit_identical(logits_of(*e, tokens), reference)) << "logits changed after clear()";
  EXPECT_GT(experts.stats().misses, misses);

  experts.clear();
  const std::vector<sdk::ExpertKey> hot{{1, 3}, {1, 0}, {0, 2}, {0, 0}, {1, 1}};
  auto warmed = experts.warm(hot);
  ASSERT_TRUE(warmed) << warmed.error().message();
  EXPECT_EQ(warmed->loaded, 3u);  // the pin takes the fourth slot
  EXPECT_EQ(warmed->no_room, 2u);
  EXPECT_EQ(warmed->bytes_read, 3 * kSlot);
  EXPECT_EQ(experts.resident_bytes(), 4 * kSlot);
  EXPECT_TRUE(bit_identical(logits_of(*e, tokens), reference)) << "logits changed after warm()";
}

}  // namespace
