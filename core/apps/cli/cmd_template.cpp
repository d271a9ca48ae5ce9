// colibri-cli template --tokenizer-config FILE --messages FILE [--add-generation-prompt] [--family NAME]
//   Prints the prompt the model's chat template renders for the messages (a JSON array, or an object with
//   "messages" and optionally "add_generation_prompt", "tools" and other template variables).
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "colibri/chat/template.hpp"
#include "command.hpp"

namespace colibri::cli::template_command {
namespace {

using ojson = nlohmann::ordered_json;

struct TemplateOptions {
  std::string config;
  std::string messages;
  std::string family;
  bool add_generation_prompt = false;
};

int run_template(const TemplateOptions& o) {
  auto config = chat::load_chat_config(o.config, o.family);
  if (!config) {
    // The library names the families; how to pick one here is this command's flag.
    const std::string& m = config.error().message();
    return fail(m.find("name one of") != std::string::npos && o.family.empty() ? m + " with --family" : m);
  }
  std::ifstream in(o.messages, std::ios::binary);
  if (!in) return fail("cannot open " + o.messages);
  std::ostringstream ss;
  ss << in.rdbuf();
  ojson doc;
  try {
    doc = ojson::parse(ss.str());
  } catch (const ojson::exception& e) {  // parse_error, or out_of_range for a number past a double
    return fail(o.messages + ": not valid JSON (" + e.what() + ")");
  }
  chat::RenderOptions options;
  options.bos_token = config->bos_token;
  options.eos_token = config->eos_token;
  options.add_generation_prompt = o.add_generation_prompt;
  ojson messages;
  if (doc.is_array()) {
    messages = doc;
  } else if (doc.is_object() && doc.contains("messages")) {
    messages = doc["messages"];
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() == "messages") continue;
      if (it.key() == "add_generation_prompt") {
        if (!it->is_boolean()) return fail(o.messages + ": key 'add_generation_prompt': expected true or false");
        options.add_generation_prompt = options.add_generation_prompt || it->get<bool>();
      } else if (it.key() == "tools") {
        options.tools = *it;
      } else {
        options.extra[it.key()] = *it;
      }
    }
  } else {
    return fail(o.messages + ": expected a JSON array of messages or an object with \"messages\"");
  }
  if (!messages.is_array()) return fail(o.messages + ": key 'messages': expected an array");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object() || !messages[i].contains("role")) {
      return fail(o.messages + ": messages[" + std::to_string(i) + "]: expected an object with a \"role\"");
    }
  }
  // As transformers: a named list's "tool_use" template renders a conversation with tools.
  const bool tool_use = !options.tools.is_null() && !options.tools.empty() && !config->tool_use_source.empty();
  auto tmpl = chat::Template::parse(tool_use ? config->tool_use_source : config->template_source,
                                    o.config + " (" + config->template_origin + (tool_use ? ", tool_use)" : ")"));
  if (!tmpl) return fail(tmpl.error().message());
  auto out = tmpl->render(messages, options);
  if (!out) return fail(out.error().message());
  std::cout << *out;  // exactly the prompt: no newline is added
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<TemplateOptions>();
  auto* cmd = app.add_subcommand("template", "Render a model's chat template (tokenizer_config.json) for messages");
  cmd->add_option("--tokenizer-config", o->config, "Path to tokenizer_config.json")->required();
  cmd->add_option("--messages", o->messages, "JSON file: an array of messages or {\"messages\": [...], ...}")
      ->required();
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the assistant turn header");
  cmd->add_option("--family", o->family,
                  "Built-in template when the config has none: llama2, mistral, gpt-oss, chatml (default: guessed)");
  cmd->callback([&global, o] { global.exit_code = run_template(*o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(51, setup);

}  // namespace colibri::cli::template_command
