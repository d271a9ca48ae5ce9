// tiktoken tokenizers: a vocabulary file (one base64 token and its rank per line: Kimi K2's and Moonlight's
// tiktoken.model, Hunyuan-A13B's hy.tiktoken) with the split pattern and the special tokens in the model's Python code,
// and no tokenizer.json. colibri rebuilds the tokenizer.json that encodes and decodes as that code does, for the
// families whose code it knows.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "colibri/sdk/status.hpp"

namespace colibri::tokenizer {

// Kimi K2's and Moonlight's split pattern (pat_str of tokenization_kimi.py / tokenization_moonshot.py; llama.cpp's
// pre-tokenizer "kimi-k2"): GPT-4o's, with Han characters out of the word classes and in runs of their own.
std::string_view kimi_split_regex() noexcept;
// Hunyuan-A13B's (PAT_STR of tokenization_hy.py; llama.cpp's pre-tokenizer "hunyuan"): Qwen 2's.
std::string_view hunyuan_split_regex() noexcept;

// Whether `file` is named as a known family's vocabulary file (tiktoken.model, hy.tiktoken).
bool is_tiktoken_vocab_name(const std::filesystem::path& file);
// dir's vocabulary file of a known family, if it holds one.
std::optional<std::filesystem::path> find_tiktoken_vocab(const std::filesystem::path& dir);

struct TiktokenImport {
  std::string tokenizer_json;  // a HuggingFace tokenizer.json equivalent to the tiktoken tokenizer
  std::string family;          // whose split pattern: "kimi", "hunyuan"
  std::string code;            // the tokenizer code tokenizer_config.json names ("tokenization_kimi")
  std::string file;            // the vocabulary file's name ("tiktoken.model", "hy.tiktoken")
  std::size_t ranks = 0;       // tokens in the vocabulary file
  std::size_t merges = 0;      // merges rebuilt from the ranks
  std::size_t specials = 0;    // special tokens after the ranks (named in added_tokens_decoder or reserved)
};

// Reads dir/tokenizer_config.json (its auto_map names the tokenizer code, hence the family: the vocabulary file, the
// split pattern and the special tokens; added_tokens_decoder names special tokens too) and the family's vocabulary. The
// merges are rebuilt from the ranks as transformers' TikTokenConverter and llama.cpp's converter do (each token's own
// BPE below its rank), and BPE takes a piece that is a whole token as that token (tiktoken's shortcut: ignore_merges).
// Errors name the file, the line or the key.
sdk::Expected<TiktokenImport> import_tiktoken(const std::filesystem::path& dir);

}  // namespace colibri::tokenizer
