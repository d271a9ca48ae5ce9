#include "colibri/server/chat_output.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "chat/python_escape.hpp"
#include "colibri/engine/json_constraint.hpp"
#include "colibri/server/json_brackets.hpp"

namespace colibri::server {

using nlohmann::json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
// Hunyuan-A13B: a JSON list of call objects between these tags.
constexpr std::string_view kHunyuanOpen = "<tool_calls>", kHunyuanClose = "</tool_calls>";
constexpr std::string_view kDeepseekCallsOpen = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepseekCallsClose = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepseekCallOpen = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepseekCallClose = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepseekSep = "<｜tool▁sep｜>";

// The syntaxes whose calls sit in a section (or each follow its own opener, where the section's is empty), each a
// header that names the function and a JSON arguments object.
struct SectionSyntax {
  std::string_view section_open, call_open, sep, call_close, section_close;
  bool fenced = false;   // DeepSeek V3: "function<sep>NAME\n```json\n{...}\n```"; the others "HEADER<sep>{...}"
  bool kimi_id = false;  // Kimi K2's header is "functions.NAME:INDEX"
  std::string_view id_marker = {};  // Mistral's header may be "NAME[CALL_ID]ID"
};
constexpr SectionSyntax kDeepseekV3{kDeepseekCallsOpen, kDeepseekCallOpen,   kDeepseekSep,
                                    kDeepseekCallClose, kDeepseekCallsClose, true};
constexpr SectionSyntax kDeepseekV31{kDeepseekCallsOpen, kDeepseekCallOpen, kDeepseekSep, kDeepseekCallClose,
                                     kDeepseekCallsClose};
constexpr SectionSyntax kKimiK2{"<|tool_calls_section_begin|>",
                                "<|tool_call_begin|>",
                                "<|tool_call_argument_begin|>",
                                "<|tool_call_end|>",
                                "<|tool_calls_section_end|>",
                                false,
                                true};
constexpr SectionSyntax kMistralV11{"", kMistralOpen, "[ARGS]", "", "", false, false, "[CALL_ID]"};

const SectionSyntax* section_syntax(ToolFormat format) {
  switch (format) {
    case ToolFormat::deepseek_v3: return &kDeepseekV3;
    case ToolFormat::deepseek_v31: return &kDeepseekV31;
    case ToolFormat::kimi_k2: return &kKimiK2;
    case ToolFormat::mistral_v11: return &kMistralV11;
    default: return nullptr;
  }
}

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";
constexpr std::string_view kArgKeyOpen = "<arg_key>";
constexpr std::string_view kArgKeyClose = "</arg_key>";
constexpr std::string_view kArgValueOpen = "<arg_value>";
constexpr std::string_view kArgValueClose = "</arg_value>";

// The XML syntaxes: each value bare text between tags. Qwen's and GLM's wrap each call in <tool_call>; MiniMax's and
// DeepSeek's DSML put many <invoke> calls in one block.
struct XmlSyntax {
  std::string_view open = {}, close = {};  // around each call, or around the block
  bool block = false;                      // many calls between open and close
  std::string_view call_open = {};         // then the name (GLM: none, the name follows `open`)
  std::string_view name_end = {};          // GLM: none, the name ends with its line or at the next tag
  std::string_view call_close = {};        // GLM: none, `close` ends the call
  std::string_view key_open = {}, key_end = {};
  bool attributes = false;           // DSML: attributes follow the key up to '>' (string="true" or "false")
  std::string_view value_open = {};  // GLM's <arg_value>
  std::string_view value_close = {};
  bool newlines = false;  // Qwen's template writes a newline around each value, which is not part of it
  // Qwen: a value also ends where the next parameter or the call's close begins (vLLM reads a missing </parameter>
  // so). MiniMax: spaces around a value are not part of it, and null, none and nil are null (as vLLM reads them).
  bool open_values = false;
  bool trimmed = false;
};
constexpr XmlSyntax kQwenXml{.open = kHermesOpen,
                             .close = kHermesClose,
                             .call_open = kFunctionOpen,
                             .name_end = ">",
                             .call_close = kFunctionClose,
                             .key_open = kParameterOpen,
                             .key_end = ">",
                             .value_close = kParameterClose,
                             .newlines = true,
                             .open_values = true};
constexpr XmlSyntax kGlmXml{.open = kHermesOpen,
                            .close = kHermesClose,
                            .key_open = kArgKeyOpen,
                            .key_end = kArgKeyClose,
                            .value_open = kArgValueOpen,
                            .value_close = kArgValueClose};
constexpr XmlSyntax kMinimaxXml{.open = "<minimax:tool_call>",
                                .close = "</minimax:tool_call>",
                                .block = true,
                                .call_open = "<invoke name=\"",
                                .name_end = "\">",
                                .call_close = "</invoke>",
                                .key_open = "<parameter name=\"",
                                .key_end = "\">",
                                .value_close = kParameterClose,
                                .trimmed = true};
// DeepSeek V3.2's and V4's DSML: the same tags in a block of another name.
constexpr XmlSyntax dsml(std::string_view open, std::string_view close) {
  return XmlSyntax{.open = open,
                   .close = close,
                   .block = true,
                   .call_open = "<｜DSML｜invoke name=\"",
                   .name_end = "\">",
                   .call_close = "</｜DSML｜invoke>",
                   .key_open = "<｜DSML｜parameter name=\"",
                   .key_end = "\"",
                   .attributes = true,
                   .value_close = "</｜DSML｜parameter>"};
}
constexpr XmlSyntax kDsmlV32 = dsml("<｜DSML｜function_calls>", "</｜DSML｜function_calls>");
constexpr XmlSyntax kDsmlV4 = dsml("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>");

const XmlSyntax* xml_syntax(ToolFormat format) {
  switch (format) {
    case ToolFormat::qwen3_coder: return &kQwenXml;
    case ToolFormat::glm45: return &kGlmXml;
    case ToolFormat::minimax_m2: return &kMinimaxXml;
    case ToolFormat::deepseek_v32: return &kDsmlV32;
    case ToolFormat::deepseek_v4: return &kDsmlV4;
    default: return nullptr;
  }
}

std::string_view opening_marker(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes: return kHermesOpen;
    case ToolFormat::qwen3_coder:
    case ToolFormat::glm45:
    case ToolFormat::minimax_m2:
    case ToolFormat::deepseek_v32:
    case ToolFormat::deepseek_v4: return xml_syntax(format)->open;
    case ToolFormat::mistral: return kMistralOpen;
    case ToolFormat::hunyuan: return kHunyuanOpen;
    case ToolFormat::deepseek_v3:
    case ToolFormat::deepseek_v31:
    case ToolFormat::kimi_k2: return section_syntax(format)->section_open;
    case ToolFormat::mistral_v11: return kMistralOpen;
    case ToolFormat::harmony:      // HarmonyStream reads its calls
    case ToolFormat::llama3_json:  // no marker: the answer's start (parse_llama3_json)
    case ToolFormat::pythonic:     // the whole answer (PythonicReader)
    case ToolFormat::none: break;
  }
  return {};
}

// Llama's optional tags before (and, Llama 4's <|python_end|>, between or after) its JSON calls.
constexpr std::string_view kPythonTag = "<|python_tag|>", kPythonStart = "<|python_start|>",
                           kPythonEnd = "<|python_end|>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}
std::size_t skip_space(std::string_view text, std::size_t pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
  return pos;
}
std::string_view trim_right(std::string_view text) {
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}
std::string_view trim(std::string_view text) {
  return trim_right(text.substr(skip_space(text, 0)));
}
bool is_identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// How many bytes at the end of `text` may still grow into `marker` (the longest tail that is a proper prefix of it).
std::size_t marker_tail(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// The end of the JSON object or array that starts at `pos`; nullopt when it does not close in `text`.
std::optional<std::size_t> json_value_end(std::string_view text, std::size_t pos) {
  if (pos >= text.size() || (text[pos] != '{' && text[pos] != '[')) return std::nullopt;
  std::size_t depth = 0;
  JsonBrackets brackets;
  for (std::size_t i = pos; i < text.size(); ++i) {
    const int step = brackets.step(text[i]);
    if (step > 0) {
      ++depth;
    } else if (step < 0 && --depth == 0) {
      return i + 1;
    }
  }
  return std::nullopt;
}

// The JSON object or array at `pos` (after whitespace), and where it ends.
std::optional<json> json_value_at(std::string_view text, std::size_t& pos) {
  const std::size_t start = skip_space(text, pos);
  const auto end = json_value_end(text, start);
  if (!end) return std::nullopt;
  json value = json::parse(text.substr(start, *end - start), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  pos = *end;
  return value;
}

// Reads a call object {"name": ..., "arguments": {...}} byte by byte from its '{' (spaces before it are skipped): the
// name's JSON string token, and the arguments object's text minified. It does not check the JSON (the caller does):
// on valid JSON what it finds is exact, so the parse of a whole answer and a stream read the same arguments.
class CallScanner {
 public:
  void step(char c) {
    if (closed_) return;
    const bool quoted = brackets_.in_string();
    const int d = brackets_.step(c);
    const int depth = depth_;  // before this byte
    depth_ += d;
    if (depth == 0) return;  // the object's '{'
    if (depth >= 2) {        // inside a member's value
      if (member_ == Member::arguments && arguments_.text().size() > 0 && !arguments_.complete()) arguments_.step(c);
      return;
    }
    if (!value_) {  // a key, up to its ':'
      if (quoted || c == '"') {
        key_ += c;
      } else if (c == ':') {
        start_value();
      }
      return;
    }
    if (!quoted && (c == ',' || d < 0)) {  // the value ends; '}' ends the object too
      value_ = false;
      key_.clear();
      closed_ = d < 0;
      return;
    }
    if (member_ == Member::name) {
      if (quoted || !is_space(c)) name_ += c;
      if (quoted && !brackets_.in_string()) name_token_ = name_;  // the string closed
    } else if (member_ == Member::arguments && (quoted || !is_space(c))) {
      if (c == '{' && !quoted && arguments_.text().empty()) {
        arguments_.step(c);
      } else {
        arguments_other_ = true;  // a string (read by the caller), or no object
      }
    }
  }

  [[nodiscard]] bool closed() const { return closed_; }
  // "name" twice, or "arguments" / "parameters" twice: a parser could take either.
  [[nodiscard]] bool ambiguous() const { return names_ > 1 || argument_keys_ > 1; }
  [[nodiscard]] const std::string& name_token() const { return name_token_; }  // empty until the string closes
  // The arguments are an object, begun: its text so far, and whether it has closed.
  [[nodiscard]] bool arguments_object() const { return !arguments_other_ && !arguments_.text().empty(); }
  [[nodiscard]] const std::string& arguments() const { return arguments_.text(); }
  [[nodiscard]] bool arguments_complete() const { return arguments_.complete(); }

 private:
  enum class Member { other, name, arguments };
  void start_value() {
    value_ = true;
    member_ = Member::other;
    const json key = json::parse(key_, nullptr, /*allow_exceptions=*/false);
    if (!key.is_string()) return;
    const auto& k = key.get_ref<const std::string&>();
    if (k == "name" && ++names_ == 1) member_ = Member::name;
    if ((k == "arguments" || k == "parameters") && ++argument_keys_ == 1) member_ = Member::arguments;
  }

  JsonBrackets brackets_;
  int depth_ = 0;
  bool closed_ = false, value_ = false, arguments_other_ = false;
  Member member_ = Member::other;
  std::string key_, name_, name_token_;
  int names_ = 0, argument_keys_ = 0;
  JsonMinifier arguments_;
};

// Arguments that are not an object: a string that holds JSON is taken as that text; missing arguments are an empty
// object.
std::optional<std::string> arguments_text(const json* arguments) {
  if (arguments == nullptr || arguments->is_null()) return std::string("{}");
  if (arguments->is_string()) {
    const auto& s = arguments->get_ref<const std::string&>();
    if (json::accept(s)) return s;
  }
  return std::nullopt;
}

// {"name": ..., "arguments": {...}} (some models write "parameters"), `text` being its JSON text.
std::optional<ToolCall> call_from_object(const json& object, std::string_view text) {
  if (!object.is_object()) return std::nullopt;
  auto name = object.find("name");
  if (name == object.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  CallScanner scan;
  for (const char c : text) scan.step(c);
  if (scan.ambiguous()) return std::nullopt;
  auto args = object.find("arguments");
  if (args == object.end()) args = object.find("parameters");
  std::optional<std::string> arguments;
  if (args != object.end() && args->is_object()) {
    if (scan.arguments_complete()) arguments = scan.arguments();
  } else {
    arguments = arguments_text(args == object.end() ? nullptr : &*args);
  }
  if (!arguments) return std::nullopt;
  return ToolCall{"", name->get<std::string>(), std::move(*arguments)};
}

// The texts of a valid JSON array's items.
std::vector<std::string_view> array_items(std::string_view array) {
  std::vector<std::string_view> items;
  JsonBrackets brackets;
  int depth = 0;
  std::size_t start = 1;
  for (std::size_t i = 1; i < array.size(); ++i) {
    const bool quoted = brackets.in_string();
    depth += brackets.step(array[i]);
    if (quoted || depth > 0 || (array[i] != ',' && depth == 0)) continue;
    items.push_back(array.substr(start, i - start));
    start = i + 1;
    if (depth < 0) break;
  }
  return items;
}

// Each parser starts at the opening marker and returns the calls and where they end, or nullopt.
using Calls = std::optional<std::pair<std::vector<ToolCall>, std::size_t>>;

// Hermes and Mistral: the marker, then a JSON call object (Mistral: an array of them), repeated; Hermes closes each
// with </tool_call>, which the end token may cut off.
Calls parse_marked_json(std::string_view text, std::size_t pos, std::string_view open, std::string_view close) {
  std::vector<ToolCall> calls;
  while (text.substr(pos).starts_with(open)) {
    pos += open.size();
    const std::size_t start = skip_space(text, pos);
    auto value = json_value_at(text, pos);
    if (!value) return std::nullopt;
    const std::string_view value_text = text.substr(start, pos - start);
    const json list = value->is_array() ? *value : json::array({*value});
    const auto texts = value->is_array() ? array_items(value_text) : std::vector<std::string_view>{value_text};
    if (list.empty() || texts.size() != list.size()) return std::nullopt;
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto call = call_from_object(list[i], texts[i]);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    pos = skip_space(text, pos);
    if (!close.empty() && text.substr(pos).starts_with(close)) pos += close.size();
    if (const std::size_t next = skip_space(text, pos); text.substr(next).starts_with(open)) pos = next;
  }
  return std::make_pair(std::move(calls), pos);
}

// Skips spaces and Llama's tags at `pos`: <|python_tag|> / <|python_start|> before the calls, <|python_end|> around.
std::size_t skip_python_tags(std::string_view text, std::size_t pos, bool opening) {
  for (;;) {
    pos = skip_space(text, pos);
    const std::string_view rest = text.substr(pos);
    if (opening && (rest.starts_with(kPythonTag) || rest.starts_with(kPythonStart))) {
      pos += rest.starts_with(kPythonTag) ? kPythonTag.size() : kPythonStart.size();
      opening = false;
    } else if (rest.starts_with(kPythonEnd)) {
      pos += kPythonEnd.size();
    } else {
      return pos;
    }
  }
}

// Llama 3.x / 4: call objects from the answer's start (after its tags), apart by ';' or ',' and spaces.
Calls parse_llama3_json(std::string_view text) {
  std::size_t pos = skip_python_tags(text, 0, true);
  std::vector<ToolCall> calls;
  while (pos < text.size() && text[pos] == '{') {
    const std::size_t start = pos;
    auto value = json_value_at(text, pos);
    if (!value) return std::nullopt;
    auto call = call_from_object(*value, text.substr(start, pos - start));
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    pos = skip_space(text, pos);
    if (pos < text.size() && (text[pos] == ';' || text[pos] == ',')) pos = skip_space(text, pos + 1);
    pos = skip_python_tags(text, pos, false);
  }
  if (calls.empty()) return std::nullopt;
  return std::make_pair(std::move(calls), pos);
}

// Llama 4 (vLLM's llama4_pythonic template) and Llama 3.2 (its pythonic template): the whole answer is a Python list
// of calls, [name(key=value, ...), ...], the values Python literals (strings, numbers, True / False / None, lists,
// dicts with string or number keys), inside <|python_start|> ... <|python_end|> if Llama 4 writes them. As vLLM reads
// it with Python's parser: an answer with anything else in it (text around the list, a positional argument, an
// expression) is no call. Each call's keywords, in order, are its arguments object.
class PythonicReader {
 public:
  enum class Result { calls, more, bad };  // the whole text; a prefix of such a text; neither

  explicit PythonicReader(std::string_view text) : t_(text) {}

  // After read() gave `more`: the call being written once its name and '(' are read, with the keywords whose values
  // are complete (its arguments without their closing '}', a prefix of what they will be).
  [[nodiscard]] const std::optional<ToolCall>& partial() const { return partial_; }

  Result read(std::vector<ToolCall>& calls) {
    space();
    if (Result r = optional_tag(kPythonStart); r != Result::calls) return r;
    space();
    if (end()) return Result::more;
    if (t_[p_] != '[') return Result::bad;
    ++p_;
    for (;;) {
      space();
      if (end()) return Result::more;
      if (t_[p_] == ']' && !calls.empty()) break;  // an empty list is no call
      ToolCall call;
      if (Result r = call_at(call); r != Result::calls) return r;
      calls.push_back(std::move(call));
      space();
      if (end()) return Result::more;
      if (t_[p_] == ',') {
        ++p_;
      } else if (t_[p_] != ']') {
        return Result::bad;
      }
    }
    ++p_;
    space();
    if (Result r = optional_tag(kPythonEnd); r != Result::calls) return r;
    space();
    return end() ? Result::calls : Result::bad;
  }

 private:
  static constexpr int kMaxDepth = 64;
  [[nodiscard]] bool end() const { return p_ >= t_.size(); }
  void space() { p_ = skip_space(t_, p_); }
  // `tag` if the text has it here (calls), a prefix of it at the end (more), else nothing read (calls).
  Result optional_tag(std::string_view tag) {
    const std::string_view rest = t_.substr(p_);
    if (rest.starts_with(tag)) {
      p_ += tag.size();
    } else if (!rest.empty() && tag.starts_with(rest)) {
      return Result::more;
    }
    return Result::calls;
  }
  Result name_at(std::string& out) {
    const std::size_t start = p_;
    if (end()) return Result::more;
    if (!is_identifier_char(t_[p_]) || (t_[p_] >= '0' && t_[p_] <= '9')) return Result::bad;
    while (!end() && is_identifier_char(t_[p_])) ++p_;
    if (end()) return Result::more;  // the name may go on
    out = std::string(t_.substr(start, p_ - start));
    return Result::calls;
  }
  Result call_at(ToolCall& call) {
    if (Result r = name_at(call.name); r != Result::calls) return r;
    space();
    if (end()) return Result::more;
    if (t_[p_] != '(') return Result::bad;
    ++p_;
    std::vector<std::string> keys;
    call.arguments = "{";
    partial_ = call;
    for (;;) {
      space();
      if (end()) return Result::more;
      if (t_[p_] == ')') break;
      std::string key;
      if (Result r = name_at(key); r != Result::calls) return r;
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) return Result::bad;  // Python: a repeated keyword
      space();
      if (end()) return Result::more;
      if (t_[p_] != '=') return Result::bad;
      ++p_;
      call.arguments += (keys.empty() ? "" : ",") + json(key).dump() + ":";
      keys.push_back(std::move(key));
      if (Result r = value_at(call.arguments, 0); r != Result::calls) return r;
      partial_->arguments = call.arguments;
      space();
      if (end()) return Result::more;
      if (t_[p_] == ',') {
        ++p_;
      } else if (t_[p_] != ')') {
        return Result::bad;
      }
    }
    ++p_;
    call.arguments += "}";
    partial_.reset();
    return Result::calls;
  }
  // A literal as JSON, appended to `out`.
  Result value_at(std::string& out, int depth) {
    space();
    if (end()) return Result::more;
    const char c = t_[p_];
    if (c == '"' || c == '\'') return string_at(out);
    if (c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9')) return number_at(out);
    for (const auto& [word, as_json] : {std::pair{"True", "true"}, {"False", "false"}, {"None", "null"}}) {
      const std::string_view w(word), rest = t_.substr(p_, w.size() + 1);
      if (rest.starts_with(w) && (rest.size() == w.size() || !is_identifier_char(rest[w.size()]))) {
        if (rest.size() == w.size()) return Result::more;  // "None" may yet be "Nonesuch"
        p_ += w.size();
        out += as_json;
        return Result::calls;
      }
      if (w.starts_with(rest)) return Result::more;
    }
    if ((c != '[' && c != '{') || depth >= kMaxDepth) return Result::bad;
    const char close = c == '[' ? ']' : '}';
    out += c;
    ++p_;
    for (bool first = true;; first = false) {
      space();
      if (end()) return Result::more;
      if (t_[p_] == close) break;
      if (!first) out += ',';
      if (c == '{') {  // a key: a string, or a number written as one (as json.dumps writes it)
        std::string key;
        if (t_[p_] == '"' || t_[p_] == '\'') {
          if (Result r = string_at(key); r != Result::calls) return r;
        } else {
          if (Result r = number_at(key); r != Result::calls) return r;
          key = json(key).dump();
        }
        out += key;
        space();
        if (end()) return Result::more;
        if (t_[p_] != ':') return Result::bad;
        ++p_;
        out += ':';
      }
      if (Result r = value_at(out, depth + 1); r != Result::calls) return r;
      space();
      if (end()) return Result::more;
      if (t_[p_] == ',') {
        ++p_;
      } else if (t_[p_] != close) {
        return Result::bad;
      }
    }
    ++p_;
    out += close;
    return Result::calls;
  }
  // A Python number as a JSON number: "1." and ".5" as 1.0 and 0.5; hex, octal, underscores and complex are refused.
  Result number_at(std::string& out) {
    std::string n;
    if (t_[p_] == '-' || t_[p_] == '+') {
      if (t_[p_] == '-') n += '-';
      ++p_;
    }
    const auto digits = [&] {
      std::size_t count = 0;
      for (; !end() && t_[p_] >= '0' && t_[p_] <= '9'; ++p_, ++count) n += t_[p_];
      return count;
    };
    const std::size_t int_start = n.size();
    const std::size_t whole = digits();
    if (whole > 1 && n[int_start] == '0') return Result::bad;  // Python 3 has no leading zeros
    std::size_t fraction = 0;
    if (!end() && t_[p_] == '.') {
      if (whole == 0) n += '0';
      n += '.';
      ++p_;
      fraction = digits();
      if (fraction == 0) n += '0';
    }
    if (whole == 0 && fraction == 0) return end() ? Result::more : Result::bad;
    if (!end() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      n += 'e';
      ++p_;
      if (!end() && (t_[p_] == '-' || t_[p_] == '+')) n += t_[p_++];
      if (digits() == 0) return end() ? Result::more : Result::bad;
    }
    if (end()) return Result::more;  // the number may go on
    if (is_identifier_char(t_[p_]) || t_[p_] == '.') return Result::bad;
    out += n;
    return Result::calls;
  }
  Result string_at(std::string& out) {
    const char quote = t_[p_++];
    std::string s;
    for (;;) {
      if (end()) return Result::more;
      const char c = t_[p_];
      if (c == quote) break;
      if (c == '\n') return Result::bad;  // a one-line string
      ++p_;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (end()) return Result::more;
      switch (chat::read_python_escape(t_, p_, s)) {
        case chat::PythonEscape::ok: break;
        case chat::PythonEscape::cut: return Result::more;
        default: return Result::bad;  // not hex, past U+10FFFF, or a surrogate, which JSON cannot hold
      }
    }
    ++p_;
    out += json(s).dump(-1, ' ', false, json::error_handler_t::replace);
    return Result::calls;
  }
  std::string_view t_;
  std::size_t p_ = 0;
  std::optional<ToolCall> partial_;
};

// The function a header names: V3.1's is the name; Kimi's "functions.NAME:INDEX" (as vLLM reads it).
std::string header_name(const SectionSyntax& syntax, std::string_view header) {
  header = trim(header);
  if (!syntax.id_marker.empty()) header = header.substr(0, header.find(syntax.id_marker));
  if (syntax.kimi_id) {
    if (header.starts_with("functions.")) header.remove_prefix(10);
    if (const std::size_t colon = header.rfind(':'); colon != std::string_view::npos) {
      const std::string_view index = header.substr(colon + 1);
      if (!index.empty() && std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; }))
        header = header.substr(0, colon);
    }
  }
  if (header.find('\n') != std::string_view::npos) return {};  // a name is one line
  return std::string(header);
}

// Kimi K2's header is the call's id as its template writes it back ("functions.NAME:INDEX"), which vLLM returns;
// empty for the others (the server makes one).
std::string header_id(const SectionSyntax& syntax, std::string_view header) {
  header = trim(header);
  if (!syntax.kimi_id || !header.starts_with("functions.") || header.find(':') == std::string_view::npos) return {};
  return std::string(header);
}

Calls parse_section(const SectionSyntax& syntax, std::string_view text, std::size_t pos) {
  pos += syntax.section_open.size();  // none for Mistral's: each call opens with the marker
  std::vector<ToolCall> calls;
  for (;;) {
    pos = skip_space(text, pos);
    if (!text.substr(pos).starts_with(syntax.call_open)) break;
    pos += syntax.call_open.size();
    const std::size_t sep = text.find(syntax.sep, pos);
    if (sep == std::string_view::npos) return std::nullopt;
    ToolCall call;
    if (syntax.fenced) {
      pos = sep + syntax.sep.size();
      const std::size_t line_end = text.find('\n', pos);
      if (line_end == std::string_view::npos) return std::nullopt;
      call.name = std::string(trim_right(text.substr(pos, line_end - pos)));
      pos = skip_space(text, line_end);
      if (call.name.empty() || !text.substr(pos).starts_with("```")) return std::nullopt;
      pos += 3;
      if (text.substr(pos).starts_with("json")) pos += 4;
    } else {
      call.name = header_name(syntax, text.substr(pos, sep - pos));
      if (call.name.empty()) return std::nullopt;
      call.id = header_id(syntax, text.substr(pos, sep - pos));
      pos = sep + syntax.sep.size();
    }
    const std::size_t start = skip_space(text, pos);
    auto args = json_value_at(text, pos);
    if (!args || !args->is_object()) return std::nullopt;
    call.arguments = minified(text.substr(start, pos - start));
    pos = skip_space(text, pos);
    if (syntax.fenced && text.substr(pos).starts_with("```")) pos += 3;
    pos = skip_space(text, pos);
    if (text.substr(pos).starts_with(syntax.call_close)) pos += syntax.call_close.size();
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return std::nullopt;
  if (text.substr(pos).starts_with(syntax.section_close)) pos += syntax.section_close.size();
  return std::make_pair(std::move(calls), pos);
}

enum class Match { yes, more, no };  // the text starts with a string, may still grow into it, or does not
Match match(std::string_view text, std::string_view s) {
  if (text.starts_with(s)) return Match::yes;
  return s.starts_with(text) ? Match::more : Match::no;
}

// How much of `text` is whole UTF-8 characters: a piece must not end inside one (it goes out as a JSON string).
std::size_t whole_utf8(std::string_view text) {
  for (std::size_t back = 1; back <= std::min<std::size_t>(4, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const std::size_t length = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    return length > back ? text.size() - back : text.size();
  }
  return text.size();
}

// A JSON string of `text`; a byte that is not UTF-8 becomes U+FFFD (a model's text is UTF-8; the dump must not throw).
std::string json_string(std::string_view text) {
  return json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// A bare value of an XML call as JSON text (ToolSchemas says how).
std::string xml_value_json(std::string_view value, ToolSchemas::Kind kind, bool null_words = false) {
  const std::string_view t = trim(value);
  if (null_words && kind != ToolSchemas::Kind::string && (t == "null" || t == "none" || t == "nil")) return "null";
  switch (kind) {
    case ToolSchemas::Kind::string: return json_string(value);
    case ToolSchemas::Kind::string_or_null: return t == "null" || t == "None" ? "null" : json_string(value);
    case ToolSchemas::Kind::other: break;
  }
  if (!t.empty() && json::accept(t)) return minified(t);
  if (t == "True") return "true";
  if (t == "False") return "false";
  if (t == "None") return "null";
  return json_string(value);
}

// Reads an XML syntax's calls from their first opening tag on, as far as the text goes, and on when it has grown: the
// parse of a whole answer and a stream read the same bytes alike, so they find the same calls. A call's arguments are
// built as its parameters complete, so what is known of them is always a prefix of the final text.
class XmlCallReader {
 public:
  explicit XmlCallReader(const XmlSyntax& syntax) : x_(&syntax) {}

  // `text`: what was read before, grown. Stops for good at a byte it cannot place (broken()), or at text after a
  // call that is not another call.
  void read(std::string_view text, const ToolSchemas& types) {
    while (step(text, types)) {
    }
    open_string(text);
  }
  // The end of the answer: Qwen's </tool_call> may be cut off after </function>, a block's close after its last call.
  void finish() {
    if (at_ == At::after_call) commit();
  }
  [[nodiscard]] bool broken() const { return at_ == At::broken; }
  // The text ended inside a call.
  [[nodiscard]] bool in_call() const {
    return at_ != At::between && at_ != At::done && at_ != At::broken && at_ != At::in_block;
  }
  [[nodiscard]] const std::vector<ToolCall>& calls() const { return calls_; }
  [[nodiscard]] std::size_t end() const { return end_; }  // after the last complete call (or its block's close)
  // The call being written, once its name is known: its name, and its arguments so far (no closing brace), as
  // their size and the bytes from `from` on (a stream sends what is new without copying what it sent).
  [[nodiscard]] bool named() const { return in_call() && !name_.empty(); }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] std::size_t arguments_size() const {
    std::size_t n = arguments_.size();
    if (string_open_) n += (params_.empty() ? 0 : 1) + key_json_.size() + 2 + escaped_.size();
    return n;
  }
  void append_arguments(std::string& out, std::size_t from) const {
    const std::string_view parts[] = {arguments_, string_open_ && !params_.empty() ? "," : "",
                                      string_open_ ? std::string_view(key_json_) : "", string_open_ ? ":\"" : "",
                                      string_open_ ? std::string_view(escaped_) : ""};
    for (const std::string_view part : parts) {
      if (from < part.size()) out.append(part.substr(from));
      from -= std::min(from, part.size());
    }
  }

 private:
  enum class At {
    between,     // spaces, then `open` (else the calls have ended)
    call,        // spaces, then `call_open` (a block: or its close)
    in_block,    // a block between calls: spaces, then `call_open` or the block's close
    name,        // up to the name's end
    parameters,  // spaces, then the next key's tag or the call's closing one
    key,         // up to the key's end
    attributes,  // DSML: up to the tag's '>'
    value_open,  // GLM: spaces, then <arg_value>
    value,       // up to the value's closing tag
    after_call,  // Qwen: spaces, then </tool_call>
    done,
    broken,
  };

  // One step of the grammar; false when it must wait for more text or has stopped.
  bool step(std::string_view text, const ToolSchemas& types) {
    if (at_ == At::done || at_ == At::broken) return false;
    const bool spaces = at_ == At::between || at_ == At::call || at_ == At::in_block || at_ == At::parameters ||
                        at_ == At::value_open || at_ == At::after_call;
    if (spaces) pos_ = skip_space(text, pos_);
    const std::string_view rest = text.substr(std::min(pos_, text.size()));
    // Either of two tags; 0 while the text may still grow into one, -1 when it is neither.
    auto tag = [&](std::string_view a, std::string_view b) {
      const Match ma = match(rest, a), mb = b.empty() ? Match::no : match(rest, b);
      if (ma == Match::yes) return 1;
      if (mb == Match::yes) return 2;
      return ma == Match::more || mb == Match::more || rest.empty() ? 0 : -1;
    };
    // Where a search from pos_ may go on (a stream's text grows a piece at a time: each byte is searched once).
    if (scan_at_ != pos_) scan_at_ = scanned_ = pos_;
    const auto search_from = [&](std::string_view end) {
      return scanned_ - std::min(scanned_ - pos_, end.empty() ? 0 : end.size() - 1);
    };
    // Up to `end`, without a line break or another tag (`one_line`; GLM's key may hold anything): the bytes before
    // it, or nullopt (and broken() when it cannot be).
    auto up_to = [&](std::string_view end, bool one_line = true) -> std::optional<std::string_view> {
      const std::size_t at = text.find(end, search_from(end));
      const std::size_t stray = one_line ? text.find_first_of("\n<", scanned_) : std::string_view::npos;
      if (stray < at) {
        fail();
        return std::nullopt;
      }
      if (at == std::string_view::npos) {
        scanned_ = text.size();
        return std::nullopt;
      }
      const std::string_view before = text.substr(pos_, at - pos_);
      pos_ = at + end.size();
      return before;
    };
    switch (at_) {
      case At::between:
        switch (tag(x_->open, "")) {
          case 1:
            pos_ += x_->open.size();
            at_ = x_->block ? At::in_block : x_->call_open.empty() ? At::name : At::call;
            start_call();
            return true;
          case 0: return false;
          default: at_ = At::done; return false;
        }
      case At::call:
      case At::in_block:
        switch (tag(x_->call_open, x_->block ? x_->close : "")) {
          case 1:
            pos_ += x_->call_open.size();
            at_ = At::name;
            start_call();
            return true;
          case 2:  // the block's close
            pos_ += x_->close.size();
            end_ = pos_;
            at_ = At::between;
            return true;
          case 0: return false;
          default: return fail();
        }
      case At::name: {
        std::optional<std::string_view> name;
        if (x_->name_end.empty()) {  // GLM: up to the line's end, or the tag that follows a name on the same line
          const std::size_t end = text.find_first_of("\n<", scanned_);
          if (end == std::string_view::npos) {
            scanned_ = text.size();
            return false;
          }
          name = text.substr(pos_, end - pos_);
          pos_ = end + (text[end] == '<' ? 0 : 1);
        } else if (name = up_to(x_->name_end); !name) {
          return false;
        }
        name_ = std::string(trim(*name));
        if (name_.empty()) return fail();
        at_ = At::parameters;
        return true;
      }
      case At::parameters: {
        const std::string_view call_end = x_->call_close.empty() ? x_->close : x_->call_close;
        switch (tag(x_->key_open, call_end)) {
          case 1:
            pos_ += x_->key_open.size();
            at_ = At::key;
            return true;
          case 2:
            pos_ += call_end.size();
            if (x_->block) {
              commit();
              at_ = At::in_block;
            } else if (x_->call_close.empty()) {
              commit();
            } else {
              at_ = At::after_call;
            }
            return true;
          case 0: return false;
          default: return fail();
        }
      }
      case At::key: {
        std::optional<std::string_view> key;
        if (key = up_to(x_->key_end, x_->key_end != kArgKeyClose); !key) return false;
        key_ = std::string(trim(*key));
        key_json_ = json_string(key_);
        const bool again = std::any_of(params_.begin(), params_.end(), [&](const auto& k) { return k == key_; });
        if (key_.empty() || again) return fail();  // a repeated key: either value could be meant
        kind_ = types.kind(name_, key_);
        at_ = x_->attributes ? At::attributes : x_->value_open.empty() ? At::value : At::value_open;
        start_value();
        return true;
      }
      case At::attributes: {
        const auto attributes = up_to(">");
        if (!attributes) return false;
        // DSML says which values are strings: string="true" (the text) or "false" (JSON).
        if (attributes->find("string=\"true\"") != std::string_view::npos) kind_ = ToolSchemas::Kind::string;
        if (attributes->find("string=\"false\"") != std::string_view::npos) kind_ = ToolSchemas::Kind::other;
        at_ = At::value;
        start_value();
        return true;
      }
      case At::value_open:
        switch (tag(x_->value_open, "")) {
          case 1:
            pos_ += x_->value_open.size();
            at_ = At::value;
            start_value();
            return true;
          case 0: return false;
          default: return fail();
        }
      case At::value: {
        // The value's end: its closing tag, or (Qwen) where the next parameter or the call's close begins.
        std::size_t end = text.find(x_->value_close, search_from(x_->value_close));
        std::size_t resume = end == std::string_view::npos ? end : end + x_->value_close.size();
        if (x_->open_values) {
          for (const std::string_view next : {x_->key_open, x_->call_close}) {
            const std::size_t at = text.find(next, search_from(next));
            if (at < end) end = resume = at;
          }
        }
        if (end == std::string_view::npos) {
          scanned_ = text.size();
          return false;
        }
        arguments_ += (params_.empty() ? "" : ",") + key_json_ + ":" +
                      xml_value_json(value_text(text.substr(value_start_, end - value_start_)), kind_, x_->trimmed);
        params_.push_back(key_);
        string_open_ = false;
        pos_ = resume;
        at_ = At::parameters;
        return true;
      }
      case At::after_call:
        switch (tag(x_->close, "")) {
          case 1:
            pos_ += x_->close.size();
            commit();
            return true;
          case 0: return false;
          default: commit(); return true;  // no </tool_call>: the call is whole all the same
        }
      case At::done:
      case At::broken: break;
    }
    return false;
  }

  bool fail() {
    at_ = At::broken;
    return false;
  }
  void start_call() {
    name_.clear();
    arguments_ = "{";
    params_.clear();
  }
  void start_value() {
    value_start_ = pos_;
    escaped_.clear();
    escaped_end_ = 0;
  }
  void commit() {
    calls_.push_back(ToolCall{"", std::move(name_), arguments_ + "}"});
    name_.clear();
    end_ = pos_;
    at_ = At::between;
  }
  [[nodiscard]] std::string_view value_text(std::string_view value) const {
    if (x_->trimmed) return trim(value);
    if (x_->newlines && value.starts_with('\n')) value.remove_prefix(1);
    if (x_->newlines && value.ends_with('\n')) value.remove_suffix(1);
    return value;
  }

  // A string parameter's value as far as it is final: what cannot turn into its closing tag (nor Qwen's newline
  // before it), in whole UTF-8 characters. It is escaped once, piece by piece.
  void open_string(std::string_view text) {
    // A trimmed value's final text is known when it closes (trailing spaces may still come).
    string_open_ = at_ == At::value && kind_ == ToolSchemas::Kind::string && !x_->trimmed;
    if (!string_open_) return;
    std::size_t begin = value_start_;
    if (x_->newlines) {
      if (begin >= text.size()) return;
      if (text[begin] == '\n') ++begin;
    }
    std::string_view value = text.substr(std::min(begin, text.size()));
    std::size_t tail = marker_tail(value, x_->value_close);
    if (x_->open_values) tail = std::max({tail, marker_tail(value, x_->key_open), marker_tail(value, x_->call_close)});
    value.remove_suffix(tail);
    if (x_->newlines && value.ends_with('\n')) value.remove_suffix(1);
    value = value.substr(0, whole_utf8(value));
    if (value.size() <= escaped_end_) return;
    const std::string piece = json_string(value.substr(escaped_end_));
    escaped_ += std::string_view(piece).substr(1, piece.size() - 2);
    escaped_end_ = value.size();
  }

  const XmlSyntax* x_;
  At at_ = At::between;
  std::size_t pos_ = 0, end_ = 0;
  std::vector<ToolCall> calls_;
  std::string name_, key_, key_json_, arguments_;
  std::vector<std::string> params_;                    // the keys of the call being read
  ToolSchemas::Kind kind_ = ToolSchemas::Kind::other;  // of the value being read
  std::size_t value_start_ = 0;
  std::size_t scan_at_ = 0, scanned_ = 0;  // a search from scan_at_ has read up to scanned_ without finding its end
  bool string_open_ = false;               // a string value is being written: append_arguments() gives its final part
  std::string escaped_;                    // that part, as JSON string text
  std::size_t escaped_end_ = 0;            // the value's bytes it holds
};

Calls parse_xml(const XmlSyntax& syntax, std::string_view text, std::size_t pos, const ToolSchemas& types) {
  XmlCallReader reader(syntax);
  reader.read(text.substr(pos), types);
  reader.finish();
  if (reader.broken() || reader.in_call() || reader.calls().empty()) return std::nullopt;
  return std::make_pair(reader.calls(), pos + reader.end());
}

}  // namespace

void JsonMinifier::step(char c) {
  const bool quoted = brackets_.in_string();
  depth_ += brackets_.step(c);
  if (quoted || !is_space(c)) text_ += c;
}

std::string_view JsonMinifier::push(std::string_view piece) {
  const std::size_t before = text_.size();
  for (const char c : piece) step(c);
  return std::string_view(text_).substr(before);
}

std::string minified(std::string_view json_text) {
  JsonMinifier m;
  m.push(json_text);
  return m.text();
}

ToolFormat detect_tool_format(std::string_view source) {
  if (template_is_harmony(source)) return ToolFormat::harmony;
  // DeepSeek V3.2's and V4's DSML: the template builds its tags around the token, V3.2's block "function_calls".
  if (source.find("｜DSML｜") != std::string_view::npos) {
    if (source.find("function_calls>") != std::string_view::npos) return ToolFormat::deepseek_v32;
    if (source.find("tool_calls>") != std::string_view::npos) return ToolFormat::deepseek_v4;
  }
  if (source.find(kMinimaxXml.open) != std::string_view::npos) return ToolFormat::minimax_m2;
  if (source.find(kHunyuanOpen) != std::string_view::npos && source.find(kHunyuanClose) != std::string_view::npos)
    return ToolFormat::hunyuan;
  // The XML syntaxes open with Hermes' tag: what follows it tells them apart.
  if (source.find(kHermesOpen) != std::string_view::npos) {
    if (source.find(kFunctionOpen) != std::string_view::npos && source.find(kParameterOpen) != std::string_view::npos)
      return ToolFormat::qwen3_coder;
    if (source.find(kArgKeyOpen) != std::string_view::npos && source.find(kArgValueOpen) != std::string_view::npos)
      return ToolFormat::glm45;
    return ToolFormat::hermes;
  }
  // Mistral's tokenizers from v11 on write "[TOOL_CALLS]NAME[ARGS]{...}"; v3's a JSON list after the marker.
  if (source.find(kMistralOpen) != std::string_view::npos)
    return source.find(kMistralV11.sep) != std::string_view::npos ? ToolFormat::mistral_v11 : ToolFormat::mistral;
  // DeepSeek V3 and R1 fence the arguments as ```json; V3.1 writes them after the name.
  if (source.find(kDeepseekCallsOpen) != std::string_view::npos)
    return source.find("```json") != std::string_view::npos ? ToolFormat::deepseek_v3 : ToolFormat::deepseek_v31;
  if (source.find(kKimiK2.section_open) != std::string_view::npos) return ToolFormat::kimi_k2;
  // Llama 3.1 to 3.3 and 4 ask for the call as JSON in words (and write earlier ones so), with no tag around it.
  if (source.find("\"parameters\": dictionary of argument name") != std::string_view::npos)
    return ToolFormat::llama3_json;
  // vLLM's pythonic templates (Llama 4, Llama 3.2) ask for "[func_name1(param1=value1, ...), ...]".
  if (source.find("[func_name1(") != std::string_view::npos) return ToolFormat::pythonic;
  return ToolFormat::none;
}

std::string_view tool_format_name(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes: return "hermes";
    case ToolFormat::mistral: return "mistral";
    case ToolFormat::deepseek_v3: return "deepseek_v3";
    case ToolFormat::deepseek_v31: return "deepseek_v31";
    case ToolFormat::kimi_k2: return "kimi_k2";
    case ToolFormat::mistral_v11: return "mistral_v11";
    case ToolFormat::harmony: return "harmony";
    case ToolFormat::qwen3_coder: return "qwen3_coder";
    case ToolFormat::glm45: return "glm45";
    case ToolFormat::minimax_m2: return "minimax_m2";
    case ToolFormat::deepseek_v32: return "deepseek_v32";
    case ToolFormat::deepseek_v4: return "deepseek_v4";
    case ToolFormat::llama3_json: return "llama3_json";
    case ToolFormat::pythonic: return "pythonic";
    case ToolFormat::hunyuan: return "hunyuan";
    case ToolFormat::none: break;
  }
  return "none";
}

std::string supported_tool_formats() {
  std::string out;
  for (const ToolFormat f :
       {ToolFormat::hermes, ToolFormat::qwen3_coder, ToolFormat::glm45, ToolFormat::mistral, ToolFormat::mistral_v11,
        ToolFormat::deepseek_v3, ToolFormat::deepseek_v31, ToolFormat::deepseek_v32, ToolFormat::deepseek_v4,
        ToolFormat::kimi_k2, ToolFormat::minimax_m2, ToolFormat::llama3_json, ToolFormat::pythonic, ToolFormat::hunyuan,
        ToolFormat::harmony}) {
    out += (out.empty() ? "" : ", ") + std::string(tool_format_name(f));
  }
  return out;
}

bool template_reads_tools(std::string_view source) {
  for (std::size_t at = source.find("tools"); at != std::string_view::npos; at = source.find("tools", at + 1)) {
    const bool starts = at == 0 || !is_identifier_char(source[at - 1]);
    const bool ends = at + 5 >= source.size() || !is_identifier_char(source[at + 5]);
    if (starts && ends) return true;
  }
  return false;
}

std::vector<std::string_view> tool_markers(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes:
    case ToolFormat::qwen3_coder: return {kHermesOpen, kHermesClose};
    case ToolFormat::glm45:
      return {kHermesOpen, kHermesClose, kArgKeyOpen, kArgKeyClose, kArgValueOpen, kArgValueClose};
    case ToolFormat::mistral: return {kMistralOpen};
    case ToolFormat::hunyuan: return {kHunyuanOpen, kHunyuanClose};
    case ToolFormat::minimax_m2: return {kMinimaxXml.open, kMinimaxXml.close};
    case ToolFormat::deepseek_v32:
    case ToolFormat::deepseek_v4: return {"｜DSML｜", xml_syntax(format)->open, xml_syntax(format)->close};
    case ToolFormat::deepseek_v3:
    case ToolFormat::deepseek_v31:
    case ToolFormat::kimi_k2: {
      const SectionSyntax& syntax = *section_syntax(format);
      return {syntax.section_open, syntax.section_close, syntax.call_open, syntax.call_close, syntax.sep};
    }
    case ToolFormat::mistral_v11: return {kMistralOpen, kMistralV11.sep, kMistralV11.id_marker};
    case ToolFormat::harmony: return {"<|channel|>", "<|constrain|>", "<|message|>", "<|call|>"};
    case ToolFormat::llama3_json: return {kPythonTag, kPythonStart, kPythonEnd};
    case ToolFormat::pythonic: return {kPythonStart, kPythonEnd};
    case ToolFormat::none: break;
  }
  return {};
}

namespace {

ToolSchemas::Kind schema_kind(const nlohmann::ordered_json& schema) {
  using Kind = ToolSchemas::Kind;
  if (!schema.is_object()) return Kind::other;
  // The types a value may have: "type" (one or a list), or each branch of anyOf / oneOf; an enum or const of strings.
  bool string = false, null = false, other = false;
  // A JSON type name, or a value of an enum (`is_value`).
  auto add = [&](const nlohmann::ordered_json& t, bool is_value) {
    if (is_value ? t.is_string() : t == "string") {
      string = true;
    } else if (is_value ? t.is_null() : t == "null") {
      null = true;
    } else {
      other = true;
    }
  };
  auto add_schema = [&](const nlohmann::ordered_json& s, auto& self, int depth) -> void {
    if (!s.is_object() || depth > 8) {
      other = true;
      return;
    }
    if (auto type = s.find("type"); type != s.end()) {
      for (const auto& t : type->is_array() ? *type : nlohmann::ordered_json::array({*type})) add(t, false);
      return;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto branches = s.find(key); branches != s.end() && branches->is_array() && !branches->empty()) {
        for (const auto& b : *branches) self(b, self, depth + 1);
        return;
      }
    }
    if (auto values = s.find("enum"); values != s.end() && values->is_array() && !values->empty()) {
      for (const auto& v : *values) add(v, true);
      return;
    }
    if (auto value = s.find("const"); value != s.end()) {
      add(*value, true);
      return;
    }
    other = true;
  };
  add_schema(schema, add_schema, 0);
  if (!string || other) return Kind::other;
  return null ? Kind::string_or_null : Kind::string;
}

}  // namespace

ToolSchemas::ToolSchemas(const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) continue;
    const auto name = function->find("name");
    if (name == function->end() || !name->is_string()) continue;
    names_.push_back(name->get<std::string>());
    const auto parameters = function->find("parameters");
    if (parameters == function->end() || !parameters->is_object()) continue;
    const auto properties = parameters->find("properties");
    if (properties == parameters->end() || !properties->is_object()) continue;
    std::vector<std::pair<std::string, Kind>> kinds;
    for (const auto& [key, schema] : properties->items()) {
      if (const Kind k = schema_kind(schema); k != Kind::other) kinds.emplace_back(key, k);
    }
    kinds_.emplace_back(name->get<std::string>(), std::move(kinds));
  }
}

bool ToolSchemas::may_call(std::string_view tool) const {
  return names_.empty() || std::find(names_.begin(), names_.end(), tool) != names_.end();
}

ToolSchemas::Kind ToolSchemas::kind(std::string_view tool, std::string_view parameter) const {
  for (const auto& [name, kinds] : kinds_) {
    if (name != tool) continue;
    for (const auto& [key, k] : kinds) {
      if (key == parameter) return k;
    }
    return Kind::other;  // the first tool of that name is the one (a repeated name is refused with the request)
  }
  return Kind::other;
}

std::string forced_call_prefix(ToolFormat format, std::string_view function_name) {
  const std::string name = json(std::string(function_name)).dump();
  switch (format) {
    case ToolFormat::hermes: return std::string(kHermesOpen) + "\n{\"name\": " + name + ", \"arguments\": ";
    case ToolFormat::mistral: return std::string(kMistralOpen) + "[{\"name\": " + name + ", \"arguments\": ";
    case ToolFormat::hunyuan: return std::string(kHunyuanOpen) + "[{\"name\": " + name + ", \"arguments\": ";
    case ToolFormat::deepseek_v3:
      return std::string(kDeepseekCallsOpen) + std::string(kDeepseekCallOpen) + "function" + std::string(kDeepseekSep) +
             std::string(function_name) + "\n```json\n";
    case ToolFormat::deepseek_v31:
      return std::string(kDeepseekCallsOpen) + std::string(kDeepseekCallOpen) + std::string(function_name) +
             std::string(kDeepseekSep);
    case ToolFormat::kimi_k2:
      return std::string(kKimiK2.section_open) + std::string(kKimiK2.call_open) + "functions." +
             std::string(function_name) + ":0" + std::string(kKimiK2.sep);
    case ToolFormat::mistral_v11: return std::string(kMistralOpen) + std::string(function_name) + "[ARGS]";
    // The XML syntaxes: the call's header as the model writes it, then its arguments as one JSON object (what the
    // constraint can hold the model to; vLLM forces JSON too).
    case ToolFormat::qwen3_coder:
      return std::string(kHermesOpen) + "\n" + std::string(kFunctionOpen) + std::string(function_name) + ">\n";
    case ToolFormat::glm45: return std::string(kHermesOpen) + std::string(function_name) + "\n";
    case ToolFormat::minimax_m2:
    case ToolFormat::deepseek_v32:
    case ToolFormat::deepseek_v4: {
      const XmlSyntax& x = *xml_syntax(format);
      return std::string(x.open) + "\n" + std::string(x.call_open) + std::string(function_name) + "\">\n";
    }
    case ToolFormat::harmony:  // after the template's "<|start|>assistant"
      return "<|channel|>commentary to=functions." + std::string(function_name) + " <|constrain|>json<|message|>";
    case ToolFormat::llama3_json:
      return "{\"name\": " + name + ", \"" + std::string(call_arguments_key(format)) + "\": ";
    case ToolFormat::pythonic:  // no JSON to start: the arguments object alone, as vLLM forces a named call
      return {};
    case ToolFormat::none: break;
  }
  return {};
}

std::string required_call_prefix(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes:
    case ToolFormat::qwen3_coder:  // a Hermes call object after the XML syntaxes' shared opener
    case ToolFormat::glm45: return std::string(kHermesOpen) + "\n";
    case ToolFormat::mistral: return std::string(kMistralOpen) + "[";
    case ToolFormat::hunyuan: return std::string(kHunyuanOpen) + "[";
    case ToolFormat::deepseek_v3:
    case ToolFormat::deepseek_v31:
    case ToolFormat::kimi_k2:
    case ToolFormat::mistral_v11:
    case ToolFormat::minimax_m2:
    case ToolFormat::deepseek_v32:
    case ToolFormat::deepseek_v4:
    case ToolFormat::harmony:
    case ToolFormat::llama3_json:  // no opener: the answer starts with the object
    case ToolFormat::pythonic:
    case ToolFormat::none: break;
  }
  return {};
}

std::string_view call_arguments_key(ToolFormat format) {
  return format == ToolFormat::llama3_json ? "parameters" : "arguments";
}

std::optional<ToolCall> call_from_json_text(std::string_view text) {
  const json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return std::nullopt;
  return call_from_object(object, text);
}

json ToolCall::to_json() const {
  return json{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

std::string tool_call_id(ToolFormat format, std::uint64_t random) {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string id = format == ToolFormat::mistral || format == ToolFormat::mistral_v11 ? "" : "call_";
  for (int i = 0; i < 9; ++i) {  // 62^9 > 2^53: collisions within a conversation are not a concern
    id += kAlphabet[random % 62];
    random /= 62;
  }
  return id;
}

ToolParse parse_tool_calls(ToolFormat format, std::string_view text, const ToolSchemas& types) {
  if (format == ToolFormat::pythonic) {
    std::vector<ToolCall> calls;
    if (PythonicReader(text).read(calls) != PythonicReader::Result::calls ||
        std::any_of(calls.begin(), calls.end(), [&](const ToolCall& c) { return !types.may_call(c.name); })) {
      return ToolParse{std::string(text), {}};
    }
    return ToolParse{"", std::move(calls)};
  }
  if (format == ToolFormat::llama3_json) {
    const Calls calls = parse_llama3_json(text);
    if (!calls || std::any_of(calls->first.begin(), calls->first.end(),
                              [&](const ToolCall& c) { return !types.may_call(c.name); })) {
      return ToolParse{std::string(text), {}};
    }
    ToolParse out{"", std::move(calls->first)};
    out.content = std::string(trim_right(text.substr(skip_space(text, calls->second))));
    return out;
  }
  const std::string_view marker = opening_marker(format);
  const std::size_t at = marker.empty() ? std::string_view::npos : text.find(marker);
  if (at == std::string_view::npos) return ToolParse{std::string(text), {}};
  Calls calls = format == ToolFormat::hermes    ? parse_marked_json(text, at, kHermesOpen, kHermesClose)
                : format == ToolFormat::mistral ? parse_marked_json(text, at, kMistralOpen, "")
                : format == ToolFormat::hunyuan ? parse_marked_json(text, at, kHunyuanOpen, kHunyuanClose)
                : section_syntax(format)        ? parse_section(*section_syntax(format), text, at)
                                                : parse_xml(*xml_syntax(format), text, at, types);
  // A call of a function the request does not offer is no call (a model may write anything between the tags).
  if (!calls || std::any_of(calls->first.begin(), calls->first.end(),
                            [&](const ToolCall& c) { return !types.may_call(c.name); })) {
    return ToolParse{std::string(text), {}};
  }
  ToolParse out{std::string(trim_right(text.substr(0, at))), std::move(calls->first)};
  // Text after the calls is kept, so that nothing the model wrote is lost.
  if (const std::string_view rest = text.substr(skip_space(text, calls->second)); !trim_right(rest).empty()) {
    out.content += (out.content.empty() ? "" : "\n") + std::string(trim_right(rest));
  }
  return out;
}

// Reads the held-back text as it grows, along the grammar the parsers read, and stops for good at the first byte it
// cannot place: what it sends is then final, and the rest waits for finish().
struct ToolCallStream::Preview {
  enum class At {
    marker,       // the format's opening marker
    value,        // spaces, then a call object or an array of them
    item,         // spaces, then a call object
    object,       // inside a call object
    next_item,    // spaces, then ',' or the array's ']'
    after_value,  // spaces, then hermes' closing tag if there
    after_close,  // spaces, then the next opening marker
    ds_call,      // deepseek: spaces, then a call's opening marker
    ds_sep,       // up to the separator
    ds_name,      // the name, up to the line's end
    ds_fence,     // spaces, then ```
    ds_lang,      // "json" if there
    ds_open,      // spaces, then the arguments' '{'
    ds_arguments,
    ds_after_arguments,  // spaces, then ``` if there
    ds_after_fence,      // spaces, then the call's closing marker if there
    ll_open,             // llama3_json: spaces, then <|python_tag|> or <|python_start|> if there
    ll_sep,              // llama3_json: spaces, then ';' or ',' if there
    ll_end,              // llama3_json: spaces and <|python_end|>s, then a call object
    stopped,
  };
  At at = At::marker;
  std::size_t pos = 0;      // in the held-back text
  std::size_t scanned = 0;  // from pos: what a search for a marker (ds_sep, ds_name) has read without finding it
  bool in_array = false;
  engine::JsonConstraint json;  // the call object (deepseek: the arguments) is still a prefix of valid JSON
  CallScanner scan;
  std::string name;  // deepseek
  std::string id;    // kimi_k2: the model's
  JsonMinifier arguments;
  std::size_t calls = 0;           // call objects begun
  std::vector<std::string> sent;   // per call named so far: the arguments sent
  std::vector<std::string> named;  // and its name
  std::optional<XmlCallReader> xml;

  // Sends what is new of call `index`: its name first, then what its arguments have grown to, `size` bytes in all
  // (`append(piece, from)` adds those from `from` on, so that only new bytes are copied). A call of a function the
  // request does not offer stops the preview: the parse at the end agrees, and nothing of it goes out.
  template <class Append>
  void send(ToolStreamOutput& out, const ToolSchemas& tools, std::size_t index, const std::string& name,
            std::size_t size, const Append& append) {
    if (sent.size() < index) return;  // an earlier call was never named: the order would be wrong
    if (sent.size() == index) {
      if (name.empty()) return;
      if (!tools.may_call(name)) {
        at = At::stopped;
        return;
      }
      sent.emplace_back();
      named.push_back(name);
      out.calls.push_back(ToolCallDelta{.index = index, .name = name, .id = id});
    }
    std::string& so_far = sent[index];
    if (size <= so_far.size()) return;
    std::string piece;
    append(piece, so_far.size());
    piece.resize(size - so_far.size());
    so_far += piece;
    out.calls.push_back(ToolCallDelta{index, "", std::move(piece)});
  }
};

ToolCallStream::ToolCallStream(ToolFormat format, ToolSchemas types)
    : format_(format), types_(std::move(types)), preview_(std::make_unique<Preview>()) {}
ToolCallStream::ToolCallStream(const ToolCallStream& other)
    : format_(other.format_),
      types_(other.types_),
      required_(other.required_),
      name_(other.name_),
      held_(other.held_),
      space_(other.space_),
      sent_text_(other.sent_text_),
      in_calls_(other.in_calls_),
      preview_(other.preview_ ? std::make_unique<Preview>(*other.preview_) : nullptr) {}
ToolCallStream& ToolCallStream::operator=(const ToolCallStream& other) {
  if (this != &other) *this = ToolCallStream(other);
  return *this;
}
ToolCallStream::ToolCallStream(ToolCallStream&&) noexcept = default;
ToolCallStream& ToolCallStream::operator=(ToolCallStream&&) noexcept = default;
ToolCallStream::~ToolCallStream() = default;

ToolCallStream ToolCallStream::required_call() {
  ToolCallStream stream(ToolFormat::none);
  stream.required_ = true;
  stream.in_calls_ = true;
  stream.preview_->at = Preview::At::item;
  return stream;
}

ToolCallStream ToolCallStream::arguments_of(std::string_view name) {
  ToolCallStream stream(ToolFormat::none);
  stream.name_ = std::string(name);
  stream.in_calls_ = true;
  stream.preview_->at = Preview::At::ds_open;  // deepseek's arguments: spaces, then the object
  stream.preview_->name = std::string(name);
  return stream;
}

void ToolCallStream::preview_xml(ToolStreamOutput& out) {
  Preview& p = *preview_;
  if (p.at == Preview::At::stopped) return;
  if (!p.xml) p.xml.emplace(*xml_syntax(format_));
  p.xml->read(held_, types_);
  // The reader only adds to a call's arguments, so what was sent is their prefix.
  const auto& calls = p.xml->calls();
  for (std::size_t k = p.sent.empty() ? 0 : p.sent.size() - 1; k < calls.size(); ++k) {
    const std::string& arguments = calls[k].arguments;  // all but its closing '}', which waits for finish()
    p.send(out, types_, k, calls[k].name, arguments.size() - 1,
           [&](std::string& piece, std::size_t from) { piece.append(arguments, from, arguments.size() - 1 - from); });
  }
  if (p.at != Preview::At::stopped && p.xml->named()) {
    p.send(out, types_, calls.size(), p.xml->name(), p.xml->arguments_size(),
           [&](std::string& piece, std::size_t from) { p.xml->append_arguments(piece, from); });
  }
}

void ToolCallStream::preview_pythonic(ToolStreamOutput& out, const std::vector<ToolCall>& calls,
                                      const std::optional<ToolCall>& partial) {
  Preview& p = *preview_;
  if (p.at == Preview::At::stopped) return;  // a function the request does not offer: nothing of it goes out
  // Each read adds to the calls' arguments, so what was sent is their prefix.
  for (std::size_t k = p.sent.empty() ? 0 : p.sent.size() - 1; k < calls.size() && p.at != Preview::At::stopped; ++k) {
    const std::string& arguments = calls[k].arguments;  // all but its closing '}', which waits for finish()
    p.send(out, types_, k, calls[k].name, arguments.size() - 1,
           [&](std::string& piece, std::size_t from) { piece.append(arguments, from, arguments.size() - 1 - from); });
  }
  if (p.at != Preview::At::stopped && partial) {
    const std::string& arguments = partial->arguments;
    p.send(out, types_, calls.size(), partial->name, arguments.size(),
           [&](std::string& piece, std::size_t from) { piece.append(arguments, from); });
  }
}

void ToolCallStream::preview(ToolStreamOutput& out) {
  if (xml_syntax(format_)) return preview_xml(out);
  using At = Preview::At;
  Preview& p = *preview_;
  const SectionSyntax* section = name_ ? &kDeepseekV3 : section_syntax(format_);  // arguments_of: from ds_open
  const bool deepseek = section != nullptr;
  const std::string_view open = opening_marker(format_);
  const std::string_view close = format_ == ToolFormat::hermes    ? kHermesClose
                                 : format_ == ToolFormat::hunyuan ? kHunyuanClose
                                                                  : "";
  // Sends what is new of the call being read: its name once known, then its arguments but their last byte.
  auto send = [&](const std::string& name, const std::string& arguments, bool complete) {
    const std::size_t end = complete ? arguments.size() - 1 : whole_utf8(arguments);
    p.send(out, types_, p.calls - 1, name, end,
           [&](std::string& piece, std::size_t from) { piece.append(arguments, from, end - from); });
  };
  auto send_object = [&] {
    if (!p.scan.arguments_object() || p.scan.ambiguous() || p.scan.name_token().empty()) return;
    const json name = json::parse(p.scan.name_token(), nullptr, /*allow_exceptions=*/false);
    if (!name.is_string()) return;
    send(name.get<std::string>(), p.scan.arguments(), p.scan.arguments_complete());
  };
  auto begin_object = [&] {
    p.json = engine::JsonConstraint();
    p.scan = CallScanner();
    ++p.calls;
    p.at = At::object;
  };
  const std::string_view text = held_;
  while (p.at != At::stopped && p.pos < text.size()) {
    const std::string_view rest = text.substr(p.pos);
    const char c = rest.front();
    // Where a marker may follow spaces, the spaces are skipped first.
    const bool spaces = p.at == At::value || p.at == At::item || p.at == At::next_item || p.at == At::after_value ||
                        p.at == At::after_close || p.at == At::ds_call || p.at == At::ds_fence || p.at == At::ds_open ||
                        p.at == At::ds_after_arguments || p.at == At::ds_after_fence || p.at == At::ll_open ||
                        p.at == At::ll_sep || p.at == At::ll_end;
    if (spaces && is_space(c)) {
      ++p.pos;
      continue;
    }
    // A marker: on `yes` its bytes are read and `then` follows; on `no`, `otherwise` (without reading).
    auto expect = [&](std::string_view s, At then, At otherwise) {
      switch (match(rest, s)) {
        case Match::yes:
          p.pos += s.size();
          p.at = then;
          return true;
        case Match::more: return false;
        case Match::no: p.at = otherwise; return true;
      }
      return false;
    };
    switch (p.at) {
      case At::marker:
        if (format_ == ToolFormat::llama3_json) {
          p.at = At::ll_open;
        } else if (deepseek && section->section_open.empty()) {
          p.at = At::ds_call;  // Mistral v11: the marker opens each call
        } else if (!expect(open, deepseek ? At::ds_call : At::value, At::stopped)) {
          return;
        }
        break;
      case At::value:
      case At::item:
        if (c == '[' && p.at == At::value) {
          p.in_array = true;
          ++p.pos;
          p.at = At::item;
        } else if (c == '{') {
          p.in_array = p.in_array && p.at == At::item;
          begin_object();
        } else {
          p.at = At::stopped;
        }
        break;
      case At::object:
        if (!p.json.advance(rest.substr(0, 1))) {
          // What was read before the break goes out now, as it would have had a push ended there: so what a broken
          // call was sent does not depend on how its text was cut into pushes.
          send_object();
          p.at = At::stopped;
          break;
        }
        p.scan.step(c);
        ++p.pos;
        if (p.scan.closed()) {
          send_object();
          p.at = required_                            ? At::stopped
                 : p.in_array                         ? At::next_item
                 : format_ == ToolFormat::llama3_json ? At::ll_sep
                                                      : At::after_value;
        }
        break;
      // llama3_json, in parse_llama3_json's order (what it reads, the preview reads no differently).
      case At::ll_open: {
        const Match tag = match(rest, kPythonTag), start = match(rest, kPythonStart);
        if (tag == Match::more || start == Match::more) return;
        if (tag == Match::yes || start == Match::yes)
          p.pos += tag == Match::yes ? kPythonTag.size() : kPythonStart.size();
        p.at = At::ll_end;
        break;
      }
      case At::ll_sep:
        if (c == ';' || c == ',') ++p.pos;
        p.at = At::ll_end;
        break;
      case At::ll_end:
        if (c == '{') {
          begin_object();
        } else if (!expect(kPythonEnd, At::ll_end, At::stopped)) {
          return;
        }
        break;
      case At::next_item:
        p.at = c == ',' ? At::item : c == ']' ? At::after_value : At::stopped;
        ++p.pos;
        break;
      case At::after_value:
        if (!expect(close.empty() ? open : close, close.empty() ? At::value : At::after_close, At::after_close)) return;
        if (close.empty() && p.at == At::after_close) p.at = At::stopped;  // mistral: no further marker
        break;
      case At::after_close:
        if (!expect(open, At::value, At::stopped)) return;
        break;
      case At::ds_call:
        if (!expect(section->call_open, At::ds_sep, At::stopped)) return;
        break;
      case At::ds_sep:
        if (const std::size_t at = rest.find(section->sep, p.scanned - std::min(p.scanned, section->sep.size() - 1));
            at != std::string_view::npos) {
          p.scanned = 0;
          if (!section->fenced) {  // the header before the separator names the call
            p.name = header_name(*section, rest.substr(0, at));
            p.id = header_id(*section, rest.substr(0, at));
            p.at = p.name.empty() ? At::stopped : At::ds_open;
          } else {
            p.at = At::ds_name;
          }
          p.pos += at + section->sep.size();
          break;
        }
        p.scanned = rest.size();  // each byte is searched once, however the text comes
        return;
      case At::ds_name:
        if (const std::size_t at = rest.find('\n', p.scanned); at != std::string_view::npos) {
          p.scanned = 0;
          p.name = std::string(trim_right(rest.substr(0, at)));
          p.pos += at;
          p.at = p.name.empty() ? At::stopped : At::ds_fence;
          break;
        }
        p.scanned = rest.size();
        return;
      case At::ds_fence:
        if (!expect("```", At::ds_lang, At::stopped)) return;
        break;
      case At::ds_lang:
        if (!expect("json", At::ds_open, At::ds_open)) return;
        break;
      case At::ds_open:
        if (c != '{') {
          p.at = At::stopped;
          break;
        }
        p.json = engine::JsonConstraint();
        p.arguments = JsonMinifier();
        ++p.calls;
        p.at = At::ds_arguments;
        [[fallthrough]];
      case At::ds_arguments:
        if (!p.json.advance(rest.substr(0, 1))) {
          send(p.name, p.arguments.text(), false);  // as in At::object
          p.at = At::stopped;
          break;
        }
        p.arguments.step(c);
        ++p.pos;
        if (p.arguments.complete()) {
          send(p.name, p.arguments.text(), true);
          p.at = name_ ? At::stopped : At::ds_after_arguments;  // arguments_of: all is sent, finish() decides
        }
        break;
      case At::ds_after_arguments:
        if (!section->fenced) {
          p.at = At::ds_after_fence;
        } else if (!expect("```", At::ds_after_fence, At::ds_after_fence)) {
          return;
        }
        break;
      case At::ds_after_fence:
        if (!expect(section->call_close, At::ds_call, At::ds_call)) return;
        break;
      case At::stopped: break;
    }
  }
  if (p.at == At::object) send_object();
  if (p.at == At::ds_arguments) send(p.name, p.arguments.text(), false);
}

ToolStreamOutput ToolCallStream::push(std::string_view text) {
  held_ += text;
  ToolStreamOutput out;
  const std::string_view marker = opening_marker(format_);
  if (format_ == ToolFormat::pythonic && !sent_text_) {
    // Calls only when the whole answer is one list of them: held while it may still be one, each call previewed as
    // it is written; text if it turns out not to be one before a call went out, else finish() decides, as after a
    // marker (the calls' arguments were sent without their closing '}').
    if (preview_->at == Preview::At::stopped && !preview_->sent.empty()) return out;  // finish() decides
    std::vector<ToolCall> calls;
    PythonicReader reader(held_);
    if (reader.read(calls) == PythonicReader::Result::bad) {
      if (!preview_->sent.empty()) {
        preview_->at = Preview::At::stopped;
        return out;
      }
      in_calls_ = false;
      sent_text_ = true;
      out.content = std::exchange(held_, {});
      return out;
    }
    in_calls_ = true;
    preview_pythonic(out, calls, reader.partial());
    return out;
  }
  if (in_calls_) {
    preview(out);
    return out;
  }
  if (format_ == ToolFormat::llama3_json && !sent_text_) {
    // Calls only begin the answer: it is held while it may still begin one.
    const std::string_view start = std::string_view(held_).substr(skip_space(held_, 0));
    if (start.empty()) return out;
    if (start.front() == '{' || start.starts_with(kPythonTag) || start.starts_with(kPythonStart) ||
        start.starts_with(kPythonEnd)) {
      in_calls_ = true;
      preview(out);
      return out;
    }
    for (const std::string_view tag : {kPythonTag, kPythonStart, kPythonEnd}) {
      if (match(start, tag) == Match::more) return out;
    }
    sent_text_ = true;  // text: from here on it goes out as it comes (llama3_json has no marker to hold back)
  }
  if (marker.empty()) {
    out.content = std::exchange(held_, {});
    return out;
  }
  std::size_t keep = marker_tail(held_, marker);
  if (const std::size_t at = held_.find(marker); at != std::string::npos) {
    in_calls_ = true;
    keep = held_.size() - at;
  }
  // Whitespace waits for what follows it: text sends it, a call drops it.
  const std::string_view ready = std::string_view(held_).substr(0, held_.size() - keep);
  const std::size_t text_end = trim_right(ready).size();
  if (text_end > 0) {
    out.content = std::exchange(space_, {}) + std::string(ready.substr(0, text_end));
    sent_text_ = true;
  }
  space_ += ready.substr(text_end);
  held_.erase(0, held_.size() - keep);
  if (in_calls_) preview(out);
  return out;
}

ToolStreamEnd ToolCallStream::finish() {
  ToolStreamEnd end;
  if (!in_calls_) {
    end.parse.content = std::exchange(space_, {}) + std::exchange(held_, {});
    return end;
  }
  if (name_) {
    const std::string_view text = trim_right(std::string_view(held_).substr(skip_space(held_, 0)));
    if (text.empty()) {
      end.parse.calls.push_back(ToolCall{"", *name_, "{}"});
    } else if (json::parse(text, nullptr, /*allow_exceptions=*/false).is_object()) {
      end.parse.calls.push_back(ToolCall{"", *name_, minified(text)});
    } else {
      end.parse.content = held_;
    }
  } else if (required_) {
    if (auto call = call_from_json_text(held_)) {
      end.parse.calls.push_back(std::move(*call));
    } else if (!preview_->named.empty()) {
      // Cut off after the call was named (max_tokens, a stop): that call, with the arguments written so far, as a
      // named tool_choice's cut-off call is; what was streamed is then the whole answer.
      end.parse.calls.push_back(ToolCall{"", preview_->named[0], preview_->sent[0]});
      end.cut_off = true;
    } else {
      end.parse.content = held_;
    }
  } else {
    end.parse = parse_tool_calls(format_, held_, types_);
    // Calls that do not parse give the text back whole (held_ begins with the marker, which parsed content lacks).
    if (end.parse.calls.empty() && end.parse.content == held_) {
      end.parse.content.insert(0, space_);  // no calls: the text as it came
    } else if (sent_text_ && !end.parse.content.empty()) {
      end.parse.content.insert(0, "\n");  // as parse_tool_calls joins the text before and after the calls
    }
  }
  held_.clear();
  space_.clear();
  // What was sent of a call is a prefix of its arguments (the preview read the same bytes as the parse); the rest
  // follows. A call that was not previewed goes whole.
  const auto& sent = preview_->sent;
  for (std::size_t k = 0; k < end.parse.calls.size(); ++k) {
    const ToolCall& call = end.parse.calls[k];
    if (k >= sent.size()) {
      end.calls.push_back(
          ToolCallDelta{.index = k, .name = call.name, .arguments = call.arguments, .last = true, .id = call.id});
    } else if (call.arguments.starts_with(sent[k]) && call.arguments.size() > sent[k].size()) {
      end.calls.push_back(ToolCallDelta{k, "", call.arguments.substr(sent[k].size()), true});
    }
  }
  *preview_ = Preview();
  return end;
}

bool template_has_reasoning(std::string_view source) {
  return source.find(kThinkOpen) != std::string_view::npos && source.find(kThinkClose) != std::string_view::npos;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  return trim_right(prompt).ends_with(kThinkOpen);
}

bool prompt_closes_reasoning(std::string_view prompt) {
  return trim_right(prompt).ends_with(kThinkClose);
}

constexpr std::string_view kAnswerOpen = "<answer>";
constexpr std::string_view kAnswerClose = "</answer>";

std::optional<bool> ReasoningStream::opens_answer(std::size_t begin) {
  const std::string_view rest = std::string_view(held_).substr(begin);
  if (!answer_tags_) return false;
  if (rest.starts_with(kAnswerOpen)) {
    held_.erase(0, begin + kAnswerOpen.size());
    state_ = State::answer_start;
    return true;
  }
  if (kAnswerOpen.starts_with(rest)) return std::nullopt;
  return false;
}

ReasoningSplit ReasoningStream::push(std::string_view text) {
  held_ += text;
  ReasoningSplit out;
  for (;;) {
    switch (state_) {
      case State::start: {
        // Undecided until the first non-space bytes show whether they are the opening tag.
        const std::size_t begin = skip_space(held_, 0);
        const std::string_view rest = std::string_view(held_).substr(begin);
        if (rest.starts_with(kThinkOpen)) {
          held_.erase(0, begin + kThinkOpen.size());
          state_ = State::reasoning;
          continue;
        }
        const auto answer = opens_answer(begin);
        if (answer == true) continue;
        if (rest.empty() || kThinkOpen.starts_with(rest) || !answer) return out;
        state_ = State::content;
        continue;
      }
      case State::reasoning: {
        if (const std::size_t at = held_.find(kThinkClose); at != std::string::npos) {
          out.reasoning += held_.substr(0, at);
          held_.erase(0, at + kThinkClose.size());
          state_ = State::after;
          continue;
        }
        const std::size_t keep = marker_tail(held_, kThinkClose);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::after: {
        // The blank lines between the block and the answer belong to neither.
        const std::size_t begin = skip_space(held_, 0);
        held_.erase(0, begin);
        if (held_.empty()) return out;
        const auto answer = opens_answer(0);
        if (answer == true) continue;
        if (!answer) return out;
        state_ = State::content;
        continue;
      }
      case State::answer_start: {
        // The whitespace after the opening tag belongs to neither.
        held_.erase(0, skip_space(held_, 0));
        if (held_.empty()) return out;
        state_ = State::answer;
        continue;
      }
      case State::answer_done: {
        // After the closing tag: whitespace alone at the end is dropped; text that follows comes as it was written.
        if (skip_space(held_, 0) == held_.size()) return out;
        state_ = State::content;
        continue;
      }
      case State::answer: {
        if (const std::size_t at = held_.find(kAnswerClose); at != std::string::npos) {
          out.content += trim_right(std::string_view(held_).substr(0, at));
          held_.erase(0, at + kAnswerClose.size());
          state_ = State::answer_done;
          continue;
        }
        // Held back: what may still be the closing tag, and the whitespace before it, which is dropped with it.
        const std::size_t keep = marker_tail(held_, kAnswerClose);
        const std::size_t send = trim_right(std::string_view(held_).substr(0, held_.size() - keep)).size();
        out.content += held_.substr(0, send);
        held_.erase(0, send);
        return out;
      }
      case State::content: out.content += std::exchange(held_, {}); return out;
    }
  }
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  if (state_ == State::reasoning) {
    out.reasoning = std::exchange(held_, {});
  } else if (state_ != State::after && state_ != State::answer_start && state_ != State::answer_done) {
    // start: a lone prefix of "<think>" (or spaces) is content; answer: cut off before its closing tag, the rest.
    out.content = std::exchange(held_, {});
  }
  held_.clear();
  return out;
}

// --- harmony ---------------------------------------------------------------------------------------------------

namespace {

constexpr std::string_view kHarmonyStart = "<|start|>";
constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyChannel = "<|channel|>";
// Every marker harmony text may hold; those that end a message come first.
constexpr std::string_view kHarmonyMarkers[] = {"<|end|>",       "<|return|>",    "<|call|>",
                                                "<|endoftext|>", kHarmonyStart,   kHarmonyChannel,
                                                kHarmonyMessage, "<|constrain|>", "<|startoftext|>"};
constexpr std::size_t kHarmonyEnds = 4;
constexpr std::size_t longest_harmony_marker() {
  std::size_t n = 0;
  for (const auto marker : kHarmonyMarkers) n = std::max(n, marker.size());
  return n;
}
constexpr std::size_t kLongestHarmonyMarker = longest_harmony_marker();
constexpr std::size_t kMaxHarmonyHeader = 512;  // a longer "header" is text of a model that left the format
constexpr std::string_view kFunctions = "functions.";

// The first marker in `text` from `from` on: its position and its index in kHarmonyMarkers.
std::optional<std::pair<std::size_t, std::size_t>> find_harmony_marker(std::string_view text, std::size_t from = 0) {
  std::optional<std::pair<std::size_t, std::size_t>> first;
  for (std::size_t m = 0; m < std::size(kHarmonyMarkers); ++m) {
    const std::size_t at = text.find(kHarmonyMarkers[m], from);
    if (at != std::string_view::npos && (!first || at < first->first)) first = {at, m};
  }
  return first;
}

// How many bytes at the end of `text` may still grow into a marker.
std::size_t harmony_marker_tail(std::string_view text) {
  std::size_t keep = 0;
  for (const auto marker : kHarmonyMarkers) keep = std::max(keep, marker_tail(text, marker));
  return keep;
}

std::string strip_harmony_markers(std::string_view text) {
  std::string out;
  std::size_t pos = 0;
  while (auto found = find_harmony_marker(text, pos)) {
    out += text.substr(pos, found->first - pos);
    pos = found->first + kHarmonyMarkers[found->second].size();
  }
  out += text.substr(pos);
  return out;
}

// Whether `text` (spaces skipped) may be the start of a header: a marker, " to=", or the role when the prompt ended
// with a bare <|start|>. Anything else is text of a model that does not speak the format.
bool harmony_header_start(std::string_view text, bool role_next) {
  if (text.empty()) return true;
  for (const auto marker : kHarmonyMarkers) {
    if (text.starts_with(marker) || marker.starts_with(text)) return true;
  }
  if (std::string_view("to=").starts_with(text.substr(0, 3))) return true;
  return role_next && std::string_view("assistant").starts_with(text.substr(0, 9));
}

// The word that starts at `pos` (up to a space or a marker).
std::string_view harmony_word(std::string_view text, std::size_t pos) {
  std::size_t end = pos;
  while (end < text.size() && !is_space(text[end]) && text[end] != '<') ++end;
  return text.substr(pos, end - pos);
}

}  // namespace

bool template_is_harmony(std::string_view source) {
  return source.find(kHarmonyChannel) != std::string_view::npos &&
         source.find(kHarmonyMessage) != std::string_view::npos;
}

HarmonyStream::HarmonyStream(std::string_view prompt, bool tools, ToolSchemas schemas)
    : tools_(tools), schemas_(std::move(schemas)) {
  const std::size_t start = prompt.rfind(kHarmonyStart);
  if (start == std::string_view::npos) return;
  const std::string_view after = prompt.substr(start + kHarmonyStart.size());
  for (std::size_t m = 0; m < kHarmonyEnds; ++m) {
    if (after.find(kHarmonyMarkers[m]) != std::string_view::npos) return;  // the prompt's last message is closed
  }
  if (const std::size_t at = after.find(kHarmonyMessage); at != std::string_view::npos) {
    open_message(after.substr(0, at));
    state_ = State::body;
    return;
  }
  prompt_header_ = std::string(after);
  role_next_ = prompt_header_.find_first_not_of(" \n\r\t") == std::string::npos;
}

void HarmonyStream::open_message(std::string_view header) {
  // The role is the header's first word (its <|start|> aside), then " to=RECIPIENT", "<|channel|>NAME" and
  // "<|constrain|>TYPE" in either order.
  std::size_t pos = skip_space(header, 0);
  while (header.substr(pos).starts_with(kHarmonyStart)) pos = skip_space(header, pos + kHarmonyStart.size());
  std::string_view role = header.substr(pos, 2) == "<|" ? std::string_view{} : harmony_word(header, pos);
  if (role.starts_with("to=")) role = {};
  std::string_view channel;
  if (const std::size_t at = header.find(kHarmonyChannel); at != std::string_view::npos) {
    channel = harmony_word(header, skip_space(header, at + kHarmonyChannel.size()));
  }
  std::string_view recipient;
  for (std::size_t at = header.find("to="); at != std::string_view::npos; at = header.find("to=", at + 1)) {
    if (at == 0 || is_space(header[at - 1]) || header[at - 1] == '>') {
      recipient = harmony_word(header, at + 3);
      break;
    }
  }
  call_.reset();
  call_named_ = false;
  if (!role.empty() && role != "assistant") {
    sink_ = Sink::reasoning;  // a turn the model wrote for someone else (a tool's answer it imagined)
  } else if (!recipient.empty()) {
    const bool function = recipient.starts_with(kFunctions) && recipient.size() > kFunctions.size() &&
                          schemas_.may_call(recipient.substr(kFunctions.size()));
    sink_ = function && tools_ ? Sink::call : Sink::reasoning;
    if (sink_ == Sink::call) call_.emplace(ToolCallStream::arguments_of(recipient.substr(kFunctions.size())));
  } else if (channel.empty() || channel == "final" || channel == "commentary") {
    sink_ = Sink::content;
  } else {
    sink_ = Sink::reasoning;  // analysis, or a channel harmony does not define
  }
}

void HarmonyStream::emit(HarmonyOutput& out, std::string_view text) {
  switch (sink_) {
    case Sink::content: out.content += text; break;
    case Sink::reasoning: out.reasoning += text; break;
    case Sink::call: add_deltas(out, call_->push(text).calls); break;
  }
}

// The current call's pieces, at its index among the calls streamed so far.
void HarmonyStream::add_deltas(HarmonyOutput& out, std::vector<ToolCallDelta> deltas) {
  for (auto& d : deltas) {
    d.index = call_index_;
    call_named_ = true;
    out.deltas.push_back(std::move(d));
  }
}

void HarmonyStream::end_message(HarmonyOutput& out) {
  if (sink_ == Sink::call) {
    ToolStreamEnd end = call_->finish();
    add_deltas(out, std::move(end.calls));
    if (end.parse.calls.empty()) {
      out.reasoning += end.parse.content;  // no JSON object: written for the tool, so not content
    } else {
      out.calls.push_back(std::move(end.parse.calls.front()));
    }
    if (call_named_) ++call_index_;  // a broken call keeps its index: the client has seen it named
    call_.reset();
    call_named_ = false;
  }
  sink_ = Sink::content;
  state_ = State::header;
}

HarmonyOutput HarmonyStream::push(std::string_view text) {
  held_ += text;
  HarmonyOutput out;
  for (;;) {
    if (state_ == State::header) {
      // Decided from the front, one marker at a time, and only by markers that start within the first
      // kMaxHarmonyHeader bytes: so the same text gives the same messages however it is cut into pushes.
      const bool header = harmony_header_start(std::string_view(held_).substr(skip_space(held_, 0)), role_next_);
      if (!header) {  // text outside the format is content, streamed as it comes
        prompt_header_.clear();
        role_next_ = false;
        sink_ = Sink::content;
        state_ = State::body;
        continue;
      }
      std::optional<std::size_t> message, restart;
      for (auto f = find_harmony_marker(held_); f && f->first < kMaxHarmonyHeader;
           f = find_harmony_marker(held_, f->first + kHarmonyMarkers[f->second].size())) {
        if (kHarmonyMarkers[f->second] == kHarmonyMessage) {
          message = f->first;
        } else if (f->second < kHarmonyEnds) {  // an end before the <|message|>: what came before was no header
          restart = f->first + kHarmonyMarkers[f->second].size();
        } else if (kHarmonyMarkers[f->second] == kHarmonyStart && f->first > 0) {  // a new header begins
          restart = f->first;
        } else {
          continue;  // <|channel|>, <|constrain|>: part of the header
        }
        break;
      }
      if (restart) {
        held_.erase(0, *restart);
        prompt_header_.clear();
        role_next_ = false;
        continue;
      }
      if (message) {
        open_message(prompt_header_ + held_.substr(0, *message));
        prompt_header_.clear();
        role_next_ = false;
        held_.erase(0, *message + kHarmonyMessage.size());
        state_ = State::body;
        continue;
      }
      // Until every marker that starts within the limit can be seen whole, a header may still end.
      if (held_.size() < kMaxHarmonyHeader + kLongestHarmonyMarker) return out;
      // A "header" that never ends: the model left the format. Its first kMaxHarmonyHeader bytes (and a marker that
      // starts in them) are content without their markers; what follows is read as text.
      std::size_t cut = kMaxHarmonyHeader;
      for (auto f = find_harmony_marker(held_); f && f->first < kMaxHarmonyHeader;
           f = find_harmony_marker(held_, f->first + kHarmonyMarkers[f->second].size())) {
        cut = std::max(cut, f->first + kHarmonyMarkers[f->second].size());
      }
      out.content += strip_harmony_markers(std::string_view(held_).substr(0, cut));
      held_.erase(0, cut);
      prompt_header_.clear();
      role_next_ = false;
      sink_ = Sink::content;
      state_ = State::body;
      continue;
    }
    const auto found = find_harmony_marker(held_);
    if (!found) {
      const std::size_t keep = harmony_marker_tail(held_);
      emit(out, std::string_view(held_).substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      return out;
    }
    const auto [at, index] = *found;
    const std::string_view marker = kHarmonyMarkers[index];
    emit(out, std::string_view(held_).substr(0, at));
    if (index < kHarmonyEnds) {
      held_.erase(0, at + marker.size());
      end_message(out);
    } else if (marker == kHarmonyStart || marker == kHarmonyChannel) {
      held_.erase(0, at);  // a new header, without the <|end|> before it
      end_message(out);
    } else {
      held_.erase(0, at + marker.size());  // <|message|> or <|constrain|> inside a text: dropped
    }
  }
}

HarmonyOutput HarmonyStream::finish() {
  HarmonyOutput out;
  if (state_ == State::body) {
    emit(out, std::exchange(held_, {}));  // a tail that never became a marker is text
    end_message(out);
  } else {
    // An unfinished header is dropped; text that could only have started one ("<|", "to") is content.
    const std::string_view rest = std::string_view(held_).substr(skip_space(held_, 0));
    const bool role = role_next_ && !rest.empty() && std::string_view("assistant").starts_with(rest);
    if (!rest.empty() && !find_harmony_marker(rest) && !rest.starts_with("to=") && !role) out.content = held_;
    held_.clear();
  }
  prompt_header_.clear();
  role_next_ = false;
  return out;
}

}  // namespace colibri::server
