// Token-for-token equality with the HuggingFace tokenizers library: the golden files under tests/data/tokenizer/golden
// were produced by tests/js/tokenizer_reference.mjs (HF tokenizers 0.22 native binding) over corpus.jsonl.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "colibri/tokenizer/tokenizer.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace colibri::tokenizer {
namespace {

using nlohmann::json;

std::vector<std::string> read_corpus() {
  std::vector<std::string> out;
  std::istringstream in(test::read_text(test::source_dir() / "tests/data/tokenizer/corpus.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line).get<std::string>());
  }
  return out;
}

std::vector<json> read_golden(const std::string& name) {
  std::vector<json> out;
  std::istringstream in(test::read_text(test::source_dir() / "tests/data/tokenizer/golden" / (name + ".jsonl")));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

json variant_spec(const std::string& name) {
  const json all = json::parse(test::read_text(test::source_dir() / "tests/data/tokenizer/variants.json"));
  for (const auto& v : all["variants"]) {
    if (v["name"] == name) return v;
  }
  return nullptr;
}

// Same transformation as applyVariant() in tests/js/tokenizer_common.mjs.
std::string apply_variant(const json& base, const json& v) {
  json tok = base;
  if (v.contains("set")) {
    for (auto it = v["set"].begin(); it != v["set"].end(); ++it) tok[it.key()] = it.value();
  }
  if (v.contains("update_added")) {
    for (auto it = v["update_added"].begin(); it != v["update_added"].end(); ++it) {
      for (auto& t : tok["added_tokens"]) {
        if (t["content"] == it.key()) t.update(it.value());
      }
    }
  }
  if (v.contains("append_added")) {
    for (const auto& t : v["append_added"]) tok["added_tokens"].push_back(t);
  }
  return tok.dump();
}

std::vector<TokenId> to_ids(const json& j) {
  return j.get<std::vector<TokenId>>();
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::optional<Tokenizer> load() {
    const std::string name = GetParam();
    const json variant = variant_spec(name);
    const std::string base = variant.is_null() ? name : variant["base"].get<std::string>();
    const auto dir = test::tokenizer_dir(base);
    if (!dir) return std::nullopt;
    if (variant.is_null()) {
      const Tokenizer* tok = test::shipped_tokenizer(name);
      EXPECT_NE(tok, nullptr) << name << " failed to load";
      if (!tok) return std::nullopt;
      return *tok;
    }
    const std::string text = apply_variant(json::parse(test::read_text(*dir / "tokenizer.json")), variant);
    auto tok = Tokenizer::from_json(text, name);
    EXPECT_TRUE(tok.has_value()) << tok.error().to_string();
    if (!tok) return std::nullopt;
    return *tok;
  }
};

TEST_P(GoldenTest, EncodeDecodeMatchHuggingFace) {
  auto tok = load();
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message(GetParam());
  const auto corpus = read_corpus();
  const auto golden = read_golden(GetParam());
  ASSERT_EQ(corpus.size(), golden.size()) << "regenerate with: node tests/js/tokenizer_reference.mjs";
  int mismatches = 0;
  for (std::size_t i = 0; i < corpus.size() && mismatches < 5; ++i) {
    const auto& g = golden[i];
    const std::string shown = corpus[i].substr(0, 80);
    const auto ids = tok->encode(corpus[i], false);
    const auto ids_special = tok->encode(corpus[i], true);
    if (ids != to_ids(g["ids"])) {
      ++mismatches;
      ADD_FAILURE() << "ids differ for corpus line " << i + 1 << ": " << json(shown).dump() << "\n got      "
                    << json(ids).dump().substr(0, 400) << "\n expected " << g["ids"].dump().substr(0, 400);
    }
    // The golden files come from the tokenizers library; transformers' LlamaTokenizerFast (DeepSeek-V3's class) adds
    // the BOS its tokenizer_config.json asks for (add_bos_token) whatever tokenizer.json's post-processor says, and
    // colibri follows transformers, as vLLM and llama.cpp do.
    auto want_special = to_ids(g["ids_special"]);
    if (GetParam() == "deepseek_v3" && tok->bos_id()) want_special.insert(want_special.begin(), *tok->bos_id());
    EXPECT_EQ(ids_special, want_special) << "line " << i + 1;
    const auto ref_ids = to_ids(g["ids_special"]);
    EXPECT_EQ(tok->decode(ref_ids, false), g["decoded"].get<std::string>()) << "line " << i + 1;
    EXPECT_EQ(tok->decode(ref_ids, true), g["decoded_skip"].get<std::string>()) << "line " << i + 1;

    // Streaming gives the same text, chunk boundaries on UTF-8 characters.
    StreamDecoder stream(*tok);
    std::string streamed;
    for (TokenId id : ref_ids) {
      const std::string chunk = stream.push(id);
      const std::string_view check = chunk;
      EXPECT_FALSE(!check.empty() && (static_cast<unsigned char>(check.front()) & 0xC0) == 0x80)
          << "chunk starts inside a character, line " << i + 1;
      streamed += chunk;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, g["decoded"].get<std::string>()) << "streaming, line " << i + 1;

    // A continuation streamed after its context (a prompt) is what the whole text adds to the context's: the first
    // continued token keeps the leading space that a Strip or Metaspace decoder drops at the start of a text.
    for (const std::size_t cut : {std::size_t{1}, ref_ids.size() / 2}) {
      if (cut == 0 || cut >= ref_ids.size()) continue;
      const std::span<const TokenId> context(ref_ids.data(), cut);
      const std::string before = tok->decode(context, false);
      const std::string whole = g["decoded"].get<std::string>();
      if (whole.compare(0, before.size(), before) != 0) continue;  // the cut splits a character
      StreamDecoder continuation(*tok, false, context);
      std::string added;
      for (std::size_t k = cut; k < ref_ids.size(); ++k) added += continuation.push(ref_ids[k]);
      added += continuation.flush();
      EXPECT_EQ(before + added, whole) << "continuation after " << cut << " tokens, line " << i + 1;
    }

    // Each token's own bytes (logprobs report them) add up to the text; only a leading space a Strip or
    // Metaspace decoder drops from a whole text may differ. U+FFFD repairs of partial characters are not in them.
    const std::string decoded = g["decoded"].get<std::string>();
    if (decoded.find("\xEF\xBF\xBD") == std::string::npos) {
      std::string joined;
      for (TokenId id : ref_ids) joined += tok->token_bytes(id).value_or("<unknown id>");
      EXPECT_TRUE(joined == decoded || (!joined.empty() && joined[0] == ' ' && joined.substr(1) == decoded))
          << "token bytes, line " << i + 1 << ": " << json(joined).dump().substr(0, 200) << " vs "
          << json(decoded).dump().substr(0, 200);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Shipped, GoldenTest,
                         ::testing::Values("mixtral", "llama2", "mistral_nemo", "qwen3", "llama3", "deepseek_v3",
                                           "gptoss"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Variants, GoldenTest,
                         ::testing::Values("llama3_added_flags", "mixtral_normalized_added", "mixtral_metaspace",
                                           "qwen3_digits", "gptoss_punctuation", "llama3_split_behaviors"),
                         [](const auto& info) { return info.param; });

// The ids tokenizer.json lists for its added tokens are the ids colibri assigns.
TEST(AddedTokens, IdsMatchTheFile) {
  for (const std::string name : {"mixtral", "llama2", "mistral_nemo", "qwen3", "llama3", "deepseek_v3", "gptoss"}) {
    const auto dir = test::tokenizer_dir(name);
    if (!dir) continue;
    auto tok = Tokenizer::from_file(*dir);
    ASSERT_TRUE(tok.has_value()) << tok.error().to_string();  // the real load path, errors shown
    const json j = json::parse(test::read_text(*dir / "tokenizer.json"));
    for (const auto& t : j["added_tokens"]) {
      EXPECT_EQ(tok->piece_to_token(t["content"].get<std::string>()), t["id"].get<TokenId>()) << name;
      EXPECT_EQ(tok->is_special(t["id"].get<TokenId>()), t["special"].get<bool>()) << name;
    }
  }
}

}  // namespace
}  // namespace colibri::tokenizer
