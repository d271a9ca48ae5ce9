// A small Jinja interpreter for chat templates (Debian has no C++ Jinja library). Lexing, whitespace control and
// evaluation follow @huggingface/jinja, the reference renderer of tests/js/template_reference.mjs.
#include "chat/jinja.hpp"

#include <unicode/ustring.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <optional>

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
  for (char c : src) {
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
        if (j + 1 < s.text.size() && s.text[j] == '{' &&
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

bool is_js_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
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
  return is_js_space(cp) ? j - i : 0;
}

std::string js_trim_end(std::string s) {
  while (!s.empty()) {
    std::size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    std::size_t j = start;
    if (!is_js_space(utf8::next_code_point(s, j))) break;
    s.resize(start);
  }
  return s;
}

std::string js_trim_start(const std::string& s) {
  std::size_t i = 0;
  while (std::size_t n = space_len_at(s, i)) i += n;
  return s.substr(i);
}

std::string js_trim(const std::string& s) {
  return js_trim_end(js_trim_start(s));
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
      tokens.back().value = js_trim_end(tokens.back().value);
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
          const char e = s[pos++];
          switch (e) {
            case 'n': str.push_back('\n'); break;
            case 't': str.push_back('\t'); break;
            case 'r': str.push_back('\r'); break;
            case 'b': str.push_back('\b'); break;
            case 'f': str.push_back('\f'); break;
            case 'v': str.push_back('\v'); break;
            case '\'': str.push_back('\''); break;
            case '"': str.push_back('"'); break;
            case '\\': str.push_back('\\'); break;
            case 'x':
            case 'u': {
              const std::size_t len = e == 'x' ? 2 : 4;
              if (pos + len > s.size()) fail(line_at(start), "invalid escape sequence");
              const std::string hex = s.substr(pos, len);
              if (!std::all_of(hex.begin(), hex.end(),
                               [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); })) {
                fail(line_at(start), "invalid hexadecimal escape \\" + std::string(1, e) + hex);
              }
              utf8::append(str, static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
              pos += len;
              break;
            }
            default: fail(line_at(start), std::string("unsupported escape sequence \\") + e);
          }
          continue;
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
  bool flag = false;  // member: computed; test: negate
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
                 "' (colibri's chat template interpreter supports set, if, for, macro, call, filter, generation, "
                 "break, continue)");
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
      if (is(Tok::comma)) ++pos_;
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
        if (t.value.find('.') != std::string::npos) {
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
        auto e = parse_expression_sequence(false);
        expect(Tok::rparen, "')'");
        return e;
      }
      case Tok::lbracket: {
        auto n = node(Node::T::array, t.line);
        while (!is(Tok::rbracket)) {
          if (pos_ >= toks_.size()) fail(t.line, "'[' is never closed");
          n->list.push_back(parse_expression());
          if (is(Tok::comma)) ++pos_;
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
          if (is(Tok::comma)) ++pos_;
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
    case Value::Kind::array: return "list";
    case Value::Kind::object: return "dict";
    case Value::Kind::ns: return "namespace";
    case Value::Kind::kwargs: return "keyword arguments";
    case Value::Kind::function: return "function";
  }
  return "value";
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

// JavaScript's Number#toString (shortest round-trip form).
std::string js_number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == std::floor(d) && std::fabs(d) < 1e21) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", d);
    return buf;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, r.ptr);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

std::string to_json_impl(const Value& v, int indent, int depth, bool convert_undefined, const std::string& item_sep,
                         const std::string& key_sep) {
  if (depth >= kMaxValueDepth) {
    fail(0, "value is nested too deeply to print (limit " + std::to_string(kMaxValueDepth) +
                "; does a namespace contain itself?)");
  }
  switch (v.kind) {
    case Value::Kind::null: return "null";
    case Value::Kind::undefined: return convert_undefined ? "null" : "undefined";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating: return std::isfinite(v.f) ? js_number(v.f) : "null";
    case Value::Kind::boolean: return v.b ? "true" : "false";
    case Value::Kind::string: return json_string(v.s);
    case Value::Kind::array:
    case Value::Kind::object:
    case Value::Kind::ns:
    case Value::Kind::kwargs: {
      const std::string unit = indent > 0 ? std::string(static_cast<std::size_t>(indent), ' ') : "";
      std::string base = "\n";
      for (int k = 0; k < depth; ++k) base += unit;
      const std::string child = base + unit;
      std::vector<std::string> parts;
      std::size_t total = 0;
      auto add = [&](std::string p) {
        total += p.size() + child.size() + item_sep.size();
        check_size(total, 0);
        parts.push_back(std::move(p));
      };
      if (v.kind == Value::Kind::array) {
        for (const auto& e : *v.arr) add(to_json_impl(e, indent, depth + 1, convert_undefined, item_sep, key_sep));
        std::string out = "[";
        if (indent > 0 && !parts.empty()) {
          out += child;
          for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? item_sep + child : "") + parts[k];
          return out + base + "]";
        }
        for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? item_sep : "") + parts[k];
        return out + "]";
      }
      for (const auto& [key, value] : v.obj->items) {
        std::string p =
            json_string(key) + key_sep + to_json_impl(value, indent, depth + 1, convert_undefined, item_sep, key_sep);
        add(indent > 0 ? child + p : p);
      }
      std::string out = "{";
      for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? item_sep : "") + parts[k];
      return out + (indent > 0 && !parts.empty() ? base : "") + "}";
    }
    case Value::Kind::function: fail(0, "cannot convert a function to JSON");
  }
  return "null";
}

std::string to_string(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "undefined";
    case Value::Kind::null: return "null";
    case Value::Kind::boolean: return v.b ? "true" : "false";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating: {
      if (v.f == 0 && std::signbit(v.f)) return "-0.0";
      if (std::isfinite(v.f) && v.f == std::floor(v.f)) return js_number(v.f) + ".0";
      return js_number(v.f);
    }
    case Value::Kind::string: return v.s;
    case Value::Kind::array:
    case Value::Kind::object:
    case Value::Kind::ns:
    case Value::Kind::kwargs: return to_json(v, -1, false);
    case Value::Kind::function: fail(0, "cannot print a function");
  }
  return "";
}

// JavaScript loose equality (`==`) of the underlying values: containers compare by identity.
bool loose_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool a_nullish = a.is(K::null) || a.is(K::undefined);
  const bool b_nullish = b.is(K::null) || b.is(K::undefined);
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  const bool a_num = a.is_number() || a.is(K::boolean);
  const bool b_num = b.is_number() || b.is(K::boolean);
  if (a_num && b_num) return a.number() == b.number();
  if (a.is(K::string) && b.is(K::string)) return a.s == b.s;
  if ((a.is(K::string) && b_num) || (a_num && b.is(K::string))) {
    const std::string& s = a.is(K::string) ? a.s : b.s;
    const double n = a.is(K::string) ? b.number() : a.number();
    const std::string t = js_trim(s);
    if (t.empty()) return n == 0;
    char* end = nullptr;
    const double parsed = std::strtod(t.c_str(), &end);
    return end == t.c_str() + t.size() && parsed == n;
  }
  if (a.kind != b.kind) return false;
  if (a.is(K::array)) return a.arr == b.arr;
  if (a.is(K::function)) return a.fn == b.fn;
  return a.obj == b.obj;
}

// Strict equality of primitives, used by the equalto test and "in" over lists (JS ===).
bool strict_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined:
    case K::null: return true;
    case K::boolean: return a.b == b.b;
    case K::string: return a.s == b.s;
    case K::array: return a.arr == b.arr;
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

// JavaScript string length (UTF-16 code units).
std::int64_t js_length(const std::string& s) {
  std::int64_t n = 0;
  std::size_t i = 0;
  while (i < s.size()) n += utf8::next_code_point(s, i) >= 0x10000 ? 2 : 1;
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

struct BreakSignal {};
struct ContinueSignal {};

class Interpreter {
 public:
  explicit Interpreter(RenderState& state) : state_(state) {}

  std::string block(const std::vector<NodePtr>& body, Env& env) {
    std::string out;
    for (const auto& n : body) {
      exec(*n, env, out);
      check_size(out.size(), n->line);
    }
    return out;
  }

 private:
  RenderState& state_;

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
      case Node::T::if_: out += block(truthy(eval(*n.x, env)) ? n.body : n.alt, env); return;
      case Node::T::for_: exec_for(n, env, out); return;
      case Node::T::macro: define_macro(n, env); return;
      case Node::T::break_: throw BreakSignal{};
      case Node::T::continue_: throw ContinueSignal{};
      case Node::T::filter_block: {
        Value body = Value::string(block(n.body, env));
        append(out, apply_filter(body, *n.x, env));
        return;
      }
      case Node::T::passthrough: out += block(n.body, env); return;
      case Node::T::call_block: {
        // The macro's scope opens inside this one, so its caller() is found there; it renders the body here.
        Env inner(&env);
        const auto* body = &n.body;
        inner.set("caller", Value::function([this, body, &env](std::vector<Value>&, Env&) {
                    return Value::string(block(*body, env));
                  }));
        append(out, eval(*n.x, inner));
        return;
      }
      default: append(out, eval(n, env)); return;
    }
  }

  static void append(std::string& out, const Value& v) {
    if (v.is(Value::Kind::null) || v.is(Value::Kind::undefined)) return;
    out += to_string(v);
  }

  void assign(const Node& target, const Value& v, Env& env, int line) {
    if (target.t == Node::T::ident) {
      env.set(target.str, v);
    } else if (target.t == Node::T::tuple) {
      if (!v.is(Value::Kind::array)) fail(line, "cannot unpack a " + kind_name(v) + " in set");
      if (v.arr->size() != target.list.size()) fail(line, "wrong number of items to unpack in set");
      for (std::size_t k = 0; k < target.list.size(); ++k) {
        if (target.list[k]->t != Node::T::ident) fail(line, "can only unpack into names");
        env.set(target.list[k]->str, (*v.arr)[k]);
      }
    } else if (target.t == Node::T::member) {
      Value object = eval(*target.x, env);
      if (!object.is(Value::Kind::ns))
        fail(line, "cannot set an attribute on a " + kind_name(object) + " (only on a namespace)");
      if (target.y->t != Node::T::ident || target.flag) fail(line, "namespace attribute must be a name");
      object.obj->set(target.y->str, v);
    } else {
      fail(line, "invalid target of set");
    }
  }

  void exec_set(const Node& n, Env& env) {
    const Value v = n.y ? eval(*n.y, env) : Value::string(block(n.body, env));
    assign(*n.x, v, env, n.line);
  }

  void exec_for(const Node& n, Env& env, std::string& out) {
    Env scope(&env);
    const Node* iterable_node = n.y.get();
    const Node* test = nullptr;
    if (iterable_node->t == Node::T::select) {
      test = iterable_node->y.get();
      iterable_node = iterable_node->x.get();
    }
    Value iterable = eval(*iterable_node, scope);
    // Lists are immutable, so the loop reads the list itself rather than a copy.
    std::shared_ptr<const Array> items_all;
    if (iterable.is(Value::Kind::array)) {
      items_all = iterable.arr;
    } else if (iterable.is(Value::Kind::object)) {
      auto keys = std::make_shared<Array>();
      for (const auto& [k, _] : iterable.obj->items) keys->push_back(Value::string(k));
      items_all = std::move(keys);
    } else {
      fail(n.line, "cannot loop over a " + kind_name(iterable) + " (expected a list or dict)");
    }
    charge(items_all->size());
    auto bind = [&](Env& target, const Value& item) {
      if (n.x->t == Node::T::ident) {
        target.set(n.x->str, item);
        return;
      }
      if (!item.is(Value::Kind::array)) fail(n.line, "cannot unpack a " + kind_name(item) + " into loop variables");
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
    for (std::int64_t k = 0; k < count; ++k) {
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
      scope.set("loop", loop);
      bind(scope, items[static_cast<std::size_t>(k)]);
      charge(5);  // an iteration also builds loop.* (9 entries)
      try {
        out += block(n.body, scope);  // an iteration cut by break/continue contributes nothing (as the reference)
        check_size(out.size(), n.line);
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
      iterated = true;
    }
    if (!iterated) out += block(n.alt, scope);
  }

  void define_macro(const Node& n, Env& env) {
    const Node* def = &n;
    env.set(n.str, Value::function([this, def](std::vector<Value>& args, Env& caller) {
              Env scope(&caller);
              std::vector<Value> positional = args;
              std::shared_ptr<Object> kwargs;
              if (!positional.empty() && positional.back().is(Value::Kind::kwargs)) {
                kwargs = positional.back().obj;
                positional.pop_back();
              }
              if (positional.size() > def->list.size()) {
                fail(def->line,
                     "macro '" + def->str + "' takes at most " + std::to_string(def->list.size()) + " argument(s)");
              }
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
        return Value::array(std::move(a));
      }
      case Node::T::object: {
        Value o = Value::object();
        for (std::size_t k = 0; k < n.list.size(); ++k) {
          Value key = eval(*n.list[k], env);
          if (!key.is(Value::Kind::string)) fail(n.line, "dict keys must be strings, got " + kind_name(key));
          o.obj->set(key.s, eval(*n.body[k], env));
        }
        return o;
      }
      case Node::T::ident: return env.lookup(n.str);
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
      case Node::T::test: return Value::boolean(run_test(n, eval(*n.x, env)) != n.flag);
      case Node::T::select: return truthy(eval(*n.y, env)) ? eval(*n.x, env) : Value::undefined();
      case Node::T::ternary: return truthy(eval(*n.x, env)) ? eval(*n.y, env) : eval(*n.z, env);
      default: fail(n.line, "statement used as an expression");
    }
  }

 private:
  bool run_test(const Node& n, const Value& v) {
    using K = Value::Kind;
    const std::string& t = n.str;
    if (t == "defined") return !v.is(K::undefined);
    if (t == "undefined") return v.is(K::undefined);
    if (t == "none") return v.is(K::null);
    if (t == "string") return v.is(K::string);
    if (t == "boolean") return v.is(K::boolean);
    if (t == "true") return v.is(K::boolean) && v.b;
    if (t == "false") return v.is(K::boolean) && !v.b;
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is(K::integer);
    if (t == "iterable") return v.is(K::array) || v.is(K::string);
    if (t == "mapping") return v.is(K::object) || v.is(K::kwargs);
    if (t == "sequence") return v.is(K::array) || v.is(K::object) || v.is(K::string);
    if (t == "callable") return v.is(K::function);
    if (t == "lower") return v.is(K::string) && v.s == change_case(v.s, false);
    if (t == "upper") return v.is(K::string) && v.s == change_case(v.s, true);
    if (t == "odd" || t == "even") {
      if (!v.is(K::integer)) fail(n.line, "test '" + t + "' needs an integer, got " + kind_name(v));
      return (v.i % 2 != 0) == (t == "odd");
    }
    fail(n.line, "unsupported test '" + t + "'");
  }

  bool named_test(const std::string& name, const Value& v, const Value* arg, int line) {
    if (name == "equalto" || name == "eq") return arg != nullptr && strict_equal(v, *arg);
    Node probe;
    probe.t = Node::T::test;
    probe.str = name;
    probe.line = line;
    return run_test(probe, v);
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
    }
    using K = Value::Kind;
    if (object.is(K::object) || object.is(K::ns) || object.is(K::kwargs)) {
      if (!property.is(K::string)) fail(n.line, "dict keys are strings, got " + kind_name(property));
      if (const Value* v = object.obj->find(property.s)) return *v;
      if (object.is(K::object)) return builtin(object, property.s);
      return Value::undefined();
    }
    if (object.is(K::array) || object.is(K::string)) {
      if (property.is(K::integer)) {
        if (object.is(K::string)) {
          const auto cps = code_points(object.s);
          const auto len = static_cast<std::int64_t>(cps.size());
          const std::int64_t k = property.i < 0 ? len + property.i : property.i;
          if (k < 0 || k >= len) return Value::undefined();
          return Value::string(cps[static_cast<std::size_t>(k)]);
        }
        const auto len = static_cast<std::int64_t>(object.arr->size());
        const std::int64_t k = property.i < 0 ? len + property.i : property.i;
        if (k < 0 || k >= len) return Value::undefined();
        return (*object.arr)[static_cast<std::size_t>(k)];
      }
      if (property.is(K::string)) return builtin(object, property.s);
      fail(n.line, "cannot index a " + kind_name(object) + " with a " + kind_name(property));
    }
    if (!property.is(K::string)) fail(n.line, "cannot index a " + kind_name(object) + " with a " + kind_name(property));
    return Value::undefined();
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
    fail(sl.line, "cannot slice a " + kind_name(object));
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
    if (!fn.is(Value::Kind::function)) {
      std::string what = n.x->t == Node::T::ident ? "'" + n.x->str + "'" : "expression";
      if (n.x->t == Node::T::member && !n.x->flag) what = "'." + n.x->y->str + "()'";
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
    if (n.str == "==") return Value::boolean(loose_equal(left, right));
    if (n.str == "!=") return Value::boolean(!loose_equal(left, right));
    if (left.is(K::undefined) || right.is(K::undefined)) {
      if (right.is(K::undefined) && (n.str == "in" || n.str == "not in")) return Value::boolean(n.str == "not in");
      fail(n.line, "cannot apply '" + n.str + "' to an undefined value");
    }
    if (left.is(K::null) || right.is(K::null)) fail(n.line, "cannot apply '" + n.str + "' to none");
    if (n.str == "~") return Value::string(to_string(left) + to_string(right));
    if (left.is_number() && right.is_number()) {
      const bool fl = left.is(K::floating) || right.is(K::floating);
      const double a = left.number(), b = right.number();
      const std::int64_t x = left.i, y = right.i;
      std::int64_t r = 0;
      // Python raises ZeroDivisionError where JavaScript would print Infinity/NaN.
      if ((n.str == "/" || n.str == "//" || n.str == "%") && b == 0) {
        fail(n.line, n.str == "%" ? "modulo by zero" : "division by zero");
      }
      if (n.str == "+") {
        if (fl) return Value::floating(a + b);
        if (__builtin_add_overflow(x, y, &r)) overflow(n.line, "'+'");
        return Value::integer(r);
      }
      if (n.str == "-") {
        if (fl) return Value::floating(a - b);
        if (__builtin_sub_overflow(x, y, &r)) overflow(n.line, "'-'");
        return Value::integer(r);
      }
      if (n.str == "*") {
        if (fl) return Value::floating(a * b);
        if (__builtin_mul_overflow(x, y, &r)) overflow(n.line, "'*'");
        return Value::integer(r);
      }
      if (n.str == "/") return Value::floating(a / b);
      if (n.str == "//") {
        if (fl) return Value::floating(std::floor(a / b));
        if (x == INT64_MIN && y == -1) overflow(n.line, "'//'");
        r = x / y;
        if (x % y != 0 && ((x < 0) != (y < 0))) --r;  // floor, as Python
        return Value::integer(r);
      }
      if (n.str == "%") {  // the sign of the divisor, as Python (-7 % 3 is 2), where C++ takes the dividend's
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
      if (n.str == "**") {
        if (!fl && y >= 0) return Value::integer(int_pow(x, y, n.line));
        const double p = std::pow(a, b);
        // Python raises OverflowError for 10.0 ** 400 and gives a complex number for (-8) ** 0.5.
        if (std::isinf(p) && std::isfinite(a) && std::isfinite(b)) fail(n.line, "'**' result is too large (overflow)");
        if (std::isnan(p) && !std::isnan(a) && !std::isnan(b)) {
          fail(n.line, "'**' of a negative number to a fractional power has no real value");
        }
        return Value::floating(p);
      }
      if (n.str == "<") return Value::boolean(a < b);
      if (n.str == ">") return Value::boolean(a > b);
      if (n.str == "<=") return Value::boolean(a <= b);
      if (n.str == ">=") return Value::boolean(a >= b);
    }
    if (left.is(K::array) && right.is(K::array) && n.str == "+") {
      Array a = *left.arr;
      a.insert(a.end(), right.arr->begin(), right.arr->end());
      return Value::array(std::move(a));
    }
    if (right.is(K::array) && (n.str == "in" || n.str == "not in")) {
      bool found = false;
      charge(right.arr->size());
      for (const auto& e : *right.arr) found = found || strict_equal(e, left);
      return Value::boolean(found == (n.str == "in"));
    }
    if ((left.is(K::string) || right.is(K::string)) && n.str == "+") {
      auto part = [&](const Value& v) -> std::string {
        if (v.is(K::string) || v.is_number() || v.is(K::boolean)) return to_string(v);
        fail(n.line, "cannot concatenate a string and a " + kind_name(v) + " with '+' (use ~ or |tojson)");
      };
      return Value::string(part(left) + part(right));
    }
    if (left.is(K::string) && right.is(K::string)) {
      if (n.str == "in") return Value::boolean(right.s.find(left.s) != std::string::npos);
      if (n.str == "not in") return Value::boolean(right.s.find(left.s) == std::string::npos);
      if (n.str == "<") return Value::boolean(left.s < right.s);
      if (n.str == ">") return Value::boolean(left.s > right.s);
      if (n.str == "<=") return Value::boolean(left.s <= right.s);
      if (n.str == ">=") return Value::boolean(left.s >= right.s);
    }
    if (left.is(K::string) && (right.is(K::object) || right.is(K::kwargs))) {
      if (n.str == "in") return Value::boolean(right.obj->find(left.s) != nullptr);
      if (n.str == "not in") return Value::boolean(right.obj->find(left.s) == nullptr);
    }
    fail(n.line, "unsupported operator '" + n.str + "' between " + kind_name(left) + " and " + kind_name(right));
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
  Value builtin(const Value& self, const std::string& name) {
    using K = Value::Kind;
    if (self.is(K::string)) {
      const std::string s = self.s;
      if (name == "length") return Value::integer(js_length(s));
      auto method = [](auto body) { return Value::function(std::move(body)); };
      if (name == "upper")
        return method([s](std::vector<Value>&, Env&) { return Value::string(change_case(s, true)); });
      if (name == "lower")
        return method([s](std::vector<Value>&, Env&) { return Value::string(change_case(s, false)); });
      // The reference trims JavaScript whitespace and ignores a chars argument.
      if (name == "strip") return method([s](std::vector<Value>&, Env&) { return Value::string(js_trim(s)); });
      if (name == "lstrip") return method([s](std::vector<Value>&, Env&) { return Value::string(js_trim_start(s)); });
      if (name == "rstrip") return method([s](std::vector<Value>&, Env&) { return Value::string(js_trim_end(s)); });
      if (name == "title") return method([s](std::vector<Value>&, Env&) { return Value::string(title_case(s)); });
      if (name == "capitalize") {
        return method([s](std::vector<Value>&, Env&) {
          if (s.empty()) return Value::string(s);
          std::size_t i = 0;
          utf8::next_code_point(s, i);
          return Value::string(change_case(s.substr(0, i), true) + s.substr(i));
        });
      }
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
        return method([s](std::vector<Value>& args, Env&) {
          Value sep = args.size() > 0 ? args[0] : Value::null();
          const std::int64_t maxsplit = args.size() > 1 && args[1].is(K::integer) ? args[1].i : -1;
          Array parts;
          if (sep.is(K::null)) {
            const std::string t = js_trim_start(s);
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
            const std::size_t at = s.find(sep.s, start);
            if (at == std::string::npos) {
              push_part(parts, Value::string(s.substr(start)));
              break;
            }
            push_part(parts, Value::string(s.substr(start, at - start)));
            start = at + sep.s.size();
          }
          return Value::array(std::move(parts));
        });
      }
      if (name == "replace") {
        return method([s](std::vector<Value>& args, Env&) { return Value::string(replace_string(s, args)); });
      }
      return Value::undefined();
    }
    if (self.is(K::array)) {
      if (name == "length") return Value::integer(static_cast<std::int64_t>(self.arr->size()));
      return Value::undefined();
    }
    if (self.is(K::object)) {
      Value m = builtin_dict_method(self, name);
      if (m.is(K::function)) m.depth = static_cast<std::uint16_t>(self.obj->depth + 1);  // it holds the dict
      return m;
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
          for (const auto& [k, _] : obj->items) a.push_back(Value::string(k));
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
          if (args.empty() || !args[0].is(K::string)) fail(0, "get() needs a string key");
          if (const Value* v = obj->find(args[0].s)) return *v;
          return args.size() > 1 ? args[1] : Value::null();
        });
      }
    }
    return Value::undefined();
  }

  static Value items_of(const Object& obj) {
    Array a;
    for (const auto& [k, v] : obj.items) a.push_back(Value::array({Value::string(k), v}));
    return Value::array(std::move(a));
  }

  static std::string title_case(const std::string& s) {
    std::string out = s;
    for (std::size_t k = 0; k < out.size(); ++k) {
      const bool boundary = k == 0 || !is_word(out[k - 1]);
      if (boundary && is_word(out[k])) out[k] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[k])));
    }
    return out;
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
      const std::size_t at = s.find(from, start);
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

  Value kwarg(const std::vector<Value>& args, const char* name) {
    if (!args.empty() && args.back().is(Value::Kind::kwargs)) {
      if (const Value* v = args.back().obj->find(name)) return *v;
    }
    return Value::undefined();
  }

  Value apply_filter(Value operand, const Node& filter, Env& env) {
    using K = Value::Kind;
    std::vector<Value> args;
    std::string name;
    const std::vector<NodePtr>* raw_args = nullptr;
    if (filter.t == Node::T::ident) {
      name = filter.str;
    } else if (filter.t == Node::T::call && filter.x->t == Node::T::ident) {
      name = filter.x->str;
      raw_args = &filter.list;
      args = eval_args(filter.list, env);
    } else {
      fail(filter.line, "invalid filter");
    }
    const int line = filter.line;
    std::vector<Value> positional = args;
    if (!positional.empty() && positional.back().is(K::kwargs)) positional.pop_back();

    if (name == "safe") return operand;
    if (name == "tojson") {
      const Value indent = kwarg(args, "indent");
      return Value::string(to_json(operand, indent.is(K::integer) ? indent_width(indent, line) : -1));
    }
    if (name == "default" || name == "d") {
      const Value fallback = positional.size() > 0 ? positional[0] : Value::string("");
      Value boolean = positional.size() > 1 ? positional[1] : kwarg(args, "boolean");
      if (operand.is(K::undefined) || (truthy(boolean) && !truthy(operand))) return fallback;
      return operand;
    }
    if (name == "join") {
      std::vector<std::string> parts;
      if (operand.is(K::string)) {
        parts = code_points(operand.s);
      } else if (operand.is(K::array)) {
        for (const auto& e : *operand.arr) parts.push_back(to_string(e));
      } else {
        fail(line, "cannot apply filter 'join' to a " + kind_name(operand));
      }
      Value sep = positional.size() > 0 ? positional[0] : kwarg(args, "separator");
      const std::string separator = sep.is(K::string) ? sep.s : "";
      std::string out;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        out += (k ? separator : "") + parts[k];
        check_size(out.size(), line);
      }
      return Value::string(out);
    }
    if (operand.is(K::array)) {
      const Array& a = *operand.arr;
      if (name == "list") return operand;
      if (name == "first") return a.empty() ? Value::undefined() : a.front();
      if (name == "last") return a.empty() ? Value::undefined() : a.back();
      if (name == "length" || name == "count") return Value::integer(static_cast<std::int64_t>(a.size()));
      if (name == "reverse") return Value::array(Array(a.rbegin(), a.rend()));
      if (name == "string") return Value::string(to_json(operand, -1, false));
      if (name == "unique") {
        Array out;
        for (const auto& e : a) {
          bool seen = false;
          charge(out.size());  // quadratic
          for (const auto& o : out) seen = seen || strict_equal(o, e);
          if (!seen) out.push_back(e);
        }
        return Value::array(std::move(out));
      }
      if (name == "selectattr" || name == "rejectattr") {
        const bool select = name == "selectattr";
        for (const auto& e : a) {
          if (!e.is(K::object) && !e.is(K::ns)) fail(line, "'" + name + "' works on a list of dicts");
        }
        if (!raw_args || raw_args->empty()) fail(line, "'" + name + "' needs an attribute name");
        for (const auto& ra : *raw_args) {
          if (ra->t != Node::T::str_lit) fail(line, "arguments of '" + name + "' must be string literals");
        }
        const std::string attr = positional[0].s;
        Array out;
        for (const auto& e : a) {
          const Value* v = e.obj->find(attr);
          // Like the reference, a missing attribute never passes the test (so "undefined" selects nothing).
          bool result = false;
          if (v != nullptr) {
            result = positional.size() > 1
                         ? named_test(positional[1].s, *v, positional.size() > 2 ? &positional[2] : nullptr, line)
                         : truthy(*v);
          }
          if (result == select) out.push_back(e);
        }
        return Value::array(std::move(out));
      }
      if (name == "map") {
        const Value attr = kwarg(args, "attribute");
        if (!attr.is(K::string)) fail(line, "'map' is supported with attribute=... only");
        const Value fallback = kwarg(args, "default");
        Array out;
        for (const auto& e : a) {
          if (!e.is(K::object) && !e.is(K::ns)) fail(line, "'map' works on a list of dicts");
          Value v = lookup_path(e, attr.s);
          out.push_back(v.is(K::undefined) ? fallback : v);
        }
        return Value::array(std::move(out));
      }
      if (name == "sort") {
        const Value attr = kwarg(args, "attribute");
        const bool reverse = truthy(positional.size() > 0 ? positional[0] : kwarg(args, "reverse"));
        Array out = a;
        std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
          charge(1);
          const Value vx = attr.is(K::string) ? lookup_path(x, attr.s) : x;
          const Value vy = attr.is(K::string) ? lookup_path(y, attr.s) : y;
          const int c = compare(vx, vy, line);
          return reverse ? c > 0 : c < 0;
        });
        return Value::array(std::move(out));
      }
      fail(line, "unsupported filter '" + name + "' on a list");
    }
    if (operand.is(K::string)) {
      const std::string& s = operand.s;
      if (name == "length" || name == "count") return Value::integer(js_length(s));
      if (name == "upper") return Value::string(change_case(s, true));
      if (name == "lower") return Value::string(change_case(s, false));
      if (name == "title") return Value::string(title_case(s));
      if (name == "capitalize") return builtin(operand, "capitalize").fn->operator()(args, env);
      if (name == "trim") return Value::string(js_trim(s));
      if (name == "string") return operand;
      if (name == "list") {
        Array out;
        for (const auto& c : code_points(s)) out.push_back(Value::string(c));
        return Value::array(std::move(out));
      }
      if (name == "int" || name == "float") {
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        const bool ok = end != s.c_str();
        if (!ok) return positional.empty() ? (name == "int" ? Value::integer(0) : Value::floating(0)) : positional[0];
        return name == "int" ? Value::integer(to_int64(std::trunc(d), line)) : Value::floating(d);
      }
      if (name == "replace") return Value::string(replace_string(s, args));
      if (name == "indent") {
        const Value width = positional.size() > 0 ? positional[0] : kwarg(args, "width");
        const bool first = truthy(positional.size() > 1 ? positional[1] : kwarg(args, "first"));
        const bool blank = truthy(positional.size() > 2 ? positional[2] : kwarg(args, "blank"));
        const std::string pad(static_cast<std::size_t>(width.is(K::integer) ? indent_width(width, line) : 4), ' ');
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
      fail(line, "unsupported filter '" + name + "' on a string");
    }
    if (operand.is_number()) {
      if (name == "abs") {
        if (operand.is(K::floating)) return Value::floating(std::fabs(operand.f));
        if (operand.i == INT64_MIN) overflow(line, "filter 'abs'");
        return Value::integer(operand.i < 0 ? -operand.i : operand.i);
      }
      if (name == "int") {
        if (operand.is(K::integer)) return operand;
        return Value::integer(to_int64(std::floor(operand.f), line));
      }
      if (name == "float") return Value::floating(operand.number());
      if (name == "string") return Value::string(to_string(operand));
      if (name == "round") {
        const Value precision = positional.size() > 0 ? positional[0] : kwarg(args, "precision");
        const double p = std::pow(10.0, precision.is(K::integer) ? static_cast<double>(precision.i) : 0.0);
        return Value::floating(std::round(operand.number() * p) / p);
      }
      fail(line, "unsupported filter '" + name + "' on a number");
    }
    if (operand.is(K::object) || operand.is(K::kwargs)) {
      if (name == "items") return items_of(*operand.obj);
      if (name == "length" || name == "count")
        return Value::integer(static_cast<std::int64_t>(operand.obj->items.size()));
      if (name == "dictsort") {
        Value list = items_of(*operand.obj);
        std::stable_sort(list.arr->begin(), list.arr->end(),
                         [&](const Value& x, const Value& y) { return compare((*x.arr)[0], (*y.arr)[0], line) < 0; });
        return list;
      }
      Value b = builtin(operand, name);
      if (b.is(K::function)) return (*b.fn)(args, env);
      fail(line, "unsupported filter '" + name + "' on a dict");
    }
    if (operand.is(K::boolean)) {
      if (name == "bool") return operand;
      if (name == "int") return Value::integer(operand.b ? 1 : 0);
      if (name == "float") return Value::floating(operand.b ? 1 : 0);
      if (name == "string") return Value::string(operand.b ? "true" : "false");
    }
    fail(line, "cannot apply filter '" + name + "' to a " + kind_name(operand));
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

  static int compare(const Value& a, const Value& b, int line) {
    if ((a.is_number() || a.is(Value::Kind::boolean)) && (b.is_number() || b.is(Value::Kind::boolean))) {
      return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    }
    if (a.is(Value::Kind::string) && b.is(Value::Kind::string)) {
      const std::string x = change_case(a.s, false), y = change_case(b.s, false);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    fail(line, "cannot compare a " + kind_name(a) + " with a " + kind_name(b));
  }
};

}  // namespace

std::string to_json(const Value& v, int indent, bool convert_undefined) {
  return to_json_impl(v, indent, 0, convert_undefined, indent > 0 ? "," : ", ", ": ");
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
  Interpreter interp(state);
  try {
    return interp.block(program.body, globals);
  } catch (const BreakSignal&) {
    throw Error{0, "'break' outside a loop"};
  } catch (const ContinueSignal&) {
    throw Error{0, "'continue' outside a loop"};
  }
}

}  // namespace colibri::chat::jinja
