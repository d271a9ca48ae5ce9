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

INSTANTIATE_TEST_SUITE_P(Shipped, JsonMaskTest, ::testing::Values("qwen3", "mixtral"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace colibri::tokenizer
