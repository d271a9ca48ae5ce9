// colibri-cli chat --model M: an interactive chat. Reads one user message per stdin line, renders the whole
// conversation with the model's chat template, reuses the KV cache for the common prefix, streams the reply.
// Lines "/reset" (forget the conversation) and "/exit" are commands.
#include <unistd.h>

#include <iostream>
#include <random>

#include "colibri/chat/template.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "engine_cli.hpp"
#include "interrupt.hpp"

namespace colibri::cli {
namespace {

struct ChatOptions {
  EngineCliOptions engine;
  std::string system;
  std::string template_family;
  std::int64_t max_tokens = 512;
  engine::SamplingOptions sampling;
  bool seed_given = false;
};

int run_chat(const GlobalOptions& global, ChatOptions& o) {
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  if (auto s = o.sampling.validate(); !s) return fail(s.message());
  if (!o.template_family.empty() && !chat::builtin_template(o.template_family)) {
    return fail("--template " + o.template_family +
                " is not a built-in template; use llama2, mistral, gpt-oss or chatml");
  }
  auto engine = open_engine(global, o.engine);
  if (!engine) return 1;
  auto tok = tokenizer::Tokenizer::from_file(engine->model_dir());
  if (!tok) return fail(tok.error().message());
  const auto family =
      o.template_family.empty() ? chat::family_for_architecture(engine->hparams().architecture) : o.template_family;
  auto cfg = chat::load_chat_config(engine->model_dir() / "tokenizer_config.json", family);
  if (!cfg && o.template_family.empty()) {
    // No template in the model and none known for its family: a neutral ChatML one still lets it talk.
    cfg = chat::load_chat_config(engine->model_dir() / "tokenizer_config.json", "chatml");
  }
  if (!cfg) return fail(cfg.error().message());
  auto tmpl = chat::Template::parse(cfg->template_source, cfg->template_origin);
  if (!tmpl) return fail(tmpl.error().message());
  chat::RenderOptions ropt;
  ropt.add_generation_prompt = true;
  ropt.bos_token = cfg->bos_token.empty() ? tok->bos_token() : cfg->bos_token;
  ropt.eos_token = cfg->eos_token.empty() ? tok->eos_token() : cfg->eos_token;

  const bool tty = ::isatty(STDIN_FILENO) != 0;
  std::cerr << "chat with " << engine->model_dir().filename().string() << " (template: " << cfg->template_origin
            << "); /reset forgets the conversation, /exit or end of input quits\n";
  auto messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  std::vector<std::int32_t> cached;  // the tokens the KV cache holds
  engine::GenerateOptions g;
  g.max_tokens = o.max_tokens;
  g.sampling = o.sampling;
  std::map<std::uint64_t, std::uint64_t> saved_usage;  // what earlier turns added to the usage history
  std::string line;
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + (o.system.empty() ? 0 : 1), messages.end());
      engine->reset();
      cached.clear();
      std::cerr << "(conversation forgotten)\n";
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    auto prompt = tmpl->render(messages, ropt);
    if (!prompt) {
      messages.erase(messages.end() - 1);
      std::cerr << "error: " << prompt.error().message() << "\n";
      continue;
    }
    const auto ids = tok->encode(*prompt, false);
    std::size_t common = 0;
    while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
    if (common == ids.size() && common > 0) --common;  // at least one new token produces the next logits
    if (static_cast<std::int64_t>(ids.size()) >= engine->context()) {
      messages.erase(messages.end() - 1);
      std::cerr << "error: the conversation (" << ids.size() << " tokens) no longer fits the context of "
                << engine->context() << " positions; /reset to start over or raise --ctx\n";
      continue;
    }
    engine->truncate(static_cast<std::int64_t>(common));
    const std::span<const std::int32_t> fresh(ids.data() + common, ids.size() - common);
    std::optional<interrupt::Interruptible> interruptible(std::in_place);  // Ctrl-C ends this reply, not the chat
    auto r = engine::generate(*engine, *tok, fresh, g, [](std::string_view text) {
      std::cout << text << std::flush;
      return static_cast<bool>(std::cout) && !interrupt::stop_requested();
    });
    interruptible.reset();
    std::cout << "\n" << std::flush;
    if (!r) {
      messages.erase(messages.end() - 1);
      engine->truncate(static_cast<std::int64_t>(common));
      std::cerr << "error: " << r.error().message() << "\n";
      continue;
    }
    cached.assign(ids.begin(), ids.end());
    cached.insert(cached.end(), r->tokens.begin(), r->tokens.end());
    cached.resize(
        static_cast<std::size_t>(std::min<std::int64_t>(engine->n_past(), static_cast<std::int64_t>(cached.size()))));
    messages.push_back({{"role", "assistant"}, {"content", r->text}});
    if (r->finish_reason == "context") std::cerr << "(the context is full; /reset to continue)\n";
    std::cerr << stats_line(*engine, r->prefill_tokens_per_second(), r->decode_tokens_per_second()) << "\n";
    save_usage(*engine, &saved_usage);  // after every turn: a Ctrl-C at the prompt ends the process
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Interactive chat with the model's chat template and history (stdin lines)");
  add_engine_options(*cmd, o->engine, global);
  cmd->add_option("--system", o->system, "A system message opening the conversation");
  cmd->add_option("--template", o->template_family,
                  "Built-in template when the model has none: llama2, mistral, gpt-oss, chatml");
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens per reply (default 512)");
  add_sampling_options(*cmd, o->sampling, o->seed_given);
  cmd->callback([&global, o] { global.exit_code = run_chat(global, *o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(42, setup);

}  // namespace colibri::cli
