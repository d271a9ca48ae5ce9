// KV caches in device memory (Vulkan with unmapped memory: a discrete GPU's path, on whatever Vulkan device exists;
// Mesa lavapipe in CI): an engine whose caller runs only sequences (the server, a draft model) holds no KV cache of
// its own there, and its sequences' caches give the logits forward()'s does. Skips without a Vulkan device unless
// COLIBRI_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "colibri/engine/draft_model.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "tiny_engine.hpp"

namespace fs = std::filesystem;
using namespace colibri;

namespace {

const fs::path kWork = COLIBRI_TEST_WORK_DIR;

sdk::Expected<profile::Profile> vulkan_profile() {
  ::setenv("COLIBRI_PLUGIN_PATH", COLIBRI_TEST_PLUGIN_DIR, 1);
  profile::LoadOptions lo;
  lo.use_process_environment = false;
  lo.overrides = {{"compute.backend", "vulkan", "--set"},
                  {"compute.map_device_memory", "false", "--set"},
                  {"storage.plugin", "pread", "--set"},
                  {"cache.policy", "lru", "--set"}};
  return profile::Profile::load(lo);
}

TEST(DeviceKv, OnlyTheCachesSequencesUseAreInDeviceMemory) {
  const auto model = test_support::tiny_model(kWork, "mixtral", "mixtral", "f32");
  auto prof = vulkan_profile();
  ASSERT_TRUE(prof) << prof.error().message();
  engine::EngineOptions eo;
  eo.context = 64;
  auto plain = engine::Engine::open(model, *prof, eo);
  if (!plain) {
    if (std::getenv("COLIBRI_REQUIRE_VULKAN") == nullptr) GTEST_SKIP() << plain.error().message();
    FAIL() << plain.error().message();
  }
  ASSERT_TRUE((*plain)->kv_cache().on_device()) << "forward()'s KV cache is in device memory";

  eo.sequences_only = true;
  auto batched = engine::Engine::open(model, *prof, eo);
  ASSERT_TRUE(batched) << batched.error().message();
  EXPECT_FALSE((*batched)->kv_cache().on_device());
  auto seq = (*batched)->new_sequence();
  ASSERT_TRUE(seq) << seq.error().message();
  EXPECT_TRUE((*seq)->kv.on_device());
  EXPECT_EQ((*seq)->kv.context(), 64);

  // The same logits, token after token, from the sequence's device cache as from forward()'s.
  const std::vector<std::int32_t> prompt = {1, 17, 230, 45, 9, 301, 12};
  std::vector<float> want, got;
  ASSERT_TRUE((*plain)->forward(prompt, engine::LogitsWanted::last, want));
  engine::Engine::BatchItem item;
  item.sequence = seq->get();
  item.tokens = prompt;
  item.logits = &got;
  ASSERT_TRUE((*batched)->forward_batch(std::span(&item, 1)));
  EXPECT_EQ(got, want);
  for (std::int32_t next : {5, 88, 140}) {
    ASSERT_TRUE((*plain)->forward(std::span(&next, 1), engine::LogitsWanted::last, want));
    item.tokens = std::span(&next, 1);
    ASSERT_TRUE((*batched)->forward_batch(std::span(&item, 1)));
    EXPECT_EQ(got, want) << "after token " << next;
  }

  // A draft model's engine likewise: its states' caches are in device memory, its own is not.
  auto tok = tokenizer::Tokenizer::from_file(model);
  ASSERT_TRUE(tok) << tok.error().message();
  auto draft = engine::DraftModel::open(model, *prof, engine::EngineOptions{}, **plain, *tok, 0.75);
  ASSERT_TRUE(draft) << draft.error().message();
  EXPECT_FALSE((*draft)->engine().kv_cache().on_device());
  auto state = (*draft)->acquire(prompt);
  ASSERT_TRUE(state) << state.error().message();
  EXPECT_TRUE((*state)->sequence->kv.on_device());
}

}  // namespace
