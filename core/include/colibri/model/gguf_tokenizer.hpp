// Rebuilds HuggingFace tokenizer.json / tokenizer_config.json from a GGUF's tokenizer.ggml.* metadata.
// Supported tokenizer.ggml.model values: "gpt2" (byte-level BPE, with the pre-tokenizer regex of the known
// tokenizer.ggml.pre names; unknown names fall back to GPT-2's and say so in `notes`) and "llama"
// (SentencePiece BPE with byte fallback; merges are derived from the piece scores as HF's converter does).
#pragma once

#include <string>
#include <vector>

#include "colibri/model/gguf.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::model {

struct RebuiltTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string model;               // "gpt2" | "llama"
  std::vector<std::string> notes;  // approximations made, if any
};

sdk::Expected<RebuiltTokenizer> rebuild_tokenizer_from_gguf(const GgufFile& gguf);

}  // namespace colibri::model
