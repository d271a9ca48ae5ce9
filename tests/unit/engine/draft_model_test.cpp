// A draft model's token ids must mean the model's: draft_vocab_problem names what differs.
#include "colibri/engine/draft_model.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace colibri::engine {
namespace {

using nlohmann::json;

json tiny_bpe() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [{"id": 5, "content": "<s>", "special": true, "normalized": false,
      "lstrip": false, "rstrip": false, "single_word": false},
      {"id": 6, "content": "</s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false,
      "single_word": false}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
      "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3, "c": 4, "<s>": 5, "</s>": 6},
      "merges": ["a b"]}
  })");
}

tokenizer::Tokenizer load(const json& j) {
  auto tok = tokenizer::Tokenizer::from_json(j.dump(), "tiny.json");
  EXPECT_TRUE(tok.has_value()) << tok.error().to_string();
  return *tok;
}

TEST(DraftVocabulary, TheSameIdsPassAndTheFirstDifferenceIsNamed) {
  const auto target = load(tiny_bpe());
  EXPECT_EQ(draft_vocab_problem(load(tiny_bpe()), target), "");

  auto swapped = tiny_bpe();  // "a" and "b" trade ids: the merge still reads
  swapped["model"]["vocab"]["a"] = 1;
  swapped["model"]["vocab"]["b"] = 0;
  EXPECT_EQ(draft_vocab_problem(load(swapped), target), "token 0 is 'b' there and 'a' in the model");

  auto more = tiny_bpe();  // a few ids more: the shared ones agree
  more["model"]["vocab"]["bc"] = 7;
  more["model"]["vocab"]["abc"] = 8;
  more["model"]["merges"] = json::array({"a b", "b c", "ab c"});
  EXPECT_EQ(draft_vocab_problem(load(more), target), "");

  auto far = tiny_bpe();  // 200 ids more: not the same vocabulary
  for (int i = 0; i < 200; ++i) far["model"]["vocab"]["x" + std::to_string(i)] = 7 + i;
  EXPECT_NE(draft_vocab_problem(load(far), target).find("more than 128 apart"), std::string::npos);
}

// `count` experts of `bytes` each.
model::Manifest with_experts(int count, std::uint64_t bytes) {
  model::Manifest m;
  for (int i = 0; i < count; ++i) {
    model::ExpertEntry e;
    e.expert = i;
    e.size = bytes;
    m.experts.push_back(e);
  }
  return m;
}

TEST(ExpertCacheSplit, TheDraftModelTakesAtMostHalfAndTheModelTheRest) {
  constexpr std::uint64_t MiB = 1 << 20;
  const auto model = with_experts(64, 4 * MiB);  // 256 MiB, slots of 4 MiB
  // A small draft model: all of its experts, the model the rest of the budget.
  auto split = split_expert_cache(100 * MiB, model, with_experts(8, 2 * MiB));
  ASSERT_TRUE(split) << split.error().message();
  EXPECT_EQ(split->draft, 16 * MiB);
  EXPECT_EQ(split->model, 84 * MiB);
  // A large one: half of it.
  split = split_expert_cache(100 * MiB, model, with_experts(64, 2 * MiB));
  ASSERT_TRUE(split) << split.error().message();
  EXPECT_EQ(split->draft, 50 * MiB);
  EXPECT_EQ(split->model, 50 * MiB);
  // A dense draft model without experts takes none; the budget covers both models' experts whole: as many as each.
  split = split_expert_cache(100 * MiB, model, model::Manifest{});
  ASSERT_TRUE(split) << split.error().message();
  EXPECT_EQ(split->draft, 0u);
  EXPECT_EQ(split->model, 100 * MiB);
  split = split_expert_cache(1024 * MiB, model, with_experts(8, 2 * MiB));
  ASSERT_TRUE(split) << split.error().message();
  EXPECT_EQ(split->draft, 16 * MiB);
  EXPECT_EQ(split->model, 1008 * MiB);

  // Half of 6 MiB holds none of the model's 4 MiB experts: the key, both parts' sizes and what to do are named.
  split = split_expert_cache(6 * MiB, model, with_experts(64, 1 * MiB));
  ASSERT_FALSE(split);
  EXPECT_EQ(split.error().message(),
            "memory.expert_cache (6M) holds the experts of the model and its draft model together; the model's "
            "part, 3M, holds none of its experts (one needs 4M); raise it (--expert-cache-size) or use a "
            "smaller draft model");
  split = split_expert_cache(6 * MiB, with_experts(64, 1 * MiB), model);
  ASSERT_FALSE(split);
  EXPECT_NE(split.error().message().find("the draft model's part, 3M, holds none"), std::string::npos)
      << split.error().message();
}

}  // namespace
}  // namespace colibri::engine
