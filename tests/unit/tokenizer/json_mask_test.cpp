// JSON mode over real vocabularies: the token mask (first/second-byte tables, the plain-text shortcut inside strings)
// allows exactly the tokens a byte-by-byte check allows, and a random walk over allowed tokens only ever completes
// valid JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "colibri/engine/json_constraint.hpp"
#include "test_paths.hpp"

namespace colibri::tokenizer {
namespace {

using engine::JsonConstraint;
using engine::JsonTokenMask;

class JsonMaskTest : public ::testing::TestWithParam<std::string> {};

TEST_P(JsonMaskTest, MaskIsTheByteByByteCheckAndWalksEndInValidJson) {
  const Tokenizer* tok = test::shipped_tokenizer(GetParam());
  if (tok == nullptr) GTEST_SKIP() << test::missing_tokenizer_message(GetParam());
  // An ordinary token named as an end token (as a model's config may name one that is not special) is never allowed.
  const std::int64_t end_token = 1000;
  ASSERT_FALSE(tok->is_special(static_cast<TokenId>(end_token)));
  const JsonTokenMask mask(*tok, tok->vocab_size(), std::span(&end_token, 1));
  std::vector<std::uint8_t> allowed;
  std::vector<std::string> bytes_of(tok->vocab_size());
  for (std::size_t id = 0; id < bytes_of.size(); ++id) {
    const auto t = static_cast<TokenId>(id);
    if (!tok->is_special(t) && static_cast<std::int64_t>(id) != end_token) {
      bytes_of[id] = tok->token_bytes(t).value_or("");
    }
  }
  for (const std::string prefix :
       {"", "{", "{\"na", "{\"name\"", "{\"a\": ", "{\"a\": [1, 2", "{\"a\": -0.5e", "{\"a\": \"x\\", "{\"a\": \"\\u00",
        "{\"a\": tr", "{\"a\": {\"b\": []}", "{\"a\": \"\xE6\xA8"}) {
    JsonConstraint json;
    ASSERT_TRUE(json.advance(prefix)) << prefix;
    mask.allowed(json, allowed);
    ASSERT_EQ(allowed.size(), tok->vocab_size());
    std::size_t n = 0;
    for (std::size_t id = 0; id < allowed.size(); ++id) {
      const std::string& bytes = bytes_of[id];
      const bool want = !bytes.empty() && json.accepts(bytes);
      ASSERT_EQ(allowed[id] != 0, want) << GetParam() << ": prefix " << prefix << ", token " << id << " "
                                        << nlohmann::json(bytes).dump(-1, ' ', false,
                                                                      nlohmann::json::error_handler_t::replace);
      n += want;
    }
    EXPECT_GT(n, 0u) << prefix;
  }

  std::mt19937 rng(7);
  int completed = 0;
  for (int walk = 0; walk < 12; ++walk) {
    JsonConstraint json;
    std::string text;
    for (int step = 0; step < 120 && !json.complete(); ++step) {
      mask.allowed(json, allowed);
      std::vector<TokenId> options;
      for (std::size_t id = 0; id < allowed.size(); ++id) {
        if (allowed[id]) options.push_back(static_cast<TokenId>(id));
      }
      ASSERT_FALSE(options.empty()) << text;
      // Short tokens late in the walk close strings and brackets sooner.
      TokenId pick = options[rng() % options.size()];
      if (step > 20) {
        for (int tries = 0; tries < 20 && mask.bytes(pick).size() > 1; ++tries) pick = options[rng() % options.size()];
      }
      ASSERT_TRUE(json.advance(mask.bytes(pick)));
      text += mask.bytes(pick);
    }
    if (!json.complete()) continue;
    ++completed;
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << text;
  }
  EXPECT_GT(completed, 0);
}

// JSON mode on a thinking model (Qwen3's "<think>" and "</think>" are added tokens, not special): the block is free
// text before the JSON, whether the answer opens it or the prompt did.
TEST(JsonAnswerTest, AThinkingBlockComesBeforeTheJson) {
  const Tokenizer* tok = test::shipped_tokenizer("qwen3");
  if (tok == nullptr) GTEST_SKIP() << test::missing_tokenizer_message("qwen3");
  const std::int64_t im_end = tok->encode("<|im_end|>").at(0);
  const JsonTokenMask mask(*tok, tok->vocab_size(), std::span(&im_end, 1));
  const auto one = [&](std::string_view text) {
    const auto ids = tok->encode(text);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids.at(0);
  };
  const TokenId think = one("<think>"), unthink = one("</think>"), brace = one("{"), lt = one("<"), word = one("Hello");
  const TokenId blank = one("\n\n");
  std::vector<std::uint8_t> allowed;
  const auto push_text = [&](engine::JsonAnswer& answer, std::string_view text) {
    for (const TokenId id : tok->encode(text)) {
      answer.allowed(mask, allowed);
      ASSERT_TRUE(allowed.at(static_cast<std::size_t>(id))) << text << ": token " << id;
      answer.push(mask, id);
    }
  };

  // Without thinking, the JSON starts at once: no tag, no blank lines first.
  engine::JsonAnswer plain;
  plain.allowed(mask, allowed);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(brace)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(think)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(blank)]);

  // The answer may open the block (in one token, or spelled out) or start the JSON.
  engine::JsonAnswer opens(nullptr, engine::JsonAnswer::Thinking::may_open);
  opens.allowed(mask, allowed);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(brace)]);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(think)]);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(lt)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(word)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(unthink)]);
  opens.push(mask, think);
  EXPECT_TRUE(opens.thinking());
  // Inside: anything but the end token.
  opens.allowed(mask, allowed);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(word)]);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(unthink)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(im_end)]);
  push_text(opens, "\nThe user wants {JSON}.\n");
  EXPECT_TRUE(opens.thinking());
  opens.push(mask, unthink);
  EXPECT_FALSE(opens.thinking());
  // After the block: blank lines, then the object; the tag and words are no JSON.
  opens.allowed(mask, allowed);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(blank)]);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(brace)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(think)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(word)]);
  push_text(opens, "\n\n{\"a\": [1, \"</think>\"]}");
  EXPECT_TRUE(opens.complete());

  // Spelled out byte by byte, the tag opens the block too; once begun, the JSON is no longer allowed.
  engine::JsonAnswer spelled(nullptr, engine::JsonAnswer::Thinking::may_open);
  spelled.push(mask, lt);
  spelled.allowed(mask, allowed);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(brace)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(think)]);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(one("think"))]);
  spelled.push(mask, one("think"));
  spelled.push(mask, one(">"));
  EXPECT_TRUE(spelled.thinking());
  push_text(spelled, "ok</");
  push_text(spelled, "think");
  EXPECT_TRUE(spelled.thinking());
  spelled.push(mask, one(">"));
  EXPECT_FALSE(spelled.thinking());
  push_text(spelled, "{}");
  EXPECT_TRUE(spelled.complete());

  // Starting with the JSON closes the door on the tag.
  engine::JsonAnswer direct(nullptr, engine::JsonAnswer::Thinking::may_open);
  direct.push(mask, brace);
  EXPECT_FALSE(direct.thinking());
  direct.allowed(mask, allowed);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(lt)]);

  // Opened by the prompt: free until "</think>".
  engine::JsonAnswer inside(nullptr, engine::JsonAnswer::Thinking::inside);
  inside.allowed(mask, allowed);
  EXPECT_TRUE(allowed[static_cast<std::size_t>(word)]);
  EXPECT_FALSE(allowed[static_cast<std::size_t>(im_end)]);
  push_text(inside, "Hmm.");
  inside.push(mask, unthink);
  push_text(inside, "{}");
  EXPECT_TRUE(inside.complete());
}

INSTANTIATE_TEST_SUITE_P(Shipped, JsonMaskTest, ::testing::Values("qwen3", "mixtral"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace colibri::tokenizer
