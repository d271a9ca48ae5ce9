// Internal pieces of the tokenizer pipeline, each mirroring one HuggingFace tokenizers component so that the same
// tokenizer.json gives the same tokens: normalizers, pre-tokenizers, the BPE model, post-processors and decoders.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "colibri/sdk/status.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "tokenizer/onig_regex.hpp"

namespace colibri::tokenizer::detail {

using json = nlohmann::json;

// One split of the input as it moves through the pipeline. `added` >= 0 marks an added token found before the model.
struct Piece {
  std::string text;
  TokenId added = -1;
  bool at_origin = false;  // starts at offset 0 of the original input (Metaspace prepend_scheme "first")
};

// Parse errors carry the JSON path of the offending key.
struct ParseError {
  std::string path;
  std::string message;
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

// ---- normalizers ----
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& path);

// ---- pre-tokenizers ----
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece that is not an added token.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& path);

// A whole file's text; `named`: a path the user gave (a companion file must be a regular file).
std::string read_file(const std::filesystem::path& path, sdk::Status& status, bool named);

// tokenizer.json pieces of the tokenizers colibri rebuilds (a GGUF's vocabulary, a tiktoken.model): a ByteLevel step,
// a Split on `regex` (Isolated) then ByteLevel without its own regex, and a byte-level BPE model (no unknown token,
// no byte fallback).
json byte_level_json(bool use_regex, bool trim_offsets = false);
json split_then_byte_level_json(std::string_view regex);
json byte_level_bpe_json(json vocab, json merges, bool ignore_merges);

// GPT-2's reversible byte <-> printable character mapping used by ByteLevel.
const std::array<std::string, 256>& byte_level_chars();
// Maps a UTF-8 encoded byte-level character back to its byte, or -1.
int byte_level_byte(char32_t cp);

// ---- BPE model ----
class BpeModel {
 public:
  static BpeModel parse(const json& j, const std::string& path);  // throws ParseError

  void tokenize(std::string_view word, std::vector<TokenId>& out) const;
  [[nodiscard]] std::optional<TokenId> token_to_id(std::string_view piece) const;
  [[nodiscard]] const std::string* id_to_token(TokenId id) const;
  // The id space (highest id + 1): with gaps or repeated ids in a vocabulary, more than its piece count, and where
  // added tokens' ids start so that they never take an id of the vocabulary's.
  [[nodiscard]] std::size_t vocab_size() const { return by_id_.size(); }

 private:
  struct Merge {
    std::uint32_t rank;
    TokenId new_id;
  };
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;

  Vocab vocab_;
  std::vector<const std::string*> by_id_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::optional<std::string> continuing_subword_prefix_;
  std::optional<std::string> end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<TokenId, 256> byte_tokens_{};  // "<0xAB>" ids for byte fallback, -1 when absent

  // Word cache: HF caches merged words too; results are identical, it only saves time on repeated words.
  std::unique_ptr<std::mutex> cache_mutex_ = std::make_unique<std::mutex>();
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> cache_;
};

// ---- post-processors ----
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<TokenId>& ids, bool add_special) const = 0;
  // Leading / trailing special ids of a single sequence (BOS / EOS candidates).
  [[nodiscard]] virtual std::vector<TokenId> prefix_ids() const { return {}; }
  [[nodiscard]] virtual std::vector<TokenId> suffix_ids() const { return {}; }
};
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& path, const BpeModel& model,
                                                   const Vocab& added);
// `before` + the sequence + `after` when special tokens are added (what transformers' LlamaTokenizerFast builds from
// add_bos_token / add_eos_token).
std::unique_ptr<PostProcessor> make_affix_post_processor(std::vector<TokenId> before, std::vector<TokenId> after);

// ---- decoders ----
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // One token's bytes as it adds them inside a text: raw (no U+FFFD repair of a partial character) and without the
  // steps that depend on its neighbours (Strip, Fuse, Metaspace's first token).
  virtual void piece_bytes(std::string& token) const { (void)token; }
};
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& path);

}  // namespace colibri::tokenizer::detail
