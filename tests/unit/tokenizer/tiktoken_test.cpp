// tiktoken tokenizers without a tokenizer.json (Kimi K2's and Hunyuan-A13B's layouts): the rebuilt tokenizer encodes as
// their code does on a small vocabulary worked by hand, and bad files are refused naming the file, line or key.
// tests/js/tiktoken_check.mjs compares it with tiktoken itself on 200k ranks.
#include "colibri/tokenizer/tiktoken.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<TokenId>;

std::string base64(const std::string& bytes) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    out += kChars[v >> 18 & 63];
    out += kChars[v >> 12 & 63];
    out += i + 1 < bytes.size() ? kChars[v >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? kChars[v & 63] : '=';
  }
  return out;
}

// The 256 bytes at ranks 0..255, then "ab", "abc", "cd", "xyz" (no merge makes it: only tiktoken's whole-piece
// shortcut gives it), and 中 (e4 b8 ad) through its first two bytes.
std::vector<std::string> small_ranks() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, static_cast<char>(b));
  for (const char* s : {"ab", "abc", "cd", "xyz", "\xe4\xb8", "\xe4\xb8\xad"}) t.emplace_back(s);
  return t;
}

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name) : path(fs::temp_directory_path() / ("colibri-tiktoken-" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  void ranks(const std::vector<std::string>& tokens) const {
    std::string text;
    for (std::size_t r = 0; r < tokens.size(); ++r) text += base64(tokens[r]) + " " + std::to_string(r) + "\n";
    write("tiktoken.model", text);
  }
  // Kimi's tokenizer_config.json: auto_map's code, two named special tokens (ids 262 and 264 after small_ranks).
  void config(const std::string& code = "tokenization_kimi") const {
    const json special = {{"lstrip", false}, {"normalized", false}, {"rstrip", false}, {"special", true}};
    json decoder = {{"262", special}, {"264", special}};
    decoder["262"]["content"] = "[BOS]";
    decoder["264"]["content"] = "<|im_end|>";
    write("tokenizer_config.json", json{{"added_tokens_decoder", decoder},
                                        {"auto_map", {{"AutoTokenizer", {code + ".TikTokenTokenizer", nullptr}}}},
                                        {"bos_token", "[BOS]"},
                                        {"eos_token", "<|im_end|>"},
                                        {"tokenizer_class", "TikTokenTokenizer"}}
                                       .dump());
  }
  // Kimi's tokenizer code as far as colibri reads it: the pattern's text, and 4 reserved special tokens.
  void code(const std::string& name = "tokenization_kimi", bool kimi_pattern = true) const {
    write(name + ".py", std::string("class TikTokenTokenizer:\n    num_reserved_special_tokens = 4\n    pat_str = "
                                    "\"|\".join([r\"\"\"") +
                            (kimi_pattern ? "[\\p{Han}]+\"\"\", r\"\"\"[\\p{Lu}\\p{M}&&[^\\p{Han}]]*"
                                          : "\\p{L}+\"\"\", r\"\"\"\\p{N}") +
                            "\"\"\"])\n");
  }
};

Tokenizer load(const Dir& d) {
  auto tok = Tokenizer::from_file(d.path);
  EXPECT_TRUE(tok.has_value()) << tok.error().to_string();
  return *tok;
}

std::string error_of(const Dir& d) {
  auto r = import_tiktoken(d.path);
  EXPECT_FALSE(r.has_value());
  return r ? "" : r.error().message();
}

TEST(Tiktoken, EncodesAsTiktokenMergesByRank) {
  Dir d("encode");
  d.ranks(small_ranks());
  d.config();
  d.code();
  auto imported = import_tiktoken(d.path);
  ASSERT_TRUE(imported.has_value()) << imported.error().to_string();
  EXPECT_EQ(imported->family, "kimi");
  EXPECT_EQ(imported->ranks, 262u);
  // "ab" = a + b, "abc" = ab + c, "cd" = c + d, e4b8 = e4 + b8, 中 = e4b8 + ad; "xyz" has no merge.
  EXPECT_EQ(imported->merges, 5u);
  EXPECT_EQ(imported->specials, 4u);  // num_reserved_special_tokens = 4 in the code

  Tokenizer tok = load(d);
  // a,b,c,d: ab (rank 256) first, then abc (257) beats cd (258), which then has no c.
  EXPECT_EQ(tok.encode("abcd"), (Ids{257, 'd'}));
  EXPECT_EQ(tok.encode("bcd"), (Ids{'b', 258}));
  // A piece that is a whole token is that token, merges or not (tiktoken's shortcut); with more, its bytes.
  EXPECT_EQ(tok.encode("xyz"), (Ids{259}));
  EXPECT_EQ(tok.encode("xyzz"), (Ids{'x', 'y', 'z', 'z'}));
  // Han runs are pieces of their own; 中 through e4b8.
  EXPECT_EQ(tok.encode("ab中"), (Ids{256, 261}));
  EXPECT_EQ(tok.encode("中文"), (Ids{261, 0xe6, 0x96, 0x87}));
  EXPECT_EQ(tok.decode(Ids{261, 0xe6, 0x96, 0x87}), "中文");
}

TEST(Tiktoken, SpecialTokensFollowTheRanksNamedOrReserved) {
  Dir d("specials");
  d.ranks(small_ranks());
  d.config();
  d.code();
  Tokenizer tok = load(d);
  EXPECT_EQ(tok.vocab_size(), 266u);  // 262 ranks + 4 reserved
  EXPECT_EQ(tok.piece_to_token("[BOS]"), 262);
  EXPECT_EQ(tok.piece_to_token("<|reserved_token_263|>"), 263);
  EXPECT_EQ(tok.piece_to_token("<|im_end|>"), 264);
  EXPECT_EQ(tok.piece_to_token("<|reserved_token_265|>"), 265);
  EXPECT_TRUE(tok.is_special(263));
  // Matched anywhere in the text, as tiktoken's allowed_special="all" (Kimi's encode) matches them.
  EXPECT_EQ(tok.encode("ab<|im_end|>cd"), (Ids{256, 264, 258}));
  EXPECT_EQ(tok.decode(Ids{256, 264, 258}), "ab<|im_end|>cd");
  EXPECT_EQ(tok.decode(Ids{256, 264, 258}, true), "abcd");
  EXPECT_EQ(tok.bos_id(), 262);
  EXPECT_EQ(tok.eos_id(), 264);
  EXPECT_EQ(tok.encode("ab", true), (Ids{256}));  // Kimi's code adds no BOS of its own
}

TEST(Tiktoken, WithoutItsCodeTheReservedCountIsKimis) {
  Dir d("no-code");
  d.ranks(small_ranks());
  d.config("tokenization_moonshot");  // Moonlight's code name: the same family
  auto imported = import_tiktoken(d.path);
  ASSERT_TRUE(imported.has_value()) << imported.error().to_string();
  EXPECT_EQ(imported->code, "tokenization_moonshot");
  EXPECT_EQ(imported->specials, 256u);
  EXPECT_EQ(load(d).vocab_size(), 262u + 256u);
}

TEST(Tiktoken, UnknownCodeOrAnotherPatternIsRefusedByName) {
  {
    Dir d("unknown-code");
    d.ranks(small_ranks());
    d.config("tokenization_other");
    const std::string e = error_of(d);
    EXPECT_NE(e.find("tokenizer_config.json: key 'auto_map': tokenizer code 'tokenization_other'"), std::string::npos)
        << e;
    EXPECT_NE(e.find("save_pretrained"), std::string::npos) << e;
  }
  {
    Dir d("other-pattern");
    d.ranks(small_ranks());
    d.config();
    d.code("tokenization_kimi", /*kimi_pattern=*/false);
    const std::string e = error_of(d);
    EXPECT_NE(e.find("tokenization_kimi.py: its pat_str differs"), std::string::npos) << e;
  }
  {
    Dir d("no-config");
    d.ranks(small_ranks());
    const std::string e = error_of(d);
    EXPECT_NE(e.find("no tokenizer_config.json beside"), std::string::npos) << e;
  }
}

TEST(Tiktoken, DamagedVocabularyIsRefusedNamingTheLine) {
  const auto error_for = [](const std::string& model_text) {
    Dir d("damaged");
    d.config();
    d.write("tiktoken.model", model_text);
    return error_of(d);
  };
  std::string good;
  for (int b = 0; b < 256; ++b) good += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  EXPECT_NE(error_for(good + "YWI= 256 7\n").find("tiktoken.model: line 257: expected '<base64 token> <rank>'"),
            std::string::npos);
  EXPECT_NE(error_for(good + "Y!I= 256\n").find("line 257: 'Y!I=' is not base64"), std::string::npos);
  EXPECT_NE(error_for(good + "YWI 256\n").find("line 257: 'YWI' is not base64"), std::string::npos);
  EXPECT_NE(error_for(good + "YWI= x\n").find("line 257: rank 'x' is not a whole number"), std::string::npos);
  EXPECT_NE(error_for(good + "YWI= 255\n").find("line 257: rank 255 is given twice"), std::string::npos);
  EXPECT_NE(error_for(good + "YQ== 256\n").find("line 257: token 'YQ==' is given twice"), std::string::npos);
  EXPECT_NE(error_for(good + "YWI= 300\n").find("no token has rank 256 of 0..300"), std::string::npos);
  std::string no_zero = good;
  no_zero.replace(0, no_zero.find('\n'), base64("zz") + " 0");  // every rank, but no token for the byte 0
  EXPECT_NE(error_for(no_zero).find("no token for the byte 0"), std::string::npos);
  EXPECT_NE(error_for("").find("holds no tokens"), std::string::npos);
}

TEST(Tiktoken, SpecialTokenAmongTheRanksIsRefused) {
  Dir d("special-among-ranks");
  d.ranks(small_ranks());
  d.write("tokenizer_config.json",
          R"({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]},
              "added_tokens_decoder": {"100": {"content": "[BOS]", "special": true}}})");
  const std::string e = error_of(d);
  EXPECT_NE(e.find("key 'added_tokens_decoder.100': id 100 is a token of"), std::string::npos) << e;
}

// Hunyuan-A13B's layout: hy.tiktoken (tokens numbered by line, a repeat skipped, the written rank not read),
// tokenizer_config.json naming tokenization_hy, no added_tokens_decoder: its code's 210 special tokens follow the
// ranks.
void hunyuan_files(const Dir& d, bool code = true, bool hunyuan_pattern = true) {
  std::string text;
  const auto t = small_ranks();
  for (std::size_t i = 0; i < t.size(); ++i) {
    text += base64(t[i]) + " " + std::to_string(i == 5 ? 99999 : i) + "\n";  // rank 99999: not read
    if (i == 300 % t.size()) text += base64(t[i]) + " 7\n";                  // a repeat: skipped
  }
  d.write("hy.tiktoken", text);
  d.write("tokenizer_config.json",
          json{{"auto_map", {{"AutoTokenizer", {"tokenization_hy.HYTokenizer", nullptr}}}},
               {"eos_token", "<|eos|>"},
               {"pad_token", "<|pad|>"},
               {"additional_special_tokens", {"<|startoftext|>", "<|extra_0|>", "<|extra_4|>", "<|eos|>"}},
               {"tokenizer_class", "HYTokenizer"}}
              .dump());
  if (code) {
    d.write("tokenization_hy.py",
            std::string("VOCAB_FILES_NAMES = {\"vocab_file\": \"hy.tiktoken\"}\n\nPAT_STR = r\"\"\"") +
                (hunyuan_pattern ? R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+)"
                                 : R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L})") +
                "\"\"\"\n");
  }
}

TEST(Tiktoken, HunyuanNumbersByLineComposesAndNamesItsSpecials) {
  Dir d("hunyuan");
  hunyuan_files(d);
  auto imported = import_tiktoken(d.path);
  ASSERT_TRUE(imported.has_value()) << imported.error().to_string();
  EXPECT_EQ(imported->family, "hunyuan");
  EXPECT_EQ(imported->code, "tokenization_hy");
  EXPECT_EQ(imported->file, "hy.tiktoken");
  EXPECT_EQ(imported->ranks, 262u);  // the repeat is not a token
  EXPECT_EQ(imported->specials, 210u);
  Tokenizer tok = load(d);  // found by its directory: hy.tiktoken
  EXPECT_EQ(tok.vocab_size(), 262u + 210u);
  EXPECT_EQ(tok.piece_to_token("<|endoftext|>"), 262);
  EXPECT_EQ(tok.piece_to_token("<|startoftext|>"), 263);
  EXPECT_EQ(tok.piece_to_token("<|eos|>"), 265);
  EXPECT_EQ(tok.piece_to_token("<|extra_0|>"), 267);
  EXPECT_EQ(tok.piece_to_token("<|extra_204|>"), 471);
  EXPECT_EQ(tok.eos_id(), 265);
  EXPECT_EQ(tok.encode("ab", true), (Ids{256}));  // no BOS of its own
  // Its pattern: digits one at a time, letters in one piece; a whole-token piece whole; text composed (NFC) first.
  EXPECT_EQ(tok.encode("ab12"), (Ids{256, '1', '2'}));
  EXPECT_EQ(tok.encode("xyz"), (Ids{259}));
  EXPECT_EQ(tok.encode("e\xcc\x81"), (Ids{0xc3, 0xa9}));
  EXPECT_EQ(tok.encode("<|startoftext|>ab<|extra_0|>"), (Ids{263, 256, 267}));
  EXPECT_EQ(tok.decode(Ids{263, 256, 267}, true), "ab");
  // The same from tokenize --tokenizer FILE.
  auto by_file = Tokenizer::from_file(d.path / "hy.tiktoken");
  ASSERT_TRUE(by_file.has_value()) << by_file.error().to_string();
  EXPECT_EQ(by_file->encode("ab12"), (Ids{256, '1', '2'}));
}

TEST(Tiktoken, HunyuanWithAnotherPatternOrNoVocabularyIsRefusedByName) {
  {
    Dir d("hunyuan-other-pattern");
    hunyuan_files(d, true, /*hunyuan_pattern=*/false);
    const std::string e = error_of(d);
    EXPECT_NE(e.find("tokenization_hy.py: its pat_str differs from the hunyuan split pattern"), std::string::npos) << e;
  }
  {
    Dir d("hunyuan-no-vocab");
    hunyuan_files(d, false);
    fs::remove(d.path / "hy.tiktoken");
    d.ranks(small_ranks());  // Kimi's file name: not the one Hunyuan's code reads
    const std::string e = error_of(d);
    EXPECT_NE(e.find("no hy.tiktoken in"), std::string::npos) << e;
    EXPECT_NE(e.find("(tokenizer code tokenization_hy)"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace colibri::tokenizer
