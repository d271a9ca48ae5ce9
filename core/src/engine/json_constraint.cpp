#include "colibri/engine/json_constraint.hpp"

#include <algorithm>
#include <array>

#include "tokenizer/utf8.hpp"

namespace colibri::engine {

bool JsonConstraint::accepts(std::string_view bytes) const {
  JsonConstraint copy = *this;
  for (const char c : bytes) {
    if (!copy.step(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool JsonConstraint::advance(std::string_view bytes) {
  JsonConstraint next = *this;
  for (const char c : bytes) {
    if (!next.step(static_cast<unsigned char>(c))) return false;
  }
  *this = next;
  return true;
}

bool JsonConstraint::whitespace(unsigned char c) {
  if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
  return ++whitespace_run_ <= kMaxWhitespaceRun;
}

using Kind = JsonSchema::Kind;

bool JsonConstraint::open(char bracket) {
  if (depth_ >= kMaxDepth) return false;
  frame_node_[depth_] = value_node_;
  frame_seen_[depth_] = 0;
  stack_[depth_++] = bracket;
  mode_ = bracket == '{' ? Mode::key_or_end : Mode::array_first;
  if (bracket == '[')
    value_node_ = value_node_ == JsonSchema::kAny ? JsonSchema::kAny : schema_->nodes[value_node_].item;
  return true;
}

bool JsonConstraint::frame_accepts_close() const {
  const std::uint16_t node = frame_node_[depth_ - 1];
  if (node == JsonSchema::kAny) return true;
  const auto& n = schema_->nodes[node];
  if (n.kind == Kind::object) return (n.required & ~frame_seen_[depth_ - 1]) == 0;
  if (n.kind == Kind::array) return frame_seen_[depth_ - 1] >= n.min_items;
  return true;
}

bool JsonConstraint::close(char bracket) {
  if (depth_ == 0 || stack_[depth_ - 1] != bracket || !frame_accepts_close()) return false;
  --depth_;
  mode_ = depth_ == 0 ? Mode::done : Mode::after_value;
  return true;
}

template <class F>
void JsonConstraint::for_each_candidate(F&& f) const {
  const auto& n = schema_->nodes[literal_node_];
  if (!literal_key_) {
    for (std::size_t i = 0; i < n.literals.size(); ++i) {
      if (f(n.literals[i], i)) return;
    }
    return;
  }
  const std::uint64_t next = next_keys(literal_node_, frame_seen_[depth_ - 1]);
  for (std::size_t i = 0; i < n.keys.size(); ++i) {
    if ((next >> i & 1) != 0 && f(n.keys[i], i)) return;
  }
}

std::uint64_t JsonConstraint::next_keys(std::uint16_t node, std::uint64_t seen) const {
  const auto& n = schema_->nodes[node];
  std::uint64_t next = 0;
  for (std::size_t i = 0; i < n.keys.size() && i < 64; ++i) {
    if ((seen >> i) != 0) continue;  // this key or a later one is written
    next |= std::uint64_t{1} << i;
    if ((n.required >> i & 1) != 0) break;  // a required key is never skipped
  }
  return next;
}

bool JsonConstraint::literal_complete(std::size_t length) const {
  const std::string_view typed(match_.data(), length);
  bool found = false;
  for_each_candidate([&](const std::string& c, std::size_t) { return found = c == typed; });
  return found;
}

// One byte of a property name or enum value: it must keep the text a prefix of an allowed one. The value ends when
// it is complete and no longer allowed text continues it; a number ("1" beside "12") may also end at the next byte.
bool JsonConstraint::literal_step(unsigned char c) {
  if (match_length_ < match_.size()) {
    match_[match_length_] = static_cast<char>(c);
    const std::string_view typed(match_.data(), match_length_ + 1u);
    bool prefix = false, exact = false, longer = false;
    std::size_t exact_index = 0;
    for_each_candidate([&](const std::string& cand, std::size_t i) {
      if (cand.size() < typed.size() || cand.compare(0, typed.size(), typed) != 0) return false;
      prefix = true;
      if (cand.size() == typed.size()) {
        exact = true;
        exact_index = i;
      } else {
        longer = true;
      }
      return false;
    });
    if (prefix) {
      ++match_length_;
      if (!exact || longer) return true;
      if (literal_key_) {
        frame_seen_[depth_ - 1] |= std::uint64_t{1} << exact_index;
        const auto& n = schema_->nodes[literal_node_];
        value_node_ = n.values[exact_index];
        // A tagged object: its first property's value picks its second's schema.
        tag_due_ = !n.tagged.empty() && exact_index == 0;
        if (!n.tagged.empty() && exact_index == 1) value_node_ = n.tagged[tag_];
        mode_ = Mode::colon;
        return true;
      }
      return end_literal(exact_index);
    }
  }
  // Not a continuation: only a complete value followed by what comes after it.
  if (literal_key_ || !literal_complete(match_length_)) return false;
  const std::string_view typed(match_.data(), match_length_);
  std::size_t index = 0;
  for_each_candidate([&](const std::string& cand, std::size_t i) {
    index = i;
    return cand == typed;
  });
  end_literal(index);
  return after_value(c);
}

bool JsonConstraint::end_literal(std::size_t index) {
  if (tag_due_) {
    tag_ = static_cast<std::uint16_t>(index);
    tag_due_ = false;
  }
  return end_value();
}

bool JsonConstraint::end_value() {
  mode_ = Mode::after_value;
  return true;
}

bool JsonConstraint::start_number(Num first) {
  number_ = first;
  number_length_ = 1;
  mode_ = Mode::number;
  return true;
}

bool JsonConstraint::start_value(unsigned char c) {
  integer_only_ = false;
  if (value_node_ != JsonSchema::kAny) {
    std::uint16_t node = value_node_;
    const JsonSchema::Node* n = &schema_->nodes[node];
    if (n->kind == Kind::any_of) {
      const auto cls = JsonSchema::class_of_byte(c);
      if (cls == JsonSchema::kClasses || n->branch[cls] == JsonSchema::kAny) return false;
      node = n->branch[cls];
      n = &schema_->nodes[node];
    }
    value_node_ = node;
    const bool number_start = JsonSchema::class_of_byte(c) == JsonSchema::c_number;
    switch (n->kind) {
      case Kind::any: value_node_ = JsonSchema::kAny; break;
      case Kind::object:
      case Kind::map:
        if (c != '{') return false;
        break;
      case Kind::array:
        if (c != '[') return false;
        break;
      case Kind::string:
        if (c != '"') return false;
        break;
      case Kind::integer: integer_only_ = true; [[fallthrough]];
      case Kind::number:
        if (!number_start) return false;
        break;
      case Kind::boolean:
        if (c != 't' && c != 'f') return false;
        break;
      case Kind::null:
        if (c != 'n') return false;
        break;
      case Kind::literals:
        mode_ = Mode::literal_set;
        literal_node_ = node;
        literal_key_ = false;
        match_length_ = 0;
        return literal_step(c);
      case Kind::any_of: return false;  // unions are flattened when compiled
    }
  }
  switch (c) {
    case '{': return open('{');
    case '[': return open('[');
    case '"':
      mode_ = Mode::string;
      string_is_key_ = false;
      pending_ = 0;
      return true;
    case 't': literal_ = "rue"; break;
    case 'f': literal_ = "alse"; break;
    case 'n': literal_ = "ull"; break;
    case '-': return start_number(Num::minus);
    case '0': return start_number(Num::zero);
    default:
      if (c >= '1' && c <= '9') return start_number(Num::integer);
      return false;
  }
  mode_ = Mode::literal;
  return true;
}

bool JsonConstraint::after_value(unsigned char c) {
  if (whitespace(c)) return true;
  if (c == ',') {
    const std::uint16_t node = frame_node_[depth_ - 1];
    if (node != JsonSchema::kAny) {
      const auto& n = schema_->nodes[node];
      // A closed object takes another member only while a property may still follow; an array only below
      // maxItems.
      if (n.kind == Kind::object && next_keys(node, frame_seen_[depth_ - 1]) == 0) return false;
      if (n.kind == Kind::array) {
        if (frame_seen_[depth_ - 1] >= n.max_items) return false;
        ++frame_seen_[depth_ - 1];
        value_node_ = n.item;
      }
    }
    mode_ = stack_[depth_ - 1] == '{' ? Mode::key : Mode::value;
    return true;
  }
  if (c == '}') return close('{');
  if (c == ']') return close('[');
  return false;
}

bool JsonConstraint::step(unsigned char c) {
  if (c != ' ' && c != '\t' && c != '\n' && c != '\r') whitespace_run_ = 0;
  switch (mode_) {
    case Mode::done: return false;
    case Mode::top:  // no whitespace first: an answer starts with its '{', as llama.cpp's JSON grammar has it
      if (leading_whitespace_ && whitespace(c)) return true;
      return c == '{' && start_value(c);
    case Mode::value:
      if (whitespace(c)) return true;
      return start_value(c);
    case Mode::array_first: {
      if (whitespace(c)) return true;
      if (c == ']') return close('[');
      const std::uint16_t node = frame_node_[depth_ - 1];
      if (node != JsonSchema::kAny && schema_->nodes[node].max_items == 0) return false;
      frame_seen_[depth_ - 1] = 1;
      return start_value(c);
    }
    case Mode::key_or_end:
    case Mode::key:
      if (whitespace(c)) return true;
      if (c == '}' && mode_ == Mode::key_or_end) return close('{');
      if (c != '"') return false;
      if (const std::uint16_t node = frame_node_[depth_ - 1];
          node != JsonSchema::kAny && schema_->nodes[node].kind == Kind::object) {
        mode_ = Mode::literal_set;  // one of the properties not written yet
        literal_node_ = node;
        literal_key_ = true;
        match_length_ = 0;
        return literal_step(c);
      }
      mode_ = Mode::string;
      string_is_key_ = true;
      pending_ = 0;
      return true;
    case Mode::colon:
      if (whitespace(c)) return true;
      if (c != ':') return false;
      mode_ = Mode::value;
      return true;
    case Mode::after_value: return after_value(c);
    case Mode::string:
      if (surrogate_ != Surrogate::none) {  // a \uD800-\uDBFF escape: only the low half's escape may follow
        if (c != '\\') return false;
        mode_ = Mode::string_escape;
        return true;
      }
      if (pending_ > 0) {  // inside a multi-byte UTF-8 character
        if (lead_ != 0 ? !tokenizer::utf8::second_ok(lead_, c) : (c < 0x80 || c > 0xBF)) return false;
        lead_ = 0;
        --pending_;
        return true;
      }
      if (c == '"') {
        if (string_is_key_) {
          mode_ = Mode::colon;
          // A map's values follow its schema; a free object's are free.
          const std::uint16_t node = frame_node_[depth_ - 1];
          value_node_ = node == JsonSchema::kAny ? JsonSchema::kAny : schema_->nodes[node].item;
          return true;
        }
        return end_value();
      }
      if (c == '\\') {
        mode_ = Mode::string_escape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // A UTF-8 lead byte: strict, as JSON text must be (no overlongs, surrogates or code points past U+10FFFF).
      if (tokenizer::utf8::lead_length(c) < 2) return false;
      pending_ = static_cast<std::uint8_t>(tokenizer::utf8::lead_length(c) - 1);
      lead_ = c;
      return true;
    case Mode::string_escape:
      if (c == 'u') {
        mode_ = Mode::string_unicode;
        pending_ = 4;
        return true;
      }
      if (surrogate_ != Surrogate::none) return false;
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      mode_ = Mode::string;
      return true;
    case Mode::string_unicode: {
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex) return false;
      // UTF-16 surrogates come in pairs, \uD800-\uDBFF then \uDC00-\uDFFF: strict parsers refuse a lone half. The
      // first two digits decide: D8-DB opens a pair, DC-DF closes one and is refused anywhere else.
      const unsigned lower = c | 0x20U;
      if (pending_ == 4) {
        if (surrogate_ == Surrogate::low_due && lower != 'd') return false;
        first_digit_d_ = lower == 'd';
      } else if (pending_ == 3 && first_digit_d_) {
        const bool high = lower == '8' || lower == '9' || lower == 'a' || lower == 'b';
        const bool low = lower >= 'c' && lower <= 'f';
        if (surrogate_ == Surrogate::low_due) {
          if (!low) return false;
        } else if (low) {
          return false;
        } else if (high) {
          surrogate_ = Surrogate::high_seen;
        }
      }
      if (--pending_ == 0) {
        mode_ = Mode::string;
        surrogate_ = surrogate_ == Surrogate::high_seen ? Surrogate::low_due : Surrogate::none;
      }
      return true;
    }
    case Mode::literal_set: return literal_step(c);
    case Mode::literal:
      if (c != static_cast<unsigned char>(*literal_)) return false;
      if (*++literal_ == '\0') return end_value();
      return true;
    case Mode::number: {
      const bool digit = c >= '0' && c <= '9';
      // Bounded so that every number fits a double (parsers refuse 1e400): 64 bytes, exponents of 2 digits.
      const bool ends = !digit && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-';
      if (!ends && ++number_length_ > kMaxNumberLength) return false;
      // '.', 'e' and an exponent's sign need a digit after them: one that would leave no room for it would leave
      // no byte to continue with (sampling would have no token but to stop mid-object).
      if (!digit && !ends && number_length_ >= kMaxNumberLength) return false;
      switch (number_) {
        case Num::minus:
          if (c == '0') {
            number_ = Num::zero;
          } else if (digit) {
            number_ = Num::integer;
          } else {
            return false;
          }
          return true;
        case Num::zero:
        case Num::integer:
          if (digit && number_ == Num::integer) return true;
          if (integer_only_) break;  // schema "integer": no fraction, no exponent
          if (c == '.') {
            number_ = Num::dot;
            return true;
          }
          if (c == 'e' || c == 'E') {
            number_ = Num::exp_mark;
            return true;
          }
          break;  // the number ends here
        case Num::dot:
          if (!digit) return false;
          number_ = Num::fraction;
          return true;
        case Num::fraction:
          if (digit) return true;
          if (c == 'e' || c == 'E') {
            number_ = Num::exp_mark;
            return true;
          }
          break;
        case Num::exp_mark:
          if (c == '+' || c == '-') {
            number_ = Num::exp_sign;
            return true;
          }
          [[fallthrough]];
        case Num::exp_sign:
          if (!digit) return false;
          number_ = Num::exponent;
          exponent_digits_ = 1;
          return true;
        case Num::exponent:
          if (digit) return ++exponent_digits_ <= 2;
          break;
      }
      // A complete number followed by something else: that byte belongs to what follows the value.
      mode_ = Mode::after_value;
      return after_value(c);
    }
  }
  return false;
}

JsonTokenMask::JsonTokenMask(const tokenizer::Tokenizer& tokenizer, std::size_t vocab,
                             std::span<const std::int64_t> end_tokens)
    : bytes_(vocab),
      first_(vocab, 0),
      second_(vocab, 0),
      length_(vocab, 0),
      kind_(vocab, never),
      end_tokens_(end_tokens.begin(), end_tokens.end()) {
  for (std::size_t id = 0; id < vocab; ++id) {
    const auto t = static_cast<tokenizer::TokenId>(id);
    std::string b = tokenizer.token_bytes(t).value_or("");
    if (tokenizer.is_special(t) ||
        std::find(end_tokens.begin(), end_tokens.end(), static_cast<std::int64_t>(id)) != end_tokens.end() ||
        b.empty()) {
      bytes_[id] = std::move(b);  // never allowed in the JSON; a thinking block's end may still be read from it
      continue;
    }
    bool is_plain = true;
    for (std::size_t i = 0; i < b.size() && is_plain;) {
      const auto c = static_cast<unsigned char>(b[i]);
      if (c >= 0x80) {
        const std::size_t n = tokenizer::utf8::valid_sequence_length(b, i);
        is_plain = n > 0;
        i += n;
      } else {
        is_plain = c >= 0x20 && c != '"' && c != '\\';
        ++i;
      }
    }
    first_[id] = static_cast<std::uint8_t>(b[0]);
    if (b.size() > 1) second_[id] = static_cast<std::uint8_t>(b[1]);
    length_[id] = static_cast<std::uint8_t>(std::min<std::size_t>(b.size(), 255));
    kind_[id] = is_plain ? plain : other;
    bytes_[id] = std::move(b);
  }
}

void JsonTokenMask::allowed(const JsonConstraint& json, std::vector<std::uint8_t>& allowed) const {
  // Most tokens fail on their first or second byte (after a value, " the" passes its space, not its 't'): each
  // first byte is tested once, and the second bytes after an accepted first once that first byte is needed.
  std::array<std::uint8_t, 256> first{};
  std::array<JsonConstraint, 256> after{};
  for (int b = 0; b < 256; ++b) {
    after[static_cast<std::size_t>(b)] = json;
    first[static_cast<std::size_t>(b)] = after[static_cast<std::size_t>(b)].step(static_cast<unsigned char>(b));
  }
  std::array<std::uint8_t, 256> row_ready{};
  std::vector<std::uint8_t> second(256 * 256, 0);
  auto second_ok = [&](unsigned b, unsigned c) {
    if (!row_ready[b]) {
      for (unsigned x = 0; x < 256; ++x) second[b * 256 + x] = after[b].accepts_byte(static_cast<unsigned char>(x));
      row_ready[b] = 1;
    }
    return second[b * 256 + c] != 0;
  };
  const bool plain_ok = json.in_plain_string();
  allowed.assign(bytes_.size(), 0);
  for (std::size_t id = 0; id < bytes_.size(); ++id) {
    if (kind_[id] == never || !first[first_[id]]) continue;
    if (length_[id] == 1 || (kind_[id] == plain && plain_ok)) {
      allowed[id] = 1;
    } else if (second_ok(first_[id], second_[id])) {
      allowed[id] = length_[id] == 2 || json.accepts(bytes_[id]);
    }
  }
}

void JsonTokenMask::allowed_but_end(std::vector<std::uint8_t>& allowed) const {
  allowed.assign(bytes_.size(), 1);
  for (const std::int64_t e : end_tokens_) {
    if (e >= 0 && static_cast<std::size_t>(e) < allowed.size()) allowed[static_cast<std::size_t>(e)] = 0;
  }
}

const std::string& JsonTokenMask::bytes(std::int32_t id) const {
  static const std::string none;
  return id >= 0 && static_cast<std::size_t>(id) < bytes_.size() ? bytes_[static_cast<std::size_t>(id)] : none;
}

namespace {
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
}  // namespace

JsonAnswer::JsonAnswer(const JsonSchema* schema, Thinking thinking)
    : json_(schema),
      state_(thinking == Thinking::none       ? State::json
             : thinking == Thinking::may_open ? State::may_open
                                              : State::inside) {}

void JsonAnswer::allowed(const JsonTokenMask& tokens, std::vector<std::uint8_t>& allowed) const {
  if (state_ == State::json) return tokens.allowed(json_, allowed);
  if (state_ == State::inside) return tokens.allowed_but_end(allowed);
  // At the start: the JSON, or the block's opening tag (in one token or several).
  std::vector<std::uint8_t> free;
  tokens.allowed_but_end(free);
  if (held_.empty()) {
    tokens.allowed(json_, allowed);
  } else {
    allowed.assign(free.size(), 0);
  }
  const std::string_view rest = kThinkOpen.substr(held_.size());
  for (std::size_t id = 0; id < allowed.size(); ++id) {
    const std::string& b = tokens.bytes(static_cast<std::int32_t>(id));
    if (free[id] && !b.empty() && (rest.starts_with(b) || std::string_view(b).starts_with(rest))) allowed[id] = 1;
  }
}

void JsonAnswer::push(const JsonTokenMask& tokens, std::int32_t id) {
  const std::string& b = tokens.bytes(id);
  switch (state_) {
    case State::json: json_.advance(b); return;
    case State::may_open: {
      std::string text = held_ + b;
      if (text.starts_with(kThinkOpen)) {
        state_ = State::inside;
        held_ = text.substr(kThinkOpen.size());
        break;
      }
      if (kThinkOpen.starts_with(text)) {
        held_ = std::move(text);
        return;
      }
      state_ = State::json;
      held_.clear();
      json_.advance(b);
      return;
    }
    case State::inside: held_ += b; break;
  }
  // Inside the block: the JSON starts after its closing tag (blank lines before the '{' allowed).
  if (const std::size_t at = held_.find(kThinkClose); at != std::string::npos) {
    const std::string rest = held_.substr(at + kThinkClose.size());
    held_.clear();
    state_ = State::json;
    json_.allow_leading_whitespace();
    if (!rest.empty()) json_.advance(rest);
    return;
  }
  if (held_.size() >= kThinkClose.size()) held_.erase(0, held_.size() - (kThinkClose.size() - 1));
}

}  // namespace colibri::engine
