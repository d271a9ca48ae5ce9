#include "colibri/server/api.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "colibri/server/json_brackets.hpp"
#include "tokenizer/utf8.hpp"

namespace colibri::server {

using nlohmann::json;
using nlohmann::ordered_json;

std::string ApiError::body() const {
  json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError not_found_route(std::string_view method, std::string_view target) {
  return ApiError{404, "Unknown request URL: " + std::string(method) + " " + std::string(target) + ".",
                  "invalid_request_error", "", "unknown_url"};
}

ApiError unauthorized() {
  return ApiError{401,
                  "Missing or incorrect API key. Send the key given to colibri-server --api-key as "
                  "'Authorization: Bearer KEY'.",
                  "invalid_request_error", "", "invalid_api_key"};
}

namespace {
// A header value as it is compared: without surrounding blanks, in lower case (media types and codings are
// case-insensitive).
std::string header_token(std::string_view value) {
  const auto first = value.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  value = value.substr(first, value.find_last_not_of(" \t") - first + 1);
  std::string out(value);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

std::optional<ApiError> check_post_media_type(std::string_view content_type) {
  const std::string type = header_token(content_type.substr(0, content_type.find(';')));
  if (type != "application/x-www-form-urlencoded" && type != "multipart/form-data" && type != "text/plain") {
    return std::nullopt;
  }
  return ApiError{415,
                  "Content-Type '" + type +
                      "' is refused: send the JSON body as application/json (curl: -H 'Content-Type: "
                      "application/json'). Form and text bodies are what a web page can post to any server "
                      "without asking, so they are not read.",
                  "invalid_request_error", "", "unsupported_media_type"};
}

std::optional<ApiError> check_post_encoding(std::string_view content_encoding) {
  const std::string coding = header_token(content_encoding);
  if (coding.empty() || coding == "identity") return std::nullopt;
  return ApiError{415, "Content-Encoding '" + coding + "' is not supported: send the body uncompressed.",
                  "invalid_request_error", "", "unsupported_media_type"};
}

ApiError too_large(std::uint64_t limit_bytes) {
  return ApiError{413,
                  "The request body is larger than the server's limit of " + std::to_string(limit_bytes) +
                      " bytes (colibri-server --max-body-size).",
                  "invalid_request_error", "", "request_too_large"};
}

ApiError busy(std::size_t queue_limit, int choices) {
  if (queue_limit == 0) {
    return ApiError{429,
                    "The server is busy: every batch slot is in use, and no request waits for one "
                    "(colibri-server --max-queue 0). Retry later.",
                    "rate_limit_error", "", "rate_limit_exceeded"};
  }
  return ApiError{429,
                  "The server is busy: its queue of " + std::to_string(queue_limit) +
                      " waiting requests (colibri-server --max-queue) has no room for " +
                      (choices > 1 ? "this request's " + std::to_string(choices) + " choices" : "this request") +
                      ". Retry later.",
                  "rate_limit_error", "", "rate_limit_exceeded"};
}

ApiError internal_error(std::string message) {
  return ApiError{500, std::move(message), "server_error", "", ""};
}

std::string without_model_dir(std::string message, const std::filesystem::path& model_dir) {
  std::error_code ec;
  std::vector<std::string> forms;  // absolute ones only: a relative directory tells the client nothing of the server
  if (const auto abs = std::filesystem::absolute(model_dir, ec); !ec) forms.push_back(abs.lexically_normal().string());
  if (const auto real = std::filesystem::canonical(model_dir, ec); !ec) forms.push_back(real.string());
  std::sort(forms.begin(), forms.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (auto form : forms) {
    while (!form.empty() && form.back() == '/') form.pop_back();
    if (form.empty()) continue;
    form += '/';
    for (auto at = message.find(form); at != std::string::npos; at = message.find(form, at))
      message.erase(at, form.size());
  }
  return message;
}

std::optional<std::string> percent_decoded(std::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (std::size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out.push_back(segment[i]);
      continue;
    }
    unsigned value = 0;
    if (i + 2 >= segment.size()) return std::nullopt;  // "%" or "%A" at the end
    const auto [end, ec] = std::from_chars(segment.data() + i + 1, segment.data() + i + 3, value, 16);
    if (ec != std::errc{} || end != segment.data() + i + 3) return std::nullopt;
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

ApiError unavailable_for_now(std::string message) {
  return ApiError{503, std::move(message), "server_error", "", "temporarily_unavailable"};
}

ApiError unavailable(std::string message) {
  return ApiError{503, std::move(message), "server_error", "", "server_shutting_down"};
}

std::size_t json_nesting_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  JsonBrackets brackets;
  for (const char c : text) {
    const int step = brackets.step(c);
    if (step > 0) {
      deepest = std::max(deepest, ++depth);
    } else if (step < 0 && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

namespace {

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

ApiError wrong_type(const std::string& field, const std::string& want, const json& got) {
  return bad_request("Invalid type for '" + field + "': expected " + want + ", but got " + type_name(got) + ".", field,
                     "invalid_type");
}

ApiError missing(const std::string& field) {
  return bad_request("Missing required parameter: '" + field + "'.", field, "missing_required_parameter");
}

ApiError out_of_range(const std::string& field, const std::string& range, const json& got) {
  return bad_request("Invalid value for '" + field + "': expected " + range + ", but got " + got.dump() + ".", field,
                     "invalid_value");
}

// A number field within [lo, hi]; absent or null leaves `out` alone.
std::optional<ApiError> number_field(const json& body, const char* name, double lo, double hi, float& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(name, "a number", *it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return out_of_range(name, "a number from " + json(lo).dump() + " to " + json(hi).dump(), *it);
  }
  out = static_cast<float>(v);
  return std::nullopt;
}

bool is_integer(const json& v) {
  return v.is_number_integer() || v.is_number_unsigned();
}

// The sampling fields' ranges: what a request may give, and so what a model's generation_config.json may.
struct NumberRange {
  const char* name;
  double lo, hi;
};
constexpr NumberRange kTemperature{"temperature", 0.0, 2.0}, kTopP{"top_p", 0.0, 1.0}, kMinP{"min_p", 0.0, 1.0},
    kRepetitionPenalty{"repetition_penalty", 0.01, 10.0};
constexpr std::int64_t kTopKMax = 1000000;

std::optional<ApiError> number_field(const json& body, const NumberRange& r, float& out) {
  return number_field(body, r.name, r.lo, r.hi, out);
}

// top_k: -1 and 0 both mean off (vLLM writes -1); `out` stays unset when the field is absent or null.
std::optional<ApiError> top_k_field(const json& body, std::optional<std::int32_t>& out) {
  auto it = body.find("top_k");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!is_integer(*it)) return wrong_type("top_k", "an integer", *it);
  if (it->is_number_unsigned() ? it->get<std::uint64_t>() > static_cast<std::uint64_t>(kTopKMax)
                               : it->get<std::int64_t>() < -1) {
    return out_of_range("top_k", "-1 or 0 (off), or a number of tokens up to " + std::to_string(kTopKMax), *it);
  }
  out = static_cast<std::int32_t>(it->get<std::int64_t>());
  return std::nullopt;
}

// Content may be a string, null, or an array of {"type": "text", "text": ...} parts (joined by newlines); an
// assistant's may also hold {"type": "refusal", "refusal": ...} parts (OpenAI's history of a refused answer), read as
// its text, as vLLM does.
std::optional<ApiError> message_content(const json& content, const std::string& field, bool assistant,
                                        std::string& out) {
  // Only an assistant turn may have none (its calls are its content), as OpenAI's API has it.
  if (content.is_null() && !assistant) return wrong_type(field, "a string or an array of content parts", content);
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) {
    out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return wrong_type(field, "a string or an array of content parts", content);
  for (std::size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const std::string pf = field + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return wrong_type(pf, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return missing(pf + ".type");
    const bool refusal = assistant && *type == "refusal";
    if (*type != "text" && !refusal) {
      return bad_request("Content part type '" + type->get<std::string>() + "' is not supported (only 'text'" +
                             (assistant ? std::string(" and 'refusal'") : std::string()) + ").",
                         pf + ".type", "invalid_value");
    }
    const std::string key = refusal ? "refusal" : "text";
    auto text = part.find(key);
    if (text == part.end() || !text->is_string()) {
      return text == part.end() ? missing(pf + "." + key) : wrong_type(pf + "." + key, "a string", *text);
    }
    if (i > 0) out += '\n';  // as vLLM ("\n".join) and llama-server join text parts
    out += text->get<std::string>();
  }
  return std::nullopt;
}

// An assistant message's earlier calls, for the template: {id, type, function: {name, arguments}} with the arguments
// text as given (render_chat decides how the template gets it).
std::optional<ApiError> parse_history_tool_calls(const json& calls, const std::string& field, ordered_json& out) {
  if (!calls.is_array()) return wrong_type(field, "an array", calls);
  out = ordered_json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const json& call = calls[i];
    const std::string cf = field + "[" + std::to_string(i) + "]";
    if (!call.is_object()) return wrong_type(cf, "an object", call);
    auto id = call.find("id");
    if (id == call.end()) return missing(cf + ".id");
    if (!id->is_string()) return wrong_type(cf + ".id", "a string", *id);
    if (auto type = call.find("type"); type != call.end() && *type != "function") {
      return bad_request("Invalid value for '" + cf + ".type': only 'function' is supported.", cf + ".type",
                         "invalid_value");
    }
    auto function = call.find("function");
    if (function == call.end()) return missing(cf + ".function");
    if (!function->is_object()) return wrong_type(cf + ".function", "an object", *function);
    auto name = function->find("name");
    if (name == function->end()) return missing(cf + ".function.name");
    if (!name->is_string()) return wrong_type(cf + ".function.name", "a string", *name);
    auto arguments = function->find("arguments");
    if (arguments == function->end()) return missing(cf + ".function.arguments");
    if (!arguments->is_string()) return wrong_type(cf + ".function.arguments", "a string", *arguments);
    out.push_back(ordered_json{
        {"id", *id}, {"type", "function"}, {"function", ordered_json{{"name", *name}, {"arguments", *arguments}}}});
  }
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& body, ordered_json& out) {
  auto it = body.find("messages");
  if (it == body.end()) {
    return missing("messages");
  }
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty()) return bad_request("'messages' must not be empty.", "messages", "invalid_value");
  out = ordered_json::array();
  for (std::size_t i = 0; i < it->size(); ++i) {
    const auto& m = (*it)[i];
    const std::string f = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return wrong_type(f, "an object", m);
    auto role = m.find("role");
    if (role == m.end()) {
      return missing(f + ".role");
    }
    if (!role->is_string()) return wrong_type(f + ".role", "a string", *role);
    const auto r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool") {
      return bad_request("Invalid value for '" + f + ".role': '" + r +
                             "'; supported values are 'system', 'developer', 'user', 'assistant' and 'tool'.",
                         f + ".role", "invalid_value");
    }
    std::string content;
    auto c = m.find("content");
    if (c != m.end()) {
      if (auto e = message_content(*c, f + ".content", r == "assistant", content)) return e;
    } else if (r != "assistant") {
      return missing(f + ".content");
    }
    ordered_json msg;
    msg["role"] = r == "developer" ? "system" : r;  // templates know "system"
    // An assistant turn of calls alone keeps its null content (see render_chat).
    const bool null_content = r == "assistant" && (c == m.end() || c->is_null());
    msg["content"] = null_content ? ordered_json(nullptr) : ordered_json(content);
    auto name = m.find("name");
    if (name != m.end() && name->is_string()) msg["name"] = *name;
    // An earlier turn's reasoning, as the client sent it back: templates render it in a tool loop's turns (Qwen3,
    // GLM, DeepSeek V3.2 read reasoning_content; gpt-oss's reads thinking), and vLLM passes these through.
    if (r == "assistant") {
      for (const char* field : {"reasoning_content", "reasoning", "thinking"}) {
        if (auto it = m.find(field); it != m.end() && it->is_string()) msg[field] = *it;
      }
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (r != "assistant") {
        return bad_request("'" + f + ".tool_calls' is only allowed in an assistant message.", f + ".tool_calls",
                           "invalid_value");
      }
      ordered_json list;
      if (auto e = parse_history_tool_calls(*calls, f + ".tool_calls", list)) return e;
      if (!list.empty()) msg["tool_calls"] = std::move(list);
    }
    if (r == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || id->is_null()) {
        return missing(f + ".tool_call_id");
      }
      if (!id->is_string()) return wrong_type(f + ".tool_call_id", "a string", *id);
      msg["tool_call_id"] = *id;
    }
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

// One prompt of a batch (or the only one): a string, or token ids; `where` names it in errors.
std::optional<ApiError> parse_one_prompt(const json& p, const std::string& where, bool& is_tokens, std::string& text,
                                         std::vector<std::int32_t>& tokens) {
  if (p.is_string()) {
    is_tokens = false;
    text = p.get<std::string>();
    return std::nullopt;
  }
  if (!p.is_array()) return wrong_type(where, "a string or an array of token ids", p);
  is_tokens = true;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& t = p[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!is_integer(t)) return wrong_type(at, "an integer token id", t);
    const auto v = t.get<std::int64_t>();
    if (v < 0 || v > std::numeric_limits<std::int32_t>::max()) {
      return out_of_range(at, "a token id of the model's vocabulary", t);
    }
    tokens.push_back(static_cast<std::int32_t>(v));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& body, CompletionRequest& out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return missing("prompt");
  }
  const json& p = *it;
  // An array of strings or of token-id arrays is a batch (OpenAI, vLLM); else one prompt.
  if (!p.is_array() || p.empty() || (!p[0].is_string() && !p[0].is_array())) {
    return parse_one_prompt(p, "prompt", out.prompt_is_tokens, out.prompt, out.prompt_tokens);
  }
  if (p.size() > static_cast<std::size_t>(kMaxPrompts)) {
    return bad_request("'prompt' holds " + std::to_string(p.size()) + " prompts; send at most " +
                           std::to_string(kMaxPrompts) + " in one request.",
                       "prompt", "invalid_value");
  }
  out.prompt_is_list = true;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const std::string where = "prompt[" + std::to_string(i) + "]";
    bool is_tokens = false;
    std::string text;
    std::vector<std::int32_t> tokens;
    if (!p[i].is_string() && !p[i].is_array()) return wrong_type(where, "a string or an array of token ids", p[i]);
    if (auto e = parse_one_prompt(p[i], where, is_tokens, text, tokens)) return e;
    if (i == 0) {
      out.prompt_is_tokens = is_tokens;
      out.prompt = std::move(text);
      out.prompt_tokens = std::move(tokens);
    } else if (is_tokens != out.prompt_is_tokens) {
      return bad_request("'prompt' mixes texts and token-id arrays; " + where + " is " +
                             (is_tokens ? "token ids" : "a text") + " but prompt[0] is not. Send one kind.",
                         where, "invalid_type");
    } else if (is_tokens) {
      out.more_prompt_tokens.push_back(std::move(tokens));
    } else {
      out.more_prompts.push_back(std::move(text));
    }
  }
  return std::nullopt;
}

}  // namespace

std::string with_lone_surrogates_replaced(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto hex4 = [&](std::size_t at, unsigned& v) {
    if (at + 6 > text.size() || text[at] != '\\' || text[at + 1] != 'u') return false;
    const auto [end, ec] = std::from_chars(text.data() + at + 2, text.data() + at + 6, v, 16);
    return ec == std::errc{} && end == text.data() + at + 6;
  };
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!in_string) {
      in_string = c == '"';
      out.push_back(c);
      continue;
    }
    if (c == '"') {
      in_string = false;
      out.push_back(c);
      continue;
    }
    if (c != '\\' || i + 1 >= text.size()) {
      out.push_back(c);
      continue;
    }
    unsigned v = 0, low = 0;
    if (text[i + 1] == 'u' && hex4(i, v) && v >= 0xD800 && v <= 0xDFFF) {
      if (v <= 0xDBFF && hex4(i + 6, low) && low >= 0xDC00 && low <= 0xDFFF) {
        out.append(text.substr(i, 12));  // a pair: one character
        i += 11;
      } else {
        out += "\\uFFFD";  // alone: not a character; U+FFFD as a decoder would make it
        i += 5;
      }
      continue;
    }
    out.append(text.substr(i, 2));  // any other escape, \\ included, as it is
    ++i;
  }
  return out;
}

namespace {

// A body parsed quietly (discarded when not JSON). A client that cut a string inside a surrogate pair (JavaScript's
// slice() on an emoji) sends half a pair, which Python's json (and so vLLM) reads: here it becomes U+FFFD instead of
// failing the request. Every parse of a body goes through this, so each field reads the same text.
template <class Json>
Json parse_body(std::string_view body_text) {
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() && body_text.find("\\u") != std::string_view::npos) {
    body = Json::parse(with_lone_surrogates_replaced(body_text), nullptr, /*allow_exceptions=*/false);
  }
  return body;
}

// A JSON object body, nesting bounded before parsing.
std::optional<ApiError> parse_object(std::string_view body_text, json& body) {
  if (json_nesting_depth(body_text) > kMaxJsonDepth) {
    return bad_request("The JSON body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels.");
  }
  body = parse_body<json>(body_text);
  if (body.is_discarded()) {
    std::string why;
    try {
      body = json::parse(body_text);  // throws, saying where and why (the quiet parse above only failed)
    } catch (const json::parse_error& e) {
      why = e.what();
      if (const auto at = why.find("parse error"); at != std::string::npos) why = why.substr(at);
      why = " (" + why + ")";
    } catch (const std::exception&) {
    }
    return bad_request("We could not parse the JSON body of your request" + why +
                       ". The body must be valid JSON (UTF-8, Content-Type: application/json).");
  }
  if (!body.is_object()) return bad_request("The request body must be a JSON object, got " + type_name(body) + ".");
  return std::nullopt;
}

// Admin bodies are optional: empty (or only whitespace) means {}.
std::optional<ApiError> parse_optional_object(std::string_view body_text, json& body) {
  if (body_text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    body = json::object();
    return std::nullopt;
  }
  return parse_object(body_text, body);
}

std::optional<ApiError> unknown_fields(const json& body, std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string names;
      for (auto k : known) names += (names.empty() ? "'" : ", '") + std::string(k) + "'";
      return bad_request(
          "Unrecognized request argument supplied: '" + key + "'" +
              (known.size() == 0 ? std::string(" (this request takes no arguments).") : " (known: " + names + ")."),
          key, "unknown_parameter");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_cache_clear_request(std::string_view body_text) {
  json body;
  if (auto e = parse_optional_object(body_text, body)) return e;
  return unknown_fields(body, {});
}

std::optional<ApiError> parse_cache_warm_request(std::string_view body_text, CacheWarmRequest& out) {
  out = CacheWarmRequest{};
  json body;
  if (auto e = parse_optional_object(body_text, body)) return e;
  if (auto e = unknown_fields(body, {"experts", "top"})) return e;
  auto experts = body.find("experts");
  auto top = body.find("top");
  const bool has_experts = experts != body.end() && !experts->is_null();
  const bool has_top = top != body.end() && !top->is_null();
  if (has_experts && has_top) {
    return bad_request("Give either 'experts' or 'top', not both.", "top", "invalid_value");
  }
  if (has_top) {
    if (!is_integer(*top)) return wrong_type("top", "an integer", *top);
    if (top->get<std::int64_t>() < 1 || top->get<std::int64_t>() > 10000000) {
      return out_of_range("top", "an integer from 1 to 10000000", *top);
    }
    out.top = top->get<std::int64_t>();
  }
  if (has_experts) {
    if (!experts->is_array()) return wrong_type("experts", "an array of \"layer:expert\" strings", *experts);
    if (experts->empty()) {
      return bad_request("'experts' is empty: name at least one \"layer:expert\", or leave it out.", "experts",
                         "invalid_value");
    }
    for (std::size_t i = 0; i < experts->size(); ++i) {
      const auto& x = (*experts)[i];
      const std::string field = "experts[" + std::to_string(i) + "]";
      if (!x.is_string()) return wrong_type(field, "a \"layer:expert\" string", x);
      auto key = parse_expert_key(x.get<std::string>());
      if (!key) return out_of_range(field, "\"layer:expert\" with two non-negative integers, e.g. \"3:1\"", x);
      out.experts.push_back(*key);
    }
  }
  return std::nullopt;
}

std::optional<sdk::ExpertKey> parse_expert_key(std::string_view text) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto number = [](std::string_view t) -> std::optional<std::uint32_t> {
    if (t.empty() || t.size() > 9) return std::nullopt;
    std::uint32_t v = 0;
    for (const char c : t) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + static_cast<std::uint32_t>(c - '0');
    }
    return v;
  };
  auto layer = number(text.substr(0, colon));
  auto expert = number(text.substr(colon + 1));
  if (!layer || !expert) return std::nullopt;
  return sdk::ExpertKey{*layer, *expert};
}

std::optional<ApiError> check_context(Endpoint endpoint, std::int64_t prompt_tokens,
                                      std::optional<std::int64_t> max_tokens, std::int64_t context) {
  const std::string what = endpoint == Endpoint::chat ? "messages" : "prompt";
  const std::string head = "This model's maximum context length is " + std::to_string(context) + " tokens. However, ";
  if (prompt_tokens > context || (prompt_tokens == context && max_tokens != 0)) {  // 0: echo scores the prompt
    return bad_request(head + "your " + what + " resulted in " + std::to_string(prompt_tokens) +
                           " tokens, which leaves no room to generate. Please reduce the length of the " + what + ".",
                       what, "context_length_exceeded");
  }
  if (max_tokens && *max_tokens > context - prompt_tokens) {
    // Both are below 2^63, so the sum fits in 64 unsigned bits even for max_tokens near INT64_MAX.
    const auto requested = static_cast<std::uint64_t>(prompt_tokens) + static_cast<std::uint64_t>(*max_tokens);
    return bad_request(head + "you requested " + std::to_string(requested) + " tokens (" +
                           std::to_string(prompt_tokens) + " in the " + what + ", " + std::to_string(*max_tokens) +
                           " in the completion). Please reduce the length of the " + what + " or completion.",
                       what, "context_length_exceeded");
  }
  return std::nullopt;
}

namespace {

// chat: logprobs (bool) and top_logprobs (0..20); completions: logprobs (0..20 alternatives).
std::optional<ApiError> parse_logprobs(const json& body, Endpoint endpoint, CompletionRequest& out) {
  auto count = [&](const char* name, const json& v, int& n) -> std::optional<ApiError> {
    if (!is_integer(v)) return wrong_type(name, "an integer", v);
    if (v.is_number_unsigned() ? v.get<std::uint64_t>() > kMaxTopLogprobs
                               : v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > kMaxTopLogprobs) {
      return out_of_range(name, "an integer from 0 to " + std::to_string(kMaxTopLogprobs), v);
    }
    n = v.get<int>();
    return std::nullopt;
  };
  auto lp = body.find("logprobs");
  const bool given = lp != body.end() && !lp->is_null() && !(lp->is_boolean() && !lp->get<bool>());
  if (endpoint == Endpoint::completions) {
    if (given) return count("logprobs", *lp, out.logprobs);
    return std::nullopt;
  }
  if (given && !lp->is_boolean()) return wrong_type("logprobs", "a boolean", *lp);
  auto top = body.find("top_logprobs");
  if (top != body.end() && !top->is_null()) {
    if (!given) {
      return bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value");
    }
    return count("top_logprobs", *top, out.logprobs);
  }
  if (given) out.logprobs = 0;
  return std::nullopt;
}

// {"<token id>": bias in [-100, 100]}; ids are checked against the vocabulary by the server.
std::optional<ApiError> parse_logit_bias(const json& body, engine::SamplingOptions& s) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return wrong_type("logit_bias", "an object mapping token ids to numbers", *it);
  for (const auto& [key, value] : it->items()) {
    const std::string param = "logit_bias[\"" + key.substr(0, 40) + "\"]";
    std::int32_t id = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0) {
      return bad_request("Invalid key in 'logit_bias': '" + key.substr(0, 40) + "' is not a token id.", "logit_bias",
                         "invalid_value");
    }
    if (!value.is_number()) return wrong_type(param, "a number", value);
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) return out_of_range(param, "a number from -100 to 100", value);
    s.logit_bias.emplace_back(id, static_cast<float>(bias));
  }
  return std::nullopt;
}

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// The body re-read with its key order kept, once and only when a field needs it (the template shows tools and
// template variables to the model as written).
class OrderedBody {
 public:
  explicit OrderedBody(std::string_view text) : text_(text) {}
  ordered_json field(const char* name) {
    if (!body_) body_ = parse_body<ordered_json>(text_);
    return body_->value(name, ordered_json());
  }

 private:
  std::string_view text_;
  std::optional<ordered_json> body_;
};

// tools, tool_choice and parallel_tool_calls (chat only).
std::optional<ApiError> parse_tools(const json& body, OrderedBody& ordered, Endpoint endpoint, CompletionRequest& out) {
  auto tools = body.find("tools");
  auto choice = body.find("tool_choice");
  const bool has_tools = tools != body.end() && !tools->is_null() && !(tools->is_array() && tools->empty());
  const bool has_choice = choice != body.end() && !choice->is_null();
  if (endpoint == Endpoint::completions) {
    for (const char* name : {"tools", "tool_choice", "parallel_tool_calls"}) {
      if (auto it = body.find(name); it != body.end() && !it->is_null()) {
        return bad_request(std::string("'") + name + "' is only supported by /v1/chat/completions.", name,
                           "unsupported_parameter");
      }
    }
    return std::nullopt;
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) return wrong_type("parallel_tool_calls", "a boolean", *p);
    out.parallel_tool_calls = p->get<bool>();
  }
  if (!has_tools) {
    if (tools != body.end() && !tools->is_null() && !tools->is_array()) {
      return wrong_type("tools", "an array of tool definitions", *tools);
    }
    if (has_choice && *choice != "none") {
      return bad_request("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                         "tool_choice", "invalid_value");
    }
    return std::nullopt;
  }
  if (!tools->is_array()) return wrong_type("tools", "an array of tool definitions", *tools);
  if (tools->size() > kMaxTools) {
    return bad_request("'tools' holds " + std::to_string(tools->size()) + " definitions; at most " +
                           std::to_string(kMaxTools) + " are allowed.",
                       "tools", "invalid_value");
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < tools->size(); ++i) {
    const json& tool = (*tools)[i];
    const std::string f = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) return wrong_type(f, "an object", tool);
    auto type = tool.find("type");
    if (type == tool.end()) return missing(f + ".type");
    if (*type != "function") {
      return bad_request(
          "Invalid value for '" + f + ".type': only 'function' tools are supported, got " + type->dump() + ".",
          f + ".type", "invalid_value");
    }
    auto function = tool.find("function");
    if (function == tool.end()) {
      return missing(f + ".function");
    }
    if (!function->is_object()) return wrong_type(f + ".function", "an object", *function);
    auto name = function->find("name");
    if (name == function->end()) {
      return missing(f + ".function.name");
    }
    if (!name->is_string()) return wrong_type(f + ".function.name", "a string", *name);
    if (!valid_function_name(name->get<std::string>())) {
      return bad_request("Invalid value for '" + f + ".function.name': " + name->dump() +
                             " must be 1 to 64 letters, digits, underscores or dashes.",
                         f + ".function.name", "invalid_value");
    }
    if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end()) {
      return bad_request(
          "Invalid value for '" + f + ".function.name': the function " + name->dump() + " is defined twice.",
          f + ".function.name", "invalid_value");
    }
    names.push_back(name->get<std::string>());
    if (auto d = function->find("description"); d != function->end() && !d->is_null() && !d->is_string()) {
      return wrong_type(f + ".function.description", "a string", *d);
    }
    if (auto p = function->find("parameters"); p != function->end() && !p->is_null() && !p->is_object()) {
      return wrong_type(f + ".function.parameters", "a JSON Schema object", *p);
    }
  }
  out.tool_choice = CompletionRequest::ToolChoice::automatic;
  if (has_choice) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") {
        out.tool_choice = CompletionRequest::ToolChoice::none;
      } else if (c == "required") {
        if (names.size() == 1) {
          out.tool_choice = CompletionRequest::ToolChoice::function;
          out.tool_choice_name = names[0];
        } else {
          out.tool_choice = CompletionRequest::ToolChoice::required;
          out.tool_names = names;
        }
      } else if (c != "auto") {
        return bad_request(
            "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or an object naming "
            "a function, but got " +
                choice->dump() + ".",
            "tool_choice", "invalid_value");
      }
    } else if (choice->is_object()) {
      auto function = choice->find("function");
      const json* name = function != choice->end() && function->is_object() && function->contains("name")
                             ? &(*function)["name"]
                             : nullptr;
      if (choice->value("type", json()) != "function" || name == nullptr || !name->is_string()) {
        return bad_request(
            "Invalid value for 'tool_choice': an object must be {\"type\": \"function\", \"function\": "
            "{\"name\": \"...\"}}.",
            "tool_choice", "invalid_value");
      }
      if (std::find(names.begin(), names.end(), name->get<std::string>()) == names.end()) {
        return bad_request("Invalid value for 'tool_choice': the function " + name->dump() + " is not in 'tools'.",
                           "tool_choice", "invalid_value");
      }
      out.tool_choice = CompletionRequest::ToolChoice::function;
      out.tool_choice_name = name->get<std::string>();
    } else {
      return wrong_type("tool_choice", "a string or an object", *choice);
    }
  }
  out.tools = ordered.field("tools");  // "none" too: the template may still show them (no call is read)
  return std::nullopt;
}

}  // namespace

namespace {
std::string g_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

std::string SamplingDefaults::describe() const {
  std::string out;
  auto add = [&](const char* name, const std::string& v) {
    out += (out.empty() ? "" : ", ") + std::string(name) + " " + v;
  };
  const auto num = g_text;
  if (temperature) add("temperature", num(*temperature));
  if (top_p) add("top_p", num(*top_p));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (min_p) add("min_p", num(*min_p));
  if (repetition_penalty) add("repetition_penalty", num(*repetition_penalty));
  return out;
}

sdk::Expected<SamplingDefaults> read_sampling_defaults(const std::filesystem::path& file, std::string_view fix) {
  SamplingDefaults d;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return d;
  std::ifstream in(file, std::ios::binary);
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    return sdk::Status(sdk::StatusCode::invalid_argument, file.string() + " is not valid JSON (" + e.what() +
                                                              "); fix it, or start with --sampling-defaults openai");
  }
  if (!j.is_object()) return d;
  // Checked as a request's fields are: a value a request could not give is the file's mistake, named.
  auto refused = [&](const char* name, const std::string& lo, const std::string& hi) {
    const json& v = j[name];
    return sdk::Status(sdk::StatusCode::invalid_argument,
                       file.string() + ": \"" + name + "\" is " + v.dump() + (v.is_number() ? "" : ", not a number") +
                           "; a request may give " + lo + " to " + hi + std::string(fix));
  };
  for (auto [range, into] : {std::pair{&kTemperature, &d.temperature},
                             {&kTopP, &d.top_p},
                             {&kMinP, &d.min_p},
                             {&kRepetitionPenalty, &d.repetition_penalty}}) {
    if (!j.contains(range->name) || j[range->name].is_null()) continue;
    float v = 0;
    if (number_field(j, *range, v)) return refused(range->name, g_text(range->lo), g_text(range->hi));
    *into = v;
  }
  std::optional<std::int32_t> top_k;
  if (top_k_field(j, top_k)) return refused("top_k", "-1", std::to_string(kTopKMax));
  if (top_k) d.top_k = *top_k;
  return d;
}

std::optional<ApiError> parse_completion_request(std::string_view body_text, Endpoint endpoint, CompletionRequest& out,
                                                 const SamplingDefaults& defaults) {
  out = CompletionRequest{};
  out.endpoint = endpoint;
  json body;
  if (auto e = parse_object(body_text, body)) return e;
  // A whole number written as a float (5.0, as Python clients may compute it) is that integer, as vLLM reads it.
  for (const char* name : {"max_tokens", "max_completion_tokens", "n", "seed", "logprobs", "top_logprobs", "top_k",
                           "min_tokens", "speculative.n_max", "speculative.n_min"}) {
    if (auto it = body.find(name); it != body.end() && it->is_number_float()) {
      const double v = it->get<double>();
      if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.2e18) *it = static_cast<std::int64_t>(v);
      // A whole number past 64 bits (1e30) is an integer too large, not a wrong type.
      else if (std::isfinite(v) && v == std::floor(v))
        return out_of_range(name, "an integer within 64 bits", *it);
    }
  }

  // Without a model the served one answers, as llama-server and vLLM do (a single-model server).
  if (auto model = body.find("model"); model != body.end() && !model->is_null()) {
    if (!model->is_string()) return wrong_type("model", "a string", *model);
    out.model = model->get<std::string>();
  }
  // OpenAI's end-user id: not used here, but a request that sends one sends a string.
  if (auto user = body.find("user"); user != body.end() && !user->is_null() && !user->is_string()) {
    return wrong_type("user", "a string", *user);
  }

  if (endpoint == Endpoint::chat) {
    if (auto e = parse_messages(body, out.messages)) return e;
    if (auto it = body.find("echo"); it != body.end() && !it->is_null()) {
      if (!it->is_boolean()) return wrong_type("echo", "a boolean", *it);
      if (it->get<bool>()) {
        return bad_request("'echo' is only supported by /v1/completions.", "echo", "unsupported_parameter");
      }
    }
  } else {
    if (auto e = parse_prompt(body, out)) return e;
    if (auto it = body.find("echo"); it != body.end() && !it->is_null()) {
      if (!it->is_boolean()) return wrong_type("echo", "a boolean", *it);
      out.echo = it->get<bool>();
    }
    if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
      if (!it->is_string()) return wrong_type("suffix", "a string", *it);
      if (out.prompt_is_tokens) {
        return bad_request("'suffix' needs a text prompt, not token ids.", "suffix", "invalid_value");
      }
      out.suffix = it->get<std::string>();
    }
  }

  // OpenAI defaults: plain temperature sampling over the full distribution.
  auto& s = out.sampling;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.top_k = 0;
  s.min_p = 0.0f;
  s.repetition_penalty = 1.0f;
  s.penalty_last_n = -1;
  s.penalize_prompt = false;  // presence and frequency count the answer's tokens only, as OpenAI and vLLM
  // The model's recommendation where the request leaves a field out (colibri-server --sampling-defaults).
  s.temperature = defaults.temperature.value_or(s.temperature);
  s.top_p = defaults.top_p.value_or(s.top_p);
  s.top_k = std::max(0, defaults.top_k.value_or(s.top_k));  // -1 is off, as 0
  s.min_p = defaults.min_p.value_or(s.min_p);
  s.repetition_penalty = defaults.repetition_penalty.value_or(s.repetition_penalty);
  if (auto e = number_field(body, kTemperature, s.temperature)) return e;
  if (auto e = number_field(body, kTopP, s.top_p)) return e;
  if (s.top_p <= 0.0f) {  // only the most likely token survives
    s.top_p = 1.0f;
    s.temperature = 0.0f;
  }
  if (auto e = number_field(body, "presence_penalty", -2.0, 2.0, s.presence_penalty)) return e;
  if (auto e = number_field(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty)) return e;
  // Extensions vLLM and llama.cpp's server also take: off unless given.
  if (auto it = body.find("ignore_eos"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong_type("ignore_eos", "a boolean", *it);
    out.ignore_eos = it->get<bool>();
  }
  // A special token the model does not list as an end (a base model's <|im_end|>): stop strings never see it, since
  // special tokens are not in the text.
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return wrong_type("stop_token_ids", "a list of token ids", *it);
    for (const auto& id : *it) {
      if (!is_integer(id) || !id.is_number_unsigned() || id.get<std::uint64_t>() > 0x7fffffffu) {
        return out_of_range("stop_token_ids", "token ids (integers of 0 or more)", id);
      }
      out.stop_token_ids.push_back(static_cast<std::int32_t>(id.get<std::uint64_t>()));
    }
  }
  // Special tokens are never in the text (stop strings and offsets rely on it): asking for them is refused, not
  // ignored.
  if (auto it = body.find("skip_special_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong_type("skip_special_tokens", "a boolean", *it);
    if (!it->get<bool>()) {
      return bad_request(
          "skip_special_tokens false is not supported: special tokens are always left out of the "
          "text; to end at one, list it in stop_token_ids.",
          "skip_special_tokens", "unsupported_value");
    }
  }
  // As given (past 2^63 too), for the comparison below; the request holds them capped at the int64 range.
  std::uint64_t min_given = 0;
  std::optional<std::uint64_t> max_given;
  if (auto it = body.find("min_tokens"); it != body.end() && !it->is_null()) {
    if (!is_integer(*it)) return wrong_type("min_tokens", "an integer", *it);
    if (!it->is_number_unsigned()) return out_of_range("min_tokens", "an integer of 0 or more", *it);
    min_given = it->get<std::uint64_t>();
    out.min_tokens = it->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                         ? std::numeric_limits<std::int64_t>::max()
                         : it->get<std::int64_t>();
  }
  // llama-server's per-request speculation (its flat "speculative.*" keys).
  for (const char* name : {"speculative.n_max", "speculative.n_min"}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (!is_integer(*it)) return wrong_type(name, "an integer", *it);
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() > 64) {
      return out_of_range(name, "an integer from 0 to 64", *it);
    }
    if (std::string_view(name) == "speculative.n_max") {
      out.draft_max = it->get<std::int64_t>();
    } else {
      out.draft_min = it->get<std::int64_t>();
    }
  }
  if (out.draft_max && out.draft_min > *out.draft_max) {
    return bad_request("'speculative.n_min' (" + std::to_string(out.draft_min) +
                           ") is more than 'speculative.n_max' (" + std::to_string(*out.draft_max) +
                           "); lower n_min or raise n_max.",
                       "speculative.n_min", "invalid_value");
  }
  float p_min = -1;
  if (auto e = number_field(body, "speculative.p_min", 0.0, 1.0, p_min)) return e;
  if (p_min >= 0) out.draft_p_min = p_min;
  if (auto e = number_field(body, kMinP, s.min_p)) return e;
  if (auto e = number_field(body, kRepetitionPenalty, s.repetition_penalty)) return e;
  std::optional<std::int32_t> top_k;
  if (auto e = top_k_field(body, top_k)) return e;
  if (top_k) s.top_k = std::max<std::int32_t>(0, *top_k);

  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (!is_integer(*it)) return wrong_type(name, "an integer", *it);
    // 0 with echo scores a prompt without generating (its logprobs), as OpenAI's legacy API and vLLM allow.
    const bool scoring = endpoint == Endpoint::completions && out.echo;
    // Read as unsigned where nlohmann holds it so (every integer >= 0): past 2^63 it would read as negative.
    const std::int64_t least = scoring ? 0 : 1;
    if (it->is_number_unsigned() ? it->get<std::uint64_t>() < static_cast<std::uint64_t>(least)
                                 : it->get<std::int64_t>() < least) {
      return out_of_range(name,
                          scoring                             ? "an integer of 0 or more"
                          : endpoint == Endpoint::completions ? "an integer of at least 1 (0 only with echo)"
                                                              : "an integer of at least 1",
                          *it);
    }
    out.max_tokens = it->is_number_unsigned() && it->get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max()
                         ? std::numeric_limits<std::int64_t>::max()
                         : it->get<std::int64_t>();
    max_given = static_cast<std::uint64_t>(it->is_number_unsigned() ? it->get<std::uint64_t>()
                                                                    : static_cast<std::uint64_t>(*out.max_tokens));
  }
  if (max_given && min_given > *max_given) {  // as vLLM: no end token could ever be allowed
    return bad_request("'min_tokens' (" + std::to_string(min_given) + ") is more than 'max_tokens' (" +
                           std::to_string(*max_given) + "); lower min_tokens or raise max_tokens.",
                       "min_tokens", "invalid_value");
  }
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!is_integer(*it)) return wrong_type("seed", "an integer", *it);
    // -1 asks for a random seed, as llama-server and colibri-cli take it; other negative seeds are seeds.
    s.seed = it->is_number_unsigned() ? it->get<std::uint64_t>() : static_cast<std::uint64_t>(it->get<std::int64_t>());
    out.seed_given = !(it->is_number_integer() && !it->is_number_unsigned() && it->get<std::int64_t>() == -1);
  }
  if (auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!is_integer(*it)) return wrong_type("n", "an integer", *it);
    const bool huge = it->is_number_unsigned() && it->get<std::uint64_t>() > kMaxChoices;
    if (huge || it->get<std::int64_t>() < 1 || it->get<std::int64_t>() > kMaxChoices) {
      return out_of_range("n", "an integer from 1 to " + std::to_string(kMaxChoices), *it);
    }
    out.n = it->get<int>();
  }
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong_type("stream", "a boolean", *it);
    out.stream = it->get<bool>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("stream_options", "an object", *it);
    if (!out.stream) {
      return bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options", "invalid_value");
    }
    if (auto u = it->find("include_usage"); u != it->end() && !u->is_null()) {
      if (!u->is_boolean()) return wrong_type("stream_options.include_usage", "a boolean", *u);
      out.include_usage = u->get<bool>();
    }
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      out.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return bad_request("'stop' may hold at most 4 sequences.", "stop", "invalid_value");
      for (std::size_t i = 0; i < it->size(); ++i) {
        if (!(*it)[i].is_string()) return wrong_type("stop[" + std::to_string(i) + "]", "a string", (*it)[i]);
        out.stop.push_back((*it)[i].get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *it);
    }
    std::erase_if(out.stop, [](const std::string& x) { return x.empty(); });
  }
  if (auto e = parse_logprobs(body, endpoint, out)) return e;
  if (auto e = parse_logit_bias(body, s)) return e;
  OrderedBody ordered(body_text);
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("response_format", "an object", *it);
    const json type = it->value("type", json());
    if (!type.is_string()) return wrong_type("response_format.type", "a string", type);
    if (type == "json_object" && it->contains("schema") && !(*it)["schema"].is_null()) {
      // llama-server's spelling of a schema: json_object with "schema" beside the type.
      auto compiled = engine::JsonSchema::compile(ordered.field("response_format")["schema"]);
      if (!compiled) {
        return bad_request("Invalid 'response_format.schema': " + compiled.error().message() + ".",
                           "response_format.schema", "invalid_value");
      }
      out.json_object = true;
      out.json_schema = *compiled;
    } else if (type == "json_object") {
      out.json_object = true;
    } else if (type == "json_schema") {
      const json spec = it->value("json_schema", json());
      if (!spec.is_object()) return wrong_type("response_format.json_schema", "an object", spec);
      const json schema = spec.value("schema", json());
      if (schema.is_null()) {
        return missing("response_format.json_schema.schema");
      }
      // As the client wrote it: the answer's properties come in that order (OpenAI's structured outputs).
      auto compiled = engine::JsonSchema::compile(ordered.field("response_format")["json_schema"]["schema"]);
      if (!compiled) {
        return bad_request("Invalid 'response_format.json_schema.schema': " + compiled.error().message() + ".",
                           "response_format.json_schema.schema", "invalid_value");
      }
      out.json_object = true;
      out.json_schema = *compiled;
    } else if (type != "text") {
      return bad_request(
          "Invalid value for 'response_format.type': expected 'text', 'json_object' or 'json_schema', "
          "but got " +
              type.dump() + ".",
          "response_format.type", "invalid_value");
    }
  }
  if (auto e = parse_tools(body, ordered, endpoint, out)) return e;
  for (const char* name : {"continue_final_message", "add_generation_prompt"}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (endpoint == Endpoint::completions) {
      return bad_request(std::string("'") + name + "' is only supported by /v1/chat/completions.", name,
                         "unsupported_parameter");
    }
    if (!it->is_boolean()) return wrong_type(name, "a boolean", *it);
    (name[0] == 'c' ? out.continue_final_message : out.add_generation_prompt) = it->get<bool>();
  }
  if (out.continue_final_message) {
    if (out.add_generation_prompt && body.contains("add_generation_prompt")) {
      return bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true.",
                         "continue_final_message", "invalid_value");
    }
    out.add_generation_prompt = false;
    if (out.messages.back()["role"] != "assistant") {
      return bad_request("'continue_final_message' needs the last message to be the assistant's.",
                         "continue_final_message", "invalid_value");
    }
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    // vLLM's and llama.cpp's: more template variables, e.g. {"enable_thinking": false} for Qwen3.
    if (endpoint == Endpoint::completions) {
      return bad_request("'chat_template_kwargs' is only supported by /v1/chat/completions.", "chat_template_kwargs",
                         "unsupported_parameter");
    }
    if (!it->is_object()) return wrong_type("chat_template_kwargs", "an object", *it);
    for (const char* reserved : {"messages", "tools", "add_generation_prompt"}) {
      if (it->contains(reserved)) {
        return bad_request(
            std::string("'chat_template_kwargs' may not set '") + reserved + "'; the request's own fields give it.",
            std::string("chat_template_kwargs.") + reserved, "invalid_value");
      }
    }
    out.template_kwargs = ordered.field("chat_template_kwargs");
  }
  if (auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) {
    // OpenAI's: the chat templates that take it (gpt-oss's) read it as a variable of that name.
    if (endpoint == Endpoint::completions) {
      return bad_request("'reasoning_effort' is only supported by /v1/chat/completions.", "reasoning_effort",
                         "unsupported_parameter");
    }
    if (!it->is_string()) return wrong_type("reasoning_effort", "a string", *it);
    if (!out.template_kwargs.contains("reasoning_effort")) out.template_kwargs["reasoning_effort"] = *it;
  }
  // Fields other servers act on: ignored, each would answer another question than the one asked (unconstrained
  // text for a grammar, one more token than asked...). Their neutral values (null, false, [], "", best_of 1,
  // llama-server's n_predict -1: no limit of its own) pass, so clients that always send their defaults still work.
  static constexpr std::pair<const char*, const char*> kUnsupported[] = {
      {"functions", " (it is deprecated; use 'tools' and 'tool_choice')"},
      {"function_call", " (it is deprecated; use 'tools' and 'tool_choice')"},
      {"best_of", ""},
      {"use_beam_search", ""},
      {"guided_json", "; use 'response_format' (json_object or json_schema) or 'tools'"},
      {"guided_choice", "; use 'response_format' (json_object or json_schema) or 'tools'"},
      {"guided_regex", "; use 'response_format' (json_object or json_schema) or 'tools'"},
      {"guided_grammar", "; use 'response_format' (json_object or json_schema) or 'tools'"},
      {"structured_outputs", "; use 'response_format' (json_object or json_schema) or 'tools'"},
      {"grammar", "; use 'response_format' (json_object or json_schema) or 'tools'"},
      {"json_schema", "; use 'response_format': {\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}"},
      {"n_predict", "; use 'max_tokens'"},
      {"include_stop_str_in_output", ""},
      {"prompt_logprobs", "; /v1/completions gives the prompt's logprobs with 'echo' and 'logprobs'"},
      {"bad_words", "; use 'logit_bias' with -100 for their tokens"},
      {"truncate_prompt_tokens", ""},
  };
  for (const auto& [name, instead] : kUnsupported) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;
    if (it->is_array() && it->empty()) continue;
    if (it->is_string() && it->get_ref<const std::string&>().empty()) continue;  // (json::empty() is false for "")
    if (std::string_view(name) == "best_of" && *it == 1) continue;
    if (std::string_view(name) == "n_predict" && *it == -1) continue;
    return bad_request(std::string("'") + name + "' is not supported by colibri-server" + instead + ".", name,
                       "unsupported_parameter");
  }
  return std::nullopt;
}

sdk::Expected<std::string> render_chat(const chat::Template& chat_template, const ordered_json& messages,
                                       const chat::RenderOptions& options) {
  // The variants, most faithful first: null content as given, then as "" (a template may render "" without error
  // yet drop the calls); each with arguments as objects (keys in the order written), then as the given text. Python
  // prints a null as "None": where the null variant has more of those than the "" one (Llama 3's and GLM's
  // templates print the content of a turn of calls alone), the "" one is the prompt vLLM would give.
  std::optional<sdk::Expected<std::string>> first_error;
  std::optional<std::string> with_null;
  const auto nones = [](const std::string& text) {
    std::size_t n = 0;
    for (std::size_t at = text.find("None"); at != std::string::npos; at = text.find("None", at + 4)) ++n;
    return n;
  };
  for (const bool fill_null : {false, true}) {
    for (const bool object_arguments : {true, false}) {
      ordered_json variant = messages;
      bool changed = false;
      for (auto& m : variant) {
        if (fill_null && m.contains("content") && m["content"].is_null()) {
          m["content"] = "";
          changed = true;
        }
        if (!object_arguments || !m.contains("tool_calls")) continue;
        for (auto& call : m["tool_calls"]) {
          auto& args = call["function"]["arguments"];
          if (!args.is_string()) continue;
          // No arguments at all ("" or spaces) are {}, as vLLM gives them (the templates iterate over them).
          const auto& s = args.get_ref<const std::string&>();
          if (s.find_first_not_of(" \t\r\n") == std::string::npos) {
            args = ordered_json::object();
            continue;
          }
          ordered_json parsed = ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
          if (!parsed.is_discarded() && parsed.is_object()) args = std::move(parsed);
        }
      }
      if (fill_null && !changed) break;
      auto text = chat_template.render(variant, options);
      if (text && !fill_null) {
        if (nones(*text) == 0) return text;
        with_null = std::move(*text);
        break;  // then the "" variants
      }
      if (text) return with_null && nones(*with_null) <= nones(*text) ? *with_null : *text;
      if (!first_error) first_error = std::move(text);
    }
    if (fill_null && with_null) return *with_null;  // no "" variant rendered
  }
  if (with_null) return *with_null;  // no null content to fill
  return std::move(*first_error);
}

std::optional<ApiError> parse_tokenize_request(std::string_view body_text, TokenizeRequest& out) {
  out = TokenizeRequest{};
  json body;
  if (auto e = parse_object(body_text, body)) return e;
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return wrong_type("model", "a string", *m);
    out.model = m->get<std::string>();
  }
  // One text to count: with two, which one was counted would be a guess the client cannot see.
  const auto given_field = [&](const char* field) { return body.contains(field) && !body[field].is_null(); };
  int given = 0;
  for (const char* field : {"messages", "prompt", "content"}) given += given_field(field) ? 1 : 0;
  if (given > 1) {
    return bad_request("Give one of 'messages', 'prompt' or 'content', not several.",
                       body.contains("messages") ? "messages" : "prompt", "invalid_value");
  }
  if (given_field("messages")) {
    out.chat = true;
    // The chat fields are read as a chat completion's are (same checks, same messages), with the key order the
    // client wrote: the template prints tools with tojson, so a sorted copy would be another prompt.
    ordered_json chat = parse_body<ordered_json>(body_text);
    chat["model"] = out.model;
    chat.erase("add_generation_prompt");
    chat.erase("add_special_tokens");
    chat.erase("add_special");
    if (auto e = parse_completion_request(chat.dump(), Endpoint::chat, out.chat_request)) return e;
    if (auto g = body.find("add_generation_prompt"); g != body.end() && !g->is_null()) {
      if (!g->is_boolean()) return wrong_type("add_generation_prompt", "a boolean", *g);
      out.add_generation_prompt = g->get<bool>();
    }
    return std::nullopt;
  }
  const char* name = given_field("prompt") ? "prompt" : "content";
  auto text = body.find(name);
  if (text == body.end() || text->is_null()) {
    return bad_request("Missing required parameter: 'prompt' (or 'content', or 'messages').", "prompt",
                       "missing_required_parameter");
  }
  if (!text->is_string()) return wrong_type(name, "a string", *text);
  out.text = text->get<std::string>();
  out.add_special = given_field("prompt");  // the defaults of vLLM's spelling and of llama.cpp's ("content")
  for (const char* flag : {"add_special_tokens", "add_special"}) {
    if (auto f = body.find(flag); f != body.end() && !f->is_null()) {
      if (!f->is_boolean()) return wrong_type(flag, "a boolean", *f);
      out.add_special = f->get<bool>();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_detokenize_request(std::string_view body_text, std::string& model,
                                                 std::vector<std::int32_t>& tokens) {
  json body;
  if (auto e = parse_object(body_text, body)) return e;
  if (auto m = body.find("model"); m != body.end() && !m->is_null()) {
    if (!m->is_string()) return wrong_type("model", "a string", *m);
    model = m->get<std::string>();
  }
  auto list = body.find("tokens");
  if (list == body.end()) {
    return missing("tokens");
  }
  if (!list->is_array()) return wrong_type("tokens", "an array of token ids", *list);
  for (std::size_t i = 0; i < list->size(); ++i) {
    const auto& t = (*list)[i];
    if (!is_integer(t)) return wrong_type("tokens[" + std::to_string(i) + "]", "an integer token id", t);
    if (t.is_number_unsigned() ? t.get<std::uint64_t>() > 0x7FFFFFFF : t.get<std::int64_t>() < 0) {
      return out_of_range("tokens[" + std::to_string(i) + "]", "a token id of the model's vocabulary", t);
    }
    tokens.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> check_model(const std::string& requested, const std::string& served) {
  if (requested == served) return std::nullopt;
  return ApiError{
      404, "The model '" + requested + "' does not exist; this server serves '" + served + "' (see GET /v1/models).",
      "invalid_request_error", "model", "model_not_found"};
}

json Usage::to_json() const {
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string openai_finish_reason(std::string_view reason) {
  if (reason == "eos" || reason == "stop") return "stop";
  if (reason == "length" || reason == "context") return "length";
  return std::string(reason);
}

namespace {

json envelope(Endpoint endpoint, const ResponseIds& ids, bool chunk) {
  return json{{"id", ids.id},
              {"object",
               endpoint == Endpoint::chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", ids.created},
              {"model", ids.model},
              {"system_fingerprint", "colibri"}};
}

}  // namespace

json logprobs_object(Endpoint endpoint, const std::vector<engine::TokenLogprob>& tokens, const TokenBytes& bytes_of,
                     std::int64_t& text_offset, std::span<const std::int64_t> known_offsets) {
  // A token may be part of a character: "token" is its text with U+FFFD for that, "bytes" its exact bytes.
  auto entry = [&](std::int32_t id, float logprob, bool chat_top) {
    const std::string bytes = bytes_of(id);
    json e{{"token", tokenizer::utf8::to_valid_lossy(bytes)}, {"logprob", logprob}};
    if (chat_top) {
      json list = json::array();
      for (const unsigned char c : bytes) list.push_back(static_cast<int>(c));
      e["bytes"] = std::move(list);
    }
    return e;
  };
  if (endpoint == Endpoint::chat) {
    json content = json::array();
    for (const auto& t : tokens) {
      json e = entry(t.id, t.logprob, true);
      json top = json::array();
      for (const auto& [id, lp] : t.top) top.push_back(entry(id, lp, true));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto& t = tokens[i];
    json e = entry(t.id, t.logprob, false);
    const std::string text = e["token"].get<std::string>();
    if (i < known_offsets.size()) {
      offsets.push_back(known_offsets[i]);
    } else {
      offsets.push_back(text_offset);
      text_offset += static_cast<std::int64_t>(tokenizer::utf8::code_point_count(text));
    }
    texts.push_back(text);
    if (std::isnan(t.logprob)) {  // the first echoed prompt token: nothing predicts it
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    lps.push_back(t.logprob);
    json top = json::object();
    // Keyed by text: two tokens of one text (byte-fallback pieces that are not UTF-8 alone both read U+FFFD) keep
    // the higher logprob, so the top entry never falls below the token chosen (lm-eval's is_greedy compares them).
    for (const auto& [id, lp] : t.top) {
      const std::string key = tokenizer::utf8::to_valid_lossy(bytes_of(id));
      if (auto it = top.find(key); it == top.end() || it->get<float>() < lp) top[key] = lp;
    }
    // The token itself is always there, as OpenAI and vLLM give it (so up to logprobs + 1 entries; `logprobs: 0`
    // gives the token alone).
    if (auto it = top.find(text); it == top.end() || it->get<float>() < t.logprob) top[text] = t.logprob;
    tops.push_back(std::move(top));
  }
  return json{{"tokens", std::move(texts)},
              {"token_logprobs", std::move(lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

std::vector<std::int64_t> echo_text_offsets(const tokenizer::Tokenizer& tokenizer,
                                            const std::vector<engine::TokenLogprob>& prompt, std::string_view text) {
  const auto text_chars = static_cast<std::int64_t>(tokenizer::utf8::code_point_count(text));
  tokenizer::StreamDecoder decoder(tokenizer, /*skip_special=*/true);
  std::vector<std::int64_t> out;
  std::int64_t at = 0;
  std::size_t byte_at = 0;  // the same place in bytes of `text`
  for (const auto& t : prompt) {
    out.push_back(std::min(at, text_chars));
    std::string piece = decoder.push(t.id);
    // A special token the prompt spells out ("Hi<|im_end|>there") is in the text, one added by the tokenizer (BOS)
    // is not: it takes its width where the text holds its content right here.
    if (piece.empty() && tokenizer.is_special(t.id)) {
      const std::string content = tokenizer.decode(std::span<const tokenizer::TokenId>(&t.id, 1));
      if (!content.empty() && byte_at <= text.size() && text.substr(byte_at).starts_with(content)) piece = content;
    }
    at += static_cast<std::int64_t>(tokenizer::utf8::code_point_count(piece));
    byte_at += piece.size();
  }
  return out;
}

json completion_response(Endpoint endpoint, const ResponseIds& ids, const std::vector<Choice>& choices,
                         const Usage& usage) {
  json r = envelope(endpoint, ids, false);
  r["choices"] = json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json choice{{"index", i}, {"logprobs", c.logprobs}, {"finish_reason", c.finish_reason}};
    if (endpoint == Endpoint::chat) {
      const bool no_content = !c.tool_calls.empty() && c.text.empty();
      choice["message"] =
          json{{"role", "assistant"}, {"content", no_content ? json(nullptr) : json(c.text)}, {"refusal", nullptr}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        json calls = json::array();
        for (const auto& call : c.tool_calls) calls.push_back(call.to_json());
        choice["message"]["tool_calls"] = std::move(calls);
      }
    } else {
      choice["text"] = c.text;
    }
    r["choices"].push_back(std::move(choice));
  }
  r["usage"] = usage.to_json();
  return r;
}

json completion_response(Endpoint endpoint, const ResponseIds& ids, const std::string& text,
                         const std::string& finish_reason, const Usage& usage, const json& logprobs) {
  return completion_response(endpoint, ids, std::vector<Choice>{{text, finish_reason, logprobs, {}}}, usage);
}

json stream_chunk(Endpoint endpoint, const ResponseIds& ids, const std::string& text, const std::string& finish_reason,
                  bool role_chunk, const json& logprobs, int index) {
  json r = envelope(endpoint, ids, true);
  json choice{{"index", index}, {"logprobs", logprobs}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (endpoint == Endpoint::chat) {
    json delta = json::object();
    if (role_chunk) {
      delta["role"] = "assistant";
      delta["content"] = "";
    } else if (!text.empty()) {
      delta["content"] = text;
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  r["choices"] = json::array({choice});
  return r;
}

namespace {

// A chat chunk of choice `index` carrying `delta`, not finishing it.
json delta_chunk(const ResponseIds& ids, int index, json delta) {
  json r = envelope(Endpoint::chat, ids, true);
  r["choices"] = json::array(
      {json{{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}, {"delta", std::move(delta)}}});
  return r;
}

}  // namespace

json reasoning_chunk(const ResponseIds& ids, int index, const std::string& reasoning) {
  return delta_chunk(ids, index, json{{"reasoning_content", reasoning}});
}

json tool_call_chunk(const ResponseIds& ids, int index, int call_index, const ToolCall* call,
                     const std::string& arguments) {
  json piece{{"index", call_index}};
  if (call != nullptr) {
    piece["id"] = call->id;
    piece["type"] = "function";
    piece["function"] = json{{"name", call->name}, {"arguments", arguments}};
  } else {
    piece["function"] = json{{"arguments", arguments}};
  }
  return delta_chunk(ids, index, json{{"tool_calls", json::array({piece})}});
}

json usage_chunk(Endpoint endpoint, const ResponseIds& ids, const Usage& usage) {
  json r = envelope(endpoint, ids, true);
  r["choices"] = json::array();
  r["usage"] = usage.to_json();
  return r;
}

std::string sse_event(const json& data) {
  // Invalid UTF-8 in generated text (a token split mid-character never reaches here, but be safe) becomes U+FFFD.
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace colibri::server
