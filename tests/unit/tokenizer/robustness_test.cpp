// Bad input gets clear errors; invalid UTF-8, long inputs and streaming behave as documented.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "colibri/tokenizer/tokenizer.hpp"
#include "tokenizer/utf8.hpp"
#include "unit/tokenizer/test_paths.hpp"

namespace colibri::tokenizer {
namespace {

using nlohmann::json;

// A tiny SentencePiece-style BPE: merges by rank, unknown characters fused into one <unk>.
json tiny_bpe() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [{"id": 7, "content": "<s>", "special": true, "normalized": false,
      "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": null, "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]}}},
    "decoder": null,
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
      "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3, "c": 4, "abc": 5, "bc": 6, "<s>": 7},
      "merges": ["b c", "a b", "ab c"]}
  })");
}

Tokenizer load(const json& j) {
  auto tok = Tokenizer::from_json(j.dump(), "tiny.json");
  EXPECT_TRUE(tok.has_value()) << tok.error().to_string();
  return *tok;
}

std::string error_of(const json& j) {
  auto tok = Tokenizer::from_json(j.dump(), "bad.json");
  EXPECT_FALSE(tok.has_value());
  return tok ? "" : tok.error().message();
}

TEST(TinyBpe, MergesByRankAndFusesUnknowns) {
  Tokenizer tok = load(tiny_bpe());
  // (b,c) has the best rank, so "abc" becomes a + bc, never ab + c.
  EXPECT_EQ(tok.encode("abc"), (std::vector<TokenId>{0, 6}));
  EXPECT_EQ(tok.encode("abxxc"), (std::vector<TokenId>{2, 3, 4}));
  EXPECT_EQ(tok.encode("ab", true), (std::vector<TokenId>{7, 2}));
  EXPECT_EQ(tok.encode("ab<s>ab"), (std::vector<TokenId>{2, 7, 2}));
  EXPECT_EQ(tok.bos_id(), 7);
  EXPECT_TRUE(tok.is_special(7));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{7, 2, 6}, true), "ab bc");  // no decoder: pieces joined by spaces
}

// Found by fuzzing (tests/fuzz/fuzz_tokenizer_json.cpp): with a gap in the vocabulary's ids (or a piece written
// twice), the added tokens' ids started at the piece count and took an id of the vocabulary's, and vocab_size() was
// below the ids encode() returned. Added tokens now start after the highest id.
TEST(TinyBpe, AddedTokensStartAfterTheHighestIdWhereTheVocabularyHasGaps) {
  json j = tiny_bpe();
  j["model"]["vocab"] = {{"a", 0}, {"b", 1}, {"ab", 2}, {"<unk>", 3}, {"c", 4}, {"abc", 5}, {"bc", 9}};  // 6-8 unused
  j["added_tokens"][0]["id"] = 10;
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {10};
  Tokenizer tok = load(j);
  EXPECT_EQ(tok.vocab_size(), 11U);
  EXPECT_EQ(tok.encode("<s>bc"), (std::vector<TokenId>{10, 9}));
  for (const TokenId id : tok.encode("ab<s>abc", true)) EXPECT_LT(static_cast<std::size_t>(id), tok.vocab_size());
  EXPECT_EQ(tok.decode(std::vector<TokenId>{10, 9}), "<s> bc");
}

// Found by fuzzing: a template's special token ids went into every prompt unchecked.
TEST(TinyBpe, TemplateIdsOutsideTheVocabularyAreRefused) {
  json j = tiny_bpe();
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {70};
  EXPECT_NE(error_of(j).find("post_processor': special token id 70 is outside the vocabulary (ids 0..7)"),
            std::string::npos);
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {-1};
  EXPECT_NE(error_of(j).find("special_tokens.<s>.ids"), std::string::npos);
}

TEST(TinyBpe, IgnoreMergesTakesWholeWordFromVocab) {
  json j = tiny_bpe();
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j).encode("abc"), (std::vector<TokenId>{5}));
}

TEST(BadInput, MalformedJson) {
  auto tok = Tokenizer::from_json("{\"model\": [1, 2", "broken.json");
  ASSERT_FALSE(tok.has_value());
  EXPECT_NE(tok.error().message().find("broken.json"), std::string::npos);
  EXPECT_NE(tok.error().message().find("not valid JSON"), std::string::npos);
  // A number past a double is nlohmann's out_of_range, not its parse_error (found by fuzzing: it escaped, uncaught).
  auto huge = Tokenizer::from_json("{\"model\": {\"dropout\": 1e400}}", "huge.json");
  ASSERT_FALSE(huge.has_value());
  EXPECT_NE(huge.error().message().find("huge.json: not valid JSON"), std::string::npos) << huge.error().message();
}

TEST(BadInput, UnknownModelType) {
  json j = tiny_bpe();
  j["model"]["type"] = "Unigram";
  const std::string e = error_of(j);
  EXPECT_NE(e.find("Unigram"), std::string::npos) << e;
  EXPECT_NE(e.find("model.type"), std::string::npos) << e;
}

TEST(BadInput, MissingModelAndVocab) {
  json j = tiny_bpe();
  j.erase("model");
  EXPECT_NE(error_of(j).find("model"), std::string::npos);
  j = tiny_bpe();
  j["model"].erase("vocab");
  EXPECT_NE(error_of(j).find("model.vocab"), std::string::npos);
}

TEST(BadInput, MergeOutsideVocabulary) {
  json j = tiny_bpe();
  j["model"]["merges"].push_back("c zz");
  const std::string e = error_of(j);
  EXPECT_NE(e.find("model.merges[3]"), std::string::npos) << e;
  EXPECT_NE(e.find("zz"), std::string::npos) << e;
}

TEST(BadInput, HugeVocabularyIdIsRefusedNotAllocated) {
  for (const std::int64_t id : {std::int64_t{2147483647}, std::int64_t{1} << 24}) {
    json j = tiny_bpe();
    j["model"]["vocab"]["zz"] = id;
    const std::string e = error_of(j);
    EXPECT_NE(e.find("model.vocab[\"zz\"]"), std::string::npos) << e;
    EXPECT_NE(e.find(std::to_string(id)), std::string::npos) << e;
  }
  json j = tiny_bpe();
  j["model"]["vocab"]["zz"] = (std::int64_t{1} << 24) - 1;  // the largest id taken
  EXPECT_TRUE(Tokenizer::from_json(j.dump(), "tiny.json").has_value());
}

TEST(BadInput, UnsupportedComponentsAndBadRegex) {
  json j = tiny_bpe();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_NE(error_of(j).find("BertPreTokenizer"), std::string::npos);
  j = tiny_bpe();
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  EXPECT_NE(error_of(j).find("Precompiled"), std::string::npos);
  j = tiny_bpe();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  const std::string e = error_of(j);
  EXPECT_NE(e.find("pre_tokenizer.pattern"), std::string::npos) << e;
  j = tiny_bpe();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(error_of(j).find("WordPiece"), std::string::npos);
  j = tiny_bpe();
  j["added_tokens"][0]["content"] = 5;
  EXPECT_NE(error_of(j).find("added_tokens[0]"), std::string::npos);
}

TEST(BadInput, GgufFileGivenAsTokenizerIsNamed) {
  const auto path = std::filesystem::temp_directory_path() / ("colibri-tok-" + std::to_string(::getpid()) + ".gguf");
  {
    std::ofstream f(path, std::ios::binary);
    f.write("GGUF\x03\x00\x00\x00", 8);
  }
  auto tok = Tokenizer::from_file(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(tok.has_value());
  EXPECT_NE(tok.error().message().find("is a GGUF file, not a tokenizer.json"), std::string::npos)
      << tok.error().message();
}

TEST(BadInput, MissingFile) {
  auto tok = Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(tok.has_value());
  EXPECT_EQ(tok.error().code(), sdk::StatusCode::not_found);
  EXPECT_NE(tok.error().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(Utf8, LossyConversionFollowsMaximalSubparts) {
  EXPECT_EQ(utf8::to_valid_lossy("a\xFF"
                                 "b"),
            "a\xEF\xBF\xBD"
            "b");
  // A truncated 3-byte sequence is one replacement character, then the next byte stands alone.
  EXPECT_EQ(utf8::to_valid_lossy("\xE4\xBD"
                                 "x"),
            "\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(utf8::to_valid_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8::to_valid_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_TRUE(utf8::ends_with_incomplete_sequence("ab\xE4\xBD"));
  EXPECT_FALSE(utf8::ends_with_incomplete_sequence("ab\xE4\xBD\xA0"));
  EXPECT_FALSE(utf8::ends_with_incomplete_sequence("ab\xFF"));
}

void InvalidUtf8IsEncodedAsReplacementCharacter(const Tokenizer* tok) {
  EXPECT_EQ(tok->encode("caf\xC3 ok \xFF\xFE end \xE4\xBD"),
            tok->encode("caf\xEF\xBF\xBD ok \xEF\xBF\xBD\xEF\xBF\xBD end \xEF\xBF\xBD"));
}

void LongLinesRoundTrip(const Tokenizer* tok) {
  // 100 KB without a single space (one BPE word for SentencePiece-style models), then 100 KB of mixed text.
  std::string word;
  while (word.size() < 100000) word += "antidisestablishmentarianism";
  const auto ids = tok->encode(word);
  EXPECT_LT(ids.size(), word.size() / 2);
  EXPECT_EQ(tok->decode(ids), word);
  std::string mixed;
  while (mixed.size() < 100000) mixed += "Hello 世界 1234567 \t\t  x\r\n ";
  EXPECT_EQ(tok->decode(tok->encode(mixed)), mixed);
}

void StreamingReleasesWholeCharacters(const Tokenizer* tok) {
  // Rare characters fall back to bytes (SentencePiece) or split across byte-level tokens.
  const std::string text = "Hi 𓀀𓀁 ꙮ 🧑🏿‍💻 é 你好 \xF0\x9F\x9C\x81 end";
  const auto ids = tok->encode(text);
  StreamDecoder stream(*tok);
  std::string joined;
  int empty_chunks = 0;
  for (TokenId id : ids) {
    const std::string chunk = stream.push(id);
    EXPECT_TRUE(utf8::is_valid(chunk)) << "chunk splits a character";
    EXPECT_EQ(chunk.find("\xEF\xBF\xBD"), std::string::npos) << "partial character leaked as U+FFFD";
    if (chunk.empty()) ++empty_chunks;
    joined += chunk;
  }
  joined += stream.flush();
  EXPECT_EQ(joined, tok->decode(ids));
  EXPECT_GT(empty_chunks, 0) << "some token should have been held back until its character completed";
}

void StreamingFlushReleasesAnUnfinishedCharacter(const Tokenizer* tok) {
  const auto ids = tok->encode("𓀀");
  StreamDecoder stream(*tok);
  std::string out;
  for (std::size_t i = 0; i + 1 < ids.size(); ++i) out += stream.push(ids[i]);
  out += stream.flush();
  std::vector<TokenId> partial(ids.begin(), ids.end() - 1);
  EXPECT_EQ(out, tok->decode(partial));
}

// One test per tokenizer (ctest runs each test in its own process; loading the large files is the slow part).
class ShippedTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(ShippedTokenizer, Utf8LongLinesAndStreaming) {
  const Tokenizer* tok = test::shipped_tokenizer(GetParam());
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message(GetParam());
  {
    SCOPED_TRACE("invalid UTF-8 is encoded as U+FFFD");
    InvalidUtf8IsEncodedAsReplacementCharacter(tok);
  }
  {
    SCOPED_TRACE("100 KB lines round-trip");
    LongLinesRoundTrip(tok);
  }
  {
    SCOPED_TRACE("streaming releases whole characters");
    StreamingReleasesWholeCharacters(tok);
  }
  {
    SCOPED_TRACE("flush releases an unfinished character");
    StreamingFlushReleasesAnUnfinishedCharacter(tok);
  }
}

INSTANTIATE_TEST_SUITE_P(All, ShippedTokenizer,
                         ::testing::Values("mixtral", "llama2", "mistral_nemo", "qwen3", "llama3", "deepseek_v3",
                                           "gptoss"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace colibri::tokenizer

namespace colibri::tokenizer {
namespace {

// One Tokenizer shared by threads (the engine and server do this): same ids as a single thread.
TEST(Concurrency, SharedTokenizerEncodesIdentically) {
  const Tokenizer* tok = test::shipped_tokenizer("qwen3");
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message("qwen3");
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("line " + std::to_string(i * 7919) + ": Hello 世界 don't " +
                    std::string(static_cast<std::size_t>(i % 9), ' ') + "x");
  }
  std::vector<std::vector<TokenId>> expected;
  for (const auto& t : texts) expected.push_back(tok->encode(t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (std::size_t i = 0; i < texts.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(t) * 31) % texts.size();
          if (tok->encode(texts[k]) != expected[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace colibri::tokenizer

namespace colibri::tokenizer {
namespace {

// Pushes `ids` one at a time, as generation does: each chunk, what they join to with the flush, and whether any
// text came out before the last token.
struct Streamed {
  std::vector<std::string> chunks;
  std::string joined;
  bool released_before_end = false;
};
Streamed stream_ids(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  StreamDecoder stream(tok);
  Streamed out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    out.chunks.push_back(stream.push(ids[i]));
    if (!out.chunks.back().empty() && i + 1 < ids.size()) out.released_before_end = true;
    out.joined += out.chunks.back();
  }
  out.joined += stream.flush();
  return out;
}

// Genuinely invalid bytes (a model can emit them) are released as U+FFFD after a few tokens instead of stalling,
// and nothing is lost when a character completes afterwards.
TEST(Streaming, InvalidBytesDoNotStallOrLoseText) {
  const Tokenizer* tok = test::shipped_tokenizer("mixtral");
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message("mixtral");
  std::vector<TokenId> ids;
  for (const char* piece : {"<0xFF>", "<0xFF>", "<0xFF>", "<0xFF>", "<0xFF>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}) {
    auto id = tok->piece_to_token(piece);
    ASSERT_TRUE(id.has_value()) << piece;
    ids.push_back(*id);
  }
  ids.push_back(*tok->piece_to_token("▁ok"));
  const auto [chunks, joined, released_before_end] = stream_ids(*tok, ids);
  for (const auto& chunk : chunks) EXPECT_TRUE(utf8::is_valid(chunk));
  EXPECT_TRUE(released_before_end);
  EXPECT_NE(joined.find("ok"), std::string::npos);
  EXPECT_EQ(joined, tok->decode(ids));
}

// Byte-level tokens that each end inside a character (deepseek_v3 has merges such as "\x94\xd7": the end of one
// Hebrew letter and the start of the next), more of them in a row than a character has bytes: the text before the
// unfinished letter goes out as it becomes final, and no U+FFFD is made up (before, a fifth pending token forced the
// unfinished letter out as U+FFFD, which stayed in the answer once the letter was complete).
TEST(Streaming, ALongRunOfTokensSplittingCharactersReleasesTextNotReplacements) {
  const Tokenizer* tok = test::shipped_tokenizer("deepseek_v3");
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message("deepseek_v3");
  auto by_bytes = [&](std::string_view bytes) -> TokenId {
    for (std::size_t id = 0; id < tok->vocab_size(); ++id) {
      if (tok->token_bytes(static_cast<TokenId>(id)) == std::string(bytes)) return static_cast<TokenId>(id);
    }
    ADD_FAILURE() << "no token for those bytes";
    return 0;
  };
  std::vector<TokenId> ids{by_bytes("\xd7")};
  for (int i = 0; i < 8; ++i) ids.push_back(by_bytes("\x94\xd7"));  // each ends inside the next letter
  ids.push_back(by_bytes("\x94"));
  const auto [chunks, joined, released_before_end] = stream_ids(*tok, ids);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_TRUE(utf8::is_valid(chunks[i]));
    EXPECT_EQ(chunks[i].find("\xEF\xBF\xBD"), std::string::npos) << "token " << i << " released a made-up U+FFFD";
  }
  EXPECT_TRUE(released_before_end) << "a long run is released as it becomes final, not all at the end";
  EXPECT_EQ(joined, tok->decode(ids));
  std::string nine_he;
  for (int i = 0; i < 9; ++i) nine_he += "\xd7\x94";
  EXPECT_EQ(joined, nine_he);
}

// Found by fuzzing (tests/fuzz/fuzz_tokenizer_encode.cpp): U+FFFD written as a token of its own (what invalid UTF-8
// in a prompt becomes) was held back as if it were an unfinished character, until a fifth pending token forced
// out the byte token of a real unfinished one as an extra U+FFFD. What is held back is now judged by the bytes.
TEST(Streaming, AReplacementCharacterTokenIsTextNotAnUnfinishedCharacter) {
  const Tokenizer* tok = test::shipped_tokenizer("mixtral");
  if (!tok) GTEST_SKIP() << test::missing_tokenizer_message("mixtral");
  const auto replacement = tok->piece_to_token("\xEF\xBF\xBD");
  ASSERT_TRUE(replacement.has_value());
  std::vector<TokenId> ids(4, *replacement);
  for (const char* piece : {"<0xEF>", "<0xBC>", "<0xA3>"}) ids.push_back(*tok->piece_to_token(piece));  // U+FF23
  StreamDecoder stream(*tok);
  std::string joined;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = stream.push(ids[i]);
    if (i < 4) {
      EXPECT_EQ(chunk, "\xEF\xBF\xBD") << "a U+FFFD token goes out at once";
    } else if (i < 6) {
      EXPECT_EQ(chunk, "") << "the first bytes of U+FF23 wait";
    } else {
      EXPECT_EQ(chunk, "\xEF\xBC\xA3");
    }
    joined += chunk;
  }
  joined += stream.flush();
  EXPECT_EQ(joined, tok->decode(ids));
}

}  // namespace
}  // namespace colibri::tokenizer
