// tiktoken tokenizers: a tiktoken.model (one base64 token and its rank per line) with the split pattern in the
// model's Python code, and no tokenizer.json (Kimi K2, Moonlight). colibri rebuilds the tokenizer.json that encodes
// and decodes as tiktoken does, for the families whose pattern it knows.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "colibri/sdk/status.hpp"

namespace colibri::tokenizer {

// Kimi K2's and Moonlight's split pattern (pat_str of tokenization_kimi.py / tokenization_moonshot.py; llama.cpp's
// pre-tokenizer "kimi-k2"): GPT-4o's, with Han characters out of the word classes and in runs of their own.
std::string_view kimi_split_regex() noexcept;

struct TiktokenImport {
  std::string tokenizer_json;  // a HuggingFace tokenizer.json equivalent to the tiktoken tokenizer
  std::string family;          // whose split pattern: "kimi"
  std::string code;            // the tokenizer code tokenizer_config.json names ("tokenization_kimi")
  std::size_t ranks = 0;       // tokens in tiktoken.model
  std::size_t merges = 0;      // merges rebuilt from the ranks
  std::size_t specials = 0;    // special tokens after the ranks (named in added_tokens_decoder or reserved)
};

// Reads dir/tiktoken.model and dir/tokenizer_config.json (its auto_map names the tokenizer code, hence the split
// pattern; added_tokens_decoder names the special tokens). The merges are rebuilt from the ranks as transformers'
// TikTokenConverter and llama.cpp's converter do (each token's own BPE below its rank), and BPE takes a piece that is
// a whole token as that token (tiktoken's shortcut: ignore_merges). Errors name the file, the line or the key.
sdk::Expected<TiktokenImport> import_tiktoken(const std::filesystem::path& dir);

}  // namespace colibri::tokenizer
