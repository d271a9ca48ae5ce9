#include "colibri/server/chat_output.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "server/json_brackets.hpp"

namespace colibri::server {

using nlohmann::json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kDeepseekCallsOpen = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepseekCallsClose = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepseekCallOpen = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepseekCallClose = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepseekSep = "<｜tool▁sep｜>";

std::string_view opening_marker(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes: return kHermesOpen;
    case ToolFormat::mistral: return kMistralOpen;
    case ToolFormat::deepseek_v3: return kDeepseekCallsOpen;
    case ToolFormat::harmony:  // HarmonyStream reads its calls
    case ToolFormat::none: break;
  }
  return {};
}

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

// Arguments as OpenAI sends them: a JSON text. An object is written compactly; a string that holds JSON is taken
// as that text; missing arguments are an empty object.
std::optional<std::string> arguments_text(const json* arguments) {
  if (arguments == nullptr || arguments->is_null()) return std::string("{}");
  if (arguments->is_object()) return arguments->dump(-1, ' ', false, json::error_handler_t::replace);
  if (arguments->is_string()) {
    const auto& s = arguments->get_ref<const std::string&>();
    if (json::accept(s)) return s;
  }
  return std::nullopt;
}

// {"name": ..., "arguments": {...}} (some models write "parameters").
std::optional<ToolCall> call_from_object(const json& object) {
  if (!object.is_object()) return std::nullopt;
  auto name = object.find("name");
  if (name == object.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  auto args = object.find("arguments");
  if (args == object.end()) args = object.find("parameters");
  auto text = arguments_text(args == object.end() ? nullptr : &*args);
  if (!text) return std::nullopt;
  return ToolCall{"", name->get<std::string>(), std::move(*text)};
}

// Each parser starts at the opening marker and returns the calls and where they end, or nullopt.
using Calls = std::optional<std::pair<std::vector<ToolCall>, std::size_t>>;

// Hermes and Mistral: the marker, then a JSON call object (Mistral: an array of them), repeated; Hermes closes each
// with </tool_call>, which the end token may cut off.
Calls parse_marked_json(std::string_view text, std::size_t pos, std::string_view open, std::string_view close) {
  std::vector<ToolCall> calls;
  while (text.substr(pos).starts_with(open)) {
    pos += open.size();
    auto value = json_value_at(text, pos);
    if (!value) return std::nullopt;
    const json list = value->is_array() ? *value : json::array({*value});
    if (list.empty()) return std::nullopt;
    for (const auto& object : list) {
      auto call = call_from_object(object);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    pos = skip_space(text, pos);
    if (!close.empty() && text.substr(pos).starts_with(close)) pos += close.size();
    if (const std::size_t next = skip_space(text, pos); text.substr(next).starts_with(open)) pos = next;
  }
  return std::make_pair(std::move(calls), pos);
}

Calls parse_deepseek(std::string_view text, std::size_t pos) {
  pos += kDeepseekCallsOpen.size();
  std::vector<ToolCall> calls;
  for (;;) {
    pos = skip_space(text, pos);
    if (!text.substr(pos).starts_with(kDeepseekCallOpen)) break;
    pos += kDeepseekCallOpen.size();
    const std::size_t sep = text.find(kDeepseekSep, pos);
    if (sep == std::string_view::npos) return std::nullopt;
    pos = sep + kDeepseekSep.size();
    const std::size_t line_end = text.find('\n', pos);
    if (line_end == std::string_view::npos) return std::nullopt;
    ToolCall call{"", std::string(trim_right(text.substr(pos, line_end - pos))), ""};
    pos = skip_space(text, line_end);
    if (call.name.empty() || !text.substr(pos).starts_with("```")) return std::nullopt;
    pos += 3;
    if (text.substr(pos).starts_with("json")) pos += 4;
    auto args = json_value_at(text, pos);
    if (!args || !args->is_object()) return std::nullopt;
    call.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    pos = skip_space(text, pos);
    if (text.substr(pos).starts_with("```")) pos += 3;
    pos = skip_space(text, pos);
    if (text.substr(pos).starts_with(kDeepseekCallClose)) pos += kDeepseekCallClose.size();
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return std::nullopt;
  if (text.substr(pos).starts_with(kDeepseekCallsClose)) pos += kDeepseekCallsClose.size();
  return std::make_pair(std::move(calls), pos);
}

}  // namespace

ToolFormat detect_tool_format(std::string_view source) {
  if (template_is_harmony(source)) return ToolFormat::harmony;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolFormat::hermes;
  if (source.find(kMistralOpen) != std::string_view::npos) return ToolFormat::mistral;
  if (source.find(kDeepseekCallsOpen) != std::string_view::npos) return ToolFormat::deepseek_v3;
  return ToolFormat::none;
}

std::string_view tool_format_name(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes: return "hermes";
    case ToolFormat::mistral: return "mistral";
    case ToolFormat::deepseek_v3: return "deepseek_v3";
    case ToolFormat::harmony: return "harmony";
    case ToolFormat::none: break;
  }
  return "none";
}

bool template_reads_tools(std::string_view source) {
  for (std::size_t at = source.find("tools"); at != std::string_view::npos; at = source.find("tools", at + 1)) {
    const bool starts = at == 0 || !is_identifier_char(source[at - 1]);
    const bool ends = at + 5 >= source.size() || !is_identifier_char(source[at + 5]);
    if (starts && ends) return true;
  }
  return false;
}

bool tool_marker_is_special(ToolFormat format) {
  // [TOOL_CALLS] and harmony's markers are control tokens; the others decode as text.
  return format == ToolFormat::mistral || format == ToolFormat::harmony;
}

std::string forced_call_prefix(ToolFormat format, std::string_view function_name) {
  const std::string name = json(std::string(function_name)).dump();
  switch (format) {
    case ToolFormat::hermes: return std::string(kHermesOpen) + "\n{\"name\": " + name + ", \"arguments\": ";
    case ToolFormat::mistral: return std::string(kMistralOpen) + "[{\"name\": " + name + ", \"arguments\": ";
    case ToolFormat::deepseek_v3:
      return std::string(kDeepseekCallsOpen) + std::string(kDeepseekCallOpen) + "function" + std::string(kDeepseekSep) +
             std::string(function_name) + "\n```json\n";
    case ToolFormat::harmony:  // after the template's "<|start|>assistant"
      return "<|channel|>commentary to=functions." + std::string(function_name) + " <|constrain|>json<|message|>";
    case ToolFormat::none: break;
  }
  return {};
}

std::string required_call_prefix(ToolFormat format) {
  switch (format) {
    case ToolFormat::hermes: return std::string(kHermesOpen) + "\n";
    case ToolFormat::mistral: return std::string(kMistralOpen) + "[";
    case ToolFormat::deepseek_v3:
    case ToolFormat::harmony:
    case ToolFormat::none: break;
  }
  return {};
}

json required_call_schema(const std::vector<std::string>& names) {
  return json{{"type", "object"},
              {"properties", {{"name", {{"enum", names}}}, {"arguments", {{"type", "object"}}}}},
              {"required", {"name", "arguments"}}};
}

std::optional<ToolCall> call_from_json_text(std::string_view text) {
  const json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return std::nullopt;
  return call_from_object(object);
}

json ToolCall::to_json() const {
  return json{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

std::string tool_call_id(ToolFormat format, std::uint64_t random) {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string id = format == ToolFormat::mistral ? "" : "call_";
  for (int i = 0; i < 9; ++i) {  // 62^9 > 2^53: collisions within a conversation are not a concern
    id += kAlphabet[random % 62];
    random /= 62;
  }
  return id;
}

ToolParse parse_tool_calls(ToolFormat format, std::string_view text) {
  const std::string_view marker = opening_marker(format);
  const std::size_t at = marker.empty() ? std::string_view::npos : text.find(marker);
  if (at == std::string_view::npos) return ToolParse{std::string(text), {}};
  Calls calls = format == ToolFormat::hermes    ? parse_marked_json(text, at, kHermesOpen, kHermesClose)
                : format == ToolFormat::mistral ? parse_marked_json(text, at, kMistralOpen, "")
                                                : parse_deepseek(text, at);
  if (!calls) return ToolParse{std::string(text), {}};
  ToolParse out{std::string(trim_right(text.substr(0, at))), std::move(calls->first)};
  // Text after the calls is kept, so that nothing the model wrote is lost.
  if (const std::string_view rest = text.substr(skip_space(text, calls->second)); !trim_right(rest).empty()) {
    out.content += (out.content.empty() ? "" : "\n") + std::string(trim_right(rest));
  }
  return out;
}

std::string ToolCallStream::push(std::string_view text) {
  held_ += text;
  const std::string_view marker = opening_marker(format_);
  if (in_calls_ || marker.empty()) {
    if (marker.empty()) return std::exchange(held_, {});
    return {};
  }
  std::size_t keep = marker_tail(held_, marker);
  if (const std::size_t at = held_.find(marker); at != std::string::npos) {
    in_calls_ = true;
    keep = held_.size() - at;
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ToolParse ToolCallStream::finish() {
  if (!in_calls_) return ToolParse{std::exchange(held_, {}), {}};
  ToolParse parsed = parse_tool_calls(format_, held_);
  held_.clear();
  return parsed;
}

bool template_has_reasoning(std::string_view source) {
  return source.find(kThinkOpen) != std::string_view::npos && source.find(kThinkClose) != std::string_view::npos;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  return trim_right(prompt).ends_with(kThinkOpen);
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
        if (rest.empty() || kThinkOpen.starts_with(rest)) return out;
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
        state_ = State::content;
        continue;
      }
      case State::content: out.content += std::exchange(held_, {}); return out;
    }
  }
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  if (state_ == State::reasoning) {
    out.reasoning = std::exchange(held_, {});
  } else if (state_ != State::after) {
    out.content = std::exchange(held_, {});  // start: a lone prefix of "<think>" (or spaces) is content
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

HarmonyStream::HarmonyStream(std::string_view prompt, bool tools) : tools_(tools) {
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
  call_name_.clear();
  call_arguments_.clear();
  if (!role.empty() && role != "assistant") {
    sink_ = Sink::reasoning;  // a turn the model wrote for someone else (a tool's answer it imagined)
  } else if (!recipient.empty()) {
    const bool function = recipient.starts_with(kFunctions) && recipient.size() > kFunctions.size();
    sink_ = function && tools_ ? Sink::call : Sink::reasoning;
    if (sink_ == Sink::call) call_name_ = std::string(recipient.substr(kFunctions.size()));
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
    case Sink::call: call_arguments_ += text; break;
  }
}

void HarmonyStream::end_message(HarmonyOutput& out) {
  if (sink_ == Sink::call) {
    const std::size_t begin = skip_space(call_arguments_, 0);
    std::string arguments(trim_right(std::string_view(call_arguments_).substr(begin)));
    out.calls.push_back(ToolCall{"", std::exchange(call_name_, {}), arguments.empty() ? "{}" : std::move(arguments)});
    call_arguments_.clear();
  }
  sink_ = Sink::content;
  state_ = State::header;
}

HarmonyOutput HarmonyStream::push(std::string_view text) {
  held_ += text;
  HarmonyOutput out;
  for (;;) {
    if (state_ == State::header) {
      const std::size_t message = held_.find(kHarmonyMessage);
      // An end, or a new <|start|>, before the <|message|>: what came before it was no header.
      std::optional<std::size_t> restart;
      for (auto f = find_harmony_marker(held_); f && (message == std::string::npos || f->first < message);
           f = find_harmony_marker(held_, f->first + kHarmonyMarkers[f->second].size())) {
        if (f->second < kHarmonyEnds) restart = f->first + kHarmonyMarkers[f->second].size();
        if (kHarmonyMarkers[f->second] == kHarmonyStart && f->first > 0) restart = f->first;
      }
      if (restart) {
        held_.erase(0, *restart);
        prompt_header_.clear();
        role_next_ = false;
        continue;
      }
      if (message != std::string::npos) {
        open_message(prompt_header_ + held_.substr(0, message));
        prompt_header_.clear();
        role_next_ = false;
        held_.erase(0, message + kHarmonyMessage.size());
        state_ = State::body;
        continue;
      }
      const bool header = harmony_header_start(std::string_view(held_).substr(skip_space(held_, 0)), role_next_);
      if (header && held_.size() <= kMaxHarmonyHeader) return out;
      // Text outside the format is content, streamed as it comes; a "header" that never ends, without its markers.
      prompt_header_.clear();
      role_next_ = false;
      sink_ = Sink::content;
      state_ = State::body;
      if (header) {
        out.content += strip_harmony_markers(std::exchange(held_, {}));
        return out;
      }
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
