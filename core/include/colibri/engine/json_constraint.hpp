// JSON mode (the API's response_format {"type": "json_object"}): a byte-level pushdown automaton for JSON text whose
// top-level value is an object, starting at its '{'. Sampling asks it which tokens keep the text a prefix of valid JSON
// and bans the rest, so the model can only write JSON; generation stops when the object closes.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::engine {

class JsonConstraint {
 public:
  // Deeper nesting is refused (the stack is a fixed array, so accepts() copies no heap memory).
  static constexpr std::size_t kMaxDepth = 64;
  // A longer run of whitespace outside strings is refused: a model that only emits spaces would never finish.
  static constexpr int kMaxWhitespaceRun = 64;
  // Longer numbers, or exponents of more than 2 digits, are refused: every number then fits a double.
  static constexpr int kMaxNumberLength = 64;

  // Whether appending `bytes` keeps the text a prefix of a valid JSON object (the state does not change).
  [[nodiscard]] bool accepts(std::string_view bytes) const;
  // Appends `bytes`; returns false, leaving the state unchanged, where accepts() would.
  bool advance(std::string_view bytes);
  // The top-level object is closed: the text is one complete JSON object.
  [[nodiscard]] bool complete() const { return mode_ == Mode::done; }
  // Inside a string, between characters: any text without '"', '\' and control characters is accepted.
  [[nodiscard]] bool in_plain_string() const { return mode_ == Mode::string && pending_ == 0; }
  [[nodiscard]] bool accepts_byte(unsigned char c) const {
    JsonConstraint copy = *this;
    return copy.step(c);
  }

 private:
  enum class Mode : std::uint8_t {
    top,             // before the top-level '{'
    value,           // a value is expected
    array_first,     // after '[': a value or ']'
    key_or_end,      // after '{': a key or '}'
    key,             // after ',' in an object: a key
    colon,           // after a key
    after_value,     // ',' or the container's closing bracket
    string,          // inside a string
    string_escape,   // after '\'
    string_unicode,  // inside a \u escape (its 4 hex digits)
    number,          // inside a number (see number_)
    literal,         // inside true / false / null
    done,
  };
  enum class Num : std::uint8_t { minus, zero, integer, dot, fraction, exp_mark, exp_sign, exponent };

  friend class JsonTokenMask;  // steps its per-byte copies directly
  bool step(unsigned char c);
  bool open(char bracket);
  bool close(char bracket);
  bool end_value();
  bool after_value(unsigned char c);
  bool start_value(unsigned char c);
  bool start_number(Num first);
  bool whitespace(unsigned char c);

  Mode mode_ = Mode::top;
  std::array<char, kMaxDepth> stack_{};  // '{' or '['
  std::uint8_t depth_ = 0;
  bool string_is_key_ = false;
  Num number_ = Num::minus;
  std::uint8_t number_length_ = 0, exponent_digits_ = 0;
  std::uint8_t pending_ = 0;       // string: UTF-8 continuation bytes still due; \u: hex digits still due
  std::uint8_t lead_ = 0;          // a UTF-8 lead byte whose first continuation is due (0: none)
  const char* literal_ = nullptr;  // the rest of "true" / "false" / "null"
  int whitespace_run_ = 0;
};

// JSON mode at the token level: each token's bytes, and which tokens keep a JsonConstraint's text valid.
class JsonTokenMask {
 public:
  // `vocab`: the model's logits per token (may exceed the tokenizer's ids). Special tokens and `end_tokens` are
  // never allowed: "<|im_end|>" is not text, even inside a JSON string, and an end token not marked special must not
  // end the answer mid-object.
  JsonTokenMask(const tokenizer::Tokenizer& tokenizer, std::size_t vocab, std::span<const std::int64_t> end_tokens);
  // allowed[id] = 1 when appending the token keeps `json` a valid prefix, else 0.
  void allowed(const JsonConstraint& json, std::vector<std::uint8_t>& allowed) const;
  [[nodiscard]] const std::string& bytes(std::int32_t id) const;

 private:
  enum Kind : std::uint8_t { never, plain, other };  // plain: string text with no '"', '\' or control character
  std::vector<std::string> bytes_;
  // Per token, compact so that the pass over the vocabulary reads little memory: most tokens are decided by these.
  std::vector<std::uint8_t> first_, second_, length_, kind_;  // length_: the byte count, at most 255
};

}  // namespace colibri::engine
