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

}  // namespace
}  // namespace colibri::engine
