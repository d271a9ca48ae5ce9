#include "colibri/model/gguf_tokenizer.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "colibri/tokenizer/tiktoken.hpp"
#include "tokenizer/pipeline.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::model {

using nlohmann::json;
using sdk::Status;
using sdk::StatusCode;

namespace {

// GGUF token types (llama.cpp's llama_token_type).
constexpr std::int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5;

// Pre-tokenizer split regexes of the tokenizer.ggml.pre names we know (from the matching tokenizer.json files).
const char* kGpt2Regex = nullptr;  // ByteLevel's built-in GPT-2 regex
const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// Ling 2.0's (inclusionAI's Bailing tokenizer.json as llama.cpp quotes it, possessive quantifiers and all, which
// Oniguruma runs as written; llama.cpp's std::regex cannot and drops them).
const char* kBailingRegex =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|"
    "\\s+";

// Mistral's tekken (Mistral Nemo) and OpenAI's o200k (gpt-oss, llama.cpp's "gpt-4o").
const char* kTekkenRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?["
    "\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kGpt4oRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|"
    "'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'"
    "m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek V3 splits three times: digit runs, CJK runs, then words and punctuation.
const char* const kDeepseekV3Regexes[] = {
    "\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
     "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")};

// UTF-8 code point boundaries of s (python string indices, which HF's converter splits on).
std::vector<std::size_t> char_boundaries(const std::string& s) {
  std::vector<std::size_t> b;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) b.push_back(i);
  }
  b.push_back(s.size());
  return b;
}

// Names the first string of `v` that is not UTF-8 (tokenizer.json cannot hold it), e.g. tokenizer.ggml.tokens[5].
Status check_utf8(const std::vector<std::string>& v, const std::string& key, const std::string& where,
                  bool indexed = true) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!tokenizer::utf8::is_valid(v[i])) {
      return Status(StatusCode::corrupt_data, where + ": " + key + (indexed ? "[" + std::to_string(i) + "]" : "") +
                                                  " is not valid UTF-8, so no tokenizer.json can hold it; the "
                                                  "GGUF's vocabulary is damaged, re-export it");
    }
  }
  return {};
}

// Token -> id, looked up by string_view so that candidate splits of a piece need no copies.
struct ViewHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIds = std::unordered_map<std::string, std::int64_t, ViewHash, std::equal_to<>>;

}  // namespace

sdk::Expected<RebuiltTokenizer> rebuild_tokenizer_from_gguf(const GgufFile& g) {
  const std::string where = g.path().string();
  auto model = g.get_string("tokenizer.ggml.model");
  if (!model) return Status(StatusCode::not_found, where + ": no tokenizer.ggml.model; the GGUF carries no tokenizer");
  const GgufValue* tokens_v = g.find("tokenizer.ggml.tokens");
  if (tokens_v == nullptr || !std::holds_alternative<std::vector<std::string>>(tokens_v->v)) {
    return Status(StatusCode::corrupt_data, where + ": tokenizer.ggml.tokens is missing or not a string array");
  }
  const auto& tokens = std::get<std::vector<std::string>>(tokens_v->v);
  if (auto s = check_utf8(tokens, "tokenizer.ggml.tokens", where); !s) return s;
  std::vector<std::int64_t> types(tokens.size(), kNormal);
  if (const auto* tv = g.find("tokenizer.ggml.token_type")) {
    if (!std::holds_alternative<std::vector<std::int64_t>>(tv->v) || tv->array_size() != tokens.size()) {
      return Status(StatusCode::corrupt_data,
                    where + ": tokenizer.ggml.token_type must be an integer array as long as the tokens");
    }
    types = std::get<std::vector<std::int64_t>>(tv->v);
  }
  RebuiltTokenizer out;
  out.model = *model;
  json vocab = json::object();
  TokenIds ids;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (ids.emplace(tokens[i], static_cast<std::int64_t>(i)).second) vocab[tokens[i]] = i;
  }
  json added = json::array();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto t = types[i];
    if (t == kControl || t == kUnknown || t == kUserDefined) {
      added.push_back({{"id", i},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", t == kUserDefined},
                       {"special", t != kUserDefined}});
    }
  }
  json tok = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  auto token_text = [&](const char* key) -> json {
    auto id = g.get_int(key);
    if (!id || *id < 0 || static_cast<std::size_t>(*id) >= tokens.size()) return nullptr;
    return tokens[static_cast<std::size_t>(*id)];
  };

  if (*model == "gpt2") {
    const GgufValue* mv = g.find("tokenizer.ggml.merges");
    if (mv == nullptr || !std::holds_alternative<std::vector<std::string>>(mv->v)) {
      return Status(StatusCode::corrupt_data, where + ": a gpt2 tokenizer needs tokenizer.ggml.merges (string array)");
    }
    const auto& merges = std::get<std::vector<std::string>>(mv->v);
    if (auto s = check_utf8(merges, "tokenizer.ggml.merges", where); !s) return s;
    const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("default");
    if (auto s = check_utf8({pre}, "tokenizer.ggml.pre", where, false); !s) return s;
    json pre_tok;
    json normalizer = nullptr;
    bool ignore_merges = false;
    if (pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre == "olmo" || pre == "gpt-neox") {
      pre_tok = tokenizer::detail::byte_level_json(true, true);
    } else if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe" || pre == "glm4" ||
               pre == "chatglm-bpe") {
      // GLM-4 / 4.5's tokenizer.json splits with Llama 3's regex (llama.cpp's CHATGLM4 pre-tokenizer is the same).
      pre_tok = tokenizer::detail::split_then_byte_level_json(kLlama3Regex);
      // Llama 3's tokenizer.json takes a piece that is a whole token whole (588 of its tokens no merge makes: " việc",
      // " jeho", "lardan"), as llama.cpp does for these names; not for the others of this branch, as llama.cpp.
      ignore_merges = pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3";
    } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
      pre_tok = tokenizer::detail::split_then_byte_level_json(kQwen2Regex);
      normalizer = {{"type", "NFC"}};  // Qwen's tokenizer.json composes text first; the GGUF does not say so
    } else if (pre == "hunyuan") {
      // Hunyuan-A13B's tiktoken code: its pattern (Qwen 2's) over NFC-composed text, tiktoken's whole-token shortcut.
      pre_tok = tokenizer::detail::split_then_byte_level_json(tokenizer::hunyuan_split_regex());
      normalizer = {{"type", "NFC"}};
      ignore_merges = true;
    } else if (pre == "bailingmoe" || pre == "bailingmoe2" || pre == "llada-moe") {
      pre_tok = tokenizer::detail::split_then_byte_level_json(kBailingRegex);
    } else if (pre == "solar-open") {
      // Qwen 2's split (llama.cpp's SOLAR_OPEN shares its regex); no normalizer, as llama.cpp reads it.
      pre_tok = tokenizer::detail::split_then_byte_level_json(kQwen2Regex);
    } else if (pre == "tekken") {
      pre_tok = tokenizer::detail::split_then_byte_level_json(kTekkenRegex);
      ignore_merges = true;  // as Mistral Nemo's tokenizer.json and llama.cpp
    } else if (pre == "gpt-4o" || pre == "llama4" || pre == "minimax-m2") {
      // MiniMax-M2's tokenizer.json splits as GPT-4o's; Llama 4's tiktoken pattern is o200k's (llama.cpp: GPT4O).
      pre_tok = tokenizer::detail::split_then_byte_level_json(kGpt4oRegex);
      // As gpt-oss's tokenizer.json (o200k has no token that merges cannot make) and tiktoken, Llama 4's origin.
      ignore_merges = pre == "gpt-4o" || pre == "llama4";
    } else if (pre == "kimi-k2") {
      // Kimi K2 and Moonlight: their tiktoken code's pattern, and tiktoken's whole-token shortcut, as import_tiktoken.
      pre_tok = tokenizer::detail::split_then_byte_level_json(tokenizer::kimi_split_regex());
      ignore_merges = true;
    } else if (pre == "deepseek-v3") {
      json steps = json::array();
      for (const char* r : kDeepseekV3Regexes) {
        steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", r}}}, {"behavior", "Isolated"}, {"invert", false}});
      }
      steps.push_back(tokenizer::detail::byte_level_json(false));
      pre_tok = {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
    } else {
      pre_tok = tokenizer::detail::byte_level_json(true, true);
      out.notes.push_back("pre-tokenizer '" + pre +
                          "' is not known to colibri; GPT-2's split regex is used, which "
                          "may split some text differently from the original tokenizer");
    }
    (void)kGpt2Regex;
    tok["normalizer"] = normalizer;
    tok["pre_tokenizer"] = pre_tok;
    tok["decoder"] = tokenizer::detail::byte_level_json(true, true);
    tok["model"] = tokenizer::detail::byte_level_bpe_json(std::move(vocab), merges, ignore_merges);
  } else if (*model == "llama") {
    const GgufValue* sv = g.find("tokenizer.ggml.scores");
    if (sv == nullptr || !std::holds_alternative<std::vector<double>>(sv->v) || sv->array_size() != tokens.size()) {
      return Status(StatusCode::corrupt_data, where +
                                                  ": a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores "
                                                  "as long as the tokens");
    }
    const auto& scores = std::get<std::vector<double>>(sv->v);
    // Merges from scores, as HF's SentencePieceExtractor: every split of a piece into two pieces, ordered by the
    // merged piece's score (highest first), ties by vocabulary order.
    struct Merge {
      std::int64_t left, right;
      double score;
    };
    std::vector<Merge> merges;
    // A split can only match when both halves have the length of some token: testing that first keeps a very
    // long piece linear in its length instead of hashing a prefix at every one of its characters.
    std::size_t max_len = 0;
    for (const auto& t : tokens) max_len = std::max(max_len, t.size());
    std::vector<bool> is_token_length(max_len + 1, false);
    for (const auto& t : tokens) is_token_length[t.size()] = true;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::string_view piece = tokens[i];
      auto bounds = char_boundaries(tokens[i]);
      std::vector<Merge> local;
      for (std::size_t k = 1; k + 1 < bounds.size(); ++k) {
        if (!is_token_length[bounds[k]] || !is_token_length[piece.size() - bounds[k]]) continue;
        auto l = ids.find(piece.substr(0, bounds[k]));
        if (l == ids.end()) continue;
        auto r = ids.find(piece.substr(bounds[k]));
        if (r != ids.end()) local.push_back({l->second, r->second, scores[i]});
      }
      std::sort(local.begin(), local.end(),
                [](const Merge& a, const Merge& b) { return std::tie(a.left, a.right) < std::tie(b.left, b.right); });
      merges.insert(merges.end(), local.begin(), local.end());
    }
    std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
    json merges_j = json::array();
    for (const auto& mg : merges) {
      merges_j.push_back(
          json::array({tokens[static_cast<std::size_t>(mg.left)], tokens[static_cast<std::size_t>(mg.right)]}));
    }
    const bool add_space = g.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    json normalizers = json::array();
    if (add_space) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    tok["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    tok["pre_tokenizer"] = nullptr;
    json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                 {{"type", "ByteFallback"}},
                                 {{"type", "Fuse"}}});
    if (add_space) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tok["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
    json unk = token_text("tokenizer.ggml.unknown_token_id");
    tok["model"] = {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", unk},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", true},
                    {"byte_fallback", true},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", merges_j}};
  } else {
    return Status(StatusCode::unsupported, where + ": tokenizer model '" + *model +
                                               "' cannot be rebuilt; supported: gpt2 (byte-level BPE), llama "
                                               "(SentencePiece BPE)");
  }
  (void)kUnused;
  // BOS/EOS as the GGUF asks (SentencePiece models add BOS unless told not to, as llama.cpp has it), in the
  // tokenizer's own post-processor: encoding with special tokens reads only that, never tokenizer_config.json.
  const bool add_bos = g.get_bool("tokenizer.ggml.add_bos_token").value_or(*model == "llama");
  const bool add_eos = g.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  json specials = json::object();
  // The token's text, registered as a special token of the template (nullopt: not added).
  auto special = [&](const char* key, bool wanted) -> std::optional<std::string> {
    if (!wanted) return std::nullopt;
    const json text = token_text(key);
    if (text.is_null()) {
      out.notes.push_back(std::string("the GGUF asks for its ") + key + " to be added, but names no such token");
      return std::nullopt;
    }
    specials[text.get<std::string>()] = {
        {"id", text}, {"ids", json::array({*g.get_int(key)})}, {"tokens", json::array({text})}};
    return text.get<std::string>();
  };
  const auto bos = special("tokenizer.ggml.bos_token_id", add_bos);
  const auto eos = special("tokenizer.ggml.eos_token_id", add_eos);
  auto part = [&](const char* sequence, int type_id) {  // [BOS] $sequence [EOS]
    json pieces = json::array();
    if (bos) pieces.push_back({{"SpecialToken", {{"id", *bos}, {"type_id", type_id}}}});
    pieces.push_back({{"Sequence", {{"id", sequence}, {"type_id", type_id}}}});
    if (eos) pieces.push_back({{"SpecialToken", {{"id", *eos}, {"type_id", type_id}}}});
    return pieces;
  };
  json pair = part("A", 0);
  for (auto& piece : part("B", 1)) pair.push_back(std::move(piece));
  tok["post_processor"] =
      specials.empty()
          ? json(nullptr)
          : json{
                {"type", "TemplateProcessing"}, {"single", part("A", 0)}, {"pair", pair}, {"special_tokens", specials}};
  try {
    out.tokenizer_json = tok.dump();
  } catch (const json::exception&) {  // every string was checked above; this is the last line of defence
    return Status(StatusCode::corrupt_data, where + ": the tokenizer holds text that is not valid UTF-8");
  }
  json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", token_text("tokenizer.ggml.bos_token_id")},
              {"eos_token", token_text("tokenizer.ggml.eos_token_id")},
              {"unk_token", token_text("tokenizer.ggml.unknown_token_id")},
              {"pad_token", token_text("tokenizer.ggml.padding_token_id")},
              {"add_bos_token", g.get_bool("tokenizer.ggml.add_bos_token").value_or(*model == "llama")},
              {"add_eos_token", g.get_bool("tokenizer.ggml.add_eos_token").value_or(false)},
              {"clean_up_tokenization_spaces", false}};
  if (auto ct = g.get_string("tokenizer.chat_template")) {
    if (auto s = check_utf8({*ct}, "tokenizer.chat_template", where, false); !s) return s;
    cfg["chat_template"] = *ct;
  }
  if (auto ctx = g.get_int(g.get_string("general.architecture").value_or("") + ".context_length")) {
    cfg["model_max_length"] = *ctx;
  }
  try {
    out.tokenizer_config_json = cfg.dump(2);
  } catch (const json::exception&) {
    return Status(StatusCode::corrupt_data, where + ": the tokenizer config holds text that is not valid UTF-8");
  }
  return out;
}

}  // namespace colibri::model
