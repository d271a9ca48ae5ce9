// A small Jinja interpreter for chat templates (Debian has no C++ Jinja library). Values, printing, tests and
// filters follow Python Jinja2 as transformers sets it up (tests/reference/template_reference.py is the reference):
// chat templates are written and checked against that.
#include "chat/jinja.hpp"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <optional>
#include <set>

#include "chat/python_escape.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::chat::jinja {

namespace utf8 = tokenizer::utf8;

const Value* Object::find(std::string_view key) const {
  charge(items.size() / 16);  // a linear search: huge dicts cost more
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  const int d = v.nesting() + 1;
  if (d > kMaxValueDepth) {
    throw Error{0, "lists/dicts are nested too deeply (limit " + std::to_string(kMaxValueDepth) + ")"};
  }
  depth = std::max(depth, d);
  for (auto& [k, existing] : items) {
    if (k == key) {
      existing = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

int Value::nesting() const {
  switch (kind) {
    case Kind::array:
    case Kind::function: return depth;
    case Kind::object:
    case Kind::kwargs: return obj->depth;
    case Kind::ns: return 1;
    default: return 0;
  }
}

Value Value::array(Array v) {
  if (v.size() > kMaxItems) throw Error{0, "list is too long (limit " + std::to_string(kMaxItems) + " items)"};
  int d = 0;
  for (const auto& e : v) d = std::max(d, e.nesting());
  if (d + 1 > kMaxValueDepth) {
    throw Error{0, "lists/dicts are nested too deeply (limit " + std::to_string(kMaxValueDepth) + ")"};
  }
  charge(v.size());
  Value r = make(Kind::array);
  r.depth = static_cast<std::uint16_t>(d + 1);
  r.arr = std::make_shared<Array>(std::move(v));
  return r;
}

namespace {

[[noreturn]] void fail(int line, std::string message) {
  throw Error{line, std::move(message)};
}

// Per render; a thread renders one template at a time.
struct RenderState {
  std::uint64_t steps = 0;
  int eval_depth = 0;
  int map_depth = 0;  // map('map', 'map', ...) nests filter calls, whose frames are large
  std::vector<std::shared_ptr<Object>> namespaces;
};
thread_local RenderState* t_state = nullptr;
thread_local std::uint64_t t_last_steps = 0;

void check_size(std::size_t bytes, int line) {
  if (bytes > kMaxOutputBytes) {
    fail(line, "template output or string is too large (limit " + std::to_string(kMaxOutputBytes >> 20) + " MiB)");
  }
}

[[noreturn]] void overflow(int line, const std::string& what) {
  fail(line, "integer overflow in " + what + " (integers are 64-bit)");
}

// A double as int64 (truncated toward zero), or an error: out-of-range conversions are undefined behaviour.
std::int64_t to_int64(double d, int line) {
  if (std::isnan(d)) fail(line, "cannot convert NaN to an integer");
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
    overflow(line, "conversion of a float to an integer");
  return static_cast<std::int64_t>(d);
}

// ---------------------------------------------------------------------------------------------------------------
// Source preprocessing (trim_blocks, lstrip_blocks, trailing newline) with a line number per character.

struct Source {
  std::string text;
  std::vector<int> line;  // line[i] = original line of text[i]
};

bool is_line_break(char c) {
  return c == '\n' || c == '\r';
}

Source preprocess(std::string_view src) {
  Source s;
  int line = 1;
  for (std::size_t i = 0; i < src.size(); ++i) {
    char c = src[i];
    if (c == '\r') {  // \r\n and a lone \r are new lines, as Jinja reads them
      if (i + 1 < src.size() && src[i + 1] == '\n') continue;
      c = '\n';
    }
    s.text.push_back(c);
    s.line.push_back(line);
    if (c == '\n') ++line;
  }
  if (!s.text.empty() && s.text.back() == '\n') {
    s.text.pop_back();
    s.line.pop_back();
  }
  // lstrip_blocks: spaces and tabs at the start of a line before "{%", "{#" (and "{-").
  {
    Source out;
    std::size_t i = 0;
    while (i < s.text.size()) {
      const bool line_start = i == 0 || is_line_break(s.text[i - 1]);
      if (line_start) {
        std::size_t j = i;
        while (j < s.text.size() && (s.text[j] == ' ' || s.text[j] == '\t')) ++j;
        const bool keep = j + 2 < s.text.size() && s.text[j + 2] == '+';  // "{%+" keeps the line's indentation
        if (j + 1 < s.text.size() && s.text[j] == '{' && !keep &&
            (s.text[j + 1] == '%' || s.text[j + 1] == '#' || s.text[j + 1] == '-')) {
          i = j;
        }
      }
      out.text.push_back(s.text[i]);
      out.line.push_back(s.line[i]);
      ++i;
    }
    s = std::move(out);
  }
  // trim_blocks: the newline right after "%}", "#}" (and "-}").
  {
    Source out;
    for (std::size_t i = 0; i < s.text.size(); ++i) {
      if (s.text[i] == '\n' && i >= 2 && s.text[i - 1] == '}' &&
          (s.text[i - 2] == '%' || s.text[i - 2] == '#' || s.text[i - 2] == '-')) {
        continue;
      }
      out.text.push_back(s.text[i]);
      out.line.push_back(s.line[i]);
    }
    s = std::move(out);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Lexer

enum class Tok {
  text,
  number,
  string,
  ident,
  equals,
  lparen,
  rparen,
  open_stmt,
  close_stmt,
  open_expr,
  close_expr,
  lbracket,
  rbracket,
  lbrace,
  rbrace,
  comma,
  dot,
  colon,
  pipe,
  additive,
  multiplicative,
  power,
  comparison,
  unary,
  comment
};

struct Token {
  Tok type;
  std::string value;
  int line;
};

// Python's str.isspace() (what strip() and split() remove).
bool is_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
bool is_word(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

std::size_t space_len_at(const std::string& s, std::size_t i) {
  if (i >= s.size()) return 0;
  std::size_t j = i;
  const char32_t cp = utf8::next_code_point(s, j);
  return is_space(cp) ? j - i : 0;
}

// Where the code point that ends at byte `end` starts (UTF-8 continuation bytes are 10xxxxxx).
std::size_t code_point_before(const std::string& s, std::size_t end) {
  std::size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return start;
}

// Python's str.strip() / lstrip() / rstrip(): whitespace, or any of `chars`. Walks only the ends it removes.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<char32_t> set;
  for (std::size_t i = 0; chars != nullptr && i < chars->size();) set.push_back(utf8::next_code_point(*chars, i));
  auto removable = [&](char32_t c) {
    return chars != nullptr ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  std::size_t begin = 0, end = s.size();
  while (left && begin < end) {
    std::size_t next = begin;
    if (!removable(utf8::next_code_point(s, next))) break;
    begin = next;
  }
  while (right && end > begin) {
    const std::size_t start = code_point_before(s, end);
    std::size_t i = start;
    if (!removable(utf8::next_code_point(s, i))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

std::string trim_end(const std::string& s) {
  return strip(s, nullptr, false, true);
}

std::string trim_start(const std::string& s) {
  return strip(s, nullptr, true, false);
}

// The exponent of a float literal (1e20, 2.5E-3), as Jinja's lexer reads one.
void lex_exponent(const std::string& s, std::size_t& pos, std::string& num) {
  if (pos >= s.size() || (s[pos] != 'e' && s[pos] != 'E')) return;
  std::size_t k = pos + 1;
  if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
  if (k >= s.size() || !is_digit(s[k])) return;
  while (k < s.size() && is_digit(s[k])) ++k;
  num += s.substr(pos, k - pos);
  pos = k;
}

// When `{%` at `pos` opens the tag `{% name %}` (with - or + whitespace control), where the text after it
// starts; else npos.
std::size_t raw_tag(const std::string& s, std::size_t pos, std::string_view name, bool& strip_before,
                    bool& strip_after) {
  std::size_t k = pos + 2;
  strip_before = k < s.size() && s[k] == '-';
  if (k < s.size() && (s[k] == '-' || s[k] == '+')) ++k;
  while (k < s.size() && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r')) ++k;
  if (s.compare(k, name.size(), name) != 0) return std::string::npos;
  k += name.size();
  if (k < s.size() && is_word(s[k])) return std::string::npos;
  while (k < s.size() && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r')) ++k;
  strip_after = k < s.size() && s[k] == '-';
  if (k < s.size() && (s[k] == '-' || s[k] == '+')) ++k;
  if (s.compare(k, 2, "%}") != 0) return std::string::npos;
  return k + 2;
}

std::vector<Token> tokenize(const Source& src) {
  const std::string& s = src.text;
  std::vector<Token> tokens;
  std::size_t pos = 0;
  auto line_at = [&](std::size_t p) {
    return p < src.line.size() ? src.line[p] : (src.line.empty() ? 1 : src.line.back());
  };
  auto strip_trailing = [&] {
    if (!tokens.empty() && tokens.back().type == Tok::text) {
      tokens.back().value = trim_end(tokens.back().value);
      if (tokens.back().value.empty()) tokens.pop_back();
    }
  };
  auto skip_leading = [&] {
    while (std::size_t n = space_len_at(s, pos)) pos += n;
  };
  auto push = [&](Tok t, std::string v, std::size_t at) { tokens.push_back(Token{t, std::move(v), line_at(at)}); };

  static const std::vector<std::pair<std::string_view, Tok>> kOrdered = {
      {"{%", Tok::open_stmt},     {"%}", Tok::close_stmt},
      {"{{", Tok::open_expr},     {"}}", Tok::close_expr},
      {"(", Tok::lparen},         {")", Tok::rparen},
      {"{", Tok::lbrace},         {"}", Tok::rbrace},
      {"[", Tok::lbracket},       {"]", Tok::rbracket},
      {",", Tok::comma},          {".", Tok::dot},
      {":", Tok::colon},          {"|", Tok::pipe},
      {"<=", Tok::comparison},    {">=", Tok::comparison},
      {"==", Tok::comparison},    {"!=", Tok::comparison},
      {"<", Tok::comparison},     {">", Tok::comparison},
      {"+", Tok::additive},       {"-", Tok::additive},
      {"~", Tok::additive},       {"**", Tok::power},
      {"*", Tok::multiplicative}, {"//", Tok::multiplicative},
      {"/", Tok::multiplicative}, {"%", Tok::multiplicative},
      {"=", Tok::equals}};

  int brace_depth = 0;
  while (pos < s.size()) {
    const bool after_close = tokens.empty() || tokens.back().type == Tok::close_stmt ||
                             tokens.back().type == Tok::close_expr || tokens.back().type == Tok::comment;
    if (after_close) {
      const std::size_t start = pos;
      while (pos < s.size() &&
             !(s[pos] == '{' && pos + 1 < s.size() && (s[pos + 1] == '%' || s[pos + 1] == '{' || s[pos + 1] == '#'))) {
        ++pos;
      }
      if (pos > start) {
        push(Tok::text, s.substr(start, pos - start), start);
        continue;
      }
    }
    if (s.compare(pos, 2, "{#") == 0) {
      const std::size_t start = pos;
      pos += 2;
      const bool strip_before = pos < s.size() && s[pos] == '-';
      if (strip_before) ++pos;
      const std::size_t end = s.find("#}", pos);
      if (end == std::string::npos) fail(line_at(start), "comment '{#' is never closed with '#}'");
      std::string comment = s.substr(pos, end - pos);
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_before) strip_trailing();
      push(Tok::comment, comment, start);
      pos = end + 2;
      if (strip_after) skip_leading();
      continue;
    }
    if (s.compare(pos, 2, "{%") == 0) {
      // {% raw %}...{% endraw %}: the text between, as it is.
      bool strip_before = false, strip_inside = false;
      if (const std::size_t body = raw_tag(s, pos, "raw", strip_before, strip_inside); body != std::string::npos) {
        std::size_t end = body;
        bool end_strip_before = false, strip_after = false;
        std::size_t after = std::string::npos;
        while ((end = s.find("{%", end)) != std::string::npos) {
          after = raw_tag(s, end, "endraw", end_strip_before, strip_after);
          if (after != std::string::npos) break;
          end += 2;
        }
        if (end == std::string::npos) fail(line_at(pos), "'{% raw %}' is never closed with '{% endraw %}'");
        if (strip_before) strip_trailing();
        std::string text = s.substr(body, end - body);
        if (strip_inside) text = trim_start(text);
        if (end_strip_before) text = trim_end(text);
        push(Tok::text, text, body);
        push(Tok::comment, "", end);  // ends the text run, as a comment does
        pos = after;
        if (strip_after) skip_leading();
        continue;
      }
    }
    if (s.compare(pos, 3, "{%+") == 0) {
      push(Tok::open_stmt, "{%", pos);
      pos += 3;
      continue;
    }
    if (s.compare(pos, 3, "{%-") == 0) {
      strip_trailing();
      push(Tok::open_stmt, "{%", pos);
      pos += 3;
      continue;
    }
    if (s.compare(pos, 3, "{{-") == 0) {
      strip_trailing();
      push(Tok::open_expr, "{{", pos);
      brace_depth = 0;
      pos += 3;
      continue;
    }
    while (std::size_t n = space_len_at(s, pos)) pos += n;
    if (pos >= s.size()) break;
    if (s.compare(pos, 3, "-%}") == 0) {
      push(Tok::close_stmt, "%}", pos);
      pos += 3;
      skip_leading();
      continue;
    }
    if (s.compare(pos, 3, "-}}") == 0) {
      push(Tok::close_expr, "}}", pos);
      pos += 3;
      skip_leading();
      continue;
    }
    const char c = s[pos];
    if (c == '-' || c == '+') {
      if (tokens.empty() || tokens.back().type == Tok::text) fail(line_at(pos), std::string("unexpected '") + c + "'");
      const Tok last = tokens.back().type;
      if (last != Tok::ident && last != Tok::number && last != Tok::string && last != Tok::rparen &&
          last != Tok::rbracket) {
        const std::size_t start = pos++;
        std::string num;
        while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
        if (!num.empty() && pos + 1 < s.size() && s[pos] == '.' && is_digit(s[pos + 1])) {
          num.push_back(s[pos++]);
          while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
        }
        if (!num.empty()) lex_exponent(s, pos, num);
        push(num.empty() ? Tok::unary : Tok::number, std::string(1, c) + num, start);
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : kOrdered) {
      if (seq == "}}" && brace_depth > 0) continue;
      if (s.compare(pos, seq.size(), seq) == 0) {
        push(type, std::string(seq), pos);
        if (type == Tok::open_expr) brace_depth = 0;
        if (type == Tok::lbrace) ++brace_depth;
        if (type == Tok::rbrace) --brace_depth;
        pos += seq.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      const std::size_t start = pos++;
      std::string str;
      while (true) {
        if (pos >= s.size()) fail(line_at(start), "string literal is never closed");
        const char d = s[pos];
        if (d == c) break;
        if (d == '\\') {
          if (++pos >= s.size()) fail(line_at(start), "unexpected end of template in a string literal");
          const std::size_t letter = pos;
          const PythonEscape read = read_python_escape(s, pos, str);
          if (read == PythonEscape::ok || read == PythonEscape::surrogate) continue;
          // \x, \u or \U and its digits: the template ending inside them first, as Python says it.
          const char e = s[letter];
          const std::size_t width = python_hex_escape_width(e);
          if (read == PythonEscape::cut || letter + 1 + width > s.size())
            fail(line_at(start), "invalid escape sequence");
          const std::string hex = s.substr(letter + 1, width);
          if (read == PythonEscape::bad_hex)
            fail(line_at(start), "invalid hexadecimal escape \\" + std::string(1, e) + hex);
          fail(line_at(start), "escape \\" + std::string(1, e) + hex + " is past U+10FFFF");
        }
        str.push_back(d);
        ++pos;
      }
      ++pos;
      push(Tok::string, std::move(str), start);
      continue;
    }
    if (is_digit(c)) {
      const std::size_t start = pos;
      std::string num;
      while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
      if ((tokens.empty() || tokens.back().type != Tok::dot) && pos + 1 < s.size() && s[pos] == '.' &&
          is_digit(s[pos + 1])) {
        num.push_back(s[pos++]);
        while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
      }
      lex_exponent(s, pos, num);
      push(Tok::number, num, start);
      continue;
    }
    if (is_word(c)) {
      const std::size_t start = pos;
      while (pos < s.size() && is_word(s[pos])) ++pos;
      push(Tok::ident, s.substr(start, pos - start), start);
      continue;
    }
    fail(line_at(pos), std::string("unexpected character '") + c + "'");
  }
  return tokens;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// AST

struct Node {
  enum class T {
    text,
    set,
    if_,
    for_,
    macro,
    break_,
    continue_,
    int_lit,
    float_lit,
    str_lit,
    array,
    tuple,
    object,
    ident,
    member,
    call,
    binary,
    unary,
    filter,
    test,
    select,
    ternary,
    slice,
    kwarg,
    filter_block,
    call_block,  // {% call m(...) %}body{% endcall %}: m's caller() renders body
    passthrough  // {% generation %}body{% endgeneration %}: body as it is (a training marker, TRL's)
  };
  T t;
  int line = 0;
  std::string str;  // identifier, operator, string literal
  std::int64_t i = 0;
  double f = 0;
  bool flag = false;  // member: computed; test: negate; for: recursive
  int depth = 1;      // height of the subtree (bounded: destroying and evaluating it recurse)
  NodePtr x, y, z;    // operands (object/property, left/right, condition...)
  std::vector<NodePtr> list, body, alt;
};

namespace {

std::string nesting_error() {
  return "nested too deeply (limit " + std::to_string(kMaxNesting) + ")";
}

// Sets n's depth from its children; fails before a loop such as `a+a+a...` builds a tree too deep to handle.
NodePtr deepen(NodePtr n) {
  int d = 0;
  for (const NodePtr* c : {&n->x, &n->y, &n->z}) {
    if (*c) d = std::max(d, (*c)->depth);
  }
  for (const auto* v : {&n->list, &n->body, &n->alt}) {
    for (const auto& c : *v) {
      if (c) d = std::max(d, c->depth);
    }
  }
  n->depth = d + 1;
  if (n->depth > kMaxNesting) fail(n->line, nesting_error());
  return n;
}

std::int64_t parse_int_literal(const std::string& text, int line) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  std::int64_t v = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (r.ec == std::errc::result_out_of_range) {
    fail(line, "integer literal " + text + " is out of range (integers are 64-bit)");
  }
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) fail(line, "invalid number " + text);
  return v;
}

double parse_float_literal(const std::string& text, int line) {
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) fail(line, "invalid number " + text);
  if (!std::isfinite(d)) fail(line, "float literal " + text + " is out of range");
  return d;
}

NodePtr node(Node::T t, int line) {
  auto n = std::make_shared<Node>();
  n->t = t;
  n->line = line;
  return n;
}

// Whether the tree reads the variable `name` (a macro's body and varargs / kwargs).
bool uses_name(const Node& n, const std::string& name) {
  if (n.t == Node::T::ident && n.str == name) return true;
  for (const NodePtr* p : {&n.x, &n.y, &n.z}) {
    if (*p && uses_name(**p, name)) return true;
  }
  for (const auto* v : {&n.list, &n.body, &n.alt}) {
    for (const auto& c : *v) {
      if (c && uses_name(*c, name)) return true;
    }
  }
  return false;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Program parse_program() {
    Program p;
    while (pos_ < toks_.size()) {
      if (auto n = parse_any()) p.body.push_back(n);
    }
    return p;
  }

 private:
  std::vector<Token> toks_;
  std::size_t pos_ = 0;
  int nest_ = 0;

  // Bounds the parser's recursion (parentheses, blocks, elif chains, unary operators...).
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (p_.nest_ >= kMaxNesting) fail(p_.line(), nesting_error());
      ++p_.nest_;
    }
    ~Nest() { --p_.nest_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  [[nodiscard]] int line() const {
    if (pos_ < toks_.size()) return toks_[pos_].line;
    return toks_.empty() ? 0 : toks_.back().line;
  }
  [[nodiscard]] bool is(Tok t, std::size_t ahead = 0) const {
    return pos_ + ahead < toks_.size() && toks_[pos_ + ahead].type == t;
  }
  [[nodiscard]] bool is_ident(std::string_view name, std::size_t ahead = 0) const {
    return is(Tok::ident, ahead) && toks_[pos_ + ahead].value == name;
  }
  [[nodiscard]] bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(Tok::open_stmt) || !is(Tok::ident, 1)) return false;
    return std::find(names.begin(), names.end(), toks_[pos_ + 1].value) != names.end();
  }
  const Token& expect(Tok t, const char* what) {
    if (pos_ >= toks_.size()) fail(line(), std::string("unexpected end of template: expected ") + what);
    if (toks_[pos_].type != t)
      fail(toks_[pos_].line, std::string("expected ") + what + ", found '" + toks_[pos_].value + "'");
    return toks_[pos_++];
  }
  void expect_ident(std::string_view name) {
    if (!is_ident(name)) fail(line(), "expected '" + std::string(name) + "'");
    ++pos_;
  }
  const Token& next() {
    if (pos_ >= toks_.size()) fail(line(), "unexpected end of template");
    return toks_[pos_++];
  }
  // Reads statements until one of the `names` statements starts.
  std::vector<NodePtr> parse_until(std::initializer_list<std::string_view> names, const char* opener, int open_line) {
    std::vector<NodePtr> out;
    while (!is_statement(names)) {
      if (pos_ >= toks_.size()) {
        fail(open_line, std::string("'") + opener + "' block is never closed (expected {% " +
                            std::string(*names.begin()) + " %})");
      }
      if (auto n = parse_any()) out.push_back(n);
    }
    return out;
  }

  NodePtr parse_any() {
    const Nest nest(*this);
    const Token& t = toks_[pos_];
    switch (t.type) {
      case Tok::comment: ++pos_; return nullptr;
      case Tok::text: {
        auto n = node(Node::T::text, t.line);
        n->str = t.value;
        ++pos_;
        return n;
      }
      case Tok::open_stmt: return deepen(parse_statement());
      case Tok::open_expr: {
        ++pos_;
        auto e = parse_expression();
        expect(Tok::close_expr, "'}}'");
        return e;
      }
      default: fail(t.line, "unexpected '" + t.value + "'");
    }
  }

  NodePtr parse_statement() {
    expect(Tok::open_stmt, "'{%'");
    if (!is(Tok::ident)) fail(line(), "expected a statement name after '{%'");
    const Token name = next();
    const int at = name.line;
    if (name.value == "set") {
      auto n = node(Node::T::set, at);
      n->x = parse_expression_sequence(false);
      if (is(Tok::equals)) {
        ++pos_;
        n->y = parse_expression_sequence(false);
      } else {
        // {% set x | upper %}...{% endset %}: the filters apply to the block's text, first to last.
        while (n->x->t == Node::T::filter) {
          n->list.insert(n->list.begin(), n->x->y);
          n->x = n->x->x;
        }
        expect(Tok::close_stmt, "'%}'");
        n->body = parse_until({"endset"}, "set", at);
        expect(Tok::open_stmt, "'{%'");
        expect_ident("endset");
      }
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    if (name.value == "if") {
      auto n = parse_if(at);
      expect(Tok::open_stmt, "'{%'");
      expect_ident("endif");
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    if (name.value == "for") {
      auto n = node(Node::T::for_, at);
      n->x = parse_expression_sequence(true);
      if (n->x->t != Node::T::ident && n->x->t != Node::T::tuple) fail(at, "expected a name or tuple after 'for'");
      if (!is_ident("in")) fail(line(), "expected 'in' after the loop variable");
      ++pos_;
      n->y = parse_expression();
      if (is_ident("recursive")) {  // the body may call loop(items) to render itself over them
        ++pos_;
        n->flag = true;
      }
      expect(Tok::close_stmt, "'%}'");
      n->body = parse_until({"endfor", "else"}, "for", at);
      if (is_statement({"else"})) {
        pos_ += 2;
        expect(Tok::close_stmt, "'%}'");
        n->alt = parse_until({"endfor"}, "for", at);
      }
      expect(Tok::open_stmt, "'{%'");
      expect_ident("endfor");
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    if (name.value == "macro") {
      auto n = node(Node::T::macro, at);
      if (!is(Tok::ident)) fail(at, "expected a macro name");
      n->str = next().value;
      n->list = parse_args();
      for (const auto& a : n->list) {
        if (a->t != Node::T::ident && a->t != Node::T::kwarg)
          fail(at, "macro parameters must be names or name=default");
      }
      expect(Tok::close_stmt, "'%}'");
      n->body = parse_until({"endmacro"}, "macro", at);
      // As Jinja: a macro whose body reads `varargs` / `kwargs` takes extra positional / keyword arguments there.
      for (const auto& b : n->body) {
        if (uses_name(*b, "varargs")) n->i |= 1;
        if (uses_name(*b, "kwargs")) n->i |= 2;
      }
      expect(Tok::open_stmt, "'{%'");
      expect_ident("endmacro");
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    if (name.value == "break" || name.value == "continue") {
      expect(Tok::close_stmt, "'%}'");
      return node(name.value == "break" ? Node::T::break_ : Node::T::continue_, at);
    }
    if (name.value == "filter") {
      auto n = node(Node::T::filter_block, at);
      n->x = parse_filter_name();
      expect(Tok::close_stmt, "'%}'");
      n->body = parse_until({"endfilter"}, "filter", at);
      expect(Tok::open_stmt, "'{%'");
      expect_ident("endfilter");
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    if (name.value == "call") {
      auto n = node(Node::T::call_block, at);
      if (is(Tok::lparen)) fail(at, "'call' with parameters for caller() is not supported; call it without them");
      n->x = parse_expression();
      if (n->x->t != Node::T::call) fail(at, "'call' needs a macro call, as in {% call m() %}");
      expect(Tok::close_stmt, "'%}'");
      n->body = parse_until({"endcall"}, "call", at);
      expect(Tok::open_stmt, "'{%'");
      expect_ident("endcall");
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    if (name.value == "generation") {
      auto n = node(Node::T::passthrough, at);
      expect(Tok::close_stmt, "'%}'");
      n->body = parse_until({"endgeneration"}, "generation", at);
      expect(Tok::open_stmt, "'{%'");
      expect_ident("endgeneration");
      expect(Tok::close_stmt, "'%}'");
      return n;
    }
    fail(at, "unsupported statement '" + name.value +
                 "' (colibri's chat template interpreter supports set, if, for, macro, call, filter, raw, "
                 "generation, break, continue)");
  }

  NodePtr parse_if(int at) {
    const Nest nest(*this);
    auto n = node(Node::T::if_, at);
    n->x = parse_expression();
    expect(Tok::close_stmt, "'%}'");
    n->body = parse_until({"elif", "else", "endif"}, "if", at);
    if (is_statement({"elif"})) {
      const int elif_line = toks_[pos_ + 1].line;
      pos_ += 2;
      n->alt.push_back(parse_if(elif_line));
    } else if (is_statement({"else"})) {
      pos_ += 2;
      expect(Tok::close_stmt, "'%}'");
      n->alt = parse_until({"endif"}, "if", at);
    }
    return deepen(n);
  }

  NodePtr parse_expression_sequence(bool primary) {
    const int at = line();
    std::vector<NodePtr> items;
    items.push_back(primary ? parse_primary() : parse_expression());
    const bool tuple = is(Tok::comma);
    while (tuple) {
      ++pos_;
      if (is(Tok::rparen)) break;  // (x,) and (x, y,)
      items.push_back(primary ? parse_primary() : parse_expression());
      if (!is(Tok::comma)) break;
    }
    if (!tuple) return items[0];
    auto n = node(Node::T::tuple, at);
    n->list = std::move(items);
    return deepen(n);
  }

  NodePtr parse_expression() { return parse_if_expression(); }

  NodePtr parse_if_expression() {
    const Nest nest(*this);
    auto a = parse_or();
    if (is_ident("if")) {
      const int at = line();
      ++pos_;
      auto test = parse_or();
      if (is_ident("else")) {
        ++pos_;
        auto n = node(Node::T::ternary, at);
        n->x = test;
        n->y = a;
        n->z = parse_if_expression();
        return deepen(n);
      }
      auto n = node(Node::T::select, at);
      n->x = a;
      n->y = test;
      return deepen(n);
    }
    return a;
  }

  NodePtr binary(std::string op, NodePtr l, NodePtr r, int at) {
    auto n = node(Node::T::binary, at);
    n->str = std::move(op);
    n->x = std::move(l);
    n->y = std::move(r);
    return deepen(n);
  }

  NodePtr parse_or() {
    auto left = parse_and();
    while (is_ident("or")) {
      const int at = line();
      ++pos_;
      left = binary("or", left, parse_and(), at);
    }
    return left;
  }
  NodePtr parse_and() {
    auto left = parse_not();
    while (is_ident("and")) {
      const int at = line();
      ++pos_;
      left = binary("and", left, parse_not(), at);
    }
    return left;
  }
  NodePtr parse_not() {
    if (is_ident("not")) {
      const Nest nest(*this);
      const int at = line();
      ++pos_;
      auto n = node(Node::T::unary, at);
      n->str = "not";
      n->x = parse_not();
      return deepen(n);
    }
    return parse_comparison();
  }
  NodePtr parse_comparison() {
    auto left = parse_additive();
    while (true) {
      const int at = line();
      std::string op;
      if (is_ident("not") && is_ident("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else if (is_ident("in")) {
        op = "in";
        ++pos_;
      } else if (is(Tok::comparison)) {
        op = next().value;
      } else {
        break;
      }
      left = binary(op, left, parse_additive(), at);
    }
    return left;
  }
  NodePtr parse_additive() {
    auto left = parse_multiplicative();
    while (is(Tok::additive)) {
      const int at = line();
      const std::string op = next().value;
      left = binary(op, left, parse_multiplicative(), at);
    }
    return left;
  }
  NodePtr parse_multiplicative() {
    auto left = parse_power();
    while (is(Tok::multiplicative)) {
      const int at = line();
      const std::string op = next().value;
      left = binary(op, left, parse_power(), at);
    }
    return left;
  }
  NodePtr parse_power() {
    auto left = parse_test();
    while (is(Tok::power)) {
      const int at = line();
      ++pos_;
      left = binary("**", left, parse_test(), at);
    }
    return left;
  }
  NodePtr parse_test() {
    auto operand = parse_filter();
    while (is_ident("is")) {
      const int at = line();
      ++pos_;
      const bool negate = is_ident("not");
      if (negate) ++pos_;
      // "is none" / "is true" etc. arrive as identifiers.
      if (!is(Tok::ident)) fail(line(), "expected a test name after 'is'");
      auto n = node(Node::T::test, at);
      n->str = next().value;
      n->flag = negate;
      n->x = operand;
      // Arguments in parentheses, or one without them (`is divisibleby 3`, `is sameas none`), as Jinja.
      if (is(Tok::lparen)) {
        n->list = parse_args();
      } else if (is(Tok::number) || is(Tok::string) || is(Tok::lbracket) || is(Tok::lbrace) ||
                 (is(Tok::ident) && !is_ident("else") && !is_ident("or") && !is_ident("and") && !is_ident("is") &&
                  !is_ident("if") && !is_ident("not") && !is_ident("in"))) {
        n->list.push_back(parse_call_member());
      }
      operand = deepen(n);
    }
    return operand;
  }
  NodePtr parse_filter_name() {
    if (!is(Tok::ident)) fail(line(), "expected a filter name after '|'");
    auto f = node(Node::T::ident, line());
    f->str = next().value;
    if (is(Tok::lparen)) return parse_call(f);
    return f;
  }
  NodePtr parse_filter() {
    auto operand = parse_unary_sign();
    while (is(Tok::pipe)) {
      const int at = line();
      ++pos_;
      auto n = node(Node::T::filter, at);
      n->x = operand;
      n->y = parse_filter_name();
      operand = deepen(n);
    }
    return operand;
  }
  NodePtr parse_unary_sign() {
    if ((is(Tok::unary) || is(Tok::additive)) && (toks_[pos_].value == "-" || toks_[pos_].value == "+")) {
      const Nest nest(*this);
      const int at = line();
      auto n = node(Node::T::unary, at);
      n->str = next().value;
      n->x = parse_unary_sign();
      return deepen(n);
    }
    return parse_call_member();
  }
  NodePtr parse_call_member() {
    auto member = parse_member(parse_primary());
    if (is(Tok::lparen)) return parse_call(member);
    return member;
  }
  NodePtr parse_call(NodePtr callee) {
    const Nest nest(*this);
    auto n = node(Node::T::call, line());
    n->x = std::move(callee);
    n->list = parse_args();
    NodePtr expr = parse_member(deepen(n));
    if (is(Tok::lparen)) expr = parse_call(expr);
    return expr;
  }
  std::vector<NodePtr> parse_args() {
    expect(Tok::lparen, "'('");
    std::vector<NodePtr> args;
    while (!is(Tok::rparen)) {
      if (pos_ >= toks_.size()) fail(line(), "argument list is never closed with ')'");
      if (is(Tok::power) || (is(Tok::multiplicative) && toks_[pos_].value == "*")) {
        fail(line(), "unsupported argument unpacking ('*' / '**')");
      }
      auto arg = parse_expression();
      if (is(Tok::equals)) {
        ++pos_;
        if (arg->t != Node::T::ident) fail(line(), "expected a name before '=' in the argument list");
        auto kw = node(Node::T::kwarg, arg->line);
        kw->str = arg->str;
        kw->x = parse_expression();
        arg = deepen(kw);
      }
      args.push_back(arg);
      if (is(Tok::comma)) {
        ++pos_;
      } else if (pos_ < toks_.size() && !is(Tok::rparen)) {
        fail(line(), "expected ',' or ')' in the argument list");
      }
    }
    ++pos_;
    return args;
  }
  NodePtr parse_member(NodePtr object) {
    while (is(Tok::dot) || is(Tok::lbracket)) {
      const int at = line();
      const bool computed = next().type == Tok::lbracket;
      auto n = node(Node::T::member, at);
      n->x = object;
      n->flag = computed;
      if (computed) {
        std::vector<NodePtr> parts;
        bool slice = false;
        while (!is(Tok::rbracket)) {
          if (pos_ >= toks_.size()) fail(at, "'[' is never closed");
          if (is(Tok::colon)) {
            parts.push_back(nullptr);
            ++pos_;
            slice = true;
          } else {
            parts.push_back(parse_expression());
            if (is(Tok::colon)) {
              ++pos_;
              slice = true;
            }
          }
        }
        if (parts.empty()) fail(at, "empty subscript '[]'");
        if (slice) {
          if (parts.size() > 3) fail(at, "a slice takes at most 3 parts");
          auto sl = node(Node::T::slice, at);
          sl->x = parts[0];
          sl->y = parts.size() > 1 ? parts[1] : nullptr;
          sl->z = parts.size() > 2 ? parts[2] : nullptr;
          n->y = deepen(sl);
        } else {
          n->y = parts[0];
        }
        expect(Tok::rbracket, "']'");
      } else {
        const Token& p = next();
        if (p.type != Tok::ident && p.type != Tok::number) fail(p.line, "expected a name after '.'");
        auto prop = node(p.type == Tok::ident ? Node::T::ident : Node::T::int_lit, p.line);
        prop->str = p.value;
        if (p.type == Tok::number) prop->i = parse_int_literal(p.value, p.line);
        n->y = prop;
      }
      object = deepen(n);
    }
    return object;
  }
  NodePtr parse_primary() {
    const Token& t = next();
    switch (t.type) {
      case Tok::number: {
        if (t.value.find_first_of(".eE") != std::string::npos) {
          auto n = node(Node::T::float_lit, t.line);
          n->f = parse_float_literal(t.value, t.line);
          return n;
        }
        auto n = node(Node::T::int_lit, t.line);
        n->i = parse_int_literal(t.value, t.line);
        return n;
      }
      case Tok::string: {
        auto n = node(Node::T::str_lit, t.line);
        n->str = t.value;
        while (is(Tok::string)) n->str += next().value;  // implicit concatenation
        return n;
      }
      case Tok::ident: {
        auto n = node(Node::T::ident, t.line);
        n->str = t.value;
        return n;
      }
      case Tok::lparen: {
        if (is(Tok::rparen)) {  // ()
          ++pos_;
          return node(Node::T::tuple, t.line);
        }
        auto e = parse_expression_sequence(false);
        expect(Tok::rparen, "')'");
        return e;
      }
      case Tok::lbracket: {
        auto n = node(Node::T::array, t.line);
        while (!is(Tok::rbracket)) {
          if (pos_ >= toks_.size()) fail(t.line, "'[' is never closed");
          n->list.push_back(parse_expression());
          if (is(Tok::comma)) {
            ++pos_;
          } else if (pos_ < toks_.size() && !is(Tok::rbracket)) {
            fail(line(), "expected ',' or ']' in a list");
          }
        }
        ++pos_;
        return deepen(n);
      }
      case Tok::lbrace: {
        auto n = node(Node::T::object, t.line);
        while (!is(Tok::rbrace)) {
          if (pos_ >= toks_.size()) fail(t.line, "'{' is never closed");
          n->list.push_back(parse_expression());
          expect(Tok::colon, "':' in a dict literal");
          n->body.push_back(parse_expression());
          if (is(Tok::comma)) {
            ++pos_;
          } else if (pos_ < toks_.size() && !is(Tok::rbrace)) {
            fail(line(), "expected ',' or '}' in a dict");
          }
        }
        ++pos_;
        return deepen(n);
      }
      default: fail(t.line, "unexpected '" + t.value + "' in an expression");
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Values

std::string kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "undefined";
    case Value::Kind::null: return "none";
    case Value::Kind::boolean: return "boolean";
    case Value::Kind::integer: return "integer";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "string";
    case Value::Kind::array: return v.tuple ? "tuple" : "list";
    case Value::Kind::object: return "dict";
    case Value::Kind::ns: return "namespace";
    case Value::Kind::kwargs: return "keyword arguments";
    case Value::Kind::function: return "function";
  }
  return "value";
}

// "an integer", "a list": the kind with its article, for messages.
std::string a_kind(const Value& v) {
  const std::string k = kind_name(v);
  return (k == "integer" || k == "undefined" ? "an " : "a ") + k + (k == "undefined" ? " value" : "");
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::null: return false;
    case Value::Kind::boolean: return v.b;
    case Value::Kind::integer: return v.i != 0;
    case Value::Kind::floating: return v.f != 0 && !std::isnan(v.f);
    case Value::Kind::string: return !v.s.empty();
    case Value::Kind::array: return !v.arr->empty();
    case Value::Kind::object:
    case Value::Kind::kwargs: return !v.obj->items.empty();
    case Value::Kind::ns:
    case Value::Kind::function: return true;
  }
  return false;
}

// Dict keys are strings; an integer or boolean key of a dict literal ({0: 'a'}) is kept under a marked string so
// that d[0] finds it and it reads back, prints and sorts as the number it was.
// The marker starts with a byte that is never in UTF-8, so no key from JSON input or a template's text has it.
constexpr std::string_view kNumberKey = "\xff#";

std::string dict_key(const Value& key, int line) {
  if (key.is(Value::Kind::string)) return key.s;
  if (key.is(Value::Kind::integer) || key.is(Value::Kind::boolean)) {
    return std::string(kNumberKey) + std::to_string(key.is(Value::Kind::boolean) ? key.b : key.i);
  }
  fail(line, "dict keys must be strings or integers, got " + kind_name(key));
}

Value key_value(const std::string& key) {
  if (key.size() > kNumberKey.size() && key.compare(0, kNumberKey.size(), kNumberKey) == 0) {
    std::int64_t v = 0;
    const char* end = key.data() + key.size();
    if (const auto r = std::from_chars(key.data() + kNumberKey.size(), end, v); r.ec == std::errc() && r.ptr == end) {
      return Value::integer(v);
    }
  }
  return Value::string(key);
}

// Python's repr() of a float: the shortest digits that read back exactly, in exponent form below 1e-4 and from
// 1e16 (1.0, 0.0001, 1e-05, 1e+16).
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // -1.2345e+02
  const std::size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t k = negative ? 1 : 0; k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) return out + "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    const auto whole = static_cast<std::size_t>(exp) + 1;
    if (digits.size() <= whole) return out + digits + std::string(whole - digits.size(), '0') + ".0";
    return out + digits.substr(0, whole) + "." + digits.substr(whole);
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char tail[16];
  std::snprintf(tail, sizeof tail, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + tail;
}

// JSON string as Python's json.dumps writes it (with ensure_ascii, every character past ASCII as a \u escape,
// two of them for one past U+FFFF).
std::string json_string(const std::string& s, bool ensure_ascii = false) {
  std::string out = "\"";
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    const char32_t c = utf8::next_code_point(s, i);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x80 && c < 0x10000)) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else if (ensure_ascii && c >= 0x10000) {
          const char32_t v = c - 0x10000;
          std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                        static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          out += buf;
        } else {
          out.append(s, start, i - start);
        }
      }
    }
  }
  out += "\"";
  return out;
}

struct JsonStyle {
  int indent = -1;  // -1: one line; 0 and up: a new line per item, indented so many spaces a level
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

void check_depth(int depth) {
  if (depth >= kMaxValueDepth) {
    fail(0, "value is nested too deeply to print (limit " + std::to_string(kMaxValueDepth) +
                "; does a namespace contain itself?)");
  }
}

// Python's json.dumps (transformers' tojson filter): floats as repr() (2.0), NaN and Infinity as Python writes them.
std::string to_json_impl(const Value& v, const JsonStyle& style, int depth) {
  check_depth(depth);
  switch (v.kind) {
    case Value::Kind::null: return "null";
    case Value::Kind::undefined:
      fail(0, "cannot convert an undefined value to JSON" + (v.s.empty() ? "" : " (" + v.s + ")"));
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating:
      return std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
    case Value::Kind::boolean: return v.b ? "true" : "false";
    case Value::Kind::string: return json_string(v.s, style.ensure_ascii);
    case Value::Kind::array:
    case Value::Kind::object:
    case Value::Kind::ns:
    case Value::Kind::kwargs: {
      const bool lines = style.indent >= 0;
      const std::string unit(lines ? static_cast<std::size_t>(style.indent) : 0, ' ');
      std::string base = "\n";
      for (int k = 0; k < depth; ++k) base += unit;
      const std::string child = base + unit;
      std::vector<std::string> parts;
      std::size_t total = 0;
      auto add = [&](std::string p) {
        total += p.size() + child.size() + style.item_sep.size();
        check_size(total, 0);
        parts.push_back(std::move(p));
      };
      if (v.kind == Value::Kind::array) {
        for (const auto& e : *v.arr) add(to_json_impl(e, style, depth + 1));
      } else {
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& item : v.obj->items) items.push_back(&item);
        if (style.sort_keys) {
          std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
        }
        for (const auto* item : items) {
          const Value key = key_value(item->first);  // json.dumps writes a number key as a string
          add(json_string(key.is(Value::Kind::string) ? key.s : std::to_string(key.i), style.ensure_ascii) +
              style.key_sep + to_json_impl(item->second, style, depth + 1));
        }
      }
      const bool array = v.kind == Value::Kind::array;
      std::string out = array ? "[" : "{";
      if (lines && !parts.empty()) {
        for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? style.item_sep : "") + child + parts[k];
        out += base;
      } else {
        for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? style.item_sep : "") + parts[k];
      }
      return out + (array ? "]" : "}");
    }
    case Value::Kind::function: fail(0, "cannot convert a function to JSON");
  }
  return "null";
}

// Python's str.isprintable() for one character (what repr() writes as it is).
bool py_printable(char32_t c) {
  if (c == ' ') return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

std::string py_repr_string(const std::string& s) {
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    const char32_t c = utf8::next_code_point(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_printable(c)) {
      char buf[16];
      std::snprintf(buf, sizeof buf,
                    c < 0x100     ? "\\x%02x"
                    : c < 0x10000 ? "\\u%04x"
                                  : "\\U%08x",
                    static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(s, start, i - start);
    }
  }
  return out + quote;
}

std::string py_text(const Value& v, bool repr, int depth) {
  check_depth(depth);
  switch (v.kind) {
    case Value::Kind::undefined: return repr ? "Undefined" : "";
    case Value::Kind::null: return "None";
    case Value::Kind::boolean: return v.b ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating: return py_float(v.f);
    case Value::Kind::string: return repr ? py_repr_string(v.s) : v.s;
    case Value::Kind::array: {
      std::string out = v.tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.arr->size(); ++k) {
        out += (k ? ", " : "") + py_text((*v.arr)[k], true, depth + 1);
        check_size(out.size(), 0);
      }
      if (v.tuple && v.arr->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::object:
    case Value::Kind::ns:
    case Value::Kind::kwargs: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.obj->items) {
        out += (first ? "" : ", ") + py_text(key_value(key), true, depth + 1) + ": " + py_text(value, true, depth + 1);
        first = false;
        check_size(out.size(), 0);
      }
      out += "}";
      return v.kind == Value::Kind::ns ? "<Namespace " + out + ">" : out;
    }
    case Value::Kind::function: fail(0, "cannot print a function");
  }
  return "";
}

// Python's ==: numbers (and booleans) by value, lists and dicts item by item, no conversion between types.
bool py_equal(const Value& a, const Value& b, int depth = 0) {
  using K = Value::Kind;
  check_depth(depth);
  const bool a_num = a.is_number() || a.is(K::boolean);
  const bool b_num = b.is_number() || b.is(K::boolean);
  if (a_num || b_num) {
    if (!a_num || !b_num) return false;
    if (!a.is(K::floating) && !b.is(K::floating))
      return (a.is(K::boolean) ? a.b : a.i) == (b.is(K::boolean) ? b.b : b.i);
    return a.number() == b.number();
  }
  const bool a_map = a.is(K::object) || a.is(K::kwargs);
  const bool b_map = b.is(K::object) || b.is(K::kwargs);
  if (a_map || b_map) {
    if (!a_map || !b_map || a.obj->items.size() != b.obj->items.size()) return false;
    charge(a.obj->items.size());
    for (const auto& [key, value] : a.obj->items) {
      const Value* other = b.obj->find(key);
      if (other == nullptr || !py_equal(value, *other, depth + 1)) return false;
    }
    return true;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined:
    case K::null: return true;
    case K::string: return a.s == b.s;
    case K::array: {
      if (a.tuple != b.tuple || a.arr->size() != b.arr->size()) return false;
      charge(a.arr->size());
      for (std::size_t k = 0; k < a.arr->size(); ++k) {
        if (!py_equal((*a.arr)[k], (*b.arr)[k], depth + 1)) return false;
      }
      return true;
    }
    case K::function: return a.fn == b.fn;
    default: return a.obj == b.obj;
  }
}

std::string change_case(const std::string& s, bool upper) {
  const std::u16string in = utf8::to_utf16(s);
  std::u16string out(in.size() * 3 + 4, u'\0');
  UErrorCode err = U_ZERO_ERROR;
  const int32_t n =
      upper ? u_strToUpper(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                           reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()), "", &err)
            : u_strToLower(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                           reinterpret_cast<const UChar*>(in.data()), static_cast<int32_t>(in.size()), "", &err);
  if (U_FAILURE(err)) return s;
  out.resize(static_cast<std::size_t>(n));
  return utf8::from_utf16(out);
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  charge(s.size() / 8);
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    utf8::next_code_point(s, i);
    out.push_back(s.substr(start, i - start));
    if (out.size() > kMaxItems) fail(0, "string is too long to split into characters");
  }
  return out;
}

// Python's len() of a string (code points).
std::int64_t cp_length(const std::string& s) {
  std::int64_t n = 0;
  std::size_t i = 0;
  while (i < s.size()) {
    utf8::next_code_point(s, i);
    ++n;
  }
  return n;
}

template <typename T>
std::vector<T> py_slice(const std::vector<T>& a, std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
                        std::int64_t step) {
  const auto len = static_cast<std::int64_t>(a.size());
  std::vector<T> out;
  if (step > 0) {
    std::int64_t s = start.value_or(0), e = stop.value_or(len);
    s = s < 0 ? std::max(len + s, std::int64_t{0}) : std::min(s, len);
    e = e < 0 ? std::max(len + e, std::int64_t{0}) : std::min(e, len);
    for (std::int64_t k = s; k<e; k = step> e - k ? e : k + step) out.push_back(a[static_cast<std::size_t>(k)]);
  } else {
    std::int64_t s = start.value_or(len - 1), e = stop.value_or(-1);
    s = s < 0 ? std::max(len + s, std::int64_t{-1}) : std::min(s, len - 1);
    e = e < -1 ? std::max(len + e, std::int64_t{-1}) : std::min(e, len - 1);
    for (std::int64_t k = s; k > e; k = step < e - k ? e : k + step) out.push_back(a[static_cast<std::size_t>(k)]);
  }
  return out;
}

// Substring search in time linear in both lengths (glibc's memmem is two-way): std::string::find can take
// |haystack| x |needle| steps, which a template could use to stall a request.
std::size_t find_text(const std::string& hay, const std::string& needle, std::size_t from = 0) {
  if (from > hay.size()) return std::string::npos;
  if (needle.empty()) return from;
  const void* at = ::memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  return at == nullptr ? std::string::npos : static_cast<std::size_t>(static_cast<const char*>(at) - hay.data());
}

// The string's code points in reverse order (a right-to-left search is a left-to-right one in this). Walks the
// bytes: a string of any length reverses (code_points() stops at its item limit).
std::string reversed_text(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  charge(s.size() / 16);
  for (std::size_t end = s.size(); end > 0;) {
    const std::size_t start = code_point_before(s, end);
    out.append(s, start, end - start);
    end = start;
  }
  return out;
}

std::size_t rfind_text(const std::string& hay, const std::string& needle) {
  std::string h(hay.rbegin(), hay.rend()), n(needle.rbegin(), needle.rend());  // bytes reversed: a match stays one
  const std::size_t at = find_text(h, n);
  return at == std::string::npos ? at : hay.size() - at - needle.size();
}

// Strings are copied with the values that hold them: copying a list costs its items and its text.
std::uint64_t text_bytes(const Array& a) {
  std::uint64_t n = 0;
  for (const auto& v : a) n += v.is(Value::Kind::string) ? v.s.size() : 0;
  return n;
}

void charge_copy(const Array& a) {
  charge(a.size() + text_bytes(a) / 16);
}

// Python's str.islower() / isupper(): some cased character, and none of the other case.
bool has_case(const std::string& s, bool upper) {
  return s == change_case(s, upper) && s != change_case(s, !upper);
}

std::string encode_code_point(UChar32 c) {
  std::u16string u;
  if (c >= 0x10000) {
    u.push_back(static_cast<char16_t>(0xD800 + ((c - 0x10000) >> 10)));
    u.push_back(static_cast<char16_t>(0xDC00 + ((c - 0x10000) & 0x3FF)));
  } else {
    u.push_back(static_cast<char16_t>(c));
  }
  return utf8::from_utf16(u);
}

// Python's str.title(): a cased character after an uncased one is title-cased, the others lower-cased.
std::string py_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    const auto c = static_cast<UChar32>(utf8::next_code_point(s, i));
    const bool cased = u_hasBinaryProperty(c, UCHAR_CASED) != 0;
    if (!cased) {
      out.append(s, start, i - start);
    } else {
      out += previous_cased ? change_case(s.substr(start, i - start), false) : encode_code_point(u_totitle(c));
    }
    previous_cased = cased;
  }
  return out;
}

// Python's str.capitalize(): the first character title-cased, the rest lower-cased.
std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  std::size_t i = 0;
  const auto c = static_cast<UChar32>(utf8::next_code_point(s, i));
  return encode_code_point(u_totitle(c)) + change_case(s.substr(i), false);
}

// Jinja's title filter: each word (after -, whitespace, or an opening bracket) upper-cases its first character
// and lower-cases the rest.
std::string jinja_title(const std::string& s) {
  std::string out, word;
  auto flush = [&]() {
    if (word.empty()) return;
    std::size_t i = 0;
    utf8::next_code_point(word, i);
    out += change_case(word.substr(0, i), true) + change_case(word.substr(i), false);
    word.clear();
  };
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    const char32_t c = utf8::next_code_point(s, i);
    if (c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c)) {
      flush();
      out.append(s, start, i - start);
    } else {
      word.append(s, start, i - start);
    }
  }
  flush();
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's str.format() for the fields chat templates use: {}, {0}, {name}, {{ and }} (no format specs).
std::string str_format(const std::string& s, const std::vector<Value>& args) {
  std::vector<Value> positional = args;
  const Object* named = nullptr;
  if (!positional.empty() && positional.back().is(Value::Kind::kwargs)) {
    named = positional.back().obj.get();
    positional.pop_back();
  }
  std::string out;
  std::size_t next_auto = 0;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if ((s[k] == '{' || s[k] == '}') && k + 1 < s.size() && s[k + 1] == s[k]) {
      out += s[k++];
      continue;
    }
    if (s[k] == '}') fail(0, "format(): single '}' in the format string");
    if (s[k] != '{') {
      out += s[k];
      continue;
    }
    const std::size_t close = s.find('}', k);
    if (close == std::string::npos) fail(0, "format(): '{' is never closed");
    const std::string field = s.substr(k + 1, close - k - 1);
    if (field.find_first_of(":!.[") != std::string::npos) fail(0, "format(): field '{" + field + "}' is not supported");
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char c) { return is_digit(c); })) {
      std::size_t index = next_auto;
      if (field.empty()) {
        ++next_auto;
      } else if (std::from_chars(field.data(), field.data() + field.size(), index).ec != std::errc()) {
        fail(0, "format(): field '{" + field + "}' is out of range");
      }
      if (index >= positional.size()) fail(0, "format(): no argument " + std::to_string(index));
      v = &positional[index];
    } else {
      v = named ? named->find(field) : nullptr;
      if (!v) fail(0, "format(): no argument named '" + field + "'");
    }
    out += py_str(*v);
    check_size(out.size(), 0);
    k = close;
  }
  return out;
}

// Python's printf-style `format % args` (Jinja's format filter): %s %r %d %i %f %e %g %x %o %c %%, with flags,
// width and precision.
std::string printf_format(const std::string& s, const std::vector<Value>& args) {
  std::string out;
  std::size_t next = 0;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '%') {
      out += s[k];
      continue;
    }
    std::size_t j = k + 1;
    while (j < s.size() && std::string_view("-+ #0").find(s[j]) != std::string_view::npos) ++j;
    // A width or precision past 400 is refused: the result would be mostly padding (and slow to make).
    for (int part = 0; part < 2; ++part) {
      const std::size_t digits = j;
      while (j < s.size() && is_digit(s[j])) ++j;
      if (j - digits > 3 || (j > digits && std::stoi(s.substr(digits, j - digits)) > 400)) {
        fail(0, "format: a width or precision above 400 in '" + s + "'");
      }
      if (part == 0 && j < s.size() && s[j] == '.') {
        ++j;
      } else {
        break;
      }
    }
    if (j >= s.size()) fail(0, "format: incomplete format at the end of '" + s + "'");
    const char conv = s[j];
    std::string spec = s.substr(k, j - k);
    k = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) fail(0, "format: not enough arguments for the format string");
    const Value& v = args[next++];
    char buf[512];
    if (conv == 's' || conv == 'r') {
      // Precision cuts to so many characters, width pads with spaces (left-justified with '-'), as Python.
      std::string text = conv == 's' ? py_str(v) : py_repr(v);
      const std::size_t dot = spec.find('.');
      const std::string width_text = spec.substr(1, dot == std::string::npos ? std::string::npos : dot - 1);
      const std::size_t width_at = width_text.find_first_not_of("-+ #0");
      const int width = width_at == std::string::npos ? 0 : std::stoi(width_text.substr(width_at));
      if (dot != std::string::npos) {
        const int precision = dot + 1 < spec.size() ? std::stoi(spec.substr(dot + 1)) : 0;
        const auto cps = code_points(text);
        text.clear();
        for (std::size_t c = 0; c < cps.size() && c < static_cast<std::size_t>(precision); ++c) text += cps[c];
      }
      const auto length = cp_length(text);
      const std::string pad(length < width ? static_cast<std::size_t>(width - length) : 0, ' ');
      out += spec.find('-') != std::string::npos ? text + pad : pad + text;
    } else if (conv == 'c') {
      if (v.is(Value::Kind::string) && cp_length(v.s) == 1) {
        out += v.s;
      } else if (v.is(Value::Kind::integer) && v.i >= 0 && v.i <= 0x10FFFF && (v.i < 0xD800 || v.i > 0xDFFF)) {
        out += encode_code_point(static_cast<UChar32>(v.i));
      } else {
        fail(0, "format: %c needs one character or a code point");
      }
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      if (!v.is_number() && !v.is(Value::Kind::boolean))
        fail(0, "format: %" + std::string(1, conv) + " needs a number");
      const long long i = v.is(Value::Kind::integer)   ? v.i
                          : v.is(Value::Kind::boolean) ? v.b
                                                       : to_int64(std::trunc(v.f), 0);
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), i);
      out += buf;
    } else if (std::string_view("feEgG").find(conv) != std::string_view::npos) {
      if (!v.is_number() && !v.is(Value::Kind::boolean))
        fail(0, "format: %" + std::string(1, conv) + " needs a number");
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.number());
      out += buf;
    } else {
      fail(0, "format: unsupported conversion '%" + std::string(1, conv) + "'");
    }
    check_size(out.size(), 0);
  }
  if (next < args.size()) fail(0, "format: not all arguments converted");
  return out;
}

// A function that reads a block's scope (a {% call %} block's caller(), a recursive loop's loop()) may be kept past
// that block (in a namespace) and called later: the block's token says whether its scope still exists.
class ScopeToken {
 public:
  ScopeToken() : alive_(std::make_shared<bool>(true)) {}
  ~ScopeToken() { *alive_ = false; }
  ScopeToken(const ScopeToken&) = delete;
  ScopeToken& operator=(const ScopeToken&) = delete;
  [[nodiscard]] std::shared_ptr<const bool> watch() const { return alive_; }

 private:
  std::shared_ptr<bool> alive_;
};

struct BreakSignal {};
struct ContinueSignal {};

class Interpreter {
 public:
  Interpreter(RenderState& state, Env& root) : state_(state), root_(&root) {}

  std::string block(const std::vector<NodePtr>& body, Env& env) {
    std::string out;
    run(body, env, out);
    return out;
  }

  // Appends as it goes: what a loop's body wrote before a break or continue stays, as in Python Jinja.
  void run(const std::vector<NodePtr>& body, Env& env, std::string& out) {
    for (const auto& n : body) {
      exec(*n, env, out);
      check_size(out.size(), n->line);
    }
  }

 private:
  RenderState& state_;
  Env* root_;  // the template's top level

  // Bounds the evaluator's recursion (macros, nested blocks) and counts each evaluation against the step budget.
  class Frame {
   public:
    Frame(RenderState& st, int line) : st_(st) {
      if (st_.eval_depth >= kMaxEvalDepth) {
        fail(line, "nested too deeply (limit " + std::to_string(kMaxEvalDepth) +
                       " nested evaluations; is a macro calling itself without end?)");
      }
      ++st_.eval_depth;
      charge(1);
    }
    ~Frame() { --st_.eval_depth; }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

   private:
    RenderState& st_;
  };

  void exec(const Node& n, Env& env, std::string& out) {
    const Frame frame(state_, n.line);
    try {
      exec_node(n, env, out);
    } catch (Error& e) {
      if (e.line == 0) e.line = n.line;
      throw;
    }
  }

  void exec_node(const Node& n, Env& env, std::string& out) {
    switch (n.t) {
      case Node::T::text: out += n.str; return;
      case Node::T::set: exec_set(n, env); return;
      case Node::T::if_: run(truthy(eval(*n.x, env)) ? n.body : n.alt, env, out); return;
      case Node::T::for_: exec_for(n, env, out); return;
      case Node::T::macro: define_macro(n, env); return;
      case Node::T::break_: throw BreakSignal{};
      case Node::T::continue_: throw ContinueSignal{};
      case Node::T::filter_block: {
        Env inner(&env);  // what the block sets stays in it, as in Jinja
        Value body = Value::string(block(n.body, inner));
        append(out, apply_filter(body, *n.x, env));
        return;
      }
      case Node::T::passthrough: run(n.body, env, out); return;
      case Node::T::call_block: {
        // The macro's scope opens inside this one, so its caller() is found there; it renders the body here.
        Env inner(&env);
        const auto* body = &n.body;
        const ScopeToken scope;
        inner.set("caller", Value::function([this, body, &env, alive = scope.watch()](std::vector<Value>&, Env&) {
                    if (!*alive) fail(0, "caller() was kept past its {% call %} block and called after it ended");
                    return Value::string(block(*body, env));
                  }));
        append(out, eval(*n.x, inner));
        return;
      }
      default: append(out, eval(n, env)); return;
    }
  }

  static void append(std::string& out, const Value& v) { out += py_str(v); }

  void assign(const Node& target, const Value& v, Env& env, int line) {
    if (target.t == Node::T::ident) {
      env.set(target.str, v);
    } else if (target.t == Node::T::tuple) {
      if (!v.is(Value::Kind::array)) fail(line, "cannot unpack " + a_kind(v) + " in set");
      if (v.arr->size() != target.list.size()) fail(line, "wrong number of items to unpack in set");
      for (std::size_t k = 0; k < target.list.size(); ++k) {
        if (target.list[k]->t != Node::T::ident) fail(line, "can only unpack into names");
        env.set(target.list[k]->str, (*v.arr)[k]);
      }
    } else if (target.t == Node::T::member) {
      Value object = eval(*target.x, env);
      if (!object.is(Value::Kind::ns))
        fail(line, "cannot set an attribute on " + a_kind(object) + " (only on a namespace)");
      if (target.y->t != Node::T::ident || target.flag) fail(line, "namespace attribute must be a name");
      object.obj->set(target.y->str, v);
    } else {
      fail(line, "invalid target of set");
    }
  }

  void exec_set(const Node& n, Env& env) {
    Value v = n.y ? eval(*n.y, env) : Value::string(block(n.body, env));
    for (const auto& f : n.list) v = apply_filter(v, *f, env);
    assign(*n.x, v, env, n.line);
  }

  // `given`: the items of a recursive loop's loop(items) call, at `depth`.
  void exec_for(const Node& n, Env& env, std::string& out, const Value* given = nullptr, int depth = 1) {
    Env scope(&env);
    const Node* iterable_node = n.y.get();
    const Node* test = nullptr;
    if (iterable_node->t == Node::T::select) {
      test = iterable_node->y.get();
      iterable_node = iterable_node->x.get();
    }
    Value iterable = given ? *given : eval(*iterable_node, scope);
    // Lists are immutable, so the loop reads the list itself rather than a copy.
    std::shared_ptr<const Array> items_all =
        iterable.is(Value::Kind::array) ? iterable.arr : std::make_shared<Array>(iterate(iterable, n.line));
    charge(items_all->size());
    auto bind = [&](Env& target, const Value& item) {
      if (item.is(Value::Kind::string)) charge(item.s.size() / 16);  // bound by copy
      if (n.x->t == Node::T::ident) {
        target.set(n.x->str, item);
        return;
      }
      if (!item.is(Value::Kind::array)) fail(n.line, "cannot unpack " + a_kind(item) + " into loop variables");
      if (item.arr->size() != n.x->list.size()) fail(n.line, "wrong number of items to unpack in the loop");
      for (std::size_t k = 0; k < n.x->list.size(); ++k) {
        if (n.x->list[k]->t != Node::T::ident) fail(n.line, "loop variables must be names");
        target.set(n.x->list[k]->str, (*item.arr)[k]);
      }
    };
    std::shared_ptr<const Array> kept = items_all;
    if (test) {
      auto passing = std::make_shared<Array>();
      for (const auto& item : *items_all) {
        Env probe(&scope);
        bind(probe, item);
        if (truthy(eval(*test, probe))) passing->push_back(item);
      }
      kept = std::move(passing);
    }
    const Array& items = *kept;
    bool iterated = false;
    const auto count = static_cast<std::int64_t>(items.size());
    const ScopeToken loop_scope;  // a recursive loop's loop() kept past the loop must not be called
    for (std::int64_t k = 0; k < count; ++k) {
      Env iteration(&scope);  // what an iteration sets is gone at the next one, as in Jinja
      Value loop = Value::object();
      loop.obj->set("index", Value::integer(k + 1));
      loop.obj->set("index0", Value::integer(k));
      loop.obj->set("revindex", Value::integer(count - k));
      loop.obj->set("revindex0", Value::integer(count - k - 1));
      loop.obj->set("first", Value::boolean(k == 0));
      loop.obj->set("last", Value::boolean(k == count - 1));
      loop.obj->set("length", Value::integer(count));
      loop.obj->set("previtem", k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value::undefined());
      loop.obj->set("nextitem", k < count - 1 ? items[static_cast<std::size_t>(k + 1)] : Value::undefined());
      loop.obj->set("depth", Value::integer(depth));
      loop.obj->set("depth0", Value::integer(depth - 1));
      if (n.flag) {
        const Node* self = &n;
        Env* outer = &env;
        loop.obj->set("__call__", Value::function([this, self, outer, depth, alive = loop_scope.watch()](
                                                      std::vector<Value>& args, Env&) {
                        if (!*alive)
                          fail(self->line, "loop() was kept past its recursive loop and called after it ended");
                        if (args.size() != 1)
                          fail(self->line, "loop() of a recursive loop takes the items to loop over");
                        std::string inner;
                        exec_for(*self, *outer, inner, &args[0], depth + 1);
                        return Value::string(inner);
                      }));
      }
      loop.obj->set("cycle", Value::function([k](std::vector<Value>& args, Env&) {
                      if (args.empty()) fail(0, "loop.cycle() needs at least one value");
                      return args[static_cast<std::size_t>(k) % args.size()];
                    }));
      iteration.set("loop", loop);
      bind(iteration, items[static_cast<std::size_t>(k)]);
      charge(5);  // an iteration also builds loop.* (9 entries)
      try {
        run(n.body, iteration, out);
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
      iterated = true;  // as Jinja: else also runs when every iteration ended in break or continue
    }
    if (!iterated) run(n.alt, scope, out);
  }

  void define_macro(const Node& n, Env& env) {
    const Node* def = &n;
    const bool takes_varargs = (n.i & 1) != 0, takes_kwargs = (n.i & 2) != 0;  // found by the parser
    // A macro of the top level sees the top level's variables, not its caller's (as Jinja); one defined inside a
    // block keeps its caller's scope, since the block's may be gone when it is called.
    Env* home = &env == root_ ? root_ : nullptr;
    env.set(n.str,
            Value::function([this, def, takes_varargs, takes_kwargs, home](std::vector<Value>& args, Env& caller) {
              Env scope(home ? home : &caller);
              if (home) {  // a {% call %} block's caller() is passed in, as Jinja passes it
                if (Value c = caller.lookup("caller"); c.is(Value::Kind::function)) scope.set("caller", c);
              }
              std::vector<Value> positional = args;
              std::shared_ptr<Object> kwargs;
              if (!positional.empty() && positional.back().is(Value::Kind::kwargs)) {
                kwargs = positional.back().obj;
                positional.pop_back();
              }
              if (positional.size() > def->list.size() && !takes_varargs) {
                fail(def->line,
                     "macro '" + def->str + "' takes at most " + std::to_string(def->list.size()) + " argument(s)");
              }
              if (takes_varargs) {
                Array extra;
                for (std::size_t k = def->list.size(); k < positional.size(); ++k) extra.push_back(positional[k]);
                scope.set("varargs", Value::make_tuple(std::move(extra)));
              }
              Value extra_kwargs = Value::object();
              if (kwargs) {
                for (const auto& [key, value] : kwargs->items) {
                  const bool known =
                      std::any_of(def->list.begin(), def->list.end(), [&](const NodePtr& p) { return p->str == key; });
                  if (known) continue;
                  if (!takes_kwargs)
                    fail(def->line, "macro '" + def->str + "' takes no keyword argument '" + key + "'");
                  extra_kwargs.obj->set(key, value);
                }
              }
              if (takes_kwargs) scope.set("kwargs", extra_kwargs);
              std::vector<std::pair<std::string, const Node*>> defaults;
              for (std::size_t k = 0; k < def->list.size(); ++k) {
                const Node& p = *def->list[k];
                const std::string& name = p.t == Node::T::ident ? p.str : p.str;
                Value v;
                bool have = false;
                if (k < positional.size()) {
                  v = positional[k];
                  have = true;
                } else if (kwargs) {
                  if (const Value* kv = kwargs->find(name)) {
                    v = *kv;
                    have = true;
                  }
                }
                if (!have && p.t == Node::T::kwarg) defaults.emplace_back(name, p.x.get());
                scope.set(name, v);
              }
              for (const auto& [name, expr] : defaults) scope.set(name, eval(*expr, scope));
              return Value::string(block(def->body, scope));
            }));
  }

  // ---- expressions ----

 public:
  Value eval(const Node& n, Env& env) {
    const Frame frame(state_, n.line);
    try {
      Value v = eval_node(n, env);
      if (v.is(Value::Kind::string)) {
        check_size(v.s.size(), n.line);
        charge(v.s.size() / 64);  // strings are copied by value: long ones cost more
      }
      return v;
    } catch (Error& e) {
      if (e.line == 0) e.line = n.line;
      throw;
    }
  }

 private:
  Value eval_node(const Node& n, Env& env) {
    switch (n.t) {
      case Node::T::int_lit: return Value::integer(n.i);
      case Node::T::float_lit: return Value::floating(n.f);
      case Node::T::str_lit: return Value::string(n.str);
      case Node::T::text: return Value::string(n.str);
      case Node::T::array:
      case Node::T::tuple: {
        Array a;
        for (const auto& e : n.list) a.push_back(eval(*e, env));
        return n.t == Node::T::tuple ? Value::make_tuple(std::move(a)) : Value::array(std::move(a));
      }
      case Node::T::object: {
        Value o = Value::object();
        for (std::size_t k = 0; k < n.list.size(); ++k) {
          Value key = eval(*n.list[k], env);
          o.obj->set(dict_key(key, n.line), eval(*n.body[k], env));
        }
        return o;
      }
      case Node::T::ident: {
        Value v = env.lookup(n.str);
        if (v.is(Value::Kind::undefined) && v.s.empty()) v.s = "'" + n.str + "' is undefined";
        return v;
      }
      case Node::T::member: return eval_member(n, env);
      case Node::T::call: return eval_call(n, env);
      case Node::T::binary: return eval_binary(n, env);
      case Node::T::unary: {
        Value v = eval(*n.x, env);
        if (n.str == "not") return Value::boolean(!truthy(v));
        if (v.is_number() || v.is(Value::Kind::boolean)) {
          if (v.is(Value::Kind::floating)) return Value::floating(n.str == "-" ? -v.f : v.f);
          const std::int64_t i = v.is(Value::Kind::integer) ? v.i : v.b ? 1 : 0;
          if (n.str == "+") return Value::integer(i);
          std::int64_t r = 0;
          if (__builtin_sub_overflow(std::int64_t{0}, i, &r)) overflow(n.line, "unary '-'");
          return Value::integer(r);
        }
        fail(n.line, "unary '" + n.str + "' needs a number, got " + kind_name(v));
      }
      case Node::T::filter: {
        Value operand = eval(*n.x, env);
        return apply_filter(operand, *n.y, env);
      }
      case Node::T::test: {
        const Value v = eval(*n.x, env);
        std::vector<Value> args = eval_args(n.list, env);
        return Value::boolean(test_value(n.str, v, args, n.line) != n.flag);
      }
      case Node::T::select: return truthy(eval(*n.y, env)) ? eval(*n.x, env) : Value::undefined();
      case Node::T::ternary: return truthy(eval(*n.x, env)) ? eval(*n.y, env) : eval(*n.z, env);
      default: fail(n.line, "statement used as an expression");
    }
  }

 private:
  // What Python's iter() gives: a list's items, a string's characters, a dict's keys; nothing for undefined.
  static Array iterate(const Value& v, int line) {
    using K = Value::Kind;
    Array out;
    switch (v.kind) {
      case K::array: charge_copy(*v.arr); return *v.arr;
      case K::string:
        for (auto& c : code_points(v.s)) out.push_back(Value::string(std::move(c)));
        return out;
      case K::object:
      case K::kwargs:
        for (const auto& [k, _] : v.obj->items) out.push_back(key_value(k));
        return out;
      case K::undefined: return out;
      default: fail(line, "cannot iterate over " + a_kind(v));
    }
  }

  // `item in container`, as Python.
  static bool contains(const Value& container, const Value& item, int line) {
    using K = Value::Kind;
    if (container.is(K::string)) {
      if (!item.is(K::string)) fail(line, "'in <string>' needs a string on the left, got " + kind_name(item));
      return find_text(container.s, item.s) != std::string::npos;
    }
    if (container.is(K::array)) {
      charge(container.arr->size());
      for (const auto& e : *container.arr) {
        if (py_equal(e, item)) return true;
      }
      return false;
    }
    if (container.is(K::object) || container.is(K::kwargs)) {
      return (item.is(K::string) || item.is(K::integer) || item.is(K::boolean)) &&
             container.obj->find(dict_key(item, line)) != nullptr;
    }
    if (container.is(K::undefined)) return false;
    fail(line, "cannot apply 'in' to " + a_kind(container));
  }

  // Jinja's tests, by name (`x is name(args)`, select('name', args), selectattr('a', 'name', args)).
  static bool test_value(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
    using K = Value::Kind;
    auto arg = [&]() -> const Value& {
      if (args.empty()) fail(line, "test '" + name + "' needs an argument");
      return args[0];
    };
    if (name == "defined") return !v.is(K::undefined);
    if (name == "undefined") return v.is(K::undefined);
    if (name == "none") return v.is(K::null);
    if (name == "string") return v.is(K::string);
    if (name == "boolean") return v.is(K::boolean);
    if (name == "true") return v.is(K::boolean) && v.b;
    if (name == "false") return v.is(K::boolean) && !v.b;
    if (name == "number") return v.is_number() || v.is(K::boolean);
    if (name == "integer") return v.is(K::integer);
    if (name == "float") return v.is(K::floating);
    if (name == "iterable" || name == "sequence") {
      return v.is(K::array) || v.is(K::string) || v.is(K::object) || v.is(K::kwargs);
    }
    if (name == "mapping") return v.is(K::object) || v.is(K::kwargs);
    if (name == "callable") return v.is(K::function);
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") return has_case(py_str(v), name == "upper");
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (!v.is(K::integer) && !v.is(K::boolean))
        fail(line, "test '" + name + "' needs an integer, got " + kind_name(v));
      const std::int64_t x = v.is(K::boolean) ? v.b : v.i;
      if (name != "divisibleby") return (x % 2 != 0) == (name == "odd");
      const Value& d = arg();
      if (!d.is(K::integer) || d.i == 0) fail(line, "divisibleby needs a non-zero integer");
      return d.i == -1 || x % d.i == 0;
    }
    if (name == "in") return contains(arg(), v, line);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.is(K::array) || v.is(K::object) || v.is(K::ns) || v.is(K::kwargs)) {
        return v.kind == o.kind && (v.is(K::array) ? v.arr == o.arr : v.obj == o.obj);
      }
      return v.kind == o.kind && py_equal(v, o);
    }
    if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, arg());
    if (name == "ne" || name == "!=") return !py_equal(v, arg());
    if (name == "lt" || name == "lessthan" || name == "<") return py_compare(v, arg(), line) < 0;
    if (name == "le" || name == "<=") return py_compare(v, arg(), line) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return py_compare(v, arg(), line) > 0;
    if (name == "ge" || name == ">=") return py_compare(v, arg(), line) >= 0;
    fail(line, "unsupported test '" + name + "'");
  }

  // Python's <, >, ...: numbers by value, strings by code point, lists item by item; other pairs are an error.
  static int py_compare(const Value& a, const Value& b, int line, int depth = 0) {
    using K = Value::Kind;
    check_depth(depth);
    const bool a_num = a.is_number() || a.is(K::boolean);
    const bool b_num = b.is_number() || b.is(K::boolean);
    if (a_num && b_num) {
      if (!a.is(K::floating) && !b.is(K::floating)) {
        const std::int64_t x = a.is(K::boolean) ? a.b : a.i, y = b.is(K::boolean) ? b.b : b.i;
        return x < y ? -1 : x > y ? 1 : 0;
      }
      return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    }
    if (a.is(K::string) && b.is(K::string)) {
      const int c = a.s.compare(b.s);  // bytes of UTF-8 order as code points do
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is(K::array) && b.is(K::array)) {
      const std::size_t n = std::min(a.arr->size(), b.arr->size());
      charge(n);
      for (std::size_t k = 0; k < n; ++k) {
        if (py_equal((*a.arr)[k], (*b.arr)[k])) continue;
        return py_compare((*a.arr)[k], (*b.arr)[k], line, depth + 1);
      }
      return a.arr->size() < b.arr->size() ? -1 : a.arr->size() > b.arr->size() ? 1 : 0;
    }
    if (a.is(K::undefined) || b.is(K::undefined)) {
      const Value& u = a.is(K::undefined) ? a : b;
      fail(line, "cannot compare an undefined value" + (u.s.empty() ? "" : " (" + u.s + ")"));
    }
    fail(line, "cannot compare " + a_kind(a) + " with " + a_kind(b));
  }

  Value eval_member(const Node& n, Env& env) {
    Value object = eval(*n.x, env);
    Value property;
    if (n.flag) {
      if (n.y->t == Node::T::slice) return eval_slice(object, *n.y, env);
      property = eval(*n.y, env);
    } else if (n.y->t == Node::T::int_lit) {
      property = Value::integer(n.y->i);
    } else {
      property = Value::string(n.y->str);
      // obj.name looks for a method first and obj['name'] for a key first, as Python Jinja (x.items is the method).
      if (object.is(Value::Kind::object)) {
        if (Value m = builtin(object, n.y->str); m.is(Value::Kind::function)) return m;
      }
    }
    return get_item(object, property, n.line);
  }

  // obj.name and obj[key] as Jinja's sandbox reads them: a missing key or index is undefined, and so is any
  // attribute of a number or none; but reading from an undefined value is an error (Jinja's UndefinedError).
  Value get_item(const Value& object, const Value& property, int line) {
    using K = Value::Kind;
    // Named only when something is missing: this runs for every m['content'] of every render.
    const auto what = [&] { return property.is(K::string) ? "'" + property.s + "'" : py_str(property); };
    if (object.is(K::undefined)) {
      fail(line, object.s.empty() ? "cannot read " + what() + " of an undefined value" : object.s);
    }
    if (object.is(K::object) || object.is(K::ns) || object.is(K::kwargs)) {
      if (property.is(K::integer) || property.is(K::boolean)) {
        if (const Value* v = object.obj->find(dict_key(property, line))) return *v;
      }
      if (property.is(K::string)) {
        if (const Value* v = object.obj->find(property.s)) return *v;
        if (object.is(K::object)) {
          Value m = builtin(object, property.s);
          if (!m.is(K::undefined)) return m;
        }
      }
      return Value::undefined((object.is(K::ns) ? "'namespace' has no attribute " : "'dict object' has no attribute ") +
                              what());
    }
    if (object.is(K::array) && object.b && property.is(K::string) &&
        (property.s == "grouper" || property.s == "list")) {
      return (*object.arr)[property.s == "grouper" ? 0 : 1];  // a groupby group
    }
    if (object.is(K::array) || object.is(K::string)) {
      if (property.is(K::integer) || property.is(K::boolean)) {
        const std::int64_t index = property.is(K::boolean) ? property.b : property.i;
        const auto missing = [&] {
          return (object.is(K::array) ? "list object has no element " : "str object has no element ") +
                 std::to_string(index);
        };
        if (object.is(K::string)) {
          const auto cps = code_points(object.s);
          const auto len = static_cast<std::int64_t>(cps.size());
          const std::int64_t k = index < 0 ? len + index : index;
          if (k < 0 || k >= len) return Value::undefined(missing());
          return Value::string(cps[static_cast<std::size_t>(k)]);
        }
        const auto len = static_cast<std::int64_t>(object.arr->size());
        const std::int64_t k = index < 0 ? len + index : index;
        if (k < 0 || k >= len) return Value::undefined(missing());
        return (*object.arr)[static_cast<std::size_t>(k)];
      }
      if (property.is(K::string)) {
        Value m = builtin(object, property.s);
        if (!m.is(K::undefined)) return m;
      }
      return Value::undefined(std::string(object.is(K::array) ? "'list object'" : "'str object'") +
                              " has no attribute " + what());
    }
    return Value::undefined("'" + kind_name(object) + "' has no attribute " + what());
  }

  Value eval_slice(const Value& object, const Node& sl, Env& env) {
    auto bound = [&](const NodePtr& p) -> std::optional<std::int64_t> {
      if (!p) return std::nullopt;
      Value v = eval(*p, env);
      if (v.is(Value::Kind::undefined)) return std::nullopt;
      if (!v.is(Value::Kind::integer)) fail(sl.line, "slice bounds must be integers");
      return v.i;
    };
    const auto start = bound(sl.x);
    const auto stop = bound(sl.y);
    const auto step = bound(sl.z).value_or(1);
    if (step == 0) fail(sl.line, "slice step cannot be zero");
    if (object.is(Value::Kind::array)) return Value::array(py_slice(*object.arr, start, stop, step));
    if (object.is(Value::Kind::string)) {
      std::string out;
      for (const auto& c : py_slice(code_points(object.s), start, stop, step)) out += c;
      return Value::string(out);
    }
    fail(sl.line, "cannot slice " + a_kind(object));
  }

  std::vector<Value> eval_args(const std::vector<NodePtr>& args, Env& env) {
    std::vector<Value> out;
    Value kwargs;
    for (const auto& a : args) {
      if (a->t == Node::T::kwarg) continue;
      out.push_back(eval(*a, env));
    }
    for (const auto& a : args) {
      if (a->t != Node::T::kwarg) continue;
      if (kwargs.is(Value::Kind::undefined)) kwargs = Value::object(Value::Kind::kwargs);
      if (kwargs.obj->find(a->str)) fail(a->line, "keyword argument '" + a->str + "' given twice");
      kwargs.obj->set(a->str, eval(*a->x, env));
    }
    if (!kwargs.is(Value::Kind::undefined)) out.push_back(kwargs);
    return out;
  }

  Value eval_call(const Node& n, Env& env) {
    std::vector<Value> args = eval_args(n.list, env);
    Value fn = eval(*n.x, env);
    if (fn.is(Value::Kind::object)) {  // a recursive loop's `loop` is called as loop(items)
      if (const Value* call = fn.obj->find("__call__"); call != nullptr && call->is(Value::Kind::function)) fn = *call;
    }
    if (!fn.is(Value::Kind::function)) {
      std::string what = n.x->t == Node::T::ident ? "'" + n.x->str + "'" : "expression";
      if (n.x->t == Node::T::member && !n.x->flag) {
        what = "'." + n.x->y->str + "()'";
        static const std::set<std::string, std::less<>> kChanging = {"append",  "extend", "insert", "pop",
                                                                     "remove",  "clear",  "update", "setdefault",
                                                                     "popitem", "sort",   "reverse"};
        if (kChanging.count(n.x->y->str) != 0) {
          fail(n.line, "cannot call " + what +
                           ": lists and dicts cannot be changed in a chat template (Jinja's "
                           "sandbox refuses it too); build a new one (x + [y]) or keep state in a namespace()");
        }
      }
      fail(n.line, "cannot call " + what + ": it is " + kind_name(fn) + " (unsupported function or method?)");
    }
    try {
      return (*fn.fn)(args, env);
    } catch (Error& e) {
      if (e.line == 0) e.line = n.line;
      throw;
    }
  }

  Value eval_binary(const Node& n, Env& env) {
    using K = Value::Kind;
    const Value left = eval(*n.x, env);
    if (n.str == "and") return truthy(left) ? eval(*n.y, env) : left;
    if (n.str == "or") return truthy(left) ? left : eval(*n.y, env);
    const Value right = eval(*n.y, env);
    const std::string& op = n.str;
    if (op == "==") return Value::boolean(py_equal(left, right));
    if (op == "!=") return Value::boolean(!py_equal(left, right));
    if (op == "~") return Value::string(py_str(left) + py_str(right));
    if (op == "in") return Value::boolean(contains(right, left, n.line));
    if (op == "not in") return Value::boolean(!contains(right, left, n.line));
    if (op == "<") return Value::boolean(py_compare(left, right, n.line) < 0);
    if (op == ">") return Value::boolean(py_compare(left, right, n.line) > 0);
    if (op == "<=") return Value::boolean(py_compare(left, right, n.line) <= 0);
    if (op == ">=") return Value::boolean(py_compare(left, right, n.line) >= 0);
    if (left.is(K::undefined) || right.is(K::undefined)) {
      const Value& u = left.is(K::undefined) ? left : right;
      fail(n.line, "cannot apply '" + op + "' to an undefined value" + (u.s.empty() ? "" : " (" + u.s + ")"));
    }
    // Python's bool is an int: True + 1 is 2.
    const bool l_num = left.is_number() || left.is(K::boolean);
    const bool r_num = right.is_number() || right.is(K::boolean);
    if (l_num && r_num) {
      const bool fl = left.is(K::floating) || right.is(K::floating);
      const double a = left.number(), b = right.number();
      const std::int64_t x = left.is(K::boolean) ? left.b : left.i, y = right.is(K::boolean) ? right.b : right.i;
      std::int64_t r = 0;
      // Python raises ZeroDivisionError where JavaScript would print Infinity/NaN.
      if ((op == "/" || op == "//" || op == "%") && b == 0) {
        fail(n.line, op == "%" ? "modulo by zero" : "division by zero");
      }
      if (op == "+") {
        if (fl) return Value::floating(a + b);
        if (__builtin_add_overflow(x, y, &r)) overflow(n.line, "'+'");
        return Value::integer(r);
      }
      if (op == "-") {
        if (fl) return Value::floating(a - b);
        if (__builtin_sub_overflow(x, y, &r)) overflow(n.line, "'-'");
        return Value::integer(r);
      }
      if (op == "*") {
        if (fl) return Value::floating(a * b);
        if (__builtin_mul_overflow(x, y, &r)) overflow(n.line, "'*'");
        return Value::integer(r);
      }
      if (op == "/") return Value::floating(a / b);
      if (op == "//") {
        if (fl) return Value::floating(std::floor(a / b));
        if (x == INT64_MIN && y == -1) overflow(n.line, "'//'");
        r = x / y;
        if (x % y != 0 && ((x < 0) != (y < 0))) --r;  // floor, as Python
        return Value::integer(r);
      }
      if (op == "%") {  // the sign of the divisor, as Python (-7 % 3 is 2), where C++ takes the dividend's
        if (fl) {
          double m = std::fmod(a, b);
          if (m != 0 && (m < 0) != (b < 0)) m += b;
          return Value::floating(m);
        }
        if (y == -1) return Value::integer(0);  // INT64_MIN % -1 traps in C++
        r = x % y;
        if (r != 0 && (r < 0) != (y < 0)) r += y;
        return Value::integer(r);
      }
      if (op == "**") {
        if (!fl && y >= 0) return Value::integer(int_pow(x, y, n.line));
        const double p = std::pow(a, b);
        // Python raises OverflowError for 10.0 ** 400 and gives a complex number for (-8) ** 0.5.
        if (std::isinf(p) && std::isfinite(a) && std::isfinite(b)) fail(n.line, "'**' result is too large (overflow)");
        if (std::isnan(p) && !std::isnan(a) && !std::isnan(b)) {
          fail(n.line, "'**' of a negative number to a fractional power has no real value");
        }
        return Value::floating(p);
      }
    }
    if (op == "+" && left.is(K::string) && right.is(K::string)) {
      if (!left.b && !right.b) return Value::string(left.s + right.s);
      // Markup + str escapes the str (markupsafe), whichever side it is on.
      Value markup =
          Value::string((left.b ? left.s : html_escape(left.s)) + (right.b ? right.s : html_escape(right.s)));
      markup.b = true;
      return markup;
    }
    if (op == "+" && left.is(K::array) && right.is(K::array) && left.tuple == right.tuple) {
      charge_copy(*left.arr);
      charge_copy(*right.arr);
      Array a = *left.arr;
      a.insert(a.end(), right.arr->begin(), right.arr->end());
      Value out = Value::array(std::move(a));
      out.tuple = left.tuple;
      return out;
    }
    // 'ab' * 3 and [0] * 2 repeat, as Python.
    if (op == "*" && (left.is(K::integer) || right.is(K::integer)) &&
        (left.is(K::string) || right.is(K::string) || left.is(K::array) || right.is(K::array))) {
      const Value& seq = left.is(K::integer) ? right : left;
      std::int64_t times = std::max<std::int64_t>(0, left.is(K::integer) ? left.i : right.i);
      const std::uint64_t unit = seq.is(K::string) ? seq.s.size() : seq.arr->size();
      if (unit == 0) times = 0;  // '' * (1 << 62) is '' at once
      std::uint64_t total = 0;
      if (__builtin_mul_overflow(unit, static_cast<std::uint64_t>(times), &total)) total = UINT64_MAX;
      if (seq.is(K::string)) {
        check_size(total, n.line);
        std::string out;
        for (std::int64_t k = 0; k < times; ++k) out += seq.s;
        charge(out.size() / 64);
        return Value::string(out);
      }
      if (total > kMaxItems) fail(n.line, "list is too long (limit " + std::to_string(kMaxItems) + " items)");
      // The strings are copied into every repeat: the text is bounded as one string's is.
      std::uint64_t text = 0;
      if (__builtin_mul_overflow(text_bytes(*seq.arr), static_cast<std::uint64_t>(times), &text)) text = UINT64_MAX;
      check_size(text, n.line);
      charge(total + text / 16);
      Array out;
      for (std::int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.arr->begin(), seq.arr->end());
      charge(out.size());
      Value v = Value::array(std::move(out));
      v.tuple = seq.tuple;
      return v;
    }
    if (op == "+" && (left.is(K::string) || right.is(K::string))) {
      fail(n.line, "cannot add " + a_kind(left) + " and " + a_kind(right) +
                       " with '+' (Python does not convert; use ~, which does)");
    }
    fail(n.line, "unsupported operator '" + op + "' between " + kind_name(left) + " and " + kind_name(right));
  }

  static std::int64_t int_pow(std::int64_t base, std::int64_t exp, int line) {
    std::int64_t result = 1;
    while (exp > 0) {
      if ((exp & 1) != 0 && __builtin_mul_overflow(result, base, &result)) overflow(line, "'**'");
      exp >>= 1;
      if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow(line, "'**'");
    }
    return result;
  }

  static void push_part(Array& parts, Value v) {
    if (parts.size() >= kMaxItems) fail(0, "split() makes too many parts (limit " + std::to_string(kMaxItems) + ")");
    parts.push_back(std::move(v));
  }

  // Methods and properties of strings, lists and dicts (str.strip(), dict.items(), list.length, ...).
  // Python's str.split(sep=None, maxsplit=-1).
  static Value split_string(const std::string& s, const std::vector<Value>& args) {
    using K = Value::Kind;
    Value sep = args.size() > 0 ? args[0] : Value::null();
    const std::int64_t maxsplit = args.size() > 1 && args[1].is(K::integer) ? args[1].i : -1;
    Array parts;
    if (sep.is(K::null)) {
      const std::string t = trim_start(s);
      std::size_t i = 0;
      while (i < t.size()) {
        while (std::size_t n = space_len_at(t, i)) i += n;
        if (i >= t.size()) break;
        if (maxsplit != -1 && static_cast<std::int64_t>(parts.size()) >= maxsplit) {
          push_part(parts, Value::string(t.substr(i)));
          break;
        }
        const std::size_t start = i;
        while (i < t.size() && space_len_at(t, i) == 0) {
          utf8::next_code_point(t, i);
        }
        push_part(parts, Value::string(t.substr(start, i - start)));
      }
      return Value::array(std::move(parts));
    }
    if (!sep.is(K::string)) fail(0, "split() separator must be a string");
    if (sep.s.empty()) fail(0, "split(): empty separator");
    std::size_t start = 0;
    while (true) {
      if (maxsplit != -1 && static_cast<std::int64_t>(parts.size()) >= maxsplit) {
        push_part(parts, Value::string(s.substr(start)));
        break;
      }
      const std::size_t at = find_text(s, sep.s, start);
      if (at == std::string::npos) {
        push_part(parts, Value::string(s.substr(start)));
        break;
      }
      push_part(parts, Value::string(s.substr(start, at - start)));
      start = at + sep.s.size();
    }
    return Value::array(std::move(parts));
  }

  Value builtin(const Value& self, const std::string& name) {
    using K = Value::Kind;
    if (self.is(K::string)) {
      const std::string s = self.s;
      auto method = [](auto body) { return Value::function(std::move(body)); };
      if (name == "upper")
        return method([s](std::vector<Value>&, Env&) { return Value::string(change_case(s, true)); });
      if (name == "lower")
        return method([s](std::vector<Value>&, Env&) { return Value::string(change_case(s, false)); });
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool left = name != "rstrip", right = name != "lstrip";
        return method([s, left, right, name](std::vector<Value>& args, Env&) {
          if (args.empty() || args[0].is(K::null)) return Value::string(strip(s, nullptr, left, right));
          if (!args[0].is(K::string)) fail(0, name + "() takes a string of characters to remove");
          return Value::string(strip(s, &args[0].s, left, right));
        });
      }
      if (name == "title") return method([s](std::vector<Value>&, Env&) { return Value::string(py_title(s)); });
      if (name == "capitalize") return method([s](std::vector<Value>&, Env&) { return Value::string(capitalize(s)); });
      if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
        return method([s, name](std::vector<Value>& args, Env&) {
          if (args.empty() || !args[0].is(K::string)) fail(0, name + "() needs a string");
          const std::string& sub = args[0].s;
          // start and end (code points, negative from the end, as a slice): the search runs in s[start:end].
          const bool sliced = args.size() > 1;
          const std::int64_t length = sliced ? cp_length(s) : 0;
          auto bound = [&](std::size_t k, std::int64_t fallback) {
            if (args.size() <= k || args[k].is(K::null)) return fallback;
            if (!args[k].is(K::integer)) fail(0, name + "(): start and end must be integers");
            const std::int64_t v = args[k].i < 0 ? std::max<std::int64_t>(length + args[k].i, 0) : args[k].i;
            return std::min(v, length);
          };
          auto byte_at = [&](std::int64_t cp) {  // the byte offset of code point `cp`
            std::size_t i = 0;
            for (std::int64_t k = 0; k < cp && i < s.size(); ++k) utf8::next_code_point(s, i);
            return i;
          };
          const std::int64_t raw_start = sliced && args[1].is(K::integer) ? args[1].i : 0;
          const std::int64_t start = bound(1, 0), end = std::max(bound(2, length), start);
          const std::size_t from = sliced ? byte_at(start) : 0;
          const std::string window = sliced ? s.substr(from, byte_at(end) - from) : s;
          if (sliced && raw_start > length) {  // Python: nothing is found past the end, not even ''
            if (name == "count") return Value::integer(0);
            if (name == "index" || name == "rindex") fail(0, name + "(): substring not found");
            return Value::integer(-1);
          }
          if (name == "count") {
            if (sub.empty()) return Value::integer(cp_length(window) + 1);
            std::int64_t n = 0;
            for (std::size_t at = find_text(window, sub); at != std::string::npos;
                 at = find_text(window, sub, at + sub.size()))
              ++n;
            return Value::integer(n);
          }
          const std::size_t at = name[0] == 'r' ? rfind_text(window, sub) : find_text(window, sub);
          if (at == std::string::npos) {
            if (name == "index" || name == "rindex") fail(0, name + "(): substring not found");
            return Value::integer(-1);
          }
          return Value::integer(start + cp_length(window.substr(0, at)));
        });
      }
      if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
          name == "isupper") {
        return method([s, name](std::vector<Value>&, Env&) {
          if (name == "islower" || name == "isupper") return Value::boolean(has_case(s, name == "isupper"));
          if (s.empty()) return Value::boolean(false);
          std::size_t i = 0;
          while (i < s.size()) {
            const auto c = static_cast<UChar32>(utf8::next_code_point(s, i));
            const bool ok = name == "isdigit"   ? u_isdigit(c) != 0
                            : name == "isalpha" ? u_isalpha(c) != 0
                            : name == "isalnum" ? u_isalnum(c) != 0
                                                : is_space(static_cast<char32_t>(c));
            if (!ok) return Value::boolean(false);
          }
          return Value::boolean(true);
        });
      }
      if (name == "splitlines") {
        return method([s](std::vector<Value>&, Env&) {
          Array lines;
          std::size_t start = 0;
          for (std::size_t k = 0; k < s.size(); ++k) {
            if (s[k] != '\n' && s[k] != '\r') continue;
            push_part(lines, Value::string(s.substr(start, k - start)));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            start = k + 1;
          }
          if (start < s.size()) push_part(lines, Value::string(s.substr(start)));
          return Value::array(std::move(lines));
        });
      }
      if (name == "join") {
        return method([s](std::vector<Value>& args, Env&) {
          if (args.empty()) fail(0, "join() needs a list");
          std::string out;
          bool first = true;
          for (const auto& e : iterate(args[0], 0)) {
            if (!e.is(K::string)) fail(0, "join() joins strings, got " + a_kind(e));
            out += (first ? "" : s) + e.s;
            first = false;
            check_size(out.size(), 0);
          }
          return Value::string(out);
        });
      }
      if (name == "format")
        return method([s](std::vector<Value>& args, Env&) { return Value::string(str_format(s, args)); });
      if (name == "startswith" || name == "endswith") {
        const bool starts = name == "startswith";
        return method([s, starts, name](std::vector<Value>& args, Env&) {
          if (args.empty()) fail(0, name + "() needs an argument");
          auto check = [&](const Value& p) {
            if (!p.is(K::string)) fail(0, name + "() arguments must be strings");
            if (p.s.size() > s.size()) return false;
            return starts ? s.compare(0, p.s.size(), p.s) == 0 : s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0;
          };
          if (args[0].is(K::array)) {
            for (const auto& p : *args[0].arr) {
              if (check(p)) return Value::boolean(true);
            }
            return Value::boolean(false);
          }
          return Value::boolean(check(args[0]));
        });
      }
      if (name == "split") {
        return method([s](std::vector<Value>& args, Env&) { return split_string(s, args); });
      }
      if (name == "replace") {
        return method([s](std::vector<Value>& args, Env&) { return Value::string(replace_string(s, args)); });
      }
      if (name == "rsplit") {
        return method([s](std::vector<Value>& args, Env&) {
          // split() of the reversed text, each part and their order reversed back.
          std::vector<Value> reversed_args = args;
          if (!reversed_args.empty() && reversed_args[0].is(K::string)) {
            reversed_args[0] = Value::string(reversed_text(reversed_args[0].s));
          }
          Value parts = split_string(reversed_text(s), reversed_args);
          Array out;
          for (auto it = parts.arr->rbegin(); it != parts.arr->rend(); ++it)
            out.push_back(Value::string(reversed_text(it->s)));
          return Value::array(std::move(out));
        });
      }
      return Value::undefined();
    }
    if (self.is(K::array)) {
      Value m = builtin_list_method(self, name);
      if (m.is(K::function)) m.depth = static_cast<std::uint16_t>(self.nesting() + 1);  // it holds the list
      return m;
    }
    if (self.is(K::object)) {
      Value m = builtin_dict_method(self, name);
      if (m.is(K::function)) m.depth = static_cast<std::uint16_t>(self.obj->depth + 1);  // it holds the dict
      return m;
    }
    return Value::undefined();
  }

  static Value builtin_list_method(const Value& self, const std::string& name) {
    {
      const std::shared_ptr<Array> arr = self.arr;
      if (name == "count") {
        return Value::function([arr](std::vector<Value>& args, Env&) {
          if (args.empty()) fail(0, "count() needs a value");
          charge(arr->size());
          return Value::integer(
              std::count_if(arr->begin(), arr->end(), [&](const Value& e) { return py_equal(e, args[0]); }));
        });
      }
      if (name == "index") {
        return Value::function([arr](std::vector<Value>& args, Env&) {
          if (args.empty()) fail(0, "index() needs a value");
          charge(arr->size());
          for (std::size_t k = 0; k < arr->size(); ++k) {
            if (py_equal((*arr)[k], args[0])) return Value::integer(static_cast<std::int64_t>(k));
          }
          fail(0, "index(): " + py_repr(args[0]) + " is not in the list");
        });
      }
    }
    return Value::undefined();
  }

  static Value builtin_dict_method(const Value& self, const std::string& name) {
    using K = Value::Kind;
    {
      const std::shared_ptr<Object> obj = self.obj;
      if (name == "items") return Value::function([obj](std::vector<Value>&, Env&) { return items_of(*obj); });
      if (name == "keys") {
        return Value::function([obj](std::vector<Value>&, Env&) {
          Array a;
          for (const auto& [k, _] : obj->items) a.push_back(key_value(k));
          return Value::array(std::move(a));
        });
      }
      if (name == "values") {
        return Value::function([obj](std::vector<Value>&, Env&) {
          Array a;
          for (const auto& [_, v] : obj->items) a.push_back(v);
          return Value::array(std::move(a));
        });
      }
      if (name == "get") {
        return Value::function([obj](std::vector<Value>& args, Env&) {
          if (args.empty()) fail(0, "get() needs a key");
          if (args[0].is(K::string) || args[0].is(K::integer) || args[0].is(K::boolean)) {
            if (const Value* v = obj->find(dict_key(args[0], 0))) return *v;
          }
          return args.size() > 1 ? args[1] : Value::null();
        });
      }
    }
    return Value::undefined();
  }

  static Value items_of(const Object& obj) {
    Array a;
    for (const auto& [k, v] : obj.items) a.push_back(Value::make_tuple({key_value(k), v}));
    return Value::array(std::move(a));
  }

  static std::string replace_string(const std::string& s, std::vector<Value>& args) {
    if (args.size() < 2 || !args[0].is(Value::Kind::string) || !args[1].is(Value::Kind::string)) {
      fail(0, "replace() needs two string arguments");
    }
    std::int64_t count = -1;
    if (args.size() > 2) {
      const Value& c = args[2];
      if (c.is(Value::Kind::integer)) count = c.i;
      if (c.is(Value::Kind::kwargs)) {
        if (const Value* v = c.obj->find("count"); v && v->is(Value::Kind::integer)) count = v->i;
      }
    }
    const std::string& from = args[0].s;
    const std::string& to = args[1].s;
    if (from.empty()) {
      // Python / the reference insert the replacement between characters.
      std::string out;
      std::int64_t done = 0;
      for (const auto& c : code_points(s)) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        out += c;
        check_size(out.size(), 0);
      }
      if (count < 0 || done < count) out += to;
      return out;
    }
    std::string out;
    std::size_t start = 0;
    std::int64_t done = 0;
    while (count < 0 || done < count) {
      const std::size_t at = find_text(s, from, start);
      if (at == std::string::npos) break;
      out += s.substr(start, at - start) + to;
      check_size(out.size(), 0);
      start = at + from.size();
      ++done;
    }
    return out + s.substr(start);
  }

  static int indent_width(const Value& width, int line) {
    if (width.i < 0 || width.i > kMaxIndent) {
      fail(line,
           "indent width must be between 0 and " + std::to_string(kMaxIndent) + ", got " + std::to_string(width.i));
    }
    return static_cast<int>(width.i);
  }

  static Value kwarg(const std::vector<Value>& args, const char* name) {
    if (!args.empty() && args.back().is(Value::Kind::kwargs)) {
      if (const Value* v = args.back().obj->find(name)) return *v;
    }
    return Value::undefined();
  }

  Value apply_filter(Value operand, const Node& filter, Env& env) {
    std::vector<Value> args;
    std::string name;
    if (filter.t == Node::T::ident) {
      name = filter.str;
    } else if (filter.t == Node::T::call && filter.x->t == Node::T::ident) {
      name = filter.x->str;
      args = eval_args(filter.list, env);
    } else {
      fail(filter.line, "invalid filter");
    }
    return filter_value(std::move(operand), name, args, filter.line, env);
  }

  // Jinja's filters, by name, with Python Jinja's arguments and results.
  Value filter_value(Value operand, const std::string& name, const std::vector<Value>& args, int line, Env& env) {
    using K = Value::Kind;
    const Frame frame(state_, line);  // counted as an evaluation (map() nests these; see its own bound)
    std::vector<Value> positional = args;
    if (!positional.empty() && positional.back().is(K::kwargs)) positional.pop_back();
    // The k-th positional argument, or the keyword argument of that name.
    auto arg = [&](std::size_t k, const char* key) { return k < positional.size() ? positional[k] : kwarg(args, key); };
    auto int_arg = [&](std::size_t k, const char* key, std::int64_t fallback) {
      const Value v = arg(k, key);
      if (v.is(K::undefined)) return fallback;
      if (!v.is(K::integer)) fail(line, "filter '" + name + "': " + key + " must be an integer, got " + kind_name(v));
      return v.i;
    };
    auto text = [&]() { return operand.is(K::string) ? operand.s : py_str(operand); };
    // Keys compared without case (Jinja's default for sort, min, max, unique, groupby, dictsort): each string is
    // lowered once here, not at every comparison.
    auto folded = [&](Array keys, bool fold) {
      if (!fold) return keys;
      for (auto& k : keys) {
        if (k.is(K::string)) {
          charge(k.s.size() / 16);
          k.s = change_case(k.s, false);
        }
      }
      return keys;
    };
    auto map_items = [&](const Value& attribute) {
      Array items = iterate(operand, line);
      if (attribute.is(K::string)) {
        for (auto& e : items) e = lookup_path(e, attribute.s);
      } else if (attribute.is(K::integer)) {
        for (auto& e : items) e = get_item(e, attribute, line);
      }
      return items;
    };

    if (name == "safe") {  // Markup: `+` with a plain string escapes that string, as markupsafe does
      Value markup = Value::string(text());
      markup.b = true;
      return markup;
    }
    if (name == "tojson") {
      JsonStyle style;
      const Value indent = arg(1, "indent");
      if (indent.is(K::integer)) style.indent = indent_width(indent, line);
      if (style.indent >= 0) style.item_sep = ",";
      const Value separators = kwarg(args, "separators");
      if (separators.is(K::array)) {
        if (separators.arr->size() != 2 || !(*separators.arr)[0].is(K::string) || !(*separators.arr)[1].is(K::string)) {
          fail(line, "tojson: separators must be two strings");
        }
        style.item_sep = (*separators.arr)[0].s;
        style.key_sep = (*separators.arr)[1].s;
      }
      style.sort_keys = truthy(kwarg(args, "sort_keys"));
      style.ensure_ascii = truthy(arg(0, "ensure_ascii"));
      return Value::string(to_json_impl(operand, style, 0));
    }
    if (name == "default" || name == "d") {
      const Value fallback = positional.size() > 0 ? positional[0] : Value::string("");
      if (operand.is(K::undefined) || (truthy(arg(1, "boolean")) && !truthy(operand))) return fallback;
      return operand;
    }
    if (name == "string") return Value::string(text());
    if (name == "list") return Value::array(iterate(operand, line));
    if (name == "join") {
      const Value sep = arg(0, "d");
      if (!sep.is(K::undefined) && !sep.is(K::string)) fail(line, "join: the separator must be a string");
      std::string out;
      bool first = true;
      for (const auto& e : map_items(arg(1, "attribute"))) {
        out += (first ? "" : sep.s) + py_str(e);
        first = false;
        check_size(out.size(), line);
      }
      return Value::string(out);
    }
    if (name == "length" || name == "count") {
      if (operand.is(K::string)) return Value::integer(cp_length(operand.s));
      if (operand.is(K::array)) return Value::integer(static_cast<std::int64_t>(operand.arr->size()));
      if (operand.is(K::object) || operand.is(K::kwargs)) {
        return Value::integer(static_cast<std::int64_t>(operand.obj->items.size()));
      }
      if (operand.is(K::undefined)) return Value::integer(0);
      fail(line, "cannot apply filter '" + name + "' to " + a_kind(operand) + " (it has no length)");
    }
    if (name == "first" || name == "last") {
      const Array items = iterate(operand, line);
      if (items.empty()) return Value::undefined("filter '" + name + "': the sequence is empty");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (operand.is(K::string)) return Value::string(reversed_text(operand.s));
      Array items = iterate(operand, line);
      return Value::array(Array(items.rbegin(), items.rend()));
    }
    if (name == "unique") {
      const bool case_sensitive = truthy(arg(0, "case_sensitive"));
      const Array items = iterate(operand, line);
      const Array keys = map_items(arg(1, "attribute"));
      Array out, seen;
      for (std::size_t k = 0; k < items.size(); ++k) {
        Value key = keys[k];
        if (!case_sensitive && key.is(K::string)) key.s = change_case(key.s, false);
        charge(seen.size());  // quadratic
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) continue;
        seen.push_back(key);
        out.push_back(items[k]);
      }
      return Value::array(std::move(out));
    }
    if (name == "sort" || name == "min" || name == "max") {
      const bool sort = name == "sort";
      const bool reverse = sort && truthy(arg(0, "reverse"));
      const bool case_sensitive = truthy(arg(sort ? 1 : 0, "case_sensitive"));
      const Value attribute = arg(sort ? 2 : 1, "attribute");
      const Array items = iterate(operand, line);
      const Array keys = folded(map_items(attribute), !case_sensitive);
      std::vector<std::size_t> order(items.size());
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
        charge(1);
        const int c = py_compare(keys[x], keys[y], line);
        return reverse ? c > 0 : c < 0;
      });
      if (!sort) {
        if (items.empty()) return Value::undefined("filter '" + name + "': the sequence is empty");
        if (name == "min") return items[order.front()];
        // max is the first of the largest, as Python's max()
        std::size_t best = order.back();
        for (std::size_t k : order) {
          if (py_compare(keys[k], keys[best], line) == 0) {
            best = k;
            break;
          }
        }
        return items[best];
      }
      Array out;
      for (std::size_t k : order) out.push_back(items[k]);
      return Value::array(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool attr = name == "selectattr" || name == "rejectattr";
      const bool keep = name == "select" || name == "selectattr";
      std::size_t first_test = 0;
      Value attribute;
      if (attr) {
        if (positional.empty() || !positional[0].is(K::string)) fail(line, "'" + name + "' needs an attribute name");
        attribute = positional[0];
        first_test = 1;
      }
      const Value test = first_test < positional.size() ? positional[first_test] : Value::undefined();
      if (!test.is(K::undefined) && !test.is(K::string)) fail(line, "'" + name + "': the test must be a name");
      const std::vector<Value> test_args(positional.begin() + std::min(positional.size(), first_test + 1),
                                         positional.end());
      // Jinja loops only over a true sequence here: none|selectattr(...) is empty.
      const Array items = truthy(operand) ? iterate(operand, line) : Array{};
      const Array values = !truthy(operand) ? Array{} : attr ? map_items(attribute) : items;
      Array out;
      for (std::size_t k = 0; k < items.size(); ++k) {
        const bool passed = test.is(K::undefined) ? truthy(values[k]) : test_value(test.s, values[k], test_args, line);
        if (passed == keep) out.push_back(items[k]);
      }
      return Value::array(std::move(out));
    }
    if (name == "map") {
      const Value attribute = kwarg(args, "attribute");
      Array out;
      if (!truthy(operand)) return Value::array();  // as Jinja: none|map(...) is empty
      if (!attribute.is(K::undefined)) {
        const Value fallback = kwarg(args, "default");
        for (auto& v : map_items(attribute))
          out.push_back(v.is(K::undefined) && !fallback.is(K::undefined) ? fallback : v);
        return Value::array(std::move(out));
      }
      if (positional.empty() || !positional[0].is(K::string)) fail(line, "'map' needs a filter name or attribute=...");
      std::vector<Value> rest(positional.begin() + 1, positional.end());
      if (!args.empty() && args.back().is(K::kwargs)) rest.push_back(args.back());
      // Bounded well below the evaluation depth: each level is a whole filter call on the stack.
      constexpr int kMaxMapDepth = 32;
      if (state_.map_depth >= kMaxMapDepth) {
        fail(line, "map() nests filters too deeply (limit " + std::to_string(kMaxMapDepth) + ")");
      }
      ++state_.map_depth;
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{state_.map_depth};
      for (const auto& e : iterate(operand, line)) out.push_back(filter_value(e, positional[0].s, rest, line, env));
      return Value::array(std::move(out));
    }
    if (name == "sum") {
      Value total = arg(1, "start");
      if (total.is(K::undefined)) total = Value::integer(0);
      for (const auto& e : map_items(arg(0, "attribute"))) {
        if (!(e.is_number() || e.is(K::boolean)) || !(total.is_number() || total.is(K::boolean))) {
          fail(line, "sum: cannot add " + a_kind(e) + " to " + a_kind(total));
        }
        if (total.is(K::floating) || e.is(K::floating)) {
          total = Value::floating(total.number() + e.number());
        } else {
          std::int64_t r = 0;
          if (__builtin_add_overflow(total.is(K::boolean) ? total.b : total.i, e.is(K::boolean) ? e.b : e.i, &r)) {
            overflow(line, "sum");
          }
          total = Value::integer(r);
        }
      }
      return total;
    }
    if (name == "batch" || name == "slice") {
      const std::int64_t n = int_arg(0, name == "batch" ? "linecount" : "slices", 0);
      if (n <= 0) fail(line, "filter '" + name + "' needs a count above 0");
      const Value fill = arg(1, "fill_with");
      const Array items = iterate(operand, line);
      Array out;
      // As Jinja: a fill of none (or none given) fills nothing.
      const bool filling = !fill.is(K::undefined) && !fill.is(K::null);
      if (name == "batch") {
        if (filling && static_cast<std::uint64_t>(n) > kMaxItems)
          fail(line, "batch: the line count is too large to fill");
        for (std::size_t k = 0; k < items.size(); k += static_cast<std::size_t>(n)) {
          Array part(
              items.begin() + static_cast<std::ptrdiff_t>(k),
              items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), k + static_cast<std::size_t>(n))));
          while (filling && part.size() < static_cast<std::size_t>(n)) part.push_back(fill);
          out.push_back(Value::array(std::move(part)));
        }
        return Value::array(std::move(out));
      }
      const std::size_t per = items.size() / static_cast<std::size_t>(n);
      const std::size_t extra = items.size() % static_cast<std::size_t>(n);
      std::size_t offset = 0;
      if (static_cast<std::uint64_t>(n) > kMaxItems) fail(line, "slice: too many slices");
      for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k) {
        const std::size_t size = per + (k < extra ? 1 : 0);
        Array part(items.begin() + static_cast<std::ptrdiff_t>(offset),
                   items.begin() + static_cast<std::ptrdiff_t>(offset + size));
        offset += size;
        if (filling && k >= extra) part.push_back(fill);
        out.push_back(Value::array(std::move(part)));
      }
      return Value::array(std::move(out));
    }
    if (name == "groupby") {
      const Value attribute = arg(0, "attribute");
      if (!attribute.is(K::string) && !attribute.is(K::integer)) fail(line, "filter 'groupby' needs an attribute");
      const Value fallback = arg(1, "default");
      const bool fold = !truthy(arg(2, "case_sensitive"));
      const Array items = iterate(operand, line);
      Array keys = map_items(attribute);
      for (auto& k : keys) {
        if (k.is(K::undefined) && !fallback.is(K::undefined)) k = fallback;
      }
      const Array compared = folded(keys, fold);
      std::vector<std::size_t> order(items.size());
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
        charge(1);
        return py_compare(compared[x], compared[y], line) < 0;
      });
      Array out;
      for (std::size_t k = 0; k < order.size();) {
        Array group;
        const std::size_t first = order[k];
        while (k < order.size() && py_compare(compared[order[k]], compared[first], line) == 0)
          group.push_back(items[order[k++]]);
        Value pair = Value::make_tuple({keys[first], Value::array(std::move(group))});
        pair.b = true;  // answers .grouper and .list
        out.push_back(std::move(pair));
      }
      return Value::array(std::move(out));
    }
    if (name == "items") {
      if (operand.is(K::undefined)) return Value::array();
      if (!operand.is(K::object) && !operand.is(K::kwargs))
        fail(line, "filter 'items' needs a dict, got " + kind_name(operand));
      return items_of(*operand.obj);
    }
    if (name == "dictsort") {
      if (!operand.is(K::object) && !operand.is(K::kwargs)) {
        fail(line, "filter 'dictsort' needs a dict, got " + kind_name(operand));
      }
      const bool case_sensitive = truthy(arg(0, "case_sensitive"));
      const Value by = arg(1, "by");
      const bool by_value = by.is(K::string) && by.s == "value";
      if (by.is(K::string) && by.s != "key" && by.s != "value") fail(line, "dictsort: by must be 'key' or 'value'");
      const bool reverse = truthy(arg(2, "reverse"));
      const Value list = items_of(*operand.obj);
      Array keys;
      for (const auto& pair : *list.arr) keys.push_back((*pair.arr)[by_value ? 1 : 0]);
      keys = folded(std::move(keys), !case_sensitive);
      std::vector<std::size_t> order(keys.size());
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
        charge(1);
        const int c = py_compare(keys[x], keys[y], line);
        return reverse ? c > 0 : c < 0;
      });
      Array sorted;
      for (const std::size_t k : order) sorted.push_back((*list.arr)[k]);
      return Value::array(std::move(sorted));
    }
    if (name == "attr") {
      const Value attribute = arg(0, "name");
      if (!attribute.is(K::string)) fail(line, "filter 'attr' needs a name");
      Value m = operand.is(K::ns) ? get_item(operand, attribute, line) : builtin(operand, attribute.s);
      return m;
    }
    if (name == "abs") {
      if (operand.is(K::floating)) return Value::floating(std::fabs(operand.f));
      if (operand.is(K::integer) || operand.is(K::boolean)) {
        const std::int64_t i = operand.is(K::boolean) ? operand.b : operand.i;
        if (i == INT64_MIN) overflow(line, "filter 'abs'");
        return Value::integer(i < 0 ? -i : i);
      }
      fail(line, "cannot apply filter 'abs' to " + a_kind(operand));
    }
    if (name == "int") return to_int_filter(operand, arg(0, "default"), line);
    if (name == "float") {
      if (operand.is_number() || operand.is(K::boolean)) return Value::floating(operand.number());
      const Value fallback = arg(0, "default");
      if (operand.is(K::string)) {
        const std::string t = strip(operand.s, nullptr, true, true);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size() && t.find_first_of("xXpP") == std::string::npos) {
          return Value::floating(d);
        }
      }
      return fallback.is(K::undefined) ? Value::floating(0) : fallback;
    }
    if (name == "round") {
      if (!operand.is_number() && !operand.is(K::boolean))
        fail(line, "cannot apply filter 'round' to " + a_kind(operand));
      const std::int64_t precision = int_arg(0, "precision", 0);
      const Value method = arg(1, "method");
      const std::string how = method.is(K::string) ? method.s : "common";
      if (how != "common" && how != "ceil" && how != "floor") fail(line, "round: method must be common, ceil or floor");
      if (how == "common" && !operand.is(K::floating)) {  // Python's round() of an int is an int
        const std::int64_t x = operand.is(K::boolean) ? operand.b : operand.i;
        if (precision >= 0) return Value::integer(x);
        if (precision < -18) return Value::integer(0);
        std::int64_t unit = 1;
        for (std::int64_t k = 0; k < -precision; ++k) unit *= 10;
        std::int64_t q = x / unit, r = x % unit;
        if (r < 0) {  // floor division
          r += unit;
          --q;
        }
        if (2 * r > unit || (2 * r == unit && q % 2 != 0)) ++q;  // ties to even
        std::int64_t out = 0;
        if (__builtin_mul_overflow(q, unit, &out)) overflow(line, "filter 'round'");
        return Value::integer(out);
      }
      const double x = operand.number();
      if (how != "common") {
        const double scale = std::pow(10.0, static_cast<double>(precision));
        return Value::floating((how == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
      }
      if (!std::isfinite(x)) return Value::floating(x);
      if (precision > 300) return Value::floating(x);  // past a double's digits: unchanged, as Python
      if (precision < -308) return Value::floating(std::copysign(0.0, x));
      if (precision >= 0) {
        // Python rounds the exact binary value to `precision` digits, ties to even: so does printf.
        char buf[512];
        std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
        return Value::floating(std::strtod(buf, nullptr));
      }
      const double scale = std::pow(10.0, static_cast<double>(-precision));
      return Value::floating(std::nearbyint(x / scale) * scale);
    }
    if (name == "upper") return Value::string(change_case(text(), true));
    if (name == "lower") return Value::string(change_case(text(), false));
    if (name == "title") return Value::string(jinja_title(text()));
    if (name == "capitalize") return Value::string(capitalize(text()));
    if (name == "trim") {
      const Value chars = arg(0, "chars");
      return Value::string(strip(text(), chars.is(K::string) ? &chars.s : nullptr, true, true));
    }
    if (name == "replace") {
      std::vector<Value> rest = args;
      return Value::string(replace_string(text(), rest));
    }
    if (name == "escape" || name == "e" || name == "forceescape") {
      if (operand.is(K::string) && operand.b && name != "forceescape") return operand;  // already Markup
      Value markup = Value::string(html_escape(text()));
      markup.b = true;
      return markup;
    }
    if (name == "format") return Value::string(printf_format(text(), positional));
    if (name == "wordcount") {
      const std::string s = text();
      std::int64_t words = 0;
      bool in_word = false;
      std::size_t i = 0;
      while (i < s.size()) {
        const auto c = static_cast<UChar32>(utf8::next_code_point(s, i));
        const bool w = u_isalnum(c) != 0 || c == '_';
        if (w && !in_word) ++words;
        in_word = w;
      }
      return Value::integer(words);
    }
    if (name == "center") {
      const std::string s = text();
      const std::int64_t width = int_arg(0, "width", 80);
      check_size(static_cast<std::size_t>(std::max<std::int64_t>(width, 0)), line);
      const std::int64_t margin = width - cp_length(s);
      if (margin <= 0) return Value::string(s);
      const std::int64_t left = margin / 2 + (margin & width & 1);  // as Python's str.center
      return Value::string(std::string(static_cast<std::size_t>(left), ' ') + s +
                           std::string(static_cast<std::size_t>(margin - left), ' '));
    }
    if (name == "truncate") {
      const std::vector<std::string> cps = code_points(text());
      const std::int64_t length = int_arg(0, "length", 255);
      const bool killwords = truthy(arg(1, "killwords"));
      const Value end_v = arg(2, "end");
      const std::string end = end_v.is(K::string) ? end_v.s : "...";
      const std::int64_t leeway = int_arg(3, "leeway", 5);
      const std::int64_t end_len = cp_length(end);
      if (length < end_len || leeway < 0) fail(line, "truncate: length must be at least the end's length");
      std::string s;
      for (const auto& c : cps) s += c;
      const auto size = static_cast<std::int64_t>(cps.size());
      if (size - leeway <= length) return Value::string(s);  // (length + leeway could overflow)
      std::string head;
      for (std::int64_t k = 0; k < length - end_len; ++k) head += cps[static_cast<std::size_t>(k)];
      if (!killwords) {
        const std::size_t space = head.rfind(' ');
        if (space != std::string::npos) head.resize(space);
      }
      return Value::string(head + end);
    }
    if (name == "indent") {
      const Value width = arg(0, "width");
      const std::string pad = width.is(K::string) ? width.s
                              : width.is(K::integer)
                                  ? std::string(static_cast<std::size_t>(indent_width(width, line)), ' ')
                                  : std::string(4, ' ');
      const bool first = truthy(arg(1, "first"));
      const bool blank = truthy(arg(2, "blank"));
      const std::string s = text();
      std::string out;
      std::size_t start = 0;
      for (std::size_t lineno = 0;; ++lineno) {
        const std::size_t nl = s.find('\n', start);
        const std::string part = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        if (lineno > 0) out += "\n";
        if ((lineno == 0 && !first) || (part.empty() && !blank)) {
          out += part;
        } else {
          out += pad + part;
        }
        check_size(out.size(), line);
        if (nl == std::string::npos) break;
        start = nl + 1;
      }
      return Value::string(out);
    }
    fail(line, "unsupported filter '" + name + "'");
  }

  // Jinja's int filter: a string is read as an integer, else as a float (then truncated); anything else that
  // Python's int() refuses gives the default.
  static Value to_int_filter(const Value& v, const Value& fallback, int line) {
    using K = Value::Kind;
    const Value otherwise = fallback.is(K::undefined) ? Value::integer(0) : fallback;
    if (v.is(K::integer)) return v;
    if (v.is(K::boolean)) return Value::integer(v.b ? 1 : 0);
    if (v.is(K::floating)) return std::isfinite(v.f) ? Value::integer(to_int64(std::trunc(v.f), line)) : otherwise;
    if (!v.is(K::string)) return otherwise;
    std::string t = strip(v.s, nullptr, true, true);
    // Python reads 1_000 (single underscores between digits).
    if (t.find('_') != std::string::npos) {
      std::string plain;
      for (std::size_t k = 0; k < t.size(); ++k) {
        if (t[k] != '_') {
          plain += t[k];
          continue;
        }
        if (k == 0 || k + 1 >= t.size() || !is_digit(t[k - 1]) || !is_digit(t[k + 1])) return otherwise;
      }
      t = plain;
    }
    std::int64_t i = 0;
    std::string_view digits = t;
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), i);
    if (!digits.empty() && r.ec == std::errc() && r.ptr == digits.data() + digits.size()) return Value::integer(i);
    char* end = nullptr;
    const double d = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(d) || t.find_first_of("xXpP") != std::string::npos) {
      return otherwise;
    }
    return Value::integer(to_int64(std::trunc(d), line));
  }

  static Value lookup_path(const Value& item, const std::string& path) {
    Value v = item;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (v.is(Value::Kind::object) || v.is(Value::Kind::ns)) {
        const Value* next = v.obj->find(part);
        if (!next) return Value::undefined();
        v = *next;
      } else if (v.is(Value::Kind::array)) {
        char* end = nullptr;
        const long k = std::strtol(part.c_str(), &end, 10);
        if (end == part.c_str() || k < 0 || static_cast<std::size_t>(k) >= v.arr->size()) return Value::undefined();
        v = (*v.arr)[static_cast<std::size_t>(k)];
      } else {
        return Value::undefined();
      }
      if (dot == std::string::npos) return v;
      start = dot + 1;
    }
  }
};

}  // namespace

std::string py_str(const Value& v) {
  return py_text(v, false, 0);
}

std::string py_repr(const Value& v) {
  return py_text(v, true, 0);
}

std::string to_json(const Value& v, int indent) {
  JsonStyle style;
  style.indent = indent;
  if (indent >= 0) style.item_sep = ",";
  return to_json_impl(v, style, 0);
}

Program parse(std::string_view source) {
  const Source src = preprocess(source);
  Parser parser(tokenize(src));
  return parser.parse_program();
}

void charge(std::uint64_t steps) {
  RenderState* st = t_state;
  if (st == nullptr) return;
  st->steps = steps > kMaxSteps ? kMaxSteps + 1 : st->steps + steps;
  if (st->steps > kMaxSteps) {
    fail(0, "template exceeded its step budget (" + std::to_string(kMaxSteps) +
                " evaluations, loop iterations and copied items; does it loop without end?)");
  }
}

std::uint64_t last_render_steps() {
  return t_last_steps;
}

Value make_namespace() {
  Value ns = Value::object(Value::Kind::ns);
  if (t_state != nullptr) t_state->namespaces.push_back(ns.obj);
  return ns;
}

std::string render(const Program& program, Env& globals) {
  RenderState state;
  RenderState* const outer = t_state;
  t_state = &state;
  struct Cleanup {
    RenderState& state;
    RenderState* outer;
    ~Cleanup() {
      t_state = outer;
      t_last_steps = state.steps;
      // Namespaces lived until now, so no value died through a chain of them; empty them before they go: this
      // breaks cycles (which would leak) and leaves only bounded chains of immutable lists/dicts to destroy.
      std::vector<std::pair<std::string, Value>> contents;
      for (const auto& ns : state.namespaces) {
        for (auto& item : ns->items) contents.push_back(std::move(item));
        ns->items.clear();
      }
      contents.clear();
      state.namespaces.clear();
    }
  } cleanup{state, outer};
  Interpreter interp(state, globals);
  try {
    return interp.block(program.body, globals);
  } catch (const BreakSignal&) {
    throw Error{0, "'break' outside a loop"};
  } catch (const ContinueSignal&) {
    throw Error{0, "'continue' outside a loop"};
  }
}

}  // namespace colibri::chat::jinja
