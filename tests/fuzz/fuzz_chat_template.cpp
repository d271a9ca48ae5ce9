// A chat template from a model's tokenizer_config.json (untrusted): parse, then render a short chat with tools.
// Input: the template source, then after a 0 byte the messages as JSON (a fixed chat when that is not an array).
#include <nlohmann/json.hpp>

#include "colibri/chat/template.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  fuzz::Input in(data, size);
  const std::string_view source = in.until(std::string_view("\0", 1));
  auto tmpl = chat::Template::parse(source);
  if (!tmpl) return 0;
  auto messages = nlohmann::ordered_json::parse(in.rest(), nullptr, /*allow_exceptions=*/false);
  if (!messages.is_array()) {
    messages = nlohmann::ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
        {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
      {"role": "tool", "content": "4"}, {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}])");
  }
  chat::RenderOptions options;
  options.add_generation_prompt = true;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "add",
    "description": "Adds", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])");
  options.extra = {{"enable_thinking", false}};
  (void)tmpl->render(messages, options);
  return 0;
}
