// The expert cache's admin operations on a real engine: logits stay bit-identical after clear() and warm() (the one
// promise), pinned experts survive a clear, and the statistics show the reloads. Tiny Mixtral from
// tests/fixtures/make_tiny_model.py, the built cpu/pread/pinned plugins.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "colibri/engine/engine.hpp"
#include "colibri/model/convert.hpp"
#include "colibri/profile/profile.hpp"

namespace fs = std::filesystem;
using namespace colibri;

namespace {

const fs::path kWork = COLIBRI_TEST_WORK_DIR;
constexpr std::uint64_t kSlot = 3 * 256 * 512 * 4;  // one f32 expert of the tiny Mixtral

// The converted model, made once (private names, then renamed: parallel ctest processes never see half a model).
fs::path tiny_model() {
  const fs::path model = kWork / "tiny";
  if (fs::exists(model / "manifest.json")) return model;
  fs::create_directories(kWork);
  const auto tag = std::to_string(::getpid());
  const fs::path ckpt = kWork / ("ckpt-" + tag);
  const std::string cmd = std::string(COLIBRI_TEST_PYTHON) + " '" + COLIBRI_TEST_SOURCE_DIR +
                          "/tests/fixtures/make_tiny_model.py' --arch mixtral --dtype f32 --out '" + ckpt.string() +
                          "' >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  model::ConvertOptions co;
  co.input = ckpt;
  co.output = kWork / ("tiny-" + tag);
  co.preset = "f32";
  co.threads = 1;
  auto s = model::convert_model(co);
  EXPECT_TRUE(s) << (s ? "" : s.error().message());
  std::error_code ec;
  fs::rename(co.output, model, ec);
  if (ec) fs::remove_all(co.output);
  fs::remove_all(ckpt);
  return model;
}

std::unique_ptr<engine::Engine> open_engine(const fs::path& model) {
  ::setenv("COLIBRI_PLUGIN_PATH", COLIBRI_TEST_PLUGIN_DIR, 1);
  profile::LoadOptions lo;
  lo.use_process_environment = false;  // the built-in defaults (cpu backend), whatever $COLIBRI_PROFILE says
  lo.overrides = {{"storage.plugin", "pread", "--set"},
                  {"cache.policy", "pinned", "--set"},
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
