#include "colibri/chat/template.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <sstream>

#include "chat/jinja.hpp"
#include "colibri/sdk/config.hpp"
#include "colibri/sdk/os_error.hpp"

namespace colibri::chat {

using jinja::Value;

struct Template::Program {
  jinja::Program program;
  std::string name;
};

namespace {

// Request JSON nested deeper than this is refused (the conversion recurses; templates need a few levels).
constexpr int kMaxInputDepth = 128;

Value to_value(const nlohmann::ordered_json& j, const char* what, int depth = 0) {
  if (depth > kMaxInputDepth) {
    throw jinja::Error{0, std::string(what) + " is nested too deeply (limit " + std::to_string(kMaxInputDepth) + ")"};
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::null();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<std::int64_t>(u));
    }
    // 2.0 stays a float, as Python's json.loads reads it (a template prints it as 2.0).
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::Array a;
      for (const auto& e : j) a.push_back(to_value(e, what, depth + 1));
      return Value::array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value o = Value::object();
      // JSON keys are unique: append rather than Object::set's linear search (quadratic on huge objects).
      for (auto it = j.begin(); it != j.end(); ++it) {
        Value v = to_value(it.value(), what, depth + 1);
        o.obj->depth = std::max(o.obj->depth, v.nesting() + 1);
        o.obj->items.emplace_back(it.key(), std::move(v));
      }
      return o;
    }
    default: return Value::undefined();
  }
}

void install_globals(jinja::Env& env) {
  env.set("true", Value::boolean(true));
  env.set("false", Value::boolean(false));
  env.set("none", Value::null());
  env.set("True", Value::boolean(true));
  env.set("False", Value::boolean(false));
  env.set("None", Value::null());
  env.set("raise_exception", Value::function([](std::vector<Value>& args, jinja::Env&) -> Value {
            std::string message = "raise_exception()";
            if (!args.empty() && args[0].is(Value::Kind::string)) message = args[0].s;
            throw jinja::Error{0, "template raised an exception: " + message};
          }));
  env.set("namespace", Value::function([](std::vector<Value>& args, jinja::Env&) {
            Value ns = jinja::make_namespace();
            for (const auto& a : args) {
              if (a.is(Value::Kind::kwargs) || a.is(Value::Kind::object)) {
                for (const auto& [k, v] : a.obj->items) {
                  jinja::charge(ns.obj->items.size());  // set() searches linearly
                  ns.obj->set(k, v);
                }
              } else {
                throw jinja::Error{0, "namespace() takes a dict or keyword arguments"};
              }
            }
            return ns;
          }));
  env.set("dict", Value::function([](std::vector<Value>& args, jinja::Env&) {
            Value d = Value::object();
            for (const auto& a : args) {
              if (!a.is(Value::Kind::kwargs) && !a.is(Value::Kind::object)) {
                throw jinja::Error{0, "dict() takes a dict or keyword arguments"};
              }
              for (const auto& [k, v] : a.obj->items) {
                jinja::charge(d.obj->items.size());  // set() searches linearly
                d.obj->set(k, v);
              }
            }
            return d;
          }));
  env.set("range", Value::function([](std::vector<Value>& args, jinja::Env&) {
            std::int64_t start = 0, stop = 0, step = 1;
            for (const auto& a : args) {
              if (!a.is(Value::Kind::integer)) throw jinja::Error{0, "range() takes integers"};
            }
            if (args.size() == 1) {
              stop = args[0].i;
            } else if (args.size() >= 2) {
              start = args[0].i;
              stop = args[1].i;
              if (args.size() > 2) step = args[2].i;
            } else {
              throw jinja::Error{0, "range() needs 1 to 3 arguments"};
            }
            if (step == 0) throw jinja::Error{0, "range() step must not be zero"};
            jinja::Array out;
            for (std::int64_t k = start; step > 0 ? k < stop : k > stop;) {
              if (out.size() >= jinja::kMaxItems) {
                throw jinja::Error{0, "range() is too large (limit " + std::to_string(jinja::kMaxItems) + " items)"};
              }
              out.push_back(Value::integer(k));
              if (__builtin_add_overflow(k, step, &k)) break;  // the next value would be past stop anyway
            }
            return Value::array(std::move(out));
          }));
  env.set("strftime_now", Value::function([](std::vector<Value>& args, jinja::Env&) {
            if (args.empty() || !args[0].is(Value::Kind::string))
              throw jinja::Error{0, "strftime_now() needs a format"};
            const std::time_t now = std::time(nullptr);
            std::tm tm{};
            localtime_r(&now, &tm);
            char buf[256];
            const std::size_t n = std::strftime(buf, sizeof buf, args[0].s.c_str(), &tm);
            return Value::string(std::string(buf, n));
          }));
}

std::string line_prefix(const std::string& name, int line) {
  return line > 0 ? name + " line " + std::to_string(line) + ": " : name + ": ";
}

}  // namespace

sdk::Expected<Template> Template::parse(std::string_view source, std::string_view name) {
  auto program = std::make_shared<Program>();
  program->name = std::string(name);
  try {
    program->program = jinja::parse(source);
  } catch (const jinja::Error& e) {
    return sdk::make_error(sdk::StatusCode::unsupported, line_prefix(program->name, e.line) + e.message);
  } catch (const std::exception& e) {  // a bug in the parser: an error for this template, not a crash
    return sdk::make_error(sdk::StatusCode::internal, program->name + ": internal error while parsing (" + e.what() +
                                                          "); please report it with the template");
  }
  return Template(std::move(program));
}

sdk::Expected<std::string> Template::render(const nlohmann::ordered_json& messages,
                                            const RenderOptions& options) const {
  if (!messages.is_array()) {
    return sdk::make_error(sdk::StatusCode::invalid_argument, "messages must be a JSON array of {role, content}");
  }
  jinja::Env env;
  install_globals(env);
  try {
    env.set("messages", to_value(messages, "messages"));
    env.set("add_generation_prompt", Value::boolean(options.add_generation_prompt));
    env.set("bos_token", Value::string(options.bos_token));
    env.set("eos_token", Value::string(options.eos_token));
    // As apply_chat_template: tools and documents are always defined, none when not given.
    env.set("tools", options.tools.is_null() ? Value::null() : to_value(options.tools, "tools"));
    env.set("documents", Value::null());
    if (options.extra.is_object()) {
      for (auto it = options.extra.begin(); it != options.extra.end(); ++it) {
        env.set(it.key(), to_value(it.value(), it.key().c_str()));
      }
    }
    return jinja::render(program_->program, env);
  } catch (const jinja::Error& e) {
    return sdk::make_error(sdk::StatusCode::invalid_argument, line_prefix(program_->name, e.line) + e.message);
  } catch (const std::bad_alloc&) {
    return sdk::make_error(sdk::StatusCode::invalid_argument, program_->name + ": out of memory while rendering");
  } catch (const std::exception& e) {  // a bug in the interpreter: an error for this render, not a dropped request
    return sdk::make_error(sdk::StatusCode::internal, program_->name + ": internal error while rendering (" + e.what() +
                                                          "); please report it with the template");
  }
}

namespace {

std::optional<std::string> token_content(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

std::string family_for_architecture(std::string_view architecture) {
  if (architecture == "mixtral" || architecture == "mistral") return "mistral";
  if (architecture == "qwen2_moe" || architecture == "qwen3_moe") return "chatml";
  if (architecture == "gpt_oss") return "gpt-oss";
  return "";
}

sdk::Expected<ChatConfig> load_chat_config(const std::filesystem::path& tokenizer_config, std::string_view family) {
  // The config may be a path the user gave (`template --tokenizer-config <(...)`), so a pipe; a directory is no
  // config. chat_template.jinja is found beside it, so only a regular file: a FIFO there would block the read.
  const auto jinja = tokenizer_config.parent_path() / "chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::is_directory(tokenizer_config, ec)) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           tokenizer_config.string() + " is a directory; give the file");
  }
  if (std::filesystem::exists(jinja, ec) && !std::filesystem::is_regular_file(jinja, ec)) {
    return sdk::make_error(
        sdk::StatusCode::invalid_argument,
        jinja.string() + " is " + sdk::path_kind_text(jinja.string()) + ", not a file; put the file back");
  }
  std::ifstream in(tokenizer_config, std::ios::binary);
  if (!in) return sdk::make_error(sdk::StatusCode::not_found, "cannot open " + tokenizer_config.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(ss.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return sdk::make_error(sdk::StatusCode::corrupt_data, tokenizer_config.string() + ": not a JSON object");
  }
  ChatConfig out;
  out.bos_token = token_content(config, "bos_token").value_or("");
  out.eos_token = token_content(config, "eos_token").value_or("");
  if (std::ifstream file(jinja, std::ios::binary); file) {
    std::ostringstream text;
    text << file.rdbuf();
    out.template_source = text.str();
    out.template_origin = "chat_template.jinja";
    return out;
  }
  if (auto t = config.find("chat_template"); t != config.end() && !t->is_null()) {
    if (t->is_string()) {
      out.template_source = t->get<std::string>();
    } else if (t->is_array()) {
      for (const auto& e : *t) {
        if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
        if (e.value("name", "") == "default") out.template_source = e["template"].get<std::string>();
        if (e.value("name", "") == "tool_use") out.tool_use_source = e["template"].get<std::string>();
      }
      if (out.template_source.empty()) {
        return sdk::make_error(sdk::StatusCode::corrupt_data,
                               tokenizer_config.string() + ": key 'chat_template': no entry named \"default\"");
      }
    } else {
      return sdk::make_error(sdk::StatusCode::corrupt_data,
                             tokenizer_config.string() + ": key 'chat_template': expected a string or a list");
    }
    out.template_origin = "tokenizer_config.json";
    return out;
  }
  std::string fam(family);
  if (fam.empty()) {
    if (out.bos_token == "<|startoftext|>" || out.eos_token == "<|return|>") {
      fam = "gpt-oss";
    } else if (out.bos_token == "<s>") {
      fam = "llama2";
    } else if (out.eos_token == "<|im_end|>") {
      fam = "chatml";
    }
  }
  auto builtin = builtin_template(fam);
  if (!builtin) {
    return sdk::make_error(sdk::StatusCode::not_found,
                           tokenizer_config.string() + " has no chat_template and no built-in template is known for " +
                               (fam.empty() ? std::string("this model") : "family '" + fam + "'") +
                               "; name one of llama2, mistral, gpt-oss, chatml");
  }
  out.template_source = std::string(*builtin);
  out.template_origin = "built-in " + fam;
  return out;
}

sdk::Expected<ChatConfig> chat_config_override(const std::string& name_or_file) {
  ChatConfig out;
  out.template_origin = name_or_file;
  if (auto b = builtin_template(name_or_file)) {
    out.template_source = std::string(*b);
    out.template_origin = "built-in " + name_or_file;
    return out;
  }
  std::error_code ec;
  std::ifstream in(name_or_file, std::ios::binary);
  if (!in || std::filesystem::is_directory(name_or_file, ec)) {
    const std::vector<std::string> builtins{"llama2", "mistral", "gpt-oss", "chatml"};
    const auto near = sdk::closest_match(name_or_file, builtins);
    return sdk::make_error(sdk::StatusCode::not_found,
                           "--chat-template " + name_or_file +
                               " is neither a built-in (llama2, mistral, gpt-oss, chatml) nor a readable file" +
                               (near.empty() ? "" : " (did you mean " + near + "?)"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  out.template_source = text.str();
  // Every chat template renders the conversation from `messages`; a file that never names it (a wrong file, a
  // prompt written out by hand) would drop what the user wrote without a word.
  if (out.template_source.find("messages") == std::string::npos) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           "--chat-template " + name_or_file +
                               " never reads `messages`, so the conversation would be left out of the prompt; give "
                               "a Jinja chat template (as in tokenizer_config.json's chat_template) or a built-in");
  }
  return out;
}

std::vector<std::int64_t> parting_positions(
    const nlohmann::ordered_json& messages, std::span<const std::int32_t> prompt,
    const std::function<std::optional<std::vector<std::int32_t>>(std::size_t)>& prefix) {
  std::vector<std::int64_t> out;
  if (!messages.is_array()) return out;
  std::vector<std::size_t> cuts = {messages.size()};  // the generation prompt's start
  std::optional<std::size_t> first_user, last_user;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || m["role"] != "user") continue;
    if (!first_user) first_user = i;
    last_user = i;
  }
  for (const auto at : {first_user, last_user}) {
    if (at && *at > 0 && cuts.back() != *at) cuts.push_back(*at);  // one user message: rendered once
  }
  for (const auto n : cuts) {
    const auto tokens = prefix(n);
    if (!tokens) continue;
    const auto shared =
        std::mismatch(tokens->begin(), tokens->end(), prompt.begin(), prompt.end()).first - tokens->begin();
    if (shared > 0 && shared < static_cast<std::ptrdiff_t>(prompt.size())) out.push_back(shared);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace colibri::chat
