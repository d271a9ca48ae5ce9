// colibri-cli chat --model M: an interactive chat. Reads one user message per stdin line, renders the whole
// conversation with the model's chat template, reuses the KV cache for the common prefix, streams the reply.
// Lines "/reset" (forget the conversation), "/exit" ("/quit") and "/help" are commands; another lone "/word" is
// refused as a typo rather than sent. A reasoning model's thinking (a <think> block,
// or harmony's analysis channel) goes to stderr, the answer to stdout, and only the answer joins the history.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <random>

#include "colibri/chat/template.hpp"
#include "colibri/engine/generate.hpp"
#include "colibri/server/chat_output.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "engine_cli.hpp"
#include "interrupt.hpp"

namespace colibri::cli::chat_command {
namespace {

struct ChatOptions {
  EngineCliOptions engine;
  std::string system;
  std::string template_family;
  std::int64_t max_tokens = 512;
  engine::SamplingOptions sampling;
  bool seed_given = false;
  apps::DraftFlags draft;
  bool hide_reasoning = false;
};

// Splits a streamed reply into thinking and answer as the template's model writes them: harmony channels (gpt-oss),
// a leading <think> block (Qwen3, DeepSeek R1), or none. The answer is printed to stdout, the thinking to stderr
// (dimmed on a terminal) unless hidden.
class ReplyPrinter {
 public:
  enum class Style { plain, think, harmony };
  ReplyPrinter(Style style, std::string_view prompt, bool show_reasoning, bool answer_tags)
      : style_(style), show_reasoning_(show_reasoning), dim_(::isatty(STDERR_FILENO) != 0) {
    // The stream starts where the prompt leaves the answer: in harmony, after its last <|start|>.
    if (style_ == Style::harmony)
      harmony_.emplace(prompt.substr(std::min(prompt.size(), prompt.rfind("<|start|>"))), false);
    if (style_ == Style::think) think_.emplace(server::prompt_opens_reasoning(prompt), answer_tags);
  }
  // false when stdout is gone.
  bool push(std::string_view text) {
    if (harmony_) {
      auto out = harmony_->push(text);
      return print(out.reasoning, out.content);
    }
    if (think_) {
      auto out = think_->push(text);
      return print(out.reasoning, out.content);
    }
    return print({}, text);
  }
  void finish() {
    if (harmony_) {
      auto out = harmony_->finish();
      print(out.reasoning, out.content);
    } else if (think_) {
      auto out = think_->finish();
      print(out.reasoning, out.content);
    }
    if (in_reasoning_) end_reasoning();
  }
  // What the history keeps of this reply.
  [[nodiscard]] const std::string& answer() const { return answer_; }

 private:
  bool print(std::string_view reasoning, std::string_view content) {
    if (!reasoning.empty() && show_reasoning_) {
      if (!in_reasoning_ && dim_) std::cerr << "\033[2m";
      in_reasoning_ = true;
      std::cerr << reasoning << std::flush;
    }
    if (!content.empty()) {
      if (in_reasoning_) end_reasoning();
      answer_ += content;
      std::cout << content << std::flush;
    }
    return static_cast<bool>(std::cout);
  }
  void end_reasoning() {
    std::cerr << (dim_ ? "\033[0m\n" : "\n") << std::flush;
    in_reasoning_ = false;
  }

  Style style_;
  bool show_reasoning_, dim_;
  bool in_reasoning_ = false;
  std::optional<server::HarmonyStream> harmony_;
  std::optional<server::ReasoningStream> think_;
  std::string answer_;
};

// One user turn: a line; a line ending in a backslash goes on to the next one (the backslash becomes a newline, as in
// llama.cpp); a line holding only """ opens a block that runs to the next such line (as in ollama), for pasted text.
// False at the end of input with nothing read.
bool read_turn(std::istream& in, bool tty, std::string& turn) {
  turn.clear();
  std::string line;
  if (!std::getline(in, line)) return false;
  if (line == "\"\"\"") {
    bool first = true;
    while (true) {
      if (tty) std::cerr << "... " << std::flush;
      if (!std::getline(in, line) || line == "\"\"\"") break;  // end of input closes the block too
      turn += (first ? "" : "\n") + line;
      first = false;
    }
    return true;
  }
  while (line.ends_with('\\')) {
    line.pop_back();
    turn += line + "\n";
    if (tty) std::cerr << "... " << std::flush;
    if (!std::getline(in, line)) {
      line.clear();
      break;
    }
  }
  turn += line;
  return true;
}

int run_chat(const GlobalOptions& global, ChatOptions& o) {
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  if (auto s = o.sampling.validate(); !s) return usage_fail(s.message());
  // The template (a named one, else the model's) is found and parsed before the weights load (minutes on a real
  // model); a manifest that does not load leaves it until after the load, which names what is wrong.
  std::optional<chat::ChatConfig> cfg;
  std::optional<chat::Template> tmpl;
  auto find_template = [&](const std::filesystem::path& dir, std::string_view architecture) -> std::string {
    // The named template wins over the model's own, as the server's --chat-template.
    auto c = !o.template_family.empty()
                 ? chat::chat_config_override(o.template_family)
                 : chat::load_chat_config(dir / "tokenizer_config.json", chat::family_for_architecture(architecture));
    if (!c && o.template_family.empty()) {
      // No template in the model and none known for its family: a neutral ChatML one still lets it talk.
      c = chat::load_chat_config(dir / "tokenizer_config.json", "chatml");
    }
    if (!c) return c.error().message();
    auto t = chat::Template::parse(c->template_source, c->template_origin);
    if (!t) {
      return o.template_family.empty() ? "the model's chat template does not parse: " + t.error().message() +
                                             "; give one with --chat-template (a family name or a Jinja file), or "
                                             "use run"
                                       : t.error().message();
    }
    cfg = std::move(*c);
    tmpl = std::move(*t);
    return {};
  };
  if (!o.template_family.empty()) {
    if (auto err = find_template({}, ""); !err.empty()) return fail(err);
  }
  std::optional<profile::Profile> prof;  // --draft-model opens with it too
  auto opened = open_engine(
      global, o.engine, &prof,
      [&](const std::filesystem::path& dir, const model::Manifest* m) -> std::string {
        if (tmpl || m == nullptr) return {};
        return find_template(dir, m->hparams.architecture);
      },
      nullptr, &o.draft);
  if (!opened.engine) return opened.exit_code;
  auto& engine = opened.engine;
  if (auto bad = logit_bias_problem(o.sampling, engine->hparams().vocab_size); !bad.empty()) return usage_fail(bad);
  auto tok = tokenizer::Tokenizer::from_file(engine->model_dir());
  if (!tok) return fail(tok.error().message());
  if (!tmpl) {
    if (auto err = find_template(engine->model_dir(), engine->hparams().architecture); !err.empty()) return fail(err);
  }
  chat::RenderOptions ropt;
  ropt.add_generation_prompt = true;
  ropt.bos_token = cfg->bos_token.empty() ? tok->bos_token() : cfg->bos_token;
  ropt.eos_token = cfg->eos_token.empty() ? tok->eos_token() : cfg->eos_token;
  const auto style = server::template_is_harmony(cfg->template_source)      ? ReplyPrinter::Style::harmony
                     : server::template_has_reasoning(cfg->template_source) ? ReplyPrinter::Style::think
                                                                            : ReplyPrinter::Style::plain;

  const bool tty = ::isatty(STDIN_FILENO) != 0;
  std::cerr << "chat with " << engine->model_dir().filename().string() << " (template: " << cfg->template_origin
            << "); /reset forgets the conversation, /exit or end of input quits, /help\n";
  auto messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  std::vector<std::int32_t> cached;  // the tokens the KV cache holds
  engine::GenerateOptions g;
  g.max_tokens = o.max_tokens;
  g.sampling = o.sampling;
  std::unique_ptr<engine::DraftModel> draft;
  if (!apply_draft(o.draft, o.engine, *prof, opened, *tok, g, draft)) return 1;
  std::unique_ptr<engine::DraftModel::State> draft_state;  // the draft model's KV cache, kept between turns
  if (draft) {
    auto state = draft->acquire({});
    if (!state) return fail(state.error().message());
    draft_state = std::move(*state);
    g.draft_state = draft_state.get();
  }
  if (style == ReplyPrinter::Style::harmony) {
    // Harmony's channel markers are special tokens the splitter must see; its end tokens (<|call|> is listed only in
    // gpt-oss's generation_config.json) end the reply.
    g.keep_special = true;
    for (const std::string_view name : server::kHarmonyEndTokens) {
      if (const auto id = tok->piece_to_token(name)) g.end_tokens.push_back(*id);
    }
  }
  std::map<std::uint64_t, std::uint64_t> saved_usage;  // what earlier turns added to the usage history
  std::string line;
  bool failed_turn = false;  // the exit status says a turn failed (a script feeding lines must see it)
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!read_turn(std::cin, tty, line)) {
      if (tty) std::cerr << "\n";  // Ctrl-D: the shell's prompt starts on a line of its own
      break;
    }
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + (o.system.empty() ? 0 : 1), messages.end());
      engine->reset();
      cached.clear();
      std::cerr << "(conversation forgotten)\n";
      continue;
    }
    // Any other lone /word is a command; a typo must not become a turn ("/usr/bin is..." still is one).
    if (line.size() > 1 && line[0] == '/' &&
        std::all_of(line.begin() + 1, line.end(), [](unsigned char c) { return std::isalpha(c) != 0; })) {
      std::cerr << (line == "/help" ? "" : "unknown command " + line + "; ")
                << "commands: /reset forgets the conversation, /exit (or /quit, or end of input) quits; a line ending "
                   "in \\ goes on to the next, and \"\"\" on a line of its own opens and closes a turn of several "
                   "lines\n";
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    auto prompt = tmpl->render(messages, ropt);
    if (!prompt) {
      messages.erase(messages.end() - 1);
      std::cerr << "error: " << prompt.error().message() << "\n";
      failed_turn = true;
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
      failed_turn = true;
      continue;
    }
    engine->truncate(static_cast<std::int64_t>(common));
    common = static_cast<std::size_t>(engine->n_past());  // less where sliding-window layers dropped rows it needs
    // Where a next turn may part from this prompt, the KV cache keeps what it would otherwise lose (checkpoints).
    g.checkpoints.clear();
    if (engine->kv_cache().keeps_checkpoints()) {
      chat::RenderOptions bare = ropt;
      bare.add_generation_prompt = false;
      g.checkpoints = chat::parting_positions(messages, ids, [&](std::size_t n) {
        auto text =
            tmpl->render(nlohmann::ordered_json(messages.begin(), messages.begin() + static_cast<long>(n)), bare);
        return text ? std::optional(tok->encode(*text, false)) : std::nullopt;
      });
    }
    const std::span<const std::int32_t> fresh(ids.data() + common, ids.size() - common);
    g.draft_context = std::span<const std::int32_t>(ids.data(), common);
    std::optional<interrupt::Interruptible> interruptible(std::in_place);  // Ctrl-C ends this reply, not the chat
    // Hunyuan-A13B writes its answer in <answer> tags: the answer is what they hold (the history too).
    ReplyPrinter printer(style, *prompt, !o.hide_reasoning, engine->hparams().architecture == "hunyuan_moe");
    auto r = engine::generate(*engine, *tok, fresh, g, [&printer](std::string_view text) {
      return printer.push(text) && !interrupt::stop_requested();
    });
    interruptible.reset();
    printer.finish();
    std::cout << "\n" << std::flush;
    if (!r) {
      messages.erase(messages.end() - 1);
      engine->truncate(static_cast<std::int64_t>(common));
      std::cerr << "error: " << r.error().message() << "\n";
      failed_turn = true;
      continue;
    }
    cached.assign(ids.begin(), ids.end());
    cached.insert(cached.end(), r->tokens.begin(), r->tokens.end());
    cached.resize(
        static_cast<std::size_t>(std::min<std::int64_t>(engine->n_past(), static_cast<std::int64_t>(cached.size()))));
    messages.push_back({{"role", "assistant"}, {"content", printer.answer()}});
    if (r->finish_reason == "context") std::cerr << "(the context is full; /reset to continue)\n";
    std::cerr << stats_line(*engine, r->prefill_tokens_per_second(), r->decode_tokens_per_second()) << " ("
              << ids.size() << " prompt tokens, " << common << " reused from the cache, " << r->tokens.size()
              << " generated" << draft_summary(*r, draft.get()) << ", " << r->finish_reason << ", seed "
              << g.sampling.seed << ")\n";
    save_usage(*engine, &saved_usage);  // after every turn: a Ctrl-C at the prompt ends the process
  }
  return failed_turn ? 1 : 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Interactive chat with the model's chat template and history (stdin lines)");
  add_engine_options(*cmd, o->engine, global);
  cmd->add_option("--system", o->system, "A system message opening the conversation");
  cmd->add_option("--chat-template,--template", o->template_family,
                  "Chat template instead of the model's: a built-in family (llama2, mistral, gpt-oss, chatml) or a "
                  "Jinja file, as colibri-server's --chat-template");
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Most tokens per reply (default 512)");
  cmd->add_flag("--hide-reasoning", o->hide_reasoning,
                "Do not print a reasoning model's thinking (shown on stderr by default)");
  add_sampling_options(*cmd, o->sampling, o->seed_given);
  apps::add_draft_options(*cmd, o->draft);
  cmd->callback([&global, o] { global.exit_code = run_chat(global, *o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(42, setup);

}  // namespace colibri::cli::chat_command
