// Fill in the middle: the three marker tokens are found by any of the known spellings, and the prompt is
// [BOS] PREFIX prompt SUFFIX suffix MIDDLE.
#include "colibri/server/fim.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace colibri::server {
namespace {

using nlohmann::json;
using tokenizer::TokenId;

// A tiny BPE over "a", "b", "ab" with the given added tokens from id 10 on; `bos` adds a BOS post-processor.
tokenizer::Tokenizer tiny(const std::vector<std::string>& added, bool bos) {
  json j = json::parse(R"({"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
      "post_processor": null, "decoder": null,
      "model": {"type": "BPE", "unk_token": null, "vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3}, "merges": ["a b"]}})");
  for (std::size_t i = 0; i < added.size(); ++i) {
    j["added_tokens"].push_back({{"id", 10 + i},
                                 {"content", added[i]},
                                 {"special", true},
                                 {"normalized", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"single_word", false}});
    j["model"]["vocab"][added[i]] = 10 + i;
  }
  if (bos) {
    j["added_tokens"].push_back({{"id", 3},
                                 {"content", "<s>"},
                                 {"special", true},
                                 {"normalized", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"single_word", false}});
    j["post_processor"] = json::parse(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>",
        "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}})");
  }
  auto tok = tokenizer::Tokenizer::from_json(j.dump(), "tiny.json");
  EXPECT_TRUE(tok.has_value()) << (tok ? "" : tok.error().message());
  return *tok;
}

TEST(Fim, QwenSpellingPrefixSuffixMiddle) {
  const auto tok = tiny({"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, false);
  const auto fim = find_fim_tokens(tok);
  ASSERT_TRUE(fim.has_value());
  EXPECT_EQ((std::vector<TokenId>{fim->prefix, fim->suffix, fim->middle}), (std::vector<TokenId>{10, 11, 12}));
  EXPECT_EQ(fim_prompt(tok, *fim, "ab", "ba"), (std::vector<TokenId>{10, 2, 11, 1, 0, 12}));
}

TEST(Fim, DeepseekSpellingKeepsTheBos) {
  const auto tok = tiny({"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"}, true);
  const auto fim = find_fim_tokens(tok);
  ASSERT_TRUE(fim.has_value());
  EXPECT_EQ(fim_prompt(tok, *fim, "a", ""), (std::vector<TokenId>{3, 10, 0, 11, 12}));
}

TEST(Fim, AModelWithoutAllThreeTokensHasNone) {
  EXPECT_FALSE(find_fim_tokens(tiny({}, false)).has_value());
  EXPECT_FALSE(find_fim_tokens(tiny({"<|fim_prefix|>", "<|fim_suffix|>"}, false)).has_value());
  EXPECT_FALSE(find_fim_tokens(tiny({"<|fim_prefix|>", "<fim_suffix>", "<|fim_middle|>"}, false)).has_value());
  EXPECT_NE(fim_token_names().find("<fim_prefix> <fim_suffix> <fim_middle>"), std::string::npos);
}

}  // namespace
}  // namespace colibri::server
