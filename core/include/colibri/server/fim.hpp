// Fill in the middle for /v1/completions' `suffix`: the prompt a code model trained for it expects. No networking
// here, so it is unit-tested without sockets.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::server {

// Fill in the middle (completions' `suffix`): code models mark the prefix, the suffix and where the middle goes with
// three tokens (Qwen2.5/Qwen3-Coder <|fim_prefix|>..., StarCoder <fim_prefix>..., DeepSeek-Coder <｜fim▁begin｜>...).
struct FimTokens {
  std::int32_t prefix = -1, suffix = -1, middle = -1;
};
// The first of those spellings whose three tokens the vocabulary holds, with their names for messages.
std::optional<FimTokens> find_fim_tokens(const tokenizer::Tokenizer& tokenizer);
std::string fim_token_names();
// The prompt: [BOS when the tokenizer adds one] PREFIX prompt SUFFIX suffix MIDDLE (prefix-suffix-middle order).
std::vector<std::int32_t> fim_prompt(const tokenizer::Tokenizer& tokenizer, const FimTokens& fim,
                                     std::string_view prompt, std::string_view suffix);

}  // namespace colibri::server
