#include "colibri/engine/memory_plan.hpp"

#include <gtest/gtest.h>

namespace colibri::engine {
namespace {

model::Manifest manifest_with(std::initializer_list<std::uint64_t> expert_sizes) {
  model::Manifest m;
  m.hparams.num_layers = 2;
  m.hparams.num_kv_heads = 2;
  m.hparams.head_dim = 64;
  m.hparams.max_position_embeddings = 1000;
  std::uint32_t i = 0;
  for (auto size : expert_sizes) {
    model::ExpertEntry e;
    e.layer = 0;
    e.expert = i++;
    e.size = size;
    m.experts.push_back(e);
  }
  return m;
}

TEST(MemoryPlan, ContextComesFromTheFlagTheKeyOrHalfTheFreeRam) {
  const auto per_100 = [](std::int64_t n) { return 100u * static_cast<std::uint64_t>(n); };  // 100 bytes a position
  EXPECT_EQ(*kv_context(500, 0, per_100, 1000, 0), 500);
  auto over = kv_context(1001, 0, per_100, 1000, 0);
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().message().find("--ctx 1001"), std::string::npos);
  EXPECT_EQ(*kv_context(0, 250 * 100, per_100, 1000, 0), 250);
  EXPECT_EQ(*kv_context(0, 5000 * 100, per_100, 1000, 0), 1000) << "never more than the model's";
  auto tiny = kv_context(0, 99, per_100, 1000, 0);
  ASSERT_FALSE(tiny);
  EXPECT_NE(tiny.error().message().find("memory.kv_cache"), std::string::npos);
  EXPECT_EQ(*kv_context(0, 0, per_100, 1000, 2 * 300 * 100), 300) << "half of the free RAM";
  EXPECT_EQ(*kv_context(0, 0, per_100, 1000, 0), 1) << "at least one position";
  EXPECT_EQ(*kv_context(0, 0, per_100, 1000, 0, {}, 500), 500) << "at least the floor";
  EXPECT_EQ(*kv_context(0, 0, per_100, 1000, 0, {}, 2048), 1000) << "never more than the model's";
  EXPECT_EQ(*kv_context(0, 0, per_100, 1000, 2 * 700 * 100, {}, 500), 700);
  EXPECT_EQ(kv_host_available(1000, 300, 200), 800u) << "a streaming tier fills its budget";
  EXPECT_EQ(kv_host_available(1000, 300, 2000), 700u) << "a resident one its experts";
  EXPECT_EQ(kv_host_available(100, 300, 2000), 0u);
  EXPECT_EQ(kv_host_available(1000, 300, 200, 150), 650u) << "a draft model's weights beside it";
  EXPECT_EQ(kv_host_available(1000, 300, 200, 900), 0u);
  // Every cache held at once (4 sequences, each with a draft model's cache of 25 bytes a position) fits that half; a
  // flag or a key still sizes one sequence's.
  const auto four_with_drafts = [](std::int64_t n) { return 4u * 125u * static_cast<std::uint64_t>(n); };
  EXPECT_EQ(*kv_context(0, 0, per_100, 1000, 2 * 300 * 100, four_with_drafts), 60);
  EXPECT_EQ(*kv_context(500, 0, per_100, 1000, 2 * 300 * 100, four_with_drafts), 500);
  EXPECT_EQ(*kv_context(0, 250 * 100, per_100, 1000, 2 * 300 * 100, four_with_drafts), 250);
}

TEST(MemoryPlan, SlotsTiersAndKvFollowTheBudgets) {
  const auto m = manifest_with({5000, 4096, 4096, 4096});
  EXPECT_EQ(expert_slot_bytes(m), 8192u) << "the largest expert, rounded up to 4 KiB";
  auto resident = plan_memory(m, 1u << 20, 0, 100, 0, sdk::DType::f16, 0);
  ASSERT_TRUE(resident);
  EXPECT_TRUE(resident->resident);
  EXPECT_EQ(resident->ram_bytes, 5000u + 3 * 4096u);
  EXPECT_EQ(resident->kv_bytes_per_position, 2u * 2 * 2 * 64 * 2);
  EXPECT_EQ(resident->kv_bytes, 100u * resident->kv_bytes_per_position);
  // Four sequences' caches (the server's --max-batch) share half of the 64 MiB the resident experts leave: a context
  // of 64 MiB / 2 / 4 / 1024 bytes. Where that is below 2048 positions, 2048 (kMinAutoContext).
  auto long_model = m;
  long_model.hparams.max_position_embeddings = 100000;
  auto batch = plan_memory(long_model, 1u << 20, 0, 0, 0, sdk::DType::f16, (64u << 20) + 17288, {}, 4);
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->kv_sequences, 4u);
  EXPECT_EQ(batch->context, 8192);
  batch = plan_memory(long_model, 1u << 20, 0, 0, 0, sdk::DType::f16, (4u << 20) + 17288, {}, 4);
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->context, 2048) << "512 fit; the floor";
  // A streaming RAM tier's slots are not the KV cache's either: 2 slots of 8192 bytes come off the RAM available.
  auto beside_slots = plan_memory(long_model, 2 * 8192, 0, 0, 0, sdk::DType::f16, (32u << 20) + 2 * 8192);
  ASSERT_TRUE(beside_slots);
  EXPECT_EQ(beside_slots->context, 16384);
  auto streaming = plan_memory(m, 2 * 8192 + 100, 3 * 8192, 0, 0, sdk::DType::q8_0, 1u << 30);
  ASSERT_TRUE(streaming);
  EXPECT_FALSE(streaming->resident);
  EXPECT_EQ(streaming->ram_slots, 2u) << "17288 bytes of experts do not fit 16484: slots of the largest";
  EXPECT_EQ(streaming->ram_bytes, 2u * 8192);
  EXPECT_EQ(streaming->vram_slots, 3u);
  EXPECT_EQ(streaming->context, 1000);
  auto all_vram = plan_memory(m, 8192, 100 * 8192, 0, 0, sdk::DType::f16, 0);
  ASSERT_TRUE(all_vram);
  EXPECT_EQ(all_vram->vram_slots, 4u) << "never more slots than experts";
  auto ram_below = plan_memory(m, 8191, 0, 0, 0, sdk::DType::f16, 0);
  ASSERT_FALSE(ram_below) << "a streaming RAM tier with no slot";
  EXPECT_NE(
      ram_below.error().message().find("memory.expert_cache (8191 bytes) holds no expert: one slot needs 8192 bytes"),
      std::string::npos)
      << ram_below.error().message();
  auto below = plan_memory(m, 8192, 8191, 0, 0, sdk::DType::f16, 0);
  ASSERT_FALSE(below);
  EXPECT_NE(below.error().message().find("memory.vram_budget"), std::string::npos);
  EXPECT_FALSE(plan_memory(m, 8192, 0, 0, 0, sdk::DType::q4_k, 0)) << "a KV type that does not fit head_dim";
}

// Multi-head latent attention keeps one row of latent + RoPE key per token and layer, read as keys and values.
TEST(MemoryPlan, LatentAttentionPaysOneRowPerTokenAndLayer) {
  auto m = manifest_with({4096});
  m.hparams.num_heads = m.hparams.num_kv_heads = 16;
  m.hparams.head_dim = 192;
  m.hparams.rotary_dims = 64;
  m.hparams.kv_lora_rank = 512;
  m.hparams.v_head_dim = 128;
  auto p = plan_memory(m, 1u << 20, 0, 100, 0, sdk::DType::f16, 0);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->kv_bytes_per_position, 2u * (512 + 64) * 2) << "2 layers of one f16 row of 576";
  EXPECT_EQ(p->kv_bytes, 100u * p->kv_bytes_per_position);
  m.hparams.kv_lora_rank = 500;  // rows of 564 do not fit q8_0's blocks of 32
  auto q8 = plan_memory(m, 1u << 20, 0, 100, 0, sdk::DType::q8_0, 0);
  ASSERT_FALSE(q8);
  EXPECT_NE(q8.error().message().find("does not fit its rows of 564"), std::string::npos) << q8.error().message();
}

// A sliding-window layer costs a fixed number of rows past them, so a KV budget holds more context.
TEST(MemoryPlan, SlidingWindowLayersKeepTheirRowsAndLeaveTheBudgetToTheOthers) {
  auto m = manifest_with({4096});
  m.hparams.max_position_embeddings = 100000;
  m.hparams.sliding_window = 100;
  m.hparams.sliding_layers = {0};
  const auto windows = kv_windows(m.hparams, 16, true, 0);  // no checkpoints (below)
  EXPECT_EQ(windows.window, (std::vector<std::int64_t>{100, 0}));
  EXPECT_EQ(kv_windows(m.hparams, 16, true).checkpoints, kDefaultKvCheckpoints);
  EXPECT_TRUE(kv_windows(m.hparams, 16, false).window.empty()) << "memory.kv_sliding_window: false";
  const std::uint64_t per_layer_position = 2u * 2 * 64 * 2;    // K and V, 2 heads of 64 in f16
  const std::uint64_t budget = 2000 * 2 * per_layer_position;  // 2000 positions of both layers
  auto full = plan_memory(m, 1u << 20, 0, 0, budget, sdk::DType::f16, 0);
  auto sliding = plan_memory(m, 1u << 20, 0, 0, budget, sdk::DType::f16, 0, windows);
  ASSERT_TRUE(full && sliding);
  EXPECT_EQ(full->context, 2000);
  EXPECT_EQ(full->kv_sliding_layers, 0);
  // 384 rows for layer 0 (100 + 63 + 16 + 100 + 64, to 64s), the rest of the budget for layer 1.
  EXPECT_EQ(sliding->context, 4000 - 384);
  EXPECT_EQ(sliding->kv_bytes, (384u + 3616u) * per_layer_position);
  EXPECT_EQ(sliding->kv_sliding_layers, 1);
  EXPECT_EQ(sliding->kv_sliding_rows, 384);
  // Each checkpoint (memory.kv_checkpoints) copies up to 227 rows of the sliding layer (100 + 127): less context.
  auto kept = plan_memory(m, 1u << 20, 0, 0, budget, sdk::DType::f16, 0, kv_windows(m.hparams, 16, true, 4));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->context, 4000 - 384 - 4 * 227);
  EXPECT_EQ(kept->kv_sliding_rows, 384);
  EXPECT_EQ(largest_context(
                1000, [](std::int64_t n) { return static_cast<std::uint64_t>(n * n); }, 50),
            31);
  EXPECT_EQ(largest_context(
                5000, [](std::int64_t n) { return static_cast<std::uint64_t>(n * n); }, 50),
            50)
      << "never more than the model's";
}

}  // namespace
}  // namespace colibri::engine
