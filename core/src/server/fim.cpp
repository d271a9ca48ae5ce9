#include "colibri/server/fim.hpp"

namespace colibri::server {

namespace {

struct FimSpelling {
  const char* prefix;
  const char* suffix;
  const char* middle;
};
constexpr FimSpelling kFimSpellings[] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},  // Qwen2.5-Coder, Qwen3-Coder
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},        // StarCoder, Granite
    {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"},  // DeepSeek-Coder (V2)
};

}  // namespace

std::optional<FimTokens> find_fim_tokens(const tokenizer::Tokenizer& tokenizer) {
  for (const auto& s : kFimSpellings) {
    const auto p = tokenizer.piece_to_token(s.prefix), x = tokenizer.piece_to_token(s.suffix),
               m = tokenizer.piece_to_token(s.middle);
    if (p && x && m) return FimTokens{*p, *x, *m};
  }
  return std::nullopt;
}

std::string fim_token_names() {
  std::string out;
  for (const auto& s : kFimSpellings) {
    out += (out.empty() ? "" : ", ") + std::string(s.prefix) + " " + s.suffix + " " + s.middle;
  }
  return out;
}

std::vector<std::int32_t> fim_prompt(const tokenizer::Tokenizer& tokenizer, const FimTokens& fim,
                                     std::string_view prompt, std::string_view suffix) {
  std::vector<std::int32_t> ids = tokenizer.encode("", /*add_special=*/true);  // BOS, when the model starts with one
  ids.push_back(fim.prefix);
  for (const auto id : tokenizer.encode(prompt)) ids.push_back(id);
  ids.push_back(fim.suffix);
  for (const auto id : tokenizer.encode(suffix)) ids.push_back(id);
  ids.push_back(fim.middle);
  return ids;
}

}  // namespace colibri::server
