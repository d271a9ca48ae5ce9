// HuggingFace tokenizer.json compatible tokenizer (BPE: byte-level and SentencePiece-style with byte fallback).
// Goal: token-for-token equality with the HuggingFace `tokenizers` library; see tests/unit/tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::tokenizer {

using TokenId = std::int32_t;

class Tokenizer {
 public:
  // Loads a tokenizer.json. `path` may also be a model directory containing tokenizer.json, or a tiktoken vocabulary
  // (tiktoken.hpp: Kimi K2's tiktoken.model, Hunyuan's hy.tiktoken), or a directory with one and no tokenizer.json.
  // A tokenizer_config.json next to it, when present, supplies bos_token / eos_token names the tokenizer.json does
  // not carry.
  static sdk::Expected<Tokenizer> from_file(const std::filesystem::path& path);
  // tokenizer.json text read as from_file reads a file in `dir` (its tokenizer_config.json applied): a tiktoken
  // import's, without importing it again.
  static sdk::Expected<Tokenizer> from_json_in(std::string_view json_text, const std::filesystem::path& dir,
                                               std::string_view source);
  // Parses tokenizer.json text; `source` names it in error messages.
  static sdk::Expected<Tokenizer> from_json(std::string_view json_text, std::string_view source = "<memory>");

  // Byte offset of the first byte of `text` that is not valid UTF-8 (encode reads it as U+FFFD), or npos.
  [[nodiscard]] static std::size_t first_invalid_utf8(std::string_view text) noexcept;

  // Encodes UTF-8 text. Invalid UTF-8 is replaced by U+FFFD per maximal invalid subsequence before encoding (what
  // HuggingFace does when text reaches it through a lossy conversion). `add_special` applies the post-processor
  // (BOS/EOS), like HF's add_special_tokens.
  [[nodiscard]] std::vector<TokenId> encode(std::string_view text, bool add_special = false) const;

  // Decodes ids through the tokenizer's decoder. Unknown ids are skipped (as HF does).
  [[nodiscard]] std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // The vocabulary string of a token (byte-level pieces are in their mapped form, e.g. "Ġthe").
  [[nodiscard]] std::optional<std::string> token_to_piece(TokenId id) const;
  [[nodiscard]] std::optional<TokenId> piece_to_token(std::string_view piece) const;
  // The bytes a token adds to a text it is in the middle of ("Ġthe" and "▁the" give " the", "<0xE6>" the byte
  // 0xE6): what OpenAI's logprobs report per token. Not always valid UTF-8 on its own.
  [[nodiscard]] std::optional<std::string> token_bytes(TokenId id) const;
  [[nodiscard]] bool is_special(TokenId id) const;
  [[nodiscard]] std::size_t vocab_size() const;        // model vocabulary plus added tokens
  [[nodiscard]] std::size_t model_vocab_size() const;  // the model vocabulary's ids alone (highest + 1)

  [[nodiscard]] std::optional<TokenId> bos_id() const;
  [[nodiscard]] std::optional<TokenId> eos_id() const;
  [[nodiscard]] std::string bos_token() const;  // "" when unknown
  [[nodiscard]] std::string eos_token() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// Incremental detokenizer for generation: push ids one at a time and get text that always ends on a UTF-8
// character boundary (a multi-byte character, byte-fallback bytes included, is released whole). The concatenation of
// all chunks plus flush() equals decode(all ids), and with a `context` decode(context + ids) minus decode(context).
class StreamDecoder {
 public:
  // `context`: the tokens the pushed ones continue (a prompt), never released themselves. Its last few tokens are
  // decoded along, so the first pushed token decodes as in the middle of a text: SentencePiece's "▁Hello" after a
  // prompt is " Hello", where alone (the start of a text, as a chat answer is) it is "Hello".
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special = false, std::span<const TokenId> context = {});

  // Text that became final with this id (possibly empty).
  std::string push(TokenId id);
  // Whatever is still held back (an incomplete character at the end of generation becomes U+FFFD).
  std::string flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<TokenId> ids_;  // context ids (already emitted) followed by pending ones
  std::size_t context_ = 0;   // how many of ids_ are context
  std::string prefix_;        // decode(ids_[0, context_))
  std::string released_;      // text of the pending ids already released (a long run of split characters)
};

}  // namespace colibri::tokenizer
