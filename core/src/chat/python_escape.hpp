// One escape of a Python string literal, as Python reads it: shared by the Jinja lexer (templates' string literals)
// and the pythonic tool-call reader (a model's call arguments).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/utf8.hpp"

namespace colibri::chat {

enum class PythonEscape {
  ok,
  surrogate,     // a \u or \U escape of U+D800..U+DFFF (appended; Python allows it in a str)
  cut,           // the text ends before the escape's hex digits do (those present are hex)
  bad_hex,       // a \x, \u or \U digit that is no hex digit
  past_unicode,  // a \U escape past U+10FFFF
};

// The hex digits of a \x, \u or \U escape, by its letter.
inline std::size_t python_hex_escape_width(char letter) {
  return letter == 'x' ? 2 : letter == 'u' ? 4 : 8;
}

// The escape whose letter is text[pos] (after its backslash): what it stands for is appended to `out` (nothing on cut,
// bad_hex and past_unicode) and pos moves past it. An unknown escape is kept as it is ("\d": a backslash and a d).
inline PythonEscape read_python_escape(std::string_view text, std::size_t& pos, std::string& out) {
  const char e = text[pos++];
  switch (e) {
    case 'n': out += '\n'; return PythonEscape::ok;
    case 't': out += '\t'; return PythonEscape::ok;
    case 'r': out += '\r'; return PythonEscape::ok;
    case 'b': out += '\b'; return PythonEscape::ok;
    case 'f': out += '\f'; return PythonEscape::ok;
    case 'v': out += '\v'; return PythonEscape::ok;
    case 'a': out += '\a'; return PythonEscape::ok;
    case '\n': return PythonEscape::ok;  // a backslash at the end of a line joins the lines
    case '\\':
    case '\'':
    case '"': out += e; return PythonEscape::ok;
    case 'x':
    case 'u':
    case 'U': {
      const std::size_t width = python_hex_escape_width(e);
      std::uint32_t cp = 0;
      for (std::size_t i = 0; i < width; ++i) {
        if (pos + i >= text.size()) return PythonEscape::cut;
        const char h = text[pos + i];
        const int v = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
        if (v < 0) return PythonEscape::bad_hex;
        cp = cp * 16 + static_cast<std::uint32_t>(v);
      }
      if (cp > 0x10FFFF) return PythonEscape::past_unicode;
      pos += width;
      tokenizer::utf8::append(out, static_cast<char32_t>(cp));
      return cp >= 0xD800 && cp <= 0xDFFF ? PythonEscape::surrogate : PythonEscape::ok;
    }
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7': {  // octal, 1 to 3 digits
      auto cp = static_cast<std::uint32_t>(e - '0');
      for (int more = 0; more < 2 && pos < text.size() && text[pos] >= '0' && text[pos] <= '7'; ++more) {
        cp = cp * 8 + static_cast<std::uint32_t>(text[pos++] - '0');
      }
      tokenizer::utf8::append(out, static_cast<char32_t>(cp));
      return PythonEscape::ok;
    }
    default:
      out += '\\';
      out += e;
      return PythonEscape::ok;
  }
}

}  // namespace colibri::chat
