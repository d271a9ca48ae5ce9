// tiktoken.model + tokenizer_config.json -> an equivalent HuggingFace tokenizer.json (see tiktoken.hpp).
#include "colibri/tokenizer/tiktoken.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <vector>

#include "tokenizer/pipeline.hpp"

namespace colibri::tokenizer {

using nlohmann::json;
using sdk::Status;
using sdk::StatusCode;

namespace {

// tiktoken's own regex syntax (Rust's): `&&` intersects classes, as in Oniguruma's, which colibri's Split runs.
constexpr std::string_view kKimiRegex =
    "[\\p{Han}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Hunyuan-A13B's (PAT_STR of tokenization_hy.py): Qwen 2's, one digit at a time.
constexpr std::string_view kHunyuanRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// The special tokens Hunyuan's code puts after the ranks, in order (SPECIAL_TOKENS of tokenization_hy.py).
std::vector<std::string> hunyuan_specials() {
  std::vector<std::string> v = {"<|endoftext|>", "<|startoftext|>", "<|bos|>", "<|eos|>", "<|pad|>"};
  for (int i = 0; i < 205; ++i) v.push_back("<|extra_" + std::to_string(i) + "|>");
  return v;
}

// The tokenizer code of each family colibri knows, with text its pattern has and another family's would not.
struct Family {
  const char* name;
  std::array<const char*, 2> code;  // the module tokenizer_config.json's auto_map names
  std::array<const char*, 2> pattern_text;
  const char* vocab_file;  // the ranks' file, as the code's VOCAB_FILES_NAMES names it
  std::string_view regex;
  // Hunyuan's loader numbers the tokens by line, a repeated one skipped, whatever rank the line writes; tiktoken's
  // (Kimi's) takes the written ranks.
  bool ranks_by_line;
  bool nfc;  // Hunyuan's tokenize() composes the text (NFC) before tiktoken splits it
  std::vector<std::string> (*fixed_specials)();  // the specials' names after the ranks; null: Kimi's reserved ones
};
const Family kFamilies[] = {
    {"kimi",
     {"tokenization_kimi", "tokenization_moonshot"},
     {"[\\p{Han}]+", "&&[^\\p{Han}]]*"},
     "tiktoken.model",
     kKimiRegex,
     false,
     false,
     nullptr},
    {"hunyuan",
     {"tokenization_hy", "tokenization_hy"},
     {"\\p{L}+|\\p{N}| ?", "(?i:'s|'t|'re|'ve|'m|'ll|'d)"},
     "hy.tiktoken",
     kHunyuanRegex,
     true,
     true,
     hunyuan_specials},
};
constexpr std::size_t kDefaultReservedSpecials = 256;  // num_reserved_special_tokens of Kimi's code

// RFC 4648 base64 (with padding), as tiktoken's files hold tokens. nullopt for anything else. By hand: the project's
// libraries offer it only inside Boost.Beast's detail namespace.
std::optional<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    if (pad == 1 && in[i + 2] == '=') return std::nullopt;  // "x=y=": padding only at the end
    std::uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      const int d = j >= 4 - pad ? 0 : value(in[i + j]);
      if (d < 0) return std::nullopt;
      v = v << 6 | static_cast<std::uint32_t>(d);
    }
    out.push_back(static_cast<char>(v >> 16 & 0xFF));
    if (pad < 2) out.push_back(static_cast<char>(v >> 8 & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xFF));
  }
  return out;
}

struct ViewHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Ranks = std::unordered_map<std::string, std::size_t, ViewHash, std::equal_to<>>;

// The pieces tiktoken's BPE leaves a token's bytes in when it may only use merges ranked below the token itself: two
// for a token some merge makes (the merge it is), else more.
std::vector<std::string_view> bpe_below(const Ranks& ranks, std::string_view token, std::size_t max_rank) {
  std::vector<std::string_view> parts;
  for (std::size_t i = 0; i < token.size(); ++i) parts.push_back(token.substr(i, 1));
  while (parts.size() > 1) {
    std::size_t best = 0, best_rank = max_rank;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const std::string_view both(parts[i].data(), parts[i].size() + parts[i + 1].size());
      if (auto it = ranks.find(both); it != ranks.end() && it->second < best_rank) {
        best = i;
        best_rank = it->second;
      }
    }
    if (best_rank == max_rank) break;
    parts[best] = std::string_view(parts[best].data(), parts[best].size() + parts[best + 1].size());
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return parts;
}

std::string byte_level(std::string_view bytes) {
  const auto& chars = detail::byte_level_chars();
  std::string out;
  for (const char b : bytes) out += chars[static_cast<unsigned char>(b)];
  return out;
}

// N of the first "name = N" in Python source (spaces around '='; N of 1 to 6 digits, not followed by another).
std::optional<std::size_t> assigned_count(std::string_view source, std::string_view name) {
  const auto space = [&](std::size_t i) { return i < source.size() && (source[i] == ' ' || source[i] == '\t'); };
  const auto digit = [&](std::size_t i) { return i < source.size() && source[i] >= '0' && source[i] <= '9'; };
  for (std::size_t at = source.find(name); at != std::string_view::npos; at = source.find(name, at + 1)) {
    std::size_t i = at + name.size();
    while (space(i)) ++i;
    if (i >= source.size() || source[i] != '=') continue;
    ++i;
    while (space(i)) ++i;
    std::size_t n = 0, digits = 0;
    for (; digit(i) && digits < 7; ++i, ++digits) n = n * 10 + static_cast<std::size_t>(source[i] - '0');
    if (digits >= 1 && digits <= 6) return n;
  }
  return std::nullopt;
}

// The module that auto_map's AutoTokenizer names ("tokenization_kimi" of "tokenization_kimi.TikTokenTokenizer").
std::optional<std::string> tokenizer_code(const json& config) {
  const auto map = config.find("auto_map");
  if (map == config.end() || !map->is_object()) return std::nullopt;
  const auto auto_tok = map->find("AutoTokenizer");
  if (auto_tok == map->end()) return std::nullopt;
  std::string ref;
  if (auto_tok->is_string()) {
    ref = auto_tok->get<std::string>();
  } else if (auto_tok->is_array() && !auto_tok->empty() && (*auto_tok)[0].is_string()) {
    ref = (*auto_tok)[0].get<std::string>();
  } else {
    return std::nullopt;
  }
  if (const auto sep = ref.find("--"); sep != std::string::npos) ref = ref.substr(sep + 2);  // "repo--module.Class"
  return ref.substr(0, ref.find('.'));
}

}  // namespace

std::string_view kimi_split_regex() noexcept {
  return kKimiRegex;
}

std::string_view hunyuan_split_regex() noexcept {
  return kHunyuanRegex;
}

bool is_tiktoken_vocab_name(const std::filesystem::path& file) {
  return std::any_of(std::begin(kFamilies), std::end(kFamilies),
                     [&](const Family& f) { return file.filename() == f.vocab_file; });
}

std::optional<std::filesystem::path> find_tiktoken_vocab(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const Family& f : kFamilies) {
    if (std::filesystem::exists(dir / f.vocab_file, ec)) return dir / f.vocab_file;
  }
  return std::nullopt;
}

sdk::Expected<TiktokenImport> import_tiktoken(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::string config_file = config_path.string();
  std::error_code ec;
  if (!std::filesystem::exists(config_path, ec)) {
    const auto vocab = find_tiktoken_vocab(dir);
    return Status(StatusCode::not_found, "no tokenizer_config.json beside " +
                                             (vocab ? vocab->string() : (dir / "tiktoken.model").string()) +
                                             "; a tiktoken tokenizer needs it (its special tokens, and the tokenizer "
                                             "code whose split pattern colibri must know); put the checkpoint's own "
                                             "there");
  }
  Status status;
  const std::string config_text = detail::read_file(config_path, status, /*named=*/false);
  if (!status) return status;
  const json config = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return Status(StatusCode::invalid_argument, config_file + " is not a JSON object; put the checkpoint's own there");
  }

  // Which split pattern: the tokenizer code's family, and its pattern text where the code is there to read.
  TiktokenImport out;
  const auto code = tokenizer_code(config);
  const Family* family = nullptr;
  for (const Family& f : kFamilies) {
    if (code && std::find(f.code.begin(), f.code.end(), *code) != f.code.end()) family = &f;
  }
  if (family == nullptr) {
    return Status(StatusCode::unsupported,
                  config_file + ": key 'auto_map': " +
                      (code ? "tokenizer code '" + *code + "'" : std::string("no AutoTokenizer code named")) +
                      "; a tiktoken tokenizer's split pattern lives in that Python code, which colibri does not run, "
                      "and colibri knows Kimi K2's and Moonlight's (tokenization_kimi.py, tokenization_moonshot.py) "
                      "and Hunyuan-A13B's (tokenization_hy.py). "
                      "For another, save a tokenizer.json with transformers (AutoTokenizer.from_pretrained(dir, "
                      "trust_remote_code=True).save_pretrained(dir)) where it can, and convert again");
  }
  out.family = family->name;
  out.code = *code;
  out.file = family->vocab_file;
  const std::filesystem::path model_path = dir / family->vocab_file;
  const std::string model_file = model_path.string();
  if (!std::filesystem::exists(model_path, ec)) {
    return Status(StatusCode::not_found, "no " + std::string(family->vocab_file) + " in " + dir.string() + ", which " +
                                             config_file + " (tokenizer code " + *code +
                                             ") reads its tokens from; put the checkpoint's own there");
  }
  std::size_t reserved = kDefaultReservedSpecials;
  if (const auto py = dir / (*code + ".py"); std::filesystem::exists(py, ec)) {
    const std::string source = detail::read_file(py, status, /*named=*/false);
    if (!status) return status;
    for (const char* text : family->pattern_text) {
      if (source.find(text) == std::string::npos) {
        return Status(StatusCode::unsupported,
                      py.string() + ": its pat_str differs from the " + family->name +
                          " split pattern colibri knows (no '" + text +
                          "'); tokens would be split differently. Save a tokenizer.json with transformers and "
                          "convert again");
      }
    }
    if (const auto n = assigned_count(source, "num_reserved_special_tokens")) reserved = *n;
  }

  // "<base64 token> <rank>" per line (tiktoken's load_tiktoken_bpe skips empty lines; Hunyuan's loader numbers them).
  const std::string text = detail::read_file(model_path, status, /*named=*/false);
  if (!status) return status;
  std::vector<std::string> tokens;  // by rank
  std::vector<bool> seen_rank;
  Ranks ranks;
  std::size_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t eol = std::min(text.find('\n', at), text.size());
    std::string_view line(text.data() + at, eol - at);
    at = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const auto bad = [&](const std::string& what) {
      return Status(StatusCode::corrupt_data, model_file + ": line " + std::to_string(line_no) + ": " + what +
                                                  "; the file is damaged or not a tiktoken vocabulary");
    };
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return bad("expected '<base64 token> <rank>'");
    }
    auto bytes = base64_decode(line.substr(0, space));
    if (!bytes) return bad("'" + std::string(line.substr(0, space)) + "' is not base64");
    std::size_t rank = 0;
    if (family->ranks_by_line) {
      if (ranks.contains(*bytes)) continue;  // as its loader: the first line of a token counts
      rank = ranks.size();
      if (rank >= (std::size_t{1} << 24)) return bad("more than 2^24 tokens");
    } else {
      const std::string_view rank_text = line.substr(space + 1);
      const auto [end, err] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
      if (err != std::errc() || end != rank_text.data() + rank_text.size() || rank >= (std::size_t{1} << 24)) {
        return bad("rank '" + std::string(rank_text) + "' is not a whole number below 2^24");
      }
    }
    if (rank >= seen_rank.size()) {
      seen_rank.resize(rank + 1, false);
      tokens.resize(rank + 1);
    }
    if (seen_rank[rank]) return bad("rank " + std::to_string(rank) + " is given twice");
    if (!ranks.emplace(*bytes, rank).second)
      return bad("token '" + std::string(line.substr(0, space)) + "' is given twice");
    seen_rank[rank] = true;
    tokens[rank] = std::move(*bytes);
  }
  if (tokens.empty()) return Status(StatusCode::corrupt_data, model_file + " holds no tokens");
  if (const auto gap = std::find(seen_rank.begin(), seen_rank.end(), false); gap != seen_rank.end()) {
    return Status(StatusCode::corrupt_data, model_file + ": no token has rank " +
                                                std::to_string(gap - seen_rank.begin()) + " of 0.." +
                                                std::to_string(tokens.size() - 1) +
                                                "; the special tokens' ids start after the ranks, so they must "
                                                "all be there; the file is damaged");
  }
  for (int b = 0; b < 256; ++b) {
    if (!ranks.contains(std::string(1, static_cast<char>(b)))) {
      return Status(StatusCode::corrupt_data, model_file + ": no token for the byte " + std::to_string(b) +
                                                  ", so some text could not be encoded; the file is damaged");
    }
  }
  out.ranks = tokens.size();

  json vocab = json::object();
  json merges = json::array();
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    vocab[byte_level(tokens[r])] = r;
    if (tokens[r].size() < 2) continue;
    const auto parts = bpe_below(ranks, tokens[r], r);
    if (parts.size() == 2) merges.push_back(byte_level(parts[0]) + " " + byte_level(parts[1]));
  }
  out.merges = merges.size();

  // Special tokens: ids ranks.. ranks + reserved - 1, named by added_tokens_decoder, else by the code (Hunyuan's fixed
  // list, Kimi's "<|reserved_token_ID|>"); an entry past them is an added token as transformers adds it, one among the
  // ranks a damaged config.
  const std::vector<std::string> fixed = family->fixed_specials ? family->fixed_specials() : std::vector<std::string>{};
  if (family->fixed_specials) reserved = fixed.size();
  std::unordered_map<std::size_t, json> named;
  if (const auto dec = config.find("added_tokens_decoder"); dec != config.end()) {
    if (!dec->is_object()) {
      return Status(StatusCode::invalid_argument, config_file + ": key 'added_tokens_decoder' is not an object");
    }
    for (const auto& [key, entry] : dec->items()) {
      std::size_t id = 0;
      const auto [end, err] = std::from_chars(key.data(), key.data() + key.size(), id);
      const auto content = entry.is_object() ? entry.find("content") : entry.end();
      if (err != std::errc() || end != key.data() + key.size() || content == entry.end() || !content->is_string()) {
        return Status(StatusCode::invalid_argument, config_file + ": key 'added_tokens_decoder." + key +
                                                        "': expected an id with a \"content\" string");
      }
      if (id < tokens.size()) {
        return Status(StatusCode::invalid_argument, config_file + ": key 'added_tokens_decoder." + key + "': id " +
                                                        key + " is a token of " + model_file + " (ranks 0.." +
                                                        std::to_string(tokens.size() - 1) +
                                                        "); the two files belong to different tokenizers");
      }
      named[id] = entry;
    }
  }
  json added = json::array();
  std::size_t last = tokens.size() + reserved;
  for (const auto& entry : named) last = std::max(last, entry.first + 1);
  for (std::size_t id = tokens.size(); id < last; ++id) {
    const auto it = named.find(id);
    const bool reserved_id = id < tokens.size() + reserved;
    if (it == named.end() && !reserved_id) continue;
    const json& e = it != named.end() ? it->second : json::object();
    const std::string content = it != named.end() ? e.at("content").get<std::string>()
                                : !fixed.empty()  ? fixed[id - tokens.size()]
                                                  : "<|reserved_token_" + std::to_string(id) + "|>";
    auto flag = [&](const char* key, bool fallback) {
      const auto f = e.find(key);
      return f != e.end() && f->is_boolean() ? f->get<bool>() : fallback;
    };
    // tiktoken matches its special tokens anywhere, as they are: no stripping, not normalized.
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", reserved_id ? false : flag("lstrip", false)},
                     {"rstrip", reserved_id ? false : flag("rstrip", false)},
                     {"normalized", false},
                     {"special", reserved_id || flag("special", true)}});
  }
  out.specials = added.size();

  json tok = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", std::move(added)},
              {"normalizer", family->nfc ? json{{"type", "NFC"}} : json()},
              {"pre_tokenizer", detail::split_then_byte_level_json(family->regex)},
              {"post_processor", nullptr},
              {"decoder", detail::byte_level_json(false)},
              {"model", detail::byte_level_bpe_json(std::move(vocab), std::move(merges), /*ignore_merges=*/true)}};
  out.tokenizer_json = tok.dump();
  return out;
}

}  // namespace colibri::tokenizer
