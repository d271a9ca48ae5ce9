// Tokenizer: loads tokenizer.json and runs HF's pipeline: added tokens are split out first (non-normalized ones on
// the raw text, normalized ones after normalization), then normalizer, pre-tokenizer, BPE and post-processor.
#include "colibri/tokenizer/tokenizer.hpp"

#include <unicode/uchar.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "colibri/sdk/os_error.hpp"
#include "colibri/tokenizer/tiktoken.hpp"
#include "tokenizer/pipeline.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::tokenizer {

using detail::json;
using detail::Piece;

namespace {

struct AddedToken {
  std::string content;
  TokenId id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Byte trie over added-token contents, giving leftmost-longest matches like HF's Aho-Corasick (LeftmostLongest).
class TokenTrie {
 public:
  void insert(std::string_view pattern, std::size_t token_index) {
    if (pattern.empty()) return;
    std::size_t node = 0;
    for (char c : pattern) {
      const auto b = static_cast<unsigned char>(c);
      auto& edges = nodes_[node].edges;
      auto it =
          std::lower_bound(edges.begin(), edges.end(), b,
                           [](const std::pair<unsigned char, std::size_t>& e, unsigned char v) { return e.first < v; });
      if (it != edges.end() && it->first == b) {
        node = it->second;
      } else {
        const std::size_t child = nodes_.size();
        edges.insert(it, {b, child});
        nodes_.emplace_back();
        node = child;
      }
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<std::ptrdiff_t>(token_index);
    first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
  }
  [[nodiscard]] bool empty() const { return nodes_.size() == 1; }

  // Longest pattern starting at `pos`: returns its length and sets token_index, or 0.
  std::size_t longest_at(std::string_view text, std::size_t pos, std::size_t& token_index) const {
    if (!first_bytes_[static_cast<unsigned char>(text[pos])]) return 0;
    std::size_t node = 0;
    std::size_t best = 0;
    for (std::size_t i = pos; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      const auto& edges = nodes_[node].edges;
      auto it =
          std::lower_bound(edges.begin(), edges.end(), b,
                           [](const std::pair<unsigned char, std::size_t>& e, unsigned char v) { return e.first < v; });
      if (it == edges.end() || it->first != b) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        best = i + 1 - pos;
        token_index = static_cast<std::size_t>(nodes_[node].token);
      }
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::size_t>> edges;
    std::ptrdiff_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_bytes_{};
};

// Rust regex's Unicode \w (HF matches single_word boundaries with it): Alphabetic, marks, decimal digits,
// connector punctuation and Join_Control (so a ZWJ counts as part of a word).
bool is_word_char_at(std::string_view s, std::size_t i) {
  if (utf8::valid_sequence_length(s, i) == 0) return false;
  const auto c = static_cast<UChar32>(utf8::next_code_point(s, i));
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  const auto type = u_charType(c);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION;
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return is_word_char_at(s, i);
}

bool starts_with_word(std::string_view s) {
  return !s.empty() && is_word_char_at(s, 0);
}

bool is_space_at(std::string_view s, std::size_t i, std::size_t& len) {
  std::size_t j = i;
  const char32_t cp = utf8::next_code_point(s, j);
  len = j - i;
  // Unicode White_Space, as Rust's \s.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace

// `named`: a path the user gave, which may be a pipe (`--tokenizer <(...)`); a file found beside it must be a
// regular file, since a FIFO there would block the read until some writer came. A directory is neither.
std::string detail::read_file(const std::filesystem::path& path, sdk::Status& status, bool named) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) ||
      (!named && std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))) {
    status =
        sdk::make_error(sdk::StatusCode::invalid_argument,
                        path.string() + " is " + sdk::path_kind_text(path.string()) + ", not a file; give the file");
    return {};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    status = sdk::make_error(err == ENOENT ? sdk::StatusCode::not_found : sdk::StatusCode::io_error,
                             "cannot open " + path.string() + ": " + sdk::os_error_text(err));
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) status = sdk::make_error(sdk::StatusCode::io_error, "error reading " + path.string());
  return ss.str();
}

struct Tokenizer::Impl {
  detail::BpeModel model;
  std::unique_ptr<detail::Normalizer> normalizer;
  std::unique_ptr<detail::PreTokenizer> pre_tokenizer;
  std::unique_ptr<detail::PostProcessor> post_processor;
  std::unique_ptr<detail::Decoder> decoder;

  std::vector<AddedToken> added;  // in HF registration order
  std::unordered_map<TokenId, std::size_t> added_by_id;
  detail::Vocab added_by_content;
  std::unordered_map<std::string, bool> special_contents;
  TokenTrie raw_trie;         // normalized == false: matched on the raw input
  TokenTrie normalized_trie;  // normalized == true: matched on normalized text

  // The id space: the model's, then the added tokens' numbered after it (an added token already in the model
  // vocabulary has its id from there).
  [[nodiscard]] std::size_t vocab_size() const {
    std::size_t n = model.vocab_size();
    for (const auto& t : added) n = std::max(n, static_cast<std::size_t>(t.id) + 1);
    return n;
  }

  std::string bos_token;
  std::string eos_token;
  std::optional<TokenId> bos_id;
  std::optional<TokenId> eos_id;

  [[nodiscard]] std::optional<TokenId> token_to_id(std::string_view s) const {
    if (auto it = added_by_content.find(s); it != added_by_content.end()) return it->second;
    return model.token_to_id(s);
  }

  [[nodiscard]] const std::string* id_to_token(TokenId id) const {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added[it->second].content;
    return model.id_to_token(id);
  }

  // HF's AddedVocabulary::find_matches followed by the split: pieces of `piece` around added tokens.
  void split_added(const Piece& piece, const TokenTrie& trie, std::vector<Piece>& out) const {
    const std::string_view s = piece.text;
    if (s.empty()) return;  // HF drops empty splits at every stage
    if (trie.empty()) {
      out.push_back(piece);
      return;
    }
    std::size_t start_offset = 0;
    auto push_text = [&](std::size_t a, std::size_t b) {
      Piece p;
      p.text = std::string(s.substr(a, b - a));
      p.at_origin = piece.at_origin && a == 0;
      out.push_back(std::move(p));
    };
    std::size_t pos = 0;
    while (pos < s.size()) {
      std::size_t index = 0;
      const std::size_t len = trie.longest_at(s, pos, index);
      if (len == 0) {
        ++pos;
        continue;
      }
      const AddedToken& tok = added[index];
      std::size_t start = pos;
      std::size_t stop = pos + len;
      pos = stop;  // matching resumes after the pattern, whatever lstrip/rstrip consumed
      if (tok.single_word) {
        const bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
        const bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (tok.lstrip) {
        std::size_t new_start = start;
        while (new_start > 0) {
          std::size_t back = new_start - 1;
          while (back > 0 && (static_cast<unsigned char>(s[back]) & 0xC0) == 0x80) --back;
          std::size_t len_ws = 0;
          if (!is_space_at(s, back, len_ws)) break;
          new_start = back;
        }
        start = std::max(new_start, start_offset);
      }
      if (tok.rstrip) {
        std::size_t len_ws = 0;
        while (stop < s.size() && is_space_at(s, stop, len_ws)) stop += len_ws;
      }
      if (start_offset < start) push_text(start_offset, start);
      Piece p;
      p.text = std::string(s.substr(start, stop - start));
      p.added = tok.id;
      out.push_back(std::move(p));
      start_offset = stop;
    }
    if (start_offset != s.size()) push_text(start_offset, s.size());
  }

  void add_tokens(std::vector<AddedToken> tokens) {
    // Mirrors AddedVocabulary::add_tokens: an id comes from the vocabulary when the content is there, otherwise the
    // next one after the model vocabulary, in file order.
    auto next_id = static_cast<TokenId>(model.vocab_size());
    for (auto& t : tokens) {
      if (t.content.empty()) continue;
      if (t.special) special_contents[t.content] = true;
      std::optional<TokenId> id = token_to_id(t.content);
      if (!id) id = next_id++;
      t.id = *id;
      if (auto it = added_by_id.find(*id); it != added_by_id.end()) {
        added[it->second] = t;
      } else {
        added_by_id[*id] = added.size();
        added.push_back(t);
      }
      added_by_content[t.content] = *id;
    }
    for (std::size_t i = 0; i < added.size(); ++i) {
      if (!added[i].normalized) {
        raw_trie.insert(added[i].content, i);
      } else {
        std::string pattern = added[i].content;
        if (normalizer) normalizer->normalize(pattern);
        normalized_trie.insert(pattern, i);
      }
    }
  }

  [[nodiscard]] std::vector<TokenId> encode(std::string_view raw, bool add_special) const {
    const std::string text = utf8::to_valid_lossy(raw);
    std::vector<Piece> pieces;
    Piece whole;
    whole.text = text;
    whole.at_origin = true;
    split_added(whole, raw_trie, pieces);

    std::vector<Piece> normalized;
    normalized.reserve(pieces.size());
    for (auto& p : pieces) {
      if (p.added >= 0) {
        normalized.push_back(std::move(p));
        continue;
      }
      if (normalizer) normalizer->normalize(p.text);
      split_added(p, normalized_trie, normalized);
    }
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(normalized);

    std::vector<TokenId> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const auto& p : normalized) {
      if (p.added >= 0) {
        ids.push_back(p.added);
      } else {
        model.tokenize(p.text, ids);
      }
    }
    if (post_processor) post_processor->process(ids, add_special);
    return ids;
  }

  [[nodiscard]] std::string decode(std::span<const TokenId> ids, bool skip_special) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (TokenId id : ids) {
      const std::string* t = id_to_token(id);
      if (t == nullptr) continue;
      if (skip_special && special_contents.contains(*t)) continue;
      tokens.push_back(*t);
    }
    if (!decoder) {
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (i > 0) out.push_back(' ');
        out += tokens[i];
      }
      return out;
    }
    decoder->decode_chain(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }
};

namespace {

std::optional<std::string> config_token(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

namespace {

sdk::Expected<std::shared_ptr<Tokenizer::Impl>> parse_impl(std::string_view json_text, std::string_view source) {
  const std::string src(source);
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past a double
    return sdk::make_error(sdk::StatusCode::corrupt_data,
                           src + ": not valid JSON (" + e.what() + "); re-download or re-export tokenizer.json");
  }
  if (!root.is_object()) return sdk::make_error(sdk::StatusCode::corrupt_data, src + ": expected a JSON object");
  auto impl = std::make_shared<Tokenizer::Impl>();
  try {
    auto model = root.find("model");
    if (model == root.end()) throw detail::ParseError{"model", "missing key \"model\""};
    impl->model = detail::BpeModel::parse(*model, "model");
    if (auto n = root.find("normalizer"); n != root.end()) impl->normalizer = detail::make_normalizer(*n, "normalizer");
    if (auto p = root.find("pre_tokenizer"); p != root.end()) {
      impl->pre_tokenizer = detail::make_pre_tokenizer(*p, "pre_tokenizer");
    }
    if (auto d = root.find("decoder"); d != root.end()) impl->decoder = detail::make_decoder(*d, "decoder");

    std::vector<AddedToken> added;
    if (auto a = root.find("added_tokens"); a != root.end() && !a->is_null()) {
      if (!a->is_array()) throw detail::ParseError{"added_tokens", "expected an array"};
      for (std::size_t i = 0; i < a->size(); ++i) {
        const json& e = (*a)[i];
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        if (!e.is_object() || !e.contains("content") || !e["content"].is_string()) {
          throw detail::ParseError{where, "expected an object with a string \"content\""};
        }
        AddedToken t;
        t.content = e["content"].get<std::string>();
        auto flag = [&](const char* key, bool fallback) {
          auto it = e.find(key);
          if (it == e.end() || it->is_null()) return fallback;
          if (!it->is_boolean()) throw detail::ParseError{where + "." + key, "expected true or false"};
          return it->get<bool>();
        };
        t.special = flag("special", false);
        t.single_word = flag("single_word", false);
        t.lstrip = flag("lstrip", false);
        t.rstrip = flag("rstrip", false);
        t.normalized = flag("normalized", !t.special);
        added.push_back(std::move(t));
      }
    }
    impl->add_tokens(std::move(added));
    if (auto p = root.find("post_processor"); p != root.end()) {
      impl->post_processor = detail::make_post_processor(*p, "post_processor", impl->model, impl->added_by_content);
    }
  } catch (const detail::ParseError& e) {
    return sdk::make_error(sdk::StatusCode::corrupt_data, src + ": key '" + e.path + "': " + e.message);
  } catch (const json::exception& e) {
    return sdk::make_error(sdk::StatusCode::corrupt_data, src + ": unexpected JSON structure: " + e.what());
  }
  if (impl->post_processor) {
    const auto prefix = impl->post_processor->prefix_ids();
    const auto suffix = impl->post_processor->suffix_ids();
    // The template's ids go into every encoded prompt as they are: one past the vocabulary would reach the model.
    const std::size_t vocab = impl->vocab_size();
    for (const auto& ids : {prefix, suffix}) {
      for (const TokenId id : ids) {
        if (id < 0 || static_cast<std::size_t>(id) >= vocab) {
          return sdk::make_error(sdk::StatusCode::corrupt_data,
                                 src + ": key 'post_processor': special token id " + std::to_string(id) +
                                     " is outside the vocabulary (ids 0.." + std::to_string(vocab - 1) +
                                     "); the file is damaged or belongs to another model");
        }
      }
    }
    if (!prefix.empty()) impl->bos_id = prefix.front();
    if (!suffix.empty()) impl->eos_id = suffix.back();
  }
  if (impl->bos_id) {
    if (const std::string* t = impl->id_to_token(*impl->bos_id)) impl->bos_token = *t;
  }
  if (impl->eos_id) {
    if (const std::string* t = impl->id_to_token(*impl->eos_id)) impl->eos_token = *t;
  }
  return impl;
}

}  // namespace

sdk::Expected<Tokenizer> Tokenizer::from_json(std::string_view json_text, std::string_view source) {
  auto impl = parse_impl(json_text, source);
  if (!impl) return impl.error();
  return Tokenizer(std::move(*impl));
}

sdk::Expected<Tokenizer> Tokenizer::from_file(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    file = path / "tokenizer.json";
    // A tiktoken tokenizer (Kimi K2, Moonlight, Hunyuan-A13B) ships no tokenizer.json: its equivalent is rebuilt.
    if (const auto vocab = find_tiktoken_vocab(path); !std::filesystem::exists(file, ec) && vocab) file = *vocab;
  }
  const bool tiktoken = is_tiktoken_vocab_name(file);
  if (!std::filesystem::exists(file, ec)) {
    return sdk::make_error(sdk::StatusCode::not_found,
                           file.string() +
                               ": no such file (expected a tokenizer.json, a tiktoken.model or hy.tiktoken, or a "
                               "model directory holding one)");
  }
  sdk::Status status;
  std::string text;
  if (tiktoken) {
    auto imported = import_tiktoken(file.parent_path());
    if (!imported) return imported.error();
    text = std::move(imported->tokenizer_json);
  } else {
    text = detail::read_file(file, status, /*named=*/true);
  }
  if (!status) return status;
  if (text.rfind("GGUF", 0) == 0) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           file.string() +
                               " is a GGUF file, not a tokenizer.json; convert it (colibri-cli convert) "
                               "and pass the model directory, whose tokenizer.json convert writes");
  }
  return from_json_in(text, file.parent_path(), tiktoken ? file.string() + " (as a tokenizer.json)" : file.string());
}

sdk::Expected<Tokenizer> Tokenizer::from_json_in(std::string_view json_text, const std::filesystem::path& dir,
                                                 std::string_view source) {
  auto parsed = parse_impl(json_text, source);
  if (!parsed) return parsed.error();
  std::shared_ptr<Impl> impl = std::move(*parsed);

  // tokenizer_config.json names BOS/EOS for tokenizers whose post-processor does not (Llama 3, Qwen, ...).
  const auto config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    sdk::Status config_status;
    const std::string config_text = detail::read_file(config_path, config_status, /*named=*/false);
    if (!config_status) return config_status;  // there but unreadable: its BOS/EOS would be silently lost
    const json config = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (config_status && config.is_object()) {
      if (auto bos = config_token(config, "bos_token")) {
        if (auto id = impl->token_to_id(*bos)) {
          impl->bos_id = id;
          impl->bos_token = *bos;
        }
      }
      if (auto eos = config_token(config, "eos_token")) {
        if (auto id = impl->token_to_id(*eos)) {
          impl->eos_id = id;
          impl->eos_token = *eos;
        }
      }
      // transformers' LlamaTokenizerFast replaces tokenizer.json's post-processor with BOS/EOS from add_bos_token
      // (default true) and add_eos_token (default false) whatever that file says: DeepSeek-V3 ships a plain
      // ByteLevel one and still gets its BOS.
      const std::string cls = config.value("tokenizer_class", "");
      if (cls == "LlamaTokenizerFast" || cls == "LlamaTokenizer" || cls == "CodeLlamaTokenizerFast" ||
          cls == "CodeLlamaTokenizer") {
        auto flag = [&](const char* key, bool fallback) {
          const auto it = config.find(key);
          return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
        };
        const bool add_bos = flag("add_bos_token", true), add_eos = flag("add_eos_token", false);
        if ((!add_bos || impl->bos_id) && (!add_eos || impl->eos_id)) {
          std::vector<TokenId> before, after;
          if (add_bos) before.push_back(*impl->bos_id);
          if (add_eos) after.push_back(*impl->eos_id);
          impl->post_processor = detail::make_affix_post_processor(std::move(before), std::move(after));
        }
      }
    }
  }
  return Tokenizer(std::move(impl));
}

std::size_t Tokenizer::first_invalid_utf8(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8::valid_sequence_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

std::optional<std::string> Tokenizer::token_to_piece(TokenId id) const {
  if (const std::string* t = impl_->id_to_token(id)) return *t;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::token_bytes(TokenId id) const {
  const std::string* t = impl_->id_to_token(id);
  if (t == nullptr) return std::nullopt;
  std::string bytes = *t;
  if (impl_->decoder) impl_->decoder->piece_bytes(bytes);
  return bytes;
}

std::optional<TokenId> Tokenizer::piece_to_token(std::string_view piece) const {
  return impl_->token_to_id(piece);
}

bool Tokenizer::is_special(TokenId id) const {
  const std::string* t = impl_->id_to_token(id);
  return t != nullptr && impl_->special_contents.contains(*t);
}

std::size_t Tokenizer::vocab_size() const {
  return impl_->vocab_size();
}
std::size_t Tokenizer::model_vocab_size() const {
  return impl_->model.vocab_size();
}

std::optional<TokenId> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<TokenId> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
std::string Tokenizer::bos_token() const {
  return impl_->bos_token;
}
std::string Tokenizer::eos_token() const {
  return impl_->eos_token;
}

// ---------------------------------------------------------------------------------------------------------------

namespace {
// Pending tokens that each end inside a character (byte-level BPE tokens that split characters at every boundary, a
// run of rare CJK) are not waited for past this many: the text before the unfinished character goes out, the rest
// waits. Past kMaxPendingTokens the tokens are decoded at every push, so it is only the cheap path's length.
constexpr std::size_t kMaxPendingTokens = 4;
// Tokens that add no bytes (skipped special ones) after a lead byte: the character is not going to be finished.
constexpr std::size_t kGiveUpPendingTokens = 64;
// Context tokens decoded along with the pushed ones: a Strip or Metaspace decoder acts on the first token only, byte
// fallback joins the bytes of one character (at most 4).
constexpr std::size_t kContextTokens = 4;
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the common prefix of a and b, backed off to a character boundary of a.
std::size_t common_prefix(std::string_view a, std::string_view b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  while (n > 0 && n < a.size() && (static_cast<unsigned char>(a[n]) & 0xC0) == 0x80) --n;
  return n;
}

// Whether `bytes` ends with the start of a UTF-8 character whose remaining bytes have not come yet (a lead byte and
// fewer continuation bytes than it announces, the first of them allowed after it).
bool ends_inside_character(std::string_view bytes) {
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, bytes.size()); ++back) {
    const auto c = static_cast<unsigned char>(bytes[bytes.size() - back]);
    if ((c & 0xC0) == 0x80) continue;
    const std::size_t length = utf8::lead_length(c);
    if (length <= back) return false;
    return back == 1 || utf8::second_ok(c, static_cast<unsigned char>(bytes[bytes.size() - back + 1]));
  }
  return false;
}
}  // namespace

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special, std::span<const TokenId> context)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {
  // Tokens the decode skips carry no text and do not count. Nor does the context start inside a character: byte
  // fallback turns a run of byte tokens that is not UTF-8 as a whole into one U+FFFD per byte, the new ones too.
  auto starts_inside_character = [&](TokenId id) {
    const auto bytes = tokenizer_.token_bytes(id);
    return bytes && !bytes->empty() && (static_cast<unsigned char>(bytes->front()) & 0xC0) == 0x80;
  };
  for (std::size_t i = context.size(); i > 0; --i) {
    if (ids_.size() >= kContextTokens && !starts_inside_character(ids_.front())) break;
    if (ids_.size() >= 2 * kContextTokens) break;  // no character start in sight: not UTF-8 anyway
    if (skip_special_ && tokenizer_.is_special(context[i - 1])) continue;
    ids_.insert(ids_.begin(), context[i - 1]);
  }
  context_ = ids_.size();
  prefix_ = tokenizer_.decode(ids_, skip_special_);
}

std::string StreamDecoder::push(TokenId id) {
  ids_.push_back(id);
  const std::size_t pending = ids_.size() - context_;
  // Held back while the pending tokens' bytes end inside a character (byte-fallback or byte-level tokens carrying
  // part of one), which the decoder shows as U+FFFD until the rest comes. Judged by the bytes, not by a trailing
  // U+FFFD in the text: a U+FFFD the model wrote as a token of its own is text, and goes out at once.
  std::string tail;
  for (std::size_t i = ids_.size(); i > context_ && tail.size() < 4; --i) {
    if (skip_special_ && tokenizer_.is_special(ids_[i - 1])) continue;
    tail.insert(0, tokenizer_.token_bytes(ids_[i - 1]).value_or(""));
  }
  const bool unfinished = ends_inside_character(tail) && pending <= kGiveUpPendingTokens;
  if (unfinished && pending <= kMaxPendingTokens) return {};
  std::string text = tokenizer_.decode(ids_, skip_special_);
  if (unfinished) {
    // A long run: what comes before the unfinished character is final. Its bytes (at most 3) are at most 3 U+FFFD.
    for (int i = 0; i < 3 && text.ends_with(kReplacement); ++i) text.resize(text.size() - kReplacement.size());
    const std::string already = prefix_ + released_;
    const std::size_t common = common_prefix(text, already);
    if (common >= text.size()) return {};
    std::string out = text.substr(common);
    released_ = text.substr(std::min(prefix_.size(), text.size()));
    return out;
  }
  const std::size_t common = common_prefix(text, prefix_ + released_);
  if (common == text.size()) return {};  // nothing new yet (e.g. a skipped special token)
  // Normally common == prefix_.size() + released_.size(). If the decoder rewrote already released text (only after
  // an unfinished character was given up on), release from the divergence point rather than lose text.
  std::string out = text.substr(common);
  // The tokens just released become the context of the next chunk, so context-dependent decoders (a Strip of the
  // leading space, Metaspace's first token) see the same neighbours as a full decode.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(context_));
  context_ = ids_.size();
  prefix_ = tokenizer_.decode(ids_, skip_special_);
  released_.clear();
  return out;
}

std::string StreamDecoder::flush() {
  const std::string text = tokenizer_.decode(ids_, skip_special_);
  std::string out = text.substr(common_prefix(text, prefix_ + released_));
  ids_.clear();
  context_ = 0;
  prefix_.clear();
  released_.clear();
  return out;
}

}  // namespace colibri::tokenizer
