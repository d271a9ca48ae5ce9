// JSON mode (the API's response_format {"type": "json_object"}): a byte-level pushdown automaton for JSON text whose
// top-level value is an object, starting at its '{'. Sampling asks it which tokens keep the text a prefix of valid JSON
// and bans the rest, so the model can only write JSON; generation stops when the object closes. With a JsonSchema
// ({"type": "json_schema"}) it also keeps the text a prefix of an object the schema accepts.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/sdk/status.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::engine {

// A JSON Schema compiled for JsonConstraint. Enforced: type (one or a list), properties + required (objects are closed:
// additionalProperties false unless the object lists no properties, when additionalProperties may give the values'
// schema), items, minItems, maxItems, enum, const, anyOf / oneOf whose branches start differently (string or null,
// object or array...), $ref to #/$defs/... or #/definitions/... (recursion included). Annotations (title,
// description, default, examples, format, $schema, ...) are accepted and not enforced; allOf of one schema beside
// annotations is that schema. Any other keyword (pattern, minLength, minimum, allOf of several, ...) is refused,
// naming where it is, rather than silently not enforced (compile_lenient enforces the rest and lists them).
class JsonSchema {
 public:
  static constexpr std::uint16_t kAny = 0xFFFF;         // no constraint: any JSON value
  static constexpr std::size_t kMaxProperties = 64;     // per object (a bit each while it is written)
  static constexpr std::size_t kMaxLiteralBytes = 128;  // a property name or enum value, as JSON text
  static constexpr std::size_t kMaxNodes = 4096;

  // Errors (invalid_argument) name the place in the schema ("schema at 'properties.tags.pattern': is not supported").
  // Ordered: the answer writes the properties in the schema's order (a plain json's are sorted by name).
  static sdk::Expected<std::shared_ptr<const JsonSchema>> compile(const nlohmann::ordered_json& schema);
  // The same, but what colibri cannot enforce is left unenforced rather than refused, and its place listed in
  // `skipped`: an unsupported keyword is ignored, anyOf branches that start alike or an enum of objects take any
  // value, additionalProperties beside properties leaves the object closed. Types, properties and required still
  // hold. For a forced tool call, whose arguments are better kept to the parameters' shape than to any JSON object.
  // A schema that is wrong (a type that does not exist, required naming an unlisted property) is still an error.
  static sdk::Expected<std::shared_ptr<const JsonSchema>> compile_lenient(const nlohmann::ordered_json& schema,
                                                                          std::vector<std::string>& skipped);
  // A call of one of several tools, {"name": NAME, "arguments": {...}}: the name one of the tools', and the arguments
  // then that tool's `parameters` (compiled leniently; null, or one colibri cannot compile, is any object).
  // tool_choice "required" with several tools. `arguments_key`: "parameters" for Llama's bare JSON calls.
  static sdk::Expected<std::shared_ptr<const JsonSchema>> compile_tool_call(
      const std::vector<std::pair<std::string, nlohmann::ordered_json>>& tools, std::vector<std::string>& skipped,
      std::string_view arguments_key = "arguments");

  enum class Kind : std::uint8_t { any, object, map, array, string, number, integer, boolean, null, literals, any_of };
  // The first byte of a value tells its class; an any_of node picks its branch by it.
  enum Class : std::uint8_t { c_object, c_array, c_string, c_number, c_boolean, c_null, kClasses };
  // The class a value starting with `c` is of (kClasses: no value starts so).
  static constexpr Class class_of_byte(unsigned char c) {
    if (c == '{') return c_object;
    if (c == '[') return c_array;
    if (c == '"') return c_string;
    if (c == 't' || c == 'f') return c_boolean;
    if (c == 'n') return c_null;
    if (c == '-' || (c >= '0' && c <= '9')) return c_number;
    return kClasses;
  }
  struct Node {
    Kind kind = Kind::any;
    std::vector<std::string> keys;      // object: property names as JSON text ("\"name\""), in schema order
    std::vector<std::uint16_t> values;  // object: each property's node
    std::uint64_t required = 0;         // object: bit i = keys[i] is required
    std::uint16_t item = kAny;          // array: items; map: the values
    std::uint32_t min_items = 0, max_items = std::numeric_limits<std::uint32_t>::max();
    std::vector<std::string> literals;             // literals: the allowed values as compact JSON text
    std::array<std::uint16_t, kClasses> branch{};  // any_of: the node for each first-byte class (kAny: none)
    // object (compile_tool_call's root): the node of property 1 for each literal of property 0, which it follows
    std::vector<std::uint16_t> tagged;
  };
  std::vector<Node> nodes;
  std::uint16_t root = kAny;
};

class JsonConstraint {
 public:
  JsonConstraint() = default;
  // `schema` (may be null: any object) must outlive the constraint and its copies.
  explicit JsonConstraint(const JsonSchema* schema) : schema_(schema) {
    if (schema != nullptr) value_node_ = schema->root;
  }

  // Deeper nesting is refused (the stack is a fixed array, so accepts() copies no heap memory).
  static constexpr std::size_t kMaxDepth = 64;
  // A longer run of whitespace outside strings is refused: a model that only emits spaces would never finish.
  static constexpr int kMaxWhitespaceRun = 64;
  // Longer numbers, or exponents of more than 2 digits, are refused: every number then fits a double.
  static constexpr int kMaxNumberLength = 64;

  // Whitespace may come before the top-level '{' (the blank lines after a thinking block).
  void allow_leading_whitespace() { leading_whitespace_ = true; }

  // Whether appending `bytes` keeps the text a prefix of a valid JSON object (the state does not change).
  [[nodiscard]] bool accepts(std::string_view bytes) const;
  // Appends `bytes`; returns false, leaving the state unchanged, where accepts() would.
  bool advance(std::string_view bytes);
  // The top-level object is closed: the text is one complete JSON object.
  [[nodiscard]] bool complete() const { return mode_ == Mode::done; }
  // Inside a string, between characters: any text without '"', '\' and control characters is accepted.
  [[nodiscard]] bool in_plain_string() const {
    return mode_ == Mode::string && pending_ == 0 && surrogate_ == Surrogate::none;
  }
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
    literal_set,     // schema: a property name or enum value, one of a list of JSON texts (match_ so far)
    done,
  };
  enum class Num : std::uint8_t { minus, zero, integer, dot, fraction, exp_mark, exp_sign, exponent };
  // A \u escape of a UTF-16 high surrogate is being written (high_seen) or was (low_due: its low half must follow).
  enum class Surrogate : std::uint8_t { none, high_seen, low_due };

  friend class JsonTokenMask;  // steps its per-byte copies directly
  bool step(unsigned char c);
  bool open(char bracket);
  bool close(char bracket);
  bool end_value();
  bool after_value(unsigned char c);
  bool start_value(unsigned char c);
  bool start_number(Num first);
  bool whitespace(unsigned char c);
  bool literal_step(unsigned char c);
  bool end_literal(std::size_t index);              // an enum value ends: the `index`th literal
  bool literal_complete(std::size_t length) const;  // match_[0, length) is one of the candidates
  template <class F>
  void for_each_candidate(F&& f) const;  // literal_set: each allowed text (and its key index), until f returns true
  // The properties that may come next in an object of `node` after those in `seen`: later in the schema's order
  // than every written one (as OpenAI's structured outputs write them), up to the first required one not written.
  std::uint64_t next_keys(std::uint16_t node, std::uint64_t seen) const;
  [[nodiscard]] bool frame_accepts_close() const;  // the innermost container may close here (required, minItems)

  const JsonSchema* schema_ = nullptr;
  std::array<std::uint16_t, kMaxDepth> frame_node_{};  // each open container's schema node
  std::array<std::uint64_t, kMaxDepth> frame_seen_{};  // object: bit i = property i written; array: items begun
  std::uint16_t value_node_ = JsonSchema::kAny;        // the schema of the value that starts next
  bool integer_only_ = false;                          // the number being written must be an integer
  std::uint16_t literal_node_ = JsonSchema::kAny;      // literal_set: the node whose keys or literals are allowed
  bool tag_due_ = false;                               // the literal being written is a tagged object's tag
  std::uint16_t tag_ = 0;                              // the tag it was (its literal's index)
  bool literal_key_ = false;                           // literal_set: a property name (else an enum value)
  std::uint8_t match_length_ = 0;
  std::array<char, JsonSchema::kMaxLiteralBytes> match_{};
  Mode mode_ = Mode::top;
  std::array<char, kMaxDepth> stack_{};  // '{' or '['
  std::uint8_t depth_ = 0;
  bool string_is_key_ = false;
  Num number_ = Num::minus;
  std::uint8_t number_length_ = 0, exponent_digits_ = 0;
  std::uint8_t pending_ = 0;  // string: UTF-8 continuation bytes still due; \u: hex digits still due
  std::uint8_t lead_ = 0;     // a UTF-8 lead byte whose first continuation is due (0: none)
  Surrogate surrogate_ = Surrogate::none;
  bool first_digit_d_ = false;     // \u escape: its first hex digit was d or D
  const char* literal_ = nullptr;  // the rest of "true" / "false" / "null"
  int whitespace_run_ = 0;
  bool leading_whitespace_ = false;
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
  // allowed[id] = 1 for every token but the end tokens (free text that must not end the answer).
  void allowed_but_end(std::vector<std::uint8_t>& allowed) const;
  // A token's bytes; special tokens and end tokens included (their text), though allowed() never allows them.
  [[nodiscard]] const std::string& bytes(std::int32_t id) const;

 private:
  enum Kind : std::uint8_t { never, plain, other };  // plain: string text with no '"', '\' or control character
  std::vector<std::string> bytes_;
  // Per token, compact so that the pass over the vocabulary reads little memory: most tokens are decided by these.
  std::vector<std::uint8_t> first_, second_, length_, kind_;  // length_: the byte count, at most 255
  std::vector<std::int64_t> end_tokens_;
};

// JSON mode for a model that thinks before it answers (Qwen3, DeepSeek R1): a leading <think>...</think> block is
// free text, and the JSON constraint starts after it, as vLLM applies structured output after a reasoning parser's
// end marker. Without the block the model could not think, and a prompt that opens it would get JSON inside it.
class JsonAnswer {
 public:
  enum class Thinking : std::uint8_t {
    none,      // JSON from the first token
    may_open,  // the answer may start with "<think>" (one token or several) or with the JSON
    inside,    // the prompt opened the block: free text until "</think>"
  };
  // `schema` (may be null: any object) must outlive the answer and its copies.
  explicit JsonAnswer(const JsonSchema* schema = nullptr, Thinking thinking = Thinking::none);

  // This step's mask. Inside the block every token but the end tokens is allowed: the answer must reach its JSON.
  void allowed(const JsonTokenMask& tokens, std::vector<std::uint8_t>& allowed) const;
  // Takes the sampled token (one allowed() allowed).
  void push(const JsonTokenMask& tokens, std::int32_t id);
  // The JSON object is complete: the answer is done.
  [[nodiscard]] bool complete() const { return state_ == State::json && json_.complete(); }
  // Still before the JSON: in the block or at its possible opening.
  [[nodiscard]] bool thinking() const { return state_ != State::json; }

 private:
  enum class State : std::uint8_t { json, may_open, inside };
  JsonConstraint json_;
  State state_;
  std::string held_;  // may_open: the answer so far (a prefix of "<think>"); inside: a tail that may start "</think>"
};

}  // namespace colibri::engine
