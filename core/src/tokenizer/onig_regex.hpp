// Thin RAII wrapper over Oniguruma, the regex engine the HuggingFace tokenizers library uses for its patterns
// (Unicode properties, look-ahead), with the same syntax (ONIG_SYNTAX_ONIGURUMA) and iteration rules.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::tokenizer {

class OnigRegex {
 public:
  static sdk::Expected<OnigRegex> compile(std::string_view pattern);

  // Non-overlapping matches (byte offsets) as HF's onig find_iter yields them: an empty match right after the
  // previous match is skipped by advancing one character.
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;
  // The first match at or after `from`, or false.
  bool search(std::string_view text, std::size_t from, std::size_t& start, std::size_t& end) const;

 private:
  struct Handle;
  std::shared_ptr<Handle> handle_;
};

}  // namespace colibri::tokenizer
