// Chat templates: renders the Jinja `chat_template` of tokenizer_config.json into a prompt string.
//
// No C++ Jinja library exists in Debian, so colibri carries a small interpreter of the Jinja subset chat templates
// use (statements if/elif/else, for (with loop.*, else, inline if-filter, tuple targets, recursive), set (plain,
// tuple, namespace attribute, block with filters), macro (varargs/kwargs), call, filter, raw, break/continue;
// expressions with filters, tests, slices, method calls). Its behaviour is Python Jinja2's as transformers'
// apply_chat_template sets it up (tests/reference/template_reference.py is the reference): True/None/[1, 'a'] print
// as Python prints them, == never converts between types, reading from an undefined value is an error. Anything
// outside the subset fails with the construct and line.
// Templates come with model files, so they are untrusted: too deep nesting or recursion, integer overflow (integers
// are 64-bit), division by zero (an error as in Python, not JavaScript's Infinity), oversized output (16 MiB) and a
// render that exceeds its step budget all fail with an error naming the line, never a crash or a hang.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colibri/sdk/status.hpp"

namespace colibri::chat {

struct RenderOptions {
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  // Tool definitions; null gives the template `tools` = none (as transformers' apply_chat_template does).
  nlohmann::ordered_json tools = nullptr;
  // More variables (e.g. {"enable_thinking": false}); keys here override the ones above.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class Template {
 public:
  // Parses a template; errors name the line and the construct ("line 3: unsupported statement 'include'").
  static sdk::Expected<Template> parse(std::string_view source, std::string_view name = "chat_template");

  // `messages` is a JSON array of {role, content, ...}. Key order is kept (it shows in tojson output).
  // A template's raise_exception() comes back as an invalid_argument error carrying its message.
  [[nodiscard]] sdk::Expected<std::string> render(const nlohmann::ordered_json& messages,
                                                  const RenderOptions& options) const;

  struct Program;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

// Built-in templates for model families that ship none: "llama2", "mistral" (Mistral/Mixtral instruct v0.1),
// "gpt-oss" (a plain harmony format: no tools, no reasoning channels), "chatml".
std::optional<std::string_view> builtin_template(std::string_view family);

// The built-in family for a model of this architecture that ships no template ("" when none fits it better than a
// guess from its special tokens): what `chat` and the server both use.
std::string family_for_architecture(std::string_view architecture);

// Where a later prompt is likely to part from this chat's (`prompt`: its messages rendered with the generation
// prompt, as tokens): where the generation prompt starts (a next turn's history drops the reply's reasoning), where
// the last user message starts (the user edits it) and where the first one does (another conversation with the same
// system prompt); a KV cache keeps checkpoints there. prefix(n) gives the tokens of the first n messages rendered
// without the generation prompt (nullopt where that fails); each position is how many of those tokens `prompt`
// starts with, kept where it is in (0, prompt.size()). Ascending, without repeats.
std::vector<std::int64_t> parting_positions(
    const nlohmann::ordered_json& messages, std::span<const std::int32_t> prompt,
    const std::function<std::optional<std::vector<std::int32_t>>(std::size_t)>& prefix);

// What tokenizer_config.json says about chat formatting.
struct ChatConfig {
  std::string template_source;
  std::string template_origin;  // "tokenizer_config.json" or "built-in <family>"
  // A list of named templates may hold a "tool_use" one, which transformers renders instead of "default" when the
  // request has tools (Hermes 2 Pro, Command R+); empty when there is none.
  std::string tool_use_source;
  std::string bos_token;
  std::string eos_token;
};

// Reads tokenizer_config.json: chat_template (a string, or a list of {name, template} where "default" is used, and
// "tool_use" kept for requests with tools),
// bos_token / eos_token (strings or AddedToken objects). A chat_template.jinja next to it (where transformers now
// saves the template, and the only place gpt-oss ships it) wins. Without either, the built-in template of
// `family` is used; an empty family is guessed from the special tokens ("<|startoftext|>"/"<|return|>" -> gpt-oss,
// "<s>" -> llama2, "<|im_end|>" -> chatml).
sdk::Expected<ChatConfig> load_chat_config(const std::filesystem::path& tokenizer_config, std::string_view family = "");

// A template the user names instead of the model's (--chat-template): a built-in family, or a Jinja file. Its
// origin is what was named; bos/eos are left empty (the tokenizer's are used).
sdk::Expected<ChatConfig> chat_config_override(const std::string& name_or_file);

}  // namespace colibri::chat
