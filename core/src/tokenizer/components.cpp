// Normalizers, pre-tokenizers, post-processors and decoders of tokenizer.json, each following the HuggingFace
// tokenizers implementation's observable behaviour (including its quirks, e.g. Metaspace decoding drops every
// replacement character of the first token).
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <limits>

#include "tokenizer/pipeline.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::tokenizer::detail {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw ParseError{path, message};
}

const json& require(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end()) fail(path, std::string("missing key \"") + key + "\"");
  return *it;
}

std::string require_string(const json& j, const char* key, const std::string& path) {
  const json& v = require(j, key, path);
  if (!v.is_string()) fail(path + "." + key, "expected a string");
  return v.get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(path + "." + key, "expected true or false");
  return it->get<bool>();
}

std::string type_of(const json& j, const std::string& path) {
  if (!j.is_object()) fail(path, "expected an object with a \"type\"");
  return require_string(j, "type", path);
}

bool is_unicode_whitespace(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

// A pattern given as {"String": "..."} (literal) or {"Regex": "..."} (Oniguruma).
struct Pattern {
  std::string literal;
  std::optional<OnigRegex> regex;

  static Pattern parse(const json& j, const std::string& path) {
    if (!j.is_object() || j.size() != 1) fail(path, "expected {\"String\": ...} or {\"Regex\": ...}");
    Pattern p;
    if (auto s = j.find("String"); s != j.end() && s->is_string()) {
      p.literal = s->get<std::string>();
      return p;
    }
    if (auto r = j.find("Regex"); r != j.end() && r->is_string()) {
      auto compiled = OnigRegex::compile(r->get<std::string>());
      if (!compiled) fail(path + ".Regex", compiled.error().message());
      p.regex = std::move(*compiled);
      return p;
    }
    fail(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }

  // (start, end) byte ranges of non-overlapping matches.
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> matches(std::string_view text) const {
    if (regex) return regex->find_all(text);
    std::vector<std::pair<std::size_t, std::size_t>> out;
    if (literal.empty()) return out;
    for (std::size_t pos = text.find(literal); pos != std::string_view::npos; pos = text.find(literal, pos)) {
      out.emplace_back(pos, pos + literal.size());
      pos += literal.size();
    }
    return out;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Normalizers

class SequenceNormalizer final : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> parts;
  void normalize(std::string& text) const override {
    for (const auto& p : parts) p->normalize(text);
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  std::string prepend;
  void normalize(std::string& text) const override {
    if (!text.empty()) text = prepend + text;
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  Pattern pattern;
  std::string content;
  void normalize(std::string& text) const override {
    const auto found = pattern.matches(text);
    if (found.empty()) return;
    std::string out;
    out.reserve(text.size());
    std::size_t last = 0;
    for (const auto& [s, e] : found) {
      out.append(text, last, s - last);
      out += content;
      last = e;
    }
    out.append(text, last, std::string::npos);
    text = std::move(out);
  }
};

class UnicodeNormalizer final : public Normalizer {
 public:
  enum class Form { nfc, nfd, nfkc, nfkd };
  explicit UnicodeNormalizer(Form form) {
    UErrorCode err = U_ZERO_ERROR;
    switch (form) {
      case Form::nfc: norm_ = unorm2_getNFCInstance(&err); break;
      case Form::nfd: norm_ = unorm2_getNFDInstance(&err); break;
      case Form::nfkc: norm_ = unorm2_getNFKCInstance(&err); break;
      case Form::nfkd: norm_ = unorm2_getNFKDInstance(&err); break;
    }
    if (U_FAILURE(err)) norm_ = nullptr;
  }
  [[nodiscard]] bool ok() const { return norm_ != nullptr; }
  void normalize(std::string& text) const override {
    // ASCII is invariant under every normalization form.
    if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return;
    const std::u16string in = utf8::to_utf16(text);
    UErrorCode err = U_ZERO_ERROR;
    if (unorm2_isNormalized(norm_, reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()), &err) &&
        U_SUCCESS(err)) {
      return;
    }
    err = U_ZERO_ERROR;
    std::u16string out(in.size() * 4 + 16, u'\0');
    const int32_t n =
        unorm2_normalize(norm_, reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()),
                         reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &err);
    if (U_FAILURE(err)) return;
    out.resize(static_cast<std::size_t>(n));
    text = utf8::from_utf16(out);
  }

 private:
  const UNormalizer2* norm_ = nullptr;
};

// Lowercases code point by code point (full case mapping, no context), as Rust's char::to_lowercase does.
class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    std::size_t i = 0;
    while (i < text.size()) {
      const char32_t cp = utf8::next_code_point(text, i);
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        continue;
      }
      std::u16string one;
      std::string tmp;
      utf8::append(tmp, cp);
      one = utf8::to_utf16(tmp);
      std::u16string lowered(8, u'\0');
      UErrorCode err = U_ZERO_ERROR;
      const int32_t n =
          u_strToLower(reinterpret_cast<UChar*>(lowered.data()), static_cast<int32_t>(lowered.size()),
                       reinterpret_cast<const UChar*>(one.data()), static_cast<int32_t>(one.size()), "", &err);
      if (U_FAILURE(err)) {
        out += tmp;
        continue;
      }
      lowered.resize(static_cast<std::size_t>(n));
      out += utf8::from_utf16(lowered);
    }
    text = std::move(out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  bool left = true;
  bool right = true;
  void normalize(std::string& text) const override {
    std::size_t begin = 0;
    std::size_t end = text.size();
    if (left) {
      while (begin < end) {
        std::size_t i = begin;
        if (!is_unicode_whitespace(utf8::next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right) {
      while (end > begin) {
        std::size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        std::size_t i = start;
        if (!is_unicode_whitespace(utf8::next_code_point(text, i))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }
};

// Removes nonspacing marks (applied after NFD in practice).
class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    std::size_t i = 0;
    while (i < text.size()) {
      const std::size_t start = i;
      const char32_t cp = utf8::next_code_point(text, i);
      if (u_charType(static_cast<UChar32>(cp)) == U_NON_SPACING_MARK) continue;
      out.append(text, start, i - start);
    }
    text = std::move(out);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Splitting with HF's SplitDelimiterBehavior.

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior parse_behavior(const json& j, const std::string& path) {
  if (!j.is_string()) fail(path, "expected a split behavior string");
  const auto s = j.get<std::string>();
  if (s == "Removed") return Behavior::removed;
  if (s == "Isolated") return Behavior::isolated;
  if (s == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (s == "MergedWithNext") return Behavior::merged_with_next;
  if (s == "Contiguous") return Behavior::contiguous;
  fail(path,
       "unknown split behavior \"" + s + "\" (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

struct Span {
  std::size_t start;
  std::size_t end;
  bool flag;  // is a match (input) / must be removed (output)
};

// Turns match ranges into a full cover of `text` of (range, is_match), like HF's Pattern::find_matches.
std::vector<Span> cover(std::size_t size, const std::vector<std::pair<std::size_t, std::size_t>>& found, bool invert) {
  std::vector<Span> spans;
  if (size == 0) {
    spans.push_back({0, 0, false != invert});
    return spans;
  }
  std::size_t prev = 0;
  for (const auto& [s, e] : found) {
    if (prev != s) spans.push_back({prev, s, invert});
    spans.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != size) spans.push_back({prev, size, invert});
  return spans;
}

std::vector<Span> apply_behavior(std::vector<Span> matches, Behavior behavior) {
  std::vector<Span> out;
  out.reserve(matches.size());
  switch (behavior) {
    case Behavior::isolated:
      for (auto m : matches) out.push_back({m.start, m.end, false});
      return out;
    case Behavior::removed: return matches;
    case Behavior::contiguous: {
      bool previous = false;
      for (auto m : matches) {
        if (m.flag == previous && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.start, m.end, false});
        }
        previous = m.flag;
      }
      return out;
    }
    case Behavior::merged_with_previous: {
      bool previous = false;
      for (auto m : matches) {
        if (m.flag && !previous && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.start, m.end, false});
        }
        previous = m.flag;
      }
      return out;
    }
    case Behavior::merged_with_next: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back({it->start, it->end, false});
        }
        previous = it->flag;
      }
      std::reverse(out.begin(), out.end());
      return out;
    }
  }
  return out;
}

// Replaces each non-added piece by its splits; empty splits are dropped (HF does the same).
template <typename SplitFn>
void split_pieces(std::vector<Piece>& pieces, SplitFn&& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (auto& piece : pieces) {
    if (piece.added >= 0) {
      out.push_back(std::move(piece));
      continue;
    }
    const std::size_t before = out.size();
    split(piece, out);
    for (std::size_t k = before; k < out.size(); ++k) out[k].added = -1;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const Piece& p) { return p.added < 0 && p.text.empty(); }),
            out.end());
  pieces = std::move(out);
}

void emit_spans(const Piece& piece, const std::vector<Span>& spans, std::vector<Piece>& out) {
  for (const auto& s : spans) {
    if (s.flag) continue;
    Piece p;
    p.text = piece.text.substr(s.start, s.end - s.start);
    p.at_origin = piece.at_origin && s.start == 0;
    out.push_back(std::move(p));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Pre-tokenizers

class SequencePreTokenizer final : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts) p->pre_tokenize(pieces);
  }
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  Pattern pattern;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const Piece& piece, std::vector<Piece>& out) {
      emit_spans(piece, apply_behavior(cover(piece.text.size(), pattern.matches(piece.text), invert), behavior), out);
    });
  }
};

// Splits on single characters chosen by a predicate (HF's Fn(char) -> bool pattern: one match per character).
template <typename Pred>
std::vector<std::pair<std::size_t, std::size_t>> char_matches(std::string_view text, Pred pred) {
  std::vector<std::pair<std::size_t, std::size_t>> found;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    const char32_t cp = utf8::next_code_point(text, i);
    if (pred(cp)) found.emplace_back(start, i);
  }
  return found;
}

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  bool individual = false;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const Piece& piece, std::vector<Piece>& out) {
      auto found = char_matches(piece.text, [](char32_t c) { return u_isdigit(static_cast<UChar32>(c)) != 0; });
      emit_spans(piece,
                 apply_behavior(cover(piece.text.size(), found, false),
                                individual ? Behavior::isolated : Behavior::contiguous),
                 out);
    });
  }
};

class WhitespaceSplitPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [](const Piece& piece, std::vector<Piece>& out) {
      auto found = char_matches(piece.text, [](char32_t c) { return is_unicode_whitespace(c); });
      emit_spans(piece, apply_behavior(cover(piece.text.size(), found, false), Behavior::removed), out);
    });
  }
};

class PunctuationPreTokenizer final : public PreTokenizer {
 public:
  Behavior behavior = Behavior::isolated;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const Piece& piece, std::vector<Piece>& out) {
      auto found = char_matches(piece.text, [](char32_t c) {
        return (c < 0x80 && std::ispunct(static_cast<int>(c))) || u_ispunct(static_cast<UChar32>(c));
      });
      emit_spans(piece, apply_behavior(cover(piece.text.size(), found, false), behavior), out);
    });
  }
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  std::string replacement;
  enum class Prepend { always, first, never } prepend = Prepend::always;
  bool split = true;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const Piece& piece, std::vector<Piece>& out) {
      Piece p = piece;
      std::string replaced;
      replaced.reserve(p.text.size());
      for (char c : p.text) {
        if (c == ' ') {
          replaced += replacement;
        } else {
          replaced.push_back(c);
        }
      }
      p.text = std::move(replaced);
      const bool starts = p.text.rfind(replacement, 0) == 0;
      if ((prepend == Prepend::always && !starts) || (prepend == Prepend::first && !starts && piece.at_origin)) {
        p.text = replacement + p.text;
      }
      if (!split) {
        out.push_back(std::move(p));
        return;
      }
      std::vector<std::pair<std::size_t, std::size_t>> found;
      for (std::size_t pos = p.text.find(replacement); pos != std::string::npos;
           pos = p.text.find(replacement, pos + replacement.size())) {
        found.emplace_back(pos, pos + replacement.size());
      }
      emit_spans(p, apply_behavior(cover(p.text.size(), found, false), Behavior::merged_with_next), out);
    });
  }
};

const OnigRegex& byte_level_regex() {
  static const OnigRegex re =
      std::move(*OnigRegex::compile(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"));
  return re;
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  bool add_prefix_space = true;
  bool use_regex = true;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const Piece& piece, std::vector<Piece>& out) {
      Piece p = piece;
      if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (use_regex) {
        emit_spans(p,
                   apply_behavior(cover(p.text.size(), byte_level_regex().find_all(p.text), false), Behavior::isolated),
                   out);
      } else {
        out.push_back(std::move(p));
      }
    });
    const auto& table = byte_level_chars();
    for (auto& piece : pieces) {
      if (piece.added >= 0) continue;
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += table[static_cast<unsigned char>(c)];
      piece.text = std::move(mapped);
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Post-processors

class TemplatePostProcessor final : public PostProcessor {
 public:
  std::vector<TokenId> before;
  std::vector<TokenId> after;
  void process(std::vector<TokenId>& ids, bool add_special) const override {
    if (!add_special) return;
    ids.insert(ids.begin(), before.begin(), before.end());
    ids.insert(ids.end(), after.begin(), after.end());
  }
  [[nodiscard]] std::vector<TokenId> prefix_ids() const override { return before; }
  [[nodiscard]] std::vector<TokenId> suffix_ids() const override { return after; }
};

class NoopPostProcessor final : public PostProcessor {
 public:
  void process(std::vector<TokenId>&, bool) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  std::vector<std::unique_ptr<PostProcessor>> parts;
  void process(std::vector<TokenId>& ids, bool add_special) const override {
    for (const auto& p : parts) p->process(ids, add_special);
  }
  [[nodiscard]] std::vector<TokenId> prefix_ids() const override {
    std::vector<TokenId> out;
    for (const auto& p : parts) {
      auto v = p->prefix_ids();
      out.insert(out.begin(), v.begin(), v.end());
    }
    return out;
  }
  [[nodiscard]] std::vector<TokenId> suffix_ids() const override {
    std::vector<TokenId> out;
    for (const auto& p : parts) {
      auto v = p->suffix_ids();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Decoders

class SequenceDecoder final : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> parts;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts) p->decode_chain(tokens);
  }
  void piece_bytes(std::string& token) const override {
    for (const auto& p : parts) p->piece_bytes(token);
  }
};

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) append_bytes(bytes, t);
    tokens.assign(1, utf8::to_valid_lossy(bytes));
  }
  void piece_bytes(std::string& token) const override {
    std::string bytes;
    append_bytes(bytes, token);
    token = std::move(bytes);
  }

 private:
  static void append_bytes(std::string& bytes, const std::string& t) {
    const std::size_t mark = bytes.size();
    std::size_t i = 0;
    while (i < t.size()) {
      const int b = byte_level_byte(utf8::next_code_point(t, i));
      if (b < 0) {
        bytes.resize(mark);
        bytes += t;  // not a byte-level token (e.g. an added token): its own UTF-8 bytes
        return;
      }
      bytes.push_back(static_cast<char>(b));
    }
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceNormalizer replace;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) replace.normalize(t);
  }
  void piece_bytes(std::string& token) const override { replace.normalize(token); }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8::is_valid(pending)) {
        out.push_back(pending);
      } else {
        for (std::size_t k = 0; k < pending.size(); ++k) out.emplace_back(utf8::kReplacementChar);
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      const int byte = fallback_byte(t);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  void piece_bytes(std::string& token) const override {
    if (const int byte = fallback_byte(token); byte >= 0) token.assign(1, static_cast<char>(byte));
  }

 private:
  // The byte of a "<0xE6>" token, or -1.
  static int fallback_byte(const std::string& t) {
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
      return std::stoi(t.substr(3, 2), nullptr, 16);
    }
    return -1;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  char32_t content = ' ';
  std::size_t start = 0;
  std::size_t stop = 0;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<std::size_t, char32_t>> chars;  // byte offset, code point
      std::size_t i = 0;
      while (i < t.size()) {
        const std::size_t at = i;
        chars.emplace_back(at, utf8::next_code_point(t, i));
      }
      std::size_t start_cut = 0;
      for (std::size_t k = 0; k < start && k < chars.size(); ++k) {
        if (chars[k].second != content) break;
        start_cut = k + 1;
      }
      std::size_t stop_cut = chars.size();
      for (std::size_t k = 0; k < stop && k < chars.size(); ++k) {
        const std::size_t index = chars.size() - k - 1;
        if (chars[index].second != content) break;
        stop_cut = index;
      }
      if (start_cut >= stop_cut) {
        t.clear();
        continue;
      }
      const std::size_t b0 = start_cut < chars.size() ? chars[start_cut].first : t.size();
      const std::size_t b1 = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b0, b1 - b0);
    }
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  std::string replacement;
  bool prepend = true;
  void decode_chain(std::vector<std::string>& tokens) const override {
    // As HF: the first token's replacements are dropped when a space was prepended at encoding.
    for (std::size_t k = 0; k < tokens.size(); ++k) tokens[k] = spaced(tokens[k], k == 0 && prepend);
  }
  void piece_bytes(std::string& token) const override { token = spaced(token, false); }

 private:
  // `t` with each replacement made a space, or dropped.
  std::string spaced(const std::string& t, bool drop) const {
    std::string out;
    for (std::size_t pos = 0; pos < t.size();) {
      if (t.compare(pos, replacement.size(), replacement) == 0) {
        if (!drop) out.push_back(' ');
        pos += replacement.size();
      } else {
        out.push_back(t[pos++]);
      }
    }
    return out;
  }
};

MetaspacePreTokenizer::Prepend parse_prepend_scheme(const json& j, const std::string& path) {
  auto scheme = j.find("prepend_scheme");
  if (scheme != j.end() && scheme->is_string()) {
    const auto s = scheme->get<std::string>();
    if (s == "always") return MetaspacePreTokenizer::Prepend::always;
    if (s == "first") return MetaspacePreTokenizer::Prepend::first;
    if (s == "never") return MetaspacePreTokenizer::Prepend::never;
    fail(path + ".prepend_scheme", "expected \"always\", \"first\" or \"never\"");
  }
  return get_bool(j, "add_prefix_space", true, path) ? MetaspacePreTokenizer::Prepend::always
                                                     : MetaspacePreTokenizer::Prepend::never;
}

std::string single_char(const json& j, const char* key, const std::string& path, const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail(path + "." + key, "expected a one-character string");
  auto s = it->get<std::string>();
  std::size_t i = 0;
  if (s.empty()) fail(path + "." + key, "expected a one-character string");
  utf8::next_code_point(s, i);
  if (i != s.size()) fail(path + "." + key, "expected a one-character string");
  return s;
}

template <typename T, typename Factory>
void parse_list(const json& j, const char* key, const std::string& path, std::vector<std::unique_ptr<T>>& out,
                Factory&& make) {
  const json& list = require(j, key, path);
  if (!list.is_array()) fail(path + "." + key, "expected an array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto part = make(list[i], path + "." + key + "[" + std::to_string(i) + "]");
    if (part) out.push_back(std::move(part));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

json byte_level_json(bool use_regex, bool trim_offsets) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", trim_offsets}, {"use_regex", use_regex}};
}

json split_then_byte_level_json(std::string_view regex) {
  return {{"type", "Sequence"},
          {"pretokenizers", json::array({{{"type", "Split"},
                                          {"pattern", {{"Regex", std::string(regex)}}},
                                          {"behavior", "Isolated"},
                                          {"invert", false}},
                                         byte_level_json(false)})}};
}

json byte_level_bpe_json(json vocab, json merges, bool ignore_merges) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", ignore_merges},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8::append(t[static_cast<std::size_t>(b)], cp);
    }
    return t;
  }();
  return table;
}

int byte_level_byte(char32_t cp) {
  static const std::array<int, 512> reverse = [] {
    std::array<int, 512> r{};
    r.fill(-1);
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      std::size_t i = 0;
      const char32_t c = utf8::next_code_point(chars[static_cast<std::size_t>(b)], i);
      r[c] = b;
    }
    return r;
  }();
  return cp < 512 ? reverse[cp] : -1;
}

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, path);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNormalizer>();
    parse_list(j, "normalizers", path, seq->parts, make_normalizer);
    return seq;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prepend = require_string(j, "prepend", path);
    return n;
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    n->pattern = Pattern::parse(require(j, "pattern", path), path + ".pattern");
    n->content = require_string(j, "content", path);
    return n;
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    using F = UnicodeNormalizer::Form;
    const F form = type == "NFC" ? F::nfc : type == "NFD" ? F::nfd : type == "NFKC" ? F::nfkc : F::nfkd;
    auto n = std::make_unique<UnicodeNormalizer>(form);
    if (!n->ok()) fail(path, "ICU could not provide the " + type + " normalizer");
    return n;
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = get_bool(j, "strip_left", true, path);
    n->right = get_bool(j, "strip_right", true, path);
    return n;
  }
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  fail(path + ".type", "unsupported normalizer \"" + type +
                           "\" (supported: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                           "StripAccents)");
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, path);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePreTokenizer>();
    parse_list(j, "pretokenizers", path, seq->parts, make_pre_tokenizer);
    return seq;
  }
  if (type == "Split") {
    auto p = std::make_unique<SplitPreTokenizer>();
    p->pattern = Pattern::parse(require(j, "pattern", path), path + ".pattern");
    p->behavior = parse_behavior(require(j, "behavior", path), path + ".behavior");
    p->invert = get_bool(j, "invert", false, path);
    return p;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = get_bool(j, "add_prefix_space", true, path);
    p->use_regex = get_bool(j, "use_regex", true, path);
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = single_char(j, "replacement", path, "\xE2\x96\x81");
    p->prepend = parse_prepend_scheme(j, path);
    p->split = get_bool(j, "split", true, path);
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = get_bool(j, "individual_digits", false, path);
    return p;
  }
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Whitespace") {
    auto p = std::make_unique<SplitPreTokenizer>();
    p->pattern.regex = std::move(*OnigRegex::compile(R"(\w+|[^\w\s]+)"));
    p->behavior = Behavior::removed;
    p->invert = true;
    return p;
  }
  if (type == "Punctuation") {
    auto p = std::make_unique<PunctuationPreTokenizer>();
    if (auto b = j.find("behavior"); b != j.end()) p->behavior = parse_behavior(*b, path + ".behavior");
    return p;
  }
  fail(path + ".type", "unsupported pre-tokenizer \"" + type +
                           "\" (supported: Sequence, Split, ByteLevel, Metaspace, Digits, Whitespace, "
                           "WhitespaceSplit, Punctuation)");
}

std::unique_ptr<PostProcessor> make_affix_post_processor(std::vector<TokenId> before, std::vector<TokenId> after) {
  auto t = std::make_unique<TemplatePostProcessor>();
  t->before = std::move(before);
  t->after = std::move(after);
  return t;
}

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& path, const BpeModel& model,
                                                   const Vocab& added) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, path);
  if (type == "ByteLevel") return std::make_unique<NoopPostProcessor>();
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePostProcessor>();
    parse_list(j, "processors", path, seq->parts,
               [&](const json& item, const std::string& p) { return make_post_processor(item, p, model, added); });
    return seq;
  }
  auto resolve = [&](const json& pair, const std::string& where) -> TokenId {
    // ["<s>", 1] pairs of Bert/Roberta processing.
    if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) fail(where, "expected [token, id]");
    return pair[1].get<TokenId>();
  };
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto t = std::make_unique<TemplatePostProcessor>();
    t->before.push_back(resolve(require(j, "cls", path), path + ".cls"));
    t->after.push_back(resolve(require(j, "sep", path), path + ".sep"));
    return t;
  }
  if (type == "TemplateProcessing") {
    auto t = std::make_unique<TemplatePostProcessor>();
    const json& single = require(j, "single", path);
    const json& specials = require(j, "special_tokens", path);
    if (!single.is_array()) fail(path + ".single", "expected an array of template pieces");
    bool seen_sequence = false;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const std::string where = path + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (item.contains("Sequence")) {
        if (seen_sequence) fail(where, "a single-sequence template holds one Sequence");
        seen_sequence = true;
        continue;
      }
      auto st = item.find("SpecialToken");
      if (st == item.end() || !st->contains("id") || !(*st)["id"].is_string()) {
        fail(where, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
      }
      const auto name = (*st)["id"].get<std::string>();
      auto def = specials.find(name);
      if (def == specials.end() || !def->contains("ids") || !(*def)["ids"].is_array()) {
        fail(path + ".special_tokens", "special token \"" + name + "\" used in the template is not defined");
      }
      auto& target = seen_sequence ? t->after : t->before;
      for (const auto& id : (*def)["ids"]) {
        if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
            id.get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
          fail(path + ".special_tokens." + name + ".ids", "expected non-negative integer token ids");
        }
        target.push_back(id.get<TokenId>());
      }
    }
    if (!seen_sequence) fail(path + ".single", "template has no {\"Sequence\": ...} piece");
    return t;
  }
  fail(path + ".type", "unsupported post-processor \"" + type +
                           "\" (supported: TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, "
                           "Sequence)");
}

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, path);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceDecoder>();
    parse_list(j, "decoders", path, seq->parts, make_decoder);
    return seq;
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDecoder>();
    d->replace.pattern = Pattern::parse(require(j, "pattern", path), path + ".pattern");
    d->replace.content = require_string(j, "content", path);
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    const std::string c = single_char(j, "content", path, " ");
    std::size_t i = 0;
    d->content = utf8::next_code_point(c, i);
    const json& start = require(j, "start", path);
    const json& stop = require(j, "stop", path);
    if (!start.is_number_unsigned() || !stop.is_number_unsigned()) fail(path, "start/stop must be non-negative");
    d->start = start.get<std::size_t>();
    d->stop = stop.get<std::size_t>();
    return d;
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = single_char(j, "replacement", path, "\xE2\x96\x81");
    d->prepend = parse_prepend_scheme(j, path) != MetaspacePreTokenizer::Prepend::never;
    return d;
  }
  fail(path + ".type", "unsupported decoder \"" + type +
                           "\" (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)");
}

}  // namespace colibri::tokenizer::detail
